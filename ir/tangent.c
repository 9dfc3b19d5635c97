/* Forward-mode automatic differentiation of kernel IR: the tangent pass
 * (fb_kernel_tangent) and dual places (fb_layout_add_dual, the x.dual
 * convention). docs/autodiff.md "Forward mode" describes the rules; this
 * comment, how the pass works.
 *
 * The tangent kernel "<k>.dual" is k itself, statement for statement in
 * program order, with the tangent of each active value computed right
 * after the value: a load of a field with a dual also loads the dual at the
 * same indices, a store or atomic add to such a field also writes its dual,
 * each differentiable op gets the rules of ir/ad_rules.c applied to its
 * operands' tangents, a local variable holding an active value gets a
 * tangent local beside it. So it needs none of the reverse pass's
 * machinery: no recomputation (it runs in place of k, not after it), no
 * regions, no global data access rule, no stack; while loops, break and
 * continue are copied as they are. Launching "<k>.dual" does what k does
 * and, in the dual fields, the Jacobian-vector product: the duals of the
 * fields k writes become J · (the duals of the fields it reads).
 *
 * Active values: floats that depend, through differentiable operands and
 * local variables, on a load of a field with a dual. Everything else
 * (integers, parameters, constants, loop indices, loads of fields without
 * a dual, random()) has tangent 0, which is never materialised except
 * where it is stored into a dual. */
#include <stdarg.h>
#include <stdio.h>

#include "ad_rules.h"
#include "ir_internal.h"

/* ---------------------------------------------------------------- dual places */

#define DUAL_SUFFIX ".dual"

int fb_layout_add_dual(fb_layout *l, int place, char *err, size_t errlen) {
  return fb__layout_add_sibling(l, place, DUAL_SUFFIX, "dual", err, errlen);
}

int fb_dual_map_from_layout(const fb_layout *l, fb_grad_map *g) {
  return fb__sibling_map_from_layout(l, DUAL_SUFFIX, g);
}

/* ---------------------------------------------------------------- the pass */

typedef struct tctx {
  const fb_kernel *k;
  const fb_layout *l;
  const fb_grad_map *d;
  char *err;
  size_t errlen;
  int ns;
  int bad;          /* the statement a refusal is about, -1 when none */
  int rc;           /* first emission error, sticky */
  long cap;         /* the most statements emission may make */
  uint8_t *active;  /* per forward statement: has a tangent (an alloca: a tangent local) */
  uint8_t *used;    /* per forward statement: an operand of another */
  int32_t *map;     /* forward id -> tangent kernel id (the primal copy) */
  int32_t *tan;     /* forward id -> its tangent (for an alloca: the tangent local), -1: 0 */
  fb_kernel *out;
  fb_builder b;
} tctx;

static const char *op_name(unsigned op) { return op < FB_OP__COUNT ? fb_op_table[op].name : "?"; }

static const char *field_name(const tctx *t, int snode) {
  const fb_snode *n = &t->l->nodes[snode];
  return n->name ? n->name : fb_snode_kind_name(n->kind);
}

#if defined(__GNUC__)
__attribute__((format(printf, 3, 4)))
#endif
static int
refuse(tctx *t, int id, const char *fmt, ...) {
  char what[400];
  va_list ap;
  va_start(ap, fmt);
  fb_verrf(what, sizeof what, fmt, ap);
  va_end(ap);
  t->bad = id;
  fb_errf(t->err, t->errlen, "cannot differentiate kernel '%s' in forward mode: %s", t->k->name,
          what);
  return FB_EVERIFY;
}

static int dual_of(const tctx *t, int snode) {
  return snode >= 0 && snode < t->d->n ? t->d->grad[snode] : -1;
}

static int is_write(const fb_stmt *s) {
  int c = fb_op_table[s->op].cls;
  return c == FB_OPC_GSTORE || c == FB_OPC_ATOMIC || c == FB_OPC_IATOMIC;
}

/* Every place with a dual: a float field; its dual a place of the same
 * type and index space, not itself, and no one else's. */
static int check_map(tctx *t) {
  const fb_layout *l = t->l;
  if (!t->d || t->d->n != l->nnodes || (l->nnodes && !t->d->grad)) {
    fb_errf(t->err, t->errlen,
            "cannot differentiate kernel '%s' in forward mode: the dual map has %d entries, the "
            "layout %d SNodes",
            t->k->name, t->d ? t->d->n : 0, l->nnodes);
    return FB_EINVAL;
  }
  for (int i = 0; i < l->nnodes; i++) {
    int di = t->d->grad[i];
    if (di < 0) continue;
    const fb_snode *p = &l->nodes[i];
    const char *why = NULL;
    if (di >= l->nnodes) why = "is not an SNode of the layout";
    else if (p->kind != FB_SN_PLACE) why = "is given to an SNode that is not a field";
    else if (!fb_type_is_float(p->type)) why = "is given to a field that is not f32 or f64";
    else if (di == i) why = "is the field itself";
    else if (l->nodes[di].kind != FB_SN_PLACE) why = "is not a field";
    else if (l->nodes[di].type != p->type) why = "has another element type than the field";
    else if (l->nodes[di].ndim != p->ndim ||
             memcmp(l->nodes[di].shape, p->shape, sizeof p->shape) != 0)
      why = "has another shape than the field";
    for (int j = 0; !why && j < i; j++)
      if (t->d->grad[j] == di) why = "is already the dual of another field";
    if (why) {
      fb_errf(t->err, t->errlen,
              "cannot differentiate kernel '%s' in forward mode: the dual of '%s' (SNode %d) %s",
              t->k->name, field_name(t, i), di, why);
      return FB_EINVAL;
    }
  }
  return 0;
}

/* ---------------------------------------------------------------- activity */

/* The statements reachable from block 0, in program order (blocks before
 * the statements after them), into ids; n counts them. */
static void walk(const fb_kernel *k, int blk, int32_t *ids, int *n) {
  const fb_block *bb = &k->blocks[blk];
  for (int j = 0; j < bb->n; j++) {
    const fb_stmt *s = &k->stmts[bb->ids[j]];
    ids[(*n)++] = bb->ids[j];
    if (s->body >= 0) walk(k, s->body, ids, n);
    if (s->orelse >= 0) walk(k, s->orelse, ids, n);
  }
}

/* Forward reachability over uses: from float loads of fields with a dual,
 * to float values through differentiable operands, and from a value
 * stored in a local variable to the variable and on to its loads (loops
 * make this a graph, not a pass in order). */
static int activity(tctx *t, const int32_t *ids, int n) {
  size_t ns = (size_t)t->ns + 1, ne = ns * FB_MAX_ARGS;
  int32_t *head = malloc(ns * sizeof(int32_t)), *next = malloc(ne * sizeof(int32_t));
  int32_t *to = malloc(ne * sizeof(int32_t)), *stack = malloc(ns * sizeof(int32_t));
  int rc = 0, m = 0, sp = 0;
  if (!head || !next || !to || !stack) rc = FB_ENOMEM;
  for (size_t i = 0; !rc && i < ns; i++) head[i] = -1;
  for (int j = 0; !rc && j < n; j++) {
    int id = ids[j];
    const fb_stmt *s = &t->k->stmts[id];
    if (s->op == FB_OP_LOAD && fb_type_is_float((fb_type)s->type) && dual_of(t, s->snode) >= 0)
      t->active[id] = 1;
    for (int i = 0; i < s->nargs && i < FB_MAX_ARGS; i++) {
      int from = s->args[i], dst = -1;
      if (s->op == FB_OP_LSTORE) dst = i == 1 ? s->args[0] : -1;
      else if (s->op == FB_OP_LLOAD) dst = id;
      else if (fb_type_is_float((fb_type)s->type) && fb__ad_diff_operand(s, i)) dst = id;
      if (dst < 0) continue;
      to[m] = dst;
      next[m] = head[from];
      head[from] = m++;
    }
  }
  for (int j = 0; !rc && j < n; j++)
    if (t->active[ids[j]]) stack[sp++] = ids[j];
  while (!rc && sp > 0) {
    int u = stack[--sp];
    for (int e = head[u]; e >= 0; e = next[e])
      if (!t->active[to[e]]) {
        t->active[to[e]] = 1;
        stack[sp++] = to[e];
      }
  }
  free(head);
  free(next);
  free(to);
  free(stack);
  return rc;
}

/* What the pass refuses: 0 when in scope. */
static int check(tctx *t, const int32_t *ids, int n) {
  for (int j = 0; j < n; j++) {
    int id = ids[j];
    const fb_stmt *s = &t->k->stmts[id];
    for (int i = 0; i < s->nargs && i < FB_MAX_ARGS; i++) t->used[s->args[i]] = 1;
  }
  for (int j = 0; j < n; j++) {
    int id = ids[j];
    const fb_stmt *s = &t->k->stmts[id];
    if (fb_op_table[s->op].flags & FB_OPF_INTERNAL)
      return refuse(t, id,
                    "'%s' is internal to the engine; only client kernels can be differentiated",
                    op_name(s->op));
    int value_active = (is_write(s) || s->op == FB_OP_APPEND) && t->active[s->args[s->nargs - 1]];
    int has_dual = (fb_op_table[s->op].flags & FB_OPF_SNODE) && dual_of(t, s->snode) >= 0;
    if (s->op == FB_OP_APPEND && (value_active || has_dual))
      return refuse(t, id,
                    "append() to '%s' cannot be differentiated in forward mode (%s); append in a "
                    "kernel that is not differentiated",
                    field_name(t, s->snode),
                    has_dual ? "the field has a dual" : "the value depends on a field with a dual");
    if ((s->op == FB_OP_ATOMIC_MIN || s->op == FB_OP_ATOMIC_MAX) &&
        fb_type_is_float((fb_type)t->l->nodes[s->snode].type) && (value_active || has_dual))
      return refuse(t, id,
                    "%s on the float field '%s' cannot be differentiated; compute the %s with "
                    "%s() and store it",
                    op_name(s->op), field_name(t, s->snode),
                    s->op == FB_OP_ATOMIC_MIN ? "minimum" : "maximum",
                    s->op == FB_OP_ATOMIC_MIN ? "min" : "max");
    if (is_write(s) && has_dual && t->used[id] && fb_type_is_float((fb_type)s->type))
      return refuse(t, id,
                    "uses the value %s returns (on field '%s', which has a dual); the tangent of "
                    "that value cannot be read together with it: use %s as a statement only",
                    op_name(s->op), field_name(t, s->snode), op_name(s->op));
    if (is_write(s) && value_active && !has_dual)
      return refuse(t, id,
                    "it writes a value that depends on a field with a dual into '%s', which has "
                    "none, so the derivative would be lost; give '%s' a dual (place %s: %s dual)",
                    field_name(t, s->snode), field_name(t, s->snode), field_name(t, s->snode),
                    fb_type_name((fb_type)t->l->nodes[s->snode].type));
  }
  return 0;
}

/* ---------------------------------------------------------------- emitting */

static int chk(tctx *t, int id) {
  if (t->rc) return -1;
  if (id < 0) t->rc = t->b.err ? t->b.err : FB_ENOMEM;
  else if (t->out->nstmts > t->cap) t->rc = FB_EQUOTA;
  return t->rc ? -1 : id;
}
static int cst(tctx *t, fb_type ty, double c) {
  return chk(t, fb_b_const(&t->b, ty == FB_T_F32 ? fb_value_f32((float)c) : fb_value_f64(c)));
}

/* The tangent of forward value v, materialised (0 of type ty when none). */
static int tan_or_zero(tctx *t, int v, fb_type ty) {
  return t->active[v] && t->tan[v] >= 0 ? t->tan[v] : cst(t, ty, 0.0);
}

/* The global access op at s's indices (mapped), on SNode field. */
static int access(tctx *t, const fb_stmt *s, fb_op op, int field, int value) {
  int idx[FB_MAX_ARGS], n = s->nargs - (is_write(s) ? 1 : 0);
  for (int i = 0; i < n; i++) idx[i] = t->map[s->args[i]];
  return chk(t, fb_b_global(&t->b, op, field, idx, n, value));
}

static void emit_block(tctx *t, int blk);

/* The tangent of an active value statement id (its primal copy emitted). */
static void emit_tangent(tctx *t, int id) {
  const fb_stmt *s = &t->k->stmts[id];
  fb_type ty = (fb_type)s->type;
  int a0 = s->nargs > 0 ? s->args[0] : -1, a1 = s->nargs > 1 ? s->args[1] : -1;
  int ta0 = a0 >= 0 && t->active[a0] ? t->tan[a0] : -1;
  switch ((fb_op)s->op) {
  case FB_OP_LOAD: t->tan[id] = access(t, s, FB_OP_LOAD, dual_of(t, s->snode), -1); return;
  case FB_OP_LLOAD:
    t->tan[id] = t->tan[a0] >= 0 ? chk(t, fb_b_lload(&t->b, t->tan[a0])) : -1;
    return;
  case FB_OP_CAST: t->tan[id] = ta0 >= 0 ? chk(t, fb_b_cast(&t->b, ty, ta0)) : -1; return;
  case FB_OP_SELECT: {
    int x = s->args[1], y = s->args[2];
    int tx = t->active[x] ? t->tan[x] : -1, tyv = t->active[y] ? t->tan[y] : -1;
    if (tx < 0 && tyv < 0) return;
    t->tan[id] = chk(t, fb_b_select(&t->b, t->map[a0], tx >= 0 ? tx : cst(t, ty, 0.0),
                                    tyv >= 0 ? tyv : cst(t, ty, 0.0)));
    return;
  }
  default: {
    int ta1 = a1 >= 0 && t->active[a1] ? t->tan[a1] : -1, c[2];
    if (!fb__ad_diff_operand(s, 0) || ta0 < 0) ta0 = -1;
    if (!fb__ad_diff_operand(s, 1) || ta1 < 0) ta1 = -1;
    fb_ad_em e = {&t->b, t->out, t->cap, t->rc};
    int g[2] = {ta0, ta1};
    fb__ad_rule(&e, s, a0 >= 0 ? t->map[a0] : -1, a1 >= 0 ? t->map[a1] : -1, t->map[id], g, c);
    t->rc = e.rc;
    if (c[0] >= 0 && c[1] >= 0) t->tan[id] = chk(t, fb_b_binary(&t->b, FB_OP_ADD, c[0], c[1]));
    else t->tan[id] = c[0] >= 0 ? c[0] : c[1];
  }
  }
}

/* Statement id: its primal copy, then its tangent or its dual write. */
static void emit_stmt(tctx *t, int id) {
  const fb_stmt *s = &t->k->stmts[id];
  if (t->rc) return;
  fb_stmt c = *s;
  for (int i = 0; i < c.nargs && i < FB_MAX_ARGS; i++) c.args[i] = t->map[c.args[i]];
  c.part = 0;
  c.body = c.orelse = -1;
  if (s->body >= 0 && (c.body = fb_block_new(t->out)) < 0) t->rc = c.body;
  if (s->orelse >= 0 && (c.orelse = fb_block_new(t->out)) < 0) t->rc = c.orelse;
  int n = chk(t, t->rc ? -1 : fb_b_emit(&t->b, &c));
  if (n < 0) return;
  t->map[id] = n;
  if (s->body >= 0) {
    int saved = fb_b_enter(&t->b, c.body);
    emit_block(t, s->body);
    fb_b_leave(&t->b, saved);
  }
  if (s->orelse >= 0) {
    int saved = fb_b_enter(&t->b, c.orelse);
    emit_block(t, s->orelse);
    fb_b_leave(&t->b, saved);
  }
  if (is_write(s)) {
    int df = dual_of(t, s->snode), v = s->args[s->nargs - 1];
    fb_type ft = (fb_type)t->l->nodes[s->snode].type;
    if (df < 0 || !fb_type_is_float(ft)) return;
    if (s->op == FB_OP_STORE) /* the dual of the new value: 0 for a constant one */
      access(t, s, FB_OP_STORE, df, tan_or_zero(t, v, ft));
    else if ((s->op == FB_OP_ATOMIC_ADD || s->op == FB_OP_ATOMIC_SUB) && t->active[v] &&
             t->tan[v] >= 0)
      access(t, s, (fb_op)s->op, df, t->tan[v]);
    return;
  }
  if (!t->active[id]) return;
  if (s->op == FB_OP_ALLOCA) { /* the tangent local, zeroed like the variable */
    t->tan[id] = chk(t, fb_b_alloca(&t->b, (fb_type)s->type));
    return;
  }
  if (s->op == FB_OP_LSTORE) return;
  emit_tangent(t, id);
}

static void emit_block(tctx *t, int blk) {
  const fb_block *bb = &t->k->blocks[blk];
  for (int j = 0; j < bb->n && !t->rc; j++) {
    int id = bb->ids[j];
    const fb_stmt *s = &t->k->stmts[id];
    emit_stmt(t, id);
    /* a store into an active local also stores the tangent (0 for a constant) */
    if (!t->rc && s->op == FB_OP_LSTORE && t->active[s->args[0]] && t->tan[s->args[0]] >= 0)
      chk(t, fb_b_lstore(&t->b, t->tan[s->args[0]],
                         tan_or_zero(t, s->args[1], (fb_type)t->k->stmts[s->args[0]].type)));
  }
}

/* ---------------------------------------------------------------- entry points */

int fb_kernel_tangent(const fb_kernel *k, const fb_grad_map *dual, int max_stmts, fb_kernel **out,
                      int *bad_stmt, char *err, size_t errlen) {
  if (out) *out = NULL;
  if (bad_stmt) *bad_stmt = -1;
  if (!k || !k->name || !out) {
    fb_errf(err, errlen, "fb_kernel_tangent: no kernel");
    return FB_EINVAL;
  }
  tctx t;
  memset(&t, 0, sizeof t);
  t.k = k;
  t.d = dual;
  t.err = err;
  t.errlen = errlen;
  t.bad = -1;
  fb_diags dg;
  fb_diags_init(&dg);
  int rc = fb_verify(k, &dg);
  if (rc) {
    fb_errf(err, errlen, "cannot differentiate kernel '%s' in forward mode: it does not verify: %s",
            k->name, dg.n ? dg.v[0].msg : fb_strerror(rc));
    if (bad_stmt && dg.n) *bad_stmt = dg.v[0].stmt;
    fb_diags_free(&dg);
    return rc;
  }
  fb_diags_free(&dg);
  t.l = k->layout;
  t.ns = k->nstmts;
  if ((rc = check_map(&t)) != 0) return rc;
  /* a tangent is at most a few statements per forward one: a bound on the
   * work before the budget below is checked */
  t.cap = max_stmts > 0 ? 16L * max_stmts + 4096 : FB_MAX_STATEMENTS_ANY;
  size_t ns = (size_t)t.ns + 1;
  t.active = calloc(ns, 1);
  t.used = calloc(ns, 1);
  t.map = malloc(ns * sizeof(int32_t));
  t.tan = malloc(ns * sizeof(int32_t));
  int32_t *ids = malloc(ns * sizeof(int32_t));
  int n = 0;
  if (!t.active || !t.used || !t.map || !t.tan || !ids) rc = FB_ENOMEM;
  for (size_t i = 0; !rc && i < ns; i++) t.map[i] = t.tan[i] = -1;
  if (!rc) walk(k, 0, ids, &n);
  if (!rc) rc = activity(&t, ids, n);
  if (!rc) rc = check(&t, ids, n);
  char *name = NULL;
  if (!rc) {
    size_t nl = strlen(k->name);
    name = malloc(nl + sizeof DUAL_SUFFIX);
    if (!name) rc = FB_ENOMEM;
    else {
      memcpy(name, k->name, nl);
      memcpy(name + nl, DUAL_SUFFIX, sizeof DUAL_SUFFIX);
      t.out = fb_kernel_new(k->layout, name, k->nparams, k->params, k->ret);
      if (!t.out) rc = FB_ENOMEM;
    }
  }
  if (!rc) {
    fb_builder_init(&t.b, t.out);
    emit_block(&t, 0);
    rc = t.rc ? t.rc : t.b.err;
    if (rc == FB_EQUOTA)
      fb_errf(err, errlen,
              "cannot differentiate kernel '%s' in forward mode: its tangent would have more "
              "than %ld statements; split the kernel",
              k->name, t.cap);
  }
  if (!rc && max_stmts > 0 && t.out->nstmts > max_stmts) {
    fb_errf(err, errlen,
            "cannot differentiate kernel '%s' in forward mode: its tangent has %d statements, "
            "more than the limit of %d for a kernel; split the kernel",
            k->name, t.out->nstmts, max_stmts);
    rc = FB_EQUOTA;
  }
  if (!rc) {
    fb_diags_init(&dg);
    if (fb_verify(t.out, &dg) != 0) {
      fb_errf(err, errlen, "internal error: the tangent of kernel '%s' does not verify: %s",
              k->name, dg.n ? dg.v[0].msg : "?");
      rc = FB_EINTERNAL;
    }
    fb_diags_free(&dg);
  } else if (rc == FB_ENOMEM) {
    fb_errf(err, errlen, "cannot differentiate kernel '%s' in forward mode: out of memory",
            k->name);
  }
  if (bad_stmt) *bad_stmt = t.bad;
  free(name);
  free(t.active);
  free(t.used);
  free(t.map);
  free(t.tan);
  free(ids);
  if (rc) fb_kernel_free(t.out);
  else *out = t.out;
  return rc;
}
