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

grpc_byte_buffer *fbp_bb_pack(const ProtobufCMessage *m, size_t *n) {
  size_t len = protobuf_c_message_get_packed_size(m);
  grpc_slice s = grpc_slice_malloc(len);
  protobuf_c_message_pack(m, GRPC_SLICE_START_PTR(s));
  grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&s, 1);
  grpc_slice_unref(s);
  if (n) *n = len;
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
