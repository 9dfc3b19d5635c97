"""Automatic differentiation through a real fuseboxd (docs/autodiff.md):
gradient fields (``s.fields.x.grad``), adjoints launched by hand
(``s.kernels.k.grad(...)``), the tape (``with s.tape(loss)``) in sync and
async mode against the derivative worked out by hand and against finite
differences, and the errors: a loss without a gradient, a field without
one, nested tapes, a kernel whose adjoint is refused (blamed on its
launch), a session closed inside a tape; the session goes on after each."""
import numpy as np
import pytest

import fusebox

N = 16

PROG = """
layout {
  dense(i: 16) { place x: f64 grad, y: f64 grad, c: f64 }
  place loss: f64 grad
  place plain: f64
}
kernel zero() { loss[] = 0.0 }
kernel square(s: f64) { for i in x { y[i] = sin(x[i]) * s } }
kernel total() { for i in y { loss[] += y[i] * y[i] } }
kernel twice() { for i in x { x[i] = x[i] * 2.0 } }
kernel lose() { for i in x { c[i] = x[i] } }
"""

X0 = 0.1 + 0.05 * np.arange(N)


def taped(s, scale):
    s.kernels.zero()
    with s.tape(s.fields.loss):
        s.kernels.square(scale)
        s.kernels.total()


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_tape_gradient(fb, mode):
    with fb.session(PROG, mode=mode) as s:
        s.fields.x.from_numpy(X0)
        s.fields.x.grad.from_numpy(np.full(N, 100.0))  # stale: the tape clears it
        taped(s, 1.5)
        g = s.fields.x.grad.to_numpy()
        np.testing.assert_allclose(g, 2 * 1.5 ** 2 * np.sin(X0) * np.cos(X0), rtol=1e-12)
        assert s.fields.loss.grad.to_numpy() == 1.0
        assert s.fields.x.grad.name == "x.grad" and s.fields.x.grad.shape == (N,)
        # again: the same gradient, not twice it
        taped(s, 1.5)
        np.testing.assert_array_equal(s.fields.x.grad.to_numpy(), g)

        # central finite differences of the loss the server computes
        def loss_at(x):
            s.fields.x.from_numpy(x)
            s.kernels.zero()
            s.kernels.square(1.5)
            s.kernels.total()
            return float(s.fields.loss.to_numpy())
        for i in (0, 7, 15):
            h = 1e-6
            xp, xm = X0.copy(), X0.copy()
            xp[i] += h
            xm[i] -= h
            fd = (loss_at(xp) - loss_at(xm)) / (2 * h)
            assert abs(fd - g[i]) <= 1e-6 * (1 + abs(g[i]))


def test_sync_and_async_gradients_equal(fb):
    out = {}
    for mode in ("sync", "async"):
        with fb.session(PROG, mode=mode) as s:
            s.fields.x.from_numpy(X0)
            for k in range(5):
                taped(s, 1.0 + 0.5 * k)
            out[mode] = s.fields.x.grad.to_numpy()
            if mode == "async":
                c = s.counters()
                assert c.dead_stores_removed > 0  # the forward sums nobody reads
    np.testing.assert_array_equal(out["sync"], out["async"])


def test_kernel_grad_by_hand(fb):
    with fb.session(PROG) as s:
        s.fields.x.from_numpy(X0)
        s.fields.y.grad.fill(1.0)
        s.fields.x.grad.fill(0.0)
        s.kernels.square.grad(0.5)
        g = s.fields.x.grad.to_numpy()
        np.testing.assert_allclose(g, 0.5 * np.cos(X0), rtol=1e-14)
        # y is written by a store: its adjoint uses y.grad up, so a second
        # launch (arguments by name) adds nothing
        np.testing.assert_array_equal(s.fields.y.grad.to_numpy(), 0.0)
        s.kernels.square.grad(s=0.5)
        np.testing.assert_array_equal(s.fields.x.grad.to_numpy(), g)


def test_errors_and_the_session_goes_on(fb):
    with fb.session(PROG, mode="async") as s:
        with pytest.raises(fusebox.Error, match="field 'c' has no gradient"):
            s.fields.c.grad
        with pytest.raises(fusebox.Error, match="the loss 'plain' has no gradient"):
            s.tape(s.fields.plain)
        with pytest.raises(fusebox.Error, match="0-D"):
            s.tape("x")
        with pytest.raises(fusebox.Error, match="no field named 'nope'"):
            s.tape("nope")
        with pytest.raises(fusebox.Error, match="already recording"):
            with s.tape("loss"):
                with s.tape("loss"):
                    pass
        s.sync()  # the outer tape ended cleanly
        # a refused adjoint: the server names the kernel and what to change
        with pytest.raises(fusebox.ServerError, match="kernel 'twice'.*field 'x'.*split the kernel"):
            s.kernels.twice.grad()
        with pytest.raises(fusebox.ServerError, match="give 'c' a gradient"):
            s.kernels.lose.grad()
        # inside a tape: reported at the next sync, blamed on the launch
        s.kernels.zero()
        with s.tape(s.fields.loss):
            s.kernels.square(1.0)
            s.kernels.twice()
        with pytest.raises(fusebox.LaunchError) as e:
            s.sync()
        [f] = e.value.errors
        assert f.kernel == "twice" and f.seq > 0
        assert "tape over 'loss'" in f.message and "%" not in f.message
        # the session goes on
        s.fields.x.from_numpy(X0)
        taped(s, 2.0)
        np.testing.assert_allclose(s.fields.x.grad.to_numpy(), 8 * np.sin(X0) * np.cos(X0),
                                   rtol=1e-12)


def test_close_inside_a_tape(fb):
    s = fb.session(PROG)
    t = s.tape("loss")
    t.__enter__()
    s.kernels.square(1.0)
    with pytest.raises(fusebox.Error, match="closed while a tape over 'loss' was recording"):
        s.close()
    assert s.closed


# ------------------------------------------------------------------ the paper's case

def _bench(case):
    import json
    import os
    from conftest import ROOT
    with open(os.path.join(ROOT, "bench", "large", case + ".json")) as f:
        params = json.load(f)["params"]
    with open(os.path.join(ROOT, "bench", "large", "autodiff.fbk")) as f:
        return f.read(), params


def test_large_autodiff_generated_matches_hand_written(fb):
    """bench/large/autodiff: the generated adjoint of the energy against the
    one written by hand, and both against central finite differences."""
    src, params = _bench("autodiff")
    with fb.session(src, params=params) as s:
        k = s.kernels
        k.init()
        k.compute_rest_T()
        k.stretch()
        k.reset_energy()
        with s.tape("total_energy"):
            k.compute_total_energy()
        gen = s.fields.x.grad.to_numpy()
        energy = float(s.fields.total_energy.to_numpy())
        k.clear_gradients_hand()
        k.tape_begin_hand()
        k.compute_total_energy()
        k.compute_total_energy_grad_hand()
        hand = s.fields.x.grad.to_numpy()
        assert float(s.fields.total_energy.to_numpy()) == energy
        scale = np.abs(hand).max()
        assert scale > 0
        err = np.abs(gen - hand).max() / scale
        print(f"generated vs hand-written: largest difference {err:.2e} of the largest component")
        assert err < 1e-4
        # central finite differences of the same energy in f64 (NumPy)
        x0 = s.fields.x.to_numpy().astype(np.float64)
        B = np.linalg.inv(s.fields.restT.to_numpy().astype(np.float64))
        vs = s.fields.vertices.to_numpy()

        def energy_of(x):
            ab, ac = x[vs[:, 1]] - x[vs[:, 0]], x[vs[:, 2]] - x[vs[:, 0]]
            F = np.stack([ab, ac], axis=2) @ B  # edges as columns
            J = np.linalg.det(F)
            i1 = np.einsum("eij,eij->e", F, F)
            return 1e-3 * np.sum(0.5 * (i1 - 2.0) - np.log(J) + 0.5 * np.log(J) ** 2)

        assert abs(energy_of(x0) - energy) <= 1e-5 * energy
        worst = 0.0
        for p, c in zip(*np.unravel_index(np.argsort(-np.abs(gen), axis=None)[:20], gen.shape)):
            h = 1e-6
            xp, xm = x0.copy(), x0.copy()
            xp[p, c] += h
            xm[p, c] -= h
            fd = (energy_of(xp) - energy_of(xm)) / (2 * h)
            worst = max(worst, abs(fd - gen[p, c]) / abs(fd))
        print(f"largest relative error against finite differences: {worst:.2e}")
        assert worst < 1e-3


# ------------------------------------------------------------------ JSON sessions

def _run_json(tmp_path, session, *flags):
    import json
    import subprocess
    from conftest import FUSEBOX_CLI
    p = tmp_path / "s.json"
    p.write_text(json.dumps(session))
    return subprocess.run([FUSEBOX_CLI, "run", str(p), "-q", *flags], capture_output=True,
                          text=True, timeout=300)


@pytest.mark.parametrize("flags", [("--local", "--mode", "sync"), ("--local", "--mode", "async"),
                                   ("--mode", "async")])
def test_json_tape_against_finite_differences(fuseboxd, tmp_path, flags):
    np.save(tmp_path / "x0.npy", X0)
    np.save(tmp_path / "ones.npy", np.ones(N))

    def loss(x):
        return np.sum((1.5 * np.sin(x)) ** 2)
    h = 1e-6
    fd = [(loss(X0 + h * e) - loss(X0 - h * e)) / (2 * h) for e in np.eye(N)]
    session = {
        "name": "tape", "source": PROG,
        "setup": [{"write": "x", "from": "x0.npy"}],
        "step": [{"launch": "zero"},
                 {"tape": "loss", "do": [{"launch": "square", "args": [1.5]},
                                         {"launch": "total"}]}],
        "checks": [{"read": "x.grad", "equals": fd, "rtol": 1e-7},
                   {"read": "loss.grad", "equals": 1.0}]}
    r = _run_json(tmp_path, session, *flags)
    assert r.returncode == 0, r.stdout + r.stderr
    # k.grad launched by name
    session = {
        "name": "kgrad", "source": PROG,
        "setup": [{"write": "x", "from": "x0.npy"}, {"write": "y.grad", "from": "ones.npy"}],
        "step": [{"launch": "square.grad", "args": [0.5]}],
        "checks": [{"read": "x.grad", "equals": list(0.5 * np.cos(X0)), "rtol": 1e-12}]}
    r = _run_json(tmp_path, session, *flags)
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.parametrize("flags", [("--local",), ()])
def test_json_tape_errors(fuseboxd, tmp_path, flags):
    bad = {"name": "bad", "source": PROG,
           "step": [{"tape": "loss", "do": [{"launch": "square", "args": [1.0]},
                                            {"launch": "twice"}]}]}
    r = _run_json(tmp_path, bad, *flags)
    assert r.returncode != 0
    assert "$.step[0].do[1]" in r.stderr and "kernel 'twice'" in r.stderr, r.stderr
    assert "%" not in r.stderr
    for what, step, want in [
            ("no gradient", [{"tape": "plain", "do": []}], "'plain' has no gradient"),
            ("no field", [{"tape": "nope", "do": []}], "no field named 'nope'"),
            ("nested", [{"tape": "loss", "do": [{"tape": "loss", "do": []}]}],
             "already recording"),
            ("no adjoint", [{"launch": "lose.grad"}], "give 'c' a gradient")]:
        r = _run_json(tmp_path, {"name": what, "source": PROG, "step": step}, *flags)
        assert r.returncode != 0 and want in r.stderr, (what, r.stderr)
    r = _run_json(tmp_path, {"name": "keys", "source": PROG,
                             "step": [{"tape": "loss", "do": [], "every": 2}]}, *flags)
    assert r.returncode != 0 and "every" in r.stderr, r.stderr
