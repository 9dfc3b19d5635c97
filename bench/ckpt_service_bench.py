"""Checkpoint and restore throughput through fuseboxd (bench/RESULTS.md,
"Checkpoint and restore through fuseboxd"): a session holding one dense i32
field of --mib MiB (default 1024), on a fuseboxd started here on a unix
socket with --checkpoint-key and --checkpoint-dir in --dir (default /tmp),
then --repeat times (default 3), interleaved:

  to_file    Session.checkpoint(path): the server seals it into a memfd,
             streams it; the client writes it to a file (fsync, rename)
  to_server  Session.checkpoint(on_server=True): sealed into the tenant's
             directory (fsync, rename)
  from_file  Client.restore(path): upload, seal check, restore in a new
             session (a new worker under process isolation)
  by_name    Client.restore(name=...): seal check, restore

Each prints the median seconds and GB/s of session state (the field's
bytes over the time), and beside them the CPU time the phase took, all
threads of fuseboxd, of its session workers (live and reaped) and of this
client together, with the GB/s per CPU-second: what the work costs,
whatever else the machine runs. Every restored session is checked against
the original (a checksum kernel) and closed.

  python3 bench/ckpt_service_bench.py --fuseboxd build-rel/server/fuseboxd \
      [--mib N] [--repeat R] [--dir D] [--isolation process|thread]
"""
import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))

PROGRAM = """
layout {
  field x: i32 (i: %d)
  place sum: i32
}
kernel fill() {
  for i in x { x[i] = i * 7919 + 13 }
}
kernel check() {
  sum[] = 0
  for i in x { sum[] += x[i] & 255 }
}
"""


TICK = os.sysconf("SC_CLK_TCK")


def tree_cpu(root):
    """CPU seconds of process root and every live descendant (utime and
    stime), plus what its reaped children took (cutime and cstime of the
    processes walked)."""
    kids, stat = {}, {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                txt = f.read()
        except OSError:
            continue
        f = txt[txt.rindex(")") + 2:].split()
        pid, ppid = int(d), int(f[1])
        stat[pid] = sum(int(x) for x in f[11:15])
        kids.setdefault(ppid, []).append(pid)
    total, stack = 0, [root]
    while stack:
        p = stack.pop()
        total += stat.get(p, 0)
        stack.extend(kids.get(p, []))
    return total / TICK


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fuseboxd", required=True)
    ap.add_argument("--mib", type=int, default=1024)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--dir", default="/tmp")
    ap.add_argument("--isolation", default="process", choices=["process", "thread"])
    a = ap.parse_args()
    import fusebox

    tmp = tempfile.mkdtemp(prefix="ckpt-svc-bench-", dir=a.dir)
    try:
        n = a.mib * (1 << 20) // 4
        c = fusebox.connect(fuseboxd=a.fuseboxd, server_args=[
            "--isolation", a.isolation, "--checkpoint-key", os.path.join(tmp, "key"),
            "--checkpoint-key-create", "--checkpoint-dir", os.path.join(tmp, "ckpt"),
            "--session-memory-limit", str(2 * n * 4 + (64 << 20))], timeout=3600)
        s = c.session(PROGRAM % n)
        s.kernels.fill()
        s.kernels.check()
        want = int(s.fields.sum.to_numpy())
        nbytes = n * 4
        t = {k: [] for k in ("to_file", "to_server", "from_file", "by_name")}
        cpu = {k: [] for k in t}
        path = os.path.join(tmp, "s.fbck")
        server = c._daemon.proc.pid

        def clock():
            return time.perf_counter(), tree_cpu(server) + time.process_time()

        def done(k, t0, c0):
            t1, c1 = clock()
            t[k].append(t1 - t0)
            cpu[k].append(c1 - c0)

        for _ in range(a.repeat):
            t0, c0 = clock()
            s.checkpoint(path)
            done("to_file", t0, c0)
            t0, c0 = clock()
            name = s.checkpoint(on_server=True)
            done("to_server", t0, c0)
            for how in ("from_file", "by_name"):
                t0, c0 = clock()
                r = c.restore(path) if how == "from_file" else c.restore(name=name)
                done(how, t0, c0)
                r.kernels.check()
                got = int(r.fields.sum.to_numpy())
                assert got == want, f"{how}: checksum {got}, expected {want}"
                r.close()
        size = os.path.getsize(path)
        print(f"session state {nbytes / 1e9:.3f} GB, checkpoint file {size / 1e9:.3f} GB, "
              f"isolation {a.isolation}, {a.repeat} runs, medians:")
        for k, v in t.items():
            m = statistics.median(v)
            mc = statistics.median(cpu[k])
            print(f"  {k:10s} {m:8.3f} s  {nbytes / m / 1e9:6.2f} GB/s   CPU {mc:7.3f} s "
                  f"{nbytes / mc / 1e9:6.2f} GB/CPU-s   (runs: "
                  + ", ".join(f"{x:.3f}" for x in v) + ")")
        print(f"load average now: {os.getloadavg()[0]:.2f} ({os.cpu_count()} cores)")
        c.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
