#define _GNU_SOURCE /* memfd_create */
/* The methods of fuseboxd, completion-queue side: decode each request,
 * refuse what is malformed or names nothing (INVALID_ARGUMENT, NOT_FOUND,
 * with a message), answer what needs no engine (health, info, stats) and
 * post the rest to the session's worker. Also the streaming of field
 * contents in both directions: WriteField gathers chunks into one buffer,
 * ReadField sends a buffer out in chunks straight from where it lies. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "proto/wire.h"
#include "server/server.h"

#define DEFAULT_CHUNK ((uint32_t)FB_CHUNK_BYTES_DEFAULT) /* fusebox/limits.h */
#define MIN_CHUNK ((uint32_t)FB_CHUNK_BYTES_MIN)
#define MAX_CHUNK ((uint32_t)FB_CHUNK_BYTES_MAX)

/* ---------------------------------------------------------------- helpers */

/* Every arena holding a decoded request counts in the budget's "decoded
 * requests" part from its decode's first block to its free. */
static void count_decoded(void *ctx, int64_t d) {
  fbd_server *srv = ctx;
  if (d >= 0) atomic_fetch_add(&srv->decoded_bytes, (uint64_t)d);
  else atomic_fetch_sub(&srv->decoded_bytes, (uint64_t)-d);
}

/* A decode that fits one arena block is never refused by the budget: a
 * session's queue holds at most 32 such, and a full budget must not end a
 * stream's small syncs. */
#define DECODE_FLOOR ((uint64_t)80 << 10)

/* How much a's decode may take: FBP_DECODE_FACTOR x max_message_bytes, and
 * for a request that lives past its decode (lives) no more than the memory
 * budget has free (pending launches aside), so that its decoded form is
 * admitted as it is made. */
static uint64_t decode_limit(fbd_server *srv, int lives, int *by_budget) {
  uint64_t cap = fbd_decode_cap(srv->cfg->max_message_bytes);
  *by_budget = 0;
  if (!lives || !srv->memory_budget) return cap;
  uint64_t part[FBD_MEM_NPARTS], used = 0;
  fbd_budget_usage(srv, part);
  /* pending launches give way: past the budget they are run before the
   * stream goes on (fbd_budget_pending_cap counts these bytes as others') */
  for (int i = 0; i < FBD_MEM_NPARTS; i++) used += i == FBD_MEM_PENDING ? 0 : part[i];
  uint64_t room = used < srv->memory_budget ? srv->memory_budget - used : 0;
  if (room < DECODE_FLOOR) room = DECODE_FLOOR;
  if (room < cap) *by_budget = 1;
  return room < cap ? room : cap;
}

/* A decode refused for its size: RESOURCE_EXHAUSTED naming the request,
 * its wire size and the limit it passed. */
static void refuse_decoded(fbd_call *c, const ProtobufCMessageDescriptor *d, size_t n,
                           uint64_t limit, uint64_t tried, int by_budget) {
  fbd_server *srv = c->srv;
  char w[32], l[32], err[FBD_ERRLEN], what[160];
  fbd_fmt_bytes(w, sizeof w, n);
  fbd_fmt_bytes(l, sizeof l, limit);
  if (by_budget) {
    /* refused for the room the budget had: the standard refusal, naming
     * the parts (or, to a user tenant, its own share) */
    snprintf(what, sizeof what, "decoding %s (%s on the wire)", d->name, w);
    int all = fbd_auth_sees_all(srv, c->tenant); /* before srv->mu */
    pthread_mutex_lock(&srv->mu);
    int rc = fbd_budget_admit_locked(srv, tried, what, c->tenant, all, err, sizeof err);
    pthread_mutex_unlock(&srv->mu);
    if (!rc) /* room came free since the decode began */
      fb_errf(err, sizeof err,
              "%s of %s decodes to more than %s, what the memory budget had free (memory_budget)",
              d->name, w, l);
    fbd_call_finish(c, FB_EQUOTA, "%s", err);
    return;
  }
  fbd_logf(srv->log, FBD_LOG_WARN, "%s of %s on %s from %s decodes to more than %s: refused",
           d->name, w, c->m->path + 1, c->peer ? c->peer : "?", l);
  fbd_decode_refusal(err, sizeof err, d->name, n, 1, limit, srv->cfg->max_message_bytes);
  fbd_call_finish(c, FB_EQUOTA, "%s", err);
}

/* Decode bb, under decode_limit; keep, when given, keeps its bytes (for a
 * worker process); lives: the request outlives this call (a job). */
static void *decode_keep(fbd_call *c, grpc_byte_buffer *bb, const ProtobufCMessageDescriptor *d,
                         fbp_arena *a, grpc_slice *keep, int lives) {
  grpc_slice s = fbp_bb_slice(bb);
  int by_budget;
  size_t n = GRPC_SLICE_LENGTH(s);
  if (lives && !a->count) fbp_arena_count(a, count_decoded, c->srv);
  uint64_t limit = decode_limit(c->srv, lives, &by_budget);
  a->limit = limit > SIZE_MAX - a->held ? 0 : a->held + (size_t)limit;
  a->over = 0;
  void *m = protobuf_c_message_unpack(d, &a->pb, n, GRPC_SLICE_START_PTR(s));
  a->limit = 0; /* what the server adds later (a source's kernels) is its own */
  if (m && keep) {
    grpc_slice_unref(*keep);
    *keep = s;
  } else {
    grpc_slice_unref(s);
  }
  if (!m && a->over) {
    uint64_t tried = limit + 1; /* it needed more than its limit */
    fbp_arena_free(a); /* nothing of it is used: give its bytes back before refusing */
    fbd_count_bad(c->srv);
    refuse_decoded(c, d, n, limit, tried, by_budget);
  } else if (!m) {
    fbd_count_bad(c->srv);
    fbd_logf(c->srv->log, FBD_LOG_WARN, "malformed %s (%zu bytes) on %s from %s", d->name, n,
             c->m->path + 1, c->peer ? c->peer : "?");
    char err[FBD_ERRLEN];
    fbd_decode_refusal(err, sizeof err, d->name, n, 0, 0, 0);
    fbd_call_finish(c, FB_EINVAL, "%s", err);
  }
  return m;
}

static void *decode(fbd_call *c, grpc_byte_buffer *bb, const ProtobufCMessageDescriptor *d,
                    fbp_arena *a) {
  return decode_keep(c, bb, d, a, NULL, 0);
}

/* A job's request, its bytes kept when a worker process will run it. */
static void *decode_job(fbd_call *c, grpc_byte_buffer *bb, const ProtobufCMessageDescriptor *d,
                        fbd_job *j) {
  return decode_keep(c, bb, d, &j->arena, c->srv->ops->keep_request ? &j->raw : NULL, 1);
}

static int missing(fbd_call *c, grpc_byte_buffer *bb) {
  if (bb) return 0;
  if (!c->recv_failed) {
    fbd_count_bad(c->srv);
    fbd_call_finish(c, FB_EINVAL, "no request message");
  }
  return 1;
}

/* The session a request names, or NULL after answering NOT_FOUND. */
static fbd_session *named(fbd_call *c, const char *id, size_t n) {
  fbd_session *s = fbd_session_find(c->srv, id, n);
  if (!s) {
    fbd_count_bad(c->srv);
    /* behind a proxy, a call for a session of another replica (the routing
       key lost, or that replica gone) lands here: say so in those terms */
    fbd_call_finish(c, FB_ENOENT, "session %.8s is not on replica %s (lost or moved)",
                    n && id ? id : "''", c->srv->replica);
  } else if (fbd_auth_may_use(c, s)) { /* another tenant's */
    fbd_count_bad(c->srv);
    fbd_call_finish_status(c, FBP_GRPC_PERMISSION_DENIED, FB_EINVAL,
                           "this session belongs to another tenant");
    fbd_session_unref(s);
    s = NULL;
  }
  return s;
}

static int post(fbd_call *c, fbd_session *s, fbd_job *j) {
  if (!fbd_session_post(s, j)) return 0;
  char why[sizeof s->end_why] = ""; /* a drain's reason, for whichever call hears of it first */
  pthread_mutex_lock(&s->mu);
  if (s->drained) memcpy(why, s->end_why, sizeof why);
  pthread_mutex_unlock(&s->mu);
  if (why[0]) {
    pthread_mutex_lock(&c->mu); /* before the status: pump reads them */
    c->st_extra_key = FBD_ENDED_KEY;
    snprintf(c->st_extra, sizeof c->st_extra, "%s", why);
    pthread_mutex_unlock(&c->mu);
    fbd_call_finish_status(c, FBP_GRPC_UNAVAILABLE, FB_EIO, why);
  }
  else fbd_call_finish(c, FB_ENOENT, "session %s has ended", s->tag);
  fbd_job_free(j);
  return FB_ENOENT;
}

static void free_session_ref(fbd_call *c) { fbd_session_unref(c->sess); }

/* Bytes of a whole-field transfer, which the server stages in memory: a
 * sparse field's extent can be far larger than what it holds, so a
 * transfer is bounded by the session's memory limit. */
static int transfer_bytes(fbd_call *c, fbd_session *s, int field, uint64_t *bytes,
                          const char *what) {
  char err[256];
  int rc = fbd_field_bytes(s->layout, field, bytes, err, sizeof err);
  uint64_t lim = s->ecfg.memory_limit;
  if (!rc && lim && *bytes > lim) {
    fb_errf(err, sizeof err,
            "field '%s' spans %llu bytes, more than the session's memory limit "
            "(%llu bytes) lets the server stage",
            s->layout->nodes[field].name, (unsigned long long)*bytes, (unsigned long long)lim);
    rc = FB_EQUOTA;
  }
  if (rc) {
    fbd_count_bad(c->srv);
    fbd_call_finish(c, rc, "%s: %s", what, err);
  }
  return rc;
}

/* ---------------------------------------------------------------- health, info, stats */

static void health_recv(fbd_call *c, grpc_byte_buffer *bb) {
  if (missing(c, bb)) return;
  fbp_arena a;
  fbp_arena_init(&a);
  Grpc__Health__V1__HealthCheckRequest *m =
      decode(c, bb, &grpc__health__v1__health_check_request__descriptor, &a);
  int ready_svc = m && strcmp(m->service, "fusebox.v1.Ready") == 0; /* readiness: not draining */
  if (m && m->service[0] && strcmp(m->service, "fusebox.v1.Fusebox") != 0 && !ready_svc) {
    fbd_call_finish(c, FB_ENOENT, "unknown service '%s'", m->service);
  } else if (m) {
    Grpc__Health__V1__HealthCheckResponse r = GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__INIT;
    /* NOT_SERVING while stopping, or while a failed GPU context waits for
     * the sessions it ended to close before it is made again */
    int ok = !atomic_load(&c->srv->stopping) && fb_engine_healthy(c->srv->engine, NULL, 0);
    if (ready_svc && atomic_load(&c->srv->draining)) ok = 0;
    r.status = ok ? GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING
                  : GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__NOT_SERVING;
    fbd_call_send_msg(c, &r.base);
    fbd_call_finish(c, FB_OK, NULL);
  }
  fbp_arena_free(&a);
}

static void info_recv(fbd_call *c, grpc_byte_buffer *bb) {
  if (missing(c, bb)) return;
  fbp_arena a;
  fbp_arena_init(&a);
  fbd_server *srv = c->srv;
  if (decode(c, bb, &fusebox__v1__info_request__descriptor, &a)) {
    Fusebox__V1__ServerInfo r = FUSEBOX__V1__SERVER_INFO__INIT;
    r.version = FBD_VERSION;
    r.backend = (char *)srv->backend;
    r.cores = (int32_t)sysconf(_SC_NPROCESSORS_ONLN);
    r.max_sessions = (uint32_t)srv->cfg->max_sessions;
    r.session_memory_limit = srv->cfg->session_memory_limit;
    r.max_message_bytes = srv->cfg->max_message_bytes;
    r.n_listen = (size_t)srv->nlisten;
    r.listen = srv->listen;
    r.uptime_s = fbd_now() - srv->started;
    r.replica = srv->replica;
    r.draining = atomic_load(&srv->draining) != 0;
    fbd_call_send_msg(c, &r.base);
    fbd_call_finish(c, FB_OK, NULL);
  }
  fbp_arena_free(&a);
}

static void fill_server_stats(fbd_server *srv, Fusebox__V1__ServerStats *r) {
  pthread_mutex_lock(&srv->mu);
  fbd_stats st = srv->st;
  r->sessions_active = (uint32_t)srv->nsessions;
  pthread_mutex_unlock(&srv->mu);
  r->sessions_created = st.sessions_created;
  r->sessions_closed = st.sessions_closed;
  r->sessions_disconnected = st.sessions_disconnected;
  r->sessions_reaped = st.sessions_reaped;
  r->sessions_failed = st.sessions_failed;
  r->memory_bytes = st.memory_bytes;
  r->memory_peak_bytes = st.memory_peak_bytes;
  r->launches = st.launches;
  r->syncs = st.syncs;
  r->bad_requests = atomic_load(&srv->bad_requests);
  r->bytes_in = atomic_load(&srv->bytes_in);
  r->bytes_out = atomic_load(&srv->bytes_out);
  r->calls_refused = atomic_load(&srv->calls_refused);
  r->tenant_calls_refused = atomic_load(&srv->tenant_calls_refused);
  r->uptime_s = fbd_now() - srv->started;
}

/* Every live session, by tag only: ids are capabilities and stay secret. */
static int list_sessions(fbd_call *c, fbp_arena *a, Fusebox__V1__ServerStats *r) {
  fbd_server *srv = c->srv;
  int max = srv->cfg->max_sessions;
  fbd_session **v = fbp_alloc(a, sizeof *v * (size_t)max);
  r->sessions = fbp_alloc(a, sizeof *r->sessions * (size_t)max);
  Fusebox__V1__SessionStats *ss = fbp_alloc(a, sizeof *ss * (size_t)max);
  if (!v || !r->sessions || !ss) return FB_ENOMEM;
  int n = 0;
  pthread_mutex_lock(&srv->mu);
  for (int i = 0; i < max; i++)
    if (srv->sessions[i] && fbd_auth_sees(c, srv->sessions[i])) {
      fbd_session_ref(srv->sessions[i]);
      v[n++] = srv->sessions[i];
    }
  pthread_mutex_unlock(&srv->mu);
  for (int i = 0; i < n; i++) {
    fbd_session_stats_pb(v[i], a, &ss[i], 0);
    r->sessions[i] = &ss[i];
    fbd_session_unref(v[i]);
  }
  r->n_sessions = (size_t)n;
  return 0;
}

static void stats_recv(fbd_call *c, grpc_byte_buffer *bb) {
  if (missing(c, bb)) return;
  fbp_arena a;
  fbp_arena_init(&a);
  Fusebox__V1__StatsRequest *m = decode(c, bb, &fusebox__v1__stats_request__descriptor, &a);
  Fusebox__V1__ServerStats r = FUSEBOX__V1__SERVER_STATS__INIT;
  Fusebox__V1__SessionStats one, *onep = &one;
  fbd_session *s = NULL;
  if (!m) goto out;
  fill_server_stats(c->srv, &r);
  fbd_budget_stats_pb(c->srv, &a, &r);
  if (m->session_id[0]) {
    if (!(s = named(c, m->session_id, strlen(m->session_id)))) goto out;
    fbd_session_stats_pb(s, &a, &one, 1);
    r.n_sessions = 1;
    r.sessions = &onep;
  } else if (list_sessions(c, &a, &r)) {
    fbd_call_finish(c, FB_ENOMEM, "out of memory");
    goto out;
  }
  fbd_auth_scope_stats(c, &r);
  fbd_call_send_msg(c, &r.base);
  fbd_call_finish(c, FB_OK, NULL);
out:
  fbd_session_unref(s);
  fbp_arena_free(&a);
}

/* ---------------------------------------------------------------- sessions */

/* The passes map: start from every pass, apply what the client says. */
static int check_passes(const Fusebox__V1__SessionOptions *o, fb_session_config *ec, char *err,
                        size_t errlen) {
  static const char *const known[] = {"listgen", "demote", "fusion", "dse"};
  static const unsigned bits[] = {FB_PASSES_LISTGEN, FB_PASSES_DEMOTE, FB_PASSES_FUSION,
                                  FB_PASSES_DSE};
  unsigned passes = FB_PASSES_ALL;
  for (size_t i = 0; i < o->n_passes; i++) {
    int k = 0;
    while (k < 4 && strcmp(o->passes[i]->key, known[k]) != 0) k++;
    if (k == 4) {
      fb_errf(err, errlen, "unknown pass '%s' (expected listgen, demote, fusion or dse)",
              o->passes[i]->key);
      return FB_EINVAL;
    }
    passes = o->passes[i]->value ? passes | bits[k] : passes & ~bits[k];
  }
  ec->passes = o->n_passes ? passes | FB_PASSES_EXACT : 0;
  return 0;
}

/* max_fuse_per_task past this fuses no more: a fused task stands for at
 * most the optimizer's max_fused_tasks (FB_MAX_FUSED_TASKS) launches, so no
 * task takes part in more fusions a round. A client's larger number
 * (2^31-1) is refused by name rather than handed to the optimizer. */
#define FBD_MAX_FUSE_PER_TASK FB_MAX_FUSED_TASKS

static int check_options(fbd_server *srv, const Fusebox__V1__SessionOptions *o,
                         fb_session_config *ec, char *err, size_t errlen) {
  memset(ec, 0, sizeof *ec);
  ec->mode = "sync";
  ec->memory_limit = srv->cfg->session_memory_limit;
  ec->max_kernel_statements = srv->cfg->max_kernel_statements;
  if (!o) return 0;
  const char *be = o->backend;
  if (be[0] && strcmp(be, "auto") && strcmp(be, "cpu") && strcmp(be, "cuda")) {
    fb_errf(err, errlen, "unknown backend '%s' (expected auto, cpu or cuda)", be);
    return FB_EINVAL;
  }
  if (be[0] && strcmp(be, "auto") && strcmp(be, srv->backend)) {
    fb_errf(err, errlen, "this server runs the %s backend; the session asked for %s", srv->backend,
            be);
    return FB_EUNSUPPORTED;
  }
  if (o->mode[0] && strcmp(o->mode, "sync") && strcmp(o->mode, "async")) {
    fb_errf(err, errlen, "unknown mode '%s' (expected sync or async)", o->mode);
    return FB_EINVAL;
  }
  if (o->mode[0]) ec->mode = strcmp(o->mode, "sync") ? "async" : "sync";
  if (o->max_fuse_per_task < 0 || o->compile_threads < 0) {
    fb_errf(err, errlen, "%s %d must be >= 0",
            o->max_fuse_per_task < 0 ? "max_fuse_per_task" : "compile_threads",
            o->max_fuse_per_task < 0 ? o->max_fuse_per_task : o->compile_threads);
    return FB_EINVAL;
  }
  if (o->max_fuse_per_task > FBD_MAX_FUSE_PER_TASK) {
    fb_errf(err, errlen,
            "max_fuse_per_task %d is over this server's limit of %d (a fused task stands for "
            "at most %d launches; 0 = the default, 1)",
            o->max_fuse_per_task, FBD_MAX_FUSE_PER_TASK, FB_MAX_FUSED_TASKS);
    return FB_EINVAL;
  }
  ec->flush_every = o->flush_every;
  ec->max_fuse_per_task = o->max_fuse_per_task;
  uint64_t lim = srv->cfg->session_memory_limit;
  if (o->memory_limit && lim && o->memory_limit > lim) {
    fb_errf(err, errlen,
            "the session asked for a memory limit of %llu bytes; this server "
            "allows at most %llu bytes per session",
            (unsigned long long)o->memory_limit, (unsigned long long)lim);
    return FB_EQUOTA;
  }
  if (o->memory_limit) ec->memory_limit = o->memory_limit;
  ec->seed = o->seed;
  return check_passes(o, ec, err, errlen);
}

/* A new session while draining: UNAVAILABLE with the retry hint. */
static int refuse_draining(fbd_call *c) {
  if (!atomic_load(&c->srv->draining)) return 0;
  char msg[160];
  fbd_drain_refusal(c->srv, msg, sizeof msg);
  c->st_extra_key = FBD_RETRY_KEY;
  snprintf(c->st_extra, sizeof c->st_extra, "%d", fbd_drain_retry_ms());
  fbd_logf(c->srv->log, FBD_LOG_DEBUG, "%s from %s refused: %s", c->m->path + 1,
           c->peer ? c->peer : "?", msg);
  fbd_call_finish_status(c, FBP_GRPC_UNAVAILABLE, FB_EIO, msg);
  return 1;
}

static void create_recv(fbd_call *c, grpc_byte_buffer *bb) {
  if (missing(c, bb)) return;
  fbd_server *srv = c->srv;
  fbp_arena a;
  fbp_arena_init(&a);
  char err[FBD_ERRLEN];
  fb_session_config ec;
  fb_layout *l = NULL;
  fbd_session *s = NULL;
  grpc_slice raw = grpc_empty_slice();
  /* the bytes go on to the worker process, or (a source) to the session's
     thread, which parses it: never here, on a completion-queue thread */
  Fusebox__V1__CreateSessionRequest *m = decode_keep(
      c, bb, &fusebox__v1__create_session_request__descriptor, &a, &raw, 0);
  int rc = m ? 0 : FB_EINVAL;
  if (m && atomic_load(&srv->stopping)) {
    fbd_call_finish_status(c, FBP_GRPC_UNAVAILABLE, FB_EIO, "the server is shutting down");
    rc = FB_EIO;
  } else if (m && refuse_draining(c)) {
    rc = FB_EIO;
  } else if (m && m->source && m->layout && m->layout->n_nodes) {
    fbd_count_bad(srv);
    fbd_call_finish(c, rc = FB_EINVAL, "CreateSession: give a layout or a source, not both");
  } else if (m && ((rc = check_options(srv, m->options, &ec, err, sizeof err)) ||
                   (!m->source && (rc = fbp_layout_from_pb(m->layout, &l, err, sizeof err))))) {
    fbd_count_bad(srv);
    fbd_call_finish(c, rc, "%s", err);
  } else if (m && (rc = fbd_session_new_for(c, l, &ec, &s, err, sizeof err))) {
    fbd_logf(srv->log, FBD_LOG_WARN, "session for %s refused: %s", c->peer ? c->peer : "?", err);
    fbd_call_finish(c, rc, "%s", err);
  }
  if (!rc) {
    fbd_job *j = fbd_job_new(FBD_J_CREATE, c);
    if (j) {
      j->raw = raw;
      raw = grpc_empty_slice();
    }
    if (!j || fbd_session_post(s, j)) {
      fbd_job_free(j);
      fbd_job *end = fbd_job_new(FBD_J_END, NULL);
      if (end && fbd_session_post(s, end)) fbd_job_free(end);
      fbd_call_finish(c, FB_ENOMEM, "out of memory");
    }
    fbd_session_unref(s);
  }
  grpc_slice_unref(raw);
  fbp_arena_free(&a);
}

static void close_recv(fbd_call *c, grpc_byte_buffer *bb) {
  if (missing(c, bb)) return;
  fbp_arena a;
  fbp_arena_init(&a);
  Fusebox__V1__CloseSessionRequest *m =
      decode(c, bb, &fusebox__v1__close_session_request__descriptor, &a);
  fbd_session *s = m ? named(c, m->session_id, strlen(m->session_id)) : NULL;
  if (s) {
    fbd_job *j = fbd_job_new(FBD_J_CLOSE, c);
    if (j) post(c, s, j);
    else fbd_call_finish(c, FB_ENOMEM, "out of memory");
    fbd_session_unref(s);
  }
  fbp_arena_free(&a);
}

static void cancel_recv(fbd_call *c, grpc_byte_buffer *bb) {
  if (missing(c, bb)) return;
  fbp_arena a;
  fbp_arena_init(&a);
  Fusebox__V1__CancelRequest *m = decode(c, bb, &fusebox__v1__cancel_request__descriptor, &a);
  fbd_session *s = m ? named(c, m->session_id, strlen(m->session_id)) : NULL;
  if (s) {
    int pending = fbd_session_cancel(s, m->through_launch);
    if (pending == -2) {
      fbd_call_finish(c, FB_EINVAL,
                      "Cancel: through_launch %llu is more than %llu launches past those "
                      "the session has received",
                      (unsigned long long)m->through_launch, (unsigned long long)FBD_CANCEL_AHEAD);
    } else if (pending < 0) {
      fbd_call_finish(c, FB_ENOENT, "session %s has ended", s->tag);
    } else {
      fbd_logf(c->srv->log, FBD_LOG_INFO, "session %s: cancelled by %s (%d requests pending)",
               s->tag, c->peer ? c->peer : "?", pending);
      Fusebox__V1__CancelResponse r = FUSEBOX__V1__CANCEL_RESPONSE__INIT;
      r.requests_pending = (uint64_t)pending;
      fbd_call_send_msg(c, &r.base);
      fbd_call_finish(c, FB_OK, NULL);
    }
    fbd_session_unref(s);
  }
  fbp_arena_free(&a);
}

static void register_recv(fbd_call *c, grpc_byte_buffer *bb) {
  if (missing(c, bb)) return;
  fbd_job *j = fbd_job_new(FBD_J_REGISTER, c);
  if (!j) {
    fbd_call_finish(c, FB_ENOMEM, "out of memory");
    return;
  }
  Fusebox__V1__RegisterKernelsRequest *m =
      decode_job(c, bb, &fusebox__v1__register_kernels_request__descriptor, j);
  fbd_session *s = m ? named(c, m->session_id, strlen(m->session_id)) : NULL;
  j->msg = m; /* a source in it is parsed by the session's worker (exec.c) */
  if (s) {
    post(c, s, j); /* frees j when it fails */
    j = NULL;
  }
  fbd_session_unref(s);
  fbd_job_free(j);
}

/* DescribeSource: a session of its own whose one job parses the source in
 * a sandbox (the worker process; the session thread under thread
 * isolation) and answers; it counts against the tenant's sessions while it
 * runs, takes one of its compile slots, and ends with its answer. */
static void describe_recv(fbd_call *c, grpc_byte_buffer *bb) {
  if (missing(c, bb)) return;
  fbd_server *srv = c->srv;
  fbd_job *j = fbd_job_new(FBD_J_DESCRIBE, c);
  if (!j) {
    fbd_call_finish(c, FB_ENOMEM, "out of memory");
    return;
  }
  Fusebox__V1__Source *m =
      decode_keep(c, bb, &fusebox__v1__source__descriptor, &j->arena, &j->raw, 1);
  char err[FBD_ERRLEN];
  fb_session_config ec;
  fbd_session *s = NULL;
  int rc = m ? check_options(srv, NULL, &ec, err, sizeof err) : FB_EINVAL;
  if (m && atomic_load(&srv->stopping)) {
    fbd_call_finish_status(c, FBP_GRPC_UNAVAILABLE, FB_EIO, "the server is shutting down");
    rc = FB_EIO;
  } else if (m && !rc && (rc = fbd_session_new_for(c, NULL, &ec, &s, err, sizeof err))) {
    fbd_call_finish(c, rc, "DescribeSource: %s", err);
  }
  if (!rc) {
    s->describe = 1;
    if (fbd_session_post(s, j)) { /* the session ends at once */
      fbd_job *end = fbd_job_new(FBD_J_END, NULL);
      if (end && fbd_session_post(s, end)) fbd_job_free(end);
      fbd_call_finish(c, FB_ENOMEM, "out of memory");
    } else {
      j = NULL;
    }
    fbd_session_unref(s);
  }
  fbd_job_free(j);
}

/* ---------------------------------------------------------------- the Session stream */

/* The stream ends the session: a client that half-closed has its queued
 * work run first; one that is gone has it dropped at once. */
static void end_attached(fbd_call *c, int reason) {
  if (!c->sess) return;
  if (reason == FBD_END_DISCONNECTED) {
    fbd_session_abort(c->sess, reason, "its client disconnected");
    return;
  }
  fbd_job *j = fbd_job_new(FBD_J_END, NULL);
  if (!j) return;
  j->reason = reason;
  if (fbd_session_post(c->sess, j)) fbd_job_free(j);
}

/* The first message attaches the stream to its session. */
static int attach(fbd_call *c, const fbp_session_head *h) {
  if (!h->session_id_len) {
    fbd_count_bad(c->srv);
    fbd_call_finish(c, FB_EINVAL, "the first SessionRequest must name the session");
    return FB_EINVAL;
  }
  fbd_session *s = named(c, h->session_id, h->session_id_len);
  if (!s) return FB_ENOENT;
  int rc = fbd_session_attach(s, c);
  if (rc) {
    fbd_session_unref(s);
    fbd_call_finish(c, rc,
                    rc == FB_EINVAL ? "session already has a Session stream" : "session has ended");
    return rc;
  }
  c->sess = s;
  fbd_logf(c->srv->log, FBD_LOG_DEBUG, "session %s: stream attached from %s", s->tag,
           c->peer ? c->peer : "?");
  return 0;
}

/* A SessionRequest read for its routing fields only (its bytes go on to the
 * session's worker process, which decodes them once): 0 after refusing it
 * as decode refuses a message that is not one. */
static int scan_job(fbd_call *c, grpc_byte_buffer *bb, fbd_job *j, fbp_session_head *h) {
  j->raw = fbp_bb_slice(bb);
  size_t n = GRPC_SLICE_LENGTH(j->raw);
  if (!fbp_session_scan(GRPC_SLICE_START_PTR(j->raw), n, h)) return 1;
  fbd_count_bad(c->srv);
  fbd_logf(c->srv->log, FBD_LOG_WARN, "malformed %s (%zu bytes) on %s from %s",
           fusebox__v1__session_request__descriptor.name, n, c->m->path + 1,
           c->peer ? c->peer : "?");
  char err[FBD_ERRLEN];
  fbd_decode_refusal(err, sizeof err, fusebox__v1__session_request__descriptor.name, n, 0, 0, 0);
  fbd_call_finish(c, FB_EINVAL, "%s", err);
  return 0;
}

/* Under thread isolation the session thread runs the decoded message: it is
 * decoded here, once, and its routing fields read from it. */
static int decode_batch(fbd_call *c, grpc_byte_buffer *bb, fbd_job *j, fbp_session_head *h) {
  Fusebox__V1__SessionRequest *m = decode_job(c, bb, &fusebox__v1__session_request__descriptor, j);
  if (!m) return 0;
  j->msg = m;
  *h = (fbp_session_head){m->session_id, strlen(m->session_id), m->n_launches, m->n_tape,
                          m->sync, m->flush};
  return 1;
}

static void stream_recv(fbd_call *c, grpc_byte_buffer *bb) {
  if (!bb) { /* half-closed: the client is done; or the call failed */
    if (c->sess) end_attached(c, c->recv_failed ? FBD_END_DISCONNECTED : FBD_END_CLOSED);
    else if (!c->recv_failed) fbd_call_finish(c, FB_OK, NULL);
    return;
  }
  fbd_job *j = fbd_job_new(FBD_J_BATCH, c);
  fbp_session_head h;
  int ok = j && (fbd_isolated(c->srv->cfg) ? scan_job : decode_batch)(c, bb, j, &h);
  if (!j) fbd_call_finish(c, FB_ENOMEM, "out of memory");
  if (!ok) {
    end_attached(c, FBD_END_CLOSED);
    fbd_job_free(j);
    return;
  }
  j->n_launches = h.n_launches;
  j->sync = h.sync;
  if (!c->sess && attach(c, &h)) {
    fbd_job_free(j);
    return;
  }
  if (h.session_id_len &&
      (h.session_id_len != strlen(c->sess->id) || memcmp(h.session_id, c->sess->id, h.session_id_len))) {
    fbd_count_bad(c->srv);
    fbd_call_finish(c, FB_EINVAL, "this stream belongs to session %s", c->sess->tag);
    end_attached(c, FBD_END_CLOSED);
    fbd_job_free(j);
    return;
  }
  fbd_auth_count_stream(c, h.n_launches, h.sync != 0);
  /* a message of tape marks alone is work too (it was once dropped here) */
  if (h.n_launches || h.n_tape || h.flush || h.sync) {
    if (post(c, c->sess, j)) return;
  } else {
    fbd_job_free(j);
  }
  if (fbd_session_may_recv(c->sess)) fbd_call_recv(c);
}

/* Every response went out: a stream paused for its client's slowness may
 * receive again. */
static void stream_sent(fbd_call *c) {
  if (c->sess) fbd_session_resume(c->sess);
}

static void stream_close(fbd_call *c, int cancelled) {
  if (cancelled) end_attached(c, FBD_END_DISCONNECTED);
}

/* ---------------------------------------------------------------- WriteField */

typedef struct wstate {
  fbd_buf buf;
  uint64_t total, fill;
  int field;
} wstate;

/* The first chunk names the session and field; make the buffer. */
static wstate *write_begin(fbd_call *c, const fbp_chunk *ch) {
  uint64_t bytes = 0;
  fbd_session *s = named(c, ch->session_id, ch->session_id_len);
  if (!s) return NULL;
  c->sess = s;
  if (transfer_bytes(c, s, ch->field, &bytes, "WriteField")) return NULL;
  if (ch->total_bytes != bytes) {
    fbd_call_finish(c, FB_EINVAL, "WriteField: field '%s' holds %llu bytes; total_bytes says %llu",
                    s->layout->nodes[ch->field].name, (unsigned long long)bytes,
                    (unsigned long long)ch->total_bytes);
    return NULL;
  }
  wstate *w = calloc(1, sizeof *w);
  char err[FBD_ERRLEN];
  int rc = w ? fbd_stage_take(s, bytes, &w->buf, "WriteField", err, sizeof err) : FB_ENOMEM;
  if (rc) {
    free(w);
    if (rc == FB_EQUOTA) fbd_call_finish(c, rc, "%s", err);
    else
      fbd_call_finish(c, FB_ENOMEM, "WriteField: cannot stage %llu bytes",
                      (unsigned long long)bytes);
    return NULL;
  }
  w->total = bytes;
  w->field = ch->field;
  c->state = w;
  return w;
}

/* Where a chunk's data goes; NULL after refusing it. */
static uint8_t *write_target(void *call, const fbp_chunk *ch) {
  fbd_call *c = call;
  wstate *w = c->state;
  if (!w && !(w = write_begin(c, ch))) return NULL;
  if ((ch->session_id_len &&
       (ch->session_id_len != 32 || memcmp(ch->session_id, c->sess->id, 32))) ||
      (ch->field && ch->field != w->field) || ch->offset != w->fill ||
      ch->len > w->total - w->fill) {
    fbd_count_bad(c->srv);
    fbd_call_finish(c, FB_EINVAL,
                    "WriteField: chunk at offset %llu (%zu bytes) does not continue "
                    "the field (%llu of %llu bytes received)",
                    (unsigned long long)ch->offset, ch->len, (unsigned long long)w->fill,
                    (unsigned long long)w->total);
    return NULL;
  }
  return w->buf.p + w->fill;
}

static void write_end(fbd_call *c) {
  wstate *w = c->state;
  if (!w || w->fill != w->total) {
    fbd_count_bad(c->srv);
    fbd_call_finish(c, FB_EINVAL, "WriteField: the stream ended after %llu of %llu bytes",
                    (unsigned long long)(w ? w->fill : 0), (unsigned long long)(w ? w->total : 0));
    return;
  }
  fbd_job *j = fbd_job_new(FBD_J_WRITE, c);
  if (!j) {
    fbd_call_finish(c, FB_ENOMEM, "out of memory");
    return;
  }
  j->buf = w->buf;
  j->field = w->field;
  w->buf = (fbd_buf){NULL, 0, -1};
  post(c, c->sess, j);
}

/* One chunk: its data is copied from the message's slices straight into
 * the staging buffer when it comes last (always, from Fusebox peers). */
static int write_chunk(fbd_call *c, grpc_byte_buffer *bb) {
  fbp_chunk ch;
  char err[256];
  int rc = fbp_bb_take_chunk(bb, &ch, write_target, c, err, sizeof err);
  if (rc == FBP_CHUNK_MALFORMED) {
    fbd_count_bad(c->srv);
    fbd_logf(c->srv->log, FBD_LOG_WARN, "%s on WriteField from %s", err, c->peer ? c->peer : "?");
    fbd_call_finish(c, FB_EINVAL, "malformed request: %s", err);
  }
  if (rc) return FB_EINVAL; /* refused: write_target answered */
  ((wstate *)c->state)->fill += ch.len;
  return 0;
}

static void write_recv(fbd_call *c, grpc_byte_buffer *bb) {
  if (!bb) {
    if (!c->recv_failed) write_end(c);
    return;
  }
  if (!write_chunk(c, bb)) fbd_call_recv(c);
}

static void write_free(fbd_call *c) {
  wstate *w = c->state;
  if (w && w->buf.p) fbd_stage_give(c->sess, &w->buf);
  free(w);
  fbd_session_unref(c->sess);
}

/* ---------------------------------------------------------------- ReadField */

/* A server stream of chunks out of one buffer in memory (ReadField's
 * staged field, a finished checkpoint's mapping): per chunk a header slice
 * and a slice of the buffer itself, never copied. The state lives until
 * the call is freed and the last slice sent (a reference each). */
typedef struct cstream {
  pthread_mutex_t mu;
  atomic_int refs;
  const uint8_t *p;
  uint64_t len, off;
  uint32_t chunk;
  /* a chunk's message up to its data's bytes */
  size_t (*header)(uint8_t *out, uint64_t off, uint64_t len, uint64_t n);
  /* what p lies in: a staged buffer of a session (ReadField), or a
     checkpoint (Checkpoint, FetchCheckpoint) */
  fbd_buf buf;
  fbd_session *sess;
  fbd_ckpt_job *k;
} cstream;

static void cs_unref(void *p) {
  cstream *r = p;
  if (atomic_fetch_sub(&r->refs, 1) != 1) return;
  if (r->sess) {
    fbd_stage_give(r->sess, &r->buf);
    fbd_session_unref(r->sess);
  }
  fbd_ckpt_end(r->k);
  pthread_mutex_destroy(&r->mu);
  free(r);
}

/* Queue the next chunk. */
static void cs_next(fbd_call *c) {
  cstream *r = c->state;
  if (!r) return;
  pthread_mutex_lock(&r->mu);
  if (r->off >= r->len) {
    pthread_mutex_unlock(&r->mu);
    return;
  }
  uint64_t n = r->len - r->off < r->chunk ? r->len - r->off : r->chunk;
  uint8_t hdr[FBP_CHUNK_HEADER_MAX];
  size_t hn = r->header(hdr, r->off, r->len, n);
  atomic_fetch_add(&r->refs, 1);
  grpc_slice sl[2] = {
      grpc_slice_from_copied_buffer((const char *)hdr, hn),
      grpc_slice_new_with_user_data((void *)(r->p + r->off), (size_t)n, cs_unref, r)};
  grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(sl, 2);
  grpc_slice_unref(sl[0]);
  grpc_slice_unref(sl[1]);
  r->off += n;
  int last = r->off >= r->len;
  fbd_call_send_bb(c, bb);
  pthread_mutex_unlock(&r->mu);
  if (last) fbd_call_finish(c, FB_OK, NULL);
}

static void cs_free(fbd_call *c) {
  cstream *r = c->state;
  c->state = NULL;
  if (r) cs_unref(r);
}

/* The stream begun: the first two chunks queued (the next goes when one is sent). */
static void cs_start(fbd_call *c, cstream *r) {
  atomic_init(&r->refs, 1);
  pthread_mutex_init(&r->mu, NULL);
  c->state = r;
  cs_next(c);
  cs_next(c);
}

/* ---- ReadField: FieldChunk (offset, total, data) */

static size_t read_header(uint8_t *out, uint64_t off, uint64_t len, uint64_t n) {
  return fbp_chunk_header(out, NULL, 0, off, len, n);
}

void fbd_read_begin(fbd_call *c, fbd_session *s, fbd_buf *buf, uint32_t chunk) {
  cstream *r = calloc(1, sizeof *r);
  if (!r) {
    fbd_stage_give(s, buf);
    fbd_call_finish(c, FB_ENOMEM, "out of memory");
    return;
  }
  r->buf = *buf;
  *buf = (fbd_buf){NULL, 0, -1};
  r->sess = s;
  fbd_session_ref(s);
  r->p = r->buf.p;
  r->len = r->buf.len;
  r->chunk = chunk;
  r->header = read_header;
  cs_start(c, r);
}

static void read_recv(fbd_call *c, grpc_byte_buffer *bb) {
  if (missing(c, bb)) return;
  fbp_arena a;
  fbp_arena_init(&a);
  uint64_t bytes;
  Fusebox__V1__ReadFieldRequest *m =
      decode(c, bb, &fusebox__v1__read_field_request__descriptor, &a);
  fbd_session *s = m ? named(c, m->session_id, strlen(m->session_id)) : NULL;
  int rc = s ? transfer_bytes(c, s, m->field, &bytes, "ReadField") : FB_ENOENT;
  fbd_job *j = !rc ? fbd_job_new(m->active ? FBD_J_ACTIVE : FBD_J_READ, c) : NULL;
  if (j) {
    uint32_t ch = m->chunk_bytes ? m->chunk_bytes : DEFAULT_CHUNK;
    j->field = m->field;
    j->chunk = ch < MIN_CHUNK ? MIN_CHUNK : ch > MAX_CHUNK ? MAX_CHUNK : ch;
    post(c, s, j);
  } else if (!rc) {
    fbd_call_finish(c, FB_ENOMEM, "out of memory");
  }
  fbd_session_unref(s);
  fbp_arena_free(&a);
}

/* ---------------------------------------------------------------- checkpoints */

static uint32_t chunk_of(uint32_t asked) {
  uint32_t ch = asked ? asked : DEFAULT_CHUNK;
  return ch < MIN_CHUNK ? MIN_CHUNK : ch > MAX_CHUNK ? MAX_CHUNK : ch;
}

/* Checkpoint: a CKPT job after what the session received, its sealed bytes
 * into the directory (answered with the name) or a memfd streamed back. */
static void ckpt_recv(fbd_call *c, grpc_byte_buffer *bb) {
  if (missing(c, bb)) return;
  fbp_arena a;
  fbp_arena_init(&a);
  char err[FBD_ERRLEN];
  Fusebox__V1__CheckpointRequest *m =
      decode(c, bb, &fusebox__v1__checkpoint_request__descriptor, &a);
  fbd_session *s = m ? named(c, m->session_id, strlen(m->session_id)) : NULL;
  if (s && m->client_state.len > FBD_CKPT_STATE_MAX) {
    fbd_count_bad(c->srv);
    fbd_call_finish(c, FB_EINVAL, "Checkpoint: client_state of %zu bytes, more than %zu",
                    m->client_state.len, FBD_CKPT_STATE_MAX);
  } else if (s) {
    /* the session keeps the latest client state for the server's own
       checkpoints */
    uint8_t *st = malloc(m->client_state.len ? m->client_state.len : 1);
    pthread_mutex_lock(&s->mu);
    if (st) {
      if (m->client_state.len) memcpy(st, m->client_state.data, m->client_state.len);
      free(s->client_state);
      s->client_state = st;
      s->nclient_state = m->client_state.len;
    }
    pthread_mutex_unlock(&s->mu);
    fbd_ckpt_job *k = NULL;
    int rc = fbd_ckpt_begin(c->srv, atomic_load(&s->owner), s->tag, m->to_server,
                            m->client_state.data, m->client_state.len, &k, err, sizeof err);
    fbd_job *j = rc ? NULL : fbd_job_new(FBD_J_CKPT, c);
    if (rc) {
      atomic_fetch_add(&c->srv->ckpt_refused, 1);
      fbd_call_finish(c, rc, "Checkpoint: %s", err);
    } else if (!j) {
      fbd_ckpt_end(k);
      fbd_call_finish(c, FB_ENOMEM, "out of memory");
    } else {
      j->ck = k;
      j->sink = fbd_ckpt_sink;
      j->sink_user = k;
      j->chunk = chunk_of(m->chunk_bytes);
      post(c, s, j);
    }
  }
  fbd_session_unref(s);
  fbp_arena_free(&a);
}

/* A finished checkpoint out in chunks (CheckpointChunk: offset, data),
 * each a slice of the mapping; the mapping lives until the last is sent. */

/* One CheckpointChunk: fields 2 (offset) and 3 (data), data last. */
static size_t ck_header(uint8_t *out, uint64_t off, uint64_t len, uint64_t n) {
  (void)len;
  size_t k = 0;
  out[k++] = 2 << 3;
  for (uint64_t v = off; ; v >>= 7) {
    out[k++] = (uint8_t)((v & 0x7f) | (v > 0x7f ? 0x80 : 0));
    if (v <= 0x7f) break;
  }
  out[k++] = (3 << 3) | 2;
  for (uint64_t v = n; ; v >>= 7) {
    out[k++] = (uint8_t)((v & 0x7f) | (v > 0x7f ? 0x80 : 0));
    if (v <= 0x7f) break;
  }
  return k;
}

void fbd_ckpt_send(fbd_call *c, fbd_ckpt_job *k, uint32_t chunk) {
  cstream *r = calloc(1, sizeof *r);
  if (!r || !fbd_ckpt_map(k)) {
    free(r);
    fbd_ckpt_end(k);
    fbd_call_finish(c, FB_ENOMEM, "out of memory");
    return;
  }
  r->k = k;
  r->p = fbd_ckpt_map(k);
  r->len = fbd_ckpt_bytes(k);
  r->chunk = chunk ? chunk : DEFAULT_CHUNK;
  r->header = ck_header;
  cs_start(c, r);
}

/* FetchCheckpoint: one of the caller's checkpoints in the directory. */
static void fetch_recv(fbd_call *c, grpc_byte_buffer *bb) {
  if (missing(c, bb)) return;
  fbp_arena a;
  fbp_arena_init(&a);
  char err[FBD_ERRLEN];
  Fusebox__V1__FetchCheckpointRequest *m =
      decode(c, bb, &fusebox__v1__fetch_checkpoint_request__descriptor, &a);
  fbd_ckpt_job *k = NULL;
  int rc = m ? fbd_ckpt_open(c->srv, c->tenant, m->name, 0, &k, err, sizeof err) : FB_EINVAL;
  if (m && rc) {
    atomic_fetch_add(&c->srv->ckpt_refused, 1);
    fbd_call_finish(c, rc, "FetchCheckpoint: %s", err);
  } else if (m) {
    /* mapped read-only: the file stays as it is while it goes out */
    uint64_t len = fbd_ckpt_bytes(k);
    void *p = len ? mmap(NULL, len, PROT_READ, MAP_SHARED, fbd_ckpt_fd(k), 0) : NULL;
    if (!len) {
      fbd_ckpt_end(k);
      fbd_call_finish(c, FB_OK, NULL);
    } else if (p == MAP_FAILED) {
      fbd_ckpt_end(k);
      fbd_call_finish(c, FB_EIO, "FetchCheckpoint: cannot read it");
    } else {
      fbd_ckpt_set_map(k, p);
      fbd_ckpt_send(c, k, chunk_of(m->chunk_bytes));
    }
  }
  fbp_arena_free(&a);
}

static void list_recv(fbd_call *c, grpc_byte_buffer *bb) {
  if (missing(c, bb)) return;
  fbp_arena a;
  fbp_arena_init(&a);
  char err[FBD_ERRLEN];
  Fusebox__V1__ListCheckpointsRequest *m =
      decode(c, bb, &fusebox__v1__list_checkpoints_request__descriptor, &a);
  Fusebox__V1__CheckpointList r = FUSEBOX__V1__CHECKPOINT_LIST__INIT;
  int rc = m ? fbd_ckpt_list(c->srv, c->tenant, &a, &r, err, sizeof err) : FB_EINVAL;
  if (m && rc) {
    fbd_call_finish(c, rc, "ListCheckpoints: %s", err);
  } else if (m) {
    fbd_call_send_msg(c, &r.base);
    fbd_call_finish(c, FB_OK, NULL);
  }
  fbp_arena_free(&a);
}

/* Restore: the upload (or a name) checked (seal, owner, size) before any
 * session exists; then a session whose first job restores it. */
typedef struct rsstate {
  fbd_ckpt_job *k;
  int named;
  uint64_t memory_limit;
  char mode[8];
} rsstate;

static uint64_t upload_max(fbd_server *srv, uint64_t limit) {
  uint64_t lim = srv->cfg->session_memory_limit;
  if (limit && (!lim || limit < lim)) lim = limit; /* a client's asks never widen it */
  if (!lim) return 0; /* the memory budget alone bounds it */
  /* field storage, its sparse structure and the kernels' IR: twice the
     session's limit and 64 MiB is more than a checkpoint of it holds */
  return lim * 2 + ((uint64_t)64 << 20);
}

static void restore_fail(fbd_call *c, int rc, const char *err) {
  rsstate *st = c->state;
  if (st) { /* what was staged goes now, not when the call is freed */
    fbd_ckpt_end(st->k);
    st->k = NULL;
  }
  atomic_fetch_add(&c->srv->ckpt_refused, 1);
  fbd_count_bad(c->srv);
  fbd_logf(c->srv->log, FBD_LOG_WARN, "restore from %s refused: %s", c->peer ? c->peer : "?", err);
  fbd_call_finish(c, rc, "%s", err);
}

static void restore_end(fbd_call *c) {
  fbd_server *srv = c->srv;
  rsstate *st = c->state;
  char err[FBD_ERRLEN];
  if (!st || !st->k) {
    restore_fail(c, FB_EINVAL, "Restore: no checkpoint was sent");
    return;
  }
  int rc = st->named ? 0 : fbd_ckpt_upload_end(st->k, err, sizeof err);
  if (rc) {
    restore_fail(c, rc == FB_EINVAL || rc == FB_EIO ? FB_EINVAL : rc, err);
    return;
  }
  if (!st->named) atomic_fetch_add(&srv->ckpt_bytes_in, fbd_ckpt_bytes(st->k));
  Fusebox__V1__SessionOptions o = FUSEBOX__V1__SESSION_OPTIONS__INIT;
  o.memory_limit = st->memory_limit;
  o.mode = st->mode;
  fb_session_config ec;
  fbd_session *s = NULL;
  if (atomic_load(&srv->stopping)) {
    fbd_call_finish_status(c, FBP_GRPC_UNAVAILABLE, FB_EIO, "the server is shutting down");
    return;
  }
  if (refuse_draining(c)) return; /* a restore is a new session */
  if ((rc = check_options(srv, &o, &ec, err, sizeof err))) {
    restore_fail(c, rc, err);
    return;
  }
  if ((rc = fbd_session_new_for(c, NULL, &ec, &s, err, sizeof err))) {
    restore_fail(c, rc, err);
    return;
  }
  fbd_job *j = fbd_job_new(FBD_J_RESTORE, c);
  if (j) {
    j->ck = st->k;
    st->k = NULL;
  }
  if (!j || fbd_session_post(s, j)) {
    fbd_job_free(j);
    fbd_job *end = fbd_job_new(FBD_J_END, NULL);
    if (end && fbd_session_post(s, end)) fbd_job_free(end);
    fbd_call_finish(c, FB_ENOMEM, "out of memory");
  }
  fbd_session_unref(s);
}

static void restore_recv(fbd_call *c, grpc_byte_buffer *bb) {
  if (!bb) {
    if (!c->recv_failed) restore_end(c);
    return;
  }
  rsstate *st = c->state;
  char err[FBD_ERRLEN];
  fbp_arena a;
  fbp_arena_init(&a);
  Fusebox__V1__CheckpointChunk *m = decode(c, bb, &fusebox__v1__checkpoint_chunk__descriptor, &a);
  int rc = m ? 0 : FB_EINVAL;
  if (m && !st) {
    st = calloc(1, sizeof *st);
    if (!st) {
      fbd_call_finish(c, rc = FB_ENOMEM, "out of memory");
    } else {
      c->state = st;
      if (m->options) {
        st->memory_limit = m->options->memory_limit;
        snprintf(st->mode, sizeof st->mode, "%s",
                 !strcmp(m->options->mode, "async") ? "async" : "sync");
      }
      if (m->name[0]) {
        st->named = 1;
        rc = fbd_ckpt_open(c->srv, c->tenant, m->name, 1, &st->k, err, sizeof err);
      } else {
        rc = fbd_ckpt_upload_begin(c->srv, c->tenant, &st->k, err, sizeof err);
      }
      if (rc) restore_fail(c, rc, err);
    }
  }
  if (!rc && m && (m->data.len || m->offset)) {
    if (st->named) {
      rc = FB_EINVAL;
      restore_fail(c, rc, "Restore: give a checkpoint's name or its bytes, not both");
    } else if ((rc = fbd_ckpt_upload(st->k, m->offset, m->data.data, m->data.len,
                                     upload_max(c->srv, st->memory_limit), err, sizeof err))) {
      restore_fail(c, rc, err);
    }
  }
  fbp_arena_free(&a);
  if (!rc) fbd_call_recv(c);
}

static void restore_free(fbd_call *c) {
  rsstate *st = c->state;
  if (!st) return;
  fbd_ckpt_end(st->k);
  free(st);
}

/* Drain (admin): with a tenants file an admin's call; without one only on a
 * unix: socket, whose mode and group guard it (a TCP client may be anyone,
 * even through a proxy on loopback). SIGTERM does the same. */
static void drain_recv(fbd_call *c, grpc_byte_buffer *bb) {
  if (missing(c, bb)) return;
  fbp_arena a;
  fbp_arena_init(&a);
  fbd_server *srv = c->srv;
  int auth = srv->auth && srv->auth->enabled;
  if (decode(c, bb, &fusebox__v1__drain_request__descriptor, &a)) {
    if (auth && !c->admin) {
      fbd_call_finish_status(c, FBP_GRPC_PERMISSION_DENIED, FB_EINVAL,
                             "Drain needs an admin tenant's token");
    } else if (!auth && (!c->peer || strncmp(c->peer, "unix:", 5) != 0)) {
      fbd_call_finish_status(c, FBP_GRPC_PERMISSION_DENIED, FB_EINVAL,
                             "Drain without a tenants file is taken only on a unix: socket "
                             "(or send fuseboxd SIGTERM)");
    } else {
      Fusebox__V1__DrainResponse r = FUSEBOX__V1__DRAIN_RESPONSE__INIT;
      r.replica = srv->replica;
      r.sessions = (uint32_t)fbd_drain_sessions(srv);
      r.grace_s = srv->cfg->drain_grace_s;
      r.already = atomic_exchange(&srv->drain_asked, 1) || atomic_load(&srv->draining);
      fbd_logf(srv->log, FBD_LOG_INFO, "Drain asked by %s%s%s", c->peer ? c->peer : "?",
               c->tenant ? " as " : "", c->tenant ? c->tenant->name : "");
      /* refuse new sessions from now on; main's thread runs the drain */
      atomic_store(&srv->draining, 1);
      fbd_call_send_msg(c, &r.base);
      fbd_call_finish(c, FB_OK, NULL);
    }
  }
  fbp_arena_free(&a);
}

/* ---------------------------------------------------------------- the table */

/* A ReadField's job ran (session.c): its buffer streams back in chunks. */
static void read_job(fbd_call *c, fbd_session *s, fbd_job *j) {
  fbd_read_begin(c, s, &j->buf, j->chunk);
}

/* A Checkpoint's job ran with the bytes for the client: they stream back. */
static void ckpt_job(fbd_call *c, fbd_session *s, fbd_job *j) {
  (void)s;
  fbd_ckpt_send(c, j->ck, j->chunk);
  j->ck = NULL;
}

static const fbd_method methods[] = {
    {"/grpc.health.v1.Health/Check", NULL, health_recv, NULL, NULL, NULL, NULL},
    {"/fusebox.v1.Fusebox/CreateSession", NULL, create_recv, NULL, NULL, NULL, NULL},
    {"/fusebox.v1.Fusebox/CloseSession", NULL, close_recv, NULL, NULL, NULL, NULL},
    {"/fusebox.v1.Fusebox/Cancel", NULL, cancel_recv, NULL, NULL, NULL, NULL},
    {"/fusebox.v1.Fusebox/RegisterKernels", NULL, register_recv, NULL, NULL, NULL, NULL},
    {"/fusebox.v1.Fusebox/Session", NULL, stream_recv, stream_close, stream_sent, free_session_ref,
     NULL},
    {"/fusebox.v1.Fusebox/WriteField", NULL, write_recv, NULL, NULL, write_free, NULL},
    {"/fusebox.v1.Fusebox/ReadField", NULL, read_recv, NULL, cs_next, cs_free, read_job},
    {"/fusebox.v1.Fusebox/GetInfo", NULL, info_recv, NULL, NULL, NULL, NULL},
    {"/fusebox.v1.Fusebox/GetStats", NULL, stats_recv, NULL, NULL, NULL, NULL},
    {"/fusebox.v1.Fusebox/DescribeSource", NULL, describe_recv, NULL, NULL, NULL, NULL},
    {"/fusebox.v1.Fusebox/Checkpoint", NULL, ckpt_recv, NULL, cs_next, cs_free, ckpt_job},
    {"/fusebox.v1.Fusebox/Restore", NULL, restore_recv, NULL, NULL, restore_free, NULL},
    {"/fusebox.v1.Fusebox/ListCheckpoints", NULL, list_recv, NULL, NULL, NULL, NULL},
    {"/fusebox.v1.Fusebox/FetchCheckpoint", NULL, fetch_recv, NULL, cs_next, cs_free, NULL},
    {"/fusebox.v1.Fusebox/Drain", NULL, drain_recv, NULL, NULL, NULL, NULL},
};

const fbd_method *fbd_methods(size_t *n) {
  *n = sizeof methods / sizeof methods[0];
  return methods;
}
