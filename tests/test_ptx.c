/* PTX generation: every kernel of tests/cg_kernels.h is emitted for sm_80
 * and sm_90 with fb_ptx_emit and assembled with ptxas (exit status 0
 * required), and so is every task (list tasks, struct-fors over lists,
 * activation, deactivation, append, gc) of kernels over pointer, bitmasked
 * and dynamic SNodes, with the sparse runtime linked in. Without ptxas the
 * PTX is still produced and checked for its entry points, and the suite then
 * exits 77 (ctest: skipped) so that the missing assembly check is seen. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cg_kernels.h"
#include "codegen/codegen.h"
#include "fusebox/lang.h"
#include "optimizer/optimizer.h"
#include "support/support.h"

/* ptxas named by $FB_PTXAS (set it empty to skip assembly), else from
 * $CUDA_HOME, the usual install path, or PATH; NULL if none. */
static const char *find_ptxas(char *buf, size_t n) {
  const char *forced = getenv("FB_PTXAS");
  if (forced) return *forced && access(forced, X_OK) == 0 ? forced : NULL;
  const char *home = getenv("CUDA_HOME");
  if (home && *home) {
    snprintf(buf, n, "%s/bin/ptxas", home);
    if (access(buf, X_OK) == 0) return buf;
  }
  snprintf(buf, n, "/usr/local/cuda/bin/ptxas");
  if (access(buf, X_OK) == 0) return buf;
  FILE *p = popen("command -v ptxas 2>/dev/null", "r");
  if (!p) return NULL;
  int got = fgets(buf, (int)n, p) != NULL;
  pclose(p);
  if (!got) return NULL;
  buf[strcspn(buf, "\n")] = 0;
  return *buf ? buf : NULL;
}

/* Assemble ptx for arch; returns ptxas's exit status (its messages go to
 * stderr). */
static int assemble(const char *ptxas, const char *ptx, const char *arch, const char *what) {
  char path[] = "/tmp/fb_ptx_XXXXXX";
  int fd = mkstemp(path);
  ck_assert_int_ge(fd, 0);
  FILE *f = fdopen(fd, "w");
  ck_assert_ptr_nonnull(f);
  fputs(ptx, f);
  fclose(f);
  /* sized to fit: $FB_PTXAS may name a path of any length */
#define PTXAS_CMD "'%s' -arch=%s '%s' -o /dev/null"
  int need = snprintf(NULL, 0, PTXAS_CMD, ptxas, arch, path);
  ck_assert_int_ge(need, 0);
  char *cmd = malloc((size_t)need + 1);
  ck_assert_ptr_nonnull(cmd);
  snprintf(cmd, (size_t)need + 1, PTXAS_CMD, ptxas, arch, path);
#undef PTXAS_CMD
  int st = system(cmd);
  free(cmd);
  int rc = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  if (rc != 0) fprintf(stderr, "ptxas failed (%d) on %s for %s: kept %s\n", rc, what, arch, path);
  else unlink(path);
  return rc;
}

static void check_ptx(const cg_step *st, const char *sm, const char *ptxas) {
  fb_cg_task t = {st->k, st->loop, 0, NULL};
  char *ptx = NULL, err[512] = "";
  int rc = fb_ptx_emit(&t, sm, &ptx, err, sizeof err);
  ck_assert_msg(rc == 0, "fb_ptx_emit %s %s: %s (%s)", st->k->name, sm, fb_strerror(rc), err);
  ck_assert_ptr_nonnull(ptx);
  ck_assert_msg(strstr(ptx, ".entry fb_body") != NULL, "%s: no .entry fb_body", st->k->name);
  if (st->loop >= 0) ck_assert_ptr_nonnull(strstr(ptx, ".entry fb_bounds"));
  else ck_assert_ptr_null(strstr(ptx, "fb_bounds"));
  char target[32];
  snprintf(target, sizeof target, ".target %s", sm);
  ck_assert_msg(strstr(ptx, target) != NULL, "%s: PTX is not for %s", st->k->name, sm);
  ck_assert_ptr_null(strstr(ptx, "__nvvm_reflect"));
  if (ptxas) ck_assert_int_eq(assemble(ptxas, ptx, sm, st->k->name), 0);
  free(ptx);
}

START_TEST(test_ptx_case) {
  char buf[4096];
  const char *ptxas = find_ptxas(buf, sizeof buf);
  cg_layout c;
  ck_assert_int_eq(cg_layout_build(&c), 0);
  cg_case cs;
  ck_assert_int_eq(cg_case_build(&c, _i, &cs), 0);
  const char *sms[2] = {"sm_80", "sm_90"};
  for (int s = 0; s < cs.nsteps; s++) {
    /* the init kernel recurs in many cases: assemble it in the first only */
    if (_i > 0 && strcmp(cs.steps[s].k->name, "init") == 0) continue;
    int dup = 0;
    for (int p = 0; p < s; p++) dup |= cs.steps[p].k == cs.steps[s].k;
    if (dup) continue;
    for (int a = 0; a < 2; a++) check_ptx(&cs.steps[s], sms[a], ptxas);
  }
  cg_case_free(&cs);
  fb_layout_free(c.l);
}
END_TEST

/* The grid-stride loop, libdevice math and bad architectures. */
START_TEST(test_ptx_shape) {
  cg_layout c;
  ck_assert_int_eq(cg_layout_build(&c), 0);
  cg_case cs;
  ck_assert_int_eq(cg_case_build(&c, 4, &cs), 0); /* math */
  fb_cg_task t = {cs.steps[1].k, cs.steps[1].loop, 0, NULL};
  char *ptx = NULL, err[512] = "";
  ck_assert_int_eq(fb_ptx_emit(&t, "sm_80", &ptx, err, sizeof err), 0);
  ck_assert_ptr_nonnull(strstr(ptx, "%ctaid.x"));
  ck_assert_ptr_nonnull(strstr(ptx, "%nctaid.x"));
  ck_assert_ptr_nonnull(strstr(ptx, "%ntid.x"));
  ck_assert_ptr_nonnull(strstr(ptx, "%tid.x"));
  /* libdevice (when installed) is linked in: no external calls remain */
  ck_assert_ptr_null(strstr(ptx, ".extern .func"));
  free(ptx);
  ptx = NULL;
  ck_assert_int_eq(fb_ptx_emit(&t, "sm_7", &ptx, err, sizeof err), FB_EINVAL);
  ck_assert_ptr_nonnull(strstr(err, "sm_7"));
  ck_assert_int_eq(fb_ptx_emit(&t, "compute_80", &ptx, err, sizeof err), FB_EINVAL);
  ck_assert_int_eq(fb_ptx_emit(&t, NULL, &ptx, err, sizeof err), FB_EINVAL);
  ck_assert_ptr_null(ptx);
  cg_case_free(&cs);
  fb_layout_free(c.l);
}
END_TEST

/* Sparse SNodes of every kind and the ops on them. */
static const char *const sparse_src =
    "layout {\n"
    "  pointer(ij: 8, 8) as blocks { bitmasked(ij: 4, 4) as bits { place rho: f32 } }\n"
    "  pointer(i: 8) as outer { pointer(i: 4) as inner { dense(i: 4) { place x: i32 } } }\n"
    "  dense(i: 16) { dynamic(j: 256, chunk: 16) as lists { place d: i32 } }\n"
    "  bitmasked(i: 64) as bm { place v: f64 }\n"
    "  place n: i32, total: f32\n"
    "}\n"
    "kernel paint() { for i in 0 .. 32 { rho[i, i] = 1.0\n x[i * 3] += i\n v[i] = 2.0 } }\n"
    "kernel visit() -> f32 { for i, j in rho { total[] += rho[i, j] * 2.0 }\n return total[] }\n"
    "kernel count() { for I, J in blocks { n[] += 1 }\n for i in x { x[i] += 1 }\n for i in v { "
    "v[i] *= 2.0 } }\n"
    "kernel push(m: i32) { for t in 0 .. m { let s = append(d, t % 16, t)\n if s < 0 { n[] += 1 } "
    "} }\n"
    "kernel lists() { for k, m in d { n[] += d[k, m] + length(d, k) } }\n"
    "kernel prune() {\n"
    "  for I, J in blocks { if I != J { deactivate(blocks, I, J) } }\n"
    "  for o in outer { if o % 2 == 0 { deactivate(outer, o) } }\n"
    "  for i in v { if i % 3 == 0 { deactivate(bm, i) } }\n"
    "  for k, m in d { if m == 0 && k % 2 == 0 { deactivate(lists, k, m) } }\n"
    "}\n"
    "kernel query() { for i in 0 .. 64 { if is_active(inner, i % 32) || is_active(rho, i % 32, 3) "
    "{ activate(bm, i) } } }\n";

START_TEST(test_ptx_sparse) {
  char buf[4096];
  const char *ptxas = find_ptxas(buf, sizeof buf);
  fb_program *p = NULL;
  fb_diags d;
  fb_diags_init(&d);
  ck_assert_int_eq(fb_program_parse("sparse.fbk", sparse_src, &p, &d), 0);
  const char *sms[2] = {"sm_80", "sm_90"};
  int kinds[FB_TASK_GC + 1] = {0};
  for (int k = 0; k < fb_program_nkernels(p); k++) {
    fb_kernel *ir = NULL;
    ck_assert_int_eq(fb_program_instantiate(p, fb_program_kernel(p, k)->name, NULL, 0, &ir, &d), 0);
    fb_task_list tl;
    char err[512] = "";
    ck_assert_int_eq(fb_lower(ir, &tl, err, sizeof err), 0);
    for (int t = 0; t < tl.n; t++) {
      kinds[tl.v[t].kind]++;
      cg_step st = {tl.v[t].ir, tl.v[t].loop, {{0}}, 0};
      for (int a = 0; a < 2; a++) {
        check_ptx(&st, sms[a], ptxas);
        /* the runtime is linked and inlined: nothing is left to resolve */
        fb_cg_task ct = {tl.v[t].ir, tl.v[t].loop, 0, NULL};
        char *ptx = NULL;
        ck_assert_int_eq(fb_ptx_emit(&ct, sms[a], &ptx, err, sizeof err), 0);
        ck_assert_msg(strstr(ptx, ".extern") == NULL, "%s: external symbols left:\n%s",
                      tl.v[t].ir->name, ptx);
        free(ptx);
      }
    }
    fb_task_list_free(&tl);
  }
  for (int k = FB_TASK_RANGE_FOR; k <= FB_TASK_GC; k++)
    ck_assert_msg(kinds[k] > 0, "no %s task was assembled", fb_task_kind_name((fb_task_kind)k));
  fb_diags_free(&d);
  fb_program_free(p);
}
END_TEST

/* Blame in fused tasks (docs/optimizer.md): an access of fused part p
 * latches FB_RT_BLAME(p) into the blame word by an atomic max on its
 * out-of-bounds path, a full list's append passes its part to the runtime
 * (linked and inlined), and the PTX still assembles. The parts are set by
 * hand here (the store part 2, the append part 5), as fusion would. */
static const char *const blame_src =
    "layout {\n"
    "  dense(i: 16) { place a: i32 }\n"
    "  dense(i: 16) { dynamic(j: 4, chunk: 4) as lists { place d: i32 } }\n"
    "}\n"
    "kernel two(o: i32) { for i in 0 .. 16 { a[i + o] = 1\n let s = append(d, i, i)\n"
    "  if s < 0 { a[0] = 2 } } }\n";

START_TEST(test_ptx_blame) {
  char buf[4096];
  const char *ptxas = find_ptxas(buf, sizeof buf);
  fb_program *p = NULL;
  fb_diags d;
  fb_diags_init(&d);
  ck_assert_int_eq(fb_program_parse("blame.fbk", blame_src, &p, &d), 0);
  fb_kernel *ir = NULL;
  ck_assert_int_eq(fb_program_instantiate(p, "two", NULL, 0, &ir, &d), 0);
  fb_task_list tl;
  char err[512] = "";
  ck_assert_int_eq(fb_lower(ir, &tl, err, sizeof err), 0);
  ck_assert_int_eq(tl.n, 1);
  fb_kernel *k = (fb_kernel *)tl.v[0].ir;
  int stores = 0, appends = 0;
  for (int i = 0; i < k->nstmts; i++) {
    if (k->stmts[i].op == FB_OP_STORE) k->stmts[i].part = 2, stores++;
    if (k->stmts[i].op == FB_OP_APPEND) k->stmts[i].part = 5, appends++;
  }
  ck_assert_int_ge(stores, 1);
  ck_assert_int_eq(appends, 1);
  fb_cg_task t = {k, tl.v[0].loop, 0, NULL};
  char *ptx = NULL;
  ck_assert_msg(fb_ptx_emit(&t, "sm_80", &ptx, err, sizeof err) == 0, "%s", err);
  char w2[16], w5[16];
  snprintf(w2, sizeof w2, "%d", (int)FB_RT_BLAME(2));
  snprintf(w5, sizeof w5, "%d", (int)FB_RT_BLAME(5));
  ck_assert_msg(strstr(ptx, ".max.s32") && strstr(ptx, w2), "no blame of part 2:\n%s", ptx);
  ck_assert_msg(strstr(ptx, w5), "the append's part 5 is not passed:\n%s", ptx);
  if (ptxas) ck_assert_int_eq(assemble(ptxas, ptx, "sm_80", "two (blame)"), 0);
  free(ptx);
  fb_task_list_free(&tl);
  fb_diags_free(&d);
  fb_program_free(p);
}
END_TEST

/* Out of memory in fused tasks (docs/optimizer.md): a store that
 * activates a pointer cell passes its part to the runtime, which (linked
 * and inlined) latches FB_RT_BLAME_OOM(part) in the blame word where the
 * pool has no room; the PTX still assembles. The part (3) is set by hand,
 * as fusion would. */
static const char *const quota_src =
    "layout { pointer(i: 16) as blk { dense(i: 4) { place f: f32 } } }\n"
    "kernel paint() { for i in 0 .. 64 { f[i] = 1.0 } }\n";

START_TEST(test_ptx_quota_blame) {
  char buf[4096];
  const char *ptxas = find_ptxas(buf, sizeof buf);
  fb_program *p = NULL;
  fb_diags d;
  fb_diags_init(&d);
  ck_assert_int_eq(fb_program_parse("quota.fbk", quota_src, &p, &d), 0);
  fb_kernel *ir = NULL;
  ck_assert_int_eq(fb_program_instantiate(p, "paint", NULL, 0, &ir, &d), 0);
  fb_task_list tl;
  char err[512] = "";
  ck_assert_int_eq(fb_lower(ir, &tl, err, sizeof err), 0);
  ck_assert_int_eq(tl.n, 1);
  fb_kernel *k = (fb_kernel *)tl.v[0].ir;
  int stores = 0;
  for (int i = 0; i < k->nstmts; i++)
    if (k->stmts[i].op == FB_OP_STORE) k->stmts[i].part = 3, stores++;
  ck_assert_int_eq(stores, 1);
  fb_cg_task t = {k, tl.v[0].loop, 0, NULL};
  char *ptx = NULL;
  ck_assert_msg(fb_ptx_emit(&t, "sm_80", &ptx, err, sizeof err) == 0, "%s", err);
  char w3[16];
  snprintf(w3, sizeof w3, "%d", (int)FB_RT_BLAME_OOM(3));
  if (!strstr(ptx, w3) || !strstr(ptx, "atom.cas.b32")) fprintf(stderr, "%s\n", ptx);
  /* the runtime's atomic max (a compare-and-swap loop) of the word */
  ck_assert_msg(strstr(ptx, w3) && strstr(ptx, "atom.cas.b32"),
                "no out-of-memory blame of part 3 (%s), PTX above", w3);
  ck_assert_int_eq(FB_RT_BLAMED_PART(FB_RT_BLAME_OOM(3)), 3);
  ck_assert(FB_RT_BLAMED_OOM(FB_RT_BLAME_OOM(3)) && !FB_RT_BLAMED_OOM(FB_RT_BLAME(3)));
  ck_assert_int_gt(FB_RT_BLAME_OOM(3), FB_RT_BLAME(3)); /* out of memory first in a part */
  ck_assert_int_gt(FB_RT_BLAME(2), FB_RT_BLAME_OOM(3)); /* an earlier part first */
  if (ptxas) ck_assert_int_eq(assemble(ptxas, ptx, "sm_80", "paint (quota blame)"), 0);
  free(ptx);
  fb_task_list_free(&tl);
  fb_diags_free(&d);
  fb_program_free(p);
}
END_TEST

int main(void) {
  Suite *s = suite_create("ptx");
  TCase *tc = tcase_create("nvptx");
  tcase_set_timeout(tc, 120);
  tcase_add_loop_test(tc, test_ptx_case, 0, CG_NCASES);
  tcase_add_test(tc, test_ptx_shape);
  tcase_add_test(tc, test_ptx_sparse);
  tcase_add_test(tc, test_ptx_blame);
  tcase_add_test(tc, test_ptx_quota_blame);
  suite_add_tcase(s, tc);
  int rc = fbt_run(s);
  char buf[4096];
  if (rc == EXIT_SUCCESS && !find_ptxas(buf, sizeof buf)) {
    printf("ptxas not found (set CUDA_HOME or FB_PTXAS, or put it on PATH): "
           "PTX emitted and checked, assembly skipped\n");
    return 77;
  }
  return rc;
}
