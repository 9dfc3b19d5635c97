/* Blame in the user's terms: which part of a kernel a message is about.
 *
 * Lowering cuts a kernel into tasks (optimizer/lower.c), named "k.t0",
 * "k.t1", ... and, fused, "a.t0+b.t0": names the user never wrote. An
 * error says instead what the user sees in the kernel: its N-th top-level
 * loop, the serial code before or after one, or the work the engine adds
 * for a loop over sparse cells (the list of the active cells it visits,
 * the release of deactivated cells at the end). The IR keeps no source
 * positions, so no line is given; the kernel's name and the launch number
 * (which the callers add) say the rest. */
#include "engine/internal.h"

typedef enum { SHAPE_SERIAL, SHAPE_LOOP, SHAPE_LIST, SHAPE_GC } task_shape;

/* What a lowered task is, from its top-level statements; *snode: the
 * SNode of a list or gc task. */
static task_shape shape_of(const fb_kernel *ir, int *snode) {
  *snode = -1;
  if (!ir || ir->nblocks < 1) return SHAPE_SERIAL;
  const fb_block *b = &ir->blocks[0];
  for (int i = 0; i < b->n; i++) {
    int id = b->ids[i];
    if (id < 0 || id >= ir->nstmts) continue;
    const fb_stmt *s = &ir->stmts[id];
    switch (s->op) {
      case FB_OP_PAR_FOR:
      case FB_OP_STRUCT_FOR: return SHAPE_LOOP;
      case FB_OP_CLEAR_LIST:
      case FB_OP_LISTGEN: *snode = s->snode; return SHAPE_LIST;
      case FB_OP_GC: *snode = s->snode; return SHAPE_GC;
      default: break;
    }
  }
  return SHAPE_SERIAL;
}

static const char *ordinal(int n, char *buf, size_t len) {
  int t = n % 100;
  const char *suf = t >= 11 && t <= 13 ? "th"
                    : n % 10 == 1      ? "st"
                    : n % 10 == 2      ? "nd"
                    : n % 10 == 3      ? "rd"
                                       : "th";
  snprintf(buf, len, "%d%s", n, suf);
  return buf;
}

/* "'x'" (a field or a named container) or "SNode 3". */
static const char *snode_words(const fb_kernel *ir, int sn, char *buf, size_t len) {
  const fb_layout *l = ir ? ir->layout : NULL;
  if (l && sn > 0 && sn < l->nnodes && l->nodes[sn].name)
    snprintf(buf, len, "'%s'", l->nodes[sn].name);
  else snprintf(buf, len, "SNode %d", sn);
  return buf;
}

const char *fbe_task_where(const fb_kernel *const *tasks, int ntasks, int t, char *buf,
                           size_t len) {
  if (!tasks || t < 0 || t >= ntasks) return snprintf(buf, len, "its code"), buf;
  int sn, before = 0, after = 0, next = -1; /* loops before t; after it; the first one after */
  for (int i = 0; i < ntasks; i++) {
    int x;
    if (i == t || shape_of(tasks[i], &x) != SHAPE_LOOP) continue;
    if (i < t) before++;
    else if (!after++) next = before + 1;
  }
  char n[16], what[200];
  switch (shape_of(tasks[t], &sn)) {
    case SHAPE_LOOP: snprintf(buf, len, "its %s top-level loop", ordinal(before + 1, n, sizeof n));
      break;
    case SHAPE_SERIAL:
      if (before) snprintf(buf, len, "its serial code after its %s top-level loop",
                           ordinal(before, n, sizeof n));
      else if (after) snprintf(buf, len, "its serial code before its 1st top-level loop");
      else snprintf(buf, len, "its serial code");
      break;
    case SHAPE_LIST:
      snode_words(tasks[t], sn, what, sizeof what);
      if (next > 0)
        snprintf(buf, len, "the list of active cells of %s for its %s top-level loop", what,
                 ordinal(next, n, sizeof n));
      else snprintf(buf, len, "the list of active cells of %s", what);
      break;
    case SHAPE_GC:
      snprintf(buf, len, "the release of deactivated cells of %s after it ran",
               snode_words(tasks[t], sn, what, sizeof what));
      break;
  }
  return buf;
}

const char *fbe_task_kind_where(fb_task_kind kind, const fb_kernel *ir, int snode, char *buf,
                                size_t len) {
  char what[200];
  switch (kind) {
    case FB_TASK_RANGE_FOR:
    case FB_TASK_STRUCT_FOR: snprintf(buf, len, "a top-level loop"); break;
    case FB_TASK_CLEAR_LIST:
    case FB_TASK_LISTGEN:
      snprintf(buf, len, "the list of active cells of %s",
               snode_words(ir, snode, what, sizeof what));
      break;
    case FB_TASK_GC:
      snprintf(buf, len, "the release of deactivated cells of %s",
               snode_words(ir, snode, what, sizeof what));
      break;
    default: snprintf(buf, len, "its serial code"); break;
  }
  return buf;
}
