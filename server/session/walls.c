/* The sandbox walls from the broker's side: their names and what is lost
 * without each, parsing the lists that name them, probing each once at
 * start in a child that raises it as a session process would (namespaces,
 * user, rlimits, no_new_privs, seccomp), the log line, /metrics text and
 * require_walls / strict_sandbox. */
#define _GNU_SOURCE
#include "server/session/proc.h"

/* ---------------------------------------------------------------- the sandbox walls
 *
 * Each wall a worker raises (docs/security.md, "Sandboxes that refuse a
 * wall") is tried once at start, by the broker, in a child that raises it
 * as a worker would (fbd_ns_probe, fbd_walls_probe). Where the kernel refuses one
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
int fbd_wall_inject[FBD_NWALLS];

static int wall_index(const char *name, size_t n) {
  for (int i = 0; i < FBD_NWALLS; i++)
    if (strlen(fbd_wall_names[i]) == n && !strncmp(fbd_wall_names[i], name, n)) return i;
  return -1;
}

/* "a,b:EINVAL,c" (errnos only where with_errno) into out[] (1, or the
 * errno; EPERM where none is given); "all" where allow_all. */
int fbd_walls_parse(const char *list, const char *shown, int with_errno, int allow_all,
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

void fbd_wall_refused(fbd_server *srv, int i, int e, const char *step) {
  srv->wall_state[i] = FBD_WALL_DOWN;
  srv->wall_errno[i] = e;
  snprintf(wall_step[i], sizeof wall_step[i], "%s", step ? step : "");
}

/* Once every wall was tried: a line for each refused one, and one in all. */
void fbd_walls_report(fbd_server *srv) {
  char up[128];
  walls_up_list(srv, up, sizeof up);
  for (int i = 0; i < FBD_NWALLS; i++)
    if (srv->wall_state[i] == FBD_WALL_DOWN)
      /* namespaces, which only root can have, refused to another user: info */
      fbd_logf(srv->log, i <= FBD_WALL_ROOTNS && geteuid() != 0 ? FBD_LOG_INFO : FBD_LOG_WARN,
               "sandbox wall %s refused (%s%s%s): %s; walls still up: %s", fbd_wall_names[i],
               wall_step[i], wall_step[i][0] ? ": " : "", strerror(srv->wall_errno[i]),
               wall_lost[i], up);
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

/* Whether this process may give workers the namespaces of level: a child
 * cloned into them that makes its empty root and leaves (0, or why not:
 * EPERM without CAP_SYS_ADMIN, EINVAL on a kernel without them or with
 * its root on the initial ramfs, which pivot_root cannot move). Raw clone:
 * the child runs nothing but syscalls, so no fork handler of a threaded
 * process. */
int fbd_ns_probe(int level, const char **step) {
  *step = fbd_ns_steps[0];
  int pfd[2];
  if (pipe2(pfd, O_CLOEXEC)) return errno;
  unsigned long pidns = level >= WORKER_NS_ROOT ? CLONE_NEWPID : 0; /* fbd_spawn_in_pid_ns's */
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
    msg[1] = fbd_ns_enter(level, &msg[0]);
    if (!msg[1] && level >= WORKER_NS_ROOT) msg[1] = fbd_empty_root(&msg[0]);
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
  *step = fbd_ns_steps[msg[0] >= 0 && msg[0] < NS_NSTEPS ? msg[0] : 0];
  return msg[1];
}

/* fbd_worker_namespaces: "off"; "net" (a network and an IPC namespace); "on"
 * (those, a mount namespace with an empty root and a PID namespace: the
 * kernel must allow it, or no start); "auto" (as much of "on" as it
 * allows: root with CAP_SYS_ADMIN, and a root that pivot_root can move). A worker needs no
 * network (its socket to the broker was made before), no System V IPC and
 * no file once its engine is made (seccomp refuses opening one anyway);
 * its own namespaces take those from a worker that got past its seccomp
 * filter (the CUDA workers' is a deny list). */
/* fbd_ns_probe, or the refusal --test-refuse-walls asks for */
static int ns_try(int level, const char **step) {
  int e = fbd_wall_inject[FBD_WALL_NETNS];
  if (!e && level >= WORKER_NS_ROOT) e = fbd_wall_inject[FBD_WALL_ROOTNS];
  if (e) {
    *step = fbd_ns_steps[0];
    return e;
  }
  return fbd_ns_probe(level, step);
}

int fbd_worker_namespaces(fbd_server *srv, char *err, size_t errlen) {
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
            "fbd_worker_namespaces %s: cannot make %s: %s: %s (they need root with CAP_SYS_ADMIN; "
            "fbd_worker_namespaces auto runs workers without what the kernel refuses)",
            want,
            top == WORKER_NS_ROOT ? "a network, an IPC, a mount (with an empty root) and a PID "
                                    "namespace"
                                  : "a network and an IPC namespace",
            step, strerror(e));
    return FB_EINVAL;
  }
  /* a refusal is logged with the other walls' (fbd_walls_report): as root, a
     warning; not as root, where no namespace could be expected, as info */
  if (e) {
    fbd_wall_refused(srv, FBD_WALL_NETNS, e, step);
    fbd_wall_refused(srv, FBD_WALL_ROOTNS, root_e ? root_e : e, root_e ? root_step : step);
  } else if (top == WORKER_NS_ROOT) {
    srv->wall_state[FBD_WALL_NETNS] = srv->wall_state[FBD_WALL_ROOTNS] = FBD_WALL_UP;
    fbd_logf(srv->log, FBD_LOG_INFO,
             "session workers run in a network, an IPC, a mount and a PID namespace of their own "
             "each, the mount namespace's root an empty read-only directory");
  } else if (root_e) {
    srv->wall_state[FBD_WALL_NETNS] = FBD_WALL_UP;
    fbd_wall_refused(srv, FBD_WALL_ROOTNS, root_e, root_step);
  } else {
    srv->wall_state[FBD_WALL_NETNS] = FBD_WALL_UP;
    fbd_logf(srv->log, FBD_LOG_INFO,
             "session workers run in a network and an IPC namespace of their own each, and see "
             "fuseboxd's files (fbd_worker_namespaces net)");
  }
  srv->worker_ns = e ? 0 : top;
  return 0;
}

/* The walls after the namespaces, tried in a child as a worker raises
 * them, in its order: the switch to the workers' user (where there is
 * one), resource limits, no_new_privs, the seccomp filter. Raw clone and
 * plain system calls, as in fbd_ns_probe. */
int fbd_walls_probe(fbd_server *srv, char *err, size_t errlen) {
  const fbd_config *cfg = srv->cfg;
  unsigned long uid = 0, gid = 0;
  int want_uid = 1;
  if (cfg->worker_uid_base) uid = gid = cfg->worker_uid_base;
  else if (srv->worker_ids[0]) want_uid = sscanf(srv->worker_ids, "%lu:%lu", &uid, &gid) == 2;
  else want_uid = 0; /* not root: the workers keep fuseboxd's user */
  struct sock_fprog prog = {0, NULL};
  int rc = fbd_lock_export(srv->backend, &prog);
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
    const int *inj = fbd_wall_inject + FBD_WALL_UID;
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
           : syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_TSYNC, &prog) ? errno
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
    else if (r[k]) fbd_wall_refused(srv, i, r[k], what[k]);
    else srv->wall_state[i] = FBD_WALL_UP;
  }
  return 0;
}

/* require_walls / strict_sandbox: each wall named is up, or no start. */
int fbd_walls_required(fbd_server *srv, char *err, size_t errlen) {
  const fbd_config *cfg = srv->cfg;
  int need[FBD_NWALLS];
  if (fbd_walls_parse(cfg->strict_sandbox ? "all" : cfg->require_walls, "require_walls", 0, 1, need,
                      err, errlen))
    return FB_EINVAL;
  for (int i = 0; i < FBD_NWALLS; i++) {
    if (!need[i] || srv->wall_state[i] == FBD_WALL_UP) continue;
    const char *opt = cfg->strict_sandbox ? "strict_sandbox" : "require_walls";
    if (srv->wall_state[i] == FBD_WALL_DOWN)
      fb_errf(err, errlen,
              "%s: the sandbox wall %s is required, and the kernel refused it (%s%s%s)", opt,
              fbd_wall_names[i], wall_step[i], wall_step[i][0] ? ": " : "",
              strerror(srv->wall_errno[i]));
    else
      fb_errf(err, errlen, "%s: the sandbox wall %s is required, and is not asked for (%s)", opt,
              fbd_wall_names[i],
              i == FBD_WALL_UID ? "fuseboxd was not started as root: its workers keep its user"
                                : "fbd_worker_namespaces is off, or net for rootns");
    return FB_EINVAL;
  }
  return 0;
}
