/* The fair scheduler between tenants, and per-tenant compile concurrency.
 *
 * Every job a session runs on its engine (a register, a batch of launches,
 * a field transfer) passes a gate in the broker first: the session thread
 * calls fbd_sched_enter before handing the job to its worker (process or
 * thread) and fbd_sched_leave after the reply.
 *
 * Fair share. Each tenant has a virtual time: the device time its jobs
 * used, divided by its weight (time_share in the tenants file, default 1).
 * Time is charged as a share of the machine: while R jobs run at once,
 * each is charged 1/R of the wall time. A tenant is "active" while it has
 * a job running or waiting at the gate. Let m be the smallest virtual time
 * of the active tenants: a tenant whose virtual time is more than one
 * slice (fair_slice_ms) above m is held back:
 *  - its next jobs wait at the gate (so its requests stay queued in the
 *    broker, where the session queues' bounds hold its stream back);
 *  - its running jobs are paused: the watch page's hold flag stops them at
 *    their next task boundary (both isolation modes), and under process
 *    isolation the worker is also stopped at once with SIGSTOP (sent
 *    through a pidfd, so never to a reused pid) and continued with SIGCONT.
 * A virtual clock follows m (and never goes back). A tenant that becomes
 * active again starts at most two slices below the clock (so a light
 * tenant's request runs ahead of a flooding one, which is paused for it)
 * and at most one slice above it (time used while nobody else wanted the
 * machine is not held against it for long). With one active tenant
 * nothing is ever held: the scheduler is work-conserving.
 *
 * Compile concurrency. A tenant has at most max_compiles RegisterKernels
 * running (default 2; 0: no limit); more wait at the gate, in order of
 * arrival per session. Waiting at either gate ends early for a session
 * that is cancelled or ends (its job then runs cancelled, or not at all).
 *
 * Without a tenants file every session is the one anonymous tenant: the
 * scheduler then only measures (latency histograms). */
#define _GNU_SOURCE
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/strbuf.h"
#include "server/server.h"

#define NBUCKETS 17
static const double bucket_le[NBUCKETS] = {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005,
                                           0.01,   0.025,   0.05,   0.1,   0.25,   0.5,
                                           1,      2.5,     5,      10,    30};

typedef struct hist {
  uint64_t b[NBUCKETS + 1]; /* the last: above every bound (+Inf only) */
  uint64_t n;
  double sum;
} hist;

/* One tenant's state (never freed while the server runs: sessions keep a
 * pointer). Under sched.mu. */
struct fbd_share {
  fbd_tenant *t;            /* NULL: the anonymous tenant */
  double vtime;             /* weighted device seconds */
  int nrun, nwait;          /* jobs running (paused ones too), waiting at the fair gate */
  int ncomp, ncomp_wait;    /* RegisterKernels running, waiting for a compile slot */
  int comp_peak;
  uint64_t compiles, comp_waited, paused, held_jobs;
  double held_s, device_s;
  hist sync, compile;
};

struct fbd_sched {
  pthread_mutex_t mu;
  pthread_cond_t cv;        /* gates and the ticker wait here */
  int on;                   /* fair_share on */
  double slice;
  int stop;
  pthread_t ticker;
  int ticking;
  struct fbd_share **v;
  int n, cap;
  fbd_run *running;         /* every job between enter and leave */
  double vclock;            /* the least virtual time of the active tenants, never going back */
};

static double wall(void) { return fbd_now(); }

/* ---------------------------------------------------------------- shares */

static int weight(const struct fbd_share *sh) {
  int w = sh->t ? atomic_load(&sh->t->time_share) : 1;
  return w > 0 ? w : 1;
}

static int compile_limit(const struct fbd_share *sh) {
  return sh->t ? atomic_load(&sh->t->max_compiles) : 0;
}

static struct fbd_share *share_of(struct fbd_sched *sc, fbd_tenant *t) {
  for (int i = 0; i < sc->n; i++)
    if (sc->v[i]->t == t) return sc->v[i];
  if (sc->n == sc->cap) {
    int nc = sc->cap ? 2 * sc->cap : 16;
    struct fbd_share **nv = realloc(sc->v, sizeof *nv * (size_t)nc);
    if (!nv) return NULL;
    sc->v = nv;
    sc->cap = nc;
  }
  struct fbd_share *sh = calloc(1, sizeof *sh);
  if (!sh) return NULL;
  sh->t = t;
  sc->v[sc->n++] = sh;
  return sh;
}

static int active(const struct fbd_share *sh) { return sh->nrun > 0 || sh->nwait > 0; }

/* The smallest virtual time of the active tenants other than skip; 0 with
 * *any = 0 when there is none. */
static double min_vtime(struct fbd_sched *sc, const struct fbd_share *skip, int *any) {
  double m = 0;
  *any = 0;
  for (int i = 0; i < sc->n; i++) {
    struct fbd_share *sh = sc->v[i];
    if (sh == skip || !active(sh)) continue;
    if (!*any || sh->vtime < m) m = sh->vtime;
    *any = 1;
  }
  return m;
}

/* sh is about to become active: bound how far its past counts, against
 * the virtual clock (where the least served active tenant has got to). */
static void activate(struct fbd_sched *sc, struct fbd_share *sh) {
  if (sh->vtime < sc->vclock - 2 * sc->slice) sh->vtime = sc->vclock - 2 * sc->slice;
  if (sh->vtime > sc->vclock + sc->slice) sh->vtime = sc->vclock + sc->slice;
}

static int held(struct fbd_sched *sc, const struct fbd_share *sh) {
  if (!sc->on) return 0;
  int any;
  double m = min_vtime(sc, NULL, &any);
  return any && sh->vtime > m + sc->slice;
}

/* ---------------------------------------------------------------- pausing */

static void pause_run(fbd_run *r, double now) {
  fbd_session *s = r->s;
  if (s->watch) atomic_store(&s->watch->hold, 1);
  s->srv->ops->signal(s, SIGSTOP);
  r->paused = 1;
  r->paused_at = now;
  r->sh->paused++;
}

static void resume_run(fbd_run *r, double now) {
  fbd_session *s = r->s;
  s->srv->ops->signal(s, SIGCONT);
  if (s->watch) atomic_store(&s->watch->hold, 0);
  r->paused = 0;
  r->held_s += now - r->paused_at;
  r->sh->held_s += now - r->paused_at;
}

/* Charge the running jobs up to now, then pause the jobs of held tenants and
 * resume the others. Under sc->mu. */
static void evaluate(struct fbd_sched *sc, double now) {
  int nrunning = 0;
  for (fbd_run *r = sc->running; r; r = r->next)
    if (!r->paused) nrunning++;
  for (fbd_run *r = sc->running; r; r = r->next) {
    if (r->paused) continue;
    double dt = now - r->last;
    if (dt > 0) {
      r->sh->device_s += dt / nrunning;
      r->sh->vtime += dt / nrunning / weight(r->sh);
    }
    r->last = now;
  }
  int any;
  double m = min_vtime(sc, NULL, &any);
  if (any && m > sc->vclock) sc->vclock = m;
  for (fbd_run *r = sc->running; r; r = r->next) {
    int h = !r->exempt && held(sc, r->sh);
    if (h && !r->paused) pause_run(r, now);
    else if (!h && r->paused) {
      resume_run(r, now);
      r->last = now;
    }
  }
}

/* Wait on sc->cv (sc->mu held) for at most step seconds. */
static void wait_step(struct fbd_sched *sc, double step) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  ts.tv_nsec += (long)(step * 1e9);
  ts.tv_sec += ts.tv_nsec / 1000000000L;
  ts.tv_nsec %= 1000000000L;
  pthread_cond_timedwait(&sc->cv, &sc->mu, &ts);
}

/* Two or more active tenants: the ticker charges and re-decides every half
 * slice, so that a running tenant that pulls ahead is paused in time. */
static void *ticker_main(void *arg) {
  struct fbd_sched *sc = arg;
  pthread_mutex_lock(&sc->mu);
  while (!sc->stop) {
    int nact = 0;
    for (int i = 0; i < sc->n; i++) nact += active(sc->v[i]);
    if (nact >= 2 && sc->running) {
      evaluate(sc, wall());
      pthread_cond_broadcast(&sc->cv);
      wait_step(sc, sc->slice / 2);
    } else {
      pthread_cond_wait(&sc->cv, &sc->mu);
    }
  }
  pthread_mutex_unlock(&sc->mu);
  return NULL;
}

/* ---------------------------------------------------------------- the gates */

/* The session's next job will run cancelled, or the session is ending:
 * waiting for the gate serves nobody. */
static int cancelled(fbd_session *s) {
  pthread_mutex_lock(&s->mu);
  int c = s->cancel_upto >= s->done + 1 || s->abort_at > 0;
  pthread_mutex_unlock(&s->mu);
  return c;
}

void fbd_sched_enter(fbd_session *s, int kind, fbd_run *r) {
  struct fbd_sched *sc = s->srv->sched;
  memset(r, 0, sizeof *r);
  r->s = s;
  if (!sc) return;
  double t0 = wall();
  pthread_mutex_lock(&sc->mu);
  if (!s->share) s->share = share_of(sc, atomic_load(&s->owner));
  struct fbd_share *sh = s->share;
  if (!sh) { /* out of memory: run unscheduled */
    pthread_mutex_unlock(&sc->mu);
    return;
  }
  r->sh = sh;
  if (kind == FBD_J_REGISTER) {
    int waited = 0;
    sh->ncomp_wait++;
    for (;;) {
      int lim = compile_limit(sh);
      if (!lim || sh->ncomp < lim) break;
      pthread_mutex_unlock(&sc->mu);
      int c = cancelled(s);
      pthread_mutex_lock(&sc->mu);
      if (c) break;
      waited = 1;
      wait_step(sc, 0.05);
    }
    sh->ncomp_wait--;
    sh->ncomp++;
    if (sh->ncomp > sh->comp_peak) sh->comp_peak = sh->ncomp;
    sh->compiles++;
    sh->comp_waited += waited;
    r->compile = 1;
  }
  if (!active(sh)) activate(sc, sh);
  sh->nwait++;
  double now = wall();
  evaluate(sc, now);
  int waited = 0;
  while (held(sc, sh)) {
    if (!waited) pthread_cond_broadcast(&sc->cv); /* the ticker: a tenant waits */
    pthread_mutex_unlock(&sc->mu);
    int c = cancelled(s);
    pthread_mutex_lock(&sc->mu);
    if (c) break;
    waited = 1;
    wait_step(sc, sc->slice / 2);
    evaluate(sc, wall());
  }
  sh->nwait--;
  sh->nrun++;
  now = wall();
  if (waited) {
    sh->held_s += now - t0;
    sh->held_jobs++;
  }
  r->last = now;
  r->started = now;
  r->next = sc->running;
  sc->running = r;
  s->run = r;
  evaluate(sc, now); /* this tenant's start may hold another one now */
  pthread_cond_broadcast(&sc->cv);
  pthread_mutex_unlock(&sc->mu);
}

static void observe(hist *h, double v) {
  int i = 0;
  while (i < NBUCKETS && v > bucket_le[i]) i++;
  h->b[i]++;
  h->n++;
  h->sum += v;
}

void fbd_sched_leave(fbd_session *s, fbd_run *r, int kind, int sync, double posted_at) {
  struct fbd_sched *sc = s->srv->sched;
  if (!sc || !r->sh) return;
  struct fbd_share *sh = r->sh;
  double now = wall();
  pthread_mutex_lock(&sc->mu);
  evaluate(sc, now); /* charge this job to now */
  if (r->paused) resume_run(r, now);
  for (fbd_run **p = &sc->running; *p; p = &(*p)->next)
    if (*p == r) {
      *p = r->next;
      break;
    }
  s->run = NULL;
  sh->nrun--;
  if (r->compile) {
    sh->ncomp--;
    observe(&sh->compile, now - r->started - r->held_s);
  }
  if (kind == FBD_J_BATCH && sync && posted_at > 0) observe(&sh->sync, now - posted_at);
  evaluate(sc, now); /* a held tenant may go on */
  pthread_cond_broadcast(&sc->cv);
  pthread_mutex_unlock(&sc->mu);
}

void fbd_sched_kick(fbd_session *s) {
  struct fbd_sched *sc = s->srv->sched;
  if (!sc) return;
  pthread_mutex_lock(&sc->mu);
  fbd_run *r = s->run;
  if (r) {
    r->exempt = 1; /* a cancelled or ending job must reach its task boundary */
    if (r->paused) resume_run(r, wall());
  }
  pthread_cond_broadcast(&sc->cv);
  pthread_mutex_unlock(&sc->mu);
}

double fbd_sched_held(fbd_session *s) {
  struct fbd_sched *sc = s->srv->sched;
  if (!sc) return 0;
  pthread_mutex_lock(&sc->mu);
  fbd_run *r = s->run;
  double h = r ? r->held_s + (r->paused ? wall() - r->paused_at : 0) : 0;
  pthread_mutex_unlock(&sc->mu);
  return h;
}

/* ---------------------------------------------------------------- start, stop */

int fbd_sched_start(fbd_server *srv, char *err, size_t errlen) {
  struct fbd_sched *sc = calloc(1, sizeof *sc);
  if (!sc) return FB_ENOMEM;
  pthread_mutex_init(&sc->mu, NULL);
  pthread_cond_init(&sc->cv, NULL);
  sc->on = fbd_fair_share_on(srv->cfg);
  sc->slice = srv->cfg->fair_slice_ms * 1e-3;
  if (sc->slice <= 0) sc->slice = 0.01;
  srv->sched = sc;
  if (pthread_create(&sc->ticker, NULL, ticker_main, sc)) {
    fb_errf(err, errlen, "cannot start the scheduler's thread");
    return FB_EINTERNAL;
  }
  sc->ticking = 1;
  return 0;
}

void fbd_sched_stop(fbd_server *srv) {
  struct fbd_sched *sc = srv->sched;
  if (!sc) return;
  if (sc->ticking) {
    pthread_mutex_lock(&sc->mu);
    sc->stop = 1;
    pthread_cond_broadcast(&sc->cv);
    pthread_mutex_unlock(&sc->mu);
    pthread_join(sc->ticker, NULL);
  }
  for (int i = 0; i < sc->n; i++) free(sc->v[i]);
  free(sc->v);
  pthread_mutex_destroy(&sc->mu);
  pthread_cond_destroy(&sc->cv);
  free(sc);
  srv->sched = NULL;
}

/* ---------------------------------------------------------------- metrics */

static void hist_text(fb_sb *b, const char *name, const char *tenant, const hist *h) {
  uint64_t cum = 0;
  for (int i = 0; i < NBUCKETS; i++) {
    cum += h->b[i];
    fb_sb_printf(b, "fusebox_%s_bucket{tenant=\"%s\",le=\"%g\"} %llu\n", name, tenant, bucket_le[i],
        (unsigned long long)cum);
  }
  fb_sb_printf(b, "fusebox_%s_bucket{tenant=\"%s\",le=\"+Inf\"} %llu\n", name, tenant,
      (unsigned long long)h->n);
  fb_sb_printf(b, "fusebox_%s_sum{tenant=\"%s\"} %.9g\n", name, tenant, h->sum);
  fb_sb_printf(b, "fusebox_%s_count{tenant=\"%s\"} %llu\n", name, tenant, (unsigned long long)h->n);
}

/* Requests queued in the sessions of each share (their session queues). */
static void queued_by_share(fbd_server *srv, struct fbd_share **v, int n, uint64_t *out) {
  pthread_mutex_lock(&srv->mu);
  for (int k = 0; k < srv->cfg->max_sessions; k++) {
    fbd_session *s = srv->sessions[k];
    if (!s) continue;
    fbd_tenant *o = atomic_load(&s->owner);
    pthread_mutex_lock(&s->mu);
    int d = s->depth;
    pthread_mutex_unlock(&s->mu);
    for (int i = 0; i < n; i++)
      if (v[i]->t == o) out[i] += (uint64_t)d;
  }
  pthread_mutex_unlock(&srv->mu);
}

char *fbd_sched_metrics(fbd_server *srv) {
  struct fbd_sched *sc = srv->sched;
  fb_sb b = {0};
  if (!sc) return calloc(1, 1);
  /* every tenant of the file shows, whether or not it ran anything yet */
  fbd_auth *a = srv->auth;
  fbd_tenant **known = NULL;
  int nknown = 0;
  if (a && a->enabled) {
    pthread_mutex_lock(&a->mu);
    if ((known = calloc((size_t)a->n + 1, sizeof *known))) {
      nknown = a->n;
      memcpy(known, a->t, sizeof *known * (size_t)nknown);
    }
    pthread_mutex_unlock(&a->mu);
  }
  pthread_mutex_lock(&sc->mu);
  for (int i = 0; i < nknown; i++) share_of(sc, known[i]);
  free(known);
  evaluate(sc, wall());
  int n = sc->n;
  struct fbd_share *v = calloc((size_t)n + 1, sizeof *v),
                   **ptr = calloc((size_t)n + 1, sizeof *ptr);
  int *w = calloc((size_t)n + 1, sizeof *w), *lim = calloc((size_t)n + 1, sizeof *lim);
  for (int i = 0; v && ptr && w && lim && i < n; i++) {
    v[i] = *sc->v[i];
    ptr[i] = sc->v[i];
    w[i] = weight(sc->v[i]);
    lim[i] = compile_limit(sc->v[i]);
    for (fbd_run *r = sc->running; r; r = r->next) /* the pause going on counts too */
      if (r->sh == sc->v[i] && r->paused) v[i].held_s += wall() - r->paused_at;
  }
  int on = sc->on;
  double slice = sc->slice;
  pthread_mutex_unlock(&sc->mu);
  uint64_t *queued = calloc((size_t)n + 1, sizeof *queued);
  if (!v || !ptr || !w || !lim || !queued) {
    b.oom = 1;
    goto out;
  }
  queued_by_share(srv, ptr, n, queued);
  fb_sb_printf(&b,
      "# HELP fusebox_fair_share 1 when the fair scheduler holds back tenants over their "
      "share (--fair-share on).\n# TYPE fusebox_fair_share gauge\nfusebox_fair_share %d\n",
      on);
  fb_sb_printf(&b,
      "# HELP fusebox_fair_slice_seconds How far a tenant may run ahead of the least served "
      "active one.\n# TYPE fusebox_fair_slice_seconds gauge\nfusebox_fair_slice_seconds %g\n",
      slice);
  /* "" names the anonymous tenant (no tenants file): every session */
#define NAME(i) (v[i].t ? v[i].t->name : "")
  fb_sb_printf(&b, "# HELP fusebox_tenant_sync_latency_seconds From a sync request's arrival to its "
          "result.\n# TYPE fusebox_tenant_sync_latency_seconds histogram\n");
  for (int i = 0; i < n; i++) hist_text(&b, "tenant_sync_latency_seconds", NAME(i), &v[i].sync);
  fb_sb_printf(&b, "# HELP fusebox_tenant_compile_seconds Time a RegisterKernels ran (not waiting).\n"
          "# TYPE fusebox_tenant_compile_seconds histogram\n");
  for (int i = 0; i < n; i++) hist_text(&b, "tenant_compile_seconds", NAME(i), &v[i].compile);
  static const struct {
    const char *name, *type, *help;
  } m[] = {
      {"tenant_time_share", "gauge", "The tenant's weight (time_share)."},
      {"tenant_device_seconds_total", "counter",
       "Device time the tenant's jobs used (a job "
       "running beside others is charged its part)."},
      {"tenant_sched_queued", "gauge", "Requests queued in the tenant's sessions."},
      {"tenant_sched_waiting", "gauge",
       "Jobs of the tenant waiting at the scheduler (for its "
       "share or a compile slot)."},
      {"tenant_sched_held_seconds_total", "counter",
       "Time the tenant's jobs were held back "
       "(waiting for their share, or paused)."},
      {"tenant_sched_held_jobs_total", "counter", "Jobs that waited for the tenant's share."},
      {"tenant_sched_paused_total", "counter", "Times a running job of the tenant was paused."},
      {"tenant_max_compiles", "gauge", "The tenant's max_compiles (0: no limit)."},
      {"tenant_compiles_total", "counter", "RegisterKernels the tenant ran."},
      {"tenant_compiles_in_flight", "gauge", "RegisterKernels of the tenant running now."},
      {"tenant_compiles_in_flight_peak", "gauge",
       "Most RegisterKernels of the tenant running "
       "at once since start."},
      {"tenant_compile_waits_total", "counter",
       "RegisterKernels that waited for a compile "
       "slot."},
  };
  for (size_t j = 0; j < sizeof m / sizeof m[0]; j++) {
    fb_sb_printf(&b, "# HELP fusebox_%s %s\n# TYPE fusebox_%s %s\n", m[j].name, m[j].help, m[j].name,
        m[j].type);
    for (int i = 0; i < n; i++) {
      double x = 0;
      switch (j) {
      case 0: x = w[i]; break;
      case 1: x = v[i].device_s; break;
      case 2: x = (double)queued[i]; break;
      case 3: x = v[i].nwait + v[i].ncomp_wait; break;
      case 4: x = v[i].held_s; break;
      case 5: x = (double)v[i].held_jobs; break;
      case 6: x = (double)v[i].paused; break;
      case 7: x = lim[i]; break;
      case 8: x = (double)v[i].compiles; break;
      case 9: x = v[i].ncomp; break;
      case 10: x = v[i].comp_peak; break;
      default: x = (double)v[i].comp_waited; break;
      }
      fb_sb_printf(&b, "fusebox_%s{tenant=\"%s\"} %.9g\n", m[j].name, NAME(i), x);
    }
  }
#undef NAME
out:
  free(v);
  free(ptr);
  free(w);
  free(lim);
  free(queued);
  if (b.oom) {
    free(b.p);
    return NULL;
  }
  return b.p ? b.p : calloc(1, 1);
}
