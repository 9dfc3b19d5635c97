/* The HTTP side of fuseboxd (--metrics-listen host:port, libmicrohttpd with
 * its own polling thread):
 *   GET /metrics  Prometheus text exposition (version 0.0.4): the server's
 *                 counters, and per tenant (with a tenants file) its
 *                 sessions, memory against its limit, calls and refusals;
 *   GET /healthz  200 while the process serves HTTP (liveness);
 *   GET /readyz   200 when new sessions can be served, else 503 (readiness:
 *                 not while shutting down or while the device is unhealthy);
 *                 a second line names the sandbox walls the kernel refused
 *                 (proc.c), which lower the isolation but not readiness.
 * The endpoint carries no session ids, tags or tokens: only counts. Bind it
 * to loopback or a network that only the monitoring reaches.
 *
 * Whoever reaches the port may be hostile (slowloris: many connections, each
 * sending a byte now and then). libmicrohttpd's own timeout is an idle one
 * that every byte resets, and its per-address limit refuses newcomers, the
 * kubelet's probe among them. So this file keeps its own table of the open
 * connections (MHD_OPTION_NOTIFY_CONNECTION), and
 *   - every connection serves one request (Connection: close) and is shut
 *     down metrics_request_timeout_s after it was accepted, whatever it
 *     sends (a reaper thread sleeping until the earliest deadline);
 *   - a new connection is always taken: past metrics_max_connections_per_ip
 *     connections of its address (an IPv6 /64 counts as one), or past
 *     metrics_max_connections in all, the oldest connection of that address
 *     (or of all) that has not yet sent its whole request is shut down to
 *     make room. A probe sends its request at once and is answered in the
 *     same poll round, so slow clients cannot starve it: they are the
 *     oldest, and go first.
 * shutdown() leaves the descriptor to libmicrohttpd, which sees the end of
 * the stream and closes it; it closes a descriptor only after telling us
 * (MHD_CONNECTION_NOTIFY_CLOSED, under our lock), so a number we shut down
 * is never one reused elsewhere in fuseboxd. */
#include <arpa/inet.h>
#include <stddef.h>
#include <microhttpd.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "base/strbuf.h"
#include "server/server.h"

/* libmicrohttpd's own connection limit is ours plus this: connections shut
 * down to make room are closed by it a poll round later, and it accepts at
 * most 10 connections a round; at its limit it would stop accepting. */
#define MHD_LIMIT_SLACK 32

/* One open connection of the metrics port (c NULL: a free slot). */
typedef struct conn_slot {
  struct MHD_Connection *c;
  MHD_socket fd;
  unsigned char who[16]; /* the client's address (IPv4 as ::ffff:a.b.c.d, IPv6 its /64) */
  double start;          /* fbd_now() when accepted */
  int answered;          /* its request arrived whole: the handler ran */
  int cut;               /* shut down by us; libmicrohttpd has yet to close it */
} conn_slot;

enum { CUT_TIMEOUT, CUT_PER_IP, CUT_LIMIT, NCUT };
static const char *const cut_reasons[NCUT] = {"request_timeout", "per_ip", "limit"};

struct fbd_metrics {
  struct MHD_Daemon *d;
  fbd_server *srv;
  pthread_mutex_t mu; /* the table, and the reaper's state */
  pthread_cond_t cv;  /* the reaper's (CLOCK_MONOTONIC): a first connection, or stop */
  pthread_t reaper;
  int reaper_started, reaper_idle, stopping;
  conn_slot *slot;
  int nslot;        /* max_conn + MHD_LIMIT_SLACK: libmicrohttpd never holds more */
  int max_conn, max_per_ip;
  double timeout_s; /* metrics_request_timeout_s */
  uint64_t accepted, cuts[NCUT];
};

static void metric(fb_sb *t, const char *name, const char *type, const char *help, uint64_t v) {
  fb_sb_printf(t, "# HELP fusebox_%s %s\n# TYPE fusebox_%s %s\nfusebox_%s %llu\n", name, help, name, type,
      name, (unsigned long long)v);
}

static void header(fb_sb *t, const char *name, const char *type, const char *help) {
  fb_sb_printf(t, "# HELP fusebox_%s %s\n# TYPE fusebox_%s %s\n", name, help, name, type);
}

/* ---------------------------------------------------------------- the engines' counters
 *
 * One family per counter of FB_COUNTERS (fusebox/counters.h), for the
 * server (fusebox_NAME) and per tenant (fusebox_tenant_NAME{tenant}), with
 * the list's meaning as HELP. NAME is the counter's name with, for a unit
 * of seconds, "_s" spelled "_seconds"; a SUM is a Prometheus counter and
 * takes "_total", a LEVEL a gauge. SUMs are the growth every session
 * reported, added up (fbd_metrics_count), so they outlive their sessions;
 * LEVELs are the live sessions' last readings, added up. One exception,
 * launches: the broker counts the launches it receives as they arrive
 * (fbd_stats.launches, fbd_tenant.launches), before a session reports
 * them, and that count is the value written. */

typedef struct counter_def {
  const char *name, *unit, *meaning;
  int level;         /* LEVEL: a gauge, read from the live sessions */
  int seconds;       /* a double: seconds (its sum kept in nanoseconds) */
  size_t at, sum_at; /* offsetof in fb_counters, in fbd_counter_sums */
} counter_def;

#define CTR_LEVEL_SUM 0
#define CTR_LEVEL_LEVEL 1
#define CTR_DOUBLE_uint64_t 0
#define CTR_DOUBLE_double 1
static const counter_def counters[] = {
#define CTR_DEF_(name, type, kind, unit, meaning)                                                  \
  {#name, unit, meaning, CTR_LEVEL_##kind, CTR_DOUBLE_##type, offsetof(fb_counters, name),        \
   offsetof(fbd_counter_sums, name)},
    FB_COUNTERS(CTR_DEF_)
#undef CTR_DEF_
};
#define NCOUNTERS (sizeof counters / sizeof counters[0])

/* Growth of one reading over the last, 0 when it did not grow; a double in
 * whole nanoseconds, at most 10^9 s in one step (NaN does not grow). */
#define CTR_GROWTH_uint64_t(now, was) ((now) > (was) ? (now) - (was) : 0)
#define CTR_GROWTH_double(now, was)                                                               \
  ((now) > (was) ? (uint64_t)(((now) - (was) < 1e9 ? (now) - (was) : 1e9) * 1e9 + 0.5) : 0)

void fbd_metrics_count(fbd_session *s, const fb_counters *c) {
  fbd_tenant *t = atomic_load(&s->owner);
  fbd_counter_sums *all = &s->srv->done, *its = t ? &t->done : NULL;
  const fb_counters *o = &s->snap; /* written only by the session's thread */
  uint64_t g;
#define CTR_COUNT_SUM_(name, type)                                                                \
  if ((g = CTR_GROWTH_##type(c->name, o->name)) != 0) {                                           \
    atomic_fetch_add(&all->name, g);                                                              \
    if (its) atomic_fetch_add(&its->name, g);                                                     \
  }
#define CTR_COUNT_LEVEL_(name, type)
#define CTR_COUNT_(name, type, kind, unit, meaning) CTR_COUNT_##kind##_(name, type)
  FB_COUNTERS(CTR_COUNT_)
#undef CTR_COUNT_
#undef CTR_COUNT_LEVEL_
#undef CTR_COUNT_SUM_
}

/* The family name of counter i after prefix ("" or "tenant_"). */
static void counter_family(char *out, size_t n, const char *prefix, size_t i) {
  const counter_def *d = &counters[i];
  size_t len = strlen(d->name);
  int secs = !strcmp(d->unit, "seconds") && len > 2 && !strcmp(d->name + len - 2, "_s");
  snprintf(out, n, "%s%.*s%s%s", prefix, (int)(secs ? len - 2 : len), d->name,
           secs ? "_seconds" : "", d->level ? "" : "_total");
}

static void counter_header(fb_sb *t, const char *prefix, size_t i) {
  char fam[96];
  counter_family(fam, sizeof fam, prefix, i);
  fb_sb_printf(t, "# HELP fusebox_%s %s over the %s%s: %s (%s).\n# TYPE fusebox_%s %s\n", fam,
               counters[i].level ? "Now, summed" : "Summed", *prefix ? "tenant's " : "",
               counters[i].level ? "live sessions" : "sessions since start", counters[i].meaning,
               counters[i].unit, fam, counters[i].level ? "gauge" : "counter");
}

/* Counter i's value: a LEVEL from levels (the live sessions' readings
 * added up), a SUM from sums; launches is the broker's (above). label:
 * "" or "{tenant=\"NAME\"}". */
static void counter_value(fb_sb *t, const char *prefix, const char *label, size_t i,
                          const fb_counters *levels, const fbd_counter_sums *sums,
                          uint64_t launches) {
  char fam[96];
  counter_family(fam, sizeof fam, prefix, i);
  const counter_def *d = &counters[i];
  if (d->level && d->seconds)
    fb_sb_printf(t, "fusebox_%s%s %.9f\n", fam, label,
                 *(const double *)(const void *)((const char *)levels + d->at));
  else if (d->level)
    fb_sb_printf(t, "fusebox_%s%s %llu\n", fam, label,
                 (unsigned long long)*(const uint64_t *)(const void *)((const char *)levels + d->at));
  else {
    uint64_t v = d->at == offsetof(fb_counters, launches)
                     ? launches
                     : atomic_load((const atomic_uint_fast64_t *)(const void *)((const char *)sums +
                                                                                 d->sum_at));
    if (d->seconds)
      fb_sb_printf(t, "fusebox_%s%s %llu.%09llu\n", fam, label,
                   (unsigned long long)(v / 1000000000u), (unsigned long long)(v % 1000000000u));
    else fb_sb_printf(t, "fusebox_%s%s %llu\n", fam, label, (unsigned long long)v);
  }
}

/* Add a session's last reading of the LEVEL counters to sum (under s->mu). */
static void add_levels(fb_counters *sum, fbd_session *s) {
  pthread_mutex_lock(&s->mu);
#define CTR_ADD_SUM_(name)
#define CTR_ADD_LEVEL_(name) sum->name += s->snap.name;
#define CTR_ADD_(name, type, kind, unit, meaning) CTR_ADD_##kind##_(name)
  FB_COUNTERS(CTR_ADD_)
#undef CTR_ADD_
#undef CTR_ADD_LEVEL_
#undef CTR_ADD_SUM_
  pthread_mutex_unlock(&s->mu);
}

/* Per tenant, what the session table says now (under srv->mu). */
typedef struct tenant_now {
  fbd_tenant *t;
  uint64_t sessions, memory, limits;
  fb_counters levels; /* the LEVEL counters of its live sessions, added up */
} tenant_now;

static uint64_t session_memory(fbd_session *s) {
  pthread_mutex_lock(&s->mu);
  uint64_t m = s->snap.device_bytes;
  pthread_mutex_unlock(&s->mu);
  return m ? m : s->mem_bytes;
}

/* The compile cache on disk, per tenant (codestore.c). */
static void cs_header(void *u, const char *name, const char *type, const char *help) {
  header(u, name, type, help);
}

static void cs_value(void *u, const char *name, const char *tenant, unsigned long long v) {
  fb_sb_printf(u, "fusebox_%s{tenant=\"%s\"} %llu\n", name, tenant, v);
}

static void tenants_text(fbd_server *srv, fb_sb *t) {
  fbd_auth *a = srv->auth;
  pthread_mutex_lock(&a->mu);
  int n = a->n;
  tenant_now *v = calloc((size_t)n + 1, sizeof *v);
  uint64_t *max_s = calloc((size_t)n + 1, sizeof *max_s), *max_m = calloc((size_t)n + 1, 8);
  for (int i = 0; v && max_s && max_m && i < n; i++) {
    v[i].t = a->t[i];
    max_s[i] = (uint64_t)a->t[i]->max_sessions;
    max_m[i] = a->t[i]->memory_bytes;
  }
  pthread_mutex_unlock(&a->mu);
  if (!v || !max_s || !max_m) {
    t->oom = 1;
    goto out;
  }
  pthread_mutex_lock(&srv->mu);
  for (int k = 0; k < srv->cfg->max_sessions; k++) {
    fbd_session *s = srv->sessions[k];
    fbd_tenant *o = s ? atomic_load(&s->owner) : NULL;
    for (int i = 0; o && i < n; i++)
      if (v[i].t == o) {
        v[i].sessions++;
        v[i].memory += session_memory(s);
        v[i].limits += s->ecfg.memory_limit;
        add_levels(&v[i].levels, s);
      }
  }
  pthread_mutex_unlock(&srv->mu);
  static const struct {
    const char *name, *type, *help;
  } m[] = {
      {"tenant_sessions", "gauge", "Live sessions of the tenant."},
      {"tenant_sessions_limit", "gauge", "The tenant's max_sessions (0: none of its own)."},
      {"tenant_memory_bytes", "gauge", "Memory the tenant's sessions hold now."},
      {"tenant_memory_reserved_bytes", "gauge",
       "Sum of the memory limits of the tenant's sessions."},
      {"tenant_memory_limit_bytes", "gauge", "The tenant's memory_bytes (0: unlimited)."},
      {"tenant_sessions_created_total", "counter", "Sessions the tenant created."},
      {"tenant_calls_total", "counter", "Authenticated calls of the tenant."},
      {"tenant_denied_total", "counter", "Calls on another tenant's session, denied."},
      {"tenant_refused_total", "counter", "Sessions refused at a tenant limit, by limit."},
      {"tenant_syncs_total", "counter", "Syncs the tenant asked for."},
      {"tenant_received_bytes_total", "counter", "Request message bytes of the tenant's calls."},
      {"tenant_sent_bytes_total", "counter", "Response message bytes of the tenant's calls."},
  };
  for (size_t j = 0; j < sizeof m / sizeof m[0]; j++) {
    header(t, m[j].name, m[j].type, m[j].help);
    for (int i = 0; i < n; i++) {
      fbd_tenant *x = v[i].t;
      const char *nm = x->name; /* [A-Za-z0-9_.-]: safe in a label */
      switch (j) {
      case 0:
        fb_sb_printf(t, "fusebox_%s{tenant=\"%s\"} %llu\n", m[j].name, nm,
            (unsigned long long)v[i].sessions);
        break;
      case 1:
        fb_sb_printf(t, "fusebox_%s{tenant=\"%s\"} %llu\n", m[j].name, nm, (unsigned long long)max_s[i]);
        break;
      case 2:
        fb_sb_printf(t, "fusebox_%s{tenant=\"%s\"} %llu\n", m[j].name, nm, (unsigned long long)v[i].memory);
        break;
      case 3:
        fb_sb_printf(t, "fusebox_%s{tenant=\"%s\"} %llu\n", m[j].name, nm, (unsigned long long)v[i].limits);
        break;
      case 4:
        fb_sb_printf(t, "fusebox_%s{tenant=\"%s\"} %llu\n", m[j].name, nm, (unsigned long long)max_m[i]);
        break;
      case 5:
        fb_sb_printf(t, "fusebox_%s{tenant=\"%s\"} %llu\n", m[j].name, nm,
            (unsigned long long)atomic_load(&x->sessions_created));
        break;
      case 6:
        fb_sb_printf(t, "fusebox_%s{tenant=\"%s\"} %llu\n", m[j].name, nm,
            (unsigned long long)atomic_load(&x->calls));
        break;
      case 7:
        fb_sb_printf(t, "fusebox_%s{tenant=\"%s\"} %llu\n", m[j].name, nm,
            (unsigned long long)atomic_load(&x->denied));
        break;
      case 9:
        fb_sb_printf(t, "fusebox_%s{tenant=\"%s\"} %llu\n", m[j].name, nm,
            (unsigned long long)atomic_load(&x->syncs));
        break;
      case 10:
        fb_sb_printf(t, "fusebox_%s{tenant=\"%s\"} %llu\n", m[j].name, nm,
            (unsigned long long)atomic_load(&x->bytes_in));
        break;
      case 11:
        fb_sb_printf(t, "fusebox_%s{tenant=\"%s\"} %llu\n", m[j].name, nm,
            (unsigned long long)atomic_load(&x->bytes_out));
        break;
      default:
        fb_sb_printf(t, "fusebox_%s{tenant=\"%s\",limit=\"max_sessions\"} %llu\n", m[j].name, nm,
            (unsigned long long)atomic_load(&x->refused_sessions));
        fb_sb_printf(t, "fusebox_%s{tenant=\"%s\",limit=\"memory_bytes\"} %llu\n", m[j].name, nm,
            (unsigned long long)atomic_load(&x->refused_memory));
      }
    }
  }
  for (size_t j = 0; j < NCOUNTERS; j++) {
    counter_header(t, "tenant_", j);
    for (int i = 0; i < n; i++) {
      char label[FBD_TENANT_NAME + 16];
      snprintf(label, sizeof label, "{tenant=\"%s\"}", v[i].t->name);
      counter_value(t, "tenant_", label, j, &v[i].levels, &v[i].t->done,
                    atomic_load(&v[i].t->launches));
    }
  }
out:
  free(v);
  free(max_s);
  free(max_m);
}

/* The memory budget and each part that counts against it (budget.c). */
static void budget_text(fbd_server *srv, fb_sb *t) {
  uint64_t part[FBD_MEM_NPARTS];
  fbd_budget_usage(srv, part);
  fb_code_cache_usage u;
  fb_engine_code_cache(srv->engine, &u);
  metric(t, "memory_budget_bytes", "gauge", "The memory budget (memory_budget).",
         srv->memory_budget);
  header(t, "memory_budget_used_bytes", "gauge",
         "What counts against the memory budget now, by part.");
  for (int i = 0; i < FBD_MEM_NPARTS; i++)
    fb_sb_printf(t, "fusebox_memory_budget_used_bytes{part=\"%s\"} %llu\n", fbd_mem_part_keys[i],
        (unsigned long long)part[i]);
  metric(t, "memory_budget_refused_total", "counter",
         "Requests refused RESOURCE_EXHAUSTED because the memory budget was full.",
         atomic_load(&srv->budget_refused));
  metric(t, "code_cache_limit_bytes", "gauge",
         "Each engine's code cache bound (0: none, as for CUDA modules).", u.limit);
  metric(t, "code_cache_evictions_total", "counter",
         "Code cache entries evicted (the broker's engine: every session's under thread "
         "isolation).",
         u.evictions);
}

static void metrics_text(fbd_server *srv, fb_sb *t) {
  fb_counters levels;
  memset(&levels, 0, sizeof levels);
  pthread_mutex_lock(&srv->mu);
  fbd_stats st = srv->st;
  int active = srv->nsessions;
  for (int k = 0; k < srv->cfg->max_sessions; k++)
    if (srv->sessions[k]) add_levels(&levels, srv->sessions[k]);
  pthread_mutex_unlock(&srv->mu);
  metric(t, "up", "gauge", "1 while fuseboxd runs.", 1);
  fb_sb_printf(t,
      "# HELP fusebox_uptime_seconds Seconds since start.\n# TYPE fusebox_uptime_seconds gauge\n"
      "fusebox_uptime_seconds %.3f\n",
      fbd_now() - srv->started);
  header(t, "sandbox_wall", "gauge",
         "1 where session workers raise the sandbox wall; 0 where the kernel refused it at "
         "start or it is not asked for (docs/security.md).");
  for (int i = 0; i < FBD_NWALLS; i++)
    fb_sb_printf(t, "fusebox_sandbox_wall{wall=\"%s\"} %d\n", fbd_wall_names[i],
        srv->wall_state[i] == FBD_WALL_UP);
  metric(t, "sessions", "gauge", "Live sessions.", (uint64_t)active);
  metric(t, "sessions_limit", "gauge", "max_sessions of the server.",
         (uint64_t)srv->cfg->max_sessions);
  header(t, "sessions_ended_total", "counter", "Sessions ended, by how.");
  fb_sb_printf(t,
      "fusebox_sessions_ended_total{reason=\"closed\"} %llu\n"
      "fusebox_sessions_ended_total{reason=\"disconnected\"} %llu\n"
      "fusebox_sessions_ended_total{reason=\"reaped\"} %llu\n"
      "fusebox_sessions_ended_total{reason=\"failed\"} %llu\n",
      (unsigned long long)st.sessions_closed, (unsigned long long)st.sessions_disconnected,
      (unsigned long long)st.sessions_reaped, (unsigned long long)st.sessions_failed);
  metric(t, "sessions_created_total", "counter", "Sessions created.", st.sessions_created);
  metric(t, "syncs_total", "counter", "Syncs answered.", st.syncs);
  metric(t, "memory_bytes", "gauge", "Memory the sessions hold now.", st.memory_bytes);
  metric(t, "memory_peak_bytes", "gauge", "Highest memory_bytes since start.",
         st.memory_peak_bytes);
  header(t, "calls_refused_total", "counter",
         "Calls refused RESOURCE_EXHAUSTED at their start, by the limit they met (max_calls: "
         "calls open at once in all; max_calls_per_tenant: of one tenant).");
  fb_sb_printf(t,
      "fusebox_calls_refused_total{limit=\"max_calls\"} %llu\n"
      "fusebox_calls_refused_total{limit=\"max_calls_per_tenant\"} %llu\n",
      (unsigned long long)atomic_load(&srv->calls_refused),
      (unsigned long long)atomic_load(&srv->tenant_calls_refused));
  metric(t, "received_bytes_total", "counter", "Request message bytes received.",
         atomic_load(&srv->bytes_in));
  metric(t, "sent_bytes_total", "counter", "Response message bytes sent.",
         atomic_load(&srv->bytes_out));
  metric(t, "bad_requests_total", "counter",
         "Requests refused as malformed, naming nothing, "
         "or touching another tenant's session.",
         atomic_load(&srv->bad_requests));
  metric(t, "auth_failures_total", "counter", "Calls refused UNAUTHENTICATED.",
         atomic_load(&srv->auth->failures));
  metric(t, "checkpoints_written_total", "counter",
         "Checkpoints written: into --checkpoint-dir (asked for or periodic) or streamed to "
         "a client.", atomic_load(&srv->ckpt_written));
  metric(t, "checkpoints_restored_total", "counter", "Sessions restored from a checkpoint.",
         atomic_load(&srv->ckpt_restored));
  metric(t, "checkpoints_refused_total", "counter",
         "Checkpoints and restores refused or failed (a bad seal, another tenant's, a bad "
         "name, the memory budget, the disk).", atomic_load(&srv->ckpt_refused));
  metric(t, "checkpoint_written_bytes_total", "counter", "Sealed checkpoint bytes written.",
         atomic_load(&srv->ckpt_bytes_out));
  metric(t, "checkpoint_uploaded_bytes_total", "counter",
         "Checkpoint bytes clients uploaded to restore that passed the seal check.",
         atomic_load(&srv->ckpt_bytes_in));
  for (size_t i = 0; i < NCOUNTERS; i++) {
    counter_header(t, "", i);
    counter_value(t, "", "", i, &levels, &srv->done, st.launches);
  }
  budget_text(srv, t);
  if (srv->auth->enabled) tenants_text(srv, t);
  fbd_codestore_metrics(srv->codestore, cs_header, cs_value, t);
  char *sched = fbd_sched_metrics(srv); /* histograms and the fair scheduler, per tenant */
  if (!sched) t->oom = 1;
  else fb_sb_printf(t, "%s", sched);
  free(sched);
}

/* ---------------------------------------------------------------- the connection table */

/* The key an address is counted under: IPv4 (also as ::ffff:a.b.c.d) whole,
 * IPv6 by its /64, since one host commonly holds a whole /64. */
static void address_key(const struct sockaddr *sa, unsigned char out[16]) {
  memset(out, 0, 16);
  if (!sa) return;
  if (sa->sa_family == AF_INET) {
    out[10] = out[11] = 0xff;
    memcpy(out + 12, &((const struct sockaddr_in *)sa)->sin_addr, 4);
  } else if (sa->sa_family == AF_INET6) {
    const struct in6_addr *a = &((const struct sockaddr_in6 *)sa)->sin6_addr;
    memcpy(out, a->s6_addr, IN6_IS_ADDR_V4MAPPED(a) ? 16 : 8);
  }
}

/* Shut a connection down (m->mu held): libmicrohttpd reads the end of the
 * stream on its next round and closes it. */
static void cut(struct fbd_metrics *m, conn_slot *s, int why) {
  shutdown(s->fd, SHUT_RDWR);
  s->cut = 1;
  m->cuts[why]++;
}

/* Whether the whole head of a request ("\r\n\r\n" ends it) already waits in
 * s's socket, unread: libmicrohttpd reads and answers it in this poll round,
 * so s is as good as answered. A probe sends its request right after its
 * connect; a connection accepted just before a burst of others may not have
 * been read yet. Called on libmicrohttpd's thread (the only reader). */
static int request_waiting(const conn_slot *s) {
  char buf[4096];
  ssize_t n = recv(s->fd, buf, sizeof buf, MSG_PEEK | MSG_DONTWAIT);
  for (ssize_t i = 0; i + 3 < n; i++)
    if (buf[i] == '\r' && buf[i + 1] == '\n' && buf[i + 2] == '\r' && buf[i + 3] == '\n')
      return 1;
  return 0;
}

/* Past limit open connections (of address who, or of all when who is NULL),
 * shut down the oldest that has not sent its whole request, else the oldest;
 * never the newest (m->mu held, on libmicrohttpd's thread). */
static void make_room(struct fbd_metrics *m, const conn_slot *newest, const unsigned char *who,
                      int limit, int why) {
  for (;;) {
    int open = 0;
    conn_slot *pending = NULL, *any = NULL;
    for (int i = 0; i < m->nslot; i++) {
      conn_slot *s = &m->slot[i];
      if (!s->c || s->cut || (who && memcmp(s->who, who, 16))) continue;
      open++;
      if (s == newest) continue;
      if (!s->answered && (!pending || s->start < pending->start)) pending = s;
      if (!any || s->start < any->start) any = s;
    }
    if (open <= limit) return;
    if (pending && request_waiting(pending)) {
      pending->answered = 1; /* look again, for the next oldest */
      continue;
    }
    conn_slot *victim = pending ? pending : any;
    if (!victim) return;
    cut(m, victim, why);
  }
}

static void on_connection(void *cls, struct MHD_Connection *c, void **ctx,
                          enum MHD_ConnectionNotificationCode what) {
  struct fbd_metrics *m = cls;
  if (what == MHD_CONNECTION_NOTIFY_CLOSED) {
    conn_slot *s = *ctx;
    if (!s) return;
    pthread_mutex_lock(&m->mu);
    memset(s, 0, sizeof *s); /* before libmicrohttpd closes the descriptor */
    pthread_mutex_unlock(&m->mu);
    *ctx = NULL;
    return;
  }
  if (what != MHD_CONNECTION_NOTIFY_STARTED) return;
  const union MHD_ConnectionInfo *fd =
      MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
  const union MHD_ConnectionInfo *addr =
      MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
  *ctx = NULL;
  if (!fd) return; /* cannot happen: libmicrohttpd has just accepted it */
  pthread_mutex_lock(&m->mu);
  m->accepted++;
  conn_slot *s = NULL;
  for (int i = 0; i < m->nslot && !s; i++)
    if (!m->slot[i].c) s = &m->slot[i];
  if (!s) { /* cannot happen: libmicrohttpd holds at most nslot connections */
    shutdown(fd->connect_fd, SHUT_RDWR);
    m->cuts[CUT_LIMIT]++;
    pthread_mutex_unlock(&m->mu);
    return;
  }
  *s = (conn_slot){.c = c, .fd = fd->connect_fd, .start = fbd_now()};
  address_key(addr ? addr->client_addr : NULL, s->who);
  *ctx = s;
  make_room(m, s, s->who, m->max_per_ip, CUT_PER_IP);
  make_room(m, s, NULL, m->max_conn, CUT_LIMIT);
  /* a newcomer's deadline is the latest of all: the reaper needs waking only
   * when it sleeps with nothing to wait for */
  if (m->reaper_idle) pthread_cond_signal(&m->cv);
  pthread_mutex_unlock(&m->mu);
}

/* Shuts down every connection older than the request timeout, then sleeps
 * until the next one is due (or, with none open, until one opens). */
static void *reaper_main(void *arg) {
  struct fbd_metrics *m = arg;
  pthread_mutex_lock(&m->mu);
  while (!m->stopping) {
    double now = fbd_now(), next = 0;
    for (int i = 0; i < m->nslot; i++) {
      conn_slot *s = &m->slot[i];
      if (!s->c || s->cut) continue;
      double due = s->start + m->timeout_s;
      if (due <= now) cut(m, s, CUT_TIMEOUT);
      else if (!next || due < next) next = due;
    }
    m->reaper_idle = !next;
    if (!next) {
      pthread_cond_wait(&m->cv, &m->mu);
      continue;
    }
    struct timespec ts;
    ts.tv_sec = (time_t)next;
    ts.tv_nsec = (long)((next - (double)ts.tv_sec) * 1e9);
    if (ts.tv_nsec >= 1000000000L) ts.tv_nsec = 999999999L;
    pthread_cond_timedwait(&m->cv, &m->mu, &ts);
  }
  pthread_mutex_unlock(&m->mu);
  return NULL;
}

/* Its request arrived whole: no longer the first to go when room is made. */
static void mark_answered(struct fbd_metrics *m, struct MHD_Connection *conn) {
  const union MHD_ConnectionInfo *ci =
      MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
  conn_slot *s = ci ? ci->socket_context : NULL;
  if (!s) return;
  pthread_mutex_lock(&m->mu);
  s->answered = 1;
  pthread_mutex_unlock(&m->mu);
}

/* The port's own part of /metrics. */
static void port_text(struct fbd_metrics *m, fb_sb *t) {
  pthread_mutex_lock(&m->mu);
  uint64_t open = 0, accepted = m->accepted, cuts[NCUT];
  for (int i = 0; i < m->nslot; i++) open += m->slot[i].c && !m->slot[i].cut;
  memcpy(cuts, m->cuts, sizeof cuts);
  pthread_mutex_unlock(&m->mu);
  metric(t, "metrics_connections", "gauge", "Connections open on the metrics port now.", open);
  metric(t, "metrics_connections_total", "counter", "Connections the metrics port accepted.",
         accepted);
  header(t, "metrics_connections_cut_total", "counter",
         "Metrics port connections shut down by fuseboxd, by why: request_timeout (not done "
         "within metrics_request_timeout_s of being accepted), per_ip (room made for a newer "
         "one of the same address, past metrics_max_connections_per_ip), limit (the same past "
         "metrics_max_connections).");
  for (int i = 0; i < NCUT; i++)
    fb_sb_printf(t, "fusebox_metrics_connections_cut_total{reason=\"%s\"} %llu\n", cut_reasons[i],
        (unsigned long long)cuts[i]);
}

static enum MHD_Result reply(struct MHD_Connection *conn, unsigned status, const char *type,
                             char *body, size_t n) {
  if (!body) return MHD_NO; /* out of memory: drop the connection */
  struct MHD_Response *r = MHD_create_response_from_buffer(n, body, MHD_RESPMEM_MUST_FREE);
  if (!r) {
    free(body);
    return MHD_NO;
  }
  MHD_add_response_header(r, "Content-Type", type);
  /* one request a connection: its deadline counts from its accept */
  MHD_add_response_header(r, MHD_HTTP_HEADER_CONNECTION, "close");
  enum MHD_Result ok = MHD_queue_response(conn, status, r);
  MHD_destroy_response(r);
  return ok;
}

static enum MHD_Result handle(void *cls, struct MHD_Connection *conn, const char *url,
                              const char *method, const char *version, const char *upload,
                              size_t *upload_n, void **state) {
  (void)version;
  (void)upload;
  (void)state;
  struct fbd_metrics *m = cls;
  fbd_server *srv = m->srv;
  mark_answered(m, conn);
  if (*upload_n) return MHD_NO; /* no request bodies here */
  if (strcmp(method, "GET") && strcmp(method, "HEAD"))
    return reply(conn, 405, "text/plain", strdup("only GET\n"), 9);
  if (!strcmp(url, "/metrics")) {
    fb_sb t = {0};
    metrics_text(srv, &t);
    port_text(m, &t);
    if (t.oom) {
      free(t.p);
      return reply(conn, 500, "text/plain", strdup("out of memory\n"), 14);
    }
    return reply(conn, 200, "text/plain; version=0.0.4; charset=utf-8", t.p, t.n);
  }
  if (!strcmp(url, "/healthz")) return reply(conn, 200, "text/plain", strdup("ok\n"), 3);
  if (!strcmp(url, "/readyz")) {
    char why[256] = "", walls[256];
    int draining = atomic_load(&srv->draining); /* drain.c: send new sessions elsewhere */
    int ready = !atomic_load(&srv->stopping) && !draining &&
                fb_engine_healthy(srv->engine, why, sizeof why);
    fbd_walls_text(srv, walls, sizeof walls); /* a refused wall: said, still ready */
    char *b = malloc(640);
    if (!b) return MHD_NO;
    int n = ready ? snprintf(b, 640, "ready\n") :
                  snprintf(b, 640, "not ready: %s\n",
                           atomic_load(&srv->stopping) ? "shutting down"
                           : draining                  ? "draining"
                           : *why                      ? why
                                                       : "the device is unhealthy");
    if (walls[0] && n > 0 && n < 640)
      n += snprintf(b + n, 640 - (size_t)n, "sandbox walls refused: %s\n", walls);
    return reply(conn, ready ? 200 : 503, "text/plain", b, (size_t)(n < 640 ? n : 639));
  }
  return reply(conn, 404, "text/plain", strdup("not found (try /metrics, /healthz, /readyz)\n"),
               44);
}

/* 127.0.0.0/8 or ::1 (also as ::ffff:127.x.y.z) */
static int loopback_addr(const struct sockaddr *sa) {
  if (sa->sa_family == AF_INET)
    return (ntohl(((const struct sockaddr_in *)sa)->sin_addr.s_addr) >> 24) == 127;
  if (sa->sa_family != AF_INET6) return 0;
  const struct in6_addr *a = &((const struct sockaddr_in6 *)sa)->sin6_addr;
  return IN6_IS_ADDR_LOOPBACK(a) || (IN6_IS_ADDR_V4MAPPED(a) && a->s6_addr[12] == 127);
}

/* The table and the reaper's lock, sized from the settings; NULL with err
 * set for a setting out of range, NULL alone when out of memory. */
static struct fbd_metrics *guard_new(fbd_server *srv, char *err, size_t errlen) {
  const fbd_config *cfg = srv->cfg;
  if (err && errlen) *err = 0;
  if (cfg->metrics_max_connections > FBD_METRICS_MAX_CONNECTIONS_LIMIT) {
    fb_errf(err, errlen, "--metrics-max-connections (metrics_max_connections) %d: at most %d",
            cfg->metrics_max_connections, FBD_METRICS_MAX_CONNECTIONS_LIMIT);
    return NULL;
  }
  struct fbd_metrics *m = calloc(1, sizeof *m);
  if (!m) return NULL;
  m->srv = srv;
  m->max_conn = cfg->metrics_max_connections > 0 ? cfg->metrics_max_connections
                                                 : FBD_METRICS_MAX_CONNECTIONS_DEFAULT;
  m->max_per_ip = cfg->metrics_max_connections_per_ip > 0
                      ? cfg->metrics_max_connections_per_ip
                      : FBD_METRICS_MAX_CONNECTIONS_PER_IP_DEFAULT;
  m->timeout_s = cfg->metrics_request_timeout_s > 0 ? cfg->metrics_request_timeout_s
                                                    : FBD_METRICS_REQUEST_TIMEOUT_S_DEFAULT;
  m->nslot = m->max_conn + MHD_LIMIT_SLACK;
  if (!(m->slot = calloc((size_t)m->nslot, sizeof *m->slot))) {
    free(m);
    return NULL;
  }
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC); /* fbd_now()'s clock */
  pthread_cond_init(&m->cv, &ca);
  pthread_condattr_destroy(&ca);
  pthread_mutex_init(&m->mu, NULL);
  return m;
}

static void guard_free(struct fbd_metrics *m) {
  pthread_cond_destroy(&m->cv);
  pthread_mutex_destroy(&m->mu);
  free(m->slot);
  free(m);
}

int fbd_metrics_start(fbd_server *srv, char *err, size_t errlen) {
  const char *addr = srv->cfg->metrics_listen;
  if (!addr || !*addr) return 0;
  char host[256];
  const char *colon = strrchr(addr, ':');
  if (!colon || colon == addr || (size_t)(colon - addr) >= sizeof host || !colon[1]) {
    fb_errf(err, errlen, "--metrics-listen '%s': expected host:port", addr);
    return FB_EINVAL;
  }
  snprintf(host, sizeof host, "%.*s", (int)(colon - addr), addr);
  if (host[0] == '[' && host[strlen(host) - 1] == ']') { /* [::1]:9090 */
    memmove(host, host + 1, strlen(host));
    host[strlen(host) - 1] = 0;
  }
  struct addrinfo hints = {0}, *ai = NULL;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV | AI_PASSIVE;
  int e = getaddrinfo(host, colon + 1, &hints, &ai);
  if (e) {
    fb_errf(err, errlen, "--metrics-listen '%s': %s", addr, gai_strerror(e));
    return FB_EINVAL;
  }
  struct fbd_metrics *m = guard_new(srv, err, errlen);
  if (!m) {
    freeaddrinfo(ai);
    return *err ? FB_EINVAL : FB_ENOMEM;
  }
  /* epoll (MHD_USE_AUTO): select() could not take a descriptor past 1023,
   * and fuseboxd holds one per gRPC connection and worker */
  unsigned flags = MHD_USE_AUTO_INTERNAL_THREAD | (ai->ai_family == AF_INET6 ? MHD_USE_IPv6 : 0);
  unsigned idle = (unsigned)(m->timeout_s + 0.999); /* idle timeout: a backstop to ours */
  struct MHD_Daemon *d = MHD_start_daemon(
      flags, 0, NULL, NULL, handle, m, MHD_OPTION_SOCK_ADDR, ai->ai_addr,
      MHD_OPTION_CONNECTION_LIMIT, (unsigned)m->nslot, MHD_OPTION_CONNECTION_TIMEOUT, idle,
      MHD_OPTION_NOTIFY_CONNECTION, on_connection, m, MHD_OPTION_END);
  int local = loopback_addr(ai->ai_addr);
  freeaddrinfo(ai);
  if (!d) {
    guard_free(m);
    fb_errf(err, errlen, "--metrics-listen '%s': cannot listen there (in use?)", addr);
    return FB_EIO;
  }
  m->d = d;
  /* The kernel hands a connection over only once its first bytes arrived
   * (or the timeout passed): a probe is then accepted with its whole
   * request already waiting, which request_waiting() sees, and a client
   * that connects and sends nothing holds no slot meanwhile. */
  const union MHD_DaemonInfo *lfd = MHD_get_daemon_info(d, MHD_DAEMON_INFO_LISTEN_FD);
  int defer = (int)idle;
  if (!lfd || setsockopt(lfd->listen_fd, IPPROTO_TCP, TCP_DEFER_ACCEPT, &defer, sizeof defer))
    fbd_logf(srv->log, FBD_LOG_WARN,
             "metrics on %s: cannot set TCP_DEFER_ACCEPT: under a flood of connections a "
             "probe may be shut down before its request arrives",
             addr);
  if (pthread_create(&m->reaper, NULL, reaper_main, m)) {
    MHD_stop_daemon(d);
    guard_free(m);
    fb_errf(err, errlen, "--metrics-listen '%s': cannot start a thread", addr);
    return FB_EIO;
  }
  m->reaper_started = 1;
  srv->metrics = m;
  const union MHD_DaemonInfo *info = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
  fbd_logf(srv->log, FBD_LOG_INFO, "metrics on http://%s:%u/metrics (also /healthz, /readyz)", host,
           info ? (unsigned)info->port : 0);
  if (!local)
    fbd_logf(srv->log, FBD_LOG_WARN,
             "metrics on %s, not a loopback address: /metrics has no authentication, and whoever "
             "reaches it reads every tenant's name, counters and latencies (docs/security.md)",
             addr);
  return 0;
}

void fbd_metrics_stop(fbd_server *srv) {
  struct fbd_metrics *m = srv->metrics;
  if (!m) return;
  pthread_mutex_lock(&m->mu);
  m->stopping = 1;
  pthread_cond_signal(&m->cv);
  pthread_mutex_unlock(&m->mu);
  if (m->reaper_started) pthread_join(m->reaper, NULL);
  MHD_stop_daemon(m->d); /* closes the rest, telling on_connection */
  guard_free(m);
  srv->metrics = NULL;
}
