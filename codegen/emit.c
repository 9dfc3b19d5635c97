/* Task IR -> LLVM IR: the module skeleton, the body and bounds functions of
 * a task (see the ABI in codegen.h), structured control flow (if, while,
 * range_for, break/continue) and parallel loops: the task's own loop becomes
 * the [lo, hi) iteration loop of the body (a grid-stride loop on NVPTX);
 * any other par_for/struct_for met in a serial task runs serially with the
 * same rand() iteration numbering. A struct_for over an SNode below sparse
 * containers walks the list of the deepest one (see codegen.h): on the CPU
 * as a loop over list elements around a loop over the dense cells of each
 * (which vectorises like a dense loop), on NVPTX as one grid-stride loop.
 * The list tasks (clear_list, listgen, gc) call the runtime. Values are
 * lowered in emit_ops.c, memory in emit_mem.c; reductions of the task's
 * loop (one atomic per body call instead of one per iteration) in reduce.c. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cg_internal.h"

#include <llvm-c/DebugInfo.h>
#include <llvm-c/IRReader.h>

/* How a message starts that only an internal bug can produce: it alone may
 * name internal tasks or IR values, and it says what to report. */
#define FB_BUG "internal error (please report it, with the program): "

static int emit_block(fb_emit *e, int blk);
static int emit_stmt(fb_emit *e, int id);

/* ---------------------------------------------------------------- helpers */

int fb_emit_error(fb_emit *e, int code, const char *fmt, ...) {
  if (e->rc) return e->rc;
  /* FB_EINVAL here is malformed task IR ("%7 if: condition is not bool"),
   * which the verifier keeps from a kernel: only a bug reaches it, and
   * it alone may name IR values */
  size_t at = 0;
  if ((code == FB_EINVAL || code == FB_EINTERNAL) && e->errlen > sizeof FB_BUG) {
    memcpy(e->err, FB_BUG, sizeof FB_BUG - 1);
    at = sizeof FB_BUG - 1;
  }
  va_list ap;
  va_start(ap, fmt);
  fb_verrf(e->err + at, e->errlen - at, fmt, ap);
  va_end(ap);
  return e->rc = code;
}

int fb_emit_kernel_name(const fb_emit *e, const char **name) {
  const char *n = e->k && e->k->name ? e->k->name : "?";
  const char *dot = strrchr(n, '.');
  int len = (int)strlen(n);
  if (dot && dot[1] == 't' && dot[2] && strspn(dot + 2, "0123456789") == strlen(dot + 2))
    len = (int)(dot - n);
  *name = n;
  return len;
}

LLVMTypeRef fb_emit_type(fb_emit *e, fb_type t) {
  switch (t) {
  case FB_T_BOOL: return e->t_i1;
  case FB_T_I32:
  case FB_T_U32: return e->t_i32;
  case FB_T_I64:
  case FB_T_U64: return e->t_i64;
  case FB_T_F32: return e->t_f32;
  case FB_T_F64: return e->t_f64;
  default: return NULL;
  }
}

LLVMTypeRef fb_emit_memtype(fb_emit *e, fb_type t) {
  return t == FB_T_BOOL ? e->t_i8 : fb_emit_type(e, t);
}

static const char *op_name(const fb_stmt *s) {
  return s->op < FB_OP__COUNT ? fb_op_table[s->op].name : "?";
}

LLVMValueRef fb_emit_arg(fb_emit *e, const fb_stmt *s, int i) {
  int a = i < FB_MAX_ARGS ? s->args[i] : -1;
  if (i >= s->nargs || a < 0 || a >= e->k->nstmts || !e->vals[a]) {
    fb_emit_error(e, FB_EINVAL, "%s: operand %d (%%%d) is not defined before its use", op_name(s),
                  i, a);
    return NULL;
  }
  return e->vals[a];
}

fb_type fb_emit_argtype(fb_emit *e, const fb_stmt *s, int i) {
  int a = s->args[i];
  return a >= 0 && a < e->k->nstmts ? (fb_type)e->k->stmts[a].type : FB_T_VOID;
}

LLVMValueRef fb_emit_ctx_field(fb_emit *e, int field, LLVMTypeRef ty) {
  LLVMValueRef idx = fb_emit_i64(e, field);
  LLVMValueRef p = LLVMBuildGEP2(e->b, e->t_i64, e->ctx, &idx, 1, "");
  LLVMValueRef v = LLVMBuildLoad2(e->b, ty, p, "");
  LLVMSetAlignment(v, 8);
  return v;
}

LLVMValueRef fb_emit_i64(fb_emit *e, int64_t v) {
  return LLVMConstInt(e->t_i64, (unsigned long long)v, 1);
}

LLVMValueRef fb_emit_i32(fb_emit *e, int32_t v) {
  return LLVMConstInt(e->t_i32, (unsigned long long)(uint32_t)v, 0);
}

LLVMValueRef fb_emit_intrinsic(fb_emit *e, const char *name, LLVMTypeRef ty, LLVMValueRef *args,
                               unsigned n) {
  unsigned id = LLVMLookupIntrinsicID(name, strlen(name));
  if (!id) {
    fb_emit_error(e, FB_EINTERNAL, "LLVM has no intrinsic %s", name);
    return NULL;
  }
  LLVMValueRef fn = LLVMGetIntrinsicDeclaration(e->m, id, &ty, ty ? 1 : 0);
  LLVMTypeRef fty = LLVMIntrinsicGetType(e->c, id, &ty, ty ? 1 : 0);
  return LLVMBuildCall2(e->b, fty, fn, args, n, "");
}

LLVMValueRef fb_emit_intrinsic2(fb_emit *e, const char *name, LLVMTypeRef ret, LLVMTypeRef argty,
                                LLVMValueRef arg) {
  unsigned id = LLVMLookupIntrinsicID(name, strlen(name));
  LLVMTypeRef tys[2] = {ret, argty};
  if (!id) {
    fb_emit_error(e, FB_EINTERNAL, "LLVM has no intrinsic %s", name);
    return NULL;
  }
  LLVMValueRef fn = LLVMGetIntrinsicDeclaration(e->m, id, tys, 2);
  return LLVMBuildCall2(e->b, LLVMIntrinsicGetType(e->c, id, tys, 2), fn, &arg, 1, "");
}

LLVMValueRef fb_emit_call(fb_emit *e, const char *name, LLVMTypeRef ret, LLVMValueRef *args,
                          unsigned n) {
  LLVMValueRef fn = LLVMGetNamedFunction(e->m, name);
  if (!fn) {
    LLVMTypeRef pt[8];
    if (n > 8) {
      fb_emit_error(e, FB_EINTERNAL, "call of %s with %u arguments (8 at most)", name, n);
      return LLVMGetUndef(ret == e->t_void ? e->t_i64 : ret);
    }
    for (unsigned i = 0; i < n; i++) pt[i] = LLVMTypeOf(args[i]);
    fn = LLVMAddFunction(e->m, name, LLVMFunctionType(ret, pt, n, 0));
  }
  return LLVMBuildCall2(e->b, LLVMGlobalGetValueType(fn), fn, args, n, "");
}

LLVMBasicBlockRef fb_emit_block(fb_emit *e, const char *name) {
  return LLVMAppendBasicBlockInContext(e->c, e->fn, name);
}

int fb_emit_terminated(fb_emit *e) {
  return LLVMGetBasicBlockTerminator(LLVMGetInsertBlock(e->b)) != NULL;
}

/* Branch to bb unless the current block already ended (break/continue). */
static void br_to(fb_emit *e, LLVMBasicBlockRef bb) {
  if (!fb_emit_terminated(e)) LLVMBuildBr(e->b, bb);
}

LLVMValueRef fb_emit_to_mem(fb_emit *e, fb_type t, LLVMValueRef v) {
  return t == FB_T_BOOL ? LLVMBuildZExt(e->b, v, e->t_i8, "") : v;
}

LLVMValueRef fb_emit_from_mem(fb_emit *e, fb_type t, LLVMValueRef v) {
  return t == FB_T_BOOL ? LLVMBuildICmp(e->b, LLVMIntNE, v, LLVMConstInt(e->t_i8, 0, 0), "") : v;
}

LLVMValueRef fb_emit_pack_slot(fb_emit *e, fb_type t, LLVMValueRef v) {
  switch (t) {
  case FB_T_F32: return LLVMBuildZExt(e->b, LLVMBuildBitCast(e->b, v, e->t_i32, ""), e->t_i64, "");
  case FB_T_F64: return LLVMBuildBitCast(e->b, v, e->t_i64, "");
  case FB_T_BOOL:
  case FB_T_U32: return LLVMBuildZExt(e->b, v, e->t_i64, "");
  case FB_T_I32: return LLVMBuildSExt(e->b, v, e->t_i64, "");
  default: return v;
  }
}

LLVMValueRef fb_emit_unpack_slot(fb_emit *e, fb_type t, LLVMValueRef slot) {
  switch (t) {
  case FB_T_F32:
    return LLVMBuildBitCast(e->b, LLVMBuildTrunc(e->b, slot, e->t_i32, ""), e->t_f32, "");
  case FB_T_F64: return LLVMBuildBitCast(e->b, slot, e->t_f64, "");
  case FB_T_BOOL: return LLVMBuildTrunc(e->b, slot, e->t_i1, "");
  case FB_T_I32:
  case FB_T_U32: return LLVMBuildTrunc(e->b, slot, e->t_i32, "");
  default: return slot;
  }
}

LLVMValueRef fb_emit_generic(fb_emit *e, LLVMValueRef p) {
  if (e->o->target != FB_CG_NVPTX || LLVMGetPointerAddressSpace(LLVMTypeOf(p)) == 0) return p;
  return LLVMBuildAddrSpaceCast(e->b, p, e->t_ptr, "");
}

/* NVPTX: the buffers behind the context live in device global memory;
 * saying so (address space 1) gives ld.global / st.global / atom.global. */
LLVMValueRef fb_emit_global(fb_emit *e, LLVMValueRef p) {
  if (e->o->target != FB_CG_NVPTX) return p;
  return LLVMBuildAddrSpaceCast(e->b, p, LLVMPointerTypeInContext(e->c, 1), "");
}

LLVMValueRef fb_emit_desc(fb_emit *e, const void *desc, size_t bytes, const char *name) {
  LLVMValueRef g = LLVMGetNamedGlobal(e->m, name);
  int gpu = e->o->target == FB_CG_NVPTX;
  if (!g) {
    size_t n = bytes / 8;
    LLVMValueRef *v = malloc(sizeof *v * (n ? n : 1));
    if (!v) {
      fb_emit_error(e, FB_ENOMEM, "out of memory");
      return LLVMConstNull(e->t_ptr);
    }
    for (size_t i = 0; i < n; i++) {
      int64_t x;
      memcpy(&x, (const char *)desc + 8 * i, 8);
      v[i] = LLVMConstInt(e->t_i64, (unsigned long long)x, 1);
    }
    g = LLVMAddGlobalInAddressSpace(e->m, LLVMArrayType2(e->t_i64, n), name, gpu ? 1 : 0);
    LLVMSetInitializer(g, LLVMConstArray2(e->t_i64, v, n));
    LLVMSetGlobalConstant(g, 1);
    LLVMSetLinkage(g, LLVMPrivateLinkage);
    LLVMSetAlignment(g, 8);
    free(v);
  }
  return gpu ? LLVMConstAddrSpaceCast(g, e->t_ptr) : g;
}

/* ---------------------------------------------------------------- loops */

static int push_loop(fb_emit *e, int id, LLVMBasicBlockRef brk, LLVMBasicBlockRef cont) {
  if (e->nloops >= FB_CG_MAX_LOOPS) {
    const char *kn;
    int kl = fb_emit_kernel_name(e, &kn);
    return fb_emit_error(e, FB_EUNSUPPORTED, "kernel '%.*s' nests loops deeper than %d", kl, kn,
                         FB_CG_MAX_LOOPS);
  }
  e->loops[e->nloops].stmt = id;
  e->loops[e->nloops].brk = brk;
  e->loops[e->nloops].cont = cont;
  e->nloops++;
  return 0;
}

static int emit_if(fb_emit *e, int id, const fb_stmt *s) {
  LLVMValueRef cond = fb_emit_arg(e, s, 0);
  if (!cond) return e->rc;
  if (fb_emit_argtype(e, s, 0) != FB_T_BOOL)
    return fb_emit_error(e, FB_EINVAL, "%%%d if: condition is not bool", id);
  LLVMBasicBlockRef then = fb_emit_block(e, "then");
  LLVMBasicBlockRef other = s->orelse >= 0 ? fb_emit_block(e, "else") : NULL;
  LLVMBasicBlockRef merge = fb_emit_block(e, "endif");
  LLVMBuildCondBr(e->b, cond, then, other ? other : merge);
  LLVMPositionBuilderAtEnd(e->b, then);
  if (emit_block(e, s->body)) return e->rc;
  br_to(e, merge);
  if (other) {
    LLVMPositionBuilderAtEnd(e->b, other);
    if (emit_block(e, s->orelse)) return e->rc;
    br_to(e, merge);
  }
  LLVMPositionBuilderAtEnd(e->b, merge);
  return 0;
}

static int emit_while(fb_emit *e, int id, const fb_stmt *s) {
  LLVMBasicBlockRef head = fb_emit_block(e, "while");
  LLVMBasicBlockRef exit = fb_emit_block(e, "endwhile");
  LLVMBuildBr(e->b, head);
  LLVMPositionBuilderAtEnd(e->b, head);
  if (push_loop(e, id, exit, head)) return e->rc;
  emit_block(e, s->body);
  e->nloops--;
  if (e->rc) return e->rc;
  br_to(e, head);
  LLVMPositionBuilderAtEnd(e->b, exit);
  return 0;
}

/* ---------------------------------------------------------------- skipped blocks
 *
 * A serial loop whose body is a guard over a scan, `for j in a .. b { if
 * c(j) { ... } }` with c computed from loads of dense fields and pure
 * arithmetic (mass_spring's `if rest_length[i, j] != 0.0`: 8 of 1024 true),
 * spends its time evaluating c one j at a time, each load behind its own
 * bounds check. Every SCAN_W iterations the loop instead evaluates c for
 * the next SCAN_W values of j at once, without branches: first every
 * load's bounds test for all of them (one branch; if any fails, those
 * iterations run as before, where the check latches its error in order),
 * then the loads, unguarded, and the conditions, ORed. LLVM's SLP
 * vectorizer turns consecutive loads into one vector load and compare.
 * When no condition holds the SCAN_W iterations are skipped; otherwise they
 * run as before, one by one. Results are the loop's own: a skipped
 * iteration would have evaluated the same pure condition on the same
 * memory (nothing ran in between) and done nothing else; bounds errors
 * only come from the iterations that run. */

#define SCAN_W 8
#define SCAN_MAX 48 /* statements before the if */

typedef struct scan_plan {
  const int *ids; /* the body's statements before its if */
  int n;
  int cond;            /* the if's condition */
  unsigned char *late; /* per ids[i]: a load, or reads one (phase B) */
} scan_plan;

static int scan_find(const fb_block *b, int id) {
  for (int i = 0; i < b->n - 1; i++)
    if (b->ids[i] == id) return i;
  return -1;
}

/* 1 when s's body is a guarded scan (p filled; p->late must hold
 * SCAN_MAX bytes). */
static int scan_plan_of(fb_emit *e, const fb_stmt *s, scan_plan *p) {
  if (e->o->target != FB_CG_CPU || e->bounds_fn || s->body < 0 || s->body >= e->k->nblocks)
    return 0;
  const fb_block *b = &e->k->blocks[s->body];
  if (b->n < 2 || b->n - 1 > SCAN_MAX) return 0;
  int last = b->ids[b->n - 1];
  if (last < 0 || last >= e->k->nstmts) return 0;
  const fb_stmt *f = &e->k->stmts[last];
  if (f->op != FB_OP_IF || f->orelse >= 0 || f->nargs < 1) return 0;
  int loads = 0;
  for (int i = 0; i < b->n - 1; i++) {
    int id = b->ids[i];
    if (id < 0 || id >= e->k->nstmts || e->done[id]) return 0;
    const fb_stmt *t = &e->k->stmts[id];
    if (t->op >= FB_OP__COUNT) return 0;
    int cls = fb_op_table[t->op].cls;
    int late = 0;
    if (t->op == FB_OP_LOAD) {
      if (t->snode < 0 || t->snode >= e->l->nnodes || e->l->nodes[t->snode].kind != FB_SN_PLACE ||
          !fb_emit_dense_path(e->l, e->l->nodes[t->snode].parent))
        return 0;
      late = 1;
      loads++;
    } else if (!(fb_op_table[t->op].flags & FB_OPF_PURE) && cls != FB_OPC_LLOAD &&
               t->op != FB_OP_GTMP_LOAD) {
      return 0;
    } else if (cls == FB_OPC_HINT || (fb_op_table[t->op].flags & FB_OPF_BLOCK)) {
      return 0;
    }
    for (int a = 0; a < t->nargs && a < FB_MAX_ARGS; a++) {
      int k = scan_find(b, t->args[a]);
      if (k < 0 || !p->late[k]) continue;
      if (t->op == FB_OP_LOAD) return 0; /* an index read from memory */
      late = 1;
    }
    p->late[i] = (unsigned char)late;
  }
  p->ids = b->ids;
  p->n = b->n - 1;
  p->cond = f->args[0];
  return loads > 0 && scan_find(b, p->cond) >= 0 && p->cond >= 0 &&
         (fb_type)e->k->stmts[p->cond].type == FB_T_BOOL;
}

/* Emits the check of iterations j .. j+SCAN_W-1 at the builder; ends with
 * a branch to `run` (some condition holds, or a bounds test fails) or to
 * `skip` (none holds). from[0..*nfrom) receive the blocks that branch to
 * run. */
static int scan_check(fb_emit *e, int id, const scan_plan *p, LLVMValueRef j,
                      LLVMBasicBlockRef run, LLVMBasicBlockRef skip, LLVMBasicBlockRef from[2],
                      int *nfrom) {
  LLVMValueRef save[SCAN_W][SCAN_MAX], wsave[SCAN_W][SCAN_MAX];
  LLVMValueRef jw = LLVMBuildSExt(e->b, j, e->t_i64, "");
  LLVMValueRef allin = NULL;
  int stmts = e->stmts;
  /* phase A: each iteration's early values and its loads' bounds tests */
  for (int w = 0; w < SCAN_W && !e->rc; w++) {
    e->lidx[id][0] = LLVMBuildNSWAdd(e->b, j, fb_emit_i32(e, w), "");
    e->lwide[id][0] = LLVMBuildNSWAdd(e->b, jw, fb_emit_i64(e, w), "");
    for (int i = 0; i < p->n && !e->rc; i++) {
      int s = p->ids[i];
      if (p->late[i]) {
        LLVMValueRef inb;
        if (e->k->stmts[s].op == FB_OP_LOAD && !fb_emit_load_inb(e, s, &inb) && inb)
          allin = allin ? LLVMBuildAnd(e->b, allin, inb, "") : inb;
        continue;
      }
      emit_stmt(e, s);
      e->done[s] = 0;
      save[w][i] = e->vals[s];
      wsave[w][i] = e->wide[s];
    }
  }
  if (e->rc) return e->rc;
  if (allin) {
    LLVMBasicBlockRef ok = fb_emit_block(e, "scan.inbounds");
    from[(*nfrom)++] = LLVMGetInsertBlock(e->b);
    LLVMBuildCondBr(e->b, allin, ok, run);
    LLVMPositionBuilderAtEnd(e->b, ok);
  }
  /* phase B: the loads (in bounds) and the conditions */
  LLVMValueRef any = NULL;
  e->spec_nocheck = 1;
  for (int w = 0; w < SCAN_W && !e->rc; w++) {
    for (int i = 0; i < p->n; i++)
      if (!p->late[i]) {
        e->vals[p->ids[i]] = save[w][i];
        e->wide[p->ids[i]] = wsave[w][i];
      }
    for (int i = 0; i < p->n && !e->rc; i++)
      if (p->late[i]) {
        emit_stmt(e, p->ids[i]);
        e->done[p->ids[i]] = 0;
      }
    if (e->rc) break;
    LLVMValueRef c = e->vals[p->cond];
    any = any ? LLVMBuildOr(e->b, any, c, "") : c;
  }
  e->spec_nocheck = 0;
  if (e->rc) return e->rc;
  for (int i = 0; i < p->n; i++) {
    e->vals[p->ids[i]] = NULL;
    e->wide[p->ids[i]] = NULL;
  }
  e->stmts = stmts;
  from[(*nfrom)++] = LLVMGetInsertBlock(e->b);
  LLVMBuildCondBr(e->b, any, run, skip);
  return 0;
}

/* Serial counted loop: for (i = begin; i < end; i++) in i32; a guarded
 * scan checks SCAN_W iterations at a time (above): `nc` is the next
 * iteration to check at, end once fewer than SCAN_W remain. */
static int emit_range_for(fb_emit *e, int id, const fb_stmt *s) {
  LLVMValueRef begin = fb_emit_arg(e, s, 0), end = fb_emit_arg(e, s, 1);
  if (!begin || !end) return e->rc;
  if (fb_emit_argtype(e, s, 0) != FB_T_I32 || fb_emit_argtype(e, s, 1) != FB_T_I32)
    return fb_emit_error(e, FB_EINVAL, "%%%d range_for: bounds must be i32", id);
  unsigned char late[SCAN_MAX];
  scan_plan plan = {.late = late};
  int scan = scan_plan_of(e, s, &plan);
  LLVMBasicBlockRef pre = LLVMGetInsertBlock(e->b);
  LLVMBasicBlockRef head = fb_emit_block(e, "for");
  LLVMBasicBlockRef body = fb_emit_block(e, "for.body");
  LLVMBasicBlockRef latch = fb_emit_block(e, "for.next");
  LLVMBasicBlockRef exit = fb_emit_block(e, "endfor");
  LLVMBuildBr(e->b, head);
  LLVMPositionBuilderAtEnd(e->b, head);
  LLVMValueRef i = LLVMBuildPhi(e->b, e->t_i32, "i");
  LLVMAddIncoming(i, &begin, &pre, 1);
  LLVMValueRef nc = NULL, ncb = NULL;
  if (scan) {
    LLVMBasicBlockRef test = fb_emit_block(e, "scan.test");
    LLVMBasicBlockRef room = fb_emit_block(e, "scan.room");
    LLVMBasicBlockRef check = fb_emit_block(e, "scan.check");
    LLVMBasicBlockRef skip = fb_emit_block(e, "scan.skip");
    nc = LLVMBuildPhi(e->b, e->t_i32, "nc");
    LLVMAddIncoming(nc, &begin, &pre, 1);
    LLVMBuildCondBr(e->b, LLVMBuildICmp(e->b, LLVMIntSLT, i, end, ""), test, exit);
    LLVMPositionBuilderAtEnd(e->b, test);
    LLVMBuildCondBr(e->b, LLVMBuildICmp(e->b, LLVMIntEQ, i, nc, ""), room, body);
    LLVMPositionBuilderAtEnd(e->b, room);
    LLVMValueRef left = LLVMBuildNSWSub(e->b, LLVMBuildSExt(e->b, end, e->t_i64, ""),
                                        LLVMBuildSExt(e->b, i, e->t_i64, ""), "");
    LLVMBuildCondBr(e->b, LLVMBuildICmp(e->b, LLVMIntSGE, left, fb_emit_i64(e, SCAN_W), ""),
                    check, body);
    LLVMPositionBuilderAtEnd(e->b, check);
    LLVMValueRef after = LLVMBuildNSWAdd(e->b, i, fb_emit_i32(e, SCAN_W), "");
    LLVMBasicBlockRef from[4] = {test, room};
    int nfrom = 0;
    if (scan_check(e, id, &plan, i, body, skip, from + 2, &nfrom)) return e->rc;
    LLVMPositionBuilderAtEnd(e->b, skip);
    LLVMBuildBr(e->b, head);
    LLVMAddIncoming(i, &after, &skip, 1);
    LLVMAddIncoming(nc, &after, &skip, 1);
    LLVMPositionBuilderAtEnd(e->b, body);
    ncb = LLVMBuildPhi(e->b, e->t_i32, "nc.body");
    /* the iterations a check sends here run unchecked until after */
    LLVMValueRef v[4] = {nc, end, after, after};
    LLVMAddIncoming(ncb, v, from, 2 + (unsigned)nfrom);
  } else {
    LLVMBuildCondBr(e->b, LLVMBuildICmp(e->b, LLVMIntSLT, i, end, ""), body, exit);
    LLVMPositionBuilderAtEnd(e->b, body);
  }
  e->lidx[id][0] = i;
  e->lwide[id][0] = LLVMBuildSExt(e->b, i, e->t_i64, "iw");
  if (push_loop(e, id, exit, latch)) return e->rc;
  emit_block(e, s->body);
  e->nloops--;
  if (e->rc) return e->rc;
  br_to(e, latch);
  LLVMPositionBuilderAtEnd(e->b, latch);
  LLVMValueRef next = LLVMBuildNSWAdd(e->b, i, fb_emit_i32(e, 1), ""); /* i < end */
  LLVMAddIncoming(i, &next, &latch, 1);
  if (scan) LLVMAddIncoming(nc, &ncb, &latch, 1);
  LLVMBuildBr(e->b, head);
  LLVMPositionBuilderAtEnd(e->b, exit);
  return 0;
}

/* ---------------------------------------------------------------- sparse loops */

/* A struct_for over an SNode below sparse containers: the container T its
 * cells belong to, the deepest sparse container Pk at or above T, and the
 * dense levels strictly below Pk down to T (outermost first), M cells in
 * all per list element. */
typedef struct sfor_geom {
  int T, pk, nlev;
  int lev[FB_RT_MAX_LEVELS];
  int64_t M;
} sfor_geom;

/* 1: sparse (g filled), 0: dense path, <0: error. */
static int sfor_geometry(fb_emit *e, int id, const fb_stmt *s, sfor_geom *g) {
  const fb_snode *sn = &e->l->nodes[s->snode];
  g->T = sn->kind == FB_SN_PLACE ? sn->parent : sn->id;
  g->pk = fb_cg_sparse_leaf(e->l, g->T);
  g->nlev = 0;
  g->M = 1;
  if (!g->pk) return 0;
  int up[FB_RT_MAX_LEVELS], n = 0;
  for (int c = g->T; c != g->pk; c = e->l->nodes[c].parent) {
    if (n == FB_RT_MAX_LEVELS) {
      const char *kn, *pn = e->l->nodes[g->pk].name;
      int kl = fb_emit_kernel_name(e, &kn);
      (void)id;
      return fb_emit_error(e, FB_EUNSUPPORTED,
                           "kernel '%.*s': a struct-for visits more than %d dense levels below "
                           "the sparse SNode %s%s%s (SNode %d)",
                           kl, kn, FB_RT_MAX_LEVELS, pn ? "'" : "", pn ? pn : "", pn ? "'" : "",
                           g->pk);
    }
    up[n++] = c;
  }
  for (int i = 0; i < n; i++) {
    g->lev[i] = up[n - 1 - i];
    g->M *= e->l->nodes[g->lev[i]].ncells;
  }
  g->nlev = n;
  return 1;
}

static LLVMValueRef i32c(fb_emit *e, int v) {
  return LLVMConstInt(e->t_i32, (unsigned long long)v, 0);
}

static LLVMValueRef listgen_desc(fb_emit *e, int snode) {
  fb_rt_lg d;
  char msg[256], name[48];
  if (fb_cg_listgen_desc(e->l, snode, &d, msg, sizeof msg)) {
    fb_emit_error(e, FB_EUNSUPPORTED, "%s", msg);
    return NULL;
  }
  snprintf(name, sizeof name, "fb.lg.%d", snode);
  return fb_emit_desc(e, &d, sizeof d, name);
}

/* Iterations of a sparse struct_for (count(Pk) * M) or of a listgen. */
static LLVMValueRef sparse_count(fb_emit *e, int id, const fb_stmt *s) {
  if (s->op == FB_OP_LISTGEN) {
    LLVMValueRef d = listgen_desc(e, s->snode);
    if (!d) return NULL;
    LLVMValueRef args[2] = {e->ctx, d};
    return fb_emit_call(e, "fb_rt_listgen_count", e->t_i64, args, 2);
  }
  sfor_geom g;
  if (sfor_geometry(e, id, s, &g) < 0) return NULL;
  LLVMValueRef args[2] = {e->ctx, i32c(e, g.pk)};
  LLVMValueRef n = fb_emit_call(e, "fb_rt_list_count", e->t_i64, args, 2);
  return g.M == 1 ? n : LLVMBuildNUWMul(e->b, n, fb_emit_i64(e, g.M), "n");
}

/* Is s a struct_for over an SNode with a sparse ancestor (or a listgen)? */
static int iterates_list(fb_emit *e, const fb_stmt *s) {
  if (s->op == FB_OP_LISTGEN) return 1;
  if (s->op != FB_OP_STRUCT_FOR) return 0;
  const fb_snode *sn = &e->l->nodes[s->snode];
  return fb_cg_sparse_leaf(e->l, sn->kind == FB_SN_PLACE ? sn->parent : sn->id) != 0;
}

/* Set up cell r of list element (cptr, c): the loop indices, rand()'s
 * iteration number (the cell's linear index) and the T cell's storage. */
static LLVMValueRef sfor_cell(fb_emit *e, int id, const fb_stmt *s, const sfor_geom *g,
                              LLVMValueRef cptr, LLVMValueRef c[4], LLVMValueRef r) {
  LLVMValueRef lin[FB_RT_MAX_LEVELS], gi[4], rest = r;
  for (int i = g->nlev - 1; i >= 0; i--) {
    LLVMValueRef n = fb_emit_i64(e, e->l->nodes[g->lev[i]].ncells);
    lin[i] = i > 0 ? LLVMBuildURem(e->b, rest, n, "") : rest;
    if (i > 0) rest = LLVMBuildUDiv(e->b, rest, n, "");
  }
  for (int a = 0; a < 4; a++) gi[a] = c[a];
  LLVMValueRef base = cptr;
  for (int i = 0; i < g->nlev; i++) {
    const fb_snode *L = &e->l->nodes[g->lev[i]];
    LLVMValueRef x = lin[i], loc[4];
    for (int a = 3; a >= 0; a--) {
      loc[a] = fb_emit_i64(e, 0);
      if (L->size[a] == 1) continue;
      LLVMValueRef sz = fb_emit_i64(e, L->size[a]);
      loc[a] = LLVMBuildURem(e->b, x, sz, "");
      x = LLVMBuildUDiv(e->b, x, sz, "");
    }
    for (int a = 0; a < 4; a++)
      if (L->size[a] != 1)
        gi[a] = LLVMBuildAdd(e->b, LLVMBuildMul(e->b, gi[a], fb_emit_i64(e, L->size[a]), ""),
                             loc[a], "");
    LLVMValueRef off =
        LLVMBuildAdd(e->b, fb_emit_i64(e, (int64_t)L->offset),
                     LLVMBuildMul(e->b, lin[i], fb_emit_i64(e, (int64_t)L->cell_bytes), ""), "");
    base = LLVMBuildGEP2(e->b, e->t_i8, base, &off, 1, "cell");
  }
  const fb_snode *sn = &e->l->nodes[s->snode];
  LLVMValueRef iter = fb_emit_i64(e, 0);
  for (int d = 0; d < sn->ndim; d++) {
    int a = sn->dim_axis[d];
    e->lidx[id][d] = LLVMBuildTrunc(e->b, gi[a], e->t_i32, "idx");
    e->lwide[id][d] = gi[a];
    iter =
        LLVMBuildAdd(e->b, LLVMBuildMul(e->b, iter, fb_emit_i64(e, sn->shape[a]), ""), gi[a], "");
  }
  e->rand_iter = iter;
  return base;
}

/* Element el of the list: its cell's storage and index (i64 by axis). */
static LLVMValueRef list_elem(fb_emit *e, LLVMValueRef elems, LLVMValueRef el, LLVMValueRef c[4]) {
  LLVMValueRef off = LLVMBuildMul(e->b, el, fb_emit_i64(e, (int64_t)sizeof(fb_rt_elem)), "");
  LLVMValueRef ep = LLVMBuildGEP2(e->b, e->t_i8, elems, &off, 1, "elem");
  for (int a = 0; a < 4; a++) {
    LLVMValueRef o = fb_emit_i64(e, 4 * a);
    LLVMValueRef x =
        LLVMBuildLoad2(e->b, e->t_i32, LLVMBuildGEP2(e->b, e->t_i8, ep, &o, 1, ""), "");
    LLVMSetAlignment(x, 4);
    c[a] = LLVMBuildSExt(e->b, x, e->t_i64, "");
  }
  LLVMValueRef o = fb_emit_i64(e, 16);
  LLVMValueRef p =
      LLVMBuildLoad2(e->b, e->t_ptr, LLVMBuildGEP2(e->b, e->t_i8, ep, &o, 1, ""), "cptr");
  LLVMSetAlignment(p, 8);
  return fb_emit_global(e, p);
}

/* The body of one cell; continues at latch. */
static int sfor_body(fb_emit *e, int id, const fb_stmt *s, const sfor_geom *g, LLVMValueRef cptr,
                     LLVMValueRef c[4], LLVMValueRef r, LLVMBasicBlockRef latch) {
  LLVMBuildStore(e->b, fb_emit_i64(e, 0), e->rand_count);
  LLVMValueRef saved_iter = e->rand_iter, saved_cell = e->sfor_cell;
  int saved_loop = e->sfor_loop, saved_T = e->sfor_T;
  e->sfor_cell = sfor_cell(e, id, s, g, cptr, c, r);
  e->sfor_loop = id;
  e->sfor_T = g->T;
  if (push_loop(e, id, NULL, latch)) return e->rc;
  emit_block(e, s->body);
  e->nloops--;
  e->rand_iter = saved_iter;
  e->sfor_cell = saved_cell;
  e->sfor_loop = saved_loop;
  e->sfor_T = saved_T;
  if (e->rc) return e->rc;
  br_to(e, latch);
  return 0;
}

/* for (x = from; x < to; x++) in i64: opens the loop; the caller emits the
 * body, branches to *latch and calls loop_close. */
typedef struct counted {
  LLVMBasicBlockRef head, latch, exit;
  LLVMValueRef x;
} counted;

static void loop_open(fb_emit *e, counted *lp, LLVMValueRef from, LLVMValueRef to,
                      const char *name) {
  LLVMBasicBlockRef pre = LLVMGetInsertBlock(e->b);
  lp->head = fb_emit_block(e, name);
  LLVMBasicBlockRef body = fb_emit_block(e, "body");
  lp->latch = fb_emit_block(e, "next");
  lp->exit = fb_emit_block(e, "done");
  LLVMBuildBr(e->b, lp->head);
  LLVMPositionBuilderAtEnd(e->b, lp->head);
  lp->x = LLVMBuildPhi(e->b, e->t_i64, name);
  LLVMAddIncoming(lp->x, &from, &pre, 1);
  LLVMBuildCondBr(e->b, LLVMBuildICmp(e->b, LLVMIntSLT, lp->x, to, ""), body, lp->exit);
  LLVMPositionBuilderAtEnd(e->b, body);
}

static void loop_close(fb_emit *e, counted *lp, LLVMValueRef step) {
  LLVMPositionBuilderAtEnd(e->b, lp->latch);
  LLVMValueRef next = LLVMBuildNSWAdd(e->b, lp->x, step, "");
  LLVMAddIncoming(lp->x, &next, &lp->latch, 1);
  LLVMBuildBr(e->b, lp->head);
  LLVMPositionBuilderAtEnd(e->b, lp->exit);
}

static LLVMValueRef smax(fb_emit *e, LLVMValueRef a, LLVMValueRef b) {
  return LLVMBuildSelect(e->b, LLVMBuildICmp(e->b, LLVMIntSGT, a, b, ""), a, b, "");
}

static LLVMValueRef smin(fb_emit *e, LLVMValueRef a, LLVMValueRef b) {
  return LLVMBuildSelect(e->b, LLVMBuildICmp(e->b, LLVMIntSLT, a, b, ""), a, b, "");
}

/* ---- Parallel cell loops
 *
 * A sparse struct_for's cell loop reads its neighbours through pointer
 * slots, so LLVM's dependence analysis cannot bound the loop's accesses
 * and leaves it scalar (a MacCormack backtrace: 24 sparse reads a cell).
 * Where no iteration can see another's writes, the loop is marked
 * parallel (`llvm.loop.parallel_accesses` over an access group that every
 * field and slot access of the body joins), and LLVM may vectorize it
 * with gathers when its cost model says so. Sound when, in the loop's
 * body (every nested block):
 *  - the only writes are stores of a place with as many dimensions as the
 *    loop at exactly the loop's indices (loop_index 0..n-1 of this loop),
 *    so each iteration writes cells no other iteration writes; a store
 *    that may activate must lie on a dense path (an activating store under
 *    a pointer or bitmasked container writes shared structure);
 *  - a place that is stored is read only at the loop's indices too;
 *  - nothing else writes (no atomic, sparse op, list op, scratch store,
 *    ret) and nothing else reads an SNode (is_active, length), and no
 *    rand() (its per-iteration counter is one stack slot).
 * Then no memory access of one iteration depends on another's, which is
 * what the metadata claims; results are what the scalar loop gives. */
/* Is place access s at exactly the indices of struct_for `loop`, and of
 * its dimension? */
static int at_loop_indices(const fb_kernel *k, const fb_stmt *s, int loop) {
  int ndim = k->layout->nodes[s->snode].ndim, lsn = k->stmts[loop].snode;
  if (lsn <= 0 || lsn >= k->layout->nnodes || k->layout->nodes[lsn].ndim != ndim ||
      s->nargs < ndim)
    return 0;
  for (int d = 0; d < ndim; d++) {
    int a = s->args[d];
    if (a < 0 || a >= k->nstmts) return 0;
    const fb_stmt *ix = &k->stmts[a];
    if (ix->op != FB_OP_LOOP_INDEX || ix->args[0] != loop || ix->imm.i != d) return 0;
  }
  return 1;
}

/* Visit the statements of block blk and its nested blocks: 0 = refused,
 * 1 = every statement allowed so far. stored[place] marks stores seen;
 * pass 0 collects stores and checks writes, pass 1 checks reads. seen[b]
 * marks the blocks visited in this pass: a block met twice (IR that is
 * not a tree) refuses, so the scan is linear in the body whatever a
 * client sent. */
static int par_scan(const fb_kernel *k, int blk, int loop, unsigned char *stored,
                    unsigned char *seen, int pass, int depth) {
  if (blk < 0) return 1;
  if (blk >= k->nblocks || depth > 64 || seen[blk]) return 0;
  seen[blk] = 1;
  const fb_block *b = &k->blocks[blk];
  const fb_layout *l = k->layout;
  for (int i = 0; i < b->n; i++) {
    int id = b->ids[i];
    if (id < 0 || id >= k->nstmts) return 0;
    const fb_stmt *s = &k->stmts[id];
    if (s->op >= FB_OP__COUNT) return 0;
    unsigned f = fb_op_table[s->op].flags;
    if (s->op == FB_OP_RAND || s->op == FB_OP_RAND_SEQ || s->op == FB_OP_RET) return 0;
    if (s->op == FB_OP_STORE || s->op == FB_OP_STORE_NA) {
      if (s->snode <= 0 || s->snode >= l->nnodes || l->nodes[s->snode].kind != FB_SN_PLACE)
        return 0;
      if (!at_loop_indices(k, s, loop)) return 0;
      if (s->op == FB_OP_STORE && !fb_emit_dense_path(l, s->snode)) return 0;
      if (pass == 0) stored[s->snode] = 1;
    } else if (s->op == FB_OP_LOAD) {
      if (s->snode <= 0 || s->snode >= l->nnodes) return 0;
      if (pass == 1 && stored[s->snode] && !at_loop_indices(k, s, loop)) return 0;
    } else if ((f & FB_OPF_WRITES) || (f & FB_OPF_SNODE)) {
      return 0;
    }
    if (!par_scan(k, s->body, loop, stored, seen, pass, depth + 1) ||
        !par_scan(k, s->orelse, loop, stored, seen, pass, depth + 1))
      return 0;
  }
  return 1;
}

static int cell_loop_parallel(fb_emit *e, int id, const fb_stmt *s) {
  if (e->o->target != FB_CG_CPU || e->bounds_fn) return 0;
  const fb_kernel *k = e->k;
  unsigned char *stored = calloc((size_t)e->l->nnodes + 1, 1);
  unsigned char *seen = calloc((size_t)k->nblocks + 1, 1);
  int ok = stored && seen && par_scan(k, s->body, id, stored, seen, 0, 0);
  if (ok) memset(seen, 0, (size_t)k->nblocks + 1);
  ok = ok && par_scan(k, s->body, id, stored, seen, 1, 0);
  free(stored);
  free(seen);
  return ok;
}

/* A new access group: a distinct metadata node without operands, which
 * the C API cannot make, so it is read from IR text into this context
 * (metadata belongs to the context, not to the module read). NULL if
 * that fails: the loop is then left unmarked. */
static LLVMMetadataRef new_access_group(fb_emit *e) {
  static const char text[] = "!fb.group = !{!0}\n!0 = distinct !{}\n";
  LLVMMemoryBufferRef buf =
      LLVMCreateMemoryBufferWithMemoryRangeCopy(text, sizeof text - 1, "fb.group");
  LLVMModuleRef m = NULL;
  char *msg = NULL;
  if (!buf || LLVMParseIRInContext(e->c, buf, &m, &msg)) { /* takes buf */
    LLVMDisposeMessage(msg);
    return NULL;
  }
  LLVMMetadataRef g = NULL;
  if (LLVMGetNamedMetadataNumOperands(m, "fb.group") == 1) {
    LLVMValueRef v = NULL;
    LLVMGetNamedMetadataOperands(m, "fb.group", &v);
    if (v) g = LLVMValueAsMetadata(v);
  }
  LLVMDisposeModule(m);
  return g;
}

/* latch's branch back: the loop's id, {self, parallel_accesses group}. */
static void mark_parallel(fb_emit *e, LLVMBasicBlockRef latch, LLVMMetadataRef group) {
  LLVMValueRef br = LLVMGetBasicBlockTerminator(latch);
  if (!br) return;
  LLVMMetadataRef pa[2] = {LLVMMDStringInContext2(e->c, "llvm.loop.parallel_accesses", 27), group};
  LLVMMetadataRef tmp = LLVMTemporaryMDNode(e->c, NULL, 0);
  LLVMMetadataRef ops[2] = {tmp, LLVMMDNodeInContext2(e->c, pa, 2)};
  LLVMMetadataRef id = LLVMMDNodeInContext2(e->c, ops, 2);
  LLVMMetadataReplaceAllUsesWith(tmp, id); /* disposes tmp */
  LLVMSetMetadata(br, LLVMGetMDKindIDInContext(e->c, "llvm.loop", 9), LLVMMetadataAsValue(e->c, id));
}

/* Iterations [start, end) step 1: elements start/M .. ceil(end/M), and in
 * each the cells of [start, end) it holds. The inner loop's element is
 * invariant, so accesses to the loop's own cell are affine in r. */
static int sfor_nested(fb_emit *e, int id, const fb_stmt *s, const sfor_geom *g, LLVMValueRef elems,
                       LLVMValueRef start, LLVMValueRef end) {
  LLVMValueRef M = fb_emit_i64(e, g->M);
  LLVMValueRef e0 = LLVMBuildSDiv(e->b, start, M, "");
  LLVMValueRef e1 =
      LLVMBuildSDiv(e->b, LLVMBuildAdd(e->b, end, fb_emit_i64(e, g->M - 1), ""), M, "");
  counted outer, inner;
  loop_open(e, &outer, e0, e1, "elem");
  LLVMValueRef c[4];
  LLVMValueRef cptr = list_elem(e, elems, outer.x, c);
  LLVMValueRef first = LLVMBuildMul(e->b, outer.x, M, "");
  LLVMValueRef rlo = smax(e, LLVMBuildSub(e->b, start, first, ""), fb_emit_i64(e, 0));
  LLVMValueRef rhi = smin(e, LLVMBuildSub(e->b, end, first, ""), M);
  LLVMMetadataRef group = cell_loop_parallel(e, id, s) ? new_access_group(e) : NULL;
  LLVMMetadataRef saved_group = e->access_group;
  e->access_group = group;
  loop_open(e, &inner, rlo, rhi, "cell");
  int rc = sfor_body(e, id, s, g, cptr, c, inner.x, inner.latch);
  e->access_group = saved_group;
  if (rc) return e->rc;
  loop_close(e, &inner, fb_emit_i64(e, 1));
  if (group) mark_parallel(e, inner.latch, group);
  LLVMBuildBr(e->b, outer.latch);
  loop_close(e, &outer, fb_emit_i64(e, 1));
  return 0;
}

/* Iterations [start, end) by step (grid-stride): element and cell of each. */
static int sfor_flat(fb_emit *e, int id, const fb_stmt *s, const sfor_geom *g, LLVMValueRef elems,
                     LLVMValueRef start, LLVMValueRef end, LLVMValueRef step) {
  counted lp;
  loop_open(e, &lp, start, end, "it");
  LLVMValueRef M = fb_emit_i64(e, g->M);
  LLVMValueRef el = g->M == 1 ? lp.x : LLVMBuildUDiv(e->b, lp.x, M, "");
  LLVMValueRef r = g->M == 1 ? fb_emit_i64(e, 0) : LLVMBuildURem(e->b, lp.x, M, "");
  LLVMValueRef c[4];
  LLVMValueRef cptr = list_elem(e, elems, el, c);
  if (sfor_body(e, id, s, g, cptr, c, r, lp.latch)) return e->rc;
  loop_close(e, &lp, step);
  return 0;
}

static int emit_sparse_iterations(fb_emit *e, int id, const fb_stmt *s, LLVMValueRef start,
                                  LLVMValueRef end, LLVMValueRef step) {
  if (s->op == FB_OP_LISTGEN) {
    LLVMValueRef d = listgen_desc(e, s->snode);
    if (!d) return e->rc;
    counted lp;
    loop_open(e, &lp, start, end, "lg");
    LLVMValueRef args[3] = {e->ctx, d, lp.x};
    fb_emit_call(e, "fb_rt_listgen_step", e->t_void, args, 3);
    LLVMBuildBr(e->b, lp.latch);
    loop_close(e, &lp, step);
    return 0;
  }
  sfor_geom g;
  if (sfor_geometry(e, id, s, &g) < 0) return e->rc;
  LLVMValueRef args[2] = {e->ctx, i32c(e, g.pk)};
  LLVMValueRef elems = fb_emit_global(e, fb_emit_call(e, "fb_rt_list_elems", e->t_ptr, args, 2));
  if (LLVMIsAConstantInt(step) && LLVMConstIntGetSExtValue(step) == 1)
    return sfor_nested(e, id, s, &g, elems, start, end);
  return sfor_flat(e, id, s, &g, elems, start, end, step);
}

/* clear_list / gc (serial runtime calls) and listgen met in a serial task
 * (all its iterations). */
static int emit_list_op(fb_emit *e, int id, const fb_stmt *s) {
  if (s->snode <= 0 || s->snode >= e->l->nnodes || !fb_cg_is_sparse(e->l->nodes[s->snode].kind))
    return fb_emit_error(e, FB_EINVAL, "%%%d %s: SNode %d is not sparse", id, op_name(s), s->snode);
  if (s->op == FB_OP_CLEAR_LIST) {
    LLVMValueRef args[2] = {e->ctx, i32c(e, s->snode)};
    fb_emit_call(e, "fb_rt_clear_list", e->t_void, args, 2);
    return 0;
  }
  if (s->op == FB_OP_GC) {
    fb_rt_cell d;
    char msg[256], name[48];
    if (fb_cg_cell_desc(e->l, s->snode, &d, msg, sizeof msg))
      return fb_emit_error(e, FB_EUNSUPPORTED, "%s", msg);
    snprintf(name, sizeof name, "fb.cell.%d", s->snode);
    LLVMValueRef args[2] = {e->ctx, fb_emit_desc(e, &d, sizeof d, name)};
    fb_emit_call(e, "fb_rt_gc", e->t_void, args, 2);
    return 0;
  }
  LLVMValueRef n = sparse_count(e, id, s);
  if (!n) return e->rc;
  return emit_sparse_iterations(e, id, s, fb_emit_i64(e, 0), n, fb_emit_i64(e, 1));
}

/* Iteration count of a parallel loop as an i64 (end - begin, or 0). */
static LLVMValueRef par_count(fb_emit *e, int id, const fb_stmt *s) {
  if (iterates_list(e, s)) return sparse_count(e, id, s);
  if (s->op == FB_OP_STRUCT_FOR) {
    const fb_snode *sn = &e->l->nodes[s->snode];
    int64_t n = 1;
    for (int d = 0; d < sn->ndim; d++) n *= sn->shape[sn->dim_axis[d]];
    return fb_emit_i64(e, n);
  }
  LLVMValueRef begin = fb_emit_arg(e, s, 0), end = fb_emit_arg(e, s, 1);
  if (!begin || !end) return NULL;
  if (fb_emit_argtype(e, s, 0) != FB_T_I32 || fb_emit_argtype(e, s, 1) != FB_T_I32) {
    fb_emit_error(e, FB_EINVAL, "%%%d par_for: bounds must be i32", id);
    return NULL;
  }
  LLVMValueRef d = LLVMBuildSub(e->b, LLVMBuildSExt(e->b, end, e->t_i64, ""),
                                LLVMBuildSExt(e->b, begin, e->t_i64, ""), "n");
  LLVMValueRef pos = LLVMBuildICmp(e->b, LLVMIntSGT, d, fb_emit_i64(e, 0), "");
  return LLVMBuildSelect(e->b, pos, d, fb_emit_i64(e, 0), "");
}

/* Indices 0..upto of a struct_for over sn from the row-major number `rest`
 * of its first upto + 1 indices (i64): the i32 indices and their i64 twins. */
static void struct_indices(fb_emit *e, int id, const fb_snode *sn, LLVMValueRef rest, int upto) {
  for (int d = upto; d >= 0; d--) {
    LLVMValueRef ext = fb_emit_i64(e, sn->shape[sn->dim_axis[d]]);
    LLVMValueRef q = d > 0 ? LLVMBuildUDiv(e->b, rest, ext, "") : NULL;
    LLVMValueRef r = d > 0 ? LLVMBuildSub(e->b, rest, LLVMBuildMul(e->b, q, ext, ""), "") : rest;
    e->lidx[id][d] = LLVMBuildTrunc(e->b, r, e->t_i32, "idx");
    e->lwide[id][d] = r;
    rest = q;
  }
}

/* Loop indices of iteration `it` (i64) of a parallel loop. */
static void par_indices(fb_emit *e, int id, const fb_stmt *s, LLVMValueRef it) {
  if (s->op == FB_OP_PAR_FOR) {
    /* begin + it < end: exact in i64, and the i64 value is the index's twin */
    LLVMValueRef b64 = LLVMBuildSExt(e->b, e->vals[s->args[0]], e->t_i64, "");
    e->lwide[id][0] = LLVMBuildNSWAdd(e->b, b64, it, "iw");
    e->lidx[id][0] = LLVMBuildTrunc(e->b, e->lwide[id][0], e->t_i32, "idx");
    return;
  }
  struct_indices(e, id, &e->l->nodes[s->snode], it, e->l->nodes[s->snode].ndim - 1);
}

/* A dense struct_for of two or more dimensions on the CPU, iterations
 * [start, end): row by row, an inner loop over the last index, so that
 * the last index is the inner loop's counter (affine: unit-stride loads
 * and stores, vectorisable) rather than a division of the flat counter per
 * iteration. Iteration numbers (rand()) are the flat ones as before. */
static int emit_rows(fb_emit *e, int id, const fb_stmt *s, LLVMValueRef start, LLVMValueRef end) {
  const fb_snode *sn = &e->l->nodes[s->snode];
  int last = sn->ndim - 1;
  LLVMValueRef W = fb_emit_i64(e, sn->shape[sn->dim_axis[last]]);
  LLVMBasicBlockRef pre = LLVMGetInsertBlock(e->b);
  LLVMBasicBlockRef rows = fb_emit_block(e, "rows"), row = fb_emit_block(e, "row");
  LLVMBasicBlockRef cols = fb_emit_block(e, "cols"), body = fb_emit_block(e, "cols.body");
  LLVMBasicBlockRef latch = fb_emit_block(e, "cols.next"), rnext = fb_emit_block(e, "rows.next");
  LLVMBasicBlockRef exit = fb_emit_block(e, "endrows");
  LLVMBuildBr(e->b, rows);
  LLVMPositionBuilderAtEnd(e->b, rows);
  LLVMValueRef it = LLVMBuildPhi(e->b, e->t_i64, "it");
  LLVMAddIncoming(it, &start, &pre, 1);
  LLVMBuildCondBr(e->b, LLVMBuildICmp(e->b, LLVMIntSLT, it, end, ""), row, exit);
  LLVMPositionBuilderAtEnd(e->b, row);
  /* this row: columns [j0, j1), j1 = j0 + min(W - j0, end - it) */
  LLVMValueRef q = LLVMBuildUDiv(e->b, it, W, "");
  LLVMValueRef j0 = LLVMBuildNUWSub(e->b, it, LLVMBuildNUWMul(e->b, q, W, ""), "j0");
  LLVMValueRef left = LLVMBuildNSWSub(e->b, W, j0, ""), rest = LLVMBuildNSWSub(e->b, end, it, "");
  LLVMValueRef n =
      LLVMBuildSelect(e->b, LLVMBuildICmp(e->b, LLVMIntSLT, left, rest, ""), left, rest, "n");
  LLVMValueRef j1 = LLVMBuildNSWAdd(e->b, j0, n, "j1");
  struct_indices(e, id, sn, q, last - 1);
  LLVMBuildBr(e->b, cols);
  LLVMPositionBuilderAtEnd(e->b, cols);
  LLVMValueRef j = LLVMBuildPhi(e->b, e->t_i64, "j");
  LLVMAddIncoming(j, &j0, &row, 1);
  LLVMBuildCondBr(e->b, LLVMBuildICmp(e->b, LLVMIntSLT, j, j1, ""), body, rnext);
  LLVMPositionBuilderAtEnd(e->b, body);
  LLVMBuildStore(e->b, fb_emit_i64(e, 0), e->rand_count);
  LLVMValueRef saved_iter = e->rand_iter;
  e->rand_iter = LLVMBuildNSWAdd(e->b, it, LLVMBuildNSWSub(e->b, j, j0, ""), "iter");
  e->lidx[id][last] = LLVMBuildTrunc(e->b, j, e->t_i32, "idx");
  e->lwide[id][last] = j;
  if (push_loop(e, id, NULL, latch)) return e->rc;
  emit_block(e, s->body);
  e->nloops--;
  e->rand_iter = saved_iter;
  if (e->rc) return e->rc;
  br_to(e, latch);
  LLVMPositionBuilderAtEnd(e->b, latch);
  LLVMValueRef jn = LLVMBuildNSWAdd(e->b, j, fb_emit_i64(e, 1), ""); /* j < j1 <= W */
  LLVMAddIncoming(j, &jn, &latch, 1);
  LLVMBuildBr(e->b, cols);
  LLVMPositionBuilderAtEnd(e->b, rnext);
  LLVMValueRef next = LLVMBuildNSWAdd(e->b, it, n, "");
  LLVMAddIncoming(it, &next, &rnext, 1);
  LLVMBuildBr(e->b, rows);
  LLVMPositionBuilderAtEnd(e->b, exit);
  return 0;
}

/* for (it = start; it < end; it += step) { count = 0; body }, it in i64. */
static int emit_iterations(fb_emit *e, int id, const fb_stmt *s, LLVMValueRef start,
                           LLVMValueRef end, LLVMValueRef step) {
  if (iterates_list(e, s)) {
    LLVMValueRef saved_iter = e->rand_iter;
    emit_sparse_iterations(e, id, s, start, end, step);
    e->rand_iter = saved_iter;
    return e->rc;
  }
  if (s->op == FB_OP_STRUCT_FOR && e->l->nodes[s->snode].ndim >= 2 && e->o->target == FB_CG_CPU &&
      LLVMIsConstant(step) && LLVMConstIntGetSExtValue(step) == 1)
    return emit_rows(e, id, s, start, end);
  LLVMBasicBlockRef pre = LLVMGetInsertBlock(e->b);
  LLVMBasicBlockRef head = fb_emit_block(e, "par");
  LLVMBasicBlockRef body = fb_emit_block(e, "par.body");
  LLVMBasicBlockRef latch = fb_emit_block(e, "par.next");
  LLVMBasicBlockRef exit = fb_emit_block(e, "endpar");
  LLVMBuildBr(e->b, head);
  LLVMPositionBuilderAtEnd(e->b, head);
  LLVMValueRef it = LLVMBuildPhi(e->b, e->t_i64, "it");
  LLVMAddIncoming(it, &start, &pre, 1);
  LLVMBuildCondBr(e->b, LLVMBuildICmp(e->b, LLVMIntSLT, it, end, ""), body, exit);
  LLVMPositionBuilderAtEnd(e->b, body);
  LLVMBuildStore(e->b, fb_emit_i64(e, 0), e->rand_count);
  LLVMValueRef saved_iter = e->rand_iter;
  e->rand_iter = it;
  par_indices(e, id, s, it);
  if (push_loop(e, id, NULL, latch)) return e->rc;
  emit_block(e, s->body);
  e->nloops--;
  e->rand_iter = saved_iter;
  if (e->rc) return e->rc;
  br_to(e, latch);
  LLVMPositionBuilderAtEnd(e->b, latch);
  LLVMValueRef next = LLVMBuildNSWAdd(e->b, it, step, ""); /* it < hi <= 2^32 */
  LLVMAddIncoming(it, &next, &latch, 1);
  LLVMBuildBr(e->b, head);
  LLVMPositionBuilderAtEnd(e->b, exit);
  return 0;
}

/* A parallel loop inside a serial task: all iterations, in order; rand()
 * numbering as in a parallel task, and a fresh count after the loop. */
static int emit_serial_par(fb_emit *e, int id, const fb_stmt *s) {
  LLVMValueRef n = par_count(e, id, s);
  if (!n) return e->rc;
  if (emit_iterations(e, id, s, fb_emit_i64(e, 0), n, fb_emit_i64(e, 1))) return e->rc;
  LLVMBuildStore(e->b, fb_emit_i64(e, 0), e->rand_count);
  return 0;
}

static int emit_jump(fb_emit *e, int id, const fb_stmt *s) {
  if (e->nloops == 0)
    return fb_emit_error(e, FB_EINVAL, "%%%d %s: not inside a loop", id, op_name(s));
  const fb_cg_loop *lp = &e->loops[e->nloops - 1];
  LLVMBasicBlockRef to = s->op == FB_OP_BREAK ? lp->brk : lp->cont;
  if (!to)
    return fb_emit_error(e, FB_EINVAL, "%%%d %s: not allowed in a parallel loop", id, op_name(s));
  LLVMBuildBr(e->b, to);
  /* statements after a jump are dead: give them a block of their own */
  LLVMPositionBuilderAtEnd(e->b, fb_emit_block(e, "dead"));
  return 0;
}

static int emit_loop_index(fb_emit *e, int id, const fb_stmt *s) {
  int loop = s->args[0];
  int which = (int)s->imm.i;
  if (loop < 0 || loop >= e->k->nstmts || which < 0 || which >= FB_MAX_AXES ||
      !e->lidx[loop][which])
    return fb_emit_error(e, FB_EINVAL,
                         "%%%d loop_index: %%%d is not an enclosing loop "
                         "with index %d",
                         id, loop, which);
  e->vals[id] = e->lidx[loop][which];
  return 0;
}

/* ---------------------------------------------------------------- statements */

static int has_global_effect(const fb_stmt *s) {
  return (fb_op_table[s->op].flags & FB_OPF_WRITES) || s->op == FB_OP_RET;
}

static int emit_stmt(fb_emit *e, int id) {
  if (id < 0 || id >= e->k->nstmts)
    return fb_emit_error(e, FB_EINVAL, "block lists statement %d, which does not exist", id);
  const fb_stmt *s = &e->k->stmts[id];
  if (s->op >= FB_OP__COUNT) return fb_emit_error(e, FB_EINVAL, "%%%d: unknown op %u", id, s->op);
  if (e->done[id]) return fb_emit_error(e, FB_EINVAL, "%%%d %s: listed twice", id, op_name(s));
  e->done[id] = 1;
  if (e->bounds_fn && ((e->keep && !e->keep[id]) || has_global_effect(s))) {
    /* not needed by the bounds: leave a harmless value behind */
    LLVMTypeRef ty = fb_emit_type(e, (fb_type)s->type);
    if (ty && s->op != FB_OP_ALLOCA) e->vals[id] = LLVMConstNull(ty);
    return 0;
  }
  if (!e->bounds_fn) e->stmts++;
  switch (fb_op_table[s->op].cls) {
  case FB_OPC_IF: return emit_if(e, id, s);
  case FB_OPC_LOOP: return emit_while(e, id, s);
  case FB_OPC_RANGE:
    return s->op == FB_OP_PAR_FOR ? emit_serial_par(e, id, s) : emit_range_for(e, id, s);
  case FB_OPC_STRUCT:
    if (s->snode < 0 || s->snode >= e->l->nnodes)
      return fb_emit_error(e, FB_EINVAL, "%%%d struct_for: no SNode %d", id, s->snode);
    return emit_serial_par(e, id, s);
  case FB_OPC_JUMP: return emit_jump(e, id, s);
  case FB_OPC_LIST: return emit_list_op(e, id, s);
  case FB_OPC_LOOPIDX:
    if (!emit_loop_index(e, id, s)) fb_cg_wide_note(e, id);
    return e->rc;
  case FB_OPC_ALLOCA:
  case FB_OPC_LLOAD:
  case FB_OPC_LSTORE:
  case FB_OPC_GLOAD:
  case FB_OPC_GSTORE:
  case FB_OPC_ATOMIC:
  case FB_OPC_IATOMIC:
  case FB_OPC_SPARSE:
  case FB_OPC_APPEND:
  case FB_OPC_LENGTH:
  case FB_OPC_RET:
  case FB_OPC_GTMP:
  case FB_OPC_RAND: return fb_emit_mem_op(e, id, s);
  default:
    if (!fb_emit_value_op(e, id, s)) fb_cg_wide_note(e, id);
    return e->rc;
  }
}

int fb_emit_stmt(fb_emit *e, int id) { return emit_stmt(e, id); }

static int emit_range(fb_emit *e, int blk, int from, int to) {
  const fb_block *b = &e->k->blocks[blk];
  for (int i = from; i < to && i < b->n && !e->rc; i++) {
    int id = b->ids[i];
    if (i + 1 < to && i + 1 < b->n && id >= 0 && id < e->k->nstmts && !e->done[id] &&
        e->k->stmts[id].op < FB_OP__COUNT && fb_op_table[e->k->stmts[id].op].cls == FB_OPC_ATOMIC) {
      int r = fb_emit_try_group(e, blk, i, to);
      if (r < 0) return e->rc;
      if (r > 0) {
        i += r - 1;
        continue;
      }
    }
    if (i + 1 < to && i + 1 < b->n && id >= 0 && id < e->k->nstmts &&
        (e->k->stmts[id].op == FB_OP_LOAD || e->k->stmts[id].op == FB_OP_STORE ||
         e->k->stmts[id].op == FB_OP_STORE_NA)) {
      int n = (to < b->n ? to : b->n) - i;
      int r = e->k->stmts[id].op == FB_OP_LOAD ? fb_emit_try_loads(e, b->ids + i, n)
                                               : fb_emit_try_stores(e, b->ids + i, n);
      if (r) {
        if (r > 0) i += r - 1;
        continue;
      }
    }
    emit_stmt(e, id);
  }
  return e->rc;
}

static int emit_block(fb_emit *e, int blk) {
  if (blk < 0 || blk >= e->k->nblocks)
    return fb_emit_error(e, FB_EINVAL, "reference to block %d, which does not exist", blk);
  return emit_range(e, blk, 0, e->k->blocks[blk].n);
}

/* ---------------------------------------------------------------- functions */

typedef struct fn_frame {
  LLVMBasicBlockRef entry, code;
} fn_frame;

/* Start a function: entry block for allocas, code block for statements. */
static void fn_begin(fb_emit *e, const char *name, LLVMTypeRef *params, unsigned np, fn_frame *f) {
  LLVMTypeRef fty = LLVMFunctionType(e->t_void, params, np, 0);
  e->fn = LLVMAddFunction(e->m, name, fty);
  e->ctx = LLVMGetParam(e->fn, 0);
  LLVMSetValueName2(e->ctx, "ctx", 3);
  f->entry = fb_emit_block(e, "entry");
  f->code = fb_emit_block(e, "code");
  LLVMPositionBuilderAtEnd(e->ab, f->entry);
  LLVMPositionBuilderAtEnd(e->b, f->code);
  size_t n = (size_t)e->k->nstmts;
  memset(e->vals, 0, n * sizeof *e->vals);
  memset(e->lidx, 0, n * sizeof *e->lidx);
  memset(e->lwide, 0, n * sizeof *e->lwide);
  memset(e->wide, 0, n * sizeof *e->wide);
  memset(e->done, 0, n);
  e->nloops = 0;
  e->c_root = fb_emit_global(e, fb_emit_ctx_field(e, FB_CTX_ROOT, e->t_ptr));
  e->c_priv = NULL;
  if (e->priv_place) { /* ctx->priv, or root when the launcher gave none */
    LLVMValueRef pv = fb_emit_ctx_field(e, FB_CTX_PRIV, e->t_ptr);
    LLVMValueRef none = LLVMBuildICmp(e->b, LLVMIntEQ, pv, LLVMConstNull(e->t_ptr), "");
    e->c_priv = LLVMBuildSelect(e->b, none, e->c_root, pv, "priv");
  }
  /* args stay generic: on NVPTX the launch entry keeps them in registers
   * (fb_gpu_entry), elsewhere they are host or global memory */
  e->c_args = fb_emit_ctx_field(e, FB_CTX_ARGS, e->t_ptr);
  e->c_rets = fb_emit_global(e, fb_emit_ctx_field(e, FB_CTX_RETS, e->t_ptr));
  e->c_gtmp = fb_emit_global(e, fb_emit_ctx_field(e, FB_CTX_GTMP, e->t_ptr));
  e->c_error = fb_emit_global(e, fb_emit_ctx_field(e, FB_CTX_ERROR, e->t_ptr));
  e->c_seed = fb_emit_ctx_field(e, FB_CTX_SEED, e->t_i64);
  e->c_launch = fb_emit_ctx_field(e, FB_CTX_LAUNCH, e->t_i64);
  e->rand_count = LLVMBuildAlloca(e->ab, e->t_i64, "rand.count");
  LLVMBuildStore(e->b, fb_emit_i64(e, 0), e->rand_count);
  e->rand_launch = LLVMBuildAlloca(e->ab, e->t_i64, "rand.launch");
  LLVMBuildStore(e->b, e->c_launch, e->rand_launch);
  e->rand_iter = fb_emit_i64(e, 0);
}

static void fn_finish(fb_emit *e, fn_frame *f) {
  if (!fb_emit_terminated(e)) LLVMBuildRetVoid(e->b);
  LLVMBuildBr(e->ab, f->code);
}

/* NVPTX: the global thread number and the grid's thread count, as i64. */
static void gpu_thread(fb_emit *e, LLVMValueRef *gid, LLVMValueRef *nthreads) {
  LLVMValueRef tid = fb_emit_intrinsic(e, "llvm.nvvm.read.ptx.sreg.tid.x", NULL, NULL, 0);
  LLVMValueRef ntid = fb_emit_intrinsic(e, "llvm.nvvm.read.ptx.sreg.ntid.x", NULL, NULL, 0);
  LLVMValueRef ctaid = fb_emit_intrinsic(e, "llvm.nvvm.read.ptx.sreg.ctaid.x", NULL, NULL, 0);
  LLVMValueRef nctaid = fb_emit_intrinsic(e, "llvm.nvvm.read.ptx.sreg.nctaid.x", NULL, NULL, 0);
  LLVMValueRef t64 = LLVMBuildZExt(e->b, tid, e->t_i64, "");
  LLVMValueRef nt64 = LLVMBuildZExt(e->b, ntid, e->t_i64, "");
  LLVMValueRef c64 = LLVMBuildZExt(e->b, ctaid, e->t_i64, "");
  LLVMValueRef nc64 = LLVMBuildZExt(e->b, nctaid, e->t_i64, "");
  *gid = LLVMBuildAdd(e->b, LLVMBuildMul(e->b, c64, nt64, ""), t64, "gid");
  *nthreads = LLVMBuildMul(e->b, nc64, nt64, "nthreads");
}

static int emit_body_fn(fb_emit *e, const fb_cg_task *t, int loop_pos) {
  LLVMTypeRef params[3] = {e->t_ptr, e->t_i64, e->t_i64};
  fn_frame f;
  fn_begin(e, e->o->body_name, params, 3, &f);
  LLVMValueRef lo = LLVMGetParam(e->fn, 1), hi = LLVMGetParam(e->fn, 2);
  LLVMSetValueName2(lo, "lo", 2);
  LLVMSetValueName2(hi, "hi", 2);
  if (t->loop < 0) {
    if (e->o->target == FB_CG_NVPTX) { /* one thread runs a serial task */
      LLVMValueRef gid, nth;
      gpu_thread(e, &gid, &nth);
      LLVMBasicBlockRef run = fb_emit_block(e, "serial");
      LLVMBasicBlockRef skip = fb_emit_block(e, "others");
      LLVMBuildCondBr(e->b, LLVMBuildICmp(e->b, LLVMIntEQ, gid, fb_emit_i64(e, 0), ""), run, skip);
      LLVMPositionBuilderAtEnd(e->b, skip);
      LLVMBuildRetVoid(e->b);
      LLVMPositionBuilderAtEnd(e->b, run);
    }
    emit_block(e, 0);
  } else {
    const fb_stmt *s = &e->k->stmts[t->loop];
    emit_range(e, 0, 0, loop_pos);
    if (!e->rc) {
      e->done[t->loop] = 1;
      e->stmts++;
      /* never run past the iteration space, whatever the caller passes:
       * this also tells LLVM the index range, so it can drop bounds checks */
      LLVMValueRef n = par_count(e, t->loop, s);
      if (!n) return e->rc;
      LLVMValueRef zero = fb_emit_i64(e, 0);
      lo = LLVMBuildSelect(e->b, LLVMBuildICmp(e->b, LLVMIntSLT, lo, zero, ""), zero, lo, "lo");
      hi = LLVMBuildSelect(e->b, LLVMBuildICmp(e->b, LLVMIntSGT, hi, n, ""), n, hi, "hi");
      LLVMValueRef start = lo, step = fb_emit_i64(e, 1);
      if (e->o->target == FB_CG_NVPTX) {
        LLVMValueRef gid;
        gpu_thread(e, &gid, &step);
        start = LLVMBuildAdd(e->b, lo, gid, "");
      }
      fb_reduce_open(e);
      if (!emit_iterations(e, t->loop, s, start, hi, step)) fb_reduce_close(e);
    }
  }
  if (e->rc) return e->rc;
  fn_finish(e, &f);
  return 0;
}

/* ---------------------------------------------------------------- bounds */

static void keep_mark(fb_emit *e, unsigned char *keep, int *stack, int *sp, int id) {
  if (id < 0 || id >= e->k->nstmts || keep[id]) return;
  keep[id] = 1;
  stack[(*sp)++] = id;
}

/* Mark a block statement's contents (everything it runs). */
static void keep_tree(fb_emit *e, unsigned char *keep, int *stack, int *sp, int blk, int depth) {
  if (blk < 0 || blk >= e->k->nblocks || depth > FB_MAX_BLOCK_DEPTH) return;
  const fb_block *b = &e->k->blocks[blk];
  for (int i = 0; i < b->n; i++) {
    int id = b->ids[i];
    if (id < 0 || id >= e->k->nstmts) continue;
    keep_mark(e, keep, stack, sp, id);
    keep_tree(e, keep, stack, sp, e->k->stmts[id].body, depth + 1);
    keep_tree(e, keep, stack, sp, e->k->stmts[id].orelse, depth + 1);
  }
}

/* Does the tree of top-level statement top store into local variable var? */
static int tree_stores(const fb_kernel *k, int blk, int var, int depth) {
  if (blk < 0 || blk >= k->nblocks || depth > FB_MAX_BLOCK_DEPTH) return 0;
  const fb_block *b = &k->blocks[blk];
  for (int i = 0; i < b->n; i++) {
    int id = b->ids[i];
    if (id < 0 || id >= k->nstmts) continue;
    const fb_stmt *s = &k->stmts[id];
    if (s->op == FB_OP_LSTORE && s->args[0] == var) return 1;
    if (tree_stores(k, s->body, var, depth + 1) || tree_stores(k, s->orelse, var, depth + 1))
      return 1;
  }
  return 0;
}

/* Statements before the loop that the loop's bounds depend on: operands,
 * transitively, and for a local variable every top-level statement that
 * stores into it. */
static unsigned char *bounds_keep(fb_emit *e, const fb_stmt *loop, int loop_pos) {
  int n = e->k->nstmts;
  unsigned char *keep = calloc((size_t)n + 1, 1);
  int *stack = malloc(sizeof(int) * ((size_t)n + 1));
  if (!keep || !stack) {
    free(keep);
    free(stack);
    return NULL;
  }
  int sp = 0;
  for (int i = 0; i < loop->nargs && i < FB_MAX_ARGS; i++)
    keep_mark(e, keep, stack, &sp, loop->args[i]);
  const fb_block *b0 = &e->k->blocks[0];
  while (sp > 0) {
    const fb_stmt *s = &e->k->stmts[stack[--sp]];
    for (int i = 0; i < s->nargs && i < FB_MAX_ARGS; i++)
      keep_mark(e, keep, stack, &sp, s->args[i]);
    if (s->op != FB_OP_ALLOCA) continue;
    int var = (int)(s - e->k->stmts);
    for (int p = 0; p < loop_pos; p++) {
      int top = b0->ids[p];
      if (top < 0 || top >= n || keep[top]) continue;
      const fb_stmt *ts = &e->k->stmts[top];
      if ((ts->op == FB_OP_LSTORE && ts->args[0] == var) || tree_stores(e->k, ts->body, var, 0) ||
          tree_stores(e->k, ts->orelse, var, 0)) {
        keep_mark(e, keep, stack, &sp, top);
        keep_tree(e, keep, stack, &sp, ts->body, 0);
        keep_tree(e, keep, stack, &sp, ts->orelse, 0);
      }
    }
  }
  free(stack);
  return keep;
}

static int emit_bounds_fn(fb_emit *e, const fb_cg_task *t, int loop_pos) {
  const fb_stmt *s = &e->k->stmts[t->loop];
  unsigned char *keep = bounds_keep(e, s, loop_pos);
  if (!keep) return fb_emit_error(e, FB_ENOMEM, "out of memory");
  LLVMTypeRef params[2] = {e->t_ptr, e->t_ptr};
  fn_frame f;
  int saved = e->stmts;
  e->bounds_fn = 1;
  e->keep = keep;
  fn_begin(e, e->o->bounds_name, params, 2, &f);
  emit_range(e, 0, 0, loop_pos);
  LLVMValueRef n = e->rc ? NULL : par_count(e, t->loop, s);
  if (n) {
    LLVMValueRef st = LLVMBuildStore(e->b, n, LLVMGetParam(e->fn, 1));
    LLVMSetAlignment(st, 8);
    fn_finish(e, &f);
  }
  e->bounds_fn = 0;
  e->keep = NULL;
  e->stmts = saved;
  free(keep);
  return e->rc;
}

/* ---------------------------------------------------------------- module */

static int check_task(const fb_cg_task *t, int *loop_pos, char *err, size_t errlen) {
  const fb_kernel *k = t ? t->ir : NULL;
  if (!k || !k->layout || !k->layout->finalized || k->nblocks < 1)
    return fb_cg_fail(err, errlen, FB_EINVAL, "task has no IR or its layout is not finalized");
  *loop_pos = -1;
  if (t->loop < 0) return 0;
  int pos = -1;
  const fb_block *b0 = &k->blocks[0];
  for (int i = 0; i < b0->n; i++)
    if (b0->ids[i] == t->loop) pos = i;
  if (t->loop >= k->nstmts || pos < 0)
    return fb_cg_fail(err, errlen, FB_EINVAL,
                      FB_BUG "task IR %s: loop %%%d is not a top-level statement",
                      k->name, t->loop);
  const fb_stmt *s = &k->stmts[t->loop];
  if (s->op != FB_OP_PAR_FOR && s->op != FB_OP_STRUCT_FOR && s->op != FB_OP_LISTGEN)
    return fb_cg_fail(err, errlen, FB_EINVAL,
                      FB_BUG "task IR %s: loop %%%d is a '%s' statement, not par_for, "
                      "struct_for or listgen",
                      k->name, t->loop, s->op < FB_OP__COUNT ? fb_op_table[s->op].name : "?");
  if ((s->op == FB_OP_STRUCT_FOR || s->op == FB_OP_LISTGEN) &&
      (s->snode <= 0 || s->snode >= k->layout->nnodes))
    return fb_cg_fail(err, errlen, FB_EINVAL, FB_BUG "task IR %s: struct_for %%%d names no SNode",
                      k->name, t->loop);
  if (pos != b0->n - 1)
    return fb_cg_fail(err, errlen, FB_EINVAL,
                      FB_BUG "task IR %s: statements follow the parallel loop "
                      "%%%d",
                      k->name, t->loop);
  *loop_pos = pos;
  return 0;
}

static void add_kernel_annotation(fb_emit *e, const char *name) {
  LLVMValueRef fn = LLVMGetNamedFunction(e->m, name);
  if (!fn) return;
  LLVMSetFunctionCallConv(fn, LLVMPTXKernelCallConv);
  LLVMMetadataRef md[3] = {LLVMValueAsMetadata(fn), LLVMMDStringInContext2(e->c, "kernel", 6),
                           LLVMValueAsMetadata(LLVMConstInt(e->t_i32, 1, 0))};
  LLVMAddNamedMetadataOperand(e->m, "nvvm.annotations",
                              LLVMMetadataAsValue(e->c, LLVMMDNodeInContext2(e->c, md, 3)));
}

/* NVPTX: the kernel the runtime launches, FB_GPU_ENTRY(root, rets, gtmp,
 * error, seed, launch, runtime, lo, hi, arg 0, ..., arg n-1), every
 * parameter 64 bits. It builds the task's context in local memory and calls
 * the body (internal, so it is inlined and the context and the argument
 * slots become registers): a launch needs no context in device memory and
 * no copy before it, cuLaunchKernel carries everything. */
static void emit_gpu_entry(fb_emit *e) {
  LLVMValueRef body = LLVMGetNamedFunction(e->m, e->o->body_name);
  if (!body) return;
  LLVMSetLinkage(body, LLVMInternalLinkage);
  unsigned np = FB_GPU_FIXED_PARAMS + (unsigned)e->k->nparams;
  LLVMTypeRef *pt = malloc(sizeof *pt * np);
  if (!pt) {
    fb_emit_error(e, FB_ENOMEM, "out of memory");
    return;
  }
  for (unsigned i = 0; i < np; i++) pt[i] = e->t_i64;
  LLVMValueRef fn = LLVMAddFunction(e->m, FB_GPU_ENTRY, LLVMFunctionType(e->t_void, pt, np, 0));
  free(pt);
  LLVMBuilderRef b = e->b;
  LLVMPositionBuilderAtEnd(b, LLVMAppendBasicBlockInContext(e->c, fn, "entry"));
  unsigned na = e->k->nparams ? (unsigned)e->k->nparams : 1;
  LLVMValueRef args = LLVMBuildAlloca(b, LLVMArrayType2(e->t_i64, na), "args");
  for (int i = 0; i < e->k->nparams; i++) {
    LLVMValueRef idx = fb_emit_i64(e, i);
    LLVMValueRef slot = LLVMBuildGEP2(b, e->t_i64, args, &idx, 1, "");
    LLVMBuildStore(b, LLVMGetParam(fn, FB_GPU_FIXED_PARAMS + (unsigned)i), slot);
  }
  LLVMValueRef ctx = LLVMBuildAlloca(b, LLVMArrayType2(e->t_i64, 8), "ctx");
  /* context field <- entry parameter (-1: the argument slots) */
  static const struct {
    int field, param, ptr;
  } map[] = {{FB_CTX_ROOT, 0, 1},   {FB_CTX_ARGS, -1, 1},  {FB_CTX_RETS, 1, 1},
             {FB_CTX_GTMP, 2, 1},   {FB_CTX_ERROR, 3, 1},  {FB_CTX_SEED, 4, 0},
             {FB_CTX_LAUNCH, 5, 0}, {FB_CTX_RUNTIME, 6, 1}};
  for (size_t i = 0; i < sizeof map / sizeof map[0]; i++) {
    LLVMValueRef idx = fb_emit_i64(e, map[i].field);
    LLVMValueRef slot = LLVMBuildGEP2(b, e->t_i64, ctx, &idx, 1, "");
    LLVMValueRef v = map[i].param < 0 ? args : LLVMGetParam(fn, (unsigned)map[i].param);
    if (map[i].ptr && map[i].param >= 0) v = LLVMBuildIntToPtr(b, v, e->t_ptr, "");
    LLVMBuildStore(b, v, slot);
  }
  LLVMValueRef call[3] = {ctx, LLVMGetParam(fn, 7), LLVMGetParam(fn, 8)};
  LLVMBuildCall2(b, LLVMGlobalGetValueType(body), body, call, 3, "");
  LLVMBuildRetVoid(b);
}

int64_t fb_cg_static_count(const fb_cg_task *t) {
  if (!t || !t->ir || t->loop < 0 || t->loop >= t->ir->nstmts) return -1;
  const fb_kernel *k = t->ir;
  const fb_stmt *s = &k->stmts[t->loop];
  if (s->op == FB_OP_STRUCT_FOR) {
    const fb_snode *sn = &k->layout->nodes[s->snode];
    if (fb_cg_sparse_leaf(k->layout, sn->kind == FB_SN_PLACE ? sn->parent : sn->id)) return -1;
    int64_t n = 1;
    for (int d = 0; d < sn->ndim; d++) n *= sn->shape[sn->dim_axis[d]];
    return n;
  }
  if (s->op != FB_OP_PAR_FOR || s->nargs < 2) return -1;
  const fb_stmt *b = &k->stmts[s->args[0]], *en = &k->stmts[s->args[1]];
  if (b->op != FB_OP_CONST || en->op != FB_OP_CONST) return -1;
  int64_t n = (int64_t)en->imm.i - (int64_t)b->imm.i;
  return n > 0 ? n : 0;
}

static void emit_init(fb_emit *e, LLVMContextRef c, const fb_cg_task *t, const fb_cg_options *o,
                      char *err, size_t errlen) {
  memset(e, 0, sizeof *e);
  e->k = t->ir;
  e->l = t->ir->layout;
  e->o = o;
  e->c = c;
  e->err = err;
  e->errlen = errlen;
  e->t_void = LLVMVoidTypeInContext(c);
  e->t_i1 = LLVMInt1TypeInContext(c);
  e->t_i8 = LLVMInt8TypeInContext(c);
  e->t_i32 = LLVMInt32TypeInContext(c);
  e->t_i64 = LLVMInt64TypeInContext(c);
  e->t_f32 = LLVMFloatTypeInContext(c);
  e->t_f64 = LLVMDoubleTypeInContext(c);
  e->t_ptr = LLVMPointerTypeInContext(c, 0);
  e->sfor_loop = e->sfor_T = -1;
  for (int i = 0; i < t->ir->nstmts; i++)
    if (t->ir->stmts[i].op == FB_OP_DEACTIVATE) e->has_deactivate = 1;
}

/* The verifier's verdict, its first message into err. */
static int verify_task(const fb_kernel *k, char *err, size_t errlen) {
  fb_diags d;
  fb_diags_init(&d);
  int rc = fb_verify(k, &d);
  if (rc)
    fb_cg_fail(err, errlen, rc, FB_BUG "task IR %s fails verification: %s%s",
               k->name ? k->name : "?",
               d.n ? d.v[0].msg : fb_strerror(rc), d.n > 1 ? " (and more)" : "");
  fb_diags_free(&d);
  return rc;
}

int fb_cg_build(LLVMContextRef c, const fb_cg_task *t, const fb_cg_options *o, const char *triple,
                const char *datalayout, LLVMModuleRef *out, int *stmts, char *err, size_t errlen) {
  int loop_pos;
  int rc = check_task(t, &loop_pos, err, errlen);
  if (!rc) rc = verify_task(t->ir, err, errlen);
  if (rc) return rc;
  fb_emit e;
  emit_init(&e, c, t, o, err, errlen);
  size_t n = (size_t)t->ir->nstmts + 1;
  e.vals = calloc(n, sizeof *e.vals);
  e.lidx = calloc(n, sizeof *e.lidx);
  e.lwide = calloc(n, sizeof *e.lwide);
  e.wide = calloc(n, sizeof *e.wide);
  e.used = calloc(n, 1);
  e.done = calloc(n, 1);
  e.rstate = calloc(n, 1);
  e.rlo = calloc(n, sizeof *e.rlo);
  e.rhi = calloc(n, sizeof *e.rhi);
  if (!e.vals || !e.lidx || !e.lwide || !e.wide || !e.used || !e.done || !e.rstate || !e.rlo ||
      !e.rhi) {
    rc = fb_cg_fail(err, errlen, FB_ENOMEM, "out of memory");
    goto out;
  }
  for (int i = 0; i < t->ir->nstmts; i++) {
    const fb_stmt *st = &t->ir->stmts[i];
    for (int a = 0; a < st->nargs && a < FB_MAX_ARGS; a++)
      if (st->args[a] >= 0 && st->args[a] < t->ir->nstmts) e.used[st->args[a]] = 1;
  }
  e.m = LLVMModuleCreateWithNameInContext(t->ir->name ? t->ir->name : "task", c);
  LLVMSetTarget(e.m, triple);
  LLVMSetDataLayout(e.m, datalayout);
  e.b = LLVMCreateBuilderInContext(c);
  e.ab = LLVMCreateBuilderInContext(c);
  if (o->target == FB_CG_CPU && t->loop >= 0) { /* privatized scatter (priv.c) */
    fb_cg_priv plan;
    e.priv_place = calloc((size_t)t->ir->layout->nnodes, 1); /* NULL: atomics stay */
    if (e.priv_place && (fb_cg_priv_plan(t, &plan, e.priv_place) || !plan.n)) {
      free(e.priv_place);
      e.priv_place = NULL;
    }
  }
  if (t->loop >= 0) fb_reduce_plan(&e, t->loop);
  if (!e.rc) emit_body_fn(&e, t, loop_pos);
  if (!e.rc && t->loop >= 0) emit_bounds_fn(&e, t, loop_pos);
  if (!e.rc && o->target == FB_CG_NVPTX) {
    emit_gpu_entry(&e);
    add_kernel_annotation(&e, FB_GPU_ENTRY);
    if (t->loop >= 0) add_kernel_annotation(&e, o->bounds_name);
  }
  LLVMDisposeBuilder(e.b);
  LLVMDisposeBuilder(e.ab);
  rc = e.rc;
  if (rc) {
    LLVMDisposeModule(e.m);
  } else {
    *out = e.m;
    if (stmts) *stmts = e.stmts;
  }
out:
  fb_reduce_free(&e);
  free(e.priv_place);
  free(e.vals);
  free(e.lidx);
  free(e.lwide);
  free(e.wide);
  free(e.used);
  free(e.done);
  free(e.rstate);
  free(e.rlo);
  free(e.rhi);
  return rc;
}
