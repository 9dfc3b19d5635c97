/* Lowering of statements that touch memory: local variables (allocas in the
 * entry block, zeroed where the alloca statement runs), global field access
 * with the dense address arithmetic of fb_layout_dense_offset and a bounds
 * check per index (out of bounds: skipped, loads give 0, FB_EBOUNDS latched
 * in *ctx->error), atomics, sparse queries on dense paths, the launch
 * scratch buffer (gtmp), return slots and the inline rand() generator.
 * Sparse containers are refused with FB_EUNSUPPORTED for now: the address
 * code is one function per container kind so they can be added there. */
#include <string.h>

#include "cg_internal.h"

static const char *opname(const fb_stmt *s) { return fb_op_table[s->op].name; }

/* ---------------------------------------------------------------- locals */

static int emit_alloca(fb_emit *e, int id, const fb_stmt *s) {
  LLVMTypeRef ty = fb_emit_type(e, (fb_type)s->type);
  if (!ty) return fb_emit_error(e, FB_EINVAL, "%%%d alloca: no variable of type void", id);
  if (!e->vals[id]) e->vals[id] = LLVMBuildAlloca(e->ab, ty, "var");
  LLVMBuildStore(e->b, LLVMConstNull(ty), e->vals[id]);
  return 0;
}

/* The alloca statement named by operand 0 of s, or -1. */
static int var_of(fb_emit *e, const fb_stmt *s) {
  int v = s->args[0];
  if (v < 0 || v >= e->k->nstmts || e->k->stmts[v].op != FB_OP_ALLOCA || !e->vals[v]) return -1;
  return v;
}

static int emit_lload(fb_emit *e, int id, const fb_stmt *s) {
  int v = var_of(e, s);
  if (v < 0 || (fb_type)e->k->stmts[v].type != (fb_type)s->type)
    return fb_emit_error(e, FB_EINVAL, "%%%d lload: operand is not a %s variable", id,
                         fb_type_name((fb_type)s->type));
  e->vals[id] = LLVMBuildLoad2(e->b, fb_emit_type(e, (fb_type)s->type), e->vals[v], "");
  return 0;
}

static int emit_lstore(fb_emit *e, int id, const fb_stmt *s) {
  int v = var_of(e, s);
  LLVMValueRef x = fb_emit_arg(e, s, 1);
  if (!x) return e->rc;
  if (v < 0 || e->k->stmts[v].type != e->k->stmts[s->args[1]].type)
    return fb_emit_error(e, FB_EINVAL, "%%%d lstore: operand 0 is not a variable of the "
                         "value's type", id);
  LLVMBuildStore(e->b, x, e->vals[v]);
  return 0;
}

/* ---------------------------------------------------------------- addresses */

int fb_emit_check_dense(fb_emit *e, int id, int snode) {
  const fb_layout *l = e->l;
  for (int n = snode; n > 0; n = l->nodes[n].parent) {
    fb_snode_kind k = l->nodes[n].kind;
    if (k != FB_SN_DENSE && k != FB_SN_PLACE)
      return fb_emit_error(e, FB_EUNSUPPORTED,
                           "%%%d %s: SNode %d (%s) is sparse; sparse data structures are not "
                           "supported by code generation yet",
                           id, opname(&e->k->stmts[id]), n, fb_snode_kind_name(k));
  }
  return 0;
}

/* Operands 0..ndim-1 of s are the indices of snode: check their count and
 * type, and AND together 0 <= I < shape (unsigned compares) for the indices
 * not proven in range (range.c). *inb is NULL when nothing needs checking. */
static int index_check(fb_emit *e, int id, const fb_stmt *s, int snode, int extra,
                       LLVMValueRef idx[FB_MAX_AXES], LLVMValueRef *inb) {
  const fb_snode *sn = &e->l->nodes[snode];
  *inb = NULL;
  if (s->nargs != sn->ndim + extra)
    return fb_emit_error(e, FB_EINVAL, "%%%d %s: SNode %d takes %d indices", id, opname(s),
                         snode, sn->ndim);
  for (int d = 0; d < sn->ndim; d++) {
    idx[d] = fb_emit_arg(e, s, d);
    if (!idx[d]) return e->rc;
    if (fb_emit_argtype(e, s, d) != FB_T_I32)
      return fb_emit_error(e, FB_EINVAL, "%%%d %s: index %d is not i32", id, opname(s), d);
    int64_t extent = sn->shape[sn->dim_axis[d]];
    if (fb_cg_in_range(e, s->args[d], 0, extent - 1)) continue;
    LLVMValueRef ext = fb_emit_i32(e, (int32_t)extent);
    LLVMValueRef ok = LLVMBuildICmp(e->b, LLVMIntULT, idx[d], ext, "");
    *inb = *inb ? LLVMBuildAnd(e->b, *inb, ok, "") : ok;
  }
  return 0;
}

/* Offset contribution of one dense container on the path to `place`:
 * node offset + (row-major local cell index) * cell bytes. */
static LLVMValueRef dense_step(fb_emit *e, const fb_snode *c, int place,
                               LLVMValueRef gi[FB_MAX_AXES]) {
  LLVMValueRef lin = fb_emit_i64(e, 0);
  for (int a = 0; a < FB_MAX_AXES; a++) {
    if (!(c->axes & (1u << a))) continue;
    int64_t stride = fb_layout_stride(e->l, c->id, place, a);
    LLVMValueRef local = gi[a];
    if (stride != 1) local = LLVMBuildUDiv(e->b, local, fb_emit_i64(e, stride), "");
    if (c->shape[a] != c->size[a]) /* an ancestor splits a too */
      local = LLVMBuildURem(e->b, local, fb_emit_i64(e, c->size[a]), "");
    lin = LLVMBuildAdd(e->b, LLVMBuildMul(e->b, lin, fb_emit_i64(e, c->size[a]), ""), local, "");
  }
  LLVMValueRef cell = LLVMBuildMul(e->b, lin, fb_emit_i64(e, (int64_t)c->cell_bytes), "");
  return LLVMBuildAdd(e->b, fb_emit_i64(e, (int64_t)c->offset), cell, "");
}

/* Address of place[idx] in the root buffer (dense path). */
static LLVMValueRef place_addr(fb_emit *e, int place, LLVMValueRef idx[FB_MAX_AXES]) {
  const fb_snode *f = &e->l->nodes[place];
  LLVMValueRef gi[FB_MAX_AXES];
  for (int a = 0; a < FB_MAX_AXES; a++) gi[a] = fb_emit_i64(e, 0);
  for (int d = 0; d < f->ndim; d++) gi[f->dim_axis[d]] = LLVMBuildZExt(e->b, idx[d], e->t_i64, "");
  int path[64];
  int n = fb_layout_path(e->l, place, path, 64);
  LLVMValueRef off = fb_emit_i64(e, (int64_t)f->offset);
  for (int p = 0; p < n; p++)
    off = LLVMBuildAdd(e->b, off, dense_step(e, &e->l->nodes[path[p]], place, gi), "");
  return LLVMBuildGEP2(e->b, e->t_i8, e->c_root, &off, 1, "addr");
}

/* ---------------------------------------------------------------- bounds guard */

typedef struct guard {
  LLVMBasicBlockRef bad, join;
} guard;

static void latch_error(fb_emit *e, int code) {
  LLVMValueRef x = LLVMBuildAtomicCmpXchg(e->b, e->c_error, fb_emit_i32(e, 0), fb_emit_i32(e, code),
                                          LLVMAtomicOrderingMonotonic,
                                          LLVMAtomicOrderingMonotonic, 0);
  (void)x;
}

/* Run what follows only when inb holds; otherwise latch FB_EBOUNDS. */
static void guard_begin(fb_emit *e, LLVMValueRef inb, guard *g) {
  g->bad = g->join = NULL;
  if (!inb) return;
  LLVMBasicBlockRef ok = fb_emit_block(e, "inbounds");
  g->bad = fb_emit_block(e, "outofbounds");
  g->join = fb_emit_block(e, "access.done");
  LLVMBuildCondBr(e->b, inb, ok, g->bad);
  LLVMPositionBuilderAtEnd(e->b, g->bad);
  latch_error(e, FB_EBOUNDS);
  LLVMBuildBr(e->b, g->join);
  LLVMPositionBuilderAtEnd(e->b, ok);
}

/* Close the guard; the result is v when in bounds and `skipped` otherwise. */
static LLVMValueRef guard_end(fb_emit *e, guard *g, LLVMValueRef v, LLVMValueRef skipped) {
  if (!g->join) return v;
  LLVMBasicBlockRef ok = LLVMGetInsertBlock(e->b);
  LLVMBuildBr(e->b, g->join);
  LLVMPositionBuilderAtEnd(e->b, g->join);
  if (!v) return NULL;
  LLVMValueRef phi = LLVMBuildPhi(e->b, LLVMTypeOf(v), "");
  LLVMValueRef vals[2] = {v, skipped};
  LLVMBasicBlockRef bbs[2] = {ok, g->bad};
  LLVMAddIncoming(phi, vals, bbs, 2);
  return phi;
}

/* ---------------------------------------------------------------- global access */

static int check_place(fb_emit *e, int id, const fb_stmt *s) {
  if (s->snode < 0 || s->snode >= e->l->nnodes || e->l->nodes[s->snode].kind != FB_SN_PLACE)
    return fb_emit_error(e, FB_EINVAL, "%%%d %s: SNode %d is not a field", id, opname(s), s->snode);
  return fb_emit_check_dense(e, id, s->snode);
}

static void set_align(LLVMValueRef v, fb_type t) { LLVMSetAlignment(v, (unsigned)fb_type_size(t)); }

static int emit_load(fb_emit *e, int id, const fb_stmt *s) {
  LLVMValueRef idx[FB_MAX_AXES], inb;
  if (check_place(e, id, s) || index_check(e, id, s, s->snode, 0, idx, &inb)) return e->rc;
  fb_type t = e->l->nodes[s->snode].type;
  guard g;
  guard_begin(e, inb, &g);
  LLVMValueRef p = place_addr(e, s->snode, idx);
  LLVMValueRef v = LLVMBuildLoad2(e->b, fb_emit_memtype(e, t), p, "");
  set_align(v, t);
  v = fb_emit_from_mem(e, t, v);
  e->vals[id] = guard_end(e, &g, v, LLVMConstNull(fb_emit_type(e, t)));
  return 0;
}

/* The value operand (after the indices) of a store/atomic, of the field's type. */
static LLVMValueRef value_operand(fb_emit *e, int id, const fb_stmt *s, fb_type t) {
  int vi = e->l->nodes[s->snode].ndim;
  LLVMValueRef v = fb_emit_arg(e, s, vi);
  if (v && fb_emit_argtype(e, s, vi) != t) {
    fb_emit_error(e, FB_EINVAL, "%%%d %s: value is %s, the field holds %s", id, opname(s),
                  fb_type_name(fb_emit_argtype(e, s, vi)), fb_type_name(t));
    return NULL;
  }
  return v;
}

static int emit_store(fb_emit *e, int id, const fb_stmt *s) {
  LLVMValueRef idx[FB_MAX_AXES], inb;
  if (check_place(e, id, s) || index_check(e, id, s, s->snode, 1, idx, &inb)) return e->rc;
  fb_type t = e->l->nodes[s->snode].type;
  LLVMValueRef v = value_operand(e, id, s, t);
  if (!v) return e->rc;
  guard g;
  guard_begin(e, inb, &g);
  LLVMValueRef st = LLVMBuildStore(e->b, fb_emit_to_mem(e, t, v), place_addr(e, s->snode, idx));
  set_align(st, t);
  guard_end(e, &g, NULL, NULL);
  return 0;
}

/* The atomicrmw operation for op on type t, or -1 when undefined. */
static int atomic_binop(fb_op op, fb_type t) {
  int fl = fb_type_is_float(t), sg = fb_type_is_signed(t);
  if (t == FB_T_BOOL && op != FB_OP_ATOMIC_AND && op != FB_OP_ATOMIC_OR && op != FB_OP_ATOMIC_XOR)
    return -1;
  switch (op) {
  case FB_OP_ATOMIC_ADD: return fl ? LLVMAtomicRMWBinOpFAdd : LLVMAtomicRMWBinOpAdd;
  case FB_OP_ATOMIC_SUB: return fl ? LLVMAtomicRMWBinOpFSub : LLVMAtomicRMWBinOpSub;
  case FB_OP_ATOMIC_MIN:
    return fl ? LLVMAtomicRMWBinOpFMin : sg ? LLVMAtomicRMWBinOpMin : LLVMAtomicRMWBinOpUMin;
  case FB_OP_ATOMIC_MAX:
    return fl ? LLVMAtomicRMWBinOpFMax : sg ? LLVMAtomicRMWBinOpMax : LLVMAtomicRMWBinOpUMax;
  case FB_OP_ATOMIC_AND: return fl ? -1 : LLVMAtomicRMWBinOpAnd;
  case FB_OP_ATOMIC_OR: return fl ? -1 : LLVMAtomicRMWBinOpOr;
  case FB_OP_ATOMIC_XOR: return fl ? -1 : LLVMAtomicRMWBinOpXor;
  default: return -1;
  }
}

static int emit_atomic(fb_emit *e, int id, const fb_stmt *s) {
  LLVMValueRef idx[FB_MAX_AXES], inb;
  if (check_place(e, id, s) || index_check(e, id, s, s->snode, 1, idx, &inb)) return e->rc;
  fb_type t = e->l->nodes[s->snode].type;
  int bop = atomic_binop((fb_op)s->op, t);
  if (bop < 0) return fb_emit_error(e, FB_EINVAL, "%%%d %s: not defined on %s", id, opname(s),
                                    fb_type_name(t));
  LLVMValueRef v = value_operand(e, id, s, t);
  if (!v) return e->rc;
  guard g;
  guard_begin(e, inb, &g);
  LLVMValueRef old = LLVMBuildAtomicRMW(e->b, (LLVMAtomicRMWBinOp)bop, place_addr(e, s->snode, idx),
                                        fb_emit_to_mem(e, t, v), LLVMAtomicOrderingMonotonic, 0);
  set_align(old, t);
  old = fb_emit_from_mem(e, t, old);
  e->vals[id] = guard_end(e, &g, old, LLVMConstNull(fb_emit_type(e, t)));
  return 0;
}

/* is_active / activate on a dense path: every cell is active; the indices
 * are still bounds-checked like any other access. */
static int emit_sparse(fb_emit *e, int id, const fb_stmt *s) {
  if (s->snode < 0 || s->snode >= e->l->nnodes)
    return fb_emit_error(e, FB_EINVAL, "%%%d %s: no SNode %d", id, opname(s), s->snode);
  if (s->op == FB_OP_DEACTIVATE)
    return fb_emit_error(e, FB_EUNSUPPORTED, "%%%d deactivate: sparse data structures are not "
                         "supported by code generation yet", id);
  LLVMValueRef idx[FB_MAX_AXES], inb;
  if (fb_emit_check_dense(e, id, s->snode) || index_check(e, id, s, s->snode, 0, idx, &inb))
    return e->rc;
  guard g;
  guard_begin(e, inb, &g);
  LLVMValueRef r = guard_end(e, &g, LLVMConstInt(e->t_i1, 1, 0), LLVMConstInt(e->t_i1, 0, 0));
  if (s->op == FB_OP_IS_ACTIVE) e->vals[id] = r;
  return 0;
}

/* ---------------------------------------------------------------- gtmp, ret */

static unsigned gtmp_align(int64_t off, fb_type t) {
  unsigned a = (unsigned)fb_type_size(t);
  while (a > 1 && off % a) a /= 2;
  return a;
}

static int emit_gtmp(fb_emit *e, int id, const fb_stmt *s) {
  int store = s->op == FB_OP_GTMP_STORE;
  fb_type t = store ? fb_emit_argtype(e, s, 0) : (fb_type)s->type;
  LLVMValueRef v = store ? fb_emit_arg(e, s, 0) : NULL;
  if (store && !v) return e->rc;
  if (s->imm.i < 0 || !fb_emit_type(e, t))
    return fb_emit_error(e, FB_EINVAL, "%%%d %s: bad offset %lld or type", id, opname(s),
                         (long long)s->imm.i);
  LLVMValueRef off = fb_emit_i64(e, s->imm.i);
  LLVMValueRef p = LLVMBuildGEP2(e->b, e->t_i8, e->c_gtmp, &off, 1, "gtmp");
  LLVMValueRef x;
  if (store) {
    x = LLVMBuildStore(e->b, fb_emit_to_mem(e, t, v), p);
  } else {
    x = LLVMBuildLoad2(e->b, fb_emit_memtype(e, t), p, "");
    e->vals[id] = fb_emit_from_mem(e, t, x);
  }
  LLVMSetAlignment(x, gtmp_align(s->imm.i, t));
  return 0;
}

static int emit_ret(fb_emit *e, int id, const fb_stmt *s) {
  LLVMValueRef v = fb_emit_arg(e, s, 0);
  if (!v) return e->rc;
  if (s->imm.i < 0 || s->imm.i > 4096)
    return fb_emit_error(e, FB_EINVAL, "%%%d ret: bad slot %lld", id, (long long)s->imm.i);
  LLVMValueRef slot = fb_emit_i64(e, s->imm.i);
  LLVMValueRef p = LLVMBuildGEP2(e->b, e->t_i64, e->c_rets, &slot, 1, "");
  LLVMValueRef st = LLVMBuildStore(e->b, fb_emit_pack_slot(e, fb_emit_argtype(e, s, 0), v), p);
  LLVMSetAlignment(st, 8);
  return 0;
}

/* ---------------------------------------------------------------- rand */

/* fb__mix64 (splitmix64 finaliser) in IR. */
static LLVMValueRef mix64(fb_emit *e, LLVMValueRef x) {
  LLVMBuilderRef b = e->b;
  x = LLVMBuildAdd(b, x, LLVMConstInt(e->t_i64, 0x9e3779b97f4a7c15ull, 0), "");
  x = LLVMBuildXor(b, x, LLVMBuildLShr(b, x, LLVMConstInt(e->t_i64, 30, 0), ""), "");
  x = LLVMBuildMul(b, x, LLVMConstInt(e->t_i64, 0xbf58476d1ce4e5b9ull, 0), "");
  x = LLVMBuildXor(b, x, LLVMBuildLShr(b, x, LLVMConstInt(e->t_i64, 27, 0), ""), "");
  x = LLVMBuildMul(b, x, LLVMConstInt(e->t_i64, 0x94d049bb133111ebull, 0), "");
  return LLVMBuildXor(b, x, LLVMBuildLShr(b, x, LLVMConstInt(e->t_i64, 31, 0), ""), "");
}

LLVMValueRef fb_emit_rand_bits(fb_emit *e, LLVMValueRef seed, LLVMValueRef launch,
                               LLVMValueRef site, LLVMValueRef iter, LLVMValueRef count) {
  LLVMValueRef h = mix64(e, seed);
  h = mix64(e, LLVMBuildXor(e->b, h, launch, ""));
  h = mix64(e, LLVMBuildXor(e->b, h, site, ""));
  h = mix64(e, LLVMBuildXor(e->b, h, iter, ""));
  return mix64(e, LLVMBuildXor(e->b, h, count, ""));
}

static int emit_rand(fb_emit *e, int id, const fb_stmt *s) {
  if ((fb_type)s->type != FB_T_F32)
    return fb_emit_error(e, FB_EINVAL, "%%%d rand: result must be f32", id);
  LLVMValueRef count = LLVMBuildLoad2(e->b, e->t_i64, e->rand_count, "count");
  LLVMBuildStore(e->b, LLVMBuildAdd(e->b, count, fb_emit_i64(e, 1), ""), e->rand_count);
  LLVMValueRef bits = fb_emit_rand_bits(e, e->c_seed, e->c_launch, fb_emit_i64(e, s->imm.i),
                                        e->rand_iter, count);
  LLVMValueRef top = LLVMBuildLShr(e->b, bits, LLVMConstInt(e->t_i64, 40, 0), "");
  LLVMValueRef f = LLVMBuildUIToFP(e->b, top, e->t_f32, "");
  e->vals[id] = LLVMBuildFMul(e->b, f, LLVMConstReal(e->t_f32, 1.0 / 16777216.0), "rand");
  return 0;
}

/* ---------------------------------------------------------------- dispatch */

int fb_emit_mem_op(fb_emit *e, int id, const fb_stmt *s) {
  switch (fb_op_table[s->op].cls) {
  case FB_OPC_ALLOCA: return emit_alloca(e, id, s);
  case FB_OPC_LLOAD: return emit_lload(e, id, s);
  case FB_OPC_LSTORE: return emit_lstore(e, id, s);
  case FB_OPC_GLOAD: return emit_load(e, id, s);
  case FB_OPC_GSTORE: return emit_store(e, id, s);
  case FB_OPC_ATOMIC: case FB_OPC_IATOMIC: return emit_atomic(e, id, s);
  case FB_OPC_SPARSE: return emit_sparse(e, id, s);
  case FB_OPC_APPEND: case FB_OPC_LENGTH:
    return fb_emit_error(e, FB_EUNSUPPORTED, "%%%d %s: dynamic SNodes are not supported by "
                         "code generation yet", id, opname(s));
  case FB_OPC_GTMP: return emit_gtmp(e, id, s);
  case FB_OPC_RET: return emit_ret(e, id, s);
  case FB_OPC_RAND: return emit_rand(e, id, s);
  default: return fb_emit_error(e, FB_EINTERNAL, "%%%d %s: not a memory op", id, opname(s));
  }
}
