/* Who session processes run as: the isolation settings checked
 * (fbd_procs_check), worker_user (default nobody when fuseboxd is root),
 * or with worker_uid_base a uid and gid per tenant from a range that must
 * be fuseboxd's alone. The switch itself is the process's (sandbox.c). */
#define _GNU_SOURCE
#include "server/session/proc.h"

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

int fbd_procs_check(const fbd_config *cfg, char *err, size_t errlen) {
  int tmp[FBD_NWALLS];
  if ((cfg->require_walls || cfg->strict_sandbox || cfg->test_refuse_walls) && !fbd_isolated(cfg)) {
    fb_errf(err, errlen,
            "%s needs isolation process: under isolation thread there are no workers and no "
            "sandbox walls",
            cfg->strict_sandbox  ? "strict_sandbox"
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
  if (fbd_walls_parse(cfg->require_walls, "require_walls", 0, 1, tmp, err, errlen) ||
      fbd_walls_parse(cfg->test_refuse_walls, "test_refuse_walls", 1, 0, tmp, err, errlen))
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
int fbd_worker_identity(fbd_server *srv, char *err, size_t errlen) {
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
