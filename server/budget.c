/* The server's one memory budget (docs/security.md, "The memory budget"):
 * what counts against it, the admission check that refuses with a message
 * naming every part (to admins; a user tenant's names only its own usage),
 * and the cap on an async session's pending launches.
 *
 * Parts and where each figure comes from:
 *  - sessions: the sessions' memory (srv->st.memory_bytes, session.c);
 *  - staging: every staging buffer of field transfers (stage.c counts
 *    them as they are mapped and unmapped);
 *  - queued responses: the response copies waiting to go out on calls
 *    (call.c; a ReadField's chunks point into its staging buffer and are
 *    counted there);
 *  - pending launches: each session's async launches not yet run, as its
 *    engine side last reported them in the watch page;
 *  - JIT code: the code cache of the broker's engine (shared by every
 *    session under thread isolation) plus, under process isolation, what
 *    each worker's own engine reported;
 *  - decoded requests: the arenas that hold decoded requests, from the
 *    start of their decode until the request is done (methods.c
 *    decode_keep: a decode may take only what the budget has free);
 *  - kernels: the IR each session's registered kernels retain (their
 *    copies, lowered tasks, the async bank's entries: the engine's
 *    fb_session_kernel_bytes), as its engine side last reported it; a
 *    RegisterKernels may add only what the budget has free
 *    (fbd_budget_kernel_cap, checked by the engine per kernel);
 *  - workers: under process isolation, each worker process's own memory
 *    (its engine, LLVM, heap, thread stacks), as the broker measures it
 *    (never the worker's word: fbd_proc_measure reads /proc/PID/statm).
 *    A session counts the larger of its worker's measure when fresh and
 *    its resident private memory now less what the session's other parts
 *    already count (the field storage, kernels, pending launches and JIT
 *    code lie in that memory too); a new session is admitted with the last
 *    fresh worker's measure before it has a worker (the session operations'
 *    charge), and each spare counts its own. worker_memory_bytes replaces
 *    every measure with one fixed charge. Which sessions have workers is
 *    the session side's to say (fbd_session_ops: charge, held_locked):
 *    nothing here asks the isolation. */
#include <stdio.h>
#include <string.h>

#include "server/server.h"

/* Every staging buffer of the process (the staging part): counted by
 * whoever allocates or frees one (stage.c, ckpt.c), read here. */
static atomic_uint_fast64_t staged;

uint64_t fbd_stage_total(void) { return atomic_load(&staged); }

void fbd_stage_count(int64_t delta) {
  if (delta >= 0) atomic_fetch_add(&staged, (uint64_t)delta);
  else atomic_fetch_sub(&staged, (uint64_t)-delta);
}

const char *const fbd_mem_part_names[FBD_MEM_NPARTS] = {
    "sessions", "staging", "queued responses", "pending launches",
    "JIT code", "decoded requests", "kernels", "workers"};
const char *const fbd_mem_part_keys[FBD_MEM_NPARTS] = {
    "sessions", "staging", "queued_responses", "pending_launches",
    "jit_code", "decoded_requests", "kernels", "workers"};

uint64_t fbd_code_cache_bytes(const fbd_config *cfg, uint64_t budget) {
  if (cfg->code_cache_bytes) return cfg->code_cache_bytes;
  uint64_t b = budget ? budget / 16 : FB_CODE_CACHE_BYTES_DEFAULT;
  return b < FB_CODE_CACHE_BYTES_DEFAULT ? (b ? b : 1) : FB_CODE_CACHE_BYTES_DEFAULT;
}

uint64_t fbd_transport_memory_bytes(const fbd_config *cfg, uint64_t budget) {
  if (cfg->transport_memory_bytes) return cfg->transport_memory_bytes;
  uint64_t b = budget / 8;
  b = b < FBD_TRANSPORT_MEMORY_MIN ? FBD_TRANSPORT_MEMORY_MIN
      : b > FBD_TRANSPORT_MEMORY_MAX ? FBD_TRANSPORT_MEMORY_MAX
                                     : b;
  uint64_t four = cfg->max_message_bytes > UINT64_MAX / 4 ? UINT64_MAX : 4 * cfg->max_message_bytes;
  return b < four ? four : b;
}

void fbd_fmt_bytes(char *out, size_t n, uint64_t v) {
  static const char *const units[] = {"KiB", "MiB", "GiB", "TiB"};
  if (v < 1024) {
    snprintf(out, n, "%llu B", (unsigned long long)v);
    return;
  }
  double x = (double)v / 1024;
  int u = 0;
  while (x >= 1024 && u < 3) {
    x /= 1024;
    u++;
  }
  if (x == (double)(uint64_t)x) snprintf(out, n, "%llu %s", (unsigned long long)x, units[u]);
  else snprintf(out, n, "%.1f %s", x, units[u]);
}

/* Under srv->mu: session s's worker (process isolation): its fresh
 * measure, or what it holds now beyond the session's other parts. */
uint64_t fbd_budget_worker_part_locked(fbd_server *srv, fbd_session *s) {
  uint64_t base = atomic_load(&s->worker_base);
  if (srv->cfg->worker_memory_bytes) return base; /* the fixed charge */
  uint64_t rss = atomic_load(&s->worker_rss);
  uint64_t others = s->accounted + atomic_load(&s->pending_bytes) +
                    atomic_load(&s->kernel_bytes) + atomic_load(&s->code_bytes);
  uint64_t beyond = rss > others ? rss - others : 0;
  return beyond > base ? beyond : base;
}

void fbd_budget_usage_locked(fbd_server *srv, uint64_t part[FBD_MEM_NPARTS]) {
  part[FBD_MEM_SESSIONS] = srv->st.memory_bytes;
  part[FBD_MEM_STAGING] = fbd_stage_total();
  part[FBD_MEM_QUEUED] = atomic_load(&srv->queued_bytes);
  part[FBD_MEM_PENDING] = 0;
  part[FBD_MEM_DECODED] = atomic_load(&srv->decoded_bytes);
  part[FBD_MEM_KERNELS] = 0;
  fb_code_cache_usage u;
  fb_engine_code_cache(srv->engine, &u);
  part[FBD_MEM_CODE] = u.bytes;
  /* the spares' (session/spawn.c measures them; none without workers) */
  part[FBD_MEM_WORKERS] = atomic_load(&srv->spare_bytes);
  for (int i = 0; i < srv->cfg->max_sessions; i++) {
    fbd_session *s = srv->sessions[i];
    if (!s) continue;
    uint64_t code, own;
    srv->ops->held_locked(s, &code, &own);
    part[FBD_MEM_PENDING] += atomic_load(&s->pending_bytes);
    part[FBD_MEM_KERNELS] += atomic_load(&s->kernel_bytes);
    part[FBD_MEM_CODE] += code;
    part[FBD_MEM_WORKERS] += own;
  }
}

void fbd_budget_usage(fbd_server *srv, uint64_t part[FBD_MEM_NPARTS]) {
  pthread_mutex_lock(&srv->mu);
  fbd_budget_usage_locked(srv, part);
  pthread_mutex_unlock(&srv->mu);
}

static uint64_t total(const uint64_t part[FBD_MEM_NPARTS]) {
  uint64_t t = 0;
  for (int i = 0; i < FBD_MEM_NPARTS; i++) t += part[i];
  return t;
}

/* Under srv->mu: what who's own sessions hold (memory, pending launches,
 * kernels, and under process isolation their workers' JIT code and own
 * memory). */
static uint64_t own_usage_locked(fbd_server *srv, const struct fbd_tenant *who) {
  uint64_t v = 0;
  for (int i = 0; i < srv->cfg->max_sessions; i++) {
    fbd_session *s = srv->sessions[i];
    if (!s || atomic_load(&s->owner) != who) continue;
    uint64_t code, own;
    srv->ops->held_locked(s, &code, &own);
    v += s->accounted + atomic_load(&s->pending_bytes) + atomic_load(&s->kernel_bytes);
    v += code + own;
  }
  return v;
}

/* "memory budget B is full: sessions S, staging T, ...": the parts. */
static void fmt_parts(char *err, size_t errlen, uint64_t budget,
                      const uint64_t part[FBD_MEM_NPARTS]) {
  char b[32], v[32];
  fbd_fmt_bytes(b, sizeof b, budget);
  fb_errf(err, errlen, "memory budget %s is full:", b);
  for (int i = 0; i < FBD_MEM_NPARTS; i++) {
    fbd_fmt_bytes(v, sizeof v, part[i]);
    fb_errcat(err, errlen, "%s %s %s", i ? "," : "", fbd_mem_part_names[i], v);
  }
}

int fbd_budget_admit_locked(fbd_server *srv, uint64_t need, const char *what,
                            const struct fbd_tenant *who, int all, char *err, size_t errlen) {
  uint64_t budget = srv->memory_budget;
  if (!budget) return 0;
  uint64_t part[FBD_MEM_NPARTS];
  fbd_budget_usage_locked(srv, part);
  uint64_t used = total(part);
  if (need <= budget && used <= budget - need) return 0;
  atomic_fetch_add(&srv->budget_refused, 1);
  char v[32], parts[FBD_ERRLEN];
  fbd_fmt_bytes(v, sizeof v, need);
  fmt_parts(parts, sizeof parts, budget, part);
  fb_errcat(parts, sizeof parts, "; %s of %s refused (memory_budget)", what, v);
  /* the parts are server-wide: the log and admins see them; a user tenant
   * sees only its own usage, as in GetStats (fbd_auth_scope_stats) */
  fbd_logf(srv->log, FBD_LOG_WARN, "%s%s%s", parts, who ? " for tenant " : "",
           who ? who->name : "");
  if (all) {
    fb_errf(err, errlen, "%s", parts);
    return FB_EQUOTA;
  }
  char b[32], mine[32];
  fbd_fmt_bytes(b, sizeof b, budget);
  fbd_fmt_bytes(mine, sizeof mine, own_usage_locked(srv, who));
  fb_errf(err, errlen,
          "memory budget %s is full: your sessions hold %s of it (their memory, pending "
          "launches, kernels, JIT code and workers); %s of %s refused (memory_budget)",
          b, mine, what, v);
  return FB_EQUOTA;
}

/* The budget's room for one of a session's own parts (mine): what the
 * budget has left once everything else in it is counted. */
static uint64_t room_for(fbd_server *srv, const _Atomic uint64_t *mine_part) {
  if (!srv->memory_budget) return UINT64_MAX;
  uint64_t part[FBD_MEM_NPARTS];
  fbd_budget_usage(srv, part);
  uint64_t used = total(part), mine = atomic_load(mine_part);
  uint64_t others = used > mine ? used - mine : 0;
  return others < srv->memory_budget ? srv->memory_budget - others : 0;
}

uint64_t fbd_budget_pending_cap(fbd_server *srv, fbd_session *s) {
  return room_for(srv, &s->pending_bytes);
}

uint64_t fbd_budget_kernel_cap(fbd_server *srv, fbd_session *s) {
  return room_for(srv, &s->kernel_bytes);
}

/* A worker's own report, trusted no further than what its process could
 * hold (its RLIMIT_AS: the session's memory limit plus the overhead; the
 * whole budget for a session without a limit): a
 * compromised worker can neither wrap the budget's sums nor claim more of
 * the budget than it could really use, which would refuse other tenants. */
uint64_t fbd_budget_reported(const fbd_session *s, uint64_t v) {
  uint64_t lim = s->ecfg.memory_limit, cap = lim + s->srv->cfg->worker_overhead_bytes;
  if (!lim || cap < lim) /* unlimited, or the sum wrapped: the whole budget at most,
                             and still no wrap of the sum over all sessions */
    cap = s->srv->memory_budget && s->srv->memory_budget < UINT64_MAX / 1024
              ? s->srv->memory_budget
              : UINT64_MAX / 1024;
  return v < cap ? v : cap;
}

void fbd_budget_note(fbd_session *s) {
  fbd_watch *w = s->watch;
  if (!w) return;
  atomic_store(&s->pending_bytes, fbd_budget_reported(s, atomic_load(&w->pending_bytes)));
  atomic_store(&s->code_bytes, fbd_budget_reported(s, atomic_load(&w->code_bytes)));
  atomic_store(&s->kernel_bytes, fbd_budget_reported(s, atomic_load(&w->kernel_bytes)));
}

void fbd_budget_stats_pb(fbd_server *srv, fbp_arena *a, Fusebox__V1__ServerStats *r) {
  Fusebox__V1__MemoryBudget *m = fbp_alloc(a, sizeof *m);
  if (!m) return;
  fusebox__v1__memory_budget__init(m);
  uint64_t part[FBD_MEM_NPARTS];
  fbd_budget_usage(srv, part);
  fb_code_cache_usage u;
  fb_engine_code_cache(srv->engine, &u);
  m->budget_bytes = srv->memory_budget;
  m->sessions_bytes = part[FBD_MEM_SESSIONS];
  m->staging_bytes = part[FBD_MEM_STAGING];
  m->queued_bytes = part[FBD_MEM_QUEUED];
  m->pending_bytes = part[FBD_MEM_PENDING];
  m->code_bytes = part[FBD_MEM_CODE];
  m->decoded_bytes = part[FBD_MEM_DECODED];
  m->kernels_bytes = part[FBD_MEM_KERNELS];
  m->workers_bytes = part[FBD_MEM_WORKERS];
  m->code_cache_limit_bytes = u.limit; /* the device's: 0 on CUDA, whose modules are unbounded */
  m->code_evictions = u.evictions;
  m->refused = atomic_load(&srv->budget_refused);
  r->memory = m;
}
