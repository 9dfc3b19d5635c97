/* svd(M) and polar(M) for 2x2 and 3x3 matrices, emitted as straight-line
 * IR (no loops, no branches: selects only). docs/language.md states the
 * conventions and the accuracy; python/tests/test_svd.py checks them
 * against NumPy.
 *
 * Conventions: M = U diag(sigma) V^T with U and V rotations (det +1),
 * sigma_0 >= sigma_1 >= |sigma_last|, and sigma_last < 0 exactly when
 * det M < 0. polar: M = R S, R a rotation, S symmetric (positive
 * semi-definite when det M >= 0).
 *
 * Exactness. Every step is arranged so that an input whose answer is
 * representable gets it bit for bit: the matrix is first scaled by a power
 * of two (exact) so that its largest entry lies in [1, 2), which also keeps
 * every square and sum of squares far from overflow and underflow; a
 * rotation whose off-diagonal term is zero (or negligible: below the unit
 * roundoff relative to the diagonal) is skipped, not computed as cos = 1,
 * sin = 0 from an angle; unit vectors come from dividing by a norm, never
 * multiplying by a reciprocal (x / |x| is exactly +-1, x * (1 / |x|) need
 * not be); norms are max * sqrt(sum (x / max)^2), exact for a vector with
 * one nonzero entry. So the identity gives U = V = I and sigma = 1, and a
 * diagonal matrix its diagonal (absolute values in decreasing order, the
 * last negated when det < 0), with signed permutations for U and V.
 *
 * 2x2: closed form, no iterations. R is the rotation by the angle of
 * (a + d, c - b) for M = [[a, b], [c, d]] (hypot without overflow); then
 * S = R^T M is symmetric (its antisymmetric part vanishes by construction;
 * the rounding residue is averaged away) with trace |(a + d, c - b)| >= 0,
 * so its eigenvalues l0 + l1 >= 0. One Jacobi rotation (Rutishauser's
 * stable formulas: t = sgn(tau) / (|tau| + sqrt(1 + tau^2)), eigenvalues
 * p - t q and r + t q) diagonalizes S = V diag(l) V^T; sorting l swaps V's
 * columns (negating one, so V stays a rotation); U = R V. polar is R and S.
 *
 * 3x3: one-sided Jacobi (Hestenes): B = M, V = I; each rotation of a column
 * pair (p, q) makes columns p and q of B orthogonal and applies the same
 * rotation to V, so B = M V holds throughout; a pair already orthogonal to
 * working precision (|b_p . b_q| <= u |b_p| |b_q|) is left alone. After a
 * fixed number of sweeps (converged for any input: cyclic Jacobi converges
 * quadratically) the columns are sorted by length (a swap negates one
 * column so det V stays +1). sigma_i = |B_i| and U_i = B_i / sigma_i for the
 * two leading columns (a unit vector perpendicular to U_0 when B_1 is
 * negligible, so rank-deficient and zero matrices still get a rotation);
 * U's last column completes a right-handed basis (cross product) and its
 * sigma is B_last . U_last, negative when det M < 0.
 * polar: R = U V^T, S = V diag(sigma) V^T (upper triangle computed, lower
 * mirrored, so S is exactly symmetric). */
#include <math.h>

#include "lang_internal.h"

typedef struct svdc {
  lower *L;
  fb_type t;
  double u; /* unit roundoff of t */
  int zero, one, two, mone;
} svdc;

/* a constant of the matrix's type: converted as at run time (fb_value_cast
 * saturates; a C cast of 2^64 to an integer would be undefined) */
static int K(svdc *c, double f) { return fb_b_const(&c->L->b, fb_value_cast(fb_value_f64(f), c->t)); }
static int add(svdc *c, int a, int b) { return lw_add(c->L, a, b); }
static int sub(svdc *c, int a, int b) { return lw_sub(c->L, a, b); }
static int mul(svdc *c, int a, int b) { return lw_mul(c->L, a, b); }
static int dvd(svdc *c, int a, int b) { return lw_div(c->L, a, b); }
static int sel(svdc *c, int k, int a, int b) { return lw_select(c->L, k, a, b); }
static int bin(svdc *c, int op, int a, int b) { return lw_bin(c->L, op, a, b); }
static int neg(svdc *c, int a) { return lw_un(c->L, FB_OP_NEG, a); }
static int fabs_(svdc *c, int a) { return lw_un(c->L, FB_OP_ABS, a); }
static int sqrt_(svdc *c, int a) { return lw_un(c->L, FB_OP_SQRT, a); }

/* Powers of two inv and sc = 1 / inv with max * inv in [1, 2) for a finite
 * max > 0 (max * inv >= 2^-51 for a subnormal one); 1 for 0, inf, NaN. A
 * binary cascade over the exponent: scaling by them is exact. */
static void pow2_scale(svdc *c, int max, int *inv, int *sc) {
  int top = c->t == FB_T_F64 ? 512 : 64;
  int x = max, i = c->one, s = c->one;
  for (int k = top; k >= 1; k /= 2) { /* x >= 2^k: divide by 2^k */
    int big = bin(c, FB_OP_GE, x, K(c, ldexp(1, k)));
    int dn = K(c, ldexp(1, -k)), up = K(c, ldexp(1, k));
    x = sel(c, big, mul(c, x, dn), x);
    i = sel(c, big, mul(c, i, dn), i);
    s = sel(c, big, mul(c, s, up), s);
  }
  for (int k = top; k >= 1; k /= 2) { /* 0 < x < 2^(1-k): multiply by 2^k */
    int pos = bin(c, FB_OP_GT, x, c->zero);
    int small = bin(c, FB_OP_AND, pos, bin(c, FB_OP_LT, x, K(c, ldexp(1, 1 - k))));
    int dn = K(c, ldexp(1, -k)), up = K(c, ldexp(1, k));
    x = sel(c, small, mul(c, x, up), x);
    i = sel(c, small, mul(c, i, up), i);
    s = sel(c, small, mul(c, s, dn), s);
  }
  *inv = i;
  *sc = s;
}

/* The n*n entries of m scaled by a power of two (see pow2_scale) into out;
 * *sc undoes it. */
static void scale_matrix(svdc *c, const int *m, int n, int *out, int *sc) {
  int mx = fabs_(c, m[0]), inv;
  for (int i = 1; i < n * n; i++) mx = bin(c, FB_OP_MAX, mx, fabs_(c, m[i]));
  pow2_scale(c, mx, &inv, sc);
  for (int i = 0; i < n * n; i++) out[i] = mul(c, m[i], inv);
}

/* |v| for v of length n as max * sqrt(sum (v / max)^2); w[] gets v / max
 * and *ss the sum (1 for a vector with one nonzero entry: exact). */
static int norm_n(svdc *c, const int *v, int n, int *w, int *ss) {
  int mx = fabs_(c, v[0]);
  for (int i = 1; i < n; i++) mx = bin(c, FB_OP_MAX, mx, fabs_(c, v[i]));
  int ok = bin(c, FB_OP_GT, mx, c->zero);
  int d = sel(c, ok, mx, c->one);
  int s = -1;
  for (int i = 0; i < n; i++) {
    w[i] = dvd(c, v[i], d);
    int sq = mul(c, w[i], w[i]);
    s = s < 0 ? sq : add(c, s, sq);
  }
  *ss = s;
  return mul(c, mx, sqrt_(c, s));
}

/* sqrt(1 + x^2) without overflow for any finite x. */
static int hyp1(svdc *c, int x) {
  int ax = fabs_(c, x);
  int big = bin(c, FB_OP_GT, ax, c->one);
  int r = dvd(c, c->one, sel(c, big, ax, c->one));
  int far = mul(c, ax, sqrt_(c, add(c, c->one, mul(c, r, r))));
  int near = sqrt_(c, add(c, c->one, mul(c, ax, ax)));
  return sel(c, big, far, near);
}

/* The Jacobi rotation that diagonalizes [[p, g], [g, r]]: *t = tan of its
 * angle (0, exactly, when |g| <= u sqrt(|p|) sqrt(|r|)), *cs, *sn. The
 * diagonal becomes p - t g, r + t g. */
static void jacobi(svdc *c, int p, int g, int r, int *t, int *cs, int *sn) {
  int lim = mul(c, mul(c, K(c, c->u), sqrt_(c, fabs_(c, p))), sqrt_(c, fabs_(c, r)));
  int skip = bin(c, FB_OP_LE, fabs_(c, g), lim);
  int gg = sel(c, skip, c->one, g);
  int tau = dvd(c, sub(c, r, p), mul(c, c->two, gg));
  int sgn = sel(c, bin(c, FB_OP_GE, tau, c->zero), c->one, c->mone);
  int tt = dvd(c, sgn, add(c, fabs_(c, tau), hyp1(c, tau)));
  *t = sel(c, skip, c->zero, tt);
  *cs = sel(c, skip, c->one, dvd(c, c->one, hyp1(c, tt)));
  *sn = sel(c, skip, c->zero, mul(c, *cs, tt));
}

/* sum over rows i of X[i][p] * Y[i][q] (n x n, row-major ids) */
static int coldot(svdc *c, const int *X, int p, const int *Y, int q, int n) {
  int s = mul(c, X[p], Y[q]);
  for (int i = 1; i < n; i++) s = add(c, s, mul(c, X[i * n + p], Y[i * n + q]));
  return s;
}

/* One-sided Jacobi rotation of columns p, q of B (and of V). */
static void rotate(svdc *c, int *B, int *V, int n, int p, int q) {
  int alpha = coldot(c, B, p, B, p, n), beta = coldot(c, B, q, B, q, n);
  int gamma = coldot(c, B, p, B, q, n);
  int t, cs, sn;
  jacobi(c, alpha, gamma, beta, &t, &cs, &sn);
  int *M[2] = {B, V};
  for (int m = 0; m < 2; m++)
    for (int i = 0; i < n; i++) {
      int bp = M[m][i * n + p], bq = M[m][i * n + q];
      M[m][i * n + p] = sub(c, mul(c, cs, bp), mul(c, sn, bq));
      M[m][i * n + q] = add(c, mul(c, sn, bp), mul(c, cs, bq));
    }
}

/* Put the longer of columns p, q first; the other is negated when moved. */
static void order(svdc *c, int *B, int *V, int *len, int n, int p, int q) {
  int sw = bin(c, FB_OP_LT, len[p], len[q]);
  int *M[2] = {B, V};
  for (int m = 0; m < 2; m++)
    for (int i = 0; i < n; i++) {
      int bp = M[m][i * n + p], bq = M[m][i * n + q];
      M[m][i * n + p] = sel(c, sw, bq, bp);
      M[m][i * n + q] = sel(c, sw, neg(c, bp), bq);
    }
  int lp = len[p];
  len[p] = sel(c, sw, len[q], lp);
  len[q] = sel(c, sw, lp, len[q]);
}

static void cross3(svdc *c, const int *a, const int *b, int *r) {
  for (int i = 0; i < 3; i++) {
    int j = (i + 1) % 3, k = (i + 2) % 3;
    r[i] = sub(c, mul(c, a[j], b[k]), mul(c, a[k], b[j]));
  }
}

/* Column p of B as a unit vector (w / sqrt(ss) from norm_n), or fb[] when
 * ok is false. */
static void unit_col(svdc *c, const int *w, int ss, int ok, const int *fb, int *u) {
  int d = sqrt_(c, sel(c, ok, ss, c->one));
  for (int i = 0; i < 3; i++) u[i] = sel(c, ok, dvd(c, w[i], d), fb[i]);
}

/* 3x3 on the scaled matrix s: U (row-major), sigma[3], V. */
static void svd3_core(svdc *c, const int *s, int *U, int *sigma, int *V) {
  int n = 3, B[9], nrm[3], w[3][3], ss[3];
  for (int i = 0; i < n * n; i++) {
    B[i] = s[i];
    V[i] = i / n == i % n ? c->one : c->zero;
  }
  int sweeps = c->t == FB_T_F64 ? 8 : 6;
  for (int k = 0; k < sweeps; k++)
    for (int p = 0; p < n; p++)
      for (int q = p + 1; q < n; q++) rotate(c, B, V, n, p, q);
  for (int p = 0; p < n; p++) {
    int col[3] = {B[p], B[n + p], B[2 * n + p]};
    nrm[p] = norm_n(c, col, n, w[p], &ss[p]);
  }
  order(c, B, V, nrm, n, 0, 1);
  order(c, B, V, nrm, n, 1, 2);
  order(c, B, V, nrm, n, 0, 1);
  for (int p = 0; p < 2; p++) { /* the unit vectors of the sorted columns */
    int col[3] = {B[p], B[n + p], B[2 * n + p]};
    nrm[p] = norm_n(c, col, n, w[p], &ss[p]);
  }
  int u[3][3];
  int e0[3] = {c->one, c->zero, c->zero};
  unit_col(c, w[0], ss[0], bin(c, FB_OP_GT, nrm[0], c->zero), e0, u[0]);
  sigma[0] = nrm[0];
  /* a unit vector perpendicular to u0 (for a rank-1 or zero M): e_y, or e_x
   * when u0 is close to e_y, minus its projection on u0 */
  int use_y = bin(c, FB_OP_LT, fabs_(c, u[0][1]), K(c, 0.6));
  int e[3] = {sel(c, use_y, c->zero, c->one), sel(c, use_y, c->one, c->zero), c->zero};
  int pr = add(c, mul(c, e[0], u[0][0]), mul(c, e[1], u[0][1]));
  int perp[3], pw[3], pss;
  for (int i = 0; i < 3; i++) perp[i] = sub(c, e[i], mul(c, pr, u[0][i]));
  norm_n(c, perp, 3, pw, &pss);
  unit_col(c, pw, pss, bin(c, FB_OP_GT, pss, c->zero), e, perp);
  int ok1 = bin(c, FB_OP_GT, nrm[1], mul(c, K(c, c->u), nrm[0]));
  unit_col(c, w[1], ss[1], ok1, perp, u[1]);
  sigma[1] = nrm[1];
  cross3(c, u[0], u[1], u[2]);
  int sl = mul(c, B[2], u[2][0]);
  for (int i = 1; i < n; i++) sl = add(c, sl, mul(c, B[i * n + 2], u[2][i]));
  sigma[2] = sl;
  for (int r = 0; r < n; r++)
    for (int col = 0; col < n; col++) U[r * n + col] = u[col][r];
}

/* 2x2 on the scaled matrix s (see the top of the file). R = [[cr, -sr],
 * [sr, cr]] into rs[2] and polar's S = R^T M (row-major, symmetric) into
 * ps[4] when not NULL. */
static void svd2_core(svdc *c, const int *s, int *U, int *sigma, int *V, int *rs, int *ps) {
  int a = s[0], b = s[1], cc = s[2], d = s[3];
  int x = add(c, a, d), y = sub(c, cc, b), w[2], ss;
  int xy[2] = {x, y};
  int r = norm_n(c, xy, 2, w, &ss);
  int okr = bin(c, FB_OP_GT, r, c->zero);
  int rr = sel(c, okr, r, c->one);
  int cr = sel(c, okr, dvd(c, x, rr), c->one), sr = sel(c, okr, dvd(c, y, rr), c->zero);
  /* S = R^T M, symmetrized */
  int p = add(c, mul(c, cr, a), mul(c, sr, cc));
  int s01 = add(c, mul(c, cr, b), mul(c, sr, d));
  int s10 = sub(c, mul(c, cr, cc), mul(c, sr, a));
  int q = mul(c, add(c, s01, s10), K(c, 0.5));
  int z = sub(c, mul(c, cr, d), mul(c, sr, b));
  int t, cs, sn;
  jacobi(c, p, q, z, &t, &cs, &sn);
  int l0 = sub(c, p, mul(c, t, q)), l1 = add(c, z, mul(c, t, q));
  /* V = [[cs, sn], [-sn, cs]] as Rot(vc, vs) = [[vc, -vs], [vs, vc]];
   * swapped columns [v1, -v0] when l0 < l1 */
  int sw = bin(c, FB_OP_LT, l0, l1);
  int vc = sel(c, sw, sn, cs), vs = sel(c, sw, cs, neg(c, sn));
  int uc = sub(c, mul(c, cr, vc), mul(c, sr, vs)), us = add(c, mul(c, sr, vc), mul(c, cr, vs));
  V[0] = vc, V[1] = neg(c, vs), V[2] = vs, V[3] = vc;
  U[0] = uc, U[1] = neg(c, us), U[2] = us, U[3] = uc;
  sigma[0] = sel(c, sw, l1, l0);
  sigma[1] = sel(c, sw, l0, l1);
  if (rs) rs[0] = cr, rs[1] = sr;
  if (ps) ps[0] = p, ps[1] = q, ps[2] = q, ps[3] = z;
}

static void setup(svdc *c, lower *L, lval *m) {
  fb_type t = lv_default_type(m);
  c->L = L;
  c->t = fb_type_is_float(t) ? t : FB_T_F32;
  c->u = c->t == FB_T_F64 ? ldexp(1, -53) : ldexp(1, -24);
  lv_materialize(L, m, c->t);
  c->zero = K(c, 0);
  c->one = K(c, 1);
  c->two = K(c, 2);
  c->mone = K(c, -1);
}

static void as_matrix(lval *out, fb_type t, int n, const int *ids) {
  lv_mat_init(out, t, n, n);
  for (int i = 0; i < n * n; i++) out->id[i] = ids[i];
}

int lang_svd(lower *L, lval *m, lval *u, lval *s, lval *v) {
  svdc c;
  setup(&c, L, m);
  int n = m->rows, U[9], V[9], sig[3], S[9], sm[9], sc;
  scale_matrix(&c, m->id, n, sm, &sc);
  if (n == 2)
    svd2_core(&c, sm, U, sig, V, NULL, NULL);
  else
    svd3_core(&c, sm, U, sig, V);
  for (int i = 0; i < n * n; i++) S[i] = i / n == i % n ? mul(&c, sig[i / n], sc) : c.zero;
  as_matrix(u, c.t, n, U);
  as_matrix(s, c.t, n, S);
  as_matrix(v, c.t, n, V);
  return 0;
}

int lang_polar(lower *L, lval *m, lval *r, lval *s) {
  svdc c;
  setup(&c, L, m);
  int n = m->rows, U[9], V[9], sig[3], R[9], S[9], sm[9], sc;
  scale_matrix(&c, m->id, n, sm, &sc);
  if (n == 2) {
    int rs[2];
    svd2_core(&c, sm, U, sig, V, rs, S);
    R[0] = rs[0], R[1] = neg(&c, rs[1]), R[2] = rs[1], R[3] = rs[0];
    for (int i = 0; i < 4; i++) S[i] = mul(&c, S[i], sc);
    as_matrix(r, c.t, n, R);
    as_matrix(s, c.t, n, S);
    return 0;
  }
  svd3_core(&c, sm, U, sig, V);
  for (int k = 0; k < n; k++) sig[k] = mul(&c, sig[k], sc);
  for (int i = 0; i < n; i++)
    for (int j = 0; j < n; j++) {
      int acc = -1, accs = -1;
      for (int k = 0; k < n; k++) {
        int rt = mul(&c, U[i * n + k], V[j * n + k]); /* (U V^T)_ij */
        acc = acc < 0 ? rt : add(&c, acc, rt);
        if (j < i) continue;
        int st = mul(&c, mul(&c, V[i * n + k], sig[k]), V[j * n + k]); /* (V S V^T)_ij */
        accs = accs < 0 ? st : add(&c, accs, st);
      }
      R[i * n + j] = acc;
      if (j >= i) S[i * n + j] = S[j * n + i] = accs;
    }
  as_matrix(r, c.t, n, R);
  as_matrix(s, c.t, n, S);
  return 0;
}
