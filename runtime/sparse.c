/* Sparse SNodes of one session (runtime.h "sparse"): the device state of
 * codegen/rt/fb_rt.h in the session's device memory (host memory on the CPU,
 * managed memory on CUDA), the block pool (on the CPU address space reserved
 * with mmap, so untouched pages cost nothing; on CUDA managed memory whose
 * fresh blocks the device runtime zeroes; handed out by the device runtime's
 * bump allocator), list storage sized before each listgen,
 * memory accounting against the session's limit, and host access to field
 * elements below sparse containers (reads of inactive cells are NULL;
 * writes activate, through the same runtime functions the tasks call). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "runtime/runtime.h"

_Static_assert(FB_RT_EQUOTA == FB_EQUOTA && FB_RT_EBOUNDS == FB_EBOUNDS, "error codes");
_Static_assert(FB_RT_BITMASKED == FB_SN_BITMASKED && FB_RT_POINTER == FB_SN_POINTER &&
                   FB_RT_DYNAMIC == FB_SN_DYNAMIC && FB_RT_DENSE == FB_SN_DENSE,
               "kinds");
_Static_assert(sizeof(fb_rt_dctx) == sizeof(fb_rt_ctx), "fb_rt_dctx mirrors fb_rt_ctx");
_Static_assert(sizeof(fb_rt_list) == 64, "one cache line per list (fb_rt.h)");
_Static_assert(sizeof(fb_rt_elem) == 24, "list elements are 24 bytes");

#define POOL_MAX ((size_t)1 << 40) /* most address space one session reserves */
#define POOL_MIN ((size_t)1 << 26)

struct fb_sparse {
  const fb_layout *l;
  fb_devmem *mem;
  fb_rt_state *st;      /* in device memory (fb_devmem_alloc): the state, then
                           allocs, then lists, one allocation of block_bytes */
  size_t block_bytes;
  /* What the host reads and writes: st and its tables themselves, or, on
   * memory the host must copy (copies), a host mirror of the block, pulled
   * before the host reads it and pushed after the host changed it (dirty)
   * while no task runs; its allocs and lists fields hold device addresses. */
  fb_rt_state *h;
  fb_rt_allocator *ha;
  fb_rt_list *hl;
  int copies, dirty;
  int xrc;              /* a copy of a host walk failed: its code and message */
  char xerr[400];
  uint64_t *per_parent; /* per SNode: list elements one parent element may add */
  uint64_t *total;      /* per SNode: cells in its whole index space */
  size_t pool_reserved;
  uint64_t list_bytes;
};

/* Without a limit a session's pool may grow to the machine's memory. */
static size_t physical_memory(void) {
  long pages = sysconf(_SC_PHYS_PAGES), size = sysconf(_SC_PAGESIZE);
  if (pages <= 0 || size <= 0) return POOL_MIN;
  uint64_t bytes = (uint64_t)pages * (uint64_t)size;
  return bytes > POOL_MAX ? POOL_MAX : (size_t)bytes;
}

/* Address space for the pool: the limit's worth, or the machine's memory
 * without one (MAP_NORESERVE: pages exist once they are touched, so many
 * sessions can hold reservations at once). */
static int reserve_pool(fb_sparse *sp, char *err, size_t errlen) {
  const fb_memsys *ms = sp->mem->ms;
  size_t want = sp->mem->limit ? (size_t)sp->mem->limit : physical_memory();
  if (want > POOL_MAX) want = POOL_MAX;
  if (ms && ms->pool_max && want > ms->pool_max) want = (size_t)ms->pool_max;
  want = (want + 4095) / 4096 * 4096;
  for (; ms && want >= 4096; want /= 2) {
    if ((sp->h->pool = ms->reserve(ms->user, want))) {
      sp->pool_reserved = want;
      sp->h->zero_fresh = 1;
      return 0;
    }
    /* device memory: the limit bounds the pool, the device may hold less */
    if ((sp->mem->limit && !sp->copies) || want <= POOL_MIN) break;
  }
  if (ms && ms->oom && ms->oom(ms->user, err, errlen) == 0) return FB_EQUOTA;
  for (; !ms && want >= 4096; want /= 2) {
    void *p = mmap(NULL, want, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                   -1, 0);
    if (p != MAP_FAILED) {
      sp->h->pool = p;
      sp->pool_reserved = want;
      return 0;
    }
    if (sp->mem->limit || want <= POOL_MIN) break;
  }
  fb_errf(err, errlen, "cannot reserve address space for the sparse block pool");
  return FB_ENOMEM;
}

static int has_allocating(const fb_layout *l) {
  for (int i = 0; i < l->nnodes; i++)
    if (fb_cg_block_bytes(l, i)) return 1;
  return 0;
}

static int init_tables(fb_sparse *sp, char *err, size_t errlen) {
  const fb_layout *l = sp->l;
  for (int i = 1; i < l->nnodes; i++) {
    const fb_snode *n = &l->nodes[i];
    uint64_t bb = fb_cg_block_bytes(l, i);
    if (bb) {
      sp->ha[i].block_bytes = bb;
      /* 8 bytes unused, the header, then the data: 16-aligned (the pool
       * base is page-aligned and every stride a multiple of 16), which a
       * 16-byte compare-and-swap into a cell needs (codegen/emit_mem.c) */
      sp->ha[i].stride = ((bb + 7) / 8 * 8 + 16 + 15) / 16 * 16;
    }
    if (!fb_cg_is_sparse(n->kind)) continue;
    fb_rt_lg d;
    int rc = fb_cg_listgen_desc(l, i, &d, err, errlen);
    if (rc) return rc;
    sp->per_parent[i] = (uint64_t)(d.ninst * d.p_ncells);
    sp->total[i] = 1;
    for (int a = 0; a < FB_MAX_AXES; a++) sp->total[i] *= (uint64_t)n->shape[a];
  }
  return 0;
}

/* The mirror from the device, and back (no-ops when the host reads st
 * itself). A failed copy is kept for fb_sparse_host_error. */
static int pull(fb_sparse *sp) {
  if (!sp->copies || sp->xrc) return sp->xrc;
  int rc = fb_devmem_get(sp->mem, sp->h, sp->st, sp->block_bytes, sp->xerr, sizeof sp->xerr);
  return sp->xrc = rc;
}

static int push(fb_sparse *sp) {
  if (!sp->copies || sp->xrc) return sp->xrc;
  sp->dirty = 0;
  int rc = fb_devmem_put(sp->mem, sp->st, sp->h, sp->block_bytes, sp->xerr, sizeof sp->xerr);
  return sp->xrc = rc;
}

int fb_sparse_host_error(fb_sparse *sp, char *err, size_t errlen) {
  int rc = sp->xrc;
  if (rc) fb_errf(err, errlen, "%s", sp->xerr);
  sp->xrc = 0;
  sp->xerr[0] = 0;
  return rc;
}

static size_t align16(size_t x) { return (x + 15) / 16 * 16; }
static size_t align64(size_t x) { return (x + 63) / 64 * 64; }

int fb_sparse_new(const fb_layout *l, fb_devmem *mem, fb_sparse **out, char *err, size_t errlen) {
  *out = NULL;
  fb_sparse *sp = calloc(1, sizeof *sp);
  size_t n = (size_t)l->nnodes;
  size_t at_allocs = align16(sizeof(fb_rt_state));
  size_t at_lists = align64(at_allocs + n * sizeof(fb_rt_allocator)); /* a line per list */
  if (sp) {
    sp->mem = mem;
    sp->copies = fb_memsys_copies(mem->ms);
    sp->block_bytes = at_lists + n * sizeof(fb_rt_list);
    sp->st = fb_devmem_alloc(mem, sp->block_bytes);
    sp->h = !sp->st ? NULL : sp->copies ? calloc(1, sp->block_bytes) : sp->st;
    sp->per_parent = calloc(n, sizeof *sp->per_parent);
    sp->total = calloc(n, sizeof *sp->total);
  }
  if (!sp || !sp->st || !sp->h || !sp->per_parent || !sp->total) {
    int rc = sp && !sp->st ? fb_devmem_oom(mem, sp->block_bytes, "the sparse runtime", err, errlen)
                           : (fb_errf(err, errlen, "sparse runtime: out of memory"), FB_ENOMEM);
    fb_sparse_free(sp);
    return rc;
  }
  sp->ha = (fb_rt_allocator *)((uint8_t *)sp->h + at_allocs);
  sp->hl = (fb_rt_list *)((uint8_t *)sp->h + at_lists);
  sp->h->allocs = (fb_rt_allocator *)((uint8_t *)sp->st + at_allocs); /* device addresses */
  sp->h->lists = (fb_rt_list *)((uint8_t *)sp->st + at_lists);
  sp->l = l;
  sp->h->nnodes = n;
  sp->h->oom = sp->h->oom_owner = 0;
  int rc = init_tables(sp, err, errlen);
  if (!rc && has_allocating(l)) rc = reserve_pool(sp, err, errlen);
  if (!rc && push(sp)) rc = fb_sparse_host_error(sp, err, errlen);
  if (rc) {
    fb_sparse_free(sp);
    return rc;
  }
  fb_sparse_begin(sp);
  if (sp->xrc) {
    rc = fb_sparse_host_error(sp, err, errlen);
    fb_sparse_free(sp);
    return rc;
  }
  *out = sp;
  return 0;
}

void fb_sparse_free(fb_sparse *sp) {
  if (!sp) return;
  const fb_memsys *ms = sp->mem ? sp->mem->ms : NULL;
  fb_rt_state *h = sp->h;
  if (h && h->pool) {
    if (ms) ms->unreserve(ms->user, h->pool, sp->pool_reserved);
    else munmap(h->pool, sp->pool_reserved);
  }
  if (h)
    for (uint64_t i = 0; i < h->nnodes; i++)
      fb_devmem_free(sp->mem, sp->hl[i].elems, sp->hl[i].cap * sizeof(fb_rt_elem));
  if (sp->copies) free(sp->h);
  if (sp->st) fb_devmem_free(sp->mem, sp->st, sp->block_bytes);
  free(sp->per_parent);
  free(sp->total);
  free(sp);
}

fb_rt_state *fb_sparse_state(fb_sparse *sp) { return sp->st; }

/* The getters read the device's state: they pull the mirror (a cache of
 * the device's, so const in spirit). */
uint64_t fb_sparse_pool_used(const fb_sparse *sp) {
  pull((fb_sparse *)sp);
  return __atomic_load_n(&sp->h->pool_used, __ATOMIC_RELAXED);
}

uint64_t fb_sparse_live_blocks(const fb_sparse *sp, int snode) {
  if (snode < 0 || (uint64_t)snode >= sp->h->nnodes) return 0;
  pull((fb_sparse *)sp);
  return __atomic_load_n(&sp->ha[snode].live, __ATOMIC_RELAXED);
}

uint64_t fb_sparse_changes(const fb_sparse *sp, int snode) {
  if (snode < 0 || (uint64_t)snode >= sp->h->nnodes) return 0;
  pull((fb_sparse *)sp);
  return __atomic_load_n(&sp->ha[snode].changes, __ATOMIC_RELAXED);
}

/* Everything but the pool: root, scratch and lists. */
static uint64_t others(const fb_sparse *sp) {
  return sp->mem->root_bytes + sp->mem->gtmp_bytes + sp->list_bytes +
         __atomic_load_n(&sp->mem->host, __ATOMIC_RELAXED);
}

static void account(fb_sparse *sp) {
  sp->mem->extra = sp->list_bytes + __atomic_load_n(&sp->h->pool_used, __ATOMIC_RELAXED);
}

/* After tasks ran: what they allocated; after host walks: what they did. */
void fb_sparse_end(fb_sparse *sp) {
  if (sp->dirty) push(sp);
  else pull(sp);
  account(sp);
}

/* The pool's cap in the mirror: what the limit leaves beside the rest. */
static void set_pool_cap(fb_sparse *sp) {
  uint64_t cap = sp->pool_reserved;
  if (sp->mem->limit) {
    uint64_t o = others(sp);
    uint64_t left = sp->mem->limit > o ? sp->mem->limit - o : 0;
    if (left < cap) cap = left;
  }
  sp->h->pool_cap = cap;
}

void fb_sparse_begin(fb_sparse *sp) {
  pull(sp);
  set_pool_cap(sp);
  push(sp);
  account(sp);
}

static const char *label(const fb_snode *n, char *buf, size_t len) {
  if (n->name) snprintf(buf, len, "'%s'", n->name);
  else snprintf(buf, len, "%d", n->id);
  return buf;
}

static int list_resize(fb_sparse *sp, int snode, uint64_t cap, char *err, size_t errlen);

int fb_sparse_prepare_list(fb_sparse *sp, int snode, char *err, size_t errlen) {
  if (pull(sp)) return fb_sparse_host_error(sp, err, errlen);
  fb_rt_list *list = &sp->hl[snode];
  int parent = fb_cg_sparse_parent(sp->l, snode);
  uint64_t np = 1;
  if (parent) {
    const fb_rt_list *pl = &sp->hl[parent];
    np = pl->count < pl->cap ? pl->count : pl->cap;
  }
  uint64_t need = np * sp->per_parent[snode];
  if (need > sp->total[snode]) need = sp->total[snode];
  if (need <= list->cap) return 0;
  uint64_t cap = 64;
  while (cap < need) cap *= 2;
  if (cap > sp->total[snode]) cap = sp->total[snode];
  return list_resize(sp, snode, cap, err, errlen);
}

int fb_sparse_restore_list(fb_sparse *sp, int snode, uint64_t cap, char *err, size_t errlen) {
  if (snode <= 0 || (uint64_t)snode >= sp->h->nnodes || !fb_cg_is_sparse(sp->l->nodes[snode].kind) ||
      cap > sp->total[snode]) {
    fb_errf(err, errlen, "the list of SNode %d cannot hold %llu cells", snode,
            (unsigned long long)cap);
    return FB_EINVAL;
  }
  if (pull(sp)) return fb_sparse_host_error(sp, err, errlen);
  if (cap == sp->hl[snode].cap) return 0;
  return list_resize(sp, snode, cap, err, errlen);
}

uint64_t fb_sparse_pool_room(const fb_sparse *sp) { return sp->pool_reserved; }

/* Give snode's list storage for cap elements (its old storage freed). */
static int list_resize(fb_sparse *sp, int snode, uint64_t cap, char *err, size_t errlen) {
  fb_rt_list *list = &sp->hl[snode];
  uint64_t bytes = cap * sizeof(fb_rt_elem), old = list->cap * sizeof(fb_rt_elem);
  uint64_t after = others(sp) - old + bytes + fb_sparse_pool_used(sp);
  const fb_snode *n = &sp->l->nodes[snode];
  char name[160];
  if (sp->mem->limit && after > sp->mem->limit) {
    fb_errf(err, errlen,
            "out of device memory for the list of SNode %s (%s, %llu bytes; limit "
            "%llu bytes)",
            label(n, name, sizeof name), fb_snode_kind_name(n->kind), (unsigned long long)bytes,
            (unsigned long long)sp->mem->limit);
    return FB_EQUOTA;
  }
  void *p = fb_devmem_alloc(sp->mem, (size_t)bytes);
  if (!p) {
    char what[200];
    snprintf(what, sizeof what, "the list of SNode %s", label(n, name, sizeof name));
    return fb_devmem_oom(sp->mem, (size_t)bytes, what, err, errlen);
  }
  fb_devmem_free(sp->mem, list->elems, (size_t)old);
  list->elems = p;
  list->cap = cap;
  sp->list_bytes = sp->list_bytes - old + bytes;
  /* the mirror holds the list's new storage: pushed as it is (pulling
   * first, as fb_sparse_begin does, would bring back the old, freed one) */
  set_pool_cap(sp);
  push(sp);
  account(sp);
  return sp->xrc ? fb_sparse_host_error(sp, err, errlen) : 0;
}

int fb_sparse_take_oom(fb_sparse *sp, int *snode, uint64_t *bytes) {
  if (!sp->dirty) pull(sp); /* dirty: the host's own walk ran out */
  uint64_t w = __atomic_exchange_n(&sp->h->oom, 0, __ATOMIC_RELAXED);
  __atomic_store_n(&sp->h->oom_owner, 0, __ATOMIC_RELAXED);
  if (!w) return 0;
  push(sp);
  *snode = (int)(uint32_t)w;
  *bytes = sp->ha[*snode].block_bytes;
  return 1;
}

/* ---------------------------------------------------------------- host access */

/* Local cell number in container c of global index gi of SNode leaf. */
static int64_t local_lin(const fb_layout *l, const fb_snode *c, int leaf, const int64_t *gi) {
  int64_t lin = 0;
  for (int a = 0; a < FB_MAX_AXES; a++) {
    if (!(c->axes & (1u << a))) continue;
    int64_t local = gi[a] / fb_layout_stride(l, c->id, leaf, a) % c->size[a];
    lin = lin * c->size[a] + local;
  }
  return lin;
}

static uint8_t *host_bitmasked(const fb_snode *c, uint8_t *node, int64_t lin, int write) {
  uint32_t *word = (uint32_t *)node + lin / 32, bit = 1u << (lin % 32);
  if (!(__atomic_load_n(word, __ATOMIC_RELAXED) & bit)) {
    if (!write) return NULL;
    __atomic_fetch_or(word, bit, __ATOMIC_RELAXED);
  }
  return node + fb_cg_mask_bytes(c) + (uint64_t)lin * c->cell_bytes;
}

static uint8_t *host_dynamic(fb_rt_dctx *ctx, const fb_snode *c, uint8_t *node, int64_t n,
                             int write) {
  uint64_t len = *(uint64_t *)node;
  uint64_t chunk = ((uint64_t *)(node + 8))[n / c->chunk];
  if ((uint64_t)n < len && chunk)
    return (uint8_t *)(uintptr_t)chunk + (n % c->chunk) * (int64_t)c->cell_bytes;
  if (!write) return NULL;
  return fb_rt_dyn_activate(ctx, c->id, node, n, c->chunk, (int64_t)c->cell_bytes, 0);
}

/* Walk place[idx]'s path (npath containers from the root): the element's
 * cell storage, or, with 0 <= upto < npath, the address of container
 * path[upto]'s node and the element's cell number in it (*lin). NULL: an
 * inactive container when reading, out of memory when writing; writing
 * activates on the way. */
static uint8_t *walk(fb_sparse *sp, uint8_t *root, int place, const int64_t *idx, int write,
                     const int *path, int npath, int upto, int64_t *lin) {
  const fb_layout *l = sp->l;
  const fb_snode *f = &l->nodes[place];
  int64_t gi[FB_MAX_AXES] = {0, 0, 0, 0};
  for (int d = 0; d < f->ndim; d++) gi[f->dim_axis[d]] = idx[d];
  int32_t error[2] = {0, 0}; /* the error and the blame word (fb_rt.h) */
  fb_rt_dctx ctx = {root, NULL, NULL, NULL, error, 0, 0, sp->st, NULL};
  uint8_t *base = root;
  for (int i = 0; i < npath && base; i++) {
    const fb_snode *c = &l->nodes[path[i]];
    int64_t cl = local_lin(l, c, place, gi);
    uint8_t *node = base + c->offset;
    if (i == upto) {
      *lin = cl;
      return node;
    }
    switch (c->kind) {
    case FB_SN_BITMASKED: base = host_bitmasked(c, node, cl, write); break;
    case FB_SN_POINTER: {
      uint64_t *slot = (uint64_t *)node + cl;
      base = *slot   ? (uint8_t *)(uintptr_t)*slot
             : write ? fb_rt_ptr_activate(&ctx, c->id, slot, 0)
                     : NULL;
      break;
    }
    case FB_SN_DYNAMIC: base = host_dynamic(&ctx, c, node, cl, write); break;
    default: base = node + (uint64_t)cl * c->cell_bytes; break;
    }
  }
  return base;
}

/* ---- the same walks on device memory the host must copy (sp->copies):
 * every load and store a copy, activation by the host on the mirror's
 * allocators (the device is idle: fb_sparse_begin pulled the mirror; a
 * walk that changed it marks it dirty and fb_sparse_end pushes it). */

static int ld(fb_sparse *sp, void *dst, uint64_t dev, size_t n) {
  if (!sp->xrc)
    sp->xrc = fb_devmem_get(sp->mem, dst, (void *)(uintptr_t)dev, n, sp->xerr, sizeof sp->xerr);
  return sp->xrc;
}

static int st(fb_sparse *sp, uint64_t dev, const void *src, size_t n) {
  if (!sp->xrc)
    sp->xrc = fb_devmem_put(sp->mem, (void *)(uintptr_t)dev, src, n, sp->xerr, sizeof sp->xerr);
  return sp->xrc;
}

#define HANDLE_MASK ((((uint64_t)1) << 40) - 1) /* tagged free-list heads (fb_rt.c) */

/* fb_rt_alloc by the host: a block of snode from its free list or the
 * pool (zeroed), its device address; 0 when the pool is full (recorded as
 * the state's oom) or a copy failed. */
static uint64_t dev_alloc(fb_sparse *sp, int snode) {
  fb_rt_allocator *a = &sp->ha[snode];
  uint64_t pool = (uint64_t)(uintptr_t)sp->h->pool, h = a->free_head & HANDLE_MASK;
  sp->dirty = 1;
  if (h) {
    uint64_t next = 0;
    if (ld(sp, &next, pool + h * 8 - 8, 8)) return 0;
    a->free_head = ((((a->free_head >> 40) + 1) << 40)) | (next & HANDLE_MASK);
  } else {
    if (sp->h->pool_used + a->stride > sp->h->pool_cap) {
      if (!sp->h->oom) sp->h->oom = FB_RT_OOM_WORD(0, snode);
      return 0;
    }
    h = (sp->h->pool_used + 16) / 8;
    sp->h->pool_used += a->stride;
    if (!sp->xrc)
      sp->xrc = sp->mem->ms->fill(sp->mem->ms->user, (void *)(uintptr_t)(pool + h * 8), 0,
                                  a->stride - 16, sp->xerr, sizeof sp->xerr);
    if (sp->xrc) return 0;
  }
  a->live++;
  return pool + h * 8;
}

/* The pointer slot at `slot`: its block, activated when writing. */
static uint64_t dev_slot(fb_sparse *sp, int snode, uint64_t slot, int write) {
  uint64_t v = 0;
  if (ld(sp, &v, slot, 8) || v || !write) return v;
  if (!(v = dev_alloc(sp, snode)) || st(sp, slot, &v, 8)) return 0;
  sp->ha[snode].changes++;
  return v;
}

static uint64_t dev_walk(fb_sparse *sp, uint64_t root, int place, const int64_t *idx, int write,
                         const int *path, int npath, int upto, int64_t *lin) {
  const fb_layout *l = sp->l;
  const fb_snode *f = &l->nodes[place];
  int64_t gi[FB_MAX_AXES] = {0, 0, 0, 0};
  for (int d = 0; d < f->ndim; d++) gi[f->dim_axis[d]] = idx[d];
  uint64_t base = root;
  for (int i = 0; i < npath && base; i++) {
    const fb_snode *c = &l->nodes[path[i]];
    int64_t cl = local_lin(l, c, place, gi);
    uint64_t node = base + c->offset;
    if (i == upto) {
      *lin = cl;
      return node;
    }
    switch (c->kind) {
    case FB_SN_BITMASKED: {
      uint64_t wa = node + (uint64_t)(cl / 32) * 4;
      uint32_t w = 0, bit = 1u << (cl % 32);
      if (ld(sp, &w, wa, 4)) return 0;
      if (!(w & bit)) {
        w |= bit;
        if (!write || st(sp, wa, &w, 4)) return 0;
      }
      base = node + fb_cg_mask_bytes(c) + (uint64_t)cl * c->cell_bytes;
      break;
    }
    case FB_SN_POINTER: base = dev_slot(sp, c->id, node + (uint64_t)cl * 8, write); break;
    case FB_SN_DYNAMIC: {
      uint64_t len = 0, chunk = 0, k = (uint64_t)cl / (uint64_t)c->chunk;
      if (ld(sp, &len, node, 8) || ld(sp, &chunk, node + 8 + k * 8, 8)) return 0;
      if (!((uint64_t)cl < len && chunk)) {
        if (!write) return 0;
        for (uint64_t j = 0; j <= k; j++)
          if (!(chunk = dev_slot(sp, c->id, node + 8 + j * 8, 1))) return 0;
        if (len < (uint64_t)cl + 1) {
          len = (uint64_t)cl + 1;
          if (st(sp, node, &len, 8)) return 0;
        }
      }
      base = chunk + (uint64_t)(cl % c->chunk) * c->cell_bytes;
      break;
    }
    default: base = node + (uint64_t)cl * c->cell_bytes; break;
    }
  }
  return base;
}

/* fb_sparse_bits_run's mask words on device memory: fetched once, changed
 * on the host, stored back when writing. */
static int dev_bits(fb_sparse *sp, uint64_t node, int64_t lin, int64_t n, int64_t lin_step,
                    uint8_t *active, int write) {
  int64_t first = lin / 32, last = (lin + (n - 1) * lin_step) / 32;
  size_t nw = (size_t)(last - first + 1);
  uint32_t *w = malloc(nw * 4);
  if (!w) {
    fb_errf(sp->xerr, sizeof sp->xerr, "out of memory");
    return sp->xrc = FB_ENOMEM;
  }
  if (!ld(sp, w, node + (uint64_t)first * 4, nw * 4)) {
    for (int64_t k = 0; k < n; k++) {
      int64_t b = lin + k * lin_step;
      uint32_t bit = 1u << (b % 32);
      if (write) w[b / 32 - first] |= bit;
      else active[k] = (w[b / 32 - first] & bit) != 0;
    }
    if (write) st(sp, node + (uint64_t)first * 4, w, nw * 4);
  }
  free(w);
  return sp->xrc;
}

uint8_t *fb_sparse_elem(fb_sparse *sp, uint8_t *root, int place, const int64_t *idx, int write) {
  int path[64];
  int n = fb_layout_path(sp->l, place, path, 64);
  if (n < 0) return NULL;
  int64_t lin = 0;
  if (sp->copies) {
    uint64_t b = dev_walk(sp, (uint64_t)(uintptr_t)root, place, idx, write, path, n, -1, &lin);
    if (sp->dirty) fb_sparse_end(sp);
    return b && !sp->xrc ? (uint8_t *)(uintptr_t)(b + sp->l->nodes[place].offset) : NULL;
  }
  uint8_t *base = walk(sp, root, place, idx, write, path, n, -1, &lin);
  if (write) fb_sparse_end(sp);
  return base ? base + sp->l->nodes[place].offset : NULL;
}

uint8_t *fb_sparse_bits_run(fb_sparse *sp, uint8_t *root, int place, const int64_t *idx,
                            int64_t n, int64_t lin_step, uint8_t *active, int write) {
  const fb_layout *l = sp->l;
  int path[64];
  int depth = fb_layout_path(l, place, path, 64);
  if (depth < 1) return NULL;
  const fb_snode *c = &l->nodes[path[depth - 1]];
  if (c->kind != FB_SN_BITMASKED) return NULL;
  int64_t lin = 0;
  if (sp->copies) {
    uint64_t nd =
        dev_walk(sp, (uint64_t)(uintptr_t)root, place, idx, write, path, depth, depth - 1, &lin);
    if (nd) dev_bits(sp, nd, lin, n, lin_step, active, write);
    if (sp->dirty) fb_sparse_end(sp);
    if (!nd || sp->xrc) return NULL;
    return (uint8_t *)(uintptr_t)(nd + fb_cg_mask_bytes(c) + (uint64_t)lin * c->cell_bytes +
                                  l->nodes[place].offset);
  }
  uint8_t *node = walk(sp, root, place, idx, write, path, depth, depth - 1, &lin);
  if (node) { /* one atomic per mask word the run touches, not per cell */
    uint32_t *words = (uint32_t *)node, acc = 0, cur = 0;
    int64_t at = -1;
    for (int64_t k = 0; k < n; k++) {
      int64_t b = lin + k * lin_step;
      if (b / 32 != at) {
        if (write && acc) __atomic_fetch_or(&words[at], acc, __ATOMIC_RELAXED);
        at = b / 32;
        acc = 0;
        if (!write) cur = __atomic_load_n(&words[at], __ATOMIC_RELAXED);
      }
      uint32_t bit = 1u << (b % 32);
      if (write) acc |= bit;
      else active[k] = (cur & bit) != 0;
    }
    if (write && acc) __atomic_fetch_or(&words[at], acc, __ATOMIC_RELAXED);
  }
  if (write) fb_sparse_end(sp);
  if (!node) return NULL;
  return node + fb_cg_mask_bytes(c) + (uint64_t)lin * c->cell_bytes + l->nodes[place].offset;
}
