"""Blame in fused tasks through fuseboxd (docs/optimizer.md, "Blame"): an
async session fuses two launches whose accesses are not provably in bounds
(the offset is an argument), and only the SECOND goes out of bounds. The
error must name that launch and kernel, exactly as a sync session does (the
generated code latches the failing access's fused part with the error),
never the first part with a hedge. Afterwards the session keeps working,
another tenant's field is unchanged and the server is SERVING."""
import struct

from conftest import RPC_TIMEOUT, Stream, i32, pb

N = 64
PROGRAM = f"""layout {{ dense(i: {N}) {{ place a: i32, b: i32, c: i32 }} }}
kernel fill(k: i32) {{ for i in a {{ b[i + k] = i + 1 }} }}
kernel spill(k: i32) {{ for i in a {{ c[i + k] = i + 2 }} }}
"""


def _places(c):
    return {k: v[0] for k, v in c.places(PROGRAM).items()}


def _run(server, mode):
    """fill(0) then spill(1) (its last iteration writes c[64]: out of
    bounds), synced; then fill(0) again, synced. The first sync's errors
    and counters, the second's errors, and fields b and c."""
    c = server.client
    places = _places(c)
    sid = c.create(pb.CreateSessionRequest(options=pb.SessionOptions(mode=mode),
                                           source=pb.Source(text=PROGRAM)),
                   timeout=RPC_TIMEOUT).session_id
    ids = list(c.register(pb.RegisterKernelsRequest(session_id=sid, source=pb.Source(text=PROGRAM)),
                          timeout=RPC_TIMEOUT).kernel_ids)
    fill, spill = ids
    s = Stream(c, sid)
    try:
        s.send(launches=[pb.Launch(kernel=fill, args=[i32(0)]),
                         pb.Launch(kernel=spill, args=[i32(1)])])
        first = s.sync(1)
        s.send(launches=[pb.Launch(kernel=fill, args=[i32(0)])])
        second = s.sync(2)
        b = struct.unpack(f"<{N}i", c.read_field(sid, places["b"]))
        cc = struct.unpack(f"<{N}i", c.read_field(sid, places["c"]))
        return first, second, b, cc
    finally:
        s.close()


def test_fused_pair_blames_the_second_launch(server):
    sync1, sync2, sync_b, sync_c = _run(server, "sync")
    server.assert_unharmed()
    async1, async2, b, cc = _run(server, "async")
    assert async1.counters.tasks_fused >= 1, async1.counters  # the pair ran as one task
    assert [e.seq for e in sync1.errors] == [2], sync1.errors
    assert len(async1.errors) == 1, async1.errors
    err = async1.errors[0]
    # the second launch (seq 2) of kernel 'spill', as sync mode names it
    assert err.seq == 2, err
    assert "kernel 'spill'" in err.message and "out of bounds" in err.message, err
    assert "'fill'" not in err.message and "fused with it" not in err.message, err
    assert err.message.replace(" (launch 1)", "") == sync1.errors[0].message, \
        (err.message, sync1.errors[0].message)
    # the session keeps working, with sync mode's results
    assert list(async2.errors) == [] and list(sync2.errors) == [], (async2.errors, sync2.errors)
    assert b == sync_b == tuple(i + 1 for i in range(N))
    assert cc == sync_c == (0,) + tuple(j + 1 for j in range(1, N))
    server.assert_unharmed()
