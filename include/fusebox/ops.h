/* The op table of the kernel IR: every op is described once here and the enum,
 * the names, the printer/parser and the verifier's arity and type rules are
 * generated from it (include this file with FB_OP defined).
 *
 *   FB_OP(ENUM, "text", nargs, class, flags)
 *
 * nargs: fixed operand count, or -1 for ops that take the indices of a global
 *        access (their count is the dimension of the SNode they name).
 * class: the verifier's type rule (see FB_OPC_* in include/fusebox/ir.h).
 * flags: FB_OPF_* bits (pure, side effect, block, names an SNode, ...).
 *        FB_OPF_INTERNAL marks the ops that only the engine makes (lowering
 *        and the optimizer): they address session scratch memory or runtime
 *        lists directly, so kernels from clients may not contain them
 *        (fb_kernel_check_public).
 *
 * Operand conventions (args[] holds statement ids):
 *   global ops  load/store/atomic_*:   snode = place; args = indices..., [value]
 *   sparse ops  is_active/activate/deactivate: snode = any SNode; args = indices
 *               append: snode = place under a dynamic; args = indices..., value
 *               length: snode = place under a dynamic; args = indices above it
 *   loops       range_for/par_for: args = begin, end; body
 *               struct_for: snode; body.  while: body (leave with break)
 *   if          args = cond; body = then, orelse = else (may be -1)
 *   loop_index  args = loop statement; imm.i = which index (0 for ranges)
 *   arg         imm.i = parameter number; type = parameter type
 *   ret         args = value; imm.i = return slot
 *   alloca      type = the variable's type; lload args = var; lstore args = var, value
 *   gtmp_load   imm.i = byte offset in the session scratch buffer; gtmp_store args = value
 *   rand        imm.i = call site; type f32
 *   clear_list / listgen / gc: snode = a sparse container; no operands; in
 *               the kernel body only (tasks the lowering makes for sparse
 *               struct-fors and deactivation: see docs/sparse.md)
 *   assume_unique args = index value; snode = the field it covers
 *   store_na / atomic_*_na: as store / atomic_*, but never activate: made by
 *               the optimizer's activation demotion, which proved the cell
 *               active (on an inactive cell the write is skipped)
 *   rand_seq    imm.i = launch offset d: later rand() calls of this task
 *               (up to the next rand_seq) use launch number = the task's
 *               launch + d and count from 0 again (fusion keeps each fused
 *               part's rand() values; see optimizer/sfg.h)
 */
#ifndef FB_OP
#error "define FB_OP before including fusebox/ops.h"
#endif

/* values */
FB_OP(CONST, "const", 0, FB_OPC_CONST, FB_OPF_PURE)
FB_OP(ARG, "arg", 0, FB_OPC_ARG, FB_OPF_PURE)
FB_OP(CAST, "cast", 1, FB_OPC_CAST, FB_OPF_PURE)
FB_OP(SELECT, "select", 3, FB_OPC_SELECT, FB_OPF_PURE)
/* binary arithmetic: operands and result of one numeric type */
FB_OP(ADD, "add", 2, FB_OPC_ARITH, FB_OPF_PURE)
FB_OP(SUB, "sub", 2, FB_OPC_ARITH, FB_OPF_PURE)
FB_OP(MUL, "mul", 2, FB_OPC_ARITH, FB_OPF_PURE)
FB_OP(DIV, "div", 2, FB_OPC_ARITH, FB_OPF_PURE) /* ints: truncating; x/0 = 0 */
FB_OP(REM, "rem", 2, FB_OPC_ARITH, FB_OPF_PURE) /* C remainder; ints x%0 = 0 */
FB_OP(FLOORDIV, "floordiv", 2, FB_OPC_ARITH, FB_OPF_PURE) /* Python // */
FB_OP(FLOORMOD, "floormod", 2, FB_OPC_ARITH, FB_OPF_PURE) /* Python %, sign of divisor */
FB_OP(MIN, "min", 2, FB_OPC_ARITH, FB_OPF_PURE)
FB_OP(MAX, "max", 2, FB_OPC_ARITH, FB_OPF_PURE)
FB_OP(POW, "pow", 2, FB_OPC_FARITH, FB_OPF_PURE)
FB_OP(ATAN2, "atan2", 2, FB_OPC_FARITH, FB_OPF_PURE)
/* comparisons: operands of one type, result bool */
FB_OP(EQ, "eq", 2, FB_OPC_CMP, FB_OPF_PURE)
FB_OP(NE, "ne", 2, FB_OPC_CMP, FB_OPF_PURE)
FB_OP(LT, "lt", 2, FB_OPC_CMP, FB_OPF_PURE)
FB_OP(LE, "le", 2, FB_OPC_CMP, FB_OPF_PURE)
FB_OP(GT, "gt", 2, FB_OPC_CMP, FB_OPF_PURE)
FB_OP(GE, "ge", 2, FB_OPC_CMP, FB_OPF_PURE)
/* bits and logic: integers or bool */
FB_OP(AND, "and", 2, FB_OPC_BITS, FB_OPF_PURE)
FB_OP(OR, "or", 2, FB_OPC_BITS, FB_OPF_PURE)
FB_OP(XOR, "xor", 2, FB_OPC_BITS, FB_OPF_PURE)
FB_OP(SHL, "shl", 2, FB_OPC_SHIFT, FB_OPF_PURE) /* count taken mod bit width */
FB_OP(SHR, "shr", 2, FB_OPC_SHIFT, FB_OPF_PURE) /* arithmetic for signed */
FB_OP(NOT, "not", 1, FB_OPC_NOT, FB_OPF_PURE) /* bitwise; logical on bool */
/* unary arithmetic */
FB_OP(NEG, "neg", 1, FB_OPC_UNARY, FB_OPF_PURE)
FB_OP(ABS, "abs", 1, FB_OPC_UNARY, FB_OPF_PURE)
/* unary math on floats */
FB_OP(SQRT, "sqrt", 1, FB_OPC_FUNARY, FB_OPF_PURE)
FB_OP(RSQRT, "rsqrt", 1, FB_OPC_FUNARY, FB_OPF_PURE)
FB_OP(SIN, "sin", 1, FB_OPC_FUNARY, FB_OPF_PURE)
FB_OP(COS, "cos", 1, FB_OPC_FUNARY, FB_OPF_PURE)
FB_OP(TAN, "tan", 1, FB_OPC_FUNARY, FB_OPF_PURE)
FB_OP(ASIN, "asin", 1, FB_OPC_FUNARY, FB_OPF_PURE)
FB_OP(ACOS, "acos", 1, FB_OPC_FUNARY, FB_OPF_PURE)
FB_OP(ATAN, "atan", 1, FB_OPC_FUNARY, FB_OPF_PURE)
FB_OP(EXP, "exp", 1, FB_OPC_FUNARY, FB_OPF_PURE)
FB_OP(LOG, "log", 1, FB_OPC_FUNARY, FB_OPF_PURE)
FB_OP(FLOOR, "floor", 1, FB_OPC_FUNARY, FB_OPF_PURE)
FB_OP(CEIL, "ceil", 1, FB_OPC_FUNARY, FB_OPF_PURE)
FB_OP(ROUND, "round", 1, FB_OPC_FUNARY, FB_OPF_PURE) /* half away from zero */
/* local variables */
FB_OP(ALLOCA, "alloca", 0, FB_OPC_ALLOCA, 0)
FB_OP(LLOAD, "lload", 1, FB_OPC_LLOAD, 0)
FB_OP(LSTORE, "lstore", 2, FB_OPC_LSTORE, FB_OPF_SIDE)
/* global memory: field[indices] */
FB_OP(LOAD, "load", -1, FB_OPC_GLOAD, FB_OPF_SNODE | FB_OPF_READS)
FB_OP(STORE, "store", -1, FB_OPC_GSTORE, FB_OPF_SNODE | FB_OPF_WRITES | FB_OPF_SIDE)
FB_OP(ATOMIC_ADD, "atomic_add", -1, FB_OPC_ATOMIC,
      FB_OPF_SNODE | FB_OPF_READS | FB_OPF_WRITES | FB_OPF_SIDE)
FB_OP(ATOMIC_SUB, "atomic_sub", -1, FB_OPC_ATOMIC,
      FB_OPF_SNODE | FB_OPF_READS | FB_OPF_WRITES | FB_OPF_SIDE)
FB_OP(ATOMIC_MIN, "atomic_min", -1, FB_OPC_ATOMIC,
      FB_OPF_SNODE | FB_OPF_READS | FB_OPF_WRITES | FB_OPF_SIDE)
FB_OP(ATOMIC_MAX, "atomic_max", -1, FB_OPC_ATOMIC,
      FB_OPF_SNODE | FB_OPF_READS | FB_OPF_WRITES | FB_OPF_SIDE)
FB_OP(ATOMIC_AND, "atomic_and", -1, FB_OPC_IATOMIC,
      FB_OPF_SNODE | FB_OPF_READS | FB_OPF_WRITES | FB_OPF_SIDE)
FB_OP(ATOMIC_OR, "atomic_or", -1, FB_OPC_IATOMIC,
      FB_OPF_SNODE | FB_OPF_READS | FB_OPF_WRITES | FB_OPF_SIDE)
FB_OP(ATOMIC_XOR, "atomic_xor", -1, FB_OPC_IATOMIC,
      FB_OPF_SNODE | FB_OPF_READS | FB_OPF_WRITES | FB_OPF_SIDE)
/* sparse data structures */
FB_OP(IS_ACTIVE, "is_active", -1, FB_OPC_SPARSE, FB_OPF_SNODE | FB_OPF_READS)
FB_OP(ACTIVATE, "activate", -1, FB_OPC_SPARSE, FB_OPF_SNODE | FB_OPF_WRITES | FB_OPF_SIDE)
FB_OP(DEACTIVATE, "deactivate", -1, FB_OPC_SPARSE, FB_OPF_SNODE | FB_OPF_WRITES | FB_OPF_SIDE)
FB_OP(APPEND, "append", -1, FB_OPC_APPEND,
      FB_OPF_SNODE | FB_OPF_READS | FB_OPF_WRITES | FB_OPF_SIDE)
FB_OP(LENGTH, "length", -1, FB_OPC_LENGTH, FB_OPF_SNODE | FB_OPF_READS)
FB_OP(ASSUME_UNIQUE, "assume_unique", 1, FB_OPC_HINT, FB_OPF_SNODE | FB_OPF_PURE)
/* loops, branches, kernel interface */
FB_OP(IF, "if", 1, FB_OPC_IF, FB_OPF_BLOCK)
FB_OP(WHILE, "while", 0, FB_OPC_LOOP, FB_OPF_BLOCK)
FB_OP(RANGE_FOR, "range_for", 2, FB_OPC_RANGE, FB_OPF_BLOCK)
FB_OP(PAR_FOR, "par_for", 2, FB_OPC_RANGE, FB_OPF_BLOCK)
FB_OP(STRUCT_FOR, "struct_for", 0, FB_OPC_STRUCT, FB_OPF_BLOCK | FB_OPF_SNODE)
FB_OP(BREAK, "break", 0, FB_OPC_JUMP, FB_OPF_SIDE)
FB_OP(CONTINUE, "continue", 0, FB_OPC_JUMP, FB_OPF_SIDE)
FB_OP(LOOP_INDEX, "loop_index", 1, FB_OPC_LOOPIDX, FB_OPF_PURE)
FB_OP(RET, "ret", 1, FB_OPC_RET, FB_OPF_SIDE)
FB_OP(GTMP_LOAD, "gtmp_load", 0, FB_OPC_GTMP, FB_OPF_READS | FB_OPF_INTERNAL)
FB_OP(GTMP_STORE, "gtmp_store", 1, FB_OPC_GTMP, FB_OPF_WRITES | FB_OPF_SIDE | FB_OPF_INTERNAL)
FB_OP(RAND, "rand", 0, FB_OPC_RAND, 0)
/* sparse runtime tasks */
FB_OP(CLEAR_LIST, "clear_list", 0, FB_OPC_LIST,
      FB_OPF_SNODE | FB_OPF_WRITES | FB_OPF_SIDE | FB_OPF_INTERNAL)
FB_OP(LISTGEN, "listgen", 0, FB_OPC_LIST,
      FB_OPF_SNODE | FB_OPF_READS | FB_OPF_WRITES | FB_OPF_SIDE | FB_OPF_INTERNAL)
FB_OP(GC, "gc", 0, FB_OPC_LIST,
      FB_OPF_SNODE | FB_OPF_READS | FB_OPF_WRITES | FB_OPF_SIDE | FB_OPF_INTERNAL)
/* optimizer variants: demoted (non-activating) writes, fused rand() streams */
FB_OP(STORE_NA, "store_na", -1, FB_OPC_GSTORE,
      FB_OPF_SNODE | FB_OPF_WRITES | FB_OPF_SIDE | FB_OPF_INTERNAL)
FB_OP(ATOMIC_ADD_NA, "atomic_add_na", -1, FB_OPC_ATOMIC,
      FB_OPF_SNODE | FB_OPF_READS | FB_OPF_WRITES | FB_OPF_SIDE | FB_OPF_INTERNAL)
FB_OP(ATOMIC_SUB_NA, "atomic_sub_na", -1, FB_OPC_ATOMIC,
      FB_OPF_SNODE | FB_OPF_READS | FB_OPF_WRITES | FB_OPF_SIDE | FB_OPF_INTERNAL)
FB_OP(ATOMIC_MIN_NA, "atomic_min_na", -1, FB_OPC_ATOMIC,
      FB_OPF_SNODE | FB_OPF_READS | FB_OPF_WRITES | FB_OPF_SIDE | FB_OPF_INTERNAL)
FB_OP(ATOMIC_MAX_NA, "atomic_max_na", -1, FB_OPC_ATOMIC,
      FB_OPF_SNODE | FB_OPF_READS | FB_OPF_WRITES | FB_OPF_SIDE | FB_OPF_INTERNAL)
FB_OP(ATOMIC_AND_NA, "atomic_and_na", -1, FB_OPC_IATOMIC,
      FB_OPF_SNODE | FB_OPF_READS | FB_OPF_WRITES | FB_OPF_SIDE | FB_OPF_INTERNAL)
FB_OP(ATOMIC_OR_NA, "atomic_or_na", -1, FB_OPC_IATOMIC,
      FB_OPF_SNODE | FB_OPF_READS | FB_OPF_WRITES | FB_OPF_SIDE | FB_OPF_INTERNAL)
FB_OP(ATOMIC_XOR_NA, "atomic_xor_na", -1, FB_OPC_IATOMIC,
      FB_OPF_SNODE | FB_OPF_READS | FB_OPF_WRITES | FB_OPF_SIDE | FB_OPF_INTERNAL)
FB_OP(RAND_SEQ, "rand_seq", 0, FB_OPC_RAND, FB_OPF_SIDE | FB_OPF_INTERNAL)
