#!/usr/bin/env python3
"""The broker's files without circles (docs/design.md, "The service in two
layers"; issue 41).

Two graphs over server/ (the broker) and server/session/ (the session side):

- includes: file -> the server/ header it includes ("server/X.h"). Any
  cycle fails.
- calls: broker file -> broker file whose external function or variable
  (fbd_*) it names. Any call circle among the broker's files fails: they
  form layers, each calling only the files below it (docs/design.md
  prints the order; --show prints it from the code), and where a lower
  file must reach a higher one it goes through a table the higher one
  fills (rpc.c dispatches through the methods' table, session.c answers a
  call upward through its method's on_job). A file of server/session/ may
  be named by the broker (the session side is below it), but a session/
  file must name nothing defined in a broker file other than the shared
  helpers of the process (BROKER_SHARED). An external name defined in two
  files fails too (the graph could not tell its owner).
- docs: the layer order printed in server/README.md and docs/design.md
  is the code's.
- isolation: only config.c and start.c of the broker's files ask
  fbd_isolated (ISOLATION_ASKED); every other difference between sessions
  in threads and in worker processes is behind fbd_session_ops.

Run as a test (ctest test_broker_graph) and by hand:
  tests/test_broker_graph.py [--root SRC] [--show]
--selftest plants an include cycle, a call circle between two files in
none, an isolation branch in budget.c, a layer list in server/README.md
that differs from the code's, and a goto label before a call (not a
definition) in a copy of the tree, and checks that the first four are
caught and the last is not taken for a definition."""
import os
import re
import shutil
import sys
import tempfile

# what the session side may use of the broker's files: the log and the
# clock (log.c), settings (config.c: fbd_isolated; budget.c:
# fbd_code_cache_bytes and a worker's part of the budget), the scheduler's
# held time (sched.c), the code store (codestore.c), a checkpoint's source
# (ckpt.c), the memfd seal (stage.c)
BROKER_SHARED = {"log.c", "config.c", "budget.c", "sched.c", "codestore.c", "ckpt.c", "stage.c"}
# the broker's files that may ask whether sessions run in threads or in
# worker processes (fbd_isolated): config.c reads the setting and start.c
# picks the session operations (fbd_thread_ops or fbd_process_ops) and
# starts the spares by it; every other difference is behind that table
ISOLATION_ASKED = {"config.c", "start.c"}

INC = re.compile(r'^\s*#\s*include\s+"server/([^"]+)"', re.M)
# a definition at the start of a line; no ':' before the name, so that a
# goto label ("out:") is not read as the start of one
DEF = re.compile(r'^(?!static\b)(?!typedef\b)(?!extern\b)[A-Za-z_][^;{}()=:]*?'
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
    for f, t in sorted(code.items()):
        if not f.endswith(".c"):
            continue
        for m in DEF.finditer(t):
            name = m.group(1)
            if name in owner and owner[name] != f:
                problems.append("%s is defined in both %s and %s" % (name, owner[name], f))
            owner.setdefault(name, f)
    calls = {}
    for f, t in code.items():
        if not f.endswith(".c"):
            continue
        calls[f] = {owner[n] for n in set(USE.findall(t)) if n in owner and owner[n] != f}
    broker = {f: {g for g in gs if "/" not in g} for f, gs in calls.items() if "/" not in f}
    for comp in cycles(broker):
        names = []
        for f in comp:
            for g in sorted(broker[f] & set(comp)):
                used = sorted(n for n in set(USE.findall(code[f])) if owner.get(n) == g)
                names.append("%s -> %s (%s)" % (f, g, ", ".join(used)))
        problems.append("call circle among the broker's files: %s; its arrows: %s" %
                        (" ".join(comp), "; ".join(names)))
    for f, t in sorted(code.items()):
        if "/" not in f and f.endswith(".c") and f not in ISOLATION_ASKED and \
                re.search(r"\bfbd_isolated\b", t):
            problems.append("the broker's %s asks fbd_isolated: put what differs between "
                            "threads and worker processes behind fbd_session_ops" % f)
    for f, gs in sorted(calls.items()):
        if f.startswith("session/"):
            bad = sorted(g for g in gs if "/" not in g and g not in BROKER_SHARED)
            if bad:
                problems.append("the session side's %s names the broker's %s" % (f, ", ".join(bad)))
    if not cycles(broker):
        problems += docs_layers(root, layers(broker))
    if show:
        for f in sorted(broker):
            print("%-14s -> %s" % (f, " ".join(sorted(broker[f]))))
        if not cycles(broker):
            print("layers, lowest first (a file calls only files in layers before its own):")
            for i, layer in enumerate(layers(broker)):
                print("  %d: %s" % (i, " ".join(layer)))
    return problems


def docs_layers(root, want):
    """The layer order printed in server/README.md (lines "    N  a.c b.c")
    and docs/design.md (rows "| N | `a.c` (what it does), `b.c` |") against
    the code's: a difference names the doc and the layer."""
    out = []
    docs = (("server/README.md", re.compile(r"^ {4}(\d+) +([a-z0-9_. ]+\.c)\s*$", re.M)),
            ("docs/design.md", re.compile(r"^\| (\d+) \| (.*`[a-z0-9_]+\.c`.*) \|$", re.M)))
    for doc, row in docs:
        path = os.path.join(root, doc)
        if not os.path.exists(path):  # a copy of server/ alone (--selftest)
            continue
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
        got = {}
        for m in row.finditer(text):
            cell = m.group(2)
            while re.search(r"\([^()]*\)", cell):  # what a file does, in parentheses
                cell = re.sub(r"\([^()]*\)", "", cell)
            names = re.findall(r"`([a-z0-9_]+\.c)`", cell) or cell.split()
            got[int(m.group(1))] = sorted(names)
        if not got:
            out.append("%s prints no layers of the broker's files" % doc)
            continue
        for i in range(max(len(want), max(got) + 1)):
            w = want[i] if i < len(want) else []
            g = got.get(i, [])
            if w != g:
                out.append("%s prints layer %d as %s; the code's is %s" %
                           (doc, i, " ".join(g) or "nothing", " ".join(w) or "nothing"))
    return out


def layers(graph):
    """A graph without circles in layers: a file's layer is one more than
    the highest layer of the files it calls (0: it calls none)."""
    depth = {}

    def d(v):
        if v not in depth:
            depth[v] = 1 + max((d(w) for w in graph.get(v, ())), default=-1)
        return depth[v]

    for v in graph:
        d(v)
    out = [[] for _ in range(max(depth.values(), default=-1) + 1)]
    for v in sorted(depth):
        out[depth[v]].append(v)
    return out


def plant(tmp, name, text):
    with open(os.path.join(tmp, "server", name), "a", encoding="utf-8") as fh:
        fh.write(text)


def selftest(root):
    """A planted include cycle and a planted call circle must each fail; a
    planted goto label before a call must not read as a definition."""
    ok = True
    for kind in ("include", "call", "label", "isolation", "docs"):
        tmp = tempfile.mkdtemp(prefix="fb-graph-")
        try:
            shutil.copytree(os.path.join(root, "server"), os.path.join(tmp, "server"))
            if kind == "include":  # server.h <-> auth.h
                plant(tmp, "auth.h", '\n#include "server/server.h"\n')
                plant(tmp, "server.h", '\n#include "server/auth.h"\n')
                want = lambda g: "include cycle" in g
            elif kind == "call":  # subject.c and call.c, in no circle, call each other
                plant(tmp, "subject.c", "\nvoid fbd_planted(void) { fbd_call_ref(0); }\n")
                plant(tmp, "call.c", "\nvoid fbd_planted2(void) { fbd_planted(); }\n")
                want = lambda g: ("call circle" in g and "call.c" in g and "subject.c" in g and
                                  "fbd_planted" in g)
            elif kind == "isolation":  # the budget branches on the isolation again
                plant(tmp, "budget.c", "\nint fbd_planted(fbd_server *srv) "
                      "{ return fbd_isolated(srv->cfg); }\n")
                want = lambda g: "budget.c asks fbd_isolated" in g
            elif kind == "docs":  # server/README.md puts rpc.c a layer too low
                readme = os.path.join(tmp, "server", "README.md")
                with open(readme, encoding="utf-8") as fh:
                    text = fh.read()
                with open(readme, "w", encoding="utf-8") as fh:
                    fh.write(re.sub(r"(?m)^( {4}3 +)rpc\.c ", r"\1", text)
                             .replace("    2  auth.c", "    2  rpc.c auth.c", 1))
                want = lambda g: "server/README.md prints layer 2" in g
            else:  # auth.c (before call.c in order) jumps to a label before a call
                plant(tmp, "auth.c", "\nvoid fbd_planted(void) {\n  goto out;\nout:\n"
                      "  fbd_call_ref(0);\n}\n")
                want = None
            got = check(tmp)
            if want is None:
                wrong = [g for g in got if "fbd_call_ref" in g or "auth.c" in g]
                if wrong:
                    print("selftest: a goto label was read as a definition: %s" % wrong)
                    ok = False
                else:
                    print("selftest: a goto label before a call is not a definition")
            elif not any(want(g) for g in got):
                print("selftest: a planted %s problem was not caught: %s" % (kind, got))
                ok = False
            else:
                print("selftest: planted %s problem caught: %s" %
                      (kind, [g for g in got if want(g)][0]))
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
