/* Checkpoint and restore of a session (include/fusebox/engine.h; the
 * format, part by part, is in docs/checkpoint.md).
 *
 * Writing: the session is brought to a quiet point (async: everything
 * pending flushed and run, its errors left for the next report), then the
 * parts go to the sink one after another, each hashed (SHA-256) as it
 * goes; fields and the block pool straight from device memory in chunks,
 * never gathered whole. The manifest at the end lists every part's kind,
 * length and hash.
 *
 * Reading: every length and count is checked against the bounds below and
 * against what the stream has said so far before it is used; the layout
 * and kernels go through the public constructors (fb_layout_add,
 * fb_layout_finalize, fb_session_add_kernel with its verifier and budgets),
 * so a hostile stream meets the checks a hostile client does. The sparse
 * structure's pointers (pointer and dynamic slots hold block addresses)
 * are moved from the old pool's address to the new one's after each is
 * checked to name a block inside the pool. Hashes are compared at the
 * manifest; any failure destroys the half-made session. */
#include <openssl/evp.h>

#include "engine/ckpt_io.h"
#include "engine/internal.h"

enum {
  PART_SESSION = 1,
  PART_LAYOUT = 2,
  PART_KERNELS = 3,
  PART_AD = 4,
  PART_ROOT = FBK_PART_ROOT,
  PART_SPARSE = 6,
  PART_POOL = FBK_PART_POOL,
  PART_MANIFEST = FBK_PART_MANIFEST
};
#define MAX_PARTS FBK_MAX_PARTS
#define HEADER_BYTES FBK_HEADER_BYTES
#define PART_HEAD FBK_PART_HEAD
#define SESSION_BYTES 64
#define MAX_LAYOUT_PART (64u << 20)
#define MAX_KERNELS_PART ((uint64_t)1 << 31)
#define MAX_KERNELS (1 << 20)
#define MAX_NAME 4096
#define CHUNK ((size_t)4 << 20) /* bytes of field storage per write */
#define ALLOC_FIELDS 4           /* u64 per allocator: free_head, pending, live, changes */
#define LIST_FIELDS 2            /* u64 per list: cap, gen (lists are made again before use) */

static const char *part_name(uint32_t kind) {
  switch (kind) {
  case PART_SESSION: return "session";
  case PART_LAYOUT: return "layout";
  case PART_KERNELS: return "kernels";
  case PART_AD: return "autodiff";
  case PART_ROOT: return "fields";
  case PART_SPARSE: return "sparse allocators";
  case PART_POOL: return "sparse block pool";
  case PART_MANIFEST: return "manifest";
  default: return "unknown";
  }
}

typedef struct part_ent {
  uint32_t kind;
  uint64_t len;
  uint8_t sha[32];
} part_ent;

/* ---------------------------------------------------------------- a growable byte buffer */

typedef struct bbuf {
  uint8_t *p;
  size_t n, cap;
  int oom;
} bbuf;

static void bb_put(bbuf *b, const void *src, size_t n) {
  if (b->oom || !n) return;
  if (b->n + n > b->cap) {
    size_t c = b->cap ? b->cap : 4096;
    while (c < b->n + n) c *= 2;
    uint8_t *q = realloc(b->p, c);
    if (!q) {
      b->oom = 1;
      return;
    }
    b->p = q;
    b->cap = c;
  }
  memcpy(b->p + b->n, src, n);
  b->n += n;
}
static void bb_u32(bbuf *b, uint32_t v) {
  uint8_t t[4];
  fbk_put32(t, v);
  bb_put(b, t, 4);
}
static void bb_u64(bbuf *b, uint64_t v) {
  uint8_t t[8];
  fbk_put64(t, v);
  bb_put(b, t, 8);
}
static void bb_str(bbuf *b, const char *s) {
  size_t n = s ? strlen(s) : 0;
  bb_u32(b, (uint32_t)n);
  bb_put(b, s, n);
}

/* ---------------------------------------------------------------- the writer */

/* A thread that hashes a large chunk while the caller's thread gives the
 * same chunk to the sink (which, sealed, computes the HMAC over it and
 * writes it): the two SHA-256 passes run side by side. */
typedef struct hasher {
  pthread_t t;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  EVP_MD_CTX *md;
  const void *p;
  size_t n;
  int busy, stop, ok, started;
} hasher;

static void *hasher_main(void *arg) {
  hasher *h = arg;
  pthread_mutex_lock(&h->mu);
  for (;;) {
    while (!h->busy && !h->stop) pthread_cond_wait(&h->cv, &h->mu);
    if (!h->busy) break;
    const void *p = h->p;
    size_t n = h->n;
    pthread_mutex_unlock(&h->mu);
    int ok = EVP_DigestUpdate(h->md, p, n);
    pthread_mutex_lock(&h->mu);
    h->ok = ok;
    h->busy = 0;
    pthread_cond_broadcast(&h->cv);
  }
  pthread_mutex_unlock(&h->mu);
  return NULL;
}

static void hasher_stop(hasher *h) {
  if (!h->started) return;
  pthread_mutex_lock(&h->mu);
  h->stop = 1;
  pthread_cond_broadcast(&h->cv);
  pthread_mutex_unlock(&h->mu);
  pthread_join(h->t, NULL);
  pthread_cond_destroy(&h->cv);
  pthread_mutex_destroy(&h->mu);
  h->started = 0;
}

#define PAR_MIN ((size_t)1 << 20) /* chunks hashed beside the sink */

typedef struct wr {
  fb_sink_fn sink;
  void *user;
  int failed;
  EVP_MD_CTX *md;
  hasher h;
  part_ent parts[MAX_PARTS];
  int nparts;
  uint64_t left; /* bytes of the open part still to come */
} wr;

static void w_raw(wr *w, const void *p, size_t n) {
  if (!w->failed && n && w->sink(w->user, p, n)) w->failed = 1;
}

static void w_begin(wr *w, uint32_t kind, uint64_t len) {
  uint8_t h[PART_HEAD];
  fbk_put32(h, kind);
  fbk_put32(h + 4, 0);
  fbk_put64(h + 8, len);
  w_raw(w, h, sizeof h);
  part_ent *e = &w->parts[w->nparts];
  e->kind = kind;
  e->len = len;
  w->left = len;
  if (!EVP_DigestInit_ex(w->md, EVP_sha256(), NULL)) w->failed = 1;
}

static void w_data(wr *w, const void *p, size_t n) {
  if (w->failed) return;
  if (n > w->left) {
    w->failed = 1;
    return;
  }
  w->left -= n;
  hasher *h = &w->h;
  if (n >= PAR_MIN && !h->started) {
    pthread_mutex_init(&h->mu, NULL);
    pthread_cond_init(&h->cv, NULL);
    h->busy = h->stop = 0;
    if (pthread_create(&h->t, NULL, hasher_main, h) == 0) h->started = 1;
    else pthread_cond_destroy(&h->cv), pthread_mutex_destroy(&h->mu);
  }
  if (n < PAR_MIN || !h->started) {
    if (!EVP_DigestUpdate(w->md, p, n)) w->failed = 1;
    w_raw(w, p, n);
    return;
  }
  pthread_mutex_lock(&h->mu);
  h->md = w->md;
  h->p = p;
  h->n = n;
  h->busy = 1;
  pthread_cond_broadcast(&h->cv);
  pthread_mutex_unlock(&h->mu);
  w_raw(w, p, n); /* the sink, meanwhile */
  pthread_mutex_lock(&h->mu);
  while (h->busy) pthread_cond_wait(&h->cv, &h->mu);
  if (!h->ok) w->failed = 1;
  pthread_mutex_unlock(&h->mu);
}

static void w_end(wr *w) {
  unsigned int l = 0;
  if (w->failed) return;
  if (w->left || !EVP_DigestFinal_ex(w->md, w->parts[w->nparts].sha, &l) || l != 32) {
    w->failed = 1;
    return;
  }
  w->nparts++;
}

static void w_part(wr *w, uint32_t kind, const bbuf *b) {
  w_begin(w, kind, b->n);
  w_data(w, b->p, b->n);
  w_end(w);
}

/* Device memory [dev, dev + n) into the open part, in chunks. */
static int w_dev(fb_session *s, wr *w, const uint8_t *dev, uint64_t n, uint8_t *bounce, char *err,
                 size_t errlen) {
  int copies = fb_memsys_copies(s->mem.ms);
  for (uint64_t at = 0; at < n && !w->failed;) {
    size_t k = n - at < CHUNK ? (size_t)(n - at) : CHUNK;
    if (copies) {
      int rc = fb_devmem_get(&s->mem, bounce, dev + at, k, err, errlen);
      if (rc) return rc;
      w_data(w, bounce, k);
    } else {
      w_data(w, dev + at, k);
    }
    at += k;
  }
  return 0;
}

/* ---- the parts */

static void put_session(fb_session *s, bbuf *b) {
  fb_counters c;
  fb_session_counters(s, &c);
  bb_u32(b, s->as ? 1 : 0);
  bb_u32(b, s->cfg_passes);
  bb_u64(b, s->seed);
  bb_u64(b, s->launch_no);
  bb_u64(b, c.launches);
  bb_u32(b, (uint32_t)s->cfg_flush_every);
  bb_u32(b, (uint32_t)s->cfg_max_fuse);
  bb_u32(b, (uint32_t)s->nkernels);
  bb_u32(b, (uint32_t)s->layout->nnodes);
  bb_u64(b, s->layout->root_bytes);
  bb_u64(b, 0); /* reserved */
}

static void put_layout(const fb_layout *l, bbuf *b) {
  bb_u32(b, (uint32_t)l->nnodes);
  bb_u64(b, l->root_bytes);
  for (int i = 1; i < l->nnodes; i++) {
    const fb_snode *n = &l->nodes[i];
    bb_u32(b, (uint32_t)n->kind);
    bb_u32(b, (uint32_t)n->parent);
    bb_u32(b, n->axes);
    bb_u32(b, (uint32_t)n->type);
    for (int a = 0; a < FB_MAX_AXES; a++) bb_u64(b, (uint64_t)n->size[a]);
    bb_u64(b, (uint64_t)n->chunk);
    bb_u64(b, n->offset);
    bb_u64(b, n->cell_bytes);
    bb_str(b, n->name);
  }
}

static void put_kernel(const fb_kernel *k, bbuf *b) {
  bb_str(b, k->name);
  bb_u32(b, (uint32_t)k->nparams);
  for (int i = 0; i < k->nparams; i++) bb_u32(b, (uint32_t)k->params[i]);
  bb_u32(b, (uint32_t)k->ret);
  bb_u32(b, (uint32_t)k->nstmts);
  for (int i = 0; i < k->nstmts; i++) {
    const fb_stmt *st = &k->stmts[i];
    bb_u32(b, st->op | (uint32_t)st->type << 16 | (uint32_t)st->nargs << 24);
    bb_u32(b, (uint32_t)st->snode);
    for (int a = 0; a < FB_MAX_ARGS; a++) bb_u32(b, (uint32_t)st->args[a]);
    bb_u64(b, st->imm.u);
    bb_u32(b, (uint32_t)st->body);
    bb_u32(b, (uint32_t)st->orelse);
    bb_u32(b, (uint32_t)st->part);
  }
  bb_u32(b, (uint32_t)k->nblocks);
  for (int i = 0; i < k->nblocks; i++) {
    bb_u32(b, (uint32_t)k->blocks[i].n);
    for (int j = 0; j < k->blocks[i].n; j++) bb_u32(b, (uint32_t)k->blocks[i].ids[j]);
  }
}

static void put_kernels(fb_session *s, bbuf *b) {
  bb_u32(b, (uint32_t)s->nkernels);
  for (int i = 0; i < s->nkernels; i++) {
    const sess_kernel *sk = &s->kernels[i];
    bb_u32(b, (uint32_t)sk->adj);
    bb_u32(b, (uint32_t)sk->tan);
    bb_u32(b, (uint32_t)(sk->custom | sk->custom_of << 8));
    put_kernel(sk->k, b);
  }
}

static void put_ad(fb_session *s, bbuf *b) {
  int *fill, *seed;
  fbe_ad_tables(s, &fill, &seed, 0);
  bb_u32(b, fill ? 1 : 0);
  for (int i = 0; fill && i < s->layout->nnodes; i++) {
    bb_u32(b, (uint32_t)fill[i]);
    bb_u32(b, (uint32_t)seed[i]);
  }
}

static void put_sparse(const fb_rt_state *st, bbuf *b) {
  bb_u64(b, (uint64_t)(uintptr_t)st->pool);
  bb_u64(b, st->pool_used);
  bb_u64(b, st->nnodes);
  for (uint64_t i = 0; i < st->nnodes; i++) {
    const fb_rt_allocator *a = &st->allocs[i];
    bb_u64(b, a->free_head);
    bb_u64(b, a->pending);
    bb_u64(b, a->live);
    bb_u64(b, a->changes);
  }
  for (uint64_t i = 0; i < st->nnodes; i++) {
    const fb_rt_list *l = &st->lists[i];
    bb_u64(b, l->cap);
    bb_u64(b, l->gen);
  }
}

/* Bring the session to a quiet point: nothing pending, nothing running. */
static int quiet(fb_session *s, char *err, size_t errlen) {
  if (!s->as) return 0;
  int rc = fb_session_drain(s);
  if (rc) fb_errf(err, errlen, "cannot checkpoint: %s", fb_session_errmsg(s));
  return rc;
}

int fb_session_checkpoint(fb_session *s, fb_sink_fn sink, void *user, char *err, size_t errlen) {
  if (!s || !sink) {
    fb_errf(err, errlen, "no session or no sink");
    return FB_EINVAL;
  }
  if (fbe_tape_recording(s)) {
    fb_errf(err, errlen,
            "cannot checkpoint while a tape is being recorded: end the tape first "
            "(tape_end), then checkpoint");
    return FB_EINVAL;
  }
  if (fbe_device_dead(s)) {
    fb_errf(err, errlen, "cannot checkpoint: the session's device failed");
    return FB_EDEVICE;
  }
  int rc = quiet(s, err, errlen);
  if (rc) return rc;
  const fb_rt_state *st = s->sparse ? fb_sparse_state(s->sparse) : NULL;
  if (st && fb_memsys_copies(s->mem.ms)) {
    fb_errf(err, errlen,
            "cannot checkpoint: sparse fields in device memory the host cannot read in place "
            "are not supported yet (use the CPU backend or CUDA managed memory)");
    return FB_EUNSUPPORTED;
  }
  wr w;
  memset(&w, 0, sizeof w);
  w.sink = sink;
  w.user = user;
  w.md = EVP_MD_CTX_new();
  bbuf b = {0};
  uint8_t *bounce = fb_memsys_copies(s->mem.ms) ? malloc(CHUNK) : NULL;
  if (!w.md || (fb_memsys_copies(s->mem.ms) && !bounce)) {
    EVP_MD_CTX_free(w.md);
    free(bounce);
    fb_errf(err, errlen, "out of memory");
    return FB_ENOMEM;
  }
  uint8_t h[HEADER_BYTES];
  memcpy(h, FBK_MAGIC, 8);
  fbk_put32(h + 8, FB_CHECKPOINT_FORMAT);
  fbk_put32(h + 12, HEADER_BYTES);
  fbk_byte_order(h + 16);
  w_raw(&w, h, sizeof h);

  put_session(s, &b);
  w_part(&w, PART_SESSION, &b);
  b.n = 0;
  put_layout(s->layout, &b);
  w_part(&w, PART_LAYOUT, &b);
  b.n = 0;
  put_kernels(s, &b);
  w_part(&w, PART_KERNELS, &b);
  b.n = 0;
  put_ad(s, &b);
  w_part(&w, PART_AD, &b);

  w_begin(&w, PART_ROOT, s->mem.root_bytes);
  rc = w_dev(s, &w, s->mem.root, s->mem.root_bytes, bounce, err, errlen);
  w_end(&w);
  if (!rc && st) {
    b.n = 0;
    put_sparse(st, &b);
    w_part(&w, PART_SPARSE, &b);
    w_begin(&w, PART_POOL, st->pool_used);
    for (uint64_t at = 0; at < st->pool_used; at += CHUNK)
      w_data(&w, st->pool + at,
             st->pool_used - at < CHUNK ? (size_t)(st->pool_used - at) : CHUNK);
    w_end(&w);
  }
  if (!rc && b.oom) {
    fb_errf(err, errlen, "out of memory");
    rc = FB_ENOMEM;
  }
  if (!rc) {
    b.n = 0;
    bb_u32(&b, (uint32_t)w.nparts);
    for (int i = 0; i < w.nparts; i++) {
      bb_u32(&b, w.parts[i].kind);
      bb_u32(&b, 0);
      bb_u64(&b, w.parts[i].len);
      bb_put(&b, w.parts[i].sha, 32);
    }
    uint8_t mh[PART_HEAD];
    fbk_put32(mh, PART_MANIFEST);
    fbk_put32(mh + 4, 0);
    fbk_put64(mh + 8, b.n);
    w_raw(&w, mh, sizeof mh);
    w_raw(&w, b.p, b.n);
    if (b.oom) {
      fb_errf(err, errlen, "out of memory");
      rc = FB_ENOMEM;
    }
  }
  if (!rc && w.failed) {
    fb_errf(err, errlen, "the checkpoint could not be written (the destination refused it)");
    rc = FB_EIO;
  }
  hasher_stop(&w.h);
  EVP_MD_CTX_free(w.md);
  free(b.p);
  free(bounce);
  return rc;
}

/* ---------------------------------------------------------------- the reader */

typedef struct rd {
  fb_source_fn src;
  void *user;
  uint8_t *buf;
  size_t at, n;
  int eof, bad;
  EVP_MD_CTX *md;
  hasher h;
  uint64_t left; /* bytes of the open part still to come */
  part_ent parts[MAX_PARTS];
  int nparts;
  int sealed; /* fb_session_restore_sealed: the seal covered all but the bulk parts */
  int direct; /* reading a bulk part: r_raw reads into the destination */
  char *err;
  size_t errlen;
} rd;

/* What a sealed stream's bulk part that does not check out reads as: the
 * covered bytes passed the seal, so the bulk bytes were changed. */
#define MODIFIED "the checkpoint was modified or was written with another server key"


static int rfail(rd *r, int code, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
static int rfail(rd *r, int code, const char *fmt, ...) {
  if (r->bad) return r->bad;
  va_list ap;
  va_start(ap, fmt);
  fb_verrf(r->err, r->errlen, fmt, ap);
  va_end(ap);
  return r->bad = code;
}

/* Exactly n bytes from the source (to dst, or skipped when dst is NULL). */
static int r_raw(rd *r, void *dst, size_t n) {
  uint8_t *d = dst;
  while (n && !r->bad) {
    if (r->at == r->n) {
      if (r->eof) return rfail(r, FB_EINVAL, "the checkpoint is truncated");
      /* a large read, or any read of a bulk part once the buffer is empty,
         goes straight to its destination (a bulk part's chunks then start
         where the source's reads do, and no byte of it is copied twice) */
      if (d && (n >= CHUNK / 2 || r->direct)) {
        long got = r->src(r->user, d, n);
        if (got < 0) return rfail(r, FB_EIO, "cannot read the checkpoint");
        if (got == 0) {
          r->eof = 1;
          continue;
        }
        if ((size_t)got > n) return rfail(r, FB_EIO, "cannot read the checkpoint");
        d += got;
        n -= (size_t)got;
        continue;
      }
      long got = r->src(r->user, r->buf, CHUNK);
      if (got < 0) return rfail(r, FB_EIO, "cannot read the checkpoint");
      if ((size_t)got > CHUNK) return rfail(r, FB_EIO, "cannot read the checkpoint");
      r->at = 0;
      r->n = (size_t)got;
      if (!got) r->eof = 1;
      continue;
    }
    size_t k = r->n - r->at < n ? r->n - r->at : n;
    if (d) {
      memcpy(d, r->buf + r->at, k);
      d += k;
    }
    r->at += k;
    n -= k;
  }
  return r->bad;
}

/* Part bytes: counted against the open part and hashed. */
static int r_data(rd *r, void *dst, size_t n) {
  if (r->bad) return r->bad;
  if (n > r->left) return rfail(r, FB_EINVAL, "the checkpoint is damaged (a part ends early)");
  if (r_raw(r, dst, n)) return r->bad;
  r->left -= n;
  if (!EVP_DigestUpdate(r->md, dst, n)) return rfail(r, FB_EIO, "SHA-256 failed (OpenSSL)");
  return 0;
}

static int r_begin(rd *r, uint32_t want, uint64_t max) {
  uint8_t h[PART_HEAD];
  if (r_raw(r, h, sizeof h)) return r->bad;
  uint32_t kind = fbk_get32(h);
  uint64_t len = fbk_get64(h + 8);
  if (kind != want || fbk_get32(h + 4) != 0)
    return rfail(r, FB_EINVAL, "the checkpoint is damaged (expected its %s part, found part %u)",
                 part_name(want), kind);
  if (len > max)
    return rfail(r, FB_EINVAL,
                 "the checkpoint is damaged (its %s part says %llu bytes, at most %llu fit)",
                 part_name(want), (unsigned long long)len, (unsigned long long)max);
  if (r->nparts == MAX_PARTS) return rfail(r, FB_EINVAL, "the checkpoint has too many parts");
  r->parts[r->nparts].kind = kind;
  r->parts[r->nparts].len = len;
  r->left = len;
  if (!EVP_DigestInit_ex(r->md, EVP_sha256(), NULL))
    return rfail(r, FB_EIO, "SHA-256 failed (OpenSSL)");
  return 0;
}

static int r_end(rd *r) {
  if (r->bad) return r->bad;
  if (r->left)
    return rfail(r, FB_EINVAL, "the checkpoint is damaged (its %s part has %llu bytes too many)",
                 part_name(r->parts[r->nparts].kind), (unsigned long long)r->left);
  unsigned int l = 0;
  if (!EVP_DigestFinal_ex(r->md, r->parts[r->nparts].sha, &l) || l != 32)
    return rfail(r, FB_EIO, "SHA-256 failed (OpenSSL)");
  r->nparts++;
  return 0;
}

/* A whole small part into memory (freed by the caller). */
static uint8_t *r_part(rd *r, uint32_t kind, uint64_t max, size_t *len) {
  if (r_begin(r, kind, max)) return NULL;
  size_t n = (size_t)r->left;
  uint8_t *p = malloc(n ? n : 1);
  if (!p) {
    rfail(r, FB_ENOMEM, "out of memory (the checkpoint's %s part has %zu bytes)", part_name(kind),
          n);
    return NULL;
  }
  if (r_data(r, p, n) || r_end(r)) {
    free(p);
    return NULL;
  }
  *len = n;
  return p;
}

/* A cursor over a part in memory: reads past its end set bad. */
typedef struct cur {
  const uint8_t *p;
  size_t n, at;
  int bad;
} cur;

static uint32_t c_u32(cur *c) {
  if (c->bad || c->n - c->at < 4) return c->bad = 1, 0;
  uint32_t v = fbk_get32(c->p + c->at);
  c->at += 4;
  return v;
}
static uint64_t c_u64(cur *c) {
  if (c->bad || c->n - c->at < 8) return c->bad = 1, 0;
  uint64_t v = fbk_get64(c->p + c->at);
  c->at += 8;
  return v;
}
/* A string of at most MAX_NAME bytes, NUL-free (malloc'd), or NULL for "". */
static char *c_str(cur *c, int *oom) {
  uint32_t n = c_u32(c);
  if (c->bad) return NULL;
  if (n > MAX_NAME || c->n - c->at < n || memchr(c->p + c->at, 0, n)) return c->bad = 1, NULL;
  if (!n) return NULL;
  char *s = malloc(n + 1);
  if (!s) {
    *oom = 1;
    return NULL;
  }
  memcpy(s, c->p + c->at, n);
  s[n] = 0;
  c->at += n;
  return s;
}

typedef struct sess_hdr {
  uint32_t mode, passes;
  uint64_t seed, launch_no, launches;
  int32_t flush_every, max_fuse;
  uint32_t nkernels, nnodes;
  uint64_t root_bytes;
} sess_hdr;

static int get_session(rd *r, sess_hdr *h) {
  size_t n = 0;
  uint8_t *p = r_part(r, PART_SESSION, SESSION_BYTES, &n);
  if (!p) return r->bad;
  cur c = {p, n, 0, 0};
  h->mode = c_u32(&c);
  h->passes = c_u32(&c);
  h->seed = c_u64(&c);
  h->launch_no = c_u64(&c);
  h->launches = c_u64(&c);
  h->flush_every = (int32_t)c_u32(&c);
  h->max_fuse = (int32_t)c_u32(&c);
  h->nkernels = c_u32(&c);
  h->nnodes = c_u32(&c);
  h->root_bytes = c_u64(&c);
  uint64_t reserved = c_u64(&c);
  free(p);
  if (c.bad || c.at != n || h->mode > 1 || reserved || h->nkernels > MAX_KERNELS ||
      h->nnodes > FB_LAYOUT_MAX_NODES || h->nnodes < 1)
    return rfail(r, FB_EINVAL, "the checkpoint is damaged (its session part is malformed)");
  return 0;
}

static int get_layout(rd *r, const sess_hdr *h, fb_layout **out) {
  size_t n = 0;
  uint8_t *p = r_part(r, PART_LAYOUT, MAX_LAYOUT_PART, &n);
  if (!p) return r->bad;
  cur c = {p, n, 0, 0};
  fb_layout *l = fb_layout_new();
  int oom = !l, rc = 0;
  uint32_t nn = c_u32(&c);
  uint64_t root_bytes = c_u64(&c);
  if (nn != h->nnodes || root_bytes != h->root_bytes) c.bad = 1;
  /* h->nnodes is bounded (FB_LAYOUT_MAX_NODES): allocate by it only */
  uint64_t *offs = c.bad ? NULL : calloc(h->nnodes, sizeof *offs * 2);
  if (!offs && !c.bad) oom = 1;
  for (uint32_t i = 1; i < nn && !c.bad && !oom && !rc; i++) {
    uint32_t kind = c_u32(&c), parent = c_u32(&c), axes = c_u32(&c), type = c_u32(&c);
    int64_t size[FB_MAX_AXES];
    for (int a = 0; a < FB_MAX_AXES; a++) size[a] = (int64_t)c_u64(&c);
    int64_t chunk = (int64_t)c_u64(&c);
    offs[2 * i] = c_u64(&c);
    offs[2 * i + 1] = c_u64(&c);
    char *name = c_str(&c, &oom);
    if (c.bad || oom || parent >= i) {
      c.bad = 1;
      free(name);
      break;
    }
    int id;
    if (kind == FB_SN_PLACE) {
      id = fb_layout_place(l, (int)parent, name, (fb_type)type);
    } else {
      char ax[FB_MAX_AXES + 1];
      int64_t sz[FB_MAX_AXES];
      int na = 0;
      for (int a = 0; a < FB_MAX_AXES; a++)
        if (axes & (1u << a)) {
          ax[na] = "ijkl"[a];
          sz[na++] = size[a];
        }
      ax[na] = 0;
      id = axes >> FB_MAX_AXES || kind > FB_SN_PLACE ? FB_EINVAL
                                                      : fb_layout_add(l, (int)parent, kind, ax, sz,
                                                                      chunk, name);
    }
    free(name);
    if (id == FB_ENOMEM) oom = 1;
    else if (id != (int)i) c.bad = 1;
  }
  free(p);
  char msg[512];
  if (!c.bad && !oom && c.at == n) rc = fb_layout_finalize(l, msg, sizeof msg);
  else rc = oom ? FB_ENOMEM : FB_EINVAL;
  if (!rc && l->root_bytes != root_bytes) rc = FB_EINVAL;
  for (uint32_t i = 1; !rc && i < nn; i++)
    if (l->nodes[i].offset != offs[2 * i] || l->nodes[i].cell_bytes != offs[2 * i + 1])
      rc = FB_EINVAL;
  free(offs);
  if (rc) {
    fb_layout_free(l);
    return rc == FB_ENOMEM ? rfail(r, rc, "out of memory (the checkpoint's layout)")
                           : rfail(r, FB_EINVAL, "the checkpoint is damaged (its layout is "
                                                 "malformed)");
  }
  *out = l;
  return 0;
}

static fb_kernel *get_kernel(cur *c, const fb_layout *l, int *oom) {
  char *name = c_str(c, oom);
  uint32_t np = c_u32(c);
  if (c->bad || !name || np > 4096) {
    free(name);
    c->bad = 1;
    return NULL;
  }
  fb_type params[4096];
  for (uint32_t i = 0; i < np; i++) {
    uint32_t t = c_u32(c);
    params[i] = t < FB_T__COUNT ? (fb_type)t : FB_T_VOID;
    if (t >= FB_T__COUNT) c->bad = 1;
  }
  uint32_t ret = c_u32(c);
  if (c->bad || ret >= FB_T__COUNT) {
    free(name);
    c->bad = 1;
    return NULL;
  }
  fb_kernel *k = fb_kernel_new(l, name, (int)np, params, (fb_type)ret);
  free(name);
  if (!k) {
    *oom = 1;
    return NULL;
  }
  uint32_t ns = c_u32(c);
  /* each statement takes 52 bytes of the part: a count past what is left is a lie */
  if (c->bad || ns > (c->n - c->at) / 52 || ns > INT32_MAX / 2) {
    c->bad = 1;
    fb_kernel_free(k);
    return NULL;
  }
  fb_stmt *st = calloc(ns ? ns : 1, sizeof *st);
  if (!st) {
    *oom = 1;
    fb_kernel_free(k);
    return NULL;
  }
  for (uint32_t i = 0; i < ns; i++) {
    uint32_t w = c_u32(c);
    st[i].op = (uint16_t)w;
    st[i].type = (uint8_t)(w >> 16);
    st[i].nargs = (uint8_t)(w >> 24);
    st[i].snode = (int32_t)c_u32(c);
    for (int a = 0; a < FB_MAX_ARGS; a++) st[i].args[a] = (int32_t)c_u32(c);
    st[i].imm.u = c_u64(c);
    st[i].body = (int32_t)c_u32(c);
    st[i].orelse = (int32_t)c_u32(c);
    st[i].part = (int32_t)c_u32(c);
  }
  free(k->stmts);
  k->stmts = st;
  k->nstmts = k->cap = (int32_t)ns;
  uint32_t nb = c_u32(c);
  if (c->bad || nb < 1 || nb > (c->n - c->at) / 4) {
    c->bad = 1;
    fb_kernel_free(k);
    return NULL;
  }
  fb_block *bl = calloc(nb, sizeof *bl);
  if (!bl) {
    *oom = 1;
    fb_kernel_free(k);
    return NULL;
  }
  for (int i = 0; i < k->nblocks; i++) free(k->blocks[i].ids);
  free(k->blocks);
  k->blocks = bl;
  k->nblocks = k->bcap = (int32_t)nb;
  for (uint32_t i = 0; i < nb && !c->bad; i++) {
    uint32_t n = c_u32(c);
    if (c->bad || n > (c->n - c->at) / 4) {
      c->bad = 1;
      break;
    }
    if (!(bl[i].ids = malloc(sizeof(int32_t) * (n ? n : 1)))) {
      *oom = 1;
      break;
    }
    bl[i].n = bl[i].cap = (int32_t)n;
    for (uint32_t j = 0; j < n; j++) bl[i].ids[j] = (int32_t)c_u32(c);
  }
  if (c->bad || *oom) {
    fb_kernel_free(k);
    return NULL;
  }
  return k;
}

static int get_kernels(rd *r, fb_session *s, const sess_hdr *h) {
  size_t n = 0;
  uint8_t *p = r_part(r, PART_KERNELS, MAX_KERNELS_PART, &n);
  if (!p) return r->bad;
  cur c = {p, n, 0, 0};
  int oom = 0;
  uint32_t nk = c_u32(&c);
  if (nk != h->nkernels || nk > (n - c.at) / 8) c.bad = 1; /* bounded before it sizes anything */
  uint32_t *links = c.bad ? NULL : calloc(nk ? nk : 1, sizeof *links * 3);
  if (!links && !c.bad) oom = 1;
  for (uint32_t i = 0; i < nk && !c.bad && !oom && !r->bad; i++) {
    links[3 * i] = c_u32(&c);
    links[3 * i + 1] = c_u32(&c);
    links[3 * i + 2] = c_u32(&c);
    fb_kernel *k = get_kernel(&c, s->layout, &oom);
    if (!k) break;
    int id = fb_session_add_kernel(s, k);
    if (id >= 0 && id != (int)i) id = FB_EINVAL;
    if (id < 0)
      rfail(r, id, "the checkpoint's kernel '%s' (id %u) cannot be registered here: %s", k->name,
            i, fb_session_errmsg(s));
    fb_kernel_free(k);
  }
  free(p);
  for (uint32_t i = 0; !c.bad && !oom && !r->bad && i < nk; i++) {
    uint32_t adj = links[3 * i], tan = links[3 * i + 1], fl = links[3 * i + 2];
    if (adj > nk || tan > nk || (fl & ~0x101u)) {
      c.bad = 1;
      break;
    }
    s->kernels[i].adj = (int)adj;
    s->kernels[i].tan = (int)tan;
    s->kernels[i].custom = (uint8_t)(fl & 1);
    s->kernels[i].custom_of = (uint8_t)(fl >> 8);
  }
  free(links);
  if (r->bad) return r->bad;
  if (oom) return rfail(r, FB_ENOMEM, "out of memory (the checkpoint's kernels)");
  if (c.bad || c.at != n)
    return rfail(r, FB_EINVAL, "the checkpoint is damaged (its kernels part is malformed)");
  return 0;
}

static int get_ad(rd *r, fb_session *s) {
  size_t n = 0;
  uint8_t *p = r_part(r, PART_AD, (uint64_t)4 + 8ull * FB_LAYOUT_MAX_NODES, &n);
  if (!p) return r->bad;
  cur c = {p, n, 0, 0};
  uint32_t present = c_u32(&c);
  int *fill = NULL, *seed = NULL;
  if (present == 1 && fbe_ad_tables(s, &fill, &seed, 1)) {
    free(p);
    return rfail(r, FB_ENOMEM, "out of memory");
  }
  for (int i = 0; present == 1 && i < s->layout->nnodes; i++) {
    uint32_t f = c_u32(&c), sd = c_u32(&c);
    if (f > (uint32_t)s->nkernels || sd > (uint32_t)s->nkernels) c.bad = 1;
    else fill[i] = (int)f, seed[i] = (int)sd;
  }
  free(p);
  if (c.bad || present > 1 || c.at != n)
    return rfail(r, FB_EINVAL, "the checkpoint is damaged (its autodiff part is malformed)");
  return 0;
}

/* The hash of the chunk before, when one is being computed beside. */
static void r_hash_wait(rd *r) {
  hasher *h = &r->h;
  if (!h->started) return;
  pthread_mutex_lock(&h->mu);
  while (h->busy) pthread_cond_wait(&h->cv, &h->mu);
  int ok = h->ok;
  h->ok = 1;
  pthread_mutex_unlock(&h->mu);
  if (!ok) rfail(r, FB_EIO, "SHA-256 failed (OpenSSL)");
}

/* r_data for a large chunk of host-readable memory: the chunk is hashed
 * on the hasher thread while the next one is read (r_hash_wait before the
 * part ends). */
static int r_data_par(rd *r, void *dst, size_t n) {
  hasher *h = &r->h;
  if (n >= PAR_MIN && !h->started) {
    pthread_mutex_init(&h->mu, NULL);
    pthread_cond_init(&h->cv, NULL);
    h->busy = h->stop = 0;
    h->ok = 1;
    if (pthread_create(&h->t, NULL, hasher_main, h) == 0) h->started = 1;
    else pthread_cond_destroy(&h->cv), pthread_mutex_destroy(&h->mu);
  }
  if (n < PAR_MIN || !h->started) {
    r_hash_wait(r);
    return r_data(r, dst, n);
  }
  if (r->bad) return r->bad;
  if (n > r->left) return rfail(r, FB_EINVAL, "the checkpoint is damaged (a part ends early)");
  r->direct = 1;
  r_raw(r, dst, n);
  r->direct = 0;
  if (r->bad) return r->bad;
  r->left -= n;
  r_hash_wait(r);
  pthread_mutex_lock(&h->mu);
  h->md = r->md;
  h->p = dst;
  h->n = n;
  h->busy = 1;
  pthread_cond_broadcast(&h->cv);
  pthread_mutex_unlock(&h->mu);
  return 0;
}

/* Part bytes into device memory [dev, dev + n), in chunks. */
static int r_dev(rd *r, fb_session *s, uint8_t *dev, uint64_t n, uint8_t *bounce) {
  int copies = fb_memsys_copies(s->mem.ms);
  for (uint64_t at = 0; at < n && !r->bad;) {
    size_t k = n - at < CHUNK ? (size_t)(n - at) : CHUNK;
    if (copies) {
      r->direct = 1;
      int bad = r_data(r, bounce, k);
      r->direct = 0;
      if (!bad) {
        char msg[512];
        int rc = fb_devmem_put(&s->mem, dev + at, bounce, k, msg, sizeof msg);
        if (rc) return rfail(r, rc, "%s", msg);
      }
    } else {
      r_data_par(r, dev + at, k);
    }
    at += k;
  }
  r_hash_wait(r);
  return r->bad;
}

/* ---- the sparse structure */

typedef struct reloc {
  const fb_layout *l;
  uint8_t *pool;
  uint64_t old_pool, used;
  const uint64_t *stride; /* per SNode: pool bytes per block (0: allocates none) */
  const uint8_t *alloc_below; /* per SNode: an allocating SNode at or below it */
  int bad;
} reloc;

/* A slot's block address, moved to the new pool; 0 stays 0. The block it
 * names must lie whole inside the pool's used bytes, 16-aligned. */
static uint8_t *move_slot(reloc *x, uint64_t *slot, int snode) {
  uint64_t v = *slot;
  if (!v) return NULL;
  uint64_t off = v - x->old_pool, sz = x->stride[snode];
  if (v < x->old_pool || off < 16 || off % 16 || !sz || off - 16 > x->used ||
      x->used - (off - 16) < sz) {
    x->bad = 1;
    return NULL;
  }
  *slot = (uint64_t)(uintptr_t)(x->pool + off);
  return x->pool + off;
}

static void reloc_cell(reloc *x, int snode, uint8_t *cell);

/* The node of container ch inside a cell, at node. */
static void reloc_node(reloc *x, const fb_snode *ch, uint8_t *node) {
  if (x->bad || !x->alloc_below[ch->id]) return;
  switch (ch->kind) {
  case FB_SN_DENSE:
    for (int64_t i = 0; i < ch->ncells && !x->bad; i++)
      reloc_cell(x, ch->id, node + (uint64_t)i * ch->cell_bytes);
    break;
  case FB_SN_BITMASKED: {
    uint8_t *cells = node + fb_cg_mask_bytes(ch);
    for (int64_t i = 0; i < ch->ncells && !x->bad; i++)
      reloc_cell(x, ch->id, cells + (uint64_t)i * ch->cell_bytes);
    break;
  }
  case FB_SN_POINTER:
    for (int64_t i = 0; i < ch->ncells && !x->bad; i++) {
      uint8_t *b = move_slot(x, (uint64_t *)node + i, ch->id);
      if (b) reloc_cell(x, ch->id, b);
    }
    break;
  case FB_SN_DYNAMIC: {
    int64_t nch = (ch->ncells + ch->chunk - 1) / ch->chunk;
    for (int64_t i = 0; i < nch && !x->bad; i++) move_slot(x, (uint64_t *)(node + 8) + i, ch->id);
    break;
  }
  default: break;
  }
}

static void reloc_cell(reloc *x, int snode, uint8_t *cell) {
  const fb_snode *n = &x->l->nodes[snode];
  for (int k = 0; k < n->nchildren && !x->bad; k++) {
    const fb_snode *ch = &x->l->nodes[n->children[k]];
    if (ch->kind != FB_SN_PLACE) reloc_node(x, ch, cell + ch->offset);
  }
}

static int get_sparse(rd *r, fb_session *s) {
  fb_sparse *sp = s->sparse;
  fb_rt_state *st = fb_sparse_state(sp);
  const fb_layout *l = s->layout;
  uint64_t nn = (uint64_t)l->nnodes;
  if (fb_memsys_copies(s->mem.ms))
    return rfail(r, FB_EUNSUPPORTED,
                 "cannot restore sparse fields into device memory the host cannot read in place "
                 "(use the CPU backend or CUDA managed memory)");
  size_t n = 0;
  uint8_t *p = r_part(r, PART_SPARSE, 24 + nn * 8 * (ALLOC_FIELDS + LIST_FIELDS), &n);
  if (!p) return r->bad;
  cur c = {p, n, 0, 0};
  uint64_t old_pool = c_u64(&c), used = c_u64(&c), nodes = c_u64(&c);
  if (nodes != nn || n != 24 + nn * 8 * (ALLOC_FIELDS + LIST_FIELDS)) c.bad = 1;
  uint64_t *stride = calloc(nn, sizeof *stride);
  uint8_t *below = calloc(nn, 1);
  uint64_t *lists = calloc(nn * LIST_FIELDS, sizeof *lists);
  int rc = 0;
  if (!stride || !below || !lists) rc = rfail(r, FB_ENOMEM, "out of memory");
  for (uint64_t i = 0; !rc && !c.bad && i < nn; i++) {
    fb_rt_allocator *a = &st->allocs[i];
    uint64_t fh = c_u64(&c), pend = c_u64(&c), live = c_u64(&c), ch = c_u64(&c);
    stride[i] = a->block_bytes ? a->stride : 0;
    /* list heads are handles (pool offsets / 8) with a tag above bit 40 */
    uint64_t hm = ((uint64_t)1 << 40) - 1;
    if ((!stride[i] && (fh || pend || live)) || (fh & hm) * 8 > used || (pend & hm) * 8 > used)
      c.bad = 1;
    a->free_head = fh;
    a->pending = pend;
    a->live = live;
    a->changes = ch;
  }
  for (uint64_t i = 0; !rc && !c.bad && i < nn * LIST_FIELDS; i++) lists[i] = c_u64(&c);
  free(p);
  /* which SNodes have an allocating SNode at or below them (parents have
   * smaller ids than their children) */
  for (int i = l->nnodes - 1; !rc && i > 0; i--) {
    if (stride[i]) below[i] = 1;
    if (below[i] && l->nodes[i].parent >= 0) below[l->nodes[i].parent] = 1;
  }
  if (!rc && !c.bad && used > fb_sparse_pool_room(sp))
    rc = rfail(r, FB_EQUOTA,
               "the checkpoint's sparse fields take %llu bytes of block pool, more than this "
               "session may reserve (%llu bytes; memory_limit)",
               (unsigned long long)used, (unsigned long long)fb_sparse_pool_room(sp));
  if (!rc && !c.bad && s->mem.limit && used > s->mem.limit - fb_devmem_used(&s->mem))
    rc = rfail(r, FB_EQUOTA,
               "the checkpoint's state takes more than the memory limit (%llu bytes): %llu "
               "bytes of fields and %llu of sparse blocks",
               (unsigned long long)s->mem.limit, (unsigned long long)s->mem.root_bytes,
               (unsigned long long)used);
  if (!rc && c.bad) rc = rfail(r, FB_EINVAL, "the checkpoint is damaged (its sparse part is "
                                             "malformed)");
  /* the pool itself */
  if (!rc && !r_begin(r, PART_POOL, used) && r->left != used)
    rc = rfail(r, FB_EINVAL, "the checkpoint is damaged (its block pool has the wrong size)");
  if (!rc && !r->bad) {
    st->pool_used = used;
    for (uint64_t at = 0; at < used && !r->bad; at += CHUNK)
      r_data_par(r, st->pool + at, used - at < CHUNK ? (size_t)(used - at) : CHUNK);
    r_hash_wait(r);
    r_end(r);
  }
  /* the structure: slots in the root and in live blocks, then in the
   * deactivated blocks still waiting for gc */
  reloc x = {l, st->pool, old_pool, used, stride, below, 0};
  if (!r->bad) reloc_cell(&x, 0, s->mem.root);
  for (uint64_t i = 1; !r->bad && !x.bad && i < nn; i++) {
    uint64_t hm = ((uint64_t)1 << 40) - 1, h = st->allocs[i].pending & hm, steps = 0;
    while (h && !x.bad) {
      if (h * 8 < 16 || (h * 8) % 16 || h * 8 > used || used - (h * 8 - 16) < stride[i] ||
          ++steps > used / 16) {
        x.bad = 1;
        break;
      }
      if (l->nodes[i].kind == FB_SN_POINTER) reloc_cell(&x, (int)i, st->pool + h * 8);
      h = *(uint64_t *)(st->pool + h * 8 - 8) & hm;
    }
  }
  /* the free lists: every link a block of the SNode's size inside the
   * pool (a pop follows them without a check) */
  for (uint64_t i = 1; !r->bad && !x.bad && i < nn; i++) {
    uint64_t hm = ((uint64_t)1 << 40) - 1, h = st->allocs[i].free_head & hm, steps = 0;
    while (h && !x.bad) {
      if (h * 8 < 16 || (h * 8) % 16 || h * 8 > used || used - (h * 8 - 16) < stride[i] ||
          ++steps > used / 16) {
        x.bad = 1;
        break;
      }
      h = *(uint64_t *)(st->pool + h * 8 - 8) & hm;
    }
  }
  if (!r->bad && x.bad && r->sealed) rfail(r, FB_EINVAL, MODIFIED);
  if (!r->bad && x.bad)
    rfail(r, FB_EINVAL, "the checkpoint is damaged (its sparse structure names a block outside "
                        "the pool)");
  /* the lists: their room (what the memory limit counts), empty: every
   * struct-for makes its list again before it reads it (the optimizer of
   * a new session knows no list as current, and takes version 0 of a
   * list as empty) */
  for (uint64_t i = 0; !r->bad && i < nn; i++) {
    uint64_t cap = lists[i * LIST_FIELDS];
    char msg[512];
    if (i == 0 && cap) {
      rfail(r, FB_EINVAL, "the checkpoint is damaged (its list of SNode 0 is malformed)");
      break;
    }
    if (!cap) continue;
    int lr = fb_sparse_restore_list(sp, (int)i, cap, msg, sizeof msg);
    if (lr) {
      rfail(r, lr, "%s", msg);
      break;
    }
    st->lists[i].count = 0;
    st->lists[i].gen = lists[i * LIST_FIELDS + 1];
  }
  free(stride);
  free(below);
  free(lists);
  fb_sparse_end(sp);
  return r->bad ? r->bad : rc;
}

static int get_manifest(rd *r) {
  if (r->bad) return r->bad;
  uint8_t h[PART_HEAD];
  if (r_raw(r, h, sizeof h)) return r->bad;
  uint64_t len = fbk_get64(h + 8);
  if (fbk_get32(h) != PART_MANIFEST || fbk_get32(h + 4) != 0 ||
      len != 4 + (uint64_t)r->nparts * 48)
    return rfail(r, FB_EINVAL, "the checkpoint is damaged (its manifest is malformed)");
  uint8_t m[4 + MAX_PARTS * 48];
  if (r_raw(r, m, (size_t)len)) return r->bad;
  if (fbk_get32(m) != (uint32_t)r->nparts)
    return rfail(r, FB_EINVAL, "the checkpoint is damaged (its manifest is malformed)");
  for (int i = 0; i < r->nparts; i++) {
    const uint8_t *e = m + 4 + 48 * i;
    if (fbk_get32(e) != r->parts[i].kind || fbk_get32(e + 4) != 0 ||
        fbk_get64(e + 8) != r->parts[i].len || memcmp(e + 16, r->parts[i].sha, 32) != 0) {
      if (r->sealed) return rfail(r, FB_EINVAL, MODIFIED);
      return rfail(r, FB_EINVAL,
                   "the checkpoint is damaged: its %s part does not match its SHA-256 in the "
                   "manifest",
                   part_name(r->parts[i].kind));
    }
  }
  /* nothing may follow */
  uint8_t extra;
  if (r->at < r->n) return rfail(r, FB_EINVAL, "the checkpoint has bytes after its end");
  for (;;) {
    long got = r->src(r->user, &extra, 1);
    if (got < 0) return rfail(r, FB_EIO, "cannot read the checkpoint");
    if (got == 0) break;
    return rfail(r, FB_EINVAL, "the checkpoint has bytes after its end");
  }
  return 0;
}

static int restore(fb_engine *e, const fb_session_config *limits, fb_source_fn src, void *user,
                   int sealed, fb_session **out, char *err, size_t errlen) {
  char sink_err[8];
  if (!err) {
    err = sink_err;
    errlen = sizeof sink_err;
  }
  if (out) *out = NULL;
  if (!e || !src || !out) {
    fb_errf(err, errlen, "no engine, source or result");
    return FB_EINVAL;
  }
  rd r;
  memset(&r, 0, sizeof r);
  r.src = src;
  r.user = user;
  r.sealed = sealed;
  r.err = err;
  r.errlen = errlen;
  r.buf = malloc(CHUNK);
  r.md = EVP_MD_CTX_new();
  fb_session *s = NULL;
  fb_layout *l = NULL;
  uint8_t *bounce = NULL;
  if (!r.buf || !r.md) rfail(&r, FB_ENOMEM, "out of memory");
  uint8_t h[HEADER_BYTES];
  if (!r.bad && r_raw(&r, h, 8) == 0 && memcmp(h, FBK_MAGIC, 8) != 0)
    rfail(&r, FB_EINVAL, "the data is not a Fusebox checkpoint");
  if (!r.bad && r_raw(&r, h + 8, HEADER_BYTES - 8) == 0) {
    uint32_t format = fbk_get32(h + 8);
    if (format != FB_CHECKPOINT_FORMAT)
      rfail(&r, FB_EINVAL, "the checkpoint was written by Fusebox format %u, this server reads %d",
            format, FB_CHECKPOINT_FORMAT);
    else if (fbk_get32(h + 12) != HEADER_BYTES)
      rfail(&r, FB_EINVAL, "the checkpoint is damaged (its header is malformed)");
    else {
      char why[200];
      if (fbk_byte_order_check(h + 16, why, sizeof why)) rfail(&r, FB_EINVAL, "%s", why);
    }
  }
  sess_hdr sh;
  memset(&sh, 0, sizeof sh);
  if (!r.bad) get_session(&r, &sh);
  if (!r.bad) get_layout(&r, &sh, &l);
  if (!r.bad) {
    fb_session_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.mode = sh.mode ? "async" : "sync";
    cfg.seed = sh.seed;
    cfg.passes = sh.passes;
    cfg.flush_every = sh.flush_every;
    cfg.max_fuse_per_task = sh.max_fuse;
    if (limits) {
      cfg.memory_limit = limits->memory_limit;
      cfg.max_kernel_statements = limits->max_kernel_statements;
      cfg.cache_partition = limits->cache_partition;
      cfg.allow_internal_ops = limits->allow_internal_ops;
    }
    char msg[ERRLEN];
    int rc = fb_session_create(e, &cfg, l, &s, msg, sizeof msg);
    if (rc) rfail(&r, rc, "cannot restore the checkpoint: %s", msg);
  }
  fb_layout_free(l);
  if (!r.bad) get_kernels(&r, s, &sh);
  if (!r.bad) get_ad(&r, s);
  if (!r.bad && fb_memsys_copies(s->mem.ms) && !(bounce = malloc(CHUNK)))
    rfail(&r, FB_ENOMEM, "out of memory");
  if (!r.bad && !r_begin(&r, PART_ROOT, s->mem.root_bytes) && r.left != s->mem.root_bytes)
    rfail(&r, FB_EINVAL, "the checkpoint is damaged (its fields have the wrong size)");
  if (!r.bad) r_dev(&r, s, s->mem.root, s->mem.root_bytes, bounce);
  if (!r.bad) r_end(&r);
  if (!r.bad && s->sparse) get_sparse(&r, s);
  if (!r.bad) get_manifest(&r);
  if (!r.bad) {
    s->launch_no = sh.launch_no;
    if (s->as) {
      /* the optimizer starts out knowing the fields of a new session;
       * these were written from outside: no list or mask it made is current */
      for (int i = 1; i < s->layout->nnodes && !r.bad; i++)
        if (fb_opt_host_write(s->as->o, i)) rfail(&r, FB_ENOMEM, "out of memory");
      s->as->launches = sh.launches;
      s->as->win_base = s->as->mark = sh.launch_no;
    } else {
      s->c.launches = sh.launches;
    }
    s->dev_bytes = fb_devmem_used(&s->mem);
  }
  r_hash_wait(&r);
  hasher_stop(&r.h);
  free(bounce);
  free(r.buf);
  EVP_MD_CTX_free(r.md);
  if (r.bad) {
    fb_session_destroy(s);
    return r.bad;
  }
  *out = s;
  return 0;
}

int fb_session_restore(fb_engine *e, const fb_session_config *limits, fb_source_fn src, void *user,
                       fb_session **out, char *err, size_t errlen) {
  return restore(e, limits, src, user, 0, out, err, errlen);
}

int fb_session_restore_sealed(fb_engine *e, const fb_session_config *limits, fb_source_fn src,
                              void *user, fb_session **out, char *err, size_t errlen) {
  return restore(e, limits, src, user, 1, out, err, errlen);
}
