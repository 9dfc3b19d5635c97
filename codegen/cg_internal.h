/* Internal header of codegen/: the task-module generator shared by the CPU
 * JIT and the NVPTX back end, the emitter's state, and small LLVM helpers.
 *
 * Invariants
 *  - A module is built in a caller-owned LLVMContext; nothing here keeps
 *    LLVM objects between calls, so independent contexts may be used from
 *    several threads at once.
 *  - LLVM targets are initialised once per process (fb_cg_llvm_init, a
 *    pthread_once: the registration is not mutable program state).
 *  - The generated code follows the semantics block of include/fusebox/ir.h
 *    exactly; the reference interpreter is the oracle. */
#ifndef FB_CG_INTERNAL_H
#define FB_CG_INTERNAL_H

#include <llvm-c/Core.h>
#include <llvm-c/TargetMachine.h>

#include "codegen/codegen.h"

typedef enum fb_cg_target {
  FB_CG_CPU = 0,
  FB_CG_NVPTX
} fb_cg_target;

typedef struct fb_cg_options {
  fb_cg_target target;
  const char *body_name;   /* symbol of the body function */
  const char *bounds_name; /* symbol of the bounds function */
  int libdevice;           /* NVPTX: call __nv_* math (libdevice linked later) */
  int cas16;               /* CPU: the target has a 16-byte compare-and-swap (x86 cx16) */
} fb_cg_options;

/* Offsets (bytes) of the fb_rt_ctx fields: every field is 8 bytes. */
enum {
  FB_CTX_ROOT = 0,
  FB_CTX_ARGS = 1,
  FB_CTX_RETS = 2,
  FB_CTX_GTMP = 3,
  FB_CTX_ERROR = 4,
  FB_CTX_SEED = 5,
  FB_CTX_LAUNCH = 6,
  FB_CTX_RUNTIME = 7,
  FB_CTX_PRIV = 8
};

/* Build the (unoptimized) module of task t into a new module in c, with the
 * given triple and data layout. *stmts receives the number of IR statements
 * lowered into the body function. Returns 0, FB_EINVAL (malformed task),
 * FB_EUNSUPPORTED (e.g. a layout deeper than the sparse runtime's limits)
 * or FB_ENOMEM, with a message. The module may call fb_rt_* functions:
 * link the runtime with fb_cg_link_rt before optimising it. */
int fb_cg_build(LLVMContextRef c, const fb_cg_task *t, const fb_cg_options *o, const char *triple,
                const char *datalayout, LLVMModuleRef *out, int *stmts, char *err, size_t errlen);

/* rt_link.c: link the sparse runtime's bitcode (codegen/rt/fb_rt.c) for
 * the target into m when m calls it; its functions become internal. */
int fb_cg_link_rt(LLVMContextRef c, LLVMModuleRef m, fb_cg_target target, char *err, size_t errlen);

/* perf_map.c: the perf map of JIT'd code (FB_PERF_MAP=1). fb_cg_perf_map_on
 * says whether it is on (and opens this process's /tmp/perf-PID.map);
 * fb_cg_perf_syms reads the code symbols of an object before the JIT takes
 * it (NULL when off); fb_cg_perf_announce appends their lines, placed by
 * the body's address after linking, named fb:LABEL, fb:LABEL:bounds and
 * fb:LABEL:SYMBOL. */
typedef struct fb_perf_syms fb_perf_syms;
int fb_cg_perf_map_on(void);
fb_perf_syms *fb_cg_perf_syms(LLVMMemoryBufferRef obj);
void fb_cg_perf_announce(const fb_perf_syms *s, const char *body_sym, const char *bounds_sym,
                         uint64_t body_addr, const char *label);
void fb_cg_perf_syms_free(fb_perf_syms *s);

/* ---------------------------------------------------------------- setup */

void fb_cg_llvm_init(void);
/* printf into err (when non-NULL) and return code. */
int fb_cg_fail(char *err, size_t errlen, int code, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 4, 5)))
#endif
    ;
/* The host's triple, CPU name and feature string (malloc'd each). */
int fb_cg_host_info(char **triple, char **cpu, char **features);
/* Whether a CPU target (triple, LLVM feature string "+a,-b,...") has a
 * 16-byte compare-and-swap: x86-64 with cx16 (cmpxchg16b). */
int fb_cg_has_cas16(const char *triple, const char *features);
/* CPU target machine: aggressive optimisation, PIC, small code model. */
LLVMTargetMachineRef fb_cg_cpu_tm(const char *triple, const char *cpu, const char *features,
                                  char *err, size_t errlen);
/* The same for the host (fb_cg_host_info + fb_cg_cpu_tm). */
LLVMTargetMachineRef fb_cg_host_tm(char *err, size_t errlen);
/* NVPTX target machine for "sm_XX" into *tm; FB_EINVAL for an unknown SM. */
int fb_cg_nvptx_tm(const char *sm, LLVMTargetMachineRef *tm, char *err, size_t errlen);
/* Data layout string of tm (malloc'd). */
char *fb_cg_tm_layout(LLVMTargetMachineRef tm);
/* Run the O3 pipeline on m with tm. */
int fb_cg_optimize(LLVMModuleRef m, LLVMTargetMachineRef tm, char *err, size_t errlen);
/* Verify m; FB_EINTERNAL with LLVM's message when it is malformed. */
int fb_cg_verify(LLVMModuleRef m, char *err, size_t errlen);

/* ---------------------------------------------------------------- emitter
 * State while lowering one task into one function. Shared by emit.c (control
 * flow and task structure), emit_ops.c (values) and emit_mem.c (memory). */

#define FB_CG_MAX_LOOPS 64

typedef struct fb_cg_loop {
  int stmt;                 /* loop statement id */
  LLVMBasicBlockRef brk;    /* target of break (NULL: not allowed) */
  LLVMBasicBlockRef cont;   /* target of continue */
} fb_cg_loop;

/* reduce.c: an atomic of the task's parallel loop that accumulates into a
 * private value instead, with one atomic per body call at the end. */
typedef struct fb_cg_red {
  int stmt;                      /* the atomic statement */
  fb_type type;                  /* the field's element type */
  LLVMValueRef acc;              /* alloca: contributions combined so far */
  LLVMValueRef hit;              /* alloca i8: nonzero once one happened */
  LLVMValueRef idx[FB_MAX_AXES]; /* alloca per index computed inside the
                                  * loop (NULL: defined before it) */
} fb_cg_red;

typedef struct fb_emit {
  const fb_kernel *k;
  const fb_layout *l;
  const fb_cg_options *o;
  LLVMContextRef c;
  LLVMModuleRef m;
  LLVMBuilderRef b;       /* code */
  LLVMBuilderRef ab;      /* allocas at the end of the entry block */
  LLVMValueRef fn;
  LLVMValueRef ctx;       /* fb_rt_ctx * parameter */
  LLVMValueRef c_root, c_args, c_rets, c_gtmp, c_error, c_seed, c_launch; /* ctx fields */
  LLVMValueRef *vals;     /* per statement: its value (NULL until emitted) */
  LLVMValueRef (*lidx)[FB_MAX_AXES]; /* per loop statement: current indices */
  LLVMValueRef (*lwide)[FB_MAX_AXES]; /* the same as exact i64 values (or NULL) */
  unsigned char *used;    /* per statement: some statement's operand */
  LLVMValueRef *wide;     /* per i32 statement: its exact value as an i64, where
                           * range.c made one (fb_cg_wide_note), else NULL */
  unsigned char *done;    /* per statement: emitted in this function */
  const unsigned char *keep; /* bounds function: statements to emit, or NULL */
  LLVMValueRef rand_count;   /* i64 alloca: rand() calls in this run */
  LLVMValueRef rand_launch;  /* i64 alloca: launch number rand() uses (rand_seq) */
  LLVMValueRef rand_iter;    /* i64: current parallel iteration (0 outside) */
  unsigned char *rstate;  /* range.c: per statement, memoised value ranges */
  int64_t *rlo, *rhi;
  fb_cg_loop loops[FB_CG_MAX_LOOPS];
  int nloops;
  int bounds_fn;          /* emitting the bounds function: no side effects */
  /* sparse struct_for whose body is being emitted (emit.c): the loop, the
   * container T its cells belong to and the current T cell's storage, so
   * that field[loop indices] under T is addressed directly */
  int sfor_loop, sfor_T;
  LLVMValueRef sfor_cell;
  int has_deactivate;     /* the task deactivates: no direct addressing */
  /* a sparse struct_for's cell loop marked parallel (emit.c, "Parallel
   * cell loops"): its access group, which every field and slot access
   * emitted meanwhile joins (emit_mem.c tag_named); NULL otherwise */
  LLVMMetadataRef access_group;
  /* reduce.c: the reductions of the task's loop; red_of[id] is the index
   * into reds of atomic id, -1 (or red_of NULL) for a plain atomic */
  fb_cg_red *reds;
  int nreds;
  int *red_of;
  /* priv.c: per SNode, 1 for a place whose atomic adds go to the thread's
   * private copy (NULL: none); c_priv its base (ctx->priv, or root) */
  unsigned char *priv_place;
  LLVMValueRef c_priv;
  /* emit.c, "Skipped blocks of a guarded scan": while set, loads leave out
   * their bounds guard (the caller proved every index in bounds) */
  int spec_nocheck;
  int stmts;              /* statements lowered */
  int rc;                 /* first error, sticky */
  char *err;
  size_t errlen;
  LLVMTypeRef t_void, t_i1, t_i8, t_i32, t_i64, t_f32, t_f64, t_ptr;
} fb_emit;

/* The name of the user's kernel that e's task comes from (its task name
 * less the ".tN" the engine adds): *name and the length to print of it,
 * for messages in the user's terms (never an IR value such as %7). */
int fb_emit_kernel_name(const struct fb_emit *e, const char **name);
int fb_emit_error(fb_emit *e, int code, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
LLVMTypeRef fb_emit_type(fb_emit *e, fb_type t);     /* register type (bool: i1) */
LLVMTypeRef fb_emit_memtype(fb_emit *e, fb_type t);  /* memory type (bool: i8) */
/* Value of operand i of s, checked to exist (NULL after an error). */
LLVMValueRef fb_emit_arg(fb_emit *e, const fb_stmt *s, int i);
fb_type fb_emit_argtype(fb_emit *e, const fb_stmt *s, int i);
/* Load statement id's bounds test: *inb the AND of 0 <= index < shape over
 * the indices not proven in range (NULL: none needs one). Emits only the
 * index arithmetic; its operands must have values. */
int fb_emit_load_inb(fb_emit *e, int id, LLVMValueRef *inb);
/* Is every container from the root down to snode (inclusive) dense? */
int fb_emit_dense_path(const fb_layout *l, int snode);
/* Load the 8-byte field number `field` of the context. */
LLVMValueRef fb_emit_ctx_field(fb_emit *e, int field, LLVMTypeRef ty);
LLVMValueRef fb_emit_i64(fb_emit *e, int64_t v);
LLVMValueRef fb_emit_i32(fb_emit *e, int32_t v);
/* Call an intrinsic overloaded on ty (or a plain intrinsic when ty NULL). */
LLVMValueRef fb_emit_intrinsic(fb_emit *e, const char *name, LLVMTypeRef ty, LLVMValueRef *args,
                               unsigned n);
/* Call a one-operand intrinsic overloaded on its result and operand types. */
LLVMValueRef fb_emit_intrinsic2(fb_emit *e, const char *name, LLVMTypeRef ret, LLVMTypeRef argty,
                                LLVMValueRef arg);
/* Call a named external function ret(args...), declaring it when needed. */
LLVMValueRef fb_emit_call(fb_emit *e, const char *name, LLVMTypeRef ret, LLVMValueRef *args,
                          unsigned n);
/* A new basic block in the current function. */
LLVMBasicBlockRef fb_emit_block(fb_emit *e, const char *name);
/* Is the current insertion block already terminated? */
int fb_emit_terminated(fb_emit *e);
/* Memory (bool as a byte) <-> register (bool as i1) conversions. */
LLVMValueRef fb_emit_to_mem(fb_emit *e, fb_type t, LLVMValueRef v);
LLVMValueRef fb_emit_from_mem(fb_emit *e, fb_type t, LLVMValueRef v);
/* Pack a register value into an 8-byte slot (slots.c) and back. */
LLVMValueRef fb_emit_pack_slot(fb_emit *e, fb_type t, LLVMValueRef v);
LLVMValueRef fb_emit_unpack_slot(fb_emit *e, fb_type t, LLVMValueRef slot);

/* emit_ops.c: pure value statements (const, arg, cast, select, arithmetic,
 * comparisons, bits, unary, math). Sets e->vals[id]; returns 0 or e->rc. */
int fb_emit_value_op(fb_emit *e, int id, const fb_stmt *s);
/* emit_mem.c: locals, global access, atomics, sparse on dense, gtmp, ret,
 * rand. */
int fb_emit_mem_op(fb_emit *e, int id, const fb_stmt *s);
/* Inline fb_rand_bits(seed, launch, site, iter, count) as an i64. */
LLVMValueRef fb_emit_rand_bits(fb_emit *e, LLVMValueRef seed, LLVMValueRef launch,
                               LLVMValueRef site, LLVMValueRef iter, LLVMValueRef count);
/* Pointers for runtime calls (generic address space) and for memory access
 * (global address space on NVPTX); identity on the CPU. */
LLVMValueRef fb_emit_generic(fb_emit *e, LLVMValueRef p);
LLVMValueRef fb_emit_global(fb_emit *e, LLVMValueRef p);
/* A generic pointer to a module constant holding desc (bytes, a multiple
 * of 8) as i64s, named name; made once per module. */
LLVMValueRef fb_emit_desc(fb_emit *e, const void *desc, size_t bytes, const char *name);
/* The atomic s (statement id) on explicit indices and value: given[d] the
 * i32 index values (NULL: s's own operands), v the value (NULL: s's own
 * operand); bounds check, activation and error latch as for s itself. */
int fb_emit_atomic_at(fb_emit *e, int id, const fb_stmt *s, const LLVMValueRef *given,
                      LLVMValueRef v);
/* Atomic b->ids[i] of block blk and the f32 atomic adds on other
 * components of its cell among the next statements (before `to`) as one
 * group: one index check, one address, a 64-bit compare-and-swap per
 * aligned pair (see emit_mem.c, "Grouped atomics"). Returns how many
 * statements of the block it emitted (the members and the pure ops between
 * them), 0 when there is no group (nothing emitted), -1 on error (e->rc). */
int fb_emit_try_group(fb_emit *e, int blk, int i, int to);
/* Emit statement id (emit.c's dispatcher). */
int fb_emit_stmt(fb_emit *e, int id);
/* The read-only block of zeros that CPU loads of inactive sparse cells read
 * (emit_mem.c, zero_block): its symbol, which the CPU JIT defines, and its
 * size (untouched zero pages in .bss, cpu_jit.c). */
#define FB_CG_ZERO_SYM "fb_cg_zero"
#define FB_CG_ZERO_BYTES ((int64_t)1 << 24)
/* Loads ids[0..n) (the rest of a block) that read fields of one sparse
 * container at the same indices, one walk for all (see emit_mem.c): the
 * number emitted (all done), 0 when fewer than two qualify (nothing
 * emitted), -1 on error (e->rc). */
int fb_emit_try_loads(fb_emit *e, const int *ids, int n);
/* Stores (store or store_na, one op) ids[0..n) that write fields of one
 * sparse container at the same indices: one walk for all (emit_mem.c); the
 * same returns as fb_emit_try_loads. */
int fb_emit_try_stores(fb_emit *e, const int *ids, int n);

/* reduce.c: reductions of a parallel task (see the file's comment).
 * plan: choose the atomics of loop `loop` to turn into reductions; open:
 * their accumulators, where the body function starts its loop;
 * contribute: lower atomic id (red_of[id] >= 0) as a contribution; close:
 * after the loop, one atomic per reduction that had a contribution; free:
 * release the plan. 0 or e->rc. */
int fb_reduce_plan(fb_emit *e, int loop);
void fb_reduce_open(fb_emit *e);
int fb_reduce_contribute(fb_emit *e, int id, const fb_stmt *s);
int fb_reduce_close(fb_emit *e);
void fb_reduce_free(fb_emit *e);

/* range.c: is statement id an i32 whose value always lies in [min, max]? */
int fb_cg_in_range(fb_emit *e, int id, int64_t min, int64_t max);
/* range.c: is statement id an f32 that is never NaN and always lies in
 * [min, max]? */
int fb_cg_f32_in_range(fb_emit *e, int id, double min, double max);
/* range.c: index arithmetic in i64. After i32 statement id is emitted, give
 * it an i64 twin (e->wide[id]) equal to the sign extension of its value,
 * computed without any i32 step where that is exact: loop indices, constants,
 * min, max and select of twins, +, -, * of twins where the range proves
 * the i32 operation cannot wrap, and division and remainder of a
 * non-negative twin by a positive one. Addresses built from twins are affine in
 * the loop counter, so LLVM sees unit-stride accesses (vector loads) instead
 * of a zext of a trunc. fb_cg_wide: the twin, or a sext at the current
 * point when there is none. */
void fb_cg_wide_note(fb_emit *e, int id);
LLVMValueRef fb_cg_wide(fb_emit *e, int id);
/* Check that every container on the path to snode is dense (FB_EUNSUPPORTED
 * otherwise, naming the statement). */
int fb_emit_check_dense(fb_emit *e, int id, int snode);

#endif
