"""Runs one Taichi program under an engine and saves what it returns.

    python runner.py program ENGINE PROGRAM.py OUT.npz
    python runner.py example ENGINE EXAMPLE.py OUT.npz FRAMES

ENGINE is ``taichi`` (the real Taichi installed in this interpreter; its
``ti.init`` is made to choose ``arch=ti.cpu`` whatever the program asks) or
``fusebox`` (``fusebox.taichi`` put in ``sys.modules['taichi']`` before the
program is imported, so that its ``import taichi as ti`` gets it).

``program``: PROGRAM.py is a plain Taichi program (it calls ``ti.init``
itself) with a function ``run()`` that returns a dict of arrays or numbers;
they are saved in OUT.npz.

``example``: EXAMPLE.py (one of the examples shipped in the taichi wheel,
run where it lies) runs as ``__main__``; its GUI loop ends after FRAMES
frames (``$FUSEBOX_GUI_FRAMES`` under fusebox; under Taichi, a GUI whose
``show`` stops ``running`` after FRAMES frames, with no window, and
fusebox.taichi's headless ``ti.ui`` for GGUI windows). Under both,
matplotlib is stand_ins/matplotlib and Python's and NumPy's random
streams are seeded alike. The module-level fields it leaves (anything
with ``to_numpy``) are saved in OUT.npz, with the series it plotted
(``plot.N.x``, ``plot.N.y``) and ``__frames__``, the frames shown.

``bench`` (bench/peers/bench_peers.py's ``shipped`` suite): EXAMPLE.py as
``example`` does, for WARMUP + FRAMES frames, ENGINE ``taichi``,
``fusebox-sync`` or ``fusebox-async`` (ti.init's async_mode, forced; CPU,
THREADS threads under both). After the warm-up frames and after the last,
a ti.sync() and the clocks; OUT.npz also has ``__bench__``: the wall
seconds, the CPU seconds of the process tree (this process, a private
fuseboxd and its session worker) and of this process alone over the
timed frames, the tree's peak RSS in MiB (the sum of each process's
high-water mark) and the compute threads (Taichi's cpu_max_num_threads as
it took it; fuseboxd's --cpu-threads).

    python runner.py bench ENGINE EXAMPLE.py OUT.npz WARMUP FRAMES THREADS

Exit status 0 when the program ran to the end; 1 with its traceback on
stderr otherwise.
"""
import importlib.util
import os
import random
import sys
import time
import traceback
import types

import numpy as np

STAND_INS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "stand_ins")
SEED = 20240607
UI_STAND_IN = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), "fusebox", "taichi", "_ui.py")


def use_engine(engine, threads=None, mode=None):
    """threads and mode (runner.py bench): every ti.init gets
    cpu_max_num_threads=threads under Taichi; under fusebox, arch=ti.cpu and
    async_mode=(mode == "async"), on a private fuseboxd with --cpu-threads
    threads unless $FUSEBOX_SERVER names one."""
    if engine == "fusebox":
        import fusebox.taichi as ti
        sys.modules["taichi"] = ti
        for sub in ("math", "tools", "types", "ad", "ui", "lang"):
            mod = getattr(ti, sub, None)
            if mod is not None:
                sys.modules["taichi." + sub] = mod
        if mode is not None:
            bench_fusebox(ti, threads, mode)
        return ti
    if engine == "taichi":
        import taichi as ti
        init = ti.init

        def init_on_cpu(*args, **kwargs):  # the comparison is with Taichi's CPU backend
            kwargs["arch"] = ti.cpu
            if threads:
                kwargs["cpu_max_num_threads"] = threads
            return init(*args[1:], **kwargs)

        ti.init = init_on_cpu
        return ti
    raise SystemExit(f"runner.py: engine must be taichi or fusebox, not {engine!r}")


def bench_fusebox(ti, threads, mode):
    """Under fusebox for the benchmark: the mode and the CPU threads fixed
    whatever the example's ti.init asks (it asks for a GPU, or nothing)."""
    import atexit
    import fusebox
    if not os.environ.get("FUSEBOX_SERVER"):
        d = fusebox.client._Daemon(fusebox.client.find_fuseboxd(),
                                   ["--cpu-threads", str(threads or 0)])
        os.environ["FUSEBOX_SERVER"] = d.address

        def stop():
            ti.reset()  # the session ends before its server does
            d.stop()
        atexit.register(stop)
    init = ti.init

    def init_fixed(*args, **kwargs):
        kwargs["arch"] = ti.cpu
        kwargs["async_mode"] = mode == "async"
        return init(*args[1:], **kwargs)

    ti.init = init_fixed
    ti.init()  # an example that never calls ti.init runs in this mode too


def as_arrays(results, what):
    if not isinstance(results, dict):
        raise TypeError(f"{what} returned {type(results).__name__}; expected a dict of arrays")
    out = {}
    for k, v in results.items():
        a = v.to_numpy() if hasattr(v, "to_numpy") else np.asarray(v)
        if a.dtype == object:
            raise TypeError(f"{what}: {k!r} is not an array of numbers ({v!r})")
        out[str(k)] = a
    return out


def run_program(path, out):
    spec = importlib.util.spec_from_file_location(
        "tiprog_" + os.path.splitext(os.path.basename(path))[0], path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    np.savez(out, **as_arrays(mod.run(), os.path.basename(path) + ": run()"))


def taichi_frame_limit(ti, frames):
    """Under real Taichi, what fusebox's GUI does with $FUSEBOX_GUI_FRAMES:
    no window; after `frames` frames `running` is False and one EXIT press
    is reported; a show() past that ends the program (SystemExit(0))."""
    os.environ["TI_GUI_SHOW"] = "0"
    gui_cls = ti.GUI
    shown = {"n": 0}

    class HeadlessGUI(gui_cls):
        def __init__(self, *args, **kwargs):
            kwargs["show_gui"] = False
            super().__init__(*args, **kwargs)

        def show(self, file=None):
            if self.frame >= frames:
                raise SystemExit(0)
            super().show(file)
            frame_shown(shown)
            if self.frame >= frames:
                self.running = False

        def get_events(self, *e_filter):
            if self.frame >= frames and not getattr(self, "_exit_sent", False):
                e = gui_cls.Event()
                e.type, e.key, e.pos, e.modifier, e.delta = gui_cls.PRESS, gui_cls.EXIT, \
                    (0.5, 0.5), [], (0, 0)
                if not e_filter or gui_cls.EventFilter(*e_filter).match(e):
                    self._exit_sent = True
                    yield e
                    return
            yield from super().get_events(*e_filter)

    ti.GUI = HeadlessGUI
    headless_ggui(ti, frames, shown)
    return shown


def headless_ggui(ti, frames, shown):
    """Under real Taichi: ti.ui's Window, Scene, Camera and Canvas are
    fusebox.taichi's headless GGUI
    stand-in (fusebox/taichi/_ui.py, loaded by path: it needs only NumPy),
    as under fusebox, since GGUI needs Vulkan, which this machine may not
    have; its frames are counted in `shown`."""
    spec = importlib.util.spec_from_file_location("fusebox_headless_ui", UI_STAND_IN)
    ui = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ui)
    os.environ["FUSEBOX_GUI_FRAMES"] = str(frames)
    count_window_frames(ui, shown)
    for name in ("Window", "Scene", "Camera", "Canvas"):
        setattr(ti.ui, name, getattr(ui, name))


def count_window_frames(ui, shown):
    show = ui.Window.show

    def counted(self):
        show(self)
        frame_shown(shown)

    ui.Window.show = counted


def count_frames(ti):
    """Under fusebox: count the frames every GUI shows."""
    shown = {"n": 0}
    show = ti.GUI.show

    def counted(self, *args, **kwargs):
        show(self, *args, **kwargs)
        frame_shown(shown)

    ti.GUI.show = counted
    count_window_frames(ti.ui, shown)
    return shown


def examples_package(path):
    """Under fusebox: `taichi.examples` is the wheel's folder the example
    lies in, so that `from taichi.examples.patterns import ...` loads that
    file in place (and its `import taichi` gets fusebox.taichi)."""
    parts = os.path.abspath(path).split(os.sep)
    for k in range(len(parts) - 1, 0, -1):
        if parts[k] == "examples" and parts[k - 1] == "taichi":
            pkg = types.ModuleType("taichi.examples")
            pkg.__path__ = [os.sep.join(parts[:k + 1])]
            sys.modules["taichi.examples"] = pkg
            return


def use_stand_ins():
    """Under both engines: the matplotlib stand-in (stand_ins/matplotlib)
    first on sys.path, and Python's and NumPy's random streams seeded, so
    that an example that draws its data with `random` (autodiff/regression.py)
    gets the same data under both. Returns the stand-in's list of the
    series the example plots."""
    sys.path.insert(0, STAND_INS)
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        del sys.modules[name]
    import matplotlib
    random.seed(SEED)
    np.random.seed(SEED)
    return matplotlib.SERIES


def frame_shown(shown):
    """One more frame shown (every GUI and GGUI window counts here); the
    benchmark's clock, when one is set (timed_frames), reads it."""
    shown["n"] += 1
    if "on_frame" in shown:
        shown["on_frame"](shown["n"])


def _tree():
    """This process and every process below it (a private fuseboxd and its
    session workers): their pids, from /proc."""
    kids = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue  # gone meanwhile
        kids.setdefault(ppid, []).append(int(d))
    out, todo = [], [os.getpid()]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += kids.get(p, [])
    return out


def _tree_usage(first):
    """(CPU seconds of this process, CPU seconds of the whole tree, the sum
    of the tree's RSS high-water marks in MiB). CPU time is user + system of
    every thread, children reaped included (cutime, cstime); this process's
    own from getrusage, the others' from /proc (clock ticks). The walk of
    /proc costs this process CPU time: at the first reading it comes before
    this process's clock is read, at the last after, so it is never timed."""
    import resource

    def own():
        a = resource.getrusage(resource.RUSAGE_SELF)
        b = resource.getrusage(resource.RUSAGE_CHILDREN)
        return a.ru_utime + a.ru_stime, b.ru_utime + b.ru_stime
    if not first:
        mine, reaped = own()
    pids = _tree()
    if first:
        mine, reaped = own()
    cpu = mine + reaped
    tick = os.sysconf("SC_CLK_TCK")
    hwm = 0
    for pid in pids:
        try:
            if pid != os.getpid():
                with open(f"/proc/{pid}/stat") as f:
                    v = f.read().rsplit(")", 1)[1].split()
                cpu += sum(int(x) for x in v[11:15]) / tick
            with open(f"/proc/{pid}/status") as f:
                hwm += next((int(ln.split()[1]) for ln in f if ln.startswith("VmHWM:")), 0)
        except (OSError, ValueError):
            continue
    return mine, cpu, hwm / 1024.0


def timed_frames(ti, shown, warmup, frames, threads, engine):
    """The benchmark's clock (runner.py bench): after the warm-up frames
    (the first compiles in them) and after `frames` more, a ti.sync() (so
    that queued launches count) and then the wall clock, the process's
    CPU time and the process tree's CPU time; at the end, the tree's peak
    RSS. run_example saves the differences as __bench__."""
    def on_frame(n):
        if n not in (warmup, warmup + frames):
            return
        ti.sync()
        if n == warmup:
            mine, cpu, hwm = _tree_usage(True)
            shown["t0"] = (time.perf_counter(), cpu, mine)
        else:
            t = time.perf_counter()
            mine, cpu, hwm = _tree_usage(False)
            shown["t1"] = (t, cpu, mine)
        if n == warmup + frames:
            shown["rss_mib"] = hwm
            # the compute threads: Taichi's as it took them; fuseboxd's --cpu-threads
            shown["threads"] = int(ti.lang.impl.current_cfg().cpu_max_num_threads) \
                if engine == "taichi" else threads
    shown["on_frame"] = on_frame


def run_example(engine, path, out, frames, bench=None):
    ti = sys.modules["taichi"]
    if engine == "taichi":
        shown = taichi_frame_limit(ti, frames)
    else:
        os.environ["FUSEBOX_GUI_FRAMES"] = str(frames)
        shown = count_frames(ti)
        examples_package(path)
    if bench is not None:
        timed_frames(ti, shown, *bench, engine)
    sys.argv = [path]
    sys.path.insert(0, os.path.dirname(path))
    plots = use_stand_ins()
    # the example becomes __main__ (inspect finds a kernel's source through
    # sys.modules[its __module__]); its globals stay reachable after exit()
    main_mod = types.ModuleType("__main__")
    main_mod.__file__ = path
    sys.modules["__main__"] = main_mod
    g = main_mod.__dict__
    with open(path) as f:
        code = compile(f.read(), path, "exec")
    try:
        exec(code, g)
    except SystemExit as e:  # an example that calls exit() at the end has ended
        if e.code not in (None, 0):
            raise
    ti.sync()  # a launch that failed is the example's failure, not "no field" below
    res = {}
    for k, v in g.items():
        if k.startswith("_") or isinstance(v, type) or not hasattr(v, "to_numpy"):
            continue
        try:
            a = np.asarray(v.to_numpy())
        except Exception:  # not a field after all (a module, a class)
            continue
        if a.dtype != object:
            res[k] = a
    for n, (kind, x, y) in enumerate(plots):
        res[f"{kind}.{n}.x"] = x
        res[f"{kind}.{n}.y"] = y
    res["__frames__"] = np.asarray(shown["n"])
    if bench is not None:
        if "t1" not in shown:
            raise SystemExit(f"{os.path.basename(path)} ended after {shown['n']} frames, before "
                             f"the {bench[0]} warm-up and {bench[1]} timed frames")
        res["__bench__"] = np.asarray([shown["t1"][k] - shown["t0"][k] for k in range(3)]
                                      + [shown["rss_mib"], shown["threads"]], dtype=np.float64)
    np.savez(out, **res)


BENCH_ENGINES = {"taichi": ("taichi", None), "fusebox-sync": ("fusebox", "sync"),
                 "fusebox-async": ("fusebox", "async")}


def main(argv):
    if len(argv) < 4 or argv[0] not in ("program", "example", "bench") or \
            (argv[0] == "bench" and (len(argv) != 7 or argv[1] not in BENCH_ENGINES)):
        raise SystemExit(__doc__)
    kind, engine, path, out = argv[:4]
    if kind == "bench":
        engine, mode = BENCH_ENGINES[engine]
        warmup, frames, threads = (int(x) for x in argv[4:7])
        use_engine(engine, threads, mode)
    else:
        use_engine(engine)
    try:
        if kind == "program":
            run_program(os.path.abspath(path), out)
        elif kind == "bench":
            run_example(engine, os.path.abspath(path), out, warmup + frames,
                        (warmup, frames, threads))
        else:
            run_example(engine, os.path.abspath(path), out, int(argv[4]))
    except SystemExit as e:  # an example that calls exit() at the end has ended
        if e.code not in (None, 0):
            raise
    except BaseException:
        traceback.print_exc()
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
