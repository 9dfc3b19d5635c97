/* Little-endian integers and the magic of the checkpoint stream, shared by
 * engine/checkpoint.c and engine/seal.c (docs/checkpoint.md). */
#ifndef FB_ENGINE_CKPT_IO_H
#define FB_ENGINE_CKPT_IO_H

#include <stdint.h>

/* The first 8 bytes of every checkpoint stream. */
#define FBK_MAGIC "FBCKPT\r\n"

static inline void fbk_put32(uint8_t *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static inline void fbk_put64(uint8_t *p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static inline uint32_t fbk_get32(const uint8_t *p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; i++) v |= (uint32_t)p[i] << (8 * i);
  return v;
}
static inline uint64_t fbk_get64(const uint8_t *p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; i++) v |= (uint64_t)p[i] << (8 * i);
  return v;
}

#endif
