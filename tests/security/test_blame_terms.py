"""Errors through fuseboxd in the user's terms (the standards: never an
internal kernel or task name, never an IR value). The engine cuts a kernel
into tasks named "k.t0", "k.t1" and fuses them ("a.t0+b.t0"); a tenant
wrote none of them. Out of bounds in a kernel's 2nd top-level loop and in
its serial code (sync and async sessions), and out of memory in a fused
task of two launches that both take blocks: each error names the kernel,
the launch (async; its seq in both), and the part of the kernel as the
tenant wrote it, and matches none of `.t<digit>`, `%<digit>`, `task <name>`.
tests/test_blame.c checks the same through the C API, with the classes the
engine's test hooks reach (compile refused, cancelled)."""
import re

from conftest import RPC_TIMEOUT, Stream, i32, pb

INTERNAL = re.compile(r"\.t[0-9]|%[0-9]|(^|[^A-Za-z_])task [A-Za-z_'\"]")
N = 64
PROGRAM = f"""layout {{
  dense(i: {N}) {{ place a: i32, b: i32 }}
  pointer(i: {N}) as blk {{ dense(i: 1024) {{ place f: f32 }} }}
  pointer(i: {N}) as blk2 {{ dense(i: 1024) {{ place g: f32 }} }}
}}
kernel two(o: i32) {{
  for i in a {{ a[i] = 1 }}
  b[0] = 5
  for i in a {{ b[i + o] = 2 }}
}}
kernel ser(o: i32) {{ b[o] = 1 }}
kernel hog(k: i32) {{ for i in a {{ f[i * 1024] = 1.0 * k }} }}
kernel hog2(k: i32) {{ for i in a {{ g[i * 1024] = 2.0 * k }} }}
"""


def _user_terms(msg, kernel, launch=None):
    assert not INTERNAL.search(msg), msg
    who = f"kernel '{kernel}'" if launch is None else f"kernel '{kernel}' (launch {launch}"
    assert who in msg, (who, msg)


def _session(c, mode, limit=0):
    sid = c.create(pb.CreateSessionRequest(options=pb.SessionOptions(mode=mode, memory_limit=limit),
                                           source=pb.Source(text=PROGRAM)),
                   timeout=RPC_TIMEOUT).session_id
    ids = c.register(pb.RegisterKernelsRequest(session_id=sid, source=pb.Source(text=PROGRAM)),
                     timeout=RPC_TIMEOUT).kernel_ids
    return sid, dict(zip(["two", "ser", "hog", "hog2"], ids))


def test_out_of_bounds_names_kernel_launch_and_loop(server):
    c = server.client
    got = {}
    for mode in ("sync", "async"):
        sid, k = _session(c, mode)
        s = Stream(c, sid)
        try:
            s.send(launches=[pb.Launch(kernel=k["two"], args=[i32(1)])])
            first = s.sync(1)
            s.send(launches=[pb.Launch(kernel=k["ser"], args=[i32(N)])])
            second = s.sync(2)
        finally:
            s.close()
        assert [e.seq for e in first.errors] == [1], first.errors
        assert [e.seq for e in second.errors] == [2], second.errors
        loop, serial = first.errors[0].message, second.errors[0].message
        _user_terms(loop, "two", 0 if mode == "async" else None)
        _user_terms(serial, "ser", 1 if mode == "async" else None)
        assert "indexed a field out of bounds in its 2nd top-level loop;" in loop, loop
        assert "indexed a field out of bounds in its serial code;" in serial, serial
        got[mode] = loop
    assert got["async"].replace(" (launch 0)", "") == got["sync"], got
    server.assert_unharmed()


def test_fused_out_of_memory_names_launches(server):
    c = server.client
    sid, k = _session(c, "async", limit=64 << 10)
    s = Stream(c, sid)
    try:
        s.send(launches=[pb.Launch(kernel=k["hog"], args=[i32(1)]),
                         pb.Launch(kernel=k["hog2"], args=[i32(2)])])
        res = s.sync(1)
    finally:
        s.close()
    assert res.counters.tasks_fused >= 1, res.counters  # the pair ran as one task
    assert len(res.errors) == 1, res.errors
    msg = res.errors[0].message
    assert res.errors[0].seq == 1, res.errors
    _user_terms(msg, "hog", 0)
    assert "or the later launch fused with it, kernel 'hog2' (launch 1)," in msg, msg
    server.assert_unharmed()
