"""Hostile gradient requests through the protocol (docs/autodiff.md, "The
tape"): tape marks naming fields that do not exist or are not losses, ends
without begins, nested begins, marks placed far past the message's
launches, and adjoints and tangents (forward mode) asked for kernel ids
that do not exist. Each is
refused as an error of that session (the adjoint request as a call error),
the session goes on, the server stays SERVING and another tenant's field is
unchanged. Both isolation modes."""
import grpc
import pytest

from conftest import RPC_TIMEOUT, Stream, expect_error, pb

SRC = ("layout {\n  dense(i: 8) { place x: f32 grad }\n  place loss: f32 grad\n}\n"
       "kernel k() {\n  for i in x { loss[] += x[i] * x[i] }\n}\n")


def session(c):
    sid = c.create(pb.CreateSessionRequest(source=pb.Source(text=SRC)),
                   timeout=RPC_TIMEOUT).session_id
    kid = c.register(pb.RegisterKernelsRequest(
        session_id=sid, source=pb.Source(text=SRC), instances=[pb.KernelInstance(kernel="k")]),
        timeout=RPC_TIMEOUT).kernel_ids[0]
    return sid, kid


@pytest.mark.parametrize("isolation", ["process", "thread"])
def test_hostile_tape_marks_and_adjoints(make_server, isolation):
    server = make_server("--isolation", isolation)
    c = server.client
    sid, kid = session(c)
    # adjoints of kernels that do not exist: a call error, nothing registered
    for bad in (-1, 7, 2 ** 31 - 1):
        expect_error(lambda: c.register(pb.RegisterKernelsRequest(session_id=sid, adjoints=[bad]),
                                        timeout=RPC_TIMEOUT),
                     grpc.StatusCode.NOT_FOUND, "no kernel with id")
        # ... nor tangents (forward mode), alone or after a good one
        for tangents in ([bad], [kid, bad]):
            expect_error(lambda: c.register(pb.RegisterKernelsRequest(session_id=sid,
                                                                      tangents=tangents),
                                            timeout=RPC_TIMEOUT),
                         grpc.StatusCode.NOT_FOUND, "no kernel with id")
    # a tangent asked for twice is made once (the layout has no duals: k itself)
    ids = c.register(pb.RegisterKernelsRequest(session_id=sid, tangents=[kid, kid]),
                     timeout=RPC_TIMEOUT).kernel_ids
    assert len(ids) == 2 and ids[0] == ids[1] != kid, ids
    st = Stream(c, sid)
    n = 0
    hostile = [
        [pb.TapeMark(at=0, loss=-5)],                      # not a field
        [pb.TapeMark(at=0, loss=2 ** 31 - 1)],             # far past the layout
        [pb.TapeMark(at=0, loss=1)],                       # x's container: not a 0-D loss
        [pb.TapeMark(at=0, end=True)],                     # an end without a begin
        [pb.TapeMark(at=2 ** 32 - 1, end=True)],           # placed after everything
    ]
    for marks in hostile:
        n += 1
        st.send(launches=[pb.Launch(kernel=kid)], tape=marks)
        res = st.sync(n)
        assert res.errors or res.errors_dropped, f"{marks}: no error reported"
        server.assert_unharmed()
    # nested begins: the second is refused, the first tape still ends cleanly
    n += 1
    st.send(launches=[pb.Launch(kernel=kid), pb.Launch(kernel=kid)],
            tape=[pb.TapeMark(at=0, loss=-1), pb.TapeMark(at=1, loss=-1),
                  pb.TapeMark(at=2, end=True), pb.TapeMark(at=2, end=True)])
    res = st.sync(n)
    assert res.errors or res.errors_dropped
    # the session goes on: plain launches complete without errors
    n += 1
    st.send(launches=[pb.Launch(kernel=kid)] * 4)
    res = st.sync(n)
    assert not res.errors and not res.errors_dropped, res
    st.close()
    server.assert_unharmed()
