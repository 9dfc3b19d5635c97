"""A stand-in for matplotlib, for the wheel's examples only (runner.py puts
this folder first on sys.path under both engines; it is never part of the
fusebox package).

The autodiff examples in the taichi wheel (autodiff/regression.py,
simple_derivative.py, diff_sph/diff_sph.py) draw their results with
matplotlib. Rather than install matplotlib into both interpreters (a large
download that CI and the benchmarks' read-only Taichi environment would
need too) and render pictures nobody compares, this stand-in records the
data series the example hands to ``plot`` and ``scatter`` (and the images
to ``imshow``, saved as ``imshow.N.y``); runner.py saves
them (``plot.N.x``, ``plot.N.y``) beside the module-level fields, so that
what the example would draw (a derivative, a fitted curve, a loss history)
is compared between Taichi and fusebox.taichi like any field. Cosmetic
calls (titles, legends, spines) do nothing; anything else raises
AttributeError naming this stand-in, so an example that needs more says so.
"""
import numpy as np

__version__ = "0.0-fusebox-stand-in"

SERIES = []  # (kind, x, y) in the order the example drew them


def use(*args, **kwargs):
    pass


def record(kind, args):
    if len(args) == 1:
        y = np.asarray(args[0], dtype=np.float64)
        x = np.arange(len(y), dtype=np.float64)
    elif len(args) >= 2:
        x = np.asarray(args[0], dtype=np.float64)
        y = np.asarray(args[1], dtype=np.float64)
    else:
        raise TypeError(f"matplotlib stand-in: {kind}() needs data")
    SERIES.append((kind, x, y))
