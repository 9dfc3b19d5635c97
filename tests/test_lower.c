/* Lowering kernels to tasks: task shapes (one parallel task per top-level
 * loop, one serial task per run of other statements, pure runs dropped;
 * clear_list + listgen per sparse level before a sparse struct-for, gc
 * after deactivation), values crossing task boundaries (recomputed or passed
 * through gtmp), and the oracle check: running the tasks one after another
 * in the interpreter gives the same fields and return value as running the
 * kernel. */
#include <stdio.h>
#include <string.h>

#include "fusebox/ir.h"
#include "optimizer/optimizer.h"
#include "support.h"

enum {
  N = 64
};

static fb_layout *mk_layout(int *x, int *y, int *s) {
  fb_layout *l = fb_layout_new();
  int64_t n = N;
  int d = fb_layout_add(l, 0, FB_SN_DENSE, "i", &n, 0, NULL);
  *x = fb_layout_place(l, d, "x", FB_T_I32);
  *y = fb_layout_place(l, d, "y", FB_T_I32);
  *s = fb_layout_place(l, 0, "s", FB_T_I32);
  ck_assert_int_eq(fb_layout_finalize(l, NULL, 0), 0);
  return l;
}

/* x[i] = i + a0 for i in 0..N */
static int par_fill(fb_builder *b, int field, int offset_value) {
  int lo = fb_b_const_i32(b, 0), hi = fb_b_const_i32(b, N);
  int loop = fb_b_range_for(b, lo, hi, 1);
  int saved = fb_b_enter(b, b->k->stmts[loop].body);
  int i = fb_b_loop_index(b, loop, 0);
  int v = fb_b_binary(b, FB_OP_ADD, i, offset_value);
  fb_b_store(b, field, &i, 1, v);
  fb_b_leave(b, saved);
  return loop;
}

static void run_both(const fb_layout *l, const fb_kernel *k, const fb_value *args, int nargs,
                     int check_field) {
  fb_task_list tl;
  char err[256] = "";
  ck_assert_int_eq(fb_lower(k, &tl, err, sizeof err), 0);
  fb_interp *a = fb_interp_new(l, 1), *b = fb_interp_new(l, 1);
  fb_value ra = {0}, rb = {0};
  ck_assert_int_eq(fb_interp_run(a, k, args, nargs, &ra), 0);
  for (int t = 0; t < tl.n; t++) {
    fb_diags d;
    fb_diags_init(&d);
    int rc = fb_verify(tl.v[t].ir, &d);
    if (rc) {
      char *m = fb_diags_join(&d);
      ck_abort_msg("task %d fails verification: %s", t, m);
    }
    fb_diags_free(&d);
    ck_assert_int_eq(fb_interp_run(b, tl.v[t].ir, args, nargs, &rb), 0);
  }
  if (k->ret != FB_T_VOID) ck_assert_int_eq(ra.v.i, rb.v.i);
  int64_t n = fb_field_numel(l, check_field);
  ck_assert_mem_eq(fb_interp_field(a, check_field), fb_interp_field(b, check_field),
                   (size_t)n * fb_type_size(l->nodes[check_field].type));
  fb_interp_free(a);
  fb_interp_free(b);
  fb_task_list_free(&tl);
}

START_TEST(two_loops_two_tasks) {
  int x, y, s;
  fb_layout *l = mk_layout(&x, &y, &s);
  fb_type p = FB_T_I32;
  fb_kernel *k = fb_kernel_new(l, "k", 1, &p, FB_T_VOID);
  fb_builder b;
  fb_builder_init(&b, k);
  int a = fb_b_arg(&b, 0);
  int two = fb_b_const_i32(&b, 2);
  int a2 = fb_b_binary(&b, FB_OP_MUL, a, two); /* pure: recomputed per task */
  par_fill(&b, x, a2);
  par_fill(&b, y, a);
  fb_task_list tl;
  char err[128];
  ck_assert_int_eq(fb_lower(k, &tl, err, sizeof err), 0);
  ck_assert_int_eq(tl.n, 2); /* the pure prefix is not a task of its own */
  ck_assert_int_eq(tl.v[0].kind, FB_TASK_RANGE_FOR);
  ck_assert_int_eq(tl.v[1].kind, FB_TASK_RANGE_FOR);
  ck_assert_int_ge(tl.v[0].loop, 0);
  ck_assert_int_eq(tl.v[0].ir->stmts[tl.v[0].loop].op, FB_OP_PAR_FOR);
  ck_assert_uint_eq(tl.gtmp_bytes, 0);
  ck_assert_str_eq(tl.v[1].ir->name, "k.t1");
  fb_task_list_free(&tl);
  fb_value av = fb_value_i32(7);
  run_both(l, k, &av, 1, x);
  run_both(l, k, &av, 1, y);
  fb_kernel_free(k);
  fb_layout_free(l);
}
END_TEST

START_TEST(serial_value_spilled_to_gtmp) {
  int x, y, s;
  fb_layout *l = mk_layout(&x, &y, &s);
  fb_kernel *k = fb_kernel_new(l, "k", 0, NULL, FB_T_I32);
  fb_builder b;
  fb_builder_init(&b, k);
  int seven = fb_b_const_i32(&b, 7);
  fb_b_store(&b, s, NULL, 0, seven);
  int v = fb_b_load(&b, s, NULL, 0); /* not pure: must cross through gtmp */
  par_fill(&b, x, v);
  int w = fb_b_load(&b, x, &seven, 1);
  fb_b_ret(&b, w, 0);
  fb_task_list tl;
  char err[128];
  ck_assert_int_eq(fb_lower(k, &tl, err, sizeof err), 0);
  ck_assert_int_eq(tl.n, 3);
  ck_assert_int_eq(tl.v[0].kind, FB_TASK_SERIAL);
  ck_assert_int_eq(tl.v[1].kind, FB_TASK_RANGE_FOR);
  ck_assert_int_eq(tl.v[2].kind, FB_TASK_SERIAL);
  ck_assert_uint_eq(tl.gtmp_bytes, 8);
  int found = 0;
  for (int i = 0; i < tl.v[1].ir->nstmts; i++) found |= tl.v[1].ir->stmts[i].op == FB_OP_GTMP_LOAD;
  ck_assert(found);
  fb_task_list_free(&tl);
  run_both(l, k, NULL, 0, x);
  fb_kernel_free(k);
  fb_layout_free(l);
}
END_TEST

START_TEST(shared_local_variable) {
  int x, y, s;
  fb_layout *l = mk_layout(&x, &y, &s);
  fb_kernel *k = fb_kernel_new(l, "k", 0, NULL, FB_T_I32);
  fb_builder b;
  fb_builder_init(&b, k);
  int var = fb_b_alloca(&b, FB_T_I32);
  int three = fb_b_const_i32(&b, 3);
  fb_b_lstore(&b, var, three);
  int lo = fb_b_const_i32(&b, 0), hi = fb_b_const_i32(&b, N);
  int loop = fb_b_range_for(&b, lo, hi, 1);
  int saved = fb_b_enter(&b, k->stmts[loop].body);
  int i = fb_b_loop_index(&b, loop, 0);
  int cur = fb_b_lload(&b, var);
  int sum = fb_b_binary(&b, FB_OP_ADD, cur, i);
  fb_b_store(&b, x, &i, 1, sum);
  fb_b_leave(&b, saved);
  int after = fb_b_lload(&b, var);
  fb_b_ret(&b, after, 0);
  fb_task_list tl;
  char err[128];
  ck_assert_int_eq(fb_lower(k, &tl, err, sizeof err), 0);
  ck_assert_int_eq(tl.n, 3);
  ck_assert_uint_eq(tl.gtmp_bytes, 8);
  fb_task_list_free(&tl);
  run_both(l, k, NULL, 0, x);
  fb_kernel_free(k);
  fb_layout_free(l);
}
END_TEST

START_TEST(struct_for_task) {
  int x, y, s;
  fb_layout *l = mk_layout(&x, &y, &s);
  fb_kernel *k = fb_kernel_new(l, "k", 0, NULL, FB_T_VOID);
  fb_builder b;
  fb_builder_init(&b, k);
  int loop = fb_b_struct_for(&b, x);
  int saved = fb_b_enter(&b, k->stmts[loop].body);
  int i = fb_b_loop_index(&b, loop, 0);
  int one = fb_b_const_i32(&b, 1);
  fb_b_global(&b, FB_OP_ATOMIC_ADD, s, NULL, 0, one);
  fb_b_store(&b, y, &i, 1, i);
  fb_b_leave(&b, saved);
  fb_task_list tl;
  char err[128];
  ck_assert_int_eq(fb_lower(k, &tl, err, sizeof err), 0);
  ck_assert_int_eq(tl.n, 1);
  ck_assert_int_eq(tl.v[0].kind, FB_TASK_STRUCT_FOR);
  ck_assert_int_eq(tl.v[0].snode, x);
  fb_task_list_free(&tl);
  run_both(l, k, NULL, 0, y);
  run_both(l, k, NULL, 0, s);
  fb_kernel_free(k);
  fb_layout_free(l);
}
END_TEST

START_TEST(empty_and_pure_kernels) {
  int x, y, s;
  fb_layout *l = mk_layout(&x, &y, &s);
  fb_kernel *k = fb_kernel_new(l, "k", 0, NULL, FB_T_VOID);
  fb_builder b;
  fb_builder_init(&b, k);
  fb_b_const_i32(&b, 1);
  fb_task_list tl;
  char err[128];
  ck_assert_int_eq(fb_lower(k, &tl, err, sizeof err), 0);
  ck_assert_int_eq(tl.n, 0);
  fb_task_list_free(&tl);
  fb_kernel_free(k);
  fb_layout_free(l);
}
END_TEST

/* pointer(i: 4) as P > bitmasked(i: 8) as B > x, a dense y beside. */
START_TEST(sparse_list_tasks) {
  fb_layout *l = fb_layout_new();
  int64_t four = 4, eight = 8, n32 = 32;
  int P = fb_layout_add(l, 0, FB_SN_POINTER, "i", &four, 0, "P");
  int B = fb_layout_add(l, P, FB_SN_BITMASKED, "i", &eight, 0, "B");
  int x = fb_layout_place(l, B, "x", FB_T_I32);
  int d = fb_layout_add(l, 0, FB_SN_DENSE, "i", &n32, 0, NULL);
  int y = fb_layout_place(l, d, "y", FB_T_I32);
  ck_assert_int_eq(fb_layout_finalize(l, NULL, 0), 0);
  fb_kernel *k = fb_kernel_new(l, "k", 0, NULL, FB_T_VOID);
  fb_builder b;
  fb_builder_init(&b, k);
  /* x[i] = i + 5 for i % 3 == 0 (parallel), then two struct-fors */
  int lo = fb_b_const_i32(&b, 0), hi = fb_b_const_i32(&b, 32);
  int pf = fb_b_range_for(&b, lo, hi, 1);
  int sv = fb_b_enter(&b, k->stmts[pf].body);
  int i = fb_b_loop_index(&b, pf, 0);
  int c = fb_b_binary(&b, FB_OP_EQ, fb_b_binary(&b, FB_OP_REM, i, fb_b_const_i32(&b, 3)),
                      fb_b_const_i32(&b, 0));
  int iff = fb_b_if(&b, c, 0);
  int sv2 = fb_b_enter(&b, k->stmts[iff].body);
  fb_b_store(&b, x, &i, 1, fb_b_binary(&b, FB_OP_ADD, i, fb_b_const_i32(&b, 5)));
  fb_b_leave(&b, sv2);
  fb_b_leave(&b, sv);
  int sf = fb_b_struct_for(&b, x); /* y[i] = x[i] * 2 */
  sv = fb_b_enter(&b, k->stmts[sf].body);
  i = fb_b_loop_index(&b, sf, 0);
  fb_b_store(&b, y, &i, 1,
             fb_b_binary(&b, FB_OP_MUL, fb_b_load(&b, x, &i, 1), fb_b_const_i32(&b, 2)));
  fb_b_leave(&b, sv);
  int sp = fb_b_struct_for(&b, P); /* deactivate the odd blocks */
  sv = fb_b_enter(&b, k->stmts[sp].body);
  int I = fb_b_loop_index(&b, sp, 0);
  int odd = fb_b_binary(&b, FB_OP_EQ, fb_b_binary(&b, FB_OP_REM, I, fb_b_const_i32(&b, 2)),
                        fb_b_const_i32(&b, 1));
  iff = fb_b_if(&b, odd, 0);
  sv2 = fb_b_enter(&b, k->stmts[iff].body);
  fb_b_global(&b, FB_OP_DEACTIVATE, P, &I, 1, -1);
  fb_b_leave(&b, sv2);
  fb_b_leave(&b, sv);
  fb_task_list tl;
  char err[128];
  ck_assert_int_eq(fb_lower(k, &tl, err, sizeof err), 0);
  static const fb_task_kind want[] = {
      FB_TASK_RANGE_FOR,  FB_TASK_CLEAR_LIST, FB_TASK_LISTGEN, FB_TASK_CLEAR_LIST, FB_TASK_LISTGEN,
      FB_TASK_STRUCT_FOR, FB_TASK_CLEAR_LIST, FB_TASK_LISTGEN, FB_TASK_STRUCT_FOR, FB_TASK_GC};
  static const int on[] = {-1, 1, 1, 2, 2, 3, 1, 1, 1, 1}; /* SNode: P = 1, B = 2, x = 3 */
  ck_assert_int_eq(tl.n, 10);
  ck_assert_int_eq(P, 1);
  ck_assert_int_eq(B, 2);
  ck_assert_int_eq(x, 3);
  for (int t = 0; t < tl.n; t++) {
    const fb_task *tk = &tl.v[t];
    ck_assert_msg(tk->kind == want[t], "task %d is %s", t, fb_task_kind_name(tk->kind));
    ck_assert_int_eq(tk->snode, on[t]);
    char name[16];
    snprintf(name, sizeof name, "k.t%d", t);
    ck_assert_str_eq(tk->ir->name, name);
    fb_diags dg;
    fb_diags_init(&dg);
    ck_assert_int_eq(fb_verify(tk->ir, &dg), 0);
    fb_diags_free(&dg);
    if (tk->kind == FB_TASK_LISTGEN) { /* a parallel task: its loop is the listgen */
      ck_assert_int_ge(tk->loop, 0);
      ck_assert_int_eq(tk->ir->stmts[tk->loop].op, FB_OP_LISTGEN);
      ck_assert_int_eq(tk->ir->stmts[tk->loop].snode, tk->snode);
    } else if (tk->kind == FB_TASK_CLEAR_LIST || tk->kind == FB_TASK_GC) {
      ck_assert_int_eq(tk->loop, -1);
      ck_assert_int_eq(tk->ir->blocks[0].n, 1);
    }
  }
  ck_assert_str_eq(fb_task_kind_name(FB_TASK_LISTGEN), "listgen");
  fb_task_list_free(&tl);
  run_both(l, k, NULL, 0, y); /* list tasks are no-ops in the interpreter */
  run_both(l, k, NULL, 0, x);
  fb_kernel_free(k);
  fb_layout_free(l);
}
END_TEST

int main(void) {
  Suite *s = suite_create("lower");
  TCase *tc = tcase_create("lower");
  tcase_add_test(tc, two_loops_two_tasks);
  tcase_add_test(tc, serial_value_spilled_to_gtmp);
  tcase_add_test(tc, shared_local_variable);
  tcase_add_test(tc, struct_for_task);
  tcase_add_test(tc, empty_and_pure_kernels);
  tcase_add_test(tc, sparse_list_tasks);
  suite_add_tcase(s, tc);
  return fbt_run(s);
}
