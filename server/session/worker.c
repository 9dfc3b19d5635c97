/* The session process's main (fuseboxd --session-worker): enter its
 * namespaces, make its engine, raise its walls (user, rlimits,
 * no_new_privs, seccomp), say hello, then read job frames and run each
 * through exec.c, answering with one reply frame; checkpoint and restore
 * streams; its compile cache requests to the broker. */
#define _GNU_SOURCE
#include "server/session/proc.h"

int fbd_worker_reply(int fd, const fbd_reply *r) {
  wire_rep h;
  memset(&h, 0, sizeof h);
  h.magic = WIRE_MAGIC;
  h.code = r->code;
  h.finish = (uint32_t)r->finish;
  h.fatal = (uint32_t)r->fatal;
  h.registered = r->registered;
  h.refused = (uint32_t)r->refused;
  h.msglen = strnlen(r->msg, sizeof r->msg - 1);
  h.pblen = r->pb ? r->pblen : 0;
  h.counters = r->counters;
  uint64_t real = h.pblen;
  if (!fbd_fault_armed) { /* the frame in one send, as a rule */
    struct iovec iov[3] = {{&h, sizeof h}, {(void *)r->msg, h.msglen}, {r->pb, real}};
    return fbd_frame_writev(fd, iov, 3, -1, NULL) ? FB_EIO : 0;
  }
  fbd_fault_header(&h);
  if (fbd_frame_write(fd, &h, sizeof h, NULL) || fbd_fault_stall(&h) ||
      (h.msglen && fbd_frame_write(fd, r->msg, h.msglen, NULL)) ||
      (real && fbd_frame_write(fd, r->pb, real, NULL)))
    return FB_EIO;
  if (real != h.pblen) fbd_fault_hang(); /* the fault: the rest of what it claimed never comes */
  return 0;
}

typedef struct worker {
  int fd;
  int cache_fd; /* the compile cache's socket to the broker (-1: none) */
  pthread_mutex_t cache_mu; /* one request at a time on it */
  fb_engine *engine;
  fbd_watch *watch;
  fbd_log log;
  fbd_exec x;
  fb_layout *layout; /* the session's: from CREATE, or from the PARSE before it */
  int created;
  const fbd_config *cfg;
} worker;

/* The settings CREATE and RESTORE carry (proc.c settings_out), for the
 * engine session; ec's mode points into c, the tag into tag. */
static void settings_in(wire_create *c, fb_session_config *ec, char tag[16]) {
  c->mode[sizeof c->mode - 1] = 0;
  c->tag[sizeof c->tag - 1] = 0;
  memset(ec, 0, sizeof *ec);
  ec->mode = c->mode;
  ec->seed = c->seed;
  ec->memory_limit = c->memory_limit;
  ec->passes = c->passes;
  ec->flush_every = c->flush_every;
  ec->max_fuse_per_task = c->max_fuse_per_task;
  ec->max_kernel_statements = c->max_kernel_statements;
  snprintf(tag, 16, "%s", c->tag);
}

static int worker_create(worker *w, const uint8_t *p, size_t n, fbd_reply *r) {
  wire_create c;
  if (w->created || n < sizeof c) {
    fb_errf(r->msg, sizeof r->msg, "a second or malformed CREATE");
    return FB_EINVAL;
  }
  memcpy(&c, p, sizeof c);
  fbp_arena a;
  fbp_arena_init(&a);
  Fusebox__V1__CreateSessionRequest *m =
      (Fusebox__V1__CreateSessionRequest *)protobuf_c_message_unpack(
          &fusebox__v1__create_session_request__descriptor, &a.pb, n - sizeof c, p + sizeof c);
  /* a source's layout came with the PARSE before */
  int rc = w->layout ? 0
           : !m      ? FB_EINVAL
                     : fbp_layout_from_pb(m->layout, &w->layout, r->msg, sizeof r->msg);
  if (!w->layout && !rc && m && m->source) rc = FB_EINVAL;
  if (!m) fb_errf(r->msg, sizeof r->msg, "malformed CreateSessionRequest");
  else if (rc == FB_EINVAL && m->source && !w->layout)
    fb_errf(r->msg, sizeof r->msg, "CREATE of a source without its PARSE");
  fbp_arena_free(&a);
  if (rc) return rc;
  fb_session_config ec;
  static char tag[16];
  settings_in(&c, &ec, tag);
  fbd_exec_init(&w->x, w->engine, w->layout, &ec, tag, &w->log, w->watch);
  w->x.parse_timeout_s = w->cfg->compile_timeout_s; /* its kernels' sources */
  w->created = 1;
  fbd_exec_run(&w->x, FBD_J_CREATE, NULL, 0, NULL, 0, r);
  return 0;
}

/* The memfds of field transfers, mapped. A session's broker reuses its
 * last two staging buffers for transfers of the same size, so the worker
 * keeps its last two mappings too (by inode): repeated reads and writes of
 * a field map and fault in nothing. */
typedef struct mapping {
  ino_t ino;
  uint64_t len;
  uint8_t *p;
  uint64_t used;
} mapping;

static mapping maps[2];
static uint64_t map_clock;

static uint8_t *map_buf(int fd, uint64_t len, char *err, size_t errlen) {
  struct stat st;
  if (fd < 0 || fstat(fd, &st) || (uint64_t)st.st_size < len || !len) {
    fb_errf(err, errlen, "field transfer without a buffer of %llu bytes", (unsigned long long)len);
    return NULL;
  }
  for (int i = 0; i < 2; i++)
    if (maps[i].p && maps[i].ino == st.st_ino && maps[i].len == len) {
      maps[i].used = ++map_clock;
      return maps[i].p;
    }
  void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  if (p == MAP_FAILED) {
    fb_errf(err, errlen, "cannot map %llu bytes of field data: %s", (unsigned long long)len,
            strerror(errno));
    return NULL;
  }
  int k = !maps[0].p ? 0 : !maps[1].p ? 1 : maps[0].used < maps[1].used ? 0 : 1;
  if (maps[k].p) munmap(maps[k].p, maps[k].len);
  maps[k] = (mapping){st.st_ino, len, p, ++map_clock};
  return p;
}

/* A tenant's source, parsed here in its sandbox: the layout for the CREATE
 * to come (sent back as protobuf), or DescribeSource's answer. */
static void worker_parse(worker *w, int kind, const uint8_t *p, size_t n, fbd_reply *r) {
  w->x.watch = w->watch; /* the limits of the parse (exec.c) */
  w->x.parse_timeout_s = w->cfg->compile_timeout_s;
  r->finish = 1;
  if (w->created || w->layout) {
    r->code = FB_EINVAL;
    fb_errf(r->msg, sizeof r->msg, "a parse after the session's layout was set");
    return;
  }
  if (kind == FBD_J_DESCRIBE) {
    fbd_exec_describe(&w->x, p, n, r);
    return;
  }
  r->code = fbd_exec_parse(&w->x, p, n, &w->layout, r->msg, sizeof r->msg);
  if (r->code) return;
  fbp_arena a;
  fbp_arena_init(&a);
  Fusebox__V1__Layout *m = fbp_layout_to_pb(&a, w->layout);
  size_t len = m ? protobuf_c_message_get_packed_size(&m->base) : 0;
  if (!m || !(r->pb = malloc(len ? len : 1))) {
    r->code = FB_ENOMEM;
    fb_errf(r->msg, sizeof r->msg, "out of memory packing the layout");
  } else {
    r->pblen = protobuf_c_message_pack(&m->base, r->pb);
  }
  fbp_arena_free(&a);
}

/* CKPT in the worker: the stream goes to the broker in data frames. */
static int worker_data_sink(void *user, const void *buf, size_t n) {
  worker *w = user;
  const uint8_t *p = buf;
  while (n) {
    size_t k = n < DATA_MAX ? n : (size_t)DATA_MAX;
    wire_rep h;
    memset(&h, 0, sizeof h);
    h.magic = DATA_MAGIC;
    h.pblen = k;
    if (fbd_frame_write(w->fd, &h, sizeof h, NULL) || fbd_frame_write(w->fd, p, k, NULL)) return 1;
    p += k;
    n -= k;
  }
  return 0;
}

/* RESTORE in the worker: the stream from the checkpoint's file descriptor,
 * which the broker passed with the request (its first `left` bytes; the
 * seal after them is the broker's to check). Read straight into the new
 * session's fields. */
typedef struct data_in {
  int fd;
  uint64_t left;
} data_in;

static long worker_data_source(void *user, void *buf, size_t n) {
  data_in *d = user;
  if (n > d->left) n = (size_t)d->left;
  if (!n) return 0;
  ssize_t got;
  do got = read(d->fd, buf, n);
  while (got < 0 && errno == EINTR);
  if (got < 0) return -1;
  d->left -= (uint64_t)got;
  return (long)got;
}

static void worker_restore(worker *w, const uint8_t *p, size_t n, int fd, uint64_t stream,
                           fbd_reply *r) {
  wire_create c;
  data_in d = {fd, stream};
  r->finish = r->fatal = 1;
  if (w->created || w->layout || n < sizeof c) {
    r->code = FB_EINVAL;
    fb_errf(r->msg, sizeof r->msg, "a RESTORE after the session was made");
  } else if (fd < 0 || lseek(fd, 0, SEEK_SET) != 0) {
    r->code = FB_EINVAL;
    fb_errf(r->msg, sizeof r->msg, "a RESTORE without its checkpoint's file");
  } else {
    memcpy(&c, p, sizeof c);
    fb_session_config ec;
    static char tag[16];
    settings_in(&c, &ec, tag);
    fbd_exec_init(&w->x, w->engine, NULL, &ec, tag, &w->log, w->watch);
    w->x.parse_timeout_s = w->cfg->compile_timeout_s;
    if (!fbd_exec_restore(&w->x, worker_data_source, &d, r)) {
      w->created = 1;
      r->fatal = 0;
      fbp_arena a;
      fbp_arena_init(&a);
      Fusebox__V1__Layout *m = fbp_layout_to_pb(&a, w->x.layout);
      size_t len = m ? protobuf_c_message_get_packed_size(&m->base) : 0;
      if (!m || !(r->pb = malloc(len ? len : 1))) {
        r->code = FB_ENOMEM;
        r->fatal = 1;
        fb_errf(r->msg, sizeof r->msg, "out of memory packing the layout");
      } else {
        r->pblen = protobuf_c_message_pack(&m->base, r->pb);
      }
      fbp_arena_free(&a);
    }
  }
}

static void worker_job(worker *w, const wire_req *q, uint8_t *payload, int fd, fbd_reply *r) {
  const ProtobufCMessageDescriptor *d =
      q->kind == FBD_J_REGISTER ? &fusebox__v1__register_kernels_request__descriptor
      : q->kind == FBD_J_BATCH  ? &fusebox__v1__session_request__descriptor
                                : NULL;
  if (q->kind == FBD_J_PARSE || q->kind == FBD_J_DESCRIBE) { /* before CREATE, if at all */
    worker_parse(w, q->kind, payload, q->len, r);
    return;
  }
  if (q->kind == FBD_J_RESTORE) {
    worker_restore(w, payload, q->len, fd, q->buflen, r);
    return;
  }
  if (q->kind == FBD_J_CKPT) {
    fbd_exec_checkpoint(&w->x, worker_data_sink, w, r);
    return;
  }
  if (q->kind == FBD_J_CREATE) {
    int rc = worker_create(w, payload, q->len, r);
    if (rc) {
      r->code = rc;
      r->finish = r->fatal = 1;
    }
    return;
  }
  fbp_arena a;
  fbp_arena_init(&a);
  void *m = NULL;
  /* a SessionRequest is decoded here only (the broker read its routing
     fields from the bytes); a RegisterKernelsRequest the broker decoded
     too, so a failure here is the worker's word against the broker's */
  uint64_t mm = q->kind == FBD_J_BATCH ? w->cfg->max_message_bytes : 0;
  if (d && !(m = fbd_exec_decode(d, &a, payload, q->len, mm, r))) {
    if (q->kind != FBD_J_BATCH) fb_errf(r->msg, sizeof r->msg, "malformed %s", d->name);
    if (w->x.es) fb_session_counters(w->x.es, &r->counters);
  } else if (q->kind == FBD_J_WRITE || q->kind == FBD_J_READ || q->kind == FBD_J_ACTIVE) {
    uint8_t *buf = fbd_fault_armed && fbd_fault_kind == FAULT_MEMFD && fd >= 0
                       ? NULL
                       : map_buf(fd, q->buflen, r->msg, sizeof r->msg);
    if (!buf && fbd_fault_armed && fbd_fault_kind == FAULT_MEMFD && fd >= 0) {
      fbd_fault_memfd(fd, q->buflen, r);
    } else if (!buf) {
      r->code = FB_EINVAL;
      r->finish = 1;
    } else {
      fbd_exec_run(&w->x, q->kind, NULL, q->field, buf, q->buflen, r);
    }
  } else {
    if (q->kind != FBD_J_REGISTER || !fbd_fault_check_register(m, r))
      fbd_exec_run(&w->x, q->kind, m, q->field, NULL, 0, r);
  }
  fbp_arena_free(&a);
}

/* The worker's code store: every request goes to the broker, which holds
 * the cache (cache_main). Any failure turns the store off: compile. */
static int worker_cache_req(worker *w, uint32_t op, const char *target, const char *ir,
                            size_t irlen, const uint8_t *code, size_t len) {
  wire_cache h = {CACHE_MAGIC, op, strlen(target), irlen, op == CACHE_PUT ? len : 0};
  return fbd_frame_write_full(w->cache_fd, &h, sizeof h) ||
         fbd_frame_write_full(w->cache_fd, target, h.target_len) ||
         fbd_frame_write_full(w->cache_fd, ir, irlen) ||
         (h.code_len && fbd_frame_write_full(w->cache_fd, code, len));
}

static void worker_cache_off(worker *w) {
  if (w->cache_fd >= 0) close(w->cache_fd);
  w->cache_fd = -1;
}

static int worker_store_get(void *user, uint64_t partition, const char *target, const char *ir,
                            size_t irlen, uint8_t **code, size_t *len) {
  worker *w = user;
  (void)partition; /* the broker uses the session's own */
  int found = 0;
  pthread_mutex_lock(&w->cache_mu);
  wire_cache a;
  if (w->cache_fd >= 0) {
    if (worker_cache_req(w, CACHE_GET, target, ir, irlen, NULL, 0) ||
        fbd_frame_read_full(w->cache_fd, &a, sizeof a) || a.magic != CACHE_MAGIC || a.op > 1 ||
        a.code_len > FBD_DCACHE_MAX_PAYLOAD) {
      worker_cache_off(w);
    } else if (a.op == 1) {
      uint8_t *b = malloc(a.code_len ? a.code_len : 1);
      if (b && !fbd_frame_read_full(w->cache_fd, b, a.code_len)) {
        *code = b;
        *len = a.code_len;
        found = 1;
      } else {
        free(b);
        worker_cache_off(w);
      }
    }
  }
  pthread_mutex_unlock(&w->cache_mu);
  return found;
}

static void worker_store_put(void *user, uint64_t partition, const char *target, const char *ir,
                             size_t irlen, const uint8_t *code, size_t len) {
  worker *w = user;
  (void)partition;
  pthread_mutex_lock(&w->cache_mu);
  if (w->cache_fd >= 0 && worker_cache_req(w, CACHE_PUT, target, ir, irlen, code, len))
    worker_cache_off(w);
  pthread_mutex_unlock(&w->cache_mu);
}

static void worker_loop(worker *w, double spin_s) {
  for (;;) {
    if (!fbd_frame_wait(w->fd, spin_s, -1)) continue;
    wire_req q;
    int fd = -1;
    if (fbd_frame_read(w->fd, &q, sizeof q, &fd, NULL) || q.magic != WIRE_MAGIC ||
        q.len > WIRE_MAX_PAYLOAD)
      break; /* the broker is gone (or mad): nothing to answer */
    uint8_t *payload = malloc(q.len ? q.len : 1);
    if (!payload || (q.len && fbd_frame_read(w->fd, payload, q.len, NULL, NULL))) break;
    fbd_reply r;
    memset(&r, 0, sizeof r);
    worker_job(w, &q, payload, fd, &r);
    free(payload);
    if (q.kind == FBD_J_CREATE && fd >= 0 && !r.code && w->cache_fd < 0) {
      /* the broker's compile cache: set before any compile of the session */
      fb_code_store st = {worker_store_get, worker_store_put, w};
      w->cache_fd = fd;
      fd = -1;
      if (fb_engine_set_code_store(w->engine, &st)) worker_cache_off(w);
    }
    if (fd >= 0) close(fd);
    int end = q.kind == FBD_J_CLOSE || q.kind == FBD_J_END || r.fatal;
    int bad = fbd_worker_reply(w->fd, &r);
    fbd_reply_clear(&r);
    if (bad || end) break;
  }
}

void fbd_worker_process_main(int fd, const fbd_config *cfg) {
  prctl(PR_SET_PDEATHSIG, SIGKILL); /* the broker's end is our end */
  pid_t parent = fbd_broker_pid(fd);
  if (!fbd_broker_alive(fd, parent)) _exit(1); /* it died before the line above */
  /* first, while one thread: unshare moves only the calling thread */
  const char *nsw = cfg->worker_namespaces ? cfg->worker_namespaces : "off";
  int ns_level = !strcmp(nsw, "on") ? WORKER_NS_ROOT : !strcmp(nsw, "net") ? WORKER_NS_NET : 0;
  int ns_step = 0, ns_err = ns_level ? fbd_ns_enter(ns_level, &ns_step) : 0;
  prctl(PR_SET_DUMPABLE, 0); /* no ptrace, no /proc/PID/mem for anyone else */
  signal(SIGPIPE, SIG_IGN);
  fbd_fault_init();
  worker w;
  memset(&w, 0, sizeof w);
  w.fd = fd;
  w.cache_fd = -1;
  pthread_mutex_init(&w.cache_mu, NULL);
  w.cfg = cfg;
  fbd_log_init(&w.log, stderr, cfg->log_level);
  fbd_reply hello;
  memset(&hello, 0, sizeof hello);
  w.watch = mmap(NULL, WATCH_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, 4, 0);
  close_range(5, ~0u, 0);
  close(4);
  fb_engine_config ecfg = {cfg->backend, cfg->compile_threads, cfg->cpu_threads};
  int off[FBD_NWALLS]; /* the walls the broker found refused: the worker goes on without them */
  char offerr[256] = "";
  int offrc = fbd_walls_parse(cfg->worker_walls_off, "--worker-walls-off", 0, 0, off, offerr,
                              sizeof offerr);
  if (offrc) {
    hello.code = offrc;
    fb_errf(hello.msg, sizeof hello.msg, "%s", offerr);
  } else if (w.watch == MAP_FAILED) {
    hello.code = FB_EINTERNAL;
    fb_errf(hello.msg, sizeof hello.msg, "cannot map the watch page: %s", strerror(errno));
  } else if (ns_err) {
    hello.code = FB_EINTERNAL;
    fb_errf(hello.msg, sizeof hello.msg, "cannot enter its namespaces: %s: %s",
            fbd_ns_steps[ns_step], strerror(ns_err));
  } else if (ns_level >= WORKER_NS_ROOT && parent != 0) {
    hello.code = FB_EINTERNAL;
    fb_errf(hello.msg, sizeof hello.msg, "not started in a PID namespace of its own");
  } else if ((hello.code = fb_engine_create(&ecfg, &w.engine, hello.msg, sizeof hello.msg))) {
  } else if (ns_level >= WORKER_NS_ROOT && (ns_err = fbd_empty_root(&ns_step))) {
    hello.code = FB_EINTERNAL;
    fb_errf(hello.msg, sizeof hello.msg, "cannot make its root an empty directory: %s: %s",
            fbd_ns_steps[ns_step], strerror(ns_err));
  } else if ((hello.code =
                  fbd_drop_user(cfg, fd, parent, off[FBD_WALL_UID], hello.msg, sizeof hello.msg))) {
  } else if (!off[FBD_WALL_RLIMITS] && (fbd_limit_memory(cfg, fb_engine_backend(w.engine)) ||
                                        fbd_limit_files(fb_engine_backend(w.engine)))) {
    hello.code = FB_EINTERNAL;
    fb_errf(hello.msg, sizeof hello.msg, "cannot set the worker's resource limits: %s",
            strerror(errno));
  } else {
    fb_engine_set_code_cache_bytes(w.engine, fbd_code_cache_bytes(cfg, 0)); /* the broker's */
    if (!off[FBD_WALL_NNP] && prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)) {
      hello.code = FB_EINTERNAL;
      fb_errf(hello.msg, sizeof hello.msg, "cannot set no_new_privs: %s", strerror(errno));
    } else if (!off[FBD_WALL_SECCOMP]) {
      hello.code = fbd_lock_down(fb_engine_backend(w.engine), !off[FBD_WALL_NNP], hello.msg,
                                 sizeof hello.msg);
    }
  }
  if (fbd_worker_reply(fd, &hello) || hello.code) _exit(1);
  worker_loop(&w, cfg->worker_spin_us * 1e-6);
  /* _exit: no destructors or leak checks, which would want files */
  _exit(0);
}
