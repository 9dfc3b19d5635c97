"""Forward-mode automatic differentiation through a real fuseboxd
(docs/autodiff.md "Forward mode"): dual fields (``s.fields.x.dual``), the
tangent of a kernel (``s.kernels.k.dual(...)``, made on the server) against
the derivative worked out by hand and finite differences, in sync and async
mode; the JSON runner's ``"launch": "k.dual"``; the Taichi front end's
``needs_dual``, ``x.dual``, ``ti.root.lazy_dual()`` and ``ti.ad.FwdMode``;
and the errors, with the session going on after each."""
import json
import subprocess

import numpy as np
import pytest

import fusebox
import fusebox.taichi as ti
from conftest import FUSEBOXD

N = 16

PROG = """
layout {
  dense(i: 16) { place x: f64 grad dual, y: f64 dual, c: f64 }
  place e: f64 dual
  place a: f64 dual
}
kernel square(s: f64) { for i in x { y[i] = sin(x[i]) * s * a[] } }
kernel total() -> f64 {
  e[] = 0.0
  for i in y { e[] += y[i] * y[i] }
  return e[]
}
kernel lose() { for i in x { c[i] = x[i] } }
kernel iterate(n: i32) {
  for i in x {
    var v = x[i]
    var k = 0
    while k < n {
      v = v - 0.25 * sin(v) * a[]
      k += 1
    }
    y[i] = v
  }
}
"""

X0 = 0.1 + 0.05 * np.arange(N)


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_tangent_against_hand_and_finite_differences(fb, mode):
    with fb.session(PROG, mode=mode) as s:
        s.fields.x.from_numpy(X0)
        s.fields.a.from_numpy(np.array(2.0))
        v = np.linspace(-1, 1, N)
        s.fields.x.dual.from_numpy(v)
        s.fields.a.dual.from_numpy(np.array(0.5))
        assert s.fields.x.dual.name == "x.dual" and s.fields.x.dual.shape == (N,)
        assert s.kernels.square.dual(1.5) is None
        # d(sin(x) s a) = cos(x) s a dx + sin(x) s da
        want = np.cos(X0) * 1.5 * 2.0 * v + np.sin(X0) * 1.5 * 0.5
        np.testing.assert_allclose(s.fields.y.dual.to_numpy(), want, rtol=1e-13)
        np.testing.assert_allclose(s.fields.y.to_numpy(), np.sin(X0) * 3.0, rtol=1e-15)
        # a kernel that returns a value: its tangent returns the same value
        e = s.kernels.total.dual()
        assert e == pytest.approx(np.sum((np.sin(X0) * 3.0) ** 2), rel=1e-14)
        de = float(s.fields.e.dual.to_numpy())
        assert de == pytest.approx(np.sum(2 * np.sin(X0) * 3.0 * want), rel=1e-12)

        # a while loop, which the reverse pass refuses: finite differences along (v, 0.5)
        def y_at(eps):
            s.fields.x.from_numpy(X0 + eps * v)
            s.fields.a.from_numpy(np.array(2.0 + eps * 0.5))
            s.kernels.iterate(5)
            return s.fields.y.to_numpy()
        h = 1e-6
        fd = (y_at(h) - y_at(-h)) / (2 * h)
        s.fields.x.from_numpy(X0)
        s.fields.a.from_numpy(np.array(2.0))
        s.kernels.iterate.dual(5)
        np.testing.assert_allclose(s.fields.y.dual.to_numpy(), fd, rtol=1e-7, atol=1e-9)
        np.testing.assert_allclose(s.fields.y.to_numpy(), y_at(0.0), rtol=0, atol=0)


def test_errors_and_the_session_goes_on(fb):
    with fb.session(PROG) as s:
        with pytest.raises(fusebox.Error, match="field 'c' has no dual"):
            s.fields.c.dual
        with pytest.raises(fusebox.ServerError, match="give 'c' a dual"):
            s.kernels.lose.dual()
        # a tangent of a kernel that does not exist, asked for on the wire
        from fusebox._proto import pb
        with pytest.raises(fusebox.ServerError, match="no kernel with id 999"):
            s._c._call("RegisterKernels", pb.RegisterKernelsRequest(session_id=s.id,
                                                                    tangents=[999]))
        s.fields.x.from_numpy(X0)
        s.fields.a.from_numpy(np.array(1.0))
        s.fields.x.dual.from_numpy(np.ones(N))
        s.kernels.square.dual(1.0)
        np.testing.assert_allclose(s.fields.y.dual.to_numpy(), np.cos(X0), rtol=1e-14)


def _run_json(tmp_path, session, *flags):
    from conftest import FUSEBOX_CLI
    p = tmp_path / "s.json"
    p.write_text(json.dumps(session))
    return subprocess.run([FUSEBOX_CLI, "run", str(p), "-q", *flags], capture_output=True,
                          text=True, timeout=300)


@pytest.mark.parametrize("flags", [("--local", "--mode", "sync"), ("--local", "--mode", "async"),
                                   ("--mode", "async")])
def test_json_launch_dual(fuseboxd, tmp_path, flags):
    np.save(tmp_path / "x0.npy", X0)
    np.save(tmp_path / "ones.npy", np.ones(N))
    np.save(tmp_path / "one.npy", np.array(1.0))
    session = {
        "name": "kdual", "source": PROG,
        "setup": [{"write": "x", "from": "x0.npy"}, {"write": "x.dual", "from": "ones.npy"},
                  {"write": "a", "from": "one.npy"}],
        "step": [{"launch": "square.dual", "args": [0.5]}],
        "checks": [{"read": "y.dual", "equals": list(0.5 * np.cos(X0)), "rtol": 1e-12}]}
    r = _run_json(tmp_path, session, *flags)
    assert r.returncode == 0, r.stdout + r.stderr
    bad = {"name": "bad", "source": PROG, "step": [{"launch": "lose.dual"}]}
    r = _run_json(tmp_path, bad, *flags)
    assert r.returncode != 0 and "give 'c' a dual" in r.stderr, r.stderr
    assert "%" not in r.stderr


# ------------------------------------------------------------------ the Taichi front end

@pytest.fixture(scope="module")
def client():
    import os
    if not os.access(FUSEBOXD, os.X_OK):
        pytest.fail(f"no fuseboxd at {FUSEBOXD}: build first")
    c = fusebox.connect(fuseboxd=FUSEBOXD)
    yield c
    c.close()


@pytest.fixture
def fb_taichi(client):
    """ti.init() on the module's fuseboxd; reset after the test."""
    ti.init(server=client)
    yield ti
    ti.reset()


def test_taichi_fwd_mode(fb_taichi):
    ti = fb_taichi
    n = 5
    x = ti.field(ti.f64, shape=n, needs_dual=True)
    p = ti.field(ti.f64, shape=())
    y = ti.field(ti.f64, shape=n)
    ti.root.lazy_dual()  # p and y get duals too

    @ti.kernel
    def f():
        for i in x:
            t = x[i]
            for _ in range(3):
                t = ti.sin(t) * p[None] + x[i]
            y[i] = t

    x.from_numpy(np.linspace(0.1, 0.9, n))
    p[None] = 0.7
    jac = np.zeros((n, n))
    for c in range(n):
        seed = [0.0] * n
        seed[c] = 1.0
        with ti.ad.FwdMode(loss=y, param=x, seed=seed):
            f()
        jac[:, c] = y.dual.to_numpy()
        assert not x.dual.to_numpy().any()  # the seed is taken back
    # y[i] depends on x[i] alone: a diagonal Jacobian, against finite differences
    assert np.count_nonzero(jac - np.diag(np.diag(jac))) == 0
    x0 = x.to_numpy()

    def y_at(xx):
        x.from_numpy(xx)
        f()
        return y.to_numpy()
    h = 1e-6
    fd = (y_at(x0 + h) - y_at(x0 - h)) / (2 * h)
    np.testing.assert_allclose(np.diag(jac), fd, rtol=1e-7)
    x.from_numpy(x0)
    with ti.ad.FwdMode(loss=y, param=p):  # 0-D: the seed defaults to [1.0]
        f()
    fdp = []
    for eps in (h, -h):
        p[None] = 0.7 + eps
        f()
        fdp.append(y.to_numpy())
    np.testing.assert_allclose(y.dual.to_numpy(), (fdp[0] - fdp[1]) / (2 * h), rtol=1e-7)
    # entering clears every dual unless clear_gradients=False (y is written
    # by nothing inside, so its dual shows which)
    y.dual.fill(4.0)
    with ti.ad.FwdMode(loss=y, param=p, clear_gradients=False):
        pass
    assert (y.dual.to_numpy() == 4.0).all()
    with ti.ad.FwdMode(loss=y, param=p):
        pass
    assert not y.dual.to_numpy().any()
    # errors
    with pytest.raises(Exception, match="seed= is needed"):
        with ti.ad.FwdMode(loss=y, param=x):
            f()
    with pytest.raises(Exception, match="the seed has 2 numbers"):
        with ti.ad.FwdMode(loss=y, param=x, seed=[1.0, 0.0]):
            f()
    with pytest.raises(Exception, match="does not nest"):
        with ti.ad.FwdMode(loss=y, param=p):
            with ti.ad.FwdMode(loss=y, param=p):
                pass


def test_taichi_fwd_mode_errors(fb_taichi):
    ti = fb_taichi
    x = ti.field(ti.f32, shape=4, needs_dual=True)
    w = ti.field(ti.f32, shape=4)
    n = ti.field(ti.i32, shape=4)
    with pytest.raises(Exception, match="only float fields"):
        ti.field(ti.i32, shape=4, needs_dual=True)

    @ti.kernel
    def lose():
        for i in x:
            w[i] = x[i] * 2.0  # w has no dual: refused at this line

    with pytest.raises(Exception, match="has no dual: declare it with needs_dual=True"):
        w.dual
    with pytest.raises(Exception, match=r"test_fwd_mode.py:\d+: error: .*give 'w' a dual "
                                        r"\(needs_dual=True\)"):
        with ti.ad.FwdMode(loss=x, param=x, seed=[1.0, 0, 0, 0]):
            lose()
    n.fill(1)  # the session goes on
    assert n.to_numpy().sum() == 4
