"""Shared arguments (optimizer/pass_simplify.c) run on what a client sends:
every argument of every launch a fused task holds. A kernel may have 1024
parameters and a fused task 256 parts, so one window can hand the pass
262,144 arguments; compared pairwise (as the first version did), all
distinct, that is 3.4e10 comparisons on the session's optimizer, minutes
of CPU per flush. The pass sorts them instead. Through fuseboxd: an async
session that never flushes by itself (flush_every -1) launches such a
kernel 256 times with distinct arguments but for one that every launch
passes alike; the sync must come back within the RPC timeout with the
fields of a sync session, the launches fused, and the server and the other
tenant unharmed. Measured in the Debug/ASan build: the pairwise version
ran past the 60 s RPC deadline here (the sync never came back); the
sorted one answers in about 3 s."""
import struct

import grpc

from conftest import RPC_TIMEOUT, Stream, dense_layout, expect_error, kernel, pb, stmt

N = 8
NPARAMS = 1024    # what a kernel sent as IR may have (proto/convert.c)
LAUNCHES = 256    # a fused task's most parts (max_fused_tasks)
PER_MESSAGE = 16  # about 230 KB of arguments a message, under gRPC's 4 MiB
V = 2             # the place of dense_layout(N, "v", f32)


def _acc():
    """acc(a0 .. a1023: f32) { par_for i in 0 .. N: v[i] += a0 + a1023 }"""
    body = [stmt("loop_index", pb.T_I32, args=[2], imm=0),
            stmt("load", pb.T_F32, args=[3], snode_id=V),
            stmt("arg", pb.T_F32, imm=0),
            stmt("arg", pb.T_F32, imm=NPARAMS - 1),
            stmt("add", pb.T_F32, args=[4, 5]),
            stmt("add", pb.T_F32, args=[7, 6]),
            stmt("store", args=[3, 8], snode_id=V)]
    stmts = [stmt("const", pb.T_I32, imm=0), stmt("const", pb.T_I32, imm=N),
             stmt("par_for", args=[0, 1], body=1)] + body
    return kernel("acc", stmts, params=[pb.T_F32] * NPARAMS,
                  blocks=[[0, 1, 2], list(range(3, 3 + len(body)))])


def _f32(x):
    return pb.Value(type=pb.T_F32, f_bits=struct.unpack("<Q", struct.pack("<d", x))[0])  # f64 bits


def _args(launch):
    # distinct values (exact in f32, below 2^24), the last parameter alike
    return [_f32(float(launch * NPARAMS + p)) for p in range(NPARAMS - 1)] + [_f32(1.0)]


def _run(c, mode):
    opts = pb.SessionOptions(mode=mode, flush_every=-1 if mode == "async" else 0)
    sid = c.create(pb.CreateSessionRequest(options=opts, layout=dense_layout(N, "v", pb.T_F32)),
                   timeout=RPC_TIMEOUT).session_id
    (acc,) = c.register(pb.RegisterKernelsRequest(session_id=sid, kernels=[_acc()]),
                        timeout=RPC_TIMEOUT).kernel_ids
    s = Stream(c, sid)
    try:
        for first in range(0, LAUNCHES, PER_MESSAGE):
            s.send(launches=[pb.Launch(kernel=acc, args=_args(L))
                             for L in range(first, first + PER_MESSAGE)])
        r = s.sync(1)
        return r, c.read_field(sid, V)
    finally:
        s.close()


def test_many_fused_parameters(server):
    c = server.client
    want_sync, want = _run(c, "sync")
    assert not want_sync.errors, [e.message for e in want_sync.errors]
    r, got = _run(c, "async")
    assert not r.errors, [e.message for e in r.errors]
    assert r.counters.tasks_fused >= LAUNCHES // 2, r.counters  # the launches ran fused
    assert got == want, "async fields differ from a sync session's"
    v = struct.unpack(f"<{N}f", got)
    assert v[0] > LAUNCHES, v  # every launch added its 1.0 and more
    server.assert_unharmed()


def test_source_kernel_with_too_many_parameters(server):
    """The language allows 64 scalar and 64 field parameters a kernel; a
    source over either limit is INVALID_ARGUMENT naming the kernel and the
    count (it used to drop the 65th on silently, then fail verification
    with a line per parameter), and the session goes on."""
    c = server.client
    scalars = ", ".join(f"a{p}: f32" for p in range(65))
    fields = ", ".join(f"F{p}: field" for p in range(65))
    layout = "layout { dense(i: 8) { place v: f32 } }\n"
    sid = c.create(pb.CreateSessionRequest(source=pb.Source(text=layout)),
                   timeout=RPC_TIMEOUT).session_id
    for text, words in ((f"kernel many({scalars}) {{ for i in 0 .. 8 {{ v[i] = a64 }} }}",
                         ("kernel 'many' has 65 scalar parameters; at most 64",)),
                        (f"kernel wide({fields}) {{ for i in 0 .. 8 {{ v[i] = 1.0 }} }}",
                         ("kernel 'wide' has 65 field parameters; at most 64",))):
        msg = expect_error(lambda: c.register(pb.RegisterKernelsRequest(
            session_id=sid, source=pb.Source(text=layout + text)), timeout=RPC_TIMEOUT),
            grpc.StatusCode.INVALID_ARGUMENT, *words)
        assert msg.count("\n") < 8, msg  # one diagnostic, not one per parameter
    ok = "kernel ok(b: f32) { for i in 0 .. 8 { v[i] = b } }"
    (kid,) = c.register(pb.RegisterKernelsRequest(session_id=sid, source=pb.Source(text=layout + ok)),
                        timeout=RPC_TIMEOUT).kernel_ids
    r = c.run(sid, [(kid, [_f32(2.5)])])
    assert not r.errors, [e.message for e in r.errors]
    server.assert_unharmed()
