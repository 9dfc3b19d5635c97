#define _GNU_SOURCE /* memfd_create, O_TMPFILE */
/* Checkpoints in fuseboxd, the broker's side (docs/security.md "Checkpoints on fuseboxd"):
 * the server key, the checkpoint directory (one subdirectory per tenant,
 * names chosen here), the seal around the unsealed stream the engine side
 * makes (the key never reaches a worker process), and where the sealed
 * bytes go: a file under --checkpoint-dir (a temporary name, fsync,
 * rename: a checkpoint that fails leaves the previous one whole) or a
 * memfd counted in the memory budget's staging part while it grows, which
 * is then streamed to the client.
 *
 * What the seal covers: the engine's stream (it begins the file, as the
 * seal's verifier expects), then a suffix of ours: the client state, its
 * length (u32, little-endian) and "FBCS". */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "server/server.h"

#define SUFFIX_MAGIC "FBCS"

struct fbd_ckpt {
  uint8_t key[256];
  size_t keylen;
  int dirfd; /* --checkpoint-dir, or -1 */
  pthread_mutex_t mu; /* names, pruning */
  uint64_t serial;
};

const char *fbd_ckpt_owner(const struct fbd_tenant *t) { return t ? t->name : ""; }

/* The tenant's directory: "anonymous", or "t-" and its name in hex (a
 * tenant's name never becomes a path of its own choosing). */
static void tenant_dir(const struct fbd_tenant *t, char *out, size_t n) {
  if (!t) {
    snprintf(out, n, "anonymous");
    return;
  }
  size_t k = (size_t)snprintf(out, n, "t-");
  for (const unsigned char *p = (const unsigned char *)t->name; *p && k + 3 < n; p++)
    k += (size_t)snprintf(out + k, n - k, "%02x", *p);
}

int fbd_ckpt_start(fbd_server *srv, char *err, size_t errlen) {
  const fbd_config *cfg = srv->cfg;
  if (!cfg->checkpoint_dir && !cfg->checkpoint_key) return 0;
  struct fbd_ckpt *c = calloc(1, sizeof *c);
  if (!c) return FB_ENOMEM;
  c->dirfd = -1;
  pthread_mutex_init(&c->mu, NULL);
  srv->ckpt = c;
  if (cfg->checkpoint_dir) {
    if (!cfg->checkpoint_key) {
      fb_errf(err, errlen, "--checkpoint-dir needs --checkpoint-key FILE (kept outside it)");
      return FB_EINVAL;
    }
    mkdir(cfg->checkpoint_dir, 0700);
    c->dirfd = open(cfg->checkpoint_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (c->dirfd < 0) {
      fb_errf(err, errlen, "--checkpoint-dir %s: %s", cfg->checkpoint_dir, strerror(errno));
      return FB_EINVAL;
    }
    /* the key outside the directory: a key file inside it would travel with
       the checkpoints it vouches for */
    char kd[4096], dd[4096];
    char *kdir = realpath(cfg->checkpoint_key, NULL);
    if (!kdir) { /* not there yet: its directory */
      snprintf(kd, sizeof kd, "%s", cfg->checkpoint_key);
      char *slash = strrchr(kd, '/');
      if (slash) *slash = 0;
      else snprintf(kd, sizeof kd, ".");
      kdir = realpath(kd, NULL);
    }
    char *ddir = realpath(cfg->checkpoint_dir, NULL);
    int inside = 0;
    if (kdir && ddir) {
      snprintf(kd, sizeof kd, "%s/", kdir);
      snprintf(dd, sizeof dd, "%s/", ddir);
      inside = !strncmp(kd, dd, strlen(dd));
    }
    free(kdir);
    free(ddir);
    if (inside) {
      fb_errf(err, errlen, "--checkpoint-key %s lies inside --checkpoint-dir %s: keep the key "
              "outside the directory of the checkpoints it seals", cfg->checkpoint_key,
              cfg->checkpoint_dir);
      return FB_EINVAL;
    }
  }
  if (cfg->checkpoint_key) {
    char why[512];
    c->keylen = sizeof c->key;
    int rc = fb_seal_key_load(cfg->checkpoint_key, cfg->checkpoint_key_create, c->key, &c->keylen,
                              why, sizeof why);
    if (rc) {
      fb_errf(err, errlen, "--checkpoint-key %s: %s%s", cfg->checkpoint_key, why,
              cfg->checkpoint_key_create ? "" : " (--checkpoint-key-create makes a new one)");
      return FB_EINVAL;
    }
  }
  return 0;
}

void fbd_ckpt_free(fbd_server *srv) {
  struct fbd_ckpt *c = srv->ckpt;
  if (!c) return;
  if (c->dirfd >= 0) close(c->dirfd);
  memset(c->key, 0, sizeof c->key);
  pthread_mutex_destroy(&c->mu);
  free(c);
  srv->ckpt = NULL;
}

int fbd_ckpt_enabled(const fbd_server *srv) { return srv->ckpt && srv->ckpt->keylen; }
int fbd_ckpt_dir_enabled(const fbd_server *srv) { return srv->ckpt && srv->ckpt->dirfd >= 0; }

/* A name the server gave: "<8 hex of the session>-<digits>.fbck" (or its
 * temporary twin): nothing else is ever opened, so no client path, "..",
 * or name of another tenant's can be reached. */
int fbd_ckpt_name_ok(const char *name) {
  size_t n = strlen(name);
  if (n < 15 || n > 64) return 0;
  for (int i = 0; i < 8; i++)
    if (!strchr("0123456789abcdef", name[i])) return 0;
  if (name[8] != '-') return 0;
  size_t i = 9;
  while (i < n && name[i] >= '0' && name[i] <= '9') i++;
  return i > 9 && !strcmp(name + i, ".fbck");
}

/* The tenant's directory, made when missing (0700); -1 with err. */
static int tenant_dirfd(fbd_server *srv, const struct fbd_tenant *t, int make, char *err,
                        size_t errlen) {
  char d[160];
  tenant_dir(t, d, sizeof d);
  if (make) mkdirat(srv->ckpt->dirfd, d, 0700);
  int fd = openat(srv->ckpt->dirfd, d, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0 && errno == ENOENT && !make) fb_errf(err, errlen, "no checkpoints of yours here");
  else if (fd < 0) fb_errf(err, errlen, "the checkpoint directory: %s", strerror(errno));
  return fd;
}

/* ---------------------------------------------------------------- writing */

struct fbd_ckpt_job {
  fbd_server *srv;
  const struct fbd_tenant *owner;
  int to_dir;
  int fd; /* a temporary file in the tenant's directory, or a memfd */
  int tdir;
  char tmp[80], name[72];
  char tag[9];
  fb_seal *seal;
  uint64_t bytes, counted; /* written; counted in the staging part (memfd) */
  int code; /* the first failure of the sink (the stream then stops) */
  char why[256];
  /* restore */
  uint64_t off, end; /* what the source gives: [off, end) of fd */
  uint8_t *state;
  size_t nstate;
  uint8_t *map; /* a memfd's mapping, streamed to the client */
};

/* The seal's sink: bytes to the file or memfd (the budget counted first). */
static int raw_sink(void *user, const void *buf, size_t n) {
  fbd_ckpt_job *k = user;
  if (k->code) return 1;
  if (!k->to_dir) {
    char err[FBD_ERRLEN];
    int all = fbd_auth_sees_all(k->srv, k->owner);
    pthread_mutex_lock(&k->srv->mu);
    int rc = fbd_budget_admit_locked(k->srv, n, "Checkpoint", k->owner, all, err, sizeof err);
    pthread_mutex_unlock(&k->srv->mu);
    if (rc) {
      k->code = FB_EQUOTA;
      fb_errf(k->why, sizeof k->why, "%s", err);
      return 1;
    }
    fbd_stage_count((int64_t)n);
    k->counted += n;
  }
  const uint8_t *p = buf;
  size_t left = n;
  while (left) {
    ssize_t w = write(k->fd, p, left);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      k->code = FB_EIO;
      snprintf(k->why, sizeof k->why, "cannot write the checkpoint: %s",
               w < 0 ? strerror(errno) : "nothing written");
      return 1;
    }
    p += w;
    left -= (size_t)w;
  }
  k->bytes += n;
  return 0;
}

int fbd_ckpt_sink(void *user, const void *buf, size_t n) {
  fbd_ckpt_job *k = user;
  if (k->code) return 1;
  return fb_seal_write(k->seal, buf, n);
}

int fbd_ckpt_failed(const fbd_ckpt_job *k, char *why, size_t n) {
  if (k->code) snprintf(why, n, "%s", k->why);
  return k->code;
}

int fbd_ckpt_begin(fbd_server *srv, const struct fbd_tenant *owner, const char *tag, int to_dir,
                   const void *state, size_t nstate, fbd_ckpt_job **out, char *err,
                   size_t errlen) {
  *out = NULL;
  if (!fbd_ckpt_enabled(srv)) {
    fb_errf(err, errlen, "checkpoints are off on this server (fuseboxd --checkpoint-key)");
    return FB_EUNSUPPORTED;
  }
  if (to_dir && !fbd_ckpt_dir_enabled(srv)) {
    fb_errf(err, errlen, "this server keeps no checkpoints (fuseboxd --checkpoint-dir)");
    return FB_EUNSUPPORTED;
  }
  fbd_ckpt_job *k = calloc(1, sizeof *k);
  if (!k) return FB_ENOMEM;
  k->srv = srv;
  k->owner = owner;
  k->to_dir = to_dir;
  k->fd = k->tdir = -1;
  snprintf(k->tag, sizeof k->tag, "%s", tag);
  if (to_dir) {
    k->tdir = tenant_dirfd(srv, owner, 1, err, errlen);
    if (k->tdir < 0) {
      free(k);
      return FB_EIO;
    }
    pthread_mutex_lock(&srv->ckpt->mu);
    uint64_t serial = ++srv->ckpt->serial;
    pthread_mutex_unlock(&srv->ckpt->mu);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    /* names sort by time: seconds and a serial within the process */
    snprintf(k->name, sizeof k->name, "%s-%lld%06llu.fbck", k->tag, (long long)ts.tv_sec,
             (unsigned long long)(serial % 1000000));
    snprintf(k->tmp, sizeof k->tmp, ".tmp-%s", k->name);
    k->fd = openat(k->tdir, k->tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  } else {
    k->fd = memfd_create("fusebox-checkpoint", MFD_CLOEXEC);
  }
  if (k->fd < 0) {
    fb_errf(err, errlen, "cannot make the checkpoint file: %s", strerror(errno));
    fbd_ckpt_end(k);
    return FB_EIO;
  }
  k->seal = fb_seal_begin(srv->ckpt->key, srv->ckpt->keylen, fbd_ckpt_owner(owner), raw_sink, k);
  /* the client state goes after the engine's stream (fbd_ckpt_finish) */
  k->state = malloc(nstate ? nstate : 1);
  if (!k->seal || !k->state) {
    fb_errf(err, errlen, "out of memory");
    fbd_ckpt_end(k);
    return FB_ENOMEM;
  }
  if (nstate) memcpy(k->state, state, nstate);
  k->nstate = nstate;
  *out = k;
  return 0;
}

/* Keep the newest two checkpoints of the session tag in dirfd. */
static void prune(int dirfd, const char *tag) {
  DIR *d = fdopendir(dup(dirfd));
  if (!d) return;
  char names[64][72];
  int n = 0;
  for (struct dirent *e; (e = readdir(d)) && n < 64;)
    if (fbd_ckpt_name_ok(e->d_name) && !strncmp(e->d_name, tag, 8))
      fb_errf(names[n++], 72, "%s", e->d_name);
  closedir(d);
  /* newest: the longest, then the greatest name */
  for (int keep = 0; keep < 2 && n; keep++) {
    int best = 0;
    for (int i = 1; i < n; i++) {
      size_t a = strlen(names[i]), b = strlen(names[best]);
      if (a > b || (a == b && strcmp(names[i], names[best]) > 0)) best = i;
    }
    memcpy(names[best], names[--n], 72);
  }
  for (int i = 0; i < n; i++) unlinkat(dirfd, names[i], 0);
}

int fbd_ckpt_finish(fbd_ckpt_job *k, int keep_two, char *err, size_t errlen) {
  char why[256] = "";
  int rc = k->code;
  fb_seal *seal = k->seal;
  k->seal = NULL;
  if (!rc) { /* the suffix: the client state, its length, the magic */
    uint8_t tail[8];
    uint32_t ns = (uint32_t)k->nstate;
    memcpy(tail, &ns, 4);
    memcpy(tail + 4, SUFFIX_MAGIC, 4);
    if ((k->nstate && fb_seal_write(seal, k->state, k->nstate)) || fb_seal_write(seal, tail, 8))
      rc = k->code ? k->code : FB_EIO;
  }
  if (!rc && fb_seal_finish(seal, why, sizeof why)) rc = k->code ? k->code : FB_EIO;
  else if (rc) fb_seal_abort(seal);
  if (!rc && k->to_dir && fsync(k->fd)) {
    rc = FB_EIO;
    snprintf(why, sizeof why, "cannot write the checkpoint: %s", strerror(errno));
  }
  if (!rc && k->to_dir && renameat(k->tdir, k->tmp, k->tdir, k->name)) {
    rc = FB_EIO;
    snprintf(why, sizeof why, "cannot name the checkpoint: %s", strerror(errno));
  }
  if (!rc && k->to_dir) {
    k->tmp[0] = 0; /* it is the checkpoint now */
    fsync(k->tdir);
    if (keep_two) prune(k->tdir, k->tag);
  }
  if (!rc && !k->to_dir && k->bytes) {
    void *p = mmap(NULL, k->bytes, PROT_READ, MAP_SHARED, k->fd, 0);
    if (p == MAP_FAILED) {
      rc = FB_ENOMEM;
      snprintf(why, sizeof why, "cannot map the checkpoint: %s", strerror(errno));
    } else {
      k->map = p;
    }
  }
  if (rc) fb_errf(err, errlen, "%s", k->code ? k->why : why[0] ? why : fb_strerror(rc));
  return rc;
}

const char *fbd_ckpt_name(const fbd_ckpt_job *k) { return k->name; }
uint64_t fbd_ckpt_bytes(const fbd_ckpt_job *k) { return k->bytes; }
const uint8_t *fbd_ckpt_map(const fbd_ckpt_job *k) { return k->map; }
const uint8_t *fbd_ckpt_state(const fbd_ckpt_job *k, size_t *n) {
  *n = k->nstate;
  return k->state;
}

void fbd_ckpt_end(fbd_ckpt_job *k) {
  if (!k) return;
  if (k->seal) fb_seal_abort(k->seal);
  if (k->map) munmap(k->map, k->bytes);
  if (k->fd >= 0) close(k->fd);
  if (k->tmp[0] && k->tdir >= 0) unlinkat(k->tdir, k->tmp, 0); /* a failed one leaves nothing */
  if (k->tdir >= 0) close(k->tdir);
  if (k->counted) fbd_stage_count(-(int64_t)k->counted);
  free(k->state);
  free(k);
}

/* ---------------------------------------------------------------- reading */

/* A restore's upload: a memfd, counted in the budget as it grows. */
int fbd_ckpt_upload_begin(fbd_server *srv, const struct fbd_tenant *owner, fbd_ckpt_job **out,
                          char *err, size_t errlen) {
  *out = NULL;
  if (!fbd_ckpt_enabled(srv)) {
    fb_errf(err, errlen, "checkpoints are off on this server (fuseboxd --checkpoint-key)");
    return FB_EUNSUPPORTED;
  }
  fbd_ckpt_job *k = calloc(1, sizeof *k);
  if (!k) return FB_ENOMEM;
  k->srv = srv;
  k->owner = owner;
  k->tdir = -1;
  k->fd = memfd_create("fusebox-restore", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (k->fd < 0) {
    free(k);
    fb_errf(err, errlen, "cannot stage the upload: %s", strerror(errno));
    return FB_ENOMEM;
  }
  *out = k;
  return 0;
}

int fbd_ckpt_upload(fbd_ckpt_job *k, uint64_t offset, const void *p, size_t n, uint64_t max,
                    char *err, size_t errlen) {
  if (offset != k->bytes) {
    fb_errf(err, errlen, "Restore: chunk at offset %llu does not continue the upload (%llu "
            "bytes received)", (unsigned long long)offset, (unsigned long long)k->bytes);
    return FB_EINVAL;
  }
  if (max && k->bytes + n > max) {
    char m[32];
    fbd_fmt_bytes(m, sizeof m, max);
    fb_errf(err, errlen, "Restore: the upload passes %s, the most a checkpoint on this server "
            "may take (the session memory limit and its kernels)", m);
    return FB_EQUOTA;
  }
  if (raw_sink(k, p, n)) {
    fb_errf(err, errlen, "Restore: %s", k->why);
    return k->code;
  }
  return 0;
}

/* The checkpoint's seal, owner and prefix: then [off, end) is the engine's
 * stream. The seal's MAC is checked over all but the bulk parts here
 * (fb_seal_check_fd); the restore (fbd_exec_restore,
 * fb_session_restore_sealed) checks the bulk parts' bytes against their
 * SHA-256 in the manifest as it reads them, so a restore reads and hashes
 * the fields once. Both read the same bytes: an upload's memfd is sealed
 * against writes first, and a file under --checkpoint-dir is written by
 * this server only (a new one is renamed in: the open file stays). */
static int check_sealed(fbd_ckpt_job *k, char *err, size_t errlen) {
  uint64_t payload = 0;
  char why[512];
  int rc = fb_seal_check_fd(k->fd, k->srv->ckpt->key, k->srv->ckpt->keylen,
                             fbd_ckpt_owner(k->owner), &payload, why, sizeof why);
  if (rc) {
    fb_errf(err, errlen, "Restore: %s", why);
    return rc;
  }
  uint8_t tail[8];
  uint32_t ns = 0;
  if (payload < 8 || pread(k->fd, tail, 8, (off_t)(payload - 8)) != 8 ||
      memcmp(tail + 4, SUFFIX_MAGIC, 4) || (memcpy(&ns, tail, 4), ns > FBD_CKPT_STATE_MAX) ||
      8 + (uint64_t)ns > payload) {
    fb_errf(err, errlen, "Restore: the checkpoint was not written by fuseboxd");
    return FB_EINVAL;
  }
  k->nstate = ns;
  k->state = malloc(ns ? ns : 1);
  if (!k->state || (ns && pread(k->fd, k->state, ns, (off_t)(payload - 8 - ns)) != (ssize_t)ns)) {
    fb_errf(err, errlen, "Restore: cannot read the checkpoint");
    return FB_EIO;
  }
  k->off = 0;
  k->end = payload - 8 - ns;
  return 0;
}

int fbd_ckpt_upload_end(fbd_ckpt_job *k, char *err, size_t errlen) {
  if (fcntl(k->fd, F_ADD_SEALS, F_SEAL_WRITE | F_SEAL_GROW | F_SEAL_SHRINK | F_SEAL_SEAL)) {
    fb_errf(err, errlen, "Restore: cannot seal the upload: %s", strerror(errno));
    return FB_EIO;
  }
  return check_sealed(k, err, errlen);
}

int fbd_ckpt_open(fbd_server *srv, const struct fbd_tenant *owner, const char *name, int check,
                  fbd_ckpt_job **out, char *err, size_t errlen) {
  *out = NULL;
  if (!fbd_ckpt_dir_enabled(srv)) {
    fb_errf(err, errlen, "this server keeps no checkpoints (fuseboxd --checkpoint-dir)");
    return FB_EUNSUPPORTED;
  }
  if (!fbd_ckpt_name_ok(name)) {
    fb_errf(err, errlen, "'%.64s' is not a checkpoint name this server gave (like "
            "0123abcd-1700000000000001.fbck)", name);
    return FB_EINVAL;
  }
  int tdir = tenant_dirfd(srv, owner, 0, err, errlen);
  if (tdir < 0) return FB_ENOENT;
  int fd = openat(tdir, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  close(tdir);
  struct stat st;
  if (fd < 0 || fstat(fd, &st) || !S_ISREG(st.st_mode)) {
    if (fd >= 0) close(fd);
    fb_errf(err, errlen, "no checkpoint '%s' of yours on this server", name);
    return FB_ENOENT;
  }
  fbd_ckpt_job *k = calloc(1, sizeof *k);
  if (!k) {
    close(fd);
    return FB_ENOMEM;
  }
  k->srv = srv;
  k->owner = owner;
  k->fd = fd;
  k->tdir = -1;
  k->bytes = (uint64_t)st.st_size;
  snprintf(k->name, sizeof k->name, "%s", name);
  int rc = check ? check_sealed(k, err, errlen) : 0;
  if (rc) {
    fbd_ckpt_end(k);
    return rc;
  }
  *out = k;
  return 0;
}

int fbd_ckpt_fd(const fbd_ckpt_job *k) { return k->fd; }
void fbd_ckpt_set_map(fbd_ckpt_job *k, uint8_t *p) { k->map = p; }

/* The engine stream of a checked checkpoint: an fb_source_fn. */
long fbd_ckpt_source(void *user, void *buf, size_t n) {
  fbd_ckpt_job *k = user;
  if (k->off >= k->end) return 0;
  if (n > k->end - k->off) n = (size_t)(k->end - k->off);
  if (n > ((size_t)1 << 30)) n = (size_t)1 << 30;
  ssize_t r;
  do r = pread(k->fd, buf, n, (off_t)k->off);
  while (r < 0 && errno == EINTR);
  if (r <= 0) return -1;
  k->off += (uint64_t)r;
  return (long)r;
}

uint64_t fbd_ckpt_stream_bytes(const fbd_ckpt_job *k) { return k->end - k->off; }

/* ---------------------------------------------------------------- listing */

int fbd_ckpt_list(fbd_server *srv, const struct fbd_tenant *owner, fbp_arena *a,
                  Fusebox__V1__CheckpointList *out, char *err, size_t errlen) {
  if (!fbd_ckpt_dir_enabled(srv)) {
    fb_errf(err, errlen, "this server keeps no checkpoints (fuseboxd --checkpoint-dir)");
    return FB_EUNSUPPORTED;
  }
  char d[160];
  tenant_dir(owner, d, sizeof d);
  int tdir = openat(srv->ckpt->dirfd, d, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (tdir < 0) return 0; /* none yet */
  DIR *dir = fdopendir(tdir);
  if (!dir) {
    close(tdir);
    return 0;
  }
  size_t cap = 0;
  struct timespec now;
  clock_gettime(CLOCK_REALTIME, &now);
  for (struct dirent *e; (e = readdir(dir));) {
    struct stat st;
    if (!fbd_ckpt_name_ok(e->d_name) ||
        fstatat(dirfd(dir), e->d_name, &st, AT_SYMLINK_NOFOLLOW) || !S_ISREG(st.st_mode))
      continue;
    if (out->n_checkpoints == cap) {
      size_t nc = cap ? cap * 2 : 16;
      Fusebox__V1__CheckpointEntry **v = fbp_alloc(a, sizeof *v * nc);
      if (!v) break;
      if (cap) memcpy(v, out->checkpoints, sizeof *v * cap);
      out->checkpoints = v;
      cap = nc;
    }
    Fusebox__V1__CheckpointEntry *c = fbp_alloc(a, sizeof *c);
    char *name = fbp_alloc(a, strlen(e->d_name) + 1);
    if (!c || !name) break;
    fusebox__v1__checkpoint_entry__init(c);
    strcpy(name, e->d_name);
    c->name = name;
    c->bytes = (uint64_t)st.st_size;
    c->age_s = (double)(now.tv_sec - st.st_mtim.tv_sec) + (now.tv_nsec - st.st_mtim.tv_nsec) * 1e-9;
    out->checkpoints[out->n_checkpoints++] = c;
  }
  closedir(dir);
  /* newest first */
  for (size_t i = 1; i < out->n_checkpoints; i++)
    for (size_t j = i; j > 0 && out->checkpoints[j]->age_s < out->checkpoints[j - 1]->age_s; j--) {
      Fusebox__V1__CheckpointEntry *t = out->checkpoints[j];
      out->checkpoints[j] = out->checkpoints[j - 1];
      out->checkpoints[j - 1] = t;
    }
  return 0;
}
