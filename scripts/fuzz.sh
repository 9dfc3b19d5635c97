#!/usr/bin/env bash
# Build the libFuzzer targets of tests/fuzz (clang-19, ASan + UBSan, their own
# build directory) and fuzz one of them, or all three, for a bounded time:
#   fuzz_ir     (default) a client's layout and kernels from the wire through
#               fbp_*_from_pb, fb_layout_finalize, fb_kernel_check_public and
#               fb_verify into the reference interpreter; seeds made from
#               examples/*.fbk (fuzz_ir --make-seeds)
#   fuzz_checkpoint  fb_session_restore and the seal's verifier on hostile
#               checkpoint bytes (seeds: checkpoints of sessions of
#               examples/*.fbk, fuzz_checkpoint --make-seeds)
#   fuzz_lang   the .fbk front end on hostile source (seeds: examples/*.fbk)
#   fuzz_proto  every request fuseboxd unpacks, decoded and converted as the
#               server does, and the broker's scan of a SessionRequest
#               (fbp_session_scan) checked against protobuf-c's decode
#               (seeds made from examples/*.fbk: fuzz_proto --make-seeds)
# Each target's corpus stays in the build directory (BUILD/fuzz-corpus for
# fuzz_ir, BUILD/fuzz_lang-corpus, BUILD/fuzz_proto-corpus), so each run goes
# on from where the last stopped; its findings go to BUILD/...-artifacts and
# its output to BUILD/...-last.log. Exits 1 when a target found a crash, leak,
# timeout or out-of-memory (libFuzzer's own codes, such as 77, would read as
# "skipped" to ctest), naming each reproducer and the commands that rerun and
# minimize it. See docs/testing.md, section 4.
#   FB_FUZZ_TARGET   fuzz_ir (default), fuzz_lang, fuzz_proto, or all: the
#                    three in turn (or at once, with FB_FUZZ_PARALLEL=1)
#   FB_FUZZ_SECONDS  how long to fuzz each target (default 60)
#   FB_FUZZ_RUNS     also stop a target after this many executions (default:
#                    no limit; with FB_FUZZ_JOBS > 1 libFuzzer counts them
#                    roughly)
#   FB_FUZZ_JOBS     fuzzing processes per target (default 1); above 1,
#                    libFuzzer's fork mode (-fork): one shared corpus, and a
#                    finding does not end the run (each is kept and reported
#                    at the end)
#   FB_FUZZ_PARALLEL 1: with FB_FUZZ_TARGET=all, the three targets at once
#   FB_FUZZ_TIMEOUT  seconds one input may take before it is a finding
#                    (default 10; raise it on a loaded machine)
#   FB_FUZZ_BUILD    build directory (default build-fuzz)
#   FB_FUZZ_CC       the clang to build with (default clang-19)
# Extra arguments go to libFuzzer (e.g. -seed=1 -max_len=4096).
#
# For hours, on a machine of its own (see docs/testing.md for more):
#   FB_FUZZ_TARGET=all FB_FUZZ_PARALLEL=1 FB_FUZZ_JOBS=4 FB_FUZZ_SECONDS=14400 \
#     nohup bash scripts/fuzz.sh > fuzz.log 2>&1 &
# and on a shared one, at low priority, a million executions each in turn:
#   FB_FUZZ_TARGET=all FB_FUZZ_SECONDS=86400 FB_FUZZ_RUNS=1000000 \
#     FB_FUZZ_TIMEOUT=60 nice -n 19 bash scripts/fuzz.sh
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
BUILD=${FB_FUZZ_BUILD:-build-fuzz}
SECONDS_=${FB_FUZZ_SECONDS:-60}
RUNS=${FB_FUZZ_RUNS:-}
JOBS=${FB_FUZZ_JOBS:-1}
TIMEOUT=${FB_FUZZ_TIMEOUT:-10}
PARALLEL=${FB_FUZZ_PARALLEL:-0}
CLANG=${FB_FUZZ_CC:-clang-19}
TARGET=${FB_FUZZ_TARGET:-fuzz_ir}
ALL=(fuzz_ir fuzz_lang fuzz_proto fuzz_checkpoint)
die() { echo "fuzz.sh: $*" >&2; exit 2; }
case "$TARGET" in
  fuzz_ir | fuzz_lang | fuzz_proto | fuzz_checkpoint) TARGETS=("$TARGET") ;;
  all) TARGETS=("${ALL[@]}") ;;
  *) die "unknown FB_FUZZ_TARGET '$TARGET' (fuzz_ir, fuzz_lang, fuzz_proto, fuzz_checkpoint or all)" ;;
esac
num() { [[ "$2" =~ ^[1-9][0-9]*$ ]] || die "$1 must be a positive whole number, not '$2'"; }
num FB_FUZZ_SECONDS "$SECONDS_"
num FB_FUZZ_JOBS "$JOBS"
num FB_FUZZ_TIMEOUT "$TIMEOUT"
[ -z "$RUNS" ] || num FB_FUZZ_RUNS "$RUNS"
case "$PARALLEL" in 0 | 1) ;; *) die "FB_FUZZ_PARALLEL must be 0 or 1, not '$PARALLEL'" ;; esac

cmake -S . -B "$BUILD" -DCMAKE_C_COMPILER="$CLANG" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
      -DFB_FUZZ=ON >/dev/null
cmake --build "$BUILD" -j"$(nproc)" --target "${TARGETS[@]}" >/dev/null
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}

# Where a target keeps its seeds, corpus, findings and log.
prefix() { if [ "$1" = fuzz_ir ]; then echo "$BUILD/fuzz"; else echo "$BUILD/$1"; fi; }

# Fuzz one target; its output goes to PREFIX-last.log (and to stderr when
# alone). 0 when nothing was found.
fuzz_one() {
  local t=$1 show=$2; shift 2
  local fuzzer=$BUILD/tests/fuzz/$t pfx; pfx=$(prefix "$t")
  local seeds=$pfx-seeds corpus=$pfx-corpus artifacts=$pfx-artifacts log=$pfx-last.log
  # one run per target and build directory: a second would share its
  # seeds, log and findings (use another FB_FUZZ_BUILD)
  local lock
  exec {lock}>"$pfx.lock"
  if ! flock -n "$lock"; then
    echo "$t: another run of $t is using $BUILD (its lock: $pfx.lock); wait for it or set FB_FUZZ_BUILD" >&2
    return 1
  fi
  rm -rf "$seeds"
  mkdir -p "$seeds" "$corpus" "$artifacts"
  if [ "$t" = fuzz_lang ]; then
    cp examples/*.fbk "$seeds"/
  elif ! out=$("$fuzzer" --make-seeds "$seeds" examples/*.fbk 2>&1); then
    printf '%s\n' "$out" >&2
    echo "$t: could not make the seeds" >&2
    exec {lock}>&-
    return 1
  fi
  local args=(-max_total_time="$SECONDS_" -timeout="$TIMEOUT" -rss_limit_mb=2048
              -print_final_stats=1 -artifact_prefix="$artifacts/")
  [ -z "$RUNS" ] || args+=(-runs="$RUNS")
  [ "$JOBS" -eq 1 ] || args+=(-fork="$JOBS" -ignore_crashes=1 -ignore_timeouts=1 -ignore_ooms=1)
  local before; before=$(find "$artifacts" -type f | sort)
  echo "$t: fuzzing for ${SECONDS_}s${RUNS:+ or $RUNS runs}, $JOBS process(es) (corpus $corpus, log $log)" >&2
  local rc=0 start=$SECONDS
  if [ "$show" = 1 ]; then
    "$fuzzer" "${args[@]}" "$@" "$corpus" "$seeds" 2>&1 | tee "$log" >&2 || rc=$?
  else
    "$fuzzer" "${args[@]}" "$@" "$corpus" "$seeds" >"$log" 2>&1 || rc=$?
  fi
  local new; new=$(comm -13 <(printf '%s\n' "$before") <(find "$artifacts" -type f | sort) | sed '/^$/d')
  local execs; execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
  [ -n "$execs" ] || execs=$(grep -ao '^#[0-9][0-9]*' "$log" | tail -n 1 | tr -d '#')
  local cov; cov=$(grep -ao 'cov: [0-9]*' "$log" | tail -n 1)
  echo "$t: ${execs:-0} executions in $((SECONDS - start))s, ${cov:-cov: ?}, corpus $(find "$corpus" -type f | wc -l) files" >&2
  if [ "$rc" -eq 72 ] && [ -z "$new" ]; then # libFuzzer's code for SIGINT/SIGTERM
    echo "$t: interrupted before its end, no finding" >&2
    exec {lock}>&-
    return 1
  fi
  if [ "$rc" -ne 0 ] || [ -n "$new" ]; then
    echo "$t: FAILED (exit $rc; the log: $log)" >&2
    for f in $new; do
      echo "$t: reproducer: $f" >&2
      echo "$t:   rerun with: $fuzzer $f" >&2
      echo "$t:   minimize:   $fuzzer -minimize_crash=1 -runs=10000 -exact_artifact_path=$f.min $f" >&2
    done
    exec {lock}>&-
    return 1
  fi
  echo "$t: no finding" >&2
  exec {lock}>&-
}

failed=()
if [ "${#TARGETS[@]}" -gt 1 ] && [ "$PARALLEL" = 1 ]; then
  pids=()
  for t in "${TARGETS[@]}"; do fuzz_one "$t" 0 "$@" & pids+=($!); done
  for i in "${!TARGETS[@]}"; do wait "${pids[$i]}" || failed+=("${TARGETS[$i]}"); done
else
  show=1; [ "${#TARGETS[@]}" -eq 1 ] || show=0
  for t in "${TARGETS[@]}"; do fuzz_one "$t" "$show" "$@" || failed+=("$t"); done
fi
if [ "${#failed[@]}" -gt 0 ]; then
  echo "fuzz.sh: not clean: ${failed[*]} (see above)" >&2
  exit 1
fi
echo "fuzz.sh: ${TARGETS[*]}: no finding" >&2
