"""Two launches of one async batch whose tasks the optimizer made into the
same task IR, the flush knowing the code of one and not of the other
(engine/worker.c plan_compiles). w1's activating store is demoted once an
earlier flush proved its cells active, and the demoted task, large enough
for a stand-in (FB_STANDIN_MIN_STMTS, 256 statements), runs w1's code as
inserted while its own compiles in the background: its code is known. w2
is w1 with one more write, to g, that kg overwrites before anyone reads
it: dead-store elimination strips it, and demotion then makes of w2 the
very IR of demoted w1; a reshaped task has no stand-in, so its code is not
known. The old planning took the second entry for a repeat of the first
and ran it with the first's "known" code, which for w2 was none: a call
through a NULL pointer, a SIGSEGV in the worker (process isolation: the
tenant's session died) or in fuseboxd itself (thread isolation: every
tenant's sessions). Now each entry whose code is unknown gets a compile.
Through fuseboxd, with passes the client may choose (no fusion, no
listgen removal): the fields must be a sync session's, the session must
go on, and the server and the victim must be unharmed."""
import struct

import pytest

from conftest import RPC_TIMEOUT, Stream, pb

N = 128
CHAIN = 120  # lets in each store's value: well over 256 statements a task


def _value():
    lines = ["let x0 = f32(i) * 0.5 + 1.0"]
    for k in range(1, CHAIN + 1):
        lines.append(f"let x{k} = x{k - 1} * 0.999 + f32(i) * 0.25")
    return "\n    ".join(lines), f"x{CHAIN}"


LETS, LAST = _value()
SOURCE = f"""layout {{
  pointer(i: 16) as p0 {{ dense(i: 8) {{ place q: f32 }} }}
  dense(i: {N}) {{ place g: f32, h: f32 }}
}}
kernel w1() {{ for i in 0 .. {N} {{
    {LETS}
    q[i] = {LAST} }} }}
kernel w2() {{ for i in 0 .. {N} {{
    {LETS}
    q[i] = {LAST}
    g[i] = 2.0 }} }}
kernel rd() {{ for i in 0 .. {N} {{ h[i] = h[i] + q[i] }} }}
kernel kg() {{ for i in 0 .. {N} {{ g[i] = 3.0 }} }}
"""

ROUND = ["w1", "rd", "w2", "kg", "w1", "rd", "w2", "kg"]


def _run(c, mode):
    opts = pb.SessionOptions(mode=mode)
    if mode == "async":
        opts.passes["fusion"] = False
        opts.passes["listgen"] = False
    sid = c.create(pb.CreateSessionRequest(options=opts, source=pb.Source(text=SOURCE)),
                   timeout=RPC_TIMEOUT).session_id
    ids = dict(zip(("w1", "w2", "rd", "kg"),
                   c.register(pb.RegisterKernelsRequest(session_id=sid,
                                                        source=pb.Source(text=SOURCE)),
                              timeout=RPC_TIMEOUT).kernel_ids))
    places = {k: v[0] for k, v in c.places(SOURCE).items()}
    s = Stream(c, sid)
    try:
        s.send(launches=[pb.Launch(kernel=ids["w1"])])
        syncs = [s.sync(1)]
        for n in range(3):
            s.send(launches=[pb.Launch(kernel=ids[k]) for k in ROUND])
            syncs.append(s.sync(2 + n))
        got = {f: c.read_field(sid, places[f]) for f in ("q", "g", "h")}
        return syncs, got
    finally:
        s.close()


@pytest.mark.parametrize("isolation", ["process", "thread"])
def test_same_ir_known_and_unknown_code(make_server, isolation):
    server = make_server("--isolation", isolation)
    c = server.client
    _, want = _run(c, "sync")
    syncs, got = _run(c, "async")
    for r in syncs:
        assert not r.errors, [e.message for e in r.errors]
    for f in ("q", "g", "h"):
        assert got[f] == want[f], f"field {f} differs from a sync session's"
    h = struct.unpack(f"<{N}f", got["h"])
    assert h[N - 1] != 0.0  # rd read what w1 and w2 stored
    server.assert_unharmed()
