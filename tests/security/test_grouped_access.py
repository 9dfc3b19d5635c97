"""Grouped accesses on a sparse path (codegen/emit_mem.c fb_emit_try_stores
and fb_emit_try_loads): the stores (loads) of a vector field's components
at the same indices share one bounds check and one walk of the pointer
path, activating the cell once (or reading an inactive one as 0). Through
fuseboxd, in sync and async sessions: a vector field under a pointer
container, stored and loaded at indices the client wrote into a field,
shifted off the field on either side up to the ends of i32 (i // d + k
wraps) and repeated. Each component of each cell must hold what the
bounds rule says (in-bounds cells stored, every other one still 0: never
a component of another cell), the loads give the stored vector or 0, the
launches with an index off the field are reported out of bounds by name,
and the server and the victim are unharmed. (That both grouped paths run
here, in both modes, was checked once with a debug print while writing
this test.)"""
import struct

from conftest import RPC_TIMEOUT, Stream, i32, pb

SOURCE = """layout {
  pointer(i: 8) { dense(i: 4) { place q: f32[3] } }
  dense(i: 32) { place idx: i32 }
  dense(i: 32) { place out: f32[3] }
}
kernel setidx(k: i32, d: i32) { for i in 0 .. 32 { idx[i] = i // d + k } }
kernel put(v: f32) { for i in 0 .. 32 { q[idx[i]] = [v, v + 1.0, v + 2.0] } }
kernel get() { for i in 0 .. 32 { out[i] = q[idx[i]] } }
"""

CASES = [(0, 1), (16, 1), (-16, 1), (32, 1), (2**31 - 1, 1), (-2**31, 1), (2**31 - 16, 1),
         (28, 2), (-3, 4)]


def _wrap(x):
    return (x + 2**31) % 2**32 - 2**31


def _expect(k, d, v):
    """idx, q's components and out's after setidx(k, d), put(v), get()."""
    idx = [_wrap(i // d + k) for i in range(32)]
    q = [[0.0] * 32 for _ in range(3)]
    for p in idx:
        if 0 <= p < 32:
            for c in range(3):
                q[c][p] = v + c
    out = [[q[c][p] if 0 <= p < 32 else 0.0 for p in idx] for c in range(3)]
    return idx, q, out


def _places(c):
    return c.places(SOURCE)


def _run(c, places, mode, k, d, v):
    sid = c.create(pb.CreateSessionRequest(options=pb.SessionOptions(mode=mode),
                                           source=pb.Source(text=SOURCE)),
                   timeout=RPC_TIMEOUT).session_id
    ids = dict(zip(("setidx", "put", "get"),
                   c.register(pb.RegisterKernelsRequest(session_id=sid,
                                                        source=pb.Source(text=SOURCE)),
                              timeout=RPC_TIMEOUT).kernel_ids))
    s = Stream(c, sid)
    try:
        s.send(launches=[pb.Launch(kernel=ids["setidx"], args=[i32(k), i32(d)]),
                         pb.Launch(kernel=ids["put"], args=[pb.Value(type=pb.T_F32,
                                                                     f_bits=_f32_bits(v))]),
                         pb.Launch(kernel=ids["get"])])
        r = s.sync(1)
        got = {"idx": list(struct.unpack("<32i", c.read_field(sid, places["idx"][0])))}
        for n in ("q", "out"):
            got[n] = [list(struct.unpack("<32f", c.read_field(sid, p))) for p in places[n]]
        return r, got
    finally:
        s.close()


def _f32_bits(v):
    """A float argument: the bits of the double it widens to."""
    return struct.unpack("<Q", struct.pack("<d", v))[0]


def test_grouped_sparse_access_keeps_the_bounds_rule(server):
    """setidx, put, get for each case in both modes: idx, every component
    of q (8 pointer cells of 4) and out exact."""
    c = server.client
    places = _places(c)
    assert len(places["q"]) == 3 and len(places["out"]) == 3, places
    v = 100.0
    for k, d in CASES:
        idx, q, out = _expect(k, d, v)
        oob = any(not 0 <= p < 32 for p in idx)
        for mode in ("sync", "async"):
            r, got = _run(c, places, mode, k, d, v)
            assert got == {"idx": idx, "q": q, "out": out}, (mode, k, d, got)
            assert bool(r.errors) == oob, (mode, k, d, r.errors)
            for e in r.errors:
                assert "out of bounds" in e.message, (mode, k, d, e)
                assert "'put'" in e.message or "'get'" in e.message, (mode, k, d, e)
        server.assert_unharmed()
