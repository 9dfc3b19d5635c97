"""The privatized scatter's copies are the CPU device's scratch
(codegen/priv.c, runtime/launch.c; docs/security.md, "Execution limits"):
under --isolation thread every session's launches run on one device, which
keeps one set of copies for reuse and lets a launch that finds them busy
take its own (all such own copies together bounded). Whatever one tenant's
scatter leaves in them must never reach another tenant's grid: after each
launch the copies are summed into the launching session's root and reset.
These tests drive that through fuseboxd with two tenants, one after the
other and at the same time, with indices off the grid, and check every
cell of every grid, the field between the two privatized grids (inside the
copies' span, never summed), the server's health and the victim field."""
import struct
import threading

from conftest import RPC_TIMEOUT, Stream, pb

# g and h only receive f32 adds: both are privatized, with q (read by the
# loop) between them inside the copies' span. i = p % 80 - 8 falls off g
# on both sides for a fifth of the particles.
SOURCE = """layout {
  dense(ij: 64, 64) { place g: f32 }
  dense(i: 20000) { place q: i32 }
  dense(i: 1000) { place h: f32 }
}
kernel init() { for p in q { q[p] = p } }
kernel small() { for p in q { g[q[p] % 80 - 8, q[p] // 80 % 64] += 1.0
                              h[q[p] % 1000] += 1.0 } }
kernel big() { for p in q { g[q[p] % 80 - 8, q[p] // 80 % 64] += 1024.0
                            h[q[p] % 1000] += 1024.0 } }
"""


def _counts():
    """Each in-bounds cell's hits in one launch (g and h; exact in f32)."""
    g, h = [0] * (64 * 64), [0] * 1000
    for p in range(20000):
        i, j = p % 80 - 8, p // 80 % 64
        if 0 <= i < 64:
            g[i * 64 + j] += 1
        h[p % 1000] += 1
    return g, h


def _places(c):
    return {k: v[0] for k, v in c.places(SOURCE).items()}


def _session(c, mode):
    sid = c.create(pb.CreateSessionRequest(options=pb.SessionOptions(mode=mode),
                                           source=pb.Source(text=SOURCE)),
                   timeout=RPC_TIMEOUT).session_id
    ids = list(c.register(pb.RegisterKernelsRequest(session_id=sid, source=pb.Source(text=SOURCE)),
                          timeout=RPC_TIMEOUT).kernel_ids)
    return sid, dict(zip(("init", "small", "big"), ids))


def _scatter(c, places, mode, kernel, times, weight, out, key, start=None):
    """A session that runs init, then `kernel` `times` times (once the
    sessions sharing `start`, a barrier, are all registered); every launch
    but init is reported out of bounds by name; g and h must hold exactly
    times * weight * hits per cell and q its init values. out[key]: None
    when all held, else what did not."""
    try:
        sid, ids = _session(c, mode)
        if start:
            start.wait()
        s = Stream(c, sid)
        try:
            s.send(launches=[pb.Launch(kernel=ids["init"])] +
                   [pb.Launch(kernel=ids[kernel])] * times)
            r = s.sync(1)
            assert r.errors and r.errors[0].seq == 2, (mode, kernel, r.errors)
            for e in r.errors:
                assert f"'{kernel}'" in e.message and "out of bounds" in e.message, (mode, e)
            g, h = _counts()
            got = struct.unpack("<4096f", c.read_field(sid, places["g"]))
            assert list(got) == [times * weight * n for n in g], (mode, kernel, "g")
            got = struct.unpack("<1000f", c.read_field(sid, places["h"]))
            assert list(got) == [times * weight * n for n in h], (mode, kernel, "h")
            got = struct.unpack("<20000i", c.read_field(sid, places["q"]))
            assert list(got) == list(range(20000)), (mode, kernel, "q")
        finally:
            s.close()
        out[key] = None
    except Exception as e:  # reported by the test's thread
        out[key] = e


def test_copies_carry_nothing_between_tenants(make_server):
    """One tenant's scatters of 1024.0 per hit, then another's of 1.0, in
    sync and async sessions: each grid holds its own sums exactly (nothing
    of the other tenant's adds), the field between the grids is untouched,
    and the server and the victim are unharmed."""
    server = make_server("--isolation", "thread")
    c = server.client
    places = _places(c)
    for mode in ("sync", "async"):
        out = {}
        _scatter(c, places, mode, "big", 3, 1024.0, out, "a")
        _scatter(c, places, mode, "small", 2, 1.0, out, "b")
        assert out == {"a": None, "b": None}, out
        server.assert_unharmed()


def test_concurrent_tenants_keep_their_sums(make_server):
    """Four sessions scatter at the same time, 140 launches in all (while
    one holds the device's copies, the others take their own: on the
    2-core test machine, from 1 to 35 launches of the 140 did in a run):
    every session's grids hold exactly its own sums, whichever copies its
    threads used."""
    server = make_server("--isolation", "thread")
    c = server.client
    places = _places(c)
    out = {}
    jobs = [("async", "big", 40, 1024.0), ("sync", "small", 30, 1.0),
            ("async", "small", 50, 1.0), ("sync", "big", 20, 1024.0)]
    start = threading.Barrier(len(jobs), timeout=RPC_TIMEOUT)
    threads = [threading.Thread(target=_scatter, args=(c, places, *job, out, n, start))
               for n, job in enumerate(jobs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=4 * RPC_TIMEOUT)
        assert not t.is_alive(), "a scatter did not finish"
    assert out == {n: None for n in range(len(jobs))}, out
    server.assert_unharmed()
