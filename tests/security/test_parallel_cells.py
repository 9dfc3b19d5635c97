"""Two code paths a tenant's kernels reach (codegen/README.md): a sparse
struct_for's cell loop marked parallel (codegen/emit.c, "Parallel cell
loops": LLVM may vectorize its neighbour reads as gathers), and four f32
adds into a 16-byte cell under a pointer as one 16-byte compare-and-swap
(codegen/emit_mem.c, grouped atomics; pool blocks 16-aligned). Through
fuseboxd, in sync and async sessions, with indices the client wrote into
a field, shifted off the field on either side up to the ends of i32: every
cell must hold what the bounds rule says (an out-of-bounds read gives 0,
an out-of-bounds add is skipped), the launches with an index off the
field are reported out of bounds by name, and the server and another
tenant's field are unharmed."""
import struct

from conftest import RPC_TIMEOUT, Stream, i32, pb

GATHER = """layout {
  pointer(i: 8) { dense(i: 16) { place a: f32 } }
  dense(i: 128) { place out: f32, acc: f32, idx: i32 }
}
kernel fill() { for i in 0 .. 128 { if (i // 16) % 2 == 0 { a[i] = f32(i) + 0.5 } } }
kernel setidx(k: i32, d: i32) { for i in 0 .. 128 { idx[i] = i // d + k } }
kernel trace() {
  for i in a {
    out[i] = a[idx[i]] + 2.0 * a[idx[i] + 1]
    acc[i] = acc[i] * 0.5 + out[i]
  }
}
"""

SCATTER = """layout {
  pointer(i: 8) { dense(i: 4) { place m: f32, v: f32[3] } }
  dense(i: 256) { place idx: i32 }
}
kernel setidx(k: i32, d: i32) { for p in 0 .. 256 { idx[p] = p // d + k } }
kernel scatter() {
  for p in 0 .. 256 {
    let j = idx[p]
    v[j] += [1.0, 2.0, 3.0]
    m[j] += 0.5
  }
}
"""

CASES = [(0, 1), (5, 1), (-3, 1), (120, 1), (2**31 - 1, 1), (-2**31, 1), (2**31 - 64, 1),
         (200, 2), (-7, 4)]


def _wrap(x):
    return (x + 2**31) % 2**32 - 2**31


def _session(c, source, mode):
    sid = c.create(pb.CreateSessionRequest(options=pb.SessionOptions(mode=mode),
                                           source=pb.Source(text=source)),
                   timeout=RPC_TIMEOUT).session_id
    r = c.register(pb.RegisterKernelsRequest(session_id=sid, source=pb.Source(text=source)),
                   timeout=RPC_TIMEOUT)
    return sid, list(r.kernel_ids)


def _floats(c, sid, place, n):
    return list(struct.unpack("<%df" % n, c.read_field(sid, place)))


def _gather_expect(k, d):
    a = [float(i) + 0.5 if (i // 16) % 2 == 0 else 0.0 for i in range(128)]
    idx = [_wrap(i // d + k) for i in range(128)]
    active = [i for i in range(128) if (i // 16) % 2 == 0]

    def at(p):
        return a[p] if 0 <= p < 128 else 0.0

    out, acc, oob = [0.0] * 128, [0.0] * 128, False
    for i in active:
        p, q = idx[i], _wrap(idx[i] + 1)
        oob |= not 0 <= p < 128 or not 0 <= q < 128
        out[i] = struct.unpack("<f", struct.pack("<f", at(p) + 2.0 * at(q)))[0]
        acc[i] = out[i]  # 0 * 0.5 + out
    return out, acc, oob


def test_parallel_cell_loop_keeps_the_bounds_rule(server):
    """fill, setidx(k, d), trace for each case in both modes: out and acc
    exact (f32 sums of halves: no rounding), the out-of-bounds reads
    reported naming 'trace'."""
    c = server.client
    places = c.places(GATHER)
    for k, d in CASES:
        out, acc, oob = _gather_expect(k, d)
        for mode in ("sync", "async"):
            sid, (fill, setidx, trace) = _session(c, GATHER, mode)
            s = Stream(c, sid)
            try:
                s.send(launches=[pb.Launch(kernel=fill),
                                 pb.Launch(kernel=setidx, args=[i32(k), i32(d)]),
                                 pb.Launch(kernel=trace)])
                r = s.sync(1)
                got_out = _floats(c, sid, places["out"][0], 128)
                got_acc = _floats(c, sid, places["acc"][0], 128)
            finally:
                s.close()  # the session ends with its stream
            assert got_out == out, (mode, k, d)
            assert got_acc == acc, (mode, k, d)
            assert bool(r.errors) == oob, (mode, k, d, r.errors)
            for e in r.errors:
                assert "out of bounds" in e.message and "'trace'" in e.message, (mode, k, d, e)
        server.assert_unharmed()


def test_sixteen_byte_scatter_keeps_the_bounds_rule(server):
    """setidx(k, d), scatter twice for each case in both modes: every cell's
    m and v components hold exactly 2 x (particles that hit it) x their
    weight, no add lands in another cell, the off-field ones are reported
    naming 'scatter'."""
    c = server.client
    places = c.places(SCATTER)
    assert len(places["v"]) == 3, places
    for k, d in CASES:
        idx = [_wrap(p // d + k) for p in range(256)]
        hits = [0] * 32
        for j in idx:
            if 0 <= j < 32:
                hits[j] += 1
        oob = any(not 0 <= j < 32 for j in idx)
        for mode in ("sync", "async"):
            sid, (setidx, scatter) = _session(c, SCATTER, mode)
            s = Stream(c, sid)
            try:
                s.send(launches=[pb.Launch(kernel=setidx, args=[i32(k), i32(d)]),
                                 pb.Launch(kernel=scatter), pb.Launch(kernel=scatter)])
                r = s.sync(1)
                got_m = _floats(c, sid, places["m"][0], 32)
                got_v = [_floats(c, sid, places["v"][comp], 32) for comp in range(3)]
            finally:
                s.close()  # the session ends with its stream
            assert got_m == [2 * 0.5 * h for h in hits], (mode, k, d)
            for comp, w in enumerate((1.0, 2.0, 3.0)):
                assert got_v[comp] == [2 * w * h for h in hits], (mode, k, d, comp)
            assert bool(r.errors) == oob, (mode, k, d, r.errors)
            for e in r.errors:
                assert "out of bounds" in e.message and "'scatter'" in e.message, (mode, k, d, e)
        server.assert_unharmed()
