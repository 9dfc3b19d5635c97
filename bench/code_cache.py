#!/usr/bin/env python3
"""Time to the first sync result after a restart, with the compile cache on
disk (docs/code-cache.md): cold, warm from disk, warm in process.

For each case (a JSON session of bench/micro, bench/large) and each of
--restarts rounds:
  cold      a new fuseboxd on an empty --code-cache-dir; `fusebox run`
  disk      fuseboxd stopped and started again on that directory; `fusebox run`
  process   the same fuseboxd again; `fusebox run` (the in-memory cache)
Each figure is `fusebox run --json`'s elapsed_s (load the program, setup,
one step, the checks: the first sync result) and its counters; the table
gives p50s, compile time, tasks compiled vs found, bytes on disk and the
load time per entry ((disk - process) / entries); compile time is cold
minus warm in process (`fusebox run --json` reports none of its own). Sync mode, thread
isolation (the cache serves it), CPU.

    python3 bench/code_cache.py --build build-rel bench/micro/*.json bench/large/*.json
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time


def start(build, tmp, cache):
    sock = os.path.join(tmp, "fuseboxd.sock")
    r, w = os.pipe()
    log = open(os.path.join(tmp, "fuseboxd.log"), "a")
    p = subprocess.Popen([os.path.join(build, "server", "fuseboxd"), "--listen", "unix:" + sock,
                          "--ready-fd", str(w), "--isolation", "thread", "--private",
                          "--backend", "cpu", "--code-cache-dir", cache],
                         pass_fds=(w,), stdout=log, stderr=subprocess.STDOUT)
    os.close(w)
    with os.fdopen(r) as f:
        line = f.readline().strip()
    if not line:
        p.wait(timeout=30)
        sys.exit("fuseboxd did not start (see %s)" % log.name)
    return p, line.split()[0]


def stop(p):
    p.terminate()
    p.wait(timeout=60)


def run(build, case, addr):
    for attempt in range(5):  # an exec refused EACCES now and then on a busy machine
        try:
            return run_once(build, case, addr)
        except PermissionError:
            time.sleep(0.5)
    return run_once(build, case, addr)


def run_once(build, case, addr):
    out = subprocess.run([os.path.join(build, "client", "fusebox"), "run", case, "--server", addr,
                          "--mode", "sync", "--json", "-q", "-o", tempfile.gettempdir()],
                         capture_output=True, text=True, timeout=1800)
    try:
        j = json.loads(out.stdout)
    except ValueError:
        sys.exit(f"{case}: no JSON from fusebox run:\n{out.stdout}\n{out.stderr}")
    if j.get("outcome") != "passed":
        sys.exit(f"{case}: {j.get('outcome')}: {j.get('error')}")
    return j


def disk_bytes(cache):
    n = k = 0
    for root, _, files in os.walk(cache):
        for f in files:
            if f.endswith(".fbc"):
                n += os.path.getsize(os.path.join(root, f))
                k += 1
    return n, k


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("cases", nargs="+")
    ap.add_argument("--build", default="build-rel")
    ap.add_argument("--restarts", type=int, default=5)
    ap.add_argument("--json")
    a = ap.parse_args()
    rows = []
    for case in a.cases:
        cold, disk, proc, comp = [], [], [], []
        counts = None
        for _ in range(a.restarts):
            tmp = tempfile.mkdtemp(prefix="fbccb-")
            cache = os.path.join(tmp, "cache")
            p = None
            try:
                p, addr = start(a.build, tmp, cache)
                jc = run(a.build, case, addr)
                stop(p)
                nbytes, nent = disk_bytes(cache)
                p, addr = start(a.build, tmp, cache)
                jd = run(a.build, case, addr)
                jp = run(a.build, case, addr)
                stop(p)
            finally:
                if p is not None and p.poll() is None:
                    p.kill()  # no fuseboxd outlives the run
                    p.wait()
                shutil.rmtree(tmp, ignore_errors=True)
            cold.append(jc["elapsed_s"])
            disk.append(jd["elapsed_s"])
            proc.append(jp["elapsed_s"])
            # `fusebox run --json` has no compile time: cold minus warm in
            # process stands for it (compiling is all that differs)
            comp.append(jc["elapsed_s"] - jp["elapsed_s"])
            counts = (jc["counters"]["tasks_compiled"], jd["counters"]["tasks_compiled"],
                      jd["counters"]["cache_hits"], nbytes, nent)
        m = {k: statistics.median(v) for k, v in
             (("cold", cold), ("disk", disk), ("process", proc), ("compile", comp))}
        row = {"case": os.path.relpath(case), **m, "tasks_compiled_cold": counts[0],
               "tasks_compiled_disk": counts[1], "disk_hits": counts[2],
               "bytes_on_disk": counts[3], "entries": counts[4],
               "load_ms_per_entry": 1e3 * max(0.0, m["disk"] - m["process"]) / max(1, counts[4]),
               "restarts": a.restarts}
        rows.append(row)
        print("%-34s cold %8.3f s  disk %7.3f s  process %7.3f s  disk/process %5.2f  "
              "disk/cold %5.3f  compile %7.3f s  compiled %3d -> %d, disk hits %3d  "
              "%8d B in %3d entries  %.2f ms/entry" %
              (row["case"], m["cold"], m["disk"], m["process"], m["disk"] / m["process"],
               m["disk"] / m["cold"], m["compile"], counts[0], counts[1], counts[2],
               counts[3], counts[4], row["load_ms_per_entry"]), flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
