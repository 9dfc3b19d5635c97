#!/usr/bin/env python3
"""Fusebox against its peers (Taichi) on every case of bench/micro,
bench/large and bench/real: run by scripts/bench_peers.sh, which makes the peers' virtual
environments and passes their interpreters here (--peer NAME=PYTHON[:FLAGS]).

Per cycle and case, interleaved: `fusebox bench CASE.json --modes sync,async`
(one process, both modes), then each peer's port of the case
(taichi/harness.py, one process each), all with the same warm-up and timed
step counts. After the last cycle: the median wall-clock and the median
process CPU time (every thread) per step of each engine, two ratio tables
(peer / Fusebox: above 1 means Fusebox is faster) with geometric means, each
engine's thread count, the load average at the start and at the end, and
each engine's peak memory (the RSS high-water mark of
its process), an agreement check of the final fields (count, sum, sum of |x|, min and max
of every field the session compares between modes; within the tolerance
each port declares). On a shared machine read the CPU ratios: wall-clock
counts the time other jobs held the cores, CPU time only the engine's work. Exit status: 0 when every
engine ran every case and all results agree, 1 when a result disagrees, 2
when something could not run. Needs only the standard library, except
the shipped suite.

The shipped suite is Taichi 1.7's own examples (SHIPPED), run where they lie
in its wheel by python/tests/taichi_compare/runner.py (`bench`), the
examples test's runner: under Taichi 1.7 (each --peer without :async) and
under fusebox.taichi in sync and in async mode (its own fuseboxd with
--cpu-threads), one process each, per cycle and example. Timed: the frames
after the warm-up frames (a frame ends at the example's gui.show()), each
end after a ti.sync(); CPU time is the whole process tree's (fusebox: the
Python process, fuseboxd and its session worker), peak memory the sum of
their RSS high-water marks. Each Fusebox mode's final fields are checked
against Taichi's as test_taichi_examples.py checks them (its harness, so
NumPy and pytest in this Python). Without a Taichi 1.7 it is skipped, with
the reason.
"""
import argparse
import glob
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
CASES = ["micro/" + c for c in ("chain_copy", "increments", "fill_array", "sparse_saxpy", "autodiff",
                                "stencil_reduction", "mpm_splitted", "simple_advection", "multires",
                                "deep_hierarchy")] + \
        ["large/" + c for c in ("maccormack", "maccormack_channels", "mgpcg2d", "mgpcg3d", "mpm3d", "autodiff")] + \
        sorted("real/" + os.path.basename(p)[:-5] for p in glob.glob(os.path.join(ROOT, "bench", "real", "*.json")))
# bench/real is every session in that folder (bench/real/gpu holds the GPU sizes,
# which are not run here); each needs a port taichi/real_NAME.py.
# The shipped suite: Taichi 1.7's own examples (taichi/examples/ in its wheel), run where
# they lie, under Taichi and under fusebox.taichi in both modes, by the examples test's
# runner (python/tests/taichi_compare/runner.py bench); per example: its path, and the
# warm-up and timed frames (a frame ends at the example's gui.show()).
# autodiff/diff_sph is left out: it writes out of bounds, which fusebox.taichi refuses
# (test_taichi_examples.py KNOWN_GAPS).
SHIPPED = {
    "mpm88": ("simulation/mpm88.py", 3, 20),
    "mpm99": ("simulation/mpm99.py", 3, 20),
    "mpm128": ("simulation/mpm128.py", 3, 20),
    "pbf2d": ("simulation/pbf2d.py", 3, 20),
    "nbody": ("simulation/nbody.py", 3, 20),
    "game_of_life": ("simulation/game_of_life.py", 3, 20),
    "waterwave": ("simulation/waterwave.py", 3, 20),
    "mass_spring_game": ("simulation/mass_spring_game.py", 3, 20),
    "vortex_rings": ("simulation/vortex_rings.py", 3, 20),
    "physarum": ("simulation/physarum.py", 3, 20),
    "taichi_sparse": ("features/sparse/taichi_sparse.py", 3, 20),
    "taichi_bitmasked": ("features/sparse/taichi_bitmasked.py", 3, 20),
    "mgpcg": ("algorithm/mgpcg.py", 3, 10),
    "fractal": ("simulation/fractal.py", 3, 20),
}
SHIPPED_CASES = ["shipped/" + n for n in SHIPPED]
SHIPPED_ENGINES = ("fusebox-sync", "fusebox-async")  # then the Taichi 1.7 peers
COMPARE = os.path.join(ROOT, "python", "tests", "taichi_compare")
# Where the benchmark runs more frames than test_taichi_examples.py and so
# needs its own rule: taichi_sparse activates the cells under a rotating
# logo, and after 7 frames a few cells on its edge (3 of 262,144 observed)
# fall on the other side of the boundary under one engine, from the last
# bit of an f32 sin or cos; any other difference is still a failure.
SHIPPED_HOW = {"features/sparse/taichi_sparse.py": ("close", 1e-5, 1e-6, 1e-4)}
EXAMPLES_TEST = os.path.join(ROOT, "python", "tests", "test_taichi_examples.py")
SUITES = ("micro", "large", "real", "shipped")
QUICK = (1, 2, 1)  # warm-up steps, timed steps, cycles


def parse_args(argv):
    ap = argparse.ArgumentParser(prog="bench_peers", description="Fusebox against Taichi on bench/micro, bench/large, bench/real and "
                                             "Taichi 1.7's shipped examples (shipped): "
                                             "wall-clock and process CPU time per step, ratios and "
                                             "geomeans per suite, peak memory of each engine "
                                             "(bench/peers/README.md).",
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="exit status: 0 all ran and agree, 1 a result differs, "
                                        "2 something could not run")
    ap.add_argument("--fusebox", required=True, help="the fusebox CLI (a Release build)")
    ap.add_argument("--peer", action="append", default=[], metavar="NAME=PYTHON[:async]",
                    help="a peer: its name, its Python (with taichi installed), ':async' for "
                         "Taichi 0.7's async_mode (repeatable)")
    ap.add_argument("--quick", action="store_true",
                    help="smoke run: %d warm-up + %d timed steps, %d cycle" % QUICK)
    ap.add_argument("--cycles", type=int, help="interleaved cycles; medians over them (default 3)")
    ap.add_argument("--warmup", type=int, help="warm-up steps (default: each session's bench block; "
                    "shipped: warm-up frames, at least 1, default per example)")
    ap.add_argument("--repeat", type=int, help="timed steps (default: each session's bench block; "
                    "shipped: timed frames, default per example)")
    ap.add_argument("--threads", type=int, default=2, help="every engine's CPU threads (Taichi's cpu_max_num_threads, "
                         "`fusebox bench --threads`; default 2); the report warns when an "
                         "engine's count differs")
    ap.add_argument("--cases", help="comma-separated SUITE/CASE subset (default: all %d)"
                    % (len(CASES) + len(SHIPPED_CASES)))
    ap.add_argument("--suites", help="comma-separated subset of the suites %s (with --cases: the "
                         "cases of both)" % ",".join(SUITES))
    ap.add_argument("--json", metavar="OUT", help="also write every figure as JSON: wall-clock and CPU time per step of "
                         "each cycle, medians, ratios, threads, load averages, peak memory, field statistics")
    ap.add_argument("--check-args", action="store_true",
                    help="only check the arguments and exit (scripts/bench_peers.sh does this "
                         "before it installs anything)")
    a = ap.parse_args(argv)
    if a.quick:
        a.warmup = QUICK[0] if a.warmup is None else a.warmup
        a.repeat = QUICK[1] if a.repeat is None else a.repeat
        a.cycles = QUICK[2] if a.cycles is None else a.cycles
    a.cycles = 3 if a.cycles is None else a.cycles
    for name, v, lo in (("--cycles", a.cycles, 1), ("--warmup", a.warmup, 0), ("--repeat", a.repeat, 1),
                        ("--threads", a.threads, 1)):
        if v is not None and v < lo:
            ap.error("%s must be >= %d, got %d" % (name, lo, v))
    every = CASES + SHIPPED_CASES
    cases = [] if a.cases or a.suites else list(every)
    for su in (a.suites.split(",") if a.suites else []):
        if su not in SUITES:
            ap.error("unknown suite %r (known: %s)" % (su, " ".join(SUITES)))
        cases += [c for c in every if c.startswith(su + "/") and c not in cases]
    for c in (a.cases.split(",") if a.cases else []):
        if c not in every:
            ap.error("unknown case %r (known: %s)" % (c, " ".join(every)))
        if c not in cases:
            cases.append(c)
    a.cases = cases
    peers = []
    for p in a.peer:
        name, eq, rest = p.partition("=")
        py, _, flag = rest.partition(":")
        if not eq or not name or not py or flag not in ("", "async"):
            ap.error("--peer wants NAME=PYTHON or NAME=PYTHON:async, got %r" % p)
        peers.append((name, py, flag == "async"))
    a.peers = peers
    return a


def bench_block(case):
    with open(os.path.join(ROOT, "bench", case + ".json")) as f:
        b = json.load(f).get("bench", {})
    return b.get("warmup", 3), b.get("repeat", 10)


class Done:
    """What run() returns: returncode, stdout, stderr, and the process's peak
    resident memory in MiB (its RSS high-water mark, ru_maxrss from wait4;
    its own threads included, not its children's)."""
    def __init__(self, returncode, stdout, stderr, rss_mib):
        self.returncode, self.stdout, self.stderr, self.rss_mib = returncode, stdout, stderr, rss_mib


def run(cmd, env=None, cwd=None):
    t = time.time()
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        p = subprocess.Popen(cmd, stdout=out, stderr=err, universal_newlines=True, env=env, cwd=cwd)
        _, status, ru = os.wait4(p.pid, 0)
        p.returncode = os.waitstatus_to_exitcode(status) if hasattr(os, "waitstatus_to_exitcode") else \
            (os.WEXITSTATUS(status) if os.WIFEXITED(status) else -os.WTERMSIG(status))
        out.seek(0)
        err.seek(0)
        # ru_maxrss is in KiB on Linux
        return Done(p.returncode, out.read(), err.read(), ru.ru_maxrss / 1024.0), time.time() - t


def run_fusebox(a, case, warmup, repeat, env):
    """Both modes of one case in one `fusebox bench` process: (modes, cores,
    peak MiB, None) or (None, None, None, error). `--local` runs the engine in
    that process (the compile pool is threads of it), so the process's RSS
    high-water mark is the engine's peak over both modes."""
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "out.json")
        p, _ = run([a.fusebox, "bench", os.path.join(ROOT, "bench", case + ".json"), "--local",
                    "--modes", "sync,async", "--warmup", str(warmup), "--repeat", str(repeat),
                    "--threads", str(a.threads), "--json", out], env)
        if not os.path.exists(out):
            return None, None, None, "fusebox bench exited %d: %s" % (p.returncode, p.stderr.strip()[-600:])
        with open(out) as f:
            j = json.load(f)
    if p.returncode:
        return None, None, None, "fusebox bench exited %d (checks): %s" % (p.returncode, p.stderr.strip()[-600:])
    # `fusebox bench --local --threads N` opens its engine with a CPU pool of
    # N threads and records N as machine.cpu_threads (older builds: none, and
    # a pool of one thread per online core, machine.cores).
    m = j.get("machine", {})
    return j["cases"][0]["modes"], m.get("cpu_threads") or m.get("cores"), p.rss_mib, None


def run_peer(py, is_async, a, case, warmup, repeat, env):
    cmd = [py, os.path.join(HERE, "taichi", "harness.py"), case, "--warmup", str(warmup),
           "--repeat", str(repeat), "--threads", str(a.threads)] + (["--async"] if is_async else [])
    p, _ = run(cmd, env)
    lines = [l for l in p.stdout.splitlines() if l.startswith("{")]
    if p.returncode or not lines:
        return None, "exited %d: %s" % (p.returncode, (p.stderr or p.stdout).strip()[-600:])
    res = json.loads(lines[-1])
    res["rss_mib"] = p.rss_mib
    return res, None


def differs(ref, got, rtol, stats):
    """The first statistic of got that is off ref by more than rtol (relative
    to the field's magnitude), or None."""
    for name, r in ref.items():
        g = got.get(name)
        if g is None:
            return "%s: missing" % name
        if g["n"] != r["n"]:
            return "%s: %d values vs %d" % (name, g["n"], r["n"])
        mag = max(r["abs_sum"], g["abs_sum"]) or 1.0
        peak = max(abs(r["min"]), abs(r["max"]), abs(g["min"]), abs(g["max"])) or 1.0
        for k, scale in (("sum", mag), ("abs_sum", mag), ("min", peak), ("max", peak)):
            if k in stats and not abs(g[k] - r[k]) <= rtol * scale + 1e-12:
                return "%s.%s: %.9g vs Fusebox %.9g (tolerance %.3g)" % (name, k, g[k], r[k], rtol * scale)
    return None


def geomean(xs):
    xs = [x for x in xs if x and x > 0]
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else float("nan")


def loadavg():
    return [round(x, 2) for x in os.getloadavg()]


def package_source(fusebox):
    """The python/ folder of the checkout the --fusebox build was made from
    (its CMakeCache.txt's CMAKE_HOME_DIRECTORY), so that fusebox.taichi and
    fuseboxd come from one commit (bench/peers/shipped_ab.py compares two);
    this checkout's when the build does not say."""
    cache = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(fusebox))), "CMakeCache.txt")
    try:
        with open(cache) as f:
            for ln in f:
                if ln.startswith("CMAKE_HOME_DIRECTORY:"):
                    py = os.path.join(ln.split("=", 1)[1].strip(), "python")
                    if os.path.exists(os.path.join(py, "setup.py")):
                        return py
    except OSError:
        pass
    return os.path.join(ROOT, "python")


def shipped_setup(a, env):
    """What the shipped suite needs: (context, None), or (None, why it is
    skipped). The Taichi 1.7 peers (every --peer without :async) and the
    examples folder of the first; the fusebox package of the checkout
    --fusebox was built from (setup.py build_py into a temporary folder)
    and the fuseboxd beside --fusebox; the examples test's comparison (harness.py: NumPy and
    pytest in this Python) and its tolerances (test_taichi_examples.py)."""
    import ast
    import atexit
    import shutil
    peers = [(n, py) for n, py, asy in a.peers if not asy]
    if not peers:
        return None, ("it runs Taichi 1.7's own examples, and no Taichi 1.7 was given "
                      "(--peer NAME=PYTHON; scripts/bench_peers.sh makes one)")
    try:
        r = subprocess.run([peers[0][1], "-c", "import os, taichi; v = taichi.__version__; "
                            "print('version', '.'.join(map(str, v)) if isinstance(v, tuple) else v); "
                            "print('examples', os.path.join(os.path.dirname(taichi.__file__), "
                            "'examples'))"],
                           capture_output=True, universal_newlines=True, timeout=300)
    except (OSError, subprocess.SubprocessError) as e:
        return None, "%s cannot run: %s" % (peers[0][1], e)
    said = dict(ln.split(" ", 1) for ln in r.stdout.splitlines()
                if ln.startswith(("version ", "examples ")))
    if r.returncode or not said.get("version", "").startswith("1.7."):
        return None, "%s has no Taichi 1.7 (%s)" % (
            peers[0][1], "taichi " + said["version"] if "version" in said else
            "import taichi: " + (r.stderr.strip().splitlines() or ["failed"])[-1])
    ex_dir = said["examples"]
    fuseboxd = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(a.fusebox))),
                            "server", "fuseboxd")
    if not os.access(fuseboxd, os.X_OK):
        return None, "no fuseboxd beside --fusebox (%s): build it" % fuseboxd
    try:
        sys.path.insert(0, COMPARE)
        import harness
    except ImportError as e:
        return None, "the examples' comparison (%s/harness.py) needs %s in %s" % (
            COMPARE, e.name, sys.executable)
    with open(EXAMPLES_TEST) as f:
        tree = ast.parse(f.read())
    how = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "EXAMPLES":
            how = {rel: h for rel, _, h in ast.literal_eval(node.value)}
    lib = tempfile.mkdtemp(prefix="bench-peers-fusebox-")
    atexit.register(shutil.rmtree, lib, True)
    subprocess.check_call([sys.executable, "setup.py", "-q", "build_py", "--build-lib", lib],
                          cwd=package_source(a.fusebox), stdout=subprocess.DEVNULL)
    fb_env = dict(env, PYTHONPATH=lib, FUSEBOXD=fuseboxd, PYTHONDONTWRITEBYTECODE="1")
    fb_env.pop("FUSEBOX_GUI_DIR", None)
    ti_env = dict(env, PYTHONDONTWRITEBYTECODE="1", TI_GUI_SHOW="0")
    ti_env.pop("PYTHONPATH", None)
    return {"peers": peers, "dir": ex_dir, "how": how, "harness": harness, "fb_env": fb_env,
            "ti_env": ti_env, "package": package_source(a.fusebox)}, None


def run_example(py, engine, path, warmup, frames, threads, env):
    """One example under one engine (runner.py bench, in a temporary working
    folder): (arrays, (wall s, tree CPU s, own CPU s, peak MiB, threads)
    over the timed frames) or (None, error)."""
    import numpy as np
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "out.npz")
        p, _ = run([py, os.path.join(COMPARE, "runner.py"), "bench", engine, path, out,
                    str(warmup), str(frames), str(threads)], env, cwd=d)
        if p.returncode or not os.path.exists(out):
            return None, "exited %d: %s" % (p.returncode, (p.stderr or p.stdout).strip()[-600:])
        with np.load(out) as z:
            arrays = {k: z[k] for k in z.files}
    b = arrays.pop("__bench__")
    shown = int(arrays.pop("__frames__"))
    if shown != warmup + frames:
        return None, "showed %d frames, not %d" % (shown, warmup + frames)
    return arrays, tuple(float(x) for x in b)


def frames_of(a, name):
    """(warm-up, timed) frames of a shipped example: its own, or --warmup
    (at least 1: the first frame compiles) and --repeat."""
    _, w, r = SHIPPED[name]
    return (max(1, a.warmup) if a.warmup is not None else w), (a.repeat if a.repeat is not None else r)


def run_shipped(a, ctx, case, cyc, wall, cpu, threads, rss, client_cpu, errors, disagree):
    """One cycle of one shipped example: Fusebox sync, Fusebox async, then
    each Taichi 1.7 peer, each its own process; the figures per timed frame;
    each Fusebox mode's fields checked against the first peer's the way
    test_taichi_examples.py checks them."""
    name = case.split("/", 1)[1]
    rel = SHIPPED[name][0]
    w, r = frames_of(a, name)
    path = os.path.join(ctx["dir"], rel)
    print("[cycle %d/%d] %s (%s): %d warm-up + %d timed frames" % (cyc + 1, a.cycles, case, rel, w, r),
          file=sys.stderr, flush=True)
    got = {}
    runs = [(e, sys.executable, e, ctx["fb_env"]) for e in SHIPPED_ENGINES] + \
           [(n, py, "taichi", ctx["ti_env"]) for n, py in ctx["peers"]]
    for e, py, engine, env in runs:
        arrays, res = run_example(py, engine, path, w, r, a.threads, env)
        if arrays is None:
            errors.append("%s %s: %s" % (case, e, res))
            continue
        got[e] = arrays
        wall[case][e].append(res[0] / r)
        cpu[case][e].append(res[1] / r)
        threads[e].append(int(res[4]))
        if e in SHIPPED_ENGINES:
            client_cpu[case][e].append(res[2] / r)
        if e != "fusebox-sync":  # one figure for Fusebox: the async run's
            rss[case]["fusebox" if e == "fusebox-async" else e].append(res[3])
    ref = ctx["peers"][0][0]
    how = SHIPPED_HOW.get(rel, ctx["how"].get(rel, "shapes"))
    for e in SHIPPED_ENGINES:
        if ref not in got or e not in got:
            continue
        try:
            if how == "shapes":
                ctx["harness"].compare_shapes(rel, got[ref], got[e])
            elif how != "runs":
                ctx["harness"].compare(rel, got[ref], got[e], how[1], how[2], share=how[3])
        except AssertionError as x:
            disagree.append("%s %s (cycle %d): %s" % (case, e, cyc + 1,
                                                      " ".join(str(x).split("\n")[1:3]).strip()))


def main(argv):
    a = parse_args(argv)
    if a.check_args:
        return 0
    env = dict(os.environ)
    env.pop("FUSEBOX_SERVER", None)
    nproc = os.cpu_count() or 1
    if nproc < a.threads:
        print("note: --threads %d is more than this machine's %d online cores" % (a.threads, nproc),
              file=sys.stderr)
    engines = ["fusebox-sync", "fusebox-async"] + [p[0] for p in a.peers]
    wall = {c: {e: [] for e in engines} for c in a.cases}
    cpu = {c: {e: [] for e in engines} for c in a.cases}
    threads = {e: [] for e in engines}  # as each run reported it
    mem_engines = ["fusebox"] + [p[0] for p in a.peers]  # one Fusebox process runs both modes
    rss = {c: {e: [] for e in mem_engines} for c in a.cases}
    fields, errors, disagree, seen = {}, [], [], {}
    client_cpu = {c: {e: [] for e in SHIPPED_ENGINES} for c in a.cases if c in SHIPPED_CASES}
    shipped, skipped = None, None
    if any(c in SHIPPED_CASES for c in a.cases):
        shipped, skipped = shipped_setup(a, env)
        if skipped:
            print("shipped suite skipped: " + skipped, file=sys.stderr)
            a.cases = [c for c in a.cases if c not in SHIPPED_CASES]
            if not a.cases:
                print("nothing left to run", file=sys.stderr)
                return 2
            wall, cpu, rss = ({c: t[c] for c in a.cases} for t in (wall, cpu, rss))
            client_cpu = {}
    load_start = loadavg()
    for cyc in range(a.cycles):
        for case in a.cases:
            if case in SHIPPED_CASES:
                run_shipped(a, shipped, case, cyc, wall, cpu, threads, rss, client_cpu, errors,
                            disagree)
                continue
            w, r = bench_block(case)
            w = a.warmup if a.warmup is not None else w
            r = a.repeat if a.repeat is not None else r
            print("[cycle %d/%d] %s: %d warm-up + %d timed steps" % (cyc + 1, a.cycles, case, w, r),
                  file=sys.stderr, flush=True)
            modes, cores, mib, err = run_fusebox(a, case, w, r, env)
            if err:
                errors.append("%s fusebox: %s" % (case, err))
            else:
                for m in ("sync", "async"):
                    wall[case]["fusebox-" + m].append(modes[m]["wall_s"])
                    cpu[case]["fusebox-" + m].append(modes[m].get("cpu_s"))
                    threads["fusebox-" + m].append(cores)
                rss[case]["fusebox"].append(mib)
                fields.setdefault(case, {})["fusebox"] = modes["sync"].get("fields", {})
            for name, py, is_async in a.peers:
                res, err = run_peer(py, is_async, a, case, w, r, env)
                if err:
                    errors.append("%s %s: %s" % (case, name, err))
                    continue
                wall[case][name].append(res["wall_s"])
                cpu[case][name].append(res.get("cpu_s"))
                threads[name].append(res.get("threads"))
                rss[case][name].append(res.get("rss_mib"))
                # the version and the process's OS threads, for the record
                seen[name] = {k: res[k] for k in ("taichi", "os_threads") if k in res}
                ref = fields.get(case, {}).get("fusebox")
                if ref is not None:
                    d = differs(ref, res["fields"], res["rtol"], res["stats"])
                    if d:
                        disagree.append("%s %s (cycle %d): %s" % (case, name, cyc + 1, d))
                fields.setdefault(case, {})[name] = res["fields"]
    out = summarize(a, engines, wall, cpu, threads)
    out.update({"memory_engines": mem_engines, "rss_mib_per_cycle": rss,
                "peak_rss_mib": {c: {e: median(v) for e, v in t.items()} for c, t in rss.items()}})
    out.update({"cores": nproc, "warmup": a.warmup, "repeat": a.repeat, "quick": a.quick,
                "loadavg_start": load_start, "loadavg_end": loadavg(),
                "peers": {n: dict(seen.get(n, {}), python=py, async_mode=asy) for n, py, asy in a.peers},
                "fields": fields, "errors": errors, "disagreements": disagree})
    if client_cpu:
        out["shipped_client_cpu_s_per_step"] = client_cpu
        out["shipped_client_cpu_share"] = {
            c: {e: (median(v) / out["median_cpu_s"][c][e]
                    if median(v) is not None and out["median_cpu_s"][c][e] else None)
                for e, v in t.items()} for c, t in client_cpu.items()}
    if skipped:
        out["shipped_skipped"] = skipped
    if shipped:
        out["shipped_package"] = shipped["package"]
        out["shipped_frames"] = {c: frames_of(a, c.split("/", 1)[1]) for c in a.cases
                                 if c in SHIPPED_CASES}
    report(out, sys.stdout)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=2)
    return 2 if errors else 1 if disagree else 0


def median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def summarize(a, engines, wall, cpu, threads):
    """Medians over the cycles, ratios and geomeans of wall-clock and of CPU
    time, and each engine's thread count: the JSON that report() prints."""
    mw = {c: {e: median(v) for e, v in t.items()} for c, t in wall.items()}
    mc = {c: {e: median(v) for e, v in t.items()} for c, t in cpu.items()}
    # CPU / wall: the cores an engine kept busy on average (at most its threads).
    busy = {e: geomean([mc[c][e] / mw[c][e] for c in a.cases if mc[c][e] and mw[c][e]])
            for e in engines}
    th = {}
    for e, v in threads.items():
        seen = sorted(set(x for x in v if x is not None))
        th[e] = seen[0] if len(seen) == 1 else (seen or None)
    return {"cycles": a.cycles, "threads": a.threads, "engines": engines, "cases": a.cases,
            "engine_threads": th, "threads_match": all(t == a.threads for t in th.values()),
            "wall_s_per_step": wall, "cpu_s_per_step": cpu,
            "median_wall_s": mw, "median_cpu_s": mc, "cpu_per_wall": busy,
            "ratios": ratios(a.cases, engines, mw), "cpu_ratios": ratios(a.cases, engines, mc)}


def ratios(cases, engines, med):
    """For each peer: peer / fusebox-async and peer / fusebox-sync per case,
    with geometric means over the cases both engines ran (plus sync / async)."""
    out = {}
    pairs = [("fusebox-sync", "fusebox-async")] + \
            [(p, f) for p in engines[2:] for f in ("fusebox-async", "fusebox-sync")]
    for num, den in pairs:
        per = {c: med[c][num] / med[c][den] for c in cases if med[c][num] and med[c][den]}
        out["%s / %s" % (num, den)] = {"cases": per, "geomean": geomean(per.values())}
    return out


def table(out, f, title, med, rs, extra=None):
    engines, cases = out["engines"], out["cases"]
    cols = list(rs)
    blank = " | ".join([""] * len(engines))
    print("\n" + title, file=f)
    print("| case | " + " | ".join(engines) + " | " + " | ".join(cols) + " |", file=f)
    print("|---" * (1 + len(engines) + len(cols)) + "|", file=f)
    for c in cases:
        ms = ["%.3f" % (med[c][e] * 1e3) if med[c][e] else "-" for e in engines]
        rr = ["%.2f" % rs[k]["cases"][c] if c in rs[k]["cases"] else "-" for k in cols]
        print("| %s | %s | %s |" % (c, " | ".join(ms), " | ".join(rr)), file=f)
    for suite in SUITES:
        sub = [c for c in cases if c.startswith(suite)]
        if sub:
            g = ["%.2f" % geomean([rs[k]["cases"][c] for c in sub if c in rs[k]["cases"]]) for k in cols]
            print("| **geomean %s** | %s | %s |" % (suite, blank, " | ".join(g)), file=f)
    print("| **geomean all** | %s | %s |" % (blank, " | ".join("%.2f" % rs[k]["geomean"] for k in cols)),
          file=f)
    if extra:
        print("| %s | %s | %s |" % (extra[0], " | ".join(extra[1]), " | ".join([""] * len(cols))), file=f)


def mem_table(out, f, over):
    """Peak memory per case: each engine's process RSS high-water mark."""
    es = out.get("memory_engines")
    if not es:
        return
    peers = es[1:]
    print("\npeak memory MiB (median over the cycles of each process's RSS high-water mark; "
          "fusebox: one process, both modes) " + over, file=f)
    print("| case | " + " | ".join(es) + "".join(" | %s / fusebox" % p for p in peers) + " |", file=f)
    print("|---" * (1 + len(es) + len(peers)) + "|", file=f)
    for c in out["cases"]:
        m = out["peak_rss_mib"][c]
        cells = ["%.0f" % m[e] if m[e] else "-" for e in es]
        cells += ["%.2f" % (m[p] / m["fusebox"]) if m[p] and m["fusebox"] else "-" for p in peers]
        print("| %s | %s |" % (c, " | ".join(cells)), file=f)


def client_table(out, f, over):
    """Shipped examples: the CPU time of fusebox.taichi's Python process
    (the example itself, the front end, the GUI stand-in) per frame, and
    its share of the whole engine's (that process, fuseboxd and its session
    worker)."""
    cc = out.get("shipped_client_cpu_s_per_step")
    if not cc:
        return
    print("\nshipped: CPU ms per frame of fusebox.taichi's Python process (the example, the front "
          "end, the GUI stand-in) and its share of the engine's CPU (+ fuseboxd and its worker) "
          + over, file=f)
    print("| case | " + " | ".join("%s Python ms | share" % e for e in SHIPPED_ENGINES) + " |", file=f)
    print("|---" * (1 + 2 * len(SHIPPED_ENGINES)) + "|", file=f)
    for c, t in cc.items():
        cells = []
        for e in SHIPPED_ENGINES:
            m, sh = median(t[e]), out["shipped_client_cpu_share"][c][e]
            cells += ["%.3f" % (m * 1e3) if m is not None else "-",
                      "%.2f" % sh if sh is not None else "-"]
        print("| %s | %s |" % (c, " | ".join(cells)), file=f)


def report(out, f):
    n = out["cycles"]
    over = "over %d cycle%s" % (n, "" if n == 1 else "s")
    th = out["engine_threads"]
    print("\nthreads: %s (asked: %d; Fusebox's is `fusebox bench --threads`, Taichi's "
          "cpu_max_num_threads)" % (", ".join("%s %s" % (e, th[e]) for e in out["engines"]),
                                     out["threads"]), file=f)
    if not out["threads_match"]:
        print("WARNING: the engines did not all run %d threads, so the ratios compare unequal "
              "machines" % out["threads"], file=f)
    print("load average: %s at the start, %s at the end" % (
        " ".join("%.2f" % x for x in out["loadavg_start"]),
        " ".join("%.2f" % x for x in out["loadavg_end"])), file=f)
    table(out, f, "median wall-clock ms per step " + over, out["median_wall_s"], out["ratios"])
    busy = ["%.2f" % out["cpu_per_wall"][e] if out["cpu_per_wall"][e] == out["cpu_per_wall"][e]
            else "-" for e in out["engines"]]
    table(out, f, "median process CPU ms per step " + over + " (every thread of the engine's process)",
          out["median_cpu_s"], out["cpu_ratios"], ("**CPU / wall geomean**", busy))
    mem_table(out, f, over)
    client_table(out, f, over)
    if out.get("shipped_skipped"):
        print("\nshipped suite skipped: " + out["shipped_skipped"], file=f)
    print("\nratios: A / B = A's time over B's (above 1: B is faster); CPU / wall: the cores an "
          "engine kept busy on average", file=f)
    for e in out["errors"]:
        print("ERROR " + e, file=f)
    for d in out["disagreements"]:
        print("DIFFERS " + d, file=f)
    if not out["errors"] and not out["disagreements"]:
        print("every engine ran every case; final fields agree within each case's tolerance", file=f)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
