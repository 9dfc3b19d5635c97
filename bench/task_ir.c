/* task_ir: print the LLVM IR of a kernel's tasks as the CPU JIT compiles
 * them (after linking the sparse runtime and the O3 pipeline), to see
 * what the code generator made of a hot loop.
 *
 *   task_ir FILE.fbk KERNEL [FIELD,FIELD...] [TASK] [TARGET]
 *
 * FILE.fbk must have its ${params} substituted already (sed); FIELD,...
 * binds the kernel's field parameters ("-" for none); TASK is the task's
 * number in `fusebox ir`'s order (default: every task); TARGET is
 * x86_64-O3 (default), x86_64 (before optimization) or nvptx64.
 * FB_TASK_IR_NA=1 in the environment turns every store into store_na, as
 * activation demotion does where it proves the cell active. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codegen/codegen.h"
#include "fusebox/lang.h"
#include "optimizer/optimizer.h"

static char *slurp(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *s = n >= 0 ? malloc((size_t)n + 1) : NULL;
  if (s && fread(s, 1, (size_t)n, f) != (size_t)n) {
    free(s);
    s = NULL;
  }
  if (s) s[n] = 0;
  fclose(f);
  return s;
}

int main(int argc, char **argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: task_ir FILE.fbk KERNEL [FIELD,FIELD...|-] [TASK|-1] [TARGET]\n");
    return 2;
  }
  char *src = slurp(argv[1]);
  if (!src) {
    fprintf(stderr, "task_ir: cannot read %s\n", argv[1]);
    return 1;
  }
  fb_diags d;
  fb_diags_init(&d);
  fb_program *p = NULL;
  if (fb_program_parse(argv[1], src, &p, &d)) {
    char *msg = fb_diags_render(argv[1], src, &d);
    fprintf(stderr, "%s", msg ? msg : "parse failed\n");
    return 1;
  }
  const char *bind[16];
  int nb = 0;
  char *list = argc > 3 && strcmp(argv[3], "-") ? strdup(argv[3]) : NULL;
  for (char *t = list ? strtok(list, ",") : NULL; t && nb < 16; t = strtok(NULL, ","))
    bind[nb++] = t;
  fb_kernel *k = NULL;
  if (fb_program_instantiate(p, argv[2], bind, nb, &k, &d)) {
    char *msg = fb_diags_render(argv[1], src, &d);
    fprintf(stderr, "task_ir: kernel %s: %s", argv[2], msg ? msg : "cannot instantiate\n");
    return 1;
  }
  int which = argc > 4 ? atoi(argv[4]) : -1;
  const char *target = argc > 5 ? argv[5] : "x86_64-O3";
  fb_task_list tl;
  char err[512] = "";
  if (fb_lower(k, &tl, err, sizeof err)) {
    fprintf(stderr, "task_ir: lower: %s\n", err);
    return 1;
  }
  for (int i = 0; i < tl.n; i++) {
    if (which >= 0 && i != which) continue;
    if (getenv("FB_TASK_IR_NA"))
      for (int j = 0; j < tl.v[i].ir->nstmts; j++)
        if (tl.v[i].ir->stmts[j].op == FB_OP_STORE) tl.v[i].ir->stmts[j].op = FB_OP_STORE_NA;
    fb_cg_task t = {tl.v[i].ir, tl.v[i].loop, 0, NULL};
    char *text = NULL;
    if (fb_llvm_ir_text(&t, target, &text, err, sizeof err)) {
      fprintf(stderr, "task_ir: task %d: %s\n", i, err);
      return 1;
    }
    printf("; ---- task %d\n%s\n", i, text);
    free(text);
  }
  fb_task_list_free(&tl);
  fb_program_free(p);
  free(list);
  free(src);
  return 0;
}
