/* The jobs a session's worker runs against the engine, in the order they
 * were received: create the engine session, register kernels, run launch
 * batches (recording each failed launch and each return value under its
 * sequence number) and answer syncs, write and read fields, close. Only
 * this thread touches the session's fb_session. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/server.h"

#define MAX_ERRS 64          /* launch errors kept per sync */
#define MAX_RETS (1 << 20)   /* return values kept per sync */
#define STACK_ARGS 16

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

static void run_create(fbd_session *s, fbd_job *j) {
  fbd_server *srv = s->srv;
  char err[FBD_ERRLEN] = "", extra[512] = "";
  int rc = fb_session_create(srv->engine, &s->ecfg, s->layout, &s->es, err, sizeof err);
  if (rc) {
    if (rc == FB_EQUOTA) largest_fields(s->layout, extra, sizeof extra);
    s->end_reason = FBD_END_FAILED;
    fbd_logf(srv->log, FBD_LOG_WARN, "session for %s refused: %s%s", s->peer, err, extra);
    fbd_call_finish(j->call, rc, "%s%s", err[0] ? err : fb_strerror(rc), extra);
    return;
  }
  s->created = 1;
  pthread_mutex_lock(&srv->mu);
  srv->st.sessions_created++;
  pthread_mutex_unlock(&srv->mu);
  fbd_logf(srv->log, FBD_LOG_INFO, "session %s created for %s: mode %s, %d SNodes, %llu bytes",
           s->tag, s->peer, s->mode, s->layout->nnodes, (unsigned long long)s->mem_bytes);
  Fusebox__V1__CreateSessionResponse r = FUSEBOX__V1__CREATE_SESSION_RESPONSE__INIT;
  r.session_id = s->id;
  r.backend = (char *)srv->backend;
  r.memory_bytes = s->mem_bytes;
  fbd_call_send_msg(j->call, &r.base);
  fbd_call_finish(j->call, FB_OK, NULL);
}

/* ---------------------------------------------------------------- kernels */

static int register_one(fbd_session *s, const Fusebox__V1__Kernel *m, size_t i, size_t n,
                        int *id, char *err, size_t errlen) {
  fb_kernel *k = NULL;
  char why[FBD_ERRLEN - 128];
  int rc = fbp_kernel_from_pb(m, s->layout, &k, why, sizeof why);
  if (rc) {
    snprintf(err, errlen, "kernel %zu of %zu: %s", i + 1, n, why);
    return rc;
  }
  rc = fb_session_add_kernel(s->es, k);
  fb_kernel_free(k);
  if (rc < 0) {
    snprintf(err, errlen, "%s", fb_session_errmsg(s->es));
    return rc;
  }
  *id = rc;
  return 0;
}

static void run_register(fbd_session *s, fbd_job *j) {
  const Fusebox__V1__RegisterKernelsRequest *m = j->msg;
  int32_t *ids = fbp_alloc(&j->arena, sizeof *ids * (m->n_kernels + 1));
  if (!ids) {
    fbd_call_finish(j->call, FB_ENOMEM, "out of memory");
    return;
  }
  char err[FBD_ERRLEN];
  for (size_t i = 0; i < m->n_kernels; i++) {
    int id = -1;
    int rc = register_one(s, m->kernels[i], i, m->n_kernels, &id, err, sizeof err);
    if (rc) {
      fbd_logf(s->srv->log, FBD_LOG_INFO, "session %s: kernel refused: %s", s->tag, err);
      fbd_call_finish(j->call, rc, "%s", err);
      return;
    }
    ids[i] = id;
    fbd_logf(s->srv->log, FBD_LOG_DEBUG, "session %s: kernel '%s' registered as %d", s->tag,
             m->kernels[i]->name, id);
  }
  Fusebox__V1__RegisterKernelsResponse r = FUSEBOX__V1__REGISTER_KERNELS_RESPONSE__INIT;
  r.n_kernel_ids = m->n_kernels;
  r.kernel_ids = ids;
  fbd_call_send_msg(j->call, &r.base);
  fbd_call_finish(j->call, FB_OK, NULL);
}

/* ---------------------------------------------------------------- launches */

static void add_error(fbd_session *s, uint64_t seq, int kernel, int code, const char *msg) {
  if (!s->errs) s->errs = calloc(MAX_ERRS, sizeof *s->errs);
  if (!s->errs || s->nerrs == MAX_ERRS) {
    s->errs_dropped++;
    return;
  }
  fbd_err *e = &s->errs[s->nerrs];
  if (!(e->msg = strdup(msg ? msg : ""))) {
    s->errs_dropped++;
    return;
  }
  e->seq = seq;
  e->kernel = kernel;
  e->code = code;
  s->nerrs++;
}

static void add_return(fbd_session *s, uint64_t seq, int kernel, fb_value v) {
  if (s->nrets == s->rcap) {
    int nc = s->rcap ? s->rcap * 2 : 64;
    fbd_ret *r = nc <= MAX_RETS ? realloc(s->rets, sizeof *r * (size_t)nc) : NULL;
    if (!r) {
      s->rets_dropped++;
      return;
    }
    s->rets = r;
    s->rcap = nc;
  }
  s->rets[s->nrets++] = (fbd_ret){seq, kernel, v};
}

/* Launch numbers: the engine numbers the launches it accepts from 0; ours
 * (seq) count every launch received from 1. They part where the engine
 * refused a launch outright; each such place is recorded, so that an error
 * the engine reports later by launch number finds its seq. */
static void seq_break(fbd_session *s, uint64_t next_seq) {
  if (s->nsmap == s->smcap) {
    int nc = s->smcap ? s->smcap * 2 : 16;
    struct fbd_seqmap *v = nc <= (1 << 16) ? realloc(s->smap, sizeof *v * (size_t)nc) : NULL;
    if (!v) return; /* later errors may then name a nearby launch */
    s->smap = v;
    s->smcap = nc;
  }
  s->smap[s->nsmap++] = (struct fbd_seqmap){s->eng_launches, next_seq};
}

static uint64_t seq_of(const fbd_session *s, uint64_t launch) {
  uint64_t eng = 0, seq = 1;
  for (int i = 0; i < s->nsmap && s->smap[i].eng <= launch; i++) {
    eng = s->smap[i].eng;
    seq = s->smap[i].seq;
  }
  return seq + (launch - eng);
}

/* An error the engine returned from a call that waits (sync, flush, host
 * access): about a background launch when it says so. */
static void engine_error(fbd_session *s, int rc) {
  uint64_t launch = 0;
  int kernel = -1;
  if (fb_session_error_launch(s->es, &launch, &kernel) == 0)
    add_error(s, seq_of(s, launch), kernel, rc, fb_session_errmsg(s->es));
  else add_error(s, 0, -1, rc, fb_session_errmsg(s->es));
}

static void run_launch(fbd_session *s, const Fusebox__V1__Launch *l) {
  uint64_t seq = ++s->seq;
  fb_value stack[STACK_ARGS], *args = stack;
  if (l->n_args > STACK_ARGS && !(args = malloc(sizeof *args * l->n_args))) {
    add_error(s, seq, l->kernel, FB_ENOMEM, "out of memory");
    seq_break(s, seq + 1);
    return;
  }
  for (size_t a = 0; a < l->n_args; a++) {
    if (!fbp_value_from_pb(l->args[a], &args[a])) continue;
    char msg[128];
    snprintf(msg, sizeof msg, "argument %zu has no valid type (%d)", a, (int)l->args[a]->type);
    add_error(s, seq, l->kernel, FB_ETYPE, msg);
    seq_break(s, seq + 1);
    if (args != stack) free(args);
    return;
  }
  fb_value ret;
  memset(&ret, 0, sizeof ret);
  int rc = fb_launch(s->es, l->kernel, l->n_args ? args : NULL, (int)l->n_args, &ret);
  if (args != stack) free(args);
  if (!rc) {
    s->eng_launches++;
    if (ret.type != FB_T_VOID) add_return(s, seq, l->kernel, ret);
    return;
  }
  fb_counters c;
  fb_session_counters(s->es, &c);
  uint64_t launch = 0;
  int kernel = -1;
  if (c.launches > s->eng_launches) { /* it ran (or was queued) and failed */
    s->eng_launches = c.launches;
    if (fb_session_error_launch(s->es, &launch, &kernel) == 0 && seq_of(s, launch) != seq) {
      add_error(s, seq_of(s, launch), kernel, rc, fb_session_errmsg(s->es)); /* an earlier one */
      return;
    }
  } else {
    seq_break(s, seq + 1);
  }
  add_error(s, seq, l->kernel, rc, fb_session_errmsg(s->es));
}

/* The SyncResult: everything recorded since the last one. */
static void send_sync(fbd_session *s, fbd_job *j, uint64_t id) {
  fbp_arena *a = &j->arena;
  Fusebox__V1__SyncResult *r = fbp_alloc(a, sizeof *r);
  Fusebox__V1__Counters *c = fbp_alloc(a, sizeof *c);
  Fusebox__V1__LaunchReturn **rv = fbp_alloc(a, sizeof *rv * (size_t)(s->nrets + 1));
  Fusebox__V1__LaunchError **ev = fbp_alloc(a, sizeof *ev * (size_t)(s->nerrs + 1));
  Fusebox__V1__LaunchReturn *rs = fbp_alloc(a, sizeof *rs * (size_t)(s->nrets + 1));
  Fusebox__V1__Value *vs = fbp_alloc(a, sizeof *vs * (size_t)(s->nrets + 1));
  Fusebox__V1__LaunchError *es = fbp_alloc(a, sizeof *es * (size_t)(s->nerrs + 1));
  if (!r || !c || !rv || !ev || !rs || !vs || !es) {
    fbd_call_finish(j->call, FB_ENOMEM, "out of memory building a sync result");
    return;
  }
  fusebox__v1__sync_result__init(r);
  r->sync_id = id;
  r->seq = s->seq;
  for (int i = 0; i < s->nrets; i++) {
    fusebox__v1__launch_return__init(&rs[i]);
    rs[i].seq = s->rets[i].seq;
    rs[i].kernel = s->rets[i].kernel;
    fbp_value_to_pb(&vs[i], s->rets[i].v);
    rs[i].value = &vs[i];
    rv[i] = &rs[i];
  }
  for (int i = 0; i < s->nerrs; i++) {
    fusebox__v1__launch_error__init(&es[i]);
    es[i].seq = s->errs[i].seq;
    es[i].kernel = s->errs[i].kernel;
    es[i].code = s->errs[i].code;
    es[i].message = s->errs[i].msg;
    ev[i] = &es[i];
  }
  r->n_returns = (size_t)s->nrets;
  r->returns = rv;
  r->n_errors = (size_t)s->nerrs;
  r->errors = ev;
  r->errors_dropped = s->errs_dropped;
  r->returns_dropped = s->rets_dropped;
  fb_counters cn;
  fb_session_counters(s->es, &cn);
  fbp_counters_to_pb(c, &cn);
  r->counters = c;
  Fusebox__V1__SessionResponse resp = FUSEBOX__V1__SESSION_RESPONSE__INIT;
  resp.sync = r;
  fbd_call_send_msg(j->call, &resp.base);
  for (int i = 0; i < s->nerrs; i++) free(s->errs[i].msg);
  s->nerrs = 0;
  s->nrets = 0;
  s->errs_dropped = s->rets_dropped = 0;
}

static void run_batch(fbd_session *s, fbd_job *j) {
  const Fusebox__V1__SessionRequest *m = j->msg;
  for (size_t i = 0; i < m->n_launches; i++) run_launch(s, m->launches[i]);
  int rc = 0;
  if (m->sync) rc = fb_sync(s->es);
  else if (m->flush) rc = fb_flush(s->es);
  if (rc) engine_error(s, rc);
  pthread_mutex_lock(&s->srv->mu);
  s->srv->st.launches += m->n_launches;
  if (m->sync) s->srv->st.syncs++;
  pthread_mutex_unlock(&s->srv->mu);
  if (m->sync) send_sync(s, j, m->sync);
}

/* ---------------------------------------------------------------- fields */

static void run_write(fbd_session *s, fbd_job *j) {
  int rc = fb_field_write(s->es, j->field, j->buf, j->len);
  fbd_stage_give(s, j->buf, j->len);
  j->buf = NULL;
  if (rc) {
    fbd_call_finish(j->call, rc, "%s", fb_session_errmsg(s->es));
    return;
  }
  Fusebox__V1__WriteFieldResponse r = FUSEBOX__V1__WRITE_FIELD_RESPONSE__INIT;
  r.bytes = j->len;
  fbd_call_send_msg(j->call, &r.base);
  fbd_call_finish(j->call, FB_OK, NULL);
}

static void run_read(fbd_session *s, fbd_job *j) {
  uint64_t bytes = 0;
  char err[256];
  int rc = fbd_field_bytes(s->layout, j->field, &bytes, err, sizeof err);
  if (rc) {
    fbd_call_finish(j->call, rc, "%s", err);
    return;
  }
  uint8_t *buf = fbd_stage_take(s, bytes);
  if (!buf) {
    fbd_call_finish(j->call, FB_ENOMEM, "cannot stage %llu bytes for reading",
                    (unsigned long long)bytes);
    return;
  }
  rc = fb_field_read(s->es, j->field, buf, bytes);
  if (rc) {
    fbd_stage_give(s, buf, bytes);
    fbd_call_finish(j->call, rc, "%s", fb_session_errmsg(s->es));
    return;
  }
  fbd_read_begin(j->call, s, buf, bytes, j->chunk);
}

/* ---------------------------------------------------------------- dispatch */

void fbd_worker_run(fbd_session *s, fbd_job *j) {
  if (j->kind != FBD_J_CREATE && j->kind != FBD_J_END && !s->es) {
    if (j->call) fbd_call_finish(j->call, FB_ENOENT, "session %s does not exist", s->tag);
    return;
  }
  switch (j->kind) {
  case FBD_J_CREATE: run_create(s, j); break;
  case FBD_J_REGISTER: run_register(s, j); break;
  case FBD_J_BATCH: run_batch(s, j); break;
  case FBD_J_WRITE: run_write(s, j); break;
  case FBD_J_READ: run_read(s, j); break;
  case FBD_J_CLOSE:
    s->end_reason = FBD_END_CLOSED;
    fbd_call_finish(j->call, FB_OK, NULL);
    break;
  case FBD_J_END: break; /* the worker loop ends the session */
  }
}

/* ---------------------------------------------------------------- helpers */

int fbd_field_bytes(const fb_layout *l, int field, uint64_t *bytes, char *err, size_t errlen) {
  if (field < 0 || field >= l->nnodes) {
    if (err) snprintf(err, errlen, "no field with id %d (the layout has %d SNodes)", field,
                      l->nnodes);
    return FB_ENOENT;
  }
  const fb_snode *f = &l->nodes[field];
  if (f->kind != FB_SN_PLACE) {
    if (err) snprintf(err, errlen, "SNode %d (%s) is not a field", field,
                      fb_snode_kind_name(f->kind));
    return FB_EINVAL;
  }
  *bytes = (uint64_t)fb_field_numel(l, field) * fb_type_size(f->type);
  return 0;
}
