/* The reference interpreter: runs kernel IR statement by statement on host
 * memory it owns (one flat, zero-initialised, row-major array per field). It
 * is deliberately slow and literal: it is the oracle the code generator is
 * tested against, so every rule in the semantics block of include/fusebox/ir.h
 * is spelled out here once, per type, with f32 math done in float.
 *
 * Safety: every run starts with fb_verify (FB_EVERIFY when it refuses), and
 * the interpreter still checks every operand, block, SNode and slot where it
 * is used, so that IR it cannot run stops with FB_EINVAL instead of crashing
 * (the message names the statement; see fb_interp_errmsg).
 *
 * Sparse SNodes: this version runs dense layouts only. Kernels that touch a
 * field or SNode below a bitmasked/pointer/dynamic node are refused with
 * FB_EUNSUPPORTED before anything runs. Activity is funnelled through
 * cell_active() and activate_cell() so that tracking can be added there. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>

#include "ir_internal.h"

#define INTERP_MAX_DEPTH 256                 /* block nesting limit */
#define INTERP_SCRATCH_MAX ((size_t)1 << 30) /* gtmp bytes limit */

struct fb_interp {
  const fb_layout *l;
  uint64_t layout_hash;
  uint64_t seed;
  uint64_t launches; /* runs executed so far: the next run's launch number */
  void **fields;     /* per SNode id: a place's flat storage, NULL otherwise */
  uint8_t *scratch;  /* gtmp buffer, zero-filled as it grows */
  size_t scratch_bytes;
  char err[256];
};

/* How a block ended: fell through, or left by break / continue. Errors are
 * negative FB_E* codes. */
enum { FLOW_NEXT = 0, FLOW_BREAK = 1, FLOW_CONTINUE = 2 };

typedef struct run {
  fb_interp *in;
  const fb_kernel *k;
  const fb_layout *l;
  fb_value *vals;                /* per statement: last value; an alloca's content */
  int32_t (*lidx)[FB_MAX_AXES];  /* per loop statement: its current indices */
  const fb_value *args;          /* converted to the parameter types */
  fb_value ret;                  /* return slot 0 */
  uint64_t launch, iter, count;  /* rand() key */
  int bounds;                    /* FB_EBOUNDS once an access was skipped */
  int depth;
} run;

/* ---------------------------------------------------------------- errors */

static int failv(fb_interp *in, int code, const char *fmt, va_list ap) {
  vsnprintf(in->err, sizeof in->err, fmt, ap);
  return code;
}

#if defined(__GNUC__)
#define INTERP_PRINTF(f, a) __attribute__((format(printf, f, a)))
#else
#define INTERP_PRINTF(f, a)
#endif

INTERP_PRINTF(3, 4) static int fail(fb_interp *in, int code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  failv(in, code, fmt, ap);
  va_end(ap);
  return code;
}

static const char *op_name(unsigned op) {
  return op < FB_OP__COUNT ? fb_op_table[op].name : "?";
}

/* An error at statement id, reported as "%<id> <op>: <what>". */
INTERP_PRINTF(4, 5) static int bad(run *r, int code, int id, const char *fmt, ...) {
  char what[200];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(what, sizeof what, fmt, ap);
  va_end(ap);
  return fail(r->in, code, "kernel %s: %%%d %s: %s", r->k->name ? r->k->name : "?", id,
              op_name(r->k->stmts[id].op), what);
}

/* Not yet declared in include/fusebox/ir.h: the message of the last failed
 * run, and the launch number the next run keys rand() with (so that a
 * kernel's tasks can be run one by one as parts of one launch). */
const char *fb_interp_errmsg(const fb_interp *in) { return in ? in->err : ""; }

void fb_interp_set_launch(fb_interp *in, uint64_t launch) {
  if (in) in->launches = launch;
}

/* ---------------------------------------------------------------- values */

static fb_value zero_of(fb_type t) {
  fb_value v;
  v.type = t;
  v.v.u = 0;
  return v;
}

/* An integer or bool of type t from raw bits, wrapped to t's width. */
static fb_value mk_int(fb_type t, uint64_t bits) {
  fb_value v = zero_of(t);
  switch (t) {
  case FB_T_BOOL: v.v.u = bits != 0; break;
  case FB_T_I32: v.v.i = (int32_t)(uint32_t)bits; break;
  case FB_T_U32: v.v.u = (uint32_t)bits; break;
  default: v.v.u = bits; break;
  }
  return v;
}

static fb_value mk_f32(float f) { return fb_value_f32(f); }
static fb_value mk_f64(double f) { return fb_value_f64(f); }

static int is_num(fb_type t) { return fb_type_is_int(t) || fb_type_is_float(t); }
static int valid_type(int t) { return t > FB_T_VOID && t < FB_T__COUNT; }

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

/* Binary op on integers (or bool for the bit ops) of type t. Returns 0, or
 * -1 when op does not apply to integers. */
static int int_binop(fb_op op, fb_type t, fb_value a, fb_value b, fb_value *out) {
  int sg = fb_type_is_signed(t);
  uint64_t x = a.v.u, y = b.v.u;
  int64_t sx = a.v.i, sy = b.v.i;
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
  *out = mk_int(t, r);
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

static int f32_binop(fb_op op, float a, float b, float *out) {
  switch (op) {
  case FB_OP_ADD: *out = a + b; break;
  case FB_OP_SUB: *out = a - b; break;
  case FB_OP_MUL: *out = a * b; break;
  case FB_OP_DIV: *out = a / b; break;
  case FB_OP_REM: *out = fmodf(a, b); break;
  case FB_OP_FLOORDIV: { float q = a / b; *out = floorf(q); break; }
  case FB_OP_FLOORMOD: *out = floormod_f32(a, b); break;
  case FB_OP_MIN: *out = fminf(a, b); break;
  case FB_OP_MAX: *out = fmaxf(a, b); break;
  case FB_OP_POW: *out = powf(a, b); break;
  case FB_OP_ATAN2: *out = atan2f(a, b); break;
  default: return -1;
  }
  return 0;
}

static int f64_binop(fb_op op, double a, double b, double *out) {
  switch (op) {
  case FB_OP_ADD: *out = a + b; break;
  case FB_OP_SUB: *out = a - b; break;
  case FB_OP_MUL: *out = a * b; break;
  case FB_OP_DIV: *out = a / b; break;
  case FB_OP_REM: *out = fmod(a, b); break;
  case FB_OP_FLOORDIV: { double q = a / b; *out = floor(q); break; }
  case FB_OP_FLOORMOD: *out = floormod_f64(a, b); break;
  case FB_OP_MIN: *out = fmin(a, b); break;
  case FB_OP_MAX: *out = fmax(a, b); break;
  case FB_OP_POW: *out = pow(a, b); break;
  case FB_OP_ATAN2: *out = atan2(a, b); break;
  default: return -1;
  }
  return 0;
}

static int f32_unop(fb_op op, float a, float *out) {
  switch (op) {
  case FB_OP_NEG: *out = -a; break;
  case FB_OP_ABS: *out = fabsf(a); break;
  case FB_OP_SQRT: *out = sqrtf(a); break;
  case FB_OP_RSQRT: { float s = sqrtf(a); *out = 1.0f / s; break; }
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

static int f64_unop(fb_op op, double a, double *out) {
  switch (op) {
  case FB_OP_NEG: *out = -a; break;
  case FB_OP_ABS: *out = fabs(a); break;
  case FB_OP_SQRT: *out = sqrt(a); break;
  case FB_OP_RSQRT: { double s = sqrt(a); *out = 1.0 / s; break; }
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

/* Binary op on two values of type t (arithmetic, bits, shifts; the shift
 * count may be any integer type). Returns -1 when op does not apply to t. */
static int binop(fb_op op, fb_type t, fb_value a, fb_value b, fb_value *out) {
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
    if (f32_binop(op, (float)a.v.f, (float)b.v.f, &f)) return -1;
    *out = mk_f32(f);
    return 0;
  }
  if (t == FB_T_F64) {
    double f;
    if (f64_binop(op, a.v.f, b.v.f, &f)) return -1;
    *out = mk_f64(f);
    return 0;
  }
  return -1;
}

/* Comparison of two values of type t; NaN compares unequal to everything
 * (C's operators: ne is true when either side is NaN). */
static int compare(fb_op op, fb_type t, fb_value a, fb_value b) {
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

/* neg, abs, not and the float math functions. -1 when op does not apply. */
static int unop(fb_op op, fb_type t, fb_value a, fb_value *out) {
  if (op == FB_OP_NOT) {
    if (t == FB_T_BOOL) { *out = mk_int(t, !a.v.u); return 0; }
    if (!fb_type_is_int(t)) return -1;
    *out = mk_int(t, ~a.v.u);
    return 0;
  }
  if (fb_type_is_int(t)) {
    if (op == FB_OP_NEG) *out = mk_int(t, 0u - a.v.u);
    else if (op == FB_OP_ABS) *out = mk_int(t, fb_type_is_signed(t) && a.v.i < 0 ? 0u - a.v.u : a.v.u);
    else return -1;
    return 0;
  }
  if (t == FB_T_F32) {
    float f;
    if (f32_unop(op, (float)a.v.f, &f)) return -1;
    *out = mk_f32(f);
    return 0;
  }
  if (t == FB_T_F64) {
    double f;
    if (f64_unop(op, a.v.f, &f)) return -1;
    *out = mk_f64(f);
    return 0;
  }
  return -1;
}

/* ---------------------------------------------------------------- operands */

static int stmt_ok(const run *r, int id) { return id >= 0 && id < r->k->nstmts; }

/* The statement id of operand i of statement id, checked. */
static int operand_id(run *r, int id, int i, int *out) {
  const fb_stmt *s = &r->k->stmts[id];
  if (i >= s->nargs || i >= FB_MAX_ARGS) return bad(r, FB_EINVAL, id, "missing operand %d", i);
  if (!stmt_ok(r, s->args[i]))
    return bad(r, FB_EINVAL, id, "operand %d refers to %%%d, not a statement", i, (int)s->args[i]);
  *out = s->args[i];
  return 0;
}

/* The value of operand i (which must produce a value). */
static int operand(run *r, int id, int i, fb_value *v) {
  int a = -1, rc = operand_id(r, id, i, &a);
  if (rc) return rc;
  if (!valid_type(r->vals[a].type))
    return bad(r, FB_EINVAL, id, "operand %d (%%%d) has no value", i, a);
  *v = r->vals[a];
  return 0;
}

/* An operand that must be an i32 (indices, range bounds). */
static int operand_i32(run *r, int id, int i, int64_t *out) {
  fb_value v = {0};
  int rc = operand(r, id, i, &v);
  if (rc) return rc;
  if (v.type != FB_T_I32) return bad(r, FB_EINVAL, id, "operand %d must be i32", i);
  *out = v.v.i;
  return 0;
}

static int result_type(run *r, int id, fb_type want) {
  fb_type t = (fb_type)r->k->stmts[id].type;
  if (t != want)
    return bad(r, FB_EINVAL, id, "result type %s, expected %s", fb_type_name(t), fb_type_name(want));
  return 0;
}

/* ---------------------------------------------------------------- SNodes */

static int sparse_kind(fb_snode_kind k) {
  return k == FB_SN_BITMASKED || k == FB_SN_POINTER || k == FB_SN_DYNAMIC;
}

/* Whether node s or any of its ancestors is sparse. */
static int on_sparse_path(const fb_layout *l, int s) {
  for (int depth = 0; s >= 0 && s < l->nnodes && depth <= l->nnodes; depth++) {
    if (sparse_kind(l->nodes[s].kind)) return 1;
    s = l->nodes[s].parent;
  }
  return 0;
}

/* Activity of a cell (global indices of sn's index space). Every cell of a
 * dense path is active; sparse paths never reach here in this version. */
static int cell_active(run *r, const fb_snode *sn, const int64_t *idx) {
  (void)r; (void)sn; (void)idx;
  return 1;
}

/* Activation of a cell and its ancestors: nothing to do on a dense path. */
static void activate_cell(run *r, const fb_snode *sn, const int64_t *idx) {
  (void)r; (void)sn; (void)idx;
}

/* Read the first sn->ndim operands of id as indices of sn's index space.
 * *inb is cleared (and FB_EBOUNDS latched) when one is out of range; *flat
 * is the row-major element number otherwise. */
static int read_indices(run *r, int id, const fb_snode *sn, int64_t *idx, int64_t *flat,
                        int *inb) {
  *flat = 0;
  *inb = 1;
  for (int d = 0; d < sn->ndim; d++) {
    int rc = operand_i32(r, id, d, &idx[d]);
    if (rc) return rc;
    int64_t n = sn->shape[sn->dim_axis[d]];
    if (idx[d] < 0 || idx[d] >= n) *inb = 0;
    *flat = *flat * n + idx[d];
  }
  if (!*inb) r->bounds = FB_EBOUNDS;
  return 0;
}

/* The SNode a statement names, checked: a place when want_place. */
static int stmt_snode(run *r, int id, int want_place, const fb_snode **out) {
  const fb_stmt *s = &r->k->stmts[id];
  if (s->snode < 0 || s->snode >= r->l->nnodes)
    return bad(r, FB_EINVAL, id, "no SNode %d in the layout", (int)s->snode);
  const fb_snode *sn = &r->l->nodes[s->snode];
  if (want_place && sn->kind != FB_SN_PLACE)
    return bad(r, FB_EINVAL, id, "SNode %d is not a field", sn->id);
  *out = sn;
  return 0;
}

/* Operand count of a global access: the SNode's indices (+1 value). */
static int check_nargs(run *r, int id, const fb_snode *sn, int with_value) {
  int want = sn->ndim + with_value;
  if (r->k->stmts[id].nargs != want)
    return bad(r, FB_EINVAL, id, "%d operands, expected %d", r->k->stmts[id].nargs, want);
  return 0;
}

/* ---------------------------------------------------------------- global memory */

static void *elem_ptr(run *r, const fb_snode *sn, int64_t flat) {
  return (uint8_t *)r->in->fields[sn->id] + (size_t)flat * fb_type_size(sn->type);
}

static int exec_load(run *r, int id) {
  const fb_snode *sn = NULL;
  int64_t idx[FB_MAX_AXES], flat;
  int inb, rc;
  if ((rc = stmt_snode(r, id, 1, &sn)) || (rc = check_nargs(r, id, sn, 0)) ||
      (rc = result_type(r, id, sn->type)) || (rc = read_indices(r, id, sn, idx, &flat, &inb)))
    return rc;
  r->vals[id] = inb ? fb_value_load(sn->type, elem_ptr(r, sn, flat)) : zero_of(sn->type);
  return 0;
}

static int exec_store(run *r, int id) {
  const fb_snode *sn = NULL;
  int64_t idx[FB_MAX_AXES], flat;
  int inb, rc;
  fb_value v;
  if ((rc = stmt_snode(r, id, 1, &sn)) || (rc = check_nargs(r, id, sn, 1)) ||
      (rc = operand(r, id, sn->ndim, &v)) || (rc = read_indices(r, id, sn, idx, &flat, &inb)))
    return rc;
  if (v.type != sn->type)
    return bad(r, FB_EINVAL, id, "storing %s into a %s field", fb_type_name(v.type),
               fb_type_name(sn->type));
  if (inb) {
    activate_cell(r, sn, idx);
    fb_value_store(v, elem_ptr(r, sn, flat));
  }
  return 0;
}

/* The binary op an atomic applies. */
static fb_op atomic_base(fb_op op) {
  switch (op) {
  case FB_OP_ATOMIC_ADD: return FB_OP_ADD;
  case FB_OP_ATOMIC_SUB: return FB_OP_SUB;
  case FB_OP_ATOMIC_MIN: return FB_OP_MIN;
  case FB_OP_ATOMIC_MAX: return FB_OP_MAX;
  case FB_OP_ATOMIC_AND: return FB_OP_AND;
  case FB_OP_ATOMIC_OR: return FB_OP_OR;
  default: return FB_OP_XOR;
  }
}

/* Atomics return the old value and store old <op> value (in the field's
 * type: f32 fields add in float, min/max on floats are fmin/fmax). */
static int exec_atomic(run *r, int id) {
  const fb_stmt *s = &r->k->stmts[id];
  const fb_snode *sn = NULL;
  int64_t idx[FB_MAX_AXES], flat;
  int inb, rc;
  fb_value v, old, nv;
  if ((rc = stmt_snode(r, id, 1, &sn)) || (rc = check_nargs(r, id, sn, 1)) ||
      (rc = result_type(r, id, sn->type)) || (rc = operand(r, id, sn->ndim, &v)))
    return rc;
  fb_op base = atomic_base((fb_op)s->op);
  int int_only = fb_op_table[s->op].cls == FB_OPC_IATOMIC;
  if (v.type != sn->type || (int_only ? !fb_type_is_int(v.type) : !is_num(v.type)))
    return bad(r, FB_EINVAL, id, "not defined on %s (field %s)", fb_type_name(v.type),
               fb_type_name(sn->type));
  if ((rc = read_indices(r, id, sn, idx, &flat, &inb))) return rc;
  if (!inb) { r->vals[id] = zero_of(sn->type); return 0; }
  old = fb_value_load(sn->type, elem_ptr(r, sn, flat));
  if (binop(base, sn->type, old, v, &nv)) return bad(r, FB_EINVAL, id, "bad operand type");
  activate_cell(r, sn, idx);
  fb_value_store(nv, elem_ptr(r, sn, flat));
  r->vals[id] = old;
  return 0;
}

/* is_active / activate on any SNode (dense here); deactivate, append and
 * length need sparse SNodes, which this version does not run. */
static int exec_sparse(run *r, int id) {
  const fb_stmt *s = &r->k->stmts[id];
  const fb_snode *sn = NULL;
  int64_t idx[FB_MAX_AXES], flat;
  int inb, rc;
  if (s->op != FB_OP_IS_ACTIVE && s->op != FB_OP_ACTIVATE)
    return bad(r, FB_EUNSUPPORTED, id, "needs a sparse SNode (not supported yet)");
  if ((rc = stmt_snode(r, id, 0, &sn)) || (rc = check_nargs(r, id, sn, 0)) ||
      (rc = read_indices(r, id, sn, idx, &flat, &inb)))
    return rc;
  if (on_sparse_path(r->l, sn->id))
    return bad(r, FB_EUNSUPPORTED, id, "sparse SNodes are not supported yet");
  if (s->op == FB_OP_IS_ACTIVE) {
    if ((rc = result_type(r, id, FB_T_BOOL))) return rc;
    r->vals[id] = fb_value_bool(inb && cell_active(r, sn, idx));
  } else if (inb) {
    activate_cell(r, sn, idx);
  }
  return 0;
}

/* ---------------------------------------------------------------- pure values */

static int exec_const(run *r, int id) {
  const fb_stmt *s = &r->k->stmts[id];
  fb_type t = (fb_type)s->type;
  if (!valid_type(t)) return bad(r, FB_EINVAL, id, "constant of no type");
  if (t == FB_T_F32) r->vals[id] = mk_f32((float)s->imm.f);
  else if (t == FB_T_F64) r->vals[id] = mk_f64(s->imm.f);
  else r->vals[id] = mk_int(t, s->imm.u);
  return 0;
}

static int exec_arg(run *r, int id) {
  const fb_stmt *s = &r->k->stmts[id];
  if (s->imm.i < 0 || s->imm.i >= r->k->nparams)
    return bad(r, FB_EINVAL, id, "no parameter %lld", (long long)s->imm.i);
  int rc = result_type(r, id, r->k->params[s->imm.i]);
  if (rc) return rc;
  r->vals[id] = r->args[s->imm.i];
  return 0;
}

static int exec_cast(run *r, int id) {
  fb_type to = (fb_type)r->k->stmts[id].type;
  fb_value a;
  int rc = operand(r, id, 0, &a);
  if (rc) return rc;
  if (!valid_type(to)) return bad(r, FB_EINVAL, id, "cast to no type");
  r->vals[id] = fb_value_cast(a, to);
  return 0;
}

static int exec_select(run *r, int id) {
  fb_value c, a, b;
  int rc;
  if ((rc = operand(r, id, 0, &c)) || (rc = operand(r, id, 1, &a)) || (rc = operand(r, id, 2, &b)))
    return rc;
  if (c.type != FB_T_BOOL || a.type != b.type)
    return bad(r, FB_EINVAL, id, "needs a bool condition and two values of one type");
  if ((rc = result_type(r, id, a.type))) return rc;
  r->vals[id] = c.v.u ? a : b;
  return 0;
}

/* Arithmetic, bit ops and shifts: operands (the shift count aside) and the
 * result share one type. */
static int exec_binary(run *r, int id) {
  const fb_stmt *s = &r->k->stmts[id];
  fb_value a, b;
  int rc;
  if ((rc = operand(r, id, 0, &a)) || (rc = operand(r, id, 1, &b))) return rc;
  int shift = fb_op_table[s->op].cls == FB_OPC_SHIFT;
  if (shift ? !fb_type_is_int(a.type) || !fb_type_is_int(b.type) : a.type != b.type)
    return bad(r, FB_EINVAL, id, "operand types %s and %s", fb_type_name(a.type),
               fb_type_name(b.type));
  if ((rc = result_type(r, id, a.type))) return rc;
  if (binop((fb_op)s->op, a.type, a, b, &r->vals[id]))
    return bad(r, FB_EINVAL, id, "not defined on %s", fb_type_name(a.type));
  return 0;
}

static int exec_compare(run *r, int id) {
  fb_value a, b;
  int rc;
  if ((rc = operand(r, id, 0, &a)) || (rc = operand(r, id, 1, &b))) return rc;
  if (a.type != b.type)
    return bad(r, FB_EINVAL, id, "operand types %s and %s", fb_type_name(a.type),
               fb_type_name(b.type));
  if ((rc = result_type(r, id, FB_T_BOOL))) return rc;
  r->vals[id] = fb_value_bool(compare((fb_op)r->k->stmts[id].op, a.type, a, b));
  return 0;
}

static int exec_unary(run *r, int id) {
  fb_value a = {0};
  int rc;
  if ((rc = operand(r, id, 0, &a)) || (rc = result_type(r, id, a.type))) return rc;
  if (unop((fb_op)r->k->stmts[id].op, a.type, a, &r->vals[id]))
    return bad(r, FB_EINVAL, id, "not defined on %s", fb_type_name(a.type));
  return 0;
}

/* ---------------------------------------------------------------- locals, scratch, rand */

/* The alloca a local access names. */
static int local_var(run *r, int id, int *var) {
  int rc = operand_id(r, id, 0, var);
  if (rc) return rc;
  if (r->k->stmts[*var].op != FB_OP_ALLOCA || !valid_type(r->k->stmts[*var].type))
    return bad(r, FB_EINVAL, id, "%%%d is not a local variable", *var);
  return 0;
}

static int exec_local(run *r, int id) {
  const fb_stmt *s = &r->k->stmts[id];
  int var = -1, rc;
  fb_value v;
  if (s->op == FB_OP_ALLOCA) {
    if (!valid_type(s->type)) return bad(r, FB_EINVAL, id, "variable of no type");
    r->vals[id] = zero_of((fb_type)s->type);
    return 0;
  }
  if ((rc = local_var(r, id, &var))) return rc;
  if (s->op == FB_OP_LLOAD) {
    if ((rc = result_type(r, id, (fb_type)r->k->stmts[var].type))) return rc;
    r->vals[id] = r->vals[var];
    return 0;
  }
  if ((rc = operand(r, id, 1, &v))) return rc;
  if (v.type != r->k->stmts[var].type)
    return bad(r, FB_EINVAL, id, "storing %s into a %s variable", fb_type_name(v.type),
               fb_type_name((fb_type)r->k->stmts[var].type));
  r->vals[var] = v;
  return 0;
}

/* Make the scratch buffer cover [0, end), zero-filling what is new. */
static int scratch_reserve(fb_interp *in, size_t end) {
  if (end <= in->scratch_bytes) return 0;
  size_t n = in->scratch_bytes ? in->scratch_bytes : 64;
  while (n < end) n *= 2;
  uint8_t *p = realloc(in->scratch, n);
  if (!p) return FB_ENOMEM;
  memset(p + in->scratch_bytes, 0, n - in->scratch_bytes);
  in->scratch = p;
  in->scratch_bytes = n;
  return 0;
}

/* gtmp_load / gtmp_store: a value of the statement's (or the stored value's)
 * type at byte offset imm.i; each value owns an 8-byte slot. */
static int exec_gtmp(run *r, int id) {
  const fb_stmt *s = &r->k->stmts[id];
  int64_t off = s->imm.i;
  fb_value v;
  int rc;
  if (off < 0 || (uint64_t)off > INTERP_SCRATCH_MAX - 8)
    return bad(r, FB_EINVAL, id, "scratch offset %lld out of range", (long long)off);
  if (s->op == FB_OP_GTMP_STORE && (rc = operand(r, id, 0, &v))) return rc;
  if (s->op == FB_OP_GTMP_LOAD && !valid_type(s->type))
    return bad(r, FB_EINVAL, id, "load of no type");
  if (scratch_reserve(r->in, (size_t)off + 8))
    return bad(r, FB_ENOMEM, id, "cannot grow the scratch buffer to %lld bytes",
               (long long)off + 8);
  if (s->op == FB_OP_GTMP_STORE) fb_value_store(v, r->in->scratch + off);
  else r->vals[id] = fb_value_load((fb_type)s->type, r->in->scratch + off);
  return 0;
}

static int exec_rand(run *r, int id) {
  const fb_stmt *s = &r->k->stmts[id];
  int rc = result_type(r, id, FB_T_F32);
  if (rc) return rc;
  uint64_t bits = fb_rand_bits(r->in->seed, r->launch, (uint64_t)s->imm.i, r->iter, r->count);
  r->count++;
  r->vals[id] = mk_f32(fb_rand_f32(bits));
  return 0;
}

static int exec_ret(run *r, int id) {
  const fb_stmt *s = &r->k->stmts[id];
  fb_value v;
  int rc = operand(r, id, 0, &v);
  if (rc) return rc;
  if (s->imm.i != 0) return bad(r, FB_EINVAL, id, "no return slot %lld", (long long)s->imm.i);
  if (v.type != r->k->ret)
    return bad(r, FB_EINVAL, id, "returns %s from a kernel returning %s", fb_type_name(v.type),
               fb_type_name(r->k->ret));
  r->ret = v;
  return 0;
}

static int exec_loop_index(run *r, int id) {
  const fb_stmt *s = &r->k->stmts[id];
  int loop = -1, rc;
  if ((rc = operand_id(r, id, 0, &loop)) || (rc = result_type(r, id, FB_T_I32))) return rc;
  const fb_stmt *ls = &r->k->stmts[loop];
  int n = 0;
  if (ls->op == FB_OP_RANGE_FOR || ls->op == FB_OP_PAR_FOR) n = 1;
  else if (ls->op == FB_OP_STRUCT_FOR && ls->snode >= 0 && ls->snode < r->l->nnodes)
    n = r->l->nodes[ls->snode].ndim;
  else return bad(r, FB_EINVAL, id, "%%%d is not a loop", loop);
  if (s->imm.i < 0 || s->imm.i >= n)
    return bad(r, FB_EINVAL, id, "loop %%%d has no index %lld", loop, (long long)s->imm.i);
  r->vals[id] = fb_value_i32(r->lidx[loop][s->imm.i]);
  return 0;
}

/* ---------------------------------------------------------------- control flow */

static int exec_block(run *r, int block);

/* One loop iteration's body; break / continue are errors in a parallel
 * loop (the verifier only lets them sit in serial loops). */
static int loop_body(run *r, int id, int serial) {
  int f = exec_block(r, r->k->stmts[id].body);
  if (f > 0 && !serial) return bad(r, FB_EINVAL, id, "break/continue outside a serial loop");
  return f;
}

/* range_for and par_for: i32 index from begin up to end (exclusive). A
 * top-level par_for keys rand() by iteration (index - begin), count reset. */
static int exec_range(run *r, int id, int top) {
  const fb_stmt *s = &r->k->stmts[id];
  int serial = s->op == FB_OP_RANGE_FOR;
  int64_t b = 0, e = 0;
  int rc;
  if ((rc = operand_i32(r, id, 0, &b)) || (rc = operand_i32(r, id, 1, &e))) return rc;
  for (int64_t i = b; i < e; i++) {
    r->lidx[id][0] = (int32_t)i;
    if (top) { r->iter = (uint64_t)(i - b); r->count = 0; }
    int f = loop_body(r, id, serial);
    if (f < 0) return f;
    if (f == FLOW_BREAK) break;
  }
  return FLOW_NEXT;
}

/* struct_for: every cell of the SNode's index space, row-major in axis
 * order (on a dense path all cells are active). The linear cell number keys
 * rand() when the loop is top-level. */
static int exec_struct_for(run *r, int id, int top) {
  const fb_snode *sn = NULL;
  int rc = stmt_snode(r, id, 0, &sn);
  if (rc) return rc;
  if (on_sparse_path(r->l, sn->id))
    return bad(r, FB_EUNSUPPORTED, id, "sparse SNodes are not supported yet");
  int64_t total = 1, idx[FB_MAX_AXES] = {0, 0, 0, 0};
  for (int d = 0; d < sn->ndim; d++) total *= sn->shape[sn->dim_axis[d]];
  for (int64_t lin = 0; lin < total; lin++) {
    for (int64_t rest = lin, d = sn->ndim - 1; d >= 0; d--) {
      int64_t n = sn->shape[sn->dim_axis[d]];
      idx[d] = rest % n;
      rest /= n;
    }
    if (!cell_active(r, sn, idx)) continue;
    for (int d = 0; d < FB_MAX_AXES; d++) r->lidx[id][d] = (int32_t)idx[d];
    if (top) { r->iter = (uint64_t)lin; r->count = 0; }
    int f = loop_body(r, id, 0);
    if (f < 0) return f;
  }
  return FLOW_NEXT;
}

static int exec_while(run *r, int id) {
  for (;;) {
    int f = loop_body(r, id, 1);
    if (f < 0) return f;
    if (f == FLOW_BREAK) return FLOW_NEXT;
  }
}

static int exec_if(run *r, int id) {
  const fb_stmt *s = &r->k->stmts[id];
  fb_value c;
  int rc = operand(r, id, 0, &c);
  if (rc) return rc;
  if (c.type != FB_T_BOOL) return bad(r, FB_EINVAL, id, "condition is not bool");
  if (c.v.u) return exec_block(r, s->body);
  return s->orelse >= 0 ? exec_block(r, s->orelse) : FLOW_NEXT;
}

/* One statement: FLOW_* or a negative FB_E* code. */
static int exec_stmt(run *r, int id, int top) {
  const fb_stmt *s = &r->k->stmts[id];
  if (s->op >= FB_OP__COUNT) return fail(r->in, FB_EINVAL, "%%%d: unknown op %u", id, s->op);
  if (s->type >= FB_T__COUNT) return bad(r, FB_EINVAL, id, "unknown type %u", s->type);
  switch (fb_op_table[s->op].cls) {
  case FB_OPC_CONST: return exec_const(r, id);
  case FB_OPC_ARG: return exec_arg(r, id);
  case FB_OPC_CAST: return exec_cast(r, id);
  case FB_OPC_SELECT: return exec_select(r, id);
  case FB_OPC_ARITH: case FB_OPC_FARITH: case FB_OPC_BITS: case FB_OPC_SHIFT:
    return exec_binary(r, id);
  case FB_OPC_CMP: return exec_compare(r, id);
  case FB_OPC_NOT: case FB_OPC_UNARY: case FB_OPC_FUNARY: return exec_unary(r, id);
  case FB_OPC_ALLOCA: case FB_OPC_LLOAD: case FB_OPC_LSTORE: return exec_local(r, id);
  case FB_OPC_GLOAD: return exec_load(r, id);
  case FB_OPC_GSTORE: return exec_store(r, id);
  case FB_OPC_ATOMIC: case FB_OPC_IATOMIC: return exec_atomic(r, id);
  case FB_OPC_SPARSE: case FB_OPC_APPEND: case FB_OPC_LENGTH: return exec_sparse(r, id);
  case FB_OPC_HINT: {
    int rc = operand(r, id, 0, &r->vals[id]);
    return rc ? rc : result_type(r, id, r->vals[id].type);
  }
  case FB_OPC_IF: return exec_if(r, id);
  case FB_OPC_LOOP: return exec_while(r, id);
  case FB_OPC_RANGE: return exec_range(r, id, top && s->op == FB_OP_PAR_FOR);
  case FB_OPC_STRUCT: return exec_struct_for(r, id, top);
  case FB_OPC_JUMP: return s->op == FB_OP_BREAK ? FLOW_BREAK : FLOW_CONTINUE;
  case FB_OPC_LOOPIDX: return exec_loop_index(r, id);
  case FB_OPC_RET: return exec_ret(r, id);
  case FB_OPC_GTMP: return exec_gtmp(r, id);
  case FB_OPC_RAND: return exec_rand(r, id);
  case FB_OPC_LIST: return 0; /* lists are the runtime's: the interpreter
                                 walks the active cells directly */
  default: return bad(r, FB_EINVAL, id, "op class %d has no meaning", fb_op_table[s->op].cls);
  }
}

static int exec_block(run *r, int block) {
  if (block < 0 || block >= r->k->nblocks)
    return fail(r->in, FB_EINVAL, "kernel %s: no block %d", r->k->name, block);
  if (++r->depth > INTERP_MAX_DEPTH)
    return fail(r->in, FB_EINVAL, "kernel %s: blocks nested deeper than %d", r->k->name,
                INTERP_MAX_DEPTH);
  const fb_block *b = &r->k->blocks[block];
  int f = FLOW_NEXT;
  for (int i = 0; i < b->n && f == FLOW_NEXT; i++) {
    if (!stmt_ok(r, b->ids[i]))
      f = fail(r->in, FB_EINVAL, "kernel %s: block %d lists %%%d, not a statement", r->k->name,
               block, (int)b->ids[i]);
    else
      f = exec_stmt(r, b->ids[i], 0);
  }
  r->depth--;
  return f;
}

/* The body. Top-level par_for and struct_for are the parallel tasks: their
 * iterations key rand(); the runs of other statements between them are the
 * serial tasks, each counting rand() calls from 0. */
static int exec_body(run *r) {
  const fb_block *b = &r->k->blocks[0];
  r->depth = 1;
  for (int i = 0; i < b->n; i++) {
    int id = b->ids[i];
    if (!stmt_ok(r, id))
      return fail(r->in, FB_EINVAL, "kernel %s: body lists %%%d, not a statement", r->k->name, id);
    int par = r->k->stmts[id].op == FB_OP_PAR_FOR || r->k->stmts[id].op == FB_OP_STRUCT_FOR;
    if (par) r->count = 0;
    int f = exec_stmt(r, id, 1);
    if (par) r->iter = r->count = 0;
    if (f < 0) return f;
    if (f > 0) return bad(r, FB_EINVAL, id, "break/continue outside a loop");
  }
  return 0;
}

/* ---------------------------------------------------------------- checks before a run */

/* Refuse (before anything runs) kernels that need sparse support. Each
 * block is scanned once; malformed references are left to the run. */
static int scan_sparse(fb_interp *in, const fb_kernel *k, int block, uint8_t *seen) {
  if (block < 0 || block >= k->nblocks || seen[block]) return 0;
  seen[block] = 1;
  const fb_block *b = &k->blocks[block];
  for (int i = 0; i < b->n; i++) {
    int id = b->ids[i], rc;
    if (id < 0 || id >= k->nstmts || k->stmts[id].op >= FB_OP__COUNT) continue;
    const fb_stmt *s = &k->stmts[id];
    if (s->op == FB_OP_DEACTIVATE || s->op == FB_OP_APPEND || s->op == FB_OP_LENGTH)
      return fail(in, FB_EUNSUPPORTED, "kernel %s: %%%d %s needs sparse SNodes (not supported yet)",
                  k->name, id, op_name(s->op));
    if ((fb_op_table[s->op].flags & FB_OPF_SNODE) && s->op != FB_OP_ASSUME_UNIQUE &&
        on_sparse_path(in->l, s->snode))
      return fail(in, FB_EUNSUPPORTED, "kernel %s: %%%d %s: SNode %d is sparse (not supported yet)",
                  k->name, id, op_name(s->op), (int)s->snode);
    if ((rc = scan_sparse(in, k, s->body, seen)) || (rc = scan_sparse(in, k, s->orelse, seen)))
      return rc;
  }
  return 0;
}

static int check_supported(fb_interp *in, const fb_kernel *k) {
  uint8_t *seen = calloc((size_t)k->nblocks, 1);
  if (!seen) return fail(in, FB_ENOMEM, "kernel %s: out of memory", k->name);
  int rc = scan_sparse(in, k, 0, seen);
  free(seen);
  return rc;
}

static int kind_of(fb_type t) {
  return fb_type_is_float(t) ? 2 : fb_type_is_int(t) ? 1 : t == FB_T_BOOL ? 0 : -1;
}

/* Convert the launch arguments to the parameter types. */
static int convert_args(fb_interp *in, const fb_kernel *k, const fb_value *args, int nargs,
                        fb_value *out) {
  if (nargs != k->nparams)
    return fail(in, FB_ETYPE, "kernel %s takes %d arguments, got %d", k->name, k->nparams, nargs);
  if (nargs > 0 && !args) return fail(in, FB_EINVAL, "kernel %s: no argument values", k->name);
  for (int i = 0; i < nargs; i++) {
    fb_type pt = k->params[i];
    if (!valid_type(pt)) return fail(in, FB_EINVAL, "kernel %s: parameter %d has no type", k->name, i);
    if (kind_of(args[i].type) < 0 || kind_of(args[i].type) != kind_of(pt))
      return fail(in, FB_ETYPE, "kernel %s: argument %d is %s, parameter is %s", k->name, i,
                  fb_type_name(args[i].type), fb_type_name(pt));
    out[i] = fb_value_cast(args[i], pt);
  }
  return 0;
}

static int check_kernel(fb_interp *in, const fb_kernel *k) {
  if (!k->layout || (k->layout != in->l && fb_layout_hash(k->layout) != in->layout_hash))
    return fail(in, FB_EINVAL, "kernel %s was built for another layout", k->name ? k->name : "?");
  if (k->nblocks < 1 || !k->blocks || k->nstmts < 0 || (k->nstmts > 0 && !k->stmts) ||
      k->nparams < 0 || (k->nparams > 0 && !k->params) || (unsigned)k->ret >= FB_T__COUNT)
    return fail(in, FB_EINVAL, "kernel %s is malformed", k->name ? k->name : "?");
  return 0;
}

/* Run the verifier; its first message becomes the interpreter's. */
static int verify_kernel(fb_interp *in, const fb_kernel *k) {
  fb_diags d;
  fb_diags_init(&d);
  int rc = fb_verify(k, &d);
  if (rc == FB_EVERIFY)
    fail(in, rc, "kernel %s: %s%s", k->name ? k->name : "?", d.n ? d.v[0].msg : "refused",
         d.n > 1 ? " (and more)" : "");
  else if (rc)
    fail(in, rc, "kernel %s: verifier failed: %s", k->name ? k->name : "?", fb_strerror(rc));
  fb_diags_free(&d);
  return rc;
}

/* ---------------------------------------------------------------- API */

fb_interp *fb_interp_new(const fb_layout *l, uint64_t seed) {
  if (!l || !l->finalized) return NULL;
  fb_interp *in = calloc(1, sizeof *in);
  if (!in) return NULL;
  in->l = l;
  in->layout_hash = fb_layout_hash(l);
  in->seed = seed;
  in->fields = calloc((size_t)l->nnodes, sizeof *in->fields);
  if (!in->fields) { free(in); return NULL; }
  for (int i = 0; i < l->nnodes; i++) {
    if (l->nodes[i].kind != FB_SN_PLACE) continue;
    in->fields[i] = calloc((size_t)fb_field_numel(l, i), fb_type_size(l->nodes[i].type));
    if (!in->fields[i]) { fb_interp_free(in); return NULL; }
  }
  return in;
}

void fb_interp_free(fb_interp *in) {
  if (!in) return;
  for (int i = 0; in->fields && i < in->l->nnodes; i++) free(in->fields[i]);
  free(in->fields);
  free(in->scratch);
  free(in);
}

void *fb_interp_field(fb_interp *in, int place) {
  if (!in || place < 0 || place >= in->l->nnodes) return NULL;
  return in->fields[place];
}

void *fb_interp_scratch(fb_interp *in, size_t *bytes) {
  if (bytes) *bytes = in ? in->scratch_bytes : 0;
  return in ? in->scratch : NULL;
}

int fb_interp_run(fb_interp *in, const fb_kernel *k, const fb_value *args, int nargs,
                  fb_value *ret) {
  if (!in) return FB_EINVAL;
  in->err[0] = 0;
  if (ret) *ret = zero_of(FB_T_VOID);
  if (!k) return fail(in, FB_EINVAL, "no kernel");
  int rc = check_kernel(in, k);
  if (!rc) rc = verify_kernel(in, k);
  if (rc) return rc;
  if (ret) *ret = zero_of(k->ret);
  run r;
  memset(&r, 0, sizeof r);
  r.in = in;
  r.k = k;
  r.l = in->l;
  r.ret = zero_of(k->ret);
  fb_value *argv = calloc((size_t)k->nparams + 1, sizeof *argv);
  r.vals = calloc((size_t)k->nstmts + 1, sizeof *r.vals);
  r.lidx = calloc((size_t)k->nstmts + 1, sizeof *r.lidx);
  r.args = argv;
  if (!argv || !r.vals || !r.lidx) rc = fail(in, FB_ENOMEM, "kernel %s: out of memory", k->name);
  else if (!(rc = convert_args(in, k, args, nargs, argv)) && !(rc = check_supported(in, k))) {
    r.launch = in->launches++;
    rc = exec_body(&r);
  }
  free(argv);
  free(r.vals);
  free(r.lidx);
  if (rc < 0) return rc;
  if (ret) *ret = r.ret;
  if (r.bounds) snprintf(in->err, sizeof in->err, "kernel %s indexed a field out of bounds", k->name);
  return r.bounds;
}
