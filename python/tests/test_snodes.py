"""Named SNodes from the host (``s.snodes.NAME``): shape, kind, activity,
activate / deactivate / deactivate_all, as Taichi's ``block.deactivate_all()``
and ``ti.is_active(block, I)``; errors in the user's terms; and no warning in
a private daemon's log."""
import re

import numpy as np
import pytest

import fusebox

# a pointer grid of 4x4 blocks of bitmasked 2x2 cells, a dense field beside
# it (Taichi's three-level sparse examples, shrunk)
SRC = """
layout {
  pointer(ij: 4, 4) as blocks {
    bitmasked(ij: 2, 2) as cells { place x: f32 }
  }
  dense(i: 8) as row { place d: f32 }
  place total: f32
}
kernel paint() {
  for k in 0 .. 64 {
    let i = k // 8
    let j = k % 8
    if i < 4 and (i + j) % 3 == 0 { x[i, j] = 1.0 }
  }
}
kernel blocks_seen() { for i, j in blocks { total[] += 1.0 } }
"""

NO_INTERNALS = re.compile(r"__fb|%[0-9]")


def painted():
    i, j = np.meshgrid(np.arange(8), np.arange(8), indexing="ij")
    return (i < 4) & ((i + j) % 3 == 0)  # blocks (0..1, *) active, (2..3, *) not


def test_snodes_described(fb):
    with fb.session(SRC) as s:
        assert sorted(s.snodes) == ["blocks", "cells", "row"]
        b = s.snodes.blocks
        assert (b.kind, b.shape, b.ndim) == ("pointer", (4, 4), 2)
        assert s.snodes.cells.shape == (8, 8) and s.snodes.cells.kind == "bitmasked"
        assert s.snodes.row.shape == (8,) and s.snodes.row.fields == ["d"]
        assert b.fields == ["x"]
        assert s.fields.x.info.container == "bitmasked"
        assert s.fields.d.info.container == "dense"
        assert s.fields.total.info.container == "root"
        with pytest.raises(fusebox.NotFoundError, match="no SNode 'block' .*blocks"):
            s.snodes.block


def test_active_mask_and_deactivate_all(fb):
    with fb.session(SRC) as s:
        b, c = s.snodes.blocks, s.snodes.cells
        assert not b.active_mask().any() and b.active_mask().shape == (4, 4)
        s.kernels.paint()
        want_cells = painted()
        want_blocks = want_cells.reshape(4, 2, 4, 2).any(axis=(1, 3))
        np.testing.assert_array_equal(c.active_mask(), want_cells)
        np.testing.assert_array_equal(b.active_mask(), want_blocks)
        assert want_blocks[:2].all() and not want_blocks[2:].any()
        assert b.is_active(0, 0) and b.is_active((1, 3)) and b.is_active([0, 2])
        assert not b.is_active(2, 0) and not b.is_active(3, 3)
        assert c.is_active(0, 3) and not c.is_active(0, 1) and not c.is_active(7, 5)
        np.testing.assert_array_equal(b.active(), np.argwhere(want_blocks))
        # a struct-for over blocks visits exactly the active blocks
        s.kernels.blocks_seen()
        assert s.fields.total.to_numpy() == want_blocks.sum()

        b.deactivate((0, 0))  # the block and the cells below it
        want_blocks[0, 0] = False
        want_cells[0:2, 0:2] = False
        np.testing.assert_array_equal(b.active_mask(), want_blocks)
        np.testing.assert_array_equal(c.active_mask(), want_cells)
        np.testing.assert_array_equal(s.fields.x.to_numpy(), want_cells.astype(np.float32))

        c.deactivate_all()  # every cell; the blocks stay allocated and active
        assert not c.active_mask().any()
        np.testing.assert_array_equal(b.active_mask(), want_blocks)
        b.deactivate_all()
        assert not b.active_mask().any()
        assert not s.fields.x.to_numpy().any()
        s.fields.total.fill(0)
        s.kernels.blocks_seen()
        assert s.fields.total.to_numpy() == 0

        b.activate([[3, 3], [1, 2]])  # activates the blocks, not the cells under them
        want = np.zeros((4, 4), bool)
        want[3, 3] = want[1, 2] = True
        np.testing.assert_array_equal(b.active_mask(), want)
        assert not c.active_mask().any()


def test_mask_many_words(fb):
    src = """
layout { bitmasked(ij: 20, 9) as m { place v: i32 } }
kernel on(k: i32) { for c in 0 .. 180 { if c % k == 0 { v[c // 9, c % 9] = 1 } } }
"""
    with fb.session(src, mode="async") as s:
        s.kernels.on(7)
        want = (np.arange(180) % 7 == 0).reshape(20, 9)
        np.testing.assert_array_equal(s.snodes.m.active_mask(), want)
        np.testing.assert_array_equal(s.fields.v.active_mask(), want)
        s.snodes.m.deactivate([[0, 0], [19, 8]])
        want[0, 0] = want[19, 8] = False
        np.testing.assert_array_equal(s.snodes.m.active_mask(), want)


def test_dense_snode_refused_in_user_terms(fb):
    with fb.session(SRC) as s:
        for call in (lambda: s.snodes.row.deactivate_all(),
                     lambda: s.snodes.row.deactivate((1,))):
            with pytest.raises(ValueError, match="SNode 'row' is dense: its cells are always "
                                                 "active") as e:
                call()
            assert not NO_INTERNALS.search(str(e.value))
        assert s.snodes.row.active_mask().all()  # dense: every cell is active
        with pytest.raises(IndexError, match="SNode 'blocks': index \\(4, 0\\) is out of bounds"):
            s.snodes.blocks.activate((4, 0))
        with pytest.raises(ValueError, match="SNode 'blocks' has 2 indices"):
            s.snodes.blocks.activate((1, 2, 3))
        s.kernels.paint()  # the session goes on
        assert s.snodes.blocks.active_mask().any()


def test_dense_field_deactivate_in_user_terms(fb):
    with fb.session(SRC) as s:
        with pytest.raises(fusebox.ServerError) as e:
            s.fields.d.deactivate((1,))
        msg = str(e.value)
        assert "field 'd'" in msg and "dense" in msg and "always active" in msg, msg
        assert not NO_INTERNALS.search(msg), msg


def test_private_daemon_log_is_quiet(fuseboxd):
    """fusebox.connect() starts its fuseboxd with --private: even sharing
    its process (--isolation thread) as root, nothing is logged as a
    warning about tenants; the log says what it is as an info line."""
    import os
    c = fusebox.connect(server_args=["--isolation", "thread"])
    d = c._daemon
    try:
        with c.session(SRC) as s:
            s.kernels.paint()
            assert s.snodes.blocks.active_mask()[:2].all()
        d.log.flush()
        d.log.seek(0)
        log = d.log.read().decode(errors="replace")
    finally:
        c.close()
    assert d.proc.returncode == 0, log
    assert " WARN " not in log, log
    if os.geteuid() == 0:
        assert "isolation thread as root: a private daemon" in log, log


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_helper_launch_failure_in_user_terms(fb, mode):
    """A launch of a kernel the package added that fails on the server (here:
    the session's memory limit, allocating pointer blocks) is reported as
    what the user did, not as the added kernel."""
    src = """layout { pointer(i: 256) as blocks { dense(i: 4096) { place x: f32 } } }
kernel one() { x[0] = 2.0 }
"""
    for what, act in (("set of field 'x'",
                       lambda s: [s.fields.x.__setitem__(b * 4096, 1.0) for b in range(100)]),
                      ("activate on SNode 'blocks'",
                       lambda s: s.snodes.blocks.activate(np.arange(100)[:, None]))):
        with fb.session(src, mode=mode, memory_limit=1 << 20) as s:
            act(s)
            with pytest.raises(fusebox.LaunchError) as e:
                s.sync()
            msg = str(e.value)
            assert f"({what}) failed: out of device memory allocating a block of SNode " \
                   "'blocks'" in msg, msg
            assert e.value.errors[0].kernel == what
            assert not NO_INTERNALS.search(msg), msg
            assert not any(NO_INTERNALS.search(f.message) for f in e.value.errors)
            s.kernels.one()  # the session goes on
            s.sync()
