/* Activation demotion (paper section 5.3), with a proof. An activating
 * access (a store or atomic on a sparse path, or activate) becomes a
 * non-activating one (store_na, atomic_*_na; activate is dropped) only when
 * its cell is certainly active already:
 *  - FB_ACT_SELF: it writes at the loop indices of a struct_for over the
 *    same cells, in a task that deactivates nothing: the list it iterates
 *    holds only active cells, and every struct_for reads its list's mask,
 *    so the list is current;
 *  - FB_ACT_PURE: its cell is a pure function of the loop indices, consts
 *    and args, under pure guards, and an earlier node carries a certificate
 *    of the same task (same IR as inserted, same argument values, the same
 *    list or one generated from the same mask and parent list, so the same
 *    cells were activated, or proven active, there),
 *    and every writer of each mask involved between that node and this one
 *    only activates (none clears cells): walked back along the versions.
 *    The earlier node may be one a flush kept as an earlier activating
 *    writer of a mask (fb_sfg_mark_kept): launches that alternate, each
 *    writing the same field, find their twin two flushes back.
 * Unlike the paper's code, nothing is demoted on similarity alone. */
#include <stdlib.h>
#include <string.h>

#include "optimizer/sfg.h"

static int acc_index(const fb_task_meta *m, uint32_t key) {
  const fb_meta_acc *a = fb_meta_find(m, key);
  return a ? (int)(a - m->acc) : -1;
}

/* Two list versions hold the same cells: the same version, or made by
 * listgens of one container from the same mask and parent list (what
 * list-generation removal would merge; demotion does not wait for it). */
static int same_list(const fb_sfg *g, uint64_t a, uint64_t b, int depth) {
  if (a == b) return 1;
  const fb_sfg_node *x = fb_sfg_find_serial(g, a), *y = fb_sfg_find_serial(g, b);
  if (!x || !y || depth > 32 || x->host || y->host || x->m->kind != FB_TASK_LISTGEN ||
      y->m->kind != FB_TASK_LISTGEN || x->m->snode != y->m->snode)
    return 0;
  for (int i = 0; i < x->m->nacc; i++) {
    uint32_t key = x->m->acc[i].key;
    int j = acc_index(y->m, key);
    if (j < 0) return 0;
    if (FB_SKEY_KIND(key) == FB_SK_MASK && x->cont[i] != y->cont[j]) return 0;
    if (FB_SKEY_KIND(key) == FB_SK_LIST && FB_SKEY_INDEX(key) != x->m->snode &&
        !same_list(g, x->ver[i], y->ver[j], depth + 1))
      return 0;
  }
  return 1;
}

/* An earlier node with a certificate matching node t's own. */
static const fb_sfg_node *find_twin(const fb_sfg *g, const fb_sfg_node *t) {
  const fb_sfg_cert *mine = &t->certs[0];
  for (int i = t->index - 1; i >= 0; i--) {
    const fb_sfg_node *u = g->nodes[i];
    if (u->dead || u->host || !same_list(g, u->list_ver, t->list_ver, 0)) continue;
    for (int c = 0; c < u->ncerts; c++) {
      const fb_sfg_cert *x = &u->certs[c];
      if (x->orig == mine->orig && x->nargs == mine->nargs &&
          !memcmp(u->args + x->argoff, t->args, sizeof *t->args * (size_t)t->nargs))
        return u;
    }
  }
  return NULL;
}

/* No writer of mask `key` between node `twin` and the version node t reads
 * clears cells. */
static int monotone_since(const fb_sfg *g, const fb_sfg_node *t, const fb_sfg_node *twin,
                          uint32_t key) {
  int a = acc_index(t->m, key);
  if (a < 0) return 0;
  uint64_t ver = t->ver[a], ord = t->vorder[a];
  for (int steps = 0; ord > twin->order; steps++) {
    const fb_sfg_node *w = fb_sfg_find_serial(g, ver);
    int wa = w ? acc_index(w->m, key) : -1;
    if (!w || wa < 0 || steps > g->n || (w->m->acc[wa].flags & FB_AF_CLEAR)) return 0;
    ver = w->ver[wa];
    ord = w->vorder[wa];
  }
  /* the twin itself may hold a part that clears cells (fused after the
     certified task, or before it): then nothing is proven */
  int ta = acc_index(twin->m, key);
  return ta < 0 || !(twin->m->acc[ta].flags & FB_AF_CLEAR);
}

/* The FB_ACT_PURE activations of t (IR k) are proven redundant. */
static int prove(const fb_sfg *g, const fb_sfg_node *t, const fb_kernel *k,
                 fb_opt_counters *cnt) {
  if (t->ntasks != 1 || t->ncerts != 1 || t->certs[0].orig != t->orig) return 0;
  const fb_sfg_node *twin = find_twin(g, t);
  if (!twin) return 0;
  for (int i = 0; i < t->m->nact; i++) {
    if (t->m->act_kind[i] != FB_ACT_PURE) continue;
    int path[32];
    int n = fb_sparse_path(g->l, k->stmts[t->m->act[i]].snode, path, 32);
    for (int p = 0; p < n; p++)
      if (!monotone_since(g, t, twin, FB_SKEY(FB_SK_MASK, path[p]))) return 0;
  }
  if (twin->retained) cnt->retained_proofs++; /* right only if twin's flush ran it */
  return 1;
}

static int cmp_i32(const void *a, const void *b) {
  int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
  return x < y ? -1 : x > y;
}

/* Demote node t's statements plan[0..n), memoized. */
static int demote(fb_pass_ctx *c, fb_sfg_node *t, int32_t *plan, int n) {
  qsort(plan, (size_t)n, sizeof *plan, cmp_i32);
  int64_t *key = malloc(sizeof *key * (size_t)(n + 2));
  if (!key) return FB_ENOMEM;
  key[0] = FB_MEMO_DEMOTE;
  key[1] = t->ir;
  for (int i = 0; i < n; i++) key[2 + i] = plan[i];
  fb_irh h = fb_pass_memo_get(c, key, n + 2);
  int rc = 0;
  if (h == FB_IRH_NONE)
    rc = fb_pass_memo_put(c, key, n + 2, fb_ir_demote(fb_bank_ir(c->bank, t->ir), plan, n), &h);
  free(key);
  if (!rc) t->demoted = 1;
  return rc ? rc : fb_sfg_node_set_ir(t, c->bank, h);
}

/* What can be proven in node t: its activating statements to demote,
 * into plan (room for m->nact); returns how many. */
static int plan_node(const fb_pass_ctx *c, fb_sfg_node *t, int32_t *plan) {
  const fb_task_meta *m = t->m;
  int n = 0, pure = 0;
  for (int i = 0; i < m->nact; i++) {
    if (m->act_kind[i] == FB_ACT_SELF) plan[n++] = m->act[i];
    pure += m->act_kind[i] == FB_ACT_PURE;
  }
  if (pure && prove(c->g, t, fb_bank_ir(c->bank, t->ir), c->cnt)) {
    for (int i = 0; i < m->nact; i++)
      if (m->act_kind[i] == FB_ACT_PURE) plan[n++] = m->act[i];
  }
  if (!pure && !n) t->demote_done = 1;
  return n;
}

/* Plans are made on the graph as it is, then applied together: demotion
 * only removes activation-only mask writes, so no proof made in this round
 * depends on a mask write another one removes. */
int fb_pass_demote(fb_pass_ctx *c) {
  fb_sfg *g = c->g;
  int total = 0, changed = 0, rc = 0;
  for (int i = g->nret; i < g->n; i++) total += g->nodes[i]->m->nact;
  if (!total) return 0;
  int32_t *plans = malloc(sizeof *plans * (size_t)total);
  int *cnt = calloc((size_t)g->n, sizeof *cnt), *off = calloc((size_t)g->n, sizeof *off);
  if (!plans || !cnt || !off) rc = FB_ENOMEM;
  for (int i = g->nret, o = 0; i < g->n && !rc; i++) {
    fb_sfg_node *t = g->nodes[i];
    off[i] = o;
    if (!t->dead && !t->host && !t->demote_done && t->m->nact) cnt[i] = plan_node(c, t, plans + o);
    o += t->m->nact;
  }
  for (int i = g->nret; i < g->n && !rc; i++) {
    if (!cnt[i]) continue;
    rc = demote(c, g->nodes[i], plans + off[i], cnt[i]);
    if (!rc) c->cnt->demoted += (uint64_t)cnt[i];
    changed++;
  }
  free(plans);
  free(cnt);
  free(off);
  if (!rc && changed) rc = fb_sfg_rebuild(g, c->bank, NULL, 0);
  return rc ? rc : changed;
}
