"""A tenant's .fbk source is parsed where its own work runs, within a budget
(docs/security.md, "Source over the wire"): never on the server's
completion-queue threads, so an expensive program stalls nobody else.

The attack: a func that calls the previous one twice, 12 deep, copied into
many kernels, is a few KB of source that costs the front end millions of
steps. Sent at once through DescribeSource, CreateSession and
RegisterKernels by several clients that give up after a moment, it must
not slow another tenant's calls; each request that waits for its answer
gets one error naming the limit; and the server stays SERVING with the
victim's field unchanged. Both isolation modes.
"""
import threading
import time

import grpc
import pytest

from conftest import RPC_TIMEOUT, _unary, expect_error, pb

EXHAUSTED = grpc.StatusCode.RESOURCE_EXHAUSTED
DEADLINE = grpc.StatusCode.DEADLINE_EXCEEDED


def bomb(depth=12, kernels=60):
    """A few KB that inline to far past the whole-program budget, while each
    kernel stays under the per-kernel limit of 100000 IR statements."""
    out = ["layout {\n  dense(i: 16) { place x: f32 }\n}\n",
           "func f0(a: f32) -> f32 {\n  return a * 1.5 + 1.0\n}\n"]
    for d in range(1, depth + 1):
        out.append(f"func f{d}(a: f32) -> f32 {{\n  return f{d - 1}(a) + f{d - 1}(a * 0.5)\n}}\n")
    for k in range(kernels):
        out.append(f"kernel k{k}() {{\n  for i in x {{\n    x[i] = f{depth}(x[i])\n  }}\n}}\n")
    return "".join(out)


SMALL = "layout {\n  dense(i: 16) { place x: f32 }\n}\nkernel k0() {\n  for i in x {\n    x[i] = 1.0\n  }\n}\n"
LIMIT_WORDS = ("program too large", "2000000")


def describe(client):
    return _unary(client.channel, "DescribeSource", pb.Source, pb.SourceInfo)


@pytest.mark.parametrize("isolation", ["process", "thread"])
def test_expansion_bomb_is_refused(make_server, isolation):
    """Every way in refuses the bomb with one error naming the budget; a small
    program then works in the same session."""
    server = make_server("--isolation", isolation)
    c = server.client
    text = bomb()
    assert len(text) < 8000
    expect_error(lambda: describe(c)(pb.Source(text=text), timeout=RPC_TIMEOUT), EXHAUSTED,
                 *LIMIT_WORDS)
    expect_error(lambda: c.create(pb.CreateSessionRequest(source=pb.Source(text=text)),
                                  timeout=RPC_TIMEOUT), EXHAUSTED, *LIMIT_WORDS)
    sid = c.create(pb.CreateSessionRequest(source=pb.Source(text=SMALL)),
                   timeout=RPC_TIMEOUT).session_id
    # the session's own layout, so only the budget can refuse it
    expect_error(lambda: c.register(pb.RegisterKernelsRequest(
        session_id=sid, source=pb.Source(text=text)), timeout=RPC_TIMEOUT), EXHAUSTED,
        *LIMIT_WORDS)
    ids = c.register(pb.RegisterKernelsRequest(session_id=sid, source=pb.Source(text=SMALL)),
                     timeout=RPC_TIMEOUT).kernel_ids
    assert len(ids) == 1
    assert c.read_field(sid, 2) == bytes(64)
    res = c.run(sid, [(ids[0], [])])  # its stream's end closes the session
    assert list(res.errors) == []
    info = describe(c)(pb.Source(text=SMALL), timeout=RPC_TIMEOUT)
    assert [k.name for k in info.kernels] == ["k0"] and [f.name for f in info.fields] == ["x"]
    # describe sessions end with their answer and are not counted as sessions
    deadline = time.monotonic() + 30
    while c.stats().sessions_active != 1:  # the victim's; sid's ends with its stream
        assert time.monotonic() < deadline, c.stats()
        time.sleep(0.1)
    st = c.stats()
    assert st.sessions_created == 2 and st.sessions_failed == 1, st  # no describe counted
    server.assert_unharmed()


@pytest.mark.parametrize("isolation", ["process", "thread"])
def test_abandoned_bombs_do_not_stall_others(make_server, isolation):
    """Eight expensive requests from clients that give up after 0.3 s, sent
    over and over for a few seconds: another tenant's calls answer at once
    all along, and the abandoned work ends (no session is left behind)."""
    server = make_server("--isolation", isolation)
    c = server.client
    # under the whole-program budget, so each one runs long unless stopped
    heavy = bomb(depth=11, kernels=40)
    stop = time.monotonic() + 4.0
    errors = []

    def attacker(kind):
        while time.monotonic() < stop:
            try:
                if kind == 0:
                    describe(c)(pb.Source(text=heavy), timeout=0.3)
                else:
                    c.create(pb.CreateSessionRequest(source=pb.Source(text=heavy)), timeout=0.3)
            except grpc.RpcError as e:
                if e.code() not in (DEADLINE, EXHAUSTED, grpc.StatusCode.CANCELLED):
                    errors.append(f"{e.code()}: {e.details()}")

    threads = [threading.Thread(target=attacker, args=(i % 2,)) for i in range(8)]
    for t in threads:
        t.start()
    worst = 0.0
    probes = 0
    time.sleep(0.5)
    while time.monotonic() < stop:
        t0 = time.monotonic()
        server.assert_unharmed()  # health and the victim's field
        worst = max(worst, time.monotonic() - t0)
        probes += 1
        time.sleep(0.1)
    for t in threads:
        t.join(timeout=RPC_TIMEOUT)
    assert not errors, errors[:3]
    assert probes >= 5
    # a generous bound, for a loaded 2-core machine: these calls never wait
    # for a parse (they waited 30 s when parsing ran on the completion-queue
    # threads); under thread isolation the parses share the process's CPUs
    assert worst < 10.0, f"a bystander's call took {worst:.1f} s during the attack"
    # every abandoned parse ends: only the victim's session remains
    deadline = time.monotonic() + 30
    while c.stats().sessions_active != 1:
        assert time.monotonic() < deadline, c.stats()
        time.sleep(0.2)
    server.assert_unharmed()


def test_parse_deadline(make_server):
    """A parse within the work budget but past its time (compile_timeout_s) is
    one error saying so, and the session that asked goes on."""
    server = make_server("--compile-timeout-s", "1")
    c = server.client
    heavy = bomb(depth=11, kernels=200)  # stopped by time or by work, whichever comes first
    sid = c.create(pb.CreateSessionRequest(source=pb.Source(text=SMALL)),
                   timeout=RPC_TIMEOUT).session_id
    t0 = time.monotonic()
    try:
        c.register(pb.RegisterKernelsRequest(session_id=sid, source=pb.Source(text=heavy)),
                   timeout=RPC_TIMEOUT)
        raise AssertionError("the heavy program registered")
    except grpc.RpcError as e:
        details = e.details()
        assert ("compile_timeout_s" in details or "program too large" in details), details
    assert time.monotonic() - t0 < RPC_TIMEOUT
    ids = c.register(pb.RegisterKernelsRequest(session_id=sid, source=pb.Source(text=SMALL)),
                     timeout=RPC_TIMEOUT).kernel_ids
    assert list(c.run(sid, [(ids[0], [])]).errors) == []
    server.assert_unharmed()
