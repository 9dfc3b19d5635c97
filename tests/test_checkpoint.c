/* Checkpoint and restore (docs/checkpoint.md): a session that runs N
 * launches, is checkpointed, restored into a fresh engine and runs M more
 * ends with every field (values and activity) bit for bit equal to a
 * session that ran N + M launches uninterrupted: sync and async (with
 * launches pending and fused at the checkpoint), dense, pointer,
 * bitmasked and dynamic SNodes, random(), autodiff kernels and the tape.
 * Refusals: every byte of a small checkpoint flipped (unsealed: the
 * hashes; sealed: the HMAC), truncation at every length, another owner,
 * another format, a state over the memory limit, a tape being recorded,
 * a sink that fails; a failed restore leaves *out NULL and leaks nothing
 * (ASan). The key file helper's rules. One CPU thread per engine, so that
 * the order parallel appends land in is the same in both runs. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fusebox/engine.h"
#include "fusebox/lang.h"
#include "tests/support/support.h"

/* ---------------------------------------------------------------- memory streams */

typedef struct mbuf {
  uint8_t *p;
  size_t n, cap, at;
  size_t fail_after; /* sink: refuse once this many bytes are in (0: never) */
} mbuf;

static int msink(void *user, const void *buf, size_t n) {
  mbuf *m = user;
  if (m->fail_after && m->n + n > m->fail_after) return 1;
  if (m->n + n > m->cap) {
    size_t c = m->cap ? m->cap : 4096;
    while (c < m->n + n) c *= 2;
    m->p = realloc(m->p, c);
    ck_assert_ptr_nonnull(m->p);
    m->cap = c;
  }
  memcpy(m->p + m->n, buf, n);
  m->n += n;
  return 0;
}

static long msrc(void *user, void *buf, size_t n) {
  mbuf *m = user;
  size_t k = m->n - m->at < n ? m->n - m->at : n;
  /* short reads, to exercise the reader's buffering */
  if (k > 777) k = 777 + (m->at % 3);
  if (k > m->n - m->at) k = m->n - m->at;
  memcpy(buf, m->p + m->at, k);
  m->at += k;
  return (long)k;
}

/* ---------------------------------------------------------------- programs */

static const char *const SPARSE_SRC =
    "layout {\n"
    "  dense(i: 64) { place a: f32, c: i32 }\n"
    "  pointer(i: 16) as pb { dense(i: 4) { place p: i32 } }\n"
    "  bitmasked(i: 64) as bm { place b: f32 }\n"
    "  dense(i: 8) { dynamic(j: 64, chunk: 8) as dl { place d: i32 } }\n"
    "}\n"
    "kernel step(t: i32) {\n"
    "  for i in 0 .. 64 { a[i] = a[i] * 0.5 + random() }\n"
    "  for i in 0 .. 64 { if (i * 7 + t) % 5 == 0 { p[i] += t + i } }\n"
    "  for i in 0 .. 16 { if (i + t) % 9 == 0 { deactivate(pb, i) } }\n"
    "  for i in 0 .. 64 { if (i * 3 + t) % 4 == 0 { b[i] = b[i] + 1.0 + a[i] } }\n"
    "  for i in 0 .. 64 { if (i + t) % 7 == 0 { deactivate(bm, i) } }\n"
    "  for k in 0 .. 8 { if (k + t) % 3 == 0 { append(d, k, t * 10 + k) } }\n"
    "  for k in 0 .. 8 { if (k + t) % 11 == 0 { deactivate(dl, k, 0) } }\n"
    "}\n"
    "kernel visit() {\n"
    "  for i in p { c[i] += p[i] }\n"
    "  for i in b { c[i] += 3 }\n"
    "  for k, n in d { c[k] += d[k, n] * (n + 1) }\n"
    "}\n";

static const char *const AD_SRC =
    "layout {\n"
    "  dense(i: 32) { place x: f32 grad, y: f32 grad }\n"
    "  place loss: f32 grad\n"
    "}\n"
    "kernel init(t: i32) { for i in 0 .. 32 { x[i] = x[i] * 0.9 + random() + t } }\n"
    "kernel fwd() { for i in 0 .. 32 { y[i] = sin(x[i]) * 2.0 } }\n"
    "kernel lossk() { for i in 0 .. 32 { loss[] += y[i] * y[i] } }\n"
    "kernel learn() { for i in 0 .. 32 { x[i] -= 0.01 * x.grad[i] } }\n";

static const char *const TINY_SRC =
    "layout { dense(i: 8) { place v: f32 } }\n"
    "kernel k(t: i32) { for i in 0 .. 8 { v[i] += t * i + random() } }\n";

typedef struct run {
  fb_engine *e;
  fb_program *p;
  fb_session *s;
} run;

static fb_engine *engine_new(void) {
  fb_engine_config cfg = {fbt_backend(), 1, 1};
  fb_engine *e = NULL;
  char err[512];
  ck_assert_msg(fb_engine_create(&cfg, &e, err, sizeof err) == 0, "engine: %s", err);
  return e;
}

static int add(fb_session *s, fb_program *p, const char *name) {
  fb_diags dg;
  fb_diags_init(&dg);
  fb_kernel *k = NULL;
  int rc = fb_program_instantiate(p, name, NULL, 0, &k, &dg);
  fb_diags_free(&dg);
  ck_assert_msg(rc == 0, "instantiate %s: %s", name, fb_strerror(rc));
  int id = fb_session_add_kernel(s, k); /* k belongs to the program */
  ck_assert_msg(id >= 0, "add %s: %s", name, fb_session_errmsg(s));
  return id;
}

static void run_open(run *r, const char *src, const char *mode, int flush_every) {
  memset(r, 0, sizeof *r);
  r->e = engine_new();
  fb_diags dg;
  fb_diags_init(&dg);
  int rc = fb_program_parse("ckpt.fbk", src, &r->p, &dg);
  fb_diags_free(&dg);
  ck_assert_int_eq(rc, 0);
  fb_session_config sc = {.mode = mode, .seed = 42, .flush_every = flush_every};
  char err[512];
  rc = fb_session_create(r->e, &sc, fb_program_layout(r->p), &r->s, err, sizeof err);
  ck_assert_msg(rc == 0, "session: %s", err);
}

static void run_close(run *r) {
  fb_session_destroy(r->s);
  fb_program_free(r->p);
  fb_engine_destroy(r->e);
}

static void launch(fb_session *s, int k, int t) {
  fb_value a = {.type = FB_T_I32, .v.i = t};
  int rc = fb_launch(s, k, &a, 1, NULL);
  ck_assert_msg(rc == 0, "launch: %s", fb_session_errmsg(s));
}

static void launch0(fb_session *s, int k) {
  int rc = fb_launch(s, k, NULL, 0, NULL);
  ck_assert_msg(rc == 0, "launch: %s", fb_session_errmsg(s));
}

/* Every field of a and b, values and activity, bit for bit. */
static void same_state(fb_session *a, fb_session *b, const char *when) {
  ck_assert_int_eq(fb_sync(a), 0);
  ck_assert_int_eq(fb_sync(b), 0);
  const fb_layout *l = fb_session_layout(a);
  int fields = 0;
  for (int i = 0; i < l->nnodes; i++) {
    if (l->nodes[i].kind != FB_SN_PLACE) continue;
    size_t n = (size_t)fb_field_numel(l, i), bytes = n * fb_type_size(l->nodes[i].type);
    uint8_t *x = malloc(bytes), *y = malloc(bytes), *ma = malloc(n), *mb = malloc(n);
    ck_assert_int_eq(fb_field_read(a, i, x, bytes), 0);
    ck_assert_int_eq(fb_field_read(b, i, y, bytes), 0);
    ck_assert_int_eq(fb_field_active(a, i, ma, n), 0);
    ck_assert_int_eq(fb_field_active(b, i, mb, n), 0);
    ck_assert_msg(memcmp(x, y, bytes) == 0, "%s: field '%s' differs", when, l->nodes[i].name);
    ck_assert_msg(memcmp(ma, mb, n) == 0, "%s: activity of '%s' differs", when, l->nodes[i].name);
    free(x);
    free(y);
    free(ma);
    free(mb);
    fields++;
  }
  ck_assert_int_gt(fields, 0);
  fb_counters ca, cb;
  fb_session_counters(a, &ca);
  fb_session_counters(b, &cb);
  ck_assert_uint_eq(ca.launches, cb.launches);
  ck_assert_uint_eq(fb_session_launches(a), fb_session_launches(b));
}

static void checkpoint_to(fb_session *s, mbuf *m) {
  char err[512];
  int rc = fb_session_checkpoint(s, msink, m, err, sizeof err);
  ck_assert_msg(rc == 0, "checkpoint: %s", err);
}

static fb_session *restore_from(fb_engine *e, mbuf *m, const fb_session_config *lim) {
  fb_session *s = (fb_session *)1;
  char err[512];
  m->at = 0;
  int rc = fb_session_restore(e, lim, msrc, m, &s, err, sizeof err);
  ck_assert_msg(rc == 0, "restore: %s", err);
  ck_assert_ptr_nonnull(s);
  return s;
}

/* ---------------------------------------------------------------- continues bit for bit */

/* N steps, checkpoint, restore into a fresh engine, M more; against N + M. */
static void sparse_resume(const char *mode, int flush_every) {
  const int N = 23, M = 17;
  run ref, a;
  run_open(&ref, SPARSE_SRC, mode, flush_every);
  run_open(&a, SPARSE_SRC, mode, flush_every);
  int rs = add(ref.s, ref.p, "step"), rv = add(ref.s, ref.p, "visit");
  int as = add(a.s, a.p, "step"), av = add(a.s, a.p, "visit");
  for (int t = 0; t < N; t++) {
    launch(ref.s, rs, t);
    launch0(ref.s, rv);
    launch(a.s, as, t);
    launch0(a.s, av);
  }
  /* async with flush_every -1: everything is still pending here */
  if (flush_every < 0) {
    fb_counters c;
    fb_session_counters(a.s, &c);
    ck_assert_uint_gt(c.tasks_pending, 0);
  }
  mbuf m = {0};
  checkpoint_to(a.s, &m);
  /* the checkpointed session goes on as if nothing happened */
  same_state(ref.s, a.s, "the checkpointed session");
  fb_engine *e2 = engine_new();
  fb_session *b = restore_from(e2, &m, NULL);
  same_state(ref.s, b, "just restored");
  ck_assert_int_eq(fb_session_kernel_count(b), 2);
  ck_assert_int_eq(fb_session_find_kernel(b, "visit"), av);
  for (int t = N; t < N + M; t++) {
    launch(ref.s, rs, t);
    launch0(ref.s, rv);
    launch(b, as, t); /* the ids the client held */
    launch0(b, av);
  }
  same_state(ref.s, b, "after the restored session ran on");
  if (flush_every < 0 || strcmp(mode, "async") == 0) {
    fb_counters c;
    fb_session_counters(b, &c);
    ck_assert_uint_gt(c.tasks_fused, 0); /* fused work ran after the restore */
  }
  fb_session_destroy(b);
  fb_engine_destroy(e2);
  free(m.p);
  run_close(&a);
  run_close(&ref);
}

START_TEST(sync_sparse_continues) { sparse_resume("sync", 0); }
END_TEST

START_TEST(async_sparse_continues) { sparse_resume("async", 0); }
END_TEST

START_TEST(async_pending_continues) { sparse_resume("async", -1); }
END_TEST

/* The sparse structure really is there: blocks, bitmasks and lists. */
START_TEST(sparse_activity_saved) {
  run a;
  run_open(&a, SPARSE_SRC, "sync", 0);
  int as = add(a.s, a.p, "step");
  for (int t = 0; t < 5; t++) launch(a.s, as, t);
  mbuf m = {0};
  checkpoint_to(a.s, &m);
  fb_engine *e2 = engine_new();
  fb_session *b = restore_from(e2, &m, NULL);
  const fb_layout *l = fb_session_layout(b);
  const char *names[3] = {"p", "b", "d"};
  for (int f = 0; f < 3; f++) {
    int id = fb_layout_find(l, names[f]);
    size_t n = (size_t)fb_field_numel(l, id);
    uint8_t *mask = malloc(n);
    ck_assert_int_eq(fb_field_active(b, id, mask, n), 0);
    size_t on = 0;
    for (size_t i = 0; i < n; i++) on += mask[i];
    ck_assert_msg(on > 0 && on < n, "field %s: %zu of %zu cells active", names[f], on, n);
    free(mask);
  }
  same_state(a.s, b, "restored");
  fb_session_destroy(b);
  fb_engine_destroy(e2);
  free(m.p);
  run_close(&a);
}
END_TEST

/* Adjoints and the tape's generated kernels survive, with their ids. */
static void ad_resume(const char *mode) {
  run ref, a;
  run_open(&ref, AD_SRC, mode, 0);
  run_open(&a, AD_SRC, mode, 0);
  run *rr[2] = {&ref, &a};
  int ids[2][4];
  for (int w = 0; w < 2; w++) {
    ids[w][0] = add(rr[w]->s, rr[w]->p, "init");
    ids[w][1] = add(rr[w]->s, rr[w]->p, "fwd");
    ids[w][2] = add(rr[w]->s, rr[w]->p, "lossk");
    ids[w][3] = add(rr[w]->s, rr[w]->p, "learn");
  }
  const fb_layout *l = fb_session_layout(a.s);
  int loss = fb_layout_find(l, "loss");
  fb_session *cur[2] = {ref.s, a.s};
  fb_engine *e2 = NULL;
  mbuf m = {0};
  for (int it = 0; it < 6; it++) {
    if (it == 3) { /* checkpoint a, go on with its restored copy */
      checkpoint_to(a.s, &m);
      e2 = engine_new();
      cur[1] = restore_from(e2, &m, NULL);
      ck_assert_int_eq(fb_session_kernel_count(cur[1]), fb_session_kernel_count(a.s));
      int adj = -1;
      ck_assert_int_eq(fb_session_kernel_adjoint(cur[1], ids[1][1], &adj), 0);
      int adj0 = -1;
      ck_assert_int_eq(fb_session_kernel_adjoint(a.s, ids[1][1], &adj0), 0);
      ck_assert_int_eq(adj, adj0); /* the same adjoint, not a new one */
      ck_assert_int_eq(fb_session_kernel_count(cur[1]), fb_session_kernel_count(a.s));
    }
    for (int w = 0; w < 2; w++) {
      fb_session *s = cur[w];
      launch(s, ids[w][0], it);
      ck_assert_int_eq(fb_session_tape_begin(s, loss), 0);
      launch0(s, ids[w][1]);
      launch0(s, ids[w][2]);
      ck_assert_int_eq(fb_session_tape_end(s), 0);
      launch0(s, ids[w][3]);
    }
  }
  same_state(cur[0], cur[1], "after the tape ran on");
  fb_session_destroy(cur[1]);
  fb_engine_destroy(e2);
  free(m.p);
  run_close(&a);
  run_close(&ref);
}

START_TEST(sync_autodiff_continues) { ad_resume("sync"); }
END_TEST

START_TEST(async_autodiff_continues) { ad_resume("async"); }
END_TEST

/* ---------------------------------------------------------------- refusals */

START_TEST(tape_recording_refused) {
  run a;
  run_open(&a, AD_SRC, "sync", 0);
  int f = add(a.s, a.p, "fwd");
  ck_assert_int_eq(fb_session_tape_begin(a.s, fb_layout_find(fb_session_layout(a.s), "loss")), 0);
  launch0(a.s, f);
  mbuf m = {0};
  char err[512];
  ck_assert_int_eq(fb_session_checkpoint(a.s, msink, &m, err, sizeof err), FB_EINVAL);
  ck_assert_msg(strstr(err, "a tape is being recorded"), "%s", err);
  ck_assert_int_eq(fb_session_tape_end(a.s), 0); /* the tape goes on and ends */
  m.n = 0;
  checkpoint_to(a.s, &m);
  free(m.p);
  run_close(&a);
}
END_TEST

START_TEST(failing_sink_leaves_session) {
  run a;
  run_open(&a, TINY_SRC, "sync", 0);
  int k = add(a.s, a.p, "k");
  launch(a.s, k, 1);
  mbuf m = {0};
  m.fail_after = 100;
  char err[512];
  ck_assert_int_eq(fb_session_checkpoint(a.s, msink, &m, err, sizeof err), FB_EIO);
  ck_assert_msg(strstr(err, "could not be written"), "%s", err);
  launch(a.s, k, 2); /* still usable */
  free(m.p);
  run_close(&a);
}
END_TEST

/* A small async checkpoint (no compiles on restore). */
static mbuf tiny_checkpoint(const char *mode) {
  run a;
  run_open(&a, TINY_SRC, mode, 0);
  int k = add(a.s, a.p, "k");
  for (int t = 0; t < 3; t++) launch(a.s, k, t);
  mbuf m = {0};
  checkpoint_to(a.s, &m);
  run_close(&a);
  return m;
}

static int try_restore(fb_engine *e, const uint8_t *p, size_t n, const fb_session_config *lim,
                       char *err, size_t errlen) {
  mbuf m = {(uint8_t *)p, n, n, 0, 0};
  fb_session *s = (fb_session *)1;
  int rc = fb_session_restore(e, lim, msrc, &m, &s, err, errlen);
  if (rc == 0) {
    fb_session_destroy(s);
    return 0;
  }
  ck_assert_ptr_null(s); /* nothing left behind */
  return rc;
}

START_TEST(every_flipped_byte_refused) {
  mbuf m = tiny_checkpoint("async");
  fb_engine *e = engine_new();
  char err[1024];
  ck_assert_int_eq(try_restore(e, m.p, m.n, NULL, err, sizeof err), 0);
  int by_hash = 0;
  for (size_t i = 0; i < m.n; i++) {
    m.p[i] ^= 0x5a;
    int rc = try_restore(e, m.p, m.n, NULL, err, sizeof err);
    ck_assert_msg(rc != 0, "byte %zu flipped was accepted", i);
    by_hash += strstr(err, "SHA-256") != NULL;
    m.p[i] ^= 0x5a;
  }
  ck_assert_int_gt(by_hash, 0);
  fb_engine_destroy(e);
  free(m.p);
}
END_TEST

/* Hostile bytes reach the sparse parts before the manifest is read: every
 * byte of a sparse checkpoint flipped is refused, and under ASan none of
 * them makes the restore touch memory it should not. */
START_TEST(sparse_flips_refused) {
  run a;
  run_open(&a, SPARSE_SRC, "async", 0);
  int as = add(a.s, a.p, "step"), av = add(a.s, a.p, "visit");
  for (int t = 0; t < 6; t++) {
    launch(a.s, as, t);
    launch0(a.s, av);
  }
  mbuf m = {0};
  checkpoint_to(a.s, &m);
  run_close(&a);
  fb_engine *e = engine_new();
  char err[1024];
  for (size_t i = 0; i < m.n; i++) {
    m.p[i] ^= 0x80;
    ck_assert_msg(try_restore(e, m.p, m.n, NULL, err, sizeof err) != 0,
                  "byte %zu of %zu flipped was accepted", i, m.n);
    m.p[i] ^= 0x80;
  }
  fb_engine_destroy(e);
  free(m.p);
}
END_TEST

START_TEST(every_truncation_refused) {
  mbuf m = tiny_checkpoint("async");
  fb_engine *e = engine_new();
  char err[1024];
  for (size_t n = 0; n < m.n; n++) {
    int rc = try_restore(e, m.p, n, NULL, err, sizeof err);
    ck_assert_msg(rc != 0, "checkpoint cut to %zu of %zu bytes was accepted", n, m.n);
  }
  ck_assert_int_ne(try_restore(e, m.p, 20, NULL, err, sizeof err), 0);
  ck_assert_msg(strstr(err, "truncated"), "%s", err);
  /* and a byte too many */
  uint8_t *more = malloc(m.n + 1);
  memcpy(more, m.p, m.n);
  more[m.n] = 0;
  ck_assert_int_ne(try_restore(e, more, m.n + 1, NULL, err, sizeof err), 0);
  ck_assert_msg(strstr(err, "after its end"), "%s", err);
  free(more);
  fb_engine_destroy(e);
  free(m.p);
}
END_TEST

START_TEST(other_format_refused) {
  mbuf m = tiny_checkpoint("sync");
  fb_engine *e = engine_new();
  char err[1024];
  m.p[8] = FB_CHECKPOINT_FORMAT + 1;
  ck_assert_int_eq(try_restore(e, m.p, m.n, NULL, err, sizeof err), FB_EINVAL);
  char want[128];
  snprintf(want, sizeof want, "written by Fusebox format %d, this server reads %d",
           FB_CHECKPOINT_FORMAT + 1, FB_CHECKPOINT_FORMAT);
  ck_assert_msg(strstr(err, want), "%s", err);
  m.p[0] = 'X';
  ck_assert_int_eq(try_restore(e, m.p, m.n, NULL, err, sizeof err), FB_EINVAL);
  ck_assert_msg(strstr(err, "not a Fusebox checkpoint"), "%s", err);
  fb_engine_destroy(e);
  free(m.p);
}
END_TEST

/* The header's byte-order mark and pointer size: a checkpoint of a machine
 * of the other byte order (its mark swapped, as that machine stores it) is
 * refused by name, and so is one of another pointer size. */
START_TEST(foreign_byte_order_refused) {
  mbuf m = tiny_checkpoint("sync");
  fb_engine *e = engine_new();
  char err[1024];
  uint8_t mark[4];
  memcpy(mark, m.p + 16, 4);
  for (int i = 0; i < 4; i++) m.p[16 + i] = mark[3 - i];
  ck_assert_int_eq(try_restore(e, m.p, m.n, NULL, err, sizeof err), FB_EINVAL);
  ck_assert_msg(strstr(err, "big-endian machine and this one is little-endian"), "%s", err);
  ck_assert_msg(strstr(err, "other byte order"), "%s", err);
  memcpy(m.p + 16, mark, 4);
  ck_assert_int_eq(try_restore(e, m.p, m.n, NULL, err, sizeof err), 0);
  m.p[20] = 4;
  ck_assert_int_eq(try_restore(e, m.p, m.n, NULL, err, sizeof err), FB_EINVAL);
  ck_assert_msg(strstr(err, "4-byte pointers and this one has 8-byte pointers"), "%s", err);
  fb_engine_destroy(e);
  free(m.p);
}
END_TEST

START_TEST(over_memory_limit_refused) {
  mbuf m = tiny_checkpoint("sync");
  fb_engine *e = engine_new();
  char err[1024];
  fb_session_config lim = {.memory_limit = 16};
  ck_assert_int_eq(try_restore(e, m.p, m.n, &lim, err, sizeof err), FB_EQUOTA);
  lim.memory_limit = 1 << 20;
  ck_assert_int_eq(try_restore(e, m.p, m.n, &lim, err, sizeof err), 0);
  /* the restoring side's statement budget applies too */
  lim.max_kernel_statements = 2;
  ck_assert_int_eq(try_restore(e, m.p, m.n, &lim, err, sizeof err), FB_EQUOTA);
  ck_assert_msg(strstr(err, "kernel 'k'"), "%s", err);
  fb_engine_destroy(e);
  free(m.p);

  /* sparse blocks count against the limit too */
  run a;
  run_open(&a, SPARSE_SRC, "sync", 0);
  int as = add(a.s, a.p, "step");
  for (int t = 0; t < 5; t++) launch(a.s, as, t);
  mbuf sm = {0};
  checkpoint_to(a.s, &sm);
  fb_counters c;
  fb_session_counters(a.s, &c);
  e = engine_new();
  /* room for the fields, not for the blocks and lists as well */
  fb_session_config lim2 = {.memory_limit = c.device_bytes - 1};
  ck_assert_uint_gt(lim2.memory_limit, fb_session_layout(a.s)->root_bytes);
  ck_assert_int_eq(try_restore(e, sm.p, sm.n, &lim2, err, sizeof err), FB_EQUOTA);
  lim2.memory_limit = c.device_bytes;
  ck_assert_int_eq(try_restore(e, sm.p, sm.n, &lim2, err, sizeof err), 0);
  fb_engine_destroy(e);
  free(sm.p);
  run_close(&a);
}
END_TEST

/* A field of 12 MiB: its chunks are hashed on a second thread while the
 * sink (or the reader) works; a flipped byte deep inside is still found. */
START_TEST(large_field_chunks) {
  run a;
  run_open(&a, "layout { dense(i: 3145728) { place w: f32 } }\n"
               "kernel k(t: i32) { for i in 0 .. 3145728 { w[i] += random() + t } }\n",
           "sync", 0);
  int k = add(a.s, a.p, "k");
  launch(a.s, k, 1);
  mbuf m = {0};
  checkpoint_to(a.s, &m);
  ck_assert_uint_gt(m.n, (size_t)12 << 20);
  fb_engine *e = engine_new();
  fb_session *b = restore_from(e, &m, NULL);
  launch(a.s, k, 2);
  launch(b, k, 2);
  same_state(a.s, b, "large field");
  fb_session_destroy(b);
  char err[512];
  m.p[m.n / 2] ^= 1;
  ck_assert_int_eq(try_restore(e, m.p, m.n, NULL, err, sizeof err), FB_EINVAL);
  ck_assert_msg(strstr(err, "fields part does not match its SHA-256"), "%s", err);
  fb_engine_destroy(e);
  free(m.p);
  run_close(&a);
}
END_TEST

/* ---------------------------------------------------------------- the seal */

static const uint8_t KEY[32] = "0123456789abcdef0123456789abcdef";

static int fdsink(void *user, const void *buf, size_t n) {
  return write(*(int *)user, buf, n) == (ssize_t)n ? 0 : 1;
}

/* A sealed checkpoint of the tiny session in a temporary file (its fd). */
static int sealed_file(const char *owner, char *path, size_t len) {
  snprintf(path, len, "/tmp/fb_ckpt_test_XXXXXX");
  int fd = mkstemp(path);
  ck_assert_int_ge(fd, 0);
  unlink(path);
  mbuf m = tiny_checkpoint("sync");
  fb_seal *s = fb_seal_begin(KEY, sizeof KEY, owner, fdsink, &fd);
  ck_assert_ptr_nonnull(s);
  ck_assert_int_eq(fb_seal_write(s, m.p, 100), 0);
  ck_assert_int_eq(fb_seal_write(s, m.p + 100, m.n - 100), 0);
  char err[512];
  ck_assert_int_eq(fb_seal_finish(s, err, sizeof err), 0);
  free(m.p);
  return fd;
}

static uint8_t *file_bytes(int fd, size_t *n) {
  struct stat st;
  ck_assert_int_eq(fstat(fd, &st), 0);
  *n = (size_t)st.st_size;
  uint8_t *p = malloc(*n);
  ck_assert_int_eq(pread(fd, p, *n, 0), (ssize_t)*n);
  return p;
}

static int bytes_fd(const uint8_t *p, size_t n) {
  char path[64] = "/tmp/fb_ckpt_test_XXXXXX";
  int fd = mkstemp(path);
  ck_assert_int_ge(fd, 0);
  unlink(path);
  ck_assert_int_eq(write(fd, p, n), (ssize_t)n);
  return fd;
}

START_TEST(seal_round_trip) {
  char path[64], err[512];
  int fd = sealed_file("tenant-a", path, sizeof path);
  uint64_t plen = 0;
  ck_assert_int_eq(fb_seal_verify_fd(fd, KEY, sizeof KEY, "tenant-a", &plen, err, sizeof err), 0);
  size_t n = 0;
  uint8_t *p = file_bytes(fd, &n);
  ck_assert_uint_lt(plen, n);
  /* the payload restores */
  fb_engine *e = engine_new();
  ck_assert_int_eq(try_restore(e, p, (size_t)plen, NULL, err, sizeof err), 0);
  /* another owner, another key */
  ck_assert_int_ne(fb_seal_verify_fd(fd, KEY, sizeof KEY, "tenant-b", &plen, err, sizeof err), 0);
  ck_assert_msg(strstr(err, "belongs to another tenant"), "%s", err);
  ck_assert_int_ne(fb_seal_verify_fd(fd, KEY, sizeof KEY, "", &plen, err, sizeof err), 0);
  uint8_t other[32];
  memcpy(other, KEY, 32);
  other[5] ^= 1;
  ck_assert_int_ne(fb_seal_verify_fd(fd, other, sizeof other, "tenant-a", &plen, err, sizeof err),
                   0);
  ck_assert_msg(strstr(err, "modified or was written with another server key"), "%s", err);
  ck_assert_ptr_null(fb_seal_begin(KEY, 16, "", fdsink, &fd)); /* a short key */
  fb_engine_destroy(e);
  free(p);
  close(fd);
}
END_TEST

START_TEST(seal_every_flip_and_cut_refused) {
  char path[64], err[512];
  int fd = sealed_file("", path, sizeof path);
  size_t n = 0;
  uint8_t *p = file_bytes(fd, &n);
  close(fd);
  uint64_t plen;
  for (size_t i = 0; i < n; i++) {
    p[i] ^= 0x01;
    int f = bytes_fd(p, n);
    ck_assert_msg(fb_seal_verify_fd(f, KEY, sizeof KEY, "", &plen, err, sizeof err) != 0,
                  "byte %zu flipped was accepted", i);
    close(f);
    p[i] ^= 0x01;
  }
  for (size_t k = 0; k < n; k++) {
    int f = bytes_fd(p, k);
    ck_assert_msg(fb_seal_verify_fd(f, KEY, sizeof KEY, "", &plen, err, sizeof err) != 0,
                  "cut to %zu bytes was accepted", k);
    if (k > 8) ck_assert_msg(strstr(err, "truncated") || strstr(err, "modified"), "%s", err);
    close(f);
  }
  /* another format in the trailer: named before the MAC is checked */
  size_t fmt_at = n - (8 + 4 + 4 + 0 + 8 + 32 + 4 + 8) + 8;
  p[fmt_at] = FB_CHECKPOINT_FORMAT + 1;
  int f = bytes_fd(p, n);
  ck_assert_int_ne(fb_seal_verify_fd(f, KEY, sizeof KEY, "", &plen, err, sizeof err), 0);
  char want[128];
  snprintf(want, sizeof want, "written by Fusebox format %d, this server reads %d",
           FB_CHECKPOINT_FORMAT + 1, FB_CHECKPOINT_FORMAT);
  ck_assert_msg(strstr(err, want), "%s", err);
  close(f);
  free(p);
}
END_TEST

/* The seal leaves a bulk part's bytes to its SHA-256 in the manifest: a
 * flip in the fields of a large checkpoint is still refused by the seal's
 * check (the part's hash), and so is the same flip with the manifest's
 * hash made to match it (the MAC covers the manifest); the seal refuses a
 * stream that is not a checkpoint's, and one cut before its manifest. */
START_TEST(seal_covers_bulk_once) {
  run a;
  run_open(&a, "layout { dense(i: 3145728) { place w: f32 } }\n"
               "kernel k(t: i32) { for i in 0 .. 3145728 { w[i] += random() + t } }\n",
           "sync", 0);
  int k = add(a.s, a.p, "k");
  launch(a.s, k, 1);
  mbuf m = {0}, m2 = {0};
  checkpoint_to(a.s, &m);
  /* the same session with one value of w changed from the host (no
     launch): only the fields part and its hash in the manifest differ */
  size_t wb = (size_t)3145728 * 4;
  float *w = malloc(wb);
  ck_assert_int_eq(fb_field_read(a.s, 2, w, wb), 0);
  w[123457] += 1.0f;
  ck_assert_int_eq(fb_field_write(a.s, 2, w, wb), 0);
  free(w);
  checkpoint_to(a.s, &m2);
  run_close(&a);
  ck_assert_uint_eq(m.n, m2.n);
  char path[64] = "/tmp/fb_ckpt_test_XXXXXX", err[512];
  int fd = mkstemp(path);
  ck_assert_int_ge(fd, 0);
  unlink(path);
  fb_seal *s = fb_seal_begin(KEY, sizeof KEY, "", fdsink, &fd);
  ck_assert_int_eq(fb_seal_write(s, m.p, m.n), 0);
  ck_assert_int_eq(fb_seal_finish(s, err, sizeof err), 0);
  size_t n = 0;
  uint8_t *p = file_bytes(fd, &n);
  close(fd);
  uint64_t plen = 0;
  int f = bytes_fd(p, n);
  ck_assert_int_eq(fb_seal_verify_fd(f, KEY, sizeof KEY, "", &plen, err, sizeof err), 0);
  close(f);
  /* a flip in the middle of the fields */
  p[m.n / 2] ^= 0x10;
  f = bytes_fd(p, n);
  ck_assert_int_ne(fb_seal_verify_fd(f, KEY, sizeof KEY, "", &plen, err, sizeof err), 0);
  ck_assert_msg(strstr(err, "modified or was written with another server key"), "%s", err);
  close(f);
  /* the other stream, whose manifest lists its own fields' hash, under
     the first one's seal: the MAC over the manifest refuses it */
  memcpy(p, m2.p, m2.n);
  f = bytes_fd(p, n);
  ck_assert_int_ne(fb_seal_verify_fd(f, KEY, sizeof KEY, "", &plen, err, sizeof err), 0);
  ck_assert_msg(strstr(err, "modified or was written with another server key"), "%s", err);
  close(f);
  free(p);
  /* not a checkpoint's stream; a stream cut before its manifest */
  fd = bytes_fd((const uint8_t *)"", 0);
  s = fb_seal_begin(KEY, sizeof KEY, "", fdsink, &fd);
  ck_assert_int_ne(fb_seal_write(s, "not a checkpoint at all, no", 27), 0);
  ck_assert_int_eq(fb_seal_finish(s, err, sizeof err), FB_EIO);
  s = fb_seal_begin(KEY, sizeof KEY, "", fdsink, &fd);
  ck_assert_int_eq(fb_seal_write(s, m.p, m.n / 2), 0);
  ck_assert_int_eq(fb_seal_finish(s, err, sizeof err), FB_EIO);
  ck_assert_msg(strstr(err, "before its manifest"), "%s", err);
  close(fd);
  free(m.p);
  free(m2.p);
}
END_TEST

/* ---------------------------------------------------------------- a resume in one pass */

typedef struct fsrc {
  int fd;
  uint64_t left;
} fsrc;

static long fd_src(void *user, void *buf, size_t n) {
  fsrc *f = user;
  if (n > f->left) n = (size_t)f->left;
  if (!n) return 0;
  ssize_t r = read(f->fd, buf, n);
  if (r > 0) f->left -= (uint64_t)r;
  return r;
}

/* A sealed checkpoint's bytes through fb_seal_check_fd, then
 * fb_session_restore_sealed; *checked says whether the seal's check
 * passed. 0 (and the session in *out) or the failing code, *out NULL. */
static int resume_bytes(fb_engine *e, const uint8_t *p, size_t n, fb_session **out, int *checked,
                        char *err, size_t errlen) {
  int f = bytes_fd(p, n);
  uint64_t plen = 0;
  *out = (fb_session *)1;
  int rc = fb_seal_check_fd(f, KEY, sizeof KEY, "", &plen, err, errlen);
  *checked = rc == 0;
  if (rc) *out = NULL;
  if (!rc) {
    ck_assert_int_eq(lseek(f, 0, SEEK_SET), 0);
    fsrc src = {f, plen};
    rc = fb_session_restore_sealed(e, NULL, fd_src, &src, out, err, errlen);
    if (rc) ck_assert_ptr_null(*out); /* nothing left behind */
  }
  close(f);
  return rc;
}

static uint8_t *seal_bytes(const mbuf *m, size_t *n) {
  char path[64] = "/tmp/fb_ckpt_test_XXXXXX", err[512];
  int fd = mkstemp(path);
  ck_assert_int_ge(fd, 0);
  unlink(path);
  fb_seal *s = fb_seal_begin(KEY, sizeof KEY, "", fdsink, &fd);
  ck_assert_int_eq(fb_seal_write(s, m->p, m->n), 0);
  ck_assert_int_eq(fb_seal_finish(s, err, sizeof err), 0);
  uint8_t *p = file_bytes(fd, n);
  close(fd);
  return p;
}

/* fb_seal_check_fd checks all but the bulk parts (a flip there passes it)
 * and fb_session_restore_sealed the bulk parts as it reads them: together
 * every flipped byte and every cut of a sealed dense and a sealed sparse
 * checkpoint is refused, a flip in a bulk part as the seal's "modified",
 * and the clean file resumes into the state a plain restore gives. */
START_TEST(sealed_resume_one_pass) {
  for (int sparse = 0; sparse < 2; sparse++) {
    run a;
    mbuf m = {0};
    if (sparse) {
      run_open(&a, SPARSE_SRC, "async", 0);
      int as = add(a.s, a.p, "step"), av = add(a.s, a.p, "visit");
      for (int t = 0; t < 6; t++) {
        launch(a.s, as, t);
        launch0(a.s, av);
      }
      checkpoint_to(a.s, &m);
      run_close(&a);
    } else {
      m = tiny_checkpoint("sync");
    }
    size_t n = 0;
    uint8_t *p = seal_bytes(&m, &n);
    fb_engine *e = engine_new();
    char err[1024];
    fb_session *s = NULL;
    int checked = 0;
    ck_assert_msg(resume_bytes(e, p, n, &s, &checked, err, sizeof err) == 0, "%s", err);
    fb_session *plain = restore_from(e, &m, NULL);
    same_state(s, plain, "the one-pass resume against a plain restore");
    fb_session_destroy(plain);
    fb_session_destroy(s);
    size_t passed_check = 0;
    for (size_t i = 0; i < n; i++) {
      p[i] ^= 0x80;
      int rc = resume_bytes(e, p, n, &s, &checked, err, sizeof err);
      ck_assert_msg(rc != 0, "byte %zu of %zu flipped was accepted", i, n);
      if (checked) {
        passed_check++;
        ck_assert_msg(strstr(err, "modified or was written with another server key"),
                      "byte %zu: %s", i, err);
      }
      p[i] ^= 0x80;
    }
    /* the bulk bytes were left to the restore */
    ck_assert_uint_gt(passed_check, 0);
    ck_assert_uint_lt(passed_check, n);
    for (size_t k = 0; k < n; k++)
      ck_assert_msg(resume_bytes(e, p, k, &s, &checked, err, sizeof err) != 0,
                    "cut to %zu bytes was accepted", k);
    fb_engine_destroy(e);
    free(p);
    free(m.p);
  }
}
END_TEST

START_TEST(key_file_rules) {
  char dir[64] = "/tmp/fb_ckpt_key_XXXXXX";
  ck_assert_ptr_nonnull(mkdtemp(dir));
  char path[128], err[512];
  snprintf(path, sizeof path, "%s/checkpoint.key", dir);
  uint8_t key[FB_SEAL_KEY_MAX], key2[FB_SEAL_KEY_MAX];
  size_t kl = 0, kl2 = 0;
  ck_assert_int_eq(fb_seal_key_load(path, 0, key, &kl, err, sizeof err), FB_ENOENT);
  ck_assert_int_eq(fb_seal_key_load(path, 1, key, &kl, err, sizeof err), 0);
  ck_assert_uint_eq(kl, 32);
  struct stat st;
  ck_assert_int_eq(stat(path, &st), 0);
  ck_assert_int_eq(st.st_mode & 0777, 0600);
  ck_assert_int_eq(fb_seal_key_load(path, 1, key2, &kl2, err, sizeof err), 0); /* the same one */
  ck_assert_int_eq(memcmp(key, key2, 32), 0);
  chmod(path, 0644);
  ck_assert_int_ne(fb_seal_key_load(path, 0, key, &kl, err, sizeof err), 0);
  ck_assert_msg(strstr(err, "can be read by others"), "%s", err);
  chmod(path, 0600);
  ck_assert_int_eq(truncate(path, 16), 0);
  ck_assert_int_ne(fb_seal_key_load(path, 0, key, &kl, err, sizeof err), 0);
  ck_assert_msg(strstr(err, "16 bytes"), "%s", err);
  char link[160];
  snprintf(link, sizeof link, "%s/link.key", dir);
  ck_assert_int_eq(symlink(path, link), 0);
  ck_assert_int_ne(fb_seal_key_load(link, 0, key, &kl, err, sizeof err), 0);
  ck_assert_msg(strstr(err, "symbolic link"), "%s", err);
  unlink(link);
  unlink(path);
  rmdir(dir);
}
END_TEST

int main(void) {
  Suite *s = suite_create("checkpoint");
  TCase *tc = tcase_create("checkpoint");
  tcase_set_timeout(tc, 600);
  tcase_add_test(tc, sync_sparse_continues);
  tcase_add_test(tc, async_sparse_continues);
  tcase_add_test(tc, async_pending_continues);
  tcase_add_test(tc, sparse_activity_saved);
  tcase_add_test(tc, sync_autodiff_continues);
  tcase_add_test(tc, async_autodiff_continues);
  tcase_add_test(tc, tape_recording_refused);
  tcase_add_test(tc, failing_sink_leaves_session);
  tcase_add_test(tc, every_flipped_byte_refused);
  tcase_add_test(tc, sparse_flips_refused);
  tcase_add_test(tc, every_truncation_refused);
  tcase_add_test(tc, other_format_refused);
  tcase_add_test(tc, foreign_byte_order_refused);
  tcase_add_test(tc, over_memory_limit_refused);
  tcase_add_test(tc, large_field_chunks);
  tcase_add_test(tc, seal_round_trip);
  tcase_add_test(tc, seal_every_flip_and_cut_refused);
  tcase_add_test(tc, seal_covers_bulk_once);
  tcase_add_test(tc, sealed_resume_one_pass);
  tcase_add_test(tc, key_file_rules);
  suite_add_tcase(s, tc);
  return fbt_run(s);
}
