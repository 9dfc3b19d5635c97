/* The engine side of a session: the jobs it runs against its fb_session,
 * in the order they were received: create the engine session, register
 * kernels, run launch batches (recording each failed launch and each
 * return value under its sequence number) and answer syncs, write and read
 * fields, close. Each job ends in a reply (server.h) that the broker turns
 * into messages and a status; nothing here touches a gRPC call, so the same
 * code runs in fuseboxd's session thread (thread isolation) and in a
 * session's worker process (process isolation). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "server/server.h"

#define MAX_ERRS FBD_SYNC_MAX_ERRS
#define MAX_RETS FBD_SYNC_MAX_RETS
#define STACK_ARGS 16

/* ---------------------------------------------------------------- replies */

static void reply_finish(fbd_reply *r, int code, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

static void reply_finish(fbd_reply *r, int code, const char *fmt, ...) {
  r->code = code;
  r->finish = 1;
  r->msg[0] = 0;
  if (fmt) {
    va_list ap;
    va_start(ap, fmt);
    fb_verrf(r->msg, sizeof r->msg, fmt, ap);
    va_end(ap);
  }
}

/* Pack m as the reply's message; FB_ENOMEM finishes the reply. */
static int reply_msg(fbd_reply *r, const ProtobufCMessage *m) {
  size_t n = protobuf_c_message_get_packed_size(m);
  free(r->pb);
  r->pb = malloc(n ? n : 1);
  r->pblen = 0;
  if (!r->pb) {
    reply_finish(r, FB_ENOMEM, "out of memory packing a %s", m->descriptor->name);
    return FB_ENOMEM;
  }
  r->pblen = protobuf_c_message_pack(m, r->pb);
  return 0;
}

void fbd_reply_clear(fbd_reply *r) {
  free(r->pb);
  memset(r, 0, sizeof *r);
}

/* ---------------------------------------------------------------- the watch */

/* The coarse clock: a task's start needs no better than a few
 * milliseconds, and the precise clock costs hundreds of nanoseconds per
 * call on some VMs, which a stream of tiny launches would feel. */
static uint64_t now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC_COARSE, &t);
  return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

/* name into a watch slot, unless it is there already (the common case: the
 * same kernel launched again) */
static void note_name(char *slot, size_t n, const char *name) {
  if (strncmp(slot, name, n - 1) == 0) return;
  size_t len = strnlen(name, n - 1);
  memcpy(slot, name, len);
  slot[len] = 0;
}

/* The engine's task hook: note what runs (for kernel_timeout_s), wait while
 * the scheduler holds the session, and cancel at this task boundary when
 * the broker asked to. */
static int watch_hook(void *user, const char *kernel, const char *task, uint64_t launch) {
  fbd_watch *w = user;
  (void)launch;
  if (!kernel) {
    atomic_store_explicit(&w->started_ns, 0, memory_order_release);
    return 0;
  }
  /* the fair scheduler holds this tenant back: wait here, between tasks,
   * until it lets go (or the work is cancelled) */
  while (atomic_load_explicit(&w->hold, memory_order_acquire) &&
         !atomic_load_explicit(&w->cancel, memory_order_acquire)) {
    struct timespec d = {0, 200000};
    nanosleep(&d, NULL);
  }
  if (atomic_load_explicit(&w->cancel, memory_order_acquire)) return 1;
  note_name(w->kernel, sizeof w->kernel, kernel);
  note_name(w->task, sizeof w->task, task ? task : kernel);
  atomic_store_explicit(&w->started_ns, now_ns(), memory_order_release);
  return 0;
}

/* ---------------------------------------------------------------- create */

/* Name the largest fields, so that an over-quota refusal says what is big. */
static void largest_fields(const fb_layout *l, char *out, size_t n) {
  int best[3] = {-1, -1, -1};
  uint64_t size[3] = {0, 0, 0};
  for (int i = 0; i < l->nnodes; i++) {
    uint64_t b;
    if (fbd_field_bytes(l, i, &b, NULL, 0)) continue;
    for (int k = 0; k < 3; k++) {
      if (best[k] >= 0 && b <= size[k]) continue;
      for (int m = 2; m > k; m--) best[m] = best[m - 1], size[m] = size[m - 1];
      best[k] = i;
      size[k] = b;
      break;
    }
  }
  size_t used = (size_t)snprintf(out, n, "; largest fields:");
  for (int k = 0; k < 3 && best[k] >= 0 && used < n; k++)
    used += (size_t)snprintf(out + used, n - used, "%s '%s' (%llu bytes)", k ? "," : "",
                             l->nodes[best[k]].name, (unsigned long long)size[k]);
}

static void run_create(fbd_exec *x, fbd_reply *r) {
  char err[FBD_ERRLEN] = "", extra[512] = "";
  int rc = fb_session_create(x->engine, &x->ecfg, x->layout, &x->es, err, sizeof err);
  if (rc) {
    if (rc == FB_EQUOTA) largest_fields(x->layout, extra, sizeof extra);
    reply_finish(r, rc, "%s%s", err[0] ? err : fb_strerror(rc), extra);
    r->fatal = 1;
    return;
  }
  if (x->watch) fb_session_set_task_hook(x->es, watch_hook, x->watch);
  reply_finish(r, FB_OK, NULL);
}

/* ---------------------------------------------------------------- kernels */

static int register_one(fbd_exec *x, const Fusebox__V1__Kernel *m, size_t i, size_t n, int *id,
                        char *err, size_t errlen) {
  fb_kernel *k = NULL;
  char why[FBD_ERRLEN - 128];
  int rc = fbp_kernel_from_pb(m, x->layout, &k, why, sizeof why);
  if (rc) {
    fb_errf(err, errlen, "kernel %zu of %zu: %s", i + 1, n, why);
    return rc;
  }
  rc = fb_session_add_kernel(x->es, k);
  fb_kernel_free(k);
  if (rc < 0) {
    fb_errf(err, errlen, "%s", fb_session_errmsg(x->es));
    return rc;
  }
  *id = rc;
  return 0;
}

/* How long a parse may take here: a little less than compile_timeout_s,
 * so that a parse past it ends with its own error (and the session lives
 * on) before the broker stops the whole job. */
static double parse_time(const fbd_exec *x) {
  double t = x->parse_timeout_s;
  return t <= 0 ? 0 : t > 2 ? t - 1 : t / 2;
}

static void run_register(fbd_exec *x, const Fusebox__V1__RegisterKernelsRequest *m, fbd_reply *r) {
  char err[FBD_ERRLEN];
  /* a source's kernels, parsed here: in the tenant's worker (or session
   * thread), within the parse's budget */
  fbp_arena a;
  fbp_arena_init(&a);
  Fusebox__V1__Kernel **ks;
  size_t n;
  fbd_parse_limits pl;
  fbd_parse_limits_init(&pl, parse_time(x), x->watch ? &x->watch->cancel : NULL, x->gone);
  int rc = fbd_source_expand(m, x->layout, &pl, &a, &ks, &n, err, sizeof err);
  int64_t left = x->watch ? atomic_load(&x->watch->kernels_left) : -1;
  if (!rc && left >= 0 && n > (uint64_t)left) {
    size_t first = (size_t)left;
    rc = FB_EQUOTA;
    fb_errf(err, sizeof err,
            "RegisterKernels: kernel '%s' would be past the kernels the session may still "
            "register (%lld more; max_kernels_per_session; registering a name again adds a "
            "kernel): this request adds %zu",
            first < n && ks[first]->name ? ks[first]->name : "?", (long long)left, n);
  }
  int32_t *ids = rc ? NULL : calloc(n + m->n_adjoints + m->n_tangents + 1, sizeof *ids);
  if (!rc && !ids) rc = FB_ENOMEM, fb_errf(err, sizeof err, "out of memory");
  if (rc) {
    reply_finish(r, rc, "%s", err);
    fbp_arena_free(&a);
    return;
  }
  /* the memory budget's room for the session's kernels (budget.c) */
  if (x->watch) fb_session_set_kernel_cap(x->es, atomic_load(&x->watch->kernel_cap));
  int before = fb_session_kernel_count(x->es); /* the tape's kernels included */
  for (size_t i = 0; i < n; i++) {
    int id = -1;
    rc = register_one(x, ks[i], i, n, &id, err, sizeof err);
    if (rc) {
      if (x->log) fbd_logf(x->log, FBD_LOG_INFO, "session %s: kernel refused: %s", x->tag, err);
      /* a refused request registers nothing: its client never learns the
       * ids of those before the refusal, which would hold memory for good */
      fb_session_drop_kernels(x->es, before);
      x->nkernels = before;
      reply_finish(r, rc, "%s", err);
      free(ids);
      fbp_arena_free(&a);
      return;
    }
    x->nkernels = id + 1;
    ids[i] = id;
    if (x->log)
      fbd_logf(x->log, FBD_LOG_DEBUG, "session %s: kernel '%s' registered as %d", x->tag,
               ks[i]->name, id);
  }
  /* custom gradients: after the kernels above, before their adjoints are
   * asked for; -1 - i names this request's i-th kernel */
  int32_t *fresh = m->n_custom_adjoints ? calloc(m->n_custom_adjoints, sizeof *fresh) : NULL;
  size_t nfresh = 0; /* earlier kernels this request bound anew */
  if (m->n_custom_adjoints && !fresh) rc = FB_ENOMEM, fb_errf(err, sizeof err, "out of memory");
  for (size_t i = 0; !rc && i < m->n_custom_adjoints; i++) {
    const Fusebox__V1__CustomAdjoint *c = m->custom_adjoints[i];
    int32_t k = c ? c->kernel : INT32_MIN, g = c ? c->adjoint : INT32_MIN;
    if (k < 0) k = k >= -(int64_t)n ? ids[-1 - (int64_t)k] : INT32_MAX;
    if (g < 0) g = g >= -(int64_t)n ? ids[-1 - (int64_t)g] : INT32_MAX;
    int had = fb_session_custom_adjoint(x->es, k) >= 0;
    rc = fb_session_set_kernel_adjoint(x->es, k, g);
    if (rc)
      fb_errf(err, sizeof err, "custom adjoint %zu of %zu: %s", i + 1, m->n_custom_adjoints,
              fb_session_errmsg(x->es));
    else if (!had && k < before) fresh[nfresh++] = k;
  }
  if (rc) /* a refused request binds nothing either */
    for (size_t i = 0; i < nfresh; i++) fb_session_set_kernel_adjoint(x->es, fresh[i], -1);
  free(fresh);
  if (rc) {
    if (x->log)
      fbd_logf(x->log, FBD_LOG_INFO, "session %s: custom adjoint refused: %s", x->tag, err);
    fb_session_drop_kernels(x->es, before);
    x->nkernels = before;
    reply_finish(r, rc, "%s", err);
    free(ids);
    fbp_arena_free(&a);
    return;
  }
  /* adjoints (docs/autodiff.md): made here, in the tenant's worker, and
   * registered like the kernels above; once per kernel */
  for (size_t i = 0; i < m->n_adjoints; i++) {
    int id = -1;
    rc = fb_session_kernel_adjoint(x->es, m->adjoints[i], &id);
    if (rc) {
      fb_errf(err, sizeof err, "adjoint %zu of %zu: %s", i + 1, m->n_adjoints,
              fb_session_errmsg(x->es));
      if (x->log) fbd_logf(x->log, FBD_LOG_INFO, "session %s: adjoint refused: %s", x->tag, err);
      fb_session_drop_kernels(x->es, before);
      x->nkernels = before;
      reply_finish(r, rc, "%s", err);
      free(ids);
      fbp_arena_free(&a);
      return;
    }
    ids[n + i] = id;
  }
  /* tangents (forward mode): the same, after the adjoints */
  for (size_t i = 0; i < m->n_tangents; i++) {
    int id = -1;
    rc = fb_session_kernel_tangent(x->es, m->tangents[i], &id);
    if (rc) {
      fb_errf(err, sizeof err, "tangent %zu of %zu: %s", i + 1, m->n_tangents,
              fb_session_errmsg(x->es));
      if (x->log) fbd_logf(x->log, FBD_LOG_INFO, "session %s: tangent refused: %s", x->tag, err);
      fb_session_drop_kernels(x->es, before);
      x->nkernels = before;
      reply_finish(r, rc, "%s", err);
      free(ids);
      fbp_arena_free(&a);
      return;
    }
    ids[n + m->n_adjoints + i] = id;
  }
  int after = fb_session_kernel_count(x->es);
  x->nkernels = after;
  Fusebox__V1__RegisterKernelsResponse resp = FUSEBOX__V1__REGISTER_KERNELS_RESPONSE__INIT;
  resp.n_kernel_ids = n + m->n_adjoints + m->n_tangents;
  resp.kernel_ids = ids;
  if (!reply_msg(r, &resp.base)) reply_finish(r, FB_OK, NULL);
  r->registered = (uint32_t)(after - before);
  free(ids);
  fbp_arena_free(&a);
}

void fbd_exec_describe(fbd_exec *x, const uint8_t *bytes, size_t n, fbd_reply *r) {
  fbd_parse_limits pl;
  fbd_parse_limits_init(&pl, parse_time(x), x->watch ? &x->watch->cancel : NULL, x->gone);
  fbd_source_describe(bytes, n, &pl, r);
}

int fbd_exec_parse(fbd_exec *x, const uint8_t *bytes, size_t n, fb_layout **out, char *err,
                   size_t errlen) {
  *out = NULL;
  fbp_arena a;
  fbp_arena_init(&a);
  Fusebox__V1__CreateSessionRequest *m =
      (Fusebox__V1__CreateSessionRequest *)protobuf_c_message_unpack(
          &fusebox__v1__create_session_request__descriptor, &a.pb, n, bytes);
  int rc = FB_EINVAL;
  if (!m) {
    fb_errf(err, errlen, "malformed request: %zu bytes that are not a valid "
            "fusebox.v1.CreateSessionRequest", n);
  } else {
    fbd_parse_limits pl;
    fbd_parse_limits_init(&pl, parse_time(x), x->watch ? &x->watch->cancel : NULL, x->gone);
    rc = fbd_source_layout(m, &pl, out, err, errlen);
  }
  fbp_arena_free(&a);
  return rc;
}

/* ---------------------------------------------------------------- launches */

static void add_error(fbd_exec *x, uint64_t seq, int kernel, int code, const char *msg) {
  if (!x->errs) x->errs = calloc(MAX_ERRS, sizeof *x->errs);
  if (!x->errs || x->nerrs == MAX_ERRS) {
    x->errs_dropped++;
    return;
  }
  fbd_err *e = &x->errs[x->nerrs];
  /* under FBD_ERRLEN: the broker bounds a sync reply by it (bounds.c fbd_reply_cap) */
  if (!msg) msg = "";
  size_t n = strnlen(msg, FBD_ERRLEN - 1);
  if (!(e->msg = malloc(n + 1))) {
    x->errs_dropped++;
    return;
  }
  memcpy(e->msg, msg, n);
  e->msg[n] = 0;
  e->seq = seq;
  e->kernel = kernel;
  e->code = code;
  x->nerrs++;
}

static void add_return(fbd_exec *x, uint64_t seq, int kernel, fb_value v) {
  if (x->nrets == x->rcap) {
    int nc = x->rcap ? x->rcap * 2 : 64;
    fbd_ret *r = nc <= MAX_RETS ? realloc(x->rets, sizeof *r * (size_t)nc) : NULL;
    if (!r) {
      x->rets_dropped++;
      return;
    }
    x->rets = r;
    x->rcap = nc;
  }
  x->rets[x->nrets++] = (fbd_ret){seq, kernel, v};
}

/* Launch numbers: the engine numbers the launches it accepts from 0; ours
 * (seq) count every launch received from 1. They part where the engine
 * refused a launch outright; each such place is recorded, so that an error
 * the engine reports later by launch number finds its seq. */
static void seq_break(fbd_exec *x, uint64_t next_seq) {
  if (x->nsmap && x->smap[x->nsmap - 1].eng == x->eng_launches && !x->smap[x->nsmap - 1].one) {
    x->smap[x->nsmap - 1].seq = next_seq; /* the later entry would win anyway */
    return;
  }
  if (x->nsmap == x->smcap) {
    int nc = x->smcap ? x->smcap * 2 : 16;
    struct fbd_seqmap *v = nc <= (1 << 16) ? realloc(x->smap, sizeof *v * (size_t)nc) : NULL;
    if (!v) return; /* later errors may then name a nearby launch */
    x->smap = v;
    x->smcap = nc;
  }
  x->smap[x->nsmap++] = (struct fbd_seqmap){x->eng_launches, next_seq, 0};
}

static uint64_t seq_of(const fbd_exec *x, uint64_t launch) {
  uint64_t eng = 0, seq = 1;
  int one = 0;
  for (int i = 0; i < x->nsmap && x->smap[i].eng <= launch; i++) {
    eng = x->smap[i].eng;
    seq = x->smap[i].seq;
    one = x->smap[i].one;
  }
  return one ? seq : seq + (launch - eng);
}

/* An error the engine returned from a call that waits (sync, flush, host
 * access): about a background launch when it says so. */
static void engine_error(fbd_exec *x, int rc) {
  uint64_t launch = 0;
  int kernel = -1;
  if (fb_session_error_launch(x->es, &launch, &kernel) == 0)
    add_error(x, seq_of(x, launch), kernel, rc, fb_session_errmsg(x->es));
  else add_error(x, 0, -1, rc, fb_session_errmsg(x->es));
}

/* A tape mark (docs/autodiff.md): begin, or end, whose launches (clears,
 * seed, adjoints) have no seq of their own: their errors come with seq 0
 * (the message names the kernel). A mark's own error has seq 0 too, or the
 * seq of the recorded launch it blames. */
static void run_tape(fbd_exec *x, const Fusebox__V1__TapeMark *t) {
  uint64_t before = x->eng_launches;
  int rc = t->end ? fb_session_tape_end(x->es) : fb_session_tape_begin(x->es, t->loss);
  x->nkernels = fb_session_kernel_count(x->es); /* the adjoints and clears it made */
  fb_counters c;
  fb_session_counters(x->es, &c);
  if (c.launches > before) {
    seq_break(x, 0);
    if (x->nsmap && x->smap[x->nsmap - 1].eng == before) x->smap[x->nsmap - 1].one = 1;
    x->eng_launches = c.launches;
    seq_break(x, x->seq + 1);
  }
  if (!rc) return;
  uint64_t launch = 0;
  int kernel = -1;
  if (fb_session_error_launch(x->es, &launch, &kernel) == 0)
    add_error(x, seq_of(x, launch), kernel, rc, fb_session_errmsg(x->es)); /* the one to blame */
  else add_error(x, 0, -1, rc, fb_session_errmsg(x->es));
}

static void run_launch(fbd_exec *x, const Fusebox__V1__Launch *l) {
  uint64_t seq = ++x->seq;
  fb_value stack[STACK_ARGS], *args = stack;
  if (l->n_args > STACK_ARGS && !(args = malloc(sizeof *args * l->n_args))) {
    add_error(x, seq, l->kernel, FB_ENOMEM, "out of memory");
    seq_break(x, seq + 1);
    return;
  }
  for (size_t a = 0; a < l->n_args; a++) {
    if (!fbp_value_from_pb(l->args[a], &args[a])) continue;
    char msg[128];
    fb_errf(msg, sizeof msg, "argument %zu has no valid type (%d)", a, (int)l->args[a]->type);
    add_error(x, seq, l->kernel, FB_ETYPE, msg);
    seq_break(x, seq + 1);
    if (args != stack) free(args);
    return;
  }
  fb_value ret;
  memset(&ret, 0, sizeof ret);
  int rc = fb_launch(x->es, l->kernel, l->n_args ? args : NULL, (int)l->n_args, &ret);
  if (args != stack) free(args);
  if (!rc) {
    x->eng_launches++;
    if (ret.type != FB_T_VOID) add_return(x, seq, l->kernel, ret);
    return;
  }
  fb_counters c;
  fb_session_counters(x->es, &c);
  uint64_t launch = 0;
  int kernel = -1;
  if (c.launches > x->eng_launches) { /* it ran (or was queued) and failed */
    x->eng_launches = c.launches;
    if (fb_session_error_launch(x->es, &launch, &kernel) == 0 && seq_of(x, launch) != seq) {
      add_error(x, seq_of(x, launch), kernel, rc, fb_session_errmsg(x->es)); /* an earlier one */
      return;
    }
  } else {
    seq_break(x, seq + 1);
  }
  add_error(x, seq, l->kernel, rc, fb_session_errmsg(x->es));
}

/* The SyncResult: everything recorded since the last one. */
static void send_sync(fbd_exec *x, uint64_t id, fbd_reply *r) {
  fbp_arena arena, *a = &arena;
  fbp_arena_init(a);
  Fusebox__V1__SyncResult *sr = fbp_alloc(a, sizeof *sr);
  Fusebox__V1__Counters *c = fbp_alloc(a, sizeof *c);
  Fusebox__V1__LaunchReturn **rv = fbp_alloc(a, sizeof *rv * (size_t)(x->nrets + 1));
  Fusebox__V1__LaunchError **ev = fbp_alloc(a, sizeof *ev * (size_t)(x->nerrs + 1));
  Fusebox__V1__LaunchReturn *rs = fbp_alloc(a, sizeof *rs * (size_t)(x->nrets + 1));
  Fusebox__V1__Value *vs = fbp_alloc(a, sizeof *vs * (size_t)(x->nrets + 1));
  Fusebox__V1__LaunchError *es = fbp_alloc(a, sizeof *es * (size_t)(x->nerrs + 1));
  if (!sr || !c || !rv || !ev || !rs || !vs || !es) {
    reply_finish(r, FB_ENOMEM, "out of memory building a sync result");
    fbp_arena_free(a);
    return;
  }
  fusebox__v1__sync_result__init(sr);
  sr->sync_id = id;
  sr->seq = x->seq;
  for (int i = 0; i < x->nrets; i++) {
    fusebox__v1__launch_return__init(&rs[i]);
    rs[i].seq = x->rets[i].seq;
    rs[i].kernel = x->rets[i].kernel;
    fbp_value_to_pb(&vs[i], x->rets[i].v);
    rs[i].value = &vs[i];
    rv[i] = &rs[i];
  }
  for (int i = 0; i < x->nerrs; i++) {
    fusebox__v1__launch_error__init(&es[i]);
    es[i].seq = x->errs[i].seq;
    es[i].kernel = x->errs[i].kernel;
    es[i].code = x->errs[i].code;
    es[i].message = x->errs[i].msg;
    ev[i] = &es[i];
  }
  sr->n_returns = (size_t)x->nrets;
  sr->returns = rv;
  sr->n_errors = (size_t)x->nerrs;
  sr->errors = ev;
  sr->errors_dropped = x->errs_dropped;
  sr->returns_dropped = x->rets_dropped;
  fb_counters cn;
  fb_session_counters(x->es, &cn);
  fbp_counters_to_pb(c, &cn);
  sr->counters = c;
  Fusebox__V1__SessionResponse resp = FUSEBOX__V1__SESSION_RESPONSE__INIT;
  resp.sync = sr;
  reply_msg(r, &resp.base);
  fbp_arena_free(a);
  for (int i = 0; i < x->nerrs; i++) free(x->errs[i].msg);
  x->nerrs = 0;
  x->nrets = 0;
  x->errs_dropped = x->rets_dropped = 0;
}

static void run_batch(fbd_exec *x, const Fusebox__V1__SessionRequest *m, fbd_reply *r) {
  size_t t = 0;
  for (size_t i = 0; i < m->n_launches; i++) {
    while (t < m->n_tape && m->tape[t]->at <= i) run_tape(x, m->tape[t++]);
    run_launch(x, m->launches[i]);
  }
  while (t < m->n_tape) run_tape(x, m->tape[t++]);
  int rc = 0;
  if (m->sync) rc = fb_sync(x->es);
  else if (m->flush) rc = fb_flush(x->es);
  if (rc) engine_error(x, rc);
  if (m->sync) send_sync(x, m->sync, r);
}

/* ---------------------------------------------------------------- decoding */

uint64_t fbd_decode_cap(uint64_t mm) {
  uint64_t cap = mm * FBP_DECODE_FACTOR;
  return cap / FBP_DECODE_FACTOR != mm ? UINT64_MAX : cap;
}

void fbd_decode_refusal(char *err, size_t errlen, const char *name, size_t n, int over,
                        uint64_t limit, uint64_t mm) {
  if (!over) {
    fb_errf(err, errlen, "malformed request: %zu bytes that are not a valid %s", n, name);
    return;
  }
  char w[32], l[32], m[32];
  fbd_fmt_bytes(w, sizeof w, n);
  fbd_fmt_bytes(l, sizeof l, limit);
  fbd_fmt_bytes(m, sizeof m, mm);
  fb_errf(err, errlen,
          "%s of %s decodes to more than %s, the most one request may decode to "
          "(%d x max_message_bytes %s; repeated empty sub-messages decode to tens "
          "of times their bytes)",
          name, w, l, FBP_DECODE_FACTOR, m);
}

void *fbd_exec_decode(const ProtobufCMessageDescriptor *d, fbp_arena *a, const uint8_t *p,
                      size_t n, uint64_t mm, fbd_reply *r) {
  uint64_t limit = mm ? fbd_decode_cap(mm) : 0;
  a->limit = limit > SIZE_MAX - a->held ? 0 : a->held + (size_t)limit;
  a->over = 0;
  void *m = protobuf_c_message_unpack(d, &a->pb, n, p);
  a->limit = 0;
  if (!m) {
    fbd_decode_refusal(r->msg, sizeof r->msg, d->name, n, a->over, limit, mm);
    r->code = a->over ? FB_EQUOTA : FB_EINVAL;
    r->finish = r->refused = 1;
  }
  return m;
}

/* ---------------------------------------------------------------- fields */

static void run_write(fbd_exec *x, int field, const uint8_t *buf, size_t len, fbd_reply *r) {
  int rc = fb_field_write(x->es, field, buf, len);
  if (rc) {
    reply_finish(r, rc, "%s", fb_session_errmsg(x->es));
    return;
  }
  Fusebox__V1__WriteFieldResponse resp = FUSEBOX__V1__WRITE_FIELD_RESPONSE__INIT;
  resp.bytes = len;
  if (!reply_msg(r, &resp.base)) reply_finish(r, FB_OK, NULL);
}

/* The bytes go to buf; the broker streams them out when the reply is OK and
 * does not finish. */
static void run_read(fbd_exec *x, int field, uint8_t *buf, size_t len, fbd_reply *r) {
  uint64_t bytes = 0;
  char err[256];
  int rc = fbd_field_bytes(x->layout, field, &bytes, err, sizeof err);
  if (!rc && bytes != len) {
    fb_errf(err, sizeof err, "field %d holds %llu bytes, not %zu", field, (unsigned long long)bytes,
            len);
    rc = FB_EINVAL;
  }
  if (rc) {
    reply_finish(r, rc, "%s", err);
    return;
  }
  if ((rc = fb_field_read(x->es, field, buf, len)))
    reply_finish(r, rc, "%s", fb_session_errmsg(x->es));
}

/* The field's activity mask (one byte per element) goes to buf, streamed out
 * like a read. */
static void run_active(fbd_exec *x, int field, uint8_t *buf, size_t len, fbd_reply *r) {
  uint64_t bytes = 0;
  char err[256];
  int rc = fbd_field_bytes(x->layout, field, &bytes, err, sizeof err);
  if (!rc && (uint64_t)fb_field_numel(x->layout, field) != len) {
    fb_errf(err, sizeof err, "field %d holds %lld elements, not %zu", field,
            (long long)fb_field_numel(x->layout, field), len);
    rc = FB_EINVAL;
  }
  if (rc) {
    reply_finish(r, rc, "%s", err);
    return;
  }
  if ((rc = fb_field_active(x->es, field, buf, len)))
    reply_finish(r, rc, "%s", fb_session_errmsg(x->es));
}

/* ---------------------------------------------------------------- checkpoints
 * The unsealed checkpoint stream (engine/checkpoint.c) goes to sink and
 * comes from src: the broker seals it and checks the seal; here (a worker
 * process, or the session thread under thread isolation) only the stream. */

void fbd_exec_checkpoint(fbd_exec *x, fb_sink_fn sink, void *user, fbd_reply *r) {
  r->finish = 1;
  if (!x->es) {
    reply_finish(r, FB_ENOENT, "session %s does not exist", x->tag);
    return;
  }
  char err[FBD_ERRLEN - 64] = "";
  int rc = fb_session_checkpoint(x->es, sink, user, err, sizeof err);
  if (rc) reply_finish(r, rc, "checkpoint: %s", err[0] ? err : fb_strerror(rc));
  else reply_finish(r, FB_OK, NULL);
  fb_session_counters(x->es, &r->counters);
}

int fbd_exec_restore(fbd_exec *x, fb_source_fn src, void *user, fbd_reply *r) {
  char err[FBD_ERRLEN - 64] = "";
  fb_session *es = NULL;
  /* the broker checked the seal's MAC over all but the bulk parts
     (fb_seal_check_fd); their bytes are checked against the manifest here,
     as they are read: each byte read and hashed once */
  int rc = fb_session_restore_sealed(x->engine, &x->ecfg, src, user, &es, err, sizeof err);
  if (rc) {
    reply_finish(r, rc, "%s", err[0] ? err : fb_strerror(rc));
    r->fatal = 1;
    return rc;
  }
  x->es = es;
  x->layout = (fb_layout *)fb_session_layout(es); /* the session's own copy */
  x->nkernels = fb_session_kernel_count(es);
  x->eng_launches = fb_session_launches(es);
  x->seq = 0;
  seq_break(x, 1); /* the engine's next launch is this stream's first */
  if (x->watch) fb_session_set_task_hook(x->es, watch_hook, x->watch);
  fb_session_counters(x->es, &r->counters);
  r->registered = (uint32_t)x->nkernels;
  reply_finish(r, FB_OK, NULL);
  return 0;
}

/* ---------------------------------------------------------------- dispatch */

void fbd_exec_init(fbd_exec *x, fb_engine *e, fb_layout *l, const fb_session_config *ecfg,
                   const char *tag, fbd_log *log, fbd_watch *watch) {
  memset(x, 0, sizeof *x);
  x->engine = e;
  x->layout = l;
  x->ecfg = *ecfg;
  snprintf(x->mode, sizeof x->mode, "%s", ecfg->mode ? ecfg->mode : "sync");
  x->ecfg.mode = x->mode;
  x->tag = tag;
  x->log = log;
  x->watch = watch;
}

void fbd_exec_free(fbd_exec *x) {
  fb_session_destroy(x->es);
  x->es = NULL;
  for (int i = 0; i < x->nerrs; i++) free(x->errs[i].msg);
  free(x->errs);
  free(x->rets);
  free(x->smap);
  x->errs = NULL;
  x->rets = NULL;
  x->smap = NULL;
  x->nerrs = x->nrets = x->nsmap = 0;
}

void fbd_exec_run(fbd_exec *x, int kind, const void *msg, int field, uint8_t *buf, size_t len,
                  fbd_reply *r) {
  if (kind != FBD_J_CREATE && kind != FBD_J_END && !x->es) {
    reply_finish(r, FB_ENOENT, "session %s does not exist", x->tag);
  }
  if (!r->finish) switch (kind) {
    case FBD_J_CREATE: run_create(x, r); break;
    case FBD_J_REGISTER: run_register(x, msg, r); break;
    case FBD_J_BATCH: run_batch(x, msg, r); break;
    case FBD_J_WRITE: run_write(x, field, buf, len, r); break;
    case FBD_J_READ: run_read(x, field, buf, len, r); break;
    case FBD_J_ACTIVE: run_active(x, field, buf, len, r); break;
    case FBD_J_CLOSE: reply_finish(r, FB_OK, NULL); break;
    case FBD_J_END: break;
    }
  /* the memory budget: past the broker's cap, run what is pending now */
  if (x->es && kind == FBD_J_BATCH && x->watch &&
      fb_session_pending_bytes(x->es) > atomic_load(&x->watch->pending_cap))
    fb_session_drain(x->es);
  if (x->es) fb_session_counters(x->es, &r->counters);
  if (x->watch) { /* what the broker counts against the budget (budget.c) */
    fb_code_cache_usage u;
    fb_engine_code_cache(x->engine, &u);
    atomic_store(&x->watch->pending_bytes, x->es ? fb_session_pending_bytes(x->es) : 0);
    atomic_store(&x->watch->code_bytes, u.bytes);
    atomic_store(&x->watch->kernel_bytes, x->es ? fb_session_kernel_bytes(x->es) : 0);
  }
}

/* ---------------------------------------------------------------- helpers */

int fbd_field_bytes(const fb_layout *l, int field, uint64_t *bytes, char *err, size_t errlen) {
  if (field < 0 || field >= l->nnodes) {
    fb_errf(err, errlen, "no field with id %d (the layout has %d SNodes)", field, l->nnodes);
    return FB_ENOENT;
  }
  const fb_snode *f = &l->nodes[field];
  if (f->kind != FB_SN_PLACE) {
    fb_errf(err, errlen, "SNode %d (%s) is not a field", field, fb_snode_kind_name(f->kind));
    return FB_EINVAL;
  }
  *bytes = (uint64_t)fb_field_numel(l, field) * fb_type_size(f->type);
  return 0;
}
