/* Statements, kernels and inlined funcs.
 *
 *  - A kernel's top-level `for` loops become par_for / struct_for (one task
 *    each); loops anywhere else are serial range_for / while.
 *  - `continue` in a parallel loop leaves a one-trip `while` wrapped around
 *    the loop body (the IR allows break/continue in serial loops only);
 *    `break` in a parallel loop is an error.
 *  - `while c { }` is `while { if !c { break } ... }`.
 *  - Augmented assignment to a field inside a parallel loop is atomic.
 *  - `return e` in a kernel is ret slot 0, only at the top level.
 *  - Funcs are inlined at each call: arguments are evaluated once and bound
 *    to the parameters. A func whose only `return` is its last statement
 *    yields that value directly; otherwise the result goes through a local
 *    variable and a `done` flag that skips what follows a taken return.
 *  - let binds a value (no storage); var is one alloca per component. */
#include <stdio.h>

#include "lang_internal.h"

#define ERR(L, at, ...) ((L)->errors++, lang_err((L)->d, (at)->line, (at)->col, __VA_ARGS__))

static void lower_stmts(lower *L, node **v, int n);

static lframe *frame(lower *L) { return L->nframes ? &L->frames[L->nframes - 1] : NULL; }
static int loop_base(lower *L) { return L->nframes ? frame(L)->loop_base : 0; }

static void lower_block(lower *L, node *blk) {
  int mark = L->nsyms;
  lower_stmts(L, blk->kids, blk->nkids);
  L->nsyms = mark;
}

/* Lower blk into the IR block `into`, in a scope of its own. */
static void lower_into(lower *L, node *blk, int into) {
  int saved = fb_b_enter(&L->b, into);
  lower_block(L, blk);
  fb_b_leave(&L->b, saved);
}

/* ---------------------------------------------------------------- scans */

/* A `continue` that belongs to this loop body (not to a loop inside it). */
static int has_continue(const node *s) {
  if (!s) return 0;
  if (s->kind == S_CONTINUE) return 1;
  if (s->kind == S_WHILE || s->kind == S_FOR_RANGE || s->kind == S_FOR_IN) return 0;
  if (s->kind == S_BLOCK)
    for (int i = 0; i < s->nkids; i++)
      if (has_continue(s->kids[i])) return 1;
  if (s->kind == S_IF) return has_continue(s->b) || has_continue(s->c);
  return 0;
}

static int has_return(const node *s) {
  if (!s) return 0;
  if (s->kind == S_RETURN) return 1;
  if (s->kind < S_BLOCK) return 0;
  if (s->kind == S_BLOCK)
    for (int i = 0; i < s->nkids; i++)
      if (has_return(s->kids[i])) return 1;
  return has_return(s->b) || has_return(s->c);
}

/* ---------------------------------------------------------------- declarations */

static void let_stmt(lower *L, node *s) {
  lval v;
  if (lang_eval(L, s->a, &v) < 0) lv_unknown(&v);
  char b[64];
  if (v.kind == VK_VOID || v.kind == VK_TUPLE) {
    ERR(L, s->a, "expected a value for '%s', found %s", s->name, lv_str(&v, b, sizeof b));
    lv_unknown(&v);
  }
  if (s->has_ty && v.kind != VK_UNKNOWN) {
    snprintf(b, sizeof b, "the initializer of '%s'", s->name);
    if (lv_convert(L, &v, s->ty, s->a, b) < 0) lv_unknown(&v);
  }
  lang_push_sym(L, s->name, SYM_LET, &v, s->line, s->col);
}

static void zero_value(lower *L, lty t, lval *v) {
  if (t.rows == 0) lv_scalar(v, t.t, -1);
  else if (t.cols == 0) lv_vec_init(v, t.t, t.rows);
  else lv_mat_init(v, t.t, t.rows, t.cols);
  for (int i = 0; i < v->n; i++) v->id[i] = lw_const(L, t.t, 0, 0);
}

/* A var named name holding init (its type when !has_ty). */
static void new_var(lower *L, const char *name, int line, int col, int has_ty, lty t, lval init,
                    node *at) {
  lval v;
  char b[64];
  if (!has_ty) {
    if (init.kind == VK_UNKNOWN) {
      lv_unknown(&v);
      lang_push_sym(L, name, SYM_VAR, &v, line, col);
      return;
    }
    t = lv_type(&init);
  }
  if (at && init.kind != VK_UNKNOWN) {
    snprintf(b, sizeof b, "the initializer of '%s'", name);
    if (lv_convert(L, &init, t, at, b) < 0) lv_unknown(&init);
  }
  if (!at || init.kind == VK_UNKNOWN) zero_value(L, t, &init);
  v = init;
  v.lit = LIT_NONE;
  v.has_const = 0;
  for (int i = 0; i < v.n; i++) {
    v.id[i] = fb_b_alloca(&L->b, t.t);
    fb_b_lstore(&L->b, v.id[i], init.id[i]);
  }
  lang_push_sym(L, name, SYM_VAR, &v, line, col);
}

/* The n values of a tuple on the right of `let (a, b) =`, `a, b =`: out[]
 * (unknown where an error was reported). */
static void tuple_values(lower *L, node *rhs, int n, lval *out, node *at, const char *form) {
  for (int i = 0; i < n; i++) lv_unknown(&out[i]);
  lval v;
  char b[64];
  if (lang_eval(L, rhs, &v) < 0 || v.kind == VK_UNKNOWN) return;
  if (v.kind != VK_TUPLE) {
    ERR(L, rhs,
        "%s needs %d values on the right, found %s (write e1, e2, ... or call a func that "
        "returns several values)",
        form, n, lv_str(&v, b, sizeof b));
    return;
  }
  if (v.n != n) {
    ERR(L, at, "%s: %d name%s on the left but %d values on the right", form, n,
        n == 1 ? "" : "s", v.n);
    return;
  }
  for (int i = 0; i < n; i++) out[i] = L->tup[i];
}

static void let_tuple(lower *L, node *s) {
  node *c = s->a;
  int is_var = s->op == T_VAR;
  int user = 0;
  if (c->kind == E_CALL)
    for (int i = 0; i < L->p->nfuncs; i++)
      if (!strcmp(L->p->funcs[i].name, c->name)) user = 1;
  int want = c->kind == E_CALL && !user ? (!strcmp(c->name, "svd")     ? 3
                                           : !strcmp(c->name, "polar") ? 2
                                                                       : 0)
                                        : 0;
  lval out[LANG_MAX_TUPLE];
  int n = s->nkids < LANG_MAX_TUPLE ? s->nkids : LANG_MAX_TUPLE;
  for (int i = 0; i < LANG_MAX_TUPLE; i++) lv_unknown(&out[i]);
  if (s->nkids > LANG_MAX_TUPLE) {
    ERR(L, s, "at most %d names can be bound at once, found %d", LANG_MAX_TUPLE, s->nkids);
  } else if (!want) {
    tuple_values(L, c, n, out, s, is_var ? "var (a, b, ...) = ..." : "let (a, b, ...) = ...");
  } else if (s->nkids != want) {
    ERR(L, s, "%s returns %d matrices, but %d names are bound", c->name, want, s->nkids);
  } else if (c->nkids != 1) {
    ERR(L, c, "%s takes 1 argument, found %d", c->name, c->nkids);
  } else {
    lval m;
    char b[64];
    if (lang_eval(L, c->kids[0], &m) == 0 && m.kind != VK_UNKNOWN) {
      if (m.kind != VK_MAT || m.rows != m.cols || (m.rows != 2 && m.rows != 3) ||
          lv_default_type(&m) == FB_T_BOOL) {
        ERR(L, c->kids[0], "%s expects a 2x2 or 3x3 matrix, found %s", c->name,
            lv_str(&m, b, sizeof b));
      } else if (want == 3) {
        lang_svd(L, &m, &out[0], &out[1], &out[2]);
      } else {
        lang_polar(L, &m, &out[0], &out[1]);
      }
    }
  }
  for (int i = 0; i < n; i++) {
    node *nm = s->kids[i];
    if (is_var) {
      lty t = {FB_T_I32, 0, 0};
      new_var(L, nm->name, nm->line, nm->col, 0, t, out[i], c);
    } else {
      lang_push_sym(L, nm->name, SYM_LET, &out[i], nm->line, nm->col);
    }
  }
}

static void var_stmt(lower *L, node *s) {
  lval init;
  char b[64];
  lv_unknown(&init);
  if (s->a && lang_eval(L, s->a, &init) < 0) lv_unknown(&init);
  if (s->a && (init.kind == VK_VOID || init.kind == VK_TUPLE)) {
    ERR(L, s->a, "expected a value for '%s', found %s", s->name, lv_str(&init, b, sizeof b));
    lv_unknown(&init);
  }
  new_var(L, s->name, s->line, s->col, s->has_ty, s->ty, init, s->a);
}

/* ---------------------------------------------------------------- assignment */

static int aug_op(int tok) {
  switch (tok) {
  case T_PLUSEQ: return T_PLUS;
  case T_MINUSEQ: return T_MINUS;
  case T_STAREQ: return T_STAR;
  case T_SLASHEQ: return T_SLASH;
  case T_AMPEQ: return T_AMP;
  case T_PIPEEQ: return T_PIPE;
  case T_CARETEQ: return T_CARET;
  case T_MINEQ: return LOP_MIN;
  case T_MAXEQ: return LOP_MAX;
  case T_SLASHSLASHEQ: return T_SLASHSLASH;
  case T_PERCENTEQ: return T_PERCENT;
  case T_STARSTAREQ: return T_STARSTAR;
  case T_SHLEQ: return T_SHL;
  case T_SHREQ: return T_SHR;
  default: return 0;
  }
}

static int atomic_of(int op) {
  switch (op) {
  case T_PLUS: return FB_OP_ATOMIC_ADD;
  case T_MINUS: return FB_OP_ATOMIC_SUB;
  case LOP_MIN: return FB_OP_ATOMIC_MIN;
  case LOP_MAX: return FB_OP_ATOMIC_MAX;
  case T_AMP: return FB_OP_ATOMIC_AND;
  case T_PIPE: return FB_OP_ATOMIC_OR;
  case T_CARET: return FB_OP_ATOMIC_XOR;
  default: return -1;
  }
}

static void target_desc(const lref *r, char *buf, size_t n) {
  if (r->name) snprintf(buf, n, "assignment to '%s'", r->name);
  else snprintf(buf, n, "assignment");
}

/* The target of an assignment: 0, or -1 after an error. */
static int assign_target(lower *L, node *a, lref *rp) {
  lref r;
  int rc = lang_ref(L, a, &r);
  if (rc == 0 && r.kind == REF_VALUE) {
    static const char *const why[] = {"it is declared with let (use var for a variable)",
                                      "it is a loop variable",
                                      "it is a parameter (copy it into a var)",
                                      "it is a constant (declared with const)"};
    if (r.is_let) ERR(L, a, "cannot assign to '%s': %s", r.name, why[r.origin]);
    else
      ERR(L, a,
          "cannot assign to this expression: expected a variable, a field element or a component "
          "of one");
    rc = -1;
  }
  if (rc == 0 && r.kind == REF_VAR && r.par < L->par_depth) {
    ERR(L, a,
        "cannot assign to '%s' inside a parallel loop: it is declared outside the loop "
        "(iterations run in parallel; accumulate into a field instead, e.g. with +=)",
        r.name);
    rc = -1;
  }
  *rp = r;
  return rc;
}

/* a, b = e1, e2: the right side first, then each target from left to right. */
static void assign_multi(lower *L, node *s) {
  lval vals[LANG_MAX_TUPLE];
  if (s->nkids > LANG_MAX_TUPLE) {
    ERR(L, s, "at most %d targets can be assigned at once, found %d", LANG_MAX_TUPLE, s->nkids);
    return;
  }
  tuple_values(L, s->a, s->nkids, vals, s, "a, b, ... = ...");
  for (int i = 0; i < s->nkids; i++) {
    lref r;
    char what[96];
    if (assign_target(L, s->kids[i], &r) < 0 || r.kind == REF_UNKNOWN ||
        vals[i].kind == VK_UNKNOWN)
      continue;
    target_desc(&r, what, sizeof what);
    if (lv_convert(L, &vals[i], lang_ref_type(&r), s->kids[i], what) == 0)
      lang_ref_write(L, &r, &vals[i], FB_OP_STORE);
  }
}

static void assign_stmt(lower *L, node *s) {
  lref r;
  lval v, old, nv;
  char what[96];
  int rc = assign_target(L, s->a, &r);
  if (lang_eval(L, s->b, &v) < 0 || rc < 0 || r.kind == REF_UNKNOWN) return;
  lty t = lang_ref_type(&r);
  target_desc(&r, what, sizeof what);
  if (s->op == T_ASSIGN) {
    if (lv_convert(L, &v, t, s->b, what) == 0) lang_ref_write(L, &r, &v, FB_OP_STORE);
    return;
  }
  int op = aug_op(s->op), at = atomic_of(op);
  if (r.kind == REF_FIELD && L->par_depth > 0 && at >= 0) {
    if ((op == T_AMP || op == T_PIPE || op == T_CARET) && !fb_type_is_int(t.t)) {
      ERR(L, s, "operator %s needs an integer field, '%s' holds %s", lang_tok_name(s->op), r.name,
          fb_type_name(t.t));
      return;
    }
    if (lv_convert(L, &v, t, s->b, what) == 0) lang_ref_write(L, &r, &v, at);
    return;
  }
  lang_ref_read(L, &r, &old);
  if (lv_binary(L, op, &old, &v, &nv, s) < 0) return;
  if (lv_convert(L, &nv, t, s->a, what) == 0) lang_ref_write(L, &r, &nv, FB_OP_STORE);
}

/* ---------------------------------------------------------------- control flow */

static void if_stmt(lower *L, node *s) {
  int c = lang_cond(L, s->a);
  int st = fb_b_if(&L->b, c, s->c != NULL);
  if (st < 0) return;
  lower_into(L, s->b, L->k->stmts[st].body);
  if (!s->c) return;
  int saved = fb_b_enter(&L->b, L->k->stmts[st].orelse);
  if (s->c->kind == S_IF) if_stmt(L, s->c);
  else lower_block(L, s->c);
  fb_b_leave(&L->b, saved);
}

static int push_loop(lower *L, node *at, int kind, int stmt, int wrap) {
  if (L->nloops >= LANG_MAX_LOOPS) {
    ERR(L, at, "loops nested more than %d deep", LANG_MAX_LOOPS);
    return -1;
  }
  lloop *lp = &L->loops[L->nloops++];
  lp->kind = kind;
  lp->stmt = stmt;
  lp->wrap_block = wrap;
  return 0;
}

static void while_stmt(lower *L, node *s) {
  int w = fb_b_while(&L->b);
  if (w < 0) return;
  int saved = fb_b_enter(&L->b, L->k->stmts[w].body);
  int c = lang_cond(L, s->a);
  int st = fb_b_if(&L->b, lw_un(L, FB_OP_NOT, c), 0);
  if (st >= 0) {
    int s2 = fb_b_enter(&L->b, L->k->stmts[st].body);
    fb_b_break(&L->b);
    fb_b_leave(&L->b, s2);
  }
  if (push_loop(L, s, LOOP_SERIAL, w, -1) == 0) {
    lower_block(L, s->b);
    L->nloops--;
  }
  fb_b_leave(&L->b, saved);
}

/* Body of a loop whose statement is st, with loop variables already bound. */
static void loop_body(lower *L, node *s, node *body, int st, int parallel) {
  if (!parallel) {
    if (push_loop(L, s, LOOP_SERIAL, st, -1) == 0) {
      lower_block(L, body);
      L->nloops--;
    }
    return;
  }
  int wrap = -1;
  if (has_continue(body)) { /* one-trip while so that continue can be a break */
    wrap = fb_b_while(&L->b);
    if (wrap < 0) return;
    fb_b_enter(&L->b, L->k->stmts[wrap].body);
  }
  if (push_loop(L, s, LOOP_PAR, st, wrap) == 0) {
    L->par_depth++;
    lower_block(L, body);
    L->par_depth--;
    L->nloops--;
  }
  if (wrap >= 0) fb_b_break(&L->b);
}

static int range_bound(lower *L, node *e) {
  int id, c;
  int64_t k;
  if (lang_index(L, e, &id, &c, &k) < 0) return lw_const(L, FB_T_I32, 0, 0);
  return id;
}

static void for_range(lower *L, node *s, int top) {
  int a = range_bound(L, s->a), b = range_bound(L, s->b);
  int parallel = top && L->nframes == 0;
  int st = fb_b_range_for(&L->b, a, b, parallel);
  if (st < 0) return;
  int saved = fb_b_enter(&L->b, L->k->stmts[st].body);
  int mark = L->nsyms;
  lval iv;
  lv_scalar(&iv, FB_T_I32, fb_b_loop_index(&L->b, st, 0));
  int id = lang_push_sym(L, s->kids[0]->name, SYM_LET, &iv, s->kids[0]->line, s->kids[0]->col);
  if (id >= 0) L->syms[id].origin = ORIGIN_LOOP;
  loop_body(L, s, s->c, st, parallel);
  L->nsyms = mark;
  fb_b_leave(&L->b, saved);
}

static int user_func(lower *L, const char *name) {
  for (int i = 0; i < L->p->nfuncs; i++)
    if (!strcmp(L->p->funcs[i].name, name)) return 1;
  return 0;
}

/* Bind the loop names to the n indices idx[]: one name each, or one name
 * for an i32[n] vector (vec). */
static void bind_indices(lower *L, node *s, const int *idx, int n, int vec) {
  lval iv;
  if (vec) {
    lv_vec_init(&iv, FB_T_I32, n);
    for (int i = 0; i < n; i++) iv.id[i] = idx[i];
    int id = lang_push_sym(L, s->kids[0]->name, SYM_LET, &iv, s->kids[0]->line, s->kids[0]->col);
    if (id >= 0) L->syms[id].origin = ORIGIN_LOOP;
    return;
  }
  for (int i = 0; i < n && i < s->nkids; i++) {
    lv_scalar(&iv, FB_T_I32, idx[i]);
    int id = lang_push_sym(L, s->kids[i]->name, SYM_LET, &iv, s->kids[i]->line, s->kids[i]->col);
    if (id >= 0) L->syms[id].origin = ORIGIN_LOOP;
  }
}

/* for i, j in ndrange(n, (lo, hi), ...): one loop over the product of the
 * extents (parallel at the top level of a kernel), the indices recovered
 * by / and % (last axis fastest, as in Taichi); extents below 0 count 0. */
static void for_ndrange(lower *L, node *s, node *call, int top, int grouped) {
  int n = call->nkids, nv = s->nkids;
  if (n < 1 || n > FB_MAX_AXES) {
    ERR(L, call, "ndrange takes 1 to %d items (a size n or a pair (lo, hi)), found %d",
        FB_MAX_AXES, n);
    return;
  }
  int vec = grouped || (nv == 1 && n > 1);
  if (!vec && nv != n) {
    ERR(L, s,
        "the loop over ndrange(...) with %d ax%s needs %d loop variable%s (one per axis) or one "
        "(an index vector), found %d",
        n, n == 1 ? "is" : "es", n, n == 1 ? "" : "s", nv);
    return;
  }
  int lo[FB_MAX_AXES], ext[FB_MAX_AXES], lc[FB_MAX_AXES], ec[FB_MAX_AXES];
  int64_t lk[FB_MAX_AXES], ek[FB_MAX_AXES];
  int bad = 0;
  for (int d = 0; d < n; d++) {
    node *it = call->kids[d];
    int hi, hc;
    int64_t hk;
    lc[d] = 1;
    lk[d] = 0;
    if (it->kind == E_KWARG) {
      ERR(L, it, "ndrange takes sizes and (lo, hi) pairs, not arguments given by name");
      bad = 1;
      continue;
    }
    if (it->kind == E_TUPLE) {
      if (it->nkids != 2) {
        ERR(L, it, "an ndrange item is a size n or a pair (lo, hi), found %d values", it->nkids);
        bad = 1;
        continue;
      }
      if (lang_index(L, it->kids[0], &lo[d], &lc[d], &lk[d]) < 0 ||
          lang_index(L, it->kids[1], &hi, &hc, &hk) < 0) {
        bad = 1;
        continue;
      }
    } else {
      lo[d] = lw_const(L, FB_T_I32, 0, 0);
      if (lang_index(L, it, &hi, &hc, &hk) < 0) {
        bad = 1;
        continue;
      }
    }
    ec[d] = lc[d] && hc;
    ek[d] = ec[d] ? (hk - lk[d] > 0 ? (int32_t)(hk - lk[d]) : 0) : 0;
    ext[d] = ec[d] ? lw_const(L, FB_T_I32, 0, ek[d])
                   : lw_bin(L, FB_OP_MAX, lw_sub(L, hi, lo[d]), lw_const(L, FB_T_I32, 0, 0));
  }
  if (bad) return;
  int total = ext[0];
  for (int d = 1; d < n; d++) total = lw_mul(L, total, ext[d]);
  int parallel = top && L->nframes == 0;
  int st = fb_b_range_for(&L->b, lw_const(L, FB_T_I32, 0, 0), total, parallel);
  if (st < 0) return;
  int saved = fb_b_enter(&L->b, L->k->stmts[st].body);
  int mark = L->nsyms;
  int rem = fb_b_loop_index(&L->b, st, 0), idx[FB_MAX_AXES];
  for (int d = n - 1; d >= 0; d--) {
    /* constants are made again inside the loop body (a task of its own) */
    int e = !d ? -1 : ec[d] ? lw_const(L, FB_T_I32, 0, ek[d]) : ext[d];
    int q = d ? lw_bin(L, FB_OP_REM, rem, e) : rem;
    idx[d] = lc[d] && lk[d] == 0 ? q : lw_add(L, lc[d] ? lw_const(L, FB_T_I32, 0, lk[d]) : lo[d], q);
    if (d) rem = lw_bin(L, FB_OP_DIV, rem, e);
  }
  bind_indices(L, s, idx, n, vec);
  loop_body(L, s, s->c, st, parallel);
  L->nsyms = mark;
  fb_b_leave(&L->b, saved);
}

static void for_struct(lower *L, node *s, int top) {
  node *it = s->a;
  lbind bd;
  int grouped = 0;
  if (it->kind == E_CALL && !strcmp(it->name, "grouped") && !user_func(L, it->name)) {
    if (it->nkids != 1) {
      ERR(L, it, "grouped takes 1 argument (a field, an SNode or ndrange(...)), found %d",
          it->nkids);
      return;
    }
    if (s->nkids != 1) {
      ERR(L, s, "a loop over grouped(...) binds one name (an index vector), found %d", s->nkids);
      return;
    }
    it = it->kids[0];
    grouped = 1;
  }
  if (it->kind == E_CALL && !strcmp(it->name, "ndrange") && !user_func(L, it->name)) {
    for_ndrange(L, s, it, top, grouped);
    return;
  }
  if (it->kind == E_NAME && !lang_lookup(L, it->name) && !lang_resolve_field(L, it->name, &bd)) {
    ERR(L, it, "unknown field or SNode '%s' to loop over", it->name);
    return;
  }
  if (it->kind != E_NAME || !lang_resolve_field(L, it->name, &bd)) {
    ERR(L, it, "expected 'a .. b', range(...) or a field or SNode name after 'in'");
    return;
  }
  int sn = -1, nvars = s->nkids;
  if (bd.kind != LB_UNKNOWN) {
    const char *what = bd.kind == LB_FIELD ? "field" : "SNode";
    sn = bd.kind == LB_FIELD ? L->p->fields[bd.index].pub.snode : L->p->snodes[bd.index].id;
    int ndim = L->p->layout->nodes[sn].ndim;
    if (ndim == 0) { /* one cell: the body runs once, the loop variables are 0 */
      if (nvars > 1) {
        ERR(L, s,
            "the loop over the 0-D field '%s' runs once and takes one loop variable (bound to "
            "0), found %d",
            it->name, nvars);
        return;
      }
      int parallel = top && L->nframes == 0;
      int st = fb_b_range_for(&L->b, lw_const(L, FB_T_I32, 0, 0), lw_const(L, FB_T_I32, 0, 1),
                              parallel);
      if (st < 0) return;
      int saved = fb_b_enter(&L->b, L->k->stmts[st].body);
      int mark = L->nsyms, idx0 = fb_b_loop_index(&L->b, st, 0);
      bind_indices(L, s, &idx0, 1, 0);
      loop_body(L, s, s->c, st, parallel);
      L->nsyms = mark;
      fb_b_leave(&L->b, saved);
      return;
    }
    if (grouped || (nvars == 1 && ndim > 1)) nvars = ndim; /* one name: an index vector */
    if (ndim != nvars) {
      ERR(L, s,
          "the loop over %s '%s' needs %d loop variable%s (one per dimension), found %d (the index "
          "count must match the %s's dimension)",
          what, it->name, ndim, ndim == 1 ? "" : "s", nvars, what);
      return;
    }
  }
  if (!top || L->nframes) {
    ERR(L, s, "a loop over a field (struct-for) must be at the top level of a kernel body");
    return;
  }
  if (nvars > FB_MAX_AXES) {
    ERR(L, s, "at most %d loop variables", FB_MAX_AXES);
    return;
  }
  int st = fb_b_struct_for(&L->b, sn);
  if (st < 0) return;
  int saved = fb_b_enter(&L->b, L->k->stmts[st].body);
  int mark = L->nsyms, idx[FB_MAX_AXES];
  for (int i = 0; i < nvars; i++) idx[i] = fb_b_loop_index(&L->b, st, i);
  if (bd.kind == LB_UNKNOWN && nvars == 1) { /* unbound: a scalar or a vector */
    lval u;
    lv_unknown(&u);
    lang_push_sym(L, s->kids[0]->name, SYM_LET, &u, s->kids[0]->line, s->kids[0]->col);
  } else {
    bind_indices(L, s, idx, nvars, nvars != s->nkids || grouped);
  }
  loop_body(L, s, s->c, st, 1);
  L->nsyms = mark;
  fb_b_leave(&L->b, saved);
}

static void jump_stmt(lower *L, node *s) {
  const char *w = s->kind == S_BREAK ? "break" : "continue";
  if (L->nloops <= loop_base(L)) {
    ERR(L, s, "'%s' outside a loop", w);
    return;
  }
  lloop *lp = &L->loops[L->nloops - 1];
  if (lp->kind == LOOP_PAR) {
    if (s->kind == S_BREAK) {
      ERR(L, s,
          "'break' is not allowed in a parallel loop (a top-level for runs its iterations in "
          "parallel)");
      return;
    }
    fb_b_break(&L->b); /* leaves the one-trip wrapper: next iteration */
    return;
  }
  if (s->kind == S_BREAK) fb_b_break(&L->b);
  else fb_b_continue(&L->b);
}

static void return_stmt(lower *L, node *s, int top) {
  lframe *fr = frame(L);
  char b[64], what[96];
  int has_ret = fr ? fr->has_ret : L->has_kret;
  lty rt = fr ? fr->ret : L->kret;
  const char *kind = fr ? "func" : "kernel";
  const char *name = fr ? L->p->funcs[fr->func].name : L->p->kernels[L->kernel].pub.name;
  if (!fr && !top) {
    ERR(L, s, "'return' must be at the top level of a kernel body, not inside a loop or branch");
    return;
  }
  if (s->a && !has_ret && fr && fr->done_var < 0) { /* the type is the value's */
    if (lang_eval(L, s->a, &fr->result) < 0) lv_unknown(&fr->result);
    fr->have_result = 1;
    return;
  }
  if (s->a && !has_ret && fr && s->a->kind == E_TUPLE) {
    ERR(L, s,
        "func '%s' returns several values: it must return them once, as its last statement",
        name);
    return;
  }
  if (s->a && !has_ret) {
    if (fr)
      ERR(L, s,
          "func '%s' returns from more than one place: declare its type as func %s(...) -> TYPE",
          name, name);
    else
      ERR(L, s, "kernel '%s' has no return type: declare it as kernel %s(...) -> TYPE", name, name);
    return;
  }
  if (!s->a && has_ret) {
    ERR(L, s, "%s '%s' must return a value of type %s", kind, name, lang_ty_str(rt, b, sizeof b));
    return;
  }
  lval v;
  lv_unknown(&v);
  snprintf(what, sizeof what, "the return value of '%s'", name);
  if (s->a && (lang_eval(L, s->a, &v) < 0 || lv_convert(L, &v, rt, s->a, what) < 0)) lv_unknown(&v);
  if (fr && fr->done_var < 0) {
    fr->result = v;
    fr->have_result = 1;
    return;
  }
  if (!fr) {
    L->returned = 1;
    if (v.kind != VK_UNKNOWN && s->a) fb_b_ret(&L->b, v.id[0], 0);
    return;
  }

  if (s->a && v.kind != VK_UNKNOWN)
    for (int i = 0; i < v.n; i++) fb_b_lstore(&L->b, fr->ret_var.id[i], v.id[i]);
  fb_b_lstore(&L->b, fr->done_var, lw_const(L, FB_T_BOOL, 0, 1));
  if (L->nloops > fr->loop_base) fb_b_break(&L->b);
}

static void lower_stmt_inner(lower *L, node *s);

static void lower_stmt(lower *L, node *s) {
  int mark = L->k ? L->k->nstmts : -1, line = s->line, col = s->col;
  lower_stmt_inner(L, s);
  if (s->kind == S_ASSIGN && s->a) lang_expr_pos(s->a, &line, &col); /* the target, not '=' */
  lang_stamp(L, mark, line, col);
}

static void lower_stmt_inner(lower *L, node *s) {
  if (lang_budget_step(L->p, L->d, s->line, s->col)) {
    L->errors++;
    return;
  }
  int top = L->top;
  L->top = 0;
  switch (s->kind) {
  case S_LET: let_stmt(L, s); break;
  case S_LET_TUPLE: let_tuple(L, s); break;
  case S_VAR: var_stmt(L, s); break;
  case S_ASSIGN: assign_stmt(L, s); break;
  case S_ASSIGN_MULTI: assign_multi(L, s); break;
  case S_EXPR: {
    lval v;
    if (s->a->kind != E_CALL) {
      int line, col;
      lang_expr_pos(s->a, &line, &col);
      L->errors++;
      lang_err(L->d, line, col,
               "this expression's value is not used: a statement is an assignment, a declaration "
               "or a call (an expression continues on the next line after an operator, or when "
               "that line starts with one)");
      break;
    }
    lang_eval(L, s->a, &v);
    break;
  }
  case S_IF: if_stmt(L, s); break;
  case S_WHILE: while_stmt(L, s); break;
  case S_FOR_RANGE: for_range(L, s, top); break;
  case S_FOR_IN: for_struct(L, s, top); break;
  case S_BREAK:
  case S_CONTINUE: jump_stmt(L, s); break;
  case S_RETURN: return_stmt(L, s, top); break;
  case S_BLOCK: lower_block(L, s); break;
  default: ERR(L, s, "expected a statement"); break;
  }
  L->top = top;
}

/* After a statement that may have returned from the inlined func: skip the
 * rest (break out of the func's loops, or guard the rest with !done). */
static int after_return(lower *L, node **v, int i, int n) {
  lframe *fr = frame(L);
  if (!fr || fr->done_var < 0 || !has_return(v[i]) || i + 1 >= n) return 0;
  int done = fb_b_lload(&L->b, fr->done_var);
  if (L->nloops > fr->loop_base) {
    int st = fb_b_if(&L->b, done, 0);
    if (st >= 0) {
      int saved = fb_b_enter(&L->b, L->k->stmts[st].body);
      fb_b_break(&L->b);
      fb_b_leave(&L->b, saved);
    }
    return 0;
  }
  int st = fb_b_if(&L->b, lw_un(L, FB_OP_NOT, done), 0);
  if (st < 0) return 1;
  int saved = fb_b_enter(&L->b, L->k->stmts[st].body);
  lower_stmts(L, v + i + 1, n - i - 1);
  fb_b_leave(&L->b, saved);
  return 1;
}

static void lower_stmts(lower *L, node **v, int n) {
  int top = L->top;
  for (int i = 0; i < n; i++) {
    if (i > 0 && v[i - 1]->kind == S_RETURN) {
      ERR(L, v[i], "unreachable code after 'return'");
      return;
    }
    L->top = top;
    lower_stmt(L, v[i]);
    if (after_return(L, v, i, n)) break;
  }
  L->top = top;
}

/* ---------------------------------------------------------------- funcs */

/* Whether the only return of the body is its last top-level statement. */
static int simple_returns(const node *body) {
  for (int i = 0; i + 1 < body->nkids; i++)
    if (has_return(body->kids[i])) return 0;
  if (body->nkids == 0) return 1;
  const node *last = body->kids[body->nkids - 1];
  return last->kind == S_RETURN || !has_return(last);
}

static int inline_body(lower *L, int fi, lval *args, const lbind *binds, node *at, lval *out) {
  node *d = L->p->funcs[fi].decl;
  lv_unknown(out);
  if (L->nframes >= LANG_MAX_FRAMES) {
    ERR(L, at, "funcs nested more than %d deep", LANG_MAX_FRAMES);
    return -1;
  }
  lframe *fr = &L->frames[L->nframes];
  memset(fr, 0, sizeof *fr);
  fr->func = fi;
  fr->loop_base = L->nloops;
  fr->sym_base = L->nsyms;
  fr->has_ret = d->has_ty;
  fr->ret = d->ty;
  fr->done_var = -1;
  L->nframes++;
  for (int i = 0; i < d->nkids; i++) {
    node *pm = d->kids[i];
    int id =
        lang_push_sym(L, pm->name, pm->is_field ? SYM_FIELD : SYM_LET, &args[i], pm->line, pm->col);
    if (id >= 0 && pm->is_field) L->syms[id].bind = binds[i];
    if (id >= 0) L->syms[id].origin = ORIGIN_PARAM;
  }
  if (!simple_returns(d->a)) {
    if (fr->has_ret) {
      lval z;
      zero_value(L, fr->ret, &z);
      fr->ret_var = z;
      for (int i = 0; i < z.n; i++) {
        fr->ret_var.id[i] = fb_b_alloca(&L->b, fr->ret.t);
        fb_b_lstore(&L->b, fr->ret_var.id[i], z.id[i]);
      }
    }
    fr->done_var = fb_b_alloca(&L->b, FB_T_BOOL);
    fb_b_lstore(&L->b, fr->done_var, lw_const(L, FB_T_BOOL, 0, 0));
  }
  int top = L->top;
  L->top = 0;
  lower_block(L, d->a);
  L->top = top;
  fr = &L->frames[L->nframes - 1];
  if (fr->has_ret) {
    if (fr->done_var >= 0) {
      *out = fr->ret_var;
      for (int i = 0; i < out->n; i++) out->id[i] = fb_b_lload(&L->b, fr->ret_var.id[i]);
    } else if (fr->have_result) {
      *out = fr->result;
    } else {
      char b[64];
      ERR(L, d, "func '%s' must end with 'return' and a value of type %s", d->name,
          lang_ty_str(fr->ret, b, sizeof b));
    }
  } else if (fr->have_result) {
    *out = fr->result;
  } else {
    memset(out, 0, sizeof *out);
    out->kind = VK_VOID;
  }
  L->nsyms = fr->sym_base;
  L->nframes--;
  return 0;
}

int lang_inline(lower *L, int fi, node *call, lval *out) {
  node *d = L->p->funcs[fi].decl;
  lv_unknown(out);
  for (int i = 0; i < L->nframes; i++)
    if (L->frames[i].func == fi) {
      ERR(L, call, "recursive call of func '%s': funcs are inlined, so recursion is not allowed",
          d->name);
      return -1;
    }
  if (lang_budget_check(L->p, L->d, call->line, call->col)) {
    L->errors++;
    return -1;
  }
  if (L->k->nstmts > FB_LANG_MAX_STATEMENTS || L->p->funcs[fi].too_large) {
    ERR(L, call, "kernel too large: inlining '%s' would pass %d IR statements", d->name,
        FB_LANG_MAX_STATEMENTS);
    for (int i = 0; i < L->nframes; i++) L->p->funcs[L->frames[i].func].too_large = 1;
    return -1;
  }
  lval args[16];
  lbind binds[16];
  node *given[16];
  if (d->nkids > 16) {
    ERR(L, call, "func '%s' has more than 16 parameters", d->name);
    return -1;
  }
  /* positional arguments, then those given by name, then the defaults */
  int npos = 0, nreq = 0, bad = 0, named = 0;
  for (int i = 0; i < d->nkids; i++) {
    given[i] = NULL;
    if (!d->kids[i]->a) nreq = i + 1;
  }
  for (int i = 0; i < call->nkids; i++) {
    node *a = call->kids[i];
    if (a->kind != E_KWARG) {
      if (named) {
        ERR(L, a, "an argument without a name cannot follow one given by name");
        return -1;
      }
      if (npos < d->nkids) given[npos] = a;
      npos++;
      continue;
    }
    named = 1;
    int k = -1;
    for (int j = 0; j < d->nkids; j++)
      if (!strcmp(d->kids[j]->name, a->name)) k = j;
    if (k < 0) {
      ERR(L, a, "func '%s' has no parameter '%s'", d->name, a->name);
      return -1;
    }
    if (given[k] || k < npos) {
      ERR(L, a, "argument '%s' of '%s' is given twice", a->name, d->name);
      return -1;
    }
    given[k] = a->a;
  }
  if (npos > d->nkids || (!named && npos < nreq)) {
    if (nreq == d->nkids)
      ERR(L, call, "func '%s' takes %d argument%s, found %d", d->name, d->nkids,
          d->nkids == 1 ? "" : "s", call->nkids);
    else
      ERR(L, call, "func '%s' takes %d to %d arguments, found %d", d->name, nreq, d->nkids,
          npos);
    return -1;
  }
  for (int i = 0; i < d->nkids; i++) {
    if (!given[i]) given[i] = d->kids[i]->a; /* the default (a literal) */
    if (!given[i]) {
      ERR(L, call, "func '%s' is missing argument '%s'", d->name, d->kids[i]->name);
      return -1;
    }
  }
  for (int i = 0; i < d->nkids; i++) {
    node *pm = d->kids[i], *a = given[i];
    char what[96];
    memset(&binds[i], 0, sizeof binds[i]);
    lv_unknown(&args[i]);
    if (pm->is_field) {
      if (a->kind != E_NAME || !lang_resolve_field(L, a->name, &binds[i])) {
        ERR(L, a, "argument %d of '%s' must be a field name (parameter '%s' is a field)", i + 1,
            d->name, pm->name);
        bad = 1;
      }
      continue;
    }
    if (lang_eval(L, a, &args[i]) < 0) {
      bad = 1;
      continue;
    }
    if (args[i].kind == VK_VOID || args[i].kind == VK_TUPLE) {
      ERR(L, a, "argument %d of '%s' has no value", i + 1, d->name);
      bad = 1;
      continue;
    }
    snprintf(what, sizeof what, "argument %d of '%s'", i + 1, d->name);
    if (pm->has_ty && lv_convert(L, &args[i], pm->ty, a, what) < 0) bad = 1;
  }
  if (bad) return -1;
  return inline_body(L, fi, args, binds, call, out);
}

/* ---------------------------------------------------------------- entry points */

static void lower_init(lower *L, fb_program *p, fb_kernel *k, fb_diags *d) {
  memset(L, 0, sizeof *L);
  L->p = p;
  L->d = d;
  L->k = k;
  fb_builder_init(&L->b, k);
}

char *lang_instance_name(fb_program *p, int ki, const lbind *binds) {
  const lkernel *K = &p->kernels[ki];
  size_t n = strlen(K->pub.name) + 3;
  for (int i = 0; i < K->pub.nfield_params; i++) {
    const char *nm = binds[i].kind == LB_FIELD   ? p->fields[binds[i].index].pub.name
                     : binds[i].kind == LB_SNODE ? p->snodes[binds[i].index].name
                                                 : "?";
    n += strlen(nm) + 1;
  }
  char *s = malloc(n);
  if (!s) return NULL;
  strcpy(s, K->pub.name);
  if (!K->pub.nfield_params) return s;
  strcat(s, "[");
  for (int i = 0; i < K->pub.nfield_params; i++) {
    const char *nm = binds[i].kind == LB_FIELD   ? p->fields[binds[i].index].pub.name
                     : binds[i].kind == LB_SNODE ? p->snodes[binds[i].index].name
                                                 : "?";
    if (i) strcat(s, ",");
    strcat(s, nm);
  }
  strcat(s, "]");
  return s;
}

int lang_lower_kernel(fb_program *p, int ki, const lbind *binds, fb_kernel **out, fb_diags *d) {
  lkernel *K = &p->kernels[ki];
  node *decl = K->decl;
  fb_type types[LANG_MAX_KPARAMS];
  int ns = 0;
  if (out) *out = NULL;
  for (int i = 0; i < K->pub.nparams && ns < LANG_MAX_KPARAMS; i++)
    if (!K->params[i].is_field && decl->kids[i]->has_ty && !decl->kids[i]->ty.rows)
      types[ns++] = K->params[i].type;
  char *name = lang_instance_name(p, ki, binds);
  fb_kernel *k = name ? fb_kernel_new(p->layout, name, ns, types, K->pub.ret) : NULL;
  free(name);
  if (!k) return FB_ENOMEM;
  lower L;
  lower_init(&L, p, k, d);
  L.kernel = ki;
  L.kret = decl->ty;
  L.has_kret = decl->has_ty;
  for (int i = 0, si = 0, fi = 0; i < K->pub.nparams; i++) {
    node *pm = decl->kids[i];
    lval v;
    if (K->params[i].is_field) {
      int id = lang_push_sym(&L, pm->name, SYM_FIELD, NULL, pm->line, pm->col);
      if (id >= 0) L.syms[id].bind = binds[fi];
      fi++;
      continue;
    }
    if (pm->has_ty && !pm->ty.rows && si < ns) lv_scalar(&v, K->params[i].type, fb_b_arg(&L.b, si++));
    else lv_unknown(&v); /* reported when the program was parsed (too many too) */
    int id = lang_push_sym(&L, pm->name, SYM_LET, &v, pm->line, pm->col);
    if (id >= 0) L.syms[id].origin = ORIGIN_PARAM;
  }
  node *body = decl->a;
  for (int i = 0; i < body->nkids; i++) {
    if (i > 0 && body->kids[i - 1]->kind == S_RETURN) {
      ERR(&L, body->kids[i], "unreachable code after 'return'");
      break;
    }
    L.top = 1;
    lower_stmt(&L, body->kids[i]);
  }
  if (L.has_kret && !L.returned && !L.errors) {
    char b[64];
    ERR(&L, decl, "kernel '%s' declares the return type %s but never returns a value", decl->name,
        lang_ty_str(L.kret, b, sizeof b));
  }
  free(L.syms);
  int err = L.b.err;
  if (err || L.errors || !out) {
    free(L.pos);
    fb_kernel_free(k);
    return err ? err : L.errors;
  }
  lang_stamp(&L, 0, decl->line, decl->col); /* the rest: the kernel's own */
  free(p->lower_pos);
  p->lower_pos = L.pos;
  p->lower_npos = L.pcap < k->nstmts ? L.pcap : k->nstmts;
  *out = k;
  return 0;
}

int lang_check_func(fb_program *p, int fi, fb_diags *d) {
  node *decl = p->funcs[fi].decl;
  fb_kernel *k = fb_kernel_new(p->layout, decl->name, 0, NULL, FB_T_VOID);
  if (!k) return FB_ENOMEM;
  lower L;
  lower_init(&L, p, k, d);
  L.kernel = -1;
  lval args[16];
  lbind binds[16];
  memset(binds, 0, sizeof binds);
  int n = decl->nkids < 16 ? decl->nkids : 16;
  for (int i = 0; i < n; i++) {
    node *pm = decl->kids[i];
    if (pm->has_ty) zero_value(&L, pm->ty, &args[i]);
    else lv_unknown(&args[i]);
  }
  lval out;
  inline_body(&L, fi, args, binds, decl, &out);
  free(L.syms);
  free(L.pos);
  int err = L.b.err;
  fb_kernel_free(k);
  return err ? err : L.errors;
}
