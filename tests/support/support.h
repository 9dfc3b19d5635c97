/* Helpers shared by the test suites: reading test data, running a suite. */
#ifndef FB_TEST_SUPPORT_H
#define FB_TEST_SUPPORT_H

#include <check.h>
#include <stddef.h>

#include "fusebox/common.h"

/* Path of a file under tests/ (FB_TEST_DIR): static buffer, not reentrant. */
const char *fbt_path(const char *rel);
/* Whole file into a malloc'd NUL-terminated string, or NULL. */
char *fbt_read_file(const char *path, size_t *len);
/* Run one suite, print Check's summary, return the process exit status.
 * After the summary each failing case is printed with its file:line, its
 * name and the message (a crash or an early exit: "(after this point)" at
 * the case's last check; a case past CK_DEFAULT_TIMEOUT: "Test timeout
 * expired"). CK_VERBOSITY (silent, minimal, normal, verbose) is libcheck's:
 * verbose lists the passing cases too. stdout is line-buffered, so that it interleaves with the
 * sanitizers' reports on stderr in the order things happened.
 * Under FB_TEST_BACKEND=cuda (the suites' CUDA half) a machine without a
 * GPU and its driver runs nothing: it prints why and returns 77, which
 * ctest reports as skipped. */
int fbt_run(Suite *s);
/* Running some cases only (docs/testing.md, "One case"): with FB_TEST_CASE
 * set to a case's name (its START_TEST name; several separated by commas)
 * tcase_add_test and tcase_add_loop_test add only those cases, and fbt_run
 * fails, naming the variable, when no case of the suite matched. */
int fbt_case_selected(const TTest *t);
#undef tcase_add_test
#define tcase_add_test(tc, tf)                                         \
  do {                                                                 \
    if (fbt_case_selected(tf)) _tcase_add_test((tc), (tf), 0, 0, 0, 1); \
  } while (0)
#undef tcase_add_loop_test
#define tcase_add_loop_test(tc, tf, s, e)                                  \
  do {                                                                     \
    if (fbt_case_selected(tf)) _tcase_add_test((tc), (tf), 0, 0, (s), (e)); \
  } while (0)
/* The backend the suite's engines use: $FB_TEST_BACKEND, else "cpu". */
const char *fbt_backend(void);
/* Bit-exact equality of two values (any NaN equals any NaN of its type). */
int fbt_value_same(fb_value a, fb_value b);
/* The value with its type, "i32 -5", "f64 0.5", into buf. */
const char *fbt_value_show(fb_value v, char *buf, size_t n);

#endif
