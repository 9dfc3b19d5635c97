/* IR <-> protobuf conversion for fuseboxd and libfusebox (see convert.h):
 * arenas for building and unpacking messages, layouts and kernels both
 * ways with every input checked, the hand-written launch and field-chunk
 * encodings, and the FB_E* <-> gRPC status mapping. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto/convert.h"

#define ARENA_BLOCK ((size_t)64 << 10)
#define MAX_NODES FB_LAYOUT_MAX_NODES

/* ---------------------------------------------------------------- arena */

struct fbp_arena_block {
  fbp_arena_block *next, *prev;
  size_t used, cap;
  max_align_t data[];
};

static void held_add(fbp_arena *a, size_t n, int sign);

static void *pb_alloc(void *ctx, size_t n) { return fbp_alloc(ctx, n); }

/* protobuf-c frees what it allocated for itself while unpacking (its
 * scanned-member slabs, as large as a tenth of a big message's decoded
 * form): a block of its own (larger than ordinary ones) that one of the
 * last few made is given back at once. Any other free is a no-op: the
 * arena frees everything at the end. */
static void pb_free(void *ctx, void *p) {
  fbp_arena *a = ctx;
  for (int i = 0; p && i < FBP_ARENA_BIG; i++) {
    fbp_arena_block *b = a->big[i];
    if (!b || (void *)b->data != p) continue;
    a->big[i] = NULL;
    if (b->prev) b->prev->next = b->next;
    else a->head = b->next;
    if (b->next) b->next->prev = b->prev;
    held_add(a, sizeof *b + b->cap, -1);
    free(b);
    return;
  }
}

void fbp_arena_init(fbp_arena *a) {
  memset(a, 0, sizeof *a);
  a->block_bytes = ARENA_BLOCK;
  a->pb.alloc = pb_alloc;
  a->pb.free = pb_free;
  a->pb.allocator_data = a;
}

static void held_add(fbp_arena *a, size_t n, int sign) {
  a->held = sign > 0 ? a->held + n : a->held - n;
  if (a->count) a->count(a->count_ctx, sign > 0 ? (int64_t)n : -(int64_t)n);
}

static fbp_arena_block *new_block(fbp_arena *a, size_t n) {
  size_t cap = n > a->block_bytes ? n : a->block_bytes;
  size_t whole = sizeof(fbp_arena_block) + cap;
  if (whole < cap) return NULL;
  if (a->limit && (whole > a->limit || a->held > a->limit - whole)) {
    /* a last block that fits what is left, for a message just under the limit */
    if (n < cap && a->held < a->limit && a->limit - a->held >= sizeof(fbp_arena_block) + n)
      cap = n, whole = sizeof(fbp_arena_block) + n;
    else {
      a->over = 1;
      return NULL;
    }
  }
  fbp_arena_block *b = malloc(whole);
  if (!b) return NULL;
  b->used = 0;
  b->cap = cap;
  b->prev = NULL;
  b->next = a->head;
  if (a->head) a->head->prev = b;
  a->head = b;
  if (cap > a->block_bytes) a->big[a->nbig++ % FBP_ARENA_BIG] = b;
  held_add(a, whole, 1);
  return b;
}

void *fbp_alloc(fbp_arena *a, size_t n) {
  if (n > SIZE_MAX - 16) return NULL;
  size_t want = (n + 15) & ~(size_t)15;
  if (!want) want = 16;
  fbp_arena_block *b = a->head;
  if (!b || b->cap - b->used < want) {
    if (!(b = new_block(a, want))) return NULL;
  }
  void *p = (char *)b->data + b->used;
  b->used += want;
  memset(p, 0, n);
  return p;
}

char *fbp_strdup(fbp_arena *a, const char *s) {
  size_t n = strlen(s ? s : "");
  char *d = fbp_alloc(a, n + 1);
  if (d && n) memcpy(d, s, n);
  return d;
}

void fbp_arena_reset(fbp_arena *a) {
  fbp_arena_block *keep = NULL;
  for (fbp_arena_block *b = a->head, *next; b; b = next) {
    next = b->next;
    if (!keep && b->cap == a->block_bytes) {
      keep = b;
      continue;
    }
    held_add(a, sizeof *b + b->cap, -1);
    free(b);
  }
  a->head = keep;
  if (keep) {
    keep->next = keep->prev = NULL;
    keep->used = 0;
  }
  memset(a->big, 0, sizeof a->big);
}

void fbp_arena_free(fbp_arena *a) {
  for (fbp_arena_block *b = a->head, *next; b; b = next) {
    next = b->next;
    held_add(a, sizeof *b + b->cap, -1);
    free(b);
  }
  a->head = NULL;
  memset(a->big, 0, sizeof a->big);
}

void fbp_arena_count(fbp_arena *a, void (*count)(void *, int64_t), void *ctx) {
  a->count = count;
  a->count_ctx = ctx;
  if (count && a->held) count(ctx, (int64_t)a->held);
}

/* ---------------------------------------------------------------- byte buffer */

void fbp_buf_free(fbp_buf *b) {
  free(b->p);
  memset(b, 0, sizeof *b);
}

int fbp_buf_reserve(fbp_buf *b, size_t more) {
  if (b->oom) return FB_ENOMEM;
  if (b->cap - b->n >= more) return 0;
  size_t cap = b->cap ? b->cap : 4096;
  while (cap - b->n < more) cap *= 2;
  uint8_t *p = realloc(b->p, cap);
  if (!p) {
    b->oom = 1;
    return FB_ENOMEM;
  }
  b->p = p;
  b->cap = cap;
  return 0;
}

/* ---------------------------------------------------------------- wire primitives */

enum {
  WT_VARINT = 0,
  WT_I64 = 1,
  WT_LEN = 2,
  WT_I32 = 5
};

static size_t varint_len(uint64_t v) {
  size_t n = 1;
  while (v >= 0x80) {
    v >>= 7;
    n++;
  }
  return n;
}

static uint8_t *put_varint(uint8_t *p, uint64_t v) {
  while (v >= 0x80) {
    *p++ = (uint8_t)(v | 0x80);
    v >>= 7;
  }
  *p++ = (uint8_t)v;
  return p;
}

static uint8_t *put_tag(uint8_t *p, int field, int wt) {
  return put_varint(p, (uint64_t)field << 3 | (uint64_t)wt);
}

static uint64_t zigzag(int64_t v) { return ((uint64_t)v << 1) ^ (uint64_t)(v >> 63); }

/* Read a varint; NULL when truncated or longer than 10 bytes. */
static const uint8_t *get_varint(const uint8_t *p, const uint8_t *end, uint64_t *out) {
  uint64_t v = 0;
  for (int shift = 0; shift < 70 && p < end; shift += 7) {
    uint8_t b = *p++;
    v |= (uint64_t)(b & 0x7f) << shift;
    if (!(b & 0x80)) {
      *out = v;
      return p;
    }
  }
  return NULL;
}

/* ---------------------------------------------------------------- values */

void fbp_value_to_pb(Fusebox__V1__Value *m, fb_value v) {
  fusebox__v1__value__init(m);
  m->type = (Fusebox__V1__ScalarType)v.type;
  if (fb_type_is_float(v.type)) m->f_bits = v.v.u;
  else if (v.type == FB_T_U32 || v.type == FB_T_U64) m->u = v.v.u;
  else m->i = v.v.i;
}

int fbp_value_from_pb(const Fusebox__V1__Value *m, fb_value *out) {
  memset(out, 0, sizeof *out);
  if (!m || (int)m->type <= 0 || (int)m->type >= FB_T__COUNT) return FB_EINVAL;
  fb_type t = (fb_type)m->type;
  fb_value v;
  memset(&v, 0, sizeof v);
  if (fb_type_is_float(t)) v.v.u = m->f_bits, v.type = FB_T_F64;
  else if (t == FB_T_U32 || t == FB_T_U64) v = fb_value_u64(m->u);
  else v = fb_value_i64(m->i);
  *out = fb_value_cast(v, t);
  return 0;
}

/* The counters, field by field, both directions: FB_COUNTERS
 * (fusebox/counters.h) names each member and its protocol field alike. */
#define FBP_COUNTER_TO_(f, type, kind, unit, meaning) m->f = c->f;
#define FBP_COUNTER_FROM_(f, type, kind, unit, meaning) c->f = m->f;

void fbp_counters_to_pb(Fusebox__V1__Counters *m, const fb_counters *c) {
  fusebox__v1__counters__init(m);
  FB_COUNTERS(FBP_COUNTER_TO_)
}

void fbp_counters_from_pb(const Fusebox__V1__Counters *m, fb_counters *c) {
  memset(c, 0, sizeof *c);
  if (!m) return;
  FB_COUNTERS(FBP_COUNTER_FROM_)
}

/* ---------------------------------------------------------------- layouts */

static Fusebox__V1__SNode *snode_to_pb(fbp_arena *a, const fb_snode *s) {
  Fusebox__V1__SNode *m = fbp_alloc(a, sizeof *m);
  int64_t *size = fbp_alloc(a, sizeof(int64_t) * FB_MAX_AXES);
  if (!m || !size) return NULL;
  fusebox__v1__snode__init(m);
  m->kind = (Fusebox__V1__SNodeKind)s->kind;
  m->name = s->name ? fbp_strdup(a, s->name) : fbp_strdup(a, "");
  m->parent = s->parent;
  m->axes = s->axes;
  for (int ax = 0; ax < FB_MAX_AXES; ax++) size[ax] = s->size[ax];
  m->n_size = FB_MAX_AXES;
  m->size = size;
  m->chunk = s->chunk;
  m->type = (Fusebox__V1__ScalarType)s->type;
  return m->name ? m : NULL;
}

Fusebox__V1__Layout *fbp_layout_to_pb(fbp_arena *a, const fb_layout *l) {
  Fusebox__V1__Layout *m = fbp_alloc(a, sizeof *m);
  if (!m || !l) return NULL;
  fusebox__v1__layout__init(m);
  m->nodes = fbp_alloc(a, sizeof *m->nodes * (size_t)(l->nnodes ? l->nnodes : 1));
  if (!m->nodes) return NULL;
  for (int i = 0; i < l->nnodes; i++)
    if (!(m->nodes[i] = snode_to_pb(a, &l->nodes[i]))) return NULL;
  m->n_nodes = (size_t)l->nnodes;
  return m;
}

static const char *kind_name(int kind) {
  return kind >= 0 && kind <= FB_SN_PLACE ? fb_snode_kind_name((fb_snode_kind)kind) : "?";
}

/* Add node i (not the root) to l, which holds nodes 0..i-1. */
static int add_node(fb_layout *l, int i, const Fusebox__V1__SNode *n, char *err, size_t errlen) {
  int kind = (int)n->kind;
  const char *name = n->name && n->name[0] ? n->name : NULL;
  if (n->parent < 0 || n->parent >= i) {
    fb_errf(err, errlen, "layout node %d: parent %d is not an earlier node", i, n->parent);
    return FB_EINVAL;
  }
  int id;
  if (kind == FB_SN_PLACE) {
    if (!name || (int)n->type <= 0 || (int)n->type >= FB_T__COUNT) {
      fb_errf(err, errlen, "layout node %d: a place needs a name and a value type (got type %d)", i,
              (int)n->type);
      return FB_EINVAL;
    }
    id = fb_layout_place(l, n->parent, name, (fb_type)n->type);
  } else if (kind >= FB_SN_DENSE && kind <= FB_SN_DYNAMIC) {
    char axes[FB_MAX_AXES + 1];
    int64_t sizes[FB_MAX_AXES];
    int na = 0;
    for (int ax = 0; ax < FB_MAX_AXES; ax++) {
      if (!(n->axes & (1u << ax))) continue;
      axes[na] = "ijkl"[ax];
      sizes[na++] = (size_t)ax < n->n_size ? n->size[ax] : 0;
    }
    axes[na] = 0;
    if (n->axes >> FB_MAX_AXES) na = 0;
    id = na ? fb_layout_add(l, n->parent, (fb_snode_kind)kind, axes, sizes, n->chunk, name)
            : FB_EINVAL;
  } else {
    fb_errf(err, errlen, "layout node %d: unknown SNode kind %d", i, kind);
    return FB_EINVAL;
  }
  if (id != i) {
    fb_errf(err, errlen,
            "layout node %d (%s%s%s) is malformed: check its parent (%d), axes (0x%x), "
            "sizes (positive, one per axis) and chunk (%lld)",
            i, kind_name(kind), name ? " " : "", name ? name : "", n->parent, n->axes,
            (long long)n->chunk);
    return FB_EINVAL;
  }
  return 0;
}

int fbp_layout_from_pb(const Fusebox__V1__Layout *m, fb_layout **out, char *err, size_t errlen) {
  *out = NULL;
  if (!m || m->n_nodes == 0 || m->n_nodes > MAX_NODES) {
    fb_errf(err, errlen, "layout: %zu nodes (expected 1 to %d, node 0 the root)",
            m ? m->n_nodes : (size_t)0, MAX_NODES);
    return FB_EINVAL;
  }
  if (m->nodes[0]->kind != FUSEBOX__V1__SNODE_KIND__SN_ROOT) {
    fb_errf(err, errlen, "layout node 0 must be the root (kind %d given)", (int)m->nodes[0]->kind);
    return FB_EINVAL;
  }
  fb_layout *l = fb_layout_new();
  if (!l) {
    fb_errf(err, errlen, "layout: out of memory");
    return FB_ENOMEM;
  }
  for (size_t i = 1; i < m->n_nodes; i++) {
    int rc = add_node(l, (int)i, m->nodes[i], err, errlen);
    if (rc) {
      fb_layout_free(l);
      return rc;
    }
  }
  char why[512] = "";
  if (fb_layout_finalize(l, why, sizeof why)) {
    fb_errf(err, errlen, "layout: %s", why);
    fb_layout_free(l);
    return FB_EINVAL;
  }
  *out = l;
  return 0;
}

/* ---------------------------------------------------------------- kernels */

static Fusebox__V1__Stmt *stmt_to_pb(fbp_arena *a, const fb_stmt *s) {
  Fusebox__V1__Stmt *m = fbp_alloc(a, sizeof *m);
  if (!m) return NULL;
  fusebox__v1__stmt__init(m);
  m->op = (char *)(s->op < FB_OP__COUNT ? fb_op_table[s->op].name : "?");
  m->type = (Fusebox__V1__ScalarType)s->type;
  m->snode = s->snode;
  if (s->nargs) {
    if (!(m->args = fbp_alloc(a, sizeof(int32_t) * s->nargs))) return NULL;
    memcpy(m->args, s->args, sizeof(int32_t) * s->nargs);
    m->n_args = s->nargs;
  }
  m->imm = s->imm.u;
  m->body = s->body;
  m->orelse = s->orelse;
  return m;
}

static Fusebox__V1__Block *block_to_pb(fbp_arena *a, const fb_block *b) {
  Fusebox__V1__Block *m = fbp_alloc(a, sizeof *m);
  if (!m) return NULL;
  fusebox__v1__block__init(m);
  if (b->n) {
    if (!(m->ids = fbp_alloc(a, sizeof(int32_t) * (size_t)b->n))) return NULL;
    memcpy(m->ids, b->ids, sizeof(int32_t) * (size_t)b->n);
    m->n_ids = (size_t)b->n;
  }
  return m;
}

Fusebox__V1__Kernel *fbp_kernel_to_pb(fbp_arena *a, const fb_kernel *k) {
  Fusebox__V1__Kernel *m = fbp_alloc(a, sizeof *m);
  if (!m || !k) return NULL;
  fusebox__v1__kernel__init(m);
  m->name = fbp_strdup(a, k->name);
  m->ret = (Fusebox__V1__ScalarType)k->ret;
  m->params = fbp_alloc(a, sizeof *m->params * (size_t)(k->nparams + 1));
  m->stmts = fbp_alloc(a, sizeof *m->stmts * (size_t)(k->nstmts + 1));
  m->blocks = fbp_alloc(a, sizeof *m->blocks * (size_t)(k->nblocks + 1));
  if (!m->name || !m->params || !m->stmts || !m->blocks) return NULL;
  for (int i = 0; i < k->nparams; i++) m->params[i] = (Fusebox__V1__ScalarType)k->params[i];
  m->n_params = (size_t)k->nparams;
  for (int i = 0; i < k->nstmts; i++)
    if (!(m->stmts[i] = stmt_to_pb(a, &k->stmts[i]))) return NULL;
  m->n_stmts = (size_t)k->nstmts;
  for (int i = 0; i < k->nblocks; i++)
    if (!(m->blocks[i] = block_to_pb(a, &k->blocks[i]))) return NULL;
  m->n_blocks = (size_t)k->nblocks;
  return m;
}

static int check_type(int t, int allow_void) {
  return t >= (allow_void ? 0 : 1) && t < FB_T__COUNT;
}

static int stmt_from_pb(const Fusebox__V1__Stmt *m, int i, int nblocks, fb_stmt *s, char *err,
                        size_t errlen) {
  int op = m->op ? fb_op_from_name(m->op, strlen(m->op)) : -1;
  if (op < 0) {
    fb_errf(err, errlen, "statement %%%d: unknown op '%s'", i, m->op ? m->op : "");
    return FB_EINVAL;
  }
  if (!check_type((int)m->type, 1) || m->n_args > FB_MAX_ARGS) {
    fb_errf(err, errlen, "statement %%%d (%s): type %d or operand count %zu out of range", i,
            fb_op_table[op].name, (int)m->type, m->n_args);
    return FB_EINVAL;
  }
  if (m->body < -1 || m->body >= nblocks || m->orelse < -1 || m->orelse >= nblocks) {
    fb_errf(err, errlen,
            "statement %%%d (%s): block ids %d, %d out of range (the kernel has %d "
            "blocks)",
            i, fb_op_table[op].name, m->body, m->orelse, nblocks);
    return FB_EINVAL;
  }
  memset(s, 0, sizeof *s);
  s->op = (uint16_t)op;
  s->type = (uint8_t)m->type;
  s->nargs = (uint8_t)m->n_args;
  s->snode = m->snode;
  for (size_t a = 0; a < m->n_args; a++) s->args[a] = m->args[a];
  s->imm.u = m->imm;
  s->body = m->body;
  s->orelse = m->orelse;
  return 0;
}

static int check_kernel_shape(const Fusebox__V1__Kernel *m, char *err, size_t errlen) {
  if (!m->name || !m->name[0]) {
    fb_errf(err, errlen, "kernel: no name");
    return FB_EINVAL;
  }
  if (m->n_stmts > FB_MAX_STATEMENTS_ANY || m->n_blocks < 1 ||
      m->n_blocks > FB_MAX_STATEMENTS_ANY || m->n_params > 1024) {
    fb_errf(err, errlen,
            "kernel '%s': %zu statements, %zu blocks, %zu parameters (expected at most "
            "%d statements, at least one block, at most 1024 parameters)",
            m->name, m->n_stmts, m->n_blocks, m->n_params, FB_MAX_STATEMENTS_ANY);
    return FB_EINVAL;
  }
  for (size_t i = 0; i < m->n_params; i++)
    if (!check_type((int)m->params[i], 0)) {
      fb_errf(err, errlen, "kernel '%s': parameter %zu has invalid type %d", m->name, i,
              (int)m->params[i]);
      return FB_EINVAL;
    }
  if (!check_type((int)m->ret, 1)) {
    fb_errf(err, errlen, "kernel '%s': invalid return type %d", m->name, (int)m->ret);
    return FB_EINVAL;
  }
  return 0;
}

static int blocks_from_pb(const Fusebox__V1__Kernel *m, fb_kernel *k, char *err, size_t errlen) {
  fb_block *blocks = calloc(m->n_blocks, sizeof *blocks);
  if (!blocks) return FB_ENOMEM;
  for (int b = 0; b < k->nblocks; b++) free(k->blocks[b].ids);
  free(k->blocks);
  k->blocks = blocks;
  k->nblocks = k->bcap = (int32_t)m->n_blocks;
  for (size_t b = 0; b < m->n_blocks; b++) {
    const Fusebox__V1__Block *mb = m->blocks[b];
    if (!mb->n_ids) continue;
    if (mb->n_ids > (size_t)FB_MAX_STATEMENTS_ANY) return FB_EINVAL;
    if (!(blocks[b].ids = malloc(sizeof(int32_t) * mb->n_ids))) return FB_ENOMEM;
    blocks[b].n = blocks[b].cap = (int32_t)mb->n_ids;
    for (size_t j = 0; j < mb->n_ids; j++) {
      if (mb->ids[j] < 0 || (size_t)mb->ids[j] >= m->n_stmts) {
        fb_errf(err, errlen,
                "kernel '%s': block %zu lists statement %d, which does not exist "
                "(%zu statements)",
                m->name, b, mb->ids[j], m->n_stmts);
        return FB_EINVAL;
      }
      blocks[b].ids[j] = mb->ids[j];
    }
  }
  return 0;
}

int fbp_kernel_from_pb(const Fusebox__V1__Kernel *m, const fb_layout *l, fb_kernel **out, char *err,
                       size_t errlen) {
  *out = NULL;
  if (!m) {
    fb_errf(err, errlen, "kernel: missing");
    return FB_EINVAL;
  }
  int rc = check_kernel_shape(m, err, errlen);
  if (rc) return rc;
  fb_type params[1024];
  for (size_t i = 0; i < m->n_params; i++) params[i] = (fb_type)m->params[i];
  fb_kernel *k = fb_kernel_new(l, m->name, (int)m->n_params, params, (fb_type)m->ret);
  if (!k) return FB_ENOMEM;
  if (m->n_stmts && !(k->stmts = malloc(sizeof(fb_stmt) * m->n_stmts))) rc = FB_ENOMEM;
  k->nstmts = k->cap = k->stmts ? (int32_t)m->n_stmts : 0;
  for (size_t i = 0; !rc && i < m->n_stmts; i++)
    rc = stmt_from_pb(m->stmts[i], (int)i, (int)m->n_blocks, &k->stmts[i], err, errlen);
  if (!rc) rc = blocks_from_pb(m, k, err, errlen);
  if (rc) {
    if (rc == FB_ENOMEM) fb_errf(err, errlen, "kernel '%s': out of memory", m->name);
    fb_kernel_free(k);
    return rc;
  }
  *out = k;
  return 0;
}

/* ---------------------------------------------------------------- launch batches */

/* Encoded size of a Value message's body. */
static size_t value_len(fb_value v) {
  size_t n = 0;
  if (v.type) n += 1 + varint_len((uint64_t)v.type);
  if (fb_type_is_float(v.type)) {
    if (v.v.u) n += 1 + 8;
  } else if (v.type == FB_T_U32 || v.type == FB_T_U64) {
    if (v.v.u) n += 1 + varint_len(v.v.u);
  } else if (v.v.i) {
    n += 1 + varint_len(zigzag(v.v.i));
  }
  return n;
}

static uint8_t *put_value(uint8_t *p, fb_value v) {
  if (v.type) p = put_varint(put_tag(p, 1, WT_VARINT), (uint64_t)v.type);
  if (fb_type_is_float(v.type)) {
    if (v.v.u) {
      p = put_tag(p, 4, WT_I64);
      for (int b = 0; b < 8; b++) *p++ = (uint8_t)(v.v.u >> (8 * b));
    }
  } else if (v.type == FB_T_U32 || v.type == FB_T_U64) {
    if (v.v.u) p = put_varint(put_tag(p, 3, WT_VARINT), v.v.u);
  } else if (v.v.i) {
    p = put_varint(put_tag(p, 2, WT_VARINT), zigzag(v.v.i));
  }
  return p;
}

/* Values are normalized first so that the bytes match protobuf-c's
 * (an f32 widened to double, integers in their 64-bit form). */
static fb_value wire_value(fb_value v) {
  if (fb_type_is_float(v.type)) v.v.f = fb_value_as_f64(v);
  return v;
}

void fbp_launch_append(fbp_buf *b, int kernel, const fb_value *args, int nargs) {
  size_t body = kernel ? 1 + varint_len((uint64_t)(int64_t)kernel) : 0;
  for (int a = 0; a < nargs; a++) {
    size_t vl = value_len(wire_value(args[a]));
    body += 1 + varint_len(vl) + vl;
  }
  if (fbp_buf_reserve(b, 1 + 10 + body)) return;
  uint8_t *p = b->p + b->n;
  p = put_varint(put_tag(p, 2, WT_LEN), body);
  if (kernel) p = put_varint(put_tag(p, 1, WT_VARINT), (uint64_t)(int64_t)kernel);
  for (int a = 0; a < nargs; a++) {
    fb_value v = wire_value(args[a]);
    p = put_varint(put_tag(p, 2, WT_LEN), value_len(v));
    p = put_value(p, v);
  }
  b->n = (size_t)(p - b->p);
}

void fbp_tape_append(fbp_buf *b, int at, int end, int loss) {
  /* SessionRequest.tape = 5: TapeMark { at = 1; end = 2; loss = 3 } */
  size_t mark = (at ? 1 + varint_len((uint64_t)(uint32_t)at) : 0) + (end ? 2 : 0) +
                (!end && loss ? 1 + varint_len((uint64_t)(int64_t)loss) : 0);
  if (fbp_buf_reserve(b, 1 + 10 + mark)) return;
  uint8_t *p = b->p + b->n;
  p = put_varint(put_tag(p, 5, WT_LEN), mark);
  if (at) p = put_varint(put_tag(p, 1, WT_VARINT), (uint64_t)(uint32_t)at);
  if (end) p = put_varint(put_tag(p, 2, WT_VARINT), 1);
  if (!end && loss) p = put_varint(put_tag(p, 3, WT_VARINT), (uint64_t)(int64_t)loss);
  b->n = (size_t)(p - b->p);
}

void fbp_session_tail(fbp_buf *b, const char *session_id, int flush, uint64_t sync) {
  size_t idl = session_id ? strlen(session_id) : 0;
  if (fbp_buf_reserve(b, idl + 32)) return;
  uint8_t *p = b->p + b->n;
  if (idl) {
    p = put_varint(put_tag(p, 1, WT_LEN), idl);
    memcpy(p, session_id, idl);
    p += idl;
  }
  if (flush) p = put_varint(put_tag(p, 3, WT_VARINT), 1);
  if (sync) p = put_varint(put_tag(p, 4, WT_VARINT), sync);
  b->n = (size_t)(p - b->p);
}

/* ---------------------------------------------------------------- field chunks */

size_t fbp_chunk_header(uint8_t *out, const char *session_id, int32_t field, uint64_t offset,
                        uint64_t total_bytes, size_t data_len) {
  size_t idl = session_id ? strlen(session_id) : 0;
  if (idl > 64) return 0;
  uint8_t *p = out;
  if (idl) {
    p = put_varint(put_tag(p, 1, WT_LEN), idl);
    memcpy(p, session_id, idl);
    p += idl;
  }
  if (field) p = put_varint(put_tag(p, 2, WT_VARINT), (uint64_t)(int64_t)field);
  if (offset) p = put_varint(put_tag(p, 3, WT_VARINT), offset);
  if (total_bytes) p = put_varint(put_tag(p, 4, WT_VARINT), total_bytes);
  if (data_len) p = put_varint(put_tag(p, 5, WT_LEN), data_len);
  return (size_t)(p - out);
}

/* Skip one field's payload of wire type wt; NULL when malformed. */
static const uint8_t *skip_field(const uint8_t *p, const uint8_t *end, int wt) {
  uint64_t v;
  switch (wt) {
  case WT_VARINT: return get_varint(p, end, &v);
  case WT_I64: return end - p >= 8 ? p + 8 : NULL;
  case WT_I32: return end - p >= 4 ? p + 4 : NULL;
  case WT_LEN:
    if (!(p = get_varint(p, end, &v)) || v > (uint64_t)(end - p)) return NULL;
    return p + v;
  default: return NULL; /* groups (3, 4) and unknown wire types */
  }
}

static int chunk_field(const uint8_t **pp, const uint8_t *end, int field, int wt, fbp_chunk *c) {
  const uint8_t *p = *pp;
  uint64_t v;
  if ((field == 1 || field == 5) && wt == WT_LEN) {
    if (!(p = get_varint(p, end, &v)) || v > (uint64_t)(end - p)) return -1;
    if (field == 1) {
      c->session_id = (const char *)p;
      c->session_id_len = (size_t)v;
    } else {
      c->data = p;
      c->len = (size_t)v;
    }
    p += v;
  } else if (field >= 2 && field <= 4 && wt == WT_VARINT) {
    if (!(p = get_varint(p, end, &v))) return -1;
    if (field == 2) c->field = (int32_t)v;
    else if (field == 3) c->offset = v;
    else c->total_bytes = v;
  } else if (field >= 1 && field <= 5) {
    return -1; /* a known field with the wrong wire type */
  } else if (!(p = skip_field(p, end, wt))) {
    return -1;
  }
  *pp = p;
  return 0;
}

int fbp_chunk_parse(const uint8_t *p, size_t n, fbp_chunk *out, char *err, size_t errlen) {
  memset(out, 0, sizeof *out);
  out->session_id = "";
  const uint8_t *end = p + n, *start = p;
  while (p < end) {
    uint64_t key;
    const uint8_t *at = p;
    if (!(p = get_varint(p, end, &key)) || (key >> 3) == 0 || (key >> 3) > 0x1fffffff ||
        chunk_field(&p, end, (int)(key >> 3), (int)(key & 7), out)) {
      fb_errf(err, errlen, "malformed FieldChunk at byte %zu of %zu", (size_t)(at - start), n);
      return FB_EINVAL;
    }
  }
  return 0;
}

int fbp_chunk_parse_head(const uint8_t *p, size_t avail, size_t total, fbp_chunk *out,
                         size_t *data_at) {
  memset(out, 0, sizeof *out);
  out->session_id = "";
  const uint8_t *end = p + (avail < total ? avail : total), *start = p;
  while (p < end) {
    uint64_t key, len;
    const uint8_t *q = get_varint(p, end, &key);
    if (!q) return 1; /* cut short by avail, or malformed: the full parser decides */
    int field = (int)(key >> 3), wt = (int)(key & 7);
    if (field == 5 && wt == WT_LEN) {
      if (!(q = get_varint(q, end, &len))) return 1;
      size_t off = (size_t)(q - start);
      if (len != total - off) return 1; /* not the last field (or malformed) */
      out->len = (size_t)len;
      *data_at = off;
      return 0;
    }
    if (field == 0 || (key >> 3) > 0x1fffffff || chunk_field(&q, end, field, wt, out)) return 1;
    p = q;
  }
  return 1;
}

/* ---------------------------------------------------------------- status codes */

int fbp_status_of_code(int code) {
  switch (code) {
#define FB_ERR(name, value, msg, grpc)                                                             \
  case FB_##name: return FBP_GRPC_##grpc;
#include "fusebox/errors.h"
#undef FB_ERR
  default: return FBP_GRPC_UNKNOWN;
  }
}

int fbp_code_of_status(int status) {
  switch (status) {
  case FBP_GRPC_OK: return FB_OK;
  case FBP_GRPC_INVALID_ARGUMENT:
  case FBP_GRPC_FAILED_PRECONDITION: return FB_EINVAL;
  case FBP_GRPC_NOT_FOUND: return FB_ENOENT;
  case FBP_GRPC_RESOURCE_EXHAUSTED: return FB_EQUOTA;
  case FBP_GRPC_OUT_OF_RANGE: return FB_EBOUNDS;
  case FBP_GRPC_UNIMPLEMENTED: return FB_EUNSUPPORTED;
  case FBP_GRPC_INTERNAL:
  case FBP_GRPC_DATA_LOSS: return FB_EINTERNAL;
  case FBP_GRPC_CANCELLED: return FB_ECANCELLED;
  case FBP_GRPC_DEADLINE_EXCEEDED: return FB_ETIMEOUT;
  default: return FB_EIO; /* unavailable, unknown, ... */
  }
}
