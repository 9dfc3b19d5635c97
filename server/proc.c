/* Process isolation: each session's engine (its JIT code, device memory and
 * CUDA context) lives in a worker process of its own, so that a kernel that
 * crashes, corrupts memory or never ends can only take its own session.
 *
 * A worker is fuseboxd re-executed with --session-worker (a fresh image:
 * nothing of the broker's memory, no other session's descriptors). It makes
 * its engine, closes every descriptor but its socket and its watch page,
 * drops core dumps and ptrace access, caps its address space (RLIMIT_AS at
 * the session's memory limit plus worker_overhead_bytes) and installs a
 * seccomp filter (lock_down: an allow list for CPU workers, a deny list for
 * CUDA workers) that refuses opening files, executing programs, network
 * sockets, signalling other processes and reading their memory. Only then
 * does it read what a client sent. The broker keeps spare_workers of them
 * started, so that creating a session costs no process start.
 *
 * Wire (a unix stream socket, both ends trusted no further than checked):
 * the broker sends a request frame, the protobuf bytes of the client's
 * request as received, and for a field transfer the staging buffer's memfd
 * (SCM_RIGHTS), which the worker maps; the worker answers each request with
 * one reply frame, a message and a packed response, whose lengths the
 * broker bounds by what it asked for (reply_cap). The broker alone keeps
 * time: a task running longer than kernel_timeout_s (the watch page, shared
 * memory, says which), a RegisterKernels longer than compile_timeout_s, or
 * an aborted session whose work does not stop within a second gets the
 * worker SIGKILLed; a worker that dies ends only its session. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <pwd.h>
#include <sched.h>
#include <seccomp.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "server/server.h"
#include "server/dcache.h"

extern char **environ;

#define WIRE_MAGIC 0x46425731u /* "FBW1" */
#define WIRE_MAX_PAYLOAD ((uint64_t)1 << 31)
#define WIRE_MAX_PB ((uint64_t)1 << 30)
/* A checkpoint's stream crosses the socket in data frames (a wire_rep or,
 * broker to worker, a wire_req with this magic and pblen/len bytes after
 * it, at most DATA_MAX; to the worker a frame of 0 bytes ends the stream) */
#define DATA_MAGIC 0x46424431u /* "FBD1" */
#define DATA_MAX ((uint64_t)4 << 20)
#define PB_READ_STEP ((size_t)64 << 10) /* a reply's response is read in growing steps */
/* Protobuf encodings at their largest (reply_cap) are computed from the
 * messages' descriptors (pb_max), so that a field added to Counters or
 * SyncResult can never make a legitimate reply look oversized. */
#define HELLO_TIMEOUT_S 60.0
#define ABORT_GRACE_S 1.0
#define WATCH_BYTES 4096
#define FAULT_ENV "FUSEBOXD_FAULT_INJECT" /* a test hook: see fault_init */
/* A worker's own namespaces: no network interface but a loopback that is
 * down, and no System V IPC or POSIX message queue of anyone else
 * (WORKER_NS_NET); with WORKER_NS_ROOT also a mount namespace whose root,
 * once the engine is made, is an empty read-only tmpfs (empty_root), and
 * a PID namespace, which the broker starts it in (spawn_in_pid_ns): the
 * worker is its pid 1 and sees no other process. */
#define WORKER_NS_NET 1
#define WORKER_NS_ROOT 2
#define NS_FLAGS(level) \
  (CLONE_NEWNET | CLONE_NEWIPC | ((level) >= WORKER_NS_ROOT ? CLONE_NEWNS : 0))
/* Where the empty root is mounted before pivot_root moves it to "/": a
 * directory every Linux host has, covered only in the worker's own mount
 * namespace (private: nothing it mounts shows outside). */
#define ROOT_STAGE "/tmp"

#if defined(__SANITIZE_ADDRESS__)
#define FBD_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define FBD_ASAN 1
#endif
#endif

struct fbd_proc {
  pid_t pid;
  int cache_fd;             /* the compile cache's socket to the worker (-1: none) */
  pthread_t cache_th;       /* ... and the thread that serves it */
  int cache_th_on;
  int pidfd;                /* for the scheduler's SIGSTOP/SIGCONT; -1 when none */
  int fd;                   /* the socket to the worker */
  fbd_watch *watch;         /* the page shared with it */
  int reaped;
  uint64_t unsynced;        /* launches sent since its last SyncResult (reply_cap) */
  uint64_t own_bytes;       /* a spare's: its last measure (fbd_proc_measure), under pmu */
};

typedef struct wire_req {
  uint32_t magic;
  int32_t kind;
  int32_t field;
  uint32_t has_fd;
  uint64_t len;             /* payload bytes that follow */
  uint64_t buflen;          /* WRITE/READ: bytes of the memfd's field data */
} wire_req;

/* CREATE's payload starts with the session's settings, as the broker
 * decided them (the server's limits applied); the CreateSessionRequest
 * follows, whose layout the worker converts and checks itself. */
typedef struct wire_create {
  uint64_t seed, memory_limit;
  uint32_t passes;
  int32_t flush_every, max_fuse_per_task, max_kernel_statements;
  char mode[8];
  char tag[16];
} wire_create;

/* With --worker-uid-base, the first frame a spare reads, when a session
 * takes it: the ids of the session's tenant (the broker's word; the worker
 * checks them against the range it was started with). */
#define IDENT_MAGIC 0x46424931u /* "FBI1" */
typedef struct wire_ident {
  uint32_t magic, uid, gid, pad;
} wire_ident;

typedef struct wire_rep {
  uint32_t magic;
  int32_t code;
  uint32_t finish, fatal;
  uint32_t registered, pad; /* RegisterKernels: how many it registered */
  uint64_t msglen, pblen;
  fb_counters counters;
} wire_rep;

/* ---------------------------------------------------------------- I/O */

static double mono(void) { return fbd_now(); }

/* A broker's deadline for moving one frame to or from a worker. Once a reply
 * has begun (or a request is being sent) its bytes are in memory at the
 * other end, so a worker that stalls mid-frame is stuck or compromised: it
 * must not hold a broker thread. Time the fair scheduler held the session
 * (the worker SIGSTOPped) does not count. The worker's own reads and
 * writes have no clock (NULL): they block, and the broker's end is its end. */
typedef struct frame_clock {
  fbd_session *s; /* whose held time is excluded; NULL: none */
  double t0, held0, limit_s;
} frame_clock;

static frame_clock clock_start(fbd_session *s, double limit_s) {
  frame_clock c = {s, mono(), s ? fbd_sched_held(s) : 0, limit_s};
  return c;
}

static int clock_past(const frame_clock *c) {
  if (!c) return 0;
  double held = c->s ? fbd_sched_held(c->s) - c->held0 : 0;
  return mono() - c->t0 - held > c->limit_s;
}

/* With a clock: FB_ETIMEOUT once it has passed. */
static int write_all(int fd, const void *p, size_t n, const frame_clock *clk) {
  const uint8_t *b = p;
  while (n) {
    ssize_t w = send(fd, b, n, MSG_NOSIGNAL | (clk ? MSG_DONTWAIT : 0));
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (clock_past(clk)) return FB_ETIMEOUT;
      struct pollfd pf = {fd, POLLOUT, 0};
      poll(&pf, 1, 50);
      continue;
    }
    if (w <= 0) return FB_EIO;
    b += w;
    n -= (size_t)w;
  }
  return 0;
}

/* Send head (with fd attached when fd >= 0), then body, within clk. */
static int send_frame(int fd, const void *head, size_t hn, int pass_fd, const void *body, size_t bn,
                      const frame_clock *clk) {
  struct iovec iov = {(void *)head, hn};
  union {
    char buf[CMSG_SPACE(sizeof(int))];
    struct cmsghdr align;
  } u;
  struct msghdr mh;
  memset(&mh, 0, sizeof mh);
  mh.msg_iov = &iov;
  mh.msg_iovlen = 1;
  if (pass_fd >= 0) {
    memset(&u, 0, sizeof u);
    mh.msg_control = u.buf;
    mh.msg_controllen = sizeof u.buf;
    struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(cm), &pass_fd, sizeof(int));
  }
  ssize_t w;
  for (;;) { /* nothing went yet: the fd rides on the first byte */
    w = sendmsg(fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w >= 0 || errno == EINTR) {
      if (w >= 0) break;
      continue;
    }
    if (errno != EAGAIN && errno != EWOULDBLOCK) return FB_EIO;
    if (clock_past(clk)) return FB_ETIMEOUT;
    struct pollfd pf = {fd, POLLOUT, 0};
    poll(&pf, 1, 50);
  }
  if (w == 0) return FB_EIO;
  int rc = 0;
  if ((size_t)w < hn) rc = write_all(fd, (const uint8_t *)head + w, hn - (size_t)w, clk);
  return rc ? rc : bn ? write_all(fd, body, bn, clk) : 0;
}

/* Wait until fd is readable: spin (yielding) for spin_s first, then poll in
 * steps of at most step_ms. 1 readable, 0 the step passed. */
static int wait_readable(int fd, double spin_s, int step_ms) {
  struct pollfd pf = {fd, POLLIN, 0};
  if (spin_s > 0) {
    double t0 = mono();
    do {
      if (poll(&pf, 1, 0) > 0) return 1;
      sched_yield();
    } while (mono() - t0 < spin_s);
  }
  int r = poll(&pf, 1, step_ms);
  return r > 0 || (r < 0 && errno != EINTR);
}

/* Read exactly n bytes; *fdout gets an fd passed with them. Without a clock
 * it blocks; with one it gives FB_ETIMEOUT once the clock has passed. */
static int read_all(int fd, void *p, size_t n, int *fdout, const frame_clock *clk) {
  uint8_t *b = p;
  while (n) {
    struct iovec iov = {b, n};
    union {
      char buf[CMSG_SPACE(sizeof(int))];
      struct cmsghdr align;
    } u;
    struct msghdr mh;
    memset(&mh, 0, sizeof mh);
    mh.msg_iov = &iov;
    mh.msg_iovlen = 1;
    if (fdout) {
      mh.msg_control = u.buf;
      mh.msg_controllen = sizeof u.buf;
    }
    ssize_t r = recvmsg(fd, &mh, MSG_CMSG_CLOEXEC | (clk ? MSG_DONTWAIT : 0));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (clock_past(clk)) return FB_ETIMEOUT;
      struct pollfd pf = {fd, POLLIN, 0};
      poll(&pf, 1, 50);
      continue;
    }
    if (r <= 0) return FB_EIO;
    if (fdout) {
      for (struct cmsghdr *cm = CMSG_FIRSTHDR(&mh); cm; cm = CMSG_NXTHDR(&mh, cm))
        if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS) {
          int got;
          memcpy(&got, CMSG_DATA(cm), sizeof got);
          if (*fdout >= 0) close(got); /* one fd per frame */
          else *fdout = got;
        }
    }
    b += r;
    n -= (size_t)r;
  }
  return 0;
}

/* ---------------------------------------------------------------- broker: processes */

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
static void proc_reap(fbd_proc *p, int kill_it, char *why, size_t n) {
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
static void proc_reap_lost(fbd_proc *p, char *why, size_t n) {
  if (p->reaped) return;
  for (int waited = 0;; waited += 10) {
    int st = 0;
    pid_t r = waitpid(p->pid, &st, WNOHANG);
    if (r == p->pid) {
      p->reaped = 1;
      describe_exit(st, why, n);
      return;
    }
    if (r < 0 && errno != EINTR) break; /* not our child any more: let proc_reap say it */
    if (waited >= LOST_GRACE_MS) {
      proc_reap(p, 1, NULL, 0);
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
  proc_reap(p, 0, why, n);
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
  proc_reap(p, 1, NULL, 0);
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

static int spawn_in_pid_ns(pid_t *pid, const char *exe, int sock, int wfd, char *const argv[]) {
  spawn_args a = {exe, argv, sock, wfd, 0, {{0}}};
  uint8_t *stack =
      mmap(NULL, SPAWN_STACK, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);
  if (stack == MAP_FAILED) return errno;
  sigset_t all;
  sigfillset(&all);
  pthread_sigmask(SIG_BLOCK, &all, &a.mask);
  pid_t r = clone(spawn_child, stack + SPAWN_STACK, CLONE_VM | CLONE_VFORK | CLONE_NEWPID | SIGCHLD,
                  &a);
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
  char cpu[24], comp[24], lim[32], over[32], stm[24], ccb[32], ubase[24], ucount[24], cto[32];
  static const char *const levels[] = {"error", "warn", "info", "debug"};
  arg_int(cpu, sizeof cpu, cfg->cpu_threads);
  arg_int(comp, sizeof comp, cfg->compile_threads);
  arg_int(lim, sizeof lim, (long long)cfg->session_memory_limit);
  arg_int(over, sizeof over, (long long)cfg->worker_overhead_bytes);
  arg_int(stm, sizeof stm, cfg->max_kernel_statements);
  arg_int(ccb, sizeof ccb, (long long)srv->code_cache_bytes);
  arg_int(ubase, sizeof ubase, (long long)cfg->worker_uid_base);
  arg_int(ucount, sizeof ucount, cfg->worker_uid_count);
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
    rc = spawn_in_pid_ns(&p->pid, srv->exe, sv[1], wfd, argv);
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

/* The user named by worker_user (a name, else a number): 0 and *pw, or
 * FB_EINVAL naming it. */
static int find_user(const char *name, struct passwd *pw, char *buf, size_t n, char *err,
                     size_t errlen) {
  struct passwd *found = NULL;
  int e = getpwnam_r(name, pw, buf, n, &found);
  if (!found) {
    char *end = NULL;
    errno = 0;
    unsigned long uid = strtoul(name, &end, 10);
    if (*name >= '0' && *name <= '9' && !*end && !errno && uid < (uid_t)-1)
      e = getpwuid_r((uid_t)uid, pw, buf, n, &found);
  }
  if (!found) {
    fb_errf(err, errlen, "worker_user '%s': no such user%s%s", name, e ? ": " : "",
            e ? strerror(e) : "");
    return FB_EINVAL;
  }
  return 0;
}

/* A passwd or group entry whose id is in [lo, hi]: its name and id, or 0.
 * What getpwent and getgrent enumerate: the local files, and a directory
 * service only where it is set to enumerate. */
static int id_taken(uint32_t lo, uint32_t hi, const char **what, char *name, size_t n,
                    unsigned long *id) {
  int found = 0;
  setpwent();
  for (struct passwd *pw; !found && (pw = getpwent());)
    if (pw->pw_uid >= lo && pw->pw_uid <= hi) {
      snprintf(name, n, "%s", pw->pw_name);
      *id = pw->pw_uid;
      *what = "uid";
      found = 1;
    }
  endpwent();
  setgrent();
  for (struct group *gr; !found && (gr = getgrent());)
    if (gr->gr_gid >= lo && gr->gr_gid <= hi) {
      snprintf(name, n, "%s", gr->gr_name);
      *id = gr->gr_gid;
      *what = "gid";
      found = 1;
    }
  endgrent();
  return found;
}

/* --worker-uid-base: workers of tenant k (auth.c's worker_slot) run as uid
 * and gid base + k, so that one tenant's worker cannot signal or trace
 * another's even past a hole in its seccomp filter. The range must be
 * fuseboxd's alone: ids of no user or group in passwd and group (another
 * process with such a uid could signal the workers), never 0, and only a
 * root fuseboxd can hand them out. The tenants' count against it is
 * checked as the tenants file is read (auth.c). */
static int worker_range(fbd_server *srv, char *err, size_t errlen) {
  const fbd_config *cfg = srv->cfg;
  uint64_t base = cfg->worker_uid_base, count = (uint64_t)cfg->worker_uid_count;
  if (cfg->worker_user) {
    fb_errf(err, errlen,
            "worker_user '%s' and worker_uid_base %lu both name the workers' user: give one",
            cfg->worker_user, (unsigned long)base);
    return FB_EINVAL;
  }
  if (geteuid() != 0) {
    fb_errf(err, errlen,
            "worker_uid_base %lu: fuseboxd runs as uid %lu, not root, and cannot switch its "
            "workers to other users (leave worker_uid_base unset)",
            (unsigned long)base, (unsigned long)geteuid());
    return FB_EINVAL;
  }
  if (count < 1 || base + count - 1 >= 0xffffffffull) {
    fb_errf(err, errlen,
            "worker_uid_count %lu: give how many uids from worker_uid_base %lu fuseboxd may "
            "use, at least 1 (sessions without a tenant) and at most %llu",
            (unsigned long)count, (unsigned long)base, 0xfffffffeull - base + 1);
    return FB_EINVAL;
  }
  const char *what = "";
  char name[256];
  unsigned long id = 0;
  uint32_t hi = (uint32_t)(base + count - 1);
  if (id_taken((uint32_t)base, hi, &what, name, sizeof name, &id)) {
    fb_errf(err, errlen,
            "worker_uid_base %lu, worker_uid_count %lu: %s %lu ('%s') is in the range %lu..%lu; "
            "the workers' ids must be no user's or group's (its processes could signal them)",
            (unsigned long)base, (unsigned long)count, what, id, name, (unsigned long)base,
            (unsigned long)hi);
    return FB_EINVAL;
  }
  fbd_logf(srv->log, FBD_LOG_INFO,
           "session workers run as a uid and gid of their tenant's own: %lu..%lu (%lu for "
           "sessions without a tenant), no supplementary groups",
           (unsigned long)base, (unsigned long)hi, (unsigned long)base);
  return 0;
}

static int walls_parse(const char *list, const char *shown, int with_errno, int allow_all,
                       int out[FBD_NWALLS], char *err, size_t errlen);

int fbd_procs_check(const fbd_config *cfg, char *err, size_t errlen) {
  int tmp[FBD_NWALLS];
  if ((cfg->require_walls || cfg->strict_sandbox || cfg->test_refuse_walls) &&
      !fbd_isolated(cfg)) {
    fb_errf(err, errlen,
            "%s needs isolation process: under isolation thread there are no workers and no "
            "sandbox walls",
            cfg->strict_sandbox ? "strict_sandbox"
            : cfg->require_walls ? "require_walls"
                                 : "test_refuse_walls");
    return FB_EINVAL;
  }
  if (cfg->worker_walls_off) {
    fb_errf(err, errlen,
            "worker_walls_off is what fuseboxd tells its own workers; to require walls, use "
            "require_walls");
    return FB_EINVAL;
  }
  if (walls_parse(cfg->require_walls, "require_walls", 0, 1, tmp, err, errlen) ||
      walls_parse(cfg->test_refuse_walls, "test_refuse_walls", 1, 0, tmp, err, errlen))
    return FB_EINVAL;
  if (cfg->worker_uid_count && !cfg->worker_uid_base) {
    fb_errf(err, errlen, "worker_uid_count %d without worker_uid_base: give both, or neither",
            cfg->worker_uid_count);
    return FB_EINVAL;
  }
  if (cfg->worker_uid_base && !fbd_isolated(cfg)) {
    fb_errf(err, errlen,
            "worker_uid_base %lu needs isolation process: under isolation thread there are no "
            "workers to run as tenants' users",
            (unsigned long)cfg->worker_uid_base);
    return FB_EINVAL;
  }
  return 0;
}

/* Who the workers run as (srv->worker_ids). A worker runs a tenant's JIT
 * code: started as root, fuseboxd has them switch to worker_user (default
 * nobody), which must not be root's uid or gid; started as another user,
 * the workers keep it (an unprivileged process cannot switch users), and a
 * worker_user naming someone else is refused rather than ignored.
 * With worker_uid_base, worker_range instead. */
static int worker_identity(fbd_server *srv, char *err, size_t errlen) {
  const char *want = srv->cfg->worker_user;
  srv->worker_ids[0] = 0;
  if (srv->cfg->worker_uid_base) return worker_range(srv, err, errlen);
  if (geteuid() != 0 && !want) {
    fbd_logf(srv->log, FBD_LOG_INFO,
             "session workers run as fuseboxd's user (uid %lu): it was not started as root",
             (unsigned long)geteuid());
    return 0;
  }
  struct passwd pw;
  char buf[4096];
  int rc = find_user(want ? want : "nobody", &pw, buf, sizeof buf, err, errlen);
  if (rc) return rc;
  if (geteuid() != 0) {
    if (pw.pw_uid == geteuid() && pw.pw_gid == getegid()) return 0;
    fb_errf(err, errlen,
            "worker_user '%s': fuseboxd runs as uid %lu, not root, and cannot switch its "
            "workers to another user (leave worker_user unset)",
            want, (unsigned long)geteuid());
    return FB_EINVAL;
  }
  if (pw.pw_uid == 0 || pw.pw_gid == 0) {
    fb_errf(err, errlen,
            "worker_user '%s' is uid %lu, gid %lu: workers would run as root; name an "
            "unprivileged user",
            want ? want : "nobody", (unsigned long)pw.pw_uid, (unsigned long)pw.pw_gid);
    return FB_EINVAL;
  }
  snprintf(srv->worker_ids, sizeof srv->worker_ids, "%lu:%lu", (unsigned long)pw.pw_uid,
           (unsigned long)pw.pw_gid);
  fbd_logf(srv->log, FBD_LOG_INFO,
           "session workers run as user '%s' (uid %lu, gid %lu, no supplementary groups)",
           pw.pw_name, (unsigned long)pw.pw_uid, (unsigned long)pw.pw_gid);
  return 0;
}

/* ---------------------------------------------------------------- the sandbox walls
 *
 * Each wall a worker raises (docs/security.md, "Sandboxes that refuse a
 * wall") is tried once at start, by the broker, in a child that raises it
 * as a worker would (ns_probe, walls_probe). Where the kernel refuses one
 * (EPERM, EINVAL, ENOSYS: a container without CAP_SYS_ADMIN, gVisor, a
 * kernel built without seccomp), fuseboxd logs one line naming the wall,
 * the error and what is lost, shows it in /metrics and /readyz, and tells
 * every worker to go on without it (--worker-walls-off); a wall that was
 * raised at start and fails in a worker still fails that worker, as
 * before. require_walls (or strict_sandbox: all of them) turns a refusal
 * into a refusal to start. */
const char *const fbd_wall_names[FBD_NWALLS] = {"netns",   "rootns",       "uid",
                                                "rlimits", "no_new_privs", "seccomp"};

/* what a worker is without each wall */
static const char *const wall_lost[FBD_NWALLS] = {
    "workers share fuseboxd's network and IPC namespaces: a worker past its seccomp filter "
    "could open network connections and reach other processes' System V IPC",
    "workers see fuseboxd's files and processes by path (no empty root, no PID namespace of "
    "their own)",
    "workers keep fuseboxd's user, root: a worker past its seccomp filter could signal or "
    "trace other workers and open what root can",
    "workers' core dumps, address space and open descriptors are not capped",
    "a worker could gain privileges by executing a set-user-ID program were its filter to let "
    "execve through (and the filter then needs CAP_SYS_ADMIN)",
    "tenant code runs without the system-call filter"};

/* --test-refuse-walls (a test hook, given explicitly): errno each wall's
 * probe is to take as the kernel's answer instead of trying it; 0: try */
static int wall_inject[FBD_NWALLS];

static int wall_index(const char *name, size_t n) {
  for (int i = 0; i < FBD_NWALLS; i++)
    if (strlen(fbd_wall_names[i]) == n && !strncmp(fbd_wall_names[i], name, n)) return i;
  return -1;
}

/* "a,b:EINVAL,c" (errnos only where with_errno) into out[] (1, or the
 * errno; EPERM where none is given); "all" where allow_all. */
static int walls_parse(const char *list, const char *shown, int with_errno, int allow_all,
                       int out[FBD_NWALLS], char *err, size_t errlen) {
  static const struct {
    const char *name;
    int e;
  } errnos[] = {{"EPERM", EPERM}, {"EINVAL", EINVAL}, {"ENOSYS", ENOSYS}, {"EACCES", EACCES}};
  memset(out, 0, sizeof(int) * FBD_NWALLS);
  if (!list) return 0;
  if (allow_all && !strcmp(list, "all")) {
    for (int i = 0; i < FBD_NWALLS; i++) out[i] = 1;
    return 0;
  }
  for (const char *p = list; *p;) {
    size_t n = strcspn(p, ",:");
    int i = wall_index(p, n), e = with_errno ? EPERM : 1;
    if (i < 0) {
      fb_errf(err, errlen,
              "%s: unknown wall '%.*s' (expected netns, rootns, uid, rlimits, no_new_privs or "
              "seccomp%s)",
              shown, (int)n, p, allow_all ? ", or all" : "");
      return FB_EINVAL;
    }
    p += n;
    if (*p == ':') {
      size_t m = strcspn(++p, ",");
      e = 0;
      for (size_t k = 0; with_errno && k < sizeof errnos / sizeof *errnos; k++)
        if (strlen(errnos[k].name) == m && !strncmp(errnos[k].name, p, m)) e = errnos[k].e;
      if (!e) {
        fb_errf(err, errlen, "%s: wall %s: '%.*s' is not one of EPERM, EINVAL, ENOSYS, EACCES",
                shown, fbd_wall_names[i], (int)m, p);
        return FB_EINVAL;
      }
      p += m;
    }
    out[i] = e;
    if (*p == ',') p++;
  }
  return 0;
}

/* The walls still up, for a refusal's log line: "uid, seccomp" or "none". */
static void walls_up_list(const fbd_server *srv, char *out, size_t n) {
  out[0] = 0;
  for (int i = 0; i < FBD_NWALLS; i++) {
    size_t used = strlen(out);
    if (srv->wall_state[i] == FBD_WALL_UP)
      snprintf(out + used, n - used, "%s%s", used ? ", " : "", fbd_wall_names[i]);
  }
  if (!out[0]) snprintf(out, n, "none");
}

static char wall_step[FBD_NWALLS][64]; /* where a refused wall failed, for its log line */

static void wall_refused(fbd_server *srv, int i, int e, const char *step) {
  srv->wall_state[i] = FBD_WALL_DOWN;
  srv->wall_errno[i] = e;
  snprintf(wall_step[i], sizeof wall_step[i], "%s", step ? step : "");
}

/* Once every wall was tried: a line for each refused one, and one in all. */
static void walls_report(fbd_server *srv) {
  char up[128];
  walls_up_list(srv, up, sizeof up);
  for (int i = 0; i < FBD_NWALLS; i++)
    if (srv->wall_state[i] == FBD_WALL_DOWN)
      /* namespaces, which only root can have, refused to another user: info */
      fbd_logf(srv->log, i <= FBD_WALL_ROOTNS && geteuid() != 0 ? FBD_LOG_INFO : FBD_LOG_WARN,
               "sandbox wall %s refused (%s%s%s): %s; walls still up: %s",
               fbd_wall_names[i], wall_step[i], wall_step[i][0] ? ": " : "",
               strerror(srv->wall_errno[i]), wall_lost[i], up);
  char down[256], off[128] = "";
  fbd_walls_text(srv, down, sizeof down);
  for (int i = 0; i < FBD_NWALLS; i++) {
    size_t used = strlen(off);
    if (srv->wall_state[i] == FBD_WALL_OFF)
      snprintf(off + used, sizeof off - used, "%s%s", used ? ", " : "", fbd_wall_names[i]);
  }
  fbd_logf(srv->log, FBD_LOG_INFO, "sandbox walls up: %s; refused: %s; not asked for: %s", up,
           down[0] ? down : "none", off[0] ? off : "none");
}

void fbd_walls_text(const fbd_server *srv, char *out, size_t n) {
  if (n) out[0] = 0;
  for (int i = 0; i < FBD_NWALLS; i++) {
    size_t used = strlen(out);
    if (srv->wall_state[i] == FBD_WALL_DOWN && used + 1 < n)
      snprintf(out + used, n - used, "%s%s (refused: %s)", used ? ", " : "", fbd_wall_names[i],
               strerror(srv->wall_errno[i]));
  }
}

/* The worker's side of its namespaces, in two steps. ns_enter, first thing,
 * while the worker is one thread (unshare moves only the calling thread;
 * the engine's threads, made later, inherit): the new namespaces, and for
 * a mount namespace every mount made private, so that what the worker
 * mounts never shows in fuseboxd's namespace. empty_root, once everything
 * the worker reads from disk is open (the engine made: LLVM, the CUDA
 * driver and what it opens), while it is still root: a tmpfs with nothing
 * in it becomes the root of the mount namespace (pivot_root moves every
 * thread's root and working directory), the host's root is detached, and
 * the tmpfs made read-only. Past seccomp, a worker then finds no file of
 * the host by path: no /proc, /dev, /etc or /home. Descriptors opened
 * before (a CUDA driver's /dev/nvidia*) stay open. Plain syscalls only:
 * ns_probe runs both in a child cloned from a threaded process. 0, or
 * errno with *step an index of ns_steps, naming what failed. */
static const char *const ns_steps[] = {"unshare",
                                       "make the mounts private",
                                       "mount a tmpfs on " ROOT_STAGE,
                                       "pivot_root",
                                       "detach the host's root",
                                       "make the root read-only"};
#define NS_NSTEPS ((int)(sizeof ns_steps / sizeof *ns_steps))

static int ns_enter(int level, int *step) {
  *step = 0;
  if (unshare(NS_FLAGS(level))) return errno;
  *step = 1;
  if (level >= WORKER_NS_ROOT && mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL)) return errno;
  return 0;
}

static int empty_root(int *step) {
  const unsigned long flags = MS_NOSUID | MS_NODEV | MS_NOEXEC;
  *step = 2;
  if (mount("fusebox-empty", ROOT_STAGE, "tmpfs", flags, "size=4k,nr_inodes=2,mode=0555"))
    return errno;
  /* pivot_root(2)'s own recipe: the old root goes on top of the new one,
     and is detached from there */
  *step = 3;
  if (chdir(ROOT_STAGE) || syscall(SYS_pivot_root, ".", ".")) return errno;
  *step = 4;
  if (umount2(".", MNT_DETACH) || chdir("/")) return errno;
  *step = 5;
  if (mount(NULL, "/", NULL, MS_REMOUNT | MS_BIND | MS_RDONLY | flags, NULL)) return errno;
  return 0;
}

/* Whether this process may give workers the namespaces of level: a child
 * cloned into them that makes its empty root and leaves (0, or why not:
 * EPERM without CAP_SYS_ADMIN, EINVAL on a kernel without them or with
 * its root on the initial ramfs, which pivot_root cannot move). Raw clone:
 * the child runs nothing but syscalls, so no fork handler of a threaded
 * process. */
static int ns_probe(int level, const char **step) {
  *step = ns_steps[0];
  int pfd[2];
  if (pipe2(pfd, O_CLOEXEC)) return errno;
  unsigned long pidns = level >= WORKER_NS_ROOT ? CLONE_NEWPID : 0; /* spawn_in_pid_ns's */
  long pid = syscall(SYS_clone, pidns | SIGCHLD, NULL, NULL, NULL, NULL);
  if (pid < 0) {
    int e = errno;
    close(pfd[0]);
    close(pfd[1]);
    if (pidns) *step = "clone into a PID namespace";
    return e;
  }
  if (pid == 0) { /* the step, then errno */
    int msg[2] = {0, 0};
    msg[1] = ns_enter(level, &msg[0]);
    if (!msg[1] && level >= WORKER_NS_ROOT) msg[1] = empty_root(&msg[0]);
    if (write(pfd[1], msg, sizeof msg) < 0) syscall(SYS_exit_group, 1);
    syscall(SYS_exit_group, 0);
  }
  close(pfd[1]);
  int msg[2] = {0, ECHILD};
  ssize_t got;
  do got = read(pfd[0], msg, sizeof msg);
  while (got < 0 && errno == EINTR);
  close(pfd[0]);
  int st;
  while (waitpid((pid_t)pid, &st, 0) < 0 && errno == EINTR) {}
  if (got != (ssize_t)sizeof msg) return ECHILD;
  *step = ns_steps[msg[0] >= 0 && msg[0] < NS_NSTEPS ? msg[0] : 0];
  return msg[1];
}

/* worker_namespaces: "off"; "net" (a network and an IPC namespace); "on"
 * (those, a mount namespace with an empty root and a PID namespace: the
 * kernel must allow it, or no start); "auto" (as much of "on" as it
 * allows: root with CAP_SYS_ADMIN, and a root that pivot_root can move). A worker needs no
 * network (its socket to the broker was made before), no System V IPC and
 * no file once its engine is made (seccomp refuses opening one anyway);
 * its own namespaces take those from a worker that got past its seccomp
 * filter (the CUDA workers' is a deny list). */
/* ns_probe, or the refusal --test-refuse-walls asks for */
static int ns_try(int level, const char **step) {
  int e = wall_inject[FBD_WALL_NETNS];
  if (!e && level >= WORKER_NS_ROOT) e = wall_inject[FBD_WALL_ROOTNS];
  if (e) {
    *step = ns_steps[0];
    return e;
  }
  return ns_probe(level, step);
}

static int worker_namespaces(fbd_server *srv, char *err, size_t errlen) {
  const char *want = srv->cfg->worker_namespaces ? srv->cfg->worker_namespaces : "auto";
  srv->worker_ns = 0;
  if (!strcmp(want, "off")) return 0;
  int top = !strcmp(want, "net") ? WORKER_NS_NET : WORKER_NS_ROOT;
  const char *step = "", *root_step = "";
  int e = ns_try(top, &step), root_e = 0;
  if (e && top == WORKER_NS_ROOT && strcmp(want, "on")) { /* auto: the network ones alone? */
    root_e = e;
    root_step = step;
    top = WORKER_NS_NET;
    e = ns_try(top, &step);
  }
  if (e && strcmp(want, "auto")) {
    fb_errf(err, errlen,
            "worker_namespaces %s: cannot make %s: %s: %s (they need root with CAP_SYS_ADMIN; "
            "worker_namespaces auto runs workers without what the kernel refuses)",
            want,
            top == WORKER_NS_ROOT ? "a network, an IPC, a mount (with an empty root) and a PID "
                                    "namespace"
                                  : "a network and an IPC namespace",
            step, strerror(e));
    return FB_EINVAL;
  }
  /* a refusal is logged with the other walls' (walls_report): as root, a
     warning; not as root, where no namespace could be expected, as info */
  if (e) {
    wall_refused(srv, FBD_WALL_NETNS, e, step);
    wall_refused(srv, FBD_WALL_ROOTNS, root_e ? root_e : e, root_e ? root_step : step);
  } else if (top == WORKER_NS_ROOT) {
    srv->wall_state[FBD_WALL_NETNS] = srv->wall_state[FBD_WALL_ROOTNS] = FBD_WALL_UP;
    fbd_logf(srv->log, FBD_LOG_INFO,
             "session workers run in a network, an IPC, a mount and a PID namespace of their own "
             "each, the mount namespace's root an empty read-only directory");
  } else if (root_e) {
    srv->wall_state[FBD_WALL_NETNS] = FBD_WALL_UP;
    wall_refused(srv, FBD_WALL_ROOTNS, root_e, root_step);
  } else {
    srv->wall_state[FBD_WALL_NETNS] = FBD_WALL_UP;
    fbd_logf(srv->log, FBD_LOG_INFO,
             "session workers run in a network and an IPC namespace of their own each, and see "
             "fuseboxd's files (worker_namespaces net)");
  }
  srv->worker_ns = e ? 0 : top;
  return 0;
}

/* The seccomp filter as lock_down would install it, exported as BPF for
 * walls_probe's child (which makes no library call): 0, or a libseccomp
 * error. *prog's filter is malloc'd. */
static int lock_build(const char *backend, int nnp, scmp_filter_ctx *out);

static int lock_export(const char *backend, struct sock_fprog *prog) {
  scmp_filter_ctx ctx;
  int rc = lock_build(backend, 1, &ctx);
  if (rc) return rc;
  int fd = memfd_create("fusebox-bpf", MFD_CLOEXEC);
  struct stat st = {0};
  rc = fd < 0 ? -errno : seccomp_export_bpf(ctx, fd);
  seccomp_release(ctx);
  if (!rc && (fstat(fd, &st) || st.st_size <= 0 || st.st_size % sizeof(struct sock_filter) ||
              !(prog->filter = malloc((size_t)st.st_size)) ||
              pread(fd, prog->filter, (size_t)st.st_size, 0) != st.st_size))
    rc = -EIO;
  if (!rc) prog->len = (unsigned short)(st.st_size / sizeof(struct sock_filter));
  if (fd >= 0) close(fd);
  return rc;
}

#define WORKER_NOFILE_CPU 64
#define WORKER_NOFILE_CUDA 1024

/* The walls after the namespaces, tried in a child as a worker raises
 * them, in its order: the switch to the workers' user (where there is
 * one), resource limits, no_new_privs, the seccomp filter. Raw clone and
 * plain system calls, as in ns_probe. */
static int walls_probe(fbd_server *srv, char *err, size_t errlen) {
  const fbd_config *cfg = srv->cfg;
  unsigned long uid = 0, gid = 0;
  int want_uid = 1;
  if (cfg->worker_uid_base) uid = gid = cfg->worker_uid_base;
  else if (srv->worker_ids[0]) want_uid = sscanf(srv->worker_ids, "%lu:%lu", &uid, &gid) == 2;
  else want_uid = 0; /* not root: the workers keep fuseboxd's user */
  struct sock_fprog prog = {0, NULL};
  int rc = lock_export(srv->backend, &prog);
  if (rc) {
    fb_errf(err, errlen, "cannot build the seccomp filter: %s", strerror(-rc));
    free(prog.filter);
    return FB_EINTERNAL;
  }
  rlim_t nofile = strcmp(srv->backend, "cpu") ? WORKER_NOFILE_CUDA : WORKER_NOFILE_CPU;
  int pfd[2];
  if (pipe2(pfd, O_CLOEXEC)) {
    fb_errf(err, errlen, "cannot try the sandbox walls: %s", strerror(errno));
    free(prog.filter);
    return FB_EINTERNAL;
  }
  long pid = syscall(SYS_clone, SIGCHLD, NULL, NULL, NULL, NULL);
  if (pid == 0) { /* uid, rlimits, no_new_privs, seccomp: 0 or errno */
    int r[4] = {0, 0, 0, 0};
    const int *inj = wall_inject + FBD_WALL_UID;
    if (want_uid)
      r[0] = inj[0] ? inj[0]
             : syscall(SYS_setgroups, 0, NULL) || syscall(SYS_setresgid, gid, gid, gid) ||
                     syscall(SYS_setresuid, uid, uid, uid)
                 ? errno
                 : 0;
    struct rlimit none = {0, 0}, cur = {0, 0}, lim;
    if (inj[1]) r[1] = inj[1];
    else if (syscall(SYS_prlimit64, 0, RLIMIT_CORE, &none, NULL) ||
             syscall(SYS_prlimit64, 0, RLIMIT_NOFILE, NULL, &cur))
      r[1] = errno;
    else {
      lim.rlim_cur = lim.rlim_max =
          cur.rlim_max != RLIM_INFINITY && cur.rlim_max < nofile ? cur.rlim_max : nofile;
      r[1] = syscall(SYS_prlimit64, 0, RLIMIT_NOFILE, &lim, NULL) ? errno : 0;
    }
    r[2] = inj[2] ? inj[2] : syscall(SYS_prctl, PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) ? errno : 0;
    r[3] = inj[3] ? inj[3]
           : syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_TSYNC, &prog)
               ? errno
               : 0;
    if (write(pfd[1], r, sizeof r) < 0) syscall(SYS_exit_group, 1);
    syscall(SYS_exit_group, 0);
  }
  int e = pid < 0 ? errno : 0;
  close(pfd[1]);
  free(prog.filter);
  int r[4] = {0, 0, 0, 0};
  ssize_t got = -1;
  if (pid > 0) {
    do got = read(pfd[0], r, sizeof r);
    while (got < 0 && errno == EINTR);
    int st;
    while (waitpid((pid_t)pid, &st, 0) < 0 && errno == EINTR) {}
  }
  close(pfd[0]);
  if (got != (ssize_t)sizeof r) {
    fb_errf(err, errlen, "cannot try the sandbox walls: %s",
            e ? strerror(e) : "the child trying them died");
    return FB_EINTERNAL;
  }
  static const char *const what[4] = {"setresuid", "setrlimit", "prctl", "seccomp load"};
  for (int k = 0; k < 4; k++) {
    int i = FBD_WALL_UID + k;
    if (k == 0 && !want_uid) srv->wall_state[i] = FBD_WALL_OFF;
    else if (r[k]) wall_refused(srv, i, r[k], what[k]);
    else srv->wall_state[i] = FBD_WALL_UP;
  }
  return 0;
}

/* require_walls / strict_sandbox: each wall named is up, or no start. */
static int walls_required(fbd_server *srv, char *err, size_t errlen) {
  const fbd_config *cfg = srv->cfg;
  int need[FBD_NWALLS];
  if (walls_parse(cfg->strict_sandbox ? "all" : cfg->require_walls, "require_walls", 0, 1, need,
                  err, errlen))
    return FB_EINVAL;
  for (int i = 0; i < FBD_NWALLS; i++) {
    if (!need[i] || srv->wall_state[i] == FBD_WALL_UP) continue;
    const char *opt = cfg->strict_sandbox ? "strict_sandbox" : "require_walls";
    if (srv->wall_state[i] == FBD_WALL_DOWN)
      fb_errf(err, errlen, "%s: the sandbox wall %s is required, and the kernel refused it (%s%s%s)",
              opt, fbd_wall_names[i], wall_step[i], wall_step[i][0] ? ": " : "",
              strerror(srv->wall_errno[i]));
    else
      fb_errf(err, errlen, "%s: the sandbox wall %s is required, and is not asked for (%s)", opt,
              fbd_wall_names[i],
              i == FBD_WALL_UID ? "fuseboxd was not started as root: its workers keep its user"
                                : "worker_namespaces is off, or net for rootns");
    return FB_EINVAL;
  }
  return 0;
}

int fbd_procs_start(fbd_server *srv, char *err, size_t errlen) {
  memset(srv->wall_state, 0, sizeof srv->wall_state);
  int urc = walls_parse(srv->cfg->test_refuse_walls, "test_refuse_walls", 1, 0, wall_inject, err,
                        errlen);
  if (!urc && srv->cfg->test_refuse_walls)
    fbd_logf(srv->log, FBD_LOG_WARN,
             "test_refuse_walls %s: the walls named are taken as refused (a test hook)",
             srv->cfg->test_refuse_walls);
  if (!urc) urc = worker_identity(srv, err, errlen);
  if (!urc) urc = worker_namespaces(srv, err, errlen);
  if (!urc) urc = walls_probe(srv, err, errlen);
  if (!urc) walls_report(srv);
  if (!urc) urc = walls_required(srv, err, errlen);
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
    double t0 = mono();
    while (!proc_ready(srv->spares[0]) && mono() - t0 < 10) {
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
static int proc_take(fbd_server *srv, fbd_proc **out, char *err, size_t errlen) {
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

/* ---------------------------------------------------------------- broker: running jobs */

static void fatal_reply(fbd_reply *r, int code, const char *why) {
  r->code = code;
  r->finish = 1;
  r->fatal = 1;
  fb_errf(r->msg, sizeof r->msg, "%s", why);
}

/* The worker began a frame and then stalled past worker_reply_timeout_s:
 * stuck or compromised. Kill it; only its session ends. */
static void worker_stalled(fbd_session *s, fbd_reply *r, const char *what) {
  proc_reap(s->proc, 1, NULL, 0);
  s->end_reason = FBD_END_CRASHED;
  snprintf(s->end_why, sizeof s->end_why,
           "the session worker stalled in the middle of a %s for worker_reply_timeout_s "
           "(%g s): it was stopped",
           what, s->srv->cfg->worker_reply_timeout_s);
  fbd_logf(s->srv->log, FBD_LOG_WARN, "session %s: %s", s->tag, s->end_why);
  fatal_reply(r, FB_EINTERNAL, s->end_why);
}

/* The worker stopped answering: learn why, and say it. */
static void worker_lost(fbd_session *s, fbd_reply *r) {
  char why[256];
  proc_reap_lost(s->proc, why, sizeof why);
  s->end_reason = FBD_END_CRASHED;
  fb_errf(s->end_why, sizeof s->end_why, "%s", why);
  fbd_logf(s->srv->log, FBD_LOG_WARN, "session %s: %s", s->tag, why);
  fatal_reply(r, FB_EINTERNAL, why);
}

/* Why the running job must stop now, or NULL: a task past
 * kernel_timeout_s, a RegisterKernels past compile_timeout_s, or an
 * aborted session that did not stop within ABORT_GRACE_S. */
static const char *overdue(fbd_session *s, int kind, double t0, char *buf, size_t n, int *code) {
  const fbd_config *cfg = s->srv->cfg;
  double now = mono();
  pthread_mutex_lock(&s->mu);
  double abort_at = s->abort_at;
  pthread_mutex_unlock(&s->mu);
  if (abort_at > 0 && now - abort_at > ABORT_GRACE_S) {
    *code = FB_ECANCELLED;
    fb_errf(buf, n, "the session ended and its running work did not stop within %.0f s",
            ABORT_GRACE_S);
    return buf;
  }
  double held = fbd_sched_held(s); /* paused by the scheduler: not the job's time */
  t0 += held;
  int parse = kind == FBD_J_PARSE || kind == FBD_J_DESCRIBE;
  if ((kind == FBD_J_REGISTER || parse) && cfg->compile_timeout_s > 0 &&
      now - t0 > cfg->compile_timeout_s) {
    *code = FB_ETIMEOUT;
    snprintf(buf, n, "%s ran past compile_timeout_s (%g s)",
             parse ? "parsing the source" : "compiling the kernels", cfg->compile_timeout_s);
    return buf;
  }
  uint64_t st = atomic_load_explicit(&s->watch->started_ns, memory_order_acquire);
  double since = st ? now - (double)st * 1e-9 - held : 0;
  if (since > now - t0) since = now - t0; /* the worker's clock is not trusted past the job */
  if (kind != FBD_J_REGISTER && !parse && cfg->kernel_timeout_s > 0 && st &&
      since > cfg->kernel_timeout_s) {
    char kernel[sizeof s->watch->kernel], task[sizeof s->watch->task];
    memcpy(kernel, s->watch->kernel, sizeof kernel);
    memcpy(task, s->watch->task, sizeof task);
    kernel[sizeof kernel - 1] = task[sizeof task - 1] = 0;
    *code = FB_ETIMEOUT;
    if (strcmp(kernel, task)) /* a fused task: its launches, "kernel 'a' (launch 7) fused ..." */
      snprintf(buf, n, "%.150s ran past kernel_timeout_s (%g s)", task, cfg->kernel_timeout_s);
    else
      snprintf(buf, n, "kernel '%s' ran past kernel_timeout_s (%g s)", kernel,
               cfg->kernel_timeout_s);
    return buf;
  }
  return NULL;
}

/* The most bytes of packed response that a reply to j can legitimately
 * hold, from what the broker asked for: a worker is not trusted to say how
 * much the broker must allocate. RegisterKernels: one id per kernel sent;
 * a batch with a sync: a SyncResult listing at most one return per launch
 * sent since the last SyncResult and FBD_SYNC_MAX_ERRS errors of under
 * FBD_ERRLEN bytes each (exec.c keeps no more); a WriteField: one count.
 * Everything else answers with a status only (a read's bytes go through
 * the staging buffer's memfd). */
static uint64_t varint_len(uint64_t v) {
  uint64_t n = 1;
  while (v >= 0x80) {
    v >>= 7;
    n++;
  }
  return n;
}

/* The most bytes message type d packs to, each field at its widest; the
 * field named `open` (a string, or a repeated field) contributes nothing
 * here and is the caller's to add. UINT64_MAX: some other field has no
 * bound (a string, bytes or repeated field). */
static uint64_t pb_max(const ProtobufCMessageDescriptor *d, const char *open) {
  uint64_t total = 0;
  for (unsigned i = 0; i < d->n_fields; i++) {
    const ProtobufCFieldDescriptor *f = &d->fields[i];
    if (open && !strcmp(f->name, open)) continue;
    if (f->label == PROTOBUF_C_LABEL_REPEATED) return UINT64_MAX;
    uint64_t v;
    switch (f->type) {
    case PROTOBUF_C_TYPE_BOOL: v = 1; break;
    case PROTOBUF_C_TYPE_FIXED32:
    case PROTOBUF_C_TYPE_SFIXED32:
    case PROTOBUF_C_TYPE_FLOAT: v = 4; break;
    case PROTOBUF_C_TYPE_FIXED64:
    case PROTOBUF_C_TYPE_SFIXED64:
    case PROTOBUF_C_TYPE_DOUBLE: v = 8; break;
    case PROTOBUF_C_TYPE_MESSAGE:
      v = pb_max(f->descriptor, NULL);
      if (v == UINT64_MAX) return v;
      v += varint_len(v);
      break;
    case PROTOBUF_C_TYPE_STRING:
    case PROTOBUF_C_TYPE_BYTES: return UINT64_MAX;
    default: v = 10; break; /* varints: a negative int32 takes 10 */
    }
    total += varint_len((uint64_t)f->id << 3) + v;
  }
  return total;
}

/* The widest SyncResult entries and fixed part, once. */
static uint64_t pb_sync_fixed, pb_ret_max, pb_err_max;
static pthread_once_t pb_once = PTHREAD_ONCE_INIT;

static void pb_bounds(void) {
  /* SyncResult less its two repeated fields (returns, errors: per entry
   * below), wrapped in SessionResponse (a tag and a length prefix) */
  uint64_t fixed = 0;
  const ProtobufCMessageDescriptor *d = &fusebox__v1__sync_result__descriptor;
  for (unsigned i = 0; i < d->n_fields; i++) {
    const ProtobufCFieldDescriptor *f = &d->fields[i];
    if (f->label == PROTOBUF_C_LABEL_REPEATED) continue; /* returns, errors: per entry below */
    uint64_t v = f->type == PROTOBUF_C_TYPE_MESSAGE ? pb_max(f->descriptor, NULL) : 10;
    if (v == UINT64_MAX) {
      fixed = WIRE_MAX_PB; /* a field without a bound: the wire's own limit */
      break;
    }
    if (f->type == PROTOBUF_C_TYPE_MESSAGE) v += 5;
    fixed += varint_len((uint64_t)f->id << 3) + v;
  }
  pb_sync_fixed = fixed + 1 + 5;
  /* a returns or errors entry: its tag, a length prefix, the entry */
  uint64_t ret = pb_max(&fusebox__v1__launch_return__descriptor, NULL);
  uint64_t err = pb_max(&fusebox__v1__launch_error__descriptor, "message");
  /* a field without a bound: the wire's own limit per entry */
  pb_ret_max = ret == UINT64_MAX ? WIRE_MAX_PB : 1 + 5 + ret;
  pb_err_max = err == UINT64_MAX ? WIRE_MAX_PB : 1 + 5 + err + 1 + 5 + FBD_ERRLEN;
}

static uint64_t reply_cap(const fbd_proc *p, const fbd_job *j) {
  switch (j->kind) {
  case FBD_J_REGISTER: { /* a source adds at most FBD_SOURCE_INSTANCES instances */
    const Fusebox__V1__RegisterKernelsRequest *m = j->msg;
    uint64_t n =
        m ? m->n_kernels + m->n_adjoints + m->n_tangents + (m->source ? FBD_SOURCE_INSTANCES : 0)
          : 0;
    return 16 + 10 * n;
  }
  case FBD_J_PARSE: /* a layout: at most FB_LAYOUT_MAX_NODES SNodes named in the source */
  case FBD_J_DESCRIBE: /* its fields and kernels, named in the source */
    return FBD_SOURCE_REPLY_MAX;
  case FBD_J_BATCH: {
    const Fusebox__V1__SessionRequest *m = j->msg;
    if (!m || !m->sync) return 0;
    uint64_t rets = p->unsynced < FBD_SYNC_MAX_RETS ? p->unsynced : FBD_SYNC_MAX_RETS;
    pthread_once(&pb_once, pb_bounds);
    return pb_sync_fixed + rets * pb_ret_max + (uint64_t)FBD_SYNC_MAX_ERRS * pb_err_max;
  }
  case FBD_J_WRITE: return 16;
  case FBD_J_RESTORE: return FBD_SOURCE_REPLY_MAX; /* a layout */
  default: return 0;
  }
}

static const char *job_name(int kind) {
  switch (kind) {
  case FBD_J_CREATE: return "CreateSession";
  case FBD_J_REGISTER: return "RegisterKernels";
  case FBD_J_BATCH: return "batch of launches";
  case FBD_J_WRITE: return "WriteField";
  case FBD_J_READ: return "ReadField";
  case FBD_J_ACTIVE: return "ReadField (active)";
  case FBD_J_PARSE: return "CreateSession (its source)";
  case FBD_J_DESCRIBE: return "DescribeSource";
  case FBD_J_CKPT: return "Checkpoint";
  case FBD_J_RESTORE: return "Restore";
  default: return "request";
  }
}

/* A reply that breaks the wire's rules: the worker is compromised (or
 * broken). Kill it, since it may be alive and waiting; only its session
 * ends. */
static void worker_malformed(fbd_session *s, fbd_reply *r, const char *what) {
  proc_reap(s->proc, 1, NULL, 0);
  s->end_reason = FBD_END_CRASHED;
  fb_errf(s->end_why, sizeof s->end_why,
          "the session worker sent a malformed reply (%s): it was stopped", what);
  fbd_logf(s->srv->log, FBD_LOG_WARN, "session %s: %s", s->tag, s->end_why);
  fatal_reply(r, FB_EINTERNAL, s->end_why);
}

/* Read n bytes of packed response into a buffer that grows as they arrive
 * (from PB_READ_STEP, doubling), so that the broker holds no more than the
 * worker has sent even for a legitimately large reply. */
static int read_pb(int fd, uint64_t n, uint8_t **out, const frame_clock *clk) {
  size_t cap = n < PB_READ_STEP ? (size_t)n : PB_READ_STEP, got = 0;
  uint8_t *b = malloc(cap);
  int rc = b ? 0 : FB_ENOMEM;
  while (!rc && got < n) {
    if (got == cap) {
      size_t nc = (uint64_t)cap * 2 < n ? cap * 2 : (size_t)n;
      uint8_t *nb = realloc(b, nc);
      if (!nb) {
        rc = FB_ENOMEM;
        break;
      }
      b = nb;
      cap = nc;
    }
    rc = read_all(fd, b + got, cap - got, NULL, clk);
    if (!rc) got = cap;
  }
  if (rc) {
    free(b);
    b = NULL;
  }
  *out = b;
  return rc;
}

/* Receive the reply to the job just sent, keeping time meanwhile. */
static void await_reply(fbd_session *s, const fbd_job *j, fbd_reply *r) {
  fbd_proc *p = s->proc;
  int kind = j->kind;
  double t0 = mono(), spin = s->srv->cfg->worker_spin_us * 1e-6;
again:
  for (;;) {
    if (wait_readable(p->fd, spin, 50)) break;
    spin = 0;
    /* a parse (of a register too) whose client went away stops: the
       worker's front end polls this flag */
    if ((kind == FBD_J_REGISTER || kind == FBD_J_PARSE || kind == FBD_J_DESCRIBE) && j->call &&
        atomic_load(&j->call->gone))
      atomic_store(&s->watch->cancel, 1);
    char why[200];
    int code = 0;
    if (overdue(s, kind, t0, why, sizeof why, &code)) {
      proc_reap(p, 1, NULL, 0);
      s->end_reason = code == FB_ETIMEOUT ? FBD_END_TIMEOUT : FBD_END_CANCELLED;
      fb_errf(s->end_why, sizeof s->end_why, "%s: its session worker was stopped", why);
      fbd_logf(s->srv->log, FBD_LOG_WARN, "session %s: %s", s->tag, s->end_why);
      fatal_reply(r, code, s->end_why);
      return;
    }
  }
  /* the reply has begun: all of it within worker_reply_timeout_s */
  frame_clock clk = clock_start(s, s->srv->cfg->worker_reply_timeout_s);
  wire_rep h;
  int rc = read_all(p->fd, &h, sizeof h, NULL, &clk);
  if (!rc && h.magic == DATA_MAGIC && kind == FBD_J_CKPT && h.pblen <= DATA_MAX) {
    /* a piece of a checkpoint's stream: to the job's sink (the seal), then
       the next frame (a sink that failed takes nothing more; the worker's
       stream ends anyway and its reply follows) */
    uint8_t *b = malloc(h.pblen ? h.pblen : 1);
    rc = b ? (h.pblen ? read_all(p->fd, b, h.pblen, NULL, &clk) : 0) : FB_ENOMEM;
    if (!rc && j->sink) j->sink(j->sink_user, b, (size_t)h.pblen);
    free(b);
    if (!rc) goto again;
  }
  /* lengths bounded before anything is allocated or read */
  uint64_t cap = reply_cap(p, j);
  char bad[200] = "";
  if (rc) {
  } else if (h.magic != WIRE_MAGIC) {
    fb_errf(bad, sizeof bad, "no frame header");
  } else if (h.code > 0 || h.code < FB_ELAST) {
    fb_errf(bad, sizeof bad, "status %d is no FB_E* code", h.code);
  } else if (h.msglen >= FBD_ERRLEN) {
    fb_errf(bad, sizeof bad, "a message of %llu bytes, over %d", (unsigned long long)h.msglen,
            FBD_ERRLEN - 1);
  } else if (h.pblen > cap || h.pblen > WIRE_MAX_PB) {
    fb_errf(bad, sizeof bad,
            "a response of %llu bytes to a %s, where at most %llu bytes can be legitimate",
            (unsigned long long)h.pblen, job_name(kind), (unsigned long long)cap);
  }
  if (bad[0]) {
    worker_malformed(s, r, bad);
    return;
  }
  if (!rc && h.msglen) rc = read_all(p->fd, r->msg, h.msglen, NULL, &clk);
  if (!rc) r->msg[h.msglen] = 0;
  if (!rc && h.pblen) {
    rc = read_pb(p->fd, h.pblen, &r->pb, &clk);
    if (!rc) r->pblen = (size_t)h.pblen;
  }
  if (rc) {
    free(r->pb);
    r->pb = NULL;
    r->pblen = 0;
    if (rc == FB_ETIMEOUT) worker_stalled(s, r, "reply");
    else worker_lost(s, r);
    return;
  }
  r->code = h.code;
  r->finish = h.finish != 0;
  r->fatal = h.fatal != 0;
  r->registered = h.registered;
  r->counters = h.counters;
  if (kind == FBD_J_BATCH && r->pb) p->unsynced = 0; /* a SyncResult went: returns handed over */
}

static void send_job(fbd_session *s, fbd_job *j, const void *extra, size_t extralen, fbd_reply *r) {
  size_t rawlen = GRPC_SLICE_LENGTH(j->raw);
  wire_req q = {WIRE_MAGIC, j->kind, j->field, j->buf.fd >= 0, extralen + rawlen, j->buf.len};
  /* header and settings first (the fd rides on them), then the request */
  uint8_t head[sizeof q + sizeof(wire_create)];
  memcpy(head, &q, sizeof q);
  if (extralen) memcpy(head + sizeof q, extra, extralen);
  frame_clock clk = clock_start(s, s->srv->cfg->worker_reply_timeout_s);
  int rc = send_frame(s->proc->fd, head, sizeof q + extralen, j->buf.fd,
                      GRPC_SLICE_START_PTR(j->raw), rawlen, &clk);
  if (rc == FB_ETIMEOUT) { /* a worker between jobs reads at once */
    worker_stalled(s, r, "request (it stopped reading)");
    return;
  }
  if (rc) {
    worker_lost(s, r);
    return;
  }
  if (j->kind == FBD_J_BATCH && j->msg) {
    uint64_t n = ((const Fusebox__V1__SessionRequest *)j->msg)->n_launches;
    s->proc->unsynced = s->proc->unsynced + n < n ? UINT64_MAX : s->proc->unsynced + n;
  }
  await_reply(s, j, r);
}

void fbd_proc_run(fbd_session *s, fbd_job *j, fbd_reply *r) {
  if (!s->proc || s->proc->reaped) {
    fatal_reply(r, FB_EINTERNAL, s->end_why[0] ? s->end_why : "the session has no worker");
    return;
  }
  send_job(s, j, NULL, 0, r);
}

/* CKPT: the worker streams the session to j->sink in data frames, then
 * replies as usual. */
void fbd_proc_checkpoint(fbd_session *s, fbd_job *j, fbd_reply *r) {
  fbd_proc_run(s, j, r);
}

/* RESTORE in s's new worker: the settings, then the stream in data frames
 * (ended by an empty one); the worker answers with the restored layout,
 * which the broker checks as it checks a client's. */
void fbd_proc_restore(fbd_session *s, fbd_job *j, fbd_reply *r) {
  wire_create c;
  memset(&c, 0, sizeof c);
  c.seed = s->ecfg.seed;
  c.memory_limit = s->ecfg.memory_limit;
  c.passes = s->ecfg.passes;
  c.flush_every = s->ecfg.flush_every;
  c.max_fuse_per_task = s->ecfg.max_fuse_per_task;
  c.max_kernel_statements = s->ecfg.max_kernel_statements;
  snprintf(c.mode, sizeof c.mode, "%s", s->mode);
  snprintf(c.tag, sizeof c.tag, "%s", s->tag);
  wire_req q = {WIRE_MAGIC, FBD_J_RESTORE, 0, 0, sizeof c, 0};
  uint8_t head[sizeof q + sizeof c];
  memcpy(head, &q, sizeof q);
  memcpy(head + sizeof q, &c, sizeof c);
  frame_clock clk = clock_start(s, s->srv->cfg->worker_reply_timeout_s);
  int rc = send_frame(s->proc->fd, head, sizeof head, -1, NULL, 0, &clk);
  uint8_t *buf = rc ? NULL : malloc(DATA_MAX);
  if (!rc && !buf) rc = FB_ENOMEM;
  for (long got = 1; !rc && got > 0;) {
    got = fbd_ckpt_source(j->ck, buf, DATA_MAX);
    if (got < 0) got = 0; /* the worker's restore then finds the stream short */
    wire_req d = {DATA_MAGIC, FBD_J_RESTORE, 0, 0, (uint64_t)got, 0};
    clk = clock_start(s, s->srv->cfg->worker_reply_timeout_s);
    rc = send_frame(s->proc->fd, &d, sizeof d, -1, buf, (size_t)got, &clk);
  }
  free(buf);
  if (rc == FB_ETIMEOUT) {
    worker_stalled(s, r, "checkpoint (it stopped reading)");
    return;
  }
  if (rc) {
    worker_lost(s, r);
    return;
  }
  await_reply(s, j, r);
}

int fbd_proc_attach(fbd_session *s, char *err, size_t errlen) {
  fbd_proc *taken;
  int rc = proc_take(s->srv, &taken, err, errlen);
  if (rc) return rc;
  pthread_mutex_lock(&s->mu); /* fbd_proc_sample reads it under s->mu */
  s->proc = taken;
  pthread_mutex_unlock(&s->mu);
  s->watch = s->proc->watch;
  if (s->srv->cfg->worker_uid_base) { /* the tenant's ids: the spare waits for them */
    const fbd_tenant *t = atomic_load(&s->owner);
    uint32_t id = s->srv->cfg->worker_uid_base + (uint32_t)(t ? t->worker_slot : 0);
    wire_ident w = {IDENT_MAGIC, id, id, 0};
    frame_clock clk = clock_start(NULL, HELLO_TIMEOUT_S);
    if (write_all(s->proc->fd, &w, sizeof w, &clk)) {
      fb_errf(err, errlen, "the session worker did not take its tenant's user");
      return FB_EINTERNAL;
    }
  }
  /* the hello: the worker made its engine and became its user (or says why not) */
  double t0 = mono();
  while (!wait_readable(s->proc->fd, 0, 100))
    if (mono() - t0 > HELLO_TIMEOUT_S) {
      fb_errf(err, errlen, "the session worker did not start within %.0f s", HELLO_TIMEOUT_S);
      return FB_EINTERNAL;
    }
  wire_rep h;
  char msg[FBD_ERRLEN] = "";
  frame_clock clk = clock_start(NULL, HELLO_TIMEOUT_S); /* no scheduler yet */
  if (read_all(s->proc->fd, &h, sizeof h, NULL, &clk) || h.magic != WIRE_MAGIC ||
      h.msglen >= sizeof msg || (h.msglen && read_all(s->proc->fd, msg, h.msglen, NULL, &clk))) {
    char why[256];
    proc_reap(s->proc, 1, why, sizeof why);
    fb_errf(err, errlen, "%s before it was ready", why);
    return FB_EINTERNAL;
  }
  if (h.code) {
    fb_errf(err, errlen, "the session worker could not start: %s", msg);
    return h.code < 0 && h.code >= FB_ELAST ? h.code : FB_EINTERNAL;
  }
  /* a fresh worker, its engine made and nothing of the session's in it
     yet: its measure is what the session's worker counts at least, and
     the charge of the next one admitted */
  uint64_t v;
  if (!s->srv->cfg->worker_memory_bytes && !fbd_proc_measure(s->proc, &v)) {
    atomic_store(&s->worker_base, v);
    atomic_store(&s->worker_rss, v);
    atomic_store(&s->srv->worker_charge, v);
  }
  return 0;
}

/* ---------------------------------------------------------------- compile cache
 * Under process isolation the worker's JIT asks the broker (docs/code-cache.md,
 * "Who writes"): a socket of its own, handed to the worker with CREATE,
 * served by a broker thread per session. The worker sends
 *   wire_cache {magic, op (get/put), target_len, ir_len, code_len} | target | ir | code
 * and a get is answered by {magic, found, 0, 0, code_len} | code. The broker
 * bounds every length before it reads, uses the session's own partition
 * (never one the worker names), and verifies entries itself (dcache.c); the
 * worker never sees the key or the directory. A malformed request ends the
 * service: the worker then compiles everything itself. */
#define CACHE_MAGIC 0x46424331u /* "FBC1" */
#define CACHE_GET 1
#define CACHE_PUT 2
#define CACHE_MAX_TARGET 4096
typedef struct wire_cache {
  uint32_t magic, op;
  uint64_t target_len, ir_len, code_len;
} wire_cache;

typedef struct cache_srv {
  fbd_server *srv;
  int fd;
  uint64_t partition;
} cache_srv;

static int read_full(int fd, void *p, size_t n) {
  uint8_t *b = p;
  while (n) {
    ssize_t r = read(fd, b, n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return -1;
    b += r;
    n -= (size_t)r;
  }
  return 0;
}

static int write_full(int fd, const void *p, size_t n) {
  const uint8_t *b = p;
  while (n) {
    ssize_t r = send(fd, b, n, MSG_NOSIGNAL);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return -1;
    b += r;
    n -= (size_t)r;
  }
  return 0;
}

static void *cache_main(void *arg) {
  cache_srv c = *(cache_srv *)arg;
  free(arg);
  for (;;) {
    wire_cache h;
    if (read_full(c.fd, &h, sizeof h)) break;
    if (h.magic != CACHE_MAGIC || (h.op != CACHE_GET && h.op != CACHE_PUT) ||
        h.target_len > CACHE_MAX_TARGET || h.ir_len > FBD_DCACHE_MAX_IR ||
        h.code_len > FBD_DCACHE_MAX_PAYLOAD || (h.op == CACHE_GET && h.code_len)) {
      fbd_logf(c.srv->log, FBD_LOG_WARN,
               "a session worker sent a malformed compile cache request: its cache is off");
      break;
    }
    char *target = malloc(h.target_len + 1);
    char *ir = malloc(h.ir_len + 1);
    uint8_t *code = malloc(h.code_len + 1);
    int bad = !target || !ir || !code || read_full(c.fd, target, h.target_len) ||
              read_full(c.fd, ir, h.ir_len) || read_full(c.fd, code, h.code_len);
    if (!bad) {
      target[h.target_len] = 0;
      if (strlen(target) != h.target_len) bad = 1; /* a NUL inside: not text */
    }
    if (!bad && h.op == CACHE_PUT) {
      fbd_codestore_put(c.srv->codestore, c.partition, target, ir, h.ir_len, code, h.code_len);
    } else if (!bad) {
      uint8_t *out = NULL;
      size_t len = 0;
      int found = fbd_codestore_get(c.srv->codestore, c.partition, target, ir, h.ir_len, &out,
                                    &len);
      wire_cache a = {CACHE_MAGIC, (uint32_t)found, 0, 0, found ? len : 0};
      bad = write_full(c.fd, &a, sizeof a) || (found && write_full(c.fd, out, len));
      free(out);
    }
    free(target);
    free(ir);
    free(code);
    if (bad) break;
  }
  shutdown(c.fd, SHUT_RDWR);
  return NULL;
}

/* A socket for the worker's compile cache requests and its serving thread:
 * the worker's end (to hand over with CREATE), or -1 when there is no
 * cache (or it cannot be set up: the worker then compiles everything). */
static int cache_start(fbd_session *s) {
  if (!s->srv->codestore || s->proc->cache_th_on) return -1;
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv)) return -1;
  cache_srv *c = malloc(sizeof *c);
  if (!c) {
    close(sv[0]);
    close(sv[1]);
    return -1;
  }
  *c = (cache_srv){s->srv, sv[0], s->ecfg.cache_partition};
  s->proc->cache_fd = sv[0];
  if (pthread_create(&s->proc->cache_th, NULL, cache_main, c)) {
    free(c);
    close(sv[0]);
    close(sv[1]);
    s->proc->cache_fd = -1;
    return -1;
  }
  s->proc->cache_th_on = 1;
  return sv[1];
}

/* CREATE: the settings, then the request as the client sent it. */
void fbd_proc_create(fbd_session *s, fbd_job *j, fbd_reply *r) {
  wire_create c;
  memset(&c, 0, sizeof c);
  c.seed = s->ecfg.seed;
  c.memory_limit = s->ecfg.memory_limit;
  c.passes = s->ecfg.passes;
  c.flush_every = s->ecfg.flush_every;
  c.max_fuse_per_task = s->ecfg.max_fuse_per_task;
  c.max_kernel_statements = s->ecfg.max_kernel_statements;
  snprintf(c.mode, sizeof c.mode, "%s", s->mode);
  snprintf(c.tag, sizeof c.tag, "%s", s->tag);
  /* the compile cache's socket rides on CREATE (which carries no buffer) */
  int cfd = j->buf.fd < 0 ? cache_start(s) : -1;
  if (cfd >= 0) j->buf.fd = cfd;
  send_job(s, j, &c, sizeof c, r);
  if (cfd >= 0) {
    j->buf.fd = -1;
    close(cfd);
  }
}

/* PARSE: the worker parses the CreateSession's source and keeps the
 * layout for the CREATE that follows; the broker takes it as protobuf and
 * checks it as it checks a client's layout (a compromised worker can only
 * describe its own session wrongly). A failed parse ends the session. */
int fbd_proc_parse(fbd_session *s, fbd_job *j, fb_layout **out, fbd_reply *r) {
  *out = NULL;
  j->kind = FBD_J_PARSE; /* the CREATE's bytes, under another kind */
  send_job(s, j, NULL, 0, r);
  j->kind = FBD_J_CREATE;
  int rc = r->code;
  if (!rc && !r->pb) {
    rc = FB_EINTERNAL;
    fb_errf(r->msg, sizeof r->msg, "the session worker answered the parse without a layout");
  }
  if (!rc) {
    fbp_arena a;
    fbp_arena_init(&a);
    a.limit = FBD_SOURCE_REPLY_MAX * (size_t)FBP_DECODE_FACTOR;
    Fusebox__V1__Layout *m = (Fusebox__V1__Layout *)protobuf_c_message_unpack(
        &fusebox__v1__layout__descriptor, &a.pb, r->pblen, r->pb);
    char why[FBD_ERRLEN - 64];
    rc = m ? fbp_layout_from_pb(m, out, why, sizeof why) : FB_EINVAL;
    if (!m) fb_errf(why, sizeof why, "not a fusebox.v1.Layout");
    if (rc) fb_errf(r->msg, sizeof r->msg, "the session worker's layout: %s", why);
    fbp_arena_free(&a);
  }
  free(r->pb); /* the layout is the broker's, not the client's answer */
  r->pb = NULL;
  r->pblen = 0;
  if (rc) {
    r->code = rc;
    r->finish = r->fatal = 1;
  }
  return rc;
}

/* ---------------------------------------------------------------- the worker process */

/* A test hook that no client can reach: FUSEBOXD_FAULT_INJECT=KIND:NAME in
 * fuseboxd's environment (the operator's, inherited by its workers) makes
 * the worker that registers a kernel named NAME misbehave as a compromised
 * one might, so that tests can check the walls through the public
 * protocol. KIND:
 *   reply-stall     its reply stops after the header, for good (the broker
 *                   must kill it);
 *   reply-oversize  its reply's header claims a 512 MiB response, the
 *                   real one follows and then nothing (the broker must
 *                   refuse the length before allocating anything);
 *   syscall-probe   it tries calls its seccomp filter refuses (open a
 *                   file, getcwd, uname), and one it allows that takes a
 *                   path (stat: only an empty root hides the host's
 *                   files from it), and answers FB_EINTERNAL with what
 *                   each returned;
 *   exec            it tries execve (the filter kills it);
 *   sigio-probe     it tries to have the kernel signal for it: an owner
 *                   for SIGIO on its socket (F_SETOWN, F_SETOWN_EX,
 *                   FIOSETOWN, SIOCSPGRP), a signal of its choosing
 *                   (F_SETSIG), O_ASYNC (F_SETFL, FIOASYNC), typing into a
 *                   terminal (TIOCSTI), and answers with what each
 *                   returned (the owner is itself and the signal SIGURG,
 *                   which it ignores: harmless were a call let through);
 *   rlimit-probe    it tries to change its resource limits (setrlimit,
 *                   prlimit of itself) and to read the broker's (prlimit),
 *                   reads its own (allowed), and answers with each;
 *   signal-probe    it tries SIGCONT (harmless) to its process group
 *                   (kill 0, kill -pgid), a queued one to the broker
 *                   (rt_sigqueueinfo, rt_tgsigqueueinfo) and a queued
 *                   SIGURG to itself (allowed), and answers with each and
 *                   whether it leads a session of its own;
 *   memfd-resize    at its next field transfer it tries to shrink the
 *                   staging buffer's memfd (ftruncate) and to grow it
 *                   (write past its end), reads its seals, and answers
 *                   with each instead of moving the data;
 *   close-socket    it closes its socket to the broker and lives on,
 *                   asleep (the broker must kill it after a grace);
 *   device-bytes    its replies from then on claim 2^62 bytes of device
 *                   memory (the broker caps the claim at what its
 *                   process could hold). */
enum {
  FAULT_NONE,
  FAULT_STALL,
  FAULT_OVERSIZE,
  FAULT_PROBE,
  FAULT_EXEC,
  FAULT_SIGIO,
  FAULT_RLIMIT,
  FAULT_SIGNAL,
  FAULT_MEMFD,
  FAULT_CLOSE,
  FAULT_DEVICE
};
static char fault_kernel[64];
static int fault_kind, fault_armed;

static void fault_init(void) {
  static const struct {
    const char *prefix;
    int kind;
  } kinds[] = {{"reply-stall:", FAULT_STALL},
               {"reply-oversize:", FAULT_OVERSIZE},
               {"syscall-probe:", FAULT_PROBE},
               {"exec:", FAULT_EXEC},
               {"sigio-probe:", FAULT_SIGIO},
               {"rlimit-probe:", FAULT_RLIMIT},
               {"signal-probe:", FAULT_SIGNAL},
               {"memfd-resize:", FAULT_MEMFD},
               {"close-socket:", FAULT_CLOSE},
               {"device-bytes:", FAULT_DEVICE}};
  const char *f = getenv(FAULT_ENV);
  for (size_t i = 0; f && i < sizeof kinds / sizeof kinds[0]; i++) {
    size_t n = strlen(kinds[i].prefix);
    if (strncmp(f, kinds[i].prefix, n)) continue;
    fault_kind = kinds[i].kind;
    snprintf(fault_kernel, sizeof fault_kernel, "%s", f + n);
  }
}

/* what a refused call gave: "EPERM" and the like */
static void fault_note(char *out, size_t n, const char *call, long rc) {
  size_t used = strlen(out);
  const char *e = rc < 0 ? strerrorname_np(errno) : NULL;
  snprintf(out + used, n - used, "%s%s: %s", used ? "; " : "", call,
           rc >= 0 ? "allowed"
           : e     ? e
                   : "?");
}

static void fault_hang(void);

/* The walls against signals the kernel sends on a worker's behalf. */
static void fault_sigio(char *out, size_t n) {
  int sock = 3, one = 1, self = getpid();
  struct f_owner_ex ex = {F_OWNER_PID, self};
  signal(SIGURG, SIG_IGN);
  fault_note(out, n, "F_SETOWN", (long)fcntl(sock, F_SETOWN, self));
  fault_note(out, n, "F_SETOWN_EX", (long)fcntl(sock, F_SETOWN_EX, &ex));
  fault_note(out, n, "F_SETSIG", (long)fcntl(sock, F_SETSIG, SIGURG));
  int fl = fcntl(sock, F_GETFL);
  fault_note(out, n, "F_SETFL O_ASYNC", fl < 0 ? -1 : (long)fcntl(sock, F_SETFL, fl | O_ASYNC));
  fault_note(out, n, "FIOSETOWN", (long)ioctl(sock, FIOSETOWN, &self));
  fault_note(out, n, "SIOCSPGRP", (long)ioctl(sock, SIOCSPGRP, &self));
  fault_note(out, n, "FIOASYNC", (long)ioctl(sock, FIOASYNC, &one));
  char c = '\n';
  fault_note(out, n, "TIOCSTI", (long)ioctl(2, TIOCSTI, &c));
  fault_note(out, n, "F_GETFL", (long)fl); /* allowed: the filter is not a blanket refusal */
}

static void fault_rlimit(char *out, size_t n) {
  struct rlimit cur, none = {0, 0};
  pid_t broker = getppid(); /* 0 in a PID namespace of its own: then no process 2 either */
  fault_note(out, n, "setrlimit", (long)setrlimit(RLIMIT_CORE, &none)); /* already 0 */
  fault_note(out, n, "prlimit self set", (long)prlimit(0, RLIMIT_CORE, &none, NULL));
  fault_note(out, n, "prlimit broker get",
             (long)prlimit(broker > 0 ? broker : 2, RLIMIT_NOFILE, NULL, &cur));
  fault_note(out, n, "prlimit self get", (long)prlimit(0, RLIMIT_NOFILE, NULL, &cur));
}

static void fault_signal(char *out, size_t n) {
  pid_t self = getpid(), broker = getppid();
  if (broker <= 0) broker = 2; /* a PID namespace of its own: outside it, unseen */
  siginfo_t si;
  memset(&si, 0, sizeof si);
  si.si_signo = SIGCONT;
  si.si_code = SI_QUEUE;
  si.si_pid = self;
  signal(SIGURG, SIG_IGN);
  fault_note(out, n, "kill 0", (long)kill(0, SIGCONT));
  fault_note(out, n, "kill -pgid", (long)kill(-self, SIGCONT));
  fault_note(out, n, "rt_sigqueueinfo broker",
             syscall(SYS_rt_sigqueueinfo, broker, SIGCONT, &si));
  fault_note(out, n, "rt_tgsigqueueinfo broker",
             syscall(SYS_rt_tgsigqueueinfo, broker, broker, SIGCONT, &si));
  si.si_signo = SIGURG;
  fault_note(out, n, "rt_sigqueueinfo self", syscall(SYS_rt_sigqueueinfo, self, SIGURG, &si));
}

/* At a field transfer: resize the staging buffer's memfd fd of len bytes. */
static void fault_memfd(int fd, uint64_t len, fbd_reply *r) {
  char out[512] = "";
  fault_note(out, sizeof out, "ftruncate shrink", (long)ftruncate(fd, 0));
  long grow = lseek(fd, (off_t)len, SEEK_SET) < 0 ? -1 : (long)write(fd, "x", 1);
  fault_note(out, sizeof out, "write past the end", grow);
  int seals = fcntl(fd, F_GET_SEALS);
  fault_note(out, sizeof out, "F_GET_SEALS", (long)seals);
  struct stat st;
  snprintf(out + strlen(out), sizeof out - strlen(out), "; seals %s%s%s; size %lld",
           seals > 0 && (seals & F_SEAL_SHRINK) ? "shrink " : "",
           seals > 0 && (seals & F_SEAL_GROW) ? "grow " : "",
           seals > 0 && (seals & F_SEAL_SEAL) ? "seal" : "",
           fstat(fd, &st) ? -1LL : (long long)st.st_size);
  fb_errf(r->msg, sizeof r->msg, "fault memfd: %s", out);
  r->code = FB_EINTERNAL;
  r->finish = 1;
}

/* The probe and exec faults act here; the others arm the reply. 1: the
 * reply r was made here. */
static int fault_check_register(const Fusebox__V1__RegisterKernelsRequest *m, fbd_reply *r) {
  int hit = 0;
  for (size_t i = 0; fault_kernel[0] && i < m->n_kernels; i++)
    if (m->kernels[i]->name && !strcmp(m->kernels[i]->name, fault_kernel)) hit = 1;
  if (!hit) return 0;
  if (fault_kind == FAULT_EXEC) {
    char *const argv[] = {"/bin/true", NULL};
    execve("/bin/true", argv, environ);
    fb_errf(r->msg, sizeof r->msg, "fault exec: execve returned (%s)", strerrorname_np(errno));
  } else if (fault_kind == FAULT_PROBE) {
    char out[512] = "", cwd[256];
    struct utsname u;
    struct stat st;
    fault_note(out, sizeof out, "openat", (long)open("/etc/passwd", O_RDONLY | O_CLOEXEC));
    fault_note(out, sizeof out, "getcwd", getcwd(cwd, sizeof cwd) ? 0 : -1);
    fault_note(out, sizeof out, "uname", (long)uname(&u));
    fault_note(out, sizeof out, "stat /etc/passwd", (long)stat("/etc/passwd", &st));
    fb_errf(r->msg, sizeof r->msg, "fault probe: %s", out);
  } else if (fault_kind == FAULT_SIGIO || fault_kind == FAULT_RLIMIT ||
             fault_kind == FAULT_SIGNAL) {
    char out[600] = "";
    if (fault_kind == FAULT_SIGIO) fault_sigio(out, sizeof out);
    else if (fault_kind == FAULT_RLIMIT) fault_rlimit(out, sizeof out);
    else fault_signal(out, sizeof out);
    fb_errf(r->msg, sizeof r->msg, "fault probe: %s", out);
  } else if (fault_kind == FAULT_CLOSE) {
    close(3); /* its socket: the broker reads end of file, the worker lives on */
    fault_hang();
  } else {
    fault_armed = 1;
    return 0;
  }
  r->code = FB_EINTERNAL;
  r->finish = 1;
  return 1;
}

/* The header h is about to go: a stalled reply stops after it for good,
 * an oversized one claims far more than it has. */
static void fault_header(wire_rep *h) {
  if (fault_armed && fault_kind == FAULT_OVERSIZE && h->pblen) h->pblen = (uint64_t)512 << 20;
  if (fault_armed && fault_kind == FAULT_DEVICE) h->counters.device_bytes = (uint64_t)1 << 62;
}

/* Forever, asleep (pause is not on the allow list). */
static void fault_hang(void) {
  for (;;) {
    struct timespec d = {3600, 0};
    nanosleep(&d, NULL);
  }
}

static int fault_stall(const wire_rep *h) {
  if (!fault_armed || !h->pblen || fault_kind != FAULT_STALL) return 0;
  fault_hang(); /* the header went; the rest never comes */
  return 0;
}

static int reply(int fd, const fbd_reply *r) {
  wire_rep h;
  memset(&h, 0, sizeof h);
  h.magic = WIRE_MAGIC;
  h.code = r->code;
  h.finish = (uint32_t)r->finish;
  h.fatal = (uint32_t)r->fatal;
  h.registered = r->registered;
  h.msglen = strnlen(r->msg, sizeof r->msg - 1);
  h.pblen = r->pb ? r->pblen : 0;
  h.counters = r->counters;
  uint64_t real = h.pblen;
  fault_header(&h);
  if (write_all(fd, &h, sizeof h, NULL) || fault_stall(&h) ||
      (h.msglen && write_all(fd, r->msg, h.msglen, NULL)) ||
      (real && write_all(fd, r->pb, real, NULL)))
    return FB_EIO;
  if (real != h.pblen) fault_hang(); /* the fault: the rest of what it claimed never comes */
  return 0;
}

/* The seccomp filter: what a tenant's code could use to reach outside its
 * session once the engine is made. Two forms:
 *
 * - CPU workers get an allow list: the calls a worker was seen to make
 *   after lock-down (strace of the test suites and `fusebox bench` against
 *   process workers, Release and AddressSanitizer builds), every other call
 *   failing with EPERM (opening a file among them), and the process killed
 *   outright (SIGSYS) for the calls that only an attack would make:
 *   programs, sockets, tracing, new processes and namespaces.
 * - CUDA workers keep a deny list (every other call allowed), because what
 *   the CUDA driver calls after it is loaded is not known without a GPU to
 *   watch it on, and differs between driver versions.
 *
 * Both: signals only to itself, clone only for threads (no new process or
 * namespace), clone3 ENOSYS (its flags are behind a pointer the filter
 * cannot read; glibc then falls back to clone), on every thread (TSYNC). */
static const char *const lock_allowed[] = {
    /* the socket to the broker, the log (stderr), the staging buffers */
    "read", "readv", "recvmsg", "recvfrom", "write", "writev", "sendmsg", "sendto", "poll", "ppoll",
    "close", "fstat", "newfstatat", "statx", "lseek", /* fcntl: some commands, below */
    /* memory: the allocators and the JIT's code pages */
    "mmap", "munmap", "mprotect", "madvise", "mremap", "brk", "msync", "mincore",
    /* threads: the engine's pools, LLVM's compile threads */
    "futex", "set_robust_list", "get_robust_list", "rseq", "sched_yield", "sched_getaffinity",
    "getpid", "gettid", "membarrier",
    /* signals (to itself: see below), time, randomness, ending */
    "rt_sigprocmask", "rt_sigaction", "rt_sigreturn", "sigaltstack", "restart_syscall", "nanosleep",
    "clock_nanosleep", "clock_gettime", "clock_getres", "gettimeofday", "time", "getrusage",
    "getrandom", "exit", "exit_group",
    /* glibc's qsort asks for the machine's memory (sysconf _SC_PHYS_PAGES) */
    "sysinfo", NULL};

/* Calls only an attack would make: the worker is killed on the spot. */
static const char *const lock_killed[] = {"execve",
                                          "execveat",
                                          "fork",
                                          "vfork",
                                          "ptrace",
                                          "process_vm_readv",
                                          "process_vm_writev",
                                          "socket",
                                          "socketpair",
                                          "connect",
                                          "bind",
                                          "listen",
                                          "accept",
                                          "accept4",
                                          "unshare",
                                          "setns",
                                          "mount",
                                          "umount2",
                                          "pivot_root",
                                          "chroot",
                                          "bpf",
                                          "perf_event_open",
                                          "userfaultfd",
                                          "kexec_load",
                                          "kexec_file_load",
                                          "init_module",
                                          "finit_module",
                                          "delete_module",
                                          "keyctl",
                                          "add_key",
                                          "request_key",
                                          "pidfd_getfd",
                                          "pidfd_open",
                                          "io_uring_setup",
                                          "open_by_handle_at",
                                          NULL};

/* The deny list of CUDA workers: refused with EPERM, all else allowed. */
static const char *const lock_denied[] = {"open",
                                          "openat",
                                          "openat2",
                                          "creat",
                                          "execve",
                                          "execveat",
                                          "connect",
                                          "bind",
                                          "listen",
                                          "accept",
                                          "accept4",
                                          "socket",
                                          "socketpair",
                                          "ptrace",
                                          "process_vm_readv",
                                          "process_vm_writev",
                                          "pidfd_open",
                                          "pidfd_send_signal",
                                          "pidfd_getfd",
                                          "mount",
                                          "umount2",
                                          "chroot",
                                          "pivot_root",
                                          "unshare",
                                          "setns",
                                          "keyctl",
                                          "add_key",
                                          "request_key",
                                          "bpf",
                                          "perf_event_open",
                                          "userfaultfd",
                                          "init_module",
                                          "finit_module",
                                          "delete_module",
                                          "kexec_load",
                                          "reboot",
                                          "swapon",
                                          "swapoff",
                                          "unlink",
                                          "unlinkat",
                                          "rename",
                                          "renameat",
                                          "renameat2",
                                          "mkdir",
                                          "mkdirat",
                                          "rmdir",
                                          "symlink",
                                          "symlinkat",
                                          "link",
                                          "linkat",
                                          "chmod",
                                          "fchmodat",
                                          "chown",
                                          "lchown",
                                          "fchownat",
                                          "truncate",
                                          "mknod",
                                          "mknodat",
                                          "setuid",
                                          "setgid",
                                          "setreuid",
                                          "setregid",
                                          "setresuid",
                                          "setresgid",
                                          "prctl_set_mm",
                                          "fork",
                                          "vfork",
                                          "name_to_handle_at",
                                          "open_by_handle_at",
                                          "io_uring_setup",
                                          NULL};

/* The calls in names, each with action; names this architecture lacks are
 * skipped. */
static int lock_rules(scmp_filter_ctx ctx, const char *const *names, uint32_t action) {
  int rc = 0;
  for (const char *const *n = names; *n && !rc; n++) {
    int nr = seccomp_syscall_resolve_name(*n);
    if (nr == __NR_SCMP_ERROR) continue; /* not on this architecture */
    rc = seccomp_rule_add(ctx, action, nr, 0);
  }
  return rc;
}

/* The allow list's calls that are allowed with some arguments only. */
static int lock_allow_args(scmp_filter_ctx ctx, pid_t self) {
  /* a thread shares memory, signal handlers and thread group, and makes
     no namespace; anything without CLONE_THREAD is a new process */
  const scmp_datum_t thread = CLONE_THREAD | CLONE_VM | CLONE_SIGHAND;
  const scmp_datum_t ns = CLONE_NEWNS | CLONE_NEWCGROUP | CLONE_NEWUTS | CLONE_NEWIPC |
                          CLONE_NEWUSER | CLONE_NEWPID | CLONE_NEWNET;
  int rc = seccomp_rule_add(ctx, SCMP_ACT_ALLOW, SCMP_SYS(clone), 1,
                            SCMP_A0(SCMP_CMP_MASKED_EQ, thread | ns, thread));
  if (!rc)
    rc = seccomp_rule_add(ctx, SCMP_ACT_KILL_PROCESS, SCMP_SYS(clone), 1,
                          SCMP_A0(SCMP_CMP_MASKED_EQ, CLONE_THREAD, 0));
  /* abort() and raise() signal the process itself */
  if (!rc)
    rc = seccomp_rule_add(ctx, SCMP_ACT_ALLOW, SCMP_SYS(kill), 1,
                          SCMP_A0(SCMP_CMP_EQ, (scmp_datum_t)self));
  if (!rc)
    rc = seccomp_rule_add(ctx, SCMP_ACT_ALLOW, SCMP_SYS(tgkill), 1,
                          SCMP_A0(SCMP_CMP_EQ, (scmp_datum_t)self));
  /* fcntl: descriptor flags, status flags without O_ASYNC, duplicates. Not
     F_SETOWN, F_SETSIG and O_ASYNC: with them the kernel would send a
     signal of the worker's choosing (SIGKILL) to a process of its choosing
     (the broker, another worker of the same uid) whenever its socket
     became readable, past the rule that it signals only itself. */
  static const int fcntl_ok[] = {F_GETFD, F_SETFD, F_GETFL, F_DUPFD, F_DUPFD_CLOEXEC, F_GET_SEALS};
  for (size_t i = 0; !rc && i < sizeof fcntl_ok / sizeof *fcntl_ok; i++)
    rc = seccomp_rule_add(ctx, SCMP_ACT_ALLOW, SCMP_SYS(fcntl), 1,
                          SCMP_A1(SCMP_CMP_EQ, (scmp_datum_t)fcntl_ok[i]));
  if (!rc)
    rc = seccomp_rule_add(ctx, SCMP_ACT_ALLOW, SCMP_SYS(fcntl), 2,
                          SCMP_A1(SCMP_CMP_EQ, (scmp_datum_t)F_SETFL),
                          SCMP_A2(SCMP_CMP_MASKED_EQ, (scmp_datum_t)O_ASYNC, 0));
  /* thread names only: not PR_SET_DUMPABLE, PR_SET_SECCOMP or the like */
  if (!rc)
    rc = seccomp_rule_add(ctx, SCMP_ACT_ALLOW, SCMP_SYS(prctl), 1,
                          SCMP_A0(SCMP_CMP_EQ, PR_SET_NAME));
  if (!rc)
    rc = seccomp_rule_add(ctx, SCMP_ACT_ALLOW, SCMP_SYS(prctl), 1,
                          SCMP_A0(SCMP_CMP_EQ, PR_GET_NAME));
  return rc;
}

/* The deny list's calls that are refused with some arguments only. */
static int lock_deny_args(scmp_filter_ctx ctx, pid_t self) {
  /* signals only to itself: kill(own pid), tgkill(own pid, ...) */
  int rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(kill), 1,
                            SCMP_A0(SCMP_CMP_GT, (scmp_datum_t)self));
  if (!rc)
    rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(kill), 1,
                          SCMP_A0(SCMP_CMP_LT, (scmp_datum_t)self));
  if (!rc)
    rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(tgkill), 1,
                          SCMP_A0(SCMP_CMP_NE, (scmp_datum_t)self));
  if (!rc) rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(tkill), 0);
  /* queued signals: to itself only, as kill */
  if (!rc)
    rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(rt_sigqueueinfo), 1,
                          SCMP_A0(SCMP_CMP_NE, (scmp_datum_t)self));
  if (!rc)
    rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(rt_tgsigqueueinfo), 1,
                          SCMP_A0(SCMP_CMP_NE, (scmp_datum_t)self));
  /* signals the kernel sends on its behalf: no owner for SIGIO (F_SETOWN,
     FIOSETOWN, SIOCSPGRP), no signal of its choosing for it (F_SETSIG), no
     O_ASYNC, no lease or directory-notify signals. The kernel reads these
     commands as 32-bit, so the rules look at the low 32 bits only. */
  static const int fcntl_no[] = {F_SETOWN, F_SETOWN_EX, F_SETSIG, F_SETLEASE, F_NOTIFY};
  for (size_t i = 0; !rc && i < sizeof fcntl_no / sizeof *fcntl_no; i++)
    rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(fcntl), 1,
                          SCMP_A1(SCMP_CMP_MASKED_EQ, 0xffffffffu, (scmp_datum_t)fcntl_no[i]));
  if (!rc)
    rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(fcntl), 2,
                          SCMP_A1(SCMP_CMP_MASKED_EQ, 0xffffffffu, (scmp_datum_t)F_SETFL),
                          SCMP_A2(SCMP_CMP_MASKED_EQ, (scmp_datum_t)O_ASYNC, (scmp_datum_t)O_ASYNC));
  /* ioctl: the same SIGIO owner and O_ASYNC, and no typing into the
     broker's terminal (its stderr may be one) */
  static const unsigned long ioctl_no[] = {FIOSETOWN, SIOCSPGRP, FIOASYNC, TIOCSTI, TIOCSPGRP};
  for (size_t i = 0; !rc && i < sizeof ioctl_no / sizeof *ioctl_no; i++)
    rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(ioctl), 1,
                          SCMP_A1(SCMP_CMP_MASKED_EQ, 0xffffffffu, (scmp_datum_t)ioctl_no[i]));
  /* resource limits were set before lock-down: none may change after it,
     and no other process's may be read (a worker of fuseboxd's uid could
     otherwise shrink the broker's open-file limit) */
  if (!rc) rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(setrlimit), 0);
  if (!rc)
    rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(prlimit64), 1,
                          SCMP_A2(SCMP_CMP_NE, 0));
  if (!rc)
    rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(prlimit64), 1,
                          SCMP_A0(SCMP_CMP_GT, (scmp_datum_t)self));
  /* clone may make threads, not processes */
  if (!rc)
    rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(clone), 1,
                          SCMP_A0(SCMP_CMP_MASKED_EQ, CLONE_THREAD, 0));
  return rc;
}

/* The filter, not yet loaded: nnp 0 leaves no_new_privs unset (loading it
 * then needs CAP_SYS_ADMIN). 0, or a libseccomp error (negative errno). */
static int lock_build(const char *backend, int nnp, scmp_filter_ctx *out) {
  int allow = !strcmp(backend, "cpu");
  scmp_filter_ctx ctx = seccomp_init(allow ? SCMP_ACT_ERRNO(EPERM) : SCMP_ACT_ALLOW);
  *out = NULL;
  if (!ctx) return -ENOMEM;
  pid_t self = getpid();
  int rc = allow ? lock_rules(ctx, lock_allowed, SCMP_ACT_ALLOW)
                 : lock_rules(ctx, lock_denied, SCMP_ACT_ERRNO(EPERM));
  if (!rc && allow) rc = lock_rules(ctx, lock_killed, SCMP_ACT_KILL_PROCESS);
  if (!rc) rc = allow ? lock_allow_args(ctx, self) : lock_deny_args(ctx, self);
  if (!rc) rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(ENOSYS), SCMP_SYS(clone3), 0);
  /* every thread: the engine's pools (which run the JIT code) started
     before this, and a filter loaded without TSYNC binds only this thread */
  if (!rc) rc = seccomp_attr_set(ctx, SCMP_FLTATR_CTL_TSYNC, 1);
  if (!rc && !nnp) rc = seccomp_attr_set(ctx, SCMP_FLTATR_CTL_NNP, 0);
  /* a binary tree of syscall numbers rather than a list: the pools call
     sched_yield and futex often (libseccomp 2.5; older ones keep the list) */
  if (!rc) (void)seccomp_attr_set(ctx, SCMP_FLTATR_CTL_OPTIMIZE, 2);
  if (rc) seccomp_release(ctx);
  else *out = ctx;
  return rc;
}

static int lock_down(const char *backend, int nnp, char *err, size_t errlen) {
  scmp_filter_ctx ctx;
  int rc = lock_build(backend, nnp, &ctx);
  if (!rc) {
    rc = seccomp_load(ctx);
    seccomp_release(ctx);
  }
  if (rc) fb_errf(err, errlen, "cannot install the seccomp filter: %s", strerror(-rc));
  return rc ? FB_EINTERNAL : 0;
}

static int limit_memory(const fbd_config *cfg, const char *backend) {
  struct rlimit none = {0, 0};
  setrlimit(RLIMIT_CORE, &none); /* a crash leaves no copy of a tenant's data */
#ifdef FBD_ASAN
  (void)cfg;
  (void)backend;
  return 0; /* the sanitizer's shadow memory needs terabytes of address space */
#else
  /* the CUDA driver maps device memory into the address space */
  if (!cfg->session_memory_limit || strcmp(backend, "cpu") != 0) return 0;
  uint64_t cap = cfg->session_memory_limit + cfg->worker_overhead_bytes;
  if (cap < cfg->session_memory_limit) return 0;
  struct rlimit as = {(rlim_t)cap, (rlim_t)cap};
  return setrlimit(RLIMIT_AS, &as) ? FB_EINTERNAL : 0;
#endif
}

/* Open descriptors a worker may hold (RLIMIT_NOFILE): a CPU worker uses
 * stdin to stderr, its socket and a staging buffer's memfd at a time (the
 * watch page and the buffers it keeps are mappings, not descriptors); a
 * CUDA worker also the driver's, opened before lock-down and not known
 * without a GPU to count them on. */
static int limit_files(const char *backend) {
  rlim_t want = strcmp(backend, "cpu") ? WORKER_NOFILE_CUDA : WORKER_NOFILE_CPU;
  struct rlimit cur;
  if (getrlimit(RLIMIT_NOFILE, &cur)) return FB_EINTERNAL;
  if (cur.rlim_max != RLIM_INFINITY && cur.rlim_max < want) want = cur.rlim_max;
  struct rlimit lim = {want, want};
  return setrlimit(RLIMIT_NOFILE, &lim) ? FB_EINTERNAL : 0;
}

/* The broker: the process that made the worker's socket pair (so a broker
 * that is pid 1, in a container, is told apart from a reparented worker).
 * 0 for a worker in a PID namespace of its own: the broker is outside it,
 * and has no pid there (nor has its parent: getppid() is 0 too). */
static pid_t broker_pid(int fd) {
  struct ucred u;
  socklen_t n = sizeof u;
  return getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &u, &n) ? -1 : u.pid;
}

/* Whether the broker still lives, once the parent-death signal is set (a
 * broker that dies later kills the worker): its pid is still the parent's,
 * or, in a PID namespace where neither has a pid, its end of the socket is
 * still open. */
static int broker_alive(int fd, pid_t parent) {
  if (parent > 0) return getppid() == parent;
  if (parent < 0 || getpid() != 1 || getppid() != 0) return 0;
  struct pollfd pf = {fd, POLLRDHUP, 0};
  return poll(&pf, 1, 0) == 0;
}

/* Started by a root fuseboxd, the worker becomes the worker user ("UID:GID"
 * from the broker, which resolved the name): no supplementary groups, the
 * group before the user (a process that is no longer root cannot change
 * its group), real, effective and saved ids all, on every thread (glibc
 * applies set*id to the whole process). Then it checks that the switch
 * took and cannot be undone. Changing ids clears the parent-death signal
 * and makes the process dumpable again, so both are set anew; a broker that
 * died meanwhile makes the worker leave. Before lock-down, which refuses
 * these calls. */
static int drop_ids(unsigned long uid, unsigned long gid, int fd, pid_t parent, char *err,
                    size_t errlen) {
  if (setgroups(0, NULL) || setresgid((gid_t)gid, (gid_t)gid, (gid_t)gid) ||
      setresuid((uid_t)uid, (uid_t)uid, (uid_t)uid)) {
    fb_errf(err, errlen, "cannot switch to uid %lu, gid %lu: %s", uid, gid, strerror(errno));
    return FB_EINTERNAL;
  }
  uid_t r, e, sv;
  gid_t rg, eg, sg;
  if (getresuid(&r, &e, &sv) || getresgid(&rg, &eg, &sg) || r != uid || e != uid || sv != uid ||
      rg != gid || eg != gid || sg != gid || getgroups(0, NULL) != 0 || setresuid(0, 0, 0) == 0 ||
      setresgid(0, 0, 0) == 0) {
    fb_errf(err, errlen, "the switch to uid %lu, gid %lu did not take (or could be undone)", uid,
            gid);
    return FB_EINTERNAL;
  }
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (!broker_alive(fd, parent)) _exit(1);
  prctl(PR_SET_DUMPABLE, 0);
  return 0;
}

/* The worker user's ids: "UID:GID" (--worker-user, as the broker hands it
 * on), or with --worker-uid-base the ids of the tenant whose session takes
 * this worker, the first frame the broker sends (a spare waits for it, as
 * root, having read nothing a client sent), within the range. */
static int drop_user(const fbd_config *cfg, int fd, pid_t parent, int skip, char *err,
                     size_t errlen) {
  unsigned long uid = 0, gid = 0;
  if (cfg->worker_uid_base) {
    wire_ident w;
    if (read_all(fd, &w, sizeof w, NULL, NULL) || w.magic != IDENT_MAGIC) _exit(1);
    uint64_t lo = cfg->worker_uid_base, hi = lo + (uint64_t)cfg->worker_uid_count;
    if (w.uid < lo || w.uid >= hi || w.gid < lo || w.gid >= hi) {
      fb_errf(err, errlen, "the tenant's uid %lu, gid %lu: not in worker_uid_base's range",
              (unsigned long)w.uid, (unsigned long)w.gid);
      return FB_EINVAL;
    }
    return skip ? 0 : drop_ids(w.uid, w.gid, fd, parent, err, errlen);
  }
  const char *ids = cfg->worker_user;
  if (!ids) return 0;
  char *end = NULL;
  errno = 0;
  uid = strtoul(ids, &end, 10);
  if (!errno && *end == ':') gid = strtoul(end + 1, &end, 10);
  if (errno || *end || !uid || !gid || uid >= (uid_t)-1 || gid >= (gid_t)-1) {
    fb_errf(err, errlen, "bad worker user '%s' (expected UID:GID, neither 0)", ids);
    return FB_EINVAL;
  }
  return skip ? 0 : drop_ids(uid, gid, fd, parent, err, errlen);
}

typedef struct worker {
  int fd;
  int cache_fd; /* the compile cache's socket to the broker (-1: none) */
  pthread_mutex_t cache_mu; /* one request at a time on it */
  fb_engine *engine;
  fbd_watch *watch;
  fbd_log log;
  fbd_exec x;
  fb_layout *layout; /* the session's: from CREATE, or from the PARSE before it */
  int created;
  const fbd_config *cfg;
} worker;

static int worker_create(worker *w, const uint8_t *p, size_t n, fbd_reply *r) {
  wire_create c;
  if (w->created || n < sizeof c) {
    fb_errf(r->msg, sizeof r->msg, "a second or malformed CREATE");
    return FB_EINVAL;
  }
  memcpy(&c, p, sizeof c);
  c.mode[sizeof c.mode - 1] = 0;
  c.tag[sizeof c.tag - 1] = 0;
  fbp_arena a;
  fbp_arena_init(&a);
  Fusebox__V1__CreateSessionRequest *m =
      (Fusebox__V1__CreateSessionRequest *)protobuf_c_message_unpack(
          &fusebox__v1__create_session_request__descriptor, &a.pb, n - sizeof c, p + sizeof c);
  /* a source's layout came with the PARSE before */
  int rc = w->layout ? 0
           : !m      ? FB_EINVAL
                     : fbp_layout_from_pb(m->layout, &w->layout, r->msg, sizeof r->msg);
  if (!w->layout && !rc && m && m->source) rc = FB_EINVAL;
  if (!m) fb_errf(r->msg, sizeof r->msg, "malformed CreateSessionRequest");
  else if (rc == FB_EINVAL && m->source && !w->layout)
    fb_errf(r->msg, sizeof r->msg, "CREATE of a source without its PARSE");
  fbp_arena_free(&a);
  if (rc) return rc;
  fb_session_config ec;
  memset(&ec, 0, sizeof ec);
  ec.mode = c.mode;
  ec.seed = c.seed;
  ec.memory_limit = c.memory_limit;
  ec.passes = c.passes;
  ec.flush_every = c.flush_every;
  ec.max_fuse_per_task = c.max_fuse_per_task;
  ec.max_kernel_statements = c.max_kernel_statements;
  static char tag[16];
  snprintf(tag, sizeof tag, "%s", c.tag);
  fbd_exec_init(&w->x, w->engine, w->layout, &ec, tag, &w->log, w->watch);
  w->x.parse_timeout_s = w->cfg->compile_timeout_s; /* its kernels' sources */
  w->created = 1;
  fbd_exec_run(&w->x, FBD_J_CREATE, NULL, 0, NULL, 0, r);
  return 0;
}

/* The memfds of field transfers, mapped. A session's broker reuses its
 * last two staging buffers for transfers of the same size, so the worker
 * keeps its last two mappings too (by inode): repeated reads and writes of
 * a field map and fault in nothing. */
typedef struct mapping {
  ino_t ino;
  uint64_t len;
  uint8_t *p;
  uint64_t used;
} mapping;

static mapping maps[2];
static uint64_t map_clock;

static uint8_t *map_buf(int fd, uint64_t len, char *err, size_t errlen) {
  struct stat st;
  if (fd < 0 || fstat(fd, &st) || (uint64_t)st.st_size < len || !len) {
    fb_errf(err, errlen, "field transfer without a buffer of %llu bytes", (unsigned long long)len);
    return NULL;
  }
  for (int i = 0; i < 2; i++)
    if (maps[i].p && maps[i].ino == st.st_ino && maps[i].len == len) {
      maps[i].used = ++map_clock;
      return maps[i].p;
    }
  void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  if (p == MAP_FAILED) {
    fb_errf(err, errlen, "cannot map %llu bytes of field data: %s", (unsigned long long)len,
            strerror(errno));
    return NULL;
  }
  int k = !maps[0].p ? 0 : !maps[1].p ? 1 : maps[0].used < maps[1].used ? 0 : 1;
  if (maps[k].p) munmap(maps[k].p, maps[k].len);
  maps[k] = (mapping){st.st_ino, len, p, ++map_clock};
  return p;
}

/* A tenant's source, parsed here in its sandbox: the layout for the CREATE
 * to come (sent back as protobuf), or DescribeSource's answer. */
static void worker_parse(worker *w, int kind, const uint8_t *p, size_t n, fbd_reply *r) {
  w->x.watch = w->watch; /* the limits of the parse (exec.c) */
  w->x.parse_timeout_s = w->cfg->compile_timeout_s;
  r->finish = 1;
  if (w->created || w->layout) {
    r->code = FB_EINVAL;
    fb_errf(r->msg, sizeof r->msg, "a parse after the session's layout was set");
    return;
  }
  if (kind == FBD_J_DESCRIBE) {
    fbd_exec_describe(&w->x, p, n, r);
    return;
  }
  r->code = fbd_exec_parse(&w->x, p, n, &w->layout, r->msg, sizeof r->msg);
  if (r->code) return;
  fbp_arena a;
  fbp_arena_init(&a);
  Fusebox__V1__Layout *m = fbp_layout_to_pb(&a, w->layout);
  size_t len = m ? protobuf_c_message_get_packed_size(&m->base) : 0;
  if (!m || !(r->pb = malloc(len ? len : 1))) {
    r->code = FB_ENOMEM;
    fb_errf(r->msg, sizeof r->msg, "out of memory packing the layout");
  } else {
    r->pblen = protobuf_c_message_pack(&m->base, r->pb);
  }
  fbp_arena_free(&a);
}

/* CKPT in the worker: the stream goes to the broker in data frames. */
static int worker_data_sink(void *user, const void *buf, size_t n) {
  worker *w = user;
  const uint8_t *p = buf;
  while (n) {
    size_t k = n < DATA_MAX ? n : (size_t)DATA_MAX;
    wire_rep h;
    memset(&h, 0, sizeof h);
    h.magic = DATA_MAGIC;
    h.pblen = k;
    if (write_all(w->fd, &h, sizeof h, NULL) || write_all(w->fd, p, k, NULL)) return 1;
    p += k;
    n -= k;
  }
  return 0;
}

/* RESTORE in the worker: the stream from the broker's data frames. */
typedef struct data_in {
  int fd;
  uint64_t left; /* of the current frame */
  int ended, bad;
} data_in;

static long worker_data_source(void *user, void *buf, size_t n) {
  data_in *d = user;
  while (!d->left) {
    if (d->ended || d->bad) return d->bad ? -1 : 0;
    wire_req q;
    if (read_all(d->fd, &q, sizeof q, NULL, NULL) || q.magic != DATA_MAGIC || q.len > DATA_MAX) {
      d->bad = 1;
      return -1;
    }
    if (!q.len) d->ended = 1;
    d->left = q.len;
  }
  if (n > d->left) n = (size_t)d->left;
  if (read_all(d->fd, buf, n, NULL, NULL)) {
    d->bad = 1;
    return -1;
  }
  d->left -= n;
  return (long)n;
}

static void worker_restore(worker *w, const uint8_t *p, size_t n, fbd_reply *r) {
  wire_create c;
  data_in d = {w->fd, 0, 0, 0};
  r->finish = r->fatal = 1;
  if (w->created || w->layout || n < sizeof c) {
    r->code = FB_EINVAL;
    fb_errf(r->msg, sizeof r->msg, "a RESTORE after the session was made");
  } else {
    memcpy(&c, p, sizeof c);
    c.mode[sizeof c.mode - 1] = 0;
    c.tag[sizeof c.tag - 1] = 0;
    fb_session_config ec;
    memset(&ec, 0, sizeof ec);
    ec.mode = c.mode;
    ec.seed = c.seed;
    ec.memory_limit = c.memory_limit;
    ec.passes = c.passes;
    ec.flush_every = c.flush_every;
    ec.max_fuse_per_task = c.max_fuse_per_task;
    ec.max_kernel_statements = c.max_kernel_statements;
    static char tag[16];
    snprintf(tag, sizeof tag, "%s", c.tag);
    fbd_exec_init(&w->x, w->engine, NULL, &ec, tag, &w->log, w->watch);
    w->x.parse_timeout_s = w->cfg->compile_timeout_s;
    if (!fbd_exec_restore(&w->x, worker_data_source, &d, r)) {
      w->created = 1;
      r->fatal = 0;
      fbp_arena a;
      fbp_arena_init(&a);
      Fusebox__V1__Layout *m = fbp_layout_to_pb(&a, w->x.layout);
      size_t len = m ? protobuf_c_message_get_packed_size(&m->base) : 0;
      if (!m || !(r->pb = malloc(len ? len : 1))) {
        r->code = FB_ENOMEM;
        r->fatal = 1;
        fb_errf(r->msg, sizeof r->msg, "out of memory packing the layout");
      } else {
        r->pblen = protobuf_c_message_pack(&m->base, r->pb);
      }
      fbp_arena_free(&a);
    }
  }
  /* the rest of the stream, so that the reply is read where it is due */
  char sink[65536];
  while (!d.bad && (d.left || !d.ended)) worker_data_source(&d, sink, sizeof sink);
}

static void worker_job(worker *w, const wire_req *q, uint8_t *payload, int fd, fbd_reply *r) {
  const ProtobufCMessageDescriptor *d =
      q->kind == FBD_J_REGISTER ? &fusebox__v1__register_kernels_request__descriptor
      : q->kind == FBD_J_BATCH  ? &fusebox__v1__session_request__descriptor
                                : NULL;
  if (q->kind == FBD_J_PARSE || q->kind == FBD_J_DESCRIBE) { /* before CREATE, if at all */
    worker_parse(w, q->kind, payload, q->len, r);
    return;
  }
  if (q->kind == FBD_J_RESTORE) {
    worker_restore(w, payload, q->len, r);
    return;
  }
  if (q->kind == FBD_J_CKPT) {
    fbd_exec_checkpoint(&w->x, worker_data_sink, w, r);
    return;
  }
  if (q->kind == FBD_J_CREATE) {
    int rc = worker_create(w, payload, q->len, r);
    if (rc) {
      r->code = rc;
      r->finish = r->fatal = 1;
    }
    return;
  }
  fbp_arena a;
  fbp_arena_init(&a);
  void *m = NULL;
  if (d && !(m = protobuf_c_message_unpack(d, &a.pb, q->len, payload))) {
    r->code = FB_EINVAL;
    r->finish = 1;
    fb_errf(r->msg, sizeof r->msg, "malformed %s", d->name);
  } else if (q->kind == FBD_J_WRITE || q->kind == FBD_J_READ || q->kind == FBD_J_ACTIVE) {
    uint8_t *buf = fault_armed && fault_kind == FAULT_MEMFD && fd >= 0
                       ? NULL
                       : map_buf(fd, q->buflen, r->msg, sizeof r->msg);
    if (!buf && fault_armed && fault_kind == FAULT_MEMFD && fd >= 0) {
      fault_memfd(fd, q->buflen, r);
    } else if (!buf) {
      r->code = FB_EINVAL;
      r->finish = 1;
    } else {
      fbd_exec_run(&w->x, q->kind, NULL, q->field, buf, q->buflen, r);
    }
  } else {
    if (q->kind != FBD_J_REGISTER || !fault_check_register(m, r))
      fbd_exec_run(&w->x, q->kind, m, q->field, NULL, 0, r);
  }
  fbp_arena_free(&a);
}

/* The worker's code store: every request goes to the broker, which holds
 * the cache (cache_main). Any failure turns the store off: compile. */
static int worker_cache_req(worker *w, uint32_t op, const char *target, const char *ir,
                            size_t irlen, const uint8_t *code, size_t len) {
  wire_cache h = {CACHE_MAGIC, op, strlen(target), irlen, op == CACHE_PUT ? len : 0};
  return write_full(w->cache_fd, &h, sizeof h) || write_full(w->cache_fd, target, h.target_len) ||
         write_full(w->cache_fd, ir, irlen) || (h.code_len && write_full(w->cache_fd, code, len));
}

static void worker_cache_off(worker *w) {
  if (w->cache_fd >= 0) close(w->cache_fd);
  w->cache_fd = -1;
}

static int worker_store_get(void *user, uint64_t partition, const char *target, const char *ir,
                            size_t irlen, uint8_t **code, size_t *len) {
  worker *w = user;
  (void)partition; /* the broker uses the session's own */
  int found = 0;
  pthread_mutex_lock(&w->cache_mu);
  wire_cache a;
  if (w->cache_fd >= 0) {
    if (worker_cache_req(w, CACHE_GET, target, ir, irlen, NULL, 0) ||
        read_full(w->cache_fd, &a, sizeof a) || a.magic != CACHE_MAGIC || a.op > 1 ||
        a.code_len > FBD_DCACHE_MAX_PAYLOAD) {
      worker_cache_off(w);
    } else if (a.op == 1) {
      uint8_t *b = malloc(a.code_len ? a.code_len : 1);
      if (b && !read_full(w->cache_fd, b, a.code_len)) {
        *code = b;
        *len = a.code_len;
        found = 1;
      } else {
        free(b);
        worker_cache_off(w);
      }
    }
  }
  pthread_mutex_unlock(&w->cache_mu);
  return found;
}

static void worker_store_put(void *user, uint64_t partition, const char *target, const char *ir,
                             size_t irlen, const uint8_t *code, size_t len) {
  worker *w = user;
  (void)partition;
  pthread_mutex_lock(&w->cache_mu);
  if (w->cache_fd >= 0 && worker_cache_req(w, CACHE_PUT, target, ir, irlen, code, len))
    worker_cache_off(w);
  pthread_mutex_unlock(&w->cache_mu);
}

static void worker_loop(worker *w, double spin_s) {
  for (;;) {
    if (!wait_readable(w->fd, spin_s, -1)) continue;
    wire_req q;
    int fd = -1;
    if (read_all(w->fd, &q, sizeof q, &fd, NULL) || q.magic != WIRE_MAGIC ||
        q.len > WIRE_MAX_PAYLOAD)
      break; /* the broker is gone (or mad): nothing to answer */
    uint8_t *payload = malloc(q.len ? q.len : 1);
    if (!payload || (q.len && read_all(w->fd, payload, q.len, NULL, NULL))) break;
    fbd_reply r;
    memset(&r, 0, sizeof r);
    worker_job(w, &q, payload, fd, &r);
    free(payload);
    if (q.kind == FBD_J_CREATE && fd >= 0 && !r.code && w->cache_fd < 0) {
      /* the broker's compile cache: set before any compile of the session */
      fb_code_store st = {worker_store_get, worker_store_put, w};
      w->cache_fd = fd;
      fd = -1;
      if (fb_engine_set_code_store(w->engine, &st)) worker_cache_off(w);
    }
    if (fd >= 0) close(fd);
    int end = q.kind == FBD_J_CLOSE || q.kind == FBD_J_END || r.fatal;
    int bad = reply(w->fd, &r);
    fbd_reply_clear(&r);
    if (bad || end) break;
  }
}

void fbd_worker_process_main(int fd, const fbd_config *cfg) {
  prctl(PR_SET_PDEATHSIG, SIGKILL); /* the broker's end is our end */
  pid_t parent = broker_pid(fd);
  if (!broker_alive(fd, parent)) _exit(1); /* it died before the line above */
  /* first, while one thread: unshare moves only the calling thread */
  const char *nsw = cfg->worker_namespaces ? cfg->worker_namespaces : "off";
  int ns_level = !strcmp(nsw, "on") ? WORKER_NS_ROOT : !strcmp(nsw, "net") ? WORKER_NS_NET : 0;
  int ns_step = 0, ns_err = ns_level ? ns_enter(ns_level, &ns_step) : 0;
  prctl(PR_SET_DUMPABLE, 0);        /* no ptrace, no /proc/PID/mem for anyone else */
  signal(SIGPIPE, SIG_IGN);
  fault_init();
  worker w;
  memset(&w, 0, sizeof w);
  w.fd = fd;
  w.cache_fd = -1;
  pthread_mutex_init(&w.cache_mu, NULL);
  w.cfg = cfg;
  fbd_log_init(&w.log, stderr, cfg->log_level);
  fbd_reply hello;
  memset(&hello, 0, sizeof hello);
  w.watch = mmap(NULL, WATCH_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, 4, 0);
  close_range(5, ~0u, 0);
  close(4);
  fb_engine_config ecfg = {cfg->backend, cfg->compile_threads, cfg->cpu_threads};
  int off[FBD_NWALLS]; /* the walls the broker found refused: the worker goes on without them */
  char offerr[256] = "";
  int offrc = walls_parse(cfg->worker_walls_off, "--worker-walls-off", 0, 0, off, offerr,
                          sizeof offerr);
  if (offrc) {
    hello.code = offrc;
    fb_errf(hello.msg, sizeof hello.msg, "%s", offerr);
  } else if (w.watch == MAP_FAILED) {
    hello.code = FB_EINTERNAL;
    fb_errf(hello.msg, sizeof hello.msg, "cannot map the watch page: %s", strerror(errno));
  } else if (ns_err) {
    hello.code = FB_EINTERNAL;
    fb_errf(hello.msg, sizeof hello.msg, "cannot enter its namespaces: %s: %s", ns_steps[ns_step],
            strerror(ns_err));
  } else if (ns_level >= WORKER_NS_ROOT && parent != 0) {
    hello.code = FB_EINTERNAL;
    fb_errf(hello.msg, sizeof hello.msg, "not started in a PID namespace of its own");
  } else if ((hello.code = fb_engine_create(&ecfg, &w.engine, hello.msg, sizeof hello.msg))) {
  } else if (ns_level >= WORKER_NS_ROOT && (ns_err = empty_root(&ns_step))) {
    hello.code = FB_EINTERNAL;
    fb_errf(hello.msg, sizeof hello.msg, "cannot make its root an empty directory: %s: %s",
            ns_steps[ns_step], strerror(ns_err));
  } else if ((hello.code = drop_user(cfg, fd, parent, off[FBD_WALL_UID], hello.msg,
                                     sizeof hello.msg))) {
  } else if (!off[FBD_WALL_RLIMITS] && (limit_memory(cfg, fb_engine_backend(w.engine)) ||
                                        limit_files(fb_engine_backend(w.engine)))) {
    hello.code = FB_EINTERNAL;
    fb_errf(hello.msg, sizeof hello.msg, "cannot set the worker's resource limits: %s",
            strerror(errno));
  } else {
    fb_engine_set_code_cache_bytes(w.engine, fbd_code_cache_bytes(cfg, 0)); /* the broker's */
    if (!off[FBD_WALL_NNP] && prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)) {
      hello.code = FB_EINTERNAL;
      fb_errf(hello.msg, sizeof hello.msg, "cannot set no_new_privs: %s", strerror(errno));
    } else if (!off[FBD_WALL_SECCOMP]) {
      hello.code = lock_down(fb_engine_backend(w.engine), !off[FBD_WALL_NNP], hello.msg,
                             sizeof hello.msg);
    }
  }
  if (reply(fd, &hello) || hello.code) _exit(1);
  worker_loop(&w, cfg->worker_spin_us * 1e-6);
  /* _exit: no destructors or leak checks, which would want files */
  _exit(0);
}
