/* The code cache that every back end keys its compiled tasks by
 * (codegen.h "code cache"): key = mix(fb_kernel_hash(ir), position of the
 * loop in block 0, partition); fb_kernel_hash already folds in
 * fb_layout_hash of the kernel's layout (and fb_kernel_equal compares
 * layouts), so the layout is part of the key without hashing it twice on
 * the hit path. A key match is confirmed with fb_kernel_equal on a clone
 * the cache owns (cloned onto the cache's own copy of the layout, so
 * callers may free theirs) and an equal partition: code compiled in one
 * partition (a tenant of fuseboxd) is never found from another, so neither
 * a hit counter nor a compile time says what another tenant compiled.
 *
 * Bounded in bytes (fb_code_cache_set_limit): an LRU list orders the
 * entries by last use; past the limit, the least recently used entries that
 * nobody pins are dropped through the back end's drop function. An owner
 * (an engine session) pins each entry it gets or puts through its
 * fb_code_pins, since it keeps the code's entry points, and unpins them all
 * when it ends; code got or put without pins is pinned for good (callers
 * that keep entry points with no owner to say when they stop). */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "base/map.h"
#include "codegen/codegen.h"

typedef struct entry {
  uint64_t key;
  int loop_pos;
  uint64_t partition;
  fb_layout *layout; /* owned copy */
  fb_kernel *ir;     /* owned clone, on layout */
  fb_code_val val;
  uint64_t bytes;    /* what it counts against the limit */
  int pins;          /* owners holding it; never evicted while > 0 */
  int forever;       /* got or put without pins: never evicted */
  struct entry *next;            /* evicted entries, to drop */
  struct entry *newer, *older;   /* LRU list */
} entry;

struct fb_code_pins {
  fb_code_cache *c;  /* the cache its entries are in (set by the first pin) */
  entry **v;
  int n, cap;
};

struct fb_code_cache {
  pthread_mutex_t mu;
  fb_map byk;              /* key -> entry * (several entries per key) */
  size_t nentries;
  entry *newest, *oldest;
  uint64_t bytes, limit;   /* limit 0: none */
  uint64_t pinned_bytes;   /* of bytes, in entries pinned now (kept as pins change) */
  uint64_t evictions;
  void (*drop)(void *user, fb_code_val *v);
  void *drop_user;
};

/* Position of the loop statement in block 0 (-1 for a serial task). */
static int loop_position(const fb_cg_task *t) {
  if (t->loop < 0 || !t->ir || t->ir->nblocks < 1) return -1;
  const fb_block *b0 = &t->ir->blocks[0];
  for (int i = 0; i < b0->n; i++)
    if (b0->ids[i] == t->loop) return i;
  return -2; /* not top-level: the compile will refuse it */
}

fb_code_cache *fb_code_cache_new(void) {
  fb_code_cache *c = calloc(1, sizeof *c);
  if (!c) return NULL;
  fb_map_init(&c->byk, sizeof(entry *));
  pthread_mutex_init(&c->mu, NULL);
  return c;
}

static void entry_free(entry *e) {
  fb_kernel_free(e->ir);
  fb_layout_free(e->layout);
  free(e);
}

void fb_code_cache_free(fb_code_cache *c, void (*drop)(void *user, fb_code_val *v), void *user) {
  if (!c) return;
  for (size_t i = 0; i < c->byk.cap; i++) {
    entry **v = fb_map_at(&c->byk, i, NULL);
    if (!v) continue;
    if (drop) drop(user, &(*v)->val);
    entry_free(*v);
  }
  fb_map_free(&c->byk);
  pthread_mutex_destroy(&c->mu);
  free(c);
}

/* ---------------------------------------------------------------- LRU list */

static void lru_unlink(fb_code_cache *c, entry *e) {
  if (e->newer) e->newer->older = e->older;
  else c->newest = e->older;
  if (e->older) e->older->newer = e->newer;
  else c->oldest = e->newer;
  e->newer = e->older = NULL;
}

static void lru_push(fb_code_cache *c, entry *e) {
  e->older = c->newest;
  e->newer = NULL;
  if (c->newest) c->newest->newer = e;
  c->newest = e;
  if (!c->oldest) c->oldest = e;
}

static void index_unlink(fb_code_cache *c, entry *e) {
  size_t it = 0;
  for (entry **v; (v = fb_map_next(&c->byk, e->key, &it));)
    if (*v == e) {
      fb_map_del_at(&c->byk, it);
      return;
    }
}

/* Take the least recently used unpinned entries out while over the limit;
 * they are chained on *out (through next) for the caller to drop unlocked. */
static void evict_locked(fb_code_cache *c, entry **out) {
  for (entry *e = c->oldest, *n; e && c->limit && c->bytes > c->limit; e = n) {
    n = e->newer;
    if (e->pins || e->forever) continue;
    lru_unlink(c, e);
    index_unlink(c, e);
    c->bytes -= e->bytes;
    c->nentries--;
    c->evictions++;
    e->next = *out;
    *out = e;
  }
}

static void drop_all(fb_code_cache *c, entry *list) {
  for (entry *e = list, *n; e; e = n) {
    n = e->next;
    if (c->drop) c->drop(c->drop_user, &e->val);
    entry_free(e);
  }
}

void fb_code_cache_set_limit(fb_code_cache *c, uint64_t max_bytes,
                             void (*drop)(void *user, fb_code_val *v), void *user) {
  entry *gone = NULL;
  pthread_mutex_lock(&c->mu);
  c->limit = max_bytes;
  c->drop = drop;
  c->drop_user = user;
  evict_locked(c, &gone);
  pthread_mutex_unlock(&c->mu);
  drop_all(c, gone);
}

void fb_code_cache_stats(fb_code_cache *c, fb_code_cache_info *out) {
  memset(out, 0, sizeof *out);
  if (!c) return;
  pthread_mutex_lock(&c->mu);
  out->bytes = c->bytes;
  out->limit = c->limit;
  out->entries = c->nentries;
  out->evictions = c->evictions;
  out->pinned_bytes = c->pinned_bytes;
  pthread_mutex_unlock(&c->mu);
}

/* ---------------------------------------------------------------- pins */

fb_code_pins *fb_code_pins_new(void) { return calloc(1, sizeof(fb_code_pins)); }

static int held(const entry *e) { return e->pins > 0 || e->forever; }

/* Keep c->pinned_bytes as e goes from held (was) to held(e) or back. */
static void note_held(fb_code_cache *c, entry *e, int was) {
  if (!was && held(e)) c->pinned_bytes += e->bytes;
  else if (was && !held(e)) c->pinned_bytes -= e->bytes;
}

/* Pin e for p (once per owner); without p, or when p cannot grow or
 * belongs to another cache, e is pinned for good. Under c->mu. */
static void pin_locked(fb_code_cache *c, entry *e, fb_code_pins *p) {
  int was = held(e);
  if (!p || (p->c && p->c != c)) {
    e->forever = 1;
    note_held(c, e, was);
    return;
  }
  for (int i = 0; i < p->n; i++)
    if (p->v[i] == e) return;
  if (p->n == p->cap) {
    int nc = p->cap ? p->cap * 2 : 16;
    entry **v = realloc(p->v, sizeof *v * (size_t)nc);
    if (!v) {
      e->forever = 1;
      note_held(c, e, was);
      return;
    }
    p->v = v;
    p->cap = nc;
  }
  p->c = c;
  p->v[p->n++] = e;
  e->pins++;
  note_held(c, e, was);
}

void fb_code_pins_release(fb_code_pins *p) {
  if (!p) return;
  fb_code_cache *c = p->c;
  if (c) {
    entry *gone = NULL;
    pthread_mutex_lock(&c->mu);
    for (int i = 0; i < p->n; i++) {
      p->v[i]->pins--;
      note_held(c, p->v[i], 1);
    }
    evict_locked(c, &gone);
    pthread_mutex_unlock(&c->mu);
    drop_all(c, gone);
  }
  free(p->v);
  free(p);
}

/* ---------------------------------------------------------------- lookup */

static entry *find(fb_code_cache *c, const fb_code_key *k, const fb_kernel *ir) {
  size_t it = 0;
  for (entry **v; (v = fb_map_next(&c->byk, k->key, &it));) {
    entry *e = *v;
    if (e->loop_pos == k->loop_pos && e->partition == k->partition && fb_kernel_equal(e->ir, ir))
      return e;
  }
  return NULL;
}

fb_code_key fb_code_cache_key(const fb_cg_task *t) {
  fb_code_key k;
  k.loop_pos = loop_position(t);
  k.partition = t->partition;
  k.key = fb__mix64(fb_kernel_hash(t->ir) ^ fb__mix64((uint64_t)(int64_t)k.loop_pos) ^
                    fb__mix64(t->partition + 0x9e3779b97f4a7c15ull));
  return k;
}

int fb_code_cache_get(fb_code_cache *c, const fb_code_key *k, const fb_kernel *ir,
                      fb_code_pins *pins, fb_code_val *out) {
  pthread_mutex_lock(&c->mu);
  entry *e = find(c, k, ir);
  if (e) {
    *out = e->val;
    pin_locked(c, e, pins);
    lru_unlink(c, e);
    lru_push(c, e);
  }
  pthread_mutex_unlock(&c->mu);
  return e != NULL;
}

/* What an entry holds besides the back end's code: itself, the IR clone and
 * the layout copy (an estimate from their element counts). */
static uint64_t own_bytes(const fb_kernel *ir) {
  uint64_t b = sizeof(entry) + sizeof(fb_kernel) + sizeof(fb_layout);
  b += (uint64_t)ir->nstmts * sizeof(fb_stmt) + (uint64_t)ir->nblocks * sizeof(fb_block);
  for (int i = 0; i < ir->nblocks; i++) b += (uint64_t)ir->blocks[i].n * sizeof(int32_t);
  if (ir->layout) b += (uint64_t)ir->layout->nnodes * sizeof(fb_snode);
  return b;
}

int fb_code_cache_put(fb_code_cache *c, const fb_code_key *k, const fb_kernel *ir,
                      const fb_code_val *val, uint64_t code_bytes, fb_code_pins *pins,
                      fb_code_val *kept) {
  entry *e = calloc(1, sizeof *e);
  fb_layout *l = e ? fb_layout_clone(ir->layout) : NULL;
  fb_kernel *clone = l ? fb_kernel_clone_to(ir, l) : NULL;
  if (!clone) { /* best effort: the code is simply not cached (nor ever freed) */
    fb_layout_free(l);
    free(e);
    *kept = *val;
    return 0;
  }
  *e = (entry){.key = k->key,
               .loop_pos = k->loop_pos,
               .partition = k->partition,
               .layout = l,
               .ir = clone,
               .val = *val,
               .bytes = code_bytes + own_bytes(ir)};
  entry *gone = NULL;
  pthread_mutex_lock(&c->mu);
  entry *old = find(c, k, ir);
  if (old) { /* another thread got there first */
    *kept = old->val;
    pin_locked(c, old, pins);
    lru_unlink(c, old);
    lru_push(c, old);
    pthread_mutex_unlock(&c->mu);
    entry_free(e);
    return 1;
  }
  entry **slot = fb_map_add(&c->byk, k->key);
  if (!slot) { /* out of memory: as above, the code is not cached */
    pthread_mutex_unlock(&c->mu);
    entry_free(e);
    *kept = *val;
    return 0;
  }
  *slot = e;
  c->nentries++;
  c->bytes += e->bytes;
  lru_push(c, e);
  pin_locked(c, e, pins);
  *kept = *val;
  evict_locked(c, &gone);
  pthread_mutex_unlock(&c->mu);
  drop_all(c, gone);
  return 0;
}
