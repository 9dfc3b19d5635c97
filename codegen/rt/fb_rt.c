/* The device runtime of sparse SNodes (see fb_rt.h): the block pool and the
 * node allocators (free lists with tagged heads, bump allocation from the
 * pool, pending lists emptied by gc), activation of pointer and dynamic
 * cells, deactivation, and list generation.
 *
 * Freestanding and target-neutral: built by gcc into the host libraries and
 * by clang-19 into bitcode for x86_64 and nvptx64 (codegen/CMakeLists.txt).
 * Atomics are the GCC __atomic builtins, which both compilers lower to
 * native atomic instructions on every target. Loads are relaxed and there
 * are no __atomic fences (NVPTX in LLVM 19 selects neither acquire loads nor
 * fences): a block is published by the compare-and-swap of its slot, and its
 * bytes were zeroed before the task started (fresh CPU pool pages, or gc),
 * or, fresh from a GPU pool, by the thread that took it, which then fences
 * with membar.gl (clear_fresh). */
#include "fb_rt.h"

#if defined(__clang__)
#define FB_RT_INLINE __attribute__((always_inline))
#else
#define FB_RT_INLINE
#endif

#define RELAXED __ATOMIC_RELAXED
#define ACQUIRE __ATOMIC_ACQUIRE
#define RELEASE __ATOMIC_RELEASE
#define ACQ_REL __ATOMIC_ACQ_REL

/* Tagged list heads: a handle in the low 40 bits, a counter above. */
#define HANDLE_BITS 40
#define HANDLE_MASK ((((uint64_t)1) << HANDLE_BITS) - 1)

static uint64_t *header(fb_rt_state *rt, uint64_t h) { return (uint64_t *)(rt->pool + h * 8 - 8); }

static uint64_t handle_of(fb_rt_state *rt, const uint8_t *block) {
  return (uint64_t)(block - rt->pool) / 8;
}

static void latch(fb_rt_dctx *ctx, int32_t code) {
  int32_t none = 0;
  __atomic_compare_exchange_n(ctx->error, &none, code, 0, RELAXED, RELAXED);
}

/* A failure of a fused part, w = FB_RT_BLAME(part) or FB_RT_BLAME_OOM(part):
 * the earliest part wins (fb_rt.h). */
static void blame(fb_rt_dctx *ctx, int32_t w) {
  int32_t cur = __atomic_load_n(&ctx->error[1], RELAXED);
  while (cur < w && !__atomic_compare_exchange_n(&ctx->error[1], &cur, w, 1, RELAXED, RELAXED)) {}
}

static void push(fb_rt_state *rt, uint64_t *head, uint64_t h) {
  uint64_t old = __atomic_load_n(head, RELAXED);
  for (;;) {
    __atomic_store_n(header(rt, h), old & HANDLE_MASK, RELAXED);
    uint64_t nw = ((((old >> HANDLE_BITS) + 1) << HANDLE_BITS)) | h;
    if (__atomic_compare_exchange_n(head, &old, nw, 1, RELEASE, RELAXED)) return;
  }
}

static uint64_t pop(fb_rt_state *rt, uint64_t *head) {
  uint64_t old = __atomic_load_n(head, RELAXED);
  while (old & HANDLE_MASK) {
    uint64_t next = __atomic_load_n(header(rt, old & HANDLE_MASK), RELAXED);
    uint64_t nw = ((((old >> HANDLE_BITS) + 1) << HANDLE_BITS)) | (next & HANDLE_MASK);
    if (__atomic_compare_exchange_n(head, &old, nw, 1, ACQUIRE, ACQUIRE)) return old & HANDLE_MASK;
  }
  return 0;
}

/* Snode's block did not fit, in fused part `part`. The state's oom word
 * keeps one record for the host: the first task to run out owns it (a queued
 * device runs a batch's tasks before the host reads any), and in that task
 * the earliest part replaces a later part's record (the first SNode a part
 * ran out on stays), as sync mode would report the earliest launch. */
static void out_of_memory(fb_rt_dctx *ctx, int32_t snode, int32_t part) {
  fb_rt_state *rt = ctx->runtime;
  uint64_t me = (uint64_t)(uintptr_t)ctx->error, owner = 0;
  if (__atomic_compare_exchange_n(&rt->oom_owner, &owner, me, 0, RELAXED, RELAXED)) owner = me;
  if (owner == me) {
    uint64_t w = FB_RT_OOM_WORD(part, snode), cur = __atomic_load_n(&rt->oom, RELAXED);
    while ((cur >> 32) < (w >> 32) &&
           !__atomic_compare_exchange_n(&rt->oom, &cur, w, 1, RELAXED, RELAXED)) {}
  }
  latch(ctx, FB_RT_EQUOTA);
  blame(ctx, FB_RT_BLAME_OOM(part));
}

/* ---------------------------------------------------------------- allocation */

/* A block fresh from a pool whose memory is not zero (a GPU pool): zeroed
 * by the thread that took it, and the stores made visible device-wide
 * before the block can be published by its slot's compare-and-swap, so no
 * thread that finds the block sees these stores land after its own. */
static void clear_fresh(uint8_t *p, uint64_t n) {
  for (uint64_t i = 0; i + 8 <= n; i += 8) *(uint64_t *)(p + i) = 0;
#if defined(__NVPTX__)
  __asm__ volatile("membar.gl;" ::: "memory");
#else
  __atomic_thread_fence(RELEASE);
#endif
}

uint8_t *fb_rt_alloc(fb_rt_dctx *ctx, int32_t snode, int32_t part) {
  fb_rt_state *rt = ctx->runtime;
  fb_rt_allocator *a = &rt->allocs[snode];
  uint64_t h = pop(rt, &a->free_head);
  if (!h) {
    uint64_t used = __atomic_load_n(&rt->pool_used, RELAXED);
    do {
      if (used + a->stride > rt->pool_cap) {
        out_of_memory(ctx, snode, part);
        return 0;
      }
    } while (
        !__atomic_compare_exchange_n(&rt->pool_used, &used, used + a->stride, 1, RELAXED, RELAXED));
    h = (used + 16) / 8; /* data 16-aligned: see the stride (runtime/sparse.c) */
    if (rt->zero_fresh) clear_fresh(rt->pool + h * 8, a->stride - 16);
  }
  __atomic_fetch_add(&a->live, 1, RELAXED);
  return rt->pool + h * 8;
}

/* A block that never became visible (lost an activation race): straight
 * back onto the free list, still zero. */
static void give_back(fb_rt_state *rt, int32_t snode, uint8_t *block) {
  fb_rt_allocator *a = &rt->allocs[snode];
  __atomic_fetch_sub(&a->live, 1, RELAXED);
  push(rt, &a->free_head, handle_of(rt, block));
}

uint8_t *fb_rt_ptr_activate(fb_rt_dctx *ctx, int32_t snode, uint64_t *slot, int32_t part) {
  uint64_t cur = __atomic_load_n(slot, RELAXED);
  if (cur) return (uint8_t *)(uintptr_t)cur;
  uint8_t *b = fb_rt_alloc(ctx, snode, part);
  if (!b) return 0;
  uint64_t expected = 0;
  if (__atomic_compare_exchange_n(slot, &expected, (uint64_t)(uintptr_t)b, 0, ACQ_REL, ACQUIRE)) {
    __atomic_fetch_add(&ctx->runtime->allocs[snode].changes, 1, RELAXED);
    return b;
  }
  give_back(ctx->runtime, snode, b);
  return (uint8_t *)(uintptr_t)expected;
}

void fb_rt_release(fb_rt_dctx *ctx, int32_t snode, uint8_t *block) {
  fb_rt_state *rt = ctx->runtime;
  __atomic_fetch_add(&rt->allocs[snode].changes, 1, RELAXED);
  push(rt, &rt->allocs[snode].pending, handle_of(rt, block));
}

/* ---------------------------------------------------------------- dynamic */

static void atomic_max_u64(uint64_t *p, uint64_t v) {
  uint64_t cur = __atomic_load_n(p, RELAXED);
  while (cur < v && !__atomic_compare_exchange_n(p, &cur, v, 1, RELAXED, RELAXED)) {}
}

uint8_t *fb_rt_dyn_activate(fb_rt_dctx *ctx, int32_t snode, uint8_t *node, int64_t n, int64_t chunk,
                            int64_t cell_bytes, int32_t part) {
  uint64_t *slots = (uint64_t *)(node + 8);
  uint8_t *c = 0;
  for (int64_t k = 0; k <= n / chunk; k++)
    if (!(c = fb_rt_ptr_activate(ctx, snode, &slots[k], part))) return 0;
  atomic_max_u64((uint64_t *)node, (uint64_t)n + 1);
  return c + (n % chunk) * cell_bytes;
}

uint8_t *fb_rt_dyn_append(fb_rt_dctx *ctx, int32_t snode, uint8_t *node, int64_t max, int64_t chunk,
                          int64_t cell_bytes, int64_t *n_out, int32_t part) {
  uint64_t n = __atomic_fetch_add((uint64_t *)node, 1, RELAXED);
  *n_out = -1;
  if (n >= (uint64_t)max) {
    latch(ctx, FB_RT_EBOUNDS);
    blame(ctx, FB_RT_BLAME(part));
    return 0;
  }
  uint64_t *slots = (uint64_t *)(node + 8);
  uint8_t *c = fb_rt_ptr_activate(ctx, snode, &slots[n / (uint64_t)chunk], part);
  if (!c) return 0;
  *n_out = (int64_t)n;
  return c + (int64_t)(n % (uint64_t)chunk) * cell_bytes;
}

void fb_rt_dyn_clear(fb_rt_dctx *ctx, int32_t snode, uint8_t *node, int64_t nchunks) {
  __atomic_store_n((uint64_t *)node, 0, RELAXED);
  uint64_t *slots = (uint64_t *)(node + 8);
  for (int64_t k = 0; k < nchunks; k++) {
    uint64_t b = __atomic_exchange_n(&slots[k], 0, ACQ_REL);
    if (b) fb_rt_release(ctx, snode, (uint8_t *)(uintptr_t)b);
  }
}

/* ---------------------------------------------------------------- deactivation, gc */

/* Unlink every block in the slots of group g inside the cell at `cell`. */
static void release_group(fb_rt_dctx *ctx, const fb_rt_group *g, uint8_t *cell) {
  int64_t total = 1;
  for (int64_t l = 0; l < g->nlev; l++) total *= g->count[l];
  for (int64_t t = 0; t < total; t++) {
    int64_t off = g->off, rest = t;
    for (int64_t l = g->nlev - 1; l >= 0; l--) {
      off += g->pre[l] + (rest % g->count[l]) * g->stride[l];
      rest /= g->count[l];
    }
    uint64_t *slots = (uint64_t *)(cell + off + g->slot_off);
    for (int64_t s = 0; s < g->nslots; s++) {
      uint64_t b = __atomic_exchange_n(&slots[s], 0, ACQ_REL);
      if (b) fb_rt_release(ctx, (int32_t)g->snode, (uint8_t *)(uintptr_t)b);
    }
  }
}

static void zero(uint8_t *p, int64_t n) {
  uint64_t *w = (uint64_t *)p;
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) *w++ = 0;
  for (; i < n; i++) p[i] = 0;
}

void fb_rt_cell_clear(fb_rt_dctx *ctx, const fb_rt_cell *d, uint8_t *cell) {
  for (int64_t g = 0; g < d->ngroups; g++) release_group(ctx, &d->g[g], cell);
  zero(cell, d->bytes);
}

void fb_rt_gc(fb_rt_dctx *ctx, const fb_rt_cell *d) {
  fb_rt_state *rt = ctx->runtime;
  fb_rt_allocator *a = &rt->allocs[d->snode];
  uint64_t h = __atomic_exchange_n(&a->pending, 0, ACQ_REL) & HANDLE_MASK;
  while (h) {
    uint64_t next = *header(rt, h) & HANDLE_MASK;
    uint8_t *b = rt->pool + h * 8;
    fb_rt_cell_clear(ctx, d, b);
    __atomic_fetch_sub(&a->live, 1, RELAXED);
    push(rt, &a->free_head, h);
    h = next;
  }
}

/* ---------------------------------------------------------------- lists */

FB_RT_INLINE void fb_rt_clear_list(fb_rt_dctx *ctx, int32_t snode) {
  ctx->runtime->lists[snode].count = 0;
}

FB_RT_INLINE uint64_t fb_rt_list_count(fb_rt_dctx *ctx, int32_t snode) {
  const fb_rt_list *l = &ctx->runtime->lists[snode];
  uint64_t n = l->count;
  return n < l->cap ? n : l->cap;
}

FB_RT_INLINE fb_rt_elem *fb_rt_list_elems(fb_rt_dctx *ctx, int32_t snode) {
  return ctx->runtime->lists[snode].elems;
}

FB_RT_INLINE int64_t fb_rt_listgen_count(fb_rt_dctx *ctx, const fb_rt_lg *d) {
  int64_t np = d->parent ? (int64_t)fb_rt_list_count(ctx, (int32_t)d->parent) : 1;
  return np * d->ninst * d->nchunks;
}

/* Row-major decomposition of a linear cell number over 4 axes. */
static void unlinear(int64_t lin, const int64_t size[4], int64_t out[4]) {
  for (int a = 3; a >= 0; a--) {
    out[a] = lin % size[a];
    lin /= size[a];
  }
}

/* Where the instance of P lies: its node and the global index of its first
 * cell in P's space. */
static uint8_t *instance(fb_rt_dctx *ctx, const fb_rt_lg *d, int64_t e, int64_t inst,
                         int64_t g[4]) {
  uint8_t *base = ctx->root;
  g[0] = g[1] = g[2] = g[3] = 0;
  if (d->parent) {
    const fb_rt_elem *pe = &ctx->runtime->lists[d->parent].elems[e];
    for (int a = 0; a < 4; a++) g[a] = pe->c[a];
    base = pe->ptr;
  }
  int64_t lin[FB_RT_MAX_LEVELS];
  for (int64_t l = d->nlev - 1; l >= 0; l--) {
    lin[l] = inst % d->lev_ncells[l];
    inst /= d->lev_ncells[l];
  }
  for (int64_t l = 0; l < d->nlev; l++) {
    int64_t loc[4];
    unlinear(lin[l], d->lev_size[l], loc);
    for (int a = 0; a < 4; a++) g[a] = g[a] * d->lev_size[l][a] + loc[a];
    base += d->lev_off[l] + lin[l] * d->lev_cb[l];
  }
  for (int a = 0; a < 4; a++) g[a] *= d->p_size[a];
  return base + d->p_off;
}

/* Where a listgen iteration writes: the list's room and elements, read once
 * per iteration into locals (the element stores could alias them, so the
 * compiler would read them again for every element). The list's count sits
 * on the same cache line and every thread of a parallel listgen adds to it:
 * a read of cap or elems per element then missed the cache each time the
 * other thread had added, which made a 2-thread listgen of a leaf level ~4x
 * the CPU time of a 1-thread one. */
typedef struct list_out {
  fb_rt_elem *elems;
  uint64_t cap;
} list_out;

static list_out out_of(const fb_rt_list *l) {
  list_out o = {l->elems, l->cap};
  return o;
}

static void put(list_out o, uint64_t pos, const int64_t g[4], const int64_t size[4], int64_t lin,
                uint8_t *ptr) {
  if (pos >= o.cap) return;
  int64_t loc[4];
  unlinear(lin, size, loc);
  fb_rt_elem *el = &o.elems[pos];
  for (int a = 0; a < 4; a++) el->c[a] = (int32_t)(g[a] + loc[a]);
  el->ptr = ptr;
}

static void gen_bitmasked(fb_rt_list *l, const fb_rt_lg *d, uint8_t *node, const int64_t g[4],
                          int64_t lo, int64_t hi) {
  const uint32_t *mask = (const uint32_t *)node;
  uint8_t *cells = node + d->p_mask_bytes;
  int64_t w0 = lo / 32, w1 = (hi + 31) / 32;
  uint64_t n = 0;
  for (int64_t w = w0; w < w1; w++) n += (uint64_t)__builtin_popcount(mask[w]);
  if (!n) return;
  list_out o = out_of(l);
  uint64_t pos = __atomic_fetch_add(&l->count, n, RELAXED);
  for (int64_t w = w0; w < w1; w++) {
    for (uint32_t bits = mask[w]; bits; bits &= bits - 1) {
      int64_t lin = w * 32 + __builtin_ctz(bits);
      put(o, pos++, g, d->p_size, lin, cells + lin * d->p_cb);
    }
  }
}

static void gen_pointer(fb_rt_list *l, const fb_rt_lg *d, uint8_t *node, const int64_t g[4],
                        int64_t lo, int64_t hi) {
  const uint64_t *slots = (const uint64_t *)node;
  uint64_t n = 0;
  for (int64_t s = lo; s < hi; s++) n += slots[s] != 0;
  if (!n) return;
  list_out o = out_of(l);
  uint64_t pos = __atomic_fetch_add(&l->count, n, RELAXED), end = pos + n;
  for (int64_t s = lo; s < hi && pos < end; s++)
    if (slots[s]) put(o, pos++, g, d->p_size, s, (uint8_t *)(uintptr_t)slots[s]);
}

static void gen_dynamic(fb_rt_list *l, const fb_rt_lg *d, uint8_t *node, const int64_t g[4],
                        int64_t lo, int64_t hi) {
  uint64_t len = *(const uint64_t *)node;
  const uint64_t *chunks = (const uint64_t *)(node + 8);
  if ((uint64_t)hi > len) hi = (int64_t)len;
  uint64_t n = 0;
  for (int64_t s = lo; s < hi; s++) n += chunks[s / d->p_chunk] != 0;
  if (!n) return;
  list_out o = out_of(l);
  uint64_t pos = __atomic_fetch_add(&l->count, n, RELAXED), end = pos + n;
  for (int64_t s = lo; s < hi && pos < end; s++) {
    uint8_t *c = (uint8_t *)(uintptr_t)chunks[s / d->p_chunk];
    if (c) put(o, pos++, g, d->p_size, s, c + (s % d->p_chunk) * d->p_cb);
  }
}

FB_RT_INLINE void fb_rt_listgen_step(fb_rt_dctx *ctx, const fb_rt_lg *d, int64_t it) {
  int64_t per = d->ninst * d->nchunks;
  int64_t e = it / per, rest = it % per;
  int64_t inst = rest / d->nchunks, piece = rest % d->nchunks;
  int64_t g[4];
  uint8_t *node = instance(ctx, d, e, inst, g);
  int64_t lo = piece * d->chunk_cells;
  int64_t hi = lo + d->chunk_cells < d->p_ncells ? lo + d->chunk_cells : d->p_ncells;
  fb_rt_list *l = &ctx->runtime->lists[d->snode];
  switch (d->kind) {
  case FB_RT_BITMASKED: gen_bitmasked(l, d, node, g, lo, hi); break;
  case FB_RT_POINTER: gen_pointer(l, d, node, g, lo, hi); break;
  case FB_RT_DYNAMIC: gen_dynamic(l, d, node, g, lo, hi); break;
  default: break;
  }
}
