/* Type checking and lowering of expressions: scalarized values (lval),
 * untyped literals and promotion, implicit and explicit conversions, names
 * and index expressions as references (local variables, lets, field
 * elements, components with constant or run-time indices), and the scalar
 * and logic operators. Vector/matrix arithmetic is in lang_vec.c, calls in
 * lang_call.c, statements in lang_stmt.c.
 *
 * Values that cannot be typed (errors, unbound `field` parameters while a
 * kernel is checked on its own) are VK_UNKNOWN: every operation on them
 * yields VK_UNKNOWN without further messages, so one mistake gives one
 * error. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>

#include "ir/arith.h"
#include "lang_internal.h"

#define ERR(L, at, ...) ((L)->errors++, lang_err((L)->d, (at)->line, (at)->col, __VA_ARGS__))

/* ---------------------------------------------------------------- values */

void lv_unknown(lval *v) {
  memset(v, 0, sizeof *v);
  v->kind = VK_UNKNOWN;
}

void lv_scalar(lval *v, fb_type t, int id) {
  memset(v, 0, sizeof *v);
  v->kind = VK_SCALAR;
  v->t = t;
  v->n = 1;
  v->id[0] = id;
}

int lv_is_unknown(const lval *v) { return v->kind == VK_UNKNOWN; }

fb_type lv_default_type(const lval *v) {
  if (v->lit == LIT_INT) return FB_T_I32;
  if (v->lit == LIT_FLOAT) return FB_T_F32;
  return v->t;
}

lty lv_type(const lval *v) {
  lty t = {lv_default_type(v), v->rows, v->cols};
  return t;
}

const char *lang_ty_str(lty t, char *buf, size_t n) {
  if (t.rows == 0) snprintf(buf, n, "%s", fb_type_name(t.t));
  else if (t.cols == 0) snprintf(buf, n, "%s[%d]", fb_type_name(t.t), t.rows);
  else snprintf(buf, n, "%s[%d][%d]", fb_type_name(t.t), t.rows, t.cols);
  return buf;
}

const char *lv_str(const lval *v, char *buf, size_t n) {
  if (v->kind == VK_VOID) {
    snprintf(buf, n, "no value");
    return buf;
  }
  if (v->kind == VK_TUPLE) {
    snprintf(buf, n, "a tuple");
    return buf;
  }
  if (v->lit && v->kind == VK_SCALAR) {
    snprintf(buf, n, "%s literal", v->lit == LIT_INT ? "an integer" : "a float");
    return buf;
  }
  lang_ty_str(lv_type(v), buf, n);
  if (v->lit) {
    size_t m = strlen(buf);
    snprintf(buf + m, n - m, " literal");
  }
  return buf;
}

/* ---------------------------------------------------------------- emission */

fb_type lw_type(lower *L, int id) {
  return id >= 0 && id < L->k->nstmts ? (fb_type)L->k->stmts[id].type : FB_T_VOID;
}

/* A constant of type t: from f when t is a float type, else from i, each
 * converted as the IR converts (fb_value_cast: the arithmetic run time uses). */
int lw_const(lower *L, fb_type t, double f, int64_t i) {
  fb_value v = fb_type_is_float(t) ? fb_value_f64(f) : fb_value_i64(i);
  return fb_b_const(&L->b, fb_value_cast(v, t));
}

int lw_bin(lower *L, int op, int a, int c) { return fb_b_binary(&L->b, (fb_op)op, a, c); }
int lw_un(lower *L, int op, int a) { return fb_b_unary(&L->b, (fb_op)op, a); }
int lw_select(lower *L, int c, int a, int b) { return fb_b_select(&L->b, c, a, b); }

int lw_cast(lower *L, fb_type to, int a) {
  fb_type from = lw_type(L, a);
  if (from == to || a < 0) return a;
  if (to == FB_T_BOOL) return lw_bin(L, FB_OP_NE, a, lw_const(L, from, 0, 0));
  if (from == FB_T_BOOL) {
    int one = lw_const(L, to, 1, 1), zero = lw_const(L, to, 0, 0);
    return lw_select(L, a, one, zero);
  }
  return fb_b_cast(&L->b, to, a);
}

/* Component c of an untyped literal as the value it stands for: an i64 or
 * an f64 (literals compute in those, docs/language.md). */
static fb_value lit_value(const lval *v, int c) {
  return v->lit == LIT_FLOAT ? fb_value_f64(v->cv[c]) : fb_value_i64(v->ci[c]);
}

/* A literal becomes a constant of type t by the cast run time does on that
 * i64 or f64 (fb_value_cast in ir/arith.c: floats saturate into integers,
 * NaN is 0, integers wrap, non-zero is true), straight from the literal's
 * own value, never through another integer type first; ci and cv then
 * hold that constant's value. */
void lv_materialize(lower *L, lval *v, fb_type t) {
  if (v->kind < VK_SCALAR || v->kind == VK_TUPLE) return;
  if (v->lit) {
    for (int c = 0; c < v->n; c++) {
      fb_value x = fb_value_cast(lit_value(v, c), t);
      v->id[c] = fb_b_const(&L->b, x);
      v->ci[c] = fb_value_as_i64(x);
      v->cv[c] = fb_value_as_f64(x);
    }
    v->lit = LIT_NONE;
    v->t = t;
    v->has_const = 1;
    return;
  }
  if (v->t == t) return;
  for (int c = 0; c < v->n; c++) v->id[c] = lw_cast(L, t, v->id[c]);
  v->t = t;
  v->has_const = 0;
}

/* An explicit cast: of a literal, folded as run time casts its i64 or f64
 * (lv_materialize); of anything else, the IR's cast. */
void lv_cast(lower *L, lval *v, fb_type t) { lv_materialize(L, v, t); }

/* Implicit conversions: never lose the kind of value (bool, int, float). */
static int implicit_ok(fb_type from, fb_type to) {
  if (from == to) return 1;
  if (from == FB_T_BOOL || to == FB_T_BOOL) return 0;
  if (fb_type_is_float(to)) return fb_type_is_int(from) || fb_type_bits(from) <= fb_type_bits(to);
  if (fb_type_is_float(from)) return 0;
  if (fb_type_is_signed(from) && !fb_type_is_signed(to)) return 0;
  return fb_type_bits(from) < fb_type_bits(to) ||
         (fb_type_bits(from) == fb_type_bits(to) &&
          fb_type_is_signed(from) == fb_type_is_signed(to));
}

static void broadcast(lval *v, int rows, int cols) {
  int n = rows * (cols ? cols : 1);
  for (int c = 1; c < n; c++) {
    v->id[c] = v->id[0];
    v->ci[c] = v->ci[0];
    v->cv[c] = v->cv[0];
  }
  v->n = n;
  v->rows = (uint8_t)rows;
  v->cols = (uint8_t)cols;
  v->kind = cols ? VK_MAT : VK_VEC;
}

void lang_expr_pos(const node *e, int *line, int *col) {
  *line = e->line;
  *col = e->col;
  const node *l = NULL;
  switch (e->kind) {
  case E_BINARY:
  case E_TERNARY:
  case E_INDEX: l = e->a; break;
  case E_CMP: l = e->nkids ? e->kids[0] : NULL; break;
  default: break;
  }
  if (!l) return;
  int ll, lc;
  lang_expr_pos(l, &ll, &lc);
  if (ll < *line || (ll == *line && lc < *col)) {
    *line = ll;
    *col = lc;
  }
}

int lv_convert(lower *L, lval *v, lty target, node *at, const char *what) {
  if (v->kind == VK_UNKNOWN) return 0;
  int line, col;
  lang_expr_pos(at, &line, &col);
  char fb[64], tb[64];
  if (v->kind == VK_VOID || v->kind == VK_TUPLE ||
      (v->kind != VK_SCALAR && (v->rows != target.rows || v->cols != target.cols))) {
    L->errors++;
    lang_err(L->d, line, col, "type mismatch in %s: expected %s, found %s", what,
             lang_ty_str(target, tb, sizeof tb), lv_str(v, fb, sizeof fb));
    return -1;
  }
  int ok;
  if (v->lit == LIT_INT) ok = target.t != FB_T_BOOL;
  else if (v->lit == LIT_FLOAT) ok = fb_type_is_float(target.t);
  else ok = implicit_ok(v->t, target.t) || v->t == FB_T_BOOL; /* a bool is 0 or 1 */
  if (!ok) {
    L->errors++;
    lang_err(L->d, line, col, "type mismatch in %s: expected %s, found %s%s", what,
             lang_ty_str(target, tb, sizeof tb), lv_str(v, fb, sizeof fb),
             target.t != FB_T_BOOL && v->t != FB_T_BOOL ? " (convert explicitly, e.g. with a cast)"
                                                        : "");
    return -1;
  }
  lv_materialize(L, v, target.t);
  if (v->kind == VK_SCALAR && target.rows) broadcast(v, target.rows, target.cols);
  return 0;
}

/* ---------------------------------------------------------------- symbols */

int lang_push_sym(lower *L, const char *name, int kind, const lval *v, int line, int col) {
  if (FB_GROW(L->syms, L->nsyms, L->scap)) {
    L->b.err = FB_ENOMEM;
    return -1;
  }
  lsym *s = &L->syms[L->nsyms];
  memset(s, 0, sizeof *s);
  s->name = name;
  s->kind = kind;
  if (v) s->v = *v;
  s->par = L->par_depth;
  s->line = line;
  s->col = col;
  return L->nsyms++;
}

lsym *lang_lookup(lower *L, const char *name) {
  int base = L->nframes ? L->frames[L->nframes - 1].sym_base : 0;
  for (int i = L->nsyms - 1; i >= base; i--)
    if (!strcmp(L->syms[i].name, name)) return &L->syms[i];
  return NULL;
}

int lang_resolve_field(lower *L, const char *name, lbind *out) {
  lsym *s = lang_lookup(L, name);
  if (s) {
    if (s->kind != SYM_FIELD) return 0;
    *out = s->bind;
    return 1;
  }
  int f = fb_program_find_field(L->p, name);
  if (f >= 0) {
    out->kind = LB_FIELD;
    out->index = f;
    return 1;
  }
  int sn = lang_find_snode(L->p, name);
  if (sn >= 0) {
    out->kind = LB_SNODE;
    out->index = sn;
    return 1;
  }
  return 0;
}

/* ---------------------------------------------------------------- indices */

int lang_index(lower *L, node *e, int *id, int *is_const, int64_t *k) {
  lval v;
  *id = -1;
  *is_const = 0;
  *k = 0;
  if (lang_eval(L, e, &v) < 0 || v.kind == VK_UNKNOWN) return -1;
  char b[64];
  if (v.kind != VK_SCALAR || (!v.lit && !fb_type_is_int(v.t)) || v.lit == LIT_FLOAT) {
    ERR(L, e, "an index must be an integer, found %s", lv_str(&v, b, sizeof b));
    return -1;
  }
  if (v.has_const) {
    *is_const = 1;
    *k = v.ci[0];
  }
  if (v.lit) lv_materialize(L, &v, FB_T_I32);
  *id = lw_cast(L, FB_T_I32, v.id[0]);
  return 0;
}

/* The indices of a field element or a sparse builtin: each expression an
 * integer, or an integer vector that gives one index per component (Taichi's
 * x[I] with I = base + offset), so x[v] with v: i32[2] is x[v[0], v[1]] and
 * x[v, k] is x[v[0], v[1], k]. Fills idx (room for FB_MAX_AXES) with i32
 * statements and *count with how many the expressions give (even past
 * FB_MAX_AXES); -1 after an error in an expression (reported). */
int lang_indices(lower *L, node **kids, int n, int *idx, int *count) {
  int bad = 0;
  *count = 0;
  for (int i = 0; i < n; i++) {
    lval v;
    if (lang_eval(L, kids[i], &v) < 0 || v.kind == VK_UNKNOWN) {
      bad = 1;
      continue;
    }
    char b[64];
    int is_int = v.lit ? v.lit == LIT_INT : fb_type_is_int(v.t);
    if ((v.kind != VK_SCALAR && v.kind != VK_VEC) || !is_int) {
      ERR(L, kids[i], "an index must be an integer or a vector of integers, found %s",
          lv_str(&v, b, sizeof b));
      bad = 1;
      continue;
    }
    if (v.lit) lv_materialize(L, &v, FB_T_I32);
    for (int c = 0; c < v.n; c++, (*count)++)
      if (*count < FB_MAX_AXES) idx[*count] = lw_cast(L, FB_T_I32, v.id[c]);
  }
  return bad ? -1 : 0;
}

/* ---------------------------------------------------------------- references */

static int rank_of(lty t) { return t.rows == 0 ? 0 : t.cols == 0 ? 1 : 2; }

static void field_error(lower *L, node *at, const char *name, lbind bd) {
  if (bd.kind == LB_SNODE) {
    ERR(L, at, "'%s' is an SNode, not a value: only fields can be read or written", name);
  } else if (bd.kind == LB_FIELD && L->p->fields[bd.index].pub.ndim == 0) {
    ERR(L, at, "field '%s' is 0-D: access it as %s[]", name, name);
  } else {
    ERR(L, at, "field '%s' needs indices: write %s[i, ...]", name, name);
  }
}

static int ref_name(lower *L, node *e, lref *r) {
  lsym *s = lang_lookup(L, e->name);
  lbind bd;
  const lconst *c;
  if (s && s->kind == SYM_LET) {
    r->kind = REF_VALUE;
    r->v = s->v;
    r->is_let = 1;
    r->origin = s->origin;
  } else if (s && s->kind == SYM_VAR) {
    r->kind = REF_VAR;
    r->v = s->v;
    r->par = s->par;
  } else if (lang_resolve_field(L, e->name, &bd)) {
    if (bd.kind != LB_UNKNOWN) field_error(L, e, e->name, bd);
    return -1;
  } else if ((c = lang_find_const(L->p, e->name))) { /* an untyped literal */
    if (!c->ok) return -1;                            /* its error is reported */
    memset(&r->v, 0, sizeof r->v);
    r->kind = REF_VALUE;
    r->v.kind = VK_SCALAR;
    r->v.lit = c->is_float ? LIT_FLOAT : LIT_INT;
    r->v.n = 1;
    r->v.has_const = 1;
    r->v.ci[0] = c->i;
    r->v.cv[0] = c->f;
    r->is_let = 1;
    r->origin = ORIGIN_CONST;
  } else if (strlen(e->name) > 5 && !strcmp(e->name + strlen(e->name) - 5, ".grad")) {
    ERR(L, e, "'%.*s' has no gradient: declare it with 'place %.*s: f32 grad' (or f64)",
        (int)strlen(e->name) - 5, e->name, (int)strlen(e->name) - 5, e->name);
    return -1;
  } else if (strlen(e->name) > 5 && !strcmp(e->name + strlen(e->name) - 5, ".dual")) {
    ERR(L, e, "'%.*s' has no dual: declare it with 'place %.*s: f32 dual' (or f64)",
        (int)strlen(e->name) - 5, e->name, (int)strlen(e->name) - 5, e->name);
    return -1;
  } else {
    ERR(L, e, "undefined variable '%s'", e->name);
    return -1;
  }
  r->name = e->name;
  r->base = lv_type(&r->v);
  if (r->v.kind == VK_UNKNOWN) r->kind = REF_UNKNOWN;
  return 0;
}

static int ref_field(lower *L, node *e, lbind bd, lref *r) {
  const char *name = e->a->name;
  int bad = 0, nidx = 0;
  if (bd.kind == LB_SNODE) {
    ERR(L, e, "'%s' is an SNode, not a field: it has no values to index", name);
    bad = 1;
  }
  if (lang_indices(L, e->kids, e->nkids, r->idx, &nidx) < 0) bad = 1;
  if (!bad && bd.kind == LB_FIELD) {
    const lfield *f = &L->p->fields[bd.index];
    if (f->pub.ndim != nidx) {
      int vec = nidx != e->nkids;
      ERR(L, e,
          "field '%s' has %d dimension%s but %d ind%s given (the index count must match the "
          "field's dimension%s)",
          name, f->pub.ndim, f->pub.ndim == 1 ? "" : "s", nidx, nidx == 1 ? "ex was" : "ices were",
          vec ? "; a vector index counts one per component" : "");
      bad = 1;
    }
  }
  if (bad || bd.kind != LB_FIELD) return -1;
  const lfield *f = &L->p->fields[bd.index];
  r->kind = REF_FIELD;
  r->field = bd.index;
  r->nidx = nidx;
  r->name = name;
  r->base.t = f->pub.type;
  r->base.rows = (uint8_t)f->pub.rows;
  r->base.cols = (uint8_t)f->pub.cols;
  return 0;
}

static int ref_sub(lower *L, node *e, lref *r) {
  char b[64];
  int rank = rank_of(r->base);
  if (rank == 0) {
    ERR(L, e, "cannot index %s%s%s: it is a scalar (%s)", r->name ? "'" : "this value",
        r->name ? r->name : "", r->name ? "'" : "", lang_ty_str(r->base, b, sizeof b));
    return -1;
  }
  for (int i = 0; i < e->nkids; i++) {
    if (r->nsub >= rank) {
      ERR(L, e->kids[i], "wrong number of indices: %s takes %d ind%s, found %d",
          lang_ty_str(r->base, b, sizeof b), rank, rank == 1 ? "ex" : "ices",
          r->nsub + e->nkids - i);
      return -1;
    }
    int dim = r->nsub == 0 ? r->base.rows : r->base.cols;
    lsub *s = &r->sub[r->nsub];
    int c;
    int64_t k;
    if (lang_index(L, e->kids[i], &s->id, &c, &k) < 0) return -1;
    if (c && (k < 0 || k >= dim)) {
      ERR(L, e->kids[i], "index %lld is out of range for %s (0 to %d)", (long long)k,
          lang_ty_str(r->base, b, sizeof b), dim - 1);
      return -1;
    }
    s->dyn = !c;
    s->k = (int)k;
    r->nsub++;
  }
  if (e->nkids == 0) {
    ERR(L, e, "expected an index inside '[]' (only 0-D fields are written x[])");
    return -1;
  }
  return 0;
}

int lang_ref(lower *L, node *e, lref *r) {
  memset(r, 0, sizeof *r);
  r->kind = REF_UNKNOWN;
  if (e->kind == E_NAME) return ref_name(L, e, r);
  if (e->kind == E_INDEX) {
    lbind bd;
    if (e->a->kind == E_NAME && lang_resolve_field(L, e->a->name, &bd)) {
      if (ref_field(L, e, bd, r) < 0) {
        r->kind = REF_UNKNOWN;
        return bd.kind == LB_UNKNOWN ? 0 : -1;
      }
      return 0;
    }
    if (e->a->kind == E_NAME && !lang_lookup(L, e->a->name)) {
      size_t nl = strlen(e->a->name);
      if (nl > 5 && !strcmp(e->a->name + nl - 5, ".grad"))
        ERR(L, e->a, "'%.*s' has no gradient: declare it with 'place %.*s: f32 grad' (or f64)",
            (int)nl - 5, e->a->name, (int)nl - 5, e->a->name);
      else if (nl > 5 && !strcmp(e->a->name + nl - 5, ".dual"))
        ERR(L, e->a, "'%.*s' has no dual: declare it with 'place %.*s: f32 dual' (or f64)",
            (int)nl - 5, e->a->name, (int)nl - 5, e->a->name);
      else
        ERR(L, e->a, "unknown field '%s' (no field, SNode or variable has this name)",
            e->a->name);
      return -1;
    }
    if (lang_ref(L, e->a, r) < 0) return -1;
    if (r->kind == REF_UNKNOWN) {
      for (int i = 0; i < e->nkids; i++) {
        int id, c;
        int64_t k;
        lang_index(L, e->kids[i], &id, &c, &k);
      }
      return 0;
    }
    return ref_sub(L, e, r);
  }
  r->kind = REF_VALUE;
  if (lang_eval(L, e, &r->v) < 0) return -1;
  if (r->v.kind == VK_UNKNOWN) {
    r->kind = REF_UNKNOWN;
    return 0;
  }
  if (r->v.kind == VK_VOID || r->v.kind == VK_TUPLE) {
    char b[64];
    ERR(L, e, "expected a value, found %s", lv_str(&r->v, b, sizeof b));
    return -1;
  }
  r->base = lv_type(&r->v);
  return 0;
}

lty lang_ref_type(const lref *r) {
  lty t = r->base;
  if (r->nsub == 0) return t;
  if (t.cols == 0 || r->nsub == 2) {
    t.rows = t.cols = 0;
    return t;
  }
  t.rows = t.cols; /* a row of a matrix */
  t.cols = 0;
  return t;
}

/* Candidate base components of each result slot, with the run-time index
 * values (row, col; -1 when not checked) that select each. */
typedef struct lslot {
  int n;
  int comp[LANG_MAX_COMP];
  int row[LANG_MAX_COMP], col[LANG_MAX_COMP];
} lslot;

static int ref_slots(const lref *r, lslot *s) {
  lty b = r->base;
  int R = b.rows ? b.rows : 1, C = b.cols ? b.cols : 1;
  int nslots = r->nsub == 0 ? R * C : (b.cols && r->nsub == 1 ? C : 1);
  for (int i = 0; i < nslots; i++) {
    lslot *sl = &s[i];
    sl->n = 0;
    if (r->nsub == 0) {
      sl->comp[0] = i;
      sl->row[0] = sl->col[0] = -1;
      sl->n = 1;
      continue;
    }
    const lsub *rs = &r->sub[0];
    int r0 = rs->dyn ? 0 : rs->k, r1 = rs->dyn ? R - 1 : rs->k;
    int c0 = i, c1 = i;
    if (r->nsub == 2) {
      const lsub *cs = &r->sub[1];
      c0 = cs->dyn ? 0 : cs->k;
      c1 = cs->dyn ? C - 1 : cs->k;
    }
    for (int rr = r0; rr <= r1; rr++)
      for (int cc = c0; cc <= c1; cc++) {
        sl->comp[sl->n] = b.cols ? rr * C + cc : rr;
        sl->row[sl->n] = rs->dyn ? rr : -1;
        sl->col[sl->n] = r->nsub == 2 && r->sub[1].dyn ? cc : -1;
        sl->n++;
      }
  }
  return nslots;
}

static int slot_guard(lower *L, const lref *r, const lslot *s, int j) {
  int g = -1;
  if (s->row[j] >= 0) g = lw_bin(L, FB_OP_EQ, r->sub[0].id, lw_const(L, FB_T_I32, 0, s->row[j]));
  if (s->col[j] >= 0) {
    int h = lw_bin(L, FB_OP_EQ, r->sub[1].id, lw_const(L, FB_T_I32, 0, s->col[j]));
    g = g < 0 ? h : lw_bin(L, FB_OP_AND, g, h);
  }
  return g;
}

static int load_comp(lower *L, const lref *r, const lval *v, int comp) {
  switch (r->kind) {
  case REF_VAR: return fb_b_lload(&L->b, v->id[comp]);
  case REF_FIELD: return fb_b_load(&L->b, L->p->fields[r->field].places[comp], r->idx, r->nidx);
  default: return v->id[comp];
  }
}

static void shape_init(lval *out, lty t) {
  memset(out, 0, sizeof *out);
  out->t = t.t;
  out->rows = t.rows;
  out->cols = t.cols;
  out->kind = t.rows == 0 ? VK_SCALAR : t.cols == 0 ? VK_VEC : VK_MAT;
  out->n = t.rows == 0 ? 1 : t.rows * (t.cols ? t.cols : 1);
}

void lang_ref_read(lower *L, const lref *r, lval *out) {
  if (r->kind == REF_UNKNOWN) {
    lv_unknown(out);
    return;
  }
  lslot s[LANG_MAX_COMP];
  int ns = ref_slots(r, s), dyn = 0;
  for (int i = 0; i < ns; i++) dyn |= s[i].n > 1;
  lval v = r->v;
  if (r->kind == REF_VALUE && !dyn) { /* pick components, literals stay untyped */
    shape_init(out, lang_ref_type(r));
    out->t = v.t;
    out->lit = v.lit;
    out->has_const = v.has_const;
    for (int i = 0; i < ns; i++) {
      out->id[i] = v.id[s[i].comp[0]];
      out->ci[i] = v.ci[s[i].comp[0]];
      out->cv[i] = v.cv[s[i].comp[0]];
    }
    return;
  }
  if (r->kind == REF_VALUE && v.lit) lv_materialize(L, &v, lv_default_type(&v));
  lty t = lang_ref_type(r);
  shape_init(out, t);
  for (int i = 0; i < ns; i++) {
    const lslot *sl = &s[i];
    int x = load_comp(L, r, &v, sl->comp[sl->n - 1]);
    for (int j = sl->n - 2; j >= 0; j--) {
      int g = slot_guard(L, r, sl, j), y = load_comp(L, r, &v, sl->comp[j]);
      x = lw_select(L, g, y, x);
    }
    out->id[i] = x;
  }
}

static void store_comp(lower *L, const lref *r, int comp, int value, int op) {
  if (r->kind == REF_VAR) {
    fb_b_lstore(&L->b, r->v.id[comp], value);
    return;
  }
  fb_b_global(&L->b, (fb_op)op, L->p->fields[r->field].places[comp], r->idx, r->nidx, value);
}

void lang_ref_write(lower *L, const lref *r, const lval *v, int op) {
  if (r->kind != REF_VAR && r->kind != REF_FIELD) return;
  if (v->kind == VK_UNKNOWN) return;
  lslot s[LANG_MAX_COMP];
  int ns = ref_slots(r, s);
  for (int i = 0; i < ns && i < v->n; i++) {
    const lslot *sl = &s[i];
    for (int j = 0; j < sl->n; j++) {
      int g = slot_guard(L, r, sl, j);
      if (g < 0) {
        store_comp(L, r, sl->comp[j], v->id[i], op);
        continue;
      }
      int st = fb_b_if(&L->b, g, 0);
      if (st < 0) return;
      int saved = fb_b_enter(&L->b, L->k->stmts[st].body);
      store_comp(L, r, sl->comp[j], v->id[i], op);
      fb_b_leave(&L->b, saved);
    }
  }
}

int lang_ref_atomic(lower *L, const lref *r, const lval *v, int op, lval *out) {
  lslot s[LANG_MAX_COMP];
  int ns = ref_slots(r, s);
  for (int i = 0; i < ns; i++)
    if (s[i].n != 1) return -1;
  shape_init(out, lang_ref_type(r));
  for (int i = 0; i < ns && i < v->n; i++)
    out->id[i] = fb_b_global(&L->b, (fb_op)op, L->p->fields[r->field].places[s[i].comp[0]],
                             r->idx, r->nidx, v->id[i]);
  return 0;
}

/* (a, b, ...): VK_TUPLE, its elements in L->tup. */
static int tuple_value(lower *L, node *e, lval *out) {
  lval el[LANG_MAX_TUPLE];
  char b[64];
  lv_unknown(out);
  if (e->nkids > LANG_MAX_TUPLE) {
    ERR(L, e, "a tuple has at most %d values, found %d", LANG_MAX_TUPLE, e->nkids);
    return -1;
  }
  int bad = 0, unknown = 0;
  for (int i = 0; i < e->nkids; i++) {
    if (lang_eval(L, e->kids[i], &el[i]) < 0) bad = 1;
    else if (el[i].kind == VK_UNKNOWN) unknown = 1;
    else if (el[i].kind == VK_VOID || el[i].kind == VK_TUPLE) {
      ERR(L, e->kids[i], "a tuple holds values, found %s", lv_str(&el[i], b, sizeof b));
      bad = 1;
    }
  }
  if (bad) return -1;
  if (unknown) return 0;
  memset(out, 0, sizeof *out);
  out->kind = VK_TUPLE;
  out->n = e->nkids;
  for (int i = 0; i < e->nkids; i++) L->tup[i] = el[i];
  return 0;
}

/* ---------------------------------------------------------------- expressions */

static int unary(lower *L, node *e, lval *out) {
  lval a;
  if (lang_eval(L, e->a, &a) < 0 || a.kind == VK_UNKNOWN) {
    lv_unknown(out);
    return a.kind == VK_UNKNOWN ? 0 : -1;
  }
  char b[64];
  *out = a;
  if (a.kind == VK_VOID || a.kind == VK_TUPLE) {
    ERR(L, e, "operator %s needs a value, found %s", lang_tok_name(e->op), lv_str(&a, b, sizeof b));
    lv_unknown(out);
    return -1;
  }
  fb_type t = lv_default_type(&a);
  if (e->op == T_MINUS) {
    if (t == FB_T_BOOL) goto bad;
    for (int c = 0; c < a.n; c++) {
      uint64_t u = 0;
      fb_arith_int_unop(FB_OP_NEG, FB_T_I64, (uint64_t)a.ci[c], &u); /* a literal is an i64 */
      out->ci[c] = (int64_t)u;
      out->cv[c] = -a.cv[c];
      if (!a.lit) out->id[c] = lw_un(L, FB_OP_NEG, a.id[c]);
    }
    if (!a.lit) out->has_const = 0;
    return 0;
  }
  if (e->op == T_TILDE) {
    if (a.lit == LIT_FLOAT || !fb_type_is_int(t)) goto bad;
    for (int c = 0; c < a.n; c++) {
      uint64_t u = 0;
      fb_arith_int_unop(FB_OP_NOT, FB_T_I64, (uint64_t)a.ci[c], &u);
      out->ci[c] = (int64_t)u;
      out->cv[c] = (double)out->ci[c];
      if (!a.lit) out->id[c] = lw_un(L, FB_OP_NOT, a.id[c]);
    }
    if (!a.lit) out->has_const = 0;
    return 0;
  }
  /* '!': logical not; numbers count as true when non-zero */
  lv_materialize(L, &a, t);
  out->lit = LIT_NONE;
  out->t = FB_T_BOOL;
  out->has_const = 0;
  for (int c = 0; c < a.n; c++)
    out->id[c] = t == FB_T_BOOL ? lw_un(L, FB_OP_NOT, a.id[c])
                                : lw_bin(L, FB_OP_EQ, a.id[c], lw_const(L, t, 0, 0));
  return 0;
bad:
  ERR(L, e, "operator %s cannot be applied to %s", lang_tok_name(e->op), lv_str(&a, b, sizeof b));
  lv_unknown(out);
  return -1;
}

/* A scalar bool from any scalar value (non-zero is true). */
static int to_bool(lower *L, lval *v, node *at) {
  char b[64];
  if (v->kind == VK_UNKNOWN) return lw_const(L, FB_T_BOOL, 0, 0);
  if (v->kind != VK_SCALAR) {
    ERR(L, at, "a condition must be a scalar, found %s", lv_str(v, b, sizeof b));
    return lw_const(L, FB_T_BOOL, 0, 0);
  }
  if (v->lit) return fb_b_const(&L->b, fb_value_cast(lit_value(v, 0), FB_T_BOOL));
  if (v->t == FB_T_BOOL) return v->id[0];
  return lw_bin(L, FB_OP_NE, v->id[0], lw_const(L, v->t, 0, 0));
}

int lang_cond(lower *L, node *e) {
  lval v;
  if (lang_eval(L, e, &v) < 0) return lw_const(L, FB_T_BOOL, 0, 0);
  return to_bool(L, &v, e);
}

/* && and ||: when the right side may read fields or have effects it runs
 * only when needed (short circuit), else both sides are evaluated. */
static int logic(lower *L, node *e, lval *out) {
  int is_and = e->op == T_ANDAND;
  int a = lang_cond(L, e->a);
  if (!lang_has_effects(L, e->b)) {
    int c = lang_cond(L, e->b);
    lv_scalar(out, FB_T_BOOL, lw_bin(L, is_and ? FB_OP_AND : FB_OP_OR, a, c));
    return 0;
  }
  int var = fb_b_alloca(&L->b, FB_T_BOOL);
  fb_b_lstore(&L->b, var, a);
  int test = is_and ? a : lw_un(L, FB_OP_NOT, a);
  int st = fb_b_if(&L->b, test, 0);
  if (st >= 0) {
    int saved = fb_b_enter(&L->b, L->k->stmts[st].body);
    fb_b_lstore(&L->b, var, lang_cond(L, e->b));
    fb_b_leave(&L->b, saved);
  }
  lv_scalar(out, FB_T_BOOL, fb_b_lload(&L->b, var));
  return 0;
}

/* a < b < c is (a < b) && (b < c), b evaluated once. */
static int compare_chain(lower *L, node *e, lval *out) {
  lval prev, cur, r;
  int acc = -1, unknown = 0;
  if (lang_eval(L, e->kids[0], &prev) < 0) unknown = 1;
  for (int i = 1; i < e->nkids; i++) {
    if (lang_eval(L, e->kids[i], &cur) < 0) unknown = 1;
    if (!unknown && lv_binary(L, e->ops[i - 1], &prev, &cur, &r, e) < 0) unknown = 1;
    if (!unknown && r.kind == VK_UNKNOWN) unknown = 1;
    if (!unknown) {
      if (e->nkids > 2 && r.kind != VK_SCALAR) {
        ERR(L, e, "chained comparisons need scalars");
        unknown = 1;
      } else if (e->nkids == 2) {
        *out = r;
        return 0;
      } else {
        int c = to_bool(L, &r, e);
        acc = acc < 0 ? c : lw_bin(L, FB_OP_AND, acc, c);
      }
    }
    prev = cur;
  }
  if (unknown) {
    lv_unknown(out);
    return 0;
  }
  lv_scalar(out, FB_T_BOOL, acc);
  return 0;
}

/* Insert statement id (just emitted at the end of block blk) before `before`. */
static void move_before(lower *L, int blk, int id, int before) {
  fb_block *b = &L->k->blocks[blk];
  if (b->n < 2 || b->ids[b->n - 1] != id) return;
  int pos = -1;
  for (int i = 0; i < b->n; i++)
    if (b->ids[i] == before) {
      pos = i;
      break;
    }
  if (pos < 0) return;
  memmove(&b->ids[pos + 1], &b->ids[pos], sizeof(int32_t) * (size_t)(b->n - 1 - pos));
  b->ids[pos] = id;
}

int lang_common_type(const lval *a, const lval *b, fb_type *out) {
  fb_type ta = lv_default_type(a), tb = lv_default_type(b), t;
  if (a->lit && b->lit) t = (a->lit == LIT_FLOAT || b->lit == LIT_FLOAT) ? FB_T_F32 : FB_T_I32;
  else if (a->lit) t = a->lit == LIT_FLOAT && !fb_type_is_float(tb) ? FB_T_F32 : tb;
  else if (b->lit) t = b->lit == LIT_FLOAT && !fb_type_is_float(ta) ? FB_T_F32 : ta;
  else if (ta == tb) t = ta;
  else if (ta == FB_T_BOOL || tb == FB_T_BOOL) return -1;
  else if (fb_type_is_float(ta) || fb_type_is_float(tb))
    t = !fb_type_is_float(tb)   ? ta
        : !fb_type_is_float(ta) ? tb
                                : (fb_type_bits(ta) >= fb_type_bits(tb) ? ta : tb);
  else if (fb_type_bits(ta) != fb_type_bits(tb)) t = fb_type_bits(ta) > fb_type_bits(tb) ? ta : tb;
  else t = fb_type_is_signed(ta) ? tb : ta; /* same width: unsigned wins */
  if (t == FB_T_BOOL && (a->lit || b->lit)) return -1;
  *out = t;
  return 0;
}

int lang_same_shape(const lval *a, const lval *b) {
  return a->kind == VK_SCALAR || b->kind == VK_SCALAR ||
         (a->kind == b->kind && a->rows == b->rows && a->cols == b->cols);
}

void lv_broadcast_like(lval *v, const lval *like) {
  if (v->kind == VK_SCALAR && like->kind != VK_SCALAR) broadcast(v, like->rows, like->cols);
}

static int branch_type(lower *L, const lval *a, const lval *b, fb_type *t, node *at) {
  char x[64], y[64];
  if (!lang_same_shape(a, b) || lang_common_type(a, b, t) < 0) {
    ERR(L, at, "the two branches have different types: %s and %s", lv_str(a, x, sizeof x),
        lv_str(b, y, sizeof y));
    return -1;
  }
  return 0;
}

static int ternary(lower *L, node *e, lval *out) {
  int c = lang_cond(L, e->a);
  lval a, b;
  if (!lang_has_effects(L, e->b) && !lang_has_effects(L, e->c)) {
    int ra = lang_eval(L, e->b, &a), rb = lang_eval(L, e->c, &b);
    if (ra < 0 || rb < 0 || a.kind == VK_UNKNOWN || b.kind == VK_UNKNOWN) {
      lv_unknown(out);
      return 0;
    }
    fb_type t;
    if (branch_type(L, &a, &b, &t, e) < 0) {
      lv_unknown(out);
      return -1;
    }
    lv_materialize(L, &a, t);
    lv_materialize(L, &b, t);
    lv_broadcast_like(&a, &b);
    lv_broadcast_like(&b, &a);
    *out = a;
    out->has_const = 0;
    for (int i = 0; i < a.n; i++) out->id[i] = lw_select(L, c, a.id[i], b.id[i]);
    return 0;
  }
  /* branches with effects: if / else into a local variable */
  int st = fb_b_if(&L->b, c, 1);
  if (st < 0) {
    lv_unknown(out);
    return -1;
  }
  int outer = L->b.block;
  int tb = L->k->stmts[st].body, eb = L->k->stmts[st].orelse;
  int saved = fb_b_enter(&L->b, tb);
  int ra = lang_eval(L, e->b, &a);
  fb_b_enter(&L->b, eb);
  int rb = lang_eval(L, e->c, &b);
  fb_b_leave(&L->b, saved);
  if (ra < 0 || rb < 0 || a.kind == VK_UNKNOWN || b.kind == VK_UNKNOWN) {
    lv_unknown(out);
    return 0;
  }
  fb_type t;
  if (branch_type(L, &a, &b, &t, e) < 0) {
    lv_unknown(out);
    return -1;
  }
  lval ua = a, ub = b;
  fb_b_enter(&L->b, tb);
  lv_materialize(L, &ua, t);
  lv_broadcast_like(&ua, &b);
  fb_b_enter(&L->b, eb);
  lv_materialize(L, &ub, t);
  lv_broadcast_like(&ub, &a);
  fb_b_leave(&L->b, saved);
  /* ua: then-value converted; ub: else-value converted (same type) */
  *out = ua;
  out->has_const = 0;
  for (int i = 0; i < ua.n; i++) {
    int var = fb_b_alloca(&L->b, ua.t);
    move_before(L, outer, var, st);
    fb_b_enter(&L->b, tb);
    fb_b_lstore(&L->b, var, ua.id[i]);
    fb_b_enter(&L->b, eb);
    fb_b_lstore(&L->b, var, ub.id[i]);
    fb_b_leave(&L->b, saved);
    out->id[i] = fb_b_lload(&L->b, var);
  }
  return 0;
}

void lang_stamp(lower *L, int mark, int line, int col) {
  if (!L->k || mark < 0) return;
  int n = L->k->nstmts;
  if (n > L->pcap) {
    int cap = L->pcap ? L->pcap : 256;
    while (cap < n) cap *= 2;
    int32_t *v = realloc(L->pos, sizeof(int32_t) * 2 * (size_t)cap);
    if (!v) return; /* positions are a help for messages only */
    memset(v + 2 * L->pcap, 0, sizeof(int32_t) * 2 * (size_t)(cap - L->pcap));
    L->pos = v;
    L->pcap = cap;
  }
  for (int i = mark; i < n; i++)
    if (!L->pos[2 * i]) {
      L->pos[2 * i] = line;
      L->pos[2 * i + 1] = col;
    }
}

static int eval_inner(lower *L, node *e, lval *out);

int lang_eval(lower *L, node *e, lval *out) {
  int mark = L->k ? L->k->nstmts : -1;
  int rc = eval_inner(L, e, out);
  lang_stamp(L, mark, e->line, e->col);
  return rc;
}

static int eval_inner(lower *L, node *e, lval *out) {
  lref r;
  if (lang_budget_step(L->p, L->d, e->line, e->col)) {
    lv_unknown(out);
    L->errors++;
    return -1;
  }
  switch (e->kind) {
  case E_INT:
    memset(out, 0, sizeof *out);
    out->kind = VK_SCALAR;
    out->lit = LIT_INT;
    out->n = 1;
    out->has_const = 1;
    out->ci[0] = (int64_t)e->ival;
    out->cv[0] = (double)(int64_t)e->ival;
    return 0;
  case E_FLOAT:
    memset(out, 0, sizeof *out);
    out->kind = VK_SCALAR;
    out->lit = LIT_FLOAT;
    out->n = 1;
    out->has_const = 1;
    out->cv[0] = e->fval;
    out->ci[0] = lang_f2i(e->fval);
    return 0;
  case E_BOOL:
    lv_scalar(out, FB_T_BOOL, lw_const(L, FB_T_BOOL, 0, (int64_t)e->ival));
    out->has_const = 1;
    out->ci[0] = (int64_t)e->ival;
    return 0;
  case E_NAME:
  case E_INDEX:
    if (lang_ref(L, e, &r) < 0) {
      lv_unknown(out);
      return -1;
    }
    lang_ref_read(L, &r, out);
    return 0;
  case E_UNARY: return unary(L, e, out);
  case E_BINARY: {
    if (e->op == T_ANDAND || e->op == T_OROR) return logic(L, e, out);
    lval a, b;
    int ra = lang_eval(L, e->a, &a), rb = lang_eval(L, e->b, &b);
    if (ra < 0 || rb < 0) {
      lv_unknown(out);
      return -1;
    }
    if (e->op == T_AT) return lv_matmul(L, &a, &b, out, e);
    return lv_binary(L, e->op, &a, &b, out, e);
  }
  case E_CMP: return compare_chain(L, e, out);
  case E_TERNARY: return ternary(L, e, out);
  case E_CALL: return lang_call(L, e, out);
  case E_LIST: return lang_list(L, e, out);
  case E_CTOR: return lang_ctor(L, e, out);
  case E_TUPLE: return tuple_value(L, e, out);
  case E_KWARG:
    ERR(L, e, "an argument given by name ('%s = ...') is only for funcs with a parameter '%s'",
        e->name, e->name);
    lv_unknown(out);
    return -1;
  default:
    ERR(L, e, "expected an expression");
    lv_unknown(out);
    return -1;
  }
}

/* Whether evaluating e may read fields or have effects (so that it must not
 * run speculatively). Indexing a local value is harmless. */
int lang_has_effects(lower *L, node *e) {
  if (!e) return 0;
  switch (e->kind) {
  case E_INDEX: {
    node *base = e->a;
    while (base->kind == E_INDEX) base = base->a;
    if (base->kind != E_NAME) return 1;
    lsym *s = lang_lookup(L, base->name);
    if (!s || s->kind == SYM_FIELD) return 1;
    break;
  }
  case E_CALL:
    if (!lang_is_pure_builtin(e->name) || fb_program_find_kernel(L->p, e->name) >= 0) return 1;
    for (int i = 0; i < L->p->nfuncs; i++)
      if (!strcmp(L->p->funcs[i].name, e->name)) return 1;
    break;
  default: break;
  }
  for (int i = 0; i < e->nkids; i++)
    if (lang_has_effects(L, e->kids[i])) return 1;
  return lang_has_effects(L, e->a) || lang_has_effects(L, e->b) || lang_has_effects(L, e->c);
}
