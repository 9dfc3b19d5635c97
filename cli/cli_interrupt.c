/* Ctrl-C (SIGINT) and SIGTERM for `fusebox run`, `graph` and `bench`.
 * The main thread may be anywhere when the signal comes: blocked in a gRPC
 * call, inside the engine, in the middle of a printf. So the handler does
 * only async-signal-safe work, and does all of it itself: it says
 * "interrupted", stops the private fuseboxd of this run (SIGTERM, at most
 * 0.3 s to go, then SIGKILL; always reaped), removes its socket and temp
 * folder, and _exits with 128 + the signal (130 for Ctrl-C). Exiting closes
 * a --server connection, which ends the session on the server. A second
 * signal while the first is being handled (SA_NODEFER) kills the daemon at
 * once and exits. If this process is killed outright, the daemon goes too:
 * fb_daemon_start sets PR_SET_PDEATHSIG in the child. */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cli/cli.h"

static volatile sig_atomic_t hits, clear_line, have_paths;
static volatile int *daemon_pid; /* the fb_daemon's pid field: set there right after fork */
static char command[32], sock_path[256], sock_dir[256];

static void say(const char *s) {
  ssize_t r = write(STDERR_FILENO, s, strlen(s));
  (void)r;
}

static void stop_daemon(int hard) {
  volatile int *p = daemon_pid;
  pid_t pid = p ? (pid_t)*p : 0;
  if (pid > 0) {
    int reaped = 0;
    if (!hard) {
      kill(pid, SIGTERM);
      struct timespec tick = {0, 10 * 1000 * 1000};
      for (int i = 0; i < 30 && !reaped; i++) {
        pid_t w = waitpid(pid, NULL, WNOHANG);
        reaped = w == pid || (w < 0 && errno == ECHILD);
        if (!reaped) nanosleep(&tick, NULL);
      }
    }
    if (!reaped) {
      kill(pid, SIGKILL);
      while (waitpid(pid, NULL, 0) < 0 && errno == EINTR) {}
    }
    *p = -1;
  }
  if (have_paths) {
    unlink(sock_path);
    rmdir(sock_dir);
  }
}

static void on_signal(int sig) {
  if (hits++ == 0) {
    if (clear_line) say("\r\033[K");
    say("fusebox ");
    say(command);
    say(": interrupted\n");
    stop_daemon(0);
  } else {
    stop_daemon(1); /* a second Ctrl-C: no more waiting */
  }
  _exit(128 + sig);
}

void fb_cli_on_interrupt(const char *cmd, int progress_line) {
  snprintf(command, sizeof command, "%s", cmd);
  clear_line = progress_line;
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sa.sa_flags = SA_NODEFER; /* the second signal runs the handler again */
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
}

void fb_cli_interrupt_daemon(volatile int *pid, const char *sock, const char *dir) {
  have_paths = 0;
  if (sock && dir) {
    snprintf(sock_path, sizeof sock_path, "%s", sock);
    snprintf(sock_dir, sizeof sock_dir, "%s", dir);
    have_paths = 1;
  }
  daemon_pid = pid;
}

void fb_cli_interrupt_forget(void) {
  have_paths = 0;
  daemon_pid = NULL;
}
