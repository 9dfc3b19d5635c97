/* `fusebox bench FILE.json...`: the paper's harness over JSON sessions.
 * For each file and each mode (sync, async, async-no-PASS), a fresh session
 * runs setup, one step and a sync (the counters of that first step are the
 * ones reported, as in the paper), the warm-up steps, then the timed steps
 * with a sync after each. Checks run in every mode and same_across_modes
 * compares fields between modes. Prints a table with each mode's ratio to
 * sync, geometric means over files, and optionally --json / --csv. */
#define _GNU_SOURCE
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli/cli.h"
#include "cli/cli_session.h"

typedef struct mode_def {
  const char *name;
  const char *mode;
  unsigned passes_off; /* FB_SESS_NO_* bits */
} mode_def;

static const mode_def known_modes[] = {
    {"sync", "sync", 0},
    {"async", "async", 0},
    {"async-no-listgen", "async", FB_SESS_NO_LISTGEN},
    {"async-no-demote", "async", FB_SESS_NO_DEMOTE},
    {"async-no-fusion", "async", FB_SESS_NO_FUSION},
    {"async-no-dse", "async", FB_SESS_NO_DSE},
};
enum {
  NKNOWN = sizeof known_modes / sizeof known_modes[0],
  MAXMODES = 16
};

typedef struct mode_result {
  const mode_def *def;
  int ok;            /* ran to the end */
  int checks_failed;
  double wall_s, backend_s;       /* per timed step */
  double cpu_s;                   /* process CPU time per timed step */
  double first_s;                 /* wall-clock of the first step (compiling) */
  fb_counters first;              /* counters of the first step */
  fb_counters total;              /* the whole run */
  fb_counters timed;              /* the timed steps together */
  double tasks_per_step;          /* tasks launched per timed step */
  double **fields;                /* same_across_modes fields, as f64 */
  int64_t *nvals;
  json_t *stats;                  /* per same_across_modes field: n, sum, abs_sum, min, max */
} mode_result;

typedef struct case_result {
  char *name;
  int nmodes;
  mode_result m[MAXMODES];
  int checks_passed;
} case_result;

static double clock_s(clockid_t id) {
  struct timespec ts;
  clock_gettime(id, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
static double now(void) { return clock_s(CLOCK_MONOTONIC); }
/* CPU time of the whole process (every thread): steadier than wall-clock on
 * a shared machine, where other jobs take cores away. */
static double cpu_now(void) { return clock_s(CLOCK_PROCESS_CPUTIME_ID); }

static const mode_def *find_mode(const char *name) {
  for (int i = 0; i < NKNOWN; i++)
    if (!strcmp(known_modes[i].name, name)) return &known_modes[i];
  return NULL;
}

/* What happened between two readings (every counter of FB_COUNTERS). */
static fb_counters diff(const fb_counters *a, const fb_counters *b) {
  return fb_counters_since(a, b);
}

static json_t *same_check(const fb_sess_file *f) {
  json_t *checks = json_object_get(f->root, "checks");
  size_t i;
  json_t *c;
  json_array_foreach(checks, i, c) if (json_object_get(c, "same_across_modes")) return c;
  return NULL;
}

static json_t *same_fields(const fb_sess_file *f) {
  return json_object_get(same_check(f), "same_across_modes");
}

static int step(fb_sess_run *r, char **err) {
  int rc = fb_sess_actions(r, "step", err);
  if (!rc) rc = fb_sess_sync(r, err);
  return rc;
}

/* Summary statistics of the fields compared between modes, for --json: they
 * let a peer implementation (bench/peers/) check that it computed the same
 * thing without writing whole fields out. */
static json_t *field_stats(json_t *same, double **fields, const int64_t *nvals) {
  json_t *out = json_object();
  for (size_t i = 0; i < json_array_size(same); i++) {
    double sum = 0, abs_sum = 0, lo = INFINITY, hi = -INFINITY;
    for (int64_t k = 0; k < nvals[i]; k++) {
      double x = fields[i][k];
      sum += x;
      abs_sum += fabs(x);
      lo = fmin(lo, x);
      hi = fmax(hi, x);
    }
    json_object_set_new(out, json_string_value(json_array_get(same, i)),
                        json_pack("{s:I,s:f,s:f,s:f,s:f}", "n", (json_int_t)nvals[i], "sum", sum,
                                  "abs_sum", abs_sum, "min", nvals[i] ? lo : 0.0, "max",
                                  nvals[i] ? hi : 0.0));
  }
  return out;
}

/* A mode's --json object with its field statistics added (takes j). */
static json_t *with_fields(json_t *j, const mode_result *r) {
  if (j && r->stats) json_object_set(j, "fields", r->stats);
  return j;
}

static char bench_backend[16]; /* of the first session that started */
static char bench_device[128]; /* in words, of the first in-process engine ("" on a server) */
static int bench_threads; /* --threads: the in-process engine's CPU threads (0: one per core) */

/* Run one mode of one file; fills res. Returns 0 or a negative code. */
static int run_mode(fb_sess_file *f, mode_result *res, int warmup, int repeat, const char *server,
                    char **err) {
  fb_sess_opts o = {.mode = res->def->mode,
                    .passes_off = res->def->passes_off,
                    .server = server,
                    .skip_saves = 1, /* the step is timed: no snapshots */
                    .cpu_threads = bench_threads};
  FILE *devnull = fopen("/dev/null", "w");
  o.out = devnull;
  fb_sess_run *r = NULL;
  int rc = fb_sess_start(f, &o, &r, err);
  if (!rc && !bench_backend[0]) {
    fb_sess_backend(r, bench_backend, sizeof bench_backend);
    fb_sess_device(r, bench_device, sizeof bench_device);
  }
  fb_counters c0, c1, c2;
  if (!rc) rc = fb_sess_actions(r, "setup", err);
  if (!rc) rc = fb_sess_sync(r, err);
  if (!rc) fb_sess_counters(r, &c0);
  double f0 = now();
  if (!rc) rc = step(r, err);
  res->first_s = now() - f0;
  if (!rc) {
    fb_sess_counters(r, &c1);
    res->first = diff(&c1, &c0);
  }
  for (int i = 0; !rc && i < warmup; i++) rc = step(r, err);
  if (!rc) fb_sess_counters(r, &c1);
  double t0 = now(), u0 = cpu_now();
  for (int i = 0; !rc && i < repeat; i++) rc = step(r, err);
  double t1 = now(), u1 = cpu_now();
  if (!rc) {
    fb_sess_counters(r, &c2);
    res->wall_s = (t1 - t0) / repeat;
    res->cpu_s = (u1 - u0) / repeat;
    res->backend_s = (c2.backend_s - c1.backend_s) / repeat;
    res->tasks_per_step = (double)(c2.tasks_launched - c1.tasks_launched) / repeat;
    res->total = diff(&c2, &c0);
    res->timed = diff(&c2, &c1);
    res->checks_failed = fb_sess_checks(r, err);
    if (res->checks_failed < 0) rc = res->checks_failed;
  }
  json_t *same = rc ? NULL : same_fields(f);
  size_t n = same ? json_array_size(same) : 0;
  res->fields = calloc(n + 1, sizeof(double *));
  res->nvals = calloc(n + 1, sizeof(int64_t));
  for (size_t i = 0; !rc && i < n; i++)
    rc = fb_sess_read_f64(r, json_string_value(json_array_get(same, i)), &res->fields[i],
                          &res->nvals[i], err);
  if (!rc && n) res->stats = field_stats(same, res->fields, res->nvals);
  res->ok = rc == 0;
  fb_sess_stop(r);
  fclose(devnull);
  return rc;
}

/* Compare same_across_modes fields of mode m with mode 0. */
static int compare_modes(const fb_sess_file *f, case_result *cr, int m, FILE *log) {
  json_t *same = same_fields(f), *sc = same_check(f);
  json_t *jr = json_object_get(sc, "rtol"), *ja = json_object_get(sc, "atol");
  double rtol = json_is_number(jr) ? json_number_value(jr) : 1e-5;
  double atol = json_is_number(ja) ? json_number_value(ja) : 1e-6;
  int bad = 0;
  for (size_t i = 0; same && i < json_array_size(same); i++) {
    const char *name = json_string_value(json_array_get(same, i));
    const mode_result *a = &cr->m[0], *b = &cr->m[m];
    if (a->nvals[i] != b->nvals[i]) {
      bad = 1;
      continue;
    }
    double worst = 0;
    int64_t at = -1;
    for (int64_t k = 0; k < a->nvals[i]; k++) {
      double x = a->fields[i][k], y = b->fields[i][k];
      if (x == y || (isnan(x) && isnan(y))) continue; /* equal infinities too */
      /* NaN against a number, or infinities of opposite signs: infinitely off */
      double d = isnan(x) || isnan(y) || isinf(x) || isinf(y) ? INFINITY : fabs(x - y);
      double tol = atol + rtol * fmax(fabs(x), fabs(y));
      if (!(d <= tol) && (at < 0 || d > worst)) {
        worst = d;
        at = k;
      }
    }
    if (at >= 0) {
      fprintf(log,
              "FAIL  %s: field %s differs between %s and %s: [%lld] %.9g vs %.9g (off by %.3g)\n",
              cr->name, name, a->def->name, b->def->name, (long long)at, a->fields[i][at],
              b->fields[i][at], worst);
      bad = 1;
    }
  }
  return bad;
}

static void free_case(case_result *cr, const fb_sess_file *f) {
  json_t *same = same_fields(f);
  size_t n = same ? json_array_size(same) : 0;
  for (int m = 0; m < cr->nmodes; m++) {
    for (size_t i = 0; cr->m[m].fields && i < n; i++) free(cr->m[m].fields[i]);
    free(cr->m[m].fields);
    free(cr->m[m].nvals);
  }
}

static double ratio(double ref, double x) { return x > 0 ? ref / x : 0; }

static const mode_result *mode_in(const case_result *cr, const char *name) {
  for (int m = 0; m < cr->nmodes; m++)
    if (!strcmp(cr->m[m].def->name, name)) return cr->m[m].ok ? &cr->m[m] : NULL;
  return NULL;
}

/* Geometric means over cases of sync / mode for wall, backend and tasks;
 * returns how many cases had both modes. */
static int geomean(const case_result *cases, int ncases, const char *mode, double g[4]) {
  double l[4] = {0, 0, 0, 0};
  int n = 0;
  for (int c = 0; c < ncases; c++) {
    const mode_result *s = mode_in(&cases[c], "sync"), *r = mode_in(&cases[c], mode);
    if (!s || !r || r->wall_s <= 0 || r->backend_s <= 0 || s->backend_s <= 0 ||
        !r->first.tasks_launched)
      continue;
    l[0] += log(s->wall_s / r->wall_s);
    l[1] += log(s->backend_s / r->backend_s);
    l[2] += log((double)s->first.tasks_launched / (double)r->first.tasks_launched);
    l[3] += r->tasks_per_step > 0 ? log(s->tasks_per_step / r->tasks_per_step) : 0;
    n++;
  }
  for (int i = 0; i < 4; i++) g[i] = n ? exp(l[i] / n) : 0;
  return n;
}

static void print_case(FILE *o, const case_result *cr) {
  fprintf(o, "\n%s\n", cr->name);
  fprintf(o, "  %-17s %10s %6s %10s %6s %10s %8s %6s %9s %8s %7s %7s %6s %6s %6s %6s %9s %9s\n",
          "mode", "wall ms", "x", "backend ms", "x", "cpu ms", "tasks", "x", "tasks/st", "stmts",
          "compld", "lg-rm", "fused", "dse", "demot", "hits", "1st ms", "comp ms");
  const mode_result *s = mode_in(cr, "sync");
  for (int m = 0; m < cr->nmodes; m++) {
    const mode_result *r = &cr->m[m];
    if (!r->ok) {
      fprintf(o, "  %-17s (failed)\n", r->def->name);
      continue;
    }
    if (!s) s = r; /* no sync mode: ratios against the first mode */
    fprintf(o,
            "  %-17s %10.3f %6.2f %10.3f %6.2f %10.3f %8llu %6.2f %9.1f %8llu %7llu %7llu %6llu "
            "%6llu %6llu %6llu %9.1f %9.1f\n",
            r->def->name, r->wall_s * 1e3, ratio(s->wall_s, r->wall_s), r->backend_s * 1e3,
            ratio(s->backend_s, r->backend_s), r->cpu_s * 1e3,
            (unsigned long long)r->first.tasks_launched,
            ratio((double)s->first.tasks_launched, (double)r->first.tasks_launched),
            r->tasks_per_step, (unsigned long long)r->first.statements_emitted,
            (unsigned long long)r->first.tasks_compiled,
            (unsigned long long)r->first.listgens_removed, (unsigned long long)r->first.tasks_fused,
            (unsigned long long)r->first.dead_stores_removed,
            (unsigned long long)r->first.activations_demoted,
            (unsigned long long)r->first.cache_hits, r->first_s * 1e3, r->first.compile_s * 1e3);
  }
  /* compiles the timed steps paid for (a window the first step did not
   * show, an evicted task): their CPU time is in the figures above */
  for (int m = 0; m < cr->nmodes; m++) {
    const mode_result *r = &cr->m[m];
    if (r->ok && r->timed.tasks_compiled)
      fprintf(o, "  %s compiled %llu task%s in the timed steps (%.1f ms of compile time)\n",
              r->def->name, (unsigned long long)r->timed.tasks_compiled,
              r->timed.tasks_compiled == 1 ? "" : "s", r->timed.compile_s * 1e3);
  }
}

static json_t *mode_json(const mode_result *r) {
  json_t *j = json_pack(
      "{s:f,s:f,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I}", "wall_s", r->wall_s, "backend_s",
      r->backend_s, "tasks_launched", (json_int_t)r->first.tasks_launched, "statements_emitted",
      (json_int_t)r->first.statements_emitted, "tasks_compiled",
      (json_int_t)r->first.tasks_compiled, "listgens_removed",
      (json_int_t)r->first.listgens_removed, "tasks_fused", (json_int_t)r->first.tasks_fused,
      "dead_stores_removed", (json_int_t)r->first.dead_stores_removed, "activations_demoted",
      (json_int_t)r->first.activations_demoted, "cache_hits", (json_int_t)r->first.cache_hits,
      "total_tasks_launched", (json_int_t)r->total.tasks_launched);
  json_object_set_new(j, "tasks_per_timed_step", json_real(r->tasks_per_step));
  json_object_set_new(j, "cpu_s", json_real(r->cpu_s));
  json_object_set_new(j, "optimizer_s", json_real(r->total.optimizer_s));
  json_object_set_new(j, "first_step_s", json_real(r->first_s));
  json_object_set_new(j, "compile_s", json_real(r->first.compile_s));
  json_object_set_new(j, "fuse_refused", json_integer((json_int_t)r->first.fuse_refused));
  json_object_set_new(j, "fuse_fallbacks", json_integer((json_int_t)r->first.fuse_fallbacks));
  json_object_set_new(j, "plans_reused", json_integer((json_int_t)r->total.plans_reused));
  json_object_set_new(j, "timed_tasks_compiled",
                      json_integer((json_int_t)r->timed.tasks_compiled));
  json_object_set_new(j, "timed_compile_s", json_real(r->timed.compile_s));
  return j;
}

static int write_outputs(const char *json_out, const char *csv_out, case_result *cases,
                         int ncases) {
  json_t *root = json_object(), *jc = json_array(), *geo = json_object();
  char host[256] = "";
  gethostname(host, sizeof host - 1);
  json_object_set_new(root, "machine",
                      json_pack("{s:s,s:s,s:i,s:i,s:s}", "backend",
                                bench_backend[0] ? bench_backend : "?", "device", host, "cores",
                                (int)sysconf(_SC_NPROCESSORS_ONLN), "cpu_threads", bench_threads,
                                "engine_device", bench_device));
  for (int c = 0; c < ncases; c++) {
    json_t *jm = json_object();
    for (int m = 0; m < cases[c].nmodes; m++)
      if (cases[c].m[m].ok)
        json_object_set_new(jm, cases[c].m[m].def->name,
                            with_fields(mode_json(&cases[c].m[m]), &cases[c].m[m]));
    json_array_append_new(jc, json_pack("{s:s,s:b,s:o}", "name", cases[c].name, "checks_passed",
                                        cases[c].checks_passed, "modes", jm));
  }
  for (int m = 1; m < NKNOWN; m++) {
    double g[4];
    if (geomean(cases, ncases, known_modes[m].name, g))
      json_object_set_new(geo, known_modes[m].name,
                          json_pack("{s:f,s:f,s:f,s:f}", "wall", g[0], "backend", g[1], "tasks",
                                    g[2], "tasks_per_timed_step", g[3]));
  }
  json_object_set_new(root, "cases", jc);
  json_object_set_new(root, "geomean", geo);
  int rc = 0;
  if (json_out && json_dump_file(root, json_out, JSON_INDENT(2))) {
    fprintf(stderr, "fusebox bench: cannot write %s\n", json_out);
    rc = FB_EIO;
  }
  json_decref(root);
  if (!csv_out) return rc;
  FILE *f = fopen(csv_out, "w");
  if (!f) {
    fprintf(stderr, "fusebox bench: cannot write %s\n", csv_out);
    return FB_EIO;
  }
  fprintf(f, "case,mode,wall_s,backend_s,tasks_launched,statements_emitted,tasks_compiled,"
             "listgens_removed,tasks_fused,dead_stores_removed,activations_demoted,cache_hits\n");
  for (int c = 0; c < ncases; c++)
    for (int m = 0; m < cases[c].nmodes; m++) {
      const mode_result *r = &cases[c].m[m];
      if (!r->ok) continue;
      fprintf(f, "%s,%s,%.9g,%.9g,%llu,%llu,%llu,%llu,%llu,%llu,%llu,%llu\n", cases[c].name,
              r->def->name, r->wall_s, r->backend_s, (unsigned long long)r->first.tasks_launched,
              (unsigned long long)r->first.statements_emitted,
              (unsigned long long)r->first.tasks_compiled,
              (unsigned long long)r->first.listgens_removed,
              (unsigned long long)r->first.tasks_fused,
              (unsigned long long)r->first.dead_stores_removed,
              (unsigned long long)r->first.activations_demoted,
              (unsigned long long)r->first.cache_hits);
    }
  fclose(f);
  return rc;
}

static void print_geomeans(FILE *o, case_result *cases, int ncases) {
  if (ncases < 2) return;
  fprintf(o, "\ngeometric mean over %d cases of sync / mode on the %s backend (higher is better)\n",
          ncases, bench_backend[0] ? bench_backend : "?");
  fprintf(o, "  %-17s %8s %8s %8s %9s\n", "mode", "wall", "backend", "tasks", "tasks/st");
  for (int m = 1; m < NKNOWN; m++) {
    double g[4];
    if (geomean(cases, ncases, known_modes[m].name, g))
      fprintf(o, "  %-17s %8.2f %8.2f %8.2f %9.2f\n", known_modes[m].name, g[0], g[1], g[2], g[3]);
  }
}

static int help(FILE *f) {
  fprintf(f, "usage: fusebox bench FILE.json... [--modes LIST] [--warmup N] [--repeat N]\n"
             "                     [--param NAME=VALUE]... [--json OUT] [--csv OUT]\n"
             "                     [--server ADDR | --local [--threads N]]\n"
             "  Runs each JSON session in every mode (default: the file's bench.modes, else\n"
             "  sync,async) side by side: setup, one step (its counters are reported), the\n"
             "  warm-up steps, then the timed steps with a sync after each. Prints wall-clock,\n"
             "  backend and process CPU time per step (CPU time is the steadier figure on a\n"
             "  shared machine), tasks launched, statements emitted, tasks compiled\n"
             "  and the optimizer counters, each mode's ratio to sync, and geometric means\n"
             "  over several files. Checks run in every mode; a failed check or a field that\n"
             "  differs between modes makes the exit status 1, a launch that fails (named\n"
             "  with its JSON path) 2. --param sets a parameter of every file (e.g.\n"
             "  --param scale=64 for GPU sizes). The engine runs in this process unless\n"
             "  --server (default: $FUSEBOX_SERVER; --local ignores it) names a fuseboxd\n"
             "  (then times include the transport). \"save\" actions are skipped (the step\n"
             "  is timed); checks' \"to\" files go beside each JSON file, inside its\n"
             "  folder only (docs/sessions.md). Ctrl-C stops it at once: \"interrupted\",\n"
             "  exit status 130.\n"
             "  --threads N (with --local) gives the in-process CPU device N threads (default:\n"
             "  one per online core; a fuseboxd uses its own cpu_threads setting).\n"
             "  modes: sync async async-no-listgen async-no-demote async-no-fusion async-no-dse\n"
             "examples:\n"
             "  fusebox bench bench/micro/*.json\n"
             "  fusebox bench bench/micro/chain_copy.json --modes sync,async --json out.json\n"
             "--json also records, per mode, the count, sum, sum of |x|, min and max of each\n"
             "same_across_modes field (\"fields\"; scripts/bench_peers.sh compares them).\n");
  return f == stdout ? 0 : 2;
}

static int parse_modes(char *list, const char **out) {
  int n = 0;
  for (char *t = strtok(list, ","); t; t = strtok(NULL, ",")) {
    if (!find_mode(t)) {
      fprintf(stderr, "fusebox bench: unknown mode '%s'\n", t);
      return -1;
    }
    if (n < MAXMODES) out[n++] = t;
  }
  return n;
}

static int modes_of(const fb_sess_file *f, const char **cli, int ncli, const char **out) {
  if (ncli > 0) {
    for (int i = 0; i < ncli; i++) out[i] = cli[i];
    return ncli;
  }
  json_t *jm = json_object_get(json_object_get(f->root, "bench"), "modes");
  int n = 0;
  for (size_t i = 0; jm && i < json_array_size(jm) && n < MAXMODES; i++) {
    const char *s = json_string_value(json_array_get(jm, i));
    if (!s || !find_mode(s)) {
      fprintf(stderr, "fusebox bench: %s: $.bench.modes[%zu]: unknown mode '%s'\n", f->path, i,
              s ? s : "?");
      return -1;
    }
    out[n++] = s;
  }
  if (n == 0) {
    out[0] = "sync";
    out[1] = "async";
    n = 2;
  }
  return n;
}

static int bench_int(const fb_sess_file *f, const char *key, int dflt, int override) {
  if (override >= 0) return override;
  json_t *v = json_object_get(json_object_get(f->root, "bench"), key);
  return json_is_integer(v) ? (int)json_integer_value(v) : dflt;
}

/* Run one file in its modes. Returns 0 when everything passed, 1 when a
 * check failed or modes disagree, 2 when the file could not run. */
static int bench_file(const char *path, const char *server, json_t *params, const char **cli_modes,
                      int ncli, int warmup_o, int repeat_o, case_result *cr, const char **modes_out,
                      int *nmodes_out, int idx, int nfiles) {
  fb_sess_file f;
  char *err = NULL;
  int rc = fb_sess_load(path, params, &f, &err);
  if (rc) {
    fprintf(stderr, "fusebox bench: %s\n", err ? err : fb_strerror(rc));
    free(err);
    fb_sess_free(&f);
    return 2;
  }
  int nm = modes_of(&f, cli_modes, ncli, modes_out);
  int warmup = bench_int(&f, "warmup", 3, warmup_o), repeat = bench_int(&f, "repeat", 10, repeat_o);
  if (repeat < 1) repeat = 1;
  cr->name = strdup(f.name);
  cr->nmodes = nm < 0 ? 0 : nm;
  *nmodes_out = cr->nmodes;
  int status = nm < 0 ? 2 : 0;
  for (int m = 0; m < cr->nmodes; m++) {
    cr->m[m].def = find_mode(modes_out[m]);
    fprintf(stderr, "[%d/%d] %s: %s (%d/%d): %d warm-up + %d timed steps\n", idx + 1, nfiles,
            f.name, cr->m[m].def->name, m + 1, cr->nmodes, warmup, repeat);
    rc = run_mode(&f, &cr->m[m], warmup, repeat, server, &err);
    if (rc) {
      fprintf(stderr, "fusebox bench: %s, mode %s: %s\n", f.name, cr->m[m].def->name,
              err ? err : fb_strerror(rc));
      status = 2;
    } else if (cr->m[m].checks_failed) {
      fprintf(stderr, "FAIL  %s: %d check%s failed in mode %s (run 'fusebox run %s --mode %s')\n",
              f.name, cr->m[m].checks_failed, cr->m[m].checks_failed == 1 ? "" : "s",
              cr->m[m].def->name, path, cr->m[m].def->mode);
      if (!status) status = 1;
    }
  }
  for (int m = 1; m < cr->nmodes; m++)
    if (cr->m[0].ok && cr->m[m].ok && compare_modes(&f, cr, m, stderr) && !status) status = 1;
  cr->checks_passed = status == 0;
  free(err);
  free_case(cr, &f);
  fb_sess_free(&f);
  return status;
}

/* A whole decimal number >= min for option opt, or 1 (after a message). */
static int count_arg(const char *opt, const char *text, int min, int *out) {
  char *end;
  errno = 0;
  long v = strtol(text, &end, 10);
  if (errno || end == text || *end || v < min || v > 1000000) {
    fprintf(stderr, "fusebox bench: %s: '%s' is not a whole number from %d to 1000000\n", opt, text,
            min);
    return 1;
  }
  *out = (int)v;
  return 0;
}

int fb_cli_bench(int argc, char **argv) {
  const char *files[256], *cli_modes[MAXMODES], *json_out = NULL, *csv_out = NULL, *server = NULL;
  int nfiles = 0, ncli = 0, warmup = -1, repeat = -1, local = 0, threads = 0;
  json_t *params = json_object();
  for (int i = 1; i < argc; i++) {
    int bad = 0;
    if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
      json_decref(params);
      return help(stdout);
    }
    if (!strcmp(argv[i], "--param") && i + 1 < argc) bad = fb_cli_add_param(params, argv[++i]);
    else if (!strcmp(argv[i], "--modes") && i + 1 < argc)
      bad = (ncli = parse_modes(argv[++i], cli_modes)) < 0;
    else if (!strcmp(argv[i], "--json") && i + 1 < argc) json_out = argv[++i];
    else if (!strcmp(argv[i], "--server") && i + 1 < argc) server = argv[++i];
    else if (!strcmp(argv[i], "--local")) local = 1;
    else if (!strcmp(argv[i], "--csv") && i + 1 < argc) csv_out = argv[++i];
    else if (!strcmp(argv[i], "--warmup") && i + 1 < argc)
      bad = count_arg("--warmup", argv[++i], 0, &warmup);
    else if (!strcmp(argv[i], "--repeat") && i + 1 < argc)
      bad = count_arg("--repeat", argv[++i], 1, &repeat);
    else if (!strcmp(argv[i], "--threads") && i + 1 < argc)
      bad = count_arg("--threads", argv[++i], 1, &threads);
    else if (argv[i][0] != '-' && nfiles < 256) files[nfiles++] = argv[i];
    else bad = -1;
    if (bad) {
      json_decref(params);
      return bad < 0 ? help(stderr) : 2;
    }
  }
  if (!nfiles || (local && server)) {
    json_decref(params);
    return help(stderr);
  }
  if (!server && !local) server = fb_cli_env_server(); /* FUSEBOX_SERVER */
  if (threads && server) {
    fprintf(stderr, "fusebox bench: --threads sets the in-process engine's threads; with "
                    "--server the server's cpu_threads setting applies (use --local)\n");
    json_decref(params);
    return 2;
  }
  bench_threads = threads;
  fb_cli_on_interrupt("bench", 0); /* Ctrl-C: exit 130 (closing a --server session) */
  case_result *cases = calloc((size_t)nfiles, sizeof *cases);
  const char *modes[MAXMODES] = {0};
  int nmodes = 0, status = 0;
  for (int i = 0; i < nfiles; i++) {
    int s = bench_file(files[i], server, params, ncli ? cli_modes : NULL, ncli, warmup, repeat,
                       &cases[i], modes, &nmodes, i, nfiles);
    if (s > status) status = s;
    print_case(stdout, &cases[i]);
    fflush(stdout);
  }
  print_geomeans(stdout, cases, nfiles);
  if ((json_out || csv_out) && write_outputs(json_out, csv_out, cases, nfiles)) status = 2;
  for (int i = 0; i < nfiles; i++) {
    for (int m = 0; m < cases[i].nmodes; m++) json_decref(cases[i].m[m].stats);
    free(cases[i].name);
  }
  free(cases);
  json_decref(params);
  printf("\n%s\n", status == 0   ? "all checks passed in every mode"
                   : status == 1 ? "some checks FAILED (see above)"
                                 : "some sessions could not run (see above)");
  return status;
}
