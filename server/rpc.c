/* fuseboxd's gRPC plumbing on the C core: the completion-queue threads,
 * accepting calls (one generic grpc_server_request_call per slot, routed by
 * method path) and making their call objects (call.c). The server's start
 * and shutdown are start.c's. */
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

static void unknown_start(fbd_call *c) {
  fbd_count_bad(c->srv);
  fbd_call_finish_status(c, FBP_GRPC_UNIMPLEMENTED, FB_EUNSUPPORTED, "unknown method");
}

static const fbd_method unknown_method = {"/?", unknown_start, NULL, NULL, NULL, NULL, NULL};

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

/* The method of a call's path in the table start.c gave (srv->methods), or
 * NULL. */
static const fbd_method *method_find(const fbd_server *srv, const char *path, size_t n) {
  for (size_t i = 0; i < srv->nmethods; i++)
    if (strlen(srv->methods[i].path) == n && memcmp(srv->methods[i].path, path, n) == 0)
      return &srv->methods[i];
  return NULL;
}

/* A call arrived: wrap it and let its method begin. */
static void call_start(fbd_server *srv, grpc_call *gc, grpc_call_details *d,
                       const grpc_metadata_array *md) {
  const fbd_method *m =
      method_find(srv, (const char *)GRPC_SLICE_START_PTR(d->method), GRPC_SLICE_LENGTH(d->method));
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
  fbd_call_tags(c);
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
