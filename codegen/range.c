/* Constant value ranges of i32 statements, so that bounds checks that can
 * never fail are not emitted: loop indices (from constant loop bounds or the
 * struct_for's shape) and what constants, +, -, *, min, max, select, and
 * division or remainder by positive constants make of them. Conservative:
 * anything else, or anything that could wrap, has no known range and keeps
 * its check. Results are memoised per statement for one module. */
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
  case FB_OP_CAST:
    if (s->nargs < 1 || s->args[0] < 0 || s->args[0] >= e->k->nstmts ||
        e->k->stmts[s->args[0]].type != FB_T_BOOL)
      return 0;
    *lo = 0;
    *hi = 1;
    return 1;
  default: return binary_range(e, s, lo, hi, depth);
  }
}

static int range_of(fb_emit *e, int id, int64_t *lo, int64_t *hi, int depth) {
  if (id < 0 || id >= e->k->nstmts || depth > R_DEPTH) return 0;
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
