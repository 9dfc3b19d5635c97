/* IR <-> protobuf: the one place where the wire form of layouts, kernels,
 * values, counters, launch batches and field chunks is defined, shared by
 * fuseboxd (server/) and libfusebox (client/). Also the mapping between
 * FB_E* codes and gRPC status codes, so both ends agree on it.
 *
 * Invariants
 *  - x_from_pb(x_to_pb(x)) reproduces x: same SNode ids, statement ids,
 *    blocks, immediates (bit for bit) and types.
 *  - from_pb functions never trust their input: every id, count, type and
 *    op name is checked, and a refusal says what is wrong in err. Only
 *    structure is checked here; the rules of the IR are the verifier's.
 *  - Hand-written encoders (launches, chunk headers) produce bytes that
 *    protobuf-c's generated unpackers read as the same messages; the
 *    chunk parser accepts exactly what a protobuf parser accepts for
 *    FieldChunk (tests/test_proto.c checks both directions).
 *  - Messages built by *_to_pb live in an arena: one free releases all. */
#ifndef FUSEBOX_PROTO_CONVERT_H
#define FUSEBOX_PROTO_CONVERT_H

#include <stddef.h>
#include <stdint.h>

#include "fusebox.pb-c.h"
#include "fusebox/common.h"
#include "fusebox/counters.h"
#include "fusebox/ir.h"
#include "health.pb-c.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- arena
 * Bump allocation in blocks; also a ProtobufCAllocator so that unpacking a
 * request costs no per-submessage free. Not thread-safe (one owner).
 *
 * A limit bounds what a decode may make of hostile bytes: protobuf-c's form
 * of a message repeating empty sub-messages is tens of times its wire size.
 * Past limit (bytes of blocks held; 0 = none) an allocation fails, so
 * protobuf_c_message_unpack fails cleanly, and over is set to tell that
 * failure from a malformed message. count, when set, is told of every
 * change in held (+ new blocks, - freed ones), for a server's budget. */

typedef struct fbp_arena_block fbp_arena_block;

#define FBP_ARENA_BIG 8

typedef struct fbp_arena {
  fbp_arena_block *head;
  size_t block_bytes;       /* size of ordinary blocks */
  ProtobufCAllocator pb;    /* allocates from this arena; free is a no-op */
  size_t held;              /* bytes of blocks held (headers included) */
  size_t limit;             /* 0: none */
  int over;                 /* an allocation failed for the limit */
  void (*count)(void *ctx, int64_t delta); /* NULL: none */
  void *count_ctx;
  fbp_arena_block *big[FBP_ARENA_BIG]; /* the last blocks made for one large allocation */
  unsigned nbig;
} fbp_arena;

void fbp_arena_init(fbp_arena *a);
void *fbp_alloc(fbp_arena *a, size_t n);  /* zeroed; NULL when out of memory */
char *fbp_strdup(fbp_arena *a, const char *s);
void fbp_arena_reset(fbp_arena *a);       /* keeps one block for reuse */
void fbp_arena_free(fbp_arena *a);
/* The most fuseboxd lets one request decode to: this many times
 * max_message_bytes. Legitimate requests decode to far less
 * (tests/test_proto.c legitimate_decoded_ratio measures them); empty
 * sub-messages repeated decode to tens of times their bytes. */
#define FBP_DECODE_FACTOR 32
/* Start telling count of held (told the bytes already held at once). */
void fbp_arena_count(fbp_arena *a, void (*count)(void *, int64_t), void *ctx);

/* ---------------------------------------------------------------- byte buffer */

typedef struct fbp_buf {
  uint8_t *p;
  size_t n, cap;
  int oom; /* sticky: an append failed */
} fbp_buf;

void fbp_buf_free(fbp_buf *b);
int fbp_buf_reserve(fbp_buf *b, size_t more);

/* ---------------------------------------------------------------- values */

void fbp_value_to_pb(Fusebox__V1__Value *m, fb_value v); /* initializes m */
int fbp_value_from_pb(const Fusebox__V1__Value *m, fb_value *out); /* FB_EINVAL on bad type */
void fbp_counters_to_pb(Fusebox__V1__Counters *m, const fb_counters *c); /* initializes m */
void fbp_counters_from_pb(const Fusebox__V1__Counters *m, fb_counters *c); /* m may be NULL */

/* ---------------------------------------------------------------- layouts and kernels */

Fusebox__V1__Layout *fbp_layout_to_pb(fbp_arena *a, const fb_layout *l);
/* A new finalized layout, or FB_EINVAL with the reason in err. */
int fbp_layout_from_pb(const Fusebox__V1__Layout *m, fb_layout **out, char *err, size_t errlen);

Fusebox__V1__Kernel *fbp_kernel_to_pb(fbp_arena *a, const fb_kernel *k);
/* A new kernel on layout l (not yet verified), or FB_EINVAL with the
 * reason in err. */
int fbp_kernel_from_pb(const Fusebox__V1__Kernel *m, const fb_layout *l, fb_kernel **out, char *err,
                       size_t errlen);

/* ---------------------------------------------------------------- launch batches
 * A SessionRequest written field by field: append launches, then the tail.
 * Launches are encoded directly (no message structs), so a client batches
 * thousands per message cheaply. */

void fbp_launch_append(fbp_buf *b, int kernel, const fb_value *args, int nargs);
/* A tape mark (SessionRequest.tape): begin over field loss, or end, just
 * before the message's launch number at (0-based). */
void fbp_tape_append(fbp_buf *b, int at, int end, int loss);
void fbp_session_tail(fbp_buf *b, const char *session_id, int flush, uint64_t sync);

/* ---------------------------------------------------------------- field chunks
 * A FieldChunk is written as a header (fields 1-4 and the tag and length of
 * field 5) followed by the data bytes, so the data can be sent from where it
 * lies. FBP_CHUNK_HEADER_MAX bounds the header for ids of up to 64 bytes. */

#define FBP_CHUNK_HEADER_MAX 128

typedef struct fbp_chunk {
  const char *session_id; /* not NUL-terminated: session_id_len bytes */
  size_t session_id_len;
  int32_t field;
  uint64_t offset, total_bytes;
  const uint8_t *data;
  size_t len;
} fbp_chunk;

/* Returns the header length, 0 if session_id is longer than 64 bytes. */
size_t fbp_chunk_header(uint8_t *out, const char *session_id, int32_t field, uint64_t offset,
                        uint64_t total_bytes, size_t data_len);
/* Parse a FieldChunk in place: data points into p. FB_EINVAL (and why in
 * err) when the bytes are not a valid FieldChunk encoding. */
int fbp_chunk_parse(const uint8_t *p, size_t n, fbp_chunk *out, char *err, size_t errlen);
/* Parse only the head of a FieldChunk of total bytes, of which the first
 * avail are in p. When the data field comes last (as every Fusebox peer and
 * protobuf-c write it) and the head parses cleanly, fill out (data NULL,
 * len set) and *data_at (where the data starts) and return 0, so that the
 * caller copies the data from wherever the message lies. Otherwise 1: parse
 * the whole message with fbp_chunk_parse, which has the last word. */
int fbp_chunk_parse_head(const uint8_t *p, size_t avail, size_t total, fbp_chunk *out,
                         size_t *data_at);

/* ---------------------------------------------------------------- status codes
 * FB_E* codes and gRPC status codes (the canonical numbers of grpc/status.h,
 * repeated here so that proto/ needs no gRPC). */

enum {
  FBP_GRPC_OK = 0,
  FBP_GRPC_CANCELLED = 1,
  FBP_GRPC_UNKNOWN = 2,
  FBP_GRPC_INVALID_ARGUMENT = 3,
  FBP_GRPC_DEADLINE_EXCEEDED = 4,
  FBP_GRPC_NOT_FOUND = 5,
  FBP_GRPC_ALREADY_EXISTS = 6,
  FBP_GRPC_PERMISSION_DENIED = 7,
  FBP_GRPC_RESOURCE_EXHAUSTED = 8,
  FBP_GRPC_FAILED_PRECONDITION = 9,
  FBP_GRPC_ABORTED = 10,
  FBP_GRPC_OUT_OF_RANGE = 11,
  FBP_GRPC_UNIMPLEMENTED = 12,
  FBP_GRPC_INTERNAL = 13,
  FBP_GRPC_UNAVAILABLE = 14,
  FBP_GRPC_DATA_LOSS = 15,
  FBP_GRPC_UNAUTHENTICATED = 16
};

#define FBP_CODE_KEY "fusebox-code" /* trailing metadata: the FB_E* code */

int fbp_status_of_code(int fb_code);
int fbp_code_of_status(int grpc_status);

#ifdef __cplusplus
}
#endif
#endif
