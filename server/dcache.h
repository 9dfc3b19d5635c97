/* The compile cache on disk (docs/code-cache.md): compiled task code that
 * outlives the process, one directory per tenant, every entry signed with
 * HMAC-SHA256 under a server key kept outside the cache directory.
 *
 * Only a process that holds no tenant code opens these (fuseboxd's broker,
 * or a thread-isolated fuseboxd): a sandboxed worker never holds the key
 * and never writes the directory (docs/security.md, "The compile cache on
 * disk").
 *
 * Layout: ROOT/t-HEX/ (HEX: 32 hex digits of SHA-256 of the tenant's name;
 * 0700, owned by this user), entries ROOT/t-HEX/vF-VVVVVVVVVVVVVVVV-KEY.fbc
 * (F the format, V 16 hex digits of the build tag's hash, KEY the entry's
 * 64-hex SHA-256 key), temporary files .tmp-*. An entry:
 *
 *   "FBDC" | u32 format | key[32] | u64 ir_len | u64 payload_len |
 *   ir[ir_len] | payload[payload_len] | hmac[32]
 *
 * hmac = HMAC-SHA256(server key, "fusebox code cache\0" tenant "\0" | all
 * bytes before it), so an entry copied into another tenant's directory,
 * renamed to another key, truncated or changed in any byte is refused. A
 * refused entry is removed (and counted); the caller compiles again.
 * Integers are little-endian. Thread-safe. */
#ifndef FBD_DCACHE_H
#define FBD_DCACHE_H

#include <stddef.h>
#include <stdint.h>

#define FBD_DCACHE_FORMAT 1
#define FBD_DCACHE_MAX_IR ((uint64_t)16 << 20)      /* bound on an entry's IR text */
#define FBD_DCACHE_MAX_PAYLOAD ((uint64_t)64 << 20) /* ... and on its code */
#define FBD_DCACHE_KEY_BYTES 32

typedef struct fbd_dcache fbd_dcache;

typedef struct fbd_dcache_stats {
  uint64_t hits, misses, writes, rejects, evictions;
  uint64_t bytes; /* entries on disk now (as this process counts them) */
  uint64_t limit;
} fbd_dcache_stats;

/* At start: in every tenant directory under root (ours, checked), remove
 * the entries of any other build than build_tag's and stale temporary
 * files, as fbd_dcache_open does for one tenant. The directories swept. */
int fbd_dcache_sweep(const char *root, const char *build_tag);

/* Make root (0700) when missing and check it as fbd_dcache_open does: a
 * directory, not a link, ours, no group or other access. 0 or FB_EINVAL
 * with a message. */
int fbd_dcache_check_root(const char *root, char *err, size_t errlen);

/* Read the server key: a regular file (not a symlink) owned by this user,
 * mode 0600 or stricter, of 32 to 4096 bytes. With create, a missing file
 * is made (0600, 32 random bytes). Outside the cache root: refused when
 * its real path lies under root (may be NULL). 0, or FB_EINVAL with a
 * message naming the file and the problem. */
int fbd_dcache_key_load(const char *path, const char *root, int create, uint8_t **key,
                        size_t *keylen, char *err, size_t errlen);

/* The cache of one tenant under root (made 0700 when missing, with its
 * tenant directory; both refused when not directories owned by this user
 * with no group or other access). build_tag names the build (format,
 * fuseboxd version and commit, LLVM version): entries of any other tag and
 * stale temporary files are removed now. max_bytes: the tenant's share
 * (0: unbounded). 0 or an error with a message. */
int fbd_dcache_open(const char *root, const char *tenant, const char *build_tag,
                    const uint8_t *key, size_t keylen, uint64_t max_bytes, fbd_dcache **out,
                    char *err, size_t errlen);
void fbd_dcache_close(fbd_dcache *d);

/* SHA-256 over parts, each prefixed by its length (so no two lists of
 * parts give one input). */
void fbd_dcache_hash_parts(const void *const *parts, const size_t *lens, int n,
                           uint8_t out[FBD_DCACHE_KEY_BYTES]);

/* The entry of key when it is sound (HMAC, header, owner, mode, no link)
 * and its IR equals ir: 1 and *payload (malloc'd). 0: a miss (none, or
 * one refused: it was removed and counted as a reject; or another IR under
 * the key, kept). A hit makes the entry the most recently used. */
int fbd_dcache_get(fbd_dcache *d, const uint8_t key[FBD_DCACHE_KEY_BYTES], const void *ir,
                   size_t irlen, uint8_t **payload, size_t *len);
/* Write the entry atomically (temporary file, fsync, rename, fsync of the
 * directory), then evict least recently used entries past the bound.
 * 0, or -1 when it was not written (sizes past the bounds, I/O). */
int fbd_dcache_put(fbd_dcache *d, const uint8_t key[FBD_DCACHE_KEY_BYTES], const void *ir,
                   size_t irlen, const void *payload, size_t len);
void fbd_dcache_stats_get(fbd_dcache *d, fbd_dcache_stats *out);
/* The tenant directory's path (for tests and messages). */
const char *fbd_dcache_dir(const fbd_dcache *d);

#endif
