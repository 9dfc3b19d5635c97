/* fuseboxd's gRPC plumbing on the C core: the completion-queue threads,
 * accepting calls (one generic grpc_server_request_call per slot, routed by
 * method path), the call object with its ordered send queue and final
 * status, and the server's start and graceful shutdown.
 *
 * A send batch carries the initial metadata (first time), the next queued
 * message, and the status once nothing else is queued; only one send batch
 * is in flight per call, as gRPC requires. */
#include <errno.h>
#include <grp.h>
#include <grpc/grpc_security.h>
#include <grpc/support/alloc.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "server/server.h"

#define REQUEST_SLOTS 8
#define SERVER_ARGS 9 /* the integer ones; then the resource quota */

double fbd_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void fbd_count_bad(fbd_server *s) { atomic_fetch_add(&s->bad_requests, 1); }

static void count_bytes(fbd_server *s, size_t in, size_t out) {
  if (in) atomic_fetch_add(&s->bytes_in, in);
  if (out) atomic_fetch_add(&s->bytes_out, out);
}

/* ---------------------------------------------------------------- calls */

void fbd_call_ref(fbd_call *c) { atomic_fetch_add(&c->refs, 1); }

static void call_free(fbd_call *c) {
  if (c->m->on_free) c->m->on_free(c);
  for (fbd_out *o = c->qh, *n; o; o = n) {
    n = o->next;
    atomic_fetch_sub(&c->srv->queued_bytes, o->counted);
    grpc_byte_buffer_destroy(o->bb);
    free(o);
  }
  atomic_fetch_sub(&c->srv->queued_bytes, c->inflight_counted);
  if (c->inflight) grpc_byte_buffer_destroy(c->inflight);
  if (c->rbuf) grpc_byte_buffer_destroy(c->rbuf);
  grpc_slice_unref(c->st_details);
  grpc_slice_unref(c->st_md[0].value);
  grpc_slice_unref(c->st_md[1].value);
  if (c->peer) gpr_free(c->peer);
  free(c->peer_cert);
  if (c->open_count) atomic_fetch_sub(c->open_count, 1);
  grpc_call_unref(c->gc);
  pthread_mutex_destroy(&c->mu);
  fbd_server *srv = c->srv;
  free(c);
  pthread_mutex_lock(&srv->mu);
  srv->ncalls--;
  pthread_cond_broadcast(&srv->cv);
  pthread_mutex_unlock(&srv->mu);
}

void fbd_call_unref(fbd_call *c) {
  if (atomic_fetch_sub(&c->refs, 1) == 1) call_free(c);
}

static void on_recv_done(void *obj, int ok) {
  fbd_call *c = obj;
  grpc_byte_buffer *bb = c->rbuf;
  c->rbuf = NULL;
  /* gRPC ends a receive without a message both when the client half-closed
   * (it is done) and when the call failed under it (cancelled, the
   * connection gone: a killed client), with ok set either way; only
   * grpc_call_failed_before_recv_message says which */
  c->recv_failed = !ok || (!bb && grpc_call_failed_before_recv_message(c->gc));
  if (!ok && bb) {
    grpc_byte_buffer_destroy(bb);
    bb = NULL;
  }
  if (bb) count_bytes(c->srv, grpc_byte_buffer_length(bb), 0);
  if (bb && c->tenant) atomic_fetch_add(&c->tenant->bytes_in, grpc_byte_buffer_length(bb));
  if (c->m->on_recv) c->m->on_recv(c, bb);
  if (bb) grpc_byte_buffer_destroy(bb);
  fbd_call_unref(c);
}

void fbd_call_recv(fbd_call *c) {
  grpc_op op;
  memset(&op, 0, sizeof op);
  op.op = GRPC_OP_RECV_MESSAGE;
  op.data.recv_message.recv_message = &c->rbuf;
  fbd_call_ref(c);
  if (grpc_call_start_batch(c->gc, &op, 1, &c->t_recv, NULL) != GRPC_CALL_OK) {
    fbd_logf(c->srv->log, FBD_LOG_ERROR, "gRPC refused a receive on %s", c->m->path);
    on_recv_done(c, 0);
  }
}

/* Start the next send batch if none is in flight. Called with c->mu held
 * by someone holding a reference. */
static void pump(fbd_call *c) {
  if (c->sending || c->status_sent || c->send_dead || (!c->qh && !c->status_set)) return;
  grpc_op ops[3];
  int n = 0;
  memset(ops, 0, sizeof ops);
  if (!c->md_sent) {
    ops[n].op = GRPC_OP_SEND_INITIAL_METADATA;
    /* fusebox-replica: which replica answers; fusebox-draining too while it drains */
    int dr = atomic_load(&c->srv->draining) != 0;
    ops[n].data.send_initial_metadata.count = dr ? 2 : 1;
    ops[n++].data.send_initial_metadata.metadata = dr ? c->srv->drain_md : &c->srv->replica_md;
    c->md_sent = 1;
  }
  if (c->qh) {
    fbd_out *o = c->qh;
    c->qh = o->next;
    if (!c->qh) c->qt = NULL;
    c->qn--;
    c->inflight = o->bb;
    c->inflight_counted = o->counted;
    free(o);
    count_bytes(c->srv, 0, grpc_byte_buffer_length(c->inflight)); /* gRPC may take its slices */
    if (c->tenant) atomic_fetch_add(&c->tenant->bytes_out, grpc_byte_buffer_length(c->inflight));
    ops[n].op = GRPC_OP_SEND_MESSAGE;
    ops[n++].data.send_message.send_message = c->inflight;
  }
  if (!c->qh && c->status_set) {
    ops[n].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
    ops[n].data.send_status_from_server.status = (grpc_status_code)c->st_status;
    ops[n].data.send_status_from_server.status_details = &c->st_details;
    ops[n].data.send_status_from_server.trailing_metadata_count = c->st_extra_key ? 2 : 1;
    ops[n++].data.send_status_from_server.trailing_metadata = c->st_md;
    c->status_sent = 1;
  }
  c->sending = 1;
  fbd_call_ref(c);
  if (grpc_call_start_batch(c->gc, ops, (size_t)n, &c->t_send, NULL) != GRPC_CALL_OK) {
    fbd_logf(c->srv->log, FBD_LOG_ERROR, "gRPC refused a send on %s", c->m->path);
    c->sending = 0;
    c->send_dead = 1;
    atomic_fetch_sub(&c->refs, 1); /* the caller still holds one */
  }
}

static void on_send_done(void *obj, int ok) {
  fbd_call *c = obj;
  pthread_mutex_lock(&c->mu);
  grpc_byte_buffer *done =
      c->inflight; /* destroyed outside the lock: it may free a session's buffer */
  c->inflight = NULL;
  atomic_fetch_sub(&c->srv->queued_bytes, c->inflight_counted);
  c->inflight_counted = 0;
  c->sending = 0;
  if (!ok) c->send_dead = 1;
  int refill = ok && !c->qh && !c->status_set && c->m->on_sent;
  pthread_mutex_unlock(&c->mu);
  if (done) grpc_byte_buffer_destroy(done);
  if (refill) c->m->on_sent(c);
  pthread_mutex_lock(&c->mu);
  pump(c);
  pthread_mutex_unlock(&c->mu);
  fbd_call_unref(c);
}

/* Queue bb; counted: bytes of it that are our own copy, held in
 * srv->queued_bytes until gRPC is done sending it (the memory budget). */
static void send_counted(fbd_call *c, grpc_byte_buffer *bb, size_t counted) {
  fbd_out *o = malloc(sizeof *o);
  pthread_mutex_lock(&c->mu);
  if (!o || c->status_set || c->send_dead) {
    pthread_mutex_unlock(&c->mu);
    free(o);
    grpc_byte_buffer_destroy(bb);
    return;
  }
  o->bb = bb;
  o->next = NULL;
  o->counted = counted;
  atomic_fetch_add(&c->srv->queued_bytes, counted);
  if (c->qt) c->qt->next = o;
  else c->qh = o;
  c->qt = o;
  c->qn++;
  pump(c);
  pthread_mutex_unlock(&c->mu);
}

void fbd_call_send_bb(fbd_call *c, grpc_byte_buffer *bb) { send_counted(c, bb, 0); }

void fbd_call_send(fbd_call *c, const void *p, size_t n) { send_counted(c, fbp_bb_from(p, n), n); }

void fbd_call_send_msg(fbd_call *c, const ProtobufCMessage *m) {
  size_t n;
  grpc_byte_buffer *bb = fbp_bb_pack(m, &n);
  send_counted(c, bb, n);
}

int fbd_call_queued(fbd_call *c) {
  pthread_mutex_lock(&c->mu);
  int n = c->qn + (c->sending ? 1 : 0);
  pthread_mutex_unlock(&c->mu);
  return n;
}

void fbd_call_finish_status(fbd_call *c, int grpc_status, int code, const char *msg) {
  pthread_mutex_lock(&c->mu);
  if (!c->status_set) {
    c->status_set = 1;
    c->st_status = grpc_status;
    snprintf(c->st_code, sizeof c->st_code, "%d", code);
    c->st_details = grpc_slice_from_copied_string(msg ? msg : "");
    c->st_md[0].key = grpc_slice_from_static_string(FBP_CODE_KEY);
    c->st_md[0].value = grpc_slice_from_copied_string(c->st_code);
    if (c->st_extra_key) {
      c->st_md[1].key = grpc_slice_from_static_string(c->st_extra_key);
      c->st_md[1].value = grpc_slice_from_copied_string(c->st_extra);
    }
    pump(c);
  }
  pthread_mutex_unlock(&c->mu);
}

void fbd_call_finish(fbd_call *c, int code, const char *fmt, ...) {
  char msg[FBD_ERRLEN];
  msg[0] = 0;
  if (fmt) {
    va_list ap;
    va_start(ap, fmt);
    fb_verrf(msg, sizeof msg, fmt, ap);
    va_end(ap);
  }
  if (code && code != FB_OK)
    fbd_logf(c->srv->log, code == FB_EINTERNAL ? FBD_LOG_ERROR : FBD_LOG_DEBUG,
             "%s from %s: %s: %s", c->m->path + 1, c->peer ? c->peer : "?", fb_strerror(code), msg);
  fbd_call_finish_status(c, fbp_status_of_code(code), code, msg);
}

static void on_close_done(void *obj, int ok) {
  fbd_call *c = obj;
  pthread_mutex_lock(&c->mu);
  c->closed = 1;
  pthread_mutex_unlock(&c->mu);
  if (c->cancelled || !ok) atomic_store(&c->gone, 1);
  if (c->m->on_close) c->m->on_close(c, c->cancelled || !ok);
  fbd_call_unref(c); /* the creation reference */
}

static void unknown_start(fbd_call *c) {
  fbd_count_bad(c->srv);
  fbd_call_finish_status(c, FBP_GRPC_UNIMPLEMENTED, FB_EUNSUPPORTED, "unknown method");
}

static const fbd_method unknown_method = {"/?", unknown_start, NULL, NULL, NULL, NULL};

/* Whether the call's tenant already has max_calls_per_tenant calls open;
 * the call counts in its open_calls from here until it is freed. With a
 * tenants file, calls with no identity (health checks: fbd_auth_call lets
 * them through) count together as one more tenant, so that a client with
 * no token cannot hold every one of max_calls open (a Check whose request
 * never finishes arriving stays open). Without a tenants file every client
 * is one tenant and only max_calls holds. */
static int tenant_full(fbd_call *c) {
  if (c->tenant) c->open_count = &c->tenant->open_calls;
  else if (c->srv->auth && c->srv->auth->enabled) c->open_count = &c->srv->probe_open_calls;
  else return 0;
  return atomic_fetch_add(c->open_count, 1) >= c->srv->cfg->max_calls_per_tenant;
}

/* A call arrived: wrap it and let its method begin. */
static void call_start(fbd_server *srv, grpc_call *gc, grpc_call_details *d,
                       const grpc_metadata_array *md) {
  const fbd_method *m =
      fbd_method_find((const char *)GRPC_SLICE_START_PTR(d->method), GRPC_SLICE_LENGTH(d->method));
  fbd_call *c = calloc(1, sizeof *c);
  if (!c) {
    grpc_call_cancel_with_status(gc, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory", NULL);
    grpc_call_unref(gc);
    return;
  }
  c->srv = srv;
  c->m = m ? m : &unknown_method;
  c->gc = gc;
  c->peer = grpc_call_get_peer(gc);
  /* a gated connection: its client's address, and certificate (mTLS) */
  char *client = fbd_gate_peer(srv, c->peer, &c->peer_cert);
  if (client) {
    gpr_free(c->peer);
    c->peer = client;
  }
  atomic_init(&c->refs, 2); /* the close op, and ours until started */
  pthread_mutex_init(&c->mu, NULL);
  c->t_recv = (fbd_tag){on_recv_done, c};
  c->t_send = (fbd_tag){on_send_done, c};
  c->t_close = (fbd_tag){on_close_done, c};
  c->st_details = grpc_empty_slice();
  c->st_md[0].value = grpc_empty_slice();
  c->st_md[1].value = grpc_empty_slice();
  pthread_mutex_lock(&srv->mu);
  int full = srv->ncalls >= srv->cfg->max_calls; /* each holds gRPC's call state: ~13 KiB */
  if (!full) srv->ncalls++;
  pthread_mutex_unlock(&srv->mu);
  if (full) {
    atomic_fetch_add(&srv->calls_refused, 1);
    char msg[160];
    snprintf(msg, sizeof msg,
             "fuseboxd has %d calls open, the most it takes at once (max_calls); try again later",
             srv->cfg->max_calls);
    fbd_logf(srv->log, FBD_LOG_DEBUG, "%.*s from %s refused: %s", (int)GRPC_SLICE_LENGTH(d->method),
             (const char *)GRPC_SLICE_START_PTR(d->method), c->peer ? c->peer : "?", msg);
    grpc_call_cancel_with_status(gc, GRPC_STATUS_RESOURCE_EXHAUSTED, msg, NULL);
    grpc_call_unref(gc);
    if (c->peer) gpr_free(c->peer);
    free(c->peer_cert);
    pthread_mutex_destroy(&c->mu);
    free(c);
    return;
  }
  if (!m)
    fbd_logf(srv->log, FBD_LOG_WARN, "unknown method %.*s from %s",
             (int)GRPC_SLICE_LENGTH(d->method), (const char *)GRPC_SLICE_START_PTR(d->method),
             c->peer ? c->peer : "?");
  grpc_op op;
  memset(&op, 0, sizeof op);
  op.op = GRPC_OP_RECV_CLOSE_ON_SERVER;
  op.data.recv_close_on_server.cancelled = &c->cancelled;
  if (grpc_call_start_batch(gc, &op, 1, &c->t_close, NULL) != GRPC_CALL_OK) {
    fbd_logf(srv->log, FBD_LOG_ERROR, "gRPC refused RECV_CLOSE_ON_SERVER");
    atomic_fetch_sub(&c->refs, 1);
  }
  if (fbd_auth_call(c, md)) { /* answered UNAUTHENTICATED */
  } else if (tenant_full(c)) {
    atomic_fetch_add(&srv->tenant_calls_refused, 1);
    if (c->tenant)
      fbd_call_finish(c, FB_EQUOTA,
                      "tenant '%s' has %d calls open, the most a tenant may "
                      "(max_calls_per_tenant); try again later",
                      c->tenant->name, srv->cfg->max_calls_per_tenant);
    else
      fbd_call_finish(c, FB_EQUOTA,
                      "calls with no credentials (health checks) have %d open, the most they "
                      "may together (max_calls_per_tenant); try again later",
                      srv->cfg->max_calls_per_tenant);
  } else if (c->m->on_start) c->m->on_start(c);
  else fbd_call_recv(c);
  fbd_call_unref(c);
}

/* ---------------------------------------------------------------- accepting */

typedef struct slot {
  fbd_server *srv;
  fbd_tag tag;
  grpc_call *call;
  grpc_call_details details;
  grpc_metadata_array md;
} slot;

static void on_new_call(void *obj, int ok);

static int slot_arm(slot *sl) {
  sl->call = NULL;
  grpc_call_details_init(&sl->details);
  grpc_metadata_array_init(&sl->md);
  fbd_server *srv = sl->srv;
  grpc_call_error e = grpc_server_request_call(srv->server, &sl->call, &sl->details, &sl->md,
                                               srv->cq, srv->cq, &sl->tag);
  if (e != GRPC_CALL_OK) {
    grpc_call_details_destroy(&sl->details);
    grpc_metadata_array_destroy(&sl->md);
    return FB_EIO;
  }
  return 0;
}

static void slot_gone(slot *sl) {
  fbd_server *srv = sl->srv;
  free(sl);
  pthread_mutex_lock(&srv->mu);
  srv->nslots--;
  pthread_cond_broadcast(&srv->cv);
  pthread_mutex_unlock(&srv->mu);
}

static void on_new_call(void *obj, int ok) {
  slot *sl = obj;
  fbd_server *srv = sl->srv;
  if (ok && sl->call) call_start(srv, sl->call, &sl->details, &sl->md);
  grpc_call_details_destroy(&sl->details);
  grpc_metadata_array_destroy(&sl->md);
  if (!ok || atomic_load(&srv->stopping) || slot_arm(sl)) slot_gone(sl);
}

static void *cq_main(void *arg) {
  fbd_server *srv = arg;
  for (;;) {
    grpc_event ev = grpc_completion_queue_next(srv->cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL);
    if (ev.type == GRPC_QUEUE_SHUTDOWN) break;
    if (ev.type != GRPC_OP_COMPLETE) continue;
    fbd_tag *t = ev.tag;
    t->fn(t->obj, ev.success);
  }
  return NULL;
}

static void on_shutdown_done(void *obj, int ok) {
  fbd_server *srv = obj;
  pthread_mutex_lock(&srv->mu);
  srv->shutdown_done = 1;
  pthread_cond_broadcast(&srv->cv);
  pthread_mutex_unlock(&srv->mu);
}

/* ---------------------------------------------------------------- start */

static void server_args(const fbd_config *cfg, grpc_arg *a) {
  static const char *const names[] = {GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH,
                                      GRPC_ARG_MAX_SEND_MESSAGE_LENGTH,
                                      GRPC_ARG_KEEPALIVE_TIME_MS,
                                      GRPC_ARG_KEEPALIVE_TIMEOUT_MS,
                                      GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS,
                                      GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS,
                                      GRPC_ARG_HTTP2_MAX_PING_STRIKES,
                                      GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA,
                                      GRPC_ARG_MAX_CONCURRENT_STREAMS};
  /* keepalive pings go on while a stream idles, so that dead peers are found */
  int values[SERVER_ARGS] = {
      cfg->max_message_bytes > (uint64_t)INT32_MAX ? INT32_MAX : (int)cfg->max_message_bytes,
      -1,
      cfg->keepalive_s * 1000,
      cfg->keepalive_timeout_s * 1000,
      1,
      5000,
      0,
      0,
      cfg->max_streams_per_connection};
  for (int i = 0; i < SERVER_ARGS; i++) {
    a[i].type = GRPC_ARG_INTEGER;
    a[i].key = (char *)names[i];
    a[i].value.integer = values[i];
  }
}

/* A unix socket file with a live server behind it (gRPC would unlink it
 * and steal the address). */
static int socket_in_use(const char *path) {
  struct sockaddr_un sa;
  memset(&sa, 0, sizeof sa);
  sa.sun_family = AF_UNIX;
  snprintf(sa.sun_path, sizeof sa.sun_path, "%s", path);
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int live = fd >= 0 && connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0;
  if (fd >= 0) close(fd);
  return live;
}

/* Before binding: FB_EIO when the address is a live server's socket or a
 * file that is not a socket; a stale socket (from a crash) is removed. */
static int claim_socket(const char *addr, char *err, size_t errlen) {
  struct stat st;
  if (strncmp(addr, "unix:", 5) != 0 || lstat(addr + 5, &st) != 0) return 0;
  if (!S_ISSOCK(st.st_mode)) {
    fb_errf(err, errlen, "cannot listen on '%s': the path exists and is not a socket", addr);
    return FB_EIO;
  }
  if (socket_in_use(addr + 5)) {
    fb_errf(err, errlen, "cannot listen on '%s': another server is listening there", addr);
    return FB_EIO;
  }
  unlink(addr + 5);
  return 0;
}

/* The gid of socket_group: a group name, else a number. */
static int socket_gid(const char *group, const char *addr, gid_t *gid, char *err, size_t errlen) {
  char buf[16384];
  struct group g, *found = NULL;
  int e = getgrnam_r(group, &g, buf, sizeof buf, &found);
  if (found) {
    *gid = found->gr_gid;
    return 0;
  }
  char *end = NULL;
  unsigned long n = strtoul(group, &end, 10);
  if (*group >= '0' && *group <= '9' && !*end && n < (gid_t)-1) {
    *gid = (gid_t)n;
    return 0;
  }
  fb_errf(err, errlen, "cannot set the group of '%s' to '%s': %s", addr, group,
          e ? strerror(e) : "no such group");
  return FB_EINVAL;
}

/* Right after binding a unix socket: its group (socket_group) and mode
 * (socket_mode). It was created 0600 (umask), so nobody else could connect
 * before this. */
static int socket_access(const fbd_config *cfg, const char *addr, char *err, size_t errlen) {
  const char *path = addr + 5;
  if (cfg->socket_group) {
    gid_t gid;
    int rc = socket_gid(cfg->socket_group, addr, &gid, err, errlen);
    if (rc) return rc;
    if (chown(path, (uid_t)-1, gid) != 0) {
      fb_errf(err, errlen, "cannot set the group of '%s' to '%s' (gid %lu): %s", addr,
              cfg->socket_group, (unsigned long)gid, strerror(errno));
      return FB_EIO;
    }
  }
  if (chmod(path, (mode_t)cfg->socket_mode) != 0) {
    fb_errf(err, errlen, "cannot set the mode of '%s' to %04o: %s", addr,
            (unsigned)cfg->socket_mode, strerror(errno));
    return FB_EIO;
  }
  return 0;
}

static int bind_all(fbd_server *srv, char *err, size_t errlen) {
  const fbd_config *cfg = srv->cfg;
  size_t used = 0;
  for (int i = 0; i < cfg->nlisten; i++) {
    const char *addr = cfg->listen[i];
    int rc = claim_socket(addr, err, errlen);
    if (rc) return rc;
    int is_unix = strncmp(addr, "unix:", 5) == 0;
    grpc_server_credentials *cr = fbd_tls_server_creds(srv, addr, err, errlen);
    if (!cr) return FB_EINVAL;
    char bound[512];
    if (!is_unix) { /* TCP, plain or TLS: through the HTTP/2 gate (h2gate.c) */
      grpc_server_credentials_release(cr);
      int tls = cfg->tls_cert && *cfg->tls_cert;
      if ((rc = fbd_gate_listen(srv, addr, tls, bound, sizeof bound, err, errlen))) return rc;
      if (tls && (rc = fbd_tls_gate(srv, err, errlen))) return rc;
    } else {
      mode_t old_mask = is_unix ? umask(0177) : 0; /* the socket file starts 0600 */
      int port = grpc_server_add_http2_port(srv->server, addr, cr);
      if (is_unix) umask(old_mask);
      grpc_server_credentials_release(cr);
      if (port == 0) {
        fb_errf(err, errlen, "cannot listen on '%s' (in use, or not host:port / unix:PATH)",
                addr);
        return FB_EIO;
      }
      const char *colon = strrchr(addr, ':');
      if (strncmp(addr, "unix:", 5) != 0 && colon && strcmp(colon, ":0") == 0)
        snprintf(bound, sizeof bound, "%.*s:%d", (int)(colon - addr), addr, port);
      else snprintf(bound, sizeof bound, "%s", addr);
    }
    used += (size_t)snprintf(srv->addresses + used, sizeof srv->addresses - used, "%s%s",
                             used ? " " : "", bound);
    if (used >= sizeof srv->addresses) used = sizeof srv->addresses - 1;
    srv->listen[srv->nlisten++] = strdup(bound); /* fbd_server_free removes socket files */
    if (is_unix && (rc = socket_access(cfg, addr, err, errlen))) return rc;
  }
  return 0;
}

/* The memory this process may use: the machine's, or its cgroup's limit
 * when lower (cgroup v2, then v1). 0 when unknown. */
static uint64_t memory_available(void) {
  uint64_t total = 0, lim = 0;
  FILE *f = fopen("/proc/meminfo", "r");
  if (f) {
    unsigned long long kib;
    if (fscanf(f, "MemTotal: %llu kB", &kib) == 1) total = (uint64_t)kib << 10;
    fclose(f);
  }
  static const char *const cg[] = {"/sys/fs/cgroup/memory.max",
                                   "/sys/fs/cgroup/memory/memory.limit_in_bytes"};
  for (int i = 0; i < 2 && !lim; i++) {
    unsigned long long v;
    if ((f = fopen(cg[i], "r"))) {
      if (fscanf(f, "%llu", &v) == 1) lim = v; /* "max" reads as nothing */
      fclose(f);
    }
  }
  return lim && (lim < total || !total) ? lim : total;
}

static int make_engine(fbd_server *srv, char *err, size_t errlen) {
  fb_engine_config ec = {srv->cfg->backend, srv->cfg->compile_threads, srv->cfg->cpu_threads};
  int rc = fb_engine_create(&ec, &srv->engine, err, errlen);
  if (rc) return rc;
  fb_engine_set_code_cache_bytes(srv->engine, srv->code_cache_bytes);
  srv->backend = fb_engine_backend(srv->engine);
  return 0;
}

/* The server starts even when a bind failed, so that the one shutdown path
 * (fbd_server_shutdown) can take it down again. */
static int start_grpc(fbd_server *srv, char *err, size_t errlen) {
  grpc_arg a[SERVER_ARGS + 1];
  server_args(srv->cfg, a);
  /* what gRPC's transports hold (read buffers, messages received but not
   * yet whole) comes out of one quota of the whole server; past it gRPC
   * shrinks its flow-control windows and cancels streams ("The memory
   * budget", transport buffers) */
  grpc_resource_quota *quota = grpc_resource_quota_create("fuseboxd");
  grpc_resource_quota_resize(quota, (size_t)srv->transport_memory_bytes);
  a[SERVER_ARGS].type = GRPC_ARG_POINTER;
  a[SERVER_ARGS].key = (char *)GRPC_ARG_RESOURCE_QUOTA;
  a[SERVER_ARGS].value.pointer.p = quota;
  a[SERVER_ARGS].value.pointer.vtable = grpc_resource_quota_arg_vtable();
  grpc_channel_args args = {SERVER_ARGS + 1, a};
  srv->server = grpc_server_create(&args, NULL);
  grpc_resource_quota_unref(quota); /* the server holds its own reference */
  srv->cq = grpc_completion_queue_create_for_next(NULL);
  grpc_server_register_completion_queue(srv->server, srv->cq, NULL);
  int rc = bind_all(srv, err, errlen);
  grpc_server_start(srv->server);
  if (!rc) rc = fbd_gate_start(srv, err, errlen);
  int n = srv->cfg->cq_threads < 1 ? 1 : srv->cfg->cq_threads > 64 ? 64 : srv->cfg->cq_threads;
  for (; srv->ncq < n; srv->ncq++)
    if (pthread_create(&srv->cq_threads[srv->ncq], NULL, cq_main, srv)) {
      fb_errf(err, errlen, "cannot start completion-queue threads");
      return FB_EINTERNAL;
    }
  for (int i = 0; !rc && i < REQUEST_SLOTS; i++) {
    slot *sl = calloc(1, sizeof *sl);
    if (!sl) return FB_ENOMEM;
    sl->srv = srv;
    sl->tag = (fbd_tag){on_new_call, sl};
    pthread_mutex_lock(&srv->mu);
    srv->nslots++;
    pthread_mutex_unlock(&srv->mu);
    if (slot_arm(sl)) slot_gone(sl);
  }
  return rc;
}

/* An explicit transport_memory_bytes must leave gRPC room for two messages
 * of max_message_bytes, or it would cancel calls it may receive. */
static int check_transport(const fbd_config *cfg, char *err, size_t errlen) {
  if (!cfg->transport_memory_bytes || cfg->transport_memory_bytes / 2 >= cfg->max_message_bytes)
    return 0;
  char t[32], m[32];
  fbd_fmt_bytes(t, sizeof t, cfg->transport_memory_bytes);
  fbd_fmt_bytes(m, sizeof m, cfg->max_message_bytes);
  fb_errf(err, errlen,
          "transport_memory_bytes %s is less than twice max_message_bytes %s: gRPC would cancel "
          "calls whose messages it may receive",
          t, m);
  return FB_EINVAL;
}

int fbd_server_start(const fbd_config *cfg, fbd_log *log, fbd_server **out, char *err,
                     size_t errlen) {
  *out = NULL;
  fbd_server *srv = calloc(1, sizeof *srv);
  if (!srv) return FB_ENOMEM;
  srv->cfg = cfg;
  srv->log = log;
  srv->started = fbd_now();
  srv->memory_budget = cfg->memory_budget ? cfg->memory_budget : memory_available() / 4 * 3;
  srv->code_cache_bytes = fbd_code_cache_bytes(cfg, srv->memory_budget);
  srv->transport_memory_bytes = fbd_transport_memory_bytes(cfg, srv->memory_budget);
  srv->t_shutdown = (fbd_tag){on_shutdown_done, srv};
  pthread_mutex_init(&srv->mu, NULL);
  pthread_cond_init(&srv->cv, NULL);
  atomic_init(&srv->stopping, 0);
  atomic_init(&srv->draining, 0);
  atomic_init(&srv->drain_asked, 0);
  atomic_init(&srv->bad_requests, 0);
  atomic_init(&srv->bytes_in, 0);
  atomic_init(&srv->bytes_out, 0);
  pthread_mutex_init(&srv->pmu, NULL);
  srv->sessions = calloc((size_t)cfg->max_sessions, sizeof *srv->sessions);
  grpc_init();
  int rc = check_transport(cfg, err, errlen);
  if (!rc) rc = fbd_replica_init(srv, err, errlen);
  if (!rc) rc = srv->sessions ? make_engine(srv, err, errlen) : FB_ENOMEM;
  if (!rc) rc = fbd_procs_check(cfg, err, errlen);
  if (!rc) rc = fbd_auth_init(srv, err, errlen);
  if (!rc && (rc = fbd_codestore_start(srv, err, errlen)) && cfg->private_daemon) {
    /* a private daemon's cache is the client's default, not its user's
       choice: without it the daemon still serves */
    fbd_logf(log, FBD_LOG_WARN, "compile cache on disk off: %s", err);
    err[0] = 0;
    rc = 0;
  }
  if (!rc) rc = fbd_sched_start(srv, err, errlen);
  if (!rc) rc = fbd_ckpt_start(srv, err, errlen);
  if (!rc && fbd_isolated(cfg)) rc = fbd_procs_start(srv, err, errlen);
  else if (!rc && geteuid() == 0) { /* no worker to switch users: the tenant's code is ours */
    /* a private daemon runs its one user's own code, as that user: nothing
     * to warn about; a shared server (or one with tenants) warns */
    int shared = !cfg->private_daemon || (cfg->tenants && cfg->tenants[0]);
    fbd_logf(log, shared ? FBD_LOG_WARN : FBD_LOG_INFO,
             shared ? "isolation thread as root: tenants' JIT code runs as root inside fuseboxd "
                      "(process isolation runs it in workers as worker_user)"
                    : "isolation thread as root: a private daemon; its user's kernels run "
                      "inside fuseboxd, as root");
  }
  if (!rc) rc = start_grpc(srv, err, errlen);
  if (!rc) rc = fbd_metrics_start(srv, err, errlen);
  if (rc) {
    fbd_server_shutdown(srv);
    fbd_server_free(srv);
    return rc;
  }
  *out = srv;
  return 0;
}

/* ---------------------------------------------------------------- shutdown */

static void wait_until(fbd_server *srv, int (*done)(fbd_server *), double deadline) {
  pthread_mutex_lock(&srv->mu);
  while (!done(srv)) {
    double left = deadline - fbd_now();
    if (deadline > 0 && left <= 0) break;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    double step = deadline > 0 && left < 0.05 ? left : 0.05;
    ts.tv_nsec += (long)(step * 1e9);
    ts.tv_sec += ts.tv_nsec / 1000000000L;
    ts.tv_nsec %= 1000000000L;
    pthread_cond_timedwait(&srv->cv, &srv->mu, &ts);
  }
  pthread_mutex_unlock(&srv->mu);
}

static int no_workers(fbd_server *s) { return s->nworkers == 0; }
static int no_calls(fbd_server *s) { return s->ncalls == 0 && s->nslots == 0; }
static int shut_down(fbd_server *s) { return s->shutdown_done; }

/* Work already received (every job queued when shutdown began) finishes
 * and its answers go out, up to the grace period. */
static void drain(fbd_server *srv) {
  int n = 0;
  uint64_t *marks = NULL;
  pthread_mutex_lock(&srv->mu);
  n = srv->cfg->max_sessions;
  marks = calloc((size_t)n, sizeof *marks);
  for (int i = 0; marks && i < n; i++) {
    fbd_session *s = srv->sessions[i];
    if (!s) continue;
    pthread_mutex_lock(&s->mu);
    marks[i] = s->posted;
    pthread_mutex_unlock(&s->mu);
  }
  pthread_mutex_unlock(&srv->mu);
  double deadline = fbd_now() + srv->cfg->shutdown_grace_s;
  while (marks && !fbd_sessions_drained(srv, marks, n) && fbd_now() < deadline) usleep(2000);
  free(marks);
}

int fbd_server_shutdown(fbd_server *srv) {
  if (!srv) return 0;
  atomic_store(&srv->stopping, 1);
  fbd_gate_stop_accepting(srv);
  if (srv->server) {
    grpc_server_shutdown_and_notify(srv->server, srv->cq, &srv->t_shutdown);
    drain(srv);
    fbd_session_end_all(srv, FBD_END_SHUTDOWN);
    grpc_server_cancel_all_calls(srv->server);
  }
  /* a worker stuck in a kernel that never ends cannot be stopped: give up */
  wait_until(srv, no_workers, fbd_now() + srv->cfg->shutdown_grace_s + 5);
  pthread_mutex_lock(&srv->mu);
  int stuck = srv->nworkers;
  pthread_mutex_unlock(&srv->mu);
  if (stuck) {
    fbd_logf(srv->log, FBD_LOG_ERROR, "%d session worker%s still running after the grace period",
             stuck, stuck == 1 ? "" : "s");
    return FB_EINTERNAL;
  }
  fbd_server_tick(srv); /* join the workers */
  if (srv->server) {
    wait_until(srv, no_calls, 0);
    if (srv->ncq) wait_until(srv, shut_down, 0);
    grpc_server_destroy(srv->server);
    srv->server = NULL;
  }
  fbd_gate_free(srv); /* after gRPC: it relayed the last answers and GOAWAYs */
  if (srv->cq) {
    grpc_completion_queue_shutdown(srv->cq);
    for (int i = 0; i < srv->ncq; i++) pthread_join(srv->cq_threads[i], NULL);
    srv->ncq = 0;
    /* without threads (a failed start) the queue still needs draining */
    while (grpc_completion_queue_next(srv->cq, gpr_inf_past(GPR_CLOCK_MONOTONIC), NULL).type !=
           GRPC_QUEUE_SHUTDOWN) {}
    grpc_completion_queue_destroy(srv->cq);
    srv->cq = NULL;
  }
  fbd_metrics_stop(srv); /* its handler reads the engine */
  fbd_procs_stop(srv);
  fbd_sched_stop(srv);  /* no session thread is left to enter it */
  fb_engine_destroy(srv->engine);
  srv->engine = NULL;
  return 0;
}

void fbd_server_free(fbd_server *srv) {
  if (!srv) return;
  for (int i = 0; i < srv->nlisten; i++) {
    struct stat st;
    const char *a = srv->listen[i];
    if (strncmp(a, "unix:", 5) == 0 && lstat(a + 5, &st) == 0 && S_ISSOCK(st.st_mode))
      unlink(a + 5); /* our socket file */
    free(srv->listen[i]);
  }
  free(srv->sessions);
  free(srv->zombies);
  fbd_auth_free(srv);
  fbd_codestore_free(srv->codestore); /* the engine that called it is gone */
  fbd_ckpt_free(srv);
  fbd_tls_free(srv);
  pthread_mutex_destroy(&srv->pmu);
  pthread_mutex_destroy(&srv->mu);
  pthread_cond_destroy(&srv->cv);
  free(srv);
  grpc_shutdown();
}
