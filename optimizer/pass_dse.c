/* Dead-store elimination (paper section 5.4). A task's write of a value or
 * gtmp state is dead when the next access to that state is a write that
 * overwrites everything the first one wrote without reading the state:
 * the whole state (FB_AF_FULL), or the same iteration domain (same range,
 * or the same struct_for list version) when every write of the first task
 * sits at the loop indices and the second stores there unconditionally.
 * The latest write of a state is never dead. Only writes with no other
 * effect (no activation), provably in bounds (no FB_EBOUNDS report is
 * lost) and never read back by the task itself are removed. A task left with no write at all (and no while loop,
 * every access in bounds) is deleted; so is any such task from the start. */
#include <stdlib.h>
#include <string.h>

#include "optimizer/sfg.h"

static int same_domain(const fb_sfg_node *w, const fb_sfg_node *x) {
  if (w->m->kind != x->m->kind) return 0;
  if (w->m->kind == FB_TASK_RANGE_FOR)
    return w->range_ok && x->range_ok && w->rbegin == x->rbegin && w->rend == x->rend;
  if (w->m->kind == FB_TASK_STRUCT_FOR)
    return w->m->iter == x->m->iter && w->list_ver == x->list_ver;
  return 0;
}

/* Is the write by lane entry j of state s dead? */
static int dead_write(const fb_sfg *g, const fb_sfg_state *s, int j) {
  const fb_sfg_node *w = g->nodes[s->lane[j].node];
  int wa = s->lane[j].acc;
  if (!(w->eff[wa] & FB_ACC_WRITE) || j + 1 >= s->nlane) return 0;
  uint32_t wf = w->eflags[wa];
  if (!(wf & FB_AF_REMOVABLE) || !(wf & FB_AF_INB) || !(wf & FB_AF_NOREADBACK)) return 0;
  const fb_sfg_node *x = g->nodes[s->lane[j + 1].node];
  int xa = s->lane[j + 1].acc;
  if (!(x->eff[xa] & FB_ACC_WRITE) || (x->m->acc[xa].mode & FB_ACC_READ)) return 0;
  uint32_t xf = x->eflags[xa];
  if (xf & FB_AF_FULL) return 1;
  return (xf & FB_AF_COVER) && (wf & FB_AF_WLOOP) && same_domain(w, x);
}

/* A task whose only effects are its writes (and `writes_too` says whether
 * those count): no possible endless loop, no bounds report to lose. */
static int effect_free(const fb_sfg_node *n, int writes_too) {
  const fb_task_meta *m = n->m;
  if (m->kind != FB_TASK_SERIAL && m->kind != FB_TASK_RANGE_FOR && m->kind != FB_TASK_STRUCT_FOR)
    return 0;
  if ((m->tflags & FB_TF_WHILE) || !n->all_inb) return 0;
  for (int i = 0; i < m->nacc && writes_too; i++)
    if (m->acc[i].mode & FB_ACC_WRITE) return 0;
  return 1;
}

static int cmp_u32(const void *a, const void *b) {
  uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
  return x < y ? -1 : x > y;
}

/* The IR without the writes of keys[0..nk) (sorted), memoized. */
static int strip(fb_pass_ctx *c, fb_sfg_node *n, const uint32_t *keys, int nk) {
  int64_t *key = malloc(sizeof *key * (size_t)(nk + 2));
  if (!key) return FB_ENOMEM;
  key[0] = FB_MEMO_DSE;
  key[1] = n->ir;
  for (int i = 0; i < nk; i++) key[2 + i] = keys[i];
  fb_irh h = fb_pass_memo_get(c, key, nk + 2);
  int rc = 0;
  if (h == FB_IRH_NONE)
    rc = fb_pass_memo_put(c, key, nk + 2, fb_ir_remove_writes(fb_bank_ir(c->bank, n->ir), keys, nk),
                          &h);
  free(key);
  if (!rc) n->reshaped = 1;
  return rc ? rc : fb_sfg_node_set_ir(n, c->bank, h);
}

/* Remove node n's dead writes keys[0..nk); delete it when nothing is left. */
static int apply(fb_pass_ctx *c, fb_sfg_node *n, uint32_t *keys, int nk) {
  int writes = 0;
  for (int i = 0; i < n->m->nacc; i++) writes += (n->m->acc[i].mode & FB_ACC_WRITE) != 0;
  c->cnt->dead_stores += (uint64_t)nk;
  if (nk == writes && effect_free(n, 0)) {
    n->dead = 1;
    c->cnt->tasks_deleted++;
    return 0;
  }
  qsort(keys, (size_t)nk, sizeof *keys, cmp_u32);
  int rc = strip(c, n, keys, nk);
  if (!rc && effect_free(n, 1)) {
    n->dead = 1;
    c->cnt->tasks_deleted++;
  }
  return rc;
}

int fb_pass_dse(fb_pass_ctx *c) {
  fb_sfg *g = c->g;
  int total = 0, changes = 0, rc = 0;
  for (int i = g->nret; i < g->n; i++) total += g->nodes[i]->m->nacc;
  uint32_t *keys = malloc(sizeof *keys * (size_t)(total ? total : 1));
  int *off = calloc((size_t)(g->n + 1), sizeof *off),
      *cnt = calloc((size_t)(g->n + 1), sizeof *cnt);
  if (!keys || !off || !cnt) {
    rc = FB_ENOMEM;
    goto done;
  }
  for (int i = g->nret, o = 0; i < g->n; i++) {
    off[i] = o;
    o += g->nodes[i]->m->nacc;
  }
  for (int s = 0; s < g->nst; s++) {
    const fb_sfg_state *st = &g->st[s];
    int kind = FB_SKEY_KIND(st->key);
    if (kind != FB_SK_VALUE && kind != FB_SK_GTMP) continue;
    for (int j = 0; j < st->nlane; j++) {
      if (!dead_write(g, st, j)) continue;
      int ni = st->lane[j].node;
      keys[off[ni] + cnt[ni]++] = st->key;
    }
  }
  for (int i = g->nret; i < g->n && !rc; i++) {
    fb_sfg_node *n = g->nodes[i];
    if (n->dead || n->host) continue;
    if (cnt[i]) {
      rc = apply(c, n, keys + off[i], cnt[i]);
      changes++;
    } else if (effect_free(n, 1)) {
      n->dead = 1;
      c->cnt->tasks_deleted++;
      changes++;
    }
  }
  if (!rc && changes) rc = fb_sfg_rebuild(g, c->bank, NULL, 0);
done:
  free(keys);
  free(off);
  free(cnt);
  return rc ? rc : changes;
}
