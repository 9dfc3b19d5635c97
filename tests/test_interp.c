/* The reference interpreter (ir/interp.c): kernels built with the builder on
 * small dense layouts, checked element by element against values worked out
 * by hand from the semantics block in include/fusebox/ir.h: loops and
 * addressing, reductions, control flow, every arithmetic op on every type
 * (wrapping, division by zero, floored division, shifts, saturating casts),
 * bounds errors, return values, gtmp, rand() keying, and that sparse
 * layouts run (tests/test_interp_sparse.c tests them in depth). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "fusebox/ir.h"
#include "tests/support/support.h"

/* Defined in ir/interp.c; declared here until include/fusebox/ir.h has them. */
const char *fb_interp_errmsg(const fb_interp *in);
void fb_interp_set_launch(fb_interp *in, uint64_t launch);

#define I32 fb_value_i32
#define I64 fb_value_i64
#define U32 fb_value_u32
#define U64 fb_value_u64
#define F32 fb_value_f32
#define F64 fb_value_f64
#define BOOL fb_value_bool

/* ---------------------------------------------------------------- helpers */

static void finalize(fb_layout *l) {
  char err[200] = "";
  int rc = fb_layout_finalize(l, err, sizeof err);
  ck_assert_msg(rc == 0, "layout: %s", err);
}

static int add_node(fb_layout *l, int parent, fb_snode_kind kind, const char *axes, int64_t a,
                    int64_t b) {
  int64_t sz[2] = {a, b};
  int id = fb_layout_add(l, parent, kind, axes, sz, kind == FB_SN_DYNAMIC ? 4 : 0, NULL);
  ck_assert_int_ge(id, 0);
  return id;
}

static int place(fb_layout *l, int parent, const char *name, fb_type t) {
  int id = fb_layout_place(l, parent, name, t);
  ck_assert_int_ge(id, 0);
  return id;
}

static fb_interp *new_interp(const fb_layout *l, uint64_t seed) {
  fb_interp *in = fb_interp_new(l, seed);
  ck_assert_ptr_nonnull(in);
  return in;
}

static int run(fb_interp *in, const fb_kernel *k, const fb_value *args, int nargs, fb_value *ret) {
  int rc = fb_interp_run(in, k, args, nargs, ret);
  if (rc && rc != FB_EBOUNDS)
    fprintf(stderr, "run %s: %s: %s\n", k->name, fb_strerror(rc), fb_interp_errmsg(in));
  return rc;
}

static int body(fb_builder *b, int stmt) { return b->k->stmts[stmt].body; }

/* A loop over [lo, hi) entered by the builder; returns the loop id and the
 * previous insertion block in *saved. */
static int open_range(fb_builder *b, int32_t lo, int32_t hi, int par, int *saved) {
  int loop = fb_b_range_for(b, fb_b_const_i32(b, lo), fb_b_const_i32(b, hi), par);
  *saved = fb_b_enter(b, body(b, loop));
  return loop;
}

static void built(fb_builder *b) { ck_assert_int_eq(b->err, 0); }

#define same fbt_value_same
#define show fbt_value_show

static void expect_value(fb_value got, fb_value want, int line, const char *what) {
  char g[64], w[64];
  ck_assert_msg(same(got, want), "line %d: %s = %s, expected %s", line, what,
                show(got, g, sizeof g), show(want, w, sizeof w));
}

/* Evaluate one op in a kernel, once with the operands passed as arguments
 * and once as constants; both must agree. to: the target type of a cast. */
static fb_value eval(fb_op op, fb_type to, const fb_value *ops, int nops) {
  fb_layout *l = fb_layout_new();
  finalize(l);
  fb_interp *in = new_interp(l, 1);
  fb_value res[2];
  fb_type params[3];
  for (int i = 0; i < nops; i++) params[i] = ops[i].type;
  for (int use_const = 0; use_const < 2; use_const++) {
    fb_kernel *k = fb_kernel_new(l, "eval", use_const ? 0 : nops, params, FB_T_VOID);
    fb_builder b;
    fb_builder_init(&b, k);
    int a[3] = {-1, -1, -1}, id;
    for (int i = 0; i < nops; i++) a[i] = use_const ? fb_b_const(&b, ops[i]) : fb_b_arg(&b, i);
    if (op == FB_OP_CAST) id = fb_b_cast(&b, to, a[0]);
    else if (op == FB_OP_SELECT) id = fb_b_select(&b, a[0], a[1], a[2]);
    else if (nops == 1) id = fb_b_unary(&b, op, a[0]);
    else id = fb_b_binary(&b, op, a[0], a[1]);
    k->ret = (fb_type)k->stmts[id].type;
    fb_b_ret(&b, id, 0);
    built(&b);
    ck_assert_int_eq(run(in, k, use_const ? NULL : ops, use_const ? 0 : nops, &res[use_const]), 0);
    fb_kernel_free(k);
  }
  char x[64], y[64];
  ck_assert_msg(same(res[0], res[1]), "%s: from args %s, from consts %s", fb_op_table[op].name,
                show(res[0], x, sizeof x), show(res[1], y, sizeof y));
  fb_interp_free(in);
  fb_layout_free(l);
  return res[0];
}

static fb_value eval1(fb_op op, fb_value a) { return eval(op, FB_T_VOID, &a, 1); }
static fb_value eval2(fb_op op, fb_value a, fb_value b) {
  fb_value v[2] = {a, b};
  return eval(op, FB_T_VOID, v, 2);
}
static fb_value eval_cast(fb_value a, fb_type to) { return eval(FB_OP_CAST, to, &a, 1); }

#define BIN(op, A, B, W) expect_value(eval2(FB_OP_##op, A, B), W, __LINE__, #op "(" #A ", " #B ")")
#define UN(op, A, W) expect_value(eval1(FB_OP_##op, A), W, __LINE__, #op "(" #A ")")
#define CAST(A, T, W) expect_value(eval_cast(A, FB_T_##T), W, __LINE__, "cast " #T "(" #A ")")

/* ---------------------------------------------------------------- loops and addressing */

/* y[i] = alpha * x[i] + y[i] over a par_for, in f32. */
START_TEST(test_map_par_for) {
  fb_layout *l = fb_layout_new();
  int d = add_node(l, 0, FB_SN_DENSE, "i", 16, 0);
  int x = place(l, d, "x", FB_T_F32), y = place(l, d, "y", FB_T_F32);
  finalize(l);
  fb_type pt = FB_T_F32;
  fb_kernel *k = fb_kernel_new(l, "saxpy", 1, &pt, FB_T_VOID);
  fb_builder b;
  fb_builder_init(&b, k);
  int alpha = fb_b_arg(&b, 0), saved;
  int loop = open_range(&b, 0, 16, 1, &saved);
  int i = fb_b_loop_index(&b, loop, 0);
  int ax = fb_b_binary(&b, FB_OP_MUL, alpha, fb_b_load(&b, x, &i, 1));
  fb_b_store(&b, y, &i, 1, fb_b_binary(&b, FB_OP_ADD, ax, fb_b_load(&b, y, &i, 1)));
  fb_b_leave(&b, saved);
  built(&b);

  fb_interp *in = new_interp(l, 0);
  float *xs = fb_interp_field(in, x), *ys = fb_interp_field(in, y);
  ck_assert_int_eq(fb_field_numel(l, x), 16);
  for (int n = 0; n < 16; n++) {
    ck_assert(xs[n] == 0 && ys[n] == 0); /* zero-initialised */
    xs[n] = (float)n * 0.5f;
    ys[n] = 1.0f;
  }
  fb_value a = F32(2.0f);
  ck_assert_int_eq(run(in, k, &a, 1, NULL), 0);
  for (int n = 0; n < 16; n++) ck_assert_float_eq(ys[n], (float)n + 1.0f);
  a = F32(0.1f);
  ck_assert_int_eq(run(in, k, &a, 1, NULL), 0);
  for (int n = 0; n < 16; n++) {
    volatile float p = 0.1f * ((float)n * 0.5f);
    volatile float want = p + ((float)n + 1.0f);
    ck_assert_msg(ys[n] == want, "y[%d] = %.9g, expected %.9g", n, ys[n], want);
  }
  fb_interp_free(in);
  fb_kernel_free(k);
  fb_layout_free(l);
}
END_TEST

/* struct_for over a 2-D place and over its container: a[i, j] = i*100 + j,
 * visited row-major (the visit number comes from an atomic counter). */
START_TEST(test_struct_for_2d) {
  fb_layout *l = fb_layout_new();
  int d = add_node(l, 0, FB_SN_DENSE, "ij", 6, 5);
  int a = place(l, d, "a", FB_T_I32), c = place(l, d, "c", FB_T_I32);
  int order = place(l, d, "order", FB_T_I32), cnt = place(l, 0, "cnt", FB_T_I32);
  finalize(l);
  ck_assert_int_eq(l->nodes[a].ndim, 2);
  fb_kernel *k = fb_kernel_new(l, "fill", 0, NULL, FB_T_VOID);
  fb_builder b;
  fb_builder_init(&b, k);
  int sf = fb_b_struct_for(&b, a);
  int saved = fb_b_enter(&b, body(&b, sf));
  int ij[2] = {fb_b_loop_index(&b, sf, 0), fb_b_loop_index(&b, sf, 1)};
  int v =
      fb_b_binary(&b, FB_OP_ADD, fb_b_binary(&b, FB_OP_MUL, ij[0], fb_b_const_i32(&b, 100)), ij[1]);
  fb_b_store(&b, a, ij, 2, v);
  int seq = fb_b_global(&b, FB_OP_ATOMIC_ADD, cnt, NULL, 0, fb_b_const_i32(&b, 1));
  fb_b_store(&b, order, ij, 2, seq);
  fb_b_leave(&b, saved);
  sf = fb_b_struct_for(&b, d); /* the container's cell space */
  saved = fb_b_enter(&b, body(&b, sf));
  int ij2[2] = {fb_b_loop_index(&b, sf, 0), fb_b_loop_index(&b, sf, 1)};
  fb_b_store(&b, c, ij2, 2,
             fb_b_binary(&b, FB_OP_SUB, fb_b_binary(&b, FB_OP_MUL, ij2[0], fb_b_const_i32(&b, 100)),
                         ij2[1]));
  fb_b_leave(&b, saved);
  built(&b);

  fb_interp *in = new_interp(l, 0);
  ck_assert_int_eq(run(in, k, NULL, 0, NULL), 0);
  int32_t *as = fb_interp_field(in, a), *cs = fb_interp_field(in, c);
  int32_t *os = fb_interp_field(in, order), *n = fb_interp_field(in, cnt);
  ck_assert_int_eq(fb_field_numel(l, a), 30);
  ck_assert_int_eq(*n, 30);
  for (int i = 0; i < 6; i++)
    for (int j = 0; j < 5; j++) {
      ck_assert_int_eq(as[i * 5 + j], i * 100 + j);
      ck_assert_int_eq(cs[i * 5 + j], i * 100 - j);
      ck_assert_int_eq(os[i * 5 + j], i * 5 + j);
    }
  fb_interp_free(in);
  fb_kernel_free(k);
  fb_layout_free(l);
}
END_TEST

/* dense(i: 4) { dense(i: 8) { x } }: x has 32 elements; struct_for visits
 * 32 cells of the inner node and 4 of the outer one. Also a field whose j
 * extent is split across two levels: dense(ij: 2, 3) { dense(j: 4) { y } }
 * has shape (2, 12). */
START_TEST(test_nested_dense) {
  fb_layout *l = fb_layout_new();
  int outer = add_node(l, 0, FB_SN_DENSE, "i", 4, 0);
  int inner = add_node(l, outer, FB_SN_DENSE, "i", 8, 0);
  int x = place(l, inner, "x", FB_T_I32);
  int d2 = add_node(l, 0, FB_SN_DENSE, "ij", 2, 3);
  int d3 = add_node(l, d2, FB_SN_DENSE, "j", 4, 0);
  int y = place(l, d3, "y", FB_T_I64);
  int n_in = place(l, 0, "n_in", FB_T_I32), n_out = place(l, 0, "n_out", FB_T_I32);
  finalize(l);
  ck_assert_int_eq(fb_field_numel(l, x), 32);
  ck_assert_int_eq(fb_field_numel(l, y), 24);

  fb_kernel *k = fb_kernel_new(l, "nested", 0, NULL, FB_T_VOID);
  fb_builder b;
  fb_builder_init(&b, k);
  int saved;
  int loop = open_range(&b, 0, 32, 1, &saved);
  int i = fb_b_loop_index(&b, loop, 0);
  fb_b_store(&b, x, &i, 1, fb_b_binary(&b, FB_OP_MUL, i, fb_b_const_i32(&b, 3)));
  fb_b_leave(&b, saved);
  int one = fb_b_const_i32(&b, 1);
  int sf = fb_b_struct_for(&b, inner);
  saved = fb_b_enter(&b, body(&b, sf));
  fb_b_global(&b, FB_OP_ATOMIC_ADD, n_in, NULL, 0, one);
  fb_b_leave(&b, saved);
  sf = fb_b_struct_for(&b, outer);
  saved = fb_b_enter(&b, body(&b, sf));
  fb_b_global(&b, FB_OP_ATOMIC_ADD, n_out, NULL, 0, one);
  fb_b_leave(&b, saved);
  sf = fb_b_struct_for(&b, y);
  saved = fb_b_enter(&b, body(&b, sf));
  int ij[2] = {fb_b_loop_index(&b, sf, 0), fb_b_loop_index(&b, sf, 1)};
  int v =
      fb_b_binary(&b, FB_OP_ADD, fb_b_binary(&b, FB_OP_MUL, ij[0], fb_b_const_i32(&b, 100)), ij[1]);
  fb_b_store(&b, y, ij, 2, fb_b_cast(&b, FB_T_I64, v));
  fb_b_leave(&b, saved);
  built(&b);

  fb_interp *in = new_interp(l, 0);
  ck_assert_int_eq(run(in, k, NULL, 0, NULL), 0);
  int32_t *xs = fb_interp_field(in, x);
  int64_t *ys = fb_interp_field(in, y);
  for (int n = 0; n < 32; n++) ck_assert_int_eq(xs[n], 3 * n);
  ck_assert_int_eq(*(int32_t *)fb_interp_field(in, n_in), 32);
  ck_assert_int_eq(*(int32_t *)fb_interp_field(in, n_out), 4);
  for (int r = 0; r < 2; r++)
    for (int c = 0; c < 12; c++) ck_assert_int_eq(ys[r * 12 + c], r * 100 + c);
  ck_assert_ptr_null(fb_interp_field(in, inner)); /* containers have no storage */
  fb_interp_free(in);
  fb_kernel_free(k);
  fb_layout_free(l);
}
END_TEST

/* Reductions into 0-D fields; atomics return the old value. */
START_TEST(test_reductions) {
  fb_layout *l = fb_layout_new();
  int si = place(l, 0, "si", FB_T_I32), sf = place(l, 0, "sf", FB_T_F32);
  int mx = place(l, 0, "mx", FB_T_F32), mn = place(l, 0, "mn", FB_T_I64);
  int bits = place(l, 0, "bits", FB_T_U32), sub = place(l, 0, "sub", FB_T_F64);
  finalize(l);
  ck_assert_int_eq(fb_field_numel(l, si), 1);
  fb_kernel *k = fb_kernel_new(l, "reduce", 0, NULL, FB_T_I32);
  fb_builder b;
  fb_builder_init(&b, k);
  int saved;
  int loop = open_range(&b, 0, 100, 1, &saved);
  int i = fb_b_loop_index(&b, loop, 0);
  fb_b_global(&b, FB_OP_ATOMIC_ADD, si, NULL, 0, i);
  fb_b_global(&b, FB_OP_ATOMIC_ADD, sf, NULL, 0, fb_b_const_f32(&b, 0.1f));
  int fi = fb_b_cast(&b, FB_T_F32, fb_b_binary(&b, FB_OP_SUB, i, fb_b_const_i32(&b, 37)));
  fb_b_global(&b, FB_OP_ATOMIC_MAX, mx, NULL, 0,
              fb_b_unary(&b, FB_OP_NEG, fb_b_unary(&b, FB_OP_ABS, fi)));
  fb_b_global(
      &b, FB_OP_ATOMIC_MIN, mn, NULL, 0,
      fb_b_cast(&b, FB_T_I64,
                fb_b_binary(&b, FB_OP_MUL, fb_b_binary(&b, FB_OP_SUB, i, fb_b_const_i32(&b, 50)),
                            fb_b_binary(&b, FB_OP_SUB, i, fb_b_const_i32(&b, 50)))));
  fb_b_global(&b, FB_OP_ATOMIC_SUB, sub, NULL, 0, fb_b_const_f64(&b, 0.5));
  fb_b_leave(&b, saved);
  fb_b_global(&b, FB_OP_ATOMIC_OR, bits, NULL, 0, fb_b_const_u32(&b, 0xF0u));
  fb_b_global(&b, FB_OP_ATOMIC_AND, bits, NULL, 0, fb_b_const_u32(&b, 0x3Cu));
  fb_b_global(&b, FB_OP_ATOMIC_XOR, bits, NULL, 0, fb_b_const_u32(&b, 0x0Fu));
  int old = fb_b_global(&b, FB_OP_ATOMIC_ADD, si, NULL, 0, fb_b_const_i32(&b, 5));
  fb_b_ret(&b, old, 0);
  built(&b);

  fb_interp *in = new_interp(l, 0);
  *(float *)fb_interp_field(in, mx) = -1000.0f;
  *(int64_t *)fb_interp_field(in, mn) = 1000;
  fb_value ret;
  ck_assert_int_eq(run(in, k, NULL, 0, &ret), 0);
  expect_value(ret, I32(4950), __LINE__, "old value of si");
  ck_assert_int_eq(*(int32_t *)fb_interp_field(in, si), 4955);
  float want = 0.0f; /* f32 adds in ascending iteration order */
  for (int n = 0; n < 100; n++) {
    volatile float t = want + 0.1f;
    want = t;
  }
  ck_assert(want != 10.0f); /* so the comparison below says something */
  ck_assert(*(float *)fb_interp_field(in, sf) == want);
  ck_assert(*(float *)fb_interp_field(in, mx) == 0.0f);
  ck_assert_int_eq(*(int64_t *)fb_interp_field(in, mn), 0);
  ck_assert_uint_eq(*(uint32_t *)fb_interp_field(in, bits), ((0xF0u & 0x3Cu) ^ 0x0Fu));
  ck_assert(*(double *)fb_interp_field(in, sub) == -50.0);
  fb_interp_free(in);
  fb_kernel_free(k);
  fb_layout_free(l);
}
END_TEST

/* ---------------------------------------------------------------- control flow */

/* i = 0; s = 0; while { if i >= 10 break; i += 1; if i % 2 == 0 continue;
 * s += i }  ->  s = 1 + 3 + 5 + 7 + 9 = 25, i = 10. Then a range_for with a
 * nested range_for whose break leaves only the inner loop. */
START_TEST(test_while_break_continue) {
  fb_layout *l = fb_layout_new();
  int d = add_node(l, 0, FB_SN_DENSE, "i", 4, 0);
  int t = place(l, d, "t", FB_T_I32), iv = place(l, 0, "iv", FB_T_I32);
  finalize(l);
  fb_kernel *k = fb_kernel_new(l, "loops", 0, NULL, FB_T_I32);
  fb_builder b;
  fb_builder_init(&b, k);
  int vi = fb_b_alloca(&b, FB_T_I32), vs = fb_b_alloca(&b, FB_T_I32);
  int w = fb_b_while(&b);
  int saved = fb_b_enter(&b, body(&b, w));
  int cur = fb_b_lload(&b, vi);
  int stop = fb_b_if(&b, fb_b_binary(&b, FB_OP_GE, cur, fb_b_const_i32(&b, 10)), 0);
  int s2 = fb_b_enter(&b, body(&b, stop));
  fb_b_break(&b);
  fb_b_leave(&b, s2);
  int next = fb_b_binary(&b, FB_OP_ADD, cur, fb_b_const_i32(&b, 1));
  fb_b_lstore(&b, vi, next);
  int even = fb_b_binary(&b, FB_OP_EQ, fb_b_binary(&b, FB_OP_REM, next, fb_b_const_i32(&b, 2)),
                         fb_b_const_i32(&b, 0));
  int skip = fb_b_if(&b, even, 0);
  s2 = fb_b_enter(&b, body(&b, skip));
  fb_b_continue(&b);
  fb_b_leave(&b, s2);
  fb_b_lstore(&b, vs, fb_b_binary(&b, FB_OP_ADD, fb_b_lload(&b, vs), next));
  fb_b_leave(&b, saved);
  fb_b_store(&b, iv, NULL, 0, fb_b_lload(&b, vi));
  /* for r in 0..4 { for c in 0..100 { if c == r break; t[r] += 1 } } */
  int outer = open_range(&b, 0, 4, 0, &saved);
  int r = fb_b_loop_index(&b, outer, 0), s3;
  int inner = open_range(&b, 0, 100, 0, &s3);
  int c = fb_b_loop_index(&b, inner, 0);
  int eq = fb_b_if(&b, fb_b_binary(&b, FB_OP_EQ, c, r), 0);
  s2 = fb_b_enter(&b, body(&b, eq));
  fb_b_break(&b);
  fb_b_leave(&b, s2);
  fb_b_global(&b, FB_OP_ATOMIC_ADD, t, &r, 1, fb_b_const_i32(&b, 1));
  fb_b_leave(&b, s3);
  fb_b_global(&b, FB_OP_ATOMIC_ADD, t, &r, 1, fb_b_const_i32(&b, 1000));
  fb_b_leave(&b, saved);
  fb_b_ret(&b, fb_b_lload(&b, vs), 0);
  built(&b);

  fb_interp *in = new_interp(l, 0);
  fb_value ret;
  ck_assert_int_eq(run(in, k, NULL, 0, &ret), 0);
  expect_value(ret, I32(25), __LINE__, "sum of odd numbers");
  ck_assert_int_eq(*(int32_t *)fb_interp_field(in, iv), 10);
  int32_t *ts = fb_interp_field(in, t);
  for (int n = 0; n < 4; n++) ck_assert_int_eq(ts[n], 1000 + n);
  fb_interp_free(in);
  fb_kernel_free(k);
  fb_layout_free(l);
}
END_TEST

/* if/else on an argument; an alloca in a loop body starts at 0 each time;
 * loop_index of an outer loop from inside an inner one. */
START_TEST(test_if_else_locals) {
  fb_layout *l = fb_layout_new();
  int d = add_node(l, 0, FB_SN_DENSE, "ij", 3, 4);
  int g = place(l, d, "g", FB_T_I32), h = place(l, d, "h", FB_T_I32);
  finalize(l);
  fb_type pt = FB_T_I32;
  fb_kernel *k = fb_kernel_new(l, "branch", 1, &pt, FB_T_F64);
  fb_builder b;
  fb_builder_init(&b, k);
  int x = fb_b_arg(&b, 0);
  int res = fb_b_alloca(&b, FB_T_F64);
  int br = fb_b_if(&b, fb_b_binary(&b, FB_OP_LT, x, fb_b_const_i32(&b, 0)), 1);
  int saved = fb_b_enter(&b, body(&b, br));
  fb_b_lstore(&b, res, fb_b_const_f64(&b, -1.5));
  fb_b_leave(&b, saved);
  saved = fb_b_enter(&b, b.k->stmts[br].orelse);
  fb_b_lstore(&b, res, fb_b_const_f64(&b, 2.5));
  fb_b_leave(&b, saved);
  int li = open_range(&b, 0, 3, 1, &saved), s2;
  int i = fb_b_loop_index(&b, li, 0);
  int lj = open_range(&b, 0, 4, 0, &s2);
  int j = fb_b_loop_index(&b, lj, 0);
  int var = fb_b_alloca(&b, FB_T_I32); /* fresh (0) on every iteration */
  fb_b_lstore(&b, var, fb_b_binary(&b, FB_OP_ADD, fb_b_lload(&b, var), fb_b_const_i32(&b, 7)));
  int ij[2] = {i, j};
  fb_b_store(&b, g, ij, 2, fb_b_lload(&b, var));
  fb_b_store(&b, h, ij, 2, fb_b_loop_index(&b, li, 0));
  fb_b_leave(&b, s2);
  fb_b_leave(&b, saved);
  fb_b_ret(&b, fb_b_lload(&b, res), 0);
  built(&b);

  fb_interp *in = new_interp(l, 0);
  fb_value a = I32(-3), ret;
  ck_assert_int_eq(run(in, k, &a, 1, &ret), 0);
  expect_value(ret, F64(-1.5), __LINE__, "then branch");
  a = I32(4);
  ck_assert_int_eq(run(in, k, &a, 1, &ret), 0);
  expect_value(ret, F64(2.5), __LINE__, "else branch");
  int32_t *gs = fb_interp_field(in, g), *hs = fb_interp_field(in, h);
  for (int n = 0; n < 12; n++) {
    ck_assert_int_eq(gs[n], 7);
    ck_assert_int_eq(hs[n], n / 4);
  }
  fb_interp_free(in);
  fb_kernel_free(k);
  fb_layout_free(l);
}
END_TEST

/* ---------------------------------------------------------------- arithmetic */

START_TEST(test_arith_i32) {
  BIN(ADD, I32(INT32_MAX), I32(1), I32(INT32_MIN));
  BIN(ADD, I32(-7), I32(3), I32(-4));
  BIN(SUB, I32(INT32_MIN), I32(1), I32(INT32_MAX));
  BIN(MUL, I32(65536), I32(65536), I32(0));
  BIN(MUL, I32(INT32_MAX), I32(2), I32(-2));
  BIN(MUL, I32(-3), I32(7), I32(-21));
  BIN(DIV, I32(7), I32(2), I32(3));
  BIN(DIV, I32(-7), I32(2), I32(-3));
  BIN(DIV, I32(7), I32(-2), I32(-3));
  BIN(DIV, I32(7), I32(0), I32(0));
  BIN(DIV, I32(INT32_MIN), I32(-1), I32(INT32_MIN));
  BIN(REM, I32(7), I32(3), I32(1));
  BIN(REM, I32(-7), I32(3), I32(-1));
  BIN(REM, I32(7), I32(-3), I32(1));
  BIN(REM, I32(7), I32(0), I32(0));
  BIN(REM, I32(INT32_MIN), I32(-1), I32(0));
  BIN(FLOORDIV, I32(7), I32(2), I32(3));
  BIN(FLOORDIV, I32(-7), I32(2), I32(-4));
  BIN(FLOORDIV, I32(7), I32(-2), I32(-4));
  BIN(FLOORDIV, I32(-7), I32(-2), I32(3));
  BIN(FLOORDIV, I32(-6), I32(2), I32(-3));
  BIN(FLOORDIV, I32(0), I32(-3), I32(0));
  BIN(FLOORDIV, I32(7), I32(0), I32(0));
  BIN(FLOORDIV, I32(INT32_MIN), I32(-1), I32(INT32_MIN));
  BIN(FLOORMOD, I32(7), I32(3), I32(1));
  BIN(FLOORMOD, I32(-7), I32(3), I32(2));
  BIN(FLOORMOD, I32(7), I32(-3), I32(-2));
  BIN(FLOORMOD, I32(-7), I32(-3), I32(-1));
  BIN(FLOORMOD, I32(-6), I32(3), I32(0));
  BIN(FLOORMOD, I32(7), I32(0), I32(0));
  BIN(FLOORMOD, I32(INT32_MIN), I32(-1), I32(0));
  BIN(MIN, I32(-5), I32(3), I32(-5));
  BIN(MAX, I32(-5), I32(3), I32(3));
  BIN(AND, I32(0xF0F0), I32(0x0FF0), I32(0x00F0));
  BIN(OR, I32(0xF0F0), I32(0x0FF0), I32(0xFFF0));
  BIN(XOR, I32(0xF0F0), I32(0x0FF0), I32(0xFF00));
  BIN(SHL, I32(1), I32(3), I32(8));
  BIN(SHL, I32(1), I32(32), I32(1));
  BIN(SHL, I32(1), I32(33), I32(2));
  BIN(SHL, I32(1), I32(-1), I32(INT32_MIN)); /* -1 mod 32 = 31 */
  BIN(SHL, I32(0x40000000), I32(1), I32(INT32_MIN));
  BIN(SHR, I32(-8), I32(1), I32(-4)); /* arithmetic */
  BIN(SHR, I32(-8), I32(35), I32(-1));
  BIN(SHR, I32(INT32_MIN), I32(31), I32(-1));
  BIN(SHR, I32(64), I32(32), I32(64));
  BIN(EQ, I32(-1), I32(-1), BOOL(1));
  BIN(NE, I32(-1), I32(1), BOOL(1));
  BIN(LT, I32(-1), I32(1), BOOL(1));
  BIN(LE, I32(1), I32(1), BOOL(1));
  BIN(GT, I32(-1), I32(1), BOOL(0));
  BIN(GE, I32(-1), I32(1), BOOL(0));
  UN(NEG, I32(5), I32(-5));
  UN(NEG, I32(INT32_MIN), I32(INT32_MIN));
  UN(ABS, I32(-5), I32(5));
  UN(ABS, I32(INT32_MIN), I32(INT32_MIN));
  UN(NOT, I32(0), I32(-1));
  UN(NOT, I32(5), I32(-6));
}
END_TEST

START_TEST(test_arith_i64) {
  BIN(ADD, I64(INT64_MAX), I64(1), I64(INT64_MIN));
  BIN(ADD, I64(0x100000000LL), I64(1), I64(0x100000001LL)); /* not cut to 32 bits */
  BIN(SUB, I64(INT64_MIN), I64(1), I64(INT64_MAX));
  BIN(MUL, I64(1LL << 32), I64(1LL << 32), I64(0));
  BIN(MUL, I64(INT64_MAX), I64(2), I64(-2));
  BIN(MUL, I64(1LL << 31), I64(4), I64(1LL << 33));
  BIN(DIV, I64(-7), I64(2), I64(-3));
  BIN(DIV, I64(5), I64(0), I64(0));
  BIN(DIV, I64(INT64_MIN), I64(-1), I64(INT64_MIN));
  BIN(REM, I64(-7), I64(2), I64(-1));
  BIN(REM, I64(5), I64(0), I64(0));
  BIN(REM, I64(INT64_MIN), I64(-1), I64(0));
  BIN(FLOORDIV, I64(-7), I64(2), I64(-4));
  BIN(FLOORDIV, I64(7), I64(-2), I64(-4));
  BIN(FLOORDIV, I64(INT64_MIN), I64(-1), I64(INT64_MIN));
  BIN(FLOORDIV, I64(5), I64(0), I64(0));
  BIN(FLOORMOD, I64(-7), I64(2), I64(1));
  BIN(FLOORMOD, I64(7), I64(-2), I64(-1));
  BIN(FLOORMOD, I64(INT64_MIN), I64(-1), I64(0));
  BIN(FLOORMOD, I64(INT64_MIN), I64(3), I64(1)); /* -2^63 = 3 * -3074457345618258603 + 1 */
  BIN(FLOORMOD, I64(5), I64(0), I64(0));
  BIN(MIN, I64(INT64_MIN), I64(0), I64(INT64_MIN));
  BIN(MAX, I64(-1), I64(1LL << 40), I64(1LL << 40));
  BIN(SHL, I64(1), I64(63), I64(INT64_MIN));
  BIN(SHL, I64(1), I64(64), I64(1));
  BIN(SHL, I64(1), I64(65), I64(2));
  BIN(SHL, I64(1), I64(40), I64(1LL << 40));
  BIN(SHR, I64(-16), I64(66), I64(-4));
  BIN(SHR, I64(INT64_MIN), I64(63), I64(-1));
  BIN(XOR, I64(-1), I64(0xFF), I64(~0xFFLL));
  BIN(LT, I64(INT64_MIN), I64(INT64_MAX), BOOL(1));
  UN(NEG, I64(INT64_MIN), I64(INT64_MIN));
  UN(ABS, I64(-(1LL << 40)), I64(1LL << 40));
  UN(NOT, I64(0), I64(-1));
}
END_TEST

START_TEST(test_arith_unsigned) {
  BIN(SUB, U32(0), U32(1), U32(0xFFFFFFFFu));
  BIN(ADD, U32(0xFFFFFFFFu), U32(2), U32(1));
  BIN(MUL, U32(0x10000u), U32(0x10000u), U32(0));
  BIN(DIV, U32(0xFFFFFFFFu), U32(2), U32(0x7FFFFFFFu));
  BIN(DIV, U32(7), U32(0), U32(0));
  BIN(REM, U32(0xFFFFFFFFu), U32(10), U32(5));
  BIN(REM, U32(7), U32(0), U32(0));
  BIN(FLOORDIV, U32(0xFFFFFFFFu), U32(2), U32(0x7FFFFFFFu));
  BIN(FLOORMOD, U32(0xFFFFFFFFu), U32(10), U32(5)); /* as i32 it would be -1 % 10 = 9 */
  BIN(FLOORMOD, U32(7), U32(0), U32(0));
  BIN(MIN, U32(1), U32(0xFFFFFFFFu), U32(1));
  BIN(MAX, U32(1), U32(0xFFFFFFFFu), U32(0xFFFFFFFFu));
  BIN(LT, U32(1), U32(0xFFFFFFFFu), BOOL(1));
  BIN(GE, U32(1), U32(0xFFFFFFFFu), BOOL(0));
  BIN(SHR, U32(0x80000000u), U32(31), U32(1)); /* logical */
  BIN(SHR, U32(0x80000000u), U32(63), U32(1));
  BIN(SHL, U32(3), U32(31), U32(0x80000000u));
  BIN(SHL, U32(3), U32(32), U32(3));
  UN(NEG, U32(1), U32(0xFFFFFFFFu));
  UN(ABS, U32(0xFFFFFFFFu), U32(0xFFFFFFFFu));
  UN(NOT, U32(0), U32(0xFFFFFFFFu));
  BIN(SUB, U64(0), U64(1), U64(UINT64_MAX));
  BIN(DIV, U64(UINT64_MAX), U64(2), U64(UINT64_MAX >> 1));
  BIN(FLOORMOD, U64(UINT64_MAX), U64(10), U64(5));
  BIN(FLOORDIV, U64(UINT64_MAX), U64(0), U64(0));
  BIN(SHR, U64(1ULL << 63), U64(63), U64(1));
  BIN(SHR, U64(1ULL << 63), U64(127), U64(1));
  BIN(LT, U64(1), U64(UINT64_MAX), BOOL(1));
  BIN(MAX, U64(1), U64(UINT64_MAX), U64(UINT64_MAX));
  BIN(MIN, U64(1), U64(UINT64_MAX), U64(1));
  BIN(MUL, U64(1ULL << 63), U64(2), U64(0));
}
END_TEST

START_TEST(test_arith_f32) {
  float nan = NAN, inf = INFINITY;
  BIN(ADD, F32(1.5f), F32(2.25f), F32(3.75f));
  BIN(ADD, F32(0.1f), F32(0.2f), F32(0.3f));
  BIN(ADD, F32(16777216.0f), F32(1.0f), F32(16777216.0f));
  BIN(SUB, F32(1.0f), F32(3.5f), F32(-2.5f));
  BIN(MUL, F32(1.5f), F32(-4.0f), F32(-6.0f));
  BIN(DIV, F32(1.0f), F32(4.0f), F32(0.25f));
  BIN(DIV, F32(1.0f), F32(3.0f), F32(0.333333343f));
  BIN(DIV, F32(1.0f), F32(0.0f), F32(inf));
  BIN(DIV, F32(-1.0f), F32(0.0f), F32(-inf));
  BIN(DIV, F32(0.0f), F32(0.0f), F32(nan));
  BIN(REM, F32(-7.5f), F32(2.0f), F32(-1.5f));
  BIN(REM, F32(7.5f), F32(-2.0f), F32(1.5f));
  BIN(FLOORDIV, F32(7.5f), F32(2.0f), F32(3.0f));
  BIN(FLOORDIV, F32(-7.5f), F32(2.0f), F32(-4.0f));
  BIN(FLOORDIV, F32(7.5f), F32(-2.0f), F32(-4.0f));
  BIN(FLOORDIV, F32(-7.5f), F32(-2.0f), F32(3.0f));
  BIN(FLOORMOD, F32(7.5f), F32(2.0f), F32(1.5f));
  BIN(FLOORMOD, F32(-7.5f), F32(2.0f), F32(0.5f));
  BIN(FLOORMOD, F32(7.5f), F32(-2.0f), F32(-0.5f));
  BIN(FLOORMOD, F32(-7.5f), F32(-2.0f), F32(-1.5f));
  BIN(FLOORMOD, F32(-4.0f), F32(2.0f), F32(-0.0f)); /* fmod's -0 is kept: r == 0 */
  BIN(MIN, F32(nan), F32(1.0f), F32(1.0f));
  BIN(MIN, F32(1.0f), F32(nan), F32(1.0f));
  BIN(MAX, F32(nan), F32(1.0f), F32(1.0f));
  BIN(MIN, F32(-2.0f), F32(1.0f), F32(-2.0f));
  BIN(MAX, F32(1.0f), F32(nan), F32(1.0f));
  BIN(MAX, F32(-2.0f), F32(1.0f), F32(1.0f));
  BIN(POW, F32(2.0f), F32(10.0f), F32(1024.0f));
  BIN(POW, F32(9.0f), F32(0.5f), F32(3.0f));
  BIN(ATAN2, F32(0.0f), F32(-1.0f), F32(3.14159274f));
  BIN(ATAN2, F32(1.0f), F32(1.0f), F32(0.785398185f));
  BIN(EQ, F32(nan), F32(nan), BOOL(0));
  BIN(NE, F32(nan), F32(nan), BOOL(1));
  BIN(LT, F32(nan), F32(1.0f), BOOL(0));
  BIN(GE, F32(nan), F32(1.0f), BOOL(0));
  BIN(LE, F32(-0.0f), F32(0.0f), BOOL(1));
  UN(NEG, F32(2.0f), F32(-2.0f));
  UN(ABS, F32(-3.0f), F32(3.0f));
  UN(SQRT, F32(2.0f), F32(1.41421354f));
  UN(SQRT, F32(-1.0f), F32(nan));
  UN(RSQRT, F32(4.0f), F32(0.5f));
  UN(RSQRT, F32(0.0f), F32(inf));
  /* 1 / sqrtf(x) in float, two IEEE roundings; rounding 1 / sqrt in double
   * once would give 0x1.6a09e4p+0 */
  UN(RSQRT, F32(0x1.000004p-1f), F32(0x1.6a09e2p+0f));
  UN(ROUND, F32(2.5f), F32(3.0f));
  UN(ROUND, F32(-2.5f), F32(-3.0f));
  UN(ROUND, F32(0.5f), F32(1.0f));
  UN(ROUND, F32(-0.5f), F32(-1.0f));
  UN(ROUND, F32(0.49999997f), F32(0.0f));
  UN(FLOOR, F32(-1.5f), F32(-2.0f));
  UN(CEIL, F32(-1.5f), F32(-1.0f));
  UN(EXP, F32(0.0f), F32(1.0f));
  UN(LOG, F32(1.0f), F32(0.0f));
  UN(SIN, F32(0.0f), F32(0.0f));
  UN(COS, F32(0.0f), F32(1.0f));
  UN(TAN, F32(0.0f), F32(0.0f));
  UN(ASIN, F32(1.0f), F32(1.57079637f));
  UN(ACOS, F32(1.0f), F32(0.0f));
  UN(ATAN, F32(1.0f), F32(0.785398185f));
  /* The float versions of libm, whatever they round to. */
  volatile float h = 0.7f;
  UN(SIN, F32(h), F32(sinf(h)));
  UN(COS, F32(h), F32(cosf(h)));
  UN(TAN, F32(h), F32(tanf(h)));
  UN(EXP, F32(h), F32(expf(h)));
  UN(LOG, F32(h), F32(logf(h)));
  UN(ASIN, F32(h), F32(asinf(h)));
  UN(ACOS, F32(h), F32(acosf(h)));
  UN(ATAN, F32(h), F32(atanf(h)));
  BIN(POW, F32(h), F32(3.3f), F32(powf(h, 3.3f)));
  BIN(ATAN2, F32(h), F32(-3.3f), F32(atan2f(h, -3.3f)));
  UN(RSQRT, F32(h), F32(1.0f / sqrtf(h)));
  /* Arguments where glibc's float functions differ from rounding the double
   * ones (volatile: the compiler must not fold these calls itself). */
  volatile float xs = 0x1.23e5e8p-7f, xe = 0x1.2c209p-7f, xl = 0x1.12933ep-7f;
  volatile float xp = 0x1.2ec04p-7f, xt = 0x1.936f96p-6f;
  UN(SIN, F32(xs), F32(sinf(xs)));
  UN(EXP, F32(xe), F32(expf(xe)));
  UN(LOG, F32(xl), F32(logf(xl)));
  UN(TAN, F32(xt), F32(tanf(xt)));
  BIN(POW, F32(xp), F32(3.3f), F32(powf(xp, 3.3f)));
}
END_TEST

START_TEST(test_arith_f64) {
  double nan = NAN, inf = INFINITY;
  BIN(ADD, F64(0.1), F64(0.2), F64(0.30000000000000004));
  BIN(SUB, F64(1.0), F64(3.5), F64(-2.5));
  BIN(MUL, F64(1e200), F64(1e200), F64(inf));
  BIN(DIV, F64(1.0), F64(3.0), F64(0.33333333333333331));
  BIN(DIV, F64(-1.0), F64(0.0), F64(-inf));
  BIN(REM, F64(-7.5), F64(2.0), F64(-1.5));
  BIN(FLOORDIV, F64(-7.5), F64(2.0), F64(-4.0));
  BIN(FLOORDIV, F64(7.5), F64(-2.0), F64(-4.0));
  BIN(FLOORMOD, F64(-7.5), F64(2.0), F64(0.5));
  BIN(FLOORMOD, F64(7.5), F64(-2.0), F64(-0.5));
  BIN(FLOORMOD, F64(-7.5), F64(-2.0), F64(-1.5));
  BIN(FLOORMOD, F64(1.0), F64(0.0), F64(nan));
  BIN(MIN, F64(nan), F64(-1.0), F64(-1.0));
  BIN(MAX, F64(nan), F64(-1.0), F64(-1.0));
  BIN(POW, F64(2.0), F64(-2.0), F64(0.25));
  BIN(ATAN2, F64(0.0), F64(-1.0), F64(3.141592653589793));
  BIN(GT, F64(1.0), F64(nan), BOOL(0));
  BIN(NE, F64(1.0), F64(nan), BOOL(1));
  UN(SQRT, F64(2.0), F64(1.4142135623730951));
  UN(RSQRT, F64(0.25), F64(2.0));
  UN(ROUND, F64(-2.5), F64(-3.0));
  UN(ROUND, F64(2.4999999999999996), F64(2.0));
  UN(FLOOR, F64(-0.5), F64(-1.0));
  UN(CEIL, F64(-0.5), F64(-0.0));
  UN(ABS, F64(-0.0), F64(0.0));
  UN(NEG, F64(0.0), F64(-0.0));
  volatile double h = 0.7;
  UN(SIN, F64(h), F64(sin(h)));
  UN(EXP, F64(h), F64(exp(h)));
  UN(LOG, F64(h), F64(log(h)));
  UN(ATAN, F64(h), F64(atan(h)));
  UN(RSQRT, F64(h), F64(1.0 / sqrt(h)));
  BIN(POW, F64(h), F64(3.3), F64(pow(h, 3.3)));
}
END_TEST

START_TEST(test_bool_select) {
  BIN(AND, BOOL(1), BOOL(0), BOOL(0));
  BIN(OR, BOOL(1), BOOL(0), BOOL(1));
  BIN(XOR, BOOL(1), BOOL(1), BOOL(0));
  BIN(EQ, BOOL(1), BOOL(1), BOOL(1));
  BIN(LT, BOOL(0), BOOL(1), BOOL(1));
  UN(NOT, BOOL(1), BOOL(0));
  UN(NOT, BOOL(0), BOOL(1));
  fb_value s1[3] = {BOOL(1), F32(1.5f), F32(-2.0f)};
  expect_value(eval(FB_OP_SELECT, FB_T_VOID, s1, 3), F32(1.5f), __LINE__, "select true");
  fb_value s2[3] = {BOOL(0), I64(1), I64(-(1LL << 40))};
  expect_value(eval(FB_OP_SELECT, FB_T_VOID, s2, 3), I64(-(1LL << 40)), __LINE__, "select false");
}
END_TEST

START_TEST(test_casts) {
  CAST(F32(NAN), I32, I32(0));
  CAST(F32(1e20f), I32, I32(INT32_MAX));
  CAST(F32(-1e20f), I32, I32(INT32_MIN));
  CAST(F32(3.9f), I32, I32(3));
  CAST(F32(-3.9f), I32, I32(-3));
  CAST(F64(2147483647.9), I32, I32(INT32_MAX));
  CAST(F64(1e20), I64, I64(INT64_MAX));
  CAST(F64(-1e20), I64, I64(INT64_MIN));
  CAST(F64(NAN), I64, I64(0));
  CAST(F32(-1.0f), U32, U32(0));
  CAST(F64(5e9), U32, U32(0xFFFFFFFFu));
  CAST(F32(NAN), U64, U64(0));
  CAST(F64(1e30), U64, U64(UINT64_MAX));
  CAST(I32(-1), U32, U32(0xFFFFFFFFu));
  CAST(I32(-1), U64, U64(UINT64_MAX));
  CAST(I32(-1), I64, I64(-1));
  CAST(U32(0xFFFFFFFFu), I64, I64(4294967295LL));
  CAST(U32(0xFFFFFFFFu), I32, I32(-1));
  CAST(I64(0x100000005LL), I32, I32(5));
  CAST(I32(16777217), F32, F32(16777216.0f));
  CAST(U64(UINT64_MAX), F32, F32(18446744073709551616.0f));
  CAST(U64(UINT64_MAX), F64, F64(18446744073709551616.0));
  CAST(I64(-3), F64, F64(-3.0));
  CAST(F64(0.1), F32, F32(0.1f));
  CAST(F32(0.1f), F64, F64(0.100000001490116119384765625));
  CAST(I32(7), BOOL, BOOL(1));
  CAST(I32(0), BOOL, BOOL(0));
  CAST(F32(0.5f), BOOL, BOOL(1));
  CAST(BOOL(1), F32, F32(1.0f));
  CAST(BOOL(1), I64, I64(1));
}
END_TEST

/* ---------------------------------------------------------------- errors and interface */

/* x[n] = 77; y[0] = x[n]; y[1] = 5: an out-of-range n skips the store and
 * the load (0) but the kernel carries on; 2-D indices are checked per axis. */
START_TEST(test_bounds) {
  fb_layout *l = fb_layout_new();
  int d = add_node(l, 0, FB_SN_DENSE, "i", 8, 0);
  int x = place(l, d, "x", FB_T_I32), y = place(l, d, "y", FB_T_I32);
  int d2 = add_node(l, 0, FB_SN_DENSE, "ij", 3, 4);
  int m = place(l, d2, "m", FB_T_F32);
  finalize(l);
  fb_type pt[2] = {FB_T_I32, FB_T_I32};
  fb_kernel *k = fb_kernel_new(l, "oob", 2, pt, FB_T_I32);
  fb_builder b;
  fb_builder_init(&b, k);
  int n = fb_b_arg(&b, 0), n2 = fb_b_arg(&b, 1);
  fb_b_store(&b, x, &n, 1, fb_b_const_i32(&b, 77));
  int zero = fb_b_const_i32(&b, 0), one = fb_b_const_i32(&b, 1);
  fb_b_store(&b, y, &zero, 1, fb_b_load(&b, x, &n, 1));
  int old = fb_b_global(&b, FB_OP_ATOMIC_ADD, x, &n, 1, fb_b_const_i32(&b, 1000));
  fb_b_store(&b, y, &one, 1, fb_b_const_i32(&b, 5));
  int ij[2] = {zero, n2};
  fb_b_store(&b, m, ij, 2, fb_b_const_f32(&b, 9.0f));
  fb_b_ret(&b, old, 0);
  built(&b);

  fb_interp *in = new_interp(l, 0);
  int32_t *xs = fb_interp_field(in, x), *ys = fb_interp_field(in, y);
  float *ms = fb_interp_field(in, m);
  int bad_n[] = {8, -1, 1000000, INT32_MIN};
  fb_value ret;
  for (int t = 0; t < 4; t++) {
    fb_value a[2] = {I32(bad_n[t]), I32(0)};
    ys[0] = 123;
    ck_assert_int_eq(run(in, k, a, 2, &ret), FB_EBOUNDS);
    ck_assert_str_ne(fb_interp_errmsg(in), "");
    for (int e = 0; e < 8; e++) ck_assert_int_eq(xs[e], 0);
    ck_assert_int_eq(ys[0], 0); /* the skipped load read 0 */
    ck_assert_int_eq(ys[1], 5); /* the kernel went on */
    expect_value(ret, I32(0), __LINE__, "skipped atomic");
    for (int e = 2; e < 8; e++) ck_assert_int_eq(ys[e], 0);
  }
  /* m[0, 4]: the flat offset 4 exists (m[1, 0]) but j = 4 is out of range */
  ck_assert(ms[0] == 9.0f);
  fb_value a[2] = {I32(3), I32(4)};
  ck_assert_int_eq(run(in, k, a, 2, &ret), FB_EBOUNDS);
  for (int e = 1; e < 12; e++) ck_assert(ms[e] == 0.0f);
  ck_assert_int_eq(xs[3], 1077); /* the in-bounds part ran */
  ck_assert_int_eq(ys[0], 77);
  expect_value(ret, I32(77), __LINE__, "atomic old value");
  /* a clean run reports no error: the latch is per run */
  a[1] = I32(3);
  ck_assert_int_eq(run(in, k, a, 2, &ret), 0);
  ck_assert(ms[3] == 9.0f);
  ck_assert_int_eq(xs[3], 1077); /* stored 77 again, then added 1000 */
  fb_interp_free(in);
  fb_kernel_free(k);
  fb_layout_free(l);
}
END_TEST

/* ret stores slot 0 and the kernel keeps running; the last ret wins; a
 * kernel that never reaches ret returns 0 of its type. */
START_TEST(test_return) {
  fb_layout *l = fb_layout_new();
  int z = place(l, 0, "z", FB_T_I32);
  finalize(l);
  fb_kernel *k = fb_kernel_new(l, "rets", 0, NULL, FB_T_I32);
  fb_builder b;
  fb_builder_init(&b, k);
  fb_b_ret(&b, fb_b_const_i32(&b, 1), 0);
  fb_b_store(&b, z, NULL, 0, fb_b_const_i32(&b, 42));
  fb_b_ret(&b, fb_b_load(&b, z, NULL, 0), 0);
  built(&b);
  fb_kernel *k2 = fb_kernel_new(l, "noret", 0, NULL, FB_T_F64);
  fb_builder_init(&b, k2);
  int c = fb_b_if(&b, fb_b_const_bool(&b, 0), 0);
  int saved = fb_b_enter(&b, body(&b, c));
  fb_b_ret(&b, fb_b_const_f64(&b, 3.0), 0);
  fb_b_leave(&b, saved);
  built(&b);
  fb_kernel *k3 = fb_kernel_new(l, "void", 0, NULL, FB_T_VOID);

  fb_interp *in = new_interp(l, 0);
  fb_value ret;
  ck_assert_int_eq(run(in, k, NULL, 0, &ret), 0);
  expect_value(ret, I32(42), __LINE__, "last ret");
  ck_assert_int_eq(run(in, k, NULL, 0, NULL), 0); /* ret may be NULL */
  ck_assert_int_eq(run(in, k2, NULL, 0, &ret), 0);
  expect_value(ret, F64(0.0), __LINE__, "no ret reached");
  ck_assert_int_eq(run(in, k3, NULL, 0, &ret), 0); /* an empty kernel runs */
  ck_assert_int_eq(ret.type, FB_T_VOID);
  fb_interp_free(in);
  fb_kernel_free(k);
  fb_kernel_free(k2);
  fb_kernel_free(k3);
  fb_layout_free(l);
}
END_TEST

/* gtmp values written by one run are read by the next, and the buffer is
 * visible through fb_interp_scratch. */
START_TEST(test_gtmp) {
  fb_layout *l = fb_layout_new();
  finalize(l);
  fb_kernel *w = fb_kernel_new(l, "write", 0, NULL, FB_T_VOID);
  fb_builder b;
  fb_builder_init(&b, w);
  fb_b_gtmp_store(&b, fb_b_const_i32(&b, -5), 0);
  fb_b_gtmp_store(&b, fb_b_const_f64(&b, 2.5), 8);
  fb_b_gtmp_store(&b, fb_b_const_f32(&b, 0.75f), 200);
  built(&b);
  fb_kernel *r = fb_kernel_new(l, "read", 0, NULL, FB_T_F64);
  fb_builder_init(&b, r);
  int i = fb_b_cast(&b, FB_T_F64, fb_b_gtmp_load(&b, FB_T_I32, 0));
  int f = fb_b_cast(&b, FB_T_F64, fb_b_gtmp_load(&b, FB_T_F32, 200));
  int sum =
      fb_b_binary(&b, FB_OP_ADD, fb_b_binary(&b, FB_OP_ADD, i, fb_b_gtmp_load(&b, FB_T_F64, 8)), f);
  fb_b_ret(&b, sum, 0);
  built(&b);

  fb_interp *in = new_interp(l, 0);
  size_t bytes = 99;
  fb_interp_scratch(in, &bytes);
  ck_assert_uint_eq(bytes, 0);
  fb_value ret;
  ck_assert_int_eq(run(in, r, NULL, 0, &ret), 0); /* unwritten scratch reads 0 */
  expect_value(ret, F64(0.0), __LINE__, "fresh scratch");
  ck_assert_int_eq(run(in, w, NULL, 0, NULL), 0);
  ck_assert_int_eq(run(in, r, NULL, 0, &ret), 0);
  expect_value(ret, F64(-5.0 + 2.5 + 0.75), __LINE__, "scratch across runs");
  uint8_t *s = fb_interp_scratch(in, &bytes);
  ck_assert_ptr_nonnull(s);
  ck_assert_uint_ge(bytes, 208);
  int32_t iv;
  double dv;
  float fv;
  memcpy(&iv, s, 4);
  memcpy(&dv, s + 8, 8);
  memcpy(&fv, s + 200, 4);
  ck_assert_int_eq(iv, -5);
  ck_assert(dv == 2.5 && fv == 0.75f);
  fb_interp_free(in);
  fb_kernel_free(w);
  fb_kernel_free(r);
  fb_layout_free(l);
}
END_TEST

/* rand() keyed by (seed, launch, site, iteration, count) exactly as ir.h
 * says: serial runs count from 0 between parallel loops; par_for iterations
 * are index - begin; struct_for iterations are linear cell numbers. */
enum {
  RN = 64
};

static fb_kernel *rand_kernel(fb_layout *l, int x, int y, int s, int z) {
  fb_kernel *k = fb_kernel_new(l, "rand", 0, NULL, FB_T_VOID);
  fb_builder b;
  fb_builder_init(&b, k);
  int c[8];
  for (int n = 0; n < 8; n++) c[n] = fb_b_const_i32(&b, n);
  fb_b_store(&b, s, &c[0], 1, fb_b_rand(&b, 1)); /* count 0 */
  fb_b_store(&b, s, &c[1], 1, fb_b_rand(&b, 1)); /* count 1 */
  int saved, s2;
  int sl = open_range(&b, 0, 3, 0, &saved);      /* serial: counts 2, 3, 4 */
  int j = fb_b_binary(&b, FB_OP_ADD, fb_b_loop_index(&b, sl, 0), c[2]);
  fb_b_store(&b, s, &j, 1, fb_b_rand(&b, 2));
  fb_b_leave(&b, saved);
  int pl = open_range(&b, 10, 10 + RN, 1, &saved); /* iter = i - 10 */
  int i = fb_b_binary(&b, FB_OP_SUB, fb_b_loop_index(&b, pl, 0), c[0]);
  int xi = fb_b_binary(&b, FB_OP_SUB, i, fb_b_const_i32(&b, 10));
  fb_b_store(&b, x, &xi, 1, fb_b_rand(&b, 3));
  int il = open_range(&b, 0, 2, 0, &s2); /* counts 1, 2 of the iteration */
  int yi =
      fb_b_binary(&b, FB_OP_ADD, fb_b_binary(&b, FB_OP_MUL, xi, c[2]), fb_b_loop_index(&b, il, 0));
  fb_b_store(&b, y, &yi, 1, fb_b_rand(&b, 4));
  fb_b_leave(&b, s2);
  fb_b_leave(&b, saved);
  fb_b_store(&b, s, &c[5], 1, fb_b_rand(&b, 1)); /* a new serial run: count 0 */
  int sf = fb_b_struct_for(&b, z);
  saved = fb_b_enter(&b, body(&b, sf));
  int ij[2] = {fb_b_loop_index(&b, sf, 0), fb_b_loop_index(&b, sf, 1)};
  fb_b_store(&b, z, ij, 2, fb_b_rand(&b, 5));
  fb_b_leave(&b, saved);
  ck_assert_int_eq(b.err, 0);
  return k;
}

static float key(uint64_t seed, uint64_t launch, uint64_t site, uint64_t iter, uint64_t count) {
  return fb_rand_f32(fb_rand_bits(seed, launch, site, iter, count));
}

static void check_rand(fb_interp *in, int x, int y, int s, int z, uint64_t seed, uint64_t launch) {
  float *xs = fb_interp_field(in, x), *ys = fb_interp_field(in, y);
  float *ss = fb_interp_field(in, s), *zs = fb_interp_field(in, z);
  ck_assert(ss[0] == key(seed, launch, 1, 0, 0));
  ck_assert(ss[1] == key(seed, launch, 1, 0, 1));
  for (int n = 0; n < 3; n++) ck_assert(ss[2 + n] == key(seed, launch, 2, 0, 2 + (uint64_t)n));
  ck_assert(ss[5] == key(seed, launch, 1, 0, 0));
  for (int n = 0; n < RN; n++) {
    ck_assert_msg(xs[n] == key(seed, launch, 3, (uint64_t)n, 0), "x[%d]", n);
    ck_assert(ys[2 * n] == key(seed, launch, 4, (uint64_t)n, 1));
    ck_assert(ys[2 * n + 1] == key(seed, launch, 4, (uint64_t)n, 2));
  }
  for (int n = 0; n < 12; n++) ck_assert(zs[n] == key(seed, launch, 5, (uint64_t)n, 0));
  float all[RN * 3 + 6 + 12];
  int na = 0;
  for (int n = 0; n < RN; n++) all[na++] = xs[n];
  for (int n = 0; n < 2 * RN; n++) all[na++] = ys[n];
  for (int n = 0; n < 6; n++) all[na++] = ss[n];
  for (int n = 0; n < 12; n++) all[na++] = zs[n];
  for (int n = 0; n < na; n++) ck_assert_msg(all[n] >= 0.0f && all[n] < 1.0f, "rand %g", all[n]);
}

START_TEST(test_rand) {
  fb_layout *l = fb_layout_new();
  int d = add_node(l, 0, FB_SN_DENSE, "i", 2 * RN, 0);
  int x = place(l, d, "x", FB_T_F32), y = place(l, d, "y", FB_T_F32),
      s = place(l, d, "s", FB_T_F32);
  int d2 = add_node(l, 0, FB_SN_DENSE, "ij", 3, 4);
  int z = place(l, d2, "z", FB_T_F32);
  finalize(l);
  fb_kernel *k = rand_kernel(l, x, y, s, z);
  fb_interp *a = new_interp(l, 42), *b = new_interp(l, 42), *c = new_interp(l, 43);
  ck_assert_int_eq(run(a, k, NULL, 0, NULL), 0);
  check_rand(a, x, y, s, z, 42, 0);
  float first[RN];
  memcpy(first, fb_interp_field(a, x), sizeof first);
  ck_assert_int_eq(run(b, k, NULL, 0, NULL), 0); /* same seed, same launch */
  ck_assert_int_eq(memcmp(first, fb_interp_field(b, x), sizeof first), 0);
  ck_assert_int_eq(run(c, k, NULL, 0, NULL), 0); /* another seed */
  check_rand(c, x, y, s, z, 43, 0);
  ck_assert(memcmp(first, fb_interp_field(c, x), sizeof first) != 0);
  ck_assert_int_eq(run(a, k, NULL, 0, NULL), 0); /* the next launch */
  check_rand(a, x, y, s, z, 42, 1);
  const float *second = fb_interp_field(a, x);
  int differ = 0;
  for (int n = 0; n < RN; n++) differ += first[n] != second[n];
  ck_assert_int_ge(differ, RN - 2);
  fb_interp_set_launch(a, 0); /* replaying launch 0 gives its numbers again */
  ck_assert_int_eq(run(a, k, NULL, 0, NULL), 0);
  check_rand(a, x, y, s, z, 42, 0);
  ck_assert_int_eq(memcmp(first, fb_interp_field(a, x), sizeof first), 0);
  ck_assert_int_eq(run(a, k, NULL, 0, NULL), 0); /* and counting goes on from there */
  check_rand(a, x, y, s, z, 42, 1);
  /* the values are spread over [0, 1), not stuck */
  float lo = 1, hi = 0;
  for (int n = 0; n < RN; n++) {
    lo = fminf(lo, first[n]);
    hi = fmaxf(hi, first[n]);
  }
  ck_assert(lo < 0.25f && hi > 0.75f);
  fb_interp_free(a);
  fb_interp_free(b);
  fb_interp_free(c);
  fb_kernel_free(k);
  fb_layout_free(l);
}
END_TEST

/* Sparse layouts run (tests/test_interp_sparse.c covers them in depth):
 * stores land in the flat arrays and activate, struct_for visits the active
 * cells only; dense is_active and activate work; deactivate needs a sparse
 * SNode (the verifier refuses a dense one). */
static fb_kernel *store_kernel(const fb_layout *l, int first, int second) {
  fb_kernel *k = fb_kernel_new(l, "st", 0, NULL, FB_T_VOID);
  fb_builder b;
  fb_builder_init(&b, k);
  int i = fb_b_const_i32(&b, 1);
  fb_b_store(&b, first, &i, 1, fb_b_const_f32(&b, 1.0f));
  if (second >= 0) fb_b_store(&b, second, &i, 1, fb_b_const_f32(&b, 2.0f));
  ck_assert_int_eq(b.err, 0);
  return k;
}

static fb_kernel *sparse_op_kernel(const fb_layout *l, fb_op op, int sn, fb_type ret) {
  fb_kernel *k = fb_kernel_new(l, "sp", 0, NULL, ret);
  fb_builder b;
  fb_builder_init(&b, k);
  int i = fb_b_const_i32(&b, 2);
  int id = op == FB_OP_STRUCT_FOR ? fb_b_struct_for(&b, sn) : fb_b_global(&b, op, sn, &i, 1, -1);
  if (ret != FB_T_VOID) fb_b_ret(&b, id, 0);
  ck_assert_int_eq(b.err, 0);
  return k;
}

START_TEST(test_sparse_runs) {
  fb_layout *l = fb_layout_new();
  int dd = add_node(l, 0, FB_SN_DENSE, "i", 4, 0);
  int d = place(l, dd, "d", FB_T_F32);
  int ptr = add_node(l, 0, FB_SN_POINTER, "i", 4, 0);
  int pd = add_node(l, ptr, FB_SN_DENSE, "i", 4, 0);
  int p = place(l, pd, "p", FB_T_F32);
  int bm = add_node(l, 0, FB_SN_BITMASKED, "i", 8, 0);
  int bf = place(l, bm, "bf", FB_T_F32);
  int dy = add_node(l, 0, FB_SN_DYNAMIC, "i", 16, 0);
  int df = place(l, dy, "df", FB_T_F32);
  finalize(l);
  fb_interp *in = new_interp(l, 0);
  ck_assert_int_eq(fb_field_numel(l, p), 16);
  float *ds = fb_interp_field(in, d);

  fb_kernel *k = store_kernel(l, d, -1);
  ck_assert_int_eq(run(in, k, NULL, 0, NULL), 0);
  ck_assert(ds[1] == 1.0f);
  fb_kernel_free(k);
  ds[1] = 0;
  int sparse_fields[3] = {p, bf, df};
  for (int t = 0; t < 3; t++) {
    k = store_kernel(l, d, sparse_fields[t]);
    ck_assert_int_eq(run(in, k, NULL, 0, NULL), 0);
    ck_assert(ds[1] == 1.0f);
    ck_assert(((float *)fb_interp_field(in, sparse_fields[t]))[1] == 2.0f);
    ds[1] = 0;
    fb_kernel_free(k);
  }
  /* cell 2 of each sparse node is inactive: element 1 lives in pointer cell
   * 0, bitmasked cell 1, and the dynamic list has length 2 */
  int sparse_nodes[3] = {ptr, bm, dy};
  int want[3] = {0, 0, 0};
  for (int t = 0; t < 3; t++) {
    fb_value ret;
    k = sparse_op_kernel(l, FB_OP_STRUCT_FOR, sparse_nodes[t], FB_T_VOID);
    ck_assert_int_eq(run(in, k, NULL, 0, NULL), 0);
    fb_kernel_free(k);
    k = sparse_op_kernel(l, FB_OP_IS_ACTIVE, sparse_nodes[t], FB_T_BOOL);
    ck_assert_int_eq(run(in, k, NULL, 0, &ret), 0);
    expect_value(ret, BOOL(want[t]), __LINE__, "is_active on a sparse SNode");
    fb_kernel_free(k);
  }
  k = sparse_op_kernel(l, FB_OP_IS_ACTIVE, p, FB_T_BOOL);
  fb_value ret;
  ck_assert_int_eq(run(in, k, NULL, 0, &ret), 0);
  expect_value(ret, BOOL(1), __LINE__, "is_active on a field in an active pointer block");
  fb_kernel_free(k);
  k = sparse_op_kernel(l, FB_OP_DEACTIVATE, dd, FB_T_VOID);
  ck_assert_int_eq(fb_interp_run(in, k, NULL, 0, NULL), FB_EVERIFY);
  ck_assert_ptr_nonnull(strstr(fb_interp_errmsg(in), "deactivate needs a sparse SNode"));
  fb_kernel_free(k);
  k = sparse_op_kernel(l, FB_OP_IS_ACTIVE, dd, FB_T_BOOL);
  ck_assert_int_eq(run(in, k, NULL, 0, &ret), 0);
  expect_value(ret, BOOL(1), __LINE__, "is_active on dense");
  fb_kernel_free(k);
  k = sparse_op_kernel(l, FB_OP_ACTIVATE, dd, FB_T_VOID);
  ck_assert_int_eq(run(in, k, NULL, 0, NULL), 0);
  fb_kernel_free(k);
  fb_interp_free(in);
  fb_layout_free(l);
}
END_TEST

/* Arguments are converted to the parameter types when the kinds agree;
 * wrong counts or kinds give FB_ETYPE. */
START_TEST(test_args) {
  fb_layout *l = fb_layout_new();
  finalize(l);
  fb_type pt[2] = {FB_T_I32, FB_T_F32};
  fb_kernel *k = fb_kernel_new(l, "args", 2, pt, FB_T_F32);
  fb_builder b;
  fb_builder_init(&b, k);
  int s = fb_b_binary(&b, FB_OP_ADD, fb_b_cast(&b, FB_T_F32, fb_b_arg(&b, 0)), fb_b_arg(&b, 1));
  fb_b_ret(&b, s, 0);
  built(&b);
  fb_interp *in = new_interp(l, 0);
  fb_value ret;
  fb_value a[3] = {I64(0x100000005LL), F64(0.1), I32(0)}; /* i64 -> i32 wraps; f64 -> f32 rounds */
  ck_assert_int_eq(run(in, k, a, 2, &ret), 0);
  volatile float want = 5.0f + 0.1f;
  expect_value(ret, F32(want), __LINE__, "converted args");
  ck_assert_int_eq(fb_interp_run(in, k, a, 1, &ret), FB_ETYPE);
  ck_assert_int_eq(fb_interp_run(in, k, a, 3, &ret), FB_ETYPE);
  fb_value wrong1[2] = {F32(1.0f), F32(1.0f)};
  ck_assert_int_eq(fb_interp_run(in, k, wrong1, 2, &ret), FB_ETYPE);
  fb_value wrong2[2] = {I32(1), I32(1)};
  ck_assert_int_eq(fb_interp_run(in, k, wrong2, 2, &ret), FB_ETYPE);
  fb_value wrong3[2] = {BOOL(1), F32(1.0f)};
  ck_assert_int_eq(fb_interp_run(in, k, wrong3, 2, &ret), FB_ETYPE);
  ck_assert_str_ne(fb_interp_errmsg(in), "");
  fb_interp_free(in);
  fb_kernel_free(k);
  fb_layout_free(l);
}
END_TEST

/* Malformed IR and mismatched layouts are refused with an error, no crash. */
START_TEST(test_malformed) {
  fb_layout *l = fb_layout_new();
  int d = add_node(l, 0, FB_SN_DENSE, "i", 4, 0);
  int x = place(l, d, "x", FB_T_I32);
  finalize(l);
  fb_layout *other = fb_layout_new();
  place(other, add_node(other, 0, FB_SN_DENSE, "i", 5, 0), "w", FB_T_I32);
  finalize(other);
  fb_interp *in = new_interp(l, 0);
  ck_assert_ptr_null(fb_interp_field(in, 99));
  ck_assert_ptr_null(fb_interp_field(in, -1));

  fb_kernel *k = fb_kernel_new(l, "bad", 0, NULL, FB_T_VOID);
  fb_builder b;
  fb_builder_init(&b, k);
  int c = fb_b_const_i32(&b, 1);
  fb_b_binary(&b, FB_OP_ADD, c, 999); /* operand out of range */
  int rc = fb_interp_run(in, k, NULL, 0, NULL);
  ck_assert_msg(rc == FB_EVERIFY || rc == FB_EINVAL, "rc %d", rc);
  ck_assert_str_ne(fb_interp_errmsg(in), "");
  fb_kernel_free(k);

  k = fb_kernel_new(l, "badstore", 0, NULL, FB_T_VOID);
  fb_builder_init(&b, k);
  c = fb_b_const_i32(&b, 1);
  fb_b_store(&b, x, &c, 1, fb_b_const_f32(&b, 1.0f)); /* f32 into an i32 field */
  fb_b_break(&b); /* outside a loop */
  rc = fb_interp_run(in, k, NULL, 0, NULL);
  ck_assert_msg(rc == FB_EVERIFY || rc == FB_EINVAL, "rc %d", rc);
  ck_assert_int_eq(((int32_t *)fb_interp_field(in, x))[1], 0);
  fb_kernel_free(k);

  k = fb_kernel_new(other, "other", 0, NULL, FB_T_VOID);
  ck_assert_int_eq(fb_interp_run(in, k, NULL, 0, NULL), FB_EINVAL);
  fb_kernel_free(k);
  ck_assert_int_eq(fb_interp_run(in, NULL, NULL, 0, NULL), FB_EINVAL);
  ck_assert_int_eq(fb_interp_run(NULL, NULL, NULL, 0, NULL), FB_EINVAL);

  fb_layout *unfinished = fb_layout_new();
  ck_assert_ptr_null(fb_interp_new(unfinished, 0));
  fb_layout_free(unfinished);
  fb_interp_free(NULL);
  fb_interp_free(in);
  fb_layout_free(other);
  fb_layout_free(l);
}
END_TEST

/* An endless while (no break) stops at the step budget with FB_EQUOTA and
 * says so; its effects so far stay, and without a limit (the default) a
 * bounded loop runs as before. */
START_TEST(test_step_budget) {
  fb_layout *l = fb_layout_new();
  int n = place(l, 0, "n", FB_T_I32);
  finalize(l);
  fb_kernel *k = fb_kernel_new(l, "forever", 0, NULL, FB_T_VOID);
  fb_builder b;
  fb_builder_init(&b, k);
  int w = fb_b_while(&b);
  int saved = fb_b_enter(&b, body(&b, w));
  fb_b_global(&b, FB_OP_ATOMIC_ADD, n, NULL, 0, fb_b_const_i32(&b, 1));
  fb_b_leave(&b, saved);
  built(&b);
  fb_interp *in = new_interp(l, 1);
  fb_interp_set_step_limit(in, 1000);
  int rc = fb_interp_run(in, k, NULL, 0, NULL);
  ck_assert_int_eq(rc, FB_EQUOTA);
  ck_assert_msg(strstr(fb_interp_errmsg(in), "exceeded its step budget of 1000 steps") != NULL,
                "message: %s", fb_interp_errmsg(in));
  ck_assert_msg(strstr(fb_interp_errmsg(in), "forever") != NULL, "message: %s",
                fb_interp_errmsg(in));
  int32_t got = *(int32_t *)fb_interp_field(in, n);
  ck_assert_int_gt(got, 0); /* it ran ... */
  ck_assert_int_lt(got, 1000); /* ... and stopped within the budget */
  /* a long but finite range loop fits a large budget, and with none */
  fb_kernel *k2 = fb_kernel_new(l, "count", 0, NULL, FB_T_VOID);
  fb_builder_init(&b, k2);
  open_range(&b, 0, 5000, 0, &saved);
  fb_b_global(&b, FB_OP_ATOMIC_ADD, n, NULL, 0, fb_b_const_i32(&b, 1));
  fb_b_leave(&b, saved);
  built(&b);
  *(int32_t *)fb_interp_field(in, n) = 0;
  ck_assert_int_eq(fb_interp_run(in, k2, NULL, 0, NULL), FB_EQUOTA);
  *(int32_t *)fb_interp_field(in, n) = 0;
  fb_interp_set_step_limit(in, 1000000);
  ck_assert_int_eq(run(in, k2, NULL, 0, NULL), 0);
  ck_assert_int_eq(*(int32_t *)fb_interp_field(in, n), 5000);
  fb_interp_set_step_limit(in, 0);
  ck_assert_int_eq(run(in, k2, NULL, 0, NULL), 0);
  ck_assert_int_eq(*(int32_t *)fb_interp_field(in, n), 10000);
  ck_assert_str_eq(fb_interp_errmsg(in), "");
  fb_interp_free(in);
  fb_kernel_free(k2);
  fb_kernel_free(k);
  fb_layout_free(l);
}
END_TEST

static Suite *interp_suite(void) {
  Suite *s = suite_create("interp");
  TCase *tc = tcase_create("core");
  tcase_add_test(tc, test_map_par_for);
  tcase_add_test(tc, test_struct_for_2d);
  tcase_add_test(tc, test_nested_dense);
  tcase_add_test(tc, test_reductions);
  tcase_add_test(tc, test_while_break_continue);
  tcase_add_test(tc, test_if_else_locals);
  tcase_add_test(tc, test_arith_i32);
  tcase_add_test(tc, test_arith_i64);
  tcase_add_test(tc, test_arith_unsigned);
  tcase_add_test(tc, test_arith_f32);
  tcase_add_test(tc, test_arith_f64);
  tcase_add_test(tc, test_bool_select);
  tcase_add_test(tc, test_casts);
  tcase_add_test(tc, test_bounds);
  tcase_add_test(tc, test_return);
  tcase_add_test(tc, test_gtmp);
  tcase_add_test(tc, test_rand);
  tcase_add_test(tc, test_sparse_runs);
  tcase_add_test(tc, test_args);
  tcase_add_test(tc, test_malformed);
  tcase_add_test(tc, test_step_budget);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) { return fbt_run(interp_suite()); }
