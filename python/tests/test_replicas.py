"""Three fuseboxd replicas behind a real nginx, then a real HAProxy, on
127.0.0.1 with free ports, each proxy started without root from its
configuration in deploy/proxy/ (templated for ports and paths) under a
temporary prefix:

- 30 sessions keep their replica for every call (the fusebox-replica
  header of every answer is checked) and spread over all three;
- draining one replica (SIGTERM, --drain-grace-s): its /readyz fails, its
  live sessions go on during the grace, new sessions land on the others,
  and after the grace its sessions end with the drain message; it exits 0;
- kill -9 of another replica loses only its sessions, each with "session S
  lost: replica R unreachable", while the others finish with right results.

With CI=true a missing proxy binary fails the test; elsewhere it skips
saying which is missing (apt-get install nginx haproxy)."""
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request

import grpc
import numpy as np
import pytest

import fusebox
from conftest import FUSEBOXD, ROOT

PROXY_DIR = os.path.join(ROOT, "deploy", "proxy")
N = 64
PROG = """
layout { dense(i: %d) { place x: f32 } }
kernel add(k: f32) { for i in x { x[i] = x[i] + k } }
""" % N
GRACE_S = 8  # the drained replica's --drain-grace-s


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def binary(name):
    for d in ("/usr/sbin", "/usr/local/sbin", "/sbin"):
        p = os.path.join(d, name)
        if os.access(p, os.X_OK):
            return p
    p = shutil.which(name)
    if p:
        return p
    msg = f"{name} is not installed (apt-get install {name}): the replicas test needs it"
    if os.environ.get("CI") == "true":
        pytest.fail(msg)
    pytest.skip(msg)


_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def readyz(port):
    """The status of GET /readyz on a metrics port (0: not answering yet)."""
    try:
        with _DIRECT.open(f"http://127.0.0.1:{port}/readyz", timeout=5) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except (urllib.error.URLError, OSError):
        return 0


class Replica:
    def __init__(self, tmp, name, *extra, grace=GRACE_S):
        self.name = name
        self.port, self.mport = free_port(), free_port()
        self.log = open(os.path.join(tmp, name + ".log"), "w+b")
        self.proc = subprocess.Popen(
            [FUSEBOXD, "--listen", f"127.0.0.1:{self.port}", "--metrics-listen",
             f"127.0.0.1:{self.mport}", "--replica-name", name, "--drain-grace-s", str(grace),
             "--isolation", "thread", "--max-connections-per-ip", "1024",
             "--stream-rate", "100000", "--reset-rate", "100000", *extra],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=self.log)
        end = time.monotonic() + 60
        while readyz(self.mport) != 200:
            assert self.proc.poll() is None, self.text()
            assert time.monotonic() < end, f"{name} not ready: {self.text()}"
            time.sleep(0.1)

    def text(self):
        self.log.flush()
        self.log.seek(0)
        return self.log.read().decode(errors="replace")[-4000:]


def render(template, out, **kv):
    with open(os.path.join(PROXY_DIR, template)) as f:
        text = f.read()
    lines = []
    for line in text.splitlines():  # the comments name the placeholders too
        if not line.lstrip().startswith("#"):
            for k, v in kv.items():
                line = line.replace("{{%s}}" % k, v)
            assert "{{" not in line, line
        lines.append(line)
    text = "\n".join(lines) + "\n"
    with open(out, "w") as f:
        f.write(text)


def start_proxy(kind, tmp, replicas):
    port = free_port()
    prefix = os.path.join(tmp, kind)
    os.makedirs(prefix)
    if kind == "nginx":
        exe = binary("nginx")
        for d in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"):
            os.makedirs(os.path.join(prefix, d))
        os.chmod(prefix, 0o777)  # as root, nginx's workers are nobody
        conf = os.path.join(prefix, "nginx.conf")
        render("nginx.conf", conf, prefix=prefix, listen=f"127.0.0.1:{port}",
               servers="\n    ".join(f"server 127.0.0.1:{r.port} max_fails=1 fail_timeout=5s;"
                                      for r in replicas))
        cmd = [exe, "-p", prefix, "-c", conf, "-e", os.path.join(prefix, "error.log")]
    else:
        exe = binary("haproxy")
        conf = os.path.join(prefix, "haproxy.cfg")
        render("haproxy.cfg", conf, listen=f"127.0.0.1:{port}",
               servers="\n  ".join(f"server {r.name} 127.0.0.1:{r.port} proto h2 check port {r.mport} "
                                   "check-proto h1"
                                   for r in replicas))
        cmd = [exe, "-db", "-f", conf]
    check = subprocess.run(cmd + (["-t"] if kind == "nginx" else ["-c"]),
                           capture_output=True, text=True, timeout=30)
    assert check.returncode == 0, f"{kind} refuses its configuration: {check.stderr}"
    log = open(os.path.join(prefix, "stderr.log"), "w+b")
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=log)
    end = time.monotonic() + 30
    while True:
        assert proc.poll() is None, f"{kind} exited: {open(log.name).read()}"
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            assert time.monotonic() < end, f"{kind} does not listen"
            time.sleep(0.1)
    return proc, f"127.0.0.1:{port}"


class Recorder(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor,
               grpc.StreamUnaryClientInterceptor, grpc.StreamStreamClientInterceptor):
    """(routing key, replica that answered) of every call that was answered."""

    def __init__(self):
        self.seen = []

    def _note(self, details, call):
        key = dict(details.metadata or ()).get("fusebox-route")
        try:
            md = call.initial_metadata()
        except Exception:  # noqa: BLE001 - a call that failed before any answer
            return
        self.seen.append((details.method, key, dict(md or ()).get("fusebox-replica")))

    def intercept_unary_unary(self, cont, details, req):
        call = cont(details, req)
        self._note(details, call)
        return call

    def intercept_stream_unary(self, cont, details, reqs):
        call = cont(details, reqs)
        self._note(details, call)
        return call

    def _stream(self, call, details):
        first = True
        for m in call:
            if first:
                self._note(details, call)
                first = False
            yield m

    def intercept_unary_stream(self, cont, details, req):
        return _Wrapped(cont(details, req), self, details)

    def intercept_stream_stream(self, cont, details, reqs):
        return _Wrapped(cont(details, reqs), self, details)


class _Wrapped:
    """A response stream that notes its replica at its first answer and
    still acts as the call (code, details, cancel)."""

    def __init__(self, call, rec, details):
        self._call, self._rec, self._details, self._first = call, rec, details, True

    def __iter__(self):
        return self

    def __next__(self):
        m = next(self._call)
        if self._first:
            self._first = False
            self._rec._note(self._details, self._call)
        return m

    def __getattr__(self, name):
        return getattr(self._call, name)


def client(address, rec):
    c = fusebox.connect(address, timeout=60)
    c._stub = fusebox._proto.Stub(grpc.intercept_channel(c._channel, rec))
    return c


def step(s, k):
    s.kernels.add(float(k))
    s.sync()
    return s.fields.x.to_numpy()


@pytest.mark.parametrize("kind", ["nginx", "haproxy"])
def test_replicas_behind_proxy(kind, fuseboxd, tmp_path):
    tmp = str(tmp_path)
    reps = [Replica(tmp, f"r{i}") for i in range(3)]
    proxy = None
    try:
        proxy, address = start_proxy(kind, tmp, reps)
        rec = Recorder()
        c = client(address, rec)
        end = time.monotonic() + 30  # the proxy's first health checks
        while True:
            try:
                if all(c.info(timeout=5).replica for _ in range(3)):
                    break
            except fusebox.ServerError:
                assert time.monotonic() < end, f"{kind} does not reach the replicas"
                time.sleep(0.2)
        sessions = [c.session(PROG) for _ in range(30)]
        total = {}
        for i, s in enumerate(sessions):
            s.fields.x[:] = np.full(N, i, np.float32)
            got = step(s, 1)
            total[s.id] = i + 1
            assert np.array_equal(got, np.full(N, i + 1, np.float32)), (s.replica, got)
        by = {r.name: [s for s in sessions if s.replica == r.name] for r in reps}
        assert all(by.values()), f"30 sessions did not spread over 3 replicas: {by}"
        keys = {s._route: s.replica for s in sessions}
        answered = [x for x in rec.seen if x[1] in keys]
        assert len(answered) >= 30 * 4  # create, stream, register, write, read ...
        moved = [x for x in answered if x[2] != keys[x[1]]]
        assert not moved, f"calls answered by another replica than their session's: {moved[:5]}"

        # drain r1: readiness fails at once, its sessions go on for the grace
        drained, killed = reps[1], reps[2]
        t0 = time.monotonic()
        drained.proc.send_signal(signal.SIGTERM)
        end = time.monotonic() + 10
        while readyz(drained.mport) != 503:
            assert time.monotonic() < end, "/readyz still 200 while draining"
            time.sleep(0.05)
        for s in by[drained.name][:2]:
            total[s.id] += 1
            assert np.array_equal(step(s, 1), np.full(N, total[s.id], np.float32))
        fresh = [c.session(PROG) for _ in range(6)]
        assert all(s.replica and s.replica != drained.name for s in fresh), \
            [s.replica for s in fresh]
        assert time.monotonic() - t0 < GRACE_S, "the drain checks took longer than its grace"
        assert drained.proc.wait(timeout=GRACE_S + 30) == 0, drained.text()
        for s in by[drained.name]:
            with pytest.raises(fusebox.ConnectionLostError) as e:
                step(s, 1)
            assert f"fuseboxd on replica {drained.name} is draining" in str(e.value), str(e.value)

        # kill -9 r2: only its sessions are lost, each saying so
        killed.proc.kill()
        killed.proc.wait()
        for s in by[killed.name] + [s for s in fresh if s.replica == killed.name]:
            with pytest.raises(fusebox.SessionLostError) as e:
                step(s, 1)
            assert str(e.value).startswith(
                f"session {s.id[:8]} lost: replica {killed.name} unreachable"), str(e.value)
        live = by[reps[0].name] + [s for s in fresh if s.replica == reps[0].name]
        assert live
        for s in by[reps[0].name]:
            total[s.id] += 5
            assert np.array_equal(step(s, 5), np.full(N, total[s.id], np.float32))
        for s in live:
            s.close()
        c.close()
    finally:
        if proxy is not None:
            proxy.terminate()
            proxy.wait(timeout=30)
        for r in reps:
            if r.proc.poll() is None:
                r.proc.send_signal(signal.SIGTERM)
                try:
                    r.proc.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    r.proc.kill()
    assert reps[0].proc.returncode == 0, reps[0].text()
