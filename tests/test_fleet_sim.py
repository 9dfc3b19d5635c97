"""The fleet simulator (bench/fleet/sim.py): invariants that a wrong model
would break. Pure Python, no server: the quick tier (ctest test_fleet_sim)."""
import contextlib
import io
import json
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench", "fleet"))

import sim  # noqa: E402

CAL = {"launch_rate_per_s": 1e6, "round_trip_s": 1e-4, "session_create_s": 0.05,
       "ckpt_write_Bps": 1e9, "ckpt_read_Bps": 2e9}
GiB = sim.GiB


def small(**kw):
    """A short, busy run: 4 replicas, 10 tenants, 20 simulated minutes,
    failures and drains, tight memory so that admission refuses some."""
    d = dict(replicas=4, tenants=10, hours=1 / 3, rate=0.6, replica_mem=24 * GiB,
             tenant_mem=8 * GiB, tenant_max_sessions=6, mtbf_h=0.3, repair_s=120,
             drain_every_s=300, patience_s=60, step_median_s=0.02, think_s=0.02, seed=3)
    d.update(kw)
    return sim.Config(**d)


class Checked(sim.Fleet):
    """A Fleet that checks the limits on every admission."""

    def admit(self, s, r, delay):
        assert self.fits(r, s) == "", f"admitted where it does not fit: {self.fits(r, s)}"
        super().admit(s, r, delay)
        R, c = self.R[r], self.cfg
        assert R.mem <= c.replica_mem
        assert len(R.sessions) <= c.max_sessions
        assert R.tenant_n[s.tenant] <= c.tenant_max_sessions
        assert R.tenant_mem[s.tenant] <= c.tenant_mem
        assert R.up and not R.draining


def run(cfg, policy, cls=Checked, weights=None, workload=None):
    import copy
    S, F, D = workload or sim.make_workload(cfg, CAL)
    return cls(cfg, CAL, policy, copy.deepcopy(S), F, D, weights).run()


@pytest.mark.parametrize("policy", sim.POLICIES)
@pytest.mark.parametrize("ckpt", [0.0, 30.0])
def test_conservation_and_capacity(policy, ckpt):
    cfg = small(ckpt_period_s=ckpt, arrivals="bursty")
    f = run(cfg, policy)
    states = {}
    for s in f.S:
        states[s.state] = states.get(s.state, 0) + 1
    # every session that arrived ended exactly one way, and each count agrees
    assert set(states) <= {"done", "rejected", "lost"}, states
    assert sum(states.values()) == len(f.S) > 100
    assert states.get("rejected", 0) == sum(f.rejected.values())
    assert states.get("lost", 0) == f.lost_fail + f.lost_drain
    assert states.get("done", 0) > 0 and states.get("rejected", 0) > 0   # the run is busy
    for s in f.S:
        if s.state == "done":
            assert s.done == pytest.approx(s.work) and s.finished >= s.started >= s.arrival
    for r in f.R:   # everything left the replicas
        assert not r.sessions and r.mem == pytest.approx(0.0, abs=1.0)
    assert max(f.peak_mem) <= cfg.replica_mem
    row = sim.summarize(f)
    assert 0 < row["mem_utilisation"] <= 1
    assert 0 < row["waited_share"] < 1      # busy: some waited for room, not all
    assert f.nfail > 0 and row["drains"] > 0
    if ckpt:
        assert f.ckpt_bytes > 0


def test_determinism_per_seed():
    a = [json.dumps(sim.summarize(run(small(), p)), sort_keys=True) for p in sim.POLICIES]
    b = [json.dumps(sim.summarize(run(small(), p)), sort_keys=True) for p in sim.POLICIES]
    c = [json.dumps(sim.summarize(run(small(seed=4), p)), sort_keys=True) for p in sim.POLICIES]
    assert a == b
    assert a != c


def test_same_workload_for_every_policy():
    cfg = small()
    w1, w2 = sim.make_workload(cfg, CAL), sim.make_workload(cfg, CAL)
    assert [(s.arrival, s.mem, s.work, s.tenant) for s in w1[0]] == \
        [(s.arrival, s.mem, s.work, s.tenant) for s in w2[0]]
    assert w1[1:] == w2[1:]


def identical_tenants(n_tenants, per_tenant):
    """Every tenant opens the same sessions at the same moments: one replica,
    device oversubscribed (caps add up past 1)."""
    S = []
    for k in range(per_tenant):
        for t in range(n_tenants):
            S.append(sim.Session(sid=len(S), key=f"k{len(S)}", tenant=t, arrival=1.0 + k,
                                 mem=GiB, work=20.0 + 5 * k, cap=0.6))
    return S


def test_jain_one_for_identical_tenants():
    cfg = sim.Config(replicas=1, tenants=4, mtbf_h=0, drain_every_s=0, replica_mem=64 * GiB)
    f = Checked(cfg, CAL, "least", identical_tenants(4, 3), [], []).run()
    assert all(s.state == "done" for s in f.S)
    row = sim.summarize(f)
    assert row["jain"] == pytest.approx(1.0, abs=1e-9)
    assert row["waited_share"] == 0 and row["wait_p99_s"] == pytest.approx(CAL["session_create_s"])
    fair = [f.recv[t] / f.want[t] for t in range(4)]
    assert max(fair) < 0.5          # contended: each got well under what it wanted
    # weights break the symmetry: the index must then fall below 1
    g = Checked(cfg, CAL, "least", identical_tenants(4, 3), [], [], [1, 1, 1, 4]).run()
    assert sim.summarize(g)["jain"] < 0.95


def test_jain_and_waterfill():
    assert sim.jain([2.0, 2.0, 2.0]) == pytest.approx(1.0)
    assert sim.jain([1.0, 0.0]) == pytest.approx(0.5)
    assert sim.waterfill([1, 1], [2, 1]) == pytest.approx([2 / 3, 1 / 3])
    assert sim.waterfill([0.1, 1, 1], [1, 1, 1]) == pytest.approx([0.1, 0.45, 0.45])
    assert sum(sim.waterfill([0.1, 0.2], [1, 1])) == pytest.approx(0.3)   # caps hold


class Watched(Checked):
    """Records which sessions a replica held when it failed."""

    def on_fail(self, r, b):
        if self.R[r].up:
            self.victims = getattr(self, "victims", {})
            self.victims.setdefault(r, set()).update(self.R[r].sessions)
        super().on_fail(r, b)


@pytest.mark.parametrize("policy", sim.POLICIES)
def test_failure_loses_only_that_replicas_sessions(policy):
    cfg = sim.Config(replicas=4, tenants=8, hours=0.25, rate=0.5, mtbf_h=0, drain_every_s=0,
                     seed=5, life_median_s=400)
    S, _, _ = sim.make_workload(cfg, CAL)
    t_fail = 600.0
    f = run(cfg, policy, Watched, workload=(S, [(t_fail, 2)], []))
    victims = f.victims[2]
    assert victims, "the failed replica held no session: the test shows nothing"
    lost = {s.sid for s in f.S if s.state == "lost"}
    assert lost == victims
    assert all(f.S[i].history[-1] == 2 for i in lost)
    assert f.lost_fail == len(victims) and f.nfail == 1
    # with checkpoints the same sessions resume elsewhere and finish
    cfg2 = sim.Config(**{**cfg.__dict__, "ckpt_period_s": 60.0})
    g = run(cfg2, policy, Watched, workload=(S, [(t_fail, 2)], []))
    v2 = g.victims[2]
    lost2 = {s.sid for s in g.S if s.state == "lost"}
    # lost: only sessions of that replica, with no checkpoint written yet or
    # no room elsewhere within the patience (never placed again)
    assert lost2 <= v2
    assert all(g.S[i].ckpt_done < 0 or g.S[i].history[-1] == 2 for i in lost2)
    resumed = v2 - lost2
    assert resumed, "no session had a checkpoint: the test shows nothing"
    for i in resumed:
        assert g.S[i].state == "done" and g.S[i].resumes == 1 and g.S[i].history[-1] != 2
    assert g.lost_fail == len(lost2) < len(victims)
    assert 0 < g.work_lost


def floor_moves(cfg, d):
    return cfg.grace_s + d["bytes"] / CAL["ckpt_write_Bps"]


def test_drain_moves_the_replicas_sessions():
    cfg = sim.Config(replicas=3, tenants=6, hours=0.2, rate=0.3, mtbf_h=0, drain_every_s=0,
                     seed=2, life_median_s=900, grace_s=10, tenant_max_sessions=64,
                     tenant_mem=1 << 40, patience_s=3600)
    S, _, _ = sim.make_workload(cfg, CAL)
    f = run(cfg, "least", workload=(S, [], [(300.0, 1)]))
    d = f.drain_log[0]
    moved = [s for s in f.S if s.resumes]
    assert d["sessions"] == len(moved) > 0
    assert d["bytes"] == pytest.approx(sum(s.mem for s in moved))
    back = d["start"] + floor_moves(cfg, d) + cfg.restart_s   # replica 1 serves again
    for s in moved:   # from replica 1 to another (or to 1 once it has restarted)
        assert s.history[-2] == 1 and (s.history[-1] != 1 or s.admitted >= back - 1e-6)
    assert any(s.history[-1] != 1 for s in moved)
    assert all(s.state == "done" for s in moved)
    # the drain takes the grace, the checkpoints at the write rate, a restore
    floor = cfg.grace_s + d["bytes"] / CAL["ckpt_write_Bps"]
    assert d["end"] - d["start"] >= floor
    assert f.lost_drain == 0


def test_consistent_hash_keeps_keys_when_a_replica_leaves():
    ring = sim.Ring(5, 64)
    keys = [f"s{i}" for i in range(500)]
    before = [ring.lookup(k, lambda r: True) for k in keys]
    after = [ring.lookup(k, lambda r: r != 3) for k in keys]
    assert len(set(before)) == 5
    for b, a in zip(before, after):
        assert a == b if b != 3 else a != 3      # only replica 3's keys move


def test_bad_calibration_is_named(tmp_path):
    p = tmp_path / "cal.json"
    p.write_text(json.dumps({**CAL, "ckpt_read_Bps": 0}))
    with pytest.raises(sim.SimError, match="'ckpt_read_Bps'.*positive"):
        sim.load_calibration(str(p))
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        assert sim.main(["--calibration", str(tmp_path / "none.json")]) == 2
    assert "does not exist" in err.getvalue() and "calibrate.py" in err.getvalue()


def test_cli_json_and_plots_skipped_without_matplotlib(tmp_path, monkeypatch):
    p = tmp_path / "cal.json"
    p.write_text(json.dumps(CAL))
    monkeypatch.setitem(sys.modules, "matplotlib", None)   # import matplotlib fails
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = sim.main(["--calibration", str(p), "--json", "--hours", "0.1", "--replicas", "3",
                       "--tenants", "5", "--plots", str(tmp_path / "png")])
    assert rc == 0
    d = json.loads(out.getvalue())
    assert [r["policy"] for r in d["policies"]] == list(sim.POLICIES)
    assert "plots skipped" in err.getvalue()
    assert not (tmp_path / "png").exists()


def test_memory_utilisation_is_over_the_simulated_span():
    cfg = sim.Config(replicas=3, tenants=5, hours=0.25, rate=0.2, mtbf_h=0, drain_every_s=0,
                     seed=8, life_median_s=600)
    f = run(cfg, "least")
    H = cfg.hours * 3600
    held = sum(s.mem * max(0.0, min(s.finished, H) - min(s.admitted, H))
               for s in f.S if s.state == "done")
    assert any(s.finished > H for s in f.S)          # some outlive the span
    assert sim.summarize(f)["mem_utilisation"] == pytest.approx(
        held / (cfg.replicas * cfg.replica_mem * H), rel=1e-9)
