/* Packing of kernel arguments and return values into 8-byte slots: the one
 * place that defines how host values cross into compiled code. */
#include <string.h>

#include "codegen/codegen.h"

uint64_t fb_slot_pack(fb_value v) {
  uint64_t s = 0;
  switch (v.type) {
  case FB_T_F32: {
    float f = (float)v.v.f;
    uint32_t w;
    memcpy(&w, &f, 4);
    s = w;
    break;
  }
  case FB_T_F64: memcpy(&s, &v.v.f, 8); break;
  case FB_T_BOOL: s = v.v.u != 0; break;
  case FB_T_I32: s = (uint64_t)(int64_t)(int32_t)v.v.i; break;
  case FB_T_U32: s = (uint32_t)v.v.u; break;
  default: s = v.v.u; break;
  }
  return s;
}

fb_value fb_slot_unpack(fb_type t, uint64_t slot) {
  fb_value v;
  v.type = t;
  v.v.u = 0;
  switch (t) {
  case FB_T_F32: {
    uint32_t w = (uint32_t)slot;
    float f;
    memcpy(&f, &w, 4);
    v.v.f = f;
    break;
  }
  case FB_T_F64: memcpy(&v.v.f, &slot, 8); break;
  case FB_T_BOOL: v.v.u = (slot & 1) != 0; break;
  case FB_T_I32: v.v.i = (int32_t)(uint32_t)slot; break;
  case FB_T_U32: v.v.u = (uint32_t)slot; break;
  default: v.v.u = slot; break;
  }
  return v;
}
