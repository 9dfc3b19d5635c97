"""A tape flood through the protocol (docs/autodiff.md, "The tape"): a
tenant with a small memory limit (SessionOptions.memory_limit) begins a
tape and records launches with arguments until the session's memory is
spent. The tape's bytes count against that limit, the budget its fields
use, so the launch that would pass it is refused with FB_EQUOTA naming the
tape and the bytes; the tape still ends, its gradients come out, the
session goes on, the server stays SERVING and another tenant's field is
unchanged. Both isolation modes; bounded (at most 64 messages of 1024
launches)."""
import re
import struct

import pytest

from conftest import RPC_TIMEOUT, Stream, pb

FB_EQUOTA = -8  # include/fusebox/errors.h
LIMIT = 256 * 1024
SRC = ("layout {\n  dense(i: 8) { place x: f64 grad }\n  place loss: f64 grad\n}\n"
       "kernel k(a: f64) {\n  for i in x { loss[] += x[i] * a }\n}\n")
BATCH = 1024


def f64(v):
    return pb.Value(type=pb.T_F64, f_bits=struct.unpack("<Q", struct.pack("<d", v))[0])


@pytest.mark.parametrize("isolation", ["process", "thread"])
def test_tape_flood_is_charged_to_the_session(make_server, isolation):
    server = make_server("--isolation", isolation)
    c = server.client
    sid = c.create(pb.CreateSessionRequest(options=pb.SessionOptions(memory_limit=LIMIT),
                                           source=pb.Source(text=SRC)),
                   timeout=RPC_TIMEOUT).session_id
    kid = c.register(pb.RegisterKernelsRequest(
        session_id=sid, source=pb.Source(text=SRC), instances=[pb.KernelInstance(kernel="k")]),
        timeout=RPC_TIMEOUT).kernel_ids[0]
    loss = c.places(SRC)["loss"][0]
    st = Stream(c, sid)
    n = sent = 0
    refused = None
    tape = [pb.TapeMark(at=0, loss=loss)]
    for _ in range(64):
        n += 1
        st.send(launches=[pb.Launch(kernel=kid, args=[f64(2.0)])] * BATCH, tape=tape)
        sent += BATCH
        tape = []
        res = st.sync(n)
        errs = [e for e in res.errors if e.code == FB_EQUOTA]
        if errs:
            refused = errs[0]
            break
        assert not res.errors, res.errors
    assert refused is not None, f"{sent} launches recorded under a {LIMIT}-byte limit"
    m = refused.message
    assert "the tape over 'loss' needs" in m and f"memory limit of {LIMIT} bytes" in m, m
    need = int(re.search(r"needs (\d+) bytes", m).group(1))
    assert need > LIMIT // 2, m
    server.assert_unharmed()
    # the tape still ends (every recorded launch's adjoint runs); the end
    # mark comes in a message of its own (fuseboxd once dropped such a
    # message, leaving the tape recording), and the session goes on: the
    # launches after it are not refused
    n += 1
    st.send(tape=[pb.TapeMark(at=0, end=True)])
    res = st.sync(n)
    assert not res.errors and not res.errors_dropped, res
    assert res.counters.launches > sent, res.counters  # the adjoints ran
    n += 1
    st.send(launches=[pb.Launch(kernel=kid, args=[f64(1.0)])] * 4)
    res = st.sync(n)
    assert not res.errors and not res.errors_dropped, res
    st.close()
    server.assert_unharmed()
