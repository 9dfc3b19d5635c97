/* Reductions in parallel tasks. An atomic (atomic_add/sub/min/max/and/or/
 * xor and their *_na forms) inside the task's parallel loop whose address
 * does not change from one iteration to the next (every index defined
 * before the loop, or computed inside it by pure ops from such values) and
 * whose result (the old value) is unused would make every iteration update
 * one memory cell atomically: all threads fight over it. Instead, each body
 * call (a chunk on the CPU, a thread of the grid-stride loop on NVPTX)
 * combines its contributions in a private accumulator (an alloca of the
 * body function, starting at the op's identity) and, when at least one
 * contribution happened, issues one atomic of the same op at the end:
 * bounds check, activation of sparse cells and the error latch then happen
 * exactly when the original atomics would have made them happen (at least
 * once), and nothing is written otherwise. atomic_sub accumulates the sum
 * of its values and subtracts it once.
 *
 * Integer results are exact (wrapping add, min, max and the bit ops are
 * associative and commutative). Float sums may differ in the last bits, as
 * the order of parallel atomics already does: the accumulating fadd may be
 * reassociated (so that LLVM vectorises it); float min/max start from NaN,
 * the identity of fmin/fmax (minnum/maxnum), so NaNs behave as before.
 *
 * Applied to a field only when every access to it in the loop is such an
 * atomic, all with the same op (mixed ops, loads, stores or a used result
 * keep all its atomics as they are). A field below sparse containers also
 * needs a loop without is_active/activate/deactivate/append/length (which
 * could observe or change when its cell becomes active), and no other
 * write under the same sparse containers where either side does not
 * activate (*_na, store_na): the cell could become active between its
 * contributions, or the deferred activation come too late for it. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cg_internal.h"

#define RED_DEPTH 256

/* ---------------------------------------------------------------- analysis */

typedef struct plan {
  const fb_kernel *k;
  const fb_layout *l;
  unsigned char *inloop;  /* per statement: inside the loop's body */
  unsigned char *used;    /* per statement: an operand of some statement */
  signed char *inv;       /* per statement: loop-invariant (1), not (0), unknown (-1) */
} plan;

static int is_atomic(const fb_stmt *s) {
  int cls = fb_op_table[s->op].cls;
  return cls == FB_OPC_ATOMIC || cls == FB_OPC_IATOMIC;
}

static int is_na(fb_op op) { return op >= FB_OP_ATOMIC_ADD_NA && op <= FB_OP_ATOMIC_XOR_NA; }

/* The op without its _na: what the accumulator combines with. */
static fb_op base_op(fb_op op) {
  return is_na(op) ? (fb_op)(FB_OP_ATOMIC_ADD + (op - FB_OP_ATOMIC_ADD_NA)) : op;
}

static void mark_block(plan *p, int blk, int depth) {
  if (blk < 0 || blk >= p->k->nblocks || depth > RED_DEPTH) return;
  const fb_block *b = &p->k->blocks[blk];
  for (int i = 0; i < b->n; i++) {
    int id = b->ids[i];
    if (id < 0 || id >= p->k->nstmts) continue;
    p->inloop[id] = 1;
    mark_block(p, p->k->stmts[id].body, depth + 1);
    mark_block(p, p->k->stmts[id].orelse, depth + 1);
  }
}

static void mark_used(plan *p) {
  for (int i = 0; i < p->k->nstmts; i++) {
    const fb_stmt *s = &p->k->stmts[i];
    for (int a = 0; a < s->nargs && a < FB_MAX_ARGS; a++)
      if (s->args[a] >= 0 && s->args[a] < p->k->nstmts) p->used[s->args[a]] = 1;
  }
}

/* Same value in every iteration: defined before the loop (operands of the
 * loop's statements that are not in it live in block 0, before the loop),
 * or a pure op over such values, other than loop_index (and assume_unique,
 * which promises a different value in every iteration). */
static int invariant(plan *p, int id, int depth) {
  if (id < 0 || id >= p->k->nstmts || depth > RED_DEPTH) return 0;
  if (!p->inloop[id]) return 1;
  if (p->inv[id] >= 0) return p->inv[id];
  const fb_stmt *s = &p->k->stmts[id];
  int ok = (fb_op_table[s->op].flags & FB_OPF_PURE) && s->op != FB_OP_LOOP_INDEX &&
           s->op != FB_OP_ASSUME_UNIQUE;
  p->inv[id] = 0; /* a cycle (bad IR) is not invariant */
  for (int a = 0; ok && a < s->nargs && a < FB_MAX_ARGS; a++)
    ok = invariant(p, s->args[a], depth + 1);
  p->inv[id] = (signed char)ok;
  return ok;
}

/* Does some sparse container on the path of `field` lie on the path of
 * snode too (or is it snode)? */
static int shares_sparse(const fb_layout *l, int field, int snode) {
  for (int c = l->nodes[field].parent; c > 0; c = l->nodes[c].parent) {
    if (!fb_cg_is_sparse(l->nodes[c].kind)) continue;
    for (int n = snode; n > 0; n = l->nodes[n].parent)
      if (n == c) return 1;
  }
  return 0;
}

static int sparse_path(const fb_layout *l, int field) {
  for (int c = l->nodes[field].parent; c > 0; c = l->nodes[c].parent)
    if (fb_cg_is_sparse(l->nodes[c].kind)) return 1;
  return 0;
}

/* Is the field type and op pair one this file can accumulate? */
static int supported(fb_op op, fb_type t) {
  if (fb_type_is_int(t)) return 1;
  if (t != FB_T_F32 && t != FB_T_F64) return 0;
  fb_op b = base_op(op);
  return b == FB_OP_ATOMIC_ADD || b == FB_OP_ATOMIC_SUB || b == FB_OP_ATOMIC_MIN ||
         b == FB_OP_ATOMIC_MAX;
}

/* Does another statement in the loop forbid deferring atomic s? */
static int conflicts(plan *p, const fb_stmt *s, const fb_stmt *o) {
  const fb_layout *l = p->l;
  int flags = fb_op_table[o->op].flags, cls = fb_op_table[o->op].cls;
  if ((flags & FB_OPF_SNODE) && o->snode == s->snode)
    return !is_atomic(o) || o->op != s->op || p->used[o - p->k->stmts];
  if (!sparse_path(l, s->snode)) return 0;
  if (cls == FB_OPC_SPARSE || cls == FB_OPC_APPEND || cls == FB_OPC_LENGTH) return 1;
  /* a non-activating write on one side sees whether the other side's
   * activation happened yet */
  int na = is_na((fb_op)s->op) || is_na((fb_op)o->op) || o->op == FB_OP_STORE_NA;
  return na && (flags & FB_OPF_WRITES) && (flags & FB_OPF_SNODE) && o->snode > 0 &&
         o->snode < l->nnodes && shares_sparse(l, s->snode, o->snode);
}

static int eligible(plan *p, int id) {
  const fb_stmt *s = &p->k->stmts[id];
  if (!p->inloop[id] || !is_atomic(s) || p->used[id]) return 0;
  if (s->snode <= 0 || s->snode >= p->l->nnodes) return 0;
  const fb_snode *f = &p->l->nodes[s->snode];
  if (f->kind != FB_SN_PLACE || s->nargs != f->ndim + 1 || (fb_type)s->type != f->type ||
      !supported((fb_op)s->op, f->type))
    return 0;
  int v = s->args[f->ndim];
  if (v < 0 || v >= p->k->nstmts || (fb_type)p->k->stmts[v].type != f->type) return 0;
  for (int d = 0; d < f->ndim; d++)
    if (!invariant(p, s->args[d], 0)) return 0;
  for (int o = 0; o < p->k->nstmts; o++)
    if (p->inloop[o] && o != id && conflicts(p, s, &p->k->stmts[o])) return 0;
  return 1;
}

static int add_red(fb_emit *e, int id) {
  fb_cg_red *r = realloc(e->reds, sizeof *r * (size_t)(e->nreds + 1));
  if (!r) return fb_emit_error(e, FB_ENOMEM, "out of memory");
  e->reds = r;
  memset(&r[e->nreds], 0, sizeof *r);
  r[e->nreds].stmt = id;
  r[e->nreds].type = e->l->nodes[e->k->stmts[id].snode].type;
  e->red_of[id] = e->nreds++;
  return 0;
}

int fb_reduce_plan(fb_emit *e, int loop) {
  const fb_kernel *k = e->k;
  if (loop < 0 || loop >= k->nstmts) return 0;
  const fb_stmt *ls = &k->stmts[loop];
  if (ls->op != FB_OP_PAR_FOR && ls->op != FB_OP_STRUCT_FOR) return 0;
  size_t n = (size_t)k->nstmts + 1;
  plan p = {k, e->l, calloc(n, 1), calloc(n, 1), malloc(n)};
  e->red_of = malloc(n * sizeof *e->red_of);
  if (!p.inloop || !p.used || !p.inv || !e->red_of) {
    fb_emit_error(e, FB_ENOMEM, "out of memory");
    goto out;
  }
  memset(p.inv, -1, n);
  for (size_t i = 0; i < n; i++) e->red_of[i] = -1;
  mark_block(&p, ls->body, 0);
  mark_used(&p);
  for (int id = 0; id < k->nstmts && !e->rc; id++)
    if (eligible(&p, id)) add_red(e, id);
out:
  free(p.inloop);
  free(p.used);
  free(p.inv);
  return e->rc;
}

void fb_reduce_free(fb_emit *e) {
  free(e->reds);
  free(e->red_of);
  e->reds = NULL;
  e->red_of = NULL;
  e->nreds = 0;
}

/* ---------------------------------------------------------------- code */

/* The accumulator's starting value: the identity of the combining op. */
static LLVMValueRef identity(fb_emit *e, fb_op op, fb_type t) {
  LLVMTypeRef ty = fb_emit_type(e, t);
  int fl = fb_type_is_float(t), sg = fb_type_is_signed(t), bits = fb_type_bits(t);
  unsigned long long ones = bits == 64 ? ~0ull : (1ull << bits) - 1;
  switch (base_op(op)) {
  case FB_OP_ATOMIC_ADD:
  case FB_OP_ATOMIC_SUB:
    return fl ? LLVMConstReal(ty, -0.0) : LLVMConstNull(ty); /* x + -0.0 == x, even -0.0 */
  case FB_OP_ATOMIC_MIN:
    if (fl) return LLVMConstReal(ty, NAN);
    return LLVMConstInt(ty, sg ? ones >> 1 : ones, 0);
  case FB_OP_ATOMIC_MAX:
    if (fl) return LLVMConstReal(ty, NAN);
    return LLVMConstInt(ty, sg ? (ones >> 1) + 1 : 0, 0);
  case FB_OP_ATOMIC_AND: return LLVMConstInt(ty, ones, 0);
  default: return LLVMConstNull(ty); /* or, xor */
  }
}

static LLVMValueRef minmax(fb_emit *e, const char *fname, const char *sname, const char *uname,
                           fb_type t, LLVMValueRef a, LLVMValueRef b) {
  const char *name = fb_type_is_float(t) ? fname : fb_type_is_signed(t) ? sname : uname;
  LLVMValueRef args[2] = {a, b};
  return fb_emit_intrinsic(e, name, LLVMTypeOf(a), args, 2);
}

/* acc <op> v. */
static LLVMValueRef combine(fb_emit *e, fb_op op, fb_type t, LLVMValueRef acc, LLVMValueRef v) {
  switch (base_op(op)) {
  case FB_OP_ATOMIC_ADD:
  case FB_OP_ATOMIC_SUB:
    if (fb_type_is_float(t)) {
      LLVMValueRef x = LLVMBuildFAdd(e->b, acc, v, "red");
      /* the one freedom taken: this sum may be reordered */
      LLVMSetFastMathFlags(x, LLVMFastMathAllowReassoc);
      return x;
    }
    return LLVMBuildAdd(e->b, acc, v, "red");
  case FB_OP_ATOMIC_MIN: return minmax(e, "llvm.minnum", "llvm.smin", "llvm.umin", t, acc, v);
  case FB_OP_ATOMIC_MAX: return minmax(e, "llvm.maxnum", "llvm.smax", "llvm.umax", t, acc, v);
  case FB_OP_ATOMIC_AND: return LLVMBuildAnd(e->b, acc, v, "red");
  case FB_OP_ATOMIC_OR: return LLVMBuildOr(e->b, acc, v, "red");
  default: return LLVMBuildXor(e->b, acc, v, "red");
  }
}

void fb_reduce_open(fb_emit *e) {
  for (int i = 0; i < e->nreds; i++) {
    fb_cg_red *r = &e->reds[i];
    const fb_stmt *s = &e->k->stmts[r->stmt];
    const fb_snode *f = &e->l->nodes[s->snode];
    r->acc = LLVMBuildAlloca(e->ab, fb_emit_type(e, r->type), "red.acc");
    r->hit = LLVMBuildAlloca(e->ab, e->t_i8, "red.hit");
    LLVMBuildStore(e->b, identity(e, (fb_op)s->op, r->type), r->acc);
    LLVMBuildStore(e->b, LLVMConstInt(e->t_i8, 0, 0), r->hit);
    for (int d = 0; d < f->ndim; d++) {
      int a = s->args[d];
      /* an index computed before the loop is at hand after it too */
      r->idx[d] = e->vals[a] ? NULL : LLVMBuildAlloca(e->ab, e->t_i32, "red.idx");
    }
  }
}

int fb_reduce_contribute(fb_emit *e, int id, const fb_stmt *s) {
  fb_cg_red *r = &e->reds[e->red_of[id]];
  const fb_snode *f = &e->l->nodes[s->snode];
  for (int d = 0; d < f->ndim; d++) {
    if (!r->idx[d]) continue;
    LLVMValueRef x = fb_emit_arg(e, s, d);
    if (!x) return e->rc;
    LLVMBuildStore(e->b, x, r->idx[d]);
  }
  LLVMValueRef v = fb_emit_arg(e, s, f->ndim);
  if (!v) return e->rc;
  LLVMTypeRef ty = fb_emit_type(e, r->type);
  LLVMValueRef acc = LLVMBuildLoad2(e->b, ty, r->acc, "");
  LLVMBuildStore(e->b, combine(e, (fb_op)s->op, r->type, acc, v), r->acc);
  /* an or, not a store of 1: LLVM vectorises an or-reduction */
  LLVMValueRef hit = LLVMBuildLoad2(e->b, e->t_i8, r->hit, "");
  LLVMBuildStore(e->b, LLVMBuildOr(e->b, hit, LLVMConstInt(e->t_i8, 1, 0), ""), r->hit);
  e->vals[id] = LLVMConstNull(ty); /* unused (a condition of the plan) */
  return 0;
}

/* if (hit) field[indices] <op>= acc, as the statement itself would. */
static int flush(fb_emit *e, fb_cg_red *r) {
  const fb_stmt *s = &e->k->stmts[r->stmt];
  const fb_snode *f = &e->l->nodes[s->snode];
  LLVMValueRef hit = LLVMBuildLoad2(e->b, e->t_i8, r->hit, "");
  LLVMBasicBlockRef go = fb_emit_block(e, "reduce.flush");
  LLVMBasicBlockRef next = fb_emit_block(e, "reduce.next");
  LLVMBuildCondBr(e->b, LLVMBuildICmp(e->b, LLVMIntNE, hit, LLVMConstInt(e->t_i8, 0, 0), ""), go,
                  next);
  LLVMPositionBuilderAtEnd(e->b, go);
  LLVMValueRef idx[FB_MAX_AXES];
  for (int d = 0; d < f->ndim; d++)
    idx[d] = r->idx[d] ? LLVMBuildLoad2(e->b, e->t_i32, r->idx[d], "") : e->vals[s->args[d]];
  LLVMValueRef acc = LLVMBuildLoad2(e->b, fb_emit_type(e, r->type), r->acc, "");
  if (fb_emit_atomic_at(e, r->stmt, s, idx, acc)) return e->rc;
  LLVMBuildBr(e->b, next);
  LLVMPositionBuilderAtEnd(e->b, next);
  return 0;
}

int fb_reduce_close(fb_emit *e) {
  for (int i = 0; i < e->nreds && !e->rc; i++) flush(e, &e->reds[i]);
  return e->rc;
}
