/* The counter-based generator behind rand(): a value is a pure function of
 * (seed, launch, call site, parallel iteration, call count within the
 * iteration), so results never depend on threads, chunking or the optimizer.
 * codegen/runtime implements the same mixing for device code; the two are
 * tested against each other. */
#include "ir_internal.h"

uint64_t fb_rand_bits(uint64_t seed, uint64_t launch, uint64_t site, uint64_t iter,
                      uint64_t count) {
  uint64_t h = fb__mix64(seed);
  h = fb__mix64(h ^ launch);
  h = fb__mix64(h ^ site);
  h = fb__mix64(h ^ iter);
  return fb__mix64(h ^ count);
}

float fb_rand_f32(uint64_t bits) { return (float)(bits >> 40) * (1.0f / 16777216.0f); }
