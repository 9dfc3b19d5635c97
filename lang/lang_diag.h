/* Diagnostics of the .fbk front end: lang_err, with which every stage
 * (lexer, parser, layout builder, lowering) reports an error at a source
 * position, and the printer that shows a diagnostic with its source line
 * and a caret under the column (fb_diag_render and fb_diags_render of
 * include/fusebox/lang.h, warnings as well as errors). lang_diag.c. */
#ifndef FB_LANG_DIAG_H
#define FB_LANG_DIAG_H

#include "fusebox/ir.h" /* fb_diags, the list every stage reports into */

/* Add an error at line:col (1-based) to d (NULL: dropped). */
void lang_err(fb_diags *d, int line, int col, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 4, 5)))
#endif
    ;

/* "file:line:col: <sev>: message\n<source line>\n<caret>\n" (malloc'd;
 * without a position "file: <sev>: message\n"); sev is "error" or
 * "warning". src may be NULL. */
char *lang_diag_render_as(const char *filename, const char *src, const fb_diag *d,
                          const char *sev);

#endif
