/* The compile pool (runtime.h "compile pool"): a FIFO of compile jobs
 * shared by every session of an engine, worked by a fixed set of threads.
 * A job's state moves queued -> running -> done, always under the pool's
 * mutex; a waiter that finds its job still queued unlinks it and compiles
 * it itself, so the launcher never sits behind a queue of other sessions'
 * work for code it could build now (a code-cache hit costs a lookup); a job
 * that was never submitted is compiled by its waiter.
 * Completions wake every waiter (one condition variable): compiles are
 * milliseconds apart, so the extra wake-ups cost nothing that matters. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/runtime.h"

enum {
  JOB_QUEUED = 1,
  JOB_RUNNING,
  JOB_DONE
};

struct fb_cpool {
  fb_compile_fn compile;
  void *user;
  pthread_mutex_t mu;
  pthread_cond_t work_cv; /* threads: a job was queued, or stop */
  pthread_cond_t done_cv; /* waiters: a job is done */
  fb_cjob *head, *tail;
  int stop;
  int nthreads, started;
  pthread_t *th;
};

typedef struct thread_arg {
  fb_cpool *p;
  int index;
} thread_arg;

static void compile_job(fb_cpool *p, fb_cjob *j, int tid) {
  double t0 = fb_trace_clock();
  j->msg[0] = 0;
  j->rc = p->compile(p->user, &j->task, &j->code, j->msg, sizeof j->msg);
  if (!j->rc && !j->code.gpu && (!j->code.body || (j->task.loop >= 0 && !j->code.bounds))) {
    j->rc = FB_EINTERNAL;
    fb_errf(j->msg, sizeof j->msg, "the JIT returned no entry point");
  }
  if (!j->trace) return;
  char name[160], args[96];
  snprintf(name, sizeof name, "compile %s", j->task.ir->name ? j->task.ir->name : "?");
  snprintf(args, sizeof args, "{\"cache_hit\":%d,\"statements\":%d,\"ok\":%d}", j->code.cache_hit,
           j->code.stmts_emitted, j->rc == 0);
  fb_trace_span(j->trace, tid, "compile", name, t0, fb_trace_clock(), args);
}

/* Under the mutex. */
static void unlink_job(fb_cpool *p, fb_cjob *j) {
  if (j->prev) j->prev->next = j->next;
  else p->head = j->next;
  if (j->next) j->next->prev = j->prev;
  else p->tail = j->prev;
  j->prev = j->next = NULL;
}

static void finish(fb_cpool *p, fb_cjob *j) {
  pthread_mutex_lock(&p->mu);
  j->state = JOB_DONE;
  pthread_cond_broadcast(&p->done_cv);
  pthread_mutex_unlock(&p->mu);
}

static void *thread_main(void *arg) {
  thread_arg a = *(thread_arg *)arg;
  free(arg);
  fb_cpool *p = a.p;
  pthread_mutex_lock(&p->mu);
  for (;;) {
    while (!p->stop && !p->head) pthread_cond_wait(&p->work_cv, &p->mu);
    if (p->stop) break;
    fb_cjob *j = p->head;
    unlink_job(p, j);
    j->state = JOB_RUNNING;
    pthread_mutex_unlock(&p->mu);
    compile_job(p, j, FB_TRACK_COMPILE + a.index);
    finish(p, j);
    pthread_mutex_lock(&p->mu);
  }
  pthread_mutex_unlock(&p->mu);
  return NULL;
}

static void stop_threads(fb_cpool *p) {
  pthread_mutex_lock(&p->mu);
  p->stop = 1;
  pthread_cond_broadcast(&p->work_cv);
  pthread_mutex_unlock(&p->mu);
  for (int i = 0; i < p->started; i++) pthread_join(p->th[i], NULL);
  p->started = 0;
}

static int start_threads(fb_cpool *p, char *err, size_t errlen) {
  for (int i = 0; i < p->nthreads; i++) {
    thread_arg *a = malloc(sizeof *a);
    int rc = a ? 0 : ENOMEM;
    if (a) {
      *a = (thread_arg){p, i};
      rc = pthread_create(&p->th[i], NULL, thread_main, a);
      if (rc) free(a);
    }
    if (rc) {
      fb_errf(err, errlen, "cannot start compile thread %d of %d: %s", i + 1, p->nthreads,
              strerror(rc));
      stop_threads(p);
      return rc == EAGAIN ? FB_EDEVICE : FB_ENOMEM;
    }
    p->started++;
  }
  return 0;
}

static int jit_compile(void *jit, const fb_cg_task *t, fb_cpu_code *out, char *err, size_t errlen) {
  return fb_cpu_jit_compile(jit, t, out, err, errlen);
}

int fb_cpool_new(fb_cpu_jit *jit, int nthreads, fb_cpool **out, char *err, size_t errlen) {
  return fb_cpool_new_with(jit ? jit_compile : NULL, jit, nthreads, out, err, errlen);
}

int fb_cpool_new_with(fb_compile_fn fn, void *user, int nthreads, fb_cpool **out, char *err,
                      size_t errlen) {
  *out = NULL;
  if (!fn || nthreads < 0) {
    fb_errf(err, errlen, "compile pool: no compiler, or %d threads", nthreads);
    return FB_EINVAL;
  }
  fb_cpool *p = calloc(1, sizeof *p);
  int n = nthreads ? nthreads : fb_cpu_cores();
  if (p) p->th = calloc((size_t)n, sizeof *p->th);
  if (!p || !p->th) {
    free(p);
    fb_errf(err, errlen, "compile pool: out of memory");
    return FB_ENOMEM;
  }
  p->compile = fn;
  p->user = user;
  p->nthreads = n;
  pthread_mutex_init(&p->mu, NULL);
  pthread_cond_init(&p->work_cv, NULL);
  pthread_cond_init(&p->done_cv, NULL);
  int rc = start_threads(p, err, errlen);
  if (rc) {
    fb_cpool_free(p);
    return rc;
  }
  *out = p;
  return 0;
}

void fb_cpool_free(fb_cpool *p) {
  if (!p) return;
  stop_threads(p);
  pthread_cond_destroy(&p->done_cv);
  pthread_cond_destroy(&p->work_cv);
  pthread_mutex_destroy(&p->mu);
  free(p->th);
  free(p);
}

int fb_cpool_threads(const fb_cpool *p) { return p->nthreads; }

void fb_cpool_submit(fb_cpool *p, fb_cjob *jobs, int n) {
  if (n <= 0) return;
  pthread_mutex_lock(&p->mu);
  for (int i = 0; i < n; i++) {
    fb_cjob *j = &jobs[i];
    j->state = JOB_QUEUED;
    j->next = NULL;
    j->prev = p->tail;
    if (p->tail) p->tail->next = j;
    else p->head = j;
    p->tail = j;
  }
  if (n == 1) pthread_cond_signal(&p->work_cv);
  else pthread_cond_broadcast(&p->work_cv);
  pthread_mutex_unlock(&p->mu);
}

int fb_cpool_withdraw(fb_cpool *p, fb_cjob *job) {
  pthread_mutex_lock(&p->mu);
  int dropped = job->state == JOB_QUEUED || job->state == 0;
  if (job->state == JOB_QUEUED) unlink_job(p, job);
  if (dropped) job->state = JOB_DONE;
  while (job->state != JOB_DONE) pthread_cond_wait(&p->done_cv, &p->mu);
  pthread_mutex_unlock(&p->mu);
  return dropped;
}

int fb_cpool_done(fb_cpool *p, fb_cjob *job) {
  pthread_mutex_lock(&p->mu);
  int done = job->state == JOB_DONE;
  pthread_mutex_unlock(&p->mu);
  return done;
}

void fb_cpool_wait(fb_cpool *p, fb_cjob *job, int tid) {
  pthread_mutex_lock(&p->mu);
  if (job->state == JOB_QUEUED || job->state == 0) {
    if (job->state == JOB_QUEUED) unlink_job(p, job);
    job->state = JOB_RUNNING;
    pthread_mutex_unlock(&p->mu);
    compile_job(p, job, tid);
    finish(p, job);
    return;
  }
  while (job->state != JOB_DONE) pthread_cond_wait(&p->done_cv, &p->mu);
  pthread_mutex_unlock(&p->mu);
}
