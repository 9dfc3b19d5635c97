"""How a session ended, as GetStats and /metrics count it: a session whose
client process was killed while it held the Session stream open (the
connection simply vanishes) is `disconnected`, not `closed`; one whose
client half-closed the stream (it was done) is `closed`. gRPC reports
both to the server as a receive that ended without a message; only
grpc_call_failed_before_recv_message tells them apart (server/call.c).
Both ends are counted by a real fuseboxd; the server stays SERVING and the
victim tenant is unharmed."""
import os
import signal
import subprocess
import sys
import time

from conftest import RPC_TIMEOUT, Stream, dense_layout

# A tenant's client in a process of its own: it creates a session, attaches
# its Session stream, says so once a sync came back over that stream, and
# then waits, the stream open, until it is killed.
CLIENT = r"""
import sys, time
sys.path.insert(0, sys.argv[2])
from conftest import Client, dense_layout, pb
c = Client(sys.argv[1])
sid = c.new_session(dense_layout(16))
def msgs():
    yield pb.SessionRequest(session_id=sid, sync=1)
    while True:
        time.sleep(3600)
for r in c._stream(msgs(), timeout=600):
    print("attached", sid, flush=True)
"""
HERE = os.path.dirname(os.path.abspath(__file__))


def _stats(c):
    s = c.stats()
    return s.sessions_created, s.sessions_closed, s.sessions_disconnected


def _wait_ended(c, created, closed, disconnected, deadline_s=20):
    """Poll GetStats until one more session ended than (closed,
    disconnected) counts; the counts then. Generous bound: a liveness
    limit, not a timing assertion."""
    end = time.monotonic() + deadline_s
    while True:
        now = _stats(c)
        if now[1] + now[2] > closed + disconnected:
            return now
        assert time.monotonic() < end, f"no session ended within {deadline_s} s: {now}"
        time.sleep(0.05)


def test_killed_client_is_disconnected_and_half_close_is_closed(server):
    c = server.client
    created, closed, disconnected = _stats(c)

    # a client process killed with its stream open
    proc = subprocess.Popen([sys.executable, "-c", CLIENT, "unix:" + server.sock, HERE],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ))
    try:
        line = proc.stdout.readline()
        assert line.startswith("attached "), (line, proc.stderr.read() if proc.poll() else "")
        sid = line.split()[1]
        assert any(s.tag == sid[:8] and s.attached for s in c.stats().sessions), \
            "the session is not live with its stream attached"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=RPC_TIMEOUT)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
        proc.stderr.close()
    now = _wait_ended(c, created, closed, disconnected)
    assert now == (created + 1, closed, disconnected + 1), \
        f"killed client: (created, closed, disconnected) {now}, was " \
        f"{(created, closed, disconnected)}"
    assert not any(s.tag == sid[:8] for s in c.stats().sessions), "the session outlived its client"
    server.assert_unharmed()

    # a client that is done: it half-closes its stream (a clean end)
    created, closed, disconnected = now
    sid = c.new_session(dense_layout(16))
    s = Stream(c, sid)
    s.sync(1)  # the stream is attached once a sync came back
    s.close()
    for _ in s.it:  # the server ends the stream once the session is gone
        pass
    now = _wait_ended(c, created + 1, closed, disconnected)
    assert now == (created + 1, closed + 1, disconnected), \
        f"half-closed stream: (created, closed, disconnected) {now}, was " \
        f"{(created, closed, disconnected)}"
    server.assert_unharmed()
