/* optimizer/: kernel -> task lowering, and (in the async engine) the SFG and
 * its passes. Internal header of the folder. Uses ir/ only.
 *
 * Lowering (fb_lower) turns a verified kernel into an ordered list of tasks:
 * each top-level par_for or struct_for becomes one parallel task, each run
 * of other top-level statements one serial task. Every task is a kernel of
 * its own with the original kernel's parameters:
 *  - pure top-level values (consts, args, arithmetic over them) that a task
 *    uses are recomputed inside it;
 *  - other top-level values and top-level local variables used by several
 *    tasks live in the launch's scratch buffer (gtmp_store / gtmp_load at
 *    8-byte slots), so tasks never share registers.
 * A parallel task's body block holds its recomputed values followed by the
 * loop statement, whose id is fb_task.loop.
 *
 * Sparse SNodes (docs/sparse.md): a struct_for whose SNode lies below sparse
 * containers P1 .. Pk is preceded by a serial clear_list task and a parallel
 * listgen task per Pi (fb_task.loop = the listgen statement, fb_task.snode =
 * Pi); a kernel that deactivates cells of a sparse S ends with a serial gc
 * task per pointer/dynamic SNode of S's subtree, ancestors first. */
#ifndef FB_OPTIMIZER_H
#define FB_OPTIMIZER_H

#include "fusebox/ir.h"

typedef enum fb_task_kind {
  FB_TASK_SERIAL = 0,
  FB_TASK_RANGE_FOR,
  FB_TASK_STRUCT_FOR,
  FB_TASK_CLEAR_LIST,
  FB_TASK_LISTGEN,
  FB_TASK_GC
} fb_task_kind;

const char *fb_task_kind_name(fb_task_kind k);

typedef struct fb_task {
  fb_task_kind kind;
  fb_kernel *ir; /* owned; named "<kernel>.t<N>" */
  int loop;      /* statement id of the parallel loop in ir, -1 if serial */
  int snode;     /* struct_for / list tasks: the SNode iterated, else -1 */
} fb_task;

typedef struct fb_task_list {
  fb_task *v;
  int n;
  size_t gtmp_bytes; /* scratch bytes a launch of the kernel needs */
} fb_task_list;

/* Lower k (which must pass fb_verify) into tasks. Returns 0 or FB_ENOMEM /
 * FB_EINVAL with a message in err. */
int fb_lower(const fb_kernel *k, fb_task_list *out, char *err, size_t errlen);
void fb_task_list_free(fb_task_list *l);

#endif
