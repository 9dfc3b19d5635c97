/* Kernels, the op table, the builder and diagnostics. The builder infers
 * result types where the op defines them and never aborts: errors in the
 * program are the verifier's to report. */
#include <stdarg.h>
#include <stdio.h>

#include "ir_internal.h"

const fb_op_info fb_op_table[FB_OP__COUNT] = {
#define FB_OP(E, s, n, c, f) {s, n, c, f},
#include "fusebox/ops.h"
#undef FB_OP
};

int fb_op_from_name(const char *s, size_t n) {
  for (int op = 0; op < FB_OP__COUNT; op++)
    if (strlen(fb_op_table[op].name) == n && memcmp(fb_op_table[op].name, s, n) == 0) return op;
  return -1;
}

/* ---------------------------------------------------------------- kernels */

fb_kernel *fb_kernel_new(const fb_layout *l, const char *name, int nparams, const fb_type *params,
                         fb_type ret) {
  fb_kernel *k = calloc(1, sizeof *k);
  if (!k) return NULL;
  k->layout = l;
  k->name = fb__strdup(name ? name : "kernel");
  k->nparams = nparams;
  k->ret = ret;
  if (nparams > 0) {
    k->params = malloc(sizeof(fb_type) * (size_t)nparams);
    if (k->params) memcpy(k->params, params, sizeof(fb_type) * (size_t)nparams);
  }
  if (!k->name || (nparams > 0 && !k->params) || fb_block_new(k) != 0) {
    fb_kernel_free(k);
    return NULL;
  }
  return k;
}

void fb_kernel_free(fb_kernel *k) {
  if (!k) return;
  for (int b = 0; b < k->nblocks; b++) free(k->blocks[b].ids);
  free(k->blocks);
  free(k->stmts);
  free(k->params);
  free(k->name);
  free(k);
}

fb_kernel *fb_kernel_clone_to(const fb_kernel *k, const fb_layout *l) {
  fb_kernel *c = calloc(1, sizeof *c);
  if (!c) return NULL;
  c->layout = l;
  c->name = fb__strdup(k->name);
  c->nparams = k->nparams;
  c->ret = k->ret;
  c->nstmts = c->cap = k->nstmts;
  c->nblocks = c->bcap = k->nblocks;
  c->params = k->nparams ? malloc(sizeof(fb_type) * (size_t)k->nparams) : NULL;
  c->stmts = k->nstmts ? malloc(sizeof(fb_stmt) * (size_t)k->nstmts) : NULL;
  c->blocks = calloc((size_t)(k->nblocks ? k->nblocks : 1), sizeof(fb_block));
  if (!c->name || (k->nparams && !c->params) || (k->nstmts && !c->stmts) || !c->blocks) {
    c->nblocks = 0;
    fb_kernel_free(c);
    return NULL;
  }
  if (k->nparams) memcpy(c->params, k->params, sizeof(fb_type) * (size_t)k->nparams);
  if (k->nstmts) memcpy(c->stmts, k->stmts, sizeof(fb_stmt) * (size_t)k->nstmts);
  for (int b = 0; b < k->nblocks; b++) {
    const fb_block *s = &k->blocks[b];
    fb_block *d = &c->blocks[b];
    d->n = d->cap = s->n;
    if (s->n) {
      d->ids = malloc(sizeof(int32_t) * (size_t)s->n);
      if (!d->ids) {
        fb_kernel_free(c);
        return NULL;
      }
      memcpy(d->ids, s->ids, sizeof(int32_t) * (size_t)s->n);
    }
  }
  return c;
}

fb_kernel *fb_kernel_clone(const fb_kernel *k) { return fb_kernel_clone_to(k, k->layout); }

static int find_in(const fb_kernel *k, int blk, int stmt, int *pos, int depth) {
  if (depth > FB_MAX_BLOCK_DEPTH) return -1;
  const fb_block *b = &k->blocks[blk];
  for (int i = 0; i < b->n; i++) {
    int id = b->ids[i];
    if (id == stmt) {
      if (pos) *pos = i;
      return blk;
    }
    if (id < 0 || id >= k->nstmts) continue;
    const fb_stmt *s = &k->stmts[id];
    int r;
    if (s->body >= 0 && s->body < k->nblocks &&
        (r = find_in(k, s->body, stmt, pos, depth + 1)) >= 0)
      return r;
    if (s->orelse >= 0 && s->orelse < k->nblocks &&
        (r = find_in(k, s->orelse, stmt, pos, depth + 1)) >= 0)
      return r;
  }
  return -1;
}

int fb_kernel_block_of(const fb_kernel *k, int stmt, int *pos) {
  return k->nblocks ? find_in(k, 0, stmt, pos, 0) : -1;
}

static int count_in(const fb_kernel *k, int blk, int depth) {
  if (blk < 0 || blk >= k->nblocks || depth > FB_MAX_BLOCK_DEPTH) return 0;
  int n = 0;
  const fb_block *b = &k->blocks[blk];
  for (int i = 0; i < b->n; i++) {
    n++;
    int id = b->ids[i];
    if (id < 0 || id >= k->nstmts) continue;
    n += count_in(k, k->stmts[id].body, depth + 1) + count_in(k, k->stmts[id].orelse, depth + 1);
  }
  return n;
}

int fb_kernel_count_stmts(const fb_kernel *k) { return count_in(k, 0, 0); }

/* ---------------------------------------------------------------- builder */

int fb_block_new(fb_kernel *k) {
  if (FB_GROW(k->blocks, k->nblocks, k->bcap)) return FB_ENOMEM;
  memset(&k->blocks[k->nblocks], 0, sizeof(fb_block));
  return k->nblocks++;
}

void fb_builder_init(fb_builder *b, fb_kernel *k) {
  b->k = k;
  b->block = 0;
  b->err = 0;
}

int fb_b_emit(fb_builder *b, const fb_stmt *s) {
  fb_kernel *k = b->k;
  if (b->err) return b->err;
  if (b->block < 0 || b->block >= k->nblocks) return b->err = FB_EINVAL;
  if (FB_GROW(k->stmts, k->nstmts, k->cap)) return b->err = FB_ENOMEM;
  fb_block *blk = &k->blocks[b->block];
  if (FB_GROW(blk->ids, blk->n, blk->cap)) return b->err = FB_ENOMEM;
  int id = k->nstmts++;
  k->stmts[id] = *s;
  blk->ids[blk->n++] = id;
  return id;
}

static fb_stmt mk(fb_op op, fb_type t) {
  fb_stmt s;
  memset(&s, 0, sizeof s);
  s.op = (uint16_t)op;
  s.type = (uint8_t)t;
  s.snode = -1;
  s.body = s.orelse = -1;
  for (int i = 0; i < FB_MAX_ARGS; i++) s.args[i] = -1;
  return s;
}

static fb_type type_of(fb_builder *b, int id) {
  return id >= 0 && id < b->k->nstmts ? (fb_type)b->k->stmts[id].type : FB_T_VOID;
}

int fb_b_const(fb_builder *b, fb_value v) {
  fb_stmt s = mk(FB_OP_CONST, v.type);
  if (v.type == FB_T_F32) s.imm.f = (float)v.v.f;
  else if (v.type == FB_T_F64) s.imm.f = v.v.f;
  else s.imm.u = fb_value_cast(v, v.type).v.u;
  return fb_b_emit(b, &s);
}
int fb_b_const_i32(fb_builder *b, int32_t v) { return fb_b_const(b, fb_value_i32(v)); }
int fb_b_const_i64(fb_builder *b, int64_t v) { return fb_b_const(b, fb_value_i64(v)); }
int fb_b_const_u32(fb_builder *b, uint32_t v) { return fb_b_const(b, fb_value_u32(v)); }
int fb_b_const_u64(fb_builder *b, uint64_t v) { return fb_b_const(b, fb_value_u64(v)); }
int fb_b_const_f32(fb_builder *b, float v) { return fb_b_const(b, fb_value_f32(v)); }
int fb_b_const_f64(fb_builder *b, double v) { return fb_b_const(b, fb_value_f64(v)); }
int fb_b_const_bool(fb_builder *b, int v) { return fb_b_const(b, fb_value_bool(v)); }

int fb_b_arg(fb_builder *b, int index) {
  fb_type t = index >= 0 && index < b->k->nparams ? b->k->params[index] : FB_T_VOID;
  fb_stmt s = mk(FB_OP_ARG, t);
  s.imm.i = index;
  return fb_b_emit(b, &s);
}

int fb_b_unary(fb_builder *b, fb_op op, int a) {
  fb_stmt s = mk(op, type_of(b, a));
  s.nargs = 1;
  s.args[0] = a;
  return fb_b_emit(b, &s);
}

int fb_b_binary(fb_builder *b, fb_op op, int a, int c) {
  int cls = (unsigned)op < FB_OP__COUNT ? fb_op_table[op].cls : -1;
  fb_stmt s = mk(op, cls == FB_OPC_CMP ? FB_T_BOOL : type_of(b, a));
  s.nargs = 2;
  s.args[0] = a;
  s.args[1] = c;
  return fb_b_emit(b, &s);
}

int fb_b_cast(fb_builder *b, fb_type to, int a) {
  fb_stmt s = mk(FB_OP_CAST, to);
  s.nargs = 1;
  s.args[0] = a;
  return fb_b_emit(b, &s);
}

int fb_b_select(fb_builder *b, int cond, int a, int c) {
  fb_stmt s = mk(FB_OP_SELECT, type_of(b, a));
  s.nargs = 3;
  s.args[0] = cond;
  s.args[1] = a;
  s.args[2] = c;
  return fb_b_emit(b, &s);
}

int fb_b_alloca(fb_builder *b, fb_type t) {
  fb_stmt s = mk(FB_OP_ALLOCA, t);
  return fb_b_emit(b, &s);
}

int fb_b_lload(fb_builder *b, int var) {
  fb_stmt s = mk(FB_OP_LLOAD, type_of(b, var));
  s.nargs = 1;
  s.args[0] = var;
  return fb_b_emit(b, &s);
}

int fb_b_lstore(fb_builder *b, int var, int value) {
  fb_stmt s = mk(FB_OP_LSTORE, FB_T_VOID);
  s.nargs = 2;
  s.args[0] = var;
  s.args[1] = value;
  return fb_b_emit(b, &s);
}

static fb_type global_result(fb_builder *b, fb_op op, int snode) {
  const fb_layout *l = b->k->layout;
  fb_type ft = l && snode >= 0 && snode < l->nnodes ? l->nodes[snode].type : FB_T_VOID;
  switch (op) {
  case FB_OP_LOAD:
  case FB_OP_ATOMIC_ADD:
  case FB_OP_ATOMIC_SUB:
  case FB_OP_ATOMIC_MIN:
  case FB_OP_ATOMIC_MAX:
  case FB_OP_ATOMIC_AND:
  case FB_OP_ATOMIC_OR:
  case FB_OP_ATOMIC_XOR: return ft;
  case FB_OP_IS_ACTIVE: return FB_T_BOOL;
  case FB_OP_APPEND:
  case FB_OP_LENGTH: return FB_T_I32;
  default: return FB_T_VOID;
  }
}

int fb_b_global(fb_builder *b, fb_op op, int snode, const int *idx, int nidx, int value) {
  if (nidx < 0 || nidx + (value >= 0) > FB_MAX_ARGS) return b->err = FB_EINVAL;
  fb_stmt s = mk(op, global_result(b, op, snode));
  s.snode = snode;
  for (int i = 0; i < nidx; i++) s.args[i] = idx[i];
  s.nargs = (uint8_t)nidx;
  if (value >= 0) s.args[s.nargs++] = value;
  return fb_b_emit(b, &s);
}

int fb_b_load(fb_builder *b, int field, const int *idx, int nidx) {
  return fb_b_global(b, FB_OP_LOAD, field, idx, nidx, -1);
}

int fb_b_store(fb_builder *b, int field, const int *idx, int nidx, int value) {
  return fb_b_global(b, FB_OP_STORE, field, idx, nidx, value);
}

int fb_b_hint_unique(fb_builder *b, int value, int field) {
  fb_stmt s = mk(FB_OP_ASSUME_UNIQUE, type_of(b, value));
  s.nargs = 1;
  s.args[0] = value;
  s.snode = field;
  return fb_b_emit(b, &s);
}

static int with_blocks(fb_builder *b, fb_stmt *s, int body, int orelse) {
  if (body) {
    int nb = fb_block_new(b->k);
    if (nb < 0) return b->err = nb;
    s->body = nb;
  }
  if (orelse) {
    int nb = fb_block_new(b->k);
    if (nb < 0) return b->err = nb;
    s->orelse = nb;
  }
  return fb_b_emit(b, s);
}

int fb_b_if(fb_builder *b, int cond, int with_else) {
  fb_stmt s = mk(FB_OP_IF, FB_T_VOID);
  s.nargs = 1;
  s.args[0] = cond;
  return with_blocks(b, &s, 1, with_else);
}

int fb_b_while(fb_builder *b) {
  fb_stmt s = mk(FB_OP_WHILE, FB_T_VOID);
  return with_blocks(b, &s, 1, 0);
}

int fb_b_range_for(fb_builder *b, int begin, int end, int parallel) {
  fb_stmt s = mk(parallel ? FB_OP_PAR_FOR : FB_OP_RANGE_FOR, FB_T_VOID);
  s.nargs = 2;
  s.args[0] = begin;
  s.args[1] = end;
  return with_blocks(b, &s, 1, 0);
}

int fb_b_struct_for(fb_builder *b, int snode) {
  fb_stmt s = mk(FB_OP_STRUCT_FOR, FB_T_VOID);
  s.snode = snode;
  return with_blocks(b, &s, 1, 0);
}

int fb_b_break(fb_builder *b) {
  fb_stmt s = mk(FB_OP_BREAK, FB_T_VOID);
  return fb_b_emit(b, &s);
}

int fb_b_continue(fb_builder *b) {
  fb_stmt s = mk(FB_OP_CONTINUE, FB_T_VOID);
  return fb_b_emit(b, &s);
}

int fb_b_loop_index(fb_builder *b, int loop, int which) {
  fb_stmt s = mk(FB_OP_LOOP_INDEX, FB_T_I32);
  s.nargs = 1;
  s.args[0] = loop;
  s.imm.i = which;
  return fb_b_emit(b, &s);
}

int fb_b_ret(fb_builder *b, int value, int slot) {
  fb_stmt s = mk(FB_OP_RET, FB_T_VOID);
  s.nargs = 1;
  s.args[0] = value;
  s.imm.i = slot;
  return fb_b_emit(b, &s);
}

int fb_b_rand(fb_builder *b, int site) {
  fb_stmt s = mk(FB_OP_RAND, FB_T_F32);
  s.imm.i = site;
  return fb_b_emit(b, &s);
}

int fb_b_gtmp_load(fb_builder *b, fb_type t, int64_t offset) {
  fb_stmt s = mk(FB_OP_GTMP_LOAD, t);
  s.imm.i = offset;
  return fb_b_emit(b, &s);
}

int fb_b_gtmp_store(fb_builder *b, int value, int64_t offset) {
  fb_stmt s = mk(FB_OP_GTMP_STORE, FB_T_VOID);
  s.nargs = 1;
  s.args[0] = value;
  s.imm.i = offset;
  return fb_b_emit(b, &s);
}

int fb_b_enter(fb_builder *b, int block) {
  int prev = b->block;
  b->block = block;
  return prev;
}

void fb_b_leave(fb_builder *b, int saved) { b->block = saved; }

/* ---------------------------------------------------------------- diagnostics */

void fb_diags_init(fb_diags *d) { memset(d, 0, sizeof *d); }

void fb_diags_free(fb_diags *d) {
  if (!d) return;
  for (int i = 0; i < d->n; i++) free(d->v[i].msg);
  free(d->v);
  memset(d, 0, sizeof *d);
}

void fb_diags_add(fb_diags *d, int stmt, int line, int col, const char *fmt, ...) {
  if (!d || FB_GROW(d->v, d->n, d->cap)) return;
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(NULL, 0, fmt, ap);
  va_end(ap);
  char *m = malloc((size_t)(n > 0 ? n : 0) + 1);
  if (!m) return;
  va_start(ap, fmt);
  vsnprintf(m, (size_t)n + 1, fmt, ap);
  va_end(ap);
  d->v[d->n].stmt = stmt;
  d->v[d->n].line = line;
  d->v[d->n].col = col;
  d->v[d->n].msg = m;
  d->n++;
}

char *fb_diags_join(const fb_diags *d) {
  size_t len = 1;
  for (int i = 0; i < d->n; i++) len += strlen(d->v[i].msg) + 1;
  char *s = malloc(len), *p = s;
  if (!s) return NULL;
  for (int i = 0; i < d->n; i++) {
    size_t m = strlen(d->v[i].msg);
    memcpy(p, d->v[i].msg, m);
    p += m;
    *p++ = '\n';
  }
  *p = 0;
  return s;
}
