/* libfusebox sessions: opening one (CreateSession, then the Session stream
 * that keeps it alive), kernels from IR or from a program's source,
 * pipelined launches encoded straight into the next stream message, syncs
 * and the results they gather, and field transfers in chunks. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* mkstemp, strndup */
#endif
#include <errno.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "client/client_internal.h"
#include "proto/wire.h"

#define SESSION_PATH "/fusebox.v1.Fusebox/Session"
#define LAUNCH_MAX_BYTES(nargs) (16 + (size_t)(nargs) * 24)
/* CreateSession refused by a draining replica is tried again with a new
 * routing key this many times in all: among 3 replicas, one draining, all
 * fail with chance (1/3)^12 */
#define CREATE_TRIES 12
/* Messages of launches sent since the last answered sync are kept (copies)
 * up to this many bytes, to send again on another replica when a drain
 * ends the session after its grace (resume_ended); past it, no such resume
 * until the next sync. */
#define KEPT_MAX ((size_t)64 << 20)
/* How a drain's reason names the checkpoint it wrote (server/drain.c). */
#define CKPT_MARK "its state is in checkpoint "

int fbc_stats(fb_client *c, const char *id, fb_server_stats *out, char *err, size_t errlen);

typedef struct kinfo {
  char *name;
  int nparams;
  fb_type ret;
  const fb_kernel *src; /* the program's instance it came from, or NULL */
} kinfo;

struct fb_remote {
  fb_client *c;
  char id[40];
  fb_layout *layout;     /* own copy */
  fb_program *prog;      /* NULL, borrowed or owned */
  int own_prog;
  kinfo *k;
  int nk, kcap;
  /* the Session stream */
  grpc_call *call;
  int tag_send, tag_recv, tag_status; /* their addresses are the tags */
  int md_sent, md_recvd, send_pending, broken, closed;
  grpc_byte_buffer *send_bb, *recv_bb;
  grpc_metadata_array init_md;
  grpc_metadata smd[2]; /* the stream's initial metadata: token, routing key */
  fbc_route rt;         /* routing key, replica (client_internal.h) */
  fbc_end end;
  fbp_buf out;           /* the next SessionRequest */
  int nqueued;            /* launches in out */
  int marks;             /* tape marks queued or sent since the last sync */
  int64_t seq;           /* last sequence number given */
  _Atomic int64_t sent_seq; /* the last one sent (fb_remote_cancel, any thread) */
  uint64_t next_sync;
  /* results since the last fb_remote_sync */
  fb_launch_return *rets;
  int nrets, rcap;
  fb_launch_error *errs;
  int nerrs, ecap;
  uint64_t rets_dropped, errs_dropped;
  int delivered;
  uint64_t done_seq;
  fb_counters counters;  /* as the caller sees them: continued over moves */
  int moving, moves;     /* move(): off a draining replica */
  /* over moves: launch numbers go on (the stream's plus seq_base, the
     launches of the streams before), and so do the counters: each SUM is
     what the earlier replicas counted (cbase) plus this one's (raw), each
     LEVEL this replica's (counters_continue); cat: the new replica's
     counters just after a restore (its launches: the checkpoint's) */
  int64_t seq_base;
  fb_counters raw, cbase, cat;
  int cont;
  /* the messages sent since the last answered sync: bytes and launches */
  uint8_t *kept;
  size_t kn, kbcap;
  struct kmsg {
    size_t len;
    int nl;
  } *km;
  int nkm, kmcap, kept_over, nokeep;
  double last_io;        /* when peek_end last looked (monotonic s) */
  char err[FBC_ERRLEN];
};

static void maybe_move(fb_remote *r);
static int resume_ended(fb_remote *r, int rc);

static int rerr(fb_remote *r, int code, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

static int rerr(fb_remote *r, int code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fb_verrf(r->err, sizeof r->err, fmt, ap);
  va_end(ap);
  return code;
}

const char *fb_remote_errmsg(const fb_remote *r) { return r ? r->err : "no session"; }
const char *fb_remote_id(const fb_remote *r) { return r ? r->id : ""; }
const char *fb_remote_replica(const fb_remote *r) { return r ? r->rt.replica : ""; }
int fb_remote_moves(const fb_remote *r) { return r ? r->moves : 0; }
const fb_layout *fb_remote_layout(const fb_remote *r) { return r ? r->layout : NULL; }
fb_program *fb_remote_program(const fb_remote *r) { return r ? r->prog : NULL; }

char *fb_remote_warnings(const fb_remote *r) {
  if (!r || !r->prog) return strdup("");
  return fb_program_warnings_render(r->prog);
}

void fb_remote_options_init(fb_remote_options *o) {
  memset(o, 0, sizeof *o);
  o->listgen = o->demote = o->fusion = o->dse = -1;
}

/* ---------------------------------------------------------------- the stream */

/* Whether e says the session's replica is gone; then its message into msg. */
static int lost_msg(fb_remote *r, const fbc_end *e, char *msg, size_t n) {
  char m[FBC_ERRLEN];
  fbc_end_route(e, &r->rt, m, sizeof m);
  if (!strstr(m, " lost: replica ")) return 0;
  snprintf(msg, n, "%s", m);
  return 1;
}

/* The stream failed: its status says why. */
static int stream_broken(fb_remote *r) {
  if (!r->broken) {
    r->broken = 1;
    grpc_call_cancel(r->call, NULL);
  }
  if (r->send_pending) {
    fbc_wait(r->c, r->call, &r->tag_send);
    r->send_pending = 0;
    grpc_byte_buffer_destroy(r->send_bb);
    r->send_bb = NULL;
  }
  if (!r->closed) {
    fbc_wait(r->c, r->call, &r->tag_status);
    r->closed = 1;
  }
  char msg[FBC_ERRLEN] = "the server ended the session";
  int code = fbc_end_code(&r->end, msg, sizeof msg);
  /* a drained session's reason, also a trailer: a proxy may have turned
     its status into a reset (server/drain.c) */
  for (size_t i = 0; code && i < r->end.trailing.count; i++) {
    const grpc_metadata *m = &r->end.trailing.metadata[i];
    if (grpc_slice_str_cmp(m->key, "fusebox-ended") == 0)
      return rerr(r, FB_EIO, "%.*s", (int)GRPC_SLICE_LENGTH(m->value),
                  (const char *)GRPC_SLICE_START_PTR(m->value));
  }
  if (code && lost_msg(r, &r->end, msg, sizeof msg))
    return rerr(r, FB_EIO, "%s", msg); /* its replica is gone: "session S lost: ..." */
  return rerr(r, code ? code : FB_EIO, "session %.8s: the stream ended: %s", r->id, msg);
}

static int wait_send(fb_remote *r) {
  if (!r->send_pending) return 0;
  int ok = fbc_wait(r->c, r->call, &r->tag_send);
  r->send_pending = 0;
  grpc_byte_buffer_destroy(r->send_bb);
  r->send_bb = NULL;
  return ok > 0 ? 0 : stream_broken(r);
}

/* Whether the stream already ended, looked at when it was quiet for a
 * while (PEEK_IDLE_S): nothing here reads the connection between calls, so
 * a status the server sent meanwhile (a drain's reason naming its
 * checkpoint) is still unread; a send into a connection the server closed
 * would fail as a broken pipe and lose it. A look that waits for nothing:
 * the status, if it came, marks the stream ended (stream_broken says why). */
#define PEEK_IDLE_S 0.5
#define PEEK_WAIT_MS 5 /* the connection's bytes read and taken apart */
static void peek_end_now(fb_remote *r, int force) {
  if (r->closed || r->broken || !r->call) return;
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  double t = (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec, last = r->last_io;
  r->last_io = t;
  if (!force && t - last < PEEK_IDLE_S) return;
  grpc_event ev = grpc_completion_queue_pluck(
      r->c->cq, &r->tag_status,
      gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC), gpr_time_from_millis(PEEK_WAIT_MS, GPR_TIMESPAN)),
      NULL);
  if (ev.type == GRPC_OP_COMPLETE) r->closed = r->broken = 1;
}

static void peek_end(fb_remote *r) { peek_end_now(r, 0); }

/* A copy of the message about to be sent, kept until a sync answers it. */
static void keep(fb_remote *r) {
  if (r->nokeep || r->kept_over) return;
  if (r->kn + r->out.n > KEPT_MAX) {
    r->kept_over = 1;
    return;
  }
  if (r->kn + r->out.n > r->kbcap) {
    size_t nc = (r->kn + r->out.n) * 2;
    uint8_t *p = realloc(r->kept, nc);
    if (!p) {
      r->kept_over = 1;
      return;
    }
    r->kept = p;
    r->kbcap = nc;
  }
  if (r->nkm == r->kmcap) {
    int nc = r->kmcap ? 2 * r->kmcap : 16;
    struct kmsg *v = realloc(r->km, sizeof *v * (size_t)nc);
    if (!v) {
      r->kept_over = 1;
      return;
    }
    r->km = v;
    r->kmcap = nc;
  }
  if (r->out.n) memcpy(r->kept + r->kn, r->out.p, r->out.n);
  r->kn += r->out.n;
  r->km[r->nkm++] = (struct kmsg){r->out.n, r->nqueued};
}

static void kept_clear(fb_remote *r) {
  r->kn = 0;
  r->nkm = 0;
  r->kept_over = 0;
}

/* Send the message being built (after the previous send completed). */
static int stream_send(fb_remote *r) {
  peek_end(r);
  if (r->broken) return stream_broken(r);
  int rc = wait_send(r);
  if (rc) return rc;
  if (r->out.oom) return rerr(r, FB_ENOMEM, "out of memory queueing launches");
  grpc_op ops[2];
  memset(ops, 0, sizeof ops);
  size_t n = 0;
  if (!r->md_sent) {
    fbc_initial_md_route(r->c, &ops[n++], r->smd, &r->rt);
    r->md_sent = 1;
  }
  keep(r);
  r->send_bb = fbp_bb_from(r->out.p, r->out.n);
  ops[n].op = GRPC_OP_SEND_MESSAGE;
  ops[n++].data.send_message.send_message = r->send_bb;
  r->out.n = 0;
  r->nqueued = 0;
  if (fbc_start(r->call, ops, n, &r->tag_send)) return stream_broken(r);
  r->send_pending = 1;
  atomic_store(&r->sent_seq, r->seq - r->seq_base); /* every launch queued went with it */
  return 0;
}

static int stream_open(fb_remote *r) {
  r->call = fbc_call_new(r->c, SESSION_PATH, 0);
  if (!r->call) return rerr(r, FB_EINTERNAL, "cannot create the Session stream");
  /* the status, with the initial metadata, which must be received before it */
  grpc_op ops[2];
  memset(ops, 0, sizeof ops);
  ops[0].op = GRPC_OP_RECV_INITIAL_METADATA;
  ops[0].data.recv_initial_metadata.recv_initial_metadata = &r->init_md;
  ops[1].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
  ops[1].data.recv_status_on_client.trailing_metadata = &r->end.trailing;
  ops[1].data.recv_status_on_client.status = &r->end.status;
  ops[1].data.recv_status_on_client.status_details = &r->end.details;
  r->md_recvd = 1;
  if (fbc_start(r->call, ops, 2, &r->tag_status)) {
    r->closed = r->broken = 1;
    return rerr(r, FB_EINTERNAL, "cannot start the Session stream");
  }
  fbp_session_tail(&r->out, r->id, 0, 0); /* attach: the session lives with this stream */
  r->nokeep++; /* (not sent again elsewhere) */
  int rc = stream_send(r);
  r->nokeep--;
  return rc;
}

/* ---------------------------------------------------------------- results */

static void clear_results(fb_remote *r) {
  for (int i = 0; i < r->nerrs; i++) free((char *)r->errs[i].msg);
  r->nerrs = r->nrets = 0;
  r->rets_dropped = r->errs_dropped = 0;
  r->delivered = 0;
}

/* The counters a sync brought (raw, this replica's) as the caller sees
 * them: after a move, each SUM counter is the sum over the replicas the
 * session lived on (the earlier ones as last seen there: cbase), each LEVEL
 * this one's; launches is the server's own (the checkpoint carries it). */
static void counters_continue(fb_remote *r, const fb_counters *raw) {
  r->raw = *raw;
  if (!r->cont) {
    r->counters = *raw;
    return;
  }
#define CONT_SUM_(name) r->counters.name = r->cbase.name + raw->name;
#define CONT_LEVEL_(name) r->counters.name = raw->name;
#define CONT_(name, type, kind, unit, meaning) CONT_##kind##_(name)
  FB_COUNTERS(CONT_)
#undef CONT_
#undef CONT_LEVEL_
#undef CONT_SUM_
  r->counters.launches = raw->launches;
}

static int merge(fb_remote *r, const Fusebox__V1__SyncResult *m) {
  if (r->delivered) clear_results(r);
  if (r->nrets + m->n_returns > (size_t)r->rcap) {
    size_t nc = (size_t)r->nrets + m->n_returns + 64;
    fb_launch_return *v = realloc(r->rets, sizeof *v * nc);
    if (!v) return rerr(r, FB_ENOMEM, "out of memory");
    r->rets = v;
    r->rcap = (int)nc;
  }
  for (size_t i = 0; i < m->n_returns; i++) {
    fb_launch_return *d = &r->rets[r->nrets++];
    d->seq = m->returns[i]->seq + (m->returns[i]->seq ? (uint64_t)r->seq_base : 0);
    d->kernel = m->returns[i]->kernel;
    if (fbp_value_from_pb(m->returns[i]->value, &d->value)) memset(&d->value, 0, sizeof d->value);
  }
  if (r->nerrs + m->n_errors > (size_t)r->ecap) {
    size_t nc = (size_t)r->nerrs + m->n_errors + 16;
    fb_launch_error *v = realloc(r->errs, sizeof *v * nc);
    if (!v) return rerr(r, FB_ENOMEM, "out of memory");
    r->errs = v;
    r->ecap = (int)nc;
  }
  for (size_t i = 0; i < m->n_errors; i++) {
    fb_launch_error *d = &r->errs[r->nerrs];
    d->msg = strdup(m->errors[i]->message ? m->errors[i]->message : "");
    if (!d->msg) continue;
    d->seq = m->errors[i]->seq + (m->errors[i]->seq ? (uint64_t)r->seq_base : 0);
    d->kernel = m->errors[i]->kernel;
    d->code = m->errors[i]->code < 0 && m->errors[i]->code >= FB_ELAST ? m->errors[i]->code
                                                                       : FB_EINTERNAL;
    r->nerrs++;
  }
  r->rets_dropped += m->returns_dropped;
  r->errs_dropped += m->errors_dropped;
  r->done_seq = m->seq + (uint64_t)r->seq_base;
  fb_counters raw;
  fbp_counters_from_pb(m->counters, &raw);
  counters_continue(r, &raw);
  return 0;
}

/* Receive the stream's next message into r->recv_bb (NULL at its end),
 * its initial metadata with the first. 1 done, <= 0 the call failed. */
static int recv_next(fb_remote *r) {
  grpc_op ops[2];
  memset(ops, 0, sizeof ops);
  size_t n = 0;
  if (!r->md_recvd) {
    ops[n].op = GRPC_OP_RECV_INITIAL_METADATA;
    ops[n++].data.recv_initial_metadata.recv_initial_metadata = &r->init_md;
    r->md_recvd = 1;
  }
  ops[n].op = GRPC_OP_RECV_MESSAGE;
  ops[n++].data.recv_message.recv_message = &r->recv_bb;
  return fbc_batch(r->c, r->call, ops, n, &r->tag_recv);
}

/* Wait for the SyncResult of sync id. */
static int recv_sync(fb_remote *r, uint64_t id) {
  for (;;) {
    if (recv_next(r) <= 0 || !r->recv_bb) return stream_broken(r);
    grpc_slice s = fbp_bb_slice(r->recv_bb);
    grpc_byte_buffer_destroy(r->recv_bb);
    r->recv_bb = NULL;
    Fusebox__V1__SessionResponse *m =
        fusebox__v1__session_response__unpack(NULL, GRPC_SLICE_LENGTH(s), GRPC_SLICE_START_PTR(s));
    grpc_slice_unref(s);
    if (!m) return rerr(r, FB_EINTERNAL, "malformed SessionResponse from the server");
    if (m->draining && m->draining[0]) r->rt.draining = 1; /* its replica drains: move */
    int rc = 0, mine = m->sync && m->sync->sync_id == id;
    if (m->sync) rc = merge(r, m->sync);
    if (mine) kept_clear(r); /* everything sent is answered */
    fusebox__v1__session_response__free_unpacked(m, NULL);
    if (rc || mine) return rc;
  }
}

static int do_sync(fb_remote *r, int flush) {
  for (int again = 0;; again++) {
    uint64_t id = ++r->next_sync;
    fbp_session_tail(&r->out, NULL, flush, id); /* (a second tail: its sync id counts) */
    int rc = stream_send(r);
    if (!rc) rc = recv_sync(r, id); /* the send completes meanwhile */
    if (!rc) rc = wait_send(r);
    if (!rc) {
      r->marks = 0;
      return 0;
    }
    /* ended by a drain after its grace: resumed elsewhere, asked again */
    if (again || resume_ended(r, rc)) return rc;
  }
}

/* Before field access: make every queued launch run first. */
static int presync(fb_remote *r) {
  if (r->nqueued == 0 && !r->marks && (uint64_t)r->seq == r->done_seq)
    return r->broken ? stream_broken(r) : 0;
  return do_sync(r, 0);
}

static const char *kernel_name(const fb_remote *r, int k) {
  return k >= 0 && k < r->nk && r->k[k].name ? r->k[k].name : "?";
}

int fb_remote_sync(fb_remote *r, fb_sync_result *out) {
  if (out) memset(out, 0, sizeof *out);
  maybe_move(r);
  int rc = do_sync(r, 0);
  if (rc) return rc;
  if (out) {
    out->seq = r->done_seq;
    out->returns = r->rets;
    out->nreturns = r->nrets;
    out->errors = r->errs;
    out->nerrors = r->nerrs;
    out->returns_dropped = r->rets_dropped;
    out->errors_dropped = r->errs_dropped;
    out->counters = r->counters;
  }
  r->delivered = 1;
  if (r->nerrs) {
    const fb_launch_error *e = &r->errs[0];
    return rerr(r, e->code, "launch #%llu (kernel %d '%s'): %s", (unsigned long long)e->seq,
                e->kernel, kernel_name(r, e->kernel), e->msg);
  }
  return 0;
}

int fb_remote_flush(fb_remote *r) {
  if (r->broken) {
    int rc = resume_ended(r, stream_broken(r));
    if (rc) return rc;
  }
  fbp_session_tail(&r->out, NULL, 1, 0);
  int rc = stream_send(r);
  if (rc && (rc = resume_ended(r, rc)) == 0 && r->out.n) rc = stream_send(r);
  return rc;
}

int fb_remote_counters(fb_remote *r, fb_counters *out) {
  int rc = do_sync(r, 0);
  if (!rc) *out = r->counters;
  return rc;
}

/* ---------------------------------------------------------------- launches */

int64_t fb_remote_launch(fb_remote *r, int kernel, const fb_value *args, int nargs) {
  if (kernel < 0 || kernel >= r->nk || !r->k[kernel].name)
    return rerr(r, FB_ENOENT, "no kernel with id %d in this session (%d registered)", kernel,
                r->nk);
  if (nargs != r->k[kernel].nparams || (nargs > 0 && !args))
    return rerr(r, FB_ETYPE, "kernel '%s' takes %d arguments, %d given", r->k[kernel].name,
                r->k[kernel].nparams, nargs);
  if (r->broken) {
    int rc = resume_ended(r, stream_broken(r));
    if (rc) return rc;
  }
  maybe_move(r);
  fb_client *c = r->c;
  if (r->nqueued >= c->batch || r->out.n + LAUNCH_MAX_BYTES(nargs) + 64 > c->max_msg) {
    int rc = stream_send(r);
    if (rc && (rc = resume_ended(r, rc)) == 0 && r->out.n) rc = stream_send(r); /* (not sent) */
    if (rc) return rc;
  }
  fbp_launch_append(&r->out, kernel, args, nargs);
  if (r->out.oom) return rerr(r, FB_ENOMEM, "out of memory queueing a launch");
  r->nqueued++;
  return ++r->seq;
}

int fb_remote_call(fb_remote *r, int kernel, const fb_value *args, int nargs, fb_value *ret) {
  int64_t seq = fb_remote_launch(r, kernel, args, nargs);
  if (seq < 0) return (int)seq;
  fb_sync_result res;
  int rc = fb_remote_sync(r, &res);
  for (int i = 0; i < res.nerrors; i++)
    if (res.errors[i].seq == (uint64_t)seq)
      return rerr(r, res.errors[i].code, "%s", res.errors[i].msg);
  if (ret) {
    memset(ret, 0, sizeof *ret);
    for (int i = 0; i < res.nreturns; i++)
      if (res.returns[i].seq == (uint64_t)seq) *ret = res.returns[i].value;
  }
  return rc;
}

/* ---------------------------------------------------------------- the tape */

static int tape_mark(fb_remote *r, int end, int loss) {
  if (r->broken) return stream_broken(r);
  if (r->out.n + 64 > r->c->max_msg) {
    int rc = stream_send(r);
    if (rc) return rc;
  }
  fbp_tape_append(&r->out, r->nqueued, end, loss);
  if (r->out.oom) return rerr(r, FB_ENOMEM, "out of memory queueing a tape mark");
  r->marks = 1;
  return 0;
}

int fb_remote_tape_begin(fb_remote *r, int loss_field) {
  if (loss_field < 0 || !r->layout || loss_field >= r->layout->nnodes)
    return rerr(r, FB_EINVAL, "tape: no field with id %d in this session", loss_field);
  return tape_mark(r, 0, loss_field);
}

int fb_remote_tape_end(fb_remote *r) { return tape_mark(r, 1, 0); }

/* ---------------------------------------------------------------- kernels */

static int record_kernel(fb_remote *r, int id, const fb_kernel *k, const fb_kernel *src) {
  if (id >= r->kcap) {
    int nc = id + 16;
    kinfo *v = realloc(r->k, sizeof *v * (size_t)nc);
    if (!v) return rerr(r, FB_ENOMEM, "out of memory");
    memset(v + r->kcap, 0, sizeof *v * (size_t)(nc - r->kcap));
    r->k = v;
    r->kcap = nc;
  }
  kinfo *ki = &r->k[id];
  free(ki->name);
  if (!(ki->name = strdup(k->name))) return rerr(r, FB_ENOMEM, "out of memory");
  ki->nparams = k->nparams;
  ki->ret = k->ret;
  ki->src = src;
  if (id >= r->nk) r->nk = id + 1;
  return 0;
}

static int register_kernel(fb_remote *r, const fb_kernel *k, const fb_kernel *src) {
  fbp_arena a;
  fbp_arena_init(&a);
  Fusebox__V1__RegisterKernelsRequest req = FUSEBOX__V1__REGISTER_KERNELS_REQUEST__INIT;
  Fusebox__V1__Kernel *km = fbp_kernel_to_pb(&a, k);
  req.session_id = r->id;
  req.n_kernels = 1;
  req.kernels = &km;
  grpc_slice resp = grpc_empty_slice();
  int rc = km ? fbc_unary_route(r->c, &r->rt, "/fusebox.v1.Fusebox/RegisterKernels", &req.base, &resp, r->err,
                          sizeof r->err)
              : rerr(r, FB_ENOMEM, "out of memory");
  fbp_arena_free(&a);
  if (rc) return rc;
  Fusebox__V1__RegisterKernelsResponse *m = fusebox__v1__register_kernels_response__unpack(
      NULL, GRPC_SLICE_LENGTH(resp), GRPC_SLICE_START_PTR(resp));
  grpc_slice_unref(resp);
  if (!m || m->n_kernel_ids != 1 || m->kernel_ids[0] < 0 || m->kernel_ids[0] > (1 << 24)) {
    if (m) fusebox__v1__register_kernels_response__free_unpacked(m, NULL);
    return rerr(r, FB_EINTERNAL, "malformed RegisterKernels answer");
  }
  int id = m->kernel_ids[0];
  fusebox__v1__register_kernels_response__free_unpacked(m, NULL);
  rc = record_kernel(r, id, k, src);
  return rc ? rc : id;
}

/* The adjoint (tangent 0) or the tangent (1) of a registered kernel,
 * made on the server: RegisterKernels' adjoints / tangents. */
static int remote_derived(fb_remote *r, int kernel, int tangent) {
  if (kernel < 0 || kernel >= r->nk || !r->k[kernel].name)
    return rerr(r, FB_ENOENT, "no kernel with id %d in this session (%d registered)", kernel,
                r->nk);
  fbp_arena a;
  fbp_arena_init(&a);
  Fusebox__V1__RegisterKernelsRequest req = FUSEBOX__V1__REGISTER_KERNELS_REQUEST__INIT;
  int32_t want = kernel;
  req.session_id = r->id;
  if (tangent) {
    req.n_tangents = 1;
    req.tangents = &want;
  } else {
    req.n_adjoints = 1;
    req.adjoints = &want;
  }
  grpc_slice resp = grpc_empty_slice();
  int rc = fbc_unary_route(r->c, &r->rt, "/fusebox.v1.Fusebox/RegisterKernels", &req.base, &resp, r->err,
                     sizeof r->err);
  fbp_arena_free(&a);
  if (rc) return rc;
  Fusebox__V1__RegisterKernelsResponse *m = fusebox__v1__register_kernels_response__unpack(
      NULL, GRPC_SLICE_LENGTH(resp), GRPC_SLICE_START_PTR(resp));
  grpc_slice_unref(resp);
  if (!m || m->n_kernel_ids != 1 || m->kernel_ids[0] < 0 || m->kernel_ids[0] > (1 << 24)) {
    if (m) fusebox__v1__register_kernels_response__free_unpacked(m, NULL);
    return rerr(r, FB_EINTERNAL, "malformed RegisterKernels answer");
  }
  int id = m->kernel_ids[0];
  fusebox__v1__register_kernels_response__free_unpacked(m, NULL);
  char name[256];
  snprintf(name, sizeof name, "%s%s", r->k[kernel].name, tangent ? ".dual" : ".grad");
  kinfo *src = &r->k[kernel];
  if (id >= r->kcap || !r->k[id].name) {
    fb_kernel tmp;
    memset(&tmp, 0, sizeof tmp);
    tmp.name = name;
    tmp.nparams = src->nparams;
    tmp.ret = tangent ? src->ret : FB_T_VOID; /* a tangent returns what the kernel does */
    if ((rc = record_kernel(r, id, &tmp, NULL))) return rc;
  }
  return id;
}

int fb_remote_kernel_adjoint(fb_remote *r, int kernel) { return remote_derived(r, kernel, 0); }

int fb_remote_kernel_tangent(fb_remote *r, int kernel) { return remote_derived(r, kernel, 1); }
int fb_remote_set_kernel_adjoint(fb_remote *r, int kernel, int adj) {
  if (kernel < 0 || kernel >= r->nk || !r->k[kernel].name)
    return rerr(r, FB_ENOENT, "no kernel with id %d in this session (%d registered)", kernel,
                r->nk);
  if (adj < 0 || adj >= r->nk || !r->k[adj].name)
    return rerr(r, FB_ENOENT, "no kernel with id %d in this session (%d registered)", adj, r->nk);
  Fusebox__V1__RegisterKernelsRequest req = FUSEBOX__V1__REGISTER_KERNELS_REQUEST__INIT;
  Fusebox__V1__CustomAdjoint c = FUSEBOX__V1__CUSTOM_ADJOINT__INIT;
  Fusebox__V1__CustomAdjoint *cs = &c;
  c.kernel = kernel;
  c.adjoint = adj;
  req.session_id = r->id;
  req.n_custom_adjoints = 1;
  req.custom_adjoints = &cs;
  grpc_slice resp = grpc_empty_slice();
  int rc = fbc_unary_route(r->c, &r->rt, "/fusebox.v1.Fusebox/RegisterKernels", &req.base, &resp, r->err,
                     sizeof r->err);
  if (rc) return rc;
  Fusebox__V1__RegisterKernelsResponse *m = fusebox__v1__register_kernels_response__unpack(
      NULL, GRPC_SLICE_LENGTH(resp), GRPC_SLICE_START_PTR(resp));
  grpc_slice_unref(resp);
  if (!m || m->n_kernel_ids != 0) {
    if (m) fusebox__v1__register_kernels_response__free_unpacked(m, NULL);
    return rerr(r, FB_EINTERNAL, "malformed RegisterKernels answer");
  }
  fusebox__v1__register_kernels_response__free_unpacked(m, NULL);
  return 0;
}

int fb_remote_add_kernel(fb_remote *r, const fb_kernel *k) {
  if (!k) return rerr(r, FB_EINVAL, "no kernel given");
  return register_kernel(r, k, NULL);
}

int fb_remote_kernel(fb_remote *r, const char *name, const char *const *fields, int nfields) {
  if (!r->prog) return rerr(r, FB_EINVAL, "this session was not opened from a program");
  fb_kernel *k = NULL;
  fb_diags d;
  fb_diags_init(&d);
  int rc = fb_program_instantiate(r->prog, name, fields, nfields, &k, &d);
  if (rc) {
    char *msg = fb_diags_render(fb_program_filename(r->prog), fb_program_source(r->prog), &d);
    rerr(r, rc, "kernel '%s': %s", name, msg && *msg ? msg : fb_strerror(rc));
    free(msg);
    fb_diags_free(&d);
    return rc;
  }
  fb_diags_free(&d);
  for (int i = 0; i < r->nk; i++)
    if (r->k[i].src == k) return i;
  int id = register_kernel(r, k, k);
  /* `kernel k(...) grad k_adj`: k_adj's instance for the same fields is
   * its adjoint on the server (a custom gradient) */
  int ki = fb_program_find_kernel(r->prog, name);
  const char *g = ki >= 0 ? fb_program_kernel(r->prog, ki)->grad : NULL;
  if (id >= 0 && g) {
    int aid = fb_remote_kernel(r, g, fields, nfields);
    if (aid < 0) return aid;
    if ((rc = fb_remote_set_kernel_adjoint(r, id, aid))) return rc;
  }
  return id;
}

/* ---------------------------------------------------------------- SNodes from the host */

/* One launch of the kernel that does op on target (host.c), registered
 * the first time. */
static int64_t host_launch(fb_remote *r, fb_host_op op, const char *target, const int64_t *idx,
                           int nidx) {
  if (!r->prog) return rerr(r, FB_EINVAL, "this session was not opened from a program");
  int sn, nd, rc = fb_host_target(r->prog, target, &sn, &nd, r->err, sizeof r->err);
  if (rc) return rc;
  int want = op == FB_HOST_DEACTIVATE_ALL ? 0 : nd;
  if (nidx != want || (nidx > 0 && !idx))
    return rerr(r, FB_EINVAL, "'%s' takes %d indices, %d given", target, want, nidx);
  const fb_snode *s = &fb_program_layout(r->prog)->nodes[sn];
  fb_value args[FB_MAX_AXES];
  for (int d = 0; d < nidx; d++) {
    int64_t ext = s->shape[s->dim_axis[d]];
    if (idx[d] < 0 || idx[d] >= ext)
      return rerr(r, FB_EBOUNDS, "index %lld (number %d) is out of bounds of '%s' (0 .. %lld)",
                  (long long)idx[d], d, target, (long long)ext - 1);
    args[d] = fb_value_i32((int32_t)idx[d]);
  }
  char name[320];
  fbc_host_name(op, target, name, sizeof name);
  int id = -1;
  for (int i = 0; i < r->nk && id < 0; i++)
    if (r->k[i].name && !r->k[i].src && !strcmp(r->k[i].name, name)) id = i;
  if (id < 0) {
    fb_program *hp;
    fb_kernel *k;
    if ((rc = fb_host_kernel(r->prog, op, target, &hp, &k, r->err, sizeof r->err))) return rc;
    id = register_kernel(r, k, NULL);
    fb_program_free(hp);
    if (id < 0) return id;
  }
  return fb_remote_launch(r, id, args, nidx);
}

int64_t fb_remote_activate(fb_remote *r, const char *target, const int64_t *idx, int nidx) {
  return host_launch(r, FB_HOST_ACTIVATE, target, idx, nidx);
}

int64_t fb_remote_deactivate(fb_remote *r, const char *target, const int64_t *idx, int nidx) {
  return host_launch(r, FB_HOST_DEACTIVATE, target, idx, nidx);
}

int64_t fb_remote_deactivate_all(fb_remote *r, const char *target) {
  return host_launch(r, FB_HOST_DEACTIVATE_ALL, target, NULL, 0);
}

int fb_remote_find_field(const fb_remote *r, const char *name, int comp) {
  if (!name) return FB_EINVAL;
  if (r->prog) {
    int f = fb_program_find_field(r->prog, name);
    if (f < 0) return FB_ENOENT;
    const fb_lang_field *lf = fb_program_field(r->prog, f);
    return comp >= 0 && comp < lf->ncomp ? lf->places[comp] : FB_ENOENT;
  }
  int id = fb_layout_find(r->layout, name);
  return id > 0 && r->layout->nodes[id].kind == FB_SN_PLACE && comp == 0 ? id : FB_ENOENT;
}

/* ---------------------------------------------------------------- open and close */

static void options_to_pb(fbp_arena *a, const fb_remote_options *o,
                          Fusebox__V1__SessionOptions *m) {
  fusebox__v1__session_options__init(m);
  if (!o) return;
  m->backend = fbp_strdup(a, o->backend ? o->backend : "");
  m->mode = fbp_strdup(a, o->mode ? o->mode : "");
  const char *names[4] = {"listgen", "demote", "fusion", "dse"};
  int vals[4] = {o->listgen, o->demote, o->fusion, o->dse};
  m->passes = fbp_alloc(a, sizeof *m->passes * 4);
  for (int i = 0; i < 4 && m->passes; i++) {
    if (vals[i] < 0) continue;
    Fusebox__V1__SessionOptions__PassesEntry *e = fbp_alloc(a, sizeof *e);
    if (!e) break;
    fusebox__v1__session_options__passes_entry__init(e);
    e->key = (char *)names[i];
    e->value = vals[i] != 0;
    m->passes[m->n_passes++] = e;
  }
  m->flush_every = o->flush_every;
  m->max_fuse_per_task = o->max_fuse_per_task;
  m->compile_threads = o->compile_threads;
  m->seed = o->seed;
  m->memory_limit = o->memory_limit;
}

static int create_session(fb_remote *r, const fb_remote_options *o, const fb_layout *l) {
  fbp_arena a;
  fbp_arena_init(&a);
  Fusebox__V1__CreateSessionRequest req = FUSEBOX__V1__CREATE_SESSION_REQUEST__INIT;
  Fusebox__V1__SessionOptions opts;
  options_to_pb(&a, o, &opts);
  req.options = &opts;
  req.layout = fbp_layout_to_pb(&a, l);
  grpc_slice resp = grpc_empty_slice();
  int rc = req.layout ? fbc_unary_route(r->c, &r->rt, "/fusebox.v1.Fusebox/CreateSession", &req.base, &resp,
                                  r->err, sizeof r->err)
                      : rerr(r, FB_ENOMEM, "out of memory");
  fbp_arena_free(&a);
  if (rc) return rc;
  Fusebox__V1__CreateSessionResponse *m = fusebox__v1__create_session_response__unpack(
      NULL, GRPC_SLICE_LENGTH(resp), GRPC_SLICE_START_PTR(resp));
  grpc_slice_unref(resp);
  if (!m || strlen(m->session_id) >= sizeof r->id) {
    if (m) fusebox__v1__create_session_response__free_unpacked(m, NULL);
    return rerr(r, FB_EINTERNAL, "malformed CreateSession answer");
  }
  snprintf(r->id, sizeof r->id, "%s", m->session_id);
  r->rt.session = r->id; /* from now on, a replica gone means the session is lost */
  fusebox__v1__create_session_response__free_unpacked(m, NULL);
  return 0;
}

static void remote_free(fb_remote *r) {
  if (r->call) grpc_call_unref(r->call);
  if (r->send_bb) grpc_byte_buffer_destroy(r->send_bb);
  if (r->recv_bb) grpc_byte_buffer_destroy(r->recv_bb);
  grpc_metadata_array_destroy(&r->init_md);
  fbc_end_free(&r->end);
  fbp_buf_free(&r->out);
  free(r->kept);
  free(r->km);
  clear_results(r);
  free(r->rets);
  free(r->errs);
  for (int i = 0; i < r->nk; i++) free(r->k[i].name);
  free(r->k);
  fb_layout_free(r->layout);
  if (r->own_prog) fb_program_free(r->prog);
  free(r);
}

int fb_remote_open(fb_client *c, const fb_remote_options *opt, const fb_layout *layout,
                   fb_remote **out) {
  *out = NULL;
  if (!layout || !layout->finalized) {
    fb_errf(c->err, sizeof c->err, "the session's layout is missing or not finalized");
    return FB_EINVAL;
  }
  fb_remote *r = calloc(1, sizeof *r);
  if (!r) return FB_ENOMEM;
  r->c = c;
  grpc_metadata_array_init(&r->init_md);
  fbc_end_init(&r->end);
  fbc_learn_limits(c);
  int rc = (r->layout = fb_layout_clone(layout)) ? 0 : rerr(r, FB_ENOMEM, "out of memory");
  if (!rc && fbc_route_init(&r->rt)) rc = rerr(r, FB_EIO, "cannot read /dev/urandom for a routing key");
  /* a replica that is draining refuses new sessions: behind a proxy that
     hashes on the routing key, a new key is another replica (CREATE_TRIES);
     with an address list, the next address */
  for (int i = 0; !rc; i++) {
    rc = create_session(r, opt, layout);
    if (!rc || i + 1 >= CREATE_TRIES || !strstr(r->err, "is draining; retry on another replica") ||
        fbc_route_init(&r->rt))
      break;
    if (fbc_next_address(r->c)) fbc_learn_limits(r->c = fbc_next_address(r->c));
    rc = 0;
  }
  if (!rc) rc = stream_open(r); /* on failure the stream is already over */
  if (rc) {
    fb_errf(c->err, sizeof c->err, "%s", r->err);
    remote_free(r);
    return rc;
  }
  *out = r;
  return 0;
}

int fb_remote_open_program(fb_client *c, const fb_remote_options *opt, fb_program *p,
                           fb_remote **out) {
  *out = NULL;
  if (!p) return FB_EINVAL;
  int rc = fb_remote_open(c, opt, fb_program_layout(p), out);
  if (!rc) (*out)->prog = p;
  return rc;
}

int fb_remote_open_source(fb_client *c, const fb_remote_options *opt, const char *filename,
                          const char *src, fb_remote **out) {
  *out = NULL;
  fb_program *p = NULL;
  fb_diags d;
  fb_diags_init(&d);
  int rc = fb_program_parse(filename ? filename : "<source>", src ? src : "", &p, &d);
  if (rc) {
    char *msg = fb_diags_render(filename ? filename : "<source>", src, &d);
    fb_errf(c->err, sizeof c->err, "%s", msg ? msg : fb_strerror(rc));
    free(msg);
    fb_diags_free(&d);
    return rc;
  }
  fb_diags_free(&d);
  rc = fb_remote_open_program(c, opt, p, out);
  if (rc) fb_program_free(p);
  else (*out)->own_prog = 1;
  return rc;
}

int fb_remote_cancel(fb_remote *r) {
  if (!r) return FB_EINVAL;
  Fusebox__V1__CancelRequest req = FUSEBOX__V1__CANCEL_REQUEST__INIT;
  req.session_id = r->id;
  /* the launches sent so far, which this call may overtake on their way */
  req.through_launch = (uint64_t)atomic_load(&r->sent_seq);
  grpc_slice resp = grpc_empty_slice();
  char err[256];
  fbc_route rt = r->rt; /* any thread: a copy (set before the session was returned) */
  int rc = fbc_unary_route(r->c, &rt, "/fusebox.v1.Fusebox/Cancel", &req.base, &resp, err,
                           sizeof err);
  grpc_slice_unref(resp);
  return rc;
}

/* Read what the server still sends after the close (a drain's notice that
 * no sync asked for) until the stream ends: gRPC hands out the call's
 * status only once its messages are read. Bounded: a server that keeps
 * sending is cut off by the status wait's deadline. */
static void read_to_end(fb_remote *r) {
  for (int i = 0; i < 1024; i++) {
    if (recv_next(r) <= 0 || !r->recv_bb) return;
    grpc_byte_buffer_destroy(r->recv_bb);
    r->recv_bb = NULL;
  }
}

int fb_remote_close(fb_remote *r) {
  if (!r) return 0;
  int rc = 0;
  fb_client *c = r->c;
  if (!r->broken) {
    if (r->nqueued || r->out.n) rc = stream_send(r);
    if (!rc) rc = wait_send(r);
    grpc_op op;
    memset(&op, 0, sizeof op);
    op.op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
    if (!rc && fbc_batch(c, r->call, &op, 1, &r->tag_send) <= 0) rc = stream_broken(r);
    if (!rc) read_to_end(r);
  }
  if (!r->closed) {
    if (fbc_wait(c, r->call, &r->tag_status) <= 0 && !rc)
      rc = rerr(r, FB_EIO, "closing session %.8s: no answer from the server", r->id);
    r->closed = 1;
  }
  char msg[FBC_ERRLEN] = "";
  int code = fbc_end_code(&r->end, msg, sizeof msg);
  if (code && !rc && lost_msg(r, &r->end, msg, sizeof msg))
    rc = rerr(r, FB_EIO, "%s", msg); /* "session S lost: replica R unreachable" */
  if (code && !rc) rc = rerr(r, code, "closing session %.8s: %s", r->id, msg);
  if (rc) fb_errf(c->err, sizeof c->err, "%s", r->err);
  remote_free(r);
  return rc;
}

/* ---------------------------------------------------------------- fields */

int fb_remote_field_bytes(const fb_remote *r, int field, size_t *bytes) {
  const fb_layout *l = r->layout;
  if (field < 0 || field >= l->nnodes || l->nodes[field].kind != FB_SN_PLACE) return FB_ENOENT;
  *bytes = (size_t)fb_field_numel(l, field) * fb_type_size(l->nodes[field].type);
  return 0;
}

static int check_io(fb_remote *r, int field, const void *buf, size_t bytes, const char *what) {
  size_t want = 0;
  if (fb_remote_field_bytes(r, field, &want))
    return rerr(r, FB_ENOENT, "%s: no field with id %d", what, field);
  if (!buf || bytes != want)
    return rerr(r, FB_EINVAL, "%s: field '%s' holds %zu bytes; %zu given", what,
                r->layout->nodes[field].name, want, bytes);
  maybe_move(r);
  peek_end(r);
  return presync(r);
}

static int end_lost_call(fb_remote *r, grpc_call *call, fbc_end *e, int rc, const char *msg) {
  (void)rc;
  fbc_end_free(e);
  grpc_call_unref(call);
  return rerr(r, FB_EIO, "%s", msg);
}

/* Finish a field call: wait for its status, the code and message into r. */
static int end_call(fb_remote *r, grpc_call *call, fbc_end *e, int *stag, int rc,
                    const char *what) {
  int ok = fbc_wait(r->c, call, stag);
  char msg[FBC_ERRLEN] = "";
  int code = ok > 0 ? fbc_end_code(e, msg, sizeof msg) : FB_EIO;
  if (ok > 0 && code && lost_msg(r, e, msg, sizeof msg)) /* replica gone */
    return end_lost_call(r, call, e, rc, msg);
  if (!rc && code) rc = rerr(r, code, "%s: %s", what, ok > 0 ? msg : "no answer");
  fbc_end_free(e);
  grpc_call_unref(call);
  return rc;
}

/* The data slices point into the caller's buffer; the write waits until
 * gRPC has let go of every one of them before it returns. */
typedef struct lent {
  atomic_int out;
} lent;

static void lent_back(void *p) { atomic_fetch_sub(&((lent *)p)->out, 1); }

static void wait_lent(lent *l) {
  for (int i = 0; atomic_load(&l->out) > 0 && i < 100000; i++) {
    struct timespec ts = {0, 100000};
    nanosleep(&ts, NULL);
  }
}

/* A chunk's message up to its data's bytes (the data follow as a slice of
 * the caller's buffer, never copied), into out (CHUNK_HEAD_MAX bytes);
 * 0: it does not fit. */
#define CHUNK_HEAD_MAX 1024
typedef size_t (*chunk_head_fn)(void *ctx, uint8_t *out, size_t off, size_t n);

/* src[0, bytes) as a stream of messages of at most the client's chunk of
 * data each (one at least when one is set), each a header and a slice of
 * src, one send in flight while the next is made; the first carries the
 * routing metadata. src must stay until wait_lent(l). */
static int send_chunks(fb_remote *r, grpc_call *call, const uint8_t *src, size_t bytes, int one,
                       chunk_head_fn head, void *ctx, lent *l) {
  int tag, pending = 0, ok = 1;
  grpc_byte_buffer *bb = NULL;
  grpc_metadata md[2];
  size_t chunk = r->c->chunk;
  for (size_t off = 0; (off < bytes || (one && !off)) && ok > 0; off += chunk) {
    size_t n = bytes - off < chunk ? bytes - off : chunk;
    uint8_t hdr[CHUNK_HEAD_MAX];
    size_t hn = head(ctx, hdr, off, n);
    if (!hn) {
      ok = 0;
      break;
    }
    grpc_slice sl[2] = {grpc_slice_from_copied_buffer((const char *)hdr, hn), grpc_empty_slice()};
    if (n) {
      atomic_fetch_add(&l->out, 1);
      sl[1] = grpc_slice_new_with_user_data((void *)(src + off), n, lent_back, l);
    }
    grpc_byte_buffer *next = grpc_raw_byte_buffer_create(sl, n ? 2 : 1);
    grpc_slice_unref(sl[0]);
    grpc_slice_unref(sl[1]);
    if (pending) ok = fbc_wait(r->c, call, &tag);
    if (bb) grpc_byte_buffer_destroy(bb);
    bb = next;
    grpc_op ops[2];
    memset(ops, 0, sizeof ops);
    size_t k = 0;
    if (!off) fbc_initial_md_route(r->c, &ops[k++], md, &r->rt);
    ops[k].op = GRPC_OP_SEND_MESSAGE;
    ops[k++].data.send_message.send_message = bb;
    if (ok > 0) ok = fbc_start(call, ops, k, &tag) ? 0 : 1;
    pending = ok > 0;
  }
  if (pending) ok = fbc_wait(r->c, call, &tag);
  if (bb) grpc_byte_buffer_destroy(bb);
  return ok > 0 ? 0 : FB_EIO;
}

/* WriteField's FieldChunk: the session and field on the first. */
typedef struct field_head {
  fb_remote *r;
  int field;
  size_t bytes;
} field_head;

static size_t field_chunk_head(void *ctx, uint8_t *out, size_t off, size_t n) {
  field_head *f = ctx;
  return fbp_chunk_header(out, off ? NULL : f->r->id, off ? 0 : f->field, off,
                          off ? 0 : f->bytes, n);
}

static int field_write(fb_remote *r, int field, const void *src, size_t bytes) {
  int rc = check_io(r, field, src, bytes, "field write");
  if (rc) return rc;
  grpc_call *call = fbc_call_new(r->c, "/fusebox.v1.Fusebox/WriteField", 0);
  fbc_end e;
  fbc_end_init(&e);
  int stag, tag;
  if (fbc_start_status(call, &e, &stag)) return rerr(r, FB_EINTERNAL, "cannot start WriteField");
  lent l;
  atomic_init(&l.out, 0);
  field_head fh = {r, field, bytes};
  rc = send_chunks(r, call, src, bytes, 0, field_chunk_head, &fh, &l);
  grpc_metadata_array md;
  grpc_metadata_array_init(&md);
  grpc_byte_buffer *rbb = NULL;
  grpc_op ops[3];
  memset(ops, 0, sizeof ops);
  ops[0].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
  ops[1].op = GRPC_OP_RECV_INITIAL_METADATA;
  ops[1].data.recv_initial_metadata.recv_initial_metadata = &md;
  ops[2].op = GRPC_OP_RECV_MESSAGE;
  ops[2].data.recv_message.recv_message = &rbb;
  if (!rc) fbc_batch(r->c, call, ops, 3, &tag);
  if (rbb) grpc_byte_buffer_destroy(rbb);
  grpc_metadata_array_destroy(&md);
  if (rc) grpc_call_cancel(call, NULL);
  rc = end_call(r, call, &e, &stag, rc ? rerr(r, rc, "field write: the transfer failed") : 0,
                "field write");
  wait_lent(&l);
  return rc;
}

/* Where a received chunk goes (fbp_bb_take_chunk): it must continue the
 * field where the bytes so far end. */
typedef struct chunk_to {
  fb_remote *r;
  uint8_t *dst;
  size_t bytes, got;
} chunk_to;

static uint8_t *chunk_dst(void *user, const fbp_chunk *ch) {
  chunk_to *t = user;
  if (ch->offset == t->got && ch->total_bytes == t->bytes && ch->len <= t->bytes - t->got)
    return t->dst + t->got;
  rerr(t->r, FB_EINTERNAL,
       "field read: chunk at %llu (%zu bytes) does not continue the "
       "field (%zu of %zu bytes)",
       (unsigned long long)ch->offset, ch->len, t->got, t->bytes);
  return NULL;
}

/* One received chunk into its place, copied from the message's slices. */
static int take_chunk(chunk_to *t, grpc_byte_buffer *bb) {
  fbp_chunk ch;
  char err[256];
  int rc = fbp_bb_take_chunk(bb, &ch, chunk_dst, t, err, sizeof err);
  if (rc == FBP_CHUNK_MALFORMED) rerr(t->r, FB_EINTERNAL, "field read: %s", err);
  if (rc) return FB_EINTERNAL; /* refused: chunk_dst said why */
  t->got += ch.len;
  return 0;
}

static int field_read(fb_remote *r, int field, void *dst, size_t bytes) {
  int rc = check_io(r, field, dst, bytes, "field read");
  if (rc) return rc;
  grpc_call *call = fbc_call_new(r->c, "/fusebox.v1.Fusebox/ReadField", 0);
  fbc_end e;
  fbc_end_init(&e);
  int stag, tag;
  if (fbc_start_status(call, &e, &stag)) return rerr(r, FB_EINTERNAL, "cannot start ReadField");
  Fusebox__V1__ReadFieldRequest req = FUSEBOX__V1__READ_FIELD_REQUEST__INIT;
  req.session_id = r->id;
  req.field = field;
  req.chunk_bytes = (uint32_t)r->c->chunk;
  uint8_t buf[128];
  grpc_byte_buffer *rq = fbp_bb_from(buf, fusebox__v1__read_field_request__pack(&req, buf));
  grpc_metadata_array md;
  grpc_metadata_array_init(&md);
  grpc_op ops[4];
  memset(ops, 0, sizeof ops);
  grpc_metadata rmd[2];
  fbc_initial_md_route(r->c, &ops[0], rmd, &r->rt);
  ops[1].op = GRPC_OP_SEND_MESSAGE;
  ops[1].data.send_message.send_message = rq;
  ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
  ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
  ops[3].data.recv_initial_metadata.recv_initial_metadata = &md;
  int ok = fbc_batch(r->c, call, ops, 4, &tag);
  chunk_to to = {r, dst, bytes, 0};
  while (ok > 0 && !rc) {
    grpc_byte_buffer *bb = NULL;
    grpc_op op;
    memset(&op, 0, sizeof op);
    op.op = GRPC_OP_RECV_MESSAGE;
    op.data.recv_message.recv_message = &bb;
    ok = fbc_batch(r->c, call, &op, 1, &tag);
    if (ok <= 0 || !bb) break;
    rc = take_chunk(&to, bb);
    grpc_byte_buffer_destroy(bb);
  }
  grpc_byte_buffer_destroy(rq);
  grpc_metadata_array_destroy(&md);
  if (rc) grpc_call_cancel(call, NULL);
  rc = end_call(r, call, &e, &stag, rc, "field read");
  if (!rc && to.got != bytes)
    rc = rerr(r, FB_EIO, "field read: the stream ended after %zu of %zu bytes", to.got, bytes);
  return rc;
}

/* A transfer refused because a drain ended the session after its grace
 * (nothing was written or read there): resumed elsewhere, made there. */
int fb_remote_field_write(fb_remote *r, int field, const void *src, size_t bytes) {
  int rc = field_write(r, field, src, bytes);
  if (rc && strstr(r->err, CKPT_MARK) && resume_ended(r, rc) == 0)
    rc = field_write(r, field, src, bytes);
  return rc;
}

int fb_remote_field_read(fb_remote *r, int field, void *dst, size_t bytes) {
  int rc = field_read(r, field, dst, bytes);
  if (rc && strstr(r->err, CKPT_MARK) && resume_ended(r, rc) == 0)
    rc = field_read(r, field, dst, bytes);
  return rc;
}

/* ---------------------------------------------------------------- checkpoints
 * Checkpoint streams the session's sealed checkpoint here (or has the
 * server keep it); Restore uploads one (or names one) and binds a new
 * fb_remote to the session it makes. What this client needs to go on (its
 * kernels' names and arities, the program's source) travels, sealed, in
 * CheckpointRequest.client_state, in this text form:
 *   "libfusebox-remote 1\n" nk "\n" (nparams " " ret " " name "\n"){nk}
 *   filename-length " " source-length "\n" filename source          */

#define STATE_MAGIC "libfusebox-remote 1\n"

static char *state_of(const fb_remote *r, size_t *n) {
  const char *fn = r->prog ? fb_program_filename(r->prog) : "";
  const char *src = r->prog ? fb_program_source(r->prog) : "";
  fn = fn ? fn : "";
  src = src ? src : "";
  size_t cap = strlen(STATE_MAGIC) + 32 + strlen(fn) + strlen(src) + 64;
  for (int i = 0; i < r->nk; i++) cap += 48 + (r->k[i].name ? strlen(r->k[i].name) : 1);
  char *s = malloc(cap);
  if (!s) return NULL;
  size_t k = (size_t)snprintf(s, cap, "%s%d\n", STATE_MAGIC, r->nk);
  for (int i = 0; i < r->nk; i++)
    k += (size_t)snprintf(s + k, cap - k, "%d %d %s\n", r->k[i].nparams, (int)r->k[i].ret,
                          r->k[i].name ? r->k[i].name : "-");
  k += (size_t)snprintf(s + k, cap - k, "%zu %zu\n", strlen(fn), strlen(src));
  memcpy(s + k, fn, strlen(fn));
  k += strlen(fn);
  memcpy(s + k, src, strlen(src));
  k += strlen(src);
  *n = k;
  return s;
}

/* r (fresh) from such a state: its kernels, its program. */
static int state_into(fb_remote *r, const uint8_t *p, size_t n, uint64_t nkernels) {
  const char *bad = "Restore: the checkpoint was not written by libfusebox (fb_remote_checkpoint)";
  size_t ml = strlen(STATE_MAGIC);
  if (n < ml || memcmp(p, STATE_MAGIC, ml)) return rerr(r, FB_EINVAL, "%s", bad);
  char *s = malloc(n + 1);
  if (!s) return rerr(r, FB_ENOMEM, "out of memory");
  memcpy(s, p, n);
  s[n] = 0;
  char *q = s + ml, *end;
  long nk = strtol(q, &end, 10);
  int rc = 0;
  if (end == q || *end != '\n' || nk < 0 || (uint64_t)nk != nkernels) rc = FB_EINVAL;
  q = end + 1;
  for (long i = 0; !rc && i < nk; i++) {
    int np, ret, used = 0;
    char *nl = strchr(q, '\n');
    if (!nl || sscanf(q, "%d %d %n", &np, &ret, &used) != 2 || !used) {
      rc = FB_EINVAL;
      break;
    }
    *nl = 0;
    fb_kernel k;
    memset(&k, 0, sizeof k);
    k.name = q + used;
    k.nparams = np;
    k.ret = (fb_type)ret;
    if (strcmp(k.name, "-") && (rc = record_kernel(r, (int)i, &k, NULL))) break;
    q = nl + 1;
  }
  size_t fl = 0, sl = 0;
  int used = 0;
  if (!rc && (sscanf(q, "%zu %zu\n%n", &fl, &sl, &used) != 2 || !used ||
              (size_t)(q + used - s) + fl + sl != n))
    rc = FB_EINVAL;
  if (rc == FB_EINVAL) rerr(r, rc, "%s", bad);
  if (!rc && sl) { /* the program, parsed again: fields and kernels by name */
    q += used;
    char *fn = strndup(q, fl), *src = strndup(q + fl, sl);
    fb_diags d;
    fb_diags_init(&d);
    if (!fn || !src) rc = rerr(r, FB_ENOMEM, "out of memory");
    else if ((rc = fb_program_parse(fl ? fn : "<source>", src, &r->prog, &d)))
      rerr(r, rc, "Restore: the checkpoint's program does not parse here");
    else r->own_prog = 1;
    fb_diags_free(&d);
    free(fn);
    free(src);
  }
  free(s);
  return rc;
}

/* Chunks of a Checkpoint or FetchCheckpoint call into fd (at their
 * offsets, in order); the name the server gave into name. */
static int recv_chunks(fb_remote *r, grpc_call *call, int fd, char *name, size_t namelen,
                       const char *what) {
  int tag, rc = 0, ok = 1;
  uint64_t off = 0;
  while (ok > 0 && !rc) {
    grpc_byte_buffer *bb = NULL;
    grpc_op op;
    memset(&op, 0, sizeof op);
    op.op = GRPC_OP_RECV_MESSAGE;
    op.data.recv_message.recv_message = &bb;
    ok = fbc_batch(r->c, call, &op, 1, &tag);
    if (ok <= 0 || !bb) break;
    grpc_byte_buffer_reader rd;
    grpc_slice sl = grpc_empty_slice();
    if (grpc_byte_buffer_reader_init(&rd, bb)) {
      sl = grpc_byte_buffer_reader_readall(&rd);
      grpc_byte_buffer_reader_destroy(&rd);
    }
    grpc_byte_buffer_destroy(bb);
    Fusebox__V1__CheckpointChunk *m = fusebox__v1__checkpoint_chunk__unpack(
        NULL, GRPC_SLICE_LENGTH(sl), GRPC_SLICE_START_PTR(sl));
    grpc_slice_unref(sl);
    if (!m) {
      rc = rerr(r, FB_EINTERNAL, "%s: a malformed chunk", what);
      break;
    }
    if (m->name[0] && name) snprintf(name, namelen, "%s", m->name);
    if (m->data.len && (fd < 0 || m->offset != off)) {
      rc = rerr(r, FB_EINTERNAL, "%s: a chunk at %llu, expected %llu", what,
                (unsigned long long)m->offset, (unsigned long long)off);
    }
    for (size_t k = 0; !rc && k < m->data.len;) {
      ssize_t w = write(fd, m->data.data + k, m->data.len - k);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) rc = rerr(r, FB_EIO, "%s: cannot write the file: %s", what, strerror(errno));
      else k += (size_t)w;
    }
    off += m->data.len;
    fusebox__v1__checkpoint_chunk__free_unpacked(m, NULL);
  }
  return rc;
}

/* A file at path, whole or not at all: a temporary twin, fsync, rename. */
static int tmp_open(fb_remote *r, const char *path, char *tmp, size_t n) {
  snprintf(tmp, n, "%s.tmp-XXXXXX", path);
  int fd = mkstemp(tmp);
  if (fd < 0) return rerr(r, FB_EIO, "checkpoint: cannot create %s: %s", tmp, strerror(errno));
  return fd;
}

static int tmp_commit(fb_remote *r, int fd, const char *tmp, const char *path, int rc) {
  if (!rc && fsync(fd)) rc = rerr(r, FB_EIO, "checkpoint: %s: %s", path, strerror(errno));
  if (close(fd) && !rc) rc = rerr(r, FB_EIO, "checkpoint: %s: %s", path, strerror(errno));
  if (!rc && rename(tmp, path)) rc = rerr(r, FB_EIO, "checkpoint: %s: %s", path, strerror(errno));
  if (rc) unlink(tmp);
  return rc;
}

static int checkpoint_once(fb_remote *r, const char *path, char *name, size_t namelen);

/* A Checkpoint call that failed because the drain ended the session after
 * its grace (the stream's status, come meanwhile, says so): the session
 * resumed elsewhere, the checkpoint is taken there. */
int fb_remote_checkpoint(fb_remote *r, const char *path, char *name, size_t namelen) {
  if (!r) return FB_EINVAL;
  int rc = checkpoint_once(r, path, name, namelen);
  if (!rc || r->moving) return rc;
  if (!strstr(r->err, CKPT_MARK)) {
    peek_end_now(r, 1);
    if (!r->broken) return rc;
    char why[FBC_ERRLEN];
    snprintf(why, sizeof why, "%s", r->err);
    stream_broken(r); /* the stream's end into r->err */
    if (!strstr(r->err, CKPT_MARK)) { /* not a drain's: the call's own error stands */
      snprintf(r->err, sizeof r->err, "%s", why);
      return rc;
    }
  } else if (strstr(r->err, " on another replica")) {
    return rc; /* a resume was tried (resume_ended said why it failed) */
  }
  if (resume_ended(r, rc)) return rc;
  return checkpoint_once(r, path, name, namelen);
}

static int checkpoint_once(fb_remote *r, const char *path, char *name, size_t namelen) {
  if (!path && (!name || !namelen))
    return rerr(r, FB_EINVAL, "checkpoint: give a file, or room for the server's name");
  int rc = fb_remote_sync(r, NULL); /* what was launched runs first */
  if (rc) return rc;
  peek_end(r); /* (a status come while the caller was stopped, say) */
  if (r->broken) return stream_broken(r);
  size_t ns = 0;
  char *st = state_of(r, &ns);
  if (!st) return rerr(r, FB_ENOMEM, "out of memory");
  Fusebox__V1__CheckpointRequest req = FUSEBOX__V1__CHECKPOINT_REQUEST__INIT;
  req.session_id = r->id;
  req.to_server = path == NULL;
  req.client_state.data = (uint8_t *)st;
  req.client_state.len = ns;
  req.chunk_bytes = (uint32_t)r->c->chunk;
  size_t len = fusebox__v1__checkpoint_request__get_packed_size(&req);
  uint8_t *buf = malloc(len ? len : 1);
  if (!buf) {
    free(st);
    return rerr(r, FB_ENOMEM, "out of memory");
  }
  grpc_byte_buffer *rq = fbp_bb_from(buf, fusebox__v1__checkpoint_request__pack(&req, buf));
  free(buf);
  free(st);
  char tmp[4200];
  int fd = -1;
  if (path && (fd = tmp_open(r, path, tmp, sizeof tmp)) < 0) {
    grpc_byte_buffer_destroy(rq);
    return FB_EIO;
  }
  grpc_call *call = fbc_call_new(r->c, "/fusebox.v1.Fusebox/Checkpoint", 0);
  fbc_end e;
  fbc_end_init(&e);
  int stag, tag;
  if (fbc_start_status(call, &e, &stag)) {
    grpc_byte_buffer_destroy(rq);
    if (fd >= 0) tmp_commit(r, fd, tmp, path, FB_EINTERNAL);
    return rerr(r, FB_EINTERNAL, "cannot start Checkpoint");
  }
  grpc_metadata_array md;
  grpc_metadata_array_init(&md);
  grpc_op ops[4];
  memset(ops, 0, sizeof ops);
  grpc_metadata rmd[2];
  fbc_initial_md_route(r->c, &ops[0], rmd, &r->rt);
  ops[1].op = GRPC_OP_SEND_MESSAGE;
  ops[1].data.send_message.send_message = rq;
  ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
  ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
  ops[3].data.recv_initial_metadata.recv_initial_metadata = &md;
  char got[128] = "";
  rc = fbc_batch(r->c, call, ops, 4, &tag) > 0
           ? recv_chunks(r, call, fd, got, sizeof got, "checkpoint")
           : 0;
  grpc_byte_buffer_destroy(rq);
  grpc_metadata_array_destroy(&md);
  if (rc) grpc_call_cancel(call, NULL);
  rc = end_call(r, call, &e, &stag, rc, "checkpoint");
  if (!rc && !path && !got[0]) rc = rerr(r, FB_EINTERNAL, "checkpoint: the server named none");
  if (!rc && !path) snprintf(name, namelen, "%s", got);
  if (fd >= 0) rc = tmp_commit(r, fd, tmp, path, rc);
  return rc;
}

static int restore(fb_client *c, const fb_remote_options *opt, const char *path,
                   const char *name, int stream, fb_remote **out);
/* Restore's CheckpointChunk: the options on the first, the name (a
 * restore by name sends only that), the offset; the data field last. */
typedef struct restore_head {
  uint64_t memory_limit;
  const char *name;
} restore_head;

static size_t restore_chunk_head(void *ctx, uint8_t *out, size_t off, size_t n) {
  restore_head *h = ctx;
  Fusebox__V1__CheckpointChunk m = FUSEBOX__V1__CHECKPOINT_CHUNK__INIT;
  Fusebox__V1__SessionOptions o = FUSEBOX__V1__SESSION_OPTIONS__INIT;
  o.memory_limit = h->memory_limit;
  if (!off) m.options = &o;
  if (h->name) m.name = (char *)h->name;
  m.offset = off;
  if (fusebox__v1__checkpoint_chunk__get_packed_size(&m) + 12 > CHUNK_HEAD_MAX) return 0;
  size_t k = fusebox__v1__checkpoint_chunk__pack(&m, out);
  if (!n) return k;
  out[k++] = (3 << 3) | 2; /* data: field 3, length-delimited */
  for (uint64_t v = n;; v >>= 7) {
    out[k++] = (uint8_t)((v & 0x7f) | (v > 0x7f ? 0x80 : 0));
    if (v <= 0x7f) break;
  }
  return k;
}

int fb_remote_restore(fb_client *c, const fb_remote_options *opt, const char *path,
                      const char *name, fb_remote **out) {
  return restore(c, opt, path, name, 1, out);
}

/* Make n (just restored, no stream yet) the session r goes on as: its id,
 * client and routing; r's kernel table, layout and program stay (the
 * checkpoint kept the kernel ids: nothing is registered again). r's old
 * stream is cancelled and waited for. Launch numbers go on from seq_base
 * (set by the caller); the stream opens on the new session, and a sync on
 * it gives the counters the new replica starts from (cat). */
static int adopt(fb_remote *r, fb_remote *n) {
  if (!r->broken) {
    r->broken = 1;
    grpc_call_cancel(r->call, NULL);
  }
  char err[FBC_ERRLEN];
  snprintf(err, sizeof err, "%s", r->err);
  stream_broken(r); /* waits for the old stream's sends and status */
  snprintf(r->err, sizeof r->err, "%s", err);
  grpc_call_unref(r->call);
  r->call = NULL;
  grpc_metadata_array_destroy(&r->init_md);
  grpc_metadata_array_init(&r->init_md);
  fbc_end_free(&r->end);
  fbc_end_init(&r->end);
  r->md_sent = r->md_recvd = r->send_pending = r->broken = r->closed = 0;
  atomic_store(&r->sent_seq, 0);
  r->c = n->c;
  snprintf(r->id, sizeof r->id, "%s", n->id);
  r->rt = n->rt;
  r->rt.session = r->id;
  remote_free(n);
  r->moves++;
  /* counters: what the caller saw so far is the base, the new replica's
     own count on (its launches: the checkpoint's, read by the probe) */
  r->cbase = r->counters;
  r->cont = 0;
  fbp_buf held = r->out; /* launches not sent yet wait for the probe */
  int nq = r->nqueued;
  memset(&r->out, 0, sizeof r->out);
  r->nqueued = 0;
  r->nokeep++;
  int rc = stream_open(r);
  uint64_t id = ++r->next_sync;
  if (!rc) {
    fbp_session_tail(&r->out, NULL, 0, id);
    rc = stream_send(r);
  }
  if (!rc) {
    /* recv_sync, without merging: results the caller has not taken stay */
    for (;;) {
      if (recv_next(r) <= 0 || !r->recv_bb) {
        rc = stream_broken(r);
        break;
      }
      grpc_slice sl = fbp_bb_slice(r->recv_bb);
      grpc_byte_buffer_destroy(r->recv_bb);
      r->recv_bb = NULL;
      Fusebox__V1__SessionResponse *m = fusebox__v1__session_response__unpack(
          NULL, GRPC_SLICE_LENGTH(sl), GRPC_SLICE_START_PTR(sl));
      grpc_slice_unref(sl);
      if (!m) {
        rc = rerr(r, FB_EINTERNAL, "malformed SessionResponse from the server");
        break;
      }
      int mine = m->sync && m->sync->sync_id == id;
      if (mine) fbp_counters_from_pb(m->sync->counters, &r->cat);
      fusebox__v1__session_response__free_unpacked(m, NULL);
      if (mine) break;
    }
  }
  if (!rc) rc = wait_send(r);
  r->nokeep--;
  fbp_buf_free(&r->out);
  r->out = held;
  r->nqueued = nq;
  r->raw = r->cat;
  r->cont = 1;
  counters_continue(r, &r->cat);
  return rc;
}

/* The session's replica drains (its notice on the stream, or fusebox-draining
 * on an answer): at a quiet point (everything sent answered and handed to
 * the caller, no tape mark pending) it moves. A checkpoint into a temporary
 * file here, a restore on the next address of the list (one address: a
 * proxy, with a new routing key), the old session closed, the stream opened
 * on the new one; the kernel table and layout stay. A move that cannot be
 * made leaves the session where it is for the rest of the grace. */
static void maybe_move(fb_remote *r) {
  if (!r->rt.draining || r->moving || r->broken || r->marks) return;
  r->moving = 1;
  int rc = do_sync(r, 0);
  if (rc || ((r->nrets || r->nerrs) && !r->delivered)) { /* the caller's next sync first */
    r->moving = 0;
    return;
  }
  r->rt.draining = 0;
  const char *td = getenv("TMPDIR");
  char path[4096];
  snprintf(path, sizeof path, "%s/fusebox-move-XXXXXX", td && *td ? td : "/tmp");
  int fd = mkstemp(path);
  rc = fd < 0 ? FB_EIO : fb_remote_checkpoint(r, path, NULL, 0);
  if (fd >= 0) close(fd);
  fb_client *to = fbc_next_address(r->c), *from = r->c;
  int tries = to ? r->c->head->npeers - 1 : CREATE_TRIES;
  fb_remote *n = NULL;
  for (int i = 0; !rc && i < tries; i++) {
    fb_client *c = to ? to : r->c;
    if (restore(c, NULL, path, NULL, 0, &n) == 0) break;
    snprintf(r->err, sizeof r->err, "%s", c->err);
    if (to) to = fbc_next_address(to);
  }
  if (fd >= 0) unlink(path);
  if (!n) { /* (r->err says why) */
    r->moving = 0;
    return;
  }
  /* the old session ends there (its replica's drain ends sooner) */
  Fusebox__V1__CloseSessionRequest cr = FUSEBOX__V1__CLOSE_SESSION_REQUEST__INIT;
  cr.session_id = r->id;
  grpc_slice s = grpc_empty_slice();
  char err[256];
  fbc_unary_route(from, &r->rt, "/fusebox.v1.Fusebox/CloseSession", &cr.base, &s, err, sizeof err);
  grpc_slice_unref(s);
  /* everything was answered: the new stream's launch 1 is the next one */
  r->seq_base = r->seq;
  r->done_seq = (uint64_t)r->seq;
  kept_clear(r);
  r->err[0] = 0;
  if (adopt(r, n) != 0) r->broken = 1; /* the next call reports it */
  else r->err[0] = 0;
  r->moving = 0;
}

/* rc is a call's failure. When r->err is a drain's reason naming the
 * checkpoint it wrote after the grace (the replicas share --checkpoint-dir
 * and the key), the session is restored by that name on the next address
 * of the list (one address: a proxy, with a new routing key) and what the
 * old replica had not run (the kept messages after those the checkpoint
 * holds) is sent again: 0 then. Otherwise rc, with r->err saying why the
 * session was not resumed. */
static int resume_ended(fb_remote *r, int rc) {
  const char *p = rc ? strstr(r->err, CKPT_MARK) : NULL;
  if (!p || r->moving) return rc;
  char name[128] = "";
  p += strlen(CKPT_MARK);
  size_t nl = strcspn(p, " );");
  if (nl == 0 || nl >= sizeof name) return rc;
  memcpy(name, p, nl);
  char why[FBC_ERRLEN];
  snprintf(why, sizeof why, "%s", r->err);
  if (r->kept_over || r->marks) {
    return rerr(r, rc, "%s; not resumed on another replica by itself: %s", why,
                r->marks ? "a tape was being recorded"
                         : "more than 64 MiB of launches were sent after the last sync");
  }
  r->moving = 1;
  if (!r->closed) stream_broken(r); /* (its status: the drain's reason) */
  fb_client *to = fbc_next_address(r->c);
  int tries = to ? r->c->head->npeers - 1 : CREATE_TRIES;
  fb_remote *n = NULL;
  char last[FBC_ERRLEN] = "no other address";
  for (int i = 0; i < tries; i++) {
    fb_client *c = to ? to : r->c;
    if (restore(c, NULL, NULL, name, 0, &n) == 0) break;
    snprintf(last, sizeof last, "%s", c->err);
    if (to) to = fbc_next_address(to);
  }
  if (!n) {
    r->moving = 0;
    return rerr(r, rc, "%s; resuming it from that checkpoint on another replica failed: %s", why,
                last);
  }
  int64_t ran_before = (int64_t)r->raw.launches; /* at the last answered sync */
  snprintf(r->err, sizeof r->err, "%s", why);
  int arc = adopt(r, n);
  if (arc) {
    r->moving = 0;
    r->broken = 1;
    return arc;
  }
  /* the checkpoint holds the launches up to some message of those kept */
  int64_t k = (int64_t)r->cat.launches - ran_before, acc = 0, total = 0;
  int j = 0;
  while (j < r->nkm && acc < k) acc += r->km[j++].nl;
  for (int i = 0; i < r->nkm; i++) total += r->km[i].nl;
  if (acc != k) {
    r->moving = 0;
    rc = rerr(r, FB_EIO,
              "session %.8s: its replica drained and checkpointed it as %s, which holds %lld of "
              "the %lld launches sent after the last sync: it cannot continue exactly (restore "
              "that checkpoint by name with fb_remote_restore and repeat the launches yourself)",
              r->id, name, (long long)k, (long long)total);
    Fusebox__V1__CloseSessionRequest cr = FUSEBOX__V1__CLOSE_SESSION_REQUEST__INIT;
    cr.session_id = r->id; /* (the one just restored: it goes, the checkpoint stays) */
    grpc_slice s = grpc_empty_slice();
    char err[256];
    fbc_unary_route(r->c, &r->rt, "/fusebox.v1.Fusebox/CloseSession", &cr.base, &s, err,
                    sizeof err);
    grpc_slice_unref(s);
    r->broken = 1;
    grpc_call_cancel(r->call, NULL);
    return rc;
  }
  /* launch numbers: the new stream's 1 is the first launch sent again (or
     the first not sent yet) */
  int64_t rep = total - acc;
  r->seq_base = r->seq - r->nqueued - rep;
  r->done_seq = (uint64_t)(r->seq - r->nqueued - rep);
  size_t off = 0;
  for (int i = 0; i < j; i++) off += r->km[i].len;
  uint8_t *again = r->kept;
  struct kmsg *am = r->km;
  int na = r->nkm;
  r->kept = NULL;
  r->km = NULL;
  r->kn = r->kbcap = 0;
  r->nkm = r->kmcap = 0;
  fbp_buf held = r->out;
  int nq = r->nqueued;
  memset(&r->out, 0, sizeof r->out);
  rc = 0;
  for (int i = j; i < na && !rc; i++) {
    if (fbp_buf_reserve(&r->out, am[i].len)) {
      rc = rerr(r, FB_ENOMEM, "out of memory");
      break;
    }
    memcpy(r->out.p, again + off, am[i].len);
    r->out.n = am[i].len;
    r->nqueued = am[i].nl;
    off += am[i].len;
    rc = stream_send(r); /* kept again, until a sync answers it */
  }
  fbp_buf_free(&r->out);
  r->out = held;
  r->nqueued = nq;
  free(again);
  free(am);
  r->rt.draining = 0;
  r->moving = 0;
  if (!rc) r->err[0] = 0;
  return rc;
}

static int restore(fb_client *c, const fb_remote_options *opt, const char *path,
                   const char *name, int stream, fb_remote **out) {
  *out = NULL;
  if (!path == !name) {
    fb_errf(c->err, sizeof c->err, "restore: give a checkpoint file or a server-side name");
    return FB_EINVAL;
  }
  fb_remote *r = calloc(1, sizeof *r);
  if (!r) return FB_ENOMEM;
  r->c = c;
  grpc_metadata_array_init(&r->init_md);
  fbc_end_init(&r->end);
  fbc_learn_limits(c);
  uint8_t *data = NULL;
  size_t dlen = 0;
  int rc = fbc_route_init(&r->rt) ? rerr(r, FB_EIO, "cannot read /dev/urandom for a routing key") : 0;
  if (path) { /* the file, read whole: it goes out in chunks of it */
    FILE *f = fopen(path, "rb");
    if (!f) {
      rc = rerr(r, FB_ENOENT, "restore: %s: %s", path, strerror(errno));
    } else {
      for (size_t cap = 0;;) {
        if (dlen == cap) {
          cap = cap ? cap * 2 : (size_t)1 << 20;
          uint8_t *p = realloc(data, cap);
          if (!p) {
            rc = rerr(r, FB_ENOMEM, "out of memory");
            break;
          }
          data = p;
        }
        size_t got = fread(data + dlen, 1, cap - dlen, f);
        dlen += got;
        if (!got) break;
      }
      if (!rc && ferror(f)) rc = rerr(r, FB_EIO, "restore: %s: %s", path, strerror(errno));
      fclose(f);
    }
  }
  grpc_call *call = NULL;
  fbc_end e;
  fbc_end_init(&e);
  int stag = 0, tag;
  if (!rc) {
    call = fbc_call_new(c, "/fusebox.v1.Fusebox/Restore", 0);
    if (fbc_start_status(call, &e, &stag)) rc = rerr(r, FB_EINTERNAL, "cannot start Restore");
  }
  restore_head rh = {opt ? opt->memory_limit : 0, name};
  lent l;
  atomic_init(&l.out, 0);
  if (!rc && name && strlen(name) > CHUNK_HEAD_MAX / 2)
    rc = rerr(r, FB_EINVAL, "restore: a checkpoint name of %zu bytes; the server's names are "
              "much shorter (like 0123abcd-1700000000000001.fbck)", strlen(name));
  /* a send the server cut short (it refused the upload) is named by the
     call's status below */
  if (!rc) send_chunks(r, call, data, name ? 0 : dlen, 1, restore_chunk_head, &rh, &l);
  Fusebox__V1__RestoreResponse *resp = NULL;
  if (call && !rc) {
    grpc_metadata_array md;
    grpc_metadata_array_init(&md);
    grpc_byte_buffer *rbb = NULL;
    grpc_op ops[3];
    memset(ops, 0, sizeof ops);
    ops[0].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
    ops[1].op = GRPC_OP_RECV_INITIAL_METADATA;
    ops[1].data.recv_initial_metadata.recv_initial_metadata = &md;
    ops[2].op = GRPC_OP_RECV_MESSAGE;
    ops[2].data.recv_message.recv_message = &rbb;
    if (fbc_batch(c, call, ops, 3, &tag) > 0) fbc_route_replica(&r->rt, &md);
    if (rbb) {
      grpc_byte_buffer_reader rd;
      if (grpc_byte_buffer_reader_init(&rd, rbb)) {
        grpc_slice sl = grpc_byte_buffer_reader_readall(&rd);
        grpc_byte_buffer_reader_destroy(&rd);
        resp = fusebox__v1__restore_response__unpack(NULL, GRPC_SLICE_LENGTH(sl),
                                                     GRPC_SLICE_START_PTR(sl));
        grpc_slice_unref(sl);
      }
      grpc_byte_buffer_destroy(rbb);
    }
    grpc_metadata_array_destroy(&md);
  }
  if (call) rc = end_call(r, call, &e, &stag, rc, "restore");
  else fbc_end_free(&e);
  wait_lent(&l);
  free(data);
  if (!rc && (!resp || !resp->layout || strlen(resp->session_id) >= sizeof r->id))
    rc = rerr(r, FB_EINTERNAL, "restore: a malformed answer");
  if (!rc) {
    snprintf(r->id, sizeof r->id, "%s", resp->session_id);
    char why[512];
    if (fbp_layout_from_pb(resp->layout, &r->layout, why, sizeof why))
      rc = rerr(r, FB_EINTERNAL, "restore: the server's layout: %s", why);
  }
  /* (a move keeps its own kernel table: the drain's checkpoint, written by
     the server, has none of this side's state) */
  if (!rc && (stream || resp->client_state.len))
    rc = state_into(r, resp->client_state.data, resp->client_state.len, resp->kernels);
  if (resp) fusebox__v1__restore_response__free_unpacked(resp, NULL);
  if (!rc && stream) rc = stream_open(r);
  if (rc) {
    /* a session the server made but this side cannot use goes too */
    if (r->id[0] && !r->call) {
      Fusebox__V1__CloseSessionRequest cr = FUSEBOX__V1__CLOSE_SESSION_REQUEST__INIT;
      cr.session_id = r->id;
      grpc_slice s = grpc_empty_slice();
      char err[256];
      fbc_unary_route(c, &r->rt, "/fusebox.v1.Fusebox/CloseSession", &cr.base, &s, err,
                      sizeof err);
      grpc_slice_unref(s);
    }
    fb_errf(c->err, sizeof c->err, "%s", r->err);
    remote_free(r);
    return rc;
  }
  *out = r;
  return 0;
}
