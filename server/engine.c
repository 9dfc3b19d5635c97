/* The in-process engine (include/fusebox/engine.h): wires the verifier,
 * lowering and the asynchronous optimizer (optimizer/), the CPU JIT
 * (codegen/) and the CPU device (runtime/) together.
 *
 * Sync mode: a kernel is verified, copied onto the session's layout,
 * lowered to tasks and every task compiled when it is registered; fb_launch
 * runs its tasks at once.
 *
 * Async mode: registration lowers the kernel and interns its tasks in the
 * session's IR bank (fb_opt, optimizer/sfg.h); fb_launch inserts them into
 * the SFG with the packed arguments and the launch number. A flush (see
 * engine.h for the triggers) optimizes the window on the caller's thread
 * and hands the batch to the session's ordered worker (runtime fb_ordq),
 * which queues one compile job per distinct task IR on the engine's compile
 * pool and runs the tasks in SFG order as each one's code is ready (waiting
 * on, or itself compiling, a job no pool thread has started; IR it had
 * compiled before is looked up in the code cache by the launcher itself,
 * without waking a compile thread). A flush the caller will wait for anyway
 * (sync, host access, return value) runs on the caller's thread when the
 * worker is idle. Batches the worker finished are freed by the caller's
 * thread (fb_opt is used by that thread only). Errors of background launches are kept (the first, and a
 * count of the rest) and reported at the next sync point. A fused task
 * that cannot be compiled or launched runs as its unfused parts instead
 * (fall_back: no lost work, docs/optimizer.md).
 *   The device state the optimizer models: one scratch buffer (gtmp) and
 * one set of return slots per session, shared by every launch (FB_SK_GTMP
 * and FB_SK_RET states of 8-byte slots); rets are zeroed at the start of
 * each batch, and a kernel with a return value always ends its batch.
 *
 * Layouts with sparse SNodes get the sparse runtime (runtime/sparse.c):
 * its state is every task's ctx->runtime, list tasks are sized before they
 * run, and a block that does not fit in the session's memory limit is
 * reported as FB_EQUOTA naming the kernel and the SNode (docs/sparse.md).
 *
 * Sharing: an engine holds the JIT (and its code cache), the thread pool
 * and the compile pool, all safe to use from several threads; everything
 * else belongs to one session, and a session is used by one thread at a
 * time (plus its own worker, which touches only device memory, the sparse
 * runtime and what it shares under the session's mutexes). Sessions must be
 * destroyed before their engine (their code lives in the engine's JIT). */
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codegen/codegen.h"
#include "fusebox/engine.h"
#include "optimizer/optimizer.h"
#include "optimizer/sfg.h"
#include "runtime/runtime.h"
#include "server/engine_test.h"

#define ERRLEN 2048
#define MAX_RET_SLOTS 1024
#define MAX_PATH 64
#define NO_LAUNCH UINT64_MAX

struct fb_engine {
  fb_cpu_jit *jit;
  fb_cpu_device *dev;
  fb_cuda_device *gpu;  /* the CUDA backend: sessions run there */
  char cpu_name[64];    /* fb_engine_device of the CPU backend */
  pthread_mutex_t mu;  /* guards cpool creation and next_pid */
  int compile_threads; /* as configured (0 = one per core) */
  fb_cpool *cpool;     /* made with the first async session */
  int next_pid;        /* timeline process ids */
  fb_compile_gate gate; /* tests: compiles it refuses (server/engine_test.h) */
  void *gate_user;
};

typedef struct sess_kernel {
  fb_kernel *k;            /* copy on the session's layout */
  fb_task_list tl;         /* its tasks, in launch order */
  const fb_kernel **irs;   /* tl.v[i].ir, for fb_session_kernel_tasks */
  fb_rt_task *code;        /* sync: compiled entry points per task */
  fb_rt_hint *hints;       /* sync: per task: list to size, chunk grain */
  fb_irh *h;               /* async: banked IR per task (one reference each) */
} sess_kernel;

/* The kernel of one launch of a flushed window. */
typedef struct launch_rec {
  int kernel;
  const char *name;        /* the session's copy of the kernel's name */
} launch_rec;

/* A flushed batch on its way through the worker. */
typedef struct async_job {
  fb_ordq_item link;       /* first: the queue's */
  fb_session *s;
  fb_opt_batch *b;
  uint64_t flush;
  uint64_t base;           /* launch number of launches[0] */
  launch_rec *launches;
  int nlaunches;
  fb_rt_task *pre;         /* per entry: code the caller knew at the flush
                              (body NULL: none) */
  /* the launcher's; the caller learns the new code from them at the end */
  fb_cjob *cj;             /* one compile job per distinct unknown IR */
  int *which;              /* per entry: its job, -1 for known code */
  int ncj;
  struct async_job *done_next;
} async_job;

/* Compiled code of a banked task IR (async_state.cmap). */
typedef struct code_ent {
  fb_irh h;
  fb_rt_task code;
} code_ent;

/* The first error of the background launches since the last report. */
typedef struct bg_error {
  int code;                /* 0: none */
  uint64_t launch;         /* NO_LAUNCH: not tied to a launch */
  int kernel;
  uint64_t more;           /* errors after it */
  char msg[ERRLEN];
} bg_error;

typedef struct async_state {
  fb_opt *o;
  fb_ordq *q;              /* the ordered worker */
  int flush_every;         /* 0: never */
  uint64_t flushes;
  /* the window: the kernel of every launch since the last flush */
  launch_rec *win;
  int nwin, capwin;
  uint64_t win_base;
  fb_flush_stats last;
  fb_graph_trace_fn gfn;   /* SFG trace */
  void *guser;
  uint64_t gflush, gcur;
  pthread_mutex_t mu;      /* guards done and err (shared with the worker) */
  async_job *done;         /* batches the worker finished, to free */
  bg_error err;
  /* the launcher's (the worker, or the caller while the worker is idle):
   * task IR it has had compiled, a hint that the code cache holds it, so
   * that it looks the code up itself instead of waking a compile thread */
  uint64_t *seen;          /* open addressing; 0 = empty */
  size_t nseen, capseen;
  /* the caller's: code of task IR, by handle (each holds a reference, so
   * a handle in the map always names the same IR) */
  code_ent *cmap;          /* open addressing; h == FB_IRH_NONE: empty */
  int ncmap, capcmap;
} async_state;

struct fb_session {
  fb_engine *e;
  fb_layout *layout;       /* the session's own copy */
  uint64_t seed;
  int max_stmts;           /* compile budget per kernel, 0 = none */
  int internal_ok;         /* fb_session_config.allow_internal_ops */
  uint64_t launch_no;      /* launches so far: rand()'s launch number */
  fb_devmem mem;
  fb_sparse *sparse;       /* NULL when the layout has no sparse SNode */
  fb_cuda_queue *q;        /* CUDA backend: the session's stream */
  sess_kernel *kernels;
  int nkernels, cap;
  uint64_t *args;          /* argument slots, nargs_cap of them */
  int nargs_cap;
  fb_counters c;           /* async: under cmu (the worker adds to it) */
  pthread_mutex_t cmu;
  uint64_t dev_bytes;      /* async: device_bytes at the last quiet point */
  async_state *as;         /* NULL in sync mode */
  fb_trace *trace;         /* timeline, NULL when off */
  FILE *trace_file;
  int pid;
  int err_bg;              /* err is a background launch's: */
  uint64_t err_launch;     /* ... its launch number and kernel */
  int err_kernel;
  char err[ERRLEN];
  fb_task_hook hook;       /* fb_session_set_task_hook, or NULL */
  void *hook_user;
};

static int fail(fb_session *s, int code, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

static int fail(fb_session *s, int code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(s->err, sizeof s->err, fmt, ap);
  va_end(ap);
  s->err_bg = 0;
  return code;
}

static void set_err(char *err, size_t errlen, const char *msg) {
  if (err && errlen) snprintf(err, errlen, "%s", msg);
}

/* ---------------------------------------------------------------- engine */

int fb_engine_create(const fb_engine_config *cfg, fb_engine **out, char *err, size_t errlen) {
  *out = NULL;
  const char *be = cfg && cfg->backend ? cfg->backend : "cpu";
  if (strcmp(be, "cpu") != 0 && strcmp(be, "auto") != 0 && strcmp(be, "cuda") != 0) {
    if (err && errlen) snprintf(err, errlen, "unknown backend '%s' (expected cpu, cuda or auto)", be);
    return FB_EINVAL;
  }
  int threads = cfg ? cfg->cpu_threads : 0;
  if (threads < 0 || (cfg && cfg->compile_threads < 0)) {
    set_err(err, errlen, "thread counts must be >= 0 (0 = one per core)");
    return FB_EINVAL;
  }
  fb_engine *e = calloc(1, sizeof *e);
  if (!e) {
    set_err(err, errlen, "out of memory");
    return FB_ENOMEM;
  }
  if (strcmp(be, "cpu") != 0) { /* auto: the GPU when there is one */
    char why[512];
    int rc = fb_cuda_device_new(&e->gpu, why, sizeof why);
    if (rc && strcmp(be, "cuda") == 0) {
      set_err(err, errlen, why);
      free(e);
      return rc;
    }
  }
  int rc = fb_cpu_device_new(threads, &e->dev, err, errlen);
  if (rc) {
    fb_cuda_device_free(e->gpu);
    free(e);
    return rc;
  }
  e->jit = fb_cpu_jit_new(err, errlen);
  if (!e->jit) {
    fb_cuda_device_free(e->gpu);
    fb_cpu_device_free(e->dev);
    free(e);
    return FB_EDEVICE;
  }
  pthread_mutex_init(&e->mu, NULL);
  snprintf(e->cpu_name, sizeof e->cpu_name, "CPU (%d threads)", fb_pool_threads(e->dev->pool));
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
  return e->gpu ? fb_cuda_compile(e->gpu, t, out, err, errlen)
                : fb_cpu_jit_compile(e->jit, t, out, err, errlen);
}

void fb_engine_set_compile_gate(fb_engine *e, fb_compile_gate gate, void *user) {
  e->gate = gate;
  e->gate_user = user;
}

/* The compile pool, started with the first async session. */
static int engine_cpool(fb_engine *e, char *err, size_t errlen) {
  pthread_mutex_lock(&e->mu);
  int rc = e->cpool ? 0
                    : fb_cpool_new_with(engine_compile, e, e->compile_threads, &e->cpool, err,
                                        errlen);
  pthread_mutex_unlock(&e->mu);
  return rc;
}

void fb_engine_destroy(fb_engine *e) {
  if (!e) return;
  fb_cpool_free(e->cpool);
  fb_cpu_jit_free(e->jit);
  fb_cpu_device_free(e->dev);
  fb_cuda_device_free(e->gpu);
  pthread_mutex_destroy(&e->mu);
  free(e);
}

const char *fb_engine_backend(const fb_engine *e) { return e && e->gpu ? "cuda" : "cpu"; }

const char *fb_engine_device(const fb_engine *e) {
  if (!e) return "none";
  return e->gpu ? fb_cuda_device_name(e->gpu) : e->cpu_name;
}

int fb_engine_healthy(fb_engine *e, char *why, size_t len) {
  if (why && len) why[0] = 0;
  return !e || !e->gpu || fb_cuda_device_healthy(e->gpu, why, len);
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

static void worker_run(void *user, fb_ordq_item *it); /* the ordered worker */
static void reap(fb_session *s);
static void quiesce(fb_session *s);
static void cmap_clear(async_state *a);

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
    snprintf(msg, len, "unknown pass bits 0x%x (expected FB_PASSES_* bits)",
             cfg->passes & ~(unsigned)(FB_PASSES_ALL | FB_PASSES_EXACT));
    return FB_EINVAL;
  }
  if (cfg->max_fuse_per_task < 0) {
    snprintf(msg, len, "max_fuse_per_task must be >= 0 (0 = default), not %d",
             cfg->max_fuse_per_task);
    return FB_EINVAL;
  }
  return 0;
}

/* What the backend imposes on one task, for fusion's cost model (the one
 * place the optimizer learns it): a GPU launch takes a bounded number of
 * kernel parameters; CPU tasks read their arguments through a pointer, so
 * there the bound is none. The statement budget is the optimizer's default. */
static void backend_fuse_limits(const fb_engine *e, fb_opt_options *o) {
  o->max_task_params = e->gpu ? fb_cuda_max_task_params() : 0;
}

/* The optimizer context, the worker and the compile pool of an async session. */
static int async_init(fb_session *s, const fb_session_config *cfg, char *msg, size_t len) {
  int rc = check_async_config(cfg, msg, len);
  if (rc || (rc = engine_cpool(s->e, msg, len))) return rc;
  async_state *a = calloc(1, sizeof *a);
  if (!a) {
    snprintf(msg, len, "out of memory");
    return FB_ENOMEM;
  }
  pthread_mutex_init(&a->mu, NULL);
  s->as = a;
  a->flush_every = cfg->flush_every < 0 ? 0 : cfg->flush_every ? cfg->flush_every
                                                               : FB_FLUSH_EVERY_DEFAULT;
  fb_opt_options o;
  fb_opt_options_default(&o);
  o.passes = opt_passes(cfg->passes);
  o.max_fuse_per_task = cfg->max_fuse_per_task ? cfg->max_fuse_per_task : 1;
  backend_fuse_limits(s->e, &o);
  if (!(a->o = fb_opt_new(s->layout, &o))) {
    snprintf(msg, len, "out of memory (optimizer context)");
    return FB_ENOMEM;
  }
  return fb_ordq_new(worker_run, s, &a->q, msg, len);
}

int fb_session_create(fb_engine *e, const fb_session_config *cfg, const fb_layout *layout,
                      fb_session **out, char *err, size_t errlen) {
  char msg[ERRLEN];
  *out = NULL;
  if (!e || !layout) return FB_EINVAL;
  if (!layout->finalized) {
    set_err(err, errlen, "the session's layout is not finalized");
    return FB_EINVAL;
  }
  if (cfg && !check_mode(cfg->mode)) {
    snprintf(msg, sizeof msg, "unknown session mode '%s' (expected sync or async)", cfg->mode);
    set_err(err, errlen, msg);
    return FB_EINVAL;
  }
  fb_session *s = calloc(1, sizeof *s);
  if (!s || !(s->layout = fb_layout_clone(layout))) {
    free(s);
    set_err(err, errlen, "out of memory");
    return FB_ENOMEM;
  }
  pthread_mutex_init(&s->cmu, NULL);
  s->e = e;
  s->seed = cfg ? cfg->seed : 0;
  s->max_stmts = !cfg || !cfg->max_kernel_statements ? FB_MAX_KERNEL_STATEMENTS_DEFAULT
                 : cfg->max_kernel_statements < 0    ? 0
                                                     : cfg->max_kernel_statements;
  s->internal_ok = cfg && cfg->allow_internal_ops;
  pthread_mutex_lock(&e->mu);
  s->pid = e->next_pid++;
  pthread_mutex_unlock(&e->mu);
  int rc = e->gpu ? fb_cuda_queue_new(e->gpu, &s->q, msg, sizeof msg) : 0;
  if (!rc)
    rc = fb_devmem_init_on(&s->mem, s->q ? fb_cuda_queue_memsys(s->q) : NULL,
                           s->layout->root_bytes, cfg ? cfg->memory_limit : 0, msg, sizeof msg);
  if (!rc) rc = fb_devmem_reserve(&s->mem, 0, 1, msg, sizeof msg);
  if (!rc && layout_is_sparse(s->layout))
    rc = fb_sparse_new(s->layout, &s->mem, &s->sparse, msg, sizeof msg);
  if (!rc && is_async(cfg)) rc = async_init(s, cfg, msg, sizeof msg);
  if (rc) {
    set_err(err, errlen, msg);
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

static void trace_close(fb_session *s);

/* Stop the worker (it finishes what it was given) and free the rest. */
static void async_free(fb_session *s) {
  async_state *a = s->as;
  if (a->q) fb_ordq_free(a->q);
  a->q = NULL;
  if (a->o) reap(s);
  if (a->o) cmap_clear(a);
}

void fb_session_destroy(fb_session *s) {
  if (!s) return;
  if (s->as) async_free(s);
  trace_close(s);
  for (int i = 0; i < s->nkernels; i++) kernel_free(s, &s->kernels[i]);
  free(s->kernels);
  free(s->args);
  if (s->as) {
    fb_opt_free(s->as->o);
    free(s->as->win);
    free(s->as->seen);
    pthread_mutex_destroy(&s->as->mu);
    free(s->as);
  }
  fb_sparse_free(s->sparse);
  fb_devmem_release(&s->mem);
  fb_cuda_queue_free(s->q); /* after the memory it supplied */
  fb_layout_free(s->layout);
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
  const fb_opt_counters *t = &fb_opt_get_stats(s->as->o)->total;
  out->listgens_removed = t->listgen_removed;
  out->tasks_fused = t->tasks_fused;
  out->fuse_refused = t->fuse_refused;
  out->dead_stores_removed = t->dead_stores + t->tasks_deleted;
  out->activations_demoted = t->demoted;
  out->optimizer_s = t->optimizer_s;
  out->flushes = s->as->flushes;
  out->tasks_pending = (uint64_t)fb_opt_pending(s->as->o);
}

void fb_session_counters(const fb_session *s, fb_counters *out) {
  if (s->as) {
    async_counters(s, out);
    return;
  }
  *out = s->c;
  out->device_bytes = fb_devmem_used(&s->mem);
}

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
    if (st->snode < 0 || st->snode >= s->layout->nnodes)
      return fail(s, FB_ENOENT, "kernel '%s': %%%d %s names SNode %d, which the session's layout "
                  "does not have (it has %d)", k->name, i, fb_op_table[st->op].name, st->snode,
                  s->layout->nnodes);
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
        return fail(s, FB_EINVAL, "kernel '%s': return slot %lld out of range [0, %d)",
                    sk->k->name, (long long)slot, MAX_RET_SLOTS);
      if (slot + 1 > n) n = (int)slot + 1;
    }
  }
  *nrets = n;
  return 0;
}

static int compile_task(fb_session *s, sess_kernel *sk, int t) {
  char msg[ERRLEN];
  const fb_task *task = &sk->tl.v[t];
  fb_cg_task cg = {task->ir, task->loop};
  fb_cpu_code code;
  memset(&code, 0, sizeof code);
  msg[0] = 0;
  double t0 = s->trace ? fb_trace_clock() : 0;
  int rc = s->e->gpu ? fb_cuda_compile(s->e->gpu, &cg, &code, msg, sizeof msg)
                     : fb_cpu_jit_compile(s->e->jit, &cg, &code, msg, sizeof msg);
  if (s->trace) {
    char name[160];
    snprintf(name, sizeof name, "compile %s", task->ir->name);
    fb_trace_span(s->trace, FB_TRACK_CLIENT, "compile", name, t0, fb_trace_clock(),
                  code.cache_hit ? "{\"cache_hit\":1}" : "{\"cache_hit\":0}");
  }
  if (!rc && !code.gpu && (!code.body || (task->loop >= 0 && !code.bounds))) rc = FB_EINTERNAL;
  if (rc)
    return fail(s, rc < 0 ? rc : FB_ECOMPILE, "kernel '%s': compiling task %d (%s) failed: %s",
                sk->k->name, t, task->ir->name, msg[0] ? msg : fb_strerror(rc));
  sk->code[t].body = code.body;
  sk->code[t].bounds = task->loop >= 0 ? code.bounds : NULL;
  sk->code[t].gpu = code.gpu;
  sk->hints[t].list_snode = task->kind == FB_TASK_LISTGEN ? task->snode : 0;
  sk->hints[t].grain = task->kind == FB_TASK_LISTGEN ? 1 : 0;
  sk->irs[t] = task->ir;
  if (code.cache_hit) s->c.cache_hits++;
  else {
    s->c.tasks_compiled++;
    s->c.statements_emitted += (uint64_t)code.stmts_emitted;
  }
  s->c.compile_s += code.compile_s;
  return 0;
}

static int lower_and_compile(fb_session *s, sess_kernel *sk) {
  char msg[ERRLEN];
  msg[0] = 0;
  int rc = fb_lower(sk->k, &sk->tl, msg, sizeof msg);
  if (rc)
    return fail(s, rc, "kernel '%s': lowering failed: %s", sk->k->name,
                msg[0] ? msg : fb_strerror(rc));
  int n = sk->tl.n;
  sk->irs = calloc((size_t)(n ? n : 1), sizeof *sk->irs);
  sk->code = calloc((size_t)(n ? n : 1), sizeof *sk->code);
  sk->hints = calloc((size_t)(n ? n : 1), sizeof *sk->hints);
  if (!sk->irs || !sk->code || !sk->hints)
    return fail(s, FB_ENOMEM, "kernel '%s': out of memory", sk->k->name);
  for (int t = 0; t < n; t++)
    if ((rc = compile_task(s, sk, t))) return rc;
  return 0;
}

/* Async: lower the kernel and put its tasks into the session's IR bank
 * (compiled when a flush hands them out). */
static int lower_and_intern(fb_session *s, sess_kernel *sk) {
  char msg[ERRLEN];
  msg[0] = 0;
  int rc = fb_lower(sk->k, &sk->tl, msg, sizeof msg);
  if (rc)
    return fail(s, rc, "kernel '%s': lowering failed: %s", sk->k->name,
                msg[0] ? msg : fb_strerror(rc));
  int n = sk->tl.n;
  sk->irs = calloc((size_t)(n ? n : 1), sizeof *sk->irs);
  sk->h = malloc(sizeof *sk->h * (size_t)(n ? n : 1));
  if (!sk->irs || !sk->h) return fail(s, FB_ENOMEM, "kernel '%s': out of memory", sk->k->name);
  for (int t = 0; t < n; t++) sk->h[t] = FB_IRH_NONE;
  for (int t = 0; t < n; t++) {
    sk->irs[t] = sk->tl.v[t].ir;
    if ((rc = fb_opt_intern(s->as->o, sk->tl.v[t].ir, &sk->h[t])))
      return fail(s, rc, "kernel '%s': task %d (%s): %s", sk->k->name, t, sk->tl.v[t].ir->name,
                  fb_opt_errmsg(s->as->o));
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
  if (s->as && grows) quiesce(s);
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

int fb_session_add_kernel(fb_session *s, const fb_kernel *k) {
  if (!s) return FB_EINVAL;
  if (!k) return fail(s, FB_EINVAL, "no kernel given");
  if (s->nkernels == s->cap) {
    int nc = s->cap ? s->cap * 2 : 8;
    sess_kernel *v = realloc(s->kernels, sizeof *v * (size_t)nc);
    if (!v) return fail(s, FB_ENOMEM, "kernel '%s': out of memory", k->name ? k->name : "?");
    s->kernels = v;
    s->cap = nc;
  }
  sess_kernel sk;
  memset(&sk, 0, sizeof sk);
  int rc = build_kernel(s, k, &sk);
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

int fb_session_kernel_tasks(const fb_session *s, int kernel, const fb_kernel *const **tasks,
                            int *ntasks) {
  if (!s || kernel < 0 || kernel >= s->nkernels) return FB_ENOENT;
  *tasks = (const fb_kernel *const *)s->kernels[kernel].irs;
  *ntasks = s->kernels[kernel].tl.n;
  return 0;
}

/* ---------------------------------------------------------------- launches */

/* 0 bool, 1 integer, 2 float, -1 not a value type. */
static int type_kind(fb_type t) {
  if (t == FB_T_BOOL) return 0;
  if (fb_type_is_int(t)) return 1;
  if (fb_type_is_float(t)) return 2;
  return -1;
}

/* Values cross between types of one kind, and between bool and integers. */
static int kinds_agree(fb_type want, fb_type have) {
  int a = type_kind(want), b = type_kind(have);
  if (a < 0 || b < 0) return 0;
  return a == b || (a <= 1 && b <= 1);
}

static const char *type_name_safe(fb_type t) {
  return (unsigned)t < FB_T__COUNT ? fb_type_name(t) : "invalid";
}

static int pack_args(fb_session *s, const fb_kernel *k, const fb_value *args, int nargs) {
  if (nargs != k->nparams)
    return fail(s, FB_ETYPE, "kernel '%s' takes %d argument%s, %d given", k->name, k->nparams,
                k->nparams == 1 ? "" : "s", nargs);
  if (nargs > 0 && !args) return fail(s, FB_EINVAL, "kernel '%s': no argument values given", k->name);
  for (int i = 0; i < nargs; i++) {
    if (!kinds_agree(k->params[i], args[i].type))
      return fail(s, FB_ETYPE, "kernel '%s': argument %d (parameter of type %s) cannot take "
                  "a value of type %s", k->name, i, type_name_safe(k->params[i]),
                  type_name_safe(args[i].type));
    s->args[i] = fb_slot_pack(fb_value_cast(args[i], k->params[i]));
  }
  return 0;
}

static const char *snode_label(const fb_snode *n, char *buf, size_t len) {
  if (n->name) snprintf(buf, len, "'%s'", n->name);
  else snprintf(buf, len, "%d", n->id);
  return buf;
}

/* "out of device memory allocating a block of SNode 'x' (pointer, N bytes;
 * limit L bytes)" into buf, when the device ran out since the last call. */
static int oom_message(fb_session *s, char *buf, size_t len) {
  int sn;
  uint64_t bytes;
  if (!s->sparse || !fb_sparse_take_oom(s->sparse, &sn, &bytes)) return 0;
  const fb_snode *n = &s->layout->nodes[sn];
  char name[160];
  if (s->mem.limit)
    snprintf(buf, len, "out of device memory allocating a block of SNode %s (%s, %llu bytes; "
             "limit %llu bytes)", snode_label(n, name, sizeof name), fb_snode_kind_name(n->kind),
             (unsigned long long)bytes, (unsigned long long)s->mem.limit);
  else
    snprintf(buf, len, "out of device memory allocating a block of SNode %s (%s, %llu bytes; "
             "the block pool is exhausted)", snode_label(n, name, sizeof name),
             fb_snode_kind_name(n->kind), (unsigned long long)bytes);
  return 1;
}

static int launch_error(fb_session *s, const sess_kernel *sk, int rc, int failed,
                        const char *msg) {
  const char *task = failed >= 0 && failed < sk->tl.n ? sk->tl.v[failed].ir->name : "?";
  char oom[512];
  if (oom_message(s, oom, sizeof oom))
    return fail(s, FB_EQUOTA, "kernel '%s': %s; those accesses were skipped", sk->k->name, oom);
  if (msg && msg[0]) return fail(s, rc, "kernel '%s': %s", sk->k->name, msg);
  if (rc == FB_EBOUNDS)
    return fail(s, FB_EBOUNDS, "kernel '%s' indexed a field out of bounds (task %s); those "
                "accesses were skipped", sk->k->name, task);
  return fail(s, rc, "kernel '%s': task %s failed on the device: %s", sk->k->name, task,
              fb_strerror(rc));
}

static const uint64_t no_args[1] = {0};

/* Sync mode: a launch on the device track of the timeline. */
static void trace_launch(fb_session *s, const sess_kernel *sk, double t0) {
  char args[96];
  snprintf(args, sizeof args, "{\"launch\":%llu,\"tasks\":%d}", (unsigned long long)s->launch_no,
           sk->tl.n);
  fb_trace_span(s->trace, FB_TRACK_DEVICE, "launch", sk->k->name, t0, fb_trace_clock(), args);
}

static int async_launch(fb_session *s, int kernel, const sess_kernel *sk, fb_value *ret);

/* CUDA: the session's queue has failed (a sticky error) */
static int gpu_dead(fb_session *s) {
  char msg[ERRLEN];
  if (!s->q || !fb_cuda_queue_alive(s->q, msg, sizeof msg)) return 0;
  return fail(s, FB_EDEVICE, "%s", msg);
}

/* Sync mode on the GPU: the launch's tasks as one batch, waited for; the
 * first task whose error slot is set (or that could not be queued). */
static int gpu_run(fb_session *s, const fb_rt_ctx *ctx, const sess_kernel *sk, double *secs,
                   int *failed, char *msg, size_t len) {
  int rc = fb_cuda_begin(s->q, msg, len);
  for (int i = 0; !rc && i < sk->tl.n; i++) {
    int slot = fb_cuda_launch(s->q, ctx, &sk->code[i], &sk->hints[i], s->sparse, msg, len);
    if (slot < 0) rc = slot, *failed = i;
  }
  const int32_t *errs = NULL;
  int n = 0;
  char fmsg[ERRLEN];
  int frc = fb_cuda_finish(s->q, &errs, &n, secs, fmsg, sizeof fmsg);
  if (frc && (!rc || frc == FB_EDEVICE)) {
    snprintf(msg, len, "%s", fmsg);
    return frc;
  }
  for (int i = 0; !rc && i < n; i++)
    if (errs[i]) rc = errs[i], *failed = i;
  return rc;
}

int fb_launch(fb_session *s, int kernel, const fb_value *args, int nargs, fb_value *ret) {
  if (!s) return FB_EINVAL;
  if (kernel < 0 || kernel >= s->nkernels)
    return fail(s, FB_ENOENT, "no kernel with id %d (the session has %d)", kernel, s->nkernels);
  sess_kernel *sk = &s->kernels[kernel];
  int rc = pack_args(s, sk->k, args, nargs);
  if (rc) return rc;
  if ((rc = gpu_dead(s))) return rc;
  if (s->as) return async_launch(s, kernel, sk, ret);
  memset(s->mem.rets, 0, sizeof(uint64_t) * (size_t)s->mem.nrets);
  int32_t error = 0;
  fb_rt_ctx ctx = {s->mem.root, s->args ? s->args : no_args, s->mem.rets, s->mem.gtmp,
                   &error, s->seed, s->launch_no, NULL};
  double secs = 0;
  int failed = -1;
  char msg[ERRLEN];
  msg[0] = 0;
  if (s->sparse) {
    fb_sparse_begin(s->sparse);
    ctx.runtime = fb_sparse_state(s->sparse);
  }
  if (s->hook && s->hook(s->hook_user, sk->k->name, sk->k->name, s->launch_no)) {
    if (s->sparse) fb_sparse_end(s->sparse);
    s->hook(s->hook_user, NULL, NULL, s->launch_no);
    return fail(s, FB_ECANCELLED, "kernel '%s' (launch %llu) was cancelled before it ran",
                sk->k->name, (unsigned long long)s->launch_no);
  }
  double t0 = s->trace ? fb_trace_clock() : 0;
  if (s->q)
    rc = gpu_run(s, &ctx, sk, &secs, &failed, msg, sizeof msg);
  else
    rc = fb_cpu_run_sparse(s->e->dev, &ctx, s->sparse, sk->code, sk->hints, sk->tl.n, &secs,
                           &failed, msg, sizeof msg);
  if (s->trace) trace_launch(s, sk, t0);
  if (s->hook) s->hook(s->hook_user, NULL, NULL, s->launch_no);
  if (s->sparse) fb_sparse_end(s->sparse);
  s->launch_no++;
  s->c.launches++;
  s->c.tasks_launched += (uint64_t)sk->tl.n;
  s->c.backend_s += secs;
  if (ret) {
    if (sk->k->ret != FB_T_VOID) *ret = fb_slot_unpack(sk->k->ret, s->mem.rets[0]);
    else memset(ret, 0, sizeof *ret);
  }
  return rc ? launch_error(s, sk, rc, failed, msg) : 0;
}

/* ---------------------------------------------------------------- async: errors */

/* Keep the first error of the background launches (any thread). */
#if defined(__GNUC__)
__attribute__((format(printf, 5, 6)))
#endif
static void bg_record(fb_session *s, int code, uint64_t launch, int kernel, const char *fmt, ...) {
  async_state *a = s->as;
  pthread_mutex_lock(&a->mu);
  if (a->err.code) {
    a->err.more++;
  } else {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(a->err.msg, sizeof a->err.msg, fmt, ap);
    va_end(ap);
    a->err.code = code;
    a->err.launch = launch;
    a->err.kernel = kernel;
    a->err.more = 0;
  }
  pthread_mutex_unlock(&a->mu);
}

/* The kept error becomes the call's error (0 when there is none). */
static int report_bg(fb_session *s) {
  async_state *a = s->as;
  bg_error e;
  pthread_mutex_lock(&a->mu);
  e = a->err;
  a->err.code = 0;
  pthread_mutex_unlock(&a->mu);
  if (!e.code) return 0;
  if (e.more)
    fail(s, e.code, "%s (and %llu more error%s of background launches)", e.msg,
         (unsigned long long)e.more, e.more == 1 ? "" : "s");
  else
    fail(s, e.code, "%s", e.msg);
  if (e.launch != NO_LAUNCH) {
    s->err_bg = 1;
    s->err_launch = e.launch;
    s->err_kernel = e.kernel;
  }
  return e.code;
}

/* ---------------------------------------------------------------- async: the worker */

typedef struct batch_run {
  fb_session *s;
  async_job *j;
  uint64_t failed_launch;  /* a launch an error stopped: its other tasks are skipped */
  uint64_t ran, hits;
  double backend_s;
  int cancelled;           /* the task hook cancelled: the rest of the batch is skipped */
  const fb_opt_launch **slot; /* CUDA: the entry of each error slot of the batch */
  int gpu_rc;                 /* CUDA: the batch could not start */
  struct fallback *fallbacks; /* fused tasks run as their parts (fall_back) */
  int extra_slots;            /* CUDA: slots for those parts past the batch's n + 1 */
} batch_run;

static const launch_rec *launch_of(const async_job *j, uint64_t launch) {
  if (launch < j->base || launch - j->base >= (uint64_t)j->nlaunches) return NULL;
  return &j->launches[launch - j->base];
}

#define SEEN_MAX ((size_t)1 << 16)

static uint64_t seen_key(fb_irh h, const fb_kernel *k) {
  uint64_t x = ((uint64_t)(uint32_t)h << 32) ^ (uint64_t)(uintptr_t)k;
  x = (x ^ (x >> 31)) * 0x9e3779b97f4a7c15ull;
  x ^= x >> 29;
  return x ? x : 1;
}

static int seen_has(const async_state *a, uint64_t key) {
  if (!a->capseen) return 0;
  for (size_t i = key & (a->capseen - 1);; i = (i + 1) & (a->capseen - 1)) {
    if (a->seen[i] == key) return 1;
    if (!a->seen[i]) return 0;
  }
}

static void seen_put(async_state *a, uint64_t key);

/* Grow (or, past SEEN_MAX, forget: it is only a hint). */
static int seen_grow(async_state *a) {
  size_t old = a->capseen, cap = old && old < SEEN_MAX ? old * 2 : 1024;
  uint64_t *v = calloc(cap, sizeof *v), *prev = a->seen;
  if (!v) return 0;
  a->seen = v;
  a->capseen = cap;
  a->nseen = 0;
  for (size_t i = 0; old < SEEN_MAX && i < old; i++)
    if (prev[i]) seen_put(a, prev[i]);
  free(prev);
  return 1;
}

static void seen_put(async_state *a, uint64_t key) {
  if ((a->nseen + 1) * 2 > a->capseen && !seen_grow(a)) return;
  size_t i = key & (a->capseen - 1);
  while (a->seen[i] && a->seen[i] != key) i = (i + 1) & (a->capseen - 1);
  if (!a->seen[i]) a->nseen++;
  a->seen[i] = key;
}

/* One compile job per distinct IR handle of the batch whose code the
 * caller did not know when it flushed (a small open addressing table from
 * the handle to its first entry); known code counts once per handle as a
 * cache hit. Jobs for IR the launcher has had compiled before go to the
 * pool only if it waits for them. */
static int plan_compiles(batch_run *r) {
  async_job *j = r->j;
  int n = j->b->n, cap = 16;
  while (cap < 2 * n) cap *= 2;
  int *first = malloc(sizeof *first * (size_t)cap);
  j->cj = calloc((size_t)n, sizeof *j->cj);
  j->which = malloc(sizeof *j->which * (size_t)n);
  int rc = first && j->cj && j->which ? 0 : FB_ENOMEM;
  if (!rc) memset(first, 0xff, sizeof *first * (size_t)cap);
  for (int i = 0; !rc && i < n; i++) {
    const fb_opt_launch *L = &j->b->v[i];
    unsigned h = ((unsigned)L->ir * 2654435761u) & (unsigned)(cap - 1);
    while (first[h] >= 0 && j->b->v[first[h]].ir != L->ir) h = (h + 1) & (unsigned)(cap - 1);
    if (first[h] >= 0) {
      j->which[i] = j->which[first[h]];
      continue;
    }
    first[h] = i;
    j->which[i] = j->pre[i].body ? -1 : j->ncj++;
    if (j->pre[i].body) {
      r->hits++;
      continue;
    }
    fb_cjob *c = &j->cj[j->which[i]];
    c->task.ir = L->k;
    c->task.loop = L->loop;
    c->trace = r->s->trace;
    if (!seen_has(r->s->as, seen_key(L->ir, L->k))) fb_cpool_submit(r->s->e->cpool, c, 1);
  }
  free(first);
  return rc;
}

static void note_seen(batch_run *r) {
  const async_job *j = r->j;
  for (int i = 0; i < j->b->n; i++)
    if (j->which[i] >= 0 && !j->cj[j->which[i]].rc)
      seen_put(r->s->as, seen_key(j->b->v[i].ir, j->b->v[i].k));
}

/* The part of a (fused) task an error comes from: for FB_EBOUNDS, the one
 * part whose accesses are not all provably in bounds when there is exactly
 * one; otherwise the first part, and *others counts the parts it may also
 * be (0 when the blame is certain). */
static const fb_opt_part *blamed_part(const fb_opt_launch *L, int rc, int *others) {
  *others = 0;
  if (L->nparts <= 0) return NULL;
  if (L->nparts == 1) return &L->parts[0];
  if (rc == FB_EBOUNDS) {
    const fb_opt_part *only = NULL;
    int n = 0;
    for (int i = 0; i < L->nparts; i++)
      if (!L->parts[i].inb && !n++) only = &L->parts[i];
    if (n == 1) return only;
  }
  *others = L->nparts - 1;
  return &L->parts[0];
}

/* A failed task, said as sync mode says it, with the launch number. A
 * fused task names the part the error comes from when that is certain;
 * otherwise its first part, and how many launches were fused with it. */
static void task_error(batch_run *r, const fb_opt_launch *L, int rc, const char *msg) {
  fb_session *s = r->s;
  int others;
  const fb_opt_part *p = blamed_part(L, rc, &others);
  uint64_t launch = p ? p->launch : L->launch;
  const char *task = p ? p->task : L->k->name;
  const launch_rec *lr = launch_of(r->j, launch);
  int kid = lr ? lr->kernel : -1;
  char who[ERRLEN];
  if (others == 1)
    snprintf(who, sizeof who, "kernel '%s' (launch %llu, or the launch fused with it in task %s)",
             lr ? lr->name : "?", (unsigned long long)launch, L->k->name);
  else if (others)
    snprintf(who, sizeof who, "kernel '%s' (launch %llu, or one of the %d launches fused with it "
             "in task %s)", lr ? lr->name : "?", (unsigned long long)launch, others, L->k->name);
  else
    snprintf(who, sizeof who, "kernel '%s' (launch %llu)", lr ? lr->name : "?",
             (unsigned long long)launch);
  char oom[512];
  if (oom_message(s, oom, sizeof oom))
    bg_record(s, FB_EQUOTA, launch, kid, "%s: %s; those accesses were skipped", who, oom);
  else if (msg[0])
    bg_record(s, rc, launch, kid, "%s: %s", who, msg);
  else if (rc == FB_EBOUNDS)
    bg_record(s, rc, launch, kid, "%s indexed a field out of bounds (task %s); those accesses "
              "were skipped", who, task);
  else
    bg_record(s, rc, launch, kid, "%s: task %s failed on the device: %s", who, task,
              fb_strerror(rc));
}

static void compile_error(batch_run *r, const fb_opt_launch *L, const fb_cjob *c) {
  const launch_rec *lr = launch_of(r->j, L->launch);
  int rc = c->rc > 0 ? FB_ECOMPILE : c->rc;
  bg_record(r->s, rc, L->launch, lr ? lr->kernel : -1, "kernel '%s' (launch %llu): compiling "
            "task %s failed: %s", lr ? lr->name : "?", (unsigned long long)L->launch, L->k->name,
            c->msg[0] ? c->msg : fb_strerror(rc));
}

/* ---------------------------------------------------------------- async: no lost work
 *
 * A fused task can fail where its parts would not: its compile (a GPU
 * task's parameters, a compiler's resources) or its launch (registers per
 * thread, the launch's parameter space) is refused because it is large.
 * Such a task did not run at all, so nothing of it is lost by running its
 * parts instead, one by one, exactly as the unfused launches would have
 * run: each part's task IR as inserted, its own arguments and its own
 * launch number. An error a part still hits is reported on that part's
 * launch (the rest of that launch is skipped, as everywhere in a batch);
 * the fallback itself is counted (fb_counters.fuse_fallbacks), not an
 * error. Errors while a task runs (out of bounds, sticky device errors)
 * are not fallen back from: the task ran, and they say so. */

typedef struct fallback {
  struct fallback *next;
  int n;
  fb_opt_launch v[];       /* one per part; CUDA error slots point here */
} fallback;

static void run_entry(batch_run *r, const fb_opt_launch *L, const fb_rt_task *code);

/* Every part of L can run alone (the optimizer knew each one's shape). */
static int can_fall_back(const fb_opt_launch *L) {
  if (L->nparts < 2 || !L->parts) return 0;
  for (int i = 0; i < L->nparts; i++)
    if (!L->parts[i].k) return 0;
  return 1;
}

static void count_part_compile(fb_session *s, const fb_cjob *c) {
  if (c->rc) return;
  if (c->code.cache_hit) {
    s->c.cache_hits++;
  } else {
    s->c.tasks_compiled++;
    s->c.statements_emitted += (uint64_t)c->code.stmts_emitted;
  }
  s->c.compile_s += c->code.compile_s;
}

/* Part p of L as a launch of its own. */
static fb_opt_launch part_launch(const fb_opt_launch *L, int p) {
  const fb_opt_part *pt = &L->parts[p];
  fb_opt_launch P = {pt->ir, pt->k, pt->kind, pt->loop, pt->snode,
                     L->args ? L->args + pt->argoff : NULL, pt->nargs, pt->launch, 1, pt, 1};
  return P;
}

/* CUDA: room in r->slot for n more launches than the batch has entries. */
static int gpu_slots(batch_run *r, int n) {
  if (!r->s->q || !r->slot) return 1;
  size_t have = (size_t)r->j->b->n + 1 + (size_t)r->extra_slots;
  const fb_opt_launch **v = realloc(r->slot, sizeof *v * (have + (size_t)n));
  if (!v) return 0;
  memset(v + have, 0, sizeof *v * (size_t)n);
  r->slot = v;
  r->extra_slots += n;
  return 1;
}

/* Run the parts of fused task L, which did not run (its error rc).
 * 0 when L cannot fall back (not fused, or out of memory): the caller
 * reports the fused task's error as before. */
static int fall_back(batch_run *r, const fb_opt_launch *L, int rc) {
  fb_session *s = r->s;
  if (!can_fall_back(L) || !gpu_slots(r, L->nparts)) return 0;
  fallback *f = calloc(1, sizeof *f + sizeof f->v[0] * (size_t)L->nparts);
  fb_cjob *cj = calloc((size_t)L->nparts, sizeof *cj);
  if (!f || !cj) {
    free(f);
    free(cj);
    return 0;
  }
  f->n = L->nparts;
  f->next = r->fallbacks;
  r->fallbacks = f;
  if (s->trace) {
    char args[64];
    snprintf(args, sizeof args, "{\"parts\":%d,\"code\":%d}", L->nparts, rc);
    double t = fb_trace_clock();
    fb_trace_span(s->trace, FB_TRACK_LAUNCHER, "fallback", L->k->name, t, t, args);
  }
  for (int p = 0; p < L->nparts; p++) {
    fb_opt_launch *P = &f->v[p];
    *P = part_launch(L, p);
    if (P->launch == r->failed_launch) continue;
    fb_cjob *c = &cj[p];
    c->task.ir = P->k;
    c->task.loop = P->loop;
    c->trace = s->trace;
    fb_cpool_wait(s->e->cpool, c, FB_TRACK_LAUNCHER); /* compiled here */
    if (c->rc) {
      compile_error(r, P, c);
      r->failed_launch = P->launch;
      continue;
    }
    fb_rt_task code = {c->code.body, c->code.bounds, c->code.gpu};
    run_entry(r, P, &code);
  }
  pthread_mutex_lock(&s->cmu);
  s->c.fuse_fallbacks++;
  for (int p = 0; p < L->nparts; p++) count_part_compile(s, &cj[p]);
  pthread_mutex_unlock(&s->cmu);
  free(cj);
  return 1;
}

/* CUDA: fb_cuda_launch refused fused task L before it was queued (rc < 0);
 * unless the queue is gone (a sticky error), its parts run instead. */
static int launch_refused(batch_run *r, const fb_opt_launch *L, int rc) {
  char dead[ERRLEN];
  if (!can_fall_back(L) || fb_cuda_queue_alive(r->s->q, dead, sizeof dead)) return 0;
  return fall_back(r, L, rc);
}

static void free_fallbacks(batch_run *r) {
  while (r->fallbacks) {
    fallback *f = r->fallbacks;
    r->fallbacks = f->next;
    free(f);
  }
}

/* Run one task of the batch on the device. */
static void run_entry(batch_run *r, const fb_opt_launch *L, const fb_rt_task *code) {
  fb_session *s = r->s;
  int32_t error = 0;
  fb_rt_ctx ctx = {s->mem.root, L->args ? L->args : no_args, s->mem.rets, s->mem.gtmp,
                   &error, s->seed, L->launch, s->sparse ? fb_sparse_state(s->sparse) : NULL};
  fb_rt_task rt = {code->body, L->loop >= 0 ? code->bounds : NULL, code->gpu};
  int lg = L->kind == FB_TASK_LISTGEN;
  fb_rt_hint hint = {lg ? L->snode : 0, lg ? 1 : 0};
  double secs = 0, t0 = s->trace ? fb_trace_clock() : 0;
  int failed = -1;
  char msg[ERRLEN];
  msg[0] = 0;
  int rc;
  if (s->q) { /* queued: its error slot is read when the batch finishes */
    rc = r->gpu_rc ? r->gpu_rc
                   : fb_cuda_launch(s->q, &ctx, &rt, &hint, s->sparse, msg, sizeof msg);
    if (rc >= 0) {
      r->slot[rc] = L;
      rc = 0;
    } else if (!r->gpu_rc && launch_refused(r, L, rc)) {
      return;
    } else if (!msg[0]) {
      snprintf(msg, sizeof msg, "the GPU batch did not start: %s", fb_strerror(rc));
    }
  } else {
    rc = fb_cpu_run_sparse(s->e->dev, &ctx, s->sparse, &rt, &hint, 1, &secs, &failed, msg,
                           sizeof msg);
  }
  if (s->trace) {
    char args[96];
    snprintf(args, sizeof args, "{\"launch\":%llu,\"tasks\":%d}", (unsigned long long)L->launch,
             L->ntasks);
    fb_trace_span(s->trace, FB_TRACK_DEVICE, "task", L->k->name, t0, fb_trace_clock(), args);
  }
  r->ran++;
  r->backend_s += secs;
  if (!rc) return;
  task_error(r, L, rc, msg);
  if (msg[0] || (rc != FB_EBOUNDS && rc != FB_EQUOTA)) r->failed_launch = L->launch;
}

/* The task hook before entry L: 1 when it cancels (then the first skipped
 * launch is reported and nothing after it in the batch runs). */
static int hook_cancels(batch_run *r, const fb_opt_launch *L) {
  fb_session *s = r->s;
  if (r->cancelled) return 1;
  if (!s->hook) return 0;
  const launch_rec *lr = launch_of(r->j, L->launch);
  if (!s->hook(s->hook_user, lr ? lr->name : L->k->name, L->k->name, L->launch)) return 0;
  s->hook(s->hook_user, NULL, NULL, L->launch);
  r->cancelled = 1;
  bg_record(s, FB_ECANCELLED, L->launch, lr ? lr->kernel : -1, "kernel '%s' (launch %llu): "
            "cancelled before task %s ran; it and the later tasks of flush %llu were skipped",
            lr ? lr->name : "?", (unsigned long long)L->launch, L->k->name,
            (unsigned long long)r->j->flush);
  return 1;
}

/* Entry i: wait for its code (or compile it here), then run it. */
static void run_one(batch_run *r, int i) {
  fb_session *s = r->s;
  async_job *j = r->j;
  const fb_opt_launch *L = &j->b->v[i];
  if (hook_cancels(r, L)) return;
  if (j->which[i] < 0) {
    if (L->launch != r->failed_launch) run_entry(r, L, &j->pre[i]);
    if (s->hook) s->hook(s->hook_user, NULL, NULL, L->launch);
    return;
  }
  fb_cjob *c = &j->cj[j->which[i]];
  double t0 = s->trace ? fb_trace_clock() : 0;
  fb_cpool_wait(s->e->cpool, c, FB_TRACK_LAUNCHER);
  if (s->trace) {
    double t1 = fb_trace_clock();
    char name[160];
    snprintf(name, sizeof name, "code for %s", L->k->name);
    if (t1 - t0 > 2e-6) fb_trace_span(s->trace, FB_TRACK_LAUNCHER, "wait", name, t0, t1, NULL);
  }
  if (L->launch == r->failed_launch) return;
  if (c->rc) {
    if (fall_back(r, L, c->rc)) return;
    compile_error(r, L, c);
    r->failed_launch = L->launch;
    return;
  }
  fb_rt_task code = {c->code.body, c->code.bounds, c->code.gpu};
  run_entry(r, L, &code);
  if (s->hook) s->hook(s->hook_user, NULL, NULL, L->launch);
}

static void add_batch_counters(batch_run *r) {
  fb_session *s = r->s;
  pthread_mutex_lock(&s->cmu);
  for (int i = 0; i < r->j->ncj; i++) {
    const fb_cjob *c = &r->j->cj[i];
    if (c->rc) continue;
    if (c->code.cache_hit) {
      s->c.cache_hits++;
    } else {
      s->c.tasks_compiled++;
      s->c.statements_emitted += (uint64_t)c->code.stmts_emitted;
    }
    s->c.compile_s += c->code.compile_s;
  }
  s->c.cache_hits += r->hits;
  s->c.tasks_launched += r->ran;
  s->c.backend_s += r->backend_s;
  s->dev_bytes = fb_devmem_used(&s->mem);
  pthread_mutex_unlock(&s->cmu);
}

/* CUDA: a batch's tasks are queued on the session's stream as their code
 * is ready; its end waits for them and reads each one's error slot. */
static void gpu_batch_begin(batch_run *r) {
  char msg[ERRLEN];
  r->slot = calloc((size_t)r->j->b->n + 1, sizeof *r->slot);
  r->gpu_rc = r->slot ? fb_cuda_begin(r->s->q, msg, sizeof msg) : FB_ENOMEM;
  if (r->gpu_rc)
    bg_record(r->s, r->gpu_rc, NO_LAUNCH, -1, "flush %llu: %s; its %d tasks did not run",
              (unsigned long long)r->j->flush, r->slot ? msg : "out of memory", r->j->b->n);
}

static void gpu_batch_end(batch_run *r) {
  char msg[ERRLEN];
  const int32_t *errs = NULL;
  int n = 0;
  double secs = 0;
  int rc = r->gpu_rc ? 0 : fb_cuda_finish(r->s->q, &errs, &n, &secs, msg, sizeof msg);
  if (rc)
    bg_record(r->s, rc, NO_LAUNCH, -1, "flush %llu: %s", (unsigned long long)r->j->flush, msg);
  for (int i = 0; i < n && i < r->j->b->n + r->extra_slots; i++)
    if (errs[i] && r->slot[i]) task_error(r, r->slot[i], errs[i], "");
  r->backend_s += secs;
  free(r->slot);
  r->slot = NULL;
}

/* One flushed batch: compile jobs to the pool, then the tasks in order.
 * Return slots start at zero (a kernel with a return value is always the
 * last launch of its batch). */
static void run_batch(fb_session *s, async_job *j) {
  batch_run r = {s, j, NO_LAUNCH, 0, 0, 0, 0, NULL, 0, NULL, 0};
  double t0 = fb_trace_clock();
  if (plan_compiles(&r)) {
    bg_record(s, FB_ENOMEM, NO_LAUNCH, -1, "flush %llu: out of memory starting its %d tasks; "
              "they did not run", (unsigned long long)j->flush, j->b->n);
    free(j->which);
    j->which = NULL; /* nothing for the caller to learn from it */
  } else {
    memset(s->mem.rets, 0, sizeof(uint64_t) * (size_t)s->mem.nrets);
    if (s->sparse) fb_sparse_begin(s->sparse);
    if (s->q) gpu_batch_begin(&r);
    for (int i = 0; i < j->b->n; i++) run_one(&r, i);
    /* cancelled: the skipped tasks' compile jobs must leave the pool before
     * the batch is freed; those never compiled must not be learned */
    for (int c = 0; r.cancelled && c < j->ncj; c++)
      if (fb_cpool_withdraw(s->e->cpool, &j->cj[c])) j->cj[c].rc = FB_ECANCELLED;
    if (s->q) gpu_batch_end(&r);
    free_fallbacks(&r);
    if (s->sparse) fb_sparse_end(s->sparse);
    add_batch_counters(&r);
    note_seen(&r);
  }
  if (s->trace) {
    char name[64], args[96];
    snprintf(name, sizeof name, "flush %llu", (unsigned long long)j->flush);
    snprintf(args, sizeof args, "{\"tasks\":%d,\"compile_jobs\":%d}", j->b->n, j->ncj);
    fb_trace_span(s->trace, FB_TRACK_LAUNCHER, "batch", name, t0, fb_trace_clock(), args);
  }
}

static void worker_run(void *user, fb_ordq_item *it) {
  fb_session *s = user;
  async_job *j = (async_job *)it;
  run_batch(s, j);
  pthread_mutex_lock(&s->as->mu);
  j->done_next = s->as->done;
  s->as->done = j;
  pthread_mutex_unlock(&s->as->mu);
}

/* ---------------------------------------------------------------- async: the caller's side */

/* ---- the caller's code map (task IR handle -> code) */

#define CMAP_MAX 4096 /* entries; past it the map starts over */

static const fb_rt_task *cmap_get(const async_state *a, fb_irh h) {
  if (!a->capcmap) return NULL;
  for (int i = (int)(((unsigned)h * 2654435761u) & (unsigned)(a->capcmap - 1));;
       i = (i + 1) & (a->capcmap - 1)) {
    if (a->cmap[i].h == h) return &a->cmap[i].code;
    if (a->cmap[i].h == FB_IRH_NONE) return NULL;
  }
}

/* Forget every entry, giving the references back. */
static void cmap_clear(async_state *a) {
  for (int i = 0; i < a->capcmap; i++)
    if (a->cmap[i].h != FB_IRH_NONE) fb_opt_release(a->o, a->cmap[i].h);
  free(a->cmap);
  a->cmap = NULL;
  a->ncmap = a->capcmap = 0;
}

static void cmap_put(async_state *a, fb_irh h, const fb_rt_task *code);

static int cmap_grow(async_state *a) {
  if (a->capcmap >= 2 * CMAP_MAX) cmap_clear(a);
  int old = a->capcmap, cap = old ? old * 2 : 256;
  code_ent *prev = a->cmap, *v = malloc(sizeof *v * (size_t)cap);
  if (!v) return 0;
  for (int i = 0; i < cap; i++) v[i].h = FB_IRH_NONE;
  a->cmap = v;
  a->capcmap = cap;
  a->ncmap = 0;
  for (int i = 0; i < old; i++) /* the new entry takes a reference: drop the old one */
    if (prev[i].h != FB_IRH_NONE) {
      cmap_put(a, prev[i].h, &prev[i].code);
      fb_opt_release(a->o, prev[i].h);
    }
  free(prev);
  return 1;
}

/* Remember the code of h (taking a reference of the map's own). */
static void cmap_put(async_state *a, fb_irh h, const fb_rt_task *code) {
  if (cmap_get(a, h)) return;
  if ((a->ncmap + 1) * 2 > a->capcmap && !cmap_grow(a)) return;
  int i = (int)(((unsigned)h * 2654435761u) & (unsigned)(a->capcmap - 1));
  while (a->cmap[i].h != FB_IRH_NONE) i = (i + 1) & (a->capcmap - 1);
  fb_opt_retain(a->o, h);
  a->cmap[i].h = h;
  a->cmap[i].code = *code;
  a->ncmap++;
}

/* The code of each entry, where the map has it. */
static fb_rt_task *known_code(async_state *a, const fb_opt_batch *b) {
  fb_rt_task *pre = calloc((size_t)(b && b->n ? b->n : 1), sizeof *pre);
  for (int i = 0; pre && b && i < b->n; i++) {
    const fb_rt_task *c = cmap_get(a, b->v[i].ir);
    if (c) pre[i] = *c;
  }
  return pre;
}

/* A finished batch: learn its new code, then free it. */
static void free_job(fb_session *s, async_job *j) {
  async_state *a = s->as;
  for (int i = 0; j->which && i < j->b->n; i++) {
    const fb_cjob *c = j->which[i] >= 0 ? &j->cj[j->which[i]] : NULL;
    if (c && !c->rc) cmap_put(a, j->b->v[i].ir, &(fb_rt_task){c->code.body, c->code.bounds, c->code.gpu});
  }
  fb_opt_batch_free(a->o, j->b);
  free(j->launches);
  free(j->pre);
  free(j->cj);
  free(j->which);
  free(j);
}

/* Free the batches the worker finished (fb_opt is this thread's). */
static void reap(fb_session *s) {
  async_state *a = s->as;
  pthread_mutex_lock(&a->mu);
  async_job *d = a->done;
  a->done = NULL;
  pthread_mutex_unlock(&a->mu);
  while (d) {
    async_job *n = d->done_next;
    free_job(s, d);
    d = n;
  }
}

/* Wait until the worker has run everything handed to it. */
static void quiesce(fb_session *s) {
  double t0 = s->trace ? fb_trace_clock() : 0;
  fb_ordq_drain(s->as->q);
  reap(s);
  pthread_mutex_lock(&s->cmu);
  s->dev_bytes = fb_devmem_used(&s->mem);
  pthread_mutex_unlock(&s->cmu);
  if (s->trace) fb_trace_span(s->trace, FB_TRACK_CLIENT, "wait", "wait for the device", t0,
                              fb_trace_clock(), NULL);
}

static int win_push(async_state *a, int kernel, const char *name) {
  if (a->nwin == a->capwin) {
    int nc = a->capwin ? a->capwin * 2 : 64;
    launch_rec *v = realloc(a->win, sizeof *v * (size_t)nc);
    if (!v) return FB_ENOMEM;
    a->win = v;
    a->capwin = nc;
  }
  a->win[a->nwin++] = (launch_rec){kernel, name};
  return 0;
}

static void graph_cb(void *user, int iteration, const char *pass, const char *when,
                     const char *dot) {
  fb_session *s = user;
  s->as->gfn(s->as->guser, s->as->gcur, iteration, pass, when, dot);
}

/* Optimize the window of flush `no` with the SFG trace on. */
static int traced_optimize(fb_session *s, uint64_t no) {
  async_state *a = s->as;
  char *dot = fb_opt_dot(a->o, "window");
  if (dot) a->gfn(a->guser, no, -1, "window", "before", dot);
  free(dot);
  a->gcur = no;
  fb_opt_set_trace(a->o, graph_cb, s);
  int rc = fb_opt_optimize(a->o);
  fb_opt_set_trace(a->o, NULL, NULL);
  if (rc) return rc;
  dot = fb_opt_dot(a->o, "optimized");
  if (dot) a->gfn(a->guser, no, -1, "window", "after", dot);
  free(dot);
  return 0;
}

/* The optimizer failed: hand the window out as it is (results stay right)
 * and report the failure at the next sync point. */
static int flush_plain(fb_session *s, uint64_t no, fb_opt_batch **b) {
  async_state *a = s->as;
  char why[512];
  snprintf(why, sizeof why, "%s", fb_opt_errmsg(a->o)[0] ? fb_opt_errmsg(a->o) : "no message");
  fb_opt_options saved = *fb_opt_get_options(a->o), plain = saved;
  plain.passes = 0;
  plain.check = 0;
  fb_opt_set_options(a->o, &plain);
  int rc = fb_opt_flush(a->o, b);
  fb_opt_set_options(a->o, &saved);
  if (rc)
    return fail(s, rc, "flush %llu: the optimizer failed (%s), and again without passes: %s",
                (unsigned long long)no, why, fb_opt_errmsg(a->o));
  bg_record(s, FB_EINTERNAL, NO_LAUNCH, -1, "flush %llu: the optimizer failed (%s); its tasks "
            "ran unoptimized", (unsigned long long)no, why);
  return 0;
}

static void note_flush(fb_session *s, uint64_t no, double t0) {
  const fb_opt_counters *f = &fb_opt_get_stats(s->as->o)->flush;
  fb_flush_stats *l = &s->as->last;
  l->flush = no;
  l->tasks_in = f->tasks_in;
  l->tasks_out = f->tasks_out;
  l->listgens_removed = f->listgen_removed;
  l->tasks_fused = f->tasks_fused;
  l->dead_stores_removed = f->dead_stores + f->tasks_deleted;
  l->activations_demoted = f->demoted;
  l->optimizer_s = f->optimizer_s;
  if (!s->trace) return;
  char name[64], args[128];
  snprintf(name, sizeof name, "flush %llu", (unsigned long long)no);
  snprintf(args, sizeof args, "{\"tasks_in\":%llu,\"tasks_out\":%llu}",
           (unsigned long long)l->tasks_in, (unsigned long long)l->tasks_out);
  fb_trace_span(s->trace, FB_TRACK_CLIENT, "optimizer", name, t0, fb_trace_clock(), args);
}

/* Give the batch and the window's launches to the worker; or, when the
 * caller is going to wait for it anyway and the worker is idle, run it on
 * the caller's thread (two thread switches fewer). */
static int hand_out(fb_session *s, fb_opt_batch *b, uint64_t no, int run_here) {
  async_state *a = s->as;
  async_job *j = calloc(1, sizeof *j);
  launch_rec *launches = a->win;
  int n = a->nwin;
  uint64_t base = a->win_base;
  a->win = NULL;
  a->nwin = a->capwin = 0;
  a->win_base = s->launch_no;
  if (!j) {
    fb_opt_batch_free(a->o, b);
    free(launches);
    return fail(s, FB_ENOMEM, "flush %llu: out of memory; its tasks did not run",
                (unsigned long long)no);
  }
  *j = (async_job){{NULL}, s, b, no, base, launches, n, NULL, NULL, NULL, 0, NULL};
  if (b && b->n && !(j->pre = known_code(a, b))) {
    free_job(s, j);
    return fail(s, FB_ENOMEM, "flush %llu: out of memory; its tasks did not run",
                (unsigned long long)no);
  }
  if (b && b->n && run_here && fb_ordq_idle(a->q)) run_batch(s, j);
  else if (b && b->n) {
    fb_ordq_push(a->q, &j->link);
    return 0;
  }
  free_job(s, j);
  return 0;
}

/* Optimize what is pending and hand it out; does not wait, unless run_here
 * lets it run the batch itself (see hand_out). */
static int async_flush(fb_session *s, int run_here) {
  async_state *a = s->as;
  reap(s);
  if (!fb_opt_pending(a->o)) return 0;
  uint64_t no = a->flushes + 1;
  double t0 = s->trace ? fb_trace_clock() : 0;
  fb_opt_batch *b = NULL;
  int rc = a->gfn && (!a->gflush || a->gflush == no) ? traced_optimize(s, no) : 0;
  if (!rc) rc = fb_opt_flush(a->o, &b);
  if (rc && (rc = flush_plain(s, no, &b))) return rc;
  a->flushes = no;
  note_flush(s, no, t0);
  return hand_out(s, b, no, run_here);
}

static int async_wait_all(fb_session *s) {
  int rc = async_flush(s, 1);
  quiesce(s);
  return rc;
}

static int async_return(fb_session *s, const sess_kernel *sk, fb_value *ret) {
  int rc = async_wait_all(s);
  if (ret) *ret = fb_slot_unpack(sk->k->ret, s->mem.rets[0]);
  return rc ? rc : report_bg(s);
}

/* Insert the kernel's tasks into the SFG; flush when a trigger says so. */
static int async_launch(fb_session *s, int kernel, const sess_kernel *sk, fb_value *ret) {
  async_state *a = s->as;
  reap(s);
  if (win_push(a, kernel, sk->k->name))
    return fail(s, FB_ENOMEM, "kernel '%s': out of memory", sk->k->name);
  int rc = 0;
  for (int t = 0; t < sk->tl.n && !rc; t++) {
    fb_opt_task ot = {sk->h[t], s->args ? s->args : no_args, sk->k->nparams, s->launch_no};
    if ((rc = fb_opt_insert(a->o, &ot)))
      fail(s, rc, "kernel '%s': queuing task %d (%s): %s", sk->k->name, t, sk->tl.v[t].ir->name,
           fb_opt_errmsg(a->o));
  }
  s->launch_no++;
  pthread_mutex_lock(&s->cmu);
  s->c.launches++;
  pthread_mutex_unlock(&s->cmu);
  if (rc) return rc;
  if (sk->k->ret != FB_T_VOID) return async_return(s, sk, ret);
  if (ret) memset(ret, 0, sizeof *ret);
  int pending = fb_opt_pending(a->o);
  if ((a->flush_every && pending >= a->flush_every) || pending >= FB_MAX_PENDING_TASKS)
    return async_flush(s, 0);
  return 0;
}

int fb_flush(fb_session *s) {
  if (!s) return FB_EINVAL;
  if (!s->as) return 0; /* sync mode: nothing pending */
  int rc = async_flush(s, 0);
  return rc ? rc : report_bg(s);
}

int fb_sync(fb_session *s) {
  if (!s) return FB_EINVAL;
  if (!s->as) return 0;
  int rc = async_wait_all(s);
  return rc ? rc : report_bg(s);
}

/* ---------------------------------------------------------------- observability */

int fb_session_trace_graph(fb_session *s, uint64_t flush, fb_graph_trace_fn fn, void *user) {
  if (!s) return FB_EINVAL;
  if (!s->as)
    return fail(s, FB_EUNSUPPORTED, "the state-flow graph exists in async mode only (this "
                "session is sync)");
  s->as->gfn = fn;
  s->as->guser = user;
  s->as->gflush = flush;
  return 0;
}

static int trace_finish(fb_session *s) {
  int rc = fb_trace_write(s->trace, s->trace_file);
  if (fclose(s->trace_file)) rc = FB_EIO;
  fb_trace_free(s->trace);
  s->trace = NULL;
  s->trace_file = NULL;
  return rc;
}

/* At destroy: write what was recorded (best effort). */
static void trace_close(fb_session *s) {
  if (s->trace) trace_finish(s);
}

int fb_session_trace_begin(fb_session *s, const char *path) {
  if (!s) return FB_EINVAL;
  if (!path) return fail(s, FB_EINVAL, "trace: no file name given");
  if (s->as) quiesce(s); /* nothing may be recording while the recorder changes */
  if (s->trace && trace_finish(s)) return fail(s, FB_EIO, "trace: writing the previous file failed");
  FILE *f = fopen(path, "w");
  if (!f) return fail(s, FB_EIO, "trace: cannot open '%s' for writing: %s", path, strerror(errno));
  char name[96];
  snprintf(name, sizeof name, "fusebox session %d (%s)", s->pid, s->as ? "async" : "sync");
  if (!(s->trace = fb_trace_new(s->pid, name))) {
    fclose(f);
    return fail(s, FB_ENOMEM, "trace: out of memory");
  }
  s->trace_file = f;
  return 0;
}

int fb_session_trace_end(fb_session *s) {
  if (!s) return FB_EINVAL;
  if (!s->trace) return fail(s, FB_EINVAL, "trace: no timeline is being recorded");
  if (s->as) quiesce(s);
  return trace_finish(s) ? fail(s, FB_EIO, "trace: writing the file failed") : 0;
}

/* ---------------------------------------------------------------- host access
 * A dense field's element address is separable by axis:
 *   offset(idx) = base + sum_d g_d(idx[d]),
 *   g_d(x) = sum over the containers t splitting that axis of
 *            ((x / t.stride) % t.size) * t.mul
 * (see fb_layout_dense_offset), so whole-field copies walk rows and only
 * the last dimension is stepped per element (a plain memcpy when its rows
 * are contiguous). */

typedef struct axis_term {
  int64_t stride, size;
  uint64_t mul;
} axis_term;

typedef struct field_plan {
  const fb_snode *f;
  size_t esz;
  int ndim;
  int64_t shape[FB_MAX_AXES]; /* per index, in axis order */
  int64_t numel;
  uint64_t base;
  int nterm[FB_MAX_AXES];
  axis_term term[FB_MAX_AXES][MAX_PATH];
} field_plan;

static void copy_elem(uint8_t *dst, const uint8_t *src, size_t esz, int to_bool);
static int oom_message(fb_session *s, char *buf, size_t len);

static int check_field(fb_session *s, int field, const char *what) {
  const fb_layout *l = s->layout;
  if (field < 0 || field >= l->nnodes)
    return fail(s, FB_ENOENT, "%s: no field with id %d (the layout has %d SNodes)", what, field,
                l->nnodes);
  const fb_snode *f = &l->nodes[field];
  if (f->kind != FB_SN_PLACE)
    return fail(s, FB_EINVAL, "%s: SNode %d (%s%s%s) is not a field", what, field,
                fb_snode_kind_name(f->kind), f->name ? " " : "", f->name ? f->name : "");
  return 0;
}

/* Does the field lie under a sparse container? */
static int field_is_sparse(const fb_session *s, int field) {
  return s->sparse && fb_cg_sparse_leaf(s->layout, s->layout->nodes[field].parent) != 0;
}

/* Host side of an out-of-memory while activating: FB_EQUOTA naming the SNode. */
static int host_oom(fb_session *s, const char *what) {
  char oom[512];
  if (!oom_message(s, oom, sizeof oom)) snprintf(oom, sizeof oom, "out of device memory");
  return fail(s, FB_EQUOTA, "%s: %s", what, oom);
}

/* Element by element through the sparse runtime: reads of inactive cells
 * give 0, writes activate (every element of the field). */
static int sparse_io(fb_session *s, const fb_snode *f, uint8_t *host, int write, const char *what) {
  size_t esz = fb_type_size(f->type);
  int64_t numel = fb_field_numel(s->layout, f->id), idx[FB_MAX_AXES] = {0, 0, 0, 0};
  fb_sparse_begin(s->sparse);
  for (int64_t e = 0; e < numel; e++) {
    uint8_t *h = host + (size_t)e * esz;
    uint8_t *d = fb_sparse_elem(s->sparse, s->mem.root, f->id, idx, write);
    if (write && !d) return host_oom(s, what);
    if (write) copy_elem(d, h, esz, f->type == FB_T_BOOL);
    else if (d) copy_elem(h, d, esz, 0);
    else memset(h, 0, esz);
    for (int k = f->ndim - 1; k >= 0; k--) { /* odometer */
      if (++idx[k] < f->shape[f->dim_axis[k]]) break;
      idx[k] = 0;
    }
  }
  return 0;
}

static int dim_of_axis(const fb_snode *f, int axis) {
  for (int d = 0; d < f->ndim; d++)
    if (f->dim_axis[d] == axis) return d;
  return -1;
}

/* The terms container s adds to each dimension it splits. */
static void plan_node(field_plan *p, const fb_layout *l, const fb_snode *s) {
  for (int a = 0; a < FB_MAX_AXES; a++) {
    if (!(s->axes & (1u << a))) continue;
    int d = dim_of_axis(p->f, a);
    if (d < 0 || p->nterm[d] >= MAX_PATH) continue;
    uint64_t mul = s->cell_bytes;
    for (int b = a + 1; b < FB_MAX_AXES; b++)
      if (s->axes & (1u << b)) mul *= (uint64_t)s->size[b];
    axis_term *t = &p->term[d][p->nterm[d]++];
    t->stride = fb_layout_stride(l, s->id, p->f->id, a);
    t->size = s->size[a];
    t->mul = mul;
  }
}

static void plan_field(field_plan *p, const fb_layout *l, int field) {
  memset(p, 0, sizeof *p);
  p->f = &l->nodes[field];
  p->esz = fb_type_size(p->f->type);
  p->ndim = p->f->ndim;
  p->numel = 1;
  for (int d = 0; d < p->ndim; d++) {
    p->shape[d] = p->f->shape[p->f->dim_axis[d]];
    p->numel *= p->shape[d];
  }
  int path[MAX_PATH];
  int n = fb_layout_path(l, field, path, MAX_PATH);
  p->base = p->f->offset;
  for (int i = 0; i < n; i++) {
    const fb_snode *s = &l->nodes[path[i]];
    p->base += s->offset;
    plan_node(p, l, s);
  }
}

static uint64_t axis_offset(const field_plan *p, int d, int64_t x) {
  uint64_t off = 0;
  for (int t = 0; t < p->nterm[d]; t++) {
    const axis_term *at = &p->term[d][t];
    off += (uint64_t)((x / at->stride) % at->size) * at->mul;
  }
  return off;
}

static void copy_elem(uint8_t *dst, const uint8_t *src, size_t esz, int to_bool) {
  switch (esz) {
  case 1: *dst = to_bool ? *src != 0 : *src; break;
  case 4: memcpy(dst, src, 4); break;
  case 8: memcpy(dst, src, 8); break;
  default: memcpy(dst, src, esz); break;
  }
}

/* One row of the last dimension between device (dev) and host. */
static void copy_row(const field_plan *p, uint8_t *dev, uint8_t *host, int64_t len, int write) {
  int last = p->ndim - 1;
  size_t esz = p->esz;
  int to_bool = write && p->f->type == FB_T_BOOL;
  if (p->nterm[last] == 1 && p->term[last][0].mul == esz && !to_bool) {
    if (write) memcpy(dev, host, (size_t)len * esz);
    else memcpy(host, dev, (size_t)len * esz);
    return;
  }
  int affine = p->nterm[last] == 1;
  uint64_t step = affine ? p->term[last][0].mul : 0;
  for (int64_t x = 0; x < len; x++) {
    uint8_t *d = dev + (affine ? (uint64_t)x * step : axis_offset(p, last, x));
    if (write) copy_elem(d, host + (size_t)x * esz, esz, to_bool);
    else copy_elem(host + (size_t)x * esz, d, esz, 0);
  }
}

static void copy_field(const field_plan *p, uint8_t *root, uint8_t *host, int write) {
  if (p->ndim == 0) {
    if (write) copy_elem(root + p->base, host, p->esz, p->f->type == FB_T_BOOL);
    else copy_elem(host, root + p->base, p->esz, 0);
    return;
  }
  int last = p->ndim - 1;
  int64_t len = p->shape[last], rows = p->numel / len;
  int64_t idx[FB_MAX_AXES] = {0, 0, 0, 0};
  for (int64_t r = 0; r < rows; r++) {
    uint64_t off = p->base;
    for (int d = 0; d < last; d++) off += axis_offset(p, d, idx[d]);
    copy_row(p, root + off, host + (size_t)(r * len) * p->esz, len, write);
    for (int d = last - 1; d >= 0; d--) { /* odometer over the outer dims */
      if (++idx[d] < p->shape[d]) break;
      idx[d] = 0;
    }
  }
}

static int field_io(fb_session *s, int field, void *buf, size_t bytes, int write) {
  const char *what = write ? "field write" : "field read";
  if (!s) return FB_EINVAL;
  int rc = check_field(s, field, what);
  if (rc) return rc;
  field_plan *p = malloc(sizeof *p);
  if (!p) return fail(s, FB_ENOMEM, "%s: out of memory", what);
  plan_field(p, s->layout, field);
  uint64_t want = (uint64_t)p->numel * p->esz;
  if (bytes != want || !buf) {
    rc = fail(s, FB_EINVAL, "%s: field '%s' holds %lld elements of %s (%llu bytes); %zu bytes "
              "given%s", what, p->f->name, (long long)p->numel, fb_type_name(p->f->type),
              (unsigned long long)want, bytes, buf ? "" : " with no buffer");
  } else if (field_is_sparse(s, field)) {
    rc = sparse_io(s, p->f, buf, write, what);
  } else {
    copy_field(p, s->mem.root, buf, write);
  }
  free(p);
  return rc;
}

/* Async: host access waits for everything launched before it. */
static int host_begin(fb_session *s) {
  int rc = s ? gpu_dead(s) : 0;
  return rc ? rc : s && s->as ? async_wait_all(s) : 0;
}

/* Async: a write gives the states it touched a new version in the SFG (a
 * write below sparse containers also activates); then the access reports
 * the errors of background launches, unless it failed itself. */
static int host_end(fb_session *s, int field, int write, int rc) {
  if (!s || !s->as) return rc;
  const fb_layout *l = s->layout;
  if (write && field > 0 && field < l->nnodes && l->nodes[field].kind == FB_SN_PLACE) {
    if (fb_opt_host_write(s->as->o, field) && !rc)
      rc = fail(s, FB_EINTERNAL, "host write of field '%s': the optimizer refused it: %s",
                l->nodes[field].name, fb_opt_errmsg(s->as->o));
    pthread_mutex_lock(&s->cmu);
    s->dev_bytes = fb_devmem_used(&s->mem);
    pthread_mutex_unlock(&s->cmu);
  }
  return rc ? rc : report_bg(s);
}

int fb_field_read(fb_session *s, int field, void *dst, size_t bytes) {
  int rc = host_begin(s);
  return rc ? rc : host_end(s, field, 0, field_io(s, field, dst, bytes, 0));
}

int fb_field_write(fb_session *s, int field, const void *src, size_t bytes) {
  int rc = host_begin(s);
  return rc ? rc : host_end(s, field, 1, field_io(s, field, (void *)src, bytes, 1));
}

/* One byte per element, 1 where the cell is active: sparse fields walk
 * the sparse runtime without activating anything; a dense field is all
 * active. */
static int field_active(fb_session *s, int field, uint8_t *mask, size_t n) {
  if (!s) return FB_EINVAL;
  int rc = check_field(s, field, "field activity");
  if (rc) return rc;
  const fb_snode *f = &s->layout->nodes[field];
  int64_t numel = fb_field_numel(s->layout, field), idx[FB_MAX_AXES] = {0, 0, 0, 0};
  if (!mask || n != (uint64_t)numel)
    return fail(s, FB_EINVAL, "field activity: field '%s' holds %lld elements; %zu bytes given",
                f->name, (long long)numel, n);
  if (!field_is_sparse(s, field)) {
    memset(mask, 1, n);
    return 0;
  }
  fb_sparse_begin(s->sparse);
  for (int64_t e = 0; e < numel; e++) {
    mask[e] = fb_sparse_elem(s->sparse, s->mem.root, field, idx, 0) != NULL;
    for (int k = f->ndim - 1; k >= 0; k--) { /* odometer */
      if (++idx[k] < f->shape[f->dim_axis[k]]) break;
      idx[k] = 0;
    }
  }
  return 0;
}

int fb_field_active(fb_session *s, int field, uint8_t *mask, size_t n) {
  int rc = host_begin(s);
  return rc ? rc : host_end(s, field, 0, field_active(s, field, mask, n));
}

/* Validate one element's index; returns its address through *addr (NULL:
 * an inactive cell when reading). Writing activates the cell. */
static int cell_addr(fb_session *s, int field, const int64_t *idx, int nidx, const char *what,
                     const fb_value *v, uint8_t **addr) {
  int rc = check_field(s, field, what);
  if (rc) return rc;
  const fb_snode *f = &s->layout->nodes[field];
  if (nidx != f->ndim || (nidx > 0 && !idx))
    return fail(s, FB_EINVAL, "%s: field '%s' takes %d indices, %d given", what, f->name,
                f->ndim, nidx);
  for (int d = 0; d < nidx; d++) {
    if (idx[d] >= 0 && idx[d] < f->shape[f->dim_axis[d]]) continue;
    char ix[128] = "", sh[128] = "";
    for (int e = 0; e < nidx; e++) {
      size_t a = strlen(ix), b = strlen(sh);
      snprintf(ix + a, sizeof ix - a, "%s%lld", e ? ", " : "", (long long)idx[e]);
      snprintf(sh + b, sizeof sh - b, "%s%lld", e ? ", " : "",
               (long long)f->shape[f->dim_axis[e]]);
    }
    return fail(s, FB_EBOUNDS, "%s: index (%s) is out of bounds of field '%s' of shape (%s)",
                what, ix, f->name, sh);
  }
  if (v && !kinds_agree(f->type, v->type))
    return fail(s, FB_ETYPE, "%s: field '%s' of type %s cannot take a value of type %s", what,
                f->name, fb_type_name(f->type), type_name_safe(v->type));
  int write = v != NULL;
  if (!field_is_sparse(s, field)) {
    *addr = s->mem.root + fb_layout_dense_offset(s->layout, field, idx);
    return 0;
  }
  fb_sparse_begin(s->sparse);
  *addr = fb_sparse_elem(s->sparse, s->mem.root, field, idx, write);
  return write && !*addr ? host_oom(s, what) : 0;
}

static int cell_read(fb_session *s, int field, const int64_t *idx, int nidx, fb_value *out) {
  uint8_t *p = NULL;
  if (!s) return FB_EINVAL;
  int rc = cell_addr(s, field, idx, nidx, "cell read", NULL, &p);
  if (rc) return rc;
  fb_type t = s->layout->nodes[field].type;
  if (p) {
    *out = fb_value_load(t, p);
  } else {
    memset(out, 0, sizeof *out);
    out->type = t;
  }
  return 0;
}

static int cell_write(fb_session *s, int field, const int64_t *idx, int nidx, fb_value v) {
  uint8_t *p = NULL;
  if (!s) return FB_EINVAL;
  int rc = cell_addr(s, field, idx, nidx, "cell write", &v, &p);
  if (rc) return rc;
  fb_value_store(fb_value_cast(v, s->layout->nodes[field].type), p);
  return 0;
}

int fb_cell_read(fb_session *s, int field, const int64_t *idx, int nidx, fb_value *out) {
  int rc = host_begin(s);
  return rc ? rc : host_end(s, field, 0, cell_read(s, field, idx, nidx, out));
}

int fb_cell_write(fb_session *s, int field, const int64_t *idx, int nidx, fb_value v) {
  int rc = host_begin(s);
  return rc ? rc : host_end(s, field, 1, cell_write(s, field, idx, nidx, v));
}
