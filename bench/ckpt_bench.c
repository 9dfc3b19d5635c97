/* Checkpoint and restore throughput (docs/checkpoint.md; bench/RESULTS.md
 * "Checkpoint and restore"): a sync session with one dense f32 field of
 * --mib MiB (default 1024) filled with data, checkpointed sealed into a
 * file under --dir (default /tmp), then verified and restored from it into
 * a fresh session, --repeat times (default 3), the two interleaved.
 * Reports the median of each as GB/s of session state (the field's bytes
 * over the time): checkpoint (stream, seal, write; the fsync after it
 * timed apart), verify (the seal: its HMAC over all but the bulk parts,
 * their SHA-256 against the manifest; one pass over the file), restore (read,
 * SHA-256 per part, into the new session) and verify + restore, the time a
 * resume takes, with the CPU time of each (all threads), which does not
 * depend on what else the machine runs; and a resume in one pass
 * (fb_seal_check_fd, the MAC over all but the fields, then
 * fb_session_restore_sealed, which checks the fields against the
 * manifest as it reads them), what the CLI and fuseboxd now do. Each
 * restored field is compared with the original.
 *   ckpt_bench [--mib N] [--repeat R] [--dir D] */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "fusebox/engine.h"

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* CPU time of the whole process (every thread): what a phase costs
 * whatever else the machine runs. */
static double cpu(void) {
  struct timespec t;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int cmp_d(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_d);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static int fd_sink(void *user, const void *buf, size_t n) {
  int fd = *(int *)user;
  const char *p = buf;
  while (n) {
    ssize_t w = write(fd, p, n);
    if (w <= 0) return 1;
    p += w;
    n -= (size_t)w;
  }
  return 0;
}

typedef struct src {
  int fd;
  uint64_t left;
} src;

static long fd_src(void *user, void *buf, size_t n) {
  src *s = user;
  if (n > s->left) n = (size_t)s->left;
  if (!n) return 0;
  ssize_t r = read(s->fd, buf, n);
  if (r > 0) s->left -= (uint64_t)r;
  return r;
}

static void die(const char *what, const char *msg) {
  fprintf(stderr, "ckpt_bench: %s: %s\n", what, msg);
  exit(1);
}

int main(int argc, char **argv) {
  uint64_t mib = 1024;
  int repeat = 3;
  const char *dir = "/tmp";
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--mib") && i + 1 < argc) mib = strtoull(argv[++i], NULL, 10);
    else if (!strcmp(argv[i], "--repeat") && i + 1 < argc) repeat = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--dir") && i + 1 < argc) dir = argv[++i];
    else {
      fprintf(stderr, "usage: ckpt_bench [--mib N] [--repeat R] [--dir D]\n");
      return 2;
    }
  }
  if (!mib || repeat < 1 || repeat > 64) die("arguments", "--mib >= 1, --repeat 1 .. 64");
  char err[1024];
  fb_engine *e = NULL;
  if (fb_engine_create(NULL, &e, err, sizeof err)) die("engine", err);
  fb_layout *l = fb_layout_new();
  int64_t n = (int64_t)(mib << 20) / 4;
  int d = fb_layout_add(l, 0, FB_SN_DENSE, "i", &n, 0, NULL);
  int a = fb_layout_place(l, d, "a", FB_T_F32);
  if (d < 0 || a < 0 || fb_layout_finalize(l, err, sizeof err)) die("layout", err);
  fb_session *s = NULL;
  if (fb_session_create(e, NULL, l, &s, err, sizeof err)) die("session", err);
  size_t bytes = (size_t)n * 4;
  float *v = malloc(bytes), *back = malloc(bytes);
  if (!v || !back) die("memory", "out of memory");
  for (int64_t i = 0; i < n; i++) v[i] = (float)(i % 1000003) * 0.25f;
  if (fb_field_write(s, a, v, bytes)) die("write", fb_session_errmsg(s));
  uint8_t key[32];
  memset(key, 7, sizeof key);
  char path[4096];
  snprintf(path, sizeof path, "%s/ckpt_bench.%d.fbck", dir, (int)getpid());
  double ck[64], sy[64], ve[64], re[64], vr[64], cck[64], cve[64], cre[64], rs[64], crs[64];
  for (int r = 0; r < repeat; r++) {
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd < 0) die(path, "cannot create");
    double c0 = cpu(), t0 = now();
    fb_seal *seal = fb_seal_begin(key, sizeof key, "", fd_sink, &fd);
    if (fb_session_checkpoint(s, fb_seal_write, seal, err, sizeof err)) die("checkpoint", err);
    if (fb_seal_finish(seal, err, sizeof err)) die("seal", err);
    double t1 = now(), c1 = cpu();
    fsync(fd);
    double t2 = now();
    close(fd);
    fd = open(path, O_RDONLY);
    uint64_t plen = 0;
    double c3 = cpu(), t3 = now();
    if (fb_seal_verify_fd(fd, key, sizeof key, "", &plen, err, sizeof err)) die("verify", err);
    double t4 = now(), c4 = cpu();
    lseek(fd, 0, SEEK_SET);
    src sr = {fd, plen};
    fb_session *b = NULL;
    if (fb_session_restore(e, NULL, fd_src, &sr, &b, err, sizeof err)) die("restore", err);
    double t5 = now(), c5 = cpu();
    close(fd);
    if (fb_field_read(b, a, back, bytes)) die("read", fb_session_errmsg(b));
    if (memcmp(v, back, bytes)) die("restore", "the restored field differs");
    fb_session_destroy(b);
    /* a resume in one pass: the seal's MAC over all but the fields, then
       the restore checking the fields against the manifest as it reads */
    memset(back, 0, bytes);
    fd = open(path, O_RDONLY);
    double c6 = cpu(), t6 = now();
    if (fb_seal_check_fd(fd, key, sizeof key, "", &plen, err, sizeof err)) die("check", err);
    src s2 = {fd, plen};
    if (fb_session_restore_sealed(e, NULL, fd_src, &s2, &b, err, sizeof err)) die("resume", err);
    double t7 = now(), c7 = cpu();
    close(fd);
    if (fb_field_read(b, a, back, bytes)) die("read", fb_session_errmsg(b));
    if (memcmp(v, back, bytes)) die("resume", "the resumed field differs");
    fb_session_destroy(b);
    rs[r] = t7 - t6;
    crs[r] = c7 - c6;
    ck[r] = t1 - t0;
    sy[r] = t2 - t1;
    ve[r] = t4 - t3;
    re[r] = t5 - t4;
    vr[r] = t5 - t3;
    cck[r] = c1 - c0;
    cve[r] = c4 - c3;
    cre[r] = c5 - c4;
  }
  unlink(path);
  double gb = (double)bytes / 1e9;
  printf("state %.3f GB (%llu MiB dense f32), %d runs, medians, %s\n", gb,
         (unsigned long long)mib, repeat, fb_engine_device(e));
  double mck = median(ck, repeat), mve = median(ve, repeat), mre = median(re, repeat);
  double mvr = median(vr, repeat), cc = median(cck, repeat), cv = median(cve, repeat);
  double cr = median(cre, repeat);
  printf("phase                              wall s   GB/s   CPU s (all threads)\n");
  printf("checkpoint (sealed, to the file)  %7.3f %6.2f %7.3f   (fsync after it: %.3f s)\n", mck,
         gb / mck, cc, median(sy, repeat));
  printf("verify (the seal, one pass)        %7.3f %6.2f %7.3f\n", mve, gb / mve, cv);
  printf("restore (read, SHA-256, new session) %4.3f %6.2f %7.3f\n", mre, gb / mre, cr);
  printf("verify + restore (a resume)       %7.3f %6.2f %7.3f\n", mvr, gb / mvr, cv + cr);
  double mrs = median(rs, repeat);
  printf("resume in one pass (seal check, sealed restore) %4.3f %6.2f %7.3f\n", mrs, gb / mrs,
         median(crs, repeat));
  double la[3];
  if (getloadavg(la, 3) == 3) printf("load average now: %.2f (%ld cores online)\n", la[0],
                                     sysconf(_SC_NPROCESSORS_ONLN));
  free(v);
  free(back);
  fb_session_destroy(s);
  fb_layout_free(l);
  fb_engine_destroy(e);
  return 0;
}
