/* Reverse-mode automatic differentiation of kernel IR: the adjoint pass
 * (fb_kernel_adjoint) and gradient places (fb_grad_map, fb_layout_add_grad).
 * docs/autodiff.md describes the rules; this comment, how the pass works.
 *
 * Scope. A kernel whose body is a sequence of straight-line statements and
 * parallel loops (par_for, struct_for) with straight-line bodies. The pass
 * first checks the whole kernel and refuses, naming the statement, anything
 * it cannot differentiate exactly; it never emits a partial adjoint.
 *
 * Recompute, do not store. The adjoint kernel runs after the forward kernel
 * and recomputes every forward value it needs from the fields and the
 * parameters. That is exact only when every field read holds, when the
 * kernel ends, the value the kernel read, hence the rule (Taichi's global
 * data access rules, taken at the granularity of fields and top-level
 * statements, which is conservative): a field may be written in some
 * top-level statements and read in later ones, but never read and written
 * in one top-level statement nor written after a read (check_accesses);
 * and no atomic's result is used.
 *
 * Regions. The forward body is cut into regions: each parallel loop that
 * writes a field with a gradient, and each such write in the kernel body.
 * The adjoint kernel holds one region per forward region, in reverse order;
 * each is: the values it needs, recomputed (the body-level statements they
 * depend on at the top, then the loop, then the loop body's own), followed
 * by the reverse sweep over the region's statements, last to first, which
 * turns the adjoint of each value into adjoints of its operands. Values
 * from the kernel body that a loop uses are swept inside the loop, per
 * iteration, so the adjoint of a body-level load becomes an atomic add
 * into its gradient there (never a reduction across iterations).
 *
 * Adjoints are SSA values: adj[id] is the adjoint kernel's statement that
 * holds the sum of the contributions to forward statement id so far (-1:
 * zero). The sweep meets every use of a value before its definition, so
 * adj[id] is complete when the sweep reaches id. Only "active" values (a
 * float that depends, through differentiable operands, on a load of a
 * field with a gradient) get adjoints. */
#include <stdarg.h>
#include <stdio.h>

#include "ad_rules.h"
#include "ir_internal.h"

/* ---------------------------------------------------------------- gradient maps */

int fb_grad_map_init(fb_grad_map *g, int n) {
  if (!g || n < 0) return FB_EINVAL;
  g->n = n;
  g->grad = malloc(sizeof(int32_t) * (size_t)(n ? n : 1));
  if (!g->grad) {
    g->n = 0;
    return FB_ENOMEM;
  }
  for (int i = 0; i < n; i++) g->grad[i] = -1;
  return 0;
}

void fb_grad_map_free(fb_grad_map *g) {
  if (!g) return;
  free(g->grad);
  g->grad = NULL;
  g->n = 0;
}

#define GRAD_SUFFIX ".grad"

int fb_layout_add_grad(fb_layout *l, int place, char *err, size_t errlen) {
  return fb__layout_add_sibling(l, place, GRAD_SUFFIX, "gradient", err, errlen);
}

int fb_grad_map_from_layout(const fb_layout *l, fb_grad_map *g) {
  return fb__sibling_map_from_layout(l, GRAD_SUFFIX, g);
}

/* ---------------------------------------------------------------- the pass */

typedef struct actx {
  const fb_kernel *k;
  const fb_layout *l;
  const fb_grad_map *g;
  char *err;
  size_t errlen;
  int ns;
  int bad;           /* the statement a refusal is about, -1 when none */
  int rc;            /* first emission error, sticky */
  long cap;          /* the most statements emission may make */
  uint8_t *active;   /* per forward statement: a value with an adjoint; an alloca: an active local */
  uint8_t *cross;    /* used in another block than its own: its adjoint lives in a local */
  uint8_t *touched;  /* its adjoint local was added to */
  int32_t *blk;      /* per forward statement: its block; -1 unreachable */
  int32_t *owner;    /* per forward block: the statement owning it, -1 for the body */
  int32_t *map;      /* forward id -> adjoint kernel id (the latest replay) */
  int32_t *adj;      /* its adjoint as an SSA value, -1 for zero */
  int32_t *slot;     /* its adjoint as a local of the adjoint kernel, -1 when SSA */
  int32_t *idxval;   /* per serial range_for: the value its loop_index stands for, -1 */
  uint8_t *replay;   /* per serial range_for: 0 not known, 1 no replay needed, 2 needed */
  int32_t *vars;     /* scratch of rev_list: the locals a block statement touches */
  uint8_t *how;      /* ... 1 read, 2 written, 3 both */
  fb_kernel *out;
  fb_builder b;
} actx;

static const char *op_name(unsigned op) { return op < FB_OP__COUNT ? fb_op_table[op].name : "?"; }

static const char *field_name(const actx *a, int snode) {
  const fb_snode *n = &a->l->nodes[snode];
  return n->name ? n->name : fb_snode_kind_name(n->kind);
}

#if defined(__GNUC__)
__attribute__((format(printf, 3, 4)))
#endif
static int
refuse(actx *a, int id, const char *fmt, ...) {
  char what[400];
  va_list ap;
  va_start(ap, fmt);
  fb_verrf(what, sizeof what, fmt, ap);
  va_end(ap);
  a->bad = id;
  fb_errf(a->err, a->errlen, "cannot differentiate kernel '%s': %s", a->k->name, what);
  return FB_EVERIFY;
}

static int grad_of(const actx *a, int snode) {
  return snode >= 0 && snode < a->g->n ? a->g->grad[snode] : -1;
}

static int is_write(const fb_stmt *s) {
  int c = fb_op_table[s->op].cls;
  return c == FB_OPC_GSTORE || c == FB_OPC_ATOMIC || c == FB_OPC_IATOMIC;
}

static int is_par_loop(const fb_stmt *s) {
  return s->op == FB_OP_PAR_FOR || s->op == FB_OP_STRUCT_FOR;
}

/* Every place with a gradient: a float field; its gradient a place of the
 * same type and index space, not itself, and no one else's. */
static int check_map(actx *a) {
  const fb_layout *l = a->l;
  if (!a->g || a->g->n != l->nnodes || (l->nnodes && !a->g->grad)) {
    fb_errf(a->err, a->errlen,
            "cannot differentiate kernel '%s': the gradient map has %d entries, the layout %d "
            "SNodes",
            a->k->name, a->g ? a->g->n : 0, l->nnodes);
    return FB_EINVAL;
  }
  for (int i = 0; i < l->nnodes; i++) {
    int gi = a->g->grad[i];
    if (gi < 0) continue;
    const fb_snode *p = &l->nodes[i];
    const char *pn = field_name(a, i);
    const char *why = NULL;
    if (gi >= l->nnodes) why = "is not an SNode of the layout";
    else if (p->kind != FB_SN_PLACE) why = "is given to an SNode that is not a field";
    else if (!fb_type_is_float(p->type)) why = "is given to a field that is not f32 or f64";
    else if (gi == i) why = "is the field itself";
    else if (l->nodes[gi].kind != FB_SN_PLACE) why = "is not a field";
    else if (l->nodes[gi].type != p->type) why = "has another element type than the field";
    else if (l->nodes[gi].ndim != p->ndim ||
             memcmp(l->nodes[gi].shape, p->shape, sizeof p->shape) != 0)
      why = "has another shape than the field";
    for (int j = 0; !why && j < i; j++)
      if (a->g->grad[j] == gi) why = "is already the gradient of another field";
    if (why) {
      fb_errf(a->err, a->errlen,
              "cannot differentiate kernel '%s': the gradient of '%s' (SNode %d) %s", a->k->name,
              pn, gi, why);
      return FB_EINVAL;
    }
  }
  return 0;
}

/* What the pass refuses, by op, in the user's terms: 0 when in scope. */
static int out_of_scope(actx *a, int id) {
  const fb_stmt *s = &a->k->stmts[id];
  switch ((fb_op)s->op) {
  case FB_OP_WHILE:
    return refuse(a, id,
                  "a while loop cannot be differentiated (the adjoint must know the trip count "
                  "before the loop runs); write it as a for loop over a range (a 'continue' in a "
                  "parallel loop and an integer power with a run-time exponent become while "
                  "loops too)");
  case FB_OP_BREAK:
  case FB_OP_CONTINUE:
    return refuse(a, id,
                  "'%s' in a loop cannot be differentiated (nor a 'return' inside a loop of a "
                  "func, which becomes one); put the rest of the loop body under an if instead",
                  op_name(s->op));
  case FB_OP_RAND:
    return refuse(a, id,
                  "random() cannot be differentiated (the adjoint would draw other numbers); draw "
                  "the numbers into a field in another kernel and read that field here");
  case FB_OP_IS_ACTIVE:
  case FB_OP_ACTIVATE:
  case FB_OP_DEACTIVATE:
  case FB_OP_APPEND:
  case FB_OP_LENGTH:
    return refuse(a, id,
                  "%s() on '%s' (a sparse-structure operation) cannot be differentiated; do it in "
                  "a kernel that is not differentiated",
                  op_name(s->op), field_name(a, s->snode));
  case FB_OP_ATOMIC_MIN:
  case FB_OP_ATOMIC_MAX:
    if (fb_type_is_float((fb_type)a->l->nodes[s->snode].type))
      return refuse(a, id,
                    "%s on the float field '%s' cannot be differentiated; compute the %s with "
                    "%s() and store it",
                    op_name(s->op), field_name(a, s->snode),
                    s->op == FB_OP_ATOMIC_MIN ? "minimum" : "maximum",
                    s->op == FB_OP_ATOMIC_MIN ? "min" : "max");
    return 0;
  default:
    if (fb_op_table[s->op].flags & FB_OPF_INTERNAL)
      return refuse(a, id,
                    "'%s' is internal to the engine; only client kernels can be differentiated",
                    op_name(s->op));
    return 0;
  }
}

/* Operand i of s carries s's adjoint back (for active operands). */
static int diff_operand(const fb_stmt *s, int i) { return fb__ad_diff_operand(s, i); }

/* Structure, scope and field accesses of a block, in program order. */
static int scan_block(actx *a, int blk) {
  const fb_block *bb = &a->k->blocks[blk];
  for (int j = 0; j < bb->n; j++) {
    int id = bb->ids[j];
    const fb_stmt *s = &a->k->stmts[id];
    a->blk[id] = blk;
    int rc = out_of_scope(a, id);
    if (rc) return rc;
    for (int i = 0; i < s->nargs; i++)
      if (a->blk[s->args[i]] != blk) a->cross[s->args[i]] = 1;
    if (s->body >= 0) {
      a->owner[s->body] = id;
      if ((rc = scan_block(a, s->body))) return rc;
    }
    if (s->orelse >= 0) {
      a->owner[s->orelse] = id;
      if ((rc = scan_block(a, s->orelse))) return rc;
    }
  }
  return 0;
}

/* Forward reachability over uses, linear in the statements below block
 * root: mark[] holds the seeds and receives everything reached. The edge
 * from operand i of s to s (for lstore: from the value to the variable;
 * lload reads its variable) exists in mode PROP_ACTIVE when the operand
 * carries s's derivative and s is a float value, in PROP_TAINT for every
 * operand of a value. Writes to fields and allocas have no incoming edges
 * (but an alloca is reached by its stores). */
enum { PROP_ACTIVE, PROP_TAINT };

static int edge(const actx *a, const fb_stmt *s, int i, int mode) {
  if (s->op == FB_OP_LSTORE) return i == 1 ? s->args[0] : -1;
  if (is_write(s) || s->op == FB_OP_ALLOCA || s->op == FB_OP_PAR_FOR ||
      s->op == FB_OP_STRUCT_FOR || s->op == FB_OP_RANGE_FOR || s->op == FB_OP_IF)
    return -2;
  if (mode == PROP_TAINT) return -3;
  if (!fb_type_is_float((fb_type)s->type)) return -1;
  if (s->op == FB_OP_LLOAD) return -3;
  return diff_operand(s, i) ? -3 : -1;
  (void)a;
}

typedef struct graph {
  int32_t *head, *next, *to; /* per operand statement: a list of users */
  int ne;
} graph;

static void graph_block(const actx *a, graph *g, int blk, int mode) {
  const fb_block *bb = &a->k->blocks[blk];
  for (int j = 0; j < bb->n; j++) {
    int id = bb->ids[j];
    const fb_stmt *s = &a->k->stmts[id];
    if (s->body >= 0) graph_block(a, g, s->body, mode);
    if (s->orelse >= 0) graph_block(a, g, s->orelse, mode);
    for (int i = 0; i < s->nargs && i < FB_MAX_ARGS; i++) {
      int t = edge(a, s, i, mode);
      if (t == -3) t = id;
      if (t < 0) continue;
      int from = s->args[i];
      g->to[g->ne] = t;
      g->next[g->ne] = g->head[from];
      g->head[from] = g->ne++;
    }
  }
}

static int propagate(const actx *a, uint8_t *mark, int root, int mode) {
  size_t n = (size_t)a->ns + 1, ne = n * FB_MAX_ARGS;
  graph g = {malloc(n * sizeof(int32_t)), malloc(ne * sizeof(int32_t)),
             malloc(ne * sizeof(int32_t)), 0};
  int32_t *stack = malloc(n * sizeof(int32_t));
  if (!g.head || !g.next || !g.to || !stack) {
    free(g.head);
    free(g.next);
    free(g.to);
    free(stack);
    return FB_ENOMEM;
  }
  for (size_t i = 0; i < n; i++) g.head[i] = -1;
  graph_block(a, &g, root, mode);
  int sp = 0;
  for (int i = 0; i < a->ns; i++)
    if (mark[i]) stack[sp++] = i;
  while (sp > 0) {
    int u = stack[--sp];
    for (int e = g.head[u]; e >= 0; e = g.next[e])
      if (!mark[g.to[e]]) {
        mark[g.to[e]] = 1;
        stack[sp++] = g.to[e];
      }
  }
  free(g.head);
  free(g.next);
  free(g.to);
  free(stack);
  return 0;
}

/* Seeds of activity: float loads of fields with a gradient. */
static void seed_block(actx *a, int blk) {
  const fb_block *bb = &a->k->blocks[blk];
  for (int j = 0; j < bb->n; j++) {
    const fb_stmt *s = &a->k->stmts[bb->ids[j]];
    if (s->body >= 0) seed_block(a, s->body);
    if (s->orelse >= 0) seed_block(a, s->orelse);
    if (s->op == FB_OP_LOAD && fb_type_is_float((fb_type)s->type) && grad_of(a, s->snode) >= 0)
      a->active[bb->ids[j]] = 1;
  }
}

static const char *an_op(unsigned op) {
  switch (op) {
  case FB_OP_STORE: return "an assignment";
  case FB_OP_ATOMIC_ADD: return "an atomic_add (+=)";
  case FB_OP_ATOMIC_SUB: return "an atomic_sub (-=)";
  default: return op_name(op);
  }
}

/* The field accesses inside top-level statement id (itself and its
 * blocks, in program order), stamped pos: per field, the first read and
 * the first write; wlist gets each field written, once, in the order of
 * their first writes. */
typedef struct {
  int *rpos, *rid; /* per field: the last top-level statement that read it, its first read there */
  int *wpos, *wid; /* ... wrote it, its first write there */
  int *wlist, nw;
} accs;

static void accesses(const actx *a, int id, int pos, accs *x) {
  const fb_stmt *s = &a->k->stmts[id];
  if (s->op == FB_OP_LOAD && x->rpos[s->snode] != pos) {
    x->rpos[s->snode] = pos;
    x->rid[s->snode] = id;
  }
  if (is_write(s) && x->wpos[s->snode] != pos) {
    x->wpos[s->snode] = pos;
    x->wid[s->snode] = id;
    x->wlist[x->nw++] = s->snode;
  }
  int bl[2] = {s->body, s->orelse};
  for (int b = 0; b < 2; b++) {
    if (bl[b] < 0) continue;
    const fb_block *bb = &a->k->blocks[bl[b]];
    for (int j = 0; j < bb->n; j++) accesses(a, bb->ids[j], pos, x);
  }
}

static const char *top_kind(const fb_stmt *s) {
  switch ((fb_op)s->op) {
  case FB_OP_PAR_FOR:
  case FB_OP_STRUCT_FOR: return "parallel loop";
  case FB_OP_RANGE_FOR: return "serial for loop";
  case FB_OP_IF: return "if statement";
  default: return "statement";
  }
}

/* An index operand as base + offset: base is the statement the constant
 * offset is added to (-1 for a constant index). Adds and subtracts of
 * integer constants are looked through, a few levels deep. */
static int index_parts(const actx *a, int id, int64_t *off) {
  *off = 0;
  for (int depth = 0; depth < 8; depth++) {
    const fb_stmt *s = &a->k->stmts[id];
    if (s->op == FB_OP_CONST && !fb_type_is_float((fb_type)s->type)) {
      *off += s->imm.i;
      return -1;
    }
    if ((s->op != FB_OP_ADD && s->op != FB_OP_SUB) || s->nargs != 2) return id;
    const fb_stmt *l = &a->k->stmts[s->args[0]], *r = &a->k->stmts[s->args[1]];
    if (r->op == FB_OP_CONST && !fb_type_is_float((fb_type)r->type)) {
      *off += s->op == FB_OP_ADD ? r->imm.i : -r->imm.i;
      id = s->args[0];
    } else if (s->op == FB_OP_ADD && l->op == FB_OP_CONST && !fb_type_is_float((fb_type)l->type)) {
      *off += l->imm.i;
      id = s->args[1];
    } else {
      return id;
    }
    if (*off > INT32_MAX || *off < -(int64_t)INT32_MAX) return -2;
  }
  return -2;
}

/* Whether the kernel's reads and writes of field f touch disjoint elements
 * by construction: along some axis every access indexes the same value
 * computed once in the kernel body (a parameter, say; or no value: a
 * constant) plus a constant, and no read's constant is a write's. So
 * x[s + 1, p] = f(x[s, p]) in a parallel loop (per-step state, as
 * DiffTaichi writes it) reads slice s and writes slice s + 1, in every
 * iteration: what the adjoint recomputes from slice s is what the forward
 * pass read. */
static int disjoint_slices(const actx *a, int f) {
  enum { MAXOFF = 16 };
  int nidx = a->l->nodes[f].ndim;
  for (int d = 0; d < nidx && d < FB_MAX_ARGS; d++) {
    int base = -3, ok = 1, nr = 0, nw = 0;
    int64_t roff[MAXOFF], woff[MAXOFF];
    for (int id = 0; ok && id < a->ns; id++) {
      const fb_stmt *s = &a->k->stmts[id];
      if (a->blk[id] < 0 || s->snode != f) continue;
      int w = is_write(s);
      if (!w && s->op != FB_OP_LOAD) continue;
      if (s->nargs - w != nidx) {
        ok = 0;
        break;
      }
      int64_t off;
      int b = index_parts(a, s->args[d], &off);
      if (b == -2 || (b >= 0 && a->blk[b] != 0) || (base != -3 && b != base)) {
        ok = 0;
        break;
      }
      base = b;
      int64_t *set = w ? woff : roff;
      int *n = w ? &nw : &nr, seen = 0;
      for (int i = 0; i < *n; i++) seen |= set[i] == off;
      if (seen) continue;
      if (*n == MAXOFF) {
        ok = 0;
        break;
      }
      set[(*n)++] = off;
    }
    for (int i = 0; ok && i < nr; i++)
      for (int j = 0; j < nw; j++)
        if (roff[i] == woff[j]) ok = 0;
    if (ok && nr > 0 && nw > 0) return 1;
  }
  return 0;
}

/* Taichi's global data access rules, per top-level statement (a region of
 * the adjoint, or the body-level statements the regions recompute): the
 * adjoint recomputes every read from the value the field holds when the
 * kernel has ended, which is the value the forward pass read only when no
 * write to the field comes after the read. So a field may be written in
 * some top-level statements and read in later ones (the adjoint of a
 * later one adds into its gradient, which the adjoint of the writer, run
 * after it, consumes), but it must not be read and written inside one
 * top-level statement, nor written after a top-level statement that read
 * it (that covers a field written, read, then written again). Integer
 * fields alike: indices are recomputed from them. */
static int check_accesses(actx *a) {
  const fb_kernel *k = a->k;
  const fb_block *b0 = &k->blocks[0];
  int nn = a->l->nnodes, rc = 0;
  size_t n = (size_t)nn + 1;
  accs x = {malloc(n * sizeof(int)), malloc(n * sizeof(int)), malloc(n * sizeof(int)),
            malloc(n * sizeof(int)), malloc(n * sizeof(int)), 0};
  int *read_before = malloc(n * sizeof(int)); /* per field: a read in an earlier top-level statement, -1 */
  if (!x.rpos || !x.rid || !x.wpos || !x.wid || !x.wlist || !read_before) rc = FB_ENOMEM;
  for (int f = 0; !rc && f < nn; f++) x.rpos[f] = x.wpos[f] = read_before[f] = -1;
  for (int pos = 0; !rc && pos < b0->n; pos++) {
    x.nw = 0;
    accesses(a, b0->ids[pos], pos, &x);
    for (int i = 0; !rc && i < x.nw; i++) {
      int f = x.wlist[i], w = x.wid[f];
      if ((x.rpos[f] == pos || read_before[f] >= 0) && disjoint_slices(a, f)) continue;
      if (x.rpos[f] == pos)
        rc = refuse(a, w,
                    "it reads field '%s' and writes it (%s) in the same %s; the adjoint "
                    "recomputes what the kernel read, so the %s that reads a field must not change "
                    "it (the global data access rules, docs/autodiff.md): write the result to "
                    "another field or split the kernel in two (a field written in one loop may be "
                    "read in a later one)",
                    field_name(a, f), an_op(k->stmts[w].op), top_kind(&k->stmts[b0->ids[pos]]),
                    top_kind(&k->stmts[b0->ids[pos]]));
      else if (read_before[f] >= 0)
        rc = refuse(a, w,
                    "it writes field '%s' (%s) after an earlier part of the kernel read it; the "
                    "adjoint recomputes that read from the value the field holds when the kernel "
                    "ends, which this write changes (the global data access rules, "
                    "docs/autodiff.md): write the result to another field or split the kernel "
                    "in two before this write",
                    field_name(a, f), an_op(k->stmts[w].op));
    }
    for (int f = 0; !rc && f < nn; f++)
      if (x.rpos[f] == pos && read_before[f] < 0) read_before[f] = x.rid[f];
  }
  free(x.rpos);
  free(x.rid);
  free(x.wpos);
  free(x.wid);
  free(x.wlist);
  free(read_before);
  return rc;
}

static int scan(actx *a) {
  const fb_kernel *k = a->k;
  int rc = 0;
  uint8_t *used = calloc((size_t)a->ns + 1, 1);
  if (!used) rc = FB_ENOMEM;
  if (!rc) rc = scan_block(a, 0);
  if (!rc) {
    seed_block(a, 0);
    rc = propagate(a, a->active, 0, PROP_ACTIVE);
  }
  /* every operand use, for the atomic-result rule */
  for (int id = 0; !rc && id < a->ns; id++) {
    const fb_stmt *s = &k->stmts[id];
    if (a->blk[id] < 0) continue;
    for (int i = 0; i < s->nargs && i < FB_MAX_ARGS; i++) used[s->args[i]] = 1;
  }
  for (int id = 0; !rc && id < a->ns; id++)
    if (used[id] && a->blk[id] >= 0 && is_write(&k->stmts[id]))
      rc = refuse(a, id,
                  "uses the value %s returns (on field '%s'); the adjoint cannot recompute it: "
                  "use %s as a statement only",
                  op_name(k->stmts[id].op), field_name(a, k->stmts[id].snode),
                  op_name(k->stmts[id].op));
  if (!rc) rc = check_accesses(a);
  for (int id = 0; !rc && id < a->ns; id++) {
    const fb_stmt *s = &k->stmts[id];
    if (a->blk[id] < 0 || !is_write(s) || !a->active[s->args[s->nargs - 1]]) continue;
    if (grad_of(a, s->snode) < 0)
      rc = refuse(a, id,
                  "it writes a value that depends on a field with a gradient into '%s', which "
                  "has none, so the gradient would be lost; give '%s' a gradient (place %s: %s "
                  "grad)",
                  field_name(a, s->snode), field_name(a, s->snode), field_name(a, s->snode),
                  fb_type_name((fb_type)a->l->nodes[s->snode].type));
  }
  free(used);
  return rc;
}

/* ---------------------------------------------------------------- emitting */

static int chk(actx *a, int id) {
  if (a->rc) return -1;
  if (id < 0) a->rc = a->b.err ? a->b.err : FB_ENOMEM;
  else if (a->out->nstmts > a->cap) a->rc = FB_EQUOTA;
  return a->rc ? -1 : id;
}
static int cst(actx *a, fb_type t, double c) {
  return chk(a, fb_b_const(&a->b, t == FB_T_F32 ? fb_value_f32((float)c) : fb_value_f64(c)));
}
static int bin(actx *a, fb_op op, int x, int y) { return chk(a, fb_b_binary(&a->b, op, x, y)); }
static int un(actx *a, fb_op op, int x) { return chk(a, fb_b_unary(&a->b, op, x)); }
static int sel(actx *a, int c, int x, int y) { return chk(a, fb_b_select(&a->b, c, x, y)); }
static int lload(actx *a, int var) { return chk(a, fb_b_lload(&a->b, var)); }
static void lstore(actx *a, int var, int v) { chk(a, fb_b_lstore(&a->b, var, v)); }

/* Add contribution v to the adjoint of forward statement o. */
static void acc(actx *a, int o, int v) {
  if (!a->active[o] || v < 0 || a->rc) return;
  if (a->slot[o] >= 0) {
    /* always an add: the contribution may sit in a loop that runs it many times */
    lstore(a, a->slot[o], bin(a, FB_OP_ADD, lload(a, a->slot[o]), v));
    a->touched[o] = 1;
    return;
  }
  a->adj[o] = a->adj[o] < 0 ? v : bin(a, FB_OP_ADD, a->adj[o], v);
}

static int get_adj(actx *a, int id) {
  if (a->slot[id] >= 0) return a->touched[id] ? lload(a, a->slot[id]) : -1;
  return a->adj[id];
}

/* Recompute forward statement id (no block) in the current block. */
static int replay(actx *a, int id) {
  fb_stmt c = a->k->stmts[id];
  for (int i = 0; i < c.nargs && i < FB_MAX_ARGS; i++) c.args[i] = a->map[c.args[i]];
  c.body = c.orelse = -1;
  c.part = 0;
  return a->map[id] = chk(a, fb_b_emit(&a->b, &c));
}

/* The global access op at s's indices (mapped), on SNode field. */
static int access(actx *a, const fb_stmt *s, fb_op op, int field, int value) {
  int idx[FB_MAX_ARGS], n = s->nargs - (is_write(s) ? 1 : 0);
  for (int i = 0; i < n; i++) idx[i] = a->map[s->args[i]];
  return chk(a, fb_b_global(&a->b, op, field, idx, n, value));
}

static void fwd_block(actx *a, int blk);

/* The forward replay of one statement: everything but global writes and
 * the return value; blocks are replayed with their bodies. */
static void fwd_stmt(actx *a, int id) {
  const fb_stmt *s = &a->k->stmts[id];
  if (a->rc || is_write(s) || s->op == FB_OP_RET) return;
  if (s->op == FB_OP_LOOP_INDEX && a->idxval[s->args[0]] >= 0) {
    a->map[id] = a->idxval[s->args[0]];
    return;
  }
  if (s->op == FB_OP_IF || s->op == FB_OP_RANGE_FOR) {
    int n = s->op == FB_OP_IF ? fb_b_if(&a->b, a->map[s->args[0]], s->orelse >= 0)
                              : fb_b_range_for(&a->b, a->map[s->args[0]], a->map[s->args[1]], 0);
    if ((a->map[id] = chk(a, n)) < 0) return;
    int ob = a->out->stmts[n].body, oe = a->out->stmts[n].orelse;
    int saved = fb_b_enter(&a->b, ob);
    fwd_block(a, s->body);
    fb_b_leave(&a->b, saved);
    if (s->orelse >= 0) {
      saved = fb_b_enter(&a->b, oe);
      fwd_block(a, s->orelse);
      fb_b_leave(&a->b, saved);
    }
    return;
  }
  replay(a, id);
}

static void fwd_block(actx *a, int blk) {
  const fb_block *bb = &a->k->blocks[blk];
  for (int j = 0; j < bb->n && !a->rc; j++) fwd_stmt(a, bb->ids[j]);
}

/* Is block blk inside statement s (its body, its else, or below)? */
static int inside(const actx *a, int blk, int s) {
  const fb_stmt *st = &a->k->stmts[s];
  while (blk > 0) {
    if (blk == st->body || blk == st->orelse) return 1;
    int o = a->owner[blk];
    if (o < 0) return 0;
    blk = a->blk[o];
  }
  return 0;
}

/* The local variables declared outside block statement s that s reads
 * (LLOAD) or writes (LSTORE), added once each to vars; flags |= 1 for a
 * read, 2 for a write (per variable, in how[]). */
static void locals_in(const actx *a, int s, int blk, int32_t *vars, uint8_t *how, int *n) {
  const fb_block *bb = &a->k->blocks[blk];
  for (int j = 0; j < bb->n; j++) {
    const fb_stmt *t = &a->k->stmts[bb->ids[j]];
    if (t->body >= 0) locals_in(a, s, t->body, vars, how, n);
    if (t->orelse >= 0) locals_in(a, s, t->orelse, vars, how, n);
    if (t->op != FB_OP_LLOAD && t->op != FB_OP_LSTORE) continue;
    int v = t->args[0], i;
    if (inside(a, a->blk[v], s)) continue;
    for (i = 0; i < *n && vars[i] != v; i++) {
    }
    if (i == *n) {
      vars[(*n)++] = v;
      how[i] = 0;
    }
    how[i] |= t->op == FB_OP_LLOAD ? 1 : 2;
  }
}

/* ---------------------------------------------------------------- loop-carried values */

/* Does the reverse sweep of the block read a tainted value: an index, a
 * condition, a bound, or an operand or result a derivative rule uses? */
static int sweep_reads_taint(const actx *a, int blk, const uint8_t *taint) {
  const fb_block *bb = &a->k->blocks[blk];
  for (int j = 0; j < bb->n; j++) {
    int id = bb->ids[j];
    const fb_stmt *s = &a->k->stmts[id];
    if (s->body >= 0 && sweep_reads_taint(a, s->body, taint)) return 1;
    if (s->orelse >= 0 && sweep_reads_taint(a, s->orelse, taint)) return 1;
    int na = s->nargs, uses_r = 0, uses_args = 0;
    switch ((fb_op)s->op) {
    case FB_OP_IF:
    case FB_OP_RANGE_FOR: uses_args = 1; break;
    case FB_OP_LOAD: uses_args = a->active[id]; break;
    case FB_OP_SELECT: uses_args = a->active[id]; na = 1; break;
    case FB_OP_ADD:
    case FB_OP_SUB:
    case FB_OP_NEG:
    case FB_OP_CAST:
    case FB_OP_ALLOCA:
    case FB_OP_LLOAD:
    case FB_OP_LSTORE: break;
    case FB_OP_SQRT:
    case FB_OP_EXP: uses_r = a->active[id]; break;
    default:
      if (is_write(s)) {
        uses_args = grad_of(a, s->snode) >= 0;
        na = s->nargs - 1; /* the indices */
      } else {
        uses_args = uses_r = a->active[id];
      }
    }
    if (uses_r && taint[id]) return 1;
    for (int i = 0; uses_args && i < na; i++)
      if (taint[s->args[i]]) return 1;
  }
  return 0;
}

/* Must the reverse sweep of serial loop id recompute the carried locals
 * for each iteration (replaying the iterations before it)? Only when the
 * sweep reads something computed from them: an accumulation s += f(x[j])
 * does not, and its reversal stays linear in the trip count. */
static int needs_replay(actx *a, int id, const int32_t *vars, const uint8_t *how, int n) {
  if (a->replay[id]) return a->replay[id] - 1; /* the same for every copy of the loop */
  uint8_t *taint = calloc((size_t)a->ns + 1, 1);
  if (!taint) return 1;
  for (int j = 0; j < n; j++)
    if (how[j] == 3) taint[vars[j]] = 1;
  const fb_stmt *s = &a->k->stmts[id];
  int r = propagate(a, taint, s->body, PROP_TAINT) ? 1 : sweep_reads_taint(a, s->body, taint);
  free(taint);
  a->replay[id] = (uint8_t)(r + 1);
  return r;
}

typedef struct snaps {
  int32_t *var, *val; /* forward alloca, adjoint-kernel value before the statement */
  uint8_t *how;
  int n;
} snaps;

static void restore(actx *a, const snaps *sn, int from, int to) {
  for (int j = from; j < to; j++) lstore(a, a->map[sn->var[j]], sn->val[j]);
}

static void rev_list(actx *a, const int32_t *ids, int n, int sweep_from);

static void rev_block(actx *a, int blk, int sweep) {
  const fb_block *bb = &a->k->blocks[blk];
  rev_list(a, bb->ids, bb->n, sweep ? 0 : bb->n);
}

/* The reverse step of one statement. sn[from, to) are the local variables
 * a block statement touches, with their values before it. */
static void rev_stmt(actx *a, int id, int sweep, const snaps *sn, int from, int to) {
  const fb_stmt *s = &a->k->stmts[id];
  if (a->rc) return;
  if (is_write(s)) {
    int gf = grad_of(a, s->snode);
    if (!sweep || gf < 0) return;
    int v = s->args[s->nargs - 1];
    int gv = access(a, s, FB_OP_LOAD, gf, -1);
    if (s->op == FB_OP_STORE) /* the old value is overwritten: no gradient flows to it */
      access(a, s, FB_OP_STORE, gf, cst(a, (fb_type)a->l->nodes[gf].type, 0.0));
    if (s->op == FB_OP_ATOMIC_SUB) gv = un(a, FB_OP_NEG, gv);
    if (a->active[v]) acc(a, v, gv);
    return;
  }
  if (s->op == FB_OP_IF) {
    restore(a, sn, from, to);
    int n = chk(a, fb_b_if(&a->b, a->map[s->args[0]], s->orelse >= 0));
    if (n < 0) return;
    int ob = a->out->stmts[n].body, oe = a->out->stmts[n].orelse;
    int saved = fb_b_enter(&a->b, ob);
    rev_block(a, s->body, sweep);
    fb_b_leave(&a->b, saved);
    if (s->orelse >= 0) {
      saved = fb_b_enter(&a->b, oe);
      rev_block(a, s->orelse, sweep);
      fb_b_leave(&a->b, saved);
    }
    return;
  }
  if (s->op == FB_OP_RANGE_FOR) {
    /* iterations last to first: for r in 0 .. end - begin, t = end - 1 - r;
     * the local variables the body carries from one iteration to the next
     * are recomputed from their values before the loop (iterations begin
     * .. t - 1 replayed), then iteration t is replayed and swept. */
    restore(a, sn, from, to);
    int B = a->map[s->args[0]], E = a->map[s->args[1]];
    int zero = chk(a, fb_b_const_i32(&a->b, 0)), one = chk(a, fb_b_const_i32(&a->b, 1));
    int cnt = bin(a, FB_OP_SUB, E, B);
    int rl = chk(a, fb_b_range_for(&a->b, zero, cnt, 0));
    if (rl < 0) return;
    int saved = fb_b_enter(&a->b, a->out->stmts[rl].body);
    int r = chk(a, fb_b_loop_index(&a->b, rl, 0));
    int t = bin(a, FB_OP_SUB, bin(a, FB_OP_SUB, E, one), r);
    int carried = 0;
    for (int j = from; j < to; j++) carried |= sn->how[j] == 3;
    if (carried) carried = needs_replay(a, id, sn->var + from, sn->how + from, to - from);
    if (carried && !a->rc) {
      restore(a, sn, from, to);
      int pl = chk(a, fb_b_range_for(&a->b, B, t, 0));
      if (pl >= 0) {
        a->map[id] = pl;
        int s2 = fb_b_enter(&a->b, a->out->stmts[pl].body);
        fwd_block(a, s->body);
        fb_b_leave(&a->b, s2);
      }
    }
    a->idxval[id] = t;
    rev_block(a, s->body, sweep);
    a->idxval[id] = -1;
    fb_b_leave(&a->b, saved);
    return;
  }
  if (s->op == FB_OP_LLOAD) {
    int g = get_adj(a, id), v = s->args[0];
    if (g >= 0 && a->slot[v] >= 0)
      lstore(a, a->slot[v], bin(a, FB_OP_ADD, lload(a, a->slot[v]), g));
    return;
  }
  if (s->op == FB_OP_LSTORE) { /* the stored value takes the variable's adjoint */
    int v = s->args[0];
    if (!a->active[v] || a->slot[v] < 0) return;
    int g = lload(a, a->slot[v]);
    lstore(a, a->slot[v], cst(a, (fb_type)a->k->stmts[v].type, 0.0));
    if (a->active[s->args[1]]) acc(a, s->args[1], g);
    return;
  }
  if (!a->active[id]) return;
  int g = get_adj(a, id);
  if (g < 0) return;
  fb_type t = (fb_type)s->type;
  int a0 = s->nargs > 0 ? s->args[0] : -1, a1 = s->nargs > 1 ? s->args[1] : -1;
  int A = a0 >= 0 ? a->map[a0] : -1, B = a1 >= 0 ? a->map[a1] : -1, R = a->map[id];
  switch ((fb_op)s->op) {
  case FB_OP_LOAD: access(a, s, FB_OP_ATOMIC_ADD, grad_of(a, s->snode), g); break;
  case FB_OP_CAST:
    if (a->active[a0]) acc(a, a0, chk(a, fb_b_cast(&a->b, (fb_type)a->k->stmts[a0].type, g)));
    break;
  case FB_OP_SELECT: {
    int z = cst(a, t, 0.0), c = a->map[a0];
    if (a->active[s->args[1]]) acc(a, s->args[1], sel(a, c, g, z));
    if (a->active[s->args[2]]) acc(a, s->args[2], sel(a, c, z, g));
    break;
  }
  default: { /* arithmetic and math: the shared rules (ir/ad_rules.c) */
    fb_ad_em e = {&a->b, a->out, a->cap, a->rc};
    int gi[2] = {a0 >= 0 && a->active[a0] ? g : -1, a1 >= 0 && a->active[a1] ? g : -1}, c[2];
    fb__ad_rule(&e, s, A, B, R, gi, c);
    a->rc = e.rc;
    if (c[0] >= 0) acc(a, a0, c[0]);
    if (c[1] >= 0) acc(a, a1, c[1]);
    break;
  }
  }
}

/* A list of statements of one block (or a region: the body-level prefix
 * followed by a loop body): replayed forward, then swept last to first.
 * Writes to fields are swept from position sweep_from on (earlier ones
 * belong to regions of their own). Before each block statement, the local
 * variables it touches are read (snapshots), so that its reverse step can
 * put them back to their values before it and replay it from there. */
static void rev_list(actx *a, const int32_t *ids, int n, int sweep_from) {
  if (a->rc) return;
  snaps sn = {0};
  int *off = malloc(sizeof(int) * (size_t)(n + 1));
  size_t cap = 16;
  sn.var = malloc(cap * sizeof(int32_t));
  sn.val = malloc(cap * sizeof(int32_t));
  sn.how = malloc(cap);
  int32_t *vars = a->vars;
  uint8_t *how = a->how;
  if (!off || !sn.var || !sn.val || !sn.how) a->rc = FB_ENOMEM;
  for (int i = 0; i < n && !a->rc; i++) {
    const fb_stmt *s = &a->k->stmts[ids[i]];
    off[i] = sn.n;
    if (s->op == FB_OP_IF || s->op == FB_OP_RANGE_FOR) {
      int nv = 0;
      locals_in(a, ids[i], s->body, vars, how, &nv);
      if (s->orelse >= 0) locals_in(a, ids[i], s->orelse, vars, how, &nv);
      for (int j = 0; j < nv && !a->rc; j++) {
        if ((size_t)sn.n == cap) {
          cap *= 2;
          int32_t *v1 = realloc(sn.var, cap * sizeof(int32_t));
          if (v1) sn.var = v1;
          int32_t *v2 = realloc(sn.val, cap * sizeof(int32_t));
          if (v2) sn.val = v2;
          uint8_t *v3 = realloc(sn.how, cap);
          if (v3) sn.how = v3;
          if (!v1 || !v2 || !v3) {
            a->rc = FB_ENOMEM;
            break;
          }
        }
        sn.var[sn.n] = vars[j];
        sn.how[sn.n] = how[j];
        sn.val[sn.n] = lload(a, a->map[vars[j]]);
        sn.n++;
      }
    }
    fwd_stmt(a, ids[i]);
  }
  if (!a->rc) off[n] = sn.n;
  for (int i = 0; i < n && !a->rc; i++) { /* where the adjoints of this list's values live */
    int id = ids[i];
    const fb_stmt *s = &a->k->stmts[id];
    a->adj[id] = a->slot[id] = -1;
    a->touched[id] = 0;
    if (!a->active[id]) continue;
    if (s->op == FB_OP_ALLOCA || a->cross[id]) {
      a->slot[id] = chk(a, fb_b_alloca(&a->b, (fb_type)s->type));
      lstore(a, a->slot[id], cst(a, (fb_type)s->type, 0.0));
    }
  }
  for (int i = n - 1; i >= 0 && !a->rc; i--)
    rev_stmt(a, ids[i], i >= sweep_from, &sn, off[i], off[i + 1]);
  free(off);
  free(sn.var);
  free(sn.val);
  free(sn.how);
}

/* Does statement id write (anywhere inside it) a field with a gradient? */
static int writes_grad(const actx *a, int id) {
  const fb_stmt *s = &a->k->stmts[id];
  if (is_write(s)) return grad_of(a, s->snode) >= 0;
  int bl[2] = {s->body, s->orelse};
  for (int b = 0; b < 2; b++) {
    if (bl[b] < 0) continue;
    const fb_block *bb = &a->k->blocks[bl[b]];
    for (int j = 0; j < bb->n; j++)
      if (writes_grad(a, bb->ids[j])) return 1;
  }
  return 0;
}

/* One forward region: the top-level statement at position pos of the
 * body (a parallel loop, or a body-level write, if or serial loop). Its
 * reverse step runs after the body-level statements before it (not the
 * parallel loops) are replayed: inside the loop for a parallel loop, so
 * that the adjoints of body-level values reach their gradients per
 * iteration. */
static void emit_region(actx *a, int pos) {
  const fb_kernel *k = a->k;
  const fb_block *b0 = &k->blocks[0];
  int region = b0->ids[pos];
  const fb_stmt *r = &k->stmts[region];
  int32_t *list = malloc(sizeof(int32_t) * (size_t)(a->ns + 1));
  if (!list) {
    a->rc = FB_ENOMEM;
    return;
  }
  int n = 0;
  for (int i = 0; i < pos; i++) {
    const fb_stmt *s = &k->stmts[b0->ids[i]];
    if (!is_par_loop(s) && !is_write(s) && s->op != FB_OP_RET) list[n++] = b0->ids[i];
  }
  int npre = n;
  if (is_par_loop(r)) {
    for (int i = 0; i < npre; i++) fwd_stmt(a, list[i]); /* the bounds */
    int nl = r->op == FB_OP_PAR_FOR
                 ? fb_b_range_for(&a->b, a->map[r->args[0]], a->map[r->args[1]], 1)
                 : fb_b_struct_for(&a->b, r->snode);
    if ((a->map[region] = chk(a, nl)) >= 0) {
      int saved = fb_b_enter(&a->b, a->out->stmts[nl].body);
      const fb_block *bb = &k->blocks[r->body];
      for (int j = 0; j < bb->n; j++) list[n++] = bb->ids[j];
      rev_list(a, list, n, npre);
      fb_b_leave(&a->b, saved);
    }
  } else {
    list[n++] = region;
    rev_list(a, list, n, npre);
  }
  free(list);
}

/* ---------------------------------------------------------------- cleanup */

/* Remove what the adjoint computes and never uses (recomputed values no
 * adjoint needs, locals never read, empty blocks): liveness from the
 * writes to fields, through operands, the statements owning a live
 * statement's block, and the stores of every local that is read. Returns
 * the compacted kernel (NULL on allocation failure); o is freed. */
static void dce_walk(const fb_kernel *o, int blk, int32_t *sblk, int32_t *bown) {
  const fb_block *bb = &o->blocks[blk];
  for (int j = 0; j < bb->n; j++) {
    const fb_stmt *s = &o->stmts[bb->ids[j]];
    sblk[bb->ids[j]] = blk;
    if (s->body >= 0) {
      bown[s->body] = bb->ids[j];
      dce_walk(o, s->body, sblk, bown);
    }
    if (s->orelse >= 0) {
      bown[s->orelse] = bb->ids[j];
      dce_walk(o, s->orelse, sblk, bown);
    }
  }
}

static fb_kernel *dce(fb_kernel *o) {
  size_t n = (size_t)o->nstmts + 1, nb = (size_t)o->nblocks + 1;
  int32_t *sblk = malloc(n * sizeof(int32_t)), *bown = malloc(nb * sizeof(int32_t));
  int32_t *first = malloc(n * sizeof(int32_t)), *next = malloc(n * sizeof(int32_t));
  int32_t *stack = malloc(n * sizeof(int32_t));
  uint8_t *live = calloc(n, 1), *vlive = calloc(n, 1);
  fb_kernel *res = NULL;
  if (!sblk || !bown || !first || !next || !stack || !live || !vlive) goto done;
  for (size_t i = 0; i < n; i++) sblk[i] = first[i] = next[i] = -1;
  for (size_t i = 0; i < nb; i++) bown[i] = -1;
  dce_walk(o, 0, sblk, bown);
  int sp = 0;
  for (int i = o->nstmts - 1; i >= 0; i--) {
    const fb_stmt *s = &o->stmts[i];
    if (sblk[i] < 0) continue;
    if (s->op == FB_OP_LSTORE) {
      next[i] = first[s->args[0]];
      first[s->args[0]] = i;
    }
    if (fb_op_table[s->op].flags & FB_OPF_WRITES) {
      live[i] = 1;
      stack[sp++] = i;
    }
  }
#define MARK(x)                                                                                    \
  do {                                                                                             \
    int x_ = (x);                                                                                  \
    if (x_ >= 0 && !live[x_]) {                                                                    \
      live[x_] = 1;                                                                                \
      stack[sp++] = x_;                                                                            \
    }                                                                                              \
  } while (0)
  while (sp > 0) {
    int id = stack[--sp];
    const fb_stmt *s = &o->stmts[id];
    for (int i = 0; i < s->nargs && i < FB_MAX_ARGS; i++) MARK(s->args[i]);
    MARK(bown[sblk[id]]);
    if (s->op == FB_OP_LLOAD && !vlive[s->args[0]]) {
      vlive[s->args[0]] = 1;
      for (int st = first[s->args[0]]; st >= 0; st = next[st]) MARK(st);
    }
  }
#undef MARK
  for (int b = 0; b < o->nblocks; b++) {
    fb_block *bb = &o->blocks[b];
    int m = 0;
    for (int j = 0; j < bb->n; j++)
      if (live[bb->ids[j]]) bb->ids[m++] = bb->ids[j];
    bb->n = m;
  }
  res = fb_kernel_compact(o);
done:
  free(sblk);
  free(bown);
  free(first);
  free(next);
  free(stack);
  free(live);
  free(vlive);
  fb_kernel_free(o);
  return res;
}

/* ---------------------------------------------------------------- entry points */

int fb_kernel_adjoint_ex(const fb_kernel *k, const fb_grad_map *g, int max_stmts,
                         fb_kernel **out, int *bad_stmt, char *err, size_t errlen) {
  if (out) *out = NULL;
  if (bad_stmt) *bad_stmt = -1;
  if (!k || !k->name || !out) {
    fb_errf(err, errlen, "fb_kernel_adjoint: no kernel");
    return FB_EINVAL;
  }
  actx a;
  memset(&a, 0, sizeof a);
  a.k = k;
  a.g = g;
  a.err = err;
  a.errlen = errlen;
  a.bad = -1;
  fb_diags d;
  fb_diags_init(&d);
  int rc = fb_verify(k, &d);
  if (rc) {
    fb_errf(err, errlen, "cannot differentiate kernel '%s': it does not verify: %s", k->name,
            d.n ? d.v[0].msg : fb_strerror(rc));
    if (bad_stmt && d.n) *bad_stmt = d.v[0].stmt;
    fb_diags_free(&d);
    return rc;
  }
  fb_diags_free(&d);
  a.l = k->layout;
  a.ns = k->nstmts;
  if ((rc = check_map(&a)) != 0) return rc;
  /* emission may make several copies of a loop body per nesting level
   * before the cleanup: a bound on the work, not on the result */
  a.cap = max_stmts > 0 ? 16L * max_stmts + 4096 : FB_MAX_STATEMENTS_ANY;
  size_t ns = (size_t)a.ns + 1, nb = (size_t)k->nblocks + 1;
  a.active = calloc(ns, 1);
  a.cross = calloc(ns, 1);
  a.touched = calloc(ns, 1);
  a.blk = malloc(ns * sizeof(int32_t));
  a.owner = malloc(nb * sizeof(int32_t));
  a.map = malloc(ns * sizeof(int32_t));
  a.adj = malloc(ns * sizeof(int32_t));
  a.slot = malloc(ns * sizeof(int32_t));
  a.idxval = malloc(ns * sizeof(int32_t));
  a.replay = calloc(ns, 1);
  a.vars = malloc(ns * sizeof(int32_t));
  a.how = malloc(ns);
  if (!a.active || !a.cross || !a.touched || !a.blk || !a.owner || !a.map || !a.adj || !a.slot ||
      !a.idxval || !a.replay || !a.vars || !a.how)
    rc = FB_ENOMEM;
  for (size_t i = 0; !rc && i < ns; i++) a.blk[i] = a.map[i] = a.adj[i] = a.slot[i] = a.idxval[i] = -1;
  for (size_t i = 0; !rc && i < nb; i++) a.owner[i] = -1;
  if (!rc) rc = scan(&a);
  char *name = NULL;
  if (!rc) {
    size_t n = strlen(k->name);
    name = malloc(n + sizeof GRAD_SUFFIX);
    if (!name) rc = FB_ENOMEM;
    else {
      memcpy(name, k->name, n);
      memcpy(name + n, GRAD_SUFFIX, sizeof GRAD_SUFFIX);
      a.out = fb_kernel_new(k->layout, name, k->nparams, k->params, FB_T_VOID);
      if (!a.out) rc = FB_ENOMEM;
    }
  }
  if (!rc) {
    fb_builder_init(&a.b, a.out);
    const fb_block *b0 = &k->blocks[0];
    for (int i = b0->n - 1; !a.rc && i >= 0; i--) {
      int id = b0->ids[i];
      if (writes_grad(&a, id)) emit_region(&a, i);
    }
    rc = a.rc ? a.rc : a.b.err;
    if (rc == FB_EQUOTA)
      fb_errf(err, errlen,
              "cannot differentiate kernel '%s': its adjoint would have more than %ld statements "
              "(serial loops nested too deep or too many writes); split the kernel",
              k->name, a.cap);
  }
  if (!rc) {
    a.out = dce(a.out);
    if (!a.out) rc = FB_ENOMEM;
  }
  if (!rc && max_stmts > 0 && a.out->nstmts > max_stmts) {
    fb_errf(err, errlen,
            "cannot differentiate kernel '%s': its adjoint has %d statements, more than the "
            "limit of %d for a kernel; split the kernel",
            k->name, a.out->nstmts, max_stmts);
    rc = FB_EQUOTA;
  }
  if (!rc) {
    fb_diags_init(&d);
    if (fb_verify(a.out, &d) != 0) {
      fb_errf(err, errlen, "internal error: the adjoint of kernel '%s' does not verify: %s",
              k->name, d.n ? d.v[0].msg : "?");
      rc = FB_EINTERNAL;
    }
    fb_diags_free(&d);
  } else if (rc == FB_ENOMEM) {
    fb_errf(err, errlen, "cannot differentiate kernel '%s': out of memory", k->name);
  }
  if (bad_stmt) *bad_stmt = a.bad;
  free(name);
  free(a.active);
  free(a.cross);
  free(a.touched);
  free(a.blk);
  free(a.owner);
  free(a.map);
  free(a.adj);
  free(a.slot);
  free(a.idxval);
  free(a.replay);
  free(a.vars);
  free(a.how);
  if (rc) fb_kernel_free(a.out);
  else *out = a.out;
  return rc;
}

int fb_kernel_adjoint(const fb_kernel *k, const fb_grad_map *g, fb_kernel **out, char *err,
                      size_t errlen) {
  return fb_kernel_adjoint_ex(k, g, 0, out, NULL, err, errlen);
}
