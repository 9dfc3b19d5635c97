/* engine_bench: the engine core's performance figures (README "Performance").
 *  1. Memory bandwidth of a dense element-wise kernel over 2^24 f32
 *     (y[i] = a * x[i] + b through the whole engine: lowering, JIT, thread
 *     pool) against a STREAM-style copy loop in plain C using the same
 *     number of threads, measured in the same run.
 *  2. Compile time of a small kernel (JIT at -O3; a cache miss) and the cost
 *     of a code-cache hit, at the JIT and for a whole kernel registration.
 * Usage: engine_bench [--n LOG2] [--repeat R] [--threads T] */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "codegen/codegen.h"
#include "fusebox/engine.h"

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ------------------------------------------------------------ plain C STREAM copy */

typedef struct copy_job {
  const float *a;
  float *b;
  size_t lo, hi;
} copy_job;

static void *copy_worker(void *p) {
  copy_job *j = p;
  for (size_t i = j->lo; i < j->hi; i++) j->b[i] = j->a[i];
  return NULL;
}

static double stream_copy(const float *a, float *b, size_t n, int threads, int repeat) {
  pthread_t th[64];
  copy_job jobs[64];
  double best = 1e30;
  for (int r = 0; r < repeat; r++) {
    double t0 = now();
    for (int t = 0; t < threads; t++) {
      jobs[t] =
          (copy_job){a, b, n * (size_t)t / (size_t)threads, n * (size_t)(t + 1) / (size_t)threads};
      if (t) pthread_create(&th[t], NULL, copy_worker, &jobs[t]);
    }
    copy_worker(&jobs[0]);
    for (int t = 1; t < threads; t++) pthread_join(th[t], NULL);
    double dt = now() - t0;
    if (dt < best) best = dt;
  }
  return best;
}

/* ------------------------------------------------------------ kernels */

static fb_kernel *axpb_kernel(const fb_layout *l, int x, int y, int64_t n, float a, float b) {
  fb_kernel *k = fb_kernel_new(l, "axpb", 0, NULL, FB_T_VOID);
  fb_builder bd;
  fb_builder_init(&bd, k);
  int lo = fb_b_const_i32(&bd, 0), hi = fb_b_const_i32(&bd, (int32_t)n);
  int loop = fb_b_range_for(&bd, lo, hi, 1);
  int saved = fb_b_enter(&bd, k->stmts[loop].body);
  int i = fb_b_loop_index(&bd, loop, 0);
  int xv = fb_b_load(&bd, x, &i, 1);
  int av = fb_b_const_f32(&bd, a), bv = fb_b_const_f32(&bd, b);
  int m = fb_b_binary(&bd, FB_OP_MUL, av, xv);
  int s = fb_b_binary(&bd, FB_OP_ADD, m, bv);
  fb_b_store(&bd, y, &i, 1, s);
  fb_b_leave(&bd, saved);
  return k;
}

static int usage(const char *argv0) {
  fprintf(stderr,
          "usage: %s [--n LOG2] [--repeat R] [--threads T]\n"
          "  Measures a dense element-wise kernel's bandwidth against a plain C copy\n"
          "  loop, and JIT compile and cache-hit times. Defaults: --n 24 --repeat 20.\n"
          "example: %s --n 22 --repeat 10\n",
          argv0, argv0);
  return 2;
}

int main(int argc, char **argv) {
  int log2n = 24, repeat = 20, threads = 0;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--n") && i + 1 < argc) log2n = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--repeat") && i + 1 < argc) repeat = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
    else return usage(argv[0]);
  }
  if (log2n < 10 || log2n > 30 || repeat < 1) return usage(argv[0]);
  if (threads <= 0) threads = (int)sysconf(_SC_NPROCESSORS_ONLN);
  if (threads > 64) threads = 64;
  int64_t n = (int64_t)1 << log2n;

  fb_layout *l = fb_layout_new();
  int dx = fb_layout_add(l, 0, FB_SN_DENSE, "i", &n, 0, NULL);
  int x = fb_layout_place(l, dx, "x", FB_T_F32);
  int dy = fb_layout_add(l, 0, FB_SN_DENSE, "i", &n, 0, NULL);
  int y = fb_layout_place(l, dy, "y", FB_T_F32);
  char err[512] = "";
  if (fb_layout_finalize(l, err, sizeof err)) {
    fprintf(stderr, "layout: %s\n", err);
    return 1;
  }

  fb_engine_config ec = {.backend = "cpu", .cpu_threads = threads};
  fb_engine *e;
  if (fb_engine_create(&ec, &e, err, sizeof err)) {
    fprintf(stderr, "engine: %s\n", err);
    return 1;
  }
  fb_session_config sc = {.mode = "sync", .seed = 1};
  fb_session *s;
  if (fb_session_create(e, &sc, l, &s, NULL, 0)) {
    fprintf(stderr, "session failed\n");
    return 1;
  }

  /* 1. bandwidth */
  float *host = malloc(sizeof(float) * (size_t)n), *host2 = malloc(sizeof(float) * (size_t)n);
  for (int64_t i = 0; i < n; i++) host[i] = (float)(i % 1000);
  memset(host2, 0, sizeof(float) * (size_t)n);
  fb_field_write(s, x, host, sizeof(float) * (size_t)n);
  fb_kernel *k = axpb_kernel(l, x, y, n, 2.0f, 1.0f);
  int kid = fb_session_add_kernel(s, k);
  if (kid < 0) {
    fprintf(stderr, "add_kernel: %s\n", fb_session_errmsg(s));
    return 1;
  }
  fb_launch(s, kid, NULL, 0, NULL); /* warm up: page in y */
  double best = 1e30;
  for (int r = 0; r < repeat; r++) {
    double t0 = now();
    if (fb_launch(s, kid, NULL, 0, NULL)) {
      fprintf(stderr, "launch: %s\n", fb_session_errmsg(s));
      return 1;
    }
    double dt = now() - t0;
    if (dt < best) best = dt;
  }
  fb_cell_read(s, y, (int64_t[]){999}, 1, &(fb_value){0});
  double bytes = 2.0 * 4.0 * (double)n;
  stream_copy(host, host2, (size_t)n, threads, 1); /* page in */
  double c_best = stream_copy(host, host2, (size_t)n, threads, repeat);
  double c1_best = stream_copy(host, host2, (size_t)n, 1, repeat);
  printf("dense element-wise kernel y[i] = 2*x[i] + 1 over 2^%d f32, %d threads, best of %d\n",
         log2n, threads, repeat);
  printf("  fusebox kernel      %8.3f ms  %7.2f GB/s\n", best * 1e3, bytes / best / 1e9);
  printf("  C copy, %d threads   %8.3f ms  %7.2f GB/s\n", threads, c_best * 1e3,
         bytes / c_best / 1e9);
  printf("  C copy, 1 thread    %8.3f ms  %7.2f GB/s\n", c1_best * 1e3, bytes / c1_best / 1e9);
  printf("  kernel / C copy (same threads): %.0f%%\n", 100.0 * c_best / best);

  /* 2. compile time: distinct small kernels are cache misses */
  fb_counters c0, c1;
  fb_session_counters(s, &c0);
  int nk = 10;
  double t0 = now();
  for (int i = 0; i < nk; i++) {
    fb_kernel *ki = axpb_kernel(l, x, y, n, 3.0f + (float)i, 1.0f);
    if (fb_session_add_kernel(s, ki) < 0) {
      fprintf(stderr, "%s\n", fb_session_errmsg(s));
      return 1;
    }
    fb_kernel_free(ki);
  }
  double reg_miss = (now() - t0) / nk;
  fb_session_counters(s, &c1);
  double per_compile =
      (c1.compile_s - c0.compile_s) / (double)(c1.tasks_compiled - c0.tasks_compiled);
  /* cache hits: the same kernel registered again */
  t0 = now();
  int nh = 1000;
  for (int i = 0; i < nh; i++) fb_session_add_kernel(s, k);
  double reg_hit = (now() - t0) / nh;
  fb_cpu_jit *jit = fb_cpu_jit_new(err, sizeof err);
  fb_cg_task t = {k, -1, 0, NULL};
  for (int i = 0; i < k->blocks[0].n; i++)
    if (k->stmts[k->blocks[0].ids[i]].op == FB_OP_PAR_FOR) t.loop = k->blocks[0].ids[i];
  fb_cpu_code code;
  fb_cpu_jit_compile(jit, &t, &code, err, sizeof err);
  t0 = now();
  for (int i = 0; i < nh; i++) fb_cpu_jit_compile(jit, &t, &code, err, sizeof err);
  double jit_hit = (now() - t0) / nh;
  printf("compilation of a small kernel (one task, -O3)\n");
  printf("  JIT compile (cache miss)        %8.2f ms per task\n", per_compile * 1e3);
  printf("  kernel registration, miss       %8.2f ms (verify + lower + compile)\n", reg_miss * 1e3);
  printf("  code cache hit at the JIT       %8.2f us\n", jit_hit * 1e6);
  printf("  kernel registration, cache hit  %8.2f us (verify + lower + hit)\n", reg_hit * 1e6);
  fb_cpu_jit_free(jit);
  fb_kernel_free(k);
  free(host);
  free(host2);
  fb_session_destroy(s);
  fb_engine_destroy(e);
  fb_layout_free(l);
  return 0;
}
