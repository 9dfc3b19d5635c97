"""Every SessionOptions field a client sets is checked by fuseboxd before a
session is made (server/methods.c check_options, check_passes): a value out
of range is refused with a message naming the field and the value, and
nothing is created. Each case ends with the server SERVING, the victim's
field unchanged, and no session left behind by the refusals."""
import grpc

from conftest import RPC_TIMEOUT, dense_layout, expect_error, pb

INVALID = grpc.StatusCode.INVALID_ARGUMENT


def _active(c):
    stats = c.channel.unary_unary("/fusebox.v1.Fusebox/GetStats",
                                  request_serializer=pb.StatsRequest.SerializeToString,
                                  response_deserializer=pb.ServerStats.FromString)
    return stats(pb.StatsRequest(), timeout=RPC_TIMEOUT).sessions_active


def test_options_out_of_range_named(make_server):
    """backend, mode, passes, max_fuse_per_task, compile_threads and
    memory_limit out of range, each alone: refused by name with the value
    (a negative count names the one field that is negative)."""
    server = make_server("--session-memory-limit", "1048576")
    c = server.client
    before = _active(c)
    cases = [
        (dict(backend="tpu"), INVALID, ["unknown backend 'tpu'"]),
        # a CPU server refuses a CUDA session: UNIMPLEMENTED is gRPC's code for
        # "not supported by this service" (FB_EUNSUPPORTED), and the reply says why
        (dict(backend="cuda"), grpc.StatusCode.UNIMPLEMENTED, ["cpu backend", "asked for cuda"]),
        (dict(mode="turbo"), INVALID, ["unknown mode 'turbo'"]),
        (dict(passes={"fuse": True}), INVALID, ["unknown pass 'fuse'"]),
        (dict(max_fuse_per_task=-1), INVALID, ["max_fuse_per_task -1 must be >= 0"]),
        (dict(max_fuse_per_task=-2**31), INVALID, [f"max_fuse_per_task {-2**31} must be >= 0"]),
        (dict(max_fuse_per_task=257), INVALID, ["max_fuse_per_task 257", "limit of 256"]),
        (dict(compile_threads=-1), INVALID, ["compile_threads -1 must be >= 0"]),
        (dict(compile_threads=-2**31), INVALID, [f"compile_threads {-2**31} must be >= 0"]),
        (dict(memory_limit=1048577), grpc.StatusCode.RESOURCE_EXHAUSTED,
         ["memory limit of 1048577 bytes", "at most 1048576 bytes"]),
        (dict(memory_limit=2**64 - 1), grpc.StatusCode.RESOURCE_EXHAUSTED,
         [f"memory limit of {2**64 - 1} bytes"]),
    ]
    for opts, code, words in cases:
        msg = expect_error(lambda: c.create(
            pb.CreateSessionRequest(options=pb.SessionOptions(**opts), layout=dense_layout(16)),
            timeout=RPC_TIMEOUT), code, *words)
        if "max_fuse_per_task" in opts and opts["max_fuse_per_task"] < 0:
            assert "compile_threads" not in msg, msg
        if "compile_threads" in opts:
            assert "max_fuse_per_task" not in msg, msg
        server.assert_unharmed()
    assert _active(c) == before
    # the edges are taken
    sid = c.new_session(dense_layout(16), max_fuse_per_task=256, compile_threads=0,
                        memory_limit=1048576, flush_every=-2**31, seed=2**64 - 1)
    assert sid
    server.assert_unharmed()
