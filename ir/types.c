/* Scalar types and tagged values: the vocabulary every layer shares. Casts
 * (fb_value_cast) follow the IR's rules and live with the rest of its
 * arithmetic in ir/arith.c; error names and the error formatter are in
 * base/err.c. */
#include <string.h>

#include "fusebox/common.h"

static const char *const type_names[FB_T__COUNT] = {"void", "bool", "i32", "i64",
                                                    "u32",  "u64",  "f32", "f64"};

const char *fb_type_name(fb_type t) { return (unsigned)t < FB_T__COUNT ? type_names[t] : "?"; }

/* By sound: "an i32", "an f32", "a u32" (you), "a bool". */
const char *fb_type_article(fb_type t) {
  switch (t) {
  case FB_T_I32:
  case FB_T_I64:
  case FB_T_F32:
  case FB_T_F64: return "an";
  default: return "a";
  }
}

int fb_type_from_name(const char *s, size_t n) {
  for (int t = 0; t < FB_T__COUNT; t++)
    if (strlen(type_names[t]) == n && memcmp(type_names[t], s, n) == 0) return t;
  return -1;
}

size_t fb_type_size(fb_type t) {
  switch (t) {
  case FB_T_BOOL: return 1;
  case FB_T_I32:
  case FB_T_U32:
  case FB_T_F32: return 4;
  case FB_T_I64:
  case FB_T_U64:
  case FB_T_F64: return 8;
  default: return 0;
  }
}

int fb_type_is_float(fb_type t) { return t == FB_T_F32 || t == FB_T_F64; }
int fb_type_is_int(fb_type t) {
  return t == FB_T_I32 || t == FB_T_I64 || t == FB_T_U32 || t == FB_T_U64;
}
int fb_type_is_signed(fb_type t) { return t == FB_T_I32 || t == FB_T_I64 || fb_type_is_float(t); }
int fb_type_bits(fb_type t) { return t == FB_T_BOOL ? 1 : (int)fb_type_size(t) * 8; }

fb_value fb_value_i32(int32_t x) {
  fb_value r = {FB_T_I32, {.i = x}};
  return r;
}
fb_value fb_value_i64(int64_t x) {
  fb_value r = {FB_T_I64, {.i = x}};
  return r;
}
fb_value fb_value_u32(uint32_t x) {
  fb_value r = {FB_T_U32, {.u = x}};
  return r;
}
fb_value fb_value_u64(uint64_t x) {
  fb_value r = {FB_T_U64, {.u = x}};
  return r;
}
fb_value fb_value_f32(float x) {
  fb_value r = {FB_T_F32, {.f = x}};
  return r;
}
fb_value fb_value_f64(double x) {
  fb_value r = {FB_T_F64, {.f = x}};
  return r;
}
fb_value fb_value_bool(int x) {
  fb_value r = {FB_T_BOOL, {.u = x != 0}};
  return r;
}

/* fb_value_cast, the IR's cast semantics, is in ir/arith.c. */

double fb_value_as_f64(fb_value x) { return fb_value_cast(x, FB_T_F64).v.f; }
int64_t fb_value_as_i64(fb_value x) { return fb_value_cast(x, FB_T_I64).v.i; }

void fb_value_store(fb_value x, void *dst) {
  switch (x.type) {
  case FB_T_BOOL: {
    uint8_t b = x.v.u != 0;
    memcpy(dst, &b, 1);
    break;
  }
  case FB_T_I32:
  case FB_T_U32: {
    uint32_t w = (uint32_t)x.v.u;
    memcpy(dst, &w, 4);
    break;
  }
  case FB_T_I64:
  case FB_T_U64: memcpy(dst, &x.v.u, 8); break;
  case FB_T_F32: {
    float f = (float)x.v.f;
    memcpy(dst, &f, 4);
    break;
  }
  case FB_T_F64: memcpy(dst, &x.v.f, 8); break;
  default: break;
  }
}

fb_value fb_value_load(fb_type t, const void *src) {
  fb_value r;
  r.type = t;
  r.v.u = 0;
  switch (t) {
  case FB_T_BOOL: {
    uint8_t b;
    memcpy(&b, src, 1);
    r.v.u = b != 0;
    break;
  }
  case FB_T_I32: {
    int32_t w;
    memcpy(&w, src, 4);
    r.v.i = w;
    break;
  }
  case FB_T_U32: {
    uint32_t w;
    memcpy(&w, src, 4);
    r.v.u = w;
    break;
  }
  case FB_T_I64:
  case FB_T_U64: memcpy(&r.v.u, src, 8); break;
  case FB_T_F32: {
    float f;
    memcpy(&f, src, 4);
    r.v.f = f;
    break;
  }
  case FB_T_F64: memcpy(&r.v.f, src, 8); break;
  default: break;
  }
  return r;
}
