/* A compile cache outside the engine (docs/code-cache.md): where the CPU
 * JIT looks for a task's compiled object before it compiles, and hands
 * what it compiled. fuseboxd's is the cache on disk (server/dcache.c).
 *
 * The JIT passes, for a task of partition `partition` (a tenant): target,
 * what it compiles for (back end, LLVM triple, CPU, features, code
 * generation options; the same for every task of one JIT), and ir, the
 * task's IR and layout as text (ir/print.c: canonical, ids renumbered) and
 * its loop's position. The store keys its entries by both (and whatever
 * else it knows: its version, the runtime's bitcode) and confirms a hit by
 * comparing ir. get: 1 and *code (malloc'd object bytes) on a hit, else 0.
 * put: best effort. Both are called from several compile threads at once. */
#ifndef FUSEBOX_CODESTORE_H
#define FUSEBOX_CODESTORE_H

#include <stddef.h>
#include <stdint.h>

typedef struct fb_code_store {
  int (*get)(void *user, uint64_t partition, const char *target, const char *ir, size_t irlen,
             uint8_t **code, size_t *len);
  void (*put)(void *user, uint64_t partition, const char *target, const char *ir, size_t irlen,
              const uint8_t *code, size_t len);
  void *user;
} fb_code_store;

#endif
