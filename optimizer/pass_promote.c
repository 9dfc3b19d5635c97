/* Task-local rewrites run on every lowered task, in both engine modes
 * (fb_lower): what a compiler does inside one task, never across tasks, so
 * sync mode keeps its meaning (no inter-kernel optimization) and gets them
 * too. Both are exact: the task gives the same fields, active cells, return
 * value and rand() values.
 *
 *  1. Owned atomics: an atomic on a field that every access of the task
 *     reaches element-wise (fb_meta_acc.ew; every field in a serial task)
 *     becomes load, op, store. No other iteration touches that element, so
 *     the atomic's only effect is the read-modify-write in program order;
 *     the op is the one the atomic applies and the load (which stands in
 *     the atomic's place, keeping its id) gives what the atomic returned.
 *     The store activates where the atomic did (a non-activating atomic
 *     becomes store_na). pass_simplify does the same for fused tasks.
 *
 *  2. Promotion: inside a serial loop (range_for, while), a field element
 *     that the loop reaches only by loads and stores at one loop-invariant
 *     index is kept in a local: one load before the loop, local loads and
 *     stores in it, one store after it where the loop stored. Distinct
 *     places never alias, so no other access in the loop sees the element;
 *     LLVM cannot prove that when fields share a dense block. Required:
 *       - every access of that field inside the loop is a load or a store
 *         at the same index statements, all defined outside the loop (a
 *         load at another index, or any atomic on it, keeps it in memory);
 *       - the field is dense all the way (a sparse cell would be activated
 *         by the store after the loop where the loop stored nothing) and
 *         the access provably in bounds (the load before the loop runs even
 *         when the loop runs no iteration or takes no path to the access);
 *       - in a parallel task, the field is element-wise for the whole task
 *         (the store after the loop writes back what was loaded where the
 *         loop stored nothing: harmless only if no other iteration writes
 *         the element);
 *       - nothing in the loop writes what no field names (sparse ops,
 *         lists, appends).
 *     break and continue leave the local as it was at that point, which is
 *     what the element held; the store after the loop runs on every way
 *     out. Inner loops are promoted first, so an element promoted in an
 *     inner loop moves out of the outer one too when its index allows. */
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "optimizer/sfg.h"

typedef struct prom {
  fb_kernel *k;
  const fb_task_meta *m;
  fb_builder b;
  int scratch;       /* block the builder emits into; spliced out after */
  uint8_t *inside;   /* per statement: in the subtree of the loop examined */
  int ninside;       /* statements `inside` covers (later ones read as 0) */
  uint8_t *seen;     /* per SNode: examined for the loop at hand */
  int32_t *acc;      /* accesses of the field examined */
  int nacc, capacc;
  int oom;
  int atomics, promoted;
} prom;

static int is_atomic(int op) {
  int cls = fb_op_table[op].cls;
  return cls == FB_OPC_ATOMIC || cls == FB_OPC_IATOMIC;
}

static fb_op atomic_base(int op) {
  int i = op >= FB_OP_ATOMIC_ADD_NA ? op - FB_OP_ATOMIC_ADD_NA : op - FB_OP_ATOMIC_ADD;
  static const fb_op base[] = {FB_OP_ADD, FB_OP_SUB, FB_OP_MIN, FB_OP_MAX,
                               FB_OP_AND, FB_OP_OR,  FB_OP_XOR};
  return base[i];
}

/* Every access of place f in the task is element-wise (a serial task owns
 * all of them). */
static int owned(const prom *p, int f) {
  if (p->m->loop < 0) return 1;
  const fb_meta_acc *a = fb_meta_find(p->m, FB_SKEY(FB_SK_VALUE, f));
  return a && a->ew != FB_EW_NONE;
}

static int dense_path(const fb_kernel *k, int f) {
  int path[8];
  return fb_sparse_path(k->layout, f, path, 8) == 0;
}

/* The ids the builder put in the scratch block since it was emptied; the
 * block is emptied again. */
static int32_t *take_scratch(prom *p, int *n) {
  fb_block *s = &p->k->blocks[p->scratch];
  *n = s->n;
  int32_t *v = NULL;
  if (s->n) {
    v = malloc(sizeof *v * (size_t)s->n);
    if (!v) p->oom = 1;
    else memcpy(v, s->ids, sizeof *v * (size_t)s->n);
  }
  s->n = 0;
  return v;
}

/* ---------------------------------------------------------------- 1. owned atomics */

/* Statement id (an owned atomic) becomes the load in place; the op and the
 * store go to the scratch block. */
static void expand_atomic(prom *p, int id) {
  fb_stmt at = p->k->stmts[id];
  int nd = at.nargs - 1, val = at.args[nd];
  fb_type ft = p->k->layout->nodes[at.snode].type;
  int op = fb_b_binary(&p->b, atomic_base(at.op), id, val);
  int st = op < 0 ? op
                  : fb_b_global(&p->b, at.op >= FB_OP_ATOMIC_ADD_NA ? FB_OP_STORE_NA : FB_OP_STORE,
                                at.snode, at.args, nd, op);
  if (op < 0 || st < 0) {
    p->oom = 1;
    return;
  }
  fb_stmt *s = p->k->stmts; /* the builder may have moved the array */
  s[op].type = (uint8_t)ft;
  s[op].part = s[st].part = at.part;
  s[id].op = FB_OP_LOAD;
  s[id].type = (uint8_t)ft;
  s[id].nargs = (uint8_t)nd;
  s[id].args[nd] = -1;
}

static void atomics_block(prom *p, int blk, int depth) {
  if (blk < 0 || depth > FB_MAX_BLOCK_DEPTH || p->oom) return;
  int n = p->k->blocks[blk].n;
  int32_t *ids = malloc(sizeof *ids * (size_t)(n ? n : 1));
  if (!ids) {
    p->oom = 1;
    return;
  }
  if (n) memcpy(ids, p->k->blocks[blk].ids, sizeof *ids * (size_t)n);
  int32_t *out = NULL;
  int w = 0, cap = 0;
  for (int i = 0; i < n && !p->oom; i++) {
    int id = ids[i];
    const fb_stmt *t = &p->k->stmts[id];
    int body = t->body, orelse = t->orelse, ext = 0;
    int32_t *more = NULL;
    if (is_atomic(t->op) && owned(p, t->snode)) {
      expand_atomic(p, id);
      more = take_scratch(p, &ext);
      p->atomics += !p->oom;
    }
    while (!p->oom && w + 1 + ext > cap) {
      cap = cap * 2 + 16;
      int32_t *q = realloc(out, sizeof *q * (size_t)cap);
      if (!q) p->oom = 1;
      else out = q;
    }
    if (!p->oom) {
      out[w++] = id;
      for (int e = 0; e < ext; e++) out[w++] = more[e];
    }
    free(more);
    atomics_block(p, body, depth + 1);
    atomics_block(p, orelse, depth + 1);
  }
  free(ids);
  if (p->oom) {
    free(out);
    return;
  }
  fb_block *b = &p->k->blocks[blk];
  free(b->ids);
  b->ids = out;
  b->n = w;
  b->cap = cap;
}

/* ---------------------------------------------------------------- 2. promotion */

/* Mark (v = 1) or unmark the statements of block blk's subtree. Returns 1
 * when the subtree holds an op that writes what no field names. */
static int mark(prom *p, int blk, int depth, uint8_t v) {
  if (blk < 0) return 0;
  if (depth > FB_MAX_BLOCK_DEPTH) return 1;
  const fb_block *b = &p->k->blocks[blk];
  int opaque = 0;
  for (int i = 0; i < b->n; i++) {
    const fb_stmt *t = &p->k->stmts[b->ids[i]];
    int cls = fb_op_table[t->op].cls;
    if (b->ids[i] < p->ninside) p->inside[b->ids[i]] = v;
    if (cls == FB_OPC_SPARSE || cls == FB_OPC_APPEND || cls == FB_OPC_LENGTH ||
        cls == FB_OPC_LIST ||
        ((fb_op_table[t->op].flags & FB_OPF_WRITES) && cls != FB_OPC_GSTORE && !is_atomic(t->op) &&
         t->op != FB_OP_GTMP_STORE))
      opaque = 1;
    opaque |= mark(p, t->body, depth + 1, v);
    opaque |= mark(p, t->orelse, depth + 1, v);
  }
  return opaque;
}

/* The accesses of place f in block blk's subtree into p->acc. */
static void accesses(prom *p, int blk, int depth, int f) {
  if (blk < 0 || depth > FB_MAX_BLOCK_DEPTH || p->oom) return;
  const fb_block *b = &p->k->blocks[blk];
  for (int i = 0; i < b->n; i++) {
    const fb_stmt *t = &p->k->stmts[b->ids[i]];
    if ((fb_op_table[t->op].flags & FB_OPF_SNODE) && t->snode == f) {
      if (FB_GROW(p->acc, p->nacc, p->capacc)) {
        p->oom = 1;
        return;
      }
      p->acc[p->nacc++] = b->ids[i];
    }
    accesses(p, t->body, depth + 1, f);
    accesses(p, t->orelse, depth + 1, f);
  }
}

/* An index statement defined outside the loop examined, or a constant
 * (lowering and the front end repeat constants where they are used). */
static int invariant(const prom *p, int x) {
  if (x < 0) return 0;
  return p->k->stmts[x].op == FB_OP_CONST || (x < p->ninside && !p->inside[x]);
}

/* Indices x and y are invariant and always equal. */
static int same_index(const prom *p, int x, int y) {
  if (!invariant(p, x) || !invariant(p, y)) return 0;
  if (x == y) return 1;
  const fb_stmt *a = &p->k->stmts[x], *b = &p->k->stmts[y];
  return a->op == FB_OP_CONST && b->op == FB_OP_CONST && a->type == b->type &&
         a->imm.u == b->imm.u;
}

/* Whether p->acc (accesses of place f in loop `loop`) can live in a local;
 * *stores says whether one of them stores. */
static int promotable(prom *p, int f, int *stores) {
  const fb_kernel *k = p->k;
  const fb_stmt *a0 = &k->stmts[p->acc[0]];
  int nd = k->layout->nodes[f].ndim;
  *stores = 0;
  if (k->layout->nodes[f].kind != FB_SN_PLACE || !dense_path(k, f) || !owned(p, f)) return 0;
  for (int i = 0; i < p->nacc; i++) {
    const fb_stmt *t = &k->stmts[p->acc[i]];
    if (t->op == FB_OP_STORE || t->op == FB_OP_STORE_NA) *stores = 1;
    else if (t->op != FB_OP_LOAD) return 0;
    for (int d = 0; d < nd; d++)
      if (!same_index(p, t->args[d], a0->args[d])) return 0;
  }
  return fb_access_inbounds(k, p->acc[0]);
}

/* Keep field f's element in a local across serial loop `loop`: the load
 * and alloca go to *pre, the write-back to *post (scratch ids, malloc'd). */
static void promote_field(prom *p, int f, int stores, int32_t **pre, int *npre, int32_t **post,
                          int *npost) {
  fb_type ft = p->k->layout->nodes[f].type;
  int nd = p->k->layout->nodes[f].ndim, idx[FB_MAX_AXES];
  memcpy(idx, p->k->stmts[p->acc[0]].args, sizeof *idx * (size_t)nd);
  for (int d = 0; d < nd; d++) { /* a constant inside the loop: a copy before it */
    const fb_stmt *c = &p->k->stmts[idx[d]];
    if (c->op != FB_OP_CONST || (idx[d] < p->ninside && !p->inside[idx[d]])) continue;
    fb_stmt cc = *c;
    idx[d] = fb_b_emit(&p->b, &cc);
    if (idx[d] < 0) {
      p->oom = 1;
      return;
    }
  }
  int var = fb_b_alloca(&p->b, ft);
  int ld = var < 0 ? var : fb_b_load(&p->b, f, idx, nd);
  int ls = ld < 0 ? ld : fb_b_lstore(&p->b, var, ld);
  if (ls < 0) {
    p->oom = 1;
    return;
  }
  int part = p->k->stmts[p->acc[0]].part;
  p->k->stmts[var].part = p->k->stmts[ld].part = p->k->stmts[ls].part = part;
  *pre = take_scratch(p, npre);
  for (int i = 0; i < p->nacc && !p->oom; i++) {
    fb_stmt *t = &p->k->stmts[p->acc[i]];
    if (t->op == FB_OP_LOAD) { /* keeps its id, type and part */
      t->op = FB_OP_LLOAD;
      t->snode = -1;
      t->nargs = 1;
      memset(t->args, -1, sizeof t->args);
      t->args[0] = var;
    } else {
      int v = t->args[nd];
      t->op = FB_OP_LSTORE;
      t->snode = -1;
      t->nargs = 2;
      memset(t->args, -1, sizeof t->args);
      t->args[0] = var;
      t->args[1] = v;
    }
  }
  if (stores && !p->oom) {
    int cur = fb_b_lload(&p->b, var);
    int st = cur < 0 ? cur : fb_b_store(&p->b, f, idx, nd, cur);
    if (st < 0) p->oom = 1;
    else p->k->stmts[cur].part = p->k->stmts[st].part = part;
    *post = take_scratch(p, npost);
  }
}

/* The places loop `loop` (serial) can keep in locals: promotes each and
 * appends the new statements before and after the loop to pre / post. */
static void promote_loop(prom *p, int loop, int32_t **pre, int *npre, int32_t **post, int *npost) {
  int body = p->k->stmts[loop].body;
  if (p->k->nstmts > p->ninside) { /* statements earlier promotions added */
    uint8_t *q = realloc(p->inside, (size_t)p->k->nstmts);
    if (!q) {
      p->oom = 1;
      return;
    }
    memset(q + p->ninside, 0, (size_t)(p->k->nstmts - p->ninside));
    p->inside = q;
    p->ninside = p->k->nstmts;
  }
  memset(p->seen, 0, (size_t)p->k->layout->nnodes);
  if (mark(p, body, 0, 1)) goto out; /* a sparse op or a list in the loop */
  /* candidate places: those some access in the loop names (scan the marks) */
  for (int id = 0; id < p->ninside && !p->oom; id++) {
    if (!p->inside[id]) continue;
    const fb_stmt *t = &p->k->stmts[id];
    int cls = fb_op_table[t->op].cls;
    if (cls != FB_OPC_GLOAD && cls != FB_OPC_GSTORE) continue;
    int f = t->snode;
    if (p->seen[f]) continue; /* each place once */
    p->seen[f] = 1;
    p->nacc = 0;
    accesses(p, body, 0, f);
    if (p->oom || !p->nacc) continue;
    int stores = 0;
    if (!promotable(p, f, &stores)) continue;
    int32_t *a = NULL, *z = NULL;
    int na = 0, nz = 0;
    promote_field(p, f, stores, &a, &na, &z, &nz);
    int32_t *np = p->oom ? NULL : realloc(*pre, sizeof **pre * (size_t)(*npre + na + 1));
    int32_t *nq = np ? realloc(*post, sizeof **post * (size_t)(*npost + nz + 1)) : NULL;
    if (np) *pre = np;
    if (nq) *post = nq;
    if (!np || !nq) p->oom = 1;
    else {
      if (na) memcpy(*pre + *npre, a, sizeof *a * (size_t)na);
      *npre += na;
      if (nz) memcpy(*post + *npost, z, sizeof *z * (size_t)nz);
      *npost += nz;
      p->promoted++;
    }
    free(a);
    free(z);
  }
out:
  mark(p, body, 0, 0);
}

static void promote_block(prom *p, int blk, int depth) {
  if (blk < 0 || depth > FB_MAX_BLOCK_DEPTH || p->oom) return;
  int n = p->k->blocks[blk].n;
  int32_t *ids = malloc(sizeof *ids * (size_t)(n ? n : 1));
  if (!ids) {
    p->oom = 1;
    return;
  }
  if (n) memcpy(ids, p->k->blocks[blk].ids, sizeof *ids * (size_t)n);
  int32_t *out = NULL;
  int w = 0, cap = 0;
  for (int i = 0; i < n && !p->oom; i++) {
    int id = ids[i];
    /* inner loops first */
    promote_block(p, p->k->stmts[id].body, depth + 1);
    promote_block(p, p->k->stmts[id].orelse, depth + 1);
    int32_t *pre = NULL, *post = NULL;
    int npre = 0, npost = 0;
    int op = p->k->stmts[id].op;
    if (!p->oom && (op == FB_OP_RANGE_FOR || op == FB_OP_WHILE))
      promote_loop(p, id, &pre, &npre, &post, &npost);
    while (!p->oom && w + 1 + npre + npost > cap) {
      cap = cap * 2 + 16;
      int32_t *q = realloc(out, sizeof *q * (size_t)cap);
      if (!q) p->oom = 1;
      else out = q;
    }
    if (!p->oom) {
      for (int e = 0; e < npre; e++) out[w++] = pre[e];
      out[w++] = id;
      for (int e = 0; e < npost; e++) out[w++] = post[e];
    }
    free(pre);
    free(post);
  }
  free(ids);
  if (p->oom) {
    free(out);
    return;
  }
  fb_block *b = &p->k->blocks[blk];
  free(b->ids);
  b->ids = out;
  b->n = w;
  b->cap = cap;
}

/* ---------------------------------------------------------------- driver */

/* Rewrites task k in place (statement ids stay; new ones are added). */
int fb_ir_task_local(fb_kernel *k, int *atomics, int *promoted, char *err, size_t errlen) {
  *atomics = *promoted = 0;
  fb_task_meta *m = NULL;
  int rc = fb_meta_compute(k, &m, err, errlen);
  if (rc) return rc;
  prom p;
  memset(&p, 0, sizeof p);
  p.k = k;
  p.m = m;
  p.scratch = fb_block_new(k);
  if (p.scratch < 0) {
    fb_meta_free(m);
    return FB_ENOMEM;
  }
  fb_builder_init(&p.b, k);
  p.b.block = p.scratch;
  atomics_block(&p, 0, 0);
  if (!p.oom) {
    p.ninside = k->nstmts;
    p.inside = calloc((size_t)k->nstmts + 1, 1);
    p.seen = calloc((size_t)k->layout->nnodes + 1, 1);
    if (!p.inside || !p.seen) p.oom = 1;
    else promote_block(&p, 0, 0);
  }
  free(p.inside);
  free(p.seen);
  /* the scratch block is the last one and empty again: drop it */
  if (p.scratch == k->nblocks - 1) {
    free(k->blocks[p.scratch].ids);
    k->nblocks--;
  }
  free(p.acc);
  fb_meta_free(m);
  if (p.oom || p.b.err) return FB_ENOMEM;
  *atomics = p.atomics;
  *promoted = p.promoted;
  return 0;
}
