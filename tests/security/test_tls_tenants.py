"""TLS, mTLS, tokens, tenants and metrics, through a real fuseboxd and a
stock grpcio client (docs/security.md, "Tenants and TLS").

Certificates are made per module with the `openssl` command line (skipped
when it is missing): a CA, a server certificate for 127.0.0.1/localhost,
client certificates for alice and bob, and a rogue CA with a client
certificate of its own. Tokens are random; the tenants file holds only
their SHA-256. Every server listens on loopback or a unix socket."""
import hashlib
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

import grpc
import pytest

from conftest import (BUILD, FUSEBOXD, RPC_TIMEOUT, Client, dense_layout, expect_error, health_pb2,
                      i32, pb, store_kernel, terminate)

sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/
from test_lists import c_counter_entries  # noqa: E402 (FB_COUNTERS, read from counters.h)

UNAUTH = grpc.StatusCode.UNAUTHENTICATED
DENIED = grpc.StatusCode.PERMISSION_DENIED
EXHAUSTED = grpc.StatusCode.RESOURCE_EXHAUSTED
UNAVAILABLE = grpc.StatusCode.UNAVAILABLE
FUSEBOX = os.path.abspath(os.path.join(BUILD, "client", "fusebox"))
PATTERN = bytes((i * 13 + 5) % 256 for i in range(4 * 64))


# ---------------------------------------------------------------- certificates

def _openssl(*args, cwd):
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def _issue(d, name, subject, ca, ext=None):
    _openssl("req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", name + ".key", "-out", name + ".csr", "-subj", subject, cwd=d)
    args = ["x509", "-req", "-in", name + ".csr", "-CA", ca + ".pem", "-CAkey", ca + ".key",
            "-CAcreateserial", "-days", "2", "-out", name + ".pem"]
    if ext:
        with open(os.path.join(d, name + ".ext"), "w") as f:
            f.write(ext)
        args += ["-extfile", name + ".ext"]
    _openssl(*args, cwd=d)


@pytest.fixture(scope="module")
def certs():
    if not shutil.which("openssl"):
        pytest.skip("the openssl command line is not installed")
    tmp = tempfile.TemporaryDirectory(prefix="fbtls-")
    d = tmp.name
    for ca in ("ca", "rogue"):
        _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                 "-nodes", "-keyout", ca + ".key", "-out", ca + ".pem", "-days", "2",
                 "-subj", "/CN=Fusebox test " + ca, cwd=d)
    _issue(d, "server", "/CN=localhost", "ca",
           "subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n")
    for who in ("alice", "bob"):
        _issue(d, who, "/CN=" + who, "ca", "extendedKeyUsage=clientAuth\n")
    _issue(d, "mallory", "/CN=alice", "rogue", "extendedKeyUsage=clientAuth\n")
    yield {k: os.path.join(d, k) for k in ("ca", "rogue", "server", "alice", "bob", "mallory")}
    tmp.cleanup()


def _read(path):
    with open(path, "rb") as f:
        return f.read()


def tls_creds(certs, who=None, ca="ca"):
    key = _read(certs[who] + ".key") if who else None
    chain = _read(certs[who] + ".pem") if who else None
    return grpc.ssl_channel_credentials(root_certificates=_read(certs[ca] + ".pem"),
                                        private_key=key, certificate_chain=chain)


# ---------------------------------------------------------------- tokens

class _Token(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor,
             grpc.StreamUnaryClientInterceptor, grpc.StreamStreamClientInterceptor):
    """Adds an authorization header to every call (any channel)."""

    def __init__(self, value):
        self.value = value

    def _details(self, d):
        md = list(d.metadata or []) + [("authorization", self.value)]
        return d._replace(metadata=md) if hasattr(d, "_replace") else _Details(d, md)

    def intercept_unary_unary(self, cont, d, req):
        return cont(self._details(d), req)

    def intercept_unary_stream(self, cont, d, req):
        return cont(self._details(d), req)

    def intercept_stream_unary(self, cont, d, it):
        return cont(self._details(d), it)

    def intercept_stream_stream(self, cont, d, it):
        return cont(self._details(d), it)


class _Details(grpc.ClientCallDetails):
    def __init__(self, d, md):
        self.method, self.timeout, self.metadata = d.method, d.timeout, md
        self.credentials = d.credentials
        self.wait_for_ready = getattr(d, "wait_for_ready", None)
        self.compression = getattr(d, "compression", None)


def tenant_client(address, token=None, header=None):
    """A plain channel (unix socket or loopback) sending 'Bearer token'."""
    ch = grpc.insecure_channel(address)
    if token is not None or header is not None:
        ch = grpc.intercept_channel(ch, _Token(header or "Bearer " + token))
    return Client(address, ch)


def sha(token):
    return hashlib.sha256(token.encode()).hexdigest()


# ---------------------------------------------------------------- the server

class Daemon:
    """fuseboxd on addr (unix:PATH, or 127.0.0.1:0 whose port --ready-fd
    tells), with its log in a file."""

    def __init__(self, tmp, addr, args=(), expect_start=True):
        self.tmp = tmp
        self.logpath = os.path.join(tmp, "fuseboxd.log")
        self.log = open(self.logpath, "w+")
        r, w = os.pipe()
        self.proc = subprocess.Popen(
            [FUSEBOXD, "--listen", addr, "--backend", "cpu", "--shutdown-grace-s", "5",
             "--ready-fd", str(w), *args], stdout=self.log, stderr=subprocess.STDOUT,
            pass_fds=(w,))
        os.close(w)
        with os.fdopen(r) as f:
            line = f.readline()  # EOF when it exits before serving
        self.address = line.strip()
        self.expect_start = expect_start
        if expect_start and not self.address:
            self.proc.wait(timeout=60)
            raise AssertionError("fuseboxd did not start:\n" + self.logtext())

    def logtext(self):
        if not self.log.closed:
            self.log.flush()
        with open(self.logpath) as f:
            return f.read()

    def wait_log(self, pattern, what):
        """Until the log matches pattern (bounded: a SIGHUP's effect)."""
        deadline = time.monotonic() + 30
        while not re.search(pattern, self.logtext()):
            assert self.proc.poll() is None, "fuseboxd died:\n" + self.logtext()
            assert time.monotonic() < deadline, f"no {what} in the log:\n" + self.logtext()
            time.sleep(0.05)

    def stop(self):
        rc = terminate(self.proc, self.logtext)
        self.log.close()
        if not self.expect_start:
            return  # a server that was meant not to start: its exit status was checked
        assert rc == 0, f"fuseboxd exited with {rc}:\n" + self.logtext()


@pytest.fixture
def daemons():
    made, tmps = [], []

    def make(addr="unix", args=(), tenants=None, expect_start=True):
        tmp = tempfile.TemporaryDirectory(prefix="fbten-")
        tmps.append(tmp)
        if addr == "unix":
            addr = "unix:" + os.path.join(tmp.name, "fuseboxd.sock")
        args = list(args)
        if tenants is not None:
            path = os.path.join(tmp.name, "tenants.json")
            with open(path, "w") as f:
                json.dump({"tenants": tenants}, f)
            args += ["--tenants", path]
        d = Daemon(tmp.name, addr, args, expect_start)
        d.tenants_path = os.path.join(tmp.name, "tenants.json")
        made.append(d)
        return d

    yield make
    errors = []
    for d in made:
        try:
            d.stop()
        except AssertionError as e:
            errors.append(str(e))
    for t in tmps:
        t.cleanup()
    assert not errors, "\n".join(errors)


def serving(client):
    return client.health() == health_pb2.HealthCheckResponse.SERVING


def session_with_pattern(client):
    sid = client.new_session(dense_layout(64))
    assert client.write_field(sid, 2, PATTERN) == len(PATTERN)
    return sid


# ---------------------------------------------------------------- TLS

def test_tls_server_and_stock_client(certs, daemons):
    d = daemons("127.0.0.1:0", ["--tls-cert", certs["server"] + ".pem",
                                "--tls-key", certs["server"] + ".key"])
    opts = [("grpc.ssl_target_name_override", "localhost")]
    c = Client(d.address, grpc.secure_channel(d.address, tls_creds(certs), opts))
    assert serving(c)
    sid = session_with_pattern(c)
    assert c.read_field(sid, 2) == PATTERN
    # plaintext to a TLS port, and TLS that trusts another CA: no connection
    plain = Client(d.address)
    expect_error(plain.health, UNAVAILABLE)
    rogue = Client(d.address, grpc.secure_channel(d.address, tls_creds(certs, ca="rogue"), opts))
    expect_error(rogue.health, UNAVAILABLE)
    assert serving(c)
    for x in (c, plain, rogue):
        x.close()


def test_mtls_requires_a_client_certificate(certs, daemons):
    d = daemons("127.0.0.1:0", ["--tls-cert", certs["server"] + ".pem",
                                "--tls-key", certs["server"] + ".key",
                                "--tls-client-ca", certs["ca"] + ".pem"],
                tenants=[{"name": "alice", "subjects": ["CN=alice"]},
                         {"name": "bob", "subjects": ["CN=bob"]}])
    opts = [("grpc.ssl_target_name_override", "localhost")]

    def client(who, ca="ca"):
        return Client(d.address, grpc.secure_channel(d.address, tls_creds(certs, who, ca), opts))

    alice, bob = client("alice"), client("bob")
    sid = session_with_pattern(alice)
    # no certificate, and a certificate "CN=alice" from another CA: no handshake
    expect_error(client(None).health, UNAVAILABLE)
    expect_error(client("mallory").health, UNAVAILABLE)
    # bob's good certificate names bob, who may not touch alice's session
    expect_error(lambda: bob.read_field(sid, 2), DENIED, "another tenant")
    assert alice.read_field(sid, 2) == PATTERN
    assert serving(alice)


def test_tls_settings_are_checked(certs, daemons):
    # a plain TCP port off loopback needs --insecure; refused before binding
    d = daemons("0.0.0.0:0", expect_start=False)
    assert d.proc.wait(timeout=60) == 1
    assert "refusing plain TCP on '0.0.0.0:0'" in d.logtext() and "--insecure" in d.logtext()
    d = daemons("127.0.0.1:0", ["--tls-cert", certs["server"] + ".pem"], expect_start=False)
    assert d.proc.wait(timeout=60) == 1
    assert "TLS needs both --tls-cert and --tls-key" in d.logtext()
    d = daemons("127.0.0.1:0", ["--tls-cert", certs["server"] + ".key",
                                "--tls-key", certs["server"] + ".key"], expect_start=False)
    assert d.proc.wait(timeout=60) == 1
    assert "--tls-cert" in d.logtext() and "not PEM" in d.logtext()


def test_tls_certificate_reloads_on_sighup(certs, daemons, tmp_path):
    """SIGHUP re-reads the certificate and key: new connections get the new
    one (signed by another CA), and a pair that does not fit is refused and
    changes nothing."""
    _issue(os.path.dirname(certs["rogue"]), "server2", "/CN=localhost", "rogue",
           "subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n")
    cert, key = str(tmp_path / "tls.pem"), str(tmp_path / "tls.key")
    shutil.copy(certs["server"] + ".pem", cert)
    shutil.copy(certs["server"] + ".key", key)
    d = daemons("127.0.0.1:0", ["--tls-cert", cert, "--tls-key", key])
    opts = [("grpc.ssl_target_name_override", "localhost")]

    def client(ca):
        return Client(d.address, grpc.secure_channel(d.address, tls_creds(certs, ca=ca), opts))

    old = client("ca")
    sid = session_with_pattern(old)
    expect_error(client("rogue").health, UNAVAILABLE)
    server2 = os.path.join(os.path.dirname(certs["rogue"]), "server2")
    shutil.copy(server2 + ".pem", cert)
    shutil.copy(server2 + ".key", key)
    d.proc.send_signal(signal.SIGHUP)
    d.wait_log(r"SIGHUP: TLS certificate reloaded from", "certificate reload")
    new = client("rogue")
    assert serving(new)  # the new certificate is served ...
    expect_error(client("ca").health, UNAVAILABLE)  # ... and only it, to new connections
    assert old.read_field(sid, 2) == PATTERN  # an open connection keeps going
    # a key that is not the certificate's: refused, the running pair stays
    shutil.copy(certs["server"] + ".key", key)
    d.proc.send_signal(signal.SIGHUP)
    d.wait_log(r"TLS certificate not reloaded, keeping the running one: --tls-key does not "
               r"belong to the --tls-cert certificate", "refused certificate reload")
    assert serving(client("rogue"))
    # at start the same check stops the server
    bad = daemons("127.0.0.1:0", ["--tls-cert", cert, "--tls-key", key], expect_start=False)
    assert bad.proc.wait(timeout=60) == 1
    assert "--tls-key does not belong to the --tls-cert certificate" in bad.logtext()


# ---------------------------------------------------------------- tokens and tenants

@pytest.fixture
def tenants(daemons):
    toks = {n: secrets.token_urlsafe(24) for n in ("alice", "bob", "root")}
    spec = [{"name": "alice", "token_sha256": [sha(toks["alice"])],
             "limits": {"max_sessions": 3}},
            {"name": "bob", "role": "user", "token_sha256": [sha(toks["bob"])],
             "limits": {"memory_bytes": "64K"}},
            {"name": "root", "role": "admin", "token_sha256": [sha(toks["root"])]}]
    d = daemons("unix", ["--metrics-listen", "127.0.0.1:0"], tenants=spec)
    clients = {n: tenant_client(d.address, t) for n, t in toks.items()}
    yield d, toks, clients, spec
    for c in clients.values():
        c.close()


def test_tokens(tenants):
    d, toks, cl, _ = tenants
    anon = tenant_client(d.address)
    wrong = tenant_client(d.address, secrets.token_urlsafe(24))
    basic = tenant_client(d.address, header="Basic " + toks["alice"])
    lay = dense_layout(8)
    expect_error(lambda: anon.new_session(lay), UNAUTH, "no credentials")
    expect_error(lambda: wrong.new_session(lay), UNAUTH, "unknown token")
    expect_error(lambda: basic.new_session(lay), UNAUTH, "Bearer")
    info = anon.channel.unary_unary("/fusebox.v1.Fusebox/GetInfo",
                                    request_serializer=pb.InfoRequest.SerializeToString,
                                    response_deserializer=pb.ServerInfo.FromString)
    expect_error(lambda: info(pb.InfoRequest(), timeout=RPC_TIMEOUT), UNAUTH)
    assert serving(anon)  # the health check needs no identity
    assert cl["alice"].new_session(lay)
    log = d.logtext()
    assert re.search(r"auth: fusebox\.v1\.Fusebox/CreateSession refused from unix:.*unknown token",
                     log), log
    for t in toks.values():
        assert t not in log, "a token reached the log"
    for x in (anon, wrong, basic):
        x.close()


def test_tenant_b_cannot_touch_tenant_a(tenants):
    d, _, cl, _ = tenants
    alice, bob, root = cl["alice"], cl["bob"], cl["root"]
    sid = session_with_pattern(alice)
    kid = alice.register(pb.RegisterKernelsRequest(session_id=sid, kernels=[store_kernel(2)]),
                         timeout=RPC_TIMEOUT).kernel_ids[0]
    for name, attack in [
            ("read", lambda: bob.read_field(sid, 2)),
            ("write", lambda: bob.write_field(sid, 2, bytes(len(PATTERN)))),
            ("register", lambda: bob.register(pb.RegisterKernelsRequest(
                session_id=sid, kernels=[store_kernel(2)]), timeout=RPC_TIMEOUT)),
            ("stream", lambda: bob.run(sid, [(kid, [i32(0), i32(99)])])),
            ("close", lambda: bob.close_session(pb.CloseSessionRequest(session_id=sid),
                                                timeout=RPC_TIMEOUT)),
            ("stats", lambda: _stats(bob, sid)),
            ("admin write", lambda: root.write_field(sid, 2, bytes(len(PATTERN))))]:
        expect_error(attack, DENIED, "another tenant")
    assert serving(alice)
    assert alice.read_field(sid, 2) == PATTERN, "the attacks changed alice's field"
    # an admin may look at any session by id; alice still computes
    assert _stats(root, sid).sessions[0].tag == sid
    res = alice.run(sid, [(kid, [i32(1), i32(77)])])
    assert list(res.errors) == []
    assert "on session" in d.logtext() and "denied" in d.logtext()


def _stats(client, sid=""):
    call = client.channel.unary_unary("/fusebox.v1.Fusebox/GetStats",
                                      request_serializer=pb.StatsRequest.SerializeToString,
                                      response_deserializer=pb.ServerStats.FromString)
    return call(pb.StatsRequest(session_id=sid), timeout=RPC_TIMEOUT)


def test_getstats_shows_a_tenant_its_own_sessions(tenants):
    _, _, cl, _ = tenants
    a = [cl["alice"].new_session(dense_layout(8)) for _ in range(2)]
    b = [cl["bob"].new_session(dense_layout(8), memory_limit=4096)]
    mine = _stats(cl["alice"])
    assert sorted(s.tag for s in mine.sessions) == sorted(x[:8] for x in a)
    assert mine.sessions_active == 2 and mine.launches == 0 and mine.bytes_in == 0
    theirs = _stats(cl["bob"])
    assert [s.tag for s in theirs.sessions] == [b[0][:8]]
    everyone = _stats(cl["root"])
    assert sorted(s.tag for s in everyone.sessions) == sorted(x[:8] for x in a + b)
    assert everyone.sessions_active == 3 and everyone.bytes_in > 0


def test_per_tenant_limits(tenants):
    d, _, cl, _ = tenants
    alice, bob = cl["alice"], cl["bob"]
    held = [alice.new_session(dense_layout(8)) for _ in range(3)]
    expect_error(lambda: alice.new_session(dense_layout(8)), EXHAUSTED, "tenant 'alice'",
                 "max_sessions 3")
    alice.close_session(pb.CloseSessionRequest(session_id=held[0]), timeout=RPC_TIMEOUT)
    # the slot comes back once the session has left the table
    deadline = time.monotonic() + 30
    while True:
        try:
            held.append(alice.new_session(dense_layout(8)))
            break
        except grpc.RpcError as e:
            assert e.code() == EXHAUSTED and time.monotonic() < deadline, e.details()
            time.sleep(0.05)
    # bob: 64 KiB in all, counted by the sessions' memory limits
    two = [bob.new_session(dense_layout(8), memory_limit=32 << 10) for _ in range(2)]
    expect_error(lambda: bob.new_session(dense_layout(8), memory_limit=32 << 10), EXHAUSTED,
                 "tenant 'bob'", "memory_bytes 65536")
    expect_error(lambda: bob.new_session(dense_layout(8)), EXHAUSTED, "memory_bytes")
    # a layout larger than the whole budget
    bob.close_session(pb.CloseSessionRequest(session_id=two[0]), timeout=RPC_TIMEOUT)
    expect_error(lambda: bob.new_session(dense_layout(65536)), EXHAUSTED)
    # other tenants are not affected
    assert cl["root"].new_session(dense_layout(8))
    assert serving(alice)
    assert "is at its session limit" in d.logtext()


def test_tenants_file_reloads_on_sighup(tenants):
    d, toks, cl, spec = tenants
    carol = secrets.token_urlsafe(24)
    sid = cl["bob"].new_session(dense_layout(8), memory_limit=4096)
    new = [t for t in spec if t["name"] != "bob"]
    new.append({"name": "carol", "token_sha256": [sha(carol)]})
    with open(d.tenants_path, "w") as f:
        json.dump({"tenants": new}, f)
    d.proc.send_signal(signal.SIGHUP)
    d.wait_log(r"SIGHUP: reloaded 3 tenants", "tenants reload")
    c = tenant_client(d.address, carol)
    assert c.new_session(dense_layout(8))
    expect_error(lambda: cl["bob"].new_session(dense_layout(8)), UNAUTH, "unknown token")
    # a bad file changes nothing
    with open(d.tenants_path, "w") as f:
        f.write('{"tenants": [{"name": "x", "token": "plain"}]}')
    d.proc.send_signal(signal.SIGHUP)
    d.wait_log(r"tenants file not reloaded.*unknown key 'token'", "refused reload")
    assert c.new_session(dense_layout(8))
    # bob's session is still bob's: carol may not take it over
    expect_error(lambda: c.read_field(sid, 2), DENIED)
    c.close()


def test_bad_tenants_file_stops_start(daemons):
    for bad, words in [
            ([{"name": "a", "token_sha256": ["abc"]}], "64 hex digits"),
            ([{"name": "a"}], "nobody could be this tenant"),
            ([{"name": "a b", "subjects": ["CN=a"]}], "tenants[0].name"),
            ([{"name": "a", "subjects": ["CN=a"], "role": "root"}], "role"),
            ([{"name": "a", "subjects": ["CN=a"]}, {"name": "b", "subjects": ["CN=a"]}],
             "share the subject"),
            ([{"name": "a", "subjects": ["CN=a"], "limits": {"gpus": 1}}], "unknown key 'gpus'")]:
        d = daemons("unix", tenants=bad, expect_start=False)
        assert d.proc.wait(timeout=60) == 1
        for w in words if isinstance(words, tuple) else (words,):
            assert w in d.logtext(), d.logtext()


def test_json_log_lines(daemons):
    tok = secrets.token_urlsafe(24)
    d = daemons("unix", ["--log-format", "json"],
                tenants=[{"name": "a", "token_sha256": [sha(tok)]}])
    c = tenant_client(d.address, 'x"y\\z')
    expect_error(lambda: c.new_session(dense_layout(8)), UNAUTH)
    c.close()
    d.wait_log(r"unknown token", "auth refusal")
    lines = [json.loads(x) for x in d.logtext().splitlines() if x.strip()]
    assert all(set(x) == {"time", "level", "msg"} for x in lines), lines
    refusal = [x for x in lines if "unknown token" in x["msg"]]
    assert refusal and refusal[0]["level"] == "warn" and "from unix:" in refusal[0]["msg"]


def test_refusals_do_not_flood_the_log(daemons):
    """Past 20 refusal lines a second the rest are only counted; every
    refusal is either a line or in a later 'N more refusals' line."""
    d = daemons("unix", tenants=[{"name": "a", "subjects": ["CN=a"]}])
    c = tenant_client(d.address, "wrong")
    n = 60
    for _ in range(n):
        expect_error(lambda: c.new_session(dense_layout(8)), UNAUTH)
    time.sleep(1.1)  # into a new one-second window: the next line reports the count
    expect_error(lambda: c.new_session(dense_layout(8)), UNAUTH)
    c.close()
    # (each line is written before its call is answered)
    log = d.logtext()
    lines = len(re.findall(r"CreateSession refused from", log))
    skipped = sum(int(x) for x in re.findall(r"auth: (\d+) more refusals not logged", log))
    assert lines + skipped == n + 1, log


# ---------------------------------------------------------------- metrics

def _get(url):
    try:
        with urllib.request.urlopen(url, timeout=RPC_TIMEOUT) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def _read_repo(rel):
    with open(os.path.join(os.path.dirname(__file__), "..", "..", rel), encoding="utf-8") as f:
        return f.read()


def test_metrics_endpoint(tenants):
    d, toks, cl, spec = tenants
    m = re.search(r"metrics on (http://127\.0\.0\.1:\d+)/metrics", d.logtext())
    assert m, d.logtext()
    base = m.group(1)
    sid = cl["alice"].new_session(dense_layout(8))
    sid2 = cl["alice"].new_session(dense_layout(8))
    kid2 = cl["alice"].register(pb.RegisterKernelsRequest(session_id=sid2,
                                                          kernels=[store_kernel(2)]),
                                timeout=RPC_TIMEOUT).kernel_ids[0]
    # the stream stays open (and sid2 alive) until the metrics are read
    release = threading.Event()

    def requests():
        yield pb.SessionRequest(session_id=sid2, sync=1, launches=[
            pb.Launch(kernel=kid2, args=[i32(1), i32(2)]),
            pb.Launch(kernel=kid2, args=[i32(2), i32(3)])])
        release.wait(RPC_TIMEOUT)

    stream = cl["alice"]._stream(requests(), timeout=RPC_TIMEOUT)
    assert list(next(stream).sync.errors) == []
    # an async session whose two launches the optimizer fuses into one task
    sid3 = cl["alice"].new_session(dense_layout(8), mode="async")
    kid3 = cl["alice"].register(pb.RegisterKernelsRequest(session_id=sid3,
                                                          kernels=[store_kernel(2)]),
                                timeout=RPC_TIMEOUT).kernel_ids[0]
    r3 = list(cl["alice"]._stream(iter([pb.SessionRequest(session_id=sid3, sync=1, launches=[
        pb.Launch(kernel=kid3, args=[i32(1), i32(4)]),
        pb.Launch(kernel=kid3, args=[i32(2), i32(5)])])]), timeout=RPC_TIMEOUT))
    assert r3 and list(r3[0].sync.errors) == []
    expect_error(lambda: tenant_client(d.address, "nope").new_session(dense_layout(8)), UNAUTH)
    expect_error(lambda: cl["bob"].read_field(sid, 2), DENIED)
    st, body = _get(base + "/metrics")
    assert st == 200
    vals = {}
    for line in body.splitlines():
        if line and not line.startswith("#"):
            k, v = line.rsplit(" ", 1)
            vals[k] = float(v)
    assert vals["fusebox_up"] == 1
    assert vals["fusebox_sessions"] >= 2
    assert vals["fusebox_auth_failures_total"] >= 1
    assert vals["fusebox_received_bytes_total"] > 0
    assert vals['fusebox_tenant_sessions{tenant="alice"}'] in (2, 3)  # sid3's stream ended: it may still be closing
    assert vals['fusebox_tenant_sessions{tenant="bob"}'] == 0
    assert vals['fusebox_tenant_sessions_limit{tenant="alice"}'] == 3
    assert vals['fusebox_tenant_memory_limit_bytes{tenant="bob"}'] == 65536
    assert vals['fusebox_tenant_denied_total{tenant="bob"}'] == 1
    assert vals['fusebox_tenant_memory_bytes{tenant="alice"}'] > 0
    assert vals['fusebox_tenant_launches_total{tenant="alice"}'] == 4
    # what the engines did, summed per tenant from the sessions' counters:
    # every counter of FB_COUNTERS, for the server and for each tenant
    for name, kind, level in c_counter_entries(_read_repo("include/fusebox/counters.h")):
        fam = name[:-2] + "_seconds" if kind == "float" and name.endswith("_s") else name
        fam = "fusebox_" + fam + ("" if level == "LEVEL" else "_total")
        tfam = fam.replace("fusebox_", "fusebox_tenant_", 1)
        mtype = "gauge" if level == "LEVEL" else "counter"
        for f in (fam, tfam):
            assert body.count("# TYPE %s %s\n" % (f, mtype)) == 1, (f, mtype)
            assert re.search(r"^# HELP %s (Now, s|S)ummed over the (tenant's )?(live )?sessions"
                             r"( since start)?: \S" % f, body, flags=re.M), f
        assert vals[fam] >= 0
        for t in ("alice", "bob"):
            assert vals['%s{tenant="%s"}' % (tfam, t)] >= 0
        if level == "SUM":  # bob ran nothing
            assert vals['%s{tenant="bob"}' % tfam] == 0, tfam
            assert vals[fam] >= vals['%s{tenant="alice"}' % tfam], fam
    assert vals['fusebox_tenant_tasks_launched_total{tenant="alice"}'] >= 3
    assert vals['fusebox_tenant_tasks_compiled_total{tenant="alice"}'] >= 1
    assert vals['fusebox_tenant_tasks_fused_total{tenant="alice"}'] >= 1
    assert vals['fusebox_tenant_compile_seconds_total{tenant="alice"}'] > 0
    assert vals['fusebox_tenant_device_bytes{tenant="alice"}'] > 0  # its live sessions
    assert vals['fusebox_tenant_device_bytes{tenant="bob"}'] == 0
    assert vals["fusebox_launches_total"] >= 4
    assert "fusebox_tenant_optimized_total" not in body  # renamed (deploy/README.md)
    assert vals['fusebox_tenant_syncs_total{tenant="alice"}'] == 2
    assert vals['fusebox_tenant_launches_total{tenant="bob"}'] == 0
    assert vals['fusebox_tenant_received_bytes_total{tenant="alice"}'] > 0
    assert vals['fusebox_tenant_sent_bytes_total{tenant="alice"}'] > 0
    assert "# TYPE fusebox_launches_total counter" in body
    assert sid not in body and sid[:8] not in body, "a session id or tag on /metrics"
    for t in spec:  # no token, nor its hash, whoever reads it
        assert toks[t["name"]] not in body and t["token_sha256"][0] not in body
    # on loopback: no warning that every tenant's series are exposed
    assert "not a loopback address" not in d.logtext()
    assert _get(base + "/healthz") == (200, "ok\n")
    assert _get(base + "/readyz") == (200, "ready\n")
    assert _get(base + "/nope")[0] == 404
    release.set()
    assert list(stream) == []


# ---------------------------------------------------------------- the C client

def test_fusebox_cli_with_tls_and_token(certs, daemons, tmp_path):
    tok = secrets.token_urlsafe(24)
    d = daemons("127.0.0.1:0", ["--tls-cert", certs["server"] + ".pem",
                                "--tls-key", certs["server"] + ".key"],
                tenants=[{"name": "ops", "role": "admin", "token_sha256": [sha(tok)]}])
    tokfile = tmp_path / "token"
    tokfile.write_text(tok + "\n")
    # the stock way in grpcio: TLS channel credentials composed with an access token
    opts = [("grpc.ssl_target_name_override", "localhost")]
    for t, ok in ((tok, True), ("not-" + tok, False)):
        creds = grpc.composite_channel_credentials(tls_creds(certs),
                                                   grpc.access_token_call_credentials(t))
        stock = Client(d.address, grpc.secure_channel(d.address, creds, opts))
        if ok:
            assert _stats(stock).sessions_active == 0
            assert stock.new_session(dense_layout(8))
        else:
            expect_error(lambda: _stats(stock), UNAUTH, "unknown token")
        stock.close()
    # the address is 127.0.0.1: the server's certificate names that IP
    base = [FUSEBOX, "stats", "--server", d.address, "--tls-ca", certs["ca"] + ".pem"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("FUSEBOX_")}
    r = subprocess.run(base, capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode != 0 and "no credentials" in r.stderr, r.stderr
    r = subprocess.run(base + ["--token-file", str(tokfile)], capture_output=True, text=True,
                       timeout=120, env=env)
    assert r.returncode == 0, r.stderr
    assert tok not in r.stdout + r.stderr
    r = subprocess.run([FUSEBOX, "stats", "--server", d.address, "--json"], capture_output=True,
                       text=True, timeout=120, env=dict(env, FUSEBOX_TOKEN=tok,
                                                        FUSEBOX_TLS_CA=certs["ca"] + ".pem"))
    assert r.returncode == 0, r.stderr
    assert "sessions" in r.stdout
    # a whole session through libfusebox: the Session stream, field writes
    # and reads all carry the token over TLS
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    r = subprocess.run([FUSEBOX, "run", "examples/saxpy.json", "--server", d.address,
                        "--tls-ca", certs["ca"] + ".pem", "--token-file", str(tokfile)],
                       capture_output=True, text=True, timeout=300, env=env, cwd=repo)
    assert r.returncode == 0 and "all checks passed" in r.stdout, r.stdout + r.stderr
    # a token is not sent in the clear off loopback (192.0.2.1, TEST-NET-1:
    # refused before any connection is made)
    r = subprocess.run([FUSEBOX, "stats", "--server", "192.0.2.1:50051", "--token-file",
                        str(tokfile)], capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode != 0 and "refusing to send a token in the clear" in r.stderr, r.stderr
    # without the CA the TLS handshake fails
    r = subprocess.run([FUSEBOX, "stats", "--server", d.address, "--token-file", str(tokfile)],
                       capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode != 0
