/* fuseboxd: the Fusebox server. Reads its settings, starts the engine and
 * the gRPC server, then waits for SIGTERM/SIGINT while reaping idle
 * sessions; on a signal it shuts down gracefully (work already received
 * finishes, sessions are freed) and exits 0. With --drain-grace-s, SIGTERM
 * drains first (drain.c): new sessions refused, live ones go on until the
 * grace ends. SIGHUP re-reads the --config
 * file and applies what can change at run time (reload()). Exit 2 for bad settings, 1 when
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
  sigaddset(set, SIGHUP);
  pthread_sigmask(SIG_BLOCK, set, NULL);
  signal(SIGPIPE, SIG_IGN);
}

static void announce(const fbd_config *cfg, fbd_server *srv, fbd_log *log) {
  fb_code_cache_usage u; /* the device's bound: none for CUDA modules */
  fb_engine_code_cache(srv->engine, &u);
  fbd_logf(log, FBD_LOG_INFO,
           "fuseboxd %s serving on %s (backend %s on %s, max %d sessions, %llu bytes per "
           "session, memory budget %llu bytes, code cache %llu bytes (0: unbounded), "
           "transport memory %llu bytes, max %d calls, idle timeout %.0f s, %s)",
           FBD_VERSION, srv->addresses, srv->backend, fb_engine_device(srv->engine),
           cfg->max_sessions, (unsigned long long)cfg->session_memory_limit,
           (unsigned long long)srv->memory_budget, (unsigned long long)u.limit,
           (unsigned long long)srv->transport_memory_bytes, cfg->max_calls, cfg->idle_timeout_s,
           srv->ops->serving);
  if (cfg->ready_fd < 0) return;
  char line[sizeof srv->addresses + 2];
  int n = snprintf(line, sizeof line, "%s\n", srv->addresses);
  ssize_t w = write(cfg->ready_fd, line, (size_t)n);
  if (w != n) fbd_logf(log, FBD_LOG_WARN, "--ready-fd %d: %s", cfg->ready_fd, strerror(errno));
  close(cfg->ready_fd);
}

/* SIGHUP: read the settings again as at start-up (defaults, the --config
 * file, then the flags, which still win) and apply those that the running
 * server can change: log_level, idle_timeout_s (read by this thread's
 * reaper) and shutdown_grace_s (read by this thread at shutdown). Any other
 * change is named in a warning and waits for a restart. A file that does
 * not parse changes nothing. */
static void reload(fbd_config *cfg, fbd_log *log, int argc, char **argv) {
  if (!cfg->config_path) {
    fbd_logf(log, FBD_LOG_WARN, "SIGHUP: no --config file, nothing to reload");
    return;
  }
  fbd_config n;
  char err[FBD_ERRLEN] = "";
  fbd_config_defaults(&n);
  if (fbd_config_args(&n, argc, argv, err, sizeof err) != 0) {
    fbd_logf(log, FBD_LOG_ERROR, "SIGHUP: reload failed, keeping the running settings: %s", err);
    fbd_config_free(&n);
    return;
  }
  static const char *const reloadable[] = {"log_level", "idle_timeout_s", "shutdown_grace_s",
                                           "drain_grace_s", NULL};
  char fixed[512];
  fbd_config_changed(cfg, &n, reloadable, fixed, sizeof fixed);
  cfg->log_level = n.log_level;
  cfg->idle_timeout_s = n.idle_timeout_s;
  cfg->shutdown_grace_s = n.shutdown_grace_s;
  cfg->drain_grace_s = n.drain_grace_s; /* read by this thread when a drain begins */
  /* other threads read the level without the lock: one atomic store */
  __atomic_store_n(&log->level, n.log_level, __ATOMIC_RELAXED);
  if (*fixed)
    fbd_logf(log, FBD_LOG_WARN,
             "SIGHUP: %s changed in %s: restart fuseboxd to apply (kept the "
             "running values)",
             fixed, cfg->config_path);
  static const char *const levels[] = {"error", "warn", "info", "debug"};
  fbd_logf(log, FBD_LOG_INFO,
           "SIGHUP: reloaded %s: log_level %s, idle_timeout_s %g, "
           "shutdown_grace_s %g",
           cfg->config_path, levels[cfg->log_level & 3], cfg->idle_timeout_s,
           cfg->shutdown_grace_s);
  fbd_config_free(&n);
}

/* The drain is over (no session left, or the grace ended and the rest were
 * told so): let the sessions just ended answer their streams, up to
 * shutdown_grace_s, before the shutdown cancels what is left. */
static void drain_finish(fbd_server *srv, const fbd_config *cfg) {
  double until = fbd_now() + cfg->shutdown_grace_s;
  while (fbd_drain_sessions(srv) > 0 && fbd_now() < until) {
    usleep(20 * 1000);
    fbd_server_tick(srv);
  }
  /* and until their clients have taken the answer: a proxy that sees the
     connection close under a stream its client has not finished turns the
     status sent into a reset (HAProxy: RST_STREAM CANCEL), and the reason
     would be lost */
  for (int open = 1; open && fbd_now() < until;) {
    pthread_mutex_lock(&srv->mu);
    open = srv->ncalls > 0;
    pthread_mutex_unlock(&srv->mu);
    if (open) usleep(20 * 1000);
  }
  usleep(100 * 1000); /* the last frames on their way out */
}

/* Wait for SIGTERM or SIGINT (the shutdown's signal is returned), applying
 * SIGHUP. With drain_grace_s, SIGTERM (or a Drain RPC) drains first
 * (drain.c): until no session is left or the grace is over; a second
 * SIGTERM ends the drain at once, SIGINT shuts down at once. */
static int wait_for_signal(fbd_server *srv, fbd_config *cfg, fbd_log *log, const sigset_t *set,
                           int argc, char **argv) {
  struct timespec tick = {0, 250 * 1000 * 1000};
  double drain_end = 0; /* draining until then */
  for (;;) {
    int sig = sigtimedwait(set, NULL, &tick);
    if (sig == SIGINT) return sig;
    if (sig == SIGTERM && !drain_end && cfg->drain_grace_s <= 0) return sig;
    if (sig == SIGTERM && drain_end) {
      fbd_logf(log, FBD_LOG_INFO, "SIGTERM again: ending the drain now");
      drain_end = fbd_now();
    }
    if (!drain_end && (sig == SIGTERM || atomic_load(&srv->drain_asked))) {
      fbd_drain_begin(srv, sig == SIGTERM ? "SIGTERM" : "Drain");
      drain_end = fbd_now() + cfg->drain_grace_s;
    }
    if (drain_end) {
      if (fbd_drain_sessions(srv) == 0) {
        fbd_logf(log, FBD_LOG_INFO, "drain: no session left on replica %s", srv->replica);
        drain_finish(srv, cfg);
        return SIGTERM;
      }
      if (fbd_now() >= drain_end) {
        fbd_logf(log, FBD_LOG_INFO, "drain: the grace is over; ending the %d sessions left",
                 fbd_drain_sessions(srv));
        fbd_drain_end_rest(srv);
        drain_finish(srv, cfg);
        return SIGTERM;
      }
      tick.tv_nsec = 50 * 1000 * 1000; /* see sessions end promptly */
    }
    if (sig == SIGHUP) {
      reload(cfg, log, argc, argv);
      fbd_auth_reload(srv); /* the tenants file, with or without --config */
      fbd_tls_reload(srv);  /* and the TLS certificate, key and client CA */
    }
    fbd_server_tick(srv);
  }
}

/* fuseboxd --session-worker FD [options]: a session's worker process
 * (process isolation, server/session/worker.c), started by fuseboxd itself. */
static int session_worker(int argc, char **argv) {
  fbd_config cfg;
  char err[FBD_ERRLEN] = "";
  fbd_config_defaults(&cfg);
  char *end = NULL;
  long fd = strtol(argv[2], &end, 10);
  argv[2] = argv[0];
  if (end == argv[2] || *end || fd < 0 ||
      fbd_config_args(&cfg, argc - 2, argv + 2, err, sizeof err)) {
    fprintf(stderr, "fuseboxd --session-worker: %s\n", err[0] ? err : "bad descriptor");
    return 2;
  }
  fbd_worker_process_main((int)fd, &cfg);
  return 1;
}

int main(int argc, char **argv) {
  fbd_config cfg;
  char err[FBD_ERRLEN] = "";
  if (argc >= 3 && strcmp(argv[1], "--session-worker") == 0) return session_worker(argc, argv);
  fbd_config_defaults(&cfg);
  int rc = fbd_config_args(&cfg, argc, argv, err, sizeof err);
  if (rc) {
    if (rc < 0) fprintf(stderr, "fuseboxd: %s\n", err);
    fbd_config_free(&cfg);
    return rc < 0 ? 2 : 0;
  }
  /* the CUDA backend's memory settings, for this process and its workers */
  if (strcmp(cfg.cuda_memory, "device") && strcmp(cfg.cuda_memory, "managed")) {
    fprintf(stderr, "fuseboxd: --cuda-memory %s: use device or managed\n", cfg.cuda_memory);
    fbd_config_free(&cfg);
    return 2;
  }
  setenv("FB_CUDA_MEMORY", cfg.cuda_memory, 1);
  if (cfg.device_budget) {
    char b[32];
    snprintf(b, sizeof b, "%llu", (unsigned long long)cfg.device_budget);
    setenv("FB_CUDA_BUDGET", b, 1);
  }
  sigset_t set;
  block_signals(&set);
  /* gRPC allocates and frees megabyte read buffers all the time: keep them
   * in the heap instead of mapping fresh (page-faulting) memory each time */
  mallopt(M_MMAP_THRESHOLD, 64 << 20);
  mallopt(M_TRIM_THRESHOLD, 256 << 20);
  fbd_log log;
  fbd_log_init(&log, stderr, cfg.log_level);
  log.json = cfg.log_json;
  fbd_server *srv = NULL;
  if ((rc = fbd_server_start(&cfg, &log, &srv, err, sizeof err))) {
    fbd_logf(&log, FBD_LOG_ERROR, "cannot start: %s", err);
    fbd_log_destroy(&log);
    fbd_config_free(&cfg);
    return 1;
  }
  announce(&cfg, srv, &log);
  int sig = wait_for_signal(srv, &cfg, &log, &set, argc, argv);
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
