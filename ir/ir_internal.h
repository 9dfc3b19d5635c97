/* Internal helpers shared by the files of ir/: the shared base (base/base.h:
 * growable arrays, string duplication, hashing) and the text format. */
#ifndef FB_IR_INTERNAL_H
#define FB_IR_INTERNAL_H

#include "base/base.h"
#include "fusebox/ir.h"

/* The text format (ir/print.c, shared with ir/parse.c): the operand form
 * of an op, derived from its op-table class, and the characters allowed in
 * a bare name (first: at the start). */
int fb__text_form(int op);
int fb__text_name_char(int c, int first);

#endif
