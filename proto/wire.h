/* proto/wire.h: gRPC byte buffers, the form in which the protocol's
 * messages reach fuseboxd (server/) and libfusebox (client/). The one copy
 * of what both ends do with a message's bytes that the protobuf conversion
 * (convert.h) does not: a message to send made into a byte buffer, and a
 * received field chunk's data going from the message's slices straight to
 * where it belongs, without one contiguous copy of the message first. Uses
 * the gRPC C core's byte buffers and protobuf-c only. */
#ifndef FUSEBOX_PROTO_WIRE_H
#define FUSEBOX_PROTO_WIRE_H

#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>
#include <protobuf-c/protobuf-c.h>
#include <stddef.h>
#include <stdint.h>

/* A byte buffer to send holding a copy of the n bytes at p, or m packed
 * (*n, when n is not NULL: its packed size). The caller destroys it (or
 * hands it to gRPC's send, which then does). */
grpc_byte_buffer *fbp_bb_from(const void *p, size_t n);
grpc_byte_buffer *fbp_bb_pack(const ProtobufCMessage *m, size_t *n);
/* Copy n bytes starting at byte `from` of bb into dst, slice by slice. The
 * caller has checked from + n against grpc_byte_buffer_length(bb); bytes
 * past the end are not copied. */
void fbp_bb_copy(grpc_byte_buffer *bb, size_t from, uint8_t *dst, size_t n);
/* The whole of bb as one slice (a received message, for unpacking); the
 * empty slice for NULL or a buffer that cannot be read. The caller unrefs. */
grpc_slice fbp_bb_slice(grpc_byte_buffer *bb);

#endif
