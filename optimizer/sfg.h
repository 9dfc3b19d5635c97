/* optimizer/sfg.h: the inside of the asynchronous engine's inter-kernel
 * optimizer — task metadata, the IR bank, the state-flow graph (SFG) and its
 * passes (docs/optimizer.md; the AsyncTaichi paper, sections 3-6 and
 * supplement). Private to optimizer/ (and its tests and benches): the API
 * these implement, and all that the engine sees, is the fb_opt part of
 * optimizer/optimizer.h, with its invariants. This header is shared by the
 * files of optimizer/ that implement it: bank.c, meta.c, sfg.c, opt.c,
 * ir_edit.c and one pass_*.c per pass. */
#ifndef FB_SFG_H
#define FB_SFG_H

#include <stddef.h>
#include <stdint.h>

#include "base/map.h"
#include "fusebox/ir.h"
#include "optimizer/optimizer.h"

/* ================================================================ tests and tools */

/* The banked IR of a handle (NULL for a bad handle). */
const fb_kernel *fb_opt_ir(const fb_opt *o, fb_irh h);
/* Shape of a banked task: kind, statement id of its parallel loop (-1 if
 * serial; a listgen's own statement, as fb_lower gives it) and the SNode of
 * struct_for / list tasks (-1 otherwise). */
int fb_opt_ir_info(fb_opt *o, fb_irh h, fb_task_kind *kind, int *loop, int *snode);
/* The current SFG as the text the golden tests compare (malloc'd; NULL when
 * out of memory); fb_opt_dot gives it as Graphviz DOT. */
char *fb_opt_graph_text(const fb_opt *o);
/* Check every SFG invariant (topological order, edges, owners, readers,
 * versions, rebuild invariance). 0, or FB_EINTERNAL with a message. */
int fb_opt_check(fb_opt *o, char *err, size_t errlen);

/* ================================================================ folder-internal */

/* ---- state keys: (kind, index) packed in 32 bits */
enum {
  FB_SK_VALUE = 0, /* values of a place */
  FB_SK_MASK,      /* activity of a sparse container's cells */
  FB_SK_LIST,      /* the runtime's list of a sparse container's active cells */
  FB_SK_ALLOC,     /* node allocator of a pointer / dynamic container */
  FB_SK_RET,       /* kernel return slot */
  FB_SK_GTMP,      /* an 8-byte slot of the session scratch buffer */
  FB_SK__COUNT
};
#define FB_SKEY(kind, idx) (((uint32_t)(kind) << 24) | ((uint32_t)(idx) & 0xffffffu))
#define FB_SKEY_KIND(k) ((int)((k) >> 24))
#define FB_SKEY_INDEX(k) ((int)((k) & 0xffffffu))
#define FB_SKEY_NONE 0xffffffffu

/* How a task touches a state (fb_meta_acc.mode). */
enum {
  FB_ACC_READ = 1,
  FB_ACC_WRITE = 2
};

/* Element-wise class of every access to a state in a parallel task: the
 * same address in both tasks at each iteration, unique per iteration. */
enum {
  FB_EW_NONE = 0,
  FB_EW_LOOP,
  FB_EW_UNIQUE
};

/* fb_meta_acc.flags */
enum {
  FB_AF_IMPLICIT = 1 << 0,   /* mask/alloc: only activation on write, activity
                                checks of loads, the struct_for snapshot */
  FB_AF_CLEAR = 1 << 1,      /* deactivation: cells (and values below) cleared */
  FB_AF_COVER = 1 << 2,      /* an unconditional store at the loop indices
                                (serial: at the top level) */
  FB_AF_FULL = 1 << 3,       /* ... that writes the whole state */
  FB_AF_FULL_IFRANGE = 1 << 4, /* ... the whole state if the par_for range is [0, ext) */
  FB_AF_WLOOP = 1 << 5,      /* every write is a store/atomic at the loop indices */
  FB_AF_REMOVABLE = 1 << 6,  /* every write is a store/atomic/gtmp_store with no
                                effect beyond the state (no activation) */
  FB_AF_INB = 1 << 7,        /* every access provably within the field */
  FB_AF_INB_IFRANGE = 1 << 8, /* ... if the par_for range lies in [0, ext) */
  FB_AF_ACTIVATES = 1 << 9,  /* mask/alloc written by activation */
  FB_AF_NOREADBACK = 1 << 10 /* no result of the task depends on its own
                                write of the state (removing the write
                                changes nothing within the task) */
};

typedef struct fb_meta_acc {
  uint32_t key;
  uint8_t mode;   /* FB_ACC_* as written in the IR (a partial write is made an
                     input by the SFG, see fb_sfg_node.eff) */
  uint8_t ew;     /* FB_EW_* */
  uint32_t flags; /* FB_AF_* */
  uint64_t sig;   /* FB_EW_UNIQUE: structural hash of the index expression */
  uint8_t wew;    /* FB_EW_* of the writes alone (NONE without a write): a
                     task may read a state it writes at other cells (a
                     stencil) and still write it element-wise */
  uint64_t wsig;  /* sig of the writes alone */
  int64_t ext;    /* FB_AF_*_IFRANGE: the 1-D field's extent */
} fb_meta_acc;

/* fb_task_meta.tflags */
enum {
  FB_TF_RAND = 1 << 0,     /* calls rand() (or carries rand_seq) */
  FB_TF_WHILE = 1 << 1,    /* has a while loop (may not terminate: never deleted) */
  FB_TF_DEACT = 1 << 2,    /* deactivates */
  FB_TF_FUSIBLE = 1 << 3,  /* shape fusion accepts: serial, or pure/gtmp_load
                              statements and one parallel loop */
  FB_TF_INB = 1 << 4,      /* every global access provably in bounds */
  FB_TF_INB_IFRANGE = 1 << 5, /* ... if the range lies in [0, inb_ext) */
  FB_TF_RET = 1 << 6,      /* has ret */
  FB_TF_JUMP = 1 << 7      /* break / continue somewhere */
};

/* Activation classes (fb_task_meta.act_kind). */
enum {
  FB_ACT_OTHER = 0, /* cannot be demoted */
  FB_ACT_PURE,      /* the cell is a pure function of loop indices, consts and
                       args, under pure guards: demotable after an identical task */
  FB_ACT_SELF       /* at the loop indices of a struct_for over the same cells:
                       always active */
};

/* Task metadata, derived from the IR alone and cached in the bank. */
typedef struct fb_task_meta {
  fb_task_kind kind;
  int loop;           /* top-level parallel loop id, -1 */
  int snode;          /* struct_for / list task SNode, -1 */
  int iter;           /* struct_for: the container whose cells it visits (a
                         place's parent), -1 otherwise */
  int begin, end;     /* par_for bound statements, -1 */
  uint32_t list_key;  /* LIST state a struct_for iterates (FB_SKEY_NONE: dense) */
  fb_meta_acc *acc;   /* one per state, sorted by key */
  int nacc;
  uint32_t *udeps;    /* VALUE keys read by assume_unique index expressions */
  int nudeps;
  unsigned tflags;
  int64_t inb_ext;    /* FB_TF_INB_IFRANGE: smallest extent needed */
  int32_t *act;       /* activating statements (store/atomic on a sparse path, activate) */
  uint8_t *act_kind;  /* FB_ACT_* per act[] */
  int nact;
  int nstmts;         /* reachable statements */
  size_t bytes;
} fb_task_meta;

/* meta.c */
int fb_meta_compute(const fb_kernel *k, fb_task_meta **out, char *err, size_t errlen);
/* The states a host write of field `snode` (or host activation /
 * deactivation below container `snode`) touches. */
int fb_meta_host(const fb_layout *l, int snode, fb_task_meta **out, char *err, size_t errlen);
void fb_meta_free(fb_task_meta *m);
const fb_meta_acc *fb_meta_find(const fb_task_meta *m, uint32_t key);
/* Sparse containers (bitmasked/pointer/dynamic) on the path from the root
 * to node s, s included when sparse, top first. Returns the count. */
int fb_sparse_path(const fb_layout *l, int s, int *out, int max);
/* Evaluate a pure integer expression (consts, args from slots, integer
 * arithmetic) as the interpreter would. 0, or -1 when it is not one. */
int fb_eval_int(const fb_kernel *k, int id, const uint64_t *args, int nargs, int64_t *out);
/* Every index of a global access statement provably within the SNode's
 * shape, from the IR alone (consts, loop indices of loops with constant
 * bounds or struct_fors over no larger cells). */
int fb_access_inbounds(const fb_kernel *k, int stmt);

/* ---- bank.c: immutable, content-addressed task IR and memoized results */

typedef struct fb_bank fb_bank;
fb_bank *fb_bank_new(const fb_layout *l, size_t max_bytes);
void fb_bank_free(fb_bank *b);
void fb_bank_set_limit(fb_bank *b, size_t max_bytes);
/* Intern a copy of k (FB_EVERIFY / FB_EINVAL / FB_ENOMEM, message in err);
 * *out carries one reference. fb_bank_adopt takes k (freeing it). */
int fb_bank_intern(fb_bank *b, const fb_kernel *k, fb_irh *out, char *err, size_t errlen);
int fb_bank_adopt(fb_bank *b, fb_kernel *k, fb_irh *out, char *err, size_t errlen);
int fb_bank_valid(const fb_bank *b, fb_irh h);
void fb_bank_ref(fb_bank *b, fb_irh h);
void fb_bank_unref(fb_bank *b, fb_irh h);
const fb_kernel *fb_bank_ir(const fb_bank *b, fb_irh h);
uint64_t fb_bank_hash(const fb_bank *b, fb_irh h);
size_t fb_bank_bytes(const fb_bank *b, fb_irh h); /* its IR and metadata; 0: bad handle */
/* Metadata of a banked IR, computed once (NULL when out of memory). */
const fb_task_meta *fb_bank_meta(fb_bank *b, fb_irh h);
/* Memo: key = op code and operands (handles, numbers), compared exactly.
 * get returns the result with one new reference, or FB_IRH_NONE. */
enum {
  FB_MEMO_FUSE = 1,
  FB_MEMO_DEMOTE,
  FB_MEMO_DSE,
  FB_MEMO_SIMPLIFY
};
fb_irh fb_bank_memo_get(fb_bank *b, const int64_t *key, int n);
int fb_bank_memo_put(fb_bank *b, const int64_t *key, int n, fb_irh result);
void fb_bank_stats(const fb_bank *b, size_t *entries, size_t *bytes, uint64_t *evictions);

/* ---- ir_edit.c: building new task IR (results are compacted, unverified) */

/* B appended to A: parameters A's then B's; serial: B's body after A's;
 * parallel: B's loop-invariant values before the loop, B's loop body after
 * A's in the same loop. When B calls rand(), its part starts with
 * rand_seq(delta = B's launch - A's launch); A's part then starts with
 * rand_seq 0; B's own rand_seq offsets are shifted by delta. A stands for
 * aparts fused parts: B's statements' parts (fb_stmt.part) come after. */
fb_kernel *fb_ir_fuse(const fb_kernel *a, const fb_task_meta *ma, int aparts, const fb_kernel *b,
                      const fb_task_meta *mb, int64_t delta);
/* Demote the activating statements listed (store -> store_na, atomic_* ->
 * atomic_*_na, activate -> an unused is_active: it still reads the mask). */
fb_kernel *fb_ir_demote(const fb_kernel *k, const int32_t *stmts, int n);
/* Remove the writes of the given VALUE / GTMP states (stores, gtmp_stores,
 * atomics whose result is unused). */
fb_kernel *fb_ir_remove_writes(const fb_kernel *k, const uint32_t *keys, int n);
/* Dead code: drop unused pure statements and unused in-bounds loads, in
 * place. Returns the number of statements dropped. */
int fb_ir_dce(fb_kernel *k);
/* Intra-task simplification (pass_simplify.c): CSE, atomic demotion of
 * element-wise fields, store-to-load forwarding, identical load/store and
 * dead store elimination, DCE. *removed = statements saved. */
fb_kernel *fb_ir_simplify(const fb_kernel *k, const fb_task_meta *m, int *removed);
/* pass_promote.c: the task-local rewrites fb_lower runs on every task it
 * makes (owned atomics -> load/op/store, field elements kept in locals
 * across serial loops), in place; how many of each it made. 0 or FB_E*. */
int fb_ir_task_local(fb_kernel *k, int *atomics, int *promoted, char *err, size_t errlen);
/* Statement use counts over the reachable statements (malloc'd, nstmts). */
int32_t *fb_ir_use_counts(const fb_kernel *k);

/* ---- sfg.c: the graph */

enum {
  FB_EDGE_FLOW = 0,
  FB_EDGE_WAW,
  FB_EDGE_WAR
};

typedef struct fb_sfg_edge {
  int32_t node;  /* the other end (node index) */
  int32_t state; /* dense state id */
  uint8_t kind;  /* FB_EDGE_* */
} fb_sfg_edge;

/* A version is the serial number of the task that wrote it (0: the state
 * as the session began). Serial numbers are never reused; a fused task
 * keeps the serial of the task it absorbed the others into. */
/* An unfused task with FB_ACT_PURE activations, as part of a node: the
 * proof of activation demotion looks for an earlier node holding one with
 * the same IR and argument values. */
typedef struct fb_sfg_cert {
  fb_irh orig;        /* task IR as inserted (the node holds the reference) */
  int argoff, nargs;  /* its arguments within the node's */
} fb_sfg_cert;

/* An inserted task launch a node stands for (fb_opt_part). */
typedef struct fb_sfg_part {
  fb_irh orig;         /* task IR as inserted (the node holds the reference) */
  uint64_t launch;
  int argoff, nargs;
  uint8_t inb;
  int index;           /* fb_opt_part.index */
} fb_sfg_part;

typedef struct fb_sfg_node {
  uint64_t serial;
  uint64_t order;      /* position stamp: grows along the topological order */
  fb_irh ir;           /* current IR (one reference) */
  fb_irh orig;         /* IR as inserted, before demotion (one reference) */
  const fb_task_meta *m;
  uint64_t *args;
  int nargs;
  uint64_t launch;
  int ntasks;          /* inserted launches merged into it */
  uint8_t retained;    /* ran in an earlier flush */
  uint8_t host;        /* a host write, not a task */
  uint8_t dead;        /* removed by a pass (until the next rebuild) */
  uint8_t simplified;  /* intra-task simplification done on this IR */
  uint8_t demote_done; /* demotion tried on this IR with nothing left to do */
  uint8_t reshaped;    /* a pass other than demotion and simplification (DSE,
                          fusion) changed its IR: the IR as inserted may no
                          longer run in its place (fb_opt_launch.standin) */
  uint8_t demoted;     /* demotion changed its IR (valid by a proof) */
  int fused_now;       /* fusions this round */
  /* resolved from meta and args at insert */
  int range_ok;
  int64_t rbegin, rend;
  uint32_t *eflags;    /* per meta access: flags with the *_IFRANGE resolved */
  uint8_t *eff;        /* per meta access: effective FB_ACC_* (partial writes read) */
  int all_inb;
  /* versions, per meta access: the version read or overwritten */
  uint64_t *ver;
  uint64_t *vorder;    /* order stamp of that version's writer */
  uint64_t *cont;      /* content id of that version: its writer's serial,
                          or (masks) an older version's id when the engine
                          observed that the mask did not change
                          (fb_opt_observe_mask) */
  uint64_t list_ver;   /* struct_for: version of the list it iterates */
  fb_sfg_cert *certs;
  int ncerts;
  fb_sfg_part *parts;  /* the inserted launches merged into it, in order */
  int nparts;
  /* edges */
  fb_sfg_edge *in, *out;
  int nin, nout, capin, capout;
  int32_t index;       /* position in the graph's node array */
} fb_sfg_node;

typedef struct fb_sfg_lane_ent {
  int32_t node;
  int32_t acc;         /* index into the node's meta accesses */
} fb_sfg_lane_ent;

typedef struct fb_sfg_state {
  uint32_t key;
  int32_t owner;       /* latest writer's node index, -1 for none in the graph */
  uint64_t owner_ver;  /* version of the latest writer (0 initial) */
  uint64_t owner_order;
  uint64_t owner_cont; /* content id of the latest version (see fb_sfg_node.cont) */
  int32_t base_owner;  /* the same, as left by the last flush (retained nodes) */
  uint64_t base_ver, base_order, base_cont;
  /* masks: the engine's last observation (fb_opt_observe_mask) */
  uint64_t obs_count, obs_cont;
  uint8_t obs_valid;
  uint8_t cleared;     /* a task or host write that clears cells of it was
                          added since that observation */
  int32_t *readers;    /* node indices reading the current version */
  int nreaders, capreaders;
  fb_sfg_lane_ent *lane; /* window accesses in order (passes read this) */
  int nlane, caplane;
} fb_sfg_state;

typedef struct fb_sfg {
  const fb_layout *l;
  fb_sfg_node **nodes; /* retained first, then the window in order */
  int n, cap, nret;
  fb_sfg_state *st;    /* dense state ids */
  int nst, capst;
  int32_t *sid_of;     /* key -> state id for SNode states ((kind * nnodes) + snode) */
  int32_t *sid_misc;   /* RET / GTMP slots: (slot * 2 + (kind == GTMP)) -> id */
  int nmisc;
  fb_map smap;         /* serial -> node index (base/map.h) */
  uint64_t next_serial, next_order;
} fb_sfg;

int fb_sfg_init(fb_sfg *g, const fb_layout *l);
void fb_sfg_fini(fb_sfg *g, fb_bank *bank);
int fb_sfg_state_id(fb_sfg *g, uint32_t key); /* creates it; -1 out of memory */
/* Size the node's per-access arrays and evaluate its range (k: its IR). */
int fb_sfg_node_resolve(fb_sfg_node *n, const fb_kernel *k);
/* Append a window node (taking n) and add its edges. */
int fb_sfg_append(fb_sfg *g, fb_sfg_node *n);
/* Drop dead nodes, put the window in `order` (node pointers, NULL to keep
 * the current order) and recompute every edge and version. */
int fb_sfg_rebuild(fb_sfg *g, fb_bank *bank, fb_sfg_node **order, int norder);
/* How many writers of a mask before its latest one a flush keeps, while
 * each only activates cells (no clearing writer at or after it): demotion's
 * "earlier identical task" may be one of them (pass_demote.c). */
#define FB_SFG_MASK_HISTORY 2
/* The nodes fb_sfg_collect keeps: keep[i] = 1 for each (g->n entries):
 * the latest owner of every state, and for a mask its earlier writers back
 * to FB_SFG_MASK_HISTORY of them, while each and the writer after it only
 * activate. */
void fb_sfg_mark_kept(const fb_sfg *g, int *keep);
/* After a flush: keep the nodes fb_sfg_mark_kept marks as retained roots,
 * free the rest. */
int fb_sfg_collect(fb_sfg *g, fb_bank *bank);
/* Free every retained node: the window's reads of what they wrote become
 * versions no node of the graph stands for (fb_opt_forget). */
int fb_sfg_forget(fb_sfg *g, fb_bank *bank);
void fb_sfg_node_free(fb_sfg_node *n, fb_bank *bank);
fb_sfg_node *fb_sfg_find_serial(const fb_sfg *g, uint64_t serial);
int fb_sfg_check(fb_sfg *g, fb_bank *bank, char *err, size_t errlen);
char *fb_sfg_dot(const fb_sfg *g, fb_bank *bank, const char *title);
char *fb_sfg_text(const fb_sfg *g, fb_bank *bank);
/* Name of a state for DOT and text ("x", "mask(blocks)", "gtmp[8]"). */
void fb_sfg_state_name(const fb_layout *l, uint32_t key, char *buf, size_t n);
/* Replace a node's IR (takes the reference h) and re-resolve it. */
int fb_sfg_node_set_ir(fb_sfg_node *n, fb_bank *bank, fb_irh h);

/* opt.c: the context's graph and bank, for tests and tools of this folder. */
fb_sfg *fb_opt_graph(fb_opt *o);
fb_bank *fb_opt_bank(fb_opt *o);

/* ---- passes: each returns the number of changes, or a negative FB_E* */

typedef struct fb_pass_ctx {
  fb_sfg *g;
  fb_bank *bank;
  const fb_opt_options *opt;
  fb_opt_counters *cnt; /* this flush's counters */
  char *err;
  size_t errlen;
} fb_pass_ctx;

/* opt.c: look a transformation up in the memo (FB_IRH_NONE when absent;
 * counts hits), and bank a freshly made result k under key (verified in
 * check mode; k is taken). */
fb_irh fb_pass_memo_get(fb_pass_ctx *c, const int64_t *key, int n);
int fb_pass_memo_put(fb_pass_ctx *c, const int64_t *key, int n, fb_kernel *k, fb_irh *out);

int fb_pass_demote(fb_pass_ctx *c);
int fb_pass_listgen(fb_pass_ctx *c);
int fb_pass_dse(fb_pass_ctx *c);
int fb_pass_fuse(fb_pass_ctx *c);
int fb_pass_simplify(fb_pass_ctx *c);

#endif
