#define _GNU_SOURCE /* memfd_create */
/* Staging buffers for field transfers (server.h, "buffers"): the memory a
 * field's bytes lie in between a call and the session's engine side,
 * counted in the memory budget's staging part (fbd_stage_count). Under
 * process isolation each is a sealed memfd that the session's worker maps
 * too. The session table hands them out (session.c fbd_stage_take). */
#include <fcntl.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "server/server.h"

#define STAGE_MMAP ((size_t)2 << 20)

static int stage_map(size_t n, int shared, fbd_buf *out);

/* A memfd shared with a worker keeps its size for good: a compromised
 * worker could otherwise shrink it under the broker's mapping (the
 * broker's next copy into it would fault: SIGBUS, every tenant's server
 * gone) or grow it past its memory limit with write, which no budget or
 * rlimit counts. */
int fbd_memfd_seal(int fd) {
  return fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) ? FB_EINTERNAL : 0;
}

int fbd_stage_alloc(size_t n, int shared, fbd_buf *out) {
  int rc = stage_map(n, shared, out);
  if (!rc) fbd_stage_count((int64_t)n); /* the budget's staging part */
  return rc;
}

static int stage_map(size_t n, int shared, fbd_buf *out) {
  *out = (fbd_buf){NULL, n, -1};
  if (shared) { /* a memfd the session's worker process maps too */
    int fd = memfd_create("fusebox-field", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0) return FB_ENOMEM;
    void *p = MAP_FAILED;
    if (ftruncate(fd, (off_t)(n ? n : 1)) == 0 && fbd_memfd_seal(fd) == 0)
      p = mmap(NULL, n ? n : 1, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
      close(fd);
      return FB_ENOMEM;
    }
    *out = (fbd_buf){p, n, fd};
    return 0;
  }
  if (n < STAGE_MMAP) {
    out->p = malloc(n ? n : 1);
    return out->p ? 0 : FB_ENOMEM;
  }
  void *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return FB_ENOMEM;
  madvise(p, n, MADV_HUGEPAGE); /* a hint: fine if refused */
  out->p = p;
  return 0;
}

void fbd_stage_free(fbd_buf *b) {
  if (b->p) {
    fbd_stage_count(-(int64_t)b->len);
    if (b->fd >= 0) {
      munmap(b->p, b->len ? b->len : 1);
      close(b->fd);
    } else if (b->len < STAGE_MMAP) {
      free(b->p);
    } else {
      munmap(b->p, b->len);
    }
  }
  *b = (fbd_buf){NULL, 0, -1};
}
