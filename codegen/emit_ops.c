/* Lowering of value statements: constants, kernel arguments, casts, select,
 * arithmetic (with the IR's guarded integer division, Python floordiv and
 * floormod, wrapping overflow), comparisons, bit operations, shifts taken
 * modulo the width, and float math (LLVM intrinsics where exact, libm on the
 * CPU, libdevice __nv_* on NVPTX: transcendental functions and float
 * remainders are refused on NVPTX without libdevice). No fast-math flags. */
#include <stdio.h>
#include <string.h>

#include "cg_internal.h"

static const char *opname(const fb_stmt *s) { return fb_op_table[s->op].name; }

static LLVMValueRef zero_of(fb_emit *e, fb_type t) { return LLVMConstNull(fb_emit_type(e, t)); }

static LLVMValueRef int_const(fb_emit *e, fb_type t, int64_t v) {
  return LLVMConstInt(fb_emit_type(e, t), (unsigned long long)v, 1);
}

static LLVMValueRef emit_const(fb_emit *e, const fb_stmt *s) {
  switch ((fb_type)s->type) {
  case FB_T_BOOL: return LLVMConstInt(e->t_i1, s->imm.u != 0, 0);
  case FB_T_I32:
  case FB_T_U32: return LLVMConstInt(e->t_i32, (uint32_t)s->imm.u, 0);
  case FB_T_I64:
  case FB_T_U64: return LLVMConstInt(e->t_i64, s->imm.u, 0);
  case FB_T_F32: return LLVMConstReal(e->t_f32, (double)(float)s->imm.f);
  case FB_T_F64: return LLVMConstReal(e->t_f64, s->imm.f);
  default: return NULL;
  }
}

static LLVMValueRef emit_argload(fb_emit *e, int id, const fb_stmt *s) {
  int64_t i = s->imm.i;
  if (i < 0 || i >= e->k->nparams || e->k->params[i] != (fb_type)s->type) {
    fb_emit_error(e, FB_EINVAL, "%%%d arg: parameter %lld does not exist or is not %s", id,
                  (long long)i, fb_type_name((fb_type)s->type));
    return NULL;
  }
  LLVMValueRef ix = fb_emit_i64(e, i);
  LLVMValueRef p = LLVMBuildGEP2(e->b, e->t_i64, e->c_args, &ix, 1, "");
  LLVMValueRef slot = LLVMBuildLoad2(e->b, e->t_i64, p, "");
  LLVMSetAlignment(slot, 8);
  return fb_emit_unpack_slot(e, (fb_type)s->type, slot);
}

/* ---------------------------------------------------------------- casts */

static LLVMValueRef cast_from_float(fb_emit *e, fb_type from, fb_type to, LLVMValueRef v) {
  LLVMTypeRef ty = fb_emit_type(e, to);
  switch (to) {
  case FB_T_BOOL: return LLVMBuildFCmp(e->b, LLVMRealUNE, v, LLVMConstNull(LLVMTypeOf(v)), "");
  case FB_T_I32:
  case FB_T_I64: return fb_emit_intrinsic2(e, "llvm.fptosi.sat", ty, LLVMTypeOf(v), v);
  case FB_T_U32:
  case FB_T_U64: return fb_emit_intrinsic2(e, "llvm.fptoui.sat", ty, LLVMTypeOf(v), v);
  case FB_T_F32: return from == FB_T_F32 ? v : LLVMBuildFPTrunc(e->b, v, ty, "");
  case FB_T_F64: return from == FB_T_F64 ? v : LLVMBuildFPExt(e->b, v, ty, "");
  default: return NULL;
  }
}

static LLVMValueRef cast_value(fb_emit *e, fb_type from, fb_type to, LLVMValueRef v) {
  if (from == to) return v;
  if (fb_type_is_float(from)) return cast_from_float(e, from, to, v);
  LLVMTypeRef ty = fb_emit_type(e, to);
  int sgn = fb_type_is_signed(from); /* bool and unsigned widen with zeros */
  switch (to) {
  case FB_T_BOOL: return LLVMBuildICmp(e->b, LLVMIntNE, v, LLVMConstNull(LLVMTypeOf(v)), "");
  case FB_T_F32:
  case FB_T_F64: return sgn ? LLVMBuildSIToFP(e->b, v, ty, "") : LLVMBuildUIToFP(e->b, v, ty, "");
  default: {
    unsigned fw = (unsigned)fb_type_bits(from), tw = (unsigned)fb_type_bits(to);
    if (fw == tw) return v;
    if (fw > tw) return LLVMBuildTrunc(e->b, v, ty, "");
    return sgn ? LLVMBuildSExt(e->b, v, ty, "") : LLVMBuildZExt(e->b, v, ty, "");
  }
  }
}

/* ---------------------------------------------------------------- integers */

/* a / b or a % b with b == 0 giving 0 and INT_MIN / -1 wrapping. */
static LLVMValueRef int_divrem(fb_emit *e, fb_type t, LLVMValueRef a, LLVMValueRef b, int rem) {
  LLVMValueRef zero = zero_of(e, t), one = int_const(e, t, 1);
  LLVMValueRef bz = LLVMBuildICmp(e->b, LLVMIntEQ, b, zero, "");
  LLVMValueRef sb = LLVMBuildSelect(e->b, bz, one, b, "");
  LLVMValueRef r;
  if (fb_type_is_signed(t)) {
    int64_t mn = t == FB_T_I32 ? INT32_MIN : INT64_MIN;
    LLVMValueRef ovf =
        LLVMBuildAnd(e->b, LLVMBuildICmp(e->b, LLVMIntEQ, a, int_const(e, t, mn), ""),
                     LLVMBuildICmp(e->b, LLVMIntEQ, b, int_const(e, t, -1), ""), "");
    sb = LLVMBuildSelect(e->b, ovf, one, sb, "");
    r = rem ? LLVMBuildSRem(e->b, a, sb, "") : LLVMBuildSDiv(e->b, a, sb, "");
  } else {
    r = rem ? LLVMBuildURem(e->b, a, sb, "") : LLVMBuildUDiv(e->b, a, sb, "");
  }
  return LLVMBuildSelect(e->b, bz, zero, r, "");
}

/* Python //: the truncated quotient, one less when the remainder is
 * nonzero and its sign differs from the divisor's. */
static LLVMValueRef int_floordiv(fb_emit *e, fb_type t, LLVMValueRef a, LLVMValueRef b) {
  LLVMValueRef q = int_divrem(e, t, a, b, 0);
  if (!fb_type_is_signed(t)) return q;
  LLVMValueRef r = int_divrem(e, t, a, b, 1);
  LLVMValueRef zero = zero_of(e, t);
  LLVMValueRef adj =
      LLVMBuildAnd(e->b, LLVMBuildICmp(e->b, LLVMIntNE, r, zero, ""),
                   LLVMBuildICmp(e->b, LLVMIntSLT, LLVMBuildXor(e->b, r, b, ""), zero, ""), "");
  return LLVMBuildSub(e->b, q, LLVMBuildZExt(e->b, adj, LLVMTypeOf(q), ""), "");
}

/* Python %: the remainder (0 for b == 0), moved by b when nonzero and its
 * sign differs from the divisor's. */
static LLVMValueRef int_floormod(fb_emit *e, fb_type t, LLVMValueRef a, LLVMValueRef b) {
  LLVMValueRef r = int_divrem(e, t, a, b, 1);
  if (!fb_type_is_signed(t)) return r;
  LLVMValueRef zero = zero_of(e, t);
  LLVMValueRef adj =
      LLVMBuildAnd(e->b, LLVMBuildICmp(e->b, LLVMIntNE, r, zero, ""),
                   LLVMBuildICmp(e->b, LLVMIntSLT, LLVMBuildXor(e->b, r, b, ""), zero, ""), "");
  return LLVMBuildSelect(e->b, adj, LLVMBuildAdd(e->b, r, b, ""), r, "");
}

static LLVMValueRef int_minmax(fb_emit *e, fb_type t, LLVMValueRef a, LLVMValueRef b, int max) {
  int sgn = fb_type_is_signed(t);
  LLVMIntPredicate p = max ? (sgn ? LLVMIntSGT : LLVMIntUGT) : (sgn ? LLVMIntSLT : LLVMIntULT);
  return LLVMBuildSelect(e->b, LLVMBuildICmp(e->b, p, a, b, ""), a, b, "");
}

/* ---------------------------------------------------------------- float math */

/* The name of a math function for type t on the current target:
 * libm ("sinf"/"sin") on the CPU, libdevice ("__nv_sinf"/"__nv_sin") on
 * NVPTX when it is linked, else NULL. */
static const char *math_name(fb_emit *e, const char *base, fb_type t, char *buf, size_t n) {
  const char *suffix = t == FB_T_F32 ? "f" : "";
  if (e->o->target == FB_CG_CPU) snprintf(buf, n, "%s%s", base, suffix);
  else if (e->o->libdevice) snprintf(buf, n, "__nv_%s%s", base, suffix);
  else return NULL;
  return buf;
}

/* Call math function `base` (1 or 2 operands). NVPTX without libdevice has
 * no exact implementation (its intrinsics would need fast-math), so the
 * statement is refused there. */
static LLVMValueRef math_call(fb_emit *e, int id, const char *base, fb_type t, LLVMValueRef *args,
                              unsigned n) {
  char buf[32];
  const char *name = math_name(e, base, t, buf, sizeof buf);
  if (name) return fb_emit_call(e, name, fb_emit_type(e, t), args, n);
  (void)id; /* the user's terms: the kernel and the function, not the statement */
  int rem = strcmp(base, "fmod") == 0;
  const char *kname;
  int klen = fb_emit_kernel_name(e, &kname);
  fb_emit_error(e, FB_EUNSUPPORTED,
                "kernel '%.*s' uses %s%s, which on the GPU needs CUDA's libdevice "
                "(not found at %s; set CUDA_HOME to the CUDA toolkit, or FB_LIBDEVICE "
                "to libdevice.10.bc)",
                klen, kname, rem ? "% on floats" : base,
                rem ? "" : "()", fb_ptx_libdevice_where());
  return NULL;
}

static LLVMValueRef float_rem(fb_emit *e, int id, fb_type t, LLVMValueRef a, LLVMValueRef b) {
  if (e->o->target == FB_CG_NVPTX) {
    LLVMValueRef args[2] = {a, b};
    return math_call(e, id, "fmod", t, args, 2);
  }
  return LLVMBuildFRem(e->b, a, b, "");
}

/* Python % on floats: fmod, then r += b when r != 0 and signs differ. */
static LLVMValueRef float_floormod(fb_emit *e, int id, fb_type t, LLVMValueRef a, LLVMValueRef b) {
  LLVMValueRef r = float_rem(e, id, t, a, b);
  if (!r) return NULL;
  LLVMValueRef zero = zero_of(e, t);
  LLVMValueRef nz = LLVMBuildFCmp(e->b, LLVMRealUNE, r, zero, "");
  LLVMValueRef rneg = LLVMBuildFCmp(e->b, LLVMRealOLT, r, zero, "");
  LLVMValueRef bneg = LLVMBuildFCmp(e->b, LLVMRealOLT, b, zero, "");
  LLVMValueRef adj = LLVMBuildAnd(e->b, nz, LLVMBuildXor(e->b, rneg, bneg, ""), "");
  return LLVMBuildSelect(e->b, adj, LLVMBuildFAdd(e->b, r, b, ""), r, "");
}

static LLVMValueRef float_arith(fb_emit *e, int id, const fb_stmt *s, LLVMValueRef a,
                                LLVMValueRef b) {
  fb_type t = (fb_type)s->type;
  LLVMTypeRef ty = fb_emit_type(e, t);
  LLVMValueRef ab[2] = {a, b};
  switch (s->op) {
  case FB_OP_ADD: return LLVMBuildFAdd(e->b, a, b, "");
  case FB_OP_SUB: return LLVMBuildFSub(e->b, a, b, "");
  case FB_OP_MUL: return LLVMBuildFMul(e->b, a, b, "");
  case FB_OP_DIV: return LLVMBuildFDiv(e->b, a, b, "");
  case FB_OP_REM: return float_rem(e, id, t, a, b);
  case FB_OP_FLOORDIV: {
    LLVMValueRef q = LLVMBuildFDiv(e->b, a, b, "");
    return fb_emit_intrinsic(e, "llvm.floor", ty, &q, 1);
  }
  case FB_OP_FLOORMOD: return float_floormod(e, id, t, a, b);
  case FB_OP_MIN: return fb_emit_intrinsic(e, "llvm.minnum", ty, ab, 2);
  case FB_OP_MAX: return fb_emit_intrinsic(e, "llvm.maxnum", ty, ab, 2);
  case FB_OP_POW: return math_call(e, id, "pow", t, ab, 2);
  case FB_OP_ATAN2: return math_call(e, id, "atan2", t, ab, 2);
  default: return NULL;
  }
}

static LLVMValueRef int_arith(fb_emit *e, const fb_stmt *s, LLVMValueRef a, LLVMValueRef b) {
  fb_type t = (fb_type)s->type;
  switch (s->op) {
  case FB_OP_ADD: return LLVMBuildAdd(e->b, a, b, "");
  case FB_OP_SUB: return LLVMBuildSub(e->b, a, b, "");
  case FB_OP_MUL: return LLVMBuildMul(e->b, a, b, "");
  case FB_OP_DIV: return int_divrem(e, t, a, b, 0);
  case FB_OP_REM: return int_divrem(e, t, a, b, 1);
  case FB_OP_FLOORDIV: return int_floordiv(e, t, a, b);
  case FB_OP_FLOORMOD: return int_floormod(e, t, a, b);
  case FB_OP_MIN: return int_minmax(e, t, a, b, 0);
  case FB_OP_MAX: return int_minmax(e, t, a, b, 1);
  default: return NULL;
  }
}

static LLVMValueRef emit_binary(fb_emit *e, int id, const fb_stmt *s) {
  LLVMValueRef a = fb_emit_arg(e, s, 0), b = fb_emit_arg(e, s, 1);
  if (!a || !b) return NULL;
  fb_type t = (fb_type)s->type;
  if (fb_emit_argtype(e, s, 0) != t || fb_emit_argtype(e, s, 1) != t || t == FB_T_BOOL ||
      (fb_op_table[s->op].cls == FB_OPC_FARITH && !fb_type_is_float(t))) {
    fb_emit_error(e, FB_EINVAL, "%%%d %s: operands must both be %s", id, opname(s),
                  fb_type_name(t));
    return NULL;
  }
  LLVMValueRef r = fb_type_is_float(t) ? float_arith(e, id, s, a, b) : int_arith(e, s, a, b);
  if (!r && !e->rc)
    fb_emit_error(e, FB_EINVAL, "%%%d %s: not defined on %s", id, opname(s), fb_type_name(t));
  return r;
}

/* ---------------------------------------------------------------- compare, bits */

static LLVMValueRef emit_cmp(fb_emit *e, int id, const fb_stmt *s) {
  LLVMValueRef a = fb_emit_arg(e, s, 0), b = fb_emit_arg(e, s, 1);
  if (!a || !b) return NULL;
  fb_type t = fb_emit_argtype(e, s, 0);
  if (fb_emit_argtype(e, s, 1) != t || t == FB_T_VOID) {
    fb_emit_error(e, FB_EINVAL, "%%%d %s: operands differ in type", id, opname(s));
    return NULL;
  }
  int k = s->op - FB_OP_EQ; /* eq ne lt le gt ge */
  if (fb_type_is_float(t)) {
    static const LLVMRealPredicate fp[6] = {LLVMRealOEQ, LLVMRealUNE, LLVMRealOLT,
                                            LLVMRealOLE, LLVMRealOGT, LLVMRealOGE};
    return LLVMBuildFCmp(e->b, fp[k], a, b, "");
  }
  static const LLVMIntPredicate sp[6] = {LLVMIntEQ,  LLVMIntNE,  LLVMIntSLT,
                                         LLVMIntSLE, LLVMIntSGT, LLVMIntSGE};
  static const LLVMIntPredicate up[6] = {LLVMIntEQ,  LLVMIntNE,  LLVMIntULT,
                                         LLVMIntULE, LLVMIntUGT, LLVMIntUGE};
  return LLVMBuildICmp(e->b, fb_type_is_signed(t) ? sp[k] : up[k], a, b, "");
}

static LLVMValueRef emit_bits(fb_emit *e, int id, const fb_stmt *s) {
  LLVMValueRef a = fb_emit_arg(e, s, 0), b = fb_emit_arg(e, s, 1);
  if (!a || !b) return NULL;
  fb_type t = (fb_type)s->type;
  if (fb_type_is_float(t) || fb_emit_argtype(e, s, 0) != t || fb_emit_argtype(e, s, 1) != t) {
    fb_emit_error(e, FB_EINVAL, "%%%d %s: operands must both be %s integers or bools", id,
                  opname(s), fb_type_name(t));
    return NULL;
  }
  switch (s->op) {
  case FB_OP_AND: return LLVMBuildAnd(e->b, a, b, "");
  case FB_OP_OR: return LLVMBuildOr(e->b, a, b, "");
  default: return LLVMBuildXor(e->b, a, b, "");
  }
}

/* Shift by the count modulo the width of the shifted type. */
static LLVMValueRef emit_shift(fb_emit *e, int id, const fb_stmt *s) {
  LLVMValueRef a = fb_emit_arg(e, s, 0), c = fb_emit_arg(e, s, 1);
  if (!a || !c) return NULL;
  fb_type t = (fb_type)s->type, ct = fb_emit_argtype(e, s, 1);
  if (!fb_type_is_int(t) || fb_emit_argtype(e, s, 0) != t || !fb_type_is_int(ct)) {
    fb_emit_error(e, FB_EINVAL, "%%%d %s: shifts take integers", id, opname(s));
    return NULL;
  }
  int w = fb_type_bits(t);
  c = cast_value(
      e, ct,
      fb_type_is_signed(ct) ? (w == 64 ? FB_T_I64 : FB_T_I32) : (w == 64 ? FB_T_U64 : FB_T_U32), c);
  c = LLVMBuildAnd(e->b, c, int_const(e, t, w - 1), "");
  if (s->op == FB_OP_SHL) return LLVMBuildShl(e->b, a, c, "");
  return fb_type_is_signed(t) ? LLVMBuildAShr(e->b, a, c, "") : LLVMBuildLShr(e->b, a, c, "");
}

/* ---------------------------------------------------------------- unary */

static LLVMValueRef emit_unary(fb_emit *e, int id, const fb_stmt *s) {
  LLVMValueRef a = fb_emit_arg(e, s, 0);
  if (!a) return NULL;
  fb_type t = (fb_type)s->type;
  if (fb_emit_argtype(e, s, 0) != t) {
    fb_emit_error(e, FB_EINVAL, "%%%d %s: operand is not %s", id, opname(s), fb_type_name(t));
    return NULL;
  }
  if (s->op == FB_OP_NOT) {
    if (fb_type_is_float(t)) goto bad;
    return LLVMBuildNot(e->b, a, "");
  }
  if (t == FB_T_BOOL) goto bad;
  if (fb_type_is_float(t)) {
    if (s->op == FB_OP_NEG) return LLVMBuildFNeg(e->b, a, "");
    return fb_emit_intrinsic(e, "llvm.fabs", fb_emit_type(e, t), &a, 1);
  }
  if (s->op == FB_OP_NEG) return LLVMBuildNeg(e->b, a, "");
  if (!fb_type_is_signed(t)) return a;
  LLVMValueRef neg = LLVMBuildICmp(e->b, LLVMIntSLT, a, zero_of(e, t), "");
  return LLVMBuildSelect(e->b, neg, LLVMBuildNeg(e->b, a, ""), a, "");
bad:
  fb_emit_error(e, FB_EINVAL, "%%%d %s: not defined on %s", id, opname(s), fb_type_name(t));
  return NULL;
}

static LLVMValueRef emit_funary(fb_emit *e, int id, const fb_stmt *s) {
  LLVMValueRef a = fb_emit_arg(e, s, 0);
  if (!a) return NULL;
  fb_type t = (fb_type)s->type;
  if (!fb_type_is_float(t) || fb_emit_argtype(e, s, 0) != t) {
    fb_emit_error(e, FB_EINVAL, "%%%d %s: takes and gives a float of one type", id, opname(s));
    return NULL;
  }
  LLVMTypeRef ty = fb_emit_type(e, t);
  switch (s->op) {
  case FB_OP_SQRT: return fb_emit_intrinsic(e, "llvm.sqrt", ty, &a, 1);
  case FB_OP_RSQRT:
    return LLVMBuildFDiv(e->b, LLVMConstReal(ty, 1.0), fb_emit_intrinsic(e, "llvm.sqrt", ty, &a, 1),
                         "");
  case FB_OP_FLOOR: return fb_emit_intrinsic(e, "llvm.floor", ty, &a, 1);
  case FB_OP_CEIL: return fb_emit_intrinsic(e, "llvm.ceil", ty, &a, 1);
  case FB_OP_ROUND: return fb_emit_intrinsic(e, "llvm.round", ty, &a, 1);
  case FB_OP_SIN: return math_call(e, id, "sin", t, &a, 1);
  case FB_OP_COS: return math_call(e, id, "cos", t, &a, 1);
  case FB_OP_TAN: return math_call(e, id, "tan", t, &a, 1);
  case FB_OP_ASIN: return math_call(e, id, "asin", t, &a, 1);
  case FB_OP_ACOS: return math_call(e, id, "acos", t, &a, 1);
  case FB_OP_ATAN: return math_call(e, id, "atan", t, &a, 1);
  case FB_OP_EXP: return math_call(e, id, "exp", t, &a, 1);
  case FB_OP_LOG: return math_call(e, id, "log", t, &a, 1);
  default: return NULL;
  }
}

/* ---------------------------------------------------------------- dispatch */

int fb_emit_value_op(fb_emit *e, int id, const fb_stmt *s) {
  LLVMValueRef v = NULL;
  switch (fb_op_table[s->op].cls) {
  case FB_OPC_CONST: v = emit_const(e, s); break;
  case FB_OPC_ARG: v = emit_argload(e, id, s); break;
  case FB_OPC_CAST: {
    LLVMValueRef a = fb_emit_arg(e, s, 0);
    fb_type from = fb_emit_argtype(e, s, 0);
    if (a && from == FB_T_F32 && (fb_type)s->type == FB_T_I32 &&
        fb_cg_f32_in_range(e, s->args[0], -2147483648.0, 2147483647.0))
      v = LLVMBuildFPToSI(e->b, a, e->t_i32, ""); /* proven in range, never NaN: no saturation */
    else if (a && from != FB_T_VOID)
      v = cast_value(e, from, (fb_type)s->type, a);
    break;
  }
  case FB_OPC_SELECT: {
    LLVMValueRef c = fb_emit_arg(e, s, 0), a = fb_emit_arg(e, s, 1), b = fb_emit_arg(e, s, 2);
    if (c && a && b && fb_emit_argtype(e, s, 0) == FB_T_BOOL &&
        fb_emit_argtype(e, s, 1) == (fb_type)s->type &&
        fb_emit_argtype(e, s, 2) == (fb_type)s->type)
      v = LLVMBuildSelect(e->b, c, a, b, "");
    break;
  }
  case FB_OPC_ARITH:
  case FB_OPC_FARITH: v = emit_binary(e, id, s); break;
  case FB_OPC_CMP: v = emit_cmp(e, id, s); break;
  case FB_OPC_BITS: v = emit_bits(e, id, s); break;
  case FB_OPC_SHIFT: v = emit_shift(e, id, s); break;
  case FB_OPC_NOT:
  case FB_OPC_UNARY: v = emit_unary(e, id, s); break;
  case FB_OPC_FUNARY: v = emit_funary(e, id, s); break;
  case FB_OPC_HINT: v = fb_emit_arg(e, s, 0); break;
  default: break;
  }
  if (!v && !e->rc)
    fb_emit_error(e, FB_EINVAL, "%%%d %s: malformed statement (type %s)", id, opname(s),
                  fb_type_name((fb_type)s->type));
  e->vals[id] = v;
  return e->rc;
}
