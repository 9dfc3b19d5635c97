"""Workers under a user of each tenant's own (--worker-uid-base,
--worker-uid-count; docs/security.md, "A user per tenant"): started as
root, fuseboxd runs the worker of a session of tenant k as uid and gid
base + k (base itself for sessions without a tenant), so that a worker of
one tenant that got past its seccomp filter still could not signal another
tenant's workers. A tenant keeps its number across tenants-file reloads,
and no number is ever given to two tenants: a file that would need more
uids than the range holds is refused.

The attacker here is a process with the uid and gid of tenant A's worker
(what A's JIT code would be, its filter gone): it may signal A's own
worker, which shows the check can fail, and must not signal B's. Each test
also checks SERVING and that the other tenant's field is unchanged."""
import grp
import json
import os
import pwd
import secrets
import signal
import subprocess
import sys
import tempfile

import grpc
import pytest

from conftest import FUSEBOXD, RPC_TIMEOUT, Client, dense_layout
from test_process_isolation import children, status
from test_tls_tenants import PATTERN, daemons, serving, session_with_pattern, sha, tenant_client  # noqa: F401
from test_worker_privileges import assert_runs_as, compute

ROOT_ONLY = pytest.mark.skipif(
    os.geteuid() != 0,
    reason="not run as root: fuseboxd cannot switch its workers to other users, so there "
    "are no per-tenant uids to check (CI runs this suite as root)")


def free_range(count):
    """A base whose count ids are no user's and no group's."""
    taken = {p.pw_uid for p in pwd.getpwall()} | {g.gr_gid for g in grp.getgrall()}
    for base in range(3_000_000_000, 4_000_000_000, 1_000_000):
        if not any(base <= t < base + count for t in taken):
            return base
    raise AssertionError("no free id range for the test")


def locked_workers(pid):
    """fuseboxd pid's workers that took a session (a spare waits, as root
    and without its filter, for its tenant's ids): {worker pid: uid}."""
    out = {}
    for k in children(pid):
        st = status(k)
        if st.get("Seccomp", "").strip() == "2":
            out[k] = int(st["Uid"].split()[0])
    return out


def new_worker(d, before):
    """The one worker that took a session since `before` ({pid: uid})."""
    now = locked_workers(d.proc.pid)
    new = {k: u for k, u in now.items() if k not in before}
    assert len(new) == 1, f"expected one new worker, found {new} (before {before})"
    return next(iter(new.items()))


def can_signal(uid, target):
    """Whether a process running as uid/gid `uid`, no groups, may send
    signal 0 to target (kill(2)'s permission check, nothing delivered)."""
    code = ("import os, sys\n"
            "try:\n"
            f"    os.kill({target}, 0)\n"
            "    print('sent')\n"
            "except PermissionError:\n"
            "    print('refused')\n")
    p = subprocess.run([sys.executable, "-c", code], user=uid, group=uid, extra_groups=[],
                       capture_output=True, text=True, timeout=RPC_TIMEOUT, cwd="/")
    assert p.returncode == 0 and p.stdout.strip() in ("sent", "refused"), p
    return p.stdout.strip() == "sent"


def tenants_spec(names, toks):
    return [{"name": n, "token_sha256": [sha(toks[n])]} for n in names]


def write_tenants(d, names, toks):
    with open(d.tenants_path, "w") as f:
        json.dump({"tenants": tenants_spec(names, toks)}, f)


@ROOT_ONLY
def test_tenants_run_as_their_own_uids(daemons):  # noqa: F811
    """alice's and bob's workers run as base+1 and base+2, not root, each
    still computes; alice's uid can signal alice's worker but not bob's,
    and bob's cannot signal alice's; alice's field stays whole. A reload
    keeps the numbers (a new tenant gets the next, a removed one's stays
    unused), and one that would need more uids than the range is refused."""
    base = free_range(4)
    toks = {n: secrets.token_urlsafe(24) for n in ("alice", "bob", "carol", "dave")}
    d = daemons("unix", ["--worker-uid-base", str(base), "--worker-uid-count", "4"],
                tenants=tenants_spec(["alice", "bob"], toks))
    assert f"session workers run as a uid and gid of their tenant's own: {base}..{base + 3}" \
        in d.logtext()
    c = {n: tenant_client(d.address, t) for n, t in toks.items()}
    streams = []
    try:
        seen = locked_workers(d.proc.pid)
        assert seen == {}, f"a spare ran as a tenant before any session: {seen}"
        sid_a = session_with_pattern(c["alice"])
        a_pid, a_uid = new_worker(d, seen)
        seen[a_pid] = a_uid
        streams.append(compute(c["bob"]))
        b_pid, b_uid = new_worker(d, seen)
        seen[b_pid] = b_uid
        assert (a_uid, b_uid) == (base + 1, base + 2)
        assert_runs_as(a_pid, base + 1, base + 1)  # every thread; setresuid(0) fails in it
        assert_runs_as(b_pid, base + 2, base + 2)
        # the attacker with alice's worker's ids: her own worker, yes; bob's, no
        assert can_signal(a_uid, a_pid), "the check itself is broken: same uid refused"
        assert not can_signal(a_uid, b_pid), "alice's uid may signal bob's worker"
        assert not can_signal(b_uid, a_pid), "bob's uid may signal alice's worker"
        # alice still computes in a second session (a worker of her uid again)
        streams.append(compute(c["alice"]))
        pid, uid = new_worker(d, seen)
        seen[pid] = uid
        assert uid == base + 1
        # reload: alice removed, carol added: carol is base+3, not alice's number
        write_tenants(d, ["bob", "carol"], toks)
        d.proc.send_signal(signal.SIGHUP)
        d.wait_log(r"SIGHUP: reloaded 2 tenants", "tenants reload")
        streams.append(compute(c["carol"]))
        pid, uid = new_worker(d, seen)
        seen[pid] = uid
        assert uid == base + 3, f"carol's worker runs as {uid}"
        # dave would be the fifth id of four: refused whole, bob and carol keep going
        write_tenants(d, ["bob", "carol", "dave"], toks)
        d.proc.send_signal(signal.SIGHUP)
        d.wait_log(r"tenants file not reloaded, keeping the running tenants: worker_uid_count 4 "
                   r"is too small: 4 tenants", "refused reload")
        with pytest.raises(grpc.RpcError):
            c["dave"].new_session(dense_layout(4))
        streams.append(compute(c["bob"]))
        assert new_worker(d, seen)[1] == base + 2
        assert serving(c["bob"])
    finally:
        for s in streams:
            s.close()
    # alice's session outlived her removal; its field is what she wrote
    write_tenants(d, ["alice", "bob", "carol"], toks)
    d.proc.send_signal(signal.SIGHUP)
    d.wait_log(r"SIGHUP: reloaded 3 tenants", "tenants reload")
    assert c["alice"].read_field(sid_a, 2) == PATTERN
    for x in c.values():
        x.close()


@ROOT_ONLY
def test_sessions_without_tenants_run_as_base(daemons):  # noqa: F811
    """No tenants file: every session is the anonymous tenant's, base+0."""
    base = free_range(1)
    d = daemons("unix", ["--worker-uid-base", str(base), "--worker-uid-count", "1"])
    c = Client(d.address)
    s = compute(c)
    try:
        (pid, uid), = locked_workers(d.proc.pid).items()
        assert uid == base
        assert_runs_as(pid, base, base)
    finally:
        s.close()
    assert serving(c)
    c.close()


def start_fails(*args, tenants=None):
    """fuseboxd with args must refuse to start: its log."""
    with tempfile.TemporaryDirectory(prefix="fbsec-") as tmp:
        if tenants is not None:
            path = os.path.join(tmp, "tenants.json")
            with open(path, "w") as f:
                json.dump({"tenants": tenants}, f)
            args += ("--tenants", path)
        p = subprocess.run([FUSEBOXD, "--listen", "unix:" + os.path.join(tmp, "s"), "--backend",
                            "cpu", *args], capture_output=True, text=True, timeout=RPC_TIMEOUT)
    assert p.returncode != 0, p.stderr
    return p.stderr


def test_uid_range_settings_are_checked():
    """Settings that cannot keep tenants apart stop the start, naming the
    option (as any user: these are refused before the root check)."""
    base = free_range(8)
    err = start_fails("--worker-uid-count", "3")
    assert "worker_uid_count 3 without worker_uid_base" in err, err
    err = start_fails("--worker-uid-base", str(base), "--worker-uid-count", "2",
                      "--isolation", "thread")
    assert f"worker_uid_base {base} needs isolation process" in err, err
    err = start_fails("--worker-uid-base", "4294967295")
    assert "--worker-uid-base: invalid value '4294967295'" in err, err
    toks = {n: secrets.token_urlsafe(24) for n in ("alice", "bob")}
    err = start_fails("--worker-uid-base", str(base), "--worker-uid-count", "2",
                      tenants=tenants_spec(["alice", "bob"], toks))
    assert "worker_uid_count 2 is too small: 2 tenants" in err and "need 3 uids" in err, err


@ROOT_ONLY
def test_uid_range_refused_as_root():
    """No count, a count past 2^32-2, a range holding a user's id, or
    --worker-user as well: refused, naming the option."""
    base = free_range(8)
    err = start_fails("--worker-uid-base", str(base))
    assert "worker_uid_count 0: give how many uids" in err, err
    err = start_fails("--worker-uid-base", "4294967290", "--worker-uid-count", "8")
    assert "worker_uid_count 8: give how many uids" in err and "at most 5" in err, err
    nobody = pwd.getpwnam("nobody")
    err = start_fails("--worker-uid-base", str(nobody.pw_uid - 1), "--worker-uid-count", "4")
    assert f"uid {nobody.pw_uid} ('nobody') is in the range" in err, err
    err = start_fails("--worker-uid-base", str(base), "--worker-uid-count", "4",
                      "--worker-user", "daemon")
    assert "worker_user 'daemon' and worker_uid_base" in err and "give one" in err, err


def test_uid_range_not_root():
    """Not root, fuseboxd cannot hand out uids: refused, not ignored."""
    if os.geteuid() == 0:
        pytest.skip("run as root: the switch itself is tested above")
    err = start_fails("--worker-uid-base", str(free_range(2)), "--worker-uid-count", "2")
    assert "cannot switch its workers to other users" in err, err
