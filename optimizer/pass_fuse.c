/* Task fusion (paper section 5.5 and supplement section 2). Tasks A and B
 * (A earlier) fuse when:
 *  1. no path of length >= 2 joins them in the SFG (found with the
 *     transitive closure in bitsets: B is not reachable from any other
 *     successor of A);
 *  2. both are serial, or both parallel over the same range (values
 *     evaluated with the launches' arguments) or the same struct_for SNode
 *     and list version; list upkeep (clear_list, gc) fuses only with list
 *     upkeep, as serial tasks (list_upkeep);
 *  3. parallel: every state one writes and the other touches is written
 *     element-wise by the writer and accessed element-wise by the other
 *     (the same address each iteration, unique per iteration: the loop
 *     indices, or one assume_unique expression whose inputs neither task
 *     writes); a writer may read its own state elsewhere (a stencil) when
 *     the other task only reads it there; masks and allocators only through
 *     activation on write and activity checks of loads; never a list,
 *     gtmp slot or return slot;
 *  4. each task takes part in at most max_fuse_per_task fusions per round.
 * On top of the criteria, a cost model keeps each fused task within what
 * the engine can compile and launch: at most max_fused_tasks launches,
 * max_fused_stmts statements (the parts' reachable statements added up) and
 * max_task_params parameters (the backend's limit, set by the engine). A
 * pair that meets the criteria but not the budget is refused (fuse_refused
 * counts the tasks that met such a refusal, once per task per round). The
 * bounds come from fb_opt_options only.
 * The fused task runs A's part then B's part (per iteration); its
 * parameters are A's then B's, so two launches of one kernel with different
 * arguments keep both; B's rand() calls keep B's launch number (rand_seq).
 * Fusions are greedy in topological order; the closure is updated after
 * each one, and the window is re-sorted topologically and rebuilt. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "optimizer/sfg.h"

typedef struct fctx {
  fb_pass_ctx *c;
  fb_sfg *g;
  int base, n, words;  /* window: nodes[base .. base+n) */
  uint64_t *succ, *reach;
} fctx;

static uint64_t *row(uint64_t *m, const fctx *f, int i) { return m + (size_t)i * (size_t)f->words; }
static int bit(const uint64_t *r, int j) { return (int)(r[j >> 6] >> (j & 63)) & 1; }
static void set_bit(uint64_t *r, int j) { r[j >> 6] |= 1ull << (j & 63); }
static void clr_bit(uint64_t *r, int j) { r[j >> 6] &= ~(1ull << (j & 63)); }

static void closure(fctx *f) {
  for (int i = f->n - 1; i >= 0; i--) {
    uint64_t *r = row(f->reach, f, i);
    const uint64_t *s = row(f->succ, f, i);
    for (int j = i + 1; j < f->n; j++) {
      if (!bit(s, j)) continue;
      const uint64_t *rj = row(f->reach, f, j);
      for (int w = 0; w < f->words; w++) r[w] |= rj[w];
      set_bit(r, j);
    }
  }
}

static int build(fctx *f) {
  size_t cells = (size_t)f->n * (size_t)f->words;
  f->succ = calloc(cells ? cells : 1, sizeof *f->succ);
  f->reach = calloc(cells ? cells : 1, sizeof *f->reach);
  if (!f->succ || !f->reach) return FB_ENOMEM;
  for (int i = 0; i < f->n; i++) {
    const fb_sfg_node *x = f->g->nodes[f->base + i];
    for (int e = 0; e < x->nout; e++) {
      int j = x->out[e].node - f->base;
      if (j > i && j < f->n) set_bit(row(f->succ, f, i), j);
    }
  }
  closure(f);
  return 0;
}

/* far = the nodes reachable from a through one of its successors: the
 * ends of the paths of length >= 2 from a. */
static void far_from(const fctx *f, int a, uint64_t *far) {
  memset(far, 0, sizeof *far * (size_t)f->words);
  const uint64_t *s = row(f->succ, f, a);
  for (int w = 0; w < f->words; w++)
    for (uint64_t m = s[w]; m; m &= m - 1) {
      const uint64_t *rc = row(f->reach, f, w * 64 + __builtin_ctzll(m));
      for (int x = 0; x < f->words; x++) far[x] |= rc[x];
    }
}

/* Criterion 1 (and acyclicity of the merge): no path a ~> b other than a
 * direct edge, and none from b to a. */
static int path_ok(const fctx *f, const uint64_t *far, int a, int b) {
  return !bit(far, b) && !bit(row(f->reach, f, b), a);
}

/* Merge b into a in the bitsets. */
static void merge_bits(fctx *f, int a, int b) {
  uint64_t *sa = row(f->succ, f, a), *ra = row(f->reach, f, a);
  const uint64_t *sb = row(f->succ, f, b), *rb = row(f->reach, f, b);
  for (int w = 0; w < f->words; w++) {
    sa[w] |= sb[w];
    ra[w] |= rb[w];
  }
  clr_bit(sa, a);
  clr_bit(sa, b);
  clr_bit(ra, a);
  clr_bit(ra, b);
  for (int p = 0; p < f->n; p++) {
    if (p == a || p == b) continue;
    uint64_t *sp = row(f->succ, f, p), *rp = row(f->reach, f, p);
    if (bit(sp, b)) {
      clr_bit(sp, b);
      set_bit(sp, a);
    }
    if (bit(rp, a) || bit(rp, b)) {
      for (int w = 0; w < f->words; w++) rp[w] |= ra[w];
      set_bit(rp, a);
      clr_bit(rp, b);
    }
  }
  memset(row(f->succ, f, b), 0, sizeof(uint64_t) * (size_t)f->words);
  memset(row(f->reach, f, b), 0, sizeof(uint64_t) * (size_t)f->words);
}

/* ---------------------------------------------------------------- criteria */

/* List upkeep: a clear_list or gc task, or a serial task fused from them.
 * They are runtime calls that codegen emits in any serial task (the
 * interpreter skips them), so they fuse with each other, one after the
 * other: a struct_for two sparse levels deep clears both lists in one task,
 * and a deactivation's gc of each level is one task. Only with each other:
 * a clear_list taking the one fusion of a round from a serial kernel could
 * keep that kernel from its own partner. A listgen is a parallel loop over
 * its parent's list, never fused. */
static int list_upkeep(fb_bank *bank, const fb_sfg_node *x) {
  fb_task_kind k = x->m->kind;
  if (k == FB_TASK_CLEAR_LIST || k == FB_TASK_GC) return 1;
  const fb_kernel *ir = k == FB_TASK_SERIAL ? fb_bank_ir(bank, x->ir) : NULL;
  if (!ir || ir->nblocks < 1 || ir->blocks[0].n < 1) return 0;
  for (int i = 0; i < ir->blocks[0].n; i++) {
    int op = ir->stmts[ir->blocks[0].ids[i]].op;
    if (op != FB_OP_CLEAR_LIST && op != FB_OP_GC) return 0;
  }
  return 1;
}

static int fusible_kind(const fb_sfg_node *x) {
  fb_task_kind k = x->m->kind;
  return !x->dead && !x->host && !x->retained && (x->m->tflags & FB_TF_FUSIBLE) &&
         (k == FB_TASK_SERIAL || k == FB_TASK_CLEAR_LIST || k == FB_TASK_GC ||
          (k == FB_TASK_RANGE_FOR && x->range_ok) || k == FB_TASK_STRUCT_FOR);
}

/* Struct_fors over containers x and y with equal index spaces: both under
 * dense containers only (no list: every cell is visited), the same axes in
 * the same order and the same extent on each. Taichi's layout gives each
 * `ti.field(shape=...)` a dense block of its own, so loops over two fields
 * of one shape are loops over two containers; each visits the same index
 * tuples, and the fused loop's loop_index d is the same index in both
 * parts. Criterion 3 then compares accesses by index (FB_EW_LOOP: at the
 * loop's indices), which means the same cell of each field in both. */
static int dense_path(const fb_layout *l, int n) {
  for (; n > 0; n = l->nodes[n].parent)
    if (l->nodes[n].kind != FB_SN_DENSE && l->nodes[n].kind != FB_SN_PLACE) return 0;
  return n == 0;
}

static int same_dense_space(fb_bank *bank, const fb_sfg_node *a, const fb_sfg_node *b) {
  const fb_kernel *ka = fb_bank_ir(bank, a->ir), *kb = fb_bank_ir(bank, b->ir);
  if (!ka || !kb || ka->layout != kb->layout) return 0;
  const fb_layout *l = ka->layout;
  int x = a->m->iter, y = b->m->iter;
  if (x <= 0 || y <= 0 || x >= l->nnodes || y >= l->nnodes) return 0;
  if (a->m->list_key != FB_SKEY_NONE || b->m->list_key != FB_SKEY_NONE) return 0;
  if (!dense_path(l, x) || !dense_path(l, y)) return 0;
  const fb_snode *p = &l->nodes[x], *q = &l->nodes[y];
  if (p->space_axes != q->space_axes || p->ndim != q->ndim) return 0;
  for (int d = 0; d < p->ndim; d++)
    if (p->dim_axis[d] != q->dim_axis[d] || p->shape[p->dim_axis[d]] != q->shape[q->dim_axis[d]])
      return 0;
  return 1;
}

/* Criterion 2. */
static int same_group(fb_bank *bank, const fb_sfg_node *a, const fb_sfg_node *b) {
  int la = list_upkeep(bank, a), lb = list_upkeep(bank, b);
  if (la || lb) return la && lb; /* serial, one after the other */
  if (a->m->kind != b->m->kind) return 0;
  switch (a->m->kind) {
  case FB_TASK_SERIAL: return 1;
  case FB_TASK_RANGE_FOR: return a->rbegin == b->rbegin && a->rend == b->rend;
  default:
    if (a->m->iter == b->m->iter && a->list_ver == b->list_ver) return 1;
    return same_dense_space(bank, a, b);
  }
}

static int writes(const fb_sfg_node *x, uint32_t key) {
  const fb_meta_acc *a = fb_meta_find(x->m, key);
  return a && (a->mode & FB_ACC_WRITE);
}

/* Writes of state w (by one task) against every access o (by the other)
 * of the same state: the writer's writes are element-wise (each iteration
 * writes its own cell, no other iteration touches it) and the other task
 * accesses the state at exactly that cell in the same iteration. The
 * writer's own reads of the state may lie elsewhere (a stencil): the other
 * task does not write it, so those reads see what they saw unfused. */
static int ew_writes_ok(const fb_meta_acc *w, const fb_meta_acc *o) {
  if (!(w->mode & FB_ACC_WRITE)) return 1;
  return w->wew != FB_EW_NONE && o->ew == w->wew && o->sig == w->wsig;
}

/* One shared state of two parallel tasks, at least one writing it. Fused,
 * iteration i runs A(i) then B(i) where unfused every A(j) runs before
 * every B(i): a value state is safe when neither task can see the other's
 * write at another iteration's cell, i.e. when each writer writes
 * element-wise and the other task touches the state only at that cell.
 * (When both write, every access of both is element-wise, as before.) */
static int shared_ok(const fb_meta_acc *x, const fb_meta_acc *y) {
  switch (FB_SKEY_KIND(x->key)) {
  case FB_SK_VALUE: return ew_writes_ok(x, y) && ew_writes_ok(y, x);
  case FB_SK_MASK:
  case FB_SK_ALLOC: return (x->flags & FB_AF_IMPLICIT) && (y->flags & FB_AF_IMPLICIT);
  default: return 0;
  }
}

/* The assume_unique inputs of one task are written by neither. */
static int udeps_ok(const fb_sfg_node *x, const fb_sfg_node *a, const fb_sfg_node *b) {
  for (int i = 0; i < x->m->nudeps; i++)
    if (writes(a, x->m->udeps[i]) || writes(b, x->m->udeps[i])) return 0;
  return 1;
}

/* Criterion 3. */
static int states_ok(const fb_sfg_node *a, const fb_sfg_node *b) {
  const fb_task_meta *ma = a->m, *mb = b->m;
  if (ma->kind != FB_TASK_RANGE_FOR && ma->kind != FB_TASK_STRUCT_FOR) return 1; /* serial */
  int i = 0, j = 0;
  while (i < ma->nacc && j < mb->nacc) {
    const fb_meta_acc *x = &ma->acc[i], *y = &mb->acc[j];
    if (x->key < y->key) {
      i++;
      continue;
    }
    if (y->key < x->key) {
      j++;
      continue;
    }
    if (((x->mode | y->mode) & FB_ACC_WRITE) && !shared_ok(x, y)) return 0;
    i++;
    j++;
  }
  return udeps_ok(a, a, b) && udeps_ok(b, a, b);
}

static int rets_ok(fb_bank *bank, const fb_sfg_node *a, const fb_sfg_node *b) {
  fb_type ra = fb_bank_ir(bank, a->ir)->ret, rb = fb_bank_ir(bank, b->ir)->ret;
  return ra == FB_T_VOID || rb == FB_T_VOID || ra == rb;
}

/* The cost model: would the task fusing a and b stay within the budget? */
static int within_budget(const fb_opt_options *o, const fb_sfg_node *a, const fb_sfg_node *b) {
  if (o->max_fused_tasks && a->ntasks + b->ntasks > o->max_fused_tasks) return 0;
  if (o->max_fused_stmts && a->m->nstmts + b->m->nstmts > o->max_fused_stmts) return 0;
  if (o->max_task_params && a->nargs + b->nargs > o->max_task_params) return 0;
  return 1;
}

/* ---------------------------------------------------------------- fusing */

/* Fuse b into a: the IR (memoized), arguments, certificates. */
static int fuse_pair(fctx *f, fb_sfg_node *a, fb_sfg_node *b) {
  fb_pass_ctx *c = f->c;
  int64_t delta = (b->m->tflags & FB_TF_RAND) ? (int64_t)(b->launch - a->launch) : 0;
  int64_t key[5] = {FB_MEMO_FUSE, a->ir, b->ir, delta, a->nparts};
  fb_irh h = fb_pass_memo_get(c, key, 5);
  int rc = 0;
  if (h == FB_IRH_NONE) {
    fb_kernel *k = fb_ir_fuse(fb_bank_ir(c->bank, a->ir), a->m, a->nparts,
                              fb_bank_ir(c->bank, b->ir), b->m, delta);
    if ((rc = fb_pass_memo_put(c, key, 5, k, &h))) return rc;
  }
  uint64_t *args = realloc(a->args, sizeof *args * (size_t)(a->nargs + b->nargs + 1));
  fb_sfg_cert *certs = realloc(a->certs, sizeof *certs * (size_t)(a->ncerts + b->ncerts + 1));
  fb_sfg_part *parts = realloc(a->parts, sizeof *parts * (size_t)(a->nparts + b->nparts + 1));
  if (args) a->args = args;
  if (certs) a->certs = certs;
  if (parts) a->parts = parts;
  if (!args || !certs || !parts) {
    fb_bank_unref(c->bank, h);
    return FB_ENOMEM;
  }
  memcpy(a->args + a->nargs, b->args, sizeof *args * (size_t)b->nargs);
  for (int i = 0; i < b->ncerts; i++) {
    a->certs[a->ncerts] = b->certs[i];
    a->certs[a->ncerts++].argoff += a->nargs;
  }
  b->ncerts = 0; /* the references moved with them */
  for (int i = 0; i < b->nparts; i++) {
    a->parts[a->nparts] = b->parts[i];
    a->parts[a->nparts++].argoff += a->nargs;
  }
  b->nparts = 0;
  a->nargs += b->nargs;
  a->ntasks += b->ntasks;
  fb_bank_unref(c->bank, a->orig);
  fb_bank_ref(c->bank, h);
  a->orig = h;
  b->dead = 1;
  a->reshaped = 1;
  return fb_sfg_node_set_ir(a, c->bank, h);
}

/* Kahn's algorithm over the merged graph, earliest first: the ready nodes
 * in a bitset, the earliest taken each time (the order the linear scan for
 * the first ready node gave), edges walked by word (both were O(n^2) bit
 * tests per chunk, the most of a long window's flush). */
static int topo_order(fctx *f, fb_sfg_node **order, int *norder) {
  int *indeg = calloc((size_t)f->n, sizeof *indeg);
  uint64_t *ready = calloc((size_t)f->words ? (size_t)f->words : 1, sizeof *ready);
  if (!indeg || !ready) {
    free(indeg);
    free(ready);
    return FB_ENOMEM;
  }
  int alive = 0;
  for (int i = 0; i < f->n; i++) {
    if (f->g->nodes[f->base + i]->dead) continue;
    alive++;
    const uint64_t *s = row(f->succ, f, i);
    for (int w = 0; w < f->words; w++)
      for (uint64_t m = s[w]; m; m &= m - 1) indeg[w * 64 + __builtin_ctzll(m)]++;
  }
  for (int i = 0; i < f->n; i++)
    if (!f->g->nodes[f->base + i]->dead && indeg[i] == 0) set_bit(ready, i);
  *norder = 0;
  while (*norder < alive) {
    int pick = -1;
    /* from word 0: a merge can give a node an edge to an earlier one */
    for (int w = 0; w < f->words && pick < 0; w++)
      if (ready[w]) pick = w * 64 + __builtin_ctzll(ready[w]);
    if (pick < 0) break; /* a cycle: cannot happen after path_ok */
    clr_bit(ready, pick);
    order[(*norder)++] = f->g->nodes[f->base + pick];
    const uint64_t *s = row(f->succ, f, pick);
    for (int w = 0; w < f->words; w++)
      for (uint64_t m = s[w]; m; m &= m - 1) {
        int j = w * 64 + __builtin_ctzll(m);
        /* a dead node has no edges (merge_bits cleared them) and is never
           ready: only live successors count down */
        if (--indeg[j] == 0 && !f->g->nodes[f->base + j]->dead) set_bit(ready, j);
      }
  }
  int rc = *norder == alive ? 0 : FB_EINTERNAL;
  free(indeg);
  free(ready);
  return rc;
}

/* The first node at or after `from` that is not in far: B in far is reached
 * from A over a path of length >= 2 (criterion 1), so the pair loop never
 * looks at it. On a chain of dependent tasks (a solver's sweeps) that is
 * nearly every later node, and the loop is linear instead of quadratic. */
static int next_candidate(const fctx *f, const uint64_t *far, int from) {
  if (from >= f->n) return f->n;
  for (int w = from >> 6; w < f->words; w++) {
    uint64_t m = ~far[w];
    if (w == from >> 6) m &= ~0ull << (from & 63);
    if (m) {
      int j = w * 64 + __builtin_ctzll(m);
      return j < f->n ? j : f->n;
    }
  }
  return f->n;
}

static int fuse_round(fctx *f) {
  int max = f->c->opt->max_fuse_per_task, fused = 0;
  uint64_t *far = malloc(sizeof *far * (size_t)f->words);
  if (!far) return FB_ENOMEM;
  for (int ai = 0; ai < f->n; ai++) {
    fb_sfg_node *a = f->g->nodes[f->base + ai];
    if (!fusible_kind(a) || a->fused_now >= max) continue;
    far_from(f, ai, far);
    int refused = 0;
    for (int bi = next_candidate(f, far, ai + 1); bi < f->n && a->fused_now < max;
         bi = next_candidate(f, far, bi + 1)) {
      fb_sfg_node *b = f->g->nodes[f->base + bi];
      f->c->cnt->fuse_pairs++;
      if (!fusible_kind(b) || b->fused_now >= max || !same_group(f->c->bank, a, b)) continue;
      if (!rets_ok(f->c->bank, a, b) || !path_ok(f, far, ai, bi) || !states_ok(a, b)) continue;
      if (!within_budget(f->c->opt, a, b)) {
        refused = 1;
        continue;
      }
      int across = a->m->kind == FB_TASK_STRUCT_FOR && a->m->iter != b->m->iter;
      int rc = fuse_pair(f, a, b);
      if (rc) {
        free(far);
        return rc;
      }
      merge_bits(f, ai, bi);
      far_from(f, ai, far);
      a->fused_now++;
      fused++;
      f->c->cnt->fuse_same_shape += (uint64_t)across;
    }
    f->c->cnt->fuse_refused += (uint64_t)refused;
  }
  free(far);
  return fused;
}

/* One chunk of consecutive window nodes: every path between two of its
 * nodes runs through nodes between them in topological order, so the
 * closure over the chunk alone decides criterion 1 exactly for its pairs.
 * Chunks bound the bitsets (FUSE_CHUNK^2 bits) on very long windows; pairs
 * across chunks are not considered. Appends the chunk's new order. */
static int fuse_chunk(fb_pass_ctx *c, int base, int n, fb_sfg_node **order, int *norder) {
  fctx f = {c, c->g, base, n, (n + 63) / 64, NULL, NULL};
  int rc = build(&f), fused = 0, k = 0;
  if (!rc) rc = fused = fuse_round(&f);
  if (rc >= 0) rc = topo_order(&f, order + *norder, &k);
  if (rc == FB_EINTERNAL) fb_errf(c->err, c->errlen, "fusion made a cycle");
  *norder += k;
  free(f.succ);
  free(f.reach);
  return rc < 0 ? rc : fused;
}

enum {
  FUSE_CHUNK = 1024
};

int fb_pass_fuse(fb_pass_ctx *c) {
  fb_sfg *g = c->g;
  int n = g->n - g->nret, fused = 0, norder = 0, rc = 0;
  if (n < 2) return 0;
  fb_sfg_node **order = malloc(sizeof *order * (size_t)n);
  if (!order) return FB_ENOMEM;
  for (int base = g->nret; base < g->n && rc >= 0; base += FUSE_CHUNK) {
    int len = g->n - base < FUSE_CHUNK ? g->n - base : FUSE_CHUNK;
    rc = fuse_chunk(c, base, len, order, &norder);
    if (rc > 0) fused += rc;
  }
  for (int i = g->nret; i < g->n; i++) g->nodes[i]->fused_now = 0;
  if (rc >= 0 && fused) rc = fb_sfg_rebuild(g, c->bank, order, norder);
  free(order);
  if (rc < 0) return rc;
  c->cnt->tasks_fused += (uint64_t)fused;
  return fused;
}
