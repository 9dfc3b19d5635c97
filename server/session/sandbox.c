/* The session process's own sandbox steps (besides seccomp.c's filter):
 * entering its namespaces and making its root an empty read-only tmpfs,
 * resource limits (core, address space, descriptors), telling its broker
 * apart and switching to the workers' user and group. */
#define _GNU_SOURCE
#include "server/session/proc.h"

/* The worker's side of its namespaces, in two steps. fbd_ns_enter, first thing,
 * while the worker is one thread (unshare moves only the calling thread;
 * the engine's threads, made later, inherit): the new namespaces, and for
 * a mount namespace every mount made private, so that what the worker
 * mounts never shows in fuseboxd's namespace. fbd_empty_root, once everything
 * the worker reads from disk is open (the engine made: LLVM, the CUDA
 * driver and what it opens), while it is still root: a tmpfs with nothing
 * in it becomes the root of the mount namespace (pivot_root moves every
 * thread's root and working directory), the host's root is detached, and
 * the tmpfs made read-only. Past seccomp, a worker then finds no file of
 * the host by path: no /proc, /dev, /etc or /home. Descriptors opened
 * before (a CUDA driver's /dev/nvidia*) stay open. Plain syscalls only:
 * fbd_ns_probe runs both in a child cloned from a threaded process. 0, or
 * errno with *step an index of fbd_ns_steps, naming what failed. */
const char *const fbd_ns_steps[NS_NSTEPS] = {
    "unshare",    "make the mounts private", "mount a tmpfs on " ROOT_STAGE,
    "pivot_root", "detach the host's root",  "make the root read-only"};

int fbd_ns_enter(int level, int *step) {
  *step = 0;
  if (unshare(NS_FLAGS(level))) return errno;
  *step = 1;
  if (level >= WORKER_NS_ROOT && mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL)) return errno;
  return 0;
}

int fbd_empty_root(int *step) {
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

int fbd_limit_memory(const fbd_config *cfg, const char *backend) {
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
int fbd_limit_files(const char *backend) {
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
pid_t fbd_broker_pid(int fd) {
  struct ucred u;
  socklen_t n = sizeof u;
  return getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &u, &n) ? -1 : u.pid;
}

/* Whether the broker still lives, once the parent-death signal is set (a
 * broker that dies later kills the worker): its pid is still the parent's,
 * or, in a PID namespace where neither has a pid, its end of the socket is
 * still open. */
int fbd_broker_alive(int fd, pid_t parent) {
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
  if (!fbd_broker_alive(fd, parent)) _exit(1);
  prctl(PR_SET_DUMPABLE, 0);
  return 0;
}

/* The worker user's ids: "UID:GID" (--worker-user, as the broker hands it
 * on), or with --worker-uid-base the ids of the tenant whose session takes
 * this worker, the first frame the broker sends (a spare waits for it, as
 * root, having read nothing a client sent), within the range. */
int fbd_drop_user(const fbd_config *cfg, int fd, pid_t parent, int skip, char *err, size_t errlen) {
  unsigned long uid = 0, gid = 0;
  if (cfg->worker_uid_base) {
    wire_ident w;
    if (fbd_frame_read(fd, &w, sizeof w, NULL, NULL) || w.magic != IDENT_MAGIC) _exit(1);
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
