/* The code cache as an LRU bounded in bytes (codegen/cache.c): eviction
 * order, the bytes bound, pinned entries never evicted, partitions never
 * sharing code; then the CPU JIT evicting and recompiling real code, and
 * engine sessions of two partitions (fuseboxd's tenants under thread
 * isolation) not hitting each other's code. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codegen/codegen.h"
#include "fusebox/engine.h"
#include "support/support.h"

static fb_layout *layout;
static int field;

static void make_layout(void) {
  char err[128] = "";
  int64_t s[2] = {16, 0};
  layout = fb_layout_new();
  ck_assert_ptr_nonnull(layout);
  int d = fb_layout_add(layout, 0, FB_SN_DENSE, "i", s, 0, NULL);
  field = fb_layout_place(layout, d, "x", FB_T_I32);
  ck_assert_msg(fb_layout_finalize(layout, err, sizeof err) == 0, "finalize: %s", err);
}

/* A serial kernel storing v into x[0]: a different v, a different kernel. */
static fb_kernel *kernel_storing(int v) {
  char name[32];
  snprintf(name, sizeof name, "store%d", v);
  fb_kernel *k = fb_kernel_new(layout, name, 0, NULL, FB_T_VOID);
  ck_assert_ptr_nonnull(k);
  fb_builder b;
  fb_builder_init(&b, k);
  int zero = fb_b_const_i32(&b, 0);
  int val = fb_b_const_i32(&b, v);
  ck_assert_int_ge(fb_b_store(&b, field, &zero, 1, val), 0);
  return k;
}

/* ---------------------------------------------------------------- the cache */

enum {
  NK = 12,
  CODE = 10000
};

typedef struct fixture {
  fb_code_cache *c;
  fb_kernel *k[NK];
  fb_code_key key[NK];
  int dropped[NK]; /* times each value was dropped */
  int order[64], ndrops;
} fixture;

static void drop(void *user, fb_code_val *v) {
  fixture *f = user;
  ck_assert_int_ge(v->i, 0);
  ck_assert_int_lt(v->i, NK);
  f->dropped[v->i]++;
  if (f->ndrops < 64) f->order[f->ndrops] = v->i;
  f->ndrops++;
}

static void fixture_init(fixture *f, uint64_t partition) {
  memset(f, 0, sizeof *f);
  f->c = fb_code_cache_new();
  ck_assert_ptr_nonnull(f->c);
  for (int i = 0; i < NK; i++) {
    f->k[i] = kernel_storing(i);
    fb_cg_task t = {f->k[i], -1, partition, NULL};
    f->key[i] = fb_code_cache_key(&t);
  }
}

static void fixture_free(fixture *f) {
  fb_code_cache_free(f->c, NULL, NULL);
  for (int i = 0; i < NK; i++) fb_kernel_free(f->k[i]);
}

/* Put kernel i (value i) pinned by pins (which may be NULL: for good). */
static void put(fixture *f, int i, fb_code_pins *pins) {
  fb_code_val v = {.i = i}, kept;
  ck_assert_int_eq(fb_code_cache_put(f->c, &f->key[i], f->k[i], &v, CODE, pins, &kept), 0);
  ck_assert_int_eq(kept.i, i);
}

/* Put kernel i and unpin it at once: cached, evictable. */
static void put_free(fixture *f, int i) {
  fb_code_pins *p = fb_code_pins_new();
  ck_assert_ptr_nonnull(p);
  put(f, i, p);
  fb_code_pins_release(p);
}

static int cached(fixture *f, int i) {
  fb_code_pins *p = fb_code_pins_new();
  fb_code_val v;
  int hit = fb_code_cache_get(f->c, &f->key[i], f->k[i], p, &v);
  if (hit) ck_assert_int_eq(v.i, i);
  fb_code_pins_release(p); /* a hit also makes i the most recently used */
  return hit;
}

static uint64_t entry_bytes(fixture *f) {
  fb_code_cache_info in;
  put_free(f, NK - 1);
  fb_code_cache_stats(f->c, &in);
  ck_assert_uint_eq(in.entries, 1);
  ck_assert_uint_gt(in.bytes, CODE);
  return in.bytes;
}

START_TEST(lru_order) {
  fixture f;
  fixture_init(&f, 0);
  uint64_t e = entry_bytes(&f); /* every entry here costs the same */
  fb_code_cache_set_limit(f.c, 3 * e, drop, &f); /* three fit */
  ck_assert_int_eq(f.ndrops, 0);
  put_free(&f, 0);
  put_free(&f, 1); /* now NK-1, 0, 1 */
  ck_assert_int_eq(f.ndrops, 0);
  put_free(&f, 2); /* NK-1 is the least recently used */
  ck_assert_int_eq(f.ndrops, 1);
  ck_assert_int_eq(f.order[0], NK - 1);
  ck_assert(cached(&f, 0)); /* 0 becomes the most recent: 1 is the oldest */
  put_free(&f, 3);
  ck_assert_int_eq(f.ndrops, 2);
  ck_assert_int_eq(f.order[1], 1);
  ck_assert(!cached(&f, 1));
  ck_assert(cached(&f, 0) && cached(&f, 2) && cached(&f, 3));
  fb_code_cache_info in;
  fb_code_cache_stats(f.c, &in);
  ck_assert_uint_le(in.bytes, in.limit);
  ck_assert_uint_eq(in.entries, 3);
  ck_assert_uint_eq(in.evictions, 2);
  ck_assert_uint_eq(in.pinned_bytes, 0);
  /* every value evicted went to drop exactly once */
  for (int i = 0; i < NK; i++) ck_assert_int_le(f.dropped[i], 1);
  fixture_free(&f);
}
END_TEST

START_TEST(bytes_bound) {
  fixture f;
  fixture_init(&f, 0);
  uint64_t e = entry_bytes(&f);
  fb_code_cache_set_limit(f.c, 5 * e / 2, drop, &f); /* two and a half entries */
  for (int i = 0; i < NK - 1; i++) {
    put_free(&f, i);
    fb_code_cache_info in;
    fb_code_cache_stats(f.c, &in);
    ck_assert_msg(in.bytes <= 5 * e / 2, "%llu bytes cached over a bound of %llu",
                  (unsigned long long)in.bytes, (unsigned long long)(5 * e / 2));
    ck_assert_uint_le(in.entries, 2);
  }
  /* the two most recent survive; the rest went in the order they came */
  ck_assert(cached(&f, NK - 2) && cached(&f, NK - 3));
  ck_assert_int_eq(f.ndrops, NK - 2);
  ck_assert_int_eq(f.order[0], NK - 1);
  for (int i = 1; i < f.ndrops; i++) ck_assert_int_eq(f.order[i], i - 1);
  /* lowering the bound evicts at once; 0 lifts it */
  fb_code_cache_set_limit(f.c, e, drop, &f);
  fb_code_cache_info in;
  fb_code_cache_stats(f.c, &in);
  ck_assert_uint_eq(in.entries, 1);
  fb_code_cache_set_limit(f.c, 0, drop, &f);
  for (int i = 0; i < 4; i++) put_free(&f, i);
  fb_code_cache_stats(f.c, &in);
  ck_assert_uint_eq(in.entries, 5);
  fixture_free(&f);
}
END_TEST

START_TEST(pinned_never_evicted) {
  fixture f;
  fixture_init(&f, 0);
  uint64_t e = entry_bytes(&f);
  fb_code_cache_set_limit(f.c, 2 * e, drop, &f);
  fb_code_pins *live = fb_code_pins_new(); /* a session that keeps its code */
  put(&f, 0, live);
  put(&f, 1, live);
  put(&f, 2, live); /* over the bound, but every entry is held */
  ck_assert_int_eq(f.dropped[0] + f.dropped[1] + f.dropped[2], 0);
  fb_code_cache_info in;
  fb_code_cache_stats(f.c, &in);
  ck_assert_uint_gt(in.bytes, in.limit); /* held code stands above the bound */
  ck_assert_uint_eq(in.pinned_bytes, in.bytes);
  for (int i = 3; i < 8; i++) put_free(&f, i); /* churn: only the free ones go */
  ck_assert_int_eq(f.dropped[0] + f.dropped[1] + f.dropped[2], 0);
  ck_assert(cached(&f, 0) && cached(&f, 1) && cached(&f, 2));
  /* a second owner of 1: releasing the first leaves 1 held */
  fb_code_pins *other = fb_code_pins_new();
  fb_code_val v;
  ck_assert(fb_code_cache_get(f.c, &f.key[1], f.k[1], other, &v));
  fb_code_pins_release(live); /* LRU now: 0, 2, 1 (held by other) */
  ck_assert_int_eq(f.dropped[1], 0);
  ck_assert_int_eq(f.dropped[0], 1); /* the least recently used went, to the bound */
  ck_assert_int_eq(f.dropped[2], 0);
  fb_code_cache_stats(f.c, &in);
  ck_assert_uint_le(in.bytes, in.limit);
  ck_assert(cached(&f, 1));
  /* got or put without pins: pinned for good */
  put(&f, 9, NULL);
  fb_code_pins_release(other);
  for (int i = 3; i < 8; i++) put_free(&f, i);
  ck_assert(cached(&f, 9));
  ck_assert_int_eq(f.dropped[9], 0);
  fixture_free(&f);
}
END_TEST

START_TEST(partitions_apart) {
  fixture a, b;
  fixture_init(&a, 1);
  fixture_init(&b, 2);
  fb_code_cache_free(b.c, NULL, NULL);
  b.c = a.c; /* one cache, the same kernels, two partitions */
  ck_assert_uint_ne(a.key[0].key, b.key[0].key);
  put_free(&a, 0);
  ck_assert(cached(&a, 0));
  ck_assert(!cached(&b, 0)); /* partition 2 does not see partition 1's code */
  /* even with the key of partition 1, a partition-2 lookup misses */
  fb_code_key k = a.key[0];
  k.partition = 2;
  fb_code_val v;
  ck_assert(!fb_code_cache_get(a.c, &k, a.k[0], NULL, &v));
  b.c = NULL;
  fixture_free(&b);
  fixture_free(&a);
}
END_TEST

/* ---------------------------------------------------------------- the CPU JIT */

START_TEST(jit_evicts_and_recompiles) {
  char err[512] = "";
  fb_cpu_jit *j = fb_cpu_jit_new(err, sizeof err);
  ck_assert_msg(j != NULL, "%s", err);
  fb_kernel *k[4];
  for (int i = 0; i < 4; i++) k[i] = kernel_storing(100 + i);
  fb_code_pins *p = fb_code_pins_new();
  fb_cpu_code code;
  fb_cg_task t0 = {k[0], -1, 0, p};
  ck_assert_int_eq(fb_cpu_jit_compile(j, &t0, &code, err, sizeof err), 0);
  fb_code_pins_release(p);
  fb_code_cache_info in;
  fb_cpu_jit_cache_info(j, &in);
  ck_assert_uint_eq(in.entries, 1);
  fb_cpu_jit_set_cache_limit(j, in.bytes + in.bytes / 2); /* one entry fits */
  for (int round = 0; round < 2; round++)
    for (int i = 0; i < 4; i++) {
      p = fb_code_pins_new();
      fb_cg_task t = {k[i], -1, 0, p};
      ck_assert_msg(fb_cpu_jit_compile(j, &t, &code, err, sizeof err) == 0, "%s", err);
      ck_assert_ptr_nonnull(code.body);
      /* the code of the others was evicted: each compile is a miss, and
       * the new code runs (storing its value) */
      ck_assert_int_eq(code.cache_hit, round == 0 && i == 0);
      int32_t x[16] = {0}, e32[2] = {0, 0};
      fb_rt_ctx ctx = {.root = (uint8_t *)x, .error = e32};
      code.body(&ctx, 0, 0);
      ck_assert_int_eq(x[0], 100 + i);
      fb_code_pins_release(p);
    }
  fb_cpu_jit_cache_info(j, &in);
  ck_assert_uint_eq(in.entries, 1);
  ck_assert_uint_ge(in.evictions, 7);
  fb_cpu_jit_free(j);
  for (int i = 0; i < 4; i++) fb_kernel_free(k[i]);
}
END_TEST

/* ---------------------------------------------------------------- engine sessions */

static uint64_t hits_in(fb_engine *e, uint64_t partition) {
  fb_session_config cfg = {.cache_partition = partition};
  fb_session *s = NULL;
  char err[256] = "";
  ck_assert_msg(fb_session_create(e, &cfg, layout, &s, err, sizeof err) == 0, "%s", err);
  fb_kernel *k = kernel_storing(7);
  ck_assert_int_ge(fb_session_add_kernel(s, k), 0);
  fb_kernel_free(k);
  fb_counters c;
  fb_session_counters(s, &c);
  fb_session_destroy(s);
  return c.cache_hits;
}

START_TEST(sessions_of_two_partitions) {
  fb_engine_config ec = {.backend = "cpu", .compile_threads = 1, .cpu_threads = 1};
  fb_engine *e = NULL;
  char err[256] = "";
  ck_assert_msg(fb_engine_create(&ec, &e, err, sizeof err) == 0, "%s", err);
  ck_assert_uint_eq(hits_in(e, 11), 0); /* tenant A compiles */
  ck_assert_uint_eq(hits_in(e, 22), 0); /* tenant B: no hit on A's code */
  ck_assert_uint_eq(hits_in(e, 11), 1); /* A again: its own code is still cached */
  fb_code_cache_usage u;
  fb_engine_code_cache(e, &u);
  ck_assert_uint_eq(u.entries, 2);
  ck_assert_uint_eq(u.pinned_bytes, 0); /* the sessions are gone: nothing held */
  ck_assert_uint_eq(u.limit, FB_CODE_CACHE_BYTES_DEFAULT);
  fb_engine_set_code_cache_bytes(e, 1); /* everything unheld goes */
  fb_engine_code_cache(e, &u);
  ck_assert_uint_eq(u.entries, 0);
  ck_assert_uint_eq(u.bytes, 0);
  ck_assert_uint_eq(hits_in(e, 11), 0);
  fb_engine_destroy(e);
}
END_TEST

static Suite *cache_suite(void) {
  Suite *s = suite_create("code_cache");
  TCase *tc = tcase_create("lru");
  tcase_add_unchecked_fixture(tc, make_layout, NULL);
  tcase_add_test(tc, lru_order);
  tcase_add_test(tc, bytes_bound);
  tcase_add_test(tc, pinned_never_evicted);
  tcase_add_test(tc, partitions_apart);
  tcase_add_test(tc, jit_evicts_and_recompiles);
  tcase_add_test(tc, sessions_of_two_partitions);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  int rc = fbt_run(cache_suite());
  fb_layout_free(layout);
  return rc;
}
