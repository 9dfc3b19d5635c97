/* The code cache that every back end keys its compiled tasks by
 * (codegen.h "code cache"): key = mix(fb_kernel_hash(ir), position of the
 * loop in block 0); fb_kernel_hash already folds in fb_layout_hash of the
 * kernel's layout (and fb_kernel_equal compares layouts), so the layout is
 * part of the key without hashing it twice on the hit path. A key match is
 * confirmed with fb_kernel_equal on a clone the cache owns (cloned onto the
 * cache's own copy of the layout, so callers may free theirs). */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "codegen/codegen.h"
#include "ir/base.h"

typedef struct entry {
  uint64_t key;
  int loop_pos;
  fb_layout *layout; /* owned copy */
  fb_kernel *ir;     /* owned clone, on layout */
  fb_code_val val;
  struct entry *next;
} entry;

struct fb_code_cache {
  pthread_mutex_t mu;
  entry **buckets;
  size_t nbuckets, nentries;
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
  c->nbuckets = 64;
  c->buckets = calloc(c->nbuckets, sizeof *c->buckets);
  if (!c->buckets) {
    free(c);
    return NULL;
  }
  pthread_mutex_init(&c->mu, NULL);
  return c;
}

void fb_code_cache_free(fb_code_cache *c, void (*drop)(void *user, fb_code_val *v), void *user) {
  if (!c) return;
  for (size_t b = 0; b < c->nbuckets; b++) {
    for (entry *e = c->buckets[b], *n; e; e = n) {
      n = e->next;
      if (drop) drop(user, &e->val);
      fb_kernel_free(e->ir);
      fb_layout_free(e->layout);
      free(e);
    }
  }
  free(c->buckets);
  pthread_mutex_destroy(&c->mu);
  free(c);
}

static entry *find(fb_code_cache *c, const fb_code_key *k, const fb_kernel *ir) {
  for (entry *e = c->buckets[k->key % c->nbuckets]; e; e = e->next)
    if (e->key == k->key && e->loop_pos == k->loop_pos && fb_kernel_equal(e->ir, ir)) return e;
  return NULL;
}

fb_code_key fb_code_cache_key(const fb_cg_task *t) {
  fb_code_key k;
  k.loop_pos = loop_position(t);
  k.key = fb__mix64(fb_kernel_hash(t->ir) ^ fb__mix64((uint64_t)(int64_t)k.loop_pos));
  return k;
}

int fb_code_cache_get(fb_code_cache *c, const fb_code_key *k, const fb_kernel *ir,
                      fb_code_val *out) {
  pthread_mutex_lock(&c->mu);
  entry *e = find(c, k, ir);
  if (e) *out = e->val;
  pthread_mutex_unlock(&c->mu);
  return e != NULL;
}

static void grow(fb_code_cache *c) {
  size_t nb = c->nbuckets * 2;
  entry **v = calloc(nb, sizeof *v);
  if (!v) return; /* keep the longer chains */
  for (size_t b = 0; b < c->nbuckets; b++) {
    for (entry *e = c->buckets[b], *n; e; e = n) {
      n = e->next;
      e->next = v[e->key % nb];
      v[e->key % nb] = e;
    }
  }
  free(c->buckets);
  c->buckets = v;
  c->nbuckets = nb;
}

int fb_code_cache_put(fb_code_cache *c, const fb_code_key *k, const fb_kernel *ir,
                      const fb_code_val *val, fb_code_val *kept) {
  entry *e = calloc(1, sizeof *e);
  fb_layout *l = e ? fb_layout_clone(ir->layout) : NULL;
  fb_kernel *clone = l ? fb_kernel_clone_to(ir, l) : NULL;
  if (!clone) { /* best effort: the code is simply not cached */
    fb_layout_free(l);
    free(e);
    *kept = *val;
    return 0;
  }
  *e = (entry){k->key, k->loop_pos, l, clone, *val, NULL};
  pthread_mutex_lock(&c->mu);
  entry *old = find(c, k, ir);
  if (old) { /* another thread got there first */
    *kept = old->val;
    pthread_mutex_unlock(&c->mu);
    fb_kernel_free(clone);
    fb_layout_free(l);
    free(e);
    return 1;
  }
  if (c->nentries >= c->nbuckets) grow(c);
  e->next = c->buckets[k->key % c->nbuckets];
  c->buckets[k->key % c->nbuckets] = e;
  c->nentries++;
  *kept = *val;
  pthread_mutex_unlock(&c->mu);
  return 0;
}
