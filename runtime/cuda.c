/* The CUDA device (runtime/cuda.h): the driver loaded with dlopen,
 * one primary context, modules cached by task IR, a stream per session
 * queue, session memory from cuMemAlloc within the device's budget (host
 * access copies through a pinned staging buffer on the session's stream;
 * managed memory read in place when FB_CUDA_MEMORY=managed), launches with
 * cuLaunchKernel, device time from events, and sticky-error containment.
 *
 * A launch passes the task's whole context as kernel parameters (codegen.h
 * FB_GPU_ENTRY), so it needs no copy before it and the host never waits
 * between tasks; each launch's error words (the error and the fused part
 * to blame, codegen/rt/fb_rt.h) are a slot of a device array that
 * the batch's finish copies back once, with the batch's end event. At the
 * end, the CUDA device's operations table (fb_cuda_ops, cuda.h). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "runtime/cuda.h"
#include "runtime/cuda_drv.h"
#include "runtime/runtime.h"

#define BLOCK 128        /* threads per block of a parallel task */
#define SLOTS 4096       /* error slots on the device per drain */
#define SLOT_BYTES 8     /* one slot: the error word and the blame word (fb_rt.h) */
#define MAX_KPARAMS 512  /* kernel parameters (4 KiB of parameter space) */
#define STAGE_BYTES ((size_t)1 << 20) /* a queue's pinned staging buffer */
#define SESSION_MIN ((uint64_t)16 << 20) /* device memory a new session needs free */
#define BUDGET_PCT 80    /* default budget: this share of the device's memory */

typedef struct gpu_fn {   /* a compiled task: kept in the code cache */
  CUmodule mod;
  CUfunction fn;
  int nparams;            /* kernel parameters after the fixed ones */
  int serial;
  int64_t count;          /* iterations when known at compile time, else -1 */
} gpu_fn;

struct fb_cuda_device {
  fb_cuda_api api;
  CUdevice dev;
  int ordinal;
  char name[320], sm[16];
  int sms, threads_per_sm;
  size_t total_mem;
  int managed_mem;        /* FB_CUDA_MEMORY=managed: sessions use managed memory */
  uint64_t budget;        /* bytes sessions may hold on the device */
  pthread_mutex_t mu;     /* everything below */
  uint64_t used;          /* bytes sessions hold (within budget) */
  CUcontext ctx;
  uint64_t gen;           /* context generation: bumps when it is made again */
  int live;               /* queues of the current generation */
  int broken;             /* a sticky error hit the current generation */
  char why[300];
  fb_code_cache *cache;   /* of the current generation (val.a: gpu_fn *) */
  fb_code_store store;    /* PTX outside the process (store.get NULL: none) */
  char *target_text;      /* what the store keys PTX by besides the task */
};

struct fb_cuda_queue {
  fb_cuda_device *d;
  uint64_t gen;
  CUstream stream;
  CUevent start, end;
  CUdeviceptr slots;      /* SLOTS slots of two int32 words on the device */
  int32_t *pinned;        /* their host copy (page-locked) */
  int32_t *errs;          /* every slot of the batch (two words each) */
  int nerrs, cap_errs;
  int dev_used;           /* slots of `slots` in use since the last drain */
  int dead;
  char why[400];
  fb_memsys ms;
  pthread_mutex_t xmu;    /* the staging buffer (host access may come from two threads) */
  uint8_t *stage;         /* STAGE_BYTES of pinned host memory (device memory only) */
  char oom[400];          /* why the last allocation failed */
};

/* ---------------------------------------------------------------- errors */

/* A driver call failed: FB_EDEVICE with "what: NAME: text"; a sticky error
 * breaks the context (its queues end; the device reports unhealthy). */
static int drv_fail(fb_cuda_device *d, fb_cuda_queue *q, CUresult r, const char *what, char *err,
                    size_t errlen) {
  char es[200];
  fb_cuda_errstr(&d->api, r, es, sizeof es);
  if (fb_cuda_sticky(r)) {
    pthread_mutex_lock(&d->mu);
    if (!d->broken && (!q || q->gen == d->gen)) {
      d->broken = 1;
      fb_errf(d->why, sizeof d->why,
              "the GPU context failed (%.150s during %.40s); it is "
              "made again once the sessions it ended are closed",
              es, what);
    }
    pthread_mutex_unlock(&d->mu);
    if (q && !q->dead) {
      q->dead = 1;
      fb_errf(q->why, sizeof q->why,
              "the GPU context failed (%.150s during %.40s): this "
              "session's device memory is lost; close it and open a new one",
              es, what);
    }
    if (q) return fb_errf(err, errlen, "%s", q->why), FB_EDEVICE;
  }
  fb_errf(err, errlen, "CUDA %s failed: %s", what, es);
  return FB_EDEVICE;
}

#define CALL(d, q, expr, what)                                                                     \
  do {                                                                                             \
    CUresult r_ = (expr);                                                                          \
    if (r_ != CUDA_SUCCESS) return drv_fail((d), (q), r_, (what), err, errlen);                    \
  } while (0)

/* ---------------------------------------------------------------- device */

static int attr(fb_cuda_device *d, int a, int *v, char *err, size_t errlen) {
  CALL(d, NULL, d->api.DeviceGetAttribute(v, a, d->dev), "cuDeviceGetAttribute");
  return 0;
}

/* The device budget: FB_CUDA_BUDGET bytes (fuseboxd --device-budget), or
 * BUDGET_PCT% of the device's memory; checked against what cuMemGetInfo
 * finds free now (another process may hold some of it). */
static int set_budget(fb_cuda_device *d, char *err, size_t errlen) {
  const char *name = d->name;
  size_t free_b = 0, total_b = 0;
  CALL(d, NULL, d->api.MemGetInfo(&free_b, &total_b), "cuMemGetInfo");
  const char *b = getenv("FB_CUDA_BUDGET");
  char *end = NULL;
  unsigned long long want = b && *b ? strtoull(b, &end, 10) : 0;
  if (b && *b && (!end || *end || !want))
    return fb_errf(err, errlen, "CUDA backend: FB_CUDA_BUDGET=%.40s is not a byte count", b),
           FB_EINVAL;
  if (want) {
    if (want > free_b)
      return fb_errf(err, errlen,
                     "CUDA backend: the device budget of %llu bytes is more than the %zu bytes "
                     "free on GPU %d (%s, %zu bytes in all); lower --device-budget",
                     want, free_b, d->ordinal, name, total_b),
             FB_EINVAL;
    d->budget = want;
  } else {
    d->budget = (uint64_t)total_b / 100 * BUDGET_PCT;
    if (d->budget > (uint64_t)free_b / 100 * 90) d->budget = (uint64_t)free_b / 100 * 90;
  }
  if (d->budget < SESSION_MIN)
    return fb_errf(err, errlen,
                   "CUDA backend: GPU %d (%s) has %zu bytes free; a budget of %llu bytes leaves "
                   "no room for a session",
                   d->ordinal, name, free_b, (unsigned long long)d->budget),
           FB_EDEVICE;
  return 0;
}

static int probe(fb_cuda_device *d, char *err, size_t errlen) {
  int n = 0, major = 0, minor = 0, managed = 0, concurrent = 0, version = 0;
  CUresult r = d->api.Init(0);
  if (r == CUDA_ERROR_NO_DEVICE || (r == CUDA_SUCCESS && d->api.DeviceGetCount(&n) == 0 && !n))
    return fb_errf(err, errlen,
                   "CUDA backend: the driver finds no GPU on this machine; use "
                   "--backend cpu or auto"),
           FB_EDEVICE;
  if (r != CUDA_SUCCESS) return drv_fail(d, NULL, r, "cuInit", err, errlen);
  const char *ord = getenv("FB_CUDA_DEVICE");
  d->ordinal = ord && *ord ? atoi(ord) : 0;
  if (d->ordinal < 0 || d->ordinal >= n)
    return fb_errf(err, errlen, "CUDA backend: FB_CUDA_DEVICE=%d, but there are %d GPUs",
                   d->ordinal, n),
           FB_EDEVICE;
  CALL(d, NULL, d->api.DeviceGet(&d->dev, d->ordinal), "cuDeviceGet");
  char name[200] = "";
  CALL(d, NULL, d->api.DeviceGetName(name, (int)sizeof name - 1, d->dev), "cuDeviceGetName");
  int rc = attr(d, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, &major, err, errlen);
  if (!rc) rc = attr(d, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, &minor, err, errlen);
  if (!rc) rc = attr(d, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, &d->sms, err, errlen);
  if (!rc)
    rc = attr(d, CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR, &d->threads_per_sm, err,
              errlen);
  if (!rc) rc = attr(d, CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY, &managed, err, errlen);
  if (!rc) rc = attr(d, CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS, &concurrent, err, errlen);
  if (rc) return rc;
  CALL(d, NULL, d->api.DeviceTotalMem(&d->total_mem, d->dev), "cuDeviceTotalMem");
  d->api.DriverGetVersion(&version);
  const char *mm = getenv("FB_CUDA_MEMORY");
  if (mm && *mm && strcmp(mm, "device") && strcmp(mm, "managed"))
    return fb_errf(err, errlen, "CUDA backend: FB_CUDA_MEMORY=%.40s; use device or managed", mm),
           FB_EINVAL;
  d->managed_mem = mm && !strcmp(mm, "managed");
  if (d->managed_mem && (!managed || !concurrent))
    return fb_errf(err, errlen,
                   "CUDA backend: %s cannot share managed memory with the host "
                   "while kernels run (concurrentManagedAccess is 0), which Fusebox needs",
                   name),
           FB_EDEVICE;
  /* the newest SM our LLVM emits for: newer devices run its PTX through the driver's JIT */
  int cc = major * 10 + minor;
  if (cc > 90) cc = 90;
  if (cc < 60)
    return fb_errf(err, errlen,
                   "CUDA backend: %s has compute capability %d.%d; Fusebox needs "
                   "6.0 or newer",
                   name, major, minor),
           FB_EDEVICE;
  snprintf(d->sm, sizeof d->sm, "sm_%d", cc);
  snprintf(d->name, sizeof d->name, "%s (sm_%d%d, %d SMs, %.1f GiB, driver %d.%d)", name, major,
           minor, d->sms, (double)d->total_mem / (1u << 30), version / 1000, version % 1000 / 10);
  if (d->threads_per_sm < BLOCK) d->threads_per_sm = BLOCK;
  return 0;
}

static int make_context(fb_cuda_device *d, char *err, size_t errlen) {
  CALL(d, NULL, d->api.PrimaryCtxRetain(&d->ctx, d->dev), "cuDevicePrimaryCtxRetain");
  CALL(d, NULL, d->api.CtxSetCurrent(d->ctx), "cuCtxSetCurrent");
  if (!(d->cache = fb_code_cache_new()))
    return fb_errf(err, errlen, "CUDA backend: out of memory"), FB_ENOMEM;
  return 0;
}

int fb_cuda_device_new(fb_cuda_device **out, char *err, size_t errlen) {
  *out = NULL;
  fb_cuda_device *d = calloc(1, sizeof *d);
  if (!d) return fb_errf(err, errlen, "CUDA backend: out of memory"), FB_ENOMEM;
  /* recursive: remaking the context (under mu) may fail a call, and the
   * failure path takes mu to record a sticky error */
  pthread_mutexattr_t ma;
  pthread_mutexattr_init(&ma);
  pthread_mutexattr_settype(&ma, PTHREAD_MUTEX_RECURSIVE);
  pthread_mutex_init(&d->mu, &ma);
  pthread_mutexattr_destroy(&ma);
  int rc = fb_cuda_api_load(&d->api, err, errlen);
  if (!rc) rc = probe(d, err, errlen);
  if (!rc) rc = make_context(d, err, errlen);
  if (!rc) rc = set_budget(d, err, errlen);
  /* libdevice into memory now: a process-isolated worker makes its device
   * here, before its root becomes empty and seccomp refuses opening files */
  if (!rc) fb_ptx_libdevice_load();
  if (rc) {
    fb_cuda_device_free(d);
    return rc;
  }
  *out = d;
  return 0;
}

static void drop_fn(void *user, fb_code_val *v) {
  fb_cuda_device *d = user;
  gpu_fn *f = v->a;
  if (!f) return;
  if (d && f->mod) d->api.ModuleUnload(f->mod);
  free(f);
}

void fb_cuda_device_free(fb_cuda_device *d) {
  if (!d) return;
  if (d->api.lib) {
    if (d->ctx) d->api.CtxSetCurrent(d->ctx);
    fb_code_cache_free(d->cache, drop_fn, d->broken ? NULL : d);
    if (d->ctx) d->api.PrimaryCtxRelease(d->dev);
    fb_cuda_api_unload(&d->api);
  }
  pthread_mutex_destroy(&d->mu);
  free(d->target_text);
  free(d);
}

const char *fb_cuda_device_name(const fb_cuda_device *d) { return d->name; }
const char *fb_cuda_device_sm(const fb_cuda_device *d) { return d->sm; }

int fb_cuda_device_healthy(fb_cuda_device *d, char *why, size_t len) {
  pthread_mutex_lock(&d->mu);
  int ok = !d->broken;
  if (!ok) fb_errf(why, len, "%s", d->why);
  pthread_mutex_unlock(&d->mu);
  return ok;
}

/* The last queue of a broken context is gone: reset it and start again
 * (its modules died with it). Called with d->mu held. */
static void remake_context(fb_cuda_device *d) {
  fb_code_cache_free(d->cache, drop_fn, NULL);
  d->cache = NULL;
  d->api.PrimaryCtxRelease(d->dev);
  d->api.PrimaryCtxReset(d->dev);
  d->ctx = NULL;
  d->gen++;
  char err[256];
  if (make_context(d, err, sizeof err) == 0) {
    d->broken = 0;
    d->why[0] = 0;
  } else {
    fb_errf(d->why, sizeof d->why, "the GPU context could not be made again: %.250s", err);
  }
}

/* ---------------------------------------------------------------- compile */

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int load_module(fb_cuda_device *d, const char *ptx, gpu_fn *f, char *err,
                       size_t errlen) {
  char log[2048] = "";
  CUjit_option opt[2] = {CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES};
  void *val[2] = {log, (void *)(uintptr_t)(sizeof log - 1)};
  CUresult r = d->api.ModuleLoadDataEx(&f->mod, ptx, 2, opt, val);
  if (r != CUDA_SUCCESS) {
    char es[200];
    fb_cuda_errstr(&d->api, r, es, sizeof es);
    fb_errf(err, errlen, "loading its GPU code (PTX) failed: %s%s%s", es, log[0] ? ": " : "",
            log);
    return fb_cuda_sticky(r) ? drv_fail(d, NULL, r, "cuModuleLoadDataEx", NULL, 0),
           FB_EDEVICE        : FB_ECOMPILE;
  }
  r = d->api.ModuleGetFunction(&f->fn, f->mod, FB_GPU_ENTRY);
  if (r != CUDA_SUCCESS) {
    d->api.ModuleUnload(f->mod);
    return drv_fail(d, NULL, r, "cuModuleGetFunction", err, errlen);
  }
  return 0;
}

int fb_cuda_max_task_params(void) { return MAX_KPARAMS - FB_GPU_FIXED_PARAMS; }

int fb_cuda_compile(void *device, const fb_cg_task *t, fb_cpu_code *out, char *err, size_t errlen) {
  fb_cuda_device *d = device;
  if (!d || !t || !t->ir || !out)
    return fb_errf(err, errlen, "fb_cuda_compile: missing device, task or output"), FB_EINVAL;
  memset(out, 0, sizeof *out);
  if (t->ir->nparams > fb_cuda_max_task_params())
    return fb_errf(err, errlen, "it takes %d parameters (kernel arguments, several kernels' when fused); a GPU "
                   "launch takes at most %d",
                   t->ir->nparams, fb_cuda_max_task_params()),
           FB_EUNSUPPORTED;
  double t0 = now_s();
  fb_code_key key = fb_code_cache_key(t);
  fb_code_val hit;
  pthread_mutex_lock(&d->mu);
  fb_code_cache *cache = d->broken ? NULL : d->cache;
  CUcontext ctx = d->ctx;
  pthread_mutex_unlock(&d->mu);
  if (!cache) {
    fb_cuda_device_healthy(d, err, errlen);
    return FB_EDEVICE;
  }
  /* no pins: GPU modules stay loaded for the context's life (a context reset
   * replaces the whole cache, which pins could not outlive) */
  if (fb_code_cache_get(cache, &key, t->ir, NULL, &hit)) {
    out->gpu = hit.a;
    out->cache_hit = 1;
    return 0;
  }
  char *ptx = NULL;
  size_t irlen = 0;
  char *irtext = d->store.get ? fb_cg_task_text(t, &irlen) : NULL;
  int stored = 0, rc = 0;
  uint8_t *bytes = NULL;
  size_t blen = 0;
  /* PTX from the store: text without a NUL inside, or it is compiled anew */
  if (irtext &&
      d->store.get(d->store.user, t->partition, d->target_text, irtext, irlen, &bytes, &blen)) {
    if (!memchr(bytes, 0, blen) && (ptx = malloc(blen + 1))) {
      memcpy(ptx, bytes, blen);
      ptx[blen] = 0;
      stored = 1;
    }
    free(bytes);
  }
  if (!stored) {
    rc = fb_ptx_compile(t, d->sm, &ptx, &out->stmts_emitted, err, errlen);
    if (!rc && irtext)
      d->store.put(d->store.user, t->partition, d->target_text, irtext, irlen,
                   (const uint8_t *)ptx, strlen(ptx));
  }
  free(irtext);
  uint64_t code_bytes = ptx ? (uint64_t)strlen(ptx) : 0;
  gpu_fn *f = rc ? NULL : calloc(1, sizeof *f);
  if (!rc && !f) rc = (fb_errf(err, errlen, "out of memory"), FB_ENOMEM);
  if (!rc) {
    d->api.CtxSetCurrent(ctx);
    rc = load_module(d, ptx, f, err, errlen);
    if (rc == FB_ECOMPILE && stored) { /* PTX this driver refuses: compile it here */
      free(ptx);
      ptx = NULL;
      stored = 0;
      if (err && errlen) err[0] = 0;
      rc = fb_ptx_compile(t, d->sm, &ptx, &out->stmts_emitted, err, errlen);
      code_bytes = ptx ? (uint64_t)strlen(ptx) : 0;
      if (!rc) rc = load_module(d, ptx, f, err, errlen);
    }
  }
  free(ptx);
  if (rc) {
    free(f);
    memset(out, 0, sizeof *out);
    return rc;
  }
  f->nparams = t->ir->nparams;
  f->serial = t->loop < 0;
  f->count = fb_cg_static_count(t);
  fb_code_val v = {.a = f}, kept;
  if (fb_code_cache_put(cache, &key, t->ir, &v, code_bytes, NULL, &kept))
    drop_fn(d, &v); /* lost a race */
  out->gpu = kept.a;
  out->cache_hit = stored; /* not compiled (the driver loaded it) */
  out->compile_s = stored ? 0 : now_s() - t0;
  return 0;
}

/* ---------------------------------------------------------------- memory */

/* Why an allocation of `bytes` failed, into q->oom: the device, the bytes
 * asked and the bytes free (of the budget, and what the driver reports). */
static void note_oom(fb_cuda_queue *q, size_t bytes, uint64_t left) {
  fb_cuda_device *d = q->d;
  size_t free_b = 0, total_b = 0;
  if (d->api.MemGetInfo(&free_b, &total_b) != CUDA_SUCCESS) free_b = 0;
  fb_errf(q->oom, sizeof q->oom,
          "out of device memory on GPU %d (%s): %zu bytes asked, %llu bytes free "
          "(device budget %llu bytes; the driver reports %zu bytes free)",
          d->ordinal, d->name, bytes, (unsigned long long)(left < free_b ? left : free_b),
          (unsigned long long)d->budget, free_b);
}

/* Session memory: within the device budget, device memory (or managed
 * memory with FB_CUDA_MEMORY=managed), zeroed on the stream when asked
 * (before any later copy or launch of the session; managed memory is
 * waited for, since the host reads it in place). */
static void *session_mem(fb_cuda_queue *q, size_t bytes, int zero) {
  fb_cuda_device *d = q->d;
  CUdeviceptr p = 0;
  if (!bytes) bytes = 1;
  if (q->dead || d->api.CtxSetCurrent(d->ctx) != CUDA_SUCCESS) {
    fb_errf(q->oom, sizeof q->oom, "%s", q->dead ? q->why : "the GPU context is gone");
    return NULL;
  }
  pthread_mutex_lock(&d->mu);
  uint64_t left = d->budget > d->used ? d->budget - d->used : 0;
  int fits = bytes <= left;
  if (fits) d->used += bytes;
  pthread_mutex_unlock(&d->mu);
  CUresult r = !fits            ? CUDA_ERROR_OUT_OF_MEMORY
               : d->managed_mem ? d->api.MemAllocManaged(&p, bytes, CU_MEM_ATTACH_GLOBAL)
                                : d->api.MemAlloc(&p, bytes);
  if (r == CUDA_SUCCESS && zero) {
    r = d->api.MemsetD8Async(p, 0, bytes, q->stream);
    if (r == CUDA_SUCCESS && d->managed_mem) r = d->api.StreamSynchronize(q->stream);
    if (r != CUDA_SUCCESS) {
      d->api.MemFree(p);
      p = 0;
    }
  }
  if (r == CUDA_SUCCESS) return (void *)(uintptr_t)p;
  if (fits) {
    pthread_mutex_lock(&d->mu);
    d->used -= bytes;
    pthread_mutex_unlock(&d->mu);
  }
  if (r == CUDA_ERROR_OUT_OF_MEMORY) note_oom(q, bytes, left);
  else drv_fail(d, q, r, d->managed_mem ? "cuMemAllocManaged" : "cuMemAlloc", q->oom, sizeof q->oom);
  return NULL;
}

static void *ms_alloc(void *user, size_t bytes) { return session_mem(user, bytes, 1); }
static void *ms_reserve(void *user, size_t bytes) { return session_mem(user, bytes, 0); }

static void ms_free(void *user, void *p, size_t bytes) {
  fb_cuda_queue *q = user;
  fb_cuda_device *d = q->d;
  if (!p) return;
  pthread_mutex_lock(&d->mu);
  int current = q->gen == d->gen; /* an old generation's memory died with its context */
  if (current) d->used -= bytes ? bytes : 1;
  pthread_mutex_unlock(&d->mu);
  if (current) d->api.MemFree((CUdeviceptr)(uintptr_t)p);
}

static int ms_oom(void *user, char *why, size_t len) {
  fb_cuda_queue *q = user;
  if (!q->oom[0]) return 1;
  fb_errf(why, len, "%s", q->oom);
  return 0;
}

/* Host access: through the pinned staging buffer on the session's stream,
 * in pieces of STAGE_BYTES, each waited for. */
static int xfer(fb_cuda_queue *q, void *host, CUdeviceptr dev, size_t n, int to_dev, char *err,
                size_t errlen) {
  fb_cuda_device *d = q->d;
  int rc = fb_cuda_queue_alive(q, err, errlen);
  if (rc) return rc;
  pthread_mutex_lock(&q->xmu);
  CUresult r = d->api.CtxSetCurrent(d->ctx);
  const char *what = "cuCtxSetCurrent";
  for (size_t off = 0; r == CUDA_SUCCESS && off < n;) {
    size_t c = n - off < STAGE_BYTES ? n - off : STAGE_BYTES;
    if (to_dev) {
      memcpy(q->stage, (uint8_t *)host + off, c);
      r = d->api.MemcpyHtoDAsync(dev + off, q->stage, c, q->stream);
      what = "cuMemcpyHtoDAsync";
    } else {
      r = d->api.MemcpyDtoHAsync(q->stage, dev + off, c, q->stream);
      what = "cuMemcpyDtoHAsync";
    }
    if (r == CUDA_SUCCESS && (r = d->api.StreamSynchronize(q->stream)) != CUDA_SUCCESS)
      what = "cuStreamSynchronize";
    if (r == CUDA_SUCCESS && !to_dev) memcpy((uint8_t *)host + off, q->stage, c);
    off += c;
  }
  pthread_mutex_unlock(&q->xmu);
  return r == CUDA_SUCCESS ? 0 : drv_fail(d, q, r, what, err, errlen);
}

static int ms_to_host(void *user, void *dst, const void *dev, size_t bytes, char *err,
                      size_t errlen) {
  return xfer(user, dst, (CUdeviceptr)(uintptr_t)dev, bytes, 0, err, errlen);
}

static int ms_to_dev(void *user, void *dev, const void *src, size_t bytes, char *err,
                     size_t errlen) {
  return xfer(user, (void *)src, (CUdeviceptr)(uintptr_t)dev, bytes, 1, err, errlen);
}

static int ms_fill(void *user, void *dev, int v, size_t bytes, char *err, size_t errlen) {
  fb_cuda_queue *q = user;
  fb_cuda_device *d = q->d;
  int rc = fb_cuda_queue_alive(q, err, errlen);
  if (rc || !bytes) return rc;
  CALL(d, q, d->api.CtxSetCurrent(d->ctx), "cuCtxSetCurrent");
  CALL(d, q, d->api.MemsetD8Async((CUdeviceptr)(uintptr_t)dev, (unsigned char)v, bytes, q->stream),
       "cuMemsetD8Async");
  return 0;
}

void fb_cuda_device_memory(fb_cuda_device *d, fb_cuda_memory_info *out) {
  memset(out, 0, sizeof *out);
  out->managed = d->managed_mem;
  pthread_mutex_lock(&d->mu);
  out->budget = d->budget;
  out->used = d->used;
  pthread_mutex_unlock(&d->mu);
}

/* ---------------------------------------------------------------- queues */

int fb_cuda_queue_new(fb_cuda_device *d, fb_cuda_queue **out, char *err, size_t errlen) {
  *out = NULL;
  pthread_mutex_lock(&d->mu);
  int broken = d->broken;
  if (!broken) d->live++;
  uint64_t gen = d->gen;
  pthread_mutex_unlock(&d->mu);
  if (broken) {
    fb_cuda_device_healthy(d, err, errlen);
    return FB_EDEVICE;
  }
  fb_cuda_queue *q = calloc(1, sizeof *q);
  if (!q) {
    pthread_mutex_lock(&d->mu);
    d->live--;
    pthread_mutex_unlock(&d->mu);
    return fb_errf(err, errlen, "CUDA backend: out of memory"), FB_ENOMEM;
  }
  q->d = d;
  q->gen = gen;
  pthread_mutex_init(&q->xmu, NULL);
  q->ms = (fb_memsys){.alloc = ms_alloc,
                      .free = ms_free,
                      .reserve = ms_reserve,
                      .unreserve = ms_free,
                      .pool_max = d->budget / 4,
                      .user = q,
                      .oom = ms_oom};
  if (!d->managed_mem) {
    q->ms.to_host = ms_to_host;
    q->ms.to_dev = ms_to_dev;
    q->ms.fill = ms_fill;
  }
  *out = q; /* from here fb_cuda_queue_free undoes what was made */
  /* room for one more session: within the budget and free on the device */
  size_t free_b = 0, total_b = 0;
  CALL(d, q, d->api.CtxSetCurrent(d->ctx), "cuCtxSetCurrent");
  CALL(d, q, d->api.MemGetInfo(&free_b, &total_b), "cuMemGetInfo");
  pthread_mutex_lock(&d->mu);
  uint64_t left = d->budget > d->used ? d->budget - d->used : 0;
  pthread_mutex_unlock(&d->mu);
  if (left < SESSION_MIN || free_b < SESSION_MIN)
    return fb_errf(err, errlen,
                   "no device memory for another session on GPU %d (%s): %llu bytes free of "
                   "the device budget of %llu bytes, %zu bytes free on the device, a session "
                   "needs %llu",
                   d->ordinal, d->name, (unsigned long long)left, (unsigned long long)d->budget,
                   free_b, (unsigned long long)SESSION_MIN),
           FB_EQUOTA;
  CALL(d, q, d->api.CtxSetCurrent(d->ctx), "cuCtxSetCurrent");
  CALL(d, q, d->api.StreamCreate(&q->stream, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
  CALL(d, q, d->api.EventCreate(&q->start, CU_EVENT_DEFAULT), "cuEventCreate");
  CALL(d, q, d->api.EventCreate(&q->end, CU_EVENT_DEFAULT), "cuEventCreate");
  CALL(d, q, d->api.MemAlloc(&q->slots, SLOTS * SLOT_BYTES), "cuMemAlloc");
  CALL(d, q, d->api.MemsetD8Async(q->slots, 0, SLOTS * SLOT_BYTES, q->stream), "cuMemsetD8Async");
  CALL(d, q, d->api.MemHostAlloc((void **)&q->pinned, SLOTS * SLOT_BYTES, CU_MEMHOSTALLOC_PORTABLE),
       "cuMemHostAlloc");
  if (!d->managed_mem)
    CALL(d, q, d->api.MemHostAlloc((void **)&q->stage, STAGE_BYTES, CU_MEMHOSTALLOC_PORTABLE),
         "cuMemHostAlloc");
  CALL(d, q, d->api.StreamSynchronize(q->stream), "cuStreamSynchronize");
  return 0;
}

void fb_cuda_queue_free(fb_cuda_queue *q) {
  if (!q) return;
  fb_cuda_device *d = q->d;
  pthread_mutex_lock(&d->mu);
  int current = q->gen == d->gen;
  pthread_mutex_unlock(&d->mu);
  if (current) { /* the resources of an old generation died with its context */
    d->api.CtxSetCurrent(d->ctx);
    if (q->stream) d->api.StreamSynchronize(q->stream);
    if (q->pinned) d->api.MemFreeHost(q->pinned);
    if (q->stage) d->api.MemFreeHost(q->stage);
    if (q->slots) d->api.MemFree(q->slots);
    if (q->start) d->api.EventDestroy(q->start);
    if (q->end) d->api.EventDestroy(q->end);
    if (q->stream) d->api.StreamDestroy(q->stream);
  }
  pthread_mutex_lock(&d->mu);
  if (current && --d->live == 0 && d->broken) remake_context(d);
  pthread_mutex_unlock(&d->mu);
  pthread_mutex_destroy(&q->xmu);
  free(q->errs);
  free(q);
}

const fb_memsys *fb_cuda_queue_memsys(fb_cuda_queue *q) { return &q->ms; }

int fb_cuda_queue_alive(fb_cuda_queue *q, char *err, size_t errlen) {
  if (!q->dead) {
    pthread_mutex_lock(&q->d->mu);
    if (q->d->broken || q->gen != q->d->gen) {
      q->dead = 1;
      fb_errf(q->why, sizeof q->why,
              "%.300s; this session's device memory is lost: close it "
              "and open a new one",
              q->d->broken ? q->d->why : "the GPU context was made again");
    }
    pthread_mutex_unlock(&q->d->mu);
  }
  if (!q->dead) return 0;
  fb_errf(err, errlen, "%s", q->why);
  return FB_EDEVICE;
}

/* Copy the device slots in use to q->errs and clear them; waits. */
static int drain(fb_cuda_queue *q, char *err, size_t errlen) {
  fb_cuda_device *d = q->d;
  int n = q->dev_used;
  if (n)
    CALL(d, q, d->api.MemcpyDtoHAsync(q->pinned, q->slots, (size_t)n * SLOT_BYTES, q->stream),
         "cuMemcpyDtoHAsync");
  CALL(d, q, d->api.StreamSynchronize(q->stream), "cuStreamSynchronize");
  if (!n) return 0;
  if (q->nerrs + n > q->cap_errs) {
    int cap = q->cap_errs ? q->cap_errs : SLOTS;
    while (cap < q->nerrs + n) cap *= 2;
    int32_t *e = realloc(q->errs, (size_t)cap * SLOT_BYTES);
    if (!e) return fb_errf(err, errlen, "out of memory"), FB_ENOMEM;
    q->errs = e;
    q->cap_errs = cap;
  }
  memcpy(q->errs + 2 * (size_t)q->nerrs, q->pinned, (size_t)n * SLOT_BYTES);
  q->nerrs += n;
  q->dev_used = 0;
  CALL(d, q, d->api.MemsetD8Async(q->slots, 0, (size_t)n * SLOT_BYTES, q->stream),
       "cuMemsetD8Async");
  return 0;
}

int fb_cuda_begin(fb_cuda_queue *q, char *err, size_t errlen) {
  int rc = fb_cuda_queue_alive(q, err, errlen);
  if (rc) return rc;
  fb_cuda_device *d = q->d;
  q->nerrs = 0;
  q->dev_used = 0;
  CALL(d, q, d->api.CtxSetCurrent(d->ctx), "cuCtxSetCurrent");
  CALL(d, q, d->api.EventRecord(q->start, q->stream), "cuEventRecord");
  return 0;
}

/* Blocks for a task: one thread for a serial one; for a parallel one enough
 * to cover its iterations when they are known, at most what fills the
 * device (the kernel strides over the rest). */
static unsigned grid_of(const fb_cuda_device *d, const gpu_fn *f) {
  if (f->serial) return 1;
  int64_t full = (int64_t)d->sms * (d->threads_per_sm / BLOCK);
  if (full < 1) full = 1;
  if (f->count < 0) return (unsigned)full;
  int64_t want = (f->count + BLOCK - 1) / BLOCK;
  if (want < 1) want = 1;
  return (unsigned)(want < full ? want : full);
}

int fb_cuda_launch(fb_cuda_queue *q, const fb_rt_ctx *ctx, const fb_rt_task *t,
                   const fb_rt_hint *hint, fb_sparse *sp, char *err, size_t errlen) {
  fb_cuda_device *d = q->d;
  const gpu_fn *f = t->gpu;
  if (!f) return fb_errf(err, errlen, "task has no GPU code"), FB_EINTERNAL;
  int rc = fb_cuda_queue_alive(q, err, errlen);
  if (rc) return rc;
  if (sp && hint && hint->list_snode > 0) { /* the host sizes the list from the parent's */
    CALL(d, q, d->api.StreamSynchronize(q->stream), "cuStreamSynchronize");
    if ((rc = fb_sparse_prepare_list(sp, hint->list_snode, err, errlen))) return rc;
  }
  if (q->dev_used == SLOTS && (rc = drain(q, err, errlen))) return rc;
  uint64_t val[MAX_KPARAMS];
  void *ptr[MAX_KPARAMS];
  int slot = q->nerrs + q->dev_used;
  val[0] = (uint64_t)(uintptr_t)ctx->root;
  val[1] = (uint64_t)(uintptr_t)ctx->rets;
  val[2] = (uint64_t)(uintptr_t)ctx->gtmp;
  val[3] = (uint64_t)q->slots + (uint64_t)q->dev_used * SLOT_BYTES;
  val[4] = ctx->seed;
  val[5] = ctx->launch;
  val[6] = (uint64_t)(uintptr_t)ctx->runtime;
  val[7] = 0;
  val[8] = (uint64_t)INT64_MAX;
  for (int i = 0; i < f->nparams; i++) val[FB_GPU_FIXED_PARAMS + i] = ctx->args[i];
  int np = FB_GPU_FIXED_PARAMS + f->nparams;
  for (int i = 0; i < np; i++) ptr[i] = &val[i];
  unsigned block = f->serial ? 1 : BLOCK;
  CALL(d, q, d->api.LaunchKernel(f->fn, grid_of(d, f), 1, 1, block, 1, 1, 0, q->stream, ptr, NULL),
       "cuLaunchKernel");
  q->dev_used++;
  return slot;
}

int fb_cuda_finish(fb_cuda_queue *q, const int32_t **errs, int *nslots, double *seconds, char *err,
                   size_t errlen) {
  fb_cuda_device *d = q->d;
  *errs = NULL;
  *nslots = 0;
  if (seconds) *seconds = 0;
  int rc = fb_cuda_queue_alive(q, err, errlen);
  if (rc) return rc;
  CALL(d, q, d->api.EventRecord(q->end, q->stream), "cuEventRecord");
  if ((rc = drain(q, err, errlen))) return rc;
  float ms = 0;
  CALL(d, q, d->api.EventElapsedTime(&ms, q->start, q->end), "cuEventElapsedTime");
  if (seconds) *seconds = (double)ms * 1e-3;
  *errs = q->errs;
  *nslots = q->nerrs;
  return 0;
}

/* ---------------------------------------------------------------- device operations */

static int cuda_open(int cpu_threads, void **dev, char *err, size_t errlen) {
  fb_cuda_device *d;
  int rc = fb_cuda_device_new(&d, err, errlen);
  *dev = d;
  return rc;
}

static void cuda_close(void *dev) { fb_cuda_device_free(dev); }

static const char *cuda_name(const void *dev) { return fb_cuda_device_name(dev); }

static int cuda_healthy(void *dev, char *why, size_t len) {
  return fb_cuda_device_healthy(dev, why, len);
}

static void cuda_code_cache(void *dev, fb_code_cache_info *out) {
  fb_cuda_device *d = dev;
  pthread_mutex_lock(&d->mu); /* a context made again replaces the cache */
  fb_code_cache_stats(d->cache, out);
  pthread_mutex_unlock(&d->mu);
}

/* Unbounded: a module stays loaded for its context's life (compiles take
 * no pins), so evicting one could unload a task a queued launch runs. */
static void cuda_set_code_cache_bytes(void *dev, uint64_t bytes) {}

/* PTX in the code store: the driver's JIT still runs on a hit, LLVM not. */
static int cuda_set_code_store(void *dev, const fb_code_store *s) {
  fb_cuda_device *d = dev;
  free(d->target_text);
  d->target_text = NULL;
  memset(&d->store, 0, sizeof d->store);
  if (!s || !s->get) return 0;
  if (!(d->target_text = fb_ptx_target_text(d->sm))) return FB_ENOMEM;
  d->store = *s;
  return 0;
}

static int cuda_queue_new(void *dev, void **q, char *err, size_t errlen) {
  fb_cuda_queue *cq;
  int rc = fb_cuda_queue_new(dev, &cq, err, errlen);
  *q = cq;
  return rc;
}

static void cuda_queue_free(void *q) { fb_cuda_queue_free(q); }

static const fb_memsys *cuda_memsys(void *q) { return fb_cuda_queue_memsys(q); }

static int cuda_alive(void *q, char *err, size_t errlen) {
  return fb_cuda_queue_alive(q, err, errlen);
}

/* A sync launch: the tasks as one batch, waited for; the first task whose
 * error slot is set (or that could not be queued). */
static int cuda_run(void *vq, fb_rt_ctx *ctx, fb_sparse *sp, const fb_rt_task *tasks,
                    const fb_rt_hint *hints, int ntasks, double *secs, int *failed, char *msg,
                    size_t len) {
  fb_cuda_queue *q = vq;
  int rc = fb_cuda_begin(q, msg, len);
  for (int i = 0; !rc && i < ntasks; i++) {
    int slot = fb_cuda_launch(q, ctx, &tasks[i], &hints[i], sp, msg, len);
    if (slot < 0) rc = slot, *failed = i;
  }
  const int32_t *errs = NULL;
  int n = 0;
  char fmsg[2048];
  int frc = fb_cuda_finish(q, &errs, &n, secs, fmsg, sizeof fmsg);
  if (frc && (!rc || frc == FB_EDEVICE)) {
    fb_errf(msg, len, "%s", fmsg);
    return frc;
  }
  for (int i = 0; !rc && i < n; i++)
    if (errs[2 * i]) rc = errs[2 * i], *failed = i;
  return rc;
}

static int cuda_begin(void *q, char *err, size_t errlen) { return fb_cuda_begin(q, err, errlen); }

/* Queues the task: its slot, or the code that refused it. */
static int cuda_launch(void *q, fb_rt_ctx *ctx, const fb_rt_task *t, const fb_rt_hint *hint,
                       fb_sparse *sp, int *slot, double *seconds, char *err, size_t errlen) {
  int rc = fb_cuda_launch(q, ctx, t, hint, sp, err, errlen);
  *slot = rc >= 0 ? rc : -1;
  return rc >= 0 ? 0 : rc;
}

static int cuda_finish(void *q, const int32_t **errs, int *nslots, double *seconds, char *err,
                       size_t errlen) {
  return fb_cuda_finish(q, errs, nslots, seconds, err, errlen);
}

const fb_device_ops fb_cuda_ops = {
    .backend = "cuda",
    .queued = 1,
    .open = cuda_open,
    .close = cuda_close,
    .name = cuda_name,
    .healthy = cuda_healthy,
    .max_task_params = fb_cuda_max_task_params,
    .compile = fb_cuda_compile,
    .code_cache = cuda_code_cache,
    .set_code_cache_bytes = cuda_set_code_cache_bytes,
    .set_code_store = cuda_set_code_store,
    .queue_new = cuda_queue_new,
    .queue_free = cuda_queue_free,
    .memsys = cuda_memsys,
    .alive = cuda_alive,
    .run = cuda_run,
    .begin = cuda_begin,
    .launch = cuda_launch,
    .finish = cuda_finish,
};
