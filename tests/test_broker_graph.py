#!/usr/bin/env python3
"""The broker's files without circles (docs/design.md, "The service in two
layers"; issue 41).

Two graphs over server/ (the broker) and server/session/ (the session side):

- includes: file -> the server/ header it includes ("server/X.h"). Any
  cycle fails.
- calls: broker file -> broker file whose external function or variable
  (fbd_*) it names. A file of server/session/ may be named by the broker
  (the session side is below it), but a session/ file must name nothing
  defined in a broker file other than the shared helpers of the process
  (BROKER_SHARED), and the broker's circles may only shrink: KNOWN_CIRCLE
  lists the files still in one (each fix takes a file out of it); a file
  that joins a circle fails.

Run as a test (ctest test_broker_graph) and by hand:
  tests/test_broker_graph.py [--root SRC] [--show]
--selftest plants an include cycle and a new call circle in a copy of the
tree and checks that each is caught."""
import os
import re
import shutil
import sys
import tempfile

# the files of server/ still in a call circle (a ratchet: remove a file
# once it is out; a file that joins fails)
KNOWN_CIRCLE = {"drain.c", "methods.c", "rpc.c", "session.c"}
# what the session side may use of the broker's files: the log (log.c),
# settings (config.c: fbd_isolated; budget.c: fbd_code_cache_bytes), the
# clock (rpc.c: fbd_now), the scheduler's held time (sched.c), the code
# store (codestore.c), a checkpoint's source (ckpt.c), the memfd seal
# (methods.c)
BROKER_SHARED = {"log.c", "config.c", "budget.c", "rpc.c", "sched.c", "codestore.c", "ckpt.c",
                 "methods.c"}

INC = re.compile(r'^\s*#\s*include\s+"server/([^"]+)"', re.M)
DEF = re.compile(r'^(?!static\b)(?!typedef\b)(?!extern\b)[A-Za-z_][^;{}()=]*?'
                 r'\b(fbd_[a-z0-9_]+)\s*(\(|\[|=|;)', re.M)
USE = re.compile(r'\bfbd_[a-z0-9_]+\b')
COMMENT = re.compile(r'/\*.*?\*/|//[^\n]*', re.S)
STRING = re.compile(r'"(?:\\.|[^"\\\n])*"')


def files(root):
    out = {}
    for sub in ("server", "server/session"):
        d = os.path.join(root, sub)
        if not os.path.isdir(d):  # a tree from before the session side's folder
            continue
        for f in sorted(os.listdir(d)):
            if f.endswith((".c", ".h")):
                rel = os.path.relpath(os.path.join(d, f), os.path.join(root, "server"))
                with open(os.path.join(d, f), encoding="utf-8") as fh:
                    out[rel] = fh.read()
    return out


def cycles(graph):
    """The strongly connected components with more than one node (or a
    self edge), by Tarjan's algorithm."""
    index, low, stack, on, comps = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1 or v in graph.get(v, ()):
                comps.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return comps


def check(root, show=False):
    src = files(root)
    problems = []
    # includes
    inc = {f: {h for h in INC.findall(t) if h in src} for f, t in src.items()}
    for comp in cycles(inc):
        problems.append("include cycle: " + " -> ".join(comp))
    # calls: who defines each external name
    owner = {}
    code = {f: STRING.sub('""', COMMENT.sub(" ", t)) for f, t in src.items()}
    for f, t in code.items():
        if not f.endswith(".c"):
            continue
        for m in DEF.finditer(t):
            owner.setdefault(m.group(1), f)
    calls = {}
    for f, t in code.items():
        if not f.endswith(".c"):
            continue
        calls[f] = {owner[n] for n in set(USE.findall(t)) if n in owner and owner[n] != f}
    broker = {f: {g for g in gs if "/" not in g} for f, gs in calls.items() if "/" not in f}
    for comp in cycles(broker):
        joined = [f for f in comp if f not in KNOWN_CIRCLE]
        if joined:
            problems.append("call circle among the broker's files grew: %s joined (%s)" %
                            (", ".join(joined), " ".join(comp)))
        elif show:
            print("call circle (known, to shrink):", " ".join(comp))
    for f, gs in sorted(calls.items()):
        if f.startswith("session/"):
            bad = sorted(g for g in gs if "/" not in g and g not in BROKER_SHARED)
            if bad:
                problems.append("the session side's %s names the broker's %s" % (f, ", ".join(bad)))
    if show:
        for f in sorted(broker):
            print("%-14s -> %s" % (f, " ".join(sorted(broker[f]))))
    return problems


def selftest(root):
    """A planted include cycle and a planted call circle must each fail."""
    ok = True
    for plant in ("include", "call"):
        tmp = tempfile.mkdtemp(prefix="fb-graph-")
        try:
            shutil.copytree(os.path.join(root, "server"), os.path.join(tmp, "server"))
            if plant == "include":  # server.h <-> auth.h
                p = os.path.join(tmp, "server", "auth.h")
                with open(p, "a", encoding="utf-8") as fh:
                    fh.write('\n#include "server/server.h"\n')
                p = os.path.join(tmp, "server", "server.h")
                with open(p, "a", encoding="utf-8") as fh:
                    fh.write('\n#include "server/auth.h"\n')
            else:  # subject.c (in no circle) calls into rpc.c, which calls it
                p = os.path.join(tmp, "server", "subject.c")
                with open(p, "a", encoding="utf-8") as fh:
                    fh.write("\nvoid fbd_planted(void) { fbd_count_bad(0); }\n")
                p = os.path.join(tmp, "server", "rpc.c")
                with open(p, "a", encoding="utf-8") as fh:
                    fh.write("\nvoid fbd_planted2(void) { fbd_planted(); }\n")
            got = check(tmp)
            want = "include cycle" if plant == "include" else "grew:"
            if not any(want in g and (plant == "include" or "subject.c" in g) for g in got):
                print("selftest: a planted %s circle was not caught: %s" % (plant, got))
                ok = False
            else:
                print("selftest: planted %s circle caught: %s" %
                      (plant, [g for g in got if want in g][0]))
        finally:
            shutil.rmtree(tmp)
    return ok


def main():
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    args = sys.argv[1:]
    if "--root" in args:
        root = args[args.index("--root") + 1]
    problems = check(root, show="--show" in args)
    for p in problems:
        print(p)
    ok = not problems
    if "--selftest" in args:
        ok = selftest(root) and ok
    print("broker graph: %s" % ("ok" if ok else "FAILED"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
