/* fuseboxd settings: defaults, a JSON config file (jansson) and command-line
 * flags. The file is read first, then flags override it. Every option has
 * the same name in both, with '-' in flags and '_' in the file:
 *   --listen / "listen" (string or array), --backend, --cuda-memory,
 *   --device-budget, --max-message-bytes,
 *   --keepalive-s, --keepalive-timeout-s, --max-sessions,
 *   --session-memory-limit, --compile-threads, --cpu-threads, --cq-threads,
 *   --idle-timeout-s, --shutdown-grace-s, --log-level, --worker-spin-us,
 *   --max-kernel-statements, --max-kernels-per-session, --socket-mode (octal text), --socket-group,
 *   --isolation, --kernel-timeout-s, --compile-timeout-s, --spare-workers,
 *   --worker-reply-timeout-s,
 *   --worker-overhead-bytes, --worker-memory-bytes, --worker-user, --worker-uid-base,
 *   --worker-uid-count, --worker-namespaces auto|on|net|off,
 *   --require-walls LIST, --strict-sandbox, --test-refuse-walls LIST (a test hook),
 *   --tls-cert, --tls-key, --tls-client-ca, --insecure and --private (flags
 *   without a value; true/false in the file), --tenants, --metrics-listen,
 *   --metrics-max-connections, --metrics-max-connections-per-ip,
 *   --metrics-request-timeout-s,
 *   --log-format text|json, --fair-share on|off, --fair-slice-ms,
 *   --max-streams-per-connection, --max-connections, --max-connections-per-ip,
 *   --stream-rate, --reset-rate.
 * Byte sizes accept K, M and G suffixes (powers of 1024). */
#include <errno.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/server.h"

void fbd_config_defaults(fbd_config *c) {
  memset(c, 0, sizeof *c);
  c->backend = strdup("auto");
  c->cuda_memory = strdup("device");
  c->max_message_bytes = FB_SERVER_MAX_MESSAGE_BYTES_DEFAULT;
  c->keepalive_s = 60;
  c->keepalive_timeout_s = 20;
  c->max_sessions = 64;
  c->max_calls = FBD_MAX_CALLS_DEFAULT;
  c->max_calls_per_tenant = FBD_MAX_CALLS_PER_TENANT_DEFAULT;
  c->max_streams_per_connection = FBD_MAX_STREAMS_PER_CONNECTION_DEFAULT;
  c->max_connections = FBD_MAX_CONNECTIONS_DEFAULT;
  c->max_connections_per_ip = FBD_MAX_CONNECTIONS_PER_IP_DEFAULT;
  c->stream_rate = FBD_STREAM_RATE_DEFAULT;
  c->reset_rate = FBD_RESET_RATE_DEFAULT;
  c->session_memory_limit = (uint64_t)4 << 30;
  c->cq_threads = 2;
  c->idle_timeout_s = 600;
  c->shutdown_grace_s = 10;
  c->worker_spin_us = 100;
  c->max_kernel_statements = FB_MAX_KERNEL_STATEMENTS_DEFAULT;
  c->max_kernels_per_session = FBD_MAX_KERNELS_PER_SESSION_DEFAULT;
  c->log_level = FBD_LOG_INFO;
  c->socket_mode = 0660;
  c->ready_fd = -1;
  c->isolation = strdup("process");
  c->kernel_timeout_s = 60;
  c->compile_timeout_s = 60;
  c->worker_reply_timeout_s = 10;
  c->spare_workers = 1;
  c->worker_overhead_bytes = (uint64_t)4 << 30;
  c->fair_share = strdup("on");
  c->worker_namespaces = strdup("auto");
  c->fair_slice_ms = 10;
  c->metrics_max_connections = FBD_METRICS_MAX_CONNECTIONS_DEFAULT;
  c->metrics_max_connections_per_ip = FBD_METRICS_MAX_CONNECTIONS_PER_IP_DEFAULT;
  c->metrics_request_timeout_s = FBD_METRICS_REQUEST_TIMEOUT_S_DEFAULT;
}

void fbd_config_free(fbd_config *c) {
  for (int i = 0; i < c->nlisten; i++) free(c->listen[i]);
  free(c->backend);
  free(c->cuda_memory);
  free(c->socket_group);
  free(c->worker_user);
  free(c->isolation);
  free(c->worker_namespaces);
  free(c->require_walls);
  free(c->worker_walls_off);
  free(c->test_refuse_walls);
  free(c->config_path);
  free(c->checkpoint_dir);
  free(c->checkpoint_key);
  free(c->tls_cert);
  free(c->tls_key);
  free(c->tls_client_ca);
  free(c->tenants);
  free(c->replica_name);
  free(c->metrics_listen);
  free(c->fair_share);
  free(c->code_cache_dir);
  free(c->code_cache_key);
  memset(c, 0, sizeof *c);
}

void fbd_usage(FILE *f) {
  fprintf(
      f,
      "usage: fuseboxd [options]\n"
      "  --listen ADDR              host:port or unix:PATH (repeatable; default 127.0.0.1:50051)\n"
      "  --config FILE              JSON file with the options below (flags override it)\n"
      "  --backend auto|cpu|cuda    device backend (default auto)\n"
      "  --cuda-memory device|managed  CUDA session memory: device memory copied to and\n"
      "                             from the host (default), or managed memory\n"
      "  --device-budget N          GPU memory all sessions may hold, checked against the\n"
      "                             free memory at start (default 80%% of the GPU's, at\n"
      "                             most 90%% of what is free)\n"
      "  --max-message-bytes N      largest request message (default 16M)\n"
      "  --keepalive-s S            ping idle connections every S seconds (default 60)\n"
      "  --keepalive-timeout-s S    drop a connection whose ping is unanswered (default 20)\n"
      "  --max-sessions N           sessions at once (default 64)\n"
      "  --session-memory-limit N   device memory per session, 0 = unlimited (default 4G)\n"
      "  --compile-threads N        compile pool size, 0 = one per core (default 0)\n"
      "  --cpu-threads N            CPU device threads, 0 = one per core (default 0)\n"
      "  --cq-threads N             gRPC completion-queue threads (default 2)\n"
      "  --idle-timeout-s S         reap sessions idle this long (default 600)\n"
      "  --shutdown-grace-s S       on SIGTERM, let running work finish this long (default 10)\n"
      "  --drain-grace-s S          on SIGTERM or Drain: refuse new sessions, fail /readyz and\n"
      "                             let live sessions go on this long, then end them and stop\n"
      "                             (default 0: SIGTERM shuts down at once, as SIGINT does)\n"
      "  --replica-name NAME        this replica's name in every answer's fusebox-replica\n"
      "                             header and in GetInfo (default: the host name)\n"
      "  --log-level L              error|warn|info|debug (default info)\n"
      "  --log-format F             text|json: log lines as text or one JSON object (default "
      "text)\n"
      "  --worker-spin-us N         a session worker polls this long before sleeping (default "
      "100)\n"
      "  --max-kernel-statements N  compile budget: larger kernels are refused (default %d)\n"
      "  --max-kernels-per-session N  kernels a session may register in all (re-registering\n"
      "                             a name adds one); a RegisterKernels past it is refused\n"
      "                             (default %d)\n"
      "  --socket-mode MODE         permissions of unix:PATH sockets, octal (default 0660)\n"
      "  --socket-group GROUP       group (name or numeric gid) of unix:PATH sockets\n"
      "                             (default: the process's group, unchanged)\n"
      "  --isolation process|thread each session's engine in a worker process of its own,\n"
      "                             locked down (default), or in a thread of fuseboxd\n"
      "  --kernel-timeout-s S       process isolation: a launch (or an async task) running\n"
      "                             longer ends its session, DEADLINE_EXCEEDED; 0 = none (default "
      "60)\n"
      "  --compile-timeout-s S      process isolation: the same for RegisterKernels (default 60);\n"
      "                             both: a .fbk source's parse stops with an error a little\n"
      "                             before it, and the session goes on\n"
      "  --worker-reply-timeout-s S process isolation: a worker's reply, once begun, must be\n"
      "                             whole within S, or the worker is killed (default 10)\n"
      "  --spare-workers N          worker processes kept started for new sessions (default 1)\n"
      "  --worker-overhead-bytes N  a worker's address space may exceed the session memory\n"
      "                             limit by this much (RLIMIT_AS; default 4G)\n"
      "  --worker-memory-bytes N    what each worker process (spares too) counts in the\n"
      "                             memory budget (default 0: as fuseboxd measures it)\n"
      "  --worker-user USER         fuseboxd run as root: the user (name or uid) that session\n"
      "                             workers switch to, never root (default nobody)\n"
      "  --worker-uid-base UID      fuseboxd run as root: workers of each tenant run as a\n"
      "                             uid (and gid) of their own, UID + the tenant's number\n"
      "                             (UID itself: sessions without a tenant); instead of\n"
      "                             --worker-user (default 0: off)\n"
      "  --worker-uid-count N       how many uids from --worker-uid-base are fuseboxd's:\n"
      "                             one more than the tenants it may ever load (default 0)\n"
      "  --worker-namespaces auto|on|net|off  each worker in a network, an IPC, a mount\n"
      "                             (its root an empty read-only directory) and a PID\n"
      "                             namespace of its own (net: the network and IPC ones\n"
      "                             only); auto: what the kernel allows (root with\n"
      "                             CAP_SYS_ADMIN), on: all or refuse to start (default auto)\n"
      "  --require-walls LIST       process isolation: sandbox walls whose refusal by the\n"
      "                             kernel stops fuseboxd at start, comma-separated: netns,\n"
      "                             rootns, uid, rlimits, no_new_privs, seccomp, or all\n"
      "                             (default none: a refused wall is logged once, shown\n"
      "                             in /metrics and /readyz, and workers start without it)\n"
      "  --strict-sandbox           the same as --require-walls all\n"
      "  --memory-budget N          everything clients make the server hold (sessions,\n"
      "                             staging, queued responses, pending launches, JIT\n"
      "                             code, kernels, the worker processes' own memory);\n"
      "                             what would pass it is refused (default: 3/4 of\n"
      "                             the machine's or the cgroup's memory, whichever is lower)\n"
      "  --code-cache-bytes N       each engine's code cache: least recently used code no\n"
      "                             session holds is freed past it (default: memory budget\n"
      "                             / 16, at most 256M)\n"
      "  --code-cache-dir DIR       the compile cache on disk (docs/code-cache.md): compiled\n"
      "                             tasks kept across restarts, a directory per tenant,\n"
      "                             each entry signed (default: none; the CLI's and the\n"
      "                             Python client's private servers use\n"
      "                             $XDG_CACHE_HOME/fusebox, else ~/.cache/fusebox)\n"
      "  --code-cache-disk-bytes N  its bound, shared equally among the tenants: least\n"
      "                             recently used entries go past a tenant's share\n"
      "                             (default 0: none)\n"
      "  --code-cache-key FILE      its HMAC key: a file of 32+ bytes, mode 0600, owned by\n"
      "                             fuseboxd's user, outside DIR (default DIR.key, made\n"
      "                             when missing)\n"
      "  --transport-memory-bytes N what gRPC's transports may hold (read buffers, messages\n"
      "                             received but not yet whole); past it gRPC shrinks its\n"
      "                             windows and cancels streams, RESOURCE_EXHAUSTED, and\n"
      "                             closes idle connections (default: memory budget / 8\n"
      "                             within 64M..1G, at least 4 x --max-message-bytes; less\n"
      "                             than 2 x --max-message-bytes stops the start)\n"
      "  --max-calls N              calls open at once, all clients together; past it a\n"
      "                             call is refused RESOURCE_EXHAUSTED (default %d)\n"
      "  --max-calls-per-tenant N   the same for each tenant of --tenants, and for calls\n"
      "                             with no credentials (health checks) together (default %d)\n"
      "  --max-streams-per-connection N  HTTP/2 streams a connection may have open at\n"
      "                             once (SETTINGS_MAX_CONCURRENT_STREAMS; default %d)\n"
      "  --max-connections N        host:port listeners, plain and TLS (the HTTP/2 gate):\n"
      "                             connections at once, all clients together (default %d)\n"
      "  --max-connections-per-ip N the same for one client address, an IPv6 one by its\n"
      "                             /64 (default %d)\n"
      "  --stream-rate N            new streams a second one client address may open, in\n"
      "                             bursts of N; past it its connections wait (default %d)\n"
      "  --reset-rate N             streams a second one client address may cancel\n"
      "                             (RST_STREAM), in bursts of 2N; a connection past it is\n"
      "                             closed: HTTP/2 rapid reset (default %d)\n"
      "  --ready-fd FD              write the bound addresses and a newline to FD when serving\n"
      "  --tls-cert FILE            PEM certificate chain: TLS on every host:port address,\n"
      "                             terminated by the HTTP/2 gate (TLS 1.2+, ALPN h2; a\n"
      "                             handshake not done in 5 s is cut)\n"
      "  --tls-key FILE             PEM private key of --tls-cert\n"
      "  --tls-client-ca FILE       PEM CA: clients must present a certificate it signed (mTLS)\n"
      "  --insecure                 allow plain TCP on a non-loopback address (logs a warning)\n"
      "  --private                  one user's daemon, started by a client for itself\n"
      "                             (fusebox run, fusebox.connect()): what matters only\n"
      "                             when tenants share the server (tenants' code running\n"
      "                             as root under --isolation thread) is an info line,\n"
      "                             not a warning; with --tenants it is a warning again\n"
      "  --tenants FILE             JSON tenants (token hashes, certificate subjects, limits):\n"
      "                             every call must authenticate; re-read on SIGHUP\n"
      "  --metrics-listen ADDR      host:port of HTTP /metrics (Prometheus), /healthz, /readyz\n"
      "  --metrics-max-connections N  connections the metrics port holds at once; past it\n"
      "                             the oldest one that has not sent its whole request is\n"
      "                             closed to make room (default %d)\n"
      "  --metrics-max-connections-per-ip N  the same for one client address, an IPv6\n"
      "                             /64 counted as one (default %d)\n"
      "  --metrics-request-timeout-s S  a metrics connection not done (request received,\n"
      "                             answer sent) S seconds after it was accepted is\n"
      "                             closed, however it trickles bytes (default %g)\n"
      "  --fair-share on|off        hold back a tenant over its share of device time while\n"
      "                             another tenant has work (default on)\n"
      "  --fair-slice-ms N          how far a tenant may run ahead of the least served\n"
      "                             one before it is held back (default 10)\n"
      "  --checkpoint-key FILE      the key that seals checkpoints (HMAC-SHA256, bound to\n"
      "                             the tenant): mode 0600, outside --checkpoint-dir;\n"
      "                             without it Checkpoint and Restore are refused\n"
      "  --checkpoint-key-create    make the key file (32 random bytes, 0600) when missing\n"
      "  --checkpoint-dir D         keep checkpoints under D, one directory per tenant,\n"
      "                             names chosen by the server (ListCheckpoints,\n"
      "                             FetchCheckpoint, Restore by name)\n"
      "  --checkpoint-every-s S     checkpoint each live session into D every S seconds\n"
      "                             (after what it received ran), keeping its last two\n"
      "                             (default 0: never)\n"
      "  --help, --version\n"
      "SIGHUP re-reads --config FILE and applies log_level, idle_timeout_s and\n"
      "shutdown_grace_s (flags still override the file), and the --tenants file;\n"
      "other changes need a restart.\n",
      FB_MAX_KERNEL_STATEMENTS_DEFAULT, FBD_MAX_KERNELS_PER_SESSION_DEFAULT,
      FBD_MAX_CALLS_DEFAULT, FBD_MAX_CALLS_PER_TENANT_DEFAULT,
      FBD_MAX_STREAMS_PER_CONNECTION_DEFAULT, FBD_MAX_CONNECTIONS_DEFAULT,
      FBD_MAX_CONNECTIONS_PER_IP_DEFAULT, FBD_STREAM_RATE_DEFAULT, FBD_RESET_RATE_DEFAULT,
      FBD_METRICS_MAX_CONNECTIONS_DEFAULT, FBD_METRICS_MAX_CONNECTIONS_PER_IP_DEFAULT,
      FBD_METRICS_REQUEST_TIMEOUT_S_DEFAULT);
}

int fbd_parse_bytes(const char *s, uint64_t *out) {
  if (!s || !*s) return FB_EINVAL;
  errno = 0;
  char *end = NULL;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno || end == s || *s == '-') return FB_EINVAL;
  int shift = 0;
  if (*end == 'K' || *end == 'k') shift = 10;
  else if (*end == 'M' || *end == 'm') shift = 20;
  else if (*end == 'G' || *end == 'g') shift = 30;
  else if (*end == 'T' || *end == 't') shift = 40;
  if (shift) end++;
  if (*end == 'B' || *end == 'b') end++;
  if (*end || (shift && v > (UINT64_MAX >> shift))) return FB_EINVAL;
  *out = (uint64_t)v << shift;
  return 0;
}

/* ---------------------------------------------------------------- options */

typedef enum {
  OPT_STR,
  OPT_INT,
  OPT_BYTES,
  OPT_SECS,
  OPT_LEVEL,
  OPT_LISTEN,
  OPT_MODE,
  OPT_GROUP,
  OPT_BOOL,
  OPT_LOGFMT,
  OPT_ID
} opt_kind;

typedef struct opt {
  const char *name; /* JSON key; the flag is "--" + name with '_' -> '-' */
  opt_kind kind;
  size_t off;
  int min;
} opt;

#define OFF(f) offsetof(fbd_config, f)

static const opt opts[] = {
    {"listen", OPT_LISTEN, 0, 0},
    {"backend", OPT_STR, OFF(backend), 0},
    {"cuda_memory", OPT_STR, OFF(cuda_memory), 0},
    {"device_budget", OPT_BYTES, OFF(device_budget), 0},
    {"max_message_bytes", OPT_BYTES, OFF(max_message_bytes), 1024},
    {"keepalive_s", OPT_INT, OFF(keepalive_s), 1},
    {"keepalive_timeout_s", OPT_INT, OFF(keepalive_timeout_s), 1},
    {"max_sessions", OPT_INT, OFF(max_sessions), 1},
    {"session_memory_limit", OPT_BYTES, OFF(session_memory_limit), 0},
    {"compile_threads", OPT_INT, OFF(compile_threads), 0},
    {"cpu_threads", OPT_INT, OFF(cpu_threads), 0},
    {"cq_threads", OPT_INT, OFF(cq_threads), 1},
    {"idle_timeout_s", OPT_SECS, OFF(idle_timeout_s), 0},
    {"shutdown_grace_s", OPT_SECS, OFF(shutdown_grace_s), 0},
    {"drain_grace_s", OPT_SECS, OFF(drain_grace_s), 0},
    {"replica_name", OPT_GROUP, OFF(replica_name), 0}, /* "" unsets: the host name */
    {"log_level", OPT_LEVEL, OFF(log_level), 0},
    {"log_format", OPT_LOGFMT, OFF(log_json), 0},
    {"worker_spin_us", OPT_INT, OFF(worker_spin_us), 0},
    {"max_kernel_statements", OPT_INT, OFF(max_kernel_statements), 1},
    {"max_kernels_per_session", OPT_INT, OFF(max_kernels_per_session), 1},
    {"socket_mode", OPT_MODE, OFF(socket_mode), 0},
    {"socket_group", OPT_GROUP, OFF(socket_group), 0},
    {"isolation", OPT_STR, OFF(isolation), 0},
    {"kernel_timeout_s", OPT_SECS, OFF(kernel_timeout_s), 0},
    {"compile_timeout_s", OPT_SECS, OFF(compile_timeout_s), 0},
    {"worker_reply_timeout_s", OPT_SECS, OFF(worker_reply_timeout_s), 1},
    {"spare_workers", OPT_INT, OFF(spare_workers), 0},
    {"worker_overhead_bytes", OPT_BYTES, OFF(worker_overhead_bytes), 0},
    {"worker_memory_bytes", OPT_BYTES, OFF(worker_memory_bytes), 0},
    {"worker_user", OPT_GROUP, OFF(worker_user), 0}, /* "" unsets: nobody */
    {"worker_uid_base", OPT_ID, OFF(worker_uid_base), 0},
    {"worker_uid_count", OPT_INT, OFF(worker_uid_count), 0},
    {"worker_namespaces", OPT_STR, OFF(worker_namespaces), 0},
    {"require_walls", OPT_GROUP, OFF(require_walls), 0},
    {"strict_sandbox", OPT_BOOL, OFF(strict_sandbox), 0},
    {"worker_walls_off", OPT_GROUP, OFF(worker_walls_off), 0},
    {"test_refuse_walls", OPT_GROUP, OFF(test_refuse_walls), 0},
    {"memory_budget", OPT_BYTES, OFF(memory_budget), 0},
    {"code_cache_bytes", OPT_BYTES, OFF(code_cache_bytes), 0},
    {"code_cache_dir", OPT_GROUP, OFF(code_cache_dir), 0}, /* paths: "" unsets */
    {"code_cache_key", OPT_GROUP, OFF(code_cache_key), 0},
    {"code_cache_disk_bytes", OPT_BYTES, OFF(code_cache_disk_bytes), 0},
    {"transport_memory_bytes", OPT_BYTES, OFF(transport_memory_bytes), 0},
    {"max_calls", OPT_INT, OFF(max_calls), 1},
    {"max_calls_per_tenant", OPT_INT, OFF(max_calls_per_tenant), 1},
    {"max_streams_per_connection", OPT_INT, OFF(max_streams_per_connection), 1},
    {"max_connections", OPT_INT, OFF(max_connections), 1},
    {"max_connections_per_ip", OPT_INT, OFF(max_connections_per_ip), 1},
    {"stream_rate", OPT_INT, OFF(stream_rate), 1},
    {"reset_rate", OPT_INT, OFF(reset_rate), 1},
    {"tls_cert", OPT_GROUP, OFF(tls_cert), 0},      /* paths: "" unsets, as for a group */
    {"tls_key", OPT_GROUP, OFF(tls_key), 0},
    {"tls_client_ca", OPT_GROUP, OFF(tls_client_ca), 0},
    {"insecure", OPT_BOOL, OFF(insecure), 0},
    {"private", OPT_BOOL, OFF(private_daemon), 0},
    {"tenants", OPT_GROUP, OFF(tenants), 0},
    {"metrics_listen", OPT_GROUP, OFF(metrics_listen), 0},
    {"metrics_max_connections", OPT_INT, OFF(metrics_max_connections), 1},
    {"metrics_max_connections_per_ip", OPT_INT, OFF(metrics_max_connections_per_ip), 1},
    {"metrics_request_timeout_s", OPT_SECS, OFF(metrics_request_timeout_s), 1},
    {"fair_share", OPT_STR, OFF(fair_share), 0},
    {"fair_slice_ms", OPT_INT, OFF(fair_slice_ms), 1},
    {"checkpoint_dir", OPT_GROUP, OFF(checkpoint_dir), 0}, /* paths: "" unsets */
    {"checkpoint_key", OPT_GROUP, OFF(checkpoint_key), 0},
    {"checkpoint_key_create", OPT_BOOL, OFF(checkpoint_key_create), 0},
    {"checkpoint_every_s", OPT_SECS, OFF(checkpoint_every_s), 0},
};

int fbd_isolated(const fbd_config *cfg) {
  return cfg->isolation && strcmp(cfg->isolation, "process") == 0;
}

int fbd_fair_share_on(const fbd_config *cfg) {
  return cfg->fair_share && strcmp(cfg->fair_share, "on") == 0;
}
#define NOPTS (sizeof opts / sizeof opts[0])

static int same_str(const char *a, const char *b) { return a == b || (a && b && !strcmp(a, b)); }

static int same_value(const opt *o, const fbd_config *a, const fbd_config *b) {
  const char *pa = (const char *)a + o->off, *pb = (const char *)b + o->off;
  switch (o->kind) {
  case OPT_LISTEN:
    if (a->nlisten != b->nlisten) return 0;
    for (int i = 0; i < a->nlisten; i++)
      if (!same_str(a->listen[i], b->listen[i])) return 0;
    return 1;
  case OPT_STR:
  case OPT_GROUP: return same_str(*(char *const *)pa, *(char *const *)pb);
  case OPT_BYTES: return *(const uint64_t *)pa == *(const uint64_t *)pb;
  case OPT_SECS: return *(const double *)pa == *(const double *)pb;
  case OPT_ID: return *(const uint32_t *)pa == *(const uint32_t *)pb;
  default: return *(const int *)pa == *(const int *)pb; /* INT, LEVEL, MODE, BOOL, LOGFMT */
  }
}

void fbd_config_changed(const fbd_config *a, const fbd_config *b, const char *const *skip,
                        char *out, size_t n) {
  size_t used = 0;
  if (n) out[0] = 0;
  for (size_t i = 0; i < NOPTS; i++) {
    int skipped = 0;
    for (const char *const *s = skip; s && *s && !skipped; s++) skipped = !strcmp(*s, opts[i].name);
    if (skipped || same_value(&opts[i], a, b) || used + 1 >= n) continue;
    int w = snprintf(out + used, n - used, "%s%s", used ? ", " : "", opts[i].name);
    used = w < 0 ? used : used + (size_t)w < n ? used + (size_t)w : n - 1;
  }
}

/* Errors name the option as the user gave it (shown): the JSON key in a
 * config file, the flag as typed on the command line. */
static int add_listen(fbd_config *c, const char *shown, const char *addr, char *err,
                      size_t errlen) {
  if (!addr || !*addr) {
    fb_errf(err, errlen, "%s: empty address", shown);
    return FB_EINVAL;
  }
  if (c->nlisten == FBD_MAX_LISTEN) {
    fb_errf(err, errlen, "%s: at most %d addresses", shown, FBD_MAX_LISTEN);
    return FB_EINVAL;
  }
  if (!(c->listen[c->nlisten] = strdup(addr))) return FB_ENOMEM;
  c->nlisten++;
  return 0;
}

static void clear_listen(fbd_config *c) {
  for (int i = 0; i < c->nlisten; i++) free(c->listen[i]);
  c->nlisten = 0;
}

/* The string options that take one of a few values, checked as they are
 * set, so that the error names the flag or the key that gave the value. */
static const struct {
  const char *name, *v[5]; /* v: NULL-terminated */
} choices[] = {{"isolation", {"process", "thread", NULL}},
               {"fair_share", {"on", "off", NULL}},
               {"worker_namespaces", {"auto", "on", "net", "off", NULL}}};

/* Whether v is one of choice i's values; else the error "expected a, b or c". */
static int choice_ok(size_t i, const char *shown, const char *v, char *err, size_t errlen) {
  size_t n = 0;
  while (choices[i].v[n])
    if (!strcmp(v, choices[i].v[n++])) return 1;
  char list[128] = "";
  for (size_t k = 0; k < n; k++) {
    size_t used = strlen(list);
    snprintf(list + used, sizeof list - used, "%s%s", k == 0 ? "" : k + 1 < n ? ", " : " or ",
             choices[i].v[k]);
  }
  fb_errf(err, errlen, "%s: invalid value '%s' (expected %s)", shown, v, list);
  return 0;
}

/* Set option o (named shown in errors) from text (flags, and JSON strings). */
static int set_text(fbd_config *c, const opt *o, const char *shown, const char *v, char *err,
                    size_t errlen) {
  char *base = (char *)c;
  uint64_t b = 0;
  char *end = NULL;
  switch (o->kind) {
  case OPT_LISTEN: return add_listen(c, shown, v, err, errlen);
  case OPT_STR: {
    for (size_t i = 0; i < sizeof choices / sizeof *choices; i++)
      if (!strcmp(o->name, choices[i].name) && !choice_ok(i, shown, v, err, errlen))
        return FB_EINVAL;
    char *d = strdup(v);
    if (!d) return FB_ENOMEM;
    free(*(char **)(base + o->off));
    *(char **)(base + o->off) = d;
    return 0;
  }
  case OPT_GROUP: { /* "" leaves the group unchanged */
    char *d = *v ? strdup(v) : NULL;
    if (*v && !d) return FB_ENOMEM;
    free(*(char **)(base + o->off));
    *(char **)(base + o->off) = d;
    return 0;
  }
  case OPT_MODE: { /* octal permission bits, no setuid/setgid/sticky */
    long x = strtol(v, &end, 8);
    if (end == v || *end || *v == '-' || *v == '+' || x < 0 || x > 0777) {
      fb_errf(err, errlen, "%s: invalid value '%s' (octal permissions 0000..0777, e.g. 0660)",
              shown, v);
      return FB_EINVAL;
    }
    *(int *)(base + o->off) = (int)x;
    return 0;
  }
  case OPT_LOGFMT:
    if (!strcmp(v, "text")) *(int *)(base + o->off) = 0;
    else if (!strcmp(v, "json")) *(int *)(base + o->off) = 1;
    else {
      fb_errf(err, errlen, "%s: invalid value '%s' (expected text or json)", shown, v);
      return FB_EINVAL;
    }
    return 0;
  case OPT_BOOL:
    if (!strcmp(v, "true") || !strcmp(v, "1")) *(int *)(base + o->off) = 1;
    else if (!strcmp(v, "false") || !strcmp(v, "0")) *(int *)(base + o->off) = 0;
    else break;
    return 0;
  case OPT_LEVEL: {
    int lv = fbd_log_level_from_name(v);
    if (lv < 0) break;
    *(int *)(base + o->off) = lv;
    return 0;
  }
  case OPT_BYTES:
    if (fbd_parse_bytes(v, &b) || b < (uint64_t)o->min) break;
    *(uint64_t *)(base + o->off) = b;
    return 0;
  case OPT_INT: {
    long x = strtol(v, &end, 10);
    if (end == v || *end || x < o->min || x > 1 << 20) break;
    *(int *)(base + o->off) = (int)x;
    return 0;
  }
  case OPT_ID: { /* a uid or gid: 0 (off) .. 2^32-2 ((uid_t)-1 means "unchanged") */
    errno = 0;
    unsigned long long x = strtoull(v, &end, 10);
    if (end == v || *end || *v == '-' || *v == '+' || errno || x >= 0xffffffffull) break;
    *(uint32_t *)(base + o->off) = (uint32_t)x;
    return 0;
  }
  case OPT_SECS: {
    double x = strtod(v, &end);
    if (end == v || *end || !(x >= o->min) || x > 1e9) break;
    *(double *)(base + o->off) = x;
    return 0;
  }
  }
  fb_errf(err, errlen, "%s: invalid value '%s'", shown, v);
  return FB_EINVAL;
}

static int set_json(fbd_config *c, const opt *o, json_t *v, char *err, size_t errlen) {
  char num[64];
  if (json_is_string(v)) return set_text(c, o, o->name, json_string_value(v), err, errlen);
  if (o->kind == OPT_BOOL && json_is_boolean(v))
    return set_text(c, o, o->name, json_is_true(v) ? "true" : "false", err, errlen);
  if (o->kind == OPT_LISTEN && json_is_array(v)) {
    size_t i;
    json_t *x;
    json_array_foreach(v, i, x) {
      if (!json_is_string(x)) {
        fb_errf(err, errlen, "listen[%zu]: expected a string", i);
        return FB_EINVAL;
      }
      int rc = add_listen(c, o->name, json_string_value(x), err, errlen);
      if (rc) return rc;
    }
    return 0;
  }
  if (o->kind == OPT_MODE) { /* JSON has no octal numbers: 660 would be 0o1224 */
    fb_errf(err, errlen, "%s: give the octal mode as a string, e.g. \"0660\"", o->name);
    return FB_EINVAL;
  }
  if (json_is_integer(v) && o->kind != OPT_STR && o->kind != OPT_LISTEN && o->kind != OPT_LEVEL) {
    snprintf(num, sizeof num, "%lld", (long long)json_integer_value(v));
    return set_text(c, o, o->name, num, err, errlen);
  }
  if (json_is_real(v) && o->kind == OPT_SECS) {
    snprintf(num, sizeof num, "%.17g", json_real_value(v));
    return set_text(c, o, o->name, num, err, errlen);
  }
  fb_errf(err, errlen, "%s: wrong JSON type", o->name);
  return FB_EINVAL;
}

static const opt *find_opt(const char *name, int flag) {
  for (size_t i = 0; i < NOPTS; i++) {
    const char *a = opts[i].name, *b = name;
    while (*a && (*a == *b || (flag && *a == '_' && *b == '-'))) a++, b++;
    if (!*a && !*b) return &opts[i];
  }
  return NULL;
}

int fbd_config_load(fbd_config *c, const char *path, char *err, size_t errlen) {
  json_error_t je;
  json_t *root = json_load_file(path, 0, &je);
  if (!root) {
    fb_errf(err, errlen, "%s:%d:%d: %s", path, je.line, je.column, je.text);
    return FB_EINVAL;
  }
  int rc = 0;
  if (!json_is_object(root)) {
    fb_errf(err, errlen, "%s: expected a JSON object", path);
    rc = FB_EINVAL;
  }
  const char *key;
  json_t *v;
  int listen_seen = 0;
  json_object_foreach(root, key, v) {
    if (rc) break;
    const opt *o = find_opt(key, 0);
    if (!o) {
      fb_errf(err, errlen, "%s: unknown key '%s'", path, key);
      rc = FB_EINVAL;
      break;
    }
    if (o->kind == OPT_LISTEN && !listen_seen++) clear_listen(c);
    char why[512];
    if ((rc = set_json(c, o, v, why, sizeof why))) fb_errf(err, errlen, "%s: %s", path, why);
  }
  json_decref(root);
  return rc;
}

/* The value of a flag: "--name=value" or "--name value". */
static const char *flag_value(int argc, char **argv, int *i, const char *eq) {
  if (eq) return eq + 1;
  return *i + 1 < argc ? argv[++*i] : NULL;
}

static int config_first(fbd_config *c, int argc, char **argv, char *err, size_t errlen) {
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *path = NULL;
    if (strncmp(a, "--config=", 9) == 0) path = a + 9;
    else if (strcmp(a, "--config") == 0) path = i + 1 < argc ? argv[++i] : NULL;
    else continue;
    if (!path) {
      fb_errf(err, errlen, "--config: missing file name");
      return FB_EINVAL;
    }
    free(c->config_path);
    if (!(c->config_path = strdup(path))) return FB_ENOMEM;
    return fbd_config_load(c, path, err, errlen);
  }
  return 0;
}

int fbd_config_args(fbd_config *c, int argc, char **argv, char *err, size_t errlen) {
  int rc = config_first(c, argc, argv, err, errlen);
  if (rc) return rc;
  int listen_seen = 0;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
      fbd_usage(stdout);
      return 1;
    }
    if (strcmp(a, "--version") == 0) {
      printf("fuseboxd %s\n", FBD_VERSION);
      return 1;
    }
    if (strncmp(a, "--", 2) != 0) {
      fb_errf(err, errlen, "unexpected argument '%s' (see --help)", a);
      return FB_EINVAL;
    }
    char name[64];
    const char *eq = strchr(a, '=');
    size_t n = eq ? (size_t)(eq - a - 2) : strlen(a + 2);
    snprintf(name, sizeof name, "%.*s", (int)(n < 63 ? n : 63), a + 2);
    const opt *o = find_opt(name, 1);
    int special = strcmp(name, "config") == 0 || strcmp(name, "ready-fd") == 0;
    if (!o && !special) {
      fb_errf(err, errlen, "unknown option '--%s' (see --help)", name);
      return FB_EINVAL;
    }
    /* a boolean flag alone means true: --insecure */
    const char *v = o && o->kind == OPT_BOOL && !eq ? "true" : flag_value(argc, argv, &i, eq);
    if (!v) {
      fb_errf(err, errlen, "--%s: missing value", name);
      return FB_EINVAL;
    }
    if (strcmp(name, "config") == 0) continue; /* read first */
    if (strcmp(name, "ready-fd") == 0) {
      char *end;
      long fd = strtol(v, &end, 10);
      if (end == v || *end || fd < 0 || fd > 1 << 20) {
        fb_errf(err, errlen, "--ready-fd: invalid descriptor '%s'", v);
        return FB_EINVAL;
      }
      c->ready_fd = (int)fd;
      continue;
    }
    if (o->kind == OPT_LISTEN && !listen_seen++) clear_listen(c); /* flags replace the file's */
    char flag[72];
    snprintf(flag, sizeof flag, "--%s", name); /* as typed: --max-fuse-per-task */
    if ((rc = set_text(c, o, flag, v, err, errlen))) return rc;
  }
  if (c->nlisten == 0) return add_listen(c, "listen", "127.0.0.1:50051", err, errlen);
  return 0;
}
