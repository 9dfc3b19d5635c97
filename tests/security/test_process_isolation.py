"""The second wall: every session's engine runs in a worker process of its
own (fuseboxd --isolation process, the default), locked down with seccomp,
and the broker keeps time. Each test attacks through the public protocol,
then checks that the server is SERVING and another tenant's field is
unchanged (server.assert_unharmed)."""
import os
import queue
import signal
import threading
import time

import grpc
import pytest

from conftest import RPC_TIMEOUT, Stream, dense_layout, i32, kernel, pb, stmt, store_kernel

DEADLINE = grpc.StatusCode.DEADLINE_EXCEEDED
INTERNAL = grpc.StatusCode.INTERNAL
FB_ECANCELLED = -14


def spin_kernel(place):
    """spin() { while { place[0] = 1 } }: never ends."""
    return kernel("spin", [stmt("const", pb.T_I32, imm=0), stmt("const", pb.T_I32, imm=1),
                           stmt("while", body=1), stmt("store", args=[0, 1], snode_id=place)],
                  blocks=[[0, 1, 2], [3]])


def busy_kernel(place, n=1 << 26):
    """busy() { for i in 0..n: place[i & 255] = i }: tens of milliseconds."""
    return kernel("busy", [stmt("const", pb.T_I32, imm=0), stmt("const", pb.T_I32, imm=n),
                           stmt("range_for", args=[0, 1], body=1),
                           stmt("loop_index", pb.T_I32, args=[2], imm=0),
                           stmt("const", pb.T_I32, imm=255),
                           stmt("and", pb.T_I32, args=[3, 4]),
                           stmt("store", args=[5, 3], snode_id=place)],
                  blocks=[[0, 1, 2], [3, 4, 5, 6]])


def children(pid):
    """The processes whose parent is pid."""
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            if int(fields[1]) == pid:
                out.append(int(d))
        except (OSError, IndexError, ValueError):
            pass
    return out


def status(pid):
    """/proc/PID/status as a dict; empty when the process has gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            return dict(line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line)
    except FileNotFoundError:
        return {}


def register(c, sid, *kernels):
    return list(c.register(pb.RegisterKernelsRequest(session_id=sid, kernels=list(kernels)),
                           timeout=RPC_TIMEOUT).kernel_ids)


def test_workers_are_locked_down(server):
    """Each session's worker is a child process under a seccomp filter with
    no_new_privs, in every thread; a spare is kept started. (Workers are not dumpable, so
    even their command line is hidden from other processes of the user.)"""
    c = server.client
    sid = c.new_session(dense_layout(16))
    kid = register(c, sid, store_kernel(2))[0]
    s = Stream(c, sid)
    s.send(launches=[pb.Launch(kernel=kid, args=[i32(1), i32(5)])])
    assert list(s.sync(1).errors) == []
    deadline = time.monotonic() + RPC_TIMEOUT  # a spare may still be starting
    kids = children(server.proc.pid)
    while len(kids) < 3 and time.monotonic() < deadline:  # the main thread's tick starts it
        time.sleep(0.05)
        kids = children(server.proc.pid)
    assert len(kids) >= 3, "expected two sessions' workers and a spare"
    while time.monotonic() < deadline and any(status(k).get("Seccomp", "2").strip() != "2"
                                              for k in kids):
        time.sleep(0.05)
    s.close()
    for k in kids:
        st = status(k)
        assert st["Seccomp"].strip() == "2", f"worker {k} has no seccomp filter: {st}"
        assert st["NoNewPrivs"].strip() == "1"
        assert st["Name"].strip() == "fuseboxd"
        # every thread, the engine's pools (started before the filter, and
        # running the tenant's code) included
        for t in os.listdir(f"/proc/{k}/task"):
            tst = status(f"{k}/task/{t}")
            assert not tst or tst["Seccomp"].strip() == "2", \
                f"thread {t} of worker {k} runs without the seccomp filter: {tst}"
            assert not tst or tst["NoNewPrivs"].strip() == "1"
    server.assert_unharmed()


def test_endless_kernel_times_out(make_server):
    """while without break: under --kernel-timeout-s 1 its worker is ended
    and the stream gets DEADLINE_EXCEEDED naming the kernel; other tenants
    never notice."""
    server = make_server("--kernel-timeout-s", "1")
    c = server.client
    for mode in ("sync", "async"):  # a launch; a task of a flush
        sid = c.new_session(dense_layout(16), mode=mode)
        kid = register(c, sid, spin_kernel(2))[0]
        t0 = time.monotonic()
        try:
            c.run(sid, [(kid, [])])
            raise AssertionError("an endless kernel returned")
        except grpc.RpcError as e:
            assert e.code() == DEADLINE, f"{mode}: {e.code()}: {e.details()}"
            assert "'spin'" in e.details() and "kernel_timeout_s" in e.details(), e.details()
        assert time.monotonic() - t0 < RPC_TIMEOUT
    server.assert_unharmed()
    # the server goes on making sessions
    sid2 = c.new_session(dense_layout(16))
    kid2 = register(c, sid2, store_kernel(2))[0]
    assert list(c.run(sid2, [(kid2, [i32(0), i32(9)])]).errors) == []
    assert "timed out" in server.logtext()


def test_worker_killed_mid_sync(make_server):
    """SIGKILL to one session's worker while it computes: its client hears
    "session worker died: SIGKILL", a second session keeps running."""
    server = make_server("--kernel-timeout-s", "0", "--spare-workers", "0")
    c = server.client
    before = set(children(server.proc.pid))
    sid = c.new_session(dense_layout(16))
    mine = set(children(server.proc.pid)) - before
    assert len(mine) == 1, mine
    worker = mine.pop()
    kid = register(c, sid, spin_kernel(2))[0]
    # a second session computes while the first one spins
    finish = _while_another_computes(c, lambda: c.run(sid, [(kid, [])]))
    os.kill(worker, signal.SIGKILL)
    err = finish()
    assert err is not None and err.code() == INTERNAL, err
    assert "session worker died: SIGKILL" in err.details(), err.details()
    server.assert_unharmed()
    # the dead session is gone; asking for it is NOT_FOUND, not a hang
    try:
        c.read_field(sid, 2)
        raise AssertionError("a dead session answered")
    except grpc.RpcError as e:
        assert e.code() == grpc.StatusCode.NOT_FOUND, e.details()


def test_worker_stalled_mid_reply(make_server, monkeypatch):
    """A worker that sends a reply's header and then nothing (a compromised
    or stuck worker; the test hook FUSEBOXD_FAULT_INJECT, set only in the
    server's environment, makes the worker that registers a kernel named
    'stall_me' do so) must not hold a broker thread: past
    --worker-reply-timeout-s the broker kills it and fails that session's
    call naming the problem; another session computes meanwhile and after."""
    monkeypatch.setenv("FUSEBOXD_FAULT_INJECT", "reply-stall:stall_me")
    server = make_server("--worker-reply-timeout-s", "1", "--kernel-timeout-s", "0",
                         "--compile-timeout-s", "0")
    c = server.client
    # another session registers and computes while the first one's reply stalls
    err, sid = _faulty_register(server, "stall_me")
    assert err is not None and err.code() == INTERNAL, err
    assert "stalled in the middle of a reply" in err.details(), err.details()
    assert "worker_reply_timeout_s" in err.details(), err.details()
    assert "stalled in the middle of a reply" in server.logtext()
    server.assert_unharmed()
    _ended_and_server_computes(c, sid, "stalled")


def test_cancel_stops_queued_launches(server):
    """Cancel: the launches received so far stop at the next task boundary,
    each is reported with FB_ECANCELLED under its own number, and the
    session goes on."""
    c = server.client
    sid = c.new_session(dense_layout(256))
    busy, poke = register(c, sid, busy_kernel(2), store_kernel(2))
    cancel = c.channel.unary_unary("/fusebox.v1.Fusebox/Cancel",
                                   request_serializer=pb.CancelRequest.SerializeToString,
                                   response_deserializer=pb.CancelResponse.FromString)
    s = Stream(c, sid)
    n = 200
    s.send(launches=[pb.Launch(kernel=busy) for _ in range(n)])
    time.sleep(0.2)  # let the first launches start (not a timing assertion)
    cancel(pb.CancelRequest(session_id=sid, through_launch=n), timeout=RPC_TIMEOUT)
    res = s.sync(1)
    assert res.seq == n
    cancelled = [e for e in res.errors if e.code == FB_ECANCELLED]
    assert cancelled, list(res.errors)
    assert all("cancelled" in e.message for e in cancelled)
    assert all(e.seq >= 1 for e in cancelled)
    # later work is not cancelled
    s.send(launches=[pb.Launch(kernel=poke, args=[i32(7), i32(70)])])
    res2 = s.sync(2)
    assert list(res2.errors) == [] and res2.seq == n + 1
    assert c.read_field(sid, 2)[28:32] == (70).to_bytes(4, "little")
    s.close()  # (the stream's end ends the session)
    server.assert_unharmed()


def test_cancel_that_overtakes_its_launches(server):
    """Cancel is a call of its own, so it may reach the server before the
    launches sent just before it on the Session stream. With through_launch
    (the client's count of launches sent) those launches run cancelled when
    they arrive; here the Cancel is sent first on purpose. Later launches
    run."""
    c = server.client
    sid = c.new_session(dense_layout(256))
    busy, poke = register(c, sid, busy_kernel(2), store_kernel(2))
    cancel = c.channel.unary_unary("/fusebox.v1.Fusebox/Cancel",
                                   request_serializer=pb.CancelRequest.SerializeToString,
                                   response_deserializer=pb.CancelResponse.FromString)
    n = 50
    cancel(pb.CancelRequest(session_id=sid, through_launch=n), timeout=RPC_TIMEOUT)
    s = Stream(c, sid)
    s.send(launches=[pb.Launch(kernel=busy) for _ in range(n)])
    res = s.sync(1)
    assert res.seq == n
    assert res.errors and all(e.code == FB_ECANCELLED for e in res.errors), list(res.errors)
    assert all(1 <= e.seq <= n for e in res.errors)
    s.send(launches=[pb.Launch(kernel=poke, args=[i32(7), i32(70)])])
    res2 = s.sync(2)
    assert list(res2.errors) == [] and res2.seq == n + 1
    assert c.read_field(sid, 2)[28:32] == (70).to_bytes(4, "little")
    s.close()
    server.assert_unharmed()


def test_disconnect_drops_queued_work(server):
    """A client that vanishes with work queued: the server drops it at once
    instead of running it for a client that is gone."""
    c = server.client
    sid = c.new_session(dense_layout(256))
    busy = register(c, sid, busy_kernel(2))[0]
    ch = grpc.insecure_channel("unix:" + server.sock)
    stream = ch.stream_stream("/fusebox.v1.Fusebox/Session",
                              request_serializer=pb.SessionRequest.SerializeToString,
                              response_deserializer=pb.SessionResponse.FromString)
    q = queue.Queue()
    for _ in range(50):
        q.put(pb.SessionRequest(session_id=sid if q.empty() else "",
                                launches=[pb.Launch(kernel=busy) for _ in range(20)]))
    it = stream(iter(q.get, None), timeout=RPC_TIMEOUT)
    time.sleep(0.3)
    it.cancel()
    ch.close()
    deadline = time.monotonic() + RPC_TIMEOUT
    while "disconnected" not in server.logtext() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert "disconnected" in server.logtext()
    server.assert_unharmed()


def test_compile_timeout(make_server):
    """A kernel within the statement budget whose compile takes longer than
    --compile-timeout-s: DEADLINE_EXCEEDED naming the option, and the
    server goes on."""
    server = make_server("--compile-timeout-s", "0.2", "--max-kernel-statements", "40000")
    c = server.client
    sid = c.new_session(dense_layout(16))
    stmts = [stmt("arg", pb.T_I32, imm=0)]  # an argument: nothing folds
    for i in range(1, 30000):  # a chain LLVM must keep: each value is stored
        stmts.append(stmt("mul", pb.T_I32, args=[i - 1, 0]) if i % 2 else
                     stmt("add", pb.T_I32, args=[i - 1, i - 2]))
    idx = len(stmts)
    stmts.append(stmt("const", pb.T_I32, imm=1))
    stmts.append(stmt("store", args=[idx, idx - 1], snode_id=2))
    slow = kernel("slow", stmts, params=[pb.T_I32])
    try:
        register(c, sid, slow)
        raise AssertionError("the compile finished within 0.2 s; make the kernel bigger")
    except grpc.RpcError as e:
        assert e.code() == DEADLINE, f"{e.code()}: {e.details()}"
        assert "compile_timeout_s" in e.details(), e.details()
    server.assert_unharmed()


def _rss_kib(pid):
    return int(status(pid)["VmRSS"].split()[0])


def test_unread_results_do_not_pile_up(server):
    """A client that sends syncs and never reads the results: the stream
    stops receiving once a few responses wait to go out (gRPC's flow control
    then holds the client back), instead of the server buffering them all."""
    c = server.client
    sid = c.new_session(dense_layout(16))
    ret = pb.Kernel(name="five", params=[], ret=pb.T_I32,
                    stmts=[stmt("const", pb.T_I32, imm=5), stmt("ret", args=[0], imm=0)],
                    blocks=[pb.Block(ids=[0, 1])])
    kid = register(c, sid, ret)[0]
    batch = [pb.Launch(kernel=kid) for _ in range(1000)]  # each result ~20 KB
    sent = [0]

    def requests():
        yield pb.SessionRequest(session_id=sid)
        for i in range(1, 3001):  # 60 MB of results if all were buffered
            sent[0] = i
            yield pb.SessionRequest(launches=batch, sync=i)

    before = _rss_kib(server.proc.pid)
    call = c._stream(requests(), timeout=RPC_TIMEOUT)  # never read
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and sent[0] < 3000:
        time.sleep(0.1)
    grown = _rss_kib(server.proc.pid) - before
    call.cancel()
    assert sent[0] < 3000, "the server took every request of a client that reads nothing"
    # what may pile up is bounded by HTTP/2 windows and 16 queued responses
    # (tens of MB, allocator and sanitizer slack included), not by the 60 MB
    # of results the client asked for, nor by the server's memory
    assert grown < 256 * 1024, f"fuseboxd grew by {grown} KiB"
    server.assert_unharmed()


def test_memory_budget(make_server):
    """One budget for all sessions' memory: a session that would pass it is
    refused with RESOURCE_EXHAUSTED naming the budget, and fits again once
    another session has closed."""
    server = make_server("--memory-budget", "3M", "--worker-memory-bytes", "64K")
    c = server.client
    big = dense_layout(256 * 1024)  # 1 MiB of i32
    first = c.new_session(big)
    second = c.new_session(big)
    try:
        c.new_session(big)
        raise AssertionError("a session over the memory budget was admitted")
    except grpc.RpcError as e:
        assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, e.details()
        assert "memory budget 3 MiB is full: sessions " in e.details(), e.details()
        assert "CreateSession of" in e.details() and "memory_budget" in e.details(), e.details()
    c.close_session(pb.CloseSessionRequest(session_id=first), timeout=RPC_TIMEOUT)
    third = c.new_session(big)
    assert third and second
    server.assert_unharmed()


def _faulty_register(server, name):
    """Register a kernel called name (the fault hook's trigger) on a new
    session while another session registers and computes; the error its
    call got (None: it succeeded) and the session id."""
    c = server.client
    sid = c.new_session(dense_layout(16))
    k = store_kernel(2)
    k.name = name
    return _while_another_computes(c, lambda: register(c, sid, k))(), sid


def _while_another_computes(c, call):
    """Start call() on a thread while another session registers and
    computes; returns a function that joins the thread (bounded: a call
    held past the RPC timeout fails the test) and gives the RpcError the
    call raised, or None."""
    result = {"error": None}

    def run():
        try:
            call()
        except grpc.RpcError as e:
            result["error"] = e

    th = threading.Thread(target=run)
    th.start()
    other = c.new_session(dense_layout(16))
    okid = register(c, other, store_kernel(2))[0]
    assert list(c.run(other, [(okid, [i32(4), i32(44)])]).errors) == []

    def finish():
        th.join(RPC_TIMEOUT)
        assert not th.is_alive(), "the worker held its call past the RPC timeout"
        return result["error"]
    return finish


def _ended_and_server_computes(c, sid, what):
    """Session sid is gone (NOT_FOUND), and new sessions still compute."""
    try:
        c.read_field(sid, 2)
        raise AssertionError(f"the {what} session answered")
    except grpc.RpcError as e:
        assert e.code() == grpc.StatusCode.NOT_FOUND, e.details()
    new = c.new_session(dense_layout(16))
    kid = register(c, new, store_kernel(2))[0]
    assert list(c.run(new, [(kid, [i32(1), i32(5)])]).errors) == []


def test_worker_oversized_reply(make_server, monkeypatch):
    """A compromised worker whose reply claims a 512 MiB response to a
    RegisterKernels of one kernel: the broker refuses the length from the
    header (at most what one kernel id can take), before allocating or
    waiting for it, kills the worker and ends only that session."""
    monkeypatch.setenv("FUSEBOXD_FAULT_INJECT", "reply-oversize:big_reply")
    # a long reply timeout: refusing must not wait for the stall
    server = make_server("--worker-reply-timeout-s", "120", "--kernel-timeout-s", "0",
                         "--compile-timeout-s", "0")
    err, sid = _faulty_register(server, "big_reply")
    assert err is not None and err.code() == INTERNAL, err
    d = err.details()
    assert "malformed reply" in d and "536870912 bytes" in d, d
    assert "RegisterKernels" in d and "at most 26 bytes can be legitimate" in d, d
    assert "malformed reply" in server.logtext()
    server.assert_unharmed()
    _ended_and_server_computes(server.client, sid, "lying worker's")


def echo_kernel():
    """echo(x: i64) -> i64 { return x }"""
    k = kernel("echo", [stmt("arg", pb.T_I64, imm=0), stmt("ret", args=[0], imm=0)],
               params=[pb.T_I64])
    k.ret = pb.T_I64
    return k


def test_large_sync_result_within_its_bound(server):
    """The broker bounds a sync reply by the launches sent since the last
    SyncResult: a legitimate large one (4,000 returns of the widest values
    over four batches, and more failed launches than a SyncResult lists)
    still arrives whole."""
    c = server.client
    sid = c.new_session(dense_layout(16))
    kid = register(c, sid, echo_kernel())[0]
    s = Stream(c, sid)
    vals = [(-1) ** i * (2 ** 62 + i) for i in range(4000)]
    for b in range(4):
        s.send(launches=[pb.Launch(kernel=kid, args=[pb.Value(type=pb.T_I64, i=v)])
                         for v in vals[b * 1000:(b + 1) * 1000]])
    # launches that fail: an argument of no valid type, each with a message
    s.send(launches=[pb.Launch(kernel=kid, args=[pb.Value(type=99)]) for _ in range(100)])
    r = s.sync(1)
    assert [x.value.i for x in r.returns] == vals
    assert [x.seq for x in r.returns] == list(range(1, 4001))
    assert len(r.errors) == 64 and r.errors_dropped == 36, (len(r.errors), r.errors_dropped)
    assert all("no valid type" in e.message for e in r.errors)
    # the next sync lists only what came after
    s.send(launches=[pb.Launch(kernel=kid, args=[pb.Value(type=pb.T_I64, i=7)])])
    r2 = s.sync(2)
    assert [x.value.i for x in r2.returns] == [7] and list(r2.errors) == []
    s.close()
    server.assert_unharmed()


def test_worker_allow_list(make_server, monkeypatch):
    """A CPU worker runs under an allow list: a call outside it fails with
    EPERM (opening a file, and calls no worker needs, getcwd and uname,
    that a deny list let through); the worker and the server go on. (The
    fault hook makes the worker registering 'probe' try them.)"""
    monkeypatch.setenv("FUSEBOXD_FAULT_INJECT", "syscall-probe:probe")
    server = make_server()
    err, sid = _faulty_register(server, "probe")
    assert err is not None and err.code() == INTERNAL, err
    assert "fault probe: openat: EPERM; getcwd: EPERM; uname: EPERM" in err.details(), \
        err.details()
    # the worker lives on and computes
    c = server.client
    kid = register(c, sid, store_kernel(2))[0]
    assert list(c.run(sid, [(kid, [i32(3), i32(33)])]).errors) == []
    server.assert_unharmed()


def test_worker_exec_is_killed(make_server, monkeypatch):
    """execve in a CPU worker is what only an attack does: seccomp kills the
    worker (SIGSYS) on the spot; only its session ends."""
    monkeypatch.setenv("FUSEBOXD_FAULT_INJECT", "exec:run_shell")
    server = make_server()
    err, sid = _faulty_register(server, "run_shell")
    assert err is not None and err.code() == INTERNAL, err
    assert "session worker died: SIGSYS" in err.details(), err.details()
    server.assert_unharmed()
    _ended_and_server_computes(server.client, sid, "killed")


@pytest.mark.parametrize("isolation,words", [("process", "a worker process per session"),
                                             ("thread", "sessions in threads")])
def test_start_line_names_the_isolation(make_server, isolation, words):
    """fuseboxd's line at start says how its sessions run, in the words of
    the session operations it picked (fbd_session_ops.serving: the broker
    does not ask the isolation itself)."""
    server = make_server("--isolation", isolation)
    lines = [ln for ln in server.logtext().splitlines() if " serving on " in ln]
    assert len(lines) == 1, server.logtext()
    assert lines[0].endswith(", %s)" % words), lines[0]
    server.assert_unharmed()
