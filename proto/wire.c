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
