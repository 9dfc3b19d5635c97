/* Helpers shared by the test suites. */
#include "support.h"

#include <stdio.h>
#include <stdlib.h>

const char *fbt_path(const char *rel) {
  static char buf[4096];
  const char *dir = getenv("FB_TEST_DIR");
  snprintf(buf, sizeof buf, "%s/%s", dir ? dir : "tests", rel);
  return buf;
}

char *fbt_read_file(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *s = malloc((size_t)n + 1);
  if (s && fread(s, 1, (size_t)n, f) != (size_t)n) { free(s); s = NULL; }
  fclose(f);
  if (!s) return NULL;
  s[n] = 0;
  if (len) *len = (size_t)n;
  return s;
}

int fbt_run(Suite *s) {
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
