/* Privatized scatter on the CPU (fb_cg_priv, codegen.h). A P2G scatter
 * (`grid_v[base + offs] += w * mv` over the particles of a parallel loop)
 * is a float atomic add per grid component; on x86 each is a `lock
 * cmpxchg` loop, a full barrier of some twenty cycles, and in MLS-MPM they
 * were about half of the P2G task's time. When the task's only accesses to
 * a top-level tree of the layout are such adds, each thread may instead
 * add into a private copy of the tree with plain loads and stores and the
 * launcher adds the copies into the tree after the loop (runtime/launch.c),
 * the per-thread accumulation Taichi's CPU back end does not have.
 *
 * Sound when, for a tree T (a child of the root):
 *  - every container in T is dense and every place of one word class, f32
 *    or 32-bit integer (i32, u32), so T is one range of root bytes whose
 *    words are all f32 or all integers (padding is never touched);
 *  - every statement of the task that names an SNode of T is an atomic_add
 *    (or atomic_add_na: no activation on a dense path) with an unused
 *    result: nothing reads T's values during the loop, so no one can see a
 *    partial sum, and addition is the only update, so summing the copies
 *    afterwards gives the same sums in another order (which atomics leave
 *    unspecified anyway);
 *  - the task is a parallel par_for or struct_for (not a list task).
 * Every word of a copy starts as 0x80000000 and is set back to it after the
 * sum (runtime/launch.c), whatever the tree's class:
 *  - f32: 0x80000000 is -0.0, the identity of + (x + -0.0 == x for every
 *    x, -0.0 included), so a word no thread touched leaves root's word as
 *    it was, bit for bit; a touched word adds the thread's partial sum.
 *    Results equal the atomic path's up to the order of the f32 additions,
 *    which atomics leave unspecified (bit for bit when the sums are exact).
 *  - integers: a thread adds modulo 2^32 into a word that holds
 *    0x80000000 + its partial sum, and the launcher adds the word minus
 *    0x80000000 into root, modulo 2^32: the same residue as every atomic
 *    add done on root, since addition modulo 2^32 is associative and
 *    commutative (the language's i32 + wraps, ir/arith.c). The results are
 *    bit for bit the atomic path's and the interpreter's, in any order; a
 *    word whose partial sum is 0 (untouched, or adds that cancel) leaves
 *    root as it was, so the launcher may skip it.
 * The copies are bounded: hi - lo <= FB_CG_PRIV_MAX_BYTES (trees over the
 * bound keep their atomics), and the launcher bounds the copies' total
 * (runtime/launch.c). */
#include <stdlib.h>
#include <string.h>

#include "codegen/codegen.h"

/* The child of the root that holds snode (0 for the root itself). */
static int tree_of(const fb_layout *l, int sn) {
  for (int guard = 0; sn > 0 && guard < 64; guard++) {
    int p = l->nodes[sn].parent;
    if (p <= 0) return sn;
    sn = p;
  }
  return 0;
}

/* A place type privatized scatter handles: f32, or a 32-bit integer
 * (i32 and u32 add alike: modulo 2^32). FB_T_VOID: none. */
static fb_type word_class(fb_type t) {
  return t == FB_T_F32 ? FB_T_F32 : t == FB_T_I32 || t == FB_T_U32 ? FB_T_I32 : FB_T_VOID;
}

/* The word class of tree T when every container of T is dense and every
 * place of one class, else FB_T_VOID. */
static fb_type tree_type(const fb_layout *l, int T) {
  if (l->nodes[T].kind != FB_SN_DENSE) return FB_T_VOID;
  fb_type ty = FB_T_VOID;
  for (int i = 1; i < l->nnodes; i++) {
    if (tree_of(l, i) != T) continue;
    const fb_snode *n = &l->nodes[i];
    if (n->kind != FB_SN_PLACE) {
      if (n->kind != FB_SN_DENSE) return FB_T_VOID;
      continue;
    }
    fb_type c = word_class(n->type);
    if (c == FB_T_VOID || (ty != FB_T_VOID && c != ty)) return FB_T_VOID;
    ty = c;
  }
  return ty;
}

/* Is statement id an atomic add into an f32, i32 or u32 place whose result
 * is unused? */
static int private_add(const fb_kernel *k, const unsigned char *used, int id) {
  const fb_stmt *s = &k->stmts[id];
  if (s->op != FB_OP_ATOMIC_ADD && s->op != FB_OP_ATOMIC_ADD_NA) return 0;
  const fb_snode *f = &k->layout->nodes[s->snode];
  return f->kind == FB_SN_PLACE && word_class(f->type) != FB_T_VOID && s->nargs == f->ndim + 1 &&
         !used[id];
}

int fb_cg_priv_plan(const fb_cg_task *t, fb_cg_priv *out, unsigned char *place) {
  memset(out, 0, sizeof *out);
  if (!t || !t->ir || !t->ir->layout || t->loop < 0 || t->loop >= t->ir->nstmts) return 0;
  const fb_kernel *k = t->ir;
  const fb_layout *l = k->layout;
  int lop = k->stmts[t->loop].op;
  if (lop != FB_OP_PAR_FOR && lop != FB_OP_STRUCT_FOR) return 0;
  /* per tree: 1 = only private adds seen so far, 2 = something else */
  unsigned char *state = calloc((size_t)l->nnodes, 1);
  unsigned char *used = calloc((size_t)k->nstmts + 1, 1);
  int rc = 0;
  if (!state || !used) {
    rc = FB_ENOMEM;
    goto done;
  }
  for (int i = 0; i < k->nstmts; i++) {
    const fb_stmt *s = &k->stmts[i];
    for (int a = 0; a < s->nargs && a < FB_MAX_ARGS; a++)
      if (s->args[a] >= 0 && s->args[a] < k->nstmts) used[s->args[a]] = 1;
  }
  for (int i = 0; i < k->nstmts; i++) {
    const fb_stmt *s = &k->stmts[i];
    if (s->op >= FB_OP__COUNT || !(fb_op_table[s->op].flags & FB_OPF_SNODE)) continue;
    if (s->snode < 0 || s->snode >= l->nnodes) continue;
    int T = tree_of(l, s->snode);
    if (T <= 0) continue;
    if (private_add(k, used, i)) {
      if (!state[T]) state[T] = 1;
    } else state[T] = 2;
  }
  for (int T = 1; T < l->nnodes && out->n < FB_CG_PRIV_MAX; T++) {
    fb_type ty = state[T] == 1 ? tree_type(l, T) : FB_T_VOID;
    if (ty == FB_T_VOID) continue;
    int64_t off = (int64_t)l->nodes[T].offset, bytes = (int64_t)l->nodes[T].node_bytes;
    if (off % 4 || bytes % 4 || bytes <= 0) continue;
    int64_t lo = out->n && out->lo < off ? out->lo : off;
    int64_t hi = out->n && out->hi > off + bytes ? out->hi : off + bytes;
    if (hi - lo > FB_CG_PRIV_MAX_BYTES) continue;
    out->lo = lo;
    out->hi = hi;
    out->off[out->n] = off;
    out->bytes[out->n] = bytes;
    out->i32[out->n] = ty == FB_T_I32;
    out->n++;
    for (int i = 0; i < k->nstmts; i++)
      if (private_add(k, used, i) && tree_of(l, k->stmts[i].snode) == T) {
        out->sites++;
        if (place) place[k->stmts[i].snode] = 1;
      }
  }
done:
  free(state);
  free(used);
  return rc;
}
