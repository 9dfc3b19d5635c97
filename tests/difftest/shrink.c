/* Shrinking a failing differential-test program: delete chunks of steps,
 * then kernels no step launches, then fields nothing names (with the
 * containers they leave empty), then statements of each kernel one by one
 * (a deletion that leaves IR the verifier refuses is skipped), then replace
 * value statements by constants (which frees their operands), and repeat
 * until nothing more can go while the configuration still disagrees with
 * the oracle. Deleting never introduces a race (the plan of every parallel
 * loop only loses accesses), and values that feed an index never become
 * constants, so the shrunk program stays in the exact class; the counter of
 * a while loop stays, so it still ends.
 * A candidate on which the oracle itself fails does not count as failing. */
#include <stdlib.h>
#include <string.h>

#include "dt.h"

typedef struct shr {
  dt_env *env;
  const dt_config *c;
  int checks, max;
} shr;

static int still_fails(shr *s, const dt_prog *p) {
  if (s->checks >= s->max) return 0;
  s->checks++;
  char msg[DT_ERRLEN];
  return dt_check(s->env, p, s->c, msg, sizeof msg) == 1;
}

/* Keep q in p when it still fails; otherwise drop q. */
static int keep_if_fails(shr *s, dt_prog *p, dt_prog *q) {
  if (still_fails(s, q)) {
    dt_prog_free(p);
    *p = *q;
    return 1;
  }
  dt_prog_free(q);
  return 0;
}

static int shrink_steps(shr *s, dt_prog *p) {
  int changed = 0;
  for (int chunk = p->nsteps / 2 > 0 ? p->nsteps / 2 : 1; chunk >= 1; chunk /= 2) {
    for (int end = p->nsteps; end > 0; end -= chunk) {
      int start = end - chunk < 0 ? 0 : end - chunk;
      if (end > p->nsteps) end = p->nsteps;
      dt_prog q;
      if (dt_prog_copy(p, &q)) return changed;
      memmove(&q.steps[start], &q.steps[end], sizeof *q.steps * (size_t)(q.nsteps - end));
      q.nsteps -= end - start;
      if (keep_if_fails(s, p, &q)) {
        changed = 1;
        end = start + chunk;
      }
    }
  }
  return changed;
}

static int shrink_kernels(shr *s, dt_prog *p) {
  int changed = 0;
  for (int k = p->nk - 1; k >= 0; k--) {
    int used = 0;
    for (int i = 0; i < p->nsteps; i++)
      used |= p->steps[i].kind == DT_LAUNCH && p->steps[i].kernel == k;
    if (used) continue;
    dt_prog q;
    if (dt_prog_copy(p, &q)) return changed;
    fb_kernel_free(q.ks[k]);
    memmove(&q.ks[k], &q.ks[k + 1], sizeof *q.ks * (size_t)(q.nk - k - 1));
    q.nk--;
    for (int i = 0; i < q.nsteps; i++)
      if (q.steps[i].kind == DT_LAUNCH && q.steps[i].kernel > k) q.steps[i].kernel--;
    changed |= keep_if_fails(s, p, &q);
  }
  return changed;
}

/* The statement owning block b (-1 for the body). */
static int block_owner(const fb_kernel *k, int b) {
  for (int i = 0; i < k->nstmts; i++)
    if (k->stmts[i].body == b || k->stmts[i].orelse == b) return i;
  return -1;
}

/* The counter of a generated while loop (gen_kernel.c s_while) must stay:
 * its body starts with  c = lload; K; c >= K; if { break }  and ends with
 * 1; c + 1; lstore. Without them the loop would never end. */
static int loop_control(const fb_kernel *k, int b, int pos) {
  int owner = block_owner(k, b);
  if (owner < 0) return 0;
  if (k->stmts[owner].op == FB_OP_WHILE) return pos < 4 || pos >= k->blocks[b].n - 3;
  if (k->stmts[owner].op != FB_OP_IF) return 0;
  int ob, opos = -1; /* the break of "if c >= K { break }" at position 3 of a while body */
  if ((ob = fb_kernel_block_of(k, owner, &opos)) < 0 || opos != 3) return 0;
  int w = block_owner(k, ob);
  return w >= 0 && k->stmts[w].op == FB_OP_WHILE;
}

/* Statements whose values feed an index of a global access (directly or
 * through other values): making one constant could make two iterations
 * touch one element and turn the program racy, so they stay. */
static void index_feeders(const fb_kernel *k, uint8_t *mark) {
  memset(mark, 0, (size_t)k->nstmts);
  for (int i = 0; i < k->nstmts; i++) {
    const fb_stmt *s = &k->stmts[i];
    if (fb_kernel_block_of(k, i, NULL) < 0) continue; /* deleted */
    const fb_op_info *oi = &fb_op_table[s->op];
    if (!(oi->flags & FB_OPF_SNODE) || oi->cls == FB_OPC_STRUCT || oi->cls == FB_OPC_LIST) continue;
    int nidx = s->nargs - (oi->cls == FB_OPC_GSTORE || oi->cls == FB_OPC_ATOMIC ||
                           oi->cls == FB_OPC_IATOMIC || oi->cls == FB_OPC_APPEND);
    if (oi->cls == FB_OPC_HINT) nidx = 1;
    for (int a = 0; a < nidx; a++)
      if (s->args[a] >= 0 && s->args[a] < k->nstmts) mark[s->args[a]] = 1;
  }
  for (int changed = 1; changed;) { /* operands of marked statements */
    changed = 0;
    for (int i = k->nstmts - 1; i >= 0; i--) {
      if (!mark[i]) continue;
      for (int a = 0; a < k->stmts[i].nargs; a++) {
        int x = k->stmts[i].args[a];
        if (x >= 0 && x < k->nstmts && !mark[x]) mark[x] = changed = 1;
      }
    }
  }
}

static int verifies(const fb_kernel *k) {
  fb_diags d;
  fb_diags_init(&d);
  int rc = fb_verify(k, &d);
  fb_diags_free(&d);
  return rc == 0;
}

/* Try deleting each statement of kernel ki, last ones first. */
static int shrink_stmts(shr *s, dt_prog *p, int ki) {
  int changed = 0;
  for (int b = p->ks[ki]->nblocks - 1; b >= 0; b--) {
    for (int pos = p->ks[ki]->blocks[b].n - 1; pos >= 0; pos--) {
      if (pos >= p->ks[ki]->blocks[b].n) continue;
      if (fb_kernel_block_of(p->ks[ki], p->ks[ki]->blocks[b].ids[pos], NULL) < 0) continue;
      if (loop_control(p->ks[ki], b, pos)) continue;
      dt_prog q;
      if (dt_prog_copy(p, &q)) return changed;
      fb_block *blk = &q.ks[ki]->blocks[b];
      memmove(&blk->ids[pos], &blk->ids[pos + 1], sizeof *blk->ids * (size_t)(blk->n - pos - 1));
      blk->n--;
      if (!verifies(q.ks[ki])) {
        dt_prog_free(&q);
        continue;
      }
      changed |= keep_if_fails(s, p, &q);
    }
  }
  return changed;
}

/* Can statement s become a constant of its type (cutting its operands loose)? */
static int constable(const fb_stmt *s) {
  if (s->type == FB_T_VOID || s->body >= 0) return 0;
  switch ((fb_op)s->op) {
  case FB_OP_CONST:
  case FB_OP_ALLOCA:
  case FB_OP_LOOP_INDEX: return 0;
  default: return 1;
  }
}

/* Try replacing each value statement of kernel ki by the constant 0. */
static int shrink_values(shr *s, dt_prog *p, int ki) {
  int changed = 0;
  uint8_t *feeds = malloc((size_t)p->ks[ki]->nstmts + 1);
  if (!feeds) return 0;
  index_feeders(p->ks[ki], feeds);
  for (int id = p->ks[ki]->nstmts - 1; id >= 0; id--) {
    int pos = -1, b;
    if (!constable(&p->ks[ki]->stmts[id]) || feeds[id]) continue;
    if ((b = fb_kernel_block_of(p->ks[ki], id, &pos)) < 0 || loop_control(p->ks[ki], b, pos))
      continue;
    dt_prog q;
    if (dt_prog_copy(p, &q)) return changed;
    fb_stmt *st = &q.ks[ki]->stmts[id];
    st->op = FB_OP_CONST;
    st->nargs = 0;
    st->snode = -1;
    st->imm.u = 0;
    if (!verifies(q.ks[ki])) {
      dt_prog_free(&q);
      continue;
    }
    if (keep_if_fails(s, p, &q)) { /* ids stay; the marks still hold */
      changed = 1;
      index_feeders(p->ks[ki], feeds);
    }
  }
  free(feeds);
  return changed;
}

/* ---------------------------------------------------------------- the layout */

static int node_used(const dt_prog *p, int node) {
  for (int i = 0; i < p->nsteps; i++)
    if (p->steps[i].kind != DT_LAUNCH && p->steps[i].kind != DT_FLUSH &&
        p->steps[i].kind != DT_SYNC && p->steps[i].field == node)
      return 1;
  for (int k = 0; k < p->nk; k++)
    for (int i = 0; i < p->ks[k]->nstmts; i++)
      if (p->ks[k]->stmts[i].snode == node && fb_kernel_block_of(p->ks[k], i, NULL) >= 0) return 1;
  return 0;
}

/* Copy the subtree of old node o (not dropped) under new node np. */
static int copy_nodes(const fb_layout *l, fb_layout *nl, int o, int np, const uint8_t *drop,
                      int *map) {
  const fb_snode *s = &l->nodes[o];
  for (int c = 0; c < s->nchildren; c++) {
    const fb_snode *ch = &l->nodes[s->children[c]];
    if (drop[ch->id]) continue;
    int id;
    if (ch->kind == FB_SN_PLACE) {
      id = fb_layout_place(nl, np, ch->name, ch->type);
    } else {
      char axes[FB_MAX_AXES + 1];
      int64_t sizes[FB_MAX_AXES];
      int n = 0;
      for (int a = 0; a < FB_MAX_AXES; a++)
        if (ch->axes & (1u << a)) {
          axes[n] = (char)('i' + a);
          sizes[n++] = ch->size[a];
        }
      axes[n] = 0;
      id = fb_layout_add(nl, np, ch->kind, axes, sizes, ch->chunk, ch->name);
    }
    if (id < 0) return id;
    map[ch->id] = id;
    if (ch->kind != FB_SN_PLACE && copy_nodes(l, nl, ch->id, id, drop, map) < 0) return -1;
  }
  return 0;
}

/* p without the dropped nodes, into q (SNode ids renumbered everywhere). */
static int without_nodes(const dt_prog *p, const uint8_t *drop, dt_prog *q) {
  int map[DT_MAXN * 2];
  for (int i = 0; i < DT_MAXN * 2; i++) map[i] = -1;
  map[0] = 0;
  memset(q, 0, sizeof *q);
  q->seed = p->seed;
  q->l = fb_layout_new();
  q->ks = calloc((size_t)p->nk + 1, sizeof *q->ks);
  q->steps = malloc(sizeof *q->steps * ((size_t)p->nsteps + 1));
  if (!q->l || !q->ks || !q->steps || p->l->nnodes > DT_MAXN * 2 ||
      copy_nodes(p->l, q->l, 0, 0, drop, map) < 0 || fb_layout_finalize(q->l, NULL, 0) != 0) {
    dt_prog_free(q);
    return -1;
  }
  for (int k = 0; k < p->nk; k++) {
    fb_kernel *c = fb_kernel_compact(p->ks[k]);
    q->ks[k] = c ? fb_kernel_clone_to(c, q->l) : NULL;
    fb_kernel_free(c);
    q->nk = k + 1;
    if (!q->ks[k]) {
      dt_prog_free(q);
      return -1;
    }
    for (int i = 0; i < q->ks[k]->nstmts; i++) {
      int32_t *sn = &q->ks[k]->stmts[i].snode;
      if (*sn >= 0 && (*sn >= p->l->nnodes || map[*sn] < 0)) {
        dt_prog_free(q);
        return -1;
      }
      if (*sn >= 0) *sn = map[*sn];
    }
  }
  memcpy(q->steps, p->steps, sizeof *p->steps * (size_t)p->nsteps);
  q->nsteps = p->nsteps;
  for (int i = 0; i < q->nsteps; i++)
    if (q->steps[i].kind != DT_LAUNCH && q->steps[i].kind != DT_FLUSH &&
        q->steps[i].kind != DT_SYNC)
      q->steps[i].field = map[q->steps[i].field];
  return 0;
}

/* Try dropping each field nothing names, with the containers it leaves empty. */
static int shrink_layout(shr *s, dt_prog *p) {
  int changed = 0;
  for (int f = p->l->nnodes - 1; f > 0; f--) {
    if (f >= p->l->nnodes || p->l->nodes[f].kind != FB_SN_PLACE || node_used(p, f)) continue;
    uint8_t drop[DT_MAXN * 2] = {0};
    if (p->l->nnodes > DT_MAXN * 2) return changed;
    drop[f] = 1;
    for (int c = p->l->nodes[f].parent; c > 0; c = p->l->nodes[c].parent) { /* emptied containers */
      int left = 0;
      for (int i = 0; i < p->l->nodes[c].nchildren; i++) left += !drop[p->l->nodes[c].children[i]];
      if (left || node_used(p, c)) break;
      drop[c] = 1;
    }
    dt_prog q;
    if (without_nodes(p, drop, &q) == 0 && keep_if_fails(s, p, &q)) changed = 1;
  }
  return changed;
}

int dt_shrink(dt_env *env, dt_prog *p, const dt_config *c, int max_checks) {
  shr s = {env, c, 0, max_checks};
  int changed = 1;
  while (changed && s.checks < s.max) {
    changed = shrink_steps(&s, p);
    changed |= shrink_kernels(&s, p);
    changed |= shrink_layout(&s, p);
    for (int k = 0; k < p->nk; k++) changed |= shrink_stmts(&s, p, k);
    for (int k = 0; k < p->nk; k++)
      if (shrink_values(&s, p, k)) {
        changed = 1;
        shrink_stmts(&s, p, k);
      }
  }
  return s.checks;
}
