/* The engine's private header: the state every engine/ file shares.
 *
 * The in-process engine (include/fusebox/engine.h): wires the verifier,
 * lowering and the asynchronous optimizer (optimizer/), the CPU JIT
 * (codegen/) and the devices (runtime/) together. The engine never asks
 * which device it has: it calls the device's operations (fb_device_ops,
 * runtime.h), which for CUDA queue a batch's tasks and report their errors
 * when the batch finishes.
 *
 * Sync mode: a kernel is verified, copied onto the session's layout,
 * lowered to tasks and every task compiled when it is registered; fb_launch
 * runs its tasks at once.
 *
 * Async mode: registration lowers the kernel and interns its tasks in the
 * session's IR bank (fb_opt, optimizer/optimizer.h); fb_launch inserts them into
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
 * Sharing: the public threading contract is in include/fusebox/engine.h
 * ("Threads"). Inside: an engine holds the JIT (and its code cache), the
 * thread pool and the compile pool, all safe to use from several threads;
 * everything else belongs to one session, used by its caller's thread and
 * its own worker, which touches only device memory, the sparse runtime and
 * what it shares under the session's mutexes (as, cmu). */
#ifndef FB_ENGINE_INTERNAL_H
#define FB_ENGINE_INTERNAL_H

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/map.h"
#include "codegen/codegen.h"
#include "engine/engine_test.h"
#include "fusebox/engine.h"
#include "optimizer/optimizer.h"
#include "runtime/runtime.h"

#define ERRLEN 2048
#define MAX_RET_SLOTS 1024
#define MAX_PATH 64
#define NO_LAUNCH UINT64_MAX

/* The argument block of a launch without arguments. */
static const uint64_t no_args[1] = {0};

struct fb_engine {
  const fb_device_ops *ops; /* the device sessions run on (runtime.h) */
  void *dev;                /* ... opened by ops->open; its code cache is the engine's */
  pthread_mutex_t mu;  /* guards cpool creation and next_pid */
  int compile_threads; /* as configured (0 = one per core) */
  fb_cpool *cpool;     /* made with the first async session */
  int next_pid;        /* timeline process ids */
  fb_compile_gate gate; /* tests: compiles it refuses (engine/engine_test.h) */
  void *gate_user;
  int standin_min_stmts; /* engine/async.c; tests lower it (engine_test.h) */
  int bg_max;            /* background compiles a session may have at once
                            (FB_MAX_BG_COMPILES; tests change it) */
};

typedef struct sess_kernel {
  fb_kernel *k;            /* copy on the session's layout */
  fb_task_list tl;         /* its tasks, in launch order */
  const fb_kernel **irs;   /* tl.v[i].ir, for fb_session_kernel_tasks */
  fb_rt_task *code;        /* sync: compiled entry points per task */
  fb_rt_hint *hints;       /* sync: per task: list to size, chunk grain */
  fb_irh *h;               /* async: banked IR per task (one reference each) */
  uint64_t bytes;          /* what it retains, as counted in kernel_bytes */
  int adj;                 /* its adjoint's id + 1 (tape.c), 0: none made yet */
  int tan;                 /* its tangent's id + 1 (tape.c), 0: none made yet */
  uint8_t custom;          /* adj was named by the client (fb_session_set_kernel_adjoint) */
  uint8_t custom_of;       /* it is the custom adjoint of another kernel */
  uint8_t rerun;           /* async: 0 not yet asked, 1 no, 2 a launch again right
                              after an equal one changes nothing
                              (fb_opt_rerun_free; async.c, coalescing) */
} sess_kernel;

/* The kernel of one launch of a flushed window. */
typedef struct launch_rec {
  int kernel;
  const char *name;        /* the session's copy of the kernel's name */
  /* its tasks (sess_kernel.irs, which live as long as the session): an
   * error names the launch's own task by fb_opt_part.index, not the banked
   * IR's name, which may be another kernel's with an equal body */
  const fb_kernel *const *tasks;
  int ntasks;
} launch_rec;

/* A flushed batch on its way through the worker. */
/* A code map's value: a task's code and its chunk grain (fbe_task_grain
 * of its IR and loop; -1 where not worked out), so that a batch whose
 * code the caller knew walks no task IR for it (sync mode keeps the grain
 * with the kernel's code the same way, sess_kernel.hints). */
typedef struct code_ent {
  fb_rt_task code; /* first: code_get hands out its address */
  int64_t grain;
  uint64_t stamp;  /* the caller's: the last flush whose batch looked it up
                      (0: none), so that known_code counts each handle once */
} code_ent;

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
  int64_t *grain;          /* per entry: its chunk grain (fbe_task_grain),
                              the caller's, kept with the code it knew;
                              -1: the worker works it out */
  /* every entry's code was in the caller's code map (no stand-in, nothing
   * to compile): the distinct handles among them, the batch's cache hits;
   * -1 otherwise. Such a batch plans no compile job, no table and no
   * `which` (fbe_run_batch) */
  int known_handles;
  uint64_t bytes;          /* what its launches count in pending_bytes */
  int queued;              /* pushed to the worker: counted in a->inflight */
  /* the launcher's; the caller learns the new code from them at the end */
  fb_cjob *cj;             /* one compile job per distinct unknown IR */
  int *which;              /* per entry: its job, -1 for known code */
  int ncj;
  struct async_job *done_next;
  uint64_t basis;          /* every flush up to this one had run whole (or was
                              forgotten) when it was optimized; it relies on
                              nothing later (fbe_run_batch checks) */
} async_job;

/* The first error of the background launches since the last report. */
typedef struct bg_error {
  int code;                /* 0: none */
  uint64_t launch;         /* NO_LAUNCH: not tied to a launch */
  int kernel;
  uint64_t more;           /* errors after it */
  char msg[ERRLEN];
} bg_error;

/* The longest period (launches) the automatic flush aligns its cuts to. */
#define FB_PERIOD_MAX 256

/* Only a task of at least this many statements compiles in the background
 * behind a stand-in: a small one compiles in milliseconds, and compiled at
 * once it runs as optimized from this batch on, where in the background
 * its compile would share the cores with the batches running meanwhile
 * (micro/multires: 0.8 -> 2.0 ms per step, stand-ins for about ten steps).
 * MacCormack's demoted loops, the case stand-ins are for, are 924 to 977
 * statements and compile for a second or more. */
#define FB_STANDIN_MIN_STMTS 256

/* Background compiles (behind stand-ins) one async session may have queued
 * or running at once. Each is a task of its own demoted IR, and a client
 * can make many (every kernel it registers, each demoted again as proofs
 * appear): without a bound they queued without end on the compile pool
 * (shared by every session under thread isolation), compiling outside any
 * job's time. Past the bound an entry compiles in its batch, as it would
 * without stand-ins: the same results, only the batch waits for it. */
#define FB_MAX_BG_COMPILES 8

typedef struct async_state {
  fb_opt *o;
  fb_ordq *q;              /* the ordered worker */
  int flush_every;         /* 0: never */
  /* flush_every as the stream repeats (the default flush_every only):
   * doubled after PLAN_STREAK flushes in a row reuse the optimizer's plan
   * (up to FLUSH_AT_MAX), back to flush_every after a window the memo
   * could not keep */
  int flush_at;
  int adapt;
  int plan_streak;
  /* a doubled width whose first window the memo could not keep: flush_at
   * stays below flush_cap (0: none) until flush number cap_until
   * (adapt_flush); probe: the last flush doubled flush_at */
  int flush_cap, probe;
  uint64_t cap_until;
  uint64_t capped;         /* probes that set flush_cap
                              (fb_session_test_capped_widths) */
  /* the stream's repeating period, which the automatic flush aligns its
   * cuts to (the default flush_every only; async.c, "Windows aligned to
   * the stream's period"): a key per launch (kernel and argument values),
   * the last FB_PERIOD_MAX * 2 of them by launch number */
  uint64_t keys[FB_PERIOD_MAX * 2];
  uint64_t mark;           /* launch number at the last sync point or fb_flush */
  uint64_t due;            /* a deferred automatic flush happens at this launch
                              number at the latest (0: none deferred) */
  int period;              /* launches, found when the flush was deferred */
  uint64_t aligned;        /* automatic flushes deferred to a period boundary
                              (fb_session_test_aligned_flushes) */
  uint64_t launches;       /* the caller's: launches so far (fb_counters.launches) */
  /* the launch before this one, while it is in the unflushed window: its
   * kernel + 1 (0: none) and argument values; an equal launch of a kernel
   * fb_opt_rerun_free accepts right after it is coalesced into it (not
   * inserted; async.c, "Coalescing a run of equal launches") */
  int prev1;
  uint64_t prev_no;
  uint64_t *prev_args;
  int cap_prev_args;
  uint64_t coalesced;      /* launches coalesced (fb_session_test_coalesced) */
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
  /* flushes that did not run whole, against what the optimizer keeps */
  _Atomic uint64_t ran_upto;  /* the worker's: the last flush it finished */
  _Atomic uint64_t bad_flush; /* the last flush that stopped early (0: none) */
  uint64_t forgot_upto;       /* the caller's: fb_opt_forget covered flushes up to it */
  int tainted;             /* a flushed task may not have run as the
                              optimizer assumed (an error, a skipped launch,
                              a dropped batch) since the last sync point */
  /* the launcher's (the worker, or the caller while the worker is idle):
   * task IR it has had compiled, a hint that the code cache holds it, so
   * that it looks the code up itself instead of waking a compile thread */
  fb_map seen;             /* a set of (handle, IR) keys */
  /* the caller's: code of task IR, by handle (each holds a reference, so
   * a handle in the map always names the same IR) */
  fb_map cmap;             /* handle -> code_ent: the code and its grain */
  /* the caller's: code that may stand in for a task the optimizer only
   * demoted and simplified (fb_opt_launch.standin), by the handle of the
   * task as inserted (each holds a reference), and the compiles of such
   * tasks' own code running in the background meanwhile */
  fb_map smap;             /* standin handle -> code_ent */
  struct bg_compile *bg;
  int nbg;                 /* entries of bg (at most the engine's bg_max) */
  int nbg_peak;            /* the most at once (fb_session_test_bg_peak) */
  uint64_t standins;       /* entries run with a stand-in (a test hook) */
  /* the caller's: what pending launches hold (fb_session_pending_bytes) */
  _Atomic uint64_t pending_bytes;
  uint64_t win_bytes;      /* of it, the launches not yet flushed */
  int inflight;            /* batches pushed to the worker and not yet reaped */
  pthread_cond_t done_cv;  /* under mu: the worker finished a batch (done) */
  _Atomic uint64_t waits;  /* flushes that waited for a batch to finish (too
                              many queued; fb_session_test_queue_waits) */
  _Atomic uint64_t grain_walks; /* grains the worker worked out (the test hook) */
  _Atomic uint64_t lean;   /* batches planned with every entry's code known
                              and no compile job or table made
                              (fb_session_test_lean_batches) */
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
  void *q;                 /* the session's queue of the engine's device
                              (e->ops->queue_new; CUDA: its stream) */
  sess_kernel *kernels;
  int nkernels, cap;
  uint64_t kernel_bytes;   /* what kernels[0..nkernels) retain (kernel_retained) */
  uint64_t kernel_cap;     /* fb_session_set_kernel_cap; UINT64_MAX: none */
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
  uint64_t partition;      /* fb_session_config.cache_partition */
  fb_code_pins *pins;      /* CPU code this session keeps: unpinned at destroy */
  fb_task_hook hook;       /* fb_session_set_task_hook, or NULL */
  void *hook_user;
  struct fbe_ad *ad;       /* tape.c: the tape and the generated kernels; NULL until used */
  /* fb_session_config as given, what a checkpoint keeps (checkpoint.c) */
  unsigned cfg_passes;
  int cfg_flush_every, cfg_max_fuse;
};

static inline int fail(fb_session *s, int code, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

static inline int fail(fb_session *s, int code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fb_verrf(s->err, sizeof s->err, fmt, ap);
  va_end(ap);
  s->err_bg = 0;
  return code;
}

/* A compile's share of the counters c: a cache hit, or a task compiled
 * with its statements; its time either way. */
static inline void fbe_count_compile(fb_counters *c, const fb_cpu_code *code) {
  if (code->cache_hit) {
    c->cache_hits++;
  } else {
    c->tasks_compiled++;
    c->statements_emitted += (uint64_t)code->stmts_emitted;
  }
  c->compile_s += code->compile_s;
}

/* ---- functions one engine file defines and another calls (fbe_: private to engine/) */

/* tape.c */
int fbe_tape_record(fb_session *s, int kernel, const fb_value *args, int nargs);
void fbe_tape_forget(fb_session *s, int keep); /* fb_session_drop_kernels */
void fbe_ad_free(fb_session *s);

/* launch.c */
int fbe_kinds_agree(fb_type want, fb_type have);
/* The chunk grain of a task's parallel loop for the CPU pool (fb_rt_hint):
 * 0 (the pool's default) unless an iteration runs an inner loop; then the
 * iterations of the inner loops count too (session.c). */
int64_t fbe_task_grain(const fb_kernel *k, int loop);
const char *fbe_type_name_safe(fb_type t);
int fbe_oom_message(fb_session *s, char *buf, size_t len);
int fbe_device_dead(fb_session *s);

/* blame.c: the part of a kernel a message names, in the user's terms,
 * never a task name ("k.t1"): tasks, the kernel's lowered tasks in order;
 * t, the one meant. "its 2nd top-level loop", "its serial code after its
 * 1st top-level loop", "the list of active cells of 'x' for its 1st
 * top-level loop", ... The second, for a task that is not one of a
 * kernel's (by its kind): "a top-level loop", ... buf: 256 bytes will do. */
const char *fbe_task_where(const fb_kernel *const *tasks, int ntasks, int t, char *buf,
                           size_t len);
const char *fbe_task_kind_where(fb_task_kind kind, const fb_kernel *ir, int snode, char *buf,
                                size_t len);
#define FBE_WHERE_MAX 256

/* worker.c */
void fbe_bg_record(fb_session *s, int code, uint64_t launch, int kernel, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 5, 6)))
#endif
    ;
int fbe_report_bg(fb_session *s);
/* Flush `flush` did not run whole (any thread): raise a->bad_flush to it. */
static inline void fbe_note_bad(async_state *a, uint64_t flush) {
  uint64_t cur = atomic_load(&a->bad_flush);
  while (cur < flush && !atomic_compare_exchange_weak(&a->bad_flush, &cur, flush)) {}
}
void fbe_run_batch(fb_session *s, async_job *j);
void fbe_worker_run(void *user, fb_ordq_item *it);

/* async.c */
void fbe_cmap_clear(async_state *a);
void fbe_standins_free(fb_session *s);
void fbe_reap(fb_session *s);
void fbe_quiesce(fb_session *s);
int fbe_async_wait_all(fb_session *s);
int fbe_async_launch(fb_session *s, int kernel, sess_kernel *sk, fb_value *ret);

/* tape.c, for checkpoint.c: the tape is recording; the per-SNode tables of
 * the generated clear and seed kernels (NULL when none was made) */
int fbe_tape_recording(const fb_session *s);
int fbe_ad_tables(fb_session *s, int **fill, int **seed, int make);

/* trace.c */
void fbe_trace_close(fb_session *s);

#endif
