"""svd and polar of the .fbk language (docs/language.md, "svd and polar")
run on a real fuseboxd (the engine's compiled kernels) and checked against
NumPy's f64 SVD: 2x2 and 3x3, f32 and f64, on random matrices and on the
hard ones (identity, diagonal, near-identity, rotations, reflections,
near-singular, singular, zero, badly scaled, repeated singular values).

What is checked for every matrix: U and V are rotations, S is diagonal,
sorted, with only its last entry possibly negative (and then det M < 0),
U S V^T and R P reproduce M, P is symmetric, and the singular values match
numpy.linalg.svd, all within a small multiple of the unit roundoff. Where
the exact answer is representable it must come out bit for bit: identity
gives U = V = R = I and sigma = 1, a diagonal matrix gives its diagonal
(absolute values, sorted, the last one negative when det < 0) with signed
permutations for U and V."""
import numpy as np
import pytest

N = 96  # matrices per run

SRC = """
layout {{ dense(i: {N}) {{
  place M: {T}[{n}][{n}], U: {T}[{n}][{n}], S: {T}[{n}][{n}], V: {T}[{n}][{n}]
  place R: {T}[{n}][{n}], P: {T}[{n}][{n}]
}} }}
kernel decompose() {{
  for i in M {{
    let (u, s, v) = svd(M[i])
    U[i] = u
    S[i] = s
    V[i] = v
    let (r, p) = polar(M[i])
    R[i] = r
    P[i] = p
  }}
}}
"""


def rotation(rng, n):
    q, r = np.linalg.qr(rng.standard_normal((n, n)))
    q = q * np.sign(np.diag(r))
    if np.linalg.det(q) < 0:
        q[:, 0] = -q[:, 0]
    return q


def matrices(n, dtype, rng):
    """N matrices of dtype: the hard cases first, then random ones."""
    f32 = dtype == np.float32
    u = np.finfo(dtype).eps / 2
    ulp = np.finfo(dtype).eps
    ms = []
    eye = np.eye(n)
    ms += [eye, -eye, np.zeros((n, n))]
    # diagonal: exact answers (signs, zeros, repeats, order)
    for d in ([3, 2, 1], [2, 3, 1], [-2, 3, 1], [1, -1, 1], [0.5, 0, 4], [-1, -1, -1],
              [1 + ulp, 1 - ulp / 2, 1], [1.1, 0.9, 1.3], [5, 5, 5], [1e-3, 7, -2e3]):
        ms.append(np.diag(d[:n]))
    # near identity: diagonal (exact answer representable) and general
    for k in range(4):
        ms.append(np.diag(1 + ulp * rng.integers(-8, 9, n)))
    for scale in (1e-3, 1e-6, 1e-9, float(u)):
        for _ in range(3):
            ms.append(eye + scale * rng.uniform(-1, 1, (n, n)))
    # rotations, reflections, permutations
    for _ in range(3):
        ms.append(rotation(rng, n))
        refl = rotation(rng, n)
        refl[:, -1] = -refl[:, -1]
        ms.append(refl)
    perm = np.roll(eye, 1, axis=0)
    ms += [perm, -perm]
    # near-singular, singular, repeated singular values
    for sv in ([1, 1e-4, 1e-7], [1, 1e-12, 1e-14], [1, 1, 0], [1, 0, 0], [2, 2, 1], [1, 1, 1e-5],
               [3, 1e-6, 1e-6]):
        s = np.array(sv[:n], dtype=float)
        if n == 2 and len(sv) == 3 and sv[2] == 0 and sv[1] == 1:
            s = np.array([1.0, 0.0])
        for sign in (1, -1):
            a, b = rotation(rng, n), rotation(rng, n)
            s2 = s.copy()
            s2[-1] *= sign
            ms.append(a @ np.diag(s2) @ b.T)
    ms.append(np.outer(np.arange(1, n + 1), np.arange(n) - 0.5))  # rank 1
    # badly scaled: rows and columns of very different sizes, tiny and huge
    span = 4 if f32 else 8
    for _ in range(4):
        dr = 10.0 ** rng.uniform(-span, span, n)
        dc = 10.0 ** rng.uniform(-span, span, n)
        ms.append(dr[:, None] * rng.uniform(-1, 1, (n, n)) * dc[None, :])
    big = 1e30 if f32 else 1e250
    for s in (1 / big, big):
        ms.append(s * rng.uniform(-1, 1, (n, n)))
        ms.append(s * eye)
    # negative determinant and random
    while len(ms) < N:
        m = rng.uniform(-1, 1, (n, n))
        if len(ms) % 3 == 0:
            m[0] = -m[0]
        ms.append(m)
    return np.array(ms[:N], dtype=dtype)


def run(fb, n, dtype, ms):
    T = "f32" if dtype == np.float32 else "f64"
    with fb.session(SRC.format(N=N, T=T, n=n)) as s:
        s.fields.M.from_numpy(ms)
        s.kernels.decompose()
        return {k: getattr(s.fields, k).to_numpy().astype(np.float64) for k in "USVRP"}


def rotation_error(q):
    n = q.shape[0]
    return max(np.abs(q.T @ q - np.eye(n)).max(), abs(np.linalg.det(q) - 1))


CASES = [(2, np.float32), (2, np.float64), (3, np.float32), (3, np.float64)]


@pytest.mark.parametrize("n,dtype", CASES, ids=["2x2-f32", "2x2-f64", "3x3-f32", "3x3-f64"])
def test_svd_polar_against_numpy(fb, n, dtype):
    rng = np.random.default_rng(35 + n)
    ms = matrices(n, dtype, rng)
    out = run(fb, n, dtype, ms)
    u = float(np.finfo(dtype).eps) / 2
    tol = 16 * u if n == 2 else 32 * u
    eye = np.eye(n)
    for i, m32 in enumerate(ms):
        m = m32.astype(np.float64)
        U, S, V, R, P = (out[k][i] for k in "USVRP")
        what = f"{n}x{n} {dtype.__name__} matrix {i}:\n{m!r}"
        for x in (U, S, V, R, P):
            assert np.isfinite(x).all(), what
        sig = np.diag(S)
        assert np.array_equal(S, np.diag(sig)), f"S not diagonal: {what}"
        ref = np.linalg.svd(m, compute_uv=False)
        smax = ref[0]
        # U, V rotations; sigma sorted, only the last may be negative
        assert rotation_error(U) < tol and rotation_error(V) < tol, f"U/V not rotations: {what}"
        assert (sig[:-1] >= 0).all(), f"sigma {sig}: {what}"
        assert (np.diff(sig[:-1]) <= 0).all() and sig[-2] >= abs(sig[-1]) - tol * smax, \
            f"sigma {sig} not sorted: {what}"
        # singular values against NumPy, reconstruction
        assert np.abs(np.abs(sig) - ref).max() <= tol * smax, f"sigma {sig} vs numpy {ref}: {what}"
        assert np.abs(U @ S @ V.T - m).max() <= tol * smax, f"U S V^T != M: {what}"
        det = np.linalg.det(m / smax) if smax > 0 else 0.0  # scaled: no underflow
        if ref[-1] > 1e3 * u * smax:  # det M clearly nonzero: its sign is sigma's last
            assert np.sign(sig[-1]) == np.sign(det), f"sign of sigma {sig}: {what}"
        # polar: R a rotation, P symmetric, R P = M; for det M > 0 the
        # unique polar factor (NumPy's U V^T) when M is well conditioned
        assert rotation_error(R) < tol, f"R not a rotation: {what}"
        assert np.array_equal(P, P.T), f"P not symmetric: {what}"
        assert np.abs(R @ P - m).max() <= tol * smax, f"R P != M: {what}"
        if ref[-1] > 1e-2 * smax and det > 0:
            w, _, vt = np.linalg.svd(m)
            assert np.abs(R - w @ vt).max() <= tol * smax / ref[-1], f"polar R: {what}"
            assert np.linalg.eigvalsh(P).min() > 0, f"polar P not positive: {what}"
        # exact where the exact answer is representable
        if np.count_nonzero(m - np.diag(np.diag(m))) == 0:
            d = np.diag(m)
            want = np.sort(np.abs(d))[::-1].copy()
            if np.prod(np.sign(d)) < 0:
                want[-1] = -want[-1]
            assert np.array_equal(sig, want), f"diagonal: sigma {sig!r} != {want!r}: {what}"
            for x in (U, V):
                assert np.isin(x, (-1.0, 0.0, 1.0)).all(), f"diagonal: U, V {U!r} {V!r}: {what}"
            assert np.array_equal(U @ S @ V.T, m), f"diagonal: U S V^T not exact: {what}"
            if (d > 0).all():
                assert np.array_equal(R, eye) and np.array_equal(P, m), \
                    f"positive diagonal: polar R {R!r} P {P!r}: {what}"
        if np.array_equal(m, eye):
            for x in (U, S, V, R, P):
                assert np.array_equal(x, eye), f"identity: {x!r}"


def test_svd_integer_matrix_is_f32(fb):
    """An integer matrix is decomposed in f32 (docs/language.md)."""
    src = """
layout { place M: i32[2][2], S: f32[2][2], U: f32[2][2] }
kernel go() {
  M[] = [[3, 0], [0, -4]]
  let (u, s, v) = svd(M[])
  S[] = s
  U[] = u @ s @ transpose(v)
}
"""
    with fb.session(src) as s:
        s.kernels.go()
        assert np.array_equal(s.fields.S.to_numpy(), [[4, 0], [0, -3]])
        assert np.array_equal(s.fields.U.to_numpy(), [[3, 0], [0, -4]])
