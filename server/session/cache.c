/* The compile cache served to a session process: a socket of its own,
 * handed over with CREATE, and a broker thread that answers its get/put
 * requests from the session's partition of the code store. */
#define _GNU_SOURCE
#include "server/session/proc.h"

/* ---------------------------------------------------------------- compile cache
 * Under process isolation the worker's JIT asks the broker (docs/code-cache.md,
 * "Who writes"): a socket of its own, handed to the worker with CREATE,
 * served by a broker thread per session. The worker sends
 *   wire_cache {magic, op (get/put), target_len, ir_len, code_len} | target | ir | code
 * and a get is answered by {magic, found, 0, 0, code_len} | code. The broker
 * bounds every length before it reads, uses the session's own partition
 * (never one the worker names), and verifies entries itself (dcache.c); the
 * worker never sees the key or the directory. A malformed request ends the
 * service: the worker then compiles everything itself. */

typedef struct cache_srv {
  fbd_server *srv;
  int fd;
  uint64_t partition;
} cache_srv;

static void *cache_main(void *arg) {
  cache_srv c = *(cache_srv *)arg;
  free(arg);
  for (;;) {
    wire_cache h;
    if (fbd_frame_read_full(c.fd, &h, sizeof h)) break;
    if (h.magic != CACHE_MAGIC || (h.op != CACHE_GET && h.op != CACHE_PUT) ||
        h.target_len > CACHE_MAX_TARGET || h.ir_len > FBD_DCACHE_MAX_IR ||
        h.code_len > FBD_DCACHE_MAX_PAYLOAD || (h.op == CACHE_GET && h.code_len)) {
      fbd_logf(c.srv->log, FBD_LOG_WARN,
               "a session worker sent a malformed compile cache request: its cache is off");
      break;
    }
    char *target = malloc(h.target_len + 1);
    char *ir = malloc(h.ir_len + 1);
    uint8_t *code = malloc(h.code_len + 1);
    int bad = !target || !ir || !code || fbd_frame_read_full(c.fd, target, h.target_len) ||
              fbd_frame_read_full(c.fd, ir, h.ir_len) ||
              fbd_frame_read_full(c.fd, code, h.code_len);
    if (!bad) {
      target[h.target_len] = 0;
      if (strlen(target) != h.target_len) bad = 1; /* a NUL inside: not text */
    }
    if (!bad && h.op == CACHE_PUT) {
      fbd_codestore_put(c.srv->codestore, c.partition, target, ir, h.ir_len, code, h.code_len);
    } else if (!bad) {
      uint8_t *out = NULL;
      size_t len = 0;
      int found =
          fbd_codestore_get(c.srv->codestore, c.partition, target, ir, h.ir_len, &out, &len);
      wire_cache a = {CACHE_MAGIC, (uint32_t)found, 0, 0, found ? len : 0};
      bad = fbd_frame_write_full(c.fd, &a, sizeof a) ||
            (found && fbd_frame_write_full(c.fd, out, len));
      free(out);
    }
    free(target);
    free(ir);
    free(code);
    if (bad) break;
  }
  shutdown(c.fd, SHUT_RDWR);
  return NULL;
}

/* A socket for the worker's compile cache requests and its serving thread:
 * the worker's end (to hand over with CREATE), or -1 when there is no
 * cache (or it cannot be set up: the worker then compiles everything). */
int fbd_cache_start(fbd_session *s) {
  if (!s->srv->codestore || s->proc->cache_th_on) return -1;
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv)) return -1;
  cache_srv *c = malloc(sizeof *c);
  if (!c) {
    close(sv[0]);
    close(sv[1]);
    return -1;
  }
  *c = (cache_srv){s->srv, sv[0], s->ecfg.cache_partition};
  s->proc->cache_fd = sv[0];
  if (pthread_create(&s->proc->cache_th, NULL, cache_main, c)) {
    free(c);
    close(sv[0]);
    close(sv[1]);
    s->proc->cache_fd = -1;
    return -1;
  }
  s->proc->cache_th_on = 1;
  return sv[1];
}

/* CREATE: the settings, then the request as the client sent it. */
