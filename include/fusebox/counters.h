/* A session's counters: what the engine counts (fb_session_counters in
 * fusebox/engine.h), the server sends (proto/fusebox.proto, Counters) and
 * libfusebox returns (fusebox/client.h). A plain struct in its own header,
 * so that the client and the protocol need no engine declarations.
 *
 * The counters are one list, FB_COUNTERS(X), with one line per counter:
 *
 *   X(name, type, kind, "unit", "meaning")
 *
 * name is the struct member, the protocol's field of Counters, the key of
 * every JSON the CLI prints and the Python client's attribute (one name
 * everywhere: a second column would be a rename waiting to happen). type is
 * uint64_t or double. kind is SUM (cumulative since the session was
 * created: the difference of two readings is what happened in between) or
 * LEVEL (a level now: of two readings the later one stands). unit and
 * meaning are docs/codes.md's columns, word for word (test_docs checks).
 *
 * Generated from it: struct fb_counters below and fb_counters_since; the
 * protocol mapping (proto/convert.c, both directions); the CLI's JSON
 * (fb_cli_counters_json, cli/cli_server.c); the families of /metrics,
 * for the server and per tenant (server/metrics.c). Checked against it:
 * the protocol's field order and types (test_proto), docs/codes.md
 * (test_docs) and the Python client's Counters (tests/test_lists.py).
 * A new counter is one line here, the field appended to the .proto, a row
 * of docs/codes.md and a field of python/fusebox/session.py. */
#ifndef FUSEBOX_COUNTERS_H
#define FUSEBOX_COUNTERS_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* clang-format off */
#define FB_COUNTERS(X)                                                                      \
  X(launches, uint64_t, SUM, "count", "kernel launches requested")                         \
  X(tasks_launched, uint64_t, SUM, "count", "tasks run on the device")                     \
  X(statements_emitted, uint64_t, SUM, "count", "IR statements handed to code generation") \
  X(tasks_compiled, uint64_t, SUM, "count", "tasks compiled (cache misses)")               \
  X(cache_hits, uint64_t, SUM, "count", "tasks found in the code cache")                   \
  X(backend_s, double, SUM, "seconds", "device time spent running tasks")                  \
  X(compile_s, double, SUM, "seconds", "time spent compiling")                             \
  X(listgens_removed, uint64_t, SUM, "count", "list generations removed")                  \
  X(tasks_fused, uint64_t, SUM, "count", "tasks fused into others")                        \
  X(dead_stores_removed, uint64_t, SUM, "count", "stores (and emptied tasks) removed")     \
  X(activations_demoted, uint64_t, SUM, "count", "activating accesses demoted")            \
  X(optimizer_s, double, SUM, "seconds", "time spent in the SFG and its passes")           \
  X(device_bytes, uint64_t, LEVEL, "bytes",                                                 \
    "not cumulative: device memory the session holds now (fields, scratch, sparse blocks "  \
    "handed out by its pool, lists), what memory_limit bounds")                             \
  X(flushes, uint64_t, SUM, "count", "async: flushes that handed tasks out")               \
  X(tasks_pending, uint64_t, LEVEL, "count", "not cumulative: async tasks waiting in the SFG") \
  X(fuse_refused, uint64_t, SUM, "count",                                                   \
    "async: tasks fusion's cost model kept from a fusion (docs/optimizer.md), once per "    \
    "task per round")                                                                       \
  X(fuse_fallbacks, uint64_t, SUM, "count",                                                 \
    "async: fused tasks that could not be compiled or launched and ran as their unfused "   \
    "parts instead (and demoted tasks that ran as inserted)")                               \
  X(plans_reused, uint64_t, SUM, "count",                                                   \
    "async: flushes whose optimized batch came from the optimizer's plan memo "             \
    "(docs/optimizer.md)")
/* clang-format on */

/* Counters, cumulative since the session was created (but the LEVELs). */
typedef struct fb_counters {
#define FB_COUNTER_MEMBER_(name, type, kind, unit, meaning) type name;
  FB_COUNTERS(FB_COUNTER_MEMBER_)
#undef FB_COUNTER_MEMBER_
} fb_counters;

/* What happened between two readings of one session's counters: each SUM
 * is later's less earlier's, each LEVEL later's. */
static inline fb_counters fb_counters_since(const fb_counters *later, const fb_counters *earlier) {
  fb_counters d;
#define FB_COUNTER_SUM_(name) d.name = later->name - earlier->name;
#define FB_COUNTER_LEVEL_(name) d.name = later->name;
#define FB_COUNTER_SINCE_(name, type, kind, unit, meaning) FB_COUNTER_##kind##_(name)
  FB_COUNTERS(FB_COUNTER_SINCE_)
#undef FB_COUNTER_SINCE_
#undef FB_COUNTER_LEVEL_
#undef FB_COUNTER_SUM_
  return d;
}

#ifdef __cplusplus
}
#endif
#endif
