/* Building new task IR for the passes: fusing two tasks, demoting
 * activations, removing dead writes, dead code. Inputs are banked (never
 * modified): each function works on a clone and returns a compacted
 * kernel, which the caller verifies (in check mode) and adopts into the
 * bank. See sfg.h for what each transformation promises. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "optimizer/sfg.h"

/* ---------------------------------------------------------------- helpers */

static int push_stmt(fb_kernel *k, const fb_stmt *s) {
  if (FB_GROW(k->stmts, k->nstmts, k->cap)) return FB_ENOMEM;
  k->stmts[k->nstmts] = *s;
  return k->nstmts++;
}

static int push_block(fb_kernel *k) { return fb_block_new(k); }

/* Replace block b's id list with ids[0..n). */
static int set_block(fb_kernel *k, int b, const int32_t *ids, int n) {
  int32_t *p = malloc(sizeof *p * (size_t)(n ? n : 1));
  if (!p) return FB_ENOMEM;
  if (n) memcpy(p, ids, sizeof *p * (size_t)n);
  free(k->blocks[b].ids);
  k->blocks[b].ids = p;
  k->blocks[b].n = k->blocks[b].cap = n;
  return 0;
}

static fb_stmt rand_seq(int64_t d) {
  fb_stmt s;
  memset(&s, 0, sizeof s);
  s.op = FB_OP_RAND_SEQ;
  s.type = FB_T_VOID;
  s.snode = -1;
  s.imm.i = d;
  s.body = s.orelse = -1;
  for (int j = 0; j < FB_MAX_ARGS; j++) s.args[j] = -1;
  return s;
}

static fb_kernel *finish(fb_kernel *c) {
  fb_kernel *r = c ? fb_kernel_compact(c) : NULL;
  fb_kernel_free(c);
  return r;
}

static int is_atomic(int op) {
  int cls = fb_op_table[op].cls;
  return cls == FB_OPC_ATOMIC || cls == FB_OPC_IATOMIC;
}

static int is_store(int op) { return op == FB_OP_STORE || op == FB_OP_STORE_NA; }

/* ---------------------------------------------------------------- uses */

static void count_block(const fb_kernel *k, int blk, int32_t *uses, int depth) {
  if (blk < 0 || blk >= k->nblocks || depth > FB_MAX_BLOCK_DEPTH) return;
  const fb_block *b = &k->blocks[blk];
  for (int i = 0; i < b->n; i++) {
    const fb_stmt *s = &k->stmts[b->ids[i]];
    for (int a = 0; a < s->nargs; a++)
      if (s->args[a] >= 0 && s->args[a] < k->nstmts) uses[s->args[a]]++;
    count_block(k, s->body, uses, depth + 1);
    count_block(k, s->orelse, uses, depth + 1);
  }
}

int32_t *fb_ir_use_counts(const fb_kernel *k) {
  int32_t *u = calloc((size_t)k->nstmts + 1, sizeof *u);
  if (u) count_block(k, 0, u, 0);
  return u;
}

/* ---------------------------------------------------------------- dead code */

static int dead_removable(const fb_kernel *k, int id) {
  const fb_stmt *s = &k->stmts[id];
  int fl = fb_op_table[s->op].flags;
  if (fl & FB_OPF_BLOCK) {
    /* an empty serial range loop does nothing (and always terminates) */
    return s->op == FB_OP_RANGE_FOR && k->blocks[s->body].n == 0;
  }
  if (fl & FB_OPF_PURE) return 1;
  switch (s->op) {
  case FB_OP_LLOAD:
  case FB_OP_ALLOCA:
  case FB_OP_GTMP_LOAD: return 1;
  /* an unused is_active stays: demotion leaves it to order the task with
     the writers of the mask it proved something about */
  case FB_OP_LOAD:
  case FB_OP_LENGTH: return fb_access_inbounds(k, id);
  default: return 0;
  }
}

static int dce_block(fb_kernel *k, int blk, const int32_t *uses, int depth) {
  if (blk < 0 || blk >= k->nblocks || depth > FB_MAX_BLOCK_DEPTH) return 0;
  fb_block *b = &k->blocks[blk];
  int w = 0, removed = 0;
  for (int i = 0; i < b->n; i++) {
    int id = b->ids[i];
    const fb_stmt *s = &k->stmts[id];
    removed += dce_block(k, s->body, uses, depth + 1);
    removed += dce_block(k, s->orelse, uses, depth + 1);
    if (uses[id] == 0 && dead_removable(k, id)) {
      removed++;
      continue;
    }
    b->ids[w++] = id;
  }
  b->n = w;
  return removed;
}

int fb_ir_dce(fb_kernel *k) {
  int total = 0;
  for (int round = 0; round < 64; round++) {
    int32_t *u = fb_ir_use_counts(k);
    if (!u) return total;
    int r = dce_block(k, 0, u, 0);
    free(u);
    if (!r) break;
    total += r;
  }
  return total;
}

/* ---------------------------------------------------------------- fusion */

static char *fused_name(const char *a, const char *b) {
  a = a ? a : "task";
  b = b ? b : "task";
  size_t na = strlen(a), nb = strlen(b);
  if (na + nb + 2 > 120) {
    size_t keep = na > 100 ? 100 : na;
    char *s = malloc(keep + 6);
    if (s) snprintf(s, keep + 6, "%.*s+more", (int)keep, a);
    return s;
  }
  char *s = malloc(na + nb + 2);
  if (s) snprintf(s, na + nb + 2, "%s+%s", a, b);
  return s;
}

/* Append b's statements and blocks to f, remapped; returns 0 or FB_ENOMEM. */
static int append_kernel(fb_kernel *f, const fb_kernel *b, int so, int bo, int na, int po,
                         int64_t delta) {
  for (int i = 0; i < b->nstmts; i++) {
    fb_stmt s = b->stmts[i];
    s.part += po;
    for (int a = 0; a < s.nargs; a++)
      if (s.args[a] >= 0) s.args[a] += so;
    if (s.body >= 0) s.body += bo;
    if (s.orelse >= 0) s.orelse += bo;
    if (s.op == FB_OP_ARG) s.imm.i += na;
    if (s.op == FB_OP_RAND_SEQ) s.imm.i += delta;
    if (push_stmt(f, &s) < 0) return FB_ENOMEM;
  }
  for (int i = 0; i < b->nblocks; i++) {
    int nb = push_block(f);
    if (nb < 0) return FB_ENOMEM;
    const fb_block *src = &b->blocks[i];
    int32_t *ids = malloc(sizeof *ids * (size_t)(src->n ? src->n : 1));
    if (!ids) return FB_ENOMEM;
    for (int j = 0; j < src->n; j++) ids[j] = src->ids[j] + so;
    int rc = set_block(f, nb, ids, src->n);
    free(ids);
    if (rc) return rc;
  }
  return 0;
}

/* dst = [seqa?] + first + [seqb?] + second */
static int join_blocks(fb_kernel *f, int dst, const int32_t *x, int nx, const int32_t *y, int ny,
                       int seqa, int seqb) {
  int32_t *ids = malloc(sizeof *ids * (size_t)(nx + ny + 2));
  if (!ids) return FB_ENOMEM;
  int n = 0;
  if (seqa >= 0) ids[n++] = seqa;
  for (int i = 0; i < nx; i++) ids[n++] = x[i];
  if (seqb >= 0) ids[n++] = seqb;
  for (int i = 0; i < ny; i++) ids[n++] = y[i];
  int rc = set_block(f, dst, ids, n);
  free(ids);
  return rc;
}

static int32_t *copy_ids(const fb_block *b, int skip, int *n) {
  int32_t *ids = malloc(sizeof *ids * (size_t)(b->n ? b->n : 1));
  *n = 0;
  if (!ids) return NULL;
  for (int i = 0; i < b->n; i++)
    if (b->ids[i] != skip) ids[(*n)++] = b->ids[i];
  return ids;
}

static int fuse_parallel(fb_kernel *f, const fb_task_meta *ma, const fb_task_meta *mb, int so,
                         int bo, int seqa, int seqb) {
  int la = ma->loop, lb = mb->loop + so;
  for (int i = so; i < f->nstmts; i++)
    if (f->stmts[i].op == FB_OP_LOOP_INDEX && f->stmts[i].args[0] == lb) f->stmts[i].args[0] = la;
  int npa = 0, npb = 0, nba = 0, nbb = 0;
  int32_t *pa = copy_ids(&f->blocks[0], la, &npa), *pb = copy_ids(&f->blocks[bo], lb, &npb);
  int body_a = f->stmts[la].body, body_b = f->stmts[lb].body;
  int32_t *ba = copy_ids(&f->blocks[body_a], -1, &nba),
          *bb = copy_ids(&f->blocks[body_b], -1, &nbb);
  int rc = (pa && pb && ba && bb) ? 0 : FB_ENOMEM;
  if (!rc) {
    /* block 0: A's invariants, B's invariants, the loop */
    int32_t *pre = realloc(pa, sizeof *pre * (size_t)(npa + npb + 1));
    if (!pre) rc = FB_ENOMEM;
    else {
      pa = pre;
      memcpy(pa + npa, pb, sizeof *pb * (size_t)npb);
      pa[npa + npb] = la;
      rc = set_block(f, 0, pa, npa + npb + 1);
    }
  }
  if (!rc) rc = join_blocks(f, body_a, ba, nba, bb, nbb, seqa, seqb);
  free(pa);
  free(pb);
  free(ba);
  free(bb);
  return rc;
}

static int starts_with_seq(const fb_kernel *k, int blk) {
  return k->blocks[blk].n > 0 && k->stmts[k->blocks[blk].ids[0]].op == FB_OP_RAND_SEQ;
}

fb_kernel *fb_ir_fuse(const fb_kernel *a, const fb_task_meta *ma, int aparts, const fb_kernel *b,
                      const fb_task_meta *mb, int64_t delta) {
  fb_kernel *f = fb_kernel_clone(a);
  if (!f) return NULL;
  char *name = fused_name(a->name, b->name);
  fb_type *params = realloc(f->params, sizeof *params * (size_t)(a->nparams + b->nparams + 1));
  if (!name || !params) {
    free(name);
    if (params) f->params = params;
    fb_kernel_free(f);
    return NULL;
  }
  free(f->name);
  f->name = name;
  f->params = params;
  for (int i = 0; i < b->nparams; i++) f->params[a->nparams + i] = b->params[i];
  f->nparams = a->nparams + b->nparams;
  if (f->ret == FB_T_VOID) f->ret = b->ret;
  int so = f->nstmts, bo = f->nblocks, par = ma->loop >= 0;
  int brand = (mb->tflags & FB_TF_RAND) != 0, arand = (ma->tflags & FB_TF_RAND) != 0;
  int rc = append_kernel(f, b, so, bo, a->nparams, aparts, delta);
  int body_a = par ? f->stmts[ma->loop].body : 0;
  int seqa = -1, seqb = -1;
  if (!rc && brand && arand && !starts_with_seq(f, body_a)) {
    fb_stmt s = rand_seq(0);
    seqa = push_stmt(f, &s);
  }
  if (!rc && brand) {
    fb_stmt s = rand_seq(delta);
    seqb = push_stmt(f, &s);
  }
  if (!rc && (seqa == FB_ENOMEM || seqb == FB_ENOMEM)) rc = FB_ENOMEM;
  if (!rc && par) rc = fuse_parallel(f, ma, mb, so, bo, seqa, seqb);
  if (!rc && !par) {
    int na = 0, nb = 0;
    int32_t *x = copy_ids(&f->blocks[0], -1, &na), *y = copy_ids(&f->blocks[bo], -1, &nb);
    rc = x && y ? join_blocks(f, 0, x, na, y, nb, seqa, seqb) : FB_ENOMEM;
    free(x);
    free(y);
  }
  if (rc) {
    fb_kernel_free(f);
    return NULL;
  }
  return finish(f);
}

/* ---------------------------------------------------------------- demotion */

fb_kernel *fb_ir_demote(const fb_kernel *k, const int32_t *stmts, int n) {
  fb_kernel *c = fb_kernel_clone(k);
  if (!c) return NULL;
  for (int i = 0; i < n; i++) {
    int id = stmts[i];
    if (id < 0 || id >= c->nstmts) continue;
    fb_stmt *s = &c->stmts[id];
    if (s->op == FB_OP_STORE) s->op = FB_OP_STORE_NA;
    else if (s->op >= FB_OP_ATOMIC_ADD && s->op <= FB_OP_ATOMIC_XOR)
      s->op = (uint16_t)(FB_OP_ATOMIC_ADD_NA + (s->op - FB_OP_ATOMIC_ADD));
    else if (s->op == FB_OP_ACTIVATE) {
      /* keep reading the mask: the proof holds only where the task reads
         the version it was made for, so the task must stay ordered with
         the mask's writers; an unused is_active does just that */
      s->op = FB_OP_IS_ACTIVE;
      s->type = FB_T_BOOL;
    }
  }
  return finish(c);
}

/* ---------------------------------------------------------------- dead writes */

static int key_in(const uint32_t *keys, int n, uint32_t key) {
  for (int i = 0; i < n; i++)
    if (keys[i] == key) return 1;
  return 0;
}

static void strip_block(fb_kernel *k, int blk, const uint32_t *keys, int n, const int32_t *uses,
                        int depth) {
  if (blk < 0 || depth > FB_MAX_BLOCK_DEPTH) return;
  fb_block *b = &k->blocks[blk];
  int w = 0;
  for (int i = 0; i < b->n; i++) {
    int id = b->ids[i];
    fb_stmt *s = &k->stmts[id];
    strip_block(k, s->body, keys, n, uses, depth + 1);
    strip_block(k, s->orelse, keys, n, uses, depth + 1);
    int drop = 0;
    if ((is_store(s->op) || is_atomic(s->op)) && key_in(keys, n, FB_SKEY(FB_SK_VALUE, s->snode))) {
      /* an atomic whose old value is used reads back the state: the pass
         never asks for those (FB_AF_NOREADBACK), and they stay */
      drop = is_store(s->op) || uses[id] == 0;
    } else if (s->op == FB_OP_GTMP_STORE && key_in(keys, n, FB_SKEY(FB_SK_GTMP, s->imm.i / 8))) {
      drop = 1;
    }
    if (!drop) b->ids[w++] = id;
  }
  b->n = w;
}

fb_kernel *fb_ir_remove_writes(const fb_kernel *k, const uint32_t *keys, int n) {
  fb_kernel *c = fb_kernel_clone(k);
  int32_t *uses = c ? fb_ir_use_counts(c) : NULL;
  if (!uses) {
    fb_kernel_free(c);
    return NULL;
  }
  strip_block(c, 0, keys, n, uses, 0);
  free(uses);
  fb_ir_dce(c);
  return finish(c);
}
