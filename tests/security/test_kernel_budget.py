"""Registered kernels (docs/security.md "The memory budget", "kernels"): a
session's kernels stay for the session's life, and each holds its IR
several times over (the engine's copy, its lowered tasks, async the
optimizer bank's entries). The old server counted none of it and had no
limit on how many a session registers, so a tenant could grow fuseboxd
(thread isolation) or its worker (process isolation) without bound by
registering kernels, each a new name or the same name again: a Release
build held 725 MiB more after 200 kernels of 19,000 statements against a
256 MiB budget that said 0 B were used.

Now the IR each session's kernels retain is the budget's "kernels" part,
and a RegisterKernels past the budget is refused RESOURCE_EXHAUSTED naming
the kernel and memory_budget; a session may register at most
--max-kernels-per-session kernels. A refused RegisterKernels registers
nothing; the session's earlier kernels still launch, it registers more when
there is room, and closing it gives the part back. The server stays SERVING
and another tenant's field is unchanged."""
import time

import grpc
import pytest

from conftest import RPC_TIMEOUT, Stream, dense_layout, i32, kernel, pb, stmt, store_kernel
from test_decoded_requests import _call, _hwm_kib
from test_memory_budget import _stats

EXHAUSTED = grpc.StatusCode.RESOURCE_EXHAUSTED
INVALID = grpc.StatusCode.INVALID_ARGUMENT
MIB = 1 << 20
BUDGET = 32 * MIB
NSTMTS = 2000  # per kernel: about 360 KB of retained IR in an async session
PER_REQUEST = 10
MAX_REQUESTS = 100  # 1,000 kernels: the old code held them all


def chain_kernel(name, nstmts=NSTMTS, place=2):
    """k(i, v) { place[i] = v + 1 + 1 + ... } of nstmts statements."""
    s = [stmt("arg", pb.T_I32, imm=0), stmt("arg", pb.T_I32, imm=1),
         stmt("const", pb.T_I32, imm=1)]
    prev = 1
    while len(s) < nstmts - 1:
        s.append(stmt("add", pb.T_I32, args=[prev, 2]))
        prev = len(s) - 1
    s.append(stmt("store", args=[0, prev], snode_id=place))
    return kernel(name, s, params=[pb.T_I32, pb.T_I32])


def _register(c, sid, kernels):
    return c.register(pb.RegisterKernelsRequest(session_id=sid, kernels=kernels),
                      timeout=RPC_TIMEOUT).kernel_ids


def _kernels_bytes_back_to_zero(c):
    """The kernels part once the closed session has left the table (its
    worker ends it after the stream's end: a bounded wait, not a timing)."""
    deadline = time.monotonic() + 30
    while _stats(c).memory.kernels_bytes and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _stats(c).memory.kernels_bytes == 0, _stats(c).memory


@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_many_kernels_refused_by_the_budget(make_server, isolation):
    server = make_server("--memory-budget", str(BUDGET), "--isolation", isolation,
                         "--worker-memory-bytes", "64K")  # not the workers' measure
    c = server.client
    sid = c.new_session(dense_layout(64), mode="async")
    before = _hwm_kib(server)
    got = None
    ids = []
    for r in range(MAX_REQUESTS):
        ks = [chain_kernel(f"chain{r}_{j}") for j in range(PER_REQUEST)]
        got = _call(lambda: ids.extend(_register(c, sid, ks)))
        if got[0] != grpc.StatusCode.OK:
            break
    code, details = got
    assert code == EXHAUSTED, f"{len(ids)} kernels registered, then {code}: {details}"
    assert "(memory_budget)" in details and "kernel 'chain" in details, details
    assert len(ids) >= 20, f"refused after only {len(ids)} kernels: {details}"
    assert len(ids) == len(set(ids)) and ids == sorted(ids)
    m = _stats(c).memory
    assert m.refused >= 1 and 0 < m.kernels_bytes <= BUDGET, m
    if isolation == "thread":
        # the IR lives in fuseboxd: its peak grows by a bounded amount (under
        # AddressSanitizer, which pads and quarantines every allocation, the
        # 32 MiB of counted IR took about 220 MiB; 1,000 kernels took GiBs)
        grew = (_hwm_kib(server) - before) // 1024
        print(f"{len(ids)} kernels, peak grew by {grew} MiB")
        assert grew < 640, f"fuseboxd's peak grew by {grew} MiB"
    # the refused request registered nothing; with its decode done there is
    # room for a small kernel, and the earlier kernels still launch
    small = _register(c, sid, [store_kernel(2)])[0]
    assert small == ids[-1] + 1, (small, ids[-1])
    st = Stream(c, sid)
    st.send(launches=[pb.Launch(kernel=ids[0], args=[i32(3), i32(5)]),
                      pb.Launch(kernel=small, args=[i32(4), i32(7)])])
    sync = st.sync(2)
    assert not sync.errors and sync.seq == 2, sync
    data = c.read_field(sid, 2)
    assert int.from_bytes(data[12:16], "little") == 5 + NSTMTS - 4
    assert int.from_bytes(data[16:20], "little") == 7
    st.close()
    _kernels_bytes_back_to_zero(c)
    server.assert_unharmed()


def test_kernels_per_session_cap(make_server):
    """--max-kernels-per-session counts every kernel registered, a name
    registered again included; a request past it is refused whole."""
    server = make_server("--max-kernels-per-session", "20", "--isolation", "thread")
    c = server.client
    sid = c.new_session(dense_layout(64))
    ids = []
    for _ in range(3):  # the same name again and again: each adds a kernel
        ids += _register(c, sid, [store_kernel(2) for _ in range(5)])
    assert ids == list(range(15))
    assert _stats(c).memory.kernels_bytes > 0
    code, details = _call(lambda: _register(c, sid, [store_kernel(2) for _ in range(6)]))
    assert code == EXHAUSTED, details
    for w in ("max_kernels_per_session", "kernel 'poke'", "number 21", "the session has 15",
              "adds 6"):
        assert w in details, f"{w!r} not in {details!r}"
    ids += _register(c, sid, [store_kernel(2) for _ in range(5)])
    assert ids == list(range(20))
    code, details = _call(lambda: _register(c, sid, [store_kernel(2)]))
    assert code == EXHAUSTED and "max_kernels_per_session" in details, details
    sync = c.run(sid, [(0, [i32(1), i32(11)]), (19, [i32(2), i32(22)])])
    assert not sync.errors and sync.seq == 2, sync
    _kernels_bytes_back_to_zero(c)
    server.assert_unharmed()


def test_refused_request_registers_nothing(make_server):
    """A RegisterKernels whose last kernel is refused keeps none of the
    kernels before it: the client never learnt their ids."""
    server = make_server("--max-kernels-per-session", "4", "--isolation", "thread")
    c = server.client
    sid = c.new_session(dense_layout(64))
    bad = store_kernel(7)  # no SNode 7
    bad.name = "bad"
    for _ in range(5):  # more than the cap, had they been kept
        code, details = _call(lambda: _register(c, sid, [store_kernel(2), bad]))
        assert code == grpc.StatusCode.NOT_FOUND and "'bad'" in details, details
    # the figure follows a job just after its reply: a bounded wait for it
    deadline = time.monotonic() + 30
    while not _stats(c).memory.kernels_bytes and time.monotonic() < deadline:
        time.sleep(0.05)
    held = _stats(c).memory.kernels_bytes
    # no kernel is left, only the session's (empty) table of them: five
    # kept kernels would hold about 10 KB
    assert 0 < held < 4096, held
    assert _register(c, sid, [store_kernel(2)] * 4) == [0, 1, 2, 3]
    server.assert_unharmed()


def test_kernel_name_cannot_pose_as_a_budget_refusal(make_server):
    """A refusal past --max-kernels-per-session quotes the tenant's kernel
    name; a name that holds "(memory_budget)" must not make it count as a
    refusal by the memory budget (GetStats' refused, a WARN line)."""
    server = make_server("--max-kernels-per-session", "2", "--isolation", "thread",
                         "--log-level", "info")
    c = server.client
    sid = c.new_session(dense_layout(64))
    assert _register(c, sid, [store_kernel(2)] * 2) == [0, 1]
    for name in ("x (memory_budget)", "(memory_budget)"):
        k = store_kernel(2)
        k.name = name
        code, details = _call(lambda: _register(c, sid, [k]))
        assert code == EXHAUSTED and "max_kernels_per_session" in details, details
        assert details.endswith("adds 1"), details
    assert _stats(c).memory.refused == 0, _stats(c).memory
    assert "(memory_budget)' would be" not in server.logtext(), server.logtext()
    sync = c.run(sid, [(1, [i32(3), i32(33)])])
    assert not sync.errors and sync.seq == 1, sync
    server.assert_unharmed()


@pytest.mark.parametrize("snode_id", [-1, -7, -2**31])
def test_negative_snode_is_invalid(server, snode_id):
    """A negative SNode id is malformed (INVALID_ARGUMENT naming it), not an
    SNode the layout lacks (NOT_FOUND)."""
    c = server.client
    sid = c.new_session(dense_layout(64))
    code, details = _call(lambda: _register(c, sid, [store_kernel(snode_id)]))
    assert code == INVALID, (code, details)
    assert f"names SNode {snode_id}, which is not an SNode id" in details, details
    assert "kernel 'poke'" in details, details
    assert _register(c, sid, [store_kernel(2)]) == [0]
    server.assert_unharmed()
