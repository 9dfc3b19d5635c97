/* libfusebox: the Fusebox client library. Talks to fuseboxd over gRPC
 * (proto/fusebox.proto): sessions, kernels (as IR, or from .fbk source
 * parsed here on the client), pipelined launches, syncs with their results,
 * field reads and writes of any size, server info, stats and health.
 * Link with `pkg-config --libs fusebox`.
 *
 * Model
 *  - An fb_client is one connection (target "host:port" or "unix:PATH").
 *    An fb_remote is one session on it. A session lives while its fb_remote
 *    is open: closing it, or the process dying, frees it on the server.
 *  - Launches are pipelined: fb_remote_launch queues a launch and returns
 *    its sequence number (1, 2, ... per session) at once; queued launches
 *    travel many to a stream message. fb_remote_sync sends what is queued,
 *    waits until the server has run it, and returns the return values of
 *    the kernels that return one, the launches that failed (each with its
 *    sequence number and message) and the session's counters.
 *  - Field reads and writes (and counters) first sync implicitly, so they
 *    see every launch queued before them; what that sync found is kept and
 *    returned by the next fb_remote_sync.
 *  - Ids of fields (place SNode ids of the session's layout) and kernels
 *    (the order of registration) are per session.
 *
 * Errors: functions return 0 (or an id / sequence number >= 0) or a
 * negative FB_E* code; fb_remote_errmsg / fb_client_errmsg say what went
 * wrong, with the server's message when the server refused. An fb_client
 * and its sessions are used by one thread at a time; use one client per
 * thread for parallel work. Nothing here aborts or exits. */
#ifndef FUSEBOX_CLIENT_H
#define FUSEBOX_CLIENT_H

#include <stddef.h>
#include <stdint.h>

#include "fusebox/common.h"
#include "fusebox/counters.h"
#include "fusebox/ir.h"
#include "fusebox/lang.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct fb_client fb_client;
typedef struct fb_remote fb_remote;

/* ---------------------------------------------------------------- connection */

typedef struct fb_client_options {
  int64_t timeout_ms;       /* each blocking call; 0 = 60 s; < 0 = no limit */
  size_t max_message_bytes; /* largest message sent; 0 = 4 MiB */
  size_t chunk_bytes;       /* field transfer chunk; 0 = 1 MiB */
  int batch_launches;       /* launches per stream message at most; 0 = 4096 */
  /* Security (host:port targets; a unix: target is always plain). NULL
   * takes the environment: FUSEBOX_TLS_CA, FUSEBOX_TLS_CERT,
   * FUSEBOX_TLS_KEY, FUSEBOX_TOKEN. A token is not sent in the clear to a
   * host:port off loopback: connecting fails then, unless
   * FUSEBOX_INSECURE=1. */
  const char *tls_ca;       /* PEM file of the CA of the server's certificate: TLS */
  const char *tls_cert;     /* PEM client certificate and key, for mTLS */
  const char *tls_key;
  const char *token;        /* sent as "authorization: Bearer TOKEN" on every call */
  /* 1: calls of a session carry no "fusebox-route" header (the routing key
   * a proxy in front of several replicas hashes on; docs/protocol.md
   * "Replicas"). For one server, and for measuring the key's cost
   * (service_bench --route-key off); a session behind a proxy needs it. */
  int no_route_key;
} fb_client_options;

/* Connect (lazily: the first call reaches the server). opt may be NULL. */
int fb_client_connect(const char *target, const fb_client_options *opt, fb_client **out, char *err,
                      size_t errlen);
void fb_client_close(fb_client *c);
const char *fb_client_errmsg(const fb_client *c);
const char *fb_client_target(const fb_client *c);

/* The standard health check (grpc.health.v1.Health/Check). 0 when the
 * server answers SERVING; *status (may be NULL) gets the ServingStatus
 * number (1 SERVING, 2 NOT_SERVING); *rtt_s the round trip. */
int fb_client_ping(fb_client *c, int *status, double *rtt_s);

typedef struct fb_server_info {
  char version[32];
  char backend[16];
  int cores;
  unsigned max_sessions;
  uint64_t session_memory_limit;
  uint64_t max_message_bytes;
  double uptime_s;
  char listen[512]; /* bound addresses, space-separated */
} fb_server_info;

int fb_client_info(fb_client *c, fb_server_info *out);

typedef struct fb_session_stats {
  char tag[40];          /* first 8 characters of the id (the full id for one's own) */
  uint64_t memory_bytes;
  int attached;          /* its stream is open */
  double idle_s;
  fb_counters counters;
} fb_session_stats;

typedef struct fb_server_stats {
  unsigned sessions_active;
  uint64_t sessions_created, sessions_closed, sessions_disconnected, sessions_reaped,
      sessions_failed;
  uint64_t memory_bytes, memory_peak_bytes; /* field storage of live sessions */
  uint64_t launches, syncs, bad_requests, bytes_in, bytes_out;
  /* calls refused at their start: past max_calls, past max_calls_per_tenant */
  uint64_t calls_refused, tenant_calls_refused;
  double uptime_s;
  fb_session_stats *sessions; /* malloc'd: free with fb_server_stats_free */
  int nsessions;
} fb_server_stats;

int fb_client_stats(fb_client *c, fb_server_stats *out);
void fb_server_stats_free(fb_server_stats *s);

/* Send one message of raw bytes to any method (a path such as
 * "/fusebox.v1.Fusebox/GetInfo"), half-close, and return the first reply
 * message (malloc'd, may be NULL) and the gRPC status. For tools and tests:
 * returns the FB_E* code the status maps to. */
int fb_client_raw_call(fb_client *c, const char *method, const void *req, size_t len, void **resp,
                       size_t *resp_len, int *grpc_status);

/* ---------------------------------------------------------------- sessions */

typedef struct fb_remote_options {
  const char *backend;    /* NULL or "auto", "cpu", "cuda" */
  const char *mode;       /* NULL or "sync", "async" */
  int listgen, demote, fusion, dse; /* -1 default, 0 off, 1 on */
  int flush_every;        /* 0 = default */
  int max_fuse_per_task;
  int compile_threads;    /* 0 = the server's */
  uint64_t seed;
  uint64_t memory_limit;  /* bytes; 0 = the server's per-session limit */
} fb_remote_options;

void fb_remote_options_init(fb_remote_options *o);

/* Open a session over a finalized layout (copied). opt may be NULL. */
int fb_remote_open(fb_client *c, const fb_remote_options *opt, const fb_layout *layout,
                   fb_remote **out);
/* Open a session for a .fbk program: parsed here; the session gets its
 * layout, and kernels are instantiated and registered on first use
 * (fb_remote_kernel). FB_EPARSE with rendered diagnostics in
 * fb_client_errmsg when the source does not parse. */
int fb_remote_open_source(fb_client *c, const fb_remote_options *opt, const char *filename,
                          const char *src, fb_remote **out);
/* The same for a program already parsed; p is borrowed and must outlive r. */
int fb_remote_open_program(fb_client *c, const fb_remote_options *opt, fb_program *p,
                           fb_remote **out);
/* Close the session (queued launches are sent and run first). Returns 0
 * when the server closed it cleanly. */
int fb_remote_close(fb_remote *r);
/* Cancel: the launches sent so far (queued on the server, running, or still
 * on their way: the request names the last one sent) stop at their next
 * task boundary, and the next sync reports each skipped one
 * as FB_ECANCELLED; the session lives on. Launches still buffered in this
 * client (not yet flushed) are not affected. Safe to call from a thread other than the one using r (a
 * signal-handling thread): it touches only r's id and connection. 0, or
 * the FB_E* code of the failure. */
int fb_remote_cancel(fb_remote *r);

const char *fb_remote_errmsg(const fb_remote *r);
const char *fb_remote_id(const fb_remote *r);
/* The replica holding the session (its fusebox-replica answer; "" when the
 * server names none), and how many times the session moved off a draining
 * replica by itself: when its replica drains, the session is checkpointed
 * into a temporary file, restored on the next address of the client's list
 * ("A,B,C" to fb_client_connect) or, behind one address (a proxy), with a
 * new routing key, and goes on there with the same kernel ids; launch
 * sequence numbers start again at 1 (docs/checkpoint.md). */
const char *fb_remote_replica(const fb_remote *r);
int fb_remote_moves(const fb_remote *r);
const fb_layout *fb_remote_layout(const fb_remote *r);
fb_program *fb_remote_program(const fb_remote *r); /* NULL when opened with a layout */
/* The warnings of the program the session was opened with (advice that
 * fails nothing, e.g. fields interleaved in one dense block), rendered as
 * "file:line:col: warning: ..." lines (fb_program_warnings_render);
 * malloc'd, "" when there are none or the session was opened with a
 * layout, NULL when out of memory. */
char *fb_remote_warnings(const fb_remote *r);

/* Register kernels (IR against the session's layout). Returns the kernel
 * id; IR that fails the verifier gives FB_EVERIFY with its messages. */
int fb_remote_add_kernel(fb_remote *r, const fb_kernel *k);
/* Instantiate a program kernel for field bindings (see
 * fb_program_instantiate) and register it once: the same binding gives the
 * same id. */
int fb_remote_kernel(fb_remote *r, const char *name, const char *const *fields, int nfields);
/* A field's id: a program field's component comp (0 for scalars), or,
 * without a program, the place of that name. FB_ENOENT when none. */
int fb_remote_find_field(const fb_remote *r, const char *name, int comp);
/* Automatic differentiation (docs/autodiff.md). The gradient of field x is
 * the field "x.grad" (fb_remote_find_field). fb_remote_kernel_adjoint
 * registers, on the server, the adjoint of a registered kernel ("<name>.grad",
 * launched with the kernel's arguments) and returns its id; once per kernel.
 * A kernel the pass refuses: FB_EVERIFY, the message naming the kernel and
 * what to change. */
int fb_remote_kernel_adjoint(fb_remote *r, int kernel);
/* Forward mode: the tangent of a registered kernel ("<name>.dual", with
 * the kernel's arguments and return value), registered on the server; the
 * dual of field x is the field "x.dual". Once per kernel, refusals as
 * above. */
int fb_remote_kernel_tangent(fb_remote *r, int kernel);
/* A custom gradient: registered kernel adj (taking kernel's parameters) is
 * kernel's adjoint on the server from now on (fb_session_set_kernel_adjoint;
 * RegisterKernelsRequest.custom_adjoints). fb_remote_kernel binds a program
 * kernel declared `kernel k(...) grad k_adj` to k_adj's instance itself. */
int fb_remote_set_kernel_adjoint(fb_remote *r, int kernel, int adj);
/* A tape: launches queued between begin and end are recorded; end makes the
 * server launch the gradients' clears, loss.grad = 1 and each recorded
 * launch's adjoint, newest first. Both are queued among the launches (they
 * take no sequence number) and return 0; their errors (a loss without a
 * gradient, a tape begun twice, an end without a begin: seq 0; a recorded
 * launch whose kernel has no adjoint: that launch's seq) come back from the
 * next fb_remote_sync. */
int fb_remote_tape_begin(fb_remote *r, int loss_field);
int fb_remote_tape_end(fb_remote *r);

/* ---------------------------------------------------------------- launches */

/* Queue a launch; returns its sequence number (> 0). Unknown kernel ids and
 * wrong argument counts are refused here (FB_ENOENT, FB_ETYPE). */
int64_t fb_remote_launch(fb_remote *r, int kernel, const fb_value *args, int nargs);
/* Send what is queued now and ask the server to flush its window. */
int fb_remote_flush(fb_remote *r);

typedef struct fb_launch_return {
  uint64_t seq;
  int kernel;
  fb_value value;
} fb_launch_return;

typedef struct fb_launch_error {
  uint64_t seq;      /* 0: the error is not about one launch */
  int kernel;
  int code;          /* FB_E* */
  const char *msg;
} fb_launch_error;

typedef struct fb_sync_result {
  uint64_t seq;                    /* launches the server has run */
  const fb_launch_return *returns; /* valid until the next sync or close */
  int nreturns;
  const fb_launch_error *errors;
  int nerrors;
  uint64_t returns_dropped, errors_dropped; /* beyond what the server keeps */
  fb_counters counters;
} fb_sync_result;

/* Wait for everything queued. Returns 0, or the code of the first failed
 * launch (its message in fb_remote_errmsg); out (may be NULL) gets it all. */
int fb_remote_sync(fb_remote *r, fb_sync_result *out);
/* Launch, sync, and return the kernel's return value in *ret (may be NULL). */
int fb_remote_call(fb_remote *r, int kernel, const fb_value *args, int nargs, fb_value *ret);
int fb_remote_counters(fb_remote *r, fb_counters *out);

/* ---------------------------------------------------------------- fields
 * A field's flat row-major contents (as fb_field_read): bytes must equal
 * numel * element size. Any size: the bytes travel in chunks. */

/* Named SNodes (`as NAME` in the layout) and fields from the host, in a
 * session opened from a program: target names a named SNode or a field
 * (meaning the SNode that holds its cells); idx gives one cell in the
 * target's index space (nidx indices). Each call is one launch, queued and
 * numbered as fb_remote_launch's (returns its seq), of a kernel the library
 * adds to the program (fb_host_kernel). A refusal (no such target, a dense
 * SNode to deactivate, ...) is FB_ENOENT / FB_EINVAL with a message in
 * the program's terms. */
int64_t fb_remote_activate(fb_remote *r, const char *target, const int64_t *idx, int nidx);
int64_t fb_remote_deactivate(fb_remote *r, const char *target, const int64_t *idx, int nidx);
int64_t fb_remote_deactivate_all(fb_remote *r, const char *target); /* every active cell */

/* The kernels behind them, for in-process sessions too: the program's
 * source with one kernel appended that does op to target (activate or
 * deactivate one cell: parameters fbhost_i0, ... (i32); deactivate_all: none),
 * parsed by the front end. *helper owns *out (fb_program_free it after the
 * session has registered the kernel). Errors as above, in err. */
typedef enum { FB_HOST_ACTIVATE, FB_HOST_DEACTIVATE, FB_HOST_DEACTIVATE_ALL } fb_host_op;
int fb_host_kernel(const fb_program *p, fb_host_op op, const char *target, fb_program **helper,
                   fb_kernel **out, char *err, size_t errlen);
/* The SNode id and index count of target (a field: its SNode). */
int fb_host_target(const fb_program *p, const char *target, int *snode, int *ndim, char *err,
                   size_t errlen);
/* Such a kernel's name in words ("deactivate_all of 'blocks'"); other
 * names are returned as they are. */
const char *fb_host_kernel_shown(const char *kname, char *buf, size_t n);

int fb_remote_field_bytes(const fb_remote *r, int field, size_t *bytes);
int fb_remote_field_read(fb_remote *r, int field, void *dst, size_t bytes);
int fb_remote_field_write(fb_remote *r, int field, const void *src, size_t bytes);

/* Checkpoints (a server started with --checkpoint-key; docs/security.md
 * "Checkpoints on fuseboxd"). fb_remote_checkpoint syncs r, then has the
 * server seal its whole state: path non-NULL, streamed into that file here
 * (a temporary twin, fsync, rename: a failure leaves an earlier file
 * whole); path NULL, kept by the server under --checkpoint-dir, its name
 * written into name (namelen bytes). The session goes on either way.
 * fb_remote_restore makes a new session from such a file (path) or from a
 * name the server keeps (exactly one of the two), checked by the server
 * (seal, owner, format, quotas) before it exists; opt: memory_limit only
 * (may be NULL). The new fb_remote continues exactly where the checkpoint
 * was: its kernel ids are those the checkpointed one had, its program
 * (when it was opened from source) is parsed again. Only checkpoints made
 * by fb_remote_checkpoint bind here (the Python client's carry its own
 * bookkeeping); errors: fb_client_errmsg. */
int fb_remote_checkpoint(fb_remote *r, const char *path, char *name, size_t namelen);
int fb_remote_restore(fb_client *c, const fb_remote_options *opt, const char *path,
                      const char *name, fb_remote **out);

/* ---------------------------------------------------------------- a private fuseboxd
 * Start fuseboxd as a child process listening on listen ("unix:PATH" or
 * "127.0.0.1:0" for a free port), wait until it serves, and return its
 * address. exe NULL looks "fuseboxd" up in PATH; extra_args (NULL-ended,
 * may be NULL) are passed on. The child gets PR_SET_PDEATHSIG (SIGKILL):
 * it dies when the thread that started it ends, or its process (killed
 * too), so start it from a thread that outlives it. out->pid is set as
 * soon as the child exists (for a signal handler to stop it). */

typedef struct fb_daemon {
  int pid;
  char address[512];
} fb_daemon;

int fb_daemon_start(const char *exe, const char *listen, const char *const *extra_args,
                    fb_daemon *out, char *err, size_t errlen);
/* Where fuseboxd is, for a program of this project: $FUSEBOXD if set, else
 * next to the running executable (an installed bin/), else in the build
 * tree's server/ beside the executable's folder, else "fuseboxd" (PATH).
 * Writes the path into out and returns it. */
const char *fb_daemon_find(char *out, size_t n);
/* SIGTERM, then wait (SIGKILL after timeout_s). *exit_status (may be NULL)
 * gets the exit code, or 128 + the signal that ended it. */
int fb_daemon_stop(fb_daemon *d, double timeout_s, int *exit_status);

#ifdef __cplusplus
}
#endif
#endif
