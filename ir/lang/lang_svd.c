/* svd(M) and polar(M) for 2x2 and 3x3 matrices, emitted as straight-line
 * IR (no loops, no branches: selects only).
 *
 * 2x2: closed form (svd2_core), no iterations. Write M = [[a, b], [c, d]]
 * as E = (a+d)/2, F = (a-d)/2, G = (c+b)/2, H = (c-b)/2, so that
 * M = Q Rot(alpha) + W Refl(beta) with Q = |(E, H)|, W = |(F, G)|,
 * Rot(alpha) = [[E, -H], [H, E]] / Q. R = Rot(alpha) is the polar rotation
 * and S = R^T M = Q I + [[tau, q], [q, -tau]] with (tau, q) = (F, G)
 * rotated by -alpha (so |(tau, q)| = W). S's eigenvalues are Q + W and
 * Q - W, its leading eigenvector the half angle of (tau, q), found without
 * trigonometry by normalizing (W + tau, q) (or (q, W - tau) when tau < 0,
 * which avoids cancellation). So V = Rot(theta), U = R V, sigma = (Q + W,
 * Q - W): sigma_0 >= |sigma_1|, and sigma_1 < 0 exactly when det M =
 * Q^2 - W^2 < 0. Two square roots and two divisions, against about eleven
 * for two Jacobi sweeps; a (near) zero Q or W (M a reflection-like or a
 * multiple of a rotation) falls back to R = I or V = I, which is then exact
 * to within that tiny Q or W.
 *
 * 3x3: one-sided Jacobi (Hestenes): B = M, V = I; each rotation of a column pair
 * (p, q) makes columns p and q of B orthogonal and applies the same rotation
 * to V, so B = M V holds throughout. After a fixed number of sweeps the
 * columns are sorted by length (a swap negates one column so det V stays
 * +1). Then sigma_i = |B_i| and U_i = B_i / sigma_i for the leading columns;
 * the last column of U completes a right-handed basis (cross product) and
 * its sigma is B_last . U_last, which is negative when det M < 0. So U and
 * V are rotations and M = U diag(sigma) V^T.
 * polar: R = U V^T (a rotation), S = V diag(sigma) V^T, M = R S (2x2: R
 * and S = Q I + [[tau, q], [q, -tau]] straight from the closed form). */
#include "lang_internal.h"

typedef struct svdc {
  lower *L;
  fb_type t;
  int zero, one, two, mone;
} svdc;

static int K(svdc *c, double f) { return lw_const(c->L, c->t, f, (int64_t)f); }
static int add(svdc *c, int a, int b) { return lw_add(c->L, a, b); }
static int sub(svdc *c, int a, int b) { return lw_sub(c->L, a, b); }
static int mul(svdc *c, int a, int b) { return lw_mul(c->L, a, b); }
static int sel(svdc *c, int k, int a, int b) { return lw_select(c->L, k, a, b); }

/* sum over rows i of X[i][p] * Y[i][q] (n x n, row-major ids) */
static int coldot(svdc *c, const int *X, int p, const int *Y, int q, int n) {
  int s = mul(c, X[p], Y[q]);
  for (int i = 1; i < n; i++) s = add(c, s, mul(c, X[i * n + p], Y[i * n + q]));
  return s;
}

static void rotate(svdc *c, int *B, int *V, int n, int p, int q) {
  lower *L = c->L;
  int alpha = coldot(c, B, p, B, p, n), beta = coldot(c, B, q, B, q, n);
  int gamma = coldot(c, B, p, B, q, n);
  int is0 = lw_bin(L, FB_OP_EQ, gamma, c->zero);
  int g = sel(c, is0, c->one, gamma);
  int diff = sub(c, beta, alpha), den = mul(c, c->two, g);
  int zeta = lw_div(L, diff, den);
  int sgn = sel(c, lw_bin(L, FB_OP_GE, zeta, c->zero), c->one, c->mone);
  int root = lw_un(L, FB_OP_SQRT, add(c, c->one, mul(c, zeta, zeta)));
  int t = lw_div(L, sgn, add(c, lw_un(L, FB_OP_ABS, zeta), root));
  t = sel(c, is0, c->zero, t);
  int cs = lw_un(L, FB_OP_RSQRT, add(c, c->one, mul(c, t, t)));
  int sn = mul(c, cs, t);
  int *M[2] = {B, V};
  for (int m = 0; m < 2; m++)
    for (int i = 0; i < n; i++) {
      int bp = M[m][i * n + p], bq = M[m][i * n + q];
      int x1 = mul(c, cs, bp), x2 = mul(c, sn, bq);
      M[m][i * n + p] = sub(c, x1, x2);
      int y1 = mul(c, sn, bp), y2 = mul(c, cs, bq);
      M[m][i * n + q] = add(c, y1, y2);
    }
}

/* Put the longer of columns p, q first; the other is negated when moved. */
static void order(svdc *c, int *B, int *V, int *len, int n, int p, int q) {
  int sw = lw_bin(c->L, FB_OP_LT, len[p], len[q]);
  int *M[2] = {B, V};
  for (int m = 0; m < 2; m++)
    for (int i = 0; i < n; i++) {
      int bp = M[m][i * n + p], bq = M[m][i * n + q];
      M[m][i * n + p] = sel(c, sw, bq, bp);
      M[m][i * n + q] = sel(c, sw, lw_un(c->L, FB_OP_NEG, bp), bq);
    }
  int lp = len[p];
  len[p] = sel(c, sw, len[q], lp);
  len[q] = sel(c, sw, lp, len[q]);
}

/* Column p of B scaled to unit length, or fallback[] when it is (nearly)
 * zero: ok says whether it is long enough. */
static void unit_col(svdc *c, const int *B, int n, int p, int len, int ok, const int *fallback,
                     int *u) {
  int inv = lw_div(c->L, c->one, lw_un(c->L, FB_OP_SQRT, len));
  for (int i = 0; i < n; i++) u[i] = sel(c, ok, mul(c, B[i * n + p], inv), fallback[i]);
}

static void normalize3(svdc *c, int *v) {
  int l = mul(c, v[0], v[0]);
  for (int i = 1; i < 3; i++) l = add(c, l, mul(c, v[i], v[i]));
  int inv = lw_un(c->L, FB_OP_RSQRT, l);
  for (int i = 0; i < 3; i++) v[i] = mul(c, v[i], inv);
}

static void cross3(svdc *c, const int *a, const int *b, int *r) {
  for (int i = 0; i < 3; i++) {
    int j = (i + 1) % 3, k = (i + 2) % 3;
    int x = mul(c, a[j], b[k]), y = mul(c, a[k], b[j]);
    r[i] = sub(c, x, y);
  }
}

/* 3x3: U (row-major), sigma[3], V from M (already of float type t). */
static void svd3_core(svdc *c, const lval *m, int *U, int *sigma, int *V) {
  lower *L = c->L;
  int n = 3, B[9], len[3];
  for (int i = 0; i < n * n; i++) {
    B[i] = m->id[i];
    V[i] = i / n == i % n ? c->one : c->zero;
  }
  int sweeps = c->t == FB_T_F64 ? 8 : 6;
  for (int s = 0; s < sweeps; s++)
    for (int p = 0; p < n; p++)
      for (int q = p + 1; q < n; q++) rotate(c, B, V, n, p, q);
  for (int p = 0; p < n; p++) len[p] = coldot(c, B, p, B, p, n);
  order(c, B, V, len, n, 0, 1);
  order(c, B, V, len, n, 1, 2);
  order(c, B, V, len, n, 0, 1);
  int u[3][3];
  int tiny = K(c, c->t == FB_T_F64 ? 1e-300 : 1e-30);
  int e0[3] = {c->one, c->zero, c->zero};
  unit_col(c, B, n, 0, len[0], lw_bin(L, FB_OP_GT, len[0], tiny), e0, u[0]);
  sigma[0] = lw_un(L, FB_OP_SQRT, len[0]);
  {
    /* a unit vector perpendicular to u0 for a (nearly) rank-1 M */
    int ex[3] = {c->one, c->zero, c->zero}, ey[3] = {c->zero, c->one, c->zero}, pa[3], pb[3],
        perp[3];
    cross3(c, u[0], ex, pa);
    cross3(c, u[0], ey, pb);
    int ax = lw_un(L, FB_OP_ABS, u[0][0]), lim = K(c, 0.6);
    int use_a = lw_bin(L, FB_OP_LT, ax, lim);
    for (int i = 0; i < 3; i++) perp[i] = sel(c, use_a, pa[i], pb[i]);
    normalize3(c, perp);
    double eps2 = c->t == FB_T_F64 ? 1e-24 : 1e-12;
    int rel = mul(c, K(c, eps2), len[0]);
    int ok1 = lw_bin(L, FB_OP_GT, len[1], rel), ok2 = lw_bin(L, FB_OP_GT, len[1], tiny);
    int ok = lw_bin(L, FB_OP_AND, ok1, ok2);
    unit_col(c, B, n, 1, len[1], ok, perp, u[1]);
    sigma[1] = sel(c, ok, lw_un(L, FB_OP_SQRT, len[1]), c->zero);
    cross3(c, u[0], u[1], u[2]);
  }
  int last = n - 1;
  int bl[3] = {0, 0, 0};
  for (int i = 0; i < n; i++) bl[i] = B[i * n + last];
  int sl = mul(c, bl[0], u[last][0]);
  for (int i = 1; i < n; i++) sl = add(c, sl, mul(c, bl[i], u[last][i]));
  sigma[last] = sl;
  for (int r = 0; r < n; r++)
    for (int col = 0; col < n; col++) U[r * n + col] = u[col][r];
}

/* 2x2 closed form (see the top of the file). R = [[cr, -sr], [sr, cr]];
 * ps, when not NULL, gets polar's S = R^T M (row-major, symmetric). */
static void svd2_core(svdc *c, const lval *m, int *U, int *sigma, int *V, int *cs, int *ps) {
  lower *L = c->L;
  int a = m->id[0], b = m->id[1], cc = m->id[2], d = m->id[3];
  int half = K(c, 0.5);
  int tiny = K(c, c->t == FB_T_F64 ? 1e-300 : 1e-30);
  int E = mul(c, add(c, a, d), half), F = mul(c, sub(c, a, d), half);
  int G = mul(c, add(c, cc, b), half), H = mul(c, sub(c, cc, b), half);
  int q2 = add(c, mul(c, E, E), mul(c, H, H));
  int w2 = add(c, mul(c, F, F), mul(c, G, G));
  int Q = lw_un(L, FB_OP_SQRT, q2), W = lw_un(L, FB_OP_SQRT, w2);
  /* polar rotation; R = I when Q is (nearly) zero */
  int okq = lw_bin(L, FB_OP_GT, q2, tiny);
  int invq = lw_div(L, c->one, sel(c, okq, Q, c->one));
  int cr = sel(c, okq, mul(c, E, invq), c->one), sr = sel(c, okq, mul(c, H, invq), c->zero);
  /* S = Q I + [[tau, q], [q, -tau]] */
  int tau = add(c, mul(c, F, cr), mul(c, G, sr));
  int q = sub(c, mul(c, G, cr), mul(c, F, sr));
  /* half angle of (tau, q) / W: the eigenvector of S for Q + W */
  int pos = lw_bin(L, FB_OP_GE, tau, c->zero);
  int hx = sel(c, pos, add(c, W, tau), q), hy = sel(c, pos, q, sub(c, W, tau));
  int h2 = add(c, mul(c, hx, hx), mul(c, hy, hy));
  int okh = lw_bin(L, FB_OP_GT, h2, tiny);
  int invh = lw_div(L, c->one, lw_un(L, FB_OP_SQRT, sel(c, okh, h2, c->one)));
  int cv = sel(c, okh, mul(c, hx, invh), c->one), sv = sel(c, okh, mul(c, hy, invh), c->zero);
  int cu = sub(c, mul(c, cr, cv), mul(c, sr, sv)), su = add(c, mul(c, sr, cv), mul(c, cr, sv));
  int nsv = lw_un(L, FB_OP_NEG, sv), nsu = lw_un(L, FB_OP_NEG, su);
  V[0] = cv, V[1] = nsv, V[2] = sv, V[3] = cv;
  U[0] = cu, U[1] = nsu, U[2] = su, U[3] = cu;
  sigma[0] = add(c, Q, W);
  sigma[1] = sub(c, Q, W);
  if (cs) cs[0] = cr, cs[1] = sr;
  if (ps) {
    ps[0] = add(c, Q, tau);
    ps[1] = q;
    ps[2] = q;
    ps[3] = sub(c, Q, tau);
  }
}

static void svd_core(svdc *c, const lval *m, int *U, int *sigma, int *V) {
  if (m->rows == 2)
    svd2_core(c, m, U, sigma, V, NULL, NULL);
  else
    svd3_core(c, m, U, sigma, V);
}

static void setup(svdc *c, lower *L, lval *m) {
  fb_type t = lv_default_type(m);
  c->L = L;
  c->t = fb_type_is_float(t) ? t : FB_T_F32;
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
  int n = m->rows, U[9], V[9], sig[3], S[9];
  svd_core(&c, m, U, sig, V);
  for (int i = 0; i < n * n; i++) S[i] = i / n == i % n ? sig[i / n] : c.zero;
  as_matrix(u, c.t, n, U);
  as_matrix(s, c.t, n, S);
  as_matrix(v, c.t, n, V);
  return 0;
}

int lang_polar(lower *L, lval *m, lval *r, lval *s) {
  svdc c;
  setup(&c, L, m);
  int n = m->rows, U[9], V[9], sig[3], R[9], S[9];
  if (n == 2) {
    int cs[2];
    svd2_core(&c, m, U, sig, V, cs, S);
    R[0] = cs[0], R[1] = lw_un(L, FB_OP_NEG, cs[1]), R[2] = cs[1], R[3] = cs[0];
    as_matrix(r, c.t, n, R);
    as_matrix(s, c.t, n, S);
    return 0;
  }
  svd3_core(&c, m, U, sig, V);
  for (int i = 0; i < n; i++)
    for (int j = 0; j < n; j++) {
      int acc = -1, accs = -1;
      for (int k = 0; k < n; k++) {
        int rt = mul(&c, U[i * n + k], V[j * n + k]);              /* (U V^T)_ij */
        int st = mul(&c, mul(&c, V[i * n + k], sig[k]), V[j * n + k]); /* (V S V^T)_ij */
        acc = acc < 0 ? rt : add(&c, acc, rt);
        accs = accs < 0 ? st : add(&c, accs, st);
      }
      R[i * n + j] = acc;
      S[i * n + j] = accs;
    }
  as_matrix(r, c.t, n, R);
  as_matrix(s, c.t, n, S);
  return 0;
}
