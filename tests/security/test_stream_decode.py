"""A Session stream's messages are decoded once, where they run: under
process isolation the broker reads only the fields it routes on
(fbp_session_scan) and the session's worker decodes the rest; under thread
isolation the broker decodes the message for its session thread. Either
way a malformed message gets the same answer a client always got:
INVALID_ARGUMENT naming the bytes and the message type, counted as a bad
request, the stream (and with it the session) ended, and nothing the
client sent after it run."""
import queue
import time

import grpc
import pytest

from conftest import RPC_TIMEOUT, dense_layout, i32, pb, store_kernel

INVALID = grpc.StatusCode.INVALID_ARGUMENT

# a launch whose kernel number never ends (a varint cut short): the
# message's own structure is sound, so under process isolation only the
# worker's decode finds it
BAD_INSIDE = b"\x12\x01\x08"
# sync (field 4, a varint) sent as bytes: the broker's scan refuses it
BAD_OUTSIDE = b"\x22\x01\x00"


def poke(k, v):
    return pb.Launch(kernel=k, args=[i32(7), i32(v)])


def open_raw_stream(server):
    ch = grpc.insecure_channel("unix:" + server.sock)
    call = ch.stream_stream("/fusebox.v1.Fusebox/Session", request_serializer=None,
                            response_deserializer=pb.SessionResponse.FromString)
    return ch, call


@pytest.mark.parametrize("isolation", ["process", "thread"])
@pytest.mark.parametrize("bad", [BAD_INSIDE, BAD_OUTSIDE], ids=["inside", "outside"])
def test_malformed_stream_message(make_server, isolation, bad):
    server = make_server("--isolation", isolation)
    c = server.client
    sid = c.new_session(dense_layout(256))
    k = list(c.register(pb.RegisterKernelsRequest(session_id=sid, kernels=[store_kernel(2)]),
                        timeout=RPC_TIMEOUT).kernel_ids)[0]
    bad_before = c.stats().bad_requests
    first = pb.SessionRequest(session_id=sid, launches=[poke(k, 70)], sync=1).SerializeToString()
    second = pb.SessionRequest(launches=[poke(k, 71)]).SerializeToString() + bad + \
        pb.SessionRequest(sync=2).SerializeToString()
    third = pb.SessionRequest(launches=[poke(k, 72)], sync=3).SerializeToString()
    ch, call = open_raw_stream(server)
    q = queue.Queue()
    q.put(first)
    it = call(iter(q.get, None), timeout=RPC_TIMEOUT)
    res = next(it).sync
    assert res.sync_id == 1 and res.seq == 1 and list(res.errors) == []
    # the malformed one and one after it, sent together (the one after it
    # may reach the server before the malformed one is refused: not run)
    q.put(second)
    q.put(third)
    q.put(None)
    with pytest.raises(grpc.RpcError) as ei:
        for r in it:
            raise AssertionError(f"a response after the malformed message: {r}")
    e = ei.value
    assert e.code() == INVALID, f"{e.code()}: {e.details()}"
    assert e.details() == (f"malformed request: {len(second)} bytes that are not a valid "
                           "fusebox.v1.SessionRequest"), e.details()
    ch.close()
    # counted once as a bad request; the stream's end ended the session
    deadline = time.monotonic() + RPC_TIMEOUT
    while c.stats().sessions_active > 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    st = c.stats()
    assert st.sessions_active == 1, st  # the victim's alone
    assert st.bad_requests == bad_before + 1, (bad_before, st.bad_requests)
    assert "malformed" in server.logtext()
    server.assert_unharmed()
