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
 * parameters. That is exact only when the kernel leaves what it read
 * unchanged, hence the rule (Taichi's global data access rules, taken at
 * field granularity, which is conservative): no field is both read and
 * written by one kernel, and no atomic's result is used.
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
  if (!l || place < 0 || place >= l->nnodes) {
    fb_errf(err, errlen, "no SNode %d in the layout", place);
    return FB_EINVAL;
  }
  const fb_snode *p = &l->nodes[place];
  const char *name = p->name ? p->name : "?";
  if (l->finalized) {
    fb_errf(err, errlen, "cannot add a gradient to '%s': the layout is already finalized", name);
    return FB_EINVAL;
  }
  if (p->kind != FB_SN_PLACE) {
    fb_errf(err, errlen, "'%s' is a %s SNode, not a field; only fields have gradients", name,
            fb_snode_kind_name(p->kind));
    return FB_EINVAL;
  }
  if (!fb_type_is_float(p->type)) {
    fb_errf(err, errlen, "field '%s' is %s; only f32 and f64 fields have gradients", name,
            fb_type_name(p->type));
    return FB_EINVAL;
  }
  size_t n = strlen(name);
  char *gname = malloc(n + sizeof GRAD_SUFFIX);
  if (!gname) return FB_ENOMEM;
  memcpy(gname, name, n);
  memcpy(gname + n, GRAD_SUFFIX, sizeof GRAD_SUFFIX);
  if (fb_layout_find(l, gname) >= 0) {
    fb_errf(err, errlen, "field '%s' already has a gradient (the name '%s' is taken)", name,
            gname);
    free(gname);
    return FB_EINVAL;
  }
  int parent = p->parent;
  fb_type t = p->type; /* p may move when the node array grows */
  int id = fb_layout_place(l, parent, gname, t);
  free(gname);
  if (id < 0) fb_errf(err, errlen, "cannot add the gradient of '%s': %s", name, fb_strerror(id));
  return id;
}

int fb_grad_map_from_layout(const fb_layout *l, fb_grad_map *g) {
  if (!l || !g) return FB_EINVAL;
  int rc = fb_grad_map_init(g, l->nnodes);
  if (rc) return rc;
  size_t sl = strlen(GRAD_SUFFIX);
  for (int i = 0; i < l->nnodes; i++) {
    const fb_snode *gs = &l->nodes[i];
    if (gs->kind != FB_SN_PLACE || !gs->name) continue;
    size_t n = strlen(gs->name);
    if (n <= sl || strcmp(gs->name + n - sl, GRAD_SUFFIX) != 0) continue;
    const fb_snode *par = gs->parent >= 0 ? &l->nodes[gs->parent] : NULL;
    for (int c = 0; par && c < par->nchildren; c++) {
      const fb_snode *p = &l->nodes[par->children[c]];
      if (p->kind == FB_SN_PLACE && p->name && p->type == gs->type &&
          fb_type_is_float(p->type) && strlen(p->name) == n - sl &&
          memcmp(p->name, gs->name, n - sl) == 0)
        g->grad[p->id] = i;
    }
  }
  return 0;
}

/* ---------------------------------------------------------------- the pass */

typedef struct actx {
  const fb_kernel *k;
  const fb_layout *l;
  const fb_grad_map *g;
  char *err;
  size_t errlen;
  int ns;
  uint8_t *active; /* per forward statement: carries an adjoint */
  uint8_t *reach;  /* per region: an adjoint flows into it */
  uint8_t *need;   /* per region: its value is recomputed */
  int32_t *map;    /* per region: forward id -> adjoint kernel id */
  int32_t *adj;    /* per region: forward id -> its adjoint, -1 for zero */
  int32_t *list;   /* the region's statements in program order */
  int nlist;
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
  char what[320];
  va_list ap;
  va_start(ap, fmt);
  fb_verrf(what, sizeof what, fmt, ap);
  va_end(ap);
  if (id >= 0)
    fb_errf(a->err, a->errlen, "cannot differentiate kernel '%s': %%%d %s: %s", a->k->name, id,
            op_name(a->k->stmts[id].op), what);
  else fb_errf(a->err, a->errlen, "cannot differentiate kernel '%s': %s", a->k->name, what);
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

/* What the pass refuses, by op: NULL when the op is in scope. */
static const char *out_of_scope(const actx *a, const fb_stmt *s) {
  switch ((fb_op)s->op) {
  case FB_OP_IF: return "if is not differentiable yet; write the branch as a select";
  case FB_OP_WHILE:
  case FB_OP_RANGE_FOR:
  case FB_OP_BREAK:
  case FB_OP_CONTINUE: return "serial loops (while, range_for) are not differentiable yet";
  case FB_OP_ALLOCA:
  case FB_OP_LLOAD:
  case FB_OP_LSTORE: return "local variables are not differentiable yet";
  case FB_OP_RAND:
    return "rand() is not differentiable: the adjoint could not recompute the same values";
  case FB_OP_IS_ACTIVE:
  case FB_OP_ACTIVATE:
  case FB_OP_DEACTIVATE:
  case FB_OP_APPEND:
  case FB_OP_LENGTH: return "sparse-structure ops are not differentiable yet";
  case FB_OP_ATOMIC_MIN:
  case FB_OP_ATOMIC_MAX:
    if (fb_type_is_float((fb_type)a->l->nodes[s->snode].type))
      return "atomic_min and atomic_max on float fields are not differentiable yet";
    return NULL;
  default:
    if (fb_op_table[s->op].flags & FB_OPF_INTERNAL)
      return "is internal to the engine; only client kernels are differentiated";
    return NULL;
  }
}

/* Operand i of s carries s's adjoint back (for active operands). */
static int diff_operand(const fb_stmt *s, int i) {
  switch ((fb_op)s->op) {
  case FB_OP_CAST: return i == 0;
  case FB_OP_SELECT: return i == 1 || i == 2;
  case FB_OP_ADD:
  case FB_OP_SUB:
  case FB_OP_MUL:
  case FB_OP_DIV:
  case FB_OP_REM:
  case FB_OP_FLOORMOD:
  case FB_OP_MIN:
  case FB_OP_MAX:
  case FB_OP_POW:
  case FB_OP_ATAN2: return i < 2;
  case FB_OP_NEG:
  case FB_OP_ABS:
  case FB_OP_SQRT:
  case FB_OP_RSQRT:
  case FB_OP_SIN:
  case FB_OP_COS:
  case FB_OP_TAN:
  case FB_OP_ASIN:
  case FB_OP_ACOS:
  case FB_OP_ATAN:
  case FB_OP_EXP:
  case FB_OP_LOG: return i == 0;
  default: return 0; /* floor, ceil, round, floordiv: zero almost everywhere */
  }
}

/* Activity and the checks of one statement, in program order. */
static int scan_stmt(actx *a, int id, int *first_read, int *first_write) {
  const fb_stmt *s = &a->k->stmts[id];
  const char *why = out_of_scope(a, s);
  if (why) return refuse(a, id, "%s", why);
  if (is_par_loop(s)) return 0;
  if (s->op == FB_OP_LOAD && first_read[s->snode] < 0) first_read[s->snode] = id;
  if (is_write(s) && first_write[s->snode] < 0) first_write[s->snode] = id;
  if (fb_type_is_float((fb_type)s->type) && !is_write(s)) {
    if (s->op == FB_OP_LOAD) a->active[id] = grad_of(a, s->snode) >= 0;
    for (int i = 0; i < s->nargs; i++)
      if (a->active[s->args[i]] && diff_operand(s, i)) a->active[id] = 1;
  }
  if (is_write(s)) {
    int v = s->args[s->nargs - 1];
    if (a->active[v] && grad_of(a, s->snode) < 0)
      return refuse(a, id,
                    "writes a value that depends on a field with a gradient into '%s', which has "
                    "none, so its gradient would be lost; give '%s' a gradient",
                    field_name(a, s->snode), field_name(a, s->snode));
  }
  return 0;
}

static int scan(actx *a) {
  const fb_kernel *k = a->k;
  int nn = a->l->nnodes, rc = 0;
  int *first_read = malloc(sizeof(int) * (size_t)nn);
  int *first_write = malloc(sizeof(int) * (size_t)nn);
  uint8_t *used = calloc((size_t)a->ns, 1);
  if (!first_read || !first_write || !used) rc = FB_ENOMEM;
  for (int i = 0; !rc && i < nn; i++) first_read[i] = first_write[i] = -1;
  const fb_block *b0 = &k->blocks[0];
  for (int i = 0; !rc && i < b0->n; i++) {
    int id = b0->ids[i];
    rc = scan_stmt(a, id, first_read, first_write);
    const fb_stmt *s = &k->stmts[id];
    if (!rc && is_par_loop(s)) {
      const fb_block *bb = &k->blocks[s->body];
      for (int j = 0; !rc && j < bb->n; j++) rc = scan_stmt(a, bb->ids[j], first_read, first_write);
    }
  }
  /* every operand use, for the atomic-result rule */
  for (int id = 0; !rc && id < a->ns; id++) {
    const fb_stmt *s = &k->stmts[id];
    for (int i = 0; i < s->nargs && i < FB_MAX_ARGS; i++)
      if (s->args[i] >= 0 && s->args[i] < a->ns) used[s->args[i]] = 1;
  }
  for (int id = 0; !rc && id < a->ns; id++)
    if (used[id] && fb_kernel_block_of(k, id, NULL) >= 0 && is_write(&k->stmts[id]))
      rc = refuse(a, id,
                  "uses the value the atomic returns; the adjoint cannot recompute it (use the "
                  "atomic as a statement only)");
  for (int f = 0; !rc && f < nn; f++)
    if (first_read[f] >= 0 && first_write[f] >= 0)
      rc = refuse(a, -1,
                  "field '%s' is read (%%%d load) and written (%%%d %s) in one kernel; the "
                  "adjoint recomputes what the kernel read, so a kernel must not change a field it "
                  "reads (the global data access rules, docs/autodiff.md): write the result to "
                  "another field or split the kernel",
                  field_name(a, f), first_read[f], first_write[f],
                  op_name(k->stmts[first_write[f]].op));
  free(first_read);
  free(first_write);
  free(used);
  return rc;
}

/* ---------------------------------------------------------------- emitting */

static int cst(actx *a, fb_type t, double c) {
  return fb_b_const(&a->b, t == FB_T_F32 ? fb_value_f32((float)c) : fb_value_f64(c));
}
static int bin(actx *a, fb_op op, int x, int y) { return fb_b_binary(&a->b, op, x, y); }
static int un(actx *a, fb_op op, int x) { return fb_b_unary(&a->b, op, x); }

/* Add contribution v to the adjoint of forward statement o. */
static void acc(actx *a, int o, int v) {
  if (!a->active[o] || v < 0) return;
  a->adj[o] = a->adj[o] < 0 ? v : bin(a, FB_OP_ADD, a->adj[o], v);
}

/* Recompute forward statement id in the current block. */
static int replay(actx *a, int id) {
  fb_stmt c = a->k->stmts[id];
  for (int i = 0; i < c.nargs && i < FB_MAX_ARGS; i++) c.args[i] = a->map[c.args[i]];
  c.body = c.orelse = -1;
  c.part = 0;
  return a->map[id] = fb_b_emit(&a->b, &c);
}

/* The global access op at s's indices (mapped), on SNode field. */
static int access(actx *a, const fb_stmt *s, fb_op op, int field, int value) {
  int idx[FB_MAX_ARGS], n = s->nargs - (is_write(s) ? 1 : 0);
  for (int i = 0; i < n; i++) idx[i] = a->map[s->args[i]];
  return fb_b_global(&a->b, op, field, idx, n, value);
}

/* The reverse step of one statement. */
static void sweep_stmt(actx *a, int id) {
  const fb_stmt *s = &a->k->stmts[id];
  if (is_write(s)) {
    int gf = grad_of(a, s->snode);
    if (gf < 0) return;
    int v = s->args[s->nargs - 1];
    int gv = access(a, s, FB_OP_LOAD, gf, -1);
    if (s->op == FB_OP_STORE) /* the old value is overwritten: no gradient flows to it */
      access(a, s, FB_OP_STORE, gf, cst(a, (fb_type)a->l->nodes[gf].type, 0.0));
    if (s->op == FB_OP_ATOMIC_SUB) gv = un(a, FB_OP_NEG, gv);
    acc(a, v, gv);
    return;
  }
  int g = a->adj[id];
  if (g < 0) return;
  fb_type t = (fb_type)s->type;
  int a0 = s->nargs > 0 ? s->args[0] : -1, a1 = s->nargs > 1 ? s->args[1] : -1;
  int A = a0 >= 0 ? a->map[a0] : -1, B = a1 >= 0 ? a->map[a1] : -1, R = a->map[id];
  switch ((fb_op)s->op) {
  case FB_OP_LOAD: access(a, s, FB_OP_ATOMIC_ADD, grad_of(a, s->snode), g); break;
  case FB_OP_CAST: acc(a, a0, fb_b_cast(&a->b, (fb_type)a->k->stmts[a0].type, g)); break;
  case FB_OP_SELECT: {
    int z = cst(a, t, 0.0), c = a->map[a0];
    acc(a, s->args[1], fb_b_select(&a->b, c, g, z));
    acc(a, s->args[2], fb_b_select(&a->b, c, z, g));
    break;
  }
  case FB_OP_ADD:
    acc(a, a0, g);
    acc(a, a1, g);
    break;
  case FB_OP_SUB:
    acc(a, a0, g);
    if (a->active[a1]) acc(a, a1, un(a, FB_OP_NEG, g));
    break;
  case FB_OP_MUL:
    if (a->active[a0]) acc(a, a0, bin(a, FB_OP_MUL, g, B));
    if (a->active[a1]) acc(a, a1, bin(a, FB_OP_MUL, g, A));
    break;
  case FB_OP_DIV: /* d(a/b) = da / b - db * (a/b) / b */
    if (a->active[a0]) acc(a, a0, bin(a, FB_OP_DIV, g, B));
    if (a->active[a1]) acc(a, a1, un(a, FB_OP_NEG, bin(a, FB_OP_MUL, g, bin(a, FB_OP_DIV, R, B))));
    break;
  case FB_OP_REM:
  case FB_OP_FLOORMOD: /* r = a - b * q with q = (a - r) / b constant a.e. */
    acc(a, a0, g);
    if (a->active[a1])
      acc(a, a1,
          un(a, FB_OP_NEG, bin(a, FB_OP_MUL, g, bin(a, FB_OP_DIV, bin(a, FB_OP_SUB, A, R), B))));
    break;
  case FB_OP_MIN:
  case FB_OP_MAX: { /* to the operand the result is (a on ties) */
    int pick = bin(a, FB_OP_EQ, R, A), z = cst(a, t, 0.0);
    acc(a, a0, fb_b_select(&a->b, pick, g, z));
    acc(a, a1, fb_b_select(&a->b, pick, z, g));
    break;
  }
  case FB_OP_POW: /* d(a^b) = b a^(b-1) da + a^b log(a) db */
    if (a->active[a0])
      acc(a, a0,
          bin(a, FB_OP_MUL, g,
              bin(a, FB_OP_MUL, B, bin(a, FB_OP_POW, A, bin(a, FB_OP_SUB, B, cst(a, t, 1.0))))));
    if (a->active[a1]) acc(a, a1, bin(a, FB_OP_MUL, g, bin(a, FB_OP_MUL, R, un(a, FB_OP_LOG, A))));
    break;
  case FB_OP_ATAN2: { /* atan2(y, x): dy x / (x²+y²) - dx y / (x²+y²) */
    int d = bin(a, FB_OP_ADD, bin(a, FB_OP_MUL, A, A), bin(a, FB_OP_MUL, B, B));
    if (a->active[a0]) acc(a, a0, bin(a, FB_OP_DIV, bin(a, FB_OP_MUL, g, B), d));
    if (a->active[a1])
      acc(a, a1, un(a, FB_OP_NEG, bin(a, FB_OP_DIV, bin(a, FB_OP_MUL, g, A), d)));
    break;
  }
  case FB_OP_NEG: acc(a, a0, un(a, FB_OP_NEG, g)); break;
  case FB_OP_ABS: { /* sign(a) g, 0 at 0 */
    int z = cst(a, t, 0.0);
    int pos = fb_b_select(&a->b, bin(a, FB_OP_GT, A, z), g, z);
    acc(a, a0, fb_b_select(&a->b, bin(a, FB_OP_LT, A, z), un(a, FB_OP_NEG, g), pos));
    break;
  }
  case FB_OP_SQRT: acc(a, a0, bin(a, FB_OP_DIV, bin(a, FB_OP_MUL, g, cst(a, t, 0.5)), R)); break;
  case FB_OP_RSQRT: /* d a^(-1/2) = -0.5 r / a */
    acc(a, a0,
        bin(a, FB_OP_MUL, g, bin(a, FB_OP_DIV, bin(a, FB_OP_MUL, cst(a, t, -0.5), R), A)));
    break;
  case FB_OP_SIN: acc(a, a0, bin(a, FB_OP_MUL, g, un(a, FB_OP_COS, A))); break;
  case FB_OP_COS: acc(a, a0, un(a, FB_OP_NEG, bin(a, FB_OP_MUL, g, un(a, FB_OP_SIN, A)))); break;
  case FB_OP_TAN:
    acc(a, a0, bin(a, FB_OP_MUL, g, bin(a, FB_OP_ADD, cst(a, t, 1.0), bin(a, FB_OP_MUL, R, R))));
    break;
  case FB_OP_ASIN:
  case FB_OP_ACOS: {
    int d = un(a, FB_OP_SQRT, bin(a, FB_OP_SUB, cst(a, t, 1.0), bin(a, FB_OP_MUL, A, A)));
    int q = bin(a, FB_OP_DIV, g, d);
    acc(a, a0, s->op == FB_OP_ASIN ? q : un(a, FB_OP_NEG, q));
    break;
  }
  case FB_OP_ATAN:
    acc(a, a0,
        bin(a, FB_OP_DIV, g, bin(a, FB_OP_ADD, cst(a, t, 1.0), bin(a, FB_OP_MUL, A, A))));
    break;
  case FB_OP_EXP: acc(a, a0, bin(a, FB_OP_MUL, g, R)); break;
  case FB_OP_LOG: acc(a, a0, bin(a, FB_OP_DIV, g, A)); break;
  default: break; /* no active operand: constants, parameters, loop indices */
  }
}

/* Which forward values the region's sweep reads (need) and which carry an
 * adjoint (reach); then everything those are computed from. */
static void mark_needs(actx *a) {
  const fb_kernel *k = a->k;
  for (int p = a->nlist - 1; p >= 0; p--) {
    int id = a->list[p];
    const fb_stmt *s = &k->stmts[id];
    if (is_write(s)) {
      if (grad_of(a, s->snode) < 0) continue;
      for (int i = 0; i < s->nargs - 1; i++) a->need[s->args[i]] = 1;
      if (a->active[s->args[s->nargs - 1]]) a->reach[s->args[s->nargs - 1]] = 1;
      continue;
    }
    if (!a->reach[id]) continue;
    if (s->op == FB_OP_LOAD) {
      for (int i = 0; i < s->nargs; i++) a->need[s->args[i]] = 1;
      continue;
    }
    a->need[id] = 1;
    for (int i = 0; i < s->nargs; i++) {
      a->need[s->args[i]] = 1;
      if (a->active[s->args[i]] && diff_operand(s, i)) a->reach[s->args[i]] = 1;
    }
  }
  for (int p = a->nlist - 1; p >= 0; p--) {
    int id = a->list[p];
    const fb_stmt *s = &k->stmts[id];
    if (!a->need[id] || is_write(s)) continue;
    for (int i = 0; i < s->nargs; i++) a->need[s->args[i]] = 1;
  }
}

/* One forward region: the parallel loop stmt `loop`, or the body-level
 * write `loop` (then not a loop); pos is its position in block 0. */
static int emit_region(actx *a, int region, int pos) {
  const fb_kernel *k = a->k;
  const fb_stmt *r = &k->stmts[region];
  const fb_block *b0 = &k->blocks[0];
  int ns = a->ns;
  for (int i = 0; i < ns; i++) {
    a->map[i] = a->adj[i] = -1;
    a->need[i] = a->reach[i] = 0;
  }
  a->nlist = 0;
  /* the body-level values before the region, then the region itself */
  for (int i = 0; i < pos; i++) {
    const fb_stmt *s = &k->stmts[b0->ids[i]];
    if (!is_write(s) && !is_par_loop(s) && s->type != FB_T_VOID)
      a->list[a->nlist++] = b0->ids[i];
  }
  int ntop = a->nlist;
  if (is_par_loop(r)) {
    const fb_block *bb = &k->blocks[r->body];
    for (int j = 0; j < bb->n; j++) a->list[a->nlist++] = bb->ids[j];
  } else {
    a->list[a->nlist++] = region;
  }
  mark_needs(a);
  if (is_par_loop(r)) { /* the bounds, and what they are computed from */
    for (int i = 0; i < r->nargs; i++) a->need[r->args[i]] = 1;
    for (int p = ntop - 1; p >= 0; p--) {
      const fb_stmt *s = &k->stmts[a->list[p]];
      if (a->need[a->list[p]])
        for (int i = 0; i < s->nargs; i++) a->need[s->args[i]] = 1;
    }
  }
  for (int p = 0; p < ntop; p++)
    if (a->need[a->list[p]]) replay(a, a->list[p]);
  int saved = -1;
  if (is_par_loop(r)) {
    int nl = r->op == FB_OP_PAR_FOR
                 ? fb_b_range_for(&a->b, a->map[r->args[0]], a->map[r->args[1]], 1)
                 : fb_b_struct_for(&a->b, r->snode);
    if (nl < 0) return a->b.err ? a->b.err : FB_ENOMEM;
    a->map[region] = nl;
    saved = fb_b_enter(&a->b, a->out->stmts[nl].body);
    for (int p = ntop; p < a->nlist; p++)
      if (a->need[a->list[p]] && !is_write(&k->stmts[a->list[p]])) replay(a, a->list[p]);
  }
  for (int p = a->nlist - 1; p >= 0; p--) sweep_stmt(a, a->list[p]);
  if (saved >= 0) fb_b_leave(&a->b, saved);
  return a->b.err;
}

/* Does the region write a field with a gradient? */
static int region_matters(const actx *a, int id) {
  const fb_stmt *s = &a->k->stmts[id];
  if (is_write(s)) return grad_of(a, s->snode) >= 0;
  if (!is_par_loop(s)) return 0;
  const fb_block *bb = &a->k->blocks[s->body];
  for (int j = 0; j < bb->n; j++) {
    const fb_stmt *t = &a->k->stmts[bb->ids[j]];
    if (is_write(t) && grad_of(a, t->snode) >= 0) return 1;
  }
  return 0;
}

int fb_kernel_adjoint(const fb_kernel *k, const fb_grad_map *g, fb_kernel **out, char *err,
                      size_t errlen) {
  if (out) *out = NULL;
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
  fb_diags d;
  fb_diags_init(&d);
  int rc = fb_verify(k, &d);
  if (rc) {
    fb_errf(err, errlen, "cannot differentiate kernel '%s': it does not verify: %s", k->name,
            d.n ? d.v[0].msg : fb_strerror(rc));
    fb_diags_free(&d);
    return rc;
  }
  fb_diags_free(&d);
  a.l = k->layout;
  a.ns = k->nstmts;
  if ((rc = check_map(&a)) != 0) return rc;
  size_t ns = (size_t)a.ns + 1;
  a.active = calloc(ns, 1);
  a.reach = calloc(ns, 1);
  a.need = calloc(ns, 1);
  a.map = malloc(ns * sizeof(int32_t));
  a.adj = malloc(ns * sizeof(int32_t));
  a.list = malloc(ns * sizeof(int32_t));
  if (!a.active || !a.reach || !a.need || !a.map || !a.adj || !a.list) rc = FB_ENOMEM;
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
    for (int i = b0->n - 1; !rc && i >= 0; i--) {
      int id = b0->ids[i];
      const fb_stmt *s = &k->stmts[id];
      if ((is_par_loop(s) || is_write(s)) && region_matters(&a, id)) rc = emit_region(&a, id, i);
    }
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
  free(name);
  free(a.active);
  free(a.reach);
  free(a.need);
  free(a.map);
  free(a.adj);
  free(a.list);
  if (rc) fb_kernel_free(a.out);
  else *out = a.out;
  return rc;
}
