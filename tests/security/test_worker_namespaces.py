"""Workers in namespaces of their own (--worker-namespaces auto|on|net|off;
docs/security.md, "Namespaces"): where the kernel lets fuseboxd make them
(root with CAP_SYS_ADMIN), each worker enters a new network namespace (no
interface but a loopback that is down), a new IPC namespace and a new
mount namespace before it makes its engine, and once the engine is made
(LLVM, the CUDA driver: all it reads from disk) makes the root of its
mount namespace an empty read-only tmpfs. So a worker that got past its
seccomp filter reaches no network, no other process's System V IPC and
no file of the host (no /proc: no other process either). The worker
needs none of them: its socket to the broker was made before, field
buffers are memfds. Each test checks that workers still compute,
SERVING, and that another tenant's field is unchanged
(server.assert_unharmed)."""
import os

import grpc
import pytest

from conftest import BUILD, Stream, dense_layout, i32, pb, store_kernel
from test_process_isolation import INTERNAL, _faulty_register, register, status
from test_worker_privileges import compute, start_fails, workers_of

FAKE_CUDA = os.path.join(BUILD, "tests", "fakecuda", "libfakecuda.so")

ROOT_ONLY = pytest.mark.skipif(
    os.geteuid() != 0,
    reason="not run as root: fuseboxd cannot make namespaces, so its workers run without "
    "them (what 'on' does then is tested below; CI runs this suite as root)")


def ns(pid, kind):
    return os.readlink(f"/proc/{pid}/ns/{kind}")


def assert_empty_root(pid):
    """Worker pid, every thread of it: the root and working directory are
    an empty directory, and the mount namespace holds that one read-only
    tmpfs and nothing of the host."""
    threads = os.listdir(f"/proc/{pid}/task")
    assert threads
    for t in threads:
        try:
            seen = os.listdir(f"/proc/{pid}/task/{t}/root")
            cwd = os.listdir(f"/proc/{pid}/task/{t}/cwd")
        except FileNotFoundError:
            continue  # the thread ended
        assert seen == [], f"worker {pid} thread {t} sees {seen} at its root"
        assert cwd == [], f"worker {pid} thread {t} works in a directory holding {cwd}"
    with open(f"/proc/{pid}/mountinfo") as f:
        mounts = [line.split() for line in f]
    assert len(mounts) == 1, f"worker {pid} has mounts {mounts}"
    m = mounts[0]
    fields = m[m.index("-") + 1:]  # fstype, source, super options
    assert m[4] == "/" and fields[0] == "tmpfs", m
    assert "ro" in m[5].split(","), f"worker {pid}: its root is not read-only: {m}"
    assert not os.path.exists(f"/proc/{pid}/root/proc/self")


def assert_pid_1(pid):
    """Worker pid is pid 1 of a PID namespace of its own (NSpid: its pid
    here, then 1 there) and has no pid for its parent there."""
    st = status(pid)
    assert st["NSpid"].split()[-1] == "1" and len(st["NSpid"].split()) >= 2, st["NSpid"]


def assert_host_untouched(server):
    """What the workers mounted stays in their namespaces: fuseboxd's (and
    this test's) mounts show no tmpfs of theirs."""
    for who in ("self", str(server.proc.pid)):
        with open(f"/proc/{who}/mountinfo") as f:
            assert "fusebox-empty" not in f.read(), f"a worker's root shows in {who}'s mounts"


def interfaces(pid):
    """The network interfaces a process sees (/proc/PID/net/dev)."""
    with open(f"/proc/{pid}/net/dev") as f:
        return sorted(line.split(":", 1)[0].strip() for line in f.readlines()[2:])


@ROOT_ONLY
def test_workers_get_their_own_namespaces(server):
    """The default (auto) as root: every locked-down worker is in a network
    and an IPC namespace that is neither fuseboxd's nor another worker's,
    sees only lo, and still computes."""
    log = server.logtext()
    for wall in ("netns", "rootns"):  # the refusal's line (proc.c, walls_report)
        refused = f"sandbox wall {wall} refused ("
        if refused in log:
            pytest.skip("this kernel or container refuses new namespaces to root: "
                        + log.split(refused, 1)[1].split("\n")[0])
    assert "session workers run in a network, an IPC, a mount and a PID namespace of their own " \
        "each, the mount namespace's root an empty read-only directory" in log
    s = compute(server.client)
    try:
        kids = workers_of(server, 2)  # the victim's and this session's
        broker = server.proc.pid
        for k in kids:
            assert_empty_root(k)
        assert_host_untouched(server)
        assert os.listdir(f"/proc/{broker}/root"), "fuseboxd itself lost its files"
        for k in kids:
            assert_pid_1(k)
        for kind in ("net", "ipc", "mnt", "pid"):
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
@pytest.mark.parametrize("setting,seen", [("on", "stat /etc/passwd: ENOENT"),
                                          ("net", "stat /etc/passwd: allowed")])
def test_worker_stat_sees_no_host_file(make_server, monkeypatch, setting, seen):
    """From inside: a worker's own stat("/etc/passwd") (a call its allow
    list lets through: it takes a path but opens nothing) finds nothing
    from the empty root, and the host's file under 'net' (the check can
    fail). The fault hook makes the worker registering 'probe' try it;
    the worker and the server go on."""
    monkeypatch.setenv("FUSEBOXD_FAULT_INJECT", "syscall-probe:probe")
    try:
        server = make_server("--worker-namespaces", setting)
    except AssertionError as e:
        assert f"worker_namespaces {setting}: cannot make" in str(e), e
        pytest.skip("this kernel or container refuses the namespaces to root")
    err, sid = _faulty_register(server, "probe")
    assert err is not None and err.code() == INTERNAL, err
    assert "openat: EPERM" in err.details() and seen in err.details(), err.details()
    c = server.client
    kid = register(c, sid, store_kernel(2))[0]
    assert list(c.run(sid, [(kid, [i32(3), i32(33)])]).errors) == []
    server.assert_unharmed()


@ROOT_ONLY
def test_cuda_worker_in_namespaces(make_server, monkeypatch):
    """The CUDA path in principle: a CUDA worker (the fake driver,
    tests/fakecuda: the host side only, it runs no kernel) loads its driver,
    makes its context and serves a field write, a launch and a read from
    its own namespaces, its root emptied after the driver was loaded and
    the context made (the real driver opens /dev/nvidia* then, and may
    open nothing later: seccomp refuses it; no GPU here to show it)."""
    if not os.path.exists(FAKE_CUDA):
        pytest.skip(f"the fake CUDA driver is not built ({FAKE_CUDA})")
    monkeypatch.setenv("FB_CUDA_LIBRARY", os.path.abspath(FAKE_CUDA))
    monkeypatch.setenv("FUSEBOXD_FAULT_INJECT", "syscall-probe:probe")
    try:
        server = make_server("--backend", "cuda", "--worker-namespaces", "on")
    except AssertionError as e:
        assert "worker_namespaces on: cannot make a network, an IPC, a mount (with an empty " \
            "root) and a PID" in str(e), e
        pytest.skip("this kernel or container refuses the namespaces to root")
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
            for kind in ("net", "ipc", "mnt", "pid"):
                assert ns(k, kind) != ns(server.proc.pid, kind)
            assert_empty_root(k)
            assert_pid_1(k)
        # and the next request still reaches the driver from the empty root
        assert c.write_field(sid, 2, data[::-1]) == len(data)
        assert c.read_field(sid, 2) == data[::-1]
        # the deny list lets getcwd and stat through: they find the empty root
        probe = store_kernel(2)
        probe.name = "probe"
        with pytest.raises(grpc.RpcError) as e:
            register(c, c.new_session(dense_layout(16)), probe)
        assert "getcwd: allowed" in e.value.details() and \
            "stat /etc/passwd: ENOENT" in e.value.details(), e.value.details()
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
        assert "worker_namespaces on: cannot make a network, an IPC, a mount (with an empty " \
            "root) and a PID" in str(e), e
        pytest.skip("this kernel or container refuses new namespaces to root")
    s = compute(server.client)
    try:
        kids = workers_of(server, 2)
        for kind in ("net", "ipc", "mnt", "pid"):
            seen = {ns(k, kind) for k in kids}
            assert ns(server.proc.pid, kind) not in seen and len(seen) == len(kids), (kind, seen)
        for k in kids:
            assert_empty_root(k)
            assert_pid_1(k)
        assert_host_untouched(server)
    finally:
        s.close()
    server.assert_unharmed()


@ROOT_ONLY
def test_namespaces_net(make_server):
    """--worker-namespaces net: a network and an IPC namespace of their
    own, but fuseboxd's mount namespace and files (the escape hatch should
    a driver need paths after start; the empty-root checks can fail)."""
    try:
        server = make_server("--worker-namespaces", "net")
    except AssertionError as e:
        assert "worker_namespaces net: cannot make a network and an IPC namespace" in str(e), e
        pytest.skip("this kernel or container refuses new namespaces to root")
    assert "worker_namespaces net" in server.logtext()
    s = compute(server.client)
    try:
        for k in workers_of(server, 2):
            assert ns(k, "net") != ns(server.proc.pid, "net")
            assert ns(k, "mnt") == ns(server.proc.pid, "mnt")
            assert ns(k, "pid") == ns(server.proc.pid, "pid")
            assert sorted(os.listdir(f"/proc/{k}/root")) == sorted(os.listdir("/"))
    finally:
        s.close()
    server.assert_unharmed()


@ROOT_ONLY
def test_namespaces_off(make_server):
    """--worker-namespaces off: workers stay in fuseboxd's namespaces (the
    checks above can fail)."""
    server = make_server("--worker-namespaces", "off")
    s = compute(server.client)
    try:
        for k in workers_of(server, 2):
            for kind in ("net", "ipc", "mnt", "pid"):
                assert ns(k, kind) == ns(server.proc.pid, kind)
            assert os.listdir(f"/proc/{k}/root")
    finally:
        s.close()
    server.assert_unharmed()


def test_namespaces_setting_checked():
    err = start_fails("--worker-namespaces", "maybe")
    assert "--worker-namespaces: invalid value 'maybe' (expected auto, on, net or off)" in err, err


def test_namespaces_on_without_privilege():
    """Not root, fuseboxd cannot make namespaces: 'on' stops the start
    rather than running workers without them."""
    if os.geteuid() == 0:
        pytest.skip("run as root: 'on' works, tested above through auto")
    err = start_fails("--worker-namespaces", "on")
    assert "worker_namespaces on: cannot make a network, an IPC, a mount (with an empty root) " \
        "and a PID namespace: " in err, err
    err = start_fails("--worker-namespaces", "net")
    assert "worker_namespaces net: cannot make a network and an IPC namespace: unshare: " \
        in err, err
