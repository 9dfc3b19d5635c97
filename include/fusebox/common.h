/* Fusebox public basics: error codes, scalar types and tagged scalar values.
 * Every public function that can fail returns 0 or a negative FB_E* code;
 * fb_strerror() names the code, and objects that fail keep a message of
 * their own (fb_session_errmsg, fb_diags) that says what exactly went wrong. */
#ifndef FUSEBOX_COMMON_H
#define FUSEBOX_COMMON_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* FB_OK and the FB_E* codes, from the table in fusebox/errors.h. */
enum {
#define FB_ERR(name, value, msg, grpc) FB_##name = value,
#include "fusebox/errors.h"
#undef FB_ERR
  FB_ELAST = FB_ETIMEOUT /* the lowest code: every code is in [FB_ELAST, 0] */
};

const char *fb_strerror(int code);
/* Format a message into a caller's buffer (err may be NULL or errlen 0: then
 * nothing is written). The one helper every layer uses for its err/errlen
 * out-parameters. */
void fb_errf(char *err, size_t errlen, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
/* fb_errf with a va_list, for a folder's own printf-like error helper. */
void fb_verrf(char *err, size_t errlen, const char *fmt, va_list ap)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 0)))
#endif
    ;
/* Append to the message already in err (a list built in parts); what does
 * not fit is cut, as with fb_errf. */
void fb_errcat(char *err, size_t errlen, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

typedef enum fb_type {
  FB_T_VOID = 0,
  FB_T_BOOL,
  FB_T_I32,
  FB_T_I64,
  FB_T_U32,
  FB_T_U64,
  FB_T_F32,
  FB_T_F64,
  FB_T__COUNT
} fb_type;

const char *fb_type_name(fb_type t);          /* "f32"; "void" */
const char *fb_type_article(fb_type t);       /* "an" (i32, f32 ...) or "a" (u32, bool) */
int fb_type_from_name(const char *s, size_t n); /* -1 when unknown */
size_t fb_type_size(fb_type t);               /* bool is stored as 1 byte */
int fb_type_is_float(fb_type t);
int fb_type_is_int(fb_type t);                /* i32 i64 u32 u64 */
int fb_type_is_signed(fb_type t);             /* i32 i64 (and floats) */
int fb_type_bits(fb_type t);                  /* bool = 1 */

/* A scalar of any type: integers sign- or zero-extended to 64 bits in i/u,
 * floats widened to double in f (an f32 value is always exactly an f32). */
typedef struct fb_value {
  fb_type type;
  union {
    int64_t i;
    uint64_t u;
    double f;
  } v;
} fb_value;

fb_value fb_value_i32(int32_t x);
fb_value fb_value_i64(int64_t x);
fb_value fb_value_u32(uint32_t x);
fb_value fb_value_u64(uint64_t x);
fb_value fb_value_f32(float x);
fb_value fb_value_f64(double x);
fb_value fb_value_bool(int x);
/* Convert with the IR's cast semantics (float to int truncates, saturating
 * at the target's range; NaN becomes 0). */
fb_value fb_value_cast(fb_value x, fb_type to);
double fb_value_as_f64(fb_value x);
int64_t fb_value_as_i64(fb_value x);
/* Store x (of its own type) into memory holding one element of x.type. */
void fb_value_store(fb_value x, void *dst);
fb_value fb_value_load(fb_type t, const void *src);

#ifdef __cplusplus
}
#endif
#endif
