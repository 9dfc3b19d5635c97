/* Certificate subjects as structured names (subject.h): the tenants file's
 * "subjects" parsed once at load, a client certificate's subject read with
 * OpenSSL from its verified PEM, and an exact comparison of the two, RDN by
 * RDN and attribute by attribute (OID and value bytes). Nothing here
 * compares text: a comma, '+', '=' or backslash inside a value is a byte of
 * that value, a NUL or a value that is not UTF-8 text never matches, and a
 * subject with more (or other, or differently grouped) attributes than a
 * configured one is not it. */
#include <ctype.h>
#include <limits.h>
#include <openssl/asn1.h>
#include <openssl/bio.h>
#include <openssl/objects.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fusebox/common.h"
#include "server/subject.h"

void fbd_subject_clear(fbd_subject *s) {
  for (int i = 0; s->ava && i < s->n; i++) free(s->ava[i].value);
  free(s->ava);
  free(s->text);
  memset(s, 0, sizeof *s);
}

/* Well-formed UTF-8 (RFC 3629: no overlong forms, no surrogates, at most
 * U+10FFFF). */
static int utf8_ok(const unsigned char *p, size_t n) {
  size_t i = 0;
  while (i < n) {
    unsigned c = p[i];
    size_t k;
    unsigned min, v;
    if (c < 0x80) {
      i++;
      continue;
    } else if ((c & 0xe0) == 0xc0) k = 1, min = 0x80, v = c & 0x1f;
    else if ((c & 0xf0) == 0xe0) k = 2, min = 0x800, v = c & 0x0f;
    else if ((c & 0xf8) == 0xf0) k = 3, min = 0x10000, v = c & 0x07;
    else return 0;
    if (n - i <= k) return 0;
    for (size_t j = 1; j <= k; j++) {
      if ((p[i + j] & 0xc0) != 0x80) return 0;
      v = v << 6 | (p[i + j] & 0x3f);
    }
    if (v < min || v > 0x10ffff || (v >= 0xd800 && v <= 0xdfff)) return 0;
    i += k + 1;
  }
  return 1;
}

/* The OID and printable name of an OpenSSL object into a. */
static int set_type(fbd_ava *a, const ASN1_OBJECT *o) {
  int len = OBJ_length(o);
  const unsigned char *d = OBJ_get0_data(o);
  if (len <= 0 || !d || (size_t)len > sizeof a->oid) return FB_EINVAL;
  memcpy(a->oid, d, (size_t)len);
  a->oidlen = (size_t)len;
  /* the short name where OpenSSL has one (CN, not commonName), else the OID */
  const char *sn = OBJ_nid2sn(OBJ_obj2nid(o));
  if (OBJ_obj2nid(o) != NID_undef && sn) snprintf(a->type, sizeof a->type, "%s", sn);
  else if (OBJ_obj2txt(a->type, sizeof a->type, o, 1) <= 0) snprintf(a->type, sizeof a->type, "?");
  return 0;
}

/* An attribute type of the text form: a short or long name OpenSSL knows,
 * or a dotted OID. */
static int parse_type(const char *type, fbd_ava *a, char *err, size_t errlen) {
  int numeric = 1;
  for (const char *p = type; *p; p++)
    if (!isdigit((unsigned char)*p) && *p != '.') numeric = 0;
  ASN1_OBJECT *o = NULL;
  if (numeric) o = OBJ_txt2obj(type, 1);
  else {
    int nid = OBJ_sn2nid(type);
    if (nid == NID_undef) nid = OBJ_ln2nid(type);
    if (nid != NID_undef) o = OBJ_dup(OBJ_nid2obj(nid));
  }
  int rc = o ? set_type(a, o) : FB_EINVAL;
  ASN1_OBJECT_free(o);
  if (rc)
    fb_errf(err, errlen,
            "unknown attribute type '%s' (expected a name OpenSSL knows, spelled as it does: "
            "CN, O, OU, C, L, ST, DC, emailAddress, ...; or a dotted OID such as 2.5.4.3)",
            type);
  return rc;
}

static int hexdigit(int c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

static int push(fbd_subject *s, fbd_ava *a) {
  if (s->n == FBD_SUBJECT_MAX_AVAS) return FB_EINVAL;
  fbd_ava *v = realloc(s->ava, sizeof *v * (size_t)(s->n + 1));
  if (!v) return FB_ENOMEM;
  s->ava = v;
  s->ava[s->n++] = *a;
  if (a->rdn + 1 > s->nrdn) s->nrdn = a->rdn + 1;
  return 0;
}

/* One VALUE from *pp up to an unescaped ',' or '+' or the end, into a. */
static int parse_value(const char **pp, const char *text, fbd_ava *a, char *err, size_t errlen) {
  const char *p = *pp, *start = p;
  size_t cap = strlen(p) + 1, n = 0;
  char *buf = malloc(cap);
  if (!buf) return FB_ENOMEM;
  int rc = 0, raw_space = 0; /* the last byte was an unescaped space */
  while (!rc && *p && *p != ',' && *p != '+') {
    long at = (long)(p - text) + 1;
    unsigned char c = (unsigned char)*p;
    raw_space = 0;
    if (c == '\\') {
      int hi = hexdigit((unsigned char)p[1]), lo = hi < 0 ? -1 : hexdigit((unsigned char)p[2]);
      if (hi >= 0 && lo >= 0) {
        if (!(buf[n++] = (char)(hi << 4 | lo))) {
          fb_errf(err, errlen, "the value of %s holds a NUL byte (\\00 at character %ld): no "
                  "certificate's subject can be matched with one", a->type, at);
          rc = FB_EINVAL;
        }
        p += 3;
      } else if (p[1] && strchr(",+=\\\";<># ", p[1])) {
        buf[n++] = p[1];
        p += 2;
      } else {
        fb_errf(err, errlen,
                "bad escape at character %ld in the value of %s: '\\' is followed by one of "
                ", + = \\ \" ; < > # space, or by two hex digits",
                at, a->type);
        rc = FB_EINVAL;
      }
    } else if (strchr("=\";<>", c) || (c == '#' && p == start)) {
      fb_errf(err, errlen, "unescaped '%c' at character %ld in the value of %s: write '\\%c'",
              c, at, a->type, c);
      rc = FB_EINVAL;
    } else if (c < 0x20 || c == 0x7f) {
      fb_errf(err, errlen, "control byte 0x%02x at character %ld in the value of %s: write "
              "'\\%02X'", c, at, a->type, c);
      rc = FB_EINVAL;
    } else if (c == ' ' && p == start) {
      fb_errf(err, errlen, "the value of %s starts with a space: write '\\ ' (or '\\20') if the "
              "certificate's value does", a->type);
      rc = FB_EINVAL;
    } else {
      raw_space = c == ' ';
      buf[n++] = (char)c;
      p++;
    }
  }
  if (!rc && raw_space) {
    fb_errf(err, errlen, "the value of %s ends with a space: write '\\ ' (or '\\20') if the "
            "certificate's value does", a->type);
    rc = FB_EINVAL;
  }
  if (!rc && !n) {
    fb_errf(err, errlen, "the value of %s is empty", a->type);
    rc = FB_EINVAL;
  }
  if (!rc && !utf8_ok((const unsigned char *)buf, n)) {
    fb_errf(err, errlen, "the value of %s is not UTF-8 (what its \\XX escapes make must be)",
            a->type);
    rc = FB_EINVAL;
  }
  if (rc) {
    free(buf);
    return rc;
  }
  buf[n] = 0;
  a->value = buf;
  a->len = n;
  *pp = p;
  return 0;
}

int fbd_subject_parse(const char *text, fbd_subject *out, char *err, size_t errlen) {
  memset(out, 0, sizeof *out);
  if (strlen(text) > FBD_SUBJECT_MAX_TEXT) {
    fb_errf(err, errlen, "longer than %d bytes", FBD_SUBJECT_MAX_TEXT);
    return FB_EINVAL;
  }
  if (!(out->text = strdup(text))) return FB_ENOMEM;
  const char *p = text;
  int rdn = 0, rc = 0;
  while (!rc) {
    fbd_ava a = {.rdn = rdn};
    const char *t = p;
    while (isalnum((unsigned char)*p) || *p == '-' || *p == '.') p++;
    size_t tl = (size_t)(p - t);
    if (!tl || *p != '=') {
      fb_errf(err, errlen,
              "expected TYPE=VALUE at character %ld (RDNs are separated by ',', the "
              "attributes of one RDN by '+'; no spaces around them)",
              (long)(t - text) + 1);
      rc = FB_EINVAL;
      break;
    }
    char type[64];
    snprintf(type, sizeof type, "%.*s", (int)(tl < sizeof type ? tl : sizeof type - 1), t);
    if ((rc = parse_type(type, &a, err, errlen))) break;
    p++;
    if ((rc = parse_value(&p, text, &a, err, errlen))) break;
    if ((rc = push(out, &a))) {
      free(a.value);
      if (rc == FB_EINVAL)
        fb_errf(err, errlen, "more than %d attributes", FBD_SUBJECT_MAX_AVAS);
      break;
    }
    if (!*p) break;
    if (*p++ == ',') rdn++;
    if (!*p) {
      fb_errf(err, errlen, "ends with '%c' (expected another TYPE=VALUE after it)", p[-1]);
      rc = FB_EINVAL;
    }
  }
  if (rc) fbd_subject_clear(out);
  return rc;
}

/* ---------------------------------------------------------------- certificates */

/* The text form of s (for messages): what fbd_subject_parse reads back,
 * with every byte outside printable ASCII written \XX. */
static char *format(const fbd_subject *s) {
  size_t cap = 1;
  for (int i = 0; i < s->n; i++) cap += strlen(s->ava[i].type) + 2 + 3 * s->ava[i].len;
  char *out = malloc(cap), *w = out;
  if (!out) return NULL;
  for (int i = 0; i < s->n; i++) {
    const fbd_ava *a = &s->ava[i];
    if (i) *w++ = a->rdn == s->ava[i - 1].rdn ? '+' : ',';
    w += sprintf(w, "%s=", a->type);
    for (size_t k = 0; k < a->len; k++) {
      unsigned char c = (unsigned char)a->value[k];
      int edge = (k == 0 && (c == ' ' || c == '#')) || (k + 1 == a->len && c == ' ');
      if (c < 0x20 || c >= 0x7f) w += sprintf(w, "\\%02X", c);
      else if (edge || strchr(",+=\\\";<>", c)) *w++ = '\\', *w++ = (char)c;
      else *w++ = (char)c;
    }
  }
  *w = 0;
  return out;
}

/* The subject's entries in RFC 4514 order (the certificate's last RDN
 * first), each value as UTF-8. */
static int from_name(const X509_NAME *nm, fbd_subject *out, char *err, size_t errlen) {
  int n = X509_NAME_entry_count(nm);
  if (n <= 0) {
    fb_errf(err, errlen, "its subject is empty");
    return FB_EINVAL;
  }
  if (n > FBD_SUBJECT_MAX_AVAS) {
    fb_errf(err, errlen, "its subject has %d attributes, more than the %d a tenant's subject may "
            "have", n, FBD_SUBJECT_MAX_AVAS);
    return FB_EINVAL;
  }
  /* entries of one RDN share a set number; the last RDN becomes rdn 0 */
  int rdn = 0, rc = 0, prev = 0;
  for (int i = n - 1; !rc && i >= 0; i--) {
    const X509_NAME_ENTRY *e = X509_NAME_get_entry(nm, i);
    int set = X509_NAME_ENTRY_set(e);
    if (i < n - 1 && set != prev) rdn++;
    prev = set;
    fbd_ava a = {.rdn = rdn};
    if (set_type(&a, X509_NAME_ENTRY_get_object(e))) {
      fb_errf(err, errlen, "its subject has an attribute type OpenSSL cannot read");
      return FB_EINVAL;
    }
    unsigned char *u = NULL;
    int len = ASN1_STRING_to_UTF8(&u, X509_NAME_ENTRY_get_data(e));
    if (len < 0) {
      fb_errf(err, errlen, "the value of its %s is not a text string", a.type);
      rc = FB_EINVAL;
    } else if (memchr(u, 0, (size_t)len)) {
      fb_errf(err, errlen, "the value of its %s holds a NUL byte", a.type);
      rc = FB_EINVAL;
    } else if (!len) {
      fb_errf(err, errlen, "the value of its %s is empty", a.type);
      rc = FB_EINVAL;
    } else if (!utf8_ok(u, (size_t)len)) {
      fb_errf(err, errlen, "the value of its %s is not UTF-8", a.type);
      rc = FB_EINVAL;
    } else if (!(a.value = malloc((size_t)len + 1))) {
      rc = FB_ENOMEM;
    } else {
      memcpy(a.value, u, (size_t)len);
      a.value[len] = 0;
      a.len = (size_t)len;
      if ((rc = push(out, &a))) free(a.value);
    }
    OPENSSL_free(u);
  }
  return rc;
}

int fbd_subject_from_pem(const char *pem, size_t len, fbd_subject *out, char *err,
                         size_t errlen) {
  memset(out, 0, sizeof *out);
  if (!pem || !len || len > INT_MAX) {
    fb_errf(err, errlen, "no certificate");
    return FB_EINVAL;
  }
  BIO *b = BIO_new_mem_buf(pem, (int)len);
  X509 *x = b ? PEM_read_bio_X509(b, NULL, NULL, NULL) : NULL;
  BIO_free(b);
  if (!x) {
    fb_errf(err, errlen, "its PEM cannot be read");
    return FB_EINVAL;
  }
  int rc = from_name(X509_get_subject_name(x), out, err, errlen);
  X509_free(x);
  if (!rc && !(out->text = format(out))) rc = FB_ENOMEM;
  if (rc) fbd_subject_clear(out);
  return rc;
}

/* ---------------------------------------------------------------- comparison */

static int ava_equal(const fbd_ava *a, const fbd_ava *b) {
  return a->oidlen == b->oidlen && !memcmp(a->oid, b->oid, a->oidlen) && a->len == b->len &&
         !memcmp(a->value, b->value, a->len);
}

int fbd_subject_equal(const fbd_subject *a, const fbd_subject *b) {
  if (a->n != b->n || a->nrdn != b->nrdn || !a->n) return 0;
  /* RDN numbers run 0, 1, ... in order on both sides: the same sequence
   * means the same number of RDNs with the same number of attributes each */
  for (int i = 0; i < a->n; i++)
    if (a->ava[i].rdn != b->ava[i].rdn) return 0;
  for (int i = 0, end; i < a->n; i = end) {
    for (end = i; end < a->n && a->ava[end].rdn == a->ava[i].rdn;) end++;
    /* one RDN: the same attributes in any order (a SET OF), each used once */
    uint64_t used = 0;
    for (int x = i; x < end; x++) {
      int hit = 0;
      for (int y = i; y < end && !hit; y++)
        if (!(used >> (y - i) & 1) && ava_equal(&a->ava[x], &b->ava[y])) {
          used |= (uint64_t)1 << (y - i);
          hit = 1;
        }
      if (!hit) return 0;
    }
  }
  return 1;
}
