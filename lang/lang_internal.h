/* Internal header of the .fbk front end (lang/): tokens, the syntax tree,
 * the program tables and the lowering context shared by the lexer, parser,
 * layout builder, type checker/lowerer and the vector/matrix builtins.
 *
 * Pipeline: lang_lex (tokens) -> lang_parse (syntax tree in the program's
 * arena) -> lang_build_layout (fb_layout + field table) -> lang_lower_kernel
 * (type check and emit IR through the fb_b_* builder, one call per kernel
 * instantiation). Every stage reports into an fb_diags and keeps going. */
#ifndef FB_LANG_INTERNAL_H
#define FB_LANG_INTERNAL_H

#include <stdint.h>

#include "base/base.h"
#include "base/map.h"
#include "fusebox/lang.h"
#include "lang_diag.h"
#include "lang_lex.h"

/* ---------------------------------------------------------------- arena */

typedef struct lang_chunk lang_chunk;
typedef struct lang_arena {
  lang_chunk *head;
  int failed; /* an allocation failed at least once */
} lang_arena;

void *la_alloc(lang_arena *a, size_t n); /* zeroed; NULL on failure */
char *la_strndup(lang_arena *a, const char *s, size_t n);
void la_free(lang_arena *a);

/* ---------------------------------------------------------------- types */

/* A value type: element type and shape (rows = 0: scalar; cols = 0: vector
 * of rows; else matrix rows x cols). */
typedef struct lty {
  fb_type t;
  uint8_t rows, cols;
} lty;

/* ---------------------------------------------------------------- syntax tree */

enum {
  /* expressions */
  E_INT = 1,
  E_FLOAT,
  E_BOOL,
  E_NAME,
  E_UNARY,
  E_BINARY,
  E_CMP,
  E_TERNARY,
  E_CALL,
  E_INDEX,
  E_LIST,
  E_CTOR,
  E_TUPLE, /* (a, b, ...): kids */
  E_KWARG, /* name = a, an argument given by name */
  /* statements */
  S_BLOCK,
  S_LET,
  S_LET_TUPLE,
  S_VAR,
  S_ASSIGN,
  S_EXPR,
  S_IF,
  S_WHILE,
  S_FOR_RANGE,
  S_FOR_IN,
  S_BREAK,
  S_CONTINUE,
  S_RETURN,
  S_ASSIGN_MULTI, /* kids (targets) = a (E_TUPLE or one expression) */
  /* declarations */
  D_LAYOUT,
  D_SNODE,
  D_PLACE,
  D_FUNC,
  D_KERNEL,
  D_PARAM,
  D_CONST
};

typedef struct node node;
struct node {
  int kind;
  int line, col;
  int op;          /* operator token; S_ASSIGN: T_ASSIGN or an augmented op */
  char *name;      /* names, callees, declared names */
  uint64_t ival;   /* E_INT, E_BOOL; D_SNODE: chunk */
  double fval;     /* E_FLOAT */
  lty ty;          /* E_CTOR, annotations (has_ty), D_PLACE, D_PARAM */
  int has_ty;
  int is_field;    /* D_PARAM declared `field` */
  node **kids;     /* operands, args, indices, statements, loop names */
  int nkids;
  int *ops;        /* E_CMP: nkids-1 comparison operators */
  node *a, *b, *c; /* sub-trees (see lang_parse.c) */
  /* D_SNODE */
  int snode_kind;  /* fb_snode_kind */
  char axes[FB_MAX_AXES + 1];
  int64_t sizes[FB_MAX_AXES];
  int nsizes;
  int has_chunk;
  node *size_e[FB_MAX_AXES]; /* the sizes as written (constant expressions) */
  node *chunk_e;
  int size_bad;              /* a size or the chunk is not a valid constant (reported) */
  int has_grad;              /* D_PLACE: `place x: f32 grad` (a gradient place beside it) */
  int has_dual;              /* D_PLACE: `place x: f32 dual` (a dual place beside it, forward mode) */
};

/* Parse tokens into top-level declarations (D_LAYOUT, D_FUNC, D_KERNEL). */
int lang_parse(lang_arena *a, const token *toks, int ntok, node ***decls, int *ndecls, fb_diags *d);

/* ---------------------------------------------------------------- program */

#define LANG_MAX_COMP 16 /* components of a 4x4 matrix */

typedef struct lfield {
  fb_lang_field pub;
  int places[LANG_MAX_COMP];
  int dyn;          /* 1 when its leaf container is dynamic */
} lfield;

typedef struct lsnode {  /* a named SNode (`as NAME`) */
  char *name;
  int id;
  int line, col;
} lsnode;

typedef struct lfunc {
  char *name;
  node *decl;
  int too_large; /* inlining it overflowed FB_LANG_MAX_STATEMENTS once: fail fast */
} lfunc;

typedef struct lkernel {
  fb_lang_kernel pub;
  fb_lang_param *params;
  node *decl;
} lkernel;

typedef struct linst {
  int kernel;
  char *name;       /* "k" or "k[a,b]" ("k.grad": its adjoint): also the cache key */
  fb_kernel *k;
  int32_t *pos;     /* per IR statement: line, col of the source it was lowered from (0: none) */
  int npos;         /* statements covered by pos */
} linst;

typedef struct lconst {  /* a module-level `const NAME = e` */
  char *name;
  int line, col;
  int ok;        /* 0: its expression had an error (reported) */
  int is_float;  /* the value is an untyped float literal, else an integer one */
  int64_t i;
  double f;
} lconst;

struct fb_program {
  lang_arena arena;
  char *filename, *src;
  fb_layout *layout;
  lfield *fields;
  int nfields, fcap;
  lsnode *snodes;
  int nsnodes, scap;
  lfunc *funcs;
  int nfuncs, fucap;
  lkernel *kernels;
  int nkernels, kcap;
  lconst *consts;
  int nconsts, ccap;
  fb_map const_names; /* FNV-1a of the name -> index into consts */
  fb_diags warnings;  /* never errors: see fb_program_warnings */
  linst *insts;
  int ninsts, icap;
  int32_t *lower_pos; /* the last lowering's position table (see linst.pos), taken by the instance */
  int lower_npos;
  /* the budget (fusebox/lang.h): expressions and statements lowered so far
   * by every lowering, each inlined copy counted, and why the work was
   * ended (set once: everything after it returns at once) */
  fb_lang_budget budget;
  long work;
  int spent; /* 0, FB_EQUOTA or FB_ECANCELLED */
};

/* Whether lowering may go on: 0, or -1 after the one diagnostic saying why
 * the program's budget is spent (at line:col when line > 0). */
int lang_budget_check(fb_program *p, fb_diags *d, int line, int col);
/* One more expression or statement lowered: 0, or -1 when the budget is
 * spent (checked every 1024 units, and at once after it was spent). */
static inline int lang_budget_step(fb_program *p, fb_diags *d, int line, int col) {
  if (p->spent) return -1;
  return (++p->work & 1023) ? 0 : lang_budget_check(p, d, line, col);
}

/* lang_const.c: a constant expression (a func parameter's default value):
 * 0 and *out set to an E_INT / E_FLOAT / E_BOOL node, or -1 (reported). */
int lang_const_literal(fb_program *p, node *e, node *out, fb_diags *d);
/* lang_const.c: evaluate the D_CONST decls in order (0 or FB_ENOMEM), then
 * the sizes of every SNode in the D_LAYOUT decls (x->sizes, x->ival;
 * x->size_bad on error). Errors go to d. */
int lang_eval_consts(fb_program *p, node **decls, int ndecls, fb_diags *d);
void lang_eval_sizes(fb_program *p, node **decls, int ndecls, fb_diags *d);
/* After the layout: a const named like a field or SNode is an error. */
void lang_check_const_names(fb_program *p, fb_diags *d);
const lconst *lang_find_const(const fb_program *p, const char *name); /* or NULL */

/* Build the layout and the field / SNode tables from the D_LAYOUT decls. */
int lang_build_layout(fb_program *p, node **decls, int ndecls, fb_diags *d);
int lang_find_snode(const fb_program *p, const char *name); /* index or -1 */

/* How a `field` parameter is bound while lowering. */
enum {
  LB_UNKNOWN = 0,
  LB_FIELD,
  LB_SNODE
};
typedef struct lbind {
  int kind;
  int index; /* into fields or snodes */
} lbind;

/* Type check and lower kernel ki with the given field bindings (one per
 * field parameter). *out receives the kernel (NULL allowed: check only).
 * Returns the number of errors added to d. */
int lang_lower_kernel(fb_program *p, int ki, const lbind *binds, fb_kernel **out, fb_diags *d);
/* "k" or "k[a,b]" (malloc'd). */
char *lang_instance_name(fb_program *p, int ki, const lbind *binds);
/* Type check a func on its own (field and untyped params unknown). */
int lang_check_func(fb_program *p, int fi, fb_diags *d);


/* ---------------------------------------------------------------- lowering */

enum {
  VK_VOID = 0,
  VK_UNKNOWN,
  VK_SCALAR,
  VK_VEC,
  VK_MAT,
  VK_TUPLE
};
enum {
  LIT_NONE = 0,
  LIT_INT,
  LIT_FLOAT
};

/* A value while lowering: scalarized components (row-major) with their
 * statement ids, or untyped literals (lit != 0) whose ids are not yet
 * emitted: they take their type from the other operand or the target. */
typedef struct lval {
  uint8_t kind;
  uint8_t lit;
  uint8_t rows, cols;
  fb_type t;
  int n;
  int id[LANG_MAX_COMP];
  int has_const;             /* cv/ci hold the components' values */
  double cv[LANG_MAX_COMP];
  int64_t ci[LANG_MAX_COMP];
} lval;

enum {
  SYM_LET = 1,
  SYM_VAR,
  SYM_FIELD
};

typedef struct lsym {
  const char *name;
  int kind;
  lval v;         /* LET: the value; VAR: allocas in v.id[] (typed) */
  lbind bind;     /* FIELD */
  int par;        /* parallel-loop depth where it was declared */
  int origin;     /* LET: ORIGIN_* (for messages) */
  int line, col;
} lsym;

enum {
  ORIGIN_LET = 0,
  ORIGIN_LOOP,
  ORIGIN_PARAM,
  ORIGIN_CONST
};

enum {
  LOOP_PAR = 1,
  LOOP_SERIAL,
  LOOP_CONT_WRAP
};

typedef struct lloop {
  int kind;
  int stmt;        /* loop statement id */
  int wrap_block;  /* LOOP_PAR with a `continue`: the wrapper while's id */
} lloop;

typedef struct lframe {   /* one inlined func call */
  int func;
  int loop_base;   /* nloops when the call started */
  int sym_base;
  lty ret;
  int has_ret;
  lval ret_var;    /* allocas for the result (flagged returns) */
  int done_var;    /* alloca bool, -1 when returns need no flag */
  int have_result; /* simple case: result already in result */
  lval result;
  const lbind *binds;
} lframe;

#define LANG_MAX_KPARAMS 64 /* scalar parameters of a kernel, and field parameters */
#define LANG_MAX_LOOPS 64
#define LANG_MAX_FRAMES 32
#define LANG_MAX_TUPLE 8      /* values in a tuple (a, b, ...) */

typedef struct lower {
  fb_program *p;
  fb_diags *d;
  fb_kernel *k;
  fb_builder b;
  int errors;
  lsym *syms;
  int nsyms, scap;
  lloop loops[LANG_MAX_LOOPS];
  int nloops;
  lframe frames[LANG_MAX_FRAMES];
  int nframes;
  int par_depth;   /* > 0 inside a parallel loop */
  int rand_site;
  int top;         /* lowering statements directly in the kernel body */
  int kernel;      /* index, -1 when checking a func */
  int returned;    /* kernel: a top-level return was seen */
  lty kret;
  int has_kret;
  /* the elements of the last VK_TUPLE value (its n is their count): valid
   * until the next tuple is evaluated, so consumers copy them at once */
  lval tup[LANG_MAX_TUPLE];
  int32_t *pos;    /* per emitted statement: line, col of the innermost expression or statement */
  int pcap;        /* statements pos has room for */
} lower;

/* Record the source position (line, col) for the statements emitted since
 * statement id mark that have none yet: called after each expression and
 * statement is lowered, so each IR statement gets its innermost source. */
void lang_stamp(lower *L, int mark, int line, int col);

/* lang_lower.c: values, emission helpers, expressions and references. */
void lv_unknown(lval *v);
void lv_scalar(lval *v, fb_type t, int id);
int lv_is_unknown(const lval *v);
lty lv_type(const lval *v);
fb_type lv_default_type(const lval *v);
const char *lang_ty_str(lty t, char *buf, size_t n);
const char *lv_str(const lval *v, char *buf, size_t n); /* "f32[3]", "float literal" */
fb_type lw_type(lower *L, int id);
int lw_const(lower *L, fb_type t, double f, int64_t i);
int lw_bin(lower *L, int op, int a, int c);
int lw_un(lower *L, int op, int a);
int lw_cast(lower *L, fb_type to, int a); /* any scalar conversion, bool included */
int lw_select(lower *L, int c, int a, int b);
/* Give untyped literals (and typed values, by cast) the element type t. */
void lv_materialize(lower *L, lval *v, fb_type t);
/* Convert v in place to the target type and shape for an assignment,
 * argument or return (implicit conversions only); reports "type mismatch in
 * WHAT" at the start of `at` and returns -1 on error. */
int lv_convert(lower *L, lval *v, lty target, node *at, const char *what);
/* Where an expression starts (its leftmost token). */
void lang_expr_pos(const node *e, int *line, int *col);
/* Explicit conversion (casts and constructors): any numeric conversion. */
void lv_cast(lower *L, lval *v, fb_type t);
/* The promoted element type of a and b; -1 when they cannot mix. */
int lang_common_type(const lval *a, const lval *b, fb_type *t);
int lang_same_shape(const lval *a, const lval *b); /* equal, or one scalar */
void lv_broadcast_like(lval *v, const lval *like);  /* scalar v to like's shape */
int lang_eval(lower *L, node *e, lval *out);      /* 0, or -1 (out unknown) */
int lang_cond(lower *L, node *e);                  /* a bool statement id */
/* An integer index expression as an i32 statement; *is_const/k when known. */
int lang_index(lower *L, node *e, int *id, int *is_const, int64_t *k);
/* Field / sparse-builtin indices, integer vectors expanded (lang_lower.c). */
int lang_indices(lower *L, node **kids, int n, int *idx, int *count);
int lang_has_effects(lower *L, node *e);
lsym *lang_lookup(lower *L, const char *name);
/* Resolve a name to a field / SNode binding (locals shadow fields);
 * returns 1 when it names one (LB_UNKNOWN for unbound field params). */
int lang_resolve_field(lower *L, const char *name, lbind *out);
int lang_push_sym(lower *L, const char *name, int kind, const lval *v, int line, int col);

/* References: what an assignment may target and what a name or index
 * expression reads from. */
enum {
  REF_UNKNOWN = 0,
  REF_VALUE,
  REF_VAR,
  REF_FIELD
};
typedef struct lsub {
  int dyn;  /* index known only at run time (id), else k */
  int k;
  int id;
} lsub;
typedef struct lref {
  int kind;
  lval v;           /* VALUE: the value; VAR: its allocas */
  const char *name; /* the variable, for messages */
  int is_let;
  int origin;       /* ORIGIN_* of a let */
  int par;          /* VAR: parallel-loop depth of its declaration */
  int field;        /* FIELD: index into the field table */
  int idx[FB_MAX_AXES];
  int nidx;
  lty base;         /* element type and shape before sub-indexing */
  lsub sub[2];
  int nsub;
} lref;
int lang_ref(lower *L, node *e, lref *r);
lty lang_ref_type(const lref *r);
void lang_ref_read(lower *L, const lref *r, lval *out);
/* Write v (already of lang_ref_type) with op STORE or an ATOMIC_* op. */
void lang_ref_write(lower *L, const lref *r, const lval *v, int op);
/* An ATOMIC_* op on a field reference, out = the values before it; 0, or -1
 * when a component is chosen at run time (not reported). */
int lang_ref_atomic(lower *L, const lref *r, const lval *v, int op, lval *out);

static inline int lw_add(lower *L, int a, int b) { return lw_bin(L, FB_OP_ADD, a, b); }
static inline int lw_sub(lower *L, int a, int b) { return lw_bin(L, FB_OP_SUB, a, b); }
static inline int lw_mul(lower *L, int a, int b) { return lw_bin(L, FB_OP_MUL, a, b); }
static inline int lw_div(lower *L, int a, int b) { return lw_bin(L, FB_OP_DIV, a, b); }

/* A double as an int64 without undefined behaviour (saturating, NaN 0). */
static inline int64_t lang_f2i(double f) { return fb_value_cast(fb_value_f64(f), FB_T_I64).v.i; }

/* Pseudo operator tokens for min / max (builtins and min= / max=). */
enum {
  LOP_MIN = 1000,
  LOP_MAX
};

/* lang_vec.c: vector / matrix operations on scalarized values. */
int lv_binary(lower *L, int op, lval *a, lval *b, lval *out, node *at);
int lv_matmul(lower *L, lval *a, lval *b, lval *out, node *at);
int lang_list(lower *L, node *e, lval *out);
/* Builtins on vectors and matrices (dot, cross, ...): 1 when name is one
 * of them (out set, or an error reported), 0 when not. */
int lang_vec_builtin(lower *L, node *call, lval *args, int nargs, lval *out);
void lv_mat_init(lval *v, fb_type t, int rows, int cols);
void lv_vec_init(lval *v, fb_type t, int n);

/* lang_call.c: calls (builtins and inlined funcs) and constructors. */
int lang_call(lower *L, node *e, lval *out);
int lang_ctor(lower *L, node *e, lval *out);
int lang_is_pure_builtin(const char *name);

/* lang_stmt.c */
int lang_inline(lower *L, int fi, node *call, lval *out);

/* lang_svd.c */
int lang_svd(lower *L, lval *m, lval *u, lval *s, lval *v);
int lang_polar(lower *L, lval *m, lval *r, lval *s);

#endif
