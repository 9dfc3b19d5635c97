"""Attacks on fuseboxd through its public protocol, one per known hole
(docs/security.md). Each asserts the clear refusal a tenant should get,
then that the server is still SERVING and another tenant's field is
unchanged."""
import grpc

from conftest import (Stream, dense_layout, expect_error, i32, kernel, pb, snode, stmt,
                      store_kernel)

INVALID = grpc.StatusCode.INVALID_ARGUMENT
EXHAUSTED = grpc.StatusCode.RESOURCE_EXHAUSTED


def test_legitimate_tenant_still_computes(server):
    """The control: a tenant's own kernel writes its own field."""
    c = server.client
    sid = c.new_session(dense_layout(16))
    kid = c.register(pb.RegisterKernelsRequest(session_id=sid, kernels=[store_kernel(2)]),
                     timeout=60).kernel_ids[0]
    c.write_field(sid, 2, bytes(64))
    res = c.run(sid, [(kid, [i32(3), i32(77)])])
    assert list(res.errors) == []
    server.assert_unharmed()


def test_layout_size_overflow_4d(server):
    """65536^4 cells of 4 bytes wrap to 0 in 64 bits: refused, SNode named."""
    layout = pb.Layout(nodes=[snode(pb.SN_ROOT, -1),
                              snode(pb.SN_DENSE, 0, name="huge", axes=0xF,
                                    size=(65536, 65536, 65536, 65536)),
                              snode(pb.SN_PLACE, 1, name="x", type=pb.T_I32)])
    expect_error(lambda: server.client.new_session(layout), INVALID, "SNode 1", "huge")
    server.assert_unharmed()


def test_raw_protobuf_huge_extent(server):
    """dense(i:3) > dense(i:0x5555555555555555): the front end refuses it,
    the server must too (3 * that is -1 in 64 bits)."""
    layout = pb.Layout(nodes=[snode(pb.SN_ROOT, -1),
                              snode(pb.SN_DENSE, 0, axes=1, size=(3, 1, 1, 1)),
                              snode(pb.SN_DENSE, 1, axes=1, size=(0x5555555555555555, 1, 1, 1)),
                              snode(pb.SN_PLACE, 2, name="x", type=pb.T_I32)])
    expect_error(lambda: server.client.new_session(layout), INVALID, "SNode 2", "2^31-1")
    # negative and zero sizes as well
    for bad in (-1, 0, -(2**63)):
        layout.nodes[2].size[0] = bad
        expect_error(lambda: server.client.new_session(layout), INVALID)
    server.assert_unharmed()


def _chain(depth):
    nodes = [snode(pb.SN_ROOT, -1)]
    for d in range(depth):
        nodes.append(snode(pb.SN_DENSE, d, axes=1 << (d % 4), size=(1, 1, 1, 1)))
    nodes.append(snode(pb.SN_PLACE, depth, name="x", type=pb.T_I32))
    return pb.Layout(nodes=nodes)


def test_deep_layout(server):
    """A 65,000-deep chain once overflowed a completion-queue thread's stack
    in recursive layout code; depth and node count are checked first."""
    expect_error(lambda: server.client.new_session(_chain(65000)), INVALID, "nodes")
    expect_error(lambda: server.client.new_session(_chain(200)), INVALID,
                 "levels below the root")
    server.assert_unharmed()


def test_internal_scratch_ops_refused(server):
    """gtmp_load/gtmp_store address the session's scratch buffer by absolute
    offset (a NULL base when nothing spills): refused, op and statement
    named."""
    c = server.client
    sid = c.new_session(dense_layout(16))
    store = kernel("escape", [stmt("const", pb.T_I64, imm=0x4141), stmt("gtmp_store", args=[0],
                                                                      imm=1 << 40)])
    load = kernel("peek", [stmt("gtmp_load", pb.T_I64, imm=1 << 40)])
    expect_error(lambda: c.register(pb.RegisterKernelsRequest(session_id=sid, kernels=[store]),
                                    timeout=60), INVALID, "%1 gtmp_store", "internal")
    expect_error(lambda: c.register(pb.RegisterKernelsRequest(session_id=sid, kernels=[load]),
                                    timeout=60), INVALID, "%0 gtmp_load", "internal")
    # the session itself is fine afterwards
    kid = c.register(pb.RegisterKernelsRequest(session_id=sid, kernels=[store_kernel(2)]),
                     timeout=60).kernel_ids[0]
    assert list(c.run(sid, [(kid, [i32(1), i32(2)])]).errors) == []
    server.assert_unharmed()


def test_listgen_in_client_kernel_refused(server):
    """listgen in a client kernel (bitmasked -> dynamic, async) crashed the
    server in JIT code; list tasks are the engine's own."""
    c = server.client
    layout = pb.Layout(nodes=[snode(pb.SN_ROOT, -1),
                              snode(pb.SN_BITMASKED, 0, axes=1, size=(8, 1, 1, 1)),
                              snode(pb.SN_DYNAMIC, 1, axes=2, size=(1, 64, 1, 1), chunk=8),
                              snode(pb.SN_PLACE, 2, name="d", type=pb.T_I32)])
    sid = c.new_session(layout, mode="async")
    for op in ("listgen", "clear_list", "gc", "store_na", "rand_seq"):
        k = kernel("sneaky", [stmt(op, snode_id=2)])
        expect_error(lambda: c.register(pb.RegisterKernelsRequest(session_id=sid, kernels=[k]),
                                        timeout=60), INVALID, op, "internal")
    server.assert_unharmed()


def test_compile_bomb_under_budget(make_server):
    """A 100,000-statement kernel compiled for minutes with no budget: it is
    refused before anything compiles it."""
    server = make_server("--max-kernel-statements", "5000")
    c = server.client
    sid = c.new_session(dense_layout(16))
    stmts = [stmt("const", pb.T_I32, imm=1)]
    for i in range(1, 100000):
        stmts.append(stmt("add", pb.T_I32, args=[i - 1, i - 1]))
    bomb = kernel("bomb", stmts)
    expect_error(lambda: c.register(pb.RegisterKernelsRequest(session_id=sid, kernels=[bomb]),
                                    timeout=60), EXHAUSTED, "bomb", "max_kernel_statements")
    server.assert_unharmed()


def _chain_kernel(n):
    """chain(a, i) { x = a; x = x + a, n times; v[i] = x }: n + 4
    statements that no pass folds (each launch's args differ)."""
    stmts = [stmt("arg", pb.T_I32, imm=0), stmt("arg", pb.T_I32, imm=1)]
    prev = 0
    for _ in range(n):
        stmts.append(stmt("add", pb.T_I32, args=[prev, 0]))
        prev = len(stmts) - 1
    stmts.append(stmt("store", args=[1, prev], snode_id=2))
    return kernel("chain", stmts, params=[pb.T_I32, pb.T_I32])


def _get_kernel():
    """get(i) -> i32 { return v[i] }"""
    k = kernel("get", [stmt("arg", pb.T_I32, imm=0), stmt("load", pb.T_I32, args=[0], snode_id=2),
                       stmt("ret", args=[1])], params=[pb.T_I32])
    k.ret = pb.T_I32
    return k


def _chains(server, n_adds):
    """Eight launches of a chain kernel in an async session that asks for
    the most fusion the server allows (max_fuse_per_task 256), then a sync;
    the SyncResult of that sync, and the values of the eight cells (read by
    launches after it)."""
    c = server.client
    sid = c.new_session(dense_layout(16), mode="async", max_fuse_per_task=256)  # the most
    chain, get = c.register(pb.RegisterKernelsRequest(
        session_id=sid, kernels=[_chain_kernel(n_adds), _get_kernel()]), timeout=60).kernel_ids
    s = Stream(c, sid)
    try:
        s.send(launches=[pb.Launch(kernel=chain, args=[i32(a), i32(a)]) for a in range(1, 9)])
        r = s.sync(1)
        s.send(launches=[pb.Launch(kernel=get, args=[i32(a)]) for a in range(1, 9)])
        got = s.sync(2)
        assert list(got.errors) == [], got.errors
        return r, [x.value.i for x in got.returns]
    finally:
        s.close()


def test_fusion_keeps_to_the_compile_budget(make_server):
    """Kernels each within --max-kernel-statements must not add up past it
    through fusion, however high a client sets max_fuse_per_task (the
    server's most, 256): with a budget of 2,000 statements, eight launches
    of a 1,203-statement kernel run as eight tasks, each compiled within the
    budget, and right; under the default budget the same launches fuse."""
    for budget, fuses in (("2000", False), ("20000", True)):
        server = make_server("--max-kernel-statements", budget)
        r, cells = _chains(server, 1200)
        assert list(r.errors) == [], r.errors
        assert cells == [a * 1201 for a in range(1, 9)]
        if fuses:
            assert r.counters.tasks_fused >= 1, r.counters
            assert r.counters.statements_emitted > 2000, r.counters
        else:
            assert r.counters.tasks_fused == 0, r.counters
            assert r.counters.tasks_launched == 8, r.counters
            assert r.counters.statements_emitted <= 2000, r.counters
        server.assert_unharmed()


def test_sparse_field_transfer_bounded(server):
    """A sparse field's extent can dwarf what it holds: a whole-field read
    of 2^16 x 2^16 i32 would stage 16 GiB. Refused by the memory limit."""
    c = server.client
    layout = pb.Layout(nodes=[snode(pb.SN_ROOT, -1),
                              snode(pb.SN_POINTER, 0, axes=3, size=(1024, 1024, 1, 1)),
                              snode(pb.SN_DENSE, 1, axes=3, size=(64, 64, 1, 1)),
                              snode(pb.SN_PLACE, 2, name="s", type=pb.T_I32)])
    sid = c.new_session(layout, memory_limit=64 << 20)
    expect_error(lambda: c.read_field(sid, 3), EXHAUSTED, "'s'", "memory limit")
    expect_error(lambda: c.write_field(sid, 3, b"\0" * 16), EXHAUSTED, "memory limit")
    server.assert_unharmed()


def test_malformed_messages(server):
    """Bytes that are not the message a method expects: INVALID_ARGUMENT,
    nothing else happens."""
    raw = server.client.channel.unary_unary("/fusebox.v1.Fusebox/CreateSession")
    for junk in (b"\xff" * 64, b"\x12\xff\xff\xff\xff\x0f", bytes(range(256))):
        expect_error(lambda: raw(junk, timeout=60), INVALID, "malformed")
    server.assert_unharmed()
