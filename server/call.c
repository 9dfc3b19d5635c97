/* The call object of fuseboxd's gRPC plumbing: a call's references, its
 * ordered send queue and final status (with the "fusebox-code" trailer),
 * its receives, and the completions of each (docs/design.md, "The service
 * in two layers": below the methods, the sessions and the drain, which
 * answer calls through it; rpc.c accepts calls and makes them).
 *
 * A send batch carries the initial metadata (first time), the next queued
 * message, and the status once nothing else is queued; only one send batch
 * is in flight per call, as gRPC requires. */
#include <grpc/support/alloc.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/server.h"
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

/* The completions a new call's batches report to (rpc.c's call_start). */
void fbd_call_tags(fbd_call *c) {
  c->t_recv = (fbd_tag){on_recv_done, c};
  c->t_send = (fbd_tag){on_send_done, c};
  c->t_close = (fbd_tag){on_close_done, c};
}
