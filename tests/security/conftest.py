"""A real fuseboxd for the security tests, and a small client for it built
on nothing but grpcio and the protobuf stubs that protoc makes from
proto/*.proto at build time (FB_PYGEN): what any tenant could write.

Every test gets a server of its own on a unix socket in a temporary folder,
and a victim tenant: a session whose field holds a known pattern. A test
attacks through the public protocol, then `server.assert_unharmed()` checks
that the health service still says SERVING and that the victim's field is
byte for byte what it was. At the end the server gets SIGTERM and must exit
0 within its grace period (under AddressSanitizer that also means no leak).
"""
import os
import queue
import signal
import subprocess
import sys
import tempfile
import time

import grpc
import pytest

sys.path.insert(0, os.environ.get("FB_PYGEN", ""))
import fusebox_pb2 as pb  # noqa: E402
import health_pb2  # noqa: E402

BUILD = os.environ.get("FB_BUILD_DIR", "build")
FUSEBOXD = os.path.join(BUILD, "server", "fuseboxd")
RPC_TIMEOUT = 60.0  # seconds; every call is bounded


def _unary(channel, method, req_type, resp_type):
    return channel.unary_unary(
        "/fusebox.v1.Fusebox/" + method,
        request_serializer=req_type.SerializeToString,
        response_deserializer=resp_type.FromString,
    )


class Client:
    """The Fusebox protocol by hand, as a stock gRPC client speaks it."""

    def __init__(self, address, channel=None):
        self.channel = channel if channel is not None else grpc.insecure_channel(address)
        self.create = _unary(self.channel, "CreateSession", pb.CreateSessionRequest,
                             pb.CreateSessionResponse)
        self.register = _unary(self.channel, "RegisterKernels", pb.RegisterKernelsRequest,
                               pb.RegisterKernelsResponse)
        self.close_session = _unary(self.channel, "CloseSession", pb.CloseSessionRequest,
                                    pb.CloseSessionResponse)
        self._write = self.channel.stream_unary(
            "/fusebox.v1.Fusebox/WriteField",
            request_serializer=pb.FieldChunk.SerializeToString,
            response_deserializer=pb.WriteFieldResponse.FromString)
        self._read = self.channel.unary_stream(
            "/fusebox.v1.Fusebox/ReadField",
            request_serializer=pb.ReadFieldRequest.SerializeToString,
            response_deserializer=pb.FieldChunk.FromString)
        self._stream = self.channel.stream_stream(
            "/fusebox.v1.Fusebox/Session",
            request_serializer=pb.SessionRequest.SerializeToString,
            response_deserializer=pb.SessionResponse.FromString)
        self._describe = _unary(self.channel, "DescribeSource", pb.Source, pb.SourceInfo)
        self._stats = _unary(self.channel, "GetStats", pb.StatsRequest, pb.ServerStats)
        self._health = self.channel.unary_unary(
            "/grpc.health.v1.Health/Check",
            request_serializer=health_pb2.HealthCheckRequest.SerializeToString,
            response_deserializer=health_pb2.HealthCheckResponse.FromString)

    def close(self):
        self.channel.close()

    def places(self, text):
        """DescribeSource of program text: {field name: [its places]}."""
        info = self._describe(pb.Source(text=text), timeout=RPC_TIMEOUT)
        return {f.name: list(f.places) for f in info.fields}

    def stats(self):
        """GetStats: the server's counters (and the sessions this client sees)."""
        return self._stats(pb.StatsRequest(), timeout=RPC_TIMEOUT)

    def health(self):
        r = self._health(health_pb2.HealthCheckRequest(service=""), timeout=RPC_TIMEOUT)
        return r.status

    def new_session(self, layout, mode="sync", **options):
        req = pb.CreateSessionRequest(options=pb.SessionOptions(mode=mode, **options),
                                      layout=layout)
        return self.create(req, timeout=RPC_TIMEOUT).session_id

    def write_field(self, sid, field, data):
        chunk = pb.FieldChunk(session_id=sid, field=field, offset=0, total_bytes=len(data),
                              data=data)
        return self._write(iter([chunk]), timeout=RPC_TIMEOUT).bytes

    def read_field(self, sid, field):
        out = bytearray()
        for ch in self._read(pb.ReadFieldRequest(session_id=sid, field=field),
                             timeout=RPC_TIMEOUT):
            out += ch.data
        return bytes(out)

    def run(self, sid, launches):
        """Launch [(kernel id, [pb.Value])] on the session's stream, sync, and
        return the SyncResult; the stream then closes (and with it the
        session)."""
        msgs = [pb.SessionRequest(session_id=sid,
                                  launches=[pb.Launch(kernel=k, args=a) for k, a in launches],
                                  sync=1)]
        for resp in self._stream(iter(msgs), timeout=RPC_TIMEOUT):
            return resp.sync
        raise AssertionError("the Session stream ended without a SyncResult")


class Stream:
    """A Session stream fed from a queue, so a test can act between
    messages; the session ends when it is closed."""

    def __init__(self, client, sid):
        self.q = queue.Queue()
        self.q.put(pb.SessionRequest(session_id=sid))
        self.it = client._stream(iter(self.q.get, None), timeout=RPC_TIMEOUT)

    def send(self, **kw):
        self.q.put(pb.SessionRequest(**kw))

    def next(self):
        """The next SyncResult."""
        return next(self.it).sync

    def sync(self, n):
        self.send(sync=n)
        return self.next()

    def close(self):
        self.q.put(None)


# ---------------------------------------------------------------- IR by hand

def snode(kind, parent, name="", axes=0, size=(1, 1, 1, 1), chunk=0, type=pb.T_VOID):
    return pb.SNode(kind=kind, name=name, parent=parent, axes=axes, size=list(size),
                    chunk=chunk, type=type)


def dense_layout(n, name="v", type=pb.T_I32):
    """dense(i: n) { place name: type }"""
    return pb.Layout(nodes=[snode(pb.SN_ROOT, -1), snode(pb.SN_DENSE, 0, axes=1, size=(n, 1, 1, 1)),
                            snode(pb.SN_PLACE, 1, name=name, type=type)])


def stmt(op, type=pb.T_VOID, args=(), imm=0, snode_id=-1, body=-1, orelse=-1):
    return pb.Stmt(op=op, type=type, snode=snode_id, args=list(args), imm=imm & (2**64 - 1),
                   body=body, orelse=orelse)


def kernel(name, stmts, params=(), blocks=None):
    blocks = blocks if blocks is not None else [list(range(len(stmts)))]
    return pb.Kernel(name=name, params=list(params), ret=pb.T_VOID, stmts=stmts,
                     blocks=[pb.Block(ids=b) for b in blocks])


def store_kernel(place):
    """poke(i, v) { place[i] = v }"""
    return kernel("poke", [stmt("arg", pb.T_I32, imm=0), stmt("arg", pb.T_I32, imm=1),
                           stmt("store", args=[0, 1], snode_id=place)],
                  params=[pb.T_I32, pb.T_I32])


def i32(v):
    return pb.Value(type=pb.T_I32, i=v)


# ---------------------------------------------------------------- the server

VICTIM_BYTES = bytes((i * 37 + 11) % 256 for i in range(4 * 256))


def terminate(proc, logtext):
    """SIGTERM to a fuseboxd (unless it has ended), a bounded wait, and its
    exit status; one that does not stop is killed and the test fails."""
    if proc.poll() is not None:
        return proc.returncode
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError("fuseboxd did not stop on SIGTERM:\n" + logtext())


class Server:
    def __init__(self, tmp, args=()):
        self.sock = os.path.join(tmp, "fuseboxd.sock")
        self.log = open(os.path.join(tmp, "fuseboxd.log"), "w+")
        self.proc = subprocess.Popen(
            [FUSEBOXD, "--listen", "unix:" + self.sock, "--backend", "cpu",
             "--shutdown-grace-s", "5", *args],
            stdout=self.log, stderr=subprocess.STDOUT)
        self.client = Client("unix:" + self.sock)
        deadline = time.monotonic() + 30
        while True:
            try:
                if self.client.health() == health_pb2.HealthCheckResponse.SERVING:
                    break
            except grpc.RpcError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError("fuseboxd did not start:\n" + self.logtext())
            time.sleep(0.05)
        # the victim: another tenant's session with a field of known bytes
        self.victim = self.client.new_session(dense_layout(256))
        assert self.client.write_field(self.victim, 2, VICTIM_BYTES) == len(VICTIM_BYTES)

    def logtext(self):
        self.log.flush()
        self.log.seek(0)
        return self.log.read()

    def assert_unharmed(self):
        assert self.proc.poll() is None, "fuseboxd died:\n" + self.logtext()
        assert self.client.health() == health_pb2.HealthCheckResponse.SERVING
        assert self.client.read_field(self.victim, 2) == VICTIM_BYTES, \
            "another tenant's field changed"

    def stop(self):
        self.client.close()
        rc = terminate(self.proc, self.logtext)
        assert rc == 0, f"fuseboxd exited with {rc}:\n" + self.logtext()
        self.log.close()


@pytest.fixture
def make_server():
    servers = []
    tmps = []

    def make(*args):
        tmp = tempfile.TemporaryDirectory(prefix="fbsec-")
        tmps.append(tmp)
        s = Server(tmp.name, args)
        servers.append(s)
        return s

    yield make
    for s in servers:
        s.stop()
    for t in tmps:
        t.cleanup()


@pytest.fixture
def server(make_server):
    return make_server()


def expect_error(call, code, *words):
    """call() must fail with this gRPC status and a message holding words."""
    with pytest.raises(grpc.RpcError) as ei:
        call()
    err = ei.value
    assert err.code() == code, f"{err.code()}: {err.details()}"
    for w in words:
        assert w in err.details(), f"{w!r} not in {err.details()!r}"
    return err.details()
