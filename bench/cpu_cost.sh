#!/bin/bash
# bench/cpu_cost.sh BASE_BUILD NEW_BUILD [ROUNDS]
#
# CPU time and wall time per step of two builds of Fusebox, interleaved: in
# each round every session of bench/real and bench/micro runs once under
# BASE_BUILD/client/fusebox and once under NEW_BUILD/client/fusebox (the
# order alternates from round to round) with `fusebox bench --local
# --threads 2 --modes sync,async --json`. Prints, per case and mode, the
# median over the rounds of wall ms and process CPU ms per timed step for
# both builds, the ratios base / new (above 1: the new build is cheaper),
# their geometric means, and CPU / wall. ROUNDS defaults to 3; a round is
# not started when the ones so far say it would end past 8 minutes
# (FB_CPU_COST_BUDGET_S, default 480). The JSON of every run is kept in
# $FB_CPU_COST_OUT (default: a new folder under /tmp), named in the output.
# FB_CPU_COST_CASES="real/sparse_bitmasked real/nbody" runs only those
# sessions (names under bench/, without .json).
set -euo pipefail

usage() {
  echo "usage: bench/cpu_cost.sh BASE_BUILD NEW_BUILD [ROUNDS]" >&2
  echo "  BASE_BUILD, NEW_BUILD: build folders holding client/fusebox (Release)" >&2
  exit 2
}
[ $# -ge 2 ] && [ $# -le 3 ] || usage
base=$1/client/fusebox
new=$2/client/fusebox
rounds=${3:-3}
for b in "$base" "$new"; do
  [ -x "$b" ] || { echo "cpu_cost.sh: no fusebox binary at $b" >&2; exit 2; }
done
case $rounds in '' | *[!0-9]* | 0) echo "cpu_cost.sh: ROUNDS must be a positive integer" >&2; exit 2 ;; esac
here=$(cd "$(dirname "$0")" && pwd)
budget=${FB_CPU_COST_BUDGET_S:-480}
out=${FB_CPU_COST_OUT:-$(mktemp -d /tmp/cpu_cost.XXXXXX)}
mkdir -p "$out"
if [ -n "${FB_CPU_COST_CASES:-}" ]; then
  cases=()
  for c in $FB_CPU_COST_CASES; do
    [ -f "$here/$c.json" ] || { echo "cpu_cost.sh: no session bench/$c.json" >&2; exit 2; }
    cases+=("$here/$c.json")
  done
else
  cases=("$here"/real/*.json "$here"/micro/*.json)
fi
echo "cpu_cost: ${#cases[@]} sessions, up to $rounds rounds, JSON in $out"
echo "load average at the start: $(cut -d' ' -f1-3 /proc/loadavg)"
start=$(date +%s)
done_rounds=0
for ((r = 1; r <= rounds; r++)); do
  t0=$(date +%s)
  if ((done_rounds > 0)); then
    per=$(((t0 - start) / done_rounds))
    if ((t0 - start + per > budget)); then
      echo "round $r skipped: $done_rounds rounds took $((t0 - start)) s, the budget is $budget s"
      break
    fi
  fi
  if ((r % 2)); then order="base new"; else order="new base"; fi
  for c in "${cases[@]}"; do
    name=$(basename "$(dirname "$c")")_$(basename "$c" .json)
    for which in $order; do
      if [ "$which" = base ]; then bin=$base; else bin=$new; fi
      if ! "$bin" bench "$c" --local --threads 2 --modes sync,async \
        --json "$out/$which.$name.$r.json" >"$out/$which.$name.$r.txt" 2>&1; then
        echo "cpu_cost.sh: $which failed on $c (see $out/$which.$name.$r.txt)" >&2
        exit 1
      fi
    done
  done
  done_rounds=$r
  echo "round $r done in $(($(date +%s) - t0)) s"
done
echo "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
python3 - "$out" <<'EOF'
import glob, json, math, os, statistics, sys
out = sys.argv[1]
data = {}  # (case, mode) -> build -> {"wall": [...], "cpu": [...]}
for f in sorted(glob.glob(os.path.join(out, "*.json"))):
    which, name, _r, _ = os.path.basename(f).split(".")
    for c in json.load(open(f))["cases"]:
        for mode, m in c["modes"].items():
            d = data.setdefault((name, mode), {}).setdefault(which, {"wall": [], "cpu": []})
            d["wall"].append(m["wall_s"] * 1e3)
            d["cpu"].append(m["cpu_s"] * 1e3)
def gm(xs):
    xs = [x for x in xs if x > 0]
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else float("nan")
print()
print("median ms per timed step (wall, process CPU); ratio = base / new (> 1: new is cheaper)")
print("| case | mode | base wall | new wall | wall ratio | base CPU | new CPU | CPU ratio | base CPU/wall | new CPU/wall |")
print("|---|---|---|---|---|---|---|---|---|---|")
ratios = {"wall": {}, "cpu": {}}
cw = {"base": {}, "new": {}}
for (name, mode) in sorted(data):
    d = data[(name, mode)]
    if "base" not in d or "new" not in d:
        continue
    med = {b: {k: statistics.median(d[b][k]) for k in ("wall", "cpu")} for b in ("base", "new")}
    rw = med["base"]["wall"] / med["new"]["wall"]
    rc = med["base"]["cpu"] / med["new"]["cpu"]
    ratios["wall"].setdefault(mode, []).append(rw)
    ratios["cpu"].setdefault(mode, []).append(rc)
    for b in ("base", "new"):
        cw[b].setdefault(mode, []).append(med[b]["cpu"] / med[b]["wall"])
    print(f"| {name} | {mode} | {med['base']['wall']:.3f} | {med['new']['wall']:.3f} | {rw:.2f} | "
          f"{med['base']['cpu']:.3f} | {med['new']['cpu']:.3f} | {rc:.2f} | "
          f"{med['base']['cpu'] / med['base']['wall']:.2f} | {med['new']['cpu'] / med['new']['wall']:.2f} |")
for mode in sorted(ratios["wall"]):
    print(f"| **geomean** | {mode} | | | {gm(ratios['wall'][mode]):.2f} | | | {gm(ratios['cpu'][mode]):.2f} | "
          f"{gm(cw['base'][mode]):.2f} | {gm(cw['new'][mode]):.2f} |")
EOF
