/* The CPU device and its launcher: runs the compiled tasks of one kernel
 * launch in order. Serial tasks run on the calling thread; a parallel task
 * asks its bounds function for the iteration count and hands the range to
 * the thread pool (list generations in small chunks: their iterations are
 * whole blocks). Before a listgen task the host sizes its list. Backend
 * time is the CLOCK_MONOTONIC time around the device work. At the end, the
 * CPU device's operations table (fb_cpu_ops) and the choice of a table by
 * name (fb_device_ops_for, runtime.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "runtime/cpu.h"
#include "runtime/cuda.h" /* fb_cuda_ops, for fb_device_ops_for */

int fb_cpu_device_new(int threads, fb_cpu_device **out, char *err, size_t errlen) {
  *out = NULL;
  fb_cpu_device *d = calloc(1, sizeof *d);
  if (!d) {
    fb_errf(err, errlen, "CPU device: out of memory");
    return FB_ENOMEM;
  }
  int rc = fb_pool_new(threads, 0, &d->pool, err, errlen);
  if (rc) {
    free(d);
    return rc;
  }
  *out = d;
  return 0;
}

void fb_cpu_device_free(fb_cpu_device *d) {
  if (!d) return;
  fb_cpu_jit_free(d->jit);
  fb_pool_free(d->pool);
  free(d);
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

typedef struct par_job {
  fb_task_body_fn body;
  fb_rt_ctx *ctx;
} par_job;

static void par_chunk(void *arg, int64_t lo, int64_t hi) {
  const par_job *j = arg;
  j->body(j->ctx, lo, hi);
}

static void run_task(fb_cpu_device *d, fb_rt_ctx *ctx, const fb_rt_task *t, int64_t grain) {
  if (!t->bounds) {
    t->body(ctx, 0, 0);
    return;
  }
  int64_t n = 0;
  t->bounds(ctx, &n);
  if (n <= 0) return;
  par_job j = {t->body, ctx};
  fb_pool_for_grain(d->pool, n, grain, par_chunk, &j);
}

int fb_cpu_run(fb_cpu_device *d, fb_rt_ctx *ctx, const fb_rt_task *tasks, int ntasks,
               double *seconds, int *failed) {
  return fb_cpu_run_sparse(d, ctx, NULL, tasks, NULL, ntasks, seconds, failed, NULL, 0);
}

int fb_cpu_run_sparse(fb_cpu_device *d, fb_rt_ctx *ctx, fb_sparse *sp, const fb_rt_task *tasks,
                      const fb_rt_hint *hints, int ntasks, double *seconds, int *failed, char *err,
                      size_t errlen) {
  int first = 0, where = -1;
  double t0 = now_s();
  for (int i = 0; i < ntasks; i++) {
    if (sp && hints && hints[i].list_snode > 0) {
      int rc = fb_sparse_prepare_list(sp, hints[i].list_snode, err, errlen);
      if (rc) {
        if (!first || first == FB_EBOUNDS || first == FB_EQUOTA) first = rc, where = i;
        break;
      }
    }
    int32_t before = *ctx->error;
    run_task(d, ctx, &tasks[i], hints ? hints[i].grain : 0);
    int32_t e = *ctx->error;
    if (e && !before) where = i;
    if (e && !first) first = e;
    if (e && e != FB_EBOUNDS && e != FB_EQUOTA) break;
  }
  if (seconds) *seconds = now_s() - t0;
  if (failed) *failed = where;
  return first;
}

/* ---------------------------------------------------------------- device operations */

/* The thread pool and the JIT that compiles for it. */
static int cpu_open(int threads, void **dev, char *err, size_t errlen) {
  fb_cpu_device *d;
  *dev = NULL;
  int rc = fb_cpu_device_new(threads, &d, err, errlen);
  if (rc) return rc;
  d->jit = fb_cpu_jit_new(err, errlen);
  if (!d->jit) {
    fb_cpu_device_free(d);
    return FB_EDEVICE;
  }
  snprintf(d->name, sizeof d->name, "CPU (%d threads)", fb_pool_threads(d->pool));
  *dev = d;
  return 0;
}

static void cpu_close(void *dev) { fb_cpu_device_free(dev); }

static const char *cpu_name(const void *dev) { return ((const fb_cpu_device *)dev)->name; }

static int cpu_healthy(void *dev, char *why, size_t len) { return 1; }

/* CPU tasks read their arguments through a pointer: no bound. */
static int cpu_max_task_params(void) { return 0; }

static int cpu_compile(void *dev, const fb_cg_task *t, fb_cpu_code *out, char *err, size_t errlen) {
  return fb_cpu_jit_compile(((fb_cpu_device *)dev)->jit, t, out, err, errlen);
}

/* The cache is the JIT's: evicted code leaves the JIT. */
static void cpu_code_cache(void *dev, fb_code_cache_info *out) {
  fb_cpu_jit_cache_info(((fb_cpu_device *)dev)->jit, out);
}

static void cpu_set_code_cache_bytes(void *dev, uint64_t bytes) {
  fb_cpu_jit_set_cache_limit(((fb_cpu_device *)dev)->jit, bytes);
}

/* A session's queue is the device itself: it keeps nothing per session. */
static int cpu_queue_new(void *dev, void **q, char *err, size_t errlen) {
  *q = dev;
  return 0;
}

static void cpu_queue_free(void *q) {}

static const fb_memsys *cpu_memsys(void *q) { return NULL; }

static int cpu_alive(void *q, char *err, size_t errlen) { return 0; }

static int cpu_run(void *q, fb_rt_ctx *ctx, fb_sparse *sp, const fb_rt_task *tasks,
                   const fb_rt_hint *hints, int ntasks, double *seconds, int *failed, char *err,
                   size_t errlen) {
  return fb_cpu_run_sparse(q, ctx, sp, tasks, hints, ntasks, seconds, failed, err, errlen);
}

static int cpu_begin(void *q, char *err, size_t errlen) { return 0; }

/* Runs the task now: its error, no slot. */
static int cpu_launch(void *q, fb_rt_ctx *ctx, const fb_rt_task *t, const fb_rt_hint *hint,
                      fb_sparse *sp, int *slot, double *seconds, char *err, size_t errlen) {
  int failed = -1;
  *slot = -1;
  return fb_cpu_run_sparse(q, ctx, sp, t, hint, 1, seconds, &failed, err, errlen);
}

static int cpu_finish(void *q, const int32_t **errs, int *nslots, double *seconds, char *err,
                      size_t errlen) {
  *errs = NULL;
  *nslots = 0;
  if (seconds) *seconds = 0;
  return 0;
}

static const fb_device_ops fb_cpu_ops = {
    .backend = "cpu",
    .queued = 0,
    .open = cpu_open,
    .close = cpu_close,
    .name = cpu_name,
    .healthy = cpu_healthy,
    .max_task_params = cpu_max_task_params,
    .compile = cpu_compile,
    .code_cache = cpu_code_cache,
    .set_code_cache_bytes = cpu_set_code_cache_bytes,
    .queue_new = cpu_queue_new,
    .queue_free = cpu_queue_free,
    .memsys = cpu_memsys,
    .alive = cpu_alive,
    .run = cpu_run,
    .begin = cpu_begin,
    .launch = cpu_launch,
    .finish = cpu_finish,
};

const fb_device_ops *fb_device_ops_for(const char *backend) {
  if (backend && strcmp(backend, "cpu") == 0) return &fb_cpu_ops;
  if (backend && strcmp(backend, "cuda") == 0) return &fb_cuda_ops;
  return NULL;
}
