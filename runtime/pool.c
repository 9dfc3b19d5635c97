/* The CPU device's thread pool. A parallel loop is a job: its iteration
 * space is cut into chunks, and the chunks into one contiguous share per
 * thread; the calling thread drains the first share, each idle worker that
 * joins the next, each through the share's own atomic counter, and a
 * thread whose share is empty steals from the others' (so the same range
 * lands on the same threads launch after launch). Jobs sit in a list under one mutex, so several
 * threads (sessions) may run loops on the pool at once; a caller unlinks its
 * job once every chunk is claimed and waits until the workers that joined it
 * have left. Idle workers spin briefly on a generation counter before they
 * sleep on a condition variable, which keeps back-to-back small launches
 * cheap; no thread is ever created per launch. The spin is polite: after a
 * few pauses it yields the core at each poll, so that a runnable thread
 * (an async session's caller optimizing the next window, another session)
 * runs instead of a worker that only waits; on an idle machine a yield
 * returns at once and the worker still answers the next publish within a
 * poll. */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runtime/runtime.h"

#define CHUNKS_PER_THREAD 4 /* several chunks per thread for balance */
#define SPIN_PAUSES 64      /* idle polls with a pause before the yielding ones */
#define SPIN_YIELDS                                                                                \
  400     /* idle polls that yield the core (a system call each;
                               2.7 us apiece measured on the 2-core VM under load
                               15, where each one hands the core over), then sleep */

#define MAX_SHARES 16

/* A share's claim counter, alone on its cache line. */
typedef struct share_ctr {
  _Alignas(64) atomic_llong next; /* next chunk of the share to claim */
  int64_t end;                    /* one past the share's last chunk */
} share_ctr;

typedef struct pool_job {
  fb_pool_fn fn;
  fb_pool_slot_fn sfn; /* instead of fn: fb_pool_for_slots */
  atomic_int slots;    /* sfn: slots handed out so far */
  int maxslots;
  void *ctx;
  int64_t n, chunk, nchunks;
  atomic_llong next; /* chunks claimed so far (all shares) */
  int nshares;       /* contiguous shares of the chunks, one per thread */
  atomic_int joined; /* threads that took a share so far (caller: 0) */
  share_ctr *share;
  int users;         /* workers inside the job (under the mutex) */
  struct pool_job *prev, *next_job;
} pool_job;

struct fb_pool {
  pthread_mutex_t mu;
  pthread_cond_t work_cv; /* workers: a job was published or stop */
  pthread_cond_t done_cv; /* callers: a job's last worker left */
  pool_job *head, *tail;  /* listed jobs, oldest first */
  atomic_ullong gen;      /* bumped on every publish (spinning workers) */
  atomic_int stop;
  int sleeping;           /* workers waiting on work_cv */
  int nthreads;           /* caller included */
  int nworkers, started;
  int64_t min_chunk;
  pthread_t *workers;
};

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

int fb_cpu_cores(void) {
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? (int)n : 1;
}

/* The next chunk for a thread that owns share `own`: from its own share
 * first, then from the others' in turn; -1 when every chunk is claimed. */
static int64_t claim(pool_job *j, int *own) {
  for (int k = 0; k < j->nshares; k++) {
    share_ctr *sc = &j->share[(*own + k) % j->nshares];
    if (atomic_load_explicit(&sc->next, memory_order_relaxed) >= sc->end) continue;
    int64_t c = atomic_fetch_add_explicit(&sc->next, 1, memory_order_relaxed);
    if (c >= sc->end) continue;
    atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed);
    *own = (*own + k) % j->nshares;
    return c;
  }
  return -1;
}

/* Claim and run chunks of j until none is left. */
static void run_chunks(pool_job *j, int own) {
  int slot = -1;
  for (;;) {
    if (j->sfn && slot < 0) { /* a slot before the first chunk claimed */
      if (atomic_load_explicit(&j->next, memory_order_relaxed) >= j->nchunks) return;
      slot = atomic_fetch_add_explicit(&j->slots, 1, memory_order_relaxed);
      if (slot >= j->maxslots) return;
    }
    int64_t c = claim(j, &own);
    if (c < 0) return;
    int64_t lo = c * j->chunk;
    int64_t hi = lo + j->chunk < j->n ? lo + j->chunk : j->n;
    if (j->sfn) j->sfn(j->ctx, slot, lo, hi);
    else j->fn(j->ctx, lo, hi);
  }
}

/* Under the mutex: the oldest listed job that still has chunks to claim. */
static pool_job *find_job(fb_pool *p) {
  for (pool_job *j = p->head; j; j = j->next_job)
    if (atomic_load_explicit(&j->next, memory_order_relaxed) < j->nchunks) return j;
  return NULL;
}

static int moved(fb_pool *p, unsigned long long g) {
  return atomic_load_explicit(&p->gen, memory_order_acquire) != g ||
         atomic_load_explicit(&p->stop, memory_order_relaxed);
}

/* Spin (without the mutex) until the generation moves or stop is set:
 * first a few pauses (a loop published right after the last one), then
 * polls that yield the core. A worker spinning on pauses alone holds its
 * core for the whole spin (about 160 us for 2000 pauses here), which on a
 * machine with as many busy threads as cores is taken from the thread that
 * would publish the next loop. */
static void spin_wait(fb_pool *p, unsigned long long g) {
  for (int i = 0; i < SPIN_PAUSES; i++) {
    if (moved(p, g)) return;
    cpu_relax();
  }
  for (int i = 0; i < SPIN_YIELDS; i++) {
    if (moved(p, g)) return;
    sched_yield();
  }
}

static void *worker_main(void *arg) {
  fb_pool *p = arg;
  pthread_mutex_lock(&p->mu);
  while (!atomic_load(&p->stop)) {
    pool_job *j = find_job(p);
    if (j) {
      j->users++;
      int own = atomic_fetch_add_explicit(&j->joined, 1, memory_order_relaxed) % j->nshares;
      pthread_mutex_unlock(&p->mu);
      run_chunks(j, own);
      pthread_mutex_lock(&p->mu);
      if (--j->users == 0) pthread_cond_broadcast(&p->done_cv);
      continue;
    }
    unsigned long long g = atomic_load(&p->gen);
    pthread_mutex_unlock(&p->mu);
    spin_wait(p, g);
    pthread_mutex_lock(&p->mu);
    /* Publishing happens under the mutex: an unchanged generation here
     * means nothing was published since g, and the next publish will see
     * this worker as sleeping. */
    if (atomic_load(&p->gen) != g || atomic_load(&p->stop)) continue;
    p->sleeping++;
    pthread_cond_wait(&p->work_cv, &p->mu);
    p->sleeping--;
  }
  pthread_mutex_unlock(&p->mu);
  return NULL;
}

static void shutdown_workers(fb_pool *p) {
  pthread_mutex_lock(&p->mu);
  atomic_store(&p->stop, 1);
  pthread_cond_broadcast(&p->work_cv);
  pthread_mutex_unlock(&p->mu);
  for (int i = 0; i < p->started; i++) pthread_join(p->workers[i], NULL);
  p->started = 0;
}

static int start_workers(fb_pool *p, char *err, size_t errlen) {
  for (int i = 0; i < p->nworkers; i++) {
    int rc = pthread_create(&p->workers[i], NULL, worker_main, p);
    if (rc) {
      fb_errf(err, errlen, "cannot start CPU worker thread %d of %d: %s", i + 1, p->nworkers,
              strerror(rc));
      shutdown_workers(p);
      return rc == EAGAIN ? FB_EDEVICE : FB_ENOMEM;
    }
    p->started++;
  }
  return 0;
}

static void destroy_sync(fb_pool *p) {
  pthread_cond_destroy(&p->done_cv);
  pthread_cond_destroy(&p->work_cv);
  pthread_mutex_destroy(&p->mu);
}

int fb_pool_new(int nthreads, int64_t min_chunk, fb_pool **out, char *err, size_t errlen) {
  *out = NULL;
  if (nthreads < 0 || min_chunk < 0) {
    fb_errf(err, errlen, "thread pool: bad size (threads %d, min chunk %lld)", nthreads,
            (long long)min_chunk);
    return FB_EINVAL;
  }
  fb_pool *p = calloc(1, sizeof *p);
  if (!p) {
    fb_errf(err, errlen, "thread pool: out of memory");
    return FB_ENOMEM;
  }
  p->nthreads = nthreads ? nthreads : fb_cpu_cores();
  p->nworkers = p->nthreads - 1;
  p->min_chunk = min_chunk ? min_chunk : FB_POOL_MIN_CHUNK;
  atomic_init(&p->gen, 0);
  atomic_init(&p->stop, 0);
  p->workers = calloc((size_t)(p->nworkers ? p->nworkers : 1), sizeof(pthread_t));
  if (!p->workers) {
    free(p);
    fb_errf(err, errlen, "thread pool: out of memory");
    return FB_ENOMEM;
  }
  pthread_mutex_init(&p->mu, NULL);
  pthread_cond_init(&p->work_cv, NULL);
  pthread_cond_init(&p->done_cv, NULL);
  int rc = start_workers(p, err, errlen);
  if (rc) {
    destroy_sync(p);
    free(p->workers);
    free(p);
    return rc;
  }
  *out = p;
  return 0;
}

void fb_pool_free(fb_pool *p) {
  if (!p) return;
  shutdown_workers(p);
  destroy_sync(p);
  free(p->workers);
  free(p);
}

int fb_pool_threads(const fb_pool *p) { return p->nthreads; }

/* Chunk size: about CHUNKS_PER_THREAD chunks per thread, never below the
 * minimum (the pool's, or the caller's grain). */
static int64_t chunk_size(const fb_pool *p, int64_t n, int64_t min_chunk) {
  int64_t want = (int64_t)p->nthreads * CHUNKS_PER_THREAD;
  int64_t c = (n + want - 1) / want;
  return c < min_chunk ? min_chunk : c;
}

static void publish(fb_pool *p, pool_job *j) {
  pthread_mutex_lock(&p->mu);
  j->prev = p->tail;
  j->next_job = NULL;
  if (p->tail) p->tail->next_job = j;
  else p->head = j;
  p->tail = j;
  atomic_fetch_add_explicit(&p->gen, 1, memory_order_release);
  int64_t wake = j->nchunks - 1; /* the caller takes one share itself */
  if (wake >= p->sleeping) pthread_cond_broadcast(&p->work_cv);
  else
    for (int64_t i = 0; i < wake; i++) pthread_cond_signal(&p->work_cv);
  pthread_mutex_unlock(&p->mu);
}

/* Unlink j (no new worker can join) and wait for those inside to leave. */
static void retire(fb_pool *p, pool_job *j) {
  pthread_mutex_lock(&p->mu);
  if (j->prev) j->prev->next_job = j->next_job;
  else p->head = j->next_job;
  if (j->next_job) j->next_job->prev = j->prev;
  else p->tail = j->prev;
  while (j->users > 0) pthread_cond_wait(&p->done_cv, &p->mu);
  pthread_mutex_unlock(&p->mu);
}

void fb_pool_for(fb_pool *p, int64_t n, fb_pool_fn fn, void *ctx) {
  fb_pool_for_grain(p, n, 0, fn, ctx);
}

static int pool_run(fb_pool *p, int64_t n, int64_t grain, int maxslots, fb_pool_fn fn,
                    fb_pool_slot_fn sfn, void *ctx) {
  if (n <= 0) return 0;
  int64_t chunk = chunk_size(p, n, grain > 0 ? grain : p->min_chunk);
  if (p->nworkers == 0 || chunk >= n || (sfn && maxslots <= 1)) {
    if (sfn) sfn(ctx, 0, 0, n);
    else fn(ctx, 0, n);
    return 1;
  }
  pool_job j;
  j.fn = fn;
  j.sfn = sfn;
  j.maxslots = maxslots;
  atomic_init(&j.slots, 0);
  j.ctx = ctx;
  j.n = n;
  j.chunk = chunk;
  j.nchunks = (n + chunk - 1) / chunk;
  j.users = 0;
  atomic_init(&j.next, 0);
  /* Contiguous shares, one per thread: the caller drains the first, each
   * worker that joins the next one, and a thread that is done steals from
   * the others. A loop over the same range gives each thread the same
   * share launch after launch, so the cells it wrote last time are still
   * in its core's cache (a single counter handed chunks out in whatever
   * order the threads arrived). */
  share_ctr share[MAX_SHARES];
  int ns = p->nthreads < MAX_SHARES ? p->nthreads : MAX_SHARES;
  if (ns > j.nchunks) ns = (int)j.nchunks;
  for (int k = 0; k < ns; k++) {
    atomic_init(&share[k].next, j.nchunks * k / ns);
    share[k].end = j.nchunks * (k + 1) / ns;
  }
  j.nshares = ns;
  j.share = share;
  atomic_init(&j.joined, 1);
  publish(p, &j);
  run_chunks(&j, 0);
  retire(p, &j);
  int used = atomic_load(&j.slots);
  return used < maxslots ? used : maxslots;
}

void fb_pool_for_grain(fb_pool *p, int64_t n, int64_t grain, fb_pool_fn fn, void *ctx) {
  pool_run(p, n, grain, 1, fn, NULL, ctx);
}

int fb_pool_for_slots(fb_pool *p, int64_t n, int64_t grain, int maxslots, fb_pool_slot_fn fn,
                      void *ctx) {
  return pool_run(p, n, grain, maxslots, NULL, fn, ctx);
}
