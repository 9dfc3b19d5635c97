/* A private fuseboxd as a child process: started with --ready-fd so that
 * the parent learns the bound address (a free port for "host:0") exactly
 * when the server serves, and stopped with SIGTERM (graceful) and, if it
 * hangs, SIGKILL. The child has PR_SET_PDEATHSIG = SIGKILL, so it dies
 * with the thread that started it, even when that is killed outright.
 * Used by the CLI's embedded mode and by the tests. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "fusebox/client.h"

#define READY_FD 3
#define START_TIMEOUT_MS 30000
#define MAX_ARGS 64

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* In the child, between fork and exec: async-signal-safe calls only. */
static void child(int wfd, char *const *argv, pid_t parent) {
  /* the daemon must not outlive its parent, however the parent ends (a
   * SIGKILL included); if the parent is already gone, stop here */
  if (prctl(PR_SET_PDEATHSIG, SIGKILL) || getppid() != parent) _exit(127);
  struct sigaction dfl;
  memset(&dfl, 0, sizeof dfl);
  dfl.sa_handler = SIG_DFL;
  sigaction(SIGTERM, &dfl, NULL);
  sigaction(SIGINT, &dfl, NULL);
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, NULL);
  if (wfd != READY_FD) {
    if (dup2(wfd, READY_FD) < 0) _exit(127);
  } else {
    fcntl(wfd, F_SETFD, 0); /* keep it open across exec */
  }
  execvp(argv[0], argv);
  _exit(127);
}

/* The first line fuseboxd writes to the ready pipe; 0 at EOF. */
static int read_line(int fd, char *buf, size_t n, int timeout_ms) {
  size_t got = 0;
  double end = now_s() + timeout_ms / 1000.0;
  while (got + 1 < n) {
    int left = (int)((end - now_s()) * 1000);
    struct pollfd p = {fd, POLLIN, 0};
    if (left <= 0 || poll(&p, 1, left) <= 0) return -1;
    ssize_t k = read(fd, buf + got, n - 1 - got);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) break;
    got += (size_t)k;
    if (memchr(buf, '\n', got)) break;
  }
  buf[got] = 0;
  char *nl = strchr(buf, '\n');
  if (!nl) return 0;
  *nl = 0;
  return 1;
}

/* The private daemon's compile cache on disk (docs/code-cache.md):
 * $FUSEBOX_CODE_CACHE_DIR when set (empty: none), else
 * $XDG_CACHE_HOME/fusebox, else ~/.cache/fusebox (~/.cache made 0700 when
 * missing); NULL when there is no home to put it in. */
static const char *cache_dir(char *buf, size_t n) {
  const char *env = getenv("FUSEBOX_CODE_CACHE_DIR");
  if (env) return *env ? env : NULL;
  const char *xdg = getenv("XDG_CACHE_HOME");
  if (xdg && xdg[0] == '/') {
    if (mkdir(xdg, 0700) && errno != EEXIST) return NULL;
    snprintf(buf, n, "%s/fusebox", xdg);
    return buf;
  }
  const char *home = getenv("HOME");
  if (!home || home[0] != '/') return NULL;
  snprintf(buf, n, "%s/.cache", home);
  if (mkdir(buf, 0700) && errno != EEXIST) return NULL;
  snprintf(buf, n, "%s/.cache/fusebox", home);
  return buf;
}

static int build_argv(char **argv, const char *exe, const char *listen, const char *const *extra) {
  /* a private daemon serves one user: its sessions share its process, as
   * an embedded engine would (fuseboxd's default is a process per session),
   * and --private keeps a shared server's warnings about that quiet */
  static const char *const fixed[] = {"--listen",    NULL,     "--ready-fd", "3",
                                      "--isolation", "thread", "--private"};
  int n = 0;
  argv[n++] = (char *)exe;
  for (int i = 0; i < 7; i++) argv[n++] = (char *)(i == 1 ? listen : fixed[i]);
  static _Thread_local char dir[4096]; /* argv outlives this call */
  const char *cd = cache_dir(dir, sizeof dir);
  if (cd) {
    argv[n++] = (char *)"--code-cache-dir";
    argv[n++] = (char *)cd;
  }
  for (int i = 0; extra && extra[i] && n < MAX_ARGS - 1; i++) argv[n++] = (char *)extra[i];
  argv[n] = NULL;
  return n;
}

int fb_daemon_start(const char *exe, const char *listen, const char *const *extra_args,
                    fb_daemon *out, char *err, size_t errlen) {
  memset(out, 0, sizeof *out);
  out->pid = -1;
  if (!exe) exe = "fuseboxd";
  if (!listen) listen = "127.0.0.1:0";
  char *argv[MAX_ARGS];
  build_argv(argv, exe, listen, extra_args);
  int fds[2];
  if (pipe2(fds, O_CLOEXEC)) {
    fb_errf(err, errlen, "pipe: %s", strerror(errno));
    return FB_EIO;
  }
  pid_t parent = getpid(), pid = fork();
  if (pid < 0) {
    fb_errf(err, errlen, "fork: %s", strerror(errno));
    close(fds[0]);
    close(fds[1]);
    return FB_EIO;
  }
  if (pid == 0) child(fds[1], argv, parent);
  out->pid = (int)pid; /* now, so that a signal handler can stop it while it starts */
  close(fds[1]);
  char line[sizeof out->address];
  int got = read_line(fds[0], line, sizeof line, START_TIMEOUT_MS);
  close(fds[0]);
  if (got <= 0) {
    int st = 0;
    fb_daemon_stop(out, 5, &st);
    fb_errf(err, errlen, "%s did not start serving on %s (%s; exit status %d)", exe, listen,
            got < 0 ? "timed out" : "it exited", st);
    return FB_EIO;
  }
  char *sp = strchr(line, ' '); /* the first address when several */
  if (sp) *sp = 0;
  snprintf(out->address, sizeof out->address, "%s", line);
  return 0;
}

const char *fb_daemon_find(char *out, size_t n) {
  const char *env = getenv("FUSEBOXD");
  if (env && *env) {
    snprintf(out, n, "%s", env);
    return out;
  }
  char self[4096];
  ssize_t k = readlink("/proc/self/exe", self, sizeof self - 1);
  if (k > 0) {
    self[k] = 0;
    char *slash = strrchr(self, '/');
    if (slash) {
      *slash = 0;
      snprintf(out, n, "%s/fuseboxd", self);
      if (access(out, X_OK) == 0) return out;
      snprintf(out, n, "%s/../server/fuseboxd", self);
      if (access(out, X_OK) == 0) return out;
    }
  }
  snprintf(out, n, "fuseboxd");
  return out;
}

int fb_daemon_stop(fb_daemon *d, double timeout_s, int *exit_status) {
  if (exit_status) *exit_status = -1;
  if (!d || d->pid <= 0) return FB_EINVAL;
  pid_t pid = (pid_t)d->pid;
  kill(pid, SIGTERM);
  double end = now_s() + (timeout_s > 0 ? timeout_s : 30);
  int st = 0, rc = 0;
  pid_t w;
  while ((w = waitpid(pid, &st, WNOHANG)) == 0 && now_s() < end) usleep(2000);
  if (w == 0) {
    kill(pid, SIGKILL);
    w = waitpid(pid, &st, 0);
    rc = FB_EIO;
  }
  d->pid = -1;
  if (w < 0) return FB_EIO;
  if (exit_status) *exit_status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  return rc;
}
