#!/usr/bin/env python3
"""Measure the single-replica figures the fleet simulator needs and write
them as its calibration file (bench/fleet/README.md, "Calibration").

  launch_rate_per_s, round_trip_s   service_bench against a private fuseboxd
                                    (process isolation): pipelined launches,
                                    median sync round trip;
  ckpt_write_Bps, ckpt_read_Bps     real Checkpoint / Restore through a
                                    private fuseboxd (process isolation,
                                    --checkpoint-key and --checkpoint-dir
                                    in a temporary directory): a session
                                    holding a dense i32 field of --ckpt-mib
                                    MiB, Session.checkpoint(on_server=True)
                                    and Client.restore(name=) (seal check,
                                    a new worker, the restore), median of 3,
                                    as bytes of session state per second;
  session_create_s                  the Python client: open a session on a
                                    small program, first launch (its kernel
                                    registered) and a sync, then close;
                                    median of --creates.

Usage: calibrate.py [--fuseboxd PATH] [--service-bench PATH] [--out FILE]
                    [--launches N] [--syncs N] [--mib N] [--ckpt-mib N]
                    [--creates N]
A Release build is meant (build-rel/); $FUSEBOXD and $FB_SERVICE_BENCH name others.
"""
import argparse
import datetime
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
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
    }, " ".join(cmd), out


CKPT = """
layout { field x: i32 (i: %d) }
kernel fill() { for i in x { x[i] = i * 7919 + 13 } }
"""


def checkpoint_rates(fusebox, fuseboxd, mib, repeat=3):
    """Checkpoint into the server's directory and restore by name, through
    fuseboxd: (write B/s, read B/s, the samples) over the field's bytes."""
    tmp = tempfile.mkdtemp(prefix="fb-calibrate-")
    n = mib * (1 << 20) // 4
    try:
        with fusebox.connect(fuseboxd=fuseboxd, timeout=600, server_args=[
                "--isolation", "process", "--checkpoint-key", os.path.join(tmp, "key"),
                "--checkpoint-key-create", "--checkpoint-dir", os.path.join(tmp, "ckpt"),
                "--session-memory-limit", str(2 * n * 4 + (64 << 20))]) as fb:
            s = fb.session(source=CKPT % n)
            s.kernels.fill()
            s.sync()
            w, r = [], []
            for _ in range(repeat):
                t0 = time.perf_counter()
                name = s.checkpoint(on_server=True)
                w.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                back = fb.restore(name=name)
                r.append(time.perf_counter() - t0)
                back.close()
            s.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    nbytes = n * 4
    return nbytes / statistics.median(w), nbytes / statistics.median(r), w, r


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
    p.add_argument("--ckpt-mib", type=int, default=256)
    p.add_argument("--creates", type=int, default=20)
    a = p.parse_args()
    fuseboxd = find(a.fuseboxd, "FUSEBOXD", "server/fuseboxd")
    sb = find(a.service_bench, "FB_SERVICE_BENCH", "bench/service_bench")
    figs, cmd, raw = service_bench(sb, fuseboxd, a)
    fusebox = import_fusebox()
    create, all_creates = session_create(fusebox, fuseboxd, a.creates)
    cal = dict(figs)
    cal["session_create_s"] = create
    wbps, rbps, wts, rts = checkpoint_rates(fusebox, fuseboxd, a.ckpt_mib)
    cal["ckpt_write_Bps"] = wbps
    cal["ckpt_read_Bps"] = rbps
    cal["measured"] = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "host": platform.node(), "cpus": os.cpu_count(),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "fuseboxd": fuseboxd, "service_bench": cmd,
        "service_bench_output": raw.strip().splitlines(),
        "session_create_samples_s": [round(t, 5) for t in all_creates],
        "checkpoint": f"{a.ckpt_mib} MiB field, Checkpoint(to_server) and Restore(name)",
        "checkpoint_samples_s": [round(t, 4) for t in wts],
        "restore_samples_s": [round(t, 4) for t in rts],
    }
    with open(a.out, "w") as f:
        json.dump(cal, f, indent=1)
        f.write("\n")
    print(json.dumps({k: v for k, v in cal.items() if k != "measured"}, indent=1))
    print(f"calibrate.py: wrote {a.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
