/* Helpers shared by the test suites. */
#include "support.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fusebox/engine.h"

const char *fbt_backend(void) {
  const char *b = getenv("FB_TEST_BACKEND");
  return b && *b ? b : "cpu";
}

/* Can this machine run the suite's backend? 1, or 0 with the reason. */
static int backend_available(char *why, size_t len) {
  if (strcmp(fbt_backend(), "cpu") == 0) return 1;
  fb_engine_config cfg = {fbt_backend(), 1, 1};
  fb_engine *e = NULL;
  int rc = fb_engine_create(&cfg, &e, why, len);
  fb_engine_destroy(e);
  return rc == 0;
}

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
  if (s && fread(s, 1, (size_t)n, f) != (size_t)n) {
    free(s);
    s = NULL;
  }
  fclose(f);
  if (!s) return NULL;
  s[n] = 0;
  if (len) *len = (size_t)n;
  return s;
}

static int cases_selected;

int fbt_case_selected(const TTest *t) {
  const char *want = getenv("FB_TEST_CASE");
  if (!want || !*want) return 1;
  size_t n = strlen(t->name);
  for (const char *p = want; *p;) {
    const char *e = strchr(p, ',');
    size_t len = e ? (size_t)(e - p) : strlen(p);
    if (len == n && strncmp(p, t->name, n) == 0) return ++cases_selected;
    if (!e) break;
    p = e + 1;
  }
  return 0;
}

int fbt_run(Suite *s) {
  char why[512] = "";
  setvbuf(stdout, NULL, _IOLBF, 0);
  const char *want = getenv("FB_TEST_CASE");
  if (want && *want && !cases_selected) {
    printf("FB_TEST_CASE=%s names no case of this suite\n", want);
    srunner_free(srunner_create(s));
    return EXIT_FAILURE;
  }
  if (!backend_available(why, sizeof why)) {
    printf("%s half skipped: %s\n", fbt_backend(), why);
    srunner_free(srunner_create(s)); /* frees the suite */
    return 77;
  }
  if (strcmp(fbt_backend(), "cpu") != 0) printf("running on the %s backend\n", fbt_backend());
  SRunner *sr = srunner_create(s);
  const char *verbosity = getenv("CK_VERBOSITY");
  srunner_run_all(sr, verbosity && *verbosity ? CK_ENV : CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}

int fbt_value_same(fb_value a, fb_value b) {
  if (a.type != b.type) return 0;
  if (a.type == FB_T_F32) {
    float x = (float)a.v.f, y = (float)b.v.f;
    return memcmp(&x, &y, sizeof x) == 0 || (isnan(x) && isnan(y));
  }
  if (a.type == FB_T_F64) return memcmp(&a.v.f, &b.v.f, 8) == 0 || (isnan(a.v.f) && isnan(b.v.f));
  return a.v.u == b.v.u;
}

const char *fbt_value_show(fb_value v, char *buf, size_t n) {
  if (fb_type_is_float(v.type)) snprintf(buf, n, "%s %.17g", fb_type_name(v.type), v.v.f);
  else if (fb_type_is_signed(v.type))
    snprintf(buf, n, "%s %lld", fb_type_name(v.type), (long long)v.v.i);
  else snprintf(buf, n, "%s %llu", fb_type_name(v.type), (unsigned long long)v.v.u);
  return buf;
}
