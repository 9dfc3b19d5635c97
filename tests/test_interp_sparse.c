/* Sparse SNodes in the reference interpreter (ir/interp.c), following
 * docs/sparse.md: for bitmasked, pointer and dynamic SNodes and their
 * combinations, which cells of every level are active after writes,
 * activate and deactivate (checked with is_active on every cell of every
 * level), inactive reads giving 0 (also in the flat field arrays), struct_for
 * visiting each active cell exactly once in row-major order over a snapshot,
 * nested deactivation, append/length on dynamic lists (full lists too), the
 * downsample pattern, struct_for over named SNodes, out-of-range indices, and
 * the time of a struct_for over a 2^20-cell space. Kernels are built with the
 * builder; every expectation is worked out by hand from the semantics. */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "fusebox/ir.h"
#include "tests/support/support.h"

#define LOGN 1024 /* visit log capacity */

/* ---------------------------------------------------------------- layouts */

static int node(fb_layout *l, int parent, fb_snode_kind kind, const char *axes, int64_t a,
                int64_t b, const char *name) {
  int64_t sz[2] = {a, b};
  int id = fb_layout_add(l, parent, kind, axes, sz, 0, name);
  ck_assert_int_ge(id, 0);
  return id;
}

static int dyn(fb_layout *l, int parent, const char *axis, int64_t max, int64_t chunk,
               const char *name) {
  int id = fb_layout_add(l, parent, FB_SN_DYNAMIC, axis, &max, chunk, name);
  ck_assert_int_ge(id, 0);
  return id;
}

static int place(fb_layout *l, int parent, const char *name, fb_type t) {
  int id = fb_layout_place(l, parent, name, t);
  ck_assert_int_ge(id, 0);
  return id;
}

/* A test's layout and interpreter, with a visit log (dense i32 field of
 * LOGN cells) and a 0-D i32 counter added to the layout. */
typedef struct ctx {
  fb_layout *l;
  fb_interp *in;
  int log, cnt;
} ctx;

static ctx ctx_begin(void) {
  ctx c;
  memset(&c, 0, sizeof c);
  c.l = fb_layout_new();
  ck_assert_ptr_nonnull(c.l);
  c.log = place(c.l, node(c.l, 0, FB_SN_DENSE, "i", LOGN, 0, NULL), "log", FB_T_I32);
  c.cnt = place(c.l, 0, "cnt", FB_T_I32);
  return c;
}

static void ctx_finalize(ctx *c) {
  char err[200] = "";
  int rc = fb_layout_finalize(c->l, err, sizeof err);
  ck_assert_msg(rc == 0, "layout: %s", err);
  c->in = fb_interp_new(c->l, 7);
  ck_assert_ptr_nonnull(c->in);
}

static void ctx_end(ctx *c) {
  fb_interp_free(c->in);
  fb_layout_free(c->l);
}

static void *field(ctx *c, int f) { return fb_interp_field(c->in, f); }

/* ---------------------------------------------------------------- running kernels */

static int run(ctx *c, const fb_kernel *k, const fb_value *args, int nargs, fb_value *ret) {
  int rc = fb_interp_run(c->in, k, args, nargs, ret);
  if (rc && rc != FB_EBOUNDS)
    fprintf(stderr, "run %s: %s: %s\n", k->name, fb_strerror(rc), fb_interp_errmsg(c->in));
  return rc;
}

static fb_type result_of(const fb_layout *l, fb_op op, int s) {
  switch (op) {
  case FB_OP_LOAD:
  case FB_OP_ATOMIC_ADD: return l->nodes[s].type;
  case FB_OP_IS_ACTIVE: return FB_T_BOOL;
  case FB_OP_APPEND:
  case FB_OP_LENGTH: return FB_T_I32;
  default: return FB_T_VOID;
  }
}

/* One global op on SNode s at indices idx (n of them), with value v when
 * v.type is not void, in a kernel of its own taking them as arguments.
 * Asserts the run's code; returns the op's result (void type when none). */
static fb_value op_at(ctx *c, fb_op op, int s, const int32_t *idx, int n, fb_value v, int want_rc,
                      int line) {
  fb_type pt[FB_MAX_ARGS] = {FB_T_VOID};
  fb_value args[FB_MAX_ARGS];
  int np = 0;
  for (int i = 0; i < n; i++) {
    pt[np] = FB_T_I32;
    args[np++] = fb_value_i32(idx[i]);
  }
  if (v.type != FB_T_VOID) {
    pt[np] = v.type;
    args[np++] = v;
  }
  fb_type ret = result_of(c->l, op, s);
  fb_kernel *k = fb_kernel_new(c->l, fb_op_table[op].name, np, pt, ret);
  fb_builder b;
  fb_builder_init(&b, k);
  int a[FB_MAX_ARGS];
  for (int i = 0; i < np; i++) a[i] = fb_b_arg(&b, i);
  int id = fb_b_global(&b, op, s, a, n, v.type != FB_T_VOID ? a[n] : -1);
  if (ret != FB_T_VOID) fb_b_ret(&b, id, 0);
  ck_assert_int_eq(b.err, 0);
  fb_value out;
  int rc = run(c, k, args, np, &out);
  ck_assert_msg(rc == want_rc, "line %d: %s on SNode %d: rc %d (%s), expected %d", line,
                fb_op_table[op].name, s, rc, fb_interp_errmsg(c->in), want_rc);
  fb_kernel_free(k);
  return out;
}

static const fb_value NOV = {FB_T_VOID, {0}};

#define I(...) (const int32_t[]){__VA_ARGS__}, (int)(sizeof((int32_t[]){__VA_ARGS__}) / 4)
#define ACTIVE(c, s, ...) (int)op_at(c, FB_OP_IS_ACTIVE, s, I(__VA_ARGS__), NOV, 0, __LINE__).v.u
#define ACTIVATE(c, s, ...) op_at(c, FB_OP_ACTIVATE, s, I(__VA_ARGS__), NOV, 0, __LINE__)
#define DEACTIVATE(c, s, ...) op_at(c, FB_OP_DEACTIVATE, s, I(__VA_ARGS__), NOV, 0, __LINE__)
#define STORE(c, f, val, ...) op_at(c, FB_OP_STORE, f, I(__VA_ARGS__), val, 0, __LINE__)
#define LOAD(c, f, ...) op_at(c, FB_OP_LOAD, f, I(__VA_ARGS__), NOV, 0, __LINE__)
#define APPEND(c, f, val, ...) (int)op_at(c, FB_OP_APPEND, f, I(__VA_ARGS__), val, 0, __LINE__).v.i
#define LENGTH(c, f, ...) (int)op_at(c, FB_OP_LENGTH, f, I(__VA_ARGS__), NOV, 0, __LINE__).v.i

/* ---------------------------------------------------------------- expectations */

static int cells_of(const fb_layout *l, int s) {
  int64_t n = 1;
  for (int d = 0; d < l->nodes[s].ndim; d++) n *= l->nodes[s].shape[l->nodes[s].dim_axis[d]];
  return (int)n;
}

static int listed(const int *v, int n, int x) {
  for (int i = 0; i < n; i++)
    if (v[i] == x) return 1;
  return 0;
}

/* is_active on every cell of s's cell space (cells numbered row-major):
 * exactly the cells in want (nwant of them) are active. */
static void expect_active(ctx *c, int s, const int *want, int nwant, int line) {
  const fb_snode *sn = &c->l->nodes[s];
  int total = cells_of(c->l, s);
  for (int x = 0; x < total; x++) {
    int32_t idx[FB_MAX_AXES];
    for (int d = sn->ndim - 1, rest = x; d >= 0; d--) {
      int n = (int)sn->shape[sn->dim_axis[d]];
      idx[d] = rest % n;
      rest /= n;
    }
    int got = (int)op_at(c, FB_OP_IS_ACTIVE, s, idx, sn->ndim, NOV, 0, line).v.u;
    ck_assert_msg(got == listed(want, nwant, x), "line %d: SNode %d cell %d is %sactive", line, s,
                  x, got ? "" : "in");
  }
}

/* struct_for over s logging each visited cell's number: the visits are
 * exactly want, in that order (row-major, as the interpreter walks). */
static void expect_visits(ctx *c, int s, const int *want, int nwant, int line) {
  const fb_snode *sn = &c->l->nodes[s];
  fb_kernel *k = fb_kernel_new(c->l, "visit", 0, NULL, FB_T_VOID);
  fb_builder b;
  fb_builder_init(&b, k);
  int loop = fb_b_struct_for(&b, s);
  int sv = fb_b_enter(&b, k->stmts[loop].body);
  int lin = fb_b_const_i32(&b, 0);
  for (int d = 0; d < sn->ndim; d++) {
    lin = fb_b_binary(&b, FB_OP_MUL, lin, fb_b_const_i32(&b, (int32_t)sn->shape[sn->dim_axis[d]]));
    lin = fb_b_binary(&b, FB_OP_ADD, lin, fb_b_loop_index(&b, loop, d));
  }
  int slot = fb_b_global(&b, FB_OP_ATOMIC_ADD, c->cnt, NULL, 0, fb_b_const_i32(&b, 1));
  fb_b_store(&b, c->log, &slot, 1, lin);
  fb_b_leave(&b, sv);
  ck_assert_int_eq(b.err, 0);
  int32_t *cnt = field(c, c->cnt), *log = field(c, c->log);
  cnt[0] = 0;
  ck_assert_msg(run(c, k, NULL, 0, NULL) == 0, "line %d: visit run failed", line);
  ck_assert_msg(cnt[0] == nwant, "line %d: struct_for over SNode %d visited %d cells, expected %d",
                line, s, cnt[0], nwant);
  for (int i = 0; i < nwant; i++)
    ck_assert_msg(log[i] == want[i], "line %d: visit %d was cell %d, expected %d", line, i, log[i],
                  want[i]);
  fb_kernel_free(k);
}

#define L(...) (const int[]){__VA_ARGS__}, (int)(sizeof((int[]){__VA_ARGS__}) / sizeof(int))
#define NONE NULL, 0
#define EXPECT_ACTIVE(c, s, cells) expect_active(c, s, cells, __LINE__)
#define EXPECT_VISITS(c, s, cells) expect_visits(c, s, cells, __LINE__)

/* A range of cell numbers [lo, hi) appended to v. */
static int range_into(int *v, int n, int lo, int hi) {
  for (int x = lo; x < hi; x++) v[n++] = x;
  return n;
}

/* ---------------------------------------------------------------- pointer -> dense */

START_TEST(test_pointer_dense) {
  ctx c = ctx_begin();
  int P = node(c.l, 0, FB_SN_POINTER, "i", 8, 0, "P");
  int D = node(c.l, P, FB_SN_DENSE, "i", 4, 0, "D");
  int x = place(c.l, D, "x", FB_T_F32), x2 = place(c.l, D, "x2", FB_T_I32);
  ctx_finalize(&c);
  float *xs = field(&c, x);
  int32_t *x2s = field(&c, x2);

  EXPECT_ACTIVE(&c, P, NONE);
  EXPECT_ACTIVE(&c, D, NONE);
  EXPECT_VISITS(&c, x, NONE);
  ck_assert(LOAD(&c, x, 5).v.f == 0.0);

  /* x[5] activates pointer cell 1 and its whole dense block 4..7 */
  STORE(&c, x, fb_value_f32(1.5f), 5);
  EXPECT_ACTIVE(&c, P, L(1));
  EXPECT_ACTIVE(&c, D, L(4, 5, 6, 7));
  EXPECT_ACTIVE(&c, x, L(4, 5, 6, 7));
  EXPECT_ACTIVE(&c, x2, L(4, 5, 6, 7));
  ck_assert(LOAD(&c, x, 5).v.f == 1.5);
  ck_assert(LOAD(&c, x, 4).v.f == 0.0);
  ck_assert(LOAD(&c, x, 12).v.f == 0.0);
  ck_assert_int_eq(LOAD(&c, x2, 6).v.i, 0);
  for (int n = 0; n < 32; n++) ck_assert(xs[n] == (n == 5 ? 1.5f : 0.0f));
  EXPECT_VISITS(&c, x, L(4, 5, 6, 7));
  EXPECT_VISITS(&c, D, L(4, 5, 6, 7));
  EXPECT_VISITS(&c, P, L(1));

  /* an atomic on an inactive cell reads 0 and activates */
  ck_assert_int_eq(op_at(&c, FB_OP_ATOMIC_ADD, x2, I(30), fb_value_i32(3), 0, __LINE__).v.i, 0);
  ck_assert_int_eq(op_at(&c, FB_OP_ATOMIC_ADD, x2, I(30), fb_value_i32(3), 0, __LINE__).v.i, 3);
  EXPECT_ACTIVE(&c, P, L(1, 7));
  EXPECT_VISITS(&c, x2, L(4, 5, 6, 7, 28, 29, 30, 31));

  /* deactivate a pointer cell: its block reads 0, in the flat array too */
  DEACTIVATE(&c, P, 1);
  EXPECT_ACTIVE(&c, P, L(7));
  EXPECT_ACTIVE(&c, x, L(28, 29, 30, 31));
  ck_assert(LOAD(&c, x, 5).v.f == 0.0);
  ck_assert(xs[5] == 0.0f);
  ck_assert_int_eq(x2s[30], 6);
  DEACTIVATE(&c, P, 1); /* already inactive: a no-op */
  DEACTIVATE(&c, P, 3);
  EXPECT_ACTIVE(&c, P, L(7));
  /* reactivation gives a zero-filled block */
  ACTIVATE(&c, P, 1);
  EXPECT_ACTIVE(&c, D, L(4, 5, 6, 7, 28, 29, 30, 31));
  ck_assert(LOAD(&c, x, 5).v.f == 0.0);
  /* activate through the dense level and through the place */
  ACTIVATE(&c, D, 9);
  ACTIVATE(&c, x2, 0);
  EXPECT_ACTIVE(&c, P, L(0, 1, 2, 7));
  /* deactivate through a place whose parent is dense: refused */
  op_at(&c, FB_OP_DEACTIVATE, x, I(5), NOV, FB_EVERIFY, __LINE__);
  op_at(&c, FB_OP_DEACTIVATE, D, I(5), NOV, FB_EVERIFY, __LINE__);
  EXPECT_ACTIVE(&c, P, L(0, 1, 2, 7));
  ctx_end(&c);
}
END_TEST

/* Inactive cells read 0 whatever their flat storage holds (here poked by
 * the host), and a pointer block is zero-filled when it becomes active. */
START_TEST(test_inactive_reads_zero) {
  ctx c = ctx_begin();
  int P = node(c.l, 0, FB_SN_POINTER, "i", 4, 0, "P");
  int x = place(c.l, node(c.l, P, FB_SN_DENSE, "i", 4, 0, NULL), "x", FB_T_I32);
  int B = node(c.l, 0, FB_SN_BITMASKED, "i", 4, 0, "B");
  int m = place(c.l, B, "m", FB_T_I32);
  ctx_finalize(&c);
  int32_t *xs = field(&c, x), *ms = field(&c, m);
  xs[9] = 77;
  ms[2] = 55;
  ck_assert_int_eq(LOAD(&c, x, 9).v.i, 0);
  ck_assert_int_eq(LOAD(&c, m, 2).v.i, 0);
  ck_assert_int_eq(op_at(&c, FB_OP_ATOMIC_ADD, m, I(2), fb_value_i32(1), 0, __LINE__).v.i, 0);
  ck_assert_int_eq(LOAD(&c, m, 2).v.i, 1);
  EXPECT_VISITS(&c, x, NONE);
  STORE(&c, x, fb_value_i32(5), 8); /* activates block 2 (cells 8..11) */
  ck_assert_int_eq(xs[9], 0);
  ck_assert_int_eq(LOAD(&c, x, 9).v.i, 0);
  ck_assert_int_eq(LOAD(&c, x, 8).v.i, 5);
  ctx_end(&c);
}
END_TEST

/* ---------------------------------------------------------------- pointer -> bitmasked */

START_TEST(test_pointer_bitmasked) {
  ctx c = ctx_begin();
  int P = node(c.l, 0, FB_SN_POINTER, "i", 4, 0, "P");
  int B = node(c.l, P, FB_SN_BITMASKED, "i", 8, 0, "B");
  int y = place(c.l, B, "y", FB_T_I32);
  ctx_finalize(&c);
  int32_t *ys = field(&c, y);

  /* a write activates its pointer cell and only its own bitmasked cell */
  STORE(&c, y, fb_value_i32(7), 9);
  EXPECT_ACTIVE(&c, P, L(1));
  EXPECT_ACTIVE(&c, B, L(9));
  EXPECT_ACTIVE(&c, y, L(9));
  ck_assert_int_eq(LOAD(&c, y, 9).v.i, 7);
  ck_assert_int_eq(LOAD(&c, y, 10).v.i, 0);

  ACTIVATE(&c, B, 20);
  EXPECT_ACTIVE(&c, P, L(1, 2));
  EXPECT_ACTIVE(&c, B, L(9, 20));
  ck_assert_int_eq(LOAD(&c, y, 20).v.i, 0);
  EXPECT_VISITS(&c, y, L(9, 20));
  EXPECT_VISITS(&c, B, L(9, 20));
  EXPECT_VISITS(&c, P, L(1, 2));

  /* deactivating a bitmasked cell (named by its place) keeps the pointer */
  DEACTIVATE(&c, y, 9);
  EXPECT_ACTIVE(&c, B, L(20));
  EXPECT_ACTIVE(&c, P, L(1, 2));
  ck_assert_int_eq(LOAD(&c, y, 9).v.i, 0);
  ck_assert_int_eq(ys[9], 0);
  EXPECT_VISITS(&c, P, L(1, 2));
  EXPECT_VISITS(&c, y, L(20));

  /* deactivating the pointer cell clears the bitmasked cells below it */
  STORE(&c, y, fb_value_i32(5), 12);
  STORE(&c, y, fb_value_i32(6), 15);
  EXPECT_ACTIVE(&c, B, L(12, 15, 20));
  DEACTIVATE(&c, P, 1);
  EXPECT_ACTIVE(&c, P, L(2));
  EXPECT_ACTIVE(&c, B, L(20));
  ck_assert_int_eq(ys[12], 0);
  ck_assert_int_eq(ys[15], 0);
  /* and the reallocated block comes back with no bitmasked cell active */
  ACTIVATE(&c, P, 1);
  EXPECT_ACTIVE(&c, P, L(1, 2));
  EXPECT_ACTIVE(&c, B, L(20));
  EXPECT_VISITS(&c, B, L(20));
  ctx_end(&c);
}
END_TEST

/* ---------------------------------------------------------------- pointer -> pointer -> dense */

START_TEST(test_pointer_pointer_dense) {
  ctx c = ctx_begin();
  int P1 = node(c.l, 0, FB_SN_POINTER, "i", 4, 0, "P1");
  int P2 = node(c.l, P1, FB_SN_POINTER, "i", 4, 0, "P2");
  int D = node(c.l, P2, FB_SN_DENSE, "i", 4, 0, "D");
  int z = place(c.l, D, "z", FB_T_F64);
  ctx_finalize(&c);
  double *zs = field(&c, z);
  int want[64], n;

  STORE(&c, z, fb_value_f64(2.5), 37);
  EXPECT_ACTIVE(&c, P1, L(2));
  EXPECT_ACTIVE(&c, P2, L(9));
  EXPECT_ACTIVE(&c, D, L(36, 37, 38, 39));
  STORE(&c, z, fb_value_f64(1.0), 0);
  STORE(&c, z, fb_value_f64(4.0), 38);
  EXPECT_ACTIVE(&c, P1, L(0, 2));
  EXPECT_ACTIVE(&c, P2, L(0, 9));
  n = range_into(want, range_into(want, 0, 0, 4), 36, 40);
  expect_active(&c, z, want, n, __LINE__);
  expect_visits(&c, z, want, n, __LINE__);
  EXPECT_VISITS(&c, P2, L(0, 9));
  EXPECT_VISITS(&c, P1, L(0, 2));

  /* deactivating the top level empties everything under that cell */
  DEACTIVATE(&c, P1, 2);
  EXPECT_ACTIVE(&c, P1, L(0));
  EXPECT_ACTIVE(&c, P2, L(0));
  EXPECT_ACTIVE(&c, D, L(0, 1, 2, 3));
  ck_assert(zs[37] == 0.0 && zs[38] == 0.0);
  ck_assert(LOAD(&c, z, 0).v.f == 1.0);
  /* activating the middle level activates the top one again, zero-filled */
  ACTIVATE(&c, P2, 9);
  EXPECT_ACTIVE(&c, P1, L(0, 2));
  EXPECT_ACTIVE(&c, P2, L(0, 9));
  ck_assert(LOAD(&c, z, 37).v.f == 0.0);
  ctx_end(&c);
}
END_TEST

/* Deactivating the middle level of pointer -> pointer -> dense leaves the
 * top level and the other middle cells alone; the field (in a dense SNode)
 * cannot be deactivated. */
START_TEST(test_deactivate_middle) {
  ctx c = ctx_begin();
  int P1 = node(c.l, 0, FB_SN_POINTER, "i", 4, 0, "P1");
  int P2 = node(c.l, P1, FB_SN_POINTER, "i", 4, 0, "P2");
  int D = node(c.l, P2, FB_SN_DENSE, "i", 4, 0, "D");
  int z = place(c.l, D, "z", FB_T_F64);
  ctx_finalize(&c);
  STORE(&c, z, fb_value_f64(3.0), 37);
  STORE(&c, z, fb_value_f64(5.0), 41);
  op_at(&c, FB_OP_DEACTIVATE, z, I(37), NOV, FB_EVERIFY, __LINE__);
  EXPECT_ACTIVE(&c, P2, L(9, 10));
  DEACTIVATE(&c, P2, 9);
  EXPECT_ACTIVE(&c, P1, L(2));
  EXPECT_ACTIVE(&c, P2, L(10));
  EXPECT_ACTIVE(&c, D, L(40, 41, 42, 43));
  ck_assert(LOAD(&c, z, 37).v.f == 0.0);
  ck_assert(LOAD(&c, z, 41).v.f == 5.0);
  ctx_end(&c);
}
END_TEST

/* ---------------------------------------------------------------- bitmasked at the root, 2-D */

START_TEST(test_bitmasked_root) {
  ctx c = ctx_begin();
  int B = node(c.l, 0, FB_SN_BITMASKED, "ij", 4, 4, "B");
  int a = place(c.l, B, "a", FB_T_I32), bf = place(c.l, B, "b", FB_T_F32);
  ctx_finalize(&c);
  int32_t *as = field(&c, a);
  float *bs = field(&c, bf);

  STORE(&c, a, fb_value_i32(3), 1, 2);
  EXPECT_ACTIVE(&c, B, L(6));
  EXPECT_ACTIVE(&c, bf, L(6));   /* the sibling place shares the cell */
  ck_assert(LOAD(&c, bf, 1, 2).v.f == 0.0);
  STORE(&c, bf, fb_value_f32(1.5f), 3, 0);
  EXPECT_ACTIVE(&c, a, L(6, 12));
  EXPECT_VISITS(&c, a, L(6, 12));
  EXPECT_VISITS(&c, B, L(6, 12));
  ck_assert(!ACTIVE(&c, a, 2, 1));

  DEACTIVATE(&c, a, 1, 2);
  EXPECT_ACTIVE(&c, B, L(12));
  ck_assert_int_eq(as[6], 0);
  ck_assert(bs[12] == 1.5f);
  ACTIVATE(&c, B, 1, 2);
  ck_assert_int_eq(LOAD(&c, a, 1, 2).v.i, 0);
  EXPECT_VISITS(&c, bf, L(6, 12));
  ctx_end(&c);
}
END_TEST

/* ---------------------------------------------------------------- levels on different axes */

START_TEST(test_mixed_axes) {
  ctx c = ctx_begin();
  int P = node(c.l, 0, FB_SN_POINTER, "i", 4, 0, "P");
  int D = node(c.l, P, FB_SN_DENSE, "j", 8, 0, "D");
  int u = place(c.l, D, "u", FB_T_I32);
  int E = node(c.l, 0, FB_SN_DENSE, "j", 2, 0, "E");
  int M = node(c.l, E, FB_SN_BITMASKED, "i", 8, 0, "M");
  int w = place(c.l, M, "w", FB_T_I32);
  ctx_finalize(&c);
  ck_assert_int_eq(c.l->nodes[u].ndim, 2);
  ck_assert_int_eq(c.l->nodes[M].ndim, 2);
  int want[16], n;

  /* u[2, 5]: pointer cell 2 and the whole row (2, 0..7) of its dense block */
  STORE(&c, u, fb_value_i32(1), 2, 5);
  EXPECT_ACTIVE(&c, P, L(2));
  n = range_into(want, 0, 16, 24);
  expect_active(&c, D, want, n, __LINE__);
  expect_visits(&c, u, want, n, __LINE__);
  /* w[3, 1]: one bitmasked cell in a 2-D cell space (i: 8) x (j: 2) */
  STORE(&c, w, fb_value_i32(1), 3, 1);
  EXPECT_ACTIVE(&c, M, L(7));
  EXPECT_ACTIVE(&c, E, L(0, 1));
  ck_assert(!ACTIVE(&c, w, 3, 0));
  EXPECT_VISITS(&c, M, L(7));
  ctx_end(&c);
}
END_TEST

/* ---------------------------------------------------------------- dynamic under dense */

START_TEST(test_dynamic_dense) {
  ctx c = ctx_begin();
  int R = node(c.l, 0, FB_SN_DENSE, "i", 4, 0, "R");
  int Ld = dyn(c.l, R, "j", 8, 2, "lists");
  int d = place(c.l, Ld, "d", FB_T_I32);
  ctx_finalize(&c);
  int32_t *ds = field(&c, d);

  ck_assert_int_eq(APPEND(&c, d, fb_value_i32(10), 1), 0);
  ck_assert_int_eq(APPEND(&c, d, fb_value_i32(11), 1), 1);
  ck_assert_int_eq(APPEND(&c, d, fb_value_i32(30), 3), 0);
  ck_assert_int_eq(LENGTH(&c, d, 0), 0);
  ck_assert_int_eq(LENGTH(&c, d, 1), 2);
  ck_assert_int_eq(LENGTH(&c, d, 3), 1);
  EXPECT_ACTIVE(&c, d, L(8, 9, 24));
  EXPECT_ACTIVE(&c, Ld, L(8, 9, 24));
  ck_assert_int_eq(LOAD(&c, d, 1, 1).v.i, 11);
  ck_assert_int_eq(LOAD(&c, d, 1, 2).v.i, 0);

  /* a store past the length extends the list; the cells between read 0 */
  STORE(&c, d, fb_value_i32(9), 2, 5);
  ck_assert_int_eq(LENGTH(&c, d, 2), 6);
  ck_assert(ACTIVE(&c, d, 2, 3));
  ck_assert(!ACTIVE(&c, d, 2, 6));
  ck_assert_int_eq(LOAD(&c, d, 2, 3).v.i, 0);
  EXPECT_VISITS(&c, d, L(8, 9, 16, 17, 18, 19, 20, 21, 24));
  EXPECT_VISITS(&c, Ld, L(8, 9, 16, 17, 18, 19, 20, 21, 24));

  /* a full list: the ninth append stores nothing, returns -1, FB_EBOUNDS */
  for (int k = 0; k < 8; k++) ck_assert_int_eq(APPEND(&c, d, fb_value_i32(100 + k), 0), k);
  int32_t before[32];
  memcpy(before, ds, sizeof before);
  fb_value r = op_at(&c, FB_OP_APPEND, d, I(0), fb_value_i32(999), FB_EBOUNDS, __LINE__);
  ck_assert_int_eq(r.v.i, -1);
  ck_assert_str_ne(fb_interp_errmsg(c.in), "");
  ck_assert_int_eq(memcmp(before, ds, sizeof before), 0);
  ck_assert_int_eq(LENGTH(&c, d, 0), 8);
  for (int k = 0; k < 8; k++) ck_assert_int_eq(LOAD(&c, d, 0, k).v.i, 100 + k);

  /* deactivate an inactive cell: nothing; an active one: the list empties */
  DEACTIVATE(&c, d, 1, 5);
  ck_assert_int_eq(LENGTH(&c, d, 1), 2);
  DEACTIVATE(&c, d, 1, 0);
  ck_assert_int_eq(LENGTH(&c, d, 1), 0);
  ck_assert_int_eq(ds[8], 0);
  ck_assert_int_eq(ds[9], 0);
  ck_assert_int_eq(LOAD(&c, d, 1, 1).v.i, 0);
  ck_assert_int_eq(APPEND(&c, d, fb_value_i32(5), 1), 0);
  ck_assert_int_eq(APPEND(&c, d, fb_value_i32(6), 1), 1);
  ck_assert_int_eq(LOAD(&c, d, 1, 1).v.i, 6);
  DEACTIVATE(&c, Ld, 2, 3); /* the named dynamic in its own cell space */
  ck_assert_int_eq(LENGTH(&c, d, 2), 0);
  ck_assert_int_eq(ds[21], 0);

  /* activate grows a list to cover the cell */
  ACTIVATE(&c, Ld, 3, 4);
  ck_assert_int_eq(LENGTH(&c, d, 3), 5);
  ck_assert_int_eq(LOAD(&c, d, 3, 0).v.i, 30);
  ck_assert_int_eq(LOAD(&c, d, 3, 4).v.i, 0);

  /* out-of-range lists */
  r = op_at(&c, FB_OP_APPEND, d, I(4), fb_value_i32(1), FB_EBOUNDS, __LINE__);
  ck_assert_int_eq(r.v.i, -1);
  r = op_at(&c, FB_OP_LENGTH, d, I(-1), NOV, FB_EBOUNDS, __LINE__);
  ck_assert_int_eq(r.v.i, 0);
  ck_assert(!op_at(&c, FB_OP_IS_ACTIVE, d, I(1, 8), NOV, FB_EBOUNDS, __LINE__).v.u);
  ctx_end(&c);
}
END_TEST

/* ------------------------------------------------------------- dynamic under pointer, at root */

START_TEST(test_dynamic_pointer_root) {
  ctx c = ctx_begin();
  int P = node(c.l, 0, FB_SN_POINTER, "i", 4, 0, "P");
  int Le = dyn(c.l, P, "j", 4, 2, NULL);
  int e = place(c.l, Le, "e", FB_T_F32);
  int Q = dyn(c.l, 0, "i", 16, 4, "Q");
  int q = place(c.l, Q, "q", FB_T_I32);
  int out = place(c.l, node(c.l, 0, FB_SN_DENSE, "i", 32, 0, NULL), "out", FB_T_I32);
  ctx_finalize(&c);

  /* append activates the pointer above the list */
  ck_assert_int_eq(APPEND(&c, e, fb_value_f32(1.5f), 2), 0);
  ck_assert_int_eq(APPEND(&c, e, fb_value_f32(2.5f), 2), 1);
  EXPECT_ACTIVE(&c, P, L(2));
  EXPECT_ACTIVE(&c, e, L(8, 9));
  DEACTIVATE(&c, P, 2);
  ck_assert_int_eq(LENGTH(&c, e, 2), 0);
  ck_assert(((float *)field(&c, e))[9] == 0.0f);
  EXPECT_ACTIVE(&c, e, NONE);
  ACTIVATE(&c, P, 2);
  ck_assert_int_eq(LENGTH(&c, e, 2), 0);

  /* 20 iterations of a parallel loop append to a list of 16 at the root */
  fb_kernel *k = fb_kernel_new(c.l, "many", 0, NULL, FB_T_VOID);
  fb_builder b;
  fb_builder_init(&b, k);
  int loop = fb_b_range_for(&b, fb_b_const_i32(&b, 0), fb_b_const_i32(&b, 20), 1);
  int sv = fb_b_enter(&b, k->stmts[loop].body);
  int i = fb_b_loop_index(&b, loop, 0);
  int slot = fb_b_global(&b, FB_OP_APPEND, q, NULL, 0,
                         fb_b_binary(&b, FB_OP_MUL, i, fb_b_const_i32(&b, 10)));
  fb_b_store(&b, out, &i, 1, slot);
  fb_b_leave(&b, sv);
  ck_assert_int_eq(b.err, 0);
  ck_assert_int_eq(run(&c, k, NULL, 0, NULL), FB_EBOUNDS);
  fb_kernel_free(k);
  int32_t *outs = field(&c, out), *qs = field(&c, q);
  for (int n = 0; n < 20; n++) ck_assert_int_eq(outs[n], n < 16 ? n : -1);
  for (int n = 0; n < 16; n++) ck_assert_int_eq(qs[n], n * 10);
  ck_assert_int_eq(op_at(&c, FB_OP_LENGTH, q, NULL, 0, NOV, 0, __LINE__).v.i, 16);
  int want[16];
  expect_visits(&c, q, want, range_into(want, 0, 0, 16), __LINE__);
  ctx_end(&c);
}
END_TEST

/* ---------------------------------------------------------------- snapshot semantics */

/* struct_for over s: log the visit, add s[i] to tot[], then either write
 * s[i + 1] = s[i] + 1 (activating the next cell) or, at cell 0, deactivate
 * cell 5. */
static fb_kernel *snapshot_kernel(ctx *c, int s, int tot, int deactivate) {
  fb_kernel *k = fb_kernel_new(c->l, "snap", 0, NULL, FB_T_VOID);
  fb_builder b;
  fb_builder_init(&b, k);
  int loop = fb_b_struct_for(&b, s);
  int sv = fb_b_enter(&b, k->stmts[loop].body);
  int i = fb_b_loop_index(&b, loop, 0), one = fb_b_const_i32(&b, 1);
  int slot = fb_b_global(&b, FB_OP_ATOMIC_ADD, c->cnt, NULL, 0, one);
  fb_b_store(&b, c->log, &slot, 1, i);
  int v = fb_b_load(&b, s, &i, 1);
  fb_b_global(&b, FB_OP_ATOMIC_ADD, tot, NULL, 0, v);
  if (deactivate) {
    int iff = fb_b_if(&b, fb_b_binary(&b, FB_OP_EQ, i, fb_b_const_i32(&b, 0)), 0);
    fb_b_enter(&b, k->stmts[iff].body);
    int five = fb_b_const_i32(&b, 5);
    fb_b_global(&b, FB_OP_DEACTIVATE, s, &five, 1, -1);
  } else {
    int next = fb_b_binary(&b, FB_OP_ADD, i, one);
    fb_b_store(&b, s, &next, 1, fb_b_binary(&b, FB_OP_ADD, v, one));
  }
  fb_b_leave(&b, sv);
  ck_assert_int_eq(b.err, 0);
  return k;
}

START_TEST(test_snapshot) {
  ctx c = ctx_begin();
  int B = node(c.l, 0, FB_SN_BITMASKED, "i", 16, 0, "B");
  int s = place(c.l, B, "s", FB_T_I32);
  int tot = place(c.l, 0, "tot", FB_T_I32);
  ctx_finalize(&c);
  int32_t *cnt = field(&c, c.cnt), *log = field(&c, c.log), *tots = field(&c, tot);
  STORE(&c, s, fb_value_i32(1), 0);
  STORE(&c, s, fb_value_i32(50), 5);

  /* cells the body activates are not visited: only 0 and 5 */
  fb_kernel *k = snapshot_kernel(&c, s, tot, 0);
  ck_assert_int_eq(run(&c, k, NULL, 0, NULL), 0);
  fb_kernel_free(k);
  ck_assert_int_eq(cnt[0], 2);
  ck_assert_int_eq(log[0], 0);
  ck_assert_int_eq(log[1], 5);
  ck_assert_int_eq(tots[0], 51);
  EXPECT_ACTIVE(&c, B, L(0, 1, 5, 6));
  ck_assert_int_eq(LOAD(&c, s, 1).v.i, 2);
  ck_assert_int_eq(LOAD(&c, s, 6).v.i, 51);

  /* cells the body deactivates are still visited (and read 0) */
  cnt[0] = 0;
  tots[0] = 0;
  k = snapshot_kernel(&c, s, tot, 1);
  ck_assert_int_eq(run(&c, k, NULL, 0, NULL), 0);
  fb_kernel_free(k);
  ck_assert_int_eq(cnt[0], 4);
  ck_assert_int_eq(log[0], 0);
  ck_assert_int_eq(log[1], 1);
  ck_assert_int_eq(log[2], 5);
  ck_assert_int_eq(log[3], 6);
  ck_assert_int_eq(tots[0], 1 + 2 + 0 + 51);
  EXPECT_ACTIVE(&c, B, L(0, 1, 6));
  ctx_end(&c);
}
END_TEST

/* ---------------------------------------------------------------- downsample */

/* for i in xs: y[i // 2] += xs[i], with xs in pointer -> bitmasked and y in
 * pointer -> dense: y's blocks become active where the sums land. */
START_TEST(test_downsample) {
  ctx c = ctx_begin();
  int XP = node(c.l, 0, FB_SN_POINTER, "i", 16, 0, "XP");
  int xs = place(c.l, node(c.l, XP, FB_SN_BITMASKED, "i", 4, 0, NULL), "xs", FB_T_F32);
  int YP = node(c.l, 0, FB_SN_POINTER, "i", 8, 0, "YP");
  int y = place(c.l, node(c.l, YP, FB_SN_DENSE, "i", 4, 0, NULL), "y", FB_T_F32);
  ctx_finalize(&c);
  const int at[5] = {3, 4, 5, 40, 63};
  const float val[5] = {1, 2, 4, 8, 16};
  for (int n = 0; n < 5; n++) STORE(&c, xs, fb_value_f32(val[n]), at[n]);
  EXPECT_VISITS(&c, xs, L(3, 4, 5, 40, 63));

  fb_kernel *k = fb_kernel_new(c.l, "down", 0, NULL, FB_T_VOID);
  fb_builder b;
  fb_builder_init(&b, k);
  int loop = fb_b_struct_for(&b, xs);
  int sv = fb_b_enter(&b, k->stmts[loop].body);
  int i = fb_b_loop_index(&b, loop, 0);
  int h = fb_b_binary(&b, FB_OP_FLOORDIV, i, fb_b_const_i32(&b, 2));
  fb_b_global(&b, FB_OP_ATOMIC_ADD, y, &h, 1, fb_b_load(&b, xs, &i, 1));
  fb_b_leave(&b, sv);
  ck_assert_int_eq(b.err, 0);
  ck_assert_int_eq(run(&c, k, NULL, 0, NULL), 0);
  fb_kernel_free(k);

  float *ys = field(&c, y);
  for (int n = 0; n < 32; n++) {
    float want = n == 1 ? 1 : n == 2 ? 6 : n == 20 ? 8 : n == 31 ? 16 : 0;
    ck_assert_msg(ys[n] == want, "y[%d] = %g, expected %g", n, ys[n], want);
  }
  EXPECT_ACTIVE(&c, YP, L(0, 5, 7));
  int want[12], n = range_into(want, range_into(want, range_into(want, 0, 0, 4), 20, 24), 28, 32);
  expect_visits(&c, y, want, n, __LINE__);
  ck_assert(LOAD(&c, y, 2).v.f == 6.0);
  ck_assert(LOAD(&c, y, 9).v.f == 0.0);
  ctx_end(&c);
}
END_TEST

/* ---------------------------------------------------------------- named SNodes */

/* pointer(ij: 2, 2) as blocks { dense(ij: 4, 4) as cells { rho } }: a
 * struct_for over blocks runs in the blocks' own 2 x 2 cell space. */
START_TEST(test_named_struct_for) {
  ctx c = ctx_begin();
  int blocks = node(c.l, 0, FB_SN_POINTER, "ij", 2, 2, "blocks");
  int cells = node(c.l, blocks, FB_SN_DENSE, "ij", 4, 4, "cells");
  int rho = place(c.l, cells, "rho", FB_T_F32);
  ctx_finalize(&c);
  STORE(&c, rho, fb_value_f32(1.0f), 5, 6);
  EXPECT_VISITS(&c, blocks, L(3));
  int want[32], n = 0;
  for (int i = 4; i < 8; i++) n = range_into(want, n, i * 8 + 4, i * 8 + 8);
  expect_visits(&c, cells, want, n, __LINE__);
  expect_visits(&c, rho, want, n, __LINE__);
  ck_assert(ACTIVE(&c, blocks, 1, 1));
  ck_assert(!ACTIVE(&c, blocks, 1, 0));
  ck_assert(ACTIVE(&c, cells, 7, 4));
  ck_assert(!ACTIVE(&c, cells, 3, 4));

  STORE(&c, rho, fb_value_f32(2.0f), 0, 7);
  EXPECT_VISITS(&c, blocks, L(1, 3));
  /* for I, J in blocks { if I != J { deactivate(blocks, I, J) } } */
  fb_kernel *k = fb_kernel_new(c.l, "prune", 0, NULL, FB_T_VOID);
  fb_builder b;
  fb_builder_init(&b, k);
  int loop = fb_b_struct_for(&b, blocks);
  int sv = fb_b_enter(&b, k->stmts[loop].body);
  int ij[2] = {fb_b_loop_index(&b, loop, 0), fb_b_loop_index(&b, loop, 1)};
  int iff = fb_b_if(&b, fb_b_binary(&b, FB_OP_NE, ij[0], ij[1]), 0);
  fb_b_enter(&b, k->stmts[iff].body);
  fb_b_global(&b, FB_OP_DEACTIVATE, blocks, ij, 2, -1);
  fb_b_leave(&b, sv);
  ck_assert_int_eq(b.err, 0);
  ck_assert_int_eq(run(&c, k, NULL, 0, NULL), 0);
  fb_kernel_free(k);
  EXPECT_ACTIVE(&c, blocks, L(3));
  ck_assert(((float *)field(&c, rho))[7] == 0.0f);
  ck_assert(LOAD(&c, rho, 5, 6).v.f == 1.0);
  ctx_end(&c);
}
END_TEST

/* ---------------------------------------------------------------- out-of-range indices */

START_TEST(test_bounds) {
  ctx c = ctx_begin();
  int P = node(c.l, 0, FB_SN_POINTER, "i", 8, 0, "P");
  int x = place(c.l, node(c.l, P, FB_SN_DENSE, "i", 4, 0, NULL), "x", FB_T_F32);
  int B = node(c.l, 0, FB_SN_BITMASKED, "ij", 2, 3, "B");
  place(c.l, B, "bv", FB_T_U64);
  ctx_finalize(&c);
  ck_assert(!op_at(&c, FB_OP_IS_ACTIVE, P, I(8), NOV, FB_EBOUNDS, __LINE__).v.u);
  ck_assert(!op_at(&c, FB_OP_IS_ACTIVE, P, I(-1), NOV, FB_EBOUNDS, __LINE__).v.u);
  ck_assert(!op_at(&c, FB_OP_IS_ACTIVE, x, I(32), NOV, FB_EBOUNDS, __LINE__).v.u);
  ck_assert_str_ne(fb_interp_errmsg(c.in), "");
  op_at(&c, FB_OP_ACTIVATE, P, I(8), NOV, FB_EBOUNDS, __LINE__);
  op_at(&c, FB_OP_ACTIVATE, x, I(-3), NOV, FB_EBOUNDS, __LINE__);
  op_at(&c, FB_OP_ACTIVATE, B, I(1, 3), NOV, FB_EBOUNDS, __LINE__);
  op_at(&c, FB_OP_STORE, x, I(32), fb_value_f32(1.0f), FB_EBOUNDS, __LINE__);
  EXPECT_ACTIVE(&c, P, NONE);
  EXPECT_ACTIVE(&c, B, NONE);
  ACTIVATE(&c, P, 7);
  ACTIVATE(&c, B, 1, 2);
  op_at(&c, FB_OP_DEACTIVATE, P, I(9), NOV, FB_EBOUNDS, __LINE__);
  op_at(&c, FB_OP_DEACTIVATE, B, I(2, 2), NOV, FB_EBOUNDS, __LINE__);
  EXPECT_ACTIVE(&c, P, L(7));
  EXPECT_ACTIVE(&c, B, L(5));
  ck_assert(op_at(&c, FB_OP_LOAD, x, I(-1), NOV, FB_EBOUNDS, __LINE__).v.f == 0.0);
  ctx_end(&c);
}
END_TEST

/* ---------------------------------------------------------------- a large cell space */

/* pointer(i: 1024) -> dense(i: 1024): 2^20 cells, a quarter of the blocks
 * active; a counting struct_for over them stays well under a second. */
START_TEST(test_large_struct_for) {
  ctx c = ctx_begin();
  int P = node(c.l, 0, FB_SN_POINTER, "i", 1024, 0, "P");
  int big = place(c.l, node(c.l, P, FB_SN_DENSE, "i", 1024, 0, NULL), "big", FB_T_I32);
  ctx_finalize(&c);
  fb_kernel *k = fb_kernel_new(c.l, "touch", 0, NULL, FB_T_VOID);
  fb_builder b;
  fb_builder_init(&b, k);
  int loop = fb_b_range_for(&b, fb_b_const_i32(&b, 0), fb_b_const_i32(&b, 256), 1);
  int sv = fb_b_enter(&b, k->stmts[loop].body);
  int at = fb_b_binary(&b, FB_OP_MUL, fb_b_loop_index(&b, loop, 0), fb_b_const_i32(&b, 4096));
  fb_b_store(&b, big, &at, 1, fb_b_const_i32(&b, 1));
  fb_b_leave(&b, sv);
  ck_assert_int_eq(b.err, 0);
  ck_assert_int_eq(run(&c, k, NULL, 0, NULL), 0);
  fb_kernel_free(k);

  k = fb_kernel_new(c.l, "count", 0, NULL, FB_T_VOID);
  fb_builder_init(&b, k);
  loop = fb_b_struct_for(&b, big);
  sv = fb_b_enter(&b, k->stmts[loop].body);
  int i = fb_b_loop_index(&b, loop, 0);
  int hit = fb_b_global(&b, FB_OP_ATOMIC_ADD, c.cnt, NULL, 0, fb_b_const_i32(&b, 1));
  fb_b_store(&b, big, &i, 1, fb_b_binary(&b, FB_OP_ADD, fb_b_load(&b, big, &i, 1), hit));
  fb_b_leave(&b, sv);
  ck_assert_int_eq(b.err, 0);
  ck_assert_int_eq(run(&c, k, NULL, 0, NULL), 0);
  fb_kernel_free(k);
  ck_assert_int_eq(((int32_t *)field(&c, c.cnt))[0], 1 << 18);
  /* each active cell was visited once, in order: big[i] = 1 + visit number
   * for block starts (they held 1), the visit number elsewhere */
  const int32_t *bs = field(&c, big);
  for (int n = 0, v = 0; n < (1 << 20); n++) {
    if ((n >> 10) % 4 != 0) {
      ck_assert_int_eq(bs[n], 0);
      continue;
    }
    ck_assert_int_eq(bs[n], v + (n % 1024 == 0));
    v++;
  }

  /* the pointer level: exactly every fourth block */
  int want[256];
  for (int n = 0; n < 256; n++) want[n] = 4 * n;
  expect_visits(&c, P, want, 256, __LINE__);
  ctx_end(&c);
}
END_TEST

static Suite *sparse_suite(void) {
  Suite *s = suite_create("interp_sparse");
  TCase *tc = tcase_create("sparse");
  tcase_add_test(tc, test_pointer_dense);
  tcase_add_test(tc, test_inactive_reads_zero);
  tcase_add_test(tc, test_pointer_bitmasked);
  tcase_add_test(tc, test_pointer_pointer_dense);
  tcase_add_test(tc, test_deactivate_middle);
  tcase_add_test(tc, test_bitmasked_root);
  tcase_add_test(tc, test_mixed_axes);
  tcase_add_test(tc, test_dynamic_dense);
  tcase_add_test(tc, test_dynamic_pointer_root);
  tcase_add_test(tc, test_snapshot);
  tcase_add_test(tc, test_downsample);
  tcase_add_test(tc, test_named_struct_for);
  tcase_add_test(tc, test_bounds);
  tcase_add_test(tc, test_large_struct_for);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) { return fbt_run(sparse_suite()); }
