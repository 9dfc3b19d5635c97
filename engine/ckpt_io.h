/* Little-endian integers, the magic, the header's byte-order mark and the
 * framing of the checkpoint stream, shared by engine/checkpoint.c and
 * engine/seal.c (docs/checkpoint.md). */
#ifndef FB_ENGINE_CKPT_IO_H
#define FB_ENGINE_CKPT_IO_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

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

/* The header: magic (8), u32 format, u32 header bytes, the byte-order
 * mark (4: 0x01020304 as the writer's CPU stores it), u32 pointer bytes. */
#define FBK_HEADER_BYTES 24
/* A part's head: u32 kind, u32 0, u64 length. */
#define FBK_PART_HEAD 16
#define FBK_PART_ROOT 5
#define FBK_PART_POOL 7
#define FBK_PART_MANIFEST 255
#define FBK_BOM 0x01020304u
#define FBK_MAX_PARTS 16 /* parts before the manifest, at most */

/* The bulk parts (the fields, the sparse block pool): the seal leaves
 * their bytes to their SHA-256 in the manifest, which it covers. */
static inline int fbk_part_bulk(uint32_t kind) {
  return kind == FBK_PART_ROOT || kind == FBK_PART_POOL;
}

/* The byte-order mark and pointer size of this machine, at p (8 bytes). */
static inline void fbk_byte_order(uint8_t *p) {
  uint32_t bom = FBK_BOM;
  memcpy(p, &bom, 4);
  fbk_put32(p + 4, (uint32_t)sizeof(void *));
}

/* 0 when the 8 bytes at p are this machine's byte order and pointer size;
 * else a message. Field storage is copied as it is in memory, so a
 * checkpoint of a machine of the other byte order cannot be restored. */
static inline int fbk_byte_order_check(const uint8_t *p, char *why, size_t n) {
  uint32_t bom, mine = FBK_BOM;
  memcpy(&bom, p, 4);
  const char *here = *(const uint8_t *)&mine == 4 ? "little-endian" : "big-endian";
  if (bom != FBK_BOM) {
    if (bom == __builtin_bswap32(FBK_BOM))
      snprintf(why, n, "the checkpoint was written on a %s machine and this one is %s: its "
               "fields are in the other byte order and cannot be restored here",
               *(const uint8_t *)&mine == 4 ? "big-endian" : "little-endian", here);
    else
      snprintf(why, n, "the checkpoint is damaged (its header's byte-order mark is malformed)");
    return 1;
  }
  uint32_t ptr = fbk_get32(p + 4);
  if (ptr != (uint32_t)sizeof(void *)) {
    snprintf(why, n, "the checkpoint was written on a machine with %u-byte pointers and this one "
             "has %u-byte pointers: it cannot be restored here", ptr, (unsigned)sizeof(void *));
    return 1;
  }
  return 0;
}

#endif
