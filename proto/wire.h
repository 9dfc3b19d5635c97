/* proto/wire.h: gRPC byte buffers, the form in which the protocol's
 * messages reach fuseboxd (server/) and libfusebox (client/). The one copy
 * of what both ends do with a message's bytes that the protobuf conversion
 * (convert.h) does not: a message to send made into a byte buffer, and a
 * received field chunk's data going from the message's slices straight to
 * where it belongs, without one contiguous copy of the message first. Uses
 * the gRPC C core's byte buffers, protobuf-c and the chunk encoding of
 * convert.h only. */
#ifndef FUSEBOX_PROTO_WIRE_H
#define FUSEBOX_PROTO_WIRE_H

#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>
#include <protobuf-c/protobuf-c.h>
#include <stddef.h>
#include <stdint.h>

#include "proto/convert.h"

/* A byte buffer to send holding a copy of the n bytes at p, or m packed
 * (*n, when n is not NULL: its packed size). The caller destroys it (or
 * hands it to gRPC's send, which then does). */
grpc_byte_buffer *fbp_bb_from(const void *p, size_t n);
grpc_byte_buffer *fbp_bb_pack(const ProtobufCMessage *m, size_t *n);
/* m packed into a new slice of its packed size (the caller unrefs). */
grpc_slice fbp_slice_pack(const ProtobufCMessage *m);
/* Copy n bytes starting at byte `from` of bb into dst, slice by slice. The
 * caller has checked from + n against grpc_byte_buffer_length(bb); bytes
 * past the end are not copied. */
void fbp_bb_copy(grpc_byte_buffer *bb, size_t from, uint8_t *dst, size_t n);
/* The whole of bb as one slice (a received message, for unpacking); the
 * empty slice for NULL or a buffer that cannot be read. The caller unrefs. */
grpc_slice fbp_bb_slice(grpc_byte_buffer *bb);

/* Where a received chunk's ch->len data bytes go: dst, or NULL to refuse
 * the chunk (the callback has said why to its caller). ch->data is not
 * set: the bytes may still lie in several slices. */
typedef uint8_t *(*fbp_chunk_dst_fn)(void *user, const fbp_chunk *ch);
enum {
  FBP_CHUNK_MALFORMED = 1,
  FBP_CHUNK_REFUSED = 2
};
/* Take one received FieldChunk: parse it, ask dst where its data goes and
 * copy the data there from bb's slices. Only the head is parsed when the
 * data comes last (as every Fusebox peer writes it); any other encoding is
 * parsed whole from one contiguous copy (fbp_chunk_parse, the last word).
 * 0 with *ch filled (ch->data NULL); FBP_CHUNK_MALFORMED when bb is not a
 * FieldChunk (err says why); FBP_CHUNK_REFUSED when dst refused it. The
 * session id points into a copy that is gone on return: dst reads it; on
 * return ch->session_id is NULL and session_id_len 0. */
int fbp_bb_take_chunk(grpc_byte_buffer *bb, fbp_chunk *ch, fbp_chunk_dst_fn dst, void *user,
                      char *err, size_t errlen);

/* What fuseboxd's broker routes a SessionRequest on, read from the message's
 * bytes without decoding it (fbp_session_scan): the session process decodes
 * the whole message once, where it runs. session_id points into the bytes
 * scanned (session_id_len bytes, up to the first NUL: what protobuf-c's
 * string holds); n_launches and n_tape count the entries of those repeated
 * fields; flush and sync as protobuf-c decodes them (the last one given). */
typedef struct fbp_session_head {
  const char *session_id;
  size_t session_id_len;
  size_t n_launches, n_tape;
  uint64_t sync;
  int flush;
} fbp_session_head;
/* Scan the n bytes at p as a fusebox.v1.SessionRequest: 0 with *h filled,
 * or FBP_SCAN_MALFORMED (h zeroed) where protobuf-c refuses the message's
 * own structure: a key, varint or length prefix that does not end where
 * protobuf-c reads one, a length past the end, a group or unknown wire type,
 * a field of the message with another wire type than its own. Bytes inside
 * a launch or tape mark are not looked at: the session process's decode
 * refuses those. Whatever protobuf-c decodes, the scan accepts with the
 * same fields (tests/test_proto.c, tests/fuzz/fuzz_proto.c). */
#define FBP_SCAN_MALFORMED 1
int fbp_session_scan(const uint8_t *p, size_t n, fbp_session_head *h);

#endif
