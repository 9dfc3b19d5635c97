/* The optimizer context of one session and its pass pipeline:
 *
 *   insert -> SFG window
 *   flush:  repeat until nothing changes (at most max_iterations times)
 *             activation demotion      pass_demote.c
 *             list-generation removal  pass_listgen.c
 *             dead-store elimination   pass_dse.c
 *             task fusion              pass_fuse.c    (only in an iteration
 *                                       where the three above changed nothing:
 *                                       they sharpen what fusion may merge)
 *             intra-task simplification of fused tasks  pass_simplify.c
 *           hand out the window in order; partial garbage collection
 *
 * Every pass is switchable (fb_opt_options.passes); in check mode the SFG
 * invariant checker and the IR verifier run after every pass. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "optimizer/sfg.h"

struct fb_opt {
  const fb_layout *l;
  fb_opt_options opt;
  fb_bank *bank;
  fb_sfg g;
  fb_opt_stats stats;
  fb_opt_trace_fn trace;
  void *trace_user;
  int optimized; /* the window went through the pipeline (fb_opt_optimize) */
  uint64_t inserts; /* fb_opt_insert calls, for sampling their time */
  char err[256];
};

/* fb_opt_insert times one call in INSERT_SAMPLE and counts that one for all
 * of them: a clock read costs 0.1-0.3 us on a virtual machine (measured 240 ns
 * on this project's), as much as the whole insert of a cache-hit task, and
 * two reads per task made async mode slower than sync on streams of tiny
 * tasks. optimizer_s stays an estimate of the same time; flushes are still
 * timed in full. */
enum { INSERT_SAMPLE = 16 };

typedef struct batch_impl {
  fb_opt_batch pub;
  uint64_t *args;
  fb_opt_part *parts;
  fb_irh *part_ir; /* a reference each, for the parts' names */
  int nparts;
} batch_impl;

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

#if defined(__GNUC__)
__attribute__((format(printf, 3, 4)))
#endif
static int fail(fb_opt *o, int code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(o->err, sizeof o->err, fmt, ap);
  va_end(ap);
  return code;
}

/* The loop id codegen wants: the parallel loop, or a listgen's statement
 * (listgen tasks run in parallel over their parent's list). */
static int list_loop(const fb_task_meta *m, const fb_kernel *k) {
  return m->kind == FB_TASK_LISTGEN ? k->blocks[0].ids[0] : m->loop;
}

void fb_opt_options_default(fb_opt_options *o) {
  memset(o, 0, sizeof *o);
  o->passes = FB_PASS_ALL;
  o->max_fuse_per_task = 1;
  o->max_fused_tasks = 256;
  o->max_fused_stmts = 4096;
  o->max_task_params = 0;
  o->max_iterations = 32;
  o->bank_bytes = (size_t)64 << 20;
#ifdef FB_DEBUG
  o->check = 1;
#endif
}

static void sanitize(fb_opt_options *o) {
  o->passes &= FB_PASS_ALL;
  if (o->max_fuse_per_task < 1) o->max_fuse_per_task = 1;
  if (o->max_fused_tasks < 0) o->max_fused_tasks = 0;
  if (o->max_fused_stmts < 0) o->max_fused_stmts = 0;
  if (o->max_task_params < 0) o->max_task_params = 0;
  if (o->max_iterations < 1) o->max_iterations = 1;
}

fb_opt *fb_opt_new(const fb_layout *l, const fb_opt_options *opts) {
  if (!l || !l->finalized) return NULL;
  fb_opt *o = calloc(1, sizeof *o);
  if (!o) return NULL;
  o->l = l;
  if (opts) o->opt = *opts;
  else fb_opt_options_default(&o->opt);
  sanitize(&o->opt);
  o->bank = fb_bank_new(l, o->opt.bank_bytes);
  if (!o->bank || fb_sfg_init(&o->g, l)) {
    fb_bank_free(o->bank);
    free(o);
    return NULL;
  }
  return o;
}

void fb_opt_free(fb_opt *o) {
  if (!o) return;
  fb_sfg_fini(&o->g, o->bank);
  fb_bank_free(o->bank);
  free(o);
}

void fb_opt_set_options(fb_opt *o, const fb_opt_options *opts) {
  o->opt = *opts;
  sanitize(&o->opt);
  fb_bank_set_limit(o->bank, o->opt.bank_bytes);
}

const fb_opt_options *fb_opt_get_options(const fb_opt *o) { return &o->opt; }
const char *fb_opt_errmsg(const fb_opt *o) { return o ? o->err : ""; }

/* ---------------------------------------------------------------- bank */

int fb_opt_intern(fb_opt *o, const fb_kernel *k, fb_irh *out) {
  o->err[0] = 0;
  if (!k || !out) return fail(o, FB_EINVAL, "fb_opt_intern: no kernel");
  int rc = fb_bank_intern(o->bank, k, out, o->err, sizeof o->err);
  if (rc) return rc;
  char err[200] = "";
  if (!fb_bank_meta(o->bank, *out)) {
    fb_task_meta *m = NULL;
    rc = fb_meta_compute(fb_bank_ir(o->bank, *out), &m, err, sizeof err);
    fb_meta_free(m);
    fb_bank_unref(o->bank, *out);
    *out = FB_IRH_NONE;
    return fail(o, rc ? rc : FB_ENOMEM, "%s", err[0] ? err : "task metadata: out of memory");
  }
  return 0;
}

void fb_opt_retain(fb_opt *o, fb_irh h) { fb_bank_ref(o->bank, h); }
void fb_opt_release(fb_opt *o, fb_irh h) { fb_bank_unref(o->bank, h); }
const fb_kernel *fb_opt_ir(const fb_opt *o, fb_irh h) { return fb_bank_ir(o->bank, h); }

int fb_opt_ir_info(fb_opt *o, fb_irh h, fb_task_kind *kind, int *loop, int *snode) {
  const fb_task_meta *m = fb_bank_meta(o->bank, h);
  if (!m) return fail(o, FB_EINVAL, "no IR with handle %d", (int)h);
  if (kind) *kind = m->kind;
  if (loop) *loop = list_loop(m, fb_bank_ir(o->bank, h));
  if (snode) *snode = m->snode;
  return 0;
}

/* ---------------------------------------------------------------- window */

static fb_sfg_node *new_node(fb_opt *o) {
  fb_sfg_node *n = calloc(1, sizeof *n);
  if (!n) return NULL;
  n->serial = o->g.next_serial++;
  n->ir = n->orig = FB_IRH_NONE;
  n->ntasks = 1;
  return n;
}

static int has_pure_activation(const fb_task_meta *m) {
  for (int i = 0; i < m->nact; i++)
    if (m->act_kind[i] == FB_ACT_PURE) return 1;
  return 0;
}

int fb_opt_insert(fb_opt *o, const fb_opt_task *t) {
  int timed = o->inserts++ % INSERT_SAMPLE == 0;
  double t0 = timed ? now_s() : 0;
  o->err[0] = 0;
  const fb_kernel *k = t ? fb_bank_ir(o->bank, t->ir) : NULL;
  if (!k) return fail(o, FB_EINVAL, "fb_opt_insert: no IR with that handle");
  const fb_task_meta *m = fb_bank_meta(o->bank, t->ir);
  if (!m) return fail(o, FB_ENOMEM, "task metadata: out of memory");
  if (t->nargs != k->nparams || (t->nargs && !t->args))
    return fail(o, FB_ETYPE, "task %s takes %d arguments, got %d", k->name, k->nparams, t->nargs);
  fb_sfg_node *n = new_node(o);
  if (!n) return fail(o, FB_ENOMEM, "SFG: out of memory");
  n->m = m;
  n->nargs = t->nargs;
  n->launch = t->launch;
  n->args = malloc(sizeof *n->args * (size_t)(t->nargs ? t->nargs : 1));
  int rc = n->args ? 0 : FB_ENOMEM;
  if (!rc && t->nargs) memcpy(n->args, t->args, sizeof *n->args * (size_t)t->nargs);
  if (!rc && has_pure_activation(m) && !(n->certs = malloc(sizeof *n->certs))) rc = FB_ENOMEM;
  if (!rc && !(n->parts = malloc(sizeof *n->parts))) rc = FB_ENOMEM;
  if (!rc) rc = fb_sfg_node_resolve(n, k);
  if (!rc) {
    fb_bank_ref(o->bank, t->ir);
    fb_bank_ref(o->bank, t->ir);
    n->ir = n->orig = t->ir;
    fb_bank_ref(o->bank, t->ir); /* the part's */
    n->parts[n->nparts++] = (fb_sfg_part){t->ir, t->launch, 0, t->nargs, 0};
    if (n->certs) { /* the certificate holds its own reference */
      fb_bank_ref(o->bank, t->ir);
      n->certs[n->ncerts++] = (fb_sfg_cert){t->ir, 0, t->nargs};
    }
    rc = fb_sfg_append(&o->g, n);
    if (!rc) n->parts[0].inb = (uint8_t)n->all_inb; /* resolved by the append */
  }
  if (rc) {
    fb_sfg_node_free(n, o->bank);
    return fail(o, rc, "SFG: out of memory");
  }
  o->stats.total.tasks_in++;
  if (o->optimized) o->stats.flush.tasks_in++;
  if (timed) o->stats.total.optimizer_s += (now_s() - t0) * INSERT_SAMPLE;
  return 0;
}

int fb_opt_pending(const fb_opt *o) { return o->g.n - o->g.nret; }

int fb_opt_host_write(fb_opt *o, int snode) {
  if (fb_opt_pending(o)) return fail(o, FB_EINVAL, "host write with tasks pending: flush first");
  if (snode <= 0 || snode >= o->l->nnodes) return fail(o, FB_EINVAL, "no SNode %d", snode);
  fb_task_meta *m = NULL;
  char err[160];
  int rc = fb_meta_host(o->l, snode, &m, err, sizeof err);
  if (rc) return fail(o, rc, "%s", err);
  fb_sfg_node *n = new_node(o);
  if (!n) {
    fb_meta_free(m);
    return fail(o, FB_ENOMEM, "SFG: out of memory");
  }
  n->host = 1;
  n->m = m;
  rc = fb_sfg_node_resolve(n, NULL);
  if (!rc) rc = fb_sfg_append(&o->g, n);
  else fb_sfg_node_free(n, o->bank);
  if (!rc) rc = fb_sfg_collect(&o->g, o->bank);
  return rc ? fail(o, rc, "SFG: out of memory") : 0;
}

/* ---------------------------------------------------------------- pipeline */

typedef int (*pass_fn)(fb_pass_ctx *c);

static void trace(fb_opt *o, int it, const char *pass, const char *when) {
  if (!o->trace) return;
  char title[128];
  snprintf(title, sizeof title, "%s (iteration %d, %s)", pass, it, when);
  char *dot = fb_sfg_dot(&o->g, o->bank, title);
  if (dot) o->trace(o->trace_user, it, pass, when, dot);
  free(dot);
}

/* In check mode: the SFG invariants and every window task's IR. */
static int check_after(fb_opt *o, const char *pass) {
  char err[200];
  if (fb_sfg_check(&o->g, o->bank, err, sizeof err))
    return fail(o, FB_EINTERNAL, "after %s: SFG invariant broken: %s", pass, err);
  for (int i = o->g.nret; i < o->g.n; i++) {
    fb_diags d;
    fb_diags_init(&d);
    const fb_kernel *k = fb_bank_ir(o->bank, o->g.nodes[i]->ir);
    int rc = fb_verify(k, &d);
    if (rc)
      fail(o, FB_EINTERNAL, "after %s: task %s fails verification: %s", pass, k->name,
           d.n ? d.v[0].msg : "?");
    fb_diags_free(&d);
    if (rc) return FB_EINTERNAL;
  }
  return 0;
}

static int run_pass(fb_opt *o, fb_pass_ctx *c, int it, const char *name, pass_fn fn) {
  trace(o, it, name, "before");
  int rc = fn(c);
  if (rc < 0) return c->err[0] ? fail(o, rc, "%s: %s", name, c->err) : fail(o, rc, "%s failed", name);
  trace(o, it, name, "after");
  if (o->opt.check && rc > 0) {
    int crc = check_after(o, name);
    if (crc) return crc;
  }
  return rc;
}

/* The pass pipeline, to a fixed point. */
static int pipeline(fb_opt *o, fb_opt_counters *cnt) {
  char err[200] = "";
  fb_pass_ctx c = {&o->g, o->bank, &o->opt, cnt, err, sizeof err};
  unsigned p = o->opt.passes;
  for (int it = 0; it < o->opt.max_iterations; it++) {
    int sparse = 0, changed = 0, rc = 0;
    cnt->iterations++;
    if ((p & FB_PASS_DEMOTE) && (rc = run_pass(o, &c, it, "demote", fb_pass_demote)) < 0) return rc;
    sparse += rc;
    if ((p & FB_PASS_LISTGEN) && (rc = run_pass(o, &c, it, "listgen", fb_pass_listgen)) < 0) return rc;
    sparse += (p & FB_PASS_LISTGEN) ? rc : 0;
    if ((p & FB_PASS_DSE) && (rc = run_pass(o, &c, it, "dse", fb_pass_dse)) < 0) return rc;
    sparse += (p & FB_PASS_DSE) ? rc : 0;
    changed = sparse;
    if ((p & FB_PASS_FUSE) && !sparse) {
      if ((rc = run_pass(o, &c, it, "fuse", fb_pass_fuse)) < 0) return rc;
      changed += rc;
    }
    if (p & FB_PASS_SIMPLIFY) {
      if ((rc = run_pass(o, &c, it, "simplify", fb_pass_simplify)) < 0) return rc;
      changed += rc;
    }
    if (!changed) break;
  }
  return 0;
}

/* ---------------------------------------------------------------- memo */

fb_irh fb_pass_memo_get(fb_pass_ctx *c, const int64_t *key, int n) {
  fb_irh h = fb_bank_memo_get(c->bank, key, n);
  if (h != FB_IRH_NONE) c->cnt->memo_hits++;
  return h;
}

int fb_pass_memo_put(fb_pass_ctx *c, const int64_t *key, int n, fb_kernel *k, fb_irh *out) {
  *out = FB_IRH_NONE;
  if (!k) {
    fb_errf(c->err, c->errlen, "out of memory building task IR");
    return FB_ENOMEM;
  }
  if (c->opt->check) {
    fb_diags d;
    fb_diags_init(&d);
    int rc = fb_verify(k, &d);
    if (rc) {
      char *text = fb_kernel_print(k);
      fb_errf(c->err, c->errlen, "made IR that fails verification (%s): %s\n%s",
               d.n ? d.v[0].msg : "?", k->name, text ? text : "");
      free(text);
      fb_diags_free(&d);
      fb_kernel_free(k);
      return FB_EINTERNAL;
    }
    fb_diags_free(&d);
  }
  int rc = fb_bank_adopt(c->bank, k, out, c->err, c->errlen);
  if (!rc && !fb_bank_meta(c->bank, *out)) rc = FB_ENOMEM;
  if (!rc) rc = fb_bank_memo_put(c->bank, key, n, *out);
  if (rc) {
    fb_bank_unref(c->bank, *out);
    *out = FB_IRH_NONE;
    if (!c->err[0]) fb_errf(c->err, c->errlen, "out of memory banking task IR");
    return rc;
  }
  c->cnt->memo_misses++;
  return 0;
}

/* ---------------------------------------------------------------- flush */

static int make_batch(fb_opt *o, fb_opt_batch **out) {
  int n = o->g.n - o->g.nret, nargs = 0, nparts = 0;
  for (int i = o->g.nret; i < o->g.n; i++) {
    nargs += o->g.nodes[i]->nargs;
    nparts += o->g.nodes[i]->nparts;
  }
  batch_impl *b = calloc(1, sizeof *b);
  if (!b) return FB_ENOMEM;
  b->pub.v = calloc((size_t)(n ? n : 1), sizeof *b->pub.v);
  b->args = malloc(sizeof *b->args * (size_t)(nargs ? nargs : 1));
  b->parts = malloc(sizeof *b->parts * (size_t)(nparts ? nparts : 1));
  b->part_ir = malloc(sizeof *b->part_ir * (size_t)(nparts ? nparts : 1));
  if (!b->pub.v || !b->args || !b->parts || !b->part_ir) {
    free(b->pub.v);
    free(b->args);
    free(b->parts);
    free(b->part_ir);
    free(b);
    return FB_ENOMEM;
  }
  uint64_t *ap = b->args;
  for (int i = o->g.nret; i < o->g.n; i++) {
    const fb_sfg_node *x = o->g.nodes[i];
    fb_opt_launch *L = &b->pub.v[b->pub.n++];
    fb_bank_ref(o->bank, x->ir);
    L->ir = x->ir;
    L->k = fb_bank_ir(o->bank, x->ir);
    L->kind = x->m->kind;
    L->loop = list_loop(x->m, L->k);
    L->snode = x->m->snode;
    L->args = ap;
    L->nargs = x->nargs;
    memcpy(ap, x->args, sizeof *ap * (size_t)x->nargs);
    ap += x->nargs;
    L->launch = x->launch;
    L->ntasks = x->ntasks;
    L->parts = b->parts + b->nparts;
    L->nparts = x->nparts;
    for (int p = 0; p < x->nparts; p++) {
      const fb_sfg_part *xp = &x->parts[p];
      fb_bank_ref(o->bank, xp->orig);
      b->part_ir[b->nparts] = xp->orig;
      const fb_kernel *pk = fb_bank_ir(o->bank, xp->orig);
      const fb_task_meta *pm = fb_bank_meta(o->bank, xp->orig);
      b->parts[b->nparts++] = (fb_opt_part){xp->launch, pk->name, xp->argoff, xp->nargs, xp->inb,
                                            xp->orig, pm ? pk : NULL, pm ? pm->kind : x->m->kind,
                                            pm ? list_loop(pm, pk) : -1, pm ? pm->snode : -1};
    }
  }
  *out = &b->pub;
  return 0;
}

void fb_opt_batch_free(fb_opt *o, fb_opt_batch *pub) {
  if (!pub) return;
  batch_impl *b = (batch_impl *)pub;
  for (int i = 0; i < pub->n; i++) fb_bank_unref(o->bank, pub->v[i].ir);
  for (int i = 0; i < b->nparts; i++) fb_bank_unref(o->bank, b->part_ir[i]);
  free(pub->v);
  free(b->args);
  free(b->parts);
  free(b->part_ir);
  free(b);
}

static void add_counters(fb_opt_counters *t, const fb_opt_counters *f) {
  t->flushes += f->flushes;
  t->tasks_out += f->tasks_out;
  t->listgen_removed += f->listgen_removed;
  t->demoted += f->demoted;
  t->dead_stores += f->dead_stores;
  t->tasks_deleted += f->tasks_deleted;
  t->tasks_fused += f->tasks_fused;
  t->fuse_refused += f->fuse_refused;
  t->simplified += f->simplified;
  t->iterations += f->iterations;
  t->memo_hits += f->memo_hits;
  t->memo_misses += f->memo_misses;
  t->optimizer_s += f->optimizer_s;
}

/* Counters of the flush in progress: reset when a window starts
 * optimizing (fb_opt_optimize or fb_opt_flush, whichever comes first). */
static fb_opt_counters *flush_counters(fb_opt *o) {
  fb_opt_counters *cnt = &o->stats.flush;
  if (!o->optimized) {
    memset(cnt, 0, sizeof *cnt);
    cnt->flushes = 1;
    cnt->tasks_in = (uint64_t)fb_opt_pending(o);
  }
  return cnt;
}

int fb_opt_optimize(fb_opt *o) {
  double t0 = now_s();
  o->err[0] = 0;
  fb_opt_counters *cnt = flush_counters(o);
  o->optimized = 1;
  int rc = fb_opt_pending(o) ? pipeline(o, cnt) : 0;
  if (!rc && o->opt.check && fb_opt_pending(o)) rc = check_after(o, "the pipeline");
  cnt->optimizer_s += now_s() - t0;
  return rc;
}

int fb_opt_flush(fb_opt *o, fb_opt_batch **out) {
  *out = NULL;
  if (!fb_opt_pending(o)) return 0;
  int rc = fb_opt_optimize(o);
  double t0 = now_s();
  fb_opt_counters *cnt = &o->stats.flush;
  if (!rc) rc = make_batch(o, out);
  if (!rc) {
    cnt->tasks_out = (uint64_t)(*out)->n;
    rc = fb_sfg_collect(&o->g, o->bank);
  }
  if (rc) {
    /* the window stays pending: the engine reports the error */
    fb_opt_batch_free(o, *out);
    *out = NULL;
    if (!o->err[0]) fail(o, rc, "flush: %s", fb_strerror(rc));
    return rc;
  }
  o->optimized = 0;
  cnt->optimizer_s += now_s() - t0;
  add_counters(&o->stats.total, cnt);
  return 0;
}

/* ---------------------------------------------------------------- observability */

const fb_opt_stats *fb_opt_get_stats(fb_opt *o) {
  fb_bank_stats(o->bank, &o->stats.bank_entries, &o->stats.bank_bytes, &o->stats.bank_evictions);
  return &o->stats;
}

char *fb_opt_dot(const fb_opt *o, const char *title) { return fb_sfg_dot(&o->g, o->bank, title); }
char *fb_opt_graph_text(const fb_opt *o) { return fb_sfg_text(&o->g, o->bank); }

void fb_opt_set_trace(fb_opt *o, fb_opt_trace_fn fn, void *user) {
  o->trace = fn;
  o->trace_user = user;
}

int fb_opt_check(fb_opt *o, char *err, size_t errlen) {
  return fb_sfg_check(&o->g, o->bank, err, errlen);
}

fb_sfg *fb_opt_graph(fb_opt *o) { return &o->g; }
fb_bank *fb_opt_bank(fb_opt *o) { return o->bank; }
