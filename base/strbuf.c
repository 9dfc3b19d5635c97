/* The one string builder (base/strbuf.h). */
#include "base/strbuf.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Room for `more` bytes after the text and its NUL. 0, or -1 (b->oom). */
static int reserve(fb_sb *b, size_t more) {
  if (b->oom) return -1;
  if (more > (size_t)-1 - b->n - 1) { /* the length itself would overflow */
    b->oom = 1;
    return -1;
  }
  if (b->n + more + 1 <= b->cap) return 0;
  size_t nc = b->cap ? b->cap : 256;
  while (nc < b->n + more + 1) {
    if (nc > (size_t)-1 / 2) {
      b->oom = 1;
      return -1;
    }
    nc *= 2;
  }
  char *q = realloc(b->p, nc);
  if (!q) {
    b->oom = 1;
    return -1;
  }
  b->p = q;
  b->cap = nc;
  return 0;
}

void fb_sb_putn(fb_sb *b, const char *s, size_t n) {
  if (reserve(b, n)) return;
  memcpy(b->p + b->n, s, n);
  b->n += n;
  b->p[b->n] = 0;
}

void fb_sb_puts(fb_sb *b, const char *s) { fb_sb_putn(b, s, strlen(s)); }

void fb_sb_vprintf(fb_sb *b, const char *fmt, va_list ap) {
  if (b->oom) return;
  va_list again;
  va_copy(again, ap);
  size_t room = b->p ? b->cap - b->n : 0;
  int w = vsnprintf(b->p ? b->p + b->n : NULL, room, fmt, ap);
  if (w < 0) {
    b->oom = 1; /* an encoding error: the text would be incomplete */
  } else if ((size_t)w < room) {
    b->n += (size_t)w; /* it fitted */
  } else if (!reserve(b, (size_t)w)) {
    vsnprintf(b->p + b->n, b->cap - b->n, fmt, again);
    b->n += (size_t)w;
  }
  va_end(again);
  if (b->p) b->p[b->n] = 0; /* after a cut first try, the text as it was */
}

void fb_sb_printf(fb_sb *b, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fb_sb_vprintf(b, fmt, ap);
  va_end(ap);
}

char *fb_sb_done(fb_sb *b) {
  if (!b->oom && !b->p) fb_sb_putn(b, "", 0);
  char *out = b->oom ? NULL : b->p;
  if (!out) free(b->p);
  *b = (fb_sb){0};
  return out;
}

void fb_sb_free(fb_sb *b) {
  free(b->p);
  *b = (fb_sb){0};
}
