/* NumPy .npy files for `write ... from` and `read ... to` in JSON sessions:
 * the header is a Python dict literal with descr, fortran_order and shape. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"

static const struct {
  const char *descr;
  fb_type t;
} dtypes[] = {{"<f4", FB_T_F32}, {"<f8", FB_T_F64}, {"<i4", FB_T_I32},  {"<i8", FB_T_I64},
              {"<u4", FB_T_U32}, {"<u8", FB_T_U64}, {"|b1", FB_T_BOOL}, {"|u1", FB_T_BOOL}};

int64_t fb_npy_numel(const fb_npy *a) {
  int64_t n = 1;
  for (int d = 0; d < a->ndim; d++) n *= a->shape[d];
  return n;
}

void fb_npy_free(fb_npy *a) {
  free(a->data);
  memset(a, 0, sizeof *a);
}

static const char *descr_of(fb_type t) {
  for (size_t i = 0; i < sizeof dtypes / sizeof dtypes[0]; i++)
    if (dtypes[i].t == t) return dtypes[i].descr;
  return NULL;
}

int fb_npy_write(FILE *f, const char *path, const fb_npy *a, char *err, size_t errlen) {
  const char *descr = descr_of(a->type);
  if (!descr) {
    fb_errf(err, errlen, "%s: no .npy dtype for %s", path, fb_type_name(a->type));
    return FB_EUNSUPPORTED;
  }
  char shape[256] = "";
  size_t o = 0;
  for (int d = 0; d < a->ndim; d++)
    o += (size_t)snprintf(shape + o, sizeof shape - o, "%lld,%s", (long long)a->shape[d],
                          d + 1 < a->ndim ? " " : "");
  if (a->ndim > 1) shape[o - 1] = 0; /* (n, m) not (n, m,) */
  char hdr[512];
  int n = snprintf(hdr, sizeof hdr, "{'descr': '%s', 'fortran_order': False, 'shape': (%s), }",
                   descr, shape);
  int total = 10 + n + 1;
  int pad = (64 - total % 64) % 64;
  unsigned short hlen = (unsigned short)(n + pad + 1);
  fwrite("\x93NUMPY\x01\x00", 1, 8, f);
  fputc(hlen & 0xff, f);
  fputc(hlen >> 8, f);
  fwrite(hdr, 1, (size_t)n, f);
  for (int i = 0; i < pad; i++) fputc(' ', f);
  fputc('\n', f);
  size_t wrote = fwrite(a->data, 1, a->nbytes, f);
  if (fflush(f) != 0 || ferror(f) || wrote != a->nbytes) {
    fb_errf(err, errlen, "%s: write failed", path);
    return FB_EIO;
  }
  return 0;
}

/* Value of 'key': in the header dict, or NULL. */
static const char *dict_value(const char *hdr, const char *key) {
  char pat[32];
  snprintf(pat, sizeof pat, "'%s'", key);
  const char *p = strstr(hdr, pat);
  if (!p) return NULL;
  p = strchr(p + strlen(pat), ':');
  if (!p) return NULL;
  p++;
  while (*p == ' ') p++;
  return p;
}

static int parse_header(const char *path, const char *hdr, fb_npy *out, char *err, size_t errlen) {
  const char *d = dict_value(hdr, "descr"), *fo = dict_value(hdr, "fortran_order"),
             *sh = dict_value(hdr, "shape");
  if (!d || !fo || !sh || *d != '\'' || *sh != '(') {
    fb_errf(err, errlen, "%s: malformed .npy header", path);
    return FB_EPARSE;
  }
  if (strncmp(fo, "False", 5) != 0) {
    fb_errf(err, errlen, "%s: Fortran-order arrays are not supported (save with C order)", path);
    return FB_EUNSUPPORTED;
  }
  out->type = FB_T_VOID;
  for (size_t i = 0; i < sizeof dtypes / sizeof dtypes[0]; i++)
    if (strncmp(d + 1, dtypes[i].descr, 3) == 0 && d[4] == '\'') out->type = dtypes[i].t;
  if (out->type == FB_T_VOID) {
    fb_errf(err, errlen, "%s: unsupported dtype %.8s (use <f4 <f8 <i4 <i8 <u4 <u8 |b1)", path, d);
    return FB_EUNSUPPORTED;
  }
  const char *p = sh + 1;
  out->ndim = 0;
  while (*p && *p != ')') {
    while (*p == ' ' || *p == ',') p++;
    if (*p == ')') break;
    char *end;
    long long v = strtoll(p, &end, 10);
    if (end == p || v < 0 || out->ndim >= 8) {
      fb_errf(err, errlen, "%s: malformed shape in .npy header", path);
      return FB_EPARSE;
    }
    out->shape[out->ndim++] = v;
    p = end;
  }
  return 0;
}

int fb_npy_read(const char *path, fb_npy *out, char *err, size_t errlen) {
  memset(out, 0, sizeof *out);
  size_t len;
  char *buf = fb_cli_read_file(path, &len);
  if (!buf) {
    fb_errf(err, errlen, "%s: %s", path, strerror(errno));
    return FB_EIO;
  }
  int rc = FB_EPARSE;
  if (len < 10 || memcmp(buf, "\x93NUMPY", 6) != 0) {
    fb_errf(err, errlen, "%s: not a .npy file", path);
    goto done;
  }
  unsigned char major = (unsigned char)buf[6];
  size_t hl, off;
  if (major == 1) {
    hl = (unsigned char)buf[8] | (size_t)(unsigned char)buf[9] << 8;
    off = 10;
  } else {
    if (len < 12) {
      fb_errf(err, errlen, "%s: truncated .npy header", path);
      goto done;
    }
    hl = (unsigned char)buf[8] | (size_t)(unsigned char)buf[9] << 8 |
         (size_t)(unsigned char)buf[10] << 16 | (size_t)(unsigned char)buf[11] << 24;
    off = 12;
  }
  if (off + hl > len) {
    fb_errf(err, errlen, "%s: truncated .npy header", path);
    goto done;
  }
  char *hdr = strndup(buf + off, hl);
  rc = hdr ? parse_header(path, hdr, out, err, errlen) : FB_ENOMEM;
  free(hdr);
  if (rc) goto done;
  size_t need = (size_t)fb_npy_numel(out) * fb_type_size(out->type);
  if (len - off - hl != need) {
    fb_errf(err, errlen, "%s: %zu bytes of data for a shape that needs %zu", path, len - off - hl,
            need);
    rc = FB_EPARSE;
    goto done;
  }
  out->data = malloc(need ? need : 1);
  if (!out->data) {
    rc = FB_ENOMEM;
    goto done;
  }
  memcpy(out->data, buf + off + hl, need);
  out->nbytes = need;
  rc = 0;
done:
  free(buf);
  return rc;
}
