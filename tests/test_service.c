/* fuseboxd end to end through libfusebox: the built server
 * ($FB_BUILD_DIR/server/fuseboxd) is started for each test on a loopback
 * port or a unix socket, and every test ends by stopping it with SIGTERM and
 * requiring exit status 0 (under ASan: no leaks). Covered: health, info and
 * stats; several sessions at once with their own fields, and a session
 * unable to name another's fields or kernels; malformed protobuf sent raw
 * to every method (INVALID_ARGUMENT, server keeps serving); IR refused by
 * the verifier (INVALID_ARGUMENT with the verifier's text); launch results
 * with their sequence numbers; a 256 MiB field written and read back;
 * memory and session quotas; a client that dies mid-stream (its session
 * freed, counted in stats); idle sessions reaped; the config file; SIGTERM
 * under load. */
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/support/time.h>

#include "fusebox/client.h"
#include "proto/convert.h"
#include "tests/support/support.h"

static fb_daemon D;
static fb_client *C;
static char sock_path[128];

/* ---------------------------------------------------------------- helpers */

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static const char *fuseboxd_path(void) {
  static char path[1024];
  const char *b = getenv("FB_BUILD_DIR");
  snprintf(path, sizeof path, "%s/server/fuseboxd", b ? b : "build");
  return path;
}

/* Start fuseboxd on listen with extra flags and connect C to it. */
static void start(const char *listen, const char *const *flags) {
  const char *args[32];
  int n = 0;
  args[n++] = "--log-level";
  args[n++] = "warn";
  for (int i = 0; flags && flags[i]; i++) args[n++] = flags[i];
  args[n] = NULL;
  char err[512] = "";
  int rc = fb_daemon_start(fuseboxd_path(), listen, args, &D, err, sizeof err);
  ck_assert_msg(rc == 0, "fuseboxd: %s", err);
  ck_assert_int_eq(fb_client_connect(D.address, NULL, &C, err, sizeof err), 0);
}

/* Stop the server; it must shut down cleanly (exit 0: no leaks under ASan). */
static void stop(void) {
  if (C) fb_client_close(C);
  C = NULL;
  if (D.pid <= 0) return;
  int st = -1;
  fb_daemon_stop(&D, 30, &st);
  ck_assert_msg(st == 0, "fuseboxd exited with status %d", st);
}

/* The tcp cases run sessions in worker processes (fuseboxd's default), the
 * unix ones in threads (the CLI's private daemon), so every path of a
 * session is tested under both isolation modes. */
static void setup_tcp(void) {
  static const char *const f[] = {
      "--session-memory-limit", "300M", "--max-sessions", "8", "--isolation", "process", NULL};
  start("127.0.0.1:0", f);
}

static void setup_unix(void) {
  snprintf(sock_path, sizeof sock_path, "unix:/tmp/fusebox-test-%d.sock", (int)getpid());
  static const char *const f[] = {"--max-sessions", "8", NULL};
  start(sock_path, f);
}

static void setup_idle(void) {
  static const char *const f[] = {"--idle-timeout-s", "1", NULL};
  start("127.0.0.1:0", f);
}

static void teardown(void) { stop(); }

static const char *PROG = "layout {\n"
                          "  dense(i: 1024) { place x: f32 }\n"
                          "  dense(i: 16) { place n: i32 }\n"
                          "  place total: f32\n"
                          "}\n"
                          "kernel fill(v: f32) {\n"
                          "  for i in x { x[i] = v + f32(i) }\n"
                          "}\n"
                          "kernel count(k: i32) {\n"
                          "  for i in n { n[i] = n[i] + k }\n"
                          "}\n"
                          "kernel poke(i: i32) {\n"
                          "  x[i] = 1.0\n"
                          "}\n"
                          "kernel sum() -> f32 {\n"
                          "  total[] = 0.0\n"
                          "  for i in x { total[] += x[i] }\n"
                          "  return total[]\n"
                          "}\n";

static fb_remote *open_prog(fb_client *c, const char *src) {
  fb_remote *r = NULL;
  int rc = fb_remote_open_source(c, NULL, "test.fbk", src, &r);
  ck_assert_msg(rc == 0, "open: %s", fb_client_errmsg(c));
  return r;
}

static int kernel(fb_remote *r, const char *name) {
  int k = fb_remote_kernel(r, name, NULL, 0);
  ck_assert_msg(k >= 0, "kernel %s: %s", name, fb_remote_errmsg(r));
  return k;
}

static int field(fb_remote *r, const char *name) {
  int f = fb_remote_find_field(r, name, 0);
  ck_assert_int_gt(f, 0);
  return f;
}

static void stats(fb_server_stats *s) {
  ck_assert_int_eq(fb_client_stats(C, s), 0);
  fb_server_stats_free(s);
}

/* A 1-D dense f32 layout of n elements named "big" (field id 2). No
 * ck_assert: the child-client mode uses it outside any test. */
static fb_layout *dense_layout(int64_t n) {
  fb_layout *l = fb_layout_new();
  int d = fb_layout_add(l, 0, FB_SN_DENSE, "i", &n, 0, NULL);
  if (fb_layout_place(l, d, "big", FB_T_F32) != 2 || fb_layout_finalize(l, NULL, 0)) {
    fb_layout_free(l);
    return NULL;
  }
  return l;
}

/* The bytes of a protobuf message, malloc'd. */
static uint8_t *packed(const ProtobufCMessage *m, size_t *n) {
  *n = protobuf_c_message_get_packed_size(m);
  uint8_t *p = malloc(*n + 1);
  protobuf_c_message_pack(m, p);
  return p;
}

/* A session made with a raw CreateSession: no stream attached. */
static char *raw_session(fb_client *c, const fb_layout *l) {
  fbp_arena a;
  fbp_arena_init(&a);
  Fusebox__V1__CreateSessionRequest req = FUSEBOX__V1__CREATE_SESSION_REQUEST__INIT;
  req.layout = fbp_layout_to_pb(&a, l);
  size_t n, rn = 0;
  uint8_t *p = packed(&req.base, &n);
  void *resp = NULL;
  int st = -1;
  ck_assert_int_eq(
      fb_client_raw_call(c, "/fusebox.v1.Fusebox/CreateSession", p, n, &resp, &rn, &st), 0);
  ck_assert_int_eq(st, 0);
  Fusebox__V1__CreateSessionResponse *m =
      fusebox__v1__create_session_response__unpack(NULL, rn, resp);
  ck_assert_ptr_nonnull(m);
  char *id = strdup(m->session_id);
  fusebox__v1__create_session_response__free_unpacked(m, NULL);
  free(resp);
  free(p);
  fbp_arena_free(&a);
  return id;
}

static void wait_stats(unsigned active, uint64_t mem, double timeout, fb_server_stats *s);

/* ---------------------------------------------------------------- basics */

START_TEST(health_info_stats) {
  int st = 0;
  double rtt = 0;
  ck_assert_int_eq(fb_client_ping(C, &st, &rtt), 0);
  ck_assert_int_eq(st, 1);
  ck_assert(rtt > 0 && rtt < 5);
  fb_server_info info;
  ck_assert_int_eq(fb_client_info(C, &info), 0);
  ck_assert_str_eq(info.backend, "cpu");
  ck_assert_uint_eq(info.max_sessions, 8);
  ck_assert(strstr(info.listen, D.address) != NULL);
  fb_server_stats s;
  stats(&s);
  ck_assert_uint_eq(s.sessions_active, 0);
  /* the standard health protocol: an unknown service is NOT_FOUND */
  Grpc__Health__V1__HealthCheckRequest hr = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
  hr.service = (char *)"no.such.Service";
  size_t n;
  uint8_t *p = packed(&hr.base, &n);
  int gs = -1;
  ck_assert_int_eq(fb_client_raw_call(C, "/grpc.health.v1.Health/Check", p, n, NULL, NULL, &gs),
                   FB_ENOENT);
  ck_assert_int_eq(gs, 5);
  hr.service = (char *)"fusebox.v1.Fusebox";
  free(p);
  p = packed(&hr.base, &n);
  void *resp = NULL;
  size_t rn = 0;
  ck_assert_int_eq(fb_client_raw_call(C, "/grpc.health.v1.Health/Check", p, n, &resp, &rn, &gs), 0);
  Grpc__Health__V1__HealthCheckResponse *hm =
      grpc__health__v1__health_check_response__unpack(NULL, rn, resp);
  ck_assert_ptr_nonnull(hm);
  ck_assert_int_eq(hm->status, GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING);
  grpc__health__v1__health_check_response__free_unpacked(hm, NULL);
  free(resp);
  free(p);
  ck_assert_int_eq(
      fb_client_raw_call(C, "/fusebox.v1.Fusebox/NoSuchMethod", "", 0, NULL, NULL, &gs),
      FB_EUNSUPPORTED);
  ck_assert_int_eq(gs, 12);
}
END_TEST

/* Launches with return values and failures, each reported with its seq. */
START_TEST(launch_results) {
  fb_remote *r = open_prog(C, PROG);
  int kf = kernel(r, "fill"), ks = kernel(r, "sum"), kc = kernel(r, "count");
  fb_value v = fb_value_f32(0.5f), bad = fb_value_i32(1), k3 = fb_value_i32(3);
  ck_assert_int_eq(fb_remote_launch(r, kf, &v, 1), 1);
  ck_assert_int_eq(fb_remote_launch(r, ks, NULL, 0), 2);
  ck_assert_int_eq(fb_remote_launch(r, kf, &bad, 1), 3); /* f32 parameter, i32 value */
  ck_assert_int_eq(fb_remote_launch(r, kc, &k3, 1), 4);
  ck_assert_int_eq(fb_remote_launch(r, ks, NULL, 0), 5);
  ck_assert_int_eq(fb_remote_launch(r, 17, NULL, 0), FB_ENOENT);  /* refused at once */
  ck_assert_int_eq(fb_remote_launch(r, ks, &v, 1), FB_ETYPE);
  fb_sync_result res;
  ck_assert_int_eq(fb_remote_sync(r, &res), FB_ETYPE);
  ck_assert(strstr(fb_remote_errmsg(r), "launch #3") != NULL);
  ck_assert_uint_eq(res.seq, 5);
  ck_assert_int_eq(res.nerrors, 1);
  ck_assert_uint_eq(res.errors[0].seq, 3);
  ck_assert_int_eq(res.errors[0].kernel, kf);
  ck_assert(strstr(res.errors[0].msg, "i32") != NULL);
  ck_assert_int_eq(res.nreturns, 2);
  double want = 0;
  for (int i = 0; i < 1024; i++) want += 0.5 + i;
  for (int i = 0; i < 2; i++) {
    ck_assert_uint_eq(res.returns[i].seq, i ? 5 : 2);
    ck_assert_int_eq(res.returns[i].value.type, FB_T_F32);
    ck_assert_double_eq_tol(res.returns[i].value.v.f, want, 1e-3);
  }
  ck_assert_uint_eq(res.counters.launches, 4); /* the engine counts launches that ran */
  /* the next sync starts afresh */
  ck_assert_int_eq(fb_remote_sync(r, &res), 0);
  ck_assert_int_eq(res.nerrors + res.nreturns, 0);
  int32_t n[16];
  ck_assert_int_eq(fb_remote_field_read(r, field(r, "n"), n, sizeof n), 0);
  for (int i = 0; i < 16; i++) ck_assert_int_eq(n[i], 3);
  fb_value ret;
  ck_assert_int_eq(fb_remote_call(r, ks, NULL, 0, &ret), 0);
  ck_assert_double_eq_tol(ret.v.f, want, 1e-3);
  ck_assert_int_eq(fb_remote_close(r), 0);
  fb_server_stats s;
  stats(&s);
  ck_assert_uint_eq(s.sessions_active, 0);
  ck_assert_uint_eq(s.sessions_closed, 1);
  ck_assert_uint_eq(s.memory_bytes, 0);
  ck_assert_uint_ge(s.launches, 6);
}
END_TEST

/* A launch that fails while running (out of bounds) is reported with its
 * own sequence number in both modes: at once in sync mode, from the
 * background in async mode. */
static void bounds_error_in_mode(const char *mode) {
  fb_remote_options o;
  fb_remote_options_init(&o);
  o.mode = mode;
  fb_remote *r = NULL;
  ck_assert_msg(fb_remote_open_source(C, &o, "t.fbk", PROG, &r) == 0, "%s", fb_client_errmsg(C));
  int kf = kernel(r, "fill"), kp = kernel(r, "poke");
  fb_value v = fb_value_f32(1.0f), far = fb_value_i32(5000), near = fb_value_i32(3);
  for (int i = 0; i < 5; i++) ck_assert_int_gt(fb_remote_launch(r, kf, &v, 1), 0);
  ck_assert_int_eq(fb_remote_launch(r, kp, &far, 1), 6);
  ck_assert_int_eq(fb_remote_launch(r, kp, &near, 1), 7);
  fb_sync_result res;
  ck_assert_int_eq(fb_remote_sync(r, &res), FB_EBOUNDS);
  ck_assert_uint_eq(res.seq, 7);
  ck_assert_msg(res.nerrors == 1, "%s: %d errors", mode, res.nerrors);
  ck_assert_uint_eq(res.errors[0].seq, 6);
  ck_assert_int_eq(res.errors[0].kernel, kp);
  ck_assert(strstr(res.errors[0].msg, "poke") != NULL);
  float x[1024];
  ck_assert_int_eq(fb_remote_field_read(r, field(r, "x"), x, sizeof x), 0);
  ck_assert(x[3] == 1.0f && x[4] == 5.0f); /* the launch after the bad one ran */
  ck_assert_int_eq(fb_remote_close(r), 0);
}

START_TEST(errors_in_both_modes) {
  bounds_error_in_mode("sync");
  bounds_error_in_mode("async");
}
END_TEST

/* ---------------------------------------------------------------- isolation */

typedef struct worker_arg {
  const char *addr;
  float base;
  int ok;
} worker_arg;

/* A session on its own connection: write, launch, read back its values. */
static void *session_worker(void *p) {
  worker_arg *a = p;
  char err[256];
  fb_client *c = NULL;
  fb_remote *r = NULL;
  if (fb_client_connect(a->addr, NULL, &c, err, sizeof err)) return NULL;
  if (!fb_remote_open_source(c, NULL, "w.fbk", PROG, &r)) {
    int kf = fb_remote_kernel(r, "fill", NULL, 0), x = fb_remote_find_field(r, "x", 0);
    int ok = kf >= 0;
    for (int round = 0; ok && round < 20; round++) {
      fb_value v = fb_value_f32(a->base + (float)round);
      float buf[1024];
      ok = fb_remote_launch(r, kf, &v, 1) > 0 && !fb_remote_field_read(r, x, buf, sizeof buf);
      for (int i = 0; ok && i < 1024; i++) ok = buf[i] == a->base + (float)round + (float)i;
    }
    a->ok = ok && fb_remote_close(r) == 0;
  }
  fb_client_close(c);
  return NULL;
}

/* Cancel (fb_remote_cancel) on launches the server has received: each one
 * skipped is reported as FB_ECANCELLED under its own number, the session
 * goes on and later launches run. */
START_TEST(cancel_launches) {
  static const char *const busy_prog =
      "layout { dense(i: 256) { place v: i32 } }\n"
      "kernel busy() {\n"
      "  for i in 0 .. 1 { for j in 0 .. 1073741824 { v[j & 255] = j } }\n"
      "}\n"
      "kernel poke(k: i32) { v[k] = 7 }\n";
  fb_remote *r = open_prog(C, busy_prog);
  int kb = kernel(r, "busy"), kp = kernel(r, "poke");
  for (int i = 0; i < 100; i++) ck_assert_int_gt(fb_remote_launch(r, kb, NULL, 0), 0);
  ck_assert_int_eq(fb_remote_flush(r), 0);
  ck_assert_int_eq(fb_remote_cancel(r), 0);
  fb_sync_result res;
  ck_assert_int_eq(fb_remote_sync(r, &res), FB_ECANCELLED);
  ck_assert_uint_eq(res.seq, 100);
  ck_assert_int_gt(res.nerrors, 0);
  for (int i = 0; i < res.nerrors; i++) {
    ck_assert_int_eq(res.errors[i].code, FB_ECANCELLED);
    ck_assert_int_eq(res.errors[i].kernel, kb);
    ck_assert(res.errors[i].seq >= 1 && res.errors[i].seq <= 100);
    ck_assert(strstr(res.errors[i].msg, "cancelled") != NULL);
  }
  fb_value k = fb_value_i32(5);
  ck_assert_int_eq(fb_remote_launch(r, kp, &k, 1), 101);
  ck_assert_int_eq(fb_remote_sync(r, &res), 0);
  int32_t v[256];
  ck_assert_int_eq(fb_remote_field_read(r, field(r, "v"), v, sizeof v), 0);
  ck_assert_int_eq(v[5], 7);
  ck_assert_int_eq(fb_remote_close(r), 0);
}
END_TEST

START_TEST(sessions_at_once) {
  enum {
    N = 4
  };
  pthread_t th[N];
  worker_arg args[N];
  for (int i = 0; i < N; i++) {
    args[i] = (worker_arg){D.address, 1000.0f * (float)(i + 1), 0};
    ck_assert_int_eq(pthread_create(&th[i], NULL, session_worker, &args[i]), 0);
  }
  for (int i = 0; i < N; i++) pthread_join(th[i], NULL);
  for (int i = 0; i < N; i++) ck_assert_msg(args[i].ok, "session %d saw wrong data", i);
  fb_server_stats s;
  stats(&s);
  ck_assert_uint_eq(s.sessions_created, N);
  ck_assert_uint_eq(s.sessions_active, 0);
}
END_TEST

/* Sessions cannot name each other's fields or kernels: ids are per session,
 * and session ids cannot be guessed. */
START_TEST(isolation) {
  fb_remote *a = open_prog(C, PROG);
  int ka0 = kernel(a, "fill"), ka1 = kernel(a, "count");
  ck_assert_int_eq(ka1, 1);
  fb_layout *small = dense_layout(4);
  char *bid = raw_session(C, small); /* B: one field (id 2), no kernels */
  ck_assert_str_ne(bid, fb_remote_id(a));
  ck_assert_uint_eq(strlen(bid), 32);
  /* B's stream launches "kernel 1": B has no such kernel */
  fbp_buf b;
  memset(&b, 0, sizeof b);
  fbp_launch_append(&b, ka1, NULL, 0);
  fbp_launch_append(&b, ka0, NULL, 0);
  fbp_session_tail(&b, bid, 0, 7);
  void *resp = NULL;
  size_t rn = 0;
  int gs = -1;
  ck_assert_int_eq(fb_client_raw_call(C, "/fusebox.v1.Fusebox/Session", b.p, b.n, &resp, &rn, &gs),
                   0);
  Fusebox__V1__SessionResponse *m = fusebox__v1__session_response__unpack(NULL, rn, resp);
  ck_assert_ptr_nonnull(m);
  ck_assert_ptr_nonnull(m->sync);
  ck_assert_uint_eq(m->sync->sync_id, 7);
  ck_assert_uint_eq(m->sync->n_errors, 2);
  for (int i = 0; i < 2; i++) {
    ck_assert_int_eq(m->sync->errors[i]->code, FB_ENOENT);
    ck_assert(strstr(m->sync->errors[i]->message, "no kernel with id") != NULL);
  }
  fusebox__v1__session_response__free_unpacked(m, NULL);
  free(resp);
  fbp_buf_free(&b);
  /* A's field 3 (n) does not exist in B; A's field 2 read through B is B's */
  int an = field(a, "n");
  ck_assert_int_eq(an, 4);
  Fusebox__V1__ReadFieldRequest rq = FUSEBOX__V1__READ_FIELD_REQUEST__INIT;
  rq.session_id = bid;
  rq.field = an;
  size_t n;
  uint8_t *p = packed(&rq.base, &n);
  ck_assert_int_eq(fb_client_raw_call(C, "/fusebox.v1.Fusebox/ReadField", p, n, NULL, NULL, &gs),
                   FB_ENOENT);
  ck_assert_int_eq(gs, 5);
  free(p);
  rq.session_id = (char *)"00000000000000000000000000000000";
  rq.field = 2;
  p = packed(&rq.base, &n);
  ck_assert_int_eq(fb_client_raw_call(C, "/fusebox.v1.Fusebox/ReadField", p, n, NULL, NULL, &gs),
                   FB_ENOENT);
  free(p);
  /* the stream is A's: a second stream cannot take session A */
  fbp_buf t;
  memset(&t, 0, sizeof t);
  fbp_session_tail(&t, fb_remote_id(a), 0, 1);
  ck_assert_int_eq(fb_client_raw_call(C, "/fusebox.v1.Fusebox/Session", t.p, t.n, NULL, NULL, &gs),
                   FB_EINVAL);
  ck_assert(strstr(fb_client_errmsg(C), "already has") != NULL);
  fbp_buf_free(&t);
  /* A still works */
  fb_value v = fb_value_f32(2.0f);
  float x[1024];
  ck_assert_int_gt(fb_remote_launch(a, ka0, &v, 1), 0);
  ck_assert_int_eq(fb_remote_field_read(a, field(a, "x"), x, sizeof x), 0);
  ck_assert(x[5] == 7.0f);
  ck_assert_int_eq(fb_remote_close(a), 0);
  /* B's only stream was the raw one, which ended it */
  fb_server_stats s;
  wait_stats(0, 0, 5, &s);
  free(bid);
  fb_layout_free(small);
}
END_TEST

/* ---------------------------------------------------------------- bad input */

static const char *const METHODS[] = {
    "/grpc.health.v1.Health/Check",     "/fusebox.v1.Fusebox/CreateSession",
    "/fusebox.v1.Fusebox/CloseSession", "/fusebox.v1.Fusebox/RegisterKernels",
    "/fusebox.v1.Fusebox/Session",      "/fusebox.v1.Fusebox/WriteField",
    "/fusebox.v1.Fusebox/ReadField",    "/fusebox.v1.Fusebox/GetInfo",
    "/fusebox.v1.Fusebox/GetStats",
};

START_TEST(malformed_to_every_method) {
  static const struct {
    const char *b;
    size_t n;
  } junk[] = {
      {"\x0a\x7f", 2},                                   /* length past the end */
      {"\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff", 11}, /* endless varint */
      {"\x0b\x01", 2},                                   /* a group start */
  };
  int refused = 0;
  for (size_t m = 0; m < sizeof METHODS / sizeof METHODS[0]; m++)
    for (size_t j = 0; j < sizeof junk / sizeof junk[0]; j++) {
      int gs = -1;
      int rc = fb_client_raw_call(C, METHODS[m], junk[j].b, junk[j].n, NULL, NULL, &gs);
      ck_assert_msg(gs == 3 && rc == FB_EINVAL, "%s, junk %zu: status %d (%s)", METHODS[m], j, gs,
                    fb_client_errmsg(C));
      ck_assert_msg(strstr(fb_client_errmsg(C), "malformed") != NULL, "%s: '%s'", METHODS[m],
                    fb_client_errmsg(C));
      refused++;
    }
  /* still serving, and a real session works */
  ck_assert_int_eq(fb_client_ping(C, NULL, NULL), 0);
  fb_remote *r = open_prog(C, PROG);
  fb_value ret;
  ck_assert_int_eq(fb_remote_call(r, kernel(r, "sum"), NULL, 0, &ret), 0);
  ck_assert_int_eq(fb_remote_close(r), 0);
  fb_server_stats s;
  stats(&s);
  ck_assert_uint_ge(s.bad_requests, (uint64_t)refused);
  ck_assert_uint_eq(s.sessions_active, 0);
}
END_TEST

/* x[i] = 1 + 2.5: i32 + f32 without a cast. */
static fb_kernel *ill_typed(const fb_layout *l, int x) {
  fb_kernel *k = fb_kernel_new(l, "bad_add", 0, NULL, FB_T_VOID);
  fb_builder b;
  fb_builder_init(&b, k);
  int one = fb_b_const_i32(&b, 1), f = fb_b_const_f32(&b, 2.5f);
  int zero = fb_b_const_i32(&b, 0);
  fb_stmt s;
  memset(&s, 0, sizeof s);
  s.op = FB_OP_ADD;
  s.type = FB_T_F32;
  s.nargs = 2;
  s.args[0] = one;
  s.args[1] = f;
  s.snode = -1;
  s.body = s.orelse = -1;
  int sum = fb_b_emit(&b, &s);
  fb_b_store(&b, x, &zero, 1, sum);
  return k;
}

START_TEST(verifier_errors) {
  fb_layout *l = dense_layout(8);
  fb_remote *r = NULL;
  ck_assert_int_eq(fb_remote_open(C, NULL, l, &r), 0);
  fb_kernel *k = ill_typed(l, 2);
  fb_diags d;
  fb_diags_init(&d);
  ck_assert_int_eq(fb_verify(k, &d), FB_EVERIFY);
  ck_assert_int_gt(d.n, 0);
  ck_assert_int_eq(fb_remote_add_kernel(r, k), FB_EVERIFY);
  const char *msg = fb_remote_errmsg(r);
  ck_assert_msg(strstr(msg, "failed verification") != NULL, "%s", msg);
  for (int i = 0; i < d.n; i++)
    ck_assert_msg(strstr(msg, d.v[i].msg) != NULL, "'%s' lacks the verifier's '%s'", msg,
                  d.v[i].msg);
  fb_diags_free(&d);
  /* as gRPC sees it: INVALID_ARGUMENT */
  fbp_arena a;
  fbp_arena_init(&a);
  Fusebox__V1__RegisterKernelsRequest req = FUSEBOX__V1__REGISTER_KERNELS_REQUEST__INIT;
  Fusebox__V1__Kernel *km = fbp_kernel_to_pb(&a, k);
  req.session_id = (char *)fb_remote_id(r);
  req.n_kernels = 1;
  req.kernels = &km;
  size_t n;
  uint8_t *p = packed(&req.base, &n);
  int gs = -1;
  ck_assert_int_eq(
      fb_client_raw_call(C, "/fusebox.v1.Fusebox/RegisterKernels", p, n, NULL, NULL, &gs),
      FB_EVERIFY);
  ck_assert_int_eq(gs, 3);
  free(p);
  /* structurally broken IR: refused before the verifier, naming the problem */
  km->stmts[0]->op = (char *)"no_such_op";
  p = packed(&req.base, &n);
  ck_assert_int_eq(
      fb_client_raw_call(C, "/fusebox.v1.Fusebox/RegisterKernels", p, n, NULL, NULL, &gs),
      FB_EINVAL);
  ck_assert_int_eq(gs, 3);
  ck_assert(strstr(fb_client_errmsg(C), "unknown op 'no_such_op'") != NULL);
  free(p);
  fbp_arena_free(&a);
  fb_kernel_free(k);
  /* the session goes on: a good kernel registers and runs */
  fb_kernel *good = fb_kernel_new(l, "good", 0, NULL, FB_T_VOID);
  fb_builder b;
  fb_builder_init(&b, good);
  int zero = fb_b_const_i32(&b, 0);
  fb_b_store(&b, 2, &zero, 1, fb_b_const_f32(&b, 4.0f));
  int id = fb_remote_add_kernel(r, good);
  ck_assert_int_eq(id, 0);
  ck_assert_int_eq(fb_remote_call(r, id, NULL, 0, NULL), 0);
  float v[8];
  ck_assert_int_eq(fb_remote_field_read(r, 2, v, sizeof v), 0);
  ck_assert(v[0] == 4.0f && v[1] == 0.0f);
  fb_kernel_free(good);
  ck_assert_int_eq(fb_remote_close(r), 0);
  fb_layout_free(l);
  /* a program that does not parse never reaches the server */
  fb_remote *bad = NULL;
  ck_assert_int_eq(fb_remote_open_source(C, NULL, "bad.fbk", "kernel k() { x = }\n", &bad),
                   FB_EPARSE);
  ck_assert(strstr(fb_client_errmsg(C), "bad.fbk:1:") != NULL);
}
END_TEST

/* The front end's warnings of the program a remote session was opened
 * with (fb_remote_warnings): the interleaved block with its fix; none for
 * fields in blocks of their own, nor for a session opened with a layout. */
START_TEST(remote_warnings) {
  fb_remote *r = NULL;
  ck_assert_msg(fb_remote_open_source(C, NULL, "w.fbk",
                                      "layout { dense(ij: 8, 8) { place x: f32, y: f32 } }\n",
                                      &r) == 0,
                "%s", fb_client_errmsg(C));
  char *w = fb_remote_warnings(r);
  ck_assert_msg(w && strstr(w, "w.fbk:1:10: warning: 2 fields ('x', 'y') are interleaved") &&
                    strstr(w, "'field x: f32 (ij: 8, 8)'"),
                "%s", w ? w : "(null)");
  free(w);
  ck_assert_int_eq(fb_remote_close(r), 0);
  ck_assert_int_eq(fb_remote_open_source(C, NULL, "f.fbk",
                                         "layout { field x: f32 (ij: 8, 8)\n field y: f32 (ij: 8, 8) }\n", &r),
                   0);
  w = fb_remote_warnings(r);
  ck_assert_msg(w && !w[0], "%s", w ? w : "(null)");
  free(w);
  ck_assert_int_eq(fb_remote_close(r), 0);
}
END_TEST

/* ---------------------------------------------------------------- big fields and quotas */

START_TEST(field_256mib) {
  const int64_t n = (int64_t)64 << 20; /* 64 Mi f32 = 256 MiB */
  fb_layout *l = dense_layout(n);
  fb_remote *r = NULL;
  ck_assert_int_eq(fb_remote_open(C, NULL, l, &r), 0);
  size_t bytes = 0;
  ck_assert_int_eq(fb_remote_field_bytes(r, 2, &bytes), 0);
  ck_assert_uint_eq(bytes, (size_t)256 << 20);
  uint32_t *src = malloc(bytes), *dst = malloc(bytes);
  ck_assert(src && dst);
  uint64_t h = 0x9e3779b97f4a7c15ull;
  for (int64_t i = 0; i < n; i++) {
    h ^= h << 13, h ^= h >> 7, h ^= h << 17;
    src[i] = (uint32_t)h & 0x7f7fffffu; /* finite floats: any bit pattern would do */
  }
  memset(dst, 0xa5, bytes);
  ck_assert_msg(fb_remote_field_write(r, 2, src, bytes) == 0, "%s", fb_remote_errmsg(r));
  ck_assert_msg(fb_remote_field_read(r, 2, dst, bytes) == 0, "%s", fb_remote_errmsg(r));
  ck_assert_msg(memcmp(src, dst, bytes) == 0, "the field came back different");
  fb_server_stats s;
  stats(&s);
  ck_assert_uint_ge(s.memory_bytes, bytes);
  ck_assert_uint_ge(s.bytes_in, bytes);
  ck_assert_uint_ge(s.bytes_out, bytes);
  ck_assert_msg(fb_remote_close(r) == 0, "close: %s", fb_client_errmsg(C));
  stats(&s);
  ck_assert_uint_eq(s.memory_bytes, 0);
  free(src);
  free(dst);
  fb_layout_free(l);
}
END_TEST

START_TEST(quotas) {
  /* 512 MiB of fields over the 300M per-session limit */
  fb_layout *l = dense_layout((int64_t)128 << 20);
  fb_remote *r = NULL;
  ck_assert_int_eq(fb_remote_open(C, NULL, l, &r), FB_EQUOTA);
  const char *msg = fb_client_errmsg(C);
  ck_assert_msg(strstr(msg, "536870912") != NULL && strstr(msg, "'big'") != NULL, "%s", msg);
  fb_layout_free(l);
  /* asking for more than the server allows is refused too */
  fb_remote_options o;
  fb_remote_options_init(&o);
  o.memory_limit = (uint64_t)1 << 40;
  l = dense_layout(16);
  ck_assert_int_eq(fb_remote_open(C, &o, l, &r), FB_EQUOTA);
  /* unknown modes and passes are refused with their names */
  fb_remote_options_init(&o);
  o.mode = "eager";
  ck_assert_int_eq(fb_remote_open(C, &o, l, &r), FB_EINVAL);
  ck_assert(strstr(fb_client_errmsg(C), "eager") != NULL);
  /* 8 sessions at most */
  fb_remote *rs[9];
  for (int i = 0; i < 8; i++) ck_assert_int_eq(fb_remote_open(C, NULL, l, &rs[i]), 0);
  ck_assert_int_eq(fb_remote_open(C, NULL, l, &rs[8]), FB_EQUOTA);
  ck_assert(strstr(fb_client_errmsg(C), "session limit") != NULL);
  for (int i = 0; i < 8; i++)
    ck_assert_msg(fb_remote_close(rs[i]) == 0, "close %d: %s", i, fb_client_errmsg(C));
  ck_assert_int_eq(fb_remote_open(C, NULL, l, &rs[0]), 0);
  ck_assert_int_eq(fb_remote_close(rs[0]), 0);
  fb_server_stats s;
  stats(&s);
  ck_assert_uint_ge(s.sessions_failed, 2);
  fb_layout_free(l);
}
END_TEST

/* ---------------------------------------------------------------- clients that vanish */

/* Child mode (this program run again): open a session holding 64 MiB, use
 * it, report on fd, then wait for the parent and _exit mid-stream: launches
 * queued, nothing closed. */
static int child_client(const char *addr, int fd) {
  char err[256];
  fb_client *c = NULL;
  fb_remote *r = NULL;
  if (fb_client_connect(addr, NULL, &c, err, sizeof err)) _exit(3);
  fb_layout *l = dense_layout((int64_t)16 << 20);
  if (!l || fb_remote_open(c, NULL, l, &r)) _exit(4);
  fb_kernel *k = fb_kernel_new(l, "poke", 0, NULL, FB_T_VOID);
  fb_builder b;
  fb_builder_init(&b, k);
  int zero = fb_b_const_i32(&b, 0);
  fb_b_store(&b, 2, &zero, 1, fb_b_const_f32(&b, 1.0f));
  int id = fb_remote_add_kernel(r, k);
  for (int i = 0; id >= 0 && i < 10; i++) fb_remote_launch(r, id, NULL, 0);
  if (id < 0 || fb_remote_sync(r, NULL)) _exit(5);
  for (int i = 0; i < 10; i++) fb_remote_launch(r, id, NULL, 0); /* queued, never sent */
  if (write(fd, "ready\n", 6) != 6) _exit(6);
  char ch;
  if (read(fd, &ch, 1) < 0) _exit(7); /* the parent closes its end: go */
  _exit(0);
}

static pid_t spawn_child(int *fd) {
  int sv[2];
  ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
  char self[1024], fdbuf[16];
  ssize_t k = readlink("/proc/self/exe", self, sizeof self - 1);
  ck_assert_int_gt(k, 0);
  self[k] = 0;
  snprintf(fdbuf, sizeof fdbuf, "%d", sv[1]);
  pid_t pid = fork();
  ck_assert_int_ge(pid, 0);
  if (pid == 0) {
    close(sv[0]);
    execl(self, self, "--child-client", D.address, fdbuf, (char *)NULL);
    _exit(127);
  }
  close(sv[1]);
  *fd = sv[0];
  return pid;
}

static void wait_stats(unsigned active, uint64_t mem, double timeout, fb_server_stats *s) {
  double end = now_s() + timeout;
  do {
    stats(s);
    if (s->sessions_active == active && s->memory_bytes == mem) return;
    usleep(20000);
  } while (now_s() < end);
  ck_abort_msg("stats: %u sessions, %llu bytes (wanted %u, %llu)", s->sessions_active,
               (unsigned long long)s->memory_bytes, active, (unsigned long long)mem);
}

START_TEST(killed_client_frees_session) {
  int fd;
  pid_t pid = spawn_child(&fd);
  char line[16] = "";
  ck_assert_int_eq(read(fd, line, 6), 6);
  ck_assert_str_eq(line, "ready\n");
  fb_server_stats s;
  stats(&s);
  ck_assert_uint_eq(s.sessions_active, 1);
  ck_assert_uint_ge(s.memory_bytes, (uint64_t)64 << 20);
  uint64_t gone_before = s.sessions_disconnected + s.sessions_closed;
  close(fd); /* the child _exits now, its stream open */
  int st;
  waitpid(pid, &st, 0);
  ck_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  wait_stats(0, 0, 10, &s);
  ck_assert_uint_eq(s.sessions_disconnected + s.sessions_closed, gone_before + 1);
  /* and a SIGKILLed one too */
  pid = spawn_child(&fd);
  ck_assert_int_eq(read(fd, line, 6), 6);
  stats(&s);
  ck_assert_uint_eq(s.sessions_active, 1);
  kill(pid, SIGKILL);
  waitpid(pid, &st, 0);
  close(fd);
  wait_stats(0, 0, 10, &s);
  ck_assert_uint_eq(s.sessions_disconnected + s.sessions_closed, gone_before + 2);
}
END_TEST

START_TEST(idle_sessions_reaped) {
  fb_layout *l = dense_layout(1024);
  char *id = raw_session(C, l); /* created, never attached: abandoned */
  fb_server_stats s;
  stats(&s);
  ck_assert_uint_eq(s.sessions_active, 1);
  wait_stats(0, 0, 10, &s);
  ck_assert_uint_eq(s.sessions_reaped, 1);
  /* the id is gone */
  Fusebox__V1__CloseSessionRequest rq = FUSEBOX__V1__CLOSE_SESSION_REQUEST__INIT;
  rq.session_id = id;
  size_t n;
  uint8_t *p = packed(&rq.base, &n);
  int gs;
  ck_assert_int_eq(fb_client_raw_call(C, "/fusebox.v1.Fusebox/CloseSession", p, n, NULL, NULL, &gs),
                   FB_ENOENT);
  free(p);
  free(id);
  /* an attached session left idle goes too, and its client is told why */
  fb_remote *r = NULL;
  ck_assert_int_eq(fb_remote_open(C, NULL, l, &r), 0);
  wait_stats(0, 0, 10, &s);
  ck_assert_uint_eq(s.sessions_reaped, 2);
  ck_assert_int_ne(fb_remote_sync(r, NULL), 0);
  /* told why: the idle timeout, or (when the client sees the stream end
   * first) that the server reaped it */
  ck_assert_msg(strstr(fb_remote_errmsg(r), "idle") || strstr(fb_remote_errmsg(r), "reaped"), "%s",
                fb_remote_errmsg(r));
  ck_assert_int_ne(fb_remote_close(r), 0);
  fb_layout_free(l);
}
END_TEST

/* ---------------------------------------------------------------- config and shutdown */

START_TEST(config_file) {
  char path[256];
  snprintf(path, sizeof path, "/tmp/fusebox-test-%d.json", (int)getpid());
  FILE *f = fopen(path, "w");
  ck_assert_ptr_nonnull(f);
  fprintf(f, "{ \"max_sessions\": 3, \"session_memory_limit\": \"1M\", \"log_level\": \"warn\","
             " \"idle_timeout_s\": 30 }\n");
  fclose(f);
  const char *flags[] = {"--config", path, NULL};
  start("127.0.0.1:0", flags);
  fb_server_info info;
  ck_assert_int_eq(fb_client_info(C, &info), 0);
  ck_assert_uint_eq(info.max_sessions, 3);
  ck_assert_uint_eq(info.session_memory_limit, 1 << 20);
  stop();
  /* an unknown key stops the server from starting, naming the key */
  f = fopen(path, "w");
  fprintf(f, "{ \"max_sesions\": 3 }\n");
  fclose(f);
  char err[512] = "";
  const char *args[] = {"--config", path, NULL};
  ck_assert_int_ne(fb_daemon_start(fuseboxd_path(), "127.0.0.1:0", args, &D, err, sizeof err), 0);
  ck_assert(strstr(err, "exit status 2") != NULL);
  unlink(path);
}
END_TEST

/* A sync waiting on a long kernel when SIGTERM comes is still answered. */
#define SLOW_N (1 << 26) /* iterations of a serial loop with a division: ~0.5 s */
typedef struct slow_arg {
  fb_remote *r;
  int kernel, rc;
  fb_value ret;
  double done;
} slow_arg;

static void *slow_sync(void *p) {
  slow_arg *a = p;
  fb_value n = fb_value_i32(SLOW_N);
  a->rc = fb_remote_call(a->r, a->kernel, &n, 1, &a->ret);
  a->done = now_s();
  return NULL;
}

START_TEST(sync_finishes_on_sigterm) {
  fb_remote *r = open_prog(C, "layout { place y: i32 }\n"
                              "kernel slow(n: i32) -> i32 {\n"
                              "  var k: i32\n"
                              "  var acc: i32\n"
                              "  while k < n { acc = (acc * 7 + k) % 1000003; k += 1 }\n"
                              "  y[] = acc\n"
                              "  return acc\n"
                              "}\n");
  slow_arg a = {r, kernel(r, "slow"), -1, {0}, 0};
  pthread_t th;
  ck_assert_int_eq(pthread_create(&th, NULL, slow_sync, &a), 0);
  usleep(150000); /* the launch is running now */
  double t0 = now_s();
  int st = -1;
  ck_assert_int_eq(fb_daemon_stop(&D, 30, &st), 0);
  pthread_join(th, NULL);
  ck_assert_msg(st == 0, "fuseboxd exited with status %d", st);
  ck_assert_msg(a.done > t0, "the kernel ended before SIGTERM: make it longer");
  ck_assert_msg(a.rc == 0, "the sync was not answered: %s", fb_remote_errmsg(r));
  int32_t acc = 0;
  for (int32_t k = 0; k < SLOW_N; k++) acc = (acc * 7 + k) % 1000003;
  ck_assert_int_eq(a.ret.type, FB_T_I32);
  ck_assert_int_eq((int32_t)a.ret.v.i, acc);
  fb_remote_close(r); /* the server is gone: whatever it says */
}
END_TEST

/* A server that takes small messages only: the client fits its field chunks
 * and launch batches under its limit. */
START_TEST(small_message_limit) {
  const char *flags[] = {"--max-message-bytes", "64K", NULL};
  start("127.0.0.1:0", flags);
  fb_remote *r = open_prog(C, PROG);
  int kc = kernel(r, "count");
  fb_value one = fb_value_i32(1);
  for (int i = 0; i < 20000; i++) ck_assert_int_gt(fb_remote_launch(r, kc, &one, 1), 0);
  ck_assert_msg(fb_remote_sync(r, NULL) == 0, "%s", fb_remote_errmsg(r));
  int32_t n[16];
  ck_assert_int_eq(fb_remote_field_read(r, field(r, "n"), n, sizeof n), 0);
  ck_assert_int_eq(n[7], 20000);
  fb_layout *l = dense_layout(1 << 18); /* 1 MiB */
  fb_remote *big = NULL;
  ck_assert_int_eq(fb_remote_open(C, NULL, l, &big), 0);
  float *a = malloc(1 << 20), *b = malloc(1 << 20);
  for (int i = 0; i < 1 << 18; i++) a[i] = (float)i * 0.25f;
  ck_assert_msg(fb_remote_field_write(big, 2, a, 1 << 20) == 0, "%s", fb_remote_errmsg(big));
  ck_assert_msg(fb_remote_field_read(big, 2, b, 1 << 20) == 0, "%s", fb_remote_errmsg(big));
  ck_assert_int_eq(memcmp(a, b, 1 << 20), 0);
  free(a);
  free(b);
  ck_assert_int_eq(fb_remote_close(big), 0);
  ck_assert_int_eq(fb_remote_close(r), 0);
  fb_layout_free(l);
}
END_TEST

typedef struct load_arg {
  const char *addr;
  long launches, failures;
  atomic_long syncs; /* read by the test thread while the worker runs */
} load_arg;

static void *load_worker(void *p) {
  load_arg *a = p;
  char err[256];
  fb_client *c = NULL;
  fb_client_options o = {.timeout_ms = 5000};
  if (fb_client_connect(a->addr, &o, &c, err, sizeof err)) return NULL;
  fb_remote *r = NULL;
  if (!fb_remote_open_source(c, NULL, "l.fbk", PROG, &r)) {
    int k = fb_remote_kernel(r, "count", NULL, 0);
    fb_value one = fb_value_i32(1);
    for (int round = 0; k >= 0 && round < 100000; round++) {
      int bad = 0;
      for (int i = 0; i < 100 && !bad; i++) bad = fb_remote_launch(r, k, &one, 1) < 0;
      if (bad || fb_remote_sync(r, NULL)) break;
      a->launches += 100;
      a->syncs++;
    }
    a->failures += fb_remote_close(r) != 0;
  }
  fb_client_close(c);
  return NULL;
}

START_TEST(sigterm_under_load) {
  enum {
    N = 3
  };
  pthread_t th[N];
  load_arg args[N];
  for (int i = 0; i < N; i++) {
    args[i] = (load_arg){D.address, 0, 0, 0};
    ck_assert_int_eq(pthread_create(&th[i], NULL, load_worker, &args[i]), 0);
  }
  /* SIGTERM once the load is flowing (a loaded machine may take a while) */
  for (double until = now_s() + 60; now_s() < until; usleep(10000)) {
    long flowing = 0;
    for (int i = 0; i < N; i++) flowing += atomic_load(&args[i].syncs) > 0;
    if (flowing == N) break;
  }
  double t0 = now_s();
  int st = -1;
  fb_client_close(C);
  C = NULL;
  ck_assert_int_eq(fb_daemon_stop(&D, 30, &st), 0);
  ck_assert_msg(st == 0, "fuseboxd exited with status %d under load", st);
  ck_assert_msg(now_s() - t0 < 15, "shutdown took %.1f s", now_s() - t0);
  for (int i = 0; i < N; i++) pthread_join(th[i], NULL);
  long total = 0;
  for (int i = 0; i < N; i++) total += atomic_load(&args[i].syncs);
  ck_assert_msg(total > 0, "no load reached the server");
}
END_TEST

/* ---------------------------------------------------------------- unix socket access, SIGHUP */

/* Start fuseboxd with its log (stderr) going to log_path; 0 or the error. */
static int start_logged(const char *listen, const char *const *args, const char *log_path,
                        char *err, size_t errlen) {
  fflush(stderr);
  int saved = dup(2);
  int fd = open(log_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
  ck_assert_int_ge(saved, 0);
  ck_assert_int_ge(fd, 0);
  dup2(fd, 2);
  close(fd);
  int rc = fb_daemon_start(fuseboxd_path(), listen, args, &D, err, errlen);
  dup2(saved, 2);
  close(saved);
  return rc;
}

static void write_text(const char *path, const char *text) {
  FILE *f = fopen(path, "w");
  ck_assert_ptr_nonnull(f);
  fputs(text, f);
  fclose(f);
}

/* Whether the log holds needle; waits for it as long as the server lives
 * (the signal is handled by its main thread within a tick). */
static int log_has(const char *log_path, const char *needle) {
  for (;;) {
    char *text = fbt_read_file(log_path, NULL);
    int found = text && strstr(text, needle) != NULL;
    free(text);
    if (found) return 1;
    if (D.pid <= 0 || waitpid(D.pid, NULL, WNOHANG) != 0) return 0; /* it died */
    usleep(20000);
  }
}

START_TEST(unix_socket_mode_and_group) {
  char path[128], addr[160], gid[32];
  snprintf(path, sizeof path, "/tmp/fusebox-test-mode-%d.sock", (int)getpid());
  snprintf(addr, sizeof addr, "unix:%s", path);
  snprintf(gid, sizeof gid, "%lu", (unsigned long)getgid());
  struct stat st;
  /* default: 0660 */
  start(addr, NULL);
  ck_assert_int_eq(stat(path, &st), 0);
  ck_assert(S_ISSOCK(st.st_mode));
  ck_assert_uint_eq(st.st_mode & 0777, 0660);
  stop();
  /* --socket-mode 0600, --socket-group as a numeric gid */
  const char *f[] = {"--socket-mode", "0600", "--socket-group", gid, NULL};
  start(addr, f);
  ck_assert_int_eq(stat(path, &st), 0);
  ck_assert_uint_eq(st.st_mode & 0777, 0600);
  ck_assert_uint_eq(st.st_gid, getgid());
  ck_assert_int_eq(fb_client_ping(C, NULL, NULL), 0);
  stop();
  /* the config file's socket_mode, as an octal string */
  char cfg[128];
  snprintf(cfg, sizeof cfg, "/tmp/fusebox-test-mode-%d.json", (int)getpid());
  write_text(cfg, "{ \"socket_mode\": \"0640\", \"socket_group\": \"\" }\n");
  const char *fc[] = {"--config", cfg, NULL};
  start(addr, fc);
  ck_assert_int_eq(stat(path, &st), 0);
  ck_assert_uint_eq(st.st_mode & 0777, 0640);
  stop();
  /* a JSON number is refused (JSON has no octal), exit status 2 */
  char err[512] = "";
  write_text(cfg, "{ \"socket_mode\": 640 }\n");
  ck_assert_int_ne(fb_daemon_start(fuseboxd_path(), addr, fc, &D, err, sizeof err), 0);
  ck_assert_msg(strstr(err, "exit status 2") != NULL, "%s", err);
  unlink(cfg);
  /* an unknown group stops start-up (exit 1) with a message naming the
   * socket, and the socket file is removed */
  char log[128];
  snprintf(log, sizeof log, "/tmp/fusebox-test-mode-%d.log", (int)getpid());
  const char *bad[] = {"--socket-group", "no-such-group-fusebox", NULL};
  ck_assert_int_ne(start_logged(addr, bad, log, err, sizeof err), 0);
  ck_assert_msg(strstr(err, "exit status 1") != NULL, "%s", err);
  char *text = fbt_read_file(log, NULL);
  ck_assert_ptr_nonnull(text);
  ck_assert_msg(strstr(text, addr) && strstr(text, "no-such-group-fusebox") &&
                    strstr(text, "no such group"),
                "log: %s", text);
  free(text);
  unlink(log);
  ck_assert_int_ne(lstat(path, &st), 0);
}
END_TEST

START_TEST(sighup_reloads) {
  char cfg[128], log[128];
  snprintf(cfg, sizeof cfg, "/tmp/fusebox-test-hup-%d.json", (int)getpid());
  snprintf(log, sizeof log, "/tmp/fusebox-test-hup-%d.log", (int)getpid());
  write_text(cfg, "{ \"log_level\": \"warn\", \"max_sessions\": 4 }\n");
  const char *args[] = {"--config", cfg, NULL};
  char err[512] = "";
  ck_assert_msg(start_logged("127.0.0.1:0", args, log, err, sizeof err) == 0, "fuseboxd: %s", err);
  ck_assert_int_eq(fb_client_connect(D.address, NULL, &C, err, sizeof err), 0);
  /* log_level warn -> info (applied: the INFO line "reloaded" shows);
   * max_sessions changed too, which needs a restart */
  write_text(cfg, "{ \"log_level\": \"info\", \"max_sessions\": 5, \"idle_timeout_s\": 20 }\n");
  ck_assert_int_eq(kill(D.pid, SIGHUP), 0);
  ck_assert_msg(log_has(log, "SIGHUP: reloaded"), "fuseboxd died or never logged the reload");
  ck_assert(log_has(log, "idle_timeout_s 20"));
  ck_assert(log_has(log, "max_sessions changed"));
  int st = 0;
  ck_assert_int_eq(fb_client_ping(C, &st, NULL), 0);
  ck_assert_int_eq(st, 1); /* SERVING */
  fb_server_info info;
  ck_assert_int_eq(fb_client_info(C, &info), 0);
  ck_assert_uint_eq(info.max_sessions, 4); /* kept until a restart */
  /* a broken file changes nothing and is reported */
  write_text(cfg, "{ \"log_level\": \n");
  ck_assert_int_eq(kill(D.pid, SIGHUP), 0);
  ck_assert_msg(log_has(log, "reload failed, keeping the running settings"), "no failed reload");
  ck_assert_int_eq(fb_client_ping(C, &st, NULL), 0);
  ck_assert_int_eq(st, 1);
  stop(); /* exit status 0, not killed by the signals */
  unlink(cfg);
  unlink(log);
}
END_TEST

/* Checkpoint and restore through libfusebox (fb_remote_checkpoint,
 * fb_remote_restore), both isolation modes, sync and async: a restored
 * session, launched by the old kernel ids, ends bit for bit where the
 * original does; from a file here and from a name the server keeps. */
static void read_both(fb_remote *r, float *x, int32_t *n) {
  ck_assert_msg(fb_remote_field_read(r, field(r, "x"), x, 1024 * 4) == 0, "%s",
                fb_remote_errmsg(r));
  ck_assert_msg(fb_remote_field_read(r, field(r, "n"), n, 16 * 4) == 0, "%s", fb_remote_errmsg(r));
}

static void more(fb_remote *r, int kf, int kc) {
  for (int i = 0; i < 3; i++) {
    fb_value a = fb_value_i32(i + 5), v = fb_value_f32(0.25f * (float)i);
    ck_assert_msg(fb_remote_launch(r, kc, &a, 1) > 0, "%s", fb_remote_errmsg(r));
    ck_assert_msg(fb_remote_launch(r, kf, &v, 1) > 0, "%s", fb_remote_errmsg(r));
  }
}

START_TEST(checkpoint_restore) {
  static const char *const isos[] = {"process", "thread"};
  static const char *const modes[] = {"sync", "async"};
  const char *iso = isos[_i / 2], *mode = modes[_i % 2];
  char dir[] = "/tmp/fbck-test-XXXXXX";
  ck_assert(mkdtemp(dir));
  char key[128], ckdir[128], listen[160], path[160];
  snprintf(key, sizeof key, "%s/key", dir);
  snprintf(ckdir, sizeof ckdir, "%s/ck", dir);
  snprintf(listen, sizeof listen, "unix:%s/s.sock", dir);
  snprintf(path, sizeof path, "%s/s.fbck", dir);
  const char *const f[] = {"--isolation", iso, "--checkpoint-key", key, "--checkpoint-key-create",
                           "--checkpoint-dir", ckdir, NULL};
  start(listen, f);
  fb_remote_options o;
  fb_remote_options_init(&o);
  o.mode = mode;
  fb_remote *r = NULL;
  ck_assert_msg(fb_remote_open_source(C, &o, "t.fbk", PROG, &r) == 0, "%s", fb_client_errmsg(C));
  int kf = kernel(r, "fill"), kc = kernel(r, "count");
  more(r, kf, kc);
  ck_assert_msg(fb_remote_checkpoint(r, path, NULL, 0) == 0, "%s", fb_remote_errmsg(r));
  char name[128] = "";
  ck_assert_msg(fb_remote_checkpoint(r, NULL, name, sizeof name) == 0, "%s", fb_remote_errmsg(r));
  ck_assert_msg(strstr(name, ".fbck") != NULL, "name '%s'", name);
  more(r, kf, kc);
  static float want_x[1024], got_x[1024];
  static int32_t want_n[16], got_n[16];
  read_both(r, want_x, want_n);
  ck_assert_int_eq(want_n[0], 2 * (5 + 6 + 7));
  for (int how = 0; how < 2; how++) {
    fb_remote *b = NULL;
    int rc = fb_remote_restore(C, NULL, how ? NULL : path, how ? name : NULL, &b);
    ck_assert_msg(rc == 0, "restore: %s", fb_client_errmsg(C));
    ck_assert_str_ne(fb_remote_id(b), fb_remote_id(r));
    read_both(b, got_x, got_n);
    ck_assert_int_eq(got_n[0], 5 + 6 + 7); /* where the checkpoint was */
    more(b, kf, kc); /* the ids the original had */
    read_both(b, got_x, got_n);
    ck_assert_msg(!memcmp(got_x, want_x, sizeof got_x) && !memcmp(got_n, want_n, sizeof got_n),
                  "%s %s: the restored session ended elsewhere", iso, mode);
    ck_assert_int_eq(kernel(b, "sum") >= 0, 1); /* its program is there */
    ck_assert_int_eq(fb_remote_close(b), 0);
  }
  /* refusals, in the user's terms */
  fb_remote *b = NULL;
  ck_assert_int_eq(fb_remote_restore(C, NULL, "/nonexistent/x.fbck", NULL, &b), FB_ENOENT);
  ck_assert_ptr_null(b);
  ck_assert_int_ne(fb_remote_restore(C, NULL, NULL, "../key", &b), 0);
  ck_assert_msg(strstr(fb_client_errmsg(C), "not a checkpoint name this server gave"), "%s",
                fb_client_errmsg(C));
  FILE *fp = fopen(path, "r+b");
  ck_assert(fp && fseek(fp, 100, SEEK_SET) == 0 && fputc(0x55, fp) != EOF && fclose(fp) == 0);
  ck_assert_int_ne(fb_remote_restore(C, NULL, path, NULL, &b), 0);
  ck_assert_msg(strstr(fb_client_errmsg(C), "modified"), "%s", fb_client_errmsg(C));
  /* the original went on */
  more(r, kf, kc);
  read_both(r, got_x, got_n);
  ck_assert_int_eq(got_n[0], 3 * (5 + 6 + 7));
  ck_assert_int_eq(fb_remote_close(r), 0);
  stop();
  char cmd[200];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  ck_assert_int_eq(system(cmd), 0);
}
END_TEST

/* A session moves off a draining replica by itself (fb_client_connect with
 * an address list "A,B"; docs/checkpoint.md): two fuseboxd sharing only the
 * checkpoint key; the session's replica gets SIGTERM (a grace of 60 s); at
 * its next call the session is checkpointed here, restored on B and goes on
 * with its kernel ids, ending with the fields of an uninterrupted run; A,
 * its last session gone, exits 0 at once. */
START_TEST(move_off_draining_replica) {
  char dir[] = "/tmp/fbmove-test-XXXXXX";
  ck_assert(mkdtemp(dir));
  char key[128], la[160], lb[160], list[2100], err[512] = "";
  snprintf(key, sizeof key, "%s/key", dir);
  snprintf(la, sizeof la, "unix:%s/a.sock", dir);
  snprintf(lb, sizeof lb, "unix:%s/b.sock", dir);
  const char *const fa[] = {"--log-level", "warn", "--replica-name", "ra", "--drain-grace-s", "60",
                            "--checkpoint-key", key, "--checkpoint-key-create", NULL};
  const char *const fb[] = {"--log-level", "warn", "--replica-name", "rb", "--drain-grace-s", "60",
                            "--checkpoint-key", key, NULL};
  fb_daemon A, B;
  ck_assert_msg(fb_daemon_start(fuseboxd_path(), la, fa, &A, err, sizeof err) == 0, "%s", err);
  ck_assert_msg(fb_daemon_start(fuseboxd_path(), lb, fb, &B, err, sizeof err) == 0, "%s", err);
  snprintf(list, sizeof list, "%s,%s", A.address, B.address);
  ck_assert_msg(fb_client_connect(list, NULL, &C, err, sizeof err) == 0, "%s", err);
  static float want_x[1024], got_x[1024];
  static int32_t want_n[16], got_n[16];
  fb_remote *ref = open_prog(C, PROG); /* the uninterrupted run */
  int kf = kernel(ref, "fill"), kc = kernel(ref, "count");
  more(ref, kf, kc);
  more(ref, kf, kc);
  read_both(ref, want_x, want_n);
  ck_assert_int_eq(fb_remote_close(ref), 0);
  fb_remote *r = open_prog(C, PROG);
  ck_assert_str_eq(fb_remote_replica(r), "ra"); /* the first address */
  ck_assert_int_eq(kernel(r, "fill"), kf);
  ck_assert_int_eq(kernel(r, "count"), kc);
  more(r, kf, kc);
  ck_assert_int_eq(fb_remote_sync(r, NULL), 0);
  fb_remote *stay = open_prog(C, PROG); /* keeps ra draining (no session move for it) */
  ck_assert_int_eq(kill(A.pid, SIGTERM), 0);
  /* a sync reads the drain's notice; the call after it moves the session */
  for (double t = now_s(); fb_remote_moves(r) == 0 && now_s() - t < 20;) {
    ck_assert_msg(fb_remote_sync(r, NULL) == 0, "%s", fb_remote_errmsg(r));
    usleep(50 * 1000);
  }
  ck_assert_msg(fb_remote_moves(r) == 1, "no move: %s", fb_remote_errmsg(r));
  more(r, kf, kc); /* on rb, by the same kernel ids */
  fb_remote *fresh = open_prog(C, PROG); /* ra refuses it (draining): the next address */
  ck_assert_str_eq(fb_remote_replica(fresh), "rb");
  ck_assert_int_eq(fb_remote_close(fresh), 0);
  ck_assert_msg(fb_remote_close(stay) == 0, "closing the session that stayed: %s",
                fb_client_errmsg(C)); /* (it had not moved: no call since) */
  ck_assert_str_eq(fb_remote_replica(r), "rb");
  read_both(r, got_x, got_n);
  ck_assert_msg(!memcmp(got_x, want_x, sizeof got_x) && !memcmp(got_n, want_n, sizeof got_n),
                "the moved session ended elsewhere than an uninterrupted run");
  int st = -1;
  double t0 = now_s();
  ck_assert_int_eq(fb_daemon_stop(&A, 30, &st), 0); /* (already stopping) */
  ck_assert_int_eq(st, 0);
  ck_assert_msg(now_s() - t0 < 30, "the drained replica waited for its grace");
  ck_assert_int_eq(fb_remote_close(r), 0);
  fb_client_close(C);
  C = NULL;
  ck_assert_int_eq(fb_daemon_stop(&B, 30, &st), 0);
  ck_assert_int_eq(st, 0);
  char cmd[200];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  ck_assert_int_eq(system(cmd), 0);
}
END_TEST

/* A stand-in server (gRPC core on a unix socket, no fuseboxd) that notes,
 * for the first CreateSession it gets, whether the call carried the
 * routing key, and refuses every call UNAVAILABLE. */
typedef struct route_spy {
  grpc_server *srv;
  grpc_completion_queue *cq;
  int seen; /* -1: no CreateSession; 0: without the key; 1: with it */
} route_spy;

static void *route_spy_main(void *p) {
  route_spy *sp = p;
  sp->seen = -1;
  for (int n = 0; n < 20 && sp->seen < 0; n++) {
    grpc_call *call = NULL;
    grpc_call_details det;
    grpc_metadata_array md;
    grpc_call_details_init(&det);
    grpc_metadata_array_init(&md);
    int tag;
    if (grpc_server_request_call(sp->srv, &call, &det, &md, sp->cq, sp->cq, &tag) != GRPC_CALL_OK)
      break;
    grpc_event ev = grpc_completion_queue_next(
        sp->cq, gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC), gpr_time_from_seconds(20, GPR_TIMESPAN)),
        NULL);
    if (ev.type == GRPC_OP_COMPLETE && ev.success && call) {
      if (grpc_slice_str_cmp(det.method, "/fusebox.v1.Fusebox/CreateSession") == 0) {
        sp->seen = 0;
        for (size_t i = 0; i < md.count; i++)
          if (grpc_slice_str_cmp(md.metadata[i].key, "fusebox-route") == 0 &&
              GRPC_SLICE_LENGTH(md.metadata[i].value) == 32)
            sp->seen = 1;
      }
      grpc_call_cancel_with_status(call, GRPC_STATUS_UNAVAILABLE, "a stand-in server", NULL);
      grpc_call_unref(call);
    }
    grpc_call_details_destroy(&det);
    grpc_metadata_array_destroy(&md);
    if (ev.type != GRPC_OP_COMPLETE) break;
  }
  return NULL;
}

/* fb_client_options.no_route_key (service_bench --route-key off): a
 * session's calls carry the "fusebox-route" header by default and none
 * with the option set. */
START_TEST(route_key_option) {
  char dir[] = "/tmp/fbroute-test-XXXXXX";
  ck_assert(mkdtemp(dir));
  grpc_init();
  for (int off = 0; off < 2; off++) {
    char addr[200], err[512] = "";
    snprintf(addr, sizeof addr, "unix:%s/spy%d.sock", dir, off);
    route_spy sp = {0};
    sp.cq = grpc_completion_queue_create_for_next(NULL);
    sp.srv = grpc_server_create(NULL, NULL);
    grpc_server_register_completion_queue(sp.srv, sp.cq, NULL);
    grpc_server_credentials *cr = grpc_insecure_server_credentials_create();
    ck_assert_int_gt(grpc_server_add_http2_port(sp.srv, addr, cr), 0);
    grpc_server_credentials_release(cr);
    grpc_server_start(sp.srv);
    pthread_t th;
    ck_assert_int_eq(pthread_create(&th, NULL, route_spy_main, &sp), 0);
    fb_client_options co = {.timeout_ms = 5000, .no_route_key = off};
    fb_client *c = NULL;
    ck_assert_msg(fb_client_connect(addr, &co, &c, err, sizeof err) == 0, "%s", err);
    fb_layout *l = dense_layout(16);
    fb_remote *r = NULL;
    ck_assert_int_ne(fb_remote_open(c, NULL, l, &r), 0); /* (refused) */
    pthread_join(th, NULL);
    ck_assert_msg(sp.seen == !off, "route key %s: CreateSession %s", off ? "off" : "on",
                  sp.seen < 0 ? "never came" : sp.seen ? "carried the key" : "had no key");
    fb_layout_free(l);
    fb_client_close(c);
    int t;
    grpc_server_shutdown_and_notify(sp.srv, sp.cq, &t);
    grpc_server_cancel_all_calls(sp.srv);
    for (;;) {
      grpc_event ev = grpc_completion_queue_next(sp.cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL);
      if (ev.type == GRPC_OP_COMPLETE && ev.tag == &t) break;
    }
    grpc_server_destroy(sp.srv);
    grpc_completion_queue_shutdown(sp.cq);
    while (grpc_completion_queue_next(sp.cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL).type !=
           GRPC_QUEUE_SHUTDOWN) {
    }
    grpc_completion_queue_destroy(sp.cq);
  }
  grpc_shutdown();
  char cmd[200];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  ck_assert_int_eq(system(cmd), 0);
}
END_TEST

/* A session whose replica's drain grace ran out (no call of it during the
 * grace: nothing moved it) resumes by itself from the checkpoint the drain
 * wrote (fb_client_connect "A,B", the replicas sharing --checkpoint-dir and
 * the key): what A had run stays, what it had not is sent again on B; the
 * launch numbers and counters go on where they were, and the fields end as
 * those of an uninterrupted run. */
START_TEST(resume_after_drain_grace) {
  char dir[] = "/tmp/fbresume-test-XXXXXX";
  ck_assert(mkdtemp(dir));
  char key[128], ckdir[128], la[160], lb[160], list[2100], err[512] = "";
  snprintf(key, sizeof key, "%s/key", dir);
  snprintf(ckdir, sizeof ckdir, "%s/ck", dir);
  snprintf(la, sizeof la, "unix:%s/a.sock", dir);
  snprintf(lb, sizeof lb, "unix:%s/b.sock", dir);
  const char *const fa[] = {"--log-level", "warn", "--replica-name", "ra", "--drain-grace-s", "1",
                            "--checkpoint-key", key, "--checkpoint-key-create",
                            "--checkpoint-dir", ckdir, NULL};
  const char *const fb[] = {"--log-level", "warn", "--replica-name", "rb", "--drain-grace-s", "60",
                            "--checkpoint-key", key, "--checkpoint-dir", ckdir, NULL};
  fb_daemon A, B;
  ck_assert_msg(fb_daemon_start(fuseboxd_path(), la, fa, &A, err, sizeof err) == 0, "%s", err);
  ck_assert_msg(fb_daemon_start(fuseboxd_path(), lb, fb, &B, err, sizeof err) == 0, "%s", err);
  snprintf(list, sizeof list, "%s,%s", A.address, B.address);
  ck_assert_msg(fb_client_connect(list, NULL, &C, err, sizeof err) == 0, "%s", err);
  static float want_x[1024], got_x[1024];
  static int32_t want_n[16], got_n[16];
  fb_remote *ref = open_prog(C, PROG); /* the uninterrupted run */
  int kf = kernel(ref, "fill"), kc = kernel(ref, "count");
  for (int i = 0; i < 4; i++) more(ref, kf, kc);
  read_both(ref, want_x, want_n);
  ck_assert_int_eq(fb_remote_close(ref), 0);
  fb_remote_options o;
  fb_remote_options_init(&o);
  o.mode = "sync"; /* a task per launch: the counters below are exact */
  fb_remote *r = NULL;
  ck_assert_msg(fb_remote_open_source(C, &o, "t.fbk", PROG, &r) == 0, "%s", fb_client_errmsg(C));
  ck_assert_str_eq(fb_remote_replica(r), "ra");
  ck_assert_int_eq(kernel(r, "fill"), kf);
  ck_assert_int_eq(kernel(r, "count"), kc);
  more(r, kf, kc);
  fb_sync_result sr;
  ck_assert_int_eq(fb_remote_sync(r, &sr), 0);
  ck_assert_uint_eq(sr.seq, 6);
  fb_counters before = sr.counters;
  ck_assert_uint_eq(before.launches, 6);
  ck_assert_int_eq(kill(A.pid, SIGTERM), 0);
  more(r, kf, kc); /* sent, run on A (and in its checkpoint), not answered */
  ck_assert_msg(fb_remote_flush(r) == 0, "%s", fb_remote_errmsg(r));
  int st = -1;
  double t0 = now_s();
  while (waitpid(A.pid, &st, WNOHANG) == 0 && now_s() - t0 < 30) usleep(20 * 1000);
  ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "A: status %d", st);
  ck_assert_int_eq(fb_remote_moves(r), 0); /* no call during the grace */
  more(r, kf, kc); /* queued here: A is gone */
  ck_assert_msg(fb_remote_sync(r, &sr) == 0, "not resumed: %s", fb_remote_errmsg(r));
  ck_assert_int_eq(fb_remote_moves(r), 1);
  ck_assert_str_eq(fb_remote_replica(r), "rb");
  ck_assert_uint_eq(sr.seq, 18); /* the launch numbers went on */
  ck_assert_uint_eq(sr.counters.launches, 18);
  /* continued, not reset: A's 6 launches answered before (B's alone: as many) */
  ck_assert_uint_gt(before.tasks_launched, 0);
  ck_assert_uint_eq(sr.counters.tasks_launched, 2 * before.tasks_launched);
  for (int i = 0; i < 3; i++) {
    fb_value a = fb_value_i32(i + 5), v = fb_value_f32(0.25f * (float)i);
    ck_assert_int_eq(fb_remote_launch(r, kc, &a, 1), 19 + 2 * i);
    ck_assert_int_eq(fb_remote_launch(r, kf, &v, 1), 20 + 2 * i);
  }
  read_both(r, got_x, got_n);
  ck_assert_msg(!memcmp(got_x, want_x, sizeof got_x) && !memcmp(got_n, want_n, sizeof got_n),
                "the resumed session ended elsewhere than an uninterrupted run (n[0] %d, want %d)",
                got_n[0], want_n[0]);
  fb_counters after;
  ck_assert_int_eq(fb_remote_counters(r, &after), 0);
  ck_assert_uint_eq(after.launches, 24);
  /* an error after the move names the caller's launch number */
  fb_value far = fb_value_i32(5000);
  ck_assert_int_eq(fb_remote_launch(r, kernel(r, "poke"), &far, 1), 25);
  ck_assert_int_eq(fb_remote_sync(r, &sr), FB_EBOUNDS);
  ck_assert_msg(sr.nerrors == 1 && sr.errors[0].seq == 25, "%d errors, seq %llu", sr.nerrors,
                sr.nerrors ? (unsigned long long)sr.errors[0].seq : 0ULL);
  ck_assert_msg(strstr(fb_remote_errmsg(r), "launch #25 ") != NULL, "%s", fb_remote_errmsg(r));
  ck_assert_int_eq(fb_remote_close(r), 0);
  fb_client_close(C);
  C = NULL;
  ck_assert_int_eq(fb_daemon_stop(&B, 30, &st), 0);
  ck_assert_int_eq(st, 0);
  char cmd[200];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  ck_assert_int_eq(system(cmd), 0);
}
END_TEST

int main(int argc, char **argv) {
  if (argc == 4 && strcmp(argv[1], "--child-client") == 0)
    return child_client(argv[2], atoi(argv[3]));
  Suite *s = suite_create("service");
  TCase *tcp = tcase_create("tcp");
  tcase_add_checked_fixture(tcp, setup_tcp, teardown);
  tcase_set_timeout(tcp, 120);
  tcase_add_test(tcp, health_info_stats);
  tcase_add_test(tcp, launch_results);
  tcase_add_test(tcp, remote_warnings);
  tcase_add_test(tcp, errors_in_both_modes);
  tcase_add_test(tcp, cancel_launches);
  tcase_add_test(tcp, isolation);
  tcase_add_test(tcp, malformed_to_every_method);
  tcase_add_test(tcp, verifier_errors);
  tcase_add_test(tcp, field_256mib);
  tcase_add_test(tcp, quotas);
  tcase_add_test(tcp, sigterm_under_load);
  tcase_add_test(tcp, sync_finishes_on_sigterm);
  suite_add_tcase(s, tcp);
  TCase *ux = tcase_create("unix");
  tcase_add_checked_fixture(ux, setup_unix, teardown);
  tcase_set_timeout(ux, 120);
  tcase_add_test(ux, health_info_stats);
  tcase_add_test(ux, sessions_at_once);
  tcase_add_test(ux, malformed_to_every_method);
  tcase_add_test(ux, killed_client_frees_session);
  tcase_add_test(ux, cancel_launches);
  tcase_add_test(ux, launch_results);
  suite_add_tcase(s, ux);
  TCase *cfg = tcase_create("config");
  tcase_set_timeout(cfg, 60);
  tcase_add_checked_fixture(cfg, NULL, teardown);
  tcase_add_test(cfg, config_file);
  tcase_add_test(cfg, small_message_limit);
  suite_add_tcase(s, cfg);
  TCase *idle = tcase_create("idle");
  tcase_set_timeout(idle, 60);
  tcase_add_checked_fixture(idle, setup_idle, teardown);
  tcase_add_test(idle, idle_sessions_reaped);
  suite_add_tcase(s, idle);
  TCase *ck = tcase_create("checkpoint");
  tcase_set_timeout(ck, 120);
  tcase_add_checked_fixture(ck, NULL, teardown);
  tcase_add_loop_test(ck, checkpoint_restore, 0, 4);
  tcase_add_test(ck, move_off_draining_replica);
  tcase_add_test(ck, resume_after_drain_grace);
  tcase_add_test(ck, route_key_option);
  suite_add_tcase(s, ck);
  TCase *ops = tcase_create("operations");
  tcase_set_timeout(ops, 60);
  tcase_add_checked_fixture(ops, NULL, teardown);
  tcase_add_test(ops, unix_socket_mode_and_group);
  tcase_add_test(ops, sighup_reloads);
  suite_add_tcase(s, ops);
  return fbt_run(s);
}
