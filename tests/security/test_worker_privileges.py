"""Workers under a user of their own: a worker runs a tenant's JIT code, so a
fuseboxd started as root (CI runs it so) must not leave that code root
inside its seccomp filter. Started as root, fuseboxd has every worker switch
to --worker-user (default nobody) before it reads a tenant's byte: no
supplementary groups, no capabilities, real, effective and saved ids all,
in every thread, with RLIMIT_CORE 0 and a small RLIMIT_NOFILE. Each test
then checks that the server is SERVING and another tenant's field is
unchanged (server.assert_unharmed)."""
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time

import grpc
import pytest

from conftest import (FUSEBOXD, RPC_TIMEOUT, Client, Stream, dense_layout, health_pb2, i32, pb,
                      store_kernel)
from test_process_isolation import children, register, status

ROOT_ONLY = pytest.mark.skipif(
    os.geteuid() != 0,
    reason="not run as root: fuseboxd cannot switch its workers to another user, "
    "so there is no drop to check (CI runs this suite as root)")


def limits(pid):
    """/proc/PID/limits: {name: (soft, hard)}."""
    out = {}
    with open(f"/proc/{pid}/limits") as f:
        next(f)
        for line in f:
            name, soft, hard = line[:26].strip(), line[26:47].strip(), line[47:68].strip()
            out[name] = (soft, hard)
    return out


def workers_of(server, want):
    """The worker processes of server (at least want of them), each with
    its seccomp filter in place (a spare may still be starting)."""
    deadline = time.monotonic() + RPC_TIMEOUT
    while True:
        kids = children(server.proc.pid)
        ready = [k for k in kids if status(k).get("Seccomp", "").strip() == "2"]
        if len(ready) >= want or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert len(ready) >= want, f"expected {want} locked-down workers, found {kids}"
    return ready


def assert_runs_as(pid, uid, gid):
    """Every thread of worker pid: the ids, no groups, no capabilities."""
    threads = os.listdir(f"/proc/{pid}/task")
    assert threads
    for t in threads:
        st = status(f"{pid}/task/{t}")
        if not st:
            continue  # the thread ended
        ids = f"{uid}\t{uid}\t{uid}\t{uid}"
        assert st["Uid"].strip() == ids, f"worker {pid} thread {t}: Uid {st['Uid']!r}"
        assert st["Gid"].strip() == f"{gid}\t{gid}\t{gid}\t{gid}", \
            f"worker {pid} thread {t}: Gid {st['Gid']!r}"
        assert st.get("Groups", "").strip() == "", f"worker {pid}: groups {st['Groups']!r}"
        for cap in ("CapInh", "CapPrm", "CapEff", "CapAmb"):
            assert int(st.get(cap, "0"), 16) == 0, f"worker {pid} thread {t}: {cap} {st[cap]}"
        assert st["NoNewPrivs"].strip() == "1"
        assert st["Seccomp"].strip() == "2"
    lim = limits(pid)
    assert lim["Max core file size"] == ("0", "0"), lim["Max core file size"]
    assert lim["Max open files"] == ("64", "64"), lim["Max open files"]


def compute(c):
    """A session that writes its field (a memfd from the broker), runs JIT
    code on it and reads it back: what a worker must still be able to do."""
    sid = c.new_session(dense_layout(16))
    kid = register(c, sid, store_kernel(2))[0]
    data = bytes(range(64))
    assert c.write_field(sid, 2, data) == len(data)
    s = Stream(c, sid)
    s.send(launches=[pb.Launch(kernel=kid, args=[i32(i), i32(100 + i)]) for i in range(0, 16, 3)])
    assert list(s.sync(1).errors) == []
    got = c.read_field(sid, 2)
    want = bytearray(data)
    for i in range(0, 16, 3):
        want[4 * i:4 * i + 4] = (100 + i).to_bytes(4, "little")
    assert got == bytes(want)
    return s


@ROOT_ONLY
def test_workers_drop_root(server):
    """fuseboxd runs as root: every worker (the sessions' and the spare)
    runs as nobody, in every thread, and still computes."""
    nobody = pwd.getpwnam("nobody")
    c = server.client
    s = compute(c)
    try:
        kids = workers_of(server, 3)  # the victim's, this session's, a spare
        for k in kids:
            assert_runs_as(k, nobody.pw_uid, nobody.pw_gid)
        # the broker itself stays root: it binds sockets and reads certificates
        assert status(server.proc.pid)["Uid"].split()[0] == "0"
    finally:
        s.close()
    assert "session workers run as user 'nobody'" in server.logtext()
    server.assert_unharmed()


@ROOT_ONLY
def test_worker_user_configurable(make_server):
    """--worker-user by name: the workers take that user's ids."""
    daemon = pwd.getpwnam("daemon")
    server = make_server("--worker-user", "daemon")
    s = compute(server.client)
    try:
        for k in workers_of(server, 2):
            assert_runs_as(k, daemon.pw_uid, daemon.pw_gid)
    finally:
        s.close()
    server.assert_unharmed()


@ROOT_ONLY
def test_thread_isolation_as_root_warns(make_server):
    """--isolation thread has no workers to switch: a root fuseboxd runs
    tenants' code as root, and its log says so at start."""
    server = make_server("--isolation", "thread")
    assert "isolation thread as root: tenants' JIT code runs as root" in server.logtext()
    server.assert_unharmed()


def start_fails(*args):
    """fuseboxd with args must refuse to start: its exit status and log."""
    with tempfile.TemporaryDirectory(prefix="fbsec-") as tmp:
        p = subprocess.run([FUSEBOXD, "--listen", "unix:" + os.path.join(tmp, "s"), "--backend",
                            "cpu", *args], capture_output=True, text=True, timeout=RPC_TIMEOUT)
    assert p.returncode != 0, p.stderr
    return p.stderr


@ROOT_ONLY
def test_worker_user_refused():
    """A worker user that is no user, or is root, stops the start with a
    message naming it."""
    err = start_fails("--worker-user", "no-such-user-fbx")
    assert "worker_user 'no-such-user-fbx': no such user" in err, err
    for root in ("root", "0"):
        err = start_fails("--worker-user", root)
        assert f"worker_user '{root}' is uid 0" in err and "would run as root" in err, err


def test_worker_user_not_root():
    """Not root, fuseboxd cannot switch users: naming another user is
    refused rather than ignored."""
    if os.geteuid() == 0:
        pytest.skip("run as root: the switch itself is tested above")
    err = start_fails("--worker-user", "daemon")
    assert "cannot switch its workers to another user" in err, err


@ROOT_ONLY
def test_fuseboxd_as_pid_1():
    """In a container fuseboxd is often pid 1 (the Dockerfile's ENTRYPOINT):
    its workers must tell it from init (a worker whose broker died before it
    set its parent-death signal is reparented, and leaves). Started as pid 1
    of a new pid namespace, fuseboxd serves, and its workers compute."""
    if not shutil.which("unshare"):
        pytest.skip("no unshare(1) to start fuseboxd as pid 1")
    with tempfile.TemporaryDirectory(prefix="fbsec-") as tmp:
        sock = os.path.join(tmp, "s")
        log = open(os.path.join(tmp, "log"), "w+")
        proc = subprocess.Popen(["unshare", "--pid", "--fork", "--kill-child", FUSEBOXD, "--listen",
                                 "unix:" + sock, "--backend", "cpu"],
                                stdout=log, stderr=subprocess.STDOUT)
        c = Client("unix:" + sock)
        try:
            deadline = time.monotonic() + 30
            while True:
                try:
                    if c.health() == health_pb2.HealthCheckResponse.SERVING:
                        break
                except grpc.RpcError:
                    pass
                log.seek(0)
                assert proc.poll() is None and time.monotonic() < deadline, \
                    "fuseboxd as pid 1 did not start:\n" + log.read()
                time.sleep(0.05)
            compute(c).close()
            # SIGTERM to fuseboxd (unshare ignores it): a clean exit, which
            # unshare passes on
            for pid in children(proc.pid):
                os.kill(pid, signal.SIGTERM)
            assert proc.wait(timeout=RPC_TIMEOUT) == 0
        finally:
            c.close()
            if proc.poll() is None:
                proc.kill()  # --kill-child: fuseboxd goes with it
                proc.wait(timeout=RPC_TIMEOUT)
            log.close()
