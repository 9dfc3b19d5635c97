#!/usr/bin/env python3
"""Check the fleet simulator against reality: three real fuseboxd on
loopback, a small seeded workload placed client-side by the simulator's own
consistent hash (sim.Ring on each session's routing key), then the
simulator on the same workload, and the differences.

Each replica runs with tenants (--tenants, fair sharing on), --max-sessions
(default 4) and one CPU device thread, so that admission and device sharing
both matter. A session: open (retried every 20 ms while the replica refuses
it, RESOURCE_EXHAUSTED, as a client of a full replica would), then STEPS x
(launch of work(n) + sync), then close. Measured per session: the wait
(arrival to the session open and its kernel registered: open, a launch of
work(1) and a sync) and the completion time (arrival to its last sync); per replica: its
sessions and their session-seconds.

The simulator gets the same arrivals, tenants, keys and steps; its device
time per step is the step time measured on one idle replica (the probe)
less the calibration's round trip, its session create time the probe's.

Usage: validate.py [--fuseboxd PATH] [--sessions 30] [--tenants 3]
                   [--rate 3] [--seed 1] [--max-sessions 4] [--work N]
                   [--calibration FILE] [--json]
"""
import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time

import numpy as np

import sim
from _fb import find, import_fusebox

PROGRAM = """
layout { field A: f32 (i: 4096) }
kernel work(n: i32) {
  for i in A {
    var x = A[i]
    var k = 0
    while k < n {
      x = x * 0.999 + 0.001
      k += 1
    }
    A[i] = x
  }
}
"""
MEM = 4096 * 4


def percentiles(xs):
    return {"mean": float(np.mean(xs)), "p50": float(np.percentile(xs, 50)),
            "p90": float(np.percentile(xs, 90)), "max": float(np.max(xs))}


def probe(fusebox, addr, token, work, n=30):
    """Open + first step, and the median step (launch + sync) on an idle replica."""
    with fusebox.connect(addr, token=token) as fb:
        creates, steps = [], []
        for _ in range(3):
            t0 = time.perf_counter()
            with fb.session(source=PROGRAM) as s:
                s.kernels.work(1)
                s.sync()
                creates.append(time.perf_counter() - t0)
                for _ in range(n):
                    t1 = time.perf_counter()
                    s.kernels.work(work)
                    s.sync()
                    steps.append(time.perf_counter() - t1)
    return statistics.median(creates), statistics.median(steps)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--fuseboxd")
    p.add_argument("--sessions", type=int, default=30)
    p.add_argument("--tenants", type=int, default=3)
    p.add_argument("--rate", type=float, default=3.0, help="arrivals per second")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--max-sessions", type=int, default=4)
    p.add_argument("--steps-median", type=float, default=20.0)
    p.add_argument("--work", type=int, default=2000, help="inner iterations per element per step")
    p.add_argument("--calibration", default=sim.DEFAULT_CALIBRATION)
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    try:
        cal = sim.load_calibration(a.calibration)
    except sim.SimError as e:
        raise SystemExit(f"validate.py: {e}")
    fuseboxd = find(a.fuseboxd, "FUSEBOXD", "server/fuseboxd")
    fusebox = import_fusebox()
    from fusebox.client import _Daemon
    from fusebox.errors import ServerError
    import grpc

    tmp = tempfile.mkdtemp(prefix="fusebox-fleet-validate-")
    import hashlib
    tokens = [f"fleet-token-{t}" for t in range(a.tenants)]
    tf = os.path.join(tmp, "tenants.json")
    with open(tf, "w") as f:
        json.dump({"tenants": [
            {"name": f"tenant-{t}", "role": "user",
             "token_sha256": [hashlib.sha256(tokens[t].encode()).hexdigest()],
             "limits": {"max_sessions": a.max_sessions}} for t in range(a.tenants)]}, f)
    args = ["--tenants", tf, "--max-sessions", str(a.max_sessions), "--cpu-threads", "1",
            "--log-level", "warn"]
    daemons = []
    try:
        for _ in range(3):
            daemons.append(_Daemon(fuseboxd, args, listen="127.0.0.1:0"))
        addrs = [d.address for d in daemons]
        create_s, step_s = probe(fusebox, addrs[0], tokens[0], a.work)
        dev_step = max(step_s - cal["round_trip_s"], 1e-6)
        # the workload
        rng = np.random.default_rng(a.seed)
        arr = np.cumsum(rng.exponential(1.0 / a.rate, a.sessions))
        ten = rng.integers(0, a.tenants, a.sessions)
        steps = np.maximum(1, np.round(a.steps_median * np.exp(0.5 * rng.standard_normal(
            a.sessions)))).astype(int)
        keys = [f"v{a.seed}-{i}" for i in range(a.sessions)]
        ring = sim.Ring(3, sim.Config().vnodes)
        place = [ring.lookup(k, lambda r: True) for k in keys]
        clients = {}
        for t in range(a.tenants):
            for r in range(3):
                clients[t, r] = fusebox.connect(addrs[r], token=tokens[t])
        res = [None] * a.sessions
        errors = []
        t0 = time.perf_counter() + 0.5

        def one(i):
            try:
                time.sleep(max(0.0, t0 + arr[i] - time.perf_counter()))
                fb = clients[int(ten[i]), place[i]]
                refused = 0
                while True:
                    try:
                        s = fb.session(source=PROGRAM)
                        break
                    except ServerError as e:
                        if e.status != grpc.StatusCode.RESOURCE_EXHAUSTED:
                            raise
                        refused += 1
                        time.sleep(0.02)
                with s:
                    s.kernels.work(1)       # registers the kernel, as the probe's open did
                    s.sync()
                    opened = time.perf_counter()
                    for _ in range(steps[i]):
                        s.kernels.work(a.work)
                        s.sync()
                    end = time.perf_counter()
                res[i] = {"arrival": float(arr[i]), "opened": opened - t0, "end": end - t0,
                          "refused": refused}
            except Exception as e:   # reported below: the run then fails
                errors.append(f"session {i}: {e}")

        th = [threading.Thread(target=one, args=(i,)) for i in range(a.sessions)]
        for x in th:
            x.start()
        for x in th:
            x.join()
        for c in clients.values():
            c.close()
    finally:
        for d in daemons:
            d.stop()
    if errors:
        raise SystemExit("validate.py: the real run failed:\n" + "\n".join(errors))

    # the simulator on the same workload
    cfg = sim.Config(replicas=3, tenants=a.tenants, max_sessions=a.max_sessions,
                     tenant_max_sessions=a.max_sessions, replica_mem=1 << 40,
                     tenant_mem=1 << 40, session_limit=1 << 40, patience_s=1e9, mtbf_h=0,
                     drain_every_s=0, seed=a.seed)
    scal = dict(cal, session_create_s=create_s)
    cap = dev_step / (dev_step + cal["round_trip_s"])
    S = [sim.Session(sid=i, key=keys[i], tenant=int(ten[i]), arrival=float(arr[i]), mem=MEM,
                     work=float(steps[i] * dev_step), cap=cap) for i in range(a.sessions)]
    f = sim.Fleet(cfg, scal, "hash", S, [], []).run()
    sim_place = [s.history[0] for s in S]
    real_wait = [r["opened"] - r["arrival"] for r in res]
    real_done = [r["end"] - r["arrival"] for r in res]
    sim_wait = [s.started - s.arrival for s in f.S]
    sim_done = [s.finished - s.arrival for s in f.S]
    per_rep = []
    for r in range(3):
        mine = [i for i in range(a.sessions) if place[i] == r]
        per_rep.append({
            "replica": r, "sessions_real": len(mine),
            "sessions_sim": sum(1 for i in range(a.sessions) if sim_place[i] == r),
            "session_s_real": sum(res[i]["end"] - res[i]["opened"] for i in mine),
            "session_s_sim": sum(f.S[i].finished - f.S[i].started for i in mine)})
    rel = [abs(x - y) / x for x, y in zip(real_done, sim_done)]
    out = {
        "sessions": a.sessions, "tenants": a.tenants, "seed": a.seed, "rate": a.rate,
        "max_sessions": a.max_sessions, "work": a.work,
        "probe": {"create_s": create_s, "step_s": step_s, "device_step_s": dev_step},
        "refusals_real": sum(r["refused"] for r in res),
        "wait_real": percentiles(real_wait), "wait_sim": percentiles(sim_wait),
        "completion_real": percentiles(real_done), "completion_sim": percentiles(sim_done),
        "completion_rel_error": percentiles(rel),
        "replicas": per_rep,
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }
    if a.json:
        print(json.dumps(out, indent=1))
        return 0
    print(f"{a.sessions} sessions, {a.tenants} tenants, 3 fuseboxd on 127.0.0.1 "
          f"(--max-sessions {a.max_sessions}, --cpu-threads 1), arrivals {a.rate:g}/s, "
          f"seed {a.seed}, load average {out['load_average'][0]}")
    print(f"probe on an idle replica: open + first step {create_s * 1e3:.1f} ms, "
          f"step (launch + sync) {step_s * 1e3:.2f} ms; refusals while full: "
          f"{out['refusals_real']}")
    print("| figure | real | simulated |")
    print("|---|---|---|")
    for name, k in (("wait", "wait"), ("completion", "completion")):
        for q in ("mean", "p50", "p90", "max"):
            print(f"| {name} {q} | {out[k + '_real'][q]:.3f} s | {out[k + '_sim'][q]:.3f} s |")
    for r in per_rep:
        print(f"| replica {r['replica']}: sessions, session-seconds | {r['sessions_real']}, "
              f"{r['session_s_real']:.1f} s | {r['sessions_sim']}, {r['session_s_sim']:.1f} s |")
    e = out["completion_rel_error"]
    print(f"per-session completion time, |sim - real| / real: mean {100 * e['mean']:.0f}%, "
          f"p50 {100 * e['p50']:.0f}%, max {100 * e['max']:.0f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
