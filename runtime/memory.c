/* Device memory of one session (host memory on the CPU, fb_memsys memory
 * on other devices): the root buffer that holds the
 * layout's dense storage, the scratch buffer (gtmp) the tasks of a launch
 * share, and the kernel return slots. Root and scratch (and the sparse
 * storage that fb_sparse reports in `extra`) count against the session's
 * memory limit. Large roots come from mmap, so untouched pages
 * cost nothing and arrive zeroed. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "runtime/runtime.h"

#define ALIGN 64
#define MMAP_MIN ((size_t)1 << 16) /* roots at least this big are mmap'd */

static size_t round_up(size_t x) { return (x + ALIGN - 1) / ALIGN * ALIGN; }

static int over_limit(const fb_devmem *m, uint64_t root, uint64_t gtmp, char *err, size_t errlen) {
  uint64_t host = __atomic_load_n(&m->host, __ATOMIC_RELAXED);
  uint64_t fixed = root + m->extra + host;
  if (!m->limit || (fixed <= m->limit && gtmp <= m->limit - fixed)) return 0;
  if (host)
    fb_errf(err, errlen,
            "session memory limit exceeded: %llu bytes asked (fields %llu + sparse storage %llu + "
            "the tape %llu + scratch %llu), limit %llu bytes",
            (unsigned long long)(fixed + gtmp), (unsigned long long)root,
            (unsigned long long)m->extra, (unsigned long long)host, (unsigned long long)gtmp,
            (unsigned long long)m->limit);
  else if (m->extra)
    fb_errf(err, errlen,
            "session memory limit exceeded: %llu bytes asked (fields %llu + sparse storage %llu + "
            "scratch %llu), limit %llu bytes",
            (unsigned long long)(fixed + gtmp), (unsigned long long)root,
            (unsigned long long)m->extra, (unsigned long long)gtmp, (unsigned long long)m->limit);
  else
    fb_errf(err, errlen,
            "session memory limit exceeded: %llu bytes asked (fields %llu + scratch %llu), "
            "limit %llu bytes",
            (unsigned long long)(root + gtmp), (unsigned long long)root, (unsigned long long)gtmp,
            (unsigned long long)m->limit);
  return FB_EQUOTA;
}

static void *alloc_zeroed(size_t bytes) {
  void *p = NULL;
  if (posix_memalign(&p, ALIGN, round_up(bytes ? bytes : 1))) return NULL;
  memset(p, 0, round_up(bytes ? bytes : 1));
  return p;
}

void *fb_devmem_alloc(const fb_devmem *m, size_t bytes) {
  if (m->ms) return m->ms->alloc(m->ms->user, round_up(bytes ? bytes : 1));
  return alloc_zeroed(bytes);
}

void fb_devmem_free(const fb_devmem *m, void *p, size_t bytes) {
  if (!p) return;
  if (m->ms) m->ms->free(m->ms->user, p, round_up(bytes ? bytes : 1));
  else free(p);
}

int fb_devmem_init(fb_devmem *m, uint64_t root_bytes, uint64_t limit, char *err, size_t errlen) {
  return fb_devmem_init_on(m, NULL, root_bytes, limit, err, errlen);
}

int fb_devmem_init_on(fb_devmem *m, const fb_memsys *ms, uint64_t root_bytes, uint64_t limit,
                      char *err, size_t errlen) {
  memset(m, 0, sizeof *m);
  m->ms = ms;
  m->limit = limit;
  int rc = over_limit(m, root_bytes, 0, err, errlen);
  if (rc) return rc;
  if (root_bytes > SIZE_MAX - 2 * ALIGN) {
    fb_errf(err, errlen, "cannot allocate %llu bytes of device memory",
            (unsigned long long)root_bytes);
    return FB_ENOMEM;
  }
  size_t want = round_up((size_t)root_bytes ? (size_t)root_bytes : 1);
  if (ms) {
    m->root = ms->alloc(ms->user, want);
  } else if (want >= MMAP_MIN) {
    void *p = mmap(NULL, want, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    m->root = p == MAP_FAILED ? NULL : p;
    m->root_mapped = 1;
  } else {
    m->root = alloc_zeroed(want);
  }
  if (!m->root) return fb_devmem_oom(m, (size_t)root_bytes, "device memory", err, errlen);
  m->root_alloc = want;
  m->root_bytes = root_bytes;
  return 0;
}

int fb_devmem_oom(const fb_devmem *m, size_t bytes, const char *what, char *err, size_t errlen) {
  if (m->ms && m->ms->oom && m->ms->oom(m->ms->user, err, errlen) == 0) return FB_EQUOTA;
  fb_errf(err, errlen, "cannot allocate %zu bytes of %s", bytes, what);
  return FB_ENOMEM;
}

int fb_devmem_get(const fb_devmem *m, void *dst, const void *dev, size_t bytes, char *err,
                  size_t errlen) {
  if (!bytes) return 0;
  if (fb_memsys_copies(m->ms)) return m->ms->to_host(m->ms->user, dst, dev, bytes, err, errlen);
  memcpy(dst, dev, bytes);
  return 0;
}

int fb_devmem_put(const fb_devmem *m, void *dev, const void *src, size_t bytes, char *err,
                  size_t errlen) {
  if (!bytes) return 0;
  if (fb_memsys_copies(m->ms)) return m->ms->to_dev(m->ms->user, dev, src, bytes, err, errlen);
  memcpy(dev, src, bytes);
  return 0;
}

/* Device to device through the host (only when scratch or the return
 * slots grow, which is rare). */
static int move(const fb_devmem *m, void *dst, const void *src, size_t bytes, char *err,
                size_t errlen) {
  if (!fb_memsys_copies(m->ms)) {
    memcpy(dst, src, bytes);
    return 0;
  }
  void *tmp = malloc(bytes);
  if (!tmp) return fb_errf(err, errlen, "out of memory"), FB_ENOMEM;
  int rc = fb_devmem_get(m, tmp, src, bytes, err, errlen);
  if (!rc) rc = fb_devmem_put(m, dst, tmp, bytes, err, errlen);
  free(tmp);
  return rc;
}

int fb_devmem_clear_rets(fb_devmem *m, char *err, size_t errlen) {
  size_t n = sizeof(uint64_t) * (size_t)m->nrets;
  if (!n) return 0;
  if (fb_memsys_copies(m->ms)) return m->ms->fill(m->ms->user, m->rets, 0, n, err, errlen);
  memset(m->rets, 0, n);
  return 0;
}

int fb_devmem_ret0(const fb_devmem *m, uint64_t *out, char *err, size_t errlen) {
  *out = 0;
  return m->nrets ? fb_devmem_get(m, out, m->rets, sizeof *out, err, errlen) : 0;
}

static int grow_rets(fb_devmem *m, int nrets, char *err, size_t errlen) {
  if (nrets <= m->nrets) return 0;
  uint64_t *r = fb_devmem_alloc(m, sizeof(uint64_t) * (size_t)nrets);
  if (!r) return fb_devmem_oom(m, sizeof(uint64_t) * (size_t)nrets, "return slots", err, errlen);
  int rc = m->nrets ? move(m, r, m->rets, sizeof(uint64_t) * (size_t)m->nrets, err, errlen) : 0;
  if (rc) {
    fb_devmem_free(m, r, sizeof(uint64_t) * (size_t)nrets);
    return rc;
  }
  fb_devmem_free(m, m->rets, sizeof(uint64_t) * (size_t)m->nrets);
  m->rets = r;
  m->nrets = nrets;
  return 0;
}

int fb_devmem_reserve(fb_devmem *m, size_t gtmp_bytes, int nrets, char *err, size_t errlen) {
  int rc = 0;
  if (gtmp_bytes > m->gtmp_bytes) {
    rc = over_limit(m, m->root_bytes, gtmp_bytes, err, errlen);
    if (rc) return rc;
    uint8_t *g = fb_devmem_alloc(m, gtmp_bytes);
    if (!g) return fb_devmem_oom(m, gtmp_bytes, "scratch memory", err, errlen);
    /* slots keep their values */
    rc = m->gtmp_bytes ? move(m, g, m->gtmp, m->gtmp_bytes, err, errlen) : 0;
    if (rc) {
      fb_devmem_free(m, g, gtmp_bytes);
      return rc;
    }
    fb_devmem_free(m, m->gtmp, m->gtmp_bytes);
    m->gtmp = g;
    m->gtmp_bytes = gtmp_bytes;
  }
  return grow_rets(m, nrets, err, errlen);
}

uint64_t fb_devmem_used(const fb_devmem *m) {
  return m->root_bytes + m->gtmp_bytes + m->extra + __atomic_load_n(&m->host, __ATOMIC_RELAXED);
}

void fb_devmem_release(fb_devmem *m) {
  if (m->root) {
    if (m->ms) m->ms->free(m->ms->user, m->root, m->root_alloc);
    else if (m->root_mapped) munmap(m->root, m->root_alloc);
    else free(m->root);
  }
  fb_devmem_free(m, m->gtmp, m->gtmp_bytes);
  fb_devmem_free(m, m->rets, sizeof(uint64_t) * (size_t)m->nrets);
  memset(m, 0, sizeof *m);
}
