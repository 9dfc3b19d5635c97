/* The one hash table of every folder: 64-bit keys, each with a value of a
 * size fixed when the table is made (0 for a set). Open addressing with
 * linear probing on fb__mix64 of the key (so handles, serials and other
 * patterned keys spread), at most half full (it doubles), deletion by
 * backward shift (no tombstones, so lookups never slow down with churn).
 *
 * Several entries may share a key (fb_map_add): a caller that keys by a
 * hash of something larger (a name, a kernel) walks the entries of that
 * hash with fb_map_next and confirms each itself, so a hash collision never
 * merges two things.
 *
 * Values are returned as pointers into the table: valid until the next
 * fb_map_put, fb_map_add, fb_map_del, fb_map_reserve or fb_map_free. No
 * locking: the owner serializes. Lives in ir/ (the bottom layer) beside
 * base.h, so every folder may include it ("base/map.h"). */
#ifndef FB_IR_MAP_H
#define FB_IR_MAP_H

#include <stddef.h>
#include <stdint.h>

typedef struct fb_map {
  unsigned char *slot; /* cap slots of stride bytes: the key, then the value */
  unsigned char *used; /* per slot: 1 when it holds an entry */
  size_t n, cap;       /* entries; slots (0, or a power of two >= 16) */
  size_t vsize, stride;
} fb_map;

/* An empty table whose values are vsize bytes (no memory until the first
 * insertion). */
void fb_map_init(fb_map *m, size_t vsize);
/* Give back the memory and forget every entry; m is empty and usable. */
void fb_map_free(fb_map *m);
/* Forget every entry, keeping the memory for the next ones. */
void fb_map_clear(fb_map *m);
/* Room for n entries in all without growing (so insertions up to n cannot
 * fail). 0 or FB_ENOMEM. */
int fb_map_reserve(fb_map *m, size_t n);

/* The value of key (the first entry of it), or NULL. */
void *fb_map_get(const fb_map *m, uint64_t key);
/* The value of key, added (zeroed, *added = 1 where added is given) when
 * absent; NULL when out of memory. */
void *fb_map_put(fb_map *m, uint64_t key, int *added);
/* A new entry of key (zeroed) even when key has entries already; NULL when
 * out of memory. */
void *fb_map_add(fb_map *m, uint64_t key);
/* The entries of key in turn: size_t it = 0; while ((v = fb_map_next(m, key,
 * &it))) ... (it is the caller's cursor; fb_map_del_at(m, it) removes the
 * entry just returned). */
void *fb_map_next(const fb_map *m, uint64_t key, size_t *it);
/* Remove the first entry of key: 1 when there was one, else 0. */
int fb_map_del(fb_map *m, uint64_t key);
/* Remove the entry fb_map_next returned last through cursor it (the walk
 * must then start again: entries after it may have moved). */
void fb_map_del_at(fb_map *m, size_t it);

/* Every entry: for (size_t i = 0; i < m->cap; i++) if ((v = fb_map_at(m, i,
 * &key))) ... (NULL: slot i is empty). */
void *fb_map_at(const fb_map *m, size_t i, uint64_t *key);

#endif
