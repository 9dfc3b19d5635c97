/* libfusebox internals: the connection object and the blocking-call helpers
 * shared by client.c (connection, unary calls, info, stats, health) and
 * remote.c (sessions, the Session stream, fields). Every call runs on the
 * client's completion queue and is waited for with grpc_completion_queue_pluck
 * on its own tag, so several calls may be in flight (a stream and a unary
 * call) while one thread drives them. */
#ifndef FUSEBOX_CLIENT_INTERNAL_H
#define FUSEBOX_CLIENT_INTERNAL_H

#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>

#include "fusebox/client.h"
#include "proto/convert.h"
#include "proto/wire.h"

#define FBC_ERRLEN 4096

struct fb_client {
  grpc_channel *ch;
  grpc_completion_queue *cq;
  char *target;
  int64_t timeout_ms;  /* < 0: none */
  size_t max_msg;
  size_t chunk;
  int batch;
  int limits_known;    /* the server's message limit was asked for */
  int no_route;        /* fb_client_options.no_route_key: no fusebox-route header */
  grpc_metadata auth;  /* "authorization: Bearer TOKEN" when nauth */
  size_t nauth;
  char err[FBC_ERRLEN];
  /* an address list "A,B,C" (fb_client_connect): a client per address, the
     first (head) holding them all in peers; a session whose replica drains
     moves to the next (remote.c, move) */
  fb_client *head;     /* the first address's client (itself when single) */
  fb_client **peers;   /* head only: every address's, peers[0] = head */
  int npeers, index;   /* head: how many; each: its place in peers */
};

/* The client of the address after c's in its list (wrapping), or NULL. */
fb_client *fbc_next_address(fb_client *c);

/* Fit chunk and batch sizes under the server's message limit (asked once). */
void fbc_learn_limits(fb_client *c);

/* The end of one call: its gRPC status, the FB_E* code and the message. */
typedef struct fbc_end {
  grpc_metadata_array trailing;
  grpc_status_code status;
  grpc_slice details;
} fbc_end;

void fbc_end_init(fbc_end *e);
void fbc_end_free(fbc_end *e);
/* The FB_E* code (from "fusebox-code" when the server sent one) and the
 * message into err. */
int fbc_end_code(const fbc_end *e, char *err, size_t errlen);

/* Routing to one replica behind a proxy (docs/protocol.md, "Replicas"):
 * every call of a session carries its key in "fusebox-route"; the replica
 * that answers names itself in "fusebox-replica". Once session is set
 * (the session exists), a failure that means its replica is gone
 * (UNAVAILABLE or a proxy's 502/503 with no fusebox-code, a stream reset
 * by a proxy, NOT_FOUND "... (lost or moved)") reads "session S lost:
 * replica R unreachable". */
typedef struct fbc_route {
  char key[33];      /* 32 hex digits, random per session */
  char replica[64];  /* who answered CreateSession ("" before: unknown) */
  const char *session; /* the session's id once it exists, else NULL */
  int draining;      /* an answer said "fusebox-draining": the session should move */
} fbc_route;

/* A fresh random key into rt (FB_EIO when the system has no randomness). */
int fbc_route_init(fbc_route *rt);
/* The replica named in md, if any, into rt. */
void fbc_route_replica(fbc_route *rt, const grpc_metadata_array *md);
/* fbc_end_code, and the lost-session message when e says the replica is gone. */
int fbc_end_route(const fbc_end *e, const fbc_route *rt, char *err, size_t errlen);
/* err: "session S lost: replica R unreachable ..." (FB_EIO). */
int fbc_route_lost(const fbc_route *rt, char *err, size_t errlen);

grpc_call *fbc_call_new(fb_client *c, const char *method, int with_deadline);
/* Make op (GRPC_OP_SEND_INITIAL_METADATA) carry the client's token, if any. */
void fbc_initial_md(fb_client *c, grpc_op *op);
/* The same, with rt's key too (md: room for both, alive until the batch starts). */
void fbc_initial_md_route(fb_client *c, grpc_op *op, grpc_metadata md[2], const fbc_route *rt);
/* Start a batch and wait for it. 1 when it succeeded, 0 when it failed,
 * -1 when it timed out (the call is then cancelled). wait = 0: start only. */
int fbc_batch(fb_client *c, grpc_call *call, const grpc_op *ops, size_t n, void *tag);
int fbc_start(grpc_call *call, const grpc_op *ops, size_t n, void *tag);
int fbc_wait(fb_client *c, grpc_call *call, void *tag);
/* Start RECV_STATUS_ON_CLIENT into e with tag. */
int fbc_start_status(grpc_call *call, fbc_end *e, void *tag);

/* One request, one reply: FB_OK or the code; the reply's bytes into *resp
 * (a slice to unref; may be NULL) and the message into err. */
int fbc_unary(fb_client *c, const char *method, const ProtobufCMessage *req, grpc_slice *resp,
              char *err, size_t errlen);
/* The same for a call of a session: routed by rt (NULL: none), the
 * answering replica noted in it. */
int fbc_unary_route(fb_client *c, fbc_route *rt, const char *method, const ProtobufCMessage *req,
                    grpc_slice *resp, char *err, size_t errlen);

/* host.c: the name of the kernel fb_host_kernel adds for op on target. */
void fbc_host_name(fb_host_op op, const char *target, char *buf, size_t n);

#endif
