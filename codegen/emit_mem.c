/* Lowering of statements that touch memory: local variables (allocas in the
 * entry block, zeroed where the alloca statement runs), global field access
 * with a bounds check per index (out of bounds: skipped, loads give 0,
 * FB_EBOUNDS latched in *ctx->error), atomics, the sparse ops (is_active,
 * activate, deactivate, append, length), the launch scratch buffer (gtmp),
 * return slots and the inline rand() generator. Atomics that reduce.c made
 * reductions become contributions there, and their one atomic at the end
 * of the body is emitted here (fb_emit_atomic_at).
 *
 * Addresses: a dense path is the arithmetic of fb_layout_dense_offset; a
 * path through sparse containers is walked from the root with one step
 * function per container kind (bitmasked, pointer, dynamic): reads leave
 * for "inactive" (giving 0) at the first inactive level, writes activate
 * each level (slow paths call the runtime of codegen/rt/fb_rt.c). Inside a
 * sparse struct_for, a field of the loop's container indexed by the loop's
 * own indices is addressed directly in the current cell. */
#include <stdio.h>
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
    return fb_emit_error(e, FB_EINVAL, "%%%d lload: operand is not %s %s variable", id,
                         fb_type_article((fb_type)s->type), fb_type_name((fb_type)s->type));
  e->vals[id] = LLVMBuildLoad2(e->b, fb_emit_type(e, (fb_type)s->type), e->vals[v], "");
  return 0;
}

static int emit_lstore(fb_emit *e, int id, const fb_stmt *s) {
  int v = var_of(e, s);
  LLVMValueRef x = fb_emit_arg(e, s, 1);
  if (!x) return e->rc;
  if (v < 0 || e->k->stmts[v].type != e->k->stmts[s->args[1]].type)
    return fb_emit_error(e, FB_EINVAL,
                         "%%%d lstore: operand 0 is not a variable of the "
                         "value's type",
                         id);
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
                           "%%%d %s: SNode %d (%s) is sparse; this path needs a dense one", id,
                           opname(&e->k->stmts[id]), n, fb_snode_kind_name(k));
  }
  return 0;
}

/* Is every container from the root down to snode (inclusive) dense? */
int fb_emit_dense_path(const fb_layout *l, int snode) {
  for (int n = snode; n > 0; n = l->nodes[n].parent)
    if (fb_cg_is_sparse(l->nodes[n].kind)) return 0;
  return 1;
}

/* Operands 0..n-1 of s are indices of snode (n = its dimension, or less by
 * `drop` for append/length): check their count and type, and AND together
 * 0 <= I < shape (unsigned compares) for the indices not proven in range
 * (range.c). idx[d] is operand d as an i64 (its sign extension: range.c's
 * twin where there is one, so that addresses stay affine in the loop
 * counter; the compare is on it too, which is the same test); *inb is NULL
 * when nothing needs checking.
 * The indices of snode's axes are those of its dimensions in order, minus
 * the skipped axis `skip_axis` (-1: none). */
static int index_check_ex(fb_emit *e, int id, const fb_stmt *s, int snode, int extra, int skip_axis,
                          const LLVMValueRef *given, LLVMValueRef idx[FB_MAX_AXES],
                          int axis[FB_MAX_AXES], LLVMValueRef *inb) {
  const fb_snode *sn = &e->l->nodes[snode];
  int n = 0;
  for (int d = 0; d < sn->ndim; d++)
    if (sn->dim_axis[d] != skip_axis) axis[n++] = sn->dim_axis[d];
  *inb = NULL;
  if (s->nargs != n + extra)
    return fb_emit_error(e, FB_EINVAL, "%%%d %s: SNode %d takes %d indices", id, opname(s), snode,
                         n);
  for (int d = 0; d < n; d++) {
    idx[d] = given ? given[d] : fb_emit_arg(e, s, d);
    if (!idx[d]) return e->rc;
    if (fb_emit_argtype(e, s, d) != FB_T_I32)
      return fb_emit_error(e, FB_EINVAL, "%%%d %s: index %d is not i32", id, opname(s), d);
    idx[d] = given ? LLVMBuildSExt(e->b, given[d], e->t_i64, "") : fb_cg_wide(e, s->args[d]);
    int64_t extent = sn->shape[axis[d]];
    if (fb_cg_in_range(e, s->args[d], 0, extent - 1)) continue;
    /* a sign-extended i32 is below extent (< 2^31) unsigned exactly when
     * the i32 is, unsigned */
    LLVMValueRef ext = fb_emit_i64(e, (int64_t)(uint32_t)(int32_t)extent);
    LLVMValueRef ok = LLVMBuildICmp(e->b, LLVMIntULT, idx[d], ext, "");
    *inb = *inb ? LLVMBuildAnd(e->b, *inb, ok, "") : ok;
  }
  return 0;
}

static int index_check(fb_emit *e, int id, const fb_stmt *s, int snode, int extra,
                       LLVMValueRef idx[FB_MAX_AXES], LLVMValueRef *inb) {
  int axis[FB_MAX_AXES];
  return index_check_ex(e, id, s, snode, extra, -1, NULL, idx, axis, inb);
}

/* Global indices by axis (i64, 0 where absent) from checked indices (i64:
 * in bounds, their sign and zero extensions agree). */
static void global_index(fb_emit *e, const LLVMValueRef idx[FB_MAX_AXES], const int *axis, int n,
                         LLVMValueRef gi[FB_MAX_AXES]) {
  for (int a = 0; a < FB_MAX_AXES; a++) gi[a] = fb_emit_i64(e, 0);
  for (int d = 0; d < n; d++) gi[axis[d]] = idx[d];
}

/* Row-major local cell number, inside its node, of the cell of container c
 * that covers global index gi of SNode leaf (a descendant of c, or c). */
static LLVMValueRef local_lin(fb_emit *e, const fb_snode *c, int leaf,
                              LLVMValueRef gi[FB_MAX_AXES]) {
  LLVMValueRef lin = fb_emit_i64(e, 0);
  for (int a = 0; a < FB_MAX_AXES; a++) {
    if (!(c->axes & (1u << a))) continue;
    int64_t stride = fb_layout_stride(e->l, c->id, leaf, a);
    LLVMValueRef local = gi[a];
    if (stride != 1) local = LLVMBuildUDiv(e->b, local, fb_emit_i64(e, stride), "");
    if (c->shape[a] != c->size[a]) /* an ancestor splits a too */
      local = LLVMBuildURem(e->b, local, fb_emit_i64(e, c->size[a]), "");
    lin = LLVMBuildAdd(e->b, LLVMBuildMul(e->b, lin, fb_emit_i64(e, c->size[a]), ""), local, "");
  }
  return lin;
}

static LLVMValueRef byte_gep(fb_emit *e, LLVMValueRef p, LLVMValueRef off) {
  return LLVMBuildGEP2(e->b, e->t_i8, p, &off, 1, "");
}

static LLVMValueRef byte_gepc(fb_emit *e, LLVMValueRef p, int64_t off) {
  return off ? byte_gep(e, p, fb_emit_i64(e, off)) : p;
}

/* Offset contribution of one dense container on the path to `leaf`:
 * node offset + (row-major local cell index) * cell bytes. */
static LLVMValueRef dense_step(fb_emit *e, const fb_snode *c, int leaf,
                               LLVMValueRef gi[FB_MAX_AXES]) {
  LLVMValueRef cell =
      LLVMBuildMul(e->b, local_lin(e, c, leaf, gi), fb_emit_i64(e, (int64_t)c->cell_bytes), "");
  return LLVMBuildAdd(e->b, fb_emit_i64(e, (int64_t)c->offset), cell, "");
}

/* The one axis c splits, or -1 when it splits none or several. */
static int single_axis(const fb_snode *c) {
  for (int a = 0; a < FB_MAX_AXES; a++)
    if (c->axes == (1u << a)) return a;
  return -1;
}

/* Can container c and the next one on the path, d, be addressed as one?
 * Both split only axis a, and c's cell is exactly d's cells along a:
 * then (I / st_c % sz_c) * cb_c + (I / st_d % sz_d) * cb_d, with
 * st_c = st_d * sz_d and cb_c = sz_d * cb_d, is (I / st_d % (sz_c * sz_d))
 * * cb_d: one division and one multiplication instead of a chain, and
 * plain I * cb_d when nothing else splits a (a field whose shape is
 * written as nested dense SNodes, `dense(i: 3) { dense(i: 9000) }`). */
static int merges(const fb_snode *c, const fb_snode *d) {
  int a = single_axis(c);
  return a >= 0 && single_axis(d) == a && c->cell_bytes == (uint64_t)d->size[a] * d->cell_bytes;
}

static LLVMValueRef nsw(LLVMValueRef v) {
  if (LLVMIsAInstruction(v)) LLVMSetNSW(v, 1); /* constants were folded */
  return v;
}

/* Address of place[idx] in the root buffer (dense path). The arithmetic
 * cannot wrap: indices are checked (or proven) in bounds, and the layout's
 * sizes are bounded (fb_layout_finalize), hence nuw/nsw and inbounds. */
static LLVMValueRef place_addr_in(fb_emit *e, LLVMValueRef root, int place,
                                  LLVMValueRef idx[FB_MAX_AXES]) {
  const fb_snode *f = &e->l->nodes[place];
  LLVMValueRef gi[FB_MAX_AXES];
  global_index(e, idx, f->dim_axis, f->ndim, gi);
  int path[64];
  int n = fb_layout_path(e->l, place, path, 64);
  int64_t cst = (int64_t)f->offset;
  LLVMValueRef off = NULL;
  for (int p = 0; p < n; p++) {
    const fb_snode *c = &e->l->nodes[path[p]];
    LLVMValueRef step;
    int q = p;
    int64_t size = c->size[single_axis(c) < 0 ? 0 : single_axis(c)];
    cst += (int64_t)c->offset;
    while (q + 1 < n && merges(&e->l->nodes[path[q]], &e->l->nodes[path[q + 1]])) {
      const fb_snode *d = &e->l->nodes[path[++q]];
      size *= d->size[single_axis(d)];
      cst += (int64_t)d->offset;
    }
    if (q == p) {
      step = LLVMBuildMul(e->b, local_lin(e, c, place, gi), fb_emit_i64(e, (int64_t)c->cell_bytes),
                          "");
    } else {
      const fb_snode *d = &e->l->nodes[path[q]];
      int a = single_axis(c);
      int64_t stride = fb_layout_stride(e->l, d->id, place, a);
      LLVMValueRef local = gi[a];
      if (stride != 1) local = LLVMBuildUDiv(e->b, local, fb_emit_i64(e, stride), "");
      if (c->shape[a] != c->size[a]) /* an ancestor of the group splits a too */
        local = LLVMBuildURem(e->b, local, fb_emit_i64(e, size), "");
      step = nsw(LLVMBuildNUWMul(e->b, local, fb_emit_i64(e, (int64_t)d->cell_bytes), ""));
      p = q;
    }
    off = off ? nsw(LLVMBuildNUWAdd(e->b, off, step, "")) : step;
  }
  LLVMValueRef k = fb_emit_i64(e, cst);
  off = off ? nsw(LLVMBuildNUWAdd(e->b, off, k, "")) : k;
  /* a private copy's base (priv.c) is not an object of its own: no inbounds */
  if (root != e->c_root) return LLVMBuildGEP2(e->b, e->t_i8, root, &off, 1, "paddr");
  return LLVMBuildInBoundsGEP2(e->b, e->t_i8, root, &off, 1, "addr");
}

static LLVMValueRef place_addr(fb_emit *e, int place, LLVMValueRef idx[FB_MAX_AXES]) {
  return place_addr_in(e, e->c_root, place, idx);
}

/* Type-based alias information: each field (place) its own TBAA type under
 * a root of our own, so LLVM knows that an access to one field never
 * touches another (all fields share the root buffer, which otherwise hides
 * it): loads of v stay in registers across stores to new_x, and loops need
 * no run-time overlap checks between fields. Sound because places occupy
 * disjoint bytes (the layout's dense cells; sparse blocks come from one
 * allocator per SNode and are never reused within a task, docs/sparse.md);
 * what is not tagged (the runtime's own accesses under clang's root,
 * scratch, the paired 64-bit CAS) may alias anything; the sparse
 * structure (slots, masks) has a type of its own, tag_slots below. The error
 * flag (another allocation) has a type of its own too, so that a latch on
 * a cold out-of-bounds path does not make LLVM reload every field. */
static void tag_named(fb_emit *e, LLVMValueRef inst, const char *name, size_t n) {
  LLVMMetadataRef root_s = LLVMMDStringInContext2(e->c, "fusebox fields", 14);
  LLVMMetadataRef root = LLVMMDNodeInContext2(e->c, &root_s, 1);
  LLVMMetadataRef ops[3] = {LLVMMDStringInContext2(e->c, name, n), root,
                            LLVMValueAsMetadata(fb_emit_i64(e, 0))};
  LLVMMetadataRef type = LLVMMDNodeInContext2(e->c, ops, 3);
  LLVMMetadataRef tag_ops[3] = {type, type, LLVMValueAsMetadata(fb_emit_i64(e, 0))};
  LLVMMetadataRef tag = LLVMMDNodeInContext2(e->c, tag_ops, 3);
  LLVMSetMetadata(inst, LLVMGetMDKindIDInContext(e->c, "tbaa", 4), LLVMMetadataAsValue(e->c, tag));
}

/* A field or slot access inside a cell loop marked parallel joins its
 * access group (emit.c, "Parallel cell loops"); the error word's atomics
 * and everything untagged stay out of it. */
static void join_group(fb_emit *e, LLVMValueRef inst) {
  if (!e->access_group) return;
  LLVMSetMetadata(inst, LLVMGetMDKindIDInContext(e->c, "llvm.access.group", 17),
                  LLVMMetadataAsValue(e->c, e->access_group));
}

static void tag_field(fb_emit *e, LLVMValueRef inst, int place) {
  char name[32];
  int n = snprintf(name, sizeof name, "fb.place.%d", place);
  tag_named(e, inst, name, (size_t)n);
  join_group(e, inst);
}

/* The structure of sparse containers (pointer slots, bitmask words, a
 * dynamic node's length and chunk slots) has a type of its own, apart from
 * every field: a walk's slot loads then stay valid across field stores,
 * so LLVM reuses them (the components of a cell stored one after the
 * other, the next cell's walk) and hoists those whose address is invariant
 * out of a cell loop. Every access of ours to that memory carries this tag
 * (loads, activation's atomic or, deactivation's and/exchange), so none
 * moves past another; the runtime's (activation, append, clear, release,
 * list generation: calls, or code inlined under clang's root) may alias
 * anything. Sound for the reason above: slots and masks occupy bytes of
 * their own in the layout, apart from every place's. */
static void tag_slots(fb_emit *e, LLVMValueRef inst) {
  tag_named(e, inst, "fb.slots", 8);
  join_group(e, inst);
}

/* ---------------------------------------------------------------- sparse walk
 * From the root down a path of containers, one step per container kind.
 * Reading, an inactive level leaves for w->off; writing, each level is
 * activated on the way (allocation failing leaves for w->off). */

typedef struct walk {
  int leaf;                   /* SNode whose index space gi is in */
  LLVMValueRef gi[FB_MAX_AXES];
  int write;
  LLVMBasicBlockRef off;
  int zero;                   /* a load's walk: inactive levels may go on in the zero block */
  int part; /* fused part an activation's out of memory blames */
} walk;

/* A load's walk on the CPU goes on through an inactive level in a block of
 * zeros (FB_CG_ZERO_SYM, FB_CG_ZERO_BYTES of read-only zero pages the JIT
 * defines) instead of leaving: select(active, cell, zeros), no branch. The
 * load then reads 0, as an inactive cell must; the levels below read null
 * slots and zero lengths from it and stay in it. Without branches the walks
 * of neighbouring accesses are straight-line code that LLVM merges and
 * schedules together (a trilinear sample: 8 walks), as Taichi's reads of an
 * "ambient" element are. Only where what lies below the level (a pointer's
 * block, a dynamic chunk, a bitmasked cell) fits in the zero block; never
 * for writes (store_na and atomics keep their exits), nor on NVPTX. */
static LLVMValueRef zero_block(fb_emit *e, walk *w, int64_t bytes) {
  if (!w->zero || w->write || e->o->target != FB_CG_CPU || bytes > FB_CG_ZERO_BYTES) return NULL;
  LLVMValueRef g = LLVMGetNamedGlobal(e->m, FB_CG_ZERO_SYM);
  if (!g) {
    g = LLVMAddGlobal(e->m, LLVMArrayType2(e->t_i8, FB_CG_ZERO_BYTES), FB_CG_ZERO_SYM);
    LLVMSetGlobalConstant(g, 1);
    LLVMSetLinkage(g, LLVMExternalLinkage);
    LLVMSetAlignment(g, 64);
  }
  return g;
}

static LLVMValueRef ptr_of_i64(fb_emit *e, LLVMValueRef v) {
  return fb_emit_global(e, LLVMBuildIntToPtr(e->b, v, e->t_ptr, ""));
}

/* Go on in a new block when cond holds, else leave for w->off. */
static void continue_if(fb_emit *e, walk *w, LLVMValueRef cond, const char *name) {
  LLVMBasicBlockRef on = fb_emit_block(e, name);
  LLVMBuildCondBr(e->b, cond, on, w->off);
  LLVMPositionBuilderAtEnd(e->b, on);
}

/* The result of a fast path and a slow path joined in a new block. */
static LLVMValueRef join2(fb_emit *e, LLVMValueRef a, LLVMBasicBlockRef abb, LLVMValueRef b,
                          LLVMBasicBlockRef bbb, const char *name) {
  LLVMBasicBlockRef j = fb_emit_block(e, name);
  LLVMPositionBuilderAtEnd(e->b, abb);
  LLVMBuildBr(e->b, j);
  LLVMPositionBuilderAtEnd(e->b, bbb);
  LLVMBuildBr(e->b, j);
  LLVMPositionBuilderAtEnd(e->b, j);
  LLVMValueRef phi = LLVMBuildPhi(e->b, LLVMTypeOf(a), "");
  LLVMValueRef v[2] = {a, b};
  LLVMBasicBlockRef bb[2] = {abb, bbb};
  LLVMAddIncoming(phi, v, bb, 2);
  return phi;
}

static LLVMValueRef rt_ctx(fb_emit *e) { return e->ctx; }

/* bitmasked: the cell's bit in the mask words; writing sets it. */
static LLVMValueRef bitmasked_step(fb_emit *e, walk *w, const fb_snode *c, LLVMValueRef base) {
  LLVMValueRef lin = local_lin(e, c, w->leaf, w->gi);
  LLVMValueRef node = byte_gepc(e, base, (int64_t)c->offset);
  LLVMValueRef wordoff =
      LLVMBuildMul(e->b, LLVMBuildLShr(e->b, lin, fb_emit_i64(e, 5), ""), fb_emit_i64(e, 4), "");
  LLVMValueRef wp = byte_gep(e, node, wordoff);
  LLVMValueRef sh =
      LLVMBuildTrunc(e->b, LLVMBuildAnd(e->b, lin, fb_emit_i64(e, 31), ""), e->t_i32, "");
  LLVMValueRef bit = LLVMBuildShl(e->b, fb_emit_i32(e, 1), sh, "bit");
  LLVMValueRef word = LLVMBuildLoad2(e->b, e->t_i32, wp, "mask");
  LLVMSetAlignment(word, 4);
  tag_slots(e, word);
  LLVMValueRef set = LLVMBuildICmp(e->b, LLVMIntNE, LLVMBuildAnd(e->b, word, bit, ""),
                                   fb_emit_i32(e, 0), "active");
  LLVMValueRef zero = w->write ? NULL : zero_block(e, w, (int64_t)c->cell_bytes);
  if (zero) {
    LLVMValueRef cells = byte_gepc(e, node, (int64_t)fb_cg_mask_bytes(c));
    LLVMValueRef cell =
        byte_gep(e, cells, LLVMBuildMul(e->b, lin, fb_emit_i64(e, (int64_t)c->cell_bytes), ""));
    return LLVMBuildSelect(e->b, set, cell, zero, "bm.cell");
  }
  if (!w->write) {
    continue_if(e, w, set, "bm.on");
  } else {
    LLVMBasicBlockRef act = fb_emit_block(e, "bm.activate");
    LLVMBasicBlockRef on = fb_emit_block(e, "bm.on");
    LLVMBuildCondBr(e->b, set, on, act);
    LLVMPositionBuilderAtEnd(e->b, act);
    LLVMValueRef old =
        LLVMBuildAtomicRMW(e->b, LLVMAtomicRMWBinOpOr, wp, bit, LLVMAtomicOrderingMonotonic, 0);
    LLVMSetAlignment(old, 4);
    tag_slots(e, old);
    LLVMBuildBr(e->b, on);
    LLVMPositionBuilderAtEnd(e->b, on);
  }
  LLVMValueRef cells = byte_gepc(e, node, (int64_t)fb_cg_mask_bytes(c));
  return byte_gep(e, cells, LLVMBuildMul(e->b, lin, fb_emit_i64(e, (int64_t)c->cell_bytes), ""));
}

/* pointer: the slot holds the child block (one cell); writing allocates it. */
static LLVMValueRef pointer_step(fb_emit *e, walk *w, const fb_snode *c, LLVMValueRef base) {
  LLVMValueRef lin = local_lin(e, c, w->leaf, w->gi);
  LLVMValueRef slot = byte_gep(e, base,
                               LLVMBuildAdd(e->b, fb_emit_i64(e, (int64_t)c->offset),
                                            LLVMBuildMul(e->b, lin, fb_emit_i64(e, 8), ""), ""));
  LLVMValueRef p = LLVMBuildLoad2(e->b, e->t_i64, slot, "slot");
  LLVMSetAlignment(p, 8);
  tag_slots(e, p);
  LLVMValueRef live = LLVMBuildICmp(e->b, LLVMIntNE, p, fb_emit_i64(e, 0), "");
  if (!w->write) {
    LLVMValueRef zero = zero_block(e, w, (int64_t)c->cell_bytes);
    if (zero) return LLVMBuildSelect(e->b, live, ptr_of_i64(e, p), zero, "ptr.cell");
    continue_if(e, w, live, "ptr.on");
    return ptr_of_i64(e, p);
  }
  LLVMBasicBlockRef fast = fb_emit_block(e, "ptr.on");
  LLVMBasicBlockRef slow = fb_emit_block(e, "ptr.activate");
  LLVMBuildCondBr(e->b, live, fast, slow);
  LLVMPositionBuilderAtEnd(e->b, fast);
  LLVMValueRef fp = ptr_of_i64(e, p);
  LLVMBasicBlockRef fast_end = LLVMGetInsertBlock(e->b);
  LLVMPositionBuilderAtEnd(e->b, slow);
  LLVMValueRef args[4] = {rt_ctx(e), LLVMConstInt(e->t_i32, (unsigned long long)c->id, 0),
                          fb_emit_generic(e, slot), fb_emit_i32(e, w->part)};
  LLVMValueRef q = fb_emit_call(e, "fb_rt_ptr_activate", e->t_ptr, args, 4);
  continue_if(e, w, LLVMBuildIsNotNull(e->b, q, ""), "ptr.got");
  LLVMValueRef sp = fb_emit_global(e, q);
  return join2(e, fp, fast_end, sp, LLVMGetInsertBlock(e->b), "ptr.cell");
}

/* dynamic: cells below the length are active, in chunks; writing raises
 * the length and allocates the chunks up to the cell's. */
static LLVMValueRef dynamic_step(fb_emit *e, walk *w, const fb_snode *c, LLVMValueRef base) {
  LLVMValueRef n = local_lin(e, c, w->leaf, w->gi);
  LLVMValueRef node = byte_gepc(e, base, (int64_t)c->offset);
  LLVMValueRef len = LLVMBuildLoad2(e->b, e->t_i64, node, "len");
  LLVMSetAlignment(len, 8);
  tag_slots(e, len);
  LLVMValueRef ck = fb_emit_i64(e, c->chunk);
  LLVMValueRef q = LLVMBuildUDiv(e->b, n, ck, "");
  LLVMValueRef slot = byte_gep(
      e, node,
      LLVMBuildAdd(e->b, fb_emit_i64(e, 8), LLVMBuildMul(e->b, q, fb_emit_i64(e, 8), ""), ""));
  LLVMValueRef chunk = LLVMBuildLoad2(e->b, e->t_i64, slot, "chunk");
  LLVMSetAlignment(chunk, 8);
  tag_slots(e, chunk);
  LLVMValueRef live =
      LLVMBuildAnd(e->b, LLVMBuildICmp(e->b, LLVMIntULT, n, len, ""),
                   LLVMBuildICmp(e->b, LLVMIntNE, chunk, fb_emit_i64(e, 0), ""), "");
  LLVMValueRef within = LLVMBuildMul(e->b, LLVMBuildURem(e->b, n, ck, ""),
                                     fb_emit_i64(e, (int64_t)c->cell_bytes), "");
  if (!w->write) {
    LLVMValueRef zero = zero_block(e, w, c->chunk * (int64_t)c->cell_bytes);
    if (zero)
      return byte_gep(e, LLVMBuildSelect(e->b, live, ptr_of_i64(e, chunk), zero, "dyn.chunk"),
                      within);
    continue_if(e, w, live, "dyn.on");
    return byte_gep(e, ptr_of_i64(e, chunk), within);
  }
  LLVMBasicBlockRef fast = fb_emit_block(e, "dyn.on");
  LLVMBasicBlockRef slow = fb_emit_block(e, "dyn.activate");
  LLVMBuildCondBr(e->b, live, fast, slow);
  LLVMPositionBuilderAtEnd(e->b, fast);
  LLVMValueRef fp = byte_gep(e, ptr_of_i64(e, chunk), within);
  LLVMBasicBlockRef fast_end = LLVMGetInsertBlock(e->b);
  LLVMPositionBuilderAtEnd(e->b, slow);
  LLVMValueRef args[7] = {rt_ctx(e),
                          LLVMConstInt(e->t_i32, (unsigned long long)c->id, 0),
                          fb_emit_generic(e, node),
                          n,
                          ck,
                          fb_emit_i64(e, (int64_t)c->cell_bytes),
                          fb_emit_i32(e, w->part)};
  LLVMValueRef cell = fb_emit_call(e, "fb_rt_dyn_activate", e->t_ptr, args, 7);
  continue_if(e, w, LLVMBuildIsNotNull(e->b, cell, ""), "dyn.got");
  LLVMValueRef sp = fb_emit_global(e, cell);
  return join2(e, fp, fast_end, sp, LLVMGetInsertBlock(e->b), "dyn.cell");
}

/* Storage of the cell of container `last` covering w->gi (last = 0: the
 * root's cell), walking every container on the way. */
static LLVMValueRef walk_to(fb_emit *e, walk *w, int last) {
  int path[64];
  int n = last > 0 ? fb_layout_path(e->l, last, path, 63) : 0;
  if (n < 0) {
    fb_emit_error(e, FB_EUNSUPPORTED, "SNode %d lies more than 63 levels deep", last);
    return NULL;
  }
  if (last > 0) path[n++] = last;
  LLVMValueRef base = e->c_root;
  for (int i = 0; i < n; i++) {
    const fb_snode *c = &e->l->nodes[path[i]];
    switch (c->kind) {
    case FB_SN_BITMASKED: base = bitmasked_step(e, w, c, base); break;
    case FB_SN_POINTER: base = pointer_step(e, w, c, base); break;
    case FB_SN_DYNAMIC: base = dynamic_step(e, w, c, base); break;
    default: base = byte_gep(e, base, dense_step(e, c, w->leaf, w->gi)); break;
    }
  }
  return base;
}

/* ---------------------------------------------------------------- bounds guard */

_Static_assert(FB_IR_MAX_PART == FB_RT_MAX_PART, "the blame word holds every fused part");

typedef struct guard {
  LLVMBasicBlockRef bad, join;
} guard;

/* FB_EBOUNDS into error[0] (the first error wins) and the access's fused
 * part into the blame word error[1] (the earliest part wins: atomic max of
 * FB_RT_BLAME(part), codegen/rt/fb_rt.h), on the cold path only. */
static void latch_bounds(fb_emit *e, int part) {
  LLVMValueRef x =
      LLVMBuildAtomicCmpXchg(e->b, e->c_error, fb_emit_i32(e, 0), fb_emit_i32(e, FB_EBOUNDS),
                             LLVMAtomicOrderingMonotonic, LLVMAtomicOrderingMonotonic, 0);
  tag_named(e, x, "fb.error", 8);
  LLVMValueRef one = fb_emit_i64(e, 1);
  LLVMValueRef word = LLVMBuildGEP2(e->b, e->t_i32, e->c_error, &one, 1, "blame");
  LLVMValueRef m =
      LLVMBuildAtomicRMW(e->b, LLVMAtomicRMWBinOpMax, word, fb_emit_i32(e, FB_RT_BLAME(part)),
                         LLVMAtomicOrderingMonotonic, 0);
  tag_named(e, m, "fb.error", 8);
}

/* The smallest fused part among statements ids[0..n) (one access made of
 * several statements answers for the earliest). */
static int min_part(const fb_emit *e, const int *ids, int n) {
  int p = e->k->stmts[ids[0]].part;
  for (int i = 1; i < n; i++)
    if (e->k->stmts[ids[i]].part < p) p = e->k->stmts[ids[i]].part;
  return p;
}

/* Run what follows only when inb holds; otherwise latch FB_EBOUNDS, blaming
 * fused part `part`. */
static void guard_begin(fb_emit *e, LLVMValueRef inb, int part, guard *g) {
  g->bad = g->join = NULL;
  if (!inb) return;
  LLVMBasicBlockRef ok = fb_emit_block(e, "inbounds");
  g->bad = fb_emit_block(e, "outofbounds");
  g->join = fb_emit_block(e, "access.done");
  LLVMBuildCondBr(e->b, inb, ok, g->bad);
  LLVMPositionBuilderAtEnd(e->b, g->bad);
  latch_bounds(e, part);
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

/* The same shape for a sparse walk: what follows runs on the active path;
 * an inactive (or unallocatable) cell gives `skipped`. */
static LLVMValueRef off_end(fb_emit *e, LLVMBasicBlockRef off, LLVMValueRef v,
                            LLVMValueRef skipped) {
  LLVMBasicBlockRef on = LLVMGetInsertBlock(e->b);
  LLVMBasicBlockRef j = fb_emit_block(e, "sparse.done");
  LLVMBuildBr(e->b, j);
  LLVMPositionBuilderAtEnd(e->b, off);
  LLVMBuildBr(e->b, j);
  LLVMPositionBuilderAtEnd(e->b, j);
  if (!v) return NULL;
  LLVMValueRef phi = LLVMBuildPhi(e->b, LLVMTypeOf(v), "");
  LLVMValueRef vals[2] = {v, skipped};
  LLVMBasicBlockRef bbs[2] = {on, off};
  LLVMAddIncoming(phi, vals, bbs, 2);
  return phi;
}

/* ---------------------------------------------------------------- global access */

static int check_place(fb_emit *e, int id, const fb_stmt *s) {
  if (s->snode < 0 || s->snode >= e->l->nnodes || e->l->nodes[s->snode].kind != FB_SN_PLACE)
    return fb_emit_error(e, FB_EINVAL, "%%%d %s: SNode %d is not a field", id, opname(s), s->snode);
  return 0;
}

static void set_align(LLVMValueRef v, fb_type t) { LLVMSetAlignment(v, (unsigned)fb_type_size(t)); }

/* Inside a sparse struct_for: is s's SNode (a field, or the container,
 * under the loop's container T) indexed by exactly the loop's indices? Then
 * the cell is the loop's own, active, and its storage is at hand. */
static int loop_cell(fb_emit *e, const fb_stmt *s) {
  if (!e->sfor_cell || e->has_deactivate) return 0;
  const fb_snode *sn = &e->l->nodes[s->snode];
  int owner = sn->kind == FB_SN_PLACE ? sn->parent : sn->id;
  if (owner != e->sfor_T || s->nargs < sn->ndim) return 0;
  for (int d = 0; d < sn->ndim; d++) {
    int a = s->args[d];
    if (a < 0 || a >= e->k->nstmts) return 0;
    const fb_stmt *ix = &e->k->stmts[a];
    if (ix->op != FB_OP_LOOP_INDEX || ix->args[0] != e->sfor_loop || ix->imm.i != d) return 0;
  }
  return 1;
}

/* Address of place[idx...] for s: directly in the loop's cell, through the
 * dense arithmetic, or through a sparse walk (activating when `write` > 0;
 * write < 0: for a load, which may read an inactive cell's 0 from the zero
 * block). On the sparse path *off receives the block an inactive cell
 * leaves for. */
static LLVMValueRef field_addr(fb_emit *e, const fb_stmt *s, LLVMValueRef idx[FB_MAX_AXES],
                               int write, LLVMBasicBlockRef *off) {
  const fb_snode *f = &e->l->nodes[s->snode];
  *off = NULL;
  if (loop_cell(e, s)) return byte_gepc(e, e->sfor_cell, (int64_t)f->offset);
  if (fb_emit_dense_path(e->l, f->parent)) return place_addr(e, s->snode, idx);
  /* write < 0: a load, whose walk may go on in the zero block */
  walk w = {s->snode,  {0},    write > 0, fb_emit_block(e, write > 0 ? "skip" : "inactive"),
            write < 0, s->part};
  global_index(e, idx, f->dim_axis, f->ndim, w.gi);
  LLVMValueRef cell = walk_to(e, &w, f->parent);
  *off = w.off;
  return cell ? byte_gepc(e, cell, (int64_t)f->offset) : NULL;
}

static int emit_load(fb_emit *e, int id, const fb_stmt *s) {
  LLVMValueRef idx[FB_MAX_AXES], inb;
  if (check_place(e, id, s) || index_check(e, id, s, s->snode, 0, idx, &inb)) return e->rc;
  if (e->spec_nocheck) inb = NULL; /* proven by the caller (emit.c, skipped blocks) */
  fb_type t = e->l->nodes[s->snode].type;
  LLVMValueRef zero = LLVMConstNull(fb_emit_type(e, t));
  guard g;
  guard_begin(e, inb, s->part, &g);
  LLVMBasicBlockRef off;
  LLVMValueRef p = field_addr(e, s, idx, -1, &off);
  if (!p) return e->rc;
  LLVMValueRef v = LLVMBuildLoad2(e->b, fb_emit_memtype(e, t), p, "");
  set_align(v, t);
  tag_field(e, v, s->snode);
  v = fb_emit_from_mem(e, t, v);
  if (off) v = off_end(e, off, v, zero);
  e->vals[id] = guard_end(e, &g, v, zero);
  return 0;
}

int fb_emit_load_inb(fb_emit *e, int id, LLVMValueRef *inb) {
  const fb_stmt *s = &e->k->stmts[id];
  LLVMValueRef idx[FB_MAX_AXES];
  *inb = NULL;
  if (check_place(e, id, s)) return e->rc;
  return index_check(e, id, s, s->snode, 0, idx, inb);
}

/* Loads of several fields of one sparse container at the same indices, one
 * after the other in a block (the components of a vector field: `v[I]` is
 * v.0[I], v.1[I], v.2[I]): one bounds check and one walk, then a load of
 * each field from the cell, each value joined on its own. Each load alone
 * would walk the path again (LLVM does not merge walks whose inactive exits
 * rejoin in between). The same values: the same cell, and the loads read
 * memory that nothing writes in between. same_cell: statement id2 is a's
 * op on another field of a's container at a's first nidx arguments (its
 * indices; a store's last argument is its value). */
static int same_cell(fb_emit *e, const fb_stmt *a, int id2, int nidx) {
  if (id2 < 0 || id2 >= e->k->nstmts || e->done[id2]) return 0;
  const fb_stmt *b = &e->k->stmts[id2];
  const fb_layout *l = e->l;
  if (b->op != a->op || b->nargs != a->nargs || b->snode <= 0 || b->snode >= l->nnodes) return 0;
  const fb_snode *fa = &l->nodes[a->snode], *fb = &l->nodes[b->snode];
  if (fb->kind != FB_SN_PLACE || fb->parent != fa->parent || fb->ndim != fa->ndim) return 0;
  for (int d = 0; d < nidx; d++)
    if (a->args[d] != b->args[d]) return 0;
  return 1;
}

/* The first statement of a group of loads (store 0) or stores (store 1)
 * that fb_emit_try_loads / fb_emit_try_stores may take: an access not yet
 * emitted to a place under a sparse path, outside a cell loop's own cell,
 * with at least one more in ids; NULL when the group does not apply. */
static const fb_stmt *group_lead(fb_emit *e, const int *ids, int n, int store) {
  if (n < 2 || e->bounds_fn || ids[0] < 0 || ids[0] >= e->k->nstmts || e->done[ids[0]]) return NULL;
  const fb_stmt *s = &e->k->stmts[ids[0]];
  const fb_layout *l = e->l;
  int op_ok = store ? s->op == FB_OP_STORE || s->op == FB_OP_STORE_NA : s->op == FB_OP_LOAD;
  if (!op_ok || s->snode <= 0 || s->snode >= l->nnodes || l->nodes[s->snode].kind != FB_SN_PLACE ||
      fb_emit_dense_path(l, l->nodes[s->snode].parent) || loop_cell(e, s))
    return NULL;
  return s;
}

int fb_emit_try_loads(fb_emit *e, const int *ids, int n) {
  enum {
    MAXG = 16
  };
  const fb_stmt *s = group_lead(e, ids, n, 0);
  if (!s) return 0;
  int id = ids[0];
  const fb_layout *l = e->l;
  int m = 1;
  while (m < n && m < MAXG && same_cell(e, s, ids[m], s->nargs)) m++;
  if (m < 2) return 0;
  LLVMValueRef idx[FB_MAX_AXES], inb;
  if (index_check(e, id, s, s->snode, 0, idx, &inb)) return -1;
  guard g;
  guard_begin(e, inb, min_part(e, ids, m), &g);
  const fb_snode *f0 = &l->nodes[s->snode];
  walk w = {s->snode, {0}, 0, fb_emit_block(e, "inactive"), 1, s->part};
  global_index(e, idx, f0->dim_axis, f0->ndim, w.gi);
  LLVMValueRef cell = walk_to(e, &w, f0->parent);
  if (!cell) return -1;
  LLVMBasicBlockRef off = w.off;
  LLVMValueRef v[MAXG], zero[MAXG];
  for (int j = 0; j < m; j++) {
    const fb_snode *f = &l->nodes[e->k->stmts[ids[j]].snode];
    zero[j] = LLVMConstNull(fb_emit_type(e, f->type));
    v[j] = LLVMBuildLoad2(e->b, fb_emit_memtype(e, f->type), byte_gepc(e, cell, (int64_t)f->offset),
                          "");
    set_align(v[j], f->type);
    tag_field(e, v[j], f->id);
    v[j] = fb_emit_from_mem(e, f->type, v[j]);
  }
  /* join: the inactive exit (zeros), then the bounds guard (zeros) */
  LLVMBasicBlockRef on = LLVMGetInsertBlock(e->b), j1 = fb_emit_block(e, "sparse.done");
  LLVMBuildBr(e->b, j1);
  LLVMPositionBuilderAtEnd(e->b, off);
  LLVMBuildBr(e->b, j1);
  LLVMPositionBuilderAtEnd(e->b, j1);
  for (int j = 0; j < m; j++) {
    LLVMValueRef phi = LLVMBuildPhi(e->b, LLVMTypeOf(v[j]), "");
    LLVMValueRef vals[2] = {v[j], zero[j]};
    LLVMBasicBlockRef bbs[2] = {on, off};
    LLVMAddIncoming(phi, vals, bbs, 2);
    v[j] = phi;
  }
  if (g.join) {
    LLVMBasicBlockRef ok = LLVMGetInsertBlock(e->b);
    LLVMBuildBr(e->b, g.join);
    LLVMPositionBuilderAtEnd(e->b, g.join);
    for (int j = 0; j < m; j++) {
      LLVMValueRef phi = LLVMBuildPhi(e->b, LLVMTypeOf(v[j]), "");
      LLVMValueRef vals[2] = {v[j], zero[j]};
      LLVMBasicBlockRef bbs[2] = {ok, g.bad};
      LLVMAddIncoming(phi, vals, bbs, 2);
      v[j] = phi;
    }
  }
  for (int j = 0; j < m; j++) {
    e->vals[ids[j]] = v[j];
    e->done[ids[j]] = 1;
  }
  e->stmts += m;
  return m;
}

/* The value operand (after the indices) of a store/atomic, of the field's type. */
static LLVMValueRef value_operand(fb_emit *e, int id, const fb_stmt *s, fb_type t, int vi) {
  LLVMValueRef v = fb_emit_arg(e, s, vi);
  if (v && fb_emit_argtype(e, s, vi) != t) {
    fb_emit_error(e, FB_EINVAL, "%%%d %s: value is %s, the field holds %s", id, opname(s),
                  fb_type_name(fb_emit_argtype(e, s, vi)), fb_type_name(t));
    return NULL;
  }
  return v;
}

/* store_na and atomic_*_na (the optimizer's activation demotion): the cell
 * was proved active; on an inactive one the write is skipped. */
static int no_activation(fb_op op) {
  return op == FB_OP_STORE_NA || (op >= FB_OP_ATOMIC_ADD_NA && op <= FB_OP_ATOMIC_XOR_NA);
}

static int emit_store(fb_emit *e, int id, const fb_stmt *s) {
  LLVMValueRef idx[FB_MAX_AXES], inb;
  if (check_place(e, id, s) || index_check(e, id, s, s->snode, 1, idx, &inb)) return e->rc;
  fb_type t = e->l->nodes[s->snode].type;
  LLVMValueRef v = value_operand(e, id, s, t, e->l->nodes[s->snode].ndim);
  if (!v) return e->rc;
  guard g;
  guard_begin(e, inb, s->part, &g);
  LLVMBasicBlockRef off;
  LLVMValueRef p = field_addr(e, s, idx, !no_activation((fb_op)s->op), &off);
  if (!p) return e->rc;
  LLVMValueRef st = LLVMBuildStore(e->b, fb_emit_to_mem(e, t, v), p);
  set_align(st, t);
  tag_field(e, st, s->snode);
  if (off) off_end(e, off, NULL, NULL);
  guard_end(e, &g, NULL, NULL);
  return 0;
}

/* Stores of several fields of one sparse container at the same indices,
 * one after the other in a block, by the same op (the components of a
 * vector field: `q[I] = r` is q.0[I] = r.0, q.1[I] = r.1, q.2[I] = r.2):
 * one bounds check and one walk (activating for store, skipping an
 * inactive cell for store_na), then a store of each field into the cell.
 * Each store alone would walk the path again (and, before slot loads had
 * a TBAA type of their own, reload each level's slot after the previous
 * store). Same effect: the same cell is activated (or
 * found inactive) once instead of once per field, and the values are
 * computed before the first store. */
int fb_emit_try_stores(fb_emit *e, const int *ids, int n) {
  enum {
    MAXG = 16
  };
  const fb_stmt *s = group_lead(e, ids, n, 1);
  if (!s) return 0;
  int id = ids[0];
  const fb_layout *l = e->l;
  int m = 1;
  while (m < n && m < MAXG && same_cell(e, s, ids[m], l->nodes[s->snode].ndim)) m++;
  if (m < 2) return 0;
  LLVMValueRef idx[FB_MAX_AXES], inb, v[MAXG];
  if (index_check(e, id, s, s->snode, 1, idx, &inb)) return -1;
  for (int j = 0; j < m; j++) {
    const fb_stmt *sj = &e->k->stmts[ids[j]];
    const fb_snode *f = &l->nodes[sj->snode];
    if (sj->nargs != f->ndim + 1) {
      fb_emit_error(e, FB_EINVAL, "%%%d %s: SNode %d takes %d indices", ids[j], opname(sj),
                    sj->snode, f->ndim);
      return -1;
    }
    v[j] = value_operand(e, ids[j], sj, f->type, f->ndim);
    if (!v[j]) return -1;
  }
  guard g;
  guard_begin(e, inb, min_part(e, ids, m), &g);
  const fb_snode *f0 = &l->nodes[s->snode];
  int write = s->op == FB_OP_STORE;
  /* a group's walk activates for its earliest part, which writes first */
  walk w = {s->snode,           {0}, write, fb_emit_block(e, write ? "skip" : "inactive"), 0,
            min_part(e, ids, m)};
  global_index(e, idx, f0->dim_axis, f0->ndim, w.gi);
  LLVMValueRef cell = walk_to(e, &w, f0->parent);
  if (!cell) return -1;
  for (int j = 0; j < m; j++) {
    const fb_snode *f = &l->nodes[e->k->stmts[ids[j]].snode];
    LLVMValueRef st = LLVMBuildStore(e->b, fb_emit_to_mem(e, f->type, v[j]),
                                     byte_gepc(e, cell, (int64_t)f->offset));
    set_align(st, f->type);
    tag_field(e, st, f->id);
  }
  off_end(e, w.off, NULL, NULL);
  guard_end(e, &g, NULL, NULL);
  for (int j = 0; j < m; j++) e->done[ids[j]] = 1;
  e->stmts += m;
  return m;
}

/* The atomicrmw operation for op on type t, or -1 when undefined. */
static int atomic_binop(fb_op op, fb_type t) {
  int fl = fb_type_is_float(t), sg = fb_type_is_signed(t);
  if (t == FB_T_BOOL && op != FB_OP_ATOMIC_AND && op != FB_OP_ATOMIC_OR && op != FB_OP_ATOMIC_XOR)
    return -1;
  switch (op) {
  case FB_OP_ATOMIC_ADD:
  case FB_OP_ATOMIC_ADD_NA: return fl ? LLVMAtomicRMWBinOpFAdd : LLVMAtomicRMWBinOpAdd;
  case FB_OP_ATOMIC_SUB:
  case FB_OP_ATOMIC_SUB_NA: return fl ? LLVMAtomicRMWBinOpFSub : LLVMAtomicRMWBinOpSub;
  case FB_OP_ATOMIC_MIN:
  case FB_OP_ATOMIC_MIN_NA:
    return fl ? LLVMAtomicRMWBinOpFMin : sg ? LLVMAtomicRMWBinOpMin : LLVMAtomicRMWBinOpUMin;
  case FB_OP_ATOMIC_MAX:
  case FB_OP_ATOMIC_MAX_NA:
    return fl ? LLVMAtomicRMWBinOpFMax : sg ? LLVMAtomicRMWBinOpMax : LLVMAtomicRMWBinOpUMax;
  case FB_OP_ATOMIC_AND:
  case FB_OP_ATOMIC_AND_NA: return fl ? -1 : LLVMAtomicRMWBinOpAnd;
  case FB_OP_ATOMIC_OR:
  case FB_OP_ATOMIC_OR_NA: return fl ? -1 : LLVMAtomicRMWBinOpOr;
  case FB_OP_ATOMIC_XOR:
  case FB_OP_ATOMIC_XOR_NA: return fl ? -1 : LLVMAtomicRMWBinOpXor;
  default: return -1;
  }
}

int fb_emit_atomic_at(fb_emit *e, int id, const fb_stmt *s, const LLVMValueRef *given,
                      LLVMValueRef v) {
  LLVMValueRef idx[FB_MAX_AXES], inb;
  int axis[FB_MAX_AXES];
  if (check_place(e, id, s) || index_check_ex(e, id, s, s->snode, 1, -1, given, idx, axis, &inb))
    return e->rc;
  fb_type t = e->l->nodes[s->snode].type;
  int bop = atomic_binop((fb_op)s->op, t);
  if (bop < 0)
    return fb_emit_error(e, FB_EINVAL, "%%%d %s: not defined on %s", id, opname(s),
                         fb_type_name(t));
  if (!v) v = value_operand(e, id, s, t, e->l->nodes[s->snode].ndim);
  if (!v) return e->rc;
  LLVMValueRef zero = LLVMConstNull(fb_emit_type(e, t));
  guard g;
  guard_begin(e, inb, s->part, &g);
  if (e->priv_place && e->priv_place[s->snode] && e->c_priv) {
    /* privatized scatter (priv.c): this thread's own copy, no lock; an
     * f32 or a 32-bit integer (modulo 2^32) */
    LLVMValueRef p = place_addr_in(e, e->c_priv, s->snode, idx);
    LLVMValueRef mv = fb_emit_to_mem(e, t, v);
    LLVMValueRef old = LLVMBuildLoad2(e->b, LLVMTypeOf(mv), p, "priv.old");
    set_align(old, t);
    tag_field(e, old, s->snode);
    LLVMValueRef sum = t == FB_T_F32 ? LLVMBuildFAdd(e->b, old, mv, "priv.sum")
                                     : LLVMBuildAdd(e->b, old, mv, "priv.sum");
    LLVMValueRef st = LLVMBuildStore(e->b, sum, p);
    set_align(st, t);
    tag_field(e, st, s->snode);
    e->vals[id] = guard_end(e, &g, old, zero);
    return 0;
  }
  LLVMBasicBlockRef off;
  LLVMValueRef p = field_addr(e, s, idx, !no_activation((fb_op)s->op), &off);
  if (!p) return e->rc;
  LLVMValueRef old = LLVMBuildAtomicRMW(e->b, (LLVMAtomicRMWBinOp)bop, p, fb_emit_to_mem(e, t, v),
                                        LLVMAtomicOrderingMonotonic, 0);
  set_align(old, t);
  tag_field(e, old, s->snode);
  old = fb_emit_from_mem(e, t, old);
  if (off) old = off_end(e, off, old, zero);
  e->vals[id] = guard_end(e, &g, old, zero);
  return 0;
}

/* Grouped atomics. f32 atomic adds on several components of one cell,
 * found a few statements apart in one block (`grid_v[I] += v` and
 * `grid_m[I] += m` in a P2G scatter, when both fields are placed in one
 * cell), share one index check and one address computation: on a sparse
 * path that is one pointer walk (and at most one activation) instead of
 * one per component. Components on the two halves of one aligned 8-byte
 * word are added by one 64-bit compare-and-swap of a <2 x float> sum
 * instead of two f32 compare-and-swap loops (on the CPU an f32 `atomicrmw
 * fadd` is such a loop): half the locked operations, each component still
 * updated atomically (both at once, which no other access can tell apart).
 * Four components filling a 16-aligned block (mpm3d's `m: f32, v: f32[3]`
 * cell) are one 16-byte compare-and-swap where the target has cmpxchg16b
 * (fb_cg_options.cas16): a quarter of the locked operations.
 *
 * Members: the same op (atomic_add, or all atomic_add_na), places of one
 * cell (one parent) at distinct offsets, indices that are the same values
 * (the same statements, or pure computations of the same ops over the same
 * operands), results unused, none a reduction (reduce.c), not the loop's
 * own cell. Between members only pure value ops and loads of dense fields
 * that no member adds to may stand; they are emitted first, so the atomics
 * move after them, which nothing can observe (the atomics' results are
 * unused, pure ops touch no memory, and such a load reads a value the
 * group's atomics leave alone; monotonic atomics promise no order with
 * other locations).
 * CPU only (f32 atomic adds are native on NVPTX); the cell's path holds
 * dense and pointer containers only, whose storage is 8-aligned (the root
 * buffer, and pool blocks: docs/sparse.md). */
#define GROUP_MAX 4   /* components per group */
#define GROUP_SCAN 32 /* statements looked at past the first member */

/* Are statements a and b the same value wherever both are defined in one
 * block? The same statement, or the same pure op with the same immediate,
 * SNode and type over operands that are the same values. */
static int same_value(const fb_kernel *k, int a, int b, int depth) {
  if (a == b) return 1;
  if (a < 0 || b < 0 || a >= k->nstmts || b >= k->nstmts || depth > 8) return 0;
  const fb_stmt *x = &k->stmts[a], *y = &k->stmts[b];
  if (x->op != y->op || x->type != y->type || x->nargs != y->nargs || x->snode != y->snode ||
      x->imm.u != y->imm.u || x->body >= 0 || y->body >= 0 || x->op >= FB_OP__COUNT ||
      !(fb_op_table[x->op].flags & FB_OPF_PURE))
    return 0;
  for (int i = 0; i < x->nargs && i < FB_MAX_ARGS; i++)
    if (!same_value(k, x->args[i], y->args[i], depth + 1)) return 0;
  return 1;
}

/* Is every container on the cell's path dense or pointer, each at an
 * 8-aligned offset with 8-byte multiples for cells? */
static int aligned_path(const fb_layout *l, int place) {
  int path[64];
  int n = fb_layout_path(l, place, path, 64);
  if (n < 0) return 0;
  for (int p = 0; p < n; p++) {
    const fb_snode *c = &l->nodes[path[p]];
    if (c->kind != FB_SN_DENSE && c->kind != FB_SN_POINTER && c->kind != FB_SN_PLACE &&
        c->kind != FB_SN_ROOT)
      return 0;
    if (c->offset % 8 || c->cell_bytes % 8) return 0;
  }
  return 1;
}

/* Can atomic id lead or join a group? */
static int group_member(fb_emit *e, int id) {
  const fb_kernel *k = e->k;
  if (id < 0 || id >= k->nstmts || e->done[id] || e->used[id]) return 0;
  if (e->red_of && e->red_of[id] >= 0) return 0;
  const fb_stmt *a = &k->stmts[id];
  if (e->priv_place && a->snode >= 0 && a->snode < e->l->nnodes && e->priv_place[a->snode])
    return 0; /* a private add needs no compare-and-swap */
  if (a->op != FB_OP_ATOMIC_ADD && a->op != FB_OP_ATOMIC_ADD_NA) return 0;
  const fb_layout *l = e->l;
  if (a->snode <= 0 || a->snode >= l->nnodes) return 0;
  const fb_snode *f = &l->nodes[a->snode];
  return f->kind == FB_SN_PLACE && f->type == FB_T_F32 && a->nargs == f->ndim + 1 &&
         fb_emit_argtype(e, a, f->ndim) == FB_T_F32 && !loop_cell(e, a);
}

static int joins(fb_emit *e, const int *m, int n, int id) {
  const fb_kernel *k = e->k;
  const fb_stmt *a = &k->stmts[m[0]], *b = &k->stmts[id];
  const fb_snode *fa = &e->l->nodes[a->snode], *fb = &e->l->nodes[b->snode];
  if (b->op != a->op || fb->parent != fa->parent || fb->ndim != fa->ndim) return 0;
  for (int i = 0; i < n; i++)
    if (e->l->nodes[k->stmts[m[i]].snode].offset == fb->offset) return 0;
  for (int d = 0; d < fa->ndim; d++)
    if (!same_value(k, a->args[d], b->args[d], 0)) return 0;
  return 1;
}

/* May statement id stand between members (emitted before the group)? A
 * pure value, or a read of a local variable: no atomic on a field changes
 * a local, and an lstore, which could, is not movable, so the read sees
 * the same store either way (lowering keeps field elements in locals
 * across serial loops: optimizer/pass_promote.c). */
static int movable(fb_emit *e, int id) {
  if (id < 0 || id >= e->k->nstmts || e->done[id]) return 0;
  const fb_stmt *s = &e->k->stmts[id];
  return s->op < FB_OP__COUNT &&
         ((fb_op_table[s->op].flags & FB_OPF_PURE) || s->op == FB_OP_LLOAD) && s->body < 0 &&
         s->orelse < 0;
}

static int listed(const int *v, int n, int x) {
  for (int i = 0; i < n; i++)
    if (v[i] == x) return 1;
  return 0;
}

/* A load of a dense field that no member adds to (nor, checked as members
 * join, any later member): it may move before the group's atomics, which
 * leave its value alone (a thread of its own could tell the order only
 * through an ordering that monotonic atomics do not give). */
static int dense_load(fb_emit *e, int id, const int *m, int n) {
  if (id < 0 || id >= e->k->nstmts || e->done[id]) return 0;
  const fb_stmt *s = &e->k->stmts[id];
  if (s->op != FB_OP_LOAD || s->snode <= 0 || s->snode >= e->l->nnodes ||
      e->l->nodes[s->snode].kind != FB_SN_PLACE || !fb_emit_dense_path(e->l, e->l->nodes[s->snode].parent))
    return 0;
  for (int i = 0; i < n; i++)
    if (e->k->stmts[m[i]].snode == s->snode) return 0;
  return 1;
}

/* *p += {x[0], ..., x[n-1]} (n = 2 or 4 f32 in one aligned 8- or 16-byte
 * block at p) by a compare-and-swap loop on the block as one integer:
 * each component updated atomically, all at once. The first guess is
 * read in 8-byte halves, which may tear: a torn guess only fails the
 * swap, which returns the block as it is. */
static void vector_cas(fb_emit *e, LLVMValueRef p, const LLVMValueRef *x, int n) {
  unsigned bytes = 4u * (unsigned)n;
  LLVMTypeRef vt = LLVMVectorType(e->t_f32, (unsigned)n);
  LLVMTypeRef it = LLVMIntTypeInContext(e->c, 8 * bytes);
  LLVMValueRef add = LLVMGetUndef(vt);
  for (int i = 0; i < n; i++) add = LLVMBuildInsertElement(e->b, add, x[i], fb_emit_i32(e, i), "");
  LLVMValueRef first = NULL;
  for (unsigned h = 0; h < bytes / 8; h++) {
    LLVMValueRef half = LLVMBuildLoad2(e->b, e->t_i64, byte_gepc(e, p, 8 * (int64_t)h), "cas.old");
    LLVMSetOrdering(half, LLVMAtomicOrderingMonotonic);
    LLVMSetAlignment(half, 8);
    if (bytes == 8) {
      first = half;
      break;
    }
    half = LLVMBuildZExt(e->b, half, it, "");
    if (h) half = LLVMBuildShl(e->b, half, LLVMConstInt(it, 64 * h, 0), "");
    first = first ? LLVMBuildOr(e->b, first, half, "") : half;
  }
  LLVMBasicBlockRef pre = LLVMGetInsertBlock(e->b);
  LLVMBasicBlockRef loop = fb_emit_block(e, "cas.loop"), done = fb_emit_block(e, "cas.done");
  LLVMBuildBr(e->b, loop);
  LLVMPositionBuilderAtEnd(e->b, loop);
  LLVMValueRef old = LLVMBuildPhi(e->b, it, "");
  LLVMAddIncoming(old, &first, &pre, 1);
  LLVMValueRef sum = LLVMBuildFAdd(e->b, LLVMBuildBitCast(e->b, old, vt, ""), add, "");
  LLVMValueRef x2 = LLVMBuildAtomicCmpXchg(e->b, p, old, LLVMBuildBitCast(e->b, sum, it, ""),
                                           LLVMAtomicOrderingMonotonic, LLVMAtomicOrderingMonotonic, 0);
  LLVMSetAlignment(x2, bytes);
  LLVMValueRef seen = LLVMBuildExtractValue(e->b, x2, 0, "");
  LLVMAddIncoming(old, &seen, &loop, 1);
  LLVMBuildCondBr(e->b, LLVMBuildExtractValue(e->b, x2, 1, ""), done, loop);
  LLVMPositionBuilderAtEnd(e->b, done);
}

/* Is every container above the place's cell 16-aligned (offsets and cell
 * sizes multiples of 16)? Then so is the cell: the root buffer is
 * 64-aligned and pool blocks' data 16-aligned (runtime/sparse.c). */
static int aligned16_path(const fb_layout *l, int place) {
  int path[64];
  int n = fb_layout_path(l, place, path, 64);
  if (n < 0) return 0;
  for (int p = 0; p < n; p++) {
    const fb_snode *c = &l->nodes[path[p]];
    if (c->kind != FB_SN_PLACE && (c->offset % 16 || c->cell_bytes % 16)) return 0;
  }
  return 1;
}

/* Do members m[i..i+4) sit at offsets o, o+4, o+8, o+12 of a 16-aligned cell? */
static int quad_at(fb_emit *e, const int *m, int n, int i, int quad_ok) {
  if (!quad_ok || i + 4 > n) return 0;
  int64_t o = (int64_t)e->l->nodes[e->k->stmts[m[i]].snode].offset;
  if (o % 16) return 0;
  for (int j = 1; j < 4; j++)
    if ((int64_t)e->l->nodes[e->k->stmts[m[i + j]].snode].offset != o + 4 * j) return 0;
  return 1;
}

/* Emit the group m[0..n) (sorted by offset below): one check, one address. */
static int emit_group(fb_emit *e, int *m, int n) {
  const fb_kernel *k = e->k;
  for (int i = 1; i < n; i++) /* by offset in the cell */
    for (int j = i; j > 0 && e->l->nodes[k->stmts[m[j]].snode].offset <
                                 e->l->nodes[k->stmts[m[j - 1]].snode].offset;
         j--) {
      int t = m[j];
      m[j] = m[j - 1];
      m[j - 1] = t;
    }
  const fb_stmt *a = &k->stmts[m[0]];
  const fb_snode *fa = &e->l->nodes[a->snode];
  LLVMValueRef idx[FB_MAX_AXES], inb, v[GROUP_MAX];
  if (index_check(e, m[0], a, a->snode, 1, idx, &inb)) return -1;
  for (int i = 0; i < n; i++) {
    v[i] = fb_emit_arg(e, &k->stmts[m[i]], fa->ndim);
    if (!v[i]) return -1;
  }
  guard g;
  guard_begin(e, inb, min_part(e, m, n), &g);
  LLVMBasicBlockRef off;
  LLVMValueRef p = field_addr(e, a, idx, !no_activation((fb_op)a->op), &off);
  if (!p) return -1;
  LLVMValueRef cell = byte_gepc(e, p, -(int64_t)fa->offset);
  int quad_ok = e->o->cas16 && aligned16_path(e->l, a->snode);
  for (int i = 0; i < n; i++) {
    const fb_stmt *s = &k->stmts[m[i]];
    int64_t o = (int64_t)e->l->nodes[s->snode].offset;
    LLVMValueRef q = byte_gepc(e, cell, o);
    if (quad_at(e, m, n, i, quad_ok)) {
      vector_cas(e, q, v + i, 4); /* cmpxchg16b */
      i += 3;
      continue;
    }
    if (o % 8 == 0 && i + 1 < n && (int64_t)e->l->nodes[k->stmts[m[i + 1]].snode].offset == o + 4) {
      vector_cas(e, q, v + i, 2);
      i++;
      continue;
    }
    LLVMValueRef old =
        LLVMBuildAtomicRMW(e->b, LLVMAtomicRMWBinOpFAdd, q, v[i], LLVMAtomicOrderingMonotonic, 0);
    set_align(old, FB_T_F32);
    tag_field(e, old, s->snode);
  }
  if (off) off_end(e, off, NULL, NULL);
  guard_end(e, &g, NULL, NULL);
  for (int i = 0; i < n; i++) { /* the old values are unused: anything of the right type */
    e->vals[m[i]] = LLVMConstNull(e->t_f32);
    e->done[m[i]] = 1;
  }
  e->stmts += n;
  return 0;
}

int fb_emit_try_group(fb_emit *e, int blk, int i, int to) {
  if (e->o->target != FB_CG_CPU || e->bounds_fn || !e->used) return 0;
  const fb_block *b = &e->k->blocks[blk];
  int first = b->ids[i];
  if (!group_member(e, first) || !aligned_path(e->l, e->k->stmts[first].snode)) return 0;
  int m[GROUP_MAX] = {first}, n = 1, last = i, loads[GROUP_SCAN + 1], nl = 0;
  for (int j = i + 1; j < to && j < b->n && j - i <= GROUP_SCAN && n < GROUP_MAX; j++) {
    int id = b->ids[j];
    if (group_member(e, id) && joins(e, m, n, id) && !listed(loads, nl, e->k->stmts[id].snode)) {
      m[n++] = id;
      last = j;
    } else if (dense_load(e, id, m, n)) loads[nl++] = e->k->stmts[id].snode;
    else if (!movable(e, id)) break;
  }
  if (n < 2) return 0;
  /* worth it: a pair to share a compare-and-swap, or a walk to share */
  const fb_layout *l = e->l;
  int pair = 0;
  for (int x = 0; x < n; x++)
    for (int y = 0; y < n; y++) {
      int64_t ox = (int64_t)l->nodes[e->k->stmts[m[x]].snode].offset;
      int64_t oy = (int64_t)l->nodes[e->k->stmts[m[y]].snode].offset;
      if (ox % 8 == 0 && oy == ox + 4) pair = 1;
    }
  if (!pair && fb_emit_dense_path(l, l->nodes[e->k->stmts[first].snode].parent)) return 0;
  for (int j = i + 1; j < last; j++) {
    int id = b->ids[j], member = 0;
    for (int x = 0; x < n; x++) member |= m[x] == id;
    if (!member && fb_emit_stmt(e, id)) return -1;
  }
  if (emit_group(e, m, n)) return -1;
  return last - i + 1;
}

/* ---------------------------------------------------------------- sparse ops */

/* deactivate at the level of container c, whose node sits in `base`. */
static void deactivate_level(fb_emit *e, walk *w, const fb_snode *c, LLVMValueRef base) {
  LLVMValueRef lin = local_lin(e, c, w->leaf, w->gi);
  LLVMValueRef sid = LLVMConstInt(e->t_i32, (unsigned long long)c->id, 0);
  LLVMValueRef node = byte_gepc(e, base, (int64_t)c->offset);
  char name[48];
  if (c->kind == FB_SN_BITMASKED) {
    LLVMValueRef wp = byte_gep(
        e, node,
        LLVMBuildMul(e->b, LLVMBuildLShr(e->b, lin, fb_emit_i64(e, 5), ""), fb_emit_i64(e, 4), ""));
    LLVMValueRef sh =
        LLVMBuildTrunc(e->b, LLVMBuildAnd(e->b, lin, fb_emit_i64(e, 31), ""), e->t_i32, "");
    LLVMValueRef bit = LLVMBuildShl(e->b, fb_emit_i32(e, 1), sh, "");
    LLVMValueRef old =
        LLVMBuildAtomicRMW(e->b, LLVMAtomicRMWBinOpAnd, wp, LLVMBuildNot(e->b, bit, ""),
                           LLVMAtomicOrderingMonotonic, 0);
    LLVMSetAlignment(old, 4);
    tag_slots(e, old);
    continue_if(
        e, w,
        LLVMBuildICmp(e->b, LLVMIntNE, LLVMBuildAnd(e->b, old, bit, ""), fb_emit_i32(e, 0), ""),
        "bm.clear");
    fb_rt_cell d;
    char msg[256];
    if (fb_cg_cell_desc(e->l, c->id, &d, msg, sizeof msg)) {
      fb_emit_error(e, FB_EUNSUPPORTED, "%s", msg);
      return;
    }
    snprintf(name, sizeof name, "fb.cell.%d", c->id);
    LLVMValueRef cells = byte_gepc(e, node, (int64_t)fb_cg_mask_bytes(c));
    LLVMValueRef cell =
        byte_gep(e, cells, LLVMBuildMul(e->b, lin, fb_emit_i64(e, (int64_t)c->cell_bytes), ""));
    LLVMValueRef args[3] = {rt_ctx(e), fb_emit_desc(e, &d, sizeof d, name),
                            fb_emit_generic(e, cell)};
    fb_emit_call(e, "fb_rt_cell_clear", e->t_void, args, 3);
  } else if (c->kind == FB_SN_POINTER) {
    LLVMValueRef slot = byte_gep(e, node, LLVMBuildMul(e->b, lin, fb_emit_i64(e, 8), ""));
    LLVMValueRef old = LLVMBuildAtomicRMW(e->b, LLVMAtomicRMWBinOpXchg, slot, fb_emit_i64(e, 0),
                                          LLVMAtomicOrderingAcquireRelease, 0);
    LLVMSetAlignment(old, 8);
    tag_slots(e, old);
    continue_if(e, w, LLVMBuildICmp(e->b, LLVMIntNE, old, fb_emit_i64(e, 0), ""), "ptr.release");
    LLVMValueRef args[3] = {rt_ctx(e), sid, LLVMBuildIntToPtr(e->b, old, e->t_ptr, "")};
    fb_emit_call(e, "fb_rt_release", e->t_void, args, 3);
  } else {
    LLVMValueRef len = LLVMBuildLoad2(e->b, e->t_i64, node, "len");
    LLVMSetAlignment(len, 8);
    tag_slots(e, len);
    continue_if(e, w, LLVMBuildICmp(e->b, LLVMIntULT, lin, len, ""), "dyn.clear");
    int64_t nch = (c->ncells + c->chunk - 1) / c->chunk;
    LLVMValueRef args[4] = {rt_ctx(e), sid, fb_emit_generic(e, node), fb_emit_i64(e, nch)};
    fb_emit_call(e, "fb_rt_dyn_clear", e->t_void, args, 4);
  }
}

/* is_active on the CPU without a branch per level: walk, as a load does
 * (through the zero block), to the cell that holds the nearest sparse
 * container P at or above c, then test P's own cell: its slot, its mask
 * bit, or its length and chunk. An inactive level above P selects the zero
 * block, where P's slot, bit and length read 0: false, as it must be (the
 * same invariant as loads': what lies below such a level fits in the zero
 * block; a level where it does not keeps its exit to w->off). Dense levels
 * between P and c are active with P. The branching walk cost a compare and
 * a branch per level and kept neighbouring walks apart (Taichi's
 * taichi_sparse.py paints with is_active of three pointer levels per pixel:
 * 1.75 ms a frame here against 0.57 ms for the pixel's read alone). NULL
 * (nothing emitted) off the CPU, or with e->rc set on an error. */
static LLVMValueRef active_flag(fb_emit *e, walk *w, int c) {
  if (e->o->target != FB_CG_CPU) return NULL;
  int p = c;
  while (p > 0 && !fb_cg_is_sparse(e->l->nodes[p].kind)) p = e->l->nodes[p].parent;
  if (p <= 0) return NULL;
  const fb_snode *P = &e->l->nodes[p];
  w->zero = 1;
  LLVMValueRef base = walk_to(e, w, P->parent);
  if (!base) return NULL;
  LLVMValueRef lin = local_lin(e, P, w->leaf, w->gi);
  LLVMValueRef node = byte_gepc(e, base, (int64_t)P->offset);
  if (P->kind == FB_SN_POINTER) {
    LLVMValueRef slot = byte_gep(e, node, LLVMBuildMul(e->b, lin, fb_emit_i64(e, 8), ""));
    LLVMValueRef v = LLVMBuildLoad2(e->b, e->t_i64, slot, "slot");
    LLVMSetAlignment(v, 8);
    tag_slots(e, v);
    return LLVMBuildICmp(e->b, LLVMIntNE, v, fb_emit_i64(e, 0), "active");
  }
  if (P->kind == FB_SN_BITMASKED) {
    LLVMValueRef wp = byte_gep(
        e, node,
        LLVMBuildMul(e->b, LLVMBuildLShr(e->b, lin, fb_emit_i64(e, 5), ""), fb_emit_i64(e, 4), ""));
    LLVMValueRef sh =
        LLVMBuildTrunc(e->b, LLVMBuildAnd(e->b, lin, fb_emit_i64(e, 31), ""), e->t_i32, "");
    LLVMValueRef word = LLVMBuildLoad2(e->b, e->t_i32, wp, "mask");
    LLVMSetAlignment(word, 4);
    tag_slots(e, word);
    LLVMValueRef bit = LLVMBuildShl(e->b, fb_emit_i32(e, 1), sh, "bit");
    return LLVMBuildICmp(e->b, LLVMIntNE, LLVMBuildAnd(e->b, word, bit, ""), fb_emit_i32(e, 0),
                         "active");
  }
  /* dynamic: below the length, and its chunk allocated */
  LLVMValueRef len = LLVMBuildLoad2(e->b, e->t_i64, node, "len");
  LLVMSetAlignment(len, 8);
  tag_slots(e, len);
  LLVMValueRef q = LLVMBuildUDiv(e->b, lin, fb_emit_i64(e, P->chunk), "");
  LLVMValueRef slot = byte_gep(
      e, node,
      LLVMBuildAdd(e->b, fb_emit_i64(e, 8), LLVMBuildMul(e->b, q, fb_emit_i64(e, 8), ""), ""));
  LLVMValueRef chunk = LLVMBuildLoad2(e->b, e->t_i64, slot, "chunk");
  LLVMSetAlignment(chunk, 8);
  tag_slots(e, chunk);
  return LLVMBuildAnd(e->b, LLVMBuildICmp(e->b, LLVMIntULT, lin, len, ""),
                      LLVMBuildICmp(e->b, LLVMIntNE, chunk, fb_emit_i64(e, 0), ""), "active");
}

/* is_active / activate / deactivate on SNode s->snode (a field means its
 * container), indices in its cell space. */
static int emit_sparse(fb_emit *e, int id, const fb_stmt *s) {
  if (s->snode <= 0 || s->snode >= e->l->nnodes)
    return fb_emit_error(e, FB_EINVAL, "%%%d %s: no SNode %d", id, opname(s), s->snode);
  const fb_snode *sn = &e->l->nodes[s->snode];
  int c = sn->kind == FB_SN_PLACE ? sn->parent : sn->id;
  if (s->op == FB_OP_DEACTIVATE && !fb_cg_is_sparse(e->l->nodes[c].kind))
  {
    const char *kn, *cn = e->l->nodes[c].name;
    int kl = fb_emit_kernel_name(e, &kn);
    return fb_emit_error(e, FB_EUNSUPPORTED,
                         "kernel '%.*s' deactivates SNode %s%s%s (SNode %d), which is %s; "
                         "deactivate needs a sparse (bitmasked, pointer or dynamic) SNode",
                         kl, kn, cn ? "'" : "", cn ? cn : "", cn ? "'" : "", c,
                         fb_snode_kind_name(e->l->nodes[c].kind));
  }
  LLVMValueRef idx[FB_MAX_AXES], inb;
  if (index_check(e, id, s, s->snode, 0, idx, &inb)) return e->rc;
  LLVMValueRef yes = LLVMConstInt(e->t_i1, 1, 0), no = LLVMConstInt(e->t_i1, 0, 0);
  guard g;
  guard_begin(e, inb, s->part, &g);
  LLVMValueRef r = yes;
  if (s->op != FB_OP_DEACTIVATE && (fb_emit_dense_path(e->l, c) || loop_cell(e, s))) {
    /* always active, or the loop's own cell */
  } else {
    walk w = {s->snode, {0}, s->op == FB_OP_ACTIVATE, fb_emit_block(e, "inactive"), 0, s->part};
    global_index(e, idx, sn->dim_axis, sn->ndim, w.gi);
    LLVMValueRef flag = s->op == FB_OP_IS_ACTIVE ? active_flag(e, &w, c) : NULL;
    if (e->rc) return e->rc;
    if (flag) {
      yes = flag;
    } else if (s->op == FB_OP_DEACTIVATE) {
      LLVMValueRef base = walk_to(e, &w, e->l->nodes[c].parent);
      if (base) deactivate_level(e, &w, &e->l->nodes[c], base);
    } else {
      walk_to(e, &w, c);
    }
    if (e->rc) return e->rc;
    r = off_end(e, w.off, yes, no);
  }
  r = guard_end(e, &g, r, no);
  if (s->op == FB_OP_IS_ACTIVE) e->vals[id] = r;
  return 0;
}

/* The dynamic node of append/length on field s->snode: the walk to its
 * container's parent cell (activating when write), then the node. */
static const fb_snode *dynamic_node(fb_emit *e, int id, const fb_stmt *s, int extra, int write,
                                    LLVMValueRef *inb, walk *w) {
  const fb_snode *f = &e->l->nodes[s->snode];
  if (f->kind != FB_SN_PLACE || f->parent <= 0 || e->l->nodes[f->parent].kind != FB_SN_DYNAMIC) {
    fb_emit_error(e, FB_EINVAL, "%%%d %s: SNode %d is not a field under a dynamic SNode", id,
                  opname(s), s->snode);
    return NULL;
  }
  const fb_snode *d = &e->l->nodes[f->parent];
  int dyn_axis = -1;
  for (int a = 0; a < FB_MAX_AXES; a++)
    if (d->axes & (1u << a)) dyn_axis = a;
  LLVMValueRef idx[FB_MAX_AXES];
  int axis[FB_MAX_AXES];
  if (index_check_ex(e, id, s, s->snode, extra, dyn_axis, NULL, idx, axis, inb)) return NULL;
  w->leaf = s->snode;
  w->write = write;
  w->off = NULL;
  w->zero = 0;
  w->part = s->part;
  global_index(e, idx, axis, f->ndim - 1, w->gi);
  return d; /* the caller walks after opening its guard */
}

static int emit_length(fb_emit *e, int id, const fb_stmt *s) {
  walk w;
  LLVMValueRef inb;
  const fb_snode *d = dynamic_node(e, id, s, 0, 0, &inb, &w);
  if (!d) return e->rc;
  LLVMValueRef zero = fb_emit_i32(e, 0);
  guard g;
  guard_begin(e, inb, s->part, &g);
  w.off = fb_emit_block(e, "inactive");
  LLVMValueRef base = walk_to(e, &w, d->parent);
  if (!base) return e->rc;
  LLVMValueRef len = LLVMBuildLoad2(e->b, e->t_i64, byte_gepc(e, base, (int64_t)d->offset), "len");
  LLVMSetAlignment(len, 8);
  tag_slots(e, len);
  LLVMValueRef max = fb_emit_i64(e, d->ncells);
  len = LLVMBuildSelect(e->b, LLVMBuildICmp(e->b, LLVMIntULT, len, max, ""), len, max, "");
  LLVMValueRef v = off_end(e, w.off, LLVMBuildTrunc(e->b, len, e->t_i32, ""), zero);
  e->vals[id] = guard_end(e, &g, v, zero);
  return 0;
}

static int emit_append(fb_emit *e, int id, const fb_stmt *s) {
  walk w;
  LLVMValueRef inb;
  const fb_snode *d = dynamic_node(e, id, s, 1, 1, &inb, &w);
  if (!d) return e->rc;
  const fb_snode *f = &e->l->nodes[s->snode];
  LLVMValueRef v = value_operand(e, id, s, f->type, f->ndim - 1);
  if (!v) return e->rc;
  LLVMValueRef fail = fb_emit_i32(e, -1);
  LLVMValueRef nvar = LLVMBuildAlloca(e->ab, e->t_i64, "append.n");
  guard g;
  guard_begin(e, inb, s->part, &g);
  w.off = fb_emit_block(e, "skip");
  LLVMValueRef base = walk_to(e, &w, d->parent);
  if (!base) return e->rc;
  LLVMValueRef node = byte_gepc(e, base, (int64_t)d->offset);
  LLVMValueRef args[8] = {rt_ctx(e),
                          LLVMConstInt(e->t_i32, (unsigned long long)d->id, 0),
                          fb_emit_generic(e, node),
                          fb_emit_i64(e, d->ncells),
                          fb_emit_i64(e, d->chunk),
                          fb_emit_i64(e, (int64_t)d->cell_bytes),
                          nvar,
                          fb_emit_i32(e, s->part)};
  LLVMValueRef cell = fb_emit_call(e, "fb_rt_dyn_append", e->t_ptr, args, 8);
  LLVMValueRef n = LLVMBuildTrunc(e->b, LLVMBuildLoad2(e->b, e->t_i64, nvar, ""), e->t_i32, "slot");
  LLVMBasicBlockRef put = fb_emit_block(e, "append.put");
  LLVMBasicBlockRef done = fb_emit_block(e, "append.done");
  LLVMBuildCondBr(e->b, LLVMBuildIsNotNull(e->b, cell, ""), put, done);
  LLVMPositionBuilderAtEnd(e->b, put);
  LLVMValueRef dst = byte_gepc(e, fb_emit_global(e, cell), (int64_t)f->offset);
  LLVMValueRef st = LLVMBuildStore(e->b, fb_emit_to_mem(e, f->type, v), dst);
  set_align(st, f->type);
  LLVMBuildBr(e->b, done);
  LLVMPositionBuilderAtEnd(e->b, done);
  LLVMValueRef r = off_end(e, w.off, n, fail);
  e->vals[id] = guard_end(e, &g, r, fail);
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

/* rand_seq: the rand() calls after it use launch + imm.i, counted from 0. */
static int emit_rand_seq(fb_emit *e, const fb_stmt *s) {
  LLVMBuildStore(e->b, LLVMBuildAdd(e->b, e->c_launch, fb_emit_i64(e, s->imm.i), ""),
                 e->rand_launch);
  LLVMBuildStore(e->b, fb_emit_i64(e, 0), e->rand_count);
  return 0;
}

static int emit_rand(fb_emit *e, int id, const fb_stmt *s) {
  if (s->op == FB_OP_RAND_SEQ) return emit_rand_seq(e, s);
  if ((fb_type)s->type != FB_T_F32)
    return fb_emit_error(e, FB_EINVAL, "%%%d rand: result must be f32", id);
  LLVMValueRef count = LLVMBuildLoad2(e->b, e->t_i64, e->rand_count, "count");
  LLVMBuildStore(e->b, LLVMBuildAdd(e->b, count, fb_emit_i64(e, 1), ""), e->rand_count);
  LLVMValueRef launch = LLVMBuildLoad2(e->b, e->t_i64, e->rand_launch, "launch");
  LLVMValueRef bits =
      fb_emit_rand_bits(e, e->c_seed, launch, fb_emit_i64(e, s->imm.i), e->rand_iter, count);
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
  case FB_OPC_ATOMIC:
  case FB_OPC_IATOMIC:
    if (e->red_of && e->red_of[id] >= 0) return fb_reduce_contribute(e, id, s);
    return fb_emit_atomic_at(e, id, s, NULL, NULL);
  case FB_OPC_SPARSE: return emit_sparse(e, id, s);
  case FB_OPC_APPEND: return emit_append(e, id, s);
  case FB_OPC_LENGTH: return emit_length(e, id, s);
  case FB_OPC_GTMP: return emit_gtmp(e, id, s);
  case FB_OPC_RET: return emit_ret(e, id, s);
  case FB_OPC_RAND: return emit_rand(e, id, s);
  default: return fb_emit_error(e, FB_EINTERNAL, "%%%d %s: not a memory op", id, opname(s));
  }
}
