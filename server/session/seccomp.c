/* The seccomp filter a session process installs on itself (lock_down):
 * an allow list for CPU backends, a deny list for CUDA, with argument
 * checks; also exported as BPF for the broker's probe (walls.c). */
#define _GNU_SOURCE
#include "server/session/proc.h"

/* The seccomp filter as fbd_lock_down would install it, exported as BPF for
 * fbd_walls_probe's child (which makes no library call): 0, or a libseccomp
 * error. *prog's filter is malloc'd. */
int fbd_lock_export(const char *backend, struct sock_fprog *prog) {
  scmp_filter_ctx ctx;
  int rc = fbd_lock_build(backend, 1, &ctx);
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
    rc =
        seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(fcntl), 2,
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
int fbd_lock_build(const char *backend, int nnp, scmp_filter_ctx *out) {
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

int fbd_lock_down(const char *backend, int nnp, char *err, size_t errlen) {
  scmp_filter_ctx ctx;
  int rc = fbd_lock_build(backend, nnp, &ctx);
  if (!rc) {
    rc = seccomp_load(ctx);
    seccomp_release(ctx);
  }
  if (rc) fb_errf(err, errlen, "cannot install the seccomp filter: %s", strerror(-rc));
  return rc ? FB_EINTERNAL : 0;
}
