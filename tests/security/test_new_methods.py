"""Hostile input to the methods added with process isolation and source over
the wire: Cancel, DescribeSource, and CreateSession/RegisterKernels with a
.fbk Source. Each attack goes through a running fuseboxd; each test then
checks that the server is SERVING and another tenant's field is unchanged
(server.assert_unharmed)."""
import grpc

from conftest import RPC_TIMEOUT, dense_layout, expect_error, i32, pb, store_kernel

INVALID = grpc.StatusCode.INVALID_ARGUMENT
NOT_FOUND = grpc.StatusCode.NOT_FOUND
EXHAUSTED = grpc.StatusCode.RESOURCE_EXHAUSTED
JUNK = (b"\xff" * 64, b"\x12\xff\xff\xff\xff\x0f", bytes(range(256)))


def _raw(client, method):
    return client.channel.unary_unary("/fusebox.v1.Fusebox/" + method)


def _unary(client, method, req, resp):
    return client.channel.unary_unary("/fusebox.v1.Fusebox/" + method,
                                      request_serializer=req.SerializeToString,
                                      response_deserializer=resp.FromString)


def test_cancel_hostile(server):
    """Cancel with junk bytes, no id, a made-up id, and the victim's id
    truncated: refused, and the victim is untouched."""
    c = server.client
    for junk in JUNK:
        expect_error(lambda: _raw(c, "Cancel")(junk, timeout=RPC_TIMEOUT), INVALID, "malformed")
    cancel = _unary(c, "Cancel", pb.CancelRequest, pb.CancelResponse)
    for sid in ("", "0" * 32, server.victim[:31], server.victim + "0", "\u00e9" * 32):
        expect_error(lambda: cancel(pb.CancelRequest(session_id=sid), timeout=RPC_TIMEOUT),
                     NOT_FOUND)
    server.assert_unharmed()


def test_cancel_through_launch_hostile(server):
    """Cancel's through_launch (launches sent but maybe not yet received)
    far past what any client can have on its way (the largest uint64, and
    2^24 + 1 past none received) is refused naming the field, and cancels
    nothing: the session's later launches run, on the session's own stream
    and on the victim's. A Cancel naming the victim with such a value
    leaves the victim's field as it was."""
    c = server.client
    cancel = _unary(c, "Cancel", pb.CancelRequest, pb.CancelResponse)
    sid = c.new_session(dense_layout(16))
    kid = c.register(pb.RegisterKernelsRequest(session_id=sid, kernels=[store_kernel(2)]),
                     timeout=RPC_TIMEOUT).kernel_ids[0]
    for far in ((1 << 64) - 1, (1 << 24) + 1):
        for target in (sid, server.victim):
            expect_error(lambda: cancel(pb.CancelRequest(session_id=target, through_launch=far),
                                        timeout=RPC_TIMEOUT), INVALID, "through_launch")
    # had either Cancel been taken, this launch (number 1) would run cancelled
    res = c.run(sid, [(kid, [i32(3), i32(33)])])
    assert res.seq == 1 and list(res.errors) == [], list(res.errors)
    server.assert_unharmed()


def test_source_hostile(make_server):
    """.fbk source from a client: junk bytes, a layout whose size overflows,
    one over the memory limit, deep nesting, and an endless loop under
    --kernel-timeout-s 1, all through CreateSession, RegisterKernels and
    DescribeSource."""
    server = make_server("--kernel-timeout-s", "1")
    c = server.client
    for junk in JUNK:
        expect_error(lambda: _raw(c, "DescribeSource")(junk, timeout=RPC_TIMEOUT), INVALID)
    describe = _unary(c, "DescribeSource", pb.Source, pb.SourceInfo)
    create = c.create

    def src_session(text):
        return create(pb.CreateSessionRequest(source=pb.Source(text=text)),
                      timeout=RPC_TIMEOUT).session_id

    overflow = "layout { dense(ijkl: 65536, 65536, 65536, 65536) { place x: i32 } }\n"
    expect_error(lambda: describe(pb.Source(text=overflow), timeout=RPC_TIMEOUT), INVALID)
    expect_error(lambda: src_session(overflow), INVALID)
    expect_error(lambda: src_session(
        "layout { dense(ijk: 100000, 100000, 100000) { place x: f64 } }"), EXHAUSTED)
    deep = "layout { place x: i32 }\nkernel k() { x[] = " + "(" * 5000 + "1" + ")" * 5000 + " }"
    expect_error(lambda: describe(pb.Source(text=deep), timeout=RPC_TIMEOUT), INVALID)
    # an endless loop written in the language: its worker is stopped
    spin = "layout { place x: i32 }\nkernel spin() { while 1 == 1 { x[] = 1 } }\n"
    sid = src_session(spin)
    kid = c.register(pb.RegisterKernelsRequest(session_id=sid, source=pb.Source(text=spin)),
                     timeout=RPC_TIMEOUT).kernel_ids[0]
    try:
        c.run(sid, [(kid, [])])
        raise AssertionError("an endless kernel returned")
    except grpc.RpcError as e:
        assert e.code() == grpc.StatusCode.DEADLINE_EXCEEDED, e.details()
        assert "'spin'" in e.details()
    # the victim's session id with another program's source: refused
    expect_error(lambda: c.register(pb.RegisterKernelsRequest(
        session_id=server.victim, source=pb.Source(text=spin)), timeout=RPC_TIMEOUT), INVALID,
        "not the session's")
    server.assert_unharmed()


def test_read_active_hostile(server):
    """ReadField with active (a field's activity mask): junk, made-up and
    truncated session ids, field ids that name nothing, the root or a
    container, and a sparse field whose extent is far over the session's
    memory limit (refused before anything is staged)."""
    c = server.client
    for junk in (b"\x20\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01", b"\x22\x05ab", JUNK[0]):
        expect_error(lambda: list(c.channel.unary_stream("/fusebox.v1.Fusebox/ReadField")(
            junk, timeout=RPC_TIMEOUT)), INVALID, "malformed")
    read = c.channel.unary_stream("/fusebox.v1.Fusebox/ReadField",
                                  request_serializer=pb.ReadFieldRequest.SerializeToString,
                                  response_deserializer=pb.FieldChunk.FromString)

    def active(sid, field, chunk=0):
        return b"".join(ch.data for ch in read(pb.ReadFieldRequest(
            session_id=sid, field=field, active=True, chunk_bytes=chunk), timeout=RPC_TIMEOUT))

    for sid in ("", "0" * 32, server.victim[:31]):
        expect_error(lambda: active(sid, 2), NOT_FOUND)
    for field, code in ((-1, NOT_FOUND), (2**31 - 1, NOT_FOUND), (0, INVALID), (1, INVALID)):
        expect_error(lambda: active(server.victim, field), code)
    assert active(server.victim, 2, chunk=1) == b"\x01" * 256  # dense: every cell
    big = ("layout { dense(i: 1024) { dynamic(j: 1048576, chunk: 1024) { place x: i32 } } }\n"
           "kernel k() { append(x, 3, 7) }\n")
    sid = c.create(pb.CreateSessionRequest(options=pb.SessionOptions(memory_limit=64 << 20),
                                           source=pb.Source(text=big)),
                   timeout=RPC_TIMEOUT).session_id
    expect_error(lambda: active(sid, 3), EXHAUSTED, "memory limit")  # x: SNode 3
    c.close_session(pb.CloseSessionRequest(session_id=sid), timeout=RPC_TIMEOUT)
    server.assert_unharmed()
