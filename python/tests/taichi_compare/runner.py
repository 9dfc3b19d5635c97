"""Runs one Taichi program under an engine and saves what it returns.

    python runner.py program ENGINE PROGRAM.py OUT.npz
    python runner.py example ENGINE EXAMPLE.py OUT.npz FRAMES [ARRAYS]

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
``show`` stops ``running`` after FRAMES frames, with no window). The
module-level fields it leaves (anything with ``to_numpy``) are saved in
OUT.npz, with ``__frames__``, the frames shown; ARRAYS (comma-separated)
names module-level NumPy arrays to save too (``autodiff/jacobian.py``'s
Jacobians). An example that plots with matplotlib where it is not
installed gets a stand-in whose every function does nothing (the plots are
not compared; the values they show are).

Exit status 0 when the program ran to the end; 1 with its traceback on
stderr otherwise.
"""
import importlib.util
import os
import sys
import traceback
import types

import numpy as np


def use_engine(engine):
    if engine == "fusebox":
        import fusebox.taichi as ti
        sys.modules["taichi"] = ti
        for sub in ("math", "tools", "types", "ad", "ui", "lang"):
            mod = getattr(ti, sub, None)
            if mod is not None:
                sys.modules["taichi." + sub] = mod
        return ti
    if engine == "taichi":
        import taichi as ti
        init = ti.init

        def init_on_cpu(*args, **kwargs):  # the comparison is with Taichi's CPU backend
            kwargs["arch"] = ti.cpu
            return init(*args[1:], **kwargs)

        ti.init = init_on_cpu
        return ti
    raise SystemExit(f"runner.py: engine must be taichi or fusebox, not {engine!r}")


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
            shown["n"] += 1
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
    return shown


def count_frames(ti):
    """Under fusebox: count the frames every GUI shows."""
    shown = {"n": 0}
    show = ti.GUI.show

    def counted(self, *args, **kwargs):
        show(self, *args, **kwargs)
        shown["n"] += 1

    ti.GUI.show = counted
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


def matplotlib_stand_in():
    """matplotlib and matplotlib.pyplot whose every function does nothing,
    where matplotlib is not installed (neither the tests' interpreter nor
    Taichi's environment has it)."""
    try:
        import matplotlib  # noqa: F401
        return
    except ImportError:
        pass

    class _Nothing(types.ModuleType):
        def __getattr__(self, name):
            if name.startswith("__"):
                raise AttributeError(name)
            return lambda *a, **k: None

    mpl = _Nothing("matplotlib")
    plt = _Nothing("matplotlib.pyplot")
    mpl.pyplot = plt
    mpl.__path__ = []
    sys.modules["matplotlib"] = mpl
    sys.modules["matplotlib.pyplot"] = plt


def run_example(engine, path, out, frames, arrays=""):
    ti = sys.modules["taichi"]
    matplotlib_stand_in()
    if engine == "taichi":
        shown = taichi_frame_limit(ti, frames)
    else:
        os.environ["FUSEBOX_GUI_FRAMES"] = str(frames)
        shown = count_frames(ti)
        examples_package(path)
    sys.argv = [path]
    sys.path.insert(0, os.path.dirname(path))
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
    for k in filter(None, arrays.split(",")):
        if not isinstance(g.get(k), np.ndarray):
            raise SystemExit(f"runner.py: the example left no NumPy array named {k!r}")
        res[k] = np.asarray(g[k])
    res["__frames__"] = np.asarray(shown["n"])
    np.savez(out, **res)


def main(argv):
    if len(argv) < 4 or argv[0] not in ("program", "example"):
        raise SystemExit(__doc__)
    kind, engine, path, out = argv[:4]
    use_engine(engine)
    try:
        if kind == "program":
            run_program(os.path.abspath(path), out)
        else:
            run_example(engine, os.path.abspath(path), out, int(argv[4]),
                        argv[5] if len(argv) > 5 else "")
    except SystemExit as e:  # an example that calls exit() at the end has ended
        if e.code not in (None, 0):
            raise
    except BaseException:
        traceback.print_exc()
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
