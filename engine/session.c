/* The engine and its sessions: backend choice, the engine's pools, session
 * create/destroy, counters, and kernel registration (verify, lower, compile
 * or intern in the IR bank). The design of the whole engine is in
 * engine/internal.h and docs/design.md. */
#include "engine/internal.h"

#include <limits.h>

/* ---------------------------------------------------------------- engine */

int fb_engine_create(const fb_engine_config *cfg, fb_engine **out, char *err, size_t errlen) {
  *out = NULL;
  const char *be = cfg && cfg->backend ? cfg->backend : "cpu";
  if (strcmp(be, "cpu") != 0 && strcmp(be, "auto") != 0 && strcmp(be, "cuda") != 0) {
    fb_errf(err, errlen, "unknown backend '%s' (expected cpu, cuda or auto)", be);
    return FB_EINVAL;
  }
  int threads = cfg ? cfg->cpu_threads : 0;
  if (threads < 0 || (cfg && cfg->compile_threads < 0)) {
    fb_errf(err, errlen, "thread counts must be >= 0 (0 = one per core)");
    return FB_EINVAL;
  }
  fb_engine *e = calloc(1, sizeof *e);
  if (!e) {
    fb_errf(err, errlen, "out of memory");
    return FB_ENOMEM;
  }
  e->standin_min_stmts = FB_STANDIN_MIN_STMTS;
  e->bg_max = FB_MAX_BG_COMPILES;
  const fb_device_ops *cpu = fb_device_ops_for("cpu"), *cuda = fb_device_ops_for("cuda");
  if (strcmp(be, "cpu") != 0) { /* auto: the GPU when there is one */
    char why[512];
    int rc = cuda->open(threads, &e->dev, why, sizeof why);
    if (rc && strcmp(be, "cuda") == 0) {
      fb_errf(err, errlen, "%s", why);
      free(e);
      return rc;
    }
  }
  e->ops = e->dev ? cuda : cpu;
  if (!e->dev) {
    int rc = cpu->open(threads, &e->dev, err, errlen);
    if (rc) {
      free(e);
      return rc;
    }
  }
  /* the active device's code cache (the GPU's takes no bound) */
  e->ops->set_code_cache_bytes(e->dev, FB_CODE_CACHE_BYTES_DEFAULT);
  pthread_mutex_init(&e->mu, NULL);
  e->compile_threads = cfg ? cfg->compile_threads : 0;
  e->next_pid = 1;
  *out = e;
  return 0;
}

/* What the compile pool compiles with: the backend's compiler, behind the
 * tests' gate. */
static int engine_compile(void *user, const fb_cg_task *t, fb_cpu_code *out, char *err,
                          size_t errlen) {
  fb_engine *e = user;
  if (e->gate && e->gate(e->gate_user, t->ir, err, errlen)) return FB_ECOMPILE;
  return e->ops->compile(e->dev, t, out, err, errlen);
}

void fb_engine_set_compile_gate(fb_engine *e, fb_compile_gate gate, void *user) {
  e->gate = gate;
  e->gate_user = user;
}

void fb_engine_test_set_standin_min_stmts(fb_engine *e, int n) { e->standin_min_stmts = n; }

void fb_engine_test_set_bg_max(fb_engine *e, int n) { e->bg_max = n; }

/* The compile pool, started with the first async session. */
static int engine_cpool(fb_engine *e, char *err, size_t errlen) {
  pthread_mutex_lock(&e->mu);
  int rc = e->cpool
               ? 0
               : fb_cpool_new_with(engine_compile, e, e->compile_threads, &e->cpool, err, errlen);
  pthread_mutex_unlock(&e->mu);
  return rc;
}

void fb_engine_destroy(fb_engine *e) {
  if (!e) return;
  fb_cpool_free(e->cpool);
  e->ops->close(e->dev);
  pthread_mutex_destroy(&e->mu);
  free(e);
}

const char *fb_engine_backend(const fb_engine *e) { return e ? e->ops->backend : "cpu"; }

const char *fb_engine_device(const fb_engine *e) {
  if (!e) return "none";
  return e->ops->name(e->dev);
}

void fb_engine_code_cache(fb_engine *e, fb_code_cache_usage *out) {
  fb_code_cache_info i = {0};
  if (e) e->ops->code_cache(e->dev, &i);
  *out = (fb_code_cache_usage){i.bytes, i.pinned_bytes, i.limit, i.entries, i.evictions};
}

void fb_engine_set_code_cache_bytes(fb_engine *e, uint64_t bytes) {
  if (e) e->ops->set_code_cache_bytes(e->dev, bytes);
}

int fb_engine_set_code_store(fb_engine *e, const fb_code_store *s) {
  if (!e || !e->ops->set_code_store) return 0;
  return e->ops->set_code_store(e->dev, s);
}

int fb_engine_healthy(fb_engine *e, char *why, size_t len) {
  if (why && len) why[0] = 0;
  return !e || e->ops->healthy(e->dev, why, len);
}

/* ---------------------------------------------------------------- sessions */

static int layout_is_sparse(const fb_layout *l) {
  for (int i = 0; i < l->nnodes; i++)
    if (fb_cg_is_sparse(l->nodes[i].kind)) return 1;
  return 0;
}

static int check_mode(const char *mode) {
  return !mode || strcmp(mode, "sync") == 0 || strcmp(mode, "async") == 0;
}

static int is_async(const fb_session_config *cfg) {
  return cfg && cfg->mode && strcmp(cfg->mode, "async") == 0;
}

/* Session bits to optimizer passes (fusion brings simplification). */
static unsigned opt_passes(unsigned p) {
  if (!(p & FB_PASSES_EXACT) && !(p & FB_PASSES_ALL)) p = FB_PASSES_ALL;
  unsigned o = 0;
  if (p & FB_PASSES_LISTGEN) o |= FB_PASS_LISTGEN;
  if (p & FB_PASSES_DEMOTE) o |= FB_PASS_DEMOTE;
  if (p & FB_PASSES_DSE) o |= FB_PASS_DSE;
  if (p & FB_PASSES_FUSION) o |= FB_PASS_FUSE | FB_PASS_SIMPLIFY;
  return o;
}

static int check_async_config(const fb_session_config *cfg, char *msg, size_t len) {
  if (cfg->passes & ~(unsigned)(FB_PASSES_ALL | FB_PASSES_EXACT)) {
    fb_errf(msg, len, "unknown pass bits 0x%x (expected FB_PASSES_* bits)",
            cfg->passes & ~(unsigned)(FB_PASSES_ALL | FB_PASSES_EXACT));
    return FB_EINVAL;
  }
  if (cfg->max_fuse_per_task < 0) {
    fb_errf(msg, len, "max_fuse_per_task must be >= 0 (0 = default), not %d",
            cfg->max_fuse_per_task);
    return FB_EINVAL;
  }
  return 0;
}

/* What the backend imposes on one task, for fusion's cost model (the one
 * place the optimizer learns it): a GPU launch takes a bounded number of
 * kernel parameters; CPU tasks read their arguments through a pointer, so
 * there the bound is none (0). The statement budget is the optimizer's default. */
static void backend_fuse_limits(const fb_engine *e, fb_opt_options *o) {
  o->max_task_params = e->ops->max_task_params();
}

/* The optimizer context, the worker and the compile pool of an async session. */
static int async_init(fb_session *s, const fb_session_config *cfg, char *msg, size_t len) {
  int rc = check_async_config(cfg, msg, len);
  if (rc || (rc = engine_cpool(s->e, msg, len))) return rc;
  async_state *a = calloc(1, sizeof *a);
  if (!a) {
    fb_errf(msg, len, "out of memory");
    return FB_ENOMEM;
  }
  pthread_mutex_init(&a->mu, NULL);
  pthread_cond_init(&a->done_cv, NULL);
  fb_map_init(&a->seen, 0);
  fb_map_init(&a->cmap, sizeof(code_ent));
  fb_map_init(&a->smap, sizeof(code_ent));
  s->as = a;
  a->flush_every = cfg->flush_every < 0 ? 0
                   : cfg->flush_every   ? cfg->flush_every
                                        : FB_FLUSH_EVERY_DEFAULT;
  a->flush_at = a->flush_every;
  a->adapt = cfg->flush_every == 0;
  fb_opt_options o;
  fb_opt_options_default(&o);
  o.passes = opt_passes(cfg->passes);
  o.max_fuse_per_task = cfg->max_fuse_per_task ? cfg->max_fuse_per_task : 1;
  backend_fuse_limits(s->e, &o);
  /* a fused task is compiled like a kernel: it keeps to the session's
   * compile budget too (a tenant's kernels each within it must not add up
   * past it through fusion) */
  int kmax =
      cfg->max_kernel_statements ? cfg->max_kernel_statements : FB_MAX_KERNEL_STATEMENTS_DEFAULT;
  if (kmax > 0 && o.max_fused_stmts > kmax) o.max_fused_stmts = kmax;
  if (!(a->o = fb_opt_new(s->layout, &o))) {
    fb_errf(msg, len, "out of memory (optimizer context)");
    return FB_ENOMEM;
  }
  return fb_ordq_new(fbe_worker_run, s, &a->q, msg, len);
}

int fb_session_create(fb_engine *e, const fb_session_config *cfg, const fb_layout *layout,
                      fb_session **out, char *err, size_t errlen) {
  char msg[ERRLEN];
  *out = NULL;
  if (!e || !layout) return FB_EINVAL;
  if (!layout->finalized) {
    fb_errf(err, errlen, "the session's layout is not finalized");
    return FB_EINVAL;
  }
  if (cfg && !check_mode(cfg->mode)) {
    fb_errf(err, errlen, "unknown session mode '%s' (expected sync or async)", cfg->mode);
    return FB_EINVAL;
  }
  fb_session *s = calloc(1, sizeof *s);
  if (!s || !(s->layout = fb_layout_clone(layout))) {
    free(s);
    fb_errf(err, errlen, "out of memory");
    return FB_ENOMEM;
  }
  pthread_mutex_init(&s->cmu, NULL);
  s->e = e;
  s->seed = cfg ? cfg->seed : 0;
  s->max_stmts = !cfg || !cfg->max_kernel_statements ? FB_MAX_KERNEL_STATEMENTS_DEFAULT
                 : cfg->max_kernel_statements < 0    ? 0
                                                     : cfg->max_kernel_statements;
  s->internal_ok = cfg && cfg->allow_internal_ops;
  s->kernel_cap = UINT64_MAX;
  s->partition = cfg ? cfg->cache_partition : 0;
  s->cfg_passes = cfg ? cfg->passes : 0;
  s->cfg_flush_every = cfg ? cfg->flush_every : 0;
  s->cfg_max_fuse = cfg ? cfg->max_fuse_per_task : 0;
  s->pins = fb_code_pins_new(); /* NULL (out of memory): its code is pinned for good */
  pthread_mutex_lock(&e->mu);
  s->pid = e->next_pid++;
  pthread_mutex_unlock(&e->mu);
  int rc = e->ops->queue_new(e->dev, &s->q, msg, sizeof msg);
  if (!rc)
    rc = fb_devmem_init_on(&s->mem, e->ops->memsys(s->q), s->layout->root_bytes,
                           cfg ? cfg->memory_limit : 0, msg, sizeof msg);
  if (!rc) rc = fb_devmem_reserve(&s->mem, 0, 1, msg, sizeof msg);
  if (!rc && layout_is_sparse(s->layout))
    rc = fb_sparse_new(s->layout, &s->mem, &s->sparse, msg, sizeof msg);
  if (!rc && is_async(cfg)) rc = async_init(s, cfg, msg, sizeof msg);
  if (rc) {
    fb_errf(err, errlen, "%s", msg);
    fb_session_destroy(s);
    return rc;
  }
  s->dev_bytes = fb_devmem_used(&s->mem);
  *out = s;
  return 0;
}

static void kernel_free(fb_session *s, sess_kernel *k) {
  for (int t = 0; k->h && t < k->tl.n; t++)
    if (k->h[t] != FB_IRH_NONE) fb_opt_release(s->as->o, k->h[t]);
  free(k->h);
  fb_task_list_free(&k->tl);
  fb_kernel_free(k->k);
  free(k->irs);
  free(k->code);
  free(k->hints);
  memset(k, 0, sizeof *k);
}

/* Stop the worker (it finishes what it was given) and free the rest. */
static void async_free(fb_session *s) {
  async_state *a = s->as;
  if (a->q) fb_ordq_free(a->q);
  a->q = NULL;
  if (a->o) fbe_reap(s);
  if (a->o) fbe_standins_free(s);
  if (a->o) fbe_cmap_clear(a);
}

void fb_session_destroy(fb_session *s) {
  if (!s) return;
  if (s->as) async_free(s);
  fbe_trace_close(s);
  fbe_ad_free(s);
  for (int i = 0; i < s->nkernels; i++) kernel_free(s, &s->kernels[i]);
  free(s->kernels);
  free(s->args);
  if (s->as) {
    fb_opt_free(s->as->o);
    free(s->as->win);
    free(s->as->prev_args);
    fb_map_free(&s->as->seen);
    pthread_cond_destroy(&s->as->done_cv);
    pthread_mutex_destroy(&s->as->mu);
    free(s->as);
  }
  fb_sparse_free(s->sparse);
  fb_devmem_release(&s->mem);
  if (s->q) s->e->ops->queue_free(s->q); /* after the memory it supplied */
  fb_layout_free(s->layout);
  fb_code_pins_release(s->pins); /* last: nothing of the session runs its code now */
  pthread_mutex_destroy(&s->cmu);
  free(s);
}

const char *fb_session_errmsg(const fb_session *s) { return s ? s->err : "no session"; }

const fb_layout *fb_session_layout(const fb_session *s) { return s->layout; }

/* Async: the optimizer's totals, the device bytes as of the last quiet
 * point and the rest under the lock the worker takes. */
static void async_counters(const fb_session *s, fb_counters *out) {
  fb_session *m = (fb_session *)s;
  pthread_mutex_lock(&m->cmu);
  *out = s->c;
  out->device_bytes = s->dev_bytes;
  pthread_mutex_unlock(&m->cmu);
  out->launches += s->as->launches;
  const fb_opt_counters *t = &fb_opt_get_stats(s->as->o)->total;
  out->listgens_removed = t->listgen_removed;
  out->tasks_fused = t->tasks_fused;
  out->fuse_refused = t->fuse_refused;
  out->plans_reused = t->plans_reused;
  out->dead_stores_removed = t->dead_stores + t->tasks_deleted;
  out->activations_demoted = t->demoted;
  out->optimizer_s = t->optimizer_s;
  out->flushes = s->as->flushes;
  out->tasks_pending = (uint64_t)fb_opt_pending(s->as->o);
}

uint64_t fb_session_pending_bytes(const fb_session *s) {
  return s && s->as ? atomic_load(&s->as->pending_bytes) : 0;
}

void fb_session_counters(const fb_session *s, fb_counters *out) {
  if (s->as) {
    async_counters(s, out);
    return;
  }
  *out = s->c;
  out->device_bytes = fb_devmem_used(&s->mem);
}

uint64_t fb_session_launches(const fb_session *s) { return s ? s->launch_no : 0; }

int fb_session_last_flush(const fb_session *s, fb_flush_stats *out) {
  if (!s || !out) return FB_EINVAL;
  if (!s->as || !s->as->flushes) return FB_ENOENT;
  *out = s->as->last;
  return 0;
}

void fb_session_set_task_hook(fb_session *s, fb_task_hook fn, void *user) {
  if (!s) return;
  s->hook = fn;
  s->hook_user = user;
}

int fb_session_error_launch(const fb_session *s, uint64_t *launch, int *kernel) {
  if (!s || !s->err_bg) return FB_ENOENT;
  if (launch) *launch = s->err_launch;
  if (kernel) *kernel = s->err_kernel;
  return 0;
}

/* ---------------------------------------------------------------- kernels */

/* Every SNode a statement names must exist in the session's layout. */
static int check_snodes(fb_session *s, const fb_kernel *k) {
  for (int i = 0; i < k->nstmts; i++) {
    const fb_stmt *st = &k->stmts[i];
    if (st->op >= FB_OP__COUNT || !(fb_op_table[st->op].flags & FB_OPF_SNODE)) continue;
    /* a negative id is malformed, not a node the layout lacks */
    if (st->snode < 0)
      return fail(s, FB_EINVAL,
                  "kernel '%s': %%%d %s names SNode %d, which is not an SNode id (ids are 0 "
                  "to %d in the session's layout)",
                  k->name, i, fb_op_table[st->op].name, st->snode, s->layout->nnodes - 1);
    if (st->snode >= s->layout->nnodes)
      return fail(s, FB_ENOENT,
                  "kernel '%s': %%%d %s names SNode %d, which the session's layout "
                  "does not have (it has %d)",
                  k->name, i, fb_op_table[st->op].name, st->snode, s->layout->nnodes);
  }
  return 0;
}

static int verify(fb_session *s, const fb_kernel *k) {
  fb_diags d;
  fb_diags_init(&d);
  int rc = fb_verify(k, &d);
  if (rc) {
    char *all = fb_diags_join(&d);
    size_t n = all ? strlen(all) : 0;
    if (n && all[n - 1] == '\n') all[n - 1] = 0;
    fail(s, FB_EVERIFY, "kernel '%s' failed verification:\n%s", k->name,
         all ? all : "(out of memory)");
    free(all);
  }
  fb_diags_free(&d);
  return rc ? FB_EVERIFY : 0;
}

/* Return slots the tasks write: one past the highest ret slot. */
static int ret_slots(fb_session *s, const sess_kernel *sk, int *nrets) {
  int n = sk->k->ret != FB_T_VOID;
  for (int t = 0; t < sk->tl.n; t++) {
    const fb_kernel *ir = sk->tl.v[t].ir;
    for (int i = 0; i < ir->nstmts; i++) {
      if (ir->stmts[i].op != FB_OP_RET) continue;
      int64_t slot = ir->stmts[i].imm.i;
      if (slot < 0 || slot >= MAX_RET_SLOTS)
        return fail(s, FB_EINVAL, "kernel '%s': return slot %lld out of range [0, %d)", sk->k->name,
                    (long long)slot, MAX_RET_SLOTS);
      if (slot + 1 > n) n = (int)slot + 1;
    }
  }
  *nrets = n;
  return 0;
}

static int compile_task(fb_session *s, sess_kernel *sk, int t) {
  char msg[ERRLEN];
  const fb_task *task = &sk->tl.v[t];
  fb_cg_task cg = {task->ir, task->loop, s->partition, s->pins};
  fb_cpu_code code;
  memset(&code, 0, sizeof code);
  msg[0] = 0;
  double t0 = s->trace ? fb_trace_clock() : 0;
  int rc = engine_compile(s->e, &cg, &code, msg, sizeof msg);
  if (s->trace) {
    char name[160];
    snprintf(name, sizeof name, "compile %s", task->ir->name);
    fb_trace_span(s->trace, FB_TRACK_CLIENT, "compile", name, t0, fb_trace_clock(),
                  code.cache_hit ? "{\"cache_hit\":1}" : "{\"cache_hit\":0}");
  }
  if (!rc && !code.gpu && (!code.body || (task->loop >= 0 && !code.bounds))) rc = FB_EINTERNAL;
  if (rc) {
    char where[FBE_WHERE_MAX];
    return fail(s, rc < 0 ? rc : FB_ECOMPILE, "kernel '%s': compiling %s failed: %s", sk->k->name,
                fbe_task_where((const fb_kernel *const *)sk->irs, sk->tl.n, t, where, sizeof where),
                msg[0] ? msg : fb_strerror(rc));
  }
  sk->code[t].body = code.body;
  sk->code[t].bounds = task->loop >= 0 ? code.bounds : NULL;
  sk->code[t].gpu = code.gpu;
  sk->code[t].priv = code.priv;
  sk->hints[t].list_snode = task->kind == FB_TASK_LISTGEN ? task->snode : 0;
  sk->hints[t].grain = task->kind == FB_TASK_LISTGEN ? 1 : fbe_task_grain(task->ir, task->loop);
  sk->irs[t] = task->ir;
  fbe_count_compile(&s->c, &code);
  return 0;
}

/* ---- chunk grain
 *
 * The CPU pool hands a parallel loop out in chunks of at least
 * FB_POOL_MIN_CHUNK iterations, so that a cheap body is not split finer than
 * its scheduling costs; a loop of fewer iterations runs on the calling
 * thread alone. That counts iterations, not work: `for i in 0 .. 512 {
 * for j in 0 .. 512 { ... } }` (the usual way to write Taichi's
 * ti.ndrange(n, n)) is 512 iterations of 512 cells each and ran on one
 * thread, whatever the session's thread count (taichi_sparse.py's frame in
 * bench/real/sparse_pointer: activate and paint). An iteration that runs
 * inner loops counts as their iterations (a range with constant bounds its
 * trip count, any other loop INNER_UNKNOWN_TRIP), so the grain is
 * FB_POOL_MIN_CHUNK / that count, at least 1. Only the split changes: each
 * iteration still runs once, as a whole, on one thread. */
#define INNER_UNKNOWN_TRIP 64
#define INNER_MAX_DEPTH 16

/* Inner iterations one run of block b performs (1: no loop in it). */
static double inner_trips(const fb_kernel *k, int b, int depth) {
  if (b < 0 || b >= k->nblocks || depth > INNER_MAX_DEPTH) return 1;
  double most = 1;
  const fb_block *bl = &k->blocks[b];
  for (int i = 0; i < bl->n; i++) {
    const fb_stmt *s = &k->stmts[bl->ids[i]];
    if (s->body < 0 && s->orelse < 0) continue;
    double w = inner_trips(k, s->body, depth + 1);
    double o = inner_trips(k, s->orelse, depth + 1);
    if (o > w) w = o;
    if (s->op == FB_OP_RANGE_FOR || s->op == FB_OP_WHILE) {
      double trip = INNER_UNKNOWN_TRIP;
      if (s->op == FB_OP_RANGE_FOR && s->nargs >= 2 && s->args[0] >= 0 &&
          s->args[0] < k->nstmts && s->args[1] >= 0 && s->args[1] < k->nstmts) {
        const fb_stmt *lo = &k->stmts[s->args[0]], *hi = &k->stmts[s->args[1]];
        if (lo->op == FB_OP_CONST && hi->op == FB_OP_CONST && fb_type_is_int(lo->type) &&
            fb_type_is_int(hi->type))
          trip = hi->imm.i > lo->imm.i ? (double)(hi->imm.i - lo->imm.i) : 1;
      }
      w *= trip;
    }
    if (w > most) most = w;
  }
  return most;
}

int64_t fbe_task_grain(const fb_kernel *k, int loop) {
  if (!k || loop < 0 || loop >= k->nstmts) return 0;
  const fb_stmt *L = &k->stmts[loop];
  if (L->op != FB_OP_PAR_FOR && L->op != FB_OP_RANGE_FOR && L->op != FB_OP_STRUCT_FOR) return 0;
  double t = inner_trips(k, L->body, 0);
  if (t <= 1) return 0;
  double g = (double)FB_POOL_MIN_CHUNK / t;
  return g < 1 ? 1 : (int64_t)g;
}

int64_t fb_session_test_task_grain(const fb_kernel *task, int loop) {
  return fbe_task_grain(task, loop);
}

/* Lower the kernel into its tasks, with room for their IR (sk->irs). */
static int lower_kernel(fb_session *s, sess_kernel *sk) {
  char msg[ERRLEN];
  msg[0] = 0;
  int rc = fb_lower(sk->k, &sk->tl, msg, sizeof msg);
  if (rc)
    return fail(s, rc, "kernel '%s': lowering failed: %s", sk->k->name,
                msg[0] ? msg : fb_strerror(rc));
  sk->irs = calloc((size_t)(sk->tl.n ? sk->tl.n : 1), sizeof *sk->irs);
  if (!sk->irs) return fail(s, FB_ENOMEM, "kernel '%s': out of memory", sk->k->name);
  for (int t = 0; t < sk->tl.n; t++) sk->irs[t] = sk->tl.v[t].ir; /* what errors name (blame.c) */
  return 0;
}

static int lower_and_compile(fb_session *s, sess_kernel *sk) {
  int rc = lower_kernel(s, sk), n = sk->tl.n;
  if (rc) return rc;
  sk->code = calloc((size_t)(n ? n : 1), sizeof *sk->code);
  sk->hints = calloc((size_t)(n ? n : 1), sizeof *sk->hints);
  if (!sk->code || !sk->hints) return fail(s, FB_ENOMEM, "kernel '%s': out of memory", sk->k->name);
  for (int t = 0; t < n; t++)
    if ((rc = compile_task(s, sk, t))) return rc;
  return 0;
}

/* Async: lower the kernel and put its tasks into the session's IR bank
 * (compiled when a flush hands them out). */
static int lower_and_intern(fb_session *s, sess_kernel *sk) {
  int rc = lower_kernel(s, sk), n = sk->tl.n;
  if (rc) return rc;
  sk->h = malloc(sizeof *sk->h * (size_t)(n ? n : 1));
  if (!sk->h) return fail(s, FB_ENOMEM, "kernel '%s': out of memory", sk->k->name);
  for (int t = 0; t < n; t++) sk->h[t] = FB_IRH_NONE;
  for (int t = 0; t < n; t++) {
    sk->irs[t] = sk->tl.v[t].ir;
    if ((rc = fb_opt_intern(s->as->o, sk->tl.v[t].ir, &sk->h[t]))) {
      char where[FBE_WHERE_MAX];
      return fail(s, rc, "kernel '%s': keeping %s for async launches: %s", sk->k->name,
                  fbe_task_where((const fb_kernel *const *)sk->irs, n, t, where, sizeof where),
                  fb_opt_errmsg(s->as->o));
    }
  }
  return 0;
}

/* Scratch, return and argument slots for the kernel. */
static int reserve_slots(fb_session *s, sess_kernel *sk) {
  char msg[ERRLEN];
  int nrets = 0;
  int rc = ret_slots(s, sk, &nrets);
  if (rc) return rc;
  /* async: the worker must not be using the buffers that grow */
  int grows = sk->tl.gtmp_bytes > s->mem.gtmp_bytes || nrets > s->mem.nrets;
  if (s->as && grows) fbe_quiesce(s);
  if ((rc = fb_devmem_reserve(&s->mem, sk->tl.gtmp_bytes, nrets, msg, sizeof msg)))
    return fail(s, rc, "kernel '%s': %s", sk->k->name, msg);
  if (sk->k->nparams > s->nargs_cap) {
    uint64_t *a = realloc(s->args, sizeof(uint64_t) * (size_t)sk->k->nparams);
    if (!a) return fail(s, FB_ENOMEM, "kernel '%s': out of memory", sk->k->name);
    s->args = a;
    s->nargs_cap = sk->k->nparams;
  }
  if (s->as && grows) {
    pthread_mutex_lock(&s->cmu);
    s->dev_bytes = fb_devmem_used(&s->mem);
    pthread_mutex_unlock(&s->cmu);
  }
  return 0;
}

static int build_kernel(fb_session *s, const fb_kernel *k, sess_kernel *sk) {
  if (!k->name || k->nparams < 0 || (k->nparams && !k->params))
    return fail(s, FB_EINVAL, "malformed kernel (no name or parameter list)");
  char why[512];
  int rc = s->internal_ok ? 0 : fb_kernel_check_public(k, s->max_stmts, why, sizeof why);
  if (rc) return fail(s, rc, "%s", why);
  rc = check_snodes(s, k);
  if (rc) return rc;
  if (!(sk->k = fb_kernel_clone_to(k, s->layout)))
    return fail(s, FB_ENOMEM, "kernel '%s': out of memory", k->name);
  if ((rc = verify(s, sk->k))) return rc;
  if ((rc = s->as ? lower_and_intern(s, sk) : lower_and_compile(s, sk))) return rc;
  return reserve_slots(s, sk);
}

/* ---- what registered kernels retain (fb_session_kernel_bytes)
 * Saturating: the figure is compared with a cap, never wraps. */

#define ALLOC_OVERHEAD 16 /* malloc's header and rounding, per allocation */

static uint64_t sat_add(uint64_t a, uint64_t b) { return a > UINT64_MAX - b ? UINT64_MAX : a + b; }

static uint64_t sat_mul(uint64_t a, uint64_t b) {
  return b && a > UINT64_MAX / b ? UINT64_MAX : a * b;
}

/* One allocation of n items of size each. */
static uint64_t alloc_bytes(uint64_t n, uint64_t size) {
  return n ? sat_add(sat_mul(n, size), ALLOC_OVERHEAD) : 0;
}

/* A kernel's IR as allocated: capacities, not counts. */
static uint64_t kernel_ir_bytes(const fb_kernel *k) {
  if (!k) return 0;
  uint64_t b = alloc_bytes(1, sizeof *k);
  b = sat_add(b, alloc_bytes(k->name ? strlen(k->name) + 1 : 0, 1));
  b = sat_add(b, alloc_bytes(k->nparams > 0 ? (uint64_t)k->nparams : 0, sizeof(fb_type)));
  uint64_t nst = (uint64_t)(k->cap > k->nstmts ? k->cap : k->nstmts);
  b = sat_add(b, alloc_bytes(nst, sizeof(fb_stmt)));
  uint64_t nbl = (uint64_t)(k->bcap > k->nblocks ? k->bcap : k->nblocks);
  b = sat_add(b, alloc_bytes(nbl, sizeof(fb_block)));
  for (int i = 0; k->blocks && i < k->nblocks; i++) {
    const fb_block *bl = &k->blocks[i];
    b = sat_add(b, alloc_bytes((uint64_t)(bl->cap > bl->n ? bl->cap : bl->n), sizeof(int32_t)));
  }
  return b;
}

/* What one registered kernel holds: its copy, its tasks and their IR, the
 * per-task records, and (async) the bank's entry of each task, counted
 * once per task even where tasks share one (on the high side). */
static uint64_t kernel_retained(const fb_session *s, const sess_kernel *sk) {
  uint64_t n = (uint64_t)(sk->tl.n > 0 ? sk->tl.n : 1);
  uint64_t b = kernel_ir_bytes(sk->k);
  b = sat_add(b, alloc_bytes(n, sizeof(fb_task)));
  b = sat_add(b, alloc_bytes(n, sizeof *sk->irs));
  if (sk->code) b = sat_add(b, alloc_bytes(n, sizeof *sk->code));
  if (sk->hints) b = sat_add(b, alloc_bytes(n, sizeof *sk->hints));
  if (sk->h) b = sat_add(b, alloc_bytes(n, sizeof *sk->h));
  for (int t = 0; t < sk->tl.n; t++) {
    b = sat_add(b, kernel_ir_bytes(sk->tl.v[t].ir));
    if (sk->h && sk->h[t] != FB_IRH_NONE)
      b = sat_add(b, sat_add(fb_opt_ir_bytes(s->as->o, sk->h[t]), ALLOC_OVERHEAD * 8));
  }
  return b;
}

uint64_t fb_session_kernel_bytes(const fb_session *s) {
  if (!s) return 0;
  return sat_add(s->kernel_bytes, alloc_bytes((uint64_t)s->cap, sizeof(sess_kernel)));
}

void fb_session_set_kernel_cap(fb_session *s, uint64_t cap) {
  if (s) s->kernel_cap = cap;
}

void fb_session_drop_kernels(fb_session *s, int keep) {
  if (!s || keep < 0) return;
  fbe_tape_forget(s, keep);
  while (s->nkernels > keep) {
    sess_kernel *sk = &s->kernels[--s->nkernels];
    s->kernel_bytes = s->kernel_bytes > sk->bytes ? s->kernel_bytes - sk->bytes : 0;
    kernel_free(s, sk);
  }
}

int fb_session_add_kernel(fb_session *s, const fb_kernel *k) {
  if (!s) return FB_EINVAL;
  if (!k) return fail(s, FB_EINVAL, "no kernel given");
  if (s->nkernels == s->cap) {
    if (s->cap > INT_MAX / 2)
      return fail(s, FB_EQUOTA, "kernel '%s': the session has %d kernels, the most it can hold",
                  k->name ? k->name : "?", s->nkernels);
    int nc = s->cap ? s->cap * 2 : 8;
    sess_kernel *v = realloc(s->kernels, sizeof *v * (size_t)nc);
    if (!v) return fail(s, FB_ENOMEM, "kernel '%s': out of memory", k->name ? k->name : "?");
    s->kernels = v;
    s->cap = nc;
  }
  sess_kernel sk;
  memset(&sk, 0, sizeof sk);
  /* the session's copy alone takes its statements: a kernel that cannot
   * fit is refused before it is lowered and compiled */
  uint64_t least = k->nstmts > 0 ? (uint64_t)k->nstmts * sizeof(fb_stmt) : 0;
  if (s->kernel_cap != UINT64_MAX && sat_add(fb_session_kernel_bytes(s), least) > s->kernel_cap)
    return fail(s, FB_EQUOTA,
                "kernel '%s': its %d statements take at least %llu bytes, which the memory "
                "budget has no room for (the session's kernels hold %llu bytes) (memory_budget)",
                k->name ? k->name : "?", k->nstmts, (unsigned long long)least,
                (unsigned long long)fb_session_kernel_bytes(s));
  int rc = build_kernel(s, k, &sk);
  if (!rc) {
    /* the memory budget's share for kernels (fb_session_set_kernel_cap) */
    uint64_t b = kernel_retained(s, &sk), held = fb_session_kernel_bytes(s);
    if (sat_add(held, b) > s->kernel_cap)
      rc = fail(s, FB_EQUOTA,
                "kernel '%s': its IR takes %llu bytes, which the memory budget has no room "
                "for (the session's kernels hold %llu bytes) (memory_budget)",
                k->name, (unsigned long long)b, (unsigned long long)held);
    else s->kernel_bytes = sat_add(s->kernel_bytes, sk.bytes = b);
  }
  if (rc) {
    kernel_free(s, &sk);
    return rc;
  }
  s->kernels[s->nkernels] = sk;
  return s->nkernels++;
}

/* The most recently registered kernel of that name. */
int fb_session_find_kernel(const fb_session *s, const char *name) {
  if (!s || !name) return FB_EINVAL;
  for (int i = s->nkernels - 1; i >= 0; i--)
    if (strcmp(s->kernels[i].k->name, name) == 0) return i;
  return FB_ENOENT;
}

int fb_session_kernel_count(const fb_session *s) { return s ? s->nkernels : 0; }

int fb_session_kernel_tasks(const fb_session *s, int kernel, const fb_kernel *const **tasks,
                            int *ntasks) {
  if (!s || kernel < 0 || kernel >= s->nkernels) return FB_ENOENT;
  *tasks = (const fb_kernel *const *)s->kernels[kernel].irs;
  *ntasks = s->kernels[kernel].tl.n;
  return 0;
}

const char *fb_session_task_kind(const fb_session *s, int kernel, int task) {
  if (!s || kernel < 0 || kernel >= s->nkernels) return NULL;
  const fb_task_list *tl = &s->kernels[kernel].tl;
  return task >= 0 && task < tl->n ? fb_task_kind_name(tl->v[task].kind) : NULL;
}
