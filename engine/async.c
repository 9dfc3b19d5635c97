/* The async caller's side: the launch window, flushes (optimize on the
 * caller's thread, hand the batch to the worker), the caller's code map, and
 * the sync points (fb_flush, fb_sync, return values). */
#include "engine/engine_test.h"
#include "engine/internal.h"

/* ---------------------------------------------------------------- async: the caller's side */

/* ---- the caller's code map (task IR handle -> code) */

#define CMAP_MAX 4096 /* entries of a code map; past it the map starts over */

/* A code map: task IR handle -> code, each entry holding a reference of
 * the handle (so a handle in the map always names the same IR). The
 * caller's code map (a->cmap) and the stand-ins' (a->smap) are two. */
static uint64_t cmap_key(fb_irh h) { return (uint64_t)(uint32_t)h; }

static const fb_rt_task *code_get(const fb_map *m, fb_irh h) {
  const code_ent *e = fb_map_get(m, cmap_key(h));
  return e ? &e->code : NULL;
}

/* Forget every entry, giving the references back. */
static void code_clear(async_state *a, fb_map *m) {
  uint64_t key;
  for (size_t i = 0; i < m->cap; i++)
    if (fb_map_at(m, i, &key)) fb_opt_release(a->o, (fb_irh)(uint32_t)key);
  fb_map_free(m);
}

/* Remember the code of h (taking a reference of the map's own); out of
 * memory, nothing is remembered (the code is compiled again when needed). */
static void code_put(async_state *a, fb_map *m, fb_irh h, const fb_rt_task *code, int64_t grain) {
  if (code_get(m, h)) return;
  if (m->n >= CMAP_MAX) code_clear(a, m);
  code_ent *v = fb_map_put(m, cmap_key(h), NULL);
  if (!v) return;
  fb_opt_retain(a->o, h);
  *v = (code_ent){*code, grain, 0};
}

static const fb_rt_task *cmap_get(const async_state *a, fb_irh h) { return code_get(&a->cmap, h); }

/* The grain of h's task is worked out here, on the caller's thread, once
 * per code learned: the worker takes it from the batch (async_job.grain). */
static void cmap_put(async_state *a, fb_irh h, const fb_rt_task *code, const fb_kernel *k,
                     int loop) {
  code_put(a, &a->cmap, h, code, fbe_task_grain(k, loop));
}

void fbe_cmap_clear(async_state *a) { code_clear(a, &a->cmap); }

/* ---- stand-ins while a demoted task compiles
 *
 * Activation demotion makes new task IR on the first flushes that prove a
 * write's cell active (often several in turn, as proofs appear), and its
 * compile would stall the batch (a large task compiles for a second or
 * more). The task as inserted gives the same results there (its
 * activations are proved no-ops; the optimizer says so with
 * fb_opt_launch.standin), and its code is usually known: it runs in the
 * demoted task's place while the demoted code compiles in the background,
 * which later flushes then use. A compile that fails leaves the stand-in
 * in place for good (no lost work, no error: the launch ran as asked). */

typedef struct bg_compile {
  struct bg_compile *next;
  fb_irh h;           /* the task compiled (a reference of its own) */
  fb_rt_task standin; /* what runs in its place meanwhile */
  fb_cjob c;
} bg_compile;

/* Code equal to task h without any proof (h itself, simplified). */
static void smap_put(async_state *a, fb_irh h, const fb_rt_task *code) {
  code_put(a, &a->smap, h, code, -1); /* runs in another task's place: its grain */
}

static const fb_rt_task *standin_code(const async_state *a, fb_irh standin) {
  const fb_rt_task *c = code_get(&a->smap, standin);
  return c ? c : cmap_get(a, standin);
}

static int bg_pending(const async_state *a, fb_irh h) {
  for (const bg_compile *g = a->bg; g; g = g->next)
    if (g->h == h) return 1;
  return 0;
}

/* Compile L's own code on the compile pool; 0 when started, FB_EQUOTA
 * when the session has bg_max compiles already (the entry then compiles in
 * its batch). */
static int bg_start(fb_session *s, const fb_opt_launch *L, const fb_rt_task *standin) {
  async_state *a = s->as;
  if (a->nbg >= s->e->bg_max) return FB_EQUOTA;
  bg_compile *g = calloc(1, sizeof *g);
  if (!g) return FB_ENOMEM;
  fb_opt_retain(a->o, L->ir); /* keeps L->k alive until the compile is done */
  g->h = L->ir;
  g->standin = *standin;
  g->c.task.ir = L->k;
  g->c.task.loop = L->loop;
  g->c.task.partition = s->partition;
  g->c.task.pins = s->pins;
  g->c.trace = s->trace;
  g->next = a->bg;
  a->bg = g;
  if (++a->nbg > a->nbg_peak) a->nbg_peak = a->nbg;
  fb_cpool_submit(s->e->cpool, &g->c, 1);
  return 0;
}

/* Learn the code of the background compiles that finished (no wait). */
static void bg_harvest(fb_session *s) {
  async_state *a = s->as;
  for (bg_compile **p = &a->bg; *p;) {
    bg_compile *g = *p;
    if (!fb_cpool_done(s->e->cpool, &g->c)) {
      p = &g->next;
      continue;
    }
    *p = g->next;
    a->nbg--;
    if (g->c.rc) {
      /* not compiled again: the stand-in stays */
      cmap_put(a, g->h, &g->standin, g->c.task.ir, g->c.task.loop);
    } else {
      cmap_put(a, g->h,
               &(fb_rt_task){g->c.code.body, g->c.code.bounds, g->c.code.gpu, g->c.code.priv},
               g->c.task.ir, g->c.task.loop);
      pthread_mutex_lock(&s->cmu);
      if (g->c.code.cache_hit) {
        s->c.cache_hits++;
      } else {
        s->c.tasks_compiled++;
        s->c.statements_emitted += (uint64_t)g->c.code.stmts_emitted;
      }
      s->c.compile_s += g->c.code.compile_s;
      pthread_mutex_unlock(&s->cmu);
    }
    fb_opt_release(a->o, g->h);
    free(g);
  }
}

/* The session ends: take the background compiles back (waits for one
 * being compiled) and forget the stand-ins. */
void fbe_standins_free(fb_session *s) {
  async_state *a = s->as;
  while (a->bg) {
    bg_compile *g = a->bg;
    a->bg = g->next;
    a->nbg--;
    fb_cpool_withdraw(s->e->cpool, &g->c);
    fb_opt_release(a->o, g->h);
    free(g);
  }
  code_clear(a, &a->smap);
}

/* The code of each entry, where the map has it, with its grain; or a
 * stand-in's, with the entry's own code compiling in the background.
 * *known: the distinct handles of the batch when the map had every
 * entry's code (each counted once by its entry's stamp), else -1. */
static fb_rt_task *known_code(fb_session *s, const fb_opt_batch *b, uint64_t no, int64_t **grain,
                              int *known) {
  async_state *a = s->as;
  size_t n = (size_t)(b && b->n ? b->n : 1);
  fb_rt_task *pre = calloc(n, sizeof *pre);
  int64_t *g = *grain = malloc(n * sizeof *g);
  *known = 0;
  if (!g) {
    free(pre);
    return NULL;
  }
  for (size_t i = 0; i < n; i++) g[i] = -1;
  for (int i = 0; pre && b && i < b->n; i++) {
    const fb_opt_launch *L = &b->v[i];
    code_ent *e = fb_map_get(&a->cmap, cmap_key(L->ir)); /* one look-up: code and grain */
    const fb_rt_task *sc;
    if (e) {
      pre[i] = e->code;
      g[i] = e->grain;
      if (*known >= 0 && e->stamp != no) {
        e->stamp = no;
        ++*known;
      }
      if (L->standin_same) smap_put(a, L->standin, &e->code);
      continue;
    }
    *known = -1;
    if (L->standin != FB_IRH_NONE && L->k && L->k->nstmts >= s->e->standin_min_stmts &&
        (sc = standin_code(a, L->standin)) && (bg_pending(a, L->ir) || !bg_start(s, L, sc))) {
      pre[i] = *sc;
      a->standins++;
    }
  }
  return pre;
}

/* A finished batch: learn its new code, then free it. */
static void free_job(fb_session *s, async_job *j) {
  async_state *a = s->as;
  atomic_fetch_sub(&a->pending_bytes, j->bytes);
  if (j->queued) a->inflight--;
  for (int i = 0; j->which && i < j->b->n; i++) {
    const fb_cjob *c = j->which[i] >= 0 ? &j->cj[j->which[i]] : NULL;
    if (c && !c->rc) {
      const fb_opt_launch *L = &j->b->v[i];
      fb_rt_task code = {c->code.body, c->code.bounds, c->code.gpu, c->code.priv};
      cmap_put(a, L->ir, &code, L->k, L->loop);
      if (L->standin_same) smap_put(a, L->standin, &code);
    }
  }
  fb_opt_batch_free(a->o, j->b);
  free(j->launches);
  free(j->pre);
  free(j->grain);
  free(j->cj);
  free(j->which);
  free(j);
}

/* Free the batches the worker finished (fb_opt is this thread's). With
 * none handed to it (inflight counts every queued batch until it is freed
 * here), there is none to free: no lock (this runs at every launch). */
void fbe_reap(fb_session *s) {
  async_state *a = s->as;
  if (!a->inflight) {
    if (a->bg) bg_harvest(s);
    return;
  }
  pthread_mutex_lock(&a->mu);
  async_job *d = a->done;
  a->done = NULL;
  pthread_mutex_unlock(&a->mu);
  while (d) {
    async_job *n = d->done_next;
    free_job(s, d);
    d = n;
  }
  if (a->bg) bg_harvest(s);
}

/* Wait until the worker has run everything handed to it. */
void fbe_quiesce(fb_session *s) {
  double t0 = s->trace ? fb_trace_clock() : 0;
  fb_ordq_drain(s->as->q);
  fbe_reap(s);
  pthread_mutex_lock(&s->cmu);
  s->dev_bytes = fb_devmem_used(&s->mem);
  pthread_mutex_unlock(&s->cmu);
  if (s->trace)
    fb_trace_span(s->trace, FB_TRACK_CLIENT, "wait", "wait for the device", t0, fb_trace_clock(),
                  NULL);
}

/* Too many batches queued: wait until the worker has finished one, and
 * free it. Not a drain: the worker keeps the batches behind it, so it
 * never stands idle while the caller builds the next window (a drain here
 * left it idle, and to be woken again, once every few flushes). */
static void wait_one(fb_session *s) {
  async_state *a = s->as;
  double t0 = s->trace ? fb_trace_clock() : 0;
  atomic_fetch_add(&a->waits, 1);
  pthread_mutex_lock(&a->mu);
  while (!a->done) pthread_cond_wait(&a->done_cv, &a->mu);
  pthread_mutex_unlock(&a->mu);
  fbe_reap(s);
  if (s->trace)
    fb_trace_span(s->trace, FB_TRACK_CLIENT, "wait", "wait for a queued batch", t0,
                  fb_trace_clock(), NULL);
}

static int win_push(async_state *a, int kernel, const sess_kernel *sk) {
  if (a->nwin == a->capwin) {
    int nc = a->capwin ? a->capwin * 2 : 64;
    launch_rec *v = realloc(a->win, sizeof *v * (size_t)nc);
    if (!v) return FB_ENOMEM;
    a->win = v;
    a->capwin = nc;
  }
  a->win[a->nwin++] = (launch_rec){kernel, sk->k->name, sk->irs, sk->tl.n};
  return 0;
}

static void graph_cb(void *user, int iteration, const char *pass, const char *when,
                     const char *dot) {
  fb_session *s = user;
  s->as->gfn(s->as->guser, s->as->gcur, iteration, pass, when, dot);
}

/* Optimize the window of flush `no` with the SFG trace on. */
static int traced_optimize(fb_session *s, uint64_t no) {
  async_state *a = s->as;
  char *dot = fb_opt_dot(a->o, "window");
  if (dot) a->gfn(a->guser, no, -1, "window", "before", dot);
  free(dot);
  a->gcur = no;
  fb_opt_set_trace(a->o, graph_cb, s);
  int rc = fb_opt_optimize(a->o);
  fb_opt_set_trace(a->o, NULL, NULL);
  if (rc) return rc;
  dot = fb_opt_dot(a->o, "optimized");
  if (dot) a->gfn(a->guser, no, -1, "window", "after", dot);
  free(dot);
  return 0;
}

/* The optimizer failed: hand the window out as it is (results stay right)
 * and report the failure at the next sync point. */
static int flush_plain(fb_session *s, uint64_t no, fb_opt_batch **b) {
  async_state *a = s->as;
  char why[512];
  fb_errf(why, sizeof why, "%s", fb_opt_errmsg(a->o)[0] ? fb_opt_errmsg(a->o) : "no message");
  fb_opt_options saved = *fb_opt_get_options(a->o), plain = saved;
  plain.passes = 0;
  plain.check = 0;
  fb_opt_set_options(a->o, &plain);
  int rc = fb_opt_flush(a->o, b);
  fb_opt_set_options(a->o, &saved);
  if (rc)
    return fail(s, rc, "flush %llu: the optimizer failed (%s), and again without passes: %s",
                (unsigned long long)no, why, fb_opt_errmsg(a->o));
  fbe_bg_record(s, FB_EINTERNAL, NO_LAUNCH, -1,
                "flush %llu: the optimizer failed (%s); its tasks "
                "ran unoptimized",
                (unsigned long long)no, why);
  return 0;
}

static void note_flush(fb_session *s, uint64_t no, double t0) {
  const fb_opt_counters *f = &fb_opt_get_stats(s->as->o)->flush;
  fb_flush_stats *l = &s->as->last;
  l->flush = no;
  l->tasks_in = f->tasks_in;
  l->tasks_out = f->tasks_out;
  l->listgens_removed = f->listgen_removed;
  l->tasks_fused = f->tasks_fused;
  l->dead_stores_removed = f->dead_stores + f->tasks_deleted;
  l->activations_demoted = f->demoted;
  l->optimizer_s = f->optimizer_s;
  if (!s->trace) return;
  char name[64], args[128];
  snprintf(name, sizeof name, "flush %llu", (unsigned long long)no);
  snprintf(args, sizeof args, "{\"tasks_in\":%llu,\"tasks_out\":%llu}",
           (unsigned long long)l->tasks_in, (unsigned long long)l->tasks_out);
  fb_trace_span(s->trace, FB_TRACK_CLIENT, "optimizer", name, t0, fb_trace_clock(), args);
}

/* Give the batch and the window's launches to the worker; or, when the
 * caller is going to wait for it anyway and the worker is idle, run it on
 * the caller's thread (two thread switches fewer). */
static int hand_out(fb_session *s, fb_opt_batch *b, uint64_t no, uint64_t basis, int run_here) {
  async_state *a = s->as;
  async_job *j = calloc(1, sizeof *j);
  launch_rec *launches = a->win;
  int n = a->nwin;
  uint64_t base = a->win_base;
  a->win = NULL;
  a->nwin = a->capwin = 0;
  a->win_base = s->launch_no;
  if (!j) {
    atomic_fetch_sub(&a->pending_bytes, a->win_bytes);
    a->win_bytes = 0;
    a->tainted = 1; /* the caller's thread; the worker is not running this */
    fbe_note_bad(a, no);
    fb_opt_batch_free(a->o, b);
    free(launches);
    return fail(s, FB_ENOMEM, "flush %llu: out of memory; its tasks did not run",
                (unsigned long long)no);
  }
  *j = (async_job){.s = s, .b = b, .flush = no, .base = base, .launches = launches,
                   .nlaunches = n, .basis = basis};
  j->bytes = a->win_bytes; /* its launches' share of pending_bytes, until freed */
  a->win_bytes = 0;
  if (b && b->n && !(j->pre = known_code(s, b, no, &j->grain, &j->known_handles))) {
    a->tainted = 1;
    fbe_note_bad(a, no);
    free_job(s, j);
    return fail(s, FB_ENOMEM, "flush %llu: out of memory; its tasks did not run",
                (unsigned long long)no);
  }
  if (b && b->n && run_here && fb_ordq_idle(a->q)) fbe_run_batch(s, j);
  else if (b && b->n) {
    j->queued = 1;
    a->inflight++;
    fb_ordq_push(a->q, &j->link);
    /* a stream of launches faster than the worker: wait for it rather
     * than queue batches without bound */
    while (a->inflight > FB_MAX_QUEUED_FLUSHES) wait_one(s);
    return 0;
  }
  free_job(s, j);
  return 0;
}

/* Flush less often while the stream repeats: a window the optimizer's plan
 * memo answered costs no pass, and its batch is often a few tasks (the
 * paper's flushing period is a trade of latency for window width, and a
 * repeating stream has nothing more to show in a narrow one). After
 * PLAN_STREAK reused plans in a row the automatic flush waits twice as
 * long, up to FLUSH_AT_MAX tasks (the longest window the memo keeps); a
 * window it could not keep (not a repeating one) goes back to flush_every.
 * Only with the default flush_every: a session that set one gets it.
 *
 * A doubled width can fail for good: the first window at it neither hits
 * nor stores a plan (MGPCG's two-iteration window, 1,066 tasks: the graph
 * it leaves is not the one the one-iteration windows left, so it is no
 * fixed point the memo keeps). Falling back to flush_every and doubling
 * again re-optimized that window from scratch every few flushes (and
 * cost the window after it a miss too): once a step on mgpcg2d, 3-47 ms
 * each. So a probe that fails caps the width below it (flush_cap) for
 * CAP_FLUSHES flushes; the cap then expires, so that a stream that
 * changes can grow again (a probe costs two misses, CAP_FLUSHES flushes
 * are a few solver steps). Only the first window at a new width, cut by
 * the width (tasks_in >= flush_at), counts as its probe: a miss at a new
 * frame, after a host write, or a window a sync cut short says nothing
 * about the width. */
#define PLAN_STREAK 2
#define FLUSH_AT_MAX 4096
#define CAP_FLUSHES 128

static void adapt_flush(async_state *a) {
  if (!a->adapt || !a->flush_every) return;
  const fb_opt_counters *f = &fb_opt_get_stats(a->o)->flush;
  int probe = a->probe;
  a->probe = 0;
  if (a->flush_cap && a->flushes >= a->cap_until) a->flush_cap = 0;
  if (f->plans_reused) {
    if (++a->plan_streak >= PLAN_STREAK && a->flush_at < FLUSH_AT_MAX &&
        (!a->flush_cap || a->flush_at * 2 < a->flush_cap)) {
      a->flush_at = a->flush_at * 2 > FLUSH_AT_MAX ? FLUSH_AT_MAX : a->flush_at * 2;
      a->plan_streak = 0;
      a->probe = 1;
    }
    return;
  }
  a->plan_streak = 0;
  if (f->plans_stored) return;
  if (probe && f->tasks_in >= (uint64_t)a->flush_at) {
    a->flush_cap = a->flush_at;
    a->cap_until = a->flushes + CAP_FLUSHES;
    a->capped++;
  }
  a->flush_at = a->flush_every;
}

uint64_t fb_session_test_capped_widths(const fb_session *s) {
  return s && s->as ? s->as->capped : 0;
}

/* ---- windows aligned to the stream's period
 *
 * The automatic flush cuts the window where the pending count crosses
 * flush_at, which may fall inside a repeating group of launches: MLS-MPM's
 * substep is clear, build lists, G2P, P2G, grid op, and a cut between a
 * G2P and the P2G after it keeps the pair from fusing (only one of the two
 * pairs of its 12-launch period fused). So, with the default flush_every,
 * a flush that comes due while the launches repeat with a period of P
 * launches (the last 2P launches, and at least the window's, kernel and
 * argument values, repeat with period P; the shortest such P up to
 * FB_PERIOD_MAX) waits until the
 * launches since the last sync point or fb_flush (the client's own frame
 * boundary) are a multiple of P; at most P - 1 more launches, and never
 * past FB_MAX_PENDING_TASKS. Every window then is whole periods cut at the
 * same phase, so the optimizer sees the same groups whole, and the graph
 * each window leaves (the latest writer of each state, from its last
 * period) is the one it found: a fixed point the plan memo keeps from the
 * first window of each width on. Order and results do not depend on where
 * a window is cut; only what the optimizer can see together does. */

/* The launch's key: its kernel and argument values. */
static uint64_t launch_key(int kernel, const uint64_t *args, int nargs) {
  uint64_t h = 0x9e3779b97f4a7c15ull ^ (uint64_t)(uint32_t)kernel;
  for (int i = 0; i < nargs; i++) {
    h ^= args[i] + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    h *= 0xff51afd7ed558ccdull;
  }
  return h ^ (h >> 29);
}

#define KEY(a, n) ((a)->keys[(n) % (FB_PERIOD_MAX * 2)])

/* The shortest period p <= FB_PERIOD_MAX of the last launches before
 * launch number n (across sync points): the last 2p of them and the
 * window's (span launches) each equal to the one p before it, so that a group repeating inside a
 * longer pattern (a solver's smoothing sweeps) is not taken for the
 * stream's period; 0: none. */
static int stream_period(const async_state *a, uint64_t n, int span) {
  int pmax = n / 2 < FB_PERIOD_MAX ? (int)(n / 2) : FB_PERIOD_MAX;
  for (int p = 1; p <= pmax; p++) {
    int len = span - p > p ? span - p : p; /* compares of launch i with i - p */
    if (len + p > FB_PERIOD_MAX * 2) len = FB_PERIOD_MAX * 2 - p; /* what the keys hold */
    if ((uint64_t)(len + p) > n) len = (int)(n - (uint64_t)p); /* the launches there are */
    int i = 0;
    while (i < len && KEY(a, n - 1 - (uint64_t)i) == KEY(a, n - 1 - (uint64_t)(i + p))) i++;
    if (i == len) return p;
  }
  return 0;
}

/* A flush is due at launch number n (launches so far): cut now, or wait
 * for the period's boundary (a->due). */
static int cut_now(async_state *a, uint64_t n) {
  if (!a->adapt) return 1;
  if (!a->due) {
    a->period = stream_period(a, n, a->nwin);
    if (!a->period || (n - a->mark) % (uint64_t)a->period == 0) return 1;
    a->due = n + (uint64_t)a->period - (n - a->mark) % (uint64_t)a->period;
    a->aligned++;
    return 0;
  }
  /* the period broke while waiting: cut at once */
  if (KEY(a, n - 1) != KEY(a, n - 1 - (uint64_t)a->period)) return 1;
  return n >= a->due;
}

uint64_t fb_session_test_aligned_flushes(const fb_session *s) {
  return s && s->as ? s->as->aligned : 0;
}

/* Optimize what is pending and hand it out; does not wait, unless run_here
 * lets it run the batch itself (see hand_out). */
static int async_flush(fb_session *s, int run_here) {
  async_state *a = s->as;
  fbe_reap(s);
  a->prev1 = 0; /* a launch after a flush is never coalesced into one before it */
  if (!fb_opt_pending(a->o)) return 0;
  a->due = 0;
  uint64_t no = a->flushes + 1;
  double t0 = s->trace ? fb_trace_clock() : 0;
  fb_opt_batch *b = NULL;
  /* A flush that stopped early (an error stopped a launch, a cancel, a
   * dropped batch) did not leave the lists and activations the optimizer
   * keeps from it: forget them before this window is optimized against
   * them. What ran is read first: a flush it counts is in bad_flush too. */
  uint64_t ran = atomic_load(&a->ran_upto);
  int forget = atomic_load(&a->bad_flush) > a->forgot_upto;
  int rc = forget ? fb_opt_forget(a->o) : 0;
  if (forget && !rc) a->forgot_upto = no - 1;
  if (!rc && a->gfn && (!a->gflush || a->gflush == no)) rc = traced_optimize(s, no);
  if (!rc) rc = fb_opt_flush(a->o, &b);
  if (rc && (rc = flush_plain(s, no, &b))) return rc;
  /* what this batch relies on having run: flushes still running when it
   * was optimized count only if a pass took their tasks as run */
  uint64_t basis = fb_opt_get_stats(a->o)->flush.retained_proofs
                       ? (ran > a->forgot_upto ? ran : a->forgot_upto)
                       : no - 1;
  a->flushes = no;
  note_flush(s, no, t0);
  adapt_flush(a);
  return hand_out(s, b, no, basis, run_here);
}

/* Every flushed task has run and nothing is pending: tell the optimizer
 * how often each pointer SNode's cells changed, so that lists made from a
 * mask that did not change stay current across flushes (the runtime counts
 * every slot set or cleared; bitmasked and dynamic containers change cells
 * without a count, so their lists are never kept this way). Host memory
 * only (the CPU): on CUDA the count would be read from managed memory,
 * untested. */
static void observe_masks(fb_session *s) {
  async_state *a = s->as;
  if (!s->sparse || s->mem.ms || fb_opt_pending(a->o)) return; /* ms: device memory */
  for (int i = 1; i < s->layout->nnodes; i++)
    if (s->layout->nodes[i].kind == FB_SN_POINTER &&
        fb_opt_observe_mask(a->o, i, fb_sparse_changes(s->sparse, i)))
      return; /* out of memory: nothing is kept, which is always right */
}

/* Some flushed task may not have run (an error skipped the rest of its
 * launch, the hook cancelled, a batch was dropped): the lists and masks the
 * optimizer keeps as current may not be. Report a host write of every
 * sparse container, as if the host had touched every cell, so that nothing
 * made before is taken as current again (the next observation starts
 * over). */
static int forget_masks(fb_session *s) {
  async_state *a = s->as;
  if (!s->sparse) return 0;
  if (fb_opt_pending(a->o)) return -1; /* at the next sync point */
  for (int i = 1; i < s->layout->nnodes; i++) {
    fb_snode_kind k = s->layout->nodes[i].kind;
    if ((k == FB_SN_POINTER || k == FB_SN_BITMASKED || k == FB_SN_DYNAMIC) &&
        fb_opt_host_write(a->o, i))
      return -1;
  }
  return 0;
}

int fbe_async_wait_all(fb_session *s) {
  async_state *a = s->as;
  a->mark = s->launch_no;
  int rc = async_flush(s, 1);
  fbe_quiesce(s);
  pthread_mutex_lock(&a->mu);
  int tainted = a->tainted;
  pthread_mutex_unlock(&a->mu);
  if (tainted) {
    if (!forget_masks(s)) {
      pthread_mutex_lock(&a->mu);
      a->tainted = 0;
      pthread_mutex_unlock(&a->mu);
    }
  } else if (!rc) {
    observe_masks(s);
  }
  return rc;
}

static int async_return(fb_session *s, const sess_kernel *sk, fb_value *ret) {
  int rc = fbe_async_wait_all(s);
  if (ret) {
    uint64_t slot = 0;
    char err[512];
    int crc = fb_devmem_ret0(&s->mem, &slot, err, sizeof err);
    if (crc && !rc) rc = fail(s, crc, "kernel '%s': reading its return value: %s", sk->k->name, err);
    *ret = fb_slot_unpack(sk->k->ret, slot);
  }
  return rc ? rc : fbe_report_bg(s);
}

/* ---- coalescing a run of equal launches
 *
 * A kernel whose second run, right after the first with the same argument
 * values, provably changes nothing and cannot fail (fb_opt_rerun_free: it
 * reads no state it writes, no atomics, no rand, no return value, every
 * access in bounds) may be launched again and again: a 0-D store 1,000
 * times a step (bench/overhead/fill_scalar), a grid cleared before each of
 * several passes. Dead-store elimination removes all but one of such a run
 * at the flush, but only after each launch was inserted (its tasks logged,
 * hashed, their arguments copied) and the window of 1,000 entries matched
 * against the plan memo. A launch equal to the one right before it (the
 * same kernel, equal argument values) while that one is still in the
 * unflushed window is coalesced into it instead: counted as a launch (its
 * launch number, its window record, its key for the stream's period), but
 * not inserted. The run's first launch runs and writes what every one of
 * them would; nothing between them (a host access, a sync point, a flush)
 * can change what it reads, since each of those flushes the window first
 * and a flush forgets the launch before (async_flush). None of them can
 * fail, so no error is lost or blamed on another launch. */

static int coalesces(async_state *a, int kernel, sess_kernel *sk, const uint64_t *args,
                     uint64_t no) {
  int n = sk->k->nparams;
  int same = a->prev1 == kernel + 1 && a->prev_no + 1 == no &&
             (!n || !memcmp(a->prev_args, args, sizeof *args * (size_t)n));
  if (same && !sk->rerun) sk->rerun = fb_opt_rerun_free(a->o, sk->h, sk->tl.n) ? 2 : 1;
  return same && sk->rerun == 2;
}

/* Remember launch `no` as the one before the next (out of memory: none). */
static void note_prev(async_state *a, int kernel, const sess_kernel *sk, const uint64_t *args,
                      uint64_t no) {
  int n = sk->k->nparams;
  if (n > a->cap_prev_args) {
    uint64_t *v = realloc(a->prev_args, sizeof *v * (size_t)n);
    if (!v) {
      a->prev1 = 0;
      return;
    }
    a->prev_args = v;
    a->cap_prev_args = n;
  }
  if (n) memcpy(a->prev_args, args, sizeof *args * (size_t)n);
  a->prev1 = kernel + 1;
  a->prev_no = no;
}

uint64_t fb_session_test_coalesced(const fb_session *s) {
  return s && s->as ? s->as->coalesced : 0;
}

/* Insert the kernel's tasks into the SFG; flush when a trigger says so. */
int fbe_async_launch(fb_session *s, int kernel, sess_kernel *sk, fb_value *ret) {
  async_state *a = s->as;
  fbe_reap(s);
  if (win_push(a, kernel, sk))
    return fail(s, FB_ENOMEM, "kernel '%s': out of memory", sk->k->name);
  const uint64_t *args = s->args ? s->args : no_args;
  KEY(a, s->launch_no) = launch_key(kernel, args, sk->k->nparams);
  if (sk->k->ret == FB_T_VOID && coalesces(a, kernel, sk, args, s->launch_no)) {
    a->prev_no = s->launch_no; /* the run goes on */
    a->win_bytes += sizeof(launch_rec);
    atomic_fetch_add(&a->pending_bytes, sizeof(launch_rec));
    s->launch_no++;
    a->launches++;
    a->coalesced++;
    if (ret) memset(ret, 0, sizeof *ret);
    return 0;
  }
  uint64_t held =
      sizeof(launch_rec) +
      (uint64_t)sk->tl.n * (FB_PENDING_TASK_BYTES + (uint64_t)sk->k->nparams * sizeof(uint64_t));
  a->win_bytes += held;
  atomic_fetch_add(&a->pending_bytes, held);
  int rc = 0;
  for (int t = 0; t < sk->tl.n && !rc; t++) {
    fb_opt_task ot = {sk->h[t], s->args ? s->args : no_args, sk->k->nparams, s->launch_no};
    if ((rc = fb_opt_insert(a->o, &ot))) {
      char where[FBE_WHERE_MAX];
      fail(s, rc, "kernel '%s' (launch %llu): queuing %s: %s", sk->k->name,
           (unsigned long long)s->launch_no,
           fbe_task_where((const fb_kernel *const *)sk->irs, sk->tl.n, t, where, sizeof where),
           fb_opt_errmsg(a->o));
    }
  }
  if (rc) a->prev1 = 0;
  else note_prev(a, kernel, sk, args, s->launch_no);
  s->launch_no++;
  a->launches++; /* the caller's own count: no lock per launch */
  if (rc) return rc;
  if (sk->k->ret != FB_T_VOID) return async_return(s, sk, ret);
  if (ret) memset(ret, 0, sizeof *ret);
  int pending = fb_opt_pending(a->o);
  if (pending >= FB_MAX_PENDING_TASKS ||
      (a->flush_at && pending >= a->flush_at && cut_now(a, s->launch_no)))
    return async_flush(s, 0);
  return 0;
}

int fb_flush(fb_session *s) {
  if (!s) return FB_EINVAL;
  if (!s->as) return 0; /* sync mode: nothing pending */
  s->as->mark = s->launch_no;
  int rc = async_flush(s, 0);
  return rc ? rc : fbe_report_bg(s);
}

int fb_session_drain(fb_session *s) {
  if (!s || !s->as) return 0;
  int rc = fbe_async_wait_all(s);
  if (rc) /* the flush itself failed: keep its error for the next report */
    fbe_bg_record(s, rc, NO_LAUNCH, -1, "%s", s->err);
  return 0;
}

int fb_sync(fb_session *s) {
  if (!s) return FB_EINVAL;
  if (!s->as) return 0;
  int rc = fbe_async_wait_all(s);
  return rc ? rc : fbe_report_bg(s);
}

uint64_t fb_session_test_standins(const fb_session *s) { return s && s->as ? s->as->standins : 0; }

int fb_session_test_bg_peak(const fb_session *s) { return s && s->as ? s->as->nbg_peak : 0; }

uint64_t fb_session_test_lean_batches(const fb_session *s) {
  return s && s->as ? atomic_load(&s->as->lean) : 0;
}

uint64_t fb_session_test_grain_walks(const fb_session *s) {
  return s && s->as ? atomic_load(&s->as->grain_walks) : 0;
}

uint64_t fb_session_test_queue_waits(const fb_session *s) {
  return s && s->as ? atomic_load(&s->as->waits) : 0;
}
