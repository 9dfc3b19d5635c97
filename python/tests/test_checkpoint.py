"""Checkpoint and restore through a real fuseboxd (docs/python.md
"Checkpoints"): a restored session continues bit for bit as the original
does (dense and sparse fields, random numbers, sync and async, both
isolation modes), from a file on the client's side and from one the server
keeps; and a session survives `kill -9` of its server through the
checkpoints the server wrote by itself (--checkpoint-every-s)."""
import os
import signal
import time

import numpy as np
import pytest

import fusebox

# a pointer grid of bitmasked blocks and per-row dynamic lists (sparse
# structure and activity), a dense field moved by random numbers (the
# random state), and the number of steps done (what a resumed run reads)
PROGRAM = """
layout {
  pointer(ij: 8, 8) as blocks {
    bitmasked(ij: 4, 4) { place rho: f32 }
  }
  dense(i: 32) {
    dynamic(j: 256, chunk: 16) { place items: i32 }
  }
  field x: f32 (i: 1000)
  place total: i32, listed: i32, steps: i32
}

kernel step(t: i32) {
  for i in x {
    x[i] = x[i] * 0.99 + random()
  }
  for d in 0 .. 4 {
    let i = (t * 7 + d * 3) % 32
    let j = (t * 5 + d) % 32
    rho[i, j] = rho[i, j] + f32(t) + random()
    append(items, i, t * 10 + d)
  }
  if t % 6 == 5 { deactivate(blocks, t % 8, (t * 3) % 8) }
  total[] = 0
  listed[] = 0
  for i, j in rho { total[] += i32(rho[i, j] * 256.0) }  # (integer sums: any order)
  for i, n in items { listed[] += items[i, n] }
  steps[] += 1
}
"""

FIELDS = ("x", "rho", "items", "total", "listed", "steps")


def state(s):
    """Every field's bytes and the sparse SNodes' activity."""
    out = {f: getattr(s.fields, f).to_numpy().tobytes() for f in FIELDS}
    out["rho_active"] = s.fields.rho.active_mask().tobytes()
    out["blocks_active"] = s.snodes.blocks.active_mask().tobytes()
    return out


def ckpt_args(tmp_path, every=None):
    key = os.path.join(tmp_path, "key")
    args = ["--checkpoint-key", key, "--checkpoint-dir", os.path.join(tmp_path, "ckpt")]
    if not os.path.exists(key):
        args.append("--checkpoint-key-create")
    if every is not None:
        args += ["--checkpoint-every-s", str(every)]
    return args


@pytest.mark.parametrize("isolation,mode", [("process", "sync"), ("process", "async"),
                                            ("thread", "sync"), ("thread", "async")])
def test_restore_continues_bit_for_bit(make_server, tmp_path, isolation, mode):
    d = make_server("--isolation", isolation, *ckpt_args(tmp_path))
    c = fusebox.connect(d.address)
    try:
        a = c.session(PROGRAM, mode=mode, seed=7)
        for t in range(8):
            a.kernels.step(t)
        path = str(tmp_path / "a.fbck")
        assert a.checkpoint(path) == path
        name = a.checkpoint(on_server=True)
        assert [k["name"] for k in c.checkpoints()] == [name]
        for t in range(8, 16):
            a.kernels.step(t)
        want = state(a)
        assert np.frombuffer(want["steps"], np.int32)[0] == 16
        for how in ("file", "name"):
            b = c.restore(path) if how == "file" else c.restore(name=name)
            assert b.mode == mode and b.id != a.id
            assert np.frombuffer(b.fields.steps.to_numpy().tobytes(), np.int32)[0] == 8
            for t in range(8, 16):
                b.kernels.step(t)
            got = state(b)
            for k in want:
                assert got[k] == want[k], f"{how}: {k} differs after the restore"
            b.close()
        # the original went on untouched by its checkpoints
        a.kernels.step(16)
        assert np.frombuffer(a.fields.steps.to_numpy().tobytes(), np.int32)[0] == 17
    finally:
        c.close()


def test_fetch_and_restore_elsewhere(make_server, tmp_path):
    """A checkpoint the server keeps, fetched to a file, restores on another
    server with the same key; without the key it is refused clearly."""
    d = make_server(*ckpt_args(tmp_path))
    c = fusebox.connect(d.address)
    try:
        a = c.session(PROGRAM, seed=3)
        for t in range(5):
            a.kernels.step(t)
        name = a.checkpoint(on_server=True)
        path = c.fetch_checkpoint(name, str(tmp_path / "fetched.fbck"))
        want = state(a)
    finally:
        c.close()
    other = tmp_path / "other"
    other.mkdir()
    os.link(tmp_path / "key", other / "key")  # the same key, another directory
    d2 = make_server(*ckpt_args(str(other)))
    c2 = fusebox.connect(d2.address)
    try:
        b = c2.restore(path)
        assert state(b) == want
    finally:
        c2.close()
    third = tmp_path / "third"
    third.mkdir()
    d3 = make_server(*ckpt_args(str(third)))  # a key of its own
    c3 = fusebox.connect(d3.address)
    try:
        with pytest.raises(fusebox.Error, match="modified or was written with another server key"):
            c3.restore(path)
        with pytest.raises(fusebox.Error, match="not a checkpoint name this server gave"):
            c3.restore(name="../" + name)
    finally:
        c3.close()


def test_crash_survival(make_server, tmp_path):
    """fuseboxd checkpoints the live session by itself; kill -9; a new
    fuseboxd on the same directory and key; the client restores the last
    checkpoint and finishes with results identical to an uninterrupted run,
    losing only the steps after that checkpoint."""
    total = 24
    d1 = make_server(*ckpt_args(tmp_path, every=0.5))
    c1 = fusebox.connect(d1.address)
    s = c1.session(PROGRAM, seed=11)
    for t in range(6):
        s.kernels.step(t)
    first = s.checkpoint(on_server=True)  # hands the server the client's state
    for t in range(6, 14):
        s.kernels.step(t)
    s.sync()
    # Wait for periodic checkpoints written after the sync. One queued in the
    # moment between the client's checkpoint and the steps holds only 6 steps;
    # it runs before the steps, so it is already listed here. Two new ones,
    # queued a period apart, leave no doubt on a loaded machine.
    before = {k["name"] for k in c1.checkpoints()}
    deadline = time.monotonic() + 60
    while True:
        names = [k["name"] for k in c1.checkpoints()]
        if len([n for n in names if n not in before]) >= 2:
            break
        assert time.monotonic() < deadline, f"no periodic checkpoint: {names}"
        time.sleep(0.2)
    os.kill(d1.proc.pid, signal.SIGKILL)
    d1.proc.wait(timeout=30)
    try:
        c1.close()
    except fusebox.Error:
        pass  # its server is gone

    d2 = make_server(*ckpt_args(tmp_path))
    c2 = fusebox.connect(d2.address)
    try:
        names = [k["name"] for k in c2.checkpoints()]
        assert names and names[0] != first, names
        r = c2.restore(name=names[0])
        done = int(np.frombuffer(r.fields.steps.to_numpy().tobytes(), np.int32)[0])
        assert 6 < done <= 14, done  # a periodic one, at most the work before the kill
        for t in range(done, total):
            r.kernels.step(t)
        got = state(r)
        ref = c2.session(PROGRAM, seed=11)
        for t in range(total):
            ref.kernels.step(t)
        want = state(ref)
        for k in want:
            assert got[k] == want[k], f"{k} differs from the uninterrupted run"
    finally:
        c2.close()


def test_drain_checkpoints_live_sessions(make_server, tmp_path):
    """SIGTERM with --drain-grace-s: once the grace is over each live
    session is checkpointed into --checkpoint-dir and its client told the
    checkpoint's name; a new server on the same directory and key restores
    it and the run ends as an uninterrupted one does."""
    import re
    d1 = make_server("--drain-grace-s", "1", *ckpt_args(tmp_path))
    c1 = fusebox.connect(d1.address)
    s = c1.session(PROGRAM, seed=5)
    for t in range(4):
        s.kernels.step(t)
    first = s.checkpoint(on_server=True)  # the client's state for the server's own checkpoints
    for t in range(4, 9):
        s.kernels.step(t)
    s.sync()
    os.kill(d1.proc.pid, signal.SIGTERM)
    with pytest.raises(fusebox.Error) as ei:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # the session lives through the grace
            s.sync()
            time.sleep(0.1)
    assert d1.proc.wait(timeout=60) == 0
    # the server's word to the session (its stream's status, and its log)
    d1.log.flush()
    d1.log.seek(0)
    log = d1.log.read().decode(errors="replace")
    m = re.search(r"ended by the drain of replica \S+; its state is in checkpoint "
                  r"([0-9a-f]{8}-[0-9]+\.fbck)", log)
    assert m, log[-3000:]
    assert m.group(1) != first
    # and the client was told (UNAVAILABLE, whichever call met the end)
    msg = str(ei.value)
    assert "draining" in msg and f"its state is in checkpoint {m.group(1)}" in msg, msg
    try:
        c1.close()
    except fusebox.Error:
        pass
    d2 = make_server(*ckpt_args(tmp_path))
    c2 = fusebox.connect(d2.address)
    try:
        r = c2.restore(name=m.group(1))
        assert int(np.frombuffer(r.fields.steps.to_numpy().tobytes(), np.int32)[0]) == 9
        for t in range(9, 14):
            r.kernels.step(t)
        ref = c2.session(PROGRAM, seed=5)
        for t in range(14):
            ref.kernels.step(t)
        assert state(r) == state(ref)
    finally:
        c2.close()
