#!/usr/bin/env bash
# bench/async_vs_sync.sh BASE_BUILD NEW_BUILD [ROUNDS]
#
# Async against sync, two builds side by side (issue 37: "async never
# slower than sync"). Each round runs, for BASE_BUILD then NEW_BUILD (the
# two alternate round by round), `fusebox bench --modes sync,async` over
# bench/overhead/fill_scalar, every case of bench/micro and the real
# programs where nothing fuses (game_of_life, cg, mass_spring,
# sparse_bitmasked, sparse_pointer, nbody): sync and async of a case back
# to back in one process, 2 threads, CPU backend. Then it prints, per case
# and build, the median over the rounds of each round's sync ÷ async by
# process CPU time (above 1: async faster), the range, the median by wall
# and whether every check passed; and the geomean of the medians.
#
# BASE_BUILD / NEW_BUILD: build directories (Release), each holding
# client/fusebox. ROUNDS: default 3 (on the 2-core VM 2 rounds took 13
# minutes at load 13-25, where the others' jobs held most of the cores;
# on the quiet VM a round of both builds is about a minute). Extra files to time: FILES="bench/large/autodiff.json ..."
# in the environment (added to every round). The JSON of each run is kept
# in $OUT (default: a new directory under /tmp, printed at the end).
# Exit status 1 when a run failed (a check or a crash: said as it happens,
# its stderr kept beside the JSON); the summary covers what ran.
set -euo pipefail

if [ $# -lt 2 ]; then
  echo "usage: $0 BASE_BUILD NEW_BUILD [ROUNDS]" >&2
  exit 2
fi
BASE=$1
NEW=$2
ROUNDS=${3:-3}
HERE=$(cd "$(dirname "$0")/.." && pwd)
for B in "$BASE" "$NEW"; do
  if [ ! -x "$B/client/fusebox" ]; then
    echo "$0: $B/client/fusebox: no such program (give a build directory)" >&2
    exit 2
  fi
done
case $ROUNDS in '' | *[!0-9]* | 0)
  echo "$0: ROUNDS must be a positive number, not '$ROUNDS'" >&2
  exit 2
  ;;
esac
OUT=${OUT:-$(mktemp -d /tmp/async_vs_sync.XXXXXX)}
mkdir -p "$OUT"
PY=${PYTHON:-/usr/bin/python3}

cd "$HERE"
FAILED=0
REAL="bench/real/game_of_life.json bench/real/cg.json bench/real/mass_spring.json
      bench/real/sparse_bitmasked.json bench/real/sparse_pointer.json bench/real/nbody.json"
echo "async_vs_sync: $ROUNDS rounds, base $BASE, new $NEW; load: $(cut -d' ' -f1-3 /proc/loadavg)"
for i in $(seq 1 "$ROUNDS"); do
  for tag in base new; do
    if [ $tag = base ]; then B=$BASE; else B=$NEW; fi
    F=$B/client/fusebox
    echo "round $i/$ROUNDS $tag ($(date -u +%H:%M:%S), load $(cut -d' ' -f1 /proc/loadavg))"
    # a failed run (a check, a crash) is said and counted; the rounds go on
    "$F" bench bench/overhead/fill_scalar.json --local --threads 2 --modes sync,async \
      --repeat 100 --json "$OUT/${tag}_fs_$i.json" >/dev/null 2>"$OUT/${tag}_fs_$i.err" ||
      { echo "  fill_scalar: exit $? (see $OUT/${tag}_fs_$i.err)"; FAILED=1; }
    "$F" bench bench/micro/*.json --local --threads 2 --modes sync,async --warmup 2 --repeat 3 \
      --json "$OUT/${tag}_micro_$i.json" >/dev/null 2>"$OUT/${tag}_micro_$i.err" ||
      { echo "  micro: exit $? (see $OUT/${tag}_micro_$i.err)"; FAILED=1; }
    # shellcheck disable=SC2086
    "$F" bench $REAL ${FILES:-} --local --threads 2 --modes sync,async \
      --json "$OUT/${tag}_real_$i.json" >/dev/null 2>"$OUT/${tag}_real_$i.err" ||
      { echo "  real: exit $? (see $OUT/${tag}_real_$i.err)"; FAILED=1; }
  done
done
echo "load at the end: $(cut -d' ' -f1-3 /proc/loadavg); JSON in $OUT"

"$PY" - "$OUT" <<'EOF'
import glob, json, math, os, statistics, sys
out = sys.argv[1]
rows = {}  # (case, tag) -> list of (cpu ratio, wall ratio, checks, sync cpu, async cpu)
order = []
for path in sorted(glob.glob(os.path.join(out, "*_[0-9]*.json"))):
    tag = os.path.basename(path).split("_")[0]
    with open(path) as f:
        doc = json.load(f)
    for c in doc["cases"]:
        m = c["modes"]
        if "sync" not in m or "async" not in m:
            rows.setdefault((c["name"], tag), []).append(None)
            continue
        s, a = m["sync"], m["async"]
        if c["name"] not in order:
            order.append(c["name"])
        rows.setdefault((c["name"], tag), []).append(
            (s["cpu_s"] / a["cpu_s"], s["wall_s"] / a["wall_s"], c["checks_passed"],
             s["cpu_s"], a["cpu_s"]))
print()
print("sync ÷ async by process CPU, median of rounds (above 1: async faster)")
print(f"{'case':<18} {'base':>6} {'new':>6}  {'new range':<11} {'wall base':>9} {'wall new':>8}"
      f"  {'CPU ms sync/async (new)':<24} checks")
geo = {"base": [], "new": [], "wbase": [], "wnew": []}
for name in order:
    line = f"{name:<18}"
    med = {}
    ok = True
    for tag in ("base", "new"):
        v = [r for r in rows.get((name, tag), []) if r]
        ok = ok and all(r[2] for r in v) and len(v) == len(rows.get((name, tag), []))
        med[tag] = statistics.median(r[0] for r in v) if v else float("nan")
        med["w" + tag] = statistics.median(r[1] for r in v) if v else float("nan")
        if v:
            geo[tag].append(math.log(med[tag]))
            geo["w" + tag].append(math.log(med["w" + tag]))
    v = [r for r in rows.get((name, "new"), []) if r]
    rng = f"{min(r[0] for r in v):.2f}-{max(r[0] for r in v):.2f}" if v else "-"
    ms = (f"{statistics.median(r[3] for r in v) * 1e3:.3f} / "
          f"{statistics.median(r[4] for r in v) * 1e3:.3f}") if v else "-"
    print(f"{line} {med['base']:6.2f} {med['new']:6.2f}  {rng:<11} {med['wbase']:9.2f} "
          f"{med['wnew']:8.2f}  {ms:<24} {'pass' if ok else 'FAIL'}")
g = {k: math.exp(sum(x) / len(x)) if x else float("nan") for k, x in geo.items()}
print(f"{'geomean':<18} {g['base']:6.2f} {g['new']:6.2f}  {'':<11} {g['wbase']:9.2f} {g['wnew']:8.2f}")
EOF
if [ "$FAILED" != 0 ]; then
  echo "$0: some runs failed (above); their cases are missing from those rounds" >&2
  exit 1
fi
