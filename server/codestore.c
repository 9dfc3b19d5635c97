/* fuseboxd's compile cache on disk (docs/code-cache.md): the engine's code
 * store (fusebox/codestore.h) over server/dcache.c, one cache per tenant,
 * opened at a tenant's first compile. The key is SHA-256 over the cache
 * format, fuseboxd's version and commit, what the JIT compiles for (back
 * end, LLVM version, triple, CPU, features, code generation options, the
 * runtime bitcode's hash) and the task's IR and layout text; the entry's
 * stored IR confirms a hit. Only this process (which holds no tenant code
 * under process isolation: the broker) holds the key and writes. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "server/server.h"
#include "server/auth.h"
#include "server/dcache.h"

#ifndef FBD_COMMIT
#define FBD_COMMIT "unknown"
#endif

typedef struct part {
  uint64_t partition;
  char name[128]; /* the tenant's name, "" for the anonymous partition */
  fbd_dcache *d;
  int failed; /* could not open: not tried again */
} part;

struct fbd_codestore {
  pthread_mutex_t mu;
  char *dir;
  uint8_t *key;
  size_t keylen;
  uint64_t share; /* each tenant's bound */
  part *v;
  int n, cap;
  fbd_log *log;
};

static const char *build_tag(void) {
  return "fusebox code cache format 1; fuseboxd " FBD_VERSION " commit " FBD_COMMIT;
}

static part *find_locked(fbd_codestore *s, uint64_t partition) {
  for (int i = 0; i < s->n; i++)
    if (s->v[i].partition == partition) return &s->v[i];
  if (s->n == s->cap) {
    int nc = s->cap ? s->cap * 2 : 8;
    part *nv = realloc(s->v, sizeof *nv * (size_t)nc);
    if (!nv) return NULL;
    s->v = nv;
    s->cap = nc;
  }
  part *p = &s->v[s->n++];
  memset(p, 0, sizeof *p);
  p->partition = partition;
  return p;
}

void fbd_codestore_name(fbd_codestore *s, uint64_t partition, const char *tenant) {
  if (!s) return;
  pthread_mutex_lock(&s->mu);
  part *p = find_locked(s, partition);
  if (p && !p->name[0]) snprintf(p->name, sizeof p->name, "%s", tenant);
  pthread_mutex_unlock(&s->mu);
}

static fbd_dcache *cache_of(fbd_codestore *s, uint64_t partition) {
  pthread_mutex_lock(&s->mu);
  part *p = find_locked(s, partition);
  fbd_dcache *d = p ? p->d : NULL;
  if (p && !d && !p->failed) {
    char id[40], err[512];
    /* the directory's identity is the partition (a hash of the tenant's
     * name, auth.c), which the HMAC binds each entry to */
    snprintf(id, sizeof id, "partition %016llx", (unsigned long long)partition);
    if (fbd_dcache_open(s->dir, id, build_tag(), s->key, s->keylen, s->share, &p->d, err,
                        sizeof err)) {
      p->failed = 1;
      fbd_logf(s->log, FBD_LOG_WARN, "code cache on disk off for tenant '%s': %s",
               p->name[0] ? p->name : "(anonymous)", err);
    }
    d = p->d;
  }
  pthread_mutex_unlock(&s->mu);
  return d;
}

/* The partition is a part too: the code's symbol names carry it. */
static void key_of(uint64_t partition, const char *target, const char *ir, size_t irlen,
                   uint8_t k[32]) {
  const char *tag = build_tag();
  char pt[24];
  snprintf(pt, sizeof pt, "%016llx", (unsigned long long)partition);
  const void *parts[4] = {tag, pt, target, ir};
  size_t lens[4] = {strlen(tag), strlen(pt), strlen(target), irlen};
  fbd_dcache_hash_parts(parts, lens, 4, k);
}

static int store_get(void *user, uint64_t partition, const char *target, const char *ir,
                     size_t irlen, uint8_t **code, size_t *len) {
  fbd_dcache *d = cache_of(user, partition);
  if (!d) return 0;
  uint8_t k[32];
  key_of(partition, target, ir, irlen, k);
  return fbd_dcache_get(d, k, ir, irlen, code, len);
}

static void store_put(void *user, uint64_t partition, const char *target, const char *ir,
                      size_t irlen, const uint8_t *code, size_t len) {
  fbd_dcache *d = cache_of(user, partition);
  if (!d) return;
  uint8_t k[32];
  key_of(partition, target, ir, irlen, k);
  (void)fbd_dcache_put(d, k, ir, irlen, code, len);
}

int fbd_codestore_get(fbd_codestore *s, uint64_t partition, const char *target, const char *ir,
                      size_t irlen, uint8_t **code, size_t *len) {
  return s ? store_get(s, partition, target, ir, irlen, code, len) : 0;
}

void fbd_codestore_put(fbd_codestore *s, uint64_t partition, const char *target, const char *ir,
                       size_t irlen, const uint8_t *code, size_t len) {
  if (s) store_put(s, partition, target, ir, irlen, code, len);
}

int fbd_codestore_start(fbd_server *srv, char *err, size_t errlen) {
  const fbd_config *cfg = srv->cfg;
  if (!cfg->code_cache_dir || !cfg->code_cache_dir[0]) return 0;
  fbd_codestore *s = calloc(1, sizeof *s);
  if (!s || !(s->dir = strdup(cfg->code_cache_dir))) {
    free(s);
    return FB_ENOMEM;
  }
  pthread_mutex_init(&s->mu, NULL);
  s->log = srv->log;
  char *keypath = NULL;
  if (cfg->code_cache_key && cfg->code_cache_key[0]) {
    keypath = strdup(cfg->code_cache_key);
  } else { /* default: beside the directory, DIR.key */
    size_t n = strlen(s->dir);
    while (n > 1 && s->dir[n - 1] == '/') s->dir[--n] = 0;
    keypath = malloc(n + 5);
    if (keypath) snprintf(keypath, n + 5, "%s.key", s->dir);
  }
  int rc = keypath ? 0 : FB_ENOMEM;
  /* the root made now (0700), so that the key's place can be judged */
  if (!rc) rc = fbd_dcache_check_root(s->dir, err, errlen);
  if (!rc) rc = fbd_dcache_key_load(keypath, s->dir, 1, &s->key, &s->keylen, err, errlen);
  if (!rc) (void)fbd_dcache_sweep(s->dir, build_tag()); /* other builds' entries go now */
  free(keypath);
  if (rc) {
    fbd_codestore_free(s);
    return rc;
  }
  /* each tenant's share of the bound: the tenants of the file and the anonymous one */
  int tenants = 1;
  if (srv->auth) {
    pthread_mutex_lock(&srv->auth->mu);
    tenants += srv->auth->n;
    pthread_mutex_unlock(&srv->auth->mu);
  }
  s->share = cfg->code_cache_disk_bytes / (uint64_t)tenants;
  srv->codestore = s;
  fb_code_store st = {store_get, store_put, s};
  rc = fb_engine_set_code_store(srv->engine, &st);
  if (rc) fb_errf(err, errlen, "out of memory");
  return rc;
}

void fbd_codestore_free(fbd_codestore *s) {
  if (!s) return;
  for (int i = 0; i < s->n; i++) fbd_dcache_close(s->v[i].d);
  free(s->v);
  if (s->key) memset(s->key, 0, s->keylen);
  free(s->key);
  free(s->dir);
  pthread_mutex_destroy(&s->mu);
  free(s);
}

void fbd_codestore_metrics(fbd_codestore *s,
                           void (*line)(void *u, const char *name, const char *type,
                                        const char *help),
                           void (*value)(void *u, const char *name, const char *tenant,
                                         unsigned long long v),
                           void *u) {
  if (!s) return;
  static const char *const names[] = {
      "code_cache_disk_hits_total",   "code_cache_disk_misses_total",
      "code_cache_disk_writes_total", "code_cache_disk_rejects_total",
      "code_cache_disk_evictions_total", "code_cache_disk_bytes"};
  static const char *const helps[] = {
      "Tasks whose code the tenant's compile cache on disk held (not compiled).",
      "Tasks the tenant's compile cache on disk did not hold (refused entries included).",
      "Entries written to the tenant's compile cache on disk.",
      "Entries of the tenant's compile cache on disk refused (bad HMAC, header, owner, mode, "
      "a link, another tenant's), removed and compiled again.",
      "Entries of the tenant's compile cache on disk removed past its share of the bound.",
      "Bytes of the tenant's compile cache on disk."};
  pthread_mutex_lock(&s->mu);
  for (int m = 0; m < 6; m++) {
    line(u, names[m], m == 5 ? "gauge" : "counter", helps[m]);
    for (int i = 0; i < s->n; i++) {
      if (!s->v[i].d) continue;
      fbd_dcache_stats st;
      fbd_dcache_stats_get(s->v[i].d, &st);
      uint64_t v[6] = {st.hits, st.misses, st.writes, st.rejects, st.evictions, st.bytes};
      value(u, names[m], s->v[i].name, (unsigned long long)v[m]);
    }
  }
  pthread_mutex_unlock(&s->mu);
}
