/* The differential random-program tester (tests/test_differential.c):
 * shared types of its parts, which the test includes as one translation
 * unit (tests/CMakeLists.txt builds each tests/test_*.c on its own):
 *
 *   gen_layout.c  random SNode layouts (dense, pointer, bitmasked, dynamic)
 *   gen_kernel.c  random kernels through the builder, race-free by plan
 *   gen_prog.c    programs: layout + kernels + a step list (launches, host
 *                 reads and writes, flushes), and the probe kernel
 *   run.c         running a program: the reference interpreter (the oracle),
 *                 the engine in each configuration, the optimizer driven
 *                 over the interpreter; observations and their comparison
 *   shrink.c      deleting steps, kernels and statements while it still fails
 *   text.c        a program as IR text with its steps in "#!" lines, and back
 *
 * A program is in the exact class: integer data everywhere, float data only
 * where no order of operations can differ (docs/testing.md), and no data
 * race in any parallel loop, so every correct configuration produces
 * exactly the oracle's observations. */
#ifndef FB_DIFFTEST_H
#define FB_DIFFTEST_H

#include <stdint.h>
#include <stdio.h>

#include "fusebox/engine.h"
#include "fusebox/ir.h"

#define DT_MAXN 64      /* SNodes in a generated layout, at most */
#define DT_MAXP 128     /* kernel parameters, at most (big programs) */
#define DT_GEN_MAXP 3   /* ... in the ordinary programs */
#define DT_ERRLEN 1024

/* ---------------------------------------------------------------- random */

typedef struct dt_rng {
  uint64_t s;
} dt_rng;

uint64_t dt_next(dt_rng *r);
uint32_t dt_below(dt_rng *r, uint32_t n); /* 0 .. n-1 (0 when n == 0) */
int dt_chance(dt_rng *r, int percent);
int64_t dt_range(dt_rng *r, int64_t lo, int64_t hi); /* lo .. hi inclusive */

/* ---------------------------------------------------------------- programs */

enum dt_step_kind {
  DT_LAUNCH = 0,   /* kernel, args */
  DT_FIELD_READ,   /* field: compared */
  DT_FIELD_WRITE,  /* field, data: contents from dt_field_data(seed) */
  DT_CELL_READ,    /* field, idx: compared */
  DT_CELL_WRITE,   /* field, idx, val */
  DT_FLUSH,        /* fb_flush in async mode; nothing in sync mode */
  DT_SYNC,         /* fb_sync */
  DT_STEP__COUNT
};

typedef struct dt_step {
  int kind;
  int kernel;
  int nargs;
  fb_value args[DT_MAXP];
  int field;
  int64_t idx[FB_MAX_AXES];
  fb_value val;
  uint64_t data;
} dt_step;

typedef struct dt_prog {
  uint64_t seed;
  fb_layout *l;
  fb_kernel **ks; /* the last one is the probe when has_probe */
  int nk;
  dt_step *steps;
  int nsteps;
} dt_prog;

const char *dt_step_name(int kind);
void dt_prog_free(dt_prog *p);
int dt_prog_copy(const dt_prog *p, dt_prog *out); /* deep; 0 or FB_ENOMEM */

/* Generation: everything from one seed. */
fb_layout *dt_gen_layout(dt_rng *r);
/* scale >= 1 multiplies a kernel's statements and items (1 in CI). */
fb_kernel *dt_gen_kernel(dt_rng *r, const fb_layout *l, const char *name, int scale);
fb_kernel *dt_gen_probe(const fb_layout *l); /* NULL when nothing is sparse */
/* 0, or FB_EVERIFY when a generated kernel fails the verifier (a bug of
 * the generator or the verifier: err has the kernel and the diagnostics). */
int dt_gen_prog(uint64_t seed, dt_prog *out, char *err, size_t errlen);
/* The same with programs `scale` times as large (kernels, steps, statements):
 * for long runs (FB_DIFF_SCALE); scale 1 is dt_gen_prog. */
int dt_gen_prog_scaled(uint64_t seed, int scale, dt_prog *out, char *err, size_t errlen);
/* A big program (dt_gen_prog_big): kernels of many parameters (up to
 * DT_MAXP) and large loop bodies, each launched many times in a row with
 * other arguments, so that fusion meets its cost model (the statement
 * budget; on a GPU the parameter limit) under every cap. */
int dt_gen_prog_big(uint64_t seed, dt_prog *out, char *err, size_t errlen);
/* A failing program (dt_gen_prog_failing): an ordinary one with kernel
 * `oob`, which stores past the end of a dense field, launched at a few
 * places among its steps: every engine configuration must report its
 * errors as sync mode does (kernel, launch number, message). */
int dt_gen_prog_failing(uint64_t seed, dt_prog *out, char *err, size_t errlen);
/* A stream program (dt_gen_prog_stream, tests/difftest/gen_stream.c): a
 * period of launches repeated in frames longer than the default flush
 * interval, syncs with every field read after them, host and kernel
 * (de)activation of a pointer SNode between frames, a red-black stencil
 * with element-wise and neighbour readers and writers of its field.
 * failing: one launch of a later repetition indexes out of bounds. */
int dt_gen_prog_stream(uint64_t seed, int failing, dt_prog *out, char *err, size_t errlen);
/* Big kernels: np parameters, loops of loop_stmts statements or more. */
fb_kernel *dt_gen_kernel_big(dt_rng *r, const fb_layout *l, const char *name, int np,
                             int loop_stmts, int items);
/* Field contents of a DT_FIELD_WRITE: numel values of the field's type. */
void dt_field_data(const fb_layout *l, int field, uint64_t seed, void *dst);

/* Text: the module (layout and kernels, fb_ir_parse reads it back) with one
 * "#! step" line per step. dt_prog_parse reads that text. */
char *dt_prog_text(const dt_prog *p, const char *header); /* malloc'd */
int dt_prog_parse(const char *text, dt_prog *out, char *err, size_t errlen);

/* ---------------------------------------------------------------- running */

enum dt_cfg_kind {
  DT_CFG_SYNC = 0,   /* the engine, sync mode */
  DT_CFG_ASYNC,      /* the engine, async mode with the given passes */
  DT_CFG_OPT_INTERP, /* lowering + the SFG optimizer, batches run in the interpreter */
  DT_CFG_MUTANT      /* the interpreter with a deliberate bug (testing the tester) */
};

enum dt_mutation {
  DT_MUT_CELL_WRITE = 1, /* host cell writes store the value plus one */
  DT_MUT_SUB_ADD         /* every sub in a kernel computes add */
};

typedef struct dt_config {
  const char *name;
  int kind;
  unsigned passes;       /* opt-interp: FB_PASS_* bits (optimizer/optimizer.h);
                            async: FB_PASSES_* bits (fusebox/engine.h), exact */
  int flush_every;       /* async: fb_session_config.flush_every */
  int max_fuse;          /* max_fuse_per_task (0: default) */
  int mutation;          /* DT_CFG_MUTANT: enum dt_mutation */
} dt_config;

enum dt_obs_kind {
  DT_OBS_RC = 0,
  DT_OBS_RET,
  DT_OBS_READ,
  DT_OBS_FINAL
};

typedef struct dt_obs {
  int step;      /* step index; nsteps for the final state */
  int kind;
  int field;     /* READ / FINAL: the place */
  fb_type type;
  int64_t n;     /* elements in data */
  void *data;    /* READ / FINAL: field contents; RET: one value */
  int rc;        /* RC: the launch's return code */
} dt_obs;

typedef struct dt_log {
  dt_obs *v;
  int n, cap;
  fb_counters counters;  /* engine runs: the session's counters at the end */
  uint64_t aligned;      /* engine runs: flushes that waited for the period's end */
  uint64_t standins;     /* engine runs: entries run by a stand-in's code */
  /* engine runs: the launch errors reported (sync: by the launch; async: by
   * a later call, for the launch fb_session_error_launch names) */
  int async;             /* the run was in async mode */
  int nerrs;             /* error reports */
  int64_t err1_launch;   /* the first one's launch number (-1: none) */
  char err1[DT_ERRLEN];  /* its message, without async's " (launch N)" and
                            "(and N more errors ...)" */
  int failed;            /* the run could not complete: err says why */
  char err[DT_ERRLEN];
} dt_log;

void dt_log_free(dt_log *g);

typedef struct dt_env {
  fb_engine *eng;   /* shared by every engine run (its code cache too) */
  int verbose;
} dt_env;

/* Run p in the oracle (the reference interpreter, step by step). */
void dt_run_oracle(const dt_prog *p, dt_log *out);
/* Run p in a configuration. */
void dt_run_config(dt_env *env, const dt_prog *p, const dt_config *c, dt_log *out);
/* 0 when equal; else 1 with the first difference in msg. rc_exact: compare
 * launch return codes one by one (sync), else their set per run. */
int dt_compare(const dt_prog *p, const dt_log *want, const dt_log *got, int rc_exact, char *msg,
               size_t len);
/* Oracle + config + compare in one: 0 pass, 1 mismatch or failure (msg). */
int dt_check(dt_env *env, const dt_prog *p, const dt_config *c, char *msg, size_t len);

/* ---------------------------------------------------------------- shrinking */

/* Delete steps, kernels and statements of p while dt_check still fails for
 * c; p is replaced by the smallest failing program found. Returns the
 * number of checks run. */
int dt_shrink(dt_env *env, dt_prog *p, const dt_config *c, int max_checks);

#endif
