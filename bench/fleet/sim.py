#!/usr/bin/env python3
"""A discrete-event simulator of a Fusebox fleet: N fuseboxd replicas and M
tenants, with session arrivals, sizes, lifetimes, replica failures, drains,
per-replica admission (memory budget, max_sessions, the tenants' quotas) and
fair sharing of device time between tenants on each replica. It compares
placement policies on the same seeded workload. The model and its
assumptions: bench/fleet/README.md.

Usage: sim.py [--replicas N] [--tenants M] [--hours H] [--seed S]
              [--policy all|hash|least|p2c|bestfit] [--calibration FILE]
              [--json] [--plots DIR] [...]   (sim.py --help lists all)

Standard library and numpy only; matplotlib (plots) is optional.
"""
import argparse
import bisect
import hashlib
import heapq
import json
import math
import os
import sys
from dataclasses import dataclass, field, asdict

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_CALIBRATION = os.path.join(HERE, "calibration.json")
GiB = 1 << 30
MiB = 1 << 20
POLICIES = ("hash", "least", "p2c", "bestfit")
POLICY_NAMES = {"hash": "consistent hash", "least": "least loaded",
                "p2c": "power of two choices", "bestfit": "best fit by memory"}


class SimError(Exception):
    """Bad input to the simulator, said in the user's terms."""


# ------------------------------------------------------------- calibration

CALIBRATION_KEYS = {
    "launch_rate_per_s": "launches per second through the pipelined stream (service_bench)",
    "round_trip_s": "median sync round trip in seconds (service_bench)",
    "session_create_s": "seconds to open a session and register its kernels",
    "ckpt_write_Bps": "checkpoint write throughput, bytes per second",
    "ckpt_read_Bps": "restore (checkpoint read) throughput, bytes per second",
}


def load_calibration(path):
    """The calibration file's figures (calibrate.py writes it); a missing
    file, bad JSON, or a missing or non-positive figure is a SimError."""
    try:
        with open(path) as f:
            cal = json.load(f)
    except FileNotFoundError:
        raise SimError(f"calibration file {path} does not exist "
                       "(bench/fleet/calibrate.py measures and writes one)") from None
    except (OSError, ValueError) as e:
        raise SimError(f"calibration file {path} cannot be read as JSON: {e}") from None
    if not isinstance(cal, dict):
        raise SimError(f"calibration file {path}: expected a JSON object")
    for k, what in CALIBRATION_KEYS.items():
        v = cal.get(k)
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not v > 0 \
                or not math.isfinite(v):
            raise SimError(f"calibration file {path}: '{k}' ({what}) must be a positive "
                           f"number, got {v!r}")
    return cal


# ------------------------------------------------------------- the workload

@dataclass
class Config:
    replicas: int = 8
    tenants: int = 40
    hours: float = 1.0
    seed: int = 1
    arrivals: str = "poisson"          # or "bursty"
    rate: float = 0.4                  # sessions per second, whole fleet (mean)
    burst_factor: float = 4.0          # bursty: rate multiplier inside a burst
    burst_share: float = 0.2           # bursty: share of time inside bursts
    burst_mean_s: float = 60.0         # bursty: mean length of a burst
    tenant_skew: float = 0.8           # Zipf exponent of tenant popularity (0: identical)
    mem_median: float = 1.0 * GiB      # session memory: lognormal
    mem_sigma: float = 1.0
    step_median_s: float = 0.005       # device time per step: lognormal
    step_sigma: float = 0.7
    launches_per_step: int = 4
    think_s: float = 0.2               # client time between steps (the round trip is added)
    life_median_s: float = 300.0       # unloaded lifetime: lognormal
    life_sigma: float = 1.0
    replica_mem: float = 64.0 * GiB    # memory_budget of each replica
    max_sessions: int = 64             # fuseboxd max_sessions
    session_limit: float = 4.0 * GiB   # session_memory_limit (sizes are truncated to it)
    tenant_max_sessions: int = 8       # tenants file: max_sessions (per replica)
    tenant_mem: float = 16.0 * GiB     # tenants file: memory_bytes (per replica)
    patience_s: float = 120.0          # a client retries this long, then gives up
    mtbf_h: float = 4.0                # per replica; 0: no failures
    repair_s: float = 300.0
    ckpt_period_s: float = 0.0         # 0: no checkpoints (a failure loses the session)
    drain_every_s: float = 1200.0      # a drain (rolling upgrade) of one replica this often; 0: none
    grace_s: float = 30.0
    restart_s: float = 30.0            # a drained replica's restart before it serves again
    vnodes: int = 128                  # consistent hashing: points per replica on the ring
    hash_key: str = "session"          # what the proxy hashes: the session's key, or its tenant


@dataclass
class Session:
    sid: int
    key: str
    tenant: int
    arrival: float
    mem: float
    work: float                        # device seconds it needs
    cap: float                         # largest share of a device it can use
    # state
    replica: int = -1
    state: str = "new"                 # waiting creating running stopped done rejected lost
    done: float = 0.0
    ckpt_done: float = -1.0            # progress at its last checkpoint (-1: none)
    rate: float = 0.0
    admitted: float = -1.0
    started: float = -1.0
    finished: float = -1.0
    epoch: int = 0                     # bumped on every move: stale events are ignored
    deadline: float = 0.0
    refused: str = ""
    resumes: int = 0
    drain: int = -1                    # the drain moving it, until it runs again
    history: list = field(default_factory=list)   # the replicas it was placed on


def _lognormal(rng, median, sigma, n):
    return median * np.exp(sigma * rng.standard_normal(n))


def make_workload(cfg, cal):
    """The sessions (arrival order), failures [(t, replica)] and drains
    [(t, replica)] of one seeded run; independent of the placement policy."""
    if cfg.replicas < 1 or cfg.tenants < 1:
        raise SimError("--replicas and --tenants must be at least 1")
    if cfg.rate <= 0 or cfg.hours <= 0:
        raise SimError("--rate and --hours must be positive")
    if cfg.arrivals not in ("poisson", "bursty"):
        raise SimError(f"--arrivals must be poisson or bursty, not {cfg.arrivals!r}")
    rng = np.random.default_rng(cfg.seed)
    horizon = cfg.hours * 3600.0
    times = []
    t = 0.0
    if cfg.arrivals == "poisson":
        while True:
            t += rng.exponential(1.0 / cfg.rate)
            if t >= horizon:
                break
            times.append(t)
    else:
        p, b = cfg.burst_share, cfg.burst_factor
        if not 0 < p < 1 or b * p >= 1:
            raise SimError("bursty arrivals need 0 < --burst-share < 1 and "
                           "--burst-factor x --burst-share < 1 (the mean rate is kept)")
        hi, lo = cfg.rate * b, cfg.rate * (1 - b * p) / (1 - p)
        on_mean, off_mean = cfg.burst_mean_s, cfg.burst_mean_s * (1 - p) / p
        burst = False
        while t < horizon:
            end = t + rng.exponential(on_mean if burst else off_mean)
            r = hi if burst else lo
            while True:
                t += rng.exponential(1.0 / r)
                if t >= min(end, horizon):
                    break
                times.append(t)
            t = end
            burst = not burst
    n = len(times)
    pop = 1.0 / np.arange(1, cfg.tenants + 1) ** cfg.tenant_skew
    tenants = rng.choice(cfg.tenants, size=n, p=pop / pop.sum())
    mem = np.minimum(_lognormal(rng, cfg.mem_median, cfg.mem_sigma, n), cfg.session_limit)
    mem = np.maximum(mem, 16 * MiB)
    step = _lognormal(rng, cfg.step_median_s, cfg.step_sigma, n)
    life = _lognormal(rng, cfg.life_median_s, cfg.life_sigma, n)
    # A step is its device time plus the launches' share of the stream's rate;
    # between steps the client thinks and waits one round trip.
    dstep = step + cfg.launches_per_step / cal["launch_rate_per_s"]
    cycle = dstep + cfg.think_s + cal["round_trip_s"]
    steps = np.maximum(1, np.round(life / cycle))
    sessions = [Session(sid=i, key=f"s{cfg.seed}-{i}", tenant=int(tenants[i]),
                        arrival=float(times[i]), mem=float(mem[i]),
                        work=float(steps[i] * dstep[i]), cap=float(dstep[i] / cycle[i]))
                for i in range(n)]
    failures = []
    if cfg.mtbf_h > 0:
        for r in range(cfg.replicas):
            t = 0.0
            while True:
                t += rng.exponential(cfg.mtbf_h * 3600.0)
                if t >= horizon:
                    break
                failures.append((t, r))
    drains = []
    if cfg.drain_every_s > 0:
        k = 1
        while k * cfg.drain_every_s < horizon:
            drains.append((k * cfg.drain_every_s, (k - 1) % cfg.replicas))
            k += 1
    return sessions, sorted(failures), drains


# ------------------------------------------------------------- placement

def _h64(s):
    return int.from_bytes(hashlib.sha256(s.encode()).digest()[:8], "big")


class Ring:
    """Consistent hashing as nginx's `hash ... consistent` (ketama) and
    HAProxy's `hash-type consistent` do it: each replica owns `vnodes`
    points of a 64-bit ring; a key goes to the first point at or after its
    hash that belongs to a replica in service (a replica that fails its
    health check is skipped, so only its keys move)."""

    def __init__(self, n, vnodes):
        pts = sorted((_h64(f"replica-{r}#{v}"), r) for r in range(n) for v in range(vnodes))
        self.keys = [p for p, _ in pts]
        self.owner = [r for _, r in pts]

    def lookup(self, key, usable):
        i = bisect.bisect_left(self.keys, _h64(key))
        for j in range(len(self.keys)):
            r = self.owner[(i + j) % len(self.keys)]
            if usable(r):
                return r
        return -1


# ------------------------------------------------------------- the fleet

@dataclass
class Replica:
    idx: int
    up: bool = True
    draining: bool = False
    mem: float = 0.0
    sessions: set = field(default_factory=set)
    tenant_n: dict = field(default_factory=dict)
    tenant_mem: dict = field(default_factory=dict)
    t: float = 0.0                      # progress accounted up to here
    version: int = 0                    # completion events of older versions are stale


def waterfill(caps, weights, capacity=1.0):
    """Weighted max-min fair shares: item i gets at most caps[i]; the rest
    of `capacity` is shared in proportion to weights. Returns the shares."""
    n = len(caps)
    share = [0.0] * n
    left = capacity
    pending = sorted(range(n), key=lambda i: caps[i] / weights[i])
    wsum = sum(weights)
    for k, i in enumerate(pending):
        fair = left * weights[i] / wsum
        share[i] = min(caps[i], fair)
        left -= share[i]
        wsum -= weights[i]
    return share


class Fleet:
    def __init__(self, cfg, cal, policy, sessions, failures, drains, weights=None):
        if policy not in POLICIES:
            raise SimError(f"unknown placement policy {policy!r} (one of {', '.join(POLICIES)})")
        self.cfg, self.cal, self.policy = cfg, cal, policy
        self.S = sessions
        self.R = [Replica(r) for r in range(cfg.replicas)]
        self.ring = Ring(cfg.replicas, cfg.vnodes)
        self.rng = np.random.default_rng(cfg.seed + 7919)   # p2c's samples
        self.weights = weights or [1.0] * cfg.tenants
        self.ev = []
        self.seq = 0
        self.queue = []                 # sids waiting for a place, in arrival order
        self.now = 0.0
        self.horizon = cfg.hours * 3600.0
        # results
        self.rejected = {"capacity": 0, "tenant quota": 0}
        self.lost_fail = 0
        self.lost_drain = 0
        self.work_lost = 0.0
        self.ckpt_bytes = 0.0
        self.nfail = 0
        self.drain_log = []             # dicts: replica, start, end, sessions, bytes
        self.recv = [0.0] * cfg.tenants
        self.want = [0.0] * cfg.tenants
        self.mem_int = 0.0              # integral of memory in use
        self.cap_int = 0.0              # integral of the capacity of replicas in service
        self.last_t = 0.0
        self.timeline = []              # (t, memory utilisation) samples
        self.peak_mem = [0.0] * cfg.replicas
        for s in sessions:
            self.push(s.arrival, "arrive", s.sid, 0)
        for t, r in failures:
            self.push(t, "fail", r, 0)
        for t, r in drains:
            self.push(t, "drain", r, 0)
        step = self.horizon / 200
        for k in range(1, 201):
            self.push(k * step, "sample", 0, 0)

    # events
    def push(self, t, kind, a, b):
        self.seq += 1
        heapq.heappush(self.ev, (t, self.seq, kind, a, b))

    def run(self):
        while self.ev:
            t, _, kind, a, b = heapq.heappop(self.ev)
            self._integrate(t)
            self.now = t
            getattr(self, "on_" + kind)(a, b)
        return self

    def _integrate(self, t):
        """Memory held and offered, over the simulated span only (the
        sessions still running at its end are followed to their end, but
        the fleet then only empties)."""
        t = min(t, self.horizon)
        dt = t - self.last_t
        if dt > 0:
            self.mem_int += dt * sum(r.mem for r in self.R if r.up)
            self.cap_int += dt * self.cfg.replica_mem * sum(1 for r in self.R if r.up)
            self.last_t = t

    # the fluid model of a replica's device
    def advance(self, r):
        dt = self.now - r.t
        if dt > 0:
            for sid in r.sessions:
                s = self.S[sid]
                if s.state == "running":
                    s.done += s.rate * dt
                    self.recv[s.tenant] += s.rate * dt
                    self.want[s.tenant] += self._cap(s) * dt
        r.t = self.now

    def _cap(self, s):
        P = self.cfg.ckpt_period_s
        if P > 0:   # the session stalls while its checkpoint is written
            return s.cap * P / (P + s.mem / self.cal["ckpt_write_Bps"])
        return s.cap

    def reshare(self, r):
        """Device time shared as server/sched.c does, in its fluid limit:
        weighted fair shares between the tenants with work, work-conserving;
        within a tenant its sessions share equally (each at most its cap)."""
        run = [self.S[sid] for sid in r.sessions if self.S[sid].state == "running"]
        by_t = {}
        for s in run:
            by_t.setdefault(s.tenant, []).append(s)
        ts = sorted(by_t)
        tshare = waterfill([sum(self._cap(s) for s in by_t[t]) for t in ts],
                           [self.weights[t] for t in ts])
        r.version += 1
        nxt = math.inf
        for t, ts_share in zip(ts, tshare):
            ss = by_t[t]
            shares = waterfill([self._cap(s) for s in ss], [1.0] * len(ss), ts_share)
            for s, sh in zip(ss, shares):
                s.rate = sh
                if sh > 0:
                    nxt = min(nxt, (s.work - s.done) / sh)
        if nxt < math.inf:
            self.push(self.now + max(nxt, 0.0), "complete", r.idx, r.version)

    # admission
    def fits(self, r, s):
        R, c = self.R[r], self.cfg
        if not R.up or R.draining:
            return "capacity"
        if R.mem + s.mem > c.replica_mem or len(R.sessions) >= c.max_sessions:
            return "capacity"
        if R.tenant_n.get(s.tenant, 0) >= c.tenant_max_sessions or \
                R.tenant_mem.get(s.tenant, 0.0) + s.mem > c.tenant_mem:
            return "tenant quota"
        return ""

    def place(self, s):
        """The replica the policy gives s, or -1 (s.refused says why)."""
        usable = [r.idx for r in self.R if r.up and not r.draining]
        if not usable:
            s.refused = "capacity"
            return -1
        if self.policy == "hash":
            key = s.key if self.cfg.hash_key == "session" else f"tenant-{s.tenant}"
            r = self.ring.lookup(key, lambda i: self.R[i].up and not self.R[i].draining)
            why = self.fits(r, s)
            s.refused = why
            return -1 if why else r
        if self.policy == "p2c":
            pick = self.rng.choice(usable, size=min(2, len(usable)), replace=False)
            cand = sorted(int(i) for i in pick)
        else:
            cand = usable
        ok = []
        for r in cand:
            why = self.fits(r, s)
            if why:
                s.refused = why
            else:
                ok.append(r)
        if not ok:
            return -1
        if self.policy in ("least", "p2c"):
            return min(ok, key=lambda i: (len(self.R[i].sessions), self.R[i].mem, i))
        return min(ok, key=lambda i: (self.cfg.replica_mem - self.R[i].mem - s.mem, i))

    def admit(self, s, r, delay):
        R = self.R[r]
        self.advance(R)
        s.replica, s.state, s.admitted = r, "creating", self.now
        s.history.append(r)
        s.epoch += 1
        R.sessions.add(s.sid)
        R.mem += s.mem
        R.tenant_n[s.tenant] = R.tenant_n.get(s.tenant, 0) + 1
        R.tenant_mem[s.tenant] = R.tenant_mem.get(s.tenant, 0.0) + s.mem
        self.peak_mem[r] = max(self.peak_mem[r], R.mem)
        assert R.mem <= self.cfg.replica_mem * (1 + 1e-12)
        if s.drain >= 0:    # a drained session is placed: the drain is done for it then
            d = self.drain_log[s.drain]
            d["end"] = max(d["end"] or 0.0, self.now + delay)
            s.drain = -1
        self.push(self.now + delay, "ready", s.sid, s.epoch)

    def remove(self, s):
        R = self.R[s.replica]
        R.sessions.discard(s.sid)
        R.mem -= s.mem
        R.tenant_n[s.tenant] -= 1
        R.tenant_mem[s.tenant] -= s.mem
        if not R.sessions:
            R.mem = 0.0
        s.replica = -1
        s.rate = 0.0

    def try_place(self, s):
        r = self.place(s)
        if r < 0:
            return False
        delay = self.cal["session_create_s"]
        if s.resumes and s.ckpt_done >= 0:
            delay += s.mem / self.cal["ckpt_read_Bps"]
        self.admit(s, r, delay)
        self.reshare(self.R[r])
        return True

    def wait(self, s):
        s.state = "waiting"
        s.deadline = self.now + self.cfg.patience_s
        self.queue.append(s.sid)
        self.push(s.deadline, "patience", s.sid, s.epoch)

    def retry_queue(self):
        keep = []
        for sid in self.queue:
            s = self.S[sid]
            if s.state != "waiting":
                continue
            if not self.try_place(s):
                keep.append(sid)
        self.queue = keep

    # handlers
    def on_arrive(self, sid, _):
        s = self.S[sid]
        if not self.try_place(s):
            self.wait(s)

    def on_patience(self, sid, epoch):
        s = self.S[sid]
        if s.state != "waiting" or s.epoch != epoch:
            return
        if s.resumes:
            s.state = "lost"
            if s.drain >= 0:
                d = self.drain_log[s.drain]
                d["end"] = max(d["end"] or 0.0, self.now)
                s.drain = -1
                self.lost_drain += 1
            else:
                self.lost_fail += 1
        else:
            s.state = "rejected"
            self.rejected[s.refused or "capacity"] += 1

    def on_ready(self, sid, epoch):
        s = self.S[sid]
        if s.epoch != epoch or s.state != "creating":
            return
        R = self.R[s.replica]
        self.advance(R)
        s.state = "running"
        if s.started < 0:
            s.started = self.now
        if self.cfg.ckpt_period_s > 0:
            self.push(self.now + self.cfg.ckpt_period_s, "ckpt", sid, epoch)
        self.reshare(R)

    def on_ckpt(self, sid, epoch):
        s = self.S[sid]
        if s.epoch != epoch or s.state != "running":
            return
        self.advance(self.R[s.replica])
        s.ckpt_done = s.done
        self.ckpt_bytes += s.mem
        self.push(self.now + self.cfg.ckpt_period_s, "ckpt", sid, epoch)

    def on_complete(self, r, version):
        R = self.R[r]
        if version != R.version or not R.up:
            return
        self.advance(R)
        fin = [sid for sid in R.sessions if self.S[sid].state == "running"
               and self.S[sid].done >= self.S[sid].work * (1 - 1e-9) - 1e-12]
        for sid in fin:
            s = self.S[sid]
            s.state, s.finished, s.done = "done", self.now, s.work
            self.remove(s)
        self.reshare(R)
        if fin:
            self.retry_queue()

    def on_fail(self, r, _):
        R = self.R[r]
        if not R.up:
            return
        self.advance(R)
        self.nfail += 1
        R.up = False    # first: its sessions must not be placed on it again
        R.draining = False
        R.version += 1
        victims = sorted(R.sessions)
        for sid in victims:
            s = self.S[sid]
            self.remove(s)
            s.epoch += 1
            if self.cfg.ckpt_period_s > 0 and s.ckpt_done >= 0:
                self.work_lost += s.done - s.ckpt_done
                s.done = s.ckpt_done
                s.resumes += 1
                s.refused = "fail"
                if not self.try_place(s):
                    self.wait(s)
            else:
                self.work_lost += s.done
                s.state = "lost"
                self.lost_fail += 1
        self.push(self.now + self.cfg.repair_s, "repair", r, 0)

    def on_repair(self, r, _):
        R = self.R[r]
        R.up, R.draining, R.t = True, False, self.now
        R.sessions, R.tenant_n, R.tenant_mem, R.mem = set(), {}, {}, 0.0
        self.retry_queue()

    def on_drain(self, r, _):
        R = self.R[r]
        if not R.up or R.draining:
            return
        R.draining = True
        d = {"replica": r, "start": self.now, "end": None, "sessions": 0, "bytes": 0.0,
             "pending": 0}
        self.drain_log.append(d)
        self.push(self.now + self.cfg.grace_s, "drain_move", r, len(self.drain_log) - 1)

    def on_drain_move(self, r, k):
        """After the grace period: the sessions still there stop and are
        checkpointed one after the other at the write throughput; each
        leaves when its checkpoint is written and resumes elsewhere."""
        R = self.R[r]
        d = self.drain_log[k]
        if not R.up or not R.draining:
            d["end"] = self.now
            return
        self.advance(R)
        t = self.now
        for sid in sorted(R.sessions):
            s = self.S[sid]
            s.state = "stopped"
            s.epoch += 1
            t += s.mem / self.cal["ckpt_write_Bps"]
            d["sessions"] += 1
            d["bytes"] += s.mem
            d["pending"] += 1
            self.push(t, "moved", sid, k)
        self.reshare(R)
        self.push(t + self.cfg.restart_s, "restarted", r, k)
        d["end"] = self.now

    def on_moved(self, sid, k):
        s = self.S[sid]
        if s.state != "stopped":
            return
        self.remove(s)
        s.ckpt_done = s.done
        s.resumes += 1
        s.drain = k
        if not self.try_place(s):
            self.wait(s)
        self.retry_queue()

    def on_restarted(self, r, k):
        R = self.R[r]
        if R.up and R.draining:
            R.draining = False
            R.t = self.now
            self.retry_queue()

    def on_sample(self, _a, _b):
        cap = self.cfg.replica_mem * sum(1 for r in self.R if r.up)
        used = sum(r.mem for r in self.R if r.up)
        self.timeline.append((self.now, used / cap if cap else 0.0))


def jain(xs):
    xs = [x for x in xs]
    if not xs:
        return 1.0
    s, q = sum(xs), sum(x * x for x in xs)
    return s * s / (len(xs) * q) if q > 0 else 1.0


def pct(xs, p):
    return float(np.percentile(xs, p)) if len(xs) else float("nan")


def summarize(f):
    cfg = f.cfg
    S = f.S
    arrived = len(S)
    waits = [s.started - s.arrival for s in S if s.started >= 0]
    counts = {}
    for s in S:
        counts[s.state] = counts.get(s.state, 0) + 1
    fair = [f.recv[t] / f.want[t] for t in range(cfg.tenants) if f.want[t] > 0]
    drains = [d for d in f.drain_log if d["end"] is not None]
    moved = sum(d["bytes"] for d in f.drain_log)
    return {
        "policy": f.policy,
        "name": POLICY_NAMES[f.policy],
        "sessions": arrived,
        "states": counts,
        "rejected": sum(f.rejected.values()),
        "rejected_by": dict(f.rejected),
        "rejection_rate": sum(f.rejected.values()) / arrived if arrived else 0.0,
        "wait_p50_s": pct(waits, 50),
        "wait_p99_s": pct(waits, 99),
        "waited_share": (sum(1 for w in waits if w > f.cal["session_create_s"] + 1e-3)
                         / len(waits)) if waits else 0.0,
        "mem_utilisation": f.mem_int / f.cap_int if f.cap_int else 0.0,
        "jain": jain(fair),
        "failures": f.nfail,
        "lost_on_failures": f.lost_fail,
        "lost_per_failure": f.lost_fail / f.nfail if f.nfail else 0.0,
        "work_lost_device_s": f.work_lost,
        "checkpoint_bytes": f.ckpt_bytes,
        "drains": len(drains),
        "drain_time_mean_s": float(np.mean([d["end"] - d["start"] for d in drains]))
        if drains else 0.0,
        "drain_bytes_moved": moved,
        "lost_on_drains": f.lost_drain,
        "peak_replica_mem": max(f.peak_mem),
    }


def simulate(cfg, cal, policy, workload=None, weights=None):
    """One policy on the workload of cfg.seed: the Fleet after the run."""
    import copy
    sessions, failures, drains = workload or make_workload(cfg, cal)
    return Fleet(cfg, cal, policy, copy.deepcopy(sessions), failures, drains, weights).run()


# ------------------------------------------------------------- output

def table(rows, cfg):
    hdr = ("policy", "reject", "wait p50", "wait p99", "mem util", "Jain",
           "lost/fail", "drain time", "moved")
    out = [f"{cfg.replicas} replicas x {cfg.tenants} tenants, {cfg.hours:g} h simulated, "
           f"{cfg.arrivals} arrivals at {cfg.rate:g}/s, seed {cfg.seed}, "
           f"checkpoint period {cfg.ckpt_period_s:g} s; {rows[0]['sessions']} sessions, "
           f"{rows[0]['failures']} failures, {rows[0]['drains']} drains",
           "| " + " | ".join(hdr) + " |", "|" + "---|" * len(hdr)]
    for r in rows:
        out.append("| " + " | ".join([
            r["name"], f"{100 * r['rejection_rate']:.1f}%", f"{r['wait_p50_s']:.2f} s",
            f"{r['wait_p99_s']:.2f} s", f"{100 * r['mem_utilisation']:.1f}%",
            f"{r['jain']:.3f}", f"{r['lost_per_failure']:.1f}",
            f"{r['drain_time_mean_s']:.1f} s",
            f"{r['drain_bytes_moved'] / GiB:.1f} GiB"]) + " |")
    return "\n".join(out)


def plots(fleets, rows, outdir):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("sim.py: matplotlib is not installed: plots skipped "
              "(Debian: apt-get install python3-matplotlib)", file=sys.stderr)
        return []
    os.makedirs(outdir, exist_ok=True)
    made = []
    names = [r["name"] for r in rows]
    fig, ax = plt.subplots(2, 3, figsize=(11, 6))
    for a, (k, title, scale) in zip(ax.flat, [
            ("rejection_rate", "rejection rate (%)", 100), ("wait_p99_s", "wait p99 (s)", 1),
            ("mem_utilisation", "memory utilisation (%)", 100), ("jain", "Jain's index", 1),
            ("lost_per_failure", "sessions lost per failure", 1),
            ("drain_time_mean_s", "drain time (s)", 1)]):
        a.bar(range(len(rows)), [r[k] * scale for r in rows], color="C0")
        a.set_xticks(range(len(rows)))
        a.set_xticklabels([n.replace(" ", "\n", 1) for n in names], fontsize=7)
        a.set_title(title, fontsize=9)
    fig.tight_layout()
    p = os.path.join(outdir, "policies.png")
    fig.savefig(p, dpi=80)
    plt.close(fig)
    made.append(p)
    fig, ax = plt.subplots(figsize=(6, 4))
    for f, r in zip(fleets, rows):
        w = np.sort([s.started - s.arrival for s in f.S if s.started >= 0])
        ax.plot(w, np.arange(1, len(w) + 1) / max(len(w), 1), label=r["name"])
    ax.set_xscale("symlog", linthresh=0.1)
    ax.set_xlabel("wait from arrival to first step (s)")
    ax.set_ylabel("share of sessions")
    ax.legend(fontsize=8)
    fig.tight_layout()
    p = os.path.join(outdir, "wait_cdf.png")
    fig.savefig(p, dpi=80)
    plt.close(fig)
    made.append(p)
    fig, ax = plt.subplots(figsize=(7, 3.5))
    for f, r in zip(fleets, rows):
        t, u = zip(*f.timeline) if f.timeline else ((), ())
        ax.plot(np.array(t) / 60, np.array(u) * 100, label=r["name"], lw=1)
    ax.set_xlabel("simulated minutes")
    ax.set_ylabel("memory in use (%)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    p = os.path.join(outdir, "memory.png")
    fig.savefig(p, dpi=80)
    plt.close(fig)
    made.append(p)
    return made


def parse_size(v):
    v = v.strip()
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    try:
        if v[-1:].upper() in mult:
            return float(v[:-1]) * mult[v[-1].upper()]
        return float(v)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a size: {v!r} (a number of bytes, or 512M, 4G)")


def build_parser():
    p = argparse.ArgumentParser(
        prog="sim.py", description="Simulate a Fusebox fleet and compare placement policies "
        "(bench/fleet/README.md).")
    d = Config()
    p.add_argument("--policy", default="all", choices=("all",) + POLICIES)
    p.add_argument("--calibration", default=DEFAULT_CALIBRATION,
                   help="JSON figures measured by calibrate.py (default: %(default)s)")
    p.add_argument("--json", action="store_true", help="print JSON instead of the table")
    p.add_argument("--plots", metavar="DIR", help="write PNG plots into DIR (needs matplotlib)")
    for name, typ, hlp in [
            ("replicas", int, "fuseboxd replicas"), ("tenants", int, "tenants"),
            ("hours", float, "simulated hours"), ("seed", int, "workload seed"),
            ("arrivals", str, "poisson or bursty"), ("rate", float, "sessions/s, whole fleet"),
            ("burst-factor", float, "bursty: rate multiplier in a burst"),
            ("burst-share", float, "bursty: share of time in bursts"),
            ("tenant-skew", float, "Zipf exponent of tenants' popularity (0: identical)"),
            ("mem-median", parse_size, "median session memory (lognormal)"),
            ("mem-sigma", float, "sigma of log session memory"),
            ("step-median-s", float, "median device seconds per step (lognormal)"),
            ("life-median-s", float, "median unloaded lifetime in s (lognormal)"),
            ("life-sigma", float, "sigma of log lifetime"),
            ("replica-mem", parse_size, "memory_budget of a replica"),
            ("max-sessions", int, "fuseboxd max_sessions"),
            ("tenant-max-sessions", int, "tenants file max_sessions (per replica)"),
            ("tenant-mem", parse_size, "tenants file memory_bytes (per replica)"),
            ("patience-s", float, "how long a client retries before giving up"),
            ("mtbf-h", float, "mean hours between failures of a replica (0: none)"),
            ("repair-s", float, "seconds a failed replica stays down"),
            ("ckpt-period-s", float, "checkpoint period (0: off: failures lose sessions)"),
            ("drain-every-s", float, "drain one replica (round robin) this often (0: never)"),
            ("grace-s", float, "drain grace period"),
            ("hash-key", str, "consistent hash on 'session' (the routing key) or 'tenant'")]:
        attr = name.replace("-", "_")
        p.add_argument("--" + name, type=typ, default=getattr(d, attr),
                       help=f"{hlp} (default: {getattr(d, attr)})")
    return p


def main(argv=None):
    args = build_parser().parse_args(argv)
    try:
        cal = load_calibration(args.calibration)
        kw = {k: v for k, v in vars(args).items() if k in Config.__dataclass_fields__}
        cfg = Config(**kw)
        if cfg.hash_key not in ("session", "tenant"):
            raise SimError(f"--hash-key must be session or tenant, not {cfg.hash_key!r}")
        workload = make_workload(cfg, cal)
        pols = POLICIES if args.policy == "all" else (args.policy,)
        fleets = [simulate(cfg, cal, p, workload) for p in pols]
    except SimError as e:
        print(f"sim.py: {e}", file=sys.stderr)
        return 2
    rows = [summarize(f) for f in fleets]
    if args.json:
        print(json.dumps({"config": asdict(cfg), "calibration": cal, "policies": rows},
                         indent=1))
    else:
        print(table(rows, cfg))
    if args.plots:
        made = plots(fleets, rows, args.plots)
        for m in made:
            print(f"sim.py: wrote {m}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
