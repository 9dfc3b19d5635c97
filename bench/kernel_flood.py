#!/usr/bin/python3
"""Kernel flood: how much memory does registering kernels make fuseboxd hold?

Starts fuseboxd (CPU backend, a unix socket in a temporary folder, the
tests' victim session beside it) with --memory-budget BUDGET, opens one
session and sends RegisterKernels after RegisterKernels until four are
refused or --requests have gone:

  big    --per kernels of --stmts statements each (a chain of adds), each a
         new name;
  small  200 three-statement kernels, each a new name;
  same   200 three-statement kernels, all named 'poke'.

Prints fuseboxd's and its workers' VmRSS and VmHWM (MiB) before and after,
how many requests were registered and refused (with the last refusal),
and the budget's parts from GetStats (docs/security.md "The memory budget",
"kernels"). A measurement, not a test. Run from the repository root after
a build:

  /usr/bin/python3 bench/kernel_flood.py --build build-rel --case big --requests 10
  /usr/bin/python3 bench/kernel_flood.py --build build-rel --case small --requests 100

Uses only grpcio and the protobuf stubs the build makes (BUILD/pygen), and
the fixtures of tests/security/conftest.py."""
import argparse
import os
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--build", default="build", help="the build folder (default build)")
    p.add_argument("--isolation", default="thread", choices=["thread", "process"])
    p.add_argument("--mode", default="async", choices=["sync", "async"])
    p.add_argument("--case", default="big", choices=["big", "small", "same"])
    p.add_argument("--requests", type=int, default=10)
    p.add_argument("--per", type=int, default=20, help="big: kernels a request")
    p.add_argument("--stmts", type=int, default=19000, help="big: statements a kernel")
    p.add_argument("--budget", default="256M", help="--memory-budget (default 256M)")
    return p.parse_args()


def main():
    a = parse_args()
    os.environ["FB_BUILD_DIR"] = a.build
    os.environ["FB_PYGEN"] = os.path.join(a.build, "pygen")
    sys.path.insert(0, os.path.join(HERE, "..", "tests", "security"))
    import grpc
    from conftest import Server, dense_layout, kernel, pb, stmt, store_kernel, RPC_TIMEOUT
    from test_memory_budget import _children, _kib, _stats, _status

    def chain(name):
        s = [stmt("arg", pb.T_I32, imm=0), stmt("arg", pb.T_I32, imm=1)]
        prev = 1
        while len(s) < a.stmts - 1:
            s.append(stmt("add", pb.T_I32, args=[prev, 1]))
            prev = len(s) - 1
        s.append(stmt("store", args=[0, prev], snode_id=2))
        return kernel(name, s, params=[pb.T_I32, pb.T_I32])

    def mem(pid):
        out = []
        for p in [pid] + _children(pid):
            st = _status(p)
            out.append(f"pid {p}: VmRSS {_kib(st, 'VmRSS') // 1024} MiB, "
                       f"VmHWM {_kib(st, 'VmHWM') // 1024} MiB")
        return "; ".join(out)

    tmp = tempfile.TemporaryDirectory(prefix="kflood-")
    srv = Server(tmp.name, ("--memory-budget", a.budget, "--isolation", a.isolation))
    try:
        c = srv.client
        sid = c.new_session(dense_layout(64), mode=a.mode)
        print("before:", mem(srv.proc.pid))
        t0 = time.monotonic()
        ok = refused = 0
        last = None
        for i in range(a.requests):
            if a.case == "big":
                ks = [chain(f"big{i}_{j}") for j in range(a.per)]
            else:
                ks = [store_kernel(2) for _ in range(200)]
                if a.case == "small":
                    for j, k in enumerate(ks):
                        k.name = f"k{i}_{j}"
            try:
                c.register(pb.RegisterKernelsRequest(session_id=sid, kernels=ks),
                           timeout=RPC_TIMEOUT)
                ok += 1
            except grpc.RpcError as e:
                refused += 1
                last = f"{e.code().name}: {e.details()}"
                if refused > 3:
                    break
        print(f"{a.case}, {a.isolation} isolation, {a.mode}: {ok} requests registered, "
              f"{refused} refused, in {time.monotonic() - t0:.1f} s")
        if last:
            print("last refusal:", last)
        print("after:", mem(srv.proc.pid))
        print("budget:", " ".join(str(_stats(c).memory).split()))
    finally:
        srv.stop()
        tmp.cleanup()


if __name__ == "__main__":
    main()
