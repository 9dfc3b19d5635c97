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
RSS_BOUND_MIB, it is SERVING and the bystander's field is unchanged."""
import os
import threading
import time

from conftest import dense_layout, health_pb2, pb
from h2raw import Conn
from test_memory_budget import _kib, _status, small_quarantine  # noqa: F401 (a fixture)
from test_tls_tenants import daemons, sha, tenant_client  # noqa: F401 (a fixture)

BOUND = 10.0  # seconds: generous, a shared and noisy machine
RSS_BOUND_MIB = 150
HEALTH = "/grpc.health.v1.Health/Check"
READ = "/fusebox.v1.Fusebox/ReadField"
PATTERN = bytes((i * 53 + 7) % 256 for i in range(4 * 64))


def _rss_mib(pid):
    return _kib(_status(pid), "VmRSS") // 1024


def _bystander(d, token=None):
    """A client (with token: an authenticated tenant) and its session whose
    field holds PATTERN."""
    c = tenant_client(d.address, token)
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
    n = tenant_client(d.address, token)
    mine = n.create(pb.CreateSessionRequest(
        options=pb.SessionOptions(mode="sync"), layout=dense_layout(16)),
        timeout=BOUND).session_id
    assert n.write_field(mine, 2, b"\x05" * 64) == 64
    assert n.read_field(mine, 2) == b"\x05" * 64
    assert n._health(health_pb2.HealthCheckRequest(service=""),
                     timeout=BOUND).status == 1  # SERVING
    n.close()
    assert time.monotonic() - t < 4 * BOUND


def _rapid_reset(addr, conns, seconds, path):
    """conns connections, each writing HEADERS + RST_STREAM pairs in
    batches of 500 for seconds; a connection the server closes is opened
    again at once, as an attacker would. Returns (streams sent,
    connections closed by the server)."""
    cs = [Conn(addr) for _ in range(conns)]
    sent = closed = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for i, k in enumerate(cs):
            if k.closed or k.goaway:
                closed += 1
                k.close()
                cs[i] = k = Conn(addr)
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
