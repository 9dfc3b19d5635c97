/* The optimizer's passes, end to end: each tests/opt/NAME.opt is a task
 * sequence (IR text plus `#!` directives, see tests/opt/README) whose
 * graph before and after the pipeline, counters and optimized tasks must
 * match tests/opt/NAME.out (FB_UPDATE_GOLDEN=1 rewrites them), whose
 * `#! expect` counters must hold, and whose optimized tasks must give the
 * same fields (values and active cells) as the original sequence in the
 * reference interpreter, with every pass on and with each pass alone.
 * Further tests check memoization across flushes, rand() streams through
 * fusion, argument renaming and the pass switches. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codegen/codegen.h"
#include "fusebox/ir.h"
#include "fusebox/lang.h"
#include "optimizer/sfg.h"
#include "support.h"

/* ---------------------------------------------------------------- scripts */

enum {
  ST_TASK,
  ST_FLUSH,
  ST_HOST
};
enum {
  MAX_STEP_ARGS = 64,
  MAX_RUN_ARGS = 2560
}; /* a fused task's arguments */

typedef struct step {
  int kind;
  int kernel;      /* ST_TASK: kernel index; ST_HOST: SNode */
  uint64_t args[MAX_STEP_ARGS];
  int nargs;
  uint64_t launch;
} step;

typedef struct script {
  char *text;
  fb_layout *l;
  fb_kernel **ks;
  int nk;
  step *steps;
  int nsteps;
  unsigned passes;
  int max_fuse;
  int max_stmts;   /* max_fused_stmts; -1: the optimizer's default */
  int max_params;  /* max_task_params */
  char expect[16][48];
  int nexpect;
} script;

static void script_free(script *s) {
  for (int i = 0; i < s->nk; i++) fb_kernel_free(s->ks[i]);
  free(s->ks);
  fb_layout_free(s->l);
  free(s->steps);
  free(s->text);
}

static int find_kernel(const script *s, const char *name) {
  for (int i = 0; i < s->nk; i++)
    if (!strcmp(s->ks[i]->name, name)) return i;
  return -1;
}

static uint64_t parse_arg(fb_type t, const char *tok) {
  fb_value v = fb_type_is_float(t) ? fb_value_cast(fb_value_f64(strtod(tok, NULL)), t)
                                   : fb_value_cast(fb_value_i64(strtoll(tok, NULL, 0)), t);
  return fb_slot_pack(v);
}

static step *add_step(script *s) {
  s->steps = realloc(s->steps, sizeof *s->steps * (size_t)(s->nsteps + 1));
  ck_assert_ptr_nonnull(s->steps);
  step *st = &s->steps[s->nsteps++];
  memset(st, 0, sizeof *st);
  return st;
}

/* A task step: NAME args... [@launch]. */
static void task_step(script *s, int k, char *rest, uint64_t launch, const char *file) {
  step *st = add_step(s);
  st->kind = ST_TASK;
  st->kernel = k;
  st->launch = launch;
  for (char *tok = strtok(rest, " \t"); tok; tok = strtok(NULL, " \t")) {
    if (tok[0] == '@') {
      st->launch = strtoull(tok + 1, NULL, 0);
      continue;
    }
    ck_assert_msg(st->nargs < s->ks[k]->nparams && st->nargs < MAX_STEP_ARGS,
                  "%s: too many arguments for %s", file, s->ks[k]->name);
    st->args[st->nargs] = parse_arg(s->ks[k]->params[st->nargs], tok);
    st->nargs++;
  }
  ck_assert_msg(st->nargs == s->ks[k]->nparams, "%s: %s needs %d arguments", file, s->ks[k]->name,
                s->ks[k]->nparams);
}

/* `run K args`: every task K.t0, K.t1, ... (or K itself) with one launch number. */
static void run_step(script *s, char *rest, uint64_t *launch, const char *file) {
  char *name = strtok(rest, " \t");
  char *args = strtok(NULL, "");
  char buf[256], argbuf[512];
  int found = 0;
  for (int t = 0; t < 64; t++) {
    snprintf(buf, sizeof buf, "%s.t%d", name, t);
    int k = find_kernel(s, buf);
    if (k < 0) continue;
    snprintf(argbuf, sizeof argbuf, "%s", args ? args : "");
    task_step(s, k, argbuf, *launch, file);
    found++;
  }
  if (!found) {
    int k = find_kernel(s, name);
    ck_assert_msg(k >= 0, "%s: no kernel %s", file, name);
    snprintf(argbuf, sizeof argbuf, "%s", args ? args : "");
    task_step(s, k, argbuf, *launch, file);
  }
  ++*launch;
}

static unsigned parse_passes(const char *list) {
  static const char *const names[] = {"demote", "listgen", "dse", "fuse", "simplify"};
  if (!strcmp(list, "all")) return FB_PASS_ALL;
  unsigned p = 0;
  for (int i = 0; i < 5; i++)
    if (strstr(list, names[i])) p |= 1u << i;
  return p;
}

static void directive(script *s, char *line, uint64_t *launch, const char *file) {
  char *cmd = strtok(line, " \t");
  char *rest = strtok(NULL, "");
  if (!cmd) return;
  if (!strcmp(cmd, "run")) {
    run_step(s, rest, launch, file);
  } else if (!strcmp(cmd, "task")) {
    char *name = strtok(rest, " \t");
    int k = find_kernel(s, name);
    ck_assert_msg(k >= 0, "%s: no kernel %s", file, name);
    char *args = strtok(NULL, "");
    char argbuf[512];
    snprintf(argbuf, sizeof argbuf, "%s", args ? args : "");
    task_step(s, k, argbuf, (*launch)++, file);
  } else if (!strcmp(cmd, "flush")) {
    add_step(s)->kind = ST_FLUSH;
  } else if (!strcmp(cmd, "host_write")) {
    step *st = add_step(s);
    st->kind = ST_HOST;
    st->kernel = fb_layout_find(s->l, strtok(rest, " \t"));
    ck_assert_msg(st->kernel > 0, "%s: host_write of an unknown field", file);
  } else if (!strcmp(cmd, "passes")) {
    s->passes = parse_passes(rest ? rest : "");
  } else if (!strcmp(cmd, "max_fuse")) {
    s->max_fuse = atoi(rest ? rest : "1");
  } else if (!strcmp(cmd, "max_stmts")) {
    s->max_stmts = atoi(rest ? rest : "0");
  } else if (!strcmp(cmd, "max_params")) {
    s->max_params = atoi(rest ? rest : "0");
  } else if (!strcmp(cmd, "expect")) {
    for (char *tok = strtok(rest, " \t"); tok && s->nexpect < 16; tok = strtok(NULL, " \t"))
      snprintf(s->expect[s->nexpect++], sizeof s->expect[0], "%s", tok);
  } else {
    ck_abort_msg("%s: unknown directive '%s'", file, cmd);
  }
}

/* A script from its text (taken); file names it in messages. */
static void script_parse(script *s, char *text, const char *file) {
  memset(s, 0, sizeof *s);
  s->passes = FB_PASS_ALL;
  s->max_fuse = 1;
  s->max_stmts = -1;
  s->text = text;
  ck_assert_msg(s->text != NULL, "cannot read %s", file);
  fb_diags d;
  fb_diags_init(&d);
  int rc = fb_ir_parse(s->text, &s->l, &s->ks, &s->nk, &d);
  if (rc) ck_abort_msg("%s: %s", file, fb_diags_join(&d));
  fb_diags_free(&d);
  uint64_t launch = 0;
  char *copy = strdup(s->text);
  for (char *line = copy, *next; line; line = next) {
    next = strchr(line, '\n');
    if (next) *next++ = 0;
    while (*line == ' ' || *line == '\t') line++;
    if (line[0] == '#' && line[1] == '!') directive(s, line + 2, &launch, file);
  }
  free(copy);
}

static void script_load(script *s, const char *file) {
  script_parse(s, fbt_read_file(fbt_path(file), NULL), file);
}

/* ---------------------------------------------------------------- running */

typedef struct plan_run {
  const fb_kernel *k;
  uint64_t args[MAX_RUN_ARGS];
  int nargs;
  uint64_t launch;
} plan_run;

typedef struct result {
  char *text;           /* golden output */
  plan_run *orig, *opt; /* what ran before and after */
  int norig, nopt;
  fb_opt_batch **batches;
  int nbatches;
  fb_opt_counters total;
} result;

typedef struct tbuf {
  char *p;
  size_t n;
} tbuf;

static void tb_add(tbuf *b, const char *s) {
  size_t k = strlen(s);
  b->p = realloc(b->p, b->n + k + 1);
  memcpy(b->p + b->n, s, k + 1);
  b->n += k;
}

static void add_run(plan_run **v, int *n, const fb_kernel *k, const uint64_t *args, int nargs,
                    uint64_t launch) {
  *v = realloc(*v, sizeof **v * (size_t)(*n + 1));
  plan_run *r = &(*v)[(*n)++];
  r->k = k;
  r->nargs = nargs;
  ck_assert_int_le(nargs, MAX_RUN_ARGS);
  if (nargs) memcpy(r->args, args, sizeof *args * (size_t)nargs);
  r->launch = launch;
}

static void counters_text(tbuf *b, const fb_opt_counters *c) {
  char line[256];
  snprintf(line, sizeof line,
           "tasks %llu -> %llu, listgen removed %llu, demoted %llu, dead stores %llu, "
           "deleted %llu, fused %llu, simplified %llu",
           (unsigned long long)c->tasks_in, (unsigned long long)c->tasks_out,
           (unsigned long long)c->listgen_removed, (unsigned long long)c->demoted,
           (unsigned long long)c->dead_stores, (unsigned long long)c->tasks_deleted,
           (unsigned long long)c->tasks_fused, (unsigned long long)c->simplified);
  tb_add(b, line);
  /* only where the cost model refused something (the older goldens stay) */
  snprintf(line, sizeof line, ", fusions refused %llu", (unsigned long long)c->fuse_refused);
  tb_add(b, c->fuse_refused ? line : "");
  /* likewise: clear_lists of lists no task had filled (pass_listgen.c) */
  snprintf(line, sizeof line, ", empty clears removed %llu", (unsigned long long)c->clears_removed);
  tb_add(b, c->clears_removed ? line : "");
  tb_add(b, "\n");
}

static void do_flush(fb_opt *o, result *r, tbuf *b, int nflush) {
  char line[256];
  snprintf(line, sizeof line, "== flush %d: graph\n", nflush);
  tb_add(b, line);
  char *g = fb_opt_graph_text(o);
  tb_add(b, g);
  free(g);
  int rc = fb_opt_optimize(o);
  ck_assert_msg(rc == 0, "optimize: %s", fb_opt_errmsg(o));
  tb_add(b, "== optimized graph\n");
  g = fb_opt_graph_text(o);
  tb_add(b, g);
  free(g);
  fb_opt_batch *batch = NULL;
  rc = fb_opt_flush(o, &batch);
  ck_assert_msg(rc == 0, "flush: %s", fb_opt_errmsg(o));
  tb_add(b, "== counters\n");
  counters_text(b, &fb_opt_get_stats(o)->flush);
  tb_add(b, "== tasks\n");
  for (int i = 0; batch && i < batch->n; i++) {
    const fb_opt_launch *L = &batch->v[i];
    int maxp = fb_opt_get_options(o)->max_task_params;
    ck_assert_msg(!maxp || L->nargs <= maxp,
                  "task %d of flush %d has %d parameters, over the limit %d", i, nflush, L->nargs,
                  maxp);
    snprintf(line, sizeof line, "# task %d: %s, launch %llu, %d task%s\n", i,
             fb_task_kind_name(L->kind), (unsigned long long)L->launch, L->ntasks,
             L->ntasks == 1 ? "" : "s");
    tb_add(b, line);
    char *ir = fb_kernel_print(L->k);
    tb_add(b, ir);
    free(ir);
    add_run(&r->opt, &r->nopt, L->k, L->args, L->nargs, L->launch);
  }
  if (batch) {
    r->batches = realloc(r->batches, sizeof *r->batches * (size_t)(r->nbatches + 1));
    r->batches[r->nbatches++] = batch;
  }
  tb_add(b, "== retained\n");
  g = fb_opt_graph_text(o);
  tb_add(b, g);
  free(g);
}

static fb_opt *run_script(const script *s, unsigned passes, result *r) {
  memset(r, 0, sizeof *r);
  fb_opt_options opts;
  fb_opt_options_default(&opts);
  opts.passes = passes;
  opts.max_fuse_per_task = s->max_fuse;
  if (s->max_stmts >= 0) opts.max_fused_stmts = s->max_stmts;
  opts.max_task_params = s->max_params;
  opts.check = 1;
  fb_opt *o = fb_opt_new(s->l, &opts);
  ck_assert_ptr_nonnull(o);
  fb_irh *h = calloc((size_t)s->nk + 1, sizeof *h);
  for (int i = 0; i < s->nk; i++)
    ck_assert_msg(fb_opt_intern(o, s->ks[i], &h[i]) == 0, "intern %s: %s", s->ks[i]->name,
                  fb_opt_errmsg(o));
  tbuf b = {0};
  int nflush = 0;
  for (int i = 0; i < s->nsteps; i++) {
    const step *st = &s->steps[i];
    if (st->kind == ST_TASK) {
      fb_opt_task t = {h[st->kernel], st->args, st->nargs, st->launch};
      ck_assert_msg(fb_opt_insert(o, &t) == 0, "insert: %s", fb_opt_errmsg(o));
      add_run(&r->orig, &r->norig, s->ks[st->kernel], st->args, st->nargs, st->launch);
    } else if (st->kind == ST_FLUSH && fb_opt_pending(o)) {
      do_flush(o, r, &b, nflush++);
    } else if (st->kind == ST_HOST) {
      ck_assert_int_eq(fb_opt_host_write(o, st->kernel), 0);
    }
  }
  if (fb_opt_pending(o)) do_flush(o, r, &b, nflush++);
  r->total = fb_opt_get_stats(o)->total;
  char err[256];
  ck_assert_msg(fb_opt_check(o, err, sizeof err) == 0, "%s", err);
  for (int i = 0; i < s->nk; i++) fb_opt_release(o, h[i]);
  free(h);
  r->text = b.p;
  return o;
}

static void result_free(fb_opt *o, result *r) {
  for (int i = 0; i < r->nbatches; i++) fb_opt_batch_free(o, r->batches[i]);
  free(r->batches);
  free(r->orig);
  free(r->opt);
  free(r->text);
  fb_opt_free(o);
}

/* ---------------------------------------------------------------- the oracle */

static void interp_all(fb_interp *in, const plan_run *v, int n) {
  for (int i = 0; i < n; i++) {
    fb_value args[MAX_RUN_ARGS];
    for (int a = 0; a < v[i].nargs; a++) args[a] = fb_slot_unpack(v[i].k->params[a], v[i].args[a]);
    fb_interp_set_launch(in, v[i].launch);
    int rc = fb_interp_run(in, v[i].k, args, v[i].nargs, NULL);
    ck_assert_msg(rc == 0 || rc == FB_EBOUNDS, "interp %s: %s", v[i].k->name, fb_interp_errmsg(in));
  }
}

/* 1 when cell idx of sparse container c is active (a probe kernel). */
static int probe_active(fb_interp *in, const fb_kernel *probe, const int64_t *idx, int nd) {
  fb_value args[FB_MAX_AXES], ret;
  for (int d = 0; d < nd; d++) args[d] = fb_value_i32((int32_t)idx[d]);
  fb_interp_set_launch(in, 0);
  ck_assert_int_eq(fb_interp_run(in, probe, args, nd, &ret), 0);
  return ret.v.u != 0;
}

static fb_kernel *probe_kernel(const fb_layout *l, int c) {
  int nd = l->nodes[c].ndim;
  fb_type p[FB_MAX_AXES] = {FB_T_I32, FB_T_I32, FB_T_I32, FB_T_I32};
  fb_kernel *k = fb_kernel_new(l, "probe", nd, p, FB_T_BOOL);
  fb_builder b;
  fb_builder_init(&b, k);
  int idx[FB_MAX_AXES];
  for (int d = 0; d < nd; d++) idx[d] = fb_b_arg(&b, d);
  int a = fb_b_global(&b, FB_OP_IS_ACTIVE, c, idx, nd, -1);
  fb_b_ret(&b, a, 0);
  return k;
}

/* Same active cells in every sparse container (small ones). */
static void compare_masks(const fb_layout *l, fb_interp *x, fb_interp *y, const char *what) {
  for (int c = 1; c < l->nnodes; c++) {
    fb_snode_kind kind = l->nodes[c].kind;
    if (kind != FB_SN_BITMASKED && kind != FB_SN_POINTER && kind != FB_SN_DYNAMIC) continue;
    const fb_snode *sn = &l->nodes[c];
    int64_t total = 1;
    for (int d = 0; d < sn->ndim; d++) total *= sn->shape[sn->dim_axis[d]];
    if (total > 4096) continue;
    fb_kernel *probe = probe_kernel(l, c);
    for (int64_t lin = 0; lin < total; lin++) {
      int64_t idx[FB_MAX_AXES] = {0}, rest = lin;
      for (int d = sn->ndim - 1; d >= 0; d--) {
        idx[d] = rest % sn->shape[sn->dim_axis[d]];
        rest /= sn->shape[sn->dim_axis[d]];
      }
      ck_assert_msg(probe_active(x, probe, idx, sn->ndim) == probe_active(y, probe, idx, sn->ndim),
                    "%s: activity of %s cell %lld differs", what, sn->name ? sn->name : "?",
                    (long long)lin);
    }
    fb_kernel_free(probe);
  }
}

static void compare_runs(const fb_layout *l, const result *r, const char *what) {
  fb_interp *x = fb_interp_new(l, 7), *y = fb_interp_new(l, 7);
  interp_all(x, r->orig, r->norig);
  interp_all(y, r->opt, r->nopt);
  for (int p = 0; p < l->nnodes; p++) {
    if (l->nodes[p].kind != FB_SN_PLACE) continue;
    size_t bytes = (size_t)fb_field_numel(l, p) * fb_type_size(l->nodes[p].type);
    ck_assert_msg(!memcmp(fb_interp_field(x, p), fb_interp_field(y, p), bytes),
                  "%s: field %s differs after optimization", what, l->nodes[p].name);
  }
  compare_masks(l, x, y, what);
  fb_interp_free(x);
  fb_interp_free(y);
}

/* ---------------------------------------------------------------- expectations */

static uint64_t counter(const fb_opt_counters *c, const char *name) {
  if (!strcmp(name, "tasks_in")) return c->tasks_in;
  if (!strcmp(name, "tasks_out")) return c->tasks_out;
  if (!strcmp(name, "listgen")) return c->listgen_removed;
  if (!strcmp(name, "clears")) return c->clears_removed;
  if (!strcmp(name, "demoted")) return c->demoted;
  if (!strcmp(name, "dead_stores")) return c->dead_stores;
  if (!strcmp(name, "deleted")) return c->tasks_deleted;
  if (!strcmp(name, "fused")) return c->tasks_fused;
  if (!strcmp(name, "simplified")) return c->simplified;
  if (!strcmp(name, "refused")) return c->fuse_refused;
  if (!strcmp(name, "same_shape")) return c->fuse_same_shape;
  ck_abort_msg("unknown counter %s", name);
  return 0;
}

static void check_expect(const script *s, const result *r, const char *file) {
  for (int i = 0; i < s->nexpect; i++) {
    char name[48];
    snprintf(name, sizeof name, "%s", s->expect[i]);
    char *eq = strchr(name, '=');
    ck_assert_msg(eq != NULL, "%s: bad expectation %s", file, s->expect[i]);
    *eq = 0;
    uint64_t want = strtoull(eq + 1, NULL, 0), got = counter(&r->total, name);
    ck_assert_msg(got == want, "%s: %s is %llu, expected %llu", file, name, (unsigned long long)got,
                  (unsigned long long)want);
  }
}

static void check_golden(const char *file, const char *text) {
  char out[512];
  snprintf(out, sizeof out, "%.*s.out", (int)(strlen(file) - 4), file);
  if (getenv("FB_UPDATE_GOLDEN")) {
    FILE *f = fopen(fbt_path(out), "wb");
    ck_assert_ptr_nonnull(f);
    fputs(text, f);
    fclose(f);
    return;
  }
  char *want = fbt_read_file(fbt_path(out), NULL);
  ck_assert_msg(want != NULL, "missing golden %s (run with FB_UPDATE_GOLDEN=1)", out);
  if (strcmp(want, text)) {
    fprintf(stderr, "---- %s: got\n%s---- end\n", out, text);
    ck_abort_msg("%s differs from the golden file", out);
  }
  free(want);
}

/* ---------------------------------------------------------------- golden cases */

typedef struct names {
  char **v;
  int n;
} names;

static int cmp_str(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

static names list_cases(void) {
  names g = {0};
  DIR *d = opendir(fbt_path("opt"));
  ck_assert_ptr_nonnull(d);
  for (struct dirent *e; (e = readdir(d));) {
    size_t n = strlen(e->d_name);
    if (n < 5 || strcmp(e->d_name + n - 4, ".opt")) continue;
    g.v = realloc(g.v, sizeof *g.v * (size_t)(g.n + 1));
    g.v[g.n] = malloc(n + 8);
    snprintf(g.v[g.n++], n + 8, "opt/%s", e->d_name);
  }
  closedir(d);
  qsort(g.v, (size_t)g.n, sizeof *g.v, cmp_str);
  return g;
}

static void run_case(const char *file) {
  script s;
  script_load(&s, file);
  result r;
  fb_opt *o = run_script(&s, s.passes, &r);
  check_golden(file, r.text);
  check_expect(&s, &r, file);
  compare_runs(s.l, &r, file);
  result_free(o, &r);
  /* every pass alone, and none, must keep the results too */
  for (unsigned p = 0; p <= 5; p++) {
    char what[300];
    unsigned passes = p == 5 ? 0 : 1u << p;
    snprintf(what, sizeof what, "%s (passes 0x%x)", file, passes);
    o = run_script(&s, passes, &r);
    compare_runs(s.l, &r, what);
    result_free(o, &r);
  }
  script_free(&s);
}

START_TEST(golden_cases) {
  names g = list_cases();
  ck_assert_int_gt(g.n, 0);
  for (int i = 0; i < g.n; i++) {
    run_case(g.v[i]);
    free(g.v[i]);
  }
  free(g.v);
}
END_TEST

/* ---------------------------------------------------------------- API-level cases */

/* Insert every `run` step of a script (ignoring flushes) into o. */
static void insert_all(fb_opt *o, const script *s, const fb_irh *h, uint64_t launch0) {
  for (int i = 0; i < s->nsteps; i++) {
    const step *st = &s->steps[i];
    if (st->kind != ST_TASK) continue;
    fb_opt_task t = {h[st->kernel], st->args, st->nargs, launch0 + st->launch};
    ck_assert_int_eq(fb_opt_insert(o, &t), 0);
  }
}

static fb_opt *script_opt(const script *s, int max_fuse, fb_irh *h) {
  fb_opt_options opts;
  fb_opt_options_default(&opts);
  opts.max_fuse_per_task = max_fuse;
  fb_opt *o = fb_opt_new(s->l, &opts);
  for (int i = 0; i < s->nk; i++) ck_assert_int_eq(fb_opt_intern(o, s->ks[i], &h[i]), 0);
  return o;
}

/* The second flush of the same pattern finds every transformation in the
 * IR bank's memo and builds nothing. */
START_TEST(memo_across_flushes) {
  script s;
  script_load(&s, "opt/increments.opt");
  fb_irh h[8];
  fb_opt *o = script_opt(&s, 1, h);
  fb_opt_batch *b1 = NULL, *b2 = NULL;
  insert_all(o, &s, h, 0);
  ck_assert_int_eq(fb_opt_flush(o, &b1), 0);
  const fb_opt_counters *c = &fb_opt_get_stats(o)->flush;
  ck_assert_uint_gt(c->memo_misses, 0);
  insert_all(o, &s, h, 100);
  ck_assert_int_eq(fb_opt_flush(o, &b2), 0);
  c = &fb_opt_get_stats(o)->flush;
  ck_assert_uint_eq(c->memo_misses, 0);
  ck_assert_uint_gt(c->memo_hits, 0);
  ck_assert_uint_eq(c->tasks_fused, 9);
  ck_assert_int_eq(b1->n, 1);
  ck_assert_int_eq(b2->n, 1);
  ck_assert_int_eq(b1->v[0].ir, b2->v[0].ir); /* the same banked IR: compiled once */
  ck_assert_uint_eq(b2->v[0].launch, 100);
  fb_opt_batch_free(o, b1);
  fb_opt_batch_free(o, b2);
  for (int i = 0; i < s.nk; i++) fb_opt_release(o, h[i]);
  fb_opt_free(o);
  script_free(&s);
}
END_TEST

/* max_fuse_per_task bounds the fusions of a task per round: 1 needs more
 * pipeline iterations than 16 for the same result. */
START_TEST(max_fuse_rounds) {
  script s;
  script_load(&s, "opt/increments.opt");
  uint64_t iters[2];
  const int maxes[2] = {1, 16};
  for (int m = 0; m < 2; m++) {
    fb_irh h[8];
    fb_opt *o = script_opt(&s, maxes[m], h);
    insert_all(o, &s, h, 0);
    fb_opt_batch *b = NULL;
    ck_assert_int_eq(fb_opt_flush(o, &b), 0);
    ck_assert_int_eq(b->n, 1);
    ck_assert_int_eq(b->v[0].ntasks, 10);
    iters[m] = fb_opt_get_stats(o)->flush.iterations;
    fb_opt_batch_free(o, b);
    for (int i = 0; i < s.nk; i++) fb_opt_release(o, h[i]);
    fb_opt_free(o);
  }
  ck_assert_uint_gt(iters[0], iters[1]);
  script_free(&s);
}
END_TEST

/* max_fused_tasks bounds what one fused task stands for. */
START_TEST(fused_size_cap) {
  script s;
  script_load(&s, "opt/increments.opt");
  fb_irh h[8];
  fb_opt *o = script_opt(&s, 1, h);
  fb_opt_options opts = *fb_opt_get_options(o);
  opts.max_fused_tasks = 4;
  fb_opt_set_options(o, &opts);
  insert_all(o, &s, h, 0);
  fb_opt_batch *b = NULL;
  ck_assert_int_eq(fb_opt_flush(o, &b), 0);
  int total = 0;
  for (int i = 0; i < b->n; i++) {
    ck_assert_int_le(b->v[i].ntasks, 4);
    total += b->v[i].ntasks;
  }
  ck_assert_int_eq(total, 10);
  ck_assert_int_eq(b->n, 3);
  fb_opt_batch_free(o, b);
  for (int i = 0; i < s.nk; i++) fb_opt_release(o, h[i]);
  fb_opt_free(o);
  script_free(&s);
}
END_TEST

/* Many launches of a many-parameter kernel (60 parameters, 40
 * launches) with a GPU launch's limit of 503 parameters (what the engine
 * sets on CUDA): no fused task goes over it (run_script checks every task
 * handed out), fusion stops at eight parts (480), the refusals are counted,
 * and the results are those of the launches run one by one. Without the
 * limit the same window fuses into one task of 2400 parameters. */
static char *wide_script(void) {
  enum {
    NP = 60,
    NL = 40
  };
  size_t cap = 64 << 10, n = 0;
  char *t = malloc(cap);
  n += (size_t)snprintf(t + n, cap - n, "#! max_fuse 64\n#! max_stmts 0\n");
  for (int l = 0; l < NL; l++) {
    n += (size_t)snprintf(t + n, cap - n, "#! run wide");
    for (int a = 0; a < NP; a++) n += (size_t)snprintf(t + n, cap - n, " %d", l * 7 + a);
    n += (size_t)snprintf(t + n, cap - n, "\n");
  }
  n += (size_t)snprintf(t + n, cap - n,
                        "layout {\n  dense(i: 64) {\n    place x: i32\n  }\n}\n\nkernel wide(");
  for (int a = 0; a < NP; a++) n += (size_t)snprintf(t + n, cap - n, "%si32", a ? ", " : "");
  n += (size_t)snprintf(
      t + n, cap - n,
      ") {\n  %%0 = const.i32 0\n  %%1 = const.i32 64\n  par_for %%2 in %%0 .. %%1 {\n"
      "    %%3 = loop_index.i32 %%2, 0\n    %%4 = arg.i32 0\n");
  int acc = 4, id = 5;
  for (int a = 1; a < NP; a++) {
    n += (size_t)snprintf(t + n, cap - n, "    %%%d = arg.i32 %d\n    %%%d = add.i32 %%%d, %%%d\n",
                          id, a, id + 1, acc, id);
    acc = id + 1;
    id += 2;
  }
  n +=
      (size_t)snprintf(t + n, cap - n, "    %%%d = atomic_add.i32 x[%%3], %%%d\n  }\n}\n", id, acc);
  ck_assert_uint_lt(n, cap - 1);
  return t;
}

START_TEST(param_limit_many_launches) {
  const int limits[2] = {503, 0};
  int out[2];
  for (int m = 0; m < 2; m++) {
    script s;
    script_parse(&s, wide_script(), "wide (generated)");
    s.max_params = limits[m];
    result r;
    fb_opt *o = run_script(&s, FB_PASS_ALL, &r);
    ck_assert_int_eq(r.nbatches, 1);
    const fb_opt_batch *b = r.batches[0];
    int total = 0, maxargs = 0;
    for (int i = 0; i < b->n; i++) {
      total += b->v[i].ntasks;
      if (b->v[i].nargs > maxargs) maxargs = b->v[i].nargs;
    }
    ck_assert_int_eq(total, 40);
    out[m] = b->n;
    if (limits[m]) {
      ck_assert_int_le(maxargs, 503);
      ck_assert_int_eq(maxargs, 8 * 60); /* it packs up to the limit */
      ck_assert_uint_gt(r.total.fuse_refused, 0);
    } else {
      ck_assert_int_eq(maxargs, 40 * 60);
      ck_assert_uint_eq(r.total.fuse_refused, 0);
    }
    compare_runs(s.l, &r, "wide (generated)");
    result_free(o, &r);
    script_free(&s);
  }
  ck_assert_int_eq(out[0], 5);
  ck_assert_int_eq(out[1], 1);
}
END_TEST

static int traces;
static void on_trace(void *user, int it, const char *pass, const char *when, const char *dot) {
  ck_assert_ptr_nonnull(strstr(dot, "digraph sfg"));
  ck_assert(!strcmp(when, "before") || !strcmp(when, "after"));
  ck_assert_ptr_nonnull(pass);
  ck_assert_int_ge(it, 0);
  ++*(int *)user;
}

/* No pass: the batch is the window as inserted; the trace sees each pass. */
START_TEST(switches_and_trace) {
  script s;
  script_load(&s, "opt/chain_copy.opt");
  fb_irh h[8];
  fb_opt *o = script_opt(&s, 1, h);
  fb_opt_options opts = *fb_opt_get_options(o);
  opts.passes = 0;
  fb_opt_set_options(o, &opts);
  insert_all(o, &s, h, 0);
  fb_opt_batch *b = NULL;
  ck_assert_int_eq(fb_opt_flush(o, &b), 0);
  ck_assert_int_eq(b->n, 3);
  for (int i = 0, t = 0; i < s.nsteps; i++)
    if (s.steps[i].kind == ST_TASK) ck_assert_int_eq(b->v[t++].ir, h[s.steps[i].kernel]);
  fb_opt_batch_free(o, b);
  opts.passes = FB_PASS_ALL;
  fb_opt_set_options(o, &opts);
  traces = 0;
  fb_opt_set_trace(o, on_trace, &traces);
  insert_all(o, &s, h, 10);
  ck_assert_int_eq(fb_opt_flush(o, &b), 0);
  ck_assert_int_eq(b->n, 1); /* init, copy1 and copy2 fuse: element-wise on x and y */
  ck_assert_int_ge(traces, 10); /* five passes, before and after, at least once */
  fb_opt_batch_free(o, b);
  for (int i = 0; i < s.nk; i++) fb_opt_release(o, h[i]);
  fb_opt_free(o);
  script_free(&s);
}
END_TEST

/* Tasks from fb_lower, with values passed through gtmp slots: two
 * launches of one kernel stay ordered through the scratch slots and give
 * the interpreter's results. */
START_TEST(lowered_gtmp) {
  fb_layout *l = fb_layout_new();
  int64_t n = 32;
  int d = fb_layout_add(l, 0, FB_SN_DENSE, "i", &n, 0, NULL);
  int x = fb_layout_place(l, d, "x", FB_T_I32), y = fb_layout_place(l, d, "y", FB_T_I32);
  ck_assert_int_eq(fb_layout_finalize(l, NULL, 0), 0);
  fb_type pt = FB_T_I32;
  fb_kernel *k = fb_kernel_new(l, "k", 1, &pt, FB_T_VOID);
  fb_builder b;
  fb_builder_init(&b, k);
  int zero = fb_b_const_i32(&b, 0), one = fb_b_const_i32(&b, 1);
  int v = fb_b_binary(&b, FB_OP_ADD, fb_b_load(&b, y, &zero, 1), fb_b_arg(&b, 0)); /* spilled */
  fb_b_store(&b, y, &zero, 1, fb_b_binary(&b, FB_OP_ADD, v, one));
  int loop = fb_b_range_for(&b, zero, fb_b_const_i32(&b, 32), 1);
  int saved = fb_b_enter(&b, k->stmts[loop].body);
  int i = fb_b_loop_index(&b, loop, 0);
  fb_b_global(&b, FB_OP_ATOMIC_ADD, x, &i, 1, fb_b_binary(&b, FB_OP_MUL, v, i));
  fb_b_leave(&b, saved);
  fb_task_list tl;
  char err[128];
  ck_assert_int_eq(fb_lower(k, &tl, err, sizeof err), 0);
  ck_assert_int_eq(tl.n, 2);
  ck_assert_uint_gt(tl.gtmp_bytes, 0);
  fb_opt *o = fb_opt_new(l, NULL);
  fb_irh h[2];
  result r;
  memset(&r, 0, sizeof r);
  for (int t = 0; t < 2; t++) ck_assert_int_eq(fb_opt_intern(o, tl.v[t].ir, &h[t]), 0);
  for (int launch = 0; launch < 3; launch++) {
    uint64_t arg = fb_slot_pack(fb_value_i32(launch + 2));
    for (int t = 0; t < 2; t++) {
      fb_opt_task task = {h[t], &arg, 1, (uint64_t)launch};
      ck_assert_int_eq(fb_opt_insert(o, &task), 0);
      add_run(&r.orig, &r.norig, tl.v[t].ir, &arg, 1, (uint64_t)launch);
    }
  }
  fb_opt_batch *bt = NULL;
  ck_assert_int_eq(fb_opt_flush(o, &bt), 0);
  for (int t = 0; t < bt->n; t++)
    add_run(&r.opt, &r.nopt, bt->v[t].k, bt->v[t].args, bt->v[t].nargs, bt->v[t].launch);
  r.batches = malloc(sizeof *r.batches);
  r.batches[r.nbatches++] = bt;
  compare_runs(l, &r, "lowered gtmp");
  for (int t = 0; t < 2; t++) fb_opt_release(o, h[t]);
  result_free(o, &r);
  fb_task_list_free(&tl);
  fb_kernel_free(k);
  fb_layout_free(l);
}
END_TEST

/* Kernels from the .fbk front end, lowered by fb_lower (list tasks, gtmp
 * slots and all) and launched as an engine would: results match the
 * interpreter, and the sparse passes fire across two flushes. */
static const char *const fbk_src =
    "layout {\n"
    "  pointer(i: 8) as blocks { bitmasked(i: 8) as cells { place x: f32, y: f32 } }\n"
    "  place total: f32, n: i32\n"
    "}\n"
    "kernel init() { for i in 0 .. 40 { if i % 3 != 1 { x[i] = f32(i) } } }\n"
    "kernel inc(a: f32) { for i in x { x[i] += a } }\n"
    "kernel copy() { for i in x { y[i] = x[i] * 2.0 } }\n"
    "kernel sum() {\n  total[] = 0.0\n  n[] = 0\n"
    "  for i in y { total[] += y[i]\n n[] += 1 }\n}\n"
    "kernel wipe(k: i32) { for i in x { if i % 7 == k { deactivate(cells, i) } } }\n";

typedef struct lowered {
  fb_task_list tl;
  fb_irh h[16];
} lowered;

static void launch_lowered(fb_opt *o, lowered *lk, const uint64_t *args, int nargs, uint64_t launch,
                           result *r) {
  for (int t = 0; t < lk->tl.n; t++) {
    fb_opt_task task = {lk->h[t], args, nargs, launch};
    ck_assert_msg(fb_opt_insert(o, &task) == 0, "%s", fb_opt_errmsg(o));
    add_run(&r->orig, &r->norig, lk->tl.v[t].ir, args, nargs, launch);
  }
}

START_TEST(lowered_sparse_program) {
  fb_program *prog = NULL;
  fb_diags d;
  fb_diags_init(&d);
  int rc = fb_program_parse("opt.fbk", fbk_src, &prog, &d);
  if (rc) ck_abort_msg("%s", fb_diags_render("opt.fbk", fbk_src, &d));
  const fb_layout *l = fb_program_layout(prog);
  const char *names[] = {"init", "inc", "copy", "sum", "wipe"};
  lowered lk[5];
  fb_opt *o = fb_opt_new(l, NULL);
  for (int i = 0; i < 5; i++) {
    fb_kernel *k = NULL;
    ck_assert_int_eq(fb_program_instantiate(prog, names[i], NULL, 0, &k, &d), 0);
    char err[128];
    ck_assert_int_eq(fb_lower(k, &lk[i].tl, err, sizeof err), 0);
    for (int t = 0; t < lk[i].tl.n; t++) {
      ck_assert_int_eq(fb_opt_intern(o, lk[i].tl.v[t].ir, &lk[i].h[t]), 0);
      fb_task_kind kind;
      int loop, snode;
      ck_assert_int_eq(fb_opt_ir_info(o, lk[i].h[t], &kind, &loop, &snode), 0);
      ck_assert_int_eq(kind, lk[i].tl.v[t].kind);
      ck_assert_int_eq(snode, lk[i].tl.v[t].snode);
      ck_assert_int_eq(loop < 0, lk[i].tl.v[t].loop < 0);
    }
  }
  result r;
  memset(&r, 0, sizeof r);
  uint64_t one = fb_slot_pack(fb_value_f32(1.0f)), half = fb_slot_pack(fb_value_f32(0.5f));
  uint64_t three = fb_slot_pack(fb_value_i32(3)), launch = 0;
  launch_lowered(o, &lk[0], NULL, 0, launch++, &r);
  for (int flush = 0; flush < 3; flush++) {
    launch_lowered(o, &lk[1], &one, 1, launch++, &r);
    launch_lowered(o, &lk[1], &half, 1, launch++, &r);
    launch_lowered(o, &lk[2], NULL, 0, launch++, &r);
    launch_lowered(o, &lk[3], NULL, 0, launch++, &r);
    if (flush == 1) launch_lowered(o, &lk[4], &three, 1, launch++, &r);
    fb_opt_batch *b = NULL;
    ck_assert_msg(fb_opt_flush(o, &b) == 0, "%s", fb_opt_errmsg(o));
    for (int t = 0; t < b->n; t++) {
      add_run(&r.opt, &r.nopt, b->v[t].k, b->v[t].args, b->v[t].nargs, b->v[t].launch);
      if (b->v[t].kind == FB_TASK_LISTGEN) ck_assert_int_ge(b->v[t].loop, 0);
    }
    r.batches = realloc(r.batches, sizeof *r.batches * (size_t)(r.nbatches + 1));
    r.batches[r.nbatches++] = b;
  }
  compare_runs(l, &r, "lowered sparse program");
  const fb_opt_counters *c = &fb_opt_get_stats(o)->total;
  ck_assert_uint_gt(c->listgen_removed, 0);
  ck_assert_uint_gt(c->demoted, 0);
  ck_assert_uint_gt(c->tasks_fused, 0);
  ck_assert_uint_lt(c->tasks_out, c->tasks_in);
  for (int i = 0; i < 5; i++) {
    for (int t = 0; t < lk[i].tl.n; t++) fb_opt_release(o, lk[i].h[t]);
    fb_task_list_free(&lk[i].tl);
  }
  result_free(o, &r);
  fb_program_free(prog);
  fb_diags_free(&d);
}
END_TEST

Suite *passes_suite(void) {
  Suite *s = suite_create("passes");
  TCase *tc = tcase_create("golden");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, golden_cases);
  suite_add_tcase(s, tc);
  tc = tcase_create("api");
  tcase_add_test(tc, memo_across_flushes);
  tcase_add_test(tc, max_fuse_rounds);
  tcase_add_test(tc, param_limit_many_launches);
  tcase_add_test(tc, fused_size_cap);
  tcase_add_test(tc, switches_and_trace);
  tcase_add_test(tc, lowered_gtmp);
  tcase_add_test(tc, lowered_sparse_program);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) { return fbt_run(passes_suite()); }
