/* Tests of the shared hash table (base/map.h): insertion and lookup of many
 * keys (0 and all-ones included), growth keeping every entry, reserve
 * making room ahead, deletion by backward shift in the middle of long
 * probe runs of colliding keys, several entries of one key, sets (values
 * of 0 bytes), whole-table walks, and a long random mix of operations
 * checked against a plain array. */
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "base/map.h"
#include "support/support.h"

typedef struct val {
  uint64_t a;
  int b;
} val;

static uint64_t key_of(int i) { return (uint64_t)i * 0x10001ull; }

START_TEST(insert_lookup) {
  fb_map m;
  fb_map_init(&m, sizeof(val));
  ck_assert_ptr_null(fb_map_get(&m, 1)); /* empty: no memory yet */
  for (int i = 0; i < 5000; i++) {
    int added = 0;
    val *v = fb_map_put(&m, key_of(i), &added);
    ck_assert_ptr_nonnull(v);
    ck_assert_int_eq(added, 1);
    ck_assert(v->a == 0 && v->b == 0); /* zeroed */
    v->a = key_of(i) + 7;
    v->b = i;
  }
  ck_assert_uint_eq(m.n, 5000);
  for (int i = 0; i < 5000; i++) {
    const val *v = fb_map_get(&m, key_of(i));
    ck_assert_ptr_nonnull(v);
    ck_assert(v->a == key_of(i) + 7);
    ck_assert_int_eq(v->b, i);
    int added = 1;
    ck_assert_ptr_eq(fb_map_put(&m, key_of(i), &added), v); /* present: the same entry */
    ck_assert_int_eq(added, 0);
  }
  ck_assert_ptr_null(fb_map_get(&m, key_of(5000)));
  ck_assert_uint_eq(m.n, 5000);
  /* every key is usable: none marks an empty slot */
  ck_assert_ptr_null(fb_map_get(&m, UINT64_MAX));
  ((val *)fb_map_put(&m, 0, NULL))->b = -1; /* key_of(0) is 0: already there */
  ((val *)fb_map_put(&m, UINT64_MAX, NULL))->b = -2;
  ck_assert_int_eq(((val *)fb_map_get(&m, 0))->b, -1);
  ck_assert_int_eq(((val *)fb_map_get(&m, UINT64_MAX))->b, -2);
  ck_assert_uint_eq(m.n, 5001);
  fb_map_free(&m);
  ck_assert_uint_eq(m.n, 0);
  ck_assert_ptr_null(fb_map_get(&m, 0));
}
END_TEST

START_TEST(growth_and_reserve) {
  fb_map m;
  fb_map_init(&m, sizeof(int));
  size_t last = 0;
  int grew = 0;
  for (int i = 0; i < 3000; i++) {
    *(int *)fb_map_put(&m, key_of(i), NULL) = i;
    ck_assert(m.cap >= 2 * m.n); /* at most half full */
    ck_assert((m.cap & (m.cap - 1)) == 0);
    if (m.cap != last) {
      grew++;
      last = m.cap;
      for (int j = 0; j <= i; j++) /* everything survives the move */
        ck_assert_int_eq(*(int *)fb_map_get(&m, key_of(j)), j);
    }
  }
  ck_assert_int_ge(grew, 8); /* 16 .. 8192 */
  fb_map_free(&m);

  /* after reserve(n), n insertions neither grow nor move values */
  fb_map_init(&m, sizeof(int));
  ck_assert_int_eq(fb_map_reserve(&m, 1000), 0);
  size_t cap = m.cap;
  int *first = fb_map_put(&m, 12345, NULL);
  *first = 99;
  for (int i = 1; i < 1000; i++) ck_assert_ptr_nonnull(fb_map_put(&m, key_of(i), NULL));
  ck_assert_uint_eq(m.cap, cap);
  ck_assert_ptr_eq(fb_map_get(&m, 12345), first);
  ck_assert_int_eq(*first, 99);
  ck_assert_int_eq(fb_map_reserve(&m, 10), 0); /* never shrinks */
  ck_assert_uint_eq(m.cap, cap);
  fb_map_free(&m);
}
END_TEST

/* n keys whose home slot is 0 in a table of cap slots. */
static void colliding(uint64_t *out, int n, size_t cap) {
  uint64_t k = 1;
  for (int i = 0; i < n; k++)
    if ((fb__mix64(k) & (cap - 1)) == 0) out[i++] = k;
}

START_TEST(colliding_keys_and_deletion) {
  enum {
    N = 300
  };
  uint64_t keys[N];
  fb_map m;
  fb_map_init(&m, sizeof(int));
  ck_assert_int_eq(fb_map_reserve(&m, N + 40), 0);
  colliding(keys, N, m.cap);
  for (int i = 0; i < N; i++) *(int *)fb_map_put(&m, keys[i], NULL) = i;
  /* other keys land inside the run */
  for (int i = 0; i < 40; i++) *(int *)fb_map_put(&m, (1ull << 63 | (uint64_t)i), NULL) = 1000 + i;
  size_t cap = m.cap;
  for (int i = 0; i < N; i++) ck_assert_int_eq(*(int *)fb_map_get(&m, keys[i]), i);
  /* delete from the middle and the front of the run: the rest stays findable */
  for (int i = 1; i < N; i += 3) ck_assert_int_eq(fb_map_del(&m, keys[i]), 1);
  ck_assert_int_eq(fb_map_del(&m, keys[1]), 0); /* gone already */
  ck_assert_int_eq(fb_map_del(&m, keys[0]), 1);
  ck_assert_uint_eq(m.cap, cap);
  for (int i = 0; i < N; i++) {
    const int *v = fb_map_get(&m, keys[i]);
    if (i == 0 || i % 3 == 1) ck_assert_ptr_null(v);
    else ck_assert_msg(v && *v == i, "key %d lost after deletions", i);
  }
  for (int i = 0; i < 40; i++)
    ck_assert_int_eq(*(int *)fb_map_get(&m, (1ull << 63 | (uint64_t)i)), 1000 + i);
  /* put them back, then delete everything */
  for (int i = 0; i < N; i++) *(int *)fb_map_put(&m, keys[i], NULL) = -i;
  ck_assert_uint_eq(m.n, N + 40);
  for (int i = 0; i < N; i++) ck_assert_int_eq(fb_map_del(&m, keys[i]), 1);
  for (int i = 0; i < 40; i++) ck_assert_int_eq(fb_map_del(&m, (1ull << 63 | (uint64_t)i)), 1);
  ck_assert_uint_eq(m.n, 0);
  for (size_t i = 0; i < m.cap; i++) ck_assert_ptr_null(fb_map_at(&m, i, NULL));
  fb_map_free(&m);
}
END_TEST

START_TEST(several_entries_of_one_key) {
  fb_map m;
  fb_map_init(&m, sizeof(int));
  for (int i = 0; i < 5; i++) *(int *)fb_map_add(&m, 42) = i;
  *(int *)fb_map_add(&m, 43) = 100;
  ck_assert_uint_eq(m.n, 6);
  int seen = 0;
  size_t it = 0;
  int *v;
  while ((v = fb_map_next(&m, 42, &it))) {
    ck_assert(*v >= 0 && *v < 5);
    seen |= 1 << *v;
  }
  ck_assert_int_eq(seen, 31);
  /* remove the entry holding 2 through the cursor */
  it = 0;
  while ((v = fb_map_next(&m, 42, &it)) && *v != 2) continue;
  ck_assert_ptr_nonnull(v);
  fb_map_del_at(&m, it);
  seen = 0;
  int count = 0;
  for (it = 0; (v = fb_map_next(&m, 42, &it)); count++) seen |= 1 << *v;
  ck_assert_int_eq(count, 4);
  ck_assert_int_eq(seen, 31 & ~4);
  ck_assert_int_eq(*(int *)fb_map_get(&m, 43), 100);
  ck_assert_uint_eq(m.n, 5);
  fb_map_free(&m);
}
END_TEST

START_TEST(set_and_walk) {
  fb_map m;
  fb_map_init(&m, 0);
  for (int i = 0; i < 200; i++) ck_assert_ptr_nonnull(fb_map_put(&m, key_of(i) + 3, NULL));
  for (int i = 0; i < 200; i++) ck_assert_ptr_nonnull(fb_map_get(&m, key_of(i) + 3));
  ck_assert_ptr_null(fb_map_get(&m, 2));
  unsigned char hit[200] = {0};
  size_t n = 0;
  for (size_t i = 0; i < m.cap; i++) {
    uint64_t k;
    if (!fb_map_at(&m, i, &k)) continue;
    n++;
    ck_assert((k - 3) % 0x10001ull == 0 && (k - 3) / 0x10001ull < 200);
    hit[(k - 3) / 0x10001ull]++;
  }
  ck_assert_uint_eq(n, 200);
  for (int i = 0; i < 200; i++) ck_assert_int_eq(hit[i], 1);
  fb_map_free(&m);
}
END_TEST

/* A random mix of puts and deletions over few keys in a small table (many
 * collisions, many backward shifts), compared with an array after each. */
START_TEST(random_against_array) {
  enum {
    K = 97
  };
  int ref[K];
  for (int i = 0; i < K; i++) ref[i] = -1;
  fb_map m;
  fb_map_init(&m, sizeof(int));
  uint64_t r = 12345;
  for (int step = 0; step < 20000; step++) {
    r = fb__mix64(r);
    int k = (int)(r % K), op = (int)((r >> 32) % 3);
    uint64_t key = (uint64_t)k << 40; /* patterned keys: the mixer must spread them */
    if (op < 2) {
      *(int *)fb_map_put(&m, key, NULL) = step;
      ref[k] = step;
    } else {
      ck_assert_int_eq(fb_map_del(&m, key), ref[k] >= 0);
      ref[k] = -1;
    }
    if (step % 97) continue;
    size_t live = 0;
    for (int i = 0; i < K; i++) {
      const int *v = fb_map_get(&m, (uint64_t)i << 40);
      if (ref[i] < 0) ck_assert_ptr_null(v);
      else ck_assert_msg(v && *v == ref[i], "key %d at step %d", i, step);
      live += ref[i] >= 0;
    }
    ck_assert_uint_eq(m.n, live);
  }
  fb_map_free(&m);
}
END_TEST

static Suite *map_suite(void) {
  Suite *s = suite_create("map");
  TCase *t = tcase_create("map");
  tcase_add_test(t, insert_lookup);
  tcase_add_test(t, growth_and_reserve);
  tcase_add_test(t, colliding_keys_and_deletion);
  tcase_add_test(t, several_entries_of_one_key);
  tcase_add_test(t, set_and_walk);
  tcase_add_test(t, random_against_array);
  suite_add_tcase(s, t);
  return s;
}

int main(void) { return fbt_run(map_suite()); }
