/* The machine's STREAM bandwidth, the yardstick for the generated code's
 * dense kernels (bench/micro/stream/): McCalpin's copy (c = a) and triad
 * (a = b + 3c) on f32 arrays of n elements, split over T threads the way
 * the CPU pool splits a parallel task (one contiguous chunk each), compiled
 * by the C compiler for this machine (Release: -O3 -march=native, as the
 * JIT targets the host CPU). Counted as STREAM counts: 8 bytes per
 * element for a copy, 12 for a triad (f32), no write-allocate traffic.
 * Each repetition does 10 passes, as one step of a stream_* session does,
 * so the ms per repetition compare directly with `fusebox bench`; so does
 * the process CPU time per repetition (all threads), printed as `cpu`,
 * with `fusebox bench`'s `cpu ms`: on a loaded machine, where the wall
 * clock is mostly the scheduler, that is the figure to compare.
 *
 *   build-rel/bench/stream_ref [n (8388608)] [threads (online CPUs)] [reps (10)]
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef struct job {
  float *a, *b, *c;
  size_t lo, hi;
  int op; /* 0 copy, 1 triad */
} job;

static void *run(void *p) {
  job *j = p;
  /* locals, restrict: the project builds with -fno-strict-aliasing, under
   * which the compiler would reload j->a... every element */
  float *restrict a = j->a, *restrict b = j->b, *restrict c = j->c;
  size_t lo = j->lo, hi = j->hi;
  for (int pass = 0; pass < 10; pass++) {
    if (j->op == 0)
      for (size_t i = lo; i < hi; i++) c[i] = a[i];
    else
      for (size_t i = lo; i < hi; i++) a[i] = b[i] + 3.0f * c[i];
    __asm__ volatile("" ::: "memory"); /* ten real passes, none merged */
  }
  return NULL;
}

static double clock_s(clockid_t id) {
  struct timespec ts;
  clock_gettime(id, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp(const void *x, const void *y) {
  double a = *(const double *)x, b = *(const double *)y;
  return a < b ? -1 : a > b;
}

int main(int argc, char **argv) {
  long n = argc > 1 ? atol(argv[1]) : 8388608;
  long nt = argc > 2 ? atol(argv[2]) : sysconf(_SC_NPROCESSORS_ONLN);
  long reps = argc > 3 ? atol(argv[3]) : 10;
  if (n < 1024 || n > (1L << 30) || nt < 1 || nt > 256 || reps < 1 || reps > 1000) {
    fprintf(stderr, "usage: stream_ref [n: 1024..2^30] [threads: 1..256] [reps: 1..1000]\n");
    return 2;
  }
  float *a = malloc((size_t)n * sizeof *a), *b = malloc((size_t)n * sizeof *b),
        *c = malloc((size_t)n * sizeof *c);
  pthread_t *th = malloc((size_t)nt * sizeof *th);
  job *jobs = malloc((size_t)nt * sizeof *jobs);
  double *t = malloc((size_t)reps * sizeof *t), *cpu = malloc((size_t)reps * sizeof *cpu);
  if (!a || !b || !c || !th || !jobs || !t || !cpu) {
    fprintf(stderr, "stream_ref: out of memory\n");
    return 1;
  }
  for (long i = 0; i < n; i++) a[i] = 1.0f, b[i] = 2.0f, c[i] = 0.0f;
  printf("stream_ref: n = %ld (%.0f MiB per array), %ld threads, %ld reps of 10 passes\n", n,
         (double)n * 4 / (1 << 20), nt, reps);
  const char *names[2] = {"copy", "triad"};
  const double bytes[2] = {8.0, 12.0};
  for (int op = 0; op < 2; op++) {
    for (long r = 0; r < reps + 1; r++) { /* the first is a warm-up */
      double t0 = clock_s(CLOCK_MONOTONIC), c0 = clock_s(CLOCK_PROCESS_CPUTIME_ID);
      for (long k = 0; k < nt; k++) {
        jobs[k] = (job){a, b, c, (size_t)(n * k / nt), (size_t)(n * (k + 1) / nt), op};
        if (pthread_create(&th[k], NULL, run, &jobs[k])) {
          fprintf(stderr, "stream_ref: cannot start a thread\n");
          return 1;
        }
      }
      for (long k = 0; k < nt; k++) pthread_join(th[k], NULL);
      if (r) {
        t[r - 1] = clock_s(CLOCK_MONOTONIC) - t0;
        cpu[r - 1] = clock_s(CLOCK_PROCESS_CPUTIME_ID) - c0;
      }
    }
    qsort(t, (size_t)reps, sizeof *t, cmp);
    qsort(cpu, (size_t)reps, sizeof *cpu, cmp);
    double gb = 10.0 * bytes[op] * (double)n / 1e9;
    printf("  %-5s  best %8.3f ms (%6.2f GB/s)  median %8.3f ms (%6.2f GB/s)  cpu median %8.3f ms\n",
           names[op], t[0] * 1e3, gb / t[0], t[reps / 2] * 1e3, gb / t[reps / 2],
           cpu[reps / 2] * 1e3);
  }
  free(a), free(b), free(c), free(th), free(jobs), free(t), free(cpu);
  return 0;
}
