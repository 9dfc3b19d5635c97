/* The CPU device's thread pool: every index of [0, n) visited exactly once
 * for many n, chunks well formed, reuse over many small launches, several
 * threads launching on one pool at once, nested loops, and the launcher
 * (serial and parallel tasks, error propagation). */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "runtime/cpu.h"
#include "support.h"

typedef struct visit {
  atomic_uchar *seen;
  int64_t n;
  atomic_int bad_chunk; /* a chunk outside [0, n) or empty */
  atomic_llong calls;
} visit;

static void mark(void *arg, int64_t lo, int64_t hi) {
  visit *v = arg;
  if (lo < 0 || hi > v->n || lo >= hi) atomic_store(&v->bad_chunk, 1);
  for (int64_t i = lo; i < hi && i >= 0 && i < v->n; i++) atomic_fetch_add(&v->seen[i], 1);
  atomic_fetch_add(&v->calls, 1);
}

/* Run one loop of n and check each index came exactly once. */
static void check_cover(fb_pool *p, int64_t n) {
  visit v;
  v.n = n;
  v.seen = calloc((size_t)(n ? n : 1), sizeof *v.seen);
  ck_assert_ptr_nonnull(v.seen);
  atomic_init(&v.bad_chunk, 0);
  atomic_init(&v.calls, 0);
  fb_pool_for(p, n, mark, &v);
  ck_assert_int_eq(atomic_load(&v.bad_chunk), 0);
  for (int64_t i = 0; i < n; i++)
    ck_assert_msg(v.seen[i] == 1, "n=%lld: index %lld visited %d times", (long long)n, (long long)i,
                  (int)v.seen[i]);
  if (n == 0) ck_assert_int_eq(atomic_load(&v.calls), 0);
  free(v.seen);
}

static const int64_t sizes[] = {0,    1,    2,    3,    7,    13,    97,     1021,
                                1023, 1024, 1025, 2047, 4099, 65537, 131071, 1000000};

START_TEST(cover_default_chunks) {
  fb_pool *p;
  char err[256];
  ck_assert_int_eq(fb_pool_new(4, 0, &p, err, sizeof err), 0);
  ck_assert_int_eq(fb_pool_threads(p), 4);
  for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) check_cover(p, sizes[i]);
  fb_pool_free(p);
}
END_TEST

/* fb_pool_for_slots: every index once, each thread one slot for all its
 * chunks (a chunk's slot is the same as its thread's), slots below
 * maxslots, the count returned covers every slot seen. */
typedef struct slot_visit {
  atomic_uchar *seen;
  int64_t n;
  int maxslots;
  atomic_int bad;              /* bad chunk or slot */
  atomic_ullong owner[8];      /* per slot: thread id + 1 that used it */
} slot_visit;

static void mark_slot(void *arg, int slot, int64_t lo, int64_t hi) {
  slot_visit *v = arg;
  if (lo < 0 || hi > v->n || lo >= hi || slot < 0 || slot >= v->maxslots || slot >= 8) {
    atomic_store(&v->bad, 1);
    return;
  }
  unsigned long long me = (unsigned long long)pthread_self() + 1, none = 0;
  if (!atomic_compare_exchange_strong(&v->owner[slot], &none, me) && none != me)
    atomic_store(&v->bad, 2); /* two threads on one slot */
  for (int64_t i = lo; i < hi; i++) atomic_fetch_add(&v->seen[i], 1);
}

START_TEST(slots_per_thread) {
  fb_pool *p;
  char err[256];
  ck_assert_int_eq(fb_pool_new(4, 1, &p, err, sizeof err), 0);
  const int64_t ns[] = {0, 1, 5, 100, 4099, 100000};
  for (int maxslots = 1; maxslots <= 5; maxslots++)
    for (size_t k = 0; k < sizeof ns / sizeof *ns; k++) {
      slot_visit v;
      memset(&v, 0, sizeof v);
      v.n = ns[k];
      v.maxslots = maxslots;
      v.seen = calloc((size_t)(v.n ? v.n : 1), sizeof *v.seen);
      ck_assert_ptr_nonnull(v.seen);
      int used = fb_pool_for_slots(p, v.n, 0, maxslots, mark_slot, &v);
      ck_assert_int_eq(atomic_load(&v.bad), 0);
      ck_assert_int_le(used, maxslots < 4 ? maxslots : 4);
      for (int s = used; s < 8; s++) ck_assert_uint_eq(atomic_load(&v.owner[s]), 0);
      if (v.n > 0) ck_assert_int_ge(used, 1);
      for (int64_t i = 0; i < v.n; i++)
        ck_assert_msg(v.seen[i] == 1, "n=%lld maxslots=%d: index %lld visited %d times",
                      (long long)v.n, maxslots, (long long)i, (int)v.seen[i]);
      free(v.seen);
    }
  fb_pool_free(p);
}
END_TEST

START_TEST(cover_small_chunks) {
  fb_pool *p;
  char err[256];
  ck_assert_int_eq(fb_pool_new(3, 1, &p, err, sizeof err), 0);
  for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) check_cover(p, sizes[i]);
  fb_pool_free(p);
}
END_TEST

START_TEST(cover_one_thread_and_default) {
  fb_pool *p;
  char err[256];
  ck_assert_int_eq(fb_pool_new(1, 1, &p, err, sizeof err), 0);
  check_cover(p, 1000);
  fb_pool_free(p);
  ck_assert_int_eq(fb_pool_new(0, 0, &p, err, sizeof err), 0);
  ck_assert_int_eq(fb_pool_threads(p), fb_cpu_cores());
  check_cover(p, 100000);
  fb_pool_free(p);
  ck_assert_int_eq(fb_pool_new(-1, 0, &p, err, sizeof err), FB_EINVAL);
  ck_assert_ptr_null(p);
}
END_TEST

/* Many chunks are handed out: a chunk-size-1 pool with n = 8 must call the
 * body more than once (the split happens whoever runs the chunks). */
START_TEST(splits_into_chunks) {
  fb_pool *p;
  char err[256];
  ck_assert_int_eq(fb_pool_new(2, 1, &p, err, sizeof err), 0);
  visit v;
  v.n = 8;
  v.seen = calloc(8, sizeof *v.seen);
  atomic_init(&v.bad_chunk, 0);
  atomic_init(&v.calls, 0);
  fb_pool_for(p, 8, mark, &v);
  ck_assert_int_gt(atomic_load(&v.calls), 1);
  free(v.seen);
  fb_pool_free(p);
}
END_TEST

/* Shares: the caller holds chunk 0 until a worker has run a chunk; the
 * worker's first chunk must then open the second share (chunk 4 of 8 with
 * 2 threads), not follow the caller's (chunk 1, as a single counter handed
 * them out), and every chunk still runs once. */
typedef struct share_probe {
  pthread_t caller;
  atomic_llong worker_first; /* lo of the first chunk a worker ran, or -1 */
  atomic_int chunks;
  atomic_int timed_out;
} share_probe;

static void probe_chunk(void *arg, int64_t lo, int64_t hi) {
  (void)hi;
  share_probe *sp = arg;
  atomic_fetch_add(&sp->chunks, 1);
  if (!pthread_equal(pthread_self(), sp->caller)) {
    long long none = -1;
    atomic_compare_exchange_strong(&sp->worker_first, &none, (long long)lo);
    return;
  }
  if (lo != 0) return;
  struct timespec t0, t;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  while (atomic_load(&sp->worker_first) < 0) { /* bounded: 10 s */
    clock_gettime(CLOCK_MONOTONIC, &t);
    if (t.tv_sec - t0.tv_sec > 10) {
      atomic_store(&sp->timed_out, 1);
      return;
    }
    sched_yield();
  }
}

START_TEST(worker_takes_its_own_share) {
  fb_pool *p;
  char err[256];
  ck_assert_int_eq(fb_pool_new(2, 1, &p, err, sizeof err), 0);
  for (int round = 0; round < 20; round++) {
    share_probe sp;
    sp.caller = pthread_self();
    atomic_init(&sp.worker_first, -1);
    atomic_init(&sp.chunks, 0);
    atomic_init(&sp.timed_out, 0);
    fb_pool_for_grain(p, 8, 1, probe_chunk, &sp); /* 2 threads x 4: 8 chunks of 1 */
    ck_assert_int_eq(atomic_load(&sp.timed_out), 0);
    ck_assert_int_eq(atomic_load(&sp.chunks), 8);
    ck_assert_msg(atomic_load(&sp.worker_first) == 4,
                  "round %d: the worker's first chunk was %lld, not the second share's first (4)",
                  round, (long long)atomic_load(&sp.worker_first));
  }
  fb_pool_free(p);
}
END_TEST

static void add_range(void *arg, int64_t lo, int64_t hi) {
  atomic_llong *sum = arg;
  long long s = 0;
  for (int64_t i = lo; i < hi; i++) s += i;
  atomic_fetch_add(sum, s);
}

START_TEST(reuse_many_small_launches) {
  fb_pool *p;
  char err[256];
  ck_assert_int_eq(fb_pool_new(4, 1, &p, err, sizeof err), 0);
  for (int r = 0; r < 10000; r++) {
    atomic_llong sum;
    atomic_init(&sum, 0);
    int64_t n = 1 + r % 67;
    fb_pool_for(p, n, add_range, &sum);
    ck_assert_int_eq(atomic_load(&sum), n * (n - 1) / 2);
  }
  fb_pool_free(p);
}
END_TEST

typedef struct runner {
  fb_pool *p;
  int ok;
} runner;

static void *launch_many(void *arg) {
  runner *r = arg;
  r->ok = 1;
  for (int it = 0; it < 2000; it++) {
    atomic_llong sum;
    atomic_init(&sum, 0);
    int64_t n = 1 + (it * 7919) % 5000;
    fb_pool_for(r->p, n, add_range, &sum);
    if (atomic_load(&sum) != n * (n - 1) / 2) r->ok = 0;
  }
  return NULL;
}

START_TEST(concurrent_callers) {
  fb_pool *p;
  char err[256];
  ck_assert_int_eq(fb_pool_new(3, 16, &p, err, sizeof err), 0);
  pthread_t th[2];
  runner r[2] = {{p, 0}, {p, 0}};
  for (int i = 0; i < 2; i++) ck_assert_int_eq(pthread_create(&th[i], NULL, launch_many, &r[i]), 0);
  for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
  ck_assert_int_eq(r[0].ok, 1);
  ck_assert_int_eq(r[1].ok, 1);
  fb_pool_free(p);
}
END_TEST

typedef struct nested {
  fb_pool *p;
  atomic_llong total;
} nested;

static void inner_rows(void *arg, int64_t lo, int64_t hi) {
  nested *ns = arg;
  for (int64_t i = lo; i < hi; i++) {
    atomic_llong sum;
    atomic_init(&sum, 0);
    fb_pool_for(ns->p, 100, add_range, &sum);
    atomic_fetch_add(&ns->total, atomic_load(&sum));
  }
}

START_TEST(nested_loops) {
  fb_pool *p;
  char err[256];
  ck_assert_int_eq(fb_pool_new(3, 1, &p, err, sizeof err), 0);
  nested ns;
  ns.p = p;
  atomic_init(&ns.total, 0);
  fb_pool_for(p, 50, inner_rows, &ns);
  ck_assert_int_eq(atomic_load(&ns.total), 50LL * 4950);
  fb_pool_free(p);
}
END_TEST

/* ---------------------------------------------------------------- launcher */

static void serial_body(fb_rt_ctx *ctx, int64_t lo, int64_t hi) {
  int64_t *cells = (int64_t *)ctx->root;
  cells[0] = (int64_t)ctx->args[0]; /* n for the next task */
  ctx->rets[0]++;
}

static void par_bounds(fb_rt_ctx *ctx, int64_t *n) { *n = ((int64_t *)ctx->root)[0]; }

static void par_body(fb_rt_ctx *ctx, int64_t lo, int64_t hi) {
  int64_t *cells = (int64_t *)ctx->root;
  for (int64_t i = lo; i < hi; i++) cells[1 + i] = i * 3;
}

static void oob_body(fb_rt_ctx *ctx, int64_t lo, int64_t hi) {
  int32_t zero = 0;
  __atomic_compare_exchange_n(ctx->error, &zero, FB_EBOUNDS, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
}

START_TEST(launcher_runs_tasks_in_order) {
  fb_cpu_device *d;
  char err[256];
  ck_assert_int_eq(fb_cpu_device_new(2, &d, err, sizeof err), 0);
  fb_devmem m;
  ck_assert_int_eq(fb_devmem_init(&m, 8 * 5001, 0, err, sizeof err), 0);
  ck_assert_int_eq((uintptr_t)m.root % 64, 0);
  ck_assert_int_eq(fb_devmem_reserve(&m, 64, 1, err, sizeof err), 0);
  uint64_t args[1] = {5000};
  int32_t error[2] = {0, 0}; /* the error and the blame word (fb_rt.h) */
  fb_rt_ctx ctx = {m.root, args, m.rets, m.gtmp, error, 1, 0, NULL, NULL};
  fb_rt_task tasks[3] = {{serial_body, NULL, NULL, {0}},
                         {par_body, par_bounds, NULL, {0}},
                         {oob_body, NULL, NULL, {0}}};
  double secs = -1;
  int failed = 7;
  ck_assert_int_eq(fb_cpu_run(d, &ctx, tasks, 2, &secs, &failed), 0);
  ck_assert(secs >= 0);
  ck_assert_int_eq(failed, -1);
  const int64_t *cells = (const int64_t *)m.root;
  for (int i = 0; i < 5000; i++) ck_assert_int_eq(cells[1 + i], i * 3);
  ck_assert_int_eq(m.rets[0], 1);
  /* the bounds error of task 2 is reported, the parallel task before it ran */
  memset(m.root + 8, 0, 8 * 5000);
  tasks[0] = tasks[1];
  tasks[1] = tasks[2];
  tasks[2] = tasks[0];
  ck_assert_int_eq(fb_cpu_run(d, &ctx, tasks, 3, &secs, &failed), FB_EBOUNDS);
  ck_assert_int_eq(failed, 1);
  ck_assert_int_eq(cells[5000], 4999 * 3);
  fb_devmem_release(&m);
  fb_cpu_device_free(d);
}
END_TEST

/* The launcher's privatized scatter (runtime/launch.c): a body that adds
 * into ctx->priv as compiled code does (codegen/priv.c). Root holds a
 * header word, the grid (PW f32 words at byte PRIV_OFF) and a guard word
 * after it. Each body call waits (bounded) until two threads are inside, so
 * that a private copy is used; the sums must then be exact (counts of
 * 0.5), the word no iteration touches must keep its -0.0, the guard word
 * must stay, and a second launch (copies reused) must add as much again. */
#define PW 4096
#define PRIV_OFF 64
static atomic_uintptr_t priv_bases[2];

static void priv_bounds(fb_rt_ctx *ctx, int64_t *n) { *n = 200000; }

static void priv_body(fb_rt_ctx *ctx, int64_t lo, int64_t hi) {
  uintptr_t me = (uintptr_t)ctx->priv, none = 0;
  if (!atomic_compare_exchange_strong(&priv_bases[0], &none, me) && none != me) {
    none = 0;
    atomic_compare_exchange_strong(&priv_bases[1], &none, me);
  }
  /* the pool wakes its worker at once; 10 s only bounds a hung test */
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  while (!atomic_load(&priv_bases[1])) {
    sched_yield();
    clock_gettime(CLOCK_MONOTONIC, &t1);
    if (t1.tv_sec - t0.tv_sec > 10) break;
  }
  float *g = (float *)(void *)(ctx->priv + PRIV_OFF);
  for (int64_t i = lo; i < hi; i++) g[i % (PW - 1)] += 0.5f; /* word PW - 1: never */
}

/* priv_body for u32 words: + 0x40000001, modulo 2^32 */
static void priv_body_u32(fb_rt_ctx *ctx, int64_t lo, int64_t hi) {
  priv_body(ctx, lo, lo); /* joins the two-thread rendezvous, adds nothing */
  uint32_t *g = (uint32_t *)(void *)(ctx->priv + PRIV_OFF);
  for (int64_t i = lo; i < hi; i++) g[i % (PW - 1)] += 0x40000001u;
}

START_TEST(launcher_private_copies) {
  fb_cpu_device *d;
  char err[256];
  ck_assert_int_eq(fb_cpu_device_new(2, &d, err, sizeof err), 0);
  fb_devmem m;
  ck_assert_int_eq(fb_devmem_init(&m, PRIV_OFF + 4 * PW + 64, 0, err, sizeof err), 0);
  uint32_t *words = (uint32_t *)(void *)m.root;
  float *grid = (float *)(void *)(m.root + PRIV_OFF);
  for (int i = 0; i < PW; i++) grid[i] = 1.0f;
  grid[PW - 1] = -0.0f;
  words[PRIV_OFF / 4 + PW] = 0xdeadbeefu; /* just past the grid */
  int32_t error[2] = {0, 0}; /* the error and the blame word (fb_rt.h) */
  uint64_t args[1] = {0};
  fb_rt_ctx ctx = {m.root, args, m.rets, m.gtmp, error, 1, 0, NULL, NULL};
  fb_rt_task t = {priv_body, priv_bounds, NULL, {0}};
  t.priv.n = 1;
  t.priv.lo = PRIV_OFF;
  t.priv.hi = PRIV_OFF + 4 * PW;
  t.priv.off[0] = PRIV_OFF;
  t.priv.bytes[0] = 4 * PW;
  t.priv.sites = 1;
  for (int run = 1; run <= 2; run++) {
    atomic_store(&priv_bases[0], 0);
    atomic_store(&priv_bases[1], 0);
    ck_assert_int_eq(fb_cpu_run(d, &ctx, &t, 1, NULL, NULL), 0);
    /* two threads, two bases: root itself and a copy */
    ck_assert(atomic_load(&priv_bases[1]) != 0);
    ck_assert(atomic_load(&priv_bases[0]) == (uintptr_t)m.root ||
              atomic_load(&priv_bases[1]) == (uintptr_t)m.root);
    /* 200000 iterations over PW - 1 words: 48 or 49 per word, 0.5 each */
    for (int i = 0; i < PW - 1; i++) {
      float per = (float)(200000 / (PW - 1) + (i < 200000 % (PW - 1)));
      ck_assert_msg(grid[i] == 1.0f + run * 0.5f * per, "run %d: word %d = %g, want %g", run, i,
                    grid[i], 1.0f + run * 0.5f * per);
    }
    ck_assert_uint_eq(words[PRIV_OFF / 4 + PW - 1], 0x80000000u);
    ck_assert_uint_eq(words[PRIV_OFF / 4 + PW], 0xdeadbeefu);
  }
  /* the same grid as u32 words (priv.i32): each iteration adds
   * 0x40000001 modulo 2^32 into a copy word that holds 0x80000000 + the
   * thread's sum; the launcher adds word - 0x80000000 into root. The
   * copies come from the f32 runs above, so they must be back at
   * 0x80000000, and go back to it for the next run. */
  uint32_t *ugrid = words + PRIV_OFF / 4;
  for (int i = 0; i < PW; i++) ugrid[i] = 0x7ffffff0u + (uint32_t)i;
  t.body = priv_body_u32;
  t.priv.i32[0] = 1;
  for (int run = 1; run <= 2; run++) {
    atomic_store(&priv_bases[0], 0);
    atomic_store(&priv_bases[1], 0);
    ck_assert_int_eq(fb_cpu_run(d, &ctx, &t, 1, NULL, NULL), 0);
    ck_assert(atomic_load(&priv_bases[1]) != 0);
    for (int i = 0; i < PW - 1; i++) {
      uint32_t per = (uint32_t)(200000 / (PW - 1) + (i < 200000 % (PW - 1)));
      uint32_t want = 0x7ffffff0u + (uint32_t)i + (uint32_t)run * per * 0x40000001u;
      ck_assert_msg(ugrid[i] == want, "u32 run %d: word %d = %08x, want %08x", run, i, ugrid[i],
                    want);
    }
    ck_assert_uint_eq(ugrid[PW - 1], 0x7ffffff0u + (uint32_t)(PW - 1));
    ck_assert_uint_eq(words[PRIV_OFF / 4 + PW], 0xdeadbeefu);
  }
  /* and back to f32: the copies hold -0.0 again */
  for (int i = 0; i < PW; i++) grid[i] = 2.0f;
  t.body = priv_body;
  t.priv.i32[0] = 0;
  atomic_store(&priv_bases[0], 0);
  atomic_store(&priv_bases[1], 0);
  ck_assert_int_eq(fb_cpu_run(d, &ctx, &t, 1, NULL, NULL), 0);
  for (int i = 0; i < PW - 1; i++) {
    float per = (float)(200000 / (PW - 1) + (i < 200000 % (PW - 1)));
    ck_assert_msg(grid[i] == 2.0f + 0.5f * per, "f32 after u32: word %d = %g", i, grid[i]);
  }
  ck_assert(grid[PW - 1] == 2.0f);
  ck_assert_int_eq(error[0], 0);
  fb_devmem_release(&m);
  fb_cpu_device_free(d);
}
END_TEST

/* The own copies of concurrent privatized launches are bounded together
 * (runtime/launch.c priv_take): while another launch holds the device's
 * copies (priv_busy), a launch allocates its own only while all such own
 * copies stay within PRIV_MAX_TOTAL (64 MiB, PRIV_CAP_WORDS words here);
 * past it the loop runs on one thread into root. The body looks at the
 * device's count of own words while it runs: at the cap nothing is taken
 * (and every body call adds into root), below it one copy (2 threads: PW
 * words) is, and the count comes back after the launch. The sums are
 * exact either way. */
#define PRIV_CAP_WORDS (((size_t)64 << 20) / 4)
static fb_cpu_device *own_dev;
static atomic_size_t own_seen;
static atomic_int own_copy_used; /* a body ran on a copy, not on root */

static void own_body(fb_rt_ctx *ctx, int64_t lo, int64_t hi) {
  pthread_mutex_lock(&own_dev->priv_mu);
  size_t w = own_dev->priv_own_words;
  pthread_mutex_unlock(&own_dev->priv_mu);
  atomic_store(&own_seen, w);
  if (ctx->priv != ctx->root) atomic_store(&own_copy_used, 1);
  float *g = (float *)(void *)(ctx->priv + PRIV_OFF);
  for (int64_t i = lo; i < hi; i++) g[i % PW] += 1.0f;
}

START_TEST(launcher_own_copies_bounded) {
  char err[256];
  ck_assert_int_eq(fb_cpu_device_new(2, &own_dev, err, sizeof err), 0);
  fb_devmem m;
  ck_assert_int_eq(fb_devmem_init(&m, PRIV_OFF + 4 * PW + 64, 0, err, sizeof err), 0);
  float *grid = (float *)(void *)(m.root + PRIV_OFF);
  int32_t error = 0;
  uint64_t args[1] = {0};
  fb_rt_ctx ctx = {m.root, args, m.rets, m.gtmp, &error, 1, 0, NULL, NULL};
  fb_rt_task t = {own_body, priv_bounds, NULL, {0}};
  t.priv.n = 1;
  t.priv.lo = PRIV_OFF;
  t.priv.hi = PRIV_OFF + 4 * PW;
  t.priv.off[0] = PRIV_OFF;
  t.priv.bytes[0] = 4 * PW;
  t.priv.sites = 1;
  own_dev->priv_busy = 1; /* another launch holds the device's copies */
  size_t before[2] = {PRIV_CAP_WORDS - PW + 1, 0}, want[2] = {PRIV_CAP_WORDS - PW + 1, PW};
  for (int run = 0; run < 2; run++) {
    own_dev->priv_own_words = before[run];
    atomic_store(&own_seen, 0);
    atomic_store(&own_copy_used, 0);
    ck_assert_int_eq(fb_cpu_run(own_dev, &ctx, &t, 1, NULL, NULL), 0);
    size_t seen = atomic_load(&own_seen);
    int on_copy = atomic_load(&own_copy_used);
    ck_assert_uint_eq(seen, want[run]);
    if (run == 0) ck_assert_int_eq(on_copy, 0); /* one thread, into root */
    ck_assert_uint_eq(own_dev->priv_own_words, before[run]);
    ck_assert_int_eq(own_dev->priv_busy, 1);
    /* 200000 iterations over PW words: 48 or 49 per word */
    for (int i = 0; i < PW; i++) {
      float per = (float)(200000 / PW + (i < 200000 % PW));
      ck_assert_msg(grid[i] == (run + 1) * per, "run %d: word %d = %g", run, i, grid[i]);
    }
  }
  ck_assert_int_eq(error, 0);
  own_dev->priv_busy = 0;
  fb_devmem_release(&m);
  fb_cpu_device_free(own_dev);
}
END_TEST

START_TEST(devmem_quota) {
  fb_devmem m;
  char err[256];
  ck_assert_int_eq(fb_devmem_init(&m, 1 << 20, 1000, err, sizeof err), FB_EQUOTA);
  ck_assert_ptr_nonnull(strstr(err, "1048576"));
  ck_assert_ptr_nonnull(strstr(err, "1000"));
  ck_assert_int_eq(fb_devmem_init(&m, 512, 1000, err, sizeof err), 0);
  ck_assert_int_eq(fb_devmem_reserve(&m, 600, 1, err, sizeof err), FB_EQUOTA);
  ck_assert_int_eq(fb_devmem_reserve(&m, 488, 1, err, sizeof err), 0);
  ck_assert_int_eq(fb_devmem_used(&m), 1000);
  fb_devmem_release(&m);
  /* big roots arrive zeroed */
  ck_assert_int_eq(fb_devmem_init(&m, 3 << 20, 0, err, sizeof err), 0);
  for (size_t i = 0; i < (3u << 20); i += 4093) ck_assert_int_eq(m.root[i], 0);
  fb_devmem_release(&m);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("threadpool");
  TCase *tc = tcase_create("pool");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, cover_default_chunks);
  tcase_add_test(tc, cover_small_chunks);
  tcase_add_test(tc, slots_per_thread);
  tcase_add_test(tc, cover_one_thread_and_default);
  tcase_add_test(tc, splits_into_chunks);
  tcase_add_test(tc, worker_takes_its_own_share);
  tcase_add_test(tc, reuse_many_small_launches);
  tcase_add_test(tc, concurrent_callers);
  tcase_add_test(tc, nested_loops);
  tcase_add_test(tc, launcher_runs_tasks_in_order);
  tcase_add_test(tc, launcher_private_copies);
  tcase_add_test(tc, launcher_own_copies_bounded);
  tcase_add_test(tc, devmem_quota);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) { return fbt_run(suite()); }
