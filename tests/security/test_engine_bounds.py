"""Engine paths a session's client drives, with what bounds them
(docs/security.md, "Execution limits"): max_fuse_per_task, the automatic
flush's period detection on hostile streams, background compiles behind
stand-ins, and the privatized scatter's copies. Each test goes through a
running fuseboxd, checks the results, and ends with the server SERVING and
another tenant's field unchanged (server.assert_unharmed)."""
import grpc
import pytest

from conftest import RPC_TIMEOUT, Stream, dense_layout, expect_error, i32, pb, store_kernel
from test_process_isolation import register

INVALID = grpc.StatusCode.INVALID_ARGUMENT


def test_max_fuse_per_task_bounded(server):
    """max_fuse_per_task past 256 (a fused task stands for at most 256
    launches) is refused by name, 2^31-1 included; 256 itself is taken."""
    c = server.client
    for n in (257, 2**31 - 1):
        expect_error(lambda: c.new_session(dense_layout(16), mode="async", max_fuse_per_task=n),
                     INVALID, f"max_fuse_per_task {n}", "limit of 256")
    sid = c.new_session(dense_layout(16), mode="async", max_fuse_per_task=256)
    kid = register(c, sid, store_kernel(2))[0]
    r = c.run(sid, [(kid, [i32(i % 16), i32(i)]) for i in range(64)])
    assert list(r.errors) == []
    server.assert_unharmed()


def _stream(server, name, values):
    """poke(i % 16, v) for each v on an async session with the default
    flush_every (where flushes align to the stream's period), in messages
    of 512 launches; the field afterwards must hold each cell's last value.
    The SyncResult's counters."""
    c = server.client
    sid = c.new_session(dense_layout(16), mode="async")
    kid = register(c, sid, store_kernel(2))[0]
    s = Stream(c, sid)
    try:
        for at in range(0, len(values), 512):
            s.send(launches=[pb.Launch(kernel=kid, args=[i32((at + j) % 16), i32(v)])
                             for j, v in enumerate(values[at:at + 512])])
        r = s.sync(1)
        assert list(r.errors) == [], (name, r.errors)
        want = [0] * 16
        for i, v in enumerate(values):
            want[i % 16] = v
        got = c.read_field(sid, 2)
        assert got == b"".join(x.to_bytes(4, "little", signed=True) for x in want), name
        assert r.counters.launches == len(values), (name, r.counters)
        # an automatic flush waits for the period's boundary at most 255
        # launches (FB_PERIOD_MAX - 1) past a window of at most 4096 tasks
        assert r.counters.flushes >= len(values) // (4096 + 256), (name, r.counters)
        return r.counters
    finally:
        s.close()


def test_hostile_streams_for_period_detection(server):
    """The automatic flush looks for the stream's period (up to 256
    launches) when it comes due; at most 2 x 256 launch keys are compared
    for each period tried (about 98,000 compares a due flush at worst).
    Streams made to cost it most: one key repeated but for one odd key 512
    launches back (every period scans to it and fails); a 256-launch period
    broken every 700 launches (deferred flushes cut where it breaks); every
    launch new. Every launch runs and the field holds the last values."""
    n = 6000
    odd_far = [7 if i % 512 else 8 for i in range(n)]
    # the key is (kernel, cell i % 16, value): a period of 256 launches
    near = [(i % 256) if i % 700 else -1 for i in range(n)]
    fresh = list(range(n))
    for name, values in (("odd key far back", odd_far), ("broken period", near),
                         ("no repeat", fresh)):
        _stream(server, name, values)
        server.assert_unharmed()


# Stand-ins: a task of 256 or more statements whose writes' activations a
# later flush proves (demotes) compiles in the background while the task as
# inserted runs in its place; a session has at most 8 such compiles at once
# (FB_MAX_BG_COMPILES; past it an entry compiles in its batch), which
# test_async's standin_while_demoted_compiles checks with the engine's test
# hooks. Here a client makes ten such tasks at once through fuseboxd.
KERNELS = 10
TERMS = 90  # each term a load, a constant, a multiply and an add: > 256 statements


def _program():
    lines = ["layout {",
             "  pointer(i: 16) as p0 { dense(i: 8) { place a: i32 } }",
             "  pointer(i: 16) as p1 { dense(i: 8) { place b: i32 } }",
             "}",
             "kernel init() { for i in 0 .. 128 { if (i // 8) % 3 == 0 { a[i] = i } } }"]
    for k in range(KERNELS):
        expr = " + ".join(f"a[i] * {k * TERMS + t + 1}" for t in range(TERMS))
        lines.append(f"kernel big{k}() {{ for i in a {{ b[i] = b[i] + ({expr}) % 1000 }} }}")
    return "\n".join(lines) + "\n"


def _frames(server, mode):
    """init, then four frames of every big kernel, each frame synced; the
    field b and the last SyncResult's counters."""
    c = server.client
    text = _program()
    options = pb.SessionOptions(mode=mode, passes={"fusion": False})
    sid = c.create(pb.CreateSessionRequest(options=options, source=pb.Source(text=text)),
                   timeout=RPC_TIMEOUT).session_id
    ids = list(c.register(pb.RegisterKernelsRequest(session_id=sid, source=pb.Source(text=text)),
                          timeout=RPC_TIMEOUT).kernel_ids)
    assert len(ids) == KERNELS + 1
    describe = c.channel.unary_unary("/fusebox.v1.Fusebox/DescribeSource",
                                     request_serializer=pb.Source.SerializeToString,
                                     response_deserializer=pb.SourceInfo.FromString)
    b = [f.places[0] for f in describe(pb.Source(text=text), timeout=RPC_TIMEOUT).fields
         if f.name == "b"][0]
    s = Stream(c, sid)
    try:
        s.send(launches=[pb.Launch(kernel=ids[0])])
        r = s.sync(1)
        for f in range(4):
            s.send(launches=[pb.Launch(kernel=k) for k in ids[1:]])
            r = s.sync(2 + f)
            assert list(r.errors) == [], (mode, f, r.errors)
        return c.read_field(sid, b), r.counters
    finally:
        s.close()


def test_many_background_compiles(server):
    """Ten large tasks demoted on later frames of an async session: the
    results are sync mode's, and the server serves throughout."""
    want, _ = _frames(server, "sync")
    got, counters = _frames(server, "async")
    assert got == want
    assert counters.activations_demoted >= 1, counters
    server.assert_unharmed()


# The privatized scatter (codegen/priv.c, runtime/launch.c): f32 and i32
# atomic adds into a dense top-level grid become plain adds into per-thread
# copies of it, summed into the grid after the loop. A client decides the
# indices: here a fifth of them fall outside the grid on either side.
SCATTER = """layout {
  dense(ij: 64, 64) { place g: f32 }
  dense(i: 20000) { place q: i32 }
}
kernel init() { for p in q { q[p] = p } }
kernel scatter() { for p in q { g[q[p] % 80 - 8, q[p] // 80 % 64] += 1.0 } }
"""
SCATTERS = {"f32": (SCATTER, "<4096f"),
            "i32": (SCATTER.replace("place g: f32", "place g: i32").replace("+= 1.0", "+= 1"),
                    "<4096i")}


def _scatter_counts():
    """Each in-bounds cell's count after one scatter (exact in f32)."""
    want = [0] * (64 * 64)
    for p in range(20000):
        i, j = p % 80 - 8, p // 80 % 64
        if 0 <= i < 64:
            want[i * 64 + j] += 1
    return want


@pytest.mark.parametrize("kind", sorted(SCATTERS))
def test_private_scatter_out_of_bounds(server, kind):
    """Three scatters whose indices go out of the grid on both sides, in
    sync and async sessions, into an f32 grid and into an i32 one: the
    launches are reported out of bounds by name, every in-bounds cell holds
    exactly three times its count (no add lost or doubled between the
    threads' copies), and the server and the other tenant are unharmed."""
    import struct
    src, layout = SCATTERS[kind]
    c = server.client
    describe = c.channel.unary_unary("/fusebox.v1.Fusebox/DescribeSource",
                                     request_serializer=pb.Source.SerializeToString,
                                     response_deserializer=pb.SourceInfo.FromString)
    g = [f.places[0] for f in describe(pb.Source(text=src), timeout=RPC_TIMEOUT).fields
         if f.name == "g"][0]
    want = [3.0 * n for n in _scatter_counts()]
    for mode in ("sync", "async"):
        sid = c.create(pb.CreateSessionRequest(options=pb.SessionOptions(mode=mode),
                                               source=pb.Source(text=src)),
                       timeout=RPC_TIMEOUT).session_id
        ids = list(c.register(pb.RegisterKernelsRequest(session_id=sid,
                                                        source=pb.Source(text=src)),
                              timeout=RPC_TIMEOUT).kernel_ids)
        s = Stream(c, sid)
        try:
            s.send(launches=[pb.Launch(kernel=ids[0])] + [pb.Launch(kernel=ids[1])] * 3)
            r = s.sync(1)
            # sync reports each launch; async the first (seq 2) and how many
            # more its background launches had
            assert r.errors and r.errors[0].seq == 2, (mode, r.errors)
            assert len(r.errors) == 3 or "2 more errors" in r.errors[0].message, (mode, r.errors)
            for e in r.errors:
                assert "'scatter'" in e.message and "out of bounds" in e.message, (mode, e)
            got = struct.unpack(layout, c.read_field(sid, g))
            assert list(got) == want, mode
        finally:
            s.close()
        server.assert_unharmed()
