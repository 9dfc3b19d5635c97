/* runtime/cuda.h: the CUDA device's own functions, private to runtime/ (and
 * to the tests and benches of the CUDA backend). The engine drives the GPU
 * only through the device operations table (fb_device_ops_for("cuda"),
 * runtime.h); its include folder does not hold this header (fb_layer,
 * test_layers). */
#ifndef FB_RUNTIME_CUDA_H
#define FB_RUNTIME_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include "runtime/runtime.h"

/* ---------------------------------------------------------------- the device
 * The GPU through the CUDA Driver API loaded at run time (cuda_drv.h): one
 * primary context per process on device 0, a queue (stream) per session,
 * tasks compiled to PTX and loaded as modules cached by IR, launched with
 * cuLaunchKernel on grid-stride kernels whose grid is sized from the
 * device's SM count, device time from events. Session memory is device
 * memory (cuMemAlloc) within the device budget; the host reaches it only
 * through copies (fb_memsys to_host/to_dev, a pinned staging buffer on the
 * session's stream). FB_CUDA_MEMORY=managed gives managed memory instead,
 * which host code reads in place once the queue is idle.
 *
 * Faults: a driver error fails the call with FB_EDEVICE and a message that
 * names it. A sticky error (the context is unusable) ends every queue of
 * that context (their calls return FB_EDEVICE from then on) and marks the
 * device unhealthy; once the last of those queues is freed the context is
 * reset and made again, and the device is healthy. */

typedef struct fb_cuda_device fb_cuda_device;
typedef struct fb_cuda_queue fb_cuda_queue;

/* Load the driver, take device 0 (FB_CUDA_DEVICE picks another) and its
 * primary context. FB_EDEVICE with a message when there is no driver, no
 * device, or the device cannot share managed memory with the host. */
int fb_cuda_device_new(fb_cuda_device **out, char *err, size_t errlen);
void fb_cuda_device_free(fb_cuda_device *d);
/* "NVIDIA H100 80GB HBM3 (sm_90, 132 SMs, 79.1 GiB, driver 12.4)" */
const char *fb_cuda_device_name(const fb_cuda_device *d);
const char *fb_cuda_device_sm(const fb_cuda_device *d); /* "sm_90" */
/* 1 when healthy; else 0 and why (may be NULL) says what failed. */
int fb_cuda_device_healthy(fb_cuda_device *d, char *why, size_t len);
/* Kernel parameters one task launch can take on the GPU (the launch's fixed
 * parameters excluded): what the optimizer's fusion cost model must respect. */
int fb_cuda_max_task_params(void);
/* Compile task t to a module of the device (cached by IR): out->gpu. The
 * signature of a compile pool's compiler (user = the device). */
int fb_cuda_compile(void *device, const fb_cg_task *t, fb_cpu_code *out, char *err, size_t errlen);

int fb_cuda_queue_new(fb_cuda_device *d, fb_cuda_queue **out, char *err, size_t errlen);
/* Waits for the queue's work, then frees it. */
void fb_cuda_queue_free(fb_cuda_queue *q);
const fb_memsys *fb_cuda_queue_memsys(fb_cuda_queue *q);
/* The device budget (FB_CUDA_BUDGET bytes, else 80% of the device's memory,
 * at most 90% of what was free at start) and the bytes sessions hold. */
typedef struct fb_cuda_memory_info {
  int managed; /* FB_CUDA_MEMORY=managed */
  uint64_t budget, used;
} fb_cuda_memory_info;
void fb_cuda_device_memory(fb_cuda_device *d, fb_cuda_memory_info *out);
/* 0 while usable; FB_EDEVICE once a sticky error ended it (message). */
int fb_cuda_queue_alive(fb_cuda_queue *q, char *err, size_t errlen);
/* A batch: begin, launch each task (queued, not waited for; a listgen
 * task first waits for the queue and sizes its list, see fb_cpu_run_sparse),
 * then finish, which waits for the batch and gives each launch's error
 * slot (one per fb_cuda_launch, in order: two words, the error, 0 = none,
 * and the blame word of codegen/rt/fb_rt.h) and the device time.
 * fb_cuda_launch returns its slot number (>= 0) or an FB_E* code: a list
 * that cannot be sized (code of fb_sparse_prepare_list), or FB_EDEVICE. */
int fb_cuda_begin(fb_cuda_queue *q, char *err, size_t errlen);
int fb_cuda_launch(fb_cuda_queue *q, const fb_rt_ctx *ctx, const fb_rt_task *t,
                   const fb_rt_hint *hint, fb_sparse *sp, char *err, size_t errlen);
int fb_cuda_finish(fb_cuda_queue *q, const int32_t **errs, int *nslots, double *seconds, char *err,
                   size_t errlen);

/* The device's operations table (runtime/cuda.c): what
 * fb_device_ops_for("cuda") returns. */
extern const fb_device_ops fb_cuda_ops;

#endif
