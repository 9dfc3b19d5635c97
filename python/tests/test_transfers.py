"""Field transfers: the hand-made FieldChunk wire format against the
generated class, reads into a given array, progress bars, and the active
cells of sparse fields (ReadField with active), under both isolation
modes."""
import sys
import types

import grpc
import numpy as np
import pytest

import fusebox
from fusebox import _wire
from fusebox._proto import pb
from conftest import example

SPARSE = """
layout {
  pointer(ij: 4, 4) as blocks { bitmasked(ij: 4, 4) { place rho: f32, vel: f64[2] } }
  dense(i: 5) { place plain: i32 }
  place t: f32
}
kernel put(i: i32, j: i32, v: f32) { rho[i, j] = v }
kernel putv(i: i32, j: i32) { vel[i, j] = [f64(i), f64(j)] }
kernel drop() { for I, J in blocks { if I != J { deactivate(blocks, I, J) } } }
"""


def test_wire_matches_protobuf():
    data = bytes(range(256)) * 3
    for kw in ({"session_id": "ab" * 16, "field": 7, "total_bytes": 10**10},
               {"field": 2**31 - 1}, {}):
        raw = _wire.encode_chunk(memoryview(data), 123456789, **kw)
        m = pb.FieldChunk.FromString(raw)
        assert (m.data, m.offset) == (data, 123456789)
        assert (m.session_id, m.field, m.total_bytes) == (
            kw.get("session_id", ""), kw.get("field", 0), kw.get("total_bytes", 0))
    m = pb.FieldChunk(session_id="x" * 32, field=3, offset=2**63, total_bytes=2**64 - 1,
                      data=data)
    off, tot, got = _wire.decode_chunk(m.SerializeToString())
    assert (off, tot, bytes(got)) == (2**63, 2**64 - 1, data)
    assert _wire.decode_chunk(b"") == (0, 0, memoryview(b""))
    for bad in (b"\x2a\x05ab", b"\x18\xff", b"\x0f", b"\x18" + b"\xff" * 11):
        with pytest.raises(fusebox.Error, match="malformed FieldChunk"):
            _wire.decode_chunk(bad)


def test_to_numpy_out(fb):
    with fb.session(SPARSE) as s:
        s.fields.plain[:] = np.arange(5, dtype=np.int32) * 3
        out = np.full(5, -1, dtype=np.int32)
        assert s.fields.plain.to_numpy(out=out) is out
        assert out.tolist() == [0, 3, 6, 9, 12]
        s.kernels.putv(1, 2)
        v = np.zeros((16, 16, 2))
        assert s.fields.vel.to_numpy(out=v) is v and v[1, 2].tolist() == [1.0, 2.0]
        with pytest.raises(ValueError, match=r"field 'plain' is \(5,\) of int32; out is "
                                             r"\(5,\) of int64"):
            s.fields.plain.to_numpy(out=np.zeros(5, dtype=np.int64))
        with pytest.raises(ValueError, match="out is \\(6,\\)"):
            s.fields.plain.to_numpy(out=np.zeros(6, dtype=np.int32))
        with pytest.raises(ValueError, match="C-contiguous"):
            s.fields.plain.to_numpy(out=np.zeros(10, dtype=np.int32)[::2])
        with pytest.raises(TypeError, match="numpy.ndarray, not list"):
            s.fields.plain.to_numpy(out=[0] * 5)
        # a non-contiguous array of another dtype is converted for writing
        src = np.arange(10, dtype=np.int64)[::2]
        s.fields.plain.from_numpy(src)
        assert s.fields.plain.to_numpy().tolist() == [0, 2, 4, 6, 8]


class _FakeTqdm:
    made = []

    def __init__(self, total, unit, unit_scale, desc):
        self.total, self.desc, self.n, self.closed = total, desc, 0, False
        _FakeTqdm.made.append(self)

    def update(self, n):
        self.n += n

    def close(self):
        self.closed = True


def test_progress_bars(fb, monkeypatch):
    src = "layout { dense(ij: 1200, 1000) { place big: f32 } }\n"
    with fb.session(src) as s:
        a = np.ones((1200, 1000), dtype=np.float32)
        # without tqdm: silent, and the transfer works
        monkeypatch.setitem(sys.modules, "tqdm", None)
        s.fields.big.from_numpy(a, progress=True)
        mod = types.ModuleType("tqdm")
        mod.tqdm = _FakeTqdm
        monkeypatch.setitem(sys.modules, "tqdm", mod)
        _FakeTqdm.made.clear()
        s.fields.big.to_numpy()  # 4.8 MB: under PROGRESS_BYTES, no bar by default
        assert _FakeTqdm.made == []
        monkeypatch.setattr(fusebox.session, "PROGRESS_BYTES", 4 << 20)
        got = s.fields.big.to_numpy()  # now a large field: a bar
        s.fields.big.from_numpy(got, progress=None)
        s.fields.big.to_numpy(progress=False)
        assert [(b.total, b.n, b.closed) for b in _FakeTqdm.made] == [(a.nbytes, a.nbytes, True)] * 2
        assert _FakeTqdm.made[0].desc.startswith("read") and _FakeTqdm.made[1].desc == "write"
        assert np.array_equal(got, a)


@pytest.mark.parametrize("isolation", ["process", "thread"])
def test_sparse_active(make_server, isolation):
    d = make_server("--isolation", isolation)
    with fusebox.connect(d.address) as c, c.session(SPARSE, mode="async") as s:
        rho, vel = s.fields.rho, s.fields.vel
        idx, val = rho.active()
        assert idx.shape == (0, 2) and idx.dtype == np.int64 and val.shape == (0,)
        cells = [(0, 1, 1.5), (5, 5, 0.0), (15, 0, -2.0), (9, 14, 3.0)]
        for i, j, v in cells:
            s.kernels.put(i, j, v)
        idx, val = rho.active()
        want = sorted(cells)
        assert idx.tolist() == [[i, j] for i, j, _ in want]
        assert val.dtype == np.float32 and val.tolist() == [v for _, _, v in want]
        m = rho.active_mask()
        assert m.dtype == np.bool_ and m.shape == (16, 16) and m.sum() == 4 and m[5, 5]
        # reading activity activated nothing
        assert rho.active()[0].shape == (4, 2)
        # a vector field: values carry the element shape; it shares rho's
        # cells (one bitmasked container), so rho's cells are active in it
        s.kernels.putv(3, 7)
        vi, vv = vel.active()
        assert vi.tolist() == sorted([[i, j] for i, j, _ in cells] + [[3, 7]])
        assert vv.shape == (5, 2) and vv[vi.tolist().index([3, 7])].tolist() == [3.0, 7.0]
        assert rho.active()[0].tolist() == vi.tolist()
        # deactivate every 4x4 block off the diagonal: (0, 1) and (5, 5) stay
        s.kernels.drop()
        idx, val = rho.active()
        assert idx.tolist() == [[0, 1], [5, 5]] and val.tolist() == [1.5, 0.0]
        assert vel.active()[0].tolist() == [[0, 1], [5, 5]]
        # a dense field: every cell
        pi, pv = s.fields.plain.active()
        assert pi.tolist() == [[i] for i in range(5)] and pv.shape == (5,)
        # a whole write activates every cell
        rho[:] = 1.0
        assert rho.active_mask().all()


def test_sparse_example_active(fb):
    with fb.session(example("sparse.fbk")) as s:
        s.kernels.paint()  # rho[i, i + d] = 1 + d for d < 3 inside 128 x 128
        idx, val = s.fields.rho.active()
        i, j = idx[:, 0], idx[:, 1]
        assert len(idx) == 128 + 127 + 126 and set((j - i).tolist()) == {0, 1, 2}
        assert np.array_equal(val, 1.0 + (j - i).astype(np.float32))
        s.kernels.fill_lists()  # list i holds i % 5 items
        li, lv = s.fields.items.active()
        assert len(li) == sum(i % 5 for i in range(128))
        assert lv.tolist() == [10 * k for i in range(128) for k in range(i % 5)]


def test_active_protocol_refusals(fb):
    sid = fb._call("CreateSession", pb.CreateSessionRequest(
        source=pb.Source(text=SPARSE))).session_id

    def read(field):
        return list(fb._stub.ReadField(pb.ReadFieldRequest(session_id=sid, field=field,
                                                           active=True), timeout=30))

    for field, code in ((-1, grpc.StatusCode.NOT_FOUND), (10**6, grpc.StatusCode.NOT_FOUND),
                        (0, grpc.StatusCode.INVALID_ARGUMENT)):
        with pytest.raises(grpc.RpcError) as e:
            read(field)
        assert e.value.code() == code, e.value.details()
    with pytest.raises(grpc.RpcError) as e:
        list(fb._stub.ReadField(pb.ReadFieldRequest(session_id="0" * 32, field=1, active=True),
                                timeout=30))
    assert e.value.code() == grpc.StatusCode.NOT_FOUND
    fb._call("CloseSession", pb.CloseSessionRequest(session_id=sid))


def test_sparse_cell_writes(fb):
    with fb.session(SPARSE, mode="async") as s:
        rho, vel, plain = s.fields.rho, s.fields.vel, s.fields.plain
        rho[2, 3] = 4.5                       # one cell: only it becomes active
        rho[-1, -2] = np.float32(1.0)         # negative indices count from the end
        assert rho.active()[0].tolist() == [[2, 3], [15, 14]]
        assert rho.active()[1].tolist() == [4.5, 1.0]
        rho[0, 4:7] = [1, 2, 3]               # a slice: those three cells
        assert rho.active_mask()[0].tolist() == [False] * 4 + [True] * 3 + [False] * 9
        vel[1, 1] = [0.5, -0.5]               # a vector cell
        assert vel.to_numpy()[1, 1].tolist() == [0.5, -0.5]
        assert rho.active_mask().sum() == 6
        rho.activate((9, 9))
        rho.activate(np.array([[10, 10], [11, 11]]))
        assert rho.active_mask().sum() == 9 and rho[9, 9] == 0.0
        rho.deactivate([[2, 3], [9, 9]])
        idx, _ = rho.active()
        assert [2, 3] not in idx.tolist() and len(idx) == 7 and rho[2, 3] == 0.0
        rho.deactivate_all()
        assert rho.active()[0].shape == (0, 2)
        # a dense field takes cell writes too; deactivate is refused by the server
        plain[1] = 7
        plain[[0, 4]] = -1
        assert plain.to_numpy().tolist() == [-1, 7, 0, 0, -1]
        with pytest.raises(fusebox.ServerError,
                           match="deactivate on field 'plain': .* dense SNode") as e:
            plain.deactivate((0,))
        assert e.value.status == grpc.StatusCode.INVALID_ARGUMENT
        assert "__fbpy_" not in str(e.value) and "%" not in str(e.value)  # the user's terms
        # bad cells and values, refused before anything is sent
        with pytest.raises(IndexError, match=r"index \(16, 0\) is out of bounds of shape "
                                             r"\(16, 16\)"):
            rho.activate((16, 0))
        with pytest.raises(IndexError, match="out of bounds"):
            rho[16, 0] = 1.0
        with pytest.raises(ValueError, match="has 2 indices"):
            rho.activate((1, 2, 3))
        with pytest.raises(TypeError, match="must be integers"):
            rho.deactivate([[0.5, 1.0]])
        with pytest.raises(TypeError, match="holds i32"):
            plain[0] = 1.5
        with pytest.raises(ValueError, match="does not fit the 3 selected cells"):
            rho[0, 0:3] = [1.0, 2.0]
        with pytest.raises(ValueError, match="field 't' is 0-D"):
            s.fields.t.activate(())
        s.fields.t[()] = 2.5                  # a 0-D field: one cell, always active
        assert s.fields.t.to_numpy() == 2.5 and s.fields.t.active()[0].shape == (1, 0)
        r = s.sync()
        assert r.counters.launches > 10  # the cell writes are launches


def test_large_partial_write(fb, monkeypatch):
    monkeypatch.setattr(fusebox.session, "CELL_WRITES", 4)
    with fb.session(SPARSE) as s:
        s.fields.plain[1:] = 5               # dense, over CELL_WRITES: read, change, write
        assert s.fields.plain.to_numpy().tolist() == [0, 5, 5, 5, 5]
        s.fields.rho[3, :] = 2.0             # sparse, not all active: cell writes still
        m = s.fields.rho.active_mask()
        assert m.sum() == 16 and m[3].all()
        s.fields.vel[2, 2, 1] = 9.0          # into an element: the whole field
        assert s.fields.vel.to_numpy()[2, 2].tolist() == [0.0, 9.0]
