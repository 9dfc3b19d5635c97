/* The state-flow graph (paper section 4): tasks are nodes, states are
 * edges. Each state keeps its latest owner (writer) and the readers of that
 * version; inserting a task walks its accesses once: a read adds a flow
 * edge from the owner, a write a write-after-write edge from the owner (when
 * it does not read) and a write-after-read edge from each reader, so an
 * insertion costs time proportional to its edges. Node order is a
 * topological order; passes change the window and call fb_sfg_rebuild,
 * which re-inserts the window in order (reconstruction invariance: any
 * topological order rebuilds the same graph). After a flush fb_sfg_collect
 * keeps only the latest owners, as retained roots of the next window, and
 * up to FB_SFG_MASK_HISTORY earlier writers of each mask while they only
 * activate (twins for activation demotion).
 * Versions are the serial numbers of the writers (0: the initial state). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "base/strbuf.h"
#include "optimizer/sfg.h"

int fb_sfg_init(fb_sfg *g, const fb_layout *l) {
  memset(g, 0, sizeof *g);
  fb_map_init(&g->smap, sizeof(int32_t));
  g->l = l;
  size_t n = (size_t)(FB_SK_RET * l->nnodes);
  g->sid_of = malloc(sizeof *g->sid_of * n);
  if (!g->sid_of) return FB_ENOMEM;
  memset(g->sid_of, 0xff, sizeof *g->sid_of * n);
  g->next_serial = 1;
  g->next_order = 1;
  return 0;
}

void fb_sfg_node_free(fb_sfg_node *n, fb_bank *bank) {
  if (!n) return;
  fb_bank_unref(bank, n->ir);
  fb_bank_unref(bank, n->orig);
  for (int i = 0; i < n->ncerts; i++) fb_bank_unref(bank, n->certs[i].orig);
  for (int i = 0; i < n->nparts; i++) fb_bank_unref(bank, n->parts[i].orig);
  free(n->parts);
  if (n->host) fb_meta_free((fb_task_meta *)n->m);
  free(n->args);
  free(n->ver); /* the block that holds vorder, eflags and eff too */
  free(n->certs);
  free(n->in);
  free(n->out);
  free(n);
}

void fb_sfg_fini(fb_sfg *g, fb_bank *bank) {
  for (int i = 0; i < g->n; i++) fb_sfg_node_free(g->nodes[i], bank);
  for (int i = 0; i < g->nst; i++) {
    free(g->st[i].readers);
    free(g->st[i].lane);
  }
  free(g->nodes);
  free(g->st);
  free(g->sid_of);
  free(g->sid_misc);
  fb_map_free(&g->smap);
  memset(g, 0, sizeof *g);
}

/* ---------------------------------------------------------------- states */

int fb_sfg_state_id(fb_sfg *g, uint32_t key) {
  int kind = FB_SKEY_KIND(key), idx = FB_SKEY_INDEX(key);
  int32_t *slot;
  if (kind < FB_SK_RET) {
    if (idx >= g->l->nnodes) return -1;
    slot = &g->sid_of[kind * g->l->nnodes + idx];
  } else {
    int m = idx * 2 + (kind == FB_SK_GTMP);
    if (m >= g->nmisc) {
      int nm = m + 16;
      int32_t *p = realloc(g->sid_misc, sizeof *p * (size_t)nm);
      if (!p) return -1;
      for (int i = g->nmisc; i < nm; i++) p[i] = -1;
      g->sid_misc = p;
      g->nmisc = nm;
    }
    slot = &g->sid_misc[m];
  }
  if (*slot >= 0) return *slot;
  if (FB_GROW(g->st, g->nst, g->capst)) return -1;
  fb_sfg_state *s = &g->st[g->nst];
  memset(s, 0, sizeof *s);
  s->key = key;
  s->owner = s->base_owner = -1;
  return *slot = g->nst++;
}

/* ---------------------------------------------------------------- serials */

/* Index node idx by its serial; 0 or FB_ENOMEM. */
static int smap_add(fb_sfg *g, int idx) {
  int32_t *v = fb_map_put(&g->smap, g->nodes[idx]->serial, NULL);
  if (!v) return FB_ENOMEM;
  *v = idx;
  return 0;
}

/* Re-index every node (after the array changed); 0 or FB_ENOMEM. */
static int smap_rebuild(fb_sfg *g) {
  fb_map_clear(&g->smap);
  if (fb_map_reserve(&g->smap, (size_t)g->n)) return FB_ENOMEM;
  for (int i = 0; i < g->n; i++) smap_add(g, i); /* reserved: cannot fail */
  return 0;
}

/* ---------------------------------------------------------------- nodes */

int fb_sfg_node_resolve(fb_sfg_node *n, const fb_kernel *k) {
  const fb_task_meta *m = n->m;
  size_t na = (size_t)(m->nacc ? m->nacc : 1);
  /* The four per-access arrays share one allocation (ver first: it is the
   * one freed): an insert on a cache-hit stream made four calls to malloc and
   * four to free for them, a fifth of the async engine's time per task. */
  free(n->ver);
  n->eflags = NULL;
  n->eff = NULL;
  n->vorder = NULL;
  n->cont = NULL;
  if (na > SIZE_MAX / 64) return FB_ENOMEM;
  uint8_t *blk = calloc(1, na * (3 * sizeof(uint64_t) + sizeof(uint32_t) + 1));
  n->ver = (uint64_t *)blk;
  if (!blk) return FB_ENOMEM;
  n->vorder = n->ver + na;
  n->cont = n->vorder + na;
  n->eflags = (uint32_t *)(n->cont + na);
  n->eff = (uint8_t *)(n->eflags + na);
  n->range_ok = 0;
  n->rbegin = n->rend = 0;
  if (m->kind == FB_TASK_RANGE_FOR && k)
    n->range_ok = fb_eval_int(k, m->begin, n->args, n->nargs, &n->rbegin) == 0 &&
                  fb_eval_int(k, m->end, n->args, n->nargs, &n->rend) == 0;
  return 0;
}

/* Fill the resolved flags once the range is known. */
static void resolve_flags(fb_sfg_node *n) {
  const fb_task_meta *m = n->m;
  int fits = n->range_ok && (n->rend <= n->rbegin || n->rbegin >= 0);
  for (int i = 0; i < m->nacc; i++) {
    const fb_meta_acc *a = &m->acc[i];
    uint32_t f = a->flags & ~(uint32_t)(FB_AF_FULL_IFRANGE | FB_AF_INB_IFRANGE);
    if ((a->flags & FB_AF_FULL_IFRANGE) && n->range_ok && n->rbegin == 0 && n->rend == a->ext)
      f |= FB_AF_FULL;
    if ((a->flags & FB_AF_INB_IFRANGE) && fits && (n->rend <= n->rbegin || n->rend <= a->ext))
      f |= FB_AF_INB;
    n->eflags[i] = f;
    uint8_t e = a->mode;
    if ((e & FB_ACC_WRITE) && !(f & FB_AF_FULL)) e |= FB_ACC_READ;
    n->eff[i] = e;
  }
  n->all_inb = (m->tflags & FB_TF_INB) || ((m->tflags & FB_TF_INB_IFRANGE) && fits &&
                                           (n->rend <= n->rbegin || n->rend <= m->inb_ext));
}

static int add_edge(fb_sfg *g, int src, int dst, int sid, int kind) {
  fb_sfg_node *a = g->nodes[src], *b = g->nodes[dst];
  if (FB_GROW(a->out, a->nout, a->capout) || FB_GROW(b->in, b->nin, b->capin)) return FB_ENOMEM;
  a->out[a->nout++] = (fb_sfg_edge){dst, sid, (uint8_t)kind};
  b->in[b->nin++] = (fb_sfg_edge){src, sid, (uint8_t)kind};
  return 0;
}

/* Record node n's accesses in the states and add its edges. */
static int add_edges(fb_sfg *g, fb_sfg_node *n) {
  const fb_task_meta *m = n->m;
  int me = n->index;
  n->list_ver = 0;
  for (int i = 0; i < m->nacc; i++) {
    int sid = fb_sfg_state_id(g, m->acc[i].key);
    if (sid < 0) return FB_ENOMEM;
    fb_sfg_state *s = &g->st[sid];
    uint8_t e = n->eff[i];
    n->ver[i] = s->owner_ver;
    n->vorder[i] = s->owner_order;
    n->cont[i] = s->owner_cont;
    if (m->acc[i].key == m->list_key) n->list_ver = s->owner_ver;
    if (e & FB_ACC_READ) {
      if (s->owner >= 0 && add_edge(g, s->owner, me, sid, FB_EDGE_FLOW)) return FB_ENOMEM;
      if (FB_GROW(s->readers, s->nreaders, s->capreaders)) return FB_ENOMEM;
      s->readers[s->nreaders++] = me;
    }
    if (e & FB_ACC_WRITE) {
      if (!(e & FB_ACC_READ) && s->owner >= 0 && add_edge(g, s->owner, me, sid, FB_EDGE_WAW))
        return FB_ENOMEM;
      for (int r = 0; r < s->nreaders; r++)
        if (s->readers[r] != me && add_edge(g, s->readers[r], me, sid, FB_EDGE_WAR))
          return FB_ENOMEM;
      s->owner = me;
      s->owner_ver = n->serial;
      s->owner_order = n->order;
      s->owner_cont = n->serial;
      if (FB_SKEY_KIND(s->key) == FB_SK_MASK && (n->eflags[i] & FB_AF_CLEAR)) s->cleared = 1;
      s->nreaders = 0;
    }
    if (FB_GROW(s->lane, s->nlane, s->caplane)) return FB_ENOMEM;
    s->lane[s->nlane++] = (fb_sfg_lane_ent){me, i};
  }
  return 0;
}

int fb_sfg_append(fb_sfg *g, fb_sfg_node *n) {
  if (FB_GROW(g->nodes, g->n, g->cap)) return FB_ENOMEM;
  resolve_flags(n);
  n->index = g->n;
  n->order = g->next_order++;
  g->nodes[g->n++] = n;
  int rc = add_edges(g, n);
  if (!rc) rc = smap_add(g, n->index);
  if (rc) g->nodes[--g->n] = NULL;
  return rc;
}

int fb_sfg_node_set_ir(fb_sfg_node *n, fb_bank *bank, fb_irh h) {
  const fb_task_meta *m = fb_bank_meta(bank, h);
  if (!m) {
    fb_bank_unref(bank, h);
    return FB_ENOMEM;
  }
  fb_bank_unref(bank, n->ir);
  n->ir = h;
  n->m = m;
  n->simplified = 0;
  n->demote_done = 0;
  int rc = fb_sfg_node_resolve(n, fb_bank_ir(bank, h));
  if (!rc) resolve_flags(n);
  return rc;
}

fb_sfg_node *fb_sfg_find_serial(const fb_sfg *g, uint64_t serial) {
  const int32_t *x = serial ? fb_map_get(&g->smap, serial) : NULL;
  if (!x || *x >= g->n || g->nodes[*x]->serial != serial) return NULL;
  return g->nodes[*x]->dead ? NULL : g->nodes[*x];
}

/* ---------------------------------------------------------------- rebuild */

static void reset_states(fb_sfg *g) {
  for (int i = 0; i < g->nst; i++) {
    fb_sfg_state *s = &g->st[i];
    s->owner = s->base_owner;
    s->owner_ver = s->base_ver;
    s->owner_order = s->base_order;
    s->owner_cont = s->base_cont;
    s->nreaders = 0;
    s->nlane = 0;
  }
  for (int i = 0; i < g->n; i++) g->nodes[i]->nin = g->nodes[i]->nout = 0;
}

int fb_sfg_rebuild(fb_sfg *g, fb_bank *bank, fb_sfg_node **order, int norder) {
  int w = g->nret;
  if (order) {
    for (int i = g->nret; i < g->n; i++)
      if (g->nodes[i]->dead) fb_sfg_node_free(g->nodes[i], bank);
    for (int i = 0; i < norder; i++) g->nodes[w++] = order[i];
  } else {
    for (int i = g->nret; i < g->n; i++) {
      if (g->nodes[i]->dead) fb_sfg_node_free(g->nodes[i], bank);
      else g->nodes[w++] = g->nodes[i];
    }
  }
  g->n = w;
  if (smap_rebuild(g)) return FB_ENOMEM;
  reset_states(g);
  for (int i = g->nret; i < g->n; i++) {
    fb_sfg_node *n = g->nodes[i];
    n->index = i;
    n->order = g->next_order++;
    resolve_flags(n);
    int rc = add_edges(g, n);
    if (rc) return rc;
  }
  return 0;
}

/* The writer of the version of mask `key` that node w read or overwrote,
 * when both only activate cells of it (neither clears any); else NULL. */
static const fb_sfg_node *earlier_activator(const fb_sfg *g, const fb_sfg_node *w,
                                            uint32_t key) {
  const fb_meta_acc *a = fb_meta_find(w->m, key);
  if (!a || (a->flags & FB_AF_CLEAR)) return NULL;
  const fb_sfg_node *p = fb_sfg_find_serial(g, w->ver[a - w->m->acc]);
  if (!p || p->host) return NULL;
  const fb_meta_acc *pa = fb_meta_find(p->m, key);
  return pa && !(pa->flags & FB_AF_CLEAR) ? p : NULL;
}

void fb_sfg_mark_kept(const fb_sfg *g, int *keep) {
  for (int i = 0; i < g->n; i++) keep[i] = 0;
  for (int i = 0; i < g->nst; i++) {
    const fb_sfg_state *s = &g->st[i];
    if (s->owner < 0) continue;
    keep[s->owner] = 1;
    if (FB_SKEY_KIND(s->key) != FB_SK_MASK) continue;
    /* the mask's earlier writers, while each only activates: a later
     * launch of the same task finds its twin among them (pass_demote.c)
     * when launches alternate (MacCormack's two instantiations both
     * write qt) */
    const fb_sfg_node *w = g->nodes[s->owner];
    for (int d = 0; d < FB_SFG_MASK_HISTORY && w; d++)
      if ((w = earlier_activator(g, w, s->key))) keep[w->index] = 1;
  }
}

int fb_sfg_collect(fb_sfg *g, fb_bank *bank) {
  int *keep = calloc((size_t)(g->n ? g->n : 1), sizeof *keep);
  if (!keep) return FB_ENOMEM;
  fb_sfg_mark_kept(g, keep);
  int w = 0;
  for (int i = 0; i < g->n; i++) {
    fb_sfg_node *n = g->nodes[i];
    if (!keep[i]) {
      fb_sfg_node_free(n, bank);
      keep[i] = -1;
      continue;
    }
    keep[i] = w;
    n->retained = 1;
    n->index = w;
    n->nin = n->nout = 0;
    g->nodes[w++] = n;
  }
  g->n = g->nret = w;
  if (smap_rebuild(g)) {
    free(keep);
    return FB_ENOMEM;
  }
  for (int i = 0; i < g->nst; i++) {
    fb_sfg_state *s = &g->st[i];
    s->base_owner = s->owner >= 0 ? keep[s->owner] : -1;
    s->base_ver = s->owner_ver;
    s->base_order = s->owner_order;
    s->base_cont = s->owner_cont;
    s->owner = s->base_owner;
    s->nreaders = s->nlane = 0;
  }
  free(keep);
  return 0;
}

int fb_sfg_forget(fb_sfg *g, fb_bank *bank) {
  int nret = g->nret;
  for (int i = 0; i < nret; i++) fb_sfg_node_free(g->nodes[i], bank);
  memmove(g->nodes, g->nodes + nret, sizeof *g->nodes * (size_t)(g->n - nret));
  g->n -= nret;
  g->nret = 0;
  for (int i = 0; i < g->nst; i++) {
    fb_sfg_state *s = &g->st[i];
    s->base_owner = -1; /* base_ver and base_cont stay: serials of no node now */
    s->obs_valid = 0;
  }
  return fb_sfg_rebuild(g, bank, NULL, 0); /* the window's edges and versions anew */
}

/* ---------------------------------------------------------------- names */

static const char *sn_label(const fb_layout *l, int s, char *buf, size_t n) {
  if (s < 0 || s >= l->nnodes) return "?";
  if (l->nodes[s].name) return l->nodes[s].name;
  snprintf(buf, n, "%s#%d", fb_snode_kind_name(l->nodes[s].kind), s);
  return buf;
}

void fb_sfg_state_name(const fb_layout *l, uint32_t key, char *buf, size_t n) {
  char tmp[64];
  int idx = FB_SKEY_INDEX(key);
  switch (FB_SKEY_KIND(key)) {
  case FB_SK_VALUE: snprintf(buf, n, "%s", sn_label(l, idx, tmp, sizeof tmp)); break;
  case FB_SK_MASK: snprintf(buf, n, "mask(%s)", sn_label(l, idx, tmp, sizeof tmp)); break;
  case FB_SK_LIST: snprintf(buf, n, "list(%s)", sn_label(l, idx, tmp, sizeof tmp)); break;
  case FB_SK_ALLOC: snprintf(buf, n, "alloc(%s)", sn_label(l, idx, tmp, sizeof tmp)); break;
  case FB_SK_RET: snprintf(buf, n, "ret[%d]", idx); break;
  default: snprintf(buf, n, "gtmp[%d]", idx * 8); break;
  }
}

/* ---------------------------------------------------------------- text */

static int edge_cmp(const void *x, const void *y) {
  const fb_sfg_edge *a = x, *b = y;
  if (a->node != b->node) return a->node < b->node ? -1 : 1;
  if (a->state != b->state) return a->state < b->state ? -1 : 1;
  return (int)a->kind - (int)b->kind;
}

static const char *const edge_names[] = {"flow", "waw", "war"};

static void node_title(const fb_sfg *g, fb_bank *bank, const fb_sfg_node *n, fb_sb *b) {
  char tmp[64];
  const fb_kernel *k = fb_bank_ir(bank, n->ir);
  if (n->host) {
    fb_sb_printf(b, "host write");
    return;
  }
  fb_sb_printf(b, "%s %s", fb_task_kind_name(n->m->kind), k && k->name ? k->name : "?");
  if (n->m->snode >= 0) fb_sb_printf(b, " over %s", sn_label(g->l, n->m->snode, tmp, sizeof tmp));
}

char *fb_sfg_text(const fb_sfg *g, fb_bank *bank) {
  fb_sb b = {0};
  char name[96];
  for (int i = 0; i < g->n; i++) {
    const fb_sfg_node *n = g->nodes[i];
    fb_sb_printf(&b, "%s%d ", n->retained ? "r" : "t", i);
    node_title(g, bank, n, &b);
    if (!n->host) {
      fb_sb_printf(&b, " launch %llu", (unsigned long long)n->launch);
      if (n->ntasks > 1) fb_sb_printf(&b, " tasks %d", n->ntasks);
      if (n->nargs) {
        fb_sb_printf(&b, " args");
        for (int a = 0; a < n->nargs; a++) fb_sb_printf(&b, " %llu", (unsigned long long)n->args[a]);
      }
    }
    fb_sb_printf(&b, "\n");
    fb_sfg_edge *in = malloc(sizeof *in * (size_t)(n->nin ? n->nin : 1));
    if (!in) {
      b.oom = 1;
      break;
    }
    if (n->nin) {
      memcpy(in, n->in, sizeof *in * (size_t)n->nin);
      qsort(in, (size_t)n->nin, sizeof *in, edge_cmp);
    }
    for (int e = 0; e < n->nin; e++) {
      fb_sfg_state_name(g->l, g->st[in[e].state].key, name, sizeof name);
      const fb_sfg_node *s = g->nodes[in[e].node];
      fb_sb_printf(&b, "  <- %s%d %s %s\n", s->retained ? "r" : "t", in[e].node, name,
                edge_names[in[e].kind]);
    }
    free(in);
  }
  return fb_sb_done(&b);
}

char *fb_sfg_dot(const fb_sfg *g, fb_bank *bank, const char *title) {
  fb_sb b = {0};
  char name[96];
  static const char *const style[] = {"color=black", "color=red, style=bold",
                                      "color=gray50, style=dashed"};
  fb_sb_printf(&b, "digraph sfg {\n  rankdir=TB;\n  node [shape=box, fontname=\"monospace\"];\n");
  if (title) fb_sb_printf(&b, "  label=\"%s\";\n  labelloc=t;\n", title);
  for (int i = 0; i < g->n; i++) {
    const fb_sfg_node *n = g->nodes[i];
    fb_sb_printf(&b, "  n%d [label=\"", i);
    node_title(g, bank, n, &b);
    fb_sb_printf(&b, "\\n#%llu", (unsigned long long)n->serial);
    if (!n->host) fb_sb_printf(&b, " launch %llu", (unsigned long long)n->launch);
    if (n->ntasks > 1) fb_sb_printf(&b, " (%d tasks)", n->ntasks);
    fb_sb_printf(&b, "\"%s];\n", n->retained ? ", style=dashed, color=gray50" : "");
  }
  for (int i = 0; i < g->n; i++) {
    const fb_sfg_node *n = g->nodes[i];
    for (int e = 0; e < n->nout; e++) {
      fb_sfg_state_name(g->l, g->st[n->out[e].state].key, name, sizeof name);
      fb_sb_printf(&b, "  n%d -> n%d [label=\"%s\", %s];\n", i, n->out[e].node, name,
                style[n->out[e].kind]);
    }
  }
  fb_sb_printf(&b, "}\n");
  return fb_sb_done(&b);
}

/* ---------------------------------------------------------------- checker */

#if defined(__GNUC__)
__attribute__((format(printf, 3, 4)))
#endif
static int
bad(char *err, size_t n, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fb_verrf(err, n, fmt, ap);
  va_end(ap);
  return FB_EINTERNAL;
}

/* Order, edge symmetry, and versions recomputed by a simulation. */
static int check_structure(fb_sfg *g, char *err, size_t errlen) {
  long nin = 0, nout = 0;
  for (int i = 0; i < g->n; i++) {
    const fb_sfg_node *n = g->nodes[i];
    if (n->index != i) return bad(err, errlen, "node %d has index %d", i, n->index);
    if ((i < g->nret) != !!n->retained)
      return bad(err, errlen, "node %d: retained out of place", i);
    if (n->dead) return bad(err, errlen, "node %d is dead but still in the graph", i);
    if (i > 0 && n->order <= g->nodes[i - 1]->order)
      return bad(err, errlen, "node %d: order stamps do not grow", i);
    for (int e = 0; e < n->nin; e++)
      if (n->in[e].node >= i)
        return bad(err, errlen, "edge %d -> %d goes backwards", n->in[e].node, i);
    nin += n->nin;
    nout += n->nout;
  }
  if (nin != nout) return bad(err, errlen, "%ld in-edges but %ld out-edges", nin, nout);
  for (int s = 0; s < g->nst; s++) {
    fb_sfg_state *st = &g->st[s];
    uint64_t ver = st->base_ver;
    int owner = st->base_owner;
    for (int i = 0; i < st->nlane; i++) {
      const fb_sfg_node *n = g->nodes[st->lane[i].node];
      int a = st->lane[i].acc;
      if (n->ver[a] != ver)
        return bad(err, errlen, "node %d reads version %llu of state %d, expected %llu", n->index,
                   (unsigned long long)n->ver[a], s, (unsigned long long)ver);
      if (n->eff[a] & FB_ACC_WRITE) {
        ver = n->serial;
        owner = n->index;
      }
    }
    if (owner != st->owner || ver != st->owner_ver)
      return bad(err, errlen, "state %d: owner %d, expected %d", s, st->owner, owner);
  }
  return 0;
}

typedef struct snap {
  fb_sfg_edge **in;
  int *nin;
  uint64_t **ver;
} snap;

static void snap_free(snap *s, int n) {
  for (int i = 0; i < n; i++) {
    if (s->in) free(s->in[i]);
    if (s->ver) free(s->ver[i]);
  }
  free(s->in);
  free(s->nin);
  free(s->ver);
}

static int snap_take(const fb_sfg *g, snap *s) {
  int n = g->n ? g->n : 1;
  s->in = calloc((size_t)n, sizeof *s->in);
  s->nin = calloc((size_t)n, sizeof *s->nin);
  s->ver = calloc((size_t)n, sizeof *s->ver);
  if (!s->in || !s->nin || !s->ver) return FB_ENOMEM;
  for (int i = 0; i < g->n; i++) {
    const fb_sfg_node *x = g->nodes[i];
    size_t na = (size_t)(x->m->nacc ? x->m->nacc : 1);
    s->in[i] = malloc(sizeof **s->in * (size_t)(x->nin ? x->nin : 1));
    s->ver[i] = malloc(sizeof **s->ver * na);
    if (!s->in[i] || !s->ver[i]) return FB_ENOMEM;
    if (x->nin) {
      memcpy(s->in[i], x->in, sizeof **s->in * (size_t)x->nin);
      qsort(s->in[i], (size_t)x->nin, sizeof **s->in, edge_cmp);
    }
    if (x->m->nacc) memcpy(s->ver[i], x->ver, sizeof **s->ver * (size_t)x->m->nacc);
    s->nin[i] = x->nin;
  }
  return 0;
}

/* Rebuilding from the current order must give the same graph. */
static int check_rebuild(fb_sfg *g, fb_bank *bank, char *err, size_t errlen) {
  snap s = {0};
  int rc = snap_take(g, &s);
  if (!rc) rc = fb_sfg_rebuild(g, bank, NULL, 0);
  for (int i = 0; !rc && i < g->n; i++) {
    fb_sfg_node *x = g->nodes[i];
    if (x->nin) qsort(x->in, (size_t)x->nin, sizeof *x->in, edge_cmp);
    int same = x->nin == s.nin[i];
    for (int e = 0; same && e < x->nin; e++) same = !edge_cmp(&x->in[e], &s.in[i][e]);
    if (!same)
      rc = bad(err, errlen, "node %d: edges differ after a rebuild (%d, were %d)", i, x->nin,
               s.nin[i]);
    else if (x->m->nacc && memcmp(x->ver, s.ver[i], sizeof *x->ver * (size_t)x->m->nacc))
      rc = bad(err, errlen, "node %d: versions differ after a rebuild", i);
  }
  if (rc == FB_ENOMEM) bad(err, errlen, "SFG check: out of memory");
  snap_free(&s, g->n);
  return rc;
}

int fb_sfg_check(fb_sfg *g, fb_bank *bank, char *err, size_t errlen) {
  int rc = check_structure(g, err, errlen);
  if (!rc) rc = check_rebuild(g, bank, err, errlen);
  if (!rc) rc = check_structure(g, err, errlen);
  return rc;
}
