/* Process isolation, the broker's half of running a job: take a process
 * for a new session, send a job's frame (the request's bytes, a staging
 * buffer's memfd), await its reply within the session's deadlines (a task
 * past kernel_timeout_s, a compile past compile_timeout_s, an abort not
 * heeded: the process is SIGKILLed), and the checkpoint/restore data
 * streams, attach, create and parse. A process that dies or breaks the
 * protocol ends only its session. */
#define _GNU_SOURCE
#include "server/session/proc.h"

static void fatal_reply(fbd_reply *r, int code, const char *why) {
  r->code = code;
  r->finish = 1;
  r->fatal = 1;
  fb_errf(r->msg, sizeof r->msg, "%s", why);
}

/* The worker began a frame and then stalled past worker_reply_timeout_s:
 * stuck or compromised. Kill it; only its session ends. */
static void worker_stalled(fbd_session *s, fbd_reply *r, const char *what) {
  fbd_proc_reap(s->proc, 1, NULL, 0);
  s->end_reason = FBD_END_CRASHED;
  snprintf(s->end_why, sizeof s->end_why,
           "the session worker stalled in the middle of a %s for worker_reply_timeout_s "
           "(%g s): it was stopped",
           what, s->srv->cfg->worker_reply_timeout_s);
  fbd_logf(s->srv->log, FBD_LOG_WARN, "session %s: %s", s->tag, s->end_why);
  fatal_reply(r, FB_EINTERNAL, s->end_why);
}

/* The worker stopped answering: learn why, and say it. */
static void worker_lost(fbd_session *s, fbd_reply *r) {
  char why[256];
  fbd_proc_reap_lost(s->proc, why, sizeof why);
  s->end_reason = FBD_END_CRASHED;
  fb_errf(s->end_why, sizeof s->end_why, "%s", why);
  fbd_logf(s->srv->log, FBD_LOG_WARN, "session %s: %s", s->tag, why);
  fatal_reply(r, FB_EINTERNAL, why);
}

/* Why the running job must stop now, or NULL: a task past
 * kernel_timeout_s, a RegisterKernels past compile_timeout_s, or an
 * aborted session that did not stop within ABORT_GRACE_S. */
static const char *overdue(fbd_session *s, int kind, double t0, char *buf, size_t n, int *code) {
  const fbd_config *cfg = s->srv->cfg;
  double now = fbd_now();
  pthread_mutex_lock(&s->mu);
  double abort_at = s->abort_at;
  pthread_mutex_unlock(&s->mu);
  if (abort_at > 0 && now - abort_at > ABORT_GRACE_S) {
    *code = FB_ECANCELLED;
    fb_errf(buf, n, "the session ended and its running work did not stop within %.0f s",
            ABORT_GRACE_S);
    return buf;
  }
  double held = fbd_sched_held(s); /* paused by the scheduler: not the job's time */
  t0 += held;
  int parse = kind == FBD_J_PARSE || kind == FBD_J_DESCRIBE;
  if ((kind == FBD_J_REGISTER || parse) && cfg->compile_timeout_s > 0 &&
      now - t0 > cfg->compile_timeout_s) {
    *code = FB_ETIMEOUT;
    snprintf(buf, n, "%s ran past compile_timeout_s (%g s)",
             parse ? "parsing the source" : "compiling the kernels", cfg->compile_timeout_s);
    return buf;
  }
  uint64_t st = atomic_load_explicit(&s->watch->started_ns, memory_order_acquire);
  double since = st ? now - (double)st * 1e-9 - held : 0;
  if (since > now - t0) since = now - t0; /* the worker's clock is not trusted past the job */
  if (kind != FBD_J_REGISTER && !parse && cfg->kernel_timeout_s > 0 && st &&
      since > cfg->kernel_timeout_s) {
    char kernel[sizeof s->watch->kernel], task[sizeof s->watch->task];
    memcpy(kernel, s->watch->kernel, sizeof kernel);
    memcpy(task, s->watch->task, sizeof task);
    kernel[sizeof kernel - 1] = task[sizeof task - 1] = 0;
    *code = FB_ETIMEOUT;
    if (strcmp(kernel, task)) /* a fused task: its launches, "kernel 'a' (launch 7) fused ..." */
      snprintf(buf, n, "%.150s ran past kernel_timeout_s (%g s)", task, cfg->kernel_timeout_s);
    else
      snprintf(buf, n, "kernel '%s' ran past kernel_timeout_s (%g s)", kernel,
               cfg->kernel_timeout_s);
    return buf;
  }
  return NULL;
}

static const char *job_name(int kind) {
  switch (kind) {
  case FBD_J_CREATE: return "CreateSession";
  case FBD_J_REGISTER: return "RegisterKernels";
  case FBD_J_BATCH: return "batch of launches";
  case FBD_J_WRITE: return "WriteField";
  case FBD_J_READ: return "ReadField";
  case FBD_J_ACTIVE: return "ReadField (active)";
  case FBD_J_PARSE: return "CreateSession (its source)";
  case FBD_J_DESCRIBE: return "DescribeSource";
  case FBD_J_CKPT: return "Checkpoint";
  case FBD_J_RESTORE: return "Restore";
  default: return "request";
  }
}

/* A reply that breaks the wire's rules: the worker is compromised (or
 * broken). Kill it, since it may be alive and waiting; only its session
 * ends. */
static void worker_malformed(fbd_session *s, fbd_reply *r, const char *what) {
  fbd_proc_reap(s->proc, 1, NULL, 0);
  s->end_reason = FBD_END_CRASHED;
  fb_errf(s->end_why, sizeof s->end_why,
          "the session worker sent a malformed reply (%s): it was stopped", what);
  fbd_logf(s->srv->log, FBD_LOG_WARN, "session %s: %s", s->tag, s->end_why);
  fatal_reply(r, FB_EINTERNAL, s->end_why);
}

/* Read n bytes of packed response into a buffer that grows as they arrive
 * (from PB_READ_STEP, doubling), so that the broker holds no more than the
 * worker has sent even for a legitimately large reply. */
static int read_pb(int fd, uint64_t n, uint8_t **out, const frame_clock *clk) {
  size_t cap = n < PB_READ_STEP ? (size_t)n : PB_READ_STEP, got = 0;
  uint8_t *b = malloc(cap);
  int rc = b ? 0 : FB_ENOMEM;
  while (!rc && got < n) {
    if (got == cap) {
      size_t nc = (uint64_t)cap * 2 < n ? cap * 2 : (size_t)n;
      uint8_t *nb = realloc(b, nc);
      if (!nb) {
        rc = FB_ENOMEM;
        break;
      }
      b = nb;
      cap = nc;
    }
    rc = fbd_frame_read(fd, b + got, cap - got, NULL, clk);
    if (!rc) got = cap;
  }
  if (rc) {
    free(b);
    b = NULL;
  }
  *out = b;
  return rc;
}

/* Receive the reply to the job just sent, keeping time meanwhile; a
 * checkpoint's data frames pass through *data (one buffer for them all). */
static void await_reply_in(fbd_session *s, const fbd_job *j, fbd_reply *r, uint8_t **data) {
  fbd_proc *p = s->proc;
  int kind = j->kind;
  double t0 = fbd_now(), spin = s->srv->cfg->worker_spin_us * 1e-6;
again:
  for (;;) {
    if (fbd_frame_wait(p->fd, spin, 50)) break;
    spin = 0;
    /* a parse (of a register too) whose client went away stops: the
       worker's front end polls this flag */
    if ((kind == FBD_J_REGISTER || kind == FBD_J_PARSE || kind == FBD_J_DESCRIBE) && j->call &&
        atomic_load(&j->call->gone))
      atomic_store(&s->watch->cancel, 1);
    char why[200];
    int code = 0;
    if (overdue(s, kind, t0, why, sizeof why, &code)) {
      fbd_proc_reap(p, 1, NULL, 0);
      s->end_reason = code == FB_ETIMEOUT ? FBD_END_TIMEOUT : FBD_END_CANCELLED;
      fb_errf(s->end_why, sizeof s->end_why, "%s: its session worker was stopped", why);
      fbd_logf(s->srv->log, FBD_LOG_WARN, "session %s: %s", s->tag, s->end_why);
      fatal_reply(r, code, s->end_why);
      return;
    }
  }
  /* the reply has begun: all of it within worker_reply_timeout_s */
  frame_clock clk = fbd_frame_clock_start(s, s->srv->cfg->worker_reply_timeout_s);
  wire_rep h;
  int rc = fbd_frame_read(p->fd, &h, sizeof h, NULL, &clk);
  if (!rc && h.magic == DATA_MAGIC && kind == FBD_J_CKPT && h.pblen <= DATA_MAX) {
    /* a piece of a checkpoint's stream: to the job's sink (the seal), then
       the next frame (a sink that failed takes nothing more; the worker's
       stream ends anyway and its reply follows) */
    if (!*data) *data = malloc(DATA_MAX);
    uint8_t *b = *data;
    rc = b ? (h.pblen ? fbd_frame_read(p->fd, b, h.pblen, NULL, &clk) : 0) : FB_ENOMEM;
    if (!rc && j->sink) j->sink(j->sink_user, b, (size_t)h.pblen);
    if (!rc) goto again;
  }
  /* lengths bounded before anything is allocated or read */
  uint64_t cap = fbd_reply_cap(p, j);
  char bad[200] = "";
  if (rc) {
  } else if (h.magic != WIRE_MAGIC) {
    fb_errf(bad, sizeof bad, "no frame header");
  } else if (h.code > 0 || h.code < FB_ELAST) {
    fb_errf(bad, sizeof bad, "status %d is no FB_E* code", h.code);
  } else if (h.msglen >= FBD_ERRLEN) {
    fb_errf(bad, sizeof bad, "a message of %llu bytes, over %d", (unsigned long long)h.msglen,
            FBD_ERRLEN - 1);
  } else if (h.pblen > cap || h.pblen > WIRE_MAX_PB) {
    fb_errf(bad, sizeof bad,
            "a response of %llu bytes to a %s, where at most %llu bytes can be legitimate",
            (unsigned long long)h.pblen, job_name(kind), (unsigned long long)cap);
  }
  if (bad[0]) {
    worker_malformed(s, r, bad);
    return;
  }
  if (!rc && h.msglen) rc = fbd_frame_read(p->fd, r->msg, h.msglen, NULL, &clk);
  if (!rc) r->msg[h.msglen] = 0;
  if (!rc && h.pblen) {
    rc = read_pb(p->fd, h.pblen, &r->pb, &clk);
    if (!rc) r->pblen = (size_t)h.pblen;
  }
  if (rc) {
    free(r->pb);
    r->pb = NULL;
    r->pblen = 0;
    if (rc == FB_ETIMEOUT) worker_stalled(s, r, "reply");
    else worker_lost(s, r);
    return;
  }
  r->code = h.code;
  r->finish = h.finish != 0;
  r->fatal = h.fatal != 0;
  r->registered = h.registered;
  r->refused = kind == FBD_J_BATCH && h.refused && h.finish && h.code;
  r->counters = h.counters;
  if (kind == FBD_J_BATCH && r->pb) p->unsynced = 0; /* a SyncResult went: returns handed over */
}

static void await_reply(fbd_session *s, const fbd_job *j, fbd_reply *r) {
  uint8_t *data = NULL;
  await_reply_in(s, j, r, &data);
  free(data);
}

static void send_job(fbd_session *s, fbd_job *j, const void *extra, size_t extralen, fbd_reply *r) {
  size_t rawlen = GRPC_SLICE_LENGTH(j->raw);
  wire_req q = {WIRE_MAGIC, j->kind, j->field, j->buf.fd >= 0, extralen + rawlen, j->buf.len};
  /* header and settings first (the fd rides on them), then the request */
  uint8_t head[sizeof q + sizeof(wire_create)];
  memcpy(head, &q, sizeof q);
  if (extralen) memcpy(head + sizeof q, extra, extralen);
  frame_clock clk = fbd_frame_clock_start(s, s->srv->cfg->worker_reply_timeout_s);
  int rc = fbd_frame_send(s->proc->fd, head, sizeof q + extralen, j->buf.fd,
                          GRPC_SLICE_START_PTR(j->raw), rawlen, &clk);
  if (rc == FB_ETIMEOUT) { /* a worker between jobs reads at once */
    worker_stalled(s, r, "request (it stopped reading)");
    return;
  }
  if (rc) {
    worker_lost(s, r);
    return;
  }
  if (j->kind == FBD_J_BATCH) {
    uint64_t n = j->n_launches;
    s->proc->unsynced = s->proc->unsynced + n < n ? UINT64_MAX : s->proc->unsynced + n;
  }
  await_reply(s, j, r);
}

/* A SessionRequest that the worker, decoding it, refused (the broker read
 * only its routing fields): as the broker does with a request it refuses
 * itself (methods.c stream_recv), counted bad, and the stream ends (the
 * session thread posts its END on r->refused). What the client sent after
 * it is queued behind it; the broker would never have read it, so it is
 * not run (fbd_proc_run). */
static void batch_refused(fbd_session *s, fbd_job *j, fbd_reply *r) {
  atomic_fetch_add(&s->srv->bad_requests, 1); /* as fbd_count_bad (call.c, a broker file) */
  fbd_logf(s->srv->log, FBD_LOG_WARN, "session %s: %s from %s", s->tag, r->msg,
           j->call && j->call->peer ? j->call->peer : "?");
  s->proc->refused = 1;
}

void fbd_proc_run(fbd_session *s, fbd_job *j, fbd_reply *r) {
  if (!s->proc || s->proc->reaped) {
    fatal_reply(r, FB_EINTERNAL, s->end_why[0] ? s->end_why : "the session has no worker");
    return;
  }
  if (j->kind == FBD_J_BATCH && s->proc->refused) { /* after a refused one: dropped */
    pthread_mutex_lock(&s->mu);
    r->counters = s->snap;
    pthread_mutex_unlock(&s->mu);
    return;
  }
  send_job(s, j, NULL, 0, r);
  if (r->refused) batch_refused(s, j, r);
}

/* The session's settings as the broker decided them, for CREATE and
 * RESTORE (the worker takes them with fbd_settings_in). */
static void settings_out(const fbd_session *s, wire_create *c) {
  memset(c, 0, sizeof *c);
  c->seed = s->ecfg.seed;
  c->memory_limit = s->ecfg.memory_limit;
  c->passes = s->ecfg.passes;
  c->flush_every = s->ecfg.flush_every;
  c->max_fuse_per_task = s->ecfg.max_fuse_per_task;
  c->max_kernel_statements = s->ecfg.max_kernel_statements;
  snprintf(c->mode, sizeof c->mode, "%s", s->mode);
  snprintf(c->tag, sizeof c->tag, "%s", s->tag);
}

/* A layout the worker answered with (a parse's, a restore's), checked as a
 * client's is: 0, or the reason in r->msg. */
static int layout_of_reply(const fbd_reply *r, fb_layout **out, char *msg, size_t msglen) {
  fbp_arena a;
  fbp_arena_init(&a);
  a.limit = FBD_SOURCE_REPLY_MAX * (size_t)FBP_DECODE_FACTOR;
  Fusebox__V1__Layout *m = (Fusebox__V1__Layout *)protobuf_c_message_unpack(
      &fusebox__v1__layout__descriptor, &a.pb, r->pblen, r->pb);
  char why[FBD_ERRLEN - 64];
  int rc = m ? fbp_layout_from_pb(m, out, why, sizeof why) : FB_EINVAL;
  if (!m) fb_errf(why, sizeof why, "not a fusebox.v1.Layout");
  if (rc) fb_errf(msg, msglen, "the session worker's layout: %s", why);
  fbp_arena_free(&a);
  return rc;
}

/* CKPT: the worker streams the session to j->sink in data frames, then
 * replies as usual. */
void fbd_proc_checkpoint(fbd_session *s, fbd_job *j, fbd_reply *r) { fbd_proc_run(s, j, r); }

/* RESTORE in s's new worker: the settings, with the checkpoint's file
 * descriptor (its memfd, or its file under --checkpoint-dir: nobody else
 * writes either) passed along and the engine stream's length in buflen:
 * the worker reads the stream from it straight into the new session's
 * fields, without the bytes crossing the socket pair (two copies and the
 * broker's read saved). The worker answers with the restored layout, which
 * the broker checks as it checks a client's. */
void fbd_proc_restore(fbd_session *s, fbd_job *j, fbd_reply *r) {
  wire_create c;
  settings_out(s, &c);
  /* the stream is the file's first fbd_ckpt_stream_bytes (a checked job
     has read none of it) */
  wire_req q = {WIRE_MAGIC, FBD_J_RESTORE, 0, 1, sizeof c, fbd_ckpt_stream_bytes(j->ck)};
  uint8_t head[sizeof q + sizeof c];
  memcpy(head, &q, sizeof q);
  memcpy(head + sizeof q, &c, sizeof c);
  frame_clock clk = fbd_frame_clock_start(s, s->srv->cfg->worker_reply_timeout_s);
  int rc = fbd_frame_send(s->proc->fd, head, sizeof head, fbd_ckpt_fd(j->ck), NULL, 0, &clk);
  if (rc == FB_ETIMEOUT) {
    worker_stalled(s, r, "checkpoint (it stopped reading)");
    return;
  }
  if (rc) {
    worker_lost(s, r);
    return;
  }
  await_reply(s, j, r);
}

int fbd_proc_attach(fbd_session *s, char *err, size_t errlen) {
  fbd_proc *taken;
  int rc = fbd_proc_take(s->srv, &taken, err, errlen);
  if (rc) return rc;
  pthread_mutex_lock(&s->mu); /* fbd_proc_sample reads it under s->mu */
  s->proc = taken;
  pthread_mutex_unlock(&s->mu);
  s->watch = s->proc->watch;
  if (s->srv->cfg->worker_uid_base) { /* the tenant's ids: the spare waits for them */
    const fbd_tenant *t = atomic_load(&s->owner);
    uint32_t id = s->srv->cfg->worker_uid_base + (uint32_t)(t ? t->worker_slot : 0);
    wire_ident w = {IDENT_MAGIC, id, id, 0};
    frame_clock clk = fbd_frame_clock_start(NULL, HELLO_TIMEOUT_S);
    if (fbd_frame_write(s->proc->fd, &w, sizeof w, &clk)) {
      fb_errf(err, errlen, "the session worker did not take its tenant's user");
      return FB_EINTERNAL;
    }
  }
  /* the hello: the worker made its engine and became its user (or says why not) */
  double t0 = fbd_now();
  while (!fbd_frame_wait(s->proc->fd, 0, 100))
    if (fbd_now() - t0 > HELLO_TIMEOUT_S) {
      fb_errf(err, errlen, "the session worker did not start within %.0f s", HELLO_TIMEOUT_S);
      return FB_EINTERNAL;
    }
  wire_rep h;
  char msg[FBD_ERRLEN] = "";
  frame_clock clk = fbd_frame_clock_start(NULL, HELLO_TIMEOUT_S); /* no scheduler yet */
  if (fbd_frame_read(s->proc->fd, &h, sizeof h, NULL, &clk) || h.magic != WIRE_MAGIC ||
      h.msglen >= sizeof msg ||
      (h.msglen && fbd_frame_read(s->proc->fd, msg, h.msglen, NULL, &clk))) {
    char why[256];
    fbd_proc_reap(s->proc, 1, why, sizeof why);
    fb_errf(err, errlen, "%s before it was ready", why);
    return FB_EINTERNAL;
  }
  if (h.code) {
    fb_errf(err, errlen, "the session worker could not start: %s", msg);
    return h.code < 0 && h.code >= FB_ELAST ? h.code : FB_EINTERNAL;
  }
  /* a fresh worker, its engine made and nothing of the session's in it
     yet: its measure is what the session's worker counts at least, and
     the charge of the next one admitted */
  uint64_t v;
  if (!s->srv->cfg->worker_memory_bytes && !fbd_proc_measure(s->proc, &v)) {
    atomic_store(&s->worker_base, v);
    atomic_store(&s->worker_rss, v);
    atomic_store(&s->srv->worker_charge, v);
  }
  return 0;
}

void fbd_proc_create(fbd_session *s, fbd_job *j, fbd_reply *r) {
  wire_create c;
  settings_out(s, &c);
  /* the compile cache's socket rides on CREATE (which carries no buffer) */
  int cfd = j->buf.fd < 0 ? fbd_cache_start(s) : -1;
  if (cfd >= 0) j->buf.fd = cfd;
  send_job(s, j, &c, sizeof c, r);
  if (cfd >= 0) {
    j->buf.fd = -1;
    close(cfd);
  }
}

/* PARSE: the worker parses the CreateSession's source and keeps the
 * layout for the CREATE that follows; the broker takes it as protobuf and
 * checks it as it checks a client's layout (a compromised worker can only
 * describe its own session wrongly). A failed parse ends the session. */
int fbd_proc_parse(fbd_session *s, fbd_job *j, fb_layout **out, fbd_reply *r) {
  *out = NULL;
  j->kind = FBD_J_PARSE; /* the CREATE's bytes, under another kind */
  send_job(s, j, NULL, 0, r);
  j->kind = FBD_J_CREATE;
  int rc = r->code;
  if (!rc && !r->pb) {
    rc = FB_EINTERNAL;
    fb_errf(r->msg, sizeof r->msg, "the session worker answered the parse without a layout");
  }
  if (!rc) rc = layout_of_reply(r, out, r->msg, sizeof r->msg);
  free(r->pb); /* the layout is the broker's, not the client's answer */
  r->pb = NULL;
  r->pblen = 0;
  if (rc) {
    r->code = rc;
    r->finish = r->fatal = 1;
  }
  return rc;
}

/* ---------------------------------------------------------------- the table
 * The process implementation of the session operations (fbd_session_ops,
 * server.h; --isolation process): the session's worker runs the engine
 * side; its watch page is the worker's (spawn.c). */

static void fail(fbd_reply *r, int code) {
  r->code = code;
  r->finish = r->fatal = 1;
}

static int process_open(fbd_session *s) {
  (void)s; /* the watch page comes with the worker (fbd_proc_attach) */
  return 0;
}

static void process_describe(fbd_session *s, fbd_job *j, fbd_reply *r) {
  int rc = fbd_proc_attach(s, r->msg, sizeof r->msg);
  if (rc) fail(r, rc);
  else fbd_proc_run(s, j, r);
}

/* RESTORE in a new worker; the layout it answers with, checked as a
 * client's is. */
static void process_restore(fbd_session *s, fbd_job *j, fb_layout **out, fbd_reply *r) {
  int rc = fbd_proc_attach(s, r->msg, sizeof r->msg);
  if (rc) fail(r, rc);
  else fbd_proc_restore(s, j, r);
  if (!r->code && !r->pb) {
    fb_errf(r->msg, sizeof r->msg, "the session worker answered the restore without a layout");
    fail(r, FB_EINTERNAL);
  }
  if (!r->code && layout_of_reply(r, out, r->msg, sizeof r->msg)) fail(r, FB_EINTERNAL);
  free(r->pb);
  r->pb = NULL;
  r->pblen = 0;
}

static void process_signal(fbd_session *s, int sig) {
  if (s->proc) fbd_proc_signal(s->proc, sig);
}

static void process_release(fbd_session *s) {
  fbd_proc_free(s->proc); /* its watch page goes with it */
}

/* A new session's worker, charged from its admission on: worker_memory_bytes,
 * else the last fresh worker's measure (session/spawn.c spares_measure). */
static uint64_t process_charge(fbd_server *srv) {
  if (srv->cfg->worker_memory_bytes) return srv->cfg->worker_memory_bytes;
  return atomic_load(&srv->worker_charge);
}

/* Under srv->mu: the JIT code s's worker's engine reported, and the
 * worker's own memory as the budget charges it. */
static void process_held_locked(fbd_session *s, uint64_t *code, uint64_t *own) {
  *code = atomic_load(&s->code_bytes);
  *own = fbd_budget_worker_part_locked(s->srv, s);
}

const fbd_session_ops fbd_process_ops = {
    .name = "process",
    .serving = "a worker process per session",
    .staging_memfd = 1,
    .keep_request = 1,
    .charge = process_charge,
    .held_locked = process_held_locked,
    .open = process_open,
    .attach = fbd_proc_attach,
    .parse = fbd_proc_parse,
    .create = fbd_proc_create,
    .describe = process_describe,
    .restore = process_restore,
    .run = fbd_proc_run,
    .signal = process_signal,
    .sample = fbd_proc_sample,
    .release = process_release,
};
