"""Custom gradients on every client path (docs/autodiff.md, "Custom
gradients"): `kernel k(...) grad k_adj` through the Python client and a
real fuseboxd (``s.kernels.k.grad`` and the tape launch k_adj), the JSON
runner in process and through fuseboxd, the protocol's
``RegisterKernelsRequest.custom_adjoints`` with its refusals, and the
Taichi front end's ``@ti.ad.grad_replaced`` / ``@ti.ad.grad_for``. The
custom adjoints differ on purpose from the generated ones (a straight-
through estimator through round(), whose generated gradient is 0; an
in-place square, which the pass refuses), so a generated adjoint running
instead fails the tests."""
import numpy as np
import pytest

import fusebox

N = 16

PROG = """
layout {
  field x: f64 grad (i: 16)
  field w: f64 (i: 16)
  place loss: f64 grad
}
kernel zero() { loss[] = 0.0 }
kernel snap() grad snap_ste { for i in x { loss[] += round(x[i]) * w[i] } }
kernel snap_ste() { for i in x { x.grad[i] += loss.grad[] * w[i] } }
kernel sq() grad sq_adj { for i in x { x[i] = x[i] * x[i] } }
kernel sq_adj() { for i in x { x.grad[i] = x.grad[i] * 2.0 * sqrt(x[i]) } }
kernel total() { for i in x { loss[] += x[i] * w[i] } }
kernel scale(a: f64) grad scale_adj { for i in x { x[i] = x[i] * a } }
kernel scale_adj(a: f64) { for i in x { x.grad[i] = x.grad[i] * a } }
"""

X0 = 0.3 + 0.17 * np.arange(N)
W = 1.0 + 0.25 * (np.arange(N) % 5)


def loss_of(s, x, *kernels):
    s.fields.x.from_numpy(x)
    s.kernels.zero()
    for k, args in kernels:
        getattr(s.kernels, k)(*args)
    return float(s.fields.loss.to_numpy())


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_tape_uses_custom_adjoints(fb, mode):
    with fb.session(PROG, mode=mode) as s:
        assert s.program.kernels["snap"].grad == "snap_ste"
        assert s.program.kernels["total"].grad is None
        s.fields.w.from_numpy(W)
        # straight-through: x.grad = w (the generated adjoint gives 0)
        s.fields.x.from_numpy(X0)
        s.kernels.zero()
        with s.tape(s.fields.loss):
            s.kernels.snap()
        np.testing.assert_array_equal(s.fields.x.grad.to_numpy(), W)
        assert float(s.fields.loss.to_numpy()) == pytest.approx(np.sum(np.round(X0) * W))
        # a kernel the pass refuses (x read and overwritten), scaled, then
        # summed: d/dx0 of sum((a x0)^2 w) = 2 a^2 x0 w, against finite differences
        s.fields.x.from_numpy(X0)
        s.kernels.zero()
        with s.tape(s.fields.loss):
            s.kernels.scale(1.5)
            s.kernels.sq()
            s.kernels.total()
        g = s.fields.x.grad.to_numpy()
        np.testing.assert_allclose(g, 2 * 1.5 ** 2 * X0 * W, rtol=1e-12)
        h = 1e-6
        for i in (0, 5, 15):
            e = np.eye(N)[i] * h
            run = [("scale", (1.5,)), ("sq", ()), ("total", ())]
            fd = (loss_of(s, X0 + e, *run) - loss_of(s, X0 - e, *run)) / (2 * h)
            assert abs(fd - g[i]) <= 1e-6 * abs(fd)
        # k.grad launches the custom adjoint by hand too
        s.fields.x.from_numpy(X0)
        s.fields.x.grad.from_numpy(np.ones(N))
        s.kernels.scale.grad(3.0)
        np.testing.assert_array_equal(s.fields.x.grad.to_numpy(), np.full(N, 3.0))


def test_protocol_custom_adjoints_and_refusals(fb):
    from fusebox._proto import pb
    with fb.session(PROG) as s:
        ids = {k: s._kernel_id(s.program.kernels[k], ()) for k in
               ("total", "zero", "snap", "snap_ste", "scale")}
        call = s._c._call

        def bind(k, a):
            return call("RegisterKernels", pb.RegisterKernelsRequest(
                session_id=s.id, custom_adjoints=[pb.CustomAdjoint(kernel=k, adjoint=a)]))
        for k, a, want in [
                (ids["total"], ids["total"], "'total' cannot be its own adjoint"),
                (ids["total"], ids["scale"], "'scale' cannot be the adjoint of 'total': 'total' "
                                             "takes () and 'scale' takes (f64)"),
                (ids["total"], ids["snap"], "has an adjoint of its own ('snap_ste')"),
                (ids["snap_ste"], ids["zero"], "'snap_ste' cannot have the adjoint 'zero': it is "
                                               "itself a custom adjoint"),
                (ids["total"], 100000, "no kernel with id 100000"),
                (-5, ids["zero"], "no kernel with id")]:
            with pytest.raises(fusebox.ServerError) as e:
                bind(k, a)
            assert want in str(e.value), str(e.value)
        # a kernel of the request bound by position (-1 - i), in one call
        r = call("RegisterKernels", pb.RegisterKernelsRequest(
            session_id=s.id, source=s._src,
            instances=[pb.KernelInstance(kernel="total"), pb.KernelInstance(kernel="zero")],
            custom_adjoints=[pb.CustomAdjoint(kernel=-1, adjoint=-2)]))
        t2, z2 = r.kernel_ids
        got = call("RegisterKernels", pb.RegisterKernelsRequest(session_id=s.id,
                                                                adjoints=[t2])).kernel_ids[0]
        assert got == z2
        # the session goes on
        s.kernels.zero()
        s.sync()


def test_custom_adjoint_in_a_request_that_fails_binds_nothing(fb):
    from fusebox._proto import pb
    with fb.session(PROG) as s:
        t = s._kernel_id(s.program.kernels["total"], ())
        z = s._kernel_id(s.program.kernels["zero"], ())
        call = s._c._call
        with pytest.raises(fusebox.ServerError):
            call("RegisterKernels", pb.RegisterKernelsRequest(
                session_id=s.id, custom_adjoints=[pb.CustomAdjoint(kernel=t, adjoint=z),
                                                  pb.CustomAdjoint(kernel=t, adjoint=t)]))
        # total's adjoint is still generated: d loss / d x = w
        s.fields.w.from_numpy(W)
        s.fields.x.from_numpy(X0)
        with s.tape(s.fields.loss):
            s.kernels.total()
        np.testing.assert_array_equal(s.fields.x.grad.to_numpy(), W)


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
                                   ("--mode", "async"), ("--mode", "sync")])
def test_json_custom_adjoints(fuseboxd, tmp_path, flags):
    np.save(tmp_path / "x0.npy", X0)
    np.save(tmp_path / "w.npy", W)
    np.save(tmp_path / "ones.npy", np.ones(N))
    session = {
        "name": "custom", "source": PROG,
        "setup": [{"write": "x", "from": "x0.npy"}, {"write": "w", "from": "w.npy"}],
        "step": [{"launch": "zero"},
                 {"tape": "loss", "do": [{"launch": "scale", "args": [1.5]},
                                         {"launch": "sq"}, {"launch": "snap"}]}],
        "checks": [{"read": "x.grad", "equals": list(2 * 1.5 ** 2 * X0 * W), "rtol": 1e-12}]}
    r = _run_json(tmp_path, session, *flags)
    assert r.returncode == 0, r.stdout + r.stderr
    session = {
        "name": "kgrad", "source": PROG,
        "setup": [{"write": "x.grad", "from": "ones.npy"}],
        "step": [{"launch": "scale.grad", "args": [0.5]}],
        "checks": [{"read": "x.grad", "equals": [0.5] * N}]}
    r = _run_json(tmp_path, session, *flags)
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.parametrize("flags", [("--local",), ()])
def test_json_custom_adjoint_errors(fuseboxd, tmp_path, flags):
    bad = PROG + "kernel k2() grad nope { for i in x { loss[] += x[i] } }\n"
    r = _run_json(tmp_path, {"name": "bad", "source": bad, "step": [{"launch": "k2"}]}, *flags)
    assert r.returncode != 0
    assert "kernel 'k2' names 'nope' as its adjoint, but the program has no kernel 'nope'" \
        in r.stderr, r.stderr
