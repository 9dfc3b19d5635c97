/* A session's counters: what the engine counts (fb_session_counters in
 * fusebox/engine.h), the server sends (proto/fusebox.proto, Counters) and
 * libfusebox returns (fusebox/client.h). A plain struct in its own header,
 * so that the client and the protocol need no engine declarations. */
#ifndef FUSEBOX_COUNTERS_H
#define FUSEBOX_COUNTERS_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

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
  uint64_t flushes;            /* async: flushes that handed tasks out */
  uint64_t tasks_pending;      /* not cumulative: async tasks waiting in the SFG */
  uint64_t fuse_refused;       /* async: tasks fusion's cost model kept from a fusion
                                * (docs/optimizer.md), once per task per round */
  uint64_t fuse_fallbacks;     /* async: fused tasks that could not be compiled or
                                * launched and ran as their unfused parts instead
                                * (and demoted tasks that ran as inserted) */
  uint64_t plans_reused;       /* async: flushes whose optimized batch came from the
                                * optimizer's plan memo (docs/optimizer.md) */
} fb_counters;

#ifdef __cplusplus
}
#endif
#endif
