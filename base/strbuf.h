/* The one string builder of every folder: text appended piece by piece
 * (the IR printer, the SFG dump, the /metrics exposition, the scheduler's
 * metrics) into one malloc'd, always NUL-terminated buffer.
 *
 *   fb_sb b = {0};
 *   fb_sb_printf(&b, "%d kernels\n", n);
 *   char *s = fb_sb_done(&b); // the text, or NULL when out of memory
 *
 * An allocation that fails sets b.oom and every later append does nothing,
 * so a caller checks once at the end (fb_sb_done) rather than after each
 * piece. b.p and b.n (the length, without the NUL) may be read at any
 * time; b.p is NULL until something is appended. */
#ifndef FB_BASE_STRBUF_H
#define FB_BASE_STRBUF_H

#include <stdarg.h>
#include <stddef.h>

typedef struct fb_sb {
  char *p;      /* the text so far (NUL-terminated), or NULL */
  size_t n;     /* its length */
  size_t cap;   /* bytes allocated at p */
  int oom;      /* an allocation failed: the text is incomplete */
} fb_sb;

/* Append n bytes of s / the string s / formatted text. */
void fb_sb_putn(fb_sb *b, const char *s, size_t n);
void fb_sb_puts(fb_sb *b, const char *s);
void fb_sb_printf(fb_sb *b, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
void fb_sb_vprintf(fb_sb *b, const char *fmt, va_list ap);

/* The text (the caller frees it; "" when nothing was appended), or NULL
 * when an allocation failed (the buffer is then freed). b is left empty. */
char *fb_sb_done(fb_sb *b);
/* Give the memory back; b is empty and usable. */
void fb_sb_free(fb_sb *b);

#endif
