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

#include "base/base.h"
#include "optimizer/sfg.h"

/* How a message starts that only an internal bug can produce: it alone may
 * name internal tasks or IR values, and it says what to report. */
#define FB_BUG "internal error (please report it, with the program): "

/* A logged insert (the plan memo's window, see fb_opt_flush). */
typedef struct wlog_ent {
  fb_irh ir;       /* one reference while logged */
  int nargs;
  size_t argoff;   /* into the log's argument array */
  uint64_t launch; /* as inserted (in a plan: relative to the window's first) */
  int index;       /* fb_opt_part.index */
} wlog_ent;

typedef struct batch_impl batch_impl;

/* A flush remembered: its window, the canonical graph it was optimized in
 * (and left), its batch with launch numbers relative to the window's first,
 * which retained nodes it left were its own tasks (and their relative
 * launch), and its counters. */
typedef struct plan {
  uint64_t key;
  wlog_ent *win;
  int nwin;
  uint64_t *wargs;
  size_t nwargs;
  int64_t *canon;
  int ncanon;
  batch_impl *tmpl;
  uint8_t *ret_new;
  uint64_t *ret_launch;
  int nret;
  uint32_t *clears; /* mask states its window's tasks clear cells of */
  int nclears;
  fb_opt_counters cnt;
  uint64_t used;
} plan;

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
  /* the last insert's launch number and its index in that launch
   * (fb_opt_part.index); last_index -1 before the first insert */
  uint64_t last_launch;
  int last_index;
  /* the insert log: the window's launches not yet built into the graph */
  wlog_ent *log;
  int nlog, caplog, built;  /* built: log entries already in the graph */
  uint64_t *largs;
  size_t nlargs, caplargs;
  uint64_t lhash;           /* of the log, launches relative to the first */
  /* canonical form of the graph as the last flush (or host write) left it */
  int64_t *canon;
  int ncanon;
  uint64_t canon_hash;
  plan **plans;
  int nplans;
  uint64_t plan_clock;
  char err[256];
};

/* fb_opt_insert times one call in INSERT_SAMPLE and counts that one for all
 * of them: a clock read costs 0.1-0.3 us on a virtual machine (measured 240 ns
 * on this project's), as much as the whole insert of a cache-hit task, and
 * two reads per task made async mode slower than sync on streams of tiny
 * tasks. optimizer_s stays an estimate of the same time; flushes are still
 * timed in full. */
enum {
  INSERT_SAMPLE = 16
};

struct batch_impl {
  fb_opt_batch pub;
  uint64_t *args;
  int nargs;
  fb_opt_part *parts;
  fb_irh *part_ir; /* a reference each, for the parts' names */
  int nparts;
};

static void plans_clear(fb_opt *o);
static int canon_update(fb_opt *o);

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

#if defined(__GNUC__)
__attribute__((format(printf, 3, 4)))
#endif
static int
fail(fb_opt *o, int code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fb_verrf(o->err, sizeof o->err, fmt, ap);
  va_end(ap);
  return code;
}

/* The task writes a node allocator's state: it may take blocks from the
 * pool (conservative: a deactivation or gc writes it too). */
static int takes_blocks(const fb_task_meta *m) {
  for (int i = 0; i < m->nacc; i++)
    if (FB_SKEY_KIND(m->acc[i].key) == FB_SK_ALLOC && (m->acc[i].mode & FB_ACC_WRITE)) return 1;
  return 0;
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
  o->max_fused_tasks = FB_MAX_FUSED_TASKS;
  o->max_fused_stmts = 4096;
  o->max_task_params = 0;
  o->max_iterations = 32;
  o->bank_bytes = (size_t)64 << 20;
  o->plan_memo = 1;
  o->plan_memo_max = 64;
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
  if (o->plan_memo_max < 1) o->plan_memo = 0;
}

fb_opt *fb_opt_new(const fb_layout *l, const fb_opt_options *opts) {
  if (!l || !l->finalized) return NULL;
  fb_opt *o = calloc(1, sizeof *o);
  if (!o) return NULL;
  o->l = l;
  o->last_index = -1;
  if (opts) o->opt = *opts;
  else fb_opt_options_default(&o->opt);
  sanitize(&o->opt);
  o->bank = fb_bank_new(l, o->opt.bank_bytes);
  if (!o->bank || fb_sfg_init(&o->g, l) || canon_update(o)) {
    fb_sfg_fini(&o->g, o->bank);
    fb_bank_free(o->bank);
    free(o->canon);
    free(o);
    return NULL;
  }
  return o;
}

static void log_clear(fb_opt *o) {
  for (int i = o->built; i < o->nlog; i++) fb_bank_unref(o->bank, o->log[i].ir);
  o->nlog = o->built = 0;
  o->nlargs = 0;
  o->lhash = 0;
}

void fb_opt_free(fb_opt *o) {
  if (!o) return;
  log_clear(o);
  free(o->log);
  free(o->largs);
  plans_clear(o);
  free(o->plans);
  free(o->canon);
  fb_sfg_fini(&o->g, o->bank);
  fb_bank_free(o->bank);
  free(o);
}

void fb_opt_set_options(fb_opt *o, const fb_opt_options *opts) {
  plans_clear(o); /* a plan holds what the old options made */
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
size_t fb_opt_ir_bytes(const fb_opt *o, fb_irh h) { return fb_bank_bytes(o->bank, h); }

int fb_opt_ir_info(fb_opt *o, fb_irh h, fb_task_kind *kind, int *loop, int *snode) {
  const fb_task_meta *m = fb_bank_meta(o->bank, h);
  if (!m) return fail(o, FB_EINVAL, "no IR with handle %d", (int)h);
  if (kind) *kind = m->kind;
  if (loop) *loop = list_loop(m, fb_bank_ir(o->bank, h));
  if (snode) *snode = m->snode;
  return 0;
}

int fb_opt_rerun_free(fb_opt *o, const fb_irh *h, int n) {
  const unsigned bad = FB_TF_RAND | FB_TF_RET | FB_TF_DEACT | FB_TF_WHILE;
  for (int t = 0; t < n; t++) {
    const fb_task_meta *m = fb_bank_meta(o->bank, h[t]);
    if (!m || (m->tflags & bad) || !(m->tflags & FB_TF_INB)) return 0;
  }
  /* no state read by one task and written by any (itself included) */
  for (int t = 0; t < n; t++) {
    const fb_task_meta *m = fb_bank_meta(o->bank, h[t]);
    for (int i = 0; i < m->nacc; i++) {
      if (!(m->acc[i].mode & FB_ACC_READ)) continue;
      for (int u = 0; u < n; u++) {
        const fb_meta_acc *w = fb_meta_find(fb_bank_meta(o->bank, h[u]), m->acc[i].key);
        if (w && (w->mode & FB_ACC_WRITE)) return 0;
      }
    }
  }
  return 1;
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

/* Build one launch into the window's graph (k, m: its IR and metadata). */
static int insert_node(fb_opt *o, fb_irh ir, const fb_kernel *k, const fb_task_meta *m,
                       const uint64_t *args, int nargs, uint64_t launch, int index) {
  fb_sfg_node *n = new_node(o);
  if (!n) return fail(o, FB_ENOMEM, "SFG: out of memory");
  n->m = m;
  n->nargs = nargs;
  n->launch = launch;
  n->args = malloc(sizeof *n->args * (size_t)(nargs ? nargs : 1));
  int rc = n->args ? 0 : FB_ENOMEM;
  if (!rc && nargs) memcpy(n->args, args, sizeof *n->args * (size_t)nargs);
  if (!rc && has_pure_activation(m) && !(n->certs = malloc(sizeof *n->certs))) rc = FB_ENOMEM;
  if (!rc && !(n->parts = malloc(sizeof *n->parts))) rc = FB_ENOMEM;
  if (!rc) rc = fb_sfg_node_resolve(n, k);
  if (!rc) {
    fb_bank_ref(o->bank, ir);
    fb_bank_ref(o->bank, ir);
    n->ir = n->orig = ir;
    fb_bank_ref(o->bank, ir); /* the part's */
    n->parts[n->nparts++] = (fb_sfg_part){ir, launch, 0, nargs, 0, index};
    if (n->certs) { /* the certificate holds its own reference */
      fb_bank_ref(o->bank, ir);
      n->certs[n->ncerts++] = (fb_sfg_cert){ir, 0, nargs};
    }
    rc = fb_sfg_append(&o->g, n);
    if (!rc) n->parts[0].inb = (uint8_t)n->all_inb; /* resolved by the append */
  }
  if (rc) {
    fb_sfg_node_free(n, o->bank);
    return fail(o, rc, "SFG: out of memory");
  }
  return 0;
}

/* Build the logged launches into the graph, in order. On failure the ones
 * not built stay logged (and pending). */
static int materialize(fb_opt *o) {
  while (o->built < o->nlog) {
    const wlog_ent *e = &o->log[o->built];
    const fb_kernel *k = fb_bank_ir(o->bank, e->ir);
    const fb_task_meta *m = fb_bank_meta(o->bank, e->ir);
    if (!k || !m) return fail(o, FB_ENOMEM, "task metadata: out of memory");
    const uint64_t *args = e->nargs ? o->largs + e->argoff : NULL; /* largs: NULL until one */
    int rc = insert_node(o, e->ir, k, m, args, e->nargs, e->launch, e->index);
    if (rc) return rc;
    fb_bank_unref(o->bank, e->ir); /* the log's reference */
    o->built++;
  }
  return 0;
}

static uint64_t mix(uint64_t h, uint64_t x) { return fb__hcombine(h, x); }

/* Log a launch for the next flush (the plan memo's window). */
static int log_insert(fb_opt *o, const fb_opt_task *t, int index) {
  if (o->nlog == o->caplog) {
    int nc = o->caplog ? o->caplog * 2 : 64;
    wlog_ent *v = realloc(o->log, sizeof *v * (size_t)nc);
    if (!v) return fail(o, FB_ENOMEM, "SFG: out of memory");
    o->log = v;
    o->caplog = nc;
  }
  if (o->nlargs + (size_t)t->nargs > o->caplargs) {
    size_t nc = o->caplargs ? o->caplargs * 2 : 256;
    while (nc < o->nlargs + (size_t)t->nargs) nc *= 2;
    uint64_t *v = realloc(o->largs, sizeof *v * nc);
    if (!v) return fail(o, FB_ENOMEM, "SFG: out of memory");
    o->largs = v;
    o->caplargs = nc;
  }
  if (t->nargs) memcpy(o->largs + o->nlargs, t->args, sizeof *t->args * (size_t)t->nargs);
  fb_bank_ref(o->bank, t->ir);
  o->log[o->nlog] = (wlog_ent){t->ir, t->nargs, o->nlargs, t->launch, index};
  uint64_t h = mix(mix(o->lhash, (uint64_t)(uint32_t)t->ir), t->launch - o->log[0].launch);
  for (int i = 0; i < t->nargs; i++) h = mix(h, t->args[i]);
  o->lhash = h;
  o->nlog++;
  o->nlargs += (size_t)t->nargs;
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
    return fail(o, FB_ETYPE, FB_BUG "task IR %s takes %d arguments, got %d", k->name, k->nparams,
                t->nargs);
  /* logged while the window may still turn out to be a known one: nothing
   * of it is in the graph yet */
  int logged = o->built < o->nlog || (o->opt.plan_memo && !o->optimized && o->g.n == o->g.nret);
  /* its index in its launch: a launch's tasks are inserted one after the
     other, so the index follows from the launch numbers, and equal windows
     (the plan memo's) have equal indices */
  int index = o->last_index >= 0 && t->launch == o->last_launch ? o->last_index + 1 : 0;
  int rc = logged ? log_insert(o, t, index)
                  : insert_node(o, t->ir, k, m, t->args, t->nargs, t->launch, index);
  if (rc) return rc;
  o->last_launch = t->launch;
  o->last_index = index;
  o->stats.total.tasks_in++;
  if (o->optimized) o->stats.flush.tasks_in++;
  if (timed) o->stats.total.optimizer_s += (now_s() - t0) * INSERT_SAMPLE;
  return 0;
}

int fb_opt_pending(const fb_opt *o) { return o->g.n - o->g.nret + o->nlog - o->built; }

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
  if (!rc) rc = canon_update(o);
  return rc ? fail(o, rc, "SFG: out of memory") : 0;
}

int fb_opt_observe_mask(fb_opt *o, int snode, uint64_t count) {
  if (fb_opt_pending(o))
    return fail(o, FB_EINVAL, "mask observation with tasks pending: flush first");
  if (snode <= 0 || snode >= o->l->nnodes) return fail(o, FB_EINVAL, "no SNode %d", snode);
  int nst = o->g.nst, sid = fb_sfg_state_id(&o->g, FB_SKEY(FB_SK_MASK, snode));
  if (sid < 0) return fail(o, FB_ENOMEM, "SFG: out of memory");
  fb_sfg_state *s = &o->g.st[sid];
  int changed = nst != o->g.nst;
  if (s->obs_valid && s->obs_count == count && !s->cleared) {
    /* nothing took effect since the last observation: the mask is what it
       was then, whatever (activating) writes its versions stand for */
    if (s->base_cont != s->obs_cont) {
      s->base_cont = s->owner_cont = s->obs_cont;
      o->stats.total.masks_unchanged++;
      changed = 1;
    }
  } else {
    /* the mask changed since the last observation (or this is the first):
       every change went through a writer the graph holds (a task, a host
       write), so its current content is the current version's, which keeps
       its content id (a list made from it after its last writer is still
       current); the next observation compares against this one */
    s->obs_cont = s->owner_cont;
    s->obs_count = count;
    s->obs_valid = 1;
  }
  s->cleared = 0;
  if (changed && canon_update(o)) o->ncanon = -1; /* no plan matches until the next flush */
  return 0;
}

int fb_opt_forget(fb_opt *o) {
  if (o->optimized)
    return fail(o, FB_EINVAL, "forgetting earlier flushes after the window was optimized");
  plans_clear(o);
  o->ncanon = -1; /* no plan matches until the next flush */
  o->stats.total.forgets++;
  int rc = fb_sfg_forget(&o->g, o->bank);
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
    return fail(o, FB_EINTERNAL, FB_BUG "after %s: SFG invariant broken: %s", pass, err);
  for (int i = o->g.nret; i < o->g.n; i++) {
    fb_diags d;
    fb_diags_init(&d);
    const fb_kernel *k = fb_bank_ir(o->bank, o->g.nodes[i]->ir);
    int rc = fb_verify(k, &d);
    if (rc)
      fail(o, FB_EINTERNAL, FB_BUG "after %s: task IR %s fails verification: %s", pass, k->name,
           d.n ? d.v[0].msg : "?");
    fb_diags_free(&d);
    if (rc) return FB_EINTERNAL;
  }
  return 0;
}

static int run_pass(fb_opt *o, fb_pass_ctx *c, int it, const char *name, pass_fn fn) {
  trace(o, it, name, "before");
  int rc = fn(c);
  if (rc < 0)
    return c->err[0] ? fail(o, rc, "%s: %s", name, c->err) : fail(o, rc, "%s failed", name);
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
    if ((p & FB_PASS_LISTGEN) && (rc = run_pass(o, &c, it, "listgen", fb_pass_listgen)) < 0)
      return rc;
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
  b->nargs = nargs;
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
    L->standin = x->nparts == 1 && !x->reshaped && x->parts[0].orig != x->ir ? x->parts[0].orig
                                                                             : FB_IRH_NONE;
    L->standin_same = L->standin != FB_IRH_NONE && !x->demoted;
    for (int p = 0; p < x->nparts; p++) {
      const fb_sfg_part *xp = &x->parts[p];
      fb_bank_ref(o->bank, xp->orig);
      b->part_ir[b->nparts] = xp->orig;
      const fb_kernel *pk = fb_bank_ir(o->bank, xp->orig);
      const fb_task_meta *pm = fb_bank_meta(o->bank, xp->orig);
      b->parts[b->nparts++] = (fb_opt_part){xp->launch,
                                            xp->index,
                                            pk->name,
                                            xp->argoff,
                                            xp->nargs,
                                            xp->inb,
                                            xp->orig,
                                            pm ? pk : NULL,
                                            pm ? pm->kind : x->m->kind,
                                            pm ? list_loop(pm, pk) : -1,
                                            pm ? pm->snode : -1,
                                            !pm || takes_blocks(pm)};
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
  t->clears_removed += f->clears_removed;
  t->demoted += f->demoted;
  t->dead_stores += f->dead_stores;
  t->tasks_deleted += f->tasks_deleted;
  t->tasks_fused += f->tasks_fused;
  t->fuse_refused += f->fuse_refused;
  t->fuse_same_shape += f->fuse_same_shape;
  t->fuse_pairs += f->fuse_pairs;
  t->simplified += f->simplified;
  t->iterations += f->iterations;
  t->memo_hits += f->memo_hits;
  t->memo_misses += f->memo_misses;
  t->plans_reused += f->plans_reused;
  t->plans_stored += f->plans_stored;
  t->retained_proofs += f->retained_proofs;
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
  int rc = materialize(o);
  if (rc) return rc;
  fb_opt_counters *cnt = flush_counters(o);
  o->optimized = 1;
  rc = fb_opt_pending(o) ? pipeline(o, cnt) : 0;
  if (!rc && o->opt.check && fb_opt_pending(o)) rc = check_after(o, "the pipeline");
  cnt->optimizer_s += now_s() - t0;
  return rc;
}

/* ---------------------------------------------------------------- the plan memo */

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

static int64_t rank_of(const uint64_t *v, size_t n, uint64_t x) {
  size_t lo = 0, hi = n;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if (v[mid] < x) lo = mid + 1;
    else hi = mid;
  }
  return (int64_t)lo;
}

typedef struct ivec {
  int64_t *v;
  int n, cap, oom;
} ivec;

static void iv_push(ivec *x, int64_t val) {
  if (x->oom) return;
  if (x->n == x->cap) {
    int nc = x->cap ? x->cap * 2 : 256;
    int64_t *p = realloc(x->v, sizeof *p * (size_t)nc);
    if (!p) {
      x->oom = 1;
      return;
    }
    x->v = p;
    x->cap = nc;
  }
  x->v[x->n++] = val;
}

/* The nodes and state bases of the graph between flushes: as it is
 * (post = 0: no window), or as fb_sfg_collect will leave it after this
 * flush (post = 1: the nodes fb_sfg_mark_kept marks, in order). nodes gets
 * the kept nodes, keep (g->n) each one's index among them. */
static int canon_nodes(const fb_sfg *g, int post, const fb_sfg_node ***nodes, int *nn, int **keep) {
  *nodes = malloc(sizeof **nodes * (size_t)(g->n ? g->n : 1));
  *keep = malloc(sizeof **keep * (size_t)(g->n ? g->n : 1));
  if (!*nodes || !*keep) return FB_ENOMEM;
  if (post) { /* what fb_sfg_collect keeps */
    fb_sfg_mark_kept(g, *keep);
    for (int i = 0; i < g->n; i++) (*keep)[i] = (*keep)[i] ? 0 : -1;
  } else {
    for (int i = 0; i < g->n; i++) (*keep)[i] = i;
  }
  int n = 0;
  for (int i = 0; i < g->n; i++)
    if ((*keep)[i] >= 0) {
      (*keep)[i] = n;
      (*nodes)[n++] = g->nodes[i];
    }
  *nn = n;
  return 0;
}

static void state_base(const fb_sfg_state *st, int post, const int *keep, int64_t *owner,
                       uint64_t *ver, uint64_t *order) {
  *owner = post ? (st->owner >= 0 ? keep[st->owner] : -1) : st->base_owner;
  *ver = post ? st->owner_ver : st->base_ver;
  *order = post ? st->owner_order : st->base_order;
}

/* Sorted distinct serials and order stamps the graph between flushes
 * mentions. */
static int canon_values(const fb_sfg *g, int post, const int *keep, const fb_sfg_node **nodes,
                        int nn, uint64_t **sv, size_t *ns, uint64_t **ov, size_t *no) {
  size_t cap = 3 * (size_t)g->nst + 3;
  for (int i = 0; i < nn; i++) cap += 2 + 3 * (size_t)nodes[i]->m->nacc;
  uint64_t *s = malloc(sizeof *s * cap), *o = malloc(sizeof *o * cap);
  if (!s || !o) {
    free(s);
    free(o);
    return FB_ENOMEM;
  }
  size_t a = 0, b = 0;
  /* version 0 (the state as the session began) always ranks 0: a pass
   * compares it with 0 itself (an empty list, pass_listgen.c), so it must
   * not share a rank with the serial of a task fb_opt_forget dropped */
  s[a++] = 0;
  for (int i = 0; i < g->nst; i++) {
    int64_t owner;
    state_base(&g->st[i], post, keep, &owner, &s[a++], &o[b++]);
    s[a++] = post ? g->st[i].owner_cont : g->st[i].base_cont;
  }
  for (int i = 0; i < nn; i++) {
    const fb_sfg_node *n = nodes[i];
    s[a++] = n->serial;
    s[a++] = n->list_ver;
    o[b++] = n->order;
    for (int k = 0; k < n->m->nacc; k++) {
      s[a++] = n->ver[k];
      s[a++] = n->cont[k];
      o[b++] = n->vorder[k];
    }
  }
  qsort(s, a, sizeof *s, cmp_u64);
  qsort(o, b, sizeof *o, cmp_u64);
  size_t ua = 0, ub = 0;
  for (size_t i = 0; i < a; i++)
    if (!ua || s[ua - 1] != s[i]) s[ua++] = s[i];
  for (size_t i = 0; i < b; i++)
    if (!ub || o[ub - 1] != o[i]) o[ub++] = o[i];
  *sv = s;
  *ns = ua;
  *ov = o;
  *no = ub;
  return 0;
}

/* The canonical form of the graph between flushes: every state and
 * retained node as the passes see them, serials and order stamps replaced
 * by their ranks (the passes compare them, never use their values). Equal
 * forms optimize an equal window the same way. post: the form the graph
 * will have once this flush collects it. */
static int canon_build(const fb_sfg *g, int post, ivec *x) {
  uint64_t *sv = NULL, *ov = NULL;
  size_t ns = 0, no = 0;
  const fb_sfg_node **nodes = NULL;
  int nn = 0, *keep = NULL;
  int rc = canon_nodes(g, post, &nodes, &nn, &keep);
  if (!rc) rc = canon_values(g, post, keep, nodes, nn, &sv, &ns, &ov, &no);
  if (rc) {
    free(nodes);
    free(keep);
    return rc;
  }
  iv_push(x, nn);
  iv_push(x, g->nst);
  for (int i = 0; i < g->nst; i++) {
    int64_t owner;
    uint64_t ver, order;
    state_base(&g->st[i], post, keep, &owner, &ver, &order);
    iv_push(x, g->st[i].key);
    iv_push(x, owner);
    iv_push(x, rank_of(sv, ns, ver));
    iv_push(x, rank_of(ov, no, order));
    iv_push(x, rank_of(sv, ns, post ? g->st[i].owner_cont : g->st[i].base_cont));
  }
  for (int i = 0; i < nn; i++) {
    const fb_sfg_node *n = nodes[i];
    iv_push(x, rank_of(sv, ns, n->serial));
    iv_push(x, rank_of(ov, no, n->order));
    iv_push(x, rank_of(sv, ns, n->list_ver));
    iv_push(x, n->host);
    iv_push(x, n->ir);
    iv_push(x, n->orig);
    iv_push(x, n->ntasks);
    iv_push(x, n->nargs);
    for (int k = 0; k < n->nargs; k++) iv_push(x, (int64_t)n->args[k]);
    iv_push(x, n->ncerts);
    for (int k = 0; k < n->ncerts; k++) {
      iv_push(x, n->certs[k].orig);
      iv_push(x, n->certs[k].argoff);
      iv_push(x, n->certs[k].nargs);
    }
    iv_push(x, n->m->nacc);
    iv_push(x, n->m->snode);
    for (int k = 0; k < n->m->nacc; k++) {
      if (n->host) { /* a host node's metadata is its own, not the bank's */
        iv_push(x, n->m->acc[k].key);
        iv_push(x, n->m->acc[k].mode);
        iv_push(x, n->m->acc[k].flags);
      }
      iv_push(x, rank_of(sv, ns, n->ver[k]));
      iv_push(x, rank_of(sv, ns, n->cont[k]));
      iv_push(x, rank_of(ov, no, n->vorder[k]));
    }
  }
  free(sv);
  free(ov);
  free(nodes);
  free(keep);
  return x->oom ? FB_ENOMEM : 0;
}

static uint64_t canon_hash_of(const int64_t *v, int n) {
  uint64_t h = 0x243f6a8885a308d3ull;
  for (int i = 0; i < n; i++) h = mix(h, (uint64_t)v[i]);
  return h;
}

/* Recompute the canonical form (the graph between flushes changed). */
static int canon_update(fb_opt *o) {
  ivec x = {0};
  if (canon_build(&o->g, 0, &x)) {
    free(x.v);
    return FB_ENOMEM;
  }
  free(o->canon);
  o->canon = x.v;
  o->ncanon = x.n;
  o->canon_hash = canon_hash_of(x.v, x.n);
  return 0;
}

static uint64_t plan_key(const fb_opt *o) { return mix(o->lhash, o->canon_hash); }

static void plan_free(fb_opt *o, plan *p) {
  if (!p) return;
  for (int i = 0; i < p->nwin; i++) fb_bank_unref(o->bank, p->win[i].ir);
  fb_opt_batch_free(o, p->tmpl ? &p->tmpl->pub : NULL);
  free(p->win);
  free(p->wargs);
  free(p->canon);
  free(p->ret_new);
  free(p->ret_launch);
  free(p->clears);
  free(p);
}

static void plans_clear(fb_opt *o) {
  for (int i = 0; i < o->nplans; i++) plan_free(o, o->plans[i]);
  o->nplans = 0;
}

/* The plan made for this window in this graph, or NULL. */
static plan *plan_find(fb_opt *o) {
  if (!o->nlog || o->built || o->optimized || o->g.n != o->g.nret) return NULL;
  uint64_t key = plan_key(o), base = o->log[0].launch;
  for (int i = 0; i < o->nplans; i++) {
    plan *p = o->plans[i];
    if (p->key != key || p->nwin != o->nlog || p->nwargs != o->nlargs || p->ncanon != o->ncanon ||
        p->nret != o->g.nret)
      continue;
    int same = !memcmp(p->canon, o->canon, sizeof *p->canon * (size_t)p->ncanon) &&
               (!p->nwargs || !memcmp(p->wargs, o->largs, sizeof *p->wargs * p->nwargs));
    for (int k = 0; same && k < p->nwin; k++) {
      const wlog_ent *a = &p->win[k], *b = &o->log[k];
      same = a->ir == b->ir && a->nargs == b->nargs && a->argoff == b->argoff &&
             a->launch == b->launch - base && a->index == b->index;
    }
    if (same) return p;
  }
  return NULL;
}

/* A copy of batch src (references taken) with add - sub on every launch
 * number. */
static batch_impl *batch_copy(fb_opt *o, const batch_impl *src, uint64_t add, uint64_t sub) {
  int n = src->pub.n;
  batch_impl *b = calloc(1, sizeof *b);
  if (!b) return NULL;
  b->pub.v = malloc(sizeof *b->pub.v * (size_t)(n ? n : 1));
  b->args = malloc(sizeof *b->args * (size_t)(src->nargs ? src->nargs : 1));
  b->parts = malloc(sizeof *b->parts * (size_t)(src->nparts ? src->nparts : 1));
  b->part_ir = malloc(sizeof *b->part_ir * (size_t)(src->nparts ? src->nparts : 1));
  if (!b->pub.v || !b->args || !b->parts || !b->part_ir) {
    free(b->pub.v);
    free(b->args);
    free(b->parts);
    free(b->part_ir);
    free(b);
    return NULL;
  }
  b->nargs = src->nargs;
  b->nparts = src->nparts;
  if (src->nargs) memcpy(b->args, src->args, sizeof *b->args * (size_t)src->nargs);
  memcpy(b->parts, src->parts, sizeof *b->parts * (size_t)src->nparts);
  memcpy(b->part_ir, src->part_ir, sizeof *b->part_ir * (size_t)src->nparts);
  for (int i = 0; i < src->nparts; i++) {
    fb_bank_ref(o->bank, b->part_ir[i]);
    b->parts[i].launch = b->parts[i].launch - sub + add;
  }
  for (int i = 0; i < n; i++) {
    fb_opt_launch L = src->pub.v[i];
    fb_bank_ref(o->bank, L.ir);
    L.args = b->args + (L.args - src->args);
    L.parts = b->parts + (L.parts - src->parts);
    L.launch = L.launch - sub + add;
    b->pub.v[i] = L;
  }
  b->pub.n = n;
  return b;
}

/* Remember this flush: the window (still in the log), the canonical graph
 * pre (which the flush left as it found it), its batch and counters. */
static void plan_store(fb_opt *o, const int64_t *pre, int npre, const batch_impl *b,
                       uint64_t win_serial) {
  if (o->nlog > 4096) return; /* memory: long windows do not repeat anyway */
  uint64_t base = o->log[0].launch;
  plan *p = calloc(1, sizeof *p);
  if (!p) return;
  p->nwin = o->nlog;
  p->nwargs = o->nlargs;
  p->ncanon = npre;
  p->nret = o->g.nret;
  p->win = malloc(sizeof *p->win * (size_t)p->nwin);
  p->wargs = malloc(sizeof *p->wargs * (p->nwargs ? p->nwargs : 1));
  p->canon = malloc(sizeof *p->canon * (size_t)(npre ? npre : 1));
  p->ret_new = calloc((size_t)(p->nret ? p->nret : 1), 1);
  p->ret_launch = calloc((size_t)(p->nret ? p->nret : 1), sizeof *p->ret_launch);
  p->tmpl = batch_copy(o, b, 0, base);
  if (!p->win || !p->wargs || !p->canon || !p->ret_new || !p->ret_launch || !p->tmpl) {
    p->nwin = 0;
    plan_free(o, p);
    return;
  }
  for (int i = 0; i < p->nwin; i++) {
    p->win[i] = o->log[i];
    p->win[i].launch -= base;
    fb_bank_ref(o->bank, p->win[i].ir);
  }
  if (p->nwargs) memcpy(p->wargs, o->largs, sizeof *p->wargs * p->nwargs);
  memcpy(p->canon, pre, sizeof *pre * (size_t)npre);
  for (int i = 0; i < p->nret; i++) {
    const fb_sfg_node *n = o->g.nodes[i];
    if (!n->host && n->serial >= win_serial) {
      p->ret_new[i] = 1;
      p->ret_launch[i] = n->launch - base;
    }
  }
  for (int i = 0; i < p->nwin; i++) { /* what the hit must tell fb_opt_observe_mask */
    const fb_task_meta *m = fb_bank_meta(o->bank, p->win[i].ir);
    for (int k = 0; m && k < m->nacc; k++) {
      uint32_t key = m->acc[k].key;
      if (FB_SKEY_KIND(key) != FB_SK_MASK || !(m->acc[k].flags & FB_AF_CLEAR)) continue;
      int dup = 0;
      for (int c = 0; c < p->nclears && !dup; c++) dup = p->clears[c] == key;
      if (dup) continue;
      uint32_t *v = realloc(p->clears, sizeof *v * (size_t)(p->nclears + 1));
      if (!v) {
        plan_free(o, p);
        return;
      }
      p->clears = v;
      p->clears[p->nclears++] = key;
    }
  }
  p->cnt = o->stats.flush;
  p->key = plan_key(o);
  p->used = ++o->plan_clock;
  if (o->nplans >= o->opt.plan_memo_max || !o->plans) {
    if (!o->plans && !(o->plans = calloc((size_t)o->opt.plan_memo_max, sizeof *o->plans))) {
      plan_free(o, p);
      return;
    }
    if (o->nplans >= o->opt.plan_memo_max) { /* evict the least recently used */
      int lru = 0;
      for (int i = 1; i < o->nplans; i++)
        if (o->plans[i]->used < o->plans[lru]->used) lru = i;
      plan_free(o, o->plans[lru]);
      o->plans[lru] = o->plans[--o->nplans];
    }
  }
  o->plans[o->nplans++] = p;
  o->stats.flush.plans_stored++;
}

/* Batch a (launch numbers less base) and b hand out the same launches. */
static int batch_same(const fb_opt_batch *a, const fb_opt_batch *b, uint64_t base) {
  if (a->n != b->n) return 0;
  for (int i = 0; i < a->n; i++) {
    const fb_opt_launch *x = &a->v[i], *y = &b->v[i];
    if ((x->ir != y->ir && !fb_kernel_equal(x->k, y->k)) || x->kind != y->kind ||
        x->loop != y->loop || x->snode != y->snode || x->nargs != y->nargs ||
        x->launch + base != y->launch || x->ntasks != y->ntasks || x->nparts != y->nparts ||
        (x->nargs && memcmp(x->args, y->args, sizeof *x->args * (size_t)x->nargs)))
      return 0;
    for (int p = 0; p < x->nparts; p++) {
      const fb_opt_part *u = &x->parts[p], *v = &y->parts[p];
      if (u->launch + base != v->launch || u->argoff != v->argoff || u->nargs != v->nargs ||
          u->inb != v->inb || u->ir != v->ir || u->index != v->index)
        return 0;
    }
  }
  return 1;
}

/* Hand out plan p's batch for the logged window; the graph stays as it is
 * (the plan left it in this canonical form), its retained tasks of the
 * plan's window taking this window's launch numbers. */
static int plan_use(fb_opt *o, plan *p, fb_opt_batch **out, double t0) {
  uint64_t base = o->log[0].launch;
  batch_impl *b = batch_copy(o, p->tmpl, base, 0);
  if (!b) return fail(o, FB_ENOMEM, "flush: out of memory");
  for (int i = 0; i < p->nret; i++)
    if (p->ret_new[i]) o->g.nodes[i]->launch = base + p->ret_launch[i];
  for (int i = 0; i < p->nclears; i++) {
    int sid = fb_sfg_state_id(&o->g, p->clears[i]); /* exists: the plan's window made it */
    if (sid >= 0) o->g.st[sid].cleared = 1;
  }
  fb_opt_counters *cnt = &o->stats.flush;
  *cnt = p->cnt;
  cnt->flushes = 1;
  cnt->tasks_in = (uint64_t)o->nlog;
  cnt->tasks_out = (uint64_t)b->pub.n;
  cnt->iterations = cnt->memo_hits = cnt->memo_misses = cnt->plans_stored = 0;
  cnt->fuse_pairs = 0; /* no pass ran */
  cnt->plans_reused = 1;
  p->used = ++o->plan_clock;
  log_clear(o);
  cnt->optimizer_s = now_s() - t0;
  add_counters(&o->stats.total, cnt);
  *out = &b->pub;
  return 0;
}

int fb_opt_flush(fb_opt *o, fb_opt_batch **out) {
  *out = NULL;
  if (!fb_opt_pending(o)) return 0;
  double t0 = now_s();
  /* the window is all in the log: it may be a known one */
  int whole = o->opt.plan_memo && o->nlog && !o->built && !o->optimized && o->g.n == o->g.nret;
  uint64_t base = whole ? o->log[0].launch : 0, win_serial = o->g.next_serial;
  plan *known = whole ? plan_find(o) : NULL;
  if (known && !o->opt.check) return plan_use(o, known, out, t0);
  int rc = fb_opt_optimize(o);
  t0 = now_s();
  fb_opt_counters *cnt = &o->stats.flush;
  if (!rc) rc = make_batch(o, out);
  /* the canonical graph this flush will leave: a plan is kept for a window
   * that leaves the graph as it found it (a repeating stream) */
  ivec post = {0};
  if (!rc && whole && (rc = canon_build(&o->g, 1, &post))) fail(o, rc, "flush: out of memory");
  int fixed = !rc && whole && post.n == o->ncanon &&
              !memcmp(post.v, o->canon, sizeof *post.v * (size_t)post.n);
  if (!rc && known && (!fixed || !batch_same(&known->tmpl->pub, *out, base)))
    /* check mode: a reused plan must be what the pipeline makes */
    rc = fail(o, FB_EINTERNAL,
              "flush: the plan memo's batch for this window differs from the "
              "pipeline's");
  if (!rc) {
    cnt->tasks_out = (uint64_t)(*out)->n;
    rc = fb_sfg_collect(&o->g, o->bank);
  }
  if (rc) {
    /* the window stays pending: the engine reports the error */
    free(post.v);
    fb_opt_batch_free(o, *out);
    *out = NULL;
    if (!o->err[0]) fail(o, rc, "flush: %s", fb_strerror(rc));
    return rc;
  }
  if (known) {
    cnt->plans_reused = 1;
    known->used = ++o->plan_clock;
  } else if (fixed) {
    plan_store(o, o->canon, o->ncanon, (const batch_impl *)*out, win_serial);
  }
  if (whole) { /* the post form is the graph's now */
    free(o->canon);
    o->canon = post.v;
    o->ncanon = post.n;
    o->canon_hash = canon_hash_of(post.v, post.n);
  } else if (canon_update(o)) {
    o->ncanon = -1; /* out of memory: no plan matches until the next flush */
  }
  log_clear(o);
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

/* Observers see the window in the graph: build what is logged (the flush
 * then runs the pipeline, as a flush after fb_opt_optimize does). The
 * context is never const-defined; only the logged launches move. */
char *fb_opt_dot(const fb_opt *o, const char *title) {
  if (materialize((fb_opt *)o)) return NULL;
  return fb_sfg_dot(&o->g, o->bank, title);
}
char *fb_opt_graph_text(const fb_opt *o) {
  if (materialize((fb_opt *)o)) return NULL;
  return fb_sfg_text(&o->g, o->bank);
}

void fb_opt_set_trace(fb_opt *o, fb_opt_trace_fn fn, void *user) {
  o->trace = fn;
  o->trace_user = user;
}

int fb_opt_check(fb_opt *o, char *err, size_t errlen) {
  if (materialize(o)) {
    fb_errf(err, errlen, "%s", o->err);
    return FB_ENOMEM;
  }
  return fb_sfg_check(&o->g, o->bank, err, errlen);
}

fb_sfg *fb_opt_graph(fb_opt *o) {
  materialize(o); /* out of memory: the logged launches are not in it yet */
  return &o->g;
}
fb_bank *fb_opt_bank(fb_opt *o) { return o->bank; }
