"""Sessions that move off a draining replica by themselves (docs/python.md
"Several replicas", docs/checkpoint.md "Moving a session off a draining
replica"), through real fuseboxd replicas on 127.0.0.1:

- given as an address list, replicas sharing only the checkpoint key (no
  storage): a session mid-run whose replica drains moves at its next call
  (checkpoint streamed to the client, restored on the next address) and
  ends with the fields of an uninterrupted run, bit for bit; the drained
  replica, its last session gone, exits at once;
- the same behind the real nginx and HAProxy of test_replicas.py (a new
  routing key reaches another replica);
- the grace over while the client was idle, replicas sharing
  --checkpoint-dir: the session resumes from the checkpoint the drain took,
  by name, on the other replica, with the same results;
- replicas sharing neither: the clear error of the drain stays, saying
  that resuming elsewhere failed.
"""
import os
import signal
import time

import numpy as np
import pytest

import fusebox
from test_checkpoint import PROGRAM, state
from test_replicas import Replica, readyz, start_proxy

STEPS = 14


def reference(c):
    """The fields of an uninterrupted run of STEPS steps."""
    ref = c.session(PROGRAM, seed=5)
    for t in range(STEPS):
        ref.kernels.step(t)
    want = state(ref)
    ref.close()
    return want


def ckpt(tmp, name, shared_dir=False):
    """The checkpoint flags: one key for all (made by the first); a directory
    shared, one of its own (shared_dir False), or none (None)."""
    key = os.path.join(tmp, "key")
    args = ["--checkpoint-key", key]
    if not os.path.exists(key):
        args.append("--checkpoint-key-create")
    if shared_dir is not None:
        args += ["--checkpoint-dir",
                 os.path.join(tmp, "ckpt" if shared_dir else "ckpt-" + name)]
    return args


def replicas(tmp, n, shared_dir=False, grace=30):
    out = []
    for i in range(n):
        out.append(Replica(tmp, f"r{i}", *ckpt(tmp, f"r{i}", shared_dir), grace=grace))
    return out


def stop(reps, proxy=None):
    if proxy is not None:
        proxy.terminate()
        proxy.wait(timeout=30)
    for r in reps:
        if r.proc.poll() is None:
            r.proc.send_signal(signal.SIGTERM)
            r.proc.send_signal(signal.SIGTERM)  # the second ends a drain at once
    for r in reps:
        try:
            r.proc.wait(timeout=60)
        except Exception:  # noqa: BLE001
            r.proc.kill()
            r.proc.wait()


def drain(rep):
    rep.proc.send_signal(signal.SIGTERM)
    end = time.monotonic() + 10
    while readyz(rep.mport) != 503:
        assert time.monotonic() < end, "/readyz still 200 while draining"
        time.sleep(0.05)


def test_moves_along_an_address_list(tmp_path):
    tmp = str(tmp_path)
    reps = replicas(tmp, 3, shared_dir=None)  # the key shared, no storage
    try:
        c = fusebox.connect([f"127.0.0.1:{r.port}" for r in reps], timeout=60)
        want = reference(c)
        s = c.session(PROGRAM, seed=5)
        assert s.replica == "r0"  # the first address
        x, step = s.fields.x, s.kernels.step  # handles taken before the move
        for t in range(6):
            step(t)
        s.sync()
        drain(reps[0])
        # r0 tells the session on its stream; the client's reader notes it
        # (launches alone read nothing: without this wait a quick machine
        # ran every step before the notice was read, and nothing moved)
        end = time.monotonic() + 10
        while s._draining is None:
            assert time.monotonic() < end, "no drain notice on the session's stream"
            time.sleep(0.05)
        for t in range(6, STEPS):  # told: the session moves at its next call
            step(t)
        assert s.moves == 1 and s.replica == "r1", (s.moves, s.replica)
        got = state(s)
        assert got == want, [k for k in want if got[k] != want[k]]
        assert x.to_numpy().tobytes() == want["x"]
        # r0's only session left it: its drain ends long before the grace
        assert reps[0].proc.wait(timeout=20) == 0, reps[0].text()
        s.close()
        c.close()
    finally:
        stop(reps)


@pytest.mark.parametrize("kind", ["nginx", "haproxy"])
def test_moves_behind_a_proxy(kind, tmp_path):
    tmp = str(tmp_path)
    reps = replicas(tmp, 3, shared_dir=None)
    proxy = None
    try:
        proxy, address = start_proxy(kind, tmp, reps)
        c = fusebox.connect(address, timeout=60)
        end = time.monotonic() + 30  # the proxy's first health checks
        while True:
            try:
                c.info(timeout=5)
                break
            except fusebox.ServerError:
                assert time.monotonic() < end, f"{kind} does not reach the replicas"
                time.sleep(0.2)
        want = reference(c)
        s = c.session(PROGRAM, seed=5)
        home = s.replica
        for t in range(7):
            s.kernels.step(t)
        s.sync()
        drain(next(r for r in reps if r.name == home))
        for t in range(7, STEPS):
            s.kernels.step(t)
            s.sync()
        assert s.moves == 1 and s.replica not in ("", home), (s.moves, home, s.replica)
        got = state(s)
        assert got == want, [k for k in want if got[k] != want[k]]
        s.close()
        c.close()
    finally:
        stop(reps, proxy)


def test_resumes_from_the_drains_checkpoint_in_a_shared_dir(tmp_path):
    tmp = str(tmp_path)
    reps = replicas(tmp, 2, shared_dir=True, grace=1)
    try:
        c = fusebox.connect([f"127.0.0.1:{r.port}" for r in reps], timeout=60)
        want = reference(c)
        s = c.session(PROGRAM, seed=5)
        assert s.replica == "r0"
        for t in range(8):
            s.kernels.step(t)
        s.sync()
        drain(reps[0])
        # idle through the grace: r0 checkpoints the session and exits
        assert reps[0].proc.wait(timeout=60) == 0, reps[0].text()
        assert "its state is in checkpoint" in reps[0].text()
        for t in range(8, STEPS):
            s.kernels.step(t)
        got = state(s)
        assert s.moves == 1 and s.replica == "r1", (s.moves, s.replica)
        assert got == want, [k for k in want if got[k] != want[k]]
        s.close()
        c.close()
    finally:
        stop(reps)


def test_neither_keeps_the_clear_error(tmp_path):
    tmp = str(tmp_path)
    reps = replicas(tmp, 2, shared_dir=False, grace=1)  # a directory each
    try:
        c = fusebox.connect([f"127.0.0.1:{r.port}" for r in reps], timeout=60)
        s = c.session(PROGRAM, seed=5)
        for t in range(3):
            s.kernels.step(t)
        s.sync()
        drain(reps[0])
        assert reps[0].proc.wait(timeout=60) == 0, reps[0].text()
        with pytest.raises(fusebox.ConnectionLostError) as e:
            s.kernels.step(3)
            s.sync()
        msg = str(e.value)
        assert "fuseboxd on replica r0 is draining" in msg, msg
        assert "its state is in checkpoint" in msg, msg
        assert "resuming it from that checkpoint on another replica failed" in msg, msg
        assert s.moves == 0
        c.close()
    finally:
        stop(reps)


def test_launch_numbers_and_counters_go_on(tmp_path):
    """After a move the launch numbers go on from where they were, and the
    counters are the session's, summed over the replicas it lived on: the
    same as those of an uninterrupted run (sync mode: a fixed number of
    tasks a launch); the kernels restored with the checkpoint are launched
    without registering them again."""
    tmp = str(tmp_path)
    reps = replicas(tmp, 2, shared_dir=None)
    try:
        c = fusebox.connect([f"127.0.0.1:{r.port}" for r in reps], timeout=60)
        ref = c.session(PROGRAM, seed=5, mode="sync")
        for t in range(STEPS):
            ref.kernels.step(t)
        want = ref.sync()
        ref.close()
        s = c.session(PROGRAM, seed=5, mode="sync")
        for t in range(6):
            s.kernels.step(t)
        first = s.sync()
        assert first.seq == 6 and first.counters.launches == 6
        calls = []
        real_call = s._call
        s._call = lambda method, *a, **k: (calls.append(method), real_call(method, *a, **k))[1]
        drain(reps[0])
        end = time.monotonic() + 10
        while s._draining is None:
            assert time.monotonic() < end, "no drain notice on the session's stream"
            time.sleep(0.05)
        for t in range(6, STEPS):
            s.kernels.step(t)
        got = s.sync()
        assert s.moves == 1 and s.replica == "r1", (s.moves, s.replica)
        assert got.seq == STEPS, got.seq  # not 8: numbered on from the first replica's
        assert got.counters.launches == STEPS
        assert got.counters.tasks_launched == want.counters.tasks_launched, (
            got.counters.tasks_launched, want.counters.tasks_launched, first.counters)
        assert got.counters.tasks_launched > first.counters.tasks_launched
        assert "RegisterKernels" not in calls, calls
        s.close()
        c.close()
    finally:
        stop(reps)
