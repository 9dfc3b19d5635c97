"""The fair scheduler between tenants, per-tenant compile slots and the
latency histograms, through a real fuseboxd and a stock grpcio client
(docs/security.md, "Fair sharing between tenants").

No assertion here depends on timing: the compile limit is read from the
/metrics counters, and the flood test checks that the other tenant's work
completes with the right results, not how fast (bench/fairness_bench.py
measures that)."""
import json
import re
import secrets
import signal
import threading
import time

import grpc
import pytest

from conftest import RPC_TIMEOUT, Stream, dense_layout, i32, kernel, pb, stmt, store_kernel
from test_tls_tenants import _get, daemons, serving, sha, tenant_client  # noqa: F401

assert daemons  # a fixture, used by name


def metrics(d):
    m = re.search(r"metrics on (http://127\.0\.0\.1:\d+)/metrics", d.logtext())
    assert m, d.logtext()
    st, body = _get(m.group(1) + "/metrics")
    assert st == 200
    return body


def values(body):
    vals = {}
    for line in body.splitlines():
        if line and not line.startswith("#"):
            k, v = line.rsplit(" ", 1)
            vals[k] = float(v)
    return vals


def two_tenants(daemons, args=(), limits=None):
    toks = {"flood": secrets.token_urlsafe(16), "light": secrets.token_urlsafe(16)}
    spec = [{"name": n, "token_sha256": [sha(t)],
             "limits": dict({"max_sessions": 8}, **((limits or {}).get(n, {})))}
            for n, t in toks.items()]
    d = daemons("unix", ["--metrics-listen", "127.0.0.1:0", *args], tenants=spec)
    return d, {n: tenant_client(d.address, t) for n, t in toks.items()}, spec


def busy_kernel(place, n):
    """busy() { for i in 0..n: place[i & 255] = i }"""
    return kernel("busy", [stmt("const", pb.T_I32, imm=0), stmt("const", pb.T_I32, imm=n),
                           stmt("range_for", args=[0, 1], body=1),
                           stmt("loop_index", pb.T_I32, args=[2], imm=0),
                           stmt("const", pb.T_I32, imm=255),
                           stmt("and", pb.T_I32, args=[3, 4]),
                           stmt("store", args=[5, 3], snode_id=place)],
                  blocks=[[0, 1, 2], [3, 4, 5, 6]])


def chain_kernel(name, n):
    """A kernel of n statements that LLVM must keep (a slow compile)."""
    stmts = [stmt("arg", pb.T_I32, imm=0)]
    for i in range(1, n):
        stmts.append(stmt("mul", pb.T_I32, args=[i - 1, 0]) if i % 2 else
                     stmt("add", pb.T_I32, args=[i - 1, i - 2]))
    idx = len(stmts)
    stmts.append(stmt("const", pb.T_I32, imm=1))
    stmts.append(stmt("store", args=[idx, idx - 1], snode_id=2))
    return kernel(name, stmts, params=[pb.T_I32])


def register(c, sid, *kernels):
    return list(c.register(pb.RegisterKernelsRequest(session_id=sid, kernels=list(kernels)),
                           timeout=RPC_TIMEOUT).kernel_ids)


# ---------------------------------------------------------------- compile slots

def test_compile_concurrency_limit(daemons):
    """A tenant with max_compiles 1 registers from four sessions at once:
    every register succeeds, and /metrics never saw two of its compiles
    running together."""
    d, cl, _ = two_tenants(daemons, limits={"flood": {"max_compiles": 1}})
    c = cl["flood"]
    sids = [c.new_session(dense_layout(16)) for _ in range(4)]
    got, errors = {}, []

    def reg(i, sid):
        try:
            got[i] = register(c, sid, chain_kernel(f"slow{i}", 3000), store_kernel(2))
        except grpc.RpcError as e:
            errors.append(f"{e.code()}: {e.details()}")

    threads = [threading.Thread(target=reg, args=(i, s)) for i, s in enumerate(sids)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(RPC_TIMEOUT * 2)
    assert not errors, errors
    assert sorted(got) == [0, 1, 2, 3] and all(len(v) == 2 for v in got.values())
    vals = values(metrics(d))
    assert vals['fusebox_tenant_max_compiles{tenant="flood"}'] == 1
    assert vals['fusebox_tenant_max_compiles{tenant="light"}'] == 2  # the default
    assert vals['fusebox_tenant_compiles_total{tenant="flood"}'] == 4
    assert vals['fusebox_tenant_compiles_in_flight_peak{tenant="flood"}'] == 1
    assert vals['fusebox_tenant_compiles_in_flight{tenant="flood"}'] == 0
    assert 0 <= vals['fusebox_tenant_compile_waits_total{tenant="flood"}'] <= 3
    # the compiled kernels work: each session stores through its poke
    for sid, ids in zip(sids, (got[i] for i in range(4))):
        s = Stream(c, sid)
        s.send(launches=[pb.Launch(kernel=ids[1], args=[i32(3), i32(77)])], sync=1)
        assert list(s.next().errors) == []
        s.close()
    assert serving(c)


# ---------------------------------------------------------------- settings

def test_scheduler_settings_are_checked(daemons):
    for limits, words in [({"time_share": 0}, "time_share: expected an integer 1..1000"),
                          ({"time_share": "3"}, "time_share"),
                          ({"time_share": 1001}, "time_share"),
                          ({"max_compiles": -1}, "max_compiles: expected an integer 0..1024"),
                          ({"max_compiles": 2.5}, "max_compiles")]:
        d = daemons("unix", tenants=[{"name": "a", "subjects": ["CN=a"], "limits": limits}],
                    expect_start=False)
        assert d.proc.wait(timeout=60) == 1
        assert words in d.logtext(), d.logtext()
    for flags, words in [(["--fair-share", "maybe"], "--fair-share: invalid value 'maybe'"),
                         (["--fair-slice-ms", "0"], "--fair-slice-ms: invalid value '0'")]:
        d = daemons("unix", flags, expect_start=False)
        assert d.proc.wait(timeout=60) == 2
        assert words in d.logtext(), d.logtext()


def test_scheduler_settings_reload_on_sighup(daemons):
    """SIGHUP applies new time_share and max_compiles; a file with a bad
    value is refused and the running values stay."""
    d, cl, spec = two_tenants(daemons, limits={"light": {"time_share": 3}})
    sid = cl["light"].new_session(dense_layout(8))
    vals = values(metrics(d))
    assert vals['fusebox_tenant_time_share{tenant="light"}'] == 3
    assert vals['fusebox_tenant_time_share{tenant="flood"}'] == 1
    spec[1]["limits"].update(time_share=7, max_compiles=5)
    with open(d.tenants_path, "w") as f:
        json.dump({"tenants": spec}, f)
    d.proc.send_signal(signal.SIGHUP)
    d.wait_log(r"SIGHUP: reloaded 2 tenants", "tenants reload")
    vals = values(metrics(d))
    assert vals['fusebox_tenant_time_share{tenant="light"}'] == 7
    assert vals['fusebox_tenant_max_compiles{tenant="light"}'] == 5
    spec[1]["limits"]["time_share"] = 0
    with open(d.tenants_path, "w") as f:
        json.dump({"tenants": spec}, f)
    d.proc.send_signal(signal.SIGHUP)
    d.wait_log(r"tenants file not reloaded.*time_share: expected an integer 1\.\.1000",
               "refused reload")
    vals = values(metrics(d))
    assert vals['fusebox_tenant_time_share{tenant="light"}'] == 7
    assert vals['fusebox_tenant_max_compiles{tenant="light"}'] == 5
    assert cl["light"].read_field(sid, 2) == bytes(32)  # still served
    assert serving(cl["light"])


# ---------------------------------------------------------------- histograms

HIST_LINE = re.compile(r'^fusebox_(\w+?)_(bucket|sum|count)\{tenant="([\w.-]*)"(?:,le="([^"]+)")?\} '
                       r'(\S+)$')


def histograms(body):
    """{(name, tenant): {"buckets": [(le, count)], "sum": x, "count": n}}, and
    the names declared '# TYPE ... histogram'."""
    declared = set(re.findall(r"^# TYPE fusebox_(\w+) histogram$", body, re.M))
    out = {}
    for line in body.splitlines():
        m = HIST_LINE.match(line)
        if not m or m.group(1) not in declared:
            continue
        h = out.setdefault((m.group(1), m.group(3)), {"buckets": []})
        if m.group(2) == "bucket":
            h["buckets"].append((m.group(4), float(m.group(5))))
        else:
            h[m.group(2)] = float(m.group(5))
    return declared, out


def test_latency_histograms(daemons):
    d, cl, _ = two_tenants(daemons)
    c = cl["light"]
    sid = c.new_session(dense_layout(16))
    kid = register(c, sid, store_kernel(2))[0]
    s = Stream(c, sid)
    for i in range(1, 6):
        s.send(launches=[pb.Launch(kernel=kid, args=[i32(i), i32(i)])], sync=i)
        assert s.next().sync_id == i
    s.send(launches=[pb.Launch(kernel=kid, args=[i32(0), i32(9)])])  # no sync: not counted
    s.close()
    body = metrics(d)
    declared, h = histograms(body)
    assert {"tenant_sync_latency_seconds", "tenant_compile_seconds"} <= declared
    for name, count in [("tenant_sync_latency_seconds", 5), ("tenant_compile_seconds", 1)]:
        x = h[(name, "light")]
        les = [le for le, _ in x["buckets"]]
        assert les[-1] == "+Inf" and len(les) == len(set(les)) > 5
        bounds = [float(le) for le in les[:-1]]
        assert bounds == sorted(bounds)
        counts = [n for _, n in x["buckets"]]
        assert counts == sorted(counts), "bucket counts must be cumulative"
        assert counts[-1] == x["count"] == count
        assert x["sum"] > 0
        assert h[(name, "flood")]["count"] == 0 if (name, "flood") in h else True
    vals = values(body)
    assert vals["fusebox_fair_share"] == 1
    for m in ["tenant_sched_queued", "tenant_sched_waiting", "tenant_sched_held_seconds_total",
              "tenant_sched_paused_total", "tenant_device_seconds_total"]:
        assert f'fusebox_{m}{{tenant="light"}}' in vals, m
        assert f"# TYPE fusebox_{m} " in body
    assert vals['fusebox_tenant_device_seconds_total{tenant="light"}'] > 0
    assert sid not in body and sid[:8] not in body


# ---------------------------------------------------------------- the flood

@pytest.mark.parametrize("isolation,fair", [("process", "on"), ("thread", "on"),
                                             ("process", "off")])
def test_flood_does_not_starve_another_tenant(daemons, isolation, fair):
    """Tenant flood keeps two sessions busy with a heavy kernel, several
    batches in flight each; tenant light meanwhile writes, computes, syncs
    and reads its field back: all of it completes with the right bytes, the
    flood's results are right too, and the server stays SERVING. The flood
    then vanishes mid-stream (and SIGTERM at the end must still exit 0).
    With --fair-share off the same holds, and nobody was held back."""
    d, cl, _ = two_tenants(daemons, ["--isolation", isolation, "--spare-workers", "3",
                                     "--fair-share", fair],
                           limits={"light": {"time_share": 2}})
    f, li = cl["flood"], cl["light"]
    floods = []
    for _ in range(2):
        sid = f.new_session(dense_layout(256))
        floods.append((sid, register(f, sid, busy_kernel(2, 1 << 20))[0]))
    sid = li.new_session(dense_layout(256))
    poke = register(li, sid, store_kernel(2))[0]
    stop = threading.Event()
    problems, done = [], [0, 0]

    def flood(k, fsid, kid):
        s = Stream(f, fsid)
        seq, inflight = 0, 0
        try:
            while not stop.is_set():
                while inflight < 4:
                    seq += 1
                    s.send(launches=[pb.Launch(kernel=kid)], sync=seq)
                    inflight += 1
                r = s.next()
                inflight -= 1
                if list(r.errors):
                    problems.append(str(r.errors))
                done[k] += 1
        except grpc.RpcError as e:
            if not stop.is_set():
                problems.append(f"{e.code()}: {e.details()}")
        finally:
            s.it.cancel()  # the flood vanishes with batches in flight

    threads = [threading.Thread(target=flood, args=(k, s, kid)) for k, (s, kid) in
               enumerate(floods)]
    for t in threads:
        t.start()
    try:
        s = Stream(li, sid)
        want = bytearray(256 * 4)
        for i in range(40):
            s.send(launches=[pb.Launch(kernel=poke, args=[i32(i * 5 % 256), i32(1000 + i)])],
                   sync=i + 1)
            r = s.next()
            assert r.sync_id == i + 1 and list(r.errors) == []
            want[i * 5 % 256 * 4:(i * 5 % 256 + 1) * 4] = (1000 + i).to_bytes(4, "little")
        # read while the stream is open: closing it ends the session
        assert li.read_field(sid, 2) == bytes(want)
        s.close()
        assert serving(li)
        # the flood is held back, never starved: on a loaded machine light's
        # 40 syncs may all finish before the flood's first batch does, so
        # give each flood session a bounded while to complete one
        deadline = time.monotonic() + RPC_TIMEOUT
        while not all(n > 0 for n in done) and not problems and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        stop.set()
        for t in threads:
            t.join(RPC_TIMEOUT)
    assert not problems, problems
    assert all(n > 0 for n in done), done
    vals = values(metrics(d))
    assert vals['fusebox_tenant_sync_latency_seconds_count{tenant="light"}'] == 40
    assert vals['fusebox_tenant_device_seconds_total{tenant="flood"}'] > 0
    assert vals["fusebox_fair_share"] == (fair == "on")
    if fair == "off":
        for t in ("flood", "light"):
            assert vals[f'fusebox_tenant_sched_paused_total{{tenant="{t}"}}'] == 0
            assert vals[f'fusebox_tenant_sched_held_jobs_total{{tenant="{t}"}}'] == 0
    # the server goes on serving both tenants after the flood vanished
    sid2 = f.new_session(dense_layout(8))
    assert f.read_field(sid2, 2) == bytes(32)
    assert serving(f)
