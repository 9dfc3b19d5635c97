/* Task metadata from IR (the SFG's view of a task): which states a task
 * reads and writes — the value of each place, the mask and list of each
 * sparse container, the allocator of each pointer/dynamic container, gtmp
 * slots and return slots — and, per state, what the passes need to know:
 * element-wise access (fusion), covering unconditional stores (dead-store
 * elimination), activations and whether they are provably redundant
 * (demotion), whether accesses stay in bounds (deleting work must not lose
 * an FB_EBOUNDS report). Rules, per op:
 *  - a partial write is also an input: the SFG makes every write without
 *    FB_AF_FULL (resolved) read the state too;
 *  - activation on write and activate touch the mask of every sparse
 *    container up to the root, and the allocator of pointer/dynamic ones;
 *  - deactivate writes the masks and allocators at and below the cell, and
 *    the values of every place below it;
 *  - a struct_for reads the list (and the mask) of its deepest sparse
 *    container; listgen reads its parent's list and its mask.
 * Computed once per banked IR (bank.c caches it by handle). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "ir/arith.h"
#include "optimizer/sfg.h"

/* How a message starts that only an internal bug can produce: it alone may
 * name internal tasks or IR values, and it says what to report. */
#define FB_BUG "internal error (please report it, with the program): "

/* One access of one statement to one state, merged per state later. */
typedef struct raw {
  uint32_t key;
  uint8_t mode, ew;
  uint8_t implicit, clear, cover, full, full_ifr, wloop, removable, act;
  uint8_t inb;   /* INB_* */
  uint8_t obs;   /* a result depends on the state's value (load, used atomic) */
  uint8_t inloop; /* inside a serial loop of the task region */
  int seq;       /* walk order of the statement */
  uint64_t sig;
  int64_t ext;
} raw;

enum {
  INB_NO = 0,
  INB_YES,
  INB_RANGE
};

typedef struct mwalk {
  const fb_kernel *k;
  const fb_layout *l;
  fb_task_meta *m;
  raw *r;
  int nr, capr;
  uint8_t *pli;           /* per statement: 0 unknown, 1 pure in loop indices, 2 not, 3 busy */
  int stack[FB_MAX_BLOCK_DEPTH]; /* enclosing statements inside the task region */
  int depth;
  int parallel, in_loop;
  const fb_snode *loop_sn; /* struct_for SNode */
  uint32_t *udeps;
  int nudeps, capudeps;
  int32_t *act;
  uint8_t *actk;
  int nact, capact;
  int task_inb;           /* INB_* over every access */
  int64_t task_ext;
  int32_t *uses;          /* statement use counts */
  int seq;                /* statements visited so far */
  int oom;
} mwalk;

/* ---------------------------------------------------------------- helpers */

static int is_sparse(fb_snode_kind k) {
  return k == FB_SN_BITMASKED || k == FB_SN_POINTER || k == FB_SN_DYNAMIC;
}
static int allocates(fb_snode_kind k) { return k == FB_SN_POINTER || k == FB_SN_DYNAMIC; }

int fb_sparse_path(const fb_layout *l, int s, int *out, int max) {
  int tmp[64], n = 0;
  for (int d = 0; s >= 0 && s < l->nnodes && d < 64; d++, s = l->nodes[s].parent)
    if (is_sparse(l->nodes[s].kind) && n < 64) tmp[n++] = s;
  int c = 0;
  for (int i = n - 1; i >= 0 && c < max; i--) out[c++] = tmp[i];
  return c;
}

static int is_ancestor(const fb_layout *l, int a, int s) {
  for (int d = 0; s >= 0 && s < l->nnodes && d <= l->nnodes; d++, s = l->nodes[s].parent)
    if (s == a) return 1;
  return 0;
}

static int dense_path(const fb_layout *l, int s) {
  int p[8];
  return fb_sparse_path(l, s, p, 8) == 0;
}

const fb_meta_acc *fb_meta_find(const fb_task_meta *m, uint32_t key) {
  int lo = 0, hi = m->nacc - 1;
  while (lo <= hi) {
    int mid = (lo + hi) / 2;
    if (m->acc[mid].key == key) return &m->acc[mid];
    if (m->acc[mid].key < key) lo = mid + 1;
    else hi = mid - 1;
  }
  return NULL;
}

static uint64_t hmix(uint64_t h, uint64_t x) { return fb__hcombine(h, x); }

/* ---------------------------------------------------------------- evaluation */

/* Integer constant evaluation: what the interpreter computes, through the
 * IR's one definition of arithmetic (ir/arith.h). Values are int64 in
 * fb_value's form (i32 sign-extended, u32 zero-extended). */

/* Wrap an integer to the width and signedness of t. */
static int64_t wrap(fb_type t, uint64_t x) { return (int64_t)fb_arith_wrap(t, x); }

static int eval_binop(fb_op op, fb_type t, int64_t a, int64_t b, int64_t *out) {
  uint64_t r;
  if (fb_arith_int_binop(op, t, (uint64_t)a, (uint64_t)b, &r)) return -1;
  *out = (int64_t)r;
  return 0;
}

static int eval_unop(fb_op op, fb_type t, int64_t a, int64_t *out) {
  uint64_t r;
  if (fb_arith_int_unop(op, t, (uint64_t)a, &r)) return -1;
  *out = (int64_t)r;
  return 0;
}

static int eval_rec(const fb_kernel *k, int id, const uint64_t *args, int nargs, int64_t *out,
                    int depth) {
  if (id < 0 || id >= k->nstmts || depth > 64) return -1;
  const fb_stmt *s = &k->stmts[id];
  fb_type t = (fb_type)s->type;
  if (!fb_type_is_int(t)) return -1;
  int64_t a = 0, b = 0;
  switch (s->op) {
  case FB_OP_CONST: *out = wrap(t, s->imm.u); return 0;
  case FB_OP_ARG:
    if (!args || s->imm.i < 0 || s->imm.i >= nargs) return -1;
    *out = wrap(t, args[s->imm.i]);
    return 0;
  case FB_OP_CAST:
    if (!fb_type_is_int((fb_type)k->stmts[s->args[0]].type)) return -1;
    if (eval_rec(k, s->args[0], args, nargs, &a, depth + 1)) return -1;
    *out = wrap(t, (uint64_t)a);
    return 0;
  case FB_OP_NEG:
  case FB_OP_NOT:
  case FB_OP_ABS:
    if (eval_rec(k, s->args[0], args, nargs, &a, depth + 1)) return -1;
    return eval_unop((fb_op)s->op, t, a, out);
  default:
    if (s->nargs != 2) return -1;
    if (eval_rec(k, s->args[0], args, nargs, &a, depth + 1) ||
        eval_rec(k, s->args[1], args, nargs, &b, depth + 1))
      return -1;
    return eval_binop((fb_op)s->op, t, a, b, out);
  }
}

int fb_eval_int(const fb_kernel *k, int id, const uint64_t *args, int nargs, int64_t *out) {
  return eval_rec(k, id, args, nargs, out, 0);
}

/* ---------------------------------------------------------------- bounds */

/* In-bounds class of index operand `d` of statement s (SNode sn); *ext is
 * the extent a range must fit in for INB_RANGE. `task_loop` is the task's
 * parallel loop (bounds may depend on args). */
static int index_inb(const fb_kernel *k, const fb_snode *sn, int d, int opnd, int task_loop,
                     int64_t *ext) {
  const fb_layout *l = k->layout;
  int64_t shape = sn->shape[sn->dim_axis[d]];
  const fb_stmt *x = &k->stmts[opnd];
  int64_t v = 0;
  if (x->op != FB_OP_LOOP_INDEX) {
    if (fb_eval_int(k, opnd, NULL, 0, &v) == 0) return v >= 0 && v < shape ? INB_YES : INB_NO;
    return INB_NO;
  }
  const fb_stmt *lp = &k->stmts[x->args[0]];
  if (lp->op == FB_OP_STRUCT_FOR) {
    const fb_snode *t = &l->nodes[lp->snode];
    int ax = t->dim_axis[x->imm.i];
    return ax == sn->dim_axis[d] && t->shape[ax] <= shape ? INB_YES : INB_NO;
  }
  int64_t b = 0, e = 0;
  if (fb_eval_int(k, lp->args[0], NULL, 0, &b) == 0 &&
      fb_eval_int(k, lp->args[1], NULL, 0, &e) == 0)
    return (e <= b) || (b >= 0 && e <= shape) ? INB_YES : INB_NO;
  if (x->args[0] == task_loop) {
    *ext = shape;
    return INB_RANGE;
  }
  return INB_NO;
}

/* Number of index operands of a global access. */
static int nindices(const fb_kernel *k, const fb_stmt *s) {
  const fb_snode *sn = &k->layout->nodes[s->snode];
  int cls = fb_op_table[s->op].cls;
  if (cls == FB_OPC_APPEND || cls == FB_OPC_LENGTH) return sn->ndim > 0 ? sn->ndim - 1 : 0;
  return sn->ndim;
}

static int stmt_inb(const fb_kernel *k, int id, int task_loop, int64_t *ext) {
  const fb_stmt *s = &k->stmts[id];
  const fb_snode *sn = &k->layout->nodes[s->snode];
  int n = nindices(k, s), cls = INB_YES;
  if (fb_op_table[s->op].cls == FB_OPC_APPEND) return INB_NO; /* may find its list full */
  for (int d = 0; d < n && d < sn->ndim; d++) {
    int64_t e = 0;
    int c = index_inb(k, sn, d, s->args[d], task_loop, &e);
    if (c == INB_NO) return INB_NO;
    if (c == INB_RANGE) {
      if (cls != INB_RANGE || e < *ext) *ext = e;
      cls = INB_RANGE;
    }
  }
  return cls;
}

int fb_access_inbounds(const fb_kernel *k, int stmt) {
  int64_t e = 0;
  return stmt_inb(k, stmt, -1, &e) == INB_YES;
}

/* ---------------------------------------------------------------- raw accesses */

static raw *add_raw(mwalk *w, uint32_t key, int mode) {
  if (FB_GROW(w->r, w->nr, w->capr)) {
    w->oom = 1;
    return NULL;
  }
  raw *r = &w->r[w->nr++];
  memset(r, 0, sizeof *r);
  r->key = key;
  r->mode = (uint8_t)mode;
  r->inb = INB_YES;
  r->seq = w->seq;
  for (int i = 0; i < w->depth; i++) {
    int op = w->k ? w->k->stmts[w->stack[i]].op : -1;
    if (op == FB_OP_RANGE_FOR || op == FB_OP_WHILE) r->inloop = 1;
  }
  return r;
}

static void note_inb(mwalk *w, int cls, int64_t ext) {
  if (cls == INB_NO) w->task_inb = INB_NO;
  else if (cls == INB_RANGE && w->task_inb != INB_NO) {
    if (w->task_inb != INB_RANGE || ext < w->task_ext) w->task_ext = ext;
    w->task_inb = INB_RANGE;
  }
}

/* Masks (and allocators) of the sparse containers above and at `s`. */
static void mask_raws(mwalk *w, int s, int mode, int implicit, int activates) {
  int path[32];
  int n = fb_sparse_path(w->l, s, path, 32);
  for (int i = 0; i < n; i++) {
    raw *r = add_raw(w, FB_SKEY(FB_SK_MASK, path[i]), mode);
    if (!r) return;
    r->implicit = (uint8_t)implicit;
    r->act = (uint8_t)activates;
    if (activates && allocates(w->l->nodes[path[i]].kind)) {
      raw *a = add_raw(w, FB_SKEY(FB_SK_ALLOC, path[i]), FB_ACC_READ | FB_ACC_WRITE);
      if (!a) return;
      a->implicit = (uint8_t)implicit;
      a->act = 1;
    }
  }
}

/* ---------------------------------------------------------------- index classes */

static int is_loop_index(const fb_kernel *k, int id, int loop, int which) {
  const fb_stmt *s = &k->stmts[id];
  return s->op == FB_OP_LOOP_INDEX && s->args[0] == loop && s->imm.i == which;
}

/* Pure function of loop indices, consts and args (memoized). */
static int pli(mwalk *w, int id, int depth) {
  const fb_kernel *k = w->k;
  if (id < 0 || id >= k->nstmts || depth > 64) return 0;
  if (w->pli[id] == 1 || w->pli[id] == 2) return w->pli[id] == 1;
  if (w->pli[id] == 3) return 0;
  w->pli[id] = 3;
  const fb_stmt *s = &k->stmts[id];
  int ok = 0;
  if (s->op == FB_OP_CONST || s->op == FB_OP_ARG) {
    ok = 1;
  } else if (s->op == FB_OP_LOOP_INDEX) {
    const fb_stmt *lp = &k->stmts[s->args[0]];
    if (lp->op == FB_OP_STRUCT_FOR) ok = 1;
    else if (lp->op == FB_OP_PAR_FOR || lp->op == FB_OP_RANGE_FOR)
      ok = pli(w, lp->args[0], depth + 1) && pli(w, lp->args[1], depth + 1);
  } else if (fb_op_table[s->op].flags & FB_OPF_PURE) {
    ok = 1;
    for (int a = 0; a < s->nargs && ok; a++) ok = pli(w, s->args[a], depth + 1);
  }
  w->pli[id] = ok ? 1 : 2;
  return ok;
}

static int add_udep(mwalk *w, uint32_t key) {
  for (int i = 0; i < w->nudeps; i++)
    if (w->udeps[i] == key) return 0;
  if (FB_GROW(w->udeps, w->nudeps, w->capudeps)) return w->oom = 1;
  w->udeps[w->nudeps++] = key;
  return 0;
}

static int ew_loop_indices(mwalk *w, const fb_stmt *s, int n);

/* Structural signature of an assume_unique operand: deterministic within
 * an iteration and comparable between tasks. 0 when it is not one. */
static uint64_t usig(mwalk *w, int id, int depth) {
  const fb_kernel *k = w->k;
  if (id < 0 || id >= k->nstmts || depth > 32) return 0;
  const fb_stmt *s = &k->stmts[id];
  uint64_t h = hmix(hmix(0x51ed, s->op), s->type);
  if (s->op == FB_OP_CONST) return hmix(h, s->imm.u);
  if (s->op == FB_OP_LOOP_INDEX) return s->args[0] == w->m->loop ? hmix(h, (uint64_t)s->imm.i) : 0;
  if (s->op == FB_OP_LOAD) {
    if (!ew_loop_indices(w, s, k->layout->nodes[s->snode].ndim)) return 0;
    add_udep(w, FB_SKEY(FB_SK_VALUE, s->snode));
    return hmix(h, (uint64_t)s->snode);
  }
  if (s->op == FB_OP_ARG || !(fb_op_table[s->op].flags & FB_OPF_PURE)) return 0;
  h = hmix(h, s->imm.u);
  for (int a = 0; a < s->nargs; a++) {
    uint64_t x = usig(w, s->args[a], depth + 1);
    if (!x) return 0;
    h = hmix(h, x);
  }
  return h ? h : 1;
}

/* Indices are exactly the task loop's indices, in order. */
static int ew_loop_indices(mwalk *w, const fb_stmt *s, int n) {
  if (!w->parallel || !w->in_loop) return 0;
  int want = w->loop_sn ? w->loop_sn->ndim : 1;
  if (n != want) return 0;
  for (int d = 0; d < n; d++)
    if (!is_loop_index(w->k, s->args[d], w->m->loop, d)) return 0;
  return 1;
}

/* Element-wise class of a global access (parallel tasks only). */
static int ew_class(mwalk *w, const fb_stmt *s, int n, uint64_t *sig) {
  *sig = 0;
  if (!w->parallel || !w->in_loop) return FB_EW_NONE;
  if (ew_loop_indices(w, s, n)) {
    *sig = 1;
    return FB_EW_LOOP;
  }
  if (n == 1 && w->k->stmts[s->args[0]].op == FB_OP_ASSUME_UNIQUE) {
    *sig = usig(w, w->k->stmts[s->args[0]].args[0], 0);
    if (*sig) return FB_EW_UNIQUE;
  }
  return FB_EW_NONE;
}

/* The cell of `c` (a place's element or a container's cell) is one of the
 * cells the struct_for over T visits: same cell space and no sparse
 * container that T's path lacks. */
static int same_cells(const fb_layout *l, int c, const fb_snode *t) {
  const fb_snode *x = &l->nodes[c];
  if (x->space_axes != t->space_axes || x->ndim != t->ndim) return 0;
  for (int a = 0; a < FB_MAX_AXES; a++)
    if ((x->space_axes >> a & 1) && x->shape[a] != t->shape[a]) return 0;
  int px[32], pt[32];
  int nx = fb_sparse_path(l, c, px, 32), nt = fb_sparse_path(l, t->id, pt, 32);
  for (int i = 0; i < nx; i++) {
    int found = 0;
    for (int j = 0; j < nt && !found; j++) found = px[i] == pt[j];
    if (!found) return 0;
  }
  return 1;
}

/* Guards of the current statement are pure in loop indices. */
static int pure_guards(mwalk *w) {
  for (int i = 0; i < w->depth; i++) {
    const fb_stmt *g = &w->k->stmts[w->stack[i]];
    if (g->op == FB_OP_IF && pli(w, g->args[0], 0)) continue;
    if (g->op == FB_OP_RANGE_FOR && pli(w, g->args[0], 0) && pli(w, g->args[1], 0)) continue;
    return 0;
  }
  return 1;
}

static void note_activation(mwalk *w, int id, int cell, int n) {
  const fb_stmt *s = &w->k->stmts[id];
  int kind = FB_ACT_OTHER;
  if (w->parallel && w->in_loop && w->loop_sn && ew_loop_indices(w, s, n) &&
      same_cells(w->l, cell, w->loop_sn))
    kind = FB_ACT_SELF;
  if (kind == FB_ACT_OTHER && (!w->parallel || w->in_loop) && pure_guards(w)) {
    kind = FB_ACT_PURE;
    for (int d = 0; d < n && kind; d++)
      if (!pli(w, s->args[d], 0)) kind = FB_ACT_OTHER;
  }
  if (w->nact == w->capact) {
    int nc = w->capact ? w->capact * 2 : 8;
    int32_t *a = realloc(w->act, (size_t)nc * sizeof *a);
    if (a) w->act = a;
    uint8_t *ak = a ? realloc(w->actk, (size_t)nc) : NULL;
    if (!ak) {
      w->oom = 1;
      return;
    }
    w->actk = ak;
    w->capact = nc;
  }
  w->act[w->nact] = id;
  w->actk[w->nact++] = (uint8_t)kind;
}

/* ---------------------------------------------------------------- per op */

static void visit_value(mwalk *w, int id) {
  const fb_kernel *k = w->k;
  const fb_stmt *s = &k->stmts[id];
  const fb_snode *f = &w->l->nodes[s->snode];
  int cls = fb_op_table[s->op].cls;
  int n = nindices(k, s);
  int64_t ext = 0;
  int inb = stmt_inb(k, id, w->m->loop, &ext);
  note_inb(w, inb, ext);
  uint64_t sig = 0;
  int ew = ew_class(w, s, n, &sig);
  int na =
      s->op == FB_OP_STORE_NA || (s->op >= FB_OP_ATOMIC_ADD_NA && s->op <= FB_OP_ATOMIC_XOR_NA);
  int writes = cls != FB_OPC_GLOAD;
  int mode = cls == FB_OPC_GLOAD    ? FB_ACC_READ
             : cls == FB_OPC_GSTORE ? FB_ACC_WRITE
                                    : FB_ACC_READ | FB_ACC_WRITE;
  raw *r = add_raw(w, FB_SKEY(FB_SK_VALUE, s->snode), mode);
  if (!r) return;
  r->ew = (uint8_t)ew;
  r->sig = sig;
  r->inb = (uint8_t)inb;
  r->obs = (uint8_t)(cls == FB_OPC_GLOAD || (writes && cls != FB_OPC_GSTORE && w->uses[id] > 0));
  r->ext = inb == INB_RANGE ? ext : 0;
  if (writes) {
    int dense = dense_path(w->l, s->snode);
    r->removable = (uint8_t)(dense || na);
    r->wloop = (uint8_t)(w->parallel && ew == FB_EW_LOOP);
    if (cls == FB_OPC_GSTORE && w->depth == 0 && (!w->parallel || w->in_loop)) {
      if (!w->parallel && f->ndim == 0) {
        r->cover = r->full = 1;
      } else if (ew == FB_EW_LOOP) {
        r->cover = 1;
        if (dense && w->loop_sn && dense_path(w->l, w->loop_sn->id) &&
            same_cells(w->l, s->snode, w->loop_sn))
          r->full = 1;
        else if (dense && !w->loop_sn && f->ndim == 1) {
          r->full_ifr = 1;
          r->ext = f->shape[f->dim_axis[0]];
        }
      }
    }
  }
  if (!writes || na) {
    mask_raws(w, s->snode, FB_ACC_READ, 1, 0);
  } else {
    int path[32];
    if (fb_sparse_path(w->l, s->snode, path, 32) > 0) note_activation(w, id, s->snode, n);
    mask_raws(w, s->snode, FB_ACC_READ | FB_ACC_WRITE, 1, 1);
  }
}

/* is_active / activate / deactivate: `cell` is the container whose cell is
 * named (a place means its parent). */
static void visit_activity(mwalk *w, int id) {
  const fb_kernel *k = w->k;
  const fb_stmt *s = &k->stmts[id];
  const fb_snode *sn = &w->l->nodes[s->snode];
  int cell = sn->kind == FB_SN_PLACE ? sn->parent : sn->id;
  int64_t ext = 0;
  note_inb(w, stmt_inb(k, id, w->m->loop, &ext), ext);
  if (s->op == FB_OP_IS_ACTIVE) { /* unused (a demoted activate): orders only */
    mask_raws(w, cell, FB_ACC_READ, w->uses[id] == 0, 0);
    return;
  }
  if (s->op == FB_OP_ACTIVATE) {
    int path[32];
    if (fb_sparse_path(w->l, cell, path, 32) > 0) note_activation(w, id, s->snode, nindices(k, s));
    mask_raws(w, cell, FB_ACC_READ | FB_ACC_WRITE, 1, 1);
    return;
  }
  w->m->tflags |= FB_TF_DEACT;
  if (w->l->nodes[cell].parent >= 0) mask_raws(w, w->l->nodes[cell].parent, FB_ACC_READ, 0, 0);
  for (int i = 0; i < w->l->nnodes; i++) {
    if (!is_ancestor(w->l, cell, i)) continue;
    const fb_snode *d = &w->l->nodes[i];
    raw *r = NULL;
    if (d->kind == FB_SN_PLACE) r = add_raw(w, FB_SKEY(FB_SK_VALUE, i), FB_ACC_READ | FB_ACC_WRITE);
    else if (is_sparse(d->kind)) r = add_raw(w, FB_SKEY(FB_SK_MASK, i), FB_ACC_READ | FB_ACC_WRITE);
    if (r) r->clear = 1;
    if (allocates(d->kind) && (r = add_raw(w, FB_SKEY(FB_SK_ALLOC, i), FB_ACC_READ | FB_ACC_WRITE)))
      r->clear = 1;
  }
}

/* append / length on a place under a dynamic container. */
static void visit_dynamic(mwalk *w, int id) {
  const fb_kernel *k = w->k;
  const fb_stmt *s = &k->stmts[id];
  int dyn = w->l->nodes[s->snode].parent;
  int64_t ext = 0;
  note_inb(w, stmt_inb(k, id, w->m->loop, &ext), ext);
  int up = w->l->nodes[dyn].parent;
  if (s->op == FB_OP_LENGTH) {
    add_raw(w, FB_SKEY(FB_SK_MASK, dyn), FB_ACC_READ);
    if (up >= 0) mask_raws(w, up, FB_ACC_READ, 1, 0);
    return;
  }
  add_raw(w, FB_SKEY(FB_SK_VALUE, s->snode), FB_ACC_READ | FB_ACC_WRITE);
  add_raw(w, FB_SKEY(FB_SK_MASK, dyn), FB_ACC_READ | FB_ACC_WRITE);
  add_raw(w, FB_SKEY(FB_SK_ALLOC, dyn), FB_ACC_READ | FB_ACC_WRITE);
  if (up >= 0) mask_raws(w, up, FB_ACC_READ | FB_ACC_WRITE, 1, 1);
}

static void visit_gtmp(mwalk *w, const fb_stmt *s) {
  uint32_t key = FB_SKEY(FB_SK_GTMP, s->imm.i / 8);
  if (s->op == FB_OP_GTMP_LOAD) {
    raw *r = add_raw(w, key, FB_ACC_READ);
    if (r) r->obs = 1;
    return;
  }
  raw *r = add_raw(w, key, FB_ACC_WRITE);
  if (!r) return;
  r->removable = 1;
  if (!w->parallel && w->depth == 0) r->cover = r->full = 1;
}

static void visit_list(mwalk *w, const fb_stmt *s) {
  int p = s->snode, path[32];
  if (s->op == FB_OP_CLEAR_LIST) {
    raw *r = add_raw(w, FB_SKEY(FB_SK_LIST, p), FB_ACC_WRITE);
    if (r) r->cover = r->full = 1;
  } else if (s->op == FB_OP_LISTGEN) {
    int n = fb_sparse_path(w->l, w->l->nodes[p].parent, path, 32);
    if (n > 0) add_raw(w, FB_SKEY(FB_SK_LIST, path[n - 1]), FB_ACC_READ);
    add_raw(w, FB_SKEY(FB_SK_MASK, p), FB_ACC_READ);
    add_raw(w, FB_SKEY(FB_SK_LIST, p), FB_ACC_READ | FB_ACC_WRITE);
  } else {
    for (int i = 0; i < w->l->nnodes; i++)
      if (allocates(w->l->nodes[i].kind) && is_ancestor(w->l, p, i))
        add_raw(w, FB_SKEY(FB_SK_ALLOC, i), FB_ACC_READ | FB_ACC_WRITE);
  }
}

static void walk_block(mwalk *w, int blk);

static void visit(mwalk *w, int id) {
  const fb_stmt *s = &w->k->stmts[id];
  w->seq++;
  switch (fb_op_table[s->op].cls) {
  case FB_OPC_GLOAD:
  case FB_OPC_GSTORE:
  case FB_OPC_ATOMIC:
  case FB_OPC_IATOMIC: visit_value(w, id); break;
  case FB_OPC_SPARSE: visit_activity(w, id); break;
  case FB_OPC_APPEND:
  case FB_OPC_LENGTH: visit_dynamic(w, id); break;
  case FB_OPC_GTMP: visit_gtmp(w, s); break;
  case FB_OPC_RET:
    add_raw(w, FB_SKEY(FB_SK_RET, s->imm.i), FB_ACC_WRITE);
    w->m->tflags |= FB_TF_RET;
    break;
  case FB_OPC_RAND: w->m->tflags |= FB_TF_RAND; break;
  case FB_OPC_LOOP: w->m->tflags |= FB_TF_WHILE; break;
  case FB_OPC_JUMP: w->m->tflags |= FB_TF_JUMP; break;
  case FB_OPC_LIST: visit_list(w, s); break;
  default: break;
  }
  if (s->body < 0 && s->orelse < 0) return;
  if (w->depth >= FB_MAX_BLOCK_DEPTH) {
    w->oom = 1;
    return;
  }
  w->stack[w->depth++] = id;
  if (s->body >= 0) walk_block(w, s->body);
  if (s->orelse >= 0) walk_block(w, s->orelse);
  w->depth--;
}

static void walk_block(mwalk *w, int blk) {
  const fb_block *b = &w->k->blocks[blk];
  for (int i = 0; i < b->n && !w->oom; i++) visit(w, b->ids[i]);
}

/* ---------------------------------------------------------------- shape */

static int classify(mwalk *w, char *err, size_t errlen) {
  const fb_kernel *k = w->k;
  fb_task_meta *m = w->m;
  const fb_block *b0 = &k->blocks[0];
  m->kind = FB_TASK_SERIAL;
  m->loop = m->snode = m->iter = m->begin = m->end = -1;
  m->list_key = FB_SKEY_NONE;
  for (int i = 0; i < b0->n; i++) {
    const fb_stmt *s = &k->stmts[b0->ids[i]];
    if (s->op != FB_OP_PAR_FOR && s->op != FB_OP_STRUCT_FOR) continue;
    if (m->loop >= 0) {
      fb_errf(err, errlen, FB_BUG "task IR %s has more than one parallel loop", k->name);
      return FB_EINVAL;
    }
    m->loop = b0->ids[i];
    m->kind = s->op == FB_OP_PAR_FOR ? FB_TASK_RANGE_FOR : FB_TASK_STRUCT_FOR;
  }
  if (m->loop < 0) {
    if (b0->n == 1 && fb_op_table[k->stmts[b0->ids[0]].op].cls == FB_OPC_LIST) {
      const fb_stmt *s = &k->stmts[b0->ids[0]];
      m->kind = s->op == FB_OP_CLEAR_LIST ? FB_TASK_CLEAR_LIST
                : s->op == FB_OP_LISTGEN  ? FB_TASK_LISTGEN
                                          : FB_TASK_GC;
      m->snode = s->snode;
    }
    m->tflags |= FB_TF_FUSIBLE;
    return 0;
  }
  const fb_stmt *lp = &k->stmts[m->loop];
  w->parallel = 1;
  if (lp->op == FB_OP_PAR_FOR) {
    m->begin = lp->args[0];
    m->end = lp->args[1];
  } else {
    m->snode = lp->snode;
    w->loop_sn = &w->l->nodes[lp->snode];
    m->iter = w->loop_sn->kind == FB_SN_PLACE ? w->loop_sn->parent : lp->snode;
  }
  int fusible = b0->ids[b0->n - 1] == m->loop;
  for (int i = 0; i < b0->n - 1 && fusible; i++) {
    const fb_stmt *s = &k->stmts[b0->ids[i]];
    fusible = (fb_op_table[s->op].flags & FB_OPF_PURE) || s->op == FB_OP_GTMP_LOAD;
  }
  if (fusible) m->tflags |= FB_TF_FUSIBLE;
  return 0;
}

/* The struct_for's list and mask reads. */
static void loop_raws(mwalk *w) {
  if (!w->loop_sn) return;
  int path[32];
  int n = fb_sparse_path(w->l, w->loop_sn->id, path, 32);
  if (n == 0) return;
  w->m->list_key = FB_SKEY(FB_SK_LIST, path[n - 1]);
  add_raw(w, w->m->list_key, FB_ACC_READ);
  raw *r = add_raw(w, FB_SKEY(FB_SK_MASK, path[n - 1]), FB_ACC_READ);
  if (r) r->implicit = 1;
}

static void walk_task(mwalk *w) {
  const fb_kernel *k = w->k;
  const fb_block *b0 = &k->blocks[0];
  if (!w->parallel) {
    walk_block(w, 0);
    return;
  }
  for (int i = 0; i < b0->n && !w->oom; i++) {
    int id = b0->ids[i];
    if (id != w->m->loop) {
      visit(w, id);
      continue;
    }
    loop_raws(w);
    w->in_loop = 1;
    walk_block(w, k->stmts[id].body);
    w->in_loop = 0;
  }
}

/* ---------------------------------------------------------------- merging */

static int cmp_raw(const void *a, const void *b) {
  uint32_t x = ((const raw *)a)->key, y = ((const raw *)b)->key;
  return x < y ? -1 : x > y;
}

/* Merge the raw accesses of one state (r[0..n)) into one. */
static void merge(const raw *r, int n, fb_meta_acc *a, int parallel) {
  memset(a, 0, sizeof *a);
  a->key = r[0].key;
  int implicit = 1, wloop = 1, removable = 1, writes = 0, inb = INB_YES, same_ew = 1;
  int wsame = 1, wfirst = -1; /* element-wise class of the writes alone */
  int cover = 0, full = 0, full_ifr = 0, clear = 0, act = 0, inloop = 0;
  int last_obs = -1, first_write = -1;
  int64_t ext = 0;
  for (int i = 0; i < n; i++) {
    inloop |= r[i].inloop;
    if (r[i].obs && r[i].seq > last_obs) last_obs = r[i].seq;
    if ((r[i].mode & FB_ACC_WRITE) && (first_write < 0 || r[i].seq < first_write))
      first_write = r[i].seq;
    a->mode |= r[i].mode;
    implicit &= r[i].implicit;
    clear |= r[i].clear;
    cover |= r[i].cover;
    full |= r[i].full;
    full_ifr |= r[i].full_ifr;
    act |= r[i].act;
    if (r[i].ew != r[0].ew || r[i].sig != r[0].sig) same_ew = 0;
    if (r[i].mode & FB_ACC_WRITE) {
      if (wfirst < 0) wfirst = i;
      else if (r[i].ew != r[wfirst].ew || r[i].sig != r[wfirst].sig) wsame = 0;
      writes = 1;
      wloop &= r[i].wloop;
      removable &= r[i].removable;
    }
    if (r[i].inb == INB_NO) inb = INB_NO;
    else if (r[i].inb == INB_RANGE && inb != INB_NO) inb = INB_RANGE;
    if (r[i].ext && (!ext || r[i].ext < ext)) ext = r[i].ext;
  }
  a->ew = same_ew ? r[0].ew : FB_EW_NONE;
  a->sig = same_ew ? r[0].sig : 0;
  a->wew = wfirst >= 0 && wsame ? r[wfirst].ew : FB_EW_NONE;
  a->wsig = a->wew != FB_EW_NONE ? r[wfirst].sig : 0;
  if (FB_SKEY_KIND(a->key) != FB_SK_VALUE) a->ew = a->wew = FB_EW_NONE;
  a->ext = ext;
  uint32_t f = 0;
  if (implicit && !clear) f |= FB_AF_IMPLICIT;
  if (clear) f |= FB_AF_CLEAR;
  if (act) f |= FB_AF_ACTIVATES;
  if (!(a->mode & FB_ACC_READ)) {
    if (cover) f |= FB_AF_COVER;
    if (full) f |= FB_AF_FULL;
    if (full_ifr) f |= FB_AF_FULL_IFRANGE;
  }
  if (writes && wloop) f |= FB_AF_WLOOP;
  if (writes && removable) f |= FB_AF_REMOVABLE;
  /* the task never reads back its own write: nothing observes the state
     after the first write (and no loop repeats an observation after it);
     in a parallel task, every access is element-wise as well */
  if (last_obs < 0 || (last_obs < first_write && !inloop && (!parallel || a->ew != FB_EW_NONE)))
    f |= FB_AF_NOREADBACK;
  if (inb == INB_YES) f |= FB_AF_INB;
  else if (inb == INB_RANGE) f |= FB_AF_INB_IFRANGE;
  a->flags = f;
}

static int finish(mwalk *w) {
  fb_task_meta *m = w->m;
  if (w->nr) qsort(w->r, (size_t)w->nr, sizeof *w->r, cmp_raw);
  int nst = 0;
  for (int i = 0; i < w->nr; i++)
    if (i == 0 || w->r[i].key != w->r[i - 1].key) nst++;
  m->acc = calloc((size_t)(nst ? nst : 1), sizeof *m->acc);
  if (!m->acc) return FB_ENOMEM;
  for (int i = 0; i < w->nr;) {
    int j = i;
    while (j < w->nr && w->r[j].key == w->r[i].key) j++;
    merge(w->r + i, j - i, &m->acc[m->nacc++], w->parallel);
    i = j;
  }
  if (w->task_inb == INB_YES) m->tflags |= FB_TF_INB;
  else if (w->task_inb == INB_RANGE) {
    m->tflags |= FB_TF_INB_IFRANGE;
    m->inb_ext = w->task_ext;
  }
  /* demotion classes need the whole task: deactivation or jumps spoil them */
  for (int i = 0; i < w->nact; i++) {
    if (w->actk[i] == FB_ACT_SELF && (m->tflags & FB_TF_DEACT)) w->actk[i] = FB_ACT_OTHER;
    if (w->actk[i] == FB_ACT_PURE && (m->tflags & (FB_TF_DEACT | FB_TF_JUMP | FB_TF_WHILE)))
      w->actk[i] = FB_ACT_OTHER;
  }
  m->act = w->act;
  m->act_kind = w->actk;
  m->nact = w->nact;
  w->act = NULL;
  w->actk = NULL;
  m->udeps = w->udeps;
  m->nudeps = w->nudeps;
  w->udeps = NULL;
  m->nstmts = w->k ? fb_kernel_count_stmts(w->k) : 0;
  m->bytes =
      sizeof *m + (size_t)m->nacc * sizeof *m->acc + (size_t)m->nact * 5 + (size_t)m->nudeps * 4;
  return 0;
}

int fb_meta_compute(const fb_kernel *k, fb_task_meta **out, char *err, size_t errlen) {
  *out = NULL;
  mwalk w;
  memset(&w, 0, sizeof w);
  w.k = k;
  w.l = k->layout;
  w.task_inb = INB_YES;
  w.m = calloc(1, sizeof *w.m);
  w.pli = calloc((size_t)k->nstmts + 1, 1);
  w.uses = fb_ir_use_counts(k);
  int rc = 0;
  if (!w.m || !w.pli || !w.uses) rc = FB_ENOMEM;
  if (!rc) rc = classify(&w, err, errlen);
  if (!rc) {
    walk_task(&w);
    rc = w.oom ? FB_ENOMEM : finish(&w);
  }
  free(w.r);
  free(w.pli);
  free(w.uses);
  free(w.udeps);
  free(w.act);
  free(w.actk);
  if (rc) {
    if (rc == FB_ENOMEM) fb_errf(err, errlen, "task metadata: out of memory");
    fb_meta_free(w.m);
    return rc;
  }
  *out = w.m;
  return 0;
}

void fb_meta_free(fb_task_meta *m) {
  if (!m) return;
  free(m->acc);
  free(m->udeps);
  free(m->act);
  free(m->act_kind);
  free(m);
}

/* A host write: the field's values (and masks and allocators up to the
 * root, as activation on write), or for a container everything at and
 * below it. No IR: the node only marks new versions. */
int fb_meta_host(const fb_layout *l, int snode, fb_task_meta **out, char *err, size_t errlen) {
  *out = NULL;
  mwalk w;
  memset(&w, 0, sizeof w);
  w.l = l;
  w.task_inb = INB_YES;
  w.m = calloc(1, sizeof *w.m);
  if (!w.m) return FB_ENOMEM;
  w.m->kind = FB_TASK_SERIAL;
  w.m->loop = w.m->snode = w.m->iter = w.m->begin = w.m->end = -1;
  w.m->list_key = FB_SKEY_NONE;
  const fb_snode *sn = &l->nodes[snode];
  int cell = sn->kind == FB_SN_PLACE ? sn->parent : snode;
  mask_raws(&w, cell, FB_ACC_READ | FB_ACC_WRITE, 0, 1);
  for (int i = 0; i < l->nnodes; i++) {
    if (i != snode && !(sn->kind != FB_SN_PLACE && is_ancestor(l, snode, i))) continue;
    const fb_snode *d = &l->nodes[i];
    if (d->kind == FB_SN_PLACE) add_raw(&w, FB_SKEY(FB_SK_VALUE, i), FB_ACC_READ | FB_ACC_WRITE);
    else if (is_sparse(d->kind) && i != cell)
      add_raw(&w, FB_SKEY(FB_SK_MASK, i), FB_ACC_READ | FB_ACC_WRITE);
    if (allocates(d->kind) && i != cell)
      add_raw(&w, FB_SKEY(FB_SK_ALLOC, i), FB_ACC_READ | FB_ACC_WRITE);
  }
  int rc = w.oom ? FB_ENOMEM : finish(&w);
  free(w.r);
  free(w.udeps);
  free(w.act);
  free(w.actk);
  if (rc) {
    fb_errf(err, errlen, "host write: out of memory");
    fb_meta_free(w.m);
    return rc;
  }
  /* a host write may clear cells (deactivation from the host) */
  for (int i = 0; i < w.m->nacc; i++) w.m->acc[i].flags |= FB_AF_CLEAR;
  *out = w.m;
  return 0;
}
