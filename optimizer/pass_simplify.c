/* Intra-task simplification of fused tasks (paper section 6.3 and
 * supplement section 3). Every rewrite is exact: the simplified task gives
 * the same fields, return value and rand() values as the fused one.
 *  - shared arguments: a parameter whose argument has the bits and type of
 *    an earlier one is read through the earlier one (for these arguments
 *    only: the memo key holds the pairs), so what two launches with the
 *    same dt compute is common to both;
 *  - atomics on a field that every access in the task reaches element-wise
 *    (or in a serial task) become load, op, store: no other iteration
 *    touches that element, and the op is the same one the atomic applies;
 *  - common subexpressions: pure statements equal in op, type, operands and
 *    immediate are computed once where the first dominates;
 *  - per block, in order: store-to-load forwarding (a load of the element a
 *    store wrote, with no possibly aliasing write in between; from a dense
 *    store not provably in bounds the load becomes select(in bounds, value,
 *    0), what the load gives either way), identical load elimination,
 *    identical store elimination (storing the value the element is known
 *    to hold), dead stores (a store overwritten at the same element before
 *    any possible read). Atomics end what is known of their field, sparse
 *    operations and branches all of it; what is known before a serial loop
 *    stays known in it and after it for the fields nothing inside it
 *    writes;
 *  - CSE and forwarding alternate until neither merges anything (at most
 *    SIMP_ROUNDS rounds): a chain of dependent gathers that fused loops
 *    repeat (an RK3 backtrace) merges one link per round;
 *  - dead code. */
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "optimizer/sfg.h"

typedef struct loc {
  int32_t field;  /* place id, or -(gtmp slot + 2) */
  int32_t n;
  int32_t idx[FB_MAX_AXES];
} loc;

typedef struct fact {
  loc at;
  int32_t val;    /* known: the value; pending: the store */
  int32_t src;    /* the access it comes from (a load or a store) */
  int from_store;
  int guarded;    /* known from a store not provably in bounds: the element
                     holds val only where its indices are in bounds (an
                     out-of-bounds store is skipped and a load there gives 0) */
} fact;

typedef struct facts {
  fact *v;
  int n, cap;
} facts;

typedef struct simp {
  fb_kernel *k;
  const fb_task_meta *m;
  int32_t *uses;  /* use counts, during forwarding */
  int32_t *rep;
  uint8_t *drop;
  /* CSE: the pure statements in scope (base/map.h, keyed by stmt_hash; the
   * entries of one hash are confirmed with stmt_same), and the ids the open
   * scopes added, newest last, so that leaving a block removes its own */
  fb_map avail;   /* int32_t statement id */
  int32_t *undo;
  int nundo, capundo;
  int merged;     /* statements CSE or forwarding replaced or dropped */
  int oom;
} simp;

static int32_t R(const simp *s, int32_t id) {
  while (id >= 0 && s->rep[id] != id) id = s->rep[id];
  return id;
}

static void apply_rep(simp *s, fb_stmt *st) {
  for (int a = 0; a < st->nargs; a++)
    if (st->args[a] >= 0) st->args[a] = R(s, st->args[a]);
}

static int push_stmt(simp *s, const fb_stmt *st) {
  fb_kernel *k = s->k;
  if (k->nstmts == k->cap) {
    int nc = k->cap * 2 + 16;
    fb_stmt *p = realloc(k->stmts, sizeof *p * (size_t)nc);
    int32_t *r = realloc(s->rep, sizeof *r * (size_t)nc);
    if (r) s->rep = r;
    uint8_t *d = r ? realloc(s->drop, (size_t)nc) : NULL;
    if (d) s->drop = d;
    if (p) k->stmts = p;
    if (!p || !r || !d) {
      s->oom = 1;
      return -1;
    }
    k->cap = nc;
  }
  int id = k->nstmts++;
  k->stmts[id] = *st;
  s->rep[id] = id;
  s->drop[id] = 0;
  return id;
}

/* ---------------------------------------------------------------- atomics */

static fb_op atomic_base(int op) {
  int i = op >= FB_OP_ATOMIC_ADD_NA ? op - FB_OP_ATOMIC_ADD_NA : op - FB_OP_ATOMIC_ADD;
  static const fb_op base[] = {FB_OP_ADD, FB_OP_SUB, FB_OP_MIN, FB_OP_MAX,
                               FB_OP_AND, FB_OP_OR,  FB_OP_XOR};
  return base[i];
}

static int is_atomic(int op) {
  int cls = fb_op_table[op].cls;
  return cls == FB_OPC_ATOMIC || cls == FB_OPC_IATOMIC;
}

static int elementwise(const simp *s, int field) {
  if (s->m->loop < 0) return 1;
  const fb_meta_acc *a = fb_meta_find(s->m, FB_SKEY(FB_SK_VALUE, field));
  return a && a->ew != FB_EW_NONE;
}

static fb_stmt blank(int op, int type, int snode) {
  fb_stmt t;
  memset(&t, 0, sizeof t);
  t.op = (uint16_t)op;
  t.type = (uint8_t)type;
  t.snode = snode;
  t.body = t.orelse = -1;
  for (int a = 0; a < FB_MAX_ARGS; a++) t.args[a] = -1;
  return t;
}

/* atomic -> load, op, store; the three ids go to out[]. */
static int expand_atomic(simp *s, int id, int32_t *out) {
  fb_stmt at = s->k->stmts[id];
  int nd = at.nargs - 1;
  fb_type ft = s->k->layout->nodes[at.snode].type;
  fb_stmt ld = blank(FB_OP_LOAD, ft, at.snode);
  ld.part = at.part;
  ld.nargs = (uint8_t)nd;
  memcpy(ld.args, at.args, sizeof *ld.args * (size_t)nd);
  int old = push_stmt(s, &ld);
  if (old < 0) return -1;
  fb_stmt op = blank(atomic_base(at.op), ft, -1);
  op.nargs = 2;
  op.args[0] = old;
  op.args[1] = at.args[nd];
  int nv = push_stmt(s, &op);
  if (nv < 0) return -1;
  fb_stmt st =
      blank(at.op >= FB_OP_ATOMIC_ADD_NA ? FB_OP_STORE_NA : FB_OP_STORE, FB_T_VOID, at.snode);
  st.part = at.part;
  st.nargs = (uint8_t)(nd + 1);
  memcpy(st.args, at.args, sizeof *st.args * (size_t)nd);
  st.args[nd] = nv;
  int sv = push_stmt(s, &st);
  if (sv < 0) return -1;
  s->rep[id] = old;
  out[0] = old;
  out[1] = nv;
  out[2] = sv;
  return 0;
}

static int atomics_block(simp *s, int blk, int depth) {
  if (blk < 0 || depth > FB_MAX_BLOCK_DEPTH) return 0;
  int n = s->k->blocks[blk].n, count = 0;
  for (int i = 0; i < n; i++) {
    const fb_stmt *st = &s->k->stmts[s->k->blocks[blk].ids[i]];
    count += is_atomic(st->op) && elementwise(s, st->snode);
  }
  int32_t *ids = malloc(sizeof *ids * (size_t)(n + 2 * count + 1));
  if (!ids) return s->oom = 1;
  int w = 0;
  for (int i = 0; i < n && !s->oom; i++) {
    int id = s->k->blocks[blk].ids[i];
    const fb_stmt *st = &s->k->stmts[id];
    int body = st->body, orelse = st->orelse;
    if (is_atomic(st->op) && elementwise(s, st->snode)) {
      if (expand_atomic(s, id, ids + w) == 0) w += 3;
      continue;
    }
    ids[w++] = id;
    atomics_block(s, body, depth + 1);
    atomics_block(s, orelse, depth + 1);
  }
  free(s->k->blocks[blk].ids);
  s->k->blocks[blk].ids = ids;
  s->k->blocks[blk].n = s->k->blocks[blk].cap = w;
  return 0;
}

/* ---------------------------------------------------------------- CSE */

static uint64_t stmt_hash(const fb_stmt *t) {
  uint64_t h = (uint64_t)t->op * 0x9e3779b97f4a7c15ull ^ (uint64_t)t->type << 17 ^
               (uint64_t)(uint32_t)t->snode << 29 ^ t->imm.u * 0xbf58476d1ce4e5b9ull;
  for (int a = 0; a < t->nargs; a++) h = (h ^ (uint64_t)(uint32_t)t->args[a]) * 0x100000001b3ull;
  return h ^ (h >> 31);
}

static int stmt_same(const fb_stmt *x, const fb_stmt *y) {
  if (x->op != y->op || x->type != y->type || x->snode != y->snode || x->nargs != y->nargs ||
      x->imm.u != y->imm.u)
    return 0;
  for (int a = 0; a < x->nargs; a++)
    if (x->args[a] != y->args[a]) return 0;
  return 1;
}

static int cse_able(const fb_stmt *t) {
  int f = fb_op_table[t->op].flags;
  return (f & FB_OPF_PURE) && !(f & FB_OPF_BLOCK);
}

static void cse_block(simp *s, int blk, int depth) {
  if (blk < 0 || depth > FB_MAX_BLOCK_DEPTH || s->oom) return;
  int mark = s->nundo;
  fb_block *b = &s->k->blocks[blk];
  int w = 0;
  for (int i = 0; i < b->n; i++) {
    int id = b->ids[i];
    fb_stmt *t = &s->k->stmts[id];
    apply_rep(s, t);
    if (cse_able(t)) {
      uint64_t h = stmt_hash(t);
      int found = -1;
      size_t it = 0;
      for (const int32_t *e; found < 0 && (e = fb_map_next(&s->avail, h, &it));)
        if (stmt_same(&s->k->stmts[*e], t)) found = *e;
      if (found >= 0) {
        s->rep[id] = found;
        s->merged++;
        continue;
      }
      int32_t *v = FB_GROW(s->undo, s->nundo, s->capundo) ? NULL : fb_map_add(&s->avail, h);
      if (!v) {
        s->oom = 1;
        return;
      }
      *v = id;
      s->undo[s->nundo++] = id;
    }
    b->ids[w++] = id;
    cse_block(s, t->body, depth + 1);
    cse_block(s, s->k->stmts[id].orelse, depth + 1);
    b = &s->k->blocks[blk];
  }
  b->n = w;
  while (s->nundo > mark) { /* leave the scope: what it added goes */
    int32_t id = s->undo[--s->nundo];
    uint64_t h = stmt_hash(&s->k->stmts[id]);
    size_t it = 0;
    for (const int32_t *e; (e = fb_map_next(&s->avail, h, &it));)
      if (*e == id) {
        fb_map_del_at(&s->avail, it);
        break;
      }
  }
}

/* Every scope it opens it closes, so the table is empty again after. */
static int cse(simp *s) {
  if (fb_map_reserve(&s->avail, (size_t)s->k->nstmts)) return s->oom = 1;
  cse_block(s, 0, 0);
  return 0;
}

/* ---------------------------------------------------------------- memory facts */

static int loc_of(const fb_kernel *k, const fb_stmt *t, loc *l) {
  memset(l, 0, sizeof *l);
  if (t->op == FB_OP_GTMP_LOAD || t->op == FB_OP_GTMP_STORE) {
    l->field = -(int32_t)(t->imm.i / 8) - 2;
    return 1;
  }
  l->field = t->snode;
  l->n = k->layout->nodes[t->snode].ndim;
  memcpy(l->idx, t->args, sizeof *l->idx * (size_t)l->n);
  return 1;
}

static int loc_eq(const loc *a, const loc *b) {
  return a->field == b->field && a->n == b->n &&
         !memcmp(a->idx, b->idx, sizeof *a->idx * (size_t)a->n);
}

static fact *find(facts *f, const loc *l) {
  for (int i = 0; i < f->n; i++)
    if (loc_eq(&f->v[i].at, l)) return &f->v[i];
  return NULL;
}

static void drop_field(facts *f, int32_t field) {
  int w = 0;
  for (int i = 0; i < f->n; i++)
    if (f->v[i].at.field != field) f->v[w++] = f->v[i];
  f->n = w;
}

static int put(facts *f, const loc *l, int32_t val, int32_t src, int from_store, int guarded) {
  fact *x = find(f, l);
  if (!x) {
    if (f->n == f->cap) {
      int nc = f->cap * 2 + 16;
      fact *p = realloc(f->v, sizeof *p * (size_t)nc);
      if (!p) return FB_ENOMEM;
      f->v = p;
      f->cap = nc;
    }
    x = &f->v[f->n++];
    x->at = *l;
  }
  x->val = val;
  x->src = src;
  x->from_store = from_store;
  x->guarded = guarded;
  return 0;
}

/* The statement ids of a block being rebuilt: forwarding may put new
 * statements before the one it replaces. */
typedef struct ivec {
  int32_t *v;
  int n, cap;
} ivec;

static int ivec_push(simp *s, ivec *a, int32_t id) {
  if (a->n == a->cap) {
    int nc = a->cap * 2 + 16;
    int32_t *p = realloc(a->v, sizeof *p * (size_t)nc);
    if (!p) return s->oom = 1;
    a->v = p;
    a->cap = nc;
  }
  a->v[a->n++] = id;
  return 0;
}

/* Push statement st and list it in `out` (its block): its id, or -1. */
static int32_t emit(simp *s, ivec *out, const fb_stmt *st) {
  int32_t id = push_stmt(s, st);
  if (id < 0 || ivec_push(s, out, id)) return -1;
  return id;
}

static int32_t emit_const(simp *s, ivec *out, int type, int64_t v) {
  fb_stmt c = blank(FB_OP_CONST, type, -1);
  c.imm.i = v;
  return emit(s, out, &c);
}

static int32_t emit2(simp *s, ivec *out, int op, int type, int32_t a, int32_t b) {
  fb_stmt t = blank(op, type, -1);
  t.nargs = 2;
  t.args[0] = a;
  t.args[1] = b;
  return emit(s, out, &t);
}

/* The value a load of field l->field at l's indices gives when the element
 * holds `val` wherever those indices are in bounds: in bounds ? val : 0,
 * the bounds test being the one generated code makes (0 <= index < extent
 * on each axis). Statements go to `out`; -1 on failure. */
static int32_t guarded_value(simp *s, ivec *out, const loc *l, int32_t val, int type) {
  const fb_snode *f = &s->k->layout->nodes[l->field];
  int32_t cond = -1;
  for (int d = 0; d < l->n && !s->oom; d++) {
    int it = s->k->stmts[l->idx[d]].type;
    int32_t zero = emit_const(s, out, it, 0);
    int32_t ext = emit_const(s, out, it, f->shape[f->dim_axis[d]]);
    if (zero < 0 || ext < 0) return -1;
    int32_t ge = emit2(s, out, FB_OP_GE, FB_T_BOOL, l->idx[d], zero);
    int32_t lt = emit2(s, out, FB_OP_LT, FB_T_BOOL, l->idx[d], ext);
    int32_t both = ge < 0 || lt < 0 ? -1 : emit2(s, out, FB_OP_AND, FB_T_BOOL, ge, lt);
    cond = both < 0 ? -1 : cond < 0 ? both : emit2(s, out, FB_OP_AND, FB_T_BOOL, cond, both);
    if (cond < 0) return -1;
  }
  int32_t zero = emit_const(s, out, type, 0);
  if (cond < 0 || zero < 0) return -1;
  fb_stmt sel = blank(FB_OP_SELECT, type, -1);
  sel.nargs = 3;
  sel.args[0] = cond;
  sel.args[1] = val;
  sel.args[2] = zero;
  return emit(s, out, &sel);
}

static void forward_block(simp *s, int blk, int depth, const facts *in);

/* Access `keep` stands in for a dropped one of the same element (forwarded
 * or overwritten): it fails where that one would, so it answers for the
 * earlier of their fused parts (docs/optimizer.md, "Blame"). */
static void keep_part(simp *s, int32_t keep, int32_t part) {
  if (keep >= 0 && s->k->stmts[keep].part > part) s->k->stmts[keep].part = part;
}

/* Nothing but dense storage: storing the loaded value back changes nothing. */
static int plain_storage(const simp *s, const loc *l) {
  int path[8];
  return l->field < 0 || fb_sparse_path(s->k->layout, l->field, path, 8) == 0;
}

/* Returns 1 when the load was replaced (it then must not be listed). */
static int on_load(simp *s, int id, facts *known, facts *pending, ivec *out) {
  const fb_stmt *t = &s->k->stmts[id];
  int type = t->type, part = t->part;
  loc l;
  loc_of(s->k, t, &l);
  fact *x = find(known, &l);
  if (x && s->k->stmts[x->val].type == type) {
    int32_t v = x->guarded ? guarded_value(s, out, &l, x->val, type) : x->val;
    if (v < 0) return 0;
    keep_part(s, x->src, part);
    s->rep[id] = v;
    s->drop[id] = 1;
    s->merged++;
    if (x->guarded) x->val = v, x->guarded = 0, x->from_store = 0; /* what loads give */
    return 1;
  }
  drop_field(pending, l.field);
  if (put(known, &l, id, id, 0, 0)) s->oom = 1;
  return 0;
}

static void on_store(simp *s, int id, facts *known, facts *pending) {
  const fb_stmt *t = &s->k->stmts[id];
  loc l;
  loc_of(s->k, t, &l);
  int v = t->op == FB_OP_GTMP_STORE ? t->args[0] : t->args[t->nargs - 1];
  fact *x = find(known, &l);
  if (x && x->val == v && !x->guarded && (x->from_store || plain_storage(s, &l))) {
    s->drop[id] = 1; /* the element holds v already */
    keep_part(s, x->src, t->part);
    return;
  }
  fact *p = find(pending, &l);
  /* overwritten before any read; unless it activates and this one does not */
  if (p &&
      (plain_storage(s, &l) || s->k->stmts[p->val].op != FB_OP_STORE || t->op == FB_OP_STORE)) {
    s->drop[p->val] = 1;
    keep_part(s, id, s->k->stmts[p->val].part);
  }
  drop_field(known, l.field);
  int inb = t->op == FB_OP_GTMP_STORE || fb_access_inbounds(s->k, id);
  /* a dense store that may fall out of bounds is still known, guarded by
     the bounds test (a sparse one may also fail to allocate) */
  int guarded = !inb && plain_storage(s, &l);
  if (((inb || guarded) && put(known, &l, v, id, 1, guarded)) || put(pending, &l, id, id, 1, 0))
    s->oom = 1;
}

/* What a block may write, anywhere inside it: fields (place ids, gtmp slots
 * as loc fields), or everything (`all`) for an op that writes what no
 * field names (sparse operations, lists) or reads a list's length. */
typedef struct clob {
  int32_t *f;
  int n, cap;
  int all;
} clob;

static void clob_add(simp *s, clob *c, int32_t field) {
  for (int i = 0; i < c->n; i++)
    if (c->f[i] == field) return;
  if (c->n == c->cap) {
    int nc = c->cap * 2 + 8;
    int32_t *p = realloc(c->f, sizeof *p * (size_t)nc);
    if (!p) {
      s->oom = 1;
      c->all = 1;
      return;
    }
    c->f = p;
    c->cap = nc;
  }
  c->f[c->n++] = field;
}

static void clobbers(simp *s, int blk, int depth, clob *c) {
  if (blk < 0 || c->all) return;
  if (depth > FB_MAX_BLOCK_DEPTH) {
    c->all = 1;
    return;
  }
  const fb_block *b = &s->k->blocks[blk];
  for (int i = 0; i < b->n && !c->all; i++) {
    const fb_stmt *t = &s->k->stmts[b->ids[i]];
    int cls = fb_op_table[t->op].cls;
    loc l;
    if (s->drop[b->ids[i]]) continue;
    if (cls == FB_OPC_GSTORE || is_atomic(t->op) || t->op == FB_OP_GTMP_STORE) {
      loc_of(s->k, t, &l);
      clob_add(s, c, l.field);
    } else if (cls == FB_OPC_SPARSE || cls == FB_OPC_APPEND || cls == FB_OPC_LENGTH ||
               cls == FB_OPC_LIST || (fb_op_table[t->op].flags & FB_OPF_WRITES)) {
      c->all = 1;
    }
    clobbers(s, t->body, depth + 1, c);
    clobbers(s, t->orelse, depth + 1, c);
  }
}

static void drop_clobbered(facts *f, const clob *c) {
  if (c->all) {
    f->n = 0;
    return;
  }
  for (int i = 0; i < c->n; i++) drop_field(f, c->f[i]);
}

/* Facts `in` (known before the block) minus what block `blk` may write:
 * true on entry to it and after it, in every iteration when it is a loop
 * body. */
static facts survive(simp *s, const facts *in, int blk, int depth) {
  facts f = {0};
  if (!in || !in->n || blk < 0) return f;
  clob c = {0};
  clobbers(s, blk, depth, &c);
  if (!c.all) {
    f.v = malloc(sizeof *f.v * (size_t)in->n);
    if (!f.v) s->oom = 1;
    else {
      memcpy(f.v, in->v, sizeof *f.v * (size_t)in->n);
      f.n = f.cap = in->n;
      drop_clobbered(&f, &c);
    }
  }
  free(c.f);
  return f;
}

static void forward_block(simp *s, int blk, int depth, const facts *in) {
  if (blk < 0 || depth > FB_MAX_BLOCK_DEPTH || s->oom) return;
  facts known = {0}, pending = {0};
  if (in && in->n) {
    known.v = malloc(sizeof *known.v * (size_t)in->n);
    if (!known.v) {
      s->oom = 1;
      return;
    }
    memcpy(known.v, in->v, sizeof *known.v * (size_t)in->n);
    known.n = known.cap = in->n;
  }
  ivec out = {0};
  int n = s->k->blocks[blk].n;
  for (int i = 0; i < n && !s->oom; i++) {
    int id = s->k->blocks[blk].ids[i];
    fb_stmt *t = &s->k->stmts[id];
    apply_rep(s, t);
    int cls = fb_op_table[t->op].cls;
    if (t->op == FB_OP_LOAD || t->op == FB_OP_GTMP_LOAD) {
      if (on_load(s, id, &known, &pending, &out)) continue;
    } else if (cls == FB_OPC_GSTORE || t->op == FB_OP_GTMP_STORE) {
      on_store(s, id, &known, &pending);
    } else if (is_atomic(t->op)) {
      drop_field(&known, t->snode);
      drop_field(&pending, t->snode);
    } else if (t->op == FB_OP_IS_ACTIVE && !s->uses[id]) {
      /* observes nothing (a demoted activate) */
    } else if (t->op == FB_OP_RANGE_FOR || t->op == FB_OP_WHILE) {
      /* what a loop does not write stays known in it and after it; a store
         before it may be read in it, so nothing is pending. Only loops:
         carried past mpm_splitted's branches, values loaded before them
         stay live across its SVD, and its fused P2G measured slower */
      int body = t->body, orelse = t->orelse;
      facts fb = survive(s, &known, body, depth + 1), fo = survive(s, &known, orelse, depth + 1);
      forward_block(s, body, depth + 1, &fb);
      forward_block(s, orelse, depth + 1, &fo);
      free(fb.v);
      free(fo.v);
      clob c = {0};
      clobbers(s, body, depth + 1, &c);
      clobbers(s, orelse, depth + 1, &c);
      drop_clobbered(&known, &c);
      free(c.f);
      pending.n = 0;
    } else if (t->body >= 0 || t->orelse >= 0 || cls == FB_OPC_SPARSE || cls == FB_OPC_APPEND ||
               cls == FB_OPC_LENGTH || cls == FB_OPC_LIST) {
      int body = t->body, orelse = t->orelse;
      known.n = pending.n = 0;
      forward_block(s, body, depth + 1, NULL);
      forward_block(s, orelse, depth + 1, NULL);
    }
    if (ivec_push(s, &out, id)) break;
  }
  free(known.v);
  free(pending.v);
  fb_block *b = &s->k->blocks[blk];
  if (s->oom) {
    free(out.v);
    return;
  }
  int w = 0;
  for (int i = 0; i < out.n; i++)
    if (!s->drop[out.v[i]]) out.v[w++] = out.v[i];
  if (!out.v) {
    b->n = 0;
    return;
  }
  free(b->ids);
  b->ids = out.v;
  b->n = w;
  b->cap = out.cap;
}

/* ---------------------------------------------------------------- driver */

#define SIMP_ROUNDS 16

static void rep_all(simp *s, int blk, int depth) {
  if (blk < 0 || depth > FB_MAX_BLOCK_DEPTH) return;
  const fb_block *b = &s->k->blocks[blk];
  for (int i = 0; i < b->n; i++) {
    fb_stmt *t = &s->k->stmts[b->ids[i]];
    apply_rep(s, t);
    rep_all(s, t->body, depth + 1);
    rep_all(s, t->orelse, depth + 1);
  }
}

fb_kernel *fb_ir_simplify(const fb_kernel *k, const fb_task_meta *m, int *removed) {
  simp s;
  memset(&s, 0, sizeof s);
  s.m = m;
  fb_map_init(&s.avail, sizeof(int32_t));
  s.k = fb_kernel_clone(k);
  if (!s.k) return NULL;
  /* the clone's statement array is exactly nstmts long: push_stmt grows
     it together with rep and drop */
  s.k->cap = s.k->nstmts;
  s.rep = malloc(sizeof *s.rep * (size_t)(s.k->nstmts + 1));
  s.drop = calloc((size_t)s.k->nstmts + 1, 1);
  if (!s.rep || !s.drop) s.oom = 1;
  for (int i = 0; !s.oom && i < s.k->nstmts; i++) s.rep[i] = i;
  if (!s.oom) atomics_block(&s, 0, 0);
  /* CSE and load forwarding feed each other: merging two loads makes
   * what is computed from them equal, which makes the loads at the indices
   * computed from that equal (a chain of dependent gathers, as in an RK3
   * backtrace repeated by fused loops, needs one round per link). Until
   * nothing merges, at most SIMP_ROUNDS rounds. */
  for (int round = 0, more = 1; more && round < SIMP_ROUNDS && !s.oom; round++) {
    s.merged = 0;
    cse(&s);
    free(s.uses);
    s.uses = s.oom ? NULL : fb_ir_use_counts(s.k);
    if (!s.uses) s.oom = 1;
    if (!s.oom) forward_block(&s, 0, 0, NULL);
    more = s.merged > 0;
  }
  if (!s.oom) rep_all(&s, 0, 0);
  fb_kernel *out = NULL;
  if (!s.oom) {
    fb_ir_dce(s.k);
    out = fb_kernel_compact(s.k);
  }
  if (out && removed) *removed = fb_kernel_count_stmts(k) - fb_kernel_count_stmts(out);
  fb_kernel_free(s.k);
  free(s.rep);
  free(s.drop);
  fb_map_free(&s.avail);
  free(s.undo);
  free(s.uses);
  return out;
}

/* ---------------------------------------------------------------- shared arguments */

/* The parameters of fused task k whose launches pass the same value: for
 * each parameter i, the first parameter j <= i of the same type whose
 * argument has the same bits (-0.0 and 0.0 differ, a NaN equals only its
 * own bits). Writes (i, j) to key for each i with j < i, in increasing i;
 * returns how many values it wrote, or -1 out of memory. Two launches of
 * one kernel with the same scalar (the same dt for three channels) then
 * read one parameter, and CSE merges what they compute from it. Exact for
 * these arguments only: the plan memo replays a window only when its
 * arguments are the same bits (plan_find), and every other flush runs this
 * pass on the arguments it has. Sorting keeps it O(n log n): a fused task
 * may have 256 parts of 1024 parameters, all from a client. */
typedef struct argkey {
  uint64_t bits;
  int32_t type, idx;
} argkey;

static int cmp_argkey(const void *pa, const void *pb) {
  const argkey *x = pa, *y = pb;
  if (x->bits != y->bits) return x->bits < y->bits ? -1 : 1;
  if (x->type != y->type) return x->type < y->type ? -1 : 1;
  return (x->idx > y->idx) - (x->idx < y->idx);
}

static int shared_args(const fb_kernel *k, const fb_sfg_node *n, int64_t *key) {
  if (n->nargs != k->nparams || n->nargs < 2) return 0;
  argkey *v = malloc(sizeof *v * (size_t)n->nargs);
  int32_t *first = malloc(sizeof *first * (size_t)n->nargs);
  if (!v || !first) {
    free(v);
    free(first);
    return -1;
  }
  for (int i = 0; i < n->nargs; i++) v[i] = (argkey){n->args[i], (int32_t)k->params[i], i};
  qsort(v, (size_t)n->nargs, sizeof *v, cmp_argkey);
  for (int i = 0, lead = 0; i < n->nargs; i++) {
    if (i && (v[i].bits != v[i - 1].bits || v[i].type != v[i - 1].type)) lead = i;
    first[v[i].idx] = v[lead].idx; /* the smallest index of its run */
  }
  int w = 0;
  for (int i = 0; i < n->nargs; i++)
    if (first[i] != i) {
      key[w++] = i;
      key[w++] = first[i];
    }
  free(v);
  free(first);
  return w;
}

/* A copy of k whose arg statements read parameter j in place of i, for
 * each pair (i, j) of map. */
static fb_kernel *share_args(const fb_kernel *k, const int64_t *map, int nmap) {
  fb_kernel *c = fb_kernel_clone(k);
  int32_t *to = c ? malloc(sizeof *to * (size_t)(c->nparams ? c->nparams : 1)) : NULL;
  if (!to) {
    fb_kernel_free(c);
    return NULL;
  }
  for (int i = 0; i < c->nparams; i++) to[i] = i;
  for (int p = 0; p < nmap; p += 2) to[map[p]] = (int32_t)map[p + 1];
  for (int s = 0; s < c->nstmts; s++) {
    fb_stmt *t = &c->stmts[s];
    if (t->op == FB_OP_ARG && t->imm.i >= 0 && t->imm.i < c->nparams) t->imm.i = to[t->imm.i];
  }
  free(to);
  return c;
}

/* ---------------------------------------------------------------- the pass */

int fb_pass_simplify(fb_pass_ctx *c) {
  fb_sfg *g = c->g;
  int changed = 0;
  int64_t *key = NULL;
  int capkey = 0;
  for (int i = g->nret; i < g->n; i++) {
    fb_sfg_node *n = g->nodes[i];
    if (n->dead || n->host || n->simplified || n->ntasks < 2) continue;
    if (2 + 2 * n->nargs > capkey) {
      int64_t *nk = realloc(key, sizeof *nk * (size_t)(2 + 2 * n->nargs));
      if (!nk) {
        free(key);
        return FB_ENOMEM;
      }
      key = nk;
      capkey = 2 + 2 * n->nargs;
    }
    const fb_kernel *k = fb_bank_ir(c->bank, n->ir);
    key[0] = FB_MEMO_SIMPLIFY;
    key[1] = n->ir;
    int nshared = shared_args(k, n, key + 2);
    if (nshared < 0) {
      free(key);
      return FB_ENOMEM;
    }
    int nkey = 2 + nshared;
    int before = n->m->nstmts, removed = 0;
    fb_irh h = fb_pass_memo_get(c, key, nkey);
    if (h == FB_IRH_NONE) {
      fb_kernel *shared = nkey > 2 ? share_args(k, key + 2, nkey - 2) : NULL;
      fb_kernel *out = nkey > 2 && !shared ? NULL : fb_ir_simplify(shared ? shared : k, n->m, &removed);
      fb_kernel_free(shared);
      int rc = fb_pass_memo_put(c, key, nkey, out, &h);
      if (rc) {
        free(key);
        return rc;
      }
    }
    if (h == n->ir) {
      fb_bank_unref(c->bank, h);
      n->simplified = 1;
      continue;
    }
    int rc = fb_sfg_node_set_ir(n, c->bank, h);
    if (rc) {
      free(key);
      return rc;
    }
    n->simplified = 1;
    if (before > n->m->nstmts) c->cnt->simplified += (uint64_t)(before - n->m->nstmts);
    changed++;
  }
  free(key);
  if (!changed) return 0;
  int rc = fb_sfg_rebuild(g, c->bank, NULL, 0);
  return rc ? rc : changed;
}
