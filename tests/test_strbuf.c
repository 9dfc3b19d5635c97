/* Tests of the one string builder (base/strbuf.h): appends of every kind
 * keep one NUL-terminated text and its length, formatted pieces longer
 * than the room left (and than the first allocation) come out whole, many
 * small pieces grow the buffer without losing any, a builder with nothing
 * appended gives "", and one whose allocation failed gives NULL and
 * ignores every later append. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/strbuf.h"
#include "support/support.h"

START_TEST(pieces_of_every_kind) {
  fb_sb b = {0};
  ck_assert_ptr_null(b.p);
  fb_sb_puts(&b, "kernel ");
  fb_sb_putn(&b, "saxpyXXX", 5);
  fb_sb_printf(&b, "(%d, %.1f)", 42, 2.5);
  fb_sb_puts(&b, "");
  ck_assert_str_eq(b.p, "kernel saxpy(42, 2.5)");
  ck_assert_uint_eq(b.n, strlen(b.p));
  char *s = fb_sb_done(&b);
  ck_assert_str_eq(s, "kernel saxpy(42, 2.5)");
  ck_assert_ptr_null(b.p); /* done leaves the builder empty */
  ck_assert_uint_eq(b.n, 0);
  free(s);
}
END_TEST

START_TEST(long_formatted_pieces) {
  /* A piece that does not fit the room left is formatted again once the
   * buffer has grown: the text must come out whole, not cut. */
  char big[5000];
  for (size_t i = 0; i < sizeof big - 1; i++) big[i] = (char)('a' + i % 26);
  big[sizeof big - 1] = 0;
  fb_sb b = {0};
  fb_sb_puts(&b, "x");
  fb_sb_printf(&b, "<%s>", big);
  fb_sb_printf(&b, "[%s|%d]", big + 4000, -7);
  ck_assert_uint_eq(b.n, 1 + 2 + strlen(big) + 3 + strlen(big + 4000) + 2);
  ck_assert_uint_eq(strlen(b.p), b.n);
  ck_assert_int_eq(b.p[0], 'x');
  ck_assert_int_eq(memcmp(b.p + 2, big, strlen(big)), 0);
  char tail[64];
  snprintf(tail, sizeof tail, "%s|-7]", big + sizeof big - 11);
  ck_assert_str_eq(b.p + b.n - strlen(tail), tail);
  fb_sb_free(&b);
  ck_assert_ptr_null(b.p);
}
END_TEST

START_TEST(many_small_pieces) {
  fb_sb b = {0};
  for (int i = 0; i < 20000; i++) fb_sb_printf(&b, "%d,", i);
  ck_assert_int_eq(b.oom, 0);
  size_t want = 0;
  char one[16];
  for (int i = 0; i < 20000; i++) want += (size_t)snprintf(one, sizeof one, "%d,", i);
  ck_assert_uint_eq(b.n, want);
  ck_assert_uint_eq(strlen(b.p), want);
  ck_assert(strncmp(b.p, "0,1,2,3,", 8) == 0);
  ck_assert_str_eq(b.p + want - 12, "19998,19999,");
  char *s = fb_sb_done(&b);
  ck_assert_ptr_nonnull(s);
  free(s);
}
END_TEST

START_TEST(empty_gives_empty_string) {
  fb_sb b = {0};
  char *s = fb_sb_done(&b);
  ck_assert_ptr_nonnull(s);
  ck_assert_str_eq(s, "");
  free(s);
}
END_TEST

START_TEST(failed_allocation_gives_null) {
  fb_sb b = {0};
  fb_sb_puts(&b, "partial");
  /* A piece no allocator can hold: the builder marks itself failed rather
   * than keep a text with a piece missing. */
  fb_sb_putn(&b, "", SIZE_MAX - 4);
  ck_assert_int_eq(b.oom, 1);
  fb_sb_puts(&b, "more");
  fb_sb_printf(&b, "%d", 1);
  ck_assert_uint_eq(b.n, strlen("partial")); /* nothing appended after */
  ck_assert_ptr_null(fb_sb_done(&b));
  ck_assert_ptr_null(b.p); /* and the memory went back */
}
END_TEST

static Suite *strbuf_suite(void) {
  Suite *s = suite_create("strbuf");
  TCase *t = tcase_create("strbuf");
  tcase_add_test(t, pieces_of_every_kind);
  tcase_add_test(t, long_formatted_pieces);
  tcase_add_test(t, many_small_pieces);
  tcase_add_test(t, empty_gives_empty_string);
  tcase_add_test(t, failed_allocation_gives_null);
  suite_add_tcase(s, t);
  return s;
}

int main(void) { return fbt_run(strbuf_suite()); }
