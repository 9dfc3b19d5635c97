/* fuseboxd sessions: the table (ids are 128-bit random hex, so one client
 * cannot guess another's), the ordered job queue and the session thread of
 * each session, how a session ends (closed, disconnected, reaped, shutdown,
 * failed creation, a crashed or timed-out worker, aborted) and the idle
 * reaper. The session thread hands each job to the engine side (exec.c): in
 * this process under thread isolation, in the session's worker process
 * (session/proc.c) under process isolation; and turns the reply into the call's
 * messages and status. */
#include <sched.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "server/server.h"

#define RECV_HIGH 32 /* stream messages queued before the stream stops receiving */
#define RECV_LOW 8   /* ... and resumes */
#define SEND_HIGH 16 /* responses waiting to go out before the stream stops receiving */
#define SEND_LOW                                                                                   \
  2   /* ... and resumes: a client that does not read its results
                      * is held back by gRPC's flow control, not buffered for */
#define STAGE_KEEP_S 2.0 /* an unused staging buffer is freed after this */

static const char *const end_names[] = {"closed", "disconnected", "reaped",    "shut down",
                                        "failed", "crashed",      "timed out", "cancelled",
                                        "drained"};

/* ---------------------------------------------------------------- jobs */

fbd_job *fbd_job_new(int kind, fbd_call *call) {
  fbd_job *j = calloc(1, sizeof *j);
  if (!j) return NULL;
  j->kind = kind;
  j->call = call;
  j->raw = grpc_empty_slice();
  j->buf.fd = -1;
  if (call) fbd_call_ref(call);
  fbp_arena_init(&j->arena);
  return j;
}

void fbd_job_free(fbd_job *j) {
  if (!j) return;
  if (j->call) fbd_call_unref(j->call);
  fbp_arena_free(&j->arena);
  grpc_slice_unref(j->raw);
  fbd_stage_free(&j->buf);
  if (j->wait) fbd_ckpt_wait_done(j->wait, FB_ENOENT, NULL, "the session ended first");
  fbd_ckpt_end(j->ck);
  free(j);
}

/* ---------------------------------------------------------------- lifetime */

void fbd_session_ref(fbd_session *s) { atomic_fetch_add(&s->refs, 1); }

static void session_free(fbd_session *s) {
  free(s->client_state);
  for (int i = 0; i < 2; i++) fbd_stage_free(&s->stage[i].b);
  fbd_exec_free(&s->x);
  s->srv->ops->release(s); /* its worker, with its watch page, or the thread's page */
  fb_layout_free(s->layout);
  free(s->peer);
  pthread_mutex_destroy(&s->mu);
  pthread_cond_destroy(&s->cv);
  free(s);
}

void fbd_session_unref(fbd_session *s) {
  if (s && atomic_fetch_sub(&s->refs, 1) == 1) session_free(s);
}

static int new_id(char *out) {
  uint8_t r[16];
  if (getrandom(r, sizeof r, 0) != (ssize_t)sizeof r) return FB_EIO;
  for (int i = 0; i < 16; i++) snprintf(out + 2 * i, 3, "%02x", r[i]);
  return 0;
}

/* Put s in the table; FB_EQUOTA when it is full. */
static int table_add(fbd_server *srv, fbd_session *s, char *err, size_t errlen) {
  int rc = FB_EQUOTA;
  int all = fbd_auth_sees_all(srv, atomic_load(&s->owner)); /* before srv->mu */
  /* its memory and (process isolation) its worker's, charged before the
     worker is taken or started: the charge counts from admission on */
  uint64_t charge = srv->ops->charge(srv), need = s->mem_bytes + charge;
  if (need < charge) need = UINT64_MAX;
  atomic_store(&s->worker_base, charge);
  pthread_mutex_lock(&srv->mu);
  if (atomic_load(&srv->stopping)) {
    fb_errf(err, errlen, "the server is shutting down");
    rc = FB_EIO;
  } else if (fbd_budget_admit_locked(srv, need, "CreateSession", atomic_load(&s->owner), all, err,
                                     errlen)) {
    srv->st.sessions_failed++;
  } else {
    for (int i = 0; i < srv->cfg->max_sessions; i++) {
      if (srv->sessions[i]) continue;
      srv->sessions[i] = s;
      srv->nsessions++;
      srv->nsession_threads++;
      srv->st.memory_bytes += s->mem_bytes; /* counted from admission on */
      s->accounted = s->mem_bytes;
      rc = 0;
      break;
    }
    if (rc) {
      srv->st.sessions_failed++;
      fb_errf(err, errlen, "the server is at its session limit (%d sessions)",
              srv->cfg->max_sessions);
    }
  }
  pthread_mutex_unlock(&srv->mu);
  return rc;
}

int fbd_session_new(fbd_server *srv, fb_layout *layout, const fb_session_config *ecfg,
                    struct fbd_tenant *owner, const char *peer, fbd_session **out, char *err,
                    size_t errlen) {
  *out = NULL;
  fbd_session *s = calloc(1, sizeof *s);
  if (!s) {
    fb_layout_free(layout);
    fb_errf(err, errlen, "out of memory");
    return FB_ENOMEM;
  }
  s->srv = srv;
  s->layout = layout; /* NULL: a source's, parsed by the CREATE job (run_create) */
  s->mem_bytes = layout ? layout->root_bytes : 0;
  s->ecfg = *ecfg;
  snprintf(s->mode, sizeof s->mode, "%s", ecfg->mode ? ecfg->mode : "sync");
  s->ecfg.mode = s->mode;
  s->peer = strdup(peer ? peer : "?");
  atomic_init(&s->owner, owner); /* before the budget's admission, which names it */
  atomic_init(&s->refs, 3); /* table, session thread, caller */
  atomic_init(&s->queued, 0);
  atomic_init(&s->has_stream, 0);
  pthread_mutex_init(&s->mu, NULL);
  pthread_cond_init(&s->cv, NULL);
  s->last_active = fbd_now();
  int rc = 0;
  rc = srv->ops->open(s);
  if (!rc) rc = new_id(s->id);
  if (rc) fb_errf(err, errlen, "cannot draw a session id");
  memcpy(s->tag, s->id, 8);
  if (!rc) rc = table_add(srv, s, err, errlen);
  if (rc) {
    session_free(s);
    return rc;
  }
  if (pthread_create(&s->th, NULL, fbd_session_thread_main, s)) {
    pthread_mutex_lock(&srv->mu);
    for (int i = 0; i < srv->cfg->max_sessions; i++)
      if (srv->sessions[i] == s) srv->sessions[i] = NULL;
    srv->nsessions--;
    srv->nsession_threads--;
    srv->st.memory_bytes -= s->accounted;
    pthread_mutex_unlock(&srv->mu);
    session_free(s);
    fb_errf(err, errlen, "cannot start the session's worker thread");
    return FB_EINTERNAL;
  }
  *out = s;
  return 0;
}

int fbd_session_new_for(fbd_call *c, fb_layout *l, fb_session_config *ec, fbd_session **out,
                        char *err, size_t errlen) {
  int rc = fbd_auth_admit_begin(c, l, ec, err, errlen); /* auth's verdict */
  if (rc) fb_layout_free(l); /* fbd_session_new would have taken it */
  else rc = fbd_session_new(c->srv, l, ec, c->tenant, c->peer, out, err, errlen);
  fbd_auth_admit_end(c, !rc);
  return rc;
}

fbd_session *fbd_session_find(fbd_server *srv, const char *id, size_t n) {
  fbd_session *found = NULL;
  if (!id || n != 32) return NULL;
  pthread_mutex_lock(&srv->mu);
  for (int i = 0; i < srv->cfg->max_sessions && !found; i++) {
    fbd_session *s = srv->sessions[i];
    if (s && memcmp(s->id, id, 32) == 0) {
      fbd_session_ref(s);
      found = s;
    }
  }
  pthread_mutex_unlock(&srv->mu);
  return found;
}

/* ---------------------------------------------------------------- staging */

static void stage_expire(fbd_session *s, double now);

/* A new buffer, within the memory budget: admission and mapping under the
 * server's lock, so that two transfers cannot both take the last room. */
static int stage_new(fbd_session *s, size_t n, fbd_buf *out, const char *what, char *err,
                     size_t errlen) {
  fbd_server *srv = s->srv;
  int all = fbd_auth_sees_all(srv, atomic_load(&s->owner)); /* before srv->mu */
  /* its memory and (process isolation) its worker's, charged before the
     worker is taken or started: the charge counts from admission on */
  uint64_t charge = srv->ops->charge(srv), need = s->mem_bytes + charge;
  if (need < charge) need = UINT64_MAX;
  atomic_store(&s->worker_base, charge);
  pthread_mutex_lock(&srv->mu);
  int rc = fbd_budget_admit_locked(srv, n, what, atomic_load(&s->owner), all, err, errlen);
  if (!rc && (rc = fbd_stage_alloc(n, srv->ops->staging_memfd, out)))
    fb_errf(err, errlen, "%s: cannot stage %llu bytes: out of memory", what, (unsigned long long)n);
  pthread_mutex_unlock(&srv->mu);
  return rc;
}

int fbd_stage_take(fbd_session *s, size_t n, fbd_buf *out, const char *what, char *err,
                   size_t errlen) {
  out->p = NULL;
  pthread_mutex_lock(&s->mu);
  for (int i = 0; i < 2 && !out->p; i++)
    if (s->stage[i].b.p && s->stage[i].b.len == n) {
      *out = s->stage[i].b;
      s->stage[i].b = (fbd_buf){NULL, 0, -1};
    }
  pthread_mutex_unlock(&s->mu);
  if (out->p) return 0;
  if (stage_new(s, n, out, what, err, errlen) != FB_EQUOTA) return out->p ? 0 : FB_ENOMEM;
  /* the buffers this session keeps for reuse count too: give them back and
   * try once more (one request, one refusal in the count) */
  atomic_fetch_sub(&s->srv->budget_refused, 1);
  stage_expire(s, 1e300);
  return stage_new(s, n, out, what, err, errlen);
}

void fbd_stage_give(fbd_session *s, fbd_buf *b) {
  if (!b->p) return;
  pthread_mutex_lock(&s->mu);
  int k = !s->stage[0].b.p ? 0 : !s->stage[1].b.p ? 1 : s->stage[0].used < s->stage[1].used ? 0 : 1;
  struct fbd_stage old = s->stage[k]; /* an empty slot, or the older buffer */
  s->stage[k] = (struct fbd_stage){*b, fbd_now()};
  pthread_mutex_unlock(&s->mu);
  *b = (fbd_buf){NULL, 0, -1};
  fbd_stage_free(&old.b);
}

static void stage_expire(fbd_session *s, double now) {
  struct fbd_stage gone[2] = {{{NULL, 0, -1}, 0}, {{NULL, 0, -1}, 0}};
  pthread_mutex_lock(&s->mu);
  for (int i = 0; i < 2; i++)
    if (s->stage[i].b.p && now - s->stage[i].used > STAGE_KEEP_S) {
      gone[i] = s->stage[i];
      s->stage[i].b = (fbd_buf){NULL, 0, -1};
    }
  pthread_mutex_unlock(&s->mu);
  for (int i = 0; i < 2; i++) fbd_stage_free(&gone[i].b);
}

/* ---------------------------------------------------------------- queue */

static int post_locked(fbd_session *s, fbd_job *j) {
  if (s->state == FBD_DEAD) return FB_ENOENT;
  if (s->state == FBD_ENDING && j->kind != FBD_J_END) return FB_ENOENT;
  j->next = NULL;
  if (s->qt) s->qt->next = j;
  else s->qh = j;
  s->qt = j;
  s->depth++;
  atomic_fetch_add_explicit(&s->queued, 1, memory_order_release);
  s->posted++;
  if (j->kind == FBD_J_BATCH) { /* numbered as the client numbers them */
    size_t n = j->n_launches;
    j->first_launch = n ? s->launches_posted + 1 : 0;
    s->launches_posted += n;
  }
  s->last_active = fbd_now();
  j->posted_at = s->last_active;
  if (j->kind == FBD_J_END || j->kind == FBD_J_CLOSE) s->state = FBD_ENDING;
  pthread_cond_signal(&s->cv);
  return 0;
}

int fbd_session_post(fbd_session *s, fbd_job *j) {
  pthread_mutex_lock(&s->mu);
  int rc = post_locked(s, j);
  pthread_mutex_unlock(&s->mu);
  return rc;
}

int fbd_session_attach(fbd_session *s, fbd_call *c) {
  int rc = 0;
  pthread_mutex_lock(&s->mu);
  if (s->state != FBD_LIVE) rc = FB_ENOENT;
  else if (s->stream) rc = FB_EINVAL;
  else {
    s->stream = c;
    atomic_store(&s->has_stream, 1);
    fbd_call_ref(c);
  }
  pthread_mutex_unlock(&s->mu);
  return rc;
}

static fbd_call *stream_ref(fbd_session *s) {
  pthread_mutex_lock(&s->mu);
  fbd_call *st = s->stream;
  if (st) fbd_call_ref(st);
  pthread_mutex_unlock(&s->mu);
  return st;
}

/* Receive on a paused stream again once both its request queue and its
 * response queue are short. 1 when it did. */
int fbd_session_resume(fbd_session *s) {
  fbd_call *st = stream_ref(s);
  if (!st) return 0;
  int q = fbd_call_queued(st);
  pthread_mutex_lock(&s->mu);
  int go = s->recv_paused && s->depth <= RECV_LOW && q <= SEND_LOW && s->stream == st;
  if (go) s->recv_paused = 0;
  pthread_mutex_unlock(&s->mu);
  if (go) fbd_call_recv(st);
  fbd_call_unref(st);
  return go;
}

int fbd_session_may_recv(fbd_session *s) {
  fbd_call *st = stream_ref(s);
  int q = st ? fbd_call_queued(st) : 0;
  pthread_mutex_lock(&s->mu);
  int go = s->depth < RECV_HIGH && q < SEND_HIGH;
  if (!go) s->recv_paused = 1;
  pthread_mutex_unlock(&s->mu);
  if (st) fbd_call_unref(st);
  /* the responses may have gone out meanwhile, their last send seeing no
   * pause to lift: look again (fbd_session_resume receives when it lifts) */
  if (!go && q >= SEND_HIGH) fbd_session_resume(s);
  return go;
}

/* Waking a sleeping thread costs tens of microseconds on an idle machine
 * (more in a VM), which would dominate a sync round trip: so a session thread whose
 * stream is attached waits a little for the next request before it sleeps,
 * yielding the CPU to anything else runnable meanwhile. */
static void spin(fbd_session *s) {
  double limit = s->srv->cfg->worker_spin_us * 1e-6;
  if (limit <= 0 || !atomic_load_explicit(&s->has_stream, memory_order_relaxed)) return;
  double t0 = fbd_now();
  while (atomic_load_explicit(&s->queued, memory_order_acquire) == 0 && fbd_now() - t0 < limit)
    sched_yield();
}

/* Worker: the next job, resuming a paused stream once the queue is short. */
static fbd_job *next_job(fbd_session *s) {
  spin(s);
  pthread_mutex_lock(&s->mu);
  while (!s->qh) pthread_cond_wait(&s->cv, &s->mu);
  fbd_job *j = s->qh;
  s->qh = j->next;
  if (!s->qh) s->qt = NULL;
  s->depth--;
  atomic_fetch_sub_explicit(&s->queued, 1, memory_order_relaxed);
  s->busy = 1;
  int paused = s->recv_paused;
  pthread_mutex_unlock(&s->mu);
  if (paused) fbd_session_resume(s);
  return j;
}

/* The server's memory figure follows the session's device memory. */
static void account(fbd_session *s, uint64_t now_bytes) {
  if (now_bytes == s->accounted) return;
  fbd_server *srv = s->srv;
  pthread_mutex_lock(&srv->mu);
  srv->st.memory_bytes += now_bytes - s->accounted;
  if (srv->st.memory_bytes > srv->st.memory_peak_bytes)
    srv->st.memory_peak_bytes = srv->st.memory_bytes;
  pthread_mutex_unlock(&srv->mu);
  s->accounted = now_bytes;
}

static void job_done(fbd_session *s, const fb_counters *reply) {
  /* under process isolation the counters are the worker's word: its
     device memory is trusted no further than its process could hold, or
     one worker could fill (or wrap) the server's memory budget */
  fb_counters cc = *reply, *c = &cc;
  c->device_bytes = fbd_budget_reported(s, c->device_bytes);
  if (s->created) account(s, c->device_bytes ? c->device_bytes : s->mem_bytes);
  if (s->created && !s->dead) fbd_budget_note(s);
  if (s->created) fbd_metrics_count(s, c);
  pthread_mutex_lock(&s->mu);
  if (s->created) s->snap = *c;
  s->busy = 0;
  s->done++;
  s->last_active = fbd_now();
  pthread_mutex_unlock(&s->mu);
}

/* ---------------------------------------------------------------- ending */

static void count_end(fbd_server *srv, fbd_session *s) {
  pthread_mutex_lock(&srv->mu);
  fbd_stats *st = &srv->st;
  if (!s->describe) switch (s->end_reason) {
  case FBD_END_DISCONNECTED: st->sessions_disconnected++; break;
  case FBD_END_REAPED: st->sessions_reaped++; break;
  case FBD_END_FAILED:
  case FBD_END_CRASHED:
  case FBD_END_TIMEOUT: st->sessions_failed++; break;
  default: st->sessions_closed++; break;
  }
  st->memory_bytes -= s->accounted;
  for (int i = 0; i < srv->cfg->max_sessions; i++)
    if (srv->sessions[i] == s) srv->sessions[i] = NULL;
  srv->nsessions--;
  pthread_mutex_unlock(&srv->mu);
}

/* Hand the finished session thread to the main thread for joining. */
static void session_thread_exit(fbd_server *srv, pthread_t th) {
  pthread_mutex_lock(&srv->mu);
  if (srv->nzombies == srv->zcap) {
    int nc = srv->zcap ? srv->zcap * 2 : 16;
    pthread_t *z = realloc(srv->zombies, sizeof *z * (size_t)nc);
    if (z) {
      srv->zombies = z;
      srv->zcap = nc;
    }
  }
  if (srv->nzombies < srv->zcap) srv->zombies[srv->nzombies++] = th;
  else pthread_detach(th);
  srv->nsession_threads--;
  pthread_cond_broadcast(&srv->cv);
  pthread_mutex_unlock(&srv->mu);
}

/* Free the engine session, refuse what is still queued, finish the stream. */
static void session_end(fbd_session *s) {
  fbd_server *srv = s->srv;
  if (s->snap.device_bytes > s->mem_bytes) s->mem_bytes = s->snap.device_bytes; /* for the log */
  pthread_mutex_lock(&s->mu);
  s->state = FBD_DEAD;
  fbd_job *rest = s->qh;
  s->qh = s->qt = NULL;
  s->depth = 0;
  atomic_store(&s->queued, 0);
  fbd_call *stream = s->stream;
  s->stream = NULL;
  atomic_store(&s->has_stream, 0);
  pthread_mutex_unlock(&s->mu);
  fb_counters c = s->snap;
  fbd_exec_free(&s->x);
  pthread_mutex_lock(&s->mu); /* the reaper's fbd_proc_sample reads s->proc under it */
  fbd_proc *proc = s->proc;
  s->proc = NULL;
  pthread_mutex_unlock(&s->mu);
  if (proc) {
    fbd_proc_free(proc); /* the worker ends: the OS takes back all it held */
    s->watch = NULL;
  }
  for (fbd_job *j = rest, *n; j; j = n) {
    n = j->next;
    if (j->call && s->end_why[0])
      fbd_call_finish(j->call, FB_ENOENT, "session %s was %s: %s", s->tag, end_names[s->end_reason],
                      s->end_why);
    else if (j->call)
      fbd_call_finish(j->call, FB_ENOENT, "session %s was %s", s->tag, end_names[s->end_reason]);
    fbd_job_free(j);
  }
  count_end(srv, s); /* before the stream ends, so that its client sees the stats */
  if (stream) {
    char why[400];
    fb_errf(why, sizeof why, "session %s%s%s", end_names[s->end_reason], s->end_why[0] ? ": " : "",
            s->end_why);
    if (s->end_reason == FBD_END_CLOSED) fbd_call_finish(stream, FB_OK, NULL);
    else if (s->end_reason == FBD_END_TIMEOUT)
      fbd_call_finish_status(stream, FBP_GRPC_DEADLINE_EXCEEDED, FB_ETIMEOUT, why);
    else if (s->end_reason == FBD_END_CRASHED)
      fbd_call_finish_status(stream, FBP_GRPC_INTERNAL, FB_EINTERNAL, why);
    else if (s->end_reason == FBD_END_DRAINED) { /* drain.c: try another replica */
      pthread_mutex_lock(&stream->mu); /* before the status: pump reads them */
      stream->st_extra_key = FBD_ENDED_KEY;
      snprintf(stream->st_extra, sizeof stream->st_extra, "%s", s->end_why);
      pthread_mutex_unlock(&stream->mu);
      fbd_call_finish_status(stream, FBP_GRPC_UNAVAILABLE, FB_EIO, s->end_why);
    }
    else fbd_call_finish_status(stream, FBP_GRPC_ABORTED, FB_ENOENT, why);
    fbd_call_unref(stream);
  }
  if (s->created)
    fbd_logf(srv->log, FBD_LOG_INFO, "session %s %s: %llu launches, %llu bytes freed", s->tag,
             end_names[s->end_reason], (unsigned long long)c.launches,
             (unsigned long long)s->mem_bytes);
}

/* ---------------------------------------------------------------- running a job */

static void fail(fbd_reply *r, int code) {
  r->code = code;
  r->finish = r->fatal = 1;
}

/* A layout parsed from a tenant's source: checked against the memory
 * budget as CreateSession checks a client's layout (table_add), then the
 * session's. Takes l. */
static int admit_layout(fbd_session *s, fb_layout *l, fbd_reply *r) {
  fbd_server *srv = s->srv;
  int all = fbd_auth_sees_all(srv, atomic_load(&s->owner)); /* before srv->mu */
  pthread_mutex_lock(&srv->mu);
  int rc = fbd_budget_admit_locked(srv, l->root_bytes, "CreateSession", atomic_load(&s->owner),
                                   all, r->msg, sizeof r->msg);
  pthread_mutex_unlock(&srv->mu); /* a refusal counts as failed when the session ends */
  if (rc) {
    fb_layout_free(l);
    fail(r, rc);
    return rc;
  }
  s->layout = l;
  s->mem_bytes = l->root_bytes;
  account(s, s->mem_bytes);
  return 0;
}


/* A source's parse holds one of its tenant's compile slots (sched.c), as a
 * RegisterKernels does. */
static int parse_layout(fbd_session *s, fbd_job *j, fbd_reply *r) {
  fbd_run run;
  fbd_sched_enter(s, FBD_J_REGISTER, &run);
  fb_layout *l = NULL;
  int rc = s->srv->ops->parse(s, j, &l, r);
  fbd_sched_leave(s, &run, FBD_J_REGISTER, 0, j->posted_at);
  return rc ? rc : admit_layout(s, l, r);
}

/* CREATE: the engine session, here or in a worker process; first the
 * layout of a source (s->layout NULL), parsed where the session's work
 * runs. */
static void run_create(fbd_session *s, fbd_job *j, fbd_reply *r) {
  const fbd_session_ops *ops = s->srv->ops;
  int rc = ops->attach(s, r->msg, sizeof r->msg);
  if (rc) {
    fail(r, rc);
    return;
  }
  if (!s->layout && parse_layout(s, j, r)) return;
  ops->create(s, j, r);
}

/* DESCRIBE: a source's fields and kernels, told by a sandboxed parse (the
 * session's worker process, which ends with the session) or, under thread
 * isolation, by this thread; within a compile slot of the tenant's. */
static void run_describe(fbd_session *s, fbd_job *j, fbd_reply *r) {
  fbd_run run;
  fbd_sched_enter(s, FBD_J_REGISTER, &run);
  s->srv->ops->describe(s, j, r);
  fbd_sched_leave(s, &run, FBD_J_REGISTER, 0, j->posted_at);
}

static void created(fbd_session *s, fbd_job *j) {
  fbd_server *srv = s->srv;
  s->created = 1;
  pthread_mutex_lock(&srv->mu);
  srv->st.sessions_created++;
  pthread_mutex_unlock(&srv->mu);
  fbd_logf(srv->log, FBD_LOG_INFO, "session %s created for %s: mode %s, %d SNodes, %llu bytes%s",
           s->tag, s->peer, s->mode, s->layout->nnodes, (unsigned long long)s->mem_bytes,
           s->proc ? ", own process" : "");
  Fusebox__V1__CreateSessionResponse resp = FUSEBOX__V1__CREATE_SESSION_RESPONSE__INIT;
  resp.session_id = s->id;
  resp.backend = (char *)srv->backend;
  resp.memory_bytes = s->mem_bytes;
  fbd_call_send_msg(j->call, &resp.base);
}

/* RESTORE: a session from a checked checkpoint (j->ck), here or in a new
 * worker process; its layout then admitted as a source's is. */
static void run_restore(fbd_session *s, fbd_job *j, fbd_reply *r) {
  fbd_server *srv = s->srv;
  fb_layout *l = NULL;
  fbd_run run;
  fbd_sched_enter(s, FBD_J_REGISTER, &run); /* it compiles like a RegisterKernels */
  srv->ops->restore(s, j, &l, r);
  fbd_sched_leave(s, &run, FBD_J_REGISTER, 0, j->posted_at);
  if (!r->code && l && !admit_layout(s, l, r)) s->nkernels = (int)r->registered;
  else if (l && r->code) fb_layout_free(l);
}

static void restored(fbd_session *s, fbd_job *j, const fbd_reply *r) {
  fbd_server *srv = s->srv;
  s->created = 1;
  atomic_fetch_add(&srv->ckpt_restored, 1);
  pthread_mutex_lock(&srv->mu);
  srv->st.sessions_created++;
  pthread_mutex_unlock(&srv->mu);
  fbd_logf(srv->log, FBD_LOG_INFO, "session %s restored for %s: %d SNodes, %u kernels, %llu bytes",
           s->tag, s->peer, s->layout->nnodes, r->registered, (unsigned long long)s->mem_bytes);
  if (!j->call) return;
  fbp_arena a;
  fbp_arena_init(&a);
  Fusebox__V1__RestoreResponse resp = FUSEBOX__V1__RESTORE_RESPONSE__INIT;
  resp.session_id = s->id;
  resp.backend = (char *)srv->backend;
  resp.memory_bytes = s->mem_bytes;
  resp.layout = fbp_layout_to_pb(&a, s->layout);
  resp.kernels = r->registered;
  size_t ns;
  const uint8_t *st = fbd_ckpt_state(j->ck, &ns);
  resp.client_state.data = (uint8_t *)st;
  resp.client_state.len = ns;
  resp.mode = s->mode;
  if (resp.layout) fbd_call_send_msg(j->call, &resp.base);
  fbp_arena_free(&a);
  fbd_call_finish(j->call, resp.layout ? FB_OK : FB_ENOMEM, NULL);
}

/* After a CKPT: seal and name it, or say why not; the session lives on
 * either way (the previous checkpoint stays whole). */
static void ckpt_done(fbd_session *s, fbd_job *j, fbd_reply *r) {
  fbd_server *srv = s->srv;
  char err[FBD_ERRLEN] = "";
  /* the sink's own failure first (the budget, the disk): the engine only
     saw its writes stop */
  int rc = fbd_ckpt_failed(j->ck, err, sizeof err);
  if (!rc && (rc = r->code)) snprintf(err, sizeof err, "%s", r->msg);
  if (!rc) rc = fbd_ckpt_finish(j->ck, 1, err, sizeof err);
  r->finish = 0; /* answered here */
  if (rc) {
    atomic_fetch_add(&srv->ckpt_refused, 1);
    fbd_logf(srv->log, FBD_LOG_WARN, "session %s: checkpoint failed: %s", s->tag, err);
    if (j->wait) fbd_ckpt_wait_done(j->wait, rc, NULL, err);
    j->wait = NULL;
    if (j->call) fbd_call_finish(j->call, rc, "Checkpoint of session %s: %s", s->tag, err);
    return;
  }
  atomic_fetch_add(&srv->ckpt_written, 1);
  atomic_fetch_add(&srv->ckpt_bytes_out, fbd_ckpt_bytes(j->ck));
  const char *name = fbd_ckpt_name(j->ck);
  if (name[0]) {
    s->ckpt_at = fbd_now();
    fbd_logf(srv->log, FBD_LOG_INFO, "session %s: checkpoint %s (%llu bytes)", s->tag, name,
             (unsigned long long)fbd_ckpt_bytes(j->ck));
  }
  if (j->wait) fbd_ckpt_wait_done(j->wait, 0, name, NULL);
  j->wait = NULL;
  if (!j->call) return;
  if (name[0]) {
    Fusebox__V1__CheckpointChunk c = FUSEBOX__V1__CHECKPOINT_CHUNK__INIT;
    c.name = (char *)name;
    c.offset = fbd_ckpt_bytes(j->ck);
    fbd_call_send_msg(j->call, &c.base);
    fbd_call_finish(j->call, FB_OK, NULL);
  } else {
    j->call->m->on_job(j->call, s, j); /* streams and takes the job's checkpoint */
  }
}

/* Before a RegisterKernels: the session's cap on kernels (the broker
 * counts them: a worker's word is not needed), and the memory budget's
 * room for their IR, which the engine side checks kernel by kernel. */
static void register_limits(fbd_session *s, fbd_job *j, fbd_reply *r) {
  const Fusebox__V1__RegisterKernelsRequest *m = j->msg;
  int max = s->srv->cfg->max_kernels_per_session;
  /* a source's instances are counted where they are made (exec.c), against
   * kernels_left; those the request names count here already */
  size_t asked = m->n_kernels + (m->n_instances < (size_t)INT_MAX ? m->n_instances : INT_MAX) +
                 (m->n_adjoints < (size_t)INT_MAX ? m->n_adjoints : INT_MAX) +
                 (m->n_tangents < (size_t)INT_MAX ? m->n_tangents : INT_MAX);
  if (max > 0 && (s->nkernels >= max || asked > (size_t)(max - s->nkernels))) {
    size_t first = (size_t)(max - (s->nkernels < max ? s->nkernels : max));
    const char *name = first < m->n_kernels && m->kernels[first] && m->kernels[first]->name
                           ? m->kernels[first]->name
                           : "?";
    r->code = FB_EQUOTA;
    r->finish = 1;
    fb_errf(r->msg, sizeof r->msg,
            "RegisterKernels: kernel '%s' would be the session's kernel number %lld, past "
            "the %d a session may register (max_kernels_per_session; registering a name "
            "again adds a kernel): the session has %d, this request adds %zu",
            name, (long long)max + 1, max, s->nkernels, asked);
    return;
  }
  if (s->watch) {
    atomic_store(&s->watch->kernel_cap, fbd_budget_kernel_cap(s->srv, s));
    atomic_store(&s->watch->kernels_left, max > 0 ? (int64_t)(max - s->nkernels) : -1);
  }
}

/* After a RegisterKernels: what it added (a refused one adds nothing).
 * limited: register_limits refused it here. A refusal by the memory
 * budget comes from the engine side, whose message ends with
 * "(memory_budget)"; the tenant's kernel names are inside the messages, so
 * neither the text alone nor a name can make a refusal count as the
 * budget's (GetStats' refused, the log's WARN). */
static void registered(fbd_session *s, const fbd_reply *r, int limited) {
  /* the engine side's count, trusted no further than what this request
     could add: at most max_kernels_per_session in all (register_limits) */
  int max = s->srv->cfg->max_kernels_per_session;
  uint64_t n = r->registered, most = max > 0 ? (uint64_t)(max - s->nkernels) : (uint64_t)INT_MAX;
  if (!r->code && s->nkernels < INT_MAX) s->nkernels += (int)(n < most ? n : most);
  static const char tail[] = "(memory_budget)";
  size_t len = strlen(r->msg);
  if (!limited && r->code == FB_EQUOTA && len >= sizeof tail - 1 &&
      !strcmp(r->msg + len - (sizeof tail - 1), tail)) {
    atomic_fetch_add(&s->srv->budget_refused, 1);
    fbd_logf(s->srv->log, FBD_LOG_WARN, "session %s: %s", s->tag, r->msg);
  }
}

/* Hand j to the engine side and answer its call with the reply. */
static void run_job(fbd_session *s, fbd_job *j, fb_counters *after) {
  fbd_server *srv = s->srv;
  fbd_reply r;
  memset(&r, 0, sizeof r);
  int read = j->kind == FBD_J_READ || j->kind == FBD_J_ACTIVE;
  if (read) { /* where the worker puts the field's bytes (or its activity mask) */
    uint64_t bytes = 0;
    if ((r.code = fbd_field_bytes(s->layout, j->field, &bytes, r.msg, sizeof r.msg))) {
      r.finish = 1; /* its own code: NOT_FOUND for no such field */
    } else {
      /* the mask is one byte per element: never more than the values */
      if (j->kind == FBD_J_ACTIVE) bytes = (uint64_t)fb_field_numel(s->layout, j->field);
      if ((r.code = fbd_stage_take(s, bytes, &j->buf, "ReadField", r.msg, sizeof r.msg)))
        r.finish = 1;
    }
  }
  pthread_mutex_lock(&s->mu);
  int cancel = s->cancel_upto >= s->done + 1 || s->abort_at > 0 ||
               (j->first_launch && j->first_launch <= s->cancel_launches);
  pthread_mutex_unlock(&s->mu);
  if (s->watch) atomic_store(&s->watch->cancel, cancel);
  if (s->watch && j->kind == FBD_J_BATCH && s->ecfg.mode && !strcmp(s->ecfg.mode, "async"))
    atomic_store(&s->watch->pending_cap, fbd_budget_pending_cap(srv, s));
  int limited = 0;
  if (!r.finish && j->kind == FBD_J_REGISTER) {
    register_limits(s, j, &r);
    limited = r.finish;
  }
  if (r.finish) {
  } else if (j->kind == FBD_J_CREATE) {
    run_create(s, j, &r);
  } else if (j->kind == FBD_J_DESCRIBE) {
    run_describe(s, j, &r);
  } else if (j->kind == FBD_J_RESTORE) {
    run_restore(s, j, &r);
  } else {
    /* the fair scheduler decides when this tenant's job may run */
    fbd_run run;
    fbd_sched_enter(s, j->kind, &run);
    srv->ops->run(s, j, &r);
    if (r.refused) { /* a stream's message refused where it was decoded: the stream ends */
      fbd_job *end = fbd_job_new(FBD_J_END, NULL);
      if (end) end->reason = FBD_END_CLOSED;
      if (end && fbd_session_post(s, end)) fbd_job_free(end);
    }
    int sync = j->kind == FBD_J_BATCH && j->sync;
    fbd_sched_leave(s, &run, j->kind, sync, j->posted_at);
  }
  if (j->kind == FBD_J_CREATE && !r.code) created(s, j);
  if (j->kind == FBD_J_RESTORE && !r.code) restored(s, j, &r);
  if (j->kind == FBD_J_RESTORE && r.code) {
    atomic_fetch_add(&srv->ckpt_refused, 1);
    s->end_reason = FBD_END_FAILED;
    fbd_logf(srv->log, FBD_LOG_WARN, "restore for %s refused: %s", s->peer, r.msg);
  }
  if (j->kind == FBD_J_CKPT) ckpt_done(s, j, &r); /* answers the call itself */
  if (j->kind == FBD_J_REGISTER) registered(s, &r, limited);
  if ((j->kind == FBD_J_CREATE || j->kind == FBD_J_RESTORE) && r.code) {
    s->end_reason = FBD_END_FAILED;
    fbd_logf(srv->log, FBD_LOG_WARN, "session for %s refused: %s", s->peer, r.msg);
  }
  if (j->kind == FBD_J_BATCH) {
    pthread_mutex_lock(&srv->mu);
    srv->st.launches += j->n_launches;
    if (j->sync) srv->st.syncs++;
    pthread_mutex_unlock(&srv->mu);
  }
  if (j->call && r.pb) fbd_call_send(j->call, r.pb, r.pblen);
  if (j->call && r.finish) {
    const char *msg = r.msg[0] ? r.msg : r.code ? fb_strerror(r.code) : NULL;
    if (r.code == FB_ETIMEOUT)
      fbd_call_finish_status(j->call, FBP_GRPC_DEADLINE_EXCEEDED, r.code, msg);
    else if (msg) fbd_call_finish(j->call, r.code, "%s", msg);
    else fbd_call_finish(j->call, r.code, NULL);
  } else if (j->call && read) {
    j->call->m->on_job(j->call, s, j); /* streams the buffer (takes it) */
  }
  if (j->buf.p) fbd_stage_give(s, &j->buf); /* a write's buffer, for the next transfer */
  if (r.fatal && s->created && s->end_reason == FBD_END_CLOSED) s->end_reason = FBD_END_FAILED;
  *after = r.counters;
  if (!s->created || r.fatal) *after = s->snap;
  if (r.fatal) s->dead = 1; /* no more jobs: the engine side is gone */
  fbd_reply_clear(&r);
}

void *fbd_session_thread_main(void *arg) {
  fbd_session *s = arg;
  fbd_server *srv = s->srv;
  fbd_call *closer = NULL; /* a CloseSession is answered once the session is gone */
  for (;;) {
    fbd_job *j = next_job(s);
    int kind = j->kind;
    if (kind == FBD_J_END) s->end_reason = j->reason;
    if (kind == FBD_J_CLOSE) {
      s->end_reason = FBD_END_CLOSED;
      closer = j->call;
      j->call = NULL;
    }
    fb_counters after;
    memset(&after, 0, sizeof after);
    if (kind != FBD_J_END && kind != FBD_J_CLOSE) run_job(s, j, &after);
    else after = s->snap;
    fbd_job_free(j);
    job_done(s, &after);
    if (kind == FBD_J_END || kind == FBD_J_CLOSE || !s->created || s->dead) break;
  }
  session_end(s);
  if (closer) {
    fbd_call_finish(closer, FB_OK, NULL);
    fbd_call_unref(closer);
  }
  pthread_t th = s->th;
  fbd_session_unref(s); /* the table's */
  fbd_session_unref(s); /* the session thread's */
  session_thread_exit(srv, th);
  return NULL;
}

/* ---------------------------------------------------------------- server-wide */

void fbd_session_abort(fbd_session *s, int reason, const char *why) {
  fbd_job *j = fbd_job_new(FBD_J_END, NULL);
  if (!j) return;
  j->reason = reason;
  pthread_mutex_lock(&s->mu);
  if (s->state == FBD_DEAD || s->abort_at > 0) {
    pthread_mutex_unlock(&s->mu);
    fbd_job_free(j);
    return;
  }
  /* queued work is dropped, not run; an END or CLOSE already queued stays
   * (the session ends for the reason first given) */
  fbd_job *rest = NULL, **tail = &rest, *keep = NULL;
  for (fbd_job *q = s->qh, *n; q; q = n) {
    n = q->next;
    q->next = NULL;
    if (!keep && (q->kind == FBD_J_END || q->kind == FBD_J_CLOSE)) keep = q;
    else *tail = q, tail = &q->next;
  }
  s->qh = s->qt = NULL;
  s->depth = 0;
  atomic_store(&s->queued, 0);
  s->abort_at = fbd_now();
  if (s->watch) atomic_store(&s->watch->cancel, 1); /* the running job stops at a task boundary */
  fbd_sched_kick(s); /* ... even when the scheduler paused it */
  if (keep) {
    s->qh = s->qt = keep;
    s->depth = 1;
    atomic_store(&s->queued, 1);
    pthread_cond_signal(&s->cv);
    fbd_job_free(j);
  } else {
    post_locked(s, j);
  }
  fbd_call *stream = s->stream;
  if (stream) fbd_call_ref(stream);
  pthread_mutex_unlock(&s->mu);
  int dropped = 0;
  for (fbd_job *n; rest; rest = n) {
    n = rest->next;
    if (rest->call)
      fbd_call_finish(rest->call, FB_ECANCELLED, "session %s was %s: %s", s->tag, end_names[reason],
                      why);
    fbd_job_free(rest);
    dropped++;
  }
  if (dropped)
    fbd_logf(s->srv->log, FBD_LOG_INFO, "session %s %s: %d queued request%s dropped", s->tag,
             end_names[reason], dropped, dropped == 1 ? "" : "s");
  if (stream) {
    if (reason != FBD_END_DISCONNECTED)
      grpc_call_cancel_with_status(stream->gc, GRPC_STATUS_ABORTED, why, NULL);
    fbd_call_unref(stream);
  }
}

int fbd_session_cancel(fbd_session *s, uint64_t through_launch) {
  pthread_mutex_lock(&s->mu);
  if (through_launch > s->launches_posted &&
      through_launch - s->launches_posted > FBD_CANCEL_AHEAD) {
    pthread_mutex_unlock(&s->mu);
    return -2;
  }
  int live = s->state == FBD_LIVE;
  s->cancel_upto = s->posted; /* every job received so far runs cancelled */
  /* and the launches the client sent before it, which a Cancel on another
     call may overtake on their way in */
  if (through_launch > s->cancel_launches) s->cancel_launches = through_launch;
  int pending = (int)(s->posted - s->done);
  if (live && s->watch) atomic_store(&s->watch->cancel, 1);
  pthread_mutex_unlock(&s->mu);
  if (live) fbd_sched_kick(s);
  return live ? pending : -1;
}

/* End s for a reason of the server's (reaping, shutdown). */
static void end_session(fbd_session *s, int reason, const char *why) {
  fbd_job *j = fbd_job_new(FBD_J_END, NULL);
  if (!j) return;
  j->reason = reason;
  pthread_mutex_lock(&s->mu);
  int rc = s->state == FBD_DEAD ? FB_ENOENT : post_locked(s, j);
  fbd_call *stream = s->stream;
  if (!rc && stream) fbd_call_ref(stream);
  pthread_mutex_unlock(&s->mu);
  if (rc) fbd_job_free(j);
  if (!rc && stream) {
    grpc_call_cancel_with_status(stream->gc, GRPC_STATUS_ABORTED, why, NULL);
    fbd_call_unref(stream);
  }
}

/* End s after the work it already received, its stream answered with
 * why and the status of reason (session_end): the drain's way (drain.c),
 * which leaves the stream to say why instead of cancelling it. */
int fbd_session_end_with(fbd_session *s, int reason, const char *why) {
  fbd_job *j = fbd_job_new(FBD_J_END, NULL);
  if (!j) return FB_ENOMEM;
  j->reason = reason;
  pthread_mutex_lock(&s->mu);
  int rc = s->state == FBD_LIVE ? 0 : FB_ENOENT;
  if (!rc) {
    snprintf(s->end_why, sizeof s->end_why, "%s", why);
    s->drained = reason == FBD_END_DRAINED;
    rc = post_locked(s, j);
  }
  pthread_mutex_unlock(&s->mu);
  if (rc) fbd_job_free(j);
  return rc;
}

/* Sessions of the table, ref'd, for work outside srv->mu. */
static int snapshot(fbd_server *srv, fbd_session **out) {
  int n = 0;
  pthread_mutex_lock(&srv->mu);
  for (int i = 0; i < srv->cfg->max_sessions; i++)
    if (srv->sessions[i]) {
      fbd_session_ref(srv->sessions[i]);
      out[n++] = srv->sessions[i];
    }
  pthread_mutex_unlock(&srv->mu);
  return n;
}

void fbd_session_end_all(fbd_server *srv, int reason) {
  fbd_session **v = calloc((size_t)srv->cfg->max_sessions, sizeof *v);
  if (!v) return;
  int n = snapshot(srv, v);
  for (int i = 0; i < n; i++) {
    fbd_session_abort(v[i], reason, "the server is shutting down");
    fbd_session_unref(v[i]);
  }
  free(v);
}

/* Every session has run the jobs it had when marks were taken (by table
 * slot), and its stream has sent what they produced. */
int fbd_sessions_drained(fbd_server *srv, const uint64_t *marks, int n) {
  int drained = 1;
  pthread_mutex_lock(&srv->mu);
  for (int i = 0; i < n && drained; i++) {
    fbd_session *s = srv->sessions[i];
    if (!s) continue;
    pthread_mutex_lock(&s->mu);
    if (s->done < marks[i] && s->state != FBD_DEAD) drained = 0;
    fbd_call *st = s->stream;
    pthread_mutex_unlock(&s->mu);
    if (drained && st && fbd_call_queued(st)) drained = 0;
  }
  pthread_mutex_unlock(&srv->mu);
  return drained;
}

static void reap(fbd_server *srv) {
  double limit = srv->cfg->idle_timeout_s, now = fbd_now();
  fbd_session **v = calloc((size_t)srv->cfg->max_sessions, sizeof *v);
  if (!v) return;
  int n = snapshot(srv, v);
  for (int i = 0; i < n; i++) {
    fbd_session *s = v[i];
    stage_expire(s, now);
    srv->ops->sample(s); /* the budget's workers part */
    pthread_mutex_lock(&s->mu);
    int idle =
        limit > 0 && s->state == FBD_LIVE && !s->busy && !s->qh && now - s->last_active > limit;
    pthread_mutex_unlock(&s->mu);
    if (idle) {
      fbd_logf(srv->log, FBD_LOG_INFO, "session %s idle for %.0f s: reaping it", s->tag, limit);
      end_session(s, FBD_END_REAPED, "session reaped after its idle timeout");
    }
    fbd_session_unref(s);
  }
  free(v);
}

/* ---------------------------------------------------------------- checkpoints */

typedef struct fbd_ckpt_wait {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int done, code, refs;
  char name[64], err[256];
} fbd_ckpt_wait;

static void wait_unref(fbd_ckpt_wait *w) {
  pthread_mutex_lock(&w->mu);
  int last = --w->refs == 0;
  pthread_mutex_unlock(&w->mu);
  if (!last) return;
  pthread_mutex_destroy(&w->mu);
  pthread_cond_destroy(&w->cv);
  free(w);
}

void fbd_ckpt_wait_done(fbd_ckpt_wait *w, int code, const char *name, const char *err) {
  pthread_mutex_lock(&w->mu);
  w->done = 1;
  w->code = code;
  snprintf(w->name, sizeof w->name, "%s", name ? name : "");
  snprintf(w->err, sizeof w->err, "%s", err ? err : "");
  pthread_cond_broadcast(&w->cv);
  pthread_mutex_unlock(&w->mu);
  wait_unref(w);
}

/* A CKPT job into the directory, for s (no call). */
static fbd_job *dir_job(fbd_session *s, char *err, size_t errlen) {
  pthread_mutex_lock(&s->mu);
  fbd_ckpt_job *k = NULL;
  int rc = fbd_ckpt_begin(s->srv, atomic_load(&s->owner), s->tag, 1, s->client_state,
                          s->nclient_state, &k, err, errlen);
  pthread_mutex_unlock(&s->mu);
  fbd_job *j = rc ? NULL : fbd_job_new(FBD_J_CKPT, NULL);
  if (!j) {
    fbd_ckpt_end(k);
    if (!rc) fb_errf(err, errlen, "out of memory");
    return NULL;
  }
  j->ck = k;
  j->sink = fbd_ckpt_sink;
  j->sink_user = k;
  return j;
}

int fbd_session_checkpoint_now(fbd_session *s, double timeout_s, char *name, size_t n, char *err,
                               size_t errlen) {
  if (!fbd_ckpt_dir_enabled(s->srv)) {
    fb_errf(err, errlen, "this server keeps no checkpoints (fuseboxd --checkpoint-dir)");
    return FB_EUNSUPPORTED;
  }
  fbd_job *j = dir_job(s, err, errlen);
  fbd_ckpt_wait *w = j ? calloc(1, sizeof *w) : NULL;
  if (!w) {
    fbd_job_free(j);
    if (j) fb_errf(err, errlen, "out of memory");
    return FB_ENOMEM;
  }
  pthread_mutex_init(&w->mu, NULL);
  pthread_cond_init(&w->cv, NULL);
  w->refs = 2; /* ours, the job's */
  j->wait = w;
  if (fbd_session_post(s, j)) {
    fbd_job_free(j); /* tells w */
  }
  struct timespec until;
  clock_gettime(CLOCK_REALTIME, &until);
  until.tv_sec += (time_t)timeout_s;
  pthread_mutex_lock(&w->mu);
  while (!w->done)
    if (pthread_cond_timedwait(&w->cv, &w->mu, &until)) break;
  int rc = !w->done ? FB_ETIMEOUT : w->code;
  if (!w->done) fb_errf(err, errlen, "the checkpoint took more than %.0f s", timeout_s);
  else if (rc) fb_errf(err, errlen, "%s", w->err);
  else snprintf(name, n, "%s", w->name);
  pthread_mutex_unlock(&w->mu);
  wait_unref(w);
  return rc;
}

void fbd_ckpt_tick(fbd_server *srv) {
  double every = srv->cfg->checkpoint_every_s, now = fbd_now();
  if (every <= 0 || !fbd_ckpt_dir_enabled(srv) || now - srv->ckpt_last < 0.25) return;
  srv->ckpt_last = now;
  fbd_session **list = calloc((size_t)srv->cfg->max_sessions, sizeof *list);
  if (!list) return;
  int n = snapshot(srv, list);
  for (int i = 0; i < n; i++) {
    fbd_session *s = list[i];
    pthread_mutex_lock(&s->mu);
    int due = 0;
    if (s->created && !s->describe && s->state == FBD_LIVE && !s->dead) {
      if (s->ckpt_at == 0) s->ckpt_at = now; /* the first: a period after this */
      else if (now - s->ckpt_at >= every) due = 1;
      if (due) s->ckpt_at = now; /* not twice while one is queued */
    }
    pthread_mutex_unlock(&s->mu);
    if (due) {
      char err[256];
      fbd_job *j = dir_job(s, err, sizeof err);
      if (!j) fbd_logf(srv->log, FBD_LOG_WARN, "session %s: checkpoint: %s", s->tag, err);
      else if (fbd_session_post(s, j)) fbd_job_free(j);
    }
    fbd_session_unref(s);
  }
  free(list);
}

void fbd_server_tick(fbd_server *srv) {
  reap(srv);
  fbd_ckpt_tick(srv);
  fbd_procs_tick(srv);
  for (;;) {
    pthread_mutex_lock(&srv->mu);
    int have = srv->nzombies > 0;
    pthread_t th;
    if (have) th = srv->zombies[--srv->nzombies];
    pthread_mutex_unlock(&srv->mu);
    if (!have) break;
    pthread_join(th, NULL);
  }
}

void fbd_session_stats_pb(fbd_session *s, fbp_arena *a, Fusebox__V1__SessionStats *out,
                          int full_id) {
  fusebox__v1__session_stats__init(out);
  Fusebox__V1__Counters *c = fbp_alloc(a, sizeof *c);
  pthread_mutex_lock(&s->mu);
  fb_counters snap = s->snap;
  out->attached = s->stream != NULL;
  out->idle_s = s->busy ? 0 : fbd_now() - s->last_active;
  pthread_mutex_unlock(&s->mu);
  out->tag = fbp_strdup(a, full_id ? s->id : s->tag);
  out->memory_bytes = snap.device_bytes ? snap.device_bytes : s->mem_bytes;
  if (c) {
    fbp_counters_to_pb(c, &snap);
    out->counters = c;
  }
}
