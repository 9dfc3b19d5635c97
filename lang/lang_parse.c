/* Parser of the .fbk language: tokens to a syntax tree (allocated in the
 * program's arena). Recursive descent; on an error it reports what was
 * expected and what was found, skips to the end of the statement (or the
 * next top-level declaration) and goes on, so one pass reports every error.
 *
 * Node shapes (see lang_internal.h):
 *   E_UNARY op a; E_BINARY op a b; E_CMP kids + ops; E_TERNARY a ? b : c;
 *   E_CALL name kids (b = `covers:` argument); E_INDEX a[kids]; E_LIST kids;
 *   E_CTOR ty(kids);  S_LET name [ty] = a; S_LET_TUPLE (kids names) = a;
 *   S_VAR name [ty] [= a]; S_ASSIGN a op b; S_EXPR a; S_IF a b [c];
 *   S_WHILE a b; S_FOR_RANGE kids[0] in a .. b, body c; S_FOR_IN kids in a,
 *   body c; S_RETURN [a]; S_BLOCK kids.
 *   D_LAYOUT kids; D_SNODE snode_kind axes sizes chunk(ival) [name] kids;
 *   D_PLACE name ty; D_FUNC/D_KERNEL name kids(D_PARAM) [ty] a(body);
 *   D_KERNEL b: E_NAME of `grad NAME` (a custom adjoint), or NULL;
 *   D_CONST name = a. SNode sizes are expressions (size_e, chunk_e). */
#include <stdarg.h>
#include <stdio.h>

#include "lang_internal.h"

typedef struct parser {
  lang_arena *a;
  const token *t;
  int n, pos;
  fb_diags *d;
  int panic; /* an error was reported in the current statement */
  int depth; /* nesting of expressions and blocks (bounded: no stack overflow) */
} parser;

#define MAX_NESTING 100

typedef struct nlist {
  node **v;
  int n, cap;
  int nomem;
} nlist;

static void nl_push(nlist *l, node *x) {
  if (!x) return;
  if (FB_GROW(l->v, l->n, l->cap)) {
    l->nomem = 1;
    return;
  }
  l->v[l->n++] = x;
}

static node **nl_finish(parser *P, nlist *l, int *n) {
  node **v = NULL;
  if (l->n) {
    v = la_alloc(P->a, sizeof(node *) * (size_t)l->n);
    if (v) memcpy(v, l->v, sizeof(node *) * (size_t)l->n);
  }
  *n = v ? l->n : 0;
  free(l->v);
  memset(l, 0, sizeof *l);
  return v;
}

static const token *peek(parser *P) { return &P->t[P->pos]; }
static const token *peek2(parser *P) {
  return P->pos + 1 < P->n ? &P->t[P->pos + 1] : &P->t[P->n - 1];
}
static int at(parser *P, int kind) { return P->t[P->pos].kind == kind; }
static const token *next(parser *P) {
  const token *t = &P->t[P->pos];
  if (t->kind != T_EOF) P->pos++;
  return t;
}
static int accept(parser *P, int kind) {
  if (!at(P, kind)) return 0;
  next(P);
  return 1;
}
static int tok_is(const token *t, const char *s) {
  return t->kind == T_IDENT && (size_t)t->len == strlen(s) && memcmp(t->p, s, (size_t)t->len) == 0;
}

/* "identifier 'foo'", "'{'", "end of line" */
static const char *describe(const token *t, char *buf, size_t n) {
  switch (t->kind) {
  case T_IDENT: snprintf(buf, n, "identifier '%.*s'", t->len > 40 ? 40 : t->len, t->p); break;
  case T_INT:
  case T_FLOAT: snprintf(buf, n, "number '%.*s'", t->len > 40 ? 40 : t->len, t->p); break;
  case T_ANDAND:
  case T_OROR: snprintf(buf, n, "'%.*s'", t->len > 3 ? 3 : t->len, t->p); break; /* && or and */
  default: snprintf(buf, n, "%s", lang_tok_name(t->kind)); break;
  }
  return buf;
}

static void errat(parser *P, const token *t, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
static void errat(parser *P, const token *t, const char *fmt, ...) {
  if (P->panic) return;
  P->panic = 1;
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  lang_err(P->d, t->line, t->col, "%s", buf);
}

static void expected(parser *P, const char *what) {
  char b[96];
  errat(P, peek(P), "expected %s, found %s", what, describe(peek(P), b, sizeof b));
}

static int expect(parser *P, int kind, const char *ctx) {
  if (accept(P, kind)) return 1;
  char b[96];
  errat(P, peek(P), "expected %s%s%s, found %s", lang_tok_name(kind), ctx ? " " : "",
        ctx ? ctx : "", describe(peek(P), b, sizeof b));
  return 0;
}

static node *mk(parser *P, int kind, const token *t) {
  node *x = la_alloc(P->a, sizeof *x);
  if (!x) return NULL;
  x->kind = kind;
  x->line = t->line;
  x->col = t->col;
  return x;
}

static char *tok_str(parser *P, const token *t) { return la_strndup(P->a, t->p, (size_t)t->len); }

static void skip_seps(parser *P) {
  while (at(P, T_NEWLINE) || at(P, T_SEMI)) next(P);
}

/* Skip to the end of the current statement: a newline or ';' (consumed) or
 * the '}' closing the enclosing block (kept), skipping nested { } groups. */
static void sync_stmt(parser *P) {
  int depth = 0;
  while (!at(P, T_EOF)) {
    int k = peek(P)->kind;
    if (depth == 0 && (k == T_NEWLINE || k == T_SEMI)) {
      next(P);
      break;
    }
    if (k == T_RBRACE) {
      if (depth == 0) break;
      depth--;
    } else if (k == T_LBRACE) {
      depth++;
    }
    next(P);
  }
  P->panic = 0;
}

/* ---------------------------------------------------------------- types */

static int is_type_name(const token *t) {
  return t->kind == T_IDENT && fb_type_from_name(t->p, (size_t)t->len) > FB_T_VOID;
}

static int parse_dim(parser *P, int *out) {
  const token *t = peek(P);
  if (!at(P, T_INT)) {
    expected(P, "a vector size (an integer from 1 to 4)");
    return 0;
  }
  next(P);
  if (t->ival < 1 || t->ival > 4) {
    errat(P, t, "vector and matrix sizes must be from 1 to 4, found %llu",
          (unsigned long long)t->ival);
    return 0;
  }
  *out = (int)t->ival;
  return expect(P, T_RBRACK, "after the size");
}

/* SCALAR ['[' n ']' ['[' m ']']] after the scalar name was consumed. */
static int parse_dims(parser *P, lty *ty) {
  int r = 0, c = 0;
  if (at(P, T_LBRACK) && peek2(P)->kind == T_INT) {
    next(P);
    if (!parse_dim(P, &r)) return 0;
    if (at(P, T_LBRACK) && peek2(P)->kind == T_INT) {
      next(P);
      if (!parse_dim(P, &c)) return 0;
    }
  }
  ty->rows = (uint8_t)r;
  ty->cols = (uint8_t)c;
  return 1;
}

static int parse_type(parser *P, lty *ty) {
  const token *t = peek(P);
  if (!is_type_name(t)) {
    expected(P, "a type (i32 i64 u32 u64 f32 f64 bool, optionally [n] or [n][m])");
    return 0;
  }
  next(P);
  memset(ty, 0, sizeof *ty);
  ty->t = (fb_type)fb_type_from_name(t->p, (size_t)t->len);
  return parse_dims(P, ty);
}

/* ---------------------------------------------------------------- expressions */

static node *parse_expr(parser *P);
static node *parse_unary(parser *P);
static node *parse_not(parser *P);

static node *binary(parser *P, const token *op, node *a, node *b) {
  if (!a || !b) return NULL;
  node *x = mk(P, E_BINARY, op);
  if (!x) return NULL;
  x->op = op->kind;
  x->a = a;
  x->b = b;
  return x;
}

static node *parse_args(parser *P, node *call) {
  nlist l = {0};
  skip_seps(P);
  while (!at(P, T_RPAREN) && !at(P, T_EOF) && !P->panic) {
    if (at(P, T_IDENT) && peek2(P)->kind == T_ASSIGN) { /* f(x, c = 3) */
      const token *nt = next(P);
      next(P);
      node *kw = mk(P, E_KWARG, nt);
      if (kw) {
        kw->name = tok_str(P, nt);
        kw->a = parse_expr(P);
      }
      nl_push(&l, kw && kw->a ? kw : NULL);
    } else if (at(P, T_IDENT) && peek2(P)->kind == T_COLON) {
      const token *nt = next(P);
      next(P);
      node *e = parse_expr(P);
      if (!tok_is(nt, "covers"))
        errat(P, nt, "unknown named argument '%.*s' (only assume_unique takes 'covers:')", nt->len,
              nt->p);
      else if (call->b) errat(P, nt, "'covers:' given twice");
      call->b = e;
    } else {
      nl_push(&l, parse_expr(P));
    }
    if (!accept(P, T_COMMA)) break;
  }
  call->kids = nl_finish(P, &l, &call->nkids);
  expect(P, T_RPAREN, "to close the argument list");
  return call;
}

static node *parse_list(parser *P, const token *open) {
  node *x = mk(P, E_LIST, open);
  nlist l = {0};
  while (!at(P, T_RBRACK) && !at(P, T_EOF) && !P->panic) {
    nl_push(&l, parse_expr(P));
    if (!accept(P, T_COMMA)) break;
  }
  if (x) x->kids = nl_finish(P, &l, &x->nkids);
  else free(l.v);
  expect(P, T_RBRACK, "to close the list");
  if (x && x->nkids == 0 && !P->panic)
    errat(P, open, "expected at least one element in a vector literal");
  return x;
}

static node *parse_primary(parser *P) {
  const token *t = peek(P);
  node *x = NULL;
  switch (t->kind) {
  case T_INT:
    next(P);
    if ((x = mk(P, E_INT, t))) x->ival = t->ival;
    return x;
  case T_FLOAT:
    next(P);
    if ((x = mk(P, E_FLOAT, t))) x->fval = t->fval;
    return x;
  case T_TRUE:
  case T_FALSE:
    next(P);
    if ((x = mk(P, E_BOOL, t))) x->ival = t->kind == T_TRUE;
    return x;
  case T_LPAREN: {
    next(P);
    x = parse_expr(P);
    if (x && at(P, T_COMMA)) { /* a tuple (a, b, ...) */
      node *tup = mk(P, E_TUPLE, t);
      nlist l = {0};
      nl_push(&l, x);
      while (accept(P, T_COMMA) && !at(P, T_RPAREN) && !P->panic) nl_push(&l, parse_expr(P));
      if (tup) tup->kids = nl_finish(P, &l, &tup->nkids);
      else free(l.v);
      if (P->panic) return NULL;
      x = tup;
    }
    char b[96];
    if (x && !accept(P, T_RPAREN))
      errat(P, peek(P), "expected ')' to close the '(' at %d:%d, found %s", t->line, t->col,
            describe(peek(P), b, sizeof b));
    return x;
  }
  case T_LBRACK: next(P); return parse_list(P, t);
  case T_IDENT:
    next(P);
    if (is_type_name(t)) {
      if (!(x = mk(P, E_CTOR, t))) return NULL;
      x->ty.t = (fb_type)fb_type_from_name(t->p, (size_t)t->len);
      if (!parse_dims(P, &x->ty)) return NULL;
      if (!expect(P, T_LPAREN, "after a type name (a cast or constructor)")) return NULL;
      return parse_args(P, x);
    }
    if (tok_is(t, "True") || tok_is(t, "False")) {
      errat(P, t, "'%.*s' is Python's spelling: write '%s'", t->len, t->p,
            t->p[0] == 'T' ? "true" : "false");
      return NULL;
    }
    if (tok_is(t, "None")) {
      errat(P, t,
            "'None' has no meaning here: a 0-D field is read and written as x[] (Taichi's "
            "x[None])");
      return NULL;
    }
    if ((x = mk(P, E_NAME, t))) x->name = tok_str(P, t);
    return x;
  default: {
    char b[96];
    errat(P, t, "expected an expression, found %s", describe(t, b, sizeof b));
    return NULL;
  }
  }
}

/* Taichi's `ti.NAME`: what to write instead. */
static void ti_hint(parser *P, const token *m) {
  static const struct {
    const char *name, *hint;
  } h[] = {
      {"Vector", "write a vector as [a, b, c] or f32[3](a, b, c), and a vector field as "
                 "'place v: f32[3]'"},
      {"Matrix", "write a matrix as f32[2][2](a, b, c, d), and a matrix field as "
                 "'place M: f32[2][2]'"},
      {"static", "drop it: a constant range or index is constant already"},
      {"field", "declare fields in the layout block ('field x: f32 (ij: 64, 64)')"},
      {"kernel", "declare a kernel as 'kernel NAME(...) { ... }'"},
      {"func", "declare a func as 'func NAME(...) { ... }'"},
      {"i32", "write the type without 'ti.': i32"},
      {"f32", "write the type without 'ti.': f32"},
      {"f64", "write the type without 'ti.': f64"},
      {"i64", "write the type without 'ti.': i64"},
      {"template", "a field parameter is written 'NAME: field'"},
      {"root", "declare the layout in a 'layout { ... }' block (dense, pointer, bitmasked, "
               "dynamic, place)"},
  };
  for (size_t i = 0; i < sizeof h / sizeof h[0]; i++)
    if (tok_is(m, h[i].name)) {
      errat(P, m, "'ti.%s' is Taichi's spelling; %s", h[i].name, h[i].hint);
      return;
    }
  errat(P, m, "Taichi's 'ti.' prefix is not used here: write '%.*s' without it", m->len, m->p);
}

static node *member(parser *P, node *base, const token *dot) {
  const token *m = peek(P);
  if (!at(P, T_IDENT)) {
    expected(P, "a member name after '.'");
    return NULL;
  }
  next(P);
  if (base && base->kind == E_NAME && !strcmp(base->name, "ti") &&
      !(m->len == 1 && strchr("xyzw", m->p[0]))) {
    ti_hint(P, m);
    return NULL;
  }
  if (at(P, T_LPAREN)) { /* method sugar: x.f(a) is f(x, a) */
    const token *open = next(P);
    node *call = mk(P, E_CALL, m);
    if (!call) return NULL;
    call->name = tok_str(P, m);
    parse_args(P, call);
    node **v = la_alloc(P->a, sizeof(node *) * (size_t)(call->nkids + 1));
    if (!v) return NULL;
    v[0] = base;
    for (int i = 0; i < call->nkids; i++) v[i + 1] = call->kids[i];
    call->kids = v;
    call->nkids++;
    (void)open;
    return call;
  }
  if (m->len == 4 && (!memcmp(m->p, "grad", 4) || !memcmp(m->p, "dual", 4)) &&
      base->kind == E_NAME) {
    /* x.grad / x.dual: the gradient / dual field of x, a field named "x.grad" / "x.dual" */
    size_t bl = strlen(base->name);
    char *nm = la_alloc(P->a, bl + 6);
    if (!nm) return NULL;
    memcpy(nm, base->name, bl);
    nm[bl] = '.';
    memcpy(nm + bl + 1, m->p, 4);
    nm[bl + 5] = 0;
    base->name = nm;
    return base;
  }
  static const char sw[] = "xyzw";
  if (m->len == 1 && strchr(sw, m->p[0])) {
    node *idx = mk(P, E_INT, m), *x = mk(P, E_INDEX, dot);
    node **v = la_alloc(P->a, sizeof(node *));
    if (!idx || !x || !v) return NULL;
    idx->ival = (uint64_t)(strchr(sw, m->p[0]) - sw);
    v[0] = idx;
    x->a = base;
    x->kids = v;
    x->nkids = 1;
    return x;
  }
  errat(P, m, "unknown member '%.*s' (expected x, y, z, w or a method call like v.norm())", m->len,
        m->p);
  return NULL;
}

static node *parse_postfix(parser *P) {
  node *x = parse_primary(P);
  while (x && !P->panic) {
    const token *t = peek(P);
    if (t->kind == T_LPAREN) {
      if (x->kind != E_NAME) {
        errat(P, t, "only functions can be called");
        return NULL;
      }
      next(P);
      x->kind = E_CALL;
      parse_args(P, x);
    } else if (t->kind == T_LBRACK) {
      next(P);
      node *ix = mk(P, E_INDEX, t);
      if (!ix) return NULL;
      nlist l = {0};
      while (!at(P, T_RBRACK) && !at(P, T_EOF) && !P->panic) {
        nl_push(&l, parse_expr(P));
        if (!accept(P, T_COMMA)) break;
      }
      ix->kids = nl_finish(P, &l, &ix->nkids);
      ix->a = x;
      expect(P, T_RBRACK, "to close the index list");
      x = ix;
    } else if (t->kind == T_DOT) {
      next(P);
      x = member(P, x, t);
    } else {
      break;
    }
  }
  return x;
}

static node *parse_power(parser *P) {
  node *x = parse_postfix(P);
  if (at(P, T_STARSTAR)) {
    const token *op = next(P);
    return binary(P, op, x, parse_unary(P)); /* right associative */
  }
  return x;
}

static int enter(parser *P) {
  if (++P->depth <= MAX_NESTING) return 1;
  errat(P, peek(P), "expressions or blocks nested more than %d deep", MAX_NESTING);
  return 0;
}

static node *parse_unary_inner(parser *P);
static node *parse_unary(parser *P) {
  node *x = enter(P) ? parse_unary_inner(P) : NULL;
  P->depth--;
  return x;
}

static node *parse_unary_inner(parser *P) {
  const token *t = peek(P);
  if (t->kind == T_MINUS || t->kind == T_PLUS || t->kind == T_BANG || t->kind == T_TILDE) {
    next(P);
    node *a = parse_unary(P);
    if (!a) return NULL;
    if (t->kind == T_PLUS) return a;
    node *x = mk(P, E_UNARY, t);
    if (!x) return NULL;
    x->op = t->kind;
    x->a = a;
    return x;
  }
  return parse_power(P);
}

/* Binary levels from tightest to loosest (comparisons handled apart). */
static const int levels[][5] = {
    {T_STAR, T_SLASH, T_SLASHSLASH, T_PERCENT, T_AT},
    {T_PLUS, T_MINUS, 0, 0, 0},
    {T_SHL, T_SHR, 0, 0, 0},
    {T_AMP, 0, 0, 0, 0},
    {T_CARET, 0, 0, 0, 0},
    {T_PIPE, 0, 0, 0, 0},
};

static int in_level(int lv, int kind) {
  for (int i = 0; i < 5; i++)
    if (levels[lv][i] && levels[lv][i] == kind) return 1;
  return 0;
}

static node *parse_level(parser *P, int lv) {
  if (lv < 0) return parse_unary(P);
  node *x = parse_level(P, lv - 1);
  while (x && in_level(lv, peek(P)->kind)) {
    const token *op = next(P);
    x = binary(P, op, x, parse_level(P, lv - 1));
  }
  return x;
}

static int is_cmp(int k) {
  return k == T_EQ || k == T_NE || k == T_LT || k == T_LE || k == T_GT || k == T_GE;
}

/* Comparisons chain like Python: a < b < c is a < b && b < c. */
static node *parse_cmp(parser *P) {
  node *x = parse_level(P, 5);
  if (!x || !is_cmp(peek(P)->kind)) return x;
  nlist l = {0};
  int ops[64], nops = 0;
  nl_push(&l, x);
  const token *first = peek(P);
  while (is_cmp(peek(P)->kind) && nops < 64) {
    ops[nops++] = next(P)->kind;
    node *y = parse_level(P, 5);
    if (!y) {
      free(l.v);
      return NULL;
    }
    nl_push(&l, y);
  }
  node *c = mk(P, E_CMP, first);
  if (!c) {
    free(l.v);
    return NULL;
  }
  c->line = x->line;
  c->col = x->col;
  c->kids = nl_finish(P, &l, &c->nkids);
  c->ops = la_alloc(P->a, sizeof(int) * (size_t)nops);
  if (c->ops) memcpy(c->ops, ops, sizeof(int) * (size_t)nops);
  c->op = ops[0];
  return c;
}

/* `not x` binds more loosely than comparisons, as in Python: `not a < b`
 * is `!(a < b)`. It means what `!` means (E_UNARY with op T_NOT). */
static node *parse_not_inner(parser *P) {
  if (!at(P, T_NOT)) return parse_cmp(P);
  const token *t = next(P);
  node *a = parse_not(P);
  if (!a) return NULL;
  node *x = mk(P, E_UNARY, t);
  if (!x) return NULL;
  x->op = T_NOT;
  x->a = a;
  return x;
}

static node *parse_not(parser *P) {
  node *x = enter(P) ? parse_not_inner(P) : NULL;
  P->depth--;
  return x;
}

static node *parse_and(parser *P) {
  node *x = parse_not(P);
  while (x && at(P, T_ANDAND)) {
    const token *op = next(P);
    x = binary(P, op, x, parse_not(P));
  }
  return x;
}

static node *parse_or(parser *P) {
  node *x = parse_and(P);
  while (x && at(P, T_OROR)) {
    const token *op = next(P);
    x = binary(P, op, x, parse_and(P));
  }
  return x;
}

static node *parse_expr_inner(parser *P) {
  node *c = parse_or(P);
  if (!c || !at(P, T_QUESTION)) return c;
  const token *q = next(P);
  node *x = mk(P, E_TERNARY, q);
  node *a = parse_expr(P);
  if (!expect(P, T_COLON, "in a conditional expression 'c ? a : b'")) return NULL;
  node *b = parse_expr(P);
  if (!x || !a || !b) return NULL;
  x->a = c;
  x->b = a;
  x->c = b;
  return x;
}

static node *parse_expr(parser *P) {
  node *x = enter(P) ? parse_expr_inner(P) : NULL;
  P->depth--;
  return x;
}

/* ---------------------------------------------------------------- statements */

static node *parse_block(parser *P);
static node *parse_stmt(parser *P);

static node *name_node(parser *P, const char *what) {
  const token *t = peek(P);
  if (!at(P, T_IDENT)) {
    expected(P, what);
    return NULL;
  }
  next(P);
  node *x = mk(P, E_NAME, t);
  if (x) x->name = tok_str(P, t);
  return x;
}

/* e1, e2, ... on the right of '=' or after return: one expression, or an
 * E_TUPLE when there are several. */
static node *parse_rhs(parser *P) {
  const token *t = peek(P);
  node *x = parse_expr(P);
  if (!x || !at(P, T_COMMA)) return x;
  node *tup = mk(P, E_TUPLE, t);
  nlist l = {0};
  nl_push(&l, x);
  while (accept(P, T_COMMA) && !P->panic) nl_push(&l, parse_expr(P));
  if (tup) tup->kids = nl_finish(P, &l, &tup->nkids);
  else free(l.v);
  return P->panic ? NULL : tup;
}

/* let (a, b) = ... / var (a, b) = ... (op: T_LET or T_VAR) */
static node *parse_decl_tuple(parser *P, const token *kw) {
  next(P);
  node *x = mk(P, S_LET_TUPLE, kw);
  nlist l = {0};
  do nl_push(&l, name_node(P, kw->kind == T_VAR ? "a name in 'var (a, b) = ...'"
                                                : "a name in 'let (a, b) = ...'"));
  while (!P->panic && accept(P, T_COMMA));
  if (x) x->kids = nl_finish(P, &l, &x->nkids);
  else free(l.v);
  if (!expect(P, T_RPAREN, "after the names") ||
      !expect(P, T_ASSIGN, kw->kind == T_VAR ? "in 'var'" : "in 'let'"))
    return NULL;
  node *e = parse_rhs(P);
  if (!x || !e) return NULL;
  x->op = kw->kind;
  x->a = e;
  return x;
}

static node *parse_let(parser *P, const token *kw) {
  if (at(P, T_LPAREN)) return parse_decl_tuple(P, kw);
  node *nm = name_node(P, "a name after 'let'");
  if (!nm) return NULL;
  node *x = mk(P, S_LET, kw);
  if (!x) return NULL;
  x->name = nm->name;
  x->line = nm->line;
  x->col = nm->col;
  if (accept(P, T_COLON)) {
    if (!parse_type(P, &x->ty)) return NULL;
    x->has_ty = 1;
  }
  if (!expect(P, T_ASSIGN, "after the name in 'let' (a let needs a value)")) return NULL;
  x->a = parse_expr(P);
  return x->a ? x : NULL;
}

static node *parse_var(parser *P, const token *kw) {
  if (at(P, T_LPAREN)) return parse_decl_tuple(P, kw);
  node *nm = name_node(P, "a name after 'var'");
  if (!nm) return NULL;
  node *x = mk(P, S_VAR, kw);
  if (!x) return NULL;
  x->name = nm->name;
  x->line = nm->line;
  x->col = nm->col;
  if (accept(P, T_COLON)) {
    if (!parse_type(P, &x->ty)) return NULL;
    x->has_ty = 1;
  }
  if (accept(P, T_ASSIGN)) {
    if (!(x->a = parse_expr(P))) return NULL;
  } else if (!x->has_ty) {
    expected(P, "':' TYPE or '= value' after the name in 'var'");
    return NULL;
  }
  return x;
}

static node *parse_if(parser *P, const token *kw) {
  node *x = mk(P, S_IF, kw);
  node *c = parse_expr(P);
  if (!c) return NULL;
  node *body = parse_block(P);
  if (!x || !body) return NULL;
  x->a = c;
  x->b = body;
  if (at(P, T_NEWLINE) && peek2(P)->kind == T_ELSE) next(P);
  if (accept(P, T_ELSE)) {
    const token *t = peek(P);
    if (accept(P, T_IF)) x->c = parse_if(P, t);
    else x->c = parse_block(P);
    if (!x->c) return NULL;
  }
  return x;
}

static node *parse_for(parser *P, const token *kw) {
  nlist l = {0};
  do nl_push(&l, name_node(P, "a loop variable name after 'for'"));
  while (!P->panic && accept(P, T_COMMA));
  if (P->panic || !expect(P, T_IN, "after the loop variables")) {
    free(l.v);
    return NULL;
  }
  node *x = mk(P, S_FOR_IN, kw);
  if (!x) {
    free(l.v);
    return NULL;
  }
  x->kids = nl_finish(P, &l, &x->nkids);
  node *e = parse_expr(P);
  if (!e) return NULL;
  if (accept(P, T_DOTDOT)) {
    x->kind = S_FOR_RANGE;
    x->a = e;
    if (!(x->b = parse_expr(P))) return NULL;
  } else if (e->kind == E_CALL && !strcmp(e->name, "range") && (e->nkids == 1 || e->nkids == 2)) {
    x->kind = S_FOR_RANGE; /* Python's range(n) / range(a, b) */
    if (e->nkids == 1) {
      node *zero = mk(P, E_INT, kw);
      if (!zero) return NULL;
      zero->line = e->line;
      zero->col = e->col;
      x->a = zero;
      x->b = e->kids[0];
    } else {
      x->a = e->kids[0];
      x->b = e->kids[1];
    }
  } else if (e->kind == E_CALL && !strcmp(e->name, "range") && e->nkids == 3) {
    if (!P->panic)
      lang_err(P->d, e->line, e->col,
               "range(a, b, step) is not supported: loop over the count (for k in 0 .. n) and "
               "use a + k * step");
    P->panic = 1;
    return NULL;
  } else {
    x->a = e;
  }
  if (x->kind == S_FOR_RANGE && x->nkids != 1) {
    errat(P, kw, "a range loop takes exactly one loop variable, found %d", x->nkids);
    return NULL;
  }
  if (!(x->c = parse_block(P))) return NULL;
  return x;
}

static int is_assign_op(int k) {
  switch (k) {
  case T_ASSIGN:
  case T_PLUSEQ:
  case T_MINUSEQ:
  case T_STAREQ:
  case T_SLASHEQ:
  case T_AMPEQ:
  case T_PIPEEQ:
  case T_CARETEQ:
  case T_MINEQ:
  case T_MAXEQ:
  case T_SLASHSLASHEQ:
  case T_PERCENTEQ:
  case T_STARSTAREQ:
  case T_SHLEQ:
  case T_SHREQ: return 1;
  default: return 0;
  }
}

/* Python words that start a statement or declaration: what to write instead.
 * Returns 1 when t is one of them (reported). */
static int python_word_hint(parser *P, const token *t) {
  int k2 = peek2(P)->kind;
  if (is_assign_op(k2) || k2 == T_DOT || k2 == T_LBRACK || k2 == T_COMMA)
    return 0; /* a variable or field that happens to be called so */
  if (tok_is(t, "elif")) errat(P, t, "there is no 'elif': write 'else if'");
  else if (tok_is(t, "def"))
    errat(P, t, "'def' is Python's: declare 'func NAME(...) { ... }' (Taichi's @ti.func) or "
                "'kernel NAME(...) { ... }' (@ti.kernel)");
  else if (tok_is(t, "pass")) errat(P, t, "'pass' is not needed: an empty block is written {}");
  else if (tok_is(t, "import") || tok_is(t, "from"))
    errat(P, t, "'%.*s' is Python's: a .fbk file needs no imports", t->len, t->p);
  else return 0;
  return 1;
}

static node *parse_stmt(parser *P) {
  const token *t = peek(P);
  node *x;
  switch (t->kind) {
  case T_LET: next(P); return parse_let(P, t);
  case T_VAR: next(P); return parse_var(P, t);
  case T_IF: next(P); return parse_if(P, t);
  case T_WHILE:
    next(P);
    if (!(x = mk(P, S_WHILE, t)) || !(x->a = parse_expr(P)) || !(x->b = parse_block(P)))
      return NULL;
    return x;
  case T_FOR: next(P); return parse_for(P, t);
  case T_BREAK: next(P); return mk(P, S_BREAK, t);
  case T_CONTINUE: next(P); return mk(P, S_CONTINUE, t);
  case T_RETURN:
    next(P);
    if (!(x = mk(P, S_RETURN, t))) return NULL;
    if (!at(P, T_NEWLINE) && !at(P, T_SEMI) && !at(P, T_RBRACE) && !at(P, T_EOF))
      if (!(x->a = parse_rhs(P))) return NULL;
    return x;
  case T_LBRACE: return parse_block(P);
  case T_CONST:
    errat(P, t,
          "'const' declares a constant of the whole program: write it outside kernels and funcs "
          "(here, use 'let')");
    return NULL;
  case T_IDENT:
    if (python_word_hint(P, t)) return NULL;
    break;
  default: break;
  }
  node *e = parse_expr(P);
  if (!e) return NULL;
  if (at(P, T_COMMA)) { /* a, b = e1, e2 */
    nlist l = {0};
    nl_push(&l, e);
    while (accept(P, T_COMMA) && !P->panic) nl_push(&l, parse_expr(P));
    x = mk(P, S_ASSIGN_MULTI, t);
    if (x) x->kids = nl_finish(P, &l, &x->nkids);
    else free(l.v);
    if (P->panic || !x) return NULL;
    x->line = e->line;
    x->col = e->col;
    if (!expect(P, T_ASSIGN, "after the names in 'a, b = ...'")) return NULL;
    if (!(x->a = parse_rhs(P))) return NULL;
    return x;
  }
  if (is_assign_op(peek(P)->kind)) {
    const token *op = next(P);
    if (!(x = mk(P, S_ASSIGN, op))) return NULL;
    x->op = op->kind;
    x->a = e;
    if (!(x->b = parse_expr(P))) return NULL;
    return x;
  }
  if (!(x = mk(P, S_EXPR, t))) return NULL;
  x->line = e->line;
  x->col = e->col;
  x->a = e;
  return x;
}

static node *parse_block_inner(parser *P);
static node *parse_block(parser *P) {
  node *x = enter(P) ? parse_block_inner(P) : NULL;
  P->depth--;
  return x;
}

static node *parse_block_inner(parser *P) {
  const token *open = peek(P);
  if (at(P, T_COLON)) {
    errat(P, open, "expected '{' to open a block, found ':' (blocks are written in braces "
                   "'{ ... }', not with ':' and indentation)");
    return NULL;
  }
  if (!expect(P, T_LBRACE, "to open a block")) return NULL;
  node *x = mk(P, S_BLOCK, open);
  nlist l = {0};
  for (;;) {
    skip_seps(P);
    if (accept(P, T_RBRACE)) break;
    if (at(P, T_EOF)) {
      errat(P, peek(P), "expected '}' to close the block opened at line %d, found end of file",
            open->line);
      break;
    }
    node *s = parse_stmt(P);
    nl_push(&l, s);
    if (!P->panic && !at(P, T_NEWLINE) && !at(P, T_SEMI) && !at(P, T_RBRACE)) {
      char b[96];
      errat(P, peek(P), "expected end of line or ';' after the statement, found %s",
            describe(peek(P), b, sizeof b));
    }
    if (P->panic) sync_stmt(P);
  }
  if (x) x->kids = nl_finish(P, &l, &x->nkids);
  else free(l.v);
  return x;
}

/* ---------------------------------------------------------------- layout */

static const struct {
  const char *s;
  int kind;
} snode_kinds[] = {{"dense", FB_SN_DENSE},
                   {"bitmasked", FB_SN_BITMASKED},
                   {"pointer", FB_SN_POINTER},
                   {"dynamic", FB_SN_DYNAMIC}};

static node *parse_litems(parser *P, node *parent, const token *open);

/* '(' AXES ':' sizes [',' chunk ':' size] ')' ['as' NAME] into x. */
static int parse_snode_head(parser *P, node *x) {
  if (!expect(P, T_LPAREN, "after the SNode kind")) return 0;
  const token *ax = peek(P);
  if (!at(P, T_IDENT)) {
    expected(P, "axes like 'ij' (letters i j k l)");
    return 0;
  }
  next(P);
  if (ax->len > FB_MAX_AXES) {
    errat(P, ax, "at most %d axes, found '%.*s'", FB_MAX_AXES, ax->len, ax->p);
    return 0;
  }
  memcpy(x->axes, ax->p, (size_t)ax->len);
  x->axes[ax->len] = 0;
  if (!expect(P, T_COLON, "after the axes")) return 0;
  for (;;) {
    /* sizes are constant expressions, evaluated by lang_eval_consts */
    const token *st = peek(P);
    if (tok_is(st, "chunk") && peek2(P)->kind == T_COLON) {
      next(P);
      next(P);
      if (!(x->chunk_e = parse_expr(P))) return 0;
      x->has_chunk = 1;
    } else {
      if (x->nsizes >= FB_MAX_AXES) {
        errat(P, st, "more than %d sizes", FB_MAX_AXES);
        return 0;
      }
      if (!(x->size_e[x->nsizes++] = parse_expr(P))) return 0;
    }
    if (!accept(P, T_COMMA)) break;
  }
  if (!expect(P, T_RPAREN, "after the sizes")) return 0;
  if (tok_is(peek(P), "as")) {
    next(P);
    const token *nt = peek(P);
    if (!at(P, T_IDENT)) {
      expected(P, "a name after 'as'");
      return 0;
    }
    next(P);
    x->name = tok_str(P, nt);
  }
  return 1;
}

static node *parse_snode(parser *P, const token *kt, int kind) {
  node *x = mk(P, D_SNODE, kt);
  if (!x) return NULL;
  x->snode_kind = kind;
  if (!parse_snode_head(P, x)) return NULL;
  const token *open = peek(P);
  if (!expect(P, T_LBRACE, "to open the SNode's body")) return NULL;
  return parse_litems(P, x, open);
}

static int parse_place(parser *P, nlist *out) {
  do {
    const token *nt = peek(P);
    if (!at(P, T_IDENT)) {
      expected(P, "a field name after 'place'");
      return 0;
    }
    next(P);
    node *x = mk(P, D_PLACE, nt);
    if (!x) return 0;
    x->name = tok_str(P, nt);
    if (!expect(P, T_COLON, "after the field name") || !parse_type(P, &x->ty)) return 0;
    for (;;) { /* `grad` and/or `dual`: a gradient / a dual (tangent) place beside it */
      if (tok_is(peek(P), "grad") && !x->has_grad) x->has_grad = 1;
      else if (tok_is(peek(P), "dual") && !x->has_dual) x->has_dual = 1;
      else break;
      next(P);
    }
    nl_push(out, x);
  } while (accept(P, T_COMMA));
  return 1;
}

/* field NAME: TYPE [(AXES: sizes)]: a field in a dense block of its own
 * (Taichi's ti.field(shape=...)); without sizes, a place. */
static void parse_field_decl(parser *P, const token *kw, nlist *out) {
  nlist one = {0};
  if (!parse_place(P, &one)) {
    free(one.v);
    return;
  }
  if (one.n != 1) {
    errat(P, kw, "'field' declares one field; write one 'field' line per field (each gets its "
                 "own block) or 'dense(...) { place a: T, b: T }' to interleave them");
    free(one.v);
    return;
  }
  node *pl = one.v[0];
  free(one.v);
  if (!at(P, T_LPAREN)) {
    nl_push(out, pl);
    return;
  }
  node *x = mk(P, D_SNODE, kw);
  if (!x) return;
  x->snode_kind = FB_SN_DENSE;
  x->is_field = 1; /* marks the shorthand (one field, its own block) */
  if (!parse_snode_head(P, x)) return;
  node **v = la_alloc(P->a, sizeof(node *));
  if (!v) return;
  v[0] = pl;
  x->kids = v;
  x->nkids = 1;
  nl_push(out, x);
}

static void parse_litem(parser *P, nlist *out) {
  const token *t = peek(P);
  if (tok_is(t, "field")) {
    next(P);
    parse_field_decl(P, t, out);
    return;
  }
  if (tok_is(t, "place")) {
    next(P);
    parse_place(P, out);
    return;
  }
  for (size_t i = 0; i < sizeof snode_kinds / sizeof snode_kinds[0]; i++)
    if (tok_is(t, snode_kinds[i].s)) {
      next(P);
      nl_push(out, parse_snode(P, t, snode_kinds[i].kind));
      return;
    }
  expected(P, "'dense', 'bitmasked', 'pointer', 'dynamic', 'place' or 'field' in a layout");
}

/* Items of a layout or SNode body up to the closing '}'. */
static node *parse_litems(parser *P, node *parent, const token *open) {
  nlist l = {0};
  for (;;) {
    skip_seps(P);
    if (accept(P, T_RBRACE)) break;
    if (at(P, T_EOF)) {
      errat(P, peek(P), "expected '}' to close the block opened at line %d, found end of file",
            open->line);
      break;
    }
    if (enter(P)) parse_litem(P, &l);
    P->depth--;
    if (!P->panic && !at(P, T_NEWLINE) && !at(P, T_SEMI) && !at(P, T_RBRACE)) {
      char b[96];
      errat(P, peek(P), "expected end of line after the layout item, found %s",
            describe(peek(P), b, sizeof b));
    }
    if (P->panic) sync_stmt(P);
  }
  parent->kids = nl_finish(P, &l, &parent->nkids);
  return parent;
}

/* ---------------------------------------------------------------- declarations */

static node *parse_param(parser *P) {
  const token *nt = peek(P);
  if (!at(P, T_IDENT)) {
    expected(P, "a parameter name");
    return NULL;
  }
  next(P);
  node *x = mk(P, D_PARAM, nt);
  if (!x) return NULL;
  x->name = tok_str(P, nt);
  if (accept(P, T_COLON)) {
    if (tok_is(peek(P), "field")) {
      next(P);
      x->is_field = 1;
    } else {
      if (!parse_type(P, &x->ty)) return NULL;
      x->has_ty = 1;
    }
  }
  if (accept(P, T_ASSIGN) && !(x->a = parse_expr(P))) return NULL; /* a default value */
  return x;
}

static node *parse_callable(parser *P, const token *kw) {
  node *x = mk(P, kw->kind == T_KERNEL ? D_KERNEL : D_FUNC, kw);
  const token *nt = peek(P);
  if (!at(P, T_IDENT)) {
    expected(P, kw->kind == T_KERNEL ? "a kernel name" : "a func name");
    return NULL;
  }
  next(P);
  if (!x) return NULL;
  x->name = tok_str(P, nt);
  x->line = nt->line;
  x->col = nt->col;
  if (!expect(P, T_LPAREN, "after the name")) return NULL;
  nlist l = {0};
  while (!at(P, T_RPAREN) && !at(P, T_EOF) && !P->panic) {
    nl_push(&l, parse_param(P));
    if (!accept(P, T_COMMA)) break;
  }
  x->kids = nl_finish(P, &l, &x->nkids);
  if (!expect(P, T_RPAREN, "to close the parameter list")) return NULL;
  if (accept(P, T_ARROW)) {
    if (!parse_type(P, &x->ty)) return NULL;
    x->has_ty = 1;
  }
  if (kw->kind == T_KERNEL && tok_is(peek(P), "grad")) { /* a custom adjoint */
    next(P);
    if (!(x->b = name_node(P, "the name of the kernel that is this kernel's adjoint after "
                              "'grad' (kernel k(...) grad k_adj { ... })")))
      return NULL;
  }
  x->a = parse_block(P);
  return x->a ? x : NULL;
}

/* const NAME = expr (at the top level) */
static node *parse_const(parser *P, const token *kw) {
  node *nm = name_node(P, "a name after 'const'");
  if (!nm) return NULL;
  node *x = mk(P, D_CONST, kw);
  if (!x) return NULL;
  x->name = nm->name;
  x->line = nm->line;
  x->col = nm->col;
  if (!expect(P, T_ASSIGN, "after the name in 'const' (a constant needs a value)")) return NULL;
  if (!(x->a = parse_expr(P))) return NULL;
  if (!at(P, T_NEWLINE) && !at(P, T_SEMI) && !at(P, T_EOF)) {
    expected(P, "end of line after the constant");
    return NULL;
  }
  return x;
}

/* Skip to the next top-level declaration. */
static void sync_top(parser *P) {
  int depth = 0;
  while (!at(P, T_EOF)) {
    const token *t = peek(P);
    if (depth == 0 && (t->kind == T_KERNEL || t->kind == T_FUNC || t->kind == T_CONST ||
                       tok_is(t, "layout")))
      break;
    if (t->kind == T_LBRACE) depth++;
    if (t->kind == T_RBRACE && depth > 0) depth--;
    next(P);
  }
  P->panic = 0;
}

int lang_parse(lang_arena *a, const token *toks, int ntok, node ***decls, int *ndecls,
               fb_diags *d) {
  parser P = {a, toks, ntok, 0, d, 0, 0};
  nlist l = {0};
  for (;;) {
    skip_seps(&P);
    const token *t = peek(&P);
    if (t->kind == T_EOF) break;
    int start = P.pos;
    if (tok_is(t, "layout")) {
      next(&P);
      node *x = mk(&P, D_LAYOUT, t);
      const token *open = peek(&P);
      if (x && expect(&P, T_LBRACE, "after 'layout'")) nl_push(&l, parse_litems(&P, x, open));
    } else if (t->kind == T_KERNEL || t->kind == T_FUNC) {
      next(&P);
      nl_push(&l, parse_callable(&P, t));
    } else if (t->kind == T_CONST) {
      next(&P);
      nl_push(&l, parse_const(&P, t));
    } else if (t->kind == T_AT) {
      errat(&P, t, "decorators are not used: write 'kernel NAME(...) { ... }' for @ti.kernel "
                   "and 'func NAME(...) { ... }' for @ti.func");
      next(&P); /* skip the decorator: @ti.kernel, @ti.func(...) */
      if (at(&P, T_IDENT) || at(&P, T_KERNEL) || at(&P, T_FUNC)) next(&P);
      while (at(&P, T_DOT) &&
             (peek2(&P)->kind == T_IDENT || peek2(&P)->kind == T_KERNEL || peek2(&P)->kind == T_FUNC))
        next(&P), next(&P);
      if (at(&P, T_LPAREN))
        for (int depth = 0; !at(&P, T_EOF);) {
          int k = next(&P)->kind;
          depth += k == T_LPAREN ? 1 : k == T_RPAREN ? -1 : 0;
          if (!depth) break;
        }
      P.panic = 0;
      continue;
    } else if (!(t->kind == T_IDENT && python_word_hint(&P, t))) {
      expected(&P, "'layout', 'const', 'func' or 'kernel' at the top level");
    }
    if (P.panic || P.pos == start) {
      if (P.pos == start) next(&P);
      sync_top(&P);
    }
  }
  *decls = nl_finish(&P, &l, ndecls);
  return a->failed ? FB_ENOMEM : 0;
}
