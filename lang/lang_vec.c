/* Operators on scalarized values: binary arithmetic, bit and comparison
 * operators component-wise with scalar broadcast, constant folding of
 * untyped literals, `**`, the matrix product `@`, vector/matrix literals
 * and the linear-algebra builtins (dot cross norm norm_sqr normalized
 * transpose outer trace determinant inverse identity). Everything is
 * emitted as scalar IR; nothing here allocates. */
#include <math.h>
#include <stdio.h>

#include "ir/arith.h"
#include "lang_internal.h"

#define ERR(L, at, ...) ((L)->errors++, lang_err((L)->d, (at)->line, (at)->col, __VA_ARGS__))

void lv_vec_init(lval *v, fb_type t, int n) {
  memset(v, 0, sizeof *v);
  v->kind = VK_VEC;
  v->t = t;
  v->rows = (uint8_t)n;
  v->n = n;
}

void lv_mat_init(lval *v, fb_type t, int rows, int cols) {
  memset(v, 0, sizeof *v);
  v->kind = VK_MAT;
  v->t = t;
  v->rows = (uint8_t)rows;
  v->cols = (uint8_t)cols;
  v->n = rows * cols;
}

static const char *op_str(int op) {
  if (op == LOP_MIN) return "min";
  if (op == LOP_MAX) return "max";
  return lang_tok_name(op);
}

static int is_cmp_op(int op) {
  return op == T_EQ || op == T_NE || op == T_LT || op == T_LE || op == T_GT || op == T_GE;
}

/* ---------------------------------------------------------------- folding */

static int64_t ipow(int64_t b, int64_t e) {
  uint64_t r = 1, x = (uint64_t)b;
  while (e > 0) {
    if (e & 1) r *= x;
    x *= x;
    e >>= 1;
  }
  return (int64_t)r;
}

/* The IR op a binary operator folds as (FB_OP__COUNT: none; `/` and `**`
 * on integers are special). */
static fb_op fold_op(int op) {
  switch (op) {
  case T_PLUS: return FB_OP_ADD;
  case T_MINUS: return FB_OP_SUB;
  case T_STAR: return FB_OP_MUL;
  case T_SLASH: return FB_OP_DIV;
  case T_SLASHSLASH: return FB_OP_FLOORDIV;
  case T_PERCENT: return FB_OP_FLOORMOD;
  case T_STARSTAR: return FB_OP_POW;
  case T_AMP: return FB_OP_AND;
  case T_PIPE: return FB_OP_OR;
  case T_CARET: return FB_OP_XOR;
  case T_SHL: return FB_OP_SHL;
  case T_SHR: return FB_OP_SHR;
  case T_EQ: return FB_OP_EQ;
  case T_NE: return FB_OP_NE;
  case T_LT: return FB_OP_LT;
  case T_LE: return FB_OP_LE;
  case T_GT: return FB_OP_GT;
  case T_GE: return FB_OP_GE;
  case LOP_MIN: return FB_OP_MIN;
  case LOP_MAX: return FB_OP_MAX;
  default: return FB_OP__COUNT;
  }
}

/* Both operands untyped literals: compute at compile time. */
static int fold(lower *L, int op, const lval *a, const lval *b, lval *out, node *at) {
  int isf = a->lit == LIT_FLOAT || b->lit == LIT_FLOAT;
  int n = a->n > b->n ? a->n : b->n;
  *out = a->n >= b->n ? *a : *b;
  out->has_const = 1;
  out->lit = isf ? LIT_FLOAT : LIT_INT;
  if (is_cmp_op(op)) {
    out->lit = LIT_NONE;
    out->t = FB_T_BOOL;
  }
  if (!isf && (op == T_SLASH || (op == T_STARSTAR && b->ci[0] < 0))) out->lit = LIT_FLOAT;
  if (isf && (op == T_AMP || op == T_PIPE || op == T_CARET || op == T_SHL || op == T_SHR)) {
    ERR(L, at, "operator %s needs integer operands, found a float literal", op_str(op));
    return -1;
  }
  for (int c = 0; c < n; c++) {
    int ia = a->n == 1 ? 0 : c, ib = b->n == 1 ? 0 : c;
    double x = a->lit == LIT_INT ? (double)a->ci[ia] : a->cv[ia];
    double y = b->lit == LIT_INT ? (double)b->ci[ib] : b->cv[ib];
    int64_t i = a->ci[ia], j = b->ci[ib], ri = 0;
    double rf = 0;
    fb_op fop = fold_op(op);
    if (is_cmp_op(op)) {
      ri = isf ? fb_arith_compare(fop, FB_T_F64, fb_value_f64(x), fb_value_f64(y))
               : fb_arith_compare(fop, FB_T_I64, fb_value_i64(i), fb_value_i64(j));
      out->id[c] = lw_const(L, FB_T_BOOL, 0, ri);
      out->ci[c] = ri;
      continue;
    }
    /* untyped literals are i64 and f64 values: the IR's arithmetic on those */
    uint64_t u = 0;
    if (op == T_STARSTAR) ri = ipow(i, j);
    else if (op != T_SLASH && fb_arith_int_binop(fop, FB_T_I64, (uint64_t)i, (uint64_t)j, &u) == 0)
      ri = (int64_t)u;
    fb_arith_f64_binop(fop, x, y, &rf); /* not defined on the bit ops: rf stays 0 */
    if (!isf && op == T_SLASH) { /* true division of integers is in f32, as at run time */
      float q = 0;
      fb_arith_f32_binop(FB_OP_DIV, (float)fb_value_cast(fb_value_i64(i), FB_T_F32).v.f,
                         (float)fb_value_cast(fb_value_i64(j), FB_T_F32).v.f, &q);
      rf = q;
    }
    if (out->lit == LIT_INT) {
      out->ci[c] = ri;
      out->cv[c] = (double)ri;
    } else { /* a float result: float operands, or int / int, or int ** -k */
      out->cv[c] = rf;
      out->ci[c] = lang_f2i(rf);
    }
  }
  return 0;
}

/* ---------------------------------------------------------------- powers */

/* x ** k for a constant k >= 0 by repeated squaring. */
static int pow_const(lower *L, fb_type t, int x, int64_t k) {
  if (k == 0) return lw_const(L, t, 1, 1);
  int r = -1, p = x;
  while (k) {
    if (k & 1) r = r < 0 ? p : lw_mul(L, r, p);
    k >>= 1;
    if (k) p = lw_mul(L, p, p);
  }
  return r;
}

/* x ** e for integers at run time: a serial loop (e < 0 gives 1). */
static int pow_loop(lower *L, fb_type t, int x, int e) {
  int r = fb_b_alloca(&L->b, t), base = fb_b_alloca(&L->b, t), ev = fb_b_alloca(&L->b, t);
  fb_b_lstore(&L->b, r, lw_const(L, t, 1, 1));
  fb_b_lstore(&L->b, base, x);
  fb_b_lstore(&L->b, ev, e);
  int w = fb_b_while(&L->b);
  if (w < 0) return w;
  int saved = fb_b_enter(&L->b, L->k->stmts[w].body);
  int cur = fb_b_lload(&L->b, ev);
  int stop = fb_b_if(&L->b, lw_bin(L, FB_OP_LE, cur, lw_const(L, t, 0, 0)), 0);
  if (stop >= 0) {
    int s2 = fb_b_enter(&L->b, L->k->stmts[stop].body);
    fb_b_break(&L->b);
    fb_b_leave(&L->b, s2);
  }
  int low = lw_bin(L, FB_OP_AND, cur, lw_const(L, t, 1, 1));
  int odd = lw_bin(L, FB_OP_NE, low, lw_const(L, t, 0, 0));
  int mul = fb_b_if(&L->b, odd, 0);
  if (mul >= 0) {
    int s2 = fb_b_enter(&L->b, L->k->stmts[mul].body);
    int rv = fb_b_lload(&L->b, r), bv = fb_b_lload(&L->b, base);
    fb_b_lstore(&L->b, r, lw_mul(L, rv, bv));
    fb_b_leave(&L->b, s2);
  }
  int bv = fb_b_lload(&L->b, base);
  fb_b_lstore(&L->b, base, lw_mul(L, bv, bv));
  fb_b_lstore(&L->b, ev, lw_bin(L, FB_OP_SHR, cur, lw_const(L, t, 1, 1)));
  fb_b_leave(&L->b, saved);
  return fb_b_lload(&L->b, r);
}

/* ---------------------------------------------------------------- binary */

static int scalar_op(lower *L, int op, fb_type t, int x, int y) {
  switch (op) {
  case T_PLUS: return lw_add(L, x, y);
  case T_MINUS: return lw_sub(L, x, y);
  case T_STAR: return lw_mul(L, x, y);
  case T_SLASH:
    if (!fb_type_is_float(t)) {
      int fx = lw_cast(L, FB_T_F32, x), fy = lw_cast(L, FB_T_F32, y);
      return lw_div(L, fx, fy);
    }
    return lw_div(L, x, y);
  case T_SLASHSLASH: return lw_bin(L, FB_OP_FLOORDIV, x, y);
  case T_PERCENT: return lw_bin(L, FB_OP_FLOORMOD, x, y);
  case T_STARSTAR: return fb_type_is_float(t) ? lw_bin(L, FB_OP_POW, x, y) : pow_loop(L, t, x, y);
  case T_AMP: return lw_bin(L, FB_OP_AND, x, y);
  case T_PIPE: return lw_bin(L, FB_OP_OR, x, y);
  case T_CARET: return lw_bin(L, FB_OP_XOR, x, y);
  case T_SHL: return lw_bin(L, FB_OP_SHL, x, y);
  case T_SHR: return lw_bin(L, FB_OP_SHR, x, y);
  case T_EQ: return lw_bin(L, FB_OP_EQ, x, y);
  case T_NE: return lw_bin(L, FB_OP_NE, x, y);
  case T_LT: return lw_bin(L, FB_OP_LT, x, y);
  case T_LE: return lw_bin(L, FB_OP_LE, x, y);
  case T_GT: return lw_bin(L, FB_OP_GT, x, y);
  case T_GE: return lw_bin(L, FB_OP_GE, x, y);
  case LOP_MIN: return lw_bin(L, FB_OP_MIN, x, y);
  case LOP_MAX: return lw_bin(L, FB_OP_MAX, x, y);
  default: return -1;
  }
}

/* Which element types an operator accepts; NULL when t is fine. */
static const char *op_rejects(int op, fb_type t) {
  int isbool = t == FB_T_BOOL, isint = fb_type_is_int(t);
  switch (op) {
  case T_AMP:
  case T_PIPE:
  case T_CARET: return isbool || isint ? NULL : "integer or bool";
  case T_SHL:
  case T_SHR: return isint ? NULL : "integer";
  case T_EQ:
  case T_NE: return NULL;
  default: return isbool ? "numeric" : NULL;
  }
}

static int as_exponent(const lval *b, int64_t *k) {
  if (b->kind != VK_SCALAR || !b->has_const || b->lit == LIT_FLOAT) return 0;
  if (!b->lit && !fb_type_is_int(b->t)) return 0;
  *k = b->ci[0];
  return 1;
}

int lv_binary(lower *L, int op, lval *a, lval *b, lval *out, node *at) {
  char x[64], y[64];
  if (a->kind == VK_UNKNOWN || b->kind == VK_UNKNOWN) {
    lv_unknown(out);
    return 0;
  }
  if (a->kind == VK_VOID || a->kind == VK_TUPLE || b->kind == VK_VOID || b->kind == VK_TUPLE) {
    ERR(L, at, "operator %s needs values, found %s and %s", op_str(op), lv_str(a, x, sizeof x),
        lv_str(b, y, sizeof y));
    lv_unknown(out);
    return -1;
  }
  if (!lang_same_shape(a, b)) {
    ERR(L, at, "shape mismatch in %s: %s and %s", op_str(op), lv_str(a, x, sizeof x),
        lv_str(b, y, sizeof y));
    lv_unknown(out);
    return -1;
  }
  if (a->lit && b->lit) return fold(L, op, a, b, out, at) < 0 ? (lv_unknown(out), -1) : 0;
  /* a bool counts as the integer 0 or 1 (as in Python and Taichi) next to a
   * number, and on both sides of an operator that needs numbers */
  int ab = !a->lit && a->t == FB_T_BOOL, bb = !b->lit && b->t == FB_T_BOOL;
  if (ab != bb || (ab && bb && op_rejects(op, FB_T_BOOL))) {
    if (ab) lv_materialize(L, a, FB_T_I32);
    if (bb) lv_materialize(L, b, FB_T_I32);
  }
  fb_type t;
  const char *need = NULL;
  if (lang_common_type(a, b, &t) < 0 || (need = op_rejects(op, t))) {
    if (need)
      ERR(L, at, "operator %s needs %s operands, found %s and %s", op_str(op), need,
          lv_str(a, x, sizeof x), lv_str(b, y, sizeof y));
    else
      ERR(L, at, "operator %s cannot combine %s and %s", op_str(op), lv_str(a, x, sizeof x),
          lv_str(b, y, sizeof y));
    lv_unknown(out);
    return -1;
  }
  int64_t k;
  int const_pow =
      op == T_STARSTAR && as_exponent(b, &k) && k >= 0 && (fb_type_is_int(t) ? k <= 64 : k <= 4);
  lv_materialize(L, a, t);
  if (!const_pow) lv_materialize(L, b, t);
  lv_broadcast_like(a, b);
  if (!const_pow) lv_broadcast_like(b, a);
  *out = *a;
  out->has_const = 0;
  out->lit = LIT_NONE;
  if (is_cmp_op(op)) out->t = FB_T_BOOL;
  else if (op == T_SLASH && !fb_type_is_float(t)) out->t = FB_T_F32;
  for (int c = 0; c < a->n; c++)
    out->id[c] = const_pow ? pow_const(L, t, a->id[c], k) : scalar_op(L, op, t, a->id[c], b->id[c]);
  return 0;
}

/* ---------------------------------------------------------------- matmul */

static int numeric_pair(lower *L, lval *a, lval *b, fb_type *t, node *at, const char *what) {
  char x[64], y[64];
  if (lang_common_type(a, b, t) < 0 || *t == FB_T_BOOL) {
    ERR(L, at, "%s needs numeric operands, found %s and %s", what, lv_str(a, x, sizeof x),
        lv_str(b, y, sizeof y));
    return -1;
  }
  lv_materialize(L, a, *t);
  lv_materialize(L, b, *t);
  return 0;
}

/* sum over i of a[ai + i*as] * b[bi + i*bs] */
static int dot_n(lower *L, const lval *a, int ai, int as, const lval *b, int bi, int bs, int n) {
  int s = lw_mul(L, a->id[ai], b->id[bi]);
  for (int i = 1; i < n; i++) s = lw_add(L, s, lw_mul(L, a->id[ai + i * as], b->id[bi + i * bs]));
  return s;
}

int lv_matmul(lower *L, lval *a, lval *b, lval *out, node *at) {
  char x[64], y[64];
  if (a->kind == VK_UNKNOWN || b->kind == VK_UNKNOWN) {
    lv_unknown(out);
    return 0;
  }
  int ok = (a->kind == VK_VEC || a->kind == VK_MAT) && (b->kind == VK_VEC || b->kind == VK_MAT);
  int ak = a->kind == VK_MAT ? a->cols : a->rows; /* inner dimension of a */
  int bk = b->rows;
  if (!ok || ak != bk) {
    ERR(L, at, "operator '@' needs matching vector/matrix shapes, found %s @ %s",
        lv_str(a, x, sizeof x), lv_str(b, y, sizeof y));
    lv_unknown(out);
    return -1;
  }
  fb_type t;
  if (numeric_pair(L, a, b, &t, at, "operator '@'") < 0) {
    lv_unknown(out);
    return -1;
  }
  int n = ak;
  if (a->kind == VK_VEC && b->kind == VK_VEC) {
    lv_scalar(out, t, dot_n(L, a, 0, 1, b, 0, 1, n));
  } else if (a->kind == VK_MAT && b->kind == VK_VEC) {
    lv_vec_init(out, t, a->rows);
    for (int r = 0; r < a->rows; r++) out->id[r] = dot_n(L, a, r * a->cols, 1, b, 0, 1, n);
  } else if (a->kind == VK_VEC) {
    lv_vec_init(out, t, b->cols);
    for (int c = 0; c < b->cols; c++) out->id[c] = dot_n(L, a, 0, 1, b, c, b->cols, n);
  } else {
    lv_mat_init(out, t, a->rows, b->cols);
    for (int r = 0; r < a->rows; r++)
      for (int c = 0; c < b->cols; c++)
        out->id[r * b->cols + c] = dot_n(L, a, r * a->cols, 1, b, c, b->cols, n);
  }
  return 0;
}

/* ---------------------------------------------------------------- literals */

int lang_list(lower *L, node *e, lval *out) {
  lval el[4];
  char x[64];
  if (e->nkids > 4 || e->nkids < 1) {
    ERR(L, e, "vectors and matrices have 1 to 4 rows, found %d elements", e->nkids);
    lv_unknown(out);
    return -1;
  }
  int unknown = 0, bad = 0;
  for (int i = 0; i < e->nkids; i++) {
    if (lang_eval(L, e->kids[i], &el[i]) < 0) bad = 1;
    else if (el[i].kind == VK_UNKNOWN) unknown = 1;
  }
  if (bad || unknown) {
    lv_unknown(out);
    return bad ? -1 : 0;
  }
  int kind = el[0].kind, m = el[0].rows;
  for (int i = 0; i < e->nkids; i++) {
    if (el[i].kind != kind || (kind == VK_VEC && el[i].rows != m) ||
        (kind != VK_SCALAR && kind != VK_VEC)) {
      ERR(L, e->kids[i],
          "a vector literal holds scalars and a matrix literal equal-length rows; found %s",
          lv_str(&el[i], x, sizeof x));
      lv_unknown(out);
      return -1;
    }
  }
  /* common element type: untyped if every element is */
  lval acc = el[0];
  fb_type t = lv_default_type(&acc);
  for (int i = 1; i < e->nkids; i++) {
    if (lang_common_type(&acc, &el[i], &t) < 0) {
      ERR(L, e->kids[i], "elements of a vector literal must have one type; found %s",
          lv_str(&el[i], x, sizeof x));
      lv_unknown(out);
      return -1;
    }
    if (!(acc.lit && el[i].lit)) {
      acc.lit = LIT_NONE;
      acc.t = t;
    } else if (el[i].lit == LIT_FLOAT) acc.lit = LIT_FLOAT;
  }
  int lit = acc.lit;
  if (kind == VK_SCALAR) lv_vec_init(out, t, e->nkids);
  else lv_mat_init(out, t, e->nkids, m);
  out->lit = (uint8_t)lit;
  out->has_const = 1;
  int c = 0;
  for (int i = 0; i < e->nkids; i++) {
    if (!lit) lv_materialize(L, &el[i], t);
    if (!el[i].has_const) out->has_const = 0;
    for (int j = 0; j < el[i].n; j++, c++) {
      out->id[c] = el[i].id[j];
      out->ci[c] = el[i].lit == LIT_FLOAT ? lang_f2i(el[i].cv[j]) : el[i].ci[j];
      out->cv[c] = el[i].lit == LIT_INT ? (double)el[i].ci[j] : el[i].cv[j];
    }
  }
  if (lit == LIT_FLOAT) out->t = FB_T_VOID;
  return 0;
}

/* ---------------------------------------------------------------- builtins */

static int need(lower *L, node *call, int cond, const char *what, const lval *v) {
  if (cond) return 1;
  char x[64];
  ERR(L, call, "%s expects %s, found %s", call->name, what, lv_str(v, x, sizeof x));
  return 0;
}

static void to_float(lower *L, lval *v) {
  fb_type t = lv_default_type(v);
  lv_materialize(L, v, fb_type_is_float(t) ? t : FB_T_F32);
}

static int sum_sq(lower *L, const lval *v) {
  int s = lw_mul(L, v->id[0], v->id[0]);
  for (int i = 1; i < v->n; i++) s = lw_add(L, s, lw_mul(L, v->id[i], v->id[i]));
  return s;
}

/* Determinant of the k x k sub-matrix of m with the given rows and columns
 * (Laplace expansion along the first row). */
static int det_sub(lower *L, const lval *m, const int *rows, const int *cols, int k) {
  int C = m->cols;
  if (k == 1) return m->id[rows[0] * C + cols[0]];
  if (k == 2) {
    int a = lw_mul(L, m->id[rows[0] * C + cols[0]], m->id[rows[1] * C + cols[1]]);
    int b = lw_mul(L, m->id[rows[0] * C + cols[1]], m->id[rows[1] * C + cols[0]]);
    return lw_sub(L, a, b);
  }
  int acc = -1;
  for (int j = 0; j < k; j++) {
    int sc[4], n = 0;
    for (int c = 0; c < k; c++)
      if (c != j) sc[n++] = cols[c];
    int term = lw_mul(L, m->id[rows[0] * C + cols[j]], det_sub(L, m, rows + 1, sc, k - 1));
    if (acc < 0) acc = term;
    else acc = (j & 1) ? lw_sub(L, acc, term) : lw_add(L, acc, term);
  }
  return acc;
}

static int determinant(lower *L, const lval *m) {
  int rows[4] = {0, 1, 2, 3}, cols[4] = {0, 1, 2, 3};
  return det_sub(L, m, rows, cols, m->rows);
}

static void inverse(lower *L, const lval *m, lval *out) {
  int n = m->rows;
  lv_mat_init(out, m->t, n, n);
  int det = determinant(L, m);
  int inv_det = lw_div(L, lw_const(L, m->t, 1, 1), det);
  if (n == 1) {
    out->id[0] = inv_det;
    return;
  }
  for (int i = 0; i < n; i++)
    for (int j = 0; j < n; j++) {
      /* inverse[j][i] = (-1)^(i+j) minor(i, j) / det */
      int rows[3], cols[3], nr = 0, nc = 0;
      for (int r = 0; r < n; r++)
        if (r != i) rows[nr++] = r;
      for (int c = 0; c < n; c++)
        if (c != j) cols[nc++] = c;
      int cof = det_sub(L, m, rows, cols, n - 1);
      if ((i + j) & 1) cof = lw_un(L, FB_OP_NEG, cof);
      out->id[j * n + i] = lw_mul(L, cof, inv_det);
    }
}

static int identity(lower *L, node *call, lval *args, int nargs, lval *out) {
  if (nargs != 1 || args[0].kind != VK_SCALAR || args[0].lit != LIT_INT || args[0].ci[0] < 1 ||
      args[0].ci[0] > 4) {
    ERR(L, call, "identity(n) expects an integer literal n from 1 to 4");
    return -1;
  }
  int n = (int)args[0].ci[0];
  lv_mat_init(out, FB_T_VOID, n, n);
  out->lit = LIT_FLOAT;
  out->has_const = 1;
  for (int i = 0; i < n * n; i++) {
    out->cv[i] = (i / n == i % n) ? 1.0 : 0.0;
    out->ci[i] = lang_f2i(out->cv[i]);
  }
  return 0;
}

static int two_vectors(lower *L, node *call, lval *a, lval *b, fb_type *t) {
  return need(L, call, a->kind == VK_VEC, "vectors", a) &&
         need(L, call, b->kind == VK_VEC, "vectors", b) &&
         numeric_pair(L, a, b, t, call, call->name) == 0;
}

static int vec_builtin2(lower *L, node *call, const char *n, lval *a, lval *b, lval *out) {
  fb_type t;
  if (!two_vectors(L, call, a, b, &t)) return -1;
  if (!strcmp(n, "outer")) {
    lv_mat_init(out, t, a->rows, b->rows);
    for (int r = 0; r < a->rows; r++)
      for (int c = 0; c < b->rows; c++) out->id[r * b->rows + c] = lw_mul(L, a->id[r], b->id[c]);
    return 0;
  }
  if (a->rows != b->rows) {
    char x[64], y[64];
    ERR(L, call, "%s needs vectors of one length, found %s and %s", n, lv_str(a, x, sizeof x),
        lv_str(b, y, sizeof y));
    return -1;
  }
  if (!strcmp(n, "dot")) {
    lv_scalar(out, t, dot_n(L, a, 0, 1, b, 0, 1, a->rows));
    return 0;
  }
  /* cross */
  const int *x = a->id, *y = b->id;
  if (a->rows == 2) {
    int p = lw_mul(L, x[0], y[1]), q = lw_mul(L, x[1], y[0]);
    lv_scalar(out, t, lw_sub(L, p, q));
    return 0;
  }
  if (a->rows != 3) {
    ERR(L, call, "cross needs 2- or 3-vectors");
    return -1;
  }
  lv_vec_init(out, t, 3);
  for (int i = 0; i < 3; i++) {
    int j = (i + 1) % 3, k = (i + 2) % 3;
    int p = lw_mul(L, x[j], y[k]), q = lw_mul(L, x[k], y[j]);
    out->id[i] = lw_sub(L, p, q);
  }
  return 0;
}

static int square(lower *L, node *call, lval *m) {
  return need(L, call, m->kind == VK_MAT && m->rows == m->cols, "a square matrix", m);
}

static int vec_builtin1(lower *L, node *call, const char *n, lval *a, lval *out) {
  if (!strcmp(n, "norm") || !strcmp(n, "norm_sqr") || !strcmp(n, "normalized")) {
    if (!need(L, call, a->kind == VK_VEC || a->kind == VK_MAT, "a vector or matrix", a)) return -1;
    if (lv_default_type(a) == FB_T_BOOL) return need(L, call, 0, "numbers", a) - 1;
    if (strcmp(n, "norm_sqr")) to_float(L, a);
    else lv_materialize(L, a, lv_default_type(a));
    int s = sum_sq(L, a);
    if (!strcmp(n, "norm_sqr")) {
      lv_scalar(out, a->t, s);
      return 0;
    }
    int len = lw_un(L, FB_OP_SQRT, s);
    if (!strcmp(n, "norm")) {
      lv_scalar(out, a->t, len);
      return 0;
    }
    *out = *a;
    out->has_const = 0;
    int inv = lw_div(L, lw_const(L, a->t, 1, 1), len);
    for (int i = 0; i < a->n; i++) out->id[i] = lw_mul(L, a->id[i], inv);
    return 0;
  }
  if (!strcmp(n, "transpose")) {
    if (!need(L, call, a->kind == VK_MAT, "a matrix", a)) return -1;
    lv_materialize(L, a, lv_default_type(a));
    lv_mat_init(out, a->t, a->cols, a->rows);
    for (int r = 0; r < a->rows; r++)
      for (int c = 0; c < a->cols; c++) out->id[c * a->rows + r] = a->id[r * a->cols + c];
    return 0;
  }
  if (!square(L, call, a)) return -1;
  if (lv_default_type(a) == FB_T_BOOL) return need(L, call, 0, "a numeric matrix", a) - 1;
  if (!strcmp(n, "inverse")) to_float(L, a);
  else lv_materialize(L, a, lv_default_type(a));
  if (!strcmp(n, "trace")) {
    int s = a->id[0];
    for (int i = 1; i < a->rows; i++) s = lw_add(L, s, a->id[i * a->cols + i]);
    lv_scalar(out, a->t, s);
  } else if (!strcmp(n, "determinant")) {
    lv_scalar(out, a->t, determinant(L, a));
  } else {
    inverse(L, a, out);
  }
  return 0;
}

static const char *const vec1[] = {"norm",  "norm_sqr",    "normalized", "transpose",
                                   "trace", "determinant", "inverse"};
static const char *const vec2[] = {"dot", "cross", "outer"};

int lang_vec_builtin(lower *L, node *call, lval *args, int nargs, lval *out) {
  const char *n = call->name;
  int arity = 0;
  for (size_t i = 0; i < sizeof vec1 / sizeof vec1[0]; i++)
    if (!strcmp(n, vec1[i])) arity = 1;
  for (size_t i = 0; i < sizeof vec2 / sizeof vec2[0]; i++)
    if (!strcmp(n, vec2[i])) arity = 2;
  if (!strcmp(n, "identity")) {
    if (identity(L, call, args, nargs, out) < 0) lv_unknown(out);
    return 1;
  }
  if (!arity) return 0;
  if (nargs != arity) {
    ERR(L, call, "%s takes %d argument%s, found %d", n, arity, arity == 1 ? "" : "s", nargs);
    lv_unknown(out);
    return 1;
  }
  for (int i = 0; i < nargs; i++)
    if (args[i].kind == VK_UNKNOWN) {
      lv_unknown(out);
      return 1;
    }
  int rc = arity == 1 ? vec_builtin1(L, call, n, &args[0], out)
                      : vec_builtin2(L, call, n, &args[0], &args[1], out);
  if (rc < 0) lv_unknown(out);
  return 1;
}
