/* The in-process engine: sessions own a layout and its device memory, take
 * kernels (as IR), launch them, and report counters. The CLI, the tests, the
 * benchmarks and fuseboxd all drive the pipeline through this API.
 *
 * Two modes per session:
 *  - "sync": every launch runs at once. The kernel is lowered to tasks and
 *    each task compiled (or found in the code cache) when it is registered;
 *    fb_launch runs its tasks before it returns.
 *  - "async": launches are held back in the session's state-flow graph
 *    (SFG) and optimized across kernel boundaries when it is flushed. A
 *    flush happens on fb_flush, fb_sync, a host read or write of a field, a
 *    launch of a kernel with a return value, and every flush_every pending
 *    tasks (with the default flush_every, at the boundary of the launch
 *    stream's repeating period). A flush does not wait for the work: the
 *    session's ordered worker compiles the optimized tasks on the engine's
 *    compile pool and runs them in order as each one's code is ready (a
 *    large task only demoted runs the code of the task as inserted while
 *    its own compiles in the background). fb_sync, host access
 *    and return values wait for everything launched before them.
 * Both modes give the same field contents and return values.
 *
 * Errors: functions return 0 or a negative FB_E* code; fb_session_errmsg()
 * then says what went wrong (naming the kernel, field or statement). A
 * failed call leaves the session usable. No function aborts the process on
 * bad input. In async mode an error of a launch that ran in the background
 * (FB_EBOUNDS, FB_EQUOTA, ...) is returned by the next fb_sync, fb_flush,
 * host access (after it has done its work) or launch with a return value,
 * with a message naming the kernel and its launch number (the session's
 * launches count from 0); fb_session_error_launch() gives them as numbers.
 * When launches ran fused into one task, the message names the one the
 * error comes from when that is certain (an out-of-bounds access in the only
 * part whose accesses are not all provably in bounds); otherwise the first,
 * saying that it may be a launch fused with it.
 *
 * Threads:
 *  - An engine may be used from several threads at once: its sessions share
 *    its JIT (and code cache), its CPU thread pool and its compile pool,
 *    each safe to use from several threads. fb_engine_create and
 *    fb_engine_destroy are the exceptions: nothing else may be using the
 *    engine while it is destroyed, and its sessions must be destroyed
 *    before it (their compiled code lives in the engine's JIT).
 *  - A session is used by one thread at a time, its caller (every fb_session_*,
 *    fb_launch, fb_flush, fb_sync and fb_field_* call on it); different
 *    sessions of one engine may be used by different threads at once.
 *  - An async session also has a thread of its own, its ordered worker,
 *    which runs flushed batches in order; it touches only the session's
 *    device memory and what it shares with the caller under the session's
 *    locks, so the caller needs no locking of its own. fb_session_destroy
 *    lets it finish what it was given, then stops it.
 *  - Callbacks: the task hook (fb_session_set_task_hook) runs on the thread
 *    that runs the task: the caller's in sync mode; in async mode the
 *    session's worker, or the caller's thread when it runs a batch it would
 *    wait for anyway. The SFG trace (fb_session_trace_graph) runs on the
 *    caller's thread, inside the call that flushes. */
#ifndef FUSEBOX_ENGINE_H
#define FUSEBOX_ENGINE_H

#include "fusebox/common.h"
#include "fusebox/codestore.h"
#include "fusebox/counters.h"
#include "fusebox/ir.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct fb_engine fb_engine;
typedef struct fb_session fb_session;

typedef struct fb_engine_config {
  const char *backend;  /* "cpu" (default), "cuda", "auto" (see fb_engine_backend) */
  int compile_threads;  /* threads of the compile pool that async sessions
                           share; 0 = one per core */
  int cpu_threads;      /* 0 = one per core: workers for parallel tasks */
} fb_engine_config;

/* The CPU code cache's bound until fb_engine_set_code_cache_bytes. */
#define FB_CODE_CACHE_BYTES_DEFAULT (256ull << 20)

/* Inter-kernel passes of async mode (fb_session_config.passes). Intra-task
 * simplification of fused tasks is part of fusion. */
enum {
  FB_PASSES_LISTGEN = 1 << 0, /* list-generation removal */
  FB_PASSES_DEMOTE = 1 << 1,  /* activation demotion */
  FB_PASSES_FUSION = 1 << 2,  /* task fusion (and simplification of fused tasks) */
  FB_PASSES_DSE = 1 << 3,     /* dead-store elimination */
  FB_PASSES_ALL = 15,
  /* passes lists exactly the passes to run, possibly none; without this
   * bit, passes == 0 means every pass (the default) */
  FB_PASSES_EXACT = 1 << 30
};

#define FB_FLUSH_EVERY_DEFAULT 50 /* pending tasks */
/* Pending tasks that force a flush whatever flush_every says (-1 included):
 * the SFG of a stream that is never flushed would grow without bound. */
#define FB_MAX_PENDING_TASKS 65536
/* Flushed batches an async session may have waiting for its worker: the
 * flush that hands out one more waits until the worker has finished one of
 * them, so what a stream of launches holds is bounded too
 * (fb_session_pending_bytes). */
#define FB_MAX_QUEUED_FLUSHES 4
/* What one pending task is counted as in fb_session_pending_bytes, besides
 * its argument slots: an estimate of its SFG node and batch entry. */
#define FB_PENDING_TASK_BYTES 512
/* FB_MAX_KERNEL_STATEMENTS_DEFAULT, the compile budget of a kernel: fusebox/limits.h */

/* Zero-initialized fields take their defaults. */
typedef struct fb_session_config {
  const char *mode;     /* "sync" (default) or "async" */
  uint64_t seed;        /* rand() seed */
  uint64_t memory_limit; /* bytes of device memory, 0 = unlimited */
  int max_kernel_statements; /* compile budget: kernels with more statements
                                are refused with FB_EQUOTA; 0 = the default
                                FB_MAX_KERNEL_STATEMENTS_DEFAULT, < 0 = none;
                                async fusion keeps each fused task within it */
  int allow_internal_ops; /* accept kernels holding ops internal to the
                             engine: only for tests of those ops' code
                             generation; fuseboxd never sets it */
  /* async mode only */
  unsigned passes;      /* FB_PASSES_* bits (see FB_PASSES_EXACT); 0 = all */
  int flush_every;      /* flush once this many tasks are pending:
                           0 = FB_FLUSH_EVERY_DEFAULT, doubled while the
                           plan memo answers (up to 4096) and deferred to
                           the launch stream's period boundary; < 0 = only
                           at FB_MAX_PENDING_TASKS and at host access or sync */
  int max_fuse_per_task; /* fusions one task takes part in per fusion
                            round; 0 = default (1) */
  uint64_t cache_partition; /* sessions share compiled code (and code cache
                               hits) only with sessions of the same partition
                               (fuseboxd: one per tenant); 0 by default */
} fb_session_config;

/* fb_counters (fb_session_counters): see fusebox/counters.h. */

/* One async flush (fb_session_last_flush). */
typedef struct fb_flush_stats {
  uint64_t flush;              /* its number: the session's flushes count from 1 */
  uint64_t tasks_in;           /* task launches in the window */
  uint64_t tasks_out;          /* optimized tasks handed to the worker */
  uint64_t listgens_removed, tasks_fused, dead_stores_removed, activations_demoted;
  double optimizer_s;          /* SFG and passes, this flush */
} fb_flush_stats;

int fb_engine_create(const fb_engine_config *cfg, fb_engine **out, char *err, size_t errlen);
void fb_engine_destroy(fb_engine *e);
/* backend: "cpu" runs on the CPU; "cuda" on the GPU through the CUDA
 * driver (loaded at run time: without one fb_engine_create fails with
 * FB_EDEVICE and a message saying so); "auto" on the GPU when the driver
 * and a GPU are there, else on the CPU. */
const char *fb_engine_backend(const fb_engine *e); /* "cpu" or "cuda" */
/* The device in words: "CPU (2 threads)", or the GPU's name, SM and memory.
 * The string lives as long as the engine. */
const char *fb_engine_device(const fb_engine *e);
/* 1 while the engine's device works. 0 after a GPU context failure, until
 * the sessions it ended are closed and the context is made again; why
 * (may be NULL) then says what happened. Sessions of a failed context
 * return FB_EDEVICE from every call. */
int fb_engine_healthy(fb_engine *e, char *why, size_t len);
/* The code cache of the engine's device (the CPU JIT's code, or the CUDA
 * device's loaded modules, counted by PTX size): bytes it holds (code and
 * its keys), of which pinned by live sessions, its bound (0: none),
 * entries, evictions so far. */
typedef struct fb_code_cache_usage {
  uint64_t bytes, pinned_bytes, limit, entries, evictions;
} fb_code_cache_usage;
void fb_engine_code_cache(fb_engine *e, fb_code_cache_usage *out);
/* Bound the CPU code cache to bytes (0: none): past it the least recently
 * used code that no live session holds is removed from the JIT and freed.
 * Code that live sessions hold is never evicted, so the cache may stand
 * above its bound while they hold more. On CUDA this does nothing: a module
 * stays loaded for its context's life, and the bound reads 0. */
void fb_engine_set_code_cache_bytes(fb_engine *e, uint64_t bytes);
/* A compile cache outside the process (fusebox/codestore.h,
 * docs/code-cache.md; NULL: none), asked before each compile that the code
 * cache above misses and given what is compiled. Set it before the first
 * session; *s is copied. CPU only for now (on CUDA it does nothing).
 * 0 or FB_ENOMEM. */
int fb_engine_set_code_store(fb_engine *e, const fb_code_store *s);

/* The session copies the layout (which must be finalized). On failure err
 * (may be NULL) says why: an unfinalized layout, an unknown mode, or the
 * field storage over the memory limit (FB_EQUOTA). */
int fb_session_create(fb_engine *e, const fb_session_config *cfg, const fb_layout *layout,
                      fb_session **out, char *err, size_t errlen);
void fb_session_destroy(fb_session *s);
const char *fb_session_errmsg(const fb_session *s);
const fb_layout *fb_session_layout(const fb_session *s);

/* Register a kernel: verified, copied and lowered to tasks (sync: each
 * task compiled now; async: put into the session's IR bank and compiled
 * when a flush hands it out). Its SNode ids refer to the session's
 * layout. Kernels are treated as untrusted: one holding an op internal to
 * the engine (gtmp_*, list tasks, demoted stores: FB_OPF_INTERNAL) is
 * refused with FB_EVERIFY, one over the compile budget with FB_EQUOTA.
 * Returns the kernel id (>= 0). */
int fb_session_add_kernel(fb_session *s, const fb_kernel *k);
int fb_session_find_kernel(const fb_session *s, const char *name);
/* Kernels registered so far (ids 0 .. count-1), those the session made on
 * its own (adjoints, the tape's clears) included. */
int fb_session_kernel_count(const fb_session *s);
/* The kernel's tasks as IR (owned by the session): for `fusebox ir`. */
int fb_session_kernel_tasks(const fb_session *s, int kernel, const fb_kernel *const **tasks,
                            int *ntasks);
/* The kind of the kernel's task `task`: "serial", "range_for", "struct_for",
 * "clear_list", "listgen" or "gc"; NULL when there is no such task. */
const char *fb_session_task_kind(const fb_session *s, int kernel, int task);

/* Launch a kernel. args: one value per parameter, converted to the
 * parameter type when the kinds agree (int to int, float to float).
 * ret receives the return value when the kernel has one (may be NULL).
 * FB_EBOUNDS: the kernel ran but indexed a field out of bounds. In async
 * mode the launch is queued (its errors come later, see above) unless the
 * kernel has a return value: then everything launched so far runs first
 * and the call returns their errors and its value. */
int fb_launch(fb_session *s, int kernel, const fb_value *args, int nargs, fb_value *ret);
/* Wait for everything launched so far (async: flush first). */
int fb_sync(fb_session *s);
/* Async: optimize what is pending and hand it to the session's worker,
 * without waiting for it to run (sync mode: nothing to do). */
int fb_flush(fb_session *s);

/* Host access to fields, in the field's flat row-major order (indices in
 * axis order), elements of the field's type. bytes must equal
 * numel * sizeof(type). */
int fb_field_read(fb_session *s, int field, void *dst, size_t bytes);
int fb_field_write(fb_session *s, int field, const void *src, size_t bytes);
/* Which elements of a field are active (docs/sparse.md): mask gets one byte
 * per element in the same order, 1 active, 0 not; n must equal numel. A
 * field under no sparse container is all active. Activates nothing. */
int fb_field_active(fb_session *s, int field, uint8_t *mask, size_t n);
int fb_cell_read(fb_session *s, int field, const int64_t *idx, int nidx, fb_value *out);
int fb_cell_write(fb_session *s, int field, const int64_t *idx, int nidx, fb_value v);

void fb_session_counters(const fb_session *s, fb_counters *out);
/* Launches so far (fb_counters.launches) without gathering the counters:
 * the caller's own count, no lock (a launch refused before it was counted,
 * e.g. a bad argument, does not count). */
uint64_t fb_session_launches(const fb_session *s);
/* Async: bytes the session's pending launches hold now, an estimate: each
 * task waiting in the SFG or in a flushed batch not yet run counts
 * FB_PENDING_TASK_BYTES plus its argument slots. 0 in sync mode. Safe to
 * call from the session's thread. */
uint64_t fb_session_pending_bytes(const fb_session *s);
/* Bytes the session's registered kernels hold in host memory, an
 * estimate meant to be on the high side: each kernel's copy, its lowered
 * tasks' IR and, async, the optimizer bank's copy of each task and its
 * metadata, with their per-kernel records and allocator overhead (JIT code
 * is the code cache's, not counted here). Safe to call from the session's
 * thread. */
uint64_t fb_session_kernel_bytes(const fb_session *s);
/* The most fb_session_kernel_bytes may reach: fb_session_add_kernel
 * refuses a kernel that would take it past cap with FB_EQUOTA, "kernel
 * 'k': its IR takes N bytes ... (memory_budget)". UINT64_MAX (the
 * default): no cap. */
void fb_session_set_kernel_cap(fb_session *s, uint64_t cap);
/* Forget the kernels registered after the first keep (ids keep and up),
 * newest first: for a caller whose request registered some kernels and
 * then failed, and whose client never learnt their ids, so that a refused
 * request registers nothing. They must not have been launched. */
void fb_session_drop_kernels(fb_session *s, int keep);
/* Async: flush and wait until every pending launch has run, as fb_sync
 * does, but leave the errors of background launches for the next report
 * (fb_sync, fb_flush, host access). For a caller that must bound what
 * pending launches hold. 0 in sync mode. */
int fb_session_drain(fb_session *s);
/* The latest async flush: 0, or FB_ENOENT when none happened yet. */
int fb_session_last_flush(const fb_session *s, fb_flush_stats *out);
/* When fb_session_errmsg() is the error of a background launch: its launch
 * number and kernel id (0), else FB_ENOENT. */
int fb_session_error_launch(const fb_session *s, uint64_t *launch, int *kernel);

/* ---- automatic differentiation (docs/autodiff.md)
 *
 * Gradients are fields: the gradient of place x is the place "x.grad" of
 * the layout (fb_grad_map_from_layout). */

/* Register the adjoint of a registered kernel: fb_kernel_adjoint over the
 * layout's gradient map, then fb_session_add_kernel (the same verifier,
 * statement limit, compile budget and kernel memory cap as any kernel).
 * Made once per kernel: a second call gives the same id. *adj receives the
 * adjoint's kernel id ("<name>.grad", launched with the kernel's
 * arguments). A kernel the pass refuses: FB_EVERIFY (FB_EINVAL for a bad
 * gradient), the message naming the kernel and what to change. */
int fb_session_kernel_adjoint(fb_session *s, int kernel, int *adj);
/* Register the tangent of a registered kernel (forward mode,
 * docs/autodiff.md "Forward mode"): fb_kernel_tangent over the layout's
 * dual map (x.dual), then fb_session_add_kernel, as above; made once per
 * kernel. *tan receives its id ("<name>.dual": k's parameters and return
 * value; launched in place of k it also leaves J · (the duals of the
 * fields k reads) in the duals of the fields it writes). */
int fb_session_kernel_tangent(fb_session *s, int kernel, int *tan);
/* A custom gradient: registered kernel adj is kernel's adjoint from now on
 * (fb_session_kernel_adjoint and the tape give it instead of generating
 * one, so kernel is not held to the pass's rules). adj takes kernel's
 * parameters. FB_EINVAL, naming both kernels, when adj is kernel, their
 * parameters differ, adj has a custom adjoint of its own or kernel is one
 * (no chains), or kernel already has another adjoint; binding the same
 * pair again is 0; FB_ENOENT for an id that is no kernel. Adjoints
 * generated for kernels a custom adjoint is bound to later are not redone:
 * bind before asking for the adjoint or taping the kernel. */
int fb_session_set_kernel_adjoint(fb_session *s, int kernel, int adj);
/* adj -1 unbinds kernel's custom adjoint (0 when it has none).
 * fb_session_custom_adjoint: the custom adjoint bound to kernel, or
 * FB_ENOENT when none. */
int fb_session_custom_adjoint(const fb_session *s, int kernel);

/* The tape. Launches between begin and end are recorded (nothing else
 * changes: they run, or are queued, as always). end then launches, as
 * ordinary launches: a clear (to 0) of the gradient of every field the
 * recorded launches touch, loss.grad = 1, and the adjoint of each recorded
 * launch with its arguments, newest first. The loss is a 0-D float field
 * with a gradient (FB_EINVAL otherwise). A second begin before end, or end
 * without begin: FB_EINVAL, and the tape already recording goes on. When
 * a recorded launch's kernel has no adjoint, end launches nothing and
 * returns the pass's error naming that launch (its tape position, its
 * kernel and its launch number, which fb_session_error_launch gives too);
 * the tape is over either way. Destroying a session frees a tape that is
 * recording. The tape's memory counts against the session's memory_limit
 * (in device_bytes until the end gives it back): a launch that would take
 * it past the limit is refused with FB_EQUOTA naming the tape and the
 * bytes, and the tape goes on. A recorded kernel with a custom adjoint
 * (fb_session_set_kernel_adjoint) gets that adjoint. */
int fb_session_tape_begin(fb_session *s, int loss_field);
int fb_session_tape_end(fb_session *s);
/* The loss field of the tape recording now, FB_ENOENT when none. */
int fb_session_tape_loss(const fb_session *s);

/* ---- watching and cancelling running work
 *
 * The hook is called before each task the session runs, from the thread that
 * runs it (see "Threads" at the top):
 * kernel is the name of the launch's kernel, task the kernel's name too,
 * or for a fused task its launches in the user's terms ("kernel 'a'
 * (launch 7) fused with kernel 'b' (launch 8)"; never an internal task
 * name), launch the engine's launch number. A non-zero
 * return cancels: that task and every later task of the launch (sync) or of
 * the flushed window (async) are skipped and the first skipped launch is
 * reported as FB_ECANCELLED. After the task ran the hook is called again
 * with kernel and task NULL. fuseboxd uses it to time kernels against
 * kernel_timeout_s and to stop work at a task boundary on Cancel. Set it
 * before the first launch; fn NULL removes it. */
typedef int (*fb_task_hook)(void *user, const char *kernel, const char *task, uint64_t launch);
void fb_session_set_task_hook(fb_session *s, fb_task_hook fn, void *user);

/* ---- observability (async mode) */

/* Called with the SFG as Graphviz DOT during flush number `flush` (0: every
 * flush): pass "window" (iteration -1) when "before" (the graph as
 * flushed) and "after" (fully optimized), and between them each pass that
 * runs, "before" and "after", with its pipeline iteration. Runs on the
 * caller's thread inside the call that flushes. fn NULL stops.
 * FB_EUNSUPPORTED in sync mode. */
typedef void (*fb_graph_trace_fn)(void *user, uint64_t flush, int iteration, const char *pass,
                                  const char *when, const char *dot);
int fb_session_trace_graph(fb_session *s, uint64_t flush, fb_graph_trace_fn fn, void *user);

/* Record a Chrome trace-event timeline (opens in Perfetto or
 * chrome://tracing) of the session: flushes on the caller's track, the
 * launcher, the device and the compile threads. begin opens `path` for
 * writing (FB_EIO if it cannot); end waits for the work handed to the
 * worker (not for pending launches: fb_sync first to include them),
 * writes the file and closes it. A second begin ends the first. */
int fb_session_trace_begin(fb_session *s, const char *path);
int fb_session_trace_end(fb_session *s);

/* ---- checkpoint and restore (docs/checkpoint.md)
 *
 * A session's whole state as a byte stream, and a new session from one.
 * The stream: a versioned header, then parts (session options and counts,
 * the layout, the kernels with their adjoint and tangent links, the
 * tape's generated-kernel tables, every field's storage in chunks, the
 * sparse runtime's allocators, block pool and lists), then a manifest with
 * a SHA-256 of every part. */

/* The checkpoint format this build writes and reads. */
#define FB_CHECKPOINT_FORMAT 2

/* A byte sink: 0 on success, non-zero stops the writer (it then fails with FB_EIO). */
typedef int (*fb_sink_fn)(void *user, const void *buf, size_t n);
/* A byte source: bytes read (> 0), 0 at the end, < 0 on error. */
typedef long (*fb_source_fn)(void *user, void *buf, size_t n);

/* The session's whole state (it syncs first; async: pending and fused work
 * runs first) as an unsealed checkpoint stream: versioned header, then
 * parts (layout, kernels incl. adjoints/tangents/custom adjoints, every
 * field's storage incl. sparse structure and activity, random state,
 * launch count, session options), then a manifest with a SHA-256 per part.
 * Refused (FB_EINVAL) while a tape is being recorded. The session goes on
 * unchanged whatever happens to the stream. */
int fb_session_checkpoint(fb_session *s, fb_sink_fn sink, void *user, char *err, size_t errlen);
/* A new session on e from such a stream. limits: memory_limit,
 * max_kernel_statements, cache_partition (the restoring side's policy) are
 * taken from it; mode, seed, passes, flush_every, ... from the checkpoint.
 * Refuses a stream of another version, a truncated one, a part whose hash
 * differs, a state over memory_limit (FB_EQUOTA), with a clear message; on
 * any failure nothing is left behind (*out stays NULL). */
int fb_session_restore(fb_engine *e, const fb_session_config *limits, fb_source_fn src, void *user,
                       fb_session **out, char *err, size_t errlen);

/* fb_session_restore of a stream whose seal fb_seal_check_fd has checked
 * (the same bytes: a file nobody else writes, or a memfd only the caller
 * holds): the seal's MAC covered all but the bulk parts (fields, block
 * pool), which this binds through their SHA-256 in the manifest (under
 * the MAC) as it reads them, so the bulk is read and hashed once. A bulk
 * part that does not match, or whose contents name blocks outside the
 * pool, reads as the seal's "the checkpoint was modified or was written
 * with another server key"; nothing is left behind. */
int fb_session_restore_sealed(fb_engine *e, const fb_session_config *limits, fb_source_fn src,
                              void *user, fb_session **out, char *err, size_t errlen);

/* The seal: an owner and an HMAC-SHA256 (OpenSSL) around a checkpoint
 * stream, so that a checkpoint file is bound to a key kept outside the
 * checkpoint directory and to one owner (a tenant of fuseboxd; "" for the
 * local CLI). */
typedef struct fb_seal fb_seal;
#define FB_SEAL_KEY_MIN 32  /* bytes a key must have */
#define FB_SEAL_KEY_MAX 256 /* bytes fb_seal_key_load reads at most */
#define FB_SEAL_OWNER_MAX 255 /* bytes of an owner */
/* Wraps sink: bytes given to fb_seal_write go through to sink and, all
 * but the bulk parts' (fields, block pool: bound through their SHA-256 in
 * the manifest), into the MAC. The stream must be a checkpoint's
 * (fb_session_checkpoint's): other bytes make fb_seal_write fail, and a
 * stream that ends before its manifest fb_seal_finish. NULL: a key shorter
 * than FB_SEAL_KEY_MIN, an owner longer than FB_SEAL_OWNER_MAX, or out of
 * memory. */
fb_seal *fb_seal_begin(const uint8_t *key, size_t keylen, const char *owner, fb_sink_fn sink,
                       void *user);
int fb_seal_write(void *seal, const void *buf, size_t n); /* an fb_sink_fn */
int fb_seal_finish(fb_seal *s, char *err, size_t errlen); /* writes the trailer; frees s */
void fb_seal_abort(fb_seal *s);                           /* frees without a trailer */
/* Checks a whole sealed checkpoint in fd (from offset 0), in one pass:
 * format, version, HMAC, each bulk part against its SHA-256 in the
 * manifest, owner. On success *payload_len is the length of the checkpoint
 * stream that precedes the trailer (restore from fd's first payload_len
 * bytes). Errors name the problem in the user's terms: "the checkpoint was
 * modified or was written with another server key", "the checkpoint
 * belongs to another tenant", "the checkpoint is truncated", "the
 * checkpoint was written by Fusebox format N, this server reads M". */
int fb_seal_verify_fd(int fd, const uint8_t *key, size_t keylen, const char *owner,
                      uint64_t *payload_len, char *err, size_t errlen);
/* The seal's own check without the bulk parts' bytes, for a restore that
 * reads them next with fb_session_restore_sealed (a resume: the bulk read
 * and hashed once, not twice): format, HMAC over the covered bytes (the
 * manifest with the bulk parts' SHA-256 among them), owner; the same
 * errors as fb_seal_verify_fd. It reads only the covered bytes (small
 * beside the fields); on its own it proves nothing about the fields. */
int fb_seal_check_fd(int fd, const uint8_t *key, size_t keylen, const char *owner,
                     uint64_t *payload_len, char *err, size_t errlen);
/* The key file: read one (must be a regular file, mode 0600 or stricter,
 * owned by us, FB_SEAL_KEY_MIN+ bytes), or create one with 32 random bytes
 * (O_EXCL, 0600) when asked to and there is none. key has room for
 * FB_SEAL_KEY_MAX bytes; *keylen receives its length. */
int fb_seal_key_load(const char *path, int create, uint8_t *key, size_t *keylen, char *err,
                     size_t errlen);

#ifdef __cplusplus
}
#endif
#endif
