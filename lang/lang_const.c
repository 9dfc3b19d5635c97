/* Module-level constants (`const n = 128`, `const m = n // 4`) and the
 * sizes of SNodes, which are constant expressions over numbers and the
 * constants declared above them.
 *
 * A constant is an untyped literal: an i64 integer or an f64 float, computed
 * with the same rules as operations between literals inside kernels
 * (lang_vec.c's folding, which uses ir/arith.c: `//` and `%` floored like
 * Python, `/` true division giving a float, integers wrapping at 64 bits,
 * shift counts modulo 64). In a kernel a constant's name reads as that
 * literal. A layout size must be an integer from 1 to 2^31 - 1.
 *
 * Every mistake is one diagnostic at the sub-expression at fault; a
 * constant with an error is marked so that its uses say nothing more. */
#include <math.h>
#include <stdio.h>

#include "ir/arith.h"
#include "lang_internal.h"

typedef struct cnum {
  int is_float;
  int64_t i;
  double f;
} cnum;

static uint64_t name_hash(const char *name) { return fb__fnv(FB_FNV_INIT, name, strlen(name)); }

const lconst *lang_find_const(const fb_program *p, const char *name) {
  if (!p->nconsts) return NULL;
  size_t it = 0;
  for (const int *ix; (ix = fb_map_next(&p->const_names, name_hash(name), &it));)
    if (!strcmp(p->consts[*ix].name, name)) return &p->consts[*ix];
  return NULL;
}

static double as_f(const cnum *v) { return v->is_float ? v->f : (double)v->i; }

static const char *what_const(const node *e) {
  switch (e->kind) {
  case E_BOOL: return "a bool";
  case E_CALL: return "a function call";
  case E_INDEX: return "an index expression";
  case E_CMP: return "a comparison";
  case E_TERNARY: return "a conditional";
  case E_LIST: return "a vector";
  default: return "this expression";
  }
}

/* 0, or -1 after one diagnostic (or silently when *quiet: an earlier error). */
static int ceval(fb_program *p, const node *e, cnum *out, fb_diags *d, int *quiet) {
  memset(out, 0, sizeof *out);
  switch (e->kind) {
  case E_INT:
    out->i = (int64_t)e->ival;
    return 0;
  case E_FLOAT:
    out->is_float = 1;
    out->f = e->fval;
    return 0;
  case E_NAME: {
    const lconst *c = lang_find_const(p, e->name);
    if (!c) {
      lang_err(d, e->line, e->col,
               "'%s' is not a constant: a constant or a layout size may use numbers and the "
               "constants declared before it (const %s = ...)",
               e->name, e->name);
      return -1;
    }
    if (!c->ok) {
      *quiet = 1;
      return -1;
    }
    out->is_float = c->is_float;
    out->i = c->i;
    out->f = c->f;
    return 0;
  }
  case E_UNARY: {
    cnum a;
    if (ceval(p, e->a, &a, d, quiet) < 0) return -1;
    if (e->op == T_MINUS) {
      uint64_t u = 0;
      fb_arith_int_unop(FB_OP_NEG, FB_T_I64, (uint64_t)a.i, &u);
      out->is_float = a.is_float;
      out->i = (int64_t)u;
      out->f = -a.f;
      return 0;
    }
    if (e->op == T_TILDE && !a.is_float) {
      out->i = ~a.i;
      return 0;
    }
    lang_err(d, e->line, e->col, "operator %s cannot be used in a constant%s",
             lang_tok_name(e->op), e->op == T_TILDE ? " on a float" : "");
    return -1;
  }
  case E_CALL:
  case E_CTOR: {
    /* int(x), float(x) and the scalar casts i32(x), f64(x), ... */
    fb_type t = FB_T_VOID;
    if (e->kind == E_CTOR && e->ty.rows == 0) t = e->ty.t;
    if (e->kind == E_CALL && !strcmp(e->name, "int")) t = FB_T_I64;
    if (e->kind == E_CALL && !strcmp(e->name, "float")) t = FB_T_F64;
    if (t == FB_T_VOID || t == FB_T_BOOL || e->nkids != 1) break;
    cnum a;
    if (ceval(p, e->kids[0], &a, d, quiet) < 0) return -1;
    if (fb_type_is_float(t)) {
      out->is_float = 1;
      out->f = as_f(&a);
      if (t == FB_T_F32) out->f = (double)(float)out->f;
      return 0;
    }
    fb_value v = a.is_float ? fb_value_f64(a.f) : fb_value_i64(a.i);
    out->i = fb_value_as_i64(fb_value_cast(fb_value_cast(v, t), FB_T_I64));
    return 0;
  }
  case E_BINARY: {
    cnum a, b;
    if (ceval(p, e->a, &a, d, quiet) < 0 || ceval(p, e->b, &b, d, quiet) < 0) return -1;
    fb_op op;
    switch (e->op) {
    case T_PLUS: op = FB_OP_ADD; break;
    case T_MINUS: op = FB_OP_SUB; break;
    case T_STAR: op = FB_OP_MUL; break;
    case T_SLASH: op = FB_OP_DIV; break;
    case T_SLASHSLASH: op = FB_OP_FLOORDIV; break;
    case T_PERCENT: op = FB_OP_FLOORMOD; break;
    case T_STARSTAR: op = FB_OP_POW; break;
    case T_AMP: op = FB_OP_AND; break;
    case T_PIPE: op = FB_OP_OR; break;
    case T_CARET: op = FB_OP_XOR; break;
    case T_SHL: op = FB_OP_SHL; break;
    case T_SHR: op = FB_OP_SHR; break;
    default:
      lang_err(d, e->line, e->col, "operator %s cannot be used in a constant",
               lang_tok_name(e->op));
      return -1;
    }
    int isf = a.is_float || b.is_float;
    int bits = op == FB_OP_AND || op == FB_OP_OR || op == FB_OP_XOR || op == FB_OP_SHL ||
               op == FB_OP_SHR;
    if (isf && bits) {
      lang_err(d, e->line, e->col, "operator %s needs integer operands, found a float",
               lang_tok_name(e->op));
      return -1;
    }
    /* int / int and int ** negative int give floats, as between literals */
    if (isf || op == FB_OP_DIV || (op == FB_OP_POW && b.i < 0)) {
      out->is_float = 1;
      fb_arith_f64_binop(op, as_f(&a), as_f(&b), &out->f);
      return 0;
    }
    if (op == FB_OP_POW) { /* by squaring, wrapping at 64 bits */
      uint64_t r = 1, x = (uint64_t)a.i;
      for (int64_t k = b.i; k > 0; k >>= 1) {
        if (k & 1) r *= x;
        x *= x;
      }
      out->i = (int64_t)r;
      return 0;
    }
    uint64_t u = 0;
    fb_arith_int_binop(op, FB_T_I64, (uint64_t)a.i, (uint64_t)b.i, &u);
    out->i = (int64_t)u;
    return 0;
  }
  default: break;
  }
  lang_err(d, e->line, e->col,
           "%s cannot be used in a constant: a constant or a layout size is built from numbers, "
           "constants declared before it, + - * / // %% ** & | ^ << >> ~, int() and float()",
           what_const(e));
  return -1;
}

/* One size or chunk: an integer from 1 to INT32_MAX. */
static int eval_size(fb_program *p, node *x, const node *e, const char *what, int64_t *out,
                     fb_diags *d) {
  cnum v;
  int quiet = 0;
  if (ceval(p, e, &v, d, &quiet) < 0) return -1;
  int line, col;
  lang_expr_pos(e, &line, &col);
  const char *kn = fb_snode_kind_name((fb_snode_kind)x->snode_kind);
  if (v.is_float) {
    char fb[64];
    snprintf(fb, sizeof fb, fabs(v.f) < 1e15 && floor(v.f) == v.f ? "%.1f" : "%g", v.f);
    lang_err(d, line, col,
             "%s: %s must be an integer, found the float %s (`/` is true division: use `//`, "
             "or int(...))",
             kn, what, fb);
    return -1;
  }
  if (v.i <= 0 || v.i > INT32_MAX) {
    lang_err(d, line, col, "%s: %s must be from 1 to %d, found %lld", kn, what, INT32_MAX,
             (long long)v.i);
    return -1;
  }
  *out = v.i;
  return 0;
}

static void eval_snode_sizes(fb_program *p, node *x, fb_diags *d) {
  if (x->kind != D_SNODE) return;
  for (int i = 0; i < x->nsizes; i++)
    if (eval_size(p, x, x->size_e[i], "a size", &x->sizes[i], d) < 0) x->size_bad = 1;
  if (x->chunk_e) {
    int64_t c = 0;
    if (eval_size(p, x, x->chunk_e, "the chunk size", &c, d) < 0) x->size_bad = 1;
    x->ival = (uint64_t)c;
  }
  for (int i = 0; i < x->nkids; i++) eval_snode_sizes(p, x->kids[i], d);
}

static int add_const(fb_program *p, node *x, fb_diags *d) {
  const lconst *prev = lang_find_const(p, x->name);
  if (prev) {
    lang_err(d, x->line, x->col, "constant '%s' is already defined (at line %d)", x->name,
             prev->line);
    return 0;
  }
  if (FB_GROW(p->consts, p->nconsts, p->ccap)) return FB_ENOMEM;
  int *ix = fb_map_add(&p->const_names, name_hash(x->name));
  if (!ix) return FB_ENOMEM;
  *ix = p->nconsts;
  lconst *c = &p->consts[p->nconsts++];
  memset(c, 0, sizeof *c);
  c->name = x->name;
  c->line = x->line;
  c->col = x->col;
  cnum v;
  int quiet = 0;
  if (ceval(p, x->a, &v, d, &quiet) < 0) return 0; /* c->ok stays 0 */
  c->ok = 1;
  c->is_float = v.is_float;
  c->i = v.is_float ? lang_f2i(v.f) : v.i;
  c->f = v.is_float ? v.f : (double)v.i;
  return 0;
}

int lang_eval_consts(fb_program *p, node **decls, int ndecls, fb_diags *d) {
  for (int i = 0; i < ndecls; i++)
    if (decls[i]->kind == D_CONST && add_const(p, decls[i], d) < 0) return FB_ENOMEM;
  return 0;
}

void lang_eval_sizes(fb_program *p, node **decls, int ndecls, fb_diags *d) {
  for (int i = 0; i < ndecls; i++)
    if (decls[i]->kind == D_LAYOUT)
      for (int k = 0; k < decls[i]->nkids; k++) eval_snode_sizes(p, decls[i]->kids[k], d);
}

void lang_check_const_names(fb_program *p, fb_diags *d) {
  for (int i = 0; i < p->nconsts; i++) {
    const lconst *c = &p->consts[i];
    if (fb_program_find_field(p, c->name) >= 0 || lang_find_snode(p, c->name) >= 0)
      lang_err(d, c->line, c->col, "the name '%s' is already used by a field or SNode", c->name);
  }
}

int lang_const_literal(fb_program *p, node *e, node *out, fb_diags *d) {
  *out = *e;
  out->kids = NULL;
  out->nkids = 0;
  out->a = out->b = out->c = NULL;
  if (e->kind == E_BOOL) return 0; /* true / false */
  cnum v;
  int quiet = 0;
  if (ceval(p, e, &v, d, &quiet) < 0) return -1;
  lang_expr_pos(e, &out->line, &out->col);
  out->kind = v.is_float ? E_FLOAT : E_INT;
  out->fval = v.f;
  out->ival = (uint64_t)v.i;
  return 0;
}
