/* Custom gradients and the tape's memory (docs/autodiff.md, "Custom
 * gradients" and "The tape"): `kernel k(...) grad k_adj` in .fbk, "k.grad"
 * instantiating the named kernel, fb_session_set_kernel_adjoint and the
 * tape launching it instead of a generated adjoint (on the CPU JIT, sync
 * and async), every refusal of both, and the tape's bytes counted against
 * the session's memory limit. The adjoints used here differ on purpose
 * from what the pass would make (a straight-through estimator through
 * round(), which the pass differentiates to 0; an in-place square, which
 * the pass refuses), so a generated adjoint running instead fails them. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fusebox/engine.h"
#include "fusebox/ir.h"
#include "fusebox/lang.h"
#include "tests/support/support.h"

#define N 16

static const char *SRC =
    "layout {\n"
    "  dense(i: 16) { place x: f64 grad, w: f64 }\n"
    "  place loss: f64 grad\n"
    "}\n"
    "kernel snap() grad snap_ste {\n"
    "  for i in 0 .. 16 { loss[] += round(x[i]) * w[i] }\n"
    "}\n"
    "kernel snap_ste() {\n"
    "  for i in 0 .. 16 { x.grad[i] += loss.grad[] * w[i] }\n"
    "}\n"
    "kernel sq() grad sq_adj {\n"
    "  for i in 0 .. 16 { x[i] = x[i] * x[i] }\n"
    "}\n"
    "kernel sq_adj() {\n"
    "  for i in 0 .. 16 { x.grad[i] = x.grad[i] * 2.0 * sqrt(x[i]) }\n"
    "}\n"
    "kernel total() {\n"
    "  for i in 0 .. 16 { loss[] += x[i] * w[i] }\n"
    "}\n"
    "kernel scaled(a: f64) {\n"
    "  for i in 0 .. 16 { loss[] += x[i] * a }\n"
    "}\n";

typedef struct env {
  fb_program *p;
  fb_engine *e;
  fb_session *s;
  int x, xg, w, loss;
} env;

static fb_kernel *inst(fb_program *p, const char *name) {
  fb_kernel *k = NULL;
  fb_diags d;
  fb_diags_init(&d);
  int rc = fb_program_instantiate(p, name, NULL, 0, &k, &d);
  char *m = fb_diags_render("t.fbk", SRC, &d);
  ck_assert_msg(rc == 0, "%s: %s", name, m ? m : "");
  free(m);
  fb_diags_free(&d);
  return k;
}

static int add(env *v, const char *name) {
  int id = fb_session_add_kernel(v->s, inst(v->p, name));
  ck_assert_msg(id >= 0, "%s: %s", name, fb_session_errmsg(v->s));
  return id;
}

static void open_env(env *v, const char *mode, uint64_t memory_limit) {
  memset(v, 0, sizeof *v);
  fb_diags d;
  fb_diags_init(&d);
  int rc = fb_program_parse("t.fbk", SRC, &v->p, &d);
  char *m = fb_diags_render("t.fbk", SRC, &d);
  ck_assert_msg(rc == 0, "%s", m ? m : "");
  free(m);
  fb_diags_free(&d);
  char err[512] = "";
  fb_engine_config ec = {"cpu", 1, 2};
  ck_assert_msg(fb_engine_create(&ec, &v->e, err, sizeof err) == 0, "%s", err);
  fb_session_config sc;
  memset(&sc, 0, sizeof sc);
  sc.mode = mode;
  sc.memory_limit = memory_limit;
  ck_assert_msg(fb_session_create(v->e, &sc, fb_program_layout(v->p), &v->s, err, sizeof err) == 0,
                "%s", err);
  const fb_layout *l = fb_program_layout(v->p);
  v->x = fb_layout_find(l, "x");
  v->xg = fb_layout_find(l, "x.grad");
  v->w = fb_layout_find(l, "w");
  v->loss = fb_layout_find(l, "loss");
  ck_assert(v->x >= 0 && v->xg >= 0 && v->w >= 0 && v->loss >= 0);
}

static void close_env(env *v) {
  fb_session_destroy(v->s);
  fb_engine_destroy(v->e);
  fb_program_free(v->p);
}

static void put(env *v, int f, const double *a) {
  ck_assert_msg(fb_field_write(v->s, f, a, sizeof(double) * N) == 0, "%s", fb_session_errmsg(v->s));
}
static void get(env *v, int f, double *a) {
  ck_assert_msg(fb_field_read(v->s, f, a, sizeof(double) * N) == 0, "%s", fb_session_errmsg(v->s));
}
static double get0(env *v, int f) {
  double r = 0;
  ck_assert_int_eq(fb_field_read(v->s, f, &r, sizeof r), 0);
  return r;
}
static void zero_loss(env *v) {
  double z = 0;
  ck_assert_int_eq(fb_field_write(v->s, v->loss, &z, sizeof z), 0);
}

static void inputs(double *x, double *w) {
  for (int i = 0; i < N; i++) {
    x[i] = 0.3 + 0.17 * i + 0.01 * (i % 3); /* positive, away from .5 */
    w[i] = 1.0 + 0.25 * (i % 5);
  }
}

/* "k.grad" of a kernel with `grad k_adj` is k_adj's instance; the pass
 * would make another adjoint (0 for round, a refusal for the square). */
START_TEST(fbk_grad_names_the_custom_adjoint) {
  env v;
  open_env(&v, "sync", 0);
  fb_kernel *g = inst(v.p, "snap.grad"), *a = inst(v.p, "snap_ste");
  ck_assert_ptr_eq(g, a);
  ck_assert_ptr_eq(inst(v.p, "sq.grad"), inst(v.p, "sq_adj"));
  ck_assert_str_eq(fb_program_kernel(v.p, fb_program_find_kernel(v.p, "sq"))->grad, "sq_adj");
  ck_assert_ptr_null(fb_program_kernel(v.p, fb_program_find_kernel(v.p, "total"))->grad);
  /* what the pass says of sq: the escape the custom adjoint gives */
  fb_grad_map m;
  ck_assert_int_eq(fb_grad_map_from_layout(fb_program_layout(v.p), &m), 0);
  fb_kernel *gen = NULL;
  char err[512] = "";
  ck_assert_int_eq(fb_kernel_adjoint(inst(v.p, "sq"), &m, &gen, err, sizeof err), FB_EVERIFY);
  ck_assert_msg(strstr(err, "reads field 'x' and writes it"), "%s", err);
  fb_grad_map_free(&m);
  close_env(&v);
}
END_TEST

/* The tape launches the custom adjoint: x.grad = w through round() (a
 * straight-through estimator; the generated adjoint gives 0), equal to the
 * finite difference of the surrogate loss sum(x * w). */
static void ste(const char *mode) {
  env v;
  open_env(&v, mode, 0);
  int snap = add(&v, "snap"), ste = add(&v, "snap_ste"), total = add(&v, "total");
  ck_assert_int_eq(fb_session_set_kernel_adjoint(v.s, snap, ste), 0);
  int got = -1;
  ck_assert_int_eq(fb_session_kernel_adjoint(v.s, snap, &got), 0);
  ck_assert_int_eq(got, ste);
  double x[N], w[N], g[N];
  inputs(x, w);
  put(&v, v.x, x);
  put(&v, v.w, w);
  zero_loss(&v);
  ck_assert_int_eq(fb_session_tape_begin(v.s, v.loss), 0);
  ck_assert_int_eq(fb_launch(v.s, snap, NULL, 0, NULL), 0);
  ck_assert_msg(fb_session_tape_end(v.s) == 0, "%s", fb_session_errmsg(v.s));
  ck_assert_int_eq(fb_sync(v.s), 0);
  get(&v, v.xg, g);
  double want = 0;
  for (int i = 0; i < N; i++) want += round(x[i]) * w[i];
  ck_assert(fabs(get0(&v, v.loss) - want) < 1e-12);
  for (int i = 0; i < N; i++) {
    double h = 1e-4, xp[N], lp, lm;
    memcpy(xp, x, sizeof xp);
    xp[i] = x[i] + h;
    put(&v, v.x, xp);
    zero_loss(&v);
    ck_assert_int_eq(fb_launch(v.s, total, NULL, 0, NULL), 0);
    ck_assert_int_eq(fb_sync(v.s), 0);
    lp = get0(&v, v.loss);
    xp[i] = x[i] - h;
    put(&v, v.x, xp);
    zero_loss(&v);
    ck_assert_int_eq(fb_launch(v.s, total, NULL, 0, NULL), 0);
    ck_assert_int_eq(fb_sync(v.s), 0);
    lm = get0(&v, v.loss);
    double fd = (lp - lm) / (2 * h);
    ck_assert_msg(w[i] != 0 && fabs(g[i] - w[i]) < 1e-12 && fabs(g[i] - fd) < 1e-8,
                  "%s: x.grad[%d] = %g, want %g (finite difference %g)", mode, i, g[i], w[i], fd);
  }
  close_env(&v);
}
START_TEST(tape_runs_custom_adjoint_sync) { ste("sync"); }
END_TEST
START_TEST(tape_runs_custom_adjoint_async) { ste("async"); }
END_TEST

/* A kernel the pass refuses (x read and overwritten in one loop) gets its
 * gradient from its custom adjoint: loss = sum(x0^2 * w), d/dx0 = 2 x0 w,
 * against central finite differences of the same two launches. */
static void in_place(const char *mode) {
  env v;
  open_env(&v, mode, 0);
  int sq = add(&v, "sq"), adj = add(&v, "sq_adj"), total = add(&v, "total");
  int gen = -1;
  ck_assert_int_eq(fb_session_kernel_adjoint(v.s, sq, &gen), FB_EVERIFY); /* refused ... */
  ck_assert_int_eq(fb_session_set_kernel_adjoint(v.s, sq, adj), 0);     /* ... escaped */
  double x[N], w[N], g[N];
  inputs(x, w);
  put(&v, v.w, w);
  put(&v, v.x, x);
  zero_loss(&v);
  ck_assert_int_eq(fb_session_tape_begin(v.s, v.loss), 0);
  ck_assert_int_eq(fb_launch(v.s, sq, NULL, 0, NULL), 0);
  ck_assert_int_eq(fb_launch(v.s, total, NULL, 0, NULL), 0);
  ck_assert_msg(fb_session_tape_end(v.s) == 0, "%s", fb_session_errmsg(v.s));
  ck_assert_int_eq(fb_sync(v.s), 0);
  get(&v, v.xg, g);
  for (int i = 0; i < N; i++) {
    double h = 1e-5, xp[N], l[2];
    for (int sgn = 0; sgn < 2; sgn++) {
      memcpy(xp, x, sizeof xp);
      xp[i] = x[i] + (sgn ? -h : h);
      put(&v, v.x, xp);
      zero_loss(&v);
      ck_assert_int_eq(fb_launch(v.s, sq, NULL, 0, NULL), 0);
      ck_assert_int_eq(fb_launch(v.s, total, NULL, 0, NULL), 0);
      ck_assert_int_eq(fb_sync(v.s), 0);
      l[sgn] = get0(&v, v.loss);
    }
    double fd = (l[0] - l[1]) / (2 * h);
    ck_assert_msg(fabs(g[i] - 2 * x[i] * w[i]) < 1e-12 && fabs(g[i] - fd) < 1e-6 * fabs(fd),
                  "%s: x.grad[%d] = %.17g, want %.17g (finite difference %.17g)", mode, i, g[i],
                  2 * x[i] * w[i], fd);
  }
  close_env(&v);
}
START_TEST(rule_breaking_kernel_sync) { in_place("sync"); }
END_TEST
START_TEST(rule_breaking_kernel_async) { in_place("async"); }
END_TEST

/* Every refusal of fb_session_set_kernel_adjoint names both kernels, and
 * the session goes on. */
START_TEST(engine_refusals) {
  env v;
  open_env(&v, "sync", 0);
  int snap = add(&v, "snap"), ste = add(&v, "snap_ste"), scaled = add(&v, "scaled");
  int total = add(&v, "total"), sq = add(&v, "sq"), adj = add(&v, "sq_adj");
  ck_assert_int_eq(fb_session_set_kernel_adjoint(v.s, snap, snap), FB_EINVAL);
  ck_assert_msg(strstr(fb_session_errmsg(v.s), "'snap' cannot be its own adjoint"), "%s",
                fb_session_errmsg(v.s));
  ck_assert_int_eq(fb_session_set_kernel_adjoint(v.s, snap, scaled), FB_EINVAL);
  ck_assert_msg(strstr(fb_session_errmsg(v.s),
                       "'scaled' cannot be the adjoint of 'snap': 'snap' takes () and 'scaled' "
                       "takes (f64)"),
                "%s", fb_session_errmsg(v.s));
  ck_assert_int_eq(fb_session_set_kernel_adjoint(v.s, snap, 999), FB_ENOENT);
  ck_assert_int_eq(fb_session_set_kernel_adjoint(v.s, -1, snap), FB_ENOENT);
  ck_assert_int_eq(fb_session_set_kernel_adjoint(v.s, snap, ste), 0);
  ck_assert_int_eq(fb_session_set_kernel_adjoint(v.s, snap, ste), 0); /* the same pair again */
  ck_assert_int_eq(fb_session_set_kernel_adjoint(v.s, snap, adj), FB_EINVAL);
  ck_assert_msg(strstr(fb_session_errmsg(v.s), "'snap' already has the adjoint 'snap_ste'"), "%s",
                fb_session_errmsg(v.s));
  /* chains: an adjoint with an adjoint of its own, a custom adjoint given one */
  ck_assert_int_eq(fb_session_set_kernel_adjoint(v.s, total, snap), FB_EINVAL);
  ck_assert_msg(strstr(fb_session_errmsg(v.s), "has an adjoint of its own ('snap_ste')") &&
                    strstr(fb_session_errmsg(v.s), "do not chain"),
                "%s", fb_session_errmsg(v.s));
  ck_assert_int_eq(fb_session_set_kernel_adjoint(v.s, ste, adj), FB_EINVAL);
  ck_assert_msg(strstr(fb_session_errmsg(v.s), "'snap_ste' cannot have the adjoint 'sq_adj': it "
                                               "is itself a custom adjoint"),
                "%s", fb_session_errmsg(v.s));
  /* a generated adjoint was made: naming another one now is refused */
  int g = -1;
  ck_assert_int_eq(fb_session_kernel_adjoint(v.s, total, &g), 0);
  ck_assert_int_eq(fb_session_set_kernel_adjoint(v.s, total, adj), FB_EINVAL);
  ck_assert_msg(strstr(fb_session_errmsg(v.s), "(made from its IR)"), "%s", fb_session_errmsg(v.s));
  /* the session goes on */
  ck_assert_int_eq(fb_session_set_kernel_adjoint(v.s, sq, adj), 0);
  ck_assert_int_eq(fb_launch(v.s, total, NULL, 0, NULL), 0);
  ck_assert_int_eq(fb_sync(v.s), 0);
  close_env(&v);
}
END_TEST

/* .fbk: each refusal at the position of the name after `grad`. */
static void fbk_refused(const char *src, const char *want) {
  fb_program *p = NULL;
  fb_diags d;
  fb_diags_init(&d);
  int rc = fb_program_parse("g.fbk", src, &p, &d);
  char *m = fb_diags_render("g.fbk", src, &d);
  ck_assert_msg(rc == FB_EPARSE && m && strstr(m, want), "want '%s', got rc %d:\n%s", want, rc,
                m ? m : "");
  free(m);
  fb_diags_free(&d);
}

START_TEST(fbk_refusals) {
#define L "layout { dense(i: 4) { place x: f32 grad, y: f32 grad } }\n"
  fbk_refused(L "kernel k() grad nope { for i in 0 .. 4 { y[i] = x[i] } }\n",
              "g.fbk:2:17: error: kernel 'k' names 'nope' as its adjoint, but the program has no "
              "kernel 'nope'");
  fbk_refused(L "func h() { return 1 }\nkernel k() grad h { for i in 0 .. 4 { y[i] = x[i] } }\n",
              "g.fbk:3:17: error: kernel 'k' names 'h' as its adjoint, which is a func");
  fbk_refused(L "kernel k() grad k { for i in 0 .. 4 { y[i] = x[i] } }\n",
              "g.fbk:2:17: error: kernel 'k' names itself as its adjoint");
  fbk_refused(L "kernel k(a: f32) grad ka { for i in 0 .. 4 { y[i] = x[i] * a } }\n"
                "kernel ka(b: f32) { for i in 0 .. 4 { x.grad[i] += y.grad[i] * b } }\n",
              "g.fbk:2:23: error: kernel 'ka' cannot be the adjoint of 'k': parameter 1 is "
              "'a: f32' in 'k' and 'b: f32' in 'ka'");
  fbk_refused(L "kernel k(a: f32) grad ka { for i in 0 .. 4 { y[i] = x[i] * a } }\n"
                "kernel ka(a: f32, t: i32) { for i in 0 .. 4 { x.grad[i] += y.grad[i] * a } }\n",
              "'k' takes 1 parameters and 'ka' 2 ('ka' has 't' too)");
  fbk_refused(L "kernel k() grad ka { for i in 0 .. 4 { y[i] = x[i] } }\n"
                "kernel ka() grad kb { for i in 0 .. 4 { x.grad[i] += y.grad[i] } }\n"
                "kernel kb() { for i in 0 .. 4 { x.grad[i] += 1.0 } }\n",
              "g.fbk:2:17: error: kernel 'k' names 'ka' as its adjoint, which names 'kb' as its "
              "own adjoint: custom adjoints do not chain");
  fbk_refused(L "kernel k() grad { for i in 0 .. 4 { y[i] = x[i] } }\n",
              "the name of the kernel that is this kernel's adjoint after 'grad'");
#undef L
}
END_TEST

/* The tape's memory counts against the session's memory limit: a tape
 * that would pass it refuses the launch (FB_EQUOTA naming the tape and the
 * bytes); the tape goes on, ends, gives its memory back, and the session
 * goes on. */
START_TEST(tape_memory_charged) {
  const uint64_t limit = 256 * 1024;
  env v;
  open_env(&v, "sync", limit);
  int scaled = add(&v, "scaled");
  fb_counters c0, c1;
  fb_session_counters(v.s, &c0);
  fb_value a = {FB_T_F64, {.f = 2.0}};
  ck_assert_int_eq(fb_session_tape_begin(v.s, v.loss), 0);
  int n = 0, rc = 0;
  while (n < 100000 && (rc = fb_launch(v.s, scaled, &a, 1, NULL)) == 0) n++;
  ck_assert_msg(rc == FB_EQUOTA, "%d launches recorded, rc %d", n, rc);
  const char *m = fb_session_errmsg(v.s);
  ck_assert_msg(strstr(m, "kernel 'scaled': the tape over 'loss' needs ") &&
                    strstr(m, "bytes for its") &&
                    strstr(m, "past the session's memory limit of 262144 bytes"),
                "%s", m);
  ck_assert_msg(n > 1000, "only %d launches fit", n); /* 256 KiB holds thousands */
  fb_session_counters(v.s, &c1);
  ck_assert_msg(c1.device_bytes > c0.device_bytes, "the tape's bytes are not counted: %llu -> %llu",
                (unsigned long long)c0.device_bytes, (unsigned long long)c1.device_bytes);
  ck_assert_uint_le(c1.device_bytes, limit);
  ck_assert_msg(fb_session_tape_end(v.s) == 0, "%s", fb_session_errmsg(v.s));
  ck_assert_int_eq(fb_sync(v.s), 0);
  double g[N];
  get(&v, v.xg, g);
  for (int i = 0; i < N; i++) ck_assert(g[i] == 2.0 * n);
  fb_session_counters(v.s, &c1);
  ck_assert_uint_eq(c1.device_bytes, c0.device_bytes); /* given back */
  /* a second tape fits as many launches again */
  ck_assert_int_eq(fb_session_tape_begin(v.s, v.loss), 0);
  int n2 = 0;
  while (n2 < 100000 && fb_launch(v.s, scaled, &a, 1, NULL) == 0) n2++;
  ck_assert_int_eq(n2, n);
  ck_assert_int_eq(fb_session_tape_end(v.s), 0);
  ck_assert_int_eq(fb_launch(v.s, scaled, &a, 1, NULL), 0);
  ck_assert_int_eq(fb_sync(v.s), 0);
  close_env(&v);
}
END_TEST

static Suite *adcustom_suite(void) {
  Suite *s = suite_create("adcustom");
  TCase *t = tcase_create("custom");
  tcase_set_timeout(t, 300);
  tcase_add_test(t, fbk_grad_names_the_custom_adjoint);
  tcase_add_test(t, tape_runs_custom_adjoint_sync);
  tcase_add_test(t, tape_runs_custom_adjoint_async);
  tcase_add_test(t, rule_breaking_kernel_sync);
  tcase_add_test(t, rule_breaking_kernel_async);
  tcase_add_test(t, engine_refusals);
  tcase_add_test(t, fbk_refusals);
  tcase_add_test(t, tape_memory_charged);
  suite_add_tcase(s, t);
  return s;
}

int main(void) { return fbt_run(adcustom_suite()); }
