/* fuseboxd internals: configuration, the logger, the gRPC call plumbing,
 * sessions with their ordered workers, and the method handlers.
 *
 * Threads and ownership
 *  - Completion-queue threads (cq_threads of them) run every gRPC
 *    completion: they move bytes, decode requests, check what can be checked
 *    without the engine, and post jobs to sessions. They never compile or
 *    launch.
 *  - Each session has one session thread that drains its job queue in order
 *    and is the only thread touching the session's engine state
 *    (fb_session). Responses are handed back to the call, whose sends go out
 *    one at a time from whichever thread queued them or completed the
 *    previous send.
 *  - The main thread waits for signals, reaps idle sessions, joins finished
 *    workers and runs the graceful shutdown.
 *  - A call stays alive while anyone holds a reference: one for the
 *    RECV_CLOSE_ON_SERVER op, one per started batch, one per job or session
 *    that points at it. A session likewise (its table slot, its worker, each
 *    call attached to it).
 * Nothing here is global: the server object carries everything. */
#ifndef FUSEBOX_SERVER_H
#define FUSEBOX_SERVER_H

#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "fusebox/engine.h"
#include "proto/convert.h"
#include "proto/wire.h"

#define FBD_VERSION "0.1.0"
#define FBD_ERRLEN 4096
#define FBD_MAX_LISTEN 8
#define FBD_MAX_KERNELS_PER_SESSION_DEFAULT 4096 /* --max-kernels-per-session */
/* the default of --transport-memory-bytes: memory_budget / 8 within these */
#define FBD_TRANSPORT_MEMORY_MIN (64ull << 20)
#define FBD_TRANSPORT_MEMORY_MAX (1ull << 30)
#define FBD_MAX_CALLS_DEFAULT 4096 /* --max-calls */
/* the transport's limits (h2gate.c, rpc.c): docs/security.md "The transport" */
#define FBD_MAX_CONNECTIONS_DEFAULT 1024
#define FBD_MAX_CONNECTIONS_PER_IP_DEFAULT 16
#define FBD_MAX_STREAMS_PER_CONNECTION_DEFAULT 100
#define FBD_STREAM_RATE_DEFAULT 1000
#define FBD_RESET_RATE_DEFAULT 100
#define FBD_MAX_CALLS_PER_TENANT_DEFAULT 1024 /* --max-calls-per-tenant */
/* the metrics port (metrics.c): connections at once, of one client address, and
 * how long one may live (--metrics-max-connections, --metrics-max-connections-per-ip,
 * --metrics-request-timeout-s) */
#define FBD_METRICS_MAX_CONNECTIONS_DEFAULT 128
#define FBD_METRICS_MAX_CONNECTIONS_PER_IP_DEFAULT 16
#define FBD_METRICS_MAX_CONNECTIONS_LIMIT 65536
#define FBD_METRICS_REQUEST_TIMEOUT_S_DEFAULT 5.0

/* ---------------------------------------------------------------- config */

enum {
  FBD_LOG_ERROR = 0,
  FBD_LOG_WARN,
  FBD_LOG_INFO,
  FBD_LOG_DEBUG
};

/* The walls a session worker raises (session/walls.c), in order; their names are
 * fbd_wall_names[]: what --require-walls and /metrics call them. */
enum {
  FBD_WALL_NETNS,   /* network and IPC namespaces */
  FBD_WALL_ROOTNS,  /* mount namespace with an empty root, and a PID namespace */
  FBD_WALL_UID,     /* the switch to the workers' user */
  FBD_WALL_RLIMITS, /* core dumps, address space, open files */
  FBD_WALL_NNP,     /* no_new_privs */
  FBD_WALL_SECCOMP, /* the system-call filter */
  FBD_NWALLS
};
enum { FBD_WALL_OFF = 0, FBD_WALL_UP, FBD_WALL_DOWN };
extern const char *const fbd_wall_names[FBD_NWALLS];
struct fbd_server;
/* "walls up: ...; down: seccomp (refused: Invalid argument)": for /readyz */
void fbd_walls_text(const struct fbd_server *srv, char *out, size_t n);

typedef struct fbd_config {
  char *listen[FBD_MAX_LISTEN];  /* "host:port" or "unix:PATH" */
  int nlisten;
  char *backend;                 /* auto, cpu, cuda */
  char *cuda_memory;             /* device (default) or managed: CUDA session memory */
  uint64_t device_budget;        /* bytes sessions may hold on the GPU, 0 = 80% of it */
  uint64_t max_message_bytes;    /* largest request message accepted */
  int keepalive_s;               /* server pings an idle connection after this */
  int keepalive_timeout_s;       /* and drops it when no answer within this */
  int max_sessions;
  uint64_t session_memory_limit; /* bytes per session, 0 = unlimited */
  int compile_threads;           /* 0 = one per core */
  int cpu_threads;               /* 0 = one per core */
  int cq_threads;                /* completion-queue threads */
  double idle_timeout_s;         /* sessions idle this long are reaped */
  double shutdown_grace_s;       /* how long running work may finish on SIGTERM */
  double drain_grace_s;          /* SIGTERM/Drain: live sessions go on this long (drain.c) */
  char *replica_name;            /* this replica's name in answers; NULL: the host name */
  int worker_spin_us;            /* a session worker waits this long for work before sleeping */
  int max_kernel_statements;     /* compile budget of one kernel */
  int max_kernels_per_session;   /* kernels a session may register in all */
  char *isolation;               /* "process" (a worker process per session) or "thread" */
  double
      kernel_timeout_s; /* a launch (sync) or a flush's task (async) may run this long; 0 = none */
  double
      compile_timeout_s; /* RegisterKernels (where sync mode compiles) may take this long; 0 = none */
  double worker_reply_timeout_s; /* process isolation: a frame to or from a worker, once
                                    begun, is whole within this, or the worker is killed */
  int spare_workers; /* process isolation: workers kept started for new sessions */
  uint64_t worker_overhead_bytes; /* process isolation: RLIMIT_AS = session memory limit + this */
  uint64_t worker_memory_bytes; /* process isolation: what each worker counts in the memory
                                   budget; 0 = measured by the broker (budget.c) */
  char *worker_user; /* process isolation, fuseboxd run as root: the user (name or uid) workers
                        become; NULL: nobody. A worker itself gets "UID:GID" (session/sandbox.c) */
  uint32_t worker_uid_base; /* fuseboxd run as root: workers of tenant k (auth.c's
                               worker_slot, 0 for no tenant) run as uid and gid base + k;
                               0: off (worker_user) */
  int worker_uid_count; /* the uids base .. base + count - 1 are fuseboxd's */
  char *require_walls; /* process isolation: walls (FBD_WALL_* names, comma-separated, or
                          "all") whose refusal stops fuseboxd at start; NULL: none */
  int strict_sandbox;   /* require_walls all */
  char *worker_walls_off; /* a worker's: walls the broker found refused, which it skips */
  char *test_refuse_walls; /* a test hook: walls to treat as refused, WALL[:ERRNO],... */
  char *worker_namespaces; /* "auto", "on", "net", "off": a network, an IPC, a mount (with
                              an empty root) and a PID namespace per worker, or (net) the
                              first two (session/sandbox.c); a worker itself gets "on", "net" or
                              "off" */
  uint64_t memory_budget; /* everything clients make the server hold (budget.c);
                                    0 = 3/4 of the machine's (or the cgroup's) memory */
  uint64_t code_cache_bytes; /* each engine's code cache bound; 0 = memory_budget / 16,
                                    at most 256M */
  char *code_cache_dir; /* the compile cache on disk (codestore.c); NULL or "": none */
  char *code_cache_key; /* its HMAC key file; NULL: DIR.key, made when missing */
  uint64_t code_cache_disk_bytes; /* its bound, shared among the tenants; 0: none */
  int max_calls; /* calls open at once; past it a call is refused RESOURCE_EXHAUSTED */
  int max_calls_per_tenant; /* the same for each tenant of a tenants file */
  int max_streams_per_connection; /* HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS, every listener */
  /* the HTTP/2 gate on plain host:port listeners (h2gate.c) */
  int max_connections, max_connections_per_ip; /* connections at once */
  int stream_rate; /* new streams a second from one client address (a burst of as many) */
  int reset_rate;  /* RST_STREAMs a second from one client address (a burst of twice) */
  uint64_t transport_memory_bytes; /* gRPC's resource quota: what its transports may hold
                                      (received messages not yet whole among it);
                                      0 = memory_budget / 8, within [64M, 1G] */
  int log_level;
  int log_json; /* --log-format json: one JSON object per line */
  int socket_mode; /* permissions of every unix:PATH socket (default 0660) */
  char *socket_group; /* group (name or gid) of those sockets; NULL: unchanged */
  char *config_path; /* --config FILE, or NULL (SIGHUP re-reads it) */
  /* security and observability (server/tls.c, auth.c, metrics.c); NULL: off */
  char *tls_cert, *tls_key; /* PEM files: TLS on every host:port address */
  char *tls_client_ca; /* PEM file: client certificates required (mTLS) */
  int insecure; /* allow plain TCP on a non-loopback address */
  int private_daemon; /* --private: one user's daemon, started by a client for itself */
  char *tenants; /* tenants file (JSON); NULL: one anonymous tenant */
  char *metrics_listen; /* host:port of the HTTP /metrics, /healthz, /readyz */
  int metrics_max_connections; /* connections the metrics port holds at once; past it
                                  the oldest one still sending its request is closed */
  int metrics_max_connections_per_ip; /* the same for one client address (IPv6: a /64) */
  double metrics_request_timeout_s; /* a metrics connection is closed this long after it
                                       was accepted, however it trickles bytes */
  char *fair_share; /* "on": hold back tenants over their share (sched.c); "off" */
  int fair_slice_ms; /* how far a tenant may run ahead of the least served one */
  int ready_fd; /* -1, or write the bound addresses here when serving */
  /* checkpoints (ckpt.c): where the server keeps them (NULL: nowhere, but
     checkpoints to the client still work with a key), the key that seals
     them (NULL: checkpoints off), make the key file when missing, and how
     often the server checkpoints each live session itself (0: never) */
  char *checkpoint_dir;
  char *checkpoint_key;
  int checkpoint_key_create;
  double checkpoint_every_s;
} fbd_config;

void fbd_config_defaults(fbd_config *c);
void fbd_config_free(fbd_config *c);
/* Read a JSON config file over c. Unknown keys are errors. */
int fbd_config_load(fbd_config *c, const char *path, char *err, size_t errlen);
/* Flags (after --config FILE, which is read first). Returns 0, 1 when
 * --help or --version was printed (exit 0), or FB_EINVAL with err. */
int fbd_config_args(fbd_config *c, int argc, char **argv, char *err, size_t errlen);
int fbd_parse_bytes(const char *s, uint64_t *out); /* "64M", "1G", "4096" */
/* The names of the options whose values differ between a and b (but those
 * listed in skip, a NULL-terminated list), comma-separated into out. */
void fbd_config_changed(const fbd_config *a, const fbd_config *b, const char *const *skip,
                        char *out, size_t n);
void fbd_usage(FILE *f);

/* The isolation mode of cfg: 1 for process, 0 for thread. */
int fbd_isolated(const fbd_config *cfg);
/* --fair-share: 1 for on. */
int fbd_fair_share_on(const fbd_config *cfg);

/* ---------------------------------------------------------------- log
 * One line per event: "<UTC time> <LEVEL> <message>". Safe from any thread. */

typedef struct fbd_log {
  int level;
  int json; /* lines as {"time":...,"level":...,"msg":...} */
  pthread_mutex_t mu;
  FILE *f;
} fbd_log;

void fbd_log_init(fbd_log *l, FILE *f, int level);
void fbd_log_destroy(fbd_log *l);
int fbd_log_level_from_name(const char *s); /* -1 when unknown */
void fbd_logf(fbd_log *l, int level, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

/* ---------------------------------------------------------------- calls */

typedef struct fbd_server fbd_server;
typedef struct fbd_session fbd_session;
typedef struct fbd_job fbd_job; /* a request a session runs in order (below) */
typedef struct fbd_call fbd_call;
typedef struct fbd_proc fbd_proc; /* a session's worker process (server/session/) */

typedef struct fbd_tag {
  void (*fn)(void *obj, int ok);
  void *obj;
} fbd_tag;

/* What a method does at each step of its calls (NULL: nothing). */
typedef struct fbd_method {
  const char *path; /* "/fusebox.v1.Fusebox/Session" */
  void (*on_start)(fbd_call *c); /* default: start receiving */
  void (*on_recv)(fbd_call *c, grpc_byte_buffer *bb); /* bb NULL: client done or failed */
  void (*on_close)(fbd_call *c, int cancelled);
  void (*on_sent)(fbd_call *c); /* send queue ran empty */
  void (*on_free)(fbd_call *c);
  /* a job the call posted ran and left bytes to stream back in chunks
     (session.c run_job; ReadField: j->buf, Checkpoint: j->ck, each taken):
     the session side answers a call upward through this, never by name */
  void (*on_job)(fbd_call *c, fbd_session *s, fbd_job *j);
} fbd_method;

typedef struct fbd_out {
  struct fbd_out *next;
  grpc_byte_buffer *bb;
  size_t counted; /* bytes counted in srv->queued_bytes (our own copies) */
} fbd_out;

struct fbd_call {
  fbd_server *srv;
  const fbd_method *m;
  grpc_call *gc;
  char *peer;
  char *peer_cert; /* PEM of the client certificate the gate's TLS verified (mTLS), or NULL */
  atomic_int refs;
  pthread_mutex_t mu;
  fbd_tag t_recv, t_send, t_close;
  grpc_byte_buffer *rbuf;
  int cancelled; /* set by RECV_CLOSE_ON_SERVER */
  int recv_failed; /* the last receive failed (cancelled, connection lost),
                      not a half-close: see on_recv_done */
  int closed; /* that op completed */
  _Atomic int gone; /* that op completed as cancelled: the client went away, or the call failed */
  /* sending, under mu */
  fbd_out *qh, *qt;
  int qn;
  int sending, md_sent, status_set, status_sent, send_dead;
  grpc_byte_buffer *inflight;
  size_t inflight_counted; /* its bytes in srv->queued_bytes */
  int st_status;
  grpc_slice st_details;
  grpc_metadata st_md[2]; /* fusebox-code, and st_extra when its key is set */
  char st_code[16];
  /* set before the status (drain.c): a second trailer, the retry hint
     (fusebox-retry-after-ms) or why a session ended (fusebox-ended) */
  const char *st_extra_key;
  char st_extra[320];
  struct fbd_tenant *tenant; /* who made the call (auth.c); NULL without a tenants file */
  atomic_int *open_count;    /* counted there: tenant->open_calls or probe_open_calls (rpc.c) */
  int admin; /* sees and may touch every session */
  /* method state */
  fbd_session *sess; /* attached or addressed session (ref held) */
  void *state; /* method-specific, freed by on_free */
};

void fbd_call_ref(fbd_call *c);
void fbd_call_unref(fbd_call *c);
void fbd_call_recv(fbd_call *c);
/* Queue one response message (copied). */
void fbd_call_send(fbd_call *c, const void *p, size_t n);
void fbd_call_send_bb(fbd_call *c, grpc_byte_buffer *bb); /* takes bb */
/* Pack a protobuf-c message and queue it. */
void fbd_call_send_msg(fbd_call *c, const ProtobufCMessage *m);
/* End the call: code is FB_OK or an FB_E* code (mapped to a gRPC status
 * and sent as "fusebox-code"). The first finish wins; later ones are
 * ignored. Queued messages go out first. */
void fbd_call_finish(fbd_call *c, int code, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
void fbd_call_finish_status(fbd_call *c, int grpc_status, int code, const char *msg);
int fbd_call_queued(fbd_call *c); /* messages waiting to go out */
void fbd_call_tags(fbd_call *c); /* a new call's completions (call.c) */

/* ---------------------------------------------------------------- server */

/* What sessions' engines did, summed for /metrics (metrics.c): per SUM
 * counter of FB_COUNTERS (fusebox/counters.h), the growth of each session's
 * reading over its last one, added up (a double, seconds, in whole
 * nanoseconds). A LEVEL counter is read from the live sessions when
 * /metrics is asked for; its member here stays 0. */
typedef struct fbd_counter_sums {
#define FBD_COUNTER_SUM_MEMBER_(name, type, kind, unit, meaning) atomic_uint_fast64_t name;
  FB_COUNTERS(FBD_COUNTER_SUM_MEMBER_)
#undef FBD_COUNTER_SUM_MEMBER_
} fbd_counter_sums;

typedef struct fbd_stats {
  uint64_t sessions_created, sessions_closed, sessions_disconnected, sessions_reaped,
      sessions_failed;
  uint64_t memory_bytes, memory_peak_bytes;
  uint64_t launches, syncs;
} fbd_stats;

struct fbd_server {
  const fbd_config *cfg;
  const struct fbd_session_ops *ops; /* by isolation: fbd_thread_ops or fbd_process_ops */
  fbd_log *log;
  fb_engine *engine;
  const char *backend;
  grpc_server *server;
  grpc_completion_queue *cq;
  pthread_t cq_threads[64];
  int ncq;
  double started;
  char addresses[1024]; /* bound addresses, space-separated */
  char *listen[FBD_MAX_LISTEN];
  int nlisten;
  fbd_tag t_shutdown;
  /* what rpc.c routes calls to by path: methods.c's table (fbd_methods),
     set by start.c */
  const fbd_method *methods;
  size_t nmethods;
  /* under mu */
  pthread_mutex_t mu;
  pthread_cond_t cv;
  atomic_int stopping;
  /* draining (drain.c): no new sessions, /readyz fails, live sessions go on
   * until drain_grace_s; drain_asked: a Drain RPC wants it (main's loop) */
  atomic_int draining, drain_asked;
  char replica[64];       /* the replica's name (--replica-name, else the host name) */
  grpc_metadata replica_md; /* "fusebox-replica: NAME", every call's initial metadata */
  grpc_metadata drain_md[2]; /* the same and "fusebox-draining: NAME", while draining */
  int shutdown_done;
  int nslots; /* outstanding grpc_server_request_call */
  int ncalls; /* live call objects */
  int nsession_threads; /* live session threads */
  fbd_session **sessions; /* the table, max_sessions slots */
  int nsessions;
  pthread_t *zombies; /* finished workers to join */
  int nzombies, zcap;
  fbd_stats st;
  fbd_counter_sums done; /* every session's, since start (metrics.c) */
  uint64_t memory_budget; /* admission control (budget.c; 0 = none) */
  uint64_t code_cache_bytes; /* as asked of the engines (CUDA modules take no bound) */
  struct fbd_codestore *codestore; /* the compile cache on disk; NULL: none */
  uint64_t transport_memory_bytes; /* gRPC's resource quota */
  atomic_uint_fast64_t queued_bytes; /* responses waiting to go out (copies we made) */
  atomic_uint_fast64_t decoded_bytes; /* decoded requests' arenas (methods.c decode_keep) */
  atomic_uint_fast64_t budget_refused; /* requests refused for the budget */
  /* calls refused at their start: past max_calls, past max_calls_per_tenant */
  atomic_uint_fast64_t calls_refused, tenant_calls_refused;
  /* with a tenants file, the calls open with no identity (health checks,
   * which need none): one more tenant for max_calls_per_tenant (rpc.c) */
  atomic_int probe_open_calls;
  /* process isolation (session/spawn.c), under pmu */
  char exe[4096]; /* this fuseboxd, re-executed as each worker */
  char worker_ids[48]; /* "UID:GID" the workers switch to; "": they keep fuseboxd's user */
  int worker_ns; /* WORKER_NS_*: which namespaces of their own workers enter (session/walls.c) */
  /* the sandbox walls (session/walls.c, FBD_WALL_*): FBD_WALL_UP, _DOWN (the kernel
     refused it: workers go on without it) or _OFF (not asked for: namespaces
     off, or no user to switch to), with the refusal's errno; set at start */
  int wall_state[FBD_NWALLS];
  int wall_errno[FBD_NWALLS];
  char walls_off[96]; /* the refused ones a worker skips: --worker-walls-off */
  pthread_mutex_t pmu;
  fbd_proc **spares;
  int nspares;
  /* the memory budget's "workers" part (budget.c): the spares' own memory,
     and the charge of a fresh worker (its measure after its hello), which a
     new session is admitted with before it has a worker */
  _Atomic uint64_t spare_bytes, worker_charge;
  /* counted from any thread, under any lock: atomics */
  atomic_uint_fast64_t bad_requests, bytes_in, bytes_out;
  struct fbd_auth *auth; /* tenants, tokens (auth.c) */
  struct fbd_metrics *metrics; /* the HTTP endpoint (metrics.c), or NULL */
  struct fbd_sched *sched; /* the fair scheduler (sched.c) */
  struct fbd_tls *tls; /* the certificates served, reloaded on SIGHUP (tls.c), or NULL */
  struct fbd_gate *gate; /* the HTTP/2 gate of every host:port listener (h2gate.c), or NULL */
  struct fbd_ckpt *ckpt; /* checkpoints (ckpt.c), or NULL */
  double ckpt_last; /* the periodic checkpoints' last round (the main thread's) */
  /* /metrics: checkpoints written (to the dir or a client), sessions
     restored, checkpoints and restores refused, bytes written and read */
  atomic_uint_fast64_t ckpt_written, ckpt_restored, ckpt_refused, ckpt_bytes_out, ckpt_bytes_in;
};

/* start.c: the server's start and stop, each in one place */
int fbd_server_start(const fbd_config *cfg, fbd_log *log, fbd_server **out, char *err,
                     size_t errlen);
/* rpc.c: the completion-queue threads and (unless rc) the accepting slots */
int fbd_rpc_accept(fbd_server *srv, int rc, char *err, size_t errlen);
void fbd_server_tick(fbd_server *s); /* reap idle sessions, join finished session threads */
/* Graceful: drain, cancel, free everything. FB_EINTERNAL when a session's
 * worker is still busy after the grace period: nothing is freed then, and
 * the process should just exit. */
int fbd_server_shutdown(fbd_server *s);

/* Graceful drain (drain.c). The header a client's routing key travels in
 * and the one that names the replica in every answer (docs/protocol.md). */
#define FBD_ROUTE_KEY "fusebox-route"
#define FBD_REPLICA_KEY "fusebox-replica"
#define FBD_RETRY_KEY "fusebox-retry-after-ms"
/* why a drained session ended, also as a trailer: HAProxy 2.6 turns a
 * stream the server ends before its client half-closed into a reset
 * (RST_STREAM CANCEL), and the status message with it */
#define FBD_ENDED_KEY "fusebox-ended"
/* in every answer's initial metadata while the replica drains: a client
 * moves its session elsewhere at its next call (docs/checkpoint.md) */
#define FBD_DRAINING_KEY "fusebox-draining"
/* Name the replica (cfg->replica_name or the host name) into srv;
 * FB_EINVAL for a name that cannot travel in a header. */
int fbd_replica_init(fbd_server *srv, char *err, size_t errlen);
/* Enter draining (SIGTERM, the Drain RPC): logged once; 1 when it was
 * already draining. */
int fbd_drain_begin(fbd_server *srv, const char *why);
/* Live sessions now. */
int fbd_drain_sessions(fbd_server *srv);
/* The grace is over: end every live session (fbd_drain_end_session, where
 * a checkpoint would be taken), its stream told why with UNAVAILABLE. */
void fbd_drain_end_rest(fbd_server *srv);
/* The retry hint of a refusal while draining, in milliseconds. */
int fbd_drain_retry_ms(void);
void fbd_drain_refusal(fbd_server *srv, char *msg, size_t n);
/* The HTTP/2 gate (h2gate.c): listen on a host:port (tls: TLS terminated
 * by the gate; bound: the address with the port it got), start its thread
 * once gRPC has started, stop taking connections (shutdown begins), free it
 * once gRPC is gone. fbd_gate_set_tls: the SSL_CTX for new TLS handshakes
 * (taken over; the one it replaces is released). */
int fbd_gate_listen(fbd_server *s, const char *addr, int tls, char *bound, size_t bn, char *err,
                    size_t errlen);
int fbd_gate_start(fbd_server *s, char *err, size_t errlen);
void fbd_gate_stop_accepting(fbd_server *s);
void fbd_gate_free(fbd_server *s);
struct ssl_ctx_st;
void fbd_gate_set_tls(fbd_server *s, struct ssl_ctx_st *ctx);
/* "fd:N" -> the client's address; *cert_pem: its verified certificate (mTLS) or NULL */
char *fbd_gate_peer(fbd_server *s, const char *peer, char **cert_pem);
void fbd_server_free(fbd_server *s);
double fbd_now(void); /* monotonic seconds (log.c) */
/* The table of methods (methods.c), which start.c hands to rpc.c: *n entries. */
const fbd_method *fbd_methods(size_t *n);
void fbd_count_bad(fbd_server *s);

/* ---------------------------------------------------------------- buffers
 * Staging buffers for field transfers. Large ones are mapped with huge
 * pages where the kernel offers them, so that filling them costs few page
 * faults. Under process isolation every buffer is a memfd mapping (fd >= 0)
 * that the session's worker process maps too: field bytes cross between
 * the broker and the worker without a copy through a socket. */

typedef struct fbd_buf {
  uint8_t *p;
  size_t len;
  int fd; /* the memfd, or -1 */
} fbd_buf;

int fbd_stage_alloc(size_t n, int shared, fbd_buf *out); /* FB_ENOMEM */
int fbd_memfd_seal(int fd); /* size sealed for good (shrink, grow, seal): FB_EINTERNAL */
uint64_t fbd_stage_total(void); /* bytes of every staging buffer of this process (budget.c) */
void fbd_stage_free(fbd_buf *b); /* and clears it */

/* ---------------------------------------------------------------- execution
 * The engine side of a session: the jobs it runs against its fb_session,
 * in order, each answered by a reply (exec.c). Under thread isolation the
 * session thread runs them in fuseboxd itself; under process
 * isolation the session's worker process runs them (session/proc.c) and sends the
 * replies back. Either way the broker side (session.c, methods.c) turns a
 * reply into messages and the status of the job's call. */

enum {
  FBD_J_CREATE,
  FBD_J_REGISTER,
  FBD_J_BATCH,
  FBD_J_WRITE,
  FBD_J_READ,
  FBD_J_CLOSE,
  FBD_J_END,
  FBD_J_ACTIVE, /* a read of the field's activity mask */
  FBD_J_PARSE, /* process isolation, before CREATE: the source's layout, parsed by the worker */
  FBD_J_DESCRIBE, /* DescribeSource: the session's only job */
  FBD_J_CKPT,    /* a checkpoint: the unsealed stream to the job's sink (ckpt.c) */
  FBD_J_RESTORE  /* a restored session's first job, instead of CREATE */
};

typedef struct fbd_ret {
  uint64_t seq;
  int kernel;
  fb_value v;
} fbd_ret;

typedef struct fbd_err {
  uint64_t seq;
  int kernel;
  int code;
  char *msg;
} fbd_err;

/* What runs now, for kernel_timeout_s and Cancel: written by the engine's
 * task hook in whichever thread runs a task, read by the broker. Under
 * process isolation it lies in memory shared with the worker, so the
 * broker can read it while the worker is busy (and trusts it no further
 * than for a message: the deadline itself is the broker's). */
typedef struct fbd_watch {
  _Atomic uint64_t started_ns; /* CLOCK_MONOTONIC of the running task's start; 0 = idle */
  _Atomic int cancel; /* set by the broker: the hook cancels the next task */
  _Atomic int hold; /* set by the scheduler: the hook waits before the next task */
  char kernel[64]; /* the running launch's kernel (NUL-terminated) */
  char task[192]; /* and its task: the kernel's name, or a fused task's launches */
  /* the memory budget (budget.c): the engine side reports after each job */
  _Atomic uint64_t pending_bytes; /* its async launches not yet run */
  _Atomic uint64_t code_bytes; /* its engine's code cache */
  _Atomic uint64_t pending_cap; /* set by the broker: past this, wait for the launches */
  _Atomic uint64_t kernel_bytes; /* its registered kernels' IR (fb_session_kernel_bytes) */
  _Atomic uint64_t kernel_cap; /* set by the broker before a register: the most they may hold */
  _Atomic int64_t kernels_left; /* set by the broker before a register: how many more the
                                   session may register (max_kernels_per_session); -1: any */
} fbd_watch;

typedef struct fbd_exec {
  fb_engine *engine;
  fb_session *es; /* NULL until CREATE succeeded */
  fb_layout *layout; /* not owned */
  fb_session_config ecfg;
  char mode[8];
  const char *tag; /* for log lines */
  fbd_log *log;
  fbd_watch *watch; /* not owned */
  uint64_t seq; /* launches received */
  uint64_t eng_launches; /* launches the engine accepted (its launch numbers) */
  int nkernels; /* kernels registered in es (ids 0 .. nkernels - 1) */
  struct fbd_seqmap {
    uint64_t eng, seq;
    int one; /* from eng to the next entry every launch has seq (a tape's end) */
  } *smap; /* where the two numberings part */
  int nsmap, smcap;
  fbd_ret *rets;
  int nrets, rcap;
  uint64_t rets_dropped;
  fbd_err *errs;
  int nerrs;
  uint64_t errs_dropped;
  /* a source's parse (source.c): how long it may take (0: no bound), and the
   * flag that says its client went away (thread isolation: the running
   * job's call; NULL in a worker process, whose broker sets watch->cancel) */
  double parse_timeout_s;
  _Atomic int *gone;
} fbd_exec;

/* What one SyncResult may list (exec.c keeps at most these; the broker
 * bounds a worker's sync reply by them, session/bounds.c fbd_reply_cap). */
#define FBD_SYNC_MAX_ERRS 64 /* launch errors kept per sync */
#define FBD_SYNC_MAX_RETS (1 << 20) /* return values kept per sync */

/* The answer to one job. */
typedef struct fbd_reply {
  int code; /* FB_OK or FB_E*: the call's status when finish is set */
  int finish; /* end the call with code (else only send pb) */
  int fatal; /* the session cannot go on (its engine session is gone) */
  char msg[FBD_ERRLEN];
  uint8_t *pb; /* a packed response message to send first, or NULL (malloc) */
  size_t pblen;
  fb_counters counters; /* the session's after the job */
  uint32_t registered; /* RegisterKernels: the kernels it registered (source instances too) */
  int refused; /* the request itself was refused (malformed, or over the decode limit) where
                  it was decoded: the broker counts it bad and ends the stream (proc.c) */
} fbd_reply;

/* A request's decode, where it is decoded once: under FBP_DECODE_FACTOR x
 * max_message_bytes (0: no limit), refused in the words the broker uses
 * for the requests it decodes itself (INVALID_ARGUMENT "malformed request:
 * N bytes that are not a valid ...", RESOURCE_EXHAUSTED "... decodes to
 * more than ..."). NULL with r finished and refused set. */
void *fbd_exec_decode(const ProtobufCMessageDescriptor *d, fbp_arena *a, const uint8_t *p,
                      size_t n, uint64_t max_message_bytes, fbd_reply *r);
/* The limit itself, and the two refusals' words (over: past the limit). */
uint64_t fbd_decode_cap(uint64_t max_message_bytes);
void fbd_decode_refusal(char *err, size_t errlen, const char *name, size_t n, int over,
                        uint64_t limit, uint64_t max_message_bytes);

void fbd_exec_init(fbd_exec *x, fb_engine *e, fb_layout *l, const fb_session_config *ecfg,
                   const char *tag, fbd_log *log, fbd_watch *watch);
void fbd_exec_free(fbd_exec *x); /* destroys the engine session */
/* Run one job: msg is the decoded request (CREATE: unused; REGISTER:
 * RegisterKernelsRequest; BATCH: SessionRequest); buf the field's bytes of a
 * WRITE, or where a READ puts them. */
void fbd_exec_run(fbd_exec *x, int kind, const void *msg, int field, uint8_t *buf, size_t len,
                  fbd_reply *r);
void fbd_reply_clear(fbd_reply *r);
/* The parses of a source (source.c) within x's limits, for the jobs that
 * run before an engine session exists: DescribeSource's reply, and the
 * layout of a CreateSessionRequest (its bytes; its source's, or its own). */
void fbd_exec_describe(fbd_exec *x, const uint8_t *bytes, size_t n, fbd_reply *r);
int fbd_exec_parse(fbd_exec *x, const uint8_t *bytes, size_t n, fb_layout **out, char *err,
                   size_t errlen);

/* A checkpoint of x's session into sink (the unsealed stream), and a
 * restore: x (initialized with the restoring side's limits) gets the
 * session src holds. r says how it went (a failed restore is fatal). */
void fbd_exec_checkpoint(fbd_exec *x, fb_sink_fn sink, void *user, fbd_reply *r);
int fbd_exec_restore(fbd_exec *x, fb_source_fn src, void *user, fbd_reply *r);

/* Field bytes of a place (numel * element size); FB_EINVAL/ENOENT with err. */
int fbd_field_bytes(const fb_layout *l, int field, uint64_t *bytes, char *err, size_t errlen);

/* ---------------------------------------------------------------- sessions */

enum {
  FBD_LIVE = 0,
  FBD_ENDING,
  FBD_DEAD
};

/* Why a session ended (stats and logs). */
enum {
  FBD_END_CLOSED = 0,
  FBD_END_DISCONNECTED,
  FBD_END_REAPED,
  FBD_END_SHUTDOWN,
  FBD_END_FAILED,
  FBD_END_CRASHED,
  FBD_END_TIMEOUT,
  FBD_END_CANCELLED,
  FBD_END_DRAINED
};

typedef struct fbd_job {
  struct fbd_job *next;
  int kind;
  fbd_call *call; /* ref held; answered by the worker */
  fbp_arena arena; /* owns msg */
  void *msg; /* the decoded request */
  grpc_slice raw; /* its bytes, for a worker process (empty when none) */
  fbd_buf buf; /* WRITE: the field's bytes */
  int field;
  uint32_t chunk;
  int reason; /* END */
  double posted_at; /* when it was queued (sync latency) */
  uint64_t first_launch; /* BATCH: the session's number of its first launch (0: none) */
  /* BATCH: what the broker accounts and routes on, read from the message's
     bytes (fbp_session_scan) under process isolation, where msg stays NULL
     and the session process decodes raw once; from msg under thread
     isolation, where the completion-queue thread decodes it once */
  size_t n_launches;
  uint64_t sync;
  /* CKPT: where the unsealed stream goes (the broker's side: the seal);
     RESTORE: the stream's bytes (src, the first len bytes of fd) */
  fb_sink_fn sink;
  void *sink_user;
  struct fbd_ckpt_job *ck; /* ckpt.c: the checkpoint's state (the job's; freed with it) */
  struct fbd_ckpt_wait *wait; /* CKPT: someone waits for its name (the drain hook) */
} fbd_job;

struct fbd_session {
  fbd_server *srv;
  char id[33];
  char tag[9];
  atomic_int refs;
  fb_layout *layout; /* immutable after creation: any thread may read it */
  uint64_t mem_bytes;
  fb_session_config ecfg;
  char mode[8];
  char *peer;
  _Atomic(struct fbd_tenant *) owner; /* auth.c: set once at creation; NULL: anonymous */
  /* under mu */
  pthread_mutex_t mu;
  pthread_cond_t cv;
  fbd_job *qh, *qt;
  int depth;
  atomic_int queued; /* depth, for the worker's spin without the lock */
  atomic_int has_stream;
  uint64_t posted, done;
  int state;
  int busy;
  int recv_paused;
  fbd_call *stream; /* the attached Session stream (ref held) */
  double last_active;
  double ckpt_at; /* its last checkpoint into the directory (the periodic ones) */
  uint8_t *client_state; /* the latest CheckpointRequest.client_state (malloc) */
  size_t nclient_state;
  double abort_at; /* when fbd_session_abort ended it (0: not aborted) */
  uint64_t cancel_upto; /* jobs up to this number (posted) run cancelled */
  uint64_t launches_posted; /* launches in the jobs posted so far */
  uint64_t cancel_launches; /* jobs holding a launch numbered up to this run cancelled
                               (Cancel's through_launch: launches not received yet) */
  fb_counters snap;
  struct fbd_stage {
    fbd_buf b;
    double used;
  } stage[2]; /* kept for reuse */
  /* the session thread (and, for watch->cancel, Cancel) */
  pthread_t th;
  fbd_watch *watch; /* thread isolation: in the heap; process: shared with the worker */
  fbd_exec x; /* thread isolation: the engine side */
  fbd_proc *proc; /* process isolation: the worker process */
  int created;
  int describe; /* a DescribeSource's session: one job, never created, not counted */
  int dead; /* its engine side is gone: the worker ends the session */
  uint64_t accounted; /* bytes counted in the server's memory_bytes */
  _Atomic uint64_t pending_bytes, code_bytes; /* from its watch after each job (budget.c) */
  _Atomic uint64_t kernel_bytes; /* the same: its kernels' IR */
  /* process isolation, the broker's measures of its worker (never the
     worker's word): its memory when fresh (the charge it was admitted with
     until its hello), and its resident private memory now (0: not yet) */
  _Atomic uint64_t worker_base, worker_rss;
  int nkernels; /* kernels its RegisterKernels registered (the session thread's) */
  int end_reason;
  char end_why[256]; /* a crashed or timed-out session: what happened */
  int drained; /* under mu: ended by a drain (drain.c); end_why says so */
  struct fbd_share *share; /* sched.c: its tenant's state (the session thread sets it) */
  struct fbd_run *run; /* sched.c, under its lock: the job running now, or NULL */
};

fbd_job *fbd_job_new(int kind, fbd_call *call); /* refs call (may be NULL) */
void fbd_job_free(fbd_job *j);
/* Create a session (not yet in the engine) and its worker; it joins the
 * table, owned by owner (NULL: anonymous). FB_EQUOTA at the session limit
 * or past the memory budget. Takes layout. */
int fbd_session_new(fbd_server *srv, fb_layout *layout, const fb_session_config *ecfg,
                    struct fbd_tenant *owner, const char *peer, fbd_session **out, char *err,
                    size_t errlen);
/* fbd_session_new for call c, its tenant's admission first (auth.c
 * fbd_auth_admit_begin: FB_EQUOTA with err naming the limit). Takes l. */
int fbd_session_new_for(fbd_call *c, fb_layout *l, fb_session_config *ec, fbd_session **out,
                        char *err, size_t errlen);
fbd_session *fbd_session_find(fbd_server *srv, const char *id, size_t n); /* ref'd or NULL */
void fbd_session_ref(fbd_session *s);
void fbd_session_unref(fbd_session *s);
/* Queue a job; FB_ENOENT when the session has ended (job untouched). */
int fbd_session_post(fbd_session *s, fbd_job *j);
/* End the session now for reason: queued jobs are answered at once (not
 * run), running work stops at its next task boundary (process isolation:
 * its worker is killed when it does not stop within a second). */
void fbd_session_abort(fbd_session *s, int reason, const char *why);
/* Cancel: queued jobs run cancelled, the running one stops at its next task
 * boundary, and so do jobs holding launches numbered up to through_launch
 * (0: none) that arrive later; the session lives on. The number of jobs
 * pending, -1 when the session has ended, -2 (nothing done) when
 * through_launch is more than FBD_CANCEL_AHEAD past the launches received:
 * no client has that many on their way, and honouring it would cancel the
 * session's launches for good. */
#define FBD_CANCEL_AHEAD ((uint64_t)1 << 24)
int fbd_session_cancel(fbd_session *s, uint64_t through_launch);
/* Attach c as the session's stream; FB_EINVAL if one is attached. */
int fbd_session_attach(fbd_session *s, fbd_call *c);
/* After posting from a stream: 1 to receive the next message now, 0 when
 * the worker will resume receiving once it catches up. */
int fbd_session_may_recv(fbd_session *s);
/* A paused stream receives again once its request and response queues are
 * short (called as jobs are taken and as responses go out). */
int fbd_session_resume(fbd_session *s);
void fbd_session_end_all(fbd_server *srv, int reason);
/* End s once the work it received has run, its stream finished with why
 * (reason FBD_END_DRAINED: UNAVAILABLE); FB_ENOENT when it is ending already. */
int fbd_session_end_with(fbd_session *s, int reason, const char *why);
int fbd_sessions_drained(fbd_server *srv, const uint64_t *marks, int n);
void *fbd_session_thread_main(void *arg);
void fbd_session_stats_pb(fbd_session *s, fbp_arena *a, Fusebox__V1__SessionStats *out,
                          int full_id);

/* A session keeps its last two staging buffers for the next transfers of
 * the same size (a read's buffer may still be on its way out when the next
 * write begins), so repeated reads and writes of a field touch no fresh
 * pages; the reaper frees them after a short idle time. Thread-safe. */
int fbd_stage_take(fbd_session *s, size_t n, fbd_buf *out, const char *what, char *err,
                   size_t errlen); /* FB_EQUOTA over the budget, FB_ENOMEM; err says */
void fbd_stage_give(fbd_session *s, fbd_buf *b); /* and clears *b */

/* Stream a field's bytes (buf, staged for session s, taken) out on a ReadField
 * call; the buffer goes back to s when gRPC is done with it. */
void fbd_read_begin(fbd_call *c, fbd_session *s, fbd_buf *buf, uint32_t chunk);

/* ---------------------------------------------------------------- session operations
 * One table of what the broker asks of a session's engine side, with a
 * thread implementation (fbd_thread_ops, session/thread.c: the session
 * thread runs exec.c itself) and a process implementation
 * (fbd_process_ops, session/proc.c: the session's worker runs it). The
 * server picks one at start by --isolation (fbd_server.ops); the broker's
 * files run a session's work through it; what still reads the isolation
 * (fbd_isolated) is policy: the budget's worker processes part (budget.c),
 * a request's bytes kept for the worker (methods.c), the spares (start.c). */
typedef struct fbd_session_ops {
  const char *name;  /* "thread", "process" */
  const char *serving; /* how sessions run, in fuseboxd's line at start (main.c) */
  int staging_memfd; /* staging buffers are memfds a worker maps (fbd_stage_alloc) */
  /* a job's request bytes are kept with it (j->raw, methods.c decode_job):
     the worker decodes them again (process) */
  int keep_request;
  /* The memory budget's figures of what a session's engine side holds
     outside the broker's engine (budget.c): what a new session's worker is
     charged from its admission on, before it has one (process:
     worker_memory_bytes, else the last fresh worker's measure; thread: 0,
     no worker); under srv->mu, what s's worker holds: its engine's JIT code
     (*code, the JIT code part) and its own memory (*own, the workers part;
     thread: 0 and 0, its JIT code is in the broker's engine's code cache) */
  uint64_t (*charge)(fbd_server *srv);
  void (*held_locked)(fbd_session *s, uint64_t *code, uint64_t *own);
  int (*open)(fbd_session *s); /* at fbd_session_new: its watch page (thread) */
  /* before CREATE, DESCRIBE and RESTORE: a worker for s (process) */
  int (*attach)(fbd_session *s, char *err, size_t errlen);
  /* a source's layout (*out new), or FB_E* with r finished as fatal */
  int (*parse)(fbd_session *s, fbd_job *j, fb_layout **out, fbd_reply *r);
  void (*create)(fbd_session *s, fbd_job *j, fbd_reply *r); /* the engine session */
  void (*describe)(fbd_session *s, fbd_job *j, fbd_reply *r); /* DescribeSource */
  /* a checked checkpoint into s; its layout in *out (new) */
  void (*restore)(fbd_session *s, fbd_job *j, fb_layout **out, fbd_reply *r);
  void (*run)(fbd_session *s, fbd_job *j, fbd_reply *r); /* every other job */
  void (*signal)(fbd_session *s, int sig); /* the scheduler's SIGSTOP/SIGCONT */
  void (*sample)(fbd_session *s);          /* the budget's workers part (the reaper) */
  void (*release)(fbd_session *s);         /* as s is freed: its watch page, its worker */
} fbd_session_ops;
extern const fbd_session_ops fbd_thread_ops, fbd_process_ops;

/* ---------------------------------------------------------------- worker processes
 * Process isolation (server/session/). The broker keeps spare_workers workers
 * started (fuseboxd re-executed with --session-worker FD, the engine made,
 * then locked down) so that a session gets one at once. */

/* Settings that only make sense together (--worker-uid-base needs process
 * isolation and a count): FB_EINVAL naming the option. */
int fbd_procs_check(const fbd_config *cfg, char *err, size_t errlen);
int fbd_procs_start(fbd_server *srv, char *err, size_t errlen); /* the spares */
void fbd_procs_tick(fbd_server *srv); /* reap dead spares, start missing ones */
void fbd_procs_stop(fbd_server *srv); /* kill and reap the spares */
/* Give s a worker process and run CREATE in it. */
int fbd_proc_attach(fbd_session *s, char *err, size_t errlen);
/* CREATE in s's new worker: the session's settings and the request. */
void fbd_proc_create(fbd_session *s, fbd_job *j, fbd_reply *r);
/* PARSE (before CREATE, for a source): the layout the worker parsed, checked
 * (*out new), or FB_E* with r finished as fatal. */
int fbd_proc_parse(fbd_session *s, fbd_job *j, fb_layout **out, fbd_reply *r);
/* Run one job in s's worker: the reply, or FB_EIO/FB_ETIMEOUT with r->fatal
 * set when the worker died or was killed (r->msg says why). */
void fbd_proc_run(fbd_session *s, fbd_job *j, fbd_reply *r);
void fbd_proc_free(fbd_proc *p); /* kill (if alive) and reap */
/* The resident private memory of p's worker (anonymous pages: its heap,
 * stacks, engine and JIT code; not the shared libraries' pages nor the
 * memfds it shares with the broker), read by the broker from
 * /proc/PID/statm: 0 and *bytes, or FB_EIO when it cannot be read (the
 * worker is gone). */
int fbd_proc_measure(fbd_proc *p, uint64_t *bytes);
/* Measure s's worker into s->worker_rss (the reaper's tick, any thread:
 * s->mu guards s->proc against the session's end). */
void fbd_proc_sample(fbd_session *s);
/* Under srv->mu: what session s's worker is charged in the memory budget's
 * workers part (budget.c; the process implementation's held_locked): its
 * fresh measure, or what it holds now beyond the session's other parts. */
uint64_t fbd_budget_worker_part_locked(fbd_server *srv, fbd_session *s);
/* Send sig to p's worker through its pidfd (never to a reused pid); a
 * worker already gone, or no pidfd, is left alone. */
void fbd_proc_signal(fbd_proc *p, int sig);
/* The worker side: main() of fuseboxd --session-worker FD. Never returns. */
void fbd_worker_process_main(int fd, const fbd_config *cfg);

/* ---------------------------------------------------------------- the memory budget (budget.c)
 * One budget for everything a client can make the server hold: session
 * memory, staging buffers, queued responses, pending async launches,
 * JIT code, decoded requests and registered kernels, in the broker and (process isolation) in
 * the workers, which report theirs through the watch page after each job. */

enum {
  FBD_MEM_SESSIONS = 0,
  FBD_MEM_STAGING,
  FBD_MEM_QUEUED,
  FBD_MEM_PENDING,
  FBD_MEM_CODE,
  FBD_MEM_DECODED,
  FBD_MEM_KERNELS,
  FBD_MEM_WORKERS,
  FBD_MEM_NPARTS
};
extern const char *const fbd_mem_part_names[FBD_MEM_NPARTS]; /* "sessions", ... */
extern const char *const fbd_mem_part_keys[FBD_MEM_NPARTS]; /* metric labels */

void fbd_budget_usage_locked(fbd_server *srv, uint64_t part[FBD_MEM_NPARTS]); /* srv->mu held */
void fbd_budget_usage(fbd_server *srv, uint64_t part[FBD_MEM_NPARTS]);
/* Under srv->mu: 0 when need more bytes fit in the budget, else FB_EQUOTA
 * (counted in budget_refused) and err for whom the bytes are (who, the
 * owner tenant; NULL: anonymous). With all (fbd_auth_sees_all, asked
 * before srv->mu is taken) it names every part: "memory budget 2.0 GiB is
 * full: sessions 1.5 GiB, ...; WHAT of 512 MiB refused (memory_budget)";
 * without, only what that tenant may know: the budget, what its own
 * sessions hold, what was refused. The parts always go to the log. */
int fbd_budget_admit_locked(fbd_server *srv, uint64_t need, const char *what,
                            const struct fbd_tenant *who, int all, char *err, size_t errlen);
/* Before a job of an async session: how many bytes of pending launches it
 * may hold (its own now plus what the budget has free). */
uint64_t fbd_budget_pending_cap(fbd_server *srv, fbd_session *s);
/* Before a RegisterKernels: how many bytes s's kernels may hold in all
 * (what they hold now plus what the budget has free). */
uint64_t fbd_budget_kernel_cap(fbd_server *srv, fbd_session *s);
void fbd_budget_note(fbd_session *s); /* after a job: take the watch's figures */
/* a figure a worker reported, capped at what its process could hold */
uint64_t fbd_budget_reported(const fbd_session *s, uint64_t v);
void fbd_fmt_bytes(char *out, size_t n, uint64_t v); /* "2.0 GiB", "512 MiB", "0 B" */
/* The compile cache on disk (codestore.c, docs/code-cache.md): made at
 * start when code_cache_dir is set (its key read or made, the engine given
 * the store); tenants' names for /metrics; each tenant's counters, one
 * line per counter and tenant through line. */
typedef struct fbd_codestore fbd_codestore;
int fbd_codestore_start(fbd_server *srv, char *err, size_t errlen);
void fbd_codestore_free(fbd_codestore *s);
void fbd_codestore_name(fbd_codestore *s, uint64_t partition, const char *tenant);
/* The store's get and put (fusebox/codestore.h) for a partition: what the
 * broker answers a worker's requests with (session/cache.c). NULL s: a miss. */
int fbd_codestore_get(fbd_codestore *s, uint64_t partition, const char *target, const char *ir,
                      size_t irlen, uint8_t **code, size_t *len);
void fbd_codestore_put(fbd_codestore *s, uint64_t partition, const char *target, const char *ir,
                       size_t irlen, const uint8_t *code, size_t len);
void fbd_codestore_metrics(fbd_codestore *s,
                           void (*line)(void *u, const char *name, const char *type,
                                        const char *help),
                           void (*value)(void *u, const char *name, const char *tenant,
                                         unsigned long long v),
                           void *u);

/* The code cache bound: code_cache_bytes, or budget / 16 at most 256M. */
uint64_t fbd_code_cache_bytes(const fbd_config *cfg, uint64_t budget);
/* gRPC's resource quota: transport_memory_bytes, or budget / 8 within [64M, 1G]. */
uint64_t fbd_transport_memory_bytes(const fbd_config *cfg, uint64_t budget);
/* What GetStats says about the budget (into r, allocated in a). */
void fbd_budget_stats_pb(fbd_server *srv, fbp_arena *a, Fusebox__V1__ServerStats *r);

/* ---------------------------------------------------------------- the fair scheduler (sched.c)
 * Every job of a session passes fbd_sched_enter before it runs and
 * fbd_sched_leave after: per-tenant compile slots (max_compiles), fair
 * shares of device time between tenants (time_share), latency histograms. */

typedef struct fbd_run {
  struct fbd_run *next;
  fbd_session *s;
  struct fbd_share *sh; /* NULL: not scheduled (no memory) */
  double started, last; /* admitted; charged up to */
  double paused_at, held_s; /* paused since; paused in all */
  int paused, exempt, compile;
} fbd_run;

int fbd_sched_start(fbd_server *srv, char *err, size_t errlen);
void fbd_sched_stop(fbd_server *srv);
/* Wait until s's tenant may run a job of this kind (blocks). */
void fbd_sched_enter(fbd_session *s, int kind, fbd_run *r);
void fbd_sched_leave(fbd_session *s, fbd_run *r, int kind, int sync, double posted_at);
/* s is cancelled or ending: its job runs on unpaused, its waits end. */
void fbd_sched_kick(fbd_session *s);
/* Seconds the job s runs now was paused (not counted against timeouts). */
double fbd_sched_held(fbd_session *s);
/* The scheduler's part of /metrics (malloc'd), or NULL when out of memory. */
char *fbd_sched_metrics(fbd_server *srv);

/* ---------------------------------------------------------------- .fbk source (source.c)
 * The front end on the server: run where the tenant's work runs (its
 * worker process, or its session thread), never on a completion-queue
 * thread. */

#define FBD_SOURCE_INSTANCES 4096 /* kernel instances one RegisterKernels may make of a source */
/* the most bytes a worker's answer to a parse may have: a layout or a
 * SourceInfo, whose names all come from a source of at most 1 MiB */
#define FBD_SOURCE_REPLY_MAX ((uint64_t)8 << 20)

/* What one parse may take besides the front end's own limits: a deadline
 * (0: none) and two flags that stop it (NULL: none). */
typedef struct fbd_parse_limits {
  double deadline; /* fbd_now() seconds */
  char deadline_why[96];
  _Atomic int *cancel; /* the watch page's: Cancel, the session's end */
  _Atomic int *gone; /* the call's: its client went away (thread isolation) */
} fbd_parse_limits;
void fbd_parse_limits_init(fbd_parse_limits *pl, double timeout_s, _Atomic int *cancel,
                           _Atomic int *gone);

/* CreateSession: the layout of the request's source, or its layout when it
 * has none (new), or FB_E* with the diagnostics in err. */
int fbd_source_layout(const Fusebox__V1__CreateSessionRequest *m, const fbd_parse_limits *pl,
                      fb_layout **out, char *err, size_t errlen);
/* RegisterKernels: the kernels to register, m's own followed by the
 * instances of its source (allocated in a; m's own array when it has no
 * source), or FB_E* with the diagnostics in err. */
int fbd_source_expand(const Fusebox__V1__RegisterKernelsRequest *m, const fb_layout *session_layout,
                      const fbd_parse_limits *pl, fbp_arena *a, Fusebox__V1__Kernel ***out,
                      size_t *nout, char *err, size_t errlen);
/* DescribeSource: bytes are a fusebox.v1.Source; the reply carries the
 * packed SourceInfo, or the error. */
void fbd_source_describe(const uint8_t *bytes, size_t n, const fbd_parse_limits *pl,
                         fbd_reply *r);

/* ---------------------------------------------------------------- checkpoints (ckpt.c) */


#define FBD_CKPT_STATE_MAX ((size_t)64 << 10) /* CheckpointRequest.client_state */
typedef struct fbd_ckpt_job fbd_ckpt_job;
int fbd_ckpt_start(fbd_server *srv, char *err, size_t errlen); /* the key, the directory */
void fbd_ckpt_free(fbd_server *srv);
int fbd_ckpt_enabled(const fbd_server *srv);     /* a key: checkpoints work */
int fbd_ckpt_dir_enabled(const fbd_server *srv); /* and a directory */
int fbd_ckpt_name_ok(const char *name);          /* a name the server gives */
const char *fbd_ckpt_owner(const struct fbd_tenant *t); /* what the seal binds: "" anonymous */
/* A checkpoint being written: to the tenant's directory (to_dir) or to a
 * memfd counted in the memory budget; the client state goes first. */
int fbd_ckpt_begin(fbd_server *srv, const struct fbd_tenant *owner, const char *tag, int to_dir,
                   const void *state, size_t nstate, fbd_ckpt_job **out, char *err,
                   size_t errlen);
int fbd_ckpt_sink(void *user, const void *buf, size_t n); /* fb_sink_fn: the engine's stream */
int fbd_ckpt_failed(const fbd_ckpt_job *k, char *why, size_t n); /* the sink's failure, or 0 */
/* Seal, fsync, rename (keep_two: the session's two newest stay); a memfd is
 * mapped for fbd_ckpt_map. */
int fbd_ckpt_finish(fbd_ckpt_job *k, int keep_two, char *err, size_t errlen);
void fbd_ckpt_end(fbd_ckpt_job *k); /* frees; a file not finished is removed */
const char *fbd_ckpt_name(const fbd_ckpt_job *k);
uint64_t fbd_ckpt_bytes(const fbd_ckpt_job *k);
const uint8_t *fbd_ckpt_map(const fbd_ckpt_job *k);
const uint8_t *fbd_ckpt_state(const fbd_ckpt_job *k, size_t *n);
int fbd_ckpt_fd(const fbd_ckpt_job *k);
void fbd_ckpt_set_map(fbd_ckpt_job *k, uint8_t *p); /* a mapping of its bytes, unmapped at end */
/* Restore's sources: an upload (a memfd, counted in the budget, at most max
 * bytes; 0: no bound) or a name in the owner's directory (check: its seal
 * too); after either, fbd_ckpt_source gives the engine's stream. */
int fbd_ckpt_upload_begin(fbd_server *srv, const struct fbd_tenant *owner, fbd_ckpt_job **out,
                          char *err, size_t errlen);
int fbd_ckpt_upload(fbd_ckpt_job *k, uint64_t offset, const void *p, size_t n, uint64_t max,
                    char *err, size_t errlen);
int fbd_ckpt_upload_end(fbd_ckpt_job *k, char *err, size_t errlen); /* checks the seal */
int fbd_ckpt_open(fbd_server *srv, const struct fbd_tenant *owner, const char *name, int check,
                  fbd_ckpt_job **out, char *err, size_t errlen);
long fbd_ckpt_source(void *user, void *buf, size_t n); /* fb_source_fn */
uint64_t fbd_ckpt_stream_bytes(const fbd_ckpt_job *k); /* what the source has left */
int fbd_ckpt_list(fbd_server *srv, const struct fbd_tenant *owner, fbp_arena *a,
                  Fusebox__V1__CheckpointList *out, char *err, size_t errlen);
/* The drain hook: checkpoint live session s into the checkpoint directory
 * now (queued after its work, run by its thread) and wait for it; *name
 * (n bytes) gets the checkpoint's name. FB_EUNSUPPORTED without a
 * directory; the session lives on either way. */
int fbd_session_checkpoint_now(fbd_session *s, double timeout_s, char *name, size_t n, char *err,
                               size_t errlen);
/* The periodic checkpoints (main thread's tick): each live session whose
 * last is checkpoint_every_s old gets a CKPT job into the directory. */
void fbd_ckpt_tick(fbd_server *srv);
/* Process isolation: run a CKPT or RESTORE job in s's worker, the stream
 * crossing the socket in data frames (session/frame.h). */
void fbd_proc_checkpoint(fbd_session *s, fbd_job *j, fbd_reply *r);
void fbd_proc_restore(fbd_session *s, fbd_job *j, fbd_reply *r);
void fbd_stage_count(int64_t delta); /* the staging total (budget.c) moves by delta */
struct fbd_ckpt_wait;
void fbd_ckpt_wait_done(struct fbd_ckpt_wait *w, int code, const char *name, const char *err);
/* Stream a finished checkpoint (memfd) to c in chunks; takes k. */
void fbd_ckpt_send(fbd_call *c, fbd_ckpt_job *k, uint32_t chunk); /* bytes staged outside fbd_stage_alloc (stage.c) */

/* ---------------------------------------------------------------- security (auth.h) */

#include "server/auth.h"

#endif
