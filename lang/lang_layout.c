/* Layout blocks of a .fbk program to an fb_layout: checks each SNode and
 * place with its source position (axes, sizes, chunk, duplicate names), adds
 * them with fb_layout_add / fb_layout_place, finalizes, and fills the
 * program's field table (a vector or matrix field is one place per
 * component, all in the same SNode) and its table of named SNodes. */
#include <stdio.h>

#include "lang_internal.h"

/* Name of component c of a vector/matrix field: "v.0", "F.1.2". */
static void comp_name(char *buf, size_t n, const char *field, lty t, int c) {
  if (t.rows == 0) snprintf(buf, n, "%s", field);
  else if (t.cols == 0) snprintf(buf, n, "%s.%d", field, c);
  else snprintf(buf, n, "%s.%d.%d", field, c / t.cols, c % t.cols);
}

static int name_taken(const fb_program *p, const char *name) {
  for (int i = 0; i < p->nfields; i++)
    if (!strcmp(p->fields[i].pub.name, name)) return 1;
  return lang_find_snode(p, name) >= 0;
}

int lang_find_snode(const fb_program *p, const char *name) {
  for (int i = 0; i < p->nsnodes; i++)
    if (!strcmp(p->snodes[i].name, name)) return i;
  return -1;
}

static int check_snode(const fb_program *p, const node *x, int parent_kind, fb_diags *d) {
  int n = (int)strlen(x->axes), bad = 0;
  unsigned seen = 0;
  for (int i = 0; i < n; i++) {
    int a = x->axes[i] - 'i';
    if (a < 0 || a >= FB_MAX_AXES) {
      lang_err(d, x->line, x->col, "unknown axis '%c' in '%s': expected letters from 'ijkl'",
               x->axes[i], x->axes);
      return -1;
    }
    if (seen & (1u << a)) {
      lang_err(d, x->line, x->col, "axis '%c' appears twice in '%s'", x->axes[i], x->axes);
      return -1;
    }
    seen |= 1u << a;
  }
  const char *kn = fb_snode_kind_name((fb_snode_kind)x->snode_kind);
  if (x->nsizes != n) {
    lang_err(d, x->line, x->col, "%s(%s: ...) expects %d size%s (one per axis), found %d", kn,
             x->axes, n, n == 1 ? "" : "s", x->nsizes);
    return -1;
  }
  if (x->size_bad) return -1; /* reported where the size is written */
  if (x->snode_kind == FB_SN_DYNAMIC) {
    if (n != 1) {
      lang_err(d, x->line, x->col, "dynamic takes exactly one axis, found '%s'", x->axes);
      return -1;
    }
    if (!x->has_chunk || x->ival == 0 || (int64_t)x->ival > x->sizes[0]) {
      lang_err(d, x->line, x->col,
               "dynamic(%s: %lld, chunk: C) needs a chunk size C from 1 to %lld", x->axes,
               (long long)x->sizes[0], (long long)x->sizes[0]);
      bad = 1;
    }
  } else if (x->has_chunk) {
    lang_err(d, x->line, x->col, "only dynamic SNodes take a chunk size");
    bad = 1;
  }
  if (parent_kind == FB_SN_DYNAMIC) {
    lang_err(d, x->line, x->col, "a dynamic SNode may hold only fields (place), not a %s SNode",
             kn);
    bad = 1;
  }
  if (x->name && name_taken(p, x->name)) {
    lang_err(d, x->line, x->col, "the name '%s' is already used by a field or SNode", x->name);
    bad = 1;
  }
  if (x->nkids == 0) {
    lang_err(d, x->line, x->col,
             "this %s SNode holds no fields: expected 'place' or an SNode inside", kn);
    bad = 1;
  }
  return bad ? -1 : 0;
}

/* The dual of field fi (forward mode): a field "x.dual" whose places are
 * "<component>.dual" beside each component (fb_layout_add_dual, the x.dual
 * convention). 0, or FB_ENOMEM; a refusal is a diagnostic. */
static int add_dual(fb_program *p, int fi, const node *x, fb_diags *d) {
  if (FB_GROW(p->fields, p->nfields, p->fcap)) return FB_ENOMEM;
  lfield *pf = &p->fields[fi], *df = &p->fields[p->nfields];
  *df = *pf;
  size_t nl = strlen(x->name);
  char *dname = la_alloc(&p->arena, nl + 6);
  if (!dname) return FB_ENOMEM;
  memcpy(dname, x->name, nl);
  memcpy(dname + nl, ".dual", 6);
  df->pub.name = dname;
  for (int c = 0; c < df->pub.ncomp; c++) {
    char err[256];
    int id = fb_layout_add_dual(p->layout, pf->places[c], err, sizeof err);
    if (id < 0) {
      if (id == FB_ENOMEM) return id;
      lang_err(d, x->line, x->col, "%s", err);
      return 0;
    }
    df->places[c] = id;
  }
  p->nfields++;
  return 0;
}

static int add_place(fb_program *p, int parent, const node *x, fb_diags *d) {
  if (name_taken(p, x->name)) {
    lang_err(d, x->line, x->col, "the name '%s' is already used by a field or SNode", x->name);
    return 0;
  }
  if (x->ty.t == FB_T_BOOL) {
    lang_err(d, x->line, x->col, "fields cannot hold bool: use i32 or u32 for '%s'", x->name);
    return 0;
  }
  if (x->has_grad && !fb_type_is_float(x->ty.t)) {
    lang_err(d, x->line, x->col,
             "'%s' is %s: only f32 and f64 fields have gradients (remove 'grad' or make it a float "
             "field)",
             x->name, fb_type_name(x->ty.t));
    return 0;
  }
  if (x->has_dual && !fb_type_is_float(x->ty.t)) {
    lang_err(d, x->line, x->col,
             "'%s' is %s: only f32 and f64 fields have duals (remove 'dual' or make it a float "
             "field)",
             x->name, fb_type_name(x->ty.t));
    return 0;
  }
  if (FB_GROW(p->fields, p->nfields, p->fcap)) return FB_ENOMEM;
  lfield *f = &p->fields[p->nfields];
  memset(f, 0, sizeof *f);
  f->pub.name = la_strndup(&p->arena, x->name, strlen(x->name));
  f->pub.type = x->ty.t;
  f->pub.rows = x->ty.rows;
  f->pub.cols = x->ty.cols;
  f->pub.ncomp = x->ty.rows ? x->ty.rows * (x->ty.cols ? x->ty.cols : 1) : 1;
  f->pub.snode = parent;
  f->pub.line = x->line;
  f->pub.col = x->col;
  for (int c = 0; c < f->pub.ncomp; c++) {
    char buf[256];
    comp_name(buf, sizeof buf, x->name, x->ty, c);
    int id = fb_layout_place(p->layout, parent, buf, x->ty.t);
    if (id < 0) return id;
    f->places[c] = id;
  }
  p->nfields++;
  int fi = p->nfields - 1; /* the primal, where a dual is added after the gradient */
  if (!x->has_grad) return x->has_dual ? add_dual(p, fi, x, d) : 0;
  /* the gradient: a field "x.grad" whose places are "<component>.grad"
   * beside each component (fb_layout_add_grad, the x.grad convention) */
  if (FB_GROW(p->fields, p->nfields, p->fcap)) return FB_ENOMEM;
  lfield *pf = &p->fields[p->nfields - 1], *gf = &p->fields[p->nfields];
  *gf = *pf;
  size_t nl = strlen(x->name);
  char *gname = la_alloc(&p->arena, nl + 6);
  if (!gname) return FB_ENOMEM;
  memcpy(gname, x->name, nl);
  memcpy(gname + nl, ".grad", 6);
  gf->pub.name = gname;
  for (int c = 0; c < gf->pub.ncomp; c++) {
    char err[256];
    int id = fb_layout_add_grad(p->layout, pf->places[c], err, sizeof err);
    if (id < 0) {
      if (id == FB_ENOMEM) return id;
      lang_err(d, x->line, x->col, "%s", err);
      return 0;
    }
    gf->places[c] = id;
  }
  p->nfields++;
  return x->has_dual ? add_dual(p, fi, x, d) : 0;
}

static int build_items(fb_program *p, int parent, int parent_kind, node **kids, int n,
                       fb_diags *d) {
  for (int i = 0; i < n; i++) {
    node *x = kids[i];
    int rc;
    if (x->kind == D_PLACE) {
      if ((rc = add_place(p, parent, x, d)) < 0) return rc;
      continue;
    }
    if (check_snode(p, x, parent_kind, d) < 0) continue;
    int id = fb_layout_add(p->layout, parent, (fb_snode_kind)x->snode_kind, x->axes, x->sizes,
                           (int64_t)x->ival, x->name);
    if (id == FB_ENOMEM) return id;
    if (id < 0) {
      lang_err(d, x->line, x->col, "invalid %s SNode",
               fb_snode_kind_name((fb_snode_kind)x->snode_kind));
      continue;
    }
    if (x->name) {
      if (FB_GROW(p->snodes, p->nsnodes, p->scap)) return FB_ENOMEM;
      lsnode *s = &p->snodes[p->nsnodes++];
      s->name = la_strndup(&p->arena, x->name, strlen(x->name));
      s->id = id;
      s->line = x->line;
      s->col = x->col;
    }
    if ((rc = build_items(p, id, x->snode_kind, x->kids, x->nkids, d)) < 0) return rc;
  }
  return 0;
}

int lang_build_layout(fb_program *p, node **decls, int ndecls, fb_diags *d) {
  if (!(p->layout = fb_layout_new())) return FB_ENOMEM;
  int before = d ? d->n : 0, line = 0, col = 0;
  lang_eval_sizes(p, decls, ndecls, d); /* sizes are constant expressions */
  for (int i = 0; i < ndecls; i++) {
    if (decls[i]->kind != D_LAYOUT) continue;
    if (!line) {
      line = decls[i]->line;
      col = decls[i]->col;
    }
    int rc = build_items(p, 0, FB_SN_ROOT, decls[i]->kids, decls[i]->nkids, d);
    if (rc < 0) return rc;
  }
  if (d && d->n > before) return 0; /* errors already; do not finalize */
  char err[256] = "";
  if (fb_layout_finalize(p->layout, err, sizeof err) < 0) {
    lang_err(d, line, col, "invalid layout: %s", err);
    return 0;
  }
  for (int i = 0; i < p->nfields; i++) {
    lfield *f = &p->fields[i];
    f->pub.places = f->places; /* the table no longer moves */
    const fb_snode *s = &p->layout->nodes[f->places[0]];
    f->pub.ndim = s->ndim;
    for (int k = 0; k < s->ndim; k++) f->pub.shape[k] = s->shape[s->dim_axis[k]];
    f->dyn = p->layout->nodes[f->pub.snode].kind == FB_SN_DYNAMIC;
  }
  return 0;
}
