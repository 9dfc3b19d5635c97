/* fuseboxd: the Fusebox server. Reads its settings, starts the engine and
 * the gRPC server, then waits for SIGTERM/SIGINT while reaping idle
 * sessions; on a signal it shuts down gracefully (work already received
 * finishes, sessions are freed) and exits 0. Exit 2 for bad settings, 1 when
 * the server cannot start, 3 when a kernel still runs after the grace period. */
#include <errno.h>
#include <malloc.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "server/server.h"

/* Signals are taken synchronously by the main thread: block them before
 * any thread exists so that every thread inherits the mask. */
static void block_signals(sigset_t *set) {
  sigemptyset(set);
  sigaddset(set, SIGTERM);
  sigaddset(set, SIGINT);
  pthread_sigmask(SIG_BLOCK, set, NULL);
  signal(SIGPIPE, SIG_IGN);
}

static void announce(const fbd_config *cfg, fbd_server *srv, fbd_log *log) {
  fbd_logf(log, FBD_LOG_INFO,
           "fuseboxd %s serving on %s (backend %s on %s, max %d sessions, %llu bytes per "
           "session, idle timeout %.0f s)", FBD_VERSION, srv->addresses, srv->backend,
           fb_engine_device(srv->engine), cfg->max_sessions,
           (unsigned long long)cfg->session_memory_limit, cfg->idle_timeout_s);
  if (cfg->ready_fd < 0) return;
  char line[sizeof srv->addresses + 2];
  int n = snprintf(line, sizeof line, "%s\n", srv->addresses);
  ssize_t w = write(cfg->ready_fd, line, (size_t)n);
  if (w != n) fbd_logf(log, FBD_LOG_WARN, "--ready-fd %d: %s", cfg->ready_fd, strerror(errno));
  close(cfg->ready_fd);
}

static int wait_for_signal(fbd_server *srv, const sigset_t *set) {
  struct timespec tick = {0, 250 * 1000 * 1000};
  for (;;) {
    int sig = sigtimedwait(set, NULL, &tick);
    if (sig == SIGTERM || sig == SIGINT) return sig;
    fbd_server_tick(srv);
  }
}

int main(int argc, char **argv) {
  fbd_config cfg;
  char err[FBD_ERRLEN] = "";
  fbd_config_defaults(&cfg);
  int rc = fbd_config_args(&cfg, argc, argv, err, sizeof err);
  if (rc) {
    if (rc < 0) fprintf(stderr, "fuseboxd: %s\n", err);
    fbd_config_free(&cfg);
    return rc < 0 ? 2 : 0;
  }
  sigset_t set;
  block_signals(&set);
  /* gRPC allocates and frees megabyte read buffers all the time: keep them
   * in the heap instead of mapping fresh (page-faulting) memory each time */
  mallopt(M_MMAP_THRESHOLD, 64 << 20);
  mallopt(M_TRIM_THRESHOLD, 256 << 20);
  fbd_log log;
  fbd_log_init(&log, stderr, cfg.log_level);
  fbd_server *srv = NULL;
  if ((rc = fbd_server_start(&cfg, &log, &srv, err, sizeof err))) {
    fbd_logf(&log, FBD_LOG_ERROR, "cannot start: %s", err);
    fbd_log_destroy(&log);
    fbd_config_free(&cfg);
    return 1;
  }
  announce(&cfg, srv, &log);
  int sig = wait_for_signal(srv, &set);
  fbd_logf(&log, FBD_LOG_INFO, "%s: shutting down (grace %.1f s)",
           sig == SIGTERM ? "SIGTERM" : "SIGINT", cfg.shutdown_grace_s);
  if (fbd_server_shutdown(srv)) {
    fbd_logf(&log, FBD_LOG_ERROR, "exiting without a clean shutdown");
    _exit(3);
  }
  pthread_mutex_lock(&srv->mu);
  fbd_stats st = srv->st;
  pthread_mutex_unlock(&srv->mu);
  fbd_logf(&log, FBD_LOG_INFO, "stopped: %llu sessions served, %llu launches",
           (unsigned long long)st.sessions_created, (unsigned long long)st.launches);
  fbd_server_free(srv);
  fbd_log_destroy(&log);
  fbd_config_free(&cfg);
  return 0;
}
