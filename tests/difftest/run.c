/* Running a differential-test program and comparing what it observed.
 *
 * Every run yields a log of observations: each launch's return code, each
 * returned value, each host read (a whole field or one cell) and, at the
 * end, every field. The oracle is the reference interpreter run step by
 * step (host writes become tiny kernels that activate the cells, followed by
 * writes into the interpreter's flat arrays). The configurations:
 *
 *   sync        the engine in sync mode (lowering, codegen, the CPU runtime)
 *   async       the engine in async mode with a set of passes
 *   opt-interp  lowering + the SFG optimizer (optimizer/optimizer.h) with a set of
 *               passes, every flushed batch run task by task in the
 *               interpreter: the optimizer checked without code generation
 *
 * Launch return codes are compared one by one in sync mode; where the
 * engine defers work, as the set of codes seen in the run. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codegen/codegen.h"
#include "dt.h"
#include "engine/engine_test.h"
#include "optimizer/optimizer.h"

#define DT_RAND_SEED 0x5eedull

/* ---------------------------------------------------------------- logs */

void dt_log_free(dt_log *g) {
  for (int i = 0; i < g->n; i++) free(g->v[i].data);
  free(g->v);
  memset(g, 0, sizeof *g);
}

static dt_obs *log_add(dt_log *g, int step, int kind) {
  if (g->n == g->cap) {
    int cap = g->cap ? g->cap * 2 : 32;
    dt_obs *v = realloc(g->v, sizeof *v * (size_t)cap);
    if (!v) return NULL;
    g->v = v;
    g->cap = cap;
  }
  dt_obs *o = &g->v[g->n++];
  memset(o, 0, sizeof *o);
  o->step = step;
  o->kind = kind;
  o->field = -1;
  return o;
}

#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
static void
log_fail(dt_log *g, const char *fmt, ...) {
  if (g->failed) return;
  g->failed = 1;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(g->err, sizeof g->err, fmt, ap);
  va_end(ap);
}

static void log_rc(dt_log *g, int step, int rc) {
  dt_obs *o = log_add(g, step, DT_OBS_RC);
  if (o) o->rc = rc;
}

static void log_value(dt_log *g, int step, fb_value v) {
  dt_obs *o = log_add(g, step, DT_OBS_RET);
  if (!o || !(o->data = malloc(8))) return;
  o->type = v.type;
  o->n = 1;
  fb_value_store(v, o->data);
}

/* Takes ownership of data (numel elements of the field's type). */
static void log_data(dt_log *g, int step, int kind, int field, fb_type t, int64_t n, void *data) {
  dt_obs *o = log_add(g, step, kind);
  if (!o) {
    free(data);
    return;
  }
  o->field = field;
  o->type = t;
  o->n = n;
  o->data = data;
}

static size_t field_bytes(const fb_layout *l, int f) {
  return (size_t)fb_field_numel(l, f) * fb_type_size(l->nodes[f].type);
}

static int64_t flat_index(const fb_layout *l, int f, const int64_t *idx) {
  const fb_snode *s = &l->nodes[f];
  int64_t flat = 0;
  for (int d = 0; d < s->ndim; d++) flat = flat * s->shape[s->dim_axis[d]] + idx[d];
  return flat;
}

/* ---------------------------------------------------------------- host writes in the interpreter */

/* A kernel storing v at idx (cell write), or 0 at every cell (whole-field
 * write: activates them all, the contents are copied afterwards). */
static fb_kernel *host_write_kernel(const fb_layout *l, int f, const int64_t *idx, fb_value v) {
  const fb_snode *s = &l->nodes[f];
  fb_kernel *k = fb_kernel_new(l, "host_write", 0, NULL, FB_T_VOID);
  if (!k) return NULL;
  fb_builder b;
  fb_builder_init(&b, k);
  int ix[FB_MAX_AXES];
  for (int d = 0; d < s->ndim; d++) {
    if (idx) {
      ix[d] = fb_b_const_i32(&b, (int32_t)idx[d]);
      continue;
    }
    int loop = fb_b_range_for(&b, fb_b_const_i32(&b, 0),
                              fb_b_const_i32(&b, (int32_t)s->shape[s->dim_axis[d]]), 0);
    fb_b_enter(&b, k->stmts[loop].body);
    ix[d] = fb_b_loop_index(&b, loop, 0);
  }
  fb_b_store(&b, f, ix, s->ndim, fb_b_const(&b, idx ? v : fb_value_cast(fb_value_i32(0), s->type)));
  if (b.err) {
    fb_kernel_free(k);
    return NULL;
  }
  return k;
}

/* Host write into the interpreter; launch numbering is left as it was. */
static int interp_host_write(fb_interp *in, const fb_layout *l, const dt_step *s,
                             uint64_t launches) {
  int cell = s->kind == DT_CELL_WRITE;
  fb_value v = fb_value_cast(s->val, l->nodes[s->field].type);
  fb_kernel *k = host_write_kernel(l, s->field, cell ? s->idx : NULL, v);
  if (!k) return FB_ENOMEM;
  int rc = fb_interp_run(in, k, NULL, 0, NULL);
  fb_kernel_free(k);
  fb_interp_set_launch(in, launches);
  if (rc) return rc;
  if (!cell) dt_field_data(l, s->field, s->data, fb_interp_field(in, s->field));
  return 0;
}

static void interp_read_cell(fb_interp *in, const fb_layout *l, const dt_step *s, int step,
                             dt_log *out) {
  fb_type t = l->nodes[s->field].type;
  size_t sz = fb_type_size(t);
  const char *src = fb_interp_field(in, s->field);
  void *d = malloc(8);
  if (d) memcpy(d, src + (size_t)flat_index(l, s->field, s->idx) * sz, sz);
  log_data(out, step, DT_OBS_READ, s->field, t, 1, d);
}

static void interp_read_field(fb_interp *in, const fb_layout *l, int f, int step, int kind,
                              dt_log *out) {
  size_t n = field_bytes(l, f);
  void *d = malloc(n ? n : 1);
  if (d) memcpy(d, fb_interp_field(in, f), n);
  log_data(out, step, kind, f, l->nodes[f].type, fb_field_numel(l, f), d);
}

static void interp_final(fb_interp *in, const fb_layout *l, int step, dt_log *out) {
  for (int f = 1; f < l->nnodes; f++)
    if (l->nodes[f].kind == FB_SN_PLACE) interp_read_field(in, l, f, step, DT_OBS_FINAL, out);
}

/* ---------------------------------------------------------------- the oracle */

static int oracle_launch(fb_interp *in, const dt_prog *p, const dt_step *s, int step, dt_log *out) {
  const fb_kernel *k = p->ks[s->kernel];
  fb_value ret;
  int rc = fb_interp_run(in, k, s->args, s->nargs, &ret);
  if (rc != 0 && rc != FB_EBOUNDS) {
    log_fail(out, "step %d: the interpreter refused kernel %s: %s (%s)", step, k->name,
             fb_interp_errmsg(in), fb_strerror(rc));
    return rc;
  }
  log_rc(out, step, rc);
  if (k->ret != FB_T_VOID) log_value(out, step, ret);
  return 0;
}

void dt_run_oracle(const dt_prog *p, dt_log *out) {
  memset(out, 0, sizeof *out);
  fb_interp *in = fb_interp_new(p->l, DT_RAND_SEED);
  if (!in) {
    log_fail(out, "out of memory");
    return;
  }
  uint64_t launches = 0;
  for (int i = 0; i < p->nsteps && !out->failed; i++) {
    const dt_step *s = &p->steps[i];
    int rc = 0;
    switch (s->kind) {
    case DT_LAUNCH:
      fb_interp_set_launch(in, launches++);
      oracle_launch(in, p, s, i, out);
      break;
    case DT_FIELD_READ: interp_read_field(in, p->l, s->field, i, DT_OBS_READ, out); break;
    case DT_CELL_READ: interp_read_cell(in, p->l, s, i, out); break;
    case DT_FIELD_WRITE:
    case DT_CELL_WRITE:
      rc = interp_host_write(in, p->l, s, launches);
      if (rc)
        log_fail(out, "step %d: host write in the interpreter: %s (%s)", i, fb_interp_errmsg(in),
                 fb_strerror(rc));
      break;
    default: break;
    }
  }
  if (!out->failed) interp_final(in, p->l, p->nsteps, out);
  fb_interp_free(in);
}

/* ---------------------------------------------------------------- the engine */

/* Session settings of a configuration. */
static void session_config(const dt_config *c, fb_session_config *sc) {
  memset(sc, 0, sizeof *sc);
  sc->mode = c->kind == DT_CFG_ASYNC ? "async" : "sync";
  sc->seed = DT_RAND_SEED;
  if (c->kind != DT_CFG_ASYNC) return;
  sc->passes = c->passes | FB_PASSES_EXACT;
  sc->flush_every = c->flush_every;
  sc->max_fuse_per_task = c->max_fuse;
}

/* Errors of launches that ran in the background: async mode reports them on
 * a later call, which still did its own work. */
static int deferred(int rc) { return rc == FB_EBOUNDS || rc == FB_EQUOTA; }

/* Cut [at, at + n) out of s. */
static void cut(char *s, char *at, size_t n) { memmove(at, at + n, strlen(at + n) + 1); }

/* An error report: sync mode's for launch `launch` (its own), async mode's
 * (launch < 0) for the launch the session names. The first is kept, in the
 * words sync mode uses: async's " (launch N)" and " (and N more errors of
 * background launches)" are taken out. */
static void note_error(fb_session *s, dt_log *out, int64_t launch) {
  out->nerrs++;
  if (out->nerrs > 1) return;
  uint64_t at = 0;
  out->err1_launch = launch >= 0                                  ? launch
                     : fb_session_error_launch(s, &at, NULL) == 0 ? (int64_t)at
                                                                  : -1;
  snprintf(out->err1, sizeof out->err1, "%s", fb_session_errmsg(s));
  if (launch >= 0) return;
  char *p = strstr(out->err1, " (launch "), *q = p ? strchr(p + 1, ')') : NULL;
  if (p && q && q - p < 32) cut(out->err1, p, (size_t)(q + 1 - p));
  p = strstr(out->err1, " (and ");
  q = p && strstr(p, "of background launches)") ? strchr(p + 1, ')') : NULL;
  if (q) cut(out->err1, p, (size_t)(q + 1 - p));
}

/* A deferred error seen by an async call (a sync mode call reports none). */
static void note_deferred(fb_session *s, dt_log *out, int step, int rc) {
  log_rc(out, step, rc);
  if (out->async) note_error(s, out, -1);
}

static void engine_read(fb_session *s, const fb_layout *l, int f, int step, int kind, dt_log *out) {
  size_t n = field_bytes(l, f);
  void *d = malloc(n ? n : 1);
  if (!d) {
    log_fail(out, "out of memory");
    return;
  }
  int rc = fb_field_read(s, f, d, n);
  if (deferred(rc)) note_deferred(s, out, step, rc);
  else if (rc) {
    free(d);
    log_fail(out, "step %d: fb_field_read(%s): %s: %s", step, l->nodes[f].name, fb_strerror(rc),
             fb_session_errmsg(s));
    return;
  }
  log_data(out, step, kind, f, l->nodes[f].type, fb_field_numel(l, f), d);
}

static void engine_cell_read(fb_session *s, const fb_layout *l, const dt_step *st, int step,
                             dt_log *out) {
  fb_value v;
  const fb_snode *f = &l->nodes[st->field];
  int rc = fb_cell_read(s, st->field, st->idx, f->ndim, &v);
  if (deferred(rc)) note_deferred(s, out, step, rc);
  else if (rc) {
    log_fail(out, "step %d: fb_cell_read(%s): %s: %s", step, f->name, fb_strerror(rc),
             fb_session_errmsg(s));
    return;
  }
  void *d = malloc(8);
  if (d) fb_value_store(fb_value_cast(v, f->type), d);
  log_data(out, step, DT_OBS_READ, st->field, f->type, 1, d);
}

static void engine_write(fb_session *s, const fb_layout *l, const dt_step *st, int step,
                         dt_log *out) {
  const fb_snode *f = &l->nodes[st->field];
  int rc;
  if (st->kind == DT_CELL_WRITE) {
    rc = fb_cell_write(s, st->field, st->idx, f->ndim, fb_value_cast(st->val, f->type));
  } else {
    size_t n = field_bytes(l, st->field);
    void *d = malloc(n ? n : 1);
    if (!d) {
      log_fail(out, "out of memory");
      return;
    }
    dt_field_data(l, st->field, st->data, d);
    rc = fb_field_write(s, st->field, d, n);
    free(d);
  }
  if (deferred(rc)) note_deferred(s, out, step, rc);
  else if (rc)
    log_fail(out, "step %d: %s(%s): %s: %s", step, dt_step_name(st->kind), f->name, fb_strerror(rc),
             fb_session_errmsg(s));
}

static void engine_launch(fb_session *s, const dt_prog *p, const int *ids, const dt_step *st,
                          int step, int64_t launch, dt_log *out) {
  const fb_kernel *k = p->ks[st->kernel];
  fb_value ret;
  memset(&ret, 0, sizeof ret);
  int rc = fb_launch(s, ids[st->kernel], st->args, st->nargs, &ret);
  if (rc) note_error(s, out, out->async ? -1 : launch);
  if (rc != 0 && rc != FB_EBOUNDS && !out->err[0])
    snprintf(out->err, sizeof out->err, "step %d: launch of %s: %s: %s", step, k->name,
             fb_strerror(rc), fb_session_errmsg(s));
  log_rc(out, step, rc);
  if (k->ret != FB_T_VOID)
    log_value(out, step, rc == 0 || rc == FB_EBOUNDS ? ret : fb_value_i32(rc));
}

static void engine_steps(fb_session *s, const dt_prog *p, const int *ids, dt_log *out) {
  int64_t launches = 0;
  for (int i = 0; i < p->nsteps && !out->failed; i++) {
    const dt_step *st = &p->steps[i];
    int rc = 0;
    switch (st->kind) {
    case DT_LAUNCH: engine_launch(s, p, ids, st, i, launches++, out); break;
    case DT_FIELD_READ: engine_read(s, p->l, st->field, i, DT_OBS_READ, out); break;
    case DT_CELL_READ: engine_cell_read(s, p->l, st, i, out); break;
    case DT_FIELD_WRITE:
    case DT_CELL_WRITE: engine_write(s, p->l, st, i, out); break;
    case DT_FLUSH: rc = fb_flush(s); break;
    case DT_SYNC: rc = fb_sync(s); break;
    default: break;
    }
    if (deferred(rc)) note_deferred(s, out, i, rc);
    else if (rc)
      log_fail(out, "step %d: %s: %s: %s", i, dt_step_name(st->kind), fb_strerror(rc),
               fb_session_errmsg(s));
  }
  int rc = out->failed ? 0 : fb_sync(s);
  if (deferred(rc)) note_deferred(s, out, p->nsteps, rc);
  else if (rc) log_fail(out, "final fb_sync: %s: %s", fb_strerror(rc), fb_session_errmsg(s));
  for (int f = 1; f < p->l->nnodes && !out->failed; f++)
    if (p->l->nodes[f].kind == FB_SN_PLACE) engine_read(s, p->l, f, p->nsteps, DT_OBS_FINAL, out);
}

static void run_engine(dt_env *env, const dt_prog *p, const dt_config *c, dt_log *out) {
  fb_session_config sc;
  session_config(c, &sc);
  out->async = c->kind == DT_CFG_ASYNC;
  out->err1_launch = -1;
  fb_session *s = NULL;
  char err[512] = "";
  int rc = fb_session_create(env->eng, &sc, p->l, &s, err, sizeof err);
  if (rc) {
    log_fail(out, "fb_session_create: %s: %s", fb_strerror(rc), err);
    return;
  }
  int *ids = calloc((size_t)p->nk + 1, sizeof *ids);
  for (int i = 0; ids && i < p->nk && !out->failed; i++) {
    ids[i] = fb_session_add_kernel(s, p->ks[i]);
    if (ids[i] < 0)
      log_fail(out, "the engine refused kernel %s: %s: %s", p->ks[i]->name, fb_strerror(ids[i]),
               fb_session_errmsg(s));
  }
  if (!ids) log_fail(out, "out of memory");
  if (!out->failed) engine_steps(s, p, ids, out);
  fb_session_counters(s, &out->counters);
  out->aligned = fb_session_test_aligned_flushes(s);
  out->standins = fb_session_test_standins(s);
  free(ids);
  fb_session_destroy(s);
}

/* ---------------------------------------------------------------- the optimizer over the interpreter */

typedef struct optrun {
  const dt_prog *p;
  fb_interp *in;
  fb_opt *o;
  fb_task_list *tl; /* per kernel */
  fb_irh **h; /* per kernel, per task */
  uint64_t launches;
  dt_log *out;
} optrun;

static int has_ret(const fb_kernel *k) {
  for (int b = 0; b < k->nblocks; b++)
    for (int i = 0; i < k->blocks[b].n; i++)
      if (k->stmts[k->blocks[b].ids[i]].op == FB_OP_RET) return 1;
  return 0;
}

/* Flush the window and run the batch; the last task with a ret gives *ret. */
static int opt_flush(optrun *r, int step, fb_value *ret) {
  fb_opt_batch *b = NULL;
  int rc = fb_opt_flush(r->o, &b);
  if (rc) {
    log_fail(r->out, "step %d: fb_opt_flush: %s: %s", step, fb_strerror(rc), fb_opt_errmsg(r->o));
    return rc;
  }
  for (int i = 0; b && i < b->n && !r->out->failed; i++) {
    const fb_opt_launch *t = &b->v[i];
    fb_value v, *args = calloc((size_t)t->k->nparams + 1, sizeof *args);
    if (!args) {
      log_fail(r->out, "out of memory");
      break;
    }
    for (int a = 0; a < t->k->nparams; a++)
      args[a] = fb_slot_unpack(t->k->params[a], a < t->nargs ? t->args[a] : 0);
    fb_interp_set_launch(r->in, t->launch);
    rc = fb_interp_run(r->in, t->k, args, t->k->nparams, &v);
    free(args);
    if (rc != 0 && rc != FB_EBOUNDS) {
      char *text = fb_kernel_print(t->k);
      log_fail(r->out, "step %d: the interpreter refused optimized task %s: %s (%s)\n%s", step,
               t->k->name, fb_interp_errmsg(r->in), fb_strerror(rc), text ? text : "");
      free(text);
    }
    if (rc) log_rc(r->out, step, rc);
    if (ret && t->k->ret != FB_T_VOID && has_ret(t->k)) *ret = v;
  }
  if (b) fb_opt_batch_free(r->o, b);
  fb_interp_set_launch(r->in, r->launches);
  return 0;
}

static void opt_launch(optrun *r, const dt_step *s, int step) {
  const fb_kernel *k = r->p->ks[s->kernel];
  uint64_t slots[DT_MAXP];
  for (int a = 0; a < k->nparams; a++)
    slots[a] = fb_slot_pack(fb_value_cast(s->args[a], k->params[a]));
  const fb_task_list *tl = &r->tl[s->kernel];
  for (int t = 0; t < tl->n && !r->out->failed; t++) {
    fb_opt_task task = {r->h[s->kernel][t], slots, k->nparams, r->launches};
    int rc = fb_opt_insert(r->o, &task);
    if (rc)
      log_fail(r->out, "step %d: fb_opt_insert: %s: %s", step, fb_strerror(rc),
               fb_opt_errmsg(r->o));
  }
  r->launches++;
  log_rc(r->out, step, 0);
  if (k->ret != FB_T_VOID && !r->out->failed) { /* a return value flushes */
    fb_value v;
    memset(&v, 0, sizeof v);
    v.type = k->ret;
    opt_flush(r, step, &v);
    log_value(r->out, step, v);
  }
}

static void opt_steps(optrun *r) {
  const dt_prog *p = r->p;
  for (int i = 0; i < p->nsteps && !r->out->failed; i++) {
    const dt_step *s = &p->steps[i];
    if (s->kind == DT_LAUNCH) {
      opt_launch(r, s, i);
      continue;
    }
    if (opt_flush(r, i, NULL)) return;
    int rc = 0;
    switch (s->kind) {
    case DT_FIELD_READ: interp_read_field(r->in, p->l, s->field, i, DT_OBS_READ, r->out); break;
    case DT_CELL_READ: interp_read_cell(r->in, p->l, s, i, r->out); break;
    case DT_FIELD_WRITE:
    case DT_CELL_WRITE:
      rc = interp_host_write(r->in, p->l, s, r->launches);
      if (!rc) rc = fb_opt_host_write(r->o, s->field);
      if (rc) log_fail(r->out, "step %d: host write: %s", i, fb_strerror(rc));
      break;
    default: break;
    }
  }
  if (!r->out->failed && !opt_flush(r, p->nsteps, NULL))
    interp_final(r->in, p->l, p->nsteps, r->out);
}

static int opt_prepare(optrun *r, const dt_config *c) {
  const dt_prog *p = r->p;
  fb_opt_options o;
  fb_opt_options_default(&o);
  o.passes = c->passes;
  o.check = 1;
  if (c->max_fuse > 0) o.max_fuse_per_task = c->max_fuse;
  r->o = fb_opt_new(p->l, &o);
  r->in = fb_interp_new(p->l, DT_RAND_SEED);
  r->tl = calloc((size_t)p->nk + 1, sizeof *r->tl);
  r->h = calloc((size_t)p->nk + 1, sizeof *r->h);
  if (!r->o || !r->in || !r->tl || !r->h) {
    log_fail(r->out, "out of memory");
    return -1;
  }
  for (int i = 0; i < p->nk; i++) {
    char err[256] = "";
    int rc = fb_lower(p->ks[i], &r->tl[i], err, sizeof err);
    if (rc) {
      log_fail(r->out, "fb_lower(%s): %s: %s", p->ks[i]->name, fb_strerror(rc), err);
      return rc;
    }
    r->h[i] = calloc((size_t)r->tl[i].n + 1, sizeof *r->h[i]);
    if (!r->h[i]) {
      log_fail(r->out, "out of memory");
      return -1;
    }
    for (int t = 0; t < r->tl[i].n; t++) {
      rc = fb_opt_intern(r->o, r->tl[i].v[t].ir, &r->h[i][t]);
      if (rc) {
        log_fail(r->out, "fb_opt_intern(%s): %s: %s", r->tl[i].v[t].ir->name, fb_strerror(rc),
                 fb_opt_errmsg(r->o));
        return rc;
      }
    }
  }
  return 0;
}

static void run_opt_interp(const dt_prog *p, const dt_config *c, dt_log *out) {
  optrun r;
  memset(&r, 0, sizeof r);
  r.p = p;
  r.out = out;
  if (opt_prepare(&r, c) == 0) opt_steps(&r);
  const fb_opt_stats *st = r.o ? fb_opt_get_stats(r.o) : NULL;
  if (st) { /* the optimizer's counters in the engine's terms */
    out->counters.tasks_launched = st->total.tasks_out;
    out->counters.tasks_fused = st->total.tasks_fused;
    out->counters.dead_stores_removed = st->total.dead_stores;
    out->counters.activations_demoted = st->total.demoted;
    out->counters.listgens_removed = st->total.listgen_removed;
  }
  for (int i = 0; i < p->nk; i++) {
    if (r.h && r.h[i] && r.o)
      for (int t = 0; t < r.tl[i].n; t++) fb_opt_release(r.o, r.h[i][t]);
    if (r.h) free(r.h[i]);
    if (r.tl) fb_task_list_free(&r.tl[i]);
  }
  free(r.h);
  free(r.tl);
  fb_opt_free(r.o);
  fb_interp_free(r.in);
}

/* ---------------------------------------------------------------- mutants */

static void run_mutant(const dt_prog *p, const dt_config *c, dt_log *out) {
  dt_prog m;
  if (dt_prog_copy(p, &m)) {
    log_fail(out, "out of memory");
    return;
  }
  if (c->mutation == DT_MUT_CELL_WRITE)
    for (int i = 0; i < m.nsteps; i++)
      if (m.steps[i].kind == DT_CELL_WRITE)
        m.steps[i].val =
            fb_value_cast(fb_value_i64(fb_value_as_i64(m.steps[i].val) + 1), m.steps[i].val.type);
  if (c->mutation == DT_MUT_SUB_ADD)
    for (int k = 0; k < m.nk; k++)
      for (int i = 0; i < m.ks[k]->nstmts; i++)
        if (m.ks[k]->stmts[i].op == FB_OP_SUB) m.ks[k]->stmts[i].op = FB_OP_ADD;
  dt_run_oracle(&m, out);
  dt_prog_free(&m);
}

void dt_run_config(dt_env *env, const dt_prog *p, const dt_config *c, dt_log *out) {
  memset(out, 0, sizeof *out);
  if (c->kind == DT_CFG_OPT_INTERP) run_opt_interp(p, c, out);
  else if (c->kind == DT_CFG_MUTANT) run_mutant(p, c, out);
  else run_engine(env, p, c, out);
}

/* ---------------------------------------------------------------- comparison */

static int elem_equal(fb_type t, const void *a, const void *b) {
  if (t == FB_T_F32) {
    float x, y;
    memcpy(&x, a, 4);
    memcpy(&y, b, 4);
    return x == y || (isnan(x) && isnan(y));
  }
  if (t == FB_T_F64) {
    double x, y;
    memcpy(&x, a, 8);
    memcpy(&y, b, 8);
    return x == y || (isnan(x) && isnan(y));
  }
  return memcmp(a, b, fb_type_size(t)) == 0;
}

static void fmt_elem(fb_type t, const void *p, char *buf, size_t len) {
  fb_value v = fb_value_load(t, p);
  if (fb_type_is_float(t)) snprintf(buf, len, "%.9g", v.v.f);
  else if (fb_type_is_signed(t)) snprintf(buf, len, "%lld", (long long)v.v.i);
  else snprintf(buf, len, "%llu", (unsigned long long)v.v.u);
}

static void fmt_index(const fb_layout *l, int f, int64_t flat, char *buf, size_t len) {
  const fb_snode *s = &l->nodes[f];
  int64_t idx[FB_MAX_AXES];
  for (int d = s->ndim - 1; d >= 0; d--) {
    int64_t e = s->shape[s->dim_axis[d]];
    idx[d] = flat % e;
    flat /= e;
  }
  size_t o = (size_t)snprintf(buf, len, "[");
  for (int d = 0; d < s->ndim && o < len; d++)
    o += (size_t)snprintf(buf + o, len - o, d ? ", %lld" : "%lld", (long long)idx[d]);
  if (o < len) snprintf(buf + o, len - o, "]");
}

static const char *obs_what(const dt_prog *p, const dt_obs *o, char *buf, size_t len) {
  if (o->kind == DT_OBS_FINAL) {
    snprintf(buf, len, "final contents of %s", p->l->nodes[o->field].name);
  } else if (o->step < p->nsteps) {
    const dt_step *s = &p->steps[o->step];
    const char *name = s->kind == DT_LAUNCH ? p->ks[s->kernel]->name : p->l->nodes[s->field].name;
    snprintf(buf, len, "step %d (%s %s)%s", o->step, dt_step_name(s->kind), name,
             o->kind == DT_OBS_RET ? ": return value" : "");
  } else {
    snprintf(buf, len, "step %d", o->step);
  }
  return buf;
}

static int obs_differ(const dt_prog *p, const dt_obs *a, const dt_obs *b, char *msg, size_t len) {
  char what[160], x[48], y[48], ix[64];
  if (a->step != b->step || a->kind != b->kind || a->field != b->field || a->n != b->n) {
    snprintf(msg, len, "expected an observation of %s, got one of %s",
             obs_what(p, a, what, sizeof what), obs_what(p, b, ix, sizeof ix));
    return 1;
  }
  size_t sz = fb_type_size(a->type);
  int64_t bad = 0, first = -1;
  for (int64_t i = 0; i < a->n; i++)
    if (!elem_equal(a->type, (char *)a->data + i * (int64_t)sz,
                    (char *)b->data + i * (int64_t)sz)) {
      if (first < 0) first = i;
      bad++;
    }
  if (first < 0) return 0;
  fmt_elem(a->type, (char *)a->data + first * (int64_t)sz, x, sizeof x);
  fmt_elem(b->type, (char *)b->data + first * (int64_t)sz, y, sizeof y);
  ix[0] = 0;
  if (a->kind == DT_OBS_FINAL || (a->kind == DT_OBS_READ && a->n > 1))
    fmt_index(p->l, a->field, first, ix, sizeof ix);
  if (a->n == 1)
    snprintf(msg, len, "%s: expected %s, got %s", obs_what(p, a, what, sizeof what), x, y);
  else
    snprintf(msg, len, "%s: element %s expected %s, got %s (%lld of %lld elements differ)",
             obs_what(p, a, what, sizeof what), ix, x, y, (long long)bad, (long long)a->n);
  return 1;
}

/* Bit set of the distinct return codes a run reported (bit -rc). */
static unsigned rc_set(const dt_log *g) {
  unsigned m = 0;
  for (int i = 0; i < g->n; i++)
    if (g->v[i].kind == DT_OBS_RC && g->v[i].rc < 0 && g->v[i].rc > -32) m |= 1u << -g->v[i].rc;
  return m;
}

int dt_compare(const dt_prog *p, const dt_log *want, const dt_log *got, int rc_exact, char *msg,
               size_t len) {
  if (want->failed) {
    snprintf(msg, len, "oracle failed: %.900s", want->err);
    return 1;
  }
  if (got->failed) {
    snprintf(msg, len, "run failed: %.900s", got->err);
    return 1;
  }
  int i = 0, j = 0;
  for (;;) {
    while (i < want->n && !rc_exact && want->v[i].kind == DT_OBS_RC) i++;
    while (j < got->n && !rc_exact && got->v[j].kind == DT_OBS_RC) j++;
    if (i >= want->n || j >= got->n) break;
    const dt_obs *a = &want->v[i++], *b = &got->v[j++];
    if (a->kind == DT_OBS_RC || b->kind == DT_OBS_RC) {
      if (a->kind != b->kind || a->step != b->step || a->rc != b->rc) {
        char what[160];
        snprintf(msg, len, "%s: expected return code %s, got %s%s%.700s",
                 obs_what(p, a, what, sizeof what), a->kind == DT_OBS_RC ? fb_strerror(a->rc) : "-",
                 b->kind == DT_OBS_RC ? fb_strerror(b->rc) : "-", got->err[0] ? "; " : "",
                 got->err);
        return 1;
      }
      continue;
    }
    if (obs_differ(p, a, b, msg, len)) return 1;
  }
  if (i < want->n || j < got->n) {
    snprintf(msg, len, "observation counts differ (%d expected, %d got)", want->n, got->n);
    return 1;
  }
  if (!rc_exact && rc_set(want) != rc_set(got)) {
    snprintf(msg, len, "launch return codes differ: expected set 0x%x, got 0x%x%s%.700s",
             rc_set(want), rc_set(got), got->err[0] ? "; " : "", got->err);
    return 1;
  }
  return 0;
}

int dt_check(dt_env *env, const dt_prog *p, const dt_config *c, char *msg, size_t len) {
  dt_log want, got;
  dt_run_oracle(p, &want);
  if (want.failed) {
    snprintf(msg, len, "oracle failed: %.900s", want.err);
    dt_log_free(&want);
    return 2;
  }
  dt_run_config(env, p, c, &got);
  int rc = dt_compare(p, &want, &got, c->kind == DT_CFG_SYNC, msg, len);
  dt_log_free(&want);
  dt_log_free(&got);
  return rc;
}
