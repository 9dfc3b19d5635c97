/* codegen/: task IR -> LLVM IR -> CPU machine code (ORC LLJIT, -O3) or PTX
 * (NVPTX), plus the code cache. Internal header of the folder; runtime/ and
 * server/ use it. Depends on ir/ and the LLVM C API only.
 *
 * A task is a kernel (fb_kernel) whose body is either serial statements, or
 * statements that compute loop-invariant values followed by exactly one
 * top-level parallel loop (par_for or struct_for), whose statement id is
 * given as `loop`.
 *
 * The ABI of compiled tasks (identical on every target, all fields 8 bytes):
 *
 *   void body(fb_rt_ctx *ctx, int64_t lo, int64_t hi);
 *     serial task: runs the whole body (lo, hi ignored);
 *     parallel task: runs iterations lo <= it < hi of the loop, where
 *       par_for:    iteration it has loop index begin + it;
 *       struct_for: it is the linear (row-major, axis order) cell index in
 *                   the SNode's cell space (dense path).
 *   void bounds(fb_rt_ctx *ctx, int64_t *n);
 *     parallel tasks only: writes the iteration count (end - begin, or 0).
 *
 * Sparse SNodes (docs/sparse.md): a struct_for over an SNode below sparse
 * containers iterates the list of the deepest of them (Pk) times the cells
 * of the dense levels between Pk and the SNode (M of them): iteration it is
 * cell it % M of list element it / M, so bounds writes count(Pk) * M. The
 * lists are made by list tasks: `loop` may name a listgen statement, whose
 * iterations are (parent list element, instance, piece of cells); clear_list
 * and gc are serial tasks. Tasks that touch sparse SNodes call the runtime
 * of codegen/rt/fb_rt.c through ctx->runtime; its bitcode is linked into
 * their modules.
 *
 * Bounds checks: a global access whose index is outside the field's shape is
 * skipped (loads give 0) and FB_EBOUNDS is stored to *ctx->error. */
#ifndef FB_CODEGEN_H
#define FB_CODEGEN_H

#include <stddef.h>
#include <stdint.h>

#include "codegen/rt/fb_rt.h"
#include "fusebox/codestore.h"
#include "fusebox/ir.h"

typedef struct fb_rt_ctx {
  uint8_t *root;         /* field storage of the session's layout */
  const uint64_t *args;  /* one 8-byte slot per kernel parameter */
  uint64_t *rets;        /* return slots */
  uint8_t *gtmp;         /* scratch shared by the tasks of a launch */
  int32_t *error;        /* first error of the launch (0 = none) */
  uint64_t seed;         /* rand() seed of the session */
  uint64_t launch;       /* launch number for rand() */
  void *runtime;         /* fb_rt_state * (codegen/rt/fb_rt.h): block pool,
                          * allocators and lists of sparse SNodes; may be
                          * NULL for layouts without sparse SNodes */
  uint8_t *priv;         /* privatized scatter (fb_cg_priv): the base that
                          * stands for root in this thread's private copy
                          * (priv + off is the copy of root + off); NULL:
                          * root itself (the body then runs on one thread) */
} fb_rt_ctx;

/* Privatized scatter (codegen/priv.c, CPU only). A parallel task whose only
 * accesses to some all-dense top-level trees of the layout, all f32 or all
 * i32/u32, are atomic adds with unused results adds into a private copy
 * instead, with plain loads and stores: each thread that runs chunks of the
 * loop gets its own copy of root bytes [lo, hi) (ctx->priv), every word
 * 0x80000000 (-0.0, the identity of f32 +; an integer word holds
 * 0x80000000 + the thread's sum), one thread may use root itself, and
 * after the loop the launcher adds every copy's words of ranges[0..n) into
 * root. Only the order of the sums changes, as with atomics (integer sums
 * are exact in any order). The code is unsafe to run on
 * several threads with one ctx->priv: launchers that do not privatize must
 * run such a body on one thread (runtime/launch.c does it right). */
#define FB_CG_PRIV_MAX 4
#define FB_CG_PRIV_MAX_BYTES ((int64_t)16 << 20) /* bound on hi - lo */
typedef struct fb_cg_priv {
  int64_t n;                     /* privatized trees, 0: none */
  int64_t lo, hi;                /* root bytes each private copy mirrors */
  int64_t off[FB_CG_PRIV_MAX];   /* root offset of each tree (4-byte words) */
  int64_t bytes[FB_CG_PRIV_MAX]; /* its bytes */
  int64_t i32[FB_CG_PRIV_MAX];   /* 1: its words are i32/u32 (summed
                                  * modulo 2^32), 0: f32 */
  int64_t sites;                 /* atomic statements that go private */
} fb_cg_priv;

/* How args and rets are packed into 8-byte slots: integers sign- or zero-
 * extended to 64 bits, bool as 0/1, f64 as its bits, f32 as its bits in the
 * low 32 bits (upper bits zero). */
uint64_t fb_slot_pack(fb_value v);
fb_value fb_slot_unpack(fb_type t, uint64_t slot);

typedef void (*fb_task_body_fn)(fb_rt_ctx *ctx, int64_t lo, int64_t hi);
typedef void (*fb_task_bounds_fn)(fb_rt_ctx *ctx, int64_t *n);

typedef struct fb_code_pins fb_code_pins;

typedef struct fb_cg_task {
  const fb_kernel *ir;
  int loop; /* statement id of the top-level parallel loop (par_for,
             * struct_for or listgen), -1 if serial */
  /* code cache (below): code is shared only within one partition (0 by
   * default; fuseboxd gives each tenant its own), and pins (NULL: the code
   * is pinned for good) keeps the code from eviction for its owner */
  uint64_t partition;
  fb_code_pins *pins;
} fb_cg_task;

/* The plan for task t on the CPU; out->n = 0 when nothing is privatized.
 * place (may be NULL; nnodes entries) gets 1 for each privatized place.
 * Returns 0, or FB_ENOMEM (out->n = 0, place untouched). */
int fb_cg_priv_plan(const fb_cg_task *t, fb_cg_priv *out, unsigned char *place);

/* ---------------------------------------------------------------- code cache
 * Compiled code of every back end, keyed by the task's IR (structural hash
 * of the kernel and its layout, confirmed by structural equality on a
 * clone the cache owns) and its partition: code is never shared between
 * partitions. Optionally bounded in bytes: past the limit the least
 * recently used entries that no owner pins are dropped. An owner (an
 * engine session) pins what it gets or puts through its fb_code_pins, and
 * fb_code_pins_release unpins it all when the owner ends; what is got or
 * put without pins stays pinned for good. Thread-safe. */

typedef struct fb_code_cache fb_code_cache;
typedef struct fb_code_key {
  uint64_t key;
  int loop_pos;
  uint64_t partition;
} fb_code_key;
typedef struct fb_code_val { /* what a back end keeps per task */
  void *a, *b;
  int64_t n;
  int i;
  void *c;
} fb_code_val;
typedef struct fb_code_cache_info {
  uint64_t bytes;         /* what the entries count: code and the cache's own copies */
  uint64_t pinned_bytes;  /* of which pinned (not evictable now) */
  uint64_t limit;         /* 0: none */
  uint64_t entries, evictions;
} fb_code_cache_info;

fb_code_cache *fb_code_cache_new(void); /* NULL: out of memory; no limit */
/* drop (may be NULL) is called on every value. */
void fb_code_cache_free(fb_code_cache *c, void (*drop)(void *user, fb_code_val *v), void *user);
/* Bound the cache to max_bytes (0: none); evicted values go to drop. */
void fb_code_cache_set_limit(fb_code_cache *c, uint64_t max_bytes,
                             void (*drop)(void *user, fb_code_val *v), void *user);
void fb_code_cache_stats(fb_code_cache *c, fb_code_cache_info *out); /* zeros for NULL */
fb_code_key fb_code_cache_key(const fb_cg_task *t);
/* 1 and *out when ir is cached, else 0; a hit is pinned for pins and
 * becomes the most recently used. */
int fb_code_cache_get(fb_code_cache *c, const fb_code_key *k, const fb_kernel *ir,
                      fb_code_pins *pins, fb_code_val *out);
/* Insert val for ir (code_bytes: what the back end's code takes), pinned
 * for pins; then evict past the limit. *kept: the value now cached for ir:
 * val, or (return 1) what another thread put there first, in which case
 * the caller drops val. When the cache cannot allocate, val is returned
 * uncached (0). */
int fb_code_cache_put(fb_code_cache *c, const fb_code_key *k, const fb_kernel *ir,
                      const fb_code_val *val, uint64_t code_bytes, fb_code_pins *pins,
                      fb_code_val *kept);
fb_code_pins *fb_code_pins_new(void); /* NULL: out of memory */
/* Unpin everything p holds (evicting past the limit) and free p. */
void fb_code_pins_release(fb_code_pins *p);

/* ---------------------------------------------------------------- CPU */

typedef struct fb_cpu_jit fb_cpu_jit;

typedef struct fb_cpu_code {
  fb_task_body_fn body;
  fb_task_bounds_fn bounds; /* NULL for serial tasks */
  int stmts_emitted;        /* IR statements lowered to LLVM IR */
  int cache_hit;            /* 1 when found in the code cache */
  double compile_s;         /* 0 on a cache hit */
  void *gpu;                /* CUDA back end: its compiled task (runtime/cuda.c);
                             * body and bounds are then NULL */
  fb_cg_priv priv;          /* CPU: privatized scatter (n = 0: none) */
} fb_cpu_code;

/* One JIT per engine; fb_cpu_jit_compile is safe to call from several
 * threads at once (each compile uses its own LLVM context). Compiled code
 * lives as long as the JIT. Code is cached by (task IR hash, layout hash),
 * confirmed by structural equality. */
fb_cpu_jit *fb_cpu_jit_new(char *err, size_t errlen);
void fb_cpu_jit_free(fb_cpu_jit *j);
/* Bound the JIT's code cache (0: none); evicted code is removed from the
 * JIT. And what the cache holds now. */
void fb_cpu_jit_set_cache_limit(fb_cpu_jit *j, uint64_t max_bytes);
void fb_cpu_jit_cache_info(fb_cpu_jit *j, fb_code_cache_info *out); /* zeros for NULL */
/* A cache outside the process (fusebox/codestore.h; NULL or no get:
 * none), asked on each miss of the code cache above before compiling and
 * handed each object compiled. Its tasks' functions are named by a hash of
 * the task's text and target and the partition (fbd_HASH_PARTITION), so an
 * object links in any process. A found object counts as a cache hit
 * (compile_s 0). Call before compiling. 0 or FB_ENOMEM. */
int fb_cpu_jit_set_store(fb_cpu_jit *j, const fb_code_store *s);
/* The task as a code store sees it (malloc'd, *len its bytes; NULL when out
 * of memory): its layout's and compacted kernel's canonical text under a
 * fixed name, and its loop's position. */
char *fb_cg_task_text(const fb_cg_task *t, size_t *len);
int fb_cpu_jit_compile(fb_cpu_jit *j, const fb_cg_task *t, fb_cpu_code *out, char *err,
                       size_t errlen);

/* ---------------------------------------------------------------- sparse
 * Descriptors of the device runtime from a layout (sparse_desc.c). */

int fb_cg_is_sparse(fb_snode_kind k); /* bitmasked, pointer or dynamic */
/* Nearest sparse container strictly above node, 0 (the root) if none. */
int fb_cg_sparse_parent(const fb_layout *l, int node);
/* Nearest sparse container at or above node, 0 if none. */
int fb_cg_sparse_leaf(const fb_layout *l, int node);
/* Bytes of one block of snode's allocator: pointer: a cell; dynamic: a
 * chunk of cells; 0 for the kinds that allocate nothing. */
uint64_t fb_cg_block_bytes(const fb_layout *l, int snode);
/* Bytes of a bitmasked node's mask words (0 for other kinds). */
uint64_t fb_cg_mask_bytes(const fb_snode *n);
/* List generation of sparse container p; the storage of a cell (or block)
 * of sparse container s with the allocating SNodes nested in it. 0 or
 * FB_EUNSUPPORTED (layout deeper than the runtime's limits) with a message. */
int fb_cg_listgen_desc(const fb_layout *l, int p, fb_rt_lg *d, char *err, size_t errlen);
int fb_cg_cell_desc(const fb_layout *l, int s, fb_rt_cell *d, char *err, size_t errlen);

/* ---------------------------------------------------------------- NVPTX */

/* PTX text for the task, for the given SM (e.g. "sm_80"). Entry points:
 *   FB_GPU_ENTRY (.entry fb_body): the launch kernel, a grid-stride loop
 *     over [lo, hi) clamped to the task's iteration count (which every
 *     thread computes, so the host passes lo = 0, hi = INT64_MAX without
 *     knowing it); a serial task runs in thread 0. Parameters, 64 bits each:
 *     root, rets, gtmp, error, seed, launch, runtime (the fb_rt_ctx fields
 *     but args), lo, hi, then one slot per kernel parameter (fb_slot_pack).
 *   fb_bounds (parallel tasks): takes a pointer to fb_rt_ctx and the count's
 *     address, like the CPU's bounds function.
 * *ptx is malloc'd. */
#define FB_GPU_ENTRY "fb_body"
#define FB_GPU_FIXED_PARAMS 9

/* Iterations of the task's parallel loop when they are known without
 * running it (a dense struct_for, a par_for over constants), else -1 (and
 * for serial tasks): what a GPU launch sizes its grid by. */
int64_t fb_cg_static_count(const fb_cg_task *t);
int fb_ptx_emit(const fb_cg_task *t, const char *sm, char **ptx, char *err, size_t errlen);
/* The same, also giving the IR statements lowered (may be NULL). */
int fb_ptx_compile(const fb_cg_task *t, const char *sm, char **ptx, int *stmts, char *err,
                   size_t errlen);

/* CUDA's libdevice (the math functions of NVPTX code), read into memory
 * once per process from $FB_LIBDEVICE, else $CUDA_HOME/nvvm/libdevice/
 * libdevice.10.bc, else /usr/local/cuda's: fb_ptx_libdevice_load reads it
 * (a process-isolated worker calls it while its engine is made, before its
 * file system goes; later calls do nothing), fb_ptx_has_libdevice says
 * whether it is in memory, fb_ptx_libdevice_where the path read, or the
 * paths looked at when there is none. */
void fb_ptx_libdevice_load(void);
/* What PTX for sm depends on besides the task, for a code store
 * (fusebox/codestore.h): LLVM's version (which sets the PTX ISA), the SM,
 * libdevice (a hash of its bytes, or none) and the runtime's nvptx64
 * bitcode's hash. malloc'd; NULL when out of memory. */
char *fb_ptx_target_text(const char *sm);
int fb_ptx_has_libdevice(void);
const char *fb_ptx_libdevice_where(void);

/* LLVM IR text of the task module for a target: "x86_64" or "nvptx64"
 * before optimization, "x86_64-O3" after linking the sparse runtime and
 * the O3 pipeline, the module the CPU JIT turns into code (its function
 * names are fb_body and fb_bounds). For tests that check what LLVM makes
 * of a loop (vector loads, atomics) and for debugging. */
int fb_llvm_ir_text(const fb_cg_task *t, const char *target, char **text, char *err, size_t errlen);

#endif
