/* The IR text printer: layouts and kernels in the canonical text form that
 * ir/parse.c reads back (docs/ir.md has the grammar). Its output is what
 * golden tests and `fusebox ir` show, so it is stable: one statement per
 * line, two spaces per nesting level, '\n' line ends, and floats in the
 * shortest form that re-parses to the same bits. It never fails on
 * malformed IR: what it cannot express it prints in a form the parser
 * rejects with a clear message ('?' for an SNode that does not exist,
 * '# ...' comments for blocks it cannot reach). Only allocation fails. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>

#include "base/strbuf.h"
#include "ir_internal.h"

/* ---------------------------------------------------------------- syntax */

/* The shape of a statement's operands, decided by the op's class so that a
 * new op in fusebox/ops.h gets a text form without touching this file:
 *   'p' op %a, %b, ...          'i' op %a, ..., INT (arg, ret, loop_index, ...)
 *   'c' const.T LITERAL         'g' op F[%i, ...]    'v' op F[%i, ...], %v
 *   'h' op %v covers F          'f' if %c {          'w' while {
 *   'r' op %N in %a .. %b {     's' struct_for %N over F {
 * 0 for an op outside the table. */
int fb__text_form(int op) {
  if (op < 0 || op >= FB_OP__COUNT) return 0;
  switch (fb_op_table[op].cls) {
  case FB_OPC_CONST: return 'c';
  case FB_OPC_ARG:
  case FB_OPC_RET:
  case FB_OPC_LOOPIDX:
  case FB_OPC_GTMP:
  case FB_OPC_RAND: return 'i';
  case FB_OPC_GLOAD:
  case FB_OPC_SPARSE:
  case FB_OPC_LENGTH: return 'g';
  case FB_OPC_GSTORE:
  case FB_OPC_ATOMIC:
  case FB_OPC_IATOMIC:
  case FB_OPC_APPEND: return 'v';
  case FB_OPC_HINT: return 'h';
  case FB_OPC_IF: return 'f';
  case FB_OPC_LOOP: return 'w';
  case FB_OPC_RANGE: return 'r';
  case FB_OPC_STRUCT: return 's';
  default: return fb_op_table[op].flags & FB_OPF_SNODE ? 'g' : 'p';
  }
}

/* Names (kernels, fields, SNodes) print bare when they match
 * [A-Za-z_][A-Za-z0-9_.]* and quoted otherwise. */
int fb__text_name_char(int c, int first) {
  if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_') return 1;
  return !first && ((c >= '0' && c <= '9') || c == '.');
}

/* ---------------------------------------------------------------- buffer */

static void indent(fb_sb *b, int depth) {
  for (int i = 0; i < depth; i++) fb_sb_putn(b, "  ", 2);
}

/* ---------------------------------------------------------------- pieces */

static void put_name(fb_sb *b, const char *s) {
  int bare = s && *s;
  for (const char *c = s; bare && *c; c++) bare = fb__text_name_char((unsigned char)*c, c == s);
  if (bare) {
    fb_sb_puts(b, s);
    return;
  }
  fb_sb_putn(b, "\"", 1);
  for (const unsigned char *c = (const unsigned char *)(s ? s : ""); *c; c++) {
    if (*c == '"' || *c == '\\') fb_sb_printf(b, "\\%c", *c);
    else if (*c < 0x20 || *c >= 0x7f) fb_sb_printf(b, "\\x%02x", *c);
    else fb_sb_putn(b, (const char *)c, 1);
  }
  fb_sb_putn(b, "\"", 1);
}

static void put_type(fb_sb *b, int t) { fb_sb_puts(b, fb_type_name((fb_type)t)); }

/* An SNode by its name when the name finds it, else by its path of child
 * positions from the root (@0.2); '?' when there is no such node. */
static void put_snode(fb_sb *b, const fb_layout *l, int id) {
  if (!l || id < 0 || id >= l->nnodes) {
    fb_sb_putn(b, "?", 1);
    return;
  }
  const char *nm = l->nodes[id].name;
  if (nm && fb_layout_find(l, nm) == id) {
    put_name(b, nm);
    return;
  }
  int path[64], n = 0;
  for (int s = id; s > 0; s = l->nodes[s].parent) {
    int p = l->nodes[s].parent, pos = -1;
    if (p < 0 || p >= l->nnodes || n == 64) {
      fb_sb_putn(b, "?", 1);
      return;
    }
    for (int c = 0; c < l->nodes[p].nchildren; c++)
      if (l->nodes[p].children[c] == s) pos = c;
    if (pos < 0) {
      fb_sb_putn(b, "?", 1);
      return;
    }
    path[n++] = pos;
  }
  fb_sb_putn(b, "@", 1);
  for (int i = n - 1; i >= 0; i--) fb_sb_printf(b, i == n - 1 ? "%d" : ".%d", path[i]);
}

static int same_bits(double a, double b, int f32) {
  if (f32) {
    float x = (float)a, y = (float)b;
    return memcmp(&x, &y, sizeof x) == 0;
  }
  return memcmp(&a, &b, sizeof a) == 0;
}

static int reparses(const char *s, double v, int f32) {
  return f32 ? same_bits(strtof(s, NULL), v, 1) : same_bits(strtod(s, NULL), v, 0);
}

/* Shortest %.Ng that reads back as the same bits; fixed notation for
 * decimal exponents in [-4, 9 or 17); ".0" added so a float always looks
 * like one. inf, -inf and the default quiet NaN by name, other NaNs by
 * their bits (nan:0x...). */
static void put_float(fb_sb *b, double v, int f32) {
  if (isnan(v)) {
    if (f32) {
      float f = (float)v;
      uint32_t w;
      memcpy(&w, &f, 4);
      if (w == 0x7fc00000u) fb_sb_puts(b, "nan");
      else fb_sb_printf(b, "nan:0x%08x", (unsigned)w);
    } else {
      uint64_t w;
      memcpy(&w, &v, 8);
      if (w == 0x7ff8000000000000ull) fb_sb_puts(b, "nan");
      else fb_sb_printf(b, "nan:0x%016llx", (unsigned long long)w);
    }
    return;
  }
  if (isinf(v)) {
    fb_sb_puts(b, v < 0 ? "-inf" : "inf");
    return;
  }
  int maxp = f32 ? 9 : 17, p;
  char s[512], t[512]; /* %g of a double needs at most ~330 */
  for (p = 1; p < maxp; p++) {
    snprintf(s, sizeof s, "%.*g", p, v);
    if (reparses(s, v, f32)) break;
  }
  snprintf(s, sizeof s, "%.*g", p, v);
  char e[512];
  snprintf(e, sizeof e, "%.*e", p - 1, v);
  const char *ep = strchr(e, 'e');
  int ex = ep ? atoi(ep + 1) : 0;
  if (ex >= p && ex < maxp) {
    snprintf(t, sizeof t, "%.*g", ex + 1, v);
    if (reparses(t, v, f32)) memcpy(s, t, sizeof s);
  }
  fb_sb_puts(b, s);
  if (!strpbrk(s, ".e")) fb_sb_puts(b, ".0");
}

static void put_const(fb_sb *b, const fb_stmt *s) {
  switch (s->type) {
  case FB_T_BOOL:
    if (s->imm.u <= 1) fb_sb_puts(b, s->imm.u ? "true" : "false");
    else fb_sb_printf(b, "%llu", (unsigned long long)s->imm.u);
    break;
  case FB_T_U32:
  case FB_T_U64: fb_sb_printf(b, "%llu", (unsigned long long)s->imm.u); break;
  case FB_T_F32: put_float(b, s->imm.f, 1); break;
  case FB_T_F64: put_float(b, s->imm.f, 0); break;
  default: fb_sb_printf(b, "%lld", (long long)s->imm.i); break;
  }
}

/* ---------------------------------------------------------------- layouts */

static void print_node(fb_sb *b, const fb_layout *l, int id, int depth) {
  const fb_snode *s = &l->nodes[id];
  indent(b, depth);
  if (s->kind == FB_SN_PLACE) {
    fb_sb_puts(b, "place ");
    put_name(b, s->name);
    fb_sb_puts(b, ": ");
    put_type(b, s->type);
    fb_sb_putn(b, "\n", 1);
    return;
  }
  fb_sb_printf(b, "%s(", fb_snode_kind_name(s->kind));
  for (int a = 0; a < FB_MAX_AXES; a++)
    if (s->axes & (1u << a)) fb_sb_printf(b, "%c", 'i' + a);
  fb_sb_putn(b, ":", 1);
  for (int a = 0, first = 1; a < FB_MAX_AXES; a++)
    if (s->axes & (1u << a)) {
      fb_sb_printf(b, first ? " %lld" : ", %lld", (long long)s->size[a]);
      first = 0;
    }
  if (s->kind == FB_SN_DYNAMIC) fb_sb_printf(b, ", chunk: %lld", (long long)s->chunk);
  fb_sb_putn(b, ")", 1);
  if (s->name) {
    fb_sb_puts(b, " as ");
    put_name(b, s->name);
  }
  fb_sb_puts(b, " {\n");
  for (int c = 0; c < s->nchildren; c++) {
    int ch = s->children[c];
    if (ch <= id || ch >= l->nnodes || depth > 64) {
      indent(b, depth + 1);
      fb_sb_printf(b, "# bad child SNode %d\n", ch);
    } else {
      print_node(b, l, ch, depth + 1);
    }
  }
  indent(b, depth);
  fb_sb_puts(b, "}\n");
}

char *fb_layout_print(const fb_layout *l) {
  fb_sb b = {0};
  fb_sb_puts(&b, "layout {\n");
  if (l && l->nnodes > 0) {
    const fb_snode *r = &l->nodes[0];
    for (int c = 0; c < r->nchildren; c++) {
      int ch = r->children[c];
      if (ch > 0 && ch < l->nnodes) print_node(&b, l, ch, 1);
    }
  }
  fb_sb_puts(&b, "}\n");
  return fb_sb_done(&b);
}

/* ---------------------------------------------------------------- kernels */

typedef struct kprint {
  fb_sb *b;
  const fb_kernel *k;
  int prev;            /* id of the statement printed last */
  unsigned char *seen; /* blocks printed already (cycle guard) */
} kprint;

static void print_block(kprint *P, int blk, int depth);

static void put_ids(fb_sb *b, const fb_stmt *s, int from, int to, const char *first) {
  for (int i = from; i < to; i++) fb_sb_printf(b, "%s%%%d", i == from ? first : ", ", s->args[i]);
}

static void put_access(kprint *P, const fb_stmt *s, int nidx) {
  fb_sb_putn(P->b, " ", 1);
  put_snode(P->b, P->k->layout, s->snode);
  fb_sb_putn(P->b, "[", 1);
  put_ids(P->b, s, 0, nidx, "");
  fb_sb_putn(P->b, "]", 1);
}

/* Everything after the op name (and the loop's own id). */
static void put_operands(kprint *P, const fb_stmt *s, int form, int nargs) {
  fb_sb *b = P->b;
  switch (form) {
  case 'i':
    put_ids(b, s, 0, nargs, " ");
    fb_sb_printf(b, "%s%lld", nargs ? ", " : " ", (long long)s->imm.i);
    break;
  case 'c':
    fb_sb_putn(b, " ", 1);
    put_const(b, s);
    break;
  case 'g': put_access(P, s, nargs); break;
  case 'v':
    put_access(P, s, nargs ? nargs - 1 : 0);
    if (nargs) fb_sb_printf(b, ", %%%d", s->args[nargs - 1]);
    break;
  case 'h':
    fb_sb_printf(b, " %%%d covers ", s->args[0]);
    put_snode(b, P->k->layout, s->snode);
    break;
  case 'f': fb_sb_printf(b, " %%%d", s->args[0]); break;
  case 'w': break;
  case 'r': fb_sb_printf(b, " in %%%d .. %%%d", s->args[0], s->args[1]); break;
  case 's':
    fb_sb_puts(b, " over ");
    put_snode(b, P->k->layout, s->snode);
    break;
  default: put_ids(b, s, 0, nargs, " "); break;
  }
}

/* Blocks are printed by the ops that own them: if, while and the loops. */
static int opens_block(int form) {
  return form == 'f' || form == 'w' || form == 'r' || form == 's';
}

static void print_stmt(kprint *P, int id, int depth) {
  fb_sb *b = P->b;
  const fb_kernel *k = P->k;
  indent(b, depth);
  if (id < 0 || id >= k->nstmts) {
    fb_sb_printf(b, "# bad statement id %d\n", id);
    return;
  }
  const fb_stmt *s = &k->stmts[id];
  int form = fb__text_form(s->op);
  if (!form) {
    fb_sb_printf(b, "# %%%d has unknown op %u\n", id, (unsigned)s->op);
    return;
  }
  /* the fused part (fb_stmt.part) as a prefix, only where it is not 0 */
  if (s->part) fb_sb_printf(b, "part %d ", (int)s->part);
  const char *name = fb_op_table[s->op].name;
  int nargs = s->nargs < FB_MAX_ARGS ? s->nargs : FB_MAX_ARGS;
  if (form == 'r' || form == 's') {
    fb_sb_puts(b, name);
    if (s->type != FB_T_VOID) {
      fb_sb_putn(b, ".", 1);
      put_type(b, s->type);
    }
    fb_sb_printf(b, " %%%d", id);
  } else if (s->type != FB_T_VOID) {
    fb_sb_printf(b, "%%%d = %s.", id, name);
    put_type(b, s->type);
  } else {
    if (id != P->prev + 1) fb_sb_printf(b, "%%%d: ", id);
    fb_sb_puts(b, name);
  }
  P->prev = id;
  put_operands(P, s, form, nargs);
  if (!opens_block(form)) {
    fb_sb_putn(b, "\n", 1);
    return;
  }
  fb_sb_puts(b, " {\n");
  print_block(P, s->body, depth + 1);
  if (form == 'f' && s->orelse >= 0) {
    indent(b, depth);
    fb_sb_puts(b, "} else {\n");
    print_block(P, s->orelse, depth + 1);
  }
  indent(b, depth);
  fb_sb_puts(b, "}\n");
}

static void print_block(kprint *P, int blk, int depth) {
  const fb_kernel *k = P->k;
  if (blk < 0) return; /* a missing body prints as an empty one */
  if (blk >= k->nblocks || P->seen[blk] || depth > FB_MAX_BLOCK_DEPTH) {
    indent(P->b, depth);
    fb_sb_printf(P->b, "# block %d not printed: invalid, repeated or nested too deeply\n", blk);
    return;
  }
  P->seen[blk] = 1;
  const fb_block *bl = &k->blocks[blk];
  for (int i = 0; i < bl->n; i++) print_stmt(P, bl->ids[i], depth);
}

static void print_header(fb_sb *b, const fb_kernel *k) {
  fb_sb_puts(b, "kernel ");
  put_name(b, k->name ? k->name : "");
  fb_sb_putn(b, "(", 1);
  for (int i = 0; i < k->nparams; i++) {
    if (i) fb_sb_puts(b, ", ");
    put_type(b, k->params[i]);
  }
  fb_sb_putn(b, ")", 1);
  if (k->ret != FB_T_VOID) {
    fb_sb_puts(b, " -> ");
    put_type(b, k->ret);
  }
  fb_sb_puts(b, " {\n");
}

char *fb_kernel_print(const fb_kernel *k) {
  if (!k) return NULL;
  fb_sb b = {0};
  kprint P = {&b, k, -1, calloc((size_t)(k->nblocks > 0 ? k->nblocks : 1), 1)};
  if (!P.seen) return NULL;
  print_header(&b, k);
  if (k->nblocks > 0) print_block(&P, 0, 1);
  fb_sb_puts(&b, "}\n");
  free(P.seen);
  return fb_sb_done(&b);
}

void fb_kernel_fprint(FILE *f, const fb_kernel *k) {
  char *s = fb_kernel_print(k);
  if (s) fputs(s, f);
  free(s);
}
