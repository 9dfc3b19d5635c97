/* optimizer/optimizer.h: the optimizer's interface, all that the engine
 * (engine/) sees of optimizer/. Uses ir/ only. Two parts:
 *  - lowering (fb_lower): a kernel into the ordered tasks it runs as;
 *  - the asynchronous engine's inter-kernel optimizer (fb_opt): the IR bank
 *    and the state-flow graph (SFG) with its passes, behind an opaque
 *    context (docs/optimizer.md; the AsyncTaichi paper, sections 3-6 and
 *    supplement).
 * How the optimizer works inside (task metadata, the bank, the graph, the
 * passes) is in optimizer/sfg.h, private to the folder (and its tests): the
 * engine's include folder does not hold it (fb_layer, test_layers).
 *
 * Lowering (fb_lower) turns a verified kernel into an ordered list of tasks:
 * each top-level par_for or struct_for becomes one parallel task, each run
 * of other top-level statements one serial task. Every task is a kernel of
 * its own with the original kernel's parameters:
 *  - pure top-level values (consts, args, arithmetic over them) that a task
 *    uses are recomputed inside it;
 *  - other top-level values and top-level local variables used by several
 *    tasks live in the launch's scratch buffer (gtmp_store / gtmp_load at
 *    8-byte slots), so tasks never share registers.
 * A parallel task's body block holds its recomputed values followed by the
 * loop statement, whose id is fb_task.loop.
 *
 * Sparse SNodes (docs/sparse.md): a struct_for whose SNode lies below sparse
 * containers P1 .. Pk is preceded by a serial clear_list task and a parallel
 * listgen task per Pi (fb_task.loop = the listgen statement, fb_task.snode =
 * Pi); a kernel that deactivates cells of a sparse S ends with a serial gc
 * task per pointer/dynamic SNode of S's subtree, ancestors first. */
#ifndef FB_OPTIMIZER_H
#define FB_OPTIMIZER_H

#include <stddef.h>
#include <stdint.h>

#include "fusebox/ir.h"

typedef enum fb_task_kind {
  FB_TASK_SERIAL = 0,
  FB_TASK_RANGE_FOR,
  FB_TASK_STRUCT_FOR,
  FB_TASK_CLEAR_LIST,
  FB_TASK_LISTGEN,
  FB_TASK_GC
} fb_task_kind;

const char *fb_task_kind_name(fb_task_kind k);

typedef struct fb_task {
  fb_task_kind kind;
  fb_kernel *ir; /* owned; named "<kernel>.t<N>" */
  int loop;      /* statement id of the parallel loop in ir, -1 if serial */
  int snode;     /* struct_for / list tasks: the SNode iterated, else -1 */
  /* task-local rewrites lowering made in it (both engine modes; see
   * fb_lower): atomics on owned elements made load/op/store, field
   * elements kept in locals across a serial loop */
  int atomics_local, promoted;
} fb_task;

typedef struct fb_task_list {
  fb_task *v;
  int n;
  size_t gtmp_bytes; /* scratch bytes a launch of the kernel needs */
} fb_task_list;

/* Lower k (which must pass fb_verify) into tasks. Returns 0 or FB_ENOMEM /
 * FB_EINVAL with a message in err. Every serial, range_for and struct_for
 * task then gets the task-local rewrites (optimizer/pass_promote.c), exact
 * like every pass: atomics on elements its iteration owns become
 * load/op/store, and a field element a serial loop reaches at one
 * loop-invariant index lives in a local across the loop. They are what a
 * compiler does inside one task, so they run in both engine modes;
 * fb_lower_ex with FB_LOWER_NO_LOCAL leaves them out. */
int fb_lower(const fb_kernel *k, fb_task_list *out, char *err, size_t errlen);
enum { FB_LOWER_NO_LOCAL = 1 };
int fb_lower_ex(const fb_kernel *k, unsigned flags, fb_task_list *out, char *err, size_t errlen);
void fb_task_list_free(fb_task_list *l);

/* ================================================================ fb_opt
 * The API the engine drives, one fb_opt context per session (no globals):
 *
 *   fb_opt_intern(kernel task IR)  ->  handle (once per lowered task)
 *   fb_opt_insert(handle, args, launch number)     (per task launch)
 *   fb_opt_flush()  ->  batch of optimized task launches in SFG order
 *   fb_opt_batch_free(batch)       (once they are compiled and launched)
 *
 * A context is used by one thread at a time (the engine's caller, which
 * flushes and frees batches; the session's ordered worker only reads them);
 * IR handed out in a batch is immutable and stays valid until the batch is
 * freed.
 *
 * Invariants
 *  - Results never depend on the optimizer: running the flushed batch gives
 *    the same fields, return values and rand() values as running the
 *    inserted launches one by one in insertion order.
 *  - IR in the bank never changes once interned; a hash match is confirmed
 *    with fb_kernel_equal. Every transformation makes a new bank entry.
 *  - The SFG is always consistent with the order of its window: rebuilding
 *    it from that order gives the same graph (fb_opt_check verifies this).
 */

typedef int32_t fb_irh; /* a handle into the session's IR bank */
#define FB_IRH_NONE ((fb_irh) - 1)

/* Passes (fb_opt_options.passes), in pipeline order. */
enum {
  FB_PASS_DEMOTE = 1,   /* activation demotion */
  FB_PASS_LISTGEN = 2,  /* list-generation removal */
  FB_PASS_DSE = 4,      /* dead-store elimination (and empty-task deletion) */
  FB_PASS_FUSE = 8,     /* task fusion */
  FB_PASS_SIMPLIFY = 16, /* intra-task simplification of fused tasks */
  FB_PASS_ALL = 31
};

typedef struct fb_opt_options {
  unsigned passes;       /* FB_PASS_* bits; FB_PASS_ALL by default */
  int max_fuse_per_task; /* fusions one task takes part in per fusion round (1) */
  int max_fused_tasks;   /* launches one fused task may stand for (256; 0: no
                            bound) */
  /* The fusion cost model: a fusion whose result would exceed one of these
   * is refused (fb_opt_counters.fuse_refused). A task that is already over
   * a bound is left as it is. */
  int max_fused_stmts;   /* statement budget of a fused task, estimated as the
                            sum of its parts' reachable statements: bounds its
                            compile time (4096; 0: no bound) */
  int max_task_params;   /* parameters one task launch can take on the backend
                            (0: no bound). The engine sets it from its device
                            (its max_task_params, fb_device_ops; none on the CPU,
                            whose tasks read arguments through a pointer) */
  int max_iterations;    /* cap of the pipeline's fixed-point loop (32) */
  size_t bank_bytes;     /* IR bank memory bound, evicting unused IR (64 MiB) */
  int check;             /* run fb_opt_check (sfg.h) and fb_verify after every pass
                            (default: on in FB_DEBUG builds); a reused flush
                            plan is then also checked against the pipeline */
  int plan_memo;         /* reuse the optimized batch of an identical window
                            met in an equivalent graph (1; 0: off). See
                            fb_opt_flush */
  int plan_memo_max;     /* plans kept (64) */
} fb_opt_options;

void fb_opt_options_default(fb_opt_options *o);

/* Counters; "flush" holds the last flush's, "total" the session's. */
typedef struct fb_opt_counters {
  uint64_t flushes;
  uint64_t tasks_in;        /* task launches inserted */
  uint64_t tasks_out;       /* task launches handed out */
  uint64_t listgen_removed; /* list generations removed (each with its clear_list) */
  uint64_t clears_removed;  /* clear_list tasks of a list no task has filled
                               yet (empty: the clear changes nothing) removed */
  uint64_t demoted;         /* activating accesses demoted */
  uint64_t dead_stores;     /* task writes of a state removed as dead */
  uint64_t tasks_deleted;   /* tasks left without effect and deleted */
  uint64_t tasks_fused;     /* fusions (each removes one task) */
  uint64_t fuse_same_shape; /* of them, struct_fors over two dense containers of one
                               index space (pass_fuse.c same_dense_space) */
  uint64_t fuse_refused;    /* tasks kept from a fusion that met every
                               criterion by the cost model (max_fused_stmts,
                               max_task_params, max_fused_tasks); once per
                               task per fusion round */
  uint64_t fuse_pairs;      /* pairs fusion tested (B not reached from A over
                               a path of length >= 2: the others are skipped) */
  uint64_t simplified;      /* statements removed by intra-task simplification */
  uint64_t iterations;      /* pipeline iterations */
  uint64_t memo_hits, memo_misses; /* transformations found in / added to the bank */
  uint64_t plans_reused;    /* flushes whose batch came from the plan memo */
  uint64_t plans_stored;    /* plans added to the plan memo */
  uint64_t masks_unchanged; /* (total only) observations that kept a mask's
                               content across flushes (fb_opt_observe_mask) */
  uint64_t retained_proofs; /* list-generation removals and demotions that took
                               a retained task (an earlier flush's) as run:
                               the batch is right only if that flush ran whole */
  uint64_t forgets;         /* (total only) fb_opt_forget calls */
  double optimizer_s;       /* time in insert (sampled) + flush (SFG and passes) */
} fb_opt_counters;

typedef struct fb_opt_stats {
  fb_opt_counters flush, total;
  size_t bank_entries, bank_bytes;
  uint64_t bank_evictions;
} fb_opt_stats;

typedef struct fb_opt fb_opt;

/* A context for one session's layout (which must outlive it). NULL when out
 * of memory or the layout is not finalized. opts may be NULL (defaults). */
fb_opt *fb_opt_new(const fb_layout *l, const fb_opt_options *opts);
void fb_opt_free(fb_opt *o); /* free its batches first */
void fb_opt_set_options(fb_opt *o, const fb_opt_options *opts);
const fb_opt_options *fb_opt_get_options(const fb_opt *o);
/* Message of the last failed call ("" when none). */
const char *fb_opt_errmsg(const fb_opt *o);

/* ---- the IR bank */

/* Put a copy of task IR k (a task as fb_lower makes them: serial statements,
 * or loop-invariant values and one top-level par_for/struct_for, or one
 * clear_list/listgen/gc statement) into the bank, or find the equal one
 * there. *out holds one reference: give it back with fb_opt_release. The
 * bank's copy is compacted, so statement ids may differ from k's: use
 * fb_opt_ir_info (sfg.h) for the loop id. FB_EVERIFY (message) for IR the verifier
 * refuses, FB_EINVAL for IR of another layout. */
int fb_opt_intern(fb_opt *o, const fb_kernel *k, fb_irh *out);
void fb_opt_retain(fb_opt *o, fb_irh h);
/* 1 when running the tasks h[0..n) (one kernel's, in launch order) a
 * second time, right after themselves and with the same argument values,
 * provably changes nothing and cannot fail: no task reads a state any of
 * them writes (so no atomic, no activation check of a container they
 * activate, no list they make, no scratch slot they pass between them),
 * none draws random numbers, returns a value, deactivates or has a while
 * loop, and every global access of each is provably in bounds (the second
 * run can raise no error the first did not). What such a run writes is a
 * function of its arguments and of states it leaves alone, so it writes the
 * same values again. 0 otherwise, or for a bad handle. The engine
 * coalesces a run of such launches into its first (engine/async.c). */
int fb_opt_rerun_free(fb_opt *o, const fb_irh *h, int n);
void fb_opt_release(fb_opt *o, fb_irh h);
/* Bytes the bank holds for h: its IR and the IR's metadata (0 for a bad
 * handle). */
size_t fb_opt_ir_bytes(const fb_opt *o, fb_irh h);

/* ---- the window */

typedef struct fb_opt_task {
  fb_irh ir;             /* banked task IR */
  const uint64_t *args;  /* one slot per parameter (codegen's fb_slot_pack) */
  int nargs;             /* must equal the IR's parameter count */
  uint64_t launch;       /* launch number: all tasks of one kernel launch share it */
} fb_opt_task;

/* Add a task launch to the SFG (it takes its own reference to t->ir). */
int fb_opt_insert(fb_opt *o, const fb_opt_task *t);
/* Number of task launches waiting for the next flush. */
int fb_opt_pending(const fb_opt *o);
/* The host wrote field `place` (or activated/deactivated below SNode
 * `snode`) between flushes: the states it touches get a new version, so
 * that no pass takes an old list or mask as current. FB_EINVAL while tasks
 * are pending (flush first). */
int fb_opt_host_write(fb_opt *o, int snode);

/* Lists that survive flushes. The engine observed, with nothing pending and
 * every flushed task run, that sparse container `snode`'s cells have
 * changed `count` times since the session began (activations and
 * deactivations that took effect: a count the runtime keeps). When the
 * count is the one of the previous observation and no task or host write
 * in between cleared cells of it, the mask is as it was then, whatever
 * activating writes ran: its current version gets the content id it had,
 * so list-generation removal (and demotion) take the lists made from it as
 * current. FB_EINVAL while tasks are pending. */
int fb_opt_observe_mask(fb_opt *o, int snode, uint64_t count);

/* An earlier flush did not run whole (an error stopped a launch, a cancel,
 * a batch that was dropped): nothing it left may be taken as current.
 * Drops every retained task (the graph keeps only the pending window, whose
 * reads of earlier state become unknown versions), every mask observation
 * and the plan memo. Callable with tasks pending, but not once the window
 * went through the passes (fb_opt_optimize): FB_EINVAL then. */
int fb_opt_forget(fb_opt *o);

/* Run the pass pipeline on the window now, without handing it out (for
 * `fusebox graph` and tests: the graph then shows the optimized window;
 * fb_opt_flush afterwards finds nothing more to do). Counts into the next
 * flush's counters. */
int fb_opt_optimize(fb_opt *o);

/* One inserted task launch that a handed-out task stands for: a fused task
 * runs its parts in order. What the engine needs to name the part an error
 * comes from, as sync mode would. */
typedef struct fb_opt_part {
  uint64_t launch;   /* its launch number */
  /* its index in its launch: how many task launches were inserted with
   * that launch number before it, one after the other; the engine inserts
   * a kernel's tasks in order, so this is the task's index in the kernel's
   * task list, which names it ("k2.t0") where task cannot: */
  int index;
  /* the banked IR's name, the first interned task equal to it: another
   * kernel's when two kernels lower to equal tasks ("k1.t0" for k2's) */
  const char *task;
  int argoff, nargs; /* its arguments within the task's */
  int inb;           /* every access provably in bounds: it cannot report FB_EBOUNDS */
  /* its task IR as inserted, before any pass changed it: what the engine
   * runs instead when the fused task cannot be compiled or launched */
  fb_irh ir;
  const fb_kernel *k;  /* NULL when its shape is unknown (out of memory) */
  fb_task_kind kind;
  int loop;          /* as fb_opt_launch.loop, of k */
  int snode;
  /* it may take blocks from the session's pool (activates a pointer or
   * dynamic cell; 1 when its shape is unknown): it can run out of memory */
  int alloc;
} fb_opt_part;

/* One optimized task launch. Everything stays valid until the batch is freed. */
typedef struct fb_opt_launch {
  fb_irh ir;
  const fb_kernel *k;  /* the task IR to compile */
  fb_task_kind kind;
  int loop;            /* statement id of the parallel loop in k (a listgen's
                          statement), -1 if serial */
  int snode;           /* struct_for / list tasks: the SNode, else -1 */
  const uint64_t *args;
  int nargs;
  uint64_t launch;     /* launch number to run it with (rand(), see rand_seq) */
  int ntasks;          /* inserted task launches it stands for (fusion) */
  const fb_opt_part *parts; /* those launches, in the order it runs them */
  int nparts;          /* = ntasks */
  /* an IR that may run in its place with the same results, or FB_IRH_NONE:
   * the task as inserted, when the passes only demoted its activations
   * (proved no-ops) and simplified it; e.g. while ir's own code compiles */
  fb_irh standin;
  /* 1: only simplified (no demotion): ir is equal to standin without any
   * proof, so ir's code may stand in wherever standin may */
  uint8_t standin_same;
} fb_opt_launch;

typedef struct fb_opt_batch {
  fb_opt_launch *v;
  int n;
} fb_opt_batch;

/* Optimize the window (the passes the options enable, to a fixed point)
 * and hand the result out in topological order. The graph then keeps only
 * the latest owner of each state (partial garbage collection): those tasks
 * have run; they are never handed out again but let the next window's
 * passes see which lists and masks are still current. *out is NULL when
 * nothing was pending.
 *   The plan memo: inserts are logged and only built into the graph when
 * needed. A flush whose window equals (task IR handles, argument values,
 * launch numbers relative to its first) one met before, in a graph whose
 * canonical form (the retained nodes and states with their serials and
 * order stamps replaced by ranks: everything the passes read) equals the
 * one it was optimized in, and which left the graph in that same canonical
 * form, hands out a copy of that flush's batch (launch numbers rebased)
 * without building the window or running the passes; the graph is kept as
 * it is, being already what the flush would leave. Checked by equality,
 * never by hash alone; options changes clear the memo. In check mode the
 * pipeline still runs and must give the same batch. */
int fb_opt_flush(fb_opt *o, fb_opt_batch **out);
void fb_opt_batch_free(fb_opt *o, fb_opt_batch *b);

/* ---- observability */

const fb_opt_stats *fb_opt_get_stats(fb_opt *o);
/* The current SFG as Graphviz DOT (malloc'd; NULL when out of memory). */
char *fb_opt_dot(const fb_opt *o, const char *title);
/* Called before and after each pass of every flush while set: `when` is
 * "before" or "after", `dot` the graph. Pass a NULL fn to stop. */
typedef void (*fb_opt_trace_fn)(void *user, int iteration, const char *pass, const char *when,
                                const char *dot);
void fb_opt_set_trace(fb_opt *o, fb_opt_trace_fn fn, void *user);

#endif
