/* The compile cache on disk (dcache.h, docs/code-cache.md). Written for a
 * directory that someone hostile may write: every name is made from the
 * key, every open is relative to a directory descriptor checked once and
 * uses O_NOFOLLOW, every entry is checked for type, owner, mode and size
 * before a byte is read, and its HMAC before its contents mean anything. */
#define _GNU_SOURCE
#include "server/dcache.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "fusebox/common.h"

#define MAGIC "FBDC"
#define HDR_BYTES (4 + 4 + FBD_DCACHE_KEY_BYTES + 8 + 8)
#define MAC_BYTES 32
#define TMP_STALE_S 600 /* a temporary file this old belongs to a writer that died */

struct fbd_dcache {
  pthread_mutex_t mu;
  int dfd;               /* the tenant's directory */
  char *dir;             /* its path */
  char prefix[32];       /* "v1-<16 hex of the build tag's hash>-" */
  uint8_t tkey[32];      /* HMAC(server key, domain | tenant): this tenant's key */
  uint64_t max_bytes;
  fbd_dcache_stats st;
  uint64_t tmp_seq;
};

static int fail(char *err, size_t errlen, int code, const char *fmt, ...) {
  if (err && errlen) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
  }
  return code;
}

static void hexify(const uint8_t *b, size_t n, char *out) {
  static const char hx[] = "0123456789abcdef";
  for (size_t i = 0; i < n; i++) {
    out[2 * i] = hx[b[i] >> 4];
    out[2 * i + 1] = hx[b[i] & 15];
  }
  out[2 * n] = 0;
}

static void sha256(const void *p, size_t n, uint8_t out[32]) {
  unsigned int len = 32;
  EVP_Digest(p, n, out, &len, EVP_sha256(), NULL);
}

void fbd_dcache_hash_parts(const void *const *parts, const size_t *lens, int n,
                           uint8_t out[FBD_DCACHE_KEY_BYTES]) {
  EVP_MD_CTX *c = EVP_MD_CTX_new();
  unsigned int len = 32;
  if (!c) abort(); /* out of memory on a 200-byte object: nothing sane left */
  EVP_DigestInit_ex(c, EVP_sha256(), NULL);
  for (int i = 0; i < n; i++) {
    uint8_t l[8];
    for (int b = 0; b < 8; b++) l[b] = (uint8_t)((uint64_t)lens[i] >> (8 * b));
    EVP_DigestUpdate(c, l, 8);
    EVP_DigestUpdate(c, parts[i], lens[i]);
  }
  EVP_DigestFinal_ex(c, out, &len);
  EVP_MD_CTX_free(c);
}

/* A directory fd that is ours alone: no link, owned by us, no group/other bits. */
static int check_dir(int fd, const char *path, char *err, size_t errlen) {
  struct stat s;
  if (fstat(fd, &s)) return fail(err, errlen, FB_EINVAL, "cannot stat %s: %s", path, strerror(errno));
  if (!S_ISDIR(s.st_mode)) return fail(err, errlen, FB_EINVAL, "%s is not a directory", path);
  if (s.st_uid != geteuid())
    return fail(err, errlen, FB_EINVAL,
                "code cache directory %s is owned by uid %u, not by this user (uid %u)", path,
                (unsigned)s.st_uid, (unsigned)geteuid());
  if (s.st_mode & 077)
    return fail(err, errlen, FB_EINVAL,
                "code cache directory %s is mode %03o: others may write or read it "
                "(chmod 700 it)", path, (unsigned)(s.st_mode & 0777));
  return 0;
}

static int open_dir(int at, const char *name, const char *path, int *out, char *err,
                    size_t errlen) {
  if (mkdirat(at, name, 0700) && errno != EEXIST)
    return fail(err, errlen, FB_EINVAL, "cannot make the code cache directory %s: %s", path,
                strerror(errno));
  int fd = openat(at, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0)
    return fail(err, errlen, FB_EINVAL, "cannot open the code cache directory %s: %s%s", path,
                strerror(errno), errno == ELOOP || errno == ENOTDIR ? " (a symbolic link?)" : "");
  int rc = check_dir(fd, path, err, errlen);
  if (rc) {
    close(fd);
    return rc;
  }
  *out = fd;
  return 0;
}

int fbd_dcache_check_root(const char *root, char *err, size_t errlen) {
  int fd = -1;
  int rc = open_dir(AT_FDCWD, root, root, &fd, err, errlen);
  if (!rc) close(fd);
  return rc;
}

int fbd_dcache_key_load(const char *path, const char *root, int create, uint8_t **key,
                        size_t *keylen, char *err, size_t errlen) {
  *key = NULL;
  *keylen = 0;
  if (root) { /* the key must not lie where cache writers could read or replace it */
    char *rk = realpath(path, NULL), *rr = realpath(root, NULL);
    char *dk = NULL;
    if (!rk) { /* not there yet: judge by its directory */
      char *copy = strdup(path);
      if (copy) {
        char *slash = strrchr(copy, '/');
        if (slash) *slash = 0;
        dk = realpath(slash ? (*copy ? copy : "/") : ".", NULL);
        free(copy);
      }
    }
    const char *k = rk ? rk : dk;
    int under = 0;
    if (k && rr) {
      size_t n = strlen(rr);
      under = !strncmp(k, rr, n) && (k[n] == '/' || k[n] == 0);
    }
    free(rk);
    free(rr);
    free(dk);
    if (under)
      return fail(err, errlen, FB_EINVAL,
                  "code cache key %s lies inside the cache directory %s: keep it outside", path,
                  root);
  }
  int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0 && errno == ENOENT && create) {
    uint8_t k[32];
    if (RAND_bytes(k, sizeof k) != 1)
      return fail(err, errlen, FB_EINTERNAL, "cannot make a code cache key: no random bytes");
    int w = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (w >= 0) {
      ssize_t n = write(w, k, sizeof k);
      int ok = n == (ssize_t)sizeof k && fsync(w) == 0;
      close(w);
      if (!ok) {
        unlink(path);
        return fail(err, errlen, FB_EINVAL, "cannot write the code cache key %s", path);
      }
    } else if (errno != EEXIST) {
      return fail(err, errlen, FB_EINVAL, "cannot make the code cache key %s: %s", path,
                  strerror(errno));
    }
    OPENSSL_cleanse(k, sizeof k);
    fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  }
  if (fd < 0)
    return fail(err, errlen, FB_EINVAL, "cannot open the code cache key %s: %s", path,
                strerror(errno));
  struct stat s;
  int rc = 0;
  if (fstat(fd, &s) || !S_ISREG(s.st_mode))
    rc = fail(err, errlen, FB_EINVAL, "code cache key %s is not a regular file", path);
  else if (s.st_uid != geteuid())
    rc = fail(err, errlen, FB_EINVAL, "code cache key %s is owned by uid %u, not by this user",
              path, (unsigned)s.st_uid);
  else if (s.st_mode & 077)
    rc = fail(err, errlen, FB_EINVAL, "code cache key %s is mode %03o: it must be 0600", path,
              (unsigned)(s.st_mode & 0777));
  else if (s.st_size < 32 || s.st_size > 4096)
    rc = fail(err, errlen, FB_EINVAL, "code cache key %s has %lld bytes: it needs 32 to 4096",
              path, (long long)s.st_size);
  if (rc) {
    close(fd);
    return rc;
  }
  uint8_t *k = malloc((size_t)s.st_size);
  ssize_t n = k ? read(fd, k, (size_t)s.st_size) : -1;
  close(fd);
  if (n != s.st_size) {
    free(k);
    return fail(err, errlen, FB_EINVAL, "cannot read the code cache key %s", path);
  }
  *key = k;
  *keylen = (size_t)n;
  return 0;
}

static int our_entry(const fbd_dcache *d, const char *name) {
  size_t n = strlen(name), p = strlen(d->prefix);
  return n == p + 64 + 4 && !strncmp(name, d->prefix, p) && !strcmp(name + n - 4, ".fbc");
}

static int is_entry_name(const char *name) {
  size_t n = strlen(name);
  return n > 4 && name[0] == 'v' && !strcmp(name + n - 4, ".fbc");
}

typedef struct scan_ent {
  char name[256]; /* ours are under 100 bytes (our_entry) */
  struct timespec mtime;
  uint64_t size;
} scan_ent;

/* Walk the directory: remove entries of other builds and stale temporary
 * files; sum (and with out, list) ours. */
static int scan(fbd_dcache *d, scan_ent **out, size_t *nout, uint64_t *bytes) {
  int fd = openat(d->dfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return -1;
  DIR *dir = fdopendir(fd);
  if (!dir) {
    close(fd);
    return -1;
  }
  scan_ent *v = NULL;
  size_t n = 0, cap = 0;
  uint64_t sum = 0;
  time_t now = time(NULL);
  for (struct dirent *e; (e = readdir(dir));) {
    struct stat s;
    if (fstatat(d->dfd, e->d_name, &s, AT_SYMLINK_NOFOLLOW)) continue;
    if (!strncmp(e->d_name, ".tmp-", 5)) {
      if (now - s.st_mtime > TMP_STALE_S) unlinkat(d->dfd, e->d_name, 0);
      continue;
    }
    if (!is_entry_name(e->d_name)) continue;
    if (!our_entry(d, e->d_name)) { /* another format or build: never readable by us */
      unlinkat(d->dfd, e->d_name, 0);
      continue;
    }
    sum += (uint64_t)s.st_size;
    if (out) {
      if (n == cap) {
        size_t nc = cap ? cap * 2 : 64;
        scan_ent *nv = realloc(v, nc * sizeof *nv);
        if (!nv) break;
        v = nv;
        cap = nc;
      }
      snprintf(v[n].name, sizeof v[n].name, "%s", e->d_name);
      v[n].mtime = s.st_mtim;
      v[n].size = (uint64_t)s.st_size;
      n++;
    }
  }
  closedir(dir);
  if (out) {
    *out = v;
    *nout = n;
  }
  *bytes = sum;
  return 0;
}

int fbd_dcache_open(const char *root, const char *tenant, const char *build_tag,
                    const uint8_t *key, size_t keylen, uint64_t max_bytes, fbd_dcache **out,
                    char *err, size_t errlen) {
  *out = NULL;
  if (!root || !*root || !tenant || !build_tag || !key || keylen < 32)
    return fail(err, errlen, FB_EINVAL, "code cache: missing directory, tenant, tag or key");
  int rfd = -1;
  int rc = open_dir(AT_FDCWD, root, root, &rfd, err, errlen);
  if (rc) return rc;
  uint8_t th[32];
  sha256(tenant, strlen(tenant), th);
  char tname[40] = "t-";
  hexify(th, 16, tname + 2);
  fbd_dcache *d = calloc(1, sizeof *d);
  size_t plen = strlen(root) + strlen(tname) + 2;
  if (d) d->dir = malloc(plen);
  if (!d || !d->dir) {
    close(rfd);
    free(d);
    return fail(err, errlen, FB_ENOMEM, "out of memory");
  }
  snprintf(d->dir, plen, "%s/%s", root, tname);
  d->dfd = -1;
  rc = open_dir(rfd, tname, d->dir, &d->dfd, err, errlen);
  close(rfd);
  if (rc) {
    free(d->dir);
    free(d);
    return rc;
  }
  uint8_t bh[32];
  char bhex[17];
  sha256(build_tag, strlen(build_tag), bh);
  hexify(bh, 8, bhex);
  snprintf(d->prefix, sizeof d->prefix, "v%d-%s-", FBD_DCACHE_FORMAT, bhex);
  /* the tenant's key: an entry signed for one tenant means nothing to another */
  size_t dl = strlen("fusebox code cache") + 1 + strlen(tenant);
  uint8_t *msg = malloc(dl);
  if (!msg) {
    fbd_dcache_close(d);
    return fail(err, errlen, FB_ENOMEM, "out of memory");
  }
  memcpy(msg, "fusebox code cache", 19);
  memcpy(msg + 19, tenant, strlen(tenant));
  unsigned int ml = 32;
  HMAC(EVP_sha256(), key, (int)keylen, msg, dl, d->tkey, &ml);
  free(msg);
  pthread_mutex_init(&d->mu, NULL);
  d->max_bytes = max_bytes;
  d->st.limit = max_bytes;
  scan(d, NULL, NULL, &d->st.bytes);
  *out = d;
  return 0;
}

void fbd_dcache_close(fbd_dcache *d) {
  if (!d) return;
  if (d->dfd >= 0) close(d->dfd);
  OPENSSL_cleanse(d->tkey, sizeof d->tkey);
  pthread_mutex_destroy(&d->mu);
  free(d->dir);
  free(d);
}

const char *fbd_dcache_dir(const fbd_dcache *d) { return d->dir; }

static void entry_name(const fbd_dcache *d, const uint8_t key[32], char *out, size_t n) {
  char hex[65];
  hexify(key, 32, hex);
  snprintf(out, n, "%s%s.fbc", d->prefix, hex);
}

static void put64(uint8_t *p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static uint64_t get64(const uint8_t *p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
  return v;
}

static void count(fbd_dcache *d, uint64_t *c) {
  pthread_mutex_lock(&d->mu);
  (*c)++;
  pthread_mutex_unlock(&d->mu);
}

/* A refused entry: gone, counted; the caller compiles again. */
static int reject(fbd_dcache *d, const char *name, int fd, uint64_t size) {
  if (fd >= 0) close(fd);
  if (!unlinkat(d->dfd, name, 0)) {
    pthread_mutex_lock(&d->mu);
    d->st.bytes = d->st.bytes > size ? d->st.bytes - size : 0;
    pthread_mutex_unlock(&d->mu);
  }
  count(d, &d->st.rejects);
  return 0;
}

int fbd_dcache_get(fbd_dcache *d, const uint8_t key[32], const void *ir, size_t irlen,
                   uint8_t **payload, size_t *len) {
  *payload = NULL;
  *len = 0;
  char name[128];
  entry_name(d, key, name, sizeof name);
  int fd = openat(d->dfd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
  if (fd < 0) {
    if (errno == ENOENT) {
      count(d, &d->st.misses);
      return 0;
    }
    count(d, &d->st.misses);
    return reject(d, name, -1, 0); /* a link (ELOOP), or a thing we cannot open */
  }
  struct stat s;
  count(d, &d->st.misses); /* taken back on a hit below */
  if (fstat(fd, &s) || !S_ISREG(s.st_mode) || s.st_uid != geteuid() || (s.st_mode & 077) ||
      s.st_nlink != 1 || (uint64_t)s.st_size < HDR_BYTES + MAC_BYTES ||
      (uint64_t)s.st_size > HDR_BYTES + FBD_DCACHE_MAX_IR + FBD_DCACHE_MAX_PAYLOAD + MAC_BYTES)
    return reject(d, name, fd, S_ISREG(s.st_mode) ? (uint64_t)s.st_size : 0);
  size_t n = (size_t)s.st_size;
  uint8_t *b = malloc(n);
  if (!b) {
    close(fd);
    return 0;
  }
  size_t got = 0;
  while (got < n) {
    ssize_t r = read(fd, b + got, n - got);
    if (r <= 0) break;
    got += (size_t)r;
  }
  /* the MAC first: nothing of the entry is believed before it */
  uint8_t mac[32];
  unsigned int ml = 32;
  int ok = got == n;
  if (ok) {
    HMAC(EVP_sha256(), d->tkey, 32, b, n - MAC_BYTES, mac, &ml);
    ok = CRYPTO_memcmp(mac, b + n - MAC_BYTES, MAC_BYTES) == 0;
  }
  uint64_t il = ok ? get64(b + 40) : 0, pl = ok ? get64(b + 48) : 0;
  ok = ok && !memcmp(b, MAGIC, 4) && b[4] == FBD_DCACHE_FORMAT && !b[5] && !b[6] && !b[7] &&
       !memcmp(b + 8, key, 32) && il <= FBD_DCACHE_MAX_IR && pl <= FBD_DCACHE_MAX_PAYLOAD &&
       HDR_BYTES + il + pl + MAC_BYTES == n;
  if (!ok) {
    free(b);
    return reject(d, name, fd, n);
  }
  if (il != irlen || memcmp(b + HDR_BYTES, ir, irlen)) { /* a sound entry of other IR */
    free(b);
    close(fd);
    return 0;
  }
  (void)futimens(fd, NULL); /* most recently used */
  close(fd);
  uint8_t *p = malloc(pl ? pl : 1);
  if (!p) {
    free(b);
    return 0;
  }
  memcpy(p, b + HDR_BYTES + il, pl);
  free(b);
  pthread_mutex_lock(&d->mu);
  d->st.misses--;
  d->st.hits++;
  pthread_mutex_unlock(&d->mu);
  *payload = p;
  *len = pl;
  return 1;
}

static int cmp_mtime(const void *a, const void *b) {
  const scan_ent *x = a, *y = b;
  if (x->mtime.tv_sec != y->mtime.tv_sec) return x->mtime.tv_sec < y->mtime.tv_sec ? -1 : 1;
  if (x->mtime.tv_nsec != y->mtime.tv_nsec) return x->mtime.tv_nsec < y->mtime.tv_nsec ? -1 : 1;
  return strcmp(x->name, y->name);
}

/* Past the bound: the directory as it is (other processes write it too),
 * least recently used first, removed down to the bound. Not under mu. */
static void evict(fbd_dcache *d, const char *keep) {
  scan_ent *v = NULL;
  size_t n = 0;
  uint64_t bytes = 0;
  if (scan(d, &v, &n, &bytes)) return;
  qsort(v, n, sizeof *v, cmp_mtime);
  uint64_t gone = 0;
  for (size_t i = 0; i < n && bytes > d->max_bytes; i++) {
    if (!strcmp(v[i].name, keep)) continue; /* the entry just written stays */
    if (!unlinkat(d->dfd, v[i].name, 0)) {
      bytes -= v[i].size;
      gone++;
    }
  }
  free(v);
  pthread_mutex_lock(&d->mu);
  d->st.bytes = bytes;
  d->st.evictions += gone;
  pthread_mutex_unlock(&d->mu);
}

int fbd_dcache_put(fbd_dcache *d, const uint8_t key[32], const void *ir, size_t irlen,
                   const void *payload, size_t len) {
  if (irlen > FBD_DCACHE_MAX_IR || len > FBD_DCACHE_MAX_PAYLOAD) return -1;
  size_t n = HDR_BYTES + irlen + len + MAC_BYTES;
  if (d->max_bytes && n > d->max_bytes) return -1; /* would evict everything, itself too */
  uint8_t *b = malloc(n);
  if (!b) return -1;
  memcpy(b, MAGIC, 4);
  b[4] = FBD_DCACHE_FORMAT;
  b[5] = b[6] = b[7] = 0;
  memcpy(b + 8, key, 32);
  put64(b + 40, irlen);
  put64(b + 48, len);
  memcpy(b + HDR_BYTES, ir, irlen);
  if (len) memcpy(b + HDR_BYTES + irlen, payload, len);
  unsigned int ml = 32;
  HMAC(EVP_sha256(), d->tkey, 32, b, n - MAC_BYTES, b + n - MAC_BYTES, &ml);
  char name[128], tmp[96];
  entry_name(d, key, name, sizeof name);
  pthread_mutex_lock(&d->mu);
  unsigned long long seq = (unsigned long long)d->tmp_seq++;
  pthread_mutex_unlock(&d->mu);
  uint32_t rnd = 0;
  (void)RAND_bytes((unsigned char *)&rnd, sizeof rnd);
  snprintf(tmp, sizeof tmp, ".tmp-%ld-%llu-%08x", (long)getpid(), seq, (unsigned)rnd);
  int fd = openat(d->dfd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) {
    free(b);
    return -1;
  }
  size_t done = 0;
  while (done < n) {
    ssize_t w = write(fd, b + done, n - done);
    if (w <= 0) break;
    done += (size_t)w;
  }
  free(b);
  int ok = done == n && fsync(fd) == 0;
  ok = close(fd) == 0 && ok;
  struct stat old;
  int had = !fstatat(d->dfd, name, &old, AT_SYMLINK_NOFOLLOW) && S_ISREG(old.st_mode);
  if (!ok || renameat(d->dfd, tmp, d->dfd, name)) {
    unlinkat(d->dfd, tmp, 0);
    return -1;
  }
  (void)fsync(d->dfd);
  pthread_mutex_lock(&d->mu);
  d->st.writes++;
  d->st.bytes += n;
  if (had) d->st.bytes = d->st.bytes > (uint64_t)old.st_size ? d->st.bytes - (uint64_t)old.st_size : 0;
  int over = d->max_bytes && d->st.bytes > d->max_bytes;
  pthread_mutex_unlock(&d->mu);
  if (over) evict(d, name);
  return 0;
}

void fbd_dcache_stats_get(fbd_dcache *d, fbd_dcache_stats *out) {
  memset(out, 0, sizeof *out);
  if (!d) return;
  pthread_mutex_lock(&d->mu);
  *out = d->st;
  pthread_mutex_unlock(&d->mu);
}

int fbd_dcache_sweep(const char *root, const char *build_tag) {
  int rfd = open(root, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (rfd < 0) return 0;
  DIR *dir = fdopendir(rfd);
  if (!dir) {
    close(rfd);
    return 0;
  }
  int n = 0;
  for (struct dirent *e; (e = readdir(dir));) {
    if (strncmp(e->d_name, "t-", 2) || strlen(e->d_name) != 34) continue;
    fbd_dcache d;
    memset(&d, 0, sizeof d);
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", root, e->d_name);
    int fd = openat(dirfd(dir), e->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) continue;
    if (check_dir(fd, path, NULL, 0)) { /* not ours: left alone, never read */
      close(fd);
      continue;
    }
    d.dfd = fd;
    uint8_t bh[32];
    char bhex[17];
    sha256(build_tag, strlen(build_tag), bh);
    hexify(bh, 8, bhex);
    snprintf(d.prefix, sizeof d.prefix, "v%d-%s-", FBD_DCACHE_FORMAT, bhex);
    uint64_t bytes = 0;
    scan(&d, NULL, NULL, &bytes);
    close(fd);
    n++;
  }
  closedir(dir);
  return n;
}
