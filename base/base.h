/* The small shared base of every folder: a growable array's growth step,
 * string duplication and the hash mixing used by the IR's structural hash,
 * the code cache, the optimizer's keys and the one hash table (map.h).
 * Header-only, libc only; nothing here aborts, and growth failures are
 * reported (FB_ENOMEM). Lives in ir/, the bottom layer,
 * so that every other folder may include it ("base/base.h"). */
#ifndef FB_IR_BASE_H
#define FB_IR_BASE_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fusebox/common.h"

/* Make room for one more element in *v (count n, capacity *cap). */
static inline int fb__grow(void **v, int n, int *cap, size_t elem) {
  if (n < *cap) return 0;
  int nc = *cap ? *cap * 2 : 8;
  void *p = realloc(*v, (size_t)nc * elem);
  if (!p) return FB_ENOMEM;
  *v = p;
  *cap = nc;
  return 0;
}
#define FB_GROW(v, n, cap) fb__grow((void **)&(v), (n), &(cap), sizeof(*(v)))

static inline char *fb__strdup(const char *s) {
  if (!s) return NULL;
  size_t n = strlen(s) + 1;
  char *d = malloc(n);
  if (d) memcpy(d, s, n);
  return d;
}

/* 64-bit FNV-1a step and a final mixer (splitmix64). */
static inline uint64_t fb__fnv(uint64_t h, const void *p, size_t n) {
  const unsigned char *b = p;
  for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
  return h;
}
#define FB_FNV_INIT 0xcbf29ce484222325ull
static inline uint64_t fb__mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
/* Fold x into a hash h built from several values (a key made of parts). */
static inline uint64_t fb__hcombine(uint64_t h, uint64_t x) {
  h ^= x + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
  h *= 0xbf58476d1ce4e5b9ull;
  return h ^ (h >> 31);
}

#endif
