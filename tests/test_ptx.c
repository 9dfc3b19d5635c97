/* PTX generation: every kernel of tests/cg_kernels.h is emitted for sm_80
 * and sm_90 with fb_ptx_emit and assembled with ptxas (exit status 0
 * required). Without ptxas the PTX is still produced and checked for its
 * entry points. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "codegen/codegen.h"
#include "support/support.h"
#include "cg_kernels.h"

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
  fb_cg_task t = {st->k, st->loop};
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
  if (!ptxas && _i == 0) {
    printf("ptxas not found: skipping PTX assembly\n");
    fflush(stdout);
  }
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
  fb_cg_task t = {cs.steps[1].k, cs.steps[1].loop};
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

int main(void) {
  Suite *s = suite_create("ptx");
  TCase *tc = tcase_create("nvptx");
  tcase_set_timeout(tc, 120);
  tcase_add_loop_test(tc, test_ptx_case, 0, CG_NCASES);
  tcase_add_test(tc, test_ptx_shape);
  suite_add_tcase(s, tc);
  return fbt_run(s);
}
