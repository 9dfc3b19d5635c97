/* Steering the fake CUDA driver (libfakecuda.so, fake_cuda.c) from tests:
 * failure injection and counters. Tests load the library the way the engine
 * does (FB_CUDA_LIBRARY + dlopen) and resolve these by name, or link it.
 *
 * Every function here takes the driver's lock, so tests may call them while
 * engine threads are inside the driver. */
#ifndef FB_FAKE_CUDA_H
#define FB_FAKE_CUDA_H

typedef struct fakecuda_stats {
  long launches;         /* successful cuLaunchKernel calls */
  long modules_loaded;   /* successful cuModuleLoadDataEx calls */
  long modules_unloaded; /* cuModuleUnload calls that freed a module */
  long streams_created;
  long streams_destroyed;
  long events_created;
  long syncs;                      /* successful cuStreamSynchronize calls */
  long ctx_resets;                 /* cuDevicePrimaryCtxReset_v2 calls */
  unsigned long long bytes_in_use; /* live cuMemAlloc + cuMemAllocManaged bytes */
  unsigned long long device_bytes;  /* live cuMemAlloc bytes (closed to the host) */
  unsigned long long managed_bytes; /* live cuMemAllocManaged bytes */
  unsigned long long pinned_bytes;  /* live cuMemHostAlloc bytes */
  unsigned long long htod_bytes, dtoh_bytes; /* bytes copied each way so far */
  unsigned last_grid;              /* blocks (gx*gy*gz) of the last successful launch */
  unsigned last_block;             /* threads per block (bx*by*bz) of that launch */
} fakecuda_stats;

/* Forget everything, as if the process had restarted the driver: every
 * allocation, module, stream and event is freed, counters and pending
 * failures are cleared, cuInit must be called again (which rereads the
 * FAKECUDA_* environment) and the primary context's refcount is 0. */
void fakecuda_reset(void);
/* The nth cuLaunchKernel from now (1 = the next) that passes argument
 * validation returns code instead of launching. A sticky code (700, 702,
 * 714-719, 214) also breaks the context: later calls return it until
 * cuDevicePrimaryCtxReset_v2. nth <= 0 cancels a pending injection. */
void fakecuda_fail_launch(long nth, int code);
/* The nth cuMemAlloc_v2/cuMemAllocManaged from now (1 = the next) fails with
 * CUDA_ERROR_OUT_OF_MEMORY. nth <= 0 cancels. */
void fakecuda_fail_alloc(long nth);
void fakecuda_get_stats(fakecuda_stats *out);

#endif
