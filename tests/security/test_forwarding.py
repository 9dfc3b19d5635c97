"""The simplifier's store-to-load forwarding under client-chosen indices
(optimizer/pass_simplify.c): a load of the element a store wrote takes the
stored value without reading memory, and from a store not provably in
bounds it takes select(in bounds, value, 0), which is what the load gives
either way (an out-of-bounds store is skipped, an out-of-bounds load gives
0). Through fuseboxd: a store kernel and a load kernel at indices the
client wrote into a field (assume_unique), which an async session fuses
into one task where the load is forwarded from the store with that guard
(checked once with a debug print while writing this test), and a sync
session, where nothing is fused or forwarded, as the reference. The
indices put part or all of the loop off the field, the two ends of i32
among them (i // d + k wraps), and some repeat (a uniqueness the client
promises falsely). Every field must hold what the bounds rule says, the
same in both modes, each launch with an index off the field be reported
out of bounds by name, and the server and the victim be unharmed."""
import struct

from conftest import RPC_TIMEOUT, Stream, i32, pb

SOURCE = """layout {
  dense(i: 16) { place a: i32, b: i32 }
  dense(i: 16) { place ord: i32, c: i32 }
}
kernel perm(k: i32, d: i32) { for i in 0 .. 16 { ord[i] = i // d + k } }
kernel st(v: i32) { for i in 0 .. 16 { let p = assume_unique(ord[i], covers: a)
                                       a[p] = v } }
kernel ld() { for i in 0 .. 16 { let p = assume_unique(ord[i], covers: a)
                                 c[i] = a[p] * 2 } }
"""

# ord[i] = i // d + k: d = 1 a permutation shifted by k, d = 4 repeated
# values (a uniqueness the client promises falsely)
CASES = [(8, 1), (-8, 1), (16, 1), (-16, 1), (2**31 - 1, 1), (-2**31, 1), (2**31 - 8, 1),
         (14, 4), (-2, 4)]


def _wrap(x):
    return (x + 2**31) % 2**32 - 2**31


def _expect(k, d, v):
    """ord, a and c after perm(k, d), st(v), ld() from zeros."""
    ordv = [_wrap(i // d + k) for i in range(16)]
    a = [0] * 16
    for p in ordv:
        if 0 <= p < 16:
            a[p] = v
    c = [(a[p] if 0 <= p < 16 else 0) * 2 for p in ordv]
    return ordv, a, c


def _places(c):
    return {k: v[0] for k, v in c.places(SOURCE).items()}


def _run(c, places, mode, k, d, v):
    sid = c.create(pb.CreateSessionRequest(options=pb.SessionOptions(mode=mode),
                                           source=pb.Source(text=SOURCE)),
                   timeout=RPC_TIMEOUT).session_id
    ids = dict(zip(("perm", "st", "ld"),
                   c.register(pb.RegisterKernelsRequest(session_id=sid,
                                                        source=pb.Source(text=SOURCE)),
                              timeout=RPC_TIMEOUT).kernel_ids))
    s = Stream(c, sid)
    try:
        s.send(launches=[pb.Launch(kernel=ids["perm"], args=[i32(k), i32(d)]),
                         pb.Launch(kernel=ids["st"], args=[i32(v)]),
                         pb.Launch(kernel=ids["ld"])])
        r = s.sync(1)
        got = {n: list(struct.unpack("<16i", c.read_field(sid, places[n])))
               for n in ("ord", "a", "c")}
        return r, got
    finally:
        s.close()


def test_forwarding_keeps_the_bounds_rule(server):
    """perm, st, ld for each case in both modes: ord, a and c exact."""
    c = server.client
    places = _places(c)
    v = 1000
    for k, d in CASES:
        ordv, a, cc = _expect(k, d, v)
        oob = any(not 0 <= p < 16 for p in ordv)
        for mode in ("sync", "async"):
            r, got = _run(c, places, mode, k, d, v)
            assert got == {"ord": ordv, "a": a, "c": cc}, (mode, k, d, got)
            assert bool(r.errors) == oob, (mode, k, d, r.errors)
            for e in r.errors:
                assert "out of bounds" in e.message, (mode, k, d, e)
                assert "'st'" in e.message or "'ld'" in e.message, (mode, k, d, e)
        server.assert_unharmed()
