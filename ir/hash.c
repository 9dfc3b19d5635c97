/* Structural identity of kernels: hash, equality and the compacting copy.
 * All three share one canonical form. A walk from block 0 in program order
 * (a statement, then its body, then its orelse, then the next statement)
 * numbers the reachable statements and blocks in the order it meets them;
 * the kernel is then serialized as a stream of integers in that numbering
 * (layout, params, ret, each block's entries, each statement's op, type,
 * nargs, snode, imm bits, operands, body and orelse). So statement numbering
 * and unreachable statements do not matter, and the kernel's name is not
 * part of its identity. The walk guards against garbage (bad ids, shared or
 * cyclic blocks) so unverified kernels hash without crashing. */
#include "ir_internal.h"

/* Markers for references that do not name a reachable statement or block. */
enum {
  REF_NONE = -1,
  REF_BAD = -2,
  REF_UNREACHED = -3
};

typedef struct canon {
  const fb_kernel *k;
  int nstmts, nblocks;      /* usable counts */
  int32_t *sid, *bid;       /* old id -> new id, -1 when not reached */
  int32_t *sorder, *border; /* new id -> old id */
  int ns, nb;               /* reached statements and blocks */
} canon;

static void canon_free(canon *c) {
  free(c->sid);
  free(c->bid);
  free(c->sorder);
  free(c->border);
}

static void number_block(canon *c, int blk, int depth);

static void enter(canon *c, int blk, int depth) {
  if (blk >= 0 && blk < c->nblocks && c->bid[blk] < 0) number_block(c, blk, depth);
}

static void number_block(canon *c, int blk, int depth) {
  c->bid[blk] = c->nb;
  c->border[c->nb++] = blk;
  const fb_block *b = &c->k->blocks[blk];
  if (b->n <= 0 || !b->ids) return;
  for (int i = 0; i < b->n; i++) {
    int id = b->ids[i];
    if (id < 0 || id >= c->nstmts || c->sid[id] >= 0) continue;
    c->sid[id] = c->ns;
    c->sorder[c->ns++] = id;
    if (depth >= FB_MAX_BLOCK_DEPTH) continue;
    enter(c, c->k->stmts[id].body, depth + 1);
    enter(c, c->k->stmts[id].orelse, depth + 1);
  }
}

/* Number k's reachable statements and blocks. 0 or FB_ENOMEM. */
static int canon_build(canon *c, const fb_kernel *k) {
  memset(c, 0, sizeof *c);
  c->k = k;
  c->nstmts = k->nstmts > 0 && k->stmts ? k->nstmts : 0;
  c->nblocks = k->nblocks > 0 && k->blocks ? k->nblocks : 0;
  size_t ns = (size_t)c->nstmts + 1, nb = (size_t)c->nblocks + 1;
  c->sid = malloc(ns * sizeof *c->sid);
  c->bid = malloc(nb * sizeof *c->bid);
  c->sorder = malloc(ns * sizeof *c->sorder);
  c->border = malloc(nb * sizeof *c->border);
  if (!c->sid || !c->bid || !c->sorder || !c->border) {
    canon_free(c);
    return FB_ENOMEM;
  }
  memset(c->sid, 0xff, ns * sizeof *c->sid);
  memset(c->bid, 0xff, nb * sizeof *c->bid);
  if (c->nblocks) number_block(c, 0, 0);
  return 0;
}

static int64_t map_stmt(const canon *c, int32_t id) {
  if (id == -1) return REF_NONE;
  if (id < 0 || id >= c->nstmts) return REF_BAD;
  return c->sid[id] >= 0 ? c->sid[id] : REF_UNREACHED;
}

static int64_t map_block(const canon *c, int32_t blk) {
  if (blk == -1) return REF_NONE;
  if (blk < 0 || blk >= c->nblocks) return REF_BAD;
  return c->bid[blk] >= 0 ? c->bid[blk] : REF_UNREACHED;
}

static int stmt_nargs(const fb_stmt *s) { return s->nargs < FB_MAX_ARGS ? s->nargs : FB_MAX_ARGS; }

/* ---------------------------------------------------------------- serializing */

/* Receives the canonical stream: hashes it, or collects it for comparison. */
typedef struct sink {
  int collect;
  uint64_t h;
  int64_t *v;
  int n, cap;
  int err;
} sink;

static void put(sink *o, int64_t x) {
  if (!o->collect) {
    o->h = fb__fnv(o->h, &x, sizeof x);
    return;
  }
  if (o->err || FB_GROW(o->v, o->n, o->cap)) {
    o->err = FB_ENOMEM;
    return;
  }
  o->v[o->n++] = x;
}

static void put_header(sink *o, const fb_kernel *k) {
  put(o, k->nparams);
  if (k->nparams > 0 && k->params)
    for (int i = 0; i < k->nparams; i++) put(o, (int64_t)k->params[i]);
  else if (k->nparams > 0) put(o, REF_BAD);
  put(o, (int64_t)k->ret);
}

static void put_stmt(sink *o, const canon *c, const fb_stmt *s) {
  put(o, s->op);
  put(o, s->type);
  put(o, s->nargs | (int64_t)s->part << 8); /* nargs < 256: the same token unfused */
  put(o, s->snode);
  put(o, (int64_t)s->imm.u);
  for (int j = 0; j < stmt_nargs(s); j++) put(o, map_stmt(c, s->args[j]));
  put(o, map_block(c, s->body));
  put(o, map_block(c, s->orelse));
}

static void serialize(sink *o, const canon *c) {
  const fb_kernel *k = c->k;
  put_header(o, k);
  put(o, c->ns);
  put(o, c->nb);
  for (int b = 0; b < c->nb; b++) {
    const fb_block *blk = &k->blocks[c->border[b]];
    int n = blk->n > 0 && blk->ids ? blk->n : 0;
    put(o, n);
    for (int i = 0; i < n; i++) put(o, map_stmt(c, blk->ids[i]));
  }
  for (int i = 0; i < c->ns; i++) put_stmt(o, c, &k->stmts[c->sorder[i]]);
}

/* ---------------------------------------------------------------- public */

uint64_t fb_kernel_hash(const fb_kernel *k) {
  if (!k) return 0;
  canon c;
  if (canon_build(&c, k)) return 0; /* out of memory: no structural hash */
  sink o;
  memset(&o, 0, sizeof o);
  o.h = FB_FNV_INIT;
  put(&o, k->layout ? (int64_t)fb_layout_hash(k->layout) : 0);
  serialize(&o, &c);
  canon_free(&c);
  return fb__mix64(o.h);
}

static int str_equal(const char *a, const char *b) {
  return a == b || (a && b && strcmp(a, b) == 0);
}

/* The fields fb_layout_hash covers, compared exactly. */
int fb_layout_equal(const fb_layout *a, const fb_layout *b) {
  if (a == b) return 1;
  if (!a || !b || a->nnodes != b->nnodes) return 0;
  for (int i = 0; i < a->nnodes; i++) {
    const fb_snode *x = &a->nodes[i], *y = &b->nodes[i];
    if (x->kind != y->kind || x->parent != y->parent || x->axes != y->axes ||
        x->chunk != y->chunk || x->type != y->type || !str_equal(x->name, y->name))
      return 0;
    for (int d = 0; d < FB_MAX_AXES; d++)
      if (x->size[d] != y->size[d]) return 0;
  }
  return 1;
}

/* Collect k's canonical stream into o. 0 or FB_ENOMEM. */
static int collect(sink *o, const fb_kernel *k) {
  canon c;
  memset(o, 0, sizeof *o);
  o->collect = 1;
  if (canon_build(&c, k)) return FB_ENOMEM;
  serialize(o, &c);
  canon_free(&c);
  return o->err;
}

int fb_kernel_equal(const fb_kernel *a, const fb_kernel *b) {
  if (a == b) return 1;
  if (!a || !b || !fb_layout_equal(a->layout, b->layout)) return 0;
  sink x, y;
  int rx = collect(&x, a), ry = collect(&y, b);
  int eq =
      !rx && !ry && x.n == y.n && (x.n == 0 || memcmp(x.v, y.v, sizeof *x.v * (size_t)x.n) == 0);
  free(x.v);
  free(y.v);
  return eq;
}

/* ---------------------------------------------------------------- compact */

static int32_t new_ref(int64_t r) { return r >= 0 ? (int32_t)r : -1; }

static int copy_blocks(fb_kernel *n, const canon *c) {
  for (int b = 1; b < c->nb; b++)
    if (fb_block_new(n) < 0) return FB_ENOMEM;
  for (int b = 0; b < c->nb; b++) {
    const fb_block *src = &c->k->blocks[c->border[b]];
    fb_block *dst = &n->blocks[b];
    if (src->n <= 0 || !src->ids) continue;
    dst->ids = malloc(sizeof *dst->ids * (size_t)src->n);
    if (!dst->ids) return FB_ENOMEM;
    dst->cap = src->n;
    for (int i = 0; i < src->n; i++) {
      int64_t r = map_stmt(c, src->ids[i]);
      if (r >= 0) dst->ids[dst->n++] = (int32_t)r;
    }
  }
  return 0;
}

static int copy_stmts(fb_kernel *n, const canon *c) {
  if (!c->ns) return 0;
  n->stmts = malloc(sizeof *n->stmts * (size_t)c->ns);
  if (!n->stmts) return FB_ENOMEM;
  n->nstmts = n->cap = c->ns;
  for (int i = 0; i < c->ns; i++) {
    fb_stmt s = c->k->stmts[c->sorder[i]];
    for (int j = 0; j < FB_MAX_ARGS; j++)
      s.args[j] = j < stmt_nargs(&s) ? new_ref(map_stmt(c, s.args[j])) : -1;
    s.body = new_ref(map_block(c, s.body));
    s.orelse = new_ref(map_block(c, s.orelse));
    n->stmts[i] = s;
  }
  return 0;
}

fb_kernel *fb_kernel_compact(const fb_kernel *k) {
  if (!k) return NULL;
  canon c;
  if (canon_build(&c, k)) return NULL;
  int np = k->nparams > 0 && k->params ? k->nparams : 0;
  fb_kernel *n = fb_kernel_new(k->layout, k->name, np, k->params, k->ret);
  if (n && (copy_blocks(n, &c) || copy_stmts(n, &c))) {
    fb_kernel_free(n);
    n = NULL;
  }
  canon_free(&c);
  return n;
}
