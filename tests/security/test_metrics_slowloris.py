"""Slowloris on the metrics port (issue 38, attack 3; docs/security.md,
"The metrics port under attack").

Before: libmicrohttpd held at most 64 connections, with no limit per
address, and its 10 s timeout was an idle one that every byte reset. 80
connections from one client, each sending a byte of its request now and
then, made /healthz answer 0 of 18 probes for 35 s; the Kubernetes example
points its liveness probe there, so whoever reached the port restarted the
pod and ended every session.

Now each connection must be done within --metrics-request-timeout-s of its
accept (default 5 s) however it trickles, and a new connection is always
taken: past --metrics-max-connections-per-ip of its address, or
--metrics-max-connections in all, the oldest connection still sending its
request is shut down to make room.

Everything here talks to 127.0.0.1 only: the attacker and the probes share
that address, as a probe from the attacker's own node or NAT would. The
bounds on time are liveness bounds (seconds), never measurements."""
import http.client
import json
import os
import re
import subprocess
import sys
import time

from conftest import FUSEBOXD

REQUEST_TIMEOUT_S = 5.0  # fuseboxd's default --metrics-request-timeout-s
PER_IP = 16  # its default --metrics-max-connections-per-ip
PROBE_TIMEOUT_S = 5.0  # a probe answered later than this counts as failed
MARGIN_S = 3.0  # scheduling slack under AddressSanitizer on a busy machine
TICK_S = 0.25  # the attacker sends one byte per connection this often
SLOWLORIS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "slowloris.py")


def metrics_port(server):
    m = re.search(r"metrics on http://127\.0\.0\.1:(\d+)/metrics", server.logtext())
    assert m, server.logtext()
    return int(m.group(1))


def get(port, path, timeout=PROBE_TIMEOUT_S):
    """GET path on 127.0.0.1:port: (status, body, Connection header)."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        c.request("GET", path)
        r = c.getresponse()
        return r.status, r.read().decode(), r.getheader("Connection")
    finally:
        c.close()


def counters(port):
    st, body, _ = get(port, "/metrics", timeout=60)
    assert st == 200, body
    out = {}
    for line in body.splitlines():
        m = re.match(r"(fusebox_metrics_connections\S*) (\d+)$", line)
        if m:
            out[m.group(1)] = int(m.group(2))
    return out


class Loris:
    """The attacker (slowloris.py) in a process of its own, as it would be:
    n trickling connections to 127.0.0.1:port for `seconds`, reopened on
    the next tick when the server ends them if reconnect. lives: how long
    each connection the server ended had lived; ages: those still open at
    the end."""

    def __init__(self, port, n, reconnect, seconds):
        self.proc = subprocess.Popen(
            [sys.executable, SLOWLORIS, str(port), str(n), "1" if reconnect else "0",
             str(seconds), str(TICK_S)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True)
        self.lives = self.ages = None

    def finish(self):
        try:
            out, err = self.proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise AssertionError("the attacker did not stop")
        assert self.proc.returncode == 0, f"the attacker failed: {err}"
        r = json.loads(out)
        self.lives, self.ages = r["lives"], r["ages"]
        return r


def probe_during(port, seconds):
    """GET /healthz and /readyz in turn until `seconds` have passed: the
    probes answered 200 and the failures (each with why)."""
    ok, failed = 0, []
    end = time.monotonic() + seconds
    k = 0
    while time.monotonic() < end:
        path = ("/healthz", "/readyz")[k % 2]
        k += 1
        t0 = time.monotonic()
        try:
            st, body, _ = get(port, path)
            if st == 200:
                ok += 1
            else:
                failed.append(f"{path}: {st} {body!r}")
        except (OSError, http.client.HTTPException) as e:
            failed.append(f"{path}: {e!r} after {time.monotonic() - t0:.1f} s")
        time.sleep(0.2)
    return ok, failed


def test_slowloris_flood_leaves_probes_answered(make_server):
    """120 trickling connections from 127.0.0.1 (the old limit was 64 in
    all), each reopened as soon as the server ends it, for longer than the
    request timeout: every /healthz and /readyz probe from the same address
    is answered, no slow connection outlives the request timeout, and the
    gRPC side is unharmed. Default settings only."""
    server = make_server("--metrics-listen", "127.0.0.1:0")
    port = metrics_port(server)
    loris = Loris(port, 120, reconnect=True, seconds=REQUEST_TIMEOUT_S + 4)
    time.sleep(1.0)  # the attack in place before the first probe
    ok, failed = probe_during(port, REQUEST_TIMEOUT_S + 2)
    r = loris.finish()
    assert not failed, f"{len(failed)} probes failed, {ok} answered: {failed[:5]}"
    assert ok >= 10, f"only {ok} probes in the attack"
    assert r["opened"] > 120 and len(r["lives"]) >= 120, \
        f"{r['opened']} slow connections opened, {len(r['lives'])} ended by the server"
    longest = max(r["lives"] + r["ages"])
    assert longest <= REQUEST_TIMEOUT_S + MARGIN_S, \
        f"a trickling connection lived {longest:.1f} s"
    c = counters(port)
    assert c['fusebox_metrics_connections_cut_total{reason="per_ip"}'] > 0, c
    server.assert_unharmed()


def test_trickling_connections_cut_at_request_timeout(make_server):
    """A few connections, fewer than the per-address limit, each sending a
    byte every quarter second (which kept libmicrohttpd's idle timeout from
    ever firing): each is ended once the request timeout has passed since
    it connected, not before, and /metrics counts them. A whole request on
    a connection gets its answer and Connection: close."""
    server = make_server("--metrics-listen", "127.0.0.1:0")
    port = metrics_port(server)
    st, body, conn = get(port, "/healthz")
    assert (st, body) == (200, "ok\n")
    assert conn == "close", "a connection must serve one request (its deadline is per accept)"
    loris = Loris(port, 6, reconnect=False, seconds=REQUEST_TIMEOUT_S + MARGIN_S + 1)
    r = loris.finish()
    assert not r["ages"], \
        f"{len(r['ages'])} trickling connections still open after {max(r['ages']):.1f} s"
    assert len(r["lives"]) == 6
    assert min(r["lives"]) >= REQUEST_TIMEOUT_S - 0.5, \
        f"a connection was ended after {min(r['lives']):.1f} s, before its timeout"
    c = counters(port)
    assert c['fusebox_metrics_connections_cut_total{reason="request_timeout"}'] >= 6, c
    assert c['fusebox_metrics_connections_cut_total{reason="per_ip"}'] == 0, c
    server.assert_unharmed()


def test_global_limit_makes_room(make_server):
    """With no per-address limit in the way (--metrics-max-connections-per-ip
    above the total) and a request timeout longer than the test, 100
    trickling connections against --metrics-max-connections 40: the oldest
    slow ones make room, probes are answered, and at most 40 attacker
    connections stay open."""
    server = make_server("--metrics-listen", "127.0.0.1:0", "--metrics-max-connections", "40",
                         "--metrics-max-connections-per-ip", "1000",
                         "--metrics-request-timeout-s", "30")
    port = metrics_port(server)
    loris = Loris(port, 100, reconnect=False, seconds=4)
    time.sleep(1.0)
    ok, failed = probe_during(port, 2.0)
    r = loris.finish()
    assert not failed, f"{len(failed)} probes failed, {ok} answered: {failed[:5]}"
    assert ok >= 3, f"only {ok} probes in the attack"
    assert len(r["ages"]) <= 40, f"{len(r['ages'])} slow connections open, over the limit of 40"
    assert len(r["lives"]) >= 60, f"only {len(r['lives'])} of 100 slow connections ended"
    c = counters(port)
    assert c['fusebox_metrics_connections_cut_total{reason="limit"}'] >= 60, c
    assert c['fusebox_metrics_connections_cut_total{reason="request_timeout"}'] == 0, c
    server.assert_unharmed()


def test_metrics_limits_bad_values():
    """Bad values stop the start, naming the option: exit 2 for a value the
    parser refuses, 1 for a connection limit past 65536."""
    for args, code, words in [
            (["--metrics-max-connections", "0"], 2, "--metrics-max-connections: invalid value '0'"),
            (["--metrics-max-connections-per-ip", "many"], 2,
             "--metrics-max-connections-per-ip: invalid value 'many'"),
            (["--metrics-request-timeout-s", "0"], 2,
             "--metrics-request-timeout-s: invalid value '0'"),
            (["--metrics-max-connections", "70000"], 1,
             "--metrics-max-connections (metrics_max_connections) 70000: at most 65536")]:
        p = subprocess.run([FUSEBOXD, "--listen", "127.0.0.1:0", "--backend", "cpu",
                            "--metrics-listen", "127.0.0.1:0", *args],
                           capture_output=True, text=True, timeout=60)
        assert p.returncode == code, (args, p.returncode, p.stdout, p.stderr)
        assert words in p.stdout + p.stderr, (args, p.stdout, p.stderr)
