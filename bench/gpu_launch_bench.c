/* Per-task launch overhead on the GPU: the engine against a bare
 * cuLaunchKernel loop of the same kernel, in the same run.
 *
 *   bare:   cuLaunchKernel of the task's PTX N times on one stream, then one
 *           stream synchronize (the floor: what the driver costs);
 *   async:  N launches of the kernel in an async session with every pass
 *           off (one task per launch), then fb_sync;
 *   sync:   N launches in a sync session (each one waits for its task).
 *
 * Prints microseconds per launch and async / bare (the target, docs/gpu.md:
 * within 2x). Without a GPU (no driver, or none found) it says so and exits
 * 0 having measured nothing. Usage: gpu_launch_bench [N] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fusebox/engine.h"
#include "fusebox/lang.h"
#include "runtime/cuda_drv.h"
#include "runtime/runtime.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static const char *SRC = "layout { dense(i: 256) { place x: f32 } }\n"
                         "kernel tick() { for i in x { x[i] = x[i] + 1.0 } }\n";

static int die(const char *what, const char *msg) {
  fprintf(stderr, "gpu_launch_bench: %s: %s\n", what, msg);
  return 1;
}

/* The bare loop: the task's PTX, loaded and launched straight through the
 * driver with the same parameters the engine passes. */
static int bare(const fb_kernel *task, int loop, int n, double *per) {
  char err[512];
  fb_cuda_api api;
  if (fb_cuda_api_load(&api, err, sizeof err)) return die("driver", err);
  CUdevice dev;
  CUcontext ctx;
  CUmodule mod;
  CUfunction fn;
  CUstream st;
  CUdeviceptr root, errw;
  int major = 0, minor = 0;
  if (api.Init(0) || api.DeviceGet(&dev, 0) || api.PrimaryCtxRetain(&ctx, dev) ||
      api.CtxSetCurrent(ctx) ||
      api.DeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev) ||
      api.DeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev))
    return die("bare", "driver setup failed");
  char sm[16];
  int cc = major * 10 + minor;
  snprintf(sm, sizeof sm, "sm_%d", cc > 90 ? 90 : cc);
  fb_cg_task t = {task, loop, 0, NULL};
  char *ptx = NULL;
  if (fb_ptx_emit(&t, sm, &ptx, err, sizeof err)) return die("ptx", err);
  int bad = api.ModuleLoadDataEx(&mod, ptx, 0, NULL, NULL) ||
            api.ModuleGetFunction(&fn, mod, FB_GPU_ENTRY) ||
            api.StreamCreate(&st, CU_STREAM_NON_BLOCKING) || api.MemAlloc(&root, 4096) ||
            api.MemAlloc(&errw, 8) || api.MemsetD8Async(root, 0, 4096, st) ||
            api.MemsetD8Async(errw, 0, 8, st);
  free(ptx);
  if (bad) return die("bare", "module or memory setup failed");
  uint64_t val[FB_GPU_FIXED_PARAMS] = {root, 0, 0, errw, 0, 0, 0, 0, (uint64_t)INT64_MAX};
  void *ptr[FB_GPU_FIXED_PARAMS];
  for (int i = 0; i < FB_GPU_FIXED_PARAMS; i++) ptr[i] = &val[i];
  for (int rep = 0; rep < 2; rep++) { /* the first pass warms up */
    double t0 = now_s();
    for (int i = 0; i < n; i++)
      if (api.LaunchKernel(fn, 2, 1, 1, 128, 1, 1, 0, st, ptr, NULL)) return die("bare", "launch");
    if (api.StreamSynchronize(st)) return die("bare", "synchronize");
    *per = (now_s() - t0) / n;
  }
  api.MemFree(root);
  api.MemFree(errw);
  api.StreamDestroy(st);
  api.ModuleUnload(mod);
  api.PrimaryCtxRelease(dev);
  fb_cuda_api_unload(&api);
  return 0;
}

static int engine_loop(fb_engine *e, const fb_program *p, const fb_kernel *k, const char *mode,
                       int n, double *per, const fb_kernel **task, int *loop) {
  fb_session_config sc = {.mode = mode, .passes = FB_PASSES_EXACT, .flush_every = 256};
  fb_session *s = NULL;
  char err[512];
  if (fb_session_create(e, &sc, fb_program_layout(p), &s, err, sizeof err))
    return die("session", err);
  int id = fb_session_add_kernel(s, k);
  if (id < 0) return die("kernel", fb_session_errmsg(s));
  for (int rep = 0; rep < 2; rep++) {
    double t0 = now_s();
    for (int i = 0; i < n; i++)
      if (fb_launch(s, id, NULL, 0, NULL)) return die(mode, fb_session_errmsg(s));
    if (fb_sync(s)) return die(mode, fb_session_errmsg(s));
    *per = (now_s() - t0) / n;
  }
  fb_counters c;
  fb_session_counters(s, &c);
  if (c.tasks_launched != (uint64_t)(2 * n)) return die(mode, "expected one task per launch");
  if (task) {
    const fb_kernel *const *tasks;
    int nt = 0;
    fb_session_kernel_tasks(s, id, &tasks, &nt);
    *task = fb_kernel_clone_to(tasks[0], fb_program_layout(p));
    *loop = -1;
    const fb_block *b0 = &(*task)->blocks[0];
    for (int i = 0; i < b0->n; i++) {
      int op = (*task)->stmts[b0->ids[i]].op;
      if (op == FB_OP_STRUCT_FOR || op == FB_OP_PAR_FOR) *loop = b0->ids[i];
    }
  }
  fb_session_destroy(s);
  return 0;
}

int main(int argc, char **argv) {
  int n = argc > 1 ? atoi(argv[1]) : 20000;
  if (n < 1) return die("usage", "gpu_launch_bench [N >= 1]");
  char err[512];
  fb_engine_config cfg = {"cuda", 1, 1};
  fb_engine *e = NULL;
  if (fb_engine_create(&cfg, &e, err, sizeof err)) {
    printf("gpu_launch_bench: no GPU here, nothing measured (%s)\n", err);
    return 0;
  }
  fb_program *p = NULL;
  fb_diags d;
  fb_diags_init(&d);
  fb_kernel *k = NULL;
  if (fb_program_parse("tick.fbk", SRC, &p, &d) ||
      fb_program_instantiate(p, "tick", NULL, 0, &k, &d))
    return die("program", "does not compile");
  fb_diags_free(&d);
  const fb_kernel *task = NULL;
  int loop = -1;
  double t_async = 0, t_sync = 0, t_bare = 0;
  if (engine_loop(e, p, k, "async", n, &t_async, &task, &loop) ||
      engine_loop(e, p, k, "sync", n, &t_sync, NULL, NULL) || bare(task, loop, n, &t_bare))
    return 1;
  printf("device: %s\n%d launches of one small task each\n", fb_engine_device(e), n);
  printf("  bare cuLaunchKernel loop   %8.2f us/launch\n", t_bare * 1e6);
  printf("  engine, async (no passes)  %8.2f us/launch  %.2fx bare\n", t_async * 1e6,
         t_async / t_bare);
  printf("  engine, sync               %8.2f us/launch  %.2fx bare\n", t_sync * 1e6,
         t_sync / t_bare);
  fb_kernel_free((fb_kernel *)task);
  fb_program_free(p);
  fb_engine_destroy(e);
  return 0;
}
