/* The optimizer's infrastructure: task metadata derived from IR (states,
 * modes, element-wise classes, activation classes, covers), the IR bank
 * (dedup by structure, references, eviction, memo), the SFG (edges of each
 * kind, owners and readers, rebuild invariance, the invariant checker,
 * partial GC across flushes, DOT), and the API's refusals. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fusebox/ir.h"
#include "optimizer/sfg.h"
#include "support.h"

static const char *const layout_text =
    "layout {\n"
    "  dense(i: 64) {\n    place x: i32\n    place y: i32\n    place idx: i32\n  }\n"
    "  pointer(i: 8) as blocks {\n    dense(i: 8) {\n      place s: f32\n      place t: f32\n    "
    "}\n  }\n"
    "  pointer(i: 4) as up {\n    bitmasked(i: 4) as mid {\n      place u: f32\n    }\n  }\n"
    "  dense(i: 4) {\n    dynamic(j: 16, chunk: 4) as lists {\n      place d: i32\n    }\n  }\n"
    "  place total: i32\n"
    "}\n";

typedef struct mod {
  fb_layout *l;
  fb_kernel **ks;
  int nk;
} mod;

static mod parse(const char *kernels) {
  size_t n = strlen(layout_text) + strlen(kernels) + 2;
  char *text = malloc(n);
  snprintf(text, n, "%s\n%s", layout_text, kernels);
  mod m = {0};
  fb_diags d;
  fb_diags_init(&d);
  int rc = fb_ir_parse(text, &m.l, &m.ks, &m.nk, &d);
  if (rc) ck_abort_msg("parse: %s", fb_diags_join(&d));
  fb_diags_free(&d);
  free(text);
  return m;
}

static void mod_free(mod *m) {
  for (int i = 0; i < m->nk; i++) fb_kernel_free(m->ks[i]);
  free(m->ks);
  fb_layout_free(m->l);
}

static fb_task_meta *meta_of(const fb_kernel *k) {
  fb_task_meta *m = NULL;
  char err[160];
  ck_assert_msg(fb_meta_compute(k, &m, err, sizeof err) == 0, "%s", err);
  return m;
}

static const fb_meta_acc *acc(const fb_task_meta *m, int kind, const fb_layout *l,
                              const char *name) {
  int s = fb_layout_find(l, name);
  ck_assert_int_ge(s, 0);
  return fb_meta_find(m, FB_SKEY(kind, s));
}

/* ---------------------------------------------------------------- metadata */

START_TEST(meta_dense_loop) {
  mod m = parse("kernel k(i32) {\n  %0 = const.i32 0\n  %1 = arg.i32 0\n"
                "  par_for %2 in %0 .. %1 {\n    %3 = loop_index.i32 %2, 0\n"
                "    %4 = load.i32 x[%3]\n    store y[%3], %4\n    %6 = const.i32 1\n"
                "    %7 = add.i32 %3, %6\n    %8 = load.i32 x[%7]\n"
                "    %9 = atomic_add.i32 total[], %8\n  }\n}\n");
  fb_task_meta *t = meta_of(m.ks[0]);
  ck_assert_int_eq(t->kind, FB_TASK_RANGE_FOR);
  ck_assert_int_ge(t->loop, 0);
  ck_assert(t->tflags & FB_TF_FUSIBLE);
  const fb_meta_acc *x = acc(t, FB_SK_VALUE, m.l, "x"), *y = acc(t, FB_SK_VALUE, m.l, "y");
  const fb_meta_acc *tot = acc(t, FB_SK_VALUE, m.l, "total");
  ck_assert(x && y && tot);
  ck_assert_int_eq(x->mode, FB_ACC_READ);
  ck_assert_int_eq(x->ew, FB_EW_NONE); /* x[i] and x[i + 1] */
  ck_assert_int_eq(y->mode, FB_ACC_WRITE);
  ck_assert_int_eq(y->ew, FB_EW_LOOP);
  ck_assert(y->flags & FB_AF_COVER);
  ck_assert(y->flags & FB_AF_FULL_IFRANGE); /* the range is an argument */
  ck_assert_int_eq(y->ext, 64);
  ck_assert(y->flags & FB_AF_WLOOP);
  ck_assert(y->flags & FB_AF_REMOVABLE);
  ck_assert(!(y->flags & FB_AF_FULL));
  ck_assert_int_eq(tot->mode, FB_ACC_READ | FB_ACC_WRITE);
  ck_assert_int_eq(tot->ew, FB_EW_NONE);
  ck_assert(!(t->tflags & FB_TF_INB)); /* x[i + 1] */
  ck_assert_int_eq(t->nact, 0);
  fb_meta_free(t);
  mod_free(&m);
}
END_TEST

START_TEST(meta_sparse) {
  mod m = parse("kernel self() {\n  struct_for %0 over s {\n    %1 = loop_index.i32 %0, 0\n"
                "    %2 = load.f32 s[%1]\n    store t[%1], %2\n    %4 = const.i32 2\n"
                "    %5 = floordiv.i32 %1, %4\n    store s[%5], %2\n    %7 = load.i32 idx[%1]\n"
                "    store t[%7], %2\n  }\n}\n"
                "kernel deact() {\n  struct_for %0 over s {\n    %1 = loop_index.i32 %0, 0\n"
                "    %2 = const.f32 1.0\n    store t[%1], %2\n    %4 = const.i32 8\n"
                "    %5 = floordiv.i32 %1, %4\n    deactivate blocks[%5]\n  }\n}\n");
  fb_task_meta *t = meta_of(m.ks[0]);
  int blocks = fb_layout_find(m.l, "blocks"), s = fb_layout_find(m.l, "s");
  ck_assert_int_eq(t->kind, FB_TASK_STRUCT_FOR);
  ck_assert_int_eq(t->snode, s);
  ck_assert_int_eq(t->iter, m.l->nodes[s].parent);
  ck_assert_uint_eq(t->list_key, FB_SKEY(FB_SK_LIST, blocks));
  const fb_meta_acc *list = fb_meta_find(t, FB_SKEY(FB_SK_LIST, blocks));
  const fb_meta_acc *mask = fb_meta_find(t, FB_SKEY(FB_SK_MASK, blocks));
  const fb_meta_acc *alloc = fb_meta_find(t, FB_SKEY(FB_SK_ALLOC, blocks));
  ck_assert(list && mask && alloc);
  ck_assert_int_eq(list->mode, FB_ACC_READ);
  ck_assert_int_eq(mask->mode, FB_ACC_READ | FB_ACC_WRITE);
  ck_assert(mask->flags & FB_AF_IMPLICIT);
  ck_assert(mask->flags & FB_AF_ACTIVATES);
  ck_assert(!(mask->flags & FB_AF_CLEAR));
  ck_assert(alloc->flags & FB_AF_IMPLICIT);
  ck_assert(!(acc(t, FB_SK_VALUE, m.l, "t")->flags & FB_AF_REMOVABLE)); /* activates */
  ck_assert_int_eq(t->nact, 3);
  ck_assert_int_eq(t->act_kind[0], FB_ACT_SELF);  /* t[i]: same cells as the loop */
  ck_assert_int_eq(t->act_kind[1], FB_ACT_PURE);  /* s[i // 2] */
  ck_assert_int_eq(t->act_kind[2], FB_ACT_OTHER); /* t[idx[i]] */
  fb_meta_free(t);

  t = meta_of(m.ks[1]);
  ck_assert(t->tflags & FB_TF_DEACT);
  mask = fb_meta_find(t, FB_SKEY(FB_SK_MASK, blocks));
  ck_assert(mask && (mask->flags & FB_AF_CLEAR) && !(mask->flags & FB_AF_IMPLICIT));
  ck_assert(acc(t, FB_SK_VALUE, m.l, "s")->flags & FB_AF_CLEAR); /* values below are cleared */
  ck_assert_int_eq(acc(t, FB_SK_VALUE, m.l, "s")->mode, FB_ACC_READ | FB_ACC_WRITE);
  ck_assert(fb_meta_find(t, FB_SKEY(FB_SK_ALLOC, blocks))->flags & FB_AF_CLEAR);
  ck_assert_int_eq(t->nact, 1);
  ck_assert_int_eq(t->act_kind[0], FB_ACT_OTHER); /* deactivation spoils the proof */
  fb_meta_free(t);
  mod_free(&m);
}
END_TEST

START_TEST(meta_nested_and_lists) {
  mod m =
      parse("kernel nest() {\n  %0 = const.i32 0\n  %1 = const.i32 16\n"
            "  par_for %2 in %0 .. %1 {\n    %3 = loop_index.i32 %2, 0\n    %4 = const.f32 2.0\n"
            "    store u[%3], %4\n    %6 = is_active.bool mid[%3]\n    if %6 {\n"
            "      store x[%3], %3\n    }\n  }\n}\n"
            "kernel lg() {\n  listgen mid[]\n}\n"
            "kernel cl() {\n  clear_list mid[]\n}\n"
            "kernel gc() {\n  gc up[]\n}\n"
            "kernel dyn() {\n  %0 = const.i32 1\n  %1 = const.i32 7\n"
            "  %2 = append.i32 d[%0], %1\n  %3 = length.i32 d[%0]\n}\n"
            "kernel unused() {\n  %0 = const.i32 1\n  %1 = is_active.bool up[%0]\n}\n");
  int up = fb_layout_find(m.l, "up"), mid = fb_layout_find(m.l, "mid"),
      lists = fb_layout_find(m.l, "lists");
  fb_task_meta *t = meta_of(m.ks[0]);
  const fb_meta_acc *mu = fb_meta_find(t, FB_SKEY(FB_SK_MASK, up));
  const fb_meta_acc *mm = fb_meta_find(t, FB_SKEY(FB_SK_MASK, mid));
  ck_assert(mu && mm);
  ck_assert_int_eq(mm->mode, FB_ACC_READ | FB_ACC_WRITE);
  ck_assert(!(mm->flags & FB_AF_IMPLICIT)); /* the if reads is_active's answer */
  ck_assert(!(mu->flags & FB_AF_IMPLICIT)); /* ... which depends on mask(up) too */
  ck_assert(fb_meta_find(t, FB_SKEY(FB_SK_ALLOC, up)) != NULL);
  ck_assert(fb_meta_find(t, FB_SKEY(FB_SK_ALLOC, mid)) == NULL); /* bitmasked allocates nothing */
  ck_assert_int_eq(t->nact, 1);
  ck_assert_int_eq(t->act_kind[0], FB_ACT_PURE);
  ck_assert(t->tflags & FB_TF_INB);
  fb_meta_free(t);

  t = meta_of(m.ks[1]);
  ck_assert_int_eq(t->kind, FB_TASK_LISTGEN);
  ck_assert_int_eq(t->snode, mid);
  ck_assert_int_eq(fb_meta_find(t, FB_SKEY(FB_SK_LIST, up))->mode, FB_ACC_READ);
  ck_assert_int_eq(fb_meta_find(t, FB_SKEY(FB_SK_MASK, mid))->mode, FB_ACC_READ);
  ck_assert_int_eq(fb_meta_find(t, FB_SKEY(FB_SK_LIST, mid))->mode, FB_ACC_READ | FB_ACC_WRITE);
  fb_meta_free(t);
  t = meta_of(m.ks[2]);
  ck_assert_int_eq(t->kind, FB_TASK_CLEAR_LIST);
  ck_assert(fb_meta_find(t, FB_SKEY(FB_SK_LIST, mid))->flags & FB_AF_FULL);
  fb_meta_free(t);
  t = meta_of(m.ks[3]);
  ck_assert_int_eq(t->kind, FB_TASK_GC);
  ck_assert_int_eq(t->nacc, 1);
  ck_assert_uint_eq(t->acc[0].key, FB_SKEY(FB_SK_ALLOC, up));
  fb_meta_free(t);
  t = meta_of(m.ks[4]);
  ck_assert_int_eq(acc(t, FB_SK_VALUE, m.l, "d")->mode, FB_ACC_READ | FB_ACC_WRITE);
  ck_assert(!(fb_meta_find(t, FB_SKEY(FB_SK_MASK, lists))->flags & FB_AF_IMPLICIT));
  ck_assert(fb_meta_find(t, FB_SKEY(FB_SK_ALLOC, lists)) != NULL);
  ck_assert(!(t->tflags & FB_TF_INB)); /* append may find its list full */
  fb_meta_free(t);
  t = meta_of(m.ks[5]); /* an unused is_active (a demoted activate) only orders */
  ck_assert_int_eq(t->nacc, 1);
  ck_assert_int_eq(t->acc[0].mode, FB_ACC_READ);
  ck_assert(t->acc[0].flags & FB_AF_IMPLICIT);
  fb_meta_free(t);
  mod_free(&m);
}
END_TEST

START_TEST(meta_scratch_ret_unique) {
  mod m =
      parse("kernel sc() -> i32 {\n  %0 = const.i32 5\n  gtmp_store %0, 16\n"
            "  %2 = gtmp_load.i32 8\n  ret %2, 0\n}\n"
            "kernel uq() {\n  %0 = const.i32 0\n  %1 = const.i32 64\n"
            "  par_for %2 in %0 .. %1 {\n    %3 = loop_index.i32 %2, 0\n    %4 = load.i32 idx[%3]\n"
            "    %5 = assume_unique.i32 %4 covers x\n    %6 = load.i32 x[%5]\n"
            "    store y[%5], %6\n  }\n}\n"
            "kernel two() {\n  %0 = const.i32 0\n  %1 = const.i32 4\n"
            "  par_for %2 in %0 .. %1 {\n  }\n  par_for %3 in %0 .. %1 {\n  }\n}\n");
  fb_task_meta *t = meta_of(m.ks[0]);
  const fb_meta_acc *w = fb_meta_find(t, FB_SKEY(FB_SK_GTMP, 2));
  const fb_meta_acc *r = fb_meta_find(t, FB_SKEY(FB_SK_GTMP, 1));
  ck_assert(w && r);
  ck_assert_int_eq(w->mode, FB_ACC_WRITE);
  ck_assert((w->flags & (FB_AF_COVER | FB_AF_FULL | FB_AF_REMOVABLE)) ==
            (FB_AF_COVER | FB_AF_FULL | FB_AF_REMOVABLE));
  ck_assert_int_eq(r->mode, FB_ACC_READ);
  ck_assert_int_eq(fb_meta_find(t, FB_SKEY(FB_SK_RET, 0))->mode, FB_ACC_WRITE);
  ck_assert(t->tflags & FB_TF_RET);
  fb_meta_free(t);

  t = meta_of(m.ks[1]);
  const fb_meta_acc *x = acc(t, FB_SK_VALUE, m.l, "x"), *y = acc(t, FB_SK_VALUE, m.l, "y");
  ck_assert_int_eq(x->ew, FB_EW_UNIQUE);
  ck_assert_int_eq(y->ew, FB_EW_UNIQUE);
  ck_assert(x->sig != 0 && x->sig == y->sig);
  ck_assert(!(y->flags & FB_AF_WLOOP));
  ck_assert_int_eq(t->nudeps, 1);
  ck_assert_uint_eq(t->udeps[0], FB_SKEY(FB_SK_VALUE, fb_layout_find(m.l, "idx")));
  fb_meta_free(t);

  fb_task_meta *bad = NULL;
  char err[160];
  ck_assert_int_eq(fb_meta_compute(m.ks[2], &bad, err, sizeof err), FB_EINVAL);
  ck_assert_ptr_null(bad);
  ck_assert_msg(strstr(err, "more than one parallel loop") && strstr(err, "internal error"), "%s", err);
  mod_free(&m);
}
END_TEST

START_TEST(eval_int) {
  mod m = parse("kernel e(i32) {\n  %0 = const.i32 -7\n  %1 = const.i32 2\n"
                "  %2 = floordiv.i32 %0, %1\n  %3 = floormod.i32 %0, %1\n  %4 = div.i32 %0, %1\n"
                "  %5 = rem.i32 %0, %1\n  %6 = arg.i32 0\n  %7 = mul.i32 %6, %1\n"
                "  %8 = const.i32 0\n  %9 = div.i32 %0, %8\n  %10 = shl.i32 %1, %6\n"
                "  store total[], %2\n}\n");
  const fb_kernel *k = m.ks[0];
  uint64_t a = (uint64_t)(int64_t)-3;
  int64_t v = 0;
  ck_assert_int_eq(fb_eval_int(k, 2, &a, 1, &v), 0);
  ck_assert_int_eq(v, -4);
  ck_assert_int_eq(fb_eval_int(k, 3, &a, 1, &v), 0);
  ck_assert_int_eq(v, 1);
  ck_assert_int_eq(fb_eval_int(k, 4, &a, 1, &v), 0);
  ck_assert_int_eq(v, -3);
  ck_assert_int_eq(fb_eval_int(k, 5, &a, 1, &v), 0);
  ck_assert_int_eq(v, -1);
  ck_assert_int_eq(fb_eval_int(k, 7, &a, 1, &v), 0);
  ck_assert_int_eq(v, -6);
  ck_assert_int_eq(fb_eval_int(k, 9, &a, 1, &v), 0);
  ck_assert_int_eq(v, 0); /* division by zero gives 0 */
  ck_assert_int_eq(fb_eval_int(k, 10, &a, 1, &v), 0);
  ck_assert_int_eq(v, 2 << 29); /* the count is taken mod 32: -3 -> 29 */
  ck_assert_int_eq(fb_eval_int(k, 7, NULL, 0, &v), -1); /* needs the argument */
  mod_free(&m);
}
END_TEST

/* ---------------------------------------------------------------- the graph */

static const char *const graph_kernels =
    "kernel w() {\n  %0 = const.i32 0\n  %1 = const.i32 64\n  par_for %2 in %0 .. %1 {\n"
    "    %3 = loop_index.i32 %2, 0\n    %4 = load.i32 x[%3]\n    store y[%3], %4\n  }\n}\n"
    "kernel r1() {\n  %0 = const.i32 0\n  %1 = const.i32 64\n  par_for %2 in %0 .. %1 {\n"
    "    %3 = loop_index.i32 %2, 0\n    %4 = load.i32 y[%3]\n    store x[%3], %4\n  }\n}\n"
    "kernel r2() {\n  %0 = const.i32 0\n  %1 = const.i32 64\n  par_for %2 in %0 .. %1 {\n"
    "    %3 = loop_index.i32 %2, 0\n    %4 = load.i32 y[%3]\n    store idx[%3], %4\n  }\n}\n"
    "kernel w2() {\n  %0 = const.i32 0\n  %1 = const.i32 64\n  par_for %2 in %0 .. %1 {\n"
    "    %3 = loop_index.i32 %2, 0\n    %4 = load.i32 x[%3]\n    %5 = const.i32 1\n"
    "    %6 = add.i32 %4, %5\n    store y[%3], %6\n  }\n}\n";

static fb_opt *graph_opt(mod *m, fb_irh *h, const int *seq, int n) {
  fb_opt_options o;
  fb_opt_options_default(&o);
  o.passes = 0;
  o.check = 1;
  fb_opt *opt = fb_opt_new(m->l, &o);
  ck_assert_ptr_nonnull(opt);
  for (int i = 0; i < m->nk; i++) ck_assert_int_eq(fb_opt_intern(opt, m->ks[i], &h[i]), 0);
  for (int i = 0; i < n; i++) {
    fb_opt_task t = {h[seq[i]], NULL, 0, (uint64_t)i};
    ck_assert_int_eq(fb_opt_insert(opt, &t), 0);
  }
  return opt;
}

START_TEST(sfg_edges) {
  mod m = parse(graph_kernels);
  fb_irh h[4];
  int seq[] = {0, 1, 2, 3};
  fb_opt *o = graph_opt(&m, h, seq, 4);
  char *text = fb_opt_graph_text(o);
  const char *want = "t0 range_for w launch 0\n"
                     "t1 range_for r1 launch 1\n"
                     "  <- t0 x war\n"
                     "  <- t0 y flow\n"
                     "t2 range_for r2 launch 2\n"
                     "  <- t0 y flow\n"
                     "t3 range_for w2 launch 3\n"
                     "  <- t0 y waw\n"
                     "  <- t1 x flow\n"
                     "  <- t1 y war\n"
                     "  <- t2 y war\n";
  ck_assert_str_eq(text, want);
  free(text);
  fb_sfg *g = fb_opt_graph(o);
  int y = fb_sfg_state_id(g, FB_SKEY(FB_SK_VALUE, fb_layout_find(m.l, "y")));
  ck_assert_int_eq(g->st[y].owner, 3);
  ck_assert_int_eq(g->st[y].nreaders, 0);
  int x = fb_sfg_state_id(g, FB_SKEY(FB_SK_VALUE, fb_layout_find(m.l, "x")));
  ck_assert_int_eq(g->st[x].owner, 1);
  ck_assert_int_eq(g->st[x].nreaders, 1); /* w2 */
  ck_assert_int_eq(g->st[x].readers[0], 3);
  char err[200];
  ck_assert_msg(fb_opt_check(o, err, sizeof err) == 0, "%s", err);
  /* the checker notices a wrong version and a lost edge */
  fb_sfg_node *n2 = g->nodes[2];
  n2->ver[0] += 99;
  ck_assert_int_eq(fb_opt_check(o, err, sizeof err), FB_EINTERNAL);
  ck_assert_ptr_nonnull(strstr(err, "version"));
  n2->ver[0] -= 99;
  ck_assert_int_eq(fb_opt_check(o, err, sizeof err), 0);
  g->nodes[3]->nin--;
  ck_assert_int_eq(fb_opt_check(o, err, sizeof err), FB_EINTERNAL);
  g->nodes[3]->nin++;
  ck_assert_int_eq(fb_opt_check(o, err, sizeof err), 0);
  for (int i = 0; i < 4; i++) fb_opt_release(o, h[i]);
  fb_opt_free(o);
  mod_free(&m);
}
END_TEST

/* The graph's edges as "src->dst state kind" over kernel names, sorted. */
static char *edge_set(fb_opt *o) {
  fb_sfg *g = fb_opt_graph(o);
  char **v = NULL;
  int n = 0;
  for (int i = 0; i < g->n; i++)
    for (int e = 0; e < g->nodes[i]->nin; e++) {
      const fb_sfg_edge *ed = &g->nodes[i]->in[e];
      char st[64], line[256];
      fb_sfg_state_name(g->l, g->st[ed->state].key, st, sizeof st);
      snprintf(line, sizeof line, "%s->%s %s %d", fb_opt_ir(o, g->nodes[ed->node]->ir)->name,
               fb_opt_ir(o, g->nodes[i]->ir)->name, st, ed->kind);
      v = realloc(v, sizeof *v * (size_t)(n + 1));
      v[n++] = strdup(line);
    }
  for (int i = 0; i < n; i++) /* insertion sort: a handful of edges */
    for (int j = i; j > 0 && strcmp(v[j - 1], v[j]) > 0; j--) {
      char *t = v[j];
      v[j] = v[j - 1];
      v[j - 1] = t;
    }
  size_t len = 1;
  for (int i = 0; i < n; i++) len += strlen(v[i]) + 1;
  char *s = calloc(len, 1);
  for (int i = 0; i < n; i++) {
    strcat(s, v[i]);
    strcat(s, "\n");
    free(v[i]);
  }
  free(v);
  return s;
}

START_TEST(sfg_reconstruction_invariance) {
  mod m = parse(graph_kernels);
  fb_irh h[4], h2[4];
  int seq[] = {0, 1, 2, 3}, other[] = {0, 2, 1, 3}; /* r1 and r2 are independent */
  fb_opt *a = graph_opt(&m, h, seq, 4), *b = graph_opt(&m, h2, other, 4);
  char *ea = edge_set(a), *eb = edge_set(b);
  ck_assert_str_eq(ea, eb);
  ck_assert_ptr_nonnull(strstr(ea, "r1->w2 y 2")); /* war */
  /* rebuilding in place gives the same graph too */
  ck_assert_int_eq(fb_sfg_rebuild(fb_opt_graph(a), fb_opt_bank(a), NULL, 0), 0);
  char *ea2 = edge_set(a);
  ck_assert_str_eq(ea, ea2);
  free(ea);
  free(eb);
  free(ea2);
  for (int i = 0; i < 4; i++) {
    fb_opt_release(a, h[i]);
    fb_opt_release(b, h2[i]);
  }
  fb_opt_free(a);
  fb_opt_free(b);
  mod_free(&m);
}
END_TEST

START_TEST(sfg_partial_gc) {
  mod m = parse(graph_kernels);
  fb_irh h[4];
  int seq[] = {0, 1, 2, 3};
  fb_opt *o = graph_opt(&m, h, seq, 4);
  fb_opt_batch *b = NULL;
  ck_assert_int_eq(fb_opt_flush(o, &b), 0);
  ck_assert_int_eq(b->n, 4);
  for (int i = 0; i < 4; i++) ck_assert_int_eq(b->v[i].launch, (uint64_t)i);
  fb_opt_batch_free(o, b);
  fb_sfg *g = fb_opt_graph(o);
  /* latest owners: x by r1, idx by r2, y by w2; w owns nothing any more */
  ck_assert_int_eq(g->nret, 3);
  ck_assert_int_eq(g->n, 3);
  ck_assert_int_eq(fb_opt_pending(o), 0);
  fb_opt_task t = {h[1], NULL, 0, 9};
  ck_assert_int_eq(fb_opt_insert(o, &t), 0);
  char *text = fb_opt_graph_text(o);
  ck_assert_str_eq(text, "r0 range_for r1 launch 1\nr1 range_for r2 launch 2\n"
                         "r2 range_for w2 launch 3\nt3 range_for r1 launch 9\n"
                         "  <- r0 x waw\n  <- r2 y flow\n");
  free(text);
  char err[200];
  ck_assert_msg(fb_opt_check(o, err, sizeof err) == 0, "%s", err);
  char *dot = fb_opt_dot(o, "test");
  ck_assert_ptr_nonnull(strstr(dot, "digraph sfg"));
  ck_assert_ptr_nonnull(strstr(dot, "n2 -> n3 [label=\"y\""));
  ck_assert_ptr_nonnull(strstr(dot, "style=dashed"));
  free(dot);
  for (int i = 0; i < 4; i++) fb_opt_release(o, h[i]);
  fb_opt_free(o);
  mod_free(&m);
}
END_TEST

/* ---------------------------------------------------------------- the bank */

START_TEST(bank_dedup_and_eviction) {
  mod m = parse("kernel a() {\n  %0 = const.i32 1\n  store total[], %0\n}\n"
                "kernel renamed() {\n  %5 = const.i32 1\n  %6: store total[], %5\n}\n"
                "kernel c() {\n  %0 = const.i32 2\n  store total[], %0\n}\n");
  fb_opt_options opts;
  fb_opt_options_default(&opts);
  opts.bank_bytes = 1; /* evict whatever nobody holds */
  fb_opt *o = fb_opt_new(m.l, &opts);
  fb_irh a, r, c;
  ck_assert_int_eq(fb_opt_intern(o, m.ks[0], &a), 0);
  ck_assert_int_eq(fb_opt_intern(o, m.ks[1], &r), 0);
  ck_assert_int_eq(a, r); /* equal structure, other name and ids */
  ck_assert_int_eq(fb_opt_intern(o, m.ks[2], &c), 0);
  ck_assert_int_ne(a, c);
  ck_assert(fb_kernel_equal(fb_opt_ir(o, a), m.ks[0]));
  fb_bank *bank = fb_opt_bank(o);
  int64_t key[2] = {FB_MEMO_SIMPLIFY, a};
  ck_assert_int_eq(fb_bank_memo_put(bank, key, 2, c), 0);
  fb_irh got = fb_bank_memo_get(bank, key, 2);
  ck_assert_int_eq(got, c);
  fb_opt_release(o, got);
  fb_opt_release(o, a);
  fb_opt_release(o, a); /* both references gone: a may be evicted */
  fb_opt_release(o, c);
  ck_assert_ptr_nonnull(fb_opt_ir(o, c)); /* cached until the bound needs room */
  fb_irh again;
  ck_assert_int_eq(fb_opt_intern(o, m.ks[2], &again), 0); /* a hit: no eviction needed */
  ck_assert_int_eq(again, c);
  fb_opt_release(o, again);
  mod n = parse("kernel d() {\n  %0 = const.i32 3\n  store total[], %0\n}\n");
  fb_irh d;
  ck_assert_int_eq(fb_opt_intern(o, n.ks[0], &d), 0); /* over the bound: a and c go */
  ck_assert_ptr_null(fb_opt_ir(o, a));
  ck_assert_ptr_null(fb_opt_ir(o, c));
  ck_assert_int_eq(fb_bank_memo_get(bank, key, 2), FB_IRH_NONE); /* the memo forgot them */
  ck_assert_uint_ge(fb_opt_get_stats(o)->bank_evictions, 2);
  ck_assert_ptr_nonnull(fb_opt_ir(o, d)); /* held */
  fb_opt_release(o, d);
  fb_opt_free(o);
  mod_free(&n);
  mod_free(&m);
}
END_TEST

/* ---------------------------------------------------------------- refusals */

START_TEST(api_refusals) {
  mod m = parse("kernel ok(i32) {\n  %0 = arg.i32 0\n  store total[], %0\n}\n"
                "kernel two() {\n  %0 = const.i32 0\n  %1 = const.i32 4\n"
                "  par_for %2 in %0 .. %1 {\n  }\n  par_for %3 in %0 .. %1 {\n  }\n}\n"
                "kernel bad() {\n  %0 = const.f32 1.0\n  store total[], %0\n}\n");
  fb_opt *o = fb_opt_new(m.l, NULL);
  fb_irh h;
  ck_assert_int_eq(fb_opt_intern(o, m.ks[2], &h), FB_EVERIFY);
  ck_assert_ptr_nonnull(strstr(fb_opt_errmsg(o), "bad"));
  ck_assert_int_eq(fb_opt_intern(o, m.ks[1], &h), FB_EINVAL);
  ck_assert_msg(strstr(fb_opt_errmsg(o), "more than one parallel loop") &&
                    strstr(fb_opt_errmsg(o), "internal error"),
                "%s", fb_opt_errmsg(o));
  ck_assert_int_eq(h, FB_IRH_NONE);
  ck_assert_int_eq(fb_opt_intern(o, m.ks[0], &h), 0);
  fb_task_kind kind;
  int loop = 0, snode = 0;
  ck_assert_int_eq(fb_opt_ir_info(o, h, &kind, &loop, &snode), 0);
  ck_assert_int_eq(kind, FB_TASK_SERIAL);
  ck_assert_int_eq(loop, -1);
  fb_opt_task t = {h, NULL, 0, 0};
  ck_assert_int_eq(fb_opt_insert(o, &t), FB_ETYPE);
  fb_opt_task bad = {h + 1000, NULL, 0, 0};
  ck_assert_int_eq(fb_opt_insert(o, &bad), FB_EINVAL);
  uint64_t arg = 5;
  fb_opt_task good = {h, &arg, 1, 0};
  ck_assert_int_eq(fb_opt_insert(o, &good), 0);
  ck_assert_int_eq(fb_opt_host_write(o, fb_layout_find(m.l, "x")), FB_EINVAL); /* pending */
  fb_opt_batch *b = NULL;
  ck_assert_int_eq(fb_opt_flush(o, &b), 0);
  ck_assert_int_eq(b->n, 1);
  ck_assert_int_eq(b->v[0].args[0], 5);
  fb_opt_batch_free(o, b);
  ck_assert_int_eq(fb_opt_host_write(o, fb_layout_find(m.l, "x")), 0);
  ck_assert_int_eq(fb_opt_flush(o, &b), 0); /* nothing pending */
  ck_assert_ptr_null(b);
  fb_opt_release(o, h);
  fb_opt_free(o);
  mod_free(&m);
}
END_TEST

/* ---------------------------------------------------------------- fusion on a long chain */

/* fw and bw each read the other's field one cell off and write their own at
 * the loop index: a chain of dependent tasks that never fuse (a solver's
 * sweeps); cz adds y at the index to idx, so it fuses with the bw before
 * it (and with no other: the next bw writes the y it reads). */
static const char *const chain_kernels =
    "kernel fw() {\n  %0 = const.i32 0\n  %1 = const.i32 63\n  par_for %2 in %0 .. %1 {\n"
    "    %3 = loop_index.i32 %2, 0\n    %4 = const.i32 1\n    %5 = add.i32 %3, %4\n"
    "    %6 = load.i32 y[%5]\n    store x[%3], %6\n  }\n}\n"
    "kernel bw() {\n  %0 = const.i32 0\n  %1 = const.i32 63\n  par_for %2 in %0 .. %1 {\n"
    "    %3 = loop_index.i32 %2, 0\n    %4 = const.i32 1\n    %5 = add.i32 %3, %4\n"
    "    %6 = load.i32 x[%5]\n    store y[%3], %6\n  }\n}\n"
    "kernel cz() {\n  %0 = const.i32 0\n  %1 = const.i32 63\n  par_for %2 in %0 .. %1 {\n"
    "    %3 = loop_index.i32 %2, 0\n    %4 = load.i32 y[%3]\n"
    "    %5 = atomic_add.i32 idx[%3], %4\n  }\n}\n";

/* Fusion tests only the pairs no longer path joins: on a window of K
 * periods (fw bw cz) that is about one pair per task, where testing every
 * later task was K * 3 * (K * 3 - 1) / 2 pairs a round (the most of a long
 * window's flush: MGPCG's two-iteration window took 22 ms, 2.9 ms after).
 * The fusions are the same: every bw with its cz, nothing else. */
static fb_opt *plan_opt(mod *m, fb_irh *h, int memo, int check);

START_TEST(fuse_tests_only_unjoined_pairs) {
  enum {
    K = 300
  };
  mod m = parse(chain_kernels);
  fb_irh h[3];
  fb_opt *o = plan_opt(&m, h, 0, 1); /* check mode: the SFG checker after each pass */
  uint64_t launch = 0;
  for (int k = 0; k < K; k++)
    for (int t = 0; t < 3; t++) {
      fb_opt_task ot = {h[t], NULL, 0, launch++};
      ck_assert_msg(fb_opt_insert(o, &ot) == 0, "%s", fb_opt_errmsg(o));
    }
  fb_opt_batch *b = NULL;
  ck_assert_msg(fb_opt_flush(o, &b) == 0, "%s", fb_opt_errmsg(o));
  const fb_opt_counters *c = &fb_opt_get_stats(o)->flush;
  ck_assert_uint_eq(c->tasks_fused, K);
  ck_assert_int_eq(b->n, 2 * K);
  for (int i = 0; i < b->n; i++) { /* fw, then bw+cz, in launch order */
    ck_assert_int_eq(b->v[i].ntasks, i % 2 ? 2 : 1);
    ck_assert_uint_eq(b->v[i].launch, (uint64_t)(i / 2) * 3 + (i % 2));
  }
  ck_assert_uint_gt(c->fuse_pairs, 0);
  ck_assert_uint_le(c->fuse_pairs, 2 * 3 * K);
  fb_opt_batch_free(o, b);
  for (int i = 0; i < 3; i++) fb_opt_release(o, h[i]);
  fb_opt_free(o);
  mod_free(&m);
}
END_TEST

/* ---------------------------------------------------------------- the plan memo */

/* A sparse stream: clear_list / listgen / struct_for triples over blocks,
 * an activating write of t at the loop cells, a dense increment with an
 * argument, a reduction. Demotion, list-generation removal, DSE and fusion
 * all fire on it from the second window on. */
static const char *const plan_kernels =
    "kernel cl() {\n  clear_list blocks[]\n}\n"
    "kernel lg() {\n  listgen blocks[]\n}\n"
    "kernel sf() {\n  struct_for %0 over s {\n    %1 = loop_index.i32 %0, 0\n"
    "    %2 = load.f32 s[%1]\n    %3 = const.f32 2.0\n    %4 = mul.f32 %2, %3\n"
    "    store t[%1], %4\n  }\n}\n"
    "kernel inc(i32) {\n  %0 = const.i32 0\n  %1 = const.i32 64\n  par_for %2 in %0 .. %1 {\n"
    "    %3 = loop_index.i32 %2, 0\n    %4 = arg.i32 0\n    %5 = atomic_add.i32 x[%3], %4\n  }\n}\n"
    "kernel cp() {\n  %0 = const.i32 0\n  %1 = const.i32 64\n  par_for %2 in %0 .. %1 {\n"
    "    %3 = loop_index.i32 %2, 0\n    %4 = load.i32 x[%3]\n    store y[%3], %4\n  }\n}\n"
    "kernel sum() {\n  %0 = const.i32 0\n  %1 = const.i32 64\n  par_for %2 in %0 .. %1 {\n"
    "    %3 = loop_index.i32 %2, 0\n    %4 = load.i32 y[%3]\n    %5 = atomic_add.i32 total[], %4\n "
    " }\n}\n";

static fb_opt *plan_opt(mod *m, fb_irh *h, int memo, int check) {
  fb_opt_options o;
  fb_opt_options_default(&o);
  o.plan_memo = memo;
  o.check = check;
  fb_opt *opt = fb_opt_new(m->l, &o);
  ck_assert_ptr_nonnull(opt);
  for (int i = 0; i < m->nk; i++) ck_assert_int_eq(fb_opt_intern(opt, m->ks[i], &h[i]), 0);
  return opt;
}

/* One window: 2 x (cl lg sf), inc(a) twice, cp, sum. */
static void plan_window(fb_opt *o, const fb_irh *h, uint64_t *launch, uint64_t a) {
  static const int seq[] = {0, 1, 2, 0, 1, 2, 3, 3, 4, 5};
  for (size_t i = 0; i < sizeof seq / sizeof *seq; i++) {
    uint64_t args[1] = {a};
    fb_opt_task t = {h[seq[i]], seq[i] == 3 ? args : NULL, seq[i] == 3 ? 1 : 0, (*launch)++};
    ck_assert_msg(fb_opt_insert(o, &t) == 0, "%s", fb_opt_errmsg(o));
  }
}

/* Two batches hand out the same launches (the IR compared by content: the
 * contexts have banks of their own). */
static void same_batch(const fb_opt_batch *a, const fb_opt_batch *b) {
  ck_assert_int_eq(a->n, b->n);
  for (int i = 0; i < a->n; i++) {
    const fb_opt_launch *x = &a->v[i], *y = &b->v[i];
    ck_assert(fb_kernel_equal(x->k, y->k));
    ck_assert_int_eq(x->kind, y->kind);
    ck_assert_int_eq(x->loop, y->loop);
    ck_assert_int_eq(x->snode, y->snode);
    ck_assert_int_eq(x->nargs, y->nargs);
    ck_assert_int_eq(x->launch, y->launch);
    ck_assert_int_eq(x->ntasks, y->ntasks);
    ck_assert_int_eq(x->nparts, y->nparts);
    if (x->nargs) ck_assert(!memcmp(x->args, y->args, sizeof *x->args * (size_t)x->nargs));
    for (int p = 0; p < x->nparts; p++) {
      ck_assert_int_eq(x->parts[p].launch, y->parts[p].launch);
      ck_assert_int_eq(x->parts[p].argoff, y->parts[p].argoff);
      ck_assert_int_eq(x->parts[p].nargs, y->parts[p].nargs);
      ck_assert_int_eq(x->parts[p].inb, y->parts[p].inb);
      ck_assert_str_eq(x->parts[p].task, y->parts[p].task);
      ck_assert(fb_kernel_equal(x->parts[p].k, y->parts[p].k));
    }
  }
}

/* A repeating window reuses its plan; the batches and the graph kept equal
 * those of a context without the memo, window after window, through a
 * host write (which changes the graph: no reuse until it repeats again), a
 * window with other arguments and an options change (which clears it). In
 * check mode every reuse is also checked against the pipeline. */
START_TEST(plan_memo_reuse) {
  mod m = parse(plan_kernels);
  fb_irh ha[6], hb[6], hc[6];
  fb_opt *a = plan_opt(&m, ha, 1, 0), *b = plan_opt(&m, hb, 0, 0), *c = plan_opt(&m, hc, 1, 1);
  fb_opt *all[3] = {a, b, c};
  fb_irh *hs[3] = {ha, hb, hc};
  uint64_t launch[3] = {0, 0, 0}, reused_before = 0;
  for (int f = 0; f < 14; f++) {
    uint64_t arg = f == 9 ? 5 : 1;
    fb_opt_batch *out[3];
    for (int i = 0; i < 3; i++) {
      if (f == 6) ck_assert_int_eq(fb_opt_host_write(all[i], fb_layout_find(m.l, "s")), 0);
      if (f == 11) fb_opt_set_options(all[i], fb_opt_get_options(all[i]));
      plan_window(all[i], hs[i], &launch[i], arg);
      ck_assert_msg(fb_opt_flush(all[i], &out[i]) == 0, "flush %d: %s", f, fb_opt_errmsg(all[i]));
    }
    same_batch(out[0], out[1]);
    same_batch(out[2], out[1]);
    for (int i = 0; i < 3; i++) fb_opt_batch_free(all[i], out[i]);
    char *ta = fb_opt_graph_text(a), *tb = fb_opt_graph_text(b);
    ck_assert_str_eq(ta, tb);
    free(ta);
    free(tb);
    uint64_t r = fb_opt_get_stats(a)->total.plans_reused;
    ck_assert_uint_eq(fb_opt_get_stats(c)->total.plans_reused, r);
    ck_assert_uint_eq(fb_opt_get_stats(a)->flush.plans_reused, r - reused_before);
    /* windows 0-2 reach the steady graph (the plan is stored at 2), 3-5
       reuse it; the host write at 6 and the new argument at 9 (and its
       graph at 10) change what the flush sees, the options change at 11
       clears the memo, 12-13 reuse the plan stored at 11 */
    if (f >= 3 && f <= 5) ck_assert_uint_eq(r - reused_before, 1);
    if (f == 6 || f == 9 || f == 10 || f == 11) ck_assert_uint_eq(r - reused_before, 0);
    if (f == 12 || f == 13) ck_assert_uint_eq(r - reused_before, 1);
    ck_assert_uint_eq(fb_opt_get_stats(a)->flush.tasks_in, 10);
    ck_assert_uint_eq(fb_opt_get_stats(a)->flush.listgen_removed,
                      fb_opt_get_stats(b)->flush.listgen_removed);
    ck_assert_uint_eq(fb_opt_get_stats(a)->flush.tasks_fused,
                      fb_opt_get_stats(b)->flush.tasks_fused);
    reused_before = r;
  }
  ck_assert_uint_eq(fb_opt_get_stats(b)->total.plans_reused, 0);
  ck_assert_uint_ge(fb_opt_get_stats(a)->total.plans_reused, 5);
  ck_assert_uint_eq(fb_opt_get_stats(a)->total.tasks_out, fb_opt_get_stats(b)->total.tasks_out);
  char err[200];
  ck_assert_msg(fb_opt_check(a, err, sizeof err) == 0, "%s", err);
  for (int i = 0; i < 3; i++) {
    for (int k = 0; k < m.nk; k++) fb_opt_release(all[i], hs[i][k]);
    fb_opt_free(all[i]);
  }
  mod_free(&m);
}
END_TEST

/* Observing the window (its graph text) builds it: the flush then runs
 * the pipeline and reuses nothing, and inserts after it keep their order. */
START_TEST(plan_memo_observed) {
  mod m = parse(plan_kernels);
  fb_irh h[6];
  fb_opt *o = plan_opt(&m, h, 1, 1);
  uint64_t launch = 0;
  for (int f = 0; f < 4; f++) {
    plan_window(o, h, &launch, 1);
    fb_opt_batch *b = NULL;
    ck_assert_int_eq(fb_opt_flush(o, &b), 0);
    fb_opt_batch_free(o, b);
  }
  uint64_t r = fb_opt_get_stats(o)->total.plans_reused;
  ck_assert_uint_ge(r, 1);
  plan_window(o, h, &launch, 1);
  ck_assert_int_eq(fb_opt_pending(o), 10);
  char *text = fb_opt_graph_text(o);
  ck_assert_ptr_nonnull(strstr(text, "t"));
  free(text);
  uint64_t args[1] = {1};
  fb_opt_task t = {h[3], args, 1, launch++};
  ck_assert_int_eq(fb_opt_insert(o, &t), 0);
  ck_assert_int_eq(fb_opt_pending(o), 11);
  fb_opt_batch *b = NULL;
  ck_assert_int_eq(fb_opt_flush(o, &b), 0);
  ck_assert_uint_eq(fb_opt_get_stats(o)->total.plans_reused, r);
  ck_assert_int_eq(fb_opt_pending(o), 0);
  uint64_t last = 0;
  for (int i = 0; i < b->n; i++)
    for (int p = 0; p < b->v[i].nparts; p++)
      if (b->v[i].parts[p].launch > last) last = b->v[i].parts[p].launch;
  ck_assert_uint_eq(last, launch - 1); /* the late insert was handed out */
  fb_opt_batch_free(o, b);
  for (int k = 0; k < m.nk; k++) fb_opt_release(o, h[k]);
  fb_opt_free(o);
  mod_free(&m);
}
END_TEST

/* The engine observed that the mask of blocks did not change between two
 * quiet points (the same count): the next window's listgen reuses the list
 * made in an earlier flush although struct_fors wrote (activating) into
 * blocks since; a changed count, a pending window or a host write keeps
 * the listgen. */
static const char *const observe_kernels =
    "kernel cl() {\n  clear_list blocks[]\n}\n"
    "kernel lg() {\n  listgen blocks[]\n}\n"
    "kernel sf() {\n  struct_for %0 over s {\n    %1 = loop_index.i32 %0, 0\n"
    "    %2 = load.f32 s[%1]\n    store t[%1], %2\n  }\n}\n"
    "kernel wr() {\n  %0 = const.i32 0\n  %1 = const.i32 64\n  par_for %2 in %0 .. %1 {\n"
    "    %3 = loop_index.i32 %2, 0\n    %4 = load.i32 idx[%3]\n    %5 = const.f32 1.0\n"
    "    store t[%4], %5\n  }\n}\n";

START_TEST(observe_keeps_lists) {
  mod m = parse(observe_kernels);
  fb_irh h[4];
  fb_opt *o = plan_opt(&m, h, 1, 1);
  int blocks = fb_layout_find(m.l, "blocks");
  uint64_t launch = 0;
  static const int seq[] = {0, 1, 2, 3}; /* wr: an activating write of blocks
                                           nothing can demote */
  uint64_t removed[8];
  static const uint64_t counts[8] = {5, 5, 5, 6, 6, 6, 6, 6};
  for (int f = 0; f < 8; f++) {
    for (int i = 0; i < 4; i++) {
      fb_opt_task t = {h[seq[i]], NULL, 0, launch++};
      ck_assert_int_eq(fb_opt_insert(o, &t), 0);
    }
    ck_assert_int_eq(fb_opt_observe_mask(o, blocks, counts[f]), FB_EINVAL); /* pending */
    fb_opt_batch *b = NULL;
    ck_assert_msg(fb_opt_flush(o, &b) == 0, "%s", fb_opt_errmsg(o));
    removed[f] = fb_opt_get_stats(o)->flush.listgen_removed;
    /* the first flush's cl clears a list no task filled: removed too */
    ck_assert_uint_eq(fb_opt_get_stats(o)->flush.clears_removed, f == 0);
    ck_assert_int_eq(b->n, removed[f] ? 2 : 4 - (f == 0));
    fb_opt_batch_free(o, b);
    if (f == 5) ck_assert_int_eq(fb_opt_host_write(o, fb_layout_find(m.l, "s")), 0);
    ck_assert_int_eq(fb_opt_observe_mask(o, blocks, counts[f]), 0);
  }
  /* 0: first flush; 1: one observation only; 2-3: unchanged since the one
     before; 4: the count moved at 3; 5: unchanged again; 6: a host write
     at 5; 7: unchanged since 6 */
  static const uint64_t want[8] = {0, 0, 1, 1, 0, 1, 0, 1};
  for (int f = 0; f < 8; f++)
    ck_assert_msg(removed[f] == want[f], "flush %d removed %llu", f,
                  (unsigned long long)removed[f]);
  ck_assert_uint_eq(fb_opt_get_stats(o)->total.masks_unchanged, 5);
  ck_assert_int_eq(fb_opt_observe_mask(o, 0, 1), FB_EINVAL);
  for (int k = 0; k < m.nk; k++) fb_opt_release(o, h[k]);
  fb_opt_free(o);
  mod_free(&m);
}
END_TEST

/* A list made after the mask's last writer stays current across a quiet
 * point whose observation saw the count move (the writer that moved it is
 * the version the list was made from): MLS-MPM's grids are rebuilt every
 * substep, and the first struct_fors after a sync reused no list. Windows:
 * [wr cl lg sf] then [cl lg sf], observed between with a new count each
 * time; the second window's listgen is removed, the first's never is (wr
 * wrote since); a host write of the mask's field keeps it. */
START_TEST(observe_keeps_lists_made_after_the_writer) {
  mod m = parse(observe_kernels);
  fb_irh h[4];
  fb_opt *o = plan_opt(&m, h, 1, 1);
  int blocks = fb_layout_find(m.l, "blocks");
  uint64_t launch = 0;
  static const int with_wr[] = {3, 0, 1, 2}, without[] = {0, 1, 2};
  for (int f = 0; f < 6; f++) {
    const int *seq = f % 2 ? without : with_wr;
    int n = f % 2 ? 3 : 4;
    for (int i = 0; i < n; i++) {
      fb_opt_task t = {h[seq[i]], NULL, 0, launch++};
      ck_assert_int_eq(fb_opt_insert(o, &t), 0);
    }
    fb_opt_batch *b = NULL;
    ck_assert_msg(fb_opt_flush(o, &b) == 0, "%s", fb_opt_errmsg(o));
    uint64_t removed = fb_opt_get_stats(o)->flush.listgen_removed;
    int want = f % 2 == 1 && f != 5; /* 5: a host write before it */
    ck_assert_msg(removed == (uint64_t)want, "flush %d removed %llu", f,
                  (unsigned long long)removed);
    ck_assert_uint_eq(fb_opt_get_stats(o)->flush.clears_removed, f == 0); /* an empty list */
    ck_assert_int_eq(b->n, n - 2 * want - (f == 0));
    fb_opt_batch_free(o, b);
    if (f == 4) ck_assert_int_eq(fb_opt_host_write(o, fb_layout_find(m.l, "t")), 0);
    ck_assert_int_eq(fb_opt_observe_mask(o, blocks, 10 + (uint64_t)f), 0);
  }
  ck_assert_uint_eq(fb_opt_get_stats(o)->total.masks_unchanged, 0);
  for (int k = 0; k < m.nk; k++) fb_opt_release(o, h[k]);
  fb_opt_free(o);
  mod_free(&m);
}
END_TEST

/* A clear_list of a list no task has filled yet is removed (the list is
 * empty: clearing it changes nothing); one of a list a listgen filled, in
 * the same window or an earlier flush, stays, and so does one after
 * fb_opt_forget (the list's version is then the serial of a dropped task,
 * not the session's initial state). Windows, with the plan memo on:
 * [cl lg sf wr cl lg sf] [wr cl lg sf], forget, [cl lg sf] [cl lg sf]. */
START_TEST(clears_of_empty_lists_only) {
  mod m = parse(observe_kernels);
  fb_irh h[4];
  fb_opt *o = plan_opt(&m, h, 1, 1);
  uint64_t launch = 0;
  static const int w0[] = {0, 1, 2, 3, 0, 1, 2}, w1[] = {3, 0, 1, 2}, w2[] = {0, 1, 2};
  static const struct {
    const int *seq;
    int n, forget_before;
    uint64_t clears, listgens;
    int out, cls;
  } win[] = {
      {w0, 7, 0, 1, 0, 6, 1}, /* the first cl goes; the second (after lg) stays */
      {w1, 4, 0, 0, 0, 4, 1}, /* wr changed the mask: lg stays, and its cl */
      {w2, 3, 1, 0, 0, 3, 1}, /* after forget: nothing known, all stay */
      {w2, 3, 0, 0, 1, 1, 0}, /* cl lg go against the last window's lg */
  };
  for (int f = 0; f < 4; f++) {
    if (win[f].forget_before) ck_assert_int_eq(fb_opt_forget(o), 0);
    for (int i = 0; i < win[f].n; i++) {
      fb_opt_task t = {h[win[f].seq[i]], NULL, 0, launch++};
      ck_assert_int_eq(fb_opt_insert(o, &t), 0);
    }
    fb_opt_batch *b = NULL;
    ck_assert_msg(fb_opt_flush(o, &b) == 0, "%s", fb_opt_errmsg(o));
    const fb_opt_counters *c = &fb_opt_get_stats(o)->flush;
    ck_assert_msg(c->clears_removed == win[f].clears, "window %d: %llu empty clears removed", f,
                  (unsigned long long)c->clears_removed);
    ck_assert_uint_eq(c->listgen_removed, win[f].listgens);
    ck_assert_int_eq(b->n, win[f].out);
    int cls = 0;
    for (int i = 0; i < b->n; i++) cls += b->v[i].kind == FB_TASK_CLEAR_LIST;
    ck_assert_int_eq(cls, win[f].cls);
    fb_opt_batch_free(o, b);
  }
  ck_assert_uint_eq(fb_opt_get_stats(o)->total.clears_removed, 1);
  for (int k = 0; k < m.nk; k++) fb_opt_release(o, h[k]);
  fb_opt_free(o);
  mod_free(&m);
}
END_TEST

Suite *sfg_suite(void) {
  Suite *s = suite_create("sfg");
  TCase *tc = tcase_create("meta");
  tcase_add_test(tc, meta_dense_loop);
  tcase_add_test(tc, meta_sparse);
  tcase_add_test(tc, meta_nested_and_lists);
  tcase_add_test(tc, meta_scratch_ret_unique);
  tcase_add_test(tc, eval_int);
  suite_add_tcase(s, tc);
  tc = tcase_create("graph");
  tcase_add_test(tc, sfg_edges);
  tcase_add_test(tc, sfg_reconstruction_invariance);
  tcase_add_test(tc, sfg_partial_gc);
  suite_add_tcase(s, tc);
  tc = tcase_create("bank");
  tcase_add_test(tc, bank_dedup_and_eviction);
  tcase_add_test(tc, api_refusals);
  suite_add_tcase(s, tc);
  tc = tcase_create("plans");
  tcase_add_test(tc, plan_memo_reuse);
  tcase_add_test(tc, plan_memo_observed);
  tcase_add_test(tc, fuse_tests_only_unjoined_pairs);
  tcase_add_test(tc, observe_keeps_lists);
  tcase_add_test(tc, observe_keeps_lists_made_after_the_writer);
  tcase_add_test(tc, clears_of_empty_lists_only);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) { return fbt_run(sfg_suite()); }
