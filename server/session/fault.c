/* Test fault injection in the session process (FUSEBOXD_FAULT_INJECT, in
 * fuseboxd's environment only: no client reaches it): a process that
 * misbehaves as a compromised one might, for tests of the walls through
 * the public protocol. */
#define _GNU_SOURCE
#include "server/session/proc.h"

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
static char fault_kernel[64];
int fbd_fault_kind, fbd_fault_armed;

void fbd_fault_init(void) {
  static const struct {
    const char *prefix;
    int kind;
  } kinds[] = {{"reply-stall:", FAULT_STALL},   {"reply-oversize:", FAULT_OVERSIZE},
               {"syscall-probe:", FAULT_PROBE}, {"exec:", FAULT_EXEC},
               {"sigio-probe:", FAULT_SIGIO},   {"rlimit-probe:", FAULT_RLIMIT},
               {"signal-probe:", FAULT_SIGNAL}, {"memfd-resize:", FAULT_MEMFD},
               {"close-socket:", FAULT_CLOSE},  {"device-bytes:", FAULT_DEVICE}};
  const char *f = getenv(FAULT_ENV);
  for (size_t i = 0; f && i < sizeof kinds / sizeof kinds[0]; i++) {
    size_t n = strlen(kinds[i].prefix);
    if (strncmp(f, kinds[i].prefix, n)) continue;
    fbd_fault_kind = kinds[i].kind;
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
  fault_note(out, n, "rt_sigqueueinfo broker", syscall(SYS_rt_sigqueueinfo, broker, SIGCONT, &si));
  fault_note(out, n, "rt_tgsigqueueinfo broker",
             syscall(SYS_rt_tgsigqueueinfo, broker, broker, SIGCONT, &si));
  si.si_signo = SIGURG;
  fault_note(out, n, "rt_sigqueueinfo self", syscall(SYS_rt_sigqueueinfo, self, SIGURG, &si));
}

/* At a field transfer: resize the staging buffer's memfd fd of len bytes. */
void fbd_fault_memfd(int fd, uint64_t len, fbd_reply *r) {
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
int fbd_fault_check_register(const Fusebox__V1__RegisterKernelsRequest *m, fbd_reply *r) {
  int hit = 0;
  for (size_t i = 0; fault_kernel[0] && i < m->n_kernels; i++)
    if (m->kernels[i]->name && !strcmp(m->kernels[i]->name, fault_kernel)) hit = 1;
  if (!hit) return 0;
  if (fbd_fault_kind == FAULT_EXEC) {
    char *const argv[] = {"/bin/true", NULL};
    execve("/bin/true", argv, environ);
    fb_errf(r->msg, sizeof r->msg, "fault exec: execve returned (%s)", strerrorname_np(errno));
  } else if (fbd_fault_kind == FAULT_PROBE) {
    char out[512] = "", cwd[256];
    struct utsname u;
    struct stat st;
    fault_note(out, sizeof out, "openat", (long)open("/etc/passwd", O_RDONLY | O_CLOEXEC));
    fault_note(out, sizeof out, "getcwd", getcwd(cwd, sizeof cwd) ? 0 : -1);
    fault_note(out, sizeof out, "uname", (long)uname(&u));
    fault_note(out, sizeof out, "stat /etc/passwd", (long)stat("/etc/passwd", &st));
    fb_errf(r->msg, sizeof r->msg, "fault probe: %s", out);
  } else if (fbd_fault_kind == FAULT_SIGIO || fbd_fault_kind == FAULT_RLIMIT ||
             fbd_fault_kind == FAULT_SIGNAL) {
    char out[600] = "";
    if (fbd_fault_kind == FAULT_SIGIO) fault_sigio(out, sizeof out);
    else if (fbd_fault_kind == FAULT_RLIMIT) fault_rlimit(out, sizeof out);
    else fault_signal(out, sizeof out);
    fb_errf(r->msg, sizeof r->msg, "fault probe: %s", out);
  } else if (fbd_fault_kind == FAULT_CLOSE) {
    close(3); /* its socket: the broker reads end of file, the worker lives on */
    fbd_fault_hang();
  } else {
    fbd_fault_armed = 1;
    return 0;
  }
  r->code = FB_EINTERNAL;
  r->finish = 1;
  return 1;
}

/* The header h is about to go: a stalled reply stops after it for good,
 * an oversized one claims far more than it has. */
void fbd_fault_header(wire_rep *h) {
  if (fbd_fault_armed && fbd_fault_kind == FAULT_OVERSIZE && h->pblen)
    h->pblen = (uint64_t)512 << 20;
  if (fbd_fault_armed && fbd_fault_kind == FAULT_DEVICE)
    h->counters.device_bytes = (uint64_t)1 << 62;
}

/* Forever, asleep (pause is not on the allow list). */
void fbd_fault_hang(void) {
  for (;;) {
    struct timespec d = {3600, 0};
    nanosleep(&d, NULL);
  }
}

int fbd_fault_stall(const wire_rep *h) {
  if (!fbd_fault_armed || !h->pblen || fbd_fault_kind != FAULT_STALL) return 0;
  fbd_fault_hang(); /* the header went; the rest never comes */
  return 0;
}
