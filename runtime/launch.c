/* The CPU device and its launcher: runs the compiled tasks of one kernel
 * launch in order. Serial tasks run on the calling thread; a parallel task
 * asks its bounds function for the iteration count and hands the range to
 * the thread pool (list generations in small chunks: their iterations are
 * whole blocks). Before a listgen task the host sizes its list. Backend
 * time is the CLOCK_MONOTONIC time around the device work. At the end, the
 * CPU device's operations table (fb_cpu_ops) and the choice of a table by
 * name (fb_device_ops_for, runtime.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "runtime/cpu.h"
#include "runtime/cuda.h" /* fb_cuda_ops, for fb_device_ops_for */

int fb_cpu_device_new(int threads, fb_cpu_device **out, char *err, size_t errlen) {
  *out = NULL;
  fb_cpu_device *d = calloc(1, sizeof *d);
  if (!d) {
    fb_errf(err, errlen, "CPU device: out of memory");
    return FB_ENOMEM;
  }
  int rc = fb_pool_new(threads, 0, &d->pool, err, errlen);
  if (rc) {
    free(d);
    return rc;
  }
  pthread_mutex_init(&d->priv_mu, NULL);
  *out = d;
  return 0;
}

void fb_cpu_device_free(fb_cpu_device *d) {
  if (!d) return;
  fb_cpu_jit_free(d->jit);
  fb_pool_free(d->pool);
  pthread_mutex_destroy(&d->priv_mu);
  free(d->priv_buf);
  free(d);
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

typedef struct par_job {
  fb_task_body_fn body;
  fb_rt_ctx *ctx;
} par_job;

static void par_chunk(void *arg, int64_t lo, int64_t hi) {
  const par_job *j = arg;
  j->body(j->ctx, lo, hi);
}

/* ---------------------------------------------------------------- privatized scatter
 * A task with t->priv.n > 0 (codegen/priv.c) adds into ctx->priv: each
 * thread that joins the loop takes a slot; slot 0 adds into root itself,
 * slot s > 0 into copy s - 1 of root bytes [lo, hi), which holds
 * 0x80000000 in every word: -0.0 for an f32 tree (x + -0.0 == x, bit for
 * bit), a bias for an i32/u32 tree (the word holds 0x80000000 + the
 * thread's sum modulo 2^32). After the loop every word a copy changed is
 * added into root (f32: root + word; integers: root + word - 0x80000000,
 * modulo 2^32) and set back to 0x80000000, so the copies are ready for the
 * next launch, whichever trees it privatizes. At most PRIV_MAX_TOTAL bytes of copies (fewer
 * threads join beyond it), and none for a loop too short to pay for the
 * sum (the loop then runs on one thread). A launch that finds the device's
 * copies in use takes its own, all such own copies together at most
 * PRIV_MAX_TOTAL too (priv_take), so a device shared by every session
 * holds at most twice PRIV_MAX_TOTAL of copies. */
#define PRIV_MAX_TOTAL ((size_t)64 << 20)
#define PRIV_NEG0 0x80000000u /* -0.0f, and the integer words' bias */
#define PRIV_MAX_SLOTS 64

typedef struct priv_slot {
  fb_rt_ctx ctx;
  int ran;
} priv_slot;

typedef struct priv_job {
  fb_task_body_fn body;
  priv_slot *slots;
} priv_job;

static void priv_chunk(void *arg, int slot, int64_t lo, int64_t hi) {
  const priv_job *j = arg;
  j->slots[slot].ran = 1;
  j->body(&j->slots[slot].ctx, lo, hi);
}

typedef struct priv_sum {
  uint32_t *root;         /* root's word 0 */
  const int64_t *first;   /* per range: its first word (in root) */
  const int64_t *count;   /* per range: its words */
  const int64_t *i32;     /* per range: 1 for integer words */
  int nranges;
  int64_t lo_word;        /* root word of each copy's word 0 */
  uint32_t *copies[PRIV_MAX_SLOTS];
  int ncopies;
  size_t stride;          /* words between copies */
} priv_sum;

static float f32_of(uint32_t w) {
  float f;
  memcpy(&f, &w, sizeof f);
  return f;
}

static uint32_t bits_of(float f) {
  uint32_t w;
  memcpy(&w, &f, sizeof w);
  return w;
}

/* Root words [w, e) (copy word i - shift for root word i): root += copy
 * where the copy is not 0x80000000 (f32: -0.0, the identity; integers:
 * root += copy - 0x80000000, unsigned, so modulo 2^32), and the copy back
 * to 0x80000000. Most of a grid is usually untouched: blocks of 16 words
 * that are all 0x80000000 are skipped after one pass of 64-bit compares. */
#define PRIV_BLOCK 16
static void priv_add_words(uint32_t *root, uint32_t *copy, int64_t shift, int64_t w, int64_t e,
                           int ints) {
  const uint64_t neg2 = ((uint64_t)PRIV_NEG0 << 32) | PRIV_NEG0;
  while (w < e) {
    int64_t stop = w + PRIV_BLOCK < e ? w + PRIV_BLOCK : e;
    if (stop - w == PRIV_BLOCK) {
      uint64_t diff = 0, q[PRIV_BLOCK / 2];
      memcpy(q, copy + (w - shift), sizeof q);
      for (int i = 0; i < PRIV_BLOCK / 2; i++) diff |= q[i] ^ neg2;
      if (!diff) {
        w = stop;
        continue;
      }
    }
    for (; w < stop; w++) {
      uint32_t *cw = &copy[w - shift];
      if (*cw == PRIV_NEG0) continue;
      root[w] = ints ? root[w] + (*cw - PRIV_NEG0) : bits_of(f32_of(root[w]) + f32_of(*cw));
      *cw = PRIV_NEG0;
    }
  }
}

/* Words [a, b) of the concatenated ranges: every copy into root. */
static void priv_sum_chunk(void *arg, int64_t a, int64_t b) {
  const priv_sum *ps = arg;
  int64_t base = 0;
  for (int r = 0; r < ps->nranges && base < b; r++) {
    int64_t lo = a > base ? a - base : 0, hi = b - base < ps->count[r] ? b - base : ps->count[r];
    if (lo < hi)
      for (int c = 0; c < ps->ncopies; c++)
        priv_add_words(ps->root, ps->copies[c], ps->lo_word, ps->first[r] + lo, ps->first[r] + hi,
                       ps->i32[r] != 0);
    base += ps->count[r];
  }
}

static uint32_t *priv_alloc(size_t words) {
  uint32_t *b = malloc(words * sizeof *b);
  if (b)
    for (size_t i = 0; i < words; i++) b[i] = PRIV_NEG0;
  return b;
}

/* Copies for `words` words: the device's when free (grown if needed), else
 * one of this launch's own (*own). NULL when there is no memory, or when
 * the own copies of the launches running now would pass PRIV_MAX_TOTAL
 * with this one's: the sessions of a server share one device, and each
 * concurrent launch taking PRIV_MAX_TOTAL of its own would make the
 * device hold that much per session, outside every budget. */
static uint32_t *priv_take(fb_cpu_device *d, size_t words, uint32_t **own) {
  *own = NULL;
  pthread_mutex_lock(&d->priv_mu);
  if (!d->priv_busy) {
    if (d->priv_words < words) {
      uint32_t *b = priv_alloc(words);
      if (!b) {
        pthread_mutex_unlock(&d->priv_mu);
        return NULL;
      }
      free(d->priv_buf);
      d->priv_buf = b;
      d->priv_words = words;
    }
    d->priv_busy = 1;
    pthread_mutex_unlock(&d->priv_mu);
    return d->priv_buf;
  }
  if (words > PRIV_MAX_TOTAL / sizeof(uint32_t) - d->priv_own_words) {
    pthread_mutex_unlock(&d->priv_mu);
    return NULL;
  }
  d->priv_own_words += words;
  pthread_mutex_unlock(&d->priv_mu);
  *own = priv_alloc(words);
  if (!*own) {
    pthread_mutex_lock(&d->priv_mu);
    d->priv_own_words -= words;
    pthread_mutex_unlock(&d->priv_mu);
  }
  return *own;
}

/* Back: the device's copies, or this launch's own (own, words). */
static void priv_give(fb_cpu_device *d, uint32_t *own, size_t words) {
  free(own);
  pthread_mutex_lock(&d->priv_mu);
  if (own) d->priv_own_words -= words;
  else d->priv_busy = 0;
  pthread_mutex_unlock(&d->priv_mu);
}

static void run_private(fb_cpu_device *d, fb_rt_ctx *ctx, const fb_rt_task *t, int64_t n,
                        int64_t grain) {
  const fb_cg_priv *pv = &t->priv;
  int64_t words_span = (pv->hi - pv->lo + 3) / 4, words = 0;
  for (int r = 0; r < pv->n && r < FB_CG_PRIV_MAX; r++) words += pv->bytes[r] / 4;
  size_t stride = ((size_t)words_span + 15) & ~(size_t)15; /* 64-byte copies */
  int threads = fb_pool_threads(d->pool);
  int maxslots = threads < PRIV_MAX_SLOTS ? threads : PRIV_MAX_SLOTS;
  size_t copy_bytes = stride * sizeof(uint32_t);
  size_t fit = copy_bytes > 0 ? PRIV_MAX_TOTAL / copy_bytes : 0;
  if ((size_t)(maxslots - 1) > fit) maxslots = (int)fit + 1;
  /* the sum reads every copy's words: only for loops long enough to pay */
  if (n < words / 16 || stride == 0) maxslots = 1;
  priv_slot slots[PRIV_MAX_SLOTS];
  uint32_t *own = NULL, *buf = NULL;
  size_t total = stride * (size_t)(maxslots - 1);
  if (maxslots > 1) buf = priv_take(d, total, &own);
  if (!buf) maxslots = 1; /* no memory for copies: one thread, into root */
  for (int s = 0; s < maxslots; s++) {
    slots[s].ctx = *ctx;
    slots[s].ran = 0;
    /* priv + off is the copy of root + off: copy s - 1 holds root bytes
     * [lo, hi) from its start (integer arithmetic: the base itself points
     * outside the copy) */
    slots[s].ctx.priv =
        s == 0 ? ctx->root
               : (uint8_t *)((uintptr_t)(buf + stride * (size_t)(s - 1)) - (uintptr_t)pv->lo);
  }
  priv_job j = {t->body, slots};
  int used = fb_pool_for_slots(d->pool, n, grain, maxslots, priv_chunk, &j);
  if (!buf) return;
  int nr = pv->n < FB_CG_PRIV_MAX ? (int)pv->n : FB_CG_PRIV_MAX;
  priv_sum ps = {
      (uint32_t *)(void *)ctx->root, NULL, NULL, pv->i32, nr, pv->lo / 4, {0}, 0, stride};
  int64_t first[FB_CG_PRIV_MAX], count[FB_CG_PRIV_MAX];
  for (int r = 0; r < nr; r++) {
    first[r] = pv->off[r] / 4;
    count[r] = pv->bytes[r] / 4;
  }
  ps.first = first;
  ps.count = count;
  for (int s = 1; s < used && s < maxslots; s++)
    if (slots[s].ran) ps.copies[ps.ncopies++] = buf + stride * (size_t)(s - 1);
  if (ps.ncopies) fb_pool_for(d->pool, words, priv_sum_chunk, &ps);
  priv_give(d, own, total);
}

static void run_task(fb_cpu_device *d, fb_rt_ctx *ctx, const fb_rt_task *t, int64_t grain) {
  if (!t->bounds) {
    t->body(ctx, 0, 0);
    return;
  }
  int64_t n = 0;
  t->bounds(ctx, &n);
  if (n <= 0) return;
  if (t->priv.n > 0 && t->priv.hi > t->priv.lo) {
    run_private(d, ctx, t, n, grain);
    return;
  }
  par_job j = {t->body, ctx};
  fb_pool_for_grain(d->pool, n, grain, par_chunk, &j);
}

int fb_cpu_run(fb_cpu_device *d, fb_rt_ctx *ctx, const fb_rt_task *tasks, int ntasks,
               double *seconds, int *failed) {
  return fb_cpu_run_sparse(d, ctx, NULL, tasks, NULL, ntasks, seconds, failed, NULL, 0);
}

int fb_cpu_run_sparse(fb_cpu_device *d, fb_rt_ctx *ctx, fb_sparse *sp, const fb_rt_task *tasks,
                      const fb_rt_hint *hints, int ntasks, double *seconds, int *failed, char *err,
                      size_t errlen) {
  int first = 0, where = -1;
  double t0 = now_s();
  for (int i = 0; i < ntasks; i++) {
    if (sp && hints && hints[i].list_snode > 0) {
      int rc = fb_sparse_prepare_list(sp, hints[i].list_snode, err, errlen);
      if (rc) {
        if (!first || first == FB_EBOUNDS || first == FB_EQUOTA) first = rc, where = i;
        break;
      }
    }
    int32_t before = *ctx->error;
    run_task(d, ctx, &tasks[i], hints ? hints[i].grain : 0);
    int32_t e = *ctx->error;
    if (e && !before) where = i;
    if (e && !first) first = e;
    if (e && e != FB_EBOUNDS && e != FB_EQUOTA) break;
  }
  if (seconds) *seconds = now_s() - t0;
  if (failed) *failed = where;
  return first;
}

/* ---------------------------------------------------------------- device operations */

/* The thread pool and the JIT that compiles for it. */
static int cpu_open(int threads, void **dev, char *err, size_t errlen) {
  fb_cpu_device *d;
  *dev = NULL;
  int rc = fb_cpu_device_new(threads, &d, err, errlen);
  if (rc) return rc;
  d->jit = fb_cpu_jit_new(err, errlen);
  if (!d->jit) {
    fb_cpu_device_free(d);
    return FB_EDEVICE;
  }
  snprintf(d->name, sizeof d->name, "CPU (%d threads)", fb_pool_threads(d->pool));
  *dev = d;
  return 0;
}

static void cpu_close(void *dev) { fb_cpu_device_free(dev); }

static const char *cpu_name(const void *dev) { return ((const fb_cpu_device *)dev)->name; }

static int cpu_healthy(void *dev, char *why, size_t len) { return 1; }

/* CPU tasks read their arguments through a pointer: no bound. */
static int cpu_max_task_params(void) { return 0; }

static int cpu_compile(void *dev, const fb_cg_task *t, fb_cpu_code *out, char *err, size_t errlen) {
  return fb_cpu_jit_compile(((fb_cpu_device *)dev)->jit, t, out, err, errlen);
}

/* The cache is the JIT's: evicted code leaves the JIT. */
static void cpu_code_cache(void *dev, fb_code_cache_info *out) {
  fb_cpu_jit_cache_info(((fb_cpu_device *)dev)->jit, out);
}

static void cpu_set_code_cache_bytes(void *dev, uint64_t bytes) {
  fb_cpu_jit_set_cache_limit(((fb_cpu_device *)dev)->jit, bytes);
}

static int cpu_set_code_store(void *dev, const fb_code_store *s) {
  return fb_cpu_jit_set_store(((fb_cpu_device *)dev)->jit, s);
}

/* A session's queue is the device itself: it keeps nothing per session. */
static int cpu_queue_new(void *dev, void **q, char *err, size_t errlen) {
  *q = dev;
  return 0;
}

static void cpu_queue_free(void *q) {}

static const fb_memsys *cpu_memsys(void *q) { return NULL; }

static int cpu_alive(void *q, char *err, size_t errlen) { return 0; }

static int cpu_run(void *q, fb_rt_ctx *ctx, fb_sparse *sp, const fb_rt_task *tasks,
                   const fb_rt_hint *hints, int ntasks, double *seconds, int *failed, char *err,
                   size_t errlen) {
  return fb_cpu_run_sparse(q, ctx, sp, tasks, hints, ntasks, seconds, failed, err, errlen);
}

static int cpu_begin(void *q, char *err, size_t errlen) { return 0; }

/* Runs the task now: its error, no slot. */
static int cpu_launch(void *q, fb_rt_ctx *ctx, const fb_rt_task *t, const fb_rt_hint *hint,
                      fb_sparse *sp, int *slot, double *seconds, char *err, size_t errlen) {
  int failed = -1;
  *slot = -1;
  return fb_cpu_run_sparse(q, ctx, sp, t, hint, 1, seconds, &failed, err, errlen);
}

static int cpu_finish(void *q, const int32_t **errs, int *nslots, double *seconds, char *err,
                      size_t errlen) {
  *errs = NULL;
  *nslots = 0;
  if (seconds) *seconds = 0;
  return 0;
}

static const fb_device_ops fb_cpu_ops = {
    .backend = "cpu",
    .queued = 0,
    .open = cpu_open,
    .close = cpu_close,
    .name = cpu_name,
    .healthy = cpu_healthy,
    .max_task_params = cpu_max_task_params,
    .compile = cpu_compile,
    .code_cache = cpu_code_cache,
    .set_code_cache_bytes = cpu_set_code_cache_bytes,
    .set_code_store = cpu_set_code_store,
    .queue_new = cpu_queue_new,
    .queue_free = cpu_queue_free,
    .memsys = cpu_memsys,
    .alive = cpu_alive,
    .run = cpu_run,
    .begin = cpu_begin,
    .launch = cpu_launch,
    .finish = cpu_finish,
};

const fb_device_ops *fb_device_ops_for(const char *backend) {
  if (backend && strcmp(backend, "cpu") == 0) return &fb_cpu_ops;
  if (backend && strcmp(backend, "cuda") == 0) return &fb_cuda_ops;
  return NULL;
}
