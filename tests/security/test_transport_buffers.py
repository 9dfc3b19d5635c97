"""gRPC's transport buffers (docs/security.md "The memory budget",
"Transport buffers"): a message that has arrived all but its last byte is
held by gRPC, never seen by fuseboxd, and no part of the memory budget
counts it. Before --transport-memory-bytes (a gRPC resource quota over the
whole server) a tenant that opened connections and calls, each sending a
message of max_message_bytes less one byte, grew fuseboxd by every byte of
them (Release, 8 connections x 16 calls of 4 MiB: VmHWM +516 MiB); and
before --max-calls and --max-calls-per-tenant, calls with small messages
held open grew it by about 13 KiB each (16,000 calls: +205 MiB).

HTTP/2 by hand (h2raw.py), as any tenant could write it. The tests check
fuseboxd's peak growth (VmHWM) against bounds the old code passed (under
AddressSanitizer with an 8 MiB quarantine), the refusals, that another
tenant's calls and field are unharmed and that the server is SERVING,
within a few seconds each."""
import os
import re
import time

import grpc
import pytest

from conftest import RPC_TIMEOUT, VICTIM_BYTES, dense_layout, i32, pb, store_kernel
from h2raw import Conn
from test_decoded_requests import _hwm_kib
from test_memory_budget import _kib, _status, small_quarantine  # noqa: F401 (a fixture)
from test_fair_share import metrics
from test_tls_tenants import daemons, sha, tenant_client  # noqa: F401 (a fixture)

MIB = 1 << 20
MAXMSG = 4 * MIB
QUOTA = 32 * MIB
REGISTER = "/fusebox.v1.Fusebox/RegisterKernels"
SESSION = "/fusebox.v1.Fusebox/Session"


def _flood(sock, conns, streams, paths, length, wait=2.0, token=None):
    """conns connections, each with streams calls (on paths in turn) whose
    messages of length bytes get all but their last byte, as far as the
    server's windows let within wait seconds a call. Returns the connections
    and [(connection, stream id)]."""
    cs = [Conn(sock, token) for _ in range(conns)]
    body = b"\x00" * (length - 1)
    calls = []
    for k in range(streams):
        for c in cs:
            sid = c.open(paths[k % len(paths)], length)
            calls.append((c, sid))
    deadline = time.monotonic() + wait
    for c, sid in calls:
        c.send(sid, body, deadline=max(deadline, time.monotonic() + 0.05))
    return cs, calls


def _states(calls):
    out = {}
    for c, sid in calls:
        s = c.state(sid)
        out[s] = out.get(s, 0) + 1
    return out


def _retry(call, tries=5):
    """call(), again after UNAVAILABLE: under the quota's pressure gRPC
    closes idle connections (GOAWAY), and a call may meet one closing."""
    for i in range(tries):
        try:
            return call()
        except grpc.RpcError as e:
            if e.code() != grpc.StatusCode.UNAVAILABLE or i == tries - 1:
                raise
            time.sleep(0.2)


def _works(client, victim, data=VICTIM_BYTES):
    """The victim's field still holds data, a new session registers and runs
    a kernel, the server is SERVING."""
    assert _retry(lambda: client.read_field(victim, 2)) == data, \
        "another tenant's field changed"
    sid = _retry(lambda: client.new_session(dense_layout(16)))
    kid = _retry(lambda: client.register(
        pb.RegisterKernelsRequest(session_id=sid, kernels=[store_kernel(2)]),
        timeout=RPC_TIMEOUT)).kernel_ids[0]
    sync = client.run(sid, [(kid, [i32(3), i32(41)])])
    assert not sync.errors and sync.seq == 1, sync
    assert _retry(client.health) == 1  # SERVING


def test_partial_messages_held_by_grpc(small_quarantine, make_server):  # noqa: F811
    """8 connections x 8 calls (RegisterKernels and Session streams), each
    with a message of max_message_bytes (4 MiB) less its last byte: 256 MiB
    that the old code held whole (VmHWM +318 MiB under Debug ASan without
    the quota, all 64 calls open). Under a 32 MiB quota gRPC cancels streams
    past it (+82 MiB, 57 calls cancelled); the victim's field and a new
    session are unharmed (during the attack and after), and the server
    serves."""
    server = make_server("--max-message-bytes", str(MAXMSG), "--transport-memory-bytes", str(QUOTA),
                         "--isolation", "thread")
    before = _hwm_kib(server)
    cs, calls = _flood(server.sock, 8, 8, [REGISTER, SESSION], MAXMSG - 64)
    grew = (_hwm_kib(server) - before) // 1024
    states = _states(calls)
    print("partial messages: peak grew by", grew, "MiB;", states)
    assert grew < 160, f"fuseboxd's peak grew by {grew} MiB: {states}"
    assert states.get("ended", 0) > 0, states  # gRPC cancelled some of them
    try:
        _works(server.client, server.victim)  # while the rest are held
    finally:
        for c in cs:
            c.close()
    _works(server.client, server.victim)
    server.assert_unharmed()


def test_unknown_method_holds_nothing(small_quarantine, make_server):  # noqa: F811
    """Calls on a path fuseboxd does not serve are answered UNIMPLEMENTED at
    once; their messages are not held (old code too: +5 MiB)."""
    server = make_server("--max-message-bytes", str(MAXMSG), "--transport-memory-bytes", str(QUOTA),
                         "--isolation", "thread")
    before = _hwm_kib(server)
    cs, calls = _flood(server.sock, 4, 8, ["/fusebox.v1.Fusebox/Nope"], MAXMSG - 64, wait=1.0)
    time.sleep(0.2)
    grew = (_hwm_kib(server) - before) // 1024
    states = _states(calls)
    for c in cs:
        c.close()
    assert states == {"ended": 32}, states
    assert grew < 48, f"fuseboxd's peak grew by {grew} MiB"
    assert "unknown method /fusebox.v1.Fusebox/Nope" in server.logtext()
    server.assert_unharmed()


def test_calls_held_open_per_tenant(small_quarantine, daemons):  # noqa: F811 (fixtures)
    """Tenant a opens 6,000 calls with small messages and holds them (the
    old code kept every one: VmHWM +103 MiB under Debug ASan). a may hold
    max_calls_per_tenant (200) of them (+27 MiB); the rest are refused
    RESOURCE_EXHAUSTED, naming the option; tenant b's calls go on meanwhile
    and its field is unchanged."""
    toks = {n: "tok-%s-" % n + os.urandom(8).hex() for n in ("a", "b")}
    d = daemons("unix", ["--max-calls-per-tenant", "200", "--max-calls", "1000",
                         "--isolation", "thread", "--metrics-listen", "127.0.0.1:0",
                         "--max-streams-per-connection", "1000"],  # 1,000 a connection
                tenants=[{"name": n, "token_sha256": [sha(toks[n])]} for n in ("a", "b")])
    b = tenant_client(d.address, toks["b"])
    pattern = bytes((i * 13 + 5) % 256 for i in range(64))
    mine = b.new_session(dense_layout(16))
    assert b.write_field(mine, 2, pattern) == len(pattern)
    before = _kib_hwm(d.proc.pid)
    cs, calls = _flood(d.address[len("unix:"):], 6, 1000, [REGISTER], 1000, wait=1.0,
                       token=toks["a"])
    time.sleep(0.5)
    grew = (_kib_hwm(d.proc.pid) - before) // 1024
    states = _states(calls)
    print("calls held open: peak grew by", grew, "MiB;", states)
    try:
        assert states.get("open", 0) <= 200 and states.get("ended", 0) >= 5800, states
        assert grew < 60, f"fuseboxd's peak grew by {grew} MiB: {states}"
        # a's next call is refused, naming the option
        a = tenant_client(d.address, toks["a"])
        with pytest.raises(grpc.RpcError) as ei:
            a.new_session(dense_layout(16))
        assert ei.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, ei.value
        assert "tenant 'a' has 200 calls open" in ei.value.details(), ei.value.details()
        assert "(max_calls_per_tenant)" in ei.value.details(), ei.value.details()
        a.close()
        # the operator sees the refusals, by limit (a's 5,800 or so, and the one above)
        n = _refused(metrics(d))
        assert n["max_calls_per_tenant"] >= 5000 and n["max_calls"] == 0, n
        # b is another tenant: its calls are not a's to use up
        _works(b, mine, pattern)
    finally:
        for c in cs:
            c.close()
    _works(b, mine, pattern)


HEALTH = "/grpc.health.v1.Health/Check"


def test_health_checks_without_credentials_held_open(daemons):  # noqa: F811 (a fixture)
    """With a tenants file a health check needs no credentials, so before
    they counted as a tenant a client with no token could hold max_calls
    Check calls open (each request all but its last byte) and every tenant's
    next call was refused (max_calls). Together they may hold
    max_calls_per_tenant (100) now; the rest are refused naming the option,
    and tenant b's calls, its field and SERVING are unharmed meanwhile."""
    tok = "tok-b-" + os.urandom(8).hex()
    ops = "tok-ops-" + os.urandom(8).hex()
    d = daemons("unix", ["--max-calls-per-tenant", "100", "--max-calls", "300",
                         "--isolation", "thread", "--metrics-listen", "127.0.0.1:0"],
                tenants=[{"name": "b", "token_sha256": [sha(tok)]},
                         {"name": "ops", "role": "admin", "token_sha256": [sha(ops)]}])
    b = tenant_client(d.address, tok)
    pattern = bytes((i * 29 + 3) % 256 for i in range(64))
    mine = b.new_session(dense_layout(16))
    assert b.write_field(mine, 2, pattern) == len(pattern)
    cs, calls = _flood(d.address[len("unix:"):], 4, 100, [HEALTH], 100, wait=1.0)
    time.sleep(0.5)
    states = _states(calls)
    print("health checks held open:", states)
    try:
        assert states.get("open", 0) <= 100 and states.get("ended", 0) >= 300, states
        # one more from a client with no token is refused, naming the option
        anon = tenant_client(d.address)
        with pytest.raises(grpc.RpcError) as ei:
            anon.health()
        assert ei.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, ei.value
        assert "no credentials" in ei.value.details(), ei.value.details()
        assert "(max_calls_per_tenant)" in ei.value.details(), ei.value.details()
        anon.close()
        n = _refused(metrics(d))
        assert n["max_calls_per_tenant"] >= 300 and n["max_calls"] == 0, n
        # b's calls were never the probes' to use up (its health check too)
        _works(b, mine, pattern)
    finally:
        for c in cs:
            c.close()
    time.sleep(0.3)
    anon = tenant_client(d.address)
    assert anon.health() == 1  # once they close, probes go on
    anon.close()
    # GetStats counts the refusals by limit, for an admin; a user tenant's
    # server-wide counters are its own or zero, these (others' calls) zero
    admin = tenant_client(d.address, ops)
    st = admin.stats()
    assert st.tenant_calls_refused >= 300 and st.calls_refused == 0, st
    admin.close()
    st = b.stats()
    assert st.tenant_calls_refused == 0 and st.calls_refused == 0, st
    _works(b, mine, pattern)


def test_max_calls(make_server):
    """Without a tenants file every client is one tenant: --max-calls bounds
    the calls open at once, all together. Past it a call is refused
    RESOURCE_EXHAUSTED naming the option; once they close, calls go on."""
    server = make_server("--max-calls", "100", "--isolation", "thread",
                         "--metrics-listen", "127.0.0.1:0",
                         "--max-streams-per-connection", "1000")  # 150 a connection
    cs, calls = _flood(server.sock, 2, 150, [REGISTER], 1000, wait=1.0)
    time.sleep(0.3)
    states = _states(calls)
    try:
        assert states.get("open", 0) <= 100 and states.get("ended", 0) >= 200, states
        with pytest.raises(grpc.RpcError) as ei:
            server.client.health()
        assert ei.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, ei.value
        assert "fuseboxd has 100 calls open" in ei.value.details(), ei.value.details()
        assert "(max_calls)" in ei.value.details(), ei.value.details()
        # /metrics is not a gRPC call: it answers while every call slot is taken
        n = _refused(metrics(server))
        assert n["max_calls"] >= 150 and n["max_calls_per_tenant"] == 0, n
    finally:
        for c in cs:
            c.close()
    time.sleep(0.3)
    # GetStats counts them too, once a call can be made again
    st = _retry(server.client.stats)
    assert st.calls_refused >= 150 and st.tenant_calls_refused == 0, st
    _works(server.client, server.victim)
    server.assert_unharmed()


def _refused(body):
    """fusebox_calls_refused_total by limit, from a /metrics page."""
    got = dict(re.findall(r'^fusebox_calls_refused_total\{limit="(\w+)"\} (\d+)$', body, re.M))
    assert set(got) == {"max_calls", "max_calls_per_tenant"}, body
    return {k: int(v) for k, v in got.items()}


def _kib_hwm(pid):
    return _kib(_status(pid), "VmHWM")
