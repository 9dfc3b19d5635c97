/* `fusebox run SESSION.json`: load a JSON session, run setup and one step,
 * evaluate its checks. Exit 0 when every check passes, 1 when one fails,
 * 2 for bad usage or input (with a message naming the problem). */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client/cli.h"
#include "client/cli_session.h"

static int help(FILE *f) {
  fprintf(f,
          "usage: fusebox run SESSION.json [--mode sync|async] [--param NAME=VALUE]... [-v]\n"
          "  Runs a JSON session (see docs/sessions.md): loads its program, runs\n"
          "  \"setup\" and one \"step\", then evaluates \"checks\" and prints each\n"
          "  outcome. Exit status 0 when all checks pass, 1 when one fails,\n"
          "  2 when the session cannot run (the message names the problem).\n"
          "  --mode   override session.mode     -v  print kernel return values\n"
          "  --param  set a parameter (${NAME} in the program and the session)\n"
          "example: fusebox run examples/life.json\n");
  return f == stdout ? 0 : 2;
}

int fb_cli_run(int argc, char **argv) {
  const char *file = NULL;
  fb_sess_opts o = {.out = stdout};
  json_t *params = json_object();
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--param") && i + 1 < argc) {
      if (fb_cli_add_param(params, argv[++i])) { json_decref(params); return 2; }
      continue;
    }
    if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) return help(stdout);
    if (!strcmp(argv[i], "--mode") && i + 1 < argc) o.mode = argv[++i];
    else if (!strcmp(argv[i], "-v")) o.verbose = 1;
    else if (argv[i][0] != '-' && !file) file = argv[i];
    else { json_decref(params); return help(stderr); }
  }
  if (!file) { json_decref(params); return help(stderr); }
  fb_sess_file f;
  fb_sess_run *r = NULL;
  char *err = NULL;
  int rc = fb_sess_load(file, params, &f, &err);
  json_decref(params);
  if (!rc) rc = fb_sess_start(&f, &o, &r, &err);
  if (!rc) rc = fb_sess_actions(r, "setup", &err);
  if (!rc) rc = fb_sess_actions(r, "step", &err);
  int failed = 0;
  if (!rc) {
    failed = fb_sess_checks(r, &err);
    if (failed < 0) rc = failed;
  }
  if (rc) fprintf(stderr, "fusebox run: %s\n", err ? err : fb_strerror(rc));
  else printf("%s: %s\n", f.name, failed ? "checks FAILED" : "all checks passed");
  free(err);
  fb_sess_stop(r);
  fb_sess_free(&f);
  return rc ? 2 : failed ? 1 : 0;
}
