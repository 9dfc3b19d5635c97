/* SNode layouts: the tree, each node's index space (docs/language.md: a field's
 * extent along an axis is the product of its ancestors' sizes along it), and
 * a target-neutral memory layout shared by the CPU and CUDA runtimes. */
#include <stdarg.h>
#include <stdio.h>

#include "ir_internal.h"

static const char *const kind_names[] = {"root",    "dense",   "bitmasked",
                                         "pointer", "dynamic", "place"};

const char *fb_snode_kind_name(fb_snode_kind k) {
  return (unsigned)k <= FB_SN_PLACE ? kind_names[k] : "?";
}

static int new_node(fb_layout *l, fb_snode_kind kind, int parent, const char *name) {
  if (FB_GROW(l->nodes, l->nnodes, l->cap)) return FB_ENOMEM;
  fb_snode *s = &l->nodes[l->nnodes];
  memset(s, 0, sizeof *s);
  s->id = l->nnodes;
  s->kind = kind;
  s->parent = parent;
  for (int a = 0; a < FB_MAX_AXES; a++) s->size[a] = 1;
  if (name && !(s->name = fb__strdup(name))) return FB_ENOMEM;
  if (parent >= 0) {
    fb_snode *p = &l->nodes[parent];
    int *c = realloc(p->children, sizeof(int) * (size_t)(p->nchildren + 1));
    if (!c) {
      free(s->name);
      return FB_ENOMEM;
    }
    c[p->nchildren++] = s->id;
    p->children = c;
  }
  l->finalized = 0;
  return l->nnodes++;
}

fb_layout *fb_layout_new(void) {
  fb_layout *l = calloc(1, sizeof *l);
  if (!l) return NULL;
  if (new_node(l, FB_SN_ROOT, -1, NULL) < 0) {
    free(l);
    return NULL;
  }
  return l;
}

void fb_layout_free(fb_layout *l) {
  if (!l) return;
  for (int i = 0; i < l->nnodes; i++) {
    free(l->nodes[i].name);
    free(l->nodes[i].children);
  }
  free(l->nodes);
  free(l);
}

fb_layout *fb_layout_clone(const fb_layout *l) {
  fb_layout *c = calloc(1, sizeof *c);
  if (!c) return NULL;
  c->nodes = calloc((size_t)l->nnodes, sizeof *c->nodes);
  if (!c->nodes) {
    free(c);
    return NULL;
  }
  c->nnodes = c->cap = l->nnodes;
  c->finalized = l->finalized;
  c->root_bytes = l->root_bytes;
  for (int i = 0; i < l->nnodes; i++) {
    fb_snode *d = &c->nodes[i];
    *d = l->nodes[i];
    d->name = fb__strdup(l->nodes[i].name);
    d->children = d->nchildren ? malloc(sizeof(int) * (size_t)d->nchildren) : NULL;
    if ((l->nodes[i].name && !d->name) || (d->nchildren && !d->children)) {
      c->nnodes = i + 1;
      fb_layout_free(c);
      return NULL;
    }
    if (d->nchildren) memcpy(d->children, l->nodes[i].children, sizeof(int) * (size_t)d->nchildren);
  }
  return c;
}

static int axis_of(char c) { return c >= 'i' && c <= 'l' ? c - 'i' : -1; }

int fb_layout_add(fb_layout *l, int parent, fb_snode_kind kind, const char *axes,
                  const int64_t *sizes, int64_t chunk, const char *name) {
  if (!l || parent < 0 || parent >= l->nnodes || !axes) return FB_EINVAL;
  if (kind == FB_SN_ROOT || kind == FB_SN_PLACE) return FB_EINVAL;
  if (l->nodes[parent].kind == FB_SN_PLACE) return FB_EINVAL;
  size_t na = strlen(axes);
  if (na == 0 || na > FB_MAX_AXES) return FB_EINVAL;
  unsigned mask = 0;
  for (size_t d = 0; d < na; d++) {
    int a = axis_of(axes[d]);
    if (a < 0 || (mask & (1u << a)) || sizes[d] <= 0) return FB_EINVAL;
    mask |= 1u << a;
  }
  if (kind == FB_SN_DYNAMIC && (na != 1 || chunk <= 0 || chunk > sizes[0])) return FB_EINVAL;
  int id = new_node(l, kind, parent, name);
  if (id < 0) return id;
  fb_snode *s = &l->nodes[id];
  s->axes = mask;
  for (size_t d = 0; d < na; d++) s->size[axis_of(axes[d])] = sizes[d];
  s->chunk = kind == FB_SN_DYNAMIC ? chunk : 0;
  return id;
}

int fb_layout_place(fb_layout *l, int parent, const char *name, fb_type t) {
  if (!l || parent < 0 || parent >= l->nnodes || !name || !*name) return FB_EINVAL;
  if (l->nodes[parent].kind == FB_SN_PLACE || t == FB_T_VOID || (unsigned)t >= FB_T__COUNT)
    return FB_EINVAL;
  int id = new_node(l, FB_SN_PLACE, parent, name);
  if (id < 0) return id;
  l->nodes[id].type = t;
  return id;
}

int fb_layout_find(const fb_layout *l, const char *name) {
  for (int i = 0; i < l->nnodes; i++)
    if (l->nodes[i].name && strcmp(l->nodes[i].name, name) == 0) return i;
  return -1;
}

/* Checked arithmetic on sizes: each returns 1 when the result would pass
 * FB_LAYOUT_MAX_BYTES (or wrap), leaving *out unspecified. */
static int size_mul(uint64_t a, uint64_t b, uint64_t *out) {
  return __builtin_mul_overflow(a, b, out) || *out > FB_LAYOUT_MAX_BYTES;
}

static int size_add(uint64_t a, uint64_t b, uint64_t *out) {
  return __builtin_add_overflow(a, b, out) || *out > FB_LAYOUT_MAX_BYTES;
}

static uint64_t align_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; } /* x, a < 2^56 */

/* Storage of one instance of s inside its parent cell. Sparse kinds keep
 * their metadata in front of the cells:
 *   bitmasked: one u32 mask word per 32 cells, then the cells;
 *   pointer:   one 8-byte slot per cell (child cell storage is allocated);
 *   dynamic:   an 8-byte length, then one 8-byte chunk pointer per chunk.
 * Returns 1 when that passes FB_LAYOUT_MAX_BYTES. */
static int node_bytes(const fb_snode *s, uint64_t *out) {
  uint64_t cells = (uint64_t)s->ncells, data;
  switch (s->kind) {
  case FB_SN_PLACE: *out = fb_type_size(s->type); return 0;
  case FB_SN_DENSE: return size_mul(cells, s->cell_bytes, out);
  case FB_SN_BITMASKED:
    return size_mul(cells, s->cell_bytes, &data) ||
           size_add(align_up((cells + 31) / 32 * 4, 8), data, out);
  case FB_SN_POINTER: return size_mul(cells, 8, out);
  case FB_SN_DYNAMIC:
    *out = 8 + (cells + (uint64_t)s->chunk - 1) / (uint64_t)s->chunk * 8;
    return 0;
  default: *out = s->cell_bytes; return 0;
  }
}

static const char *label(const fb_snode *s) { return s->name ? s->name : ""; }

static int too_big(const fb_snode *s, const char *what, char *err, size_t errlen) {
  fb_errf(err, errlen, "SNode %d (%s%s%s): %s over the limit of 2^56", s->id,
          fb_snode_kind_name(s->kind), s->name ? " " : "", label(s), what);
  return FB_EINVAL;
}

/* Index space and cell count of s from its parent's, with every extent and
 * product checked (sizes are positive, but any int64 may come in). */
static int node_space(fb_layout *l, fb_snode *s, char *err, size_t errlen) {
  const fb_snode *p = s->parent >= 0 ? &l->nodes[s->parent] : NULL;
  uint64_t cells = 1;
  s->space_axes = (p ? p->space_axes : 0) | s->axes;
  for (int a = 0; a < FB_MAX_AXES; a++) {
    uint64_t shape;
    if (s->size[a] < 1 || s->size[a] > INT32_MAX ||
        __builtin_mul_overflow((uint64_t)(p ? p->shape[a] : 1), (uint64_t)s->size[a], &shape) ||
        shape > INT32_MAX) {
      fb_errf(err, errlen, "SNode %d (%s%s%s): extent %s along axis %c exceeds 2^31-1", s->id,
              fb_snode_kind_name(s->kind), s->name ? " " : "", label(s),
              s->size[a] < 1 ? "(a size below 1)" : "of its index space", 'i' + a);
      return FB_EINVAL;
    }
    s->shape[a] = (int64_t)shape;
    if (size_mul(cells, (uint64_t)s->size[a], &cells))
      return too_big(s, "its cell count is", err, errlen);
  }
  s->ncells = (int64_t)cells;
  s->ndim = 0;
  for (int a = 0; a < FB_MAX_AXES; a++)
    if (s->space_axes & (1u << a)) s->dim_axis[s->ndim++] = a;
  return 0;
}

/* A field's whole extent (what host reads and writes stage) must fit too. */
static int field_extent(const fb_snode *s, char *err, size_t errlen) {
  uint64_t bytes = fb_type_size(s->type);
  for (int d = 0; d < s->ndim; d++)
    if (size_mul(bytes, (uint64_t)s->shape[s->dim_axis[d]], &bytes))
      return too_big(s, "the field's extent in bytes is", err, errlen);
  return 0;
}

/* A dynamic SNode's lists are the cells of its parent, named by every index
 * but the dynamic's own axis; so that axis must not be split above it, or no
 * indices name a list (append and length could not address one). */
static int dynamic_axis_fresh(const fb_layout *l, const fb_snode *s, char *err, size_t errlen) {
  if (s->kind != FB_SN_DYNAMIC || s->parent < 0) return 0;
  unsigned above = l->nodes[s->parent].space_axes & s->axes;
  if (!above) return 0;
  int a = 0;
  while (!(above & (1u << a))) a++;
  int by = s->parent;
  while (by > 0 && l->nodes[l->nodes[by].parent].space_axes & (1u << a)) by = l->nodes[by].parent;
  fb_errf(err, errlen,
          "dynamic SNode %d%s%s splits axis %c, already split above it by SNode %d: "
          "a dynamic's axis must be split by nothing else on its path",
          s->id, s->name ? " " : "", label(s), 'i' + a, by);
  return FB_EINVAL;
}

static int finalize_node(fb_layout *l, int id, char *err, size_t errlen) {
  fb_snode *s = &l->nodes[id];
  int rc = node_space(l, s, err, errlen);
  if (!rc) rc = dynamic_axis_fresh(l, s, err, errlen);
  if (rc) return rc;
  if (s->kind == FB_SN_PLACE) {
    s->cell_bytes = 0;
    node_bytes(s, &s->node_bytes);
    return field_extent(s, err, errlen);
  }
  if (s->kind != FB_SN_ROOT && s->nchildren == 0) {
    fb_errf(err, errlen, "%s SNode%s%s holds no fields", fb_snode_kind_name(s->kind),
            s->name ? " " : "", s->name ? s->name : "");
    return FB_EINVAL;
  }
  uint64_t off = 0, maxalign = 1;
  for (int c = 0; c < s->nchildren; c++) {
    int cid = s->children[c];
    if (s->kind == FB_SN_DYNAMIC && l->nodes[cid].kind != FB_SN_PLACE) {
      fb_errf(err, errlen, "dynamic SNode%s%s may hold only fields", s->name ? " " : "",
              s->name ? s->name : "");
      return FB_EINVAL;
    }
    int rc = finalize_node(l, cid, err, errlen);
    if (rc) return rc;
    fb_snode *ch = &l->nodes[cid];
    uint64_t al = ch->kind == FB_SN_PLACE ? (ch->node_bytes ? ch->node_bytes : 1) : 8;
    off = align_up(off, al);
    ch->offset = off;
    if (size_add(off, ch->node_bytes, &off))
      return too_big(s, "one cell's size in bytes is", err, errlen);
    if (al > maxalign) maxalign = al;
  }
  s = &l->nodes[id]; /* children never reallocate nodes, but stay safe */
  s->cell_bytes = align_up(off, maxalign);
  if (node_bytes(s, &s->node_bytes)) return too_big(s, "its storage in bytes is", err, errlen);
  return 0;
}

/* Depth of every node, without recursion (a parent's id is below its
 * children's), so that the recursive walk below is bounded. */
static int check_shape(fb_layout *l, char *err, size_t errlen) {
  if (l->nnodes > FB_LAYOUT_MAX_NODES) {
    fb_errf(err, errlen, "the layout has %d SNodes; at most %d are allowed", l->nnodes,
            FB_LAYOUT_MAX_NODES);
    return FB_EINVAL;
  }
  l->nodes[0].depth = 0;
  for (int i = 1; i < l->nnodes; i++) {
    fb_snode *s = &l->nodes[i];
    if (s->parent < 0 || s->parent >= i) {
      fb_errf(err, errlen, "SNode %d: parent %d is not an earlier SNode", i, s->parent);
      return FB_EINVAL;
    }
    s->depth = l->nodes[s->parent].depth + 1;
    if (s->depth > FB_LAYOUT_MAX_DEPTH) {
      fb_errf(err, errlen,
              "SNode %d (%s%s%s) sits %d levels below the root; at most %d are "
              "allowed",
              i, fb_snode_kind_name(s->kind), s->name ? " " : "", label(s), s->depth,
              FB_LAYOUT_MAX_DEPTH);
      return FB_EINVAL;
    }
  }
  return 0;
}

int fb_layout_finalize(fb_layout *l, char *err, size_t errlen) {
  if (!l || l->nnodes < 1) return FB_EINVAL;
  l->finalized = 0;
  int rc = check_shape(l, err, errlen);
  if (!rc) rc = finalize_node(l, 0, err, errlen);
  if (rc) return rc;
  l->root_bytes = l->nodes[0].cell_bytes;
  l->finalized = 1;
  return 0;
}

int fb_layout_path(const fb_layout *l, int node, int *out, int max) {
  int n = 0;
  for (int s = l->nodes[node].parent; s > 0; s = l->nodes[s].parent) n++;
  if (n > max) return FB_EINVAL;
  int i = n;
  for (int s = l->nodes[node].parent; s > 0; s = l->nodes[s].parent) out[--i] = s;
  return n;
}

int64_t fb_layout_stride(const fb_layout *l, int s, int leaf, int axis) {
  int64_t st = 1;
  if (s == leaf) return 1;
  for (int c = l->nodes[leaf].parent; c > 0 && c != s; c = l->nodes[c].parent)
    st *= l->nodes[c].size[axis];
  if (l->nodes[leaf].kind != FB_SN_PLACE) st *= l->nodes[leaf].size[axis];
  return st;
}

int64_t fb_field_numel(const fb_layout *l, int place) {
  const fb_snode *s = &l->nodes[place];
  int64_t n = 1;
  for (int d = 0; d < s->ndim; d++) n *= s->shape[s->dim_axis[d]];
  return n;
}

uint64_t fb_layout_dense_offset(const fb_layout *l, int place, const int64_t *idx) {
  const fb_snode *f = &l->nodes[place];
  int64_t gi[FB_MAX_AXES] = {0, 0, 0, 0};
  for (int d = 0; d < f->ndim; d++) gi[f->dim_axis[d]] = idx[d];
  int path[64];
  int n = fb_layout_path(l, place, path, 64);
  uint64_t off = 0;
  for (int p = 0; p < n; p++) {
    const fb_snode *s = &l->nodes[path[p]];
    int64_t lin = 0;
    for (int a = 0; a < FB_MAX_AXES; a++) {
      if (!(s->axes & (1u << a))) continue;
      int64_t local = gi[a] / fb_layout_stride(l, s->id, place, a) % s->size[a];
      lin = lin * s->size[a] + local;
    }
    off += s->offset + (uint64_t)lin * s->cell_bytes;
  }
  return off + f->offset;
}

uint64_t fb_layout_hash(const fb_layout *l) {
  uint64_t h = FB_FNV_INIT;
  for (int i = 0; i < l->nnodes; i++) {
    const fb_snode *s = &l->nodes[i];
    int64_t rec[8] = {s->kind,    s->parent,  s->axes,    s->size[0],
                      s->size[1], s->size[2], s->size[3], s->chunk};
    h = fb__fnv(h, rec, sizeof rec);
    h = fb__fnv(h, &s->type, sizeof s->type);
    if (s->name) h = fb__fnv(h, s->name, strlen(s->name) + 1);
  }
  return fb__mix64(h);
}
