"""HTTP/2 abuse with no credentials (docs/security.md "The transport"):
rapid reset (CVE-2023-44487: HEADERS then RST_STREAM at once, thousands a
second) and stream floods (streams opened and never finished, on many
connections), against a real fuseboxd on 127.0.0.1 TCP, through the HTTP/2
gate (server/h2gate.c) that fronts its plain listeners.

Before the gate, gRPC core 1.51 made a call of every HEADERS it read and
queued them for fuseboxd without bound: 4 connections resetting for 4 s
(74,000 streams) grew fuseboxd by 560 MiB (Debug ASan), a bystander's
ReadField took 34 s, and new calls were refused (max_calls) long after the
attack ended; 12 connections holding 2,000 streams each took every one of
max_calls, so another client's calls were refused.

Each test attacks for a few seconds on loopback only, and checks during and
right after it: a bystander's ReadField completes within BOUND seconds, a
new client's calls are accepted, fuseboxd's VmRSS grew by less than
RSS_BOUND_MIB, it is SERVING and the bystander's field is unchanged.

The same attack over TLS (the gate terminates TLS itself, so its budgets
see TLS clients' frames too): before, gRPC's own TLS took the attack
unbounded; and TLS handshakes that never finish are cut and count against
max_connections_per_ip."""
import os
import shutil
import signal
import socket
import ssl
import threading
import time
import warnings

import grpc

from conftest import Client, dense_layout, expect_error, health_pb2, pb
from h2raw import Conn, connect
from test_memory_budget import _kib, _status, small_quarantine  # noqa: F401 (a fixture)
from test_tls_tenants import (_Token, certs, daemons, sha,  # noqa: F401 (fixtures)
                              tenant_client, tls_creds)

BOUND = 10.0  # seconds: generous, a shared and noisy machine
RSS_BOUND_MIB = 150
HEALTH = "/grpc.health.v1.Health/Check"
READ = "/fusebox.v1.Fusebox/ReadField"
PATTERN = bytes((i * 53 + 7) % 256 for i in range(4 * 64))


def _rss_mib(pid):
    return _kib(_status(pid), "VmRSS") // 1024


def _client(d, token=None):
    """A stock grpcio client of d, over TLS where d.certs is set."""
    certs = getattr(d, "certs", None)
    if certs is None:
        return tenant_client(d.address, token)
    ch = grpc.secure_channel(d.address, tls_creds(certs),
                             [("grpc.ssl_target_name_override", "localhost")])
    if token is not None:
        ch = grpc.intercept_channel(ch, _Token("Bearer " + token))
    return Client(d.address, ch)


def _bystander(d, token=None):
    """A client (with token: an authenticated tenant) and its session whose
    field holds PATTERN."""
    c = _client(d, token)
    sid = c.new_session(dense_layout(64))
    assert c.write_field(sid, 2, PATTERN) == len(PATTERN)
    return c, sid


def _read(c, sid):
    """The bystander's ReadField, bounded by BOUND (DEADLINE_EXCEEDED fails)."""
    out = bytearray()
    for ch in c._read(pb.ReadFieldRequest(session_id=sid, field=2),
                      timeout=BOUND):
        out += ch.data
    return bytes(out)


def _during(attack, c, sid, d):
    """Run attack() in a thread; meanwhile the bystander reads its field
    again and again, each read within BOUND. Returns (attack's result,
    reads done, fuseboxd's peak VmRSS growth seen in MiB)."""
    before = _rss_mib(d.proc.pid)
    box = {}
    th = threading.Thread(target=lambda: box.setdefault("r", attack()))
    th.start()
    reads, peak = 0, before
    while th.is_alive():
        t = time.monotonic()
        assert _read(c, sid) == PATTERN, "the bystander's field changed"
        assert time.monotonic() - t < BOUND
        reads += 1
        peak = max(peak, _rss_mib(d.proc.pid))
        time.sleep(0.02)
    th.join()
    peak = max(peak, _rss_mib(d.proc.pid))
    return box.get("r"), reads, peak - before


def _after(d, c, sid, token=None):
    """Right after: the bystander's field, a new client's calls (a session
    made, written and read), SERVING, each within BOUND."""
    t = time.monotonic()
    assert _read(c, sid) == PATTERN
    n = _client(d, token)
    mine = n.create(pb.CreateSessionRequest(
        options=pb.SessionOptions(mode="sync"), layout=dense_layout(16)),
        timeout=BOUND).session_id
    assert n.write_field(mine, 2, b"\x05" * 64) == 64
    assert n.read_field(mine, 2) == b"\x05" * 64
    assert n._health(health_pb2.HealthCheckRequest(service=""),
                     timeout=BOUND).status == 1  # SERVING
    n.close()
    assert time.monotonic() - t < 4 * BOUND


def _rapid_reset(addr, conns, seconds, path, tls=None):
    """conns connections (tls: a function making an ssl.SSLContext for
    each), each writing HEADERS + RST_STREAM pairs in batches of 500 for
    seconds; a connection the server closes is opened again at once, as an
    attacker would. Returns (streams sent, connections closed by the
    server)."""
    def conn():
        return Conn(addr, tls=tls() if tls else None)
    cs = [conn() for _ in range(conns)]
    sent = closed = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for i, k in enumerate(cs):
            if k.closed or k.goaway:
                closed += 1
                k.close()
                cs[i] = k = conn()
            if k.rapid_reset(path, 500):
                sent += 500
    for k in cs:
        k.close()
    return sent, closed


def test_rapid_reset_no_credentials(small_quarantine, daemons):  # noqa: F811
    """4 connections with no token reset streams on a health check (which
    needs none) for 3 s, reconnecting when closed; tenant b reads its field
    meanwhile. The gate closes each connection past reset_rate: b's reads
    each take well under BOUND, fuseboxd grows less than RSS_BOUND_MIB,
    and new calls are taken right after."""
    tok = "tok-b-" + os.urandom(8).hex()
    d = daemons("127.0.0.1:0", ["--isolation", "thread"],
                tenants=[{"name": "b", "token_sha256": [sha(tok)]}])
    c, sid = _bystander(d, tok)
    (sent, closed), reads, grew = _during(
        lambda: _rapid_reset(d.address, 4, 3.0, HEALTH), c, sid, d)
    print(f"rapid reset: {sent} streams sent, {closed} connections closed, "
          f"{reads} reads meanwhile, VmRSS +{grew} MiB")
    assert sent >= 2000 and reads >= 1
    assert closed >= 4, "the server never closed a connection that reset streams"
    assert grew < RSS_BOUND_MIB, f"fuseboxd grew by {grew} MiB"
    _after(d, c, sid, tok)
    assert "faster than reset_rate allows (rapid reset)" in d.logtext()
    c.close()


def _tls_context(certs):
    """What a TLS client with no certificate has: the server's CA."""
    return lambda: ssl.create_default_context(cafile=certs["ca"] + ".pem")


def test_rapid_reset_over_tls(small_quarantine, certs, daemons):  # noqa: F811
    """The attack of test_rapid_reset_no_credentials on a TLS listener with
    a tenants file and token auth, as the Kubernetes example runs: any
    client can complete a server-only TLS handshake and reset streams on a
    health check. The gate terminates TLS, so reset_rate holds: it closes
    the connections, tenant b's reads (over TLS) go on, fuseboxd grows
    less than RSS_BOUND_MIB. (Before, on gRPC's own TLS, no connection was
    ever closed and fuseboxd grew without bound.)"""
    tok = "tok-b-" + os.urandom(8).hex()
    d = daemons("127.0.0.1:0", ["--isolation", "thread", "--tls-cert", certs["server"] + ".pem",
                                "--tls-key", certs["server"] + ".key"],
                tenants=[{"name": "b", "token_sha256": [sha(tok)]}])
    d.certs = certs
    c, sid = _bystander(d, tok)
    (sent, closed), reads, grew = _during(
        lambda: _rapid_reset(d.address, 4, 3.0, HEALTH, _tls_context(certs)), c, sid, d)
    print(f"rapid reset over TLS: {sent} streams sent, {closed} connections closed, "
          f"{reads} reads meanwhile, VmRSS +{grew} MiB")
    assert sent >= 2000 and reads >= 1
    assert closed >= 4, "the server never closed a TLS connection that reset streams"
    assert grew < RSS_BOUND_MIB, f"fuseboxd grew by {grew} MiB"
    _after(d, c, sid, tok)
    assert "faster than reset_rate allows (rapid reset)" in d.logtext()
    c.close()


def _closed_within(sock, seconds):
    """Does the server close sock (EOF or reset) within seconds?"""
    sock.settimeout(seconds)
    try:
        while sock.recv(4096):
            pass
        return True
    except (ConnectionError, ssl.SSLError):
        return True
    except socket.timeout:
        return False


def _handshake_error(addr, ctx):
    """The error of a TLS handshake with ctx that must fail."""
    raw = connect(addr)
    try:
        ctx.wrap_socket(raw, server_hostname="localhost").close()
    except ssl.SSLError as e:
        return str(e)
    finally:
        raw.close()
    raise AssertionError("the handshake succeeded")


def test_tls_handshakes_bounded(certs, daemons):  # noqa: F811
    """TLS handshakes that never finish (a TCP connection that says
    nothing, one that sends half a ClientHello) are cut after the gate's
    handshake deadline (5 s), and while they last they count against
    max_connections_per_ip: past it a new connection is closed at once. A
    client that does not offer ALPN "h2", or offers only TLS 1.1, gets no
    handshake. Through it all a TLS client is served."""
    d = daemons("127.0.0.1:0", ["--tls-cert", certs["server"] + ".pem",
                                "--tls-key", certs["server"] + ".key",
                                "--max-connections-per-ip", "4"])
    d.certs = certs
    silent = [connect(d.address) for _ in range(3)]
    half = connect(d.address)
    half.sendall(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03")  # a ClientHello's start
    over = connect(d.address)  # the 5th from 127.0.0.1: refused at once
    assert _closed_within(over, 10.0), "a 5th connection from one address was accepted"
    start = time.monotonic()
    for s in silent + [half]:
        assert _closed_within(s, 30.0), "a handshake that never finished was not cut"
        s.close()
    assert time.monotonic() - start < 30.0
    over.close()
    # no "h2" in ALPN, or TLS 1.1 only: the server refuses the handshake
    # (its alert, not the client's own refusal)
    ctx = ssl.create_default_context(cafile=certs["ca"] + ".pem")
    ctx.set_alpn_protocols(["http/1.1"])
    assert "alert no application protocol" in _handshake_error(d.address, ctx)
    old = ssl.create_default_context(cafile=certs["ca"] + ".pem")
    old.set_ciphers("DEFAULT:@SECLEVEL=0")  # lets this client offer TLS 1.1 at all
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        old.minimum_version = old.maximum_version = ssl.TLSVersion.TLSv1_1
    assert "ALERT_PROTOCOL_VERSION" in _handshake_error(d.address, old)
    c = _client(d)
    assert c._health(health_pb2.HealthCheckRequest(service=""), timeout=BOUND).status == 1
    c.close()
    log = d.logtext()
    assert "its TLS handshake was not done within 5 s" in log, log
    assert "max_connections_per_ip" in log, log
    assert "TLS handshake failed with" in log, log


def test_mtls_subjects_and_client_ca_reload_through_the_gate(certs, daemons, tmp_path):  # noqa: F811
    """mTLS terminated by the gate: the certificate it verified names the
    tenant (alice by "CN=alice"; bob, a valid certificate of no tenant's
    subject, is refused UNAUTHENTICATED naming it). SIGHUP with another
    client CA: new handshakes need a certificate from it (mallory, "CN=alice"
    from the rogue CA, is now alice; the real alice gets no handshake),
    alice's open connection goes on."""
    ca = str(tmp_path / "client-ca.pem")
    shutil.copy(certs["ca"] + ".pem", ca)
    d = daemons("127.0.0.1:0", ["--tls-cert", certs["server"] + ".pem",
                                "--tls-key", certs["server"] + ".key", "--tls-client-ca", ca],
                tenants=[{"name": "alice", "subjects": ["CN=alice"]}])
    opts = [("grpc.ssl_target_name_override", "localhost")]

    def client(who):
        return Client(d.address, grpc.secure_channel(d.address, tls_creds(certs, who), opts))

    alice = client("alice")
    sid = alice.new_session(dense_layout(64))
    assert alice.write_field(sid, 2, PATTERN) == len(PATTERN)
    bob = client("bob")
    expect_error(lambda: bob.new_session(dense_layout(8)), grpc.StatusCode.UNAUTHENTICATED,
                 "is no tenant's subject")
    expect_error(client("mallory").health, grpc.StatusCode.UNAVAILABLE)
    shutil.copy(certs["rogue"] + ".pem", ca)
    d.proc.send_signal(signal.SIGHUP)
    d.wait_log(r"SIGHUP: TLS certificate reloaded from .*client CA from", "client CA reload")
    mallory = client("mallory")  # "CN=alice" from the CA now configured: alice
    assert mallory.read_field(sid, 2) == PATTERN
    expect_error(client("alice").health, grpc.StatusCode.UNAVAILABLE)  # a new handshake
    assert alice.read_field(sid, 2) == PATTERN  # the open connection keeps its handshake
    for c in (alice, bob, mallory):
        c.close()
    assert "TLS handshake failed with" in d.logtext()


def _states(pairs):
    out = {}
    for k, ss in pairs:
        for s in ss:
            st = k.state(s)
            out[st] = out.get(st, 0) + 1
    return out


def _open_streams(k, n):
    """n streams on k, HEADERS only, never finished: the first 50 at once,
    the rest once the server's SETTINGS have surely been acknowledged."""
    sids = k.flood(READ, min(n, 50))
    time.sleep(0.2)
    return sids + (k.flood(READ, n - 50) if n > 50 else [])


def _stream_flood(addr, over, held, extra, seconds):
    """Two waves from one address: over connections of 2,000 streams each
    (past max_streams_per_connection), until the server has closed them or
    seconds passed; then held connections of 100 streams each, held, and
    extra more connections tried. Returns ({state: streams} of the first
    wave, of the second, and the extra connections the server closed)."""
    big = [Conn(addr) for _ in range(over)]
    first = [(k, _open_streams(k, 2000)) for k in big]
    end = time.monotonic() + seconds
    while time.monotonic() < end and not all(k.closed for k in big):
        time.sleep(0.05)
    s1 = _states(first)
    for k in big:
        k.close()
    cs = [Conn(addr) for _ in range(held)]
    second = [(k, _open_streams(k, 100)) for k in cs]
    more = [Conn(addr) for _ in range(extra)]
    end = time.monotonic() + seconds
    while time.monotonic() < end and sum(1 for k in more if k.closed) < extra - (16 - held):
        time.sleep(0.05)
    s2 = _states(second)
    shut = sum(1 for k in more if k.closed)
    for k in cs + more:
        k.close()
    return s1, s2, shut


def test_stream_flood_many_connections(small_quarantine, daemons):  # noqa: F811
    """No tenants file (every client alike). First 2 connections open 2,000
    streams each and never finish them: past max_streams_per_connection
    (100) gRPC closes them. Then 12 connections hold 100 streams each and 30
    more connections are tried: the gate refuses those past
    max_connections_per_ip (16). The 1,200 calls held are far from
    max_calls: the bystander's reads and a new client's calls go on, and
    fuseboxd grows less than RSS_BOUND_MIB."""
    d = daemons("127.0.0.1:0", ["--isolation", "thread"])
    c, sid = _bystander(d)
    (s1, s2, shut), reads, grew = _during(
        lambda: _stream_flood(d.address, 2, 12, 30, 3.0), c, sid, d)
    print(f"stream flood: {s1} then {s2}, {shut} of 30 more connections closed, {reads} reads "
          f"meanwhile, VmRSS +{grew} MiB")
    assert reads >= 1
    assert s1.get("open", 0) == 0, s1  # their connections were closed
    assert s2.get("open", 0) == 12 * 100, s2  # the ones within the limits are served
    assert shut >= 30 - (16 - 12), shut  # 127.0.0.1 may hold 16 (the bystander one of them)
    assert grew < RSS_BOUND_MIB, f"fuseboxd grew by {grew} MiB"
    _after(d, c, sid)
    assert "max_connections_per_ip" in d.logtext()
    c.close()


def test_options_shown_and_checked():
    """The transport's options are in --help, and a bad value stops the
    start with an error naming the option."""
    import subprocess

    from conftest import FUSEBOXD
    out = subprocess.run([FUSEBOXD, "--help"], capture_output=True, text=True, timeout=30).stdout
    for flag in ("--max-streams-per-connection", "--max-connections", "--max-connections-per-ip",
                 "--stream-rate", "--reset-rate"):
        assert flag in out, flag
    r = subprocess.run([FUSEBOXD, "--listen", "127.0.0.1:0", "--reset-rate", "0"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode != 0 and "--reset-rate: invalid value '0'" in r.stdout + r.stderr, r
