#!/usr/bin/env python3
"""Measure the single-replica figures the fleet simulator needs and write
them as its calibration file (bench/fleet/README.md, "Calibration").

  launch_rate_per_s, round_trip_s   service_bench against a private fuseboxd
                                    (process isolation): pipelined launches,
                                    median sync round trip;
  ckpt_write_Bps, ckpt_read_Bps     a PROXY until checkpoints land: bulk
                                    WriteField / ReadField throughput of
                                    service_bench's field (the bytes a
                                    checkpoint and a restore move through
                                    fuseboxd), said so in the file ("proxy");
  session_create_s                  the Python client: open a session on a
                                    small program, first launch (its kernel
                                    registered) and a sync, then close;
                                    median of --creates.

Usage: calibrate.py [--fuseboxd PATH] [--service-bench PATH] [--out FILE]
                    [--launches N] [--syncs N] [--mib N] [--creates N]
A Release build is meant (build-rel/); $FUSEBOXD and $FB_SERVICE_BENCH name others.
"""
import argparse
import datetime
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import time

from _fb import HERE, find, import_fusebox

SMALL = """
layout { field c: i32 (i: 1024) }
kernel bump() { for i in c { c[i] = c[i] + 1 } }
"""


def service_bench(exe, fuseboxd, a):
    cmd = [exe, "--fuseboxd", fuseboxd, "--isolation", "process", "--launches",
           str(a.launches), "--syncs", str(a.syncs), "--mib", str(a.mib), "--repeat", "3"]
    print("calibrate.py: " + " ".join(cmd), file=sys.stderr)
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if p.returncode:
        raise SystemExit(f"calibrate.py: service_bench failed (exit {p.returncode}): "
                         f"{p.stderr.strip()[-2000:]}")
    out = p.stdout

    def fig(label, unit):
        m = re.search(re.escape(label) + r"\s+([0-9.]+)\s*" + re.escape(unit), out)
        if not m:
            raise SystemExit(f"calibrate.py: no '{label}' figure in service_bench's output:\n{out}")
        return float(m.group(1))
    return {
        "launch_rate_per_s": fig("launches/s (pipelined)", ""),
        "round_trip_s": fig("sync round trip median", "us") * 1e-6,
        "round_trip_p99_s": fig("sync round trip p99", "us") * 1e-6,
        "ckpt_write_Bps": fig("bulk write", "GB/s") * 1e9,
        "ckpt_read_Bps": fig("bulk read", "GB/s") * 1e9,
    }, " ".join(cmd), out


def session_create(fusebox, fuseboxd, n):
    ts = []
    with fusebox.connect(fuseboxd=fuseboxd) as fb:
        for i in range(n + 1):
            t0 = time.perf_counter()
            with fb.session(source=SMALL) as s:
                s.kernels.bump()
                s.sync()
                t1 = time.perf_counter()
            if i:   # the first one warms the compiler's cache of the server up
                ts.append(t1 - t0)
    return statistics.median(ts), ts


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--fuseboxd")
    p.add_argument("--service-bench")
    p.add_argument("--out", default=os.path.join(HERE, "calibration.json"))
    p.add_argument("--launches", type=int, default=200000)
    p.add_argument("--syncs", type=int, default=2000)
    p.add_argument("--mib", type=int, default=256)
    p.add_argument("--creates", type=int, default=20)
    a = p.parse_args()
    fuseboxd = find(a.fuseboxd, "FUSEBOXD", "server/fuseboxd")
    sb = find(a.service_bench, "FB_SERVICE_BENCH", "bench/service_bench")
    figs, cmd, raw = service_bench(sb, fuseboxd, a)
    fusebox = import_fusebox()
    create, all_creates = session_create(fusebox, fuseboxd, a.creates)
    cal = dict(figs)
    cal["session_create_s"] = create
    cal["proxy"] = ("ckpt_write_Bps and ckpt_read_Bps are WriteField / ReadField throughput "
                    f"of a {a.mib} MiB field through fuseboxd (service_bench's bulk figures), "
                    "a proxy for checkpoint and restore throughput until checkpoints land")
    cal["measured"] = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "host": platform.node(), "cpus": os.cpu_count(),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "fuseboxd": fuseboxd, "service_bench": cmd,
        "service_bench_output": raw.strip().splitlines(),
        "session_create_samples_s": [round(t, 5) for t in all_creates],
    }
    with open(a.out, "w") as f:
        json.dump(cal, f, indent=1)
        f.write("\n")
    print(json.dumps({k: v for k, v in cal.items() if k != "measured"}, indent=1))
    print(f"calibrate.py: wrote {a.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
