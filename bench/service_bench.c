/* service_bench: the service's performance figures (README "Performance"),
 * measured through libfusebox against a fuseboxd over loopback:
 *  1. launches/s of a trivial kernel (c[] = c[] + 1) through the pipelined
 *     stream API: N launches queued, one sync at the end; the counter is
 *     read back and checked;
 *  2. the sync round trip: a sync with nothing queued, median and p99;
 *  3. bulk field transfer: write then read a large f32 field, GB/s each
 *     way, with the data checked.
 * Usage: service_bench [--server ADDR | --fuseboxd PATH] [--unix] [--launches N]
 *                      [--syncs N] [--mib N] [--repeat R] [--chunk-kib K]
 *                      [--isolation both|process|thread] [--route-key on|off]
 * Without --server it starts a private fuseboxd (TCP 127.0.0.1, or a unix
 * socket with --unix) found by fb_daemon_find (the build tree's server/),
 * once per isolation mode (both by default: a worker process per session,
 * and sessions as threads of fuseboxd), and prints the figures side by side.
 * --route-key off: the session's calls carry no "fusebox-route" header
 * (fb_client_options.no_route_key), to measure what the routing key costs
 * (bench/route_cost.sh interleaves on and off runs). The server's
 * "fusebox-replica" header goes once per call (the Session stream is one
 * call), not per message, so it costs the same either way. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "fusebox/client.h"

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

typedef struct opts {
  const char *server, *fuseboxd, *isolation;
  int unix_socket, no_route_key;
  long launches, syncs, mib, repeat, chunk_kib;
} opts;

typedef struct figures {
  double rate, med, p99, wr, rd;
} figures;

static int usage(void) {
  fprintf(stderr, "usage: service_bench [--server ADDR | --fuseboxd PATH] [--unix] "
                  "[--launches N] [--syncs N] [--mib N] [--repeat R] [--chunk-kib K]\n"
                  "                     [--isolation both|process|thread] [--route-key on|off]\n");
  return 2;
}

static int parse(int argc, char **argv, opts *o) {
  *o = (opts){NULL, NULL, "both", 0, 0, 1000000, 2000, 256, 3, 0};
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (strcmp(a, "--unix") == 0) o->unix_socket = 1;
    else if (!v) return usage();
    else if (strcmp(a, "--server") == 0) o->server = v, i++;
    else if (strcmp(a, "--fuseboxd") == 0) o->fuseboxd = v, i++;
    else if (strcmp(a, "--launches") == 0) o->launches = atol(v), i++;
    else if (strcmp(a, "--syncs") == 0) o->syncs = atol(v), i++;
    else if (strcmp(a, "--mib") == 0) o->mib = atol(v), i++;
    else if (strcmp(a, "--repeat") == 0) o->repeat = atol(v), i++;
    else if (strcmp(a, "--chunk-kib") == 0) o->chunk_kib = atol(v), i++;
    else if (strcmp(a, "--isolation") == 0) o->isolation = v, i++;
    else if (strcmp(a, "--route-key") == 0 && (!strcmp(v, "on") || !strcmp(v, "off")))
      o->no_route_key = !strcmp(v, "off"), i++;
    else return usage();
  }
  if (strcmp(o->isolation, "both") && strcmp(o->isolation, "process") &&
      strcmp(o->isolation, "thread"))
    return usage();
  if (o->launches < 1 || o->syncs < 1 || o->mib < 1 || o->repeat < 1) return usage();
  return 0;
}

/* ---------------------------------------------------------------- the session */

typedef struct bench {
  fb_layout *l;
  int c, big;
  fb_remote *r;
  int kinc;
} bench;

static int build_layout(bench *b, long mib) {
  b->l = fb_layout_new();
  int64_t n = (int64_t)mib << 18; /* f32 elements */
  int d = fb_layout_add(b->l, 0, FB_SN_DENSE, "i", &n, 0, NULL);
  b->big = fb_layout_place(b->l, d, "big", FB_T_F32);
  b->c = fb_layout_place(b->l, 0, "c", FB_T_I32);
  char err[256];
  if (d < 0 || b->big < 0 || b->c < 0 || fb_layout_finalize(b->l, err, sizeof err)) return -1;
  return 0;
}

static fb_kernel *inc_kernel(const bench *b) {
  fb_kernel *k = fb_kernel_new(b->l, "inc", 0, NULL, FB_T_VOID);
  fb_builder bd;
  fb_builder_init(&bd, k);
  int v = fb_b_load(&bd, b->c, NULL, 0);
  int one = fb_b_const_i32(&bd, 1);
  fb_b_store(&bd, b->c, NULL, 0, fb_b_binary(&bd, FB_OP_ADD, v, one));
  return k;
}

static int fail(const char *what, const char *msg) {
  fprintf(stderr, "service_bench: %s: %s\n", what, msg);
  return 1;
}

/* ---------------------------------------------------------------- measurements */

static int bench_launches(bench *b, long n, int repeat, double *best) {
  *best = 0;
  int32_t zero = 0, got = 0;
  for (int r = 0; r < repeat; r++) {
    if (fb_remote_field_write(b->r, b->c, &zero, sizeof zero)) return -1;
    double t0 = now();
    for (long i = 0; i < n; i++)
      if (fb_remote_launch(b->r, b->kinc, NULL, 0) < 0) return -1;
    if (fb_remote_sync(b->r, NULL)) return -1;
    double rate = (double)n / (now() - t0);
    if (rate > *best) *best = rate;
    if (fb_remote_field_read(b->r, b->c, &got, sizeof got)) return -1;
    if (got != (int32_t)n) {
      fprintf(stderr, "service_bench: counter is %d after %ld launches\n", got, n);
      return -1;
    }
  }
  return 0;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static int bench_syncs(bench *b, long n, double *median, double *p99) {
  double *t = malloc(sizeof *t * (size_t)n);
  if (!t) return -1;
  for (int i = 0; i < 50; i++) fb_remote_sync(b->r, NULL); /* warm up */
  for (long i = 0; i < n; i++) {
    double t0 = now();
    if (fb_remote_sync(b->r, NULL)) {
      free(t);
      return -1;
    }
    t[i] = now() - t0;
  }
  qsort(t, (size_t)n, sizeof *t, cmp_double);
  *median = t[n / 2];
  *p99 = t[(size_t)((double)n * 0.99)];
  free(t);
  return 0;
}

static int bench_bulk(bench *b, long mib, int repeat, double *wr, double *rd) {
  size_t bytes = (size_t)mib << 20, n = bytes / 4;
  float *src = malloc(bytes), *dst = malloc(bytes);
  if (!src || !dst) return -1;
  for (size_t i = 0; i < n; i++) src[i] = (float)(i % 100003) * 0.5f;
  *wr = *rd = 0;
  int rc = 0;
  for (int r = 0; r < repeat && !rc; r++) {
    double t0 = now();
    rc = fb_remote_field_write(b->r, b->big, src, bytes);
    double t1 = now();
    if (!rc) rc = fb_remote_field_read(b->r, b->big, dst, bytes);
    double t2 = now();
    if (!rc && memcmp(src, dst, bytes)) {
      fprintf(stderr, "service_bench: the field read back differs\n");
      rc = -1;
    }
    if ((double)bytes / (t1 - t0) > *wr) *wr = (double)bytes / (t1 - t0);
    if ((double)bytes / (t2 - t1) > *rd) *rd = (double)bytes / (t2 - t1);
  }
  free(src);
  free(dst);
  return rc;
}

/* ---------------------------------------------------------------- main */

static int run(const opts *o, const char *addr, figures *f) {
  char err[512];
  bench b;
  memset(&b, 0, sizeof b);
  fb_client *c = NULL;
  if (build_layout(&b, o->mib)) return fail("layout", "cannot build");
  fb_client_options co = {.chunk_bytes = (size_t)o->chunk_kib << 10,
                          .no_route_key = o->no_route_key};
  if (fb_client_connect(addr, &co, &c, err, sizeof err)) return fail("connect", err);
  int rc = 1;
  fb_kernel *k = inc_kernel(&b);
  if (fb_remote_open(c, NULL, b.l, &b.r)) {
    fail("open", fb_client_errmsg(c));
    goto out;
  }
  if ((b.kinc = fb_remote_add_kernel(b.r, k)) < 0) {
    fail("kernel", fb_remote_errmsg(b.r));
    goto out;
  }
  double rate, med, p99, wr, rd;
  fprintf(stderr, "service_bench: %s: launches...\n", addr);
  if (bench_launches(&b, o->launches, (int)o->repeat, &rate)) {
    fail("launches", fb_remote_errmsg(b.r));
    goto out;
  }
  if (bench_syncs(&b, o->syncs, &med, &p99)) {
    fail("syncs", fb_remote_errmsg(b.r));
    goto out;
  }
  if (bench_bulk(&b, o->mib, (int)o->repeat, &wr, &rd)) {
    fail("bulk", fb_remote_errmsg(b.r));
    goto out;
  }
  *f = (figures){rate, med, p99, wr, rd};
  rc = 0;
out:
  if (b.r) fb_remote_close(b.r);
  fb_kernel_free(k);
  fb_client_close(c);
  fb_layout_free(b.l);
  return rc;
}

static void print_figures(const opts *o, const char *const *names, const figures *f, int n) {
  printf("%-24s", "");
  for (int i = 0; i < n; i++) printf("%16s", names[i]);
  printf("\n%-24s", "launches/s (pipelined)");
  for (int i = 0; i < n; i++) printf("%16.0f", f[i].rate);
  printf("\n%-24s", "sync round trip median");
  for (int i = 0; i < n; i++) printf("%13.1f us", f[i].med * 1e6);
  printf("\n%-24s", "sync round trip p99");
  for (int i = 0; i < n; i++) printf("%13.1f us", f[i].p99 * 1e6);
  printf("\n%-24s", "bulk write");
  for (int i = 0; i < n; i++) printf("%11.2f GB/s", f[i].wr / 1e9);
  printf("\n%-24s", "bulk read");
  for (int i = 0; i < n; i++) printf("%11.2f GB/s", f[i].rd / 1e9);
  printf("\n(%ld launches of a trivial kernel and one sync, %ld syncs, a %ld MiB field; "
         "best of %ld; routing key %s)\n",
         o->launches, o->syncs, o->mib, o->repeat, o->no_route_key ? "off" : "on");
}

/* A private fuseboxd with the given isolation, measured. */
static int run_private(const opts *o, const char *isolation, figures *f) {
  char exe[4096], err[512], sock[128];
  snprintf(sock, sizeof sock, "unix:/tmp/fusebox-bench-%d.sock", (int)getpid());
  const char *extra[] = {"--log-level", "warn", "--isolation", isolation, NULL};
  fb_daemon d;
  if (fb_daemon_start(o->fuseboxd ? o->fuseboxd : fb_daemon_find(exe, sizeof exe),
                      o->unix_socket ? sock : "127.0.0.1:0", extra, &d, err, sizeof err))
    return fail("fuseboxd", err);
  int rc = run(o, d.address, f);
  int st = 0;
  fb_daemon_stop(&d, 30, &st);
  if (st != 0) fprintf(stderr, "service_bench: fuseboxd exited with status %d\n", st);
  return rc ? rc : st != 0;
}

int main(int argc, char **argv) {
  opts o;
  if (parse(argc, argv, &o)) return 2;
  figures f[2];
  memset(f, 0, sizeof f);
  if (o.server) {
    const char *names[] = {o.server};
    int rc = run(&o, o.server, &f[0]);
    if (!rc) print_figures(&o, names, f, 1);
    return rc;
  }
  const char *both[] = {"process", "thread"}, *one[] = {o.isolation};
  const char *const *names = strcmp(o.isolation, "both") ? one : both;
  int n = strcmp(o.isolation, "both") ? 1 : 2;
  for (int i = 0; i < n; i++)
    if (run_private(&o, names[i], &f[i])) return 1;
  printf("fuseboxd on %s, by isolation mode:\n", o.unix_socket ? "a unix socket" : "127.0.0.1");
  print_figures(&o, names, f, n);
  return 0;
}
