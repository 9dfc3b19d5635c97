/* Tests of the IR verifier (ir/verify.c): a valid kernel of each feature
 * passes; each rule, broken in a minimal kernel, is reported against the
 * right statement with a message naming the rule; independent errors are all
 * reported; and a fuzz loop over mutated kernels never crashes. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fusebox/ir.h"
#include "support/support.h"

/* ---------------------------------------------------------------- fixture */

/* The layout every test uses:
 *   root ─ dense ij [8,8] ─ x f32, n i32, bf bool
 *        ─ pointer i [4] "ptr" ─ dynamic j [16] chunk 4 "dyn" ─ lst i32
 *        ─ bitmasked k [16] "bm" ─ flag u64
 *        ─ s f64 (a scalar field: ndim 0) */
typedef struct fx {
  fb_layout *l;
  int dense, x, n, bf, ptr, dyn, lst, bm, flag, scalar;
} fx;

static fx fx_new(void) {
  fx f;
  char err[128] = "";
  int64_t s88[2] = {8, 8}, s4[1] = {4}, s16[1] = {16};
  f.l = fb_layout_new();
  ck_assert_ptr_nonnull(f.l);
  f.dense = fb_layout_add(f.l, 0, FB_SN_DENSE, "ij", s88, 0, NULL);
  f.x = fb_layout_place(f.l, f.dense, "x", FB_T_F32);
  f.n = fb_layout_place(f.l, f.dense, "n", FB_T_I32);
  f.bf = fb_layout_place(f.l, f.dense, "bf", FB_T_BOOL);
  f.ptr = fb_layout_add(f.l, 0, FB_SN_POINTER, "i", s4, 0, "ptr");
  f.dyn = fb_layout_add(f.l, f.ptr, FB_SN_DYNAMIC, "j", s16, 4, "dyn");
  f.lst = fb_layout_place(f.l, f.dyn, "lst", FB_T_I32);
  f.bm = fb_layout_add(f.l, 0, FB_SN_BITMASKED, "k", s16, 0, "bm");
  f.flag = fb_layout_place(f.l, f.bm, "flag", FB_T_U64);
  f.scalar = fb_layout_place(f.l, 0, "s", FB_T_F64);
  ck_assert_int_gt(f.scalar, 0);
  ck_assert_msg(fb_layout_finalize(f.l, err, sizeof err) == 0, "finalize: %s", err);
  ck_assert_int_eq(f.l->nodes[f.x].ndim, 2);
  ck_assert_int_eq(f.l->nodes[f.lst].ndim, 2);
  ck_assert_int_eq(f.l->nodes[f.scalar].ndim, 0);
  return f;
}

/* Open a test: fixture f, kernel k (params, ret), builder b into block 0. */
#define BEGIN(np, params, ret)                                                                     \
  fx f = fx_new();                                                                                 \
  fb_kernel *k = fb_kernel_new(f.l, "t", (np), (params), (ret));                                   \
  ck_assert_ptr_nonnull(k);                                                                        \
  fb_builder b_;                                                                                   \
  fb_builder_init(&b_, k);                                                                         \
  fb_builder *b = &b_;                                                                             \
  (void)b
#define END()                                                                                      \
  fb_kernel_free(k);                                                                               \
  fb_layout_free(f.l)
#define S(id) (k->stmts[(id)])
#define BODY(id) (k->stmts[(id)].body)

static const fb_type P_I32[] = {FB_T_I32};
static const fb_type P_I32_F32[] = {FB_T_I32, FB_T_F32};

static void block_push(fb_kernel *k, int blk, int id) {
  fb_block *bl = &k->blocks[blk];
  int32_t *p = realloc(bl->ids, sizeof *p * (size_t)(bl->n + 1));
  ck_assert_ptr_nonnull(p);
  bl->ids = p;
  p[bl->n++] = id;
  bl->cap = bl->n;
}

/* ---------------------------------------------------------------- expectations */

static void expect_ok_at(const char *file, int line, const fb_kernel *k) {
  fb_diags d;
  fb_diags_init(&d);
  int rc = fb_verify(k, &d);
  char *all = fb_diags_join(&d);
  ck_assert_msg(rc == 0 && d.n == 0, "%s:%d: expected a valid kernel, got %d:\n%s", file, line, rc,
                all ? all : "");
  free(all);
  fb_diags_free(&d);
}

/* Some diagnostic is on statement id (-1: kernel-wide), starts with the
 * "%<id> <op>: " prefix (or "kernel: ") and contains rule. */
static void expect_err_at(const char *file, int line, const fb_kernel *k, int id,
                          const char *rule) {
  fb_diags d;
  fb_diags_init(&d);
  int rc = fb_verify(k, &d);
  char *all = fb_diags_join(&d);
  char prefix[64];
  if (id < 0) snprintf(prefix, sizeof prefix, "kernel: ");
  else
    snprintf(prefix, sizeof prefix, "%%%d %s: ", id,
             k->stmts[id].op < FB_OP__COUNT ? fb_op_table[k->stmts[id].op].name : "?");
  int found = 0;
  for (int i = 0; i < d.n; i++)
    if (d.v[i].stmt == id && strncmp(d.v[i].msg, prefix, strlen(prefix)) == 0 &&
        strstr(d.v[i].msg, rule))
      found = 1;
  ck_assert_msg(rc == FB_EVERIFY, "%s:%d: expected FB_EVERIFY, got %d:\n%s", file, line, rc,
                all ? all : "");
  ck_assert_msg(found, "%s:%d: no diagnostic \"%s...%s\" among:\n%s", file, line, prefix, rule,
                all ? all : "");
  free(all);
  fb_diags_free(&d);
}

#define EXPECT_OK(k) expect_ok_at(__FILE__, __LINE__, (k))
#define EXPECT_ERR(k, id, rule) expect_err_at(__FILE__, __LINE__, (k), (id), (rule))

/* ---------------------------------------------------------------- valid kernels */

/* Values: constants of every type, args, casts, select, every op class. */
static void build_values(fb_builder *b) {
  int a = fb_b_arg(b, 0), x = fb_b_arg(b, 1);
  int c3 = fb_b_const_i32(b, 3), cf = fb_b_const_f32(b, 2.5f);
  int cu = fb_b_const_u32(b, 7);
  fb_b_const_i64(b, -1);
  fb_b_const_u64(b, 1);
  fb_b_const_f64(b, 0.5);
  int t = fb_b_const_bool(b, 1);
  fb_op iops[] = {FB_OP_ADD,      FB_OP_SUB,      FB_OP_MUL, FB_OP_DIV, FB_OP_REM,
                  FB_OP_FLOORDIV, FB_OP_FLOORMOD, FB_OP_MIN, FB_OP_MAX, FB_OP_AND,
                  FB_OP_OR,       FB_OP_XOR,      FB_OP_SHL, FB_OP_SHR};
  for (size_t i = 0; i < sizeof iops / sizeof *iops; i++) fb_b_binary(b, iops[i], a, c3);
  fb_op fops[] = {FB_OP_ADD, FB_OP_DIV, FB_OP_POW, FB_OP_ATAN2, FB_OP_MIN};
  for (size_t i = 0; i < sizeof fops / sizeof *fops; i++) fb_b_binary(b, fops[i], x, cf);
  fb_op cmps[] = {FB_OP_EQ, FB_OP_NE, FB_OP_LT, FB_OP_LE, FB_OP_GT, FB_OP_GE};
  int lt = -1;
  for (size_t i = 0; i < sizeof cmps / sizeof *cmps; i++) lt = fb_b_binary(b, cmps[i], a, c3);
  fb_b_binary(b, FB_OP_LT, x, cf);
  fb_b_binary(b, FB_OP_AND, lt, t);
  fb_b_binary(b, FB_OP_XOR, cu, cu);
  fb_b_unary(b, FB_OP_NOT, a);
  fb_b_unary(b, FB_OP_NOT, t);
  fb_b_unary(b, FB_OP_NEG, x);
  fb_b_unary(b, FB_OP_ABS, a);
  fb_op fun[] = {FB_OP_SQRT, FB_OP_RSQRT, FB_OP_SIN, FB_OP_EXP, FB_OP_FLOOR, FB_OP_ROUND};
  for (size_t i = 0; i < sizeof fun / sizeof *fun; i++) fb_b_unary(b, fun[i], x);
  fb_b_cast(b, FB_T_F64, a);
  fb_b_cast(b, FB_T_BOOL, x);
  fb_b_cast(b, FB_T_I32, t);
  fb_b_select(b, lt, a, c3);
}

/* Locals: allocas at top level and inside a loop. */
static void build_locals(fb_builder *b) {
  fb_kernel *k = b->k;
  int v = fb_b_alloca(b, FB_T_I32);
  int c = fb_b_const_i32(b, 4);
  fb_b_lstore(b, v, c);
  int r = fb_b_range_for(b, fb_b_const_i32(b, 0), c, 0);
  int sv = fb_b_enter(b, BODY(r));
  int w = fb_b_alloca(b, FB_T_F32);
  fb_b_lstore(b, w, fb_b_const_f32(b, 1.0f));
  int s = fb_b_binary(b, FB_OP_ADD, fb_b_lload(b, v), fb_b_loop_index(b, r, 0));
  fb_b_lstore(b, v, s);
  fb_b_lload(b, w);
  fb_b_leave(b, sv);
  fb_b_lload(b, v);
}

/* Globals: loads, stores, every atomic, a uniqueness hint, in a par_for. */
static void build_globals(fb_builder *b, const fx *f) {
  fb_kernel *k = b->k;
  int p = fb_b_range_for(b, fb_b_const_i32(b, 0), fb_b_const_i32(b, 8), 1);
  int sv = fb_b_enter(b, BODY(p));
  int i = fb_b_loop_index(b, p, 0), j = fb_b_const_i32(b, 1);
  int ij[2] = {i, j};
  int xv = fb_b_load(b, f->x, ij, 2);
  fb_b_store(b, f->x, ij, 2, fb_b_binary(b, FB_OP_MUL, xv, xv));
  fb_op fa[] = {FB_OP_ATOMIC_ADD, FB_OP_ATOMIC_SUB, FB_OP_ATOMIC_MIN, FB_OP_ATOMIC_MAX};
  for (size_t q = 0; q < 4; q++) fb_b_global(b, fa[q], f->x, ij, 2, xv);
  fb_op ia[] = {FB_OP_ATOMIC_AND, FB_OP_ATOMIC_OR, FB_OP_ATOMIC_XOR, FB_OP_ATOMIC_ADD};
  for (size_t q = 0; q < 4; q++) fb_b_global(b, ia[q], f->n, ij, 2, j);
  int u = fb_b_hint_unique(b, i, f->x);
  int uj[2] = {u, j};
  fb_b_store(b, f->bf, uj, 2, fb_b_const_bool(b, 0));
  int kk[1] = {j};
  fb_b_store(b, f->flag, kk, 1, fb_b_const_u64(b, 9));
  fb_b_leave(b, sv);
  fb_b_store(b, f->scalar, NULL, 0, fb_b_const_f64(b, 2.0));
}

/* Sparse structures: activation, is_active, append and length. */
static void build_sparse(fb_builder *b, const fx *f) {
  int c0 = fb_b_const_i32(b, 0), c1 = fb_b_const_i32(b, 1);
  int i1[1] = {c0}, i2[2] = {c0, c1};
  fb_b_global(b, FB_OP_ACTIVATE, f->ptr, i1, 1, -1);
  fb_b_global(b, FB_OP_IS_ACTIVE, f->ptr, i1, 1, -1);
  fb_b_global(b, FB_OP_IS_ACTIVE, f->dyn, i2, 2, -1);
  fb_b_global(b, FB_OP_IS_ACTIVE, f->lst, i2, 2, -1);
  fb_b_global(b, FB_OP_DEACTIVATE, f->bm, i1, 1, -1);
  int at = fb_b_global(b, FB_OP_APPEND, f->lst, i1, 1, c1);
  int len = fb_b_global(b, FB_OP_LENGTH, f->lst, i1, 1, -1);
  fb_b_binary(b, FB_OP_ADD, at, len);
}

/* Control flow: if/else, while with break, range_for with continue, a
 * par_for holding serial loops, a struct_for with all its indices, ret. */
static void build_control(fb_builder *b, const fx *f) {
  fb_kernel *k = b->k;
  int n = fb_b_arg(b, 0), c0 = fb_b_const_i32(b, 0), c1 = fb_b_const_i32(b, 1);
  int iff = fb_b_if(b, fb_b_binary(b, FB_OP_LT, n, c1), 1);
  int sv = fb_b_enter(b, BODY(iff));
  fb_b_binary(b, FB_OP_ADD, n, c1);
  fb_b_enter(b, S(iff).orelse);
  fb_b_binary(b, FB_OP_SUB, n, c1);
  fb_b_leave(b, sv);
  int w = fb_b_while(b);
  sv = fb_b_enter(b, BODY(w));
  int in = fb_b_if(b, fb_b_const_bool(b, 1), 0);
  fb_b_enter(b, BODY(in));
  fb_b_break(b);
  fb_b_leave(b, sv);
  int r = fb_b_range_for(b, c0, n, 0);
  sv = fb_b_enter(b, BODY(r));
  int ri = fb_b_loop_index(b, r, 0);
  int cont = fb_b_if(b, fb_b_binary(b, FB_OP_EQ, ri, c1), 0);
  fb_b_enter(b, BODY(cont));
  fb_b_continue(b);
  fb_b_leave(b, sv);
  int p = fb_b_range_for(b, c0, fb_b_const_i32(b, 8), 1);
  sv = fb_b_enter(b, BODY(p));
  int inner = fb_b_range_for(b, c0, fb_b_const_i32(b, 8), 0);
  fb_b_enter(b, BODY(inner));
  int ij[2] = {fb_b_loop_index(b, p, 0), fb_b_loop_index(b, inner, 0)};
  fb_b_store(b, f->n, ij, 2, n);
  int w2 = fb_b_while(b);
  fb_b_enter(b, BODY(w2));
  fb_b_break(b);
  fb_b_leave(b, sv);
  int sf = fb_b_struct_for(b, f->x);
  sv = fb_b_enter(b, BODY(sf));
  int sij[2] = {fb_b_loop_index(b, sf, 0), fb_b_loop_index(b, sf, 1)};
  fb_b_store(b, f->x, sij, 2, fb_b_load(b, f->x, sij, 2));
  fb_b_leave(b, sv);
  fb_b_ret(b, n, 0);
}

/* Scratch buffer, rand and a float return. */
static void build_misc(fb_builder *b) {
  int r = fb_b_rand(b, 0);
  fb_b_gtmp_store(b, r, 8);
  int g = fb_b_gtmp_load(b, FB_T_F32, 8);
  fb_b_ret(b, fb_b_binary(b, FB_OP_ADD, g, fb_b_rand(b, 1)), 0);
}

START_TEST(valid_values) {
  BEGIN(2, P_I32_F32, FB_T_VOID);
  build_values(b);
  ck_assert_int_eq(b->err, 0);
  EXPECT_OK(k);
  END();
}
END_TEST

START_TEST(valid_locals) {
  BEGIN(0, NULL, FB_T_VOID);
  build_locals(b);
  EXPECT_OK(k);
  END();
}
END_TEST

START_TEST(valid_globals) {
  BEGIN(0, NULL, FB_T_VOID);
  build_globals(b, &f);
  EXPECT_OK(k);
  END();
}
END_TEST

START_TEST(valid_sparse) {
  BEGIN(0, NULL, FB_T_VOID);
  build_sparse(b, &f);
  EXPECT_OK(k);
  END();
}
END_TEST

START_TEST(valid_control) {
  BEGIN(1, P_I32, FB_T_I32);
  build_control(b, &f);
  EXPECT_OK(k);
  END();
}
END_TEST

START_TEST(valid_misc) {
  BEGIN(0, NULL, FB_T_F32);
  build_misc(b);
  EXPECT_OK(k);
  END();
}
END_TEST

START_TEST(valid_empty_and_dead) {
  /* An empty kernel is fine, and unreachable garbage is not looked at. */
  BEGIN(0, NULL, FB_T_VOID);
  EXPECT_OK(k);
  int blk = fb_block_new(k);
  fb_b_enter(b, blk);
  int g = fb_b_const_i32(b, 1);
  S(g).op = 999;
  S(g).args[0] = -77;
  EXPECT_OK(k);
  END();
}
END_TEST

START_TEST(valid_deep_nesting) {
  BEGIN(0, NULL, FB_T_VOID);
  for (int d = 0; d < 200; d++) {
    int w = fb_b_while(b); /* not inside BODY(): the call may move k->stmts */
    fb_b_enter(b, BODY(w));
  }
  fb_b_break(b);
  EXPECT_OK(k);
  END();
}
END_TEST

/* ---------------------------------------------------------------- kernel shape */

START_TEST(rule_no_layout) {
  fb_kernel *k = fb_kernel_new(NULL, "t", 0, NULL, FB_T_VOID);
  fb_builder b;
  fb_builder_init(&b, k);
  fb_b_const_i32(&b, 1);
  EXPECT_ERR(k, -1, "no layout");
  fb_kernel_free(k);
}
END_TEST

START_TEST(rule_layout_not_finalized) {
  fb_layout *l = fb_layout_new();
  int64_t s4[1] = {4};
  int d = fb_layout_add(l, 0, FB_SN_DENSE, "i", s4, 0, NULL);
  int x = fb_layout_place(l, d, "x", FB_T_I32);
  fb_kernel *k = fb_kernel_new(l, "t", 0, NULL, FB_T_VOID);
  fb_builder b;
  fb_builder_init(&b, k);
  int i[1] = {fb_b_const_i32(&b, 0)};
  fb_b_load(&b, x, i, 1);
  EXPECT_ERR(k, -1, "layout is not finalized");
  fb_kernel_free(k);
  fb_layout_free(l);
}
END_TEST

START_TEST(rule_param_types) {
  fb_type p[3] = {FB_T_I32, FB_T_VOID, (fb_type)42};
  BEGIN(3, p, FB_T_VOID);
  EXPECT_ERR(k, -1, "parameter 1 has type void");
  EXPECT_ERR(k, -1, "parameter 2 has type ? (42)");
  k->ret = (fb_type)17;
  EXPECT_ERR(k, -1, "return type 17 is not a type");
  END();
}
END_TEST

START_TEST(rule_block_out_of_range) {
  BEGIN(0, NULL, FB_T_VOID);
  int iff = fb_b_if(b, fb_b_const_bool(b, 1), 1);
  S(iff).body = 57;
  S(iff).orelse = -4;
  EXPECT_ERR(k, iff, "body block 57 is out of range");
  EXPECT_ERR(k, iff, "orelse block -4 is out of range");
  END();
}
END_TEST

START_TEST(rule_block_missing_or_extra) {
  BEGIN(0, NULL, FB_T_VOID);
  int w = fb_b_while(b);
  int extra = fb_block_new(k);
  S(w).body = -1;
  int c = fb_b_const_i32(b, 1);
  S(c).body = extra;
  int w2 = fb_b_while(b);
  S(w2).orelse = extra;
  EXPECT_ERR(k, w, "needs a body block");
  EXPECT_ERR(k, c, "takes no body block (has block");
  EXPECT_ERR(k, w2, "takes no orelse block");
  END();
}
END_TEST

START_TEST(rule_stmt_in_two_blocks) {
  BEGIN(0, NULL, FB_T_VOID);
  int c = fb_b_const_i32(b, 1);
  int w = fb_b_while(b);
  block_push(k, BODY(w), c);
  EXPECT_ERR(k, c, "listed in more than one block");
  END();
}
END_TEST

START_TEST(rule_block_ids_in_range) {
  BEGIN(0, NULL, FB_T_VOID);
  int w = fb_b_while(b);
  block_push(k, 0, 1000);
  block_push(k, BODY(w), -7);
  EXPECT_ERR(k, -1, "body block 0 lists statement id 1000, out of range");
  EXPECT_ERR(k, w, "lists statement id -7, out of range");
  END();
}
END_TEST

START_TEST(rule_block_cycle) {
  BEGIN(0, NULL, FB_T_VOID);
  int w = fb_b_while(b);
  int sv = fb_b_enter(b, BODY(w));
  int w2 = fb_b_while(b);
  fb_b_leave(b, sv);
  S(w2).body = BODY(w);
  int w3 = fb_b_while(b);
  S(w3).body = 0;
  EXPECT_ERR(k, w2, "encloses this statement (a cycle of blocks)");
  EXPECT_ERR(k, w3, "body block 0 encloses this statement");
  END();
}
END_TEST

START_TEST(rule_block_shared) {
  BEGIN(0, NULL, FB_T_VOID);
  int w = fb_b_while(b);
  int w2 = fb_b_while(b);
  S(w2).body = BODY(w);
  EXPECT_ERR(k, w2, "is already used by another statement");
  END();
}
END_TEST

START_TEST(rule_nesting_depth) {
  BEGIN(0, NULL, FB_T_VOID);
  for (int d = 0; d < 300; d++) {
    int w = fb_b_while(b);
    fb_b_enter(b, BODY(w));
  }
  ck_assert_int_eq(b->err, 0);
  EXPECT_ERR(k, 256, "blocks nested deeper than 256");
  END();
}
END_TEST

/* ---------------------------------------------------------------- operands */

START_TEST(rule_operand_range) {
  BEGIN(0, NULL, FB_T_VOID);
  int c = fb_b_const_i32(b, 1);
  int a1 = fb_b_binary(b, FB_OP_ADD, c, 999);
  int a2 = fb_b_binary(b, FB_OP_ADD, -5, c);
  EXPECT_ERR(k, a1, "operand 1 (%999) is out of range");
  EXPECT_ERR(k, a2, "operand 0 (%-5) is out of range");
  END();
}
END_TEST

START_TEST(rule_use_before_def) {
  BEGIN(0, NULL, FB_T_VOID);
  int c = fb_b_const_i32(b, 1);
  int a = fb_b_binary(b, FB_OP_ADD, c, c + 2);
  int later = fb_b_const_i32(b, 2);
  ck_assert_int_eq(later, c + 2);
  EXPECT_ERR(k, a, "operand 1 (%2) is not defined before this use");
  END();
}
END_TEST

START_TEST(rule_use_of_unreachable) {
  BEGIN(0, NULL, FB_T_VOID);
  int sv = fb_b_enter(b, fb_block_new(k));
  int dead = fb_b_const_i32(b, 1);
  fb_b_leave(b, sv);
  int a = fb_b_unary(b, FB_OP_NEG, dead);
  EXPECT_ERR(k, a, "operand 0 (%0) is not defined before this use");
  END();
}
END_TEST

START_TEST(rule_use_out_of_scope) {
  BEGIN(0, NULL, FB_T_VOID);
  int iff = fb_b_if(b, fb_b_const_bool(b, 1), 0);
  int sv = fb_b_enter(b, BODY(iff));
  int inner = fb_b_const_i32(b, 3);
  fb_b_leave(b, sv);
  int a = fb_b_binary(b, FB_OP_ADD, inner, inner);
  char rule[64];
  snprintf(rule, sizeof rule, "operand 0 (%%%d) is used outside the block that defines it", inner);
  EXPECT_ERR(k, a, rule);
  END();
}
END_TEST

START_TEST(rule_operand_is_value) {
  BEGIN(0, NULL, FB_T_VOID);
  int c = fb_b_const_i32(b, 1);
  int w = fb_b_while(b);
  int a = fb_b_binary(b, FB_OP_ADD, c, w);
  int var = fb_b_alloca(b, FB_T_I32);
  int a2 = fb_b_binary(b, FB_OP_ADD, var, c);
  EXPECT_ERR(k, a, "operand 1 (%1 while) produces no value");
  EXPECT_ERR(k, a2, "is a local variable, not a value");
  END();
}
END_TEST

START_TEST(rule_arity_fixed) {
  BEGIN(0, NULL, FB_T_VOID);
  int c = fb_b_const_i32(b, 1);
  int a = fb_b_binary(b, FB_OP_ADD, c, c);
  S(a).nargs = 1;
  int a2 = fb_b_unary(b, FB_OP_NEG, c);
  S(a2).nargs = 200;
  int r = fb_b_rand(b, 0);
  S(r).nargs = 1;
  S(r).args[0] = c;
  EXPECT_ERR(k, a, "takes 2 operands, has 1");
  EXPECT_ERR(k, a2, "takes 1 operand, has 200");
  EXPECT_ERR(k, r, "takes 0 operands, has 1");
  END();
}
END_TEST

START_TEST(rule_arity_global) {
  BEGIN(0, NULL, FB_T_VOID);
  int i = fb_b_const_i32(b, 0);
  int i1[1] = {i}, i2[2] = {i, i};
  int ld = fb_b_load(b, f.x, i1, 1);
  int st = fb_b_global(b, FB_OP_STORE, f.n, i2, 2, -1);
  int at = fb_b_global(b, FB_OP_ATOMIC_ADD, f.n, i1, 1, i);
  int sp = fb_b_global(b, FB_OP_IS_ACTIVE, f.ptr, i2, 2, -1);
  EXPECT_ERR(k, ld, "takes 2 operands (2 indices of SNode 2), has 1");
  EXPECT_ERR(k, st, "takes 3 operands (2 indices of SNode 3 and a value), has 2");
  EXPECT_ERR(k, at, "takes 3 operands");
  EXPECT_ERR(k, sp, "takes 1 operand (1 index of SNode");
  END();
}
END_TEST

START_TEST(rule_arity_dynamic) {
  BEGIN(0, NULL, FB_T_VOID);
  int i = fb_b_const_i32(b, 0);
  int i2[2] = {i, i};
  int len = fb_b_global(b, FB_OP_LENGTH, f.lst, i2, 2, -1);
  int app = fb_b_global(b, FB_OP_APPEND, f.lst, i2, 2, i);
  EXPECT_ERR(k, len, "takes 1 operand (1 index of SNode 7), has 2");
  EXPECT_ERR(k, app, "takes 2 operands (1 index of SNode 7 and a value), has 3");
  END();
}
END_TEST

/* ---------------------------------------------------------------- types: values */

START_TEST(rule_const_arg) {
  BEGIN(1, P_I32, FB_T_VOID);
  int c = fb_b_const_i32(b, 1);
  S(c).type = FB_T_VOID;
  int a = fb_b_arg(b, 3);
  int a2 = fb_b_arg(b, 0);
  S(a2).type = FB_T_F32;
  int a3 = fb_b_arg(b, -1);
  EXPECT_ERR(k, c, "needs a non-void type");
  EXPECT_ERR(k, a, "parameter 3 does not exist (1 parameters)");
  EXPECT_ERR(k, a2, "type f32 differs from parameter 0's type i32");
  EXPECT_ERR(k, a3, "parameter -1 does not exist");
  END();
}
END_TEST

START_TEST(rule_cast_select) {
  BEGIN(0, NULL, FB_T_VOID);
  int i = fb_b_const_i32(b, 1), x = fb_b_const_f32(b, 1.0f), t = fb_b_const_bool(b, 1);
  int c = fb_b_cast(b, FB_T_VOID, i);
  int s1 = fb_b_select(b, i, i, i);
  int s2 = fb_b_select(b, t, i, x);
  int s3 = fb_b_select(b, t, i, i);
  S(s3).type = FB_T_I64;
  EXPECT_ERR(k, c, "casts need numeric or bool types (i32 to void)");
  EXPECT_ERR(k, s1, "condition must be bool, is i32");
  EXPECT_ERR(k, s2, "operands and result must have one type (i32, f32 -> i32)");
  EXPECT_ERR(k, s3, "operands and result must have one type (i32, i32 -> i64)");
  END();
}
END_TEST

START_TEST(rule_arith) {
  BEGIN(0, NULL, FB_T_VOID);
  int i = fb_b_const_i32(b, 1), x = fb_b_const_f32(b, 1.0f), t = fb_b_const_bool(b, 1);
  int a1 = fb_b_binary(b, FB_OP_ADD, i, x);
  int a2 = fb_b_binary(b, FB_OP_MUL, t, t);
  int a3 = fb_b_binary(b, FB_OP_SUB, x, x);
  S(a3).type = FB_T_F64;
  int f1 = fb_b_binary(b, FB_OP_POW, i, i);
  EXPECT_ERR(k, a1, "operands and result must have one numeric type (i32, f32 -> i32)");
  EXPECT_ERR(k, a2, "one numeric type (bool, bool -> bool)");
  EXPECT_ERR(k, a3, "one numeric type (f32, f32 -> f64)");
  EXPECT_ERR(k, f1, "one float type (i32, i32 -> i32)");
  END();
}
END_TEST

START_TEST(rule_cmp) {
  BEGIN(0, NULL, FB_T_VOID);
  int i = fb_b_const_i32(b, 1), x = fb_b_const_f32(b, 1.0f);
  int c1 = fb_b_binary(b, FB_OP_LT, i, x);
  int c2 = fb_b_binary(b, FB_OP_EQ, i, i);
  S(c2).type = FB_T_I32;
  EXPECT_ERR(k, c1, "operands must have one type (i32, f32)");
  EXPECT_ERR(k, c2, "result must be bool, is i32");
  END();
}
END_TEST

START_TEST(rule_bits_shift_not) {
  BEGIN(0, NULL, FB_T_VOID);
  int i = fb_b_const_i32(b, 1), l = fb_b_const_i64(b, 1), x = fb_b_const_f32(b, 1.0f);
  int t = fb_b_const_bool(b, 0);
  int b1 = fb_b_binary(b, FB_OP_AND, x, x);
  int b2 = fb_b_binary(b, FB_OP_OR, t, i);
  int s1 = fb_b_binary(b, FB_OP_SHL, i, l);
  int s2 = fb_b_binary(b, FB_OP_SHR, t, t);
  int n1 = fb_b_unary(b, FB_OP_NOT, x);
  EXPECT_ERR(k, b1, "one integer or bool type (f32, f32 -> f32)");
  EXPECT_ERR(k, b2, "one integer or bool type (bool, i32 -> bool)");
  EXPECT_ERR(k, s1, "one integer type (i32, i64 -> i32)");
  EXPECT_ERR(k, s2, "one integer type (bool, bool -> bool)");
  EXPECT_ERR(k, n1, "one integer or bool type (f32 -> f32)");
  END();
}
END_TEST

START_TEST(rule_unary) {
  BEGIN(0, NULL, FB_T_VOID);
  int i = fb_b_const_i32(b, 1), t = fb_b_const_bool(b, 0);
  int u1 = fb_b_unary(b, FB_OP_NEG, t);
  int u2 = fb_b_unary(b, FB_OP_SQRT, i);
  int u3 = fb_b_unary(b, FB_OP_ABS, i);
  S(u3).type = FB_T_U32;
  EXPECT_ERR(k, u1, "one numeric type (bool -> bool)");
  EXPECT_ERR(k, u2, "one float type (i32 -> i32)");
  EXPECT_ERR(k, u3, "one numeric type (i32 -> u32)");
  END();
}
END_TEST

START_TEST(rule_locals) {
  BEGIN(0, NULL, FB_T_VOID);
  int v0 = fb_b_alloca(b, FB_T_VOID);
  int v = fb_b_alloca(b, FB_T_I32);
  int c = fb_b_const_i32(b, 1), x = fb_b_const_f32(b, 1.0f);
  int l1 = fb_b_lload(b, c);
  int l2 = fb_b_lload(b, v);
  S(l2).type = FB_T_F32;
  int s1 = fb_b_lstore(b, c, c);
  int s2 = fb_b_lstore(b, v, x);
  EXPECT_ERR(k, v0, "needs a non-void type");
  EXPECT_ERR(k, l1, "operand 0 (%2 const) is not an alloca");
  EXPECT_ERR(k, l2, "result type f32 differs from the variable's i32");
  EXPECT_ERR(k, s1, "is not an alloca");
  EXPECT_ERR(k, s2, "value type f32 differs from the variable's i32");
  END();
}
END_TEST

/* ---------------------------------------------------------------- types: globals */

START_TEST(rule_load_store) {
  BEGIN(0, NULL, FB_T_VOID);
  int i = fb_b_const_i32(b, 0), l = fb_b_const_i64(b, 0), x = fb_b_const_f32(b, 1.0f);
  int ii[2] = {i, i}, il[2] = {i, l};
  int ld1 = fb_b_load(b, f.dense, ii, 2);
  int ld2 = fb_b_load(b, f.x, il, 2);
  int ld3 = fb_b_load(b, f.x, ii, 2);
  S(ld3).type = FB_T_I32;
  int st = fb_b_store(b, f.x, ii, 2, i);
  int st2 = fb_b_store(b, f.n, ii, 2, x);
  EXPECT_ERR(k, ld1, "SNode 1 (dense) is not a field");
  EXPECT_ERR(k, ld2, "index 1 (%1) has type i64; indices are i32");
  EXPECT_ERR(k, ld3, "result type i32 differs from the field's f32");
  EXPECT_ERR(k, st, "value type i32 differs from the field's f32");
  EXPECT_ERR(k, st2, "value type f32 differs from the field's i32");
  END();
}
END_TEST

START_TEST(rule_atomics) {
  BEGIN(0, NULL, FB_T_VOID);
  int i = fb_b_const_i32(b, 0), x = fb_b_const_f32(b, 1.0f), t = fb_b_const_bool(b, 1);
  int ii[2] = {i, i};
  int a1 = fb_b_global(b, FB_OP_ATOMIC_ADD, f.x, ii, 2, x);
  S(a1).type = FB_T_F64;
  int a2 = fb_b_global(b, FB_OP_ATOMIC_MAX, f.bf, ii, 2, t);
  int a3 = fb_b_global(b, FB_OP_ATOMIC_AND, f.x, ii, 2, x);
  int a4 = fb_b_global(b, FB_OP_ATOMIC_XOR, f.n, ii, 2, x);
  EXPECT_ERR(k, a1, "result type f64 differs from the field's f32");
  EXPECT_ERR(k, a2, "needs a numeric field, field bf is bool");
  EXPECT_ERR(k, a3, "needs an integer field, field x is f32");
  EXPECT_ERR(k, a4, "value type f32 differs from the field's i32");
  END();
}
END_TEST

START_TEST(rule_sparse) {
  BEGIN(0, NULL, FB_T_VOID);
  int i = fb_b_const_i32(b, 0), x = fb_b_const_f32(b, 0.0f);
  int i1[1] = {i}, x1[1] = {x};
  int s1 = fb_b_global(b, FB_OP_ACTIVATE, 0, NULL, 0, -1);
  int s2 = fb_b_global(b, FB_OP_IS_ACTIVE, f.ptr, i1, 1, -1);
  S(s2).type = FB_T_I32;
  int s3 = fb_b_global(b, FB_OP_DEACTIVATE, f.ptr, x1, 1, -1);
  EXPECT_ERR(k, s1, "names the root SNode");
  EXPECT_ERR(k, s2, "result must be bool, is i32");
  EXPECT_ERR(k, s3, "index 0 (%1) has type f32; indices are i32");
  END();
}
END_TEST

/* deactivate needs a sparse container: a dense one, a field in a dense one
 * and a field at the root are refused; is_active and activate stay legal on
 * them, and deactivate on every sparse kind (directly or via a field) is fine. */
START_TEST(rule_deactivate_dense) {
  BEGIN(0, NULL, FB_T_VOID);
  int i = fb_b_const_i32(b, 0);
  int i2[2] = {i, i};
  int d1 = fb_b_global(b, FB_OP_DEACTIVATE, f.dense, i2, 2, -1);
  int d2 = fb_b_global(b, FB_OP_DEACTIVATE, f.x, i2, 2, -1);
  int d3 = fb_b_global(b, FB_OP_DEACTIVATE, f.scalar, NULL, 0, -1);
  const char *rule = "deactivate needs a sparse SNode (bitmasked, pointer or dynamic)";
  EXPECT_ERR(k, d1, rule);
  EXPECT_ERR(k, d2, rule);
  EXPECT_ERR(k, d3, rule);
  EXPECT_ERR(k, d2, "field x sits in a dense SNode");
  fb_diags d;
  fb_diags_init(&d);
  ck_assert_int_eq(fb_verify(k, &d), FB_EVERIFY);
  ck_assert_int_eq(d.n, 3);
  fb_diags_free(&d);
  END();
}
END_TEST

START_TEST(valid_deactivate_sparse) {
  BEGIN(0, NULL, FB_T_VOID);
  int i = fb_b_const_i32(b, 0);
  int i1[1] = {i}, i2[2] = {i, i};
  fb_b_global(b, FB_OP_DEACTIVATE, f.ptr, i1, 1, -1);
  fb_b_global(b, FB_OP_DEACTIVATE, f.dyn, i2, 2, -1);
  fb_b_global(b, FB_OP_DEACTIVATE, f.lst, i2, 2, -1);
  fb_b_global(b, FB_OP_DEACTIVATE, f.bm, i1, 1, -1);
  fb_b_global(b, FB_OP_DEACTIVATE, f.flag, i1, 1, -1);
  fb_b_global(b, FB_OP_IS_ACTIVE, f.dense, i2, 2, -1);
  fb_b_global(b, FB_OP_ACTIVATE, f.x, i2, 2, -1);
  fb_b_global(b, FB_OP_ACTIVATE, f.scalar, NULL, 0, -1);
  ck_assert_int_eq(b->err, 0);
  EXPECT_OK(k);
  END();
}
END_TEST

START_TEST(rule_append_length) {
  BEGIN(0, NULL, FB_T_VOID);
  int i = fb_b_const_i32(b, 0), x = fb_b_const_f32(b, 0.0f);
  int i1[1] = {i};
  int a1 = fb_b_global(b, FB_OP_APPEND, f.n, i1, 1, i);
  int a2 = fb_b_global(b, FB_OP_APPEND, f.lst, i1, 1, x);
  int l1 = fb_b_global(b, FB_OP_LENGTH, f.dyn, i1, 1, -1);
  int l2 = fb_b_global(b, FB_OP_LENGTH, f.lst, i1, 1, -1);
  S(l2).type = FB_T_I64;
  EXPECT_ERR(k, a1, "SNode 3 (n) is not a field under a dynamic SNode");
  EXPECT_ERR(k, a2, "value type f32 differs from the field's i32");
  EXPECT_ERR(k, l1, "SNode 6 (dyn) is not a field under a dynamic SNode");
  EXPECT_ERR(k, l2, "result must be i32, is i64");
  END();
}
END_TEST

START_TEST(rule_hint) {
  BEGIN(0, NULL, FB_T_VOID);
  int i = fb_b_const_i32(b, 0), x = fb_b_const_f32(b, 0.0f);
  int h1 = fb_b_hint_unique(b, i, f.dense);
  int h2 = fb_b_hint_unique(b, x, f.x);
  int h3 = fb_b_hint_unique(b, i, f.x);
  S(h3).type = FB_T_U32;
  EXPECT_ERR(k, h1, "SNode 1 (dense) is not a field");
  EXPECT_ERR(k, h2, "value must be an integer, is f32");
  EXPECT_ERR(k, h3, "result type u32 differs from the value's i32");
  END();
}
END_TEST

START_TEST(rule_snode_ids) {
  BEGIN(0, NULL, FB_T_VOID);
  int i = fb_b_const_i32(b, 0);
  int ii[2] = {i, i};
  int l1 = fb_b_load(b, 99, ii, 2);
  int l2 = fb_b_load(b, -3, ii, 2);
  int sf = fb_b_struct_for(b, 42);
  int c = fb_b_const_i32(b, 1);
  S(c).snode = 2;
  EXPECT_ERR(k, l1, "SNode 99 is not in the layout (11 nodes)");
  EXPECT_ERR(k, l2, "SNode -3 is not in the layout");
  EXPECT_ERR(k, sf, "SNode 42 is not in the layout");
  EXPECT_ERR(k, c, "names SNode 2 but the op takes none");
  END();
}
END_TEST

/* ---------------------------------------------------------------- types: control */

START_TEST(rule_if_range_struct) {
  BEGIN(0, NULL, FB_T_VOID);
  int i = fb_b_const_i32(b, 0), l = fb_b_const_i64(b, 4);
  int iff = fb_b_if(b, i, 0);
  int r = fb_b_range_for(b, l, i, 0);
  int r2 = fb_b_range_for(b, i, l, 1);
  int s1 = fb_b_struct_for(b, 0);
  int s2 = fb_b_struct_for(b, f.scalar);
  EXPECT_ERR(k, iff, "condition must be bool, is i32");
  EXPECT_ERR(k, r, "bound 0 (%1) has type i64; range bounds are i32");
  EXPECT_ERR(k, r2, "bound 1 (%1) has type i64");
  EXPECT_ERR(k, s1, "names the root SNode; struct_for needs a non-root SNode");
  EXPECT_ERR(k, s2, "SNode 10 (s) has no index space (ndim 0)");
  END();
}
END_TEST

START_TEST(rule_loop_index) {
  BEGIN(0, NULL, FB_T_VOID);
  int c0 = fb_b_const_i32(b, 0), c4 = fb_b_const_i32(b, 4);
  int r = fb_b_range_for(b, c0, c4, 0);
  int sv = fb_b_enter(b, BODY(r));
  int bad_which = fb_b_loop_index(b, r, 1);
  int bad_type = fb_b_loop_index(b, r, 0);
  S(bad_type).type = FB_T_I64;
  fb_b_leave(b, sv);
  int outside = fb_b_loop_index(b, r, 0);
  int w = fb_b_while(b);
  sv = fb_b_enter(b, BODY(w));
  int on_while = fb_b_loop_index(b, w, 0);
  fb_b_break(b);
  fb_b_leave(b, sv);
  int sf = fb_b_struct_for(b, f.x);
  sv = fb_b_enter(b, BODY(sf));
  int third = fb_b_loop_index(b, sf, 2);
  int neg = fb_b_loop_index(b, sf, -1);
  fb_b_leave(b, sv);
  char rule[96];
  EXPECT_ERR(k, bad_which, "index 1 is out of range; the loop has 1");
  EXPECT_ERR(k, bad_type, "result must be i32, is i64");
  snprintf(rule, sizeof rule, "operand 0 (%%%d range_for) is not an enclosing range_for", r);
  EXPECT_ERR(k, outside, rule);
  snprintf(rule, sizeof rule, "operand 0 (%%%d while) is not an enclosing", w);
  EXPECT_ERR(k, on_while, rule);
  EXPECT_ERR(k, third, "index 2 is out of range; the loop has 2");
  EXPECT_ERR(k, neg, "index -1 is out of range");
  END();
}
END_TEST

START_TEST(rule_ret) {
  BEGIN(0, NULL, FB_T_I32);
  int i = fb_b_const_i32(b, 0), x = fb_b_const_f32(b, 0.0f);
  int r1 = fb_b_ret(b, i, 1);
  int r2 = fb_b_ret(b, x, 0);
  EXPECT_ERR(k, r1, "return slot 1 must be 0");
  EXPECT_ERR(k, r2, "value type f32 differs from the kernel's return type i32");
  k->ret = FB_T_VOID;
  EXPECT_ERR(k, r2, "the kernel returns void");
  END();
}
END_TEST

START_TEST(rule_gtmp_rand) {
  BEGIN(0, NULL, FB_T_VOID);
  int i = fb_b_const_i32(b, 0);
  int g1 = fb_b_gtmp_store(b, i, 12);
  int g2 = fb_b_gtmp_load(b, FB_T_I32, -8);
  int g3 = fb_b_gtmp_load(b, FB_T_VOID, 0);
  int r = fb_b_rand(b, 0);
  S(r).type = FB_T_F64;
  EXPECT_ERR(k, g1, "scratch offset 12 must be non-negative and 8-aligned");
  EXPECT_ERR(k, g2, "scratch offset -8 must be non-negative and 8-aligned");
  EXPECT_ERR(k, g3, "needs a non-void type");
  EXPECT_ERR(k, r, "result must be f32, is f64");
  END();
}
END_TEST

START_TEST(rule_jump) {
  BEGIN(0, NULL, FB_T_VOID);
  int br = fb_b_break(b);
  int iff = fb_b_if(b, fb_b_const_bool(b, 1), 0);
  int sv = fb_b_enter(b, BODY(iff));
  int co = fb_b_continue(b);
  fb_b_leave(b, sv);
  int p = fb_b_range_for(b, fb_b_const_i32(b, 0), fb_b_const_i32(b, 4), 1);
  sv = fb_b_enter(b, BODY(p));
  int in = fb_b_if(b, fb_b_const_bool(b, 0), 0);
  fb_b_enter(b, BODY(in));
  int br2 = fb_b_break(b);
  fb_b_leave(b, sv);
  int sf = fb_b_struct_for(b, f.x);
  sv = fb_b_enter(b, BODY(sf));
  int co2 = fb_b_continue(b);
  fb_b_leave(b, sv);
  char rule[96];
  EXPECT_ERR(k, br, "is not inside a while or range_for");
  EXPECT_ERR(k, co, "is not inside a while or range_for");
  snprintf(rule, sizeof rule, "crosses the parallel loop %%%d", p);
  EXPECT_ERR(k, br2, rule);
  snprintf(rule, sizeof rule, "crosses the parallel loop %%%d", sf);
  EXPECT_ERR(k, co2, rule);
  END();
}
END_TEST

START_TEST(rule_parallel_top_level) {
  BEGIN(0, NULL, FB_T_VOID);
  int c0 = fb_b_const_i32(b, 0), c4 = fb_b_const_i32(b, 4);
  int r = fb_b_range_for(b, c0, c4, 0);
  int sv = fb_b_enter(b, BODY(r));
  int p1 = fb_b_range_for(b, c0, c4, 1);
  fb_b_leave(b, sv);
  int iff = fb_b_if(b, fb_b_const_bool(b, 1), 0);
  sv = fb_b_enter(b, BODY(iff));
  int s1 = fb_b_struct_for(b, f.x);
  fb_b_leave(b, sv);
  int p2 = fb_b_range_for(b, c0, c4, 1);
  sv = fb_b_enter(b, BODY(p2));
  int p3 = fb_b_range_for(b, c0, c4, 1);
  fb_b_leave(b, sv);
  char rule[96];
  snprintf(rule, sizeof rule, "sit directly in the kernel body, not inside %%%d range_for", r);
  EXPECT_ERR(k, p1, rule);
  snprintf(rule, sizeof rule, "not inside %%%d if", iff);
  EXPECT_ERR(k, s1, rule);
  snprintf(rule, sizeof rule, "not inside %%%d par_for", p2);
  EXPECT_ERR(k, p3, rule);
  END();
}
END_TEST

/* ---------------------------------------------------------------- garbage fields */

START_TEST(rule_bad_op_and_type) {
  BEGIN(0, NULL, FB_T_VOID);
  int c = fb_b_const_i32(b, 1);
  int u = fb_b_unary(b, FB_OP_NEG, c);
  S(u).op = 999;
  int u2 = fb_b_unary(b, FB_OP_NEG, c);
  S(u2).op = FB_OP__COUNT;
  int t = fb_b_unary(b, FB_OP_NEG, c);
  S(t).type = 77;
  int st = fb_b_store(b, f.scalar, NULL, 0, fb_b_const_f64(b, 1.0));
  S(st).type = FB_T_I32;
  int user = fb_b_unary(b, FB_OP_NEG, u); /* uses the unknown op: no cascade */
  EXPECT_ERR(k, u, "unknown op 999");
  EXPECT_ERR(k, u2, "unknown op");
  EXPECT_ERR(k, t, "result type 77 is not a type");
  EXPECT_ERR(k, st, "produces no value; its type must be void, is i32");
  fb_diags d;
  fb_diags_init(&d);
  fb_verify(k, &d);
  for (int q = 0; q < d.n; q++) ck_assert_int_ne(d.v[q].stmt, user);
  fb_diags_free(&d);
  END();
}
END_TEST

START_TEST(rule_null_and_broken_arrays) {
  fb_diags d;
  fb_diags_init(&d);
  ck_assert_int_eq(fb_verify(NULL, &d), FB_EVERIFY);
  ck_assert_int_eq(d.n, 1);
  fb_diags_free(&d);
  BEGIN(0, NULL, FB_T_VOID);
  fb_b_const_i32(b, 1);
  k->nparams = 2; /* params pointer stays NULL */
  EXPECT_ERR(k, -1, "parameter list is malformed (2 parameters)");
  k->nparams = 0;
  k->blocks[0].n = -4;
  EXPECT_ERR(k, -1, "body block 0 has a malformed statement list (-4 entries)");
  k->blocks[0].n = 1;
  int nb = k->nblocks;
  k->nblocks = 0;
  EXPECT_ERR(k, -1, "no body block");
  k->nblocks = nb;
  /* verifying without a diagnostics list still gives the verdict */
  k->nstmts = -1;
  ck_assert_int_eq(fb_verify(k, NULL), FB_EVERIFY);
  k->nstmts = 1;
  ck_assert_int_eq(fb_verify(k, NULL), 0);
  END();
}
END_TEST

/* ---------------------------------------------------------------- reporting */

START_TEST(three_independent_errors) {
  BEGIN(0, NULL, FB_T_VOID);
  int i = fb_b_const_i32(b, 1), x = fb_b_const_f32(b, 2.0f);
  int add = fb_b_binary(b, FB_OP_ADD, i, x);
  int ret = fb_b_ret(b, i, 0);
  int w = fb_b_while(b);
  int sv = fb_b_enter(b, BODY(w));
  fb_b_break(b);
  fb_b_leave(b, sv);
  int br = fb_b_break(b);
  fb_diags d;
  fb_diags_init(&d);
  ck_assert_int_eq(fb_verify(k, &d), FB_EVERIFY);
  char *all = fb_diags_join(&d);
  ck_assert_msg(d.n == 3, "expected 3 diagnostics, got:\n%s", all);
  ck_assert_int_eq(d.v[0].stmt, add);
  ck_assert_int_eq(d.v[1].stmt, ret);
  ck_assert_int_eq(d.v[2].stmt, br);
  ck_assert_ptr_nonnull(strstr(all, "%2 add: operands and result must have one numeric type"));
  ck_assert_ptr_nonnull(strstr(all, "%3 ret: the kernel returns void"));
  ck_assert_ptr_nonnull(strstr(all, "%6 break: is not inside a while or range_for"));
  free(all);
  fb_diags_free(&d);
  END();
}
END_TEST

/* ---------------------------------------------------------------- fuzz */

static uint64_t xs(uint64_t *s) {
  *s ^= *s << 13;
  *s ^= *s >> 7;
  *s ^= *s << 17;
  return *s;
}
static int rnd(uint64_t *s, int lo, int hi) { return lo + (int)(xs(s) % (uint64_t)(hi - lo + 1)); }

/* One random corruption of a statement, a block list, params or ret. Block
 * lengths only shrink: a count beyond the array is memory corruption, not
 * malformed IR. */
static void mutate(fb_kernel *k, uint64_t *r) {
  fb_stmt *s = &k->stmts[rnd(r, 0, k->nstmts - 1)];
  fb_block *bl = &k->blocks[rnd(r, 0, k->nblocks - 1)];
  int wild = rnd(r, 0, 4) == 0;
  switch (rnd(r, 0, 12)) {
  case 0: s->op = (uint16_t)(wild ? xs(r) : (uint64_t)rnd(r, 0, FB_OP__COUNT + 2)); break;
  case 1: s->type = (uint8_t)(wild ? xs(r) : (uint64_t)rnd(r, 0, FB_T__COUNT + 1)); break;
  case 2: s->nargs = (uint8_t)(wild ? xs(r) : (uint64_t)rnd(r, 0, FB_MAX_ARGS + 1)); break;
  case 3:
    s->args[rnd(r, 0, FB_MAX_ARGS - 1)] = wild ? (int32_t)xs(r) : rnd(r, -3, k->nstmts + 3);
    break;
  case 4: s->snode = wild ? (int32_t)xs(r) : rnd(r, -3, k->layout->nnodes + 3); break;
  case 5: s->body = wild ? (int32_t)xs(r) : rnd(r, -3, k->nblocks + 2); break;
  case 6: s->orelse = rnd(r, -3, k->nblocks + 2); break;
  case 7: s->imm.i = wild ? (int64_t)xs(r) : rnd(r, -9, 9); break;
  case 8:
    if (bl->n) bl->ids[rnd(r, 0, bl->n - 1)] = wild ? (int32_t)xs(r) : rnd(r, -3, k->nstmts + 3);
    break;
  case 9:
    if (bl->n) bl->n = rnd(r, 0, bl->n - 1);
    break;
  case 10:
    if (bl->n > 1) {
      int p = rnd(r, 0, bl->n - 1), q = rnd(r, 0, bl->n - 1), t = bl->ids[p];
      bl->ids[p] = bl->ids[q];
      bl->ids[q] = t;
    }
    break;
  case 11:
    if (k->nparams) k->params[rnd(r, 0, k->nparams - 1)] = (fb_type)rnd(r, 0, FB_T__COUNT + 1);
    break;
  default: k->ret = (fb_type)rnd(r, 0, FB_T__COUNT + 1); break;
  }
}

static void check_mutant(const fb_kernel *m, const fb_kernel *base, int *accepted) {
  fb_diags d;
  fb_diags_init(&d);
  int rc = fb_verify(m, &d);
  ck_assert_msg(rc == 0 || rc == FB_EVERIFY, "fb_verify returned %d", rc);
  ck_assert_int_eq(rc == 0, d.n == 0);
  for (int i = 0; i < d.n; i++) {
    ck_assert(d.v[i].stmt >= -1 && d.v[i].stmt < m->nstmts);
    ck_assert(d.v[i].msg[0] == '%' || strncmp(d.v[i].msg, "kernel: ", 8) == 0);
  }
  fb_diags_free(&d);
  uint64_t h = fb_kernel_hash(m);
  if (fb_kernel_equal(m, base)) ck_assert(h == fb_kernel_hash(base));
  fb_kernel *c = fb_kernel_compact(m);
  ck_assert_ptr_nonnull(c);
  if (rc == 0) {
    (*accepted)++;
    ck_assert_int_eq(fb_verify(c, NULL), 0);
    ck_assert(fb_kernel_equal(c, m));
    ck_assert(fb_kernel_hash(c) == h);
  }
  fb_kernel_free(c);
}

START_TEST(fuzz_mutated_kernels) {
  BEGIN(2, P_I32_F32, FB_T_I32);
  fb_kernel *bases[5];
  fb_type pf[1] = {FB_T_F32};
  for (int i = 0; i < 5; i++) {
    bases[i] = fb_kernel_new(f.l, "base", i == 4 ? 1 : 2, i == 4 ? pf : P_I32_F32,
                             i == 4   ? FB_T_F32
                             : i == 3 ? FB_T_I32
                                      : FB_T_VOID);
    fb_builder bb;
    fb_builder_init(&bb, bases[i]);
    switch (i) {
    case 0: build_values(&bb); break;
    case 1:
      build_globals(&bb, &f);
      build_locals(&bb);
      break;
    case 2: build_sparse(&bb, &f); break;
    case 3: build_control(&bb, &f); break;
    default: build_misc(&bb); break;
    }
    EXPECT_OK(bases[i]);
  }
  uint64_t r = 0x9e3779b97f4a7c15ull;
  int accepted = 0, total = 4000;
  for (int it = 0; it < total; it++) {
    const fb_kernel *base = bases[it % 5];
    fb_kernel *m = fb_kernel_clone(base);
    ck_assert_ptr_nonnull(m);
    int nm = rnd(&r, 1, 4);
    for (int q = 0; q < nm; q++) mutate(m, &r);
    check_mutant(m, base, &accepted);
    fb_kernel_free(m);
  }
  /* Both verdicts occur: the mutations are neither all benign nor all fatal. */
  ck_assert_int_gt(accepted, 0);
  ck_assert_int_lt(accepted, total / 2);
  for (int i = 0; i < 5; i++) fb_kernel_free(bases[i]);
  END();
}
END_TEST

static Suite *verify_suite(void) {
  Suite *s = suite_create("verify");
  TCase *ok = tcase_create("valid");
  tcase_add_test(ok, valid_values);
  tcase_add_test(ok, valid_locals);
  tcase_add_test(ok, valid_globals);
  tcase_add_test(ok, valid_sparse);
  tcase_add_test(ok, valid_control);
  tcase_add_test(ok, valid_misc);
  tcase_add_test(ok, valid_empty_and_dead);
  tcase_add_test(ok, valid_deep_nesting);
  suite_add_tcase(s, ok);
  TCase *shape = tcase_create("shape");
  tcase_add_test(shape, rule_no_layout);
  tcase_add_test(shape, rule_layout_not_finalized);
  tcase_add_test(shape, rule_param_types);
  tcase_add_test(shape, rule_block_out_of_range);
  tcase_add_test(shape, rule_block_missing_or_extra);
  tcase_add_test(shape, rule_stmt_in_two_blocks);
  tcase_add_test(shape, rule_block_ids_in_range);
  tcase_add_test(shape, rule_block_cycle);
  tcase_add_test(shape, rule_block_shared);
  tcase_add_test(shape, rule_nesting_depth);
  tcase_add_test(shape, rule_bad_op_and_type);
  tcase_add_test(shape, rule_null_and_broken_arrays);
  suite_add_tcase(s, shape);
  TCase *ops = tcase_create("operands");
  tcase_add_test(ops, rule_operand_range);
  tcase_add_test(ops, rule_use_before_def);
  tcase_add_test(ops, rule_use_of_unreachable);
  tcase_add_test(ops, rule_use_out_of_scope);
  tcase_add_test(ops, rule_operand_is_value);
  tcase_add_test(ops, rule_arity_fixed);
  tcase_add_test(ops, rule_arity_global);
  tcase_add_test(ops, rule_arity_dynamic);
  suite_add_tcase(s, ops);
  TCase *ty = tcase_create("types");
  tcase_add_test(ty, rule_const_arg);
  tcase_add_test(ty, rule_cast_select);
  tcase_add_test(ty, rule_arith);
  tcase_add_test(ty, rule_cmp);
  tcase_add_test(ty, rule_bits_shift_not);
  tcase_add_test(ty, rule_unary);
  tcase_add_test(ty, rule_locals);
  tcase_add_test(ty, rule_load_store);
  tcase_add_test(ty, rule_atomics);
  tcase_add_test(ty, rule_sparse);
  tcase_add_test(ty, rule_deactivate_dense);
  tcase_add_test(ty, valid_deactivate_sparse);
  tcase_add_test(ty, rule_append_length);
  tcase_add_test(ty, rule_hint);
  tcase_add_test(ty, rule_snode_ids);
  tcase_add_test(ty, rule_if_range_struct);
  tcase_add_test(ty, rule_loop_index);
  tcase_add_test(ty, rule_ret);
  tcase_add_test(ty, rule_gtmp_rand);
  tcase_add_test(ty, rule_jump);
  tcase_add_test(ty, rule_parallel_top_level);
  suite_add_tcase(s, ty);
  TCase *rep = tcase_create("reporting");
  tcase_add_test(rep, three_independent_errors);
  tcase_add_test(rep, fuzz_mutated_kernels);
  suite_add_tcase(s, rep);
  return s;
}

int main(void) { return fbt_run(verify_suite()); }
