/* gRPC byte buffers of the protocol's messages (wire.h). */
#include "proto/wire.h"

#include <grpc/slice.h>
#include <string.h>

grpc_byte_buffer *fbp_bb_from(const void *p, size_t n) {
  grpc_slice s = grpc_slice_from_copied_buffer(p, n);
  grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&s, 1);
  grpc_slice_unref(s);
  return bb;
}

grpc_slice fbp_slice_pack(const ProtobufCMessage *m) {
  grpc_slice s = grpc_slice_malloc(protobuf_c_message_get_packed_size(m));
  protobuf_c_message_pack(m, GRPC_SLICE_START_PTR(s));
  return s;
}

grpc_byte_buffer *fbp_bb_pack(const ProtobufCMessage *m, size_t *n) {
  grpc_slice s = fbp_slice_pack(m);
  grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&s, 1);
  if (n) *n = GRPC_SLICE_LENGTH(s);
  grpc_slice_unref(s);
  return bb;
}

void fbp_bb_copy(grpc_byte_buffer *bb, size_t from, uint8_t *dst, size_t n) {
  grpc_byte_buffer_reader r;
  if (!n || !grpc_byte_buffer_reader_init(&r, bb)) return;
  grpc_slice s;
  size_t pos = 0;
  while (n && grpc_byte_buffer_reader_next(&r, &s)) {
    size_t len = GRPC_SLICE_LENGTH(s);
    if (pos + len > from) {
      size_t off = from - pos, k = len - off < n ? len - off : n;
      memcpy(dst, GRPC_SLICE_START_PTR(s) + off, k);
      dst += k;
      n -= k;
      from += k;
    }
    pos += len;
    grpc_slice_unref(s);
  }
  grpc_byte_buffer_reader_destroy(&r);
}

grpc_slice fbp_bb_slice(grpc_byte_buffer *bb) {
  grpc_byte_buffer_reader r;
  if (!bb || !grpc_byte_buffer_reader_init(&r, bb)) return grpc_empty_slice();
  grpc_slice s = grpc_byte_buffer_reader_readall(&r);
  grpc_byte_buffer_reader_destroy(&r);
  return s;
}

int fbp_bb_take_chunk(grpc_byte_buffer *bb, fbp_chunk *ch, fbp_chunk_dst_fn dst, void *user,
                      char *err, size_t errlen) {
  size_t total = grpc_byte_buffer_length(bb), at = 0;
  uint8_t head[FBP_CHUNK_HEADER_MAX], *to;
  size_t hn = total < sizeof head ? total : sizeof head;
  fbp_bb_copy(bb, 0, head, hn);
  if (fbp_chunk_parse_head(head, hn, total, ch, &at) == 0) {
    /* at + ch->len == total: the copy stays inside bb */
    to = dst(user, ch);
    ch->session_id = NULL; /* it points into head, gone on return */
    ch->session_id_len = 0;
    if (!to) return FBP_CHUNK_REFUSED;
    fbp_bb_copy(bb, at, to, ch->len);
    return 0;
  }
  grpc_slice s = fbp_bb_slice(bb);
  int rc = 0;
  if (fbp_chunk_parse(GRPC_SLICE_START_PTR(s), GRPC_SLICE_LENGTH(s), ch, err, errlen)) {
    rc = FBP_CHUNK_MALFORMED;
  } else {
    const uint8_t *data = ch->data;
    ch->data = NULL; /* it points into s, gone on return */
    /* a chunk without data (a header chunk: protobuf omits empty bytes)
     * has data NULL, which memcpy may not be given even for 0 bytes */
    if (!(to = dst(user, ch))) rc = FBP_CHUNK_REFUSED;
    else if (ch->len) memcpy(to, data, ch->len);
    ch->session_id = NULL; /* it points into s too */
    ch->session_id_len = 0;
  }
  grpc_slice_unref(s);
  return rc;
}

/* ---------------------------------------------------------------- scanning
 * The protobuf wire format read as protobuf-c 1.4 reads it (its limits, so
 * that the scan refuses exactly what it refuses at this level): a key of at
 * most 5 bytes whose first byte holds a field number, a varint of at most 10
 * bytes, a length prefix of at most 5 bytes (32 bits kept). Each returns
 * the bytes it took, 0 when malformed. */

static size_t scan_key(const uint8_t *p, size_t n, uint32_t *num, unsigned *wt) {
  if (!n || !(p[0] & 0xf8)) return 0; /* field 0 */
  *wt = p[0] & 7u;
  uint32_t v = (uint32_t)(p[0] & 0x7f) >> 3;
  if (!(p[0] & 0x80)) {
    *num = v;
    return 1;
  }
  size_t max = n < 5 ? n : 5;
  unsigned shift = 4;
  for (size_t i = 1; i < max; i++, shift += 7) {
    v |= (uint32_t)((uint32_t)(p[i] & 0x7f) << shift);
    if (!(p[i] & 0x80)) {
      *num = v;
      return i + 1;
    }
  }
  return 0;
}

/* A varint of at most max bytes (its low 64 bits). */
static size_t scan_varint(const uint8_t *p, size_t n, size_t max, uint64_t *out) {
  if (n < max) max = n;
  uint64_t v = 0;
  for (size_t i = 0; i < max; i++) {
    v |= (uint64_t)(p[i] & 0x7f) << (7 * i);
    if (!(p[i] & 0x80)) {
      *out = v;
      return i + 1;
    }
  }
  return 0;
}

/* A length prefix (5 bytes at most, its low 32 bits kept) and the bytes it
 * covers: the prefix's size (*len the covered bytes, all of them within
 * n), or 0. */
static size_t scan_len(const uint8_t *p, size_t n, size_t *len) {
  uint64_t v;
  size_t k = scan_varint(p, n, 5, &v);
  if (!k || (uint32_t)v > n - k) return 0; /* unended, or past the end */
  *len = (uint32_t)v;
  return k;
}

enum { WT_VARINT = 0, WT_64 = 1, WT_LEN = 2, WT_32 = 5 };

int fbp_session_scan(const uint8_t *p, size_t n, fbp_session_head *h) {
  memset(h, 0, sizeof *h);
  size_t at = 0;
  while (at < n) {
    uint32_t num;
    unsigned wt;
    size_t k = scan_key(p + at, n - at, &num, &wt), len = 0;
    if (!k) goto bad;
    at += k;
    uint64_t v = 0;
    switch (wt) { /* the value's extent first, whatever the field */
    case WT_VARINT:
      if (!(k = scan_varint(p + at, n - at, 10, &v))) goto bad;
      break;
    case WT_64:
    case WT_32:
      k = wt == WT_64 ? 8 : 4;
      if (n - at < k) goto bad;
      break;
    case WT_LEN:
      if (!(k = scan_len(p + at, n - at, &len))) goto bad;
      break;
    default: goto bad; /* groups (3, 4) and the wire types 6 and 7 */
    }
    /* a field of SessionRequest in its own wire type (proto/fusebox.proto);
       protobuf-c takes a bool (flush) in any */
    unsigned want = num == 4 ? WT_VARINT : WT_LEN;
    if (num >= 1 && num <= 5 && num != 3 && wt != want) goto bad;
    switch (num) {
    case 1: {
      const char *s = (const char *)(p + at + k);
      h->session_id = s;
      h->session_id_len = strnlen(s, len);
      break;
    }
    case 2: h->n_launches++; break;
    case 3: /* protobuf-c's bool: any of the value's bytes (a length
               prefix's too) with a bit set among its low seven */
      h->flush = 0;
      for (size_t i = 0; i < k + len; i++) h->flush |= (p[at + i] & 0x7f) != 0;
      break;
    case 4: h->sync = v; break;
    case 5: h->n_tape++; break;
    default: break; /* unknown: kept by protobuf-c, skipped here */
    }
    at += k + len;
  }
  return 0;
bad:
  memset(h, 0, sizeof *h);
  return FBP_SCAN_MALFORMED;
}
