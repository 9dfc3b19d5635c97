/* The Fusebox kernel language (.fbk) front end: parse a source file into a
 * program (its layout, fields, funcs and kernels), instantiate kernels into
 * kernel IR, and render diagnostics. See docs/language.md for the language
 * and its contract. libc only.
 *
 * Invariants
 *  - A program owns a finalized fb_layout; every IR kernel it hands out refers
 *    to that layout and lives as long as the program.
 *  - Parsing type-checks every kernel and func: a program that parses has no
 *    kernel without field parameters that fails to lower, and such kernels
 *    can be instantiated without further errors. Kernels with `field`
 *    parameters are checked again against each binding at instantiation.
 *  - Diagnostics carry 1-based line:col positions into the source given to
 *    fb_program_parse; all errors are reported, sorted by position.
 *  - Nothing here keeps global state; a program may be used from one thread
 *    at a time (instantiation caches into it).
 */
#ifndef FUSEBOX_LANG_H
#define FUSEBOX_LANG_H

#include "fusebox/common.h"
#include "fusebox/ir.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct fb_program fb_program;

/* A field of the layout: one IR place per component of its element. */
typedef struct fb_lang_field {
  const char *name;
  fb_type type;         /* element (component) type */
  int rows, cols;       /* element shape: 0,0 scalar; n,0 vector[n]; n,m matrix[n][m] */
  int ncomp;            /* 1, n or n*m */
  const int *places;    /* ncomp place ids, row-major over the element */
  int snode;            /* the SNode holding the places (its leaf container) */
  int ndim;             /* number of indices: 0 for a 0-D field (x[]) */
  int64_t shape[FB_MAX_AXES]; /* extent of each index, in index order */
  int line, col;        /* where it is placed in the source */
} fb_lang_field;

typedef struct fb_lang_param {
  const char *name;
  int is_field;         /* 1: a `field` parameter, bound at instantiation */
  fb_type type;         /* scalar parameters: their type */
} fb_lang_param;

typedef struct fb_lang_kernel {
  const char *name;
  int nparams;
  const fb_lang_param *params; /* in source order */
  int nfield_params;    /* how many of params are `field` */
  fb_type ret;          /* FB_T_VOID when it returns nothing */
  int line, col;
  /* `kernel k(...) grad k_adj`: the kernel of the program that is its
   * adjoint (a custom gradient; "k.grad" instantiates it), else NULL */
  const char *grad;
} fb_lang_kernel;

/* Parse and check a whole file. filename is used in messages only. On
 * success *out is a new program (free with fb_program_free). On failure
 * returns FB_EPARSE (or FB_ENOMEM), *out is NULL and diags holds every
 * error with its position (diags may be NULL). */
int fb_program_parse(const char *filename, const char *src, fb_program **out, fb_diags *diags);
void fb_program_free(fb_program *p);

/* What one program may cost its host: a source is hostile input where a
 * server parses it for a tenant, and inlining can make a small source
 * costly (a func that calls the previous one twice, 14 deep, is 2^14
 * copies of the first one's body).
 *  - max_work: the expressions and statements that all lowerings of the
 *    program may visit together, each inlined copy of a func counted
 *    (checking each func and kernel at parse, and every instantiation after
 *    it); 0 means FB_LANG_PROGRAM_WORK. The examples visit 50 to 2000.
 *    Each kernel is also held to 100000 IR statements on its own.
 *  - stop: polled before each func is inlined, before each kernel or func
 *    is checked and every 1024 units of work; a non-NULL result ends the
 *    work at once with an error quoting it (a deadline passed, the client
 *    went away). NULL: never.
 * Past either, parsing or instantiation fails with FB_EQUOTA (or
 * FB_ECANCELLED for stop) and a diagnostic saying which. */
#define FB_LANG_PROGRAM_WORK 2000000L
typedef struct fb_lang_budget {
  long max_work;
  const char *(*stop)(void *arg);
  void *arg;
} fb_lang_budget;

/* fb_program_parse within a budget (NULL: the default one), which the
 * program keeps for its instantiations. */
int fb_program_parse_within(const char *filename, const char *src, const fb_lang_budget *budget,
                            fb_program **out, fb_diags *diags);

const char *fb_program_filename(const fb_program *p);
const char *fb_program_source(const fb_program *p);
const fb_layout *fb_program_layout(const fb_program *p);

int fb_program_nfields(const fb_program *p);
const fb_lang_field *fb_program_field(const fb_program *p, int i);
int fb_program_find_field(const fb_program *p, const char *name); /* index or -1 */
/* The field a place id belongs to (index), and which component; -1 if none. */
int fb_program_field_of_place(const fb_program *p, int place, int *comp);

int fb_program_nkernels(const fb_program *p);
const fb_lang_kernel *fb_program_kernel(const fb_program *p, int i);
int fb_program_find_kernel(const fb_program *p, const char *name); /* index or -1 */

int fb_program_nfuncs(const fb_program *p);
const char *fb_program_func_name(const fb_program *p, int i);

/* Instantiate a kernel for one binding of its field parameters
 * (field_bindings[i] names the field, or named SNode, bound to the i-th
 * `field` parameter in order; nfield must equal nfield_params). The IR
 * kernel is named "name" without field parameters, else "name[a,b]"; its
 * parameters are the scalar parameters in order. The result is owned by the
 * program and cached: the same binding gives the same pointer. Returns 0,
 * FB_ENOENT (no such kernel or field), FB_ETYPE (wrong binding count, or the
 * body does not type-check for this binding; diags say why) or FB_ENOMEM.
 * kernel "k.grad" gives the adjoint of k's instance for the same binding
 * (fb_kernel_adjoint_ex with the layout's x.grad gradient map, at most
 * 100000 statements; docs/autodiff.md), named "k.grad" / "k[a,b].grad"; a
 * refusal returns the pass's FB_EVERIFY or FB_EQUOTA with one diagnostic at
 * the source line:col of the statement it is about. "k.dual" likewise gives
 * the tangent of k's instance (forward mode: fb_kernel_tangent with the
 * layout's x.dual map), named "k.dual" / "k[a,b].dual". */
int fb_program_instantiate(fb_program *p, const char *kernel, const char *const *field_bindings,
                           int nfield, fb_kernel **out, fb_diags *diags);

/* "file:line:col: error: message\n<source line>\n<caret>\n" (malloc'd).
 * Without a position: "file: error: message\n". src may be NULL. */
char *fb_diag_render(const char *filename, const char *src, const fb_diag *d);
/* Every diagnostic rendered, concatenated (malloc'd). */
char *fb_diags_render(const char *filename, const char *src, const fb_diags *d);

/* Warnings of a program that parsed: advice that never makes a parse fail
 * (today: several fields of more than one cell interleaved in one dense
 * block). They are kept apart from the errors of fb_program_parse. */
const fb_diags *fb_program_warnings(const fb_program *p);
/* Every warning rendered as "file:line:col: warning: ..." with the source
 * line and a caret (malloc'd; "" when there is none; NULL on no memory). */
char *fb_program_warnings_render(const fb_program *p);

#ifdef __cplusplus
}
#endif
#endif
