"""The paper's harness for the Taichi ports, the same as `fusebox bench`'s:
setup, one step and a sync (compilation), W warm-up steps, then R timed steps
with a sync after each; wall-clock is the mean of the timed steps. After the
last step it prints one JSON object: the wall-clock and the process CPU time
(every thread of this process: time.process_time, the clock `fusebox bench`'s
`cpu ms` reads) per timed step, the compute threads Taichi was configured
with (cpu_max_num_threads, read back after ti.init) and, for each field the
Fusebox session compares between modes (its `same_across_modes`), the count,
sum, sum of |x|, min and max, so that bench_peers.py can check that both
engines computed the same thing: within the port's "rtol" (default 1e-4,
relative to the field's magnitude) on the statistics it names ("stats",
default all four).

Run by scripts/bench_peers.sh through bench_peers.py, one process per case:
  python harness.py SUITE/CASE --warmup W --repeat R [--threads 2] [--async]
Works with Taichi 1.7 and 0.7 (the one with async_mode): the ports use only
the API the two share.
"""
import argparse
import importlib
import json
import os
import sys
import time


def field_stats(a):
    import numpy as np
    a = np.asarray(a, dtype=np.float64).ravel()
    if a.size == 0:
        return {"n": 0, "sum": 0.0, "abs_sum": 0.0, "min": 0.0, "max": 0.0}
    return {"n": int(a.size), "sum": float(a.sum()), "abs_sum": float(np.abs(a).sum()),
            "min": float(a.min()), "max": float(a.max())}


def configured_threads(ti):
    """The CPU thread count Taichi runs kernels with, as it took it from
    ti.init (the same attribute in 0.7 and 1.7)."""
    return int(ti.lang.impl.current_cfg().cpu_max_num_threads)


def os_threads():
    """Threads this process has now (Python, Taichi's pool, its compiler's
    and, with async_mode, the async engine's): only for the record."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("case", help="SUITE/CASE, e.g. micro/chain_copy or large/mgpcg2d")
    ap.add_argument("--warmup", type=int, required=True)
    ap.add_argument("--repeat", type=int, required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--async", dest="async_mode", action="store_true",
                    help="Taichi 0.7's async_mode=True (AsyncTaichi)")
    args = ap.parse_args()
    if args.warmup < 0 or args.repeat < 1:
        sys.exit("harness.py: --warmup must be >= 0 and --repeat >= 1")
    suite, _, name = args.case.partition("/")
    if suite not in ("micro", "large", "real") or not name.replace("_", "").isalnum():
        sys.exit("harness.py: case must be micro/NAME, large/NAME or real/NAME, got %r" % args.case)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    mod = importlib.import_module("%s_%s" % (suite, name))

    import taichi as ti
    kw = dict(arch=ti.cpu, cpu_max_num_threads=args.threads)
    if args.async_mode:
        kw["async_mode"] = True
    ti.init(**kw)
    case = mod.make(ti)

    t_start = time.perf_counter()
    case["setup"]()
    ti.sync()
    case["step"]()
    ti.sync()
    first_s = time.perf_counter() - t_start
    for _ in range(args.warmup):
        case["step"]()
        ti.sync()
    t0, u0 = time.perf_counter(), time.process_time()
    for _ in range(args.repeat):
        case["step"]()
        ti.sync()
    wall_s = (time.perf_counter() - t0) / args.repeat
    cpu_s = (time.process_time() - u0) / args.repeat
    fields = {k: field_stats(f.to_numpy()) for k, f in case["fields"].items()}
    print(json.dumps({"case": name, "rtol": case.get("rtol", 1e-4),
                      "stats": case.get("stats", ["sum", "abs_sum", "min", "max"]), "taichi": ".".join(map(str, ti.__version__)),
                      "async_mode": args.async_mode,
                      "warmup": args.warmup, "repeat": args.repeat,
                      "threads": configured_threads(ti), "os_threads": os_threads(),
                      "first_step_s": first_s, "wall_s": wall_s, "cpu_s": cpu_s, "fields": fields}))


if __name__ == "__main__":
    main()
