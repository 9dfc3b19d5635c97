/* Test hooks of the engine (engine/), for tests only: nothing in
 * fuseboxd or the CLI calls them, and the header is not installed. */
#ifndef FB_ENGINE_TEST_H
#define FB_ENGINE_TEST_H

#include <stddef.h>

#include "fusebox/engine.h"

/* Called before the compile pool (async sessions) or a sync session's
 * kernel registration compiles task IR; a
 * nonzero answer refuses the compile with FB_ECOMPILE and the message it
 * wrote to err. Lets a test make a compile fail that would pass, e.g. every
 * fused task (their names join the parts' with '+'), to reach the engine's
 * fallback to the unfused parts without a GPU, or a kernel's compile to
 * fail for its error message. Called from compile threads, the launcher
 * and the caller; set it before the first session, NULL to clear. */
typedef int (*fb_compile_gate)(void *user, const fb_kernel *task, char *err, size_t errlen);
void fb_engine_set_compile_gate(fb_engine *e, fb_compile_gate gate, void *user);

/* How many times an async session's caller waited for the worker to
 * finish a batch because FB_MAX_QUEUED_FLUSHES were queued (0 in sync
 * mode). Any thread may read it. */
uint64_t fb_session_test_queue_waits(const fb_session *s);
/* Async: chunk grains the worker worked out from a task's IR (entries
 * whose code the caller did not know at the flush); a task whose code the
 * caller knew takes the grain kept with its code (engine/async.c). */
uint64_t fb_session_test_grain_walks(const fb_session *s);

/* How many batches of an async session were planned without a compile
 * job or a table (engine/worker.c, plan_compiles: the caller knew every
 * entry's code, and the batch is small); 0 in sync mode. Any thread may
 * read it. */
uint64_t fb_session_test_lean_batches(const fb_session *s);

/* How many automatic flushes of an async session waited for the launch
 * stream's period boundary (engine/async.c, "Windows aligned to the
 * stream's period"); 0 in sync mode. The session's thread only. */
uint64_t fb_session_test_aligned_flushes(const fb_session *s);

/* How many launches of an async session were coalesced into an equal
 * launch right before them (engine/async.c, "Coalescing a run of equal
 * launches": a kernel fb_opt_rerun_free accepts, launched again with the
 * same argument values before a flush); 0 in sync mode. The session's
 * thread only. */
uint64_t fb_session_test_coalesced(const fb_session *s);

/* How many doubled flush widths of an async session failed their first
 * window (the plan memo neither hit nor stored it) and capped the width
 * (engine/async.c, adapt_flush); 0 in sync mode. The session's thread
 * only. */
uint64_t fb_session_test_capped_widths(const fb_session *s);

/* How many batch entries of an async session ran a stand-in's code (the
 * task as inserted) while their own demoted code compiled in the
 * background. Read on the session's calling thread. */
uint64_t fb_session_test_standins(const fb_session *s);

/* The smallest task, in statements, that compiles in the background behind
 * a stand-in (default FB_STANDIN_MIN_STMTS; smaller ones compile at once).
 * Set it before the first async session. */
void fb_engine_test_set_standin_min_stmts(fb_engine *e, int n);

/* Background compiles one async session may have at once (default
 * FB_MAX_BG_COMPILES); past it an entry compiles in its batch. Set it
 * before the first async session. */
void fb_engine_test_set_bg_max(fb_engine *e, int n);

/* The most background compiles the session had at once. The session's
 * calling thread only. */
int fb_session_test_bg_peak(const fb_session *s);

/* The chunk grain the CPU pool gets for task IR `task` whose parallel loop
 * is statement `loop` (engine/session.c, fbe_task_grain): 0 for the pool's
 * default, smaller for iterations that run inner loops. */
int64_t fb_session_test_task_grain(const fb_kernel *task, int loop);
#endif
