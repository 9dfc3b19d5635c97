/* Error names (fb_strerror, from the table in include/fusebox/errors.h) and
 * the one error formatter of every folder: fb_errf, fb_verrf (for a
 * folder's own printf-like helper) and fb_errcat (a message built in
 * parts). Declared in include/fusebox/common.h. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "fusebox/common.h"

const char *fb_strerror(int code) {
  switch (code) {
#define FB_ERR(name, value, msg, grpc)                                                             \
  case FB_##name: return msg;
#include "fusebox/errors.h"
#undef FB_ERR
  default: return "unknown error";
  }
}

void fb_verrf(char *err, size_t errlen, const char *fmt, va_list ap) {
  if (err && errlen) vsnprintf(err, errlen, fmt, ap);
}

void fb_errf(char *err, size_t errlen, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fb_verrf(err, errlen, fmt, ap);
  va_end(ap);
}

void fb_errcat(char *err, size_t errlen, const char *fmt, ...) {
  if (!err || !errlen) return;
  size_t used = strnlen(err, errlen);
  if (used + 1 >= errlen) return; /* full (or not terminated): nothing more fits */
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err + used, errlen - used, fmt, ap);
  va_end(ap);
}
