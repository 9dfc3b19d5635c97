/* The shared hash table (map.h). Each slot holds its key (8 bytes) and
 * then its value; a separate byte per slot says whether it is used, so
 * every 64-bit key is usable (no key is reserved to mark an empty slot).
 * Entries of one key sit in the probe run from the key's home slot. */
#include "base/map.h"

#include "base/base.h"

#define MIN_CAP 16

static uint64_t *key_at(const fb_map *m, size_t i) {
  return (uint64_t *)(void *)(m->slot + i * m->stride);
}

static void *val_at(const fb_map *m, size_t i) { return m->slot + i * m->stride + 8; }

static size_t home(const fb_map *m, uint64_t key) { return (size_t)fb__mix64(key) & (m->cap - 1); }

void fb_map_init(fb_map *m, size_t vsize) {
  memset(m, 0, sizeof *m);
  m->vsize = vsize;
  m->stride = 8 + (vsize + 7) / 8 * 8; /* keys stay 8-byte aligned */
}

void fb_map_free(fb_map *m) {
  free(m->slot);
  free(m->used);
  fb_map_init(m, m->vsize);
}

void fb_map_clear(fb_map *m) {
  if (m->cap) memset(m->used, 0, m->cap);
  m->n = 0;
}

/* The first free slot of key's probe run (the table has one: it is at
 * most half full). */
static size_t free_slot(const fb_map *m, uint64_t key) {
  size_t i = home(m, key);
  while (m->used[i]) i = (i + 1) & (m->cap - 1);
  return i;
}

/* Move every entry into a table of cap slots. */
static int rehash(fb_map *m, size_t cap) {
  if (cap > SIZE_MAX / 2 / m->stride) return FB_ENOMEM;
  fb_map old = *m;
  unsigned char *slot = malloc(cap * m->stride), *used = calloc(cap, 1);
  if (!slot || !used) {
    free(slot);
    free(used);
    return FB_ENOMEM;
  }
  m->slot = slot;
  m->used = used;
  m->cap = cap;
  for (size_t i = 0; i < old.cap; i++) {
    if (!old.used[i]) continue;
    size_t j = free_slot(m, *key_at(&old, i));
    memcpy(m->slot + j * m->stride, old.slot + i * old.stride, m->stride);
    m->used[j] = 1;
  }
  free(old.slot);
  free(old.used);
  return 0;
}

int fb_map_reserve(fb_map *m, size_t n) {
  if (n > SIZE_MAX / 4) return FB_ENOMEM;
  size_t cap = m->cap ? m->cap : MIN_CAP;
  while (cap < 2 * n) cap *= 2;
  return cap == m->cap ? 0 : rehash(m, cap);
}

void *fb_map_next(const fb_map *m, uint64_t key, size_t *it) {
  if (!m->cap) return NULL;
  for (size_t i = *it ? *it & (m->cap - 1) : home(m, key); m->used[i]; i = (i + 1) & (m->cap - 1))
    if (*key_at(m, i) == key) {
      *it = i + 1;
      return val_at(m, i);
    }
  return NULL;
}

void *fb_map_get(const fb_map *m, uint64_t key) {
  size_t it = 0;
  return fb_map_next(m, key, &it);
}

void *fb_map_add(fb_map *m, uint64_t key) {
  if ((m->n + 1) * 2 > m->cap && fb_map_reserve(m, m->n + 1)) return NULL;
  size_t i = free_slot(m, key);
  m->used[i] = 1;
  *key_at(m, i) = key;
  memset(val_at(m, i), 0, m->vsize);
  m->n++;
  return val_at(m, i);
}

void *fb_map_put(fb_map *m, uint64_t key, int *added) {
  void *v = fb_map_get(m, key);
  if (added) *added = !v;
  return v ? v : fb_map_add(m, key);
}

/* Empty slot i, then pull back each later entry of the run that may not
 * sit past the hole (its home is not in (hole, j]). */
void fb_map_del_at(fb_map *m, size_t it) {
  size_t mask = m->cap - 1, hole = (it - 1) & mask;
  m->used[hole] = 0;
  m->n--;
  for (size_t j = (hole + 1) & mask; m->used[j]; j = (j + 1) & mask) {
    size_t h = home(m, *key_at(m, j));
    if (((j - h) & mask) < ((j - hole) & mask)) continue; /* h in (hole, j]: stays */
    memcpy(m->slot + hole * m->stride, m->slot + j * m->stride, m->stride);
    m->used[hole] = 1;
    m->used[j] = 0;
    hole = j;
  }
}

int fb_map_del(fb_map *m, uint64_t key) {
  size_t it = 0;
  if (!fb_map_next(m, key, &it)) return 0;
  fb_map_del_at(m, it);
  return 1;
}

void *fb_map_at(const fb_map *m, size_t i, uint64_t *key) {
  if (i >= m->cap || !m->used[i]) return NULL;
  if (key) *key = *key_at(m, i);
  return val_at(m, i);
}
