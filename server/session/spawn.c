/* Session processes from the broker's side: starting one (fuseboxd
 * --session-worker, in a PID namespace of its own where it may), reaping
 * one that ended or stopped answering, measuring its memory, signalling it
 * (the scheduler's SIGSTOP/SIGCONT), the spares kept started, and start,
 * tick and stop of all of it (fbd_procs_start: the walls probed first). */
#define _GNU_SOURCE
#include "server/session/proc.h"

static void describe_exit(int st, char *out, size_t n) {
  if (WIFSIGNALED(st)) {
    const char *abbr = sigabbrev_np(WTERMSIG(st));
    snprintf(out, n, "session worker died: SIG%s (signal %d)", abbr ? abbr : "?", WTERMSIG(st));
  } else if (WIFEXITED(st)) {
    snprintf(out, n, "session worker exited with status %d", WEXITSTATUS(st));
  } else {
    snprintf(out, n, "session worker ended");
  }
}

/* Reap p (killing it first when kill_it); what ended it goes to why. */
void fbd_proc_reap(fbd_proc *p, int kill_it, char *why, size_t n) {
  if (p->reaped) return;
  if (kill_it) kill(p->pid, SIGKILL);
  int st = 0;
  pid_t r;
  do r = waitpid(p->pid, &st, 0);
  while (r < 0 && errno == EINTR);
  p->reaped = 1;
  if (why && n) {
    if (r == p->pid) describe_exit(st, why, n);
    else fb_errf(why, n, "session worker lost (%s)", strerror(errno));
  }
}

/* Reap a worker that stopped answering (end of file or an error on its
 * socket). An honest worker is then already exiting: it closes its socket
 * only by ending. A compromised one may have closed the socket and gone on
 * living; a blocking waitpid would hang the session thread for good (no
 * Close, reaper or shutdown could end it). So wait at most LOST_GRACE_MS
 * for an exit of its own, then kill it; why says which it was. */
#define LOST_GRACE_MS 1000
void fbd_proc_reap_lost(fbd_proc *p, char *why, size_t n) {
  if (p->reaped) return;
  for (int waited = 0;; waited += 10) {
    int st = 0;
    pid_t r = waitpid(p->pid, &st, WNOHANG);
    if (r == p->pid) {
      p->reaped = 1;
      describe_exit(st, why, n);
      return;
    }
    if (r < 0 && errno != EINTR) break; /* not our child any more: let fbd_proc_reap say it */
    if (waited >= LOST_GRACE_MS) {
      fbd_proc_reap(p, 1, NULL, 0);
      fb_errf(why, n,
              "the session worker closed its socket to the server without exiting: "
              "it was stopped");
      return;
    }
    struct pollfd pf = {p->pidfd, POLLIN, 0}; /* readable once it exits */
    if (p->pidfd < 0 || poll(&pf, 1, 10) < 0) {
      struct timespec d = {0, 10 * 1000 * 1000};
      nanosleep(&d, NULL);
    }
  }
  fbd_proc_reap(p, 0, why, n);
}

void fbd_proc_signal(fbd_proc *p, int sig) {
#ifdef SYS_pidfd_send_signal
  if (p && p->pidfd >= 0) syscall(SYS_pidfd_send_signal, p->pidfd, sig, NULL, 0);
#else
  (void)p;
  (void)sig;
#endif
}

void fbd_proc_free(fbd_proc *p) {
  if (!p) return;
  if (p->fd >= 0) close(p->fd);
  if (p->pidfd >= 0) close(p->pidfd);
  fbd_proc_reap(p, 1, NULL, 0);
  if (p->cache_th_on) { /* the worker is gone: its socket reads EOF */
    shutdown(p->cache_fd, SHUT_RDWR);
    pthread_join(p->cache_th, NULL);
  }
  if (p->cache_fd >= 0) close(p->cache_fd);
  if (p->watch) munmap(p->watch, WATCH_BYTES);
  free(p);
}

int fbd_proc_measure(fbd_proc *p, uint64_t *bytes) {
  char path[64], buf[256];
  snprintf(path, sizeof path, "/proc/%ld/statm", (long)p->pid);
  int fd = open(path, O_RDONLY | O_CLOEXEC); /* statm is readable by all, even for a worker
                                                that is not dumpable (smaps_rollup is not) */
  if (fd < 0) return FB_EIO;
  ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  unsigned long long size = 0, resident = 0, shared = 0;
  if (n <= 0) return FB_EIO;
  buf[n] = 0;
  if (sscanf(buf, "%llu %llu %llu", &size, &resident, &shared) != 3) return FB_EIO;
  /* the pid was this worker's when read: still alive now (its pidfd not
     readable), it cannot have been reaped and the pid reused */
  struct pollfd pf = {p->pidfd, POLLIN, 0};
  if (p->reaped || (p->pidfd >= 0 && poll(&pf, 1, 0) != 0)) return FB_EIO;
  long page = sysconf(_SC_PAGESIZE);
  /* resident less file-backed and shmem pages: its anonymous memory */
  *bytes = (resident > shared ? resident - shared : 0) * (uint64_t)(page > 0 ? page : 4096);
  return 0;
}

void fbd_proc_sample(fbd_session *s) {
  uint64_t v;
  pthread_mutex_lock(&s->mu);
  if (s->proc && !fbd_proc_measure(s->proc, &v)) atomic_store(&s->worker_rss, v);
  pthread_mutex_unlock(&s->mu);
}

/* Whether a spare said its hello (readable, not read: the session that
 * takes it reads it), so that its measure is a fresh worker's. */
static int proc_ready(fbd_proc *p) {
  struct pollfd pf = {p->fd, POLLIN, 0};
  return poll(&pf, 1, 0) > 0 && (pf.revents & POLLIN);
}

/* Under pmu: measure the spares (the budget's workers part); a ready
 * spare's measure is also the charge of the next new session's worker. */
static void spares_measure(fbd_server *srv) {
  uint64_t sum = 0, fixed = srv->cfg->worker_memory_bytes;
  for (int i = 0; i < srv->nspares; i++) {
    fbd_proc *p = srv->spares[i];
    uint64_t v;
    if (fixed) p->own_bytes = fixed;
    else if (!fbd_proc_measure(p, &v)) {
      p->own_bytes = v;
      if (proc_ready(p)) atomic_store(&srv->worker_charge, v);
    }
    sum += p->own_bytes;
  }
  atomic_store(&srv->spare_bytes, sum);
}

static void arg_int(char *buf, size_t n, long long v) { snprintf(buf, n, "%lld", v); }

/* What posix_spawn does for a worker (sock on 3, the watch page's memfd
 * on 4, a session of its own, then exec), in a new PID namespace: posix_spawn has no way to ask
 * for one, and unshare(CLONE_NEWPID) would move the calling broker
 * thread's later children instead. As posix_spawn does it: clone with
 * CLONE_VM | CLONE_VFORK on a stack of its own (a fork-like clone would
 * copy the broker's page tables under its mmap lock: 10 to 140 ms for 50
 * to 500 MiB of heap, every broker thread's page faults waiting), every
 * signal blocked across it. The child shares the broker's memory, so it
 * makes system calls only (raw: no libc or sanitizer state touched, and
 * not instrumented), sets every caught signal back to its default (a
 * broker handler must not run on its stack), unblocks, and execs; the
 * broker waits (CLONE_VFORK) until it has. */
typedef struct spawn_args {
  const char *exe;
  char *const *argv;
  int sock, wfd, err;
  sigset_t mask; /* the broker thread's, for the worker */
} spawn_args;

#define SPAWN_STACK ((size_t)64 << 10)

/* The kernel's struct sigaction, x86-64's and arm64's (the generic one). */
typedef struct ksigaction {
  unsigned long handler, flags, restorer, mask;
} ksigaction;

/* fd to fd `to`, open across exec: dup3, or where it is there already
 * what dup2 would do (close-on-exec cleared). */
__attribute__((no_sanitize("address", "undefined"))) static int move_fd(int fd, int to) {
  if (fd == to) return syscall(SYS_fcntl, fd, F_SETFD, 0) < 0;
  return syscall(SYS_dup3, fd, to, 0) < 0;
}

__attribute__((no_sanitize("address", "undefined"))) static int spawn_child(void *v) {
  spawn_args *a = v;
  for (int sig = 1; sig < 65; sig++) {
    ksigaction cur = {0, 0, 0, 0}, dfl = {0, 0, 0, 0}; /* SIG_DFL is 0 */
    if (sig == SIGKILL || sig == SIGSTOP ||
        syscall(SYS_rt_sigaction, sig, NULL, &cur, sizeof(uint64_t)) < 0)
      continue;
    if (cur.handler != (unsigned long)SIG_DFL && cur.handler != (unsigned long)SIG_IGN)
      syscall(SYS_rt_sigaction, sig, &dfl, NULL, sizeof(uint64_t));
  }
  int wfd = a->wfd;
  if (wfd == 3) wfd = (int)syscall(SYS_fcntl, wfd, F_DUPFD_CLOEXEC, 5); /* sock goes there */
  if (wfd >= 0 && !move_fd(a->sock, 3) && !move_fd(wfd, 4) && syscall(SYS_setsid) >= 0 &&
      syscall(SYS_rt_sigprocmask, SIG_SETMASK, &a->mask, NULL, sizeof(uint64_t)) == 0)
    syscall(SYS_execve, a->exe, a->argv, environ);
  a->err = errno ? errno : EIO; /* the broker's errno too: it is waiting, and reads this */
  syscall(SYS_exit_group, 127);
  return 0;
}

int fbd_spawn_in_pid_ns(pid_t *pid, const char *exe, int sock, int wfd, char *const argv[]) {
  spawn_args a = {exe, argv, sock, wfd, 0, {{0}}};
  uint8_t *stack = mmap(NULL, SPAWN_STACK, PROT_READ | PROT_WRITE,
                        MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);
  if (stack == MAP_FAILED) return errno;
  sigset_t all;
  sigfillset(&all);
  pthread_sigmask(SIG_BLOCK, &all, &a.mask);
  pid_t r =
      clone(spawn_child, stack + SPAWN_STACK, CLONE_VM | CLONE_VFORK | CLONE_NEWPID | SIGCHLD, &a);
  int e = r < 0 ? errno : a.err;
  pthread_sigmask(SIG_SETMASK, &a.mask, NULL);
  munmap(stack, SPAWN_STACK);
  if (r > 0 && e) { /* it never ran fuseboxd */
    int st;
    while (waitpid(r, &st, 0) < 0 && errno == EINTR) {}
  }
  if (!e) *pid = r;
  return e;
}

/* Start a worker: fuseboxd --session-worker 3 with the settings it needs. */
static int proc_spawn(fbd_server *srv, fbd_proc **out, char *err, size_t errlen) {
  const fbd_config *cfg = srv->cfg;
  *out = NULL;
  int sv[2] = {-1, -1}, wfd = -1;
  fbd_proc *p = calloc(1, sizeof *p);
  if (!p) return FB_ENOMEM;
  p->fd = -1;
  p->pidfd = -1;
  p->cache_fd = -1;
  p->reaped = 1;
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) ||
      (wfd = memfd_create("fusebox-watch", MFD_CLOEXEC | MFD_ALLOW_SEALING)) < 0 ||
      ftruncate(wfd, WATCH_BYTES) || fbd_memfd_seal(wfd) ||
      (p->watch = mmap(NULL, WATCH_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, wfd, 0)) ==
          MAP_FAILED) {
    fb_errf(err, errlen, "cannot set up a session worker: %s", strerror(errno));
    if (p->watch == MAP_FAILED) p->watch = NULL;
    goto fail;
  }
  char cpu[24], comp[24], lim[32], over[32], stm[24], ccb[32], ubase[24], ucount[24], cto[32],
      mmb[32];
  static const char *const levels[] = {"error", "warn", "info", "debug"};
  arg_int(cpu, sizeof cpu, cfg->cpu_threads);
  arg_int(comp, sizeof comp, cfg->compile_threads);
  arg_int(lim, sizeof lim, (long long)cfg->session_memory_limit);
  arg_int(over, sizeof over, (long long)cfg->worker_overhead_bytes);
  arg_int(stm, sizeof stm, cfg->max_kernel_statements);
  arg_int(ccb, sizeof ccb, (long long)srv->code_cache_bytes);
  arg_int(ubase, sizeof ubase, (long long)cfg->worker_uid_base);
  arg_int(ucount, sizeof ucount, cfg->worker_uid_count);
  /* the decode limit of the stream's messages, decoded there only (worker.c) */
  arg_int(mmb, sizeof mmb, (long long)cfg->max_message_bytes);
  snprintf(cto, sizeof cto, "%.17g", cfg->compile_timeout_s); /* a source's parse (exec.c) */
  int per_tenant = cfg->worker_uid_base != 0;
  char *argv[] = {srv->exe,
                  "--session-worker",
                  "3",
                  "--backend",
                  (char *)srv->backend,
                  "--cpu-threads",
                  cpu,
                  "--compile-threads",
                  comp,
                  "--session-memory-limit",
                  lim,
                  "--worker-overhead-bytes",
                  over,
                  "--max-kernel-statements",
                  stm,
                  "--code-cache-bytes",
                  ccb,
                  "--compile-timeout-s",
                  cto,
                  "--max-message-bytes",
                  mmb,
                  "--log-level",
                  (char *)levels[cfg->log_level & 3],
                  "--worker-walls-off",
                  srv->walls_off, /* "" leaves it unset: every wall */
                  per_tenant           ? "--worker-uid-base"
                  : srv->worker_ids[0] ? "--worker-user"
                                       : NULL,
                  per_tenant ? ubase : srv->worker_ids, /* the worker's own form: UID:GID */
                  "--worker-uid-count",
                  ucount,
                  "--worker-namespaces",
                  srv->worker_ns >= WORKER_NS_ROOT  ? "on"
                  : srv->worker_ns >= WORKER_NS_NET ? "net"
                                                    : "off",
                  NULL};
  int rc;
  if (srv->worker_ns >= WORKER_NS_ROOT) {
    rc = fbd_spawn_in_pid_ns(&p->pid, srv->exe, sv[1], wfd, argv);
  } else {
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, sv[1], 3); /* dup2 clears close-on-exec */
    posix_spawn_file_actions_adddup2(&fa, wfd, 4);
    /* a session of its own: not in the broker's process group, so no
       signal to that group (a terminal's ^C, or one a worker contrives)
       reaches the other workers with it */
    posix_spawnattr_t at;
    posix_spawnattr_init(&at);
    posix_spawnattr_setflags(&at, POSIX_SPAWN_SETSID);
    rc = posix_spawn(&p->pid, srv->exe, &fa, &at, argv, environ);
    posix_spawnattr_destroy(&at);
    posix_spawn_file_actions_destroy(&fa);
  }
  if (rc) {
    fb_errf(err, errlen, "cannot start a session worker (%s): %s", srv->exe, strerror(rc));
    goto fail;
  }
  p->reaped = 0;
#ifdef SYS_pidfd_open
  p->pidfd = (int)syscall(SYS_pidfd_open, p->pid, 0); /* -1 on old kernels: no pausing */
#endif
  close(sv[1]);
  close(wfd);
  p->fd = sv[0];
  *out = p;
  return 0;
fail:
  if (sv[0] >= 0) close(sv[0]);
  if (sv[1] >= 0) close(sv[1]);
  if (wfd >= 0) close(wfd);
  fbd_proc_free(p);
  return FB_EINTERNAL;
}

int fbd_procs_start(fbd_server *srv, char *err, size_t errlen) {
  memset(srv->wall_state, 0, sizeof srv->wall_state);
  int urc = fbd_walls_parse(srv->cfg->test_refuse_walls, "test_refuse_walls", 1, 0, fbd_wall_inject,
                            err, errlen);
  if (!urc && srv->cfg->test_refuse_walls)
    fbd_logf(srv->log, FBD_LOG_WARN,
             "test_refuse_walls %s: the walls named are taken as refused (a test hook)",
             srv->cfg->test_refuse_walls);
  if (!urc) urc = fbd_worker_identity(srv, err, errlen);
  if (!urc) urc = fbd_worker_namespaces(srv, err, errlen);
  if (!urc) urc = fbd_walls_probe(srv, err, errlen);
  if (!urc) fbd_walls_report(srv);
  if (!urc) urc = fbd_walls_required(srv, err, errlen);
  if (urc) return urc;
  /* what the workers skip: what the kernel refused */
  srv->walls_off[0] = 0;
  for (int i = FBD_WALL_UID; i < FBD_NWALLS; i++) {
    size_t used = strlen(srv->walls_off);
    if (srv->wall_state[i] == FBD_WALL_DOWN)
      snprintf(srv->walls_off + used, sizeof srv->walls_off - used, "%s%s", used ? "," : "",
               fbd_wall_names[i]);
  }
  ssize_t n = readlink("/proc/self/exe", srv->exe, sizeof srv->exe - 1);
  if (n <= 0) {
    fb_errf(err, errlen, "process isolation: cannot find this executable: %s", strerror(errno));
    return FB_EIO;
  }
  srv->exe[n] = 0;
  if (getenv(FAULT_ENV))
    fbd_logf(srv->log, FBD_LOG_WARN,
             "%s is set: session workers will misbehave on purpose (a test hook)", FAULT_ENV);
  int want = srv->cfg->spare_workers;
  srv->spares = calloc((size_t)want + 1, sizeof *srv->spares);
  if (!srv->spares) return FB_ENOMEM;
  for (int i = 0; i < want; i++) {
    fbd_proc *p;
    int rc = proc_spawn(srv, &p, err, errlen);
    if (rc) return rc;
    srv->spares[srv->nspares++] = p;
  }
  /* a measure of a fresh worker before the first session is admitted, so
     that its worker is charged too: the first spare's, once it is ready
     (a spare with --worker-uid-base makes its engine only when taken) */
  if (want && !srv->cfg->worker_memory_bytes && !srv->cfg->worker_uid_base) {
    double t0 = fbd_now();
    while (!proc_ready(srv->spares[0]) && fbd_now() - t0 < 10) {
      struct pollfd pf = {srv->spares[0]->fd, POLLIN, 0};
      poll(&pf, 1, 50);
    }
  }
  pthread_mutex_lock(&srv->pmu);
  spares_measure(srv);
  pthread_mutex_unlock(&srv->pmu);
  return 0;
}

/* Start spares until there are spare_workers of them; a spare that died
 * (it should not) is replaced. Only the main thread starts spares: a
 * worker's parent-death signal follows the thread that started it. */
void fbd_procs_tick(fbd_server *srv) {
  if (!fbd_isolated(srv->cfg) || !srv->spares || atomic_load(&srv->stopping)) return;
  pthread_mutex_lock(&srv->pmu);
  for (int i = 0; i < srv->nspares; i++) {
    int st;
    if (waitpid(srv->spares[i]->pid, &st, WNOHANG) != srv->spares[i]->pid) continue;
    char why[128];
    describe_exit(st, why, sizeof why);
    fbd_logf(srv->log, FBD_LOG_WARN, "spare %s; starting another", why);
    srv->spares[i]->reaped = 1;
    fbd_proc_free(srv->spares[i]);
    srv->spares[i--] = srv->spares[--srv->nspares];
  }
  while (srv->nspares < srv->cfg->spare_workers) {
    fbd_proc *p;
    char err[256];
    if (proc_spawn(srv, &p, err, sizeof err)) {
      fbd_logf(srv->log, FBD_LOG_ERROR, "%s", err);
      break;
    }
    srv->spares[srv->nspares++] = p;
  }
  spares_measure(srv);
  pthread_mutex_unlock(&srv->pmu);
}

void fbd_procs_stop(fbd_server *srv) {
  pthread_mutex_lock(&srv->pmu);
  for (int i = 0; i < srv->nspares; i++) fbd_proc_free(srv->spares[i]);
  srv->nspares = 0;
  free(srv->spares);
  srv->spares = NULL;
  pthread_mutex_unlock(&srv->pmu);
}

/* A spare, or a new worker when none is left. */
int fbd_proc_take(fbd_server *srv, fbd_proc **out, char *err, size_t errlen) {
  pthread_mutex_lock(&srv->pmu);
  fbd_proc *p = srv->nspares ? srv->spares[--srv->nspares] : NULL;
  if (p) atomic_fetch_sub(&srv->spare_bytes, p->own_bytes); /* the session counts it now */
  pthread_mutex_unlock(&srv->pmu);
  if (p) {
    *out = p;
    return 0;
  }
  return proc_spawn(srv, out, err, errlen);
}
