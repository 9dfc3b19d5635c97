/* Random kernels for the differential tester, built with the IR builder.
 *
 * A kernel is one to three top-level items: runs of serial statements and
 * parallel loops (par_for over a range, struct_for over any SNode), then
 * optionally a return. Serial code may do anything. A parallel loop first
 * draws a *plan*, which gives every field and SNode one mode for the whole
 * loop, chosen so that no two iterations race (the visiting order of
 * struct_for, and the interleaving of iterations, is unspecified):
 *
 *   field modes   READ        loads at any in-bounds index (clamped, wrapped,
 *                             neighbours, or guarded by a bounds test)
 *                 OWN         loads, stores, atomics at the iteration's own
 *                             element: a fixed injective map of the loop
 *                             indices (identity, shift, reversal, rotation)
 *                 ACC         one commutative atomic family (add/sub, min,
 *                             max, and, or, xor; floats min/max only) at any
 *                             index, old values unused
 *                 APPEND      appends to any list, all of one value that is
 *                             the same in every iteration, slots unused
 *                 APPEND_OWN  appends to the iteration's own list (any
 *                             values, slots and length usable)
 *   SNode modes   READ        is_active / length at any index
 *                 ACT         activated (explicitly, or by writes below)
 *                 APPENDING   a dynamic SNode being appended to
 *                 DEACT       deactivated at any index; nothing below it is
 *                             touched otherwise
 *                 DEACT_OWN   a pointer/bitmasked SNode holding only fields,
 *                             deactivated at the own element, its fields OWN
 *
 * Floats only get operations that are exactly rounded (add, sub, mul, div,
 * sqrt, rsqrt as 1/sqrt, min, max, rem, floor, ceil, round, casts), and
 * float atomics that accumulate from several iterations are limited to min
 * and max. Every index is in bounds by construction. */
#include <string.h>

#include "dt.h"

#define KG_MAXV 160
#define KG_MAXL 16
#define KG_DEPTH 3

enum {
  FM_NONE = 0,
  FM_READ,
  FM_OWN,
  FM_ACC,
  FM_APPEND,
  FM_APPEND_OWN
};
enum {
  SM_NONE = 0,
  SM_READ,
  SM_ACT,
  SM_APPENDING,
  SM_DEACT,
  SM_DEACT_OWN
};
enum {
  MAP_ID = 0,
  MAP_SHIFT,
  MAP_REV,
  MAP_CYC
};
enum {
  ACC_ADDSUB = 0,
  ACC_MIN,
  ACC_MAX,
  ACC_AND,
  ACC_OR,
  ACC_XOR,
  ACC__COUNT
};

typedef struct kval {
  int id;
  fb_type t;
  int varying; /* may differ between iterations of the parallel loop */
} kval;

typedef struct kmap {
  int kind[FB_MAX_AXES];
  int32_t c[FB_MAX_AXES];
  int64_t n[FB_MAX_AXES]; /* extent of the mapped dimension */
} kmap;

typedef struct kloop {
  int stmt;
  int nd;
  int64_t ext[FB_MAX_AXES]; /* 0 <= index < ext[d] in every iteration */
  int idx[FB_MAX_AXES];     /* loop_index values */
} kloop;

typedef struct kg {
  dt_rng *r;
  const fb_layout *l;
  fb_kernel *k;
  fb_builder b;
  kval v[KG_MAXV];
  int nv;
  kval lv[KG_MAXL]; /* locals: id is the alloca */
  int nlv;
  int lv_floor;     /* locals below this index are read-only (outer ones, in a loop) */
  int in_loop;
  int jump_ok;      /* inside a range_for (not a while): break/continue allowed */
  kloop loop;
  uint8_t fmode[DT_MAXN], smode[DT_MAXN], acc[DT_MAXN];
  int appval[DT_MAXN]; /* FM_APPEND: the loop's append value */
  kmap map[DT_MAXN];
  int budget, depth, site;
  int loop_stmts;   /* big kernels: statements per parallel loop, at least (0: 2..6) */
} kg;

static const fb_snode *node(const kg *g, int id) { return &g->l->nodes[id]; }
static int is_sparse(fb_snode_kind k) {
  return k == FB_SN_POINTER || k == FB_SN_BITMASKED || k == FB_SN_DYNAMIC;
}
static int is_float(fb_type t) { return t == FB_T_F32 || t == FB_T_F64; }

/* ---------------------------------------------------------------- values */

static void push(kg *g, int id, fb_type t, int varying) {
  if (id < 0 || g->nv >= KG_MAXV) return;
  g->v[g->nv++] = (kval){id, t, varying};
}

static int cst(kg *g, fb_type t, int64_t x) {
  fb_builder *b = &g->b;
  switch (t) {
  case FB_T_I32: return fb_b_const_i32(b, (int32_t)x);
  case FB_T_I64: return fb_b_const_i64(b, x);
  case FB_T_U32: return fb_b_const_u32(b, (uint32_t)x);
  case FB_T_U64: return fb_b_const_u64(b, (uint64_t)x);
  case FB_T_F32: return fb_b_const_f32(b, (float)x);
  case FB_T_F64: return fb_b_const_f64(b, (double)x);
  default: return fb_b_const_bool(b, x != 0);
  }
}

static int rand_const(kg *g, fb_type t) {
  dt_rng *r = g->r;
  if (is_float(t)) {
    uint32_t x = dt_below(r, 20);
    double v = x < 14   ? (double)dt_range(r, -40, 40) / 2.0
               : x < 16 ? 0.1 * (double)dt_range(r, -9, 9)
               : x < 17 ? -0.0
               : x < 18 ? 1e30
               : x < 19 ? 3.0e9
                        : -7.25e10;
    return t == FB_T_F32 ? fb_b_const_f32(&g->b, (float)v) : fb_b_const_f64(&g->b, v);
  }
  uint32_t x = dt_below(r, 20);
  int64_t v = x < 15   ? dt_range(r, -4, 20)
              : x < 16 ? INT32_MIN
              : x < 17 ? INT32_MAX
              : x < 18 ? -1
              : x < 19 ? (int64_t)1 << 40
                       : INT64_MIN;
  return cst(g, t, v);
}

static fb_type pick_num_type(dt_rng *r) {
  static const fb_type ts[] = {FB_T_I32, FB_T_I32, FB_T_I32, FB_T_I64,
                               FB_T_U32, FB_T_F32, FB_T_F64};
  return ts[dt_below(r, 7)];
}

/* An existing value (index into g->v) of type t (any type when t is VOID),
 * uniform only when asked; -1 when there is none. */
static int pick_val(kg *g, fb_type t, int uniform) {
  int cand[KG_MAXV], n = 0;
  for (int i = 0; i < g->nv; i++)
    if ((t == FB_T_VOID || g->v[i].t == t) && (!uniform || !g->v[i].varying)) cand[n++] = i;
  if (!n) return -1;
  if (n > 4 && dt_chance(g->r, 60)) return cand[n - 1 - (int)dt_below(g->r, 4)]; /* recent ones */
  return cand[dt_below(g->r, (uint32_t)n)];
}

static int convert(kg *g, int id, fb_type from, fb_type to) {
  if (from == to) return id;
  if (from == FB_T_BOOL) return fb_b_select(&g->b, id, cst(g, to, 1), cst(g, to, 0));
  return fb_b_cast(&g->b, to, id);
}

static fb_op pick_binop(kg *g, fb_type t) {
  static const fb_op iops[] = {FB_OP_ADD,      FB_OP_SUB,      FB_OP_MUL, FB_OP_DIV, FB_OP_REM,
                               FB_OP_FLOORDIV, FB_OP_FLOORMOD, FB_OP_MIN, FB_OP_MAX, FB_OP_AND,
                               FB_OP_OR,       FB_OP_XOR,      FB_OP_SHL, FB_OP_SHR, FB_OP_ADD,
                               FB_OP_SUB,      FB_OP_MUL};
  static const fb_op fops[] = {FB_OP_ADD,      FB_OP_SUB, FB_OP_MUL, FB_OP_DIV,
                               FB_OP_MIN,      FB_OP_MAX, FB_OP_REM, FB_OP_FLOORDIV,
                               FB_OP_FLOORMOD, FB_OP_ADD, FB_OP_MUL};
  if (is_float(t)) return fops[dt_below(g->r, sizeof fops / sizeof fops[0])];
  return iops[dt_below(g->r, sizeof iops / sizeof iops[0])];
}

static fb_op pick_unop(kg *g, fb_type t) {
  static const fb_op iops[] = {FB_OP_NEG, FB_OP_ABS, FB_OP_NOT};
  static const fb_op fops[] = {FB_OP_NEG,   FB_OP_ABS,  FB_OP_FLOOR, FB_OP_CEIL,
                               FB_OP_ROUND, FB_OP_SQRT, FB_OP_RSQRT};
  if (is_float(t)) return fops[dt_below(g->r, sizeof fops / sizeof fops[0])];
  return iops[dt_below(g->r, 3)];
}

static int expr(kg *g, fb_type t, int uniform, int depth, int *vary);

static int cond(kg *g, int uniform, int *vary) {
  int i = pick_val(g, FB_T_BOOL, uniform);
  if (i >= 0 && dt_chance(g->r, 40)) {
    *vary = g->v[i].varying;
    return g->v[i].id;
  }
  static const fb_op cmps[] = {FB_OP_EQ, FB_OP_NE, FB_OP_LT, FB_OP_LE, FB_OP_GT, FB_OP_GE};
  fb_type t = pick_num_type(g->r);
  int va = 0, vb = 0;
  int a = expr(g, t, uniform, 1, &va), c = expr(g, t, uniform, 1, &vb);
  int id = fb_b_binary(&g->b, cmps[dt_below(g->r, 6)], a, c);
  *vary = va | vb;
  push(g, id, FB_T_BOOL, *vary);
  return id;
}

/* rand() scaled and cast: deterministic per (launch, site, iteration, count). */
static int rand_val(kg *g, fb_type t) {
  int x = fb_b_rand(&g->b, g->site++);
  int m = fb_b_binary(&g->b, FB_OP_MUL, x, fb_b_const_f32(&g->b, (float)dt_range(g->r, 2, 100)));
  return convert(g, m, FB_T_F32, t);
}

/* A value of type t: an existing one, a constant, or new operations. */
static int expr(kg *g, fb_type t, int uniform, int depth, int *vary) {
  dt_rng *r = g->r;
  uint32_t x = dt_below(r, 100);
  *vary = 0;
  if (depth <= 0 || x < 40) {
    int i = pick_val(g, dt_chance(r, 60) ? t : FB_T_VOID, uniform);
    if (i >= 0 && (depth > 0 || dt_chance(r, 75))) {
      *vary = g->v[i].varying;
      return convert(g, g->v[i].id, g->v[i].t, t);
    }
    return rand_const(g, t);
  }
  if (x < 48) return rand_const(g, t);
  int id, va = 0, vb = 0, vc = 0;
  if (x < 75) {
    int a = expr(g, t, uniform, depth - 1, &va), c = expr(g, t, uniform, depth - 1, &vb);
    id = fb_b_binary(&g->b, pick_binop(g, t), a, c);
  } else if (x < 83) {
    id = fb_b_unary(&g->b, pick_unop(g, t), expr(g, t, uniform, depth - 1, &va));
  } else if (x < 91) {
    int c = cond(g, uniform, &vc);
    int a = expr(g, t, uniform, depth - 1, &va), e = expr(g, t, uniform, depth - 1, &vb);
    id = fb_b_select(&g->b, c, a, e);
  } else if (x < 95 && !(uniform && g->in_loop)) {
    id = rand_val(g, t);
    va = g->in_loop;
  } else {
    fb_type from = pick_num_type(r);
    id = convert(g, expr(g, from, uniform, depth - 1, &va), from, t);
  }
  *vary = va | vb | vc;
  push(g, id, t, *vary);
  return id;
}

static int val_i32(kg *g, int uniform) {
  int vary;
  fb_type t = pick_num_type(g->r);
  return convert(g, expr(g, t, uniform, 1, &vary), t, FB_T_I32);
}

/* ---------------------------------------------------------------- indices */

/* Extents of node's index dimensions, leaving out axis `skip` (-1: none). */
static int node_ext(const fb_layout *l, int id, int skip, int64_t *ext) {
  const fb_snode *s = &l->nodes[id];
  int n = 0;
  for (int d = 0; d < s->ndim; d++)
    if (s->dim_axis[d] != skip) ext[n++] = s->shape[s->dim_axis[d]];
  return n;
}

static int dyn_parent(const fb_layout *l, int place) {
  int p = l->nodes[place].parent;
  return p > 0 && l->nodes[p].kind == FB_SN_DYNAMIC ? p : -1;
}

static int dyn_axis(const fb_layout *l, int d) {
  for (int a = 0; a < FB_MAX_AXES; a++)
    if (l->nodes[d].axes & (1u << a)) return a;
  return -1;
}

/* List dimensions of a place under a dynamic SNode. */
static int list_ext(const fb_layout *l, int place, int64_t *ext) {
  return node_ext(l, place, dyn_axis(l, dyn_parent(l, place)), ext);
}

static int clamp_idx(kg *g, int v, int64_t n) {
  int lo = fb_b_binary(&g->b, FB_OP_MAX, v, fb_b_const_i32(&g->b, 0));
  return fb_b_binary(&g->b, FB_OP_MIN, lo, fb_b_const_i32(&g->b, (int32_t)(n - 1)));
}

/* An in-bounds index in [0, n) for dimension d of an access. */
static int any_idx(kg *g, int d, int64_t n) {
  uint32_t x = dt_below(g->r, 100);
  if (g->in_loop && d < g->loop.nd && x < 45) {
    int v = g->loop.idx[d];
    int off = (int)dt_range(g->r, -2, 2);
    if (off) v = fb_b_binary(&g->b, FB_OP_ADD, v, fb_b_const_i32(&g->b, off));
    return g->loop.ext[d] <= n && off == 0 ? v : clamp_idx(g, v, n);
  }
  if (x < 62) return fb_b_const_i32(&g->b, (int32_t)dt_below(g->r, (uint32_t)n));
  if (x < 82) return clamp_idx(g, val_i32(g, 0), n);
  return fb_b_binary(&g->b, FB_OP_FLOORMOD, val_i32(g, 0), fb_b_const_i32(&g->b, (int32_t)n));
}

static void any_idxs(kg *g, const int64_t *ext, int n, int *out) {
  for (int d = 0; d < n; d++) out[d] = any_idx(g, d, ext[d]);
}

/* Draw an injective map from the loop's indices into extents ext (n dims,
 * n == loop.nd, loop.ext[d] <= ext[d]). */
static void draw_map(kg *g, kmap *m, const int64_t *ext, int n) {
  for (int d = 0; d < n; d++) {
    m->n[d] = ext[d];
    m->c[d] = 0;
    m->kind[d] = (int)dt_below(g->r, 4);
    if (m->kind[d] == MAP_SHIFT) m->c[d] = (int32_t)dt_range(g->r, 0, ext[d] - g->loop.ext[d]);
    if (m->kind[d] == MAP_CYC) m->c[d] = (int32_t)dt_below(g->r, (uint32_t)ext[d]);
  }
}

static int fits_loop(const kg *g, const int64_t *ext, int n) {
  if (n != g->loop.nd) return 0;
  for (int d = 0; d < n; d++)
    if (g->loop.ext[d] > ext[d]) return 0;
  return 1;
}

/* The own element: map of the loop indices. */
static void own_idxs(kg *g, const kmap *m, int n, int *out) {
  fb_builder *b = &g->b;
  for (int d = 0; d < n; d++) {
    int li = g->loop.idx[d];
    switch (m->kind[d]) {
    case MAP_SHIFT:
      out[d] = m->c[d] ? fb_b_binary(b, FB_OP_ADD, li, fb_b_const_i32(b, m->c[d])) : li;
      break;
    case MAP_REV:
      out[d] = fb_b_binary(b, FB_OP_SUB, fb_b_const_i32(b, (int32_t)(m->n[d] - 1)), li);
      break;
    case MAP_CYC:
      out[d] =
          fb_b_binary(b, FB_OP_FLOORMOD, fb_b_binary(b, FB_OP_ADD, li, fb_b_const_i32(b, m->c[d])),
                      fb_b_const_i32(b, (int32_t)m->n[d]));
      break;
    default: out[d] = li; break;
    }
  }
}

/* ---------------------------------------------------------------- the plan */

static int acc_allowed(fb_type t, int fam) {
  return !is_float(t) || fam == ACC_MIN || fam == ACC_MAX;
}

static void mark_ancestors_act(kg *g, int x) {
  for (int p = node(g, x)->parent; p > 0; p = node(g, p)->parent)
    if (is_sparse(node(g, p)->kind) && g->smode[p] == SM_NONE) g->smode[p] = SM_ACT;
}

/* A pointer/bitmasked SNode holding only fields, its elements 1:1 with the
 * loop's: deactivated at the own element, its fields OWN or untouched. */
static void plan_deact_own(kg *g) {
  int cand[DT_MAXN], n = 0;
  for (int i = 1; i < g->l->nnodes; i++) {
    const fb_snode *s = node(g, i);
    if (s->kind != FB_SN_POINTER && s->kind != FB_SN_BITMASKED) continue;
    int only_places = 1;
    for (int c = 0; c < s->nchildren; c++)
      if (node(g, s->children[c])->kind != FB_SN_PLACE) only_places = 0;
    int64_t ext[FB_MAX_AXES];
    if (only_places && fits_loop(g, ext, node_ext(g->l, i, -1, ext))) cand[n++] = i;
  }
  if (!n) return;
  int d = cand[dt_below(g->r, (uint32_t)n)];
  int64_t ext[FB_MAX_AXES];
  int nd = node_ext(g->l, d, -1, ext);
  g->smode[d] = SM_DEACT_OWN;
  draw_map(g, &g->map[d], ext, nd);
  const fb_snode *s = node(g, d);
  for (int c = 0; c < s->nchildren; c++) {
    int f = s->children[c];
    g->fmode[f] = dt_chance(g->r, 70) ? FM_OWN : FM_NONE;
    g->map[f] = g->map[d];
  }
}

static void plan_field(kg *g, int f) {
  const fb_snode *s = node(g, f);
  int64_t ext[FB_MAX_AXES];
  uint32_t x = dt_below(g->r, 100);
  int own_ok = fits_loop(g, ext, node_ext(g->l, f, -1, ext));
  int dyn = dyn_parent(g->l, f);
  g->fmode[f] = FM_NONE;
  if (x < 28) return;
  g->fmode[f] = FM_READ;
  if (x < 55) return;
  if (x < 75 && own_ok) {
    g->fmode[f] = FM_OWN;
    draw_map(g, &g->map[f], ext, s->ndim);
  } else if (x < 88) {
    int fam = (int)dt_below(g->r, ACC__COUNT);
    if (!acc_allowed(s->type, fam)) fam = dt_chance(g->r, 50) ? ACC_MIN : ACC_MAX;
    g->fmode[f] = FM_ACC;
    g->acc[f] = (uint8_t)fam;
  } else if (dyn > 0) {
    int64_t lext[FB_MAX_AXES];
    int ln = list_ext(g->l, f, lext);
    if (ln > 0 && fits_loop(g, lext, ln) && dt_chance(g->r, 60)) {
      g->fmode[f] = FM_APPEND_OWN;
      draw_map(g, &g->map[f], lext, ln);
    } else {
      g->fmode[f] = FM_APPEND;
    }
  }
}

/* At most one appended field per dynamic SNode; the others under it only read. */
static void plan_dynamic(kg *g) {
  for (int d = 1; d < g->l->nnodes; d++) {
    const fb_snode *s = node(g, d);
    if (s->kind != FB_SN_DYNAMIC) continue;
    int app = -1;
    for (int c = 0; c < s->nchildren; c++) {
      int f = s->children[c];
      if (g->fmode[f] == FM_APPEND || g->fmode[f] == FM_APPEND_OWN) {
        if (app < 0) app = f;
        else g->fmode[f] = FM_READ;
      }
    }
    if (app < 0) continue;
    for (int c = 0; c < s->nchildren; c++) {
      int f = s->children[c];
      if (f != app && g->fmode[f] != FM_NONE) g->fmode[f] = FM_READ;
    }
    g->smode[d] = SM_APPENDING;
  }
}

/* Every node of x's subtree (x included) satisfies: no field mode, SNode
 * mode NONE or DEACT. */
static int subtree_quiet(const kg *g, int x) {
  const fb_snode *s = node(g, x);
  if (s->kind == FB_SN_PLACE && g->fmode[x] != FM_NONE) return 0;
  if (g->smode[x] != SM_NONE && g->smode[x] != SM_DEACT) return 0;
  for (int c = 0; c < s->nchildren; c++)
    if (!subtree_quiet(g, s->children[c])) return 0;
  return 1;
}

/* is_active(x) / length may be read when nothing on x's path changes. */
static int path_still(const kg *g, int x) {
  for (int p = x; p > 0; p = node(g, p)->parent) {
    int m = g->smode[p];
    if (m == SM_ACT || m == SM_APPENDING || m == SM_DEACT || m == SM_DEACT_OWN) return 0;
  }
  return 1;
}

static int act_ok(const kg *g, int x) {
  for (int p = x; p > 0; p = node(g, p)->parent)
    if (is_sparse(node(g, p)->kind) && g->smode[p] != SM_ACT) return 0;
  return 1;
}

/* Is x in the subtree of a node already planned for deactivation? */
static int under_deact(const kg *g, int x) {
  for (int p = x; p > 0; p = node(g, p)->parent)
    if (g->smode[p] == SM_DEACT || g->smode[p] == SM_DEACT_OWN) return 1;
  return 0;
}

static int has_deact_below(const kg *g, int x) {
  if (g->smode[x] == SM_DEACT || g->smode[x] == SM_DEACT_OWN) return 1;
  for (int c = 0; c < node(g, x)->nchildren; c++)
    if (has_deact_below(g, node(g, x)->children[c])) return 1;
  return 0;
}

static void make_plan(kg *g) {
  const fb_layout *l = g->l;
  memset(g->fmode, 0, sizeof g->fmode);
  memset(g->smode, 0, sizeof g->smode);
  if (dt_chance(g->r, 20)) plan_deact_own(g);
  if (dt_chance(g->r, 30)) { /* a subtree given over to deactivation */
    int cand[DT_MAXN], n = 0;
    for (int i = 1; i < l->nnodes; i++)
      if (is_sparse(node(g, i)->kind) && !under_deact(g, i) && !has_deact_below(g, i))
        cand[n++] = i;
    if (n) g->smode[cand[dt_below(g->r, (uint32_t)n)]] = SM_DEACT;
  }
  for (int i = 1; i < l->nnodes; i++)
    if (node(g, i)->kind == FB_SN_PLACE && !under_deact(g, i)) plan_field(g, i);
  plan_dynamic(g);
  for (int i = 1; i < l->nnodes; i++)
    if (node(g, i)->kind == FB_SN_PLACE && g->fmode[i] >= FM_OWN) mark_ancestors_act(g, i);
  for (int i = 1; i < l->nnodes; i++) /* explicit activation */
    if (is_sparse(node(g, i)->kind) && g->smode[i] == SM_NONE && dt_chance(g->r, 10)) {
      int ok = !has_deact_below(g, i);
      for (int p = i; p > 0; p = node(g, p)->parent)
        if (g->smode[p] != SM_NONE && g->smode[p] != SM_ACT) ok = 0;
      if (!ok) continue;
      g->smode[i] = SM_ACT;
      mark_ancestors_act(g, i);
    }
  for (int i = 1; i < l->nnodes; i++) /* deactivation */
    if (is_sparse(node(g, i)->kind) && g->smode[i] == SM_NONE && dt_chance(g->r, 15) &&
        subtree_quiet(g, i))
      g->smode[i] = SM_DEACT;
  for (int i = 1; i < l->nnodes; i++) /* activity reads */
    if (g->smode[i] == SM_NONE && dt_chance(g->r, 25) && path_still(g, i)) g->smode[i] = SM_READ;
}

/* ---------------------------------------------------------------- statements */

static void gen_block(kg *g, int n);

typedef int (*place_pred)(kg *g, int f);

static int pick_node(kg *g, place_pred ok) {
  int cand[DT_MAXN], n = 0;
  for (int i = 1; i < g->l->nnodes; i++)
    if (ok(g, i)) cand[n++] = i;
  return n ? cand[dt_below(g->r, (uint32_t)n)] : -1;
}

static int is_place(kg *g, int f) { return node(g, f)->kind == FB_SN_PLACE; }
static int can_load(kg *g, int f) {
  return is_place(g, f) && (!g->in_loop || g->fmode[f] == FM_READ || g->fmode[f] == FM_OWN);
}
static int can_store(kg *g, int f) {
  return is_place(g, f) && (!g->in_loop || g->fmode[f] == FM_OWN);
}
static int can_atomic(kg *g, int f) {
  return is_place(g, f) && (!g->in_loop || g->fmode[f] == FM_OWN || g->fmode[f] == FM_ACC);
}
static int can_append(kg *g, int f) {
  return is_place(g, f) && dyn_parent(g->l, f) > 0 &&
         (!g->in_loop || g->fmode[f] == FM_APPEND || g->fmode[f] == FM_APPEND_OWN);
}
static int can_length(kg *g, int f) {
  return is_place(g, f) && dyn_parent(g->l, f) > 0 &&
         (!g->in_loop || g->smode[dyn_parent(g->l, f)] == SM_READ || g->fmode[f] == FM_APPEND_OWN);
}
static int can_is_active(kg *g, int x) { return !g->in_loop || g->smode[x] == SM_READ; }
static int can_activate(kg *g, int x) { return !g->in_loop || act_ok(g, x); }
static int can_deactivate(kg *g, int x) {
  if (!is_sparse(node(g, x)->kind)) return 0;
  return !g->in_loop || g->smode[x] == SM_DEACT || g->smode[x] == SM_DEACT_OWN;
}

/* Indices of an access of place f in the current context. */
static int place_idxs(kg *g, int f, int *out) {
  int64_t ext[FB_MAX_AXES];
  int n = node_ext(g->l, f, -1, ext);
  if (g->in_loop && g->fmode[f] == FM_OWN) own_idxs(g, &g->map[f], n, out);
  else any_idxs(g, ext, n, out);
  if (g->in_loop && g->fmode[f] == FM_OWN && n == 1 && dt_chance(g->r, 20))
    out[0] = fb_b_hint_unique(&g->b, out[0], f);
  return n;
}

static fb_op pick_atomic(kg *g, int f) {
  static const fb_op fam_ops[ACC__COUNT][2] = {
      {FB_OP_ATOMIC_ADD, FB_OP_ATOMIC_SUB}, {FB_OP_ATOMIC_MIN, FB_OP_ATOMIC_MIN},
      {FB_OP_ATOMIC_MAX, FB_OP_ATOMIC_MAX}, {FB_OP_ATOMIC_AND, FB_OP_ATOMIC_AND},
      {FB_OP_ATOMIC_OR, FB_OP_ATOMIC_OR},   {FB_OP_ATOMIC_XOR, FB_OP_ATOMIC_XOR}};
  if (g->in_loop && g->fmode[f] == FM_ACC) return fam_ops[g->acc[f]][dt_below(g->r, 2)];
  int fam = (int)dt_below(g->r, is_float(node(g, f)->type) ? 3 : ACC__COUNT);
  return fam_ops[fam][dt_below(g->r, 2)];
}

static void s_load(kg *g) {
  int f = pick_node(g, can_load);
  if (f < 0) return;
  fb_type t = node(g, f)->type;
  int idx[FB_MAX_AXES];
  if (g->in_loop && g->fmode[f] == FM_READ && node(g, f)->ndim > 0 && dt_chance(g->r, 25)) {
    /* a neighbour behind a bounds test: tmp = 0; if (0 <= j < n) tmp = f[.., j, ..] */
    int64_t ext[FB_MAX_AXES] = {0};
    int n = node_ext(g->l, f, -1, ext);
    any_idxs(g, ext, n, idx);
    int d = (int)dt_below(g->r, (uint32_t)n);
    int base = d < g->loop.nd ? g->loop.idx[d] : val_i32(g, 0);
    int j =
        fb_b_binary(&g->b, FB_OP_ADD, base, fb_b_const_i32(&g->b, (int32_t)dt_range(g->r, -2, 2)));
    int in =
        fb_b_binary(&g->b, FB_OP_AND, fb_b_binary(&g->b, FB_OP_GE, j, fb_b_const_i32(&g->b, 0)),
                    fb_b_binary(&g->b, FB_OP_LT, j, fb_b_const_i32(&g->b, (int32_t)ext[d])));
    idx[d] = j;
    int tmp = fb_b_alloca(&g->b, t);
    fb_b_lstore(&g->b, tmp, rand_const(g, t));
    int iff = fb_b_if(&g->b, in, 0);
    int saved = fb_b_enter(&g->b, g->k->stmts[iff].body);
    fb_b_lstore(&g->b, tmp, fb_b_load(&g->b, f, idx, n));
    fb_b_leave(&g->b, saved);
    push(g, fb_b_lload(&g->b, tmp), t, g->in_loop);
    return;
  }
  int n = place_idxs(g, f, idx);
  push(g, fb_b_load(&g->b, f, idx, n), t, g->in_loop);
}

static void s_store(kg *g) {
  int f = pick_node(g, can_store);
  if (f < 0) return;
  int idx[FB_MAX_AXES], vary;
  int n = place_idxs(g, f, idx);
  fb_b_store(&g->b, f, idx, n, expr(g, node(g, f)->type, 0, 2, &vary));
}

static void s_atomic(kg *g) {
  int f = pick_node(g, can_atomic);
  if (f < 0) return;
  fb_type t = node(g, f)->type;
  int idx[FB_MAX_AXES], vary;
  int n = place_idxs(g, f, idx);
  fb_op op = pick_atomic(g, f);
  if (is_float(t) && fb_op_table[op].cls == FB_OPC_IATOMIC) op = FB_OP_ATOMIC_MAX;
  int id = fb_b_global(&g->b, op, f, idx, n, expr(g, t, 0, 1, &vary));
  if (!g->in_loop || g->fmode[f] == FM_OWN) push(g, id, t, g->in_loop);
}

static int list_idxs(kg *g, int f, int own, int *out) {
  int64_t ext[FB_MAX_AXES];
  int n = list_ext(g->l, f, ext);
  if (own) own_idxs(g, &g->map[f], n, out);
  else any_idxs(g, ext, n, out);
  return n;
}

static void s_append(kg *g) {
  int f = pick_node(g, can_append);
  if (f < 0) return;
  fb_type t = node(g, f)->type;
  int own = g->in_loop && g->fmode[f] == FM_APPEND_OWN;
  int idx[FB_MAX_AXES], vary;
  int n = list_idxs(g, f, own, idx);
  int val = g->in_loop && !own ? g->appval[f] : expr(g, t, 0, 1, &vary);
  int guard = (!g->in_loop || own) && dt_chance(g->r, 70);
  int saved = -1, mark = g->nv;
  if (guard) { /* if length < size: append */
    int len = fb_b_global(&g->b, FB_OP_LENGTH, f, idx, n, -1);
    int size = (int)node(g, dyn_parent(g->l, f))->size[dyn_axis(g->l, dyn_parent(g->l, f))];
    int iff = fb_b_if(&g->b, fb_b_binary(&g->b, FB_OP_LT, len, fb_b_const_i32(&g->b, size)), 0);
    saved = fb_b_enter(&g->b, g->k->stmts[iff].body);
  }
  int id = fb_b_global(&g->b, FB_OP_APPEND, f, idx, n, val);
  if (guard) {
    if (dt_chance(g->r, 50)) { /* the slot it took, into a field we may write */
      int idx2[FB_MAX_AXES];
      int w = pick_node(g, can_store);
      if (w >= 0) {
        int n2 = place_idxs(g, w, idx2);
        fb_b_store(&g->b, w, idx2, n2, convert(g, id, FB_T_I32, node(g, w)->type));
      }
    }
    fb_b_leave(&g->b, saved);
    g->nv = mark; /* values made inside the if stay there */
  } else if (!g->in_loop || own) {
    push(g, id, FB_T_I32, g->in_loop);
  }
}

static void s_length(kg *g) {
  int f = pick_node(g, can_length);
  if (f < 0) return;
  int idx[FB_MAX_AXES];
  int own = g->in_loop && g->fmode[f] == FM_APPEND_OWN;
  int n = list_idxs(g, f, own, idx);
  push(g, fb_b_global(&g->b, FB_OP_LENGTH, f, idx, n, -1), FB_T_I32, g->in_loop);
}

/* x: 0 is_active, 1 activate, 2 deactivate */
static void s_activity(kg *g, uint32_t x) {
  place_pred ok = x == 0 ? can_is_active : x == 1 ? can_activate : can_deactivate;
  int s = pick_node(g, ok);
  if (s < 0) return;
  int64_t ext[FB_MAX_AXES];
  int idx[FB_MAX_AXES];
  int n = node_ext(g->l, s, -1, ext);
  if (x == 2 && g->in_loop && g->smode[s] == SM_DEACT_OWN) own_idxs(g, &g->map[s], n, idx);
  else any_idxs(g, ext, n, idx);
  fb_op op = x == 0 ? FB_OP_IS_ACTIVE : x == 1 ? FB_OP_ACTIVATE : FB_OP_DEACTIVATE;
  int id = fb_b_global(&g->b, op, s, idx, n, -1);
  if (x == 0) push(g, id, FB_T_BOOL, g->in_loop);
}

static void s_local(kg *g) {
  int vary;
  if (g->nlv > g->lv_floor && dt_chance(g->r, 50)) { /* assign a writable local */
    kval *v = &g->lv[g->lv_floor + (int)dt_below(g->r, (uint32_t)(g->nlv - g->lv_floor))];
    fb_b_lstore(&g->b, v->id, expr(g, v->t, 0, 2, &vary));
    return;
  }
  if (g->nlv > 0 && dt_chance(g->r, 40)) {
    kval *v = &g->lv[dt_below(g->r, (uint32_t)g->nlv)];
    push(g, fb_b_lload(&g->b, v->id), v->t, g->in_loop);
    return;
  }
  if (g->nlv >= KG_MAXL) return;
  fb_type t = pick_num_type(g->r);
  int a = fb_b_alloca(&g->b, t);
  fb_b_lstore(&g->b, a, expr(g, t, 0, 1, &vary));
  g->lv[g->nlv++] = (kval){a, t, g->in_loop};
}

static void s_if(kg *g) {
  int vary;
  int c = cond(g, 0, &vary);
  int iff = fb_b_if(&g->b, c, dt_chance(g->r, 40));
  int saved = fb_b_enter(&g->b, g->k->stmts[iff].body);
  gen_block(g, 1 + (int)dt_below(g->r, 3));
  if (g->k->stmts[iff].orelse >= 0) {
    fb_b_enter(&g->b, g->k->stmts[iff].orelse);
    gen_block(g, 1 + (int)dt_below(g->r, 2));
  }
  fb_b_leave(&g->b, saved);
}

/* A serial range_for with a small constant trip count (a stencil's taps). */
static void s_for(kg *g) {
  int lo = (int)dt_range(g->r, -1, 1);
  int loop = fb_b_range_for(&g->b, fb_b_const_i32(&g->b, lo),
                            fb_b_const_i32(&g->b, lo + (int)dt_range(g->r, 0, 4)), 0);
  int saved = fb_b_enter(&g->b, g->k->stmts[loop].body);
  int mark = g->nv, jump = g->jump_ok;
  push(g, fb_b_loop_index(&g->b, loop, 0), FB_T_I32, 1);
  g->jump_ok = 1;
  gen_block(g, 1 + (int)dt_below(g->r, 3));
  g->nv = mark;
  g->jump_ok = jump;
  fb_b_leave(&g->b, saved);
}

/* while with a counter: cnt = 0; while { if cnt >= K: break; ...; cnt += 1 } */
static void s_while(kg *g) {
  fb_builder *b = &g->b;
  int cnt = fb_b_alloca(b, FB_T_I32);
  fb_b_lstore(b, cnt, fb_b_const_i32(b, 0));
  int w = fb_b_while(b);
  int saved = fb_b_enter(b, g->k->stmts[w].body);
  int c = fb_b_lload(b, cnt);
  int iff =
      fb_b_if(b, fb_b_binary(b, FB_OP_GE, c, fb_b_const_i32(b, (int32_t)dt_range(g->r, 0, 3))), 0);
  int s2 = fb_b_enter(b, g->k->stmts[iff].body);
  fb_b_break(b);
  fb_b_leave(b, s2);
  int mark = g->nv, jump = g->jump_ok;
  push(g, c, FB_T_I32, 1);
  g->jump_ok = 0;
  gen_block(g, 1 + (int)dt_below(g->r, 2));
  g->nv = mark;
  g->jump_ok = jump;
  fb_b_lstore(b, cnt, fb_b_binary(b, FB_OP_ADD, c, fb_b_const_i32(b, 1)));
  fb_b_leave(b, saved);
}

static void s_jump(kg *g) {
  int vary;
  int iff = fb_b_if(&g->b, cond(g, 0, &vary), 0);
  int saved = fb_b_enter(&g->b, g->k->stmts[iff].body);
  if (dt_chance(g->r, 50)) fb_b_break(&g->b);
  else fb_b_continue(&g->b);
  fb_b_leave(&g->b, saved);
}

/* The most recent values (up to three) combined into one of type t. */
static int mix_recent(kg *g, fb_type t) {
  int acc = -1, vary;
  for (int i = g->nv - 1, n = 0; i >= 0 && n < 3; i--) {
    if (g->v[i].t == FB_T_BOOL && dt_chance(g->r, 50)) continue;
    int x = convert(g, g->v[i].id, g->v[i].t, t);
    fb_op op = is_float(t) || dt_chance(g->r, 50) ? FB_OP_ADD : FB_OP_XOR;
    acc = acc < 0 ? x : fb_b_binary(&g->b, op, acc, x);
    n++;
  }
  return acc >= 0 ? acc : expr(g, t, 0, 1, &vary);
}

/* Make the values computed so far observable: store or accumulate them. */
static void sink(kg *g) {
  int f = pick_node(g, dt_chance(g->r, 60) ? can_store : can_atomic);
  if (f < 0) f = pick_node(g, can_atomic);
  if (f < 0) return;
  fb_type t = node(g, f)->type;
  int idx[FB_MAX_AXES];
  int n = place_idxs(g, f, idx);
  int v = mix_recent(g, t);
  if (can_store(g, f) && dt_chance(g->r, 60)) fb_b_store(&g->b, f, idx, n, v);
  else fb_b_global(&g->b, pick_atomic(g, f), f, idx, n, v);
}

static void gen_stmt(kg *g) {
  g->budget--;
  uint32_t x = dt_below(g->r, 100);
  int nest = g->depth < KG_DEPTH;
  if (x < 18) s_load(g);
  else if (x < 32) s_store(g);
  else if (x < 42) s_atomic(g);
  else if (x < 50) s_append(g);
  else if (x < 54) s_length(g);
  else if (x < 58) s_activity(g, 0);
  else if (x < 62) s_activity(g, 1);
  else if (x < 68) s_activity(g, 2);
  else if (x < 73) s_local(g);
  else if (x < 81 && nest) {
    g->depth++;
    s_if(g);
    g->depth--;
  } else if (x < 87 && nest) {
    g->depth++;
    s_for(g);
    g->depth--;
  } else if (x < 89 && nest) {
    g->depth++;
    s_while(g);
    g->depth--;
  } else if (x < 92 && g->jump_ok) s_jump(g);
  else {
    int vary;
    expr(g, pick_num_type(g->r), 0, 2, &vary);
  }
}

/* n statements in the current block; values and locals made here stay here. */
static void gen_block(kg *g, int n) {
  int mark = g->nv, lmark = g->nlv;
  for (int i = 0; i < n && g->budget > 0; i++) gen_stmt(g);
  g->nv = mark;
  g->nlv = lmark;
}

/* ---------------------------------------------------------------- top level */

static int pick_1d_extent(kg *g) {
  int cand[DT_MAXN], n = 0;
  for (int i = 1; i < g->l->nnodes; i++)
    if (node(g, i)->ndim == 1) cand[n++] = i;
  if (!n || dt_chance(g->r, 25)) return (int)dt_range(g->r, 1, 16);
  const fb_snode *s = node(g, cand[dt_below(g->r, (uint32_t)n)]);
  return (int)s->shape[s->dim_axis[0]];
}

static int open_par_for(kg *g) {
  fb_builder *b = &g->b;
  int e = pick_1d_extent(g);
  int lo = dt_chance(g->r, 75) ? 0 : (int)dt_range(g->r, 0, e);
  int end;
  int a = pick_val(g, FB_T_VOID, 1);
  if (dt_chance(g->r, 70) || a < 0) {
    end = fb_b_const_i32(b, e);
  } else { /* min(value, e): never past e, maybe empty */
    end = fb_b_binary(b, FB_OP_MIN, convert(g, g->v[a].id, g->v[a].t, FB_T_I32),
                      fb_b_const_i32(b, e));
  }
  g->loop.nd = 1;
  g->loop.ext[0] = e;
  return fb_b_range_for(b, fb_b_const_i32(b, lo), end, 1);
}

static int open_struct_for(kg *g) {
  int cand[DT_MAXN], n = 0;
  for (int i = 1; i < g->l->nnodes; i++)
    if (node(g, i)->ndim > 0) cand[n++] = i;
  int s = cand[dt_below(g->r, (uint32_t)n)];
  g->loop.nd = node_ext(g->l, s, -1, g->loop.ext);
  return fb_b_struct_for(&g->b, s);
}

static void gen_loop(kg *g) {
  memset(&g->loop, 0, sizeof g->loop);
  int loop = dt_chance(g->r, 50) ? open_par_for(g) : open_struct_for(g);
  g->loop.stmt = loop;
  int saved = fb_b_enter(&g->b, g->k->stmts[loop].body);
  int mark = g->nv, lmark = g->nlv;
  g->in_loop = 1;
  g->lv_floor = g->nlv;
  for (int d = 0; d < g->loop.nd; d++) {
    g->loop.idx[d] = fb_b_loop_index(&g->b, loop, d);
    push(g, g->loop.idx[d], FB_T_I32, 1);
  }
  make_plan(g);
  for (int f = 1; f < g->l->nnodes; f++)
    if (g->fmode[f] == FM_APPEND && node(g, f)->kind == FB_SN_PLACE) {
      int vary;
      g->appval[f] = expr(g, node(g, f)->type, 1, 1, &vary);
    }
  int n = g->loop_stmts ? g->loop_stmts + (int)dt_below(g->r, (uint32_t)g->loop_stmts)
                        : 2 + (int)dt_below(g->r, 5);
  for (int i = 0; i < n && g->budget > 0; i++) gen_stmt(g);
  if (dt_chance(g->r, 85)) sink(g);
  g->in_loop = 0;
  g->lv_floor = 0;
  g->nv = mark;
  g->nlv = lmark;
  fb_b_leave(&g->b, saved);
}

static void gen_ret(kg *g) {
  int vary;
  fb_type t = g->k->ret;
  uint32_t x = dt_below(g->r, 100);
  if (x >= 75) { /* a conditional return first */
    int iff = fb_b_if(&g->b, cond(g, 0, &vary), 0);
    int saved = fb_b_enter(&g->b, g->k->stmts[iff].body), mark = g->nv;
    fb_b_ret(&g->b, expr(g, t, 0, 1, &vary), 0);
    fb_b_leave(&g->b, saved);
    g->nv = mark;
  }
  if (x < 90) fb_b_ret(&g->b, expr(g, t, 0, 2, &vary), 0);
}

static const fb_type param_types[] = {FB_T_I32, FB_T_I32, FB_T_I64, FB_T_U32, FB_T_F32};

/* The kernel's items: parallel loops and runs of serial statements. */
static fb_kernel *gen_body(dt_rng *r, const fb_layout *l, const char *name, int np,
                           const fb_type *params, fb_type ret, int budget, int items,
                           int loop_stmts) {
  fb_kernel *k = fb_kernel_new(l, name, np, params, ret);
  if (!k) return NULL;
  kg *g = calloc(1, sizeof *g);
  if (!g) {
    fb_kernel_free(k);
    return NULL;
  }
  g->r = r;
  g->l = l;
  g->k = k;
  g->budget = budget;
  g->loop_stmts = loop_stmts;
  fb_builder_init(&g->b, k);
  for (int i = 0; i < np; i++) push(g, fb_b_arg(&g->b, i), params[i], 0);
  for (int i = 0; i < items; i++) {
    if (dt_chance(r, 60)) {
      gen_loop(g);
    } else {
      int n = 1 + (int)dt_below(r, 4);
      for (int j = 0; j < n && g->budget > 0; j++) gen_stmt(g);
      if (dt_chance(r, 70)) sink(g);
    }
  }
  if (ret != FB_T_VOID) gen_ret(g);
  int err = g->b.err;
  free(g);
  if (err) {
    fb_kernel_free(k);
    return NULL;
  }
  return k;
}

fb_kernel *dt_gen_kernel(dt_rng *r, const fb_layout *l, const char *name, int scale) {
  fb_type params[DT_GEN_MAXP];
  int np = (int)dt_below(r, DT_GEN_MAXP);
  for (int i = 0; i < np; i++) params[i] = param_types[dt_below(r, 5)];
  fb_type ret = dt_chance(r, 30) ? pick_num_type(r) : FB_T_VOID;
  int budget = (6 + (int)dt_below(r, 14)) * scale;
  uint32_t x = dt_below(r, 100);
  int items = (x < 45 ? 1 : x < 85 ? 2 : 3) + (int)dt_below(r, (uint32_t)scale);
  return gen_body(r, l, name, np, params, ret, budget, items, 0);
}

fb_kernel *dt_gen_kernel_big(dt_rng *r, const fb_layout *l, const char *name, int np,
                             int loop_stmts, int items) {
  fb_type params[DT_MAXP];
  if (np > DT_MAXP) np = DT_MAXP;
  for (int i = 0; i < np; i++) params[i] = param_types[dt_below(r, 5)];
  return gen_body(r, l, name, np, params, FB_T_VOID, 4 * loop_stmts * items, items, loop_stmts);
}

/* ---------------------------------------------------------------- the probe */

/* h = h * 31 + v */
static void mix(fb_builder *b, int h, int v) {
  int x = fb_b_binary(b, FB_OP_MUL, fb_b_lload(b, h), fb_b_const_i64(b, 31));
  fb_b_lstore(b, h, fb_b_binary(b, FB_OP_ADD, x, v));
}

/* Nested serial loops over ext; returns the innermost block's saved block
 * and fills idx with the loop indices. */
static int open_nest(fb_builder *b, const int64_t *ext, int n, int *idx) {
  int outer = b->block;
  for (int d = 0; d < n; d++) {
    int loop = fb_b_range_for(b, fb_b_const_i32(b, 0), fb_b_const_i32(b, (int32_t)ext[d]), 0);
    fb_b_enter(b, b->k->stmts[loop].body);
    idx[d] = fb_b_loop_index(b, loop, 0);
  }
  return outer;
}

/* A kernel returning a hash of the activity of every cell of every sparse
 * SNode and the length of every dynamic list. */
fb_kernel *dt_gen_probe(const fb_layout *l) {
  int any = 0;
  for (int i = 1; i < l->nnodes; i++) any |= is_sparse(l->nodes[i].kind);
  if (!any) return NULL;
  fb_kernel *k = fb_kernel_new(l, "probe", 0, NULL, FB_T_I64);
  if (!k) return NULL;
  fb_builder b;
  fb_builder_init(&b, k);
  int h = fb_b_alloca(&b, FB_T_I64);
  fb_b_lstore(&b, h, fb_b_const_i64(&b, 0));
  for (int i = 1; i < l->nnodes; i++) {
    const fb_snode *s = &l->nodes[i];
    if (!is_sparse(s->kind)) continue;
    int64_t ext[FB_MAX_AXES];
    int idx[FB_MAX_AXES];
    int n = node_ext(l, i, -1, ext);
    int saved = open_nest(&b, ext, n, idx);
    int a = fb_b_global(&b, FB_OP_IS_ACTIVE, i, idx, n, -1);
    mix(&b, h, fb_b_select(&b, a, fb_b_const_i64(&b, i + 1), fb_b_const_i64(&b, 0)));
    fb_b_leave(&b, saved);
    if (s->kind == FB_SN_DYNAMIC) {
      int f = s->children[0];
      n = node_ext(l, f, dyn_axis(l, i), ext);
      saved = open_nest(&b, ext, n, idx);
      mix(&b, h, fb_b_cast(&b, FB_T_I64, fb_b_global(&b, FB_OP_LENGTH, f, idx, n, -1)));
      fb_b_leave(&b, saved);
    }
  }
  fb_b_ret(&b, fb_b_lload(&b, h), 0);
  if (b.err) {
    fb_kernel_free(k);
    return NULL;
  }
  return k;
}
