/* The arithmetic of the IR: what every value op computes, defined once.
 * The reference interpreter (ir/interp.c), the optimizer's constant
 * evaluation (optimizer/meta.c, fb_eval_int) and the .fbk front end's
 * folding of untyped literals (lang/, as i64 and f64, made typed
 * constants by fb_value_cast) all call these;
 * the code generator (codegen/emit_ops.c) emits the same rules as LLVM IR,
 * and tests/test_arith.c pins the edge cases through every one of them.
 * The rules are the semantics block of include/fusebox/ir.h: integers wrap,
 * x / 0 = x % 0 = 0, INT_MIN / -1 = INT_MIN, shifts take the count modulo
 * the width (>> is arithmetic on signed types, without relying on C's
 * implementation-defined >> of negative numbers), floordiv and floormod are
 * Python's, float min/max return the non-NaN operand, float to int casts
 * saturate and NaN gives 0 (fb_value_cast, declared in fusebox/common.h).
 *
 * Integers are passed in fb_value's form: the 64-bit pattern of the value
 * sign-extended (i32) or zero-extended (u32, bool 0/1) from its width. */
#ifndef FB_IR_ARITH_H
#define FB_IR_ARITH_H

#include <stdint.h>

#include "fusebox/ir.h"

/* bits cut to t's width and extended back to 64 bits as fb_value holds it. */
uint64_t fb_arith_wrap(fb_type t, uint64_t bits);

/* Binary op (add ... max, and, or, xor, shl, shr) on integers of type t,
 * or the bit ops on bools; the shift count may come from any integer
 * type. Returns 0, or -1 when op is not one of these. */
int fb_arith_int_binop(fb_op op, fb_type t, uint64_t a, uint64_t b, uint64_t *out);
/* neg, abs and not on integers of type t (not also on bool). -1 otherwise. */
int fb_arith_int_unop(fb_op op, fb_type t, uint64_t a, uint64_t *out);

/* Float ops, computed in the type's own precision (f32 math in float). */
int fb_arith_f32_binop(fb_op op, float a, float b, float *out);
int fb_arith_f64_binop(fb_op op, double a, double b, double *out);
int fb_arith_f32_unop(fb_op op, float a, float *out);
int fb_arith_f64_unop(fb_op op, double a, double *out);

/* On tagged values of type t (both operands of type t, except a shift
 * count, which may be any integer type). Returns 0, or -1 when op does not
 * apply to t. */
int fb_arith_binop(fb_op op, fb_type t, fb_value a, fb_value b, fb_value *out);
int fb_arith_unop(fb_op op, fb_type t, fb_value a, fb_value *out);
/* eq ne lt le gt ge on two values of type t: 1 or 0. NaN compares unequal
 * to everything (ne is true when either side is NaN). */
int fb_arith_compare(fb_op op, fb_type t, fb_value a, fb_value b);

#endif
