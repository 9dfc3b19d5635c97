/* The IR's arithmetic (ir/arith.c) through every part that computes it:
 * each edge case below (wrapping, division and remainder by zero and by -1,
 * shifts by the width or more and by negative counts, arithmetic >> of
 * negative numbers, floored division, min/max with NaN, saturating casts)
 * is worked out by hand from the semantics block of include/fusebox/ir.h
 * and must come out the same from
 *  - ir/arith.h called directly;
 *  - the reference interpreter (operands as constants and as arguments);
 *  - the optimizer's constant evaluation (fb_eval_int), for integers;
 *  - code generation, through a sync session of the CPU engine;
 *  - the .fbk front end's folding of untyped literals (as i64 and f64). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fusebox/engine.h"
#include "fusebox/ir.h"
#include "fusebox/lang.h"
#include "ir/arith.h"
#include "optimizer/sfg.h"
#include "tests/support/support.h"

/* fb_value initializers for the static tables */
#define I32(x)                                                                                     \
  {                                                                                                \
    FB_T_I32, { .i = (int32_t)(x) }                                                                \
  }
#define I64(x)                                                                                     \
  {                                                                                                \
    FB_T_I64, { .i = (int64_t)(x) }                                                                \
  }
#define U32(x)                                                                                     \
  {                                                                                                \
    FB_T_U32, { .u = (uint32_t)(x) }                                                               \
  }
#define U64(x)                                                                                     \
  {                                                                                                \
    FB_T_U64, { .u = (uint64_t)(x) }                                                               \
  }
#define F32(x)                                                                                     \
  {                                                                                                \
    FB_T_F32, { .f = (double)(float)(x) }                                                          \
  }
#define F64(x)                                                                                     \
  {                                                                                                \
    FB_T_F64, { .f = (double)(x) }                                                                 \
  }
#define BOOL(x) {FB_T_BOOL, {.u = (x) != 0}}

typedef struct acase {
  fb_op op;
  fb_type to; /* casts: the target type */
  fb_value a, b, want;
  int nops;
  const char *what;
} acase;

#define BIN(o, A, B, W) {FB_OP_##o, FB_T_VOID, A, B, W, 2, #o "(" #A ", " #B ")"}
#define UN(o, A, W) {FB_OP_##o, FB_T_VOID, A, {0}, W, 1, #o "(" #A ")"}
#define CAST(A, T, W) {FB_OP_CAST, FB_T_##T, A, {0}, W, 1, "cast " #T "(" #A ")"}

static const acase cases[] = {
    /* wrapping */
    BIN(ADD, I32(INT32_MAX), I32(1), I32(INT32_MIN)),
    BIN(MUL, I64(INT64_MAX), I64(2), I64(-2)),
    BIN(SUB, U32(0), U32(1), U32(UINT32_MAX)),
    UN(NEG, I32(INT32_MIN), I32(INT32_MIN)),
    UN(ABS, I64(INT64_MIN), I64(INT64_MIN)),
    UN(NOT, U32(0), U32(UINT32_MAX)),
    /* division and remainder by zero and by -1 */
    BIN(DIV, I32(7), I32(0), I32(0)),
    BIN(REM, I64(7), I64(0), I64(0)),
    BIN(FLOORDIV, U64(7), U64(0), U64(0)),
    BIN(FLOORMOD, I32(-7), I32(0), I32(0)),
    BIN(DIV, I32(INT32_MIN), I32(-1), I32(INT32_MIN)),
    BIN(DIV, I64(INT64_MIN), I64(-1), I64(INT64_MIN)),
    BIN(REM, I64(INT64_MIN), I64(-1), I64(0)),
    BIN(FLOORDIV, I64(INT64_MIN), I64(-1), I64(INT64_MIN)),
    BIN(FLOORMOD, I32(INT32_MIN), I32(-1), I32(0)),
    /* floored division */
    BIN(FLOORDIV, I64(-7), I64(2), I64(-4)),
    BIN(FLOORMOD, I64(-7), I64(2), I64(1)),
    BIN(FLOORMOD, I64(7), I64(-2), I64(-1)),
    BIN(FLOORMOD, I64(INT64_MIN), I64(3), I64(1)),
    BIN(FLOORMOD, U32(UINT32_MAX), U32(10), U32(5)),
    /* shifts: count modulo the width, negative counts, arithmetic >> */
    BIN(SHL, I32(1), I32(32), I32(1)),
    BIN(SHL, I32(1), I32(-1), I32(INT32_MIN)),
    BIN(SHL, I64(1), I64(65), I64(2)),
    BIN(SHR, I32(-8), I32(1), I32(-4)),
    BIN(SHR, I32(-8), I32(35), I32(-1)),
    BIN(SHR, I64(-16), I64(66), I64(-4)),
    BIN(SHR, I64(INT64_MIN), I64(-1), I64(-1)),
    BIN(SHR, I64(-9), I64(1), I64(-5)),
    BIN(SHR, U32(0x80000000u), U32(63), U32(1)),
    BIN(SHR, U64(1ull << 63), U64(127), U64(1)),
    /* min / max. Not pinned: the sign of a zero result when the operands
     * are +0 and -0. The semantics block leaves it open, and the two
     * disagree today: min(+0.0, -0.0) is -0 from the interpreter (libm's
     * fmin, as this build compiles it) and +0 from generated CPU code
     * (llvm.minnum). */
    BIN(MIN, I32(-5), I32(3), I32(-5)),
    BIN(MAX, U32(1), U32(UINT32_MAX), U32(UINT32_MAX)),
    BIN(MIN, F32(NAN), F32(1.0f), F32(1.0f)),
    BIN(MAX, F64(2.0), F64(NAN), F64(2.0)),
    /* floats */
    BIN(FLOORDIV, F64(7.5), F64(-2.0), F64(-4.0)),
    BIN(FLOORMOD, F64(-7.5), F64(2.0), F64(0.5)),
    BIN(FLOORMOD, F32(7.5f), F32(-2.0f), F32(-0.5f)),
    BIN(REM, F64(-7.5), F64(2.0), F64(-1.5)),
    BIN(DIV, F32(1.0f), F32(0.0f), F32(INFINITY)),
    UN(ROUND, F64(-2.5), F64(-3.0)),
    /* comparisons with NaN */
    BIN(NE, F64(NAN), F64(NAN), BOOL(1)),
    BIN(EQ, F32(NAN), F32(NAN), BOOL(0)),
    BIN(LT, U32(1), U32(UINT32_MAX), BOOL(1)),
    BIN(LT, I32(-1), I32(1), BOOL(1)),
    /* saturating casts, NaN to 0 */
    CAST(F64(1e20), I32, I32(INT32_MAX)),
    CAST(F64(-1e20), I64, I64(INT64_MIN)),
    CAST(F32(-3.0f), U32, U32(0)),
    CAST(F64(NAN), I64, I64(0)),
    CAST(F32(-2.9f), I32, I32(-2)),
    CAST(I64(-1), U32, U32(UINT32_MAX)),
    CAST(U32(UINT32_MAX), I64, I64(UINT32_MAX)),
};

#define NCASES ((int)(sizeof cases / sizeof cases[0]))

/* ---------------------------------------------------------------- comparing */

#define same fbt_value_same
#define show fbt_value_show

static void expect(fb_value got, const acase *c, const char *who) {
  char g[64], w[64];
  ck_assert_msg(same(got, c->want), "%s: %s = %s, expected %s", who, c->what,
                show(got, g, sizeof g), show(c->want, w, sizeof w));
}

/* ---------------------------------------------------------------- kernels */

static fb_layout *empty_layout(void) {
  fb_layout *l = fb_layout_new();
  char err[200] = "";
  ck_assert_msg(fb_layout_finalize(l, err, sizeof err) == 0, "layout: %s", err);
  return l;
}

/* `return op(a, b)` with the operands as constants or as arguments; *at is
 * the op's statement. */
static fb_kernel *case_kernel(const fb_layout *l, const acase *c, int use_const, int *at) {
  fb_type params[2] = {c->a.type, c->b.type};
  fb_kernel *k = fb_kernel_new(l, "arith", use_const ? 0 : c->nops, params, FB_T_VOID);
  fb_builder b;
  fb_builder_init(&b, k);
  const fb_value ops[2] = {c->a, c->b};
  int a[2] = {-1, -1};
  for (int i = 0; i < c->nops; i++) a[i] = use_const ? fb_b_const(&b, ops[i]) : fb_b_arg(&b, i);
  int id = c->op == FB_OP_CAST ? fb_b_cast(&b, c->to, a[0])
           : c->nops == 1      ? fb_b_unary(&b, c->op, a[0])
                               : fb_b_binary(&b, c->op, a[0], a[1]);
  k->ret = (fb_type)k->stmts[id].type;
  fb_b_ret(&b, id, 0);
  ck_assert_msg(b.err == 0, "%s: the builder refused it", c->what);
  *at = id;
  return k;
}

/* ---------------------------------------------------------------- ir/arith.h */

START_TEST(test_direct) {
  for (int i = 0; i < NCASES; i++) {
    const acase *c = &cases[i];
    fb_value got;
    int cls = fb_op_table[c->op].cls;
    if (c->op == FB_OP_CAST) got = fb_value_cast(c->a, c->to);
    else if (cls == FB_OPC_CMP) got = fb_value_bool(fb_arith_compare(c->op, c->a.type, c->a, c->b));
    else if (c->nops == 1) ck_assert_int_eq(fb_arith_unop(c->op, c->a.type, c->a, &got), 0);
    else ck_assert_int_eq(fb_arith_binop(c->op, c->a.type, c->a, c->b, &got), 0);
    expect(got, c, "ir/arith");
  }
}
END_TEST

/* ---------------------------------------------------------------- interpreter and optimizer */

START_TEST(test_interp_and_eval_int) {
  fb_layout *l = empty_layout();
  fb_interp *in = fb_interp_new(l, 1);
  ck_assert_ptr_nonnull(in);
  int evaluated = 0;
  for (int i = 0; i < NCASES; i++) {
    const acase *c = &cases[i];
    const fb_value ops[2] = {c->a, c->b};
    for (int use_const = 0; use_const < 2; use_const++) {
      int at;
      fb_kernel *k = case_kernel(l, c, use_const, &at);
      fb_value got;
      int rc = fb_interp_run(in, k, use_const ? NULL : ops, use_const ? 0 : c->nops, &got);
      ck_assert_msg(rc == 0, "%s: interpreter: %s", c->what, fb_interp_errmsg(in));
      expect(got, c, use_const ? "interpreter (constants)" : "interpreter (arguments)");
      /* the optimizer evaluates integer expressions of integer constants and
       * arguments */
      if (fb_type_is_int(c->want.type) && fb_type_is_int(c->a.type)) {
        uint64_t args[2] = {c->a.v.u, c->b.v.u};
        int64_t v = 0;
        ck_assert_msg(fb_eval_int(k, at, use_const ? NULL : args, use_const ? 0 : c->nops, &v) == 0,
                      "%s: fb_eval_int could not evaluate it", c->what);
        fb_value e = c->want;
        e.v.i = v;
        expect(e, c, "optimizer (fb_eval_int)");
        evaluated++;
      }
      fb_kernel_free(k);
    }
  }
  ck_assert_int_gt(evaluated, 40);
  fb_interp_free(in);
  fb_layout_free(l);
}
END_TEST

/* ---------------------------------------------------------------- code generation */

START_TEST(test_codegen_cpu) {
  fb_engine_config ec = {.backend = "cpu", .compile_threads = 1, .cpu_threads = 1};
  fb_engine *e = NULL;
  char err[256] = "";
  ck_assert_msg(fb_engine_create(&ec, &e, err, sizeof err) == 0, "engine: %s", err);
  fb_layout *l = empty_layout();
  fb_session_config sc = {.mode = "sync"};
  fb_session *s = NULL;
  ck_assert_msg(fb_session_create(e, &sc, l, &s, err, sizeof err) == 0, "session: %s", err);
  for (int i = 0; i < NCASES; i++) {
    const acase *c = &cases[i];
    const fb_value ops[2] = {c->a, c->b};
    int at;
    /* operands as arguments, so that the generated instructions compute it */
    fb_kernel *k = case_kernel(fb_session_layout(s), c, 0, &at);
    int id = fb_session_add_kernel(s, k);
    ck_assert_msg(id >= 0, "%s: %s", c->what, fb_session_errmsg(s));
    fb_value got;
    ck_assert_msg(fb_launch(s, id, ops, c->nops, &got) == 0, "%s: %s", c->what,
                  fb_session_errmsg(s));
    expect(got, c, "generated code (CPU)");
    fb_kernel_free(k);
  }
  fb_session_destroy(s);
  fb_layout_free(l);
  fb_engine_destroy(e);
}
END_TEST

/* ---------------------------------------------------------------- the front end */

/* Untyped literals fold as i64 (integers) and f64 (floats) values. */
typedef struct lcase {
  const char *expr;
  fb_op op;
  fb_value a, b;
} lcase;

static const lcase lcases[] = {
    {"(-9) >> 1", FB_OP_SHR, I64(-9), I64(1)},
    {"(-8) >> 65", FB_OP_SHR, I64(-8), I64(65)},
    {"(-9223372036854775807 - 1) >> 63", FB_OP_SHR, I64(INT64_MIN), I64(63)},
    {"1 << 64", FB_OP_SHL, I64(1), I64(64)},
    {"1 << (-1)", FB_OP_SHL, I64(1), I64(-1)},
    {"9223372036854775807 + 1", FB_OP_ADD, I64(INT64_MAX), I64(1)},
    {"(-7) // 2", FB_OP_FLOORDIV, I64(-7), I64(2)},
    {"7 // 0", FB_OP_FLOORDIV, I64(7), I64(0)},
    {"(-7) % 2", FB_OP_FLOORMOD, I64(-7), I64(2)},
    {"7 % (-2)", FB_OP_FLOORMOD, I64(7), I64(-2)},
    {"7 % 0", FB_OP_FLOORMOD, I64(7), I64(0)},
    {"(-9223372036854775807 - 1) // (-1)", FB_OP_FLOORDIV, I64(INT64_MIN), I64(-1)},
    {"(-9223372036854775807 - 1) % 3", FB_OP_FLOORMOD, I64(INT64_MIN), I64(3)},
    {"min(-3, 2)", FB_OP_MIN, I64(-3), I64(2)},
    {"max(-3, 2)", FB_OP_MAX, I64(-3), I64(2)},
    {"7.5 // (-2.0)", FB_OP_FLOORDIV, F64(7.5), F64(-2.0)},
    {"(-7.5) % 2.0", FB_OP_FLOORMOD, F64(-7.5), F64(2.0)},
    {"7.5 % (-2.0)", FB_OP_FLOORMOD, F64(7.5), F64(-2.0)},
    {"1.0 / 3.0", FB_OP_DIV, F64(1.0), F64(3.0)},
};

START_TEST(test_front_end_folding) {
  size_t n = sizeof lcases / sizeof lcases[0];
  for (size_t i = 0; i < n; i++) {
    const lcase *c = &lcases[i];
    fb_type t = c->a.type;
    char src[512];
    snprintf(src, sizeof src, "layout { place unused: i32 }\nkernel k() -> %s {\n  return %s\n}\n",
             fb_type_name(t), c->expr);
    fb_program *p = NULL;
    fb_diags d;
    fb_diags_init(&d);
    int rc = fb_program_parse("fold.fbk", src, &p, &d);
    char *r = fb_diags_render("fold.fbk", src, &d);
    ck_assert_msg(rc == 0, "%s: parse failed:\n%s", c->expr, r ? r : "");
    free(r);
    fb_kernel *k = NULL;
    ck_assert_msg(fb_program_instantiate(p, "k", NULL, 0, &k, &d) == 0, "%s: instantiate", c->expr);
    fb_diags_free(&d);

    /* folded: the kernel returns a constant */
    int ret = -1;
    for (int s = 0; s < k->nstmts; s++)
      if (k->stmts[s].op == FB_OP_RET) ret = s;
    ck_assert_int_ge(ret, 0);
    const fb_stmt *v = &k->stmts[k->stmts[ret].args[0]];
    ck_assert_msg(v->op == FB_OP_CONST, "%s: not folded (returns a %s)", c->expr,
                  fb_op_table[v->op].name);

    fb_value want;
    ck_assert_int_eq(fb_arith_binop(c->op, t, c->a, c->b, &want), 0);
    fb_interp *in = fb_interp_new(fb_program_layout(p), 1);
    fb_value got;
    ck_assert_int_eq(fb_interp_run(in, k, NULL, 0, &got), 0);
    char g[64], w[64];
    ck_assert_msg(same(got, want), "front end: %s = %s, the IR's %s gives %s", c->expr,
                  show(got, g, sizeof g), fb_op_table[c->op].name, show(want, w, sizeof w));
    fb_interp_free(in);
    fb_program_free(p);
  }
}
END_TEST

/* The front end's folds agree with the hand-worked values too (so that the
 * table above is not only compared with itself). */
START_TEST(test_front_end_by_hand) {
  struct {
    const char *expr;
    int64_t want;
  } h[] = {
      {"(-9) >> 1", -5},
      {"(-8) >> 65", -4},
      {"1 << 64", 1},
      {"(-7) // 2", -4},
      {"(-7) % 2", 1},
      {"7 % 0", 0},
      {"(-9223372036854775807 - 1) % 3", 1},
  };
  for (size_t i = 0; i < sizeof h / sizeof h[0]; i++) {
    char src[256];
    snprintf(src, sizeof src, "layout { place unused: i32 }\nkernel k() -> i64 {\n  return %s\n}\n",
             h[i].expr);
    fb_program *p = NULL;
    ck_assert_int_eq(fb_program_parse("fold.fbk", src, &p, NULL), 0);
    fb_kernel *k = NULL;
    ck_assert_int_eq(fb_program_instantiate(p, "k", NULL, 0, &k, NULL), 0);
    fb_interp *in = fb_interp_new(fb_program_layout(p), 1);
    fb_value got;
    ck_assert_int_eq(fb_interp_run(in, k, NULL, 0, &got), 0);
    ck_assert_msg(got.v.i == h[i].want, "%s = %lld, expected %lld", h[i].expr, (long long)got.v.i,
                  (long long)h[i].want);
    fb_interp_free(in);
    fb_program_free(p);
  }
}
END_TEST

static Suite *arith_suite(void) {
  Suite *s = suite_create("arith");
  TCase *tc = tcase_create("all");
  tcase_add_test(tc, test_direct);
  tcase_add_test(tc, test_interp_and_eval_int);
  tcase_add_test(tc, test_codegen_cpu);
  tcase_add_test(tc, test_front_end_folding);
  tcase_add_test(tc, test_front_end_by_hand);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) { return fbt_run(arith_suite()); }
