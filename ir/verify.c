/* The IR verifier (a pass, in the spirit of QBE's ssacheck). It walks the
 * blocks reachable from the kernel body once, in program order, keeping the
 * scope of every statement (defined, in scope, out of scope), and checks each
 * statement against the op table: arity from nargs (or the SNode's dimension
 * for global ops), operand kinds, and the type rule of the op's class.
 * Every error is reported as "%<id> <op>: <rule>" (kernel-wide ones as
 * "kernel: <rule>"); nothing here trusts the kernel, so garbage input (bad
 * ops, ids, counts, block cycles) gets diagnostics, never a crash. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "ir_internal.h"

enum {
  ST_UNSEEN = 0,
  ST_LIVE,
  ST_DEAD
};    /* statement scope */
enum {
  BK_UNSEEN = 0,
  BK_OPEN,
  BK_DONE
};    /* block walk state */
enum {
  K_VALUE = 0,
  K_VAR,
  K_LOOP
};         /* what an operand slot expects */

typedef struct vctx {
  const fb_kernel *k;
  const fb_layout *lay; /* NULL when missing or not finalized */
  fb_diags *out;
  int nerr;
  int nstmts, nblocks;  /* usable counts (0 when the arrays are missing) */
  int params_ok;
  uint8_t *state;       /* per statement: ST_* */
  int32_t *home;        /* per statement: block it was first met in */
  uint8_t *bstate;      /* per block: BK_* */
  int stack[FB_MAX_BLOCK_DEPTH]; /* statements owning the blocks being walked */
  int depth;
} vctx;

static const char *plural(int n) { return n == 1 ? "" : "s"; }

static const char *op_name(unsigned op) { return op < FB_OP__COUNT ? fb_op_table[op].name : "?"; }

#if defined(__GNUC__)
__attribute__((format(printf, 3, 4)))
#endif
static void
verr(vctx *v, int id, const char *fmt, ...) {
  char msg[256];
  va_list ap;
  va_start(ap, fmt);
  fb_verrf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  v->nerr++;
  if (id < 0) fb_diags_add(v->out, -1, 0, 0, "kernel: %s", msg);
  else fb_diags_add(v->out, id, 0, 0, "%%%d %s: %s", id, op_name(v->k->stmts[id].op), msg);
}

/* ---------------------------------------------------------------- type helpers */

static const char *tname(unsigned t) { return fb_type_name((fb_type)t); }
static int t_valid(unsigned t) { return t > FB_T_VOID && t < FB_T__COUNT; }
static int t_int(unsigned t) { return fb_type_is_int((fb_type)t); }
static int t_float(unsigned t) { return fb_type_is_float((fb_type)t); }
static int t_num(unsigned t) { return t_int(t) || t_float(t); }
static int t_int_bool(unsigned t) { return t_int(t) || t == FB_T_BOOL; }

/* Type of operand i (the caller has checked that it is in range). */
static unsigned otype(const vctx *v, const fb_stmt *s, int i) {
  return v->k->stmts[s->args[i]].type;
}

/* Does an op of this table entry produce a result? Driven by class (and,
 * inside the mixed classes, by the table's flags and arity). */
static int yields_value(const fb_op_info *oi) {
  switch (oi->cls) {
  case FB_OPC_LSTORE:
  case FB_OPC_GSTORE:
  case FB_OPC_IF:
  case FB_OPC_LOOP:
  case FB_OPC_RANGE:
  case FB_OPC_STRUCT:
  case FB_OPC_JUMP:
  case FB_OPC_RET: return 0;
  case FB_OPC_SPARSE: return !(oi->flags & FB_OPF_WRITES); /* is_active */
  case FB_OPC_GTMP: return oi->nargs == 0;                  /* gtmp_load */
  case FB_OPC_RAND: return !(oi->flags & FB_OPF_SIDE);      /* rand, not rand_seq */
  default: return 1;
  }
}

static int slot_kind(int cls, int i) {
  if (i == 0 && (cls == FB_OPC_LLOAD || cls == FB_OPC_LSTORE)) return K_VAR;
  if (i == 0 && cls == FB_OPC_LOOPIDX) return K_LOOP;
  return K_VALUE;
}

/* Global ops: indices of the SNode (fewer by the dynamic axis for
 * append/length) and whether a value operand follows them. */
static int global_indices(int cls, const fb_snode *n) {
  if (cls == FB_OPC_APPEND || cls == FB_OPC_LENGTH) return n->ndim > 0 ? n->ndim - 1 : 0;
  return n->ndim;
}
static int global_has_value(int cls) {
  return cls == FB_OPC_GSTORE || cls == FB_OPC_ATOMIC || cls == FB_OPC_IATOMIC ||
         cls == FB_OPC_APPEND;
}

static const fb_snode *snode_of(const vctx *v, const fb_stmt *s) {
  return &v->lay->nodes[s->snode];
}
static const char *snode_label(const fb_snode *n) {
  return n->name ? n->name : fb_snode_kind_name(n->kind);
}

/* ---------------------------------------------------------------- kernel shape */

static void check_kernel(vctx *v) {
  const fb_kernel *k = v->k;
  if (!k->layout) verr(v, -1, "no layout");
  else if (!k->layout->finalized) verr(v, -1, "layout is not finalized");
  else if (k->layout->nnodes < 1 || !k->layout->nodes) verr(v, -1, "layout has no root");
  else v->lay = k->layout;
  if (k->nparams < 0 || (k->nparams > 0 && !k->params)) {
    verr(v, -1, "parameter list is malformed (%d parameters)", k->nparams);
  } else {
    v->params_ok = 1;
    for (int i = 0; i < k->nparams; i++)
      if (!t_valid((unsigned)k->params[i]))
        verr(v, -1, "parameter %d has type %s (%u); parameters need a non-void type", i,
             tname((unsigned)k->params[i]), (unsigned)k->params[i]);
  }
  if ((unsigned)k->ret >= FB_T__COUNT)
    verr(v, -1, "return type %u is not a type", (unsigned)k->ret);
  if (k->nstmts < 0 || (k->nstmts > 0 && !k->stmts))
    verr(v, -1, "statement array is malformed (%d statements)", k->nstmts);
  else v->nstmts = k->nstmts;
  if (k->nblocks < 1 || !k->blocks) verr(v, -1, "no body block");
  else v->nblocks = k->nblocks;
}

/* ---------------------------------------------------------------- operands */

/* Range, definition before use, scope, and value-ness of each operand.
 * Returns 0 when the operands cannot be type-checked. */
static int check_operands(vctx *v, int id, const fb_stmt *s, const fb_op_info *oi) {
  int ok = 1, n = s->nargs < FB_MAX_ARGS ? s->nargs : FB_MAX_ARGS;
  if (s->part < 0 || s->part > FB_IR_MAX_PART)
    verr(v, id, "fused part %d is out of range (0 to %d)", (int)s->part, FB_IR_MAX_PART);
  for (int i = 0; i < n; i++) {
    int a = s->args[i];
    if (a < 0 || a >= v->nstmts) {
      verr(v, id, "operand %d (%%%d) is out of range (%d statements)", i, a, v->nstmts);
      ok = 0;
      continue;
    }
    if (v->state[a] == ST_UNSEEN)
      verr(v, id, "operand %d (%%%d) is not defined before this use", i, a);
    else if (v->state[a] == ST_DEAD)
      verr(v, id, "operand %d (%%%d) is used outside the block that defines it", i, a);
    const fb_stmt *d = &v->k->stmts[a];
    if (d->op >= FB_OP__COUNT) {
      ok = 0;
      continue;
    }
    if (slot_kind(oi->cls, i) != K_VALUE) continue; /* checked by the class rule */
    if (d->op == FB_OP_ALLOCA) {
      verr(v, id, "operand %d (%%%d) is a local variable, not a value (read it with lload)", i, a);
      ok = 0;
    } else if (!t_valid(d->type)) {
      verr(v, id, "operand %d (%%%d %s) produces no value", i, a, op_name(d->op));
      ok = 0;
    }
  }
  return ok;
}

/* SNode presence. Returns 0 when the op's SNode cannot be used. */
static int check_snode(vctx *v, int id, const fb_stmt *s, const fb_op_info *oi) {
  if (!(oi->flags & FB_OPF_SNODE)) {
    if (s->snode != -1) verr(v, id, "names SNode %d but the op takes none", s->snode);
    return 1;
  }
  if (!v->lay) return 0; /* the kernel-wide error says why */
  if (s->snode < 0 || s->snode >= v->lay->nnodes) {
    verr(v, id, "SNode %d is not in the layout (%d nodes)", s->snode, v->lay->nnodes);
    return 0;
  }
  return 1;
}

/* Operand count from the table; -1 entries take the SNode's indices. */
static int check_arity(vctx *v, int id, const fb_stmt *s, const fb_op_info *oi, int snode_ok) {
  int want = oi->nargs;
  if (want < 0) {
    if (!snode_ok) return 0;
    const fb_snode *n = snode_of(v, s);
    int ni = global_indices(oi->cls, n), nv = global_has_value(oi->cls);
    want = ni + nv;
    if (s->nargs != want) {
      verr(v, id, "takes %d operand%s (%d ind%s of SNode %d%s), has %d", want, plural(want), ni,
           ni == 1 ? "ex" : "ices", s->snode, nv ? " and a value" : "", s->nargs);
      return 0;
    }
    return 1;
  }
  if (s->nargs != want) {
    verr(v, id, "takes %d operand%s, has %d", want, plural(want), s->nargs);
    return 0;
  }
  return 1;
}

/* ---------------------------------------------------------------- type rules */

/* Operands [from, from+n) (and the result when res) share one type that
 * satisfies pred. what names the kind of type in the message. */
static void one_type(vctx *v, int id, const fb_stmt *s, int from, int n, int res,
                     int (*pred)(unsigned), const char *what) {
  unsigned t = otype(v, s, from);
  int same = 1;
  for (int i = from + 1; i < from + n; i++) same &= otype(v, s, i) == t;
  if (res) same &= s->type == t;
  if (same && pred(t)) return;
  char buf[96] = "";
  for (int i = from; i < from + n; i++)
    fb_errcat(buf, sizeof buf, "%s%s", i > from ? ", " : "", tname(otype(v, s, i)));
  if (res) fb_errcat(buf, sizeof buf, " -> %s", tname(s->type));
  verr(v, id, "%s must have one %stype (%s)", res ? "operands and result" : "operands", what, buf);
}

static void want_result(vctx *v, int id, const fb_stmt *s, unsigned t) {
  if (s->type != t) verr(v, id, "result must be %s, is %s", tname(t), tname(s->type));
}

static void check_indices(vctx *v, int id, const fb_stmt *s, int ni) {
  for (int i = 0; i < ni; i++)
    if (otype(v, s, i) != FB_T_I32)
      verr(v, id, "index %d (%%%d) has type %s; indices are i32", i, s->args[i],
           tname(otype(v, s, i)));
}

/* load, store, atomic_*: a place, i32 indices, value and result of its type. */
static void check_global(vctx *v, int id, const fb_stmt *s, int cls) {
  const fb_snode *n = snode_of(v, s);
  int ni = global_indices(cls, n);
  check_indices(v, id, s, ni);
  if (n->kind != FB_SN_PLACE) {
    verr(v, id, "SNode %d (%s) is not a field", s->snode, snode_label(n));
    return;
  }
  unsigned ft = n->type;
  if (global_has_value(cls) && otype(v, s, ni) != ft)
    verr(v, id, "value type %s differs from the field's %s", tname(otype(v, s, ni)), tname(ft));
  if (cls != FB_OPC_GSTORE && s->type != ft)
    verr(v, id, "result type %s differs from the field's %s", tname(s->type), tname(ft));
  if (cls == FB_OPC_IATOMIC && !t_int(ft))
    verr(v, id, "needs an integer field, field %s is %s", snode_label(n), tname(ft));
  if (cls == FB_OPC_ATOMIC && !t_num(ft))
    verr(v, id, "needs a numeric field, field %s is %s", snode_label(n), tname(ft));
}

/* is_active / activate / deactivate: any non-root SNode; deactivate only a
 * sparse container or a field whose parent is one. */
static void check_sparse(vctx *v, int id, const fb_stmt *s, const fb_op_info *oi) {
  const fb_snode *n = snode_of(v, s);
  if (n->kind == FB_SN_ROOT) {
    verr(v, id, "names the root SNode; sparse ops need a non-root SNode");
  } else if (s->op == FB_OP_DEACTIVATE) {
    int cell = n->kind == FB_SN_PLACE ? n->parent : n->id;
    const fb_snode *c = cell >= 0 && cell < v->lay->nnodes ? &v->lay->nodes[cell] : NULL;
    int place = n->kind == FB_SN_PLACE;
    if (!c || (c->kind != FB_SN_BITMASKED && c->kind != FB_SN_POINTER && c->kind != FB_SN_DYNAMIC))
      verr(v, id,
           "deactivate needs a sparse SNode (bitmasked, pointer or dynamic); %s %s %s a %s SNode",
           place ? "field" : "SNode", snode_label(n), place ? "sits in" : "is",
           c ? fb_snode_kind_name(c->kind) : "missing");
  }
  check_indices(v, id, s, global_indices(oi->cls, n));
  if (yields_value(oi)) want_result(v, id, s, FB_T_BOOL);
}

/* append / length: a place whose parent is a dynamic SNode. */
static void check_dynamic(vctx *v, int id, const fb_stmt *s, int cls) {
  const fb_snode *n = snode_of(v, s);
  int ni = global_indices(cls, n);
  check_indices(v, id, s, ni);
  int under = n->kind == FB_SN_PLACE && n->parent >= 0 && n->parent < v->lay->nnodes &&
              v->lay->nodes[n->parent].kind == FB_SN_DYNAMIC;
  if (!under)
    verr(v, id, "SNode %d (%s) is not a field under a dynamic SNode", s->snode, snode_label(n));
  else if (cls == FB_OPC_APPEND && otype(v, s, ni) != n->type)
    verr(v, id, "value type %s differs from the field's %s", tname(otype(v, s, ni)),
         tname(n->type));
  want_result(v, id, s, FB_T_I32);
}

static void check_hint(vctx *v, int id, const fb_stmt *s) {
  const fb_snode *n = snode_of(v, s);
  if (n->kind != FB_SN_PLACE) verr(v, id, "SNode %d (%s) is not a field", s->snode, snode_label(n));
  if (!t_int(otype(v, s, 0))) verr(v, id, "value must be an integer, is %s", tname(otype(v, s, 0)));
  if (s->type != otype(v, s, 0))
    verr(v, id, "result type %s differs from the value's %s", tname(s->type),
         tname(otype(v, s, 0)));
}

static void check_lvar(vctx *v, int id, const fb_stmt *s, int cls) {
  const fb_stmt *var = &v->k->stmts[s->args[0]];
  if (var->op != FB_OP_ALLOCA) {
    verr(v, id, "operand 0 (%%%d %s) is not an alloca", s->args[0], op_name(var->op));
    return;
  }
  if (cls == FB_OPC_LLOAD && s->type != var->type)
    verr(v, id, "result type %s differs from the variable's %s", tname(s->type), tname(var->type));
  if (cls == FB_OPC_LSTORE && otype(v, s, 1) != var->type)
    verr(v, id, "value type %s differs from the variable's %s", tname(otype(v, s, 1)),
         tname(var->type));
}

static int on_stack(const vctx *v, int stmt) {
  for (int i = 0; i < v->depth; i++)
    if (v->stack[i] == stmt) return 1;
  return 0;
}

static void check_loop_index(vctx *v, int id, const fb_stmt *s) {
  int a = s->args[0];
  const fb_stmt *l = &v->k->stmts[a];
  int loop = l->op == FB_OP_RANGE_FOR || l->op == FB_OP_PAR_FOR || l->op == FB_OP_STRUCT_FOR;
  if (!loop || !on_stack(v, a)) {
    verr(v, id, "operand 0 (%%%d %s) is not an enclosing range_for, par_for or struct_for", a,
         op_name(l->op));
  } else {
    int count = 1;
    if (l->op == FB_OP_STRUCT_FOR)
      count =
          v->lay && l->snode >= 0 && l->snode < v->lay->nnodes ? v->lay->nodes[l->snode].ndim : -1;
    if (count >= 0 && (s->imm.i < 0 || s->imm.i >= count))
      verr(v, id, "index %lld is out of range; the loop has %d", (long long)s->imm.i, count);
  }
  want_result(v, id, s, FB_T_I32);
}

static void check_arg(vctx *v, int id, const fb_stmt *s) {
  const fb_kernel *k = v->k;
  if (!v->params_ok) return;
  if (s->imm.i < 0 || s->imm.i >= k->nparams) {
    verr(v, id, "parameter %lld does not exist (%d parameters)", (long long)s->imm.i, k->nparams);
    return;
  }
  unsigned pt = (unsigned)k->params[s->imm.i];
  if (s->type != pt)
    verr(v, id, "type %s differs from parameter %lld's type %s", tname(s->type),
         (long long)s->imm.i, tname(pt));
}

static void check_ret(vctx *v, int id, const fb_stmt *s) {
  unsigned rt = (unsigned)v->k->ret;
  if (s->imm.i != 0) verr(v, id, "return slot %lld must be 0", (long long)s->imm.i);
  if (rt == FB_T_VOID) verr(v, id, "the kernel returns void");
  else if (otype(v, s, 0) != rt)
    verr(v, id, "value type %s differs from the kernel's return type %s", tname(otype(v, s, 0)),
         tname(rt));
}

static void check_struct_for(vctx *v, int id, const fb_stmt *s) {
  const fb_snode *n = snode_of(v, s);
  if (n->kind == FB_SN_ROOT) verr(v, id, "names the root SNode; struct_for needs a non-root SNode");
  else if (n->ndim < 1)
    verr(v, id, "SNode %d (%s) has no index space (ndim 0)", s->snode, snode_label(n));
}

static void check_gtmp(vctx *v, int id, const fb_stmt *s, const fb_op_info *oi) {
  if (s->imm.i < 0 || s->imm.i % 8 != 0)
    verr(v, id, "scratch offset %lld must be non-negative and 8-aligned", (long long)s->imm.i);
  if (yields_value(oi) && !t_valid(s->type)) verr(v, id, "needs a non-void type");
}

/* clear_list, listgen, gc: on a sparse container (gc: pointer or dynamic,
 * the kinds that allocate). */
static void check_list(vctx *v, int id, const fb_stmt *s) {
  const fb_snode *n = snode_of(v, s);
  int sparse = n->kind == FB_SN_POINTER || n->kind == FB_SN_BITMASKED || n->kind == FB_SN_DYNAMIC;
  if (s->op == FB_OP_GC && n->kind != FB_SN_POINTER && n->kind != FB_SN_DYNAMIC)
    verr(v, id, "SNode %d (%s) allocates nothing; gc needs a pointer or dynamic SNode", s->snode,
         snode_label(n));
  else if (!sparse)
    verr(v, id,
         "SNode %d (%s) is not sparse; lists exist for pointer, bitmasked and dynamic SNodes",
         s->snode, snode_label(n));
}

/* The class's type rule. Operands are in range and of the expected kind;
 * SNode ops have a usable SNode; the arity matches. */
static void check_types(vctx *v, int id, const fb_stmt *s, const fb_op_info *oi) {
  switch (oi->cls) {
  case FB_OPC_CONST:
  case FB_OPC_ALLOCA:
    if (!t_valid(s->type)) verr(v, id, "needs a non-void type");
    break;
  case FB_OPC_ARG: check_arg(v, id, s); break;
  case FB_OPC_CAST:
    if (!t_valid(otype(v, s, 0)) || !t_valid(s->type))
      verr(v, id, "casts need numeric or bool types (%s to %s)", tname(otype(v, s, 0)),
           tname(s->type));
    break;
  case FB_OPC_SELECT:
    if (otype(v, s, 0) != FB_T_BOOL)
      verr(v, id, "condition must be bool, is %s", tname(otype(v, s, 0)));
    one_type(v, id, s, 1, 2, 1, t_valid, "");
    break;
  case FB_OPC_ARITH: one_type(v, id, s, 0, 2, 1, t_num, "numeric "); break;
  case FB_OPC_FARITH: one_type(v, id, s, 0, 2, 1, t_float, "float "); break;
  case FB_OPC_CMP:
    one_type(v, id, s, 0, 2, 0, t_valid, "");
    want_result(v, id, s, FB_T_BOOL);
    break;
  case FB_OPC_BITS: one_type(v, id, s, 0, 2, 1, t_int_bool, "integer or bool "); break;
  case FB_OPC_SHIFT: one_type(v, id, s, 0, 2, 1, t_int, "integer "); break;
  case FB_OPC_NOT: one_type(v, id, s, 0, 1, 1, t_int_bool, "integer or bool "); break;
  case FB_OPC_UNARY: one_type(v, id, s, 0, 1, 1, t_num, "numeric "); break;
  case FB_OPC_FUNARY: one_type(v, id, s, 0, 1, 1, t_float, "float "); break;
  case FB_OPC_LLOAD:
  case FB_OPC_LSTORE: check_lvar(v, id, s, oi->cls); break;
  case FB_OPC_GLOAD:
  case FB_OPC_GSTORE:
  case FB_OPC_ATOMIC:
  case FB_OPC_IATOMIC: check_global(v, id, s, oi->cls); break;
  case FB_OPC_SPARSE: check_sparse(v, id, s, oi); break;
  case FB_OPC_APPEND:
  case FB_OPC_LENGTH: check_dynamic(v, id, s, oi->cls); break;
  case FB_OPC_HINT: check_hint(v, id, s); break;
  case FB_OPC_IF:
    if (otype(v, s, 0) != FB_T_BOOL)
      verr(v, id, "condition must be bool, is %s", tname(otype(v, s, 0)));
    break;
  case FB_OPC_RANGE:
    for (int i = 0; i < 2; i++)
      if (otype(v, s, i) != FB_T_I32)
        verr(v, id, "bound %d (%%%d) has type %s; range bounds are i32", i, s->args[i],
             tname(otype(v, s, i)));
    break;
  case FB_OPC_STRUCT: check_struct_for(v, id, s); break;
  case FB_OPC_LOOPIDX: check_loop_index(v, id, s); break;
  case FB_OPC_RET: check_ret(v, id, s); break;
  case FB_OPC_GTMP: check_gtmp(v, id, s, oi); break;
  case FB_OPC_RAND:
    if (yields_value(oi)) want_result(v, id, s, FB_T_F32);
    break;
  case FB_OPC_LIST: check_list(v, id, s); break;
  default: break; /* LOOP, JUMP: no types */
  }
}

/* ---------------------------------------------------------------- placement */

/* break/continue leave the innermost while or range_for, never crossing a
 * parallel loop; par_for and struct_for sit directly in block 0. */
static void check_placement(vctx *v, int id, const fb_stmt *s, const fb_op_info *oi) {
  if ((s->op == FB_OP_PAR_FOR || s->op == FB_OP_STRUCT_FOR) && v->depth > 0)
    verr(v, id, "parallel loops must sit directly in the kernel body, not inside %%%d %s",
         v->stack[v->depth - 1], op_name(v->k->stmts[v->stack[v->depth - 1]].op));
  if (oi->cls == FB_OPC_LIST && v->depth > 0)
    verr(v, id, "list tasks must sit directly in the kernel body, not inside %%%d %s",
         v->stack[v->depth - 1], op_name(v->k->stmts[v->stack[v->depth - 1]].op));
  if (oi->cls != FB_OPC_JUMP) return;
  for (int i = v->depth - 1; i >= 0; i--) {
    unsigned op = v->k->stmts[v->stack[i]].op;
    if (op == FB_OP_WHILE || op == FB_OP_RANGE_FOR) return;
    if (op == FB_OP_PAR_FOR || op == FB_OP_STRUCT_FOR) {
      verr(v, id, "crosses the parallel loop %%%d; break and continue need a while or range_for",
           v->stack[i]);
      return;
    }
  }
  verr(v, id, "is not inside a while or range_for");
}

/* ---------------------------------------------------------------- blocks */

static void walk_block(vctx *v, int blk, int owner, const char *role);

static int block_ref_ok(vctx *v, int id, int blk, int allowed, int required, const char *role) {
  if (blk == -1) {
    if (required) verr(v, id, "needs %s %s block", strchr("aeiou", role[0]) ? "an" : "a", role);
    return 0;
  }
  if (!allowed) {
    verr(v, id, "takes no %s block (has block %d)", role, blk);
    return 0;
  }
  if (blk < 0 || blk >= v->nblocks) {
    verr(v, id, "%s block %d is out of range (%d blocks)", role, blk, v->nblocks);
    return 0;
  }
  return 1;
}

/* Check the statement's block references and walk into them. */
static void enter_blocks(vctx *v, int id, const fb_stmt *s, const fb_op_info *oi) {
  int blocky = (oi->flags & FB_OPF_BLOCK) != 0;
  int body = block_ref_ok(v, id, s->body, blocky, blocky, "body");
  int orelse = block_ref_ok(v, id, s->orelse, oi->cls == FB_OPC_IF, 0, "orelse");
  if (!body && !orelse) return;
  if (v->depth >= FB_MAX_BLOCK_DEPTH) {
    verr(v, id, "blocks nested deeper than %d", FB_MAX_BLOCK_DEPTH);
    return;
  }
  v->stack[v->depth++] = id;
  if (body) walk_block(v, s->body, id, "body");
  if (orelse) walk_block(v, s->orelse, id, "orelse");
  v->depth--;
}

static void check_stmt(vctx *v, int id, int blk) {
  const fb_stmt *s = &v->k->stmts[id];
  v->home[id] = blk;
  if (s->op >= FB_OP__COUNT) {
    verr(v, id, "unknown op %u", (unsigned)s->op);
    v->state[id] = ST_LIVE;
    return;
  }
  const fb_op_info *oi = &fb_op_table[s->op];
  int ok = check_operands(v, id, s, oi);
  int snode_ok = check_snode(v, id, s, oi);
  ok &= snode_ok & check_arity(v, id, s, oi, snode_ok);
  if (s->type >= FB_T__COUNT) {
    verr(v, id, "result type %u is not a type", (unsigned)s->type);
    ok = 0;
  } else if (!yields_value(oi) && s->type != FB_T_VOID) {
    verr(v, id, "produces no value; its type must be void, is %s", tname(s->type));
  }
  if (ok) check_types(v, id, s, oi);
  check_placement(v, id, s, oi);
  v->state[id] = ST_LIVE;
  enter_blocks(v, id, s, oi);
}

static void walk_block(vctx *v, int blk, int owner, const char *role) {
  if (v->bstate[blk] != BK_UNSEEN) {
    verr(v, owner, "%s block %d %s", role, blk,
         v->bstate[blk] == BK_OPEN ? "encloses this statement (a cycle of blocks)"
                                   : "is already used by another statement");
    return;
  }
  const fb_block *b = &v->k->blocks[blk];
  v->bstate[blk] = BK_OPEN;
  if (b->n < 0 || (b->n > 0 && !b->ids)) {
    verr(v, owner, "%s block %d has a malformed statement list (%d entries)", role, blk, b->n);
    v->bstate[blk] = BK_DONE;
    return;
  }
  for (int i = 0; i < b->n; i++) {
    int id = b->ids[i];
    if (id < 0 || id >= v->nstmts)
      verr(v, owner, "%s block %d lists statement id %d, out of range (%d statements)", role, blk,
           id, v->nstmts);
    else if (v->state[id] != ST_UNSEEN)
      verr(v, id, "listed in more than one block (again in block %d)", blk);
    else check_stmt(v, id, blk);
  }
  for (int i = 0; i < b->n; i++) { /* leaving the block ends its statements' scope */
    int id = b->ids[i];
    if (id >= 0 && id < v->nstmts && v->home[id] == blk && v->state[id] == ST_LIVE)
      v->state[id] = ST_DEAD;
  }
  v->bstate[blk] = BK_DONE;
}

/* ---------------------------------------------------------------- client kernels */

int fb_kernel_check_public(const fb_kernel *k, int max_stmts, char *err, size_t errlen) {
  const char *name = k && k->name ? k->name : "?";
  if (!k || k->nstmts < 0 || (k->nstmts && !k->stmts)) {
    fb_errf(err, errlen, "kernel '%s' is malformed (no statement list)", name);
    return FB_EINVAL;
  }
  if (max_stmts > 0 && k->nstmts > max_stmts) {
    fb_errf(err, errlen,
            "kernel '%s' has %d statements; this session compiles kernels of at "
            "most %d (max_kernel_statements)",
            name, k->nstmts, max_stmts);
    return FB_EQUOTA;
  }
  for (int i = 0; i < k->nstmts; i++) {
    unsigned op = k->stmts[i].op;
    if (op < FB_OP__COUNT && !(fb_op_table[op].flags & FB_OPF_INTERNAL)) continue;
    fb_errf(err, errlen, "kernel '%s': %%%d %s: %s", name, i, op_name(op),
            op < FB_OP__COUNT ? "is internal to the engine; client kernels may not use it"
                              : "is not an op");
    return FB_EVERIFY;
  }
  return 0;
}

/* ---------------------------------------------------------------- entry */

int fb_verify(const fb_kernel *k, fb_diags *out) {
  if (!k) {
    fb_diags_add(out, -1, 0, 0, "kernel: no kernel");
    return FB_EVERIFY;
  }
  vctx v;
  memset(&v, 0, sizeof v);
  v.k = k;
  v.out = out;
  check_kernel(&v);
  if (v.nblocks > 0) {
    size_t ns = (size_t)v.nstmts + 1;
    v.state = calloc(ns, 1);
    v.home = calloc(ns, sizeof *v.home);
    v.bstate = calloc((size_t)v.nblocks, 1);
    if (!v.state || !v.home || !v.bstate) {
      free(v.state);
      free(v.home);
      free(v.bstate);
      return FB_ENOMEM;
    }
    walk_block(&v, 0, -1, "body");
    free(v.state);
    free(v.home);
    free(v.bstate);
  }
  return v.nerr ? FB_EVERIFY : 0;
}
