"""Blame between twins through fuseboxd: two kernels with the same body
lower to equal task IR, which an async session's IR bank (and its code
cache) keeps once, under the first kernel's task name. A launch of the
second kernel that goes out of bounds must be named by its own kernel,
launch and loop ("kernel 'k2' (launch 1) ... in its 1st top-level loop"),
as a sync session names it, never by the twin's (nor by any internal task
name such as `k2.t0`),
whether the twin's in-bounds launch is in the same batch (fused with it,
or not with fusion off) or in the batch before. The session goes on, the
server stays SERVING and the other tenant is unharmed."""
import struct

import pytest

from conftest import RPC_TIMEOUT, Stream, i32, pb

N = 64
PROGRAM = f"""layout {{ dense(i: {N}) {{ place a: i32, b: i32 }} }}
kernel k1(o: i32) {{ for i in a {{ b[i + o] = i + 1 }} }}
kernel k2(o: i32) {{ for i in a {{ b[i + o] = i + 1 }} }}
"""


def _run(c, mode, fusion=True, split=False):
    """k1(0) then k2(1) (whose last iteration writes b[64]: out of bounds),
    in one batch or with a sync between; the errors of the last sync and
    field b."""
    opts = pb.SessionOptions(mode=mode)
    if not fusion:
        opts.passes["fusion"] = False
    sid = c.create(pb.CreateSessionRequest(options=opts, source=pb.Source(text=PROGRAM)),
                   timeout=RPC_TIMEOUT).session_id
    k1, k2 = c.register(pb.RegisterKernelsRequest(session_id=sid, source=pb.Source(text=PROGRAM)),
                        timeout=RPC_TIMEOUT).kernel_ids
    places = {k: v[0] for k, v in c.places(PROGRAM).items()}
    s = Stream(c, sid)
    try:
        s.send(launches=[pb.Launch(kernel=k1, args=[i32(0)])])
        if split:
            assert list(s.sync(1).errors) == []
        s.send(launches=[pb.Launch(kernel=k2, args=[i32(1)])])
        res = s.sync(2)
        b = struct.unpack(f"<{N}i", c.read_field(sid, places["b"]))
        return res, b
    finally:
        s.close()


@pytest.mark.parametrize("fusion,split", [(True, False), (False, False), (True, True)])
def test_twin_kernel_error_names_its_own_task(server, fusion, split):
    c = server.client
    want, want_b = _run(c, "sync")
    assert [e.seq for e in want.errors] == [2], want.errors
    assert "kernel 'k2'" in want.errors[0].message, want.errors
    assert "in its 1st top-level loop" in want.errors[0].message, want.errors
    assert ".t0" not in want.errors[0].message, want.errors
    got, b = _run(c, "async", fusion, split)
    assert len(got.errors) == 1, got.errors
    err = got.errors[0]
    assert err.seq == 2, err
    assert "kernel 'k2' (launch 1) indexed a field out of bounds in its 1st top-level loop" \
        in err.message, err.message
    assert "k1" not in err.message, err.message
    assert err.message.replace(" (launch 1)", "") == want.errors[0].message, \
        (err.message, want.errors[0].message)
    assert b == want_b
    server.assert_unharmed()
