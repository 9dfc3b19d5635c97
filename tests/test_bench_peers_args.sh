#!/bin/sh
# scripts/bench_peers.sh without Taichi and without the network: its argument
# handling (help, bad arguments refused before anything is installed), the
# driver's agreement check, and that every bench session has a Taichi port.
# Usage: test_bench_peers_args.sh SOURCE_DIR PYTHON
set -u
src="$1"
py="$2"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
export FB_PEERS_DIR="$tmp/peers"
fail=0
check() { # check NAME EXPECTED_STATUS PATTERN -- command...
  name="$1" want="$2" pat="$3"
  shift 4
  "$@" >"$tmp/out" 2>&1
  got=$?
  if [ "$got" != "$want" ] || ! grep -q -- "$pat" "$tmp/out"; then
    echo "FAIL $name: status $got (want $want), output:"; cat "$tmp/out"; fail=1
  else
    echo "ok   $name"
  fi
}
script="$src/scripts/bench_peers.sh"
check help 0 "--quick" -- bash "$script" --help
check help-json 0 "--json OUT" -- bash "$script" --help
check bad-option 2 "unrecognized arguments: --bogus" -- bash "$script" --bogus
check bad-cycles 2 "--cycles must be >= 1" -- bash "$script" --cycles 0
check bad-case 2 "unknown case 'micro/nope'" -- bash "$script" --cases micro/nope
check bad-peer 2 "--peer wants" -- "$py" "$src/bench/peers/bench_peers.py" --fusebox x --peer oops --check-args
if [ -e "$FB_PEERS_DIR" ]; then echo "FAIL: argument checks created $FB_PEERS_DIR"; fail=1; fi

# The agreement check, and one port per session (a new case needs a port).
"$py" - "$src" <<'PYEOF' || fail=1
import glob, os, sys
src = sys.argv[1]
sys.path.insert(0, os.path.join(src, "bench", "peers"))
import bench_peers as bp
ref = {"x": {"n": 4, "sum": 10.0, "abs_sum": 10.0, "min": 1.0, "max": 4.0}}
near = {"x": {"n": 4, "sum": 10.0005, "abs_sum": 10.0005, "min": 1.0, "max": 4.0}}
far = {"x": {"n": 4, "sum": 10.01, "abs_sum": 10.01, "min": 1.0, "max": 4.0}}
short = {"x": dict(ref["x"], n=3)}
alls = ["sum", "abs_sum", "min", "max"]
bad = []
if bp.differs(ref, near, 1e-4, alls) is not None: bad.append("a sum within 5e-5 relative was refused")
if bp.differs(ref, far, 1e-4, alls) is None: bad.append("a sum off by 1e-3 relative was accepted")
if bp.differs(ref, short, 1e-4, alls) is None: bad.append("a field of another size was accepted")
if bp.differs(ref, {}, 1e-4, alls) is None: bad.append("a missing field was accepted")
if bp.differs(ref, far, 1e-4, ["min", "max"]) is not None: bad.append("a statistic not asked for was compared")
sessions = sorted(os.path.relpath(p, os.path.join(src, "bench"))[:-5]
                  for s in ("micro", "large") for p in glob.glob(os.path.join(src, "bench", s, "*.json")))
if sessions != sorted(bp.CASES): bad.append("bench_peers.CASES %s != sessions %s" % (sorted(bp.CASES), sessions))
for c in bp.CASES:
    port = os.path.join(src, "bench", "peers", "taichi", c.replace("/", "_") + ".py")
    if not os.path.exists(port): bad.append("no Taichi port " + port)
for b in bad: print("FAIL " + b)
print("ok   agreement check and ports" if not bad else "")
sys.exit(1 if bad else 0)
PYEOF
exit $fail
