"""The walls against a compromised worker (docs/security.md, "A compromised
worker"): a worker whose tenant's code took it over may call what its
seccomp filter lets through and say what it likes on its socket. The test
hook FUSEBOXD_FAULT_INJECT (in fuseboxd's environment only, no client can
set it) makes the worker that registers a kernel of a given name do what
such a worker would: have the kernel signal for it (SIGIO owners, O_ASYNC,
TIOCSTI), change resource limits or read the broker's, signal its process
group or queue signals to the broker, resize a staging buffer's memfd under
the broker's mapping, close its socket and live on, claim absurd device
memory. Each test checks that the attempt is refused or contained, that
fuseboxd stays SERVING and that another tenant's field is unchanged.

The syscall walls are tried on both seccomp filters: a CPU worker's allow
list, and a CUDA worker's deny list (the fake driver, tests/fakecuda), where
every call not refused by name is allowed and the argument rules are all
that stand between the worker and the call."""
import os
import threading
import time

import grpc
import pytest

from conftest import BUILD, dense_layout, i32, store_kernel
from test_process_isolation import _ended_and_server_computes, _faulty_register, register

INTERNAL = grpc.StatusCode.INTERNAL
FAULT = "FUSEBOXD_FAULT_INJECT"
FAKE_CUDA = os.path.join(BUILD, "tests", "fakecuda", "libfakecuda.so")
BACKENDS = ["cpu", "cuda"]


def _backend(monkeypatch, backend):
    """fuseboxd's arguments for backend (cuda: the fake driver)."""
    if backend == "cpu":
        return ()
    if not os.path.exists(FAKE_CUDA):
        pytest.fail(f"the fake CUDA driver is not built ({FAKE_CUDA})")
    monkeypatch.setenv("FB_CUDA_LIBRARY", os.path.abspath(FAKE_CUDA))
    return ("--backend", "cuda")


def _stat(pid):
    """(ppid, pgrp, session) of a process from /proc/PID/stat."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[1]), int(fields[2]), int(fields[3])


def _workers(pid):
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                if _stat(int(d))[0] == pid:
                    out.append(int(d))
            except (OSError, IndexError, ValueError):
                pass
    return out


def _probe(make_server, monkeypatch, kind, backend):
    """The answer of a worker that ran probe kind on registering 'probe';
    the worker lives on and computes."""
    monkeypatch.setenv(FAULT, kind + ":probe")
    server = make_server(*_backend(monkeypatch, backend))
    err, sid = _faulty_register(server, "probe")
    assert err is not None and err.code() == INTERNAL, err
    c = server.client
    kid = register(c, sid, store_kernel(2))[0]
    assert list(c.run(sid, [(kid, [i32(3), i32(33)])]).errors) == []
    server.assert_unharmed()
    return err.details()


@pytest.mark.parametrize("backend", BACKENDS)
def test_no_signals_through_the_kernel(make_server, monkeypatch, backend):
    """No SIGIO owner, no signal of the worker's choosing, no O_ASYNC on its
    socket, by fcntl or ioctl, and no typing into a terminal: with them the
    kernel would signal a process of the worker's choosing for it."""
    d = _probe(make_server, monkeypatch, "sigio-probe", backend)
    for call in ("F_SETOWN", "F_SETOWN_EX", "F_SETSIG", "F_SETFL O_ASYNC", "FIOSETOWN",
                 "SIOCSPGRP", "FIOASYNC", "TIOCSTI"):
        assert f"{call}: EPERM" in d, f"{call}: {d}"
    assert "F_GETFL: allowed" in d, d


@pytest.mark.parametrize("backend", BACKENDS)
def test_rlimits_frozen(make_server, monkeypatch, backend):
    """A worker's resource limits stay as they were set before lock-down, and
    it cannot read (let alone set) the broker's; a CUDA worker may read its
    own (a CPU worker's allow list has no prlimit at all)."""
    d = _probe(make_server, monkeypatch, "rlimit-probe", backend)
    for call in ("setrlimit", "prlimit self set", "prlimit broker get"):
        assert f"{call}: EPERM" in d, f"{call}: {d}"
    own = "allowed" if backend == "cuda" else "EPERM"
    assert f"prlimit self get: {own}" in d, d


@pytest.mark.parametrize("backend", BACKENDS)
def test_no_signals_to_the_group_or_queued(make_server, monkeypatch, backend):
    """Signals to its process group and queued signals to the broker are
    refused (a queued one to itself is not); and each worker leads a
    session and process group of its own, outside the broker's, so no
    signal to a group reaches the broker or another worker with it."""
    monkeypatch.setenv(FAULT, "signal-probe:probe")
    server = make_server("--spare-workers", "2", *_backend(monkeypatch, backend))
    err, sid = _faulty_register(server, "probe")
    assert err is not None and err.code() == INTERNAL, err
    d = err.details()
    for call in ("kill 0", "kill -pgid", "rt_sigqueueinfo broker", "rt_tgsigqueueinfo broker"):
        assert f"{call}: EPERM" in d, f"{call}: {d}"
    if backend == "cuda":  # a CPU worker's allow list has no rt_sigqueueinfo at all
        assert "rt_sigqueueinfo self: allowed" in d, d
    broker = server.proc.pid
    _, bgrp, bsid = _stat(broker)
    # the victim's, the probe's and the spares (started again in the
    # background as sessions take them, and a worker may end between the
    # listing and the read of its stat): wait for three, within a bound
    deadline = time.monotonic() + 20
    while True:
        seen = []
        for w in _workers(broker):
            try:
                seen.append((w, *_stat(w)[1:]))
            except FileNotFoundError:
                continue  # it exited in between
        if len(seen) >= 3 or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert len(seen) >= 3, seen
    for w, grp, sess in seen:
        assert grp == w and sess == w, f"worker {w}: group {grp}, session {sess}"
        assert grp != bgrp and sess != bsid
    server.assert_unharmed()


@pytest.mark.parametrize("backend", BACKENDS)
def test_staging_memfd_sealed(make_server, monkeypatch, backend):
    """A worker handed a staging buffer's memfd can neither shrink it under
    the broker's mapping (the broker's copy would fault: SIGBUS, every
    tenant's server gone) nor grow it past its size (memory no budget
    counts): the memfd is sealed, at its size. The broker then copies out of
    that buffer unharmed."""
    monkeypatch.setenv(FAULT, "memfd-resize:probe")
    server = make_server(*_backend(monkeypatch, backend))
    c = server.client
    sid = c.new_session(dense_layout(4096))
    k = store_kernel(2)
    k.name = "probe"
    register(c, sid, k)  # arms the fault
    try:
        c.write_field(sid, 2, bytes(range(256)) * 64)
        raise AssertionError("the faulty worker moved the data")
    except grpc.RpcError as e:
        assert e.code() == INTERNAL, e.details()
        d = e.details()
    assert "fault memfd" in d, d
    assert "ftruncate shrink: EPERM" in d and "write past the end: EPERM" in d, d
    assert "seals shrink grow seal" in d and "size 16384" in d, d
    server.assert_unharmed()
    # the broker reads from such buffers as before; another session is untouched
    other = c.new_session(dense_layout(4096))
    data = bytes(range(256)) * 64
    assert c.write_field(other, 2, data) == len(data)
    assert c.read_field(other, 2) == data
    server.assert_unharmed()


def test_worker_closing_its_socket_is_stopped(make_server, monkeypatch):
    """A worker that closes its socket and goes on living: the broker waits
    a grace of 1 s for it to exit, then kills it; the session ends with a
    message saying so, within a bound, and the worker process is gone."""
    monkeypatch.setenv(FAULT, "close-socket:probe")
    server = make_server("--kernel-timeout-s", "0", "--compile-timeout-s", "0")
    c = server.client
    deadline = time.monotonic() + 20  # the victim's worker, and the spare started after it
    while len(_workers(server.proc.pid)) < 2:
        assert time.monotonic() < deadline, "no spare worker"
        time.sleep(0.05)
    before = set(_workers(server.proc.pid))
    sid = c.new_session(dense_layout(16))
    k = store_kernel(2)
    k.name = "probe"
    result = {}

    def call():
        try:
            register(c, sid, k)
        except grpc.RpcError as e:
            result["err"] = e

    t0 = time.monotonic()
    th = threading.Thread(target=call)
    th.start()
    th.join(20)  # the grace is 1 s: 20 s is a generous bound, far under the RPC timeout
    assert not th.is_alive(), "a worker that closed its socket held its session for 20 s"
    err = result.get("err")
    assert err is not None and err.code() == INTERNAL, err
    assert "closed its socket to the server without exiting: it was stopped" in err.details(), \
        err.details()
    assert time.monotonic() - t0 < 20
    assert "without exiting: it was stopped" in server.logtext()
    # the worker that took the session (the spare, of the two workers there
    # were before it: the victim's lives on) is gone
    deadline = time.monotonic() + 20
    while len(before & set(_workers(server.proc.pid))) > 1:
        assert time.monotonic() < deadline, "the worker lived on"
        time.sleep(0.05)
    assert len(before) == 2 and len(before & set(_workers(server.proc.pid))) == 1
    server.assert_unharmed()
    _ended_and_server_computes(c, sid, "stopped worker's")


def test_device_bytes_claim_capped(make_server, monkeypatch):
    """A worker whose replies claim 2^62 bytes of device memory: the broker
    trusts the figure no further than the worker's process could hold (the
    session's memory limit plus --worker-overhead-bytes), so the claim
    neither wraps the budget's sums nor fills the budget: other tenants'
    sessions are still admitted."""
    monkeypatch.setenv(FAULT, "device-bytes:probe")
    server = make_server("--memory-budget", "1G", "--session-memory-limit", "1M",
                         "--worker-overhead-bytes", "64M", "--worker-memory-bytes", "1M")
    c = server.client
    sid = c.new_session(dense_layout(16))
    k = store_kernel(2)
    k.name = "probe"
    kid = register(c, sid, k)[0]  # arms the fault: this reply lies already
    assert list(c.run(sid, [(kid, [i32(1), i32(2)])]).errors) == []
    m = c.stats().memory
    assert 0 < m.sessions_bytes <= 65 * (1 << 20) + 64 * 1024, m
    for s in c.stats().sessions:
        assert s.memory_bytes <= 65 * (1 << 20), s
    # the budget has room: a new session is admitted, the victim untouched
    other = c.new_session(dense_layout(4096))
    assert c.write_field(other, 2, bytes(16384)) == 16384
    server.assert_unharmed()
