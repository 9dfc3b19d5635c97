/* fuseboxd's security and observability side, kept apart from the call
 * plumbing (rpc.c), the methods (methods.c) and the sessions (session.c),
 * which only call the hooks below:
 *  - auth.c: the tenants file, who a call is (a bearer token's SHA-256, or
 *    the subject of its client certificate), whether it may touch a
 *    session, per-tenant admission (sessions, memory) and what GetStats
 *    shows it;
 *  - tls.c: the credentials of each listening address (TLS, mTLS, or plain
 *    where allowed);
 *  - metrics.c: the HTTP endpoint /metrics (Prometheus text), /healthz and
 *    /readyz on libmicrohttpd.
 * Included by server.h; never on its own. */
#ifndef FUSEBOX_SERVER_AUTH_H
#define FUSEBOX_SERVER_AUTH_H

#include <grpc/grpc_security.h>

#include "server/subject.h"

#define FBD_TENANT_NAME 64
#define FBD_DEFAULT_MAX_COMPILES 2 /* a tenant's RegisterKernels at once, unless it says */

/* One tenant of the tenants file. Tenants are never freed while the server
 * runs (a reload updates them in place by name, and marks those no longer
 * in the file as removed), so sessions and calls keep plain pointers. */
typedef struct fbd_tenant {
  char name[FBD_TENANT_NAME];
  /* its number for --worker-uid-base (its workers run as base + slot): 1 for
   * the first name ever loaded, 2 for the next new one; set once, kept
   * across reloads and after removal, never given to another name */
  int worker_slot;
  /* under fbd_auth.mu: a reload changes them */
  int admin, removed;
  int max_sessions;         /* 0: only the server's limit */
  uint64_t memory_bytes;    /* sum of its sessions' memory limits; 0: unlimited */
  atomic_int time_share;    /* its weight in the fair scheduler (sched.c), 1..1000 */
  atomic_int max_compiles;  /* RegisterKernels running at once; 0: no limit */
  uint8_t (*hashes)[32];    /* SHA-256 of its tokens */
  int nhashes;
  fbd_subject *subjects;    /* client-certificate subjects, parsed (subject.h) */
  int nsubjects;
  /* counted from any thread */
  atomic_uint_fast64_t sessions_created, calls, denied, refused_sessions, refused_memory;
  atomic_int open_calls; /* its calls now open (rpc.c: at most max_calls_per_tenant) */
  atomic_uint_fast64_t launches, syncs;  /* received on its Session streams */
  atomic_uint_fast64_t bytes_in, bytes_out; /* message bytes of its calls */
  /* what its sessions' engines did: every counter of FB_COUNTERS, summed
   * (fbd_metrics_count, called by session.c after each job) */
  fbd_counter_sums done;
} fbd_tenant;

typedef struct fbd_auth {
  pthread_mutex_t mu;       /* the tenants and their settings */
  pthread_mutex_t admit;    /* held across a tenant's limit check and the new session */
  int enabled;              /* a tenants file was given */
  fbd_tenant **t;
  int n, cap;               /* n: every name ever loaded (worker slots 1..n) */
  atomic_uint_fast64_t failures; /* calls refused UNAUTHENTICATED */
  /* refusal log lines: at most a few per second, the rest counted */
  pthread_mutex_t logmu;
  double log_window;
  int logged;
  uint64_t suppressed;
} fbd_auth;

/* Start-up: read --tenants FILE if given. FB_EINVAL with err when it is
 * wrong. */
int fbd_auth_init(fbd_server *srv, char *err, size_t errlen);
void fbd_auth_free(fbd_server *srv);
/* SIGHUP: read the tenants file again; on any error keep the running set
 * (logged). */
void fbd_auth_reload(fbd_server *srv);
/* A call arrived with its request metadata: find its tenant. 0, or the
 * refusal (counted and logged) with why in refused, which the caller
 * answers UNAUTHENTICATED (the health check needs no identity). */
int fbd_auth_call(fbd_call *c, const grpc_metadata_array *md, char *refused, size_t refusedlen);
/* May call c touch session s? 0, or a denial (counted and logged), which
 * the caller answers PERMISSION_DENIED. */
int fbd_auth_may_use(fbd_call *c, fbd_session *s);
/* May tenant t (NULL: anonymous) see server-wide figures (an admin, or no
 * tenants file)? Takes the auth lock: ask before taking srv->mu. */
int fbd_auth_sees_all(fbd_server *srv, const fbd_tenant *t);
/* Does GetStats show s to c? */
int fbd_auth_sees(const fbd_call *c, fbd_session *s);
/* GetStats for a tenant that is not admin: the server-wide counters say
 * nothing about other tenants (r->sessions already filtered). */
void fbd_auth_scope_stats(const fbd_call *c, Fusebox__V1__ServerStats *r);
/* A Session stream message of c's tenant: launches and syncs it asked for
 * (metrics). */
void fbd_auth_count_stream(fbd_call *c, size_t launches, int sync);
/* May c's tenant have one more session of layout l? Its session count and
 * memory limits (FB_EQUOTA with err naming the limit); the session's memory
 * limit is cut to what the tenant has left and its cache partition set.
 * One admission at a time: fbd_auth_admit_end follows every begin, once
 * the session was made (created) or not (fbd_session_new_for, session.c). */
int fbd_auth_admit_begin(fbd_call *c, const fb_layout *l, fb_session_config *ec, char *err,
                         size_t errlen);
void fbd_auth_admit_end(fbd_call *c, int created);

/* tls.c: the credentials for listening address addr (a unix socket is
 * always plain). NULL with err when the settings or files are wrong, or
 * when addr is plain TCP off loopback without --insecure. On TLS gRPC gets
 * plaintext from the HTTP/2 gate, whose SSL_CTX fbd_tls_gate installs. */
grpc_server_credentials *fbd_tls_server_creds(fbd_server *srv, const char *addr, char *err,
                                              size_t errlen);
int fbd_tls_gate(fbd_server *srv, char *err, size_t errlen);
/* SIGHUP: read the certificate, key and client CA again; new handshakes get
 * them (a file that does not load changes nothing, logged). */
void fbd_tls_reload(fbd_server *srv);
void fbd_tls_free(fbd_server *srv); /* after the gRPC server is destroyed */
/* A whole file into a NUL-terminated string (for PEM files), or NULL. */
char *fbd_read_text(const char *path, size_t max, char *err, size_t errlen);

/* metrics.c */
int fbd_metrics_start(fbd_server *srv, char *err, size_t errlen);
void fbd_metrics_stop(fbd_server *srv);
/* After a job of session s: add what its counters grew by since its last
 * reading (s->snap) to its tenant's sums and the server's. A counter that
 * went down (a worker that misreports) adds nothing. On the session's
 * thread, before s->snap takes now. */
void fbd_metrics_count(fbd_session *s, const fb_counters *now);

#endif
