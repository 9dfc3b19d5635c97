"""fusebox.taichi: Taichi-style programs (kernels translated to .fbk on the
client) run on a real fuseboxd; each result is checked against NumPy
computing the same thing. Error tests: unsupported constructs name this
file, the line and the construct; server-side errors come back at the
Python line; the session goes on after an error."""
import os
import re
import warnings

import numpy as np
import pytest

import fusebox
import fusebox.taichi as ti
from conftest import FUSEBOXD

HERE = os.path.abspath(__file__)


@pytest.fixture(scope="module")
def client():
    if not os.access(FUSEBOXD, os.X_OK):
        pytest.fail(f"no fuseboxd at {FUSEBOXD}: build first")
    c = fusebox.connect(fuseboxd=FUSEBOXD)
    d = c._daemon
    yield c
    c.close()
    assert d.proc.returncode == 0, f"fuseboxd exited {d.proc.returncode}"


@pytest.fixture
def tinit(client):
    """ti.init(...) on the module's fuseboxd; reset after the test."""
    def init(**kw):
        ti.init(server=client, **kw)
    init()
    yield init
    ti.reset()


def line_of(text):
    """The line of this file that contains text (once)."""
    with open(HERE) as f:
        hits = [i + 1 for i, ln in enumerate(f) if text in ln and "line_of(" not in ln]
    assert len(hits) == 1, (text, hits)
    return hits[0]


# ---------------------------------------------------------------- programs

def test_scalar_field_struct_for_and_scalar_arg(tinit):
    x = ti.field(ti.f32, shape=(8, 6))

    @ti.kernel
    def fill(k: ti.f32, off: ti.i32):
        for i, j in x:
            x[i, j] = k * i + j + off

    fill(0.5, 3)
    i, j = np.meshgrid(np.arange(8), np.arange(6), indexing="ij")
    np.testing.assert_allclose(x.to_numpy(), 0.5 * i + j + 3)
    assert x.shape == (8, 6) and x.dtype is ti.f32


def test_ndrange_with_offsets(tinit):
    a = ti.field(ti.i32, shape=(10, 12))

    @ti.kernel
    def paint():
        for i, j in ti.ndrange((2, 7), (3, 11)):
            a[i, j] = i * 100 + j

    paint()
    want = np.zeros((10, 12), np.int32)
    for i in range(2, 7):
        for j in range(3, 11):
            want[i, j] = i * 100 + j
    np.testing.assert_array_equal(a.to_numpy(), want)


def test_ndrange_runtime_bounds_and_grouped(tinit):
    a = ti.field(ti.i32, shape=(6, 7))

    @ti.kernel
    def paint(n: ti.i32):
        for I in ti.grouped(ti.ndrange((1, n), 7)):
            a[I] = I[0] * 10 + I[1]

    paint(4)
    want = np.zeros((6, 7), np.int32)
    for i in range(1, 4):
        want[i, :] = i * 10 + np.arange(7)
    np.testing.assert_array_equal(a.to_numpy(), want)


def test_vector_field_methods(tinit):
    n = 16
    v = ti.Vector.field(3, ti.f32, shape=n)
    out = ti.field(ti.f32, shape=(n, 3))
    rng = np.random.default_rng(1)
    data = rng.standard_normal((n, 3)).astype(np.float32)

    @ti.kernel
    def measure():
        for i in v:
            u = v[i]
            out[i, 0] = u.norm()
            out[i, 1] = u.dot(ti.Vector([1.0, 2.0, 3.0]))
            out[i, 2] = u.normalized().norm_sqr() + u.cross(ti.Vector([0.0, 0.0, 1.0])).x

    v.from_numpy(data)
    measure()
    o = out.to_numpy()
    np.testing.assert_allclose(o[:, 0], np.linalg.norm(data, axis=1), rtol=1e-5)
    np.testing.assert_allclose(o[:, 1], data @ np.array([1, 2, 3.0]), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(o[:, 2], 1 + np.cross(data, [0, 0, 1.0])[:, 0], rtol=1e-5,
                               atol=1e-5)


def test_matrix_field_ops(tinit):
    n = 8
    A = ti.Matrix.field(3, 3, ti.f64, shape=n)
    B = ti.Matrix.field(3, 3, ti.f64, shape=n)
    det = ti.field(ti.f64, shape=n)
    rng = np.random.default_rng(2)
    a = rng.standard_normal((n, 3, 3)) + 3 * np.eye(3)

    @ti.kernel
    def go():
        for i in A:
            M = A[i]
            B[i] = M @ M.transpose() + M.inverse() - ti.Matrix.identity(ti.f64, 3)
            det[i] = M.determinant() + M.trace()

    A.from_numpy(a)
    go()
    want = a @ a.transpose(0, 2, 1) + np.linalg.inv(a) - np.eye(3)
    np.testing.assert_allclose(B.to_numpy(), want, rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(det.to_numpy(), np.linalg.det(a) + np.trace(a, axis1=1, axis2=2),
                               rtol=1e-9)


def test_reduction_atomic_and_return(tinit):
    x = ti.field(ti.f32, shape=1000)
    total = ti.field(ti.f32, shape=())

    @ti.kernel
    def reduce() -> ti.f32:
        total[None] = 0
        for i in x:
            ti.atomic_add(total[None], x[i])
        return total[None]

    @ti.kernel
    def count_positive() -> ti.i32:
        c = 0
        n = 0
        ti.loop_config(serialize=True)
        for k in range(1000):
            n += x[k] > 0
        return n + c

    data = np.linspace(-1, 2, 1000).astype(np.float32)
    x.from_numpy(data)
    assert reduce() == pytest.approx(float(data.sum()), rel=1e-4)
    assert total[None] == pytest.approx(float(data.sum()), rel=1e-4)
    assert count_positive() == int((data > 0).sum())


def test_funcs_nested_and_field_argument(tinit):
    a = ti.field(ti.f32, shape=32)
    b = ti.field(ti.f32, shape=32)

    @ti.func
    def sq(t):
        return t * t

    @ti.func
    def smooth(f: ti.template(), i):
        left = f[max(i - 1, 0)]
        right = f[min(i + 1, 31)]
        return (left + f[i] + right) / 3.0

    @ti.func
    def poly(t: ti.f32) -> ti.f32:
        r = 0.0
        if t > 10:
            r = sq(t) - 1.0
        else:
            r = sq(t) + 1.0
        return r

    @ti.kernel
    def go():
        for i in a:
            b[i] = smooth(a, i) + poly(a[i])

    data = np.arange(32, dtype=np.float32) * 0.5
    a.from_numpy(data)
    go()
    p = np.pad(data, 1, mode="edge")
    want = (p[:-2] + p[1:-1] + p[2:]) / 3 + np.where(data > 10, data**2 - 1, data**2 + 1)
    np.testing.assert_allclose(b.to_numpy(), want, rtol=1e-5)


def test_template_specialization_per_value(tinit, client):
    x = ti.field(ti.i32, shape=16)

    @ti.kernel
    def shift(k: ti.template(), scale: ti.template()):
        for i in x:
            if ti.static(k > 0):
                x[i] = i * scale + k
            else:
                x[i] = -i

    shift(3, 2)
    np.testing.assert_array_equal(x.to_numpy(), np.arange(16) * 2 + 3)
    shift(0, 2)
    np.testing.assert_array_equal(x.to_numpy(), -np.arange(16))
    shift(3, 2)
    np.testing.assert_array_equal(x.to_numpy(), np.arange(16) * 2 + 3)
    assert len(shift._cache) == 2  # one .fbk kernel per value, reused


def test_template_fields_one_kernel_two_bindings(tinit):
    a = ti.field(ti.f32, shape=8)
    b = ti.field(ti.f32, shape=8)
    c = ti.field(ti.f32, shape=8)

    @ti.kernel
    def axpy(src: ti.template(), dst: ti.template(), alpha: ti.f32):
        for i in src:
            dst[i] = alpha * src[i] + dst.shape[0]

    a.from_numpy(np.arange(8, dtype=np.float32))
    axpy(a, b, 2.0)
    axpy(b, c, 0.5)
    np.testing.assert_allclose(b.to_numpy(), 2 * np.arange(8) + 8)
    np.testing.assert_allclose(c.to_numpy(), 0.5 * (2 * np.arange(8) + 8) + 8)


def test_static_unroll_and_static_if(tinit):
    m = ti.field(ti.f32, shape=(4, 3))
    K = 3

    @ti.kernel
    def go():
        for i in range(4):
            for j in ti.static(range(K)):
                if ti.static(j == 1):
                    m[i, j] = i * 10.0
                else:
                    m[i, j] = j + 0.5

    go()
    want = np.array([[0.5, i * 10.0, 2.5] for i in range(4)])
    np.testing.assert_allclose(m.to_numpy(), want)


def test_while_break_continue(tinit):
    steps = ti.field(ti.i32, shape=50)

    @ti.kernel
    def collatz():
        for i in steps:
            n = i + 1
            c = 0
            while n != 1:
                if n % 2 == 0:
                    n //= 2
                else:
                    n = 3 * n + 1
                c += 1
                if c > 1000:
                    break
            s = 0
            for k in range(10):
                if k % 3 == 0:
                    continue
                s += k
            steps[i] = c * 100 + s

    collatz()

    def py(n):
        c = 0
        while n != 1:
            n = n // 2 if n % 2 == 0 else 3 * n + 1
            c += 1
        return c
    s = sum(k for k in range(10) if k % 3)
    np.testing.assert_array_equal(steps.to_numpy(), [py(i + 1) * 100 + s for i in range(50)])


def test_if_elif_else_and_ternary(tinit):
    y = ti.field(ti.i32, shape=20)

    @ti.kernel
    def classify():
        for i in y:
            if i < 5:
                y[i] = 1
            elif i < 10:
                y[i] = 2
            elif i == 12 or (i > 15 and not i == 18):
                y[i] = 3
            else:
                y[i] = 4 if i % 2 == 0 else 5

    classify()
    want = [1 if i < 5 else 2 if i < 10 else 3 if (i == 12 or (i > 15 and i != 18))
            else (4 if i % 2 == 0 else 5) for i in range(20)]
    np.testing.assert_array_equal(y.to_numpy(), want)


def test_tuple_assignment_and_swap(tinit):
    r = ti.field(ti.i32, shape=(10, 2))

    @ti.kernel
    def fib():
        for i in range(10):
            a, b = 0, 1
            for _ in range(i):
                a, b = b, a + b
            r[i, 0], r[i, 1] = a, b

    fib()
    f = [0, 1]
    for _ in range(12):
        f.append(f[-1] + f[-2])
    np.testing.assert_array_equal(r.to_numpy(), [[f[i], f[i + 1]] for i in range(10)])


def test_integer_augmented_ops(tinit):
    z = ti.field(ti.i32, shape=(30, 4))

    @ti.kernel
    def go():
        for i in range(30):
            a = i - 15
            b = a
            b //= 4
            c = a
            c %= 7
            d = i
            d <<= 2
            d ^= 5
            e = i
            e **= 2
            z[i, 0], z[i, 1], z[i, 2], z[i, 3] = b, c, d, e

    go()
    a = np.arange(30) - 15
    np.testing.assert_array_equal(z.to_numpy(), np.stack(
        [a // 4, a % 7, (np.arange(30) << 2) ^ 5, np.arange(30) ** 2], axis=1))


def test_svd_and_polar(tinit):
    n = 16
    F = ti.Matrix.field(2, 2, ti.f32, shape=n)
    R = ti.Matrix.field(2, 2, ti.f32, shape=n)
    USV = ti.Matrix.field(2, 2, ti.f32, shape=n)
    sig = ti.Vector.field(2, ti.f32, shape=n)
    rng = np.random.default_rng(3)
    f = (np.eye(2) + 0.3 * rng.standard_normal((n, 2, 2))).astype(np.float32)

    @ti.kernel
    def go():
        for i in F:
            U, S, V = ti.svd(F[i])
            USV[i] = U @ S @ V.transpose()
            sig[i] = ti.Vector([S[0, 0], S[1, 1]])
            r, s = ti.polar_decompose(F[i])
            R[i] = r

    F.from_numpy(f)
    go()
    np.testing.assert_allclose(USV.to_numpy(), f, atol=1e-5)
    sv = np.linalg.svd(f.astype(np.float64), compute_uv=False)
    sv[:, 1] *= np.sign(np.linalg.det(f))
    np.testing.assert_allclose(sig.to_numpy(), sv, atol=1e-5)
    u, _, vt = np.linalg.svd(f.astype(np.float64))
    ok = np.linalg.det(f) > 0
    np.testing.assert_allclose(R.to_numpy()[ok], (u @ vt)[ok], atol=1e-5)


def test_sparse_pointer_activity_and_deactivate_all(tinit):
    x = ti.field(ti.f32)
    block = ti.root.pointer(ti.ij, (4, 4))
    block.dense(ti.ij, (4, 4)).place(x)
    count = ti.field(ti.i32, shape=())

    @ti.kernel
    def paint():
        for i, j in ti.ndrange(16, 16):
            if (i + j) % 7 == 0 and i < 8:
                x[i, j] = i + j

    @ti.kernel
    def count_blocks():
        count[None] = 0
        for i, j in ti.ndrange(4, 4):
            count[None] += ti.is_active(block, [i, j])

    @ti.kernel
    def count_cells() -> ti.i32:
        n = 0
        for i, j in x:
            ti.atomic_add(count[None], 1)
        return n

    paint()
    count_blocks()
    want = np.zeros((16, 16), np.float32)
    for i in range(8):
        for j in range(16):
            if (i + j) % 7 == 0:
                want[i, j] = i + j
    np.testing.assert_array_equal(x.to_numpy(), want)
    blocks = {(i // 4, j // 4) for i, j in zip(*np.nonzero(want + (want == 0) * 0))}
    blocks = {(i // 4, j // 4) for i in range(8) for j in range(16) if (i + j) % 7 == 0}
    assert count[None] == len(blocks)
    count[None] = 0
    count_cells()
    assert count[None] == 16 * len(blocks)  # a dense 4x4 under each active pointer cell
    block.deactivate_all()
    count_blocks()
    assert count[None] == 0
    assert not x.to_numpy().any()


def test_dynamic_append_length(tinit):
    lst = ti.field(ti.i32)
    ti.root.dense(ti.i, 5).dynamic(ti.j, 64, chunk_size=8).place(lst)
    lens = ti.field(ti.i32, shape=5)

    @ti.kernel
    def build():
        for i in range(5):
            for k in range(i * 3):
                ti.append(lst.parent(), i, k * 2)
        for i in range(5):
            lens[i] = ti.length(lst.parent(), i)

    build()
    np.testing.assert_array_equal(lens.to_numpy(), [0, 3, 6, 9, 12])
    got = lst.to_numpy()
    for i in range(5):
        assert sorted(got[i, :i * 3].tolist()) == [k * 2 for k in range(i * 3)]


def test_python_scope_access(tinit):
    x = ti.field(ti.f32, shape=(4, 5))
    v = ti.Vector.field(2, ti.i32, shape=3)
    s = ti.field(ti.i64, shape=())
    x[1, 2] = 7.5
    x[3, 4] = 1
    v[2] = [4, 5]
    s[None] = 2**40
    assert x[1, 2] == 7.5 and x[0, 0] == 0.0
    assert isinstance(x[1, 2], float)
    assert list(v[2]) == [4, 5]
    assert s[None] == 2**40
    want = np.zeros((4, 5), np.float32)
    want[1, 2], want[3, 4] = 7.5, 1
    np.testing.assert_array_equal(x.to_numpy(), want)


def test_from_numpy_fill_and_conversion(tinit):
    a = ti.field(ti.i32, shape=6)
    b = ti.Vector.field(3, ti.f32, shape=(2, 2))
    a.from_numpy(np.array([1.9, -2.7, 3, 4, 5, 6]))  # converted as Taichi does
    np.testing.assert_array_equal(a.to_numpy(), [1, -2, 3, 4, 5, 6])
    b.fill(1.5)
    np.testing.assert_array_equal(b.to_numpy(), np.full((2, 2, 3), 1.5, np.float32))
    assert a.to_numpy(dtype=np.float64).dtype == np.float64


def test_globals_as_constants(tinit):
    n = 12
    dx = 1 / n
    coef = [2.0, 3.0]
    out = ti.field(ti.f32, shape=n)

    @ti.kernel
    def go():
        for i in range(n):
            out[i] = i * dx * coef[1] + (n - 1) // 4 + coef[0]

    go()
    np.testing.assert_allclose(out.to_numpy(), np.arange(n) / n * 3 + 2 + 2, rtol=1e-6)


def test_default_fp_f64(client):
    ti.init(server=client, default_fp=ti.f64)
    try:
        x = ti.field(float, shape=4)

        @ti.kernel
        def go():
            for i in x:
                x[i] = 1.0 / 3.0 + i * 1e-12

        go()
        assert x.to_numpy().dtype == np.float64
        np.testing.assert_allclose(x.to_numpy(), 1 / 3 + np.arange(4) * 1e-12, rtol=1e-15)
    finally:
        ti.reset()


def test_casts(tinit):
    out = ti.field(ti.i32, shape=(8, 3))
    f = ti.field(ti.f32, shape=8)

    @ti.kernel
    def go():
        for i in range(8):
            t = i * 0.75 - 2.0
            out[i, 0] = int(t)
            out[i, 1] = ti.cast(ti.floor(t), ti.i32)
            out[i, 2] = ti.cast(t * 2, ti.i32)
            f[i] = float(i) / 2

    go()
    t = np.arange(8) * 0.75 - 2.0
    np.testing.assert_array_equal(out.to_numpy(), np.stack(
        [np.trunc(t), np.floor(t), np.trunc(t * 2)], axis=1).astype(np.int32))
    np.testing.assert_allclose(f.to_numpy(), np.arange(8) / 2)


def test_math_functions(tinit):
    n = 20
    x = ti.field(ti.f32, shape=n)
    y = ti.field(ti.f32, shape=(n, 6))

    @ti.kernel
    def go():
        for i in x:
            t = x[i]
            y[i, 0] = ti.sin(t) + ti.cos(t)
            y[i, 1] = ti.exp(-t) + ti.log(t + 1.0)
            y[i, 2] = ti.sqrt(t) + ti.abs(t - 1.0)
            y[i, 3] = ti.math.clamp(t, 0.5, 1.5) + ti.math.fract(t * 3.0)
            y[i, 4] = ti.max(t, 1.0) + ti.min(t, 0.5) + ti.atan2(t, 1.0)
            y[i, 5] = ti.math.vec3(t, 2 * t, 3.0).norm() + ti.math.pi

    d = np.linspace(0, 2, n).astype(np.float32)
    x.from_numpy(d)
    go()
    d = d.astype(np.float64)
    want = np.stack([np.sin(d) + np.cos(d), np.exp(-d) + np.log(d + 1),
                     np.sqrt(d) + np.abs(d - 1), np.clip(d, 0.5, 1.5) + (d * 3 - np.floor(d * 3)),
                     np.maximum(d, 1) + np.minimum(d, 0.5) + np.arctan2(d, 1),
                     np.sqrt(d**2 + 4 * d**2 + 9) + np.pi], axis=1)
    np.testing.assert_allclose(y.to_numpy(), want, rtol=2e-5, atol=2e-5)


def test_explicit_layout_chains(tinit):
    a = ti.field(ti.i32)
    b = ti.field(ti.i32)
    c = ti.field(ti.f32)
    ti.root.dense(ti.i, 4).dense(ti.j, 3).place(a)
    ti.root.dense(ti.ij, (2, 5)).place(b, c)
    assert a.shape == (4, 3) and b.shape == (2, 5)

    @ti.kernel
    def go():
        for i, j in a:
            a[i, j] = i * 10 + j
        for i, j in b:
            b[i, j] = i - j
            c[i, j] = b[i, j] * 0.5

    go()
    np.testing.assert_array_equal(a.to_numpy(), np.arange(4)[:, None] * 10 + np.arange(3))
    bb = np.arange(2)[:, None] - np.arange(5)
    np.testing.assert_array_equal(b.to_numpy(), bb)
    np.testing.assert_allclose(c.to_numpy(), bb * 0.5)


def test_matvec_nested_serial_loops(tinit):
    n = 24
    A = ti.field(ti.f32, shape=(n, n))
    xv = ti.field(ti.f32, shape=n)
    yv = ti.field(ti.f32, shape=n)

    @ti.kernel
    def matvec():
        for i in range(n):
            acc = 0.0
            for j in range(n):
                acc += A[i, j] * xv[j]
            yv[i] = acc

    rng = np.random.default_rng(4)
    a = rng.standard_normal((n, n)).astype(np.float32)
    v = rng.standard_normal(n).astype(np.float32)
    A.from_numpy(a)
    xv.from_numpy(v)
    matvec()
    np.testing.assert_allclose(yv.to_numpy(), a.astype(np.float64) @ v, rtol=1e-4, atol=1e-4)


def test_random_is_uniform_and_seeded(client):
    out = []
    for _ in range(2):
        ti.init(server=client, random_seed=7)
        try:
            r = ti.field(ti.f32, shape=4096)

            @ti.kernel
            def go():
                for i in r:
                    r[i] = ti.random()

            go()
            out.append(r.to_numpy())
        finally:
            ti.reset()
    a = out[0]
    assert (a >= 0).all() and (a < 1).all()
    assert abs(a.mean() - 0.5) < 0.03 and a.std() > 0.25
    np.testing.assert_array_equal(out[0], out[1])


def test_async_mode_same_results(client):
    res = []
    for am in (False, True):
        ti.init(server=client, async_mode=am)
        try:
            u = ti.field(ti.f32, shape=64)
            w = ti.field(ti.f32, shape=64)

            @ti.kernel
            def step():
                for i in u:
                    w[i] = 0.25 * (u[max(i - 1, 0)] + 2 * u[i] + u[min(i + 1, 63)])
                for i in u:
                    u[i] = w[i]

            u[32] = 64.0
            for _ in range(20):
                step()
            ti.sync()
            res.append(u.to_numpy())
        finally:
            ti.reset()
    np.testing.assert_array_equal(res[0], res[1])
    assert res[0].sum() == pytest.approx(64.0, rel=1e-5)


def test_vector_matrix_constructors(tinit):
    out = ti.Matrix.field(2, 3, ti.f32, shape=2)
    vz = ti.Vector.field(3, ti.f32, shape=2)

    @ti.kernel
    def go():
        for i in range(2):
            M = ti.Matrix.zero(ti.f32, 2, 3)
            M[0, 1] = 1.0 + i
            M[1, 2] = ti.Matrix([[1.0, 2.0], [3.0, 4.0]])[1, 0]
            out[i] = M
            vz[i] = ti.Vector.zero(ti.f32, 3) + ti.Vector([i, 2 * i, 3 * i], dt=ti.f32)

    go()
    want = np.zeros((2, 2, 3), np.float32)
    want[:, 0, 1] = [1, 2]
    want[:, 1, 2] = 3
    np.testing.assert_array_equal(out.to_numpy(), want)
    np.testing.assert_array_equal(vz.to_numpy(), [[0, 0, 0], [1, 2, 3]])


def test_grouped_field_vector_index(tinit):
    g = ti.field(ti.f32, shape=(6, 6))
    h = ti.field(ti.f32, shape=(6, 6))

    @ti.kernel
    def go():
        for I in ti.grouped(g):
            g[I] = I[0] + 0.5 * I[1]
        for I in ti.grouped(h):
            J = ti.max(I - ti.Vector([1, 1]), 0)
            h[I] = g[J]

    go()
    gg = np.arange(6)[:, None] + 0.5 * np.arange(6)
    np.testing.assert_allclose(g.to_numpy(), gg)
    idx = np.maximum(np.arange(6) - 1, 0)
    np.testing.assert_allclose(h.to_numpy(), gg[idx][:, idx])


def test_range_with_step_and_annotated_vars(tinit):
    out = ti.field(ti.i32, shape=3)

    @ti.kernel
    def go():
        for t in range(1):
            s: ti.i32 = 0
            for k in range(10, 0, -3):
                s += k
            out[0] = s
            q = 0
            for k in range(0, 11, 5):
                q += k
            out[1] = q
            out[2] = len(ti.static([1, 2, 3]))

    go()
    np.testing.assert_array_equal(out.to_numpy(), [10 + 7 + 4 + 1, 0 + 5 + 10, 3])


def test_bitmasked_struct_for_visits_active_only(tinit):
    m = ti.field(ti.i32)
    ti.root.bitmasked(ti.i, 32).place(m)
    visits = ti.field(ti.i32, shape=())

    @ti.kernel
    def mark():
        for i in range(32):
            if i % 5 == 0:
                m[i] = i

    @ti.kernel
    def visit():
        for i in m:
            visits[None] += 1
            m[i] += 1

    mark()
    visit()
    assert visits[None] == len(range(0, 32, 5))
    want = np.zeros(32, np.int32)
    want[::5] = np.arange(0, 32, 5) + 1
    np.testing.assert_array_equal(m.to_numpy(), want)


def test_data_oriented_class(tinit):
    @ti.data_oriented
    class Heat:
        def __init__(self, n, k):
            self.n = n
            self.k = k
            self.t = ti.field(ti.f32, shape=n)
            self.u = ti.field(ti.f32, shape=n)

        @ti.func
        def at(self, i):
            return self.t[ti.max(0, ti.min(i, self.n - 1))]

        @ti.kernel
        def step(self):
            for i in self.t:
                self.u[i] = self.t[i] + self.k * (self.at(i - 1) + self.at(i + 1) - 2 * self.t[i])
            for i in self.t:
                self.t[i] = self.u[i]

    a = Heat(16, 0.25)
    b = Heat(8, 0.1)
    a.t[8] = 1.0
    b.t[0] = 2.0
    for _ in range(3):
        a.step()
        b.step()

    def ref(t, k):
        for _ in range(3):
            p = np.pad(t, 1, mode="edge")
            t = t + k * (p[:-2] + p[2:] - 2 * t)
        return t
    ta = np.zeros(16)
    ta[8] = 1
    tb = np.zeros(8)
    tb[0] = 2
    np.testing.assert_allclose(a.t.to_numpy(), ref(ta, 0.25), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(b.t.to_numpy(), ref(tb, 0.1), rtol=1e-6, atol=1e-7)


def test_static_grouped_neighbourhood_and_list_comprehension(tinit):
    n = 6
    g = ti.field(ti.f32, shape=(n, n, n))
    out = ti.Vector.field(3, ti.f32, shape=())
    nb = (3, 3, 3)

    @ti.kernel
    def go():
        for I in ti.grouped(g):
            s = 0.0
            for off in ti.static(ti.grouped(ti.ndrange(*nb))):
                J = ti.min(ti.max(I + off - 1, 0), n - 1)
                s += ti.cast(J.sum(), ti.f32)
            g[I] = s
        out[None] = ti.Vector([k * 1.5 for k in range(3)]) + ti.zero(out[None])

    go()
    idx = np.arange(n)
    want = np.zeros((n, n, n))
    for oi in range(3):
        for oj in range(3):
            for ok in range(3):
                c = [np.clip(idx + o - 1, 0, n - 1) for o in (oi, oj, ok)]
                want += c[0][:, None, None] + c[1][None, :, None] + c[2][None, None, :]
    np.testing.assert_allclose(g.to_numpy(), want)
    np.testing.assert_allclose(out.to_numpy(), [0.0, 1.5, 3.0])


def test_fill_keeps_sparse_cells_inactive_and_rescale_index(tinit):
    x = ti.field(ti.f32)
    blk = ti.root.pointer(ti.ij, 4)
    blk.dense(ti.ij, 4).place(x)
    n_active = ti.field(ti.i32, shape=())
    coarse = ti.field(ti.i32, shape=(4, 4))

    @ti.kernel
    def seed():
        x[1, 1] = 1.0
        x[13, 6] = 2.0

    @ti.kernel
    def count():
        n_active[None] = 0
        for i, j in ti.ndrange(4, 4):
            n_active[None] += ti.is_active(blk, [i, j])
        for i, j in x:
            b = ti.rescale_index(x, blk, [i, j])
            coarse[b] = 1

    seed()
    x.fill(5.0)  # Taichi's fill: every active cell, no new ones
    count()
    assert n_active[None] == 2
    want = np.zeros((16, 16), np.float32)
    want[0:4, 0:4] = 5
    want[12:16, 4:8] = 5
    np.testing.assert_array_equal(x.to_numpy(), want)
    c = np.zeros((4, 4), np.int32)
    c[0, 0] = c[3, 1] = 1
    np.testing.assert_array_equal(coarse.to_numpy(), c)


def test_python_scope_vector_components_write_back(tinit):
    v = ti.Vector.field(3, ti.f32, shape=4)
    v[1].y = 2.5
    e = v[2]
    e[0] = 7.0
    e.z = -1.0
    want = np.zeros((4, 3), np.float32)
    want[1, 1] = 2.5
    want[2] = [7, 0, -1]
    np.testing.assert_array_equal(v.to_numpy(), want)
    assert v[2].x == 7.0 and v[1].n == 3


def test_taichi_math_module_and_casts(tinit):
    import fusebox.taichi.math as tm
    out = ti.Vector.field(2, ti.f32, shape=8)
    ib = ti.Vector.field(2, ti.i32, shape=8)

    @ti.kernel
    def go():
        for i in out:
            p = tm.vec2(0.3 * i, 1.0)
            q = tm.rotation2d(0.5) @ p
            out[i] = tm.cmul(q, tm.vec2(0.0, 1.0)) + pow(2.0, 3.0)
            ib[i] = (p * 2.5 - 0.5).cast(int)

    go()
    c, s_ = np.cos(0.5), np.sin(0.5)
    p = np.stack([0.3 * np.arange(8), np.ones(8)], axis=1)
    q = p @ np.array([[c, -s_], [s_, c]]).T
    want = np.stack([-q[:, 1], q[:, 0]], axis=1) + 8
    np.testing.assert_allclose(out.to_numpy(), want, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(ib.to_numpy(), np.trunc(p.astype(np.float32) * 2.5 - 0.5))


def test_kernel_scope_accumulator_of_a_parallel_loop(tinit):
    x = ti.field(ti.f32, shape=500)
    k = ti.field(ti.i32, shape=500)

    @ti.kernel
    def stats() -> ti.f32:
        s = 0.0
        c = 0
        for i in x:
            s += x[i]
            c += k[i] > 2
        return s + c * 1000.0

    d = np.linspace(0, 1, 500).astype(np.float32)
    x.from_numpy(d)
    k.from_numpy(np.arange(500) % 5)
    assert stats() == pytest.approx(float(d.sum()) + 1000.0 * 200, rel=1e-5)
    assert stats() == pytest.approx(float(d.sum()) + 1000.0 * 200, rel=1e-5)  # starts over


def test_slices_fill_in_kernel_randn_and_lenient_func_return(tinit):
    v = ti.Vector.field(3, ti.f32, shape=4)
    w = ti.Vector.field(2, ti.f32, shape=4)
    z = ti.field(ti.f32, shape=20000)

    @ti.func
    def get(f: ti.template(), i: int) -> ti.f32:  # returns a vector, as Taichi allows
        return f[i]

    @ti.kernel
    def go():
        v.fill(2.0)
        for i in range(4):
            w[i] = get(v, i)[:2] * i
        for i in z:
            z[i] = ti.randn()

    go()
    np.testing.assert_array_equal(w.to_numpy(), np.arange(4)[:, None] * [2.0, 2.0])
    a = z.to_numpy()
    assert abs(a.mean()) < 0.05 and abs(a.std() - 1) < 0.05 and np.isfinite(a).all()


def test_activate_deactivate_in_kernels_and_narrow_ints(tinit, capsys):
    from fusebox.taichi import _types
    _types._warned.discard("u8")  # the note is given once per process
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        m = ti.field(ti.u8)
    assert any("ti.u8 is stored as i32" in str(x.message) for x in w)
    ti.root.bitmasked(ti.ij, (8, 8)).place(m)
    n = ti.field(ti.i32, shape=())

    @ti.kernel
    def toggle():
        for i, j in ti.ndrange(8, 8):
            if (i * j) % 3 == 0:
                ti.activate(m, [i, j])
        for i, j in ti.ndrange(8, 8):
            if i == 0:
                ti.deactivate(m, [i, j])
        ti.static_print("translated", m.shape)
        n[None] = 0
        for i, j in m:
            n[None] += 1

    toggle()
    assert "translated (8, 8)" in capsys.readouterr().out
    want = sum(1 for i in range(1, 8) for j in range(8) if (i * j) % 3 == 0)
    assert n[None] == want
    assert m.to_numpy().dtype == np.int32


# ---------------------------------------------------------------- errors

def test_unsupported_construct_names_file_line_and_construct(tinit):
    x = ti.field(ti.f32, shape=4)

    @ti.kernel
    def bad():
        for i in x:
            x[i] = (lambda q: q * 2)(1.0)  # UNSUPPORTED-LAMBDA

    with pytest.raises(ti.TaichiSyntaxError) as e:
        bad()
    msg = str(e.value)
    assert f"{HERE}:{line_of('UNSUPPORTED-LAMBDA')}:" in msg, msg
    assert "a lambda is not supported in Fusebox kernels" in msg and "@ti.func" in msg

    @ti.kernel
    def bad2():
        for i in x:
            try:  # UNSUPPORTED-TRY
                x[i] = 1
            except Exception:
                pass

    with pytest.raises(ti.TaichiSyntaxError) as e:
        bad2()
    assert f"{HERE}:{line_of('UNSUPPORTED-TRY')}:" in str(e.value)
    assert "'try'" in str(e.value) and "instead" in str(e.value)


def test_server_type_error_maps_to_python_line_and_session_goes_on(tinit):
    n = ti.field(ti.i32, shape=4)
    x = ti.field(ti.f32, shape=4)

    @ti.kernel
    def wrong():
        for i in n:
            n[i] = x[i] * 2.5  # TYPE-ERROR-HERE

    with pytest.raises(ti.TaichiCompilationError) as e:
        wrong()
    msg = str(e.value)
    assert f"{HERE}:{line_of('TYPE-ERROR-HERE')}: error: type mismatch" in msg, msg
    assert ".fbk" not in msg and "var " not in msg
    assert "n[i] = x[i] * 2.5" in msg  # the Python line is quoted

    @ti.kernel
    def right():
        for i in n:
            n[i] = ti.cast(x[i] * 2.5, ti.i32) + i

    right()  # the session goes on
    np.testing.assert_array_equal(n.to_numpy(), np.arange(4))


def test_bad_func_is_forgotten_after_its_error(tinit):
    x = ti.field(ti.f32, shape=4)

    @ti.func
    def broken(t):
        return t + undefined_name  # noqa: F821  UNDEFINED-NAME

    @ti.kernel
    def use_broken():
        for i in x:
            x[i] = broken(1.0)

    with pytest.raises(ti.TaichiSyntaxError) as e:
        use_broken()
    assert f"{HERE}:{line_of('UNDEFINED-NAME')}:" in str(e.value)
    assert "'undefined_name' is not defined" in str(e.value)

    @ti.kernel
    def fine():
        for i in x:
            x[i] = 2.0

    fine()
    np.testing.assert_array_equal(x.to_numpy(), [2.0] * 4)


def test_field_after_first_launch_grows_the_layout(tinit):
    """A field declared after kernels ran (Taichi: a new SNode tree; the
    wheel's diff_sph.py declares its fields after loading its controller
    with a kernel): the session is replaced by one with the new field;
    values and gradients written before are kept, kernels run again."""
    x = ti.field(ti.f32, shape=4, needs_grad=True)

    @ti.kernel
    def double():
        for i in x:
            x[i] = x[i] * 2.0

    x.from_numpy(np.arange(4, dtype=np.float32))
    double()
    x.grad.fill(5.0)
    y = ti.field(ti.i32, shape=(2, 3))  # LATE-FIELD

    @ti.kernel
    def both():
        for i, j in y:
            y[i, j] = i * 10 + j + ti.cast(x[j], ti.i32)

    both()
    double()
    np.testing.assert_array_equal(x.to_numpy(), np.arange(4) * 4.0)
    np.testing.assert_array_equal(x.grad.to_numpy(), [5.0] * 4)
    np.testing.assert_array_equal(y.to_numpy(), [[0, 3, 6], [10, 13, 16]])
    z = ti.field(ti.f32)
    ti.root.dense(ti.i, 3).place(z)  # an explicit SNode tree after the launch too
    z.fill(1.5)
    np.testing.assert_array_equal(z.to_numpy(), [1.5] * 3)
    np.testing.assert_array_equal(y.to_numpy(), [[0, 3, 6], [10, 13, 16]])


def test_field_after_first_launch_is_refused_when_sparse_or_taping(tinit):
    x = ti.field(ti.f32)
    ti.root.pointer(ti.i, 2).dense(ti.i, 4).place(x)
    x[1] = 1.0
    with pytest.raises(ti.TaichiRuntimeError) as e:
        ti.field(ti.f32, shape=4)
    assert "before the first kernel launch" in str(e.value)
    ti.reset()
    tinit()
    a = ti.field(ti.f32, shape=2, needs_grad=True)
    loss = ti.field(ti.f32, shape=(), needs_grad=True)

    @ti.kernel
    def f():
        for i in a:
            loss[None] += a[i]

    with pytest.raises(ti.TaichiRuntimeError, match="before the first kernel launch"):
        with ti.ad.Tape(loss):
            f()
            ti.field(ti.f32, shape=4)


def test_field_of_an_earlier_init_is_refused(tinit):
    x = ti.field(ti.f32, shape=4)
    x.fill(1)
    tinit()  # ti.init again: a new layout and session
    with pytest.raises(ti.TaichiRuntimeError, match="earlier ti.init"):
        x.to_numpy()
    y = ti.field(ti.f32, shape=4)

    @ti.kernel
    def k():
        for i in y:
            y[i] = x[i]  # OLD-FIELD

    with pytest.raises(ti.TaichiSyntaxError) as e:
        k()
    assert f":{line_of('OLD-FIELD')}:" in str(e.value)


def test_all_any_of_vector_comparisons(tinit):
    x = ti.Vector.field(2, ti.f32, shape=4)
    r = ti.field(ti.i32, shape=(4, 2))

    @ti.kernel
    def k():
        for i in x:
            r[i, 0] = all(-0.1 <= x[i] <= 1.1)
            r[i, 1] = any(x[i] > 0.7)

    x0 = np.array([[0, 0], [2, 0], [0.5, 0.8], [-1, -1]], np.float32)
    x.from_numpy(x0)
    k()
    want = np.stack([np.all((-0.1 <= x0) & (x0 <= 1.1), 1), np.any(x0 > 0.7, 1)], 1)
    np.testing.assert_array_equal(r.to_numpy(), want.astype(np.int32))


# ---------------------------------------------------------------- autodiff

def _fd(f, x, h=1e-6):
    """Central finite differences of a scalar function of a vector (f64)."""
    g = np.zeros_like(x)
    for i in range(x.size):
        e = np.zeros_like(x)
        e.flat[i] = h
        g.flat[i] = (f(x + e) - f(x - e)) / (2 * h)
    return g


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_tape_gradient_matches_finite_differences(tinit, mode):
    tinit(default_fp=ti.f64, async_mode=(mode == "async"))
    n = 6
    x = ti.field(ti.f64, shape=n, needs_grad=True)
    w = ti.field(ti.f64, shape=n)  # no gradient: a constant of the loss
    y = ti.field(ti.f64, shape=n, needs_grad=True)
    loss = ti.field(ti.f64, shape=(), needs_grad=True)

    @ti.func
    def act(v):
        return ti.tanh(v) if v > 0.0 else ti.exp(v) - 1.0

    @ti.kernel
    def hidden():
        for i in x:
            y[i] = act(w[i] * x[i]) + ti.sqrt(x[i] * x[i] + 1.0)

    @ti.kernel
    def total(k: ti.f64):
        for i in y:
            loss[None] += k * y[i] ** 2 + ti.sin(y[i]) * x[(i + 1) % n]

    x0 = np.linspace(-1.3, 1.1, n)
    w0 = np.linspace(0.5, 2.0, n)
    w.from_numpy(w0)

    def f(xv):
        v = w0 * xv
        h = np.where(v > 0, np.tanh(v), np.exp(v) - 1.0) + np.sqrt(xv * xv + 1.0)
        return np.sum(0.7 * h ** 2 + np.sin(h) * np.roll(xv, -1))

    x.from_numpy(x0)
    x.grad.fill(123.0)  # the tape starts from zero gradients, as Taichi's does
    with ti.ad.Tape(loss=loss):
        hidden()
        total(0.7)
    assert loss[None] == pytest.approx(f(x0), rel=1e-12)
    np.testing.assert_allclose(x.grad.to_numpy(), _fd(f, x0), rtol=1e-6, atol=1e-8)
    assert isinstance(loss.grad[None], float) and loss.grad[None] == 1.0


def test_kernel_grad_vector_field_closed_form(tinit):
    n = 5
    p = ti.Vector.field(3, ti.f32, shape=n, needs_grad=True)
    e = ti.field(ti.f32, shape=n, needs_grad=True)

    @ti.kernel
    def energy(s: ti.f32):
        for i in p:
            e[i] = s * p[i].dot(p[i]) + p[i].x * p[i].y

    p0 = np.arange(3 * n, dtype=np.float32).reshape(n, 3) * 0.1 - 0.5
    p.from_numpy(p0)
    energy(2.0)
    e.grad.fill(1.0)
    energy.grad(2.0)  # the adjoint, with the kernel's arguments
    want = 2 * 2.0 * p0
    want[:, 0] += p0[:, 1]
    want[:, 1] += p0[:, 0]
    np.testing.assert_allclose(p.grad.to_numpy(), want, rtol=1e-5, atol=1e-6)
    # a second adjoint launch accumulates, as in Taichi; clear_all_gradients zeroes
    e.grad.fill(1.0)
    energy.grad(2.0)
    np.testing.assert_allclose(p.grad.to_numpy(), 2 * want, rtol=1e-5, atol=1e-6)
    ti.ad.clear_all_gradients()
    assert not p.grad.to_numpy().any() and not e.grad.to_numpy().any()


def test_grad_read_in_kernel_and_lazy_grad(tinit):
    """x.grad[i] inside a kernel (gradient descent as Taichi programs write
    it), ti.root.lazy_grad(), and a loss minimized to its closed-form
    optimum."""
    n = 4
    x = ti.field(ti.f32)
    loss = ti.field(ti.f32)
    ti.root.dense(ti.i, n).place(x)
    ti.root.place(loss)
    ti.root.lazy_grad()

    @ti.kernel
    def compute():
        for i in x:
            loss[None] += (x[i] - i) ** 2

    @ti.kernel
    def step(lr: ti.f32):
        for i in x:
            x[i] -= lr * x.grad[i]

    for _ in range(60):
        with ti.Tape(loss):
            compute()
        step(0.1)
    np.testing.assert_allclose(x.to_numpy(), np.arange(n), atol=1e-4)
    assert loss[None] < 1e-7


def test_data_oriented_kernel_grad(tinit):
    @ti.data_oriented
    class Model:
        def __init__(self):
            self.a = ti.field(ti.f32, shape=3, needs_grad=True)
            self.b = ti.field(ti.f32, shape=3, needs_grad=True)

        @ti.kernel
        def forward(self):
            for i in self.a:
                self.b[i] = ti.exp(self.a[i])

    m = Model()
    m.a.from_numpy(np.array([0.0, 0.5, -1.0], np.float32))
    m.forward()
    m.b.grad.fill(2.0)
    m.forward.grad()
    np.testing.assert_allclose(m.a.grad.to_numpy(), 2.0 * np.exp([0.0, 0.5, -1.0]),
                               rtol=1e-6)


def test_gradient_errors_are_clear(tinit):
    x = ti.field(ti.f32, shape=4, needs_grad=True)
    nog = ti.field(ti.f32, shape=4)
    loss = ti.field(ti.f32, shape=(), needs_grad=True)
    with pytest.raises(ti.TaichiTypeError, match="only float fields"):
        ti.field(ti.i32, shape=4, needs_grad=True)
    with pytest.raises(ti.TaichiRuntimeError, match="no gradient: declare it with "
                                                    "needs_grad=True"):
        nog.grad.to_numpy()  # (nog.grad alone may still be placed: place(nog, nog.grad))
    with pytest.raises(ti.TaichiTypeError, match="0-D field"):
        ti.ad.Tape(loss=None)

    @ti.kernel
    def overwrite():
        for i in x:
            x[i] = x[i] * 2.0  # OVERWRITE-HERE

    with pytest.raises(ti.TaichiCompilationError) as e:
        with ti.ad.Tape(loss):
            overwrite()
    msg = str(e.value)
    assert f"{HERE}:{line_of('OVERWRITE-HERE')}: error:" in msg, msg
    assert "cannot differentiate kernel 'overwrite'" in msg and "split the kernel" in msg
    assert "%" not in msg and ".fbk" not in msg and ".grad'" not in msg
    with pytest.raises(ti.TaichiCompilationError) as e:
        overwrite.grad()
    assert f"{HERE}:{line_of('OVERWRITE-HERE')}: error:" in str(e.value)

    @ti.kernel
    def fine():
        for i in x:
            loss[None] += 3.0 * x[i]

    with ti.ad.Tape(loss):  # the session goes on; the refused kernel was not recorded
        fine()
    np.testing.assert_allclose(x.grad.to_numpy(), 3.0)


def test_ndarray_argument_of_another_type_is_refused_clearly(tinit):
    """An ndarray() with no dtype takes the array's (float64 here); storing
    it into an f32 field needs a cast on Fusebox, said at the line."""
    x = ti.field(ti.f32, shape=4)

    @ti.kernel
    def k(a: ti.types.ndarray()):
        for i in x:
            x[i] = a[i]  # NDARRAY-F64

    with pytest.raises(ti.TaichiCompilationError) as e:
        k(np.zeros(4))
    assert f"{HERE}:{line_of('NDARRAY-F64')}: error:" in str(e.value)
    assert "expected f32, found f64" in str(e.value)
    k(np.arange(4, dtype=np.float32))
    np.testing.assert_array_equal(x.to_numpy(), [0, 1, 2, 3])


def test_numpy_global_refused(tinit):
    x = ti.field(ti.f32, shape=4)
    table = np.arange(4.0).reshape(2, 2, 1)

    @ti.kernel
    def k1():
        for i in x:
            x[i] = table[0, 0, 0]  # NUMPY-GLOBAL

    with pytest.raises(ti.TaichiSyntaxError) as e:
        k1()
    assert f":{line_of('NUMPY-GLOBAL')}:" in str(e.value)
    assert "NumPy array" in str(e.value) and "from_numpy" in str(e.value)


def test_atomic_old_value_allocates_slots(tinit):
    # ti.atomic_add returns the value before the update: every iteration
    # that passes the test takes a distinct slot, as Taichi's slot allocation.
    n = 64
    src = ti.field(ti.i32, shape=n)
    out = ti.field(ti.i32, shape=n)
    count = ti.field(ti.i32, shape=())
    peak = ti.field(ti.f32, shape=())

    @ti.kernel
    def compact():
        for i in src:
            if src[i] % 3 == 0:
                slot = ti.atomic_add(count[None], 1)
                out[slot] = src[i]
        for i in src:
            ti.atomic_max(peak[None], ti.cast(src[i], ti.f32))

    src.from_numpy(np.arange(n, dtype=np.int32) * 5)
    out.fill(-1)
    compact()
    want = sorted(v for v in range(0, 5 * n, 5) if v % 3 == 0)
    k = count[None]
    assert k == len(want)
    assert sorted(out.to_numpy()[:k].tolist()) == want
    assert (out.to_numpy()[k:] == -1).all()
    assert peak[None] == 5.0 * (n - 1)


def test_print_in_kernel_is_dropped_with_a_warning(tinit):
    x = ti.field(ti.i32, shape=2)

    @ti.kernel
    def k():
        for i in x:
            print(i)  # PRINT-HERE
            x[i] = 5

    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        k()
    assert any(f":{line_of('PRINT-HERE')}:" in str(m.message) for m in w)
    np.testing.assert_array_equal(x.to_numpy(), [5, 5])


def test_launch_error_reaches_the_user(tinit):
    x = ti.field(ti.f32, shape=4)

    @ti.kernel
    def oob(k: ti.i32):
        for i in range(1):
            x[k] = 1.0

    oob(9)
    with pytest.raises(fusebox.LaunchError) as e:
        ti.sync()
    assert "oob" in str(e.value.errors[0].kernel)
    oob(2)  # and it goes on
    assert x[2] == 1.0


def test_no_generated_names_in_layout_error(tinit):
    x = ti.field(ti.f32)
    ti.root.dense(ti.i, 4)  # LAYOUT-EMPTY-SNODE (no field in it)
    ti.root.dense(ti.i, 4).place(x)
    with pytest.raises(ti.TaichiCompilationError) as e:
        x.fill(0)
    msg = str(e.value)
    assert f"{HERE}:{line_of('LAYOUT-EMPTY-SNODE')}:" in msg, msg
    assert not re.search(r"%\d", msg)


# ------------------------------------------- the wheel's autodiff examples' constructs

def test_explicit_gradient_placement_and_kernel_grad(tinit):
    """simple_derivative.py: ti.root.dense(...).place(x, x.grad, y, y.grad)
    on fields declared without needs_grad, y.grad set cell by cell from
    Python, then kernel.grad() without a tape."""
    n = 16
    x, y = ti.field(ti.f32), ti.field(ti.f32)
    ti.root.dense(ti.i, n).place(x, x.grad, y, y.grad)

    @ti.kernel
    def poly():
        for i in x:
            v = x[i]
            ret = 0.0
            if v < -0.2 or v > 0.2:
                ret = 4 / ti.max(v, 0.1)
            else:
                ret = 0
            y[i] = ret

    xs = (np.arange(n) + 0.5) / n * 2 - 1
    for i in range(n):
        x[i] = xs[i]
    poly()
    for i in range(n):
        y.grad[i] = 1
    poly.grad()
    v = xs.astype(np.float32)
    want = np.where(v > 0.2, -4 / np.maximum(v, 0.1) ** 2, 0.0)  # max(v, 0.1) = 0.1 below
    np.testing.assert_allclose(x.grad.to_numpy(), want, rtol=1e-5)
    np.testing.assert_allclose(y.to_numpy(), np.where(np.abs(v) > 0.2,
                                                      4 / np.maximum(v, 0.1), 0), rtol=1e-6)


def test_gradient_placed_apart_from_its_field_is_refused(tinit):
    x = ti.field(ti.f32)
    ti.root.dense(ti.i, 4).place(x)
    other = ti.root.dense(ti.i, 4)
    with pytest.raises(ti.TaichiSyntaxError, match="same SNode as the field"):
        other.place(x.grad)
    w = ti.field(ti.f32)
    block = ti.root.dense(ti.i, 4)
    block.place(w.grad)  # the gradient first is fine, in the field's SNode
    with pytest.raises(ti.TaichiSyntaxError, match="same SNode as the field"):
        other.place(w)
    block.place(w)
    other.place(ti.field(ti.f32))  # (the layout needs a field in every SNode)
    u = ti.field(ti.f32, shape=3)
    g = u.grad  # taken while the layout is open, never placed
    u.fill(0)
    with pytest.raises(ti.TaichiRuntimeError, match="no gradient: declare it with needs_grad"):
        g.to_numpy()


def test_ndarray_arguments(tinit):
    """ti.types.ndarray() (diff_sph.py's copy_from_numpy and
    fill_target_centers): read in the kernel, written back to the array
    when the kernel writes it, one field per shape, vector elements."""
    dst = ti.field(ti.f32, shape=(2, 3, 4))

    @ti.kernel
    def copy_in(dst: ti.template(), src: ti.types.ndarray(), k: ti.i32):
        for I in ti.grouped(src):
            dst[k, I] = src[I] * 2

    @ti.kernel
    def scale(a: ti.types.ndarray(dtype=ti.f64, ndim=1), s: ti.f64):
        for i in range(a.shape[0]):
            a[i] = a[i] * s

    @ti.kernel
    def norms(v: ti.types.ndarray(dtype=ti.types.vector(3, ti.f32), ndim=1),
              out: ti.types.ndarray()):
        for i in v:
            out[i] = v[i].norm()

    src = np.arange(12, dtype=np.float32).reshape(3, 4)
    copy_in(dst, src, 1)
    copy_in(dst, src[:2, :3] + 100, 0)  # another shape: a field of its own
    want = np.zeros((2, 3, 4), np.float32)
    want[1] = src * 2
    want[0, :2, :3] = (src[:2, :3] + 100) * 2
    np.testing.assert_array_equal(dst.to_numpy(), want)
    a = np.array([1.0, -2.0, 0.5])
    scale(a, 3.0)
    np.testing.assert_array_equal(a, [3.0, -6.0, 1.5])  # passed by reference, as in Taichi
    v = np.array([[3, 4, 0], [1, 2, 2]], np.float32)
    out = np.zeros(2, np.float32)
    norms(v, out)
    np.testing.assert_allclose(out, [5.0, 3.0], rtol=1e-6)
    with pytest.raises(ti.TaichiTypeError, match="declares ndim=1; the array has 2"):
        scale(np.zeros((2, 2)), 1.0)
    with pytest.raises(ti.TaichiTypeError, match="takes a NumPy array; a field goes"):
        scale(dst, 1.0)


def test_ti_ui_window_headless(tinit, monkeypatch):
    """ti.ui (GGUI) without a window: $FUSEBOX_GUI_FRAMES ends the loop,
    widgets keep the program's values, no input arrives."""
    monkeypatch.setenv("FUSEBOX_GUI_FRAMES", "3")
    pos = ti.Vector.field(3, ti.f32, shape=4)
    window = ti.ui.Window("t", (64, 48), show_window=False)
    scene, canvas, gui = window.get_scene(), window.get_canvas(), window.get_gui()
    camera = ti.ui.Camera()
    camera.position(0.5, 1.0, 2.0)
    frames, x = 0, 0.25
    while window.running:
        with gui.sub_window("w", 0.05, 0.05, 0.2, 0.2) as w:
            x = w.slider_float("X", x, 0.0, 1.0)
            assert not w.button("go")
        camera.track_user_inputs(window, movement_speed=0.03, hold_key=ti.ui.RMB)
        assert not window.is_pressed("e") and not list(window.get_events(ti.ui.PRESS))
        scene.set_camera(camera)
        scene.particles(pos, radius=0.01)
        canvas.scene(scene)
        window.show()
        frames += 1
    assert frames == 3 and x == 0.25
    np.testing.assert_array_equal(camera.curr_position, [0.5, 1.0, 2.0])
    with pytest.raises(SystemExit):
        window.show()
    with pytest.raises(TypeError, match="expected a ti.ui.Camera"):
        scene.set_camera("camera")
    with pytest.raises(TypeError, match="expected a field"):
        scene.particles(None, radius=0.01)
    assert ti._lib.core.with_vulkan() is False


@pytest.mark.parametrize("mode", [False, True])
def test_python_scope_cell_reads_read_one_cell(tinit, mode):
    """x[i, j] from Python scope on a big dense scalar field is one cell
    read (a kernel returning it; rt.cell_reads counts them), not the whole
    field: the same values, as Python numbers, as to_numpy()[i, j], in sync
    and async mode, after launches still queued; sparse, vector and small
    fields take the whole-field read, and a bad index is NumPy's error."""
    tinit(async_mode=mode)
    a = ti.field(ti.f32, shape=(64, 32))
    b = ti.field(ti.i64, shape=200)
    c = ti.field(ti.f64, shape=(8, 8, 4))
    small = ti.field(ti.i32, shape=4)
    v = ti.Vector.field(2, ti.f32, shape=100)
    sp = ti.field(ti.i32)
    ti.root.pointer(ti.i, 8).dense(ti.i, 16).place(sp)

    @ti.kernel
    def fill(k: ti.f32):
        for i, j in a:
            a[i, j] = ti.sin(i * 0.37 + j * k) / 3.0
        for i in b:
            b[i] = (i - 100) * 12345678901
        for i, j, l in c:
            c[i, j, l] = (i + 0.1) / (j + l + 1.0)
        for i in v:
            v[i] = [i, -i]
        sp[21] = 5

    fill(0.5)  # queued in async mode: the cell read comes after it
    rt = ti._runtime.rt()
    before = rt.cell_reads
    want_a, want_b, want_c = a.to_numpy(), b.to_numpy(), c.to_numpy()
    for i, j in ((0, 0), (63, 31), (17, 5), (-1, -2)):
        got = a[i, j]
        assert type(got) is float and got == float(want_a[i, j])
    for i in (0, 7, 199, -200):
        got = b[i]
        assert type(got) is int and got == int(want_b[i])
    assert c[7, 3, 2] == float(want_c[7, 3, 2]) and c[np.int64(1), 2, 3] == float(want_c[1, 2, 3])
    assert rt.cell_reads - before == 10, (rt.cell_reads - before)
    assert small[2] == 0 and sp[21] == 5 and sp[22] == 0 and list(v[3]) == [3.0, -3.0]
    assert rt.cell_reads - before == 10  # none of those read one cell
    with pytest.raises(IndexError):
        a[64, 0]
    fill(1.5)
    assert a[5, 6] == float(a.to_numpy()[5, 6]) and rt.cell_reads - before == 11
