/* Calls: user funcs (inlined by lang_stmt.c), math builtins (component-wise
 * on vectors and matrices), casts and vector/matrix constructors, the
 * sparse builtins (is_active activate deactivate append length),
 * assume_unique and random(). Each builtin checks its argument count and
 * types and says what it expected. */
#include <math.h>
#include <stdio.h>

#include "ir/arith.h"
#include "lang_internal.h"

#define ERR(L, at, ...) ((L)->errors++, lang_err((L)->d, (at)->line, (at)->col, __VA_ARGS__))

static const struct {
  const char *name;
  int op;
} math1[] = {{"sqrt", FB_OP_SQRT},  {"rsqrt", FB_OP_RSQRT}, {"sin", FB_OP_SIN},
             {"cos", FB_OP_COS},    {"tan", FB_OP_TAN},     {"asin", FB_OP_ASIN},
             {"acos", FB_OP_ACOS},  {"atan", FB_OP_ATAN},   {"exp", FB_OP_EXP},
             {"log", FB_OP_LOG},    {"floor", FB_OP_FLOOR}, {"ceil", FB_OP_CEIL},
             {"round", FB_OP_ROUND}};

static const char *const pure_other[] = {
    "abs",      "pow",        "atan2",     "min",   "max",          "clamp",
    "select",   "int",        "float",     "dot",   "cross",        "norm",
    "norm_sqr", "normalized", "transpose", "outer", "trace",        "determinant",
    "inverse",  "identity",   "svd",       "polar", "assume_unique"};

int lang_is_pure_builtin(const char *name) {
  for (size_t i = 0; i < sizeof math1 / sizeof math1[0]; i++)
    if (!strcmp(name, math1[i].name)) return 1;
  for (size_t i = 0; i < sizeof pure_other / sizeof pure_other[0]; i++)
    if (!strcmp(name, pure_other[i])) return 1;
  return 0;
}

static int nargs_is(lower *L, node *e, int want) {
  if (e->nkids == want) return 1;
  ERR(L, e, "%s takes %d argument%s, found %d", e->name, want, want == 1 ? "" : "s", e->nkids);
  return 0;
}

/* ---------------------------------------------------------------- math */

static int numeric(lower *L, node *e, const lval *v) {
  char b[64];
  if (v->kind >= VK_SCALAR && v->kind <= VK_MAT && lv_default_type(v) != FB_T_BOOL) return 1;
  ERR(L, e, "%s expects a number, vector or matrix, found %s", e->name, lv_str(v, b, sizeof b));
  return 0;
}

static int math_unary(lower *L, node *e, int op, lval *a, lval *out) {
  if (!numeric(L, e, a)) return -1;
  fb_type t = lv_default_type(a);
  if (op != FB_OP_ABS) lv_materialize(L, a, fb_type_is_float(t) ? t : FB_T_F32);
  else if (a->lit) { /* abs of a literal stays a literal: the i64 or f64 abs */
    *out = *a;
    for (int i = 0; i < a->n; i++) {
      uint64_t u = 0;
      double f = 0;
      fb_arith_int_unop(FB_OP_ABS, FB_T_I64, (uint64_t)a->ci[i], &u);
      fb_arith_f64_unop(FB_OP_ABS, a->cv[i], &f);
      out->ci[i] = (int64_t)u;
      out->cv[i] = f;
    }
    return 0;
  }
  *out = *a;
  out->has_const = 0;
  for (int i = 0; i < a->n; i++) out->id[i] = lw_un(L, op, a->id[i]);
  return 0;
}

static int atan2_call(lower *L, node *e, lval *a, lval *b, lval *out) {
  if (!numeric(L, e, a) || !numeric(L, e, b)) return -1;
  fb_type t;
  char x[64], y[64];
  if (!lang_same_shape(a, b) || lang_common_type(a, b, &t) < 0) {
    ERR(L, e, "atan2 cannot combine %s and %s", lv_str(a, x, sizeof x), lv_str(b, y, sizeof y));
    return -1;
  }
  if (!fb_type_is_float(t)) t = FB_T_F32;
  lv_materialize(L, a, t);
  lv_materialize(L, b, t);
  lv_broadcast_like(a, b);
  lv_broadcast_like(b, a);
  *out = *a;
  out->has_const = 0;
  for (int i = 0; i < a->n; i++) out->id[i] = lw_bin(L, FB_OP_ATAN2, a->id[i], b->id[i]);
  return 0;
}

static int select_call(lower *L, node *e, lval *args, lval *out) {
  lval *c = &args[0], *a = &args[1], *b = &args[2];
  char x[64], y[64];
  fb_type t;
  if (!lang_same_shape(a, b) || lang_common_type(a, b, &t) < 0) {
    ERR(L, e, "select: the two values have different types: %s and %s", lv_str(a, x, sizeof x),
        lv_str(b, y, sizeof y));
    return -1;
  }
  lv_materialize(L, a, t);
  lv_materialize(L, b, t);
  lv_broadcast_like(a, b);
  lv_broadcast_like(b, a);
  if (c->kind != VK_SCALAR && !(c->kind == a->kind && c->rows == a->rows && c->cols == a->cols)) {
    ERR(L, e, "select: the condition must be a scalar or match the values' shape, found %s",
        lv_str(c, x, sizeof x));
    return -1;
  }
  fb_type ct = lv_default_type(c);
  if (ct != FB_T_BOOL) {
    lv_materialize(L, c, ct);
    for (int i = 0; i < c->n; i++) c->id[i] = lw_cast(L, FB_T_BOOL, c->id[i]);
  }
  *out = *a;
  out->has_const = 0;
  for (int i = 0; i < a->n; i++)
    out->id[i] = lw_select(L, c->id[c->n == 1 ? 0 : i], a->id[i], b->id[i]);
  return 0;
}

static int minmax(lower *L, node *e, int op, lval *args, int n, lval *out) {
  if (n < 2) {
    ERR(L, e, "%s takes at least 2 arguments, found %d", e->name, n);
    return -1;
  }
  lval acc = args[0];
  for (int i = 1; i < n; i++) {
    lval r;
    if (lv_binary(L, op, &acc, &args[i], &r, e) < 0) return -1;
    acc = r;
  }
  *out = acc;
  return 0;
}

static int math_call(lower *L, node *e, lval *args, int n, lval *out) {
  const char *nm = e->name;
  for (size_t i = 0; i < sizeof math1 / sizeof math1[0]; i++)
    if (!strcmp(nm, math1[i].name))
      return nargs_is(L, e, 1) ? math_unary(L, e, math1[i].op, &args[0], out) : -1;
  if (!strcmp(nm, "abs"))
    return nargs_is(L, e, 1) ? math_unary(L, e, FB_OP_ABS, &args[0], out) : -1;
  if (!strcmp(nm, "pow"))
    return nargs_is(L, e, 2) ? lv_binary(L, T_STARSTAR, &args[0], &args[1], out, e) : -1;
  if (!strcmp(nm, "atan2"))
    return nargs_is(L, e, 2) ? atan2_call(L, e, &args[0], &args[1], out) : -1;
  if (!strcmp(nm, "min")) return minmax(L, e, LOP_MIN, args, n, out);
  if (!strcmp(nm, "max")) return minmax(L, e, LOP_MAX, args, n, out);
  if (!strcmp(nm, "clamp")) {
    lval lo;
    if (!nargs_is(L, e, 3) || lv_binary(L, LOP_MAX, &args[0], &args[1], &lo, e) < 0) return -1;
    return lv_binary(L, LOP_MIN, &lo, &args[2], out, e);
  }
  if (!strcmp(nm, "select")) return nargs_is(L, e, 3) ? select_call(L, e, args, out) : -1;
  if (!strcmp(nm, "int") || !strcmp(nm, "float")) {
    if (!nargs_is(L, e, 1)) return -1;
    *out = args[0];
    lv_cast(L, out, nm[0] == 'i' ? FB_T_I32 : FB_T_F32);
    return 0;
  }
  return 1; /* not a math builtin */
}

/* ---------------------------------------------------------------- constructors */

int lang_ctor(lower *L, node *e, lval *out) {
  lty ty = e->ty;
  char b[64], x[64];
  lval args[LANG_MAX_COMP];
  int n = e->nkids, unknown = 0;
  lv_unknown(out);
  if (n > LANG_MAX_COMP) {
    ERR(L, e, "%s takes at most %d values, found %d", lang_ty_str(ty, b, sizeof b), LANG_MAX_COMP,
        n);
    return -1;
  }
  for (int i = 0; i < n; i++) {
    if (lang_eval(L, e->kids[i], &args[i]) < 0) return -1;
    if (args[i].kind == VK_UNKNOWN) unknown = 1;
  }
  if (unknown) return 0;
  int want = ty.rows == 0 ? 1 : ty.rows * (ty.cols ? ty.cols : 1);
  /* a scalar type casts any value component-wise; T[n](x) converts or fills */
  if (n == 1 && (ty.rows == 0 || args[0].kind == VK_SCALAR ||
                 (args[0].rows == ty.rows && args[0].cols == ty.cols))) {
    if (args[0].kind < VK_SCALAR || args[0].kind > VK_MAT) goto bad;
    *out = args[0];
    lv_cast(L, out, ty.t);
    if (out->kind == VK_SCALAR && ty.rows) {
      lval like;
      memset(&like, 0, sizeof like);
      like.kind = ty.cols ? VK_MAT : VK_VEC;
      like.rows = ty.rows;
      like.cols = ty.cols;
      lv_broadcast_like(out, &like);
    }
    return 0;
  }
  if (ty.rows == 0) {
    ERR(L, e, "%s(x) takes 1 argument, found %d", fb_type_name(ty.t), n);
    return -1;
  }
  if (ty.cols) lv_mat_init(out, ty.t, ty.rows, ty.cols);
  else lv_vec_init(out, ty.t, ty.rows);
  int c = 0;
  int rows_form = ty.cols && n == ty.rows;
  if (!rows_form && n != want) goto bad;
  for (int i = 0; i < n; i++) {
    lval *a = &args[i];
    if (rows_form ? (a->kind != VK_VEC || a->rows != ty.cols) : a->kind != VK_SCALAR) goto bad;
    lv_cast(L, a, ty.t);
    for (int j = 0; j < a->n; j++) out->id[c++] = a->id[j];
  }
  return 0;
bad:
  if (ty.cols)
    ERR(L, e,
        "%s expects %d scalars, %d rows of %s[%d], or one value to convert; found %d argument%s "
        "starting with %s",
        lang_ty_str(ty, b, sizeof b), want, ty.rows, fb_type_name(ty.t), ty.cols, n,
        n == 1 ? "" : "s", lv_str(&args[0], x, sizeof x));
  else
    ERR(L, e, "%s expects %d scalars or one value to convert; found %d argument%s starting with %s",
        lang_ty_str(ty, b, sizeof b), want, n, n == 1 ? "" : "s", lv_str(&args[0], x, sizeof x));
  lv_unknown(out);
  return -1;
}

/* ---------------------------------------------------------------- sparse */

/* The first argument of a sparse builtin: a field or SNode name. */
static int target(lower *L, node *e, lbind *bd) {
  node *a = e->nkids ? e->kids[0] : NULL;
  if (a && a->kind == E_NAME && !lang_lookup(L, a->name) && !lang_resolve_field(L, a->name, bd)) {
    ERR(L, a, "unknown field or SNode '%s'", a->name);
    return -1;
  }
  if (!a || a->kind != E_NAME || !lang_resolve_field(L, a->name, bd)) {
    ERR(L, a ? a : e, "%s expects a field or SNode name as its first argument", e->name);
    return -1;
  }
  return 0;
}

static int index_args(lower *L, node *e, int from, int count, int *idx) {
  int bad = 0;
  for (int i = 0; i < count; i++) {
    int c;
    int64_t k;
    if (lang_index(L, e->kids[from + i], &idx[i], &c, &k) < 0) bad = 1;
  }
  return bad ? -1 : 0;
}

static void count_error(lower *L, node *e, const char *what, int want, int got) {
  ERR(L, e,
      "%s: '%s' has %d dimension%s but %d ind%s given (the index count must match the %s's "
      "dimension)",
      e->name, e->kids[0]->name, want, want == 1 ? "" : "s", got, got == 1 ? "ex was" : "ices were",
      what);
}

static int activity(lower *L, node *e, int op, lval *out) {
  lbind bd;
  int idx[FB_MAX_AXES];
  lv_unknown(out);
  if (target(L, e, &bd) < 0) return -1;
  int nidx = e->nkids - 1, sn, bad = 0;
  if (bd.kind == LB_UNKNOWN) {
    for (int i = 1; i < e->nkids; i++) {
      lval v;
      lang_eval(L, e->kids[i], &v);
    }
    return 0;
  }
  const char *what = bd.kind == LB_FIELD ? "field" : "SNode";
  sn = bd.kind == LB_FIELD ? L->p->fields[bd.index].pub.snode : L->p->snodes[bd.index].id;
  if (sn == 0) {
    ERR(L, e->kids[0], "%s: '%s' is a 0-D field and has no SNode whose cells could be active",
        e->name, e->kids[0]->name);
    return -1;
  }
  const fb_snode *cell = &L->p->layout->nodes[sn];
  if (op == FB_OP_DEACTIVATE && cell->kind != FB_SN_BITMASKED && cell->kind != FB_SN_POINTER &&
      cell->kind != FB_SN_DYNAMIC) {
    /* said here in the program's terms, not by the IR verifier */
    ERR(L, e->kids[0],
        "deactivate: %s '%s' %s a %s SNode, whose cells are always active; only bitmasked, "
        "pointer and dynamic cells can be deactivated (to clear a value, write 0 to it)",
        what, e->kids[0]->name, bd.kind == LB_FIELD ? "is in" : "is", fb_snode_kind_name(cell->kind));
    return -1;
  }
  int ndim = cell->ndim;
  if (lang_indices(L, e->kids + 1, e->nkids - 1, idx, &nidx) < 0) return -1;
  if (nidx != ndim) {
    count_error(L, e, what, ndim, nidx);
    bad = 1;
  }
  if (bad) return -1;
  int id = fb_b_global(&L->b, (fb_op)op, sn, idx, nidx, -1);
  if (op == FB_OP_IS_ACTIVE) lv_scalar(out, FB_T_BOOL, id);
  else out->kind = VK_VOID;
  return 0;
}

/* A place under a dynamic SNode for append / length. */
static int dyn_place(lower *L, node *e, const lbind *bind, int *place, int *ndim, int for_append) {
  const fb_program *p = L->p;
  lbind b = *bind;
  const lbind *bd = &b;
  const char *nm = e->kids[0]->name;
  if (bd->kind == LB_SNODE) {
    int sn = p->snodes[bd->index].id;
    if (for_append || p->layout->nodes[sn].kind != FB_SN_DYNAMIC) {
      ERR(L, e->kids[0], "%s needs a field under a dynamic SNode, but '%s' is a %s SNode%s",
          e->name, nm, fb_snode_kind_name(p->layout->nodes[sn].kind),
          for_append ? " (append to one of its fields)" : "");
      return -1;
    }
    for (int i = 0; i < p->nfields; i++)
      if (p->fields[i].pub.snode == sn) {
        b.kind = LB_FIELD;
        b.index = i;
        break;
      }
    if (b.kind != LB_FIELD) return -1;
  }
  const lfield *f = &p->fields[bd->index];
  if (!f->dyn) {
    const fb_snode *s = &p->layout->nodes[f->pub.snode];
    ERR(L, e->kids[0], "%s needs a field under a dynamic SNode, but '%s' is placed in %s %s SNode",
        e->name, nm, s->kind == FB_SN_ROOT ? "the" : "a",
        s->kind == FB_SN_ROOT ? "root" : fb_snode_kind_name(s->kind));
    return -1;
  }
  if (for_append && f->pub.ncomp != 1) {
    ERR(L, e->kids[0], "append works on scalar fields; '%s' holds vectors or matrices", nm);
    return -1;
  }
  *place = f->places[0];
  *ndim = f->pub.ndim;
  return 0;
}

static int append_length(lower *L, node *e, int is_append, lval *out) {
  lbind bd;
  int idx[FB_MAX_AXES], place, ndim;
  lv_unknown(out);
  if (target(L, e, &bd) < 0) return -1;
  if (bd.kind == LB_UNKNOWN) {
    for (int i = 1; i < e->nkids; i++) {
      lval v;
      lang_eval(L, e->kids[i], &v);
    }
    return 0;
  }
  if (dyn_place(L, e, &bd, &place, &ndim, is_append) < 0) return -1;
  int nidx = e->nkids - 1 - is_append;
  if (nidx != ndim - 1) {
    ERR(L, e,
        "%s(%s, ...) expects %d ind%s (the axes above the dynamic one)%s, found %d argument%s",
        e->name, e->kids[0]->name, ndim - 1, ndim - 1 == 1 ? "ex" : "ices",
        is_append ? " and a value" : "", e->nkids - 1, e->nkids - 1 == 1 ? "" : "s");
    return -1;
  }
  if (index_args(L, e, 1, nidx, idx) < 0) return -1;
  int value = -1;
  if (is_append) {
    lval v;
    node *vn = e->kids[e->nkids - 1];
    if (lang_eval(L, vn, &v) < 0) return -1;
    lty ft = {L->p->layout->nodes[place].type, 0, 0};
    if (lv_convert(L, &v, ft, vn, "the value of append") < 0) return -1;
    if (v.kind == VK_UNKNOWN) return 0;
    value = v.id[0];
  }
  int id = fb_b_global(&L->b, is_append ? FB_OP_APPEND : FB_OP_LENGTH, place, idx, nidx, value);
  lv_scalar(out, FB_T_I32, id);
  return 0;
}

static int assume_unique(lower *L, node *e, lval *out) {
  lbind bd;
  lv_unknown(out);
  if (!nargs_is(L, e, 1)) return -1;
  if (!e->b || e->b->kind != E_NAME || !lang_resolve_field(L, e->b->name, &bd) ||
      bd.kind == LB_SNODE) {
    ERR(L, e->b ? e->b : e, "assume_unique(e, covers: FIELD) needs the field its index covers");
    return -1;
  }
  lval v;
  if (lang_eval(L, e->kids[0], &v) < 0) return -1;
  if (v.kind == VK_UNKNOWN || bd.kind == LB_UNKNOWN) {
    *out = v;
    return 0;
  }
  char b[64];
  if (v.kind != VK_SCALAR || v.lit == LIT_FLOAT || (!v.lit && !fb_type_is_int(v.t))) {
    ERR(L, e->kids[0], "assume_unique expects an integer index, found %s", lv_str(&v, b, sizeof b));
    return -1;
  }
  lv_materialize(L, &v, lv_default_type(&v));
  lv_scalar(out, v.t, fb_b_hint_unique(&L->b, v.id[0], L->p->fields[bd.index].places[0]));
  return 0;
}

/* ---------------------------------------------------------------- atomics */

static const struct {
  const char *name;
  int op, tok;
} atomics[] = {{"atomic_add", FB_OP_ATOMIC_ADD, T_PLUS}, {"atomic_sub", FB_OP_ATOMIC_SUB, T_MINUS},
               {"atomic_min", FB_OP_ATOMIC_MIN, LOP_MIN}, {"atomic_max", FB_OP_ATOMIC_MAX, LOP_MAX},
               {"atomic_and", FB_OP_ATOMIC_AND, T_AMP},   {"atomic_or", FB_OP_ATOMIC_OR, T_PIPE},
               {"atomic_xor", FB_OP_ATOMIC_XOR, T_CARET}};

/* atomic_OP(target, v): target op= v, returning the value before. On a
 * field element it is one atomic operation; on a local variable (private
 * to the iteration) a read and a write. */
static int atomic_call(lower *L, node *e, int k, lval *out) {
  lref r;
  lval v, old, nv;
  char b[64], what[96];
  lv_unknown(out);
  if (!nargs_is(L, e, 2)) return -1;
  node *tg = e->kids[0];
  if (lang_ref(L, tg, &r) < 0) return -1;
  if (lang_eval(L, e->kids[1], &v) < 0) return -1;
  if (r.kind == REF_UNKNOWN || v.kind == VK_UNKNOWN) return 0;
  if (r.kind == REF_VALUE) {
    ERR(L, tg,
        "%s changes its first argument: it must be a field element or a variable (declared "
        "with var), found %s",
        e->name, r.is_let ? "a name declared with let, a parameter or a loop variable" : "a value");
    return -1;
  }
  if (r.kind == REF_VAR && r.par < L->par_depth) {
    ERR(L, tg,
        "%s cannot change '%s' inside a parallel loop: it is declared outside the loop "
        "(iterations run in parallel; use a field element instead)",
        e->name, r.name);
    return -1;
  }
  lty t = lang_ref_type(&r);
  int op = atomics[k].tok;
  if ((op == T_AMP || op == T_PIPE || op == T_CARET) && !fb_type_is_int(t.t)) {
    ERR(L, tg, "%s needs integers, '%s' holds %s", e->name, r.name ? r.name : "the target",
        lang_ty_str(t, b, sizeof b));
    return -1;
  }
  snprintf(what, sizeof what, "the value of %s", e->name);
  if (lv_convert(L, &v, t, e->kids[1], what) < 0) return -1;
  if (r.kind == REF_FIELD) {
    if (lang_ref_atomic(L, &r, &v, atomics[k].op, out) < 0) {
      ERR(L, tg,
          "%s on a component chosen at run time is not supported: index the component with a "
          "constant",
          e->name);
      return -1;
    }
    return 0;
  }
  lang_ref_read(L, &r, &old);
  if (lv_binary(L, op, &old, &v, &nv, e) < 0) return -1;
  if (lv_convert(L, &nv, t, e, what) < 0) return -1;
  lang_ref_write(L, &r, &nv, FB_OP_STORE);
  *out = old;
  return 0;
}

/* ---------------------------------------------------------------- rescale_index */

static int snode_of(lower *L, node *a, const char *fn, int *sn) {
  lbind bd;
  if (!a || a->kind != E_NAME || !lang_resolve_field(L, a->name, &bd)) {
    if (a && a->kind == E_NAME && !lang_lookup(L, a->name))
      ERR(L, a, "%s: unknown field or SNode '%s'", fn, a->name);
    else ERR(L, a, "%s expects a field or SNode name here", fn);
    return -1;
  }
  if (bd.kind == LB_UNKNOWN) return 1;
  *sn = bd.kind == LB_FIELD ? L->p->fields[bd.index].pub.snode : L->p->snodes[bd.index].id;
  return 0;
}

/* rescale_index(A, B, I): the index I of A's index space mapped into B's
 * (Taichi's ti.rescale_index): per axis of B, I // (A's extent / B's). */
static int rescale_index(lower *L, node *e, lval *out) {
  int sa = -1, sb = -1, idx[FB_MAX_AXES], nidx;
  lv_unknown(out);
  if (e->nkids < 3) {
    ERR(L, e, "rescale_index takes a field or SNode, another, and an index (a vector or "
              "scalars), found %d argument%s",
        e->nkids, e->nkids == 1 ? "" : "s");
    return -1;
  }
  int ra = snode_of(L, e->kids[0], e->name, &sa), rb = snode_of(L, e->kids[1], e->name, &sb);
  if (ra < 0 || rb < 0) return -1;
  if (lang_indices(L, e->kids + 2, e->nkids - 2, idx, &nidx) < 0) return -1;
  if (ra || rb) return 0; /* an unbound field parameter */
  const fb_snode *A = &L->p->layout->nodes[sa], *B = &L->p->layout->nodes[sb];
  const char *an = e->kids[0]->name, *bn = e->kids[1]->name;
  if (nidx != A->ndim) {
    ERR(L, e, "rescale_index: '%s' has %d dimension%s but the index has %d", an, A->ndim,
        A->ndim == 1 ? "" : "s", nidx);
    return -1;
  }
  if (B->ndim == 0) {
    ERR(L, e->kids[1], "rescale_index: '%s' is 0-D and has no index to rescale to", bn);
    return -1;
  }
  lv_vec_init(out, FB_T_I32, B->ndim);
  for (int d = 0; d < B->ndim; d++) {
    int ax = B->dim_axis[d], da = -1;
    for (int j = 0; j < A->ndim; j++)
      if (A->dim_axis[j] == ax) da = j;
    int64_t ea = A->shape[ax], eb = B->shape[ax];
    if (da < 0 || eb > ea || ea % eb) {
      static const char axn[] = "ijkl";
      if (da < 0)
        ERR(L, e, "rescale_index: the index spaces of '%s' and '%s' do not nest: '%s' has axis "
                  "%c and '%s' does not",
            an, bn, bn, axn[ax], an);
      else
        ERR(L, e, "rescale_index: the index spaces of '%s' and '%s' do not nest: along axis %c "
                  "'%s' has %lld cells and '%s' %lld, which does not divide it",
            an, bn, axn[ax], an, (long long)ea, bn, (long long)eb);
      lv_unknown(out);
      return -1;
    }
    int64_t ratio = ea / eb;
    out->id[d] = ratio == 1 ? idx[da]
                            : lw_bin(L, FB_OP_FLOORDIV, idx[da], lw_const(L, FB_T_I32, 0, ratio));
  }
  return 0;
}

/* ---------------------------------------------------------------- dispatch */

static int find_func(const fb_program *p, const char *name) {
  for (int i = 0; i < p->nfuncs; i++)
    if (!strcmp(p->funcs[i].name, name)) return i;
  return -1;
}

static int builtin_call(lower *L, node *e, lval *out) {
  const char *nm = e->name;
  if (!strcmp(nm, "is_active")) return activity(L, e, FB_OP_IS_ACTIVE, out);
  if (!strcmp(nm, "activate")) return activity(L, e, FB_OP_ACTIVATE, out);
  if (!strcmp(nm, "deactivate")) return activity(L, e, FB_OP_DEACTIVATE, out);
  if (!strcmp(nm, "append")) return append_length(L, e, 1, out);
  if (!strcmp(nm, "length")) return append_length(L, e, 0, out);
  if (!strcmp(nm, "assume_unique")) return assume_unique(L, e, out);
  for (size_t i = 0; i < sizeof atomics / sizeof atomics[0]; i++)
    if (!strcmp(nm, atomics[i].name)) return atomic_call(L, e, (int)i, out);
  if (!strcmp(nm, "rescale_index")) return rescale_index(L, e, out);
  if (!strcmp(nm, "ndrange") || !strcmp(nm, "grouped")) {
    ERR(L, e, "%s(...) is only allowed as the iterable of a for loop", nm);
    return -1;
  }
  for (int i = 0; i < e->nkids; i++)
    if (e->kids[i]->kind == E_KWARG) {
      ERR(L, e->kids[i], "%s takes no arguments given by name ('%s = ...')", nm,
          e->kids[i]->name);
      return -1;
    }
  if (!strcmp(nm, "random")) {
    if (!nargs_is(L, e, 0)) return -1;
    lv_scalar(out, FB_T_F32, fb_b_rand(&L->b, L->rand_site++));
    return 0;
  }
  if (!strcmp(nm, "svd") || !strcmp(nm, "polar")) {
    ERR(L, e, "%s returns several matrices: bind them with let %s = %s(M)", nm,
        nm[0] == 's' ? "(U, S, V)" : "(R, S)", nm);
    return -1;
  }
  if (!strcmp(nm, "range")) {
    ERR(L, e, "range() is only allowed as the iterable of a for loop");
    return -1;
  }
  return 1;
}

int lang_call(lower *L, node *e, lval *out) {
  lv_unknown(out);
  int fi = find_func(L->p, e->name);
  if (fi >= 0) return lang_inline(L, fi, e, out);
  if (e->b && strcmp(e->name, "assume_unique")) {
    ERR(L, e->b, "'covers:' is only an argument of assume_unique");
    return -1;
  }
  if (fb_program_find_kernel(L->p, e->name) >= 0) {
    ERR(L, e, "'%s' is a kernel: kernels are launched by the host, not called (use a func)",
        e->name);
    return -1;
  }
  int rc = builtin_call(L, e, out);
  if (rc <= 0) return rc;
  lval args[8];
  if (e->nkids > 8) {
    ERR(L, e, "too many arguments to %s", e->name);
    return -1;
  }
  int unknown = 0;
  for (int i = 0; i < e->nkids; i++) {
    if (lang_eval(L, e->kids[i], &args[i]) < 0) return -1;
    if (args[i].kind == VK_UNKNOWN) unknown = 1;
  }
  if (lang_vec_builtin(L, e, args, e->nkids, out)) return 0;
  if (!lang_is_pure_builtin(e->name)) {
    ERR(L, e, "unknown function '%s'", e->name);
    return -1;
  }
  if (unknown) return 0;
  rc = math_call(L, e, args, e->nkids, out);
  if (rc < 0) lv_unknown(out);
  return rc < 0 ? -1 : 0;
}
