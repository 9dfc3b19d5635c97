/* Several replicas and graceful drain.
 *
 * The replica's name (--replica-name, else the host name) goes out in the
 * initial metadata of every answer ("fusebox-replica", call.c's pump), in
 * GetInfo and in the messages that tell a client its session is not here.
 *
 * Draining (SIGTERM, or the admin Drain RPC; main.c runs it): /readyz
 * answers 503 and the health service "fusebox.v1.Ready" NOT_SERVING, so
 * that proxies and Kubernetes send new sessions elsewhere; a CreateSession
 * that still arrives is refused UNAVAILABLE with a retry hint
 * ("fusebox-retry-after-ms"); live sessions go on for drain_grace_s, then
 * each is ended by fbd_drain_end_session, and fuseboxd shuts down as
 * before (work already received finishes within shutdown_grace_s) and
 * exits 0. It exits as soon as the last session is gone. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "server/server.h"

/* How long a client refused for draining should wait before it tries again
 * (with a new routing key): about one health-check period of a proxy. */
#define DRAIN_RETRY_MS 1000

static int name_ok(const char *s) {
  size_t n = strlen(s);
  if (n < 1 || n > 63) return 0;
  for (; *s; s++)
    if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') ||
          *s == '-' || *s == '_' || *s == '.'))
      return 0;
  return 1;
}

int fbd_replica_init(fbd_server *srv, char *err, size_t errlen) {
  const char *n = srv->cfg->replica_name;
  char host[256] = "";
  if (!n || !*n) {
    if (gethostname(host, sizeof host - 1) != 0 || !*host) snprintf(host, sizeof host, "fuseboxd");
    host[63] = 0; /* a longer host name: its first 63 characters */
    n = host;
  }
  if (!name_ok(n)) {
    fb_errf(err, errlen,
            "replica_name '%.80s': use 1 to 63 of the characters A-Z a-z 0-9 - _ . (it travels "
            "in the fusebox-replica header)",
            n);
    return FB_EINVAL;
  }
  memcpy(srv->replica, n, strlen(n) + 1); /* name_ok: at most 63 */
  srv->replica_md.key = grpc_slice_from_static_string(FBD_REPLICA_KEY);
  srv->replica_md.value = grpc_slice_from_static_buffer(srv->replica, strlen(srv->replica));
  srv->drain_md[0] = srv->replica_md;
  srv->drain_md[1].key = grpc_slice_from_static_string(FBD_DRAINING_KEY);
  srv->drain_md[1].value = srv->replica_md.value;
  return 0;
}

/* Tell each live session's stream that this replica drains: a
 * SessionResponse of its own with draining = the replica's name, so that a
 * client moves the session at its next call (docs/checkpoint.md, "Moving a
 * session off a draining replica"); an older client ignores it. */
static void tell_streams(fbd_server *srv) {
  int max = srv->cfg->max_sessions, n = 0;
  fbd_call **v = calloc((size_t)max, sizeof *v);
  if (!v) return;
  pthread_mutex_lock(&srv->mu);
  for (int i = 0; i < max; i++) {
    fbd_session *s = srv->sessions[i];
    if (!s) continue;
    pthread_mutex_lock(&s->mu);
    if (s->stream && s->state == FBD_LIVE) {
      fbd_call_ref(s->stream);
      v[n++] = s->stream;
    }
    pthread_mutex_unlock(&s->mu);
  }
  pthread_mutex_unlock(&srv->mu);
  Fusebox__V1__SessionResponse m = FUSEBOX__V1__SESSION_RESPONSE__INIT;
  m.draining = srv->replica;
  for (int i = 0; i < n; i++) {
    fbd_call_send_msg(v[i], &m.base);
    fbd_call_unref(v[i]);
  }
  free(v);
}

int fbd_drain_begin(fbd_server *srv, const char *why) {
  /* the Drain RPC sets draining itself (refusals at once); main's thread
     comes here once per drain, either way. Set before the streams hear of
     it: a session moved at once must not land here again. */
  int already = atomic_exchange(&srv->draining, 1);
  tell_streams(srv);
  if (already) return 1;
  pthread_mutex_lock(&srv->mu);
  int n = srv->nsessions;
  pthread_mutex_unlock(&srv->mu);
  fbd_logf(srv->log, FBD_LOG_INFO,
           "%s: draining replica %s: new sessions are refused and /readyz fails; %d live "
           "session%s may go on for %g s (drain_grace_s)",
           why, srv->replica, n, n == 1 ? "" : "s", srv->cfg->drain_grace_s);
  return 0;
}

void fbd_drain_refusal(fbd_server *srv, char *msg, size_t n) {
  snprintf(msg, n, "fuseboxd on replica %s is draining; retry on another replica", srv->replica);
}

int fbd_drain_retry_ms(void) { return DRAIN_RETRY_MS; }

int fbd_drain_sessions(fbd_server *srv) {
  pthread_mutex_lock(&srv->mu);
  int n = srv->nsessions;
  pthread_mutex_unlock(&srv->mu);
  return n;
}

/* The grace is over and s is still live: with --checkpoint-dir, its state
 * is checkpointed there first (after the work it received) and the name
 * goes into the message; then it ends, its stream answered UNAVAILABLE
 * with the reason. */
static void fbd_drain_end_session(fbd_server *srv, fbd_session *s) {
  char why[1024], saved[320] = "", name[96] = "", err[256] = "";
  if (fbd_ckpt_dir_enabled(srv) && s->created && !s->describe) {
    if (fbd_session_checkpoint_now(s, 60, name, sizeof name, err, sizeof err) == 0)
      snprintf(saved, sizeof saved,
               "; its state is in checkpoint %s (Restore it by that name where the "
               "checkpoint directory and key are shared)", name);
    else
      snprintf(saved, sizeof saved, "; its checkpoint failed: %.200s", err);
  }
  snprintf(why, sizeof why,
           "session %s ended: fuseboxd on replica %s is draining and its grace of %g s is over "
           "(drain_grace_s)%s; open a new session, another replica takes it",
           s->tag, srv->replica, srv->cfg->drain_grace_s, saved);
  if (fbd_session_end_with(s, FBD_END_DRAINED, why) == 0)
    fbd_logf(srv->log, FBD_LOG_INFO, "session %s: ended by the drain of replica %s%s", s->tag,
             srv->replica, saved);
}

void fbd_drain_end_rest(fbd_server *srv) {
  int max = srv->cfg->max_sessions, n = 0;
  fbd_session **v = calloc((size_t)max, sizeof *v);
  if (!v) return;
  pthread_mutex_lock(&srv->mu);
  for (int i = 0; i < max; i++)
    if (srv->sessions[i]) {
      fbd_session_ref(srv->sessions[i]);
      v[n++] = srv->sessions[i];
    }
  pthread_mutex_unlock(&srv->mu);
  for (int i = 0; i < n; i++) {
    fbd_drain_end_session(srv, v[i]);
    fbd_session_unref(v[i]);
  }
  free(v);
}
