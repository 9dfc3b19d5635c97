/* fuseboxd's gRPC plumbing on the C core: the completion-queue threads,
 * accepting calls (one generic grpc_server_request_call per slot, routed by
 * method path), the call object with its ordered send queue and final
 * status. The server's start and shutdown are start.c's.
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
  char refused[FBD_ERRLEN];
  if (fbd_auth_call(c, md, refused, sizeof refused)) {
    fbd_call_finish_status(c, FBP_GRPC_UNAUTHENTICATED, FB_EINVAL, refused);
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

/* The completion-queue threads, and (unless rc, a failed start) the slots
 * that accept calls: the end of the server's start (start.c). */
int fbd_rpc_accept(fbd_server *srv, int rc, char *err, size_t errlen) {
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
