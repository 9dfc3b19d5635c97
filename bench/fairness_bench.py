#!/usr/bin/python3
"""Flood fairness: does one tenant's flood of launches starve another's syncs?

Starts fuseboxd (CPU backend, a unix socket in a temporary folder) with a
tenants file of two tenants, "flood" and "light", each with its own token.
Tenant light times sync round trips on its Session stream (one tiny launch
and a sync, then wait for the SyncResult): first with the server idle, then
while tenant flood keeps its sessions busy with a heavy kernel (a loop of
--heavy-n iterations; several batches in flight per session, so its worker
never waits for the client). Both are run with the fair scheduler on and
off (--fair-share on|off), and the ratio of light's flooded latency to its
idle latency is printed (the target is within 2x of idle with it on).

A benchmark, not a test: the figures depend on the machine and its load.
Run from the repository root after a build:

  /usr/bin/python3 bench/fairness_bench.py --build build
  /usr/bin/python3 bench/fairness_bench.py --build build --isolation thread

Uses only grpcio and the protobuf stubs the build makes (build/pygen)."""
import argparse
import hashlib
import json
import os
import queue
import re
import secrets
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

import grpc


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--build", default="build", help="the CMake build folder (default build)")
    p.add_argument("--isolation", default="process", choices=["process", "thread"])
    p.add_argument("--rounds", type=int, default=300, help="light's round trips per phase")
    p.add_argument("--flood-sessions", type=int, default=2, help="tenant flood's sessions")
    p.add_argument("--inflight", type=int, default=4, help="batches in flight per flood session")
    p.add_argument("--heavy-n", type=int, default=1 << 20,
                   help="loop iterations of the flood kernel (one launch)")
    p.add_argument("--fair", default="on,off", help="the --fair-share settings to run")
    p.add_argument("--cpu-threads", type=int, default=0, help="fuseboxd --cpu-threads")
    p.add_argument("--verbose", action="store_true", help="print the scheduler's metrics")
    p.add_argument("--flood-child", nargs=2, metavar=("ADDRESS", "TOKEN"),
                   help=argparse.SUPPRESS)  # the flood, in a process of its own
    return p.parse_args()


ARGS = parse_args()
sys.path.insert(0, os.path.join(ARGS.build, "pygen"))
import fusebox_pb2 as pb  # noqa: E402
import health_pb2  # noqa: E402

TIMEOUT = 120.0


class Token(grpc.UnaryUnaryClientInterceptor, grpc.StreamStreamClientInterceptor):
    def __init__(self, tok):
        self.md = [("authorization", "Bearer " + tok)]

    def _d(self, d):
        return d._replace(metadata=list(d.metadata or []) + self.md)

    def intercept_unary_unary(self, cont, d, req):
        return cont(self._d(d), req)

    def intercept_stream_stream(self, cont, d, it):
        return cont(self._d(d), it)


def stmt(op, type=pb.T_VOID, args=(), imm=0, snode=-1, body=-1):
    return pb.Stmt(op=op, type=type, snode=snode, args=list(args), imm=imm, body=body, orelse=-1)


def layout():
    return pb.Layout(nodes=[
        pb.SNode(kind=pb.SN_ROOT, parent=-1, size=[1, 1, 1, 1]),
        pb.SNode(kind=pb.SN_DENSE, parent=0, axes=1, size=[256, 1, 1, 1]),
        pb.SNode(kind=pb.SN_PLACE, parent=1, name="v", type=pb.T_I32, size=[1, 1, 1, 1])])


def poke():
    """poke(i, x) { v[i] = x }"""
    return pb.Kernel(name="poke", params=[pb.T_I32, pb.T_I32], ret=pb.T_VOID,
                     stmts=[stmt("arg", pb.T_I32, imm=0), stmt("arg", pb.T_I32, imm=1),
                            stmt("store", args=[0, 1], snode=2)],
                     blocks=[pb.Block(ids=[0, 1, 2])])


def heavy(n):
    """heavy() { for i in 0..n: v[i & 255] = i } (a serial loop)"""
    return pb.Kernel(name="heavy", params=[], ret=pb.T_VOID,
                     stmts=[stmt("const", pb.T_I32, imm=0), stmt("const", pb.T_I32, imm=n),
                            stmt("range_for", args=[0, 1], body=1),
                            stmt("loop_index", pb.T_I32, args=[2], imm=0),
                            stmt("const", pb.T_I32, imm=255),
                            stmt("and", pb.T_I32, args=[3, 4]),
                            stmt("store", args=[5, 3], snode=2)],
                     blocks=[pb.Block(ids=[0, 1, 2]), pb.Block(ids=[3, 4, 5, 6])])


class Tenant:
    def __init__(self, address, token):
        self.ch = grpc.intercept_channel(grpc.insecure_channel(address), Token(token))
        self.create = self.ch.unary_unary("/fusebox.v1.Fusebox/CreateSession",
                                          request_serializer=pb.CreateSessionRequest.SerializeToString,
                                          response_deserializer=pb.CreateSessionResponse.FromString)
        self.register = self.ch.unary_unary(
            "/fusebox.v1.Fusebox/RegisterKernels",
            request_serializer=pb.RegisterKernelsRequest.SerializeToString,
            response_deserializer=pb.RegisterKernelsResponse.FromString)
        self.stream = self.ch.stream_stream("/fusebox.v1.Fusebox/Session",
                                            request_serializer=pb.SessionRequest.SerializeToString,
                                            response_deserializer=pb.SessionResponse.FromString)

    def session(self, kernel):
        sid = self.create(pb.CreateSessionRequest(options=pb.SessionOptions(mode="sync"),
                                                  layout=layout()), timeout=TIMEOUT).session_id
        kid = self.register(pb.RegisterKernelsRequest(session_id=sid, kernels=[kernel]),
                            timeout=TIMEOUT).kernel_ids[0]
        q = queue.Queue()
        q.put(pb.SessionRequest(session_id=sid))
        it = self.stream(iter(q.get, None), timeout=3600)
        return kid, q, it


def round_trips(q, it, kid, n, start):
    """n sync round trips of one poke launch; seconds each."""
    out = []
    for i in range(n):
        t0 = time.perf_counter()
        q.put(pb.SessionRequest(launches=[pb.Launch(kernel=kid, args=[
            pb.Value(type=pb.T_I32, i=i & 255), pb.Value(type=pb.T_I32, i=i)])], sync=start + i))
        r = next(it)
        out.append(time.perf_counter() - t0)
        assert r.sync.sync_id == start + i and not r.sync.errors, r
    return out


def summary(xs):
    xs = sorted(xs)
    return statistics.median(xs), xs[min(len(xs) - 1, int(len(xs) * 0.99))]


def flood(tenant, kid_q_it, stop, done_launches):
    kid, q, it = kid_q_it
    seq = 0
    inflight = 0
    while not stop.is_set():
        while inflight < ARGS.inflight:
            seq += 1
            q.put(pb.SessionRequest(launches=[pb.Launch(kernel=kid)], sync=seq))
            inflight += 1
        next(it)
        inflight -= 1
        done_launches[0] += 1
    for _ in range(inflight):
        next(it)
    q.put(None)


def flood_child(address, token):
    """The flood in a process of its own (no GIL shared with the light
    tenant's timing): runs until stdin closes, then prints its launches."""
    fl = Tenant(address, token)
    sessions = [fl.session(heavy(ARGS.heavy_n)) for _ in range(ARGS.flood_sessions)]
    stop = threading.Event()
    counts = [[0] for _ in sessions]
    threads = [threading.Thread(target=flood, args=(fl, s, stop, c))
               for s, c in zip(sessions, counts)]
    for t in threads:
        t.start()
    print("started", flush=True)
    sys.stdin.read()
    stop.set()
    for t in threads:
        t.join()
    print(sum(c[0] for c in counts), flush=True)


def run(fair):
    tmp = tempfile.TemporaryDirectory(prefix="fbfair-")
    toks = {"flood": secrets.token_urlsafe(16), "light": secrets.token_urlsafe(16)}
    tenants = {"tenants": [{"name": n, "token_sha256": [hashlib.sha256(t.encode()).hexdigest()],
                            "limits": {"max_sessions": 16}} for n, t in toks.items()]}
    path = os.path.join(tmp.name, "tenants.json")
    with open(path, "w") as f:
        json.dump(tenants, f)
    sock = "unix:" + os.path.join(tmp.name, "fuseboxd.sock")
    log = open(os.path.join(tmp.name, "log"), "w+")
    proc = subprocess.Popen([os.path.join(ARGS.build, "server", "fuseboxd"), "--listen", sock,
                             "--backend", "cpu", "--tenants", path, "--isolation", ARGS.isolation,
                             "--fair-share", fair, "--spare-workers",
                             str(ARGS.flood_sessions + 1), "--cpu-threads",
                             str(ARGS.cpu_threads), "--metrics-listen", "127.0.0.1:0"],
                            stdout=log, stderr=subprocess.STDOUT)
    try:
        health = grpc.insecure_channel(sock).unary_unary(
            "/grpc.health.v1.Health/Check",
            request_serializer=health_pb2.HealthCheckRequest.SerializeToString,
            response_deserializer=health_pb2.HealthCheckResponse.FromString)
        deadline = time.monotonic() + 60
        while True:
            try:
                health(health_pb2.HealthCheckRequest(), timeout=5)
                break
            except grpc.RpcError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    log.seek(0)
                    raise SystemExit("fuseboxd did not start:\n" + log.read())
                time.sleep(0.1)
        light = Tenant(sock, toks["light"])
        kid, q, it = light.session(poke())
        round_trips(q, it, kid, 50, 1)  # warm up
        idle = round_trips(q, it, kid, ARGS.rounds, 1000)
        child = subprocess.Popen([sys.executable, __file__, *sys.argv[1:], "--flood-child", sock,
                                  toks["flood"]], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 text=True)
        assert child.stdout.readline().strip() == "started"
        time.sleep(1.0)  # the flood is under way
        t0 = time.perf_counter()
        flooded = round_trips(q, it, kid, ARGS.rounds, 100000)
        secs = time.perf_counter() - t0
        child.stdin.close()
        flood_rate = int(child.stdout.readline()) / (secs + 1.0)
        child.wait(timeout=60)
        log.flush()
        log.seek(0)
        m = re.search(r"metrics on (http://[0-9.:]+)/metrics", log.read())
        sched = {}
        if m:
            with urllib.request.urlopen(m.group(1) + "/metrics", timeout=30) as r:
                for line in r.read().decode().splitlines():
                    x = re.match(r'fusebox_tenant_(sched_held_seconds_total|sched_held_jobs_total|'
                                 r'sched_paused_total|device_seconds_total|'
                                 r'sync_latency_seconds_sum|sync_latency_seconds_count)'
                                 r'\{tenant="(\w+)"\} (\S+)', line)
                    if x:
                        sched[f"{x.group(2)}.{x.group(1)}"] = float(x.group(3))
        if ARGS.verbose:
            print("   ", " ".join(f"{k}={v:.4g}" for k, v in sorted(sched.items())))
        q.put(None)
        for _ in it:
            pass
        return idle, flooded, flood_rate
    finally:
        proc.terminate()
        proc.wait(timeout=60)
        log.close()
        tmp.cleanup()


def main():
    if ARGS.flood_child:
        flood_child(*ARGS.flood_child)
        return
    print(f"isolation {ARGS.isolation}, {ARGS.flood_sessions} flood sessions x {ARGS.inflight} "
          f"in flight, heavy kernel {ARGS.heavy_n} iterations, {ARGS.rounds} round trips; "
          f"load average {os.getloadavg()[0]:.2f}")
    for fair in ARGS.fair.split(","):
        idle, flooded, rate = run(fair)
        im, ip = summary(idle)
        fm, fp = summary(flooded)
        print(f"fair-share {fair:3}: light idle median {im * 1e6:8.0f} us p99 {ip * 1e6:8.0f} us"
              f" | flooded median {fm * 1e6:8.0f} us p99 {fp * 1e6:8.0f} us"
              f" | ratio median {fm / im:6.2f} p99 {fp / ip:6.2f}"
              f" | flood {rate:7.1f} launches/s")
    print(f"load average after {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
