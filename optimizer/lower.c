/* Kernel -> task lowering (docs/design.md): each top-level par_for or
 * struct_for becomes one parallel task, each run of other top-level
 * statements one serial task. Values crossing task boundaries are either
 * recomputed in the consumer (pure expressions over consts and args) or
 * passed through 8-byte slots of the launch's scratch buffer (gtmp), and
 * top-level local variables shared by several tasks live there too. A serial
 * run made only of pure statements has no effect of its own and is dropped.
 *
 * Sparse SNodes (docs/sparse.md, the paper's Figure 3): a struct_for over an
 * SNode with sparse containers P1 (top) .. Pk on its path from the root is
 * preceded by, for each Pi in order, a serial clear_list task and a parallel
 * listgen task; the struct_for task then walks Pk's list. A kernel that
 * deactivates cells of a sparse SNode S ends with one serial gc task for
 * every pointer or dynamic SNode in S's subtree (S included), ancestors
 * first, so that blocks freed inside freed blocks are returned too. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "optimizer/optimizer.h"

enum {
  EXT_NONE = 0,
  EXT_REMAT,
  EXT_SPILL,
  EXT_SHARED_VAR
};

typedef struct lower_ctx {
  const fb_kernel *k;
  int *seg;      /* segment of each top-level statement, -1 elsewhere */
  int *ext;      /* EXT_* for top-level statements used across segments */
  int64_t *slot; /* gtmp offset for spilled values and shared variables */
  int *map;      /* per task: old statement id -> new id */
  fb_builder b;
  int cur;       /* segment being built */
  char *err;
  size_t errlen;
} lower_ctx;

static const char *const task_kind_names[] = {"serial",     "range_for", "struct_for",
                                              "clear_list", "listgen",   "gc"};

const char *fb_task_kind_name(fb_task_kind k) {
  return (unsigned)k <= FB_TASK_GC ? task_kind_names[k] : "?";
}

static int is_par_loop(const fb_stmt *s) {
  return s->op == FB_OP_PAR_FOR || s->op == FB_OP_STRUCT_FOR;
}

static int rematerializable(const fb_kernel *k, const int *seg, int id, int depth) {
  if (id < 0 || id >= k->nstmts || seg[id] < 0 || depth > 64) return 0;
  const fb_stmt *s = &k->stmts[id];
  if (!(fb_op_table[s->op].flags & FB_OPF_PURE) || s->op == FB_OP_LOOP_INDEX) return 0;
  for (int a = 0; a < s->nargs; a++)
    if (!rematerializable(k, seg, s->args[a], depth + 1)) return 0;
  return 1;
}

/* Mark every top-level value that a statement in segment `sg` (at any
 * depth) takes from another segment. */
static void mark_uses(lower_ctx *c, int blk, int sg) {
  const fb_kernel *k = c->k;
  const fb_block *b = &k->blocks[blk];
  for (int i = 0; i < b->n; i++) {
    const fb_stmt *s = &k->stmts[b->ids[i]];
    for (int a = 0; a < s->nargs; a++) {
      int o = s->args[a];
      if (o < 0 || c->seg[o] < 0 || c->seg[o] == sg) continue;
      if (k->stmts[o].op == FB_OP_ALLOCA) c->ext[o] = EXT_SHARED_VAR;
      else if (c->ext[o] == EXT_NONE)
        c->ext[o] = rematerializable(k, c->seg, o, 0) ? EXT_REMAT : EXT_SPILL;
    }
    if (s->body >= 0) mark_uses(c, s->body, sg);
    if (s->orelse >= 0) mark_uses(c, s->orelse, sg);
  }
}

static int emit_copy(lower_ctx *c, const fb_stmt *src) {
  fb_stmt s = *src;
  for (int a = 0; a < s.nargs; a++) s.args[a] = s.args[a] >= 0 ? c->map[s.args[a]] : -1;
  s.body = s.orelse = -1;
  return fb_b_emit(&c->b, &s);
}

static int materialize(lower_ctx *c, int id) {
  if (c->map[id] >= 0) return c->map[id];
  const fb_stmt *s = &c->k->stmts[id];
  if (c->ext[id] == EXT_SPILL && c->seg[id] != c->cur)
    return c->map[id] = fb_b_gtmp_load(&c->b, (fb_type)s->type, c->slot[id]);
  for (int a = 0; a < s->nargs; a++)
    if (materialize(c, s->args[a]) < 0) return c->b.err ? c->b.err : FB_EINVAL;
  return c->map[id] = emit_copy(c, s);
}

static int zero_const(lower_ctx *c, fb_type t) {
  fb_value v;
  v.type = t;
  v.v.u = 0;
  return fb_b_const(&c->b, v);
}

static int copy_block(lower_ctx *c, int src_blk, int dst_blk);

static int copy_stmt(lower_ctx *c, int id) {
  const fb_kernel *k = c->k;
  const fb_stmt *s = &k->stmts[id];
  int var = s->nargs > 0 ? s->args[0] : -1;
  int shared = var >= 0 && c->ext[var] == EXT_SHARED_VAR;
  if (s->op == FB_OP_ALLOCA && c->ext[id] == EXT_SHARED_VAR)
    return fb_b_gtmp_store(&c->b, zero_const(c, (fb_type)s->type), c->slot[id]);
  if (s->op == FB_OP_LLOAD && shared) {
    /* a read of a shared variable that another task also uses as a value
     * (a loop bound, say) is spilled like any value: the consumer must see
     * what the variable held here, not what it holds when the consumer runs */
    int nid = c->map[id] = fb_b_gtmp_load(&c->b, (fb_type)s->type, c->slot[var]);
    if (nid >= 0 && c->seg[id] == c->cur && c->ext[id] == EXT_SPILL)
      return fb_b_gtmp_store(&c->b, nid, c->slot[id]);
    return nid;
  }
  if (s->op == FB_OP_LSTORE && shared)
    return fb_b_gtmp_store(&c->b, c->map[s->args[1]], c->slot[var]);
  int nid = emit_copy(c, s);
  if (nid < 0) return nid;
  c->map[id] = nid;
  if (s->body >= 0) {
    int nb = fb_block_new(c->b.k);
    if (nb < 0) return nb;
    c->b.k->stmts[nid].body = nb;
    int rc = copy_block(c, s->body, nb);
    if (rc < 0) return rc;
  }
  if (s->orelse >= 0) {
    int nb = fb_block_new(c->b.k);
    if (nb < 0) return nb;
    c->b.k->stmts[nid].orelse = nb;
    int rc = copy_block(c, s->orelse, nb);
    if (rc < 0) return rc;
  }
  if (c->seg[id] == c->cur && c->ext[id] == EXT_SPILL)
    return fb_b_gtmp_store(&c->b, nid, c->slot[id]);
  return nid;
}

static int copy_block(lower_ctx *c, int src_blk, int dst_blk) {
  int saved = fb_b_enter(&c->b, dst_blk);
  const fb_block *b = &c->k->blocks[src_blk];
  for (int i = 0; i < b->n; i++) {
    int rc = copy_stmt(c, b->ids[i]);
    if (rc < 0) return rc;
  }
  fb_b_leave(&c->b, saved);
  return 0;
}

/* Externals a segment needs, materialized at the top of its task. */
static int bring_externals(lower_ctx *c, int blk) {
  const fb_kernel *k = c->k;
  const fb_block *b = &k->blocks[blk];
  for (int i = 0; i < b->n; i++) {
    const fb_stmt *s = &k->stmts[b->ids[i]];
    for (int a = 0; a < s->nargs; a++) {
      int o = s->args[a];
      if (o < 0 || c->seg[o] < 0 || c->seg[o] == c->cur) continue;
      if (c->ext[o] == EXT_SHARED_VAR) continue;
      if (materialize(c, o) < 0) return c->b.err ? c->b.err : FB_EINVAL;
    }
    if (s->body >= 0 && bring_externals(c, s->body) < 0) return FB_ENOMEM;
    if (s->orelse >= 0 && bring_externals(c, s->orelse) < 0) return FB_ENOMEM;
  }
  return 0;
}

static int segment_is_pure(const fb_kernel *k, const int *seg, const int *ext, int sg) {
  const fb_block *b = &k->blocks[0];
  for (int i = 0; i < b->n; i++) {
    const fb_stmt *s = &k->stmts[b->ids[i]];
    if (seg[b->ids[i]] == sg && !(fb_op_table[s->op].flags & FB_OPF_PURE)) return 0;
    if (seg[b->ids[i]] == sg && ext[b->ids[i]] == EXT_SPILL) return 0;
  }
  return 1;
}

static int build_task(lower_ctx *c, int sg, fb_task *t, int index) {
  const fb_kernel *k = c->k;
  char name[512];
  snprintf(name, sizeof name, "%s.t%d", k->name ? k->name : "kernel", index);
  fb_kernel *ir = fb_kernel_new(k->layout, name, k->nparams, k->params, k->ret);
  if (!ir) return FB_ENOMEM;
  for (int i = 0; i < k->nstmts; i++) c->map[i] = -1;
  fb_builder_init(&c->b, ir);
  c->cur = sg;
  t->ir = ir;
  t->kind = FB_TASK_SERIAL;
  t->loop = -1;
  t->snode = -1;
  const fb_block *body = &k->blocks[0];
  /* The segment's statements, gathered into a scratch block to walk them. */
  int rc = 0;
  for (int i = 0; i < body->n && rc >= 0; i++) {
    int id = body->ids[i];
    if (c->seg[id] != sg) continue;
    const fb_stmt *s = &k->stmts[id];
    for (int a = 0; a < s->nargs && rc >= 0; a++) {
      int o = s->args[a];
      if (o >= 0 && c->seg[o] >= 0 && c->seg[o] != sg && c->ext[o] != EXT_SHARED_VAR)
        rc = materialize(c, o);
    }
    if (rc >= 0 && s->body >= 0) rc = bring_externals(c, s->body);
    if (rc >= 0 && s->orelse >= 0) rc = bring_externals(c, s->orelse);
  }
  for (int i = 0; i < body->n && rc >= 0; i++) {
    int id = body->ids[i];
    if (c->seg[id] != sg) continue;
    rc = copy_stmt(c, id);
    const fb_stmt *s = &k->stmts[id];
    if (rc >= 0 && is_par_loop(s)) {
      t->loop = c->map[id];
      t->kind = s->op == FB_OP_PAR_FOR ? FB_TASK_RANGE_FOR : FB_TASK_STRUCT_FOR;
      t->snode = s->op == FB_OP_STRUCT_FOR ? s->snode : -1;
    }
  }
  if (rc < 0 || c->b.err) {
    fb_errf(c->err, c->errlen, "lowering %s: out of memory", k->name);
    return c->b.err ? c->b.err : rc;
  }
  return 0;
}

/* ---------------------------------------------------------------- sparse tasks */

static int is_sparse(fb_snode_kind k) {
  return k == FB_SN_BITMASKED || k == FB_SN_POINTER || k == FB_SN_DYNAMIC;
}

/* The container a sparse op or loop on snode works on: a field's parent. */
static int container_of(const fb_layout *l, int snode) {
  return l->nodes[snode].kind == FB_SN_PLACE ? l->nodes[snode].parent : snode;
}

/* Sparse containers from the root down to snode's container, top first. */
static int sparse_path(const fb_layout *l, int snode, int *out, int max) {
  int up[256], n = 0;
  for (int c = container_of(l, snode); c > 0 && n < 256; c = l->nodes[c].parent)
    if (is_sparse(l->nodes[c].kind)) up[n++] = c;
  if (n > max) n = max;
  for (int i = 0; i < n; i++) out[i] = up[n - 1 - i];
  return n;
}

/* The struct_for of segment sg when it iterates sparse lists, else -1. */
static int sparse_loop_of(const lower_ctx *c, int sg) {
  const fb_kernel *k = c->k;
  const fb_block *b = &k->blocks[0];
  for (int i = 0; i < b->n; i++) {
    const fb_stmt *s = &k->stmts[b->ids[i]];
    if (c->seg[b->ids[i]] == sg && s->op == FB_OP_STRUCT_FOR && s->snode > 0 &&
        s->snode < k->layout->nnodes) {
      int p[1];
      return sparse_path(k->layout, s->snode, p, 1) ? b->ids[i] : -1;
    }
  }
  return -1;
}

/* One task made of a single list op on snode. */
static int add_list_task(lower_ctx *c, fb_task_list *out, fb_task_kind kind, int snode) {
  const fb_kernel *k = c->k;
  static const fb_op ops[] = {[FB_TASK_CLEAR_LIST] = FB_OP_CLEAR_LIST,
                              [FB_TASK_LISTGEN] = FB_OP_LISTGEN,
                              [FB_TASK_GC] = FB_OP_GC};
  char name[512];
  snprintf(name, sizeof name, "%s.t%d", k->name ? k->name : "kernel", out->n);
  fb_kernel *ir = fb_kernel_new(k->layout, name, k->nparams, k->params, k->ret);
  if (!ir) return FB_ENOMEM;
  fb_builder b;
  fb_builder_init(&b, ir);
  fb_stmt st;
  memset(&st, 0, sizeof st);
  st.op = (uint16_t)ops[kind];
  st.type = FB_T_VOID;
  st.snode = snode;
  for (int a = 0; a < FB_MAX_ARGS; a++) st.args[a] = -1;
  st.body = st.orelse = -1;
  int id = fb_b_emit(&b, &st);
  if (id < 0 || b.err) {
    fb_kernel_free(ir);
    return FB_ENOMEM;
  }
  fb_task *t = &out->v[out->n++];
  t->kind = kind;
  t->ir = ir;
  t->loop = kind == FB_TASK_LISTGEN ? id : -1;
  t->snode = snode;
  return 0;
}

/* clear_list + listgen for every sparse container above loop's cells. */
static int add_list_tasks(lower_ctx *c, fb_task_list *out, int loop) {
  int path[64];
  int n = sparse_path(c->k->layout, c->k->stmts[loop].snode, path, 64);
  for (int i = 0; i < n; i++) {
    int rc = add_list_task(c, out, FB_TASK_CLEAR_LIST, path[i]);
    if (!rc) rc = add_list_task(c, out, FB_TASK_LISTGEN, path[i]);
    if (rc) return rc;
  }
  return 0;
}

/* Mark the pointer and dynamic SNodes of node's subtree. */
static void mark_allocating(const fb_layout *l, int node, unsigned char *gc) {
  const fb_snode *n = &l->nodes[node];
  if (n->kind == FB_SN_POINTER || n->kind == FB_SN_DYNAMIC) gc[node] = 1;
  for (int i = 0; i < n->nchildren; i++) mark_allocating(l, n->children[i], gc);
}

/* SNodes needing a gc task (per SNode id, 1 = yes); returns how many. */
static int gc_snodes(const fb_kernel *k, unsigned char *gc) {
  const fb_layout *l = k->layout;
  for (int i = 0; i < k->nstmts; i++) {
    const fb_stmt *s = &k->stmts[i];
    if (s->op != FB_OP_DEACTIVATE || s->snode <= 0 || s->snode >= l->nnodes) continue;
    int c = container_of(l, s->snode);
    if (c > 0 && is_sparse(l->nodes[c].kind)) mark_allocating(l, c, gc);
  }
  int n = 0;
  for (int i = 0; i < l->nnodes; i++) n += gc[i];
  return n;
}

/* Tasks beyond one per segment: list tasks of sparse struct_fors. */
static int extra_list_tasks(const lower_ctx *c, int nseg) {
  int n = 0;
  for (int sg = 0; sg < nseg; sg++) {
    int loop = sparse_loop_of(c, sg);
    int path[64];
    if (loop >= 0) n += 2 * sparse_path(c->k->layout, c->k->stmts[loop].snode, path, 64);
  }
  return n;
}

int fb_lower(const fb_kernel *k, fb_task_list *out, char *err, size_t errlen) {
  memset(out, 0, sizeof *out);
  lower_ctx c;
  unsigned char *gc = NULL;
  memset(&c, 0, sizeof c);
  c.k = k;
  c.err = err;
  c.errlen = errlen;
  size_t n = (size_t)(k->nstmts ? k->nstmts : 1);
  c.seg = malloc(n * sizeof(int));
  c.ext = calloc(n, sizeof(int));
  c.slot = calloc(n, sizeof(int64_t));
  c.map = malloc(n * sizeof(int));
  int rc = 0, nseg = 0;
  if (!c.seg || !c.ext || !c.slot || !c.map) {
    rc = FB_ENOMEM;
    goto done;
  }
  for (size_t i = 0; i < n; i++) c.seg[i] = -1;
  /* Segments: each parallel loop alone, each maximal run of others. */
  const fb_block *body = &k->blocks[0];
  int prev_par = 1;
  for (int i = 0; i < body->n; i++) {
    const fb_stmt *s = &k->stmts[body->ids[i]];
    if (is_par_loop(s) || prev_par) nseg++;
    c.seg[body->ids[i]] = nseg - 1;
    prev_par = is_par_loop(s);
  }
  for (int i = 0; i < body->n; i++) {
    const fb_stmt *s = &k->stmts[body->ids[i]];
    int sg = c.seg[body->ids[i]];
    for (int a = 0; a < s->nargs; a++) {
      int o = s->args[a];
      if (o < 0 || c.seg[o] < 0 || c.seg[o] == sg) continue;
      if (k->stmts[o].op == FB_OP_ALLOCA) c.ext[o] = EXT_SHARED_VAR;
      else if (!c.ext[o]) c.ext[o] = rematerializable(k, c.seg, o, 0) ? EXT_REMAT : EXT_SPILL;
    }
    if (s->body >= 0) mark_uses(&c, s->body, sg);
    if (s->orelse >= 0) mark_uses(&c, s->orelse, sg);
  }
  size_t gtmp = 0;
  for (int i = 0; i < k->nstmts; i++)
    if (c.ext[i] == EXT_SPILL || c.ext[i] == EXT_SHARED_VAR) {
      c.slot[i] = (int64_t)gtmp;
      gtmp += 8;
    }
  out->gtmp_bytes = gtmp;
  gc = calloc((size_t)k->layout->nnodes, 1);
  if (!gc) {
    rc = FB_ENOMEM;
    goto done;
  }
  int ngc = gc_snodes(k, gc);
  int cap = nseg + extra_list_tasks(&c, nseg) + ngc;
  out->v = calloc((size_t)(cap ? cap : 1), sizeof(fb_task));
  if (!out->v) {
    rc = FB_ENOMEM;
    goto done;
  }
  for (int sg = 0; sg < nseg && rc >= 0; sg++) {
    if (segment_is_pure(k, c.seg, c.ext, sg)) continue;
    int loop = sparse_loop_of(&c, sg);
    if (loop >= 0 && (rc = add_list_tasks(&c, out, loop)) < 0) break;
    rc = build_task(&c, sg, &out->v[out->n], out->n);
    if (out->v[out->n].ir) out->n++;
  }
  for (int i = 0; i < k->layout->nnodes && rc >= 0; i++)
    if (gc[i]) rc = add_list_task(&c, out, FB_TASK_GC, i);
done:
  if (rc == FB_ENOMEM && err && errlen && !err[0]) fb_errf(err, errlen, "lowering: out of memory");
  free(c.seg);
  free(c.ext);
  free(c.slot);
  free(c.map);
  free(gc);
  if (rc < 0) fb_task_list_free(out);
  return rc;
}

void fb_task_list_free(fb_task_list *l) {
  if (!l) return;
  for (int i = 0; i < l->n; i++) fb_kernel_free(l->v[i].ir);
  free(l->v);
  memset(l, 0, sizeof *l);
}
