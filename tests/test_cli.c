/* The `fusebox` CLI end to end: every example session runs with its checks
 * passing; bad input (unknown JSON keys, unknown params, wrong argument
 * kinds, parse errors) gives a clear message and exit status 2; a failed
 * check names the check and the values and exits 1; .npy files round-trip
 * through `write ... from` and `read ... to`; `check`, `ir` and --help;
 * the files a session writes stay inside the output directory. */
#include <ctype.h>
#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>
#include <png.h>

#include "cli/cli.h"
#include "support.h"

static char tmpdir[256];

/* Run a shell command; return its exit status and (malloc'd) output. */
static int sh(const char *cmd, char **out) {
  char full[4096];
  snprintf(full, sizeof full, "%s 2>&1", cmd);
  FILE *p = popen(full, "r");
  ck_assert_ptr_nonnull(p);
  size_t cap = 1 << 16, n = 0;
  char *buf = malloc(cap);
  size_t got;
  while ((got = fread(buf + n, 1, cap - n - 1, p)) > 0) {
    n += got;
    if (n + 1 >= cap) buf = realloc(buf, cap *= 2);
  }
  buf[n] = 0;
  int st = pclose(p);
  if (out) *out = buf;
  else free(buf);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static const char *fusebox(void) {
  static char path[1024];
  const char *b = getenv("FB_BUILD_DIR");
  snprintf(path, sizeof path, "%s/client/fusebox", b ? b : "build");
  return path;
}

static void write_file(const char *name, const char *text) {
  char path[512];
  snprintf(path, sizeof path, "%s/%s", tmpdir, name);
  FILE *f = fopen(path, "w");
  ck_assert_ptr_nonnull(f);
  fputs(text, f);
  fclose(f);
}

static int run_session(const char *name, const char *json, char **out) {
  write_file(name, json);
  char cmd[8192];
  snprintf(cmd, sizeof cmd, "%s run %s/%s", fusebox(), tmpdir, name);
  return sh(cmd, out);
}

static const char *prog = "layout {\n"
                          "  dense(i: 8) { place a: f32, n: i32 }\n"
                          "  place total: f32\n"
                          "}\n"
                          "kernel fill(v: f32) {\n"
                          "  for i in a { a[i] = v + f32(i); n[i] = i * ${K} }\n"
                          "}\n"
                          "kernel sum() -> f32 {\n"
                          "  total[] = 0.0\n"
                          "  for i in a { total[] += a[i] }\n"
                          "  return total[]\n"
                          "}\n";

START_TEST(examples_pass) {
  const char *dir = fbt_path("../examples");
  DIR *d = opendir(dir);
  ck_assert_ptr_nonnull(d);
  int ran = 0;
  for (struct dirent *e; (e = readdir(d));) {
    size_t n = strlen(e->d_name);
    if (n < 6 || strcmp(e->d_name + n - 5, ".json")) continue;
    char cmd[8192], *out;
    /* their saves (wave.json's pictures) go here, not into the source tree */
    snprintf(cmd, sizeof cmd, "%s run %s/%s -o %s/examples-out", fusebox(), dir, e->d_name, tmpdir);
    int rc = sh(cmd, &out);
    /* every example passes, the sparse one (pointer, bitmasked, dynamic) too */
    ck_assert_msg(rc == 0 && strstr(out, "all checks passed"), "%s: rc %d\n%s", e->d_name, rc, out);
    ran++;
    free(out);
  }
  closedir(d);
  ck_assert_int_ge(ran, 6);
  char png[600];
  snprintf(png, sizeof png, "%s/examples-out/wave_080.png", tmpdir);
  ck_assert_msg(access(png, F_OK) == 0, "examples/wave.json left no %s", png);
}
END_TEST

START_TEST(params_checks_and_npy) {
  char src[2048];
  snprintf(src, sizeof src, "%s", prog);
  write_file("p.fbk", src);
  char *out;
  int rc = run_session(
      "ok.json",
      "{ \"name\": \"p\", \"program\": \"p.fbk\", \"params\": {\"K\": 3, \"V\": 0.5, \"R\": 2},\n"
      "  \"step\": [ {\"launch\": \"fill\", \"args\": [\"${V}\"]},\n"
      "            {\"repeat\": \"${R}\", \"do\": [{\"launch\": \"sum\"}]}, {\"sync\": true} ],\n"
      "  \"checks\": [ {\"read\": \"a\", \"sum\": 32.0},\n"
      "              {\"read\": \"n\", \"equals\": [0,3,6,9,12,15,18,21]},\n"
      "              {\"read\": \"total\", \"equals\": 32.0},\n"
      "              {\"read\": \"a\", \"min\": 0.5, \"max\": 7.5},\n"
      "              {\"read\": \"a\", \"to\": \"a.npy\"} ] }\n",
      &out);
  ck_assert_msg(rc == 0, "rc %d: %s", rc, out);
  free(out);
  /* the saved array feeds a write in another session, whose sum proves it */
  rc = run_session("npy.json",
                   "{ \"program\": \"p.fbk\", \"params\": {\"K\": 1},\n"
                   "  \"setup\": [ {\"write\": \"a\", \"from\": \"a.npy\"} ],\n"
                   "  \"step\": [ {\"launch\": \"sum\"} ],\n"
                   "  \"checks\": [ {\"read\": \"total\", \"equals\": 32.0} ] }\n",
                   &out);
  ck_assert_msg(rc == 0, "rc %d: %s", rc, out);
  free(out);
}
END_TEST

START_TEST(failed_check_names_it) {
  write_file("p.fbk", prog);
  char *out;
  int rc = run_session("bad.json",
                       "{ \"program\": \"p.fbk\", \"params\": {\"K\": 2},\n"
                       "  \"step\": [ {\"launch\": \"fill\", \"args\": [1.0]} ],\n"
                       "  \"checks\": [ {\"read\": \"a\", \"sum\": 99.0, \"rtol\": 1e-6},\n"
                       "              {\"read\": \"n\", \"equals\": 0} ] }\n",
                       &out);
  ck_assert_int_eq(rc, 1);
  ck_assert_msg(strstr(out, "FAIL  checks[0] sum(a) = 36, expected 99"), "%s", out);
  ck_assert_msg(strstr(out, "FAIL  checks[1] n[1] = 2, expected 0"), "%s", out);
  free(out);
}
END_TEST

START_TEST(bad_input_is_named) {
  write_file("p.fbk", prog);
  struct {
    const char *json, *want;
  } cases[] = {
      {"{ \"program\": \"p.fbk\", \"params\": {\"K\": 1}, \"session\": {\"mdoe\": \"sync\"} }",
       "$.session.mdoe: unknown key"},
      {"{ \"program\": \"p.fbk\", \"params\": {\"K\": 1}, \"step\": [ {\"launch\": \"fill\", "
       "\"arg\": [1]} ] }",
       "$.step[0].arg: unknown key"},
      {"{ \"program\": \"p.fbk\" }", "${K} is not a parameter"},
      {"{ \"program\": \"p.fbk\", \"params\": {\"K\": 1}, \"step\": [ {\"launch\": \"fill\", "
       "\"args\": [\"a\"]} ] }",
       "$.step[0].args[0]: parameter 'v' needs an f32 value"},
      {"{ \"program\": \"p.fbk\", \"params\": {\"K\": 1}, \"step\": [ {\"launch\": \"nope\"} ] }",
       "no kernel named 'nope'"},
      {"{ \"program\": \"p.fbk\", \"params\": {\"K\": 1}, \"step\": [ {\"launch\": \"fill\"} ] }",
       "takes 1 argument, 0 given"},
      {"{ \"program\": \"p.fbk\", \"params\": {\"K\": 1}, \"checks\": [ {\"read\": \"zz\", "
       "\"sum\": 1} ] }",
       "no field named 'zz'"},
      {"{ \"program\": \"missing.fbk\" }", "missing.fbk"},
      {"{ \"source\": \"kernel k() { x[0] = 1 }\" }", "<source>:1:14: error"},
      {"{ \"program\": \"p.fbk\", ", "bad9.json:1:"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char *out;
    char name[32];
    snprintf(name, sizeof name, "bad%zu.json", i);
    int rc = run_session(name, cases[i].json, &out);
    ck_assert_msg(rc == 2, "case %zu: rc %d\n%s", i, rc, out);
    ck_assert_msg(strstr(out, cases[i].want), "case %zu: want '%s' in:\n%s", i, cases[i].want, out);
    free(out);
  }
}
END_TEST

START_TEST(check_ir_and_help) {
  char cmd[8192], *out;
  snprintf(cmd, sizeof cmd, "%s check %s", fusebox(), fbt_path("../examples/heat.fbk"));
  ck_assert_int_eq(sh(cmd, &out), 0);
  ck_assert_msg(strstr(out, "ok ("), "%s", out);
  free(out);
  write_file(
      "e.fbk",
      "layout { dense(i: 4) { place a: f32 } }\nkernel k() {\n  a[0, 1] = 1.0\n  b[0] = 2.0\n}\n");
  snprintf(cmd, sizeof cmd, "%s check %s/e.fbk", fusebox(), tmpdir);
  ck_assert_int_eq(sh(cmd, &out), 1);
  ck_assert_msg(strstr(out, "e.fbk:3:") && strstr(out, "e.fbk:4:") && strstr(out, "^"), "%s", out);
  free(out);
  write_file("k.fbk", prog);
  snprintf(cmd, sizeof cmd, "%s check %s/k.fbk", fusebox(), tmpdir);
  ck_assert_int_eq(sh(cmd, &out), 1);
  ck_assert_msg(strstr(out, "${K} is not a parameter") && strstr(out, "--param"), "%s", out);
  free(out);
  snprintf(cmd, sizeof cmd, "%s check %s/k.fbk --param K=4", fusebox(), tmpdir);
  ck_assert_int_eq(sh(cmd, &out), 0);
  free(out);
  /* interleaved fields: a warning with the fix, and the check still passes */
  write_file("w.fbk", "layout {\n  dense(ij: 8, 8) { place x: f32, y: f32 }\n}\n");
  snprintf(cmd, sizeof cmd, "%s check %s/w.fbk", fusebox(), tmpdir);
  ck_assert_int_eq(sh(cmd, &out), 0);
  ck_assert_msg(strstr(out, "w.fbk:2:3: warning: 2 fields ('x', 'y') are interleaved") &&
                    strstr(out, "'field x: f32 (ij: 8, 8)'") && strstr(out, "ok ("),
                "%s", out);
  free(out);
  snprintf(cmd, sizeof cmd, "%s ir %s --kernel saxpy --bind x,y", fusebox(),
           fbt_path("../examples/saxpy.fbk"));
  ck_assert_int_eq(sh(cmd, &out), 0);
  ck_assert_msg(strstr(out, "kernel \"saxpy[x,y]\"") &&
                    strstr(out, "# task 0 of saxpy[x,y]: struct_for"),
                "%s", out);
  free(out);
  const char *cmds[] = {"check", "ir", "run", "bench", "graph", "ping", "stats"};
  for (int i = 0; i < 7; i++) {
    snprintf(cmd, sizeof cmd, "%s %s --help", fusebox(), cmds[i]);
    ck_assert_int_eq(sh(cmd, &out), 0);
    ck_assert_msg(strstr(out, "usage: fusebox") && strstr(out, "example"), "%s", out);
    free(out);
  }
  snprintf(cmd, sizeof cmd, "%s frobnicate", fusebox());
  ck_assert_int_eq(sh(cmd, &out), 2);
  ck_assert_msg(strstr(out, "unknown command 'frobnicate'"), "%s", out);
  free(out);
}
END_TEST

/* The conventions of a command line: --version, help COMMAND, check on a
 * session, clear errors for unknown commands. */
START_TEST(cli_conventions) {
  char cmd[8192], *out;
  const char *vs[] = {"--version", "-V", "version"};
  for (int i = 0; i < 3; i++) {
    snprintf(cmd, sizeof cmd, "%s %s", fusebox(), vs[i]);
    ck_assert_int_eq(sh(cmd, &out), 0);
    int maj = -1, min = -1;
    ck_assert_msg(sscanf(out, "fusebox %d.%d", &maj, &min) == 2 && maj >= 0 && min >= 0, "%s", out);
    free(out);
  }
  const char *cmds[] = {"check", "ir", "run", "bench", "graph", "ping", "stats"};
  for (int i = 0; i < 7; i++) { /* help CMD: that command's help, on stdout */
    snprintf(cmd, sizeof cmd, "{ %s help %s 2>/dev/null; }", fusebox(), cmds[i]);
    ck_assert_int_eq(sh(cmd, &out), 0);
    char want[64];
    snprintf(want, sizeof want, "usage: fusebox %s ", cmds[i]);
    ck_assert_msg(strstr(out, want), "help %s:\n%s", cmds[i], out);
    free(out);
  }
  snprintf(cmd, sizeof cmd, "%s help frobnicate", fusebox());
  ck_assert_int_eq(sh(cmd, &out), 2);
  ck_assert_msg(strstr(out, "unknown command 'frobnicate'") && strstr(out, "fusebox help"), "%s",
                out);
  free(out);
  snprintf(cmd, sizeof cmd, "%s --frobnicate", fusebox());
  ck_assert_int_eq(sh(cmd, &out), 2);
  ck_assert_msg(strstr(out, "unknown option '--frobnicate'"), "%s", out);
  free(out);
  /* check SESSION.json: the session and the program it names */
  snprintf(cmd, sizeof cmd, "%s check %s", fusebox(), fbt_path("../examples/heat.json"));
  ck_assert_int_eq(sh(cmd, &out), 0);
  ck_assert_msg(strstr(out, "heat.json: ok (program ") && strstr(out, "heat.fbk"), "%s", out);
  free(out);
  write_file("e.fbk", "layout { dense(i: 4) { place a: f32 } }\nkernel k() {\n  b[0] = 2.0\n}\n");
  write_file("e.json", "{ \"program\": \"e.fbk\", \"step\": [ {\"launch\": \"k\"} ] }\n");
  snprintf(cmd, sizeof cmd, "%s check %s/e.json", fusebox(), tmpdir);
  ck_assert_int_eq(sh(cmd, &out), 1);
  ck_assert_msg(strstr(out, "e.fbk:3:3: error: unknown field 'b'"), "%s", out);
  free(out);
  write_file("k.fbk", prog);
  write_file("kk.json", "{ \"program\": \"k.fbk\", \"session\": {\"mdoe\": 1} }\n");
  snprintf(cmd, sizeof cmd, "%s check %s/kk.json --param K=2", fusebox(), tmpdir);
  ck_assert_int_eq(sh(cmd, &out), 1);
  ck_assert_msg(strstr(out, "$.session.mdoe: unknown key"), "%s", out);
  free(out);
  write_file("kp.json", "{ \"program\": \"k.fbk\" }\n");
  snprintf(cmd, sizeof cmd, "%s check %s/kp.json", fusebox(), tmpdir);
  ck_assert_int_eq(sh(cmd, &out), 1);
  ck_assert_msg(strstr(out, "${K} is not a parameter") && strstr(out, "--param"), "%s", out);
  free(out);
  snprintf(cmd, sizeof cmd, "%s check %s/kp.json --param K=2", fusebox(), tmpdir);
  ck_assert_int_eq(sh(cmd, &out), 0);
  free(out);
  /* the last line gives the time the run took; no progress line on a
   * stderr that is not a terminal, nor with --quiet on one */
  snprintf(cmd, sizeof cmd, "%s run %s --local", fusebox(), fbt_path("../examples/saxpy.json"));
  ck_assert_int_eq(sh(cmd, &out), 0);
  double secs = -1;
  const char *last = strstr(out, "saxpy: all checks passed (");
  ck_assert_msg(last && sscanf(last, "saxpy: all checks passed (%lf s)", &secs) == 1 && secs >= 0,
                "%s", out);
  ck_assert_msg(!strstr(out, " launches ("), "%s", out);
  free(out);
  if (sh("command -v script", NULL) == 0) {
    snprintf(cmd, sizeof cmd, "script -qec '%s run %s --local --quiet' /dev/null", fusebox(),
             fbt_path("../examples/saxpy.json"));
    ck_assert_int_eq(sh(cmd, &out), 0);
    ck_assert_msg(strstr(out, "all checks passed (") && !strstr(out, " launches ("), "%s", out);
    free(out);
  }
  /* no server anywhere: ping says how to give one */
  snprintf(cmd, sizeof cmd, "env -u FUSEBOX_SERVER %s ping", fusebox());
  ck_assert_int_eq(sh(cmd, &out), 2);
  ck_assert_msg(strstr(out, "FUSEBOX_SERVER"), "%s", out);
  free(out);
}
END_TEST

START_TEST(bench_modes_and_json) {
  write_file("p.fbk", prog);
  write_file("b.json",
             "{ \"name\": \"pb\", \"program\": \"p.fbk\", \"params\": {\"K\": 2},\n"
             "  \"step\": [ {\"launch\": \"fill\", \"args\": [1.0]}, {\"launch\": \"sum\"} ],\n"
             "  \"bench\": { \"warmup\": 1, \"repeat\": 2, \"modes\": [\"sync\", \"async\"] },\n"
             "  \"checks\": [ {\"read\": \"total\", \"equals\": 36.0},\n"
             "              {\"same_across_modes\": [\"a\", \"n\", \"total\"]} ] }\n");
  char cmd[8192], *out;
  snprintf(cmd, sizeof cmd, "%s bench %s/b.json %s/b.json --json %s/out.json --csv %s/out.csv",
           fusebox(), tmpdir, tmpdir, tmpdir, tmpdir);
  int rc = sh(cmd, &out);
  ck_assert_msg(rc == 0, "rc %d\n%s", rc, out);
  ck_assert_msg(strstr(out, "geometric mean over 2 cases") && strstr(out, "[2/2] pb: async (2/2)"),
                "%s", out);
  free(out);
  char path[512];
  snprintf(path, sizeof path, "%s/out.json", tmpdir);
  char *js = fbt_read_file(path, NULL);
  ck_assert_ptr_nonnull(js);
  ck_assert_msg(strstr(js, "\"tasks_launched\": 4,") && strstr(js, "\"geomean\"") &&
                    strstr(js, "\"checks_passed\": true") && strstr(js, "\"statements_emitted\"") &&
                    strstr(js, "\"cpu_s\"") && strstr(js, "\"tasks_per_timed_step\"") &&
                    strstr(js, "\"fuse_refused\": 0") && strstr(js, "\"fuse_fallbacks\": 0") &&
                    strstr(js, "\"timed_compile_s\""),
                "%s", js);
  /* every kernel compiled in the first step: the timed steps compiled none
   * (the counters of the timed steps alone, not of the whole run) */
  int zero = 0, any = 0;
  for (const char *q = js; (q = strstr(q, "\"timed_tasks_compiled\": ")); q++, any++)
    zero += !strncmp(q + strlen("\"timed_tasks_compiled\": "), "0,", 2);
  ck_assert_msg(any == 4 && zero == 4, "2 cases x 2 modes: %d figures, %d zero\n%s", any, zero,
                js);
  free(js);
  snprintf(path, sizeof path, "%s/out.csv", tmpdir);
  char *csv = fbt_read_file(path, NULL);
  ck_assert_msg(csv && strstr(csv, "case,mode,wall_s") && strstr(csv, "\npb,async,"), "%s", csv);
  free(csv);
  /* --threads: the in-process CPU device gets that many threads, and the
   * JSON says so; refused with a server, and a count that is not one */
  snprintf(cmd, sizeof cmd, "%s bench %s/b.json --local --threads 1 --modes sync --json %s/t.json",
           fusebox(), tmpdir, tmpdir);
  rc = sh(cmd, &out);
  ck_assert_msg(rc == 0, "rc %d\n%s", rc, out);
  free(out);
  snprintf(path, sizeof path, "%s/t.json", tmpdir);
  js = fbt_read_file(path, NULL);
  ck_assert_msg(js && strstr(js, "\"engine_device\": \"CPU (1 threads)\"") &&
                    strstr(js, "\"cpu_threads\": 1"),
                "%s", js);
  free(js);
  snprintf(cmd, sizeof cmd, "%s bench %s/b.json --threads 2 --server unix:%s/none.sock", fusebox(),
           tmpdir, tmpdir);
  ck_assert_int_eq(sh(cmd, &out), 2);
  ck_assert_msg(strstr(out, "--threads sets the in-process engine's threads"), "%s", out);
  free(out);
  snprintf(cmd, sizeof cmd, "%s bench %s/b.json --local --repeat 2x", fusebox(), tmpdir);
  ck_assert_int_eq(sh(cmd, &out), 2);
  ck_assert_msg(strstr(out, "--repeat: '2x' is not a whole number from 1"), "%s", out);
  free(out);
  /* a check failing in every mode: exit 1, naming the case and the mode */
  write_file("bf.json",
             "{ \"name\": \"bad\", \"program\": \"p.fbk\", \"params\": {\"K\": 2},\n"
             "  \"step\": [ {\"launch\": \"sum\"} ], \"bench\": { \"warmup\": 0, \"repeat\": 1 },\n"
             "  \"checks\": [ {\"read\": \"total\", \"equals\": 5.0} ] }\n");
  snprintf(cmd, sizeof cmd, "%s bench %s/bf.json --modes sync,async-no-fusion", fusebox(), tmpdir);
  ck_assert_int_eq(sh(cmd, &out), 1);
  ck_assert_msg(strstr(out, "FAIL  bad: 1 check failed in mode async-no-fusion"), "%s", out);
  free(out);
  snprintf(cmd, sizeof cmd, "%s bench %s/bf.json --modes sync,turbo", fusebox(), tmpdir);
  ck_assert_int_eq(sh(cmd, &out), 2);
  ck_assert_msg(strstr(out, "unknown mode 'turbo'"), "%s", out);
  free(out);
}
END_TEST

/* Equal values agree across modes, infinities and NaN at the
 * same place included (inf - inf is NaN, which once read as a difference). */
START_TEST(bench_equal_infinities) {
  write_file("inf.fbk", "layout { dense(i: 4) { place q: f32 } }\n"
                        "kernel div(z: f32) { for i in q { q[i] = f32(i - 1) / z } }\n");
  write_file("inf.json",
             "{ \"name\": \"inf\", \"program\": \"inf.fbk\",\n"
             "  \"step\": [ {\"launch\": \"div\", \"args\": [0.0]} ],\n"
             "  \"bench\": { \"warmup\": 0, \"repeat\": 1, \"modes\": [\"sync\", \"async\"] },\n"
             "  \"checks\": [ {\"same_across_modes\": [\"q\"]} ] }\n");
  char cmd[8192], *out;
  snprintf(cmd, sizeof cmd, "%s bench %s/inf.json", fusebox(), tmpdir);
  int rc = sh(cmd, &out);
  /* q = -inf, nan, inf, inf in both modes */
  ck_assert_msg(rc == 0 && !strstr(out, "differs"), "rc %d\n%s", rc, out);
  free(out);
}
END_TEST

/* A u64 argument above 2^63-1, which a JSON number cannot carry,
 * given as a decimal string, in the file and through --param; bad integer
 * strings are refused naming the type with its article. */
START_TEST(u64_beyond_json_integers) {
  write_file("u.fbk",
             "layout { dense(i: 2) { place r: i32 } }\n"
             "kernel low(v: u64) { for i in r { r[i] = i32(v % u64(1000)) + i32(v >> u64(60)) } }\n"
             "kernel neg(v: i32) { for i in r { r[i] = v } }\n");
  char *out;
  /* 18446744073709551615 % 1000 = 615, >> 60 = 15 (clamped to 2^63-1 it
   * would give 807 + 7; rounded through a double, 616 + 0) */
  int rc =
      run_session("u.json",
                  "{ \"program\": \"u.fbk\",\n"
                  "  \"step\": [ {\"launch\": \"low\", \"args\": [\"18446744073709551615\"]} ],\n"
                  "  \"checks\": [ {\"read\": \"r\", \"equals\": 630} ] }\n",
                  &out);
  ck_assert_msg(rc == 0, "rc %d: %s", rc, out);
  free(out);
  write_file("up.json", "{ \"program\": \"u.fbk\", \"params\": {\"BIG\": 1},\n"
                        "  \"step\": [ {\"launch\": \"low\", \"args\": [\"${BIG}\"]},\n"
                        "            {\"launch\": \"neg\", \"args\": [\"-2147483648\"]} ],\n"
                        "  \"checks\": [ {\"read\": \"r\", \"equals\": -2147483648} ] }\n");
  char cmd[8192];
  snprintf(cmd, sizeof cmd, "%s run %s/up.json --param BIG=18446744073709551615", fusebox(),
           tmpdir);
  rc = sh(cmd, &out);
  ck_assert_msg(rc == 0, "rc %d: %s", rc, out);
  free(out);
  /* the same u64 through --param alone: r = 630 */
  write_file("up2.json", "{ \"program\": \"u.fbk\", \"params\": {\"BIG\": 1},\n"
                         "  \"step\": [ {\"launch\": \"low\", \"args\": [\"${BIG}\"]} ],\n"
                         "  \"checks\": [ {\"read\": \"r\", \"equals\": 630} ] }\n");
  snprintf(cmd, sizeof cmd, "%s run %s/up2.json --param BIG=18446744073709551615", fusebox(),
           tmpdir);
  rc = sh(cmd, &out);
  ck_assert_msg(rc == 0, "rc %d: %s", rc, out);
  free(out);
  struct {
    const char *arg, *want;
  } bad[] = {
      {"\"18446744073709551616\"", "parameter 'v' needs a u64 value"},
      {"\"-1\"", "parameter 'v' needs a u64 value"},
      {"\"12abc\"", "parameter 'v' needs a u64 value"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    char json[1024];
    snprintf(json, sizeof json,
             "{ \"program\": \"u.fbk\", \"step\": [ {\"launch\": \"low\", \"args\": [%s]} ] }\n",
             bad[i].arg);
    rc = run_session("ub.json", json, &out);
    ck_assert_msg(rc == 2 && strstr(out, bad[i].want), "%s: rc %d: %s", bad[i].arg, rc, out);
    free(out);
  }
  rc = run_session("ui.json",
                   "{ \"program\": \"u.fbk\", \"step\": [ {\"launch\": \"neg\", \"args\": "
                   "[\"2147483648\"]} ] }\n",
                   &out);
  ck_assert_msg(rc == 2 && strstr(out, "parameter 'v' needs an i32 value"), "rc %d: %s", rc, out);
  free(out);
}
END_TEST

START_TEST(graph_and_trace) {
  write_file("p.fbk", prog);
  write_file(
      "g.json",
      "{ \"program\": \"p.fbk\", \"params\": {\"K\": 1}, \"session\": {\"mode\": \"async\"},\n"
      "  \"step\": [ {\"launch\": \"fill\", \"args\": [1.0]}, {\"launch\": \"fill\", \"args\": "
      "[2.0]},\n"
      "            {\"sync\": true} ],\n"
      "  \"checks\": [ {\"read\": \"a\", \"sum\": 44.0} ] }\n");
  char cmd[8192], *out;
  snprintf(cmd, sizeof cmd, "%s graph %s/g.json --out %s/graphs", fusebox(), tmpdir, tmpdir);
  ck_assert_msg(sh(cmd, &out) == 0 && strstr(out, "graphs written"), "%s", out);
  free(out);
  char path[512];
  snprintf(path, sizeof path, "%s/graphs/flush1-000-it00-window-before.dot", tmpdir);
  char *dot = fbt_read_file(path, NULL);
  ck_assert_msg(dot && strstr(dot, "digraph"), "no DOT at %s", path);
  free(dot);
  snprintf(cmd, sizeof cmd, "ls %s/graphs | grep -c fuse-after", tmpdir);
  ck_assert_int_eq(sh(cmd, &out), 0);
  ck_assert_int_ge(atoi(out), 1);
  free(out);
  snprintf(cmd, sizeof cmd, "%s run %s/g.json --trace %s/t.json", fusebox(), tmpdir, tmpdir);
  ck_assert_int_eq(sh(cmd, &out), 0);
  free(out);
  snprintf(path, sizeof path, "%s/t.json", tmpdir);
  char *tj = fbt_read_file(path, NULL);
  ck_assert_msg(tj && strstr(tj, "\"traceEvents\"") && strstr(tj, "\"ph\""), "%s",
                tj ? tj : "none");
  free(tj);
  /* the graph exists in async mode only: sync refuses clearly */
  snprintf(cmd, sizeof cmd, "%s run %s/g.json --mode sync --graph %s/g2", fusebox(), tmpdir,
           tmpdir);
  ck_assert_int_eq(sh(cmd, &out), 2);
  ck_assert_msg(strstr(out, "async mode only"), "%s", out);
  free(out);
}
END_TEST

/* Start a fuseboxd on unix:TMPDIR/NAME (sock gets the address); its pid. */
/* env: assignments for its environment ("" for none). */
static int start_fuseboxd_env(const char *env, const char *name, char *sock, size_t n) {
  char cmd[8192], *out;
  snprintf(sock, n, "unix:%s/%s", tmpdir, name);
  const char *b = getenv("FB_BUILD_DIR");
  snprintf(cmd, sizeof cmd,
           "%s %s/server/fuseboxd --listen %s --log-level warn </dev/null >/dev/null 2>&1 & echo $!",
           env, b ? b : "build", sock);
  ck_assert_int_eq(sh(cmd, &out), 0);
  int pid = atoi(out);
  free(out);
  ck_assert_int_gt(pid, 0);
  int up = 0;
  for (int i = 0; i < 100 && !up; i++) {
    snprintf(cmd, sizeof cmd, "%s ping --server %s", fusebox(), sock);
    up = sh(cmd, &out) == 0 && strstr(out, "SERVING");
    free(out);
    if (!up) usleep(50000);
  }
  ck_assert_msg(up, "fuseboxd did not come up on %s", sock);
  return pid;
}

static int start_fuseboxd(const char *name, char *sock, size_t n) {
  return start_fuseboxd_env("", name, sock, n);
}

/* ... with these flags (after --listen). */
static int start_fuseboxd_flags(const char *flags, const char *name, char *sock, size_t n) {
  char cmd[8192], *out;
  snprintf(sock, n, "unix:%s/%s", tmpdir, name);
  const char *b = getenv("FB_BUILD_DIR");
  snprintf(cmd, sizeof cmd,
           "%s/server/fuseboxd --listen %s --log-level warn %s </dev/null >/dev/null 2>&1 & echo $!",
           b ? b : "build", sock, flags);
  ck_assert_int_eq(sh(cmd, &out), 0);
  int pid = atoi(out);
  free(out);
  ck_assert_int_gt(pid, 0);
  int up = 0;
  for (int i = 0; i < 100 && !up; i++) {
    snprintf(cmd, sizeof cmd, "%s ping --server %s", fusebox(), sock);
    up = sh(cmd, &out) == 0 && strstr(out, "SERVING");
    free(out);
    if (!up) usleep(50000);
  }
  ck_assert_msg(up, "fuseboxd did not come up on %s", sock);
  return pid;
}

/* A kernel that reads out of bounds fails `fusebox run` and `fusebox
 * bench` on every path (in this process, on a private fuseboxd, on a
 * running one), in sync and async mode, and every path says the same: the
 * kernel, the launch number and the JSON path of the action. */
START_TEST(launch_errors_fail_every_path) {
  write_file("oob.fbk", "layout { dense(ij: 8, 8) { place u: f32, v: f32 } }\n"
                        "kernel init() { for i, j in u { u[i, j] = 0.0\n v[i, j] = 1.0 } }\n"
                        "kernel drift() { for i, j in u { u[i, j] += v[i + 1, j] } }\n");
  write_file(
      "oob.json",
      "{ \"name\": \"oob\", \"program\": \"oob.fbk\", \"setup\": [ {\"launch\": \"init\"} ],\n"
      "  \"step\": [ {\"launch\": \"init\"}, {\"repeat\": 2, \"do\": [{\"launch\": \"drift\"}]},\n"
      "            {\"launch\": \"init\"} ],\n"
      "  \"bench\": { \"warmup\": 0, \"repeat\": 1 },\n"
      "  \"checks\": [ {\"read\": \"v\", \"sum\": 64.0} ] }\n");
  char sock[512], server[600], cmd[8192], *out;
  int pid = start_fuseboxd("oob.sock", sock, sizeof sock);
  snprintf(server, sizeof server, "--server %s", sock);
  const char *paths[] = {"--local", "", server};
  const char *modes[] = {"sync", "async"};
  /* launch #3: setup's init, the step's init, then the first drift */
  const char *want =
      "$.step[1].do[0]: kernel 'drift' (launch #3 of the session) indexed a field out of bounds";
  for (int p = 0; p < 3; p++)
    for (int m = 0; m < 2; m++) {
      snprintf(cmd, sizeof cmd, "%s run %s/oob.json %s --mode %s", fusebox(), tmpdir, paths[p],
               modes[m]);
      int rc = sh(cmd, &out);
      ck_assert_msg(rc == 2 && strstr(out, want) && !strstr(out, "all checks passed"),
                    "%s: rc %d\n%s", cmd, rc, out);
      free(out);
    }
  /* -v waits for each return value: the same error */
  snprintf(cmd, sizeof cmd, "%s run %s/oob.json -v --mode async", fusebox(), tmpdir);
  ck_assert_int_eq(sh(cmd, &out), 2);
  ck_assert_msg(strstr(out, want), "%s", out);
  free(out);
  for (int p = 0; p < 3; p += 2) { /* bench: in this process and on a fuseboxd */
    snprintf(cmd, sizeof cmd, "%s bench %s/oob.json %s --modes sync,async", fusebox(), tmpdir,
             p ? server : "");
    int rc = sh(cmd, &out);
    char ws[512], wa[512];
    snprintf(ws, sizeof ws, "oob, mode sync: %s", want);
    snprintf(wa, sizeof wa, "oob, mode async: %s", want);
    ck_assert_msg(rc == 2 && strstr(out, ws) && strstr(out, wa), "%s: rc %d\n%s", cmd, rc, out);
    free(out);
  }
  snprintf(cmd, sizeof cmd, "kill %d", pid);
  ck_assert_int_eq(sh(cmd, NULL), 0);
}
END_TEST

/* The runner resolves an action once (its path, kernel and arguments) and
 * launches from that on every later run of it (cli/cli_session.c,
 * act_memo): an error on a later run still names that action, with the
 * launch number counted over every run, in both modes and in bench. */
START_TEST(repeated_action_errors_name_their_launch) {
  write_file("rep.fbk", "layout { dense(i: 3) { place u: f32 }\n place n: i32 }\n"
                        "kernel zero() { n[] = 0 }\n"
                        "kernel bump(x: f32) { n[] += 1\n u[n[]] = x }\n");
  write_file("rep.json",
             "{ \"name\": \"rep\", \"program\": \"rep.fbk\",\n"
             "  \"setup\": [ {\"launch\": \"zero\"} ],\n"
             "  \"step\": [ {\"repeat\": 5, \"do\": [ {\"launch\": \"zero\"},\n"
             "              {\"repeat\": 4,\n"
             "               \"do\": [{\"launch\": \"bump\", \"args\": [2.5]}]} ]} ],\n"
             "  \"bench\": { \"warmup\": 0, \"repeat\": 1 },\n"
             "  \"checks\": [ {\"read\": \"u\", \"sum\": 5.0} ] }\n");
  /* setup's zero (#1), the step's zero (#2), bump (#3, #4: u[1], u[2]),
     then the third bump (#5) indexes u[3]: the same action's third run */
  const char *want = "$.step[0].do[1].do[0]: kernel 'bump' (launch #5 of the session) indexed a "
                     "field out of bounds";
  const char *modes[] = {"sync", "async"};
  char cmd[8192], *out;
  for (int m = 0; m < 2; m++) {
    snprintf(cmd, sizeof cmd, "%s run %s/rep.json --local --mode %s", fusebox(), tmpdir, modes[m]);
    int rc = sh(cmd, &out);
    ck_assert_msg(rc == 2 && strstr(out, want), "%s: rc %d\n%s", cmd, rc, out);
    free(out);
  }
  snprintf(cmd, sizeof cmd, "%s bench %s/rep.json --local --modes sync,async", fusebox(), tmpdir);
  ck_assert_int_eq(sh(cmd, &out), 2);
  char ws[512], wa[512];
  snprintf(ws, sizeof ws, "rep, mode sync: %s", want);
  snprintf(wa, sizeof wa, "rep, mode async: %s", want);
  ck_assert_msg(strstr(out, ws) && strstr(out, wa), "%s", out);
  free(out);
  /* fixed so that it stays in bounds: the memoized launches give the
     values a launch resolved afresh each time gives (2.5 in u[1], u[2]) */
  write_file("rep.json",
             "{ \"name\": \"rep\", \"program\": \"rep.fbk\",\n"
             "  \"step\": [ {\"repeat\": 5, \"do\": [ {\"launch\": \"zero\"},\n"
             "              {\"repeat\": 2,\n"
             "               \"do\": [{\"launch\": \"bump\", \"args\": [2.5]}]} ]} ],\n"
             "  \"bench\": { \"warmup\": 0, \"repeat\": 1 },\n"
             "  \"checks\": [ {\"read\": \"u\", \"sum\": 5.0},\n"
             "              {\"read\": \"n\", \"equals\": 2} ] }\n");
  for (int m = 0; m < 2; m++) {
    snprintf(cmd, sizeof cmd, "%s run %s/rep.json --local --mode %s", fusebox(), tmpdir, modes[m]);
    int rc = sh(cmd, &out);
    ck_assert_msg(rc == 0 && strstr(out, "all checks passed"), "%s: rc %d\n%s", cmd, rc, out);
    free(out);
  }
}
END_TEST

/* The front end's warnings (interleaved fields) reach `fusebox run` on
 * every path, on stderr, and fail nothing; `field` lines give none. */
START_TEST(run_prints_layout_warnings) {
  write_file("lw.fbk", "layout {\n  dense(ij: 8, 8) { place u: f32, v: f32 }\n}\n"
                       "kernel init() { for i, j in u { u[i, j] = 1.0\n v[i, j] = 2.0 } }\n");
  write_file("lw.json", "{ \"name\": \"lw\", \"program\": \"lw.fbk\",\n"
                        "  \"step\": [ {\"launch\": \"init\"} ],\n"
                        "  \"checks\": [ {\"read\": \"v\", \"sum\": 128.0} ] }\n");
  write_file("lf.fbk", "layout {\n  field u: f32 (ij: 8, 8)\n  field v: f32 (ij: 8, 8)\n}\n"
                       "kernel init() { for i, j in u { u[i, j] = 1.0\n v[i, j] = 2.0 } }\n");
  write_file("lf.json", "{ \"name\": \"lf\", \"program\": \"lf.fbk\",\n"
                        "  \"step\": [ {\"launch\": \"init\"} ],\n"
                        "  \"checks\": [ {\"read\": \"v\", \"sum\": 128.0} ] }\n");
  char sock[512], server[600], cmd[8192], *out;
  int pid = start_fuseboxd("lw.sock", sock, sizeof sock);
  snprintf(server, sizeof server, "--server %s", sock);
  const char *paths[] = {"--local", "", server};
  for (int p = 0; p < 3; p++) {
    /* stderr only */
    snprintf(cmd, sizeof cmd, "(%s run %s/lw.json -q %s 2>&1 >/dev/null)", fusebox(), tmpdir,
             paths[p]);
    ck_assert_msg(sh(cmd, &out) == 0 &&
                      strstr(out, "lw.fbk:2:3: warning: 2 fields ('u', 'v') are interleaved") &&
                      strstr(out, "'field u: f32 (ij: 8, 8)'"),
                  "%s\n%s", cmd, out);
    free(out);
    snprintf(cmd, sizeof cmd, "%s run %s/lf.json -q %s", fusebox(), tmpdir, paths[p]);
    ck_assert_msg(sh(cmd, &out) == 0 && !strstr(out, "warning") &&
                      strstr(out, "all checks passed"),
                  "%s\n%s", cmd, out);
    free(out);
  }
  /* `fusebox check` of the session prints it too, and passes */
  snprintf(cmd, sizeof cmd, "%s check %s/lw.json", fusebox(), tmpdir);
  ck_assert_int_eq(sh(cmd, &out), 0);
  ck_assert_msg(strstr(out, "lw.fbk:2:3: warning:") && strstr(out, "ok ("), "%s", out);
  free(out);
  snprintf(cmd, sizeof cmd, "kill %d", pid);
  ck_assert_int_eq(sh(cmd, NULL), 0);
}
END_TEST

START_TEST(server_commands) {
  char cmd[8192], *out, sock[512];
  int pid = start_fuseboxd("fbd.sock", sock, sizeof sock);
  snprintf(cmd, sizeof cmd, "%s run %s --server %s", fusebox(), fbt_path("../examples/life.json"),
           sock);
  ck_assert_int_eq(sh(cmd, &out), 0);
  ck_assert_msg(strstr(out, "all checks passed"), "%s", out);
  free(out);
  snprintf(cmd, sizeof cmd, "%s stats --server %s", fusebox(), sock);
  ck_assert_int_eq(sh(cmd, &out), 0);
  ck_assert_msg(strstr(out, "1 created, 1 closed") && strstr(out, "launches "), "%s", out);
  ck_assert_msg(strstr(out, "calls refused at their start: 0 past max_calls, 0 past "
                            "max_calls_per_tenant"),
                "%s", out);
  free(out);
  /* --json: the same figures, as JSON a program can read */
  snprintf(cmd, sizeof cmd, "{ %s stats --server %s --json 2>/dev/null; }", fusebox(), sock);
  ck_assert_int_eq(sh(cmd, &out), 0);
  json_error_t je;
  json_t *js = json_loads(out, 0, &je);
  ck_assert_msg(js, "stats --json is not JSON (%s):\n%s", je.text, out);
  json_t *ss = json_object_get(js, "sessions");
  ck_assert_int_eq(json_integer_value(json_object_get(ss, "created")), 1);
  ck_assert_int_eq(json_integer_value(json_object_get(ss, "closed")), 1);
  ck_assert_int_gt(json_integer_value(json_object_get(js, "launches")), 0);
  ck_assert(json_is_string(json_object_get(json_object_get(js, "server"), "version")));
  ck_assert(json_is_array(json_object_get(js, "session_list")));
  json_t *cr = json_object_get(js, "calls_refused");
  ck_assert(json_is_integer(json_object_get(cr, "max_calls")));
  ck_assert_int_eq(json_integer_value(json_object_get(cr, "max_calls_per_tenant")), 0);
  json_decref(js);
  free(out);
  /* FUSEBOX_SERVER stands for --server: run and stats both use it */
  snprintf(cmd, sizeof cmd, "FUSEBOX_SERVER=%s %s run %s", sock, fusebox(),
           fbt_path("../examples/saxpy.json"));
  ck_assert_int_eq(sh(cmd, &out), 0);
  free(out);
  snprintf(cmd, sizeof cmd, "FUSEBOX_SERVER=%s %s stats", sock, fusebox());
  ck_assert_int_eq(sh(cmd, &out), 0);
  ck_assert_msg(strstr(out, "2 created, 2 closed"), "%s", out);
  free(out);
  /* ... so a wrong one fails the run, naming it; --local ignores it */
  snprintf(cmd, sizeof cmd, "FUSEBOX_SERVER=unix:%s/nobody.sock %s run %s", tmpdir, fusebox(),
           fbt_path("../examples/saxpy.json"));
  ck_assert_int_eq(sh(cmd, &out), 2);
  ck_assert_msg(strstr(out, "nobody.sock"), "%s", out);
  free(out);
  snprintf(cmd, sizeof cmd, "FUSEBOX_SERVER=unix:%s/nobody.sock %s run %s --local", tmpdir,
           fusebox(), fbt_path("../examples/saxpy.json"));
  ck_assert_int_eq(sh(cmd, &out), 0);
  free(out);
  /* the same session in this process gives the same answer */
  snprintf(cmd, sizeof cmd, "%s run %s --local", fusebox(), fbt_path("../examples/life.json"));
  ck_assert_int_eq(sh(cmd, &out), 0);
  free(out);
  snprintf(cmd, sizeof cmd, "kill %d", pid);
  ck_assert_int_eq(sh(cmd, NULL), 0);
  snprintf(cmd, sizeof cmd, "%s ping --server unix:%s/nobody.sock", fusebox(), tmpdir);
  ck_assert_int_eq(sh(cmd, &out), 1);
  free(out);
}
END_TEST

/* run --json: one object a program can read, for a pass, a failed check
 * and an error alike. */
START_TEST(run_json) {
  char cmd[8192], *out;
  snprintf(cmd, sizeof cmd, "{ %s run %s --json 2>/dev/null; }", fusebox(),
           fbt_path("../examples/heat.json"));
  ck_assert_int_eq(sh(cmd, &out), 0);
  json_error_t je;
  json_t *js = json_loads(out, 0, &je);
  ck_assert_msg(js, "run --json is not JSON (%s):\n%s", je.text, out);
  ck_assert_str_eq(json_string_value(json_object_get(js, "outcome")), "passed");
  ck_assert_int_eq(json_integer_value(json_object_get(js, "exit_status")), 0);
  ck_assert(json_real_value(json_object_get(js, "elapsed_s")) > 0);
  ck_assert_int_eq(json_integer_value(json_object_get(json_object_get(js, "counters"), "launches")),
                   201);
  json_t *c0 = json_array_get(json_object_get(js, "checks"), 0);
  ck_assert(json_is_true(json_object_get(c0, "ok")));
  ck_assert_int_eq(json_integer_value(json_object_get(c0, "index")), 0);
  ck_assert_msg(strstr(json_string_value(json_object_get(c0, "message")), "sum(T)"), "%s", out);
  json_decref(js);
  free(out);
  write_file("p.fbk", prog);
  write_file(
      "jf.json",
      "{ \"program\": \"p.fbk\", \"params\": {\"K\": 2},\n"
      "  \"step\": [ {\"launch\": \"fill\", \"args\": [1.0]} ],\n"
      "  \"checks\": [ {\"read\": \"a\", \"sum\": 36.0}, {\"read\": \"a\", \"sum\": 99.0} ] }\n");
  snprintf(cmd, sizeof cmd, "{ %s run %s/jf.json --json 2>/dev/null; }", fusebox(), tmpdir);
  ck_assert_int_eq(sh(cmd, &out), 1);
  js = json_loads(out, 0, &je);
  ck_assert_msg(js, "%s", out);
  ck_assert_str_eq(json_string_value(json_object_get(js, "outcome")), "failed");
  json_t *checks = json_object_get(js, "checks");
  ck_assert_int_eq(json_array_size(checks), 2);
  ck_assert(json_is_true(json_object_get(json_array_get(checks, 0), "ok")));
  ck_assert(json_is_false(json_object_get(json_array_get(checks, 1), "ok")));
  json_decref(js);
  free(out);
  write_file(
      "je.json",
      "{ \"program\": \"p.fbk\", \"params\": {\"K\": 2}, \"step\": [ {\"launch\": \"nope\"} ] }\n");
  snprintf(cmd, sizeof cmd, "{ %s run %s/je.json --json 2>/dev/null; }", fusebox(), tmpdir);
  ck_assert_int_eq(sh(cmd, &out), 2);
  js = json_loads(out, 0, &je);
  ck_assert_msg(js, "%s", out);
  ck_assert_str_eq(json_string_value(json_object_get(js, "outcome")), "error");
  ck_assert_msg(strstr(json_string_value(json_object_get(js, "error")), "no kernel named 'nope'"),
                "%s", out);
  json_decref(js);
  free(out);
}
END_TEST

/* ---------------------------------------------------------------- snapshots */

static const char *snap_prog =
    "layout { dense(ij: 3, 5) { place u: f32 }\n dense(k: 4) { place w: f32 } }\n"
    "kernel init() { for i, j in u { u[i, j] = f32(i * 5 + j) } }\n"
    "kernel bump() { for i, j in u { u[i, j] += 1.0 } }\n";

/* The f32 values of a .npy file written by fusebox (n of them). */
static void read_npy_f32(const char *path, float *v, size_t n) {
  FILE *f = fopen(path, "rb");
  ck_assert_msg(f != NULL, "%s is missing", path);
  unsigned char head[10];
  ck_assert_int_eq(fread(head, 1, 10, f), 10);
  ck_assert_int_eq(fseek(f, 10 + head[8] + 256 * head[9], SEEK_SET), 0);
  ck_assert_int_eq(fread(v, sizeof *v, n, f), n);
  fclose(f);
}

/* A PNG read back with libpng, as 8-bit RGB. */
static unsigned char *read_png(const char *path, unsigned *w, unsigned *h) {
  png_image img;
  memset(&img, 0, sizeof img);
  img.version = PNG_IMAGE_VERSION;
  ck_assert_msg(png_image_begin_read_from_file(&img, path), "%s: %s", path, img.message);
  img.format = PNG_FORMAT_RGB;
  unsigned char *buf = malloc(PNG_IMAGE_SIZE(img));
  ck_assert_msg(png_image_finish_read(&img, NULL, buf, 0, NULL), "%s: %s", path, img.message);
  *w = img.width;
  *h = img.height;
  return buf;
}

static void assert_pixel(const unsigned char *buf, unsigned w, unsigned x, unsigned y, int r, int g,
                         int b) {
  const unsigned char *p = buf + 3 * (y * w + x);
  ck_assert_msg(p[0] == r && p[1] == g && p[2] == b,
                "pixel (%u, %u) is (%d, %d, %d), expected (%d, %d, %d)", x, y, p[0], p[1], p[2], r,
                g, b);
}

/* save ... every N: {step} and {step:03d} in the name, .npy arrays and .png
 * pictures (a given range with the gray map: exact values; the automatic
 * range with viridis: its ends and middle), on a private fuseboxd and in
 * this process alike; --output-dir; bench skips saves. */
START_TEST(snapshots_and_pictures) {
  write_file("snap.fbk", snap_prog);
  write_file("snap.json", "{ \"program\": \"snap.fbk\", \"setup\": [ {\"launch\": \"init\"} ],\n"
                          "  \"step\": [ {\"repeat\": 4, \"do\": [ {\"launch\": \"bump\"},\n"
                          "      {\"save\": \"u\", \"to\": \"u_{step:03d}.npy\", \"every\": 2},\n"
                          "      {\"save\": \"u\", \"to\": \"u_{step}.png\", \"range\": [0, 51], "
                          "\"colormap\": \"gray\"} ]} ],\n"
                          "  \"checks\": [ {\"read\": \"u\", \"to\": \"auto.png\"} ] }\n");
  const char *paths[] = {"", "--local"};
  for (int p = 0; p < 2; p++) {
    char cmd[8192], dir[512], file[600], *out;
    snprintf(dir, sizeof dir, "%s/out%d", tmpdir, p);
    snprintf(cmd, sizeof cmd, "%s run %s/snap.json -o %s %s", fusebox(), tmpdir, dir, paths[p]);
    ck_assert_msg(sh(cmd, &out) == 0, "%s", out);
    free(out);
    /* every 2: the 2nd and 4th time only, after 2 and 4 bumps */
    snprintf(file, sizeof file, "%s/u_001.npy", dir);
    ck_assert(access(file, F_OK) != 0);
    snprintf(file, sizeof file, "%s/u_003.npy", dir);
    ck_assert(access(file, F_OK) != 0);
    float v[15];
    for (int k = 2; k <= 4; k += 2) {
      snprintf(file, sizeof file, "%s/u_%03d.npy", dir, k);
      read_npy_f32(file, v, 15);
      for (int i = 0; i < 15; i++) ck_assert_float_eq(v[i], (float)(i + k));
    }
    /* u_1.png .. u_4.png: 5 wide, 3 high; gray over [0, 51]: 5 per unit */
    for (int k = 1; k <= 4; k++) {
      unsigned w, h;
      snprintf(file, sizeof file, "%s/u_%d.png", dir, k);
      unsigned char *px = read_png(file, &w, &h);
      ck_assert_uint_eq(w, 5);
      ck_assert_uint_eq(h, 3);
      for (unsigned y = 0; y < 3; y++)
        for (unsigned x = 0; x < 5; x++) {
          int g = 5 * (int)(y * 5 + x + (unsigned)k);
          assert_pixel(px, w, x, y, g, g, g);
        }
      free(px);
    }
    /* viridis over the field's own range [4, 18]: row 0 on top */
    unsigned w, h;
    snprintf(file, sizeof file, "%s/auto.png", dir);
    unsigned char *px = read_png(file, &w, &h);
    assert_pixel(px, w, 0, 0, 68, 1, 84);     /* 4: the low end */
    assert_pixel(px, w, 2, 1, 33, 145, 140);  /* 11: the middle */
    assert_pixel(px, w, 4, 2, 253, 231, 37);  /* 18: the high end */
    free(px);
  }
  /* the same arrays on both paths */
  char cmd[8192], *out;
  snprintf(cmd, sizeof cmd,
           "cmp %s/out0/u_004.npy %s/out1/u_004.npy && cmp %s/out0/u_3.png %s/out1/u_3.png", tmpdir,
           tmpdir, tmpdir, tmpdir);
  ck_assert_int_eq(sh(cmd, NULL), 0);
  /* bench times the step: no snapshots (they would land beside snap.json) */
  snprintf(cmd, sizeof cmd, "%s bench %s/snap.json --local --modes sync --warmup 0 --repeat 1",
           fusebox(), tmpdir);
  ck_assert_msg(sh(cmd, &out) == 0, "%s", out);
  free(out);
  char file[600];
  snprintf(file, sizeof file, "%s/u_1.png", tmpdir);
  ck_assert_msg(access(file, F_OK) != 0, "bench saved %s", file);
}
END_TEST

/* Checkpoints of a local run (docs/checkpoint.md "The CLI"): a run that
 * resumes from a --checkpoint-every file, or from a {"checkpoint": F}
 * action through "session": {"resume": F}, ends with the same fields,
 * byte for byte, as one never interrupted (sync and async; random(),
 * pointer cells that come and go); the last two files are kept; a
 * modified file, a key readable by others and --server are refused. */
static const char *ckpt_prog =
    "layout {\n"
    "  dense(i: 64) { place u: f32 }\n"
    "  pointer(i: 8) as pb { dense(i: 8) { place p: i32 } }\n"
    "  place t: i32\n"
    "}\n"
    "kernel bump() {\n"
    "  t[] += 1\n"
    "  for i in 0 .. 64 {\n"
    "    u[i] = u[i] * 0.5 + random()\n"
    "    if (i + t[]) % 5 == 0 { p[i] += t[] }\n"
    "  }\n"
    "  for b in 0 .. 8 { if (b + t[]) % 4 == 0 { deactivate(pb, b) } }\n"
    "}\n";

START_TEST(checkpoint_resume) {
  write_file("ck.fbk", ckpt_prog);
  const char *modes[] = {"sync", "async"};
  for (int m = 0; m < 2; m++) {
    char json[2048], cmd[8192], *out;
    snprintf(json, sizeof json,
             "{ \"name\": \"ck\", \"program\": \"ck.fbk\", \"session\": {\"mode\": \"%s\", "
             "\"seed\": 5},\n"
             "  \"step\": [ {\"repeat\": 30, \"do\": [ {\"launch\": \"bump\"} ]},\n"
             "             {\"checkpoint\": \"mid.fbck\"},\n"
             "             {\"repeat\": 10, \"do\": [ {\"launch\": \"bump\"} ]} ],\n"
             "  \"checks\": [ {\"read\": \"u\", \"to\": \"u.npy\"}, {\"read\": \"p\", \"to\": "
             "\"p.npy\"} ] }\n",
             modes[m]);
    write_file("ck.json", json);
    const char *env = "XDG_CONFIG_HOME=";
    /* uninterrupted, with checkpoints every 7 launches */
    snprintf(cmd, sizeof cmd,
             "%s%s/cfg %s run %s/ck.json --local -o %s/a%d --checkpoint-every 7 "
             "--checkpoint-dir %s/ck%d",
             env, tmpdir, fusebox(), tmpdir, tmpdir, m, tmpdir, m);
    ck_assert_msg(sh(cmd, &out) == 0, "%s", out);
    free(out);
    /* 40 launches: files at 7 .. 35, the last two kept */
    char f1[600], f2[600];
    snprintf(f1, sizeof f1, "%s/ck%d/ck-000000000028.fbck", tmpdir, m);
    snprintf(f2, sizeof f2, "%s/ck%d/ck-000000000035.fbck", tmpdir, m);
    ck_assert_msg(access(f1, F_OK) == 0 && access(f2, F_OK) == 0, "no %s or %s", f1, f2);
    snprintf(cmd, sizeof cmd, "ls %s/ck%d | wc -l", tmpdir, m);
    ck_assert_int_eq(sh(cmd, &out), 0);
    ck_assert_int_eq(atoi(out), 2);
    free(out);
    /* resume from launch 28 (inside the first repeat) and from 35 (after the action) */
    const char *from[2] = {f1, f2};
    for (int k = 0; k < 2; k++) {
      snprintf(cmd, sizeof cmd, "%s%s/cfg %s run %s/ck.json --resume %s -o %s/r%d%d", env, tmpdir,
               fusebox(), tmpdir, from[k], tmpdir, m, k);
      ck_assert_msg(sh(cmd, &out) == 0, "%s", out);
      free(out);
      snprintf(cmd, sizeof cmd, "cmp %s/a%d/u.npy %s/r%d%d/u.npy && cmp %s/a%d/p.npy %s/r%d%d/p.npy",
               tmpdir, m, tmpdir, m, k, tmpdir, m, tmpdir, m, k);
      ck_assert_msg(sh(cmd, &out) == 0, "resumed from %s: %s", from[k], out);
      free(out);
    }
    /* the action's checkpoint, through session.resume */
    snprintf(json, sizeof json,
             "{ \"name\": \"ck\", \"program\": \"ck.fbk\", \"session\": {\"resume\": "
             "\"a%d/mid.fbck\"},\n"
             "  \"step\": [ {\"repeat\": 30, \"do\": [ {\"launch\": \"bump\"} ]},\n"
             "             {\"repeat\": 10, \"do\": [ {\"launch\": \"bump\"} ]} ],\n"
             "  \"checks\": [ {\"read\": \"u\", \"to\": \"u.npy\"} ] }\n",
             m);
    write_file("ck2.json", json);
    snprintf(cmd, sizeof cmd, "%s%s/cfg %s run %s/ck2.json --local -o %s/s%d", env, tmpdir,
             fusebox(), tmpdir, tmpdir, m);
    ck_assert_msg(sh(cmd, &out) == 0, "%s", out);
    free(out);
    snprintf(cmd, sizeof cmd, "cmp %s/a%d/u.npy %s/s%d/u.npy", tmpdir, m, tmpdir, m);
    ck_assert_msg(sh(cmd, &out) == 0, "%s", out);
    free(out);
  }
  /* a modified checkpoint */
  char cmd[8192], *out;
  snprintf(cmd, sizeof cmd,
           "cp %s/ck0/ck-000000000035.fbck %s/bad.fbck && printf 'X' | dd of=%s/bad.fbck bs=1 "
           "seek=300 conv=notrunc 2>/dev/null && XDG_CONFIG_HOME=%s/cfg %s run %s/ck.json "
           "--resume %s/bad.fbck -o %s/bad",
           tmpdir, tmpdir, tmpdir, tmpdir, fusebox(), tmpdir, tmpdir, tmpdir);
  ck_assert_int_eq(sh(cmd, &out), 2);
  ck_assert_msg(strstr(out, "the checkpoint was modified or was written with another server key"),
                "%s", out);
  free(out);
  /* another key */
  snprintf(cmd, sizeof cmd,
           "head -c 40 /dev/urandom > %s/other.key && chmod 600 %s/other.key && %s run %s/ck.json "
           "--checkpoint-key %s/other.key --resume %s/ck0/ck-000000000035.fbck -o %s/bad",
           tmpdir, tmpdir, fusebox(), tmpdir, tmpdir, tmpdir, tmpdir);
  ck_assert_int_eq(sh(cmd, &out), 2);
  ck_assert_msg(strstr(out, "another server key"), "%s", out);
  free(out);
  /* a key others can read */
  snprintf(cmd, sizeof cmd,
           "chmod 644 %s/other.key && %s run %s/ck.json --checkpoint-key %s/other.key "
           "--checkpoint-every 5 --checkpoint-dir %s/ckk -o %s/bad",
           tmpdir, fusebox(), tmpdir, tmpdir, tmpdir, tmpdir);
  ck_assert_int_eq(sh(cmd, &out), 2);
  ck_assert_msg(strstr(out, "can be read by others"), "%s", out);
  free(out);
  /* on a server, the server's key seals: a key here is refused */
  snprintf(cmd, sizeof cmd,
           "%s run %s/ck.json --server unix:/nonexistent --checkpoint-key %s/other.key "
           "--checkpoint-every 5 --checkpoint-dir %s/cks",
           fusebox(), tmpdir, tmpdir, tmpdir);
  ck_assert_int_eq(sh(cmd, &out), 2);
  ck_assert_msg(strstr(out, "--checkpoint-key is for in-process runs"), "%s", out);
  free(out);
}
END_TEST

/* Whether dir holds a finished checkpoint file (NAME-<launches>.fbck). */
static int has_checkpoint(const char *dir) {
  DIR *d = opendir(dir);
  if (!d) return 0;
  int found = 0;
  for (struct dirent *e; !found && (e = readdir(d));) {
    size_t n = strlen(e->d_name);
    found = n > 5 && !strcmp(e->d_name + n - 5, ".fbck");
  }
  closedir(d);
  return found;
}

/* Checkpoints of a run on a fuseboxd (docs/checkpoint.md "The CLI"): a
 * --server run with --checkpoint-every streams the server's sealed
 * checkpoints into --checkpoint-dir here, named as in-process ones; the
 * run and its fuseboxd are killed (-9) after a checkpoint; a fresh
 * fuseboxd with the same key resumes each file (--resume, and a
 * {"checkpoint": F} action's file through session.resume) and ends with
 * fields identical, byte for byte, to an uninterrupted run (sync and async,
 * random(), pointer cells that come and go). A modified file, another
 * server key and an in-process checkpoint are refused with a clear message
 * and exit 2, and leave no session behind. */
START_TEST(checkpoint_resume_server) {
  write_file("cks.fbk", ckpt_prog);
  char key[600], key2[600];
  snprintf(key, sizeof key, "%s/srv.key", tmpdir);
  snprintf(key2, sizeof key2, "%s/srv2.key", tmpdir);
  const char *modes[] = {"sync", "async"};
  for (int m = 0; m < 2; m++) {
    char json[2048], cmd[8192], flags[1400], sock[512], *out;
    snprintf(json, sizeof json,
             "{ \"name\": \"cks\", \"program\": \"cks.fbk\", \"session\": {\"mode\": "
             "\"%s\", \"seed\": 5},\n"
             "  \"step\": [ {\"repeat\": 30, \"do\": [ {\"launch\": \"bump\"} ]},\n"
             "             {\"checkpoint\": \"mid.fbck\"},\n"
             "             {\"repeat\": 400, \"do\": [ {\"launch\": \"bump\"} ]} ],\n"
             "  \"checks\": [ {\"read\": \"u\", \"to\": \"u.npy\"}, {\"read\": \"p\", \"to\": "
             "\"p.npy\"} ] }\n",
             modes[m]);
    write_file("cks.json", json);
    snprintf(flags, sizeof flags, "--checkpoint-key %s --checkpoint-key-create", key);
    int pid = start_fuseboxd_flags(flags, "cks1.sock", sock, sizeof sock);
    /* uninterrupted, in this process: what every resumed run must end with */
    snprintf(cmd, sizeof cmd,
             "XDG_CONFIG_HOME=%s/cfg %s run %s/cks.json --local -o %s/sa%d --checkpoint-every 200 "
             "--checkpoint-dir %s/slk%d",
             tmpdir, fusebox(), tmpdir, tmpdir, m, tmpdir, m);
    ck_assert_msg(sh(cmd, &out) == 0, "%s", out);
    free(out);
    /* on the server with checkpoints every 7 launches, killed after the first */
    snprintf(cmd, sizeof cmd,
             "%s run %s/cks.json --server %s -q -o %s/sk%d --checkpoint-every 7 "
             "--checkpoint-dir %s/sck%d >/dev/null 2>&1 & echo $!",
             fusebox(), tmpdir, sock, tmpdir, m, tmpdir, m);
    ck_assert_int_eq(sh(cmd, &out), 0);
    int cli = atoi(out);
    free(out);
    ck_assert_int_gt(cli, 0);
    /* killed once a checkpoint is there: the first (7 launches in) where
       the machine is slow, a later one (the last two kept) where the run
       was quicker than this poll, or none left to kill where it ended */
    char d1[600];
    snprintf(d1, sizeof d1, "%s/sck%d", tmpdir, m);
    for (int i = 0; i < 600 && !has_checkpoint(d1); i++) usleep(50000);
    ck_assert_msg(has_checkpoint(d1), "no checkpoint in %s after 30 s", d1);
    kill(cli, SIGKILL);
    kill(pid, SIGKILL);
    waitpid(cli, NULL, 0);
    waitpid(pid, NULL, 0);
    /* a fresh fuseboxd, the same key: resume from the earliest file kept */
    snprintf(flags, sizeof flags, "--checkpoint-key %s", key);
    pid = start_fuseboxd_flags(flags, "cks2.sock", sock, sizeof sock);
    snprintf(cmd, sizeof cmd, "ls %s/sck%d | head -n 1", tmpdir, m);
    ck_assert_int_eq(sh(cmd, &out), 0);
    char first[600];
    snprintf(first, sizeof first, "%s/sck%d/%.*s", tmpdir, m, (int)strcspn(out, "\n"), out);
    free(out);
    ck_assert_msg(strstr(first, ".fbck") && !strstr(first, ".tmp"), "%s", first);
    snprintf(cmd, sizeof cmd, "%s run %s/cks.json --server %s --resume %s -o %s/sr%d", fusebox(),
             tmpdir, sock, first, tmpdir, m);
    ck_assert_msg(sh(cmd, &out) == 0, "resumed from %s: %s", first, out);
    free(out);
    snprintf(cmd, sizeof cmd, "cmp %s/sa%d/u.npy %s/sr%d/u.npy && cmp %s/sa%d/p.npy %s/sr%d/p.npy",
             tmpdir, m, tmpdir, m, tmpdir, m, tmpdir, m);
    ck_assert_msg(sh(cmd, &out) == 0, "resumed from %s: %s", first, out);
    free(out);
    /* an uninterrupted run on this server: periodic files (the last two),
     * the action's file; resumed from the action's through session.resume */
    snprintf(cmd, sizeof cmd,
             "%s run %s/cks.json --server %s -o %s/sb%d --checkpoint-every 100 "
             "--checkpoint-dir %s/sck2%d && ls %s/sck2%d",
             fusebox(), tmpdir, sock, tmpdir, m, tmpdir, m, tmpdir, m);
    ck_assert_msg(sh(cmd, &out) == 0, "%s", out);
    ck_assert_msg(strstr(out, "cks-000000000300.fbck\ncks-000000000400.fbck\n") &&
                      !strstr(out, "000200"),
                  "%s", out);
    free(out);
    snprintf(cmd, sizeof cmd, "cmp %s/sa%d/u.npy %s/sb%d/u.npy && cmp %s/sa%d/p.npy %s/sb%d/p.npy",
             tmpdir, m, tmpdir, m, tmpdir, m, tmpdir, m);
    ck_assert_msg(sh(cmd, &out) == 0, "%s", out);
    free(out);
    snprintf(json, sizeof json,
             "{ \"name\": \"cks\", \"program\": \"cks.fbk\", \"session\": {\"resume\": "
             "\"sb%d/mid.fbck\"},\n"
             "  \"step\": [ {\"repeat\": 30, \"do\": [ {\"launch\": \"bump\"} ]},\n"
             "             {\"repeat\": 400, \"do\": [ {\"launch\": \"bump\"} ]} ],\n"
             "  \"checks\": [ {\"read\": \"u\", \"to\": \"u.npy\"}, {\"read\": \"p\", \"to\": "
             "\"p.npy\"} ] }\n",
             m);
    write_file("cks2.json", json);
    snprintf(cmd, sizeof cmd,
             "%s run %s/cks2.json --server %s -o %s/sm%d && cmp %s/sa%d/u.npy %s/sm%d/u.npy && "
             "cmp %s/sa%d/p.npy %s/sm%d/p.npy",
             fusebox(), tmpdir, sock, tmpdir, m, tmpdir, m, tmpdir, m, tmpdir, m, tmpdir, m);
    ck_assert_msg(sh(cmd, &out) == 0, "%s", out);
    free(out);
    if (m == 1) {
      /* a modified checkpoint */
      snprintf(cmd, sizeof cmd,
               "cp %s %s/sbad.fbck && printf 'X' | dd of=%s/sbad.fbck bs=1 seek=300 "
               "conv=notrunc 2>/dev/null && %s run %s/cks.json --server %s --resume "
               "%s/sbad.fbck -o %s/sbad",
               first, tmpdir, tmpdir, fusebox(), tmpdir, sock, tmpdir, tmpdir);
      ck_assert_int_eq(sh(cmd, &out), 2);
      ck_assert_msg(strstr(out, "resume: ") && strstr(out, "sbad.fbck: the checkpoint was "
                                                           "modified or was written with another "
                                                           "server key"),
                    "%s", out);
      ck_assert_msg(!strstr(out, "Restore"), "names the call, not the problem: %s", out);
      free(out);
      /* an in-process checkpoint (another key, another writer) */
      snprintf(cmd, sizeof cmd, "%s run %s/cks.json --server %s --resume %s/slk1/cks-000000000400.fbck",
               fusebox(), tmpdir, sock, tmpdir);
      ck_assert_int_eq(sh(cmd, &out), 2);
      ck_assert_msg(strstr(out, "resume: ") && strstr(out, "another server key"), "%s", out);
      free(out);
      /* no session was left behind by the refusals */
      snprintf(cmd, sizeof cmd, "%s stats --server %s --json", fusebox(), sock);
      ck_assert_int_eq(sh(cmd, &out), 0);
      json_t *js = json_loads(strchr(out, '{') ? strchr(out, '{') : out, 0, NULL);
      ck_assert_msg(js, "%s", out);
      ck_assert_msg(json_is_array(json_object_get(js, "session_list")) &&
                        json_array_size(json_object_get(js, "session_list")) == 0,
                    "%s", out);
      json_decref(js);
      free(out);
      kill(pid, SIGKILL);
      waitpid(pid, NULL, 0);
      /* another server key */
      snprintf(flags, sizeof flags, "--checkpoint-key %s --checkpoint-key-create", key2);
      pid = start_fuseboxd_flags(flags, "cks3.sock", sock, sizeof sock);
      snprintf(cmd, sizeof cmd, "%s run %s/cks.json --server %s --resume %s", fusebox(), tmpdir,
               sock, first);
      ck_assert_int_eq(sh(cmd, &out), 2);
      ck_assert_msg(strstr(out, "another server key"), "%s", out);
      free(out);
    }
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
  }
}
END_TEST

/* `fusebox check` (and run) refuse a bad save with its JSON path. */
START_TEST(bad_saves_are_named) {
  write_file("snap.fbk", snap_prog);
  struct {
    const char *action, *want;
  } cases[] = {
      {"{\"save\": \"u\", \"to\": \"u.txt\"}",
       "$.step[0].to: 'u.txt': expected a file name ending in .npy or .png"},
      {"{\"save\": \"u\", \"to\": \"u.npy\", \"every\": 0}",
       "$.step[0].every: expected a count >= 1"},
      {"{\"save\": \"u\", \"to\": \"u.png\", \"range\": [1, 0]}",
       "$.step[0].range: expected [lo, hi]"},
      {"{\"save\": \"u\", \"to\": \"u.npy\", \"range\": [0, 1]}",
       "$.step[0].range: only for a picture"},
      {"{\"save\": \"u\", \"to\": \"u.png\", \"colormap\": \"jet\"}",
       "$.step[0].colormap: expected \"viridis\" or \"gray\""},
      {"{\"save\": \"u\", \"to\": \"u_{stp}.png\"}",
       "$.step[0].to: 'u_{stp}.png': unknown placeholder"},
      {"{\"save\": \"u\", \"to\": \"u.npy\", \"evry\": 2}", "$.step[0].evry: unknown key"},
      {"{\"save\": 3, \"to\": \"u.npy\"}", "$.step[0].save: expected a field name"},
      {"{\"save\": \"zz\", \"to\": \"u.npy\"}", "$.step[0].save: no field named 'zz'"},
      {"{\"save\": \"w\", \"to\": \"w.png\"}",
       "$.step[0].to: a picture needs a 2-D field of scalars; 'w' has 1 index"},
      {"{\"repeat\": 2, \"do\": [{\"launch\": \"bump\"}, {\"save\": \"w\", \"to\": "
       "\"w{step}.png\"}]}",
       "$.step[0].do[1].to: a picture needs a 2-D field"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char json[1024], name[32], cmd[8192], *out;
    snprintf(json, sizeof json, "{ \"program\": \"snap.fbk\", \"step\": [ %s ] }\n",
             cases[i].action);
    snprintf(name, sizeof name, "bs%zu.json", i);
    write_file(name, json);
    snprintf(cmd, sizeof cmd, "%s check %s/%s", fusebox(), tmpdir, name);
    ck_assert_msg(sh(cmd, &out) == 1, "case %zu:\n%s", i, out);
    ck_assert_msg(strstr(out, cases[i].want), "case %zu: want '%s' in:\n%s", i, cases[i].want, out);
    free(out);
  }
  char cmd[8192], *out;
  snprintf(cmd, sizeof cmd, "%s run %s/bs9.json", fusebox(), tmpdir);
  ck_assert_int_eq(sh(cmd, &out), 2);
  ck_assert_msg(strstr(out, "'w' has 1 index"), "%s", out);
  free(out);
}
END_TEST

/* "orientation": "taichi" (first index along x, second upward, as
 * Taichi's GUI) and "particles" (a field of 2-vectors as discs, as
 * gui.circles: x from the left, y from the bottom), read back with libpng,
 * on a private fuseboxd and in this process; and their bad forms named. */
static const char *parts_prog =
    "layout { dense(ij: 3, 5) { place u: f32 }\n dense(k: 3) { place p: f32[2] } }\n"
    "kernel init() { for i, j in u { u[i, j] = f32(i * 5 + j) }\n"
    "  p[0] = [0.25, 0.5625]\n p[1] = [0.95, 0.95]\n p[2] = [-1.0, -1.0] }\n";

START_TEST(orientation_and_particles) {
  write_file("parts.fbk", parts_prog);
  write_file("parts.json",
             "{ \"program\": \"parts.fbk\", \"setup\": [ {\"launch\": \"init\"} ],\n"
             "  \"step\": [ {\"save\": \"u\", \"to\": \"ut.png\", \"range\": [0, 51], "
             "\"colormap\": \"gray\", \"orientation\": \"taichi\"},\n"
             "    {\"save\": \"u\", \"to\": \"um.png\", \"range\": [0, 51], "
             "\"colormap\": \"gray\", \"orientation\": \"matrix\"},\n"
             "    {\"save\": \"p\", \"to\": \"p.png\", \"particles\": {\"size\": [10, 8], "
             "\"radius\": 1, \"color\": \"#ff0000\", \"background\": [0, 0, 255]}} ],\n"
             "  \"checks\": [ {\"read\": \"p\", \"to\": \"dflt.png\", \"particles\": {}} ] }\n");
  const char *paths[] = {"", "--local"};
  for (int q = 0; q < 2; q++) {
    char cmd[8192], dir[512], file[600], *out;
    unsigned w, h;
    snprintf(dir, sizeof dir, "%s/parts%d", tmpdir, q);
    snprintf(cmd, sizeof cmd, "%s run %s/parts.json -o %s %s", fusebox(), tmpdir, dir, paths[q]);
    ck_assert_msg(sh(cmd, &out) == 0, "%s", out);
    free(out);
    /* taichi: 3 wide, 5 high; u[i, j] at column i, row 4 - j (j upward) */
    snprintf(file, sizeof file, "%s/ut.png", dir);
    unsigned char *px = read_png(file, &w, &h);
    ck_assert_uint_eq(w, 3);
    ck_assert_uint_eq(h, 5);
    for (unsigned i = 0; i < 3; i++)
      for (unsigned j = 0; j < 5; j++) {
        int g = 5 * (int)(i * 5 + j);
        assert_pixel(px, w, i, 4 - j, g, g, g);
      }
    free(px);
    /* matrix, said out loud: as without the key, 5 wide and 3 high */
    snprintf(file, sizeof file, "%s/um.png", dir);
    px = read_png(file, &w, &h);
    ck_assert_uint_eq(w, 5);
    ck_assert_uint_eq(h, 3);
    assert_pixel(px, w, 4, 0, 20, 20, 20);
    assert_pixel(px, w, 0, 2, 50, 50, 50);
    free(px);
    /* particles on 10 x 8: p[0] is the centre of pixel (2, 4) (y up): a
     * plus of 5 pixels at radius 1; p[1] only the pixel (9, 7) under it,
     * the top right; p[2] lies off the picture */
    snprintf(file, sizeof file, "%s/p.png", dir);
    px = read_png(file, &w, &h);
    ck_assert_uint_eq(w, 10);
    ck_assert_uint_eq(h, 8);
    static const int lit[][2] = {{2, 4}, {1, 4}, {3, 4}, {2, 3}, {2, 5}, {9, 7}};
    int red = 0;
    for (unsigned y = 0; y < h; y++)
      for (unsigned x = 0; x < w; x++) {
        const unsigned char *c = px + 3 * (y * w + x);
        red += c[0] == 255 && c[1] == 0 && c[2] == 0;
        ck_assert_msg((c[0] == 255 && !c[1] && !c[2]) || (!c[0] && !c[1] && c[2] == 255),
                      "pixel (%u, %u) is neither red nor blue", x, y);
      }
    ck_assert_int_eq(red, 6);
    for (size_t k = 0; k < sizeof lit / sizeof lit[0]; k++)
      assert_pixel(px, w, (unsigned)lit[k][0], 7 - (unsigned)lit[k][1], 255, 0, 0);
    free(px);
    /* a check's picture, the defaults: 512 x 512, white on black */
    snprintf(file, sizeof file, "%s/dflt.png", dir);
    px = read_png(file, &w, &h);
    ck_assert_uint_eq(w, 512);
    ck_assert_uint_eq(h, 512);
    assert_pixel(px, w, 128, 511 - 288, 255, 255, 255); /* p[0]: (128, 288) */
    assert_pixel(px, w, 0, 0, 0, 0, 0);
    free(px);
  }
  char cmd[8192];
  snprintf(cmd, sizeof cmd,
           "cmp %s/parts0/p.png %s/parts1/p.png && cmp %s/parts0/ut.png %s/parts1/ut.png", tmpdir,
           tmpdir, tmpdir, tmpdir);
  ck_assert_int_eq(sh(cmd, NULL), 0);

  struct {
    const char *action, *want;
  } cases[] = {
      {"{\"save\": \"u\", \"to\": \"u.png\", \"orientation\": \"xy\"}",
       "$.step[0].orientation: expected \"matrix\""},
      {"{\"save\": \"u\", \"to\": \"u.npy\", \"orientation\": \"taichi\"}",
       "$.step[0].orientation: only for a picture"},
      {"{\"save\": \"u\", \"to\": \"u.png\", \"particles\": {}}",
       "$.step[0].particles: particles need a field of 2-vectors (x, y); 'u' holds scalars"},
      {"{\"save\": \"p\", \"to\": \"p.png\", \"particles\": {}, \"range\": [0, 1]}",
       "$.step[0].range: not for particles"},
      {"{\"save\": \"p\", \"to\": \"p.png\", \"particles\": {}, \"orientation\": \"taichi\"}",
       "$.step[0].orientation: not for particles"},
      {"{\"save\": \"p\", \"to\": \"p.png\", \"particles\": {\"size\": [0, 5]}}",
       "$.step[0].particles.size: expected [width, height] in pixels, each 1 to 16384"},
      {"{\"save\": \"p\", \"to\": \"p.png\", \"particles\": {\"radius\": -1}}",
       "$.step[0].particles.radius: expected a number of pixels >= 0"},
      {"{\"save\": \"p\", \"to\": \"p.png\", \"particles\": {\"color\": \"red\"}}",
       "$.step[0].particles.color: expected \"#rrggbb\" or [r, g, b]"},
      {"{\"save\": \"p\", \"to\": \"p.png\", \"particles\": {\"background\": [0, 0, 256]}}",
       "$.step[0].particles.background: expected"},
      {"{\"save\": \"p\", \"to\": \"p.png\", \"particles\": {\"radus\": 2}}",
       "$.step[0].particles.radus: unknown key"},
      {"{\"save\": \"p\", \"to\": \"p.png\"}",
       "$.step[0].to: a picture needs a 2-D field of scalars; 'p' has 1 index and components"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char json[1024], name[32], *out;
    snprintf(json, sizeof json, "{ \"program\": \"parts.fbk\", \"step\": [ %s ] }\n",
             cases[i].action);
    snprintf(name, sizeof name, "bp%zu.json", i);
    write_file(name, json);
    snprintf(cmd, sizeof cmd, "%s check %s/%s", fusebox(), tmpdir, name);
    ck_assert_msg(sh(cmd, &out) == 1, "case %zu:\n%s", i, out);
    ck_assert_msg(strstr(out, cases[i].want), "case %zu: want '%s' in:\n%s", i, cases[i].want, out);
    free(out);
  }
}
END_TEST

/* ---------------------------------------------------------------- outputs */

/* Files a session writes stay inside the output directory (issue 38,
 * attack 5: a shared session file wrote ../../.ssh/authorized_keys). */

static void write_path(const char *path, const char *text) {
  FILE *f = fopen(path, "w");
  ck_assert_msg(f != NULL, "%s", path);
  fputs(text, f);
  fclose(f);
}

/* The file at path holds exactly text (a victim left untouched). */
static void assert_holds(const char *path, const char *text) {
  char buf[256] = "";
  FILE *f = fopen(path, "r");
  ck_assert_msg(f != NULL, "%s is gone", path);
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  buf[n] = 0;
  fclose(f);
  ck_assert_msg(!strcmp(buf, text), "%s was overwritten: it holds '%s'", path, buf);
}

/* `fusebox run` of a session whose step saves u to `to` (and whose check
 * writes u to `check_to` when not NULL); returns the exit status and the
 * output. */
static int run_saving_on(const char *dir, const char *to, const char *check_to, const char *outdir,
                         int local, char **out) {
  char json[1024], path[600], cmd[8192];
  int n = snprintf(json, sizeof json,
                   "{ \"program\": \"snap.fbk\", \"setup\": [ {\"launch\": \"init\"} ],\n"
                   "  \"step\": [ {\"repeat\": 2, \"do\": [ {\"save\": \"u\", \"to\": \"%s\"} ]} ]",
                   to);
  if (check_to) n += snprintf(json + n, sizeof json - (size_t)n,
                              ",\n  \"checks\": [ {\"read\": \"u\", \"to\": \"%s\"} ]", check_to);
  snprintf(json + n, sizeof json - (size_t)n, " }\n");
  snprintf(path, sizeof path, "%s/s.json", dir);
  write_path(path, json);
  snprintf(cmd, sizeof cmd, "%s run %s%s -q%s%s", fusebox(), path, local ? " --local" : "",
           outdir ? " -o " : "", outdir ? outdir : "");
  return sh(cmd, out);
}

/* The same in this process (--local). */
static int run_saving(const char *dir, const char *to, const char *check_to, const char *outdir,
                      char **out) {
  return run_saving_on(dir, to, check_to, outdir, 1, out);
}

/* Names that leave the output directory are refused when the file is
 * loaded (by check and run, before anything runs), naming the entry; a
 * link inside it (a folder on the way, or the file itself) is never
 * followed, nor a hard link overwritten; nested names work. */
START_TEST(outputs_stay_inside) {
  char base[300], outd[400], victim[500], name[600], cmd[8192], *out;
  snprintf(base, sizeof base, "%s/oi", tmpdir);
  snprintf(outd, sizeof outd, "%s/out", base);
  ck_assert_int_eq(mkdir(base, 0777), 0);
  ck_assert_int_eq(mkdir(outd, 0777), 0);
  snprintf(name, sizeof name, "%s/snap.fbk", base);
  write_path(name, snap_prog);
  snprintf(victim, sizeof victim, "%s/victim.npy", base);
  write_path(victim, "VICTIM");

  /* refused statically: absolute, '..' (also after a folder, or with a
   * {step} pattern), in a save or a check, with -o or beside the file */
  struct {
    const char *to, *check_to, *want;
    int with_o;
  } bad[] = {
      {"VICTIM_ABS", NULL, "$.step[0].do[0].to: '%s' is an absolute path; output names must stay "
                           "inside the output directory (-o DIR",
       1},
      {"../victim.npy", NULL, "$.step[0].do[0].to: '../victim.npy' has a '..' component", 1},
      {"x/../../victim.npy", NULL, "'x/../../victim.npy' has a '..' component", 1},
      {"../v_{step}.npy", NULL, "'../v_{step}.npy' has a '..' component", 1},
      {"u.npy", "../victim.npy", "$.checks[0].to: '../victim.npy' has a '..' component", 1},
      {"../oi/victim.npy", NULL, "has a '..' component", 0},
      {"frames/", NULL, "'frames/' names a folder, not a file", 1},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    char to[600], want[1200];
    snprintf(to, sizeof to, "%s", strcmp(bad[i].to, "VICTIM_ABS") ? bad[i].to : victim);
    snprintf(want, sizeof want, bad[i].want, victim);
    int st = run_saving(base, to, bad[i].check_to, bad[i].with_o ? outd : NULL, &out);
    ck_assert_msg(st == 2, "case %zu: exit %d:\n%s", i, st, out);
    ck_assert_msg(strstr(out, want), "case %zu: want '%s' in:\n%s", i, want, out);
    ck_assert_msg(strstr(out, "s.json: "), "case %zu: the file is not named:\n%s", i, out);
    free(out);
    snprintf(cmd, sizeof cmd, "%s check %s/s.json", fusebox(), base);
    ck_assert_msg(sh(cmd, &out) == 1, "case %zu: check passed:\n%s", i, out);
    ck_assert_msg(strstr(out, want), "case %zu: check: want '%s' in:\n%s", i, want, out);
    free(out);
    assert_holds(victim, "VICTIM");
  }

  /* a folder inside OUT that is a link to a folder outside: not followed */
  char outside[500], target[600];
  snprintf(outside, sizeof outside, "%s/outside", base);
  ck_assert_int_eq(mkdir(outside, 0777), 0);
  snprintf(target, sizeof target, "%s/u.npy", outside);
  write_path(target, "OUTSIDE");
  snprintf(name, sizeof name, "%s/link", outd);
  ck_assert_int_eq(symlink(outside, name), 0);
  ck_assert_int_eq(run_saving(base, "link/u.npy", NULL, outd, &out), 2);
  ck_assert_msg(strstr(out, "$.step[0].do[0].to: 'link/u.npy': 'link' is a symbolic link; output "
                            "files are never written through links"),
                "%s", out);
  free(out);
  ck_assert_int_eq(run_saving(base, "ok.npy", "link/sub/c_{step}.npy", outd, &out), 2);
  ck_assert_msg(strstr(out, "$.checks[0].to: 'link/sub/c_{step}.npy': 'link' is a symbolic link"),
                "%s", out);
  free(out);
  /* the same on a private fuseboxd (the default): the client opens the file */
  ck_assert_int_eq(run_saving_on(base, "link/u.npy", NULL, outd, 0, &out), 2);
  ck_assert_msg(strstr(out, "$.step[0].do[0].to: 'link/u.npy': 'link' is a symbolic link"), "%s",
                out);
  free(out);
  assert_holds(target, "OUTSIDE");
  snprintf(name, sizeof name, "%s/sub", outside);
  ck_assert_msg(access(name, F_OK) != 0, "a folder was made through the link");

  /* the file's own name a link to a file outside: not followed, kept */
  snprintf(name, sizeof name, "%s/u_2.npy", outd);
  ck_assert_int_eq(symlink(victim, name), 0);
  ck_assert_int_eq(run_saving(base, "u_{step}.npy", NULL, outd, &out), 2);
  ck_assert_msg(strstr(out, "$.step[0].do[0].to: 'u_2.npy' is a symbolic link"), "%s", out);
  free(out);
  assert_holds(victim, "VICTIM");
  struct stat st;
  ck_assert_int_eq(lstat(name, &st), 0);
  ck_assert(S_ISLNK(st.st_mode));

  /* a hard link to a file outside: not overwritten */
  snprintf(name, sizeof name, "%s/h.npy", outd);
  ck_assert_int_eq(link(victim, name), 0);
  ck_assert_int_eq(run_saving(base, "ok.npy", "h.npy", outd, &out), 2);
  ck_assert_msg(strstr(out, "$.checks[0].to: 'h.npy' has other hard links"), "%s", out);
  free(out);
  assert_holds(victim, "VICTIM");

  /* nested and relative names: folders made inside OUT, files rewritten */
  snprintf(name, sizeof name, "%s/again.npy", outd);
  write_path(name, "OLD");
  for (int k = 0; k < 2; k++) {
    ck_assert_msg(run_saving(base, "frames/sub/u_{step:02d}.png", "./again.npy", outd, &out) == 0,
                  "%s", out);
    free(out);
    float v[15];
    read_npy_f32(name, v, 15);
    ck_assert_float_eq(v[14], 14.0f);
    snprintf(target, sizeof target, "%s/frames/sub/u_02.png", outd);
    unsigned w, h;
    free(read_png(target, &w, &h));
    ck_assert_uint_eq(w, 5);
  }
  /* beside the JSON file (no -o): a nested name there works too */
  ck_assert_msg(run_saving(base, "beside/u.npy", NULL, NULL, &out) == 0, "%s", out);
  free(out);
  snprintf(name, sizeof name, "%s/beside/u.npy", base);
  ck_assert_int_eq(access(name, F_OK), 0);
  /* bench writes the checks' files beside the JSON file: the same rule */
  run_saving(base, "ok.npy", "../victim.npy", NULL, &out);
  free(out);
  snprintf(cmd, sizeof cmd, "%s bench %s/s.json --local --modes sync --warmup 0 --repeat 1",
           fusebox(), base);
  ck_assert_int_eq(sh(cmd, &out), 2);
  ck_assert_msg(strstr(out, "$.checks[0].to: '../victim.npy' has a '..' component"), "%s", out);
  free(out);
  assert_holds(victim, "VICTIM");
}
END_TEST

/* fb_out_open itself (cli/cli_outfile.c, linked into this test), both
 * ways: openat2 and the O_NOFOLLOW walk that stands in where the kernel
 * lacks it. */
START_TEST(out_open_both_ways) {
  for (int way = 0; way < 2; way++) {
    fb_out_try_openat2 = way == 0;
    char root[300], p[600], err[1024];
    snprintf(root, sizeof root, "%s/ow%d", tmpdir, way);
    ck_assert_int_eq(mkdir(root, 0777), 0);
    snprintf(p, sizeof p, "%s/victim", tmpdir);
    if (way == 0) write_path(p, "VICTIM");
    /* nested: folders made, the file created, then rewritten shorter */
    for (int k = 0; k < 2; k++) {
      FILE *f = fb_out_open(root, "a/./b//c.txt", err, sizeof err);
      ck_assert_msg(f != NULL, "way %d: %s", way, err);
      fputs(k ? "new" : "older text", f);
      ck_assert_int_eq(fclose(f), 0);
    }
    snprintf(p, sizeof p, "%s/a/b/c.txt", root);
    assert_holds(p, "new");
    /* refused by name */
    const char *names[] = {"/etc/x", "..", "a/../../x", "", "a/b/", "a/."};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
      ck_assert_msg(fb_out_open(root, names[i], err, sizeof err) == NULL, "way %d: '%s' opened",
                    way, names[i]);
      ck_assert_msg(strstr(err, "output names must stay inside"), "%s", err);
    }
    /* a link on the way, at the end, and a dangling one: not followed */
    snprintf(p, sizeof p, "%s/dirlink", root);
    ck_assert_int_eq(symlink(tmpdir, p), 0);
    ck_assert(fb_out_open(root, "dirlink/victim", err, sizeof err) == NULL);
    ck_assert_msg(strstr(err, "'dirlink' is a symbolic link"), "%s", err);
    snprintf(p, sizeof p, "%s/a/b/filelink", root);
    char v[400];
    snprintf(v, sizeof v, "%s/victim", tmpdir);
    ck_assert_int_eq(symlink(v, p), 0);
    ck_assert(fb_out_open(root, "a/b/filelink", err, sizeof err) == NULL);
    ck_assert_msg(strstr(err, "'a/b/filelink' is a symbolic link"), "%s", err);
    snprintf(p, sizeof p, "%s/dangling", root);
    snprintf(v, sizeof v, "%s/made-through-a-link", tmpdir);
    ck_assert_int_eq(symlink(v, p), 0);
    ck_assert(fb_out_open(root, "dangling", err, sizeof err) == NULL);
    ck_assert_msg(strstr(err, "'dangling' is a symbolic link"), "%s", err);
    ck_assert_msg(access(v, F_OK) != 0, "way %d: created %s through a dangling link", way, v);
    snprintf(v, sizeof v, "%s/victim", tmpdir);
    assert_holds(v, "VICTIM");
    /* a file where a folder belongs */
    ck_assert(fb_out_open(root, "a/b/c.txt/d", err, sizeof err) == NULL);
    ck_assert_msg(strstr(err, "'a/b/c.txt' is not a folder"), "%s", err);
    /* a FIFO (no reader: must not block) and a hard link: refused */
    snprintf(p, sizeof p, "%s/fifo", root);
    ck_assert_int_eq(mkfifo(p, 0600), 0);
    ck_assert(fb_out_open(root, "fifo", err, sizeof err) == NULL);
    ck_assert_msg(strstr(err, "is not a regular file"), "%s", err);
    snprintf(p, sizeof p, "%s/hard", root);
    ck_assert_int_eq(link(v, p), 0);
    ck_assert(fb_out_open(root, "hard", err, sizeof err) == NULL);
    ck_assert_msg(strstr(err, "has other hard links"), "%s", err);
    assert_holds(v, "VICTIM");
  }
  fb_out_try_openat2 = 1;
}
END_TEST

/* ---------------------------------------------------------------- Ctrl-C */

/* A session that runs for hours: a kernel launched a billion times. */
static const char *long_session =
    "{ \"source\": \"layout { dense(i: 4096) { place a: f32 } }\\n"
    "kernel k() { for i in a { a[i] = a[i] * 0.5 + 1.0 } }\\n\",\n"
    "  \"step\": [ {\"repeat\": 1000000000, \"do\": [ {\"launch\": \"k\"} ]} ] }\n";

/* The fuseboxd whose parent is `parent` (from /proc), its socket path
 * (from its --listen unix:PATH) into sock; 0 when there is none yet. */
static int fuseboxd_child(int parent, char *sock, size_t n) {
  DIR *d = opendir("/proc");
  ck_assert_ptr_nonnull(d);
  int found = 0;
  for (struct dirent *e; !found && (e = readdir(d));) {
    int pid = atoi(e->d_name), ppid = 0;
    if (pid <= 0) continue;
    char path[64], comm[64] = "", st;
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    FILE *f = fopen(path, "r");
    if (!f) continue;
    int ok = fscanf(f, "%*d (%63[^)]) %c %d", comm, &st, &ppid) == 3;
    fclose(f);
    if (!ok || ppid != parent || strcmp(comm, "fuseboxd")) continue;
    snprintf(path, sizeof path, "/proc/%d/cmdline", pid);
    char cl[4096]; /* NUL-separated arguments (/proc files have no size) */
    f = fopen(path, "r");
    size_t len = f ? fread(cl, 1, sizeof cl - 1, f) : 0;
    if (f) fclose(f);
    cl[len] = 0;
    sock[0] = 0;
    for (size_t i = 0; i < len; i += strlen(cl + i) + 1)
      if (!strcmp(cl + i, "--listen") && i + 9 < len && !strncmp(cl + i + 9, "unix:", 5))
        snprintf(sock, n, "%s", cl + i + 14);
    found = sock[0] ? pid : 0;
  }
  closedir(d);
  return found;
}

/* Whether pid is gone (or a zombie nobody has reaped yet: it runs no more). */
static int process_gone(int pid) {
  char path[64], comm[64], st = 0;
  snprintf(path, sizeof path, "/proc/%d/stat", pid);
  FILE *f = fopen(path, "r");
  if (!f) return 1;
  int ok = fscanf(f, "%*d (%63[^)]) %c", comm, &st) == 2;
  fclose(f);
  return !ok || st == 'Z' || st == 'X';
}

/* Whether pid runs fusebox and catches SIGINT yet (its handler is
 * installed: before that, a SIGINT would kill it and say nothing about the
 * handler). Before the exec, the forked test process catches SIGINT too. */
static int catches_sigint(int pid) {
  char path[64], line[256], exe[1024];
  snprintf(path, sizeof path, "/proc/%d/exe", pid);
  ssize_t k = readlink(path, exe, sizeof exe - 1);
  if (k <= 0) return 0;
  exe[k] = 0;
  const char *base = strrchr(exe, '/');
  if (!base || strcmp(base, "/fusebox")) return 0;
  snprintf(path, sizeof path, "/proc/%d/status", pid);
  FILE *f = fopen(path, "r");
  unsigned long long mask = 0;
  while (f && fgets(line, sizeof line, f))
    if (sscanf(line, "SigCgt: %llx", &mask) == 1) break;
  if (f) fclose(f);
  return (mask >> (SIGINT - 1)) & 1;
}

static void wait_handler(int pid) {
  for (int i = 0; i < 6000 && !catches_sigint(pid); i++) usleep(10000);
  ck_assert_msg(catches_sigint(pid), "fusebox run never installed its SIGINT handler");
}

/* Start `fusebox run JSON EXTRA` with its output in OUT; its pid. */
static int spawn_run(const char *json, const char *extra, const char *outfile) {
  int pid = fork();
  ck_assert_int_ge(pid, 0);
  if (pid == 0) {
    FILE *o = freopen(outfile, "w", stdout);
    if (!o || dup2(fileno(o), 2) < 0) _exit(126);
    prctl(PR_SET_PDEATHSIG, SIGKILL); /* a failed test leaves nothing running */
    unsetenv("FUSEBOX_SERVER");
    if (extra) execl(fusebox(), "fusebox", "run", json, extra, (char *)NULL);
    else execl(fusebox(), "fusebox", "run", json, "-q", (char *)NULL);
    _exit(127);
  }
  return pid;
}

/* Wait (generously: this is no speed test) for pid to exit; its exit
 * status, or 1000 + the signal that killed it. */
static int wait_exit(int pid) {
  int st = 0;
  for (int i = 0; i < 6000; i++) {
    int w = waitpid(pid, &st, WNOHANG);
    if (w == pid) return WIFEXITED(st) ? WEXITSTATUS(st) : 1000 + WTERMSIG(st);
    usleep(10000);
  }
  kill(pid, SIGKILL);
  waitpid(pid, &st, 0);
  ck_abort_msg("fusebox run did not exit after the signal");
  return -1;
}

/* The private daemon of a running `fusebox run` (waits for it to serve). */
static int wait_daemon(int cli, char *sock, size_t n) {
  int d = 0;
  struct stat sb;
  for (int i = 0; i < 6000 && !(d && stat(sock, &sb) == 0); i++) {
    d = fuseboxd_child(cli, sock, n);
    if (!(d && stat(sock, &sb) == 0)) usleep(10000);
  }
  ck_assert_msg(d > 0 && stat(sock, &sb) == 0, "no private fuseboxd serving under fusebox run");
  wait_handler(cli);
  usleep(300000); /* let launches flow */
  return d;
}

/* Ctrl-C on `fusebox run` with its private fuseboxd: "interrupted", exit
 * 130, the daemon gone (reaped), its socket and folder removed. Twice in a
 * row: the same. */
START_TEST(ctrl_c_stops_private_daemon) {
  write_file("long.json", long_session);
  char json[512], outfile[512], sock[512], dir[512], *out;
  snprintf(json, sizeof json, "%s/long.json", tmpdir);
  snprintf(outfile, sizeof outfile, "%s/long.out", tmpdir);
  for (int twice = 0; twice < 2; twice++) {
    int cli = spawn_run(json, NULL, outfile);
    int d = wait_daemon(cli, sock, sizeof sock);
    snprintf(dir, sizeof dir, "%s", sock);
    *strrchr(dir, '/') = 0;
    kill(cli, SIGINT);
    if (twice) kill(cli, SIGINT);
    ck_assert_int_eq(wait_exit(cli), 130);
    out = fbt_read_file(outfile, NULL);
    ck_assert_msg(out && strstr(out, "fusebox run: interrupted"), "%s", out ? out : "(no output)");
    free(out);
    ck_assert_msg(process_gone(d), "the private fuseboxd (pid %d) still runs", d);
    ck_assert_msg(access(sock, F_OK) != 0, "%s is left behind", sock);
    ck_assert_msg(access(dir, F_OK) != 0, "%s is left behind", dir);
  }
}
END_TEST

/* SIGTERM too (128 + 15); in this process (--local) there is no daemon. */
START_TEST(sigterm_and_local) {
  write_file("long.json", long_session);
  char json[512], outfile[512], sock[512];
  snprintf(json, sizeof json, "%s/long.json", tmpdir);
  snprintf(outfile, sizeof outfile, "%s/term.out", tmpdir);
  int cli = spawn_run(json, NULL, outfile);
  int d = wait_daemon(cli, sock, sizeof sock);
  kill(cli, SIGTERM);
  ck_assert_int_eq(wait_exit(cli), 143);
  ck_assert(process_gone(d));
  ck_assert(access(sock, F_OK) != 0);
  cli = spawn_run(json, "--local", outfile);
  wait_handler(cli);
  usleep(300000);
  kill(cli, SIGINT);
  ck_assert_int_eq(wait_exit(cli), 130);
  char *out = fbt_read_file(outfile, NULL);
  ck_assert_msg(out && strstr(out, "interrupted"), "%s", out ? out : "");
  free(out);
}
END_TEST

/* Killed outright (SIGKILL, no handler runs), fusebox run still takes its
 * private fuseboxd with it (PR_SET_PDEATHSIG). */
START_TEST(sigkill_takes_the_daemon) {
  write_file("long.json", long_session);
  char json[512], outfile[512], sock[512];
  snprintf(json, sizeof json, "%s/long.json", tmpdir);
  snprintf(outfile, sizeof outfile, "%s/kill.out", tmpdir);
  int cli = spawn_run(json, NULL, outfile);
  int d = wait_daemon(cli, sock, sizeof sock);
  kill(cli, SIGKILL);
  ck_assert_int_eq(wait_exit(cli), 1000 + SIGKILL);
  int gone = 0;
  for (int i = 0; i < 3000 && !(gone = process_gone(d)); i++) usleep(10000);
  ck_assert_msg(gone, "the private fuseboxd (pid %d) outlived fusebox run", d);
  /* nobody is left to remove the socket: its folder is ours to clean */
  *strrchr(sock, '/') = 0;
  char cmd[600];
  snprintf(cmd, sizeof cmd, "rm -rf %s", sock);
  ck_assert_int_eq(system(cmd), 0);
}
END_TEST

/* On a running fuseboxd (--server), Ctrl-C closes the connection: exit 130,
 * and the server goes on serving. */
START_TEST(ctrl_c_on_server) {
  write_file("long.json", long_session);
  char json[512], outfile[512], sock[512], cmd[8192], *out;
  snprintf(json, sizeof json, "%s/long.json", tmpdir);
  snprintf(outfile, sizeof outfile, "%s/srv.out", tmpdir);
  int pid = start_fuseboxd("int.sock", sock, sizeof sock);
  int cli = fork();
  ck_assert_int_ge(cli, 0);
  if (cli == 0) {
    FILE *o = freopen(outfile, "w", stdout);
    if (!o || dup2(fileno(o), 2) < 0) _exit(126);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    execl(fusebox(), "fusebox", "run", json, "--server", sock, "-q", (char *)NULL);
    _exit(127);
  }
  wait_handler(cli);
  usleep(500000);
  kill(cli, SIGINT);
  ck_assert_int_eq(wait_exit(cli), 130);
  out = fbt_read_file(outfile, NULL);
  ck_assert_msg(out && strstr(out, "interrupted"), "%s", out ? out : "");
  free(out);
  snprintf(cmd, sizeof cmd, "%s ping --server %s", fusebox(), sock);
  ck_assert_int_eq(sh(cmd, &out), 0);
  free(out);
  kill(pid, SIGKILL);
}
END_TEST

/* ---------------------------------------------------------------- perf map */

static const char *perf_prog = "layout { dense(i: 4096) { place a: f32 }\n place total: f32 }\n"
                               "kernel fill(v: f32) { for i in a { a[i] = a[i] * 0.5 + v } }\n"
                               "kernel sum() { total[] = 0.0\n for i in a { total[] += a[i] } }\n";

static void perf_map_path(int pid, char *path, size_t n) {
  snprintf(path, n, "/tmp/perf-%d.map", pid);
}

/* Whether pid's perf map was written at or after since (a file of an
 * earlier process with the same pid, pids being reused, is older). */
static int perf_map_written(int pid, time_t since) {
  char path[64];
  struct stat st;
  perf_map_path(pid, path, sizeof path);
  return stat(path, &st) == 0 && st.st_mtime >= since;
}

/* Start `fusebox run JSON ARGS...` (at most two extra arguments, NULL-ended)
 * with FB_PERF_MAP=perf (NULL: unset); its pid. */
static int spawn_perf(const char *perf, const char *json, const char *a1, const char *a2,
                      const char *outfile) {
  int pid = fork();
  ck_assert_int_ge(pid, 0);
  if (pid == 0) {
    FILE *o = freopen(outfile, "w", stdout);
    if (!o || dup2(fileno(o), 2) < 0) _exit(126);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    unsetenv("FUSEBOX_SERVER");
    if (perf) setenv("FB_PERF_MAP", perf, 1);
    else unsetenv("FB_PERF_MAP");
    execl(fusebox(), "fusebox", "run", json, "-q", a1, a2, (char *)NULL);
    _exit(127);
  }
  return pid;
}

typedef struct perf_line {
  unsigned long long start, size;
  char name[600];
} perf_line;

/* The lines of a perf map (at most max); each must be "START SIZE fb:NAME",
 * hex, both non-zero. Returns how many. */
static int read_perf_map(const char *path, perf_line *v, int max) {
  FILE *f = fopen(path, "r");
  if (!f) return 0;
  int n = 0;
  char line[700];
  while (n < max && fgets(line, sizeof line, f)) {
    if (!strchr(line, '\n')) break; /* a line being written */
    perf_line *p = &v[n];
    ck_assert_msg(sscanf(line, "%llx %llx %599[^\n]", &p->start, &p->size, p->name) == 3,
                  "%s: bad line: %s", path, line);
    ck_assert_msg(p->start && p->size && !strncmp(p->name, "fb:", 3), "%s: %s", path, line);
    n++;
  }
  fclose(f);
  return n;
}

static int perf_map_has(const perf_line *v, int n, const char *what) {
  for (int i = 0; i < n; i++)
    if (strstr(v[i].name, what)) return 1;
  return 0;
}

/* Wait for pid's perf map to name both kernels; its lines. */
static int wait_perf_map(int pid, perf_line *v, int max) {
  char path[64];
  perf_map_path(pid, path, sizeof path);
  int n = 0;
  for (int i = 0; i < 6000; i++) {
    n = read_perf_map(path, v, max);
    if (perf_map_has(v, n, "fill.t") && perf_map_has(v, n, "sum.t")) return n;
    usleep(10000);
  }
  ck_abort_msg("%s never named the tasks of fill and sum (%d lines)", path, n);
  return 0;
}

/* FB_PERF_MAP=1: the JIT announces every task's code to perf in
 * /tmp/perf-PID.map of the process that runs it, under the kernels' task
 * names, at addresses inside its executable mappings; under process
 * isolation the worker's map (opened before its seccomp filter). Unset: no
 * file. */
START_TEST(perf_map) {
  write_file("perf.fbk", perf_prog);
  write_file("perf.json", "{ \"program\": \"perf.fbk\",\n"
                          "  \"step\": [ {\"repeat\": 3, \"do\": [ {\"launch\": \"fill\", "
                          "\"args\": [1.0]}, {\"launch\": \"sum\"} ]} ],\n"
                          "  \"checks\": [ {\"read\": \"total\", \"min\": 1.0} ] }\n");
  write_file("perf_long.json", "{ \"program\": \"perf.fbk\",\n"
                               "  \"step\": [ {\"repeat\": 1000000000, \"do\": [ {\"launch\": "
                               "\"fill\", \"args\": [1.0]}, {\"launch\": \"sum\"} ]} ] }\n");
  char json[512], longjson[512], outfile[512], path[64], sock[512];
  snprintf(json, sizeof json, "%s/perf.json", tmpdir);
  snprintf(longjson, sizeof longjson, "%s/perf_long.json", tmpdir);
  snprintf(outfile, sizeof outfile, "%s/perf.out", tmpdir);
  /* unset, and 0: no file */
  const char *off[] = {NULL, "0"};
  for (int i = 0; i < 2; i++) {
    time_t t0 = time(NULL) - 1; /* file times come from a coarser clock */
    int cli = spawn_perf(off[i], json, "--local", NULL, outfile);
    ck_assert_int_eq(wait_exit(cli), 0);
    ck_assert_msg(!perf_map_written(cli, t0), "FB_PERF_MAP=%s wrote /tmp/perf-%d.map",
                  off[i] ? off[i] : "(unset)", cli);
  }
  /* a value that is neither 0 nor 1 is named, and writes nothing */
  time_t t0 = time(NULL) - 1;
  int cli = spawn_perf("yes", json, "--local", NULL, outfile);
  ck_assert_int_eq(wait_exit(cli), 0);
  ck_assert(!perf_map_written(cli, t0));
  char *out = fbt_read_file(outfile, NULL);
  ck_assert_msg(out && strstr(out, "FB_PERF_MAP=yes: expected 0 or 1"), "%s", out ? out : "");
  free(out);

  /* --local: this process's map, every line inside an executable mapping */
  static perf_line v[256];
  cli = spawn_perf("1", longjson, "--local", NULL, outfile);
  int n = wait_perf_map(cli, v, 256);
  struct stat lst;
  perf_map_path(cli, path, sizeof path);
  ck_assert_int_eq(stat(path, &lst), 0);
  ck_assert_msg((lst.st_mode & 0077) == 0, "%s has mode %o", path, (unsigned)(lst.st_mode & 0777));
  char maps_path[64];
  snprintf(maps_path, sizeof maps_path, "/proc/%d/maps", cli);
  for (int i = 0; i < n; i++) {
    FILE *maps = fopen(maps_path, "r"); /* /proc files have no size: read by line */
    ck_assert_ptr_nonnull(maps);
    int inside = 0;
    char l[512];
    while (!inside && fgets(l, sizeof l, maps)) {
      unsigned long long lo, hi;
      char perms[8];
      if (sscanf(l, "%llx-%llx %7s", &lo, &hi, perms) == 3)
        inside = perms[2] == 'x' && lo <= v[i].start && v[i].start + v[i].size <= hi;
    }
    fclose(maps);
    ck_assert_msg(inside, "%llx %llx %s is in no executable mapping", v[i].start, v[i].size,
                  v[i].name);
  }
  /* the same body is not named twice (the code cache reuses it) */
  for (int i = 0; i < n; i++)
    for (int k = i + 1; k < n; k++)
      ck_assert_msg(v[i].start + v[i].size <= v[k].start || v[k].start + v[k].size <= v[i].start,
                    "%s and %s overlap", v[i].name, v[k].name);
  kill(cli, SIGINT);
  ck_assert_int_eq(wait_exit(cli), 130);
  perf_map_path(cli, path, sizeof path);
  unlink(path);

  /* process isolation: the session's worker (a child of fuseboxd) */
  int d = start_fuseboxd_env("FB_PERF_MAP=1", "perf.sock", sock, sizeof sock);
  cli = spawn_perf(NULL, longjson, "--server", sock, outfile);
  int worker = 0, kids[64], nkids = 0;
  for (int i = 0; i < 6000 && !worker; i++) {
    nkids = 0;
    DIR *dir = opendir("/proc");
    ck_assert_ptr_nonnull(dir);
    for (struct dirent *e; !worker && (e = readdir(dir));) {
      int pid = atoi(e->d_name), ppid = 0;
      char sp[64], st;
      snprintf(sp, sizeof sp, "/proc/%d/stat", pid);
      FILE *f = pid > 0 ? fopen(sp, "r") : NULL;
      if (!f) continue;
      int ok = fscanf(f, "%*d (%*[^)]) %c %d", &st, &ppid) == 2;
      fclose(f);
      if (!ok || ppid != d) continue;
      if (nkids < 64) kids[nkids++] = pid; /* spare workers write (empty) maps too */
      perf_map_path(pid, path, sizeof path);
      if (read_perf_map(path, v, 256) > 0) worker = pid;
    }
    closedir(dir);
    if (!worker) usleep(10000);
  }
  ck_assert_msg(worker, "no worker of fuseboxd %d wrote a perf map", d);
  wait_perf_map(worker, v, 256);
  /* tenants' task names and code addresses: no other user may read them */
  struct stat ms;
  perf_map_path(worker, path, sizeof path);
  ck_assert_int_eq(stat(path, &ms), 0);
  ck_assert_msg((ms.st_mode & 0077) == 0, "%s has mode %o", path, (unsigned)(ms.st_mode & 0777));
  kill(cli, SIGINT);
  ck_assert_int_eq(wait_exit(cli), 130);
  kill(d, SIGKILL);
  /* the maps of fuseboxd (its own engine's JIT: empty) and its workers */
  perf_map_path(d, path, sizeof path);
  unlink(path);
  for (int i = 0; i < nkids; i++) {
    perf_map_path(kids[i], path, sizeof path);
    unlink(path);
  }
}
END_TEST

/* ---------------------------------------------------------------- named SNodes */

static const char *sparse_prog = "layout {\n"
                                 "  pointer(ij: 4, 4) as blocks {\n"
                                 "    bitmasked(ij: 2, 2) as cells { place x: f32 }\n"
                                 "  }\n"
                                 "  dense(i: 8) as row { place d: f32 }\n"
                                 "  place total: f32\n"
                                 "}\n"
                                 "kernel paint() { for k in 0 .. 64 { x[k // 8, k % 8] = 1.0 } }\n"
                                 "kernel count_blocks() {\n"
                                 "  total[] = 0.0\n"
                                 "  for i, j in blocks { total[] += 1.0 }\n"
                                 "}\n";

/* No kernel the runner added and no IR value in what the user reads. */
static void assert_user_terms(const char *out) {
  ck_assert_msg(!strstr(out, "__fb"), "an internal kernel name reached the user:\n%s", out);
  for (const char *p = strchr(out, '%'); p; p = strchr(p + 1, '%'))
    ck_assert_msg(!isdigit((unsigned char)p[1]), "an IR value reached the user:\n%s", out);
}

/* activate / deactivate / deactivate_all of a named SNode or a field, on
 * every path (in this process, a private fuseboxd, a running one) and in
 * both modes: the results the language's own operations give, and errors
 * that name the action and say what is wrong in the program's terms. */
START_TEST(snodes_from_json) {
  write_file("sp.fbk", sparse_prog);
  /* 64 cells painted; block (0, 0) (4 cells) and (3, 3) (4 more) and then
   * cell (0, 2) (in block (0, 1)) deactivated: 55 left, 14 blocks */
  write_file("sp1.json",
             "{ \"program\": \"sp.fbk\", \"step\": [ {\"launch\": \"paint\"},\n"
             "  {\"deactivate\": \"blocks\", \"cells\": [[0, 0], [3, 3]]},\n"
             "  {\"deactivate\": \"x\", \"cells\": [[0, 2]]}, {\"launch\": \"count_blocks\"} ],\n"
             "  \"checks\": [ {\"read\": \"x\", \"sum\": 55.0},\n"
             "              {\"read\": \"total\", \"equals\": 14.0} ] }\n");
  /* every cell deactivated leaves the 16 blocks; every block, none; an
   * activated block counts, with no cell under it active */
  write_file("sp2.json",
             "{ \"program\": \"sp.fbk\", \"setup\": [ {\"launch\": \"paint\"} ],\n"
             "  \"step\": [ {\"deactivate_all\": \"cells\"}, {\"launch\": \"count_blocks\"},\n"
             "            {\"save\": \"total\", \"to\": \"t1.npy\"},\n"
             "            {\"deactivate_all\": \"blocks\"},\n"
             "            {\"activate\": \"blocks\", \"cells\": [[1, 1], [2, 3]]},\n"
             "            {\"launch\": \"count_blocks\"} ],\n"
             "  \"checks\": [ {\"read\": \"x\", \"sum\": 0.0},\n"
             "              {\"read\": \"total\", \"equals\": 2.0} ] }\n");
  /* a launch of an added kernel that fails on the device (pointer blocks
   * past the session's memory limit) is named by what it does */
  write_file("mem.fbk",
             "layout { pointer(i: 256) as blocks { dense(i: 4096) { place x: f32 } } }\n");
  char mem[4096] = "{ \"program\": \"mem.fbk\", \"session\": {\"memory_limit\": 1048576},\n"
                   "  \"step\": [ {\"activate\": \"blocks\", \"cells\": [[0]";
  for (int b = 1; b < 100; b++) snprintf(mem + strlen(mem), sizeof mem - strlen(mem), ", [%d]", b);
  snprintf(mem + strlen(mem), sizeof mem - strlen(mem), "]}, {\"sync\": true} ] }\n");
  write_file("mem.json", mem);
  char sock[512], server[600], cmd[8192], *out;
  int pid = start_fuseboxd("sp.sock", sock, sizeof sock);
  snprintf(server, sizeof server, "--server %s", sock);
  const char *paths[] = {"--local", "", server};
  const char *modes[] = {"sync", "async"};
  const struct {
    const char *step, *want;
  } bad[] = {
      {"{\"deactivate_all\": \"d\"}",
       "$.step[0]: deactivate_all: field 'd' lives in a dense SNode, whose cells are always "
       "active, so it cannot be deactivated (place it under a bitmasked or pointer SNode"},
      {"{\"deactivate\": \"row\", \"cells\": [[1]]}",
       "$.step[0]: deactivate: SNode 'row' is dense, its cells are always active"},
      {"{\"activate\": \"blocks\", \"cells\": [[1, 1], [1, 9]]}",
       "$.step[0].cells[1]: index 9 (number 1) is out of bounds of 'blocks' (0 .. 3)"},
      {"{\"activate\": \"block\", \"cells\": [[1, 1]]}",
       "$.step[0].activate: no field or named SNode 'block' in the program"},
      {"{\"deactivate\": \"blocks\", \"cells\": [[1]]}",
       "$.step[0].cells[0]: 'blocks' takes 2 indices, 1 given"},
      {"{\"deactivate_all\": \"total\"}", "$.step[0].deactivate_all: field 'total' is 0-D"},
      {"{\"activate\": \"x\", \"cells\": [[1, 0.5]]}",
       "$.step[0].cells[0][1]: an index must be an integer"},
  };
  for (int p = 0; p < 3; p++)
    for (int m = 0; m < 2; m++) {
      for (int j = 1; j <= 2; j++) {
        snprintf(cmd, sizeof cmd, "%s run %s/sp%d.json %s --mode %s", fusebox(), tmpdir, j,
                 paths[p], modes[m]);
        int rc = sh(cmd, &out);
        ck_assert_msg(rc == 0 && strstr(out, "all checks passed"), "%s: rc %d\n%s", cmd, rc, out);
        free(out);
      }
      snprintf(cmd, sizeof cmd, "%s run %s/mem.json %s --mode %s", fusebox(), tmpdir, paths[p],
               modes[m]);
      int mrc = sh(cmd, &out);
      ck_assert_msg(mrc == 2 && strstr(out, "$.step[0]: activate of 'blocks' (launch #64 of the "
                                            "session): out of device memory"),
                    "%s: rc %d\n%s", cmd, mrc, out);
      assert_user_terms(out);
      free(out);
      float t1;
      char t1p[600];
      snprintf(t1p, sizeof t1p, "%s/t1.npy", tmpdir);
      read_npy_f32(t1p, &t1, 1);
      ck_assert_msg(t1 == 16.0f, "blocks active after deactivate_all of cells: %g", t1);
      for (size_t b = 0; b < sizeof bad / sizeof bad[0]; b++) {
        char json[1024];
        snprintf(json, sizeof json,
                 "{ \"program\": \"sp.fbk\", \"step\": [ %s, {\"launch\": \"paint\"} ] }\n",
                 bad[b].step);
        write_file("spbad.json", json);
        snprintf(cmd, sizeof cmd, "%s run %s/spbad.json %s --mode %s", fusebox(), tmpdir,
                 paths[p], modes[m]);
        int rc = sh(cmd, &out);
        ck_assert_msg(rc == 2 && strstr(out, bad[b].want), "%s (%s): rc %d\n%s", cmd, bad[b].step,
                      rc, out);
        assert_user_terms(out);
        free(out);
      }
    }
  snprintf(cmd, sizeof cmd, "kill %d", pid);
  ck_assert_int_eq(sh(cmd, NULL), 0);
}
END_TEST

/* A private fuseboxd (fusebox run without --server) serves its one user:
 * nothing on stderr about tenants' code running as root, as root or not;
 * fuseboxd --isolation thread as root without --private still warns, and
 * with --private (and --tenants) too. */
START_TEST(private_run_is_quiet) {
  write_file("sp.fbk", sparse_prog);
  write_file("quiet.json", "{ \"program\": \"sp.fbk\", \"step\": [ {\"launch\": \"paint\"} ],\n"
                           "  \"checks\": [ {\"read\": \"x\", \"sum\": 64.0} ] }\n");
  char cmd[8192], *out;
  for (int m = 0; m < 2; m++) {
    snprintf(cmd, sizeof cmd, "%s run %s/quiet.json --mode %s", fusebox(), tmpdir,
             m ? "async" : "sync");
    ck_assert_int_eq(sh(cmd, &out), 0);
    ck_assert_msg(!strstr(out, "WARN") && !strstr(out, "as root"), "%s", out);
    ck_assert_msg(strstr(out, "all checks passed"), "%s", out);
    free(out);
  }
  if (geteuid() != 0) return; /* the warning is about root */
  const char *bd = getenv("FB_BUILD_DIR");
  for (int priv = 0; priv < 2; priv++) {
    char sock[512], log[512];
    snprintf(sock, sizeof sock, "unix:%s/q%d.sock", tmpdir, priv);
    snprintf(log, sizeof log, "%s/q%d.log", tmpdir, priv);
    snprintf(cmd, sizeof cmd,
             "%s/server/fuseboxd --listen %s --isolation thread %s </dev/null >/dev/null "
             "2>%s & echo $!",
             bd ? bd : "build", sock, priv ? "--private" : "", log);
    ck_assert_int_eq(sh(cmd, &out), 0);
    int pid = atoi(out);
    free(out);
    int up = 0;
    for (int i = 0; i < 100 && !up; i++) {
      snprintf(cmd, sizeof cmd, "%s ping --server %s", fusebox(), sock);
      up = sh(cmd, &out) == 0 && strstr(out, "SERVING");
      free(out);
      if (!up) usleep(50000);
    }
    ck_assert_msg(up, "fuseboxd did not come up on %s", sock);
    snprintf(cmd, sizeof cmd, "kill %d; while kill -0 %d 2>/dev/null; do sleep 0.05; done", pid,
             pid);
    ck_assert_int_eq(sh(cmd, NULL), 0);
    out = fbt_read_file(log, NULL);
    ck_assert_ptr_nonnull(out);
    int warned = strstr(out, "WARN  isolation thread as root") != NULL;
    ck_assert_msg(warned == !priv, "--private %d:\n%s", priv, out);
    ck_assert_msg(priv == !!strstr(out, "INFO  isolation thread as root: a private daemon"), "%s",
                  out);
    free(out);
  }
}
END_TEST

int main(void) {
  snprintf(tmpdir, sizeof tmpdir, "/tmp/fbcli.XXXXXX");
  if (!mkdtemp(tmpdir)) return 1;
  Suite *s = suite_create("cli");
  TCase *tc = tcase_create("cli");
  tcase_set_timeout(tc, 300);
  tcase_add_test(tc, examples_pass);
  tcase_add_test(tc, params_checks_and_npy);
  tcase_add_test(tc, failed_check_names_it);
  tcase_add_test(tc, bad_input_is_named);
  tcase_add_test(tc, check_ir_and_help);
  tcase_add_test(tc, cli_conventions);
  tcase_add_test(tc, bench_modes_and_json);
  tcase_add_test(tc, bench_equal_infinities);
  tcase_add_test(tc, u64_beyond_json_integers);
  tcase_add_test(tc, graph_and_trace);
  tcase_add_test(tc, server_commands);
  tcase_add_test(tc, launch_errors_fail_every_path);
  tcase_add_test(tc, repeated_action_errors_name_their_launch);
  tcase_add_test(tc, run_prints_layout_warnings);
  tcase_add_test(tc, run_json);
  tcase_add_test(tc, snapshots_and_pictures);
  tcase_add_test(tc, checkpoint_resume);
  tcase_add_test(tc, checkpoint_resume_server);
  tcase_add_test(tc, bad_saves_are_named);
  tcase_add_test(tc, orientation_and_particles);
  tcase_add_test(tc, outputs_stay_inside);
  tcase_add_test(tc, out_open_both_ways);
  tcase_add_test(tc, perf_map);
  suite_add_tcase(s, tc);
  TCase *ti = tcase_create("interrupt"); /* Ctrl-C, SIGTERM, SIGKILL */
  tcase_set_timeout(ti, 300);
  tcase_add_test(ti, ctrl_c_stops_private_daemon);
  tcase_add_test(ti, sigterm_and_local);
  tcase_add_test(ti, sigkill_takes_the_daemon);
  tcase_add_test(ti, ctrl_c_on_server);
  suite_add_tcase(s, ti);
  TCase *tn = tcase_create("snodes"); /* named SNodes and fields from JSON sessions */
  tcase_set_timeout(tn, 300);
  tcase_add_test(tn, snodes_from_json);
  tcase_add_test(tn, private_run_is_quiet);
  suite_add_tcase(s, tn);
  int rc = fbt_run(s);
  char cmd[512];
  snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
  if (system(cmd) != 0) rc = 1;
  return rc;
}
