"""Decoded requests (docs/security.md "The memory budget"): protobuf-c's
form of a message that repeats empty sub-messages is tens of times its
bytes, so a request near max_message_bytes could make fuseboxd hold
gigabytes. Each decode is bounded (FBP_DECODE_FACTOR x max_message_bytes)
and a request that outlives its decode (a RegisterKernels waiting in its
session's queue, a SessionRequest) decodes only into what the memory budget
has free, counted in its "decoded requests" part until the request is done.

Raw bytes, written by hand as any tenant could: a RegisterKernels of one
kernel with millions of empty blocks, one of millions of empty kernels, and
SessionRequests of millions of empty launches. Each is refused
RESOURCE_EXHAUSTED with a message naming the request and the limit;
fuseboxd's peak memory (VmHWM) grows by far less than the old code took
(about 800 MiB for one such RegisterKernels); the session still registers
and runs a kernel, the server is SERVING and another tenant's field is
unchanged."""
import threading

import grpc

from conftest import RPC_TIMEOUT, dense_layout, i32, pb, store_kernel
from test_memory_budget import _kib, _stats, _status

EXHAUSTED = grpc.StatusCode.RESOURCE_EXHAUSTED
MIB = 1 << 20
WIRE = 15 * MIB  # under the default max_message_bytes (16 MiB)
BUDGET = 96 * MIB


def _varint(n):
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _field(num, payload):
    return _varint(num << 3 | 2) + _varint(len(payload)) + payload


def empty_blocks(sid):
    """RegisterKernels: one kernel of WIRE bytes of empty blocks (field 5)."""
    return _field(1, sid.encode()) + _field(2, b"\x2a\x00" * (WIRE // 2))


def empty_kernels(sid):
    """RegisterKernels: WIRE bytes of empty kernels (field 2)."""
    return _field(1, sid.encode()) + b"\x12\x00" * (WIRE // 2)


def empty_launches(sid):
    """SessionRequest: WIRE bytes of empty launches (field 2)."""
    return _field(1, sid.encode()) + b"\x12\x00" * (WIRE // 2)


def _raw_register(client):
    return client.channel.unary_unary("/fusebox.v1.Fusebox/RegisterKernels",
                                      request_serializer=lambda b: b,
                                      response_deserializer=pb.RegisterKernelsResponse.FromString)


def _raw_stream(client):
    return client.channel.stream_stream("/fusebox.v1.Fusebox/Session",
                                        request_serializer=lambda b: b,
                                        response_deserializer=pb.SessionResponse.FromString)


def _hwm_kib(server):
    return _kib(_status(server.proc.pid), "VmHWM")


def _call(call):
    """(status, message) of call()."""
    try:
        call()
        return grpc.StatusCode.OK, ""
    except grpc.RpcError as e:
        return e.code(), e.details()


def _refused(got, *words):
    code, details = got
    assert code == EXHAUSTED, f"{code}: {details}"
    for w in words:
        assert w in details, f"{w!r} not in {details!r}"


def _still_works(server, sid):
    """The attacked session registers and runs a kernel, then ends; the server is
    unharmed and the budget's decoded part is back to nothing."""
    c = server.client
    kid = c.register(pb.RegisterKernelsRequest(session_id=sid, kernels=[store_kernel(2)]),
                     timeout=RPC_TIMEOUT).kernel_ids[0]
    sync = c.run(sid, [(kid, [i32(3), i32(41)])])  # (the stream's end ends the session)
    assert not sync.errors and sync.seq == 1, sync
    server.assert_unharmed()
    assert _stats(c).memory.decoded_bytes == 0


def test_register_kernels_of_empty_blocks(make_server):
    server = make_server("--memory-budget", str(BUDGET), "--isolation", "thread")
    c = server.client
    sid = c.new_session(dense_layout(64))
    before = _hwm_kib(server)
    got = _call(lambda: _raw_register(c)(empty_blocks(sid), timeout=RPC_TIMEOUT))
    grew = (_hwm_kib(server) - before) // 1024
    print("one: peak grew by", grew, "MiB")
    # the old code: about 800 MiB for this one request
    assert grew < 320, f"fuseboxd's peak grew by {grew} MiB for {got}"
    _refused(got, "RegisterKernelsRequest", "15.0 MiB on the wire", "(memory_budget)",
             "memory budget 96 MiB is full", "decoded requests")
    assert _stats(c).memory.refused >= 1
    # six at once (the old code: 1.8 GiB)
    errs = []

    def one():
        try:
            _raw_register(c)(empty_blocks(sid), timeout=RPC_TIMEOUT)
            errs.append("accepted")
        except grpc.RpcError as e:
            errs.append(e.code())

    threads = [threading.Thread(target=one) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(RPC_TIMEOUT)
    grew = (_hwm_kib(server) - before) // 1024
    # six 15 MiB messages that gRPC holds, two decodes at once (two
    # completion-queue threads) and AddressSanitizer's quarantine: 466 MiB
    assert grew < 720, f"fuseboxd's peak grew by {grew} MiB for six at once"
    assert errs == [EXHAUSTED] * 6, errs
    _still_works(server, sid)


def test_register_kernels_past_the_decode_cap(make_server):
    """With room in the budget, the cap on one decode refuses what decodes
    past FBP_DECODE_FACTOR x max_message_bytes (empty kernels: about 50x)."""
    server = make_server("--memory-budget", "64G", "--isolation", "thread")
    c = server.client
    sid = c.new_session(dense_layout(64))
    _refused(_call(lambda: _raw_register(c)(empty_kernels(sid), timeout=RPC_TIMEOUT)),
             "fusebox.v1.RegisterKernelsRequest of 15.0 MiB decodes to more than 512 MiB",
             "32 x max_message_bytes 16 MiB")
    assert "decodes to more than" in server.logtext()
    _still_works(server, sid)


def test_session_requests_of_empty_launches(make_server):
    """SessionRequests of empty launches on three sessions' streams at once
    (the old code: six on one session took fuseboxd to 4 GiB)."""
    server = make_server("--memory-budget", str(BUDGET), "--isolation", "thread")
    c = server.client
    before = _hwm_kib(server)
    sids = [c.new_session(dense_layout(64)) for _ in range(3)]
    errs = []

    def attack(sid):
        msgs = [empty_launches(sid), empty_launches(sid)]
        try:
            for _ in _raw_stream(c)(iter(msgs), timeout=RPC_TIMEOUT):
                pass
            errs.append("ended OK")
        except grpc.RpcError as e:
            errs.append((e.code(), e.details()))

    threads = [threading.Thread(target=attack, args=(s,)) for s in sids]
    for t in threads:
        t.start()
    for t in threads:
        t.join(RPC_TIMEOUT)
    grew = (_hwm_kib(server) - before) // 1024
    print("three streams: peak grew by", grew, "MiB")
    assert grew < 720, f"fuseboxd's peak grew by {grew} MiB"
    assert len(errs) == 3, errs
    for code, details in errs:
        assert code == EXHAUSTED, (code, details)
        assert "SessionRequest" in details and "memory_budget" in details, details
    # the attacked streams ended their sessions; a new one works
    _still_works(server, c.new_session(dense_layout(64)))
