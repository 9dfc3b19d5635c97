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
 * Under FB_TEST_BACKEND=cuda (the suites' CUDA half) a machine without a
 * GPU and its driver runs nothing: it prints why and returns 77, which
 * ctest reports as skipped. */
int fbt_run(Suite *s);
/* The backend the suite's engines use: $FB_TEST_BACKEND, else "cpu". */
const char *fbt_backend(void);
/* Bit-exact equality of two values (any NaN equals any NaN of its type). */
int fbt_value_same(fb_value a, fb_value b);
/* The value with its type, "i32 -5", "f64 0.5", into buf. */
const char *fbt_value_show(fb_value v, char *buf, size_t n);

#endif
