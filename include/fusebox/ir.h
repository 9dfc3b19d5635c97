/* The Fusebox kernel IR: SNode layouts, kernels made of statements with small
 * integer ids, a builder, the verifier, the text format, structural hashing,
 * clone, and the reference interpreter. libc only; no global state.
 *
 * Invariants
 *  - A layout is a tree of SNodes; node 0 is the root. Ids are indices into
 *    fb_layout.nodes and never change once given. Places (fields) are leaves.
 *  - A kernel owns its statements; a statement's id is its index into
 *    fb_kernel.stmts. Blocks list statement ids in program order; block 0 is
 *    the kernel body. Every statement sits in exactly one block, and a value
 *    may be used only after its definition, in the same block or a block
 *    nested inside it (the verifier checks this).
 *  - Kernels refer to a layout but do not own it; the layout must outlive
 *    every kernel built against it.
 */
#ifndef FUSEBOX_IR_H
#define FUSEBOX_IR_H

#include <stdio.h>

#include "fusebox/common.h"
#include "fusebox/limits.h" /* FB_MAX_BLOCK_DEPTH, the statement caps */

#ifdef __cplusplus
extern "C" {
#endif

#define FB_MAX_AXES 4 /* i j k l */
#define FB_MAX_ARGS 6 /* operands of one statement: 4 indices + value + 1 */

/* Limits of a layout, checked by fb_layout_finalize (layouts come from
 * clients, who may send anything): how many SNodes, how deep the tree (the
 * root has depth 0), and the bytes any one node, cell or field may span.
 * Below FB_LAYOUT_MAX_BYTES every product and sum of sizes that the IR, the
 * code generator and the runtimes form fits in 64 bits without wrapping. */
#define FB_LAYOUT_MAX_NODES 4096
#define FB_LAYOUT_MAX_DEPTH 48
#define FB_LAYOUT_MAX_BYTES ((uint64_t)1 << 56)

/* ---------------------------------------------------------------- SNodes */

typedef enum fb_snode_kind {
  FB_SN_ROOT = 0,
  FB_SN_DENSE,
  FB_SN_BITMASKED,
  FB_SN_POINTER,
  FB_SN_DYNAMIC,
  FB_SN_PLACE
} fb_snode_kind;

const char *fb_snode_kind_name(fb_snode_kind k); /* "dense" ... */

typedef struct fb_snode {
  int id;
  fb_snode_kind kind;
  char *name;          /* place: field name; container: 'as NAME' or NULL */
  int parent;          /* -1 for the root */
  int *children;
  int nchildren;
  /* as declared */
  unsigned axes;       /* bit a set: this node splits axis a (i=0 .. l=3) */
  int64_t size[FB_MAX_AXES]; /* own extent per axis, 1 where not split */
  int64_t chunk;       /* dynamic: elements per chunk */
  fb_type type;        /* place: element type */
  /* derived by fb_layout_finalize */
  int depth;           /* root 0 */
  unsigned space_axes; /* axes of its index space: own and ancestors' */
  int ndim;            /* popcount(space_axes); index count to address it */
  int dim_axis[FB_MAX_AXES];    /* axis of the d-th index (ascending axis order) */
  int64_t shape[FB_MAX_AXES];   /* cell-space extent per axis (by axis, 1 if unused) */
  int64_t ncells;      /* own cells: product of size[] (1 for places) */
  /* memory (bytes), target-neutral; see fb_layout_finalize */
  uint64_t cell_bytes; /* one cell: the children laid out one after another */
  uint64_t node_bytes; /* one instance of this node inside its parent cell */
  uint64_t offset;     /* offset of this node inside its parent's cell */
} fb_snode;

typedef struct fb_layout {
  fb_snode *nodes;
  int nnodes, cap;
  int finalized;
  uint64_t root_bytes; /* size of the root buffer (dense storage) */
} fb_layout;

fb_layout *fb_layout_new(void); /* holds just the root */
void fb_layout_free(fb_layout *l);
fb_layout *fb_layout_clone(const fb_layout *l);
/* Add a container under parent. axes is a string over "ijkl" (e.g. "ij"),
 * sizes one per letter. For dynamic, axes must be one letter and chunk > 0.
 * Returns the new id or a negative FB_E* code. */
int fb_layout_add(fb_layout *l, int parent, fb_snode_kind kind, const char *axes,
                  const int64_t *sizes, int64_t chunk, const char *name);
int fb_layout_place(fb_layout *l, int parent, const char *name, fb_type t);
/* Compute index spaces and the memory layout. Returns 0 or FB_EINVAL with a
 * message in err naming the SNode (an axis split twice on one path under a
 * dynamic, an extent over 2^31-1, storage over FB_LAYOUT_MAX_BYTES, more
 * than FB_LAYOUT_MAX_NODES nodes or a tree deeper than FB_LAYOUT_MAX_DEPTH).
 * Every size is computed with checked arithmetic; the depth is checked
 * before anything recurses, so any layout is safe to finalize. */
int fb_layout_finalize(fb_layout *l, char *err, size_t errlen);
int fb_layout_find(const fb_layout *l, const char *name); /* id or -1 */
/* Stride of axis a below node s on the way to descendant leaf: the product
 * of the sizes along a of the containers strictly between s and leaf. */
int64_t fb_layout_stride(const fb_layout *l, int s, int leaf, int axis);
/* Number of elements of a field (product of its shape; a finalized layout
 * guarantees numel * element size <= FB_LAYOUT_MAX_BYTES). */
int64_t fb_field_numel(const fb_layout *l, int place);
/* Ids of the containers from the root's child down to the place's parent. */
int fb_layout_path(const fb_layout *l, int node, int *out, int max);
/* Dense address of a field element relative to the root buffer (all
 * containers on the path dense): used by the host read/write paths. */
uint64_t fb_layout_dense_offset(const fb_layout *l, int place, const int64_t *idx);
uint64_t fb_layout_hash(const fb_layout *l);
/* Whether two layouts are the same tree: kinds, parents, axes, sizes,
 * chunks, types and names of every SNode, in order (what the hash covers). */
int fb_layout_equal(const fb_layout *a, const fb_layout *b);

/* ---------------------------------------------------------------- kernels */

typedef enum fb_op {
#define FB_OP(E, s, n, c, f) FB_OP_##E,
#include "fusebox/ops.h"
#undef FB_OP
  FB_OP__COUNT
} fb_op;

/* Op classes: the verifier's type rules. */
enum {
  FB_OPC_CONST,
  FB_OPC_ARG,
  FB_OPC_CAST,
  FB_OPC_SELECT,
  FB_OPC_ARITH,
  FB_OPC_FARITH,
  FB_OPC_CMP,
  FB_OPC_BITS,
  FB_OPC_SHIFT,
  FB_OPC_NOT,
  FB_OPC_UNARY,
  FB_OPC_FUNARY,
  FB_OPC_ALLOCA,
  FB_OPC_LLOAD,
  FB_OPC_LSTORE,
  FB_OPC_GLOAD,
  FB_OPC_GSTORE,
  FB_OPC_ATOMIC,
  FB_OPC_IATOMIC,
  FB_OPC_SPARSE,
  FB_OPC_APPEND,
  FB_OPC_LENGTH,
  FB_OPC_HINT,
  FB_OPC_IF,
  FB_OPC_LOOP,
  FB_OPC_RANGE,
  FB_OPC_STRUCT,
  FB_OPC_JUMP,
  FB_OPC_LOOPIDX,
  FB_OPC_RET,
  FB_OPC_GTMP,
  FB_OPC_RAND,
  FB_OPC_LIST
};

/* Op flags. */
enum {
  FB_OPF_PURE = 1,   /* result depends only on operands; no side effect */
  FB_OPF_SIDE = 2,   /* has an effect beyond its result */
  FB_OPF_BLOCK = 4,  /* owns body (and orelse) blocks */
  FB_OPF_SNODE = 8,  /* names an SNode in stmt.snode */
  FB_OPF_READS = 16, /* reads global state */
  FB_OPF_WRITES = 32, /* writes global state */
  FB_OPF_INTERNAL = 64 /* made by the engine only; refused in client kernels */
};

typedef struct fb_op_info {
  const char *name;
  int nargs;  /* -1: indices of the SNode (+1 value for store/atomic/append) */
  int cls;
  int flags;
} fb_op_info;

extern const fb_op_info fb_op_table[FB_OP__COUNT];
int fb_op_from_name(const char *s, size_t n); /* -1 when unknown */

typedef union fb_imm {
  int64_t i;
  uint64_t u;
  double f;
} fb_imm;

typedef struct fb_stmt {
  uint16_t op;     /* fb_op */
  uint8_t type;    /* fb_type of the result; VOID for none */
  uint8_t nargs;
  int32_t snode;   /* SNode for FB_OPF_SNODE ops, else -1 */
  int32_t args[FB_MAX_ARGS]; /* operand statement ids */
  fb_imm imm;      /* const value, arg number, slot, axis, offset, site */
  int32_t body;    /* block id, -1 when none */
  int32_t orelse;  /* block id, -1 when none */
  /* the part of a fused task the statement comes from (0-based, in the
   * order the task runs its parts; 0 outside fused tasks): fb_ir_fuse adds
   * A's part count to B's statements, a pass that merges statements keeps
   * the smallest, and code generation latches it with an access's
   * FB_EBOUNDS or FB_EQUOTA so that the engine names the launch that
   * failed. 0 to FB_IR_MAX_PART (the verifier checks it); the text form
   * writes it as a "part N" prefix where it is not 0 (docs/ir.md). */
  int32_t part;
} fb_stmt;

/* The largest fb_stmt.part: what the generated code's blame word holds
 * (codegen/rt/fb_rt.h, FB_RT_MAX_PART); no fused task has that many. */
#define FB_IR_MAX_PART 0x3ffffffe

typedef struct fb_block {
  int32_t *ids;
  int32_t n, cap;
} fb_block;

typedef struct fb_kernel {
  char *name;
  const fb_layout *layout;
  int nparams;
  fb_type *params;
  fb_type ret;        /* VOID when the kernel returns nothing */
  fb_stmt *stmts;
  int32_t nstmts, cap;
  fb_block *blocks;   /* blocks[0] is the body */
  int32_t nblocks, bcap;
} fb_kernel;

fb_kernel *fb_kernel_new(const fb_layout *l, const char *name, int nparams, const fb_type *params,
                         fb_type ret);
void fb_kernel_free(fb_kernel *k);
fb_kernel *fb_kernel_clone(const fb_kernel *k);
/* Copy k with a new layout pointer (same SNode ids). */
fb_kernel *fb_kernel_clone_to(const fb_kernel *k, const fb_layout *l);
/* The block a statement lives in and its position there: computed by walk;
 * returns -1 for ids not reachable from block 0. */
int fb_kernel_block_of(const fb_kernel *k, int stmt, int *pos);
/* Number of statements reachable from the body (what codegen emits). */
int fb_kernel_count_stmts(const fb_kernel *k);

/* ---------------------------------------------------------------- builder
 * The builder appends statements at an insertion point (a block). Each
 * emitting call returns the new statement id (>= 0) or a negative code on
 * allocation failure. Types of results are inferred where the op defines
 * them (comparisons give bool, arithmetic the operand type, loads the
 * field type); the verifier checks everything afterwards, so the builder
 * never aborts on bad input. */

typedef struct fb_builder {
  fb_kernel *k;
  int block; /* insertion block */
  int err;   /* first allocation error seen, sticky */
} fb_builder;

void fb_builder_init(fb_builder *b, fb_kernel *k); /* inserts into block 0 */
int fb_block_new(fb_kernel *k);                    /* empty, unattached */
int fb_b_emit(fb_builder *b, const fb_stmt *s);    /* raw append, type as given */
int fb_b_const_i32(fb_builder *b, int32_t v);
int fb_b_const_i64(fb_builder *b, int64_t v);
int fb_b_const_u32(fb_builder *b, uint32_t v);
int fb_b_const_u64(fb_builder *b, uint64_t v);
int fb_b_const_f32(fb_builder *b, float v);
int fb_b_const_f64(fb_builder *b, double v);
int fb_b_const_bool(fb_builder *b, int v);
int fb_b_const(fb_builder *b, fb_value v);
int fb_b_arg(fb_builder *b, int index); /* type from the kernel's params */
int fb_b_unary(fb_builder *b, fb_op op, int a);
int fb_b_binary(fb_builder *b, fb_op op, int a, int c);
int fb_b_cast(fb_builder *b, fb_type to, int a);
int fb_b_select(fb_builder *b, int cond, int a, int c);
int fb_b_alloca(fb_builder *b, fb_type t);
int fb_b_lload(fb_builder *b, int var);
int fb_b_lstore(fb_builder *b, int var, int value);
/* Global access: op is LOAD (value < 0), STORE, ATOMIC_*, IS_ACTIVE,
 * ACTIVATE, DEACTIVATE, APPEND, LENGTH. nidx indices in idx. */
int fb_b_global(fb_builder *b, fb_op op, int snode, const int *idx, int nidx, int value);
int fb_b_load(fb_builder *b, int field, const int *idx, int nidx);
int fb_b_store(fb_builder *b, int field, const int *idx, int nidx, int value);
int fb_b_hint_unique(fb_builder *b, int value, int field);
/* Structured control flow: these return the statement id; the body block
 * (and orelse for if) is created and the builder does NOT move into it: use
 * fb_b_enter(b, k->stmts[id].body) / fb_b_leave(b, saved). */
int fb_b_if(fb_builder *b, int cond, int with_else);
int fb_b_while(fb_builder *b);
int fb_b_range_for(fb_builder *b, int begin, int end, int parallel);
int fb_b_struct_for(fb_builder *b, int snode);
int fb_b_break(fb_builder *b);
int fb_b_continue(fb_builder *b);
int fb_b_loop_index(fb_builder *b, int loop, int which);
int fb_b_ret(fb_builder *b, int value, int slot);
int fb_b_rand(fb_builder *b, int site);
int fb_b_gtmp_load(fb_builder *b, fb_type t, int64_t offset);
int fb_b_gtmp_store(fb_builder *b, int value, int64_t offset);
int fb_b_enter(fb_builder *b, int block); /* returns the previous block */
void fb_b_leave(fb_builder *b, int saved);

/* ---------------------------------------------------------------- diagnostics */

typedef struct fb_diag {
  int stmt;       /* statement id, -1 when none */
  int line, col;  /* 1-based source position, 0 when none */
  char *msg;
} fb_diag;

typedef struct fb_diags {
  fb_diag *v;
  int n, cap;
} fb_diags;

void fb_diags_init(fb_diags *d);
void fb_diags_free(fb_diags *d);
void fb_diags_add(fb_diags *d, int stmt, int line, int col, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 5, 6)))
#endif
    ;
/* All messages, one per line, into a malloc'd string. */
char *fb_diags_join(const fb_diags *d);

/* ---------------------------------------------------------------- verifier
 * Checks operand ids, definition-before-use and scoping, arity, types,
 * index counts against the SNode's dimension, field existence, that break
 * and continue sit in a serial loop, that parallel loops and struct-fors
 * appear only at the top level of the body, loop_index naming an enclosing
 * loop, arg numbers and types, and ret types. Every error is reported (as
 * "%<id> <op>: <rule>"), not only the first. Returns 0 or FB_EVERIFY. */
int fb_verify(const fb_kernel *k, fb_diags *out);
/* What a kernel from a client must also satisfy, whoever built it: no
 * FB_OPF_INTERNAL op anywhere (FB_EVERIFY naming the first one and its
 * statement), and at most max_stmts statements when max_stmts > 0
 * (FB_EQUOTA). The verifier proper (fb_verify) accepts internal ops, since
 * it also checks the engine's own tasks. */
int fb_kernel_check_public(const fb_kernel *k, int max_stmts, char *err, size_t errlen);

/* ---------------------------------------------------------------- text format
 * print(parse(print(x))) == print(x). See docs/ir.md for the grammar. */
char *fb_layout_print(const fb_layout *l);          /* malloc'd */
char *fb_kernel_print(const fb_kernel *k);          /* malloc'd */
void fb_kernel_fprint(FILE *f, const fb_kernel *k);
/* Parse a module: one layout block followed by kernels. Returns 0 or
 * FB_EPARSE with line:col diagnostics in diags. On success *layout and the
 * kernels (malloc'd array of nkernels) belong to the caller. */
int fb_ir_parse(const char *text, fb_layout **layout, fb_kernel ***kernels, int *nkernels,
                fb_diags *diags);
/* Parse kernels against an existing (finalized) layout. */
int fb_ir_parse_kernels(const char *text, const fb_layout *layout, fb_kernel ***kernels,
                        int *nkernels, fb_diags *diags);

/* ---------------------------------------------------------------- hashing */
/* Structural hash over the reachable statements (ids renumbered in walk
 * order, so dead statements and numbering do not matter). Equal kernels hash
 * equally; a hash match must still be confirmed by fb_kernel_equal. */
uint64_t fb_kernel_hash(const fb_kernel *k);
int fb_kernel_equal(const fb_kernel *a, const fb_kernel *b);
/* Compacting copy: only reachable statements, renumbered in walk order. */
fb_kernel *fb_kernel_compact(const fb_kernel *k);

/* ---------------------------------------------------------------- automatic differentiation
 * Reverse mode, the foundation (docs/autodiff.md). A gradient map says, for
 * each place that has a gradient, which place holds it: a place of the same
 * float type and the same index space (shape). The layout convention that
 * fills one: the gradient of place N is a place named "N.grad" in the same
 * container (fb_layout_add_grad makes it; sharing the container, it has
 * the primal's shape and, on sparse layouts, the primal's activity). */

typedef struct fb_grad_map {
  int n;          /* entries: the layout's node count */
  int32_t *grad;  /* per SNode id: the place holding its gradient, -1 when none */
} fb_grad_map;

/* A map of n entries, all -1. Returns 0 or FB_ENOMEM / FB_EINVAL. */
int fb_grad_map_init(fb_grad_map *g, int n);
void fb_grad_map_free(fb_grad_map *g);
/* Add the place "<name>.grad" next to place (same parent, same type)
 * before the layout is finalized. Returns its id, or FB_EINVAL with a
 * message in err (not a place, not a float field, finalized layout, the
 * name already taken). */
int fb_layout_add_grad(fb_layout *l, int place, char *err, size_t errlen);
/* The map of the layout convention: each place P with a sibling place
 * named "<P's name>.grad" of P's type. g is initialised here. */
int fb_grad_map_from_layout(const fb_layout *l, fb_grad_map *g);

/* The adjoint of kernel k: a new kernel "<k's name>.grad" with k's
 * parameters and no return value that, run after k on the same state,
 * adds to the gradient of every place k reads (that has one in g) the
 * gradient that flows back from the gradients of the places k writes:
 *   load x[i]            -> atomic_add x.grad[i], (adjoint of the load)
 *   atomic_add y[i], v   -> adjoint of v += y.grad[i]
 *   store y[i], v        -> adjoint of v += y.grad[i]; y.grad[i] = 0
 * with values recomputed from the fields, which k must leave unchanged:
 * the scope (docs/autodiff.md) is par_for / struct_for bodies and the
 * kernel body with if/else, serial range_for loops (constant or run-time
 * bounds; loop-carried locals recomputed from the loop's entry state) and
 * local variables, over + - * / rem floordiv floormod min max pow atan2
 * neg abs and every float math op, casts, select, constants, parameters,
 * loop indices, loads, stores and atomic adds. Anything else (while,
 * break, continue, rand, sparse ops, float atomic_min/max, a field both
 * read and written, a used atomic result, an active value written to a
 * float field without a gradient, a bad map) is refused: FB_EVERIFY
 * (FB_EINVAL for a bad map) with a message in err that names the kernel
 * and says, in the user's terms (no IR ids), what it does and what to
 * change. The result passes fb_verify. */
int fb_kernel_adjoint(const fb_kernel *k, const fb_grad_map *g, fb_kernel **out, char *err,
                      size_t errlen);
/* fb_kernel_adjoint with a budget and the statement to blame: the adjoint
 * may have at most max_stmts statements (> 0; 0: no limit), else FB_EQUOTA
 * (a caller registering adjoints for a client passes the client's kernel
 * statement limit); *bad_stmt (may be NULL) is set to the forward
 * statement a refusal is about (-1 when none), which a front end maps to a
 * source position. */
int fb_kernel_adjoint_ex(const fb_kernel *k, const fb_grad_map *g, int max_stmts,
                         fb_kernel **out, int *bad_stmt, char *err, size_t errlen);

/* Forward mode (docs/autodiff.md "Forward mode"). A dual map is a gradient
 * map read the other way: per place, the place holding its dual (tangent),
 * -1 when none. The layout convention: the dual of place N is a place named
 * "N.dual" in the same container, of N's type. */
int fb_layout_add_dual(fb_layout *l, int place, char *err, size_t errlen);
int fb_dual_map_from_layout(const fb_layout *l, fb_grad_map *dual);

/* The tangent of kernel k: a new kernel "<k's name>.dual" with k's
 * parameters and return type that does what k does and, in program order
 * beside each active value, computes its tangent: a load of x also loads
 * x.dual, a store to y also stores y.dual (0 for a value that depends on
 * no dual), an atomic add (sub) to y also adds the tangent to y.dual, and
 * locals, if, serial and parallel loops, while, break and continue are
 * kept as they are. Launched in place of k it leaves, in the duals of the
 * fields k writes, J · (the duals of the fields k reads). Refused
 * (FB_EVERIFY, FB_EINVAL for a bad map, FB_EQUOTA past max_stmts when
 * max_stmts > 0), with a message naming the kernel in the user's terms and
 * *bad_stmt the statement to blame: internal ops, an active value written
 * to a field without a dual, float atomic_min/max and append involving a
 * dual, a used float atomic result on a field with a dual. The result
 * passes fb_verify. */
int fb_kernel_tangent(const fb_kernel *k, const fb_grad_map *dual, int max_stmts, fb_kernel **out,
                      int *bad_stmt, char *err, size_t errlen);

/* ---------------------------------------------------------------- interpreter
 * The reference interpreter runs IR on host memory it owns: one flat array
 * per field, indexed row-major by the field's global index (dims in axis
 * order). It is slow and obviously correct: the oracle for code generation.
 * Semantics that both it and generated code follow:
 *  - Out-of-bounds global accesses are skipped (loads give 0) and latch
 *    FB_EBOUNDS as the run's error.
 *  - Integer div, rem, floordiv and floormod by zero give 0; shifts take the count
 *    modulo the bit width; float to int casts saturate, NaN gives 0.
 *  - Parallel loops run their iterations in ascending order.
 *  - Sparse SNodes (docs/sparse.md): inactive cells read 0; a write
 *    activates every sparse ancestor (a new pointer block or dynamic slot
 *    starts zeroed); deactivate zeroes everything below the cell; an atomic
 *    on an inactive cell returns 0 and activates it; a struct_for visits a
 *    snapshot of the cells active when it starts, in row-major order of the
 *    cell space (rand()'s iter is the cell's row-major number there).
 * Arithmetic (exactly the same in generated code; ir/arith.c is its one
 * implementation on the host):
 *  - Integer add/sub/mul/neg/abs wrap; signed division overflow wraps
 *    (INT_MIN / -1 = INT_MIN, INT_MIN % -1 = 0).
 *  - floordiv on ints is Python's //, on floats floor(a / b); floormod is
 *    Python's %: ints r = a - b * floordiv(a, b); floats r = fmod(a, b),
 *    then r += b when r != 0 and (r < 0) != (b < 0). rem is C's % / fmod.
 *  - min/max on floats return the non-NaN operand (fmin/fmax); round is
 *    half away from zero; rsqrt(x) = 1 / sqrt(x); no fast-math anywhere.
 *  - Index operands, range bounds and loop indices are i32.
 *  - rand(): launch = number of launches run before this one in the session
 *    (0-based); iter = the iteration number of the enclosing top-level
 *    parallel loop (par_for: index - begin; struct_for: linear cell index),
 *    0 outside one; count = rand() calls already made in the same iteration,
 *    or, outside parallel loops, since the start of the current run of
 *    top-level non-loop statements. */

typedef struct fb_interp fb_interp;

fb_interp *fb_interp_new(const fb_layout *l, uint64_t seed);
void fb_interp_free(fb_interp *in);
/* Run a kernel once. args: nparams values of the parameter types. ret may
 * be NULL. Returns 0, FB_EBOUNDS (the run completed, some access skipped),
 * FB_EQUOTA (over the step budget, see fb_interp_set_step_limit) or
 * FB_EVERIFY/FB_EINVAL. Each call counts as one launch for rand(). */
int fb_interp_run(fb_interp *in, const fb_kernel *k, const fb_value *args, int nargs,
                  fb_value *ret);
/* The field's flat host array (fb_field_numel elements of its type). */
void *fb_interp_field(fb_interp *in, int place);
/* Scratch buffer shared by tasks of one launch (gtmp). */
void *fb_interp_scratch(fb_interp *in, size_t *bytes);
/* Message of the last failed run ("" when none). */
const char *fb_interp_errmsg(const fb_interp *in);
/* Step budget of each later run: every statement executed and every loop
 * iteration (a struct_for's inactive cells included) is one step; a run that
 * would take more than max_steps stops with FB_EQUOTA and a message saying it
 * "exceeded its step budget" (its effects so far stay). 0, the default,
 * means no limit. Lets untrusted kernels (an endless while) run safely. */
void fb_interp_set_step_limit(fb_interp *in, uint64_t max_steps);
/* Launch number the next run uses for rand(): lets a test run a kernel's
 * tasks one by one as a single launch. */
void fb_interp_set_launch(fb_interp *in, uint64_t launch);

/* ---------------------------------------------------------------- rand()
 * Counter-based: the value depends on (seed, launch number, call site,
 * parallel iteration, per-iteration call count) only. */
uint64_t fb_rand_bits(uint64_t seed, uint64_t launch, uint64_t site, uint64_t iter, uint64_t count);
float fb_rand_f32(uint64_t bits); /* top 24 bits scaled into [0, 1) */

#ifdef __cplusplus
}
#endif
#endif
