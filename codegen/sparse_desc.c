/* Descriptors of the sparse device runtime (codegen/rt/fb_rt.h) computed
 * from a layout: the geometry of one SNode's list generation, and the
 * storage of a cell with the allocating SNodes nested in it (for
 * deactivation and gc). codegen/ bakes them into task modules as constant
 * arrays of i64; runtime/ uses them to size lists and allocators. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "codegen/codegen.h"

int fb_cg_is_sparse(fb_snode_kind k) {
  return k == FB_SN_BITMASKED || k == FB_SN_POINTER || k == FB_SN_DYNAMIC;
}

int fb_cg_sparse_parent(const fb_layout *l, int node) {
  for (int p = l->nodes[node].parent; p > 0; p = l->nodes[p].parent)
    if (fb_cg_is_sparse(l->nodes[p].kind)) return p;
  return 0;
}

int fb_cg_sparse_leaf(const fb_layout *l, int node) {
  for (int p = node; p > 0; p = l->nodes[p].parent)
    if (fb_cg_is_sparse(l->nodes[p].kind)) return p;
  return 0;
}

uint64_t fb_cg_block_bytes(const fb_layout *l, int s) {
  const fb_snode *n = &l->nodes[s];
  if (n->kind == FB_SN_POINTER) return n->cell_bytes;
  if (n->kind == FB_SN_DYNAMIC) return (uint64_t)n->chunk * n->cell_bytes;
  return 0;
}

uint64_t fb_cg_mask_bytes(const fb_snode *n) {
  return n->kind == FB_SN_BITMASKED ? n->node_bytes - (uint64_t)n->ncells * n->cell_bytes : 0;
}

#if defined(__GNUC__)
__attribute__((format(printf, 3, 4)))
#endif
static int
fail(char *err, size_t errlen, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fb_verrf(err, errlen, fmt, ap);
  va_end(ap);
  return FB_EUNSUPPORTED;
}

int fb_cg_listgen_desc(const fb_layout *l, int p, fb_rt_lg *d, char *err, size_t errlen) {
  memset(d, 0, sizeof *d);
  const fb_snode *n = &l->nodes[p];
  if (!fb_cg_is_sparse(n->kind))
    return fail(err, errlen, "SNode %d is not sparse (kind %d): it has no list", p, (int)n->kind);
  int q = fb_cg_sparse_parent(l, p);
  int lev[FB_RT_MAX_LEVELS + 1], nlev = 0;
  for (int c = n->parent; c > q; c = l->nodes[c].parent) {
    if (nlev == FB_RT_MAX_LEVELS)
      return fail(err, errlen, "SNode %d: more than %d dense levels above it", p, FB_RT_MAX_LEVELS);
    lev[nlev++] = c;
  }
  d->snode = p;
  d->kind = n->kind;
  d->parent = q;
  d->nlev = nlev;
  d->ninst = 1;
  for (int i = 0; i < nlev; i++) { /* outermost first */
    const fb_snode *c = &l->nodes[lev[nlev - 1 - i]];
    d->lev_off[i] = (int64_t)c->offset;
    d->lev_cb[i] = (int64_t)c->cell_bytes;
    d->lev_ncells[i] = c->ncells;
    for (int a = 0; a < 4; a++) d->lev_size[i][a] = c->size[a];
    d->ninst *= c->ncells;
  }
  d->p_off = (int64_t)n->offset;
  d->p_ncells = n->ncells;
  d->p_cb = (int64_t)n->cell_bytes;
  d->p_mask_bytes = (int64_t)fb_cg_mask_bytes(n);
  d->p_chunk = n->kind == FB_SN_DYNAMIC ? n->chunk : 0;
  for (int a = 0; a < 4; a++) d->p_size[a] = n->size[a];
  int64_t piece = 4096; /* a multiple of 32: pieces never share a mask word */
  d->chunk_cells = n->ncells < piece ? n->ncells : piece;
  d->nchunks = (n->ncells + d->chunk_cells - 1) / d->chunk_cells;
  return 0;
}

/* Groups of the allocating SNodes under container c (inside one cell of
 * the SNode the walk started from), through dense and bitmasked levels. */
static int add_groups(const fb_layout *l, int c, fb_rt_cell *d, fb_rt_group *path, int depth,
                      char *err, size_t errlen) {
  const fb_snode *n = &l->nodes[c];
  for (int k = 0; k < n->nchildren; k++) {
    const fb_snode *ch = &l->nodes[n->children[k]];
    if (ch->kind == FB_SN_PLACE) continue;
    if (ch->kind == FB_SN_POINTER || ch->kind == FB_SN_DYNAMIC) {
      if (d->ngroups == FB_RT_MAX_GROUPS)
        return fail(err, errlen, "SNode %d holds more than %d pointer or dynamic SNodes",
                    (int)d->snode, FB_RT_MAX_GROUPS);
      fb_rt_group *g = &d->g[d->ngroups++];
      *g = *path;
      g->snode = ch->id;
      g->kind = ch->kind;
      g->nlev = depth;
      g->off = (int64_t)ch->offset;
      g->slot_off = ch->kind == FB_SN_DYNAMIC ? 8 : 0;
      g->nslots = ch->kind == FB_SN_DYNAMIC ? (ch->ncells + ch->chunk - 1) / ch->chunk : ch->ncells;
      continue;
    }
    if (depth == FB_RT_MAX_LEVELS)
      return fail(err, errlen, "SNode %d: sparse SNodes nested more than %d levels deep",
                  (int)d->snode, FB_RT_MAX_LEVELS);
    path->pre[depth] = (int64_t)(ch->offset + fb_cg_mask_bytes(ch));
    path->count[depth] = ch->ncells;
    path->stride[depth] = (int64_t)ch->cell_bytes;
    int rc = add_groups(l, ch->id, d, path, depth + 1, err, errlen);
    if (rc) return rc;
  }
  return 0;
}

int fb_cg_cell_desc(const fb_layout *l, int s, fb_rt_cell *d, char *err, size_t errlen) {
  memset(d, 0, sizeof *d);
  const fb_snode *n = &l->nodes[s];
  if (!fb_cg_is_sparse(n->kind))
    return fail(err, errlen, "SNode %d is not sparse (kind %d)", s, (int)n->kind);
  d->snode = s;
  d->kind = n->kind;
  d->bytes = n->kind == FB_SN_DYNAMIC ? (int64_t)fb_cg_block_bytes(l, s) : (int64_t)n->cell_bytes;
  if (n->kind == FB_SN_DYNAMIC) return 0; /* chunks hold only fields */
  fb_rt_group path;
  memset(&path, 0, sizeof path);
  return add_groups(l, s, d, &path, 0, err, errlen);
}
