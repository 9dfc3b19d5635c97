"""What a session's move off a draining replica costs (bench/RESULTS.md,
"Moving a session off a draining replica"): two fuseboxd replicas on
127.0.0.1 sharing only the checkpoint key, a client given both addresses,
a session holding one dense i32 field of --mib MiB; then --repeat times,
interleaved:

  call       a launch and a sync on the session where it is
  explicit   Session.checkpoint(path) then Client.restore(path) of the
             same state by hand (the paths a move takes), the restored
             session closed
  move       SIGTERM to the session's replica (--drain-grace-s 600), then
             a launch and a sync: the call that moves the session (a sync
             there, the checkpoint streamed here, restored on the other
             replica, the old closed, the stream reopened)

after each move the replicas trade places (the drained one is started
again). Prints medians in seconds and the move's GB/s of session state;
checks the field's first cells after every move.

  python3 bench/move_bench.py --fuseboxd build-rel/server/fuseboxd \\
      [--mib N] [--repeat R] [--isolation process|thread]

The fusebox package must be importable (pip install ./python, or
PYTHONPATH of a build_py of it).
"""
import argparse
import os
import shutil
import signal
import statistics
import tempfile
import time

PROGRAM = """
layout {
  field x: i32 (i: %d)
}
kernel fill() {
  for i in x { x[i] = i * 7919 + 13 }
}
kernel bump() {
  for i in x { x[i] = x[i] + 1 }
}
"""


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fuseboxd", required=True)
    ap.add_argument("--mib", type=int, default=256)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--isolation", default="process", choices=["process", "thread"])
    a = ap.parse_args()
    import fusebox
    from fusebox.client import _Daemon

    tmp = tempfile.mkdtemp(prefix="move-bench-")
    n = a.mib * (1 << 20) // 4
    key = os.path.join(tmp, "key")

    def replica(name, listen="127.0.0.1:0"):
        args = ["--replica-name", name, "--drain-grace-s", "600", "--isolation", a.isolation,
                "--checkpoint-key", key, "--session-memory-limit", str(2 * n * 4 + (64 << 20))]
        if not os.path.exists(key):
            args.append("--checkpoint-key-create")
        d = _Daemon(a.fuseboxd, args, listen=listen)
        d.name = name
        return d

    reps = [replica("ra"), replica("rb")]
    t = {k: [] for k in ("call", "explicit", "move")}
    try:
        c = fusebox.connect([r.address for r in reps], timeout=3600)
        s = c.session(PROGRAM % n)
        s.kernels.fill()
        bumps = 0
        path = os.path.join(tmp, "s.fbck")
        for i in range(a.repeat):
            t0 = time.perf_counter()
            s.kernels.bump()
            s.sync()
            t["call"].append(time.perf_counter() - t0)
            bumps += 1
            t0 = time.perf_counter()
            s.checkpoint(path)
            c.restore(path).close()
            t["explicit"].append(time.perf_counter() - t0)
            home = next(r for r in reps if r.address == s._addr)
            home.proc.send_signal(signal.SIGTERM)
            time.sleep(0.5)  # the notice is on the stream
            t0 = time.perf_counter()
            s.kernels.bump()
            s.sync()
            t["move"].append(time.perf_counter() - t0)
            bumps += 1
            assert s.moves == i + 1, (s.moves, i)
            xs = s.fields.x.to_numpy()
            assert xs[0] == 13 + bumps and xs[1] == 7919 + 13 + bumps, "moved wrong"
            assert home.proc.wait(timeout=120) == 0
            home.stop()
            # the drained one comes back under its name and address
            reps[reps.index(home)] = replica(home.name, home.address)
        s.close()
        c.close()
    finally:
        for r in reps:
            r.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    gb = n * 4 / 1e9
    for k, v in t.items():
        m = statistics.median(v)
        extra = f"  {gb / m:.3f} GB/s" if k != "call" else ""
        print(f"{k:9s} median {m:8.3f} s over {len(v)}{extra}")


if __name__ == "__main__":
    main()
