/* Observability of a session: SFG graph traces and the timeline trace. */
#include "engine/internal.h"

/* ---------------------------------------------------------------- observability */

int fb_session_trace_graph(fb_session *s, uint64_t flush, fb_graph_trace_fn fn, void *user) {
  if (!s) return FB_EINVAL;
  if (!s->as)
    return fail(s, FB_EUNSUPPORTED,
                "the state-flow graph exists in async mode only (this "
                "session is sync)");
  s->as->gfn = fn;
  s->as->guser = user;
  s->as->gflush = flush;
  return 0;
}

static int trace_finish(fb_session *s) {
  int rc = fb_trace_write(s->trace, s->trace_file);
  if (fclose(s->trace_file)) rc = FB_EIO;
  fb_trace_free(s->trace);
  s->trace = NULL;
  s->trace_file = NULL;
  return rc;
}

/* At destroy: write what was recorded (best effort). */
void fbe_trace_close(fb_session *s) {
  if (s->trace) trace_finish(s);
}

int fb_session_trace_begin(fb_session *s, const char *path) {
  if (!s) return FB_EINVAL;
  if (!path) return fail(s, FB_EINVAL, "trace: no file name given");
  if (s->as) fbe_quiesce(s); /* nothing may be recording while the recorder changes */
  if (s->trace && trace_finish(s))
    return fail(s, FB_EIO, "trace: writing the previous file failed");
  FILE *f = fopen(path, "w");
  if (!f) return fail(s, FB_EIO, "trace: cannot open '%s' for writing: %s", path, strerror(errno));
  char name[96];
  snprintf(name, sizeof name, "fusebox session %d (%s)", s->pid, s->as ? "async" : "sync");
  if (!(s->trace = fb_trace_new(s->pid, name))) {
    fclose(f);
    return fail(s, FB_ENOMEM, "trace: out of memory");
  }
  s->trace_file = f;
  return 0;
}

int fb_session_trace_end(fb_session *s) {
  if (!s) return FB_EINVAL;
  if (!s->trace) return fail(s, FB_EINVAL, "trace: no timeline is being recorded");
  if (s->as) fbe_quiesce(s);
  return trace_finish(s) ? fail(s, FB_EIO, "trace: writing the file failed") : 0;
}
