/* The thread implementation of the session operations (fbd_session_ops,
 * server.h; --isolation thread): the session thread runs the engine side
 * (exec.c) itself, in fuseboxd's own process, with a watch page of plain
 * memory. Its counterpart for --isolation process is fbd_process_ops
 * (proc.c), where the session's worker runs it. */
#include <stdlib.h>

#include "server/server.h"

static void fail(fbd_reply *r, int code) {
  r->code = code;
  r->finish = r->fatal = 1;
}

/* The engine side's limits on a source's parse (source.c), for a job of
 * this thread: the parse runs right here. */
static void parse_limits(fbd_session *s, fbd_job *j) {
  s->x.watch = s->watch;
  s->x.parse_timeout_s = s->srv->cfg->compile_timeout_s;
  s->x.gone = j && j->call ? &j->call->gone : NULL;
}

static int thread_open(fbd_session *s) {
  return (s->watch = calloc(1, sizeof *s->watch)) ? 0 : FB_ENOMEM;
}

static int thread_attach(fbd_session *s, char *err, size_t errlen) {
  (void)s;
  (void)err;
  (void)errlen;
  return 0;
}

static int thread_parse(fbd_session *s, fbd_job *j, fb_layout **out, fbd_reply *r) {
  parse_limits(s, j);
  int rc = fbd_exec_parse(&s->x, GRPC_SLICE_START_PTR(j->raw), GRPC_SLICE_LENGTH(j->raw), out,
                          r->msg, sizeof r->msg);
  if (rc) fail(r, rc);
  return rc;
}

static void thread_create(fbd_session *s, fbd_job *j, fbd_reply *r) {
  fbd_server *srv = s->srv;
  (void)j;
  fbd_exec_init(&s->x, srv->engine, s->layout, &s->ecfg, s->tag, srv->log, s->watch);
  s->x.parse_timeout_s = srv->cfg->compile_timeout_s; /* the sources of its kernels */
  fbd_exec_run(&s->x, FBD_J_CREATE, NULL, 0, NULL, 0, r);
}

static void thread_describe(fbd_session *s, fbd_job *j, fbd_reply *r) {
  parse_limits(s, j);
  fbd_exec_describe(&s->x, GRPC_SLICE_START_PTR(j->raw), GRPC_SLICE_LENGTH(j->raw), r);
}

static void thread_restore(fbd_session *s, fbd_job *j, fb_layout **out, fbd_reply *r) {
  fbd_server *srv = s->srv;
  fbd_exec_init(&s->x, srv->engine, NULL, &s->ecfg, s->tag, srv->log, s->watch);
  s->x.parse_timeout_s = srv->cfg->compile_timeout_s;
  if (!fbd_exec_restore(&s->x, fbd_ckpt_source, j->ck, r) &&
      !(*out = fb_layout_clone(s->x.layout))) {
    fb_errf(r->msg, sizeof r->msg, "out of memory");
    fail(r, FB_ENOMEM);
  }
}

static void thread_run(fbd_session *s, fbd_job *j, fbd_reply *r) {
  s->x.gone = j->call ? &j->call->gone : NULL; /* a source's parse stops when it goes */
  if (j->kind == FBD_J_CKPT) fbd_exec_checkpoint(&s->x, j->sink, j->sink_user, r);
  else fbd_exec_run(&s->x, j->kind, j->msg, j->field, j->buf.p, j->buf.len, r);
  s->x.gone = NULL;
}

static void thread_signal(fbd_session *s, int sig) {
  (void)s; /* the watch page's hold flag is all a thread heeds */
  (void)sig;
}

static void thread_sample(fbd_session *s) { (void)s; }

static void thread_release(fbd_session *s) { free(s->watch); }

static uint64_t thread_charge(fbd_server *srv) {
  (void)srv; /* no worker process to charge */
  return 0;
}

/* A session's JIT code is in the broker's engine's code cache (counted
 * whole), its memory in the sessions part: nothing apart. */
static void thread_held_locked(fbd_session *s, uint64_t *code, uint64_t *own) {
  (void)s;
  *code = *own = 0;
}

const fbd_session_ops fbd_thread_ops = {
    .name = "thread",
    .serving = "sessions in threads",
    .staging_memfd = 0,
    .keep_request = 0,
    .charge = thread_charge,
    .held_locked = thread_held_locked,
    .open = thread_open,
    .attach = thread_attach,
    .parse = thread_parse,
    .create = thread_create,
    .describe = thread_describe,
    .restore = thread_restore,
    .run = thread_run,
    .signal = thread_signal,
    .sample = thread_sample,
    .release = thread_release,
};
