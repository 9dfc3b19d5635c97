/* The derivative rules shared by the reverse and the forward pass
 * (ir/ad_rules.h). Moved here from ir/adjoint.c's reverse sweep unchanged:
 * each contribution is emitted in the form, and from the operands, the
 * reverse pass always used, so its adjoints are the same statement for
 * statement. */
#include "ad_rules.h"

#include "ir_internal.h"

int fb__ad_diff_operand(const fb_stmt *s, int i) {
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

static int chk(fb_ad_em *e, int id) {
  if (e->rc) return -1;
  if (id < 0) e->rc = e->b->err ? e->b->err : FB_ENOMEM;
  else if (e->out->nstmts > e->cap) e->rc = FB_EQUOTA;
  return e->rc ? -1 : id;
}
static int cst(fb_ad_em *e, fb_type t, double c) {
  return chk(e, fb_b_const(e->b, t == FB_T_F32 ? fb_value_f32((float)c) : fb_value_f64(c)));
}
static int bin(fb_ad_em *e, fb_op op, int x, int y) { return chk(e, fb_b_binary(e->b, op, x, y)); }
static int un(fb_ad_em *e, fb_op op, int x) { return chk(e, fb_b_unary(e->b, op, x)); }
static int sel(fb_ad_em *e, int c, int x, int y) { return chk(e, fb_b_select(e->b, c, x, y)); }

void fb__ad_rule(fb_ad_em *e, const fb_stmt *s, int A, int B, int R, const int g[2], int c[2]) {
  fb_type t = (fb_type)s->type;
  int g0 = g[0], g1 = g[1];
  c[0] = c[1] = -1;
  if (e->rc) return;
  switch ((fb_op)s->op) {
  case FB_OP_ADD:
    c[0] = g0;
    c[1] = g1;
    break;
  case FB_OP_SUB:
    c[0] = g0;
    if (g1 >= 0) c[1] = un(e, FB_OP_NEG, g1);
    break;
  case FB_OP_MUL:
    if (g0 >= 0) c[0] = bin(e, FB_OP_MUL, g0, B);
    if (g1 >= 0) c[1] = bin(e, FB_OP_MUL, g1, A);
    break;
  case FB_OP_DIV: /* d(a/b) = da / b - db * (a/b) / b */
    if (g0 >= 0) c[0] = bin(e, FB_OP_DIV, g0, B);
    if (g1 >= 0) c[1] = un(e, FB_OP_NEG, bin(e, FB_OP_MUL, g1, bin(e, FB_OP_DIV, R, B)));
    break;
  case FB_OP_REM:
  case FB_OP_FLOORMOD: /* r = a - b * q with q = (a - r) / b constant a.e. */
    c[0] = g0;
    if (g1 >= 0)
      c[1] = un(e, FB_OP_NEG,
                bin(e, FB_OP_MUL, g1, bin(e, FB_OP_DIV, bin(e, FB_OP_SUB, A, R), B)));
    break;
  case FB_OP_MIN:
  case FB_OP_MAX: { /* to the operand the result is (a on ties) */
    if (g0 < 0 && g1 < 0) break;
    int pick = bin(e, FB_OP_EQ, R, A), z = cst(e, t, 0.0);
    if (g0 >= 0) c[0] = sel(e, pick, g0, z);
    if (g1 >= 0) c[1] = sel(e, pick, z, g1);
    break;
  }
  case FB_OP_POW: /* d(a^b) = b a^(b-1) da + a^b log(a) db */
    if (g0 >= 0)
      c[0] = bin(e, FB_OP_MUL, g0,
                 bin(e, FB_OP_MUL, B, bin(e, FB_OP_POW, A, bin(e, FB_OP_SUB, B, cst(e, t, 1.0)))));
    if (g1 >= 0) c[1] = bin(e, FB_OP_MUL, g1, bin(e, FB_OP_MUL, R, un(e, FB_OP_LOG, A)));
    break;
  case FB_OP_ATAN2: { /* atan2(y, x): dy x / (x²+y²) - dx y / (x²+y²) */
    if (g0 < 0 && g1 < 0) break;
    int d = bin(e, FB_OP_ADD, bin(e, FB_OP_MUL, A, A), bin(e, FB_OP_MUL, B, B));
    if (g0 >= 0) c[0] = bin(e, FB_OP_DIV, bin(e, FB_OP_MUL, g0, B), d);
    if (g1 >= 0) c[1] = un(e, FB_OP_NEG, bin(e, FB_OP_DIV, bin(e, FB_OP_MUL, g1, A), d));
    break;
  }
  case FB_OP_NEG:
    if (g0 >= 0) c[0] = un(e, FB_OP_NEG, g0);
    break;
  case FB_OP_ABS: { /* sign(a) g, 0 at 0 */
    if (g0 < 0) break;
    int z = cst(e, t, 0.0);
    int pos = sel(e, bin(e, FB_OP_GT, A, z), g0, z);
    c[0] = sel(e, bin(e, FB_OP_LT, A, z), un(e, FB_OP_NEG, g0), pos);
    break;
  }
  default:
    if (g0 < 0) break;
    switch ((fb_op)s->op) {
    case FB_OP_SQRT: c[0] = bin(e, FB_OP_DIV, bin(e, FB_OP_MUL, g0, cst(e, t, 0.5)), R); break;
    case FB_OP_RSQRT: /* d a^(-1/2) = -0.5 r / a */
      c[0] = bin(e, FB_OP_MUL, g0, bin(e, FB_OP_DIV, bin(e, FB_OP_MUL, cst(e, t, -0.5), R), A));
      break;
    case FB_OP_SIN: c[0] = bin(e, FB_OP_MUL, g0, un(e, FB_OP_COS, A)); break;
    case FB_OP_COS: c[0] = un(e, FB_OP_NEG, bin(e, FB_OP_MUL, g0, un(e, FB_OP_SIN, A))); break;
    case FB_OP_TAN:
      c[0] = bin(e, FB_OP_MUL, g0, bin(e, FB_OP_ADD, cst(e, t, 1.0), bin(e, FB_OP_MUL, R, R)));
      break;
    case FB_OP_ASIN:
    case FB_OP_ACOS: {
      int d = un(e, FB_OP_SQRT, bin(e, FB_OP_SUB, cst(e, t, 1.0), bin(e, FB_OP_MUL, A, A)));
      int q = bin(e, FB_OP_DIV, g0, d);
      c[0] = s->op == FB_OP_ASIN ? q : un(e, FB_OP_NEG, q);
      break;
    }
    case FB_OP_ATAN:
      c[0] = bin(e, FB_OP_DIV, g0, bin(e, FB_OP_ADD, cst(e, t, 1.0), bin(e, FB_OP_MUL, A, A)));
      break;
    case FB_OP_EXP: c[0] = bin(e, FB_OP_MUL, g0, R); break;
    case FB_OP_LOG: c[0] = bin(e, FB_OP_DIV, g0, A); break;
    default: break; /* piecewise constant, or no derivative */
    }
  }
  if (e->rc) c[0] = c[1] = -1;
}

/* ------------------------------------------------ gradient and dual places */

int fb__layout_add_sibling(fb_layout *l, int place, const char *suffix, const char *noun,
                           char *err, size_t errlen) {
  if (!l || place < 0 || place >= l->nnodes) {
    fb_errf(err, errlen, "no SNode %d in the layout", place);
    return FB_EINVAL;
  }
  const fb_snode *p = &l->nodes[place];
  const char *name = p->name ? p->name : "?";
  if (l->finalized) {
    fb_errf(err, errlen, "cannot add a %s to '%s': the layout is already finalized", noun, name);
    return FB_EINVAL;
  }
  if (p->kind != FB_SN_PLACE) {
    fb_errf(err, errlen, "'%s' is a %s SNode, not a field; only fields have %ss", name,
            fb_snode_kind_name(p->kind), noun);
    return FB_EINVAL;
  }
  if (!fb_type_is_float(p->type)) {
    fb_errf(err, errlen, "field '%s' is %s; only f32 and f64 fields have %ss", name,
            fb_type_name(p->type), noun);
    return FB_EINVAL;
  }
  size_t n = strlen(name), sl = strlen(suffix);
  char *sname = malloc(n + sl + 1);
  if (!sname) return FB_ENOMEM;
  memcpy(sname, name, n);
  memcpy(sname + n, suffix, sl + 1);
  if (fb_layout_find(l, sname) >= 0) {
    fb_errf(err, errlen, "field '%s' already has a %s (the name '%s' is taken)", name, noun,
            sname);
    free(sname);
    return FB_EINVAL;
  }
  int parent = p->parent;
  fb_type t = p->type; /* p may move when the node array grows */
  int id = fb_layout_place(l, parent, sname, t);
  free(sname);
  if (id < 0) fb_errf(err, errlen, "cannot add the %s of '%s': %s", noun, name, fb_strerror(id));
  return id;
}

int fb__sibling_map_from_layout(const fb_layout *l, const char *suffix, fb_grad_map *g) {
  if (!l || !g) return FB_EINVAL;
  int rc = fb_grad_map_init(g, l->nnodes);
  if (rc) return rc;
  size_t sl = strlen(suffix);
  for (int i = 0; i < l->nnodes; i++) {
    const fb_snode *ss = &l->nodes[i];
    if (ss->kind != FB_SN_PLACE || !ss->name) continue;
    size_t n = strlen(ss->name);
    if (n <= sl || strcmp(ss->name + n - sl, suffix) != 0) continue;
    const fb_snode *par = ss->parent >= 0 ? &l->nodes[ss->parent] : NULL;
    for (int c = 0; par && c < par->nchildren; c++) {
      const fb_snode *p = &l->nodes[par->children[c]];
      if (p->kind == FB_SN_PLACE && p->name && p->type == ss->type &&
          fb_type_is_float(p->type) && strlen(p->name) == n - sl &&
          memcmp(p->name, ss->name, n - sl) == 0)
        g->grad[p->id] = i;
    }
  }
  return 0;
}
