/* Errors in the user's terms (the standards: never an internal kernel or
 * task name, never an IR value). Lowering cuts a kernel into tasks named
 * "k.t0", "k.t1", fused "a.t0+b.t0"; no message the public API hands out
 * may show them. Each error class is produced through the engine's public
 * API, in sync and async mode: out of bounds (in a loop and in serial
 * code), a compile refused (a loop, the list of active cells of a sparse
 * loop, a fused task's part), cancelled (and the task hook's words for a
 * fused task, which fuseboxd's kernel_timeout_s message uses), out of
 * memory blamed in a fused task. Each message must name the kernel, in async mode its launch, and
 * the part of the kernel by what the user wrote ("its 2nd top-level
 * loop"), and match none of `\.t[0-9]`, `%[0-9]`, `task <name>`. The
 * device failures of the CUDA backend are checked the same way in
 * test_cuda (the fake driver), and through fuseboxd in
 * tests/security/test_blame_terms.py. */
#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine_test.h"
#include "fusebox/engine.h"
#include "fusebox/ir.h"
#include "fusebox/lang.h"
#include "support.h"

static const char *src =
    "layout {\n"
    "  dense(i: 100) { place a: i32, b: i32 }\n"
    "  pointer(i: 128) as blk { dense(i: 1024) { place f: f32 } }\n"
    "  pointer(i: 128) as blk2 { dense(i: 1024) { place g: f32 } }\n"
    "}\n"
    "kernel two() {\n"
    "  for i in a { a[i] = 1 }\n"
    "  b[0] = 5\n"
    "  for i in a { b[i + 1] = 2 }\n"
    "}\n"
    "kernel ser(o: i32) { b[o] = 1 }\n"
    "kernel hog() { for i in a { f[i * 1024] = 1.0 } }\n"
    "kernel hog2() { for i in a { g[i * 1024] = 2.0 } }\n"
    "kernel sp() { for i in f { f[i] = f[i] + 1.0 } }\n";

static fb_engine *new_engine(void) {
  fb_engine_config cfg = {.backend = fbt_backend(), .compile_threads = 2, .cpu_threads = 2};
  fb_engine *e = NULL;
  char err[256];
  ck_assert_msg(fb_engine_create(&cfg, &e, err, sizeof err) == 0, "engine: %s", err);
  return e;
}

static fb_program *parse(void) {
  fb_program *p = NULL;
  fb_diags d;
  fb_diags_init(&d);
  int rc = fb_program_parse("blame.fbk", src, &p, &d);
  ck_assert_msg(rc == 0, "parse: %s", d.n ? d.v[0].msg : "?");
  fb_diags_free(&d);
  return p;
}

static fb_session *open_session(fb_engine *e, fb_program *p, const char *mode, uint64_t limit) {
  fb_session_config cfg = {.mode = mode, .seed = 7, .flush_every = -1, .memory_limit = limit};
  fb_session *s = NULL;
  char err[512] = "";
  ck_assert_msg(fb_session_create(e, &cfg, fb_program_layout(p), &s, err, sizeof err) == 0,
                "session: %s", err);
  return s;
}

/* Register kernel `name`: its id, or -1 with the session's error. */
static int add(fb_session *s, fb_program *p, const char *name) {
  fb_kernel *k = NULL;
  fb_diags d;
  fb_diags_init(&d);
  int rc = fb_program_instantiate(p, name, NULL, 0, &k, &d);
  ck_assert_msg(rc == 0, "instantiate %s: %s", name, d.n ? d.v[0].msg : fb_strerror(rc));
  fb_diags_free(&d);
  return fb_session_add_kernel(s, k);
}

/* msg names kernel `kernel` ("(launch N" after it when launch >= 0) and
 * nothing internal. */
static void user_terms(const char *msg, const char *kernel, long long launch) {
  regex_t re;
  ck_assert_int_eq(regcomp(&re, "\\.t[0-9]|%[0-9]|(^|[^A-Za-z_])task [A-Za-z_'\"]",
                           REG_EXTENDED | REG_NOSUB),
                   0);
  int hit = regexec(&re, msg, 0, NULL, 0) == 0;
  regfree(&re);
  ck_assert_msg(!hit, "an internal name in: %s", msg);
  char who[160];
  if (launch >= 0) snprintf(who, sizeof who, "kernel '%s' (launch %lld", kernel, launch);
  else snprintf(who, sizeof who, "kernel '%s'", kernel);
  ck_assert_msg(strstr(msg, who) != NULL, "\"%s\" is not in: %s", who, msg);
}

static const char *modes[] = {"sync", "async"};

/* Out of bounds in the 2nd top-level loop (after serial code), and in
 * serial code: where, in both modes, async's message sync's with the
 * launch added. */
START_TEST(out_of_bounds_names_the_loop) {
  fb_engine *e = new_engine();
  fb_program *p = parse();
  char *msg[2];
  for (int m = 0; m < 2; m++) {
    fb_session *s = open_session(e, p, modes[m], 0);
    int two = add(s, p, "two"), ser = add(s, p, "ser");
    ck_assert_int_ge(two, 0);
    ck_assert_int_ge(ser, 0);
    int rc = fb_launch(s, two, NULL, 0, NULL);
    if (!rc) rc = fb_sync(s);
    ck_assert_int_eq(rc, FB_EBOUNDS);
    msg[m] = strdup(fb_session_errmsg(s));
    user_terms(msg[m], "two", m ? 0 : -1);
    ck_assert_msg(strstr(msg[m], "indexed a field out of bounds in its 2nd top-level loop;"), "%s",
                  msg[m]);
    fb_value o = fb_value_i32(100);
    rc = fb_launch(s, ser, &o, 1, NULL);
    if (!rc) rc = fb_sync(s);
    ck_assert_int_eq(rc, FB_EBOUNDS);
    user_terms(fb_session_errmsg(s), "ser", m ? 1 : -1);
    ck_assert_msg(strstr(fb_session_errmsg(s), "out of bounds in its serial code;"), "%s",
                  fb_session_errmsg(s));
    fb_session_destroy(s);
  }
  char *at = strstr(msg[1], " (launch 0)");
  ck_assert_ptr_nonnull(at);
  memmove(at, at + strlen(" (launch 0)"), strlen(at + strlen(" (launch 0)")) + 1);
  ck_assert_str_eq(msg[0], msg[1]);
  free(msg[0]);
  free(msg[1]);
  fb_program_free(p);
  fb_engine_destroy(e);
}
END_TEST

/* The test's gate refuses every task whose (internal) name contains the
 * one it is given: fused tasks that contain it too, whose parts then run
 * one by one, that one still refused. */
static int refuse(void *user, const fb_kernel *task, char *err, size_t errlen) {
  if (!strstr(task->name, (const char *)user)) return 0;
  snprintf(err, errlen, "refused by the test's gate");
  return 1;
}

/* A compile refused: two's 2nd loop ("two.t2") and sp's list of active
 * cells ("sp.t1", listgen), in sync mode when the kernel is registered,
 * in async mode at the flush, by launch. */
START_TEST(compile_refused_names_the_part) {
  struct {
    const char *task, *kernel, *where;
  } c[] = {{"two.t2", "two", "compiling its 2nd top-level loop failed: refused by the test's gate"},
           {"sp.t1", "sp",
            "compiling the list of active cells of 'blk' for its 1st top-level loop failed: "
            "refused by the test's gate"}};
  for (int i = 0; i < 2; i++)
    for (int m = 0; m < 2; m++) {
      fb_engine *e = new_engine();
      fb_engine_set_compile_gate(e, refuse, (void *)c[i].task);
      fb_program *p = parse();
      fb_session *s = open_session(e, p, modes[m], 0);
      int k = add(s, p, c[i].kernel);
      if (m == 0) {
        ck_assert_int_lt(k, 0);
        user_terms(fb_session_errmsg(s), c[i].kernel, -1);
      } else {
        ck_assert_int_ge(k, 0);
        ck_assert_int_eq(fb_launch(s, k, NULL, 0, NULL), 0);
        ck_assert_int_eq(fb_sync(s), FB_ECOMPILE);
        user_terms(fb_session_errmsg(s), c[i].kernel, 0);
      }
      ck_assert_msg(strstr(fb_session_errmsg(s), c[i].where), "%s: %s", modes[m],
                    fb_session_errmsg(s));
      fb_session_destroy(s);
      fb_program_free(p);
      fb_engine_destroy(e);
    }
}
END_TEST

static int cancel_all(void *user, const char *kernel, const char *task, uint64_t launch) {
  (void)user;
  (void)launch;
  /* the hook's task: the kernel's name, or no internal name either */
  if (task && strcmp(task, kernel)) user_terms(task, kernel, -1);
  return kernel != NULL;
}

/* The hook's task for a fused task is its launches, in the user's terms. */
static int cancel_fused(void *user, const char *kernel, const char *task, uint64_t launch) {
  (void)launch;
  if (!kernel) return 0;
  snprintf(user, 256, "%s", task ? task : "");
  return 1;
}

START_TEST(cancelled_fused_hook_names_launches) {
  fb_engine *e = new_engine();
  fb_program *p = parse();
  fb_session *s = open_session(e, p, "async", 0);
  int hog = add(s, p, "hog"), hog2 = add(s, p, "hog2");
  char seen[256] = "";
  fb_session_set_task_hook(s, cancel_fused, seen);
  ck_assert_int_eq(fb_launch(s, hog, NULL, 0, NULL), 0);
  ck_assert_int_eq(fb_launch(s, hog2, NULL, 0, NULL), 0);
  ck_assert_int_eq(fb_sync(s), FB_ECANCELLED);
  fb_session_set_task_hook(s, NULL, NULL);
  user_terms(seen, "hog", 0);
  ck_assert_str_eq(seen, "kernel 'hog' (launch 0) fused with kernel 'hog2' (launch 1)");
  const char *msg = fb_session_errmsg(s);
  user_terms(msg, "hog", 0);
  ck_assert_msg(strstr(msg, "cancelled before its 1st top-level loop fused with kernel 'hog2' "
                            "(launch 1) ran"),
                "%s", msg);
  fb_session_destroy(s);
  fb_program_free(p);
  fb_engine_destroy(e);
}
END_TEST

START_TEST(cancelled_names_the_launch) {
  fb_engine *e = new_engine();
  fb_program *p = parse();
  for (int m = 0; m < 2; m++) {
    fb_session *s = open_session(e, p, modes[m], 0);
    int ser = add(s, p, "ser"), two = add(s, p, "two");
    fb_value o = fb_value_i32(3);
    ck_assert_int_eq(fb_launch(s, ser, &o, 1, NULL), 0);
    ck_assert_int_eq(fb_sync(s), 0);
    fb_session_set_task_hook(s, cancel_all, NULL);
    int rc = fb_launch(s, two, NULL, 0, NULL);
    if (!rc) rc = fb_sync(s);
    ck_assert_int_eq(rc, FB_ECANCELLED);
    user_terms(fb_session_errmsg(s), "two", 1);
    ck_assert_msg(strstr(fb_session_errmsg(s), "cancelled before"), "%s", fb_session_errmsg(s));
    fb_session_set_task_hook(s, NULL, NULL);
    fb_session_destroy(s);
  }
  fb_program_free(p);
  fb_engine_destroy(e);
}
END_TEST

/* Out of memory in a fused task of two launches that both take blocks:
 * the earlier is blamed and the later named as the one it may be, as
 * launches ("kernel 'hog2' (launch 1)"), never as the fused task. */
START_TEST(fused_blame_names_launches) {
  fb_engine *e = new_engine();
  fb_program *p = parse();
  const fb_layout *l = fb_program_layout(p);
  fb_session *s = open_session(e, p, "async", l->root_bytes + 64 * 1024);
  int hog = add(s, p, "hog"), hog2 = add(s, p, "hog2");
  ck_assert_int_eq(fb_launch(s, hog, NULL, 0, NULL), 0);
  ck_assert_int_eq(fb_launch(s, hog2, NULL, 0, NULL), 0);
  ck_assert_int_eq(fb_sync(s), FB_EQUOTA);
  fb_counters c;
  fb_session_counters(s, &c);
  ck_assert_uint_eq(c.tasks_fused, 1);
  const char *msg = fb_session_errmsg(s);
  user_terms(msg, "hog", 0);
  ck_assert_msg(strstr(msg, "or the later launch fused with it, kernel 'hog2' (launch 1),"), "%s",
                msg);
  fb_session_destroy(s);
  fb_program_free(p);
  fb_engine_destroy(e);
}
END_TEST

static Suite *suite(void) {
  Suite *su = suite_create("blame");
  TCase *tc = tcase_create("blame");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, out_of_bounds_names_the_loop);
  tcase_add_test(tc, compile_refused_names_the_part);
  tcase_add_test(tc, cancelled_names_the_launch);
  tcase_add_test(tc, cancelled_fused_hook_names_launches);
  tcase_add_test(tc, fused_blame_names_launches);
  suite_add_tcase(su, tc);
  return su;
}

int main(void) { return fbt_run(suite()); }
