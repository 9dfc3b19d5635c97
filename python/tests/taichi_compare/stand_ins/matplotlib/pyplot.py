"""matplotlib.pyplot, stood in for (see __init__.py): plot, scatter and
imshow record their data; the rest of what the wheel's examples call does
nothing."""
from matplotlib import record

_COSMETIC = ("title", "subplot", "xlabel", "ylabel", "legend", "grid", "show", "figure", "close",
             "tight_layout", "savefig", "xlim", "ylim", "set_title", "set_xlabel",
             "set_ylabel", "set_xlim", "set_ylim", "set_position", "set_color")


class _Quiet:
    """Accepts the cosmetic calls and does nothing."""

    def __getattr__(self, name):
        if name in _COSMETIC:
            return lambda *a, **kw: None
        raise AttributeError(f"the matplotlib stand-in (python/tests/taichi_compare/"
                             f"stand_ins) has no {type(self).__name__}.{name}")


class _Spines(dict):
    def __missing__(self, key):
        return _Quiet()


class Axes(_Quiet):
    def __init__(self):
        self.spines = _Spines()

    def plot(self, *args, **kwargs):
        record("plot", args)

    def scatter(self, *args, **kwargs):
        record("scatter", args)


_AX = Axes()


def gca():
    return _AX


def plot(*args, **kwargs):
    record("plot", args)


def scatter(*args, **kwargs):
    record("scatter", args)


def imshow(image, **kwargs):
    """An image (autodiff/jacobian.py shows its Jacobians): saved as
    imshow.N.y, its rows numbered in imshow.N.x."""
    record("imshow", (image,))


def __getattr__(name):
    if name in _COSMETIC:
        return lambda *a, **kw: None
    raise AttributeError(f"the matplotlib stand-in (python/tests/taichi_compare/stand_ins) "
                         f"has no pyplot.{name}")
