/* A test double of the CUDA driver (runtime/cuda_drv.h), so the CUDA
 * runtime's host-side logic runs in tests on machines without a GPU: point
 * FB_CUDA_LIBRARY at libfakecuda.so and the engine loads this instead of
 * libcuda.so.1.
 *
 * THIS DOUBLE CHECKS THE HOST SIDE ONLY. cuLaunchKernel validates its
 * arguments and counts the launch but executes nothing, so device memory
 * holds only what the host wrote; PTX is checked for shape (.version,
 * .target, .entry), never compiled.
 *
 * One device on host memory: device, managed and pinned allocations are
 * zeroed host blocks, so a CUdeviceptr is a host address. Managed and
 * pinned blocks are 256-byte aligned and open to the host (the engine may
 * read managed memory directly); device blocks (cuMemAlloc) are mappings of
 * their own that stay PROT_NONE except inside this driver's copies and
 * memsets, so a host that dereferences a device pointer faults, as on a
 * real GPU. FAKECUDA_TOTAL_MEM bytes (default 1 GiB) is the device's
 * memory: device and managed allocations past it fail with
 * CUDA_ERROR_OUT_OF_MEMORY and cuMemGetInfo reports what is left. Async
 * copies and memsets happen at once. What a careless caller would get wrong on a real
 * driver fails here too: calls before cuInit, stale handles, copies outside
 * a live allocation, launch limits, unknown entry names, and sticky errors
 * that poison the context until cuDevicePrimaryCtxReset_v2. Tests inject
 * failures through fake_cuda.h. One mutex guards all state: the engine calls
 * from several threads. */
#include <limits.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "fake_cuda.h"
#include "runtime/cuda_drv.h"

/* Real driver codes the header does not name; returned where the real
 * driver would return them. */
enum {
  FK_INVALID_DEVICE = 101,
  FK_INVALID_CONTEXT = 201,
  FK_INVALID_HANDLE = 400,
  FK_NOT_FOUND = 500
};

#define FK_ALIGN 256
#define FK_DRIVER_VERSION 12060 /* CUDA 12.6, which JITs PTX ISA up to 8.5 */
#define FK_MAX_PTX_MAJOR 8
#define FK_MAX_PTX_MINOR 5
#define FK_MAX_SHMEM (48 * 1024) /* dynamic shared memory without an opt-in */

enum {
  FK_DEVICE,
  FK_MANAGED,
  FK_HOST
};

typedef struct fk_alloc {
  struct fk_alloc *next;
  unsigned char *p;
  size_t n;
  int kind;
  size_t mapped; /* FK_DEVICE: bytes of its own mapping (PROT_NONE but in copies) */
} fk_alloc;

struct CUctx_st {
  int refs;
};
struct CUstream_st {
  struct CUstream_st *next;
};
struct CUevent_st {
  struct CUevent_st *next;
  unsigned flags;
  int recorded;
  struct timespec t;
};
struct CUfunc_st {
  char *name;
};
struct CUmod_st {
  struct CUmod_st *next;
  size_t nfunc;
  struct CUfunc_st *funcs;
};

static pthread_mutex_t fk_mu = PTHREAD_MUTEX_INITIALIZER;
static struct {
  int inited, no_device;
  CUresult sticky; /* nonzero: the context is broken */
  unsigned long long total;
  long fail_launch_in, fail_alloc_in; /* countdowns; 0 = none pending */
  int fail_launch_code;
  struct CUctx_st ctx;
  fk_alloc *allocs;
  struct CUstream_st *streams;
  struct CUevent_st *events;
  struct CUmod_st *mods;
  fakecuda_stats st;
} g;

/* Entry: take the lock, then refuse calls before cuInit and, unless the
 * call is one a broken context still allows, calls after a sticky error.
 * On a nonzero return the lock is already released. */
static CUresult fk_enter(int sticky_ok) {
  pthread_mutex_lock(&fk_mu);
  CUresult r = !g.inited ? CUDA_ERROR_NOT_INITIALIZED : sticky_ok ? 0 : g.sticky;
  if (r) pthread_mutex_unlock(&fk_mu);
  return r;
}

/* Every cu* entry point (but the lock-free few) starts with this: it declares
 * the result variable r and returns early when fk_enter refuses the call. */
#define FK_ENTER(sticky_ok)                                                                        \
  CUresult r = fk_enter(sticky_ok);                                                                \
  if (r) return r

static CUresult fk_leave(CUresult r) {
  pthread_mutex_unlock(&fk_mu);
  return r;
}

static CUresult fk_check_dev(CUdevice d) {
  if (g.no_device) return CUDA_ERROR_NO_DEVICE;
  return d == 0 ? CUDA_SUCCESS : FK_INVALID_DEVICE;
}

/* The live allocation holding [p, p+n), or NULL. */
static fk_alloc *fk_find(uintptr_t p, size_t n) {
  for (fk_alloc *a = g.allocs; a; a = a->next) {
    uintptr_t lo = (uintptr_t)a->p;
    if (p >= lo && p - lo <= a->n && n <= a->n - (p - lo)) return a;
  }
  return NULL;
}

static CUresult fk_check_stream(CUstream s) {
  if (!s) return CUDA_SUCCESS; /* the default stream */
  for (struct CUstream_st *x = g.streams; x; x = x->next)
    if (x == s) return CUDA_SUCCESS;
  return FK_INVALID_HANDLE;
}

static struct CUevent_st *fk_find_event(CUevent e) {
  for (struct CUevent_st *x = g.events; x; x = x->next)
    if (x == e) return x;
  return NULL;
}

/* Compared as integers: f may be a stale handle from no live array. */
static int fk_live_func(CUfunction f) {
  uintptr_t x = (uintptr_t)f;
  for (struct CUmod_st *m = g.mods; m; m = m->next)
    if (x >= (uintptr_t)m->funcs && x < (uintptr_t)(m->funcs + m->nfunc)) return 1;
  return 0;
}

static void fk_free_module(struct CUmod_st *m) {
  for (size_t i = 0; i < m->nfunc; i++) free(m->funcs[i].name);
  free(m->funcs);
  free(m);
}

/* Free everything the context owns (cuDevicePrimaryCtxReset_v2, fakecuda_reset). */
static void fk_release(fk_alloc *a) {
  if (a->mapped) munmap(a->p, a->mapped);
  else free(a->p);
  free(a);
}

/* Open a device block to this driver's own access, or close it again. */
static void fk_open(fk_alloc *a, int open) {
  if (a && a->mapped) mprotect(a->p, a->mapped, open ? PROT_READ | PROT_WRITE : PROT_NONE);
}

static void fk_free_all(void) {
  while (g.allocs) {
    fk_alloc *a = g.allocs;
    g.allocs = a->next;
    fk_release(a);
  }
  while (g.streams) {
    struct CUstream_st *s = g.streams;
    g.streams = s->next;
    free(s);
  }
  while (g.events) {
    struct CUevent_st *e = g.events;
    g.events = e->next;
    free(e);
  }
  while (g.mods) {
    struct CUmod_st *m = g.mods;
    g.mods = m->next;
    fk_free_module(m);
  }
  g.st.bytes_in_use = g.st.device_bytes = g.st.managed_bytes = g.st.pinned_bytes = 0;
}

/* ---- failure injection and counters (fake_cuda.h) ---- */

void fakecuda_reset(void) {
  pthread_mutex_lock(&fk_mu);
  fk_free_all();
  memset(&g, 0, sizeof g);
  pthread_mutex_unlock(&fk_mu);
}

void fakecuda_fail_launch(long nth, int code) {
  pthread_mutex_lock(&fk_mu);
  g.fail_launch_in = nth > 0 ? nth : 0;
  g.fail_launch_code = code;
  pthread_mutex_unlock(&fk_mu);
}

void fakecuda_fail_alloc(long nth) {
  pthread_mutex_lock(&fk_mu);
  g.fail_alloc_in = nth > 0 ? nth : 0;
  pthread_mutex_unlock(&fk_mu);
}

void fakecuda_get_stats(fakecuda_stats *out) {
  pthread_mutex_lock(&fk_mu);
  *out = g.st;
  pthread_mutex_unlock(&fk_mu);
}

/* ---- initialization and device ---- */

CUresult cuInit(unsigned flags) {
  pthread_mutex_lock(&fk_mu);
  if (g.sticky) return fk_leave(g.sticky);
  if (flags != 0) return fk_leave(CUDA_ERROR_INVALID_VALUE);
  if (!g.inited) { /* the environment is read once per driver "process" */
    const char *nd = getenv("FAKECUDA_NO_DEVICE");
    const char *tm = getenv("FAKECUDA_TOTAL_MEM");
    char *end = NULL;
    unsigned long long t = tm ? strtoull(tm, &end, 0) : 0;
    g.no_device = nd && strcmp(nd, "1") == 0;
    g.total = t && end && !*end ? t : 1ull << 30;
    g.inited = 1;
  }
  /* Still initialized without a device, so cuDeviceGetCount can say 0. */
  return fk_leave(g.no_device ? CUDA_ERROR_NO_DEVICE : CUDA_SUCCESS);
}

/* Like the real driver, answers before cuInit and in a broken context: it
 * describes the library, not a context. */
CUresult cuDriverGetVersion(int *v) {
  if (!v) return CUDA_ERROR_INVALID_VALUE;
  *v = FK_DRIVER_VERSION;
  return CUDA_SUCCESS;
}

CUresult cuDeviceGetCount(int *n) {
  FK_ENTER(0);
  if (!n) return fk_leave(CUDA_ERROR_INVALID_VALUE);
  *n = g.no_device ? 0 : 1;
  return fk_leave(CUDA_SUCCESS);
}

CUresult cuDeviceGet(CUdevice *d, int ordinal) {
  FK_ENTER(0);
  if (!d) return fk_leave(CUDA_ERROR_INVALID_VALUE);
  if ((r = fk_check_dev(ordinal))) return fk_leave(r);
  *d = 0;
  return fk_leave(CUDA_SUCCESS);
}

CUresult cuDeviceGetName(char *name, int len, CUdevice d) {
  FK_ENTER(0);
  if (!name || len <= 0) return fk_leave(CUDA_ERROR_INVALID_VALUE);
  if ((r = fk_check_dev(d))) return fk_leave(r);
  snprintf(name, (size_t)len, "%s", "Fusebox fake GPU");
  return fk_leave(CUDA_SUCCESS);
}

CUresult cuDeviceGetAttribute(int *v, int attr, CUdevice d) {
  /* The header's attributes and the launch limits, as an H100 reports them. */
  static const int table[][2] = {
      {CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK, 1024},
      {2, 1024},
      {3, 1024},
      {4, 64},         /* MAX_BLOCK_DIM_X/Y/Z */
      {5, INT_MAX},
      {6, 65535},
      {7, 65535},  /* MAX_GRID_DIM_X/Y/Z */
      {8, FK_MAX_SHMEM},
      {10, 32},           /* MAX_SHARED_MEMORY_PER_BLOCK, WARP_SIZE */
      {CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, 132},
      {CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR, 2048},
      {41, 1}, /* UNIFIED_ADDRESSING */
      {CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, 9},
      {CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, 0},
      {CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY, 1},
      {CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS, 1},
  };
  FK_ENTER(0);
  if (!v) return fk_leave(CUDA_ERROR_INVALID_VALUE);
  if ((r = fk_check_dev(d))) return fk_leave(r);
  for (size_t i = 0; i < sizeof table / sizeof table[0]; i++) {
    if (table[i][0] == attr) {
      *v = table[i][1];
      return fk_leave(CUDA_SUCCESS);
    }
  }
  return fk_leave(CUDA_ERROR_INVALID_VALUE);
}

CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice d) {
  FK_ENTER(0);
  if (!bytes) return fk_leave(CUDA_ERROR_INVALID_VALUE);
  if ((r = fk_check_dev(d))) return fk_leave(r);
  *bytes = (size_t)g.total;
  return fk_leave(CUDA_SUCCESS);
}

/* ---- primary context ---- */

CUresult cuDevicePrimaryCtxRetain(CUcontext *c, CUdevice d) {
  FK_ENTER(0);
  if (!c) return fk_leave(CUDA_ERROR_INVALID_VALUE);
  if ((r = fk_check_dev(d))) return fk_leave(r);
  g.ctx.refs++;
  *c = &g.ctx;
  return fk_leave(CUDA_SUCCESS);
}

/* Dropping the last reference keeps the context's resources (the real driver
 * would destroy them); tests see leaks through bytes_in_use instead. */
CUresult cuDevicePrimaryCtxRelease_v2(CUdevice d) {
  FK_ENTER(1);
  if ((r = fk_check_dev(d))) return fk_leave(r);
  if (g.ctx.refs <= 0) return fk_leave(FK_INVALID_CONTEXT);
  g.ctx.refs--;
  return fk_leave(CUDA_SUCCESS);
}

/* The recovery path after a sticky error: frees everything of the context
 * and clears the error. The refcount and the CUcontext handle survive. */
CUresult cuDevicePrimaryCtxReset_v2(CUdevice d) {
  FK_ENTER(1);
  if ((r = fk_check_dev(d))) return fk_leave(r);
  fk_free_all();
  g.sticky = 0;
  g.st.ctx_resets++;
  return fk_leave(CUDA_SUCCESS);
}

CUresult cuCtxSetCurrent(CUcontext c) {
  FK_ENTER(0);
  if (c && (c != &g.ctx || g.ctx.refs <= 0)) return fk_leave(FK_INVALID_CONTEXT);
  return fk_leave(CUDA_SUCCESS);
}

/* ---- streams and events ---- */

CUresult cuStreamCreate(CUstream *s, unsigned flags) {
  FK_ENTER(0);
  if (!s || (flags & ~(unsigned)CU_STREAM_NON_BLOCKING)) return fk_leave(CUDA_ERROR_INVALID_VALUE);
  struct CUstream_st *x = calloc(1, sizeof *x);
  if (!x) return fk_leave(CUDA_ERROR_OUT_OF_MEMORY);
  x->next = g.streams;
  g.streams = x;
  g.st.streams_created++;
  *s = x;
  return fk_leave(CUDA_SUCCESS);
}

CUresult cuStreamDestroy_v2(CUstream s) {
  FK_ENTER(1);
  for (struct CUstream_st **p = &g.streams; *p; p = &(*p)->next) {
    if (*p == s) {
      *p = s->next;
      free(s);
      g.st.streams_destroyed++;
      return fk_leave(CUDA_SUCCESS);
    }
  }
  return fk_leave(FK_INVALID_HANDLE);
}

CUresult cuStreamSynchronize(CUstream s) {
  FK_ENTER(0);
  if ((r = fk_check_stream(s))) return fk_leave(r);
  g.st.syncs++;
  return fk_leave(CUDA_SUCCESS);
}

CUresult cuEventCreate(CUevent *e, unsigned flags) {
  FK_ENTER(0);
  /* DEFAULT, BLOCKING_SYNC 0x1, DISABLE_TIMING 0x2, INTERPROCESS 0x4 */
  if (!e || (flags & ~7u)) return fk_leave(CUDA_ERROR_INVALID_VALUE);
  struct CUevent_st *x = calloc(1, sizeof *x);
  if (!x) return fk_leave(CUDA_ERROR_OUT_OF_MEMORY);
  x->flags = flags;
  x->next = g.events;
  g.events = x;
  g.st.events_created++;
  *e = x;
  return fk_leave(CUDA_SUCCESS);
}

CUresult cuEventDestroy_v2(CUevent e) {
  FK_ENTER(1);
  for (struct CUevent_st **p = &g.events; *p; p = &(*p)->next) {
    if (*p == e) {
      *p = e->next;
      free(e);
      return fk_leave(CUDA_SUCCESS);
    }
  }
  return fk_leave(FK_INVALID_HANDLE);
}

CUresult cuEventRecord(CUevent e, CUstream s) {
  FK_ENTER(0);
  struct CUevent_st *x = fk_find_event(e);
  if (!x) return fk_leave(FK_INVALID_HANDLE);
  if ((r = fk_check_stream(s))) return fk_leave(r);
  clock_gettime(CLOCK_MONOTONIC, &x->t);
  x->recorded = 1;
  return fk_leave(CUDA_SUCCESS);
}

CUresult cuEventElapsedTime(float *ms, CUevent a, CUevent b) {
  FK_ENTER(0);
  if (!ms) return fk_leave(CUDA_ERROR_INVALID_VALUE);
  struct CUevent_st *x = fk_find_event(a), *y = fk_find_event(b);
  /* The real driver's answer for unrecorded or DISABLE_TIMING events. */
  if (!x || !y || !x->recorded || !y->recorded || ((x->flags | y->flags) & 2))
    return fk_leave(FK_INVALID_HANDLE);
  *ms = (float)((double)(y->t.tv_sec - x->t.tv_sec) * 1e3 +
                (double)(y->t.tv_nsec - x->t.tv_nsec) / 1e6);
  return fk_leave(CUDA_SUCCESS);
}

/* ---- memory ---- */

/* Every allocation is zeroed (a real driver does not promise that, but
 * deterministic contents keep tests reproducible) and 256-byte aligned,
 * with exactly n bytes so AddressSanitizer sees overruns of managed memory. */
static CUresult fk_alloc_block(void **out, size_t n, int kind) {
  if (kind != FK_HOST) {
    if (g.fail_alloc_in > 0 && --g.fail_alloc_in == 0) return CUDA_ERROR_OUT_OF_MEMORY;
    if (n > g.total - g.st.bytes_in_use) return CUDA_ERROR_OUT_OF_MEMORY;
  }
  fk_alloc *a = calloc(1, sizeof *a);
  void *p = NULL;
  if (a && kind == FK_DEVICE) { /* zero pages, closed to the host */
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    a->mapped = (n + page - 1) / page * page;
    p = mmap(NULL, a->mapped, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) p = NULL;
  } else if (a && posix_memalign(&p, FK_ALIGN, n) == 0) {
    memset(p, 0, n);
  } else {
    p = NULL;
  }
  if (!a || !p) {
    free(a);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  a->p = p;
  a->n = n;
  a->kind = kind;
  a->next = g.allocs;
  g.allocs = a;
  if (kind != FK_HOST) g.st.bytes_in_use += n;
  *(kind == FK_DEVICE ? &g.st.device_bytes : kind == FK_MANAGED ? &g.st.managed_bytes
                                                                : &g.st.pinned_bytes) += n;
  *out = p;
  return CUDA_SUCCESS;
}

static CUresult fk_free_block(uintptr_t p, int host) {
  for (fk_alloc **pp = &g.allocs; *pp; pp = &(*pp)->next) {
    fk_alloc *a = *pp;
    if ((uintptr_t)a->p != p || (a->kind == FK_HOST) != host) continue;
    *pp = a->next;
    if (!host) g.st.bytes_in_use -= a->n;
    *(a->kind == FK_DEVICE ? &g.st.device_bytes : a->kind == FK_MANAGED ? &g.st.managed_bytes
                                                                        : &g.st.pinned_bytes) -= a->n;
    fk_release(a);
    return CUDA_SUCCESS;
  }
  return CUDA_ERROR_INVALID_VALUE;
}

CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t bytes) {
  FK_ENTER(0);
  if (!p || bytes == 0) return fk_leave(CUDA_ERROR_INVALID_VALUE);
  void *q = NULL;
  if ((r = fk_alloc_block(&q, bytes, FK_DEVICE))) return fk_leave(r);
  *p = (CUdeviceptr)(uintptr_t)q;
  return fk_leave(CUDA_SUCCESS);
}

CUresult cuMemAllocManaged(CUdeviceptr *p, size_t bytes, unsigned flags) {
  FK_ENTER(0);
  /* exactly one of CU_MEM_ATTACH_GLOBAL and CU_MEM_ATTACH_HOST (0x2) */
  if (!p || bytes == 0 || (flags != CU_MEM_ATTACH_GLOBAL && flags != 2))
    return fk_leave(CUDA_ERROR_INVALID_VALUE);
  void *q = NULL;
  if ((r = fk_alloc_block(&q, bytes, FK_MANAGED))) return fk_leave(r);
  *p = (CUdeviceptr)(uintptr_t)q;
  return fk_leave(CUDA_SUCCESS);
}

/* cuMemFree(0) succeeds, like free(NULL) and cudaFree(NULL). */
CUresult cuMemFree_v2(CUdeviceptr p) {
  FK_ENTER(1);
  return fk_leave(p ? fk_free_block((uintptr_t)p, 0) : CUDA_SUCCESS);
}

CUresult cuMemHostAlloc(void **p, size_t bytes, unsigned flags) {
  FK_ENTER(0);
  /* PORTABLE 0x1, DEVICEMAP 0x2, WRITECOMBINED 0x4 */
  if (!p || bytes == 0 || (flags & ~7u)) return fk_leave(CUDA_ERROR_INVALID_VALUE);
  return fk_leave(fk_alloc_block(p, bytes, FK_HOST));
}

CUresult cuMemFreeHost(void *p) {
  FK_ENTER(1);
  return fk_leave(p ? fk_free_block((uintptr_t)p, 1) : CUDA_SUCCESS);
}

CUresult cuMemGetInfo_v2(size_t *free_b, size_t *total_b) {
  FK_ENTER(0);
  if (!free_b || !total_b) return fk_leave(CUDA_ERROR_INVALID_VALUE);
  *free_b = (size_t)(g.total - g.st.bytes_in_use);
  *total_b = (size_t)g.total;
  return fk_leave(CUDA_SUCCESS);
}

/* Device-side ranges must lie inside one live allocation (pinned host memory
 * counts: with unified addressing its pointers are device pointers too). */
CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t bytes, CUstream s) {
  FK_ENTER(0);
  if ((r = fk_check_stream(s))) return fk_leave(r);
  if (bytes == 0) return fk_leave(CUDA_SUCCESS);
  fk_alloc *a = fk_find((uintptr_t)dst, bytes);
  if (!src || !a) return fk_leave(CUDA_ERROR_INVALID_VALUE);
  fk_open(a, 1);
  memmove((void *)(uintptr_t)dst, src, bytes);
  fk_open(a, 0);
  g.st.htod_bytes += bytes;
  return fk_leave(CUDA_SUCCESS);
}

CUresult cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t bytes, CUstream s) {
  FK_ENTER(0);
  if ((r = fk_check_stream(s))) return fk_leave(r);
  if (bytes == 0) return fk_leave(CUDA_SUCCESS);
  fk_alloc *a = fk_find((uintptr_t)src, bytes);
  if (!dst || !a) return fk_leave(CUDA_ERROR_INVALID_VALUE);
  fk_open(a, 1);
  memmove(dst, (const void *)(uintptr_t)src, bytes);
  fk_open(a, 0);
  g.st.dtoh_bytes += bytes;
  return fk_leave(CUDA_SUCCESS);
}

CUresult cuMemsetD8Async(CUdeviceptr p, unsigned char v, size_t n, CUstream s) {
  FK_ENTER(0);
  if ((r = fk_check_stream(s))) return fk_leave(r);
  if (n == 0) return fk_leave(CUDA_SUCCESS);
  fk_alloc *a = fk_find((uintptr_t)p, n);
  if (!a) return fk_leave(CUDA_ERROR_INVALID_VALUE);
  fk_open(a, 1);
  memset((void *)(uintptr_t)p, v, n);
  fk_open(a, 0);
  return fk_leave(CUDA_SUCCESS);
}

/* ---- modules and launches ---- */

static int fk_ident(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
         c == '$' || c == '%';
}

/* Scans PTX for its directives, skipping comments: returns NULL when the
 * module is acceptable (entry names into *m) or why not, with *code. */
static const char *fk_parse_ptx(const char *s, struct CUmod_st *m, CUresult *code) {
  const char *start = s;
  int version = 0, target = 0;
  *code = CUDA_ERROR_INVALID_PTX;
  while (*s) {
    if (s[0] == '/' && s[1] == '/') {
      s += strcspn(s, "\n");
      continue;
    }
    if (s[0] == '/' && s[1] == '*') {
      const char *e = strstr(s + 2, "*/");
      if (!e) return "unterminated comment";
      s = e + 2;
      continue;
    }
    if (*s != '.' || (s > start && fk_ident(s[-1]))) { /* not a directive: 1.5, a.b */
      s++;
      continue;
    }
    size_t n = 1;
    while (fk_ident(s[n])) n++;
    const char *arg = s + n + strspn(s + n, " \t\r\n");
    if (n == 8 && strncmp(s, ".version", 8) == 0) {
      unsigned major = 0, minor = 0;
      if (sscanf(arg, "%u.%u", &major, &minor) != 2) return ".version without major.minor";
      if (major > FK_MAX_PTX_MAJOR || (major == FK_MAX_PTX_MAJOR && minor > FK_MAX_PTX_MINOR)) {
        *code = CUDA_ERROR_UNSUPPORTED_PTX_VERSION;
        return "PTX .version newer than this driver supports (8.5)";
      }
      version = 1;
    } else if (n == 7 && strncmp(s, ".target", 7) == 0) {
      unsigned sm = 0;
      if (sscanf(arg, "sm_%u", &sm) != 1) return ".target without an sm_XX architecture";
      if (sm > 90) return ".target newer than the device (sm_90)";
      target = 1;
    } else if (n == 6 && strncmp(s, ".entry", 6) == 0) {
      size_t len = 0;
      while (fk_ident(arg[len])) len++;
      if (len == 0) return ".entry without a name";
      for (size_t i = 0; i < m->nfunc; i++)
        if (strlen(m->funcs[i].name) == len && strncmp(m->funcs[i].name, arg, len) == 0)
          return "duplicate .entry name";
      struct CUfunc_st *f = realloc(m->funcs, (m->nfunc + 1) * sizeof *f);
      if (!f) return "out of memory";
      m->funcs = f;
      if (!(f[m->nfunc].name = strndup(arg, len))) return "out of memory";
      m->nfunc++;
    }
    s += n;
  }
  if (!version) return "no .version directive";
  if (!target) return "no .target directive";
  if (m->nfunc == 0) return "no .entry directive";
  return NULL;
}

CUresult cuModuleLoadDataEx(CUmodule *mod, const void *image, unsigned nopt, CUjit_option *opts,
                            void **vals) {
  FK_ENTER(0);
  if (!mod || !image || (nopt && (!opts || !vals))) return fk_leave(CUDA_ERROR_INVALID_VALUE);
  char *elog = NULL, *ilog = NULL;
  size_t elen = 0, ilen = 0;
  for (unsigned i = 0; i < nopt; i++) { /* sizes travel as the pointer's value */
    if (opts[i] == CU_JIT_ERROR_LOG_BUFFER) elog = vals[i];
    if (opts[i] == CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES) elen = (size_t)(uintptr_t)vals[i];
    if (opts[i] == CU_JIT_INFO_LOG_BUFFER) ilog = vals[i];
    if (opts[i] == CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES) ilen = (size_t)(uintptr_t)vals[i];
  }
  if (ilog && ilen) ilog[0] = 0; /* the fake JIT has nothing to say */
  if (elog && elen) elog[0] = 0;
  struct CUmod_st *m = calloc(1, sizeof *m);
  if (!m) return fk_leave(CUDA_ERROR_OUT_OF_MEMORY);
  const char *why = fk_parse_ptx(image, m, &r);
  if (why) {
    if (elog && elen) snprintf(elog, elen, "fakecuda: ptxas error: %s", why);
    fk_free_module(m);
    return fk_leave(r);
  }
  m->next = g.mods;
  g.mods = m;
  g.st.modules_loaded++;
  *mod = m;
  return fk_leave(CUDA_SUCCESS);
}

CUresult cuModuleUnload(CUmodule m) {
  FK_ENTER(1);
  for (struct CUmod_st **p = &g.mods; *p; p = &(*p)->next) {
    if (*p == m) {
      *p = m->next;
      fk_free_module(m);
      g.st.modules_unloaded++;
      return fk_leave(CUDA_SUCCESS);
    }
  }
  return fk_leave(FK_INVALID_HANDLE);
}

CUresult cuModuleGetFunction(CUfunction *f, CUmodule m, const char *name) {
  FK_ENTER(0);
  if (!f || !name) return fk_leave(CUDA_ERROR_INVALID_VALUE);
  struct CUmod_st *x = g.mods;
  while (x && x != m) x = x->next;
  if (!x) return fk_leave(FK_INVALID_HANDLE);
  for (size_t i = 0; i < x->nfunc; i++) {
    if (strcmp(x->funcs[i].name, name) == 0) {
      *f = &x->funcs[i];
      return fk_leave(CUDA_SUCCESS);
    }
  }
  return fk_leave(FK_NOT_FOUND);
}

CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                        unsigned by, unsigned bz, unsigned shmem, CUstream s, void **params,
                        void **extra) {
  FK_ENTER(0);
  if (!f) return fk_leave(CUDA_ERROR_INVALID_VALUE);
  if (!fk_live_func(f)) return fk_leave(FK_INVALID_HANDLE);
  if ((r = fk_check_stream(s))) return fk_leave(r);
  /* The real limits of a 9.0 device; the driver answers INVALID_VALUE. */
  unsigned long long threads = (unsigned long long)bx * by * bz;
  unsigned long long blocks = (unsigned long long)gx * gy * gz;
  if (!gx || !gy || !gz || !bx || !by || !bz || gx > INT_MAX || gy > 65535 || gz > 65535 ||
      bx > 1024 || by > 1024 || bz > 64 || threads > 1024 || shmem > FK_MAX_SHMEM || !params)
    return fk_leave(CUDA_ERROR_INVALID_VALUE);
  if (g.fail_launch_in > 0 && --g.fail_launch_in == 0) {
    r = g.fail_launch_code;
    switch (r) {
    case 214:
    case 700:
    case 702:
    case 714:
    case 715:
    case 716:
    case 717:
    case 718:
    case 719: g.sticky = r;
    }
    return fk_leave(r);
  }
  g.st.launches++;
  g.st.last_grid = blocks > UINT_MAX ? UINT_MAX : (unsigned)blocks;
  g.st.last_block = (unsigned)threads;
  return fk_leave(CUDA_SUCCESS);
}

/* ---- error names ---- */

static const struct {
  CUresult code;
  const char *name, *text;
} fk_errors[] = {
    {CUDA_SUCCESS, "CUDA_SUCCESS", "no error"},
    {CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
    {CUDA_ERROR_NO_DEVICE, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
    {FK_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
    {FK_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
    {CUDA_ERROR_ECC_UNCORRECTABLE, "CUDA_ERROR_ECC_UNCORRECTABLE",
     "uncorrectable ECC error encountered"},
    {CUDA_ERROR_INVALID_PTX, "CUDA_ERROR_INVALID_PTX", "a PTX JIT compilation failed"},
    {CUDA_ERROR_UNSUPPORTED_PTX_VERSION, "CUDA_ERROR_UNSUPPORTED_PTX_VERSION",
     "the provided PTX was compiled with an unsupported toolchain"},
    {FK_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
    {FK_NOT_FOUND, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
    {CUDA_ERROR_NOT_READY, "CUDA_ERROR_NOT_READY", "device not ready"},
    {CUDA_ERROR_ILLEGAL_ADDRESS, "CUDA_ERROR_ILLEGAL_ADDRESS",
     "an illegal memory access was encountered"},
    {CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES, "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES",
     "too many resources requested for launch"},
    {CUDA_ERROR_LAUNCH_TIMEOUT, "CUDA_ERROR_LAUNCH_TIMEOUT",
     "the launch timed out and was terminated"},
    {CUDA_ERROR_HARDWARE_STACK_ERROR, "CUDA_ERROR_HARDWARE_STACK_ERROR", "hardware stack error"},
    {CUDA_ERROR_ILLEGAL_INSTRUCTION, "CUDA_ERROR_ILLEGAL_INSTRUCTION",
     "an illegal instruction was encountered"},
    {CUDA_ERROR_MISALIGNED_ADDRESS, "CUDA_ERROR_MISALIGNED_ADDRESS", "misaligned address"},
    {CUDA_ERROR_INVALID_ADDRESS_SPACE, "CUDA_ERROR_INVALID_ADDRESS_SPACE",
     "operation not supported on global/shared address space"},
    {CUDA_ERROR_INVALID_PC, "CUDA_ERROR_INVALID_PC", "invalid program counter"},
    {CUDA_ERROR_LAUNCH_FAILED, "CUDA_ERROR_LAUNCH_FAILED", "unspecified launch failure"},
};

/* Both answer in any state (before cuInit, in a broken context): they are how
 * the caller reports those states. */
static CUresult fk_error_text(CUresult r, const char **s, int text) {
  if (!s) return CUDA_ERROR_INVALID_VALUE;
  for (size_t i = 0; i < sizeof fk_errors / sizeof fk_errors[0]; i++) {
    if (fk_errors[i].code == r) {
      *s = text ? fk_errors[i].text : fk_errors[i].name;
      return CUDA_SUCCESS;
    }
  }
  *s = NULL;
  return CUDA_ERROR_INVALID_VALUE;
}

CUresult cuGetErrorName(CUresult r, const char **s) { return fk_error_text(r, s, 0); }
CUresult cuGetErrorString(CUresult r, const char **s) { return fk_error_text(r, s, 1); }

/* Compile-time check that every definition above has the header's signature
 * (an incompatible pointer warns, a missing one leaves a field short). The
 * names are checked by resolving FB_CUDA_FUNCS with dlsym in the self-test. */
__attribute__((unused)) static const fb_cuda_api fk_signatures = {NULL,
                                                                  cuInit,
                                                                  cuDriverGetVersion,
                                                                  cuDeviceGetCount,
                                                                  cuDeviceGet,
                                                                  cuDeviceGetName,
                                                                  cuDeviceGetAttribute,
                                                                  cuDeviceTotalMem_v2,
                                                                  cuDevicePrimaryCtxRetain,
                                                                  cuDevicePrimaryCtxRelease_v2,
                                                                  cuDevicePrimaryCtxReset_v2,
                                                                  cuCtxSetCurrent,
                                                                  cuStreamCreate,
                                                                  cuStreamDestroy_v2,
                                                                  cuStreamSynchronize,
                                                                  cuEventCreate,
                                                                  cuEventDestroy_v2,
                                                                  cuEventRecord,
                                                                  cuEventElapsedTime,
                                                                  cuMemAlloc_v2,
                                                                  cuMemAllocManaged,
                                                                  cuMemFree_v2,
                                                                  cuMemHostAlloc,
                                                                  cuMemFreeHost,
                                                                  cuMemGetInfo_v2,
                                                                  cuMemcpyHtoDAsync_v2,
                                                                  cuMemcpyDtoHAsync_v2,
                                                                  cuMemsetD8Async,
                                                                  cuModuleLoadDataEx,
                                                                  cuModuleUnload,
                                                                  cuModuleGetFunction,
                                                                  cuLaunchKernel,
                                                                  cuGetErrorName,
                                                                  cuGetErrorString};
