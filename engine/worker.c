/* The async worker's side: background errors (kept, reported at the next
 * sync point), compile planning against the code cache, running a flushed
 * batch in SFG order, and the fallback of a fused task to its unfused parts
 * (no lost work). Runs on the session's ordered worker, or on the caller's
 * thread when the caller would wait anyway. */
#include "engine/internal.h"

/* ---------------------------------------------------------------- async: errors */

/* Keep the first error of the background launches (any thread). */
#if defined(__GNUC__)
__attribute__((format(printf, 5, 6)))
#endif
void fbe_bg_record(fb_session *s, int code, uint64_t launch, int kernel, const char *fmt, ...) {
  async_state *a = s->as;
  pthread_mutex_lock(&a->mu);
  a->tainted = 1;
  if (a->err.code) {
    a->err.more++;
  } else {
    va_list ap;
    va_start(ap, fmt);
    fb_verrf(a->err.msg, sizeof a->err.msg, fmt, ap);
    va_end(ap);
    a->err.code = code;
    a->err.launch = launch;
    a->err.kernel = kernel;
    a->err.more = 0;
  }
  pthread_mutex_unlock(&a->mu);
}

/* The kept error becomes the call's error (0 when there is none). */
int fbe_report_bg(fb_session *s) {
  async_state *a = s->as;
  bg_error e;
  pthread_mutex_lock(&a->mu);
  e = a->err;
  a->err.code = 0;
  pthread_mutex_unlock(&a->mu);
  if (!e.code) return 0;
  if (e.more)
    fail(s, e.code, "%s (and %llu more error%s of background launches)", e.msg,
         (unsigned long long)e.more, e.more == 1 ? "" : "s");
  else fail(s, e.code, "%s", e.msg);
  if (e.launch != NO_LAUNCH) {
    s->err_bg = 1;
    s->err_launch = e.launch;
    s->err_kernel = e.kernel;
  }
  return e.code;
}

/* ---------------------------------------------------------------- async: the worker */

typedef struct batch_run {
  fb_session *s;
  async_job *j;
  uint64_t failed_launch;  /* a launch an error stopped: its other tasks are skipped */
  uint64_t ran, hits;
  double backend_s;
  int cancelled;           /* the task hook cancelled: the rest of the batch is skipped */
  const fb_opt_launch **slot; /* queued device: the entry of each error slot of the batch */
  int dev_rc;                 /* the batch could not start on the device */
  struct fallback *fallbacks; /* fused tasks run as their parts (fall_back) */
  int extra_slots;            /* queued device: slots for those parts past the batch's n + 1 */
} batch_run;

static const launch_rec *launch_of(const async_job *j, uint64_t launch) {
  if (launch < j->base || launch - j->base >= (uint64_t)j->nlaunches) return NULL;
  return &j->launches[launch - j->base];
}

/* Where part p runs in its own launch's kernel ("its 1st top-level loop",
 * blame.c), by its index among that kernel's tasks: the banked IR's name
 * (p->task) is the first equal task's interned, another kernel's when two
 * kernels have the same body, and a task's name is no word of the user's
 * anyway. The IR and its code stay shared; only the launch says whose. */
static const char *part_where(const async_job *j, const fb_opt_part *p, char *buf, size_t n) {
  const launch_rec *lr = launch_of(j, p->launch);
  if (lr && lr->tasks && p->index >= 0 && p->index < lr->ntasks && lr->tasks[p->index])
    return fbe_task_where(lr->tasks, lr->ntasks, p->index, buf, n);
  return fbe_task_kind_where(p->kind, p->k, p->snode, buf, n);
}

/* Part p as the user launched it: "kernel 'k' (launch 7)", and, with
 * `where`, where in k it runs when k has more than one part: "kernel 'k'
 * (launch 7, its 2nd top-level loop)". */
static const char *part_who(const async_job *j, const fb_opt_part *p, int where_too, char *buf,
                            size_t n) {
  const launch_rec *lr = launch_of(j, p->launch);
  char where[FBE_WHERE_MAX];
  if (lr && lr->ntasks > 1 && where_too)
    snprintf(buf, n, "kernel '%s' (launch %llu, %s)", lr->name, (unsigned long long)p->launch,
             part_where(j, p, where, sizeof where));
  else
    snprintf(buf, n, "kernel '%s' (launch %llu)", lr ? lr->name : "?",
             (unsigned long long)p->launch);
  return buf;
}

#define PARTS_MAX 480 /* characters of a list of parts; past it, "and N more" */

/* The parts of L after part `after` (-1: all), but part `skip`, and with
 * `alloc` only those that may take blocks, as part_who says each (with
 * `where`), joined by ", " and cut with "and N more" past about PARTS_MAX
 * characters. buf: at least PARTS_MAX + FBE_WHERE_MAX + 64 bytes. */
static const char *parts_list(const async_job *j, const fb_opt_launch *L, int after, int skip,
                              int alloc, int where, char *buf, size_t n) {
  size_t at = 0;
  int listed = 0, left = 0;
  buf[0] = 0;
  for (int i = after + 1; i < L->nparts; i++) {
    if (i == skip || (alloc && !L->parts[i].alloc)) continue;
    if (at > PARTS_MAX) {
      left++;
      continue;
    }
    char one[FBE_WHERE_MAX + 64];
    int k = snprintf(buf + at, n - at, "%s%s", listed++ ? ", " : "",
                     part_who(j, &L->parts[i], where, one, sizeof one));
    at = k < 0 ? at : at + (size_t)k < n ? at + (size_t)k : n - 1;
  }
  if (left) snprintf(buf + at, n - at, " and %d more", left);
  return buf;
}

/* What task L runs, after "kernel 'k' (launch N): ": where in k for one
 * part ("its 1st top-level loop"); a fused task's first part and the
 * launches fused with it ("its 1st top-level loop fused with kernel 'b'
 * (launch 8)"). buf: at least PARTS_MAX + 2 * FBE_WHERE_MAX + 128 bytes. */
static const char *task_what(const async_job *j, const fb_opt_launch *L, char *buf, size_t n) {
  char where[FBE_WHERE_MAX];
  if (!L->parts || L->nparts < 1)
    return fbe_task_kind_where(L->kind, L->k, L->snode, buf, n);
  part_where(j, &L->parts[0], where, sizeof where);
  if (L->nparts == 1) return snprintf(buf, n, "%s", where), buf;
  char rest[PARTS_MAX + FBE_WHERE_MAX + 64];
  snprintf(buf, n, "%s fused with %s", where, parts_list(j, L, 0, -1, 0, 1, rest, sizeof rest));
  return buf;
}

#define WHAT_MAX (PARTS_MAX + 2 * FBE_WHERE_MAX + 128)

#define SEEN_MAX ((size_t)1 << 15) /* entries; past it the set starts over (it is only a hint) */

static uint64_t seen_key(fb_irh h, const fb_kernel *k) {
  return ((uint64_t)(uint32_t)h << 32) ^ (uint64_t)(uintptr_t)k;
}

static int seen_has(const async_state *a, uint64_t key) {
  return fb_map_get(&a->seen, key) != NULL;
}

static void seen_put(async_state *a, uint64_t key) {
  if (seen_has(a, key)) return;
  if (a->seen.n >= SEEN_MAX) fb_map_free(&a->seen);
  fb_map_put(&a->seen, key, NULL); /* out of memory: a hint less */
}

/* One compile job per distinct IR handle of the batch whose code the
 * caller did not know when it flushed (a table from the handle to its
 * first entry); known code counts once per handle as a cache hit. Jobs for
 * IR the launcher has had compiled before go to the pool only if it waits
 * for them. A batch the caller knew all the code of (a repeating stream's,
 * once compiled) needs no job: no job array is made, and a small batch
 * finds its repeated handles by a scan, not a table (no allocation but
 * `which` per batch on that path).
 *
 * Entries of one handle need not agree on whether their code is known: a
 * demoted task runs a stand-in's code (known) while a task that dead-store
 * elimination reshaped into the same IR has no stand-in (unknown). An
 * entry with known code runs its own (or shares the handle's job); one
 * without never takes an entry's "known" code for its own, which it does
 * not have (that was a call through a NULL pointer): it shares the
 * handle's job, or makes it, and the table then names it, so that later
 * entries of the handle share its job. */
#define SCAN_MAX 16 /* entries up to which repeated handles are found by a scan */

/* The earlier entry of i's handle whose job i may share: one with a job,
 * else the first; -1 for none. */
static int first_scan(const async_job *j, int i) {
  int first = -1;
  for (int k = 0; k < i; k++)
    if (j->b->v[k].ir == j->b->v[i].ir) {
      if (j->which[k] >= 0) return k;
      if (first < 0) first = k;
    }
  return first;
}

static int plan_compiles(batch_run *r) {
  async_job *j = r->j;
  int n = j->b->n, unknown = 0;
  if (j->known_handles >= 0) {
    /* the caller had every entry's code and counted its distinct handles
     * (known_code): no job, no table, no `which` (NULL: every entry's code
     * is j->pre's) */
    r->hits += (uint64_t)j->known_handles;
    atomic_fetch_add(&r->s->as->lean, 1);
    return 0;
  }
  for (int i = 0; i < n; i++) unknown += !j->pre[i].body;
  int scan = n <= SCAN_MAX;
  fb_map first;
  fb_map_init(&first, sizeof(int));
  j->cj = unknown ? calloc((size_t)unknown, sizeof *j->cj) : NULL;
  j->which = malloc(sizeof *j->which * (size_t)n);
  int rc = (j->cj || !unknown) && j->which ? (scan ? 0 : fb_map_reserve(&first, (size_t)n))
                                           : FB_ENOMEM;
  for (int i = 0; !rc && i < n; i++) {
    const fb_opt_launch *L = &j->b->v[i];
    int added = 1, k = scan ? first_scan(j, i) : -1, *f = NULL;
    if (scan) added = k < 0;
    else f = fb_map_put(&first, (uint64_t)(uint32_t)L->ir, &added); /* reserved: never NULL */
    if (!added && !scan) k = *f;
    /* share k's job, or (both known) run its own code; an entry without
       code whose k had known code makes the handle's job below */
    if (!added && (j->pre[i].body || j->which[k] >= 0)) {
      j->which[i] = j->which[k];
      continue;
    }
    if (f) *f = i; /* the handle's first entry, or its first with a job */
    j->which[i] = j->pre[i].body ? -1 : j->ncj++;
    if (j->pre[i].body) {
      r->hits++;
      continue;
    }
    fb_cjob *c = &j->cj[j->which[i]];
    c->task.ir = L->k;
    c->task.loop = L->loop;
    c->task.partition = r->s->partition;
    c->task.pins = r->s->pins;
    c->trace = r->s->trace;
    if (!seen_has(r->s->as, seen_key(L->ir, L->k))) fb_cpool_submit(r->s->e->cpool, c, 1);
  }
  fb_map_free(&first);
  if (!rc && !unknown && scan) atomic_fetch_add(&r->s->as->lean, 1);
  return rc;
}

static void note_seen(batch_run *r) {
  const async_job *j = r->j;
  for (int i = 0; j->which && i < j->b->n; i++)
    if (j->which[i] >= 0 && !j->cj[j->which[i]].rc)
      seen_put(r->s->as, seen_key(j->b->v[i].ir, j->b->v[i].k));
}

/* Parts after p of L that may run out of memory too. */
static int later_allocating(const fb_opt_launch *L, int p) {
  int n = 0;
  for (int i = p + 1; i < L->nparts; i++) n += L->parts[i].alloc != 0;
  return n;
}

/* The part of a (fused) task an error comes from: the part the generated
 * code latched in the blame word (the earliest part whose access went out
 * of bounds or whose block did not fit, codegen/rt/fb_rt.h); for an
 * FB_EBOUNDS no access latched, the one part whose accesses are not all
 * provably in bounds when there is exactly one; otherwise the first part,
 * and *others counts the parts it may also be (0 when the blame is
 * certain). One latched case stays uncertain: out of memory in a parallel
 * task with a later part that also takes blocks. Its iterations ran both
 * parts interleaved on one pool, so the earliest part may have run out on
 * blocks a later part took first, where sync mode, running the earlier
 * launch whole first, names the later launch; *others counts those later
 * parts and *later says so. A device error (a fault the device reports
 * for the whole kernel) has no part: the first, with the count. */
static const fb_opt_part *blamed_part(const fb_opt_launch *L, int rc, int32_t blame, int *others,
                                      int *later) {
  *others = *later = 0;
  if (L->nparts <= 0) return NULL;
  if (L->nparts == 1) return &L->parts[0];
  int p = FB_RT_BLAMED_PART(blame);
  if (p >= 0 && p < L->nparts) {
    if (FB_RT_BLAMED_OOM(blame) && L->loop >= 0) *later = *others = later_allocating(L, p);
    return &L->parts[p];
  }
  if (rc == FB_EBOUNDS) {
    const fb_opt_part *only = NULL;
    int n = 0;
    for (int i = 0; i < L->nparts; i++)
      if (!L->parts[i].inb && !n++) only = &L->parts[i];
    if (n == 1) return only;
  }
  *others = L->nparts - 1;
  return &L->parts[0];
}

/* The session's record of a block that did not fit (fbe_oom_message) when
 * this task's blamed part ran out of memory, or, with no part latched, as
 * before blame words. A part blamed for out of bounds leaves the record to
 * whichever task owns it on a queued device (the first task of the batch
 * that ran out, fb_rt.h); on a device that runs each task at once it is
 * this task's (a later part's), and is dropped so no later error takes it. */
static int oom_of(fb_session *s, int32_t blame, char *buf, size_t len) {
  if (!blame || FB_RT_BLAMED_OOM(blame)) return fbe_oom_message(s, buf, len);
  if (!s->e->ops->queued) fbe_oom_message(s, buf, len);
  return 0;
}

/* A failed task, said as sync mode says it, with the launch number. A
 * fused task names the part the error comes from when that is certain;
 * otherwise that part (or its first), and how many launches it may also
 * be. blame: the task's blame word (0 when none). */
static void task_error(batch_run *r, const fb_opt_launch *L, int rc, int32_t blame,
                       const char *msg) {
  fb_session *s = r->s;
  int others, later;
  const fb_opt_part *p = blamed_part(L, rc, blame, &others, &later);
  uint64_t launch = p ? p->launch : L->launch;
  char where[FBE_WHERE_MAX], list[PARTS_MAX + FBE_WHERE_MAX + 64];
  const char *task = p ? part_where(r->j, p, where, sizeof where)
                       : fbe_task_kind_where(L->kind, L->k, L->snode, where, sizeof where);
  int pi = p ? (int)(p - L->parts) : 0;
  const launch_rec *lr = launch_of(r->j, launch);
  int kid = lr ? lr->kernel : -1;
  char who[ERRLEN];
  if (later == 1)
    snprintf(who, sizeof who,
             "kernel '%s' (launch %llu, or the later launch fused with it, %s, which "
             "also takes blocks from the pool: their iterations ran interleaved)",
             lr ? lr->name : "?", (unsigned long long)launch,
             parts_list(r->j, L, pi, -1, 1, 1, list, sizeof list));
  else if (later)
    snprintf(who, sizeof who,
             "kernel '%s' (launch %llu, or one of the %d later launches fused with it, %s, "
             "which also take blocks from the pool: their iterations ran interleaved)",
             lr ? lr->name : "?", (unsigned long long)launch, later,
             parts_list(r->j, L, pi, -1, 1, 1, list, sizeof list));
  else if (others == 1)
    snprintf(who, sizeof who, "kernel '%s' (launch %llu, or the launch fused with it, %s)",
             lr ? lr->name : "?", (unsigned long long)launch,
             parts_list(r->j, L, -1, pi, 0, 1, list, sizeof list));
  else if (others)
    snprintf(who, sizeof who,
             "kernel '%s' (launch %llu, or one of the %d launches fused with it: %s)",
             lr ? lr->name : "?", (unsigned long long)launch, others,
             parts_list(r->j, L, -1, pi, 0, 1, list, sizeof list));
  else
    snprintf(who, sizeof who, "kernel '%s' (launch %llu)", lr ? lr->name : "?",
             (unsigned long long)launch);
  char oom[512];
  if (oom_of(s, blame, oom, sizeof oom))
    fbe_bg_record(s, FB_EQUOTA, launch, kid, "%s: %s; those accesses were skipped", who, oom);
  else if (msg[0]) fbe_bg_record(s, rc, launch, kid, "%s: %s", who, msg);
  else if (FB_RT_BLAMED_OOM(blame)) /* the record is an earlier task's (a queued device) */
    fbe_bg_record(s, FB_EQUOTA, launch, kid, "%s: %s failed on the device: %s", who, task,
                  fb_strerror(FB_EQUOTA));
  else if (rc == FB_EBOUNDS || blame)
    fbe_bg_record(s, FB_EBOUNDS, launch, kid,
                  "%s indexed a field out of bounds in %s; those accesses "
                  "were skipped",
                  who, task);
  else
    fbe_bg_record(s, rc, launch, kid, "%s: %s failed on the device: %s", who, task,
                  fb_strerror(rc));
}

static void compile_error(batch_run *r, const fb_opt_launch *L, const fb_cjob *c) {
  const launch_rec *lr = launch_of(r->j, L->launch);
  char what[WHAT_MAX];
  int rc = c->rc > 0 ? FB_ECOMPILE : c->rc;
  fbe_bg_record(r->s, rc, L->launch, lr ? lr->kernel : -1,
                "kernel '%s' (launch %llu): compiling %s failed: %s", lr ? lr->name : "?",
                (unsigned long long)L->launch, task_what(r->j, L, what, sizeof what),
                c->msg[0] ? c->msg : fb_strerror(rc));
}

/* ---------------------------------------------------------------- async: no lost work
 *
 * A fused task can fail where its parts would not: its compile (a GPU
 * task's parameters, a compiler's resources) or its launch (registers per
 * thread, the launch's parameter space) is refused because it is large.
 * Such a task did not run at all, so nothing of it is lost by running its
 * parts instead, one by one, exactly as the unfused launches would have
 * run: each part's task IR as inserted, its own arguments and its own
 * launch number. An error a part still hits is reported on that part's
 * launch (the rest of that launch is skipped, as everywhere in a batch);
 * the fallback itself is counted (fb_counters.fuse_fallbacks), not an
 * error. Errors while a task runs (out of bounds, sticky device errors)
 * are not fallen back from: the task ran, and they say so. A task whose
 * activations were demoted (fb_opt_launch.standin) falls back alike, to
 * the task as inserted: its activations are proved no-ops there. */

typedef struct fallback {
  struct fallback *next;
  int n;
  fb_opt_launch v[];       /* one per part; CUDA error slots point here */
} fallback;

static void run_entry(batch_run *r, const fb_opt_launch *L, const fb_rt_task *code,
                      int64_t grain);

/* Every part of L can run alone (the optimizer knew each one's shape). A
 * task that was only demoted and simplified (L->standin) falls back the
 * same way to its one part, the task as inserted. */
static int can_fall_back(const fb_opt_launch *L) {
  if ((L->nparts < 2 && L->standin == FB_IRH_NONE) || L->nparts < 1 || !L->parts) return 0;
  for (int i = 0; i < L->nparts; i++)
    if (!L->parts[i].k) return 0;
  return 1;
}

/* Part p of L as a launch of its own. */
static fb_opt_launch part_launch(const fb_opt_launch *L, int p) {
  const fb_opt_part *pt = &L->parts[p];
  fb_opt_launch P = {
      pt->ir,    pt->k,      pt->kind, pt->loop, pt->snode, L->args ? L->args + pt->argoff : NULL,
      pt->nargs, pt->launch, 1,        pt,       1,         FB_IRH_NONE,
      0};
  return P;
}

/* A queued device: room in r->slot for n more launches than the batch has
 * entries (none is kept for a device that runs each task at once). */
static int more_slots(batch_run *r, int n) {
  if (!r->slot) return 1;
  size_t have = (size_t)r->j->b->n + 1 + (size_t)r->extra_slots;
  const fb_opt_launch **v = realloc(r->slot, sizeof *v * (have + (size_t)n));
  if (!v) return 0;
  memset(v + have, 0, sizeof *v * (size_t)n);
  r->slot = v;
  r->extra_slots += n;
  return 1;
}

/* Run the parts of fused task L, which did not run (its error rc).
 * 0 when L cannot fall back (not fused, or out of memory): the caller
 * reports the fused task's error as before. */
static int fall_back(batch_run *r, const fb_opt_launch *L, int rc) {
  fb_session *s = r->s;
  if (!can_fall_back(L) || !more_slots(r, L->nparts)) return 0;
  fallback *f = calloc(1, sizeof *f + sizeof f->v[0] * (size_t)L->nparts);
  fb_cjob *cj = calloc((size_t)L->nparts, sizeof *cj);
  if (!f || !cj) {
    free(f);
    free(cj);
    return 0;
  }
  f->n = L->nparts;
  f->next = r->fallbacks;
  r->fallbacks = f;
  if (s->trace) {
    char args[64];
    snprintf(args, sizeof args, "{\"parts\":%d,\"code\":%d}", L->nparts, rc);
    double t = fb_trace_clock();
    fb_trace_span(s->trace, FB_TRACK_LAUNCHER, "fallback", L->k->name, t, t, args);
  }
  for (int p = 0; p < L->nparts; p++) {
    fb_opt_launch *P = &f->v[p];
    *P = part_launch(L, p);
    if (P->launch == r->failed_launch) continue;
    fb_cjob *c = &cj[p];
    c->task.ir = P->k;
    c->task.loop = P->loop;
    c->task.partition = s->partition;
    c->task.pins = s->pins;
    c->trace = s->trace;
    fb_cpool_wait(s->e->cpool, c, FB_TRACK_LAUNCHER); /* compiled here */
    if (c->rc) {
      compile_error(r, P, c);
      r->failed_launch = P->launch;
      continue;
    }
    fb_rt_task code = {c->code.body, c->code.bounds, c->code.gpu, c->code.priv};
    run_entry(r, P, &code, -1);
  }
  pthread_mutex_lock(&s->cmu);
  s->c.fuse_fallbacks++;
  for (int p = 0; p < L->nparts; p++)
    if (!cj[p].rc) fbe_count_compile(&s->c, &cj[p].code);
  pthread_mutex_unlock(&s->cmu);
  free(cj);
  return 1;
}

/* A queued device refused fused task L before it was queued (rc < 0);
 * unless the queue is gone (a sticky error), its parts run instead. */
static int launch_refused(batch_run *r, const fb_opt_launch *L, int rc) {
  char dead[ERRLEN];
  if (!can_fall_back(L) || r->s->e->ops->alive(r->s->q, dead, sizeof dead)) return 0;
  return fall_back(r, L, rc);
}

static void free_fallbacks(batch_run *r) {
  while (r->fallbacks) {
    fallback *f = r->fallbacks;
    r->fallbacks = f->next;
    free(f);
  }
}

/* Run one task of the batch on the device; grain: its chunk grain, -1
 * when the caller did not know it (worked out here). */
static void run_entry(batch_run *r, const fb_opt_launch *L, const fb_rt_task *code,
                      int64_t grain) {
  fb_session *s = r->s;
  int32_t error[2] = {0, 0}; /* the error and the blame word (fb_rt.h) */
  fb_rt_ctx ctx = {s->mem.root, L->args ? L->args : no_args,
                   s->mem.rets, s->mem.gtmp,
                   error,       s->seed,
                   L->launch,   s->sparse ? fb_sparse_state(s->sparse) : NULL,
                   NULL};
  fb_rt_task rt = {code->body, L->loop >= 0 ? code->bounds : NULL, code->gpu, code->priv};
  int lg = L->kind == FB_TASK_LISTGEN;
  if (!lg && grain < 0) {
    grain = fbe_task_grain(L->k, L->loop);
    atomic_fetch_add_explicit(&s->as->grain_walks, 1, memory_order_relaxed);
  }
  fb_rt_hint hint = {lg ? L->snode : 0, lg ? 1 : grain};
  double secs = 0, t0 = s->trace ? fb_trace_clock() : 0;
  char msg[ERRLEN];
  msg[0] = 0;
  int slot = -1;
  int rc = r->dev_rc ? r->dev_rc
                     : s->e->ops->launch(s->q, &ctx, &rt, &hint, s->sparse, &slot, &secs, msg,
                                         sizeof msg);
  if (slot >= 0) { /* queued: its error slot is read when the batch finishes */
    r->slot[slot] = L;
  } else if (rc && s->e->ops->queued) { /* refused before it was queued */
    if (!r->dev_rc && launch_refused(r, L, rc)) return;
    if (!msg[0]) fb_errf(msg, sizeof msg, "the GPU batch did not start: %s", fb_strerror(rc));
  }
  if (s->trace) {
    char args[128]; /* priv: atomics privatized (codegen/priv.c) */
    snprintf(args, sizeof args, "{\"launch\":%llu,\"tasks\":%d,\"priv\":%lld}",
             (unsigned long long)L->launch, L->ntasks, (long long)code->priv.sites);
    fb_trace_span(s->trace, FB_TRACK_DEVICE, "task", L->k->name, t0, fb_trace_clock(), args);
  }
  r->ran++;
  r->backend_s += secs;
  if (!rc) return;
  task_error(r, L, rc, error[1], msg);
  if (msg[0] || (rc != FB_EBOUNDS && rc != FB_EQUOTA)) r->failed_launch = L->launch;
}

/* The task hook before entry L: 1 when it cancels (then the first skipped
 * launch is reported and nothing after it in the batch runs). */
static int hook_cancels(batch_run *r, const fb_opt_launch *L) {
  fb_session *s = r->s;
  if (r->cancelled) return 1;
  if (!s->hook) return 0;
  const launch_rec *lr = launch_of(r->j, L->launch);
  /* the hook's task: the kernel's name, as sync mode gives it, or a fused
   * task's launches ("kernel 'a' (launch 7) fused with kernel 'b' (launch
   * 8)"): what fuseboxd's kernel_timeout_s message names (launches only:
   * this runs before every task) */
  const char *kernel = lr ? lr->name : "?";
  const char *task = kernel;
  char fused[PARTS_MAX + 2 * FBE_WHERE_MAX + 128], one[FBE_WHERE_MAX + 64], rest[sizeof fused];
  if (L->parts && L->nparts > 1) {
    snprintf(fused, sizeof fused, "%s fused with %s",
             part_who(r->j, &L->parts[0], 0, one, sizeof one),
             parts_list(r->j, L, 0, -1, 0, 0, rest, sizeof rest));
    task = fused;
  }
  if (!s->hook(s->hook_user, kernel, task, L->launch)) return 0;
  s->hook(s->hook_user, NULL, NULL, L->launch);
  r->cancelled = 1;
  char what[WHAT_MAX];
  fbe_bg_record(s, FB_ECANCELLED, L->launch, lr ? lr->kernel : -1,
                "kernel '%s' (launch %llu): "
                "cancelled before %s ran; it and the later work of flush %llu was skipped",
                kernel, (unsigned long long)L->launch, task_what(r->j, L, what, sizeof what),
                (unsigned long long)r->j->flush);
  return 1;
}

/* Entry i: wait for its code (or compile it here), then run it. */
static void run_one(batch_run *r, int i) {
  fb_session *s = r->s;
  async_job *j = r->j;
  const fb_opt_launch *L = &j->b->v[i];
  if (hook_cancels(r, L)) return;
  if (!j->which || j->which[i] < 0) {
    if (L->launch != r->failed_launch) run_entry(r, L, &j->pre[i], j->grain ? j->grain[i] : -1);
    if (s->hook) s->hook(s->hook_user, NULL, NULL, L->launch);
    return;
  }
  fb_cjob *c = &j->cj[j->which[i]];
  double t0 = s->trace ? fb_trace_clock() : 0;
  fb_cpool_wait(s->e->cpool, c, FB_TRACK_LAUNCHER);
  if (s->trace) {
    double t1 = fb_trace_clock();
    char name[160];
    snprintf(name, sizeof name, "code for %s", L->k->name);
    if (t1 - t0 > 2e-6) fb_trace_span(s->trace, FB_TRACK_LAUNCHER, "wait", name, t0, t1, NULL);
  }
  if (L->launch == r->failed_launch) return;
  if (c->rc) {
    if (fall_back(r, L, c->rc)) return;
    compile_error(r, L, c);
    r->failed_launch = L->launch;
    return;
  }
  fb_rt_task code = {c->code.body, c->code.bounds, c->code.gpu, c->code.priv};
  run_entry(r, L, &code, -1);
  if (s->hook) s->hook(s->hook_user, NULL, NULL, L->launch);
}

static void add_batch_counters(batch_run *r) {
  fb_session *s = r->s;
  pthread_mutex_lock(&s->cmu);
  for (int i = 0; i < r->j->ncj; i++) {
    const fb_cjob *c = &r->j->cj[i];
    if (!c->rc) fbe_count_compile(&s->c, &c->code);
  }
  s->c.cache_hits += r->hits;
  s->c.tasks_launched += r->ran;
  s->c.backend_s += r->backend_s;
  s->dev_bytes = fb_devmem_used(&s->mem);
  pthread_mutex_unlock(&s->cmu);
}

/* On a queued device (CUDA) a batch's tasks are queued on the session's
 * stream as their code is ready; its end waits for them and reads each
 * one's error slot. A device that runs each task at once has none. */
static void batch_begin(batch_run *r) {
  char msg[ERRLEN];
  const fb_device_ops *ops = r->s->e->ops;
  if (ops->queued) r->slot = calloc((size_t)r->j->b->n + 1, sizeof *r->slot);
  int oom = ops->queued && !r->slot;
  r->dev_rc = oom ? FB_ENOMEM : ops->begin(r->s->q, msg, sizeof msg);
  if (r->dev_rc)
    fbe_bg_record(r->s, r->dev_rc, NO_LAUNCH, -1, "flush %llu: %s; its %d tasks did not run",
                  (unsigned long long)r->j->flush, oom ? "out of memory" : msg, r->j->b->n);
}

static void batch_end(batch_run *r) {
  char msg[ERRLEN];
  const int32_t *errs = NULL;
  int n = 0;
  double secs = 0;
  int rc = r->dev_rc ? 0 : r->s->e->ops->finish(r->s->q, &errs, &n, &secs, msg, sizeof msg);
  if (rc)
    fbe_bg_record(r->s, rc, NO_LAUNCH, -1, "flush %llu: %s", (unsigned long long)r->j->flush, msg);
  for (int i = 0; i < n && i < r->j->b->n + r->extra_slots; i++)
    if (errs[2 * i] && r->slot[i]) task_error(r, r->slot[i], errs[2 * i], errs[2 * i + 1], "");
  /* a record no report took is a task's of this batch blamed on out of
   * bounds (oom_of): drop it, so the next batch's first task to run out
   * owns the record afresh (slots are reused) */
  char stale[512];
  fbe_oom_message(r->s, stale, sizeof stale);
  r->backend_s += secs;
  free(r->slot);
  r->slot = NULL;
}

/* One flushed batch: compile jobs to the pool, then the tasks in order.
 * Return slots start at zero (a kernel with a return value is always the
 * last launch of its batch). */
/* A batch optimized while an earlier flush was still running, taking that
 * flush's lists or activations as made (fb_opt_counters.retained_proofs),
 * when that flush then stopped early: run as optimized it could read a
 * stale list or skip an activation. It is not run, and says so (the
 * caller has forgotten what the optimizer kept, for the next windows). */
static int optimized_against_bad(fb_session *s, async_job *j) {
  uint64_t bad = atomic_load(&s->as->bad_flush);
  if (bad <= j->basis) return 0;
  const launch_rec *lr = j->nlaunches ? &j->launches[0] : NULL;
  fbe_bg_record(s, FB_ECANCELLED, lr ? j->base : NO_LAUNCH, lr ? lr->kernel : -1,
                "flush %llu (launches %llu..%llu) was skipped: it was optimized against the "
                "lists and activations of flush %llu, which stopped early",
                (unsigned long long)j->flush, (unsigned long long)j->base,
                (unsigned long long)(j->base + (uint64_t)(j->nlaunches ? j->nlaunches - 1 : 0)),
                (unsigned long long)bad);
  return 1;
}

void fbe_run_batch(fb_session *s, async_job *j) {
  batch_run r = {s, j, NO_LAUNCH, 0, 0, 0, 0, NULL, 0, NULL, 0};
  double t0 = s->trace ? fb_trace_clock() : 0; /* a clock read costs 0.2 us on a VM */
  if (optimized_against_bad(s, j)) {
    fbe_note_bad(s->as, j->flush);
    free(j->which);
    j->which = NULL; /* nothing for the caller to learn from it */
  } else if (plan_compiles(&r)) {
    fbe_note_bad(s->as, j->flush);
    fbe_bg_record(s, FB_ENOMEM, NO_LAUNCH, -1,
                  "flush %llu: out of memory starting its %d tasks; "
                  "they did not run",
                  (unsigned long long)j->flush, j->b->n);
    free(j->which);
    j->which = NULL; /* nothing for the caller to learn from it */
  } else {
    char cerr[512]; /* a device that fails this fails the batch's launches too */
    (void)fb_devmem_clear_rets(&s->mem, cerr, sizeof cerr);
    if (s->sparse) fb_sparse_begin(s->sparse);
    batch_begin(&r);
    for (int i = 0; i < j->b->n; i++) run_one(&r, i);
    /* cancelled: the skipped tasks' compile jobs must leave the pool before
     * the batch is freed; those never compiled must not be learned */
    for (int c = 0; r.cancelled && c < j->ncj; c++)
      if (fb_cpool_withdraw(s->e->cpool, &j->cj[c])) j->cj[c].rc = FB_ECANCELLED;
    batch_end(&r);
    free_fallbacks(&r);
    if (s->sparse) fb_sparse_end(s->sparse);
    add_batch_counters(&r);
    note_seen(&r);
    /* a task was skipped: the optimizer took it as run */
    if (r.cancelled || r.dev_rc || r.failed_launch != NO_LAUNCH) fbe_note_bad(s->as, j->flush);
  }
  atomic_store(&s->as->ran_upto, j->flush);
  if (s->trace) {
    char name[64], args[96];
    snprintf(name, sizeof name, "flush %llu", (unsigned long long)j->flush);
    snprintf(args, sizeof args, "{\"tasks\":%d,\"compile_jobs\":%d}", j->b->n, j->ncj);
    fb_trace_span(s->trace, FB_TRACK_LAUNCHER, "batch", name, t0, fb_trace_clock(), args);
  }
}

void fbe_worker_run(void *user, fb_ordq_item *it) {
  fb_session *s = user;
  async_job *j = (async_job *)it;
  fbe_run_batch(s, j);
  pthread_mutex_lock(&s->as->mu);
  j->done_next = s->as->done;
  s->as->done = j;
  pthread_cond_signal(&s->as->done_cv);
  pthread_mutex_unlock(&s->as->mu);
}
