/* fuseboxd's start and stop: the one place that brings up, in order, and
 * takes down, in reverse, what the broker's files own (the engine, auth,
 * the code store, the scheduler, checkpoints, the worker processes, the
 * gRPC server and its gate, /metrics), plus the listeners' sockets and
 * gRPC's channel arguments, and the table of methods rpc.c routes calls
 * to. The policy files and rpc.c do not call each other's start or stop. */
#include <errno.h>
#include <grp.h>
#include <grpc/grpc_security.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "server/server.h"

#define SERVER_ARGS 9 /* the integer ones; then the resource quota */

static void on_shutdown_done(void *obj, int ok) {
  fbd_server *srv = obj;
  pthread_mutex_lock(&srv->mu);
  srv->shutdown_done = 1;
  pthread_cond_broadcast(&srv->cv);
  pthread_mutex_unlock(&srv->mu);
}

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
  return fbd_rpc_accept(srv, rc, err, errlen);
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
  srv->ops = fbd_isolated(cfg) ? &fbd_process_ops : &fbd_thread_ops;
  srv->methods = fbd_methods(&srv->nmethods);
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

static int no_session_threads(fbd_server *s) { return s->nsession_threads == 0; }
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
  /* a session thread stuck in a kernel that never ends cannot be stopped: give up */
  wait_until(srv, no_session_threads, fbd_now() + srv->cfg->shutdown_grace_s + 5);
  pthread_mutex_lock(&srv->mu);
  int stuck = srv->nsession_threads;
  pthread_mutex_unlock(&srv->mu);
  if (stuck) {
    fbd_logf(srv->log, FBD_LOG_ERROR, "%d session worker%s still running after the grace period",
             stuck, stuck == 1 ? "" : "s");
    return FB_EINTERNAL;
  }
  fbd_server_tick(srv); /* join the session threads */
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
