/* `fusebox check` and `fusebox ir`: the front end's diagnostics, and the IR
 * of each kernel and of the tasks it lowers to (as the engine registers it:
 * an async session, which lowers a kernel without compiling it). */
#define _GNU_SOURCE
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/cli_session.h"
#include "fusebox/engine.h"
#include "fusebox/lang.h"

/* Parse FILE (after ${param} substitution); on failure print the rendered
 * diagnostics. */
static fb_program *load(const char *path, json_t *params, char **src_out) {
  char *raw = fb_cli_read_file(path, NULL), *err = NULL;
  if (!raw) {
    fprintf(stderr, "%s: %s\n", path, strerror(errno));
    *src_out = NULL;
    return NULL;
  }
  char *src = strstr(raw, "${") ? fb_sess_subst(raw, params, path, &err) : strdup(raw);
  free(raw);
  *src_out = src;
  if (!src) {
    fprintf(stderr, "%s (give it with --param NAME=VALUE)\n", err ? err : "out of memory");
    free(err);
    return NULL;
  }
  fb_diags d;
  fb_diags_init(&d);
  fb_program *p = NULL;
  if (fb_program_parse(path, src, &p, &d)) {
    char *r = fb_diags_render(path, src, &d);
    fputs(r ? r : "parse failed\n", stderr);
    fprintf(stderr, "%d error%s\n", d.n, d.n == 1 ? "" : "s");
    free(r);
    p = NULL;
  } else if (fb_program_warnings(p)->n) { /* advice only: the check still passes */
    char *w = fb_program_warnings_render(p);
    fputs(w ? w : "", stderr);
    free(w);
  }
  fb_diags_free(&d);
  *src_out = src;
  return p;
}

/* `fusebox check SESSION.json`: the session file (keys, params) and its
 * program, as `fusebox run` loads them, without running anything. */
static int check_session(const char *file, json_t *params) {
  fb_sess_file f;
  char *err = NULL;
  int rc = fb_sess_load(file, params, &f, &err);
  json_decref(params);
  if (rc) {
    fprintf(stderr, "%s\n", err ? err : fb_strerror(rc));
    if (err && strstr(err, "is not a parameter"))
      fprintf(stderr, "(give it with --param NAME=VALUE)\n");
    free(err);
    fb_sess_free(&f);
    return 1;
  }
  fb_program *p = f.prog;
  if (fb_program_warnings(p)->n) { /* advice only: the check still passes */
    char *w = fb_program_warnings_render(p);
    fputs(w ? w : "", stderr);
    free(w);
  }
  printf("%s: ok (program %s: %d field%s, %d kernel%s, %d func%s)\n", file,
         f.program_path ? f.program_path : "inline source", fb_program_nfields(p),
         fb_program_nfields(p) == 1 ? "" : "s", fb_program_nkernels(p),
         fb_program_nkernels(p) == 1 ? "" : "s", fb_program_nfuncs(p),
         fb_program_nfuncs(p) == 1 ? "" : "s");
  fb_sess_free(&f);
  return 0;
}

int fb_cli_check(int argc, char **argv) {
  const char *file = NULL;
  json_t *params = json_object();
  int bad = 0;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--param") && i + 1 < argc) bad |= fb_cli_add_param(params, argv[++i]);
    else if (argv[i][0] != '-' && !file) file = argv[i];
    else bad = 1;
  }
  if (fb_cli_wants_help(argc, argv) || !file || bad) {
    int h = fb_cli_wants_help(argc, argv);
    fprintf(h ? stdout : stderr,
            "usage: fusebox check FILE.fbk|SESSION.json [--param NAME=VALUE]...\n"
            "  Parses and type-checks the program: every error is printed as\n"
            "  file:line:col: error: message, with the line and a caret.\n"
            "  A JSON session (a file ending in .json) is checked as 'fusebox run'\n"
            "  loads it: its keys and params, then the program it names (or its\n"
            "  inline source); nothing runs.\n"
            "  --param gives a value for ${NAME} in the program text.\n"
            "  Exit status 0 only when the file is valid.\n"
            "examples:\n"
            "  fusebox check examples/heat.fbk\n"
            "  fusebox check examples/heat.json\n"
            "  fusebox check bench/micro/chain_copy.fbk --param scale=2\n");
    json_decref(params);
    return h ? 0 : 2;
  }
  size_t flen = strlen(file);
  if (flen > 5 && !strcmp(file + flen - 5, ".json")) return check_session(file, params);
  char *src;
  fb_program *p = load(file, params, &src);
  free(src);
  json_decref(params);
  if (!p) return 1;
  printf("%s: ok (%d field%s, %d kernel%s, %d func%s)\n", file, fb_program_nfields(p),
         fb_program_nfields(p) == 1 ? "" : "s", fb_program_nkernels(p),
         fb_program_nkernels(p) == 1 ? "" : "s", fb_program_nfuncs(p),
         fb_program_nfuncs(p) == 1 ? "" : "s");
  fb_program_free(p);
  return 0;
}

/* An engine and an async session on the program's layout, for the tasks of
 * its kernels (registration in async mode lowers; it compiles nothing). */
static fb_session *task_session(fb_program *p, fb_engine **e) {
  char err[512];
  fb_engine_config ec = {"cpu", 1, 1};
  fb_session_config sc = {.mode = "async", .max_kernel_statements = -1};
  fb_session *s = NULL;
  int rc = fb_engine_create(&ec, e, err, sizeof err);
  if (!rc) rc = fb_session_create(*e, &sc, fb_program_layout(p), &s, err, sizeof err);
  if (rc) {
    fprintf(stderr, "fusebox ir: cannot start the engine for the tasks: %s\n", err);
    fb_engine_destroy(*e);
    *e = NULL;
  }
  return s;
}

/* The kernel's IR, then (with s) the tasks the engine lowers it to. */
static int print_kernel(fb_program *p, fb_session *s, const fb_lang_kernel *lk, char **binds,
                        int nb) {
  fb_kernel *k;
  fb_diags d;
  fb_diags_init(&d);
  int rc = fb_program_instantiate(p, lk->name, (const char *const *)binds, nb, &k, &d);
  if (rc) {
    char *r = fb_diags_render(fb_program_filename(p), fb_program_source(p), &d);
    fprintf(stderr, "%s", r ? r : fb_strerror(rc));
    free(r);
    fb_diags_free(&d);
    return 1;
  }
  fb_diags_free(&d);
  printf("\n");
  fb_kernel_fprint(stdout, k);
  const fb_kernel *const *tasks = NULL;
  int id = s ? fb_session_add_kernel(s, k) : 0, n = 0;
  if (s && (id < 0 || fb_session_kernel_tasks(s, id, &tasks, &n))) {
    fprintf(stderr, "%s\n", fb_session_errmsg(s));
    return 1;
  }
  for (int t = 0; t < n; t++) {
    printf("\n# task %d of %s: %s\n", t, k->name, fb_session_task_kind(s, id, t));
    fb_kernel_fprint(stdout, tasks[t]);
  }
  return 0;
}

/* Split "a,b,c" in place into at most max names. */
static int split_binds(char *s, char **out, int max) {
  int n = 0;
  for (char *tok = strtok(s, ","); tok && n < max; tok = strtok(NULL, ",")) out[n++] = tok;
  return n;
}

int fb_cli_ir(int argc, char **argv) {
  const char *file = NULL, *only = NULL;
  char *bind = NULL;
  int tasks = 1;
  json_t *params = json_object();
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--param") && i + 1 < argc) {
      if (fb_cli_add_param(params, argv[++i])) file = NULL, i = argc;
    } else if (!strcmp(argv[i], "--kernel") && i + 1 < argc) only = argv[++i];
    else if (!strcmp(argv[i], "--bind") && i + 1 < argc) bind = argv[++i];
    else if (!strcmp(argv[i], "--no-tasks")) tasks = 0;
    else if (argv[i][0] != '-' && !file) file = argv[i];
    else file = NULL, i = argc;
  }
  if (fb_cli_wants_help(argc, argv) || !file) {
    fprintf(fb_cli_wants_help(argc, argv) ? stdout : stderr,
            "usage: fusebox ir FILE.fbk [--kernel NAME] [--bind F1,F2] [--no-tasks]\n"
            "                  [--param NAME=VALUE]...\n"
            "  Prints the layout and the IR of each kernel, then the tasks each kernel\n"
            "  lowers to (one per top-level parallel loop, one per run of other\n"
            "  statements). Kernels with field parameters need --bind with the fields\n"
            "  to instantiate them with (and --kernel); others are skipped.\n"
            "  --param gives a value for ${NAME} in the program text.\n"
            "examples:\n"
            "  fusebox ir examples/heat.fbk\n"
            "  fusebox ir examples/saxpy.fbk --kernel saxpy --bind x,y\n");
    json_decref(params);
    return fb_cli_wants_help(argc, argv) ? 0 : 2;
  }
  char *src;
  fb_program *p = load(file, params, &src);
  free(src);
  json_decref(params);
  if (!p) return 1;
  char *lay = fb_layout_print(fb_program_layout(p));
  fputs(lay ? lay : "", stdout);
  free(lay);
  char *binds[16];
  int nb = bind ? split_binds(bind, binds, 16) : 0, rc = 0, shown = 0;
  fb_engine *e = NULL;
  fb_session *s = tasks ? task_session(p, &e) : NULL;
  if (tasks && !s) {
    fb_program_free(p);
    return 1;
  }
  for (int i = 0; i < fb_program_nkernels(p); i++) {
    const fb_lang_kernel *lk = fb_program_kernel(p, i);
    if (only && strcmp(only, lk->name)) continue;
    shown++;
    if (lk->nfield_params != (only ? nb : 0)) {
      if (only) {
        fprintf(stderr, "%s takes %d field parameter%s: give them with --bind\n", lk->name,
                lk->nfield_params, lk->nfield_params == 1 ? "" : "s");
        rc = 1;
      } else {
        printf("\n# %s has field parameters: show it with --kernel %s --bind ...\n", lk->name,
               lk->name);
      }
      continue;
    }
    rc |= print_kernel(p, s, lk, binds, nb);
  }
  if (only && !shown) {
    fprintf(stderr, "%s: no kernel named '%s'\n", file, only);
    rc = 1;
  }
  fb_session_destroy(s);
  fb_engine_destroy(e);
  fb_program_free(p);
  return rc;
}
