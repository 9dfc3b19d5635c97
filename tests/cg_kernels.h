/* The kernel set shared by test_codegen.c (CPU JIT against the interpreter)
 * and test_ptx.c (PTX through ptxas): one dense layout, and cases made of
 * one to four kernels run in order (later kernels see what earlier ones
 * wrote). Each kernel is one task: a few values followed by one par_for or
 * struct_for (loop = that statement), or a serial kernel (loop = -1). */
#ifndef FB_TEST_CG_KERNELS_H
#define FB_TEST_CG_KERNELS_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fusebox/ir.h"

#define CG_N 64     /* elements of the 1-D fields */
#define CG_R 16     /* result slots per element */
#define CG_MAXSTEPS 4

typedef struct cg_layout {
  fb_layout *l;
  /* dense i[64]: inputs */
  int fa, fb, ia, ib, ua, ub, la, lb, lu, da, db, bo;
  /* dense ij[64,16]: results, slot j of element i */
  int rf, rd, ri, rl, ru, rlu, rb;
  /* 0-d fields under the root */
  int s_i, s_f;
  /* dense i[8]: atomic accumulators */
  int ai, af, ad, al, au, alu;
  /* dense ij[8,6] > dense ij[4,2]: 32x12 */
  int gin, g, h;
  /* dense i[16] > dense j[8]: 16x8 */
  int m, mf;
  /* dense ij[32,12]: stencil output */
  int g2;
  /* dense i[4] > dense i[4] > dense i[4]: 64 along one axis */
  int t;
} cg_layout;

typedef struct cg_step {
  fb_kernel *k;
  int loop;                 /* par_for / struct_for id, -1 serial */
  fb_value args[8];
  int nargs;
} cg_step;

typedef struct cg_case {
  const char *name;
  cg_step steps[CG_MAXSTEPS];
  int nsteps;
  int expect;    /* result of the last step: 0 or FB_EBOUNDS */
  int ulps;      /* float tolerance in units in the last place (0: exact) */
} cg_case;

/* ---------------------------------------------------------------- layout */

static int cg_dense(fb_layout *l, int parent, const char *axes, int64_t a, int64_t b) {
  int64_t sz[2] = {a, b};
  return fb_layout_add(l, parent, FB_SN_DENSE, axes, sz, 0, NULL);
}

static int cg_layout_build(cg_layout *c) {
  fb_layout *l = fb_layout_new();
  if (!l) return -1;
  c->l = l;
  int d1 = cg_dense(l, 0, "i", CG_N, 0);
  c->fa = fb_layout_place(l, d1, "fa", FB_T_F32);
  c->fb = fb_layout_place(l, d1, "fb", FB_T_F32);
  c->ia = fb_layout_place(l, d1, "ia", FB_T_I32);
  c->ib = fb_layout_place(l, d1, "ib", FB_T_I32);
  c->ua = fb_layout_place(l, d1, "ua", FB_T_U32);
  c->ub = fb_layout_place(l, d1, "ub", FB_T_U32);
  c->la = fb_layout_place(l, d1, "la", FB_T_I64);
  c->lb = fb_layout_place(l, d1, "lb", FB_T_I64);
  c->lu = fb_layout_place(l, d1, "lu", FB_T_U64);
  c->da = fb_layout_place(l, d1, "da", FB_T_F64);
  c->db = fb_layout_place(l, d1, "db", FB_T_F64);
  c->bo = fb_layout_place(l, d1, "bo", FB_T_BOOL);
  int dr = cg_dense(l, 0, "ij", CG_N, CG_R);
  c->rb = fb_layout_place(l, dr, "rb", FB_T_BOOL); /* first: odd offsets after it */
  c->rf = fb_layout_place(l, dr, "rf", FB_T_F32);
  c->rd = fb_layout_place(l, dr, "rd", FB_T_F64);
  c->ri = fb_layout_place(l, dr, "ri", FB_T_I32);
  c->rl = fb_layout_place(l, dr, "rl", FB_T_I64);
  c->ru = fb_layout_place(l, dr, "ru", FB_T_U32);
  c->rlu = fb_layout_place(l, dr, "rlu", FB_T_U64);
  c->s_i = fb_layout_place(l, 0, "s_i", FB_T_I32);
  c->s_f = fb_layout_place(l, 0, "s_f", FB_T_F32);
  int da = cg_dense(l, 0, "i", 8, 0);
  c->ai = fb_layout_place(l, da, "ai", FB_T_I32);
  c->af = fb_layout_place(l, da, "af", FB_T_F32);
  c->ad = fb_layout_place(l, da, "ad", FB_T_F64);
  c->al = fb_layout_place(l, da, "al", FB_T_I64);
  c->au = fb_layout_place(l, da, "au", FB_T_U32);
  c->alu = fb_layout_place(l, da, "alu", FB_T_U64);
  int go = cg_dense(l, 0, "ij", 8, 6);
  c->gin = cg_dense(l, go, "ij", 4, 2);
  c->g = fb_layout_place(l, c->gin, "g", FB_T_F32);
  c->h = fb_layout_place(l, c->gin, "h", FB_T_I32);
  int mo = cg_dense(l, 0, "i", 16, 0);
  int mi = cg_dense(l, mo, "j", 8, 0);
  c->m = fb_layout_place(l, mi, "m", FB_T_I32);
  c->mf = fb_layout_place(l, mi, "mf", FB_T_F64);
  int sg = cg_dense(l, 0, "ij", 32, 12);
  c->g2 = fb_layout_place(l, sg, "g2", FB_T_F32);
  int t1 = cg_dense(l, 0, "i", 4, 0);
  int t2 = cg_dense(l, t1, "i", 4, 0);
  int t3 = cg_dense(l, t2, "i", 4, 0);
  c->t = fb_layout_place(l, t3, "t", FB_T_I32);
  char err[200];
  return fb_layout_finalize(l, err, sizeof err);
}

/* ---------------------------------------------------------------- builder shorthands */

#define K_I32(v) fb_b_const_i32(b, (v))
#define K_I64(v) fb_b_const_i64(b, (v))
#define K_U32(v) fb_b_const_u32(b, (v))
#define K_U64(v) fb_b_const_u64(b, (v))
#define K_F32(v) fb_b_const_f32(b, (v))
#define K_F64(v) fb_b_const_f64(b, (v))
#define K_BOOL(v) fb_b_const_bool(b, (v))
#define K_BIN(op, x, y) fb_b_binary(b, FB_OP_##op, (x), (y))
#define K_UN(op, x) fb_b_unary(b, FB_OP_##op, (x))
#define K_CAST(t, x) fb_b_cast(b, FB_T_##t, (x))

static int cg_ld(fb_builder *b, int f, int i) { return fb_b_load(b, f, &i, 1); }
static int cg_st(fb_builder *b, int f, int i, int v) { return fb_b_store(b, f, &i, 1, v); }
static int cg_ld2(fb_builder *b, int f, int i, int j) {
  int ix[2] = {i, j};
  return fb_b_load(b, f, ix, 2);
}
static int cg_st2(fb_builder *b, int f, int i, int j, int v) {
  int ix[2] = {i, j};
  return fb_b_store(b, f, ix, 2, v);
}
/* Result slot: field[i, slot] = v. */
static int cg_res(fb_builder *b, int f, int i, int slot, int v) {
  return cg_st2(b, f, i, K_I32(slot), v);
}
static int cg_atomic(fb_builder *b, fb_op op, int f, int i, int v) {
  return fb_b_global(b, op, f, &i, 1, v);
}

/* A loop whose body the builder enters; *idx = its index. */
static int cg_for(fb_builder *b, int begin, int end, int par, int *idx, int *saved) {
  int id = fb_b_range_for(b, begin, end, par);
  *saved = fb_b_enter(b, b->k->stmts[id].body);
  *idx = fb_b_loop_index(b, id, 0);
  return id;
}
static int cg_struct(fb_builder *b, int snode, int *i, int *j, int *saved) {
  int id = fb_b_struct_for(b, snode);
  *saved = fb_b_enter(b, b->k->stmts[id].body);
  *i = fb_b_loop_index(b, id, 0);
  if (j) *j = fb_b_loop_index(b, id, 1);
  return id;
}
/* if cond: enter then (*saved); cg_else switches to the else block. */
static int cg_if(fb_builder *b, int cond, int with_else, int *saved) {
  int id = fb_b_if(b, cond, with_else);
  *saved = fb_b_enter(b, b->k->stmts[id].body);
  return id;
}
static void cg_else(fb_builder *b, int ifid) { b->block = b->k->stmts[ifid].orelse; }

static fb_kernel *cg_new(const cg_layout *c, const char *name, int np, const fb_type *p,
                         fb_type ret, fb_builder *b) {
  fb_kernel *k = fb_kernel_new(c->l, name, np, p, ret);
  if (k) fb_builder_init(b, k);
  return k;
}

static void cg_add(cg_case *cs, fb_kernel *k, int loop) {
  cg_step *s = &cs->steps[cs->nsteps++];
  memset(s, 0, sizeof *s);
  s->k = k;
  s->loop = loop;
}

/* ---------------------------------------------------------------- kernels */

/* Inputs for the other kernels: mixed signs, zeros, INT_MIN / -1 pairs. */
static void cg_k_init(const cg_layout *c, cg_case *cs) {
  fb_builder bb, *b = &bb;
  fb_kernel *k = cg_new(c, "init", 0, NULL, FB_T_VOID, b);
  int sv, i;
  int lp = cg_for(b, K_I32(0), K_I32(CG_N), 1, &i, &sv);
  int fi = K_CAST(F32, i);
  cg_st(b, c->fa, i, K_BIN(SUB, K_BIN(MUL, fi, K_F32(0.37f)), K_F32(7.1f)));
  cg_st(b, c->fb, i, K_BIN(SUB, K_CAST(F32, K_BIN(REM, K_BIN(MUL, i, i), K_I32(13))), K_F32(6.5f)));
  int ia = K_BIN(SUB, K_BIN(REM, K_BIN(MUL, i, K_I32(7919)), K_I32(201)), K_I32(100));
  int ib = K_BIN(SUB, K_BIN(REM, i, K_I32(7)), K_I32(3));
  int sv2;
  int first = cg_if(b, K_BIN(EQ, i, K_I32(0)), 1, &sv2);
  cg_st(b, c->ia, i, K_I32(INT32_MIN));
  cg_st(b, c->ib, i, K_I32(-1));
  cg_else(b, first);
  cg_st(b, c->ia, i, ia);
  cg_st(b, c->ib, i, ib);
  fb_b_leave(b, sv2);
  int i64 = K_CAST(I64, i);
  cg_st(b, c->ua, i, K_CAST(U32, K_BIN(MUL, i64, K_I64(2654435761ll))));
  cg_st(b, c->ub, i, K_CAST(U32, K_BIN(REM, i, K_I32(5))));
  int la = K_BIN(MUL, K_CAST(I64, ia), K_I64(123456789123ll));
  int sv3;
  int second = cg_if(b, K_BIN(EQ, i, K_I32(1)), 1, &sv3);
  cg_st(b, c->la, i, K_I64(INT64_MIN));
  cg_st(b, c->lb, i, K_I64(-1));
  cg_else(b, second);
  cg_st(b, c->la, i, la);
  cg_st(b, c->lb, i, K_CAST(I64, ib));
  fb_b_leave(b, sv3);
  cg_st(b, c->lu, i, K_CAST(U64, K_BIN(MUL, la, K_I64(977))));
  cg_st(b, c->da, i, K_BIN(MUL, K_CAST(F64, cg_ld(b, c->fa, i)), K_F64(1.1)));
  cg_st(b, c->db, i, K_BIN(SUB, K_CAST(F64, K_BIN(REM, i, K_I32(9))), K_F64(4.0)));
  cg_st(b, c->bo, i, K_BIN(EQ, K_BIN(REM, i, K_I32(3)), K_I32(0)));
  fb_b_leave(b, sv);
  cg_add(cs, k, lp);
}

static void cg_case_map_f32(const cg_layout *c, cg_case *cs) {
  cg_k_init(c, cs);
  fb_builder bb, *b = &bb;
  fb_kernel *k = cg_new(c, "map_f32", 0, NULL, FB_T_VOID, b);
  int sv, i;
  int lp = cg_for(b, K_I32(0), K_I32(CG_N), 1, &i, &sv);
  int x = cg_ld(b, c->fa, i), y = cg_ld(b, c->fb, i);
  cg_st(b, c->fb, i, K_BIN(ADD, K_BIN(MUL, x, K_F32(2.5f)), y));
  cg_st(b, c->fa, i, K_BIN(DIV, K_BIN(SUB, x, y), K_BIN(ADD, y, K_F32(0.5f))));
  int d = cg_ld(b, c->da, i);
  cg_st(b, c->db, i, K_BIN(SUB, K_BIN(DIV, K_CAST(F64, x), K_F64(3.0)), d));
  cg_st(b, c->da, i, K_UN(SQRT, K_UN(ABS, d)));
  cg_res(b, c->rf, i, 0, K_UN(SQRT, x));          /* NaN for negatives */
  cg_res(b, c->rf, i, 1, K_UN(RSQRT, K_UN(ABS, x))); /* inf at 0 */
  cg_res(b, c->rd, i, 0, K_UN(RSQRT, K_UN(ABS, d)));
  fb_b_leave(b, sv);
  cg_add(cs, k, lp);
}

/* Integer arithmetic of one type on fields (fa, fb) into result field r. */
static void cg_int_ops(fb_builder *b, int i, int x, int y, int r) {
  fb_op ops[] = {FB_OP_ADD,      FB_OP_SUB,      FB_OP_MUL, FB_OP_DIV, FB_OP_REM,
                 FB_OP_FLOORDIV, FB_OP_FLOORMOD, FB_OP_MIN, FB_OP_MAX, FB_OP_AND,
                 FB_OP_OR,       FB_OP_XOR,      FB_OP_SHL, FB_OP_SHR};
  int n = (int)(sizeof ops / sizeof ops[0]);
  for (int s = 0; s < n; s++) cg_res(b, r, i, s, fb_b_binary(b, ops[s], x, y));
  cg_res(b, r, i, n, K_UN(NEG, x));
  cg_res(b, r, i, n + 1, K_UN(ABS, x));
  /* shift by a loop-dependent count, often past the width */
  int cnt = fb_b_cast(b, (fb_type)b->k->stmts[x].type, i);
  int sh = fb_b_binary(b, FB_OP_SHL, x, cnt);
  cg_res(b, r, i, 15, K_BIN(XOR, K_UN(NOT, sh), fb_b_binary(b, FB_OP_SHR, x, cnt)));
}

static void cg_case_int_ops(const cg_layout *c, cg_case *cs) {
  cg_k_init(c, cs);
  fb_builder bb, *b = &bb;
  fb_kernel *k = cg_new(c, "int_ops", 0, NULL, FB_T_VOID, b);
  int sv, i;
  int lp = cg_for(b, K_I32(0), K_I32(CG_N), 1, &i, &sv);
  cg_int_ops(b, i, cg_ld(b, c->ia, i), cg_ld(b, c->ib, i), c->ri);
  cg_int_ops(b, i, cg_ld(b, c->ua, i), cg_ld(b, c->ub, i), c->ru);
  cg_int_ops(b, i, cg_ld(b, c->la, i), cg_ld(b, c->lb, i), c->rl);
  cg_int_ops(b, i, cg_ld(b, c->lu, i), K_CAST(U64, cg_ld(b, c->lb, i)), c->rlu);
  /* comparisons, signed and unsigned, into rb */
  fb_op cmps[] = {FB_OP_EQ, FB_OP_NE, FB_OP_LT, FB_OP_LE, FB_OP_GT, FB_OP_GE};
  for (int s = 0; s < 6; s++) {
    cg_res(b, c->rb, i, s, fb_b_binary(b, cmps[s], cg_ld(b, c->ia, i), cg_ld(b, c->ib, i)));
    cg_res(
        b, c->rb, i, 6 + s,
        fb_b_binary(b, cmps[s], K_CAST(U32, cg_ld(b, c->ia, i)), K_CAST(U32, cg_ld(b, c->ib, i))));
  }
  cg_res(b, c->rb, i, 12, K_BIN(LT, cg_ld(b, c->lu, i), K_CAST(U64, cg_ld(b, c->la, i))));
  cg_res(b, c->rb, i, 13, K_BIN(GE, cg_ld(b, c->la, i), cg_ld(b, c->lb, i)));
  fb_b_leave(b, sv);
  cg_add(cs, k, lp);
}

/* Special values of every type, written by a serial kernel with constant
 * indices: NaN, infinities, values past every integer range, halves. */
static void cg_k_cast_sources(const cg_layout *c, cg_case *cs) {
  static const float f[16] = {0.0f,      -0.0f,         1.5f,        -1.5f,  2.5f, -2.5f,
                              1e10f,     -1e10f,        3e9f,        4.3e9f, NAN,  INFINITY,
                              -INFINITY, 2147483520.0f, 0.49999997f, 1e20f};
  static const double d[16] = {0.0,       -0.0,         1.5,           -1.5,        2.5, -2.5,
                               9.3e18,    -9.3e18,      1.9e19,        2.1e19,      NAN, INFINITY,
                               -INFINITY, 2147483647.5, -2147483648.7, 4294967295.9};
  static const int64_t l[16] = {0,
                                -1,
                                1,
                                INT64_MIN,
                                INT64_MAX,
                                INT32_MIN,
                                INT32_MAX,
                                4294967295ll,
                                4294967296ll,
                                -4294967297ll,
                                16777217,
                                9007199254740993ll,
                                -123456789,
                                255,
                                256,
                                (int64_t)0x8000000080000001ull};
  fb_builder bb, *b = &bb;
  fb_kernel *k = cg_new(c, "cast_sources", 0, NULL, FB_T_VOID, b);
  for (int s = 0; s < 16; s++) {
    int ix = K_I32(s);
    cg_st(b, c->fa, ix, K_F32(f[s]));
    cg_st(b, c->da, ix, K_F64(d[s]));
    cg_st(b, c->la, ix, K_I64(l[s]));
    cg_st(b, c->ia, ix, K_I32((int32_t)(uint32_t)(uint64_t)l[s]));
    cg_st(b, c->ua, ix, K_U32((uint32_t)(uint64_t)l[s] ^ 0x80000000u));
    cg_st(b, c->lu, ix, K_U64((uint64_t)l[s] * 3));
    cg_st(b, c->bo, ix, K_BOOL(s % 3 == 1));
  }
  cg_add(cs, k, -1);
}

static void cg_case_casts(const cg_layout *c, cg_case *cs) {
  cg_k_cast_sources(c, cs);
  fb_builder bb, *b = &bb;
  fb_kernel *k = cg_new(c, "casts", 0, NULL, FB_T_VOID, b);
  int sv, i;
  int lp = cg_for(b, K_I32(0), K_I32(16), 1, &i, &sv);
  int src[7] = {cg_ld(b, c->fa, i), cg_ld(b, c->da, i), cg_ld(b, c->ia, i), cg_ld(b, c->la, i),
                cg_ld(b, c->ua, i), cg_ld(b, c->lu, i), cg_ld(b, c->bo, i)};
  const int dst[7] = {c->rf, c->rd, c->ri, c->rl, c->ru, c->rlu, c->rb};
  const fb_type dt[7] = {FB_T_F32, FB_T_F64, FB_T_I32, FB_T_I64, FB_T_U32, FB_T_U64, FB_T_BOOL};
  for (int s = 0; s < 7; s++)
    for (int d = 0; d < 7; d++) cg_res(b, dst[d], i, s, fb_b_cast(b, dt[d], src[s]));
  fb_b_leave(b, sv);
  cg_add(cs, k, lp);
}

/* Float arithmetic that must match exactly: floordiv, floormod, rem, min,
 * max, neg, abs, floor, ceil, round, comparisons with NaN. */
static void cg_float_exact(fb_builder *b, int i, int x, int y, int r, int rb, int base) {
  fb_op ops[] = {FB_OP_FLOORDIV, FB_OP_FLOORMOD, FB_OP_REM, FB_OP_MIN, FB_OP_MAX};
  for (int s = 0; s < 5; s++) cg_res(b, r, i, s, fb_b_binary(b, ops[s], x, y));
  cg_res(b, r, i, 5, K_UN(NEG, x));
  cg_res(b, r, i, 6, K_UN(ABS, y));
  cg_res(b, r, i, 7, K_UN(FLOOR, x));
  cg_res(b, r, i, 8, K_UN(CEIL, x));
  cg_res(b, r, i, 9, K_UN(ROUND, x));
  cg_res(b, r, i, 10,
         K_UN(ROUND,
              K_BIN(MUL, y, fb_b_const(b, fb_value_cast(fb_value_f64(0.5), b->k->stmts[x].type)))));
  int nan = K_BIN(DIV, K_BIN(SUB, y, y), K_BIN(SUB, y, y)); /* 0/0 */
  cg_res(b, r, i, 11, K_BIN(MIN, nan, x));
  cg_res(b, r, i, 12, K_BIN(MAX, x, nan));
  fb_op cmps[] = {FB_OP_EQ, FB_OP_NE, FB_OP_LT, FB_OP_LE, FB_OP_GT, FB_OP_GE};
  for (int s = 0; s < 6; s++) {
    cg_res(b, rb, i, base + s, fb_b_binary(b, cmps[s], x, y));
    if (base == 0) cg_res(b, rb, i, 12 + (s % 4), fb_b_binary(b, cmps[s], nan, x));
  }
}

static void cg_case_float_ops(const cg_layout *c, cg_case *cs) {
  cg_k_init(c, cs);
  fb_builder bb, *b = &bb;
  fb_kernel *k = cg_new(c, "float_ops", 0, NULL, FB_T_VOID, b);
  int sv, i;
  int lp = cg_for(b, K_I32(0), K_I32(CG_N), 1, &i, &sv);
  cg_float_exact(b, i, cg_ld(b, c->fa, i), cg_ld(b, c->fb, i), c->rf, c->rb, 0);
  cg_float_exact(b, i, cg_ld(b, c->da, i), cg_ld(b, c->db, i), c->rd, c->rb, 6);
  fb_b_leave(b, sv);
  cg_add(cs, k, lp);
}

/* Transcendental math on values in and out of each function's domain. */
static void cg_math(fb_builder *b, int i, int x, int y, int r) {
  fb_type t = (fb_type)b->k->stmts[x].type;
  int c20 = fb_b_const(b, fb_value_cast(fb_value_f64(20.0), t));
  int c4 = fb_b_const(b, fb_value_cast(fb_value_f64(4.0), t));
  fb_op un[] = {FB_OP_SIN, FB_OP_COS, FB_OP_TAN, FB_OP_ATAN, FB_OP_EXP};
  for (int s = 0; s < 5; s++) cg_res(b, r, i, s, fb_b_unary(b, un[s], x));
  int small = K_BIN(DIV, x, c20);
  cg_res(b, r, i, 5, K_UN(ASIN, small));
  cg_res(b, r, i, 6, K_UN(ACOS, small));
  cg_res(b, r, i, 7, K_UN(ASIN, x)); /* NaN outside [-1, 1] */
  cg_res(b, r, i, 8, K_UN(LOG, K_UN(ABS, x)));
  cg_res(b, r, i, 9, K_UN(LOG, x));
  cg_res(b, r, i, 10, K_BIN(POW, K_UN(ABS, x), K_BIN(DIV, y, c4)));
  cg_res(b, r, i, 11, K_BIN(POW, x, y));
  cg_res(b, r, i, 12, K_BIN(ATAN2, x, y));
  cg_res(b, r, i, 13, K_BIN(ATAN2, y, x));
  cg_res(b, r, i, 14, K_UN(EXP, K_BIN(MUL, x, c20))); /* overflows */
  cg_res(b, r, i, 15, K_UN(SIN, K_BIN(MUL, x, K_BIN(MUL, c20, c20))));
}

static void cg_case_math(const cg_layout *c, cg_case *cs) {
  cg_k_init(c, cs);
  fb_builder bb, *b = &bb;
  fb_kernel *k = cg_new(c, "math", 0, NULL, FB_T_VOID, b);
  int sv, i;
  int lp = cg_for(b, K_I32(0), K_I32(CG_N), 1, &i, &sv);
  cg_math(b, i, cg_ld(b, c->fa, i), cg_ld(b, c->fb, i), c->rf);
  cg_math(b, i, cg_ld(b, c->da, i), cg_ld(b, c->db, i), c->rd);
  fb_b_leave(b, sv);
  cg_add(cs, k, lp);
  cs->ulps = 2;
}

/* struct_for over a 2-D field in nested dense containers, and over the
 * inner container itself. */
static void cg_case_struct_for(const cg_layout *c, cg_case *cs) {
  fb_builder bb, *b = &bb;
  fb_kernel *k = cg_new(c, "sfor_field", 0, NULL, FB_T_VOID, b);
  int sv, i, j;
  int lp = cg_struct(b, c->g, &i, &j, &sv);
  cg_st2(b, c->g, i, j, K_BIN(ADD, K_BIN(MUL, K_CAST(F32, i), K_F32(100.0f)), K_CAST(F32, j)));
  fb_b_leave(b, sv);
  cg_add(cs, k, lp);
  k = cg_new(c, "sfor_container", 0, NULL, FB_T_VOID, b);
  lp = cg_struct(b, c->gin, &i, &j, &sv);
  cg_st2(b, c->h, i, j, K_BIN(SUB, K_BIN(MUL, i, j), K_BIN(MUL, j, K_I32(1000))));
  fb_b_leave(b, sv);
  cg_add(cs, k, lp);
  k = cg_new(c, "sfor_deep", 0, NULL, FB_T_VOID, b);
  lp = cg_struct(b, c->t, &i, NULL, &sv);
  cg_st(b, c->t, i, K_BIN(ADD, K_BIN(MUL, i, K_I32(3)), K_I32(1)));
  fb_b_leave(b, sv);
  cg_add(cs, k, lp);
}

/* A struct_for over a larger space than the field it writes: indices the
 * code generator can prove in range lose their check, the others keep it. */
static void cg_case_sfor_oob(const cg_layout *c, cg_case *cs) {
  fb_builder bb, *b = &bb;
  fb_kernel *k = cg_new(c, "sfor_oob", 0, NULL, FB_T_VOID, b);
  int sv, i, j;
  int lp = cg_struct(b, c->g2, &i, &j, &sv); /* 32 x 12 */
  int half = K_BIN(DIV, i, K_I32(2)), low = K_BIN(FLOORMOD, j, K_I32(8));
  cg_st2(b, c->mf, half, low, K_CAST(F64, K_BIN(ADD, i, j)));      /* always in 16 x 8 */
  cg_st2(b, c->m, i, j, K_BIN(SUB, i, j));                        /* not always */
  cg_st2(b, c->m, K_BIN(REM, K_BIN(SUB, i, K_I32(16)), K_I32(16)), low, j); /* negative rows */
  fb_b_leave(b, sv);
  cg_add(cs, k, lp);
  cs->expect = FB_EBOUNDS;
}

/* Nested dense containers split along different axes, read back through
 * another path; a 3-level split of one axis. */
static void cg_case_nested(const cg_layout *c, cg_case *cs) {
  fb_builder bb, *b = &bb;
  fb_kernel *k = cg_new(c, "nested", 0, NULL, FB_T_VOID, b);
  int sv, sv2, i, j;
  int lp = cg_for(b, K_I32(0), K_I32(16), 1, &i, &sv);
  cg_for(b, K_I32(0), K_I32(8), 0, &j, &sv2);
  int v = K_BIN(ADD, K_BIN(MUL, i, K_I32(8)), j);
  cg_st2(b, c->m, i, j, v);
  cg_st2(b, c->mf, i, j, K_BIN(MUL, K_CAST(F64, cg_ld2(b, c->m, i, j)), K_F64(0.5)));
  cg_st(b, c->t, v, K_BIN(SUB, K_I32(1000), v)); /* 16*8 > 64: half out of bounds */
  fb_b_leave(b, sv2);
  fb_b_leave(b, sv);
  cg_add(cs, k, lp);
  cs->expect = FB_EBOUNDS;
}

/* 2-D stencil with clamped neighbour indices. */
static void cg_case_stencil(const cg_layout *c, cg_case *cs) {
  fb_builder bb, *b = &bb;
  fb_kernel *k = cg_new(c, "stencil_init", 0, NULL, FB_T_VOID, b);
  int sv, sv2, i, j;
  int lp = cg_struct(b, c->g, &i, &j, &sv);
  int v = K_BIN(REM, K_BIN(ADD, K_BIN(MUL, i, K_I32(37)), K_BIN(MUL, j, K_I32(11))), K_I32(17));
  cg_st2(b, c->g, i, j, K_BIN(MUL, K_CAST(F32, v), K_F32(0.125f)));
  fb_b_leave(b, sv);
  cg_add(cs, k, lp);
  k = cg_new(c, "stencil", 0, NULL, FB_T_VOID, b);
  lp = cg_for(b, K_I32(0), K_I32(32), 1, &i, &sv);
  cg_for(b, K_I32(0), K_I32(12), 0, &j, &sv2);
  int z = K_I32(0), one = K_I32(1);
  int im = K_BIN(MAX, K_BIN(SUB, i, one), z), ip = K_BIN(MIN, K_BIN(ADD, i, one), K_I32(31));
  int jm = K_BIN(MAX, K_BIN(SUB, j, one), z), jp = K_BIN(MIN, K_BIN(ADD, j, one), K_I32(11));
  int s = K_BIN(ADD, K_BIN(ADD, cg_ld2(b, c->g, im, j), cg_ld2(b, c->g, ip, j)),
                K_BIN(ADD, cg_ld2(b, c->g, i, jm), cg_ld2(b, c->g, i, jp)));
  int lap = K_BIN(SUB, s, K_BIN(MUL, K_F32(4.0f), cg_ld2(b, c->g, i, j)));
  cg_st2(b, c->g2, i, j, K_BIN(ADD, cg_ld2(b, c->g, i, j), K_BIN(MUL, K_F32(0.2f), lap)));
  fb_b_leave(b, sv2);
  fb_b_leave(b, sv);
  cg_add(cs, k, lp);
}

/* Every atomic on every type it takes, keeping the old values. */
static void cg_case_atomics(const cg_layout *c, cg_case *cs) {
  cg_k_init(c, cs);
  fb_builder bb, *b = &bb;
  fb_kernel *k = cg_new(c, "atomics", 0, NULL, FB_T_VOID, b);
  int sv, i;
  int lp = cg_for(b, K_I32(0), K_I32(CG_N), 1, &i, &sv);
  int x = cg_ld(b, c->ia, i), f = cg_ld(b, c->fa, i), d = cg_ld(b, c->da, i);
  int l = cg_ld(b, c->la, i), u = cg_ld(b, c->ua, i), lu = cg_ld(b, c->lu, i);
  fb_op iops[] = {FB_OP_ATOMIC_ADD, FB_OP_ATOMIC_SUB, FB_OP_ATOMIC_MIN, FB_OP_ATOMIC_MAX,
                  FB_OP_ATOMIC_AND, FB_OP_ATOMIC_OR,  FB_OP_ATOMIC_XOR};
  for (int s = 0; s < 7; s++) {
    cg_res(b, c->ri, i, s, cg_atomic(b, iops[s], c->ai, K_I32(s), x));
    cg_res(b, c->ru, i, s, cg_atomic(b, iops[s], c->au, K_I32(s), u));
    cg_res(b, c->rl, i, s, cg_atomic(b, iops[s], c->al, K_I32(s), l));
    cg_res(b, c->rlu, i, s, cg_atomic(b, iops[s], c->alu, K_I32(s), lu));
  }
  for (int s = 0; s < 4; s++) {
    cg_res(b, c->rf, i, s, cg_atomic(b, iops[s], c->af, K_I32(s), f));
    cg_res(b, c->rd, i, s, cg_atomic(b, iops[s], c->ad, K_I32(s), d));
  }
  /* histogram into a 0-d field and into a 2-D one */
  fb_b_global(b, FB_OP_ATOMIC_ADD, c->s_i, NULL, 0, K_BIN(REM, x, K_I32(7)));
  fb_b_global(b, FB_OP_ATOMIC_ADD, c->s_f, NULL, 0, f);
  int ix[2] = {K_BIN(REM, i, K_I32(5)), K_I32(15)};
  fb_b_global(b, FB_OP_ATOMIC_ADD, c->ri, ix, 2, K_I32(1));
  fb_b_leave(b, sv);
  cg_add(cs, k, lp);
  cs->ulps = 4; /* the f32 sum into s_f is accumulated per chunk (reduction) */
}

/* Nested serial loops inside a parallel one; a serial kernel of nested
 * loops returning a value. */
static void cg_case_loops(const cg_layout *c, cg_case *cs) {
  cg_k_init(c, cs);
  fb_builder bb, *b = &bb;
  fb_kernel *k = cg_new(c, "loops_par", 0, NULL, FB_T_VOID, b);
  int sv, sv2, sv3, i, j, q;
  int lp = cg_for(b, K_I32(0), K_I32(CG_N), 1, &i, &sv);
  int acc = fb_b_alloca(b, FB_T_I64);
  cg_for(b, K_I32(0), K_BIN(REM, i, K_I32(7)), 0, &j, &sv2);
  cg_for(b, K_UN(NEG, j), j, 0, &q, &sv3);
  fb_b_lstore(b, acc, K_BIN(ADD, fb_b_lload(b, acc), K_CAST(I64, K_BIN(SUB, K_BIN(MUL, j, q), i))));
  fb_b_leave(b, sv3);
  fb_b_leave(b, sv2);
  cg_res(b, c->rl, i, 0, fb_b_lload(b, acc));
  fb_b_leave(b, sv);
  cg_add(cs, k, lp);
  k = cg_new(c, "loops_serial", 0, NULL, FB_T_F64, b);
  int sum = fb_b_alloca(b, FB_T_F64);
  cg_for(b, K_I32(0), K_I32(10), 0, &i, &sv);
  cg_for(b, i, K_I32(10), 0, &j, &sv2);
  int term = K_BIN(MUL, cg_ld(b, c->da, i), K_CAST(F64, j));
  fb_b_lstore(b, sum, K_BIN(ADD, fb_b_lload(b, sum), term));
  cg_res(b, c->rd, i, j, fb_b_lload(b, sum));
  fb_b_leave(b, sv2);
  fb_b_leave(b, sv);
  fb_b_ret(b, fb_b_lload(b, sum), 0);
  cg_add(cs, k, -1);
}

/* while (until break) with continue; range_for with continue and break. */
static void cg_case_while(const cg_layout *c, cg_case *cs) {
  fb_builder bb, *b = &bb;
  fb_kernel *k = cg_new(c, "collatz", 0, NULL, FB_T_VOID, b);
  int sv, sv2, sv3, i, j;
  int lp = cg_for(b, K_I32(0), K_I32(CG_N), 1, &i, &sv);
  int x = fb_b_alloca(b, FB_T_I32), steps = fb_b_alloca(b, FB_T_I32);
  fb_b_lstore(b, x, K_BIN(ADD, i, K_I32(1)));
  int w = fb_b_while(b);
  sv2 = fb_b_enter(b, b->k->stmts[w].body);
  int xv = fb_b_lload(b, x);
  cg_if(b, K_BIN(LE, xv, K_I32(1)), 0, &sv3);
  fb_b_break(b);
  fb_b_leave(b, sv3);
  fb_b_lstore(b, steps, K_BIN(ADD, fb_b_lload(b, steps), K_I32(1)));
  int even = cg_if(b, K_BIN(EQ, K_BIN(AND, xv, K_I32(1)), K_I32(0)), 0, &sv3);
  (void)even;
  fb_b_lstore(b, x, K_BIN(SHR, xv, K_I32(1)));
  fb_b_continue(b);
  fb_b_leave(b, sv3);
  fb_b_lstore(b, x, K_BIN(ADD, K_BIN(MUL, xv, K_I32(3)), K_I32(1)));
  fb_b_leave(b, sv2);
  cg_res(b, c->ri, i, 0, fb_b_lload(b, steps));
  /* sum of odd j below i, stopping at 20 */
  int s = fb_b_alloca(b, FB_T_I32);
  cg_for(b, K_I32(0), i, 0, &j, &sv2);
  cg_if(b, K_BIN(GT, j, K_I32(20)), 0, &sv3);
  fb_b_break(b);
  fb_b_leave(b, sv3);
  cg_if(b, K_BIN(EQ, K_BIN(REM, j, K_I32(2)), K_I32(0)), 0, &sv3);
  fb_b_continue(b);
  fb_b_leave(b, sv3);
  fb_b_lstore(b, s, K_BIN(ADD, fb_b_lload(b, s), j));
  fb_b_leave(b, sv2);
  cg_res(b, c->ri, i, 1, fb_b_lload(b, s));
  fb_b_leave(b, sv);
  cg_add(cs, k, lp);
}

static void cg_case_if(const cg_layout *c, cg_case *cs) {
  cg_k_init(c, cs);
  fb_builder bb, *b = &bb;
  fb_kernel *k = cg_new(c, "branches", 0, NULL, FB_T_VOID, b);
  int sv, sv2, sv3, i;
  int lp = cg_for(b, K_I32(0), K_I32(CG_N), 1, &i, &sv);
  int a = cg_ld(b, c->ia, i), bo = cg_ld(b, c->bo, i);
  int outer = cg_if(b, K_BIN(GT, a, K_I32(0)), 1, &sv2);
  int inner = cg_if(b, K_BIN(EQ, cg_ld(b, c->ib, i), K_I32(0)), 1, &sv3);
  cg_res(b, c->ri, i, 0, K_I32(1));
  cg_else(b, inner);
  cg_res(b, c->ri, i, 0, K_I32(2));
  fb_b_leave(b, sv3);
  cg_else(b, outer);
  cg_res(b, c->ri, i, 0, fb_b_select(b, bo, K_I32(3), K_I32(4)));
  fb_b_leave(b, sv2);
  cg_if(b, K_BIN(OR, bo, K_BIN(LT, cg_ld(b, c->fa, i), K_F32(0.0f))), 0, &sv2);
  cg_res(b, c->rf, i, 0, fb_b_select(b, bo, cg_ld(b, c->fa, i), cg_ld(b, c->fb, i)));
  fb_b_leave(b, sv2);
  /* bool logic into bool fields */
  int pos = K_BIN(GT, a, K_I32(0));
  cg_res(b, c->rb, i, 0, K_BIN(XOR, bo, pos));
  cg_res(b, c->rb, i, 1, K_BIN(AND, K_UN(NOT, bo), pos));
  cg_res(b, c->rb, i, 2, K_BIN(OR, bo, K_UN(NOT, pos)));
  cg_res(b, c->rb, i, 3, K_BIN(EQ, bo, pos));
  cg_res(b, c->rb, i, 4, K_BIN(NE, bo, pos));
  fb_b_leave(b, sv);
  cg_add(cs, k, lp);
}

/* Out-of-bounds stores, loads, atomics and is_active: skipped, 0, error. */
static void cg_case_oob(const cg_layout *c, cg_case *cs) {
  cg_k_init(c, cs);
  fb_builder bb, *b = &bb;
  fb_kernel *k = cg_new(c, "oob", 0, NULL, FB_T_VOID, b);
  int sv, i;
  int lp = cg_for(b, K_I32(-3), K_I32(CG_N + 6), 1, &i, &sv);
  int inb = K_BIN(MIN, K_BIN(MAX, i, K_I32(0)), K_I32(CG_N - 1));
  cg_st(b, c->fb, i, K_F32(1.0f));
  cg_res(b, c->ri, inb, 0, cg_ld(b, c->ia, K_BIN(ADD, i, K_I32(5))));
  cg_res(b, c->rf, inb, 1, cg_atomic(b, FB_OP_ATOMIC_ADD, c->fa, i, K_F32(0.5f)));
  cg_res(b, c->rb, inb, 2, fb_b_global(b, FB_OP_IS_ACTIVE, c->g, (int[]){i, K_I32(3)}, 2, -1));
  fb_b_global(b, FB_OP_ACTIVATE, c->ia, &i, 1, -1);
  cg_st2(b, c->h, K_BIN(REM, i, K_I32(32)), K_BIN(SUB, i, K_I32(50)), i);
  fb_b_leave(b, sv);
  cg_add(cs, k, lp);
  cs->expect = FB_EBOUNDS;
}

/* A serial kernel returning an i32 computed from fields. */
static void cg_case_ret(const cg_layout *c, cg_case *cs) {
  cg_k_init(c, cs);
  fb_builder bb, *b = &bb;
  fb_kernel *k = cg_new(c, "ret_sum", 0, NULL, FB_T_I32, b);
  int sv, i;
  int acc = fb_b_alloca(b, FB_T_I32);
  cg_for(b, K_I32(0), K_I32(CG_N), 0, &i, &sv);
  fb_b_lstore(b, acc, K_BIN(ADD, fb_b_lload(b, acc), K_BIN(XOR, cg_ld(b, c->ia, i), i)));
  fb_b_leave(b, sv);
  fb_b_ret(b, fb_b_lload(b, acc), 0);
  cg_add(cs, k, -1);
}

/* Parameters of every type; loop bounds computed from them before the loop. */
static void cg_case_args(const cg_layout *c, cg_case *cs) {
  fb_type p[7] = {FB_T_I32, FB_T_F32, FB_T_I64, FB_T_U32, FB_T_F64, FB_T_BOOL, FB_T_U64};
  fb_builder bb, *b = &bb;
  fb_kernel *k = cg_new(c, "args", 7, p, FB_T_VOID, b);
  int a[7];
  for (int s = 0; s < 7; s++) a[s] = fb_b_arg(b, s);
  int begin = K_BIN(SUB, a[0], K_I32(2));
  int end = K_BIN(ADD, K_BIN(MUL, a[0], K_I32(3)), K_CAST(I32, a[3]));
  int sv, i;
  int lp = cg_for(b, begin, end, 1, &i, &sv);
  int k0 = K_BIN(SUB, i, begin);
  cg_res(b, c->rf, k0, 0, K_BIN(MUL, a[1], K_CAST(F32, i)));
  cg_res(b, c->rl, k0, 0, K_BIN(ADD, a[2], K_CAST(I64, i)));
  cg_res(b, c->ru, k0, 0, K_BIN(MUL, a[3], K_CAST(U32, i)));
  cg_res(b, c->rd, k0, 0, K_BIN(DIV, a[4], K_CAST(F64, i)));
  cg_res(b, c->rb, k0, 0, K_BIN(XOR, a[5], K_BIN(GT, i, a[0])));
  cg_res(b, c->rlu, k0, 0, K_BIN(SHR, a[6], K_CAST(U64, i)));
  fb_b_leave(b, sv);
  cg_add(cs, k, lp);
  cg_step *st = &cs->steps[cs->nsteps - 1];
  st->nargs = 7;
  st->args[0] = fb_value_i32(5);
  st->args[1] = fb_value_f32(-1.25f);
  st->args[2] = fb_value_i64(-7000000000ll);
  st->args[4] = fb_value_f64(3.0e-3);
  st->args[5] = fb_value_bool(1);
  st->args[6] = fb_value_u64(0xfedcba9876543210ull);
  st->args[3] = fb_value_u32(30u);
  /* the same kernel with an empty range: end < begin */
  cg_add(cs, k, lp);
  cs->steps[cs->nsteps - 1] = *st;
  cs->steps[cs->nsteps - 1].args[0] = fb_value_i32(-40);
}

/* gtmp: a serial task leaves values in the scratch buffer, a parallel
 * one reads them. */
static void cg_case_gtmp(const cg_layout *c, cg_case *cs) {
  fb_type p[1] = {FB_T_I32};
  fb_builder bb, *b = &bb;
  fb_kernel *k = cg_new(c, "gtmp_put", 1, p, FB_T_VOID, b);
  fb_b_gtmp_store(b, K_BIN(MUL, fb_b_arg(b, 0), K_I32(3)), 8);
  fb_b_gtmp_store(b, K_F32(0.75f), 16);
  fb_b_gtmp_store(b, K_BOOL(1), 24);
  fb_b_gtmp_store(b, K_F64(-2.5), 32);
  cg_add(cs, k, -1);
  cs->steps[0].nargs = 1;
  cs->steps[0].args[0] = fb_value_i32(14);
  k = cg_new(c, "gtmp_get", 0, NULL, FB_T_VOID, b);
  int g8 = fb_b_gtmp_load(b, FB_T_I32, 8);
  int sv, i;
  int lp = cg_for(b, K_I32(0), g8, 1, &i, &sv);
  cg_res(b, c->ri, i, 0, K_BIN(ADD, fb_b_gtmp_load(b, FB_T_I32, 8), i));
  cg_res(b, c->rf, i, 0, K_BIN(MUL, fb_b_gtmp_load(b, FB_T_F32, 16), K_CAST(F32, i)));
  cg_res(b, c->rb, i, 0, fb_b_gtmp_load(b, FB_T_BOOL, 24));
  cg_res(b, c->rd, i, 0, fb_b_gtmp_load(b, FB_T_F64, 32));
  fb_b_leave(b, sv);
  cg_add(cs, k, lp);
}

/* rand() in parallel loops (per-iteration counts), in a serial kernel (one
 * count over the run) and in a struct_for (linear cell numbers). */
static void cg_case_rand(const cg_layout *c, cg_case *cs) {
  fb_builder bb, *b = &bb;
  fb_kernel *k = cg_new(c, "rand_par", 0, NULL, FB_T_VOID, b);
  int sv, sv2, i, j;
  int lp = cg_for(b, K_I32(3), K_I32(CG_N), 1, &i, &sv);
  cg_res(b, c->rf, i, 0, fb_b_rand(b, 0));
  cg_res(b, c->rf, i, 1, fb_b_rand(b, 1));
  cg_res(b, c->rf, i, 2, fb_b_rand(b, 1));
  cg_for(b, K_I32(0), K_I32(3), 0, &j, &sv2);
  cg_st2(b, c->rf, i, K_BIN(ADD, j, K_I32(3)), fb_b_rand(b, 2));
  fb_b_leave(b, sv2);
  fb_b_leave(b, sv);
  cg_add(cs, k, lp);
  k = cg_new(c, "rand_serial", 0, NULL, FB_T_F32, b);
  int r0 = fb_b_rand(b, 5);
  cg_for(b, K_I32(0), K_I32(8), 0, &i, &sv);
  cg_res(b, c->rf, i, 4, fb_b_rand(b, 6));
  fb_b_leave(b, sv);
  fb_b_ret(b, K_BIN(ADD, r0, fb_b_rand(b, 5)), 0);
  cg_add(cs, k, -1);
  k = cg_new(c, "rand_sfor", 0, NULL, FB_T_VOID, b);
  lp = cg_struct(b, c->g, &i, &j, &sv);
  cg_st2(b, c->g, i, j, K_BIN(ADD, fb_b_rand(b, 9), fb_b_rand(b, 9)));
  fb_b_leave(b, sv);
  cg_add(cs, k, lp);
}

/* A whole kernel with two parallel loops run as one serial task. */
static void cg_case_whole(const cg_layout *c, cg_case *cs) {
  fb_builder bb, *b = &bb;
  fb_kernel *k = cg_new(c, "whole", 0, NULL, FB_T_F32, b);
  int sv, i, j;
  int r0 = fb_b_rand(b, 1);
  cg_for(b, K_I32(0), K_I32(CG_N), 1, &i, &sv);
  cg_st(b, c->fa, i, K_BIN(ADD, fb_b_rand(b, 2), K_CAST(F32, i)));
  fb_b_leave(b, sv);
  int r1 = fb_b_rand(b, 1);
  cg_struct(b, c->g, &i, &j, &sv);
  cg_st2(b, c->g, i, j, K_BIN(MUL, fb_b_rand(b, 3), cg_ld(b, c->fa, j)));
  fb_b_leave(b, sv);
  fb_b_ret(b, K_BIN(SUB, r0, K_BIN(MUL, r1, fb_b_rand(b, 1))), 0);
  cg_add(cs, k, -1);
}

typedef void (*cg_case_fn)(const cg_layout *c, cg_case *cs);

static const struct {
  const char *name;
  cg_case_fn fn;
} cg_cases[] = {
    {"map_f32", cg_case_map_f32},   {"int_ops", cg_case_int_ops},
    {"casts", cg_case_casts},       {"float_ops", cg_case_float_ops},
    {"math", cg_case_math},         {"struct_for", cg_case_struct_for},
    {"nested", cg_case_nested},     {"stencil", cg_case_stencil},
    {"atomics", cg_case_atomics},   {"loops", cg_case_loops},
    {"while", cg_case_while},       {"if", cg_case_if},
    {"oob", cg_case_oob},           {"ret", cg_case_ret},
    {"args", cg_case_args},         {"gtmp", cg_case_gtmp},
    {"rand", cg_case_rand},         {"whole", cg_case_whole},
    {"sfor_oob", cg_case_sfor_oob},
};
#define CG_NCASES ((int)(sizeof cg_cases / sizeof cg_cases[0]))

/* Build case n on layout c. Returns 0 or -1 (a builder error). */
static int cg_case_build(const cg_layout *c, int n, cg_case *cs) {
  memset(cs, 0, sizeof *cs);
  cs->name = cg_cases[n].name;
  cg_cases[n].fn(c, cs);
  for (int s = 0; s < cs->nsteps; s++)
    if (!cs->steps[s].k) return -1;
  return 0;
}

/* Steps may share a kernel (same pointer): free each once. */
static void cg_case_free(cg_case *cs) {
  for (int s = 0; s < cs->nsteps; s++) {
    int dup = 0;
    for (int t = 0; t < s; t++) dup |= cs->steps[t].k == cs->steps[s].k;
    if (!dup) fb_kernel_free(cs->steps[s].k);
  }
  cs->nsteps = 0;
}

#endif
