/* Diagnostics of the .fbk front end (lang_diag.h): lang_err and the
 * printer of a diagnostic with its source line and a caret. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fusebox/lang.h"
#include "lang_diag.h"

void lang_err(fb_diags *d, int line, int col, const char *fmt, ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  if (d) fb_diags_add(d, -1, line, col, "%s", buf);
}

static const char *line_start(const char *src, int line) {
  const char *p = src;
  for (int l = 1; l < line && p; l++) {
    p = strchr(p, '\n');
    if (p) p++;
  }
  return p;
}

char *fb_diag_render(const char *filename, const char *src, const fb_diag *d) {
  return lang_diag_render_as(filename, src, d, "error");
}

char *lang_diag_render_as(const char *filename, const char *src, const fb_diag *d,
                          const char *sev) {
  const char *fn = filename ? filename : "<input>";
  const char *ls = src && d->line > 0 ? line_start(src, d->line) : NULL;
  size_t len = ls ? strcspn(ls, "\n") : 0;
  if (len && ls[len - 1] == '\r') len--;
  size_t cap = strlen(fn) + strlen(d->msg) + 2 * len + (size_t)(d->col > 0 ? d->col : 0) + 64;
  char *out = malloc(cap);
  if (!out) return NULL;
  if (d->line <= 0) {
    snprintf(out, cap, "%s: %s: %s\n", fn, sev, d->msg);
    return out;
  }
  int n = snprintf(out, cap, "%s:%d:%d: %s: %s\n", fn, d->line, d->col, sev, d->msg);
  if (!ls) return out;
  memcpy(out + n, ls, len);
  n += (int)len;
  out[n++] = '\n';
  for (int i = 0; i + 1 < d->col; i++) out[n++] = (size_t)i < len && ls[i] == '\t' ? '\t' : ' ';
  out[n++] = '^';
  out[n++] = '\n';
  out[n] = 0;
  return out;
}

char *fb_diags_render(const char *filename, const char *src, const fb_diags *d) {
  size_t len = 1, n = 0;
  char **parts = d && d->n ? calloc((size_t)d->n, sizeof(char *)) : NULL;
  for (int i = 0; d && i < d->n; i++) {
    if (!parts || !(parts[i] = fb_diag_render(filename, src, &d->v[i]))) {
      for (int j = 0; j < i && parts; j++) free(parts[j]);
      free(parts);
      return NULL;
    }
    len += strlen(parts[i]);
  }
  char *out = malloc(len);
  if (out) out[0] = 0;
  for (int i = 0; d && i < d->n; i++) {
    size_t m = strlen(parts[i]);
    if (out) memcpy(out + n, parts[i], m + 1);
    n += m;
    free(parts[i]);
  }
  free(parts);
  return out;
}
