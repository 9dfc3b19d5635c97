/* The in-process engine through its public API only (sync mode; async mode
 * is tests/test_async.c): kernels built with the builder, run on the CPU
 * device and checked against the reference interpreter or against values
 * computed here; counters; host field access; the timeline; and every
 * error path, each followed by a launch that must still work. */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "fusebox/engine.h"
#include "fusebox/ir.h"
#include "support.h"

static fb_engine *eng;

static void setup(void) {
  fb_engine_config cfg = {fbt_backend(), 0, 2};
  char err[256];
  ck_assert_int_eq(fb_engine_create(&cfg, &eng, err, sizeof err), 0);
}

static void teardown(void) {
  fb_engine_destroy(eng);
  eng = NULL;
}

/* ---------------------------------------------------------------- helpers */

static fb_layout *finalize(fb_layout *l) {
  char err[256];
  ck_assert_msg(fb_layout_finalize(l, err, sizeof err) == 0, "finalize: %s", err);
  return l;
}

static int dense(fb_layout *l, int parent, const char *axes, int64_t a, int64_t b) {
  int64_t sz[2] = {a, b};
  int id = fb_layout_add(l, parent, FB_SN_DENSE, axes, sz, 0, NULL);
  ck_assert_int_ge(id, 0);
  return id;
}

static int place(fb_layout *l, int parent, const char *name, fb_type t) {
  int id = fb_layout_place(l, parent, name, t);
  ck_assert_int_ge(id, 0);
  return id;
}

static fb_session *new_session(const fb_layout *l, uint64_t seed, uint64_t limit) {
  fb_session_config sc = {.mode = "sync", .seed = seed, .memory_limit = limit};
  fb_session *s = NULL;
  ck_assert_int_eq(fb_session_create(eng, &sc, l, &s, NULL, 0), 0);
  return s;
}

/* Open a top-level par_for over [0, n) and enter its body; returns the loop. */
static int par_for(fb_builder *b, int n, int *saved) {
  int lo = fb_b_const_i32(b, 0), hi = fb_b_const_i32(b, n);
  int loop = fb_b_range_for(b, lo, hi, 1);
  ck_assert_int_ge(loop, 0);
  *saved = fb_b_enter(b, b->k->stmts[loop].body);
  return loop;
}

static int add_kernel(fb_session *s, const fb_kernel *k) {
  int id = fb_session_add_kernel(s, k);
  ck_assert_msg(id >= 0, "add_kernel %s: %s (%s)", k->name, fb_strerror(id), fb_session_errmsg(s));
  return id;
}

static void launch_ok(fb_session *s, int kid, const fb_value *args, int nargs, fb_value *ret) {
  int rc = fb_launch(s, kid, args, nargs, ret);
  ck_assert_msg(rc == 0, "launch: %s (%s)", fb_strerror(rc), fb_session_errmsg(s));
}

static void interp_ok(fb_interp *in, const fb_kernel *k, const fb_value *args, int nargs,
                      fb_value *ret) {
  int rc = fb_interp_run(in, k, args, nargs, ret);
  ck_assert_msg(rc == 0, "interp: %s", fb_strerror(rc));
}

static void *read_field(fb_session *s, const fb_layout *l, int f) {
  size_t bytes = (size_t)fb_field_numel(l, f) * fb_type_size(l->nodes[f].type);
  void *buf = malloc(bytes);
  ck_assert_ptr_nonnull(buf);
  int rc = fb_field_read(s, f, buf, bytes);
  ck_assert_msg(rc == 0, "field read: %s", fb_session_errmsg(s));
  return buf;
}

static void same_as_interp(fb_session *s, fb_interp *in, const fb_layout *l, int f) {
  size_t bytes = (size_t)fb_field_numel(l, f) * fb_type_size(l->nodes[f].type);
  void *got = read_field(s, l, f);
  ck_assert_msg(memcmp(got, fb_interp_field(in, f), bytes) == 0,
                "field %s differs from the interpreter", l->nodes[f].name);
  free(got);
}

/* A trivial kernel (a[0] = v) used to show a session still works. */
static int store_kernel(fb_session *s, const fb_layout *l, int field) {
  fb_type p[1] = {FB_T_I32};
  fb_kernel *k = fb_kernel_new(l, "poke", 1, p, FB_T_VOID);
  fb_builder b;
  fb_builder_init(&b, k);
  int zero = fb_b_const_i32(&b, 0), v = fb_b_arg(&b, 0);
  int nd = l->nodes[field].ndim;
  int idx[FB_MAX_AXES] = {zero, zero, zero, zero};
  fb_b_store(&b, field, idx, nd, v);
  int id = add_kernel(s, k);
  fb_kernel_free(k);
  return id;
}

static void still_works(fb_session *s, const fb_layout *l, int field) {
  int kid = store_kernel(s, l, field);
  fb_value v = fb_value_i32(4242), got;
  launch_ok(s, kid, &v, 1, NULL);
  int64_t idx[FB_MAX_AXES] = {0, 0, 0, 0};
  ck_assert_int_eq(fb_cell_read(s, field, idx, l->nodes[field].ndim, &got), 0);
  ck_assert_int_eq(got.v.i, 4242);
}

/* ---------------------------------------------------------------- engine */

START_TEST(backends) {
  fb_engine *e = NULL;
  char err[256] = "";
  /* cuda works where a GPU and its driver are, and says why not elsewhere;
   * auto picks the same device cuda would, else the CPU */
  fb_engine_config cuda = {"cuda", 0, 0};
  int have_gpu = fb_engine_create(&cuda, &e, err, sizeof err) == 0;
  if (have_gpu) {
    ck_assert_str_eq(fb_engine_backend(e), "cuda");
    fb_engine_destroy(e);
  } else {
    ck_assert_ptr_null(e);
    ck_assert_msg(strncmp(err, "CUDA backend: ", 14) == 0, "message: %s", err);
  }
  fb_engine_config bogus = {"tpu", 0, 0};
  ck_assert_int_eq(fb_engine_create(&bogus, &e, err, sizeof err), FB_EINVAL);
  ck_assert_ptr_nonnull(strstr(err, "tpu"));
  fb_engine_config autob = {"auto", 0, 1};
  ck_assert_int_eq(fb_engine_create(&autob, &e, err, sizeof err), 0);
  ck_assert_str_eq(fb_engine_backend(e), have_gpu ? "cuda" : "cpu");
  fb_engine_destroy(e);
  ck_assert_int_eq(fb_engine_create(NULL, &e, err, sizeof err), 0);
  ck_assert_str_eq(fb_engine_backend(e), "cpu");
  fb_engine_destroy(e);
}
END_TEST

/* ---------------------------------------------------------------- element-wise */

#define NBIG (1 << 20)

START_TEST(elementwise_matches_interpreter) {
  fb_layout *l = fb_layout_new();
  int d = dense(l, 0, "i", NBIG, 0);
  int x = place(l, d, "x", FB_T_F32), y = place(l, d, "y", FB_T_F32); /* interleaved */
  int z = place(l, dense(l, 0, "i", NBIG, 0), "z", FB_T_I32);
  finalize(l);
  fb_type p[2] = {FB_T_F32, FB_T_I32};
  fb_kernel *k = fb_kernel_new(l, "axpy", 2, p, FB_T_VOID);
  fb_builder b;
  fb_builder_init(&b, k);
  int a = fb_b_arg(&b, 0), m = fb_b_arg(&b, 1), saved;
  int loop = par_for(&b, NBIG, &saved);
  int i = fb_b_loop_index(&b, loop, 0);
  int xi = fb_b_load(&b, x, &i, 1), yi = fb_b_load(&b, y, &i, 1);
  fb_b_store(&b, y, &i, 1, fb_b_binary(&b, FB_OP_ADD, fb_b_binary(&b, FB_OP_MUL, a, xi), yi));
  int fi = fb_b_cast(&b, FB_T_F32, i);
  int sq = fb_b_unary(&b, FB_OP_SQRT,
                      fb_b_binary(&b, FB_OP_ADD, fb_b_binary(&b, FB_OP_MUL, xi, xi), fi));
  fb_b_store(&b, x, &i, 1, sq);
  int ii = fb_b_binary(&b, FB_OP_MUL, i, i); /* wraps past 2^31 */
  int small = fb_b_binary(&b, FB_OP_LT, i, fb_b_const_i32(&b, 1000));
  int r = fb_b_binary(&b, FB_OP_FLOORMOD, ii, m);
  fb_b_store(&b, z, &i, 1, fb_b_select(&b, small, fb_b_binary(&b, FB_OP_SUB, r, i), r));
  fb_b_leave(&b, saved);

  fb_session *s = new_session(l, 1, 0);
  fb_interp *in = fb_interp_new(l, 1);
  ck_assert_ptr_nonnull(in);
  float *x0 = malloc(sizeof(float) * NBIG), *y0 = malloc(sizeof(float) * NBIG);
  for (int e = 0; e < NBIG; e++) {
    x0[e] = (float)((e * 37) % 1001) * 0.25f - 30.0f;
    y0[e] = (float)(e % 17) * 1.5f;
  }
  ck_assert_int_eq(fb_field_write(s, x, x0, sizeof(float) * NBIG), 0);
  ck_assert_int_eq(fb_field_write(s, y, y0, sizeof(float) * NBIG), 0);
  memcpy(fb_interp_field(in, x), x0, sizeof(float) * NBIG);
  memcpy(fb_interp_field(in, y), y0, sizeof(float) * NBIG);
  int kid = add_kernel(s, k);
  fb_value args[2] = {fb_value_f32(1.75f), fb_value_i32(-97)};
  for (int rep = 0; rep < 2; rep++) {
    launch_ok(s, kid, args, 2, NULL);
    interp_ok(in, k, args, 2, NULL);
  }
  same_as_interp(s, in, l, x);
  same_as_interp(s, in, l, y);
  same_as_interp(s, in, l, z);
  free(x0);
  free(y0);
  fb_interp_free(in);
  fb_session_destroy(s);
  fb_kernel_free(k);
  fb_layout_free(l);
}
END_TEST

/* ---------------------------------------------------------------- struct_for */

START_TEST(struct_for_2d) {
  fb_layout *l = fb_layout_new();
  int d = dense(l, 0, "ij", 64, 48);
  int a = place(l, d, "a", FB_T_I32);
  int blk = dense(l, 0, "ij", 4, 3); /* hierarchical: 4x3 blocks of 16x8 */
  int inner = dense(l, blk, "ij", 16, 8);
  int h = place(l, inner, "h", FB_T_I64);
  place(l, inner, "h2", FB_T_BOOL);
  finalize(l);
  fb_kernel *k = fb_kernel_new(l, "fill", 0, NULL, FB_T_VOID);
  fb_builder b;
  fb_builder_init(&b, k);
  int sf = fb_b_struct_for(&b, d);
  int saved = fb_b_enter(&b, k->stmts[sf].body);
  int ij[2] = {fb_b_loop_index(&b, sf, 0), fb_b_loop_index(&b, sf, 1)};
  fb_b_store(&b, a, ij, 2,
             fb_b_binary(&b, FB_OP_ADD, fb_b_binary(&b, FB_OP_MUL, ij[0], fb_b_const_i32(&b, 1000)),
                         ij[1]));
  fb_b_leave(&b, saved);
  sf = fb_b_struct_for(&b, inner);
  saved = fb_b_enter(&b, k->stmts[sf].body);
  int hij[2] = {fb_b_loop_index(&b, sf, 0), fb_b_loop_index(&b, sf, 1)};
  int v = fb_b_binary(
      &b, FB_OP_SUB, fb_b_cast(&b, FB_T_I64, hij[0]),
      fb_b_binary(&b, FB_OP_MUL, fb_b_cast(&b, FB_T_I64, hij[1]), fb_b_const_i64(&b, 1 << 20)));
  fb_b_store(&b, h, hij, 2, v);
  fb_b_leave(&b, saved);

  fb_session *s = new_session(l, 0, 0);
  fb_interp *in = fb_interp_new(l, 0);
  int kid = add_kernel(s, k);
  launch_ok(s, kid, NULL, 0, NULL);
  interp_ok(in, k, NULL, 0, NULL);
  int32_t *ga = read_field(s, l, a);
  for (int i = 0; i < 64; i++)
    for (int j = 0; j < 48; j++) ck_assert_int_eq(ga[i * 48 + j], i * 1000 + j);
  free(ga);
  int64_t *gh = read_field(s, l, h);
  for (int i = 0; i < 64; i++)
    for (int j = 0; j < 24; j++) {
      ck_assert_int_eq(gh[i * 24 + j], (int64_t)i - (int64_t)j * (1 << 20));
      int64_t idx[2] = {i, j};
      fb_value c;
      ck_assert_int_eq(fb_cell_read(s, h, idx, 2, &c), 0);
      ck_assert_int_eq(c.v.i, gh[i * 24 + j]);
    }
  free(gh);
  same_as_interp(s, in, l, a);
  same_as_interp(s, in, l, h);
  fb_interp_free(in);
  fb_session_destroy(s);
  fb_kernel_free(k);
  fb_layout_free(l);
}
END_TEST

/* ---------------------------------------------------------------- reduction */

START_TEST(reduction_returns_value) {
  enum {
    N = 100000
  };
  fb_layout *l = fb_layout_new();
  int v = place(l, dense(l, 0, "i", N, 0), "v", FB_T_I32);
  int total = place(l, 0, "total", FB_T_I64); /* 0-D */
  finalize(l);
  fb_kernel *k = fb_kernel_new(l, "sum", 0, NULL, FB_T_I64);
  fb_builder b;
  fb_builder_init(&b, k);
  fb_b_store(&b, total, NULL, 0, fb_b_const_i64(&b, 0));
  int saved, loop = par_for(&b, N, &saved);
  int i = fb_b_loop_index(&b, loop, 0);
  fb_b_global(&b, FB_OP_ATOMIC_ADD, total, NULL, 0,
              fb_b_cast(&b, FB_T_I64, fb_b_load(&b, v, &i, 1)));
  fb_b_leave(&b, saved);
  fb_b_ret(&b, fb_b_load(&b, total, NULL, 0), 0);

  fb_session *s = new_session(l, 0, 0);
  int32_t *host = malloc(sizeof(int32_t) * N);
  int64_t want = 0;
  for (int e = 0; e < N; e++) {
    host[e] = (e * 7919) % 100003 - 50000;
    want += host[e];
  }
  ck_assert_int_eq(fb_field_write(s, v, host, sizeof(int32_t) * N), 0);
  int kid = add_kernel(s, k);
  for (int rep = 0; rep < 3; rep++) {
    fb_value r;
    launch_ok(s, kid, NULL, 0, &r);
    ck_assert_int_eq(r.type, FB_T_I64);
    ck_assert_int_eq(r.v.i, want);
  }
  fb_value c;
  ck_assert_int_eq(fb_cell_read(s, total, NULL, 0, &c), 0);
  ck_assert_int_eq(c.v.i, want);
  free(host);
  fb_session_destroy(s);
  fb_kernel_free(k);
  fb_layout_free(l);
}
END_TEST

/* ---------------------------------------------------------------- arguments */

static const fb_type all_types[7] = {FB_T_BOOL, FB_T_I32, FB_T_I64, FB_T_U32,
                                     FB_T_U64,  FB_T_F32, FB_T_F64};

START_TEST(scalar_args_every_type) {
  fb_layout *l = fb_layout_new();
  int f[7];
  for (int t = 0; t < 7; t++) f[t] = place(l, 0, fb_type_name(all_types[t]), all_types[t]);
  finalize(l);
  fb_kernel *k = fb_kernel_new(l, "args", 7, all_types, FB_T_F64);
  fb_builder b;
  fb_builder_init(&b, k);
  for (int t = 0; t < 7; t++) fb_b_store(&b, f[t], NULL, 0, fb_b_arg(&b, t));
  fb_b_ret(&b, fb_b_arg(&b, 6), 0);
  fb_session *s = new_session(l, 0, 0);
  int kid = add_kernel(s, k);
  fb_value a[7] = {
      fb_value_bool(1),         fb_value_i32(INT32_MIN),      fb_value_i64(INT64_MIN + 5),
      fb_value_u32(UINT32_MAX), fb_value_u64(UINT64_MAX - 2), fb_value_f32(-1.5e-3f),
      fb_value_f64(1e300)};
  fb_value r, c;
  launch_ok(s, kid, a, 7, &r);
  ck_assert_int_eq(r.type, FB_T_F64);
  ck_assert(r.v.f == 1e300);
  for (int t = 0; t < 7; t++) {
    ck_assert_int_eq(fb_cell_read(s, f[t], NULL, 0, &c), 0);
    ck_assert_int_eq(c.type, all_types[t]);
    if (fb_type_is_float(all_types[t])) ck_assert(c.v.f == a[t].v.f);
    else ck_assert_uint_eq(c.v.u, a[t].v.u);
  }
  /* conversions within a kind, and between bool and integers */
  fb_value conv[7] = {fb_value_i32(5),  fb_value_i64(-7),  fb_value_u32(9),   fb_value_i32(-1),
                      fb_value_bool(1), fb_value_f64(0.1), fb_value_f32(2.5f)};
  launch_ok(s, kid, conv, 7, &r);
  ck_assert(r.v.f == 2.5);
  ck_assert_int_eq(fb_cell_read(s, f[0], NULL, 0, &c), 0);
  ck_assert_uint_eq(c.v.u, 1);
  ck_assert_int_eq(fb_cell_read(s, f[1], NULL, 0, &c), 0);
  ck_assert_int_eq(c.v.i, -7);
  ck_assert_int_eq(fb_cell_read(s, f[3], NULL, 0, &c), 0);
  ck_assert_uint_eq(c.v.u, UINT32_MAX);
  ck_assert_int_eq(fb_cell_read(s, f[4], NULL, 0, &c), 0);
  ck_assert_uint_eq(c.v.u, 1);
  ck_assert_int_eq(fb_cell_read(s, f[5], NULL, 0, &c), 0);
  ck_assert(c.v.f == (double)0.1f);
  fb_session_destroy(s);
  fb_kernel_free(k);
  fb_layout_free(l);
}
END_TEST

START_TEST(return_every_type) {
  fb_layout *l = finalize(fb_layout_new());
  fb_session *s = new_session(l, 0, 0);
  fb_value vals[7] = {
      fb_value_bool(1),          fb_value_i32(-123456),    fb_value_i64(INT64_MAX - 1),
      fb_value_u32(4000000000u), fb_value_u64(UINT64_MAX), fb_value_f32(3.25f),
      fb_value_f64(-2.0e-200)};
  for (int t = 0; t < 7; t++) {
    fb_kernel *k = fb_kernel_new(l, fb_type_name(all_types[t]), 1, &all_types[t], all_types[t]);
    fb_builder b;
    fb_builder_init(&b, k);
    fb_b_ret(&b, fb_b_arg(&b, 0), 0);
    int kid = add_kernel(s, k);
    fb_value r;
    launch_ok(s, kid, &vals[t], 1, &r);
    ck_assert_int_eq(r.type, all_types[t]);
    if (fb_type_is_float(all_types[t])) ck_assert(r.v.f == vals[t].v.f);
    else ck_assert_uint_eq(r.v.u, vals[t].v.u);
    ck_assert_int_eq(fb_session_find_kernel(s, fb_type_name(all_types[t])), kid);
    fb_kernel_free(k);
  }
  ck_assert_int_eq(fb_session_find_kernel(s, "nope"), FB_ENOENT);
  fb_session_destroy(s);
  fb_layout_free(l);
}
END_TEST

/* ---------------------------------------------------------------- lowering */

enum {
  NR = 5000
};

/* Top-level serial statements and two par_fors using values computed at
 * the top level: a load (spilled to scratch), a pure expression over an
 * argument (recomputed), and a local variable shared by the tasks. */
/* The layout the remat kernels run on: a, b over NR cells, c0 and out 0-D. */
static fb_layout *remat_layout(int *fa, int *fb, int *c0, int *out) {
  fb_layout *l = fb_layout_new();
  int d = dense(l, 0, "i", NR, 0);
  *fa = place(l, d, "a", FB_T_I32);
  *fb = place(l, d, "b", FB_T_I32);
  *c0 = place(l, 0, "c0", FB_T_I32);
  *out = place(l, 0, "out", FB_T_I32);
  finalize(l);
  return l;
}

static fb_kernel *remat_kernel(const fb_layout *l, int fa, int fb, int c0, int out) {
  fb_type p[1] = {FB_T_I32};
  fb_kernel *k = fb_kernel_new(l, "remat", 1, p, FB_T_I32);
  fb_builder b;
  fb_builder_init(&b, k);
  int c = fb_b_load(&b, c0, NULL, 0);
  int kk = fb_b_binary(&b, FB_OP_MUL, fb_b_arg(&b, 0), fb_b_const_i32(&b, 3));
  int var = fb_b_alloca(&b, FB_T_I32);
  fb_b_lstore(&b, var, fb_b_binary(&b, FB_OP_ADD, c, kk));
  fb_b_store(&b, out, NULL, 0, fb_b_binary(&b, FB_OP_ADD, c, fb_b_const_i32(&b, 1)));
  fb_b_store(&b, c0, NULL, 0, fb_b_binary(&b, FB_OP_ADD, c, fb_b_const_i32(&b, 2)));
  int saved, loop = par_for(&b, NR, &saved);
  int i = fb_b_loop_index(&b, loop, 0);
  fb_b_store(&b, fa, &i, 1, fb_b_binary(&b, FB_OP_ADD, fb_b_binary(&b, FB_OP_ADD, i, c), kk));
  fb_b_leave(&b, saved);
  loop = par_for(&b, NR, &saved);
  i = fb_b_loop_index(&b, loop, 0);
  int ai = fb_b_load(&b, fa, &i, 1);
  fb_b_store(&b, fb, &i, 1,
             fb_b_binary(&b, FB_OP_ADD, fb_b_binary(&b, FB_OP_MUL, ai, c), fb_b_lload(&b, var)));
  fb_b_leave(&b, saved);
  fb_b_lstore(&b, var, fb_b_binary(&b, FB_OP_MUL, fb_b_lload(&b, var), fb_b_const_i32(&b, 2)));
  fb_b_ret(&b, fb_b_lload(&b, var), 0);
  return k;
}

START_TEST(top_level_values_cross_tasks) {
  int fa, fb, c0, out;
  fb_layout *l = remat_layout(&fa, &fb, &c0, &out);
  fb_kernel *k = remat_kernel(l, fa, fb, c0, out);
  fb_session *s = new_session(l, 0, 0);
  fb_interp *in = fb_interp_new(l, 0);
  ck_assert_int_eq(fb_cell_write(s, c0, NULL, 0, fb_value_i32(5)), 0);
  *(int32_t *)fb_interp_field(in, c0) = 5;
  int kid = add_kernel(s, k);
  const fb_kernel *const *tasks;
  int ntasks = 0;
  ck_assert_int_eq(fb_session_kernel_tasks(s, kid, &tasks, &ntasks), 0);
  ck_assert_int_ge(ntasks, 3);
  for (int t = 0; t < ntasks; t++) ck_assert_ptr_nonnull(tasks[t]);
  for (int rep = 0; rep < 3; rep++) {
    fb_value arg = fb_value_i32(rep + 1), r1, r2;
    launch_ok(s, kid, &arg, 1, &r1);
    interp_ok(in, k, &arg, 1, &r2);
    ck_assert_int_eq(r1.v.i, r2.v.i);
    same_as_interp(s, in, l, fa);
    same_as_interp(s, in, l, fb);
    same_as_interp(s, in, l, c0);
    same_as_interp(s, in, l, out);
  }
  /* spot-check one value by hand: launch 3 used c = 9, kk = 9 */
  fb_value c;
  int64_t idx = 10;
  ck_assert_int_eq(fb_cell_read(s, fa, &idx, 1, &c), 0);
  ck_assert_int_eq(c.v.i, 10 + 9 + 9);
  ck_assert_int_eq(fb_cell_read(s, fb, &idx, 1, &c), 0);
  ck_assert_int_eq(c.v.i, 28 * 9 + 18);
  fb_interp_free(in);
  fb_session_destroy(s);
  fb_kernel_free(k);
  fb_layout_free(l);
}
END_TEST

/* rand() depends on the session seed and the launch number. */
START_TEST(rand_follows_launch_number) {
  fb_layout *l = fb_layout_new();
  int r = place(l, dense(l, 0, "i", 3000, 0), "r", FB_T_F32);
  int q = place(l, 0, "q", FB_T_F32);
  finalize(l);
  fb_kernel *k = fb_kernel_new(l, "noise", 0, NULL, FB_T_VOID);
  fb_builder b;
  fb_builder_init(&b, k);
  fb_b_store(&b, q, NULL, 0, fb_b_rand(&b, 2));
  int saved, loop = par_for(&b, 3000, &saved);
  int i = fb_b_loop_index(&b, loop, 0);
  fb_b_store(&b, r, &i, 1, fb_b_binary(&b, FB_OP_ADD, fb_b_rand(&b, 1), fb_b_rand(&b, 1)));
  fb_b_leave(&b, saved);
  fb_session *s = new_session(l, 42, 0);
  fb_interp *in = fb_interp_new(l, 42);
  int kid = add_kernel(s, k);
  float prev = -1;
  for (int rep = 0; rep < 3; rep++) {
    launch_ok(s, kid, NULL, 0, NULL);
    interp_ok(in, k, NULL, 0, NULL);
    same_as_interp(s, in, l, r);
    same_as_interp(s, in, l, q);
    float now = *(float *)fb_interp_field(in, q);
    ck_assert(now != prev);
    prev = now;
  }
  fb_interp_free(in);
  fb_session_destroy(s);
  fb_kernel_free(k);
  fb_layout_free(l);
}
END_TEST

/* ---------------------------------------------------------------- counters */

START_TEST(counters_and_cache) {
  int fa, fb, c0, out;
  fb_layout *l = remat_layout(&fa, &fb, &c0, &out);
  fb_kernel *k = remat_kernel(l, fa, fb, c0, out);
  fb_session *s = new_session(l, 0, 0);
  fb_counters c0c, c1, c2, c3;
  fb_session_counters(s, &c0c);
  ck_assert_uint_eq(c0c.launches, 0);
  ck_assert_uint_eq(c0c.tasks_compiled, 0);
  int k1 = add_kernel(s, k);
  const fb_kernel *const *tasks;
  int nt = 0;
  ck_assert_int_eq(fb_session_kernel_tasks(s, k1, &tasks, &nt), 0);
  fb_session_counters(s, &c1);
  ck_assert_uint_eq(c1.tasks_compiled, (uint64_t)nt);
  ck_assert_uint_eq(c1.cache_hits, 0);
  ck_assert_uint_gt(c1.statements_emitted, 0);
  ck_assert(c1.compile_s > 0);
  int k2 = add_kernel(s, k); /* identical: every task found in the cache */
  ck_assert_int_ne(k1, k2);
  fb_session_counters(s, &c2);
  ck_assert_uint_eq(c2.tasks_compiled, c1.tasks_compiled);
  ck_assert_uint_eq(c2.cache_hits, (uint64_t)nt);
  ck_assert_uint_eq(c2.statements_emitted, c1.statements_emitted);
  fb_value arg = fb_value_i32(1);
  for (int rep = 0; rep < 4; rep++) launch_ok(s, rep % 2 ? k1 : k2, &arg, 1, NULL);
  fb_session_counters(s, &c3);
  ck_assert_uint_eq(c3.launches, 4);
  ck_assert_uint_eq(c3.tasks_launched, 4 * (uint64_t)nt);
  ck_assert(c3.backend_s > 0);
  ck_assert_int_eq(fb_sync(s), 0);
  fb_session_destroy(s);
  fb_kernel_free(k);
  fb_layout_free(l);
}
END_TEST

/* ---------------------------------------------------------------- host access */

START_TEST(field_round_trip) {
  fb_layout *l = fb_layout_new();
  int d = dense(l, 0, "ij", 6, 10);
  int f[7];
  for (int t = 0; t < 7; t++) f[t] = place(l, d, fb_type_name(all_types[t]), all_types[t]);
  int blk = dense(l, 0, "ij", 3, 5);
  int h = place(l, dense(l, blk, "ij", 7, 2), "h", FB_T_F64);
  finalize(l);
  fb_session *s = new_session(l, 0, 0);
  unsigned char *buf = malloc(8 * 60), *back = malloc(8 * 60);
  for (int t = 0; t < 7; t++) {
    size_t bytes = 60 * fb_type_size(all_types[t]);
    for (size_t e = 0; e < bytes; e++) buf[e] = (unsigned char)(e * 31 + (size_t)t * 7);
    if (all_types[t] == FB_T_BOOL)
      for (size_t e = 0; e < bytes; e++) buf[e] &= 1;
    ck_assert_int_eq(fb_field_write(s, f[t], buf, bytes), 0);
    memset(back, 0xEE, bytes);
    ck_assert_int_eq(fb_field_read(s, f[t], back, bytes), 0);
    ck_assert_int_eq(memcmp(buf, back, bytes), 0);
    /* element (i, j) sits at flat i * 10 + j */
    int64_t idx[2] = {4, 7};
    fb_value c;
    ck_assert_int_eq(fb_cell_read(s, f[t], idx, 2, &c), 0);
    fb_value want = fb_value_load(all_types[t], buf + 47 * fb_type_size(all_types[t]));
    ck_assert_uint_eq(c.v.u, want.v.u);
  }
  /* hierarchical field (21 x 10): every element agrees with cell access */
  double hv[210];
  for (int e = 0; e < 210; e++) hv[e] = e * 0.5 - 7;
  ck_assert_int_eq(fb_field_write(s, h, hv, sizeof hv), 0);
  for (int i = 0; i < 21; i++)
    for (int j = 0; j < 10; j++) {
      int64_t idx[2] = {i, j};
      fb_value c;
      ck_assert_int_eq(fb_cell_read(s, h, idx, 2, &c), 0);
      ck_assert(c.v.f == hv[i * 10 + j]);
    }
  /* a bool field written with non-0/1 bytes reads back as 0/1 */
  unsigned char bb[60];
  for (int e = 0; e < 60; e++) bb[e] = (unsigned char)(e * 3);
  ck_assert_int_eq(fb_field_write(s, f[0], bb, 60), 0);
  ck_assert_int_eq(fb_field_read(s, f[0], back, 60), 0);
  for (int e = 0; e < 60; e++) ck_assert_int_eq(back[e], bb[e] != 0);
  free(buf);
  free(back);
  fb_session_destroy(s);
  fb_layout_free(l);
}
END_TEST

START_TEST(big_field_round_trip) {
  enum {
    N = 1 << 24
  };
  fb_layout *l = fb_layout_new();
  int x = place(l, dense(l, 0, "ij", 4096, 4096), "x", FB_T_F32);
  finalize(l);
  fb_session *s = new_session(l, 0, 0);
  float *buf = malloc(sizeof(float) * N);
  for (int e = 0; e < N; e++) buf[e] = (float)e;
  ck_assert_int_eq(fb_field_write(s, x, buf, sizeof(float) * N), 0);
  memset(buf, 0, sizeof(float) * N);
  ck_assert_int_eq(fb_field_read(s, x, buf, sizeof(float) * N), 0);
  for (int e = 0; e < N; e += 4099) ck_assert(buf[e] == (float)e);
  free(buf);
  fb_session_destroy(s);
  fb_layout_free(l);
}
END_TEST

START_TEST(cell_read_write) {
  fb_layout *l = fb_layout_new();
  int a = place(l, dense(l, 0, "ij", 5, 7), "a", FB_T_I32);
  finalize(l);
  fb_session *s = new_session(l, 0, 0);
  for (int i = 0; i < 5; i++)
    for (int j = 0; j < 7; j++) {
      int64_t idx[2] = {i, j};
      ck_assert_int_eq(fb_cell_write(s, a, idx, 2, fb_value_i64(i * 10 + j)), 0);
    }
  int32_t *g = read_field(s, l, a);
  for (int e = 0; e < 35; e++) ck_assert_int_eq(g[e], (e / 7) * 10 + e % 7);
  free(g);
  int64_t bad[2] = {2, 7};
  fb_value c;
  ck_assert_int_eq(fb_cell_read(s, a, bad, 2, &c), FB_EBOUNDS);
  ck_assert_ptr_nonnull(strstr(fb_session_errmsg(s), "'a'"));
  ck_assert_ptr_nonnull(strstr(fb_session_errmsg(s), "(2, 7)"));
  bad[1] = -1;
  ck_assert_int_eq(fb_cell_write(s, a, bad, 2, fb_value_i32(1)), FB_EBOUNDS);
  ck_assert_int_eq(fb_cell_read(s, a, bad, 1, &c), FB_EINVAL);
  int64_t ok[2] = {1, 1};
  ck_assert_int_eq(fb_cell_write(s, a, ok, 2, fb_value_f32(1.0f)), FB_ETYPE);
  still_works(s, l, a);
  fb_session_destroy(s);
  fb_layout_free(l);
}
END_TEST

/* ---------------------------------------------------------------- errors */

START_TEST(wrong_args) {
  fb_layout *l = fb_layout_new();
  int a = place(l, dense(l, 0, "i", 8, 0), "a", FB_T_I32);
  finalize(l);
  fb_session *s = new_session(l, 0, 0);
  int kid = store_kernel(s, l, a);
  ck_assert_int_eq(fb_launch(s, kid, NULL, 0, NULL), FB_ETYPE);
  ck_assert_ptr_nonnull(strstr(fb_session_errmsg(s), "poke"));
  ck_assert_ptr_nonnull(strstr(fb_session_errmsg(s), "1 argument"));
  fb_value two[2] = {fb_value_i32(1), fb_value_i32(2)};
  ck_assert_int_eq(fb_launch(s, kid, two, 2, NULL), FB_ETYPE);
  fb_value f = fb_value_f32(1.0f);
  ck_assert_int_eq(fb_launch(s, kid, &f, 1, NULL), FB_ETYPE);
  ck_assert_ptr_nonnull(strstr(fb_session_errmsg(s), "argument 0"));
  ck_assert_ptr_nonnull(strstr(fb_session_errmsg(s), "i32"));
  ck_assert_int_eq(fb_launch(s, 99, &f, 1, NULL), FB_ENOENT);
  still_works(s, l, a);
  /* errors do not count as launches */
  fb_counters c;
  fb_session_counters(s, &c);
  ck_assert_uint_eq(c.launches, 1);
  fb_session_destroy(s);
  fb_layout_free(l);
}
END_TEST

START_TEST(verify_failure) {
  fb_layout *l = fb_layout_new();
  int a = place(l, dense(l, 0, "i", 8, 0), "a", FB_T_I32);
  finalize(l);
  fb_session *s = new_session(l, 0, 0);
  fb_kernel *k = fb_kernel_new(l, "broken", 0, NULL, FB_T_VOID);
  fb_builder b;
  fb_builder_init(&b, k);
  int x = fb_b_const_i32(&b, 1), y = fb_b_const_f32(&b, 2.0f);
  int bad = fb_b_binary(&b, FB_OP_ADD, x, y);
  ck_assert_int_eq(fb_session_add_kernel(s, k), FB_EVERIFY);
  char want[32];
  snprintf(want, sizeof want, "%%%d add", bad);
  ck_assert_ptr_nonnull(strstr(fb_session_errmsg(s), "broken"));
  ck_assert_msg(strstr(fb_session_errmsg(s), want), "message: %s", fb_session_errmsg(s));
  ck_assert_int_eq(fb_session_find_kernel(s, "broken"), FB_ENOENT);
  fb_kernel_free(k);
  /* an SNode id the session's layout does not have */
  k = fb_kernel_new(l, "ghost", 0, NULL, FB_T_VOID);
  fb_builder_init(&b, k);
  int z = fb_b_const_i32(&b, 0);
  fb_b_store(&b, 77, &z, 1, z);
  ck_assert_int_eq(fb_session_add_kernel(s, k), FB_ENOENT);
  ck_assert_ptr_nonnull(strstr(fb_session_errmsg(s), "77"));
  fb_kernel_free(k);
  /* a negative one is malformed: INVALID, not a node the layout lacks */
  k = fb_kernel_new(l, "minus", 0, NULL, FB_T_VOID);
  fb_builder_init(&b, k);
  z = fb_b_const_i32(&b, 0);
  fb_b_store(&b, -1, &z, 1, z);
  ck_assert_int_eq(fb_session_add_kernel(s, k), FB_EINVAL);
  ck_assert_msg(strstr(fb_session_errmsg(s), "names SNode -1, which is not an SNode id"),
                "message: %s", fb_session_errmsg(s));
  fb_kernel_free(k);
  still_works(s, l, a);
  fb_session_destroy(s);
  fb_layout_free(l);
}
END_TEST

/* Kernels are untrusted: the engine's own ops (here gtmp_store, which
 * writes an absolute scratch offset, and listgen) are refused with their
 * name and statement, and so is a kernel over the compile budget; the
 * session goes on working. */
START_TEST(internal_ops_and_budget) {
  fb_layout *l = fb_layout_new();
  int a = place(l, dense(l, 0, "i", 8, 0), "a", FB_T_I32);
  finalize(l);
  fb_session_config sc = {.mode = "sync", .max_kernel_statements = 64};
  fb_session *s = NULL;
  ck_assert_int_eq(fb_session_create(eng, &sc, l, &s, NULL, 0), 0);
  fb_kernel *k = fb_kernel_new(l, "escape", 0, NULL, FB_T_VOID);
  fb_builder b;
  fb_builder_init(&b, k);
  int v = fb_b_const_i64(&b, 7);
  int st = fb_b_gtmp_store(&b, v, 1 << 20);
  ck_assert_int_eq(fb_session_add_kernel(s, k), FB_EVERIFY);
  char want[64];
  snprintf(want, sizeof want, "%%%d gtmp_store: is internal", st);
  ck_assert_msg(strstr(fb_session_errmsg(s), want), "message: %s", fb_session_errmsg(s));
  fb_kernel_free(k);
  k = fb_kernel_new(l, "bomb", 0, NULL, FB_T_VOID);
  fb_builder_init(&b, k);
  int x = fb_b_const_i32(&b, 1);
  for (int i = 0; i < 100; i++) x = fb_b_binary(&b, FB_OP_ADD, x, x);
  ck_assert_int_eq(fb_session_add_kernel(s, k), FB_EQUOTA);
  ck_assert_msg(strstr(fb_session_errmsg(s), "max_kernel_statements"), "message: %s",
                fb_session_errmsg(s));
  fb_kernel_free(k);
  still_works(s, l, a);
  fb_session_destroy(s);
  fb_layout_free(l);
}
END_TEST

/* What registered kernels retain is counted (fb_session_kernel_bytes): at
 * least the IR copies the session keeps (its copy and each task's), and a
 * kernel past the cap is refused naming it and memory_budget, leaving the
 * count and the earlier kernels as they were; fb_session_drop_kernels gives
 * back what the dropped ones held. Sync and async (whose IR bank holds
 * each task once more). */
static void kernel_bytes_case(const char *mode) {
  fb_layout *l = fb_layout_new();
  int a = place(l, dense(l, 0, "i", 8, 0), "a", FB_T_I32);
  finalize(l);
  fb_session_config sc = {.mode = mode};
  fb_session *s = NULL;
  ck_assert_int_eq(fb_session_create(eng, &sc, l, &s, NULL, 0), 0);
  ck_assert_uint_eq(fb_session_kernel_bytes(s), 0);
  fb_kernel *k = fb_kernel_new(l, "chain", 0, NULL, FB_T_VOID);
  fb_builder b;
  fb_builder_init(&b, k);
  int x = fb_b_const_i32(&b, 1), one = x;
  for (int i = 0; i < 300; i++) x = fb_b_binary(&b, FB_OP_ADD, x, one);
  fb_b_store(&b, a, &one, 1, x);
  ck_assert_int_eq(add_kernel(s, k), 0);
  uint64_t first = fb_session_kernel_bytes(s);
  ck_assert_uint_ge(first, 2 * (uint64_t)k->nstmts * sizeof(fb_stmt));
  /* no room for even its statements: refused before it is lowered */
  fb_session_set_kernel_cap(s, first);
  ck_assert_int_eq(fb_session_add_kernel(s, k), FB_EQUOTA);
  ck_assert_msg(strstr(fb_session_errmsg(s), "kernel 'chain': its 302 statements take at least") &&
                    strstr(fb_session_errmsg(s), "(memory_budget)"),
                "message: %s", fb_session_errmsg(s));
  ck_assert_uint_eq(fb_session_kernel_bytes(s), first);
  /* room for its statements, not for all it retains once lowered */
  fb_session_set_kernel_cap(s, first + (uint64_t)k->nstmts * sizeof(fb_stmt));
  ck_assert_int_eq(fb_session_add_kernel(s, k), FB_EQUOTA);
  ck_assert_msg(strstr(fb_session_errmsg(s), "kernel 'chain': its IR takes") &&
                    strstr(fb_session_errmsg(s), "(memory_budget)"),
                "message: %s", fb_session_errmsg(s));
  ck_assert_uint_eq(fb_session_kernel_bytes(s), first);
  fb_session_set_kernel_cap(s, UINT64_MAX);
  ck_assert_int_eq(add_kernel(s, k), 1);
  ck_assert_int_eq(add_kernel(s, k), 2);
  ck_assert_uint_gt(fb_session_kernel_bytes(s), first);
  fb_session_drop_kernels(s, 1);
  ck_assert_uint_eq(fb_session_kernel_bytes(s), first);
  ck_assert_int_eq(fb_session_find_kernel(s, "chain"), 0);
  fb_kernel_free(k);
  launch_ok(s, 0, NULL, 0, NULL);
  ck_assert_int_eq(fb_sync(s), 0);
  fb_value got;
  int64_t idx[FB_MAX_AXES] = {1, 0, 0, 0};
  ck_assert_int_eq(fb_cell_read(s, a, idx, 1, &got), 0);
  ck_assert_int_eq(got.v.i, 301);
  ck_assert_int_eq(store_kernel(s, l, a), 1); /* the next id after the dropped ones */
  fb_session_destroy(s);
  fb_layout_free(l);
}

START_TEST(kernel_bytes_counted_and_capped) {
  kernel_bytes_case("sync");
  kernel_bytes_case("async");
}
END_TEST

/* Layout sizes are checked arithmetic: a product that wraps (65536^4 cells
 * of 4 bytes is 2^66, 0 mod 2^64) or an extent over 2^31-1 is refused with
 * the SNode named; so is a tree deeper than the limit, checked without
 * recursion. */
START_TEST(layout_overflow_refused) {
  char err[256];
  fb_layout *l = fb_layout_new();
  int64_t big[4] = {65536, 65536, 65536, 65536};
  int d = fb_layout_add(l, 0, FB_SN_DENSE, "ijkl", big, 0, "huge");
  place(l, d, "x", FB_T_I32);
  ck_assert_int_eq(fb_layout_finalize(l, err, sizeof err), FB_EINVAL);
  ck_assert_msg(strstr(err, "SNode 1 (dense huge)") && strstr(err, "2^56"), "%s", err);
  fb_layout_free(l);
  l = fb_layout_new();
  int64_t three = 3, wrap = 0x5555555555555555ll;
  int outer = fb_layout_add(l, 0, FB_SN_DENSE, "i", &three, 0, NULL);
  int inner = fb_layout_add(l, outer, FB_SN_DENSE, "i", &wrap, 0, NULL);
  place(l, inner, "y", FB_T_I32);
  ck_assert_int_eq(fb_layout_finalize(l, err, sizeof err), FB_EINVAL);
  ck_assert_msg(strstr(err, "SNode 2") && strstr(err, "2^31-1"), "%s", err);
  fb_layout_free(l);
  l = fb_layout_new();
  int64_t two = 2;
  int p = 0;
  for (int i = 0; i < 100; i++) {
    int c = fb_layout_add(l, p, FB_SN_DENSE, i % 2 ? "i" : "j", &two, 0, NULL);
    ck_assert_int_ge(c, 0);
    p = c;
  }
  place(l, p, "z", FB_T_I32);
  ck_assert_int_eq(fb_layout_finalize(l, err, sizeof err), FB_EINVAL);
  ck_assert_msg(strstr(err, "SNode 49 ") && strstr(err, "levels below the root"), "%s", err);
  fb_layout_free(l);
}
END_TEST

START_TEST(out_of_bounds) {
  fb_layout *l = fb_layout_new();
  int a = place(l, dense(l, 0, "i", 100, 0), "a", FB_T_I32);
  finalize(l);
  fb_session *s = new_session(l, 0, 0);
  fb_kernel *k = fb_kernel_new(l, "overrun", 0, NULL, FB_T_VOID);
  fb_builder b;
  fb_builder_init(&b, k);
  int saved, loop = par_for(&b, 105, &saved);
  int i = fb_b_loop_index(&b, loop, 0);
  fb_b_store(&b, a, &i, 1, fb_b_binary(&b, FB_OP_ADD, i, fb_b_const_i32(&b, 1)));
  fb_b_leave(&b, saved);
  int kid = add_kernel(s, k);
  ck_assert_int_eq(fb_launch(s, kid, NULL, 0, NULL), FB_EBOUNDS);
  ck_assert_ptr_nonnull(strstr(fb_session_errmsg(s), "overrun"));
  int32_t *g = read_field(s, l, a);
  for (int e = 0; e < 100; e++) ck_assert_int_eq(g[e], e + 1);
  free(g);
  still_works(s, l, a);
  fb_kernel_free(k);
  fb_session_destroy(s);
  fb_layout_free(l);
}
END_TEST

START_TEST(memory_limit) {
  int fa, fb, c0, out;
  fb_layout *l = remat_layout(&fa, &fb, &c0, &out);
  fb_session_config sc = {.mode = "sync", .memory_limit = 1000};
  fb_session *s = NULL;
  char cerr[256] = "";
  ck_assert_int_eq(fb_session_create(eng, &sc, l, &s, cerr, sizeof cerr), FB_EQUOTA);
  ck_assert_ptr_null(s);
  ck_assert_msg(strstr(cerr, "1000"), "message names the limit: %s", cerr);
  /* exactly the fields fit; a kernel that needs scratch does not */
  s = new_session(l, 0, l->root_bytes);
  fb_kernel *k = remat_kernel(l, fa, fb, c0, out);
  ck_assert_int_eq(fb_session_add_kernel(s, k), FB_EQUOTA);
  char want[64];
  snprintf(want, sizeof want, "%llu", (unsigned long long)l->root_bytes);
  ck_assert_msg(strstr(fb_session_errmsg(s), want), "message: %s", fb_session_errmsg(s));
  ck_assert_ptr_nonnull(strstr(fb_session_errmsg(s), "limit"));
  still_works(s, l, out);
  fb_kernel_free(k);
  fb_session_destroy(s);
  fb_layout_free(l);
}
END_TEST

START_TEST(bad_field_access) {
  fb_layout *l = fb_layout_new();
  int d = dense(l, 0, "i", 16, 0);
  int a = place(l, d, "a", FB_T_I32);
  int bm = fb_layout_add(l, 0, FB_SN_BITMASKED, "i", (int64_t[]){32}, 0, NULL);
  ck_assert_int_ge(bm, 0);
  int sp = place(l, bm, "sp", FB_T_F32);
  finalize(l);
  fb_session *s = new_session(l, 0, 0);
  int32_t buf[16];
  ck_assert_int_eq(fb_field_read(s, 999, buf, sizeof buf), FB_ENOENT);
  ck_assert_ptr_nonnull(strstr(fb_session_errmsg(s), "999"));
  ck_assert_int_eq(fb_field_read(s, d, buf, sizeof buf), FB_EINVAL);
  ck_assert_ptr_nonnull(strstr(fb_session_errmsg(s), "not a field"));
  ck_assert_int_eq(fb_field_read(s, a, buf, 60), FB_EINVAL);
  ck_assert_ptr_nonnull(strstr(fb_session_errmsg(s), "64 bytes"));
  ck_assert_ptr_nonnull(strstr(fb_session_errmsg(s), "60 bytes"));
  ck_assert_int_eq(fb_field_write(s, a, buf, 68), FB_EINVAL);
  /* a field under a sparse SNode: wrong sizes are refused as for dense
   * ones; inactive cells read 0 (tests/test_sparse.c covers the rest) */
  float fbuf[32];
  memset(fbuf, 0xff, sizeof fbuf);
  ck_assert_int_eq(fb_field_read(s, sp, fbuf, 60), FB_EINVAL);
  ck_assert_int_eq(fb_field_read(s, sp, fbuf, sizeof fbuf), 0);
  for (int i = 0; i < 32; i++) ck_assert(fbuf[i] == 0.0f);
  still_works(s, l, a);
  fb_session_destroy(s);
  fb_layout_free(l);
}
END_TEST

START_TEST(unfinalized_layout) {
  fb_layout *l = fb_layout_new();
  place(l, dense(l, 0, "i", 4, 0), "a", FB_T_I32);
  fb_session *s = NULL;
  ck_assert_int_eq(fb_session_create(eng, NULL, l, &s, NULL, 0), FB_EINVAL);
  ck_assert_ptr_null(s);
  finalize(l);
  ck_assert_int_eq(fb_session_create(eng, NULL, l, &s, NULL, 0), 0);
  fb_session_destroy(s);
  fb_layout_free(l);
}
END_TEST

/* ---------------------------------------------------------------- threads */

typedef struct worker {
  const fb_layout *l;
  int field, add, ok;
  char msg[256];
} worker;

static void *session_thread(void *arg) {
  worker *w = arg;
  fb_session *s = NULL;
  fb_session_config sc = {.mode = "sync"};
  if (fb_session_create(eng, &sc, w->l, &s, NULL, 0)) return NULL;
  fb_type p[1] = {FB_T_I32};
  fb_kernel *k = fb_kernel_new(w->l, "bump", 1, p, FB_T_VOID);
  fb_builder b;
  fb_builder_init(&b, k);
  int saved, loop = par_for(&b, 10000, &saved);
  int i = fb_b_loop_index(&b, loop, 0);
  int v = fb_b_binary(&b, FB_OP_ADD, fb_b_load(&b, w->field, &i, 1), fb_b_arg(&b, 0));
  fb_b_store(&b, w->field, &i, 1, v);
  fb_b_leave(&b, saved);
  int kid = fb_session_add_kernel(s, k);
  fb_value a = fb_value_i32(w->add);
  int ok = kid >= 0;
  for (int r = 0; ok && r < 200; r++) ok = fb_launch(s, kid, &a, 1, NULL) == 0;
  int32_t *g = malloc(sizeof(int32_t) * 10000);
  ok = ok && fb_field_read(s, w->field, g, sizeof(int32_t) * 10000) == 0;
  for (int e = 0; ok && e < 10000; e++) ok = g[e] == 200 * w->add;
  snprintf(w->msg, sizeof w->msg, "%s", fb_session_errmsg(s));
  w->ok = ok;
  free(g);
  fb_kernel_free(k);
  fb_session_destroy(s);
  return NULL;
}

START_TEST(two_sessions_two_threads) {
  fb_layout *l = fb_layout_new();
  int a = place(l, dense(l, 0, "i", 10000, 0), "a", FB_T_I32);
  finalize(l);
  worker w[2] = {{l, a, 3, 0, ""}, {l, a, -5, 0, ""}};
  pthread_t th[2];
  for (int t = 0; t < 2; t++)
    ck_assert_int_eq(pthread_create(&th[t], NULL, session_thread, &w[t]), 0);
  for (int t = 0; t < 2; t++) pthread_join(th[t], NULL);
  ck_assert_msg(w[0].ok, "session 0: %s", w[0].msg);
  ck_assert_msg(w[1].ok, "session 1: %s", w[1].msg);
  fb_layout_free(l);
}
END_TEST

/* ---------------------------------------------------------------- async API in sync mode */

/* fb_flush has nothing to do, there is no SFG, and the timeline records
 * registrations (compiles) and launches. */
START_TEST(sync_mode_async_api) {
  fb_layout *l = fb_layout_new();
  int a = place(l, dense(l, 0, "i", 8, 0), "a", FB_T_I32);
  finalize(l);
  fb_session *s = new_session(l, 0, 0);
  char path[] = "/tmp/fb_engine_traceXXXXXX";
  int fd = mkstemp(path);
  ck_assert_int_ge(fd, 0);
  close(fd);
  ck_assert_int_eq(fb_session_trace_begin(s, path), 0);
  int kid = store_kernel(s, l, a);
  fb_value v = fb_value_i32(17);
  launch_ok(s, kid, &v, 1, NULL);
  ck_assert_int_eq(fb_flush(s), 0);
  ck_assert_int_eq(fb_sync(s), 0);
  fb_counters c;
  fb_session_counters(s, &c);
  ck_assert_uint_eq(c.flushes, 0);
  ck_assert_uint_eq(c.tasks_pending, 0);
  ck_assert_uint_eq(c.tasks_launched, 1);
  fb_flush_stats fs;
  ck_assert_int_eq(fb_session_last_flush(s, &fs), FB_ENOENT);
  ck_assert_int_eq(fb_session_trace_graph(s, 1, NULL, NULL), FB_EUNSUPPORTED);
  ck_assert_int_eq(fb_session_trace_end(s), 0);
  char *text = fbt_read_file(path, NULL);
  ck_assert_ptr_nonnull(text);
  ck_assert_ptr_nonnull(strstr(text, "{\"traceEvents\":["));
  ck_assert_ptr_nonnull(strstr(text, "\"name\":\"poke\",\"cat\":\"launch\",\"ph\":\"X\""));
  ck_assert_ptr_nonnull(strstr(text, "\"name\":\"compile poke.t0\""));
  free(text);
  unlink(path);
  fb_session_destroy(s);
  fb_layout_free(l);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("engine");
  TCase *tc = tcase_create("engine");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, backends);
  tcase_add_test(tc, elementwise_matches_interpreter);
  tcase_add_test(tc, struct_for_2d);
  tcase_add_test(tc, reduction_returns_value);
  tcase_add_test(tc, scalar_args_every_type);
  tcase_add_test(tc, return_every_type);
  tcase_add_test(tc, top_level_values_cross_tasks);
  tcase_add_test(tc, rand_follows_launch_number);
  tcase_add_test(tc, counters_and_cache);
  tcase_add_test(tc, field_round_trip);
  tcase_add_test(tc, big_field_round_trip);
  tcase_add_test(tc, cell_read_write);
  tcase_add_test(tc, wrong_args);
  tcase_add_test(tc, verify_failure);
  tcase_add_test(tc, internal_ops_and_budget);
  tcase_add_test(tc, kernel_bytes_counted_and_capped);
  tcase_add_test(tc, layout_overflow_refused);
  tcase_add_test(tc, out_of_bounds);
  tcase_add_test(tc, memory_limit);
  tcase_add_test(tc, bad_field_access);
  tcase_add_test(tc, unfinalized_layout);
  tcase_add_test(tc, two_sessions_two_threads);
  tcase_add_test(tc, sync_mode_async_api);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) { return fbt_run(suite()); }
