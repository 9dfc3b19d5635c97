/* Helpers shared by the test suites: reading test data, running a suite. */
#ifndef FB_TEST_SUPPORT_H
#define FB_TEST_SUPPORT_H

#include <check.h>
#include <stddef.h>

/* Path of a file under tests/ (FB_TEST_DIR): static buffer, not reentrant. */
const char *fbt_path(const char *rel);
/* Whole file into a malloc'd NUL-terminated string, or NULL. */
char *fbt_read_file(const char *path, size_t *len);
/* Run one suite, print Check's summary, return the process exit status. */
int fbt_run(Suite *s);

#endif
