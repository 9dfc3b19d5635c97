"""Worker processes in the memory budget (docs/security.md, "The memory
budget", the workers part): under process isolation each session's worker
(and each spare) holds memory of its own, its engine, LLVM, heap and thread
stacks, tens of MiB for a session whose field is a few bytes. fuseboxd
measures it (/proc/PID/statm, never the worker's word) and counts it, so
that tiny sessions are refused RESOURCE_EXHAUSTED naming the part once
workers fill the budget, rather than overcommitting the machine."""
import os
import re
import time

import grpc
from conftest import RPC_TIMEOUT, dense_layout, expect_error, pb
from test_memory_budget import _children
from test_tls_tenants import _get

EXHAUSTED = grpc.StatusCode.RESOURCE_EXHAUSTED
MIB = 1 << 20
TINY = dense_layout(4)  # 16 bytes of field


def _anon_bytes(pid):
    """RssAnon of a process, as the kernel reports it (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("RssAnon:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _fill(c, most=60):
    """Tiny sessions until one is refused: their ids and the refusal."""
    sids = []
    for _ in range(most):
        try:
            sids.append(c.new_session(TINY))
        except grpc.RpcError as e:
            assert e.code() == EXHAUSTED, f"{e.code()}: {e.details()}"
            return sids, e.details()
    raise AssertionError(f"{most} tiny sessions admitted: workers are not in the budget")


def test_measured_workers_fill_the_budget(make_server):
    """With a budget of 160 MiB, tiny sessions are refused once their
    workers' measured memory fills it: the message names the workers part,
    the sessions' own memory is bytes, and the figure in GetStats is what
    the kernel says the workers hold. Closing sessions gives the room back."""
    server = make_server("--memory-budget", "160M", "--spare-workers", "1")
    c = server.client
    sids, msg = _fill(c)
    assert re.search(r"memory budget 160 MiB is full: sessions [0-9.]+ (B|KiB), .*, "
                     r"workers [0-9.]+ MiB; CreateSession of [0-9.]+ [KM]iB refused "
                     r"\(memory_budget\)", msg), msg
    need = re.search(r"CreateSession of ([0-9.]+) ([KM])iB", msg)
    charge = float(need.group(1)) * (MIB if need.group(2) == "M" else 1024)
    assert charge > MIB, f"a fresh worker charged {charge} bytes: {msg}"
    time.sleep(0.6)  # two reaper ticks: every worker measured
    m = c.stats().memory
    assert m.refused >= 1 and m.sessions_bytes < 64 * 1024, m
    # the workers filled it: the victim's, the spare's and one per session
    assert m.workers_bytes >= 160 * MIB - charge - 64 * 1024, m
    workers = len(sids) + 2
    per = m.workers_bytes / workers
    assert MIB < per < 1024 * MIB, f"{per / MIB:.1f} MiB per worker"
    # what the kernel says the worker processes hold privately
    os_anon = sum(_anon_bytes(p) for p in _children(server.proc.pid))
    assert 0.5 * os_anon <= m.workers_bytes <= 1.5 * os_anon + 4 * MIB, \
        (m.workers_bytes, os_anon)
    server.assert_unharmed()
    # the room comes back as sessions end (their workers with them)
    for sid in sids[:3]:
        c.close_session(pb.CloseSessionRequest(session_id=sid), timeout=RPC_TIMEOUT)
    deadline = time.monotonic() + 30
    while True:
        try:
            c.new_session(TINY)
            break
        except grpc.RpcError as e:
            assert e.code() == EXHAUSTED and time.monotonic() < deadline, e.details()
            time.sleep(0.1)
    assert c.stats().memory.workers_bytes <= m.workers_bytes
    server.assert_unharmed()


def test_fixed_worker_charge(make_server):
    """--worker-memory-bytes: every worker, spares too, counts that much
    instead of its measure: with 10 MiB each and a budget of 64 MiB, the
    victim's worker and the spare hold 20, four tiny sessions fit (60) and
    the fifth is refused naming the workers part; the figure in GetStats is
    exact. A user tenant's refusal counts its workers in its own usage."""
    server = make_server("--memory-budget", "64M", "--worker-memory-bytes", "10M")
    c = server.client
    sids = []
    for k in range(5):
        # the reaper's tick started a spare for the one taken: the victim's
        # worker, the spare and k sessions' (a busy machine may take a while)
        want = (2 + k) * 10 * MIB
        deadline = time.monotonic() + 30
        while c.stats().memory.workers_bytes != want:
            assert time.monotonic() < deadline, (c.stats().memory, want)
            time.sleep(0.05)
        if k < 4:
            sids.append(c.new_session(TINY))
    expect_error(lambda: c.new_session(TINY), EXHAUSTED, "memory budget 64 MiB is full",
                 "workers 60 MiB", "CreateSession of 10.0 MiB refused (memory_budget)")
    m = c.stats().memory
    assert m.workers_bytes == 60 * MIB, m
    c.close_session(pb.CloseSessionRequest(session_id=sids[0]), timeout=RPC_TIMEOUT)
    c.new_session(TINY)
    server.assert_unharmed()


def test_thread_isolation_has_no_workers(make_server):
    """Under thread isolation there is no worker process: the part is 0 and
    a small budget admits tiny sessions as before."""
    server = make_server("--memory-budget", "8M", "--isolation", "thread")
    c = server.client
    sids = [c.new_session(TINY) for _ in range(20)]
    assert len(sids) == 20
    m = c.stats().memory
    assert m.workers_bytes == 0, m
    server.assert_unharmed()


def test_metrics_name_the_part(make_server):
    """/metrics has the part like the others (a metric label, workers)."""
    server = make_server("--memory-budget", "1G", "--metrics-listen", "127.0.0.1:0")
    m = None
    deadline = time.monotonic() + 30
    while not m:
        m = re.search(r"metrics on (http://127\.0\.0\.1:\d+)/metrics", server.logtext())
        assert m or time.monotonic() < deadline, server.logtext()
        time.sleep(0.05)
    st, body = _get(m.group(1) + "/metrics")
    assert st == 200
    v = re.search(r'fusebox_memory_budget_used_bytes\{part="workers"\} (\d+)', body)
    assert v and int(v.group(1)) > MIB, body[:2000]
    server.assert_unharmed()
