#!/usr/bin/env bash
# Build a libFuzzer target, by default tests/fuzz/fuzz_ir.c (clang-19, ASan + UBSan,
# its own build directory) and run it for a bounded time: random layouts and
# kernels through fbp_*_from_pb, fb_layout_finalize, fb_kernel_check_public
# and fb_verify into the reference interpreter. Seeds are generated from
# examples/*.fbk; the corpus it grows stays in the build directory.
# Exits 1 when the fuzzer finds a crash, leak or timeout (libFuzzer's own
# codes, such as 77, would read as "skipped" to ctest), and names the input
# that reproduces it. See docs/testing.md.
#   FB_FUZZ_SECONDS  how long to fuzz (default 60)
#   FB_FUZZ_BUILD    build directory (default build-fuzz)
#   FB_FUZZ_JOBS     parallel fuzzing processes (default 1)
#   FB_FUZZ_TARGET   fuzz_ir (default) or fuzz_lang (the .fbk front end on
#                    hostile source, tests/fuzz/fuzz_lang.c; seeds: examples/*.fbk)
# Extra arguments go to libFuzzer (e.g. -seed=1 -max_len=4096).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
BUILD=${FB_FUZZ_BUILD:-build-fuzz}
SECONDS_=${FB_FUZZ_SECONDS:-60}
JOBS=${FB_FUZZ_JOBS:-1}
CLANG=${FB_FUZZ_CC:-clang-19}
TARGET=${FB_FUZZ_TARGET:-fuzz_ir}
case "$TARGET" in fuzz_ir|fuzz_lang) ;; *) echo "fuzz.sh: unknown FB_FUZZ_TARGET '$TARGET' (fuzz_ir or fuzz_lang)" >&2; exit 2 ;; esac
cmake -S . -B "$BUILD" -DCMAKE_C_COMPILER="$CLANG" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
      -DFB_FUZZ=ON >/dev/null
cmake --build "$BUILD" -j"$(nproc)" --target "$TARGET" >/dev/null
FUZZER=$BUILD/tests/fuzz/$TARGET
PFX=$BUILD/fuzz
[ "$TARGET" = fuzz_lang ] && PFX=$BUILD/fuzz_lang
SEEDS=$PFX-seeds
CORPUS=$PFX-corpus
ARTIFACTS=$PFX-artifacts
rm -rf "$SEEDS"
mkdir -p "$SEEDS" "$CORPUS" "$ARTIFACTS"
if [ "$TARGET" = fuzz_lang ]; then
  cp examples/*.fbk "$SEEDS"/
elif ! out=$("$FUZZER" --make-seeds "$SEEDS" examples/*.fbk 2>&1); then
  printf '%s\n' "$out" >&2
  echo "$TARGET: could not make the seeds" >&2
  exit 1
fi
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
before=$(ls "$ARTIFACTS" | wc -l)
echo "$TARGET: fuzzing for ${SECONDS_}s (corpus $CORPUS, seeds $SEEDS)" >&2
set +e
if [ "$JOBS" -gt 1 ]; then
  "$FUZZER" -max_total_time="$SECONDS_" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
            -artifact_prefix="$ARTIFACTS/" -jobs="$JOBS" -workers="$JOBS" "$@" "$CORPUS" "$SEEDS"
else
  "$FUZZER" -max_total_time="$SECONDS_" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
            -artifact_prefix="$ARTIFACTS/" "$@" "$CORPUS" "$SEEDS"
fi
rc=$?
set -e
new=$(ls -t "$ARTIFACTS" | head -n $(( $(ls "$ARTIFACTS" | wc -l) - before )))
if [ "$rc" -ne 0 ] || [ -n "$new" ]; then
  echo "$TARGET: FAILED (exit $rc)" >&2
  for f in $new; do
    echo "$TARGET: reproducer: $ARTIFACTS/$f" >&2
    echo "$TARGET:   rerun with: $FUZZER $ARTIFACTS/$f" >&2
  done
  exit 1
fi
echo "$TARGET: no crash in ${SECONDS_}s" >&2
