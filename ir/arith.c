/* The arithmetic of the IR, defined once (ir/arith.h says who uses it):
 * integer ops with their wrapping, division by zero and shift rules, float
 * ops in their own precision, comparisons and casts: one definition, so
 * that the optimizer's constant evaluation and the front end's literal
 * folding compute exactly what the interpreter does. */
#include <math.h>

#include "arith.h"

/* ---------------------------------------------------------------- values */

uint64_t fb_arith_wrap(fb_type t, uint64_t bits) {
  switch (t) {
  case FB_T_BOOL: return bits != 0;
  case FB_T_I32: return (uint64_t)(int64_t)(int32_t)(uint32_t)bits;
  case FB_T_U32: return (uint32_t)bits;
  default: return bits;
  }
}

/* An integer or bool of type t from raw bits, wrapped to t's width. */
static fb_value mk_int(fb_type t, uint64_t bits) {
  fb_value v;
  v.type = t;
  v.v.u = fb_arith_wrap(t, bits);
  return v;
}

/* ---------------------------------------------------------------- integer ops */

/* Signed division and remainder on sign-extended values: x / 0 = 0,
 * MIN / -1 wraps to MIN (computed as 0 - x in unsigned arithmetic; for i32
 * the caller's wrap to 32 bits does the same), x % -1 = 0. */
static int64_t sdiv(int64_t x, int64_t y) {
  if (y == 0) return 0;
  if (y == -1) return (int64_t)(0u - (uint64_t)x);
  return x / y;
}

static int64_t srem(int64_t x, int64_t y) {
  if (y == 0 || y == -1) return 0;
  return x % y;
}

static int64_t sfloordiv(int64_t x, int64_t y) {
  int64_t q = sdiv(x, y), r = srem(x, y);
  if (r != 0 && (r < 0) != (y < 0)) q -= 1;
  return q;
}

static int64_t sfloormod(int64_t x, int64_t y) {
  int64_t r = srem(x, y);
  if (r != 0 && (r < 0) != (y < 0)) r += y;
  return r;
}

static uint64_t udiv(uint64_t x, uint64_t y) { return y ? x / y : 0; }
static uint64_t urem(uint64_t x, uint64_t y) { return y ? x % y : 0; }

/* Arithmetic shift right of a sign-extended value without relying on the
 * implementation-defined >> of negative numbers. */
static uint64_t sar(int64_t x, unsigned c) {
  uint64_t u = (uint64_t)x;
  return x < 0 ? ~(~u >> c) : u >> c;
}

int fb_arith_int_binop(fb_op op, fb_type t, uint64_t x, uint64_t y, uint64_t *out) {
  int sg = fb_type_is_signed(t);
  int64_t sx = (int64_t)x, sy = (int64_t)y;
  unsigned c = (unsigned)(y & (uint64_t)(fb_type_bits(t) - 1));
  uint64_t r;
  switch (op) {
  case FB_OP_ADD: r = x + y; break;
  case FB_OP_SUB: r = x - y; break;
  case FB_OP_MUL: r = x * y; break;
  case FB_OP_DIV: r = sg ? (uint64_t)sdiv(sx, sy) : udiv(x, y); break;
  case FB_OP_REM: r = sg ? (uint64_t)srem(sx, sy) : urem(x, y); break;
  case FB_OP_FLOORDIV: r = sg ? (uint64_t)sfloordiv(sx, sy) : udiv(x, y); break;
  case FB_OP_FLOORMOD: r = sg ? (uint64_t)sfloormod(sx, sy) : urem(x, y); break;
  case FB_OP_MIN: r = sg ? (sx < sy ? x : y) : (x < y ? x : y); break;
  case FB_OP_MAX: r = sg ? (sx > sy ? x : y) : (x > y ? x : y); break;
  case FB_OP_AND: r = x & y; break;
  case FB_OP_OR: r = x | y; break;
  case FB_OP_XOR: r = x ^ y; break;
  case FB_OP_SHL: r = x << c; break;
  case FB_OP_SHR: r = sg ? sar(sx, c) : x >> c; break;
  default: return -1;
  }
  *out = fb_arith_wrap(t, r);
  return 0;
}

int fb_arith_int_unop(fb_op op, fb_type t, uint64_t a, uint64_t *out) {
  if (op == FB_OP_NOT) {
    if (t == FB_T_BOOL) {
      *out = !a;
      return 0;
    }
    if (!fb_type_is_int(t)) return -1;
    *out = fb_arith_wrap(t, ~a);
    return 0;
  }
  if (!fb_type_is_int(t)) return -1;
  if (op == FB_OP_NEG) *out = fb_arith_wrap(t, 0u - a);
  else if (op == FB_OP_ABS)
    *out = fb_arith_wrap(t, fb_type_is_signed(t) && (int64_t)a < 0 ? 0u - a : a);
  else return -1;
  return 0;
}

/* ---------------------------------------------------------------- float ops */

/* Python's % on floats: fmod, then moved to the sign of the divisor. */
static float floormod_f32(float a, float b) {
  float r = fmodf(a, b);
  if (r != 0 && (r < 0) != (b < 0)) r += b;
  return r;
}

static double floormod_f64(double a, double b) {
  double r = fmod(a, b);
  if (r != 0 && (r < 0) != (b < 0)) r += b;
  return r;
}

int fb_arith_f32_binop(fb_op op, float a, float b, float *out) {
  switch (op) {
  case FB_OP_ADD: *out = a + b; break;
  case FB_OP_SUB: *out = a - b; break;
  case FB_OP_MUL: *out = a * b; break;
  case FB_OP_DIV: *out = a / b; break;
  case FB_OP_REM: *out = fmodf(a, b); break;
  case FB_OP_FLOORDIV: {
    float q = a / b;
    *out = floorf(q);
    break;
  }
  case FB_OP_FLOORMOD: *out = floormod_f32(a, b); break;
  case FB_OP_MIN: *out = fminf(a, b); break;
  case FB_OP_MAX: *out = fmaxf(a, b); break;
  case FB_OP_POW: *out = powf(a, b); break;
  case FB_OP_ATAN2: *out = atan2f(a, b); break;
  default: return -1;
  }
  return 0;
}

int fb_arith_f64_binop(fb_op op, double a, double b, double *out) {
  switch (op) {
  case FB_OP_ADD: *out = a + b; break;
  case FB_OP_SUB: *out = a - b; break;
  case FB_OP_MUL: *out = a * b; break;
  case FB_OP_DIV: *out = a / b; break;
  case FB_OP_REM: *out = fmod(a, b); break;
  case FB_OP_FLOORDIV: {
    double q = a / b;
    *out = floor(q);
    break;
  }
  case FB_OP_FLOORMOD: *out = floormod_f64(a, b); break;
  case FB_OP_MIN: *out = fmin(a, b); break;
  case FB_OP_MAX: *out = fmax(a, b); break;
  case FB_OP_POW: *out = pow(a, b); break;
  case FB_OP_ATAN2: *out = atan2(a, b); break;
  default: return -1;
  }
  return 0;
}

int fb_arith_f32_unop(fb_op op, float a, float *out) {
  switch (op) {
  case FB_OP_NEG: *out = -a; break;
  case FB_OP_ABS: *out = fabsf(a); break;
  case FB_OP_SQRT: *out = sqrtf(a); break;
  case FB_OP_RSQRT: {
    float s = sqrtf(a);
    *out = 1.0f / s;
    break;
  }
  case FB_OP_SIN: *out = sinf(a); break;
  case FB_OP_COS: *out = cosf(a); break;
  case FB_OP_TAN: *out = tanf(a); break;
  case FB_OP_ASIN: *out = asinf(a); break;
  case FB_OP_ACOS: *out = acosf(a); break;
  case FB_OP_ATAN: *out = atanf(a); break;
  case FB_OP_EXP: *out = expf(a); break;
  case FB_OP_LOG: *out = logf(a); break;
  case FB_OP_FLOOR: *out = floorf(a); break;
  case FB_OP_CEIL: *out = ceilf(a); break;
  case FB_OP_ROUND: *out = roundf(a); break;
  default: return -1;
  }
  return 0;
}

int fb_arith_f64_unop(fb_op op, double a, double *out) {
  switch (op) {
  case FB_OP_NEG: *out = -a; break;
  case FB_OP_ABS: *out = fabs(a); break;
  case FB_OP_SQRT: *out = sqrt(a); break;
  case FB_OP_RSQRT: {
    double s = sqrt(a);
    *out = 1.0 / s;
    break;
  }
  case FB_OP_SIN: *out = sin(a); break;
  case FB_OP_COS: *out = cos(a); break;
  case FB_OP_TAN: *out = tan(a); break;
  case FB_OP_ASIN: *out = asin(a); break;
  case FB_OP_ACOS: *out = acos(a); break;
  case FB_OP_ATAN: *out = atan(a); break;
  case FB_OP_EXP: *out = exp(a); break;
  case FB_OP_LOG: *out = log(a); break;
  case FB_OP_FLOOR: *out = floor(a); break;
  case FB_OP_CEIL: *out = ceil(a); break;
  case FB_OP_ROUND: *out = round(a); break;
  default: return -1;
  }
  return 0;
}

/* ---------------------------------------------------------------- dispatch by type */

/* The integer op on tagged values. */
static int int_binop(fb_op op, fb_type t, fb_value a, fb_value b, fb_value *out) {
  uint64_t r;
  if (fb_arith_int_binop(op, t, a.v.u, b.v.u, &r)) return -1;
  *out = mk_int(t, r);
  return 0;
}

int fb_arith_binop(fb_op op, fb_type t, fb_value a, fb_value b, fb_value *out) {
  int cls = fb_op_table[op].cls;
  if (t == FB_T_BOOL) {
    if (cls != FB_OPC_BITS) return -1;
    return int_binop(op, t, a, b, out);
  }
  if (fb_type_is_int(t)) {
    if (cls == FB_OPC_FARITH) return -1;
    return int_binop(op, t, a, b, out);
  }
  if (cls != FB_OPC_ARITH && cls != FB_OPC_FARITH) return -1;
  if (t == FB_T_F32) {
    float f;
    if (fb_arith_f32_binop(op, (float)a.v.f, (float)b.v.f, &f)) return -1;
    *out = fb_value_f32(f);
    return 0;
  }
  if (t == FB_T_F64) {
    double f;
    if (fb_arith_f64_binop(op, a.v.f, b.v.f, &f)) return -1;
    *out = fb_value_f64(f);
    return 0;
  }
  return -1;
}

int fb_arith_compare(fb_op op, fb_type t, fb_value a, fb_value b) {
  if (fb_type_is_float(t)) {
    double x = a.v.f, y = b.v.f;
    switch (op) {
    case FB_OP_EQ: return x == y;
    case FB_OP_NE: return x != y;
    case FB_OP_LT: return x < y;
    case FB_OP_LE: return x <= y;
    case FB_OP_GT: return x > y;
    default: return x >= y;
    }
  }
  if (fb_type_is_signed(t)) {
    int64_t x = a.v.i, y = b.v.i;
    switch (op) {
    case FB_OP_EQ: return x == y;
    case FB_OP_NE: return x != y;
    case FB_OP_LT: return x < y;
    case FB_OP_LE: return x <= y;
    case FB_OP_GT: return x > y;
    default: return x >= y;
    }
  }
  uint64_t x = a.v.u, y = b.v.u;
  switch (op) {
  case FB_OP_EQ: return x == y;
  case FB_OP_NE: return x != y;
  case FB_OP_LT: return x < y;
  case FB_OP_LE: return x <= y;
  case FB_OP_GT: return x > y;
  default: return x >= y;
  }
}

int fb_arith_unop(fb_op op, fb_type t, fb_value a, fb_value *out) {
  if (op == FB_OP_NOT || fb_type_is_int(t)) {
    uint64_t r;
    if (fb_arith_int_unop(op, t, a.v.u, &r)) return -1;
    *out = mk_int(t, r);
    return 0;
  }
  if (t == FB_T_F32) {
    float f;
    if (fb_arith_f32_unop(op, (float)a.v.f, &f)) return -1;
    *out = fb_value_f32(f);
    return 0;
  }
  if (t == FB_T_F64) {
    double f;
    if (fb_arith_f64_unop(op, a.v.f, &f)) return -1;
    *out = fb_value_f64(f);
    return 0;
  }
  return -1;
}

/* ---------------------------------------------------------------- casts */

/* Saturating float -> integer conversion, NaN -> 0 (llvm.fpto[su]i.sat). */
static int64_t sat_s(double f, int bits) {
  if (isnan(f)) return 0;
  double lo = -ldexp(1.0, bits - 1), hi = ldexp(1.0, bits - 1);
  if (f <= lo) return bits == 64 ? INT64_MIN : (int64_t)lo;
  if (f >= hi) return bits == 64 ? INT64_MAX : (int64_t)hi - 1;
  return (int64_t)f;
}
static uint64_t sat_u(double f, int bits) {
  if (isnan(f) || f <= 0) return 0;
  double hi = ldexp(1.0, bits);
  if (f >= hi) return bits == 64 ? UINT64_MAX : (uint64_t)hi - 1;
  return (uint64_t)f;
}

fb_value fb_value_cast(fb_value x, fb_type to) {
  fb_value r;
  r.type = to;
  r.v.u = 0;
  if (fb_type_is_float(x.type)) {
    double f = x.type == FB_T_F32 ? (double)(float)x.v.f : x.v.f;
    switch (to) {
    case FB_T_BOOL: r.v.u = f != 0; break;
    case FB_T_I32: r.v.i = sat_s(f, 32); break;
    case FB_T_I64: r.v.i = sat_s(f, 64); break;
    case FB_T_U32: r.v.u = sat_u(f, 32); break;
    case FB_T_U64: r.v.u = sat_u(f, 64); break;
    case FB_T_F32: r.v.f = (float)f; break;
    case FB_T_F64: r.v.f = f; break;
    default: break;
    }
    return r;
  }
  /* integer or bool source: normalise to its own width first */
  int sgn = fb_type_is_signed(x.type);
  int64_t si = 0;
  uint64_t ui = 0;
  switch (x.type) {
  case FB_T_BOOL:
    ui = x.v.u != 0;
    si = (int64_t)ui;
    break;
  case FB_T_I32:
    si = (int32_t)x.v.i;
    ui = (uint64_t)si;
    break;
  case FB_T_I64:
    si = x.v.i;
    ui = (uint64_t)si;
    break;
  case FB_T_U32:
    ui = (uint32_t)x.v.u;
    si = (int64_t)ui;
    break;
  case FB_T_U64:
    ui = x.v.u;
    si = (int64_t)ui;
    break;
  default: break;
  }
  switch (to) {
  case FB_T_BOOL: r.v.u = ui != 0; break;
  case FB_T_I32: r.v.i = (int32_t)(uint32_t)ui; break;
  case FB_T_I64: r.v.i = (int64_t)ui; break;
  case FB_T_U32: r.v.u = (uint32_t)ui; break;
  case FB_T_U64: r.v.u = ui; break;
  case FB_T_F32: r.v.f = sgn ? (double)(float)si : (double)(float)ui; break;
  case FB_T_F64: r.v.f = sgn ? (double)si : (double)ui; break;
  default: break;
  }
  return r;
}
