/* What an async session's pending launches hold (fb_session_pending_bytes,
 * the memory budget's "pending launches" part in fuseboxd), fb_session_drain
 * running them, and the engine's own bound on flushed batches waiting for
 * the session's worker (FB_MAX_QUEUED_FLUSHES). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

/* put(i, v) { x[i] = v }: one serial task, two argument slots. */
static fb_kernel *put_kernel(void) {
  fb_type p[2] = {FB_T_I32, FB_T_I32};
  fb_kernel *k = fb_kernel_new(layout, "put", 2, p, FB_T_VOID);
  ck_assert_ptr_nonnull(k);
  fb_builder b;
  fb_builder_init(&b, k);
  int i = fb_b_arg(&b, 0), v = fb_b_arg(&b, 1);
  ck_assert_int_ge(fb_b_store(&b, field, &i, 1, v), 0);
  return k;
}

static fb_session *async_session(fb_engine **e, int flush_every, int *kid) {
  fb_engine_config ec = {.backend = fbt_backend(), .compile_threads = 1, .cpu_threads = 1};
  char err[256] = "";
  ck_assert_msg(fb_engine_create(&ec, e, err, sizeof err) == 0, "%s", err);
  fb_session_config cfg = {.mode = "async", .flush_every = flush_every};
  fb_session *s = NULL;
  ck_assert_msg(fb_session_create(*e, &cfg, layout, &s, err, sizeof err) == 0, "%s", err);
  fb_kernel *k = put_kernel();
  *kid = fb_session_add_kernel(s, k);
  ck_assert_int_ge(*kid, 0);
  fb_kernel_free(k);
  return s;
}

/* What one launch of put counts: its task and two argument slots, plus the
 * launch's own record (a few pointers). */
#define PER_LAUNCH_MIN (FB_PENDING_TASK_BYTES + 16)
#define PER_LAUNCH_MAX (FB_PENDING_TASK_BYTES + 16 + 64)

START_TEST(pending_counted_and_drained) {
  fb_engine *e;
  int kid;
  fb_session *s = async_session(&e, -1, &kid); /* never flushes by itself */
  ck_assert_uint_eq(fb_session_pending_bytes(s), 0);
  enum {
    N = 1000
  };
  for (int n = 0; n < N; n++) {
    fb_value a[2] = {fb_value_i32(n % 16), fb_value_i32(n)};
    ck_assert_int_eq(fb_launch(s, kid, a, 2, NULL), 0);
  }
  uint64_t p = fb_session_pending_bytes(s);
  ck_assert_uint_ge(p, (uint64_t)N * PER_LAUNCH_MIN);
  ck_assert_uint_le(p, (uint64_t)N * PER_LAUNCH_MAX);
  fb_counters c;
  fb_session_counters(s, &c);
  ck_assert_uint_eq(c.tasks_pending, N);
  ck_assert_int_eq(fb_session_drain(s), 0);
  ck_assert_uint_eq(fb_session_pending_bytes(s), 0);
  fb_session_counters(s, &c);
  ck_assert_uint_eq(c.tasks_pending, 0);
  int32_t x[16];
  ck_assert_int_eq(fb_field_read(s, field, x, sizeof x), 0);
  for (int i = 0; i < 16; i++) /* the last write to each cell won */
    ck_assert_int_eq(x[i], (N - 1 - i) / 16 * 16 + i);
  ck_assert_int_eq(fb_sync(s), 0);
  fb_session_destroy(s);
  fb_engine_destroy(e);
}
END_TEST

START_TEST(queued_flushes_bounded) {
  fb_engine *e;
  int kid;
  fb_session *s = async_session(&e, 1, &kid); /* a batch of one task per launch */
  uint64_t worst = 0;
  for (int n = 0; n < 2000; n++) {
    fb_value a[2] = {fb_value_i32(n % 16), fb_value_i32(n)};
    ck_assert_int_eq(fb_launch(s, kid, a, 2, NULL), 0);
    uint64_t p = fb_session_pending_bytes(s);
    if (p > worst) worst = p;
  }
  /* at most FB_MAX_QUEUED_FLUSHES batches wait, and one more is on its way
   * out, whatever the caller's pace against the worker's */
  ck_assert_uint_le(worst, (uint64_t)(FB_MAX_QUEUED_FLUSHES + 1) * PER_LAUNCH_MAX);
  ck_assert_int_eq(fb_sync(s), 0);
  ck_assert_uint_eq(fb_session_pending_bytes(s), 0);
  fb_session_destroy(s);
  fb_engine_destroy(e);
}
END_TEST

START_TEST(sync_mode_holds_nothing) {
  fb_engine_config ec = {.backend = fbt_backend(), .compile_threads = 1, .cpu_threads = 1};
  fb_engine *e;
  char err[256] = "";
  ck_assert_msg(fb_engine_create(&ec, &e, err, sizeof err) == 0, "%s", err);
  fb_session *s = NULL;
  ck_assert_int_eq(fb_session_create(e, NULL, layout, &s, err, sizeof err), 0);
  ck_assert_uint_eq(fb_session_pending_bytes(s), 0);
  ck_assert_int_eq(fb_session_drain(s), 0);
  fb_session_destroy(s);
  fb_engine_destroy(e);
}
END_TEST

static Suite *pending_suite(void) {
  Suite *s = suite_create("pending");
  TCase *tc = tcase_create("pending");
  tcase_add_unchecked_fixture(tc, make_layout, NULL);
  tcase_add_test(tc, pending_counted_and_drained);
  tcase_add_test(tc, queued_flushes_bounded);
  tcase_add_test(tc, sync_mode_holds_nothing);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  int rc = fbt_run(pending_suite());
  fb_layout_free(layout);
  return rc;
}
