/* The differential random-program tester (docs/testing.md).
 *
 * Random programs — random layouts (dense, pointer, bitmasked, dynamic),
 * random kernels (reads, writes, atomics, stencils, activation,
 * deactivation, appends, returns), host reads and writes, flush points —
 * run in the reference interpreter (the oracle) and in every configuration
 * of the engine; the field contents, host reads and return values must
 * match exactly. A failure prints the seed and the program shrunk to what
 * still fails, as IR text that replays.
 *
 * CI runs DT_FIXED programs from the fixed seeds 1..DT_FIXED and
 * FB_DIFF_FRESH (default 16) fresh seeds, which it prints. Environment:
 *
 *   FB_DIFF_SEED=S            run only seed S (decimal or 0x hex), print it
 *   FB_DIFF_COUNT=N           run N programs from seed FB_DIFF_START (default:
 *                             a fresh one) instead of the CI set: long runs
 *   FB_DIFF_FILE=path         replay a printed program (IR text + "#!" steps)
 *   FB_DIFF_CONFIGS=a,b       only these configurations (names as printed)
 *   FB_DIFF_FRESH=N           fresh seeds in the CI set
 *   FB_DIFF_VERBOSE=1         print every program and its outcome
 *   FB_DIFF_THREADS=N         programs run on N threads at once (default 2)
 *   FB_DIFF_SCALE=K           programs K times as large (default 1)
 *   FB_DIFF_BIG=N             big programs in the "big" case (default 2)
 *   FB_DIFF_FAKE_DEVICE=1     the device runs no kernel (the fake CUDA driver
 *                             of tests/fakecuda): the "big" case compares
 *                             every configuration with sync mode instead of
 *                             the oracle (what the host decides: return
 *                             codes, errors, fusion within the GPU's limits)
 *
 * Big programs (case "big", dt_gen_prog_big): kernels of up to DT_MAXP
 * parameters and large loop bodies, each launched many times in a row,
 * under every fusion cap; fusion must meet its cost model (fuse_refused)
 * and never hand out a task the backend refuses (fuse_fallbacks stays 0).
 * ctest runs them on the CPU (test_differential_big) and, as
 * test_differential_fakecuda, on the CUDA backend against the fake driver,
 * where the parameter limit (503) applies; failing programs run as
 * test_differential_errors. Failing programs (case "errors", dt_gen_prog_failing): async
 * mode must report the errors sync mode reports (kernel, launch number,
 * message).
 *
 * Stream programs (case "stream", dt_gen_prog_stream, ctest
 * test_differential_stream): periods of launches repeated past flush_every
 * with syncs, every field read after them, (de)activation between frames,
 * stencils with element-wise readers, stand-ins (the case's engine has a
 * stand-in threshold of 0), and a failing variant; FB_DIFF_FAILING_STREAM=1
 * with FB_DIFF_SEED picks the failing one. Every async run must name the
 * launch and kernel sync mode names, fused tasks included (docs/testing.md,
 * "Blame in fused tasks").
 *
 * The sources of the tester live in tests/difftest/ and are compiled into
 * this one executable. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "support.h"

#include "difftest/gen_kernel.c"
#include "difftest/gen_layout.c"
#include "difftest/gen_prog.c"
#include "difftest/gen_stream.c"
#include "difftest/run.c"
#include "difftest/shrink.c"
#include "difftest/text.c"

#define DT_FIXED 300
#define DT_SHRINK_CHECKS 600 /* per failure */
#define DT_SHRINK_MAX 3      /* failures shrunk per run; the others print only the seed */

/* Every configuration compared with the oracle. */
static const dt_config dt_configs[] = {
    {.name = "sync", .kind = DT_CFG_SYNC},
    {.name = "async:all", .kind = DT_CFG_ASYNC, .passes = FB_PASSES_ALL, .flush_every = -1},
    {.name = "async:all-flush3-fuse4",
     .kind = DT_CFG_ASYNC,
     .passes = FB_PASSES_ALL,
     .flush_every = 3,
     .max_fuse = 4},
    {.name = "async:none", .kind = DT_CFG_ASYNC, .passes = 0, .flush_every = -1},
    {.name = "async:listgen", .kind = DT_CFG_ASYNC, .passes = FB_PASSES_LISTGEN},
    {.name = "async:demote", .kind = DT_CFG_ASYNC, .passes = FB_PASSES_DEMOTE},
    {.name = "async:fusion", .kind = DT_CFG_ASYNC, .passes = FB_PASSES_FUSION},
    {.name = "async:dse", .kind = DT_CFG_ASYNC, .passes = FB_PASSES_DSE},
    {.name = "opt-interp:none", .kind = DT_CFG_OPT_INTERP, .passes = 0},
    {.name = "opt-interp:all", .kind = DT_CFG_OPT_INTERP, .passes = FB_PASS_ALL},
    {.name = "opt-interp:all-fuse4",
     .kind = DT_CFG_OPT_INTERP,
     .passes = FB_PASS_ALL,
     .max_fuse = 4},
    {.name = "opt-interp:demote", .kind = DT_CFG_OPT_INTERP, .passes = FB_PASS_DEMOTE},
    {.name = "opt-interp:listgen", .kind = DT_CFG_OPT_INTERP, .passes = FB_PASS_LISTGEN},
    {.name = "opt-interp:dse", .kind = DT_CFG_OPT_INTERP, .passes = FB_PASS_DSE},
    {.name = "opt-interp:fuse", .kind = DT_CFG_OPT_INTERP, .passes = FB_PASS_FUSE},
    {.name = "opt-interp:fuse+simplify",
     .kind = DT_CFG_OPT_INTERP,
     .passes = FB_PASS_FUSE | FB_PASS_SIMPLIFY},
};
#define DT_NCONFIGS ((int)(sizeof dt_configs / sizeof dt_configs[0]))

#define DT_UNCAPPED 1000000 /* max_fuse_per_task: only the cost model stops fusion */

/* Big programs: every fusion cap, and the cost model alone. */
static const dt_config dt_big_configs[] = {
    {.name = "sync", .kind = DT_CFG_SYNC},
    {.name = "async:all", .kind = DT_CFG_ASYNC, .passes = FB_PASSES_ALL, .flush_every = -1},
    {.name = "async:all-fuse2",
     .kind = DT_CFG_ASYNC,
     .passes = FB_PASSES_ALL,
     .flush_every = -1,
     .max_fuse = 2},
    {.name = "async:all-fuse8",
     .kind = DT_CFG_ASYNC,
     .passes = FB_PASSES_ALL,
     .flush_every = -1,
     .max_fuse = 8},
    {.name = "async:all-uncapped",
     .kind = DT_CFG_ASYNC,
     .passes = FB_PASSES_ALL,
     .flush_every = -1,
     .max_fuse = DT_UNCAPPED},
    {.name = "async:all-flush16-uncapped",
     .kind = DT_CFG_ASYNC,
     .passes = FB_PASSES_ALL,
     .flush_every = 16,
     .max_fuse = DT_UNCAPPED},
    {.name = "opt-interp:all-uncapped",
     .kind = DT_CFG_OPT_INTERP,
     .passes = FB_PASS_ALL,
     .max_fuse = DT_UNCAPPED},
};
#define DT_NBIG ((int)(sizeof dt_big_configs / sizeof dt_big_configs[0]))

/* Failing programs: sync against async with and without fusion. */
static const dt_config dt_err_configs[] = {
    {.name = "sync", .kind = DT_CFG_SYNC},
    {.name = "async:all", .kind = DT_CFG_ASYNC, .passes = FB_PASSES_ALL, .flush_every = -1},
    {.name = "async:all-flush3-fuse4",
     .kind = DT_CFG_ASYNC,
     .passes = FB_PASSES_ALL,
     .flush_every = 3,
     .max_fuse = 4},
    {.name = "async:none", .kind = DT_CFG_ASYNC, .passes = 0, .flush_every = -1},
    {.name = "async:fusion", .kind = DT_CFG_ASYNC, .passes = FB_PASSES_FUSION, .flush_every = -1},
};
#define DT_NERR ((int)(sizeof dt_err_configs / sizeof dt_err_configs[0]))

/* Stream programs (case "stream", dt_gen_prog_stream): the default
 * flush_every (windows aligned to the period, plans reused, flushes
 * adapted), a fixed one that cuts periods anywhere, none, and each pass
 * alone, on an engine whose stand-in threshold is 0 (every demoted task
 * compiles in the background behind its stand-in). Failing stream programs
 * also compare their first error with sync mode's (same_errors). */
static const dt_config dt_stream_configs[] = {
    {.name = "sync", .kind = DT_CFG_SYNC},
    {.name = "async:all", .kind = DT_CFG_ASYNC, .passes = FB_PASSES_ALL},
    {.name = "async:all-flush7-fuse4",
     .kind = DT_CFG_ASYNC,
     .passes = FB_PASSES_ALL,
     .flush_every = 7,
     .max_fuse = 4},
    {.name = "async:all-noflush", .kind = DT_CFG_ASYNC, .passes = FB_PASSES_ALL, .flush_every = -1},
    {.name = "async:none", .kind = DT_CFG_ASYNC, .passes = 0},
    {.name = "async:listgen", .kind = DT_CFG_ASYNC, .passes = FB_PASSES_LISTGEN},
    {.name = "async:demote", .kind = DT_CFG_ASYNC, .passes = FB_PASSES_DEMOTE},
    {.name = "async:fusion", .kind = DT_CFG_ASYNC, .passes = FB_PASSES_FUSION},
    {.name = "async:dse", .kind = DT_CFG_ASYNC, .passes = FB_PASSES_DSE},
    {.name = "opt-interp:all", .kind = DT_CFG_OPT_INTERP, .passes = FB_PASS_ALL},
};
#define DT_NSTREAM ((int)(sizeof dt_stream_configs / sizeof dt_stream_configs[0]))

enum {
  DT_GEN_ORDINARY = 0,
  DT_GEN_STREAM,
  DT_GEN_STREAM_FAILING
};

typedef struct dt_failure {
  dt_prog p;    /* a copy of the failing program */
  int config;   /* index into the run's configurations */
  char msg[DT_ERRLEN];
} dt_failure;

#define DT_MAX_FAILURES 64

typedef struct dt_run {
  dt_env env;
  const char *only; /* FB_DIFF_CONFIGS */
  int scale;        /* FB_DIFF_SCALE */
  const dt_config *configs; /* dt_configs, or dt_stream_configs */
  int nconfigs;
  int gen;          /* DT_GEN_*: what run_seed generates */
  const char *replay_case; /* CK_RUN_CASE of a replay ("" for the default) */
  pthread_mutex_t mu; /* guards everything below */
  int programs, checks, failures;
  uint64_t fused, dse, demoted, listgens; /* optimizer counters summed over engine runs */
  uint64_t aligned, standins, plans, errors; /* stream programs: engine runs */
  dt_failure fails[DT_MAX_FAILURES];
  int nfails;
  char failed_list[2048];
  /* the work list */
  const uint64_t *seeds;
  int nseeds, next;
} dt_run;

static uint64_t env_u64(const char *name, uint64_t dflt) {
  const char *s = getenv(name);
  return s && *s ? strtoull(s, NULL, 0) : dflt;
}

static int config_on(const dt_run *r, const dt_config *c) {
  if (!r->only || !*r->only) return 1;
  size_t n = strlen(c->name);
  for (const char *p = r->only; (p = strstr(p, c->name)) != NULL; p += n)
    if ((p == r->only || p[-1] == ',') && (p[n] == 0 || p[n] == ',')) return 1;
  return 0;
}

static void dt_run_init(dt_run *r) {
  memset(r, 0, sizeof r[0]);
  fb_engine_config ec = {fbt_backend(), 2, 4}; /* 4 workers: large loops run in parallel */
  char err[256];
  ck_assert_msg(fb_engine_create(&ec, &r->env.eng, err, sizeof err) == 0, "engine: %s", err);
  r->env.verbose = (int)env_u64("FB_DIFF_VERBOSE", 0);
  r->only = getenv("FB_DIFF_CONFIGS");
  r->scale = (int)env_u64("FB_DIFF_SCALE", 1);
  r->configs = dt_configs;
  r->nconfigs = DT_NCONFIGS;
  r->replay_case = "";
  pthread_mutex_init(&r->mu, NULL);
}

static void dt_run_fini(dt_run *r) {
  for (int i = 0; i < r->nfails; i++) dt_prog_free(&r->fails[i].p);
  pthread_mutex_destroy(&r->mu);
  fb_engine_destroy(r->env.eng);
}

/* A failure (any thread): printed now, shrunk later by report_failures. */
static void add_failure(dt_run *r, const dt_prog *p, int config, const char *msg) {
  pthread_mutex_lock(&r->mu);
  const char *cname = config >= 0 ? r->configs[config].name : "generator/oracle";
  char scale[32] = "";
  if (r->scale > 1) snprintf(scale, sizeof scale, " (FB_DIFF_SCALE=%d)", r->scale);
  fprintf(stderr, "difftest: FAIL seed 0x%llx%s config %s: %s\n", (unsigned long long)p->seed,
          scale, cname, msg);
  r->failures++;
  size_t o = strlen(r->failed_list);
  if (o + 48 < sizeof r->failed_list)
    snprintf(r->failed_list + o, sizeof r->failed_list - o, " 0x%llx/%s",
             (unsigned long long)p->seed, cname);
  if (config >= 0 && r->nfails < DT_MAX_FAILURES && dt_prog_copy(p, &r->fails[r->nfails].p) == 0) {
    dt_failure *f = &r->fails[r->nfails++];
    f->config = config;
    snprintf(f->msg, sizeof f->msg, "%s", msg);
  }
  pthread_mutex_unlock(&r->mu);
}

/* Print (and save next to the test) a failing program, shrunk. */
static void shrink_and_print(dt_run *r, dt_failure *fl) {
  const dt_config *c = &r->configs[fl->config];
  dt_prog *p = &fl->p;
  int checks = dt_shrink(&r->env, p, c, DT_SHRINK_CHECKS);
  char why[DT_ERRLEN], header[DT_ERRLEN + 256];
  if (dt_check(&r->env, p, c, why, sizeof why) != 1) snprintf(why, sizeof why, "%s", fl->msg);
  snprintf(header, sizeof header,
           "difftest seed 0x%llx, config %s, shrunk in %d checks\n%s\n"
           "replay: FB_DIFF_FILE=<this file> FB_DIFF_CONFIGS=%s%s%s tests/test_differential",
           (unsigned long long)p->seed, c->name, checks, why, c->name,
           r->replay_case[0] ? " CK_RUN_CASE=" : "", r->replay_case);
  char *text = dt_prog_text(p, header);
  char path[128];
  snprintf(path, sizeof path, "difftest-0x%llx-%s.ir", (unsigned long long)p->seed, c->name);
  for (char *q = path; *q; q++)
    if (*q == ':' || *q == '+') *q = '_';
  FILE *f = fopen(path, "w");
  if (f && text) fputs(text, f);
  if (f) fclose(f);
  fprintf(stderr, "---- shrunk program (saved as %s) ----\n%s---- end ----\n", path,
          text ? text : "");
  free(text);
}

/* Shrink the first few failures; the others keep just their seed line. */
static void report_failures(dt_run *r) {
  for (int i = 0; i < r->nfails && i < DT_SHRINK_MAX; i++) shrink_and_print(r, &r->fails[i]);
}

static void print_activity(const dt_prog *p, const dt_log *want) {
  int64_t nz = 0, all = 0;
  for (int i = 0; i < want->n; i++) {
    const dt_obs *o = &want->v[i];
    if (o->kind != DT_OBS_FINAL) continue;
    size_t sz = fb_type_size(o->type);
    for (int64_t e = 0; e < o->n; e++, all++) {
      static const char zero[8];
      nz += memcmp((char *)o->data + e * (int64_t)sz, zero, sz) != 0;
    }
  }
  fprintf(stderr, "seed 0x%llx: %lld of %lld elements nonzero at the end\n",
          (unsigned long long)p->seed, (long long)nz, (long long)all);
}

static void count_run(dt_run *r, const dt_config *c, const dt_log *got, int bad, const char *msg) {
  const fb_counters *k = &got->counters;
  pthread_mutex_lock(&r->mu);
  r->checks++;
  r->fused += k->tasks_fused;
  r->dse += k->dead_stores_removed;
  r->demoted += k->activations_demoted;
  r->listgens += k->listgens_removed;
  r->aligned += got->aligned;
  r->standins += got->standins;
  r->plans += k->plans_reused;
  if (r->env.verbose)
    fprintf(stderr,
            "  %-26s %s (compiled %llu in %.3f s, tasks %llu, fused %llu, dse %llu, "
            "demoted %llu, listgen %llu, aligned %llu, stand-ins %llu, plans reused %llu)\n",
            c->name, bad ? msg : "ok", (unsigned long long)k->tasks_compiled, k->compile_s,
            (unsigned long long)k->tasks_launched, (unsigned long long)k->tasks_fused,
            (unsigned long long)k->dead_stores_removed, (unsigned long long)k->activations_demoted,
            (unsigned long long)k->listgens_removed, (unsigned long long)got->aligned,
            (unsigned long long)got->standins, (unsigned long long)k->plans_reused);
  pthread_mutex_unlock(&r->mu);
}

static int same_errors(const dt_log *sync, const dt_log *got, char *msg, size_t len);

/* Oracle once, then every configuration; the first error of each async
 * run against sync mode's (the first configuration) where sync reported
 * one. */
static void run_prog(dt_run *r, const dt_prog *p) {
  dt_log want, sync = {0};
  char msg[DT_ERRLEN];
  dt_run_oracle(p, &want);
  pthread_mutex_lock(&r->mu);
  r->programs++;
  pthread_mutex_unlock(&r->mu);
  if (want.failed) {
    snprintf(msg, sizeof msg, "the oracle failed: %.900s", want.err);
    add_failure(r, p, -1, msg);
    dt_log_free(&want);
    return;
  }
  if (r->env.verbose) print_activity(p, &want);
  int have_sync = 0;
  for (int i = 0; i < r->nconfigs; i++) {
    const dt_config *c = &r->configs[i];
    if (!config_on(r, c)) continue;
    dt_log got;
    dt_run_config(&r->env, p, c, &got);
    int bad = dt_compare(p, &want, &got, c->kind == DT_CFG_SYNC, msg, sizeof msg);
    if (!bad && have_sync && c->kind == DT_CFG_ASYNC && sync.nerrs)
      bad = same_errors(&sync, &got, msg, sizeof msg);
    count_run(r, c, &got, bad, msg);
    if (c->kind == DT_CFG_SYNC && !have_sync) {
      have_sync = 1;
      sync = got;
      pthread_mutex_lock(&r->mu);
      r->errors += sync.nerrs > 0;
      pthread_mutex_unlock(&r->mu);
    } else {
      dt_log_free(&got);
    }
    if (bad) add_failure(r, p, i, msg);
  }
  dt_log_free(&sync);
  dt_log_free(&want);
}

static void run_seed(dt_run *r, uint64_t seed) {
  dt_prog p;
  char err[4096];
  int rc = r->gen == DT_GEN_ORDINARY
               ? dt_gen_prog_scaled(seed, r->scale, &p, err, sizeof err)
               : dt_gen_prog_stream(seed, r->gen == DT_GEN_STREAM_FAILING, &p, err, sizeof err);
  if (rc) {
    dt_prog q = {.seed = seed};
    add_failure(r, &q, -1, err);
    return;
  }
  if (r->env.verbose) {
    char *text = dt_prog_text(&p, NULL);
    fprintf(stderr, "==== seed 0x%llx ====\n%s", (unsigned long long)seed, text ? text : "");
    free(text);
  }
  run_prog(r, &p);
  dt_prog_free(&p);
}

static void *seed_worker(void *arg) {
  dt_run *r = arg;
  for (;;) {
    pthread_mutex_lock(&r->mu);
    int i = r->next++;
    pthread_mutex_unlock(&r->mu);
    if (i >= r->nseeds) return NULL;
    run_seed(r, r->seeds[i]);
  }
}

/* Run the seeds on FB_DIFF_THREADS threads (default 2: compilation is the
 * bulk of the time and each session compiles on its caller's thread). */
static void run_seeds(dt_run *r, const uint64_t *seeds, int n) {
  int nt = (int)env_u64("FB_DIFF_THREADS", 2);
  if (nt < 1) nt = 1;
  if (nt > 16) nt = 16;
  r->seeds = seeds;
  r->nseeds = n;
  r->next = 0;
  pthread_t th[16];
  int started = 0;
  for (int t = 1; t < nt; t++)
    if (pthread_create(&th[started], NULL, seed_worker, r) == 0) started++;
  seed_worker(r);
  for (int t = 0; t < started; t++) pthread_join(th[t], NULL);
  report_failures(r);
}

static uint64_t fresh_seed(int i) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  dt_rng r = {(uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 20) ^ ((uint64_t)getpid() << 40) ^
              (uint64_t)i};
  return dt_next(&r) >> 1;
}

static void finish(dt_run *r, const char *what) {
  fprintf(stderr, "difftest: %s: %d programs, %d configuration runs, %d failures%s%s\n", what,
          r->programs, r->checks, r->failures, r->failures ? ":" : "", r->failed_list);
  fprintf(stderr,
          "difftest: optimizer counters over all runs: %llu fused, %llu dead stores, %llu demoted, "
          "%llu listgens removed\n",
          (unsigned long long)r->fused, (unsigned long long)r->dse, (unsigned long long)r->demoted,
          (unsigned long long)r->listgens);
  int failures = r->failures;
  char list[sizeof r->failed_list];
  memcpy(list, r->failed_list, sizeof list);
  dt_run_fini(r);
  ck_assert_msg(failures == 0, "%d differential failures (seed/config):%s", failures, list);
}

/* ---------------------------------------------------------------- CI set and replays */

/* FB_DIFF_FILE names a saved program: run it verbosely on r and finish (1),
 * or 0 when it names none. */
static int replay_file(dt_run *r) {
  const char *file = getenv("FB_DIFF_FILE");
  if (!file || !*file) return 0;
  char *text = fbt_read_file(file, NULL);
  ck_assert_msg(text != NULL, "cannot read %s", file);
  dt_prog p;
  char err[512];
  int rc = dt_prog_parse(text, &p, err, sizeof err);
  free(text);
  ck_assert_msg(rc == 0, "%s: %s", file, err);
  r->env.verbose = 1;
  run_prog(r, &p);
  dt_prog_free(&p);
  finish(r, file);
  return 1;
}

START_TEST(test_programs) {
  dt_run r;
  dt_run_init(&r);
  if (replay_file(&r)) return;
  uint64_t one = env_u64("FB_DIFF_SEED", 0), count = env_u64("FB_DIFF_COUNT", 0);
  if (getenv("FB_DIFF_SEED")) {
    r.env.verbose = 1;
    run_seeds(&r, &one, 1);
    finish(&r, "replay");
    return;
  }
  if (count) {
    uint64_t start = env_u64("FB_DIFF_START", fresh_seed(0));
    fprintf(stderr, "difftest: %llu programs from seed 0x%llx\n", (unsigned long long)count,
            (unsigned long long)start);
    uint64_t *seeds = malloc(sizeof *seeds * count);
    ck_assert_ptr_nonnull(seeds);
    for (uint64_t i = 0; i < count; i++) seeds[i] = start + i;
    run_seeds(&r, seeds, (int)count);
    free(seeds);
    finish(&r, "long run");
    return;
  }
  int fresh = (int)env_u64("FB_DIFF_FRESH", 16);
  if (fresh > 256) fresh = 256;
  uint64_t seeds[DT_FIXED + 256];
  for (int i = 0; i < DT_FIXED; i++) seeds[i] = (uint64_t)i + 1;
  fprintf(stderr, "difftest: fixed seeds 1..%d; fresh seeds:", DT_FIXED);
  for (int i = 0; i < fresh; i++)
    fprintf(stderr, " 0x%llx", (unsigned long long)(seeds[DT_FIXED + i] = fresh_seed(i)));
  fprintf(stderr, "\n");
  run_seeds(&r, seeds, DT_FIXED + fresh);
  if (!r.only) { /* the programs gave every pass something to do */
    ck_assert_uint_gt(r.fused, 0);
    ck_assert_uint_gt(r.dse, 0);
    ck_assert_uint_gt(r.demoted, 0);
    ck_assert_uint_gt(r.listgens, 0);
  }
  finish(&r, "fixed and fresh seeds");
}
END_TEST

/* ---------------------------------------------------------------- stream programs */

#define DT_STREAM_FIXED 6 /* stream programs of the CI set, and as many failing ones */

/* Stream programs (and failing ones) on an engine whose stand-in threshold
 * is 0. FB_DIFF_SEED=S runs one (FB_DIFF_FAILING_STREAM=1: the failing one),
 * FB_DIFF_COUNT=N runs N of each from FB_DIFF_START, FB_DIFF_FILE replays
 * one; otherwise seeds 1..DT_STREAM_FIXED of each and FB_DIFF_FRESH / 16
 * fresh ones. */
START_TEST(test_stream_programs) {
  dt_run r;
  dt_run_init(&r);
  fb_engine_test_set_standin_min_stmts(r.env.eng, 0);
  r.configs = dt_stream_configs;
  r.nconfigs = DT_NSTREAM;
  r.replay_case = "stream";
  if (replay_file(&r)) return;
  if (getenv("FB_DIFF_SEED")) {
    uint64_t one = env_u64("FB_DIFF_SEED", 0);
    r.env.verbose = 1;
    r.gen = env_u64("FB_DIFF_FAILING_STREAM", 0) ? DT_GEN_STREAM_FAILING : DT_GEN_STREAM;
    run_seeds(&r, &one, 1);
    finish(&r, "stream replay");
    return;
  }
  uint64_t count = env_u64("FB_DIFF_COUNT", 0), start = env_u64("FB_DIFF_START", fresh_seed(0));
  int fresh = (int)env_u64("FB_DIFF_FRESH", 16) / 16;
  if (fresh > 64) fresh = 64;
  int n = count ? (int)count : DT_STREAM_FIXED + fresh;
  uint64_t *seeds = malloc(sizeof *seeds * (size_t)(n ? n : 1));
  ck_assert_ptr_nonnull(seeds);
  for (int i = 0; i < n; i++)
    seeds[i] = count ? start + (uint64_t)i : i < DT_STREAM_FIXED ? (uint64_t)i + 1 : fresh_seed(i);
  fprintf(stderr, "difftest: stream programs, seeds");
  for (int i = count ? 0 : DT_STREAM_FIXED; i < n && i < (count ? 1 : n); i++)
    fprintf(stderr, " 0x%llx", (unsigned long long)seeds[i]);
  fprintf(stderr, count ? " (+%d)\n" : " and 1..%d\n", count ? n - 1 : DT_STREAM_FIXED);
  for (r.gen = DT_GEN_STREAM; r.gen <= DT_GEN_STREAM_FAILING; r.gen++) {
    run_seeds(&r, seeds, n); /* shrinks and prints its failures */
    for (int i = 0; i < r.nfails; i++) dt_prog_free(&r.fails[i].p);
    r.nfails = 0;
  }
  free(seeds);
  fprintf(stderr,
          "difftest: stream programs: %llu aligned flushes, %llu stand-ins, %llu plans reused, "
          "%llu programs whose sync run failed\n",
          (unsigned long long)r.aligned, (unsigned long long)r.standins,
          (unsigned long long)r.plans, (unsigned long long)r.errors);
  if (!r.only && !count) { /* what the stream programs are there for happened */
    ck_assert_uint_gt(r.aligned, 0);
    ck_assert_uint_gt(r.standins, 0);
    ck_assert_uint_gt(r.plans, 0);
    ck_assert_uint_gt(r.fused, 0);
    ck_assert_uint_gt(r.demoted, 0);
    ck_assert_uint_gt(r.listgens, 0);
    ck_assert_uint_gt(r.errors, 0);
  }
  finish(&r, "stream programs");
}
END_TEST

/* ---------------------------------------------------------------- big programs */

typedef struct big_totals {
  uint64_t fused, refused, fallbacks, launched, programs;
} big_totals;

/* One big program in every configuration: against the oracle, or (fake
 * device) against sync mode. */
static int run_big(dt_env *env, const dt_prog *p, int fake, big_totals *t) {
  dt_log want;
  char msg[DT_ERRLEN];
  int bad = 0;
  if (fake) dt_run_config(env, p, &dt_big_configs[0], &want);
  else dt_run_oracle(p, &want);
  if (want.failed) {
    fprintf(stderr, "difftest: FAIL big seed 0x%llx: %s failed: %s\n", (unsigned long long)p->seed,
            fake ? "sync" : "the oracle", want.err);
    dt_log_free(&want);
    return 1;
  }
  t->programs++;
  for (int i = fake ? 1 : 0; i < DT_NBIG; i++) {
    const dt_config *c = &dt_big_configs[i];
    if (fake && c->kind == DT_CFG_OPT_INTERP) continue; /* the interpreter runs kernels */
    dt_log got;
    dt_run_config(env, p, c, &got);
    int b = dt_compare(p, &want, &got, c->kind == DT_CFG_SYNC, msg, sizeof msg);
    if (env->verbose || b)
      fprintf(stderr,
              "difftest: big seed 0x%llx %-30s %s (tasks %llu, fused %llu, refused %llu, "
              "fallbacks %llu, compiled %llu in %.2f s)\n",
              (unsigned long long)p->seed, c->name, b ? msg : "ok",
              (unsigned long long)got.counters.tasks_launched,
              (unsigned long long)got.counters.tasks_fused,
              (unsigned long long)got.counters.fuse_refused,
              (unsigned long long)got.counters.fuse_fallbacks,
              (unsigned long long)got.counters.tasks_compiled, got.counters.compile_s);
    bad |= b;
    if (c->kind == DT_CFG_ASYNC) {
      t->fused += got.counters.tasks_fused;
      t->refused += got.counters.fuse_refused;
      t->fallbacks += got.counters.fuse_fallbacks;
      t->launched += got.counters.tasks_launched;
    }
    dt_log_free(&got);
  }
  dt_log_free(&want);
  return bad;
}

START_TEST(test_big_programs) {
  dt_run r;
  dt_run_init(&r);
  int fake = (int)env_u64("FB_DIFF_FAKE_DEVICE", 0), n = (int)env_u64("FB_DIFF_BIG", 2);
  uint64_t one = env_u64("FB_DIFF_SEED", 0);
  big_totals t = {0};
  int failures = 0, stmts = 0, params = 0;
  for (int i = 0; i < (getenv("FB_DIFF_SEED") ? 1 : n); i++) {
    uint64_t seed = getenv("FB_DIFF_SEED") ? one : (uint64_t)i + 1;
    dt_prog p;
    char err[4096];
    ck_assert_msg(dt_gen_prog_big(seed, &p, err, sizeof err) == 0, "big seed %llu: %s",
                  (unsigned long long)seed, err);
    for (int k = 0; k < p.nk; k++) {
      int c = fb_kernel_count_stmts(p.ks[k]);
      if (c > stmts) stmts = c;
      if (p.ks[k]->nparams > params) params = p.ks[k]->nparams;
    }
    failures += run_big(&r.env, &p, fake, &t);
    dt_prog_free(&p);
  }
  fprintf(stderr,
          "difftest: %llu big programs on %s%s (kernels up to %d statements, %d "
          "parameters): %llu fused, %llu refused by the cost model, %llu fallbacks, %d failures\n",
          (unsigned long long)t.programs, fbt_backend(), fake ? " (fake device)" : "", stmts,
          params, (unsigned long long)t.fused, (unsigned long long)t.refused,
          (unsigned long long)t.fallbacks, failures);
  dt_run_fini(&r);
  ck_assert_int_eq(failures, 0);
  ck_assert_uint_gt(t.fused, 0);
  /* the caps and the cost model were both met, and the model alone kept
   * every fused task one the backend compiles and launches */
  ck_assert_uint_gt(t.refused, 0);
  ck_assert_uint_eq(t.fallbacks, 0);
}
END_TEST

/* ---------------------------------------------------------------- failing programs */

/* The first error as the configuration reports it against sync's. */
static int same_errors(const dt_log *sync, const dt_log *got, char *msg, size_t len) {
  if (!sync->nerrs != !got->nerrs) {
    snprintf(msg, len, "sync reported %d errors, this %d (%.800s)", sync->nerrs, got->nerrs,
             got->nerrs ? got->err1 : sync->err1);
    return 1;
  }
  if (!sync->nerrs) return 0;
  /* a fused task names the part whose access failed (the earliest, as
   * latched by the generated code): exactly sync's launch and message */
  if (sync->err1_launch != got->err1_launch) {
    snprintf(msg, len,
             "first error on launch %lld, sync's on launch %lld: '%.400s' vs sync's '%.400s'",
             (long long)got->err1_launch, (long long)sync->err1_launch, got->err1, sync->err1);
    return 1;
  }
  if (strcmp(sync->err1, got->err1) != 0) {
    snprintf(msg, len, "first error '%.450s', sync's '%.450s'", got->err1, sync->err1);
    return 1;
  }
  return 0;
}

START_TEST(test_failing_programs) {
  if (env_u64("FB_DIFF_FAKE_DEVICE", 0)) return; /* no kernel runs there, so none fails */
  dt_run r;
  dt_run_init(&r);
  int n = (int)env_u64("FB_DIFF_FAILING", 40), failing = 0, failures = 0, fused = 0;
  for (uint64_t seed = 1; seed <= (uint64_t)n; seed++) {
    dt_prog p;
    char err[4096], msg[DT_ERRLEN];
    ck_assert_msg(dt_gen_prog_failing(seed, &p, err, sizeof err) == 0, "%s", err);
    dt_log want, sync;
    dt_run_oracle(&p, &want);
    dt_run_config(&r.env, &p, &dt_err_configs[0], &sync);
    int bad = dt_compare(&p, &want, &sync, 1, msg, sizeof msg);
    failing += sync.nerrs > 0;
    for (int i = 1; !bad && i < DT_NERR; i++) {
      dt_log got;
      dt_run_config(&r.env, &p, &dt_err_configs[i], &got);
      bad = dt_compare(&p, &want, &got, 0, msg, sizeof msg) ||
            same_errors(&sync, &got, msg, sizeof msg);
      fused += got.counters.tasks_fused > 0 && got.nerrs > 0;
      if (bad || r.env.verbose)
        fprintf(stderr, "difftest: failing seed 0x%llx %-24s %s\n", (unsigned long long)seed,
                dt_err_configs[i].name,
                bad         ? msg
                : got.nerrs ? got.err1
                            : "no error");
      dt_log_free(&got);
    }
    if (bad) {
      char *text = dt_prog_text(&p, NULL);
      fprintf(stderr, "difftest: FAIL failing seed 0x%llx: %s\n%s", (unsigned long long)seed, msg,
              text ? text : "");
      free(text);
    }
    failures += bad;
    dt_log_free(&want);
    dt_log_free(&sync);
    dt_prog_free(&p);
  }
  fprintf(stderr,
          "difftest: %d failing programs of %d (%d runs with fusion and errors), %d "
          "mismatches\n",
          failing, n, fused, failures);
  dt_run_fini(&r);
  ck_assert_int_eq(failures, 0);
  ck_assert_int_ge(failing, n / 4); /* most programs did fail */
  ck_assert_int_gt(fused, 0);
}
END_TEST

/* ---------------------------------------------------------------- the tester itself */

/* Programs print to text that parses back to a program with the same
 * oracle observations. */
START_TEST(test_text_round_trip) {
  for (uint64_t seed = 1; seed <= 40; seed++) {
    dt_prog p, q;
    char err[4096];
    ck_assert_msg(dt_gen_prog(seed, &p, err, sizeof err) == 0, "%s", err);
    char *text = dt_prog_text(&p, "round trip");
    ck_assert_ptr_nonnull(text);
    ck_assert_msg(dt_prog_parse(text, &q, err, sizeof err) == 0, "seed %llu: %s\n%s",
                  (unsigned long long)seed, err, text);
    ck_assert_int_eq(q.nk, p.nk);
    ck_assert_int_eq(q.nsteps, p.nsteps);
    ck_assert_uint_eq(q.seed, p.seed);
    dt_log a, b;
    dt_run_oracle(&p, &a);
    dt_run_oracle(&q, &b);
    ck_assert_msg(!a.failed, "seed %llu: %s", (unsigned long long)seed, a.err);
    ck_assert_msg(dt_compare(&p, &a, &b, 1, err, sizeof err) == 0, "seed %llu: %s\n%s",
                  (unsigned long long)seed, err, text);
    char *again = dt_prog_text(&q, "round trip");
    ck_assert_str_eq(again, text);
    free(again);
    free(text);
    dt_log_free(&a);
    dt_log_free(&b);
    dt_prog_free(&p);
    dt_prog_free(&q);
  }
}
END_TEST

/* The generator covers what docs/testing.md promises: over the fixed seeds,
 * every SNode kind, every kind of access and every step kind appears. */
START_TEST(test_generator_coverage) {
  int kinds[FB_SN_PLACE + 1] = {0}, ops[FB_OP__COUNT] = {0}, steps[DT_STEP__COUNT] = {0}, rets = 0;
  for (uint64_t seed = 1; seed <= DT_FIXED; seed++) {
    dt_prog p;
    char err[4096];
    ck_assert_msg(dt_gen_prog(seed, &p, err, sizeof err) == 0, "%s", err);
    for (int i = 0; i < p.l->nnodes; i++) kinds[p.l->nodes[i].kind]++;
    for (int k = 0; k < p.nk; k++) {
      rets += p.ks[k]->ret != FB_T_VOID;
      for (int b = 0; b < p.ks[k]->nblocks; b++)
        for (int i = 0; i < p.ks[k]->blocks[b].n; i++)
          ops[p.ks[k]->stmts[p.ks[k]->blocks[b].ids[i]].op]++;
    }
    for (int i = 0; i < p.nsteps; i++) steps[p.steps[i].kind]++;
    dt_prog_free(&p);
  }
  if (env_u64("FB_DIFF_VERBOSE", 0)) {
    for (int k = FB_SN_DENSE; k <= FB_SN_PLACE; k++)
      fprintf(stderr, "%s SNodes: %d\n", fb_snode_kind_name(k), kinds[k]);
    for (int o = 0; o < FB_OP__COUNT; o++)
      if (ops[o]) fprintf(stderr, "%s: %d\n", fb_op_table[o].name, ops[o]);
    for (int st = 0; st < DT_STEP__COUNT; st++)
      fprintf(stderr, "step %s: %d\n", dt_step_name(st), steps[st]);
  }
  for (int k = FB_SN_DENSE; k <= FB_SN_PLACE; k++)
    ck_assert_msg(kinds[k] > 0, "no %s SNode", fb_snode_kind_name(k));
  static const fb_op want[] = {
      FB_OP_LOAD,      FB_OP_STORE,      FB_OP_ATOMIC_ADD,    FB_OP_ATOMIC_MIN, FB_OP_ATOMIC_XOR,
      FB_OP_IS_ACTIVE, FB_OP_ACTIVATE,   FB_OP_DEACTIVATE,    FB_OP_APPEND,     FB_OP_LENGTH,
      FB_OP_PAR_FOR,   FB_OP_STRUCT_FOR, FB_OP_RANGE_FOR,     FB_OP_WHILE,      FB_OP_IF,
      FB_OP_RET,       FB_OP_RAND,       FB_OP_ASSUME_UNIQUE, FB_OP_BREAK,      FB_OP_CONTINUE,
      FB_OP_FLOORMOD};
  for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
    ck_assert_msg(ops[want[i]] > 0, "no %s statement generated", fb_op_table[want[i]].name);
  for (int s = 0; s < DT_STEP__COUNT; s++)
    ck_assert_msg(steps[s] > 0, "no %s step", dt_step_name(s));
  ck_assert_int_gt(rets, 0);
}
END_TEST

/* Configurations that are wrong on purpose: the comparison must catch them
 * and the shrinker must bring a failing program down to its core. */
static int count_op(const dt_prog *p, fb_op op) {
  int n = 0;
  for (int k = 0; k < p->nk; k++) {
    fb_kernel *c = fb_kernel_compact(p->ks[k]);
    for (int i = 0; c && i < c->nstmts; i++) n += c->stmts[i].op == op;
    fb_kernel_free(c);
  }
  return n;
}

static int count_stmts(const dt_prog *p) {
  int n = 0;
  for (int k = 0; k < p->nk; k++) n += fb_kernel_count_stmts(p->ks[k]);
  return n;
}

static int64_t total_elements(const dt_prog *p) {
  int64_t n = 0;
  for (int f = 1; f < p->l->nnodes; f++)
    if (p->l->nodes[f].kind == FB_SN_PLACE) n += fb_field_numel(p->l, f);
  return n;
}

/* The first small program from seed `from` on that the mutant gets wrong. */
static int mutant_failure(dt_env *env, const dt_config *c, uint64_t from, dt_prog *out) {
  for (uint64_t seed = from; seed < from + 300; seed++) {
    char err[4096];
    ck_assert(dt_gen_prog(seed, out, err, sizeof err) == 0);
    if (total_elements(out) <= 400 && dt_check(env, out, c, err, sizeof err) == 1) return 1;
    dt_prog_free(out);
  }
  return 0;
}

START_TEST(test_mutant_host_write) {
  dt_run r;
  dt_run_init(&r);
  dt_config c = {.name = "mutant:cell_write", .kind = DT_CFG_MUTANT, .mutation = DT_MUT_CELL_WRITE};
  dt_prog p;
  ck_assert_msg(mutant_failure(&r.env, &c, 1, &p), "no program exposes the cell-write mutant");
  dt_shrink(&r.env, &p, &c, 400);
  char err[DT_ERRLEN];
  ck_assert_int_eq(dt_check(&r.env, &p, &c, err, sizeof err), 1);
  /* one cell write, observed by the final contents; nothing else needed */
  ck_assert_int_eq(p.nsteps, 1);
  ck_assert_int_eq(p.steps[0].kind, DT_CELL_WRITE);
  ck_assert_int_eq(p.nk, 0);
  dt_prog_free(&p);
  dt_run_fini(&r);
}
END_TEST

START_TEST(test_mutant_sub) {
  dt_run r;
  dt_run_init(&r);
  dt_config c = {.name = "mutant:sub", .kind = DT_CFG_MUTANT, .mutation = DT_MUT_SUB_ADD};
  dt_prog p;
  ck_assert_msg(mutant_failure(&r.env, &c, 1, &p), "no program exposes the sub mutant");
  int before = count_stmts(&p), steps = p.nsteps;
  dt_shrink(&r.env, &p, &c, 2000);
  char err[DT_ERRLEN];
  ck_assert_int_eq(dt_check(&r.env, &p, &c, err, sizeof err), 1);
  char *text = dt_prog_text(&p, NULL);
  ck_assert_int_ge(count_op(&p, FB_OP_SUB), 1);
  ck_assert_msg(p.nk <= 2, "%d kernels left:\n%s", p.nk, text);
  ck_assert_int_le(p.nsteps, steps);
  ck_assert_msg(count_stmts(&p) <= 20 && count_stmts(&p) * 2 <= before,
                "%d statements shrunk to %d:\n%s", before, count_stmts(&p), text);
  free(text);
  dt_prog_free(&p);
  dt_run_fini(&r);
}
END_TEST

/* Regression (found by the stream programs): bad(a) reads w[i + a], out
 * of bounds at one cell for a = 1, and its launches fuse (y written only
 * at i, w only read). Sync mode blames launch 1 (bad(1)) for the first
 * error and launch 3 for the second. Every async configuration, fused or
 * not, must name launch 1 with sync's very message: neither part of a
 * fused task is provably in bounds, so only the part the generated code
 * latched with the error (fb_stmt.part, the blame word of fb_rt.h) tells
 * that the failing access is launch 1's, not launch 0's; the values match
 * the oracle in every stream configuration. */
static const char *blame_prog = "layout {\n"
                                "  dense(i: 8) as n0 {\n"
                                "    place y: i64\n"
                                "    place w: i64\n"
                                "  }\n"
                                "}\n"
                                "\n"
                                "kernel bad(i32) {\n"
                                "  %0 = const.i32 8\n"
                                "  %1 = const.i32 0\n"
                                "  par_for %2 in %1 .. %0 {\n"
                                "    %3 = loop_index.i32 %2, 0\n"
                                "    %4 = arg.i32 0\n"
                                "    %5 = add.i32 %3, %4\n"
                                "    %6 = load.i64 w[%5]\n"
                                "    %7 = load.i64 y[%3]\n"
                                "    %8 = add.i64 %7, %6\n"
                                "    store y[%3], %8\n"
                                "  }\n"
                                "}\n"
                                "#! seed 0x0\n"
                                "#! field_write w 0x1\n"
                                "#! launch bad 0\n"
                                "#! launch bad 1\n"
                                "#! launch bad 0\n"
                                "#! launch bad 1\n"
                                "#! sync\n"
                                "#! field_read y\n";

START_TEST(test_blame_in_fused_tasks) {
  dt_run r;
  dt_run_init(&r);
  dt_prog p;
  char err[512], msg[DT_ERRLEN];
  ck_assert_msg(dt_prog_parse(blame_prog, &p, err, sizeof err) == 0, "%s", err);
  dt_log want, sync;
  dt_run_oracle(&p, &want);
  ck_assert_msg(!want.failed, "%s", want.err);
  dt_run_config(&r.env, &p, &dt_stream_configs[0], &sync);
  ck_assert_int_eq(dt_compare(&p, &want, &sync, 1, msg, sizeof msg), 0);
  ck_assert_int_eq(sync.nerrs, 2);
  ck_assert_int_eq(sync.err1_launch, 1);
  int fused = 0;
  for (int i = 1; i < DT_NSTREAM; i++) {
    const dt_config *c = &dt_stream_configs[i];
    dt_log got;
    dt_run_config(&r.env, &p, c, &got);
    ck_assert_msg(dt_compare(&p, &want, &got, c->kind == DT_CFG_SYNC, msg, sizeof msg) == 0,
                  "%s: %s", c->name, msg);
    if (c->kind == DT_CFG_ASYNC) {
      ck_assert_msg(got.nerrs >= 1, "%s reported no error", c->name);
      ck_assert_msg(got.err1_launch == 1, "%s: launch %lld: %s", c->name,
                    (long long)got.err1_launch, got.err1);
      ck_assert_msg(!strstr(got.err1, "fused with it") && !strcmp(got.err1, sync.err1),
                    "%s: '%s', sync's '%s'", c->name, got.err1, sync.err1);
      ck_assert_msg(same_errors(&sync, &got, msg, sizeof msg) == 0, "%s: %s", c->name, msg);
      if (got.counters.tasks_fused) fused++;
    }
    dt_log_free(&got);
  }
  ck_assert_int_gt(fused, 0);
  dt_log_free(&want);
  dt_log_free(&sync);
  dt_prog_free(&p);
  dt_run_fini(&r);
}
END_TEST

/* The stream programs' stencil kernels meet per-direction element-wise
 * fusion as meant: in a window of two launches, sten then rd, and rd then
 * sten, fuse (rd reads only z[i]); sten with nb (reads z[i + 1]) or wz
 * (writes z[i]) never does, in either order; every result is the
 * oracle's. */
static int kernel_named(const dt_prog *p, const char *name) {
  for (int k = 0; k < p->nk; k++)
    if (!strcmp(p->ks[k]->name, name)) return k;
  return -1;
}

START_TEST(test_stream_stencil_fusion) {
  dt_run r;
  dt_run_init(&r);
  static const struct {
    const char *a, *b;
    int fuses;
  } pairs[] = {{"sten", "rd", 1}, {"rd", "sten", 1}, {"sten", "nb", 0},
               {"nb", "sten", 0}, {"sten", "wz", 0}, {"wz", "sten", 0}};
  const dt_config *fusion = &dt_stream_configs[7];
  ck_assert_str_eq(fusion->name, "async:fusion");
  for (uint64_t seed = 1; seed <= 3; seed++) {
    dt_prog p;
    char err[4096], msg[DT_ERRLEN];
    ck_assert_msg(dt_gen_prog_stream(seed, 0, &p, err, sizeof err) == 0, "%s", err);
    dt_step writes[2] = {p.steps[0], p.steps[1]}; /* z and w from data */
    ck_assert_int_eq(writes[0].kind, DT_FIELD_WRITE);
    ck_assert_int_eq(writes[1].kind, DT_FIELD_WRITE);
    for (size_t i = 0; i < sizeof pairs / sizeof pairs[0]; i++) {
      int ka = kernel_named(&p, pairs[i].a), kb = kernel_named(&p, pairs[i].b);
      ck_assert(ka >= 0 && kb >= 0);
      p.nsteps = 0;
      p.steps[p.nsteps++] = writes[0];
      p.steps[p.nsteps++] = writes[1];
      for (int j = 0; j < 2; j++) {
        dt_step *st = &p.steps[p.nsteps++];
        memset(st, 0, sizeof *st);
        st->kind = DT_LAUNCH;
        st->kernel = j ? kb : ka;
        st->nargs = p.ks[st->kernel]->nparams;
        if (st->nargs) st->args[0] = fb_value_i32((int)seed & 1);
      }
      p.steps[p.nsteps].kind = DT_SYNC;
      p.nsteps++;
      dt_log want, got;
      dt_run_oracle(&p, &want);
      dt_run_config(&r.env, &p, fusion, &got);
      ck_assert_msg(dt_compare(&p, &want, &got, 0, msg, sizeof msg) == 0, "seed %llu %s %s: %s",
                    (unsigned long long)seed, pairs[i].a, pairs[i].b, msg);
      ck_assert_msg(got.counters.tasks_fused == (uint64_t)pairs[i].fuses,
                    "seed %llu: %s then %s: %llu fused, expected %d", (unsigned long long)seed,
                    pairs[i].a, pairs[i].b, (unsigned long long)got.counters.tasks_fused,
                    pairs[i].fuses);
      dt_log_free(&want);
      dt_log_free(&got);
    }
    dt_prog_free(&p);
  }
  dt_run_fini(&r);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("differential");
  TCase *t = tcase_create("programs");
  tcase_set_timeout(t, 900);
  tcase_add_test(t, test_programs);
  suite_add_tcase(s, t);
  /* ctest runs these (and "stream") as entries of their own (tag "edges"), so that
   * test_differential's time stays what it was */
  TCase *b = tcase_create("big");
  tcase_set_tags(b, "edges");
  tcase_set_timeout(b, 900);
  tcase_add_test(b, test_big_programs);
  suite_add_tcase(s, b);
  TCase *e = tcase_create("errors");
  tcase_set_tags(e, "edges");
  tcase_set_timeout(e, 600);
  tcase_add_test(e, test_failing_programs);
  suite_add_tcase(s, e);
  TCase *st = tcase_create("stream");
  tcase_set_tags(st, "edges");
  tcase_set_timeout(st, 900);
  tcase_add_test(st, test_stream_programs);
  suite_add_tcase(s, st);
  TCase *u = tcase_create("tester");
  tcase_set_timeout(u, 300);
  tcase_add_test(u, test_text_round_trip);
  tcase_add_test(u, test_generator_coverage);
  tcase_add_test(u, test_mutant_host_write);
  tcase_add_test(u, test_mutant_sub);
  tcase_add_test(u, test_blame_in_fused_tasks);
  tcase_add_test(u, test_stream_stencil_fusion);
  suite_add_tcase(s, u);
  return s;
}

int main(void) { return fbt_run(suite()); }
