/* The trace-event timeline (runtime.h "timeline"): complete events recorded
 * from any thread under one mutex, written as Chrome trace-event JSON
 * ({"traceEvents": [...]}, times in microseconds from the recorder's
 * creation) with process and thread names, which Perfetto and
 * chrome://tracing open. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "runtime/runtime.h"

#define MAX_EVENTS (1u << 20) /* about 100 MB of events at most */

typedef struct tevent {
  int tid;
  double t0, t1;
  char *cat, *name, *args;
} tevent;

struct fb_trace {
  pthread_mutex_t mu;
  int pid;
  char *process;
  double origin;
  tevent *ev;
  size_t n, cap;
  uint64_t dropped;
  int tids[64];   /* tracks seen, for their names */
  int ntids;
};

double fb_trace_clock(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

fb_trace *fb_trace_new(int pid, const char *process) {
  fb_trace *t = calloc(1, sizeof *t);
  if (!t) return NULL;
  t->process = strdup(process ? process : "fusebox");
  if (!t->process) {
    free(t);
    return NULL;
  }
  pthread_mutex_init(&t->mu, NULL);
  t->pid = pid;
  t->origin = fb_trace_clock();
  return t;
}

void fb_trace_free(fb_trace *t) {
  if (!t) return;
  for (size_t i = 0; i < t->n; i++) {
    free(t->ev[i].cat);
    free(t->ev[i].name);
    free(t->ev[i].args);
  }
  free(t->ev);
  free(t->process);
  pthread_mutex_destroy(&t->mu);
  free(t);
}

uint64_t fb_trace_count(fb_trace *t) {
  pthread_mutex_lock(&t->mu);
  uint64_t n = t->n;
  pthread_mutex_unlock(&t->mu);
  return n;
}

/* Under the mutex: remember a track for its thread_name record. */
static void note_tid(fb_trace *t, int tid) {
  for (int i = 0; i < t->ntids; i++)
    if (t->tids[i] == tid) return;
  if (t->ntids < (int)(sizeof t->tids / sizeof t->tids[0])) t->tids[t->ntids++] = tid;
}

/* Under the mutex: room for one more event. */
static int grow(fb_trace *t) {
  if (t->n < t->cap) return 1;
  if (t->cap >= MAX_EVENTS) return 0;
  size_t nc = t->cap ? t->cap * 2 : 1024;
  tevent *v = realloc(t->ev, sizeof *v * nc);
  if (!v) return 0;
  t->ev = v;
  t->cap = nc;
  return 1;
}

void fb_trace_span(fb_trace *t, int tid, const char *cat, const char *name, double t0, double t1,
                   const char *args) {
  if (!t) return;
  tevent e = {tid,
              t0,
              t1 < t0 ? t0 : t1,
              strdup(cat ? cat : ""),
              strdup(name ? name : "?"),
              args ? strdup(args) : NULL};
  pthread_mutex_lock(&t->mu);
  int ok = e.cat && e.name && (!args || e.args) && grow(t);
  if (ok) {
    t->ev[t->n++] = e;
    note_tid(t, tid);
  } else {
    t->dropped++;
  }
  pthread_mutex_unlock(&t->mu);
  if (!ok) {
    free(e.cat);
    free(e.name);
    free(e.args);
  }
}

/* A JSON string (quotes included). */
static void put_str(FILE *f, const char *s) {
  fputc('"', f);
  for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
    if (*p == '"' || *p == '\\') fprintf(f, "\\%c", *p);
    else if (*p < 0x20) fprintf(f, "\\u%04x", *p);
    else fputc(*p, f);
  }
  fputc('"', f);
}

static void track_name(int tid, char *buf, size_t n) {
  switch (tid) {
  case FB_TRACK_CLIENT: snprintf(buf, n, "client (optimizer)"); break;
  case FB_TRACK_LAUNCHER: snprintf(buf, n, "launcher"); break;
  case FB_TRACK_DEVICE: snprintf(buf, n, "device"); break;
  default:
    if (tid >= FB_TRACK_COMPILE) snprintf(buf, n, "compile %d", tid - FB_TRACK_COMPILE);
    else snprintf(buf, n, "track %d", tid);
  }
}

static void put_meta(FILE *f, fb_trace *t) {
  fprintf(f, "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":0,\"args\":{\"name\":",
          t->pid);
  put_str(f, t->process);
  fprintf(f, "}}");
  for (int i = 0; i < t->ntids; i++) {
    char name[64];
    track_name(t->tids[i], name, sizeof name);
    fprintf(f,
            ",\n{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":%d,\"args\":{\"name\":",
            t->pid, t->tids[i]);
    put_str(f, name);
    fprintf(f,
            "}},\n{\"name\":\"thread_sort_index\",\"ph\":\"M\",\"pid\":%d,\"tid\":%d,"
            "\"args\":{\"sort_index\":%d}}",
            t->pid, t->tids[i], t->tids[i]);
  }
}

static void put_event(FILE *f, const fb_trace *t, const tevent *e) {
  fprintf(f, ",\n{\"name\":");
  put_str(f, e->name);
  fprintf(f, ",\"cat\":");
  put_str(f, e->cat);
  fprintf(f, ",\"ph\":\"X\",\"ts\":%.3f,\"dur\":%.3f,\"pid\":%d,\"tid\":%d",
          (e->t0 - t->origin) * 1e6, (e->t1 - e->t0) * 1e6, t->pid, e->tid);
  if (e->args) fprintf(f, ",\"args\":%s", e->args);
  fputc('}', f);
}

int fb_trace_write(fb_trace *t, FILE *f) {
  pthread_mutex_lock(&t->mu);
  fprintf(f, "{\"traceEvents\":[\n");
  put_meta(f, t);
  for (size_t i = 0; i < t->n; i++) put_event(f, t, &t->ev[i]);
  fprintf(f, "\n],\"displayTimeUnit\":\"ms\",\"otherData\":{\"dropped_events\":%llu}}\n",
          (unsigned long long)t->dropped);
  pthread_mutex_unlock(&t->mu);
  return ferror(f) ? FB_EIO : 0;
}
