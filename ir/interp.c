/* The reference interpreter: runs kernel IR statement by statement on host
 * memory it owns (one flat, zero-initialised, row-major array per field). It
 * is deliberately slow and literal: it is the oracle the code generator is
 * tested against, so every rule in the semantics block of include/fusebox/ir.h
 * is spelled out literally; what each value op computes is ir/arith.c, which
 * the optimizer and the front end share, with f32 math done in float.
 *
 * Safety: every run starts with fb_verify (FB_EVERIFY when it refuses), and
 * the interpreter still checks every operand, block, SNode and slot where it
 * is used, so that IR it cannot run stops with FB_EINVAL instead of crashing
 * (the message names the statement; see fb_interp_errmsg).
 *
 * Sparse SNodes (bitmasked, pointer, dynamic, nested in any way) follow
 * docs/sparse.md directly: the interpreter keeps the activity of every cell
 * of each sparse container on the host (see "sparse activity" below), reads
 * of inactive cells give 0, writes activate, deactivation zeroes the values
 * below the cell in the flat field arrays, and struct_for walks a snapshot
 * of the active cells. There is no allocator and no memory limit here; the
 * list tasks (clear_list, listgen, gc) are no-ops.
 *
 * fb_stmt.part is ignored: the interpreter is the differential tester's
 * oracle for values and return codes, and runs each launch unfused; which
 * launch an error is blamed on is checked engine against engine (async
 * against sync; docs/optimizer.md, "Blame in fused tasks"). */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>

#include "arith.h"
#include "ir_internal.h"

#define INTERP_SCRATCH_MAX ((size_t)1 << 30) /* gtmp bytes limit */

/* A sparse container on the path of some SNode s, with the number of s's
 * cells per cell of it along each axis (fb_layout_stride). */
typedef struct cover {
  int node;
  int64_t stride[FB_MAX_AXES];
} cover;

struct fb_interp {
  const fb_layout *l;
  uint64_t seed;
  uint64_t launches; /* runs executed so far: the next run's launch number */
  void **fields;     /* per SNode id: a place's flat storage, NULL otherwise */
  cover **covers;    /* per SNode id: the sparse containers on its path, root first */
  int *ncovers;
  uint64_t **mask;   /* per bitmasked / pointer SNode: a bit per cell of its space */
  int64_t **len;     /* per dynamic SNode: a length per list (parent's cell) */
  uint8_t *scratch;  /* gtmp buffer, zero-filled as it grows */
  size_t scratch_bytes;
  uint64_t max_steps; /* step budget of one run; 0: none */
  char err[256];
};

/* How a block ended: fell through, or left by break / continue. Errors are
 * negative FB_E* codes. */
enum {
  FLOW_NEXT = 0,
  FLOW_BREAK = 1,
  FLOW_CONTINUE = 2
};

typedef struct run {
  fb_interp *in;
  const fb_kernel *k;
  const fb_layout *l;
  fb_value *vals;                /* per statement: last value; an alloca's content */
  int32_t (*lidx)[FB_MAX_AXES];  /* per loop statement: its current indices */
  const fb_value *args;          /* converted to the parameter types */
  fb_value ret;                  /* return slot 0 */
  uint64_t launch, iter, count;  /* rand() key */
  uint64_t launch0;              /* the run's launch number (rand_seq offsets it) */
  int bounds;                    /* FB_EBOUNDS once an access was skipped */
  int full;                      /* ... or an append found its list full */
  int depth;
  uint64_t steps;                /* statements and loop iterations so far */
} run;

/* ---------------------------------------------------------------- errors */

static int failv(fb_interp *in, int code, const char *fmt, va_list ap) {
  fb_verrf(in->err, sizeof in->err, fmt, ap);
  return code;
}

#if defined(__GNUC__)
#define INTERP_PRINTF(f, a) __attribute__((format(printf, f, a)))
#else
#define INTERP_PRINTF(f, a)
#endif

INTERP_PRINTF(3, 4) static int fail(fb_interp *in, int code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  failv(in, code, fmt, ap);
  va_end(ap);
  return code;
}

static const char *op_name(unsigned op) { return op < FB_OP__COUNT ? fb_op_table[op].name : "?"; }

/* An error at statement id, reported as "%<id> <op>: <what>". */
INTERP_PRINTF(4, 5) static int bad(run *r, int code, int id, const char *fmt, ...) {
  char what[200];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(what, sizeof what, fmt, ap);
  va_end(ap);
  return fail(r->in, code, "kernel %s: %%%d %s: %s", r->k->name ? r->k->name : "?", id,
              op_name(r->k->stmts[id].op), what);
}

/* Count one step (a statement, or a loop iteration) of statement id against
 * the run's budget: FB_EQUOTA once it is spent. */
static int step(run *r, int id) {
  uint64_t max = r->in->max_steps;
  if (max && ++r->steps > max)
    return bad(r, FB_EQUOTA, id, "kernel exceeded its step budget of %llu steps",
               (unsigned long long)max);
  return 0;
}

/* Not yet declared in include/fusebox/ir.h: the message of the last failed
 * run, and the launch number the next run keys rand() with (so that a
 * kernel's tasks can be run one by one as parts of one launch). */
const char *fb_interp_errmsg(const fb_interp *in) { return in ? in->err : ""; }

void fb_interp_set_launch(fb_interp *in, uint64_t launch) {
  if (in) in->launches = launch;
}

void fb_interp_set_step_limit(fb_interp *in, uint64_t max_steps) {
  if (in) in->max_steps = max_steps;
}

/* ---------------------------------------------------------------- values */

static fb_value zero_of(fb_type t) {
  fb_value v;
  v.type = t;
  v.v.u = 0;
  return v;
}

/* An integer or bool of type t from raw bits, wrapped to t's width. */
static fb_value mk_int(fb_type t, uint64_t bits) {
  fb_value v = zero_of(t);
  v.v.u = fb_arith_wrap(t, bits);
  return v;
}

static fb_value mk_f32(float f) { return fb_value_f32(f); }
static fb_value mk_f64(double f) { return fb_value_f64(f); }

static int is_num(fb_type t) { return fb_type_is_int(t) || fb_type_is_float(t); }
static int valid_type(int t) { return t > FB_T_VOID && t < FB_T__COUNT; }

/* ---------------------------------------------------------------- operands */

static int stmt_ok(const run *r, int id) { return id >= 0 && id < r->k->nstmts; }

/* The statement id of operand i of statement id, checked. */
static int operand_id(run *r, int id, int i, int *out) {
  const fb_stmt *s = &r->k->stmts[id];
  if (i >= s->nargs || i >= FB_MAX_ARGS) return bad(r, FB_EINVAL, id, "missing operand %d", i);
  if (!stmt_ok(r, s->args[i]))
    return bad(r, FB_EINVAL, id, "operand %d refers to %%%d, not a statement", i, (int)s->args[i]);
  *out = s->args[i];
  return 0;
}

/* The value of operand i (which must produce a value). */
static int operand(run *r, int id, int i, fb_value *v) {
  int a = -1, rc = operand_id(r, id, i, &a);
  if (rc) return rc;
  if (!valid_type(r->vals[a].type))
    return bad(r, FB_EINVAL, id, "operand %d (%%%d) has no value", i, a);
  *v = r->vals[a];
  return 0;
}

/* An operand that must be an i32 (indices, range bounds). */
static int operand_i32(run *r, int id, int i, int64_t *out) {
  fb_value v = {0};
  int rc = operand(r, id, i, &v);
  if (rc) return rc;
  if (v.type != FB_T_I32) return bad(r, FB_EINVAL, id, "operand %d must be i32", i);
  *out = v.v.i;
  return 0;
}

static int result_type(run *r, int id, fb_type want) {
  fb_type t = (fb_type)r->k->stmts[id].type;
  if (t != want)
    return bad(r, FB_EINVAL, id, "result type %s, expected %s", fb_type_name(t),
               fb_type_name(want));
  return 0;
}

/* ---------------------------------------------------------------- sparse activity
 *
 * Host-side activity state, one entry per sparse container P:
 *   bitmasked, pointer: one bit per cell of P's cell space;
 *   dynamic:            one length per list, a list being a cell of P's
 *                       parent's cell space; its cell n is active when
 *                       n < length.
 * Cell spaces are addressed by global indices per axis (gi[a], 0 on axes a
 * node does not use) and numbered row-major over the axes i..l with each
 * node's shape, which is also how a field's flat array is numbered.
 * A cell of SNode S at gi is active when every sparse container P on the
 * path from the root down to S (S included) has its covering cell active;
 * the covering cell is gi[a] / stride(P, S, a) on each axis.
 * Invariants (kept by activate_cell and deactivate_cell), which make the flat
 * field arrays read 0 at inactive cells as fb_interp_field promises:
 *   - every value of a place below an inactive cell is 0;
 *   - every cell of a sparse container below an inactive cell is inactive.
 */

static int sparse_kind(fb_snode_kind k) {
  return k == FB_SN_BITMASKED || k == FB_SN_POINTER || k == FB_SN_DYNAMIC;
}

/* Cells of a node's cell space (a place's: its elements). */
static int64_t space_cells(const fb_snode *s) {
  int64_t n = 1;
  for (int a = 0; a < FB_MAX_AXES; a++) n *= s->shape[a];
  return n;
}

/* Row-major number of the cell at gi in s's cell space. */
static int64_t cell_number(const fb_snode *s, const int64_t *gi) {
  int64_t x = 0;
  for (int a = 0; a < FB_MAX_AXES; a++) x = x * s->shape[a] + gi[a];
  return x;
}

/* The inverse: global indices of cell number x of s. */
static void cell_indices(const fb_snode *s, int64_t x, int64_t *gi) {
  for (int a = FB_MAX_AXES - 1; a >= 0; a--) {
    gi[a] = x % s->shape[a];
    x /= s->shape[a];
  }
}

/* The one axis a dynamic SNode splits. */
static int dyn_axis(const fb_snode *d) {
  for (int a = 0; a < FB_MAX_AXES; a++)
    if (d->axes & (1u << a)) return a;
  return 0;
}

/* The list of dynamic d holding its cell gp (its parent's cell number), and
 * the cell's position n in that list. */
static int64_t list_of(const fb_interp *in, const fb_snode *d, const int64_t *gp, int64_t *n) {
  int ax = dyn_axis(d);
  int64_t gq[FB_MAX_AXES];
  memcpy(gq, gp, sizeof gq);
  gq[ax] = gp[ax] / d->size[ax];
  *n = gp[ax] % d->size[ax];
  return cell_number(&in->l->nodes[d->parent], gq);
}

static int bit_get(const uint64_t *m, int64_t x) { return (int)(m[x >> 6] >> (x & 63)) & 1; }
static void bit_set(uint64_t *m, int64_t x) { m[x >> 6] |= (uint64_t)1 << (x & 63); }
static void bit_clear(uint64_t *m, int64_t x) { m[x >> 6] &= ~((uint64_t)1 << (x & 63)); }

/* Is sparse container p's own cell gp (in p's cell space) marked active? */
static int own_cell_on(const fb_interp *in, const fb_snode *p, const int64_t *gp) {
  if (p->kind == FB_SN_DYNAMIC) {
    int64_t n, list = list_of(in, p, gp, &n);
    return n < in->len[p->id][list];
  }
  return bit_get(in->mask[p->id], cell_number(p, gp));
}

/* The covering cell of path entry c for the cell gi of the node below. */
static void cover_cell(const cover *c, const int64_t *gi, int64_t *gp) {
  for (int a = 0; a < FB_MAX_AXES; a++) gp[a] = gi[a] / c->stride[a];
}

/* Activity of the cell gi of SNode s (a place: its parent's cell). */
static int cell_active(const fb_interp *in, int s, const int64_t *gi) {
  int64_t gp[FB_MAX_AXES];
  for (int c = 0; c < in->ncovers[s]; c++) {
    cover_cell(&in->covers[s][c], gi, gp);
    if (!own_cell_on(in, &in->l->nodes[in->covers[s][c].node], gp)) return 0;
  }
  return 1;
}

/* ---------------------------------------------------------------- zeroing below a box
 * A box is a range [lo, hi) per axis of global indices in some node's cell
 * space. Boxes are visited as runs along the last axis. */

typedef void (*span_fn)(void *ctx, int64_t first, int64_t count);

static void for_box(const fb_snode *s, const int64_t *lo, const int64_t *hi, span_fn f, void *ctx) {
  const int64_t *sh = s->shape;
  for (int a = 0; a < FB_MAX_AXES; a++)
    if (lo[a] >= hi[a]) return;
  for (int64_t i = lo[0]; i < hi[0]; i++)
    for (int64_t j = lo[1]; j < hi[1]; j++)
      for (int64_t k = lo[2]; k < hi[2]; k++)
        f(ctx, ((i * sh[1] + j) * sh[2] + k) * sh[3] + lo[3], hi[3] - lo[3]);
}

typedef struct span_ctx {
  uint8_t *bytes;  /* field storage */
  size_t elem;     /* its element size */
  uint64_t *mask;  /* or activity bits */
  int64_t *len;    /* or list lengths */
} span_ctx;

static void zero_span(void *ctx, int64_t first, int64_t count) {
  span_ctx *c = ctx;
  if (c->bytes) memset(c->bytes + (size_t)first * c->elem, 0, (size_t)count * c->elem);
  for (int64_t x = first; c->mask && x < first + count; x++) bit_clear(c->mask, x);
  for (int64_t x = first; c->len && x < first + count; x++) c->len[x] = 0;
}

/* The box of node n's cell space below the box [lo, hi) of ancestor p's
 * (n == p gives the same box). */
static void box_below(const fb_layout *l, int p, int n, const int64_t *lo, const int64_t *hi,
                      int64_t *nlo, int64_t *nhi) {
  for (int a = 0; a < FB_MAX_AXES; a++) {
    int64_t st = fb_layout_stride(l, p, n, a);
    nlo[a] = lo[a] * st;
    nhi[a] = hi[a] * st;
  }
}

/* Zero node n (a descendant of p) and everything below it, inside the box
 * [lo, hi) of p's cell space: place values, activity bits, list lengths. */
static void zero_node(fb_interp *in, int p, int n, const int64_t *lo, const int64_t *hi) {
  const fb_snode *s = &in->l->nodes[n];
  int64_t nlo[FB_MAX_AXES], nhi[FB_MAX_AXES];
  span_ctx c = {NULL, 0, NULL, NULL};
  if (s->kind == FB_SN_PLACE) {
    c.bytes = in->fields[n];
    c.elem = fb_type_size(s->type);
  } else if (s->kind == FB_SN_BITMASKED || s->kind == FB_SN_POINTER) {
    c.mask = in->mask[n];
  }
  if (c.bytes || c.mask) {
    box_below(in->l, p, n, lo, hi, nlo, nhi);
    for_box(s, nlo, nhi, zero_span, &c);
  }
  if (s->kind == FB_SN_DYNAMIC) { /* lengths live in the parent's cell space */
    c.len = in->len[n];
    box_below(in->l, p, s->parent, lo, hi, nlo, nhi);
    for_box(&in->l->nodes[s->parent], nlo, nhi, zero_span, &c);
  }
  for (int i = 0; i < s->nchildren; i++) zero_node(in, p, s->children[i], lo, hi);
}

/* Zero everything strictly below the box [lo, hi) of p's cell space. */
static void zero_below(fb_interp *in, int p, const int64_t *lo, const int64_t *hi) {
  const fb_snode *s = &in->l->nodes[p];
  for (int i = 0; i < s->nchildren; i++) zero_node(in, p, s->children[i], lo, hi);
}

/* ---------------------------------------------------------------- activation */

/* Mark sparse container p's own cell gp active (its ancestors are already).
 * A cell that becomes active starts with zeros below it: a pointer's block
 * is allocated zero-filled, a list grows by zero elements. */
static void set_own_cell(fb_interp *in, const fb_snode *p, const int64_t *gp) {
  int64_t lo[FB_MAX_AXES], hi[FB_MAX_AXES];
  for (int a = 0; a < FB_MAX_AXES; a++) {
    lo[a] = gp[a];
    hi[a] = gp[a] + 1;
  }
  if (p->kind == FB_SN_DYNAMIC) {
    int64_t n, list = list_of(in, p, gp, &n), *len = &in->len[p->id][list];
    if (n < *len) return;
    lo[dyn_axis(p)] = gp[dyn_axis(p)] - n + *len; /* cells length .. n join the list */
    zero_below(in, p->id, lo, hi);
    *len = n + 1;
    return;
  }
  int64_t x = cell_number(p, gp);
  if (bit_get(in->mask[p->id], x)) return;
  zero_below(in, p->id, lo, hi);
  bit_set(in->mask[p->id], x);
}

/* Activate the cell gi of SNode s and all its ancestors, top down. */
static void activate_cell(fb_interp *in, int s, const int64_t *gi) {
  int64_t gp[FB_MAX_AXES];
  for (int c = 0; c < in->ncovers[s]; c++) {
    cover_cell(&in->covers[s][c], gi, gp);
    set_own_cell(in, &in->l->nodes[in->covers[s][c].node], gp);
  }
}

/* Deactivate the cell gp of sparse container p: everything below it reads 0
 * (and its nested sparse cells are inactive) from now on. A dynamic list is
 * emptied as a whole. An inactive cell is left alone. */
static void deactivate_cell(fb_interp *in, const fb_snode *p, const int64_t *gp) {
  int64_t lo[FB_MAX_AXES], hi[FB_MAX_AXES];
  if (!cell_active(in, p->id, gp)) return;
  for (int a = 0; a < FB_MAX_AXES; a++) {
    lo[a] = gp[a];
    hi[a] = gp[a] + 1;
  }
  if (p->kind == FB_SN_DYNAMIC) {
    int ax = dyn_axis(p);
    int64_t n, list = list_of(in, p, gp, &n);
    in->len[p->id][list] = 0;
    lo[ax] = gp[ax] - n;
    hi[ax] = lo[ax] + p->size[ax];
  } else {
    bit_clear(in->mask[p->id], cell_number(p, gp));
  }
  zero_below(in, p->id, lo, hi);
}

/* ---------------------------------------------------------------- SNode operands */

/* Read the first sn->ndim operands of id as indices of sn's index space
 * into gi (by axis). *inb is cleared (and FB_EBOUNDS latched) when one is
 * out of range; *flat is the cell number otherwise. */
static int read_indices(run *r, int id, const fb_snode *sn, int64_t *gi, int64_t *flat, int *inb) {
  *inb = 1;
  for (int a = 0; a < FB_MAX_AXES; a++) gi[a] = 0;
  for (int d = 0; d < sn->ndim; d++) {
    int a = sn->dim_axis[d];
    int rc = operand_i32(r, id, d, &gi[a]);
    if (rc) return rc;
    if (gi[a] < 0 || gi[a] >= sn->shape[a]) *inb = 0;
  }
  if (!*inb) {
    r->bounds = FB_EBOUNDS;
    for (int a = 0; a < FB_MAX_AXES; a++) gi[a] = 0;
  }
  *flat = cell_number(sn, gi);
  return 0;
}

/* The SNode a statement names, checked: a place when want_place. */
static int stmt_snode(run *r, int id, int want_place, const fb_snode **out) {
  const fb_stmt *s = &r->k->stmts[id];
  if (s->snode < 0 || s->snode >= r->l->nnodes)
    return bad(r, FB_EINVAL, id, "no SNode %d in the layout", (int)s->snode);
  const fb_snode *sn = &r->l->nodes[s->snode];
  if (want_place && sn->kind != FB_SN_PLACE)
    return bad(r, FB_EINVAL, id, "SNode %d is not a field", sn->id);
  *out = sn;
  return 0;
}

/* Operand count of a global access: the SNode's indices (+1 value). */
static int check_nargs(run *r, int id, const fb_snode *sn, int with_value) {
  int want = sn->ndim + with_value;
  if (r->k->stmts[id].nargs != want)
    return bad(r, FB_EINVAL, id, "%d operands, expected %d", r->k->stmts[id].nargs, want);
  return 0;
}

/* ---------------------------------------------------------------- global memory */

static void *elem_ptr(run *r, const fb_snode *sn, int64_t flat) {
  return (uint8_t *)r->in->fields[sn->id] + (size_t)flat * fb_type_size(sn->type);
}

/* A load: inactive cells read 0 (and stay inactive). */
static int exec_load(run *r, int id) {
  const fb_snode *sn = NULL;
  int64_t gi[FB_MAX_AXES], flat;
  int inb, rc;
  if ((rc = stmt_snode(r, id, 1, &sn)) || (rc = check_nargs(r, id, sn, 0)) ||
      (rc = result_type(r, id, sn->type)) || (rc = read_indices(r, id, sn, gi, &flat, &inb)))
    return rc;
  int live = inb && cell_active(r->in, sn->id, gi);
  r->vals[id] = live ? fb_value_load(sn->type, elem_ptr(r, sn, flat)) : zero_of(sn->type);
  return 0;
}

/* A store activates every sparse ancestor of the element first. */
/* store_na and atomic_*_na (activation demotion): the optimizer proved the
 * cell active; on an inactive one the write is skipped, never activating. */
static int no_activation(fb_op op) {
  return op == FB_OP_STORE_NA || (op >= FB_OP_ATOMIC_ADD_NA && op <= FB_OP_ATOMIC_XOR_NA);
}
static fb_op s_op(const run *r, int id) { return (fb_op)r->k->stmts[id].op; }

static int exec_store(run *r, int id) {
  const fb_snode *sn = NULL;
  int64_t gi[FB_MAX_AXES], flat;
  int inb, rc;
  fb_value v;
  if ((rc = stmt_snode(r, id, 1, &sn)) || (rc = check_nargs(r, id, sn, 1)) ||
      (rc = operand(r, id, sn->ndim, &v)) || (rc = read_indices(r, id, sn, gi, &flat, &inb)))
    return rc;
  if (v.type != sn->type)
    return bad(r, FB_EINVAL, id, "storing %s into %s %s field", fb_type_name(v.type),
               fb_type_article(sn->type), fb_type_name(sn->type));
  if (inb && !(no_activation(s_op(r, id)) && !cell_active(r->in, sn->id, gi))) {
    activate_cell(r->in, sn->id, gi);
    fb_value_store(v, elem_ptr(r, sn, flat));
  }
  return 0;
}

/* The binary op an atomic applies (the optimizer's *_na variants too). */
static fb_op atomic_base(fb_op op) {
  switch (op) {
  case FB_OP_ATOMIC_ADD:
  case FB_OP_ATOMIC_ADD_NA: return FB_OP_ADD;
  case FB_OP_ATOMIC_SUB:
  case FB_OP_ATOMIC_SUB_NA: return FB_OP_SUB;
  case FB_OP_ATOMIC_MIN:
  case FB_OP_ATOMIC_MIN_NA: return FB_OP_MIN;
  case FB_OP_ATOMIC_MAX:
  case FB_OP_ATOMIC_MAX_NA: return FB_OP_MAX;
  case FB_OP_ATOMIC_AND:
  case FB_OP_ATOMIC_AND_NA: return FB_OP_AND;
  case FB_OP_ATOMIC_OR:
  case FB_OP_ATOMIC_OR_NA: return FB_OP_OR;
  default: return FB_OP_XOR;
  }
}

/* Atomics return the old value (0 for an inactive cell) and store
 * old <op> value (in the field's type: f32 fields add in float, min/max on
 * floats are fmin/fmax), activating the element like a store. */
static int exec_atomic(run *r, int id) {
  const fb_stmt *s = &r->k->stmts[id];
  const fb_snode *sn = NULL;
  int64_t gi[FB_MAX_AXES], flat;
  int inb, rc;
  fb_value v, old, nv;
  if ((rc = stmt_snode(r, id, 1, &sn)) || (rc = check_nargs(r, id, sn, 1)) ||
      (rc = result_type(r, id, sn->type)) || (rc = operand(r, id, sn->ndim, &v)))
    return rc;
  fb_op base = atomic_base((fb_op)s->op);
  int int_only = fb_op_table[s->op].cls == FB_OPC_IATOMIC;
  if (v.type != sn->type || (int_only ? !fb_type_is_int(v.type) : !is_num(v.type)))
    return bad(r, FB_EINVAL, id, "not defined on %s (field %s)", fb_type_name(v.type),
               fb_type_name(sn->type));
  if ((rc = read_indices(r, id, sn, gi, &flat, &inb))) return rc;
  if (!inb || (no_activation((fb_op)s->op) && !cell_active(r->in, sn->id, gi))) {
    r->vals[id] = zero_of(sn->type);
    return 0;
  }
  old = cell_active(r->in, sn->id, gi) ? fb_value_load(sn->type, elem_ptr(r, sn, flat))
                                       : zero_of(sn->type);
  if (fb_arith_binop(base, sn->type, old, v, &nv)) return bad(r, FB_EINVAL, id, "bad operand type");
  activate_cell(r->in, sn->id, gi);
  fb_value_store(nv, elem_ptr(r, sn, flat));
  r->vals[id] = old;
  return 0;
}

/* ---------------------------------------------------------------- sparse ops */

/* is_active / activate / deactivate on a cell of any SNode's cell space (a
 * place's: its parent's). deactivate needs a sparse container (the verifier
 * refuses the others; checked again here). */
static int exec_activity(run *r, int id) {
  const fb_stmt *s = &r->k->stmts[id];
  const fb_snode *sn = NULL;
  int64_t gi[FB_MAX_AXES], flat;
  int inb, rc;
  if ((rc = stmt_snode(r, id, 0, &sn)) || (rc = check_nargs(r, id, sn, 0))) return rc;
  if (sn->kind == FB_SN_ROOT) return bad(r, FB_EINVAL, id, "names the root SNode");
  const fb_snode *p = sn->kind == FB_SN_PLACE ? &r->l->nodes[sn->parent] : sn;
  if (s->op == FB_OP_DEACTIVATE && !sparse_kind(p->kind))
    return bad(r, FB_EINVAL, id, "deactivate needs a sparse SNode (bitmasked, pointer or dynamic)");
  if (s->op == FB_OP_IS_ACTIVE && (rc = result_type(r, id, FB_T_BOOL))) return rc;
  if ((rc = read_indices(r, id, sn, gi, &flat, &inb))) return rc;
  if (s->op == FB_OP_IS_ACTIVE) r->vals[id] = fb_value_bool(inb && cell_active(r->in, sn->id, gi));
  else if (inb && s->op == FB_OP_ACTIVATE) activate_cell(r->in, sn->id, gi);
  else if (inb) deactivate_cell(r->in, p, gi); /* a place's cells are its parent's */
  return 0;
}

/* The dynamic SNode above the place of an append / length, checked: its
 * axis must not be split above it, or no indices could name one list. */
static int dyn_of(run *r, int id, const fb_snode *sn, const fb_snode **d) {
  *d = &r->l->nodes[sn->parent];
  if ((*d)->kind != FB_SN_DYNAMIC)
    return bad(r, FB_EINVAL, id, "SNode %d is not under a dynamic SNode", sn->id);
  int ax = dyn_axis(*d);
  if (r->l->nodes[(*d)->parent].space_axes & (1u << ax))
    return bad(r, FB_EINVAL, id,
               "dynamic SNode %d splits axis %c, already split above it: "
               "no indices name one of its lists",
               (*d)->id, 'i' + ax);
  int want = sn->ndim - 1 + (r->k->stmts[id].op == FB_OP_APPEND);
  if (r->k->stmts[id].nargs != want)
    return bad(r, FB_EINVAL, id, "%d operands, expected %d", r->k->stmts[id].nargs, want);
  return 0;
}

/* The operands naming a list: indices of the place's axes other than the
 * dynamic axis ax (left 0 in gi). *inb as in read_indices. */
static int list_indices(run *r, int id, const fb_snode *sn, int ax, int64_t *gi, int *inb) {
  *inb = 1;
  for (int a = 0; a < FB_MAX_AXES; a++) gi[a] = 0;
  for (int d = 0, k = 0; d < sn->ndim; d++) {
    int a = sn->dim_axis[d], rc;
    if (a == ax) continue;
    if ((rc = operand_i32(r, id, k++, &gi[a]))) return rc;
    if (gi[a] < 0 || gi[a] >= sn->shape[a]) *inb = 0;
  }
  if (!*inb) r->bounds = FB_EBOUNDS;
  return 0;
}

/* append / length on a place under a dynamic SNode d: the operands are the
 * indices on the axes other than d's, naming one list (a cell of d's
 * parent). append fills slot n = length (activating it like a store) and
 * returns n; on a full list it stores nothing, returns -1 and latches
 * FB_EBOUNDS. Out-of-range indices: append returns -1, length 0. */
static int exec_dynamic(run *r, int id) {
  const fb_snode *sn = NULL, *d = NULL;
  int append = r->k->stmts[id].op == FB_OP_APPEND, inb, rc;
  int64_t gi[FB_MAX_AXES];
  fb_value v = zero_of(FB_T_VOID);
  if ((rc = stmt_snode(r, id, 1, &sn)) || (rc = result_type(r, id, FB_T_I32)) ||
      (rc = dyn_of(r, id, sn, &d)) || (append && (rc = operand(r, id, sn->ndim - 1, &v))))
    return rc;
  if (append && v.type != sn->type)
    return bad(r, FB_EINVAL, id, "appending %s to %s %s field", fb_type_name(v.type),
               fb_type_article(sn->type), fb_type_name(sn->type));
  int ax = dyn_axis(d);
  if ((rc = list_indices(r, id, sn, ax, gi, &inb))) return rc;
  int64_t len = inb ? r->in->len[d->id][cell_number(&r->l->nodes[d->parent], gi)] : 0;
  r->vals[id] = fb_value_i32(append ? -1 : (int32_t)len);
  if (!append || !inb) return 0;
  if (len >= d->size[ax]) {
    r->bounds = FB_EBOUNDS;
    r->full = 1;
    return 0;
  }
  gi[ax] = len;
  activate_cell(r->in, sn->id, gi);
  fb_value_store(v, elem_ptr(r, sn, cell_number(sn, gi)));
  r->vals[id] = fb_value_i32((int32_t)len);
  return 0;
}

static int exec_sparse(run *r, int id) {
  int cls = fb_op_table[r->k->stmts[id].op].cls;
  return cls == FB_OPC_SPARSE ? exec_activity(r, id) : exec_dynamic(r, id);
}

/* ---------------------------------------------------------------- pure values */

static int exec_const(run *r, int id) {
  const fb_stmt *s = &r->k->stmts[id];
  fb_type t = (fb_type)s->type;
  if (!valid_type(t)) return bad(r, FB_EINVAL, id, "constant of no type");
  if (t == FB_T_F32) r->vals[id] = mk_f32((float)s->imm.f);
  else if (t == FB_T_F64) r->vals[id] = mk_f64(s->imm.f);
  else r->vals[id] = mk_int(t, s->imm.u);
  return 0;
}

static int exec_arg(run *r, int id) {
  const fb_stmt *s = &r->k->stmts[id];
  if (s->imm.i < 0 || s->imm.i >= r->k->nparams)
    return bad(r, FB_EINVAL, id, "no parameter %lld", (long long)s->imm.i);
  int rc = result_type(r, id, r->k->params[s->imm.i]);
  if (rc) return rc;
  r->vals[id] = r->args[s->imm.i];
  return 0;
}

static int exec_cast(run *r, int id) {
  fb_type to = (fb_type)r->k->stmts[id].type;
  fb_value a;
  int rc = operand(r, id, 0, &a);
  if (rc) return rc;
  if (!valid_type(to)) return bad(r, FB_EINVAL, id, "cast to no type");
  r->vals[id] = fb_value_cast(a, to);
  return 0;
}

static int exec_select(run *r, int id) {
  fb_value c, a, b;
  int rc;
  if ((rc = operand(r, id, 0, &c)) || (rc = operand(r, id, 1, &a)) || (rc = operand(r, id, 2, &b)))
    return rc;
  if (c.type != FB_T_BOOL || a.type != b.type)
    return bad(r, FB_EINVAL, id, "needs a bool condition and two values of one type");
  if ((rc = result_type(r, id, a.type))) return rc;
  r->vals[id] = c.v.u ? a : b;
  return 0;
}

/* Arithmetic, bit ops and shifts: operands (the shift count aside) and the
 * result share one type. */
static int exec_binary(run *r, int id) {
  const fb_stmt *s = &r->k->stmts[id];
  fb_value a, b;
  int rc;
  if ((rc = operand(r, id, 0, &a)) || (rc = operand(r, id, 1, &b))) return rc;
  int shift = fb_op_table[s->op].cls == FB_OPC_SHIFT;
  if (shift ? !fb_type_is_int(a.type) || !fb_type_is_int(b.type) : a.type != b.type)
    return bad(r, FB_EINVAL, id, "operand types %s and %s", fb_type_name(a.type),
               fb_type_name(b.type));
  if ((rc = result_type(r, id, a.type))) return rc;
  if (fb_arith_binop((fb_op)s->op, a.type, a, b, &r->vals[id]))
    return bad(r, FB_EINVAL, id, "not defined on %s", fb_type_name(a.type));
  return 0;
}

static int exec_compare(run *r, int id) {
  fb_value a, b;
  int rc;
  if ((rc = operand(r, id, 0, &a)) || (rc = operand(r, id, 1, &b))) return rc;
  if (a.type != b.type)
    return bad(r, FB_EINVAL, id, "operand types %s and %s", fb_type_name(a.type),
               fb_type_name(b.type));
  if ((rc = result_type(r, id, FB_T_BOOL))) return rc;
  r->vals[id] = fb_value_bool(fb_arith_compare((fb_op)r->k->stmts[id].op, a.type, a, b));
  return 0;
}

static int exec_unary(run *r, int id) {
  fb_value a = {0};
  int rc;
  if ((rc = operand(r, id, 0, &a)) || (rc = result_type(r, id, a.type))) return rc;
  if (fb_arith_unop((fb_op)r->k->stmts[id].op, a.type, a, &r->vals[id]))
    return bad(r, FB_EINVAL, id, "not defined on %s", fb_type_name(a.type));
  return 0;
}

/* ---------------------------------------------------------------- locals, scratch, rand */

/* The alloca a local access names. */
static int local_var(run *r, int id, int *var) {
  int rc = operand_id(r, id, 0, var);
  if (rc) return rc;
  if (r->k->stmts[*var].op != FB_OP_ALLOCA || !valid_type(r->k->stmts[*var].type))
    return bad(r, FB_EINVAL, id, "%%%d is not a local variable", *var);
  return 0;
}

static int exec_local(run *r, int id) {
  const fb_stmt *s = &r->k->stmts[id];
  int var = -1, rc;
  fb_value v;
  if (s->op == FB_OP_ALLOCA) {
    if (!valid_type(s->type)) return bad(r, FB_EINVAL, id, "variable of no type");
    r->vals[id] = zero_of((fb_type)s->type);
    return 0;
  }
  if ((rc = local_var(r, id, &var))) return rc;
  if (s->op == FB_OP_LLOAD) {
    if ((rc = result_type(r, id, (fb_type)r->k->stmts[var].type))) return rc;
    r->vals[id] = r->vals[var];
    return 0;
  }
  if ((rc = operand(r, id, 1, &v))) return rc;
  if (v.type != r->k->stmts[var].type)
    return bad(r, FB_EINVAL, id, "storing %s into %s %s variable", fb_type_name(v.type),
               fb_type_article((fb_type)r->k->stmts[var].type),
               fb_type_name((fb_type)r->k->stmts[var].type));
  r->vals[var] = v;
  return 0;
}

/* Make the scratch buffer cover [0, end), zero-filling what is new. */
static int scratch_reserve(fb_interp *in, size_t end) {
  if (end <= in->scratch_bytes) return 0;
  size_t n = in->scratch_bytes ? in->scratch_bytes : 64;
  while (n < end) n *= 2;
  uint8_t *p = realloc(in->scratch, n);
  if (!p) return FB_ENOMEM;
  memset(p + in->scratch_bytes, 0, n - in->scratch_bytes);
  in->scratch = p;
  in->scratch_bytes = n;
  return 0;
}

/* gtmp_load / gtmp_store: a value of the statement's (or the stored value's)
 * type at byte offset imm.i; each value owns an 8-byte slot. */
static int exec_gtmp(run *r, int id) {
  const fb_stmt *s = &r->k->stmts[id];
  int64_t off = s->imm.i;
  fb_value v;
  int rc;
  if (off < 0 || (uint64_t)off > INTERP_SCRATCH_MAX - 8)
    return bad(r, FB_EINVAL, id, "scratch offset %lld out of range", (long long)off);
  if (s->op == FB_OP_GTMP_STORE && (rc = operand(r, id, 0, &v))) return rc;
  if (s->op == FB_OP_GTMP_LOAD && !valid_type(s->type))
    return bad(r, FB_EINVAL, id, "load of no type");
  if (scratch_reserve(r->in, (size_t)off + 8))
    return bad(r, FB_ENOMEM, id, "cannot grow the scratch buffer to %lld bytes",
               (long long)off + 8);
  if (s->op == FB_OP_GTMP_STORE) fb_value_store(v, r->in->scratch + off);
  else r->vals[id] = fb_value_load((fb_type)s->type, r->in->scratch + off);
  return 0;
}

static int exec_rand(run *r, int id) {
  const fb_stmt *s = &r->k->stmts[id];
  if (s->op == FB_OP_RAND_SEQ) { /* a fused task's next part: its own rand() stream */
    r->launch = r->launch0 + (uint64_t)s->imm.i;
    r->count = 0;
    return 0;
  }
  int rc = result_type(r, id, FB_T_F32);
  if (rc) return rc;
  uint64_t bits = fb_rand_bits(r->in->seed, r->launch, (uint64_t)s->imm.i, r->iter, r->count);
  r->count++;
  r->vals[id] = mk_f32(fb_rand_f32(bits));
  return 0;
}

static int exec_ret(run *r, int id) {
  const fb_stmt *s = &r->k->stmts[id];
  fb_value v;
  int rc = operand(r, id, 0, &v);
  if (rc) return rc;
  if (s->imm.i != 0) return bad(r, FB_EINVAL, id, "no return slot %lld", (long long)s->imm.i);
  if (v.type != r->k->ret)
    return bad(r, FB_EINVAL, id, "returns %s from a kernel returning %s", fb_type_name(v.type),
               fb_type_name(r->k->ret));
  r->ret = v;
  return 0;
}

static int exec_loop_index(run *r, int id) {
  const fb_stmt *s = &r->k->stmts[id];
  int loop = -1, rc;
  if ((rc = operand_id(r, id, 0, &loop)) || (rc = result_type(r, id, FB_T_I32))) return rc;
  const fb_stmt *ls = &r->k->stmts[loop];
  int n = 0;
  if (ls->op == FB_OP_RANGE_FOR || ls->op == FB_OP_PAR_FOR) n = 1;
  else if (ls->op == FB_OP_STRUCT_FOR && ls->snode >= 0 && ls->snode < r->l->nnodes)
    n = r->l->nodes[ls->snode].ndim;
  else return bad(r, FB_EINVAL, id, "%%%d is not a loop", loop);
  if (s->imm.i < 0 || s->imm.i >= n)
    return bad(r, FB_EINVAL, id, "loop %%%d has no index %lld", loop, (long long)s->imm.i);
  r->vals[id] = fb_value_i32(r->lidx[loop][s->imm.i]);
  return 0;
}

/* ---------------------------------------------------------------- control flow */

static int exec_block(run *r, int block);

/* One loop iteration's body; break / continue are errors in a parallel
 * loop (the verifier only lets them sit in serial loops). */
static int loop_body(run *r, int id, int serial) {
  int f = exec_block(r, r->k->stmts[id].body);
  if (f > 0 && !serial) return bad(r, FB_EINVAL, id, "break/continue outside a serial loop");
  return f;
}

/* range_for and par_for: i32 index from begin up to end (exclusive). A
 * top-level par_for keys rand() by iteration (index - begin), count reset. */
static int exec_range(run *r, int id, int top) {
  const fb_stmt *s = &r->k->stmts[id];
  int serial = s->op == FB_OP_RANGE_FOR;
  int64_t b = 0, e = 0;
  int rc;
  if ((rc = operand_i32(r, id, 0, &b)) || (rc = operand_i32(r, id, 1, &e))) return rc;
  for (int64_t i = b; i < e; i++) {
    if ((rc = step(r, id))) return rc;
    r->lidx[id][0] = (int32_t)i;
    if (top) {
      r->iter = (uint64_t)(i - b);
      r->count = 0;
    }
    int f = loop_body(r, id, serial);
    if (f < 0) return f;
    if (f == FLOW_BREAK) break;
  }
  return FLOW_NEXT;
}

/* The cells of sn's cell space active now, as a bitset over cell numbers
 * (NULL with *all set when nothing on sn's path is sparse). */
static int active_snapshot(run *r, int id, const fb_snode *sn, int64_t total, uint64_t **out,
                           int *all) {
  *out = NULL;
  *all = r->in->ncovers[sn->id] == 0;
  if (*all) return 0;
  uint64_t *snap = calloc((size_t)(total + 63) / 64 + 1, sizeof *snap);
  if (!snap) return bad(r, FB_ENOMEM, id, "no memory for the list of %lld cells", (long long)total);
  int64_t gi[FB_MAX_AXES];
  for (int64_t x = 0; x < total; x++) {
    cell_indices(sn, x, gi);
    if (cell_active(r->in, sn->id, gi)) bit_set(snap, x);
  }
  *out = snap;
  return 0;
}

/* struct_for: every cell of the SNode's cell space (a place's: its parent's)
 * that is active when the loop starts, in row-major order; cells the body
 * activates or deactivates do not change which cells are visited. The cell
 * number keys rand() when the loop is top-level. */
static int exec_struct_for(run *r, int id, int top) {
  const fb_snode *sn = NULL;
  uint64_t *snap = NULL;
  int all = 1, rc = stmt_snode(r, id, 0, &sn);
  if (rc) return rc;
  int64_t total = space_cells(sn), gi[FB_MAX_AXES];
  if ((rc = active_snapshot(r, id, sn, total, &snap, &all))) return rc;
  int f = FLOW_NEXT;
  for (int64_t x = 0; x < total && f >= 0; x++) {
    if ((f = step(r, id))) break;
    if (!all && !bit_get(snap, x)) continue;
    cell_indices(sn, x, gi);
    for (int d = 0; d < FB_MAX_AXES; d++)
      r->lidx[id][d] = d < sn->ndim ? (int32_t)gi[sn->dim_axis[d]] : 0;
    if (top) {
      r->iter = (uint64_t)x;
      r->count = 0;
    }
    f = loop_body(r, id, 0);
  }
  free(snap);
  return f < 0 ? f : FLOW_NEXT;
}

static int exec_while(run *r, int id) {
  for (;;) {
    int f = step(r, id);
    if (f) return f;
    f = loop_body(r, id, 1);
    if (f < 0) return f;
    if (f == FLOW_BREAK) return FLOW_NEXT;
  }
}

static int exec_if(run *r, int id) {
  const fb_stmt *s = &r->k->stmts[id];
  fb_value c;
  int rc = operand(r, id, 0, &c);
  if (rc) return rc;
  if (c.type != FB_T_BOOL) return bad(r, FB_EINVAL, id, "condition is not bool");
  if (c.v.u) return exec_block(r, s->body);
  return s->orelse >= 0 ? exec_block(r, s->orelse) : FLOW_NEXT;
}

/* One statement: FLOW_* or a negative FB_E* code. */
static int exec_stmt(run *r, int id, int top) {
  const fb_stmt *s = &r->k->stmts[id];
  if (s->op >= FB_OP__COUNT) return fail(r->in, FB_EINVAL, "%%%d: unknown op %u", id, s->op);
  if (s->type >= FB_T__COUNT) return bad(r, FB_EINVAL, id, "unknown type %u", s->type);
  int rc = step(r, id);
  if (rc) return rc;
  switch (fb_op_table[s->op].cls) {
  case FB_OPC_CONST: return exec_const(r, id);
  case FB_OPC_ARG: return exec_arg(r, id);
  case FB_OPC_CAST: return exec_cast(r, id);
  case FB_OPC_SELECT: return exec_select(r, id);
  case FB_OPC_ARITH:
  case FB_OPC_FARITH:
  case FB_OPC_BITS:
  case FB_OPC_SHIFT: return exec_binary(r, id);
  case FB_OPC_CMP: return exec_compare(r, id);
  case FB_OPC_NOT:
  case FB_OPC_UNARY:
  case FB_OPC_FUNARY: return exec_unary(r, id);
  case FB_OPC_ALLOCA:
  case FB_OPC_LLOAD:
  case FB_OPC_LSTORE: return exec_local(r, id);
  case FB_OPC_GLOAD: return exec_load(r, id);
  case FB_OPC_GSTORE: return exec_store(r, id);
  case FB_OPC_ATOMIC:
  case FB_OPC_IATOMIC: return exec_atomic(r, id);
  case FB_OPC_SPARSE:
  case FB_OPC_APPEND:
  case FB_OPC_LENGTH: return exec_sparse(r, id);
  case FB_OPC_HINT: {
    rc = operand(r, id, 0, &r->vals[id]);
    return rc ? rc : result_type(r, id, r->vals[id].type);
  }
  case FB_OPC_IF: return exec_if(r, id);
  case FB_OPC_LOOP: return exec_while(r, id);
  case FB_OPC_RANGE: return exec_range(r, id, top && s->op == FB_OP_PAR_FOR);
  case FB_OPC_STRUCT: return exec_struct_for(r, id, top);
  case FB_OPC_JUMP: return s->op == FB_OP_BREAK ? FLOW_BREAK : FLOW_CONTINUE;
  case FB_OPC_LOOPIDX: return exec_loop_index(r, id);
  case FB_OPC_RET: return exec_ret(r, id);
  case FB_OPC_GTMP: return exec_gtmp(r, id);
  case FB_OPC_RAND: return exec_rand(r, id);
  case FB_OPC_LIST:
    return 0; /* lists are the runtime's: the interpreter
                                 walks the active cells directly */
  default: return bad(r, FB_EINVAL, id, "op class %d has no meaning", fb_op_table[s->op].cls);
  }
}

static int exec_block(run *r, int block) {
  if (block < 0 || block >= r->k->nblocks)
    return fail(r->in, FB_EINVAL, "kernel %s: no block %d", r->k->name, block);
  if (++r->depth > FB_MAX_BLOCK_DEPTH)
    return fail(r->in, FB_EINVAL, "kernel %s: blocks nested deeper than %d", r->k->name,
                FB_MAX_BLOCK_DEPTH);
  const fb_block *b = &r->k->blocks[block];
  int f = FLOW_NEXT;
  for (int i = 0; i < b->n && f == FLOW_NEXT; i++) {
    if (!stmt_ok(r, b->ids[i]))
      f = fail(r->in, FB_EINVAL, "kernel %s: block %d lists %%%d, not a statement", r->k->name,
               block, (int)b->ids[i]);
    else f = exec_stmt(r, b->ids[i], 0);
  }
  r->depth--;
  return f;
}

/* The body. Top-level par_for and struct_for are the parallel tasks: their
 * iterations key rand(); the runs of other statements between them are the
 * serial tasks, each counting rand() calls from 0. */
static int exec_body(run *r) {
  const fb_block *b = &r->k->blocks[0];
  r->depth = 1;
  for (int i = 0; i < b->n; i++) {
    int id = b->ids[i];
    if (!stmt_ok(r, id))
      return fail(r->in, FB_EINVAL, "kernel %s: body lists %%%d, not a statement", r->k->name, id);
    int par = r->k->stmts[id].op == FB_OP_PAR_FOR || r->k->stmts[id].op == FB_OP_STRUCT_FOR;
    if (par) r->count = 0;
    int f = exec_stmt(r, id, 1);
    if (par) r->iter = r->count = 0;
    if (f < 0) return f;
    if (f > 0) return bad(r, FB_EINVAL, id, "break/continue outside a loop");
  }
  return 0;
}

/* ---------------------------------------------------------------- checks before a run */

static int kind_of(fb_type t) {
  return fb_type_is_float(t) ? 2 : fb_type_is_int(t) ? 1 : t == FB_T_BOOL ? 0 : -1;
}

/* Convert the launch arguments to the parameter types. */
static int convert_args(fb_interp *in, const fb_kernel *k, const fb_value *args, int nargs,
                        fb_value *out) {
  if (nargs != k->nparams)
    return fail(in, FB_ETYPE, "kernel %s takes %d arguments, got %d", k->name, k->nparams, nargs);
  if (nargs > 0 && !args) return fail(in, FB_EINVAL, "kernel %s: no argument values", k->name);
  for (int i = 0; i < nargs; i++) {
    fb_type pt = k->params[i];
    if (!valid_type(pt))
      return fail(in, FB_EINVAL, "kernel %s: parameter %d has no type", k->name, i);
    if (kind_of(args[i].type) < 0 || kind_of(args[i].type) != kind_of(pt))
      return fail(in, FB_ETYPE, "kernel %s: argument %d is %s, parameter is %s", k->name, i,
                  fb_type_name(args[i].type), fb_type_name(pt));
    out[i] = fb_value_cast(args[i], pt);
  }
  return 0;
}

static int check_kernel(fb_interp *in, const fb_kernel *k) {
  if (!fb_layout_equal(k->layout, in->l))
    return fail(in, FB_EINVAL, "kernel %s was built for another layout", k->name ? k->name : "?");
  if (k->nblocks < 1 || !k->blocks || k->nstmts < 0 || (k->nstmts > 0 && !k->stmts) ||
      k->nparams < 0 || (k->nparams > 0 && !k->params) || (unsigned)k->ret >= FB_T__COUNT)
    return fail(in, FB_EINVAL, "kernel %s is malformed", k->name ? k->name : "?");
  return 0;
}

/* Run the verifier; its first message becomes the interpreter's. */
static int verify_kernel(fb_interp *in, const fb_kernel *k) {
  fb_diags d;
  fb_diags_init(&d);
  int rc = fb_verify(k, &d);
  if (rc == FB_EVERIFY)
    fail(in, rc, "kernel %s: %s%s", k->name ? k->name : "?", d.n ? d.v[0].msg : "refused",
         d.n > 1 ? " (and more)" : "");
  else if (rc)
    fail(in, rc, "kernel %s: verifier failed: %s", k->name ? k->name : "?", fb_strerror(rc));
  fb_diags_free(&d);
  return rc;
}

/* ---------------------------------------------------------------- API */

/* The sparse containers on node s's path (s included), root first. */
static int build_covers(fb_interp *in, int s) {
  const fb_layout *l = in->l;
  int n = 0;
  for (int p = s; p > 0; p = l->nodes[p].parent) n += sparse_kind(l->nodes[p].kind);
  in->ncovers[s] = n;
  if (!n) return 0;
  if (!(in->covers[s] = calloc((size_t)n, sizeof **in->covers))) return FB_ENOMEM;
  for (int p = s; p > 0; p = l->nodes[p].parent) {
    if (!sparse_kind(l->nodes[p].kind)) continue;
    cover *c = &in->covers[s][--n];
    c->node = p;
    for (int a = 0; a < FB_MAX_AXES; a++) c->stride[a] = fb_layout_stride(l, p, s, a);
  }
  return 0;
}

/* Storage and activity state of node i: all zero (nothing active). */
static int alloc_node(fb_interp *in, int i) {
  const fb_snode *s = &in->l->nodes[i];
  if (s->kind == FB_SN_PLACE &&
      !(in->fields[i] = calloc((size_t)fb_field_numel(in->l, i), fb_type_size(s->type))))
    return FB_ENOMEM;
  if ((s->kind == FB_SN_BITMASKED || s->kind == FB_SN_POINTER) &&
      !(in->mask[i] = calloc((size_t)(space_cells(s) + 63) / 64, sizeof **in->mask)))
    return FB_ENOMEM;
  if (s->kind == FB_SN_DYNAMIC &&
      !(in->len[i] = calloc((size_t)space_cells(&in->l->nodes[s->parent]), sizeof **in->len)))
    return FB_ENOMEM;
  return build_covers(in, i);
}

fb_interp *fb_interp_new(const fb_layout *l, uint64_t seed) {
  if (!l || !l->finalized) return NULL;
  fb_interp *in = calloc(1, sizeof *in);
  if (!in) return NULL;
  in->l = l;
  in->seed = seed;
  size_t nn = (size_t)l->nnodes;
  in->fields = calloc(nn, sizeof *in->fields);
  in->covers = calloc(nn, sizeof *in->covers);
  in->ncovers = calloc(nn, sizeof *in->ncovers);
  in->mask = calloc(nn, sizeof *in->mask);
  in->len = calloc(nn, sizeof *in->len);
  if (!in->fields || !in->covers || !in->ncovers || !in->mask || !in->len) {
    fb_interp_free(in);
    return NULL;
  }
  for (int i = 0; i < l->nnodes; i++)
    if (alloc_node(in, i)) {
      fb_interp_free(in);
      return NULL;
    }
  return in;
}

void fb_interp_free(fb_interp *in) {
  if (!in) return;
  for (int i = 0; i < in->l->nnodes; i++) {
    if (in->fields) free(in->fields[i]);
    if (in->covers) free(in->covers[i]);
    if (in->mask) free(in->mask[i]);
    if (in->len) free(in->len[i]);
  }
  free(in->fields);
  free(in->covers);
  free(in->ncovers);
  free(in->mask);
  free(in->len);
  free(in->scratch);
  free(in);
}

void *fb_interp_field(fb_interp *in, int place) {
  if (!in || place < 0 || place >= in->l->nnodes) return NULL;
  return in->fields[place];
}

void *fb_interp_scratch(fb_interp *in, size_t *bytes) {
  if (bytes) *bytes = in ? in->scratch_bytes : 0;
  return in ? in->scratch : NULL;
}

int fb_interp_run(fb_interp *in, const fb_kernel *k, const fb_value *args, int nargs,
                  fb_value *ret) {
  if (!in) return FB_EINVAL;
  in->err[0] = 0;
  if (ret) *ret = zero_of(FB_T_VOID);
  if (!k) return fail(in, FB_EINVAL, "no kernel");
  int rc = check_kernel(in, k);
  if (!rc) rc = verify_kernel(in, k);
  if (rc) return rc;
  if (ret) *ret = zero_of(k->ret);
  run r;
  memset(&r, 0, sizeof r);
  r.in = in;
  r.k = k;
  r.l = in->l;
  r.ret = zero_of(k->ret);
  fb_value *argv = calloc((size_t)k->nparams + 1, sizeof *argv);
  r.vals = calloc((size_t)k->nstmts + 1, sizeof *r.vals);
  r.lidx = calloc((size_t)k->nstmts + 1, sizeof *r.lidx);
  r.args = argv;
  if (!argv || !r.vals || !r.lidx) rc = fail(in, FB_ENOMEM, "kernel %s: out of memory", k->name);
  else if (!(rc = convert_args(in, k, args, nargs, argv))) {
    r.launch = r.launch0 = in->launches++;
    rc = exec_body(&r);
  }
  free(argv);
  free(r.vals);
  free(r.lidx);
  if (rc < 0) return rc;
  if (ret) *ret = r.ret;
  if (r.bounds)
    fb_errf(in->err, sizeof in->err, "kernel %s %s", k->name,
            r.full ? "appended to a full dynamic list (or indexed out of bounds)"
                   : "indexed a field out of bounds");
  return r.bounds;
}
