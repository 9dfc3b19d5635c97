/* Constant value ranges of i32 statements, so that bounds checks that can
 * never fail are not emitted: loop indices (from constant loop bounds or the
 * struct_for's shape) and what constants, +, -, *, min, max, select, and
 * division or remainder by positive constants make of them, and casts of
 * f32 values with a known range (see "f32 ranges" below). Conservative:
 * anything else, or anything that could wrap, has no known range and keeps
 * its check. Results are memoised per statement for one module. */
#include <math.h>
#include <string.h>

#include "cg_internal.h"

enum {
  R_UNSEEN = 0,
  R_BUSY,
  R_KNOWN,
  R_UNKNOWN
};

#define R_DEPTH 64

static int fits_i32(int64_t lo, int64_t hi) { return lo >= INT32_MIN && hi <= INT32_MAX; }

static int range_of(fb_emit *e, int id, int64_t *lo, int64_t *hi, int depth);
static int frange_of(fb_emit *e, int id, double *lo, double *hi, int depth);

/* Range of operand i of s. */
static int arg_range(fb_emit *e, const fb_stmt *s, int i, int64_t *lo, int64_t *hi, int depth) {
  if (i >= s->nargs || i >= FB_MAX_ARGS) return 0;
  return range_of(e, s->args[i], lo, hi, depth + 1);
}

static int loop_index_range(fb_emit *e, const fb_stmt *s, int64_t *lo, int64_t *hi, int depth) {
  int loop = s->args[0];
  if (loop < 0 || loop >= e->k->nstmts) return 0;
  const fb_stmt *ls = &e->k->stmts[loop];
  if (ls->op == FB_OP_STRUCT_FOR) {
    if (ls->snode < 0 || ls->snode >= e->l->nnodes) return 0;
    const fb_snode *sn = &e->l->nodes[ls->snode];
    if (s->imm.i < 0 || s->imm.i >= sn->ndim) return 0;
    *lo = 0;
    *hi = sn->shape[sn->dim_axis[s->imm.i]] - 1;
    return 1;
  }
  if (ls->op != FB_OP_RANGE_FOR && ls->op != FB_OP_PAR_FOR) return 0;
  int64_t blo, bhi, elo, ehi;
  if (!arg_range(e, ls, 0, &blo, &bhi, depth) || !arg_range(e, ls, 1, &elo, &ehi, depth)) return 0;
  *lo = blo;
  *hi = ehi - 1 >= blo ? ehi - 1 : blo; /* empty loop: the body never runs */
  return 1;
}

static int64_t floordiv64(int64_t a, int64_t c) { return a / c - (a % c != 0 && a < 0); }

/* Binary arithmetic on two ranges. */
static int binary_range(fb_emit *e, const fb_stmt *s, int64_t *lo, int64_t *hi, int depth) {
  int64_t al, ah, bl, bh;
  if (!arg_range(e, s, 0, &al, &ah, depth) || !arg_range(e, s, 1, &bl, &bh, depth)) return 0;
  int bconst = bl == bh && bl > 0;
  switch (s->op) {
  case FB_OP_ADD:
    *lo = al + bl;
    *hi = ah + bh;
    break;
  case FB_OP_SUB:
    *lo = al - bh;
    *hi = ah - bl;
    break;
  case FB_OP_MUL: {
    int64_t p[4] = {al * bl, al * bh, ah * bl, ah * bh}; /* |x| < 2^31: no overflow */
    *lo = *hi = p[0];
    for (int i = 1; i < 4; i++) {
      if (p[i] < *lo) *lo = p[i];
      if (p[i] > *hi) *hi = p[i];
    }
    break;
  }
  case FB_OP_MIN:
    *lo = al < bl ? al : bl;
    *hi = ah < bh ? ah : bh;
    break;
  case FB_OP_MAX:
    *lo = al > bl ? al : bl;
    *hi = ah > bh ? ah : bh;
    break;
  case FB_OP_DIV:
    if (!bconst) return 0;
    *lo = al / bl;
    *hi = ah / bl;
    break;
  case FB_OP_FLOORDIV:
    if (!bconst) return 0;
    *lo = floordiv64(al, bl);
    *hi = floordiv64(ah, bl);
    break;
  case FB_OP_REM:
    if (!bconst) return 0;
    *lo = al >= 0 ? 0 : (al > -(bl - 1) ? al : -(bl - 1));
    *hi = ah <= 0 ? 0 : (ah < bl - 1 ? ah : bl - 1);
    break;
  case FB_OP_FLOORMOD:
    if (!bconst) return 0;
    *lo = 0;
    *hi = bl - 1;
    break;
  default: return 0;
  }
  return fits_i32(*lo, *hi);
}

static int compute(fb_emit *e, const fb_stmt *s, int64_t *lo, int64_t *hi, int depth) {
  if ((fb_type)s->type != FB_T_I32) return 0;
  switch (s->op) {
  case FB_OP_CONST: *lo = *hi = (int32_t)(uint32_t)s->imm.u; return 1;
  case FB_OP_LOOP_INDEX: return loop_index_range(e, s, lo, hi, depth);
  case FB_OP_ASSUME_UNIQUE: return arg_range(e, s, 0, lo, hi, depth);
  case FB_OP_SELECT: {
    int64_t al, ah, bl, bh;
    if (!arg_range(e, s, 1, &al, &ah, depth) || !arg_range(e, s, 2, &bl, &bh, depth)) return 0;
    *lo = al < bl ? al : bl;
    *hi = ah > bh ? ah : bh;
    return 1;
  }
  case FB_OP_CAST: {
    if (s->nargs < 1 || s->args[0] < 0 || s->args[0] >= e->k->nstmts) return 0;
    fb_type from = (fb_type)e->k->stmts[s->args[0]].type;
    double fl, fh;
    if (from == FB_T_F32 && frange_of(e, s->args[0], &fl, &fh, depth + 1)) {
      /* f32 -> i32 truncates and saturates (NaN gives 0, never in a
       * range): monotone, so the ends map to the ends */
      *lo = fl <= INT32_MIN ? INT32_MIN : fl >= INT32_MAX ? INT32_MAX : (int64_t)trunc(fl);
      *hi = fh <= INT32_MIN ? INT32_MIN : fh >= INT32_MAX ? INT32_MAX : (int64_t)trunc(fh);
      return 1;
    }
    if (from != FB_T_BOOL) return 0;
    *lo = 0;
    *hi = 1;
    return 1;
  }
  default: return binary_range(e, s, lo, hi, depth);
  }
}

/* ---------------------------------------------------------------- f32 ranges
 * Ranges of f32 statements, so that a float index clamped into a grid
 * (`i32(floor(min(hi, max(p, lo)) * n - 0.5))`, a bilinear sample) has an
 * i32 range and its bounds checks go. A range [lo, hi] (doubles holding
 * f32 values, possibly infinite) promises the value is never NaN. The
 * IR's f32 arithmetic rounds to nearest (no fast-math, no contraction),
 * which is monotone: the result of x op y over the box lies between the
 * f32 roundings of the exact extreme results. Those are exact in double
 * for products; sums and quotients are checked to be exact and, when not,
 * the rounded end is moved out by one f32 ulp (a double-rounded value is
 * at most that far from the correctly rounded one). min and max are
 * fmin/fmax: NaN gives the other operand, so max(anything, [l, h]) lies
 * in [l, +inf]. Memoised in the same state arrays as the i32 ranges (a
 * statement has one type); the ends are stored as the doubles' bits. */

/* The f32 result of an operation whose double result is x: to nearest when
 * x is the exact result (what the f32 operation gives), else one ulp
 * further towards dir (-1 down, +1 up). */
static double f32_round(double x, int exact, int dir) {
  float f = (float)x;
  if (!exact) f = nextafterf(f, dir < 0 ? -INFINITY : INFINITY);
  return (double)f;
}

static double fbinop(int op, double a, double b, int *exact) {
  double r;
  switch (op) {
  case FB_OP_ADD:
  case FB_OP_SUB: {
    double bb = op == FB_OP_ADD ? b : -b;
    r = a + bb; /* TwoSum: is the double sum exact? */
    double bv = r - a, av = r - bv;
    *exact = (a - av) + (bb - bv) == 0;
    return r;
  }
  case FB_OP_MUL: r = a * b; *exact = 1; return r; /* 24 + 24 bits */
  default: r = a / b; *exact = fma(r, b, -a) == 0; return r;
  }
}

static int farith_range(fb_emit *e, const fb_stmt *s, double *lo, double *hi, int depth) {
  double al, ah, bl, bh;
  int ka = s->nargs > 0 && frange_of(e, s->args[0], &al, &ah, depth + 1);
  int kb = s->nargs > 1 && frange_of(e, s->args[1], &bl, &bh, depth + 1);
  if (s->op == FB_OP_MIN || s->op == FB_OP_MAX) {
    int mx = s->op == FB_OP_MAX;
    if (!ka && !kb) return 0;
    if (!ka || !kb) { /* the other may be anything, NaN included */
      double l = ka ? al : bl, h = ka ? ah : bh;
      *lo = mx ? l : -INFINITY;
      *hi = mx ? INFINITY : h;
      return 1;
    }
    *lo = mx ? fmax(al, bl) : fmin(al, bl);
    *hi = mx ? fmax(ah, bh) : fmin(ah, bh);
    return 1;
  }
  if (!ka || !kb || !isfinite(al) || !isfinite(ah) || !isfinite(bl) || !isfinite(bh)) return 0;
  if (s->op == FB_OP_DIV && !(bl > 0 || bh < 0)) return 0;
  double a[2] = {al, ah}, b[2] = {bl, bh};
  *lo = INFINITY;
  *hi = -INFINITY;
  for (int i = 0; i < 4; i++) {
    int exact;
    double r = fbinop(s->op, a[i >> 1], b[i & 1], &exact);
    double dn = f32_round(r, exact, -1), up = f32_round(r, exact, 1);
    if (dn < *lo) *lo = dn;
    if (up > *hi) *hi = up;
  }
  return isfinite(*lo) && isfinite(*hi); /* an overflow may give inf, or NaN */
}

static int fcompute(fb_emit *e, const fb_stmt *s, double *lo, double *hi, int depth) {
  if ((fb_type)s->type != FB_T_F32) return 0;
  switch (s->op) {
  case FB_OP_CONST: {
    double v = (double)(float)s->imm.f;
    if (isnan(v)) return 0;
    *lo = *hi = v;
    return 1;
  }
  case FB_OP_CAST: { /* from i32: sitofp rounds to nearest, monotone */
    int64_t il, ih;
    if (s->nargs < 1 || s->args[0] < 0 || s->args[0] >= e->k->nstmts ||
        e->k->stmts[s->args[0]].type != FB_T_I32 || !range_of(e, s->args[0], &il, &ih, depth + 1))
      return 0;
    *lo = (double)(float)il;
    *hi = (double)(float)ih;
    return 1;
  }
  case FB_OP_FLOOR:
    if (!frange_of(e, s->args[0], lo, hi, depth + 1)) return 0;
    *lo = floor(*lo);
    *hi = floor(*hi);
    return 1;
  case FB_OP_ADD:
  case FB_OP_SUB:
  case FB_OP_MUL:
  case FB_OP_DIV:
  case FB_OP_MIN:
  case FB_OP_MAX: return farith_range(e, s, lo, hi, depth);
  default: return 0;
  }
}

static int frange_of(fb_emit *e, int id, double *lo, double *hi, int depth) {
  if (!e->rstate || id < 0 || id >= e->k->nstmts || depth > R_DEPTH) return 0;
  if ((fb_type)e->k->stmts[id].type != FB_T_F32) return 0; /* i32 ranges share the memo */
  if (e->rstate[id] == R_KNOWN) {
    memcpy(lo, &e->rlo[id], sizeof *lo);
    memcpy(hi, &e->rhi[id], sizeof *hi);
    return 1;
  }
  if (e->rstate[id] != R_UNSEEN) return 0;
  e->rstate[id] = R_BUSY;
  int ok = fcompute(e, &e->k->stmts[id], lo, hi, depth);
  e->rstate[id] = ok ? R_KNOWN : R_UNKNOWN;
  if (ok) {
    memcpy(&e->rlo[id], lo, sizeof *lo);
    memcpy(&e->rhi[id], hi, sizeof *hi);
  }
  return ok;
}

static int range_of(fb_emit *e, int id, int64_t *lo, int64_t *hi, int depth) {
  if (id < 0 || id >= e->k->nstmts || depth > R_DEPTH) return 0;
  if ((fb_type)e->k->stmts[id].type != FB_T_I32) return 0; /* f32 ranges share the memo */
  if (e->rstate[id] == R_KNOWN) {
    *lo = e->rlo[id];
    *hi = e->rhi[id];
    return 1;
  }
  if (e->rstate[id] != R_UNSEEN) return 0; /* unknown, or a cycle in bad IR */
  e->rstate[id] = R_BUSY;
  int ok = compute(e, &e->k->stmts[id], lo, hi, depth);
  e->rstate[id] = ok ? R_KNOWN : R_UNKNOWN;
  if (ok) {
    e->rlo[id] = *lo;
    e->rhi[id] = *hi;
  }
  return ok;
}

int fb_cg_f32_in_range(fb_emit *e, int id, double min, double max) {
  double lo, hi;
  return frange_of(e, id, &lo, &hi, 0) && lo >= min && hi <= max;
}

int fb_cg_in_range(fb_emit *e, int id, int64_t min, int64_t max) {
  int64_t lo, hi;
  if (!e->rstate) return 0;
  return range_of(e, id, &lo, &hi, 0) && lo >= min && hi <= max;
}

/* ---------------------------------------------------------------- i64 twins */

static LLVMValueRef twin(fb_emit *e, const fb_stmt *s, int i) {
  if (i >= s->nargs || s->args[i] < 0 || s->args[i] >= e->k->nstmts) return NULL;
  return e->wide[s->args[i]];
}

void fb_cg_wide_note(fb_emit *e, int id) {
  if (!e->wide || e->rc || id < 0 || id >= e->k->nstmts || !e->vals[id]) return;
  const fb_stmt *s = &e->k->stmts[id];
  e->wide[id] = NULL;
  if ((fb_type)s->type != FB_T_I32) return;
  LLVMValueRef a = twin(e, s, 0), b = twin(e, s, 1), w = NULL;
  switch (s->op) {
  case FB_OP_CONST:
    w = LLVMConstInt(e->t_i64, (unsigned long long)(int64_t)(int32_t)(uint32_t)s->imm.u, 1);
    break;
  case FB_OP_LOOP_INDEX: {
    int loop = s->args[0], which = (int)s->imm.i;
    if (e->lwide && which >= 0 && which < FB_MAX_AXES) w = e->lwide[loop][which];
    break;
  }
  case FB_OP_ASSUME_UNIQUE: w = a; break;
  /* sext is monotonic: min, max and select commute with it */
  case FB_OP_MIN:
  case FB_OP_MAX:
    if (a && b) {
      LLVMIntPredicate p = s->op == FB_OP_MIN ? LLVMIntSLT : LLVMIntSGT;
      w = LLVMBuildSelect(e->b, LLVMBuildICmp(e->b, p, a, b, ""), a, b, "w");
    }
    break;
  case FB_OP_SELECT: {
    LLVMValueRef c = e->vals[s->args[0]], x = twin(e, s, 1), y = twin(e, s, 2);
    if (c && x && y && LLVMTypeOf(c) == e->t_i1) w = LLVMBuildSelect(e->b, c, x, y, "w");
    break;
  }
  /* exact when the i32 operation cannot wrap, which a known range proves */
  case FB_OP_ADD:
  case FB_OP_SUB:
  case FB_OP_MUL:
    if (a && b && fb_cg_in_range(e, id, INT32_MIN, INT32_MAX))
      w = s->op == FB_OP_ADD   ? LLVMBuildNSWAdd(e->b, a, b, "w")
          : s->op == FB_OP_SUB ? LLVMBuildNSWSub(e->b, a, b, "w")
                               : LLVMBuildNSWMul(e->b, a, b, "w");
    break;
  /* on a non-negative dividend and a positive divisor every flavour of
   * division is the unsigned one */
  case FB_OP_DIV:
  case FB_OP_FLOORDIV:
  case FB_OP_REM:
  case FB_OP_FLOORMOD:
    if (a && b && fb_cg_in_range(e, s->args[0], 0, INT32_MAX) &&
        fb_cg_in_range(e, s->args[1], 1, INT32_MAX))
      w = s->op == FB_OP_DIV || s->op == FB_OP_FLOORDIV ? LLVMBuildUDiv(e->b, a, b, "w")
                                                        : LLVMBuildURem(e->b, a, b, "w");
    break;
  default: break;
  }
  e->wide[id] = w;
}

LLVMValueRef fb_cg_wide(fb_emit *e, int id) {
  if (e->wide && id >= 0 && id < e->k->nstmts && e->wide[id]) return e->wide[id];
  return LLVMBuildSExt(e->b, e->vals[id], e->t_i64, "");
}
