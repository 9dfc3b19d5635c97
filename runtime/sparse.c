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
_Static_assert(sizeof(fb_rt_elem) == 24, "list elements are 24 bytes");

#define POOL_MAX ((size_t)1 << 40) /* most address space one session reserves */
#define POOL_MIN ((size_t)1 << 26)

struct fb_sparse {
  const fb_layout *l;
  fb_devmem *mem;
  fb_rt_state *st;      /* in device memory (fb_devmem_alloc) */
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
    if ((sp->st->pool = ms->reserve(ms->user, want))) {
      sp->pool_reserved = want;
      sp->st->zero_fresh = 1;
      return 0;
    }
    if (sp->mem->limit || want <= POOL_MIN) break;
  }
  for (; !ms && want >= 4096; want /= 2) {
    void *p = mmap(NULL, want, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                   -1, 0);
    if (p != MAP_FAILED) {
      sp->st->pool = p;
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
      sp->st->allocs[i].block_bytes = bb;
      /* 8 bytes unused, the header, then the data: 16-aligned (the pool
       * base is page-aligned and every stride a multiple of 16), which a
       * 16-byte compare-and-swap into a cell needs (codegen/emit_mem.c) */
      sp->st->allocs[i].stride = ((bb + 7) / 8 * 8 + 16 + 15) / 16 * 16;
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

int fb_sparse_new(const fb_layout *l, fb_devmem *mem, fb_sparse **out, char *err, size_t errlen) {
  *out = NULL;
  fb_sparse *sp = calloc(1, sizeof *sp);
  size_t n = (size_t)l->nnodes;
  if (sp) {
    sp->mem = mem;
    sp->st = fb_devmem_alloc(mem, sizeof *sp->st);
  }
  if (sp && sp->st) {
    sp->st->allocs = fb_devmem_alloc(mem, n * sizeof *sp->st->allocs);
    sp->st->lists = fb_devmem_alloc(mem, n * sizeof *sp->st->lists);
    sp->per_parent = calloc(n, sizeof *sp->per_parent);
    sp->total = calloc(n, sizeof *sp->total);
  }
  if (!sp || !sp->st || !sp->st->allocs || !sp->st->lists || !sp->per_parent || !sp->total) {
    fb_sparse_free(sp);
    fb_errf(err, errlen, "sparse runtime: out of memory");
    return FB_ENOMEM;
  }
  sp->l = l;
  sp->st->nnodes = n;
  sp->st->oom = sp->st->oom_owner = 0;
  int rc = init_tables(sp, err, errlen);
  if (!rc && has_allocating(l)) rc = reserve_pool(sp, err, errlen);
  if (rc) {
    fb_sparse_free(sp);
    return rc;
  }
  fb_sparse_begin(sp);
  *out = sp;
  return 0;
}

void fb_sparse_free(fb_sparse *sp) {
  if (!sp) return;
  const fb_memsys *ms = sp->mem ? sp->mem->ms : NULL;
  fb_rt_state *st = sp->st;
  if (st && st->pool) {
    if (ms) ms->unreserve(ms->user, st->pool, sp->pool_reserved);
    else munmap(st->pool, sp->pool_reserved);
  }
  if (st && st->lists)
    for (uint64_t i = 0; i < st->nnodes; i++)
      fb_devmem_free(sp->mem, st->lists[i].elems, st->lists[i].cap * sizeof(fb_rt_elem));
  if (st) {
    fb_devmem_free(sp->mem, st->allocs, st->nnodes * sizeof *st->allocs);
    fb_devmem_free(sp->mem, st->lists, st->nnodes * sizeof *st->lists);
    fb_devmem_free(sp->mem, st, sizeof *st);
  }
  free(sp->per_parent);
  free(sp->total);
  free(sp);
}

fb_rt_state *fb_sparse_state(fb_sparse *sp) { return sp->st; }

uint64_t fb_sparse_pool_used(const fb_sparse *sp) {
  return __atomic_load_n(&sp->st->pool_used, __ATOMIC_RELAXED);
}

uint64_t fb_sparse_live_blocks(const fb_sparse *sp, int snode) {
  if (snode < 0 || (uint64_t)snode >= sp->st->nnodes) return 0;
  return __atomic_load_n(&sp->st->allocs[snode].live, __ATOMIC_RELAXED);
}

uint64_t fb_sparse_changes(const fb_sparse *sp, int snode) {
  if (snode < 0 || (uint64_t)snode >= sp->st->nnodes) return 0;
  return __atomic_load_n(&sp->st->allocs[snode].changes, __ATOMIC_RELAXED);
}

/* Everything but the pool: root, scratch and lists. */
static uint64_t others(const fb_sparse *sp) {
  return sp->mem->root_bytes + sp->mem->gtmp_bytes + sp->list_bytes +
         __atomic_load_n(&sp->mem->host, __ATOMIC_RELAXED);
}

void fb_sparse_end(fb_sparse *sp) { sp->mem->extra = sp->list_bytes + fb_sparse_pool_used(sp); }

void fb_sparse_begin(fb_sparse *sp) {
  uint64_t cap = sp->pool_reserved;
  if (sp->mem->limit) {
    uint64_t o = others(sp);
    uint64_t left = sp->mem->limit > o ? sp->mem->limit - o : 0;
    if (left < cap) cap = left;
  }
  sp->st->pool_cap = cap;
  fb_sparse_end(sp);
}

static const char *label(const fb_snode *n, char *buf, size_t len) {
  if (n->name) snprintf(buf, len, "'%s'", n->name);
  else snprintf(buf, len, "%d", n->id);
  return buf;
}

int fb_sparse_prepare_list(fb_sparse *sp, int snode, char *err, size_t errlen) {
  fb_rt_list *list = &sp->st->lists[snode];
  int parent = fb_cg_sparse_parent(sp->l, snode);
  uint64_t np = 1;
  if (parent) {
    const fb_rt_list *pl = &sp->st->lists[parent];
    np = pl->count < pl->cap ? pl->count : pl->cap;
  }
  uint64_t need = np * sp->per_parent[snode];
  if (need > sp->total[snode]) need = sp->total[snode];
  if (need <= list->cap) return 0;
  uint64_t cap = 64;
  while (cap < need) cap *= 2;
  if (cap > sp->total[snode]) cap = sp->total[snode];
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
    fb_errf(err, errlen, "cannot allocate %llu bytes for the list of SNode %s",
            (unsigned long long)bytes, label(n, name, sizeof name));
    return FB_ENOMEM;
  }
  fb_devmem_free(sp->mem, list->elems, (size_t)old);
  list->elems = p;
  list->cap = cap;
  sp->list_bytes = sp->list_bytes - old + bytes;
  fb_sparse_begin(sp);
  return 0;
}

int fb_sparse_take_oom(fb_sparse *sp, int *snode, uint64_t *bytes) {
  uint64_t w = __atomic_exchange_n(&sp->st->oom, 0, __ATOMIC_RELAXED);
  __atomic_store_n(&sp->st->oom_owner, 0, __ATOMIC_RELAXED);
  if (!w) return 0;
  *snode = (int)(uint32_t)w;
  *bytes = sp->st->allocs[*snode].block_bytes;
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

uint8_t *fb_sparse_elem(fb_sparse *sp, uint8_t *root, int place, const int64_t *idx, int write) {
  int path[64];
  int n = fb_layout_path(sp->l, place, path, 64);
  if (n < 0) return NULL;
  int64_t lin = 0;
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
