/* The seal around a checkpoint stream (include/fusebox/engine.h,
 * docs/checkpoint.md "The seal"): the stream goes through unchanged; a
 * trailer after it names the owner and the format and carries an
 * HMAC-SHA256 under a key kept outside the checkpoint directory:
 *
 *   "FBSEAL\r\n"  8 bytes
 *   u32 format    FB_CHECKPOINT_FORMAT
 *   u32 owner_len at most FB_SEAL_OWNER_MAX
 *   owner         owner_len bytes
 *   u64 payload   bytes of the checkpoint stream before the trailer
 *   mac           32 bytes: HMAC-SHA256(key, the covered bytes || the trailer so far)
 *   u32 trailer   bytes of the whole trailer, these 4 and the 8 below included
 *   "FBSEALED"    8 bytes
 *
 * The covered bytes are the payload less the bytes of its bulk parts (the
 * fields, the sparse block pool: fbk_part_bulk), whose SHA-256 the
 * stream's manifest lists: the MAC covers the header, every part's head,
 * every other part's bytes, the manifest and whatever follows it, so each
 * byte of a checkpoint is hashed once when it is written (the engine's
 * SHA-256 of a bulk part, or the HMAC) instead of twice. The seal follows
 * the stream's framing (engine/ckpt_io.h) as it goes by, and refuses a
 * stream that does not begin as a checkpoint.
 *
 * Integers little-endian. A verifier finds the trailer from the end of the
 * file, checks the format, then the MAC and each bulk part against its
 * SHA-256 in the manifest, then the owner: a modified owner reads as a
 * modified file, another tenant's genuine file as another tenant's. The
 * key file helper is here too. */
#include <errno.h>
#include <fcntl.h>
#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/params.h>
#include <openssl/rand.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/ckpt_io.h"
#include "fusebox/engine.h"

#define HEAD_MAGIC "FBSEAL\r\n"
#define TAIL_MAGIC "FBSEALED"
#define MAC_LEN 32
/* the trailer's bytes besides the owner */
#define TRAILER_FIXED (8 + 4 + 4 + 8 + MAC_LEN + 4 + 8)

struct fb_seal {
  EVP_MAC_CTX *mac;
  fb_sink_fn sink;
  void *user;
  uint64_t n;    /* payload bytes so far */
  int failed;    /* the sink refused: the trailer is never written */
  /* where the stream is (its framing, engine/ckpt_io.h) */
  int at_state;  /* S_HEADER, S_HEAD, S_BODY, S_TAIL */
  size_t hn;     /* bytes of the header or part head so far */
  uint8_t hb[FBK_HEADER_BYTES];
  uint64_t left; /* of the part's body */
  int bulk;      /* the body is a bulk part's: not covered by the MAC */
  size_t olen;
  char owner[FB_SEAL_OWNER_MAX + 1];
};

enum { S_HEADER, S_HEAD, S_BODY, S_TAIL };

static EVP_MAC_CTX *mac_new(const uint8_t *key, size_t keylen) {
  EVP_MAC *m = EVP_MAC_fetch(NULL, "HMAC", NULL);
  if (!m) return NULL;
  EVP_MAC_CTX *c = EVP_MAC_CTX_new(m);
  EVP_MAC_free(m);
  if (!c) return NULL;
  char digest[] = "SHA256";
  OSSL_PARAM p[] = {OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, digest, 0),
                    OSSL_PARAM_construct_end()};
  if (!EVP_MAC_init(c, key, keylen, p)) {
    EVP_MAC_CTX_free(c);
    return NULL;
  }
  return c;
}

fb_seal *fb_seal_begin(const uint8_t *key, size_t keylen, const char *owner, fb_sink_fn sink,
                       void *user) {
  if (!key || keylen < FB_SEAL_KEY_MIN || !sink) return NULL;
  if (!owner) owner = "";
  size_t olen = strlen(owner);
  if (olen > FB_SEAL_OWNER_MAX) return NULL;
  fb_seal *s = calloc(1, sizeof *s);
  if (!s) return NULL;
  if (!(s->mac = mac_new(key, keylen))) {
    free(s);
    return NULL;
  }
  s->sink = sink;
  s->user = user;
  s->olen = olen;
  memcpy(s->owner, owner, olen);
  return s;
}

/* The covered bytes of buf into the MAC, following the stream's framing:
 * 0, or -1 when the stream is not a checkpoint's or OpenSSL fails. */
static int seal_cover(fb_seal *s, const uint8_t *p, size_t n) {
  while (n) {
    size_t k = n;
    int cover = 1;
    if (s->at_state == S_HEADER || s->at_state == S_HEAD) {
      size_t full = s->at_state == S_HEADER ? FBK_HEADER_BYTES : FBK_PART_HEAD;
      if (k > full - s->hn) k = full - s->hn;
      memcpy(s->hb + s->hn, p, k);
      s->hn += k;
      if (s->hn == full) {
        s->hn = 0;
        if (s->at_state == S_HEADER) {
          if (memcmp(s->hb, FBK_MAGIC, 8) || fbk_get32(s->hb + 12) != FBK_HEADER_BYTES) return -1;
          s->at_state = S_HEAD;
        } else {
          uint32_t kind = fbk_get32(s->hb);
          s->left = fbk_get64(s->hb + 8);
          s->bulk = fbk_part_bulk(kind);
          s->at_state = kind == FBK_PART_MANIFEST ? S_TAIL : s->left ? S_BODY : S_HEAD;
        }
      }
    } else if (s->at_state == S_BODY) {
      if (k > s->left) k = (size_t)s->left;
      cover = !s->bulk;
      if (!(s->left -= k)) s->at_state = S_HEAD;
    }
    if (cover && !EVP_MAC_update(s->mac, p, k)) return -1;
    p += k;
    n -= k;
  }
  return 0;
}

int fb_seal_write(void *seal, const void *buf, size_t n) {
  fb_seal *s = seal;
  if (!s || s->failed) return -1;
  if (!n) return 0;
  if (seal_cover(s, buf, n) || s->sink(s->user, buf, n)) {
    s->failed = 1;
    return -1;
  }
  s->n += n;
  return 0;
}

/* The trailer up to the MAC into out (room for TRAILER_FIXED + owner). */
static size_t trailer_head(uint8_t *out, uint32_t format, const char *owner, size_t olen,
                           uint64_t payload) {
  size_t at = 0;
  memcpy(out, HEAD_MAGIC, 8);
  at += 8;
  fbk_put32(out + at, format);
  at += 4;
  fbk_put32(out + at, (uint32_t)olen);
  at += 4;
  memcpy(out + at, owner, olen);
  at += olen;
  fbk_put64(out + at, payload);
  return at + 8;
}

int fb_seal_finish(fb_seal *s, char *err, size_t errlen) {
  if (!s) {
    fb_errf(err, errlen, "no seal");
    return FB_EINVAL;
  }
  int rc = 0;
  if (s->failed) {
    fb_errf(err, errlen, "the checkpoint could not be written");
    rc = FB_EIO;
  } else if (s->at_state != S_TAIL) {
    fb_errf(err, errlen, "the checkpoint could not be sealed: its stream ended before its "
            "manifest");
    rc = FB_EIO;
  } else {
    uint8_t t[TRAILER_FIXED + FB_SEAL_OWNER_MAX];
    size_t at = trailer_head(t, FB_CHECKPOINT_FORMAT, s->owner, s->olen, s->n);
    size_t maclen = 0;
    if (!EVP_MAC_update(s->mac, t, at) || !EVP_MAC_final(s->mac, t + at, &maclen, MAC_LEN) ||
        maclen != MAC_LEN) {
      fb_errf(err, errlen, "the checkpoint's seal could not be computed (OpenSSL)");
      rc = FB_EIO;
    } else {
      at += MAC_LEN;
      fbk_put32(t + at, (uint32_t)(at + 4 + 8));
      at += 4;
      memcpy(t + at, TAIL_MAGIC, 8);
      at += 8;
      if (s->sink(s->user, t, at)) {
        fb_errf(err, errlen, "the checkpoint could not be written");
        rc = FB_EIO;
      }
    }
  }
  fb_seal_abort(s);
  return rc;
}

void fb_seal_abort(fb_seal *s) {
  if (!s) return;
  EVP_MAC_CTX_free(s->mac);
  OPENSSL_cleanse(s, sizeof *s);
  free(s);
}

static int read_at(int fd, void *buf, size_t n, uint64_t off) {
  uint8_t *p = buf;
  while (n) {
    ssize_t r = pread(fd, p, n, (off_t)off);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return -1;
    p += r;
    n -= (size_t)r;
    off += (uint64_t)r;
  }
  return 0;
}

/* Bytes [at, at + n) of fd into the MAC c or the digest md. */
static int feed(int fd, uint64_t at, uint64_t n, EVP_MAC_CTX *c, EVP_MD_CTX *md, uint8_t *buf,
                size_t bufn) {
  while (n) {
    size_t k = n < bufn ? (size_t)n : bufn;
    if (read_at(fd, buf, k, at)) return FB_EIO;
    if (c && !EVP_MAC_update(c, buf, k)) return FB_EIO;
    if (md && !EVP_DigestUpdate(md, buf, k)) return FB_EIO;
    at += k;
    n -= k;
  }
  return 0;
}

/* The seal's check of fd; with bulk, each bulk part's bytes against its
 * SHA-256 in the manifest too (fb_seal_verify_fd), else only the covered
 * bytes, the bulk parts left to the restore that reads them next
 * (fb_seal_check_fd): it compares their SHA-256 with the manifest. */
static int seal_check(int fd, const uint8_t *key, size_t keylen, const char *owner,
                      uint64_t *payload_len, int bulk_too, char *err, size_t errlen) {
  if (payload_len) *payload_len = 0;
  if (!owner) owner = "";
  if (!key || keylen < FB_SEAL_KEY_MIN) {
    fb_errf(err, errlen, "the checkpoint key is shorter than %d bytes", FB_SEAL_KEY_MIN);
    return FB_EINVAL;
  }
  struct stat st;
  if (fstat(fd, &st) != 0) {
    fb_errf(err, errlen, "cannot read the checkpoint: %s", strerror(errno));
    return FB_EIO;
  }
  if (!S_ISREG(st.st_mode)) {
    fb_errf(err, errlen, "the checkpoint is not a regular file");
    return FB_EINVAL;
  }
  uint64_t size = (uint64_t)st.st_size;
  uint8_t head[8];
  if (size < 8 || read_at(fd, head, 8, 0)) {
    fb_errf(err, errlen, "the checkpoint is truncated");
    return FB_EINVAL;
  }
  if (memcmp(head, FBK_MAGIC, 8) != 0) {
    fb_errf(err, errlen, "the file is not a Fusebox checkpoint");
    return FB_EINVAL;
  }
  uint8_t tail[12];
  if (size < TRAILER_FIXED + 8 || read_at(fd, tail, 12, size - 12) ||
      memcmp(tail + 4, TAIL_MAGIC, 8) != 0) {
    fb_errf(err, errlen, "the checkpoint is truncated (it has no seal at its end)");
    return FB_EINVAL;
  }
  uint32_t tlen = fbk_get32(tail);
  if (tlen < TRAILER_FIXED || tlen > TRAILER_FIXED + FB_SEAL_OWNER_MAX || tlen > size - 8) {
    fb_errf(err, errlen, "the checkpoint was modified or was written with another server key");
    return FB_EINVAL;
  }
  uint8_t t[TRAILER_FIXED + FB_SEAL_OWNER_MAX];
  uint64_t tstart = size - tlen;
  if (read_at(fd, t, tlen, tstart)) {
    fb_errf(err, errlen, "cannot read the checkpoint: %s", strerror(errno));
    return FB_EIO;
  }
  if (memcmp(t, HEAD_MAGIC, 8) != 0) {
    fb_errf(err, errlen, "the checkpoint was modified or was written with another server key");
    return FB_EINVAL;
  }
  uint32_t format = fbk_get32(t + 8);
  if (format != FB_CHECKPOINT_FORMAT) {
    fb_errf(err, errlen, "the checkpoint was written by Fusebox format %u, this server reads %d",
            format, FB_CHECKPOINT_FORMAT);
    return FB_EINVAL;
  }
  uint32_t olen = fbk_get32(t + 12);
  uint64_t payload = olen + TRAILER_FIXED == tlen ? fbk_get64(t + 16 + olen) : UINT64_MAX;
  if (payload != tstart) {
    fb_errf(err, errlen, "the checkpoint was modified or was written with another server key");
    return FB_EINVAL;
  }
  EVP_MAC_CTX *c = mac_new(key, keylen);
  EVP_MD_CTX *md = EVP_MD_CTX_new();
  size_t bufn = (size_t)1 << 20;
  uint8_t *buf = malloc(bufn);
  int rc = 0, bad = 0;
  if (!c || !md || !buf) {
    fb_errf(err, errlen, "out of memory");
    rc = FB_ENOMEM;
  }
  /* the stream's framing: the header, then parts up to the manifest */
  struct {
    uint32_t kind;
    uint64_t len;
    uint8_t sha[32];
  } parts[FBK_MAX_PARTS];
  int nparts = 0;
  uint64_t at = 0;
  errno = 0;
  uint8_t h[FBK_HEADER_BYTES];
  if (!rc && (payload < FBK_HEADER_BYTES || read_at(fd, h, FBK_HEADER_BYTES, 0)))
    bad = 1;
  else if (!rc && fbk_get32(h + 12) != FBK_HEADER_BYTES)
    bad = 1;
  else if (!rc && !EVP_MAC_update(c, h, FBK_HEADER_BYTES))
    rc = FB_EIO;
  at = FBK_HEADER_BYTES;
  uint64_t mlen = 0;
  while (!rc && !bad) {
    if (payload - at < FBK_PART_HEAD || read_at(fd, h, FBK_PART_HEAD, at) ||
        !EVP_MAC_update(c, h, FBK_PART_HEAD)) {
      bad = 1;
      break;
    }
    uint32_t kind = fbk_get32(h);
    uint64_t len = fbk_get64(h + 8);
    at += FBK_PART_HEAD;
    if (kind == FBK_PART_MANIFEST) {
      mlen = len;
      break;
    }
    if (nparts == FBK_MAX_PARTS || len > payload - at) {
      bad = 1;
      break;
    }
    int bulk = fbk_part_bulk(kind);
    parts[nparts].kind = kind;
    parts[nparts].len = len;
    int hash = bulk && bulk_too;
    if (hash && !EVP_DigestInit_ex(md, EVP_sha256(), NULL)) rc = FB_EIO;
    if (!rc && (hash || !bulk)) rc = feed(fd, at, len, bulk ? NULL : c, hash ? md : NULL, buf, bufn);
    unsigned int l = 0;
    if (!rc && hash && (!EVP_DigestFinal_ex(md, parts[nparts].sha, &l) || l != 32)) rc = FB_EIO;
    if (!bulk) memset(parts[nparts].sha, 0, 32);
    nparts++;
    at += len;
  }
  /* the manifest (covered below, with what follows it): each bulk part's
     SHA-256 as computed */
  uint8_t m[4 + FBK_MAX_PARTS * 48];
  if (!rc && !bad &&
      (mlen != 4 + 48 * (uint64_t)nparts || mlen > payload - at || read_at(fd, m, mlen, at) ||
       fbk_get32(m) != (uint32_t)nparts))
    bad = 1;
  for (int i = 0; !rc && !bad && i < nparts; i++) {
    const uint8_t *e = m + 4 + 48 * i;
    if (fbk_get32(e) != parts[i].kind || fbk_get64(e + 8) != parts[i].len ||
        (bulk_too && fbk_part_bulk(parts[i].kind) && CRYPTO_memcmp(e + 16, parts[i].sha, 32) != 0))
      bad = 1;
  }
  if (!rc && !bad) rc = feed(fd, at, payload - at, c, NULL, buf, bufn);
  uint8_t mac[MAC_LEN];
  size_t maclen = 0;
  size_t hl = 16 + olen + 8;
  if (!rc && !bad && (!EVP_MAC_update(c, t, hl) || !EVP_MAC_final(c, mac, &maclen, sizeof mac)))
    rc = FB_EIO;
  if (rc == FB_EIO)
    fb_errf(err, errlen, "cannot read the checkpoint or compute its seal: %s",
            errno ? strerror(errno) : "OpenSSL failed");
  if (!rc && (bad || maclen != MAC_LEN || CRYPTO_memcmp(mac, t + hl, MAC_LEN) != 0)) {
    fb_errf(err, errlen, "the checkpoint was modified or was written with another server key");
    rc = FB_EINVAL;
  }
  if (!rc && (strlen(owner) != olen || memcmp(owner, t + 16, olen) != 0)) {
    fb_errf(err, errlen, "the checkpoint belongs to another tenant");
    rc = FB_EINVAL;
  }
  EVP_MAC_CTX_free(c);
  EVP_MD_CTX_free(md);
  free(buf);
  if (!rc && payload_len) *payload_len = payload;
  return rc;
}

int fb_seal_verify_fd(int fd, const uint8_t *key, size_t keylen, const char *owner,
                      uint64_t *payload_len, char *err, size_t errlen) {
  return seal_check(fd, key, keylen, owner, payload_len, 1, err, errlen);
}

int fb_seal_check_fd(int fd, const uint8_t *key, size_t keylen, const char *owner,
                     uint64_t *payload_len, char *err, size_t errlen) {
  return seal_check(fd, key, keylen, owner, payload_len, 0, err, errlen);
}

/* ---------------------------------------------------------------- the key file */

static int key_read(int fd, const char *path, uint8_t *key, size_t *keylen, char *err,
                    size_t errlen) {
  struct stat st;
  if (fstat(fd, &st) != 0) {
    fb_errf(err, errlen, "checkpoint key %s: %s", path, strerror(errno));
    return FB_EIO;
  }
  if (!S_ISREG(st.st_mode)) {
    fb_errf(err, errlen, "checkpoint key %s is not a regular file", path);
    return FB_EINVAL;
  }
  if (st.st_uid != geteuid()) {
    fb_errf(err, errlen, "checkpoint key %s is not owned by this user (uid %u)", path,
            (unsigned)geteuid());
    return FB_EINVAL;
  }
  if (st.st_mode & 077) {
    fb_errf(err, errlen,
            "checkpoint key %s can be read by others (mode %03o): make it 0600 (chmod 600 %s)",
            path, (unsigned)(st.st_mode & 0777), path);
    return FB_EINVAL;
  }
  if (st.st_size < FB_SEAL_KEY_MIN || st.st_size > FB_SEAL_KEY_MAX) {
    fb_errf(err, errlen, "checkpoint key %s has %lld bytes; a key has %d to %d", path,
            (long long)st.st_size, FB_SEAL_KEY_MIN, FB_SEAL_KEY_MAX);
    return FB_EINVAL;
  }
  size_t n = (size_t)st.st_size, got = 0;
  while (got < n) {
    ssize_t r = read(fd, key + got, n - got);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      fb_errf(err, errlen, "checkpoint key %s: cannot read it", path);
      return FB_EIO;
    }
    got += (size_t)r;
  }
  *keylen = n;
  return 0;
}

int fb_seal_key_load(const char *path, int create, uint8_t *key, size_t *keylen, char *err,
                     size_t errlen) {
  *keylen = 0;
  if (!path || !*path) {
    fb_errf(err, errlen, "no checkpoint key file given");
    return FB_EINVAL;
  }
  int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0 && errno == ENOENT && create) {
    uint8_t fresh[32];
    if (RAND_bytes(fresh, sizeof fresh) != 1) {
      fb_errf(err, errlen, "checkpoint key %s: no random bytes to make one", path);
      return FB_EIO;
    }
    int w = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (w < 0 && errno != EEXIST) {
      fb_errf(err, errlen, "cannot create checkpoint key %s: %s", path, strerror(errno));
      return FB_EIO;
    }
    if (w >= 0) {
      ssize_t r = write(w, fresh, sizeof fresh);
      int bad = r != (ssize_t)sizeof fresh || fsync(w) != 0;
      close(w);
      OPENSSL_cleanse(fresh, sizeof fresh);
      if (bad) {
        unlink(path);
        fb_errf(err, errlen, "cannot write checkpoint key %s", path);
        return FB_EIO;
      }
    }
    fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC); /* ours, or a racing creator's */
  }
  if (fd < 0) {
    fb_errf(err, errlen, "cannot open checkpoint key %s: %s", path,
            errno == ELOOP ? "it is a symbolic link" : strerror(errno));
    return errno == ENOENT ? FB_ENOENT : FB_EIO;
  }
  int rc = key_read(fd, path, key, keylen, err, errlen);
  close(fd);
  return rc;
}
