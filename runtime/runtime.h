/* runtime/: the CPU device (a thread pool that splits parallel loops into
 * chunks), device memory of a session (root buffer, scratch, return slots)
 * and the launcher that runs a kernel's compiled tasks in order. Internal
 * header of the folder; server/ uses it. Depends on ir/ and codegen/ only.
 *
 * Invariants
 *  - The pool owns its worker threads for its whole life: a parallel loop
 *    never creates threads. Several threads may call fb_pool_for on one pool
 *    at once (each call is an independent job; idle workers help whichever
 *    job has chunks left), and a loop body may itself call fb_pool_for.
 *  - fb_pool_for returns only after every index of [0, n) has been passed to
 *    the body exactly once and no worker touches the job any more.
 *  - Device memory is zeroed, 64-byte aligned and counted against the
 *    session's limit (root buffer + scratch). */
#ifndef FB_RUNTIME_H
#define FB_RUNTIME_H

#include <stddef.h>
#include <stdint.h>

#include "codegen/codegen.h"
#include "fusebox/ir.h"

/* ---------------------------------------------------------------- thread pool */

typedef struct fb_pool fb_pool;

/* Body of a parallel loop: handles lo <= i < hi. */
typedef void (*fb_pool_fn)(void *ctx, int64_t lo, int64_t hi);

#define FB_POOL_MIN_CHUNK 1024 /* default smallest chunk of iterations */

/* nthreads: threads that run chunks, the caller of fb_pool_for included
 * (nthreads - 1 workers are started); 0 = one per online core. min_chunk:
 * smallest number of iterations handed out at once (0 = FB_POOL_MIN_CHUNK).
 * Returns 0, FB_EINVAL or FB_EDEVICE/FB_ENOMEM with a message in err. */
int fb_pool_new(int nthreads, int64_t min_chunk, fb_pool **out, char *err, size_t errlen);
/* Stops and joins the workers. No fb_pool_for may be running. */
void fb_pool_free(fb_pool *p);
int fb_pool_threads(const fb_pool *p);
/* Run fn over [0, n) split into chunks over the workers and the calling
 * thread; returns when all chunks are done. n <= 0 does nothing. */
void fb_pool_for(fb_pool *p, int64_t n, fb_pool_fn fn, void *ctx);

/* ---------------------------------------------------------------- device */

typedef struct fb_cpu_device {
  fb_pool *pool;
} fb_cpu_device;

/* threads: as fb_pool_new's nthreads (0 = one per core). */
int fb_cpu_device_new(int threads, fb_cpu_device **out, char *err, size_t errlen);
void fb_cpu_device_free(fb_cpu_device *d);
/* Online cores of this machine (at least 1). */
int fb_cpu_cores(void);

/* ---------------------------------------------------------------- memory */

typedef struct fb_devmem {
  uint8_t *root;        /* layout->root_bytes, zeroed, 64-byte aligned */
  uint64_t root_bytes;
  uint8_t *gtmp;        /* scratch shared by the tasks of one launch */
  size_t gtmp_bytes;
  uint64_t *rets;       /* return slots */
  int nrets;
  uint64_t limit;       /* bytes, 0 = unlimited */
  size_t root_alloc;    /* bytes actually mapped or allocated for root */
  int root_mapped;      /* root came from mmap */
} fb_devmem;

/* Allocate the zeroed root buffer. FB_EQUOTA (message naming the bytes
 * asked and the limit) when root_bytes exceeds limit. */
int fb_devmem_init(fb_devmem *m, uint64_t root_bytes, uint64_t limit, char *err,
                   size_t errlen);
/* Grow scratch to at least gtmp_bytes and the return slots to at least
 * nrets (never shrinks). Scratch counts against the limit (FB_EQUOTA). */
int fb_devmem_reserve(fb_devmem *m, size_t gtmp_bytes, int nrets, char *err, size_t errlen);
/* Bytes counted against the limit: root + scratch. */
uint64_t fb_devmem_used(const fb_devmem *m);
void fb_devmem_release(fb_devmem *m);

/* ---------------------------------------------------------------- launcher */

typedef struct fb_rt_task {
  fb_task_body_fn body;
  fb_task_bounds_fn bounds; /* NULL: serial task */
} fb_rt_task;

/* Run tasks in order on the CPU: a serial task as body(ctx, 0, 0) on the
 * calling thread, a parallel one as bounds(ctx, &n) then body over [0, n)
 * through the pool. *ctx->error is checked after each task: FB_EBOUNDS lets
 * the remaining tasks run (accesses were skipped, as in the interpreter),
 * any other error stops the launch. Returns 0 or the first error; *seconds
 * (may be NULL) gets the device time (CLOCK_MONOTONIC) and *failed (may be
 * NULL) the index of the task that raised the error, -1 when none. */
int fb_cpu_run(fb_cpu_device *d, fb_rt_ctx *ctx, const fb_rt_task *tasks, int ntasks,
               double *seconds, int *failed);

#endif
