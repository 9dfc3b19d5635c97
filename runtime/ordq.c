/* The ordered queue (runtime.h "ordered queue"): a session's worker thread,
 * which runs pushed items one at a time in push order. Pushing never
 * blocks on the work; drain waits until the queue is empty and the thread
 * is between items. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/runtime.h"

struct fb_ordq {
  fb_ordq_fn fn;
  void *user;
  pthread_mutex_t mu;
  pthread_cond_t work_cv; /* the thread: an item was pushed, or stop */
  pthread_cond_t idle_cv; /* drainers: the queue ran dry */
  fb_ordq_item *head, *tail;
  int running;            /* an item is being run */
  int stop;
  pthread_t th;
};

static void *thread_main(void *arg) {
  fb_ordq *q = arg;
  pthread_mutex_lock(&q->mu);
  for (;;) {
    while (!q->head && !q->stop) pthread_cond_wait(&q->work_cv, &q->mu);
    if (!q->head) break; /* stop, and nothing left */
    fb_ordq_item *it = q->head;
    q->head = it->next;
    if (!q->head) q->tail = NULL;
    q->running = 1;
    pthread_mutex_unlock(&q->mu);
    q->fn(q->user, it);
    pthread_mutex_lock(&q->mu);
    q->running = 0;
    if (!q->head) pthread_cond_broadcast(&q->idle_cv);
  }
  pthread_mutex_unlock(&q->mu);
  return NULL;
}

int fb_ordq_new(fb_ordq_fn fn, void *user, fb_ordq **out, char *err, size_t errlen) {
  *out = NULL;
  fb_ordq *q = calloc(1, sizeof *q);
  if (!q) {
    fb_errf(err, errlen, "session worker: out of memory");
    return FB_ENOMEM;
  }
  q->fn = fn;
  q->user = user;
  pthread_mutex_init(&q->mu, NULL);
  pthread_cond_init(&q->work_cv, NULL);
  pthread_cond_init(&q->idle_cv, NULL);
  int rc = pthread_create(&q->th, NULL, thread_main, q);
  if (rc) {
    fb_errf(err, errlen, "cannot start the session's worker thread: %s", strerror(rc));
    pthread_cond_destroy(&q->idle_cv);
    pthread_cond_destroy(&q->work_cv);
    pthread_mutex_destroy(&q->mu);
    free(q);
    return rc == EAGAIN ? FB_EDEVICE : FB_ENOMEM;
  }
  *out = q;
  return 0;
}

void fb_ordq_free(fb_ordq *q) {
  if (!q) return;
  pthread_mutex_lock(&q->mu);
  q->stop = 1;
  pthread_cond_signal(&q->work_cv);
  pthread_mutex_unlock(&q->mu);
  pthread_join(q->th, NULL);
  pthread_cond_destroy(&q->idle_cv);
  pthread_cond_destroy(&q->work_cv);
  pthread_mutex_destroy(&q->mu);
  free(q);
}

void fb_ordq_push(fb_ordq *q, fb_ordq_item *it) {
  it->next = NULL;
  pthread_mutex_lock(&q->mu);
  if (q->tail) q->tail->next = it;
  else q->head = it;
  q->tail = it;
  pthread_cond_signal(&q->work_cv);
  pthread_mutex_unlock(&q->mu);
}

void fb_ordq_drain(fb_ordq *q) {
  pthread_mutex_lock(&q->mu);
  while (q->head || q->running) pthread_cond_wait(&q->idle_cv, &q->mu);
  pthread_mutex_unlock(&q->mu);
}

int fb_ordq_idle(fb_ordq *q) {
  pthread_mutex_lock(&q->mu);
  int idle = !q->head && !q->running;
  pthread_mutex_unlock(&q->mu);
  return idle;
}
