/* runtime/cpu.h: the CPU device's own functions, private to runtime/ (and
 * to the tests of the thread pool and the launcher), as runtime/cuda.h is
 * the CUDA device's. The engine drives the CPU only through the device
 * operations table (fb_device_ops_for("cpu"), runtime.h); its include
 * folder does not hold this header (fb_layer, test_layers), so it cannot
 * reach the device's pool or JIT around the table. */
#ifndef FB_RUNTIME_CPU_H
#define FB_RUNTIME_CPU_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "runtime/runtime.h"

/* ---------------------------------------------------------------- the device */

typedef struct fb_cpu_device {
  fb_pool *pool;
  fb_cpu_jit *jit;    /* opened through fb_cpu_ops: its compiler (freed with it) */
  char name[64];      /* opened through fb_cpu_ops: "CPU (N threads)" */
  /* privatized scatter (launch.c): the threads' private copies, kept
   * between launches filled with -0.0; one launch at a time uses them
   * (another one meanwhile allocates its own, while all such own copies
   * together stay within PRIV_MAX_TOTAL: priv_own_words) */
  pthread_mutex_t priv_mu;
  uint32_t *priv_buf;
  size_t priv_words;
  int priv_busy;
  size_t priv_own_words;
} fb_cpu_device;

/* threads: as fb_pool_new's nthreads (0 = one per core). */
int fb_cpu_device_new(int threads, fb_cpu_device **out, char *err, size_t errlen);
void fb_cpu_device_free(fb_cpu_device *d);

/* ---------------------------------------------------------------- launcher */

/* Run tasks in order on the CPU: a serial task as body(ctx, 0, 0) on the
 * calling thread, a parallel one as bounds(ctx, &n) then body over [0, n)
 * through the pool. *ctx->error is checked after each task: FB_EBOUNDS lets
 * the remaining tasks run (accesses were skipped, as in the interpreter),
 * any other error stops the launch. Returns 0 or the first error; *seconds
 * (may be NULL) gets the device time (CLOCK_MONOTONIC) and *failed (may be
 * NULL) the index of the task that raised the error, -1 when none. */
int fb_cpu_run(fb_cpu_device *d, fb_rt_ctx *ctx, const fb_rt_task *tasks, int ntasks,
               double *seconds, int *failed);
/* The same with hints (one per task, or NULL) for a session with sparse
 * SNodes (sp may be NULL): a listgen task's list is sized first
 * (fb_sparse_prepare_list; on failure the launch stops with its code and
 * message in err). FB_EQUOTA latched by the device (a block that did not
 * fit) lets the remaining tasks run, like FB_EBOUNDS. */
int fb_cpu_run_sparse(fb_cpu_device *d, fb_rt_ctx *ctx, fb_sparse *sp, const fb_rt_task *tasks,
                      const fb_rt_hint *hints, int ntasks, double *seconds, int *failed, char *err,
                      size_t errlen);

#endif
