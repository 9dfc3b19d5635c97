"""The compile cache on disk (--code-cache-dir, docs/code-cache.md) through
a real fuseboxd: a restart compiles nothing and hits the disk for every
task; tenant B never hits tenant A's entries; and a hostile cache directory
(a symlink planted, an entry copied from another tenant, garbage, an entry
with a flipped byte, one readable by others) is refused, recompiled and
counted, with the results right and the server SERVING."""
import json
import os
import re
import secrets
import shutil
import stat
import tempfile
import time
import urllib.request

import pytest

from conftest import RPC_TIMEOUT, Stream, health_pb2, pb
from test_tls_tenants import Daemon, sha, tenant_client

PROGRAM = """layout {
  dense(i: 64) { place x: i32 }
  dense(i: 64) { place y: f32 }
}
kernel fill(k: i32) { for i in x { x[i] = i * k + 3 } }
kernel mix() { for i in y { y[i] = f32(x[i]) * 0.5 + sin(f32(i)) } }
kernel bump() { for i in x { x[i] = x[i] * 2 + 1 } }
kernel more0() { for i in y { y[i] = y[i] + 1.0 } }
kernel more1() { for i in x { x[i] = x[i] - 3 } }
kernel more2() { for i in y { y[i] = y[i] * 3.0 } }
kernel more3() { for i in x { x[i] = x[i] ^ 5 } }
"""


def run_program(client, mode="sync"):
    """Register PROGRAM, run fill(7), mix, bump, sync; (x bytes, y bytes,
    counters)."""
    c = client
    text = PROGRAM
    options = pb.SessionOptions(mode=mode)
    sid = c.create(pb.CreateSessionRequest(options=options, source=pb.Source(text=text)),
                   timeout=RPC_TIMEOUT).session_id
    ids = list(c.register(pb.RegisterKernelsRequest(session_id=sid, source=pb.Source(text=text)),
                          timeout=RPC_TIMEOUT).kernel_ids)
    places = c.places(text)
    s = Stream(c, sid)
    try:
        s.send(launches=[pb.Launch(kernel=ids[0], args=[pb.Value(type=pb.T_I32, i=7)]),
                         pb.Launch(kernel=ids[1]), pb.Launch(kernel=ids[2])])
        r = s.sync(1)
        assert list(r.errors) == [], r.errors
        return c.read_field(sid, places["x"][0]), c.read_field(sid, places["y"][0]), r.counters
    finally:
        s.close()


def expected_x():
    return b"".join(((i * 7 + 3) * 2 + 1).to_bytes(4, "little", signed=True) for i in range(64))


def metrics(d, settle=None):
    """The disk-cache counters of /metrics. With settle ({(name, tenant):
    value}), read again until those reach their values or 10 s pass: a
    worker's put reaches the broker's cache thread after the job's answer,
    so the last write may be counted a moment after the run returns."""
    until = time.monotonic() + 10
    while True:
        out = metrics_once(d)
        if not settle or all(out.get(k) == v for k, v in settle.items()) \
                or time.monotonic() > until:
            return out
        time.sleep(0.05)


def metrics_once(d):
    m = re.search(r"metrics on (http://127\.0\.0\.1:\d+)/metrics", d.logtext())
    assert m, d.logtext()
    with urllib.request.urlopen(m.group(1) + "/metrics", timeout=RPC_TIMEOUT) as r:
        body = r.read().decode()
    out = {}
    for name, tenant, v in re.findall(
            r'^fusebox_(code_cache_disk_\w+)\{tenant="([^"]*)"\} (\d+)$', body, re.M):
        out[(name, tenant)] = int(v)
    return out


@pytest.fixture
def cache_env():
    tmp = tempfile.TemporaryDirectory(prefix="fbcc-")
    toks = {n: secrets.token_urlsafe(24) for n in ("alice", "bob")}
    spec = [{"name": n, "token_sha256": [sha(t)]} for n, t in toks.items()]
    tpath = os.path.join(tmp.name, "tenants.json")
    with open(tpath, "w") as f:
        json.dump({"tenants": spec}, f)
    env = {"tmp": tmp.name, "dir": os.path.join(tmp.name, "cache"), "toks": toks,
           "daemons": [], "n": 0}

    def start(isolation="thread", extra=()):
        env["n"] += 1
        run = os.path.join(tmp.name, f"run{env['n']}")
        os.mkdir(run)
        d = Daemon(run, "unix:" + os.path.join(run, "fuseboxd.sock"),
                   ["--tenants", tpath, "--isolation", isolation,
                    "--metrics-listen", "127.0.0.1:0",
                    "--code-cache-dir", env["dir"],
                    "--code-cache-key", os.path.join(tmp.name, "cache.key"), *extra], True)
        env["daemons"].append(d)
        d.clients = {n: tenant_client(d.address, t) for n, t in toks.items()}
        return d

    def stop(d):
        for c in d.clients.values():
            c.close()
        d.stop()
        env["daemons"].remove(d)

    env["start"], env["stop"] = start, stop
    yield env
    for d in list(env["daemons"]):
        stop(d)
    tmp.cleanup()


def entries(cache_dir):
    """{tenant directory: [entry files]}"""
    out = {}
    for t in sorted(os.listdir(cache_dir)):
        p = os.path.join(cache_dir, t)
        out[t] = sorted(f for f in os.listdir(p) if f.endswith(".fbc"))
    return out


@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_restart_hits_disk_and_tenants_apart(cache_env, isolation):
    """Under process isolation the workers ask the broker, which alone
    reads, verifies and writes the directory."""
    env = cache_env
    d = env["start"](isolation)
    x, y, c0 = run_program(d.clients["alice"])
    assert x == expected_x()
    assert c0.tasks_compiled >= 3 and c0.cache_hits == 0, c0
    m = metrics(d, {("code_cache_disk_writes_total", "alice"): c0.tasks_compiled})
    assert m[("code_cache_disk_writes_total", "alice")] == c0.tasks_compiled, m
    assert m[("code_cache_disk_hits_total", "alice")] == 0, m
    env["stop"](d)
    ent = entries(env["dir"])
    assert sum(len(v) for v in ent.values()) == c0.tasks_compiled, ent
    for t in ent:
        st = os.stat(os.path.join(env["dir"], t))
        assert stat.S_IMODE(st.st_mode) == 0o700
    assert stat.S_IMODE(os.stat(os.path.join(env["tmp"], "cache.key")).st_mode) == 0o600

    # a restart: nothing compiled, every task from disk, the same results
    d = env["start"](isolation)
    x2, y2, c1 = run_program(d.clients["alice"])
    assert (x2, y2) == (x, y)
    assert c1.tasks_compiled == 0, c1
    assert c1.cache_hits == c0.tasks_compiled, c1
    assert c1.compile_s == 0, c1
    m = metrics(d)
    assert m[("code_cache_disk_hits_total", "alice")] == c0.tasks_compiled, m
    assert m[("code_cache_disk_rejects_total", "alice")] == 0, m

    # bob runs the same program: his own directory, compiled afresh, no hit
    xb, yb, cb = run_program(d.clients["bob"])
    assert (xb, yb) == (x, y)
    assert cb.tasks_compiled == c0.tasks_compiled and cb.cache_hits == 0, cb
    m = metrics(d, {("code_cache_disk_writes_total", "bob"): c0.tasks_compiled})
    assert m[("code_cache_disk_hits_total", "bob")] == 0, m
    assert m[("code_cache_disk_writes_total", "bob")] == c0.tasks_compiled, m
    env["stop"](d)
    ent = entries(env["dir"])
    assert len([t for t, v in ent.items() if v]) == 2, ent


def test_hostile_cache_dir(cache_env):
    """Entries replaced by a symlink, by the other tenant's copy, by
    garbage, with a flipped byte, swapped with each other, and made
    readable by others: each refused and counted, recompiled, results
    right; fuseboxd keeps SERVING."""
    env = cache_env
    d = env["start"]()
    x, y, c0 = run_program(d.clients["alice"])
    run_program(d.clients["bob"])
    env["stop"](d)
    ent = entries(env["dir"])
    # one tenant's directory is tampered with, the other left alone (which
    # is whose does not matter: the counts below sum both tenants)
    (adir, afiles), (bdir, bfiles) = [(t, v) for t, v in ent.items() if v]
    assert len(afiles) == len(bfiles) and not set(afiles) & set(bfiles)  # keys per tenant
    n = len(afiles)
    assert n >= 7
    apath = [os.path.join(env["dir"], adir, f) for f in afiles]
    bpath = [os.path.join(env["dir"], bdir, f) for f in bfiles]
    outside = os.path.join(env["tmp"], "planted")
    shutil.copy(bpath[0], outside)
    os.chmod(outside, 0o600)
    # 0: a symlink to a sound entry elsewhere; 1: the other tenant's entry;
    # 2: garbage; 3: a byte flipped; 4 and 5 swapped; the rest readable by
    # others
    os.unlink(apath[0])
    os.symlink(outside, apath[0])
    shutil.copy(bpath[1], apath[1])
    with open(apath[2], "wb") as f:
        f.write(os.urandom(300))
    os.chmod(apath[2], 0o600)
    with open(apath[3], "r+b") as f:  # one byte of the object flipped
        f.seek(os.path.getsize(apath[3]) // 2)
        b = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([b[0] ^ 0x20]))
    os.rename(apath[4], apath[4] + ".t")  # two entries swapped
    os.rename(apath[5], apath[4])
    os.rename(apath[4] + ".t", apath[5])
    for i in range(6, n):
        os.chmod(apath[i], 0o644)
    d = env["start"]()
    got = {}
    for who in ("alice", "bob"):
        xs, ys, cs = run_program(d.clients[who])
        assert (xs, ys) == (x, y), who
        got[who] = cs
    m = metrics(d)
    rej = m[("code_cache_disk_rejects_total", "alice")] + m[("code_cache_disk_rejects_total", "bob")]
    hits = m[("code_cache_disk_hits_total", "alice")] + m[("code_cache_disk_hits_total", "bob")]
    assert rej == n, m  # every planted entry refused, none believed
    assert hits == n, m  # the other tenant's untouched entries hit
    assert sum(c.tasks_compiled for c in got.values()) == n
    assert os.path.exists(outside)  # the link was removed, not what it named
    for c in d.clients.values():
        assert c.health() == health_pb2.HealthCheckResponse.SERVING
    env["stop"](d)
    # rewritten: a third start hits everything for both
    d = env["start"]()
    for who in ("alice", "bob"):
        xs, ys, cs = run_program(d.clients[who])
        assert (xs, ys) == (x, y)
        assert cs.tasks_compiled == 0, (who, cs)
    m = metrics(d)
    assert m[("code_cache_disk_rejects_total", "alice")] == 0
    assert m[("code_cache_disk_rejects_total", "bob")] == 0
    env["stop"](d)


def test_two_servers_share_a_directory(cache_env):
    env = cache_env
    d1 = env["start"]()
    d2 = env["start"]()
    r1 = run_program(d1.clients["alice"])
    r2 = run_program(d2.clients["alice"])
    assert r1[:2] == r2[:2]
    assert r2[2].tasks_compiled == 0, r2[2]  # the second found the first's entries
    m = metrics(d2)
    assert m[("code_cache_disk_rejects_total", "alice")] == 0
    env["stop"](d1)
    env["stop"](d2)


def test_bad_key_file_stops_the_start(cache_env):
    env = cache_env
    key = os.path.join(env["tmp"], "cache.key")
    with open(key, "wb") as f:
        f.write(os.urandom(32))
    os.chmod(key, 0o644)
    run = os.path.join(env["tmp"], "badkey")
    os.mkdir(run)
    d = Daemon(run, "unix:" + os.path.join(run, "fuseboxd.sock"),
               ["--isolation", "thread", "--code-cache-dir", env["dir"],
                "--code-cache-key", key], False)
    assert "code cache key" in d.logtext() and "0600" in d.logtext(), d.logtext()


def test_private_daemon_serves_without_its_cache(cache_env):
    """A private daemon's cache is the client's default: a directory it
    cannot use turns the cache off (a warning) rather than the daemon."""
    env = cache_env
    bad = os.path.join(env["tmp"], "not-a-dir")
    with open(bad, "w") as f:
        f.write("x")
    run = os.path.join(env["tmp"], "private")
    os.mkdir(run)
    d = Daemon(run, "unix:" + os.path.join(run, "fuseboxd.sock"),
               ["--private", "--isolation", "thread", "--code-cache-dir", bad], True)
    try:
        c = tenant_client(d.address)
        x, _, counters = run_program(c)
        assert x == expected_x() and counters.tasks_compiled >= 3
        c.close()
        assert "compile cache on disk off" in d.logtext(), d.logtext()
    finally:
        d.stop()


def test_bad_cache_dir_stops_a_shared_server(cache_env):
    """Named by its operator, a cache directory that is a file, or that
    others may write, stops the start with a message naming it."""
    env = cache_env
    bad = os.path.join(env["tmp"], "a-file")
    with open(bad, "w") as f:
        f.write("x")
    loose = os.path.join(env["tmp"], "loose")
    os.mkdir(loose)
    os.chmod(loose, 0o777)
    for where, words in ((bad, "Not a directory"), (loose, "mode 777")):
        run = tempfile.mkdtemp(dir=env["tmp"])
        d = Daemon(run, "unix:" + os.path.join(run, "fuseboxd.sock"),
                   ["--isolation", "thread", "--code-cache-dir", where], False)
        d.stop()
        assert d.proc.returncode != 0
        assert where in d.logtext() and words in d.logtext(), d.logtext()


def test_bound_evicts_per_tenant_share(cache_env):
    """--code-cache-disk-bytes is shared among the two tenants and the
    anonymous one: past a tenant's share its least recently used entries
    go, the tenant stays within its share, and the results stay right
    after a restart (which, the program's tasks in a cycle larger than the
    share, compiles them again: least recently used is always the next)."""
    env = cache_env
    share = 2500  # about one entry of PROGRAM's
    d = env["start"]("thread", ["--code-cache-disk-bytes", str(3 * share)])
    x, y, c0 = run_program(d.clients["alice"])
    m = metrics(d, {("code_cache_disk_writes_total", "alice"): c0.tasks_compiled})
    assert m[("code_cache_disk_writes_total", "alice")] == c0.tasks_compiled
    assert m[("code_cache_disk_evictions_total", "alice")] >= 1, m
    assert 0 < m[("code_cache_disk_bytes", "alice")] <= share, m
    env["stop"](d)
    kept = sum(len(v) for v in entries(env["dir"]).values())
    assert 1 <= kept < c0.tasks_compiled
    d = env["start"]("thread", ["--code-cache-disk-bytes", str(3 * share)])
    x2, y2, c1 = run_program(d.clients["alice"])
    assert (x2, y2) == (x, y)
    assert c1.tasks_compiled + c1.cache_hits == c0.tasks_compiled + c0.cache_hits, c1
    m = metrics(d)
    assert 0 < m[("code_cache_disk_bytes", "alice")] <= share, m
    assert m[("code_cache_disk_rejects_total", "alice")] == 0, m
    env["stop"](d)


def test_config_file_keys(cache_env):
    """The same settings from the config file (deploy/fuseboxd.json's keys)."""
    env = cache_env
    run = os.path.join(env["tmp"], "conf")
    os.mkdir(run)
    conf = os.path.join(run, "fuseboxd.json")
    with open(conf, "w") as f:
        json.dump({"isolation": "thread", "code_cache_dir": env["dir"],
                   "code_cache_key": os.path.join(env["tmp"], "conf.key"),
                   "code_cache_disk_bytes": "1M"}, f)
    for round_ in range(2):
        d = Daemon(run, "unix:" + os.path.join(run, "fuseboxd.sock"), ["--config", conf], True)
        try:
            c = tenant_client(d.address)
            x, _, counters = run_program(c)
            c.close()
            assert x == expected_x()
            if round_ == 0:
                assert counters.tasks_compiled >= 3, counters
            else:
                assert counters.tasks_compiled == 0 and counters.cache_hits >= 3, counters
        finally:
            d.stop()
    assert os.path.exists(os.path.join(env["tmp"], "conf.key"))
