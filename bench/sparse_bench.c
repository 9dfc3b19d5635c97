/* sparse_bench: performance figures of sparse SNodes (docs/sparse.md, README
 * "Performance"), through the whole engine (lowering, list tasks, JIT,
 * thread pool):
 *  1. Struct-for throughput. y = 2 x + 1 over every active cell of a 2-D
 *     grid of 2^(2G) cells stored as pointer(ij: B, B) > dense(ij: 16, 16)
 *     with one block in four active, against the same kernel over the same
 *     grid stored densely (dense(ij: B, B) > dense(ij: 16, 16)), and over a
 *     dense grid with as many cells as are active (dense(ij: B/2, B/2) >
 *     dense(ij: 16, 16): the same working set), and over a flat dense grid
 *     of that many cells (dense(ij: 8B, 8B)). The sparse launch includes its
 *     list tasks. Reported: cells per second of each and the ratio to the
 *     fastest dense one (target: sparse >= 60% of dense).
 *  2. List generation. pointer(ij: 64, 64) > bitmasked(ij: 16, 16) with all
 *     2^20 cells active; a kernel whose only loop is an empty struct-for over
 *     the cells launches clear_list + listgen for both levels and the (empty)
 *     loop. Reported: time per launch (target: <= 5 ms).
 *  3. Host transfers. A whole-field fb_field_write and fb_field_read of an
 *     f32 field of 128^3 cells under pointer(ijk: 1, 1, 1) > pointer(ijk:
 *     4, 4, 4) > dense(ijk: 32, 32, 32) (MacCormack's tree; the write
 *     activates every block, the first time), and of one under
 *     pointer > pointer > dense where one block in eight is active (a
 *     read), and of one under pointer > pointer > bitmasked(ijk: 32, 32,
 *     32) (every cell activated by the first write), against the same
 *     field stored densely. Reported: cells per
 *     second of each (what a client's ReadField and WriteField of a sparse
 *     field cost on the server, outside any kernel).
 * Each figure is the best of R launches (transfers) after a warm-up.
 * Usage: sparse_bench [--grid LOG2] [--repeat R] [--threads T] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "fusebox/engine.h"
#include "fusebox/lang.h"

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int die(const char *what, const char *msg) {
  fprintf(stderr, "sparse_bench: %s: %s\n", what, msg);
  return 1;
}

typedef struct bench {
  fb_program *p;
  fb_session *s;
} bench;

static int open_bench(fb_engine *e, const char *src, bench *b) {
  fb_diags d;
  fb_diags_init(&d);
  if (fb_program_parse("bench.fbk", src, &b->p, &d)) {
    char *r = fb_diags_render("bench.fbk", src, &d);
    fprintf(stderr, "%s", r ? r : "parse error\n");
    free(r);
    return -1;
  }
  fb_diags_free(&d);
  fb_session_config sc = {.mode = "sync", .seed = 1};
  char err[512];
  if (fb_session_create(e, &sc, fb_program_layout(b->p), &b->s, err, sizeof err))
    return die("session", err), -1;
  return 0;
}

static void close_bench(bench *b) {
  fb_session_destroy(b->s);
  fb_program_free(b->p);
}

static int kernel(bench *b, const char *name) {
  fb_kernel *k = NULL;
  if (fb_program_instantiate(b->p, name, NULL, 0, &k, NULL)) return die(name, "no such kernel"), -1;
  int id = fb_session_add_kernel(b->s, k);
  if (id < 0) die(name, fb_session_errmsg(b->s));
  return id;
}

/* Best wall time of one launch over `repeat` launches (after one warm-up). */
static double best_launch(bench *b, int k, int repeat) {
  if (fb_launch(b->s, k, NULL, 0, NULL)) return die("launch", fb_session_errmsg(b->s)), -1;
  double best = 1e30;
  for (int r = 0; r < repeat; r++) {
    double t0 = now();
    if (fb_launch(b->s, k, NULL, 0, NULL)) return die("launch", fb_session_errmsg(b->s)), -1;
    double dt = now() - t0;
    if (dt < best) best = dt;
  }
  return best;
}

/* ------------------------------------------------------------ 1. struct-for */

static const char *const grid_fmt =
    "layout { %s(ij: %d, %d) as blocks { dense(ij: 16, 16) { place x: f32, y: f32 } } }\n"
    "kernel seed() {\n"
    "  for I in 0 .. %d { for J in 0 .. %d {\n"
    "    if %s { for a in 0 .. 16 { for c in 0 .. 16 { x[I * 16 + a, J * 16 + c] = f32(a + c) } } "
    "}\n"
    "  } }\n"
    "}\n"
    "kernel axpb() { for i, j in x { y[i, j] = 2.0 * x[i, j] + 1.0 } }\n";

/* Cells per second of axpb over the grid; *cells gets the active cells. */
static double grid_rate(fb_engine *e, const char *kind, int blocks, const char *which, int repeat,
                        double *cells) {
  char src[2048];
  snprintf(src, sizeof src, grid_fmt, kind, blocks, blocks, blocks, blocks, which);
  bench b;
  if (open_bench(e, src, &b)) return -1;
  int seed = kernel(&b, "seed"), axpb = kernel(&b, "axpb");
  double t = -1;
  if (seed >= 0 && axpb >= 0 && fb_launch(b.s, seed, NULL, 0, NULL) == 0)
    t = best_launch(&b, axpb, repeat);
  int active = 0;
  for (int I = 0; I < blocks; I++)
    for (int J = 0; J < blocks; J++) active += !strcmp(which, "true") || (I % 2 == 0 && J % 2 == 0);
  *cells = (double)active * 256;
  close_bench(&b);
  return t > 0 ? *cells / t : -1;
}

static const char *const flat_fmt =
    "layout { dense(ij: %d, %d) { place x: f32, y: f32 } }\n"
    "kernel seed() { for i in 0 .. %d { for j in 0 .. %d { x[i, j] = f32(i %% 16 + j %% 16) } } }\n"
    "kernel axpb() { for i, j in x { y[i, j] = 2.0 * x[i, j] + 1.0 } }\n";

static double flat_rate(fb_engine *e, int n, int repeat) {
  char src[1024];
  snprintf(src, sizeof src, flat_fmt, n, n, n, n);
  bench b;
  if (open_bench(e, src, &b)) return -1;
  int seed = kernel(&b, "seed"), axpb = kernel(&b, "axpb");
  double t = -1;
  if (seed >= 0 && axpb >= 0 && fb_launch(b.s, seed, NULL, 0, NULL) == 0)
    t = best_launch(&b, axpb, repeat);
  close_bench(&b);
  return t > 0 ? (double)n * n / t : -1;
}

/* ------------------------------------------------------------ 2. list generation */

static const char *const lg_src =
    "layout { pointer(ij: 64, 64) as blocks { bitmasked(ij: 16, 16) as bits { place v: f32 } } }\n"
    "kernel fill() { for i in 0 .. 1024 { for j in 0 .. 1024 { v[i, j] = 1.0 } } }\n"
    "kernel lists() { for i, j in v { } }\n";

/* ------------------------------------------------------------ 3. host transfers */

static const char *const io_fmt =
    "layout { %s(ijk: 1, 1, 1) { %s(ijk: 4, 4, 4) { %s(ijk: 32, 32, 32) { place q: f32 } } } }\n"
    "kernel seed() { for i in 0 .. 128 { for j in 0 .. 128 { for k in 0 .. 128 {\n"
    "  if (i // 32 + j // 32 + k // 32) %% 2 == 0 && i // 32 %% 2 == 0 { q[i, j, k] = 1.0 } } } } }\n";

/* Seconds of whole-field transfers of q in one session: *first the first
 * write (which activates every block of a sparse tree), then the best of
 * R writes and the best of R reads after it; with seed, the session only
 * runs seed (one block in eight active) and *first is the first read. */
static int io_times(fb_engine *e, const char *kind, const char *leaf, int seed, int repeat,
                    float *host, double *first, double *wbest, double *rbest) {
  char src[1024];
  snprintf(src, sizeof src, io_fmt, kind, kind, leaf);
  bench b;
  if (open_bench(e, src, &b)) return -1;
  int q = fb_layout_find(fb_program_layout(b.p), "q");
  size_t bytes = sizeof(float) * 128 * 128 * 128;
  int k = seed ? kernel(&b, "seed") : 0;
  if (k < 0 || (seed && fb_launch(b.s, k, NULL, 0, NULL)) || fb_sync(b.s))
    return die("host transfers", fb_session_errmsg(b.s)), -1;
  *wbest = *rbest = 1e30;
  for (int r = 0; r <= repeat; r++) {
    for (int w = seed ? 0 : 1; w >= 0; w--) {
      double t0 = now();
      int rc = w ? fb_field_write(b.s, q, host, bytes) : fb_field_read(b.s, q, host, bytes);
      double dt = now() - t0;
      if (rc) return die("host transfers", fb_session_errmsg(b.s)), -1;
      if (r == 0 && w == !seed) *first = dt;
      else if (w && dt < *wbest) *wbest = dt;
      else if (!w && dt < *rbest) *rbest = dt;
    }
  }
  close_bench(&b);
  return 0;
}

static int host_transfers(fb_engine *e, int repeat) {
  size_t n = (size_t)128 * 128 * 128;
  float *host = malloc(sizeof(float) * n);
  if (!host) return die("host transfers", "out of memory");
  for (size_t i = 0; i < n; i++) host[i] = (float)(i % 1000);
  double f[4], w[4], r[4];
  if (io_times(e, "dense", "dense", 0, repeat, host, &f[0], &w[0], &r[0]) ||
      io_times(e, "pointer", "dense", 0, repeat, host, &f[1], &w[1], &r[1]) ||
      io_times(e, "pointer", "dense", 1, repeat, host, &f[2], &w[2], &r[2]) ||
      io_times(e, "pointer", "bitmasked", 0, repeat, host, &f[3], &w[3], &r[3]))
    return free(host), 1;
  double m = (double)n / 1e6;
  printf("host transfers, whole field, f32 128^3 (%zu cells), Mcells/s:\n", n);
  printf("  dense(ijk: 128, 128, 128) as ...:      write %7.1f, read %7.1f\n", m / w[0],
         m / r[0]);
  printf("  pointer > pointer > dense, all active: write %7.1f (first, activating: %.1f), read "
         "%7.1f\n",
         m / w[1], m / f[1], m / r[1]);
  printf("  pointer > pointer > dense, 1/8 active: read %7.1f (first %.1f)\n", m / r[2],
         m / f[2]);
  printf("  pointer > pointer > bitmasked, all active: write %7.1f (first, activating: %.1f), "
         "read %7.1f\n",
         m / w[3], m / f[3], m / r[3]);
  free(host);
  return 0;
}

int main(int argc, char **argv) {
  int g = 12, repeat = 10, threads = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "--grid")) g = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--repeat")) repeat = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--threads")) threads = atoi(argv[i + 1]);
    else return die("usage", "sparse_bench [--grid LOG2] [--repeat R] [--threads T]");
  }
  if (g < 6 || g > 14 || repeat < 1 || threads < 0)
    return die("usage", "--grid 6..14, --repeat >= 1, --threads >= 0");
  fb_engine_config cfg = {"cpu", 0, threads};
  fb_engine *e = NULL;
  char err[512];
  if (fb_engine_create(&cfg, &e, err, sizeof err)) return die("engine", err);
  int blocks = (1 << g) / 16;
  double dc, qc, sc;
  double dense = grid_rate(e, "dense", blocks, "true", repeat, &dc);
  double quarter = grid_rate(e, "dense", blocks / 2, "true", repeat, &qc);
  double flat = flat_rate(e, blocks * 8, repeat);
  double sparse = grid_rate(e, "pointer", blocks, "I % 2 == 0 && J % 2 == 0", repeat, &sc);
  if (dense <= 0 || quarter <= 0 || flat <= 0 || sparse <= 0) return 1;
  double ref = dense > quarter ? dense : quarter;
  if (flat > ref) ref = flat;
  printf("struct-for y = 2x + 1 over 16x16 blocks of f32 (x, y), %d threads:\n",
         threads ? threads : (int)sysconf(_SC_NPROCESSORS_ONLN));
  printf("  dense %3dx%-3d blocks:          %8.0f Mcells/s (%.0f cells)\n", blocks, blocks,
         dense / 1e6, dc);
  printf("  dense %3dx%-3d blocks:          %8.0f Mcells/s (%.0f cells)\n", blocks / 2, blocks / 2,
         quarter / 1e6, qc);
  printf("  flat dense %4dx%-4d cells:     %8.0f Mcells/s (%.0f cells)\n", blocks * 8, blocks * 8,
         flat / 1e6, (double)blocks * 8 * blocks * 8);
  printf("  pointer %3dx%-3d, 1/4 occupied: %8.0f Mcells/s (%.0f active cells, list tasks "
         "included)\n",
         blocks, blocks, sparse / 1e6, sc);
  printf("  sparse per active cell / the fastest dense: %.0f%% (target >= 60%%)\n",
         100.0 * sparse / ref);
  bench b;
  if (open_bench(e, lg_src, &b)) return 1;
  int fill = kernel(&b, "fill"), lists = kernel(&b, "lists");
  if (fill < 0 || lists < 0 || fb_launch(b.s, fill, NULL, 0, NULL))
    return die("list generation", fb_session_errmsg(b.s));
  double t = best_launch(&b, lists, repeat);
  if (t < 0) return 1;
  printf("list generation, pointer(64x64) > bitmasked(16x16), 2^20 active cells:\n");
  printf("  clear_list + listgen per level and an empty struct-for: %.2f ms per launch "
         "(target <= 5 ms)\n",
         t * 1e3);
  close_bench(&b);
  if (host_transfers(e, repeat)) return 1;
  fb_engine_destroy(e);
  return 0;
}
