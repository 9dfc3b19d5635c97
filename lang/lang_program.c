/* The public API of the .fbk front end (include/fusebox/lang.h): parse a
 * file into a program (lex, parse, layout, register funcs and kernels, type
 * check everything, report every error sorted by position), look up fields
 * and kernels, instantiate kernels per field binding (cached), and render
 * the warnings (the caret printer itself is in lang_diag.c). Also the arena
 * the syntax tree lives in. */
#include <stdio.h>

#include "lang_internal.h"

/* ---------------------------------------------------------------- arena */

struct lang_chunk {
  lang_chunk *next;
  size_t used, cap;
  max_align_t data[];
};

void *la_alloc(lang_arena *a, size_t n) {
  n = (n + sizeof(max_align_t) - 1) / sizeof(max_align_t) * sizeof(max_align_t);
  lang_chunk *c = a->head;
  if (!c || c->used + n > c->cap) {
    size_t cap = n > 16384 ? n : 16384;
    c = malloc(sizeof *c + cap);
    if (!c) {
      a->failed = 1;
      return NULL;
    }
    c->next = a->head;
    c->used = 0;
    c->cap = cap;
    a->head = c;
  }
  void *p = (char *)c->data + c->used;
  c->used += n;
  memset(p, 0, n);
  return p;
}

char *la_strndup(lang_arena *a, const char *s, size_t n) {
  char *d = la_alloc(a, n + 1);
  if (!d) return NULL;
  memcpy(d, s, n);
  d[n] = 0;
  return d;
}

void la_free(lang_arena *a) {
  for (lang_chunk *c = a->head, *n; c; c = n) {
    n = c->next;
    free(c);
  }
  a->head = NULL;
}

/* ---------------------------------------------------------------- diagnostics */

static int diag_before(const fb_diag *a, const fb_diag *b) {
  return a->line < b->line || (a->line == b->line && a->col < b->col);
}

typedef struct keyed_diag {
  fb_diag d;
  int i; /* where it was: keeps the sort stable */
} keyed_diag;

static int cmp_keyed(const void *pa, const void *pb) {
  const keyed_diag *a = pa, *b = pb;
  if (diag_before(&a->d, &b->d)) return -1;
  if (diag_before(&b->d, &a->d)) return 1;
  return a->i < b->i ? -1 : a->i > b->i;
}

/* Stable sort by position and drop exact repeats (a func checked on its
 * own and at each call can report the same error more than once). Both in
 * O(n log n) for n errors: hostile source (fuseboxd parses clients' source)
 * can have an error on every statement. Without memory for the sort the
 * errors stay in the order found. */
static void sort_unique(fb_diags *d) {
  keyed_diag *k = d->n > 1 ? malloc(sizeof *k * (size_t)d->n) : NULL;
  if (k) {
    for (int i = 0; i < d->n; i++) k[i] = (keyed_diag){d->v[i], i};
    qsort(k, (size_t)d->n, sizeof *k, cmp_keyed);
    for (int i = 0; i < d->n; i++) d->v[i] = k[i].d;
    free(k);
  }
  int w = 0;
  for (int i = 0; i < d->n; i++) {
    int dup = 0; /* repeats are at one position, so next to each other once sorted */
    for (int j = w - 1;
         j >= 0 && !dup && d->v[j].line == d->v[i].line && d->v[j].col == d->v[i].col; j--)
      dup = !strcmp(d->v[j].msg, d->v[i].msg);
    if (dup) free(d->v[i].msg);
    else d->v[w++] = d->v[i];
  }
  d->n = w;
}

static void move_diags(fb_diags *from, fb_diags *to, const char *prefix) {
  for (int i = 0; i < from->n; i++) {
    fb_diag *x = &from->v[i];
    if (to) fb_diags_add(to, x->stmt, x->line, x->col, "%s%s", prefix ? prefix : "", x->msg);
  }
  fb_diags_free(from);
}

/* ---------------------------------------------------------------- warnings */

const fb_diags *fb_program_warnings(const fb_program *p) { return &p->warnings; }

char *fb_program_warnings_render(const fb_program *p) {
  size_t len = 1;
  char *out = malloc(len);
  if (!out) return NULL;
  out[0] = 0;
  for (int i = 0; i < p->warnings.n; i++) {
    char *r = lang_diag_render_as(p->filename, p->src, &p->warnings.v[i], "warning");
    char *o = r ? realloc(out, len + strlen(r)) : NULL;
    if (!o) {
      free(r);
      free(out);
      return NULL;
    }
    out = o;
    memcpy(out + len - 1, r, strlen(r) + 1);
    len += strlen(r);
    free(r);
  }
  return out;
}

/* Several fields of more than one cell placed in one dense block are
 * interleaved cell by cell (an array of structures): say what it costs and
 * how to give each its own block. */
static void interleave_notes(fb_program *p, const node *x) {
  if (x->kind != D_SNODE && x->kind != D_LAYOUT) return;
  int nplace = 0;
  const node *first = NULL, *second = NULL;
  for (int i = 0; i < x->nkids; i++)
    if (x->kids[i]->kind == D_PLACE) {
      if (!nplace) first = x->kids[i];
      else if (nplace == 1) second = x->kids[i];
      nplace++;
    }
  int64_t cells = 1;
  for (int i = 0; x->kind == D_SNODE && i < x->nsizes; i++) cells *= x->sizes[i];
  if (x->kind == D_SNODE && x->snode_kind == FB_SN_DENSE && nplace >= 2 && cells > 1 &&
      !x->size_bad) {
    char sizes[96] = "";
    for (int i = 0, n = 0; i < x->nsizes && n < (int)sizeof sizes - 24; i++)
      n += snprintf(sizes + n, sizeof sizes - (size_t)n, "%s%lld", i ? ", " : "",
                    (long long)x->sizes[i]);
    char ty[64];
    fb_diags_add(&p->warnings, -1, x->line, x->col,
                 "%d fields ('%s', '%s'%s) are interleaved in one dense block, cell by cell (an "
                 "array of structures): a loop that reads one of them moves the others through "
                 "memory too, which can make it several times slower. Unless they are used "
                 "together, give each a block of its own: 'field %s: %s (%s: %s)'",
                 nplace, first->name, second->name, nplace > 2 ? ", ..." : "", first->name,
                 lang_ty_str(first->ty, ty, sizeof ty), x->axes, sizes);
  }
  for (int i = 0; i < x->nkids; i++) interleave_notes(p, x->kids[i]);
}

/* ---------------------------------------------------------------- declarations */

/* A set of names with a value each (the shared table, base/map.h, keyed by
 * the name's FNV-1a hash; each entry of a hash is confirmed by comparing
 * the name, so colliding names stay apart), so that the declaration checks
 * stay linear in the number of names: fuseboxd parses clients' source, and
 * a megabyte holds tens of thousands of kernels or parameters. */
typedef struct name_ent {
  const char *name;
  int v;
} name_ent;

typedef struct nameset {
  fb_map m;
} nameset;

static int ns_init(nameset *s, size_t n) {
  fb_map_init(&s->m, sizeof(name_ent));
  return fb_map_reserve(&s->m, n);
}

static void ns_free(nameset *s) { fb_map_free(&s->m); }

/* The value of name when present; else adds it with v and returns -1. The
 * set never grows (so adding cannot fail): it has room for the names it is
 * made for. */
static int ns_find_or_add(nameset *s, const char *name, int v) {
  uint64_t h = fb__fnv(FB_FNV_INIT, name, strlen(name));
  size_t it = 0;
  for (const name_ent *e; (e = fb_map_next(&s->m, h, &it));)
    if (!strcmp(e->name, name)) return e->v;
  name_ent *e = fb_map_add(&s->m, h);
  if (e) *e = (name_ent){name, v};
  return -1;
}

/* names maps each name declared so far to 2 * func index or 2 * kernel
 * index + 1. */
static int name_clash(fb_program *p, node *x, nameset *names, fb_diags *d) {
  int kernel = x->kind == D_KERNEL;
  int prev = ns_find_or_add(names, x->name, kernel ? 2 * p->nkernels + 1 : 2 * p->nfuncs);
  if (prev < 0) return 0;
  if (prev % 2 == 0)
    lang_err(d, x->line, x->col, "'%s' is already defined as a func (at line %d)", x->name,
             p->funcs[prev / 2].decl->line);
  else
    lang_err(d, x->line, x->col, "'%s' is already defined as a kernel (at line %d)", x->name,
             p->kernels[prev / 2].pub.line);
  return 1;
}

static int check_params(fb_program *p, node *x, fb_diags *d) {
  int bad = 0, defaults = 0;
  nameset seen;
  if (ns_init(&seen, (size_t)x->nkids)) {
    ns_free(&seen);
    return FB_ENOMEM;
  }
  for (int i = 0; i < x->nkids; i++) {
    node *pm = x->kids[i];
    if (ns_find_or_add(&seen, pm->name, i) >= 0) {
      lang_err(d, pm->line, pm->col, "parameter '%s' is declared twice", pm->name);
      bad = 1;
    }
    if (pm->a) { /* a default value: a constant, folded to a literal here */
      node *lit = la_alloc(&p->arena, sizeof *lit);
      if (!lit) {
        ns_free(&seen);
        return FB_ENOMEM;
      }
      int line, col;
      lang_expr_pos(pm->a, &line, &col);
      if (x->kind == D_KERNEL) {
        lang_err(d, line, col,
                 "kernel parameter '%s' cannot have a default value (the host passes every "
                 "argument; defaults are for funcs)",
                 pm->name);
        bad = 1;
        pm->a = NULL;
      } else if (pm->is_field) {
        lang_err(d, line, col, "field parameter '%s' cannot have a default value", pm->name);
        bad = 1;
        pm->a = NULL;
      } else if (lang_const_literal(p, pm->a, lit, d) < 0) {
        bad = 1;
        pm->a = NULL;
      } else {
        pm->a = lit;
      }
      defaults = 1;
    } else if (defaults && x->kind == D_FUNC) {
      lang_err(d, pm->line, pm->col,
               "parameter '%s' comes after a parameter with a default value, so it needs one "
               "too (as in Python)",
               pm->name);
      bad = 1;
    }
    if (x->kind != D_KERNEL || pm->is_field) continue;
    if (!pm->has_ty) {
      lang_err(d, pm->line, pm->col, "kernel parameter '%s' needs a type: a scalar type or 'field'",
               pm->name);
      bad = 1;
    } else if (pm->ty.rows) {
      lang_err(d, pm->line, pm->col,
               "kernel parameter '%s' must be a scalar or 'field' (vectors are passed as fields)",
               pm->name);
      bad = 1;
    }
  }
  if (x->kind == D_KERNEL) {
    int nfield = 0, nscalar = 0;
    for (int i = 0; i < x->nkids; i++) x->kids[i]->is_field ? nfield++ : nscalar++;
    if (nscalar > LANG_MAX_KPARAMS || nfield > LANG_MAX_KPARAMS) {
      lang_err(d, x->line, x->col, "kernel '%s' has %d %s parameters; at most %d", x->name,
               nscalar > LANG_MAX_KPARAMS ? nscalar : nfield,
               nscalar > LANG_MAX_KPARAMS ? "scalar" : "field", LANG_MAX_KPARAMS);
      bad = 1;
    }
  }
  if (x->kind == D_KERNEL && x->has_ty && x->ty.rows) {
    lang_err(d, x->line, x->col, "kernel '%s' must return a scalar", x->name);
    bad = 1;
  }
  ns_free(&seen);
  return bad;
}

static int add_kernel(fb_program *p, node *x) {
  if (FB_GROW(p->kernels, p->nkernels, p->kcap)) return FB_ENOMEM;
  lkernel *K = &p->kernels[p->nkernels];
  memset(K, 0, sizeof *K);
  K->decl = x;
  K->pub.name = x->name;
  K->pub.line = x->line;
  K->pub.col = x->col;
  K->pub.ret = x->has_ty ? x->ty.t : FB_T_VOID;
  K->pub.nparams = x->nkids;
  K->params = x->nkids ? la_alloc(&p->arena, sizeof(fb_lang_param) * (size_t)x->nkids) : NULL;
  if (x->nkids && !K->params) return FB_ENOMEM;
  for (int i = 0; i < x->nkids; i++) {
    K->params[i].name = x->kids[i]->name;
    K->params[i].is_field = x->kids[i]->is_field;
    K->params[i].type = x->kids[i]->is_field ? FB_T_VOID : x->kids[i]->ty.t;
    K->pub.nfield_params += x->kids[i]->is_field;
  }
  K->pub.params = K->params;
  K->pub.grad = x->b ? x->b->name : NULL;
  p->nkernels++;
  return 0;
}

/* `kernel k(...) grad a`: a names another kernel of the program that takes
 * k's parameters (the same names, types and field parameters, in order)
 * and has no adjoint of its own. */
static void check_custom_grads(fb_program *p, fb_diags *d) {
  for (int i = 0; i < p->nkernels; i++) {
    lkernel *K = &p->kernels[i];
    const node *g = K->decl->b;
    if (!g) continue;
    const char *kn = K->pub.name, *an = g->name;
    int ai = fb_program_find_kernel(p, an);
    if (ai < 0) {
      int fi = -1;
      for (int j = 0; j < p->nfuncs; j++)
        if (!strcmp(p->funcs[j].name, an)) fi = j;
      lang_err(d, g->line, g->col,
               fi >= 0 ? "kernel '%s' names '%s' as its adjoint, which is a func: the adjoint "
                         "must be a kernel of the program that takes the same parameters"
                       : "kernel '%s' names '%s' as its adjoint, but the program has no kernel "
                         "'%s': declare it (kernel %s(...) taking the same parameters)",
               kn, an, an, an);
      continue;
    }
    if (ai == i) {
      lang_err(d, g->line, g->col,
               "kernel '%s' names itself as its adjoint: name another kernel that takes the "
               "same parameters, or remove 'grad %s' to have the adjoint generated",
               kn, an);
      continue;
    }
    lkernel *A = &p->kernels[ai];
    if (A->decl->b) {
      lang_err(d, g->line, g->col,
               "kernel '%s' names '%s' as its adjoint, which names '%s' as its own adjoint: "
               "custom adjoints do not chain (remove 'grad %s' from kernel '%s')",
               kn, an, A->decl->b->name, A->decl->b->name, an);
      continue;
    }
    int n = K->pub.nparams < A->pub.nparams ? K->pub.nparams : A->pub.nparams;
    int bad = 0;
    for (int j = 0; j < n && !bad; j++) {
      const fb_lang_param *x = &K->params[j], *y = &A->params[j];
      if (strcmp(x->name, y->name) || x->is_field != y->is_field || x->type != y->type) {
        lang_err(d, g->line, g->col,
                 "kernel '%s' cannot be the adjoint of '%s': parameter %d is '%s: %s' in '%s' "
                 "and '%s: %s' in '%s'; an adjoint takes the kernel's parameters",
                 an, kn, j + 1, x->name, x->is_field ? "field" : fb_type_name(x->type), kn,
                 y->name, y->is_field ? "field" : fb_type_name(y->type), an);
        bad = 1;
      }
    }
    if (!bad && K->pub.nparams != A->pub.nparams) {
      const lkernel *L = K->pub.nparams > A->pub.nparams ? K : A;
      lang_err(d, g->line, g->col,
               "kernel '%s' cannot be the adjoint of '%s': '%s' takes %d parameters and '%s' "
               "%d ('%s' has '%s' too); an adjoint takes the kernel's parameters",
               an, kn, kn, K->pub.nparams, an, A->pub.nparams, L->pub.name, L->params[n].name);
    }
  }
}

static int register_decls(fb_program *p, node **decls, int n, fb_diags *d) {
  nameset names;
  int rc = ns_init(&names, (size_t)n);
  for (int i = 0; !rc && i < n; i++) {
    node *x = decls[i];
    if (x->kind != D_FUNC && x->kind != D_KERNEL) continue;
    /* kernels with bad parameters are still checked (the bad ones are
     * unknown values), so that the errors in their bodies show too */
    if (name_clash(p, x, &names, d)) continue;
    if (check_params(p, x, d) == FB_ENOMEM) rc = FB_ENOMEM;
    else if (x->kind == D_KERNEL) rc = add_kernel(p, x) < 0 ? FB_ENOMEM : 0;
    else if (FB_GROW(p->funcs, p->nfuncs, p->fucap)) rc = FB_ENOMEM;
    else {
      memset(&p->funcs[p->nfuncs], 0, sizeof p->funcs[p->nfuncs]);
      p->funcs[p->nfuncs].name = x->name;
      p->funcs[p->nfuncs].decl = x;
      p->nfuncs++;
    }
  }
  ns_free(&names);
  return rc;
}

/* The instance takes the last lowering's position table (NULL for an
 * adjoint, whose statements map to no source of their own). */
static int add_instance(fb_program *p, int ki, fb_kernel *k) {
  if (FB_GROW(p->insts, p->ninsts, p->icap)) return FB_ENOMEM;
  linst *in = &p->insts[p->ninsts++];
  in->kernel = ki;
  in->name = k->name;
  in->k = k;
  in->pos = p->lower_pos;
  in->npos = p->lower_npos;
  p->lower_pos = NULL;
  p->lower_npos = 0;
  return 0;
}

/* ---------------------------------------------------------------- budget */

int lang_budget_check(fb_program *p, fb_diags *d, int line, int col) {
  if (p->spent) return -1;
  const char *why = p->budget.stop ? p->budget.stop(p->budget.arg) : NULL;
  if (why) {
    p->spent = FB_ECANCELLED;
    fb_diags_add(d, -1, line, col, "the program was not finished: %s", why);
    return -1;
  }
  if (p->work > p->budget.max_work) {
    p->spent = FB_EQUOTA;
    fb_diags_add(d, -1, line, col,
                 "program too large: checking its funcs and kernels, with every func copied "
                 "into each of its calls, passes %ld statements and expressions in all",
                 p->budget.max_work);
    return -1;
  }
  return 0;
}

/* Check every func and kernel; kernels without field params are kept. */
static int check_all(fb_program *p, fb_diags *d) {
  for (int i = 0; i < p->nfuncs && !lang_budget_check(p, d, 0, 0); i++)
    if (lang_check_func(p, i, d) == FB_ENOMEM) return FB_ENOMEM;
  lbind unknown[LANG_MAX_KPARAMS];
  memset(unknown, 0, sizeof unknown);
  for (int i = 0; i < p->nkernels && !lang_budget_check(p, d, 0, 0); i++) {
    if (p->kernels[i].pub.nfield_params > LANG_MAX_KPARAMS) continue; /* reported */
    int keep = p->kernels[i].pub.nfield_params == 0;
    fb_kernel *k = NULL;
    int rc = lang_lower_kernel(p, i, unknown, keep ? &k : NULL, d);
    if (rc == FB_ENOMEM) return rc;
    if (k && add_instance(p, i, k) < 0) {
      fb_kernel_free(k);
      return FB_ENOMEM;
    }
  }
  return 0;
}

int fb_program_parse(const char *filename, const char *src, fb_program **out, fb_diags *diags) {
  return fb_program_parse_within(filename, src, NULL, out, diags);
}

int fb_program_parse_within(const char *filename, const char *src, const fb_lang_budget *budget,
                            fb_program **out, fb_diags *diags) {
  if (out) *out = NULL;
  if (!src || !out) return FB_EINVAL;
  fb_program *p = calloc(1, sizeof *p);
  if (!p) return FB_ENOMEM;
  if (budget) p->budget = *budget;
  if (p->budget.max_work <= 0) p->budget.max_work = FB_LANG_PROGRAM_WORK;
  p->filename = fb__strdup(filename ? filename : "<input>");
  p->src = fb__strdup(src);
  fb_diags D;
  fb_diags_init(&D);
  token *toks = NULL;
  node **decls = NULL;
  int ntok = 0, ndecls = 0, rc = 0;
  if (!p->filename || !p->src) rc = FB_ENOMEM;
  if (!rc) rc = lang_lex(p->src, &toks, &ntok, &D);
  if (!rc) rc = lang_parse(&p->arena, toks, ntok, &decls, &ndecls, &D);
  free(toks);
  fb_map_init(&p->const_names, sizeof(int));
  if (!rc) rc = lang_eval_consts(p, decls, ndecls, &D);
  int layout_errors = D.n;
  if (!rc) rc = lang_build_layout(p, decls, ndecls, &D);
  layout_errors = D.n - layout_errors;
  if (!rc) lang_check_const_names(p, &D);
  for (int i = 0; !rc && !layout_errors && i < ndecls; i++) interleave_notes(p, decls[i]);
  if (!rc) rc = register_decls(p, decls, ndecls, &D);
  if (!rc) check_custom_grads(p, &D);
  if (!rc && !layout_errors) rc = check_all(p, &D);
  sort_unique(&D);
  if (rc == 0 && D.n) rc = p->spent ? p->spent : FB_EPARSE;
  move_diags(&D, diags, NULL);
  if (rc) {
    fb_program_free(p);
    return rc;
  }
  *out = p;
  return 0;
}

void fb_program_free(fb_program *p) {
  if (!p) return;
  for (int i = 0; i < p->ninsts; i++) {
    fb_kernel_free(p->insts[i].k);
    free(p->insts[i].pos);
  }
  free(p->insts);
  free(p->lower_pos);
  free(p->kernels);
  free(p->funcs);
  free(p->consts);
  fb_map_free(&p->const_names);
  fb_diags_free(&p->warnings);
  free(p->snodes);
  free(p->fields);
  fb_layout_free(p->layout);
  la_free(&p->arena);
  free(p->filename);
  free(p->src);
  free(p);
}

/* ---------------------------------------------------------------- queries */

const char *fb_program_filename(const fb_program *p) { return p->filename; }
const char *fb_program_source(const fb_program *p) { return p->src; }
const fb_layout *fb_program_layout(const fb_program *p) { return p->layout; }
int fb_program_nfields(const fb_program *p) { return p->nfields; }
int fb_program_nkernels(const fb_program *p) { return p->nkernels; }
int fb_program_nfuncs(const fb_program *p) { return p->nfuncs; }

const fb_lang_field *fb_program_field(const fb_program *p, int i) {
  return i >= 0 && i < p->nfields ? &p->fields[i].pub : NULL;
}

const fb_lang_kernel *fb_program_kernel(const fb_program *p, int i) {
  return i >= 0 && i < p->nkernels ? &p->kernels[i].pub : NULL;
}

const char *fb_program_func_name(const fb_program *p, int i) {
  return i >= 0 && i < p->nfuncs ? p->funcs[i].name : NULL;
}

int fb_program_find_field(const fb_program *p, const char *name) {
  for (int i = 0; i < p->nfields; i++)
    if (!strcmp(p->fields[i].pub.name, name)) return i;
  return -1;
}

int fb_program_find_kernel(const fb_program *p, const char *name) {
  for (int i = 0; i < p->nkernels; i++)
    if (!strcmp(p->kernels[i].pub.name, name)) return i;
  return -1;
}

int fb_program_field_of_place(const fb_program *p, int place, int *comp) {
  for (int i = 0; i < p->nfields; i++)
    for (int c = 0; c < p->fields[i].pub.ncomp; c++)
      if (p->fields[i].places[c] == place) {
        if (comp) *comp = c;
        return i;
      }
  return -1;
}

/* ---------------------------------------------------------------- instances */

static int bind_names(fb_program *p, const lkernel *K, const char *const *names, int n,
                      lbind *binds, fb_diags *diags) {
  if (n != K->pub.nfield_params) {
    fb_diags_add(diags, -1, 0, 0, "kernel '%s' takes %d field argument%s, found %d", K->pub.name,
                 K->pub.nfield_params, K->pub.nfield_params == 1 ? "" : "s", n);
    return FB_ETYPE;
  }
  for (int i = 0; i < n; i++) {
    const char *nm = names && names[i] ? names[i] : "";
    int f = fb_program_find_field(p, nm), s = lang_find_snode(p, nm);
    if (f >= 0) {
      binds[i].kind = LB_FIELD;
      binds[i].index = f;
    } else if (s >= 0) {
      binds[i].kind = LB_SNODE;
      binds[i].index = s;
    } else {
      fb_diags_add(diags, -1, 0, 0,
                   "kernel '%s': no field or SNode named '%s' to bind to parameter %d", K->pub.name,
                   nm, i + 1);
      return FB_ENOENT;
    }
  }
  return 0;
}

static int instantiate_grad(fb_program *p, const char *kernel, const char *const *field_bindings,
                            int nfield, fb_kernel **out, fb_diags *diags);

int fb_program_instantiate(fb_program *p, const char *kernel, const char *const *field_bindings,
                           int nfield, fb_kernel **out, fb_diags *diags) {
  if (out) *out = NULL;
  if (!p || !kernel || !out || nfield < 0) return FB_EINVAL;
  size_t kl = strlen(kernel);
  if (kl > 5 && (!strcmp(kernel + kl - 5, ".grad") || !strcmp(kernel + kl - 5, ".dual")))
    return instantiate_grad(p, kernel, field_bindings, nfield, out, diags);
  int ki = fb_program_find_kernel(p, kernel);
  if (ki < 0) {
    fb_diags_add(diags, -1, 0, 0, "no kernel named '%s'", kernel);
    return FB_ENOENT;
  }
  lkernel *K = &p->kernels[ki];
  lbind binds[64];
  if (nfield > 64) return FB_EINVAL;
  int rc = bind_names(p, K, field_bindings, nfield, binds, diags);
  if (rc) return rc;
  fb_kernel *k = NULL;
  fb_diags D;
  fb_diags_init(&D);
  char *name = lang_instance_name(p, ki, binds);
  if (!name) return FB_ENOMEM;
  for (int i = 0; i < p->ninsts; i++)
    if (p->insts[i].kernel == ki && !strcmp(p->insts[i].name, name)) {
      free(name);
      *out = p->insts[i].k;
      return 0;
    }
  free(name);
  rc = lang_budget_check(p, &D, 0, 0) ? p->spent : lang_lower_kernel(p, ki, binds, &k, &D);
  if (rc == FB_ENOMEM) {
    fb_diags_free(&D);
    return rc;
  }
  if (!k && p->spent) {
    move_diags(&D, diags, NULL);
    return p->spent;
  }
  if (!k) {
    char prefix[256];
    snprintf(prefix, sizeof prefix, "in kernel '%s' with these fields: ", K->pub.name);
    sort_unique(&D);
    move_diags(&D, diags, nfield ? prefix : NULL);
    return FB_ETYPE;
  }
  fb_diags_free(&D);
  if (add_instance(p, ki, k) < 0) {
    fb_kernel_free(k);
    return FB_ENOMEM;
  }
  *out = k;
  return 0;
}

/* Replace every occurrence of from in buf (of size n) by to, in place. */
static void subst(char *buf, size_t n, const char *from, const char *to) {
  size_t fl = strlen(from), tl = strlen(to);
  char *at = buf;
  while ((at = strstr(at, from)) != NULL) {
    size_t rest = strlen(at + fl);
    if ((size_t)(at - buf) + tl + rest + 1 > n) return;
    memmove(at + tl, at + fl, rest + 1);
    memcpy(at, to, tl);
    at += tl;
  }
}

/* The pass names IR places; a component of a vector or matrix field is a
 * place "v.0" / "F.1.2": say the field's name (and its declared type in
 * the suggested declaration) instead. */
static void user_names(const fb_program *p, char *msg, size_t n) {
  for (int i = 0; i < p->nfields; i++) {
    const lfield *f = &p->fields[i];
    if (f->pub.ncomp < 2) continue;
    char ty[48], from[300], to[300];
    if (f->pub.cols)
      snprintf(ty, sizeof ty, "%s[%d][%d]", fb_type_name(f->pub.type), f->pub.rows, f->pub.cols);
    else snprintf(ty, sizeof ty, "%s[%d]", fb_type_name(f->pub.type), f->pub.rows);
    for (int c = 0; c < f->pub.ncomp; c++) {
      const char *pn = p->layout->nodes[f->places[c]].name;
      snprintf(from, sizeof from, "place %s: %s grad", pn, fb_type_name(f->pub.type));
      snprintf(to, sizeof to, "place %s: %s grad", f->pub.name, ty);
      subst(msg, n, from, to);
      snprintf(from, sizeof from, "place %s: %s dual", pn, fb_type_name(f->pub.type));
      snprintf(to, sizeof to, "place %s: %s dual", f->pub.name, ty);
      subst(msg, n, from, to);
      snprintf(from, sizeof from, "'%s'", pn);
      snprintf(to, sizeof to, "'%s'", f->pub.name);
      subst(msg, n, from, to);
    }
  }
}

/* "k.grad": the adjoint of k's instance for the same bindings
 * (fb_kernel_adjoint_ex, gradients by the layout's x.grad convention),
 * and "k.dual" its tangent (fb_kernel_tangent, duals by the x.dual
 * convention), cached like any instance. A refusal is one diagnostic at the source
 * position of the statement it is about. */
static int instantiate_grad(fb_program *p, const char *kernel, const char *const *field_bindings,
                            int nfield, fb_kernel **out, fb_diags *diags) {
  size_t n = strlen(kernel) - 5;
  char base[256];
  if (n >= sizeof base) {
    fb_diags_add(diags, -1, 0, 0, "no kernel named '%s'", kernel);
    return FB_ENOENT;
  }
  memcpy(base, kernel, n);
  base[n] = 0;
  const char *suffix = kernel + n; /* ".grad" or ".dual" */
  int dual = !strcmp(suffix, ".dual");
  if (n > 5 && (!strcmp(base + n - 5, ".grad") || !strcmp(base + n - 5, ".dual"))) {
    fb_diags_add(diags, -1, 0, 0,
                 "no kernel named '%s': %s of %s (a second derivative) is not supported",
                 kernel, dual ? "the tangent" : "the adjoint",
                 !strcmp(base + n - 5, ".dual") ? "a tangent" : "an adjoint");
    return FB_ENOENT;
  }
  int ci = fb_program_find_kernel(p, base);
  if (ci >= 0 && p->kernels[ci].pub.grad) /* a custom adjoint: that kernel, the same bindings */
    return fb_program_instantiate(p, p->kernels[ci].pub.grad, field_bindings, nfield, out, diags);
  fb_kernel *k = NULL;
  int rc = fb_program_instantiate(p, base, field_bindings, nfield, &k, diags);
  if (rc) return rc;
  int ki = fb_program_find_kernel(p, base);
  const linst *fwd = NULL;
  for (int i = 0; i < p->ninsts; i++)
    if (p->insts[i].k == k) fwd = &p->insts[i];
  size_t gl = strlen(k->name) + 6;
  char *gname = malloc(gl);
  if (!gname) return FB_ENOMEM;
  snprintf(gname, gl, "%s%s", k->name, suffix);
  for (int i = 0; i < p->ninsts; i++)
    if (p->insts[i].kernel == ki && !strcmp(p->insts[i].name, gname)) {
      free(gname);
      *out = p->insts[i].k;
      return 0;
    }
  free(gname);
  fb_grad_map g;
  if ((rc = dual ? fb_dual_map_from_layout(p->layout, &g) : fb_grad_map_from_layout(p->layout, &g)))
    return rc;
  fb_kernel *adj = NULL;
  char err[768] = "";
  int bad = -1;
  rc = dual ? fb_kernel_tangent(k, &g, FB_LANG_MAX_STATEMENTS, &adj, &bad, err, sizeof err)
            : fb_kernel_adjoint_ex(k, &g, FB_LANG_MAX_STATEMENTS, &adj, &bad, err, sizeof err);
  fb_grad_map_free(&g);
  if (rc) {
    int line = 0, col = 0;
    if (fwd && bad >= 0 && bad < fwd->npos && fwd->pos) {
      line = fwd->pos[2 * bad];
      col = fwd->pos[2 * bad + 1];
    }
    if (!line) { /* no statement to blame: the kernel's own line */
      line = p->kernels[ki].pub.line;
      col = p->kernels[ki].pub.col;
    }
    user_names(p, err, sizeof err);
    fb_diags_add(diags, bad, line, col, "%s", err);
    return rc;
  }
  if (add_instance(p, ki, adj) < 0) {
    fb_kernel_free(adj);
    return FB_ENOMEM;
  }
  *out = adj;
  return 0;
}
