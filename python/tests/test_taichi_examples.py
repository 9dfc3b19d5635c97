"""Examples shipped in the taichi 1.7 wheel (taichi/examples/), run where
they lie in the wheel's site-packages (never copied into this repository)
through fusebox.taichi, and under Taichi 1.7 itself, in the same test
(python/tests/taichi_compare/, docs/testing.md).

Each example runs as __main__ in a subprocess (taichi_compare/runner.py)
with ``taichi`` in sys.modules replaced by fusebox.taichi; its GUI loop
ends after FRAMES frames ($FUSEBOX_GUI_FRAMES; under Taichi a window-less
GUI that does the same). The test checks that it ran to the end under both
and showed as many frames, that the module-level fields it leaves have the
same names, shapes and dtypes, and, for the deterministic ones (no
ti.random, no Python random), the same values within the tolerance given.
"""
import os
import subprocess
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "taichi_compare"))
import harness  # noqa: E402
from harness import fb_env, run_both, taichi_python  # noqa: E402,F401 (fixtures)

# (path under taichi/examples, frames, how the values are compared):
#   ("close", rtol, atol, share): floats within rtol/atol on all but `share`
#       of the values, integers exactly; share > 0 only for escape-time
#       fractals, where a pixel near the set's boundary may take another
#       iteration (or its smooth colour another logarithm) under one engine;
#   "shapes": random initial states (ti.random, Python's random): names,
#       shapes and dtypes only, and every float finite;
#   "runs": it keeps its fields inside a class or function: that it ran to
#       the end under both, showing as many frames;
#   ("arrays", names, rtol, atol): as "close", and the module-level NumPy
#       arrays named too (what the example computes and only plots).
EXAMPLES = [
    ("simulation/fractal.py", 3, ("close", 1e-5, 0.021, 0.002)),
    ("simulation/waterwave.py", 4, ("close", 1e-4, 1e-5, 0.0)),
    ("algorithm/laplace.py", 0, ("close", 1e-6, 1e-6, 0.0)),
    # conjugate gradients: float32 dot products over 2M cells summed in another order
    ("algorithm/mgpcg.py", 4, ("close", 1e-2, 1e-4, 0.0)),
    ("features/sparse/taichi_dynamic.py", 0, ("close", 0, 0, 0.0)),
    ("features/sparse/tutorial.py", 0, ("close", 0, 0, 0.0)),
    ("features/sparse/explicit_activation.py", 0, ("close", 0, 0, 0.0)),
    ("features/sparse/taichi_sparse.py", 3, ("close", 1e-5, 1e-6, 0.0)),
    ("features/sparse/taichi_bitmasked.py", 3, ("close", 1e-5, 1e-6, 0.0)),
    ("simulation/mpm88.py", 2, "shapes"),
    ("simulation/mpm99.py", 1, "shapes"),
    ("simulation/nbody.py", 2, "shapes"),
    ("simulation/game_of_life.py", 3, "shapes"),
    ("autodiff/minimization.py", 0, "shapes"),
    # forward mode (ti.ad.FwdMode, x.dual) and reverse: the Jacobian both ways
    ("autodiff/jacobian.py", 0, ("arrays", ("jacobian_fwd", "jacobian_rev"), 1e-5, 1e-6)),
    ("simulation/ad_gravity.py", 2, "shapes"),
    ("simulation/mpm128.py", 1, "shapes"),
    ("simulation/mass_spring_game.py", 2, ("close", 1e-4, 1e-5, 0.0)),
    ("simulation/vortex_rings.py", 1, "shapes"),
    ("simulation/odop_solar.py", 2, "runs"),
    ("simulation/physarum.py", 1, "shapes"),
    ("simulation/mandelbrot_zoom.py", 2, ("close", 1e-3, 1e-5, 0.002)),
    ("simulation/initial_value_problem.py", 2, "shapes"),  # driven by the wall clock
    ("simulation/pbf2d.py", 2, "shapes"),
    ("simulation/mpm_lagrangian_forces.py", 2, "shapes"),
    ("algorithm/mciso_advanced.py", 2, "runs"),  # its fields are attributes of an object
]

# example -> the construct fusebox.taichi does not handle yet (deselected
# by the ctest entry with -k "not known-gap")
KNOWN_GAPS = {
}


def examples_dir(taichi_python):
    out = subprocess.run([taichi_python, "-c", "import os, taichi; print(os.path.join("
                          "os.path.dirname(taichi.__file__), 'examples'))"],
                         capture_output=True, text=True, timeout=120, check=True)
    return out.stdout.strip().splitlines()[-1]


def _params():
    out = []
    for rel, frames, how in EXAMPLES:
        name = rel.replace("/", "-")[:-3]
        pid = ("known-gap-" + name) if rel in KNOWN_GAPS else name
        out.append(pytest.param(rel, frames, how, id=pid))
    return out


@pytest.mark.parametrize("rel,frames,how", _params())
def test_example_matches_taichi(rel, frames, how, taichi_python, fb_env):
    path = os.path.join(examples_dir(taichi_python), rel)
    assert os.path.isfile(path), f"{rel} is not in the installed taichi wheel ({path})"
    extra = (",".join(how[1]),) if isinstance(how, tuple) and how[0] == "arrays" else ()
    want, got = run_both("example", path, taichi_python, fb_env, frames, *extra)
    assert int(want.pop("__frames__")) == frames, "under Taichi the GUI loop did not end"
    assert int(got.pop("__frames__")) == frames, \
        f"{rel} under fusebox.taichi showed a different number of frames"
    if how == "runs":
        return
    assert want, f"{rel} left no module-level field to compare"
    if how == "shapes":
        harness.compare_shapes(rel, want, got)
    elif how[0] == "arrays":
        _, names, rtol, atol = how
        assert set(names) <= set(got), f"{rel}: fusebox.taichi left no {set(names) - set(got)}"
        assert np.abs(want[names[0]]).max() > 0, f"{rel}: Taichi's {names[0]} is all zeros"
        harness.compare(rel, want, got, rtol, atol)
    else:
        _, rtol, atol, share = how
        harness.compare(rel, want, got, rtol, atol, share=share)


def test_at_least_ten_examples():
    assert len(EXAMPLES) >= 10
    assert not set(KNOWN_GAPS) - {e[0] for e in EXAMPLES}
