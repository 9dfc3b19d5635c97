"""Draining one fuseboxd through the admin Drain call (server/drain.c):
GetInfo and the replica header name it, readiness (health service
"fusebox.v1.Ready") turns NOT_SERVING while liveness stays SERVING, a new
session is refused with the drain message and the fusebox-retry-after-ms
hint, a live session goes on, and fuseboxd exits 0 once it is closed.
Without a tenants file Drain is refused on TCP (anyone could send it)."""
import grpc
import numpy as np
import pytest

import fusebox
from fusebox._proto import pb

PROG = """
layout { dense(i: 8) { place x: f32 } }
kernel add(k: f32) { for i in x { x[i] = x[i] + k } }
"""


def health(channel, service):
    req = service.encode()
    check = channel.unary_unary("/grpc.health.v1.Health/Check")
    return check(b"\n" + bytes([len(req)]) + req if req else b"", timeout=10)


def drain(channel):
    return channel.unary_unary(
        "/fusebox.v1.Fusebox/Drain", request_serializer=pb.DrainRequest.SerializeToString,
        response_deserializer=pb.DrainResponse.FromString)(pb.DrainRequest(), timeout=10)


SERVING, NOT_SERVING = b"\x08\x01", b"\x08\x02"


def test_drain_rpc(make_server):
    d = make_server("--replica-name", "rz", "--drain-grace-s", "60", "--isolation", "thread")
    c = fusebox.connect(d.address)
    info = c.info()
    assert (info.replica, info.draining) == ("rz", False)
    s = c.session(PROG)
    assert s.replica == "rz"
    assert health(c._channel, "fusebox.v1.Ready") == SERVING
    r = drain(c._channel)
    assert (r.replica, r.sessions, r.grace_s, r.already) == ("rz", 1, 60.0, False)
    assert drain(c._channel).already
    assert c.info().draining
    assert health(c._channel, "fusebox.v1.Ready") == NOT_SERVING
    assert health(c._channel, "") == SERVING  # liveness
    with pytest.raises(fusebox.ConnectionLostError,
                       match="fuseboxd on replica rz is draining; retry on another replica"):
        c.session(PROG)
    create = c._channel.unary_unary(
        "/fusebox.v1.Fusebox/CreateSession",
        request_serializer=pb.CreateSessionRequest.SerializeToString,
        response_deserializer=pb.CreateSessionResponse.FromString)
    with pytest.raises(grpc.RpcError) as e:
        create(pb.CreateSessionRequest(source=pb.Source(text=PROG)), timeout=10)
    assert e.value.code() == grpc.StatusCode.UNAVAILABLE
    assert dict(e.value.trailing_metadata())["fusebox-retry-after-ms"] == "1000"
    s.kernels.add(2.0)  # the live session goes on
    s.sync()
    assert np.array_equal(s.fields.x.to_numpy(), np.full(8, 2, np.float32))
    s.close()
    assert d.proc.wait(timeout=30) == 0  # the last session gone: it stops
    c.close()


def test_drain_refused_on_tcp_without_tenants(make_server):
    d = make_server("--replica-name", "rt", listen="127.0.0.1:0")
    with fusebox.connect(d.address) as c:
        with pytest.raises(grpc.RpcError) as e:
            drain(c._channel)
        assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "unix: socket" in e.value.details()
        assert not c.info().draining
