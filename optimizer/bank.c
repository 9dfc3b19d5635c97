/* The IR bank (paper section 6.2): immutable, content-addressed task IR of
 * one session. Each distinct kernel is stored once, compacted; a handle is
 * its slot. A structural hash finds candidates and fb_kernel_equal confirms
 * them. Entries are reference counted; unreferenced ones stay cached (for
 * the memo and for later launches) until the memory bound evicts them,
 * least recently used first. The memo maps a transformation and its inputs
 * (fuse A B delta, demote A stmts, dse A states, simplify A) to the
 * resulting entry, compared exactly; evicting an entry drops the memo
 * entries that mention it. Task metadata is computed once per entry. Both
 * are found through the shared table (base/map.h), keyed by their hash, several
 * entries to a hash, each confirmed before use. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "base/map.h"
#include "optimizer/sfg.h"

typedef struct bentry {
  fb_kernel *k;      /* NULL: a free slot */
  uint64_t hash;
  int32_t refs;
  int32_t next;      /* free list */
  uint64_t used;     /* LRU stamp */
  size_t bytes;
  fb_task_meta *meta;
} bentry;

typedef struct memo {
  int64_t *key;      /* NULL: a free slot */
  int n;
  uint64_t h;
  fb_irh in[2], out;
  int32_t next;      /* free list */
} memo;

struct fb_bank {
  const fb_layout *l;
  bentry *e;
  int ne, cape;
  int32_t free_e;
  fb_map byhash;     /* entry hash -> entry index */
  int nlive;
  memo *m;
  int nm, capm;
  int32_t free_m;
  fb_map mbyhash;    /* memo key hash -> memo index */
  int nmlive;
  size_t bytes, max_bytes;
  uint64_t tick, evictions;
};

static size_t kernel_bytes(const fb_kernel *k) {
  size_t b =
      sizeof *k + (size_t)k->nstmts * sizeof(fb_stmt) + (size_t)k->nblocks * sizeof(fb_block);
  for (int i = 0; i < k->nblocks; i++) b += (size_t)k->blocks[i].n * sizeof(int32_t);
  return b + (size_t)k->nparams * sizeof(fb_type);
}

fb_bank *fb_bank_new(const fb_layout *l, size_t max_bytes) {
  fb_bank *b = calloc(1, sizeof *b);
  if (!b) return NULL;
  b->l = l;
  b->max_bytes = max_bytes;
  b->free_e = b->free_m = -1;
  fb_map_init(&b->byhash, sizeof(int32_t));
  fb_map_init(&b->mbyhash, sizeof(int32_t));
  return b;
}

void fb_bank_free(fb_bank *b) {
  if (!b) return;
  for (int i = 0; i < b->ne; i++) {
    fb_kernel_free(b->e[i].k);
    fb_meta_free(b->e[i].meta);
  }
  for (int i = 0; i < b->nm; i++) free(b->m[i].key);
  free(b->e);
  free(b->m);
  fb_map_free(&b->byhash);
  fb_map_free(&b->mbyhash);
  free(b);
}

void fb_bank_set_limit(fb_bank *b, size_t max_bytes) { b->max_bytes = max_bytes; }

int fb_bank_valid(const fb_bank *b, fb_irh h) {
  return b && h >= 0 && h < b->ne && b->e[h].k != NULL;
}

void fb_bank_ref(fb_bank *b, fb_irh h) {
  if (fb_bank_valid(b, h)) b->e[h].refs++;
}

void fb_bank_unref(fb_bank *b, fb_irh h) {
  if (fb_bank_valid(b, h) && b->e[h].refs > 0) b->e[h].refs--;
}

const fb_kernel *fb_bank_ir(const fb_bank *b, fb_irh h) {
  return fb_bank_valid(b, h) ? b->e[h].k : NULL;
}

uint64_t fb_bank_hash(const fb_bank *b, fb_irh h) { return fb_bank_valid(b, h) ? b->e[h].hash : 0; }
size_t fb_bank_bytes(const fb_bank *b, fb_irh h) { return fb_bank_valid(b, h) ? b->e[h].bytes : 0; }

void fb_bank_stats(const fb_bank *b, size_t *entries, size_t *bytes, uint64_t *evictions) {
  if (entries) *entries = (size_t)b->nlive;
  if (bytes) *bytes = b->bytes;
  if (evictions) *evictions = b->evictions;
}

/* ---------------------------------------------------------------- memo */

static uint64_t key_hash(const int64_t *key, int n) {
  return fb__fnv(FB_FNV_INIT, key, sizeof *key * (size_t)n);
}

/* Drop index i from the entries of hash h. */
static void hash_unlink(fb_map *map, uint64_t h, int32_t i) {
  size_t it = 0;
  for (const int32_t *v; (v = fb_map_next(map, h, &it));)
    if (*v == i) {
      fb_map_del_at(map, it);
      return;
    }
}

static void memo_unlink(fb_bank *b, int32_t i) {
  hash_unlink(&b->mbyhash, b->m[i].h, i);
  free(b->m[i].key);
  b->m[i].key = NULL;
  b->m[i].next = b->free_m;
  b->free_m = i;
  b->nmlive--;
}

/* The memo entry of key, or -1. */
static int32_t memo_find(const fb_bank *b, const int64_t *key, int n, uint64_t h) {
  size_t it = 0;
  for (const int32_t *v; (v = fb_map_next(&b->mbyhash, h, &it));) {
    const memo *m = &b->m[*v];
    if (m->n == n && !memcmp(m->key, key, sizeof *key * (size_t)n)) return *v;
  }
  return -1;
}

fb_irh fb_bank_memo_get(fb_bank *b, const int64_t *key, int n) {
  int32_t i = memo_find(b, key, n, key_hash(key, n));
  if (i < 0 || !fb_bank_valid(b, b->m[i].out)) return FB_IRH_NONE;
  const memo *m = &b->m[i];
  b->e[m->out].refs++;
  b->e[m->out].used = ++b->tick;
  return m->out;
}

int fb_bank_memo_put(fb_bank *b, const int64_t *key, int n, fb_irh result) {
  if (n < 2 || !fb_bank_valid(b, result)) return FB_EINVAL;
  int32_t old = memo_find(b, key, n, key_hash(key, n));
  if (old >= 0) memo_unlink(b, old); /* the newest result is the one kept */
  if (fb_map_reserve(&b->mbyhash, (size_t)b->nmlive + 1)) return FB_ENOMEM;
  int64_t *copy = malloc(sizeof *copy * (size_t)n);
  if (!copy) return FB_ENOMEM;
  memcpy(copy, key, sizeof *copy * (size_t)n);
  int32_t i = b->free_m;
  if (i >= 0) {
    b->free_m = b->m[i].next;
  } else {
    if (b->nm == b->capm) {
      int nc = b->capm ? b->capm * 2 : 64;
      memo *nm = realloc(b->m, sizeof *nm * (size_t)nc);
      if (!nm) {
        free(copy);
        return FB_ENOMEM;
      }
      b->m = nm;
      b->capm = nc;
    }
    i = b->nm++;
  }
  memo *m = &b->m[i];
  m->key = copy;
  m->n = n;
  m->h = key_hash(key, n);
  m->in[0] = (fb_irh)key[1];
  m->in[1] = key[0] == FB_MEMO_FUSE && n > 2 ? (fb_irh)key[2] : FB_IRH_NONE;
  m->out = result;
  *(int32_t *)fb_map_add(&b->mbyhash, m->h) = i; /* reserved above: never NULL */
  b->nmlive++;
  return 0;
}

/* ---------------------------------------------------------------- eviction */

static void entry_unlink(fb_bank *b, fb_irh h) { hash_unlink(&b->byhash, b->e[h].hash, h); }

static void evict(fb_bank *b, fb_irh h) {
  for (int i = 0; i < b->nm; i++)
    if (b->m[i].key && (b->m[i].out == h || b->m[i].in[0] == h || b->m[i].in[1] == h))
      memo_unlink(b, i);
  entry_unlink(b, h);
  bentry *e = &b->e[h];
  b->bytes -= e->bytes;
  fb_kernel_free(e->k);
  fb_meta_free(e->meta);
  memset(e, 0, sizeof *e);
  e->next = b->free_e;
  b->free_e = h;
  b->nlive--;
  b->evictions++;
}

typedef struct lru {
  uint64_t used;
  int32_t h;
} lru;

static int cmp_lru(const void *x, const void *y) {
  uint64_t a = ((const lru *)x)->used, c = ((const lru *)y)->used;
  return a < c ? -1 : a > c;
}

/* Evict unreferenced entries, oldest first, down to 3/4 of the bound. */
static void enforce_limit(fb_bank *b) {
  if (!b->max_bytes || b->bytes <= b->max_bytes) return;
  lru *cand = malloc(sizeof *cand * (size_t)(b->ne ? b->ne : 1));
  if (!cand) return;
  int n = 0;
  for (int i = 0; i < b->ne; i++)
    if (b->e[i].k && b->e[i].refs == 0) cand[n++] = (lru){b->e[i].used, i};
  qsort(cand, (size_t)n, sizeof *cand, cmp_lru);
  size_t target = b->max_bytes / 4 * 3;
  for (int i = 0; i < n && b->bytes > target; i++) evict(b, cand[i].h);
  free(cand);
}

/* ---------------------------------------------------------------- interning */

static fb_irh lookup(fb_bank *b, const fb_kernel *k, uint64_t h) {
  size_t it = 0;
  for (const int32_t *v; (v = fb_map_next(&b->byhash, h, &it));)
    if (fb_kernel_equal(b->e[*v].k, k)) return *v;
  return FB_IRH_NONE;
}

/* Store c (owned, compacted) under hash h. */
static int add_entry(fb_bank *b, fb_kernel *c, uint64_t h, fb_irh *out) {
  if (fb_map_reserve(&b->byhash, (size_t)b->nlive + 1)) return FB_ENOMEM;
  int32_t i = b->free_e;
  if (i >= 0) {
    b->free_e = b->e[i].next;
  } else {
    if (b->ne == b->cape) {
      int nc = b->cape ? b->cape * 2 : 64;
      bentry *ne = realloc(b->e, sizeof *ne * (size_t)nc);
      if (!ne) return FB_ENOMEM;
      b->e = ne;
      b->cape = nc;
    }
    i = b->ne++;
  }
  bentry *e = &b->e[i];
  memset(e, 0, sizeof *e);
  e->k = c;
  e->hash = h;
  e->refs = 1;
  e->used = ++b->tick;
  e->bytes = kernel_bytes(c);
  *(int32_t *)fb_map_add(&b->byhash, h) = i; /* reserved above: never NULL */
  b->bytes += e->bytes;
  b->nlive++;
  *out = i;
  enforce_limit(b);
  return 0;
}

static int check_layout(fb_bank *b, const fb_kernel *k, char *err, size_t errlen) {
  if (fb_layout_equal(k->layout, b->l)) return 0; /* the same tree, not just the same hash */
  fb_errf(err, errlen, "kernel %s was built for another layout", k->name ? k->name : "?");
  return FB_EINVAL;
}

static int intern(fb_bank *b, const fb_kernel *k, int verify, fb_irh *out, char *err,
                  size_t errlen) {
  *out = FB_IRH_NONE;
  int rc = check_layout(b, k, err, errlen);
  if (rc) return rc;
  if (verify) {
    fb_diags d;
    fb_diags_init(&d);
    rc = fb_verify(k, &d);
    if (rc) {
      fb_errf(err, errlen, "kernel %s: %s", k->name ? k->name : "?",
              d.n ? d.v[0].msg : "refused by the verifier");
      fb_diags_free(&d);
      return rc;
    }
    fb_diags_free(&d);
  }
  uint64_t h = fb_kernel_hash(k);
  fb_irh f = lookup(b, k, h);
  if (f >= 0) {
    b->e[f].refs++;
    b->e[f].used = ++b->tick;
    *out = f;
    return 0;
  }
  fb_kernel *c = fb_kernel_compact(k);
  if (!c) {
    fb_errf(err, errlen, "IR bank: out of memory");
    return FB_ENOMEM;
  }
  c->layout = b->l;
  rc = add_entry(b, c, h, out);
  if (rc) {
    fb_kernel_free(c);
    fb_errf(err, errlen, "IR bank: out of memory");
  }
  return rc;
}

int fb_bank_intern(fb_bank *b, const fb_kernel *k, fb_irh *out, char *err, size_t errlen) {
  return intern(b, k, 1, out, err, errlen);
}

int fb_bank_adopt(fb_bank *b, fb_kernel *k, fb_irh *out, char *err, size_t errlen) {
  int rc = intern(b, k, 0, out, err, errlen);
  fb_kernel_free(k);
  return rc;
}

const fb_task_meta *fb_bank_meta(fb_bank *b, fb_irh h) {
  if (!fb_bank_valid(b, h)) return NULL;
  bentry *e = &b->e[h];
  if (e->meta) return e->meta;
  char err[160];
  if (fb_meta_compute(e->k, &e->meta, err, sizeof err)) return NULL;
  e->bytes += e->meta->bytes;
  b->bytes += e->meta->bytes;
  return e->meta;
}
