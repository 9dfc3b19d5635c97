#!/usr/bin/env python3
"""Before and after on Taichi 1.7's shipped examples: two Fusebox builds
(each with the fusebox.taichi of the checkout it was built from) and Taichi
1.7, interleaved, through bench_peers.py's shipped suite.

    python3 bench/peers/shipped_ab.py BASE_BUILD NEW_BUILD [--cases a,b] [--cycles N]

BASE_BUILD and NEW_BUILD are build folders (Release: BUILD/client/fusebox,
BUILD/server/fuseboxd). Per cycle: bench_peers.py --cases ... --cycles 1
with the base build, then with the new one (each runs Fusebox sync, async
and Taichi 1.7, one process each per example). Prints, per example, the
median over the cycles of the process-tree CPU ms per timed frame (and of
wall-clock) of each, new / base, and Taichi / Fusebox async for both.
Taichi 1.7 is $FB_TAICHI_PYTHON, else ~/.cache/fusebox-peers/taichi17
(scripts/bench_peers.sh makes it). Exit status: bench_peers.py's worst.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT = "mpm88,waterwave,game_of_life,taichi_sparse,mass_spring_game"


def main(argv):
    ap = argparse.ArgumentParser(prog="shipped_ab", description=__doc__.split("\n\n")[0])
    ap.add_argument("base")
    ap.add_argument("new")
    ap.add_argument("--cases", default=DEFAULT, help="shipped examples (default %s)" % DEFAULT)
    ap.add_argument("--cycles", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=2, help="warm-up frames (default 2)")
    ap.add_argument("--repeat", type=int, default=10, help="timed frames (default 10)")
    a = ap.parse_args(argv)
    py = os.environ.get("FB_TAICHI_PYTHON") or os.path.join(
        os.environ.get("FB_PEERS_DIR") or os.path.expanduser("~/.cache/fusebox-peers"),
        "taichi17", "bin", "python")
    cases = ["shipped/" + c for c in a.cases.split(",")]
    builds = {"base": a.base, "new": a.new}
    figs = {b: {} for b in builds}  # build -> "wall"/"cpu" -> case -> engine -> [per cycle]
    worst = 0
    with tempfile.TemporaryDirectory() as d:
        for cyc in range(a.cycles):
            for b, build in builds.items():
                out = os.path.join(d, "%s-%d.json" % (b, cyc))
                cmd = [sys.executable, os.path.join(HERE, "bench_peers.py"),
                       "--fusebox", os.path.join(build, "client", "fusebox"),
                       "--peer", "taichi-1.7=" + py, "--cases", ",".join(cases), "--cycles", "1",
                       "--json", out]
                cmd += ["--warmup", str(a.warmup)] if a.warmup is not None else []
                cmd += ["--repeat", str(a.repeat)] if a.repeat is not None else []
                print("[cycle %d/%d] %s: %s" % (cyc + 1, a.cycles, b, build), file=sys.stderr, flush=True)
                r = subprocess.run(cmd, stdout=subprocess.PIPE, universal_newlines=True)
                worst = max(worst, r.returncode)
                if r.returncode:
                    print(r.stdout[-3000:], file=sys.stderr)
                if not os.path.exists(out):
                    continue
                with open(out) as f:
                    j = json.load(f)
                for kind, key in (("cpu", "median_cpu_s"), ("wall", "median_wall_s")):
                    for c, t in j[key].items():
                        for e, v in t.items():
                            if v is not None:
                                figs[b].setdefault(kind, {}).setdefault(c, {}).setdefault(e, []).append(v)

    def med(b, kind, c, e):
        v = figs[b].get(kind, {}).get(c, {}).get(e)
        return statistics.median(v) if v else None

    def ratio(x, y):
        return "%.2f" % (x / y) if x and y else "-"
    for kind in ("cpu", "wall"):
        print("\nmedian %s ms per frame over %d cycles (%s)" % (
            "process-tree CPU" if kind == "cpu" else "wall-clock", a.cycles,
            "base %s, new %s" % (a.base, a.new)))
        print("| example | base sync | base async | new sync | new async | Taichi 1.7 | "
              "new/base async | Taichi/base async | Taichi/new async |")
        print("|---" * 9 + "|")
        for c in cases:
            bs, ba, ns, na = (med(b, kind, c, e) for b in ("base", "new")
                              for e in ("fusebox-sync", "fusebox-async"))
            tis = [x for b in builds for x in figs[b].get(kind, {}).get(c, {}).get("taichi-1.7", [])]
            t = statistics.median(tis) if tis else None
            cells = ["%.3f" % (x * 1e3) if x else "-" for x in (bs, ba, ns, na, t)]
            print("| %s | %s | %s | %s | %s |" % (c.split("/", 1)[1], " | ".join(cells), ratio(na, ba),
                                                  ratio(t, ba), ratio(t, na)))
    return worst


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
