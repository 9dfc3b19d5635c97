/* List-generation removal (paper section 5.2). A listgen task is
 * idempotent: given the same parent list version and the same mask
 * version it produces the same list. So a listgen L2 of container P whose
 * inputs are exactly those of the listgen L1 that produced P's current list
 * (the list P's clear_list C2 is about to overwrite) is removed together
 * with C2; rebuilding the graph rewires L2's readers to L1's list. L1 may
 * be a retained task of an earlier flush. Masks are compared by content id
 * (fb_sfg_node.cont): a later version of the mask that the engine observed
 * to leave every cell as it was (fb_opt_observe_mask) counts as the same. */
#include <stdio.h>

#include "optimizer/sfg.h"

static int acc_index(const fb_task_meta *m, uint32_t key) {
  const fb_meta_acc *a = fb_meta_find(m, key);
  return a ? (int)(a - m->acc) : -1;
}

/* Version of `key` that node n read (or overwrote); 0 with *ok = 0 when n
 * does not touch it. */
static uint64_t version(const fb_sfg_node *n, uint32_t key, int *ok) {
  int i = acc_index(n->m, key);
  *ok = i >= 0;
  return i >= 0 ? n->ver[i] : 0;
}

/* Content id of the version of `key` that node n read (see fb_sfg_node.cont). */
static uint64_t content(const fb_sfg_node *n, uint32_t key, int *ok) {
  int i = acc_index(n->m, key);
  *ok = i >= 0;
  return i >= 0 ? n->cont[i] : 0;
}

static int list_task(const fb_sfg_node *n, fb_task_kind kind, int p) {
  return n && !n->dead && !n->host && n->m->kind == kind && n->m->snode == p;
}

/* C2 only feeds L2: no other access to list(P) between them. */
static int adjacent(const fb_sfg *g, const fb_sfg_node *c2, const fb_sfg_node *l2, uint32_t key) {
  int sid = fb_sfg_state_id((fb_sfg *)g, key);
  if (sid < 0) return 0;
  const fb_sfg_state *s = &g->st[sid];
  for (int i = 0; i + 1 < s->nlane; i++)
    if (s->lane[i].node == c2->index) return s->lane[i + 1].node == l2->index;
  return 0;
}

static int removable(fb_sfg *g, fb_sfg_node *l2, fb_opt_counters *cnt) {
  int p = l2->m->snode, ok1 = 0, ok2 = 0, path[32];
  uint32_t lkey = FB_SKEY(FB_SK_LIST, p), mkey = FB_SKEY(FB_SK_MASK, p);
  fb_sfg_node *c2 = fb_sfg_find_serial(g, version(l2, lkey, &ok1));
  if (!ok1 || !list_task(c2, FB_TASK_CLEAR_LIST, p) || c2->retained) return 0;
  if (!adjacent(g, c2, l2, lkey)) return 0;
  fb_sfg_node *l1 = fb_sfg_find_serial(g, version(c2, lkey, &ok1));
  if (!ok1 || !list_task(l1, FB_TASK_LISTGEN, p)) return 0;
  /* the same mask: the same version, or one the engine observed unchanged */
  if (content(l1, mkey, &ok1) != content(l2, mkey, &ok2) || !ok1 || !ok2) return 0;
  int n = fb_sparse_path(g->l, g->l->nodes[p].parent, path, 32);
  if (n > 0) {
    uint32_t pkey = FB_SKEY(FB_SK_LIST, path[n - 1]);
    if (version(l1, pkey, &ok1) != version(l2, pkey, &ok2) || !ok1 || !ok2) return 0;
  }
  c2->dead = l2->dead = 1;
  if (l1->retained) cnt->retained_proofs++; /* right only if l1's flush ran it */
  return 1;
}

/* A clear_list (unfused: its one statement) of a list at version 0. */
static int clears_empty(fb_sfg_node *c) {
  int ok = 0;
  if (!list_task(c, FB_TASK_CLEAR_LIST, c->m->snode) || c->retained || c->ntasks != 1) return 0;
  uint64_t v = version(c, FB_SKEY(FB_SK_LIST, c->m->snode), &ok);
  if (!ok || v != 0) return 0;
  c->dead = 1;
  return 1;
}

int fb_pass_listgen(fb_pass_ctx *c) {
  fb_sfg *g = c->g;
  int removed = 0, clears = 0;
  for (int i = g->nret; i < g->n; i++) {
    fb_sfg_node *n = g->nodes[i];
    if (n->dead || n->host) continue;
    if (n->m->kind == FB_TASK_LISTGEN) removed += removable(g, n, c->cnt);
    else if (n->m->kind == FB_TASK_CLEAR_LIST) clears += clears_empty(n);
  }
  if (!removed && !clears) return 0;
  c->cnt->listgen_removed += (uint64_t)removed;
  c->cnt->clears_removed += (uint64_t)clears;
  int rc = fb_sfg_rebuild(g, c->bank, NULL, 0);
  return rc ? rc : removed + clears;
}
