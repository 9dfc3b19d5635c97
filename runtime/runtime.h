/* runtime/: the CPU device (a thread pool that splits parallel loops into
 * chunks), device memory of a session (root buffer, scratch, return slots,
 * and for sparse SNodes the block pool, allocators and lists), the
 * launcher that runs a kernel's compiled tasks in order, and the pieces of
 * the asynchronous engine's threads: the shared compile pool, the ordered
 * worker queue of a session and the trace-event timeline; and the table of
 * operations through which the engine drives either device (fb_device_ops,
 * at the end). The folder's interface: engine/ uses it, and reaches a device
 * only through fb_device_ops (each device's own functions are in
 * runtime/cpu.h and runtime/cuda.h, private to the folder). Depends on ir/
 * and codegen/ only.
 *
 * Invariants
 *  - The pool owns its worker threads for its whole life: a parallel loop
 *    never creates threads. Several threads may call fb_pool_for on one pool
 *    at once (each call is an independent job; idle workers help whichever
 *    job has chunks left), and a loop body may itself call fb_pool_for.
 *  - fb_pool_for returns only after every index of [0, n) has been passed to
 *    the body exactly once and no worker touches the job any more.
 *  - Device memory is zeroed, 64-byte aligned and counted against the
 *    session's limit (root buffer + scratch + sparse storage: blocks handed
 *    out by the pool and list storage).
 *  - A compile job is compiled exactly once, by a pool thread or by the
 *    thread that waits for it when no pool thread has taken it yet; its
 *    results are visible to every thread that returns from fb_cpool_wait.
 *  - An ordered queue runs its items one at a time, in push order, on its
 *    own thread. */
#ifndef FB_RUNTIME_H
#define FB_RUNTIME_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "codegen/codegen.h"
#include "fusebox/ir.h"

/* ---------------------------------------------------------------- thread pool */

typedef struct fb_pool fb_pool;

/* Body of a parallel loop: handles lo <= i < hi. */
typedef void (*fb_pool_fn)(void *ctx, int64_t lo, int64_t hi);

#define FB_POOL_MIN_CHUNK 1024 /* default smallest chunk of iterations */

/* nthreads: threads that run chunks, the caller of fb_pool_for included
 * (nthreads - 1 workers are started); 0 = one per online core. min_chunk:
 * smallest number of iterations handed out at once (0 = FB_POOL_MIN_CHUNK).
 * Returns 0, FB_EINVAL or FB_EDEVICE/FB_ENOMEM with a message in err. */
int fb_pool_new(int nthreads, int64_t min_chunk, fb_pool **out, char *err, size_t errlen);
/* Stops and joins the workers. No fb_pool_for may be running. */
void fb_pool_free(fb_pool *p);
int fb_pool_threads(const fb_pool *p);
/* Run fn over [0, n) split into chunks over the workers and the calling
 * thread; returns when all chunks are done. n <= 0 does nothing. */
void fb_pool_for(fb_pool *p, int64_t n, fb_pool_fn fn, void *ctx);
/* The same with chunks of at least grain iterations (0: the pool's minimum),
 * for loops whose iterations are heavy (list generation). */
void fb_pool_for_grain(fb_pool *p, int64_t n, int64_t grain, fb_pool_fn fn, void *ctx);
/* Body of a parallel loop that knows its thread: slot is the same for every
 * chunk one thread runs within one call, distinct between threads. */
typedef void (*fb_pool_slot_fn)(void *ctx, int slot, int64_t lo, int64_t hi);
/* fb_pool_for_grain whose threads each take a slot 0, 1, ... as they join;
 * a thread that would get slot >= maxslots (>= 1) runs no chunk. Returns
 * the number of slots handed out (at most min(maxslots, threads)). */
int fb_pool_for_slots(fb_pool *p, int64_t n, int64_t grain, int maxslots, fb_pool_slot_fn fn,
                      void *ctx);
/* Online cores of this machine (at least 1). */
int fb_cpu_cores(void);

/* ---------------------------------------------------------------- memory */

/* Where a session's device memory comes from. NULL (the CPU): host memory.
 * The CUDA device supplies managed memory, which the device and the host
 * reach at the same address, so the host code that reads fields, sizes
 * lists and walks sparse cells is the same on both devices (the caller
 * makes the device idle first). */
typedef struct fb_memsys {
  /* zeroed, 64-byte aligned; NULL when it cannot */
  void *(*alloc)(void *user, size_t bytes);
  void (*free)(void *user, void *p, size_t bytes);
  /* address space for a sparse block pool (not zeroed: the device runtime
   * then zeroes each block it takes from the pool, fb_rt_state.zero_fresh)
   * and its release; pool_max bounds its size (0: no bound) */
  void *(*reserve)(void *user, size_t bytes);
  void (*unreserve)(void *user, void *p, size_t bytes);
  uint64_t pool_max;
  void *user;
  /* Device memory the host must not dereference (the CUDA backend's
   * default): every host access copies. All NULL for memory the host reads
   * in place (host memory, CUDA managed memory). to_host and to_dev copy
   * bytes between the device address dev and host memory and return when
   * the copy is done (0, or an FB_E* code with a message in err); fill sets
   * bytes at dev to v in the device's order (before any later copy or
   * launch of the session). oom: after alloc or reserve returned NULL, why
   * (the device, the bytes asked, the bytes free), 0; or 1 when it has none. */
  int (*to_host)(void *user, void *dst, const void *dev, size_t bytes, char *err, size_t errlen);
  int (*to_dev)(void *user, void *dev, const void *src, size_t bytes, char *err, size_t errlen);
  int (*fill)(void *user, void *dev, int v, size_t bytes, char *err, size_t errlen);
  int (*oom)(void *user, char *why, size_t len);
} fb_memsys;

/* Does ms hand out memory the host must copy to and from? */
static inline int fb_memsys_copies(const fb_memsys *ms) { return ms && ms->to_host; }

typedef struct fb_devmem {
  const fb_memsys *ms;  /* NULL: host memory */
  uint8_t *root;        /* layout->root_bytes, zeroed, 64-byte aligned */
  uint64_t root_bytes;
  uint8_t *gtmp;        /* scratch shared by the tasks of one launch */
  size_t gtmp_bytes;
  uint64_t *rets;       /* return slots */
  int nrets;
  uint64_t limit;       /* bytes, 0 = unlimited */
  uint64_t extra;       /* sparse storage counted against the limit (fb_sparse) */
  uint64_t host;        /* host memory the session holds on its own behalf and
                           counts against the limit: the tape (engine/tape.c);
                           written and read with __atomic builtins */
  size_t root_alloc;    /* bytes actually mapped or allocated for root */
  int root_mapped;      /* root came from mmap */
} fb_devmem;

/* Allocate the zeroed root buffer. FB_EQUOTA (message naming the bytes
 * asked and the limit) when root_bytes exceeds limit. */
int fb_devmem_init(fb_devmem *m, uint64_t root_bytes, uint64_t limit, char *err, size_t errlen);
/* The same with memory from ms (NULL: host memory). */
int fb_devmem_init_on(fb_devmem *m, const fb_memsys *ms, uint64_t root_bytes, uint64_t limit,
                      char *err, size_t errlen);
/* Zeroed, 64-byte aligned memory of the session's kind, and its release. */
void *fb_devmem_alloc(const fb_devmem *m, size_t bytes);
void fb_devmem_free(const fb_devmem *m, void *p, size_t bytes);
/* Grow scratch to at least gtmp_bytes and the return slots to at least
 * nrets (never shrinks; what they hold is kept, new bytes are zero).
 * Scratch counts against the limit (FB_EQUOTA). */
int fb_devmem_reserve(fb_devmem *m, size_t gtmp_bytes, int nrets, char *err, size_t errlen);
/* Bytes counted against the limit: root + scratch + extra + host. */
uint64_t fb_devmem_used(const fb_devmem *m);
void fb_devmem_release(fb_devmem *m);
/* Host access to device memory of m's kind (plain copies for memory the
 * host reads in place): 0 or an FB_E* code with a message. */
int fb_devmem_get(const fb_devmem *m, void *dst, const void *dev, size_t bytes, char *err,
                  size_t errlen);
int fb_devmem_put(const fb_devmem *m, void *dev, const void *src, size_t bytes, char *err,
                  size_t errlen);
/* Zero the return slots before a launch; read return slot 0 after one. */
int fb_devmem_clear_rets(fb_devmem *m, char *err, size_t errlen);
int fb_devmem_ret0(const fb_devmem *m, uint64_t *out, char *err, size_t errlen);
/* An allocation of ms failed: FB_EQUOTA with the device's reason (the
 * device, bytes asked and free) when it has one, else FB_ENOMEM with
 * "cannot allocate <bytes> bytes of <what>". */
int fb_devmem_oom(const fb_devmem *m, size_t bytes, const char *what, char *err, size_t errlen);

/* ---------------------------------------------------------------- sparse
 * The sparse SNodes of a session (docs/sparse.md): the device state of
 * codegen/rt/fb_rt.h (ctx->runtime of every task), its block pool (a
 * reservation of address space that the device runtime bump-allocates
 * from, up to the limit left by everything else), one allocator per
 * pointer/dynamic SNode and one list per sparse SNode, whose storage the
 * host sizes before each listgen task. */

typedef struct fb_sparse fb_sparse;

/* mem (kept by the caller, outlives sp) gets the sparse bytes in mem->extra. */
int fb_sparse_new(const fb_layout *l, fb_devmem *mem, fb_sparse **out, char *err, size_t errlen);
void fb_sparse_free(fb_sparse *sp);
fb_rt_state *fb_sparse_state(fb_sparse *sp);
/* Before a launch: how much the pool may hand out (the limit less root,
 * scratch and lists). After a launch or host access: account the pool. */
void fb_sparse_begin(fb_sparse *sp);
void fb_sparse_end(fb_sparse *sp);
/* Make room in snode's list for everything its next listgen may add.
 * FB_EQUOTA (or FB_ENOMEM) with a message naming the SNode. */
int fb_sparse_prepare_list(fb_sparse *sp, int snode, char *err, size_t errlen);
/* The SNode whose block did not fit since the last call (and the block's
 * size): returns 1 and clears it, or 0 when none. The record is the first
 * task's to run out, and of that task's earliest fused part (fb_rt.h). */
int fb_sparse_take_oom(fb_sparse *sp, int *snode, uint64_t *bytes);
/* Storage of field element place[idx] (indices by dimension, in bounds) in
 * the session's root buffer: reading, NULL when the cell is inactive;
 * writing, the cell and its ancestors are activated (NULL: out of memory,
 * see fb_sparse_take_oom). */
uint8_t *fb_sparse_elem(fb_sparse *sp, uint8_t *root, int place, const int64_t *idx, int write);
/* A run of n elements of place along its last index, from idx, in one
 * bitmasked container that holds place directly (consecutive elements are
 * lin_step cells apart in it): the first element's storage (the others
 * follow at the container's cell stride), NULL when an ancestor is inactive
 * (reading) or out of memory (writing). Reading sets active[k] to 1 where
 * element k's cell is active, 0 elsewhere; writing activates all n. NULL
 * too when place's container is not bitmasked. */
uint8_t *fb_sparse_bits_run(fb_sparse *sp, uint8_t *root, int place, const int64_t *idx,
                            int64_t n, int64_t lin_step, uint8_t *active, int write);
/* On memory the host must copy (fb_memsys_copies) the addresses these two
 * return are device addresses (reach them with fb_devmem_get/put), the
 * walks copy what they read and write, and a copy that failed makes them
 * return NULL too: fb_sparse_host_error then returns its code and message
 * once (0: no copy failed since the last call). */
int fb_sparse_host_error(fb_sparse *sp, char *err, size_t errlen);
/* Checkpoints (engine/checkpoint.c): give sparse SNode snode's list room
 * for exactly cap elements (what it held is lost; FB_EQUOTA past the
 * limit), and the bytes of address space the block pool has. */
int fb_sparse_restore_list(fb_sparse *sp, int snode, uint64_t cap, char *err, size_t errlen);
uint64_t fb_sparse_pool_room(const fb_sparse *sp);
/* Bytes the pool has handed out, and blocks live per SNode (for tests). */
uint64_t fb_sparse_pool_used(const fb_sparse *sp);
uint64_t fb_sparse_live_blocks(const fb_sparse *sp, int snode);
/* Pointer SNode snode: cells activated or deactivated so far (each slot
 * set or cleared counts; only while no task runs is it exact). */
uint64_t fb_sparse_changes(const fb_sparse *sp, int snode);

/* ---------------------------------------------------------------- launcher */

typedef struct fb_rt_task {
  fb_task_body_fn body;
  fb_task_bounds_fn bounds; /* NULL: serial task */
  void *gpu;                /* CUDA: the compiled task (fb_cpu_code.gpu) */
  fb_cg_priv priv;          /* CPU: privatized scatter (fb_cpu_code.priv) */
} fb_rt_task;

/* What the launcher needs to know of a task beyond its code. */
typedef struct fb_rt_hint {
  int list_snode;           /* > 0: a listgen filling that SNode's list */
  int64_t grain;            /* parallel: smallest chunk (0: the pool's) */
} fb_rt_hint;

/* ---------------------------------------------------------------- timeline
 * Chrome trace-event JSON (the format Perfetto and chrome://tracing open):
 * complete events ("ph": "X") on tracks (tid) of one process (pid), with
 * thread_name metadata so the tracks are labelled. Safe to record into from
 * several threads at once. Times are fb_trace_clock() seconds. */

typedef struct fb_trace fb_trace;

/* Tracks of a session's timeline. */
enum {
  FB_TRACK_CLIENT = 1,   /* the session's caller: flushes (optimizer), waits */
  FB_TRACK_LAUNCHER = 2, /* the ordered worker: batches, waiting for code */
  FB_TRACK_DEVICE = 3,   /* tasks running on the device */
  FB_TRACK_COMPILE = 100 /* + i: compile pool thread i */
};

double fb_trace_clock(void); /* CLOCK_MONOTONIC, seconds */
/* A timeline for process pid named `process` (copied). NULL: out of memory. */
fb_trace *fb_trace_new(int pid, const char *process);
void fb_trace_free(fb_trace *t);
/* Record an event on track tid from t0 to t1. cat and name are copied (and
 * escaped when written); args, when not NULL, is the text of a JSON object
 * ("{\"launch\":3}") that the caller made valid. Events past the
 * recorder's bound are counted and dropped. */
void fb_trace_span(fb_trace *t, int tid, const char *cat, const char *name, double t0, double t1,
                   const char *args);
/* Write {"traceEvents": [...]} to f. 0, or FB_EIO. */
int fb_trace_write(fb_trace *t, FILE *f);
uint64_t fb_trace_count(fb_trace *t); /* events recorded so far */

/* ---------------------------------------------------------------- compile pool
 * Threads that compile task IR with the engine's JIT (each compile in its
 * own LLVM context, see codegen.h), first come first served across every
 * session of the engine. */

typedef struct fb_cpool fb_cpool;

typedef struct fb_cjob {
  /* in */
  fb_cg_task task;       /* the IR must stay valid until the job is done */
  fb_trace *trace;       /* compile events go here (may be NULL) */
  /* out, once done */
  int rc;                /* 0 or the compile's FB_E* code */
  fb_cpu_code code;
  char msg[256];
  /* the pool's */
  int state;
  struct fb_cjob *prev, *next;
} fb_cjob;

/* What the pool compiles with: fb_cpu_jit_compile's shape. */
typedef int (*fb_compile_fn)(void *user, const fb_cg_task *t, fb_cpu_code *out, char *err,
                             size_t errlen);

/* nthreads: 0 = one per core. Compiles with jit, or (fb_cpool_new_with)
 * with fn(user, ...). */
int fb_cpool_new(fb_cpu_jit *jit, int nthreads, fb_cpool **out, char *err, size_t errlen);
int fb_cpool_new_with(fb_compile_fn fn, void *user, int nthreads, fb_cpool **out, char *err,
                      size_t errlen);
/* Joins the threads; no job may be waiting. */
void fb_cpool_free(fb_cpool *p);
int fb_cpool_threads(const fb_cpool *p);
/* Queue n jobs (task and trace set, the rest zeroed by the caller), in order. */
void fb_cpool_submit(fb_cpool *p, fb_cjob *jobs, int n);
/* Return once job is compiled: a job still queued (or never submitted:
 * zeroed, task and trace set) is compiled on the calling thread (its events
 * on track `tid`), so a waiter never waits for a job nobody works on. */
void fb_cpool_wait(fb_cpool *p, fb_cjob *job, int tid);
/* Take back a job nobody will wait for (its batch was cancelled), so that
 * its memory may be freed: one still queued (or never submitted) is dropped
 * uncompiled and 1 returned; one being compiled is waited for (0). */
int fb_cpool_withdraw(fb_cpool *p, fb_cjob *job);
/* 1 once a submitted job is compiled (its results may be read); never
 * waits (a background compile is polled with it). */
int fb_cpool_done(fb_cpool *p, fb_cjob *job);

/* ---------------------------------------------------------------- ordered queue
 * One thread that runs pushed items one at a time in push order (a
 * session's ordered worker). Items are intrusive: embed an fb_ordq_item. */

typedef struct fb_ordq fb_ordq;
typedef struct fb_ordq_item {
  struct fb_ordq_item *next;
} fb_ordq_item;
typedef void (*fb_ordq_fn)(void *user, fb_ordq_item *item);

int fb_ordq_new(fb_ordq_fn fn, void *user, fb_ordq **out, char *err, size_t errlen);
/* Runs what is queued, then stops and joins the thread. */
void fb_ordq_free(fb_ordq *q);
void fb_ordq_push(fb_ordq *q, fb_ordq_item *item);
/* Wait until every item pushed so far has run. */
void fb_ordq_drain(fb_ordq *q);
/* Nothing queued or running right now. */
int fb_ordq_idle(fb_ordq *q);

/* ---------------------------------------------------------------- device operations
 * What the engine needs of a device, as one table of operations per device
 * (as QBE's Target): fb_cpu_ops (the CPU device: its thread pool and the
 * JIT) and fb_cuda_ops (the CUDA device, runtime/cuda.h). The engine keeps the table
 * and the device it opened, each session keeps a queue of that device, and
 * neither asks which device it has.
 *
 * Two kinds of device: one that runs a task when it is launched (the CPU:
 * launch returns the task's error and its time), and one that queues it
 * (`queued`, CUDA: launch returns the task's error slot, which finish reads
 * for the whole batch with the batch's device time; a launch refused before
 * it was queued returns its FB_E* code and no slot). A device object is
 * the implementation's own (fb_cpu_device, fb_cuda_device), as is a queue
 * (the CPU device itself; an fb_cuda_queue). */
typedef struct fb_device_ops {
  const char *backend;    /* "cpu" or "cuda" (fb_engine_backend) */
  int queued;             /* tasks are queued; errors come back at finish */
  /* the device: open (cpu_threads as fb_pool_new's nthreads; FB_E* code
   * and a message on failure), close, its name, its health (1 healthy,
   * else 0 and why), and the kernel parameters one task launch can take
   * (0: no bound), what fusion's cost model must respect */
  int (*open)(int cpu_threads, void **dev, char *err, size_t errlen);
  void (*close)(void *dev);
  const char *(*name)(const void *dev);
  int (*healthy)(void *dev, char *why, size_t len);
  int (*max_task_params)(void);
  /* compile a task for the device (safe from several threads): the
   * compile pool's compiler, with user = dev */
  fb_compile_fn compile;
  /* the device's code cache: what it holds now, and its bound in bytes
   * (0: none; evicts past it at once). Safe from several threads. */
  void (*code_cache)(void *dev, fb_code_cache_info *out);
  void (*set_code_cache_bytes)(void *dev, uint64_t bytes);
  /* a session's queue and the memory it supplies (NULL: host memory);
   * alive: 0 while usable, else FB_EDEVICE and a message (sticky error) */
  int (*queue_new)(void *dev, void **q, char *err, size_t errlen);
  void (*queue_free)(void *q);
  const fb_memsys *(*memsys)(void *q);
  int (*alive)(void *q, char *err, size_t errlen);
  /* a sync launch: run the tasks in order and wait, as fb_cpu_run_sparse
   * (runtime/cpu.h: the first error, *failed the task that raised it, device time) */
  int (*run)(void *q, fb_rt_ctx *ctx, fb_sparse *sp, const fb_rt_task *tasks,
             const fb_rt_hint *hints, int ntasks, double *seconds, int *failed, char *err,
             size_t errlen);
  /* an async batch: begin, launch each task (*slot: its error slot when
   * queued, else -1; *seconds: its device time when run at once), finish
   * (waits; the error slots, one per queued launch in order, each two
   * words: errs[2 * slot] the error, 0 = none, errs[2 * slot + 1] the
   * blame word of codegen/rt/fb_rt.h; and the batch's device time; none on
   * a device that runs at once) */
  int (*begin)(void *q, char *err, size_t errlen);
  int (*launch)(void *q, fb_rt_ctx *ctx, const fb_rt_task *t, const fb_rt_hint *hint, fb_sparse *sp,
                int *slot, double *seconds, char *err, size_t errlen);
  int (*finish)(void *q, const int32_t **errs, int *nslots, double *seconds, char *err,
                size_t errlen);
} fb_device_ops;

/* The operations table of the device named `backend` ("cpu": fb_cpu_ops,
 * runtime/launch.c; "cuda": fb_cuda_ops, runtime/cuda.c), NULL for any other
 * name. The engine's one route to a device: the tables and each device's
 * own functions are private to runtime/ (runtime/cpu.h, runtime/cuda.h). */
const fb_device_ops *fb_device_ops_for(const char *backend);

#endif
