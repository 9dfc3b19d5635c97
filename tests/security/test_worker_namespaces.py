"""Workers in namespaces of their own (--worker-namespaces auto|on|off;
docs/security.md, "Namespaces"): where the kernel lets fuseboxd make them
(root with CAP_SYS_ADMIN), each worker enters a new network namespace (no
interface but a loopback that is down) and a new IPC namespace before it
makes its engine, so a worker that got past its seccomp filter reaches no
network and no other process's System V IPC. The worker needs neither:
its socket to the broker was made before, field buffers are memfds. Each
test checks that workers still compute, SERVING, and that another
tenant's field is unchanged (server.assert_unharmed)."""
import os

import pytest

from conftest import BUILD, Stream, dense_layout, i32, pb, store_kernel
from test_process_isolation import register
from test_worker_privileges import compute, start_fails, workers_of

FAKE_CUDA = os.path.join(BUILD, "tests", "fakecuda", "libfakecuda.so")

ROOT_ONLY = pytest.mark.skipif(
    os.geteuid() != 0,
    reason="not run as root: fuseboxd cannot make namespaces, so its workers run without "
    "them (what 'on' does then is tested below; CI runs this suite as root)")


def ns(pid, kind):
    return os.readlink(f"/proc/{pid}/ns/{kind}")


def interfaces(pid):
    """The network interfaces a process sees (/proc/PID/net/dev)."""
    with open(f"/proc/{pid}/net/dev") as f:
        return sorted(line.split(":", 1)[0].strip() for line in f.readlines()[2:])


@ROOT_ONLY
def test_workers_get_their_own_namespaces(server):
    """The default (auto) as root: every locked-down worker is in a network
    and an IPC namespace that is neither fuseboxd's nor another worker's,
    sees only lo, and still computes."""
    if "session workers share fuseboxd's network and IPC namespaces" in server.logtext():
        pytest.skip("this kernel or container refuses new namespaces to root: "
                    + server.logtext().split("cannot make their own: ", 1)[1].split("\n")[0])
    assert "session workers run in a network and an IPC namespace of their own each" \
        in server.logtext()
    s = compute(server.client)
    try:
        kids = workers_of(server, 2)  # the victim's and this session's
        broker = server.proc.pid
        for kind in ("net", "ipc"):
            seen = {ns(k, kind) for k in kids}
            assert ns(broker, kind) not in seen, f"a worker shares fuseboxd's {kind} namespace"
            assert len(seen) == len(kids), f"two workers share a {kind} namespace: {seen}"
        assert "lo" in interfaces(broker) and len(interfaces(broker)) >= 1
        for k in kids:
            assert interfaces(k) == ["lo"], f"worker {k} sees {interfaces(k)}"
    finally:
        s.close()
    server.assert_unharmed()


@ROOT_ONLY
def test_cuda_worker_in_namespaces(make_server, monkeypatch):
    """The CUDA path in principle: a CUDA worker (the fake driver,
    tests/fakecuda: the host side only, it runs no kernel) loads its driver,
    makes its context and serves a field write, a launch and a read from
    its own namespaces. The real driver needs /dev/nvidia* (the mount
    namespace is fuseboxd's), not the network; no GPU here to show it."""
    if not os.path.exists(FAKE_CUDA):
        pytest.skip(f"the fake CUDA driver is not built ({FAKE_CUDA})")
    monkeypatch.setenv("FB_CUDA_LIBRARY", os.path.abspath(FAKE_CUDA))
    server = make_server("--backend", "cuda", "--worker-namespaces", "on")
    assert "backend cuda on Fusebox fake GPU" in server.logtext()
    c = server.client
    sid = c.new_session(dense_layout(16))
    kid = register(c, sid, store_kernel(2))[0]
    data = bytes(range(64))
    assert c.write_field(sid, 2, data) == len(data)
    s = Stream(c, sid)
    try:
        s.send(launches=[pb.Launch(kernel=kid, args=[i32(1), i32(5)])])
        assert list(s.sync(1).errors) == []
        assert c.read_field(sid, 2) == data  # the fake driver runs no kernel
        for k in workers_of(server, 2):
            assert ns(k, "net") != ns(server.proc.pid, "net")
            assert ns(k, "ipc") != ns(server.proc.pid, "ipc")
    finally:
        s.close()
    server.assert_unharmed()


@ROOT_ONLY
def test_namespaces_on(make_server):
    """--worker-namespaces on as root: it starts (or, where the kernel
    refuses, stops with the reason), and its workers compute."""
    try:
        server = make_server("--worker-namespaces", "on")
    except AssertionError as e:
        assert "worker_namespaces on: cannot make a network and an IPC namespace" in str(e), e
        pytest.skip("this kernel or container refuses new namespaces to root")
    s = compute(server.client)
    try:
        for k in workers_of(server, 2):
            assert ns(k, "net") != ns(server.proc.pid, "net")
    finally:
        s.close()
    server.assert_unharmed()


@ROOT_ONLY
def test_namespaces_off(make_server):
    """--worker-namespaces off: workers stay in fuseboxd's namespaces (the
    check above can fail)."""
    server = make_server("--worker-namespaces", "off")
    s = compute(server.client)
    try:
        for k in workers_of(server, 2):
            for kind in ("net", "ipc"):
                assert ns(k, kind) == ns(server.proc.pid, kind)
    finally:
        s.close()
    server.assert_unharmed()


def test_namespaces_setting_checked():
    err = start_fails("--worker-namespaces", "maybe")
    assert "--worker-namespaces: invalid value 'maybe' (expected auto, on or off)" in err, err


def test_namespaces_on_without_privilege():
    """Not root, fuseboxd cannot make namespaces: 'on' stops the start
    rather than running workers without them."""
    if os.geteuid() == 0:
        pytest.skip("run as root: 'on' works, tested above through auto")
    err = start_fails("--worker-namespaces", "on")
    assert "worker_namespaces on: cannot make a network and an IPC namespace" in err, err
