"""Sandboxes that refuse a wall (docs/security.md, "Sandboxes that refuse a
wall"): a GPU machine under gVisor or Firecracker, or a container without
CAP_SYS_ADMIN, may refuse the namespaces, the switch of user, no_new_privs
or the seccomp filter. fuseboxd tries each wall once at start; a refused
one is logged in one line (naming the wall, the error and what is lost),
shown in /metrics and /readyz, and the workers start without it, every
other wall still raised. --require-walls / --strict-sandbox turn a
refusal into a refusal to start.

The kernel's refusals are simulated with the test hook --test-refuse-walls
WALL[:ERRNO] (an explicit option: no client and no environment variable
can set it), which makes the start-up probe take that errno as the
kernel's answer. Each test then checks, through a real fuseboxd on a unix
socket, that sessions compute right, that the line appears exactly once
however many workers start, that /metrics shows the wall down and the
others up, that the workers really run without that wall and with the
others, and that another tenant is unharmed and the server SERVING."""
import os
import re
import subprocess
import tempfile
import time

import grpc
import pytest

from conftest import (BUILD, FUSEBOXD, RPC_TIMEOUT, Client, Stream, dense_layout, health_pb2, i32,
                      pb, store_kernel, terminate)
from test_process_isolation import children, register, status
from test_tls_tenants import _get
from test_worker_privileges import ROOT_ONLY, compute, limits, start_fails

FAKE_CUDA = os.path.join(BUILD, "tests", "fakecuda", "libfakecuda.so")
WALLS = ["netns", "rootns", "uid", "rlimits", "no_new_privs", "seccomp"]


def _backend(monkeypatch, backend):
    if backend == "cpu":
        return ()
    if not os.path.exists(FAKE_CUDA):
        pytest.fail(f"the fake CUDA driver is not built ({FAKE_CUDA})")
    monkeypatch.setenv("FB_CUDA_LIBRARY", os.path.abspath(FAKE_CUDA))
    return ("--backend", "cuda")


def _base(server):
    m = re.search(r"metrics on (http://127\.0\.0\.1:\d+)/metrics", server.logtext())
    assert m, server.logtext()
    return m.group(1)


def wall_metrics(server):
    st, body = _get(_base(server) + "/metrics")
    assert st == 200
    got = dict(re.findall(r'^fusebox_sandbox_wall\{wall="(\w+)"\} (\d+)$', body, re.M))
    assert sorted(got) == sorted(WALLS), body
    return {k: int(v) for k, v in got.items()}


def summary(server):
    """The start's summary line: (up, refused) wall names."""
    m = re.search(r"sandbox walls up: (.*); refused: (.*); not asked for: ", server.logtext())
    assert m, server.logtext()
    up = set() if m.group(1) == "none" else set(m.group(1).split(", "))
    refused = set() if m.group(2) == "none" else set(re.findall(r"(\w+) \(refused: ",
                                                                m.group(2)))
    return up, refused


def _ns(pid, kind):
    return os.readlink(f"/proc/{pid}/ns/{kind}")


def _uid(pid):
    return int(status(pid)["Uid"].split()[0])


# Per wall: (marker, check): marker(pid) says the worker is done raising its
# walls; check(pid, broker) that it runs without the refused one.
def _locked(pid):
    return status(pid).get("Seccomp", "").strip() == "2"


CHECKS = {
    "netns": (_locked, lambda p, b: _ns(p, "net") == _ns(b, "net")),
    "rootns": (_locked, lambda p, b: _ns(p, "mnt") == _ns(b, "mnt")),
    "uid": (_locked, lambda p, b: _uid(p) == 0),
    # the broker's own limits, inherited (a worker with the wall has 64 or
    # 1024 open files, soft and hard)
    "rlimits": (_locked, lambda p, b: limits(p)["Max open files"] == limits(b)["Max open files"]),
    # no_new_privs refused: a worker that is no longer root cannot load a
    # filter without it (EACCES), so seccomp is refused too
    "no_new_privs": (lambda p: _uid(p) != 0,
                     lambda p, b: status(p)["NoNewPrivs"].strip() == "0"
                     and status(p)["Seccomp"].strip() == "0"),
    "seccomp": (lambda p: status(p).get("NoNewPrivs", "").strip() == "1",
                lambda p, b: status(p)["Seccomp"].strip() == "0"),
}


def _workers_without(server, wall, want=2):
    """At least want workers of server done with their walls, each without
    the refused one."""
    marker, check = CHECKS[wall]
    deadline = time.monotonic() + RPC_TIMEOUT
    while True:
        ready = []
        for k in children(server.proc.pid):
            try:
                if marker(k):
                    ready.append(k)
            except (OSError, KeyError):
                pass
        if len(ready) >= want or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert len(ready) >= want, f"expected {want} workers done with their walls: {ready}"
    for k in ready:
        assert check(k, server.proc.pid), f"worker {k} has the {wall} wall: {status(k)}"
    return ready


def _session(c, backend):
    """A session that runs: under the fake CUDA driver, which executes no
    kernel, its field round-trips and its launches are accepted; on the
    CPU its kernel's stores are checked (compute)."""
    if backend == "cpu":
        return compute(c)
    sid = c.new_session(dense_layout(16))
    kid = register(c, sid, store_kernel(2))[0]
    data = bytes(range(64))
    assert c.write_field(sid, 2, data) == len(data)
    s = Stream(c, sid)
    s.send(launches=[pb.Launch(kernel=kid, args=[i32(1), i32(5)])])
    assert list(s.sync(1).errors) == []
    assert c.read_field(sid, 2) == data
    return s


def _cases():
    out = [(w, "cpu") for w in WALLS]
    out += [(w, "cuda") for w in ("uid", "rlimits", "no_new_privs", "seccomp")]
    return out


@ROOT_ONLY
@pytest.mark.parametrize("wall,backend", _cases())
def test_refused_wall_falls_back(make_server, monkeypatch, wall, backend):
    server = make_server("--test-refuse-walls", wall + ":EINVAL", "--metrics-listen",
                         "127.0.0.1:0", "--spare-workers", "2", *_backend(monkeypatch, backend))
    c = server.client
    s1 = _session(c, backend)
    s2 = _session(c, backend)  # more workers start (spares replaced): still one line
    _workers_without(server, wall, want=3)
    log = server.logtext()
    lines = [ln for ln in log.splitlines() if f"sandbox wall {wall} refused (" in ln]
    assert len(lines) == 1, log
    assert "Invalid argument" in lines[0] and "walls still up: " in lines[0], lines[0]
    up, refused = summary(server)
    # the walls that rest on another: rootns's namespaces are entered with
    # netns's, and a worker that is no longer root loads a filter only
    # under no_new_privs
    expect_down = {wall, {"netns": "rootns", "no_new_privs": "seccomp"}.get(wall, wall)}
    assert refused == expect_down, log
    if wall == "no_new_privs":
        assert len([ln for ln in log.splitlines()
                    if "sandbox wall seccomp refused (seccomp load: Permission denied)" in ln]) \
            == 1, log
    m = wall_metrics(server)
    assert {k for k, v in m.items() if v == 1} == up and not up & expect_down, (m, up)
    for other in ("uid", "rlimits"):  # walls every root fuseboxd has: still up
        if other not in expect_down:
            assert m[other] == 1, m
    st, body = _get(_base(server) + "/readyz")
    assert st == 200 and body.startswith("ready\n"), body
    assert "sandbox walls refused: " in body and f"{wall} (refused: Invalid argument)" in body
    s1.close()
    s2.close()
    server.assert_unharmed()


@ROOT_ONLY
def test_all_walls_up_by_default(make_server):
    """Nothing refused (this machine gives root every wall): every wall's
    metric is 1, no refusal line, /readyz says just ready, and the
    workers have every wall (seccomp, no_new_privs, another user)."""
    server = make_server("--metrics-listen", "127.0.0.1:0")
    up, refused = summary(server)
    assert not refused and "sandbox wall " not in server.logtext().replace("sandbox walls", "")
    m = wall_metrics(server)
    assert {k for k, v in m.items() if v} == up
    assert {"uid", "rlimits", "no_new_privs", "seccomp"} <= up
    assert _get(_base(server) + "/readyz") == (200, "ready\n")
    compute(server.client).close()
    for k in children(server.proc.pid):
        deadline = time.monotonic() + RPC_TIMEOUT
        while not _locked(k) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _locked(k) and status(k)["NoNewPrivs"].strip() == "1" and _uid(k) != 0
    server.assert_unharmed()


def test_thread_isolation_has_no_walls(make_server):
    """Under isolation thread there are no workers: every wall's metric is
    0, and asking for walls is refused at start."""
    server = make_server("--isolation", "thread", "--metrics-listen", "127.0.0.1:0")
    assert set(wall_metrics(server).values()) == {0}
    compute(server.client).close()
    server.assert_unharmed()
    for opt in (("--require-walls", "seccomp"), ("--strict-sandbox",)):
        err = start_fails("--isolation", "thread", *opt)
        assert "needs isolation process" in err, err


@ROOT_ONLY
@pytest.mark.parametrize("opts,wall,why", [
    (("--strict-sandbox",), "seccomp", "seccomp load: Invalid argument"),
    (("--require-walls", "uid,seccomp"), "uid", "setresuid: Invalid argument"),
    (("--require-walls", "netns"), "netns", "unshare: Invalid argument"),
    (("--require-walls", "all"), "rlimits", "setrlimit: Invalid argument"),
])
def test_required_wall_refused_stops_the_start(opts, wall, why):
    err = start_fails(*opts, "--test-refuse-walls", wall + ":EINVAL")
    opt = "strict_sandbox" if opts[0] == "--strict-sandbox" else "require_walls"
    assert f"{opt}: the sandbox wall {wall} is required, and the kernel refused it ({why})" \
        in err, err


@ROOT_ONLY
def test_required_walls_up_start(make_server, monkeypatch):
    """A wall refused that is not required: fuseboxd starts (the others
    required are up) and computes."""
    server = make_server("--require-walls", "uid,seccomp,no_new_privs", "--test-refuse-walls",
                         "rlimits")
    assert summary(server)[1] == {"rlimits"}
    compute(server.client).close()
    server.assert_unharmed()


def test_bad_wall_lists_are_refused():
    err = start_fails("--require-walls", "seccomp,bogus")
    assert "require_walls: unknown wall 'bogus'" in err, err
    err = start_fails("--test-refuse-walls", "seccomp:EBOGUS")
    assert "test_refuse_walls: wall seccomp: 'EBOGUS' is not one of" in err, err
    err = start_fails("--worker-walls-off", "seccomp")
    assert "worker_walls_off is what fuseboxd tells its own workers" in err, err


def _as_nobody(*args):
    return ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", FUSEBOXD,
            "--backend", "cpu", "--shutdown-grace-s", "5", "--socket-mode", "0666", *args]


@ROOT_ONLY
def test_refused_by_the_kernel_itself():
    """Not the test hook: fuseboxd started as nobody has no CAP_SYS_ADMIN,
    and the kernel refuses it the namespaces (EPERM). It logs each once
    (as information: no namespace could be expected of that user), its
    workers start without them and compute, /metrics shows them 0 and
    the uid wall not asked for; --require-walls netns stops that start."""
    with tempfile.TemporaryDirectory(prefix="fbsec-") as tmp:
        os.chmod(tmp, 0o777)
        sock = os.path.join(tmp, "s")
        with open(os.path.join(tmp, "log"), "w+") as log:
            p = subprocess.Popen(_as_nobody("--listen", "unix:" + sock, "--metrics-listen",
                                            "127.0.0.1:0"), stdout=log, stderr=subprocess.STDOUT)

            def text():
                log.flush()
                log.seek(0)
                return log.read()
            c = Client("unix:" + sock)
            try:
                deadline = time.monotonic() + 30
                while True:
                    try:
                        if c.health() == health_pb2.HealthCheckResponse.SERVING:
                            break
                    except grpc.RpcError:
                        pass
                    assert p.poll() is None and time.monotonic() < deadline, text()
                    time.sleep(0.05)
                s1, s2 = compute(c), compute(c)  # two workers, and a spare
                out = text()
                for wall in ("netns", "rootns"):
                    lines = [ln for ln in out.splitlines()
                             if f"sandbox wall {wall} refused (" in ln]
                    assert len(lines) == 1 and "Operation not permitted" in lines[0] \
                        and " INFO " in lines[0], out
                assert "not asked for: uid" in out, out
                m = re.search(r"metrics on (http://127\.0\.0\.1:\d+)/metrics", out)
                body = _get(m.group(1) + "/metrics")[1]
                assert 'fusebox_sandbox_wall{wall="netns"} 0' in body
                assert 'fusebox_sandbox_wall{wall="uid"} 0' in body
                assert 'fusebox_sandbox_wall{wall="seccomp"} 1' in body
                kids = children(p.pid)
                assert len(kids) >= 2, kids
                for k in kids:  # every worker: the filter, fuseboxd's user and namespaces
                    deadline = time.monotonic() + RPC_TIMEOUT
                    while not _locked(k) and time.monotonic() < deadline:
                        time.sleep(0.05)
                    assert _locked(k) and _uid(k) == 65534
                    assert _ns(k, "net") == _ns(p.pid, "net")
                s1.close()
                s2.close()
            finally:
                c.close()
                assert terminate(p, text) == 0, text()
        r = subprocess.run(_as_nobody("--listen", "unix:" + os.path.join(tmp, "t"),
                                      "--require-walls", "netns"),
                           capture_output=True, text=True, timeout=RPC_TIMEOUT)
    assert r.returncode == 1, r.stderr
    assert "require_walls: the sandbox wall netns is required, and the kernel refused it " \
        "(unshare: Operation not permitted)" in r.stderr, r.stderr
