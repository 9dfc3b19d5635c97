/* Output files of JSON sessions (`save ... to`, `read ... to`): a session
 * file may come from someone else, so every name it gives must land inside
 * the output directory (-o DIR, default: the session file's folder).
 *
 * Two walls. The name itself, when the session is loaded: relative, no
 * `..` component, naming a file (fb_out_name_problem). And the open: the
 * name is resolved beneath the directory with no symbolic link followed
 * anywhere on the way (openat2 with RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS
 * where the kernel has it, else a walk of openat calls, one component at a
 * time, each with O_NOFOLLOW), missing folders made on the way (inside the
 * directory, by the same walk), and only a regular file with a single link
 * is overwritten: a FIFO, a device or a hard link to a file elsewhere is
 * refused before anything is truncated. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#if defined(SYS_openat2) && __has_include(<linux/openat2.h>)
#include <linux/openat2.h>
#define FB_HAVE_OPENAT2 1
#endif

#include "cli/cli.h"

int fb_out_try_openat2 = 1;

static const char rule[] =
    "output names must stay inside the output directory (-o DIR; default: the session file's "
    "folder)";

const char *fb_out_rule(void) { return rule; }

const char *fb_out_name_problem(const char *name) {
  if (!name || !name[0]) return "is empty";
  if (name[0] == '/') return "is an absolute path";
  for (const char *p = name; *p;) {
    size_t len = strcspn(p, "/");
    if (len == 2 && p[0] == '.' && p[1] == '.') return "has a '..' component";
    p += len;
    if (*p == '/') p++;
  }
  const char *last = strrchr(name, '/');
  last = last ? last + 1 : name;
  if (!last[0] || !strcmp(last, ".")) return "names a folder, not a file";
  return NULL;
}

static void errf(char *err, size_t n, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, n, fmt, ap);
  va_end(ap);
}

/* The next component of a relative name from *p (skipping empty ones and
 * "."), copied into comp; 1 when there is one, with *last set when it is
 * the final component; 0 at the end; -1 (ENAMETOOLONG) when too long. */
static int next_comp(const char **p, char *comp, int *last) {
  for (;;) {
    while (**p == '/') (*p)++;
    if (!**p) return 0;
    size_t len = strcspn(*p, "/");
    if (len > NAME_MAX) {
      errno = ENAMETOOLONG;
      return -1;
    }
    memcpy(comp, *p, len);
    comp[len] = 0;
    *p += len;
    *last = !**p || !(*p)[strspn(*p, "/")];
    if (strcmp(comp, ".")) return 1;
  }
}

/* The folder holding name's last component, opened (O_PATH) beneath root
 * one component at a time without following a link; missing folders are
 * made (0777 less the umask). -1 with errno on failure. */
static int walk_parent(int root, const char *name) {
  int dfd = fcntl(root, F_DUPFD_CLOEXEC, 0);
  if (dfd < 0) return -1;
  char comp[NAME_MAX + 1];
  const char *p = name;
  int last = 0, r;
  while ((r = next_comp(&p, comp, &last)) > 0 && !last) {
    if (!strcmp(comp, "..")) { /* refused by fb_out_name_problem; never here */
      errno = EXDEV;
      r = -1;
      break;
    }
    int nfd = openat(dfd, comp, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (nfd < 0 && errno == ENOENT) {
      if (mkdirat(dfd, comp, 0777) && errno != EEXIST) {
        r = -1;
        break;
      }
      nfd = openat(dfd, comp, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    }
    if (nfd < 0) {
      r = -1;
      break;
    }
    close(dfd);
    dfd = nfd;
  }
  if (r < 0) {
    int e = errno;
    close(dfd);
    errno = e;
    return -1;
  }
  return dfd;
}

static const int open_flags = O_WRONLY | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC;

/* The fallback: walk to the folder, then open the last component there. */
static int open_by_walk(int root, const char *name) {
  int dfd = walk_parent(root, name);
  if (dfd < 0) return -1;
  const char *last = strrchr(name, '/');
  last = last ? last + 1 : name;
  int fd = openat(dfd, last, open_flags, 0666);
  int e = errno;
  close(dfd);
  errno = e;
  return fd;
}

#ifdef FB_HAVE_OPENAT2
static int openat2_beneath(int root, const char *name) {
  struct open_how how;
  memset(&how, 0, sizeof how);
  how.flags = (unsigned long long)open_flags;
  how.mode = 0666;
  how.resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS;
  long fd;
  int tries = 0;
  do fd = syscall(SYS_openat2, root, name, &how, sizeof how);
  while (fd < 0 && errno == EAGAIN && ++tries < 8); /* a rename raced the lookup */
  return (int)fd;
}
#endif

/* Open name beneath root: openat2 when the kernel has it (making missing
 * folders by the walk first when it says one is missing), else the walk. */
static int open_beneath(int root, const char *name) {
#ifdef FB_HAVE_OPENAT2
  static int no_openat2; /* ENOSYS once: an older kernel */
  if (fb_out_try_openat2 && !no_openat2) {
    int fd = openat2_beneath(root, name);
    if (fd < 0 && errno == ENOENT && strchr(name, '/')) {
      int dfd = walk_parent(root, name);
      if (dfd < 0) return -1;
      close(dfd);
      fd = openat2_beneath(root, name);
    }
    if (fd >= 0 || (errno != ENOSYS && errno != EPERM)) return fd;
    if (errno == ENOSYS) no_openat2 = 1;
    /* EPERM: a seccomp filter (some container runtimes) may refuse the
     * call; the walk gives the same guarantees */
  }
#endif
  return open_by_walk(root, name);
}

/* Why an open failed, in the user's terms: the first component that is a
 * symbolic link (or not a folder) when there is one. */
static void explain(int root, const char *name, int e, char *err, size_t n) {
  if (e == ELOOP || e == ENOTDIR || e == EXDEV) {
    int dfd = fcntl(root, F_DUPFD_CLOEXEC, 0);
    char comp[NAME_MAX + 1];
    const char *p = name;
    int last = 0;
    while (dfd >= 0 && next_comp(&p, comp, &last) > 0) {
      struct stat st;
      if (fstatat(dfd, comp, &st, AT_SYMLINK_NOFOLLOW)) break;
      int len = (int)(p - name);
      if (S_ISLNK(st.st_mode)) {
        if (last) /* the file's own name */
          errf(err, n, "'%s' is a symbolic link; output files are never written through links",
               name);
        else
          errf(err, n,
               "'%s': '%.*s' is a symbolic link; output files are never written through links",
               name, len, name);
        close(dfd);
        return;
      }
      if (!last && !S_ISDIR(st.st_mode)) {
        errf(err, n, "'%s': '%.*s' is not a folder", name, len, name);
        close(dfd);
        return;
      }
      if (last) break;
      int nfd = openat(dfd, comp, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
      close(dfd);
      dfd = nfd;
    }
    if (dfd >= 0) close(dfd);
  }
  errf(err, n, "'%s': %s", name, strerror(e));
}

FILE *fb_out_open(const char *dir, const char *name, char *err, size_t n) {
  const char *why = fb_out_name_problem(name);
  if (why) {
    errf(err, n, "'%s' %s; %s", name ? name : "", why, rule);
    return NULL;
  }
  const char *d = dir && dir[0] ? dir : ".";
  int root = open(d, O_PATH | O_DIRECTORY | O_CLOEXEC);
  if (root < 0) {
    errf(err, n, "the output directory %s: %s", d, strerror(errno));
    return NULL;
  }
  int fd = open_beneath(root, name);
  if (fd < 0) {
    int e = errno;
    if (e == ENXIO) /* O_NONBLOCK on a FIFO with no reader */
      errf(err, n, "'%s' exists and is not a regular file; not writing to it", name);
    else
      explain(root, name, e, err, n);
    close(root);
    return NULL;
  }
  close(root);
  struct stat st;
  const char *bad = NULL;
  if (fstat(fd, &st)) bad = strerror(errno);
  else if (!S_ISREG(st.st_mode)) bad = "exists and is not a regular file; not writing to it";
  else if (st.st_nlink > 1)
    bad = "has other hard links (one may be outside the output directory); not overwriting it";
  if (bad) {
    errf(err, n, "'%s' %s", name, bad);
    close(fd);
    return NULL;
  }
  int fl = fcntl(fd, F_GETFL);
  if (fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) || ftruncate(fd, 0)) {
    errf(err, n, "'%s': %s", name, strerror(errno));
    close(fd);
    return NULL;
  }
  FILE *f = fdopen(fd, "wb");
  if (!f) {
    errf(err, n, "'%s': %s", name, strerror(errno));
    close(fd);
  }
  return f;
}
