"""A stand-in for both engines of bench/peers/bench_peers.py, so that the
driver's run (interleaving, medians, wall and CPU ratio tables, thread and
load-average records, agreement check, exit status) is tested without
Taichi, without a Release build and without the network.

  fake_engine.py LOG fusebox bench CASE.json --local --modes sync,async ... --json OUT
  fake_engine.py LOG peer HARNESS.py SUITE/CASE --warmup W --repeat R --threads T [--async]

Each call appends "ROLE CASE" to LOG. Canned figures (seconds per step):
Fusebox sync wall 4e-3, CPU 8e-3; async wall 2e-3, CPU 3e-3; the peer's wall
is 10e-3, 30e-3, 20e-3 on its 1st, 2nd, 3rd call for a case (median 20e-3)
and its CPU 6e-3, both times 4 on large/ cases. Environment: FAKE_CORES
(Fusebox's machine.cpu_threads, default: the --threads it was given; fails without one), FAKE_PEER_THREADS (default: --threads),
FAKE_OFF=1 (the peer's sum is off by 1%), FAKE_FAIL=1 (Fusebox exits 1).
The peer touches 40 MiB before it answers, so that its peak memory (the
driver's RSS high-water mark) is known to be above 40 MiB and Fusebox's
(a few MiB of Python) below it.
"""
import json
import os
import sys

STATS = {"x": {"n": 4, "sum": 10.0, "abs_sum": 10.0, "min": 1.0, "max": 4.0}}


def main():
    log, role, args = sys.argv[1], sys.argv[2], sys.argv[3:]
    case = args[1][:-5].split("/bench/")[-1] if role == "fusebox" else args[1]
    with open(log, "a") as f:
        f.write("%s %s\n" % (role, case))
    with open(log) as f:
        calls = sum(1 for l in f if l.split() == [role, case])
    k = 4.0 if case.startswith("large/") else 1.0
    if role == "fusebox":
        if os.environ.get("FAKE_FAIL"):
            sys.stderr.write("fake fusebox: failing as asked\n")
            return 1
        modes = {"sync": {"wall_s": 4e-3, "cpu_s": 8e-3, "fields": STATS},
                 "async": {"wall_s": 2e-3, "cpu_s": 3e-3, "fields": STATS}}
        with open(args[args.index("--json") + 1], "w") as f:
            threads = int(os.environ.get("FAKE_CORES", args[args.index("--threads") + 1]))
            json.dump({"machine": {"cores": 2, "cpu_threads": threads},
                       "cases": [{"name": case, "checks_passed": True, "modes": modes}]}, f)
        return 0
    threads = int(os.environ.get("FAKE_PEER_THREADS", args[args.index("--threads") + 1]))
    ballast = bytearray(40 << 20)
    ballast[::4096] = b"\1" * (len(ballast) // 4096)  # a byte a page: every page resident
    fields = json.loads(json.dumps(STATS))
    if os.environ.get("FAKE_OFF"):
        fields["x"]["sum"] *= 1.01
    wall = (10e-3, 30e-3, 20e-3)[(calls - 1) % 3] * k
    print("taichi-like log line")
    print(json.dumps({"case": case, "rtol": 1e-4, "stats": ["sum", "abs_sum", "min", "max"],
                      "threads": threads, "wall_s": wall, "cpu_s": 6e-3 * k, "fields": fields,
                      "ballast": len(ballast)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
