/* Process isolation inside fuseboxd (server/session/README.md): what the
 * files of the session side share. Each session's engine (its JIT code,
 * device memory and CUDA context) lives in a process of its own, so that a
 * kernel that crashes, corrupts memory or never ends can only take its own
 * session.
 *
 * A session process (a "worker") is fuseboxd re-executed with
 * --session-worker (a fresh image: nothing of the broker's memory, no
 * other session's descriptors). It makes its engine, closes every
 * descriptor but its socket and its watch page, drops core dumps and
 * ptrace access, caps its address space (RLIMIT_AS at the session's memory
 * limit plus worker_overhead_bytes) and installs a seccomp filter
 * (seccomp.c) that refuses opening files, executing programs, network
 * sockets, signalling other processes and reading their memory. Only then
 * does it read what a client sent. The broker keeps spare_workers of them
 * started, so that creating a session costs no process start.
 *
 * The broker alone keeps time: a task running longer than
 * kernel_timeout_s (the watch page, shared memory, says which), a
 * RegisterKernels longer than compile_timeout_s, or an aborted session
 * whose work does not stop within a second gets the process SIGKILLed; a
 * process that dies ends only its session. */
#ifndef FBD_SESSION_PROC_H
#define FBD_SESSION_PROC_H

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
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
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <pthread.h>

#include "server/dcache.h"
#include "server/server.h"
#include "server/session/frame.h"

extern char **environ;

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
#define NS_FLAGS(level)                                                                            \
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

#define WORKER_NOFILE_CPU 64
#define WORKER_NOFILE_CUDA 1024

struct fbd_proc {
  pid_t pid;
  int cache_fd; /* the compile cache's socket to the worker (-1: none) */
  pthread_t cache_th; /* ... and the thread that serves it */
  int cache_th_on;
  int pidfd; /* for the scheduler's SIGSTOP/SIGCONT; -1 when none */
  int fd; /* the socket to the worker */
  fbd_watch *watch; /* the page shared with it */
  int reaped;
  uint64_t unsynced; /* launches sent since its last SyncResult (reply_cap) */
  int refused; /* a SessionRequest was refused in the worker: later ones are not run */
  uint64_t own_bytes; /* a spare's: its last measure (fbd_proc_measure), under pmu */
};

/* FUSEBOXD_FAULT_INJECT's kinds (fault.c) */
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

/* spawn.c */
void fbd_proc_reap(fbd_proc *p, int kill_it, char *why, size_t n);
void fbd_proc_reap_lost(fbd_proc *p, char *why, size_t n);
int fbd_spawn_in_pid_ns(pid_t *pid, const char *exe, int sock, int wfd, char *const argv[]);
int fbd_proc_take(fbd_server *srv, fbd_proc **out, char *err, size_t errlen);

/* identity.c */
int fbd_worker_identity(fbd_server *srv, char *err, size_t errlen);

/* walls.c */
int fbd_walls_parse(const char *list, const char *shown, int with_errno, int allow_all,
                    int out[FBD_NWALLS], char *err, size_t errlen);
void fbd_wall_refused(fbd_server *srv, int i, int e, const char *step);
void fbd_walls_report(fbd_server *srv);
int fbd_ns_probe(int level, const char **step);
int fbd_worker_namespaces(fbd_server *srv, char *err, size_t errlen);
int fbd_walls_probe(fbd_server *srv, char *err, size_t errlen);
int fbd_walls_required(fbd_server *srv, char *err, size_t errlen);
extern int fbd_wall_inject[FBD_NWALLS];

/* sandbox.c */
int fbd_ns_enter(int level, int *step);
int fbd_empty_root(int *step);
int fbd_limit_memory(const fbd_config *cfg, const char *backend);
int fbd_limit_files(const char *backend);
pid_t fbd_broker_pid(int fd);
int fbd_broker_alive(int fd, pid_t parent);
int fbd_drop_user(const fbd_config *cfg, int fd, pid_t parent, int skip, char *err, size_t errlen);
#define NS_NSTEPS 6 /* the steps of entering the namespaces, named in errors */
extern const char *const fbd_ns_steps[NS_NSTEPS];

/* seccomp.c */
int fbd_lock_export(const char *backend, struct sock_fprog *prog);
int fbd_lock_build(const char *backend, int nnp, scmp_filter_ctx *out);
int fbd_lock_down(const char *backend, int nnp, char *err, size_t errlen);

/* bounds.c */
uint64_t fbd_reply_cap(const fbd_proc *p, const fbd_job *j);

/* cache.c */
int fbd_cache_start(fbd_session *s);

/* fault.c */
void fbd_fault_init(void);
void fbd_fault_memfd(int fd, uint64_t len, fbd_reply *r);
int fbd_fault_check_register(const Fusebox__V1__RegisterKernelsRequest *m, fbd_reply *r);
void fbd_fault_header(wire_rep *h);
void fbd_fault_hang(void);
int fbd_fault_stall(const wire_rep *h);
extern int fbd_fault_kind, fbd_fault_armed;

/* worker.c */
int fbd_worker_reply(int fd, const fbd_reply *r);

#endif
