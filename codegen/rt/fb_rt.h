/* The device runtime of sparse SNodes: the state a session keeps in device
 * memory (block pool, one node allocator and one list per SNode) and the
 * descriptors that code generation bakes into task modules as constants.
 *
 * Target-neutral, freestanding C: this header and fb_rt.c compile with gcc
 * for the host (runtime/, server/) and with clang-19 to LLVM bitcode for
 * x86_64 and nvptx64, which codegen/ links into every task module that
 * calls an fb_rt_* function (see docs/sparse.md). Only <stdint.h>; no libc.
 *
 * Invariants
 *  - Every field of every struct here is 8 bytes (int64_t, uint64_t or a
 *    pointer), so the layout is the same on every target and codegen can
 *    emit a descriptor as a plain array of i64.
 *  - Blocks come from one pool per session. A block is an 8-byte header
 *    (the link of the free or pending list it sits on) followed by the
 *    block's bytes, 8-aligned. Blocks are named by handles: (offset of the
 *    data from the pool base) / 8, never 0. Free blocks are all zero.
 *  - Free lists are popped concurrently during a task and pushed to by gc
 *    (a serial task) and by the loser of an activation race; heads carry a
 *    tag in their top bits, so pops and pushes are ABA-safe.
 *  - Deactivated blocks go onto the SNode's pending list and are zeroed and
 *    returned to its free list by the SNode's gc task only, so a task never
 *    sees a block reused under it. */
#ifndef FB_RT_H
#define FB_RT_H

#include <stdint.h>

#define FB_RT_MAX_LEVELS 8 /* dense levels between two sparse ones */
#define FB_RT_MAX_GROUPS 8 /* allocating SNodes nested in one cell */

/* Error latch values (equal to FB_EBOUNDS / FB_EQUOTA of fusebox/common.h). */
#define FB_RT_EBOUNDS (-9)
#define FB_RT_EQUOTA (-8)

/* A task's error words (fb_rt_dctx.error, two int32_t, zero before the
 * task): error[0] the first error latched (compare-and-swap from 0);
 * error[1] the blame word: which part of a fused task (fb_stmt.part, parts
 * in stream order) failed first in stream order, and how. An access out of
 * bounds (or a full dynamic list) keeps FB_RT_BLAME(part), a block that did
 * not fit in the pool (FB_RT_EQUOTA) FB_RT_BLAME_OOM(part), by atomic max:
 * 0 means none, and the largest word is the smallest part, out of memory
 * before out of bounds within one part (sync mode reports a launch's out of
 * memory first). Written only on the failure path. Parts up to
 * FB_RT_MAX_PART (no fused task has that many). */
#define FB_RT_MAX_PART 0x3ffffffe
#define FB_RT_BLAME_OOM(part) ((int32_t)(0x7fffffff - 2 * (part)))
#define FB_RT_BLAME(part) ((int32_t)(0x7fffffff - 2 * (part) - 1))
#define FB_RT_BLAMED_PART(word) ((word) > 0 ? (0x7fffffff - (word)) / 2 : -1)
#define FB_RT_BLAMED_OOM(word) ((word) > 0 && ((0x7fffffff - (word)) & 1) == 0)

/* SNode kinds (equal to fb_snode_kind). */
#define FB_RT_DENSE 1
#define FB_RT_BITMASKED 2
#define FB_RT_POINTER 3
#define FB_RT_DYNAMIC 4

/* One element of a list: the cell's global index in its SNode's cell space
 * (by axis i j k l; 0 for axes the SNode does not have) and its storage. */
typedef struct fb_rt_elem {
  int32_t c[4];
  uint8_t *ptr;
} fb_rt_elem;

/* One cache line per list: every thread of a listgen adds to count, and a
 * listgen reads its parent's list (the next one in the array, often) at
 * each iteration; with two lists to a line those reads missed the cache
 * whenever another thread had just added. */
typedef struct fb_rt_list {
  uint64_t count;    /* elements in the list (atomic during listgen) */
  uint64_t cap;      /* room in elems (set by the host) */
  fb_rt_elem *elems;
  uint64_t gen;      /* unused by the device; the host's bookkeeping */
  uint64_t pad[4];
} fb_rt_list;

typedef struct fb_rt_allocator {
  uint64_t block_bytes; /* data bytes of one block (0: SNode allocates nothing) */
  uint64_t stride;      /* pool bytes per block: 8 unused, header, data (16-aligned); x16 */
  uint64_t free_head;   /* tagged handle of the first free block */
  uint64_t pending;     /* tagged handle of the first deactivated block */
  uint64_t live;        /* blocks handed out and not yet returned */
  uint64_t changes;     /* pointer cells activated or deactivated so far (a
                           slot set or cleared): the engine's evidence that
                           a mask did not change (fb_opt_observe_mask) */
  uint64_t pad[2];
} fb_rt_allocator;

typedef struct fb_rt_state {
  uint8_t *pool;       /* base of the session's block pool */
  uint64_t pool_used;  /* bytes handed out, headers included (atomic) */
  uint64_t pool_cap;   /* bytes the pool may hand out: set before each launch */
  /* The first block that did not fit: 0 none, else FB_RT_OOM_WORD(part,
   * snode) of the first task that ran out (oom_owner: its error words'
   * address), and within that task of its earliest part (the first SNode
   * that part ran out on); the host reads it (fb_sparse_take_oom) */
  uint64_t oom;
  uint64_t oom_owner;
  fb_rt_allocator *allocs; /* per SNode id */
  fb_rt_list *lists;   /* per SNode id */
  uint64_t nnodes;
  uint64_t zero_fresh; /* 1: pool memory is not zero (GPU pools): blocks
                        * taken from it are zeroed before they are used */
} fb_rt_state;

#define FB_RT_OOM_WORD(part, snode)                                                                \
  (((uint64_t)(uint32_t)FB_RT_BLAME_OOM(part) << 32) | (uint64_t)(uint32_t)(snode))

/* Mirror of fb_rt_ctx (codegen/codegen.h), which the runtime cannot include
 * on the device; the host checks that the two agree. */
typedef struct fb_rt_dctx {
  uint8_t *root;
  const uint64_t *args;
  uint64_t *rets;
  uint8_t *gtmp;
  int32_t *error; /* two words: the error and the blame word */
  uint64_t seed;
  uint64_t launch;
  fb_rt_state *runtime;
  uint8_t *priv;
} fb_rt_dctx;

/* ---------------------------------------------------------------- descriptors */

/* List generation of sparse container P: for each element of the list of
 * P's nearest sparse ancestor (or the root), each of the ninst instances of
 * P inside that cell (reached through nlev dense levels) and each piece of
 * chunk_cells cells of the instance, append the active cells. Sizes are by
 * axis, 1 where a level does not split the axis. */
typedef struct fb_rt_lg {
  int64_t snode, kind, parent; /* parent: nearest sparse ancestor, 0 = root */
  int64_t nlev, ninst, nchunks, chunk_cells;
  int64_t p_off, p_ncells, p_cb, p_mask_bytes, p_chunk;
  int64_t p_size[4];
  int64_t lev_off[FB_RT_MAX_LEVELS];
  int64_t lev_cb[FB_RT_MAX_LEVELS];
  int64_t lev_ncells[FB_RT_MAX_LEVELS];
  int64_t lev_size[FB_RT_MAX_LEVELS][4];
} fb_rt_lg;

/* The slots of one allocating SNode (pointer or dynamic) nested in a cell,
 * reached through nlev dense or bitmasked levels: for every combination of
 * level cells, the node sits at off + sum(pre[l] + idx[l] * stride[l]) and
 * holds nslots 8-byte slots from slot_off on (pointer: child blocks,
 * dynamic: chunks). */
typedef struct fb_rt_group {
  int64_t snode, kind, nlev, off, nslots, slot_off;
  int64_t pre[FB_RT_MAX_LEVELS];
  int64_t count[FB_RT_MAX_LEVELS];
  int64_t stride[FB_RT_MAX_LEVELS];
} fb_rt_group;

/* The storage of a cell of SNode snode (bitmasked: one cell; pointer and
 * dynamic: one block) and the allocating SNodes nested in it. */
typedef struct fb_rt_cell {
  int64_t snode, kind, bytes, ngroups;
  fb_rt_group g[FB_RT_MAX_GROUPS];
} fb_rt_cell;

/* ---------------------------------------------------------------- functions
 * ctx is the task's context; snode ids index the state's tables. */

/* A zero-filled block of snode's allocator, or NULL when the pool is full
 * (then FB_RT_EQUOTA is latched, blaming fused part `part`, and the block
 * recorded in the state's oom word). */
uint8_t *fb_rt_alloc(fb_rt_dctx *ctx, int32_t snode, int32_t part);
/* The child block in pointer slot `slot`, allocating it (compare-and-swap)
 * when the slot is empty. NULL when out of memory (blaming `part`). */
uint8_t *fb_rt_ptr_activate(fb_rt_dctx *ctx, int32_t snode, uint64_t *slot, int32_t part);
/* Put a block that was unlinked from its slot on snode's pending list. */
void fb_rt_release(fb_rt_dctx *ctx, int32_t snode, uint8_t *block);
/* Dynamic node at `node` (length, then nchunk slots): cell n, allocating
 * chunks 0 .. n / chunk and raising the length to n + 1. NULL when out of
 * memory (blaming `part`). */
uint8_t *fb_rt_dyn_activate(fb_rt_dctx *ctx, int32_t snode, uint8_t *node, int64_t n, int64_t chunk,
                            int64_t cell_bytes, int32_t part);
/* Append to the dynamic node: takes slot n = length++ and returns its cell
 * with *n_out = n; NULL with *n_out = -1 when the list is full (FB_RT_EBOUNDS
 * latched, blaming fused part `part`) or out of memory (blaming it too). */
uint8_t *fb_rt_dyn_append(fb_rt_dctx *ctx, int32_t snode, uint8_t *node, int64_t max, int64_t chunk,
                          int64_t cell_bytes, int64_t *n_out, int32_t part);
/* Deactivate a dynamic node: length 0, chunks onto the pending list. */
void fb_rt_dyn_clear(fb_rt_dctx *ctx, int32_t snode, uint8_t *node, int64_t nchunks);
/* Deactivate the cell at `cell` described by d: nested blocks onto their
 * pending lists, the cell's bytes zeroed. */
void fb_rt_cell_clear(fb_rt_dctx *ctx, const fb_rt_cell *d, uint8_t *cell);
/* gc of d->snode: every pending block has its nested blocks put on their
 * pending lists, is zeroed and returned to the free list. Serial. */
void fb_rt_gc(fb_rt_dctx *ctx, const fb_rt_cell *d);

/* Lists. */
void fb_rt_clear_list(fb_rt_dctx *ctx, int32_t snode);
uint64_t fb_rt_list_count(fb_rt_dctx *ctx, int32_t snode);
fb_rt_elem *fb_rt_list_elems(fb_rt_dctx *ctx, int32_t snode);
/* Iterations of the listgen of d (parent elements x instances x pieces),
 * and one iteration. */
int64_t fb_rt_listgen_count(fb_rt_dctx *ctx, const fb_rt_lg *d);
void fb_rt_listgen_step(fb_rt_dctx *ctx, const fb_rt_lg *d, int64_t it);

#endif
