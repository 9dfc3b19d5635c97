"""Taichi programs run under Taichi 1.7 and under fusebox.taichi, compared
field by field (python/tests/taichi_compare/, docs/testing.md).

Each program in taichi_compare/programs/ is a plain Taichi program (it runs
unchanged under the real taichi package) with a run() that returns a dict
of arrays. The test runs it twice, each in a subprocess of its own
(taichi_compare/runner.py): under Taichi 1.7 (ti.init(arch=ti.cpu)) in its
virtual environment, and under fusebox.taichi (put in
sys.modules['taichi']) against a fuseboxd from $FB_BUILD_DIR on a unix
socket; then it compares every array: names, shapes and dtypes equal,
floats within the program's RTOL/ATOL, integers and bools exactly.

Programs listed in KNOWN_GAPS (constructs fusebox.taichi does not take
yet) keep the id prefix "known-gap-"; the ctest entry test_taichi_compare
deselects them with -k "not known-gap", a plain pytest run runs them too.
"""
import os
import sys
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "taichi_compare"))
import harness  # noqa: E402
from harness import fb_env, run_both, taichi_python  # noqa: E402,F401 (fixtures)

# program -> the construct that fusebox.taichi does not handle yet, and how it fails
KNOWN_GAPS: dict = {}


def _params():
    out = []
    for name in harness.programs():
        if name in KNOWN_GAPS:
            out.append(pytest.param(name, id="known-gap-" + name))
        else:
            out.append(pytest.param(name, id=name))
    return out


@pytest.mark.parametrize("name", _params())
def test_program_matches_taichi(name, taichi_python, fb_env):
    s = harness.settings(name)
    want, got = run_both("program", harness.program_path(name), taichi_python, fb_env)
    harness.compare(name, want, got, s["RTOL"], s["ATOL"])


def test_every_program_is_listed_once():
    """At least forty programs; every known gap names a program that exists."""
    names = harness.programs()
    assert len(names) >= 40, names
    assert not set(KNOWN_GAPS) - set(names), set(KNOWN_GAPS) - set(names)


def test_compare_catches_differences():
    """The comparison itself: a different value, dtype, shape or name fails."""
    import numpy as np
    a = {"x": np.arange(4, dtype=np.int32), "f": np.ones(3, np.float32)}
    harness.compare("same", a, dict(a), 1e-5, 1e-6)
    for bad in ({"x": np.array([0, 1, 2, 4], np.int32), "f": a["f"]},
                {"x": a["x"].astype(np.int64), "f": a["f"]},
                {"x": a["x"][:3], "f": a["f"]},
                {"x": a["x"], "f": a["f"] * (1 + 1e-3)},
                {"x": a["x"]}):
        with pytest.raises(AssertionError):
            harness.compare("bad", a, bad, 1e-5, 1e-6)
