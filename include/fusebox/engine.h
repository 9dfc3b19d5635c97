/* The in-process engine: sessions own a layout and its device memory, take
 * kernels (as IR), launch them, and report counters. The CLI, the tests, the
 * benchmarks and fuseboxd all drive the pipeline through this API.
 *
 * In this milestone every launch runs at once ("sync" mode): the kernel is
 * lowered to tasks, each task is compiled (or found in the code cache) and
 * run on the device before fb_launch returns.
 *
 * Errors: functions return 0 or a negative FB_E* code; fb_session_errmsg()
 * then says what went wrong (naming the kernel, field or statement). A
 * failed call leaves the session usable. No function aborts the process on
 * bad input. */
#ifndef FUSEBOX_ENGINE_H
#define FUSEBOX_ENGINE_H

#include "fusebox/common.h"
#include "fusebox/ir.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct fb_engine fb_engine;
typedef struct fb_session fb_session;

typedef struct fb_engine_config {
  const char *backend;  /* "cpu" (default), "cuda", "auto" */
  int compile_threads;  /* 0 = one per core */
  int cpu_threads;      /* 0 = one per core: workers for parallel tasks */
} fb_engine_config;

typedef struct fb_session_config {
  const char *mode;     /* "sync" (default) or "async" */
  uint64_t seed;        /* rand() seed */
  uint64_t memory_limit; /* bytes of device memory, 0 = unlimited */
} fb_session_config;

/* Counters, cumulative since the session was created. */
typedef struct fb_counters {
  uint64_t launches;           /* kernel launches requested */
  uint64_t tasks_launched;     /* tasks run on the device */
  uint64_t statements_emitted; /* IR statements handed to code generation */
  uint64_t tasks_compiled;     /* tasks compiled (cache misses) */
  uint64_t cache_hits;         /* tasks found in the code cache */
  double backend_s;            /* device time spent running tasks */
  double compile_s;            /* time spent compiling */
  /* the asynchronous engine's optimizer (zero in sync mode) */
  uint64_t listgens_removed;   /* list generations removed */
  uint64_t tasks_fused;        /* tasks fused into others */
  uint64_t dead_stores_removed; /* stores (and emptied tasks) removed */
  uint64_t activations_demoted; /* activating accesses demoted */
  double optimizer_s;          /* time spent in the SFG and its passes */
  uint64_t device_bytes;       /* not cumulative: device memory the session holds
                                * now (fields, scratch, sparse blocks handed out
                                * by its pool, lists), what memory_limit bounds */
} fb_counters;

int fb_engine_create(const fb_engine_config *cfg, fb_engine **out, char *err, size_t errlen);
void fb_engine_destroy(fb_engine *e);
const char *fb_engine_backend(const fb_engine *e); /* "cpu" or "cuda" */

/* The session copies the layout (which must be finalized). On failure err
 * (may be NULL) says why: an unfinalized layout, an unknown mode, or the
 * field storage over the memory limit (FB_EQUOTA). */
int fb_session_create(fb_engine *e, const fb_session_config *cfg, const fb_layout *layout,
                      fb_session **out, char *err, size_t errlen);
void fb_session_destroy(fb_session *s);
const char *fb_session_errmsg(const fb_session *s);
const fb_layout *fb_session_layout(const fb_session *s);

/* Register a kernel: verified, copied and lowered to tasks. Its SNode ids
 * refer to the session's layout. Returns the kernel id (>= 0). */
int fb_session_add_kernel(fb_session *s, const fb_kernel *k);
int fb_session_find_kernel(const fb_session *s, const char *name);
/* The kernel's tasks as IR (owned by the session): for `fusebox ir`. */
int fb_session_kernel_tasks(const fb_session *s, int kernel, const fb_kernel *const **tasks,
                            int *ntasks);

/* Launch a kernel. args: one value per parameter, converted to the
 * parameter type when the kinds agree (int to int, float to float).
 * ret receives the return value when the kernel has one (may be NULL).
 * FB_EBOUNDS: the kernel ran but indexed a field out of bounds. */
int fb_launch(fb_session *s, int kernel, const fb_value *args, int nargs, fb_value *ret);
/* Wait for everything launched so far. */
int fb_sync(fb_session *s);

/* Host access to fields, in the field's flat row-major order (indices in
 * axis order), elements of the field's type. bytes must equal
 * numel * sizeof(type). */
int fb_field_read(fb_session *s, int field, void *dst, size_t bytes);
int fb_field_write(fb_session *s, int field, const void *src, size_t bytes);
int fb_cell_read(fb_session *s, int field, const int64_t *idx, int nidx, fb_value *out);
int fb_cell_write(fb_session *s, int field, const int64_t *idx, int nidx, fb_value v);

void fb_session_counters(const fb_session *s, fb_counters *out);

#ifdef __cplusplus
}
#endif
#endif
