/* Tests of structural hashing, equality and compaction (ir/hash.c): kernels
 * built twice, renumbered, carrying dead statements or another name are
 * equal and hash equally; every single-field change makes them differ;
 * clone is equal; compact keeps equality and drops dead statements.
 * fb_layout_equal: a layout of every SNode kind equals itself built twice
 * and cloned, and differs once any one declared field of one SNode does. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fusebox/ir.h"
#include "support/support.h"

typedef struct fx {
  fb_layout *l;
  int x, y, n;
} fx;

static fb_layout *make_layout(int64_t extent, fx *ids) {
  char err[128] = "";
  int64_t s[2] = {extent, extent};
  fb_layout *l = fb_layout_new();
  ck_assert_ptr_nonnull(l);
  int d = fb_layout_add(l, 0, FB_SN_DENSE, "ij", s, 0, NULL);
  int x = fb_layout_place(l, d, "x", FB_T_F32);
  int y = fb_layout_place(l, d, "y", FB_T_F32);
  int n = fb_layout_place(l, d, "n", FB_T_I32);
  ck_assert_msg(fb_layout_finalize(l, err, sizeof err) == 0, "finalize: %s", err);
  if (ids) {
    ids->l = l;
    ids->x = x;
    ids->y = y;
    ids->n = n;
  }
  return l;
}

/* How build_sample varies the kernel it builds. */
enum {
  V_DEAD = 1,      /* interleave unreachable statements and blocks */
  V_NESTED = 2,    /* the store to y sits in the if's then-block */
  V_NO_ELSE = 4    /* the if has no else block */
};

static const fb_type PARAMS[2] = {FB_T_I32, FB_T_F32};

/* Ids of the statements that single-field tests poke. */
typedef struct sample {
  fb_kernel *k;
  int one, sum, store_y, lt;
} sample;

/* Emit an unreachable statement (into an orphan block) when V_DEAD is set. */
static void junk(fb_builder *b, int flags, int orphan) {
  if (!(flags & V_DEAD)) return;
  int sv = fb_b_enter(b, orphan);
  int c = fb_b_const_i32(b, 99);
  fb_b_binary(b, FB_OP_MUL, c, c);
  fb_b_leave(b, sv);
}

/* params (i32 a, f32 s) -> f32:
 *   v = alloca f32; v = s
 *   range_for i in [0, a): y[i,0] = x[i,0] + 1; if i < 8: v = sum else: v = s
 *   par_for i in [0, 8): n[i,i] = i
 *   ret v */
static sample build_sample(const fx *f, const char *name, int flags) {
  sample sm;
  fb_kernel *k = fb_kernel_new(f->l, name, 2, PARAMS, FB_T_F32);
  ck_assert_ptr_nonnull(k);
  sm.k = k;
  fb_builder b;
  fb_builder_init(&b, k);
  int orphan = (flags & V_DEAD) ? fb_block_new(k) : -1;
  int a = fb_b_arg(&b, 0);
  junk(&b, flags, orphan);
  int s = fb_b_arg(&b, 1);
  int c0 = fb_b_const_i32(&b, 0);
  int c8 = fb_b_const_i32(&b, 8);
  sm.one = fb_b_const_f32(&b, 1.0f);
  int v = fb_b_alloca(&b, FB_T_F32);
  fb_b_lstore(&b, v, s);
  if (flags & V_DEAD) { /* a statement popped off block 0 */
    fb_b_const_f64(&b, 3.0);
    k->blocks[0].n--;
  }
  int r = fb_b_range_for(&b, c0, a, 0);
  int sv = fb_b_enter(&b, k->stmts[r].body);
  int i = fb_b_loop_index(&b, r, 0);
  int ij[2] = {i, c0};
  int lx = fb_b_load(&b, f->x, ij, 2);
  junk(&b, flags, orphan);
  sm.sum = fb_b_binary(&b, FB_OP_ADD, lx, sm.one);
  sm.lt = fb_b_binary(&b, FB_OP_LT, i, c8);
  int iff = fb_b_if(&b, sm.lt, !(flags & V_NO_ELSE));
  if (!(flags & V_NESTED)) sm.store_y = fb_b_store(&b, f->y, ij, 2, sm.sum);
  int sv2 = fb_b_enter(&b, k->stmts[iff].body);
  if (flags & V_NESTED) sm.store_y = fb_b_store(&b, f->y, ij, 2, sm.sum);
  fb_b_lstore(&b, v, sm.sum);
  if (!(flags & V_NO_ELSE)) {
    fb_b_enter(&b, k->stmts[iff].orelse);
    fb_b_lstore(&b, v, s);
  }
  fb_b_leave(&b, sv2);
  fb_b_leave(&b, sv);
  if (flags & V_DEAD) { /* a whole unreachable loop with a body */
    int sv3 = fb_b_enter(&b, orphan);
    int w = fb_b_while(&b);
    fb_b_enter(&b, k->stmts[w].body);
    fb_b_break(&b);
    fb_b_leave(&b, sv3);
  }
  int p = fb_b_range_for(&b, c0, c8, 1);
  sv = fb_b_enter(&b, k->stmts[p].body);
  int pi = fb_b_loop_index(&b, p, 0);
  int ii[2] = {pi, pi};
  fb_b_store(&b, f->n, ii, 2, pi);
  fb_b_leave(&b, sv);
  junk(&b, flags, orphan);
  fb_b_ret(&b, fb_b_lload(&b, v), 0);
  ck_assert_int_eq(b.err, 0);
  fb_diags d;
  fb_diags_init(&d);
  int rc = fb_verify(k, &d);
  char *all = fb_diags_join(&d);
  ck_assert_msg(rc == 0, "sample does not verify:\n%s", all);
  free(all);
  fb_diags_free(&d);
  return sm;
}

static int gcd(int a, int b) { return b ? gcd(b, a % b) : a; }

/* Copy of k with statement ids permuted by a fixed scramble and the
 * non-body blocks renumbered in reverse: same program, other numbering. */
static fb_kernel *renumber(const fb_kernel *k) {
  fb_kernel *c = fb_kernel_clone(k);
  ck_assert_ptr_nonnull(c);
  int n = k->nstmts, nb = k->nblocks;
  int *to = malloc(sizeof *to * (size_t)n), *bto = malloc(sizeof *bto * (size_t)nb);
  ck_assert(to && bto);
  int m = 7; /* i -> (m*i + 3) mod n is a permutation when gcd(m, n) = 1 */
  while (gcd(m, n) != 1) m++;
  for (int i = 0; i < n; i++) to[i] = (int)(((long)i * m + 3) % n);
  bto[0] = 0;
  for (int i = 1; i < nb; i++) bto[i] = nb - i;
  for (int i = 0; i < n; i++) {
    fb_stmt s = k->stmts[i];
    for (int j = 0; j < s.nargs; j++) s.args[j] = to[s.args[j]];
    if (s.body >= 0) s.body = bto[s.body];
    if (s.orelse >= 0) s.orelse = bto[s.orelse];
    c->stmts[to[i]] = s;
  }
  for (int bl = 0; bl < nb; bl++) {
    const fb_block *src = &k->blocks[bl];
    fb_block *dst = &c->blocks[bto[bl]];
    free(dst->ids);
    dst->ids = malloc(sizeof *dst->ids * (size_t)(src->n ? src->n : 1));
    ck_assert_ptr_nonnull(dst->ids);
    dst->n = dst->cap = src->n;
    for (int i = 0; i < src->n; i++) dst->ids[i] = to[src->ids[i]];
  }
  free(to);
  free(bto);
  return c;
}

static void same_at(int line, const fb_kernel *a, const fb_kernel *b) {
  ck_assert_msg(fb_kernel_equal(a, b), "line %d: kernels should be equal", line);
  ck_assert_msg(fb_kernel_equal(b, a), "line %d: equality should be symmetric", line);
  ck_assert_msg(fb_kernel_hash(a) == fb_kernel_hash(b), "line %d: equal kernels must hash equally",
                line);
}

static void differ_at(int line, const fb_kernel *a, const fb_kernel *b) {
  ck_assert_msg(!fb_kernel_equal(a, b), "line %d: kernels should differ", line);
  ck_assert_msg(!fb_kernel_equal(b, a), "line %d: inequality should be symmetric", line);
  ck_assert_msg(fb_kernel_hash(a) != fb_kernel_hash(b), "line %d: the hash should change", line);
}

#define assert_same(a, b) same_at(__LINE__, (a), (b))
#define assert_differ(a, b) differ_at(__LINE__, (a), (b))

/* ---------------------------------------------------------------- equal */

START_TEST(built_twice_equal) {
  fx f;
  make_layout(8, &f);
  sample a = build_sample(&f, "k", 0), b = build_sample(&f, "k", 0);
  assert_same(a.k, b.k);
  ck_assert(fb_kernel_equal(a.k, a.k));
  ck_assert(fb_kernel_hash(a.k) == fb_kernel_hash(a.k));
  ck_assert(fb_kernel_hash(a.k) != 0);
  fb_kernel_free(a.k);
  fb_kernel_free(b.k);
  fb_layout_free(f.l);
}
END_TEST

START_TEST(renumbered_equal) {
  fx f;
  make_layout(8, &f);
  sample a = build_sample(&f, "k", 0);
  fb_kernel *r = renumber(a.k);
  ck_assert_int_eq(fb_verify(r, NULL), 0);
  /* the numbering really changed */
  int moved = 0;
  for (int i = 0; i < r->nstmts; i++)
    moved += memcmp(&r->stmts[i], &a.k->stmts[i], sizeof(fb_stmt)) != 0;
  ck_assert_int_gt(moved, r->nstmts / 2);
  assert_same(a.k, r);
  fb_kernel_free(r);
  fb_kernel_free(a.k);
  fb_layout_free(f.l);
}
END_TEST

START_TEST(dead_statements_equal) {
  fx f;
  make_layout(8, &f);
  sample a = build_sample(&f, "k", 0), d = build_sample(&f, "k", V_DEAD);
  ck_assert_int_gt(d.k->nstmts, a.k->nstmts + 5);
  ck_assert_int_eq(fb_kernel_count_stmts(d.k), fb_kernel_count_stmts(a.k));
  assert_same(a.k, d.k);
  fb_kernel *r = renumber(d.k);
  assert_same(a.k, r);
  fb_kernel_free(r);
  fb_kernel_free(a.k);
  fb_kernel_free(d.k);
  fb_layout_free(f.l);
}
END_TEST

START_TEST(name_not_identity) {
  fx f;
  make_layout(8, &f);
  sample a = build_sample(&f, "first", 0), b = build_sample(&f, "second", 0);
  assert_same(a.k, b.k);
  fb_kernel_free(a.k);
  fb_kernel_free(b.k);
  fb_layout_free(f.l);
}
END_TEST

START_TEST(clone_equal) {
  fx f;
  make_layout(8, &f);
  sample a = build_sample(&f, "k", V_DEAD);
  fb_kernel *c = fb_kernel_clone(a.k);
  assert_same(a.k, c);
  /* a structurally equal copy of the layout is the same layout */
  fb_layout *l2 = fb_layout_clone(f.l);
  fb_kernel *c2 = fb_kernel_clone_to(a.k, l2);
  assert_same(a.k, c2);
  fb_kernel_free(c2);
  fb_layout_free(l2);
  fb_kernel_free(c);
  fb_kernel_free(a.k);
  fb_layout_free(f.l);
}
END_TEST

START_TEST(layout_is_identity) {
  fx f, g;
  make_layout(8, &f);
  make_layout(16, &g);
  sample a = build_sample(&f, "k", 0), b = build_sample(&g, "k", 0);
  assert_differ(a.k, b.k);
  fb_kernel *c = fb_kernel_clone_to(a.k, g.l);
  assert_same(b.k, c);
  fb_kernel_free(c);
  fb_kernel_free(a.k);
  fb_kernel_free(b.k);
  fb_layout_free(f.l);
  fb_layout_free(g.l);
}
END_TEST

/* ---------------------------------------------------------------- one field differs */

/* Build the sample twice, poke the second (what), and compare. */
#define POKE_TEST(tname, stmt_expr)                                                                \
  START_TEST(tname) {                                                                              \
    fx f;                                                                                          \
    make_layout(8, &f);                                                                            \
    sample a = build_sample(&f, "k", 0);                                                           \
    sample b = build_sample(&f, "k", 0);                                                           \
    assert_same(a.k, b.k);                                                                         \
    fb_kernel *k = b.k;                                                                            \
    stmt_expr;                                                                                     \
    assert_differ(a.k, b.k);                                                                       \
    fb_kernel_free(a.k);                                                                           \
    fb_kernel_free(b.k);                                                                           \
    fb_layout_free(f.l);                                                                           \
  }                                                                                                \
  END_TEST

POKE_TEST(differ_op, k->stmts[b.sum].op = FB_OP_SUB)
POKE_TEST(differ_type, k->stmts[b.one].type = FB_T_F64)
POKE_TEST(differ_imm, k->stmts[b.one].imm.f = 2.0)
POKE_TEST(differ_snode, k->stmts[b.store_y].snode = f.x)
POKE_TEST(differ_operand, {
  int t = k->stmts[b.sum].args[0];
  k->stmts[b.sum].args[0] = k->stmts[b.sum].args[1];
  k->stmts[b.sum].args[1] = t;
})
POKE_TEST(differ_nargs, k->stmts[b.lt].nargs = 1)
POKE_TEST(differ_param_type, k->params[1] = FB_T_F64)
POKE_TEST(differ_param_count, k->nparams = 1)
POKE_TEST(differ_ret_type, k->ret = FB_T_I32)
POKE_TEST(differ_block_order, {
  fb_block *b0 = &k->blocks[0];
  int32_t t = b0->ids[0];
  b0->ids[0] = b0->ids[1];
  b0->ids[1] = t;
})

START_TEST(differ_block_nesting) {
  fx f;
  make_layout(8, &f);
  sample a = build_sample(&f, "k", 0), b = build_sample(&f, "k", V_NESTED);
  ck_assert_int_eq(a.k->nstmts, b.k->nstmts);
  ck_assert_int_eq(fb_kernel_count_stmts(a.k), fb_kernel_count_stmts(b.k));
  assert_differ(a.k, b.k);
  sample c = build_sample(&f, "k", V_NO_ELSE), d = build_sample(&f, "k", V_NO_ELSE);
  assert_differ(a.k, c.k);
  assert_same(c.k, d.k);
  fb_kernel_free(a.k);
  fb_kernel_free(b.k);
  fb_kernel_free(c.k);
  fb_kernel_free(d.k);
  fb_layout_free(f.l);
}
END_TEST

/* ---------------------------------------------------------------- compact */

/* Pre-order walk of c's blocks: ids must come out as 0, 1, 2, ... */
static void walk_ids(const fb_kernel *c, int blk, int *next, int *blocks) {
  (*blocks)++;
  const fb_block *b = &c->blocks[blk];
  for (int i = 0; i < b->n; i++) {
    ck_assert_int_eq(b->ids[i], *next);
    (*next)++;
    const fb_stmt *s = &c->stmts[b->ids[i]];
    if (s->body >= 0) walk_ids(c, s->body, next, blocks);
    if (s->orelse >= 0) walk_ids(c, s->orelse, next, blocks);
  }
}

START_TEST(compact_drops_dead) {
  fx f;
  make_layout(8, &f);
  sample a = build_sample(&f, "k", 0), d = build_sample(&f, "k", V_DEAD);
  fb_kernel *r = renumber(d.k);
  fb_kernel *c = fb_kernel_compact(r);
  ck_assert_ptr_nonnull(c);
  ck_assert_int_eq(c->nstmts, fb_kernel_count_stmts(a.k));
  ck_assert_int_lt(c->nstmts, d.k->nstmts);
  int next = 0, blocks = 0;
  walk_ids(c, 0, &next, &blocks);
  ck_assert_int_eq(next, c->nstmts);
  ck_assert_int_eq(blocks, c->nblocks);
  ck_assert_int_lt(c->nblocks, d.k->nblocks);
  ck_assert_ptr_eq(c->layout, d.k->layout);
  ck_assert_str_eq(c->name, "k");
  ck_assert_int_eq(fb_verify(c, NULL), 0);
  assert_same(c, d.k);
  assert_same(c, a.k);
  /* compacting again changes nothing, statement for statement */
  fb_kernel *c2 = fb_kernel_compact(c);
  ck_assert_int_eq(c2->nstmts, c->nstmts);
  ck_assert_int_eq(memcmp(c2->stmts, c->stmts, sizeof(fb_stmt) * (size_t)c->nstmts), 0);
  assert_same(c, c2);
  fb_kernel_free(c2);
  fb_kernel_free(c);
  fb_kernel_free(r);
  fb_kernel_free(a.k);
  fb_kernel_free(d.k);
  fb_layout_free(f.l);
}
END_TEST

START_TEST(compact_keeps_differences) {
  fx f;
  make_layout(8, &f);
  sample a = build_sample(&f, "k", V_DEAD), b = build_sample(&f, "k", V_DEAD | V_NESTED);
  fb_kernel *ca = fb_kernel_compact(a.k), *cb = fb_kernel_compact(b.k);
  assert_differ(ca, cb);
  assert_same(ca, a.k);
  assert_same(cb, b.k);
  fb_kernel_free(ca);
  fb_kernel_free(cb);
  fb_kernel_free(a.k);
  fb_kernel_free(b.k);
  fb_layout_free(f.l);
}
END_TEST

START_TEST(garbage_does_not_crash) {
  /* Cycles, shared blocks and bad ids: hash, equal and compact still answer. */
  fx f;
  make_layout(8, &f);
  sample a = build_sample(&f, "k", 0);
  fb_kernel *g = fb_kernel_clone(a.k);
  for (int i = 0; i < g->nstmts; i++)
    if (g->stmts[i].body >= 0) g->stmts[i].body = 0; /* every loop body is the kernel body */
  g->blocks[0].ids[0] = 12345;
  g->stmts[1].args[0] = -9;
  uint64_t h = fb_kernel_hash(g);
  ck_assert(h == fb_kernel_hash(g));
  ck_assert(!fb_kernel_equal(g, a.k));
  fb_kernel *c = fb_kernel_compact(g);
  ck_assert_ptr_nonnull(c);
  ck_assert_int_ne(fb_verify(g, NULL), 0);
  fb_kernel_free(c);
  fb_kernel_free(g);
  ck_assert(fb_kernel_hash(NULL) == 0);
  ck_assert(!fb_kernel_equal(NULL, a.k));
  ck_assert_ptr_null(fb_kernel_compact(NULL));
  fb_kernel_free(a.k);
  fb_layout_free(f.l);
}
END_TEST

/* ---------------------------------------------------------------- layouts */

/* A layout of every kind of container: dense > pointer > bitmasked > place,
 * a dynamic (chunked) list beside it, and a named container (`as cells`). */
static fb_layout *every_kind(void) {
  char err[128] = "";
  int64_t s2[2] = {4, 4}, s1[1] = {8}, sd[1] = {64};
  fb_layout *l = fb_layout_new();
  ck_assert_ptr_nonnull(l);
  int d = fb_layout_add(l, 0, FB_SN_DENSE, "ij", s2, 0, "cells");
  int p = fb_layout_add(l, d, FB_SN_POINTER, "k", s1, 0, NULL);
  int b = fb_layout_add(l, p, FB_SN_BITMASKED, "l", s1, 0, NULL);
  ck_assert_int_ge(fb_layout_place(l, b, "u", FB_T_F32), 0);
  int y = fb_layout_add(l, 0, FB_SN_DYNAMIC, "i", sd, 16, NULL);
  ck_assert_int_ge(fb_layout_place(l, y, "v", FB_T_I32), 0);
  ck_assert_msg(fb_layout_finalize(l, err, sizeof err) == 0, "finalize: %s", err);
  return l;
}

static int node_of(const fb_layout *l, fb_snode_kind kind) {
  for (int i = 0; i < l->nnodes; i++)
    if (l->nodes[i].kind == kind) return i;
  ck_abort_msg("no node of kind %s", fb_snode_kind_name(kind));
  return -1;
}

START_TEST(layout_equal_same_tree) {
  fb_layout *a = every_kind(), *b = every_kind(), *c = fb_layout_clone(a);
  ck_assert_ptr_nonnull(c);
  ck_assert(fb_layout_equal(a, a));
  ck_assert(fb_layout_equal(a, b)); /* built twice */
  ck_assert(fb_layout_equal(b, a));
  ck_assert(fb_layout_equal(a, c)); /* cloned */
  ck_assert(fb_layout_hash(a) == fb_layout_hash(b));
  ck_assert(fb_layout_equal(NULL, NULL));
  ck_assert(!fb_layout_equal(a, NULL) && !fb_layout_equal(NULL, a));
  /* derived fields (offsets, shapes) follow from the declared ones: a
     layout not yet finalized is still the same tree */
  fb_layout *u = fb_layout_clone(a);
  u->nodes[1].offset += 8;
  ck_assert(fb_layout_equal(a, u));
  fb_layout_free(u);
  fb_layout_free(a);
  fb_layout_free(b);
  fb_layout_free(c);
}
END_TEST

/* One declared field of one SNode changed (which: _i, 0 .. NPOKES-1), in a
 * copy: never equal to the original, and the other way round. */
enum { P_KIND_POINTER, P_KIND_BITMASKED, P_KIND_DYNAMIC, P_PARENT, P_AXES, P_SIZE, P_CHUNK,
       P_TYPE, P_NAME, P_NAME_NULL, P_NAME_SET, P_FEWER, NPOKES };

START_TEST(layout_equal_each_field_differs) {
  fb_layout *a = every_kind(), *b = fb_layout_clone(a);
  ck_assert_ptr_nonnull(b);
  ck_assert(fb_layout_equal(a, b));
  fb_snode *ptr = &b->nodes[node_of(b, FB_SN_POINTER)];
  fb_snode *bm = &b->nodes[node_of(b, FB_SN_BITMASKED)];
  fb_snode *dyn = &b->nodes[node_of(b, FB_SN_DYNAMIC)];
  fb_snode *dense = &b->nodes[node_of(b, FB_SN_DENSE)];
  fb_snode *place = &b->nodes[b->nnodes - 1];
  ck_assert_int_eq(place->kind, FB_SN_PLACE);
  switch (_i) {
  case P_KIND_POINTER: ptr->kind = FB_SN_DENSE; break;       /* a sparse kind made dense */
  case P_KIND_BITMASKED: bm->kind = FB_SN_POINTER; break;    /* one sparse kind for another */
  case P_KIND_DYNAMIC: dyn->kind = FB_SN_BITMASKED; break;
  case P_PARENT: place->parent = dense->id; break;
  case P_AXES: ptr->axes = 1u << 3; break;                   /* the same size, another axis */
  case P_SIZE: bm->size[3] = 16; break;
  case P_CHUNK: dyn->chunk = 32; break;
  case P_TYPE: place->type = FB_T_F64; break;
  case P_NAME: place->name[0] = 'w'; break;
  case P_NAME_NULL:
    free(dense->name);
    dense->name = NULL;
    break;
  case P_NAME_SET: ptr->name = strdup("ptrs"); break;
  case P_FEWER: b->nnodes--; break;
  }
  ck_assert_msg(!fb_layout_equal(a, b) && !fb_layout_equal(b, a), "poke %d went unseen", _i);
  if (_i == P_FEWER) b->nnodes++;
  fb_layout_free(a);
  fb_layout_free(b);
}
END_TEST

static Suite *hash_suite(void) {
  Suite *s = suite_create("hash");
  TCase *eq = tcase_create("equal");
  tcase_add_test(eq, built_twice_equal);
  tcase_add_test(eq, renumbered_equal);
  tcase_add_test(eq, dead_statements_equal);
  tcase_add_test(eq, name_not_identity);
  tcase_add_test(eq, clone_equal);
  tcase_add_test(eq, layout_is_identity);
  suite_add_tcase(s, eq);
  TCase *df = tcase_create("differ");
  tcase_add_test(df, differ_op);
  tcase_add_test(df, differ_type);
  tcase_add_test(df, differ_imm);
  tcase_add_test(df, differ_snode);
  tcase_add_test(df, differ_operand);
  tcase_add_test(df, differ_nargs);
  tcase_add_test(df, differ_param_type);
  tcase_add_test(df, differ_param_count);
  tcase_add_test(df, differ_ret_type);
  tcase_add_test(df, differ_block_order);
  tcase_add_test(df, differ_block_nesting);
  suite_add_tcase(s, df);
  TCase *cp = tcase_create("compact");
  tcase_add_test(cp, compact_drops_dead);
  tcase_add_test(cp, compact_keeps_differences);
  tcase_add_test(cp, garbage_does_not_crash);
  suite_add_tcase(s, cp);
  TCase *ly = tcase_create("layout_equal");
  tcase_add_test(ly, layout_equal_same_tree);
  tcase_add_loop_test(ly, layout_equal_each_field_differs, 0, NPOKES);
  suite_add_tcase(s, ly);
  return s;
}

int main(void) { return fbt_run(hash_suite()); }
