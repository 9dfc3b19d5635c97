/* The broker<->session frame protocol (process isolation), both ends.
 *
 * A unix stream socket; each end trusts the other no further than it
 * checks. The broker sends a request frame (wire_req), the protobuf bytes
 * of the client's request as received and, for a field transfer, the
 * staging buffer's memfd (SCM_RIGHTS), which the session process maps; the
 * process answers each request with one reply frame (wire_rep), a message
 * and a packed response, whose lengths the broker bounds by what it asked
 * for (bounds.c). CREATE's payload starts with wire_create; with
 * --worker-uid-base a spare's first frame is wire_ident; checkpoints move
 * in data frames; the compile cache has a socket of its own (wire_cache).
 * The broker alone keeps time (frame_clock). */
#ifndef FBD_SESSION_FRAME_H
#define FBD_SESSION_FRAME_H

#include <stddef.h>
#include <stdint.h>

#include "server/server.h"

#define WIRE_MAGIC 0x46425731u /* "FBW1" */
#define WIRE_MAX_PAYLOAD ((uint64_t)1 << 31)
#define WIRE_MAX_PB ((uint64_t)1 << 30)
/* A checkpoint's stream crosses the socket to the broker in data frames (a
 * wire_rep with this magic and pblen bytes after it, at most DATA_MAX); a
 * restore's stream does not cross it: the RESTORE request carries the
 * checkpoint's file descriptor */
#define DATA_MAGIC 0x46424431u /* "FBD1" */
#define DATA_MAX ((uint64_t)4 << 20)
#define PB_READ_STEP ((size_t)64 << 10) /* a reply's response is read in growing steps */

typedef struct wire_req {
  uint32_t magic;
  int32_t kind;
  int32_t field;
  uint32_t has_fd;
  uint64_t len; /* payload bytes that follow */
  uint64_t buflen; /* WRITE/READ: bytes of the memfd's field data; RESTORE: of the
                      checkpoint stream in the passed file */
} wire_req;

/* CREATE's payload starts with the session's settings, as the broker
 * decided them (the server's limits applied); the CreateSessionRequest
 * follows, whose layout the worker converts and checks itself. */
typedef struct wire_create {
  uint64_t seed, memory_limit;
  uint32_t passes;
  int32_t flush_every, max_fuse_per_task, max_kernel_statements;
  char mode[8];
  char tag[16];
} wire_create;

/* With --worker-uid-base, the first frame a spare reads, when a session
 * takes it: the ids of the session's tenant (the broker's word; the worker
 * checks them against the range it was started with). */
#define IDENT_MAGIC 0x46424931u /* "FBI1" */
typedef struct wire_ident {
  uint32_t magic, uid, gid, pad;
} wire_ident;

typedef struct wire_rep {
  uint32_t magic;
  int32_t code;
  uint32_t finish, fatal;
  uint32_t registered; /* RegisterKernels: how many it registered */
  uint32_t refused; /* BATCH: the request was refused where it was decoded (fbd_reply) */
  uint64_t msglen, pblen;
  fb_counters counters;
} wire_rep;

/* The compile cache's socket (cache.c, worker.c) */
#define CACHE_MAGIC 0x46424331u /* "FBC1" */
#define CACHE_GET 1
#define CACHE_PUT 2
#define CACHE_MAX_TARGET 4096
typedef struct wire_cache {
  uint32_t magic, op;
  uint64_t target_len, ir_len, code_len;
} wire_cache;

/* A broker's deadline for moving one frame to or from a worker. Once a reply
 * has begun (or a request is being sent) its bytes are in memory at the
 * other end, so a worker that stalls mid-frame is stuck or compromised: it
 * must not hold a broker thread. Time the fair scheduler held the session
 * (the worker SIGSTOPped) does not count. The worker's own reads and
 * writes have no clock (NULL): they block, and the broker's end is its end. */
typedef struct frame_clock {
  fbd_session *s; /* whose held time is excluded; NULL: none */
  double t0, held0, limit_s;
} frame_clock;

/* frame.c */
frame_clock fbd_frame_clock_start(fbd_session *s, double limit_s);
int fbd_frame_clock_past(const frame_clock *c);
int fbd_frame_write(int fd, const void *p, size_t n, const frame_clock *clk);
struct iovec;
int fbd_frame_writev(int fd, struct iovec *iov, int n, int pass_fd, const frame_clock *clk);
int fbd_frame_send(int fd, const void *head, size_t hn, int pass_fd, const void *body, size_t bn,
                   const frame_clock *clk);
int fbd_frame_wait(int fd, double spin_s, int step_ms);
int fbd_frame_read(int fd, void *p, size_t n, int *fdout, const frame_clock *clk);
int fbd_frame_read_full(int fd, void *p, size_t n);
int fbd_frame_write_full(int fd, const void *p, size_t n);

#endif
