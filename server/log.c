/* fuseboxd's logger: one line per event, "<UTC time> <LEVEL> <message>",
 * or with --log-format json {"time":"...","level":"info","msg":"..."},
 * written whole under a lock so lines from different threads never mix. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "server/server.h"

/* The server's clock: monotonic seconds (every file's deadlines). */
double fbd_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static const char *const level_names[] = {"ERROR", "WARN", "INFO", "DEBUG"};

void fbd_log_init(fbd_log *l, FILE *f, int level) {
  l->f = f;
  l->level = level;
  pthread_mutex_init(&l->mu, NULL);
}

void fbd_log_destroy(fbd_log *l) { pthread_mutex_destroy(&l->mu); }

/* The text line's parts as one JSON object; the message escaped. */
static void json_line(fbd_log *l, const char *line, const char *msg, int level) {
  static const char *const lower[] = {"error", "warn", "info", "debug"};
  char out[2 * (FBD_ERRLEN + 128) + 96];
  size_t n =
      (size_t)snprintf(out, sizeof out, "{\"time\":\"%.24s\",\"level\":\"%s\",\"msg\":\"", line,
                       lower[level < 0   ? 0
                             : level > 3 ? 3
                                         : level]);
  for (const unsigned char *p = (const unsigned char *)msg; *p && n + 8 < sizeof out; p++) {
    if (*p == '"' || *p == '\\') {
      out[n++] = '\\';
      out[n++] = (char)*p;
    } else if (*p < 0x20) {
      n += (size_t)snprintf(out + n, sizeof out - n, "\\u%04x", *p);
    } else {
      out[n++] = (char)*p;
    }
  }
  out[n] = 0;
  pthread_mutex_lock(&l->mu);
  fprintf(l->f, "%s\"}\n", out);
  fflush(l->f);
  pthread_mutex_unlock(&l->mu);
}

int fbd_log_level_from_name(const char *s) {
  for (int i = 0; i < 4; i++)
    if (s && strcasecmp(s, level_names[i]) == 0) return i;
  if (s && strcasecmp(s, "warning") == 0) return FBD_LOG_WARN;
  return -1;
}

void fbd_logf(fbd_log *l, int level, const char *fmt, ...) {
  if (!l || level > __atomic_load_n(&l->level, __ATOMIC_RELAXED)) return; /* SIGHUP may change it */
  char line[FBD_ERRLEN + 128];
  struct timespec ts;
  struct tm tm;
  clock_gettime(CLOCK_REALTIME, &ts);
  gmtime_r(&ts.tv_sec, &tm);
  size_t n = strftime(line, sizeof line, "%Y-%m-%dT%H:%M:%S", &tm);
  n += (size_t)snprintf(line + n, sizeof line - n, ".%03ldZ %-5s ", ts.tv_nsec / 1000000,
                        level_names[level < 0   ? 0
                                    : level > 3 ? 3
                                                : level]);
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line + n, sizeof line - n, fmt, ap);
  va_end(ap);
  /* one event, one line: fold embedded newlines (verifier messages) */
  for (char *p = line + n; *p; p++)
    if (*p == '\n') *p = '|';
  if (l->json) {
    json_line(l, line, line + n, level);
    return;
  }
  pthread_mutex_lock(&l->mu);
  fprintf(l->f, "%s\n", line);
  fflush(l->f);
  pthread_mutex_unlock(&l->mu);
}
