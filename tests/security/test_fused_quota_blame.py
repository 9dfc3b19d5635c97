"""Out-of-memory blame in fused tasks through fuseboxd (docs/optimizer.md,
"Blame in fused tasks"): an async session fuses two launches over the same
range; the first takes no memory, the SECOND activates a block of a pointer
field per iteration, far past the session's memory_limit. The error must
name that launch (seq and kernel) with sync mode's message (the generated
code latches the part whose block did not fit), never the first part with
a hedge. Afterwards the session keeps working, another tenant's field is
unchanged and the server is SERVING."""
import struct

from conftest import RPC_TIMEOUT, Stream, i32, pb

N = 64
LIMIT = 64 << 10  # room for a few 4 KiB blocks; hog wants 64 of them
PROGRAM = f"""layout {{
  dense(i: {N}) {{ place a: i32 }}
  pointer(i: {N}) as blk {{ dense(i: 1024) {{ place f: f32 }} }}
}}
kernel mark(k: i32) {{ for i in a {{ a[i] = i + k }} }}
kernel hog(k: i32) {{ for i in a {{ f[i * 1024] = 1.0 * k }} }}
"""


def _places(c):
    return {k: v[0] for k, v in c.places(PROGRAM).items()}


def _run(server, mode):
    """mark(1) then hog(2), synced; then mark(5), synced. The first sync's
    errors and counters, the second's errors, and field a."""
    c = server.client
    places = _places(c)
    sid = c.create(pb.CreateSessionRequest(options=pb.SessionOptions(mode=mode, memory_limit=LIMIT),
                                           source=pb.Source(text=PROGRAM)),
                   timeout=RPC_TIMEOUT).session_id
    ids = list(c.register(pb.RegisterKernelsRequest(session_id=sid, source=pb.Source(text=PROGRAM)),
                          timeout=RPC_TIMEOUT).kernel_ids)
    mark, hog = ids
    s = Stream(c, sid)
    try:
        s.send(launches=[pb.Launch(kernel=mark, args=[i32(1)]),
                         pb.Launch(kernel=hog, args=[i32(2)])])
        first = s.sync(1)
        s.send(launches=[pb.Launch(kernel=mark, args=[i32(5)])])
        second = s.sync(2)
        a = struct.unpack(f"<{N}i", c.read_field(sid, places["a"]))
        return first, second, a
    finally:
        s.close()


def test_fused_pair_blames_the_launch_out_of_memory(server):
    sync1, sync2, sync_a = _run(server, "sync")
    server.assert_unharmed()
    async1, async2, a = _run(server, "async")
    assert async1.counters.tasks_fused >= 1, async1.counters  # the pair ran as one task
    assert [e.seq for e in sync1.errors] == [2], sync1.errors
    assert "out of device memory" in sync1.errors[0].message, sync1.errors
    assert len(async1.errors) == 1, async1.errors
    err = async1.errors[0]
    # the second launch (seq 2) of kernel 'hog', as sync mode names it
    assert err.seq == 2, err
    assert "kernel 'hog'" in err.message and "SNode 'blk'" in err.message, err
    assert f"limit {LIMIT} bytes" in err.message, err
    assert "'mark'" not in err.message and "fused with it" not in err.message, err
    assert err.message.replace(" (launch 1)", "") == sync1.errors[0].message, \
        (err.message, sync1.errors[0].message)
    # the session keeps working, with sync mode's results
    assert list(async2.errors) == [] and list(sync2.errors) == [], (async2.errors, sync2.errors)
    assert a == sync_a == tuple(i + 5 for i in range(N))
    server.assert_unharmed()
