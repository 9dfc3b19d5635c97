/* The tape and adjoints registered by the engine (engine/tape.c,
 * docs/autodiff.md "The tape"): fb_session_kernel_adjoint and
 * fb_session_tape_begin / _end on the CPU JIT, in sync and async mode:
 * gradients against the derivative worked out by hand and against central
 * finite differences of the loss the engine computes, the clearing of stale
 * gradients, the same gradients in sync, async and async without each pass,
 * the optimizer's counters on a tape in a loop (the forward pass nobody
 * reads removed, the clears fused), and every refusal with the session
 * going on after it. The same through fuseboxd and libfusebox
 * (fb_remote_kernel_adjoint, fb_remote_tape_begin / _end), with sessions in
 * worker processes and in threads. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fusebox/client.h"
#include "fusebox/engine.h"
#include "fusebox/ir.h"
#include "tests/support/support.h"

#define N 64

/* y = sin(x) * s (a store), loss = sum y^2 (atomic adds), and kernels that
 * break the rules. x, y and loss have gradients; c has none. */
static const char *PROGRAM =
    "layout {\n"
    "  dense(i: 64) {\n"
    "    place x: f64\n"
    "    place x.grad: f64\n"
    "    place y: f64\n"
    "    place y.grad: f64\n"
    "    place c: f64\n"
    "  }\n"
    "  place loss: f64\n"
    "  place loss.grad: f64\n"
    "  place nograd: f64\n"
    "}\n"
    "kernel zero_loss() {\n"
    "  %0 = const.f64 0.0\n"
    "  store loss[], %0\n"
    "}\n"
    "kernel square(f64) {\n"
    "  %0 = arg.f64 0\n"
    "  %1 = const.i32 0\n"
    "  %2 = const.i32 64\n"
    "  par_for %3 in %1 .. %2 {\n"
    "    %4 = loop_index.i32 %3, 0\n"
    "    %5 = load.f64 x[%4]\n"
    "    %6 = sin.f64 %5\n"
    "    %7 = mul.f64 %6, %0\n"
    "    store y[%4], %7\n"
    "  }\n"
    "}\n"
    "kernel sum() {\n"
    "  %0 = const.i32 0\n"
    "  %1 = const.i32 64\n"
    "  par_for %2 in %0 .. %1 {\n"
    "    %3 = loop_index.i32 %2, 0\n"
    "    %4 = load.f64 y[%3]\n"
    "    %5 = mul.f64 %4, %4\n"
    "    %6 = atomic_add.f64 loss[], %5\n"
    "  }\n"
    "}\n"
    "kernel twice() {\n"
    "  %0 = const.i32 0\n"
    "  %1 = const.i32 64\n"
    "  par_for %2 in %0 .. %1 {\n"
    "    %3 = loop_index.i32 %2, 0\n"
    "    %4 = load.f64 x[%3]\n"
    "    %5 = const.f64 2.0\n"
    "    %6 = mul.f64 %4, %5\n"
    "    store x[%3], %6\n"
    "  }\n"
    "}\n"
    "kernel lose() {\n"
    "  %0 = const.i32 0\n"
    "  %1 = const.i32 64\n"
    "  par_for %2 in %0 .. %1 {\n"
    "    %3 = loop_index.i32 %2, 0\n"
    "    %4 = load.f64 x[%3]\n"
    "    store c[%3], %4\n"
    "  }\n"
    "}\n";

typedef struct prog {
  fb_engine *e;
  fb_session *s;
  fb_layout *l;
  fb_kernel **ks;
  int nk;
  int zero, square, sum, twice, lose; /* kernel ids */
} prog;

static int field(prog *p, const char *name) {
  int f = fb_layout_find(p->l, name);
  ck_assert_msg(f >= 0, "no field %s", name);
  return f;
}

static int kid(prog *p, const char *name) {
  int k = fb_session_find_kernel(p->s, name);
  ck_assert_msg(k >= 0, "no kernel %s", name);
  return k;
}

/* passes: fb_session_config.passes (0: all); mode "sync" or "async" */
static void open_prog(prog *p, const char *mode, unsigned passes) {
  memset(p, 0, sizeof *p);
  fb_diags d;
  fb_diags_init(&d);
  ck_assert_int_eq(fb_ir_parse(PROGRAM, &p->l, &p->ks, &p->nk, &d), 0);
  fb_diags_free(&d);
  char err[512] = "";
  fb_engine_config ec = {"cpu", 1, 2};
  ck_assert_msg(fb_engine_create(&ec, &p->e, err, sizeof err) == 0, "%s", err);
  fb_session_config sc;
  memset(&sc, 0, sizeof sc);
  sc.mode = mode;
  sc.passes = passes;
  ck_assert_msg(fb_session_create(p->e, &sc, p->l, &p->s, err, sizeof err) == 0, "%s", err);
  for (int i = 0; i < p->nk; i++)
    ck_assert_msg(fb_session_add_kernel(p->s, p->ks[i]) >= 0, "%s", fb_session_errmsg(p->s));
  p->zero = kid(p, "zero_loss");
  p->square = kid(p, "square");
  p->sum = kid(p, "sum");
  p->twice = kid(p, "twice");
  p->lose = kid(p, "lose");
}

static void close_prog(prog *p) {
  fb_session_destroy(p->s);
  fb_engine_destroy(p->e);
  for (int i = 0; i < p->nk; i++) fb_kernel_free(p->ks[i]);
  free(p->ks);
  fb_layout_free(p->l);
}

static void write_f(prog *p, const char *name, const double *v, size_t n) {
  ck_assert_msg(fb_field_write(p->s, field(p, name), v, n * sizeof *v) == 0, "%s",
                fb_session_errmsg(p->s));
}

static void read_f(prog *p, const char *name, double *v, size_t n) {
  ck_assert_msg(fb_field_read(p->s, field(p, name), v, n * sizeof *v) == 0, "%s",
                fb_session_errmsg(p->s));
}

static double xs(int i) { return 0.1 + 0.037 * i - 0.0004 * i * i; }

static void ok(prog *p, int rc) { ck_assert_msg(rc == 0, "rc %d: %s", rc, fb_session_errmsg(p->s)); }

static void launch(prog *p, int k, double arg) {
  fb_value a = {FB_T_F64, {.f = arg}};
  ok(p, fb_launch(p->s, k, k == p->square ? &a : NULL, k == p->square, NULL));
}

/* zero_loss; tape(loss) { square(s); sum() } */
static void taped(prog *p, double s) {
  launch(p, p->zero, 0);
  ok(p, fb_session_tape_begin(p->s, field(p, "loss")));
  ck_assert_int_eq(fb_session_tape_loss(p->s), field(p, "loss"));
  launch(p, p->square, s);
  launch(p, p->sum, 0);
  ok(p, fb_session_tape_end(p->s));
  ck_assert_int_eq(fb_session_tape_loss(p->s), FB_ENOENT);
}

static double loss_at(prog *p, const double *x, double s) {
  write_f(p, "x", x, N);
  launch(p, p->zero, 0);
  launch(p, p->square, s);
  launch(p, p->sum, 0);
  double l;
  read_f(p, "loss", &l, 1);
  return l;
}

static void check_gradient(const char *mode) {
  prog p;
  open_prog(&p, mode, 0);
  const double s = 1.5;
  double x[N], junk[N], g[N], yg[N], lg;
  for (int i = 0; i < N; i++) x[i] = xs(i), junk[i] = 100.0 + i;
  write_f(&p, "x", x, N);
  write_f(&p, "x.grad", junk, N); /* stale gradients: the tape clears them */
  write_f(&p, "y.grad", junk, N);
  taped(&p, s);
  read_f(&p, "x.grad", g, N);
  read_f(&p, "loss.grad", &lg, 1);
  read_f(&p, "y.grad", yg, N);
  ck_assert_msg(lg == 1.0, "loss.grad %g", lg);
  for (int i = 0; i < N; i++) {
    double want = 2 * s * s * sin(x[i]) * cos(x[i]);
    ck_assert_msg(fabs(g[i] - want) <= 1e-12 * (1 + fabs(want)), "%s: x.grad[%d] = %.17g, want %.17g",
                  mode, i, g[i], want);
    /* y is written by a store: its gradient is used up by the adjoint */
    ck_assert_msg(yg[i] == 0.0, "y.grad[%d] = %g", i, yg[i]);
  }
  /* a second tape gives the same gradient, not twice it */
  taped(&p, s);
  double g2[N];
  read_f(&p, "x.grad", g2, N);
  ck_assert_int_eq(memcmp(g, g2, sizeof g), 0);
  /* central finite differences of the loss the engine computes */
  for (int i = 0; i < N; i += 7) {
    double h = 1e-6, xp[N], xm[N];
    memcpy(xp, x, sizeof x);
    memcpy(xm, x, sizeof x);
    xp[i] += h;
    xm[i] -= h;
    double fd = (loss_at(&p, xp, s) - loss_at(&p, xm, s)) / (2 * h);
    ck_assert_msg(fabs(fd - g[i]) <= 1e-6 * (1 + fabs(g[i])), "%s: fd %.12g, x.grad[%d] %.12g",
                  mode, fd, i, g[i]);
  }
  close_prog(&p);
}

START_TEST(tape_gradient_sync) { check_gradient("sync"); }
END_TEST

START_TEST(tape_gradient_async) { check_gradient("async"); }
END_TEST

START_TEST(kernel_adjoint_registered_once) {
  prog p;
  open_prog(&p, "sync", 0);
  int a1 = -1, a2 = -1;
  ok(&p, fb_session_kernel_adjoint(p.s, p.square, &a1));
  ok(&p, fb_session_kernel_adjoint(p.s, p.square, &a2));
  ck_assert_int_eq(a1, a2);
  ck_assert_int_eq(fb_session_find_kernel(p.s, "square.grad"), a1);
  ck_assert_int_eq(fb_session_kernel_count(p.s), p.nk + 1);
  /* launched by hand: y.grad = 1 gives x.grad = s cos x */
  double x[N], one[N], zero[N] = {0}, g[N];
  for (int i = 0; i < N; i++) x[i] = xs(i), one[i] = 1.0;
  write_f(&p, "x", x, N);
  write_f(&p, "y.grad", one, N);
  write_f(&p, "x.grad", zero, N);
  fb_value s = {FB_T_F64, {.f = 0.5}};
  ok(&p, fb_launch(p.s, a1, &s, 1, NULL));
  read_f(&p, "x.grad", g, N);
  for (int i = 0; i < N; i++) ck_assert(fabs(g[i] - 0.5 * cos(x[i])) < 1e-14);
  /* dropping kernels forgets the adjoint made after them */
  fb_session_drop_kernels(p.s, p.nk);
  ok(&p, fb_session_kernel_adjoint(p.s, p.square, &a2));
  ck_assert_int_eq(a2, p.nk);
  close_prog(&p);
}
END_TEST

static void assert_err(prog *p, int rc, int want, const char *phrase) {
  const char *m = fb_session_errmsg(p->s);
  ck_assert_msg(rc == want, "rc %d (want %d): %s", rc, want, m);
  ck_assert_msg(strstr(m, phrase), "'%s' lacks '%s'", m, phrase);
  ck_assert_msg(!strchr(m, '%'), "IR values in '%s'", m);
}

START_TEST(refusals_and_the_session_goes_on) {
  prog p;
  open_prog(&p, "async", 0);
  int adj;
  /* adjoints the pass refuses: named by kernel and rule, without %N */
  assert_err(&p, fb_session_kernel_adjoint(p.s, p.twice, &adj), FB_EVERIFY,
             "kernel 'twice'");
  ck_assert_msg(strstr(fb_session_errmsg(p.s), "field 'x'") &&
                    strstr(fb_session_errmsg(p.s), "split the kernel"),
                "%s", fb_session_errmsg(p.s));
  assert_err(&p, fb_session_kernel_adjoint(p.s, p.lose, &adj), FB_EVERIFY, "give 'c' a gradient");
  assert_err(&p, fb_session_kernel_adjoint(p.s, 99, &adj), FB_ENOENT, "no kernel with id 99");
  /* losses that cannot be */
  assert_err(&p, fb_session_tape_begin(p.s, field(&p, "nograd")), FB_EINVAL,
             "the loss 'nograd' has no gradient");
  assert_err(&p, fb_session_tape_begin(p.s, field(&p, "x")), FB_EINVAL, "0-D");
  assert_err(&p, fb_session_tape_begin(p.s, 0), FB_EINVAL, "must be a field");
  assert_err(&p, fb_session_tape_end(p.s), FB_EINVAL, "no tape is recording");
  /* nesting: refused, and the first tape goes on recording */
  ok(&p, fb_session_tape_begin(p.s, field(&p, "loss")));
  assert_err(&p, fb_session_tape_begin(p.s, field(&p, "loss")), FB_EINVAL,
             "already recording");
  ck_assert_int_eq(fb_session_tape_loss(p.s), field(&p, "loss"));
  /* a launch whose adjoint is refused: reported at the end, blamed on it */
  launch(&p, p.square, 1.0);
  uint64_t blamed_no;
  fb_counters c;
  fb_session_counters(p.s, &c);
  blamed_no = c.launches;
  launch(&p, p.twice, 0);
  launch(&p, p.sum, 0);
  int rc = fb_session_tape_end(p.s);
  assert_err(&p, rc, FB_EVERIFY, "launch 2 of the tape (kernel 'twice'");
  uint64_t launch_no;
  int kernel;
  ck_assert_int_eq(fb_session_error_launch(p.s, &launch_no, &kernel), 0);
  ck_assert_int_eq(kernel, p.twice);
  ck_assert_uint_eq(launch_no, blamed_no);
  ck_assert_int_eq(fb_session_tape_loss(p.s), FB_ENOENT);
  ok(&p, fb_sync(p.s));
  /* the session goes on: a good tape works */
  double x[N], g[N];
  for (int i = 0; i < N; i++) x[i] = xs(i);
  write_f(&p, "x", x, N);
  taped(&p, 2.0);
  read_f(&p, "x.grad", g, N);
  for (int i = 0; i < N; i++) ck_assert(fabs(g[i] - 8 * sin(x[i]) * cos(x[i])) < 1e-12);
  /* a session destroyed while a tape records frees it (ASan: no leak) */
  ok(&p, fb_session_tape_begin(p.s, field(&p, "loss")));
  launch(&p, p.square, 1.0);
  close_prog(&p);
}
END_TEST

/* The paper's pattern: every step resets the loss, tapes the energy and
 * uses the gradient; nothing reads the loss, so in async mode the forward
 * reductions are dead stores, and the clears fuse. */
static void run_steps(prog *p, int steps, double *g, double *x_out) {
  double x[N];
  for (int i = 0; i < N; i++) x[i] = xs(i);
  write_f(p, "x", x, N);
  for (int k = 0; k < steps; k++) taped(p, 1.0 + 0.25 * k);
  ok(p, fb_sync(p->s));
  read_f(p, "x.grad", g, N);
  read_f(p, "x", x_out, N);
}

START_TEST(async_removes_dead_forward_and_fuses_clears) {
  prog ps, pa;
  open_prog(&ps, "sync", 0);
  open_prog(&pa, "async", 0);
  double gs[N], ga[N], xs_[N], xa[N];
  fb_counters c0s, c0a, cs, ca;
  ok(&pa, fb_sync(pa.s));
  fb_session_counters(ps.s, &c0s);
  fb_session_counters(pa.s, &c0a);
  run_steps(&ps, 10, gs, xs_);
  run_steps(&pa, 10, ga, xa);
  fb_session_counters(ps.s, &cs);
  fb_session_counters(pa.s, &ca);
  ck_assert_int_eq(memcmp(gs, ga, sizeof gs), 0);
  ck_assert_int_eq(memcmp(xs_, xa, sizeof xa), 0);
  uint64_t ts = cs.tasks_launched - c0s.tasks_launched, ta = ca.tasks_launched - c0a.tasks_launched;
  fprintf(stderr, "tape x10: tasks sync %llu, async %llu; dead stores removed %llu, fused %llu\n",
          (unsigned long long)ts, (unsigned long long)ta, (unsigned long long)ca.dead_stores_removed,
          (unsigned long long)ca.tasks_fused);
  ck_assert_uint_gt(ca.dead_stores_removed, 0);
  ck_assert_uint_gt(ca.tasks_fused, 0);
  ck_assert_uint_lt(ta, ts);
  close_prog(&ps);
  close_prog(&pa);
}
END_TEST

START_TEST(same_gradients_under_every_pass_subset) {
  prog ref;
  open_prog(&ref, "sync", 0);
  double gr[N], xr[N];
  run_steps(&ref, 3, gr, xr);
  close_prog(&ref);
  for (unsigned m = 0; m < 16; m++) {
    prog p;
    open_prog(&p, "async", m | FB_PASSES_EXACT);
    double g[N], x[N];
    run_steps(&p, 3, g, x);
    ck_assert_msg(memcmp(g, gr, sizeof g) == 0, "passes 0x%x: gradients differ from sync", m);
    close_prog(&p);
  }
}
END_TEST

/* ---------------------------------------------------------------- through fuseboxd */

static fb_daemon D;
static fb_client *C;

static void start(const char *isolation) {
  char listen[128];
  if (!strcmp(isolation, "thread"))
    snprintf(listen, sizeof listen, "unix:/tmp/fusebox-tape-%d.sock", (int)getpid());
  else snprintf(listen, sizeof listen, "127.0.0.1:0");
  const char *args[] = {"--log-level", "warn", "--isolation", isolation, NULL};
  char path[1024], err[512] = "";
  const char *b = getenv("FB_BUILD_DIR");
  snprintf(path, sizeof path, "%s/server/fuseboxd", b ? b : "build");
  ck_assert_msg(fb_daemon_start(path, listen, args, &D, err, sizeof err) == 0, "fuseboxd: %s", err);
  ck_assert_int_eq(fb_client_connect(D.address, NULL, &C, err, sizeof err), 0);
}

static void stop(void) {
  fb_client_close(C);
  C = NULL;
  int st = -1;
  fb_daemon_stop(&D, 30, &st);
  ck_assert_msg(st == 0, "fuseboxd exited with status %d", st);
}

static void rok(fb_remote *r, int64_t rc) {
  ck_assert_msg(rc >= 0, "rc %lld: %s", (long long)rc, fb_remote_errmsg(r));
}

static void remote_tape(const char *isolation, const char *mode) {
  start(isolation);
  prog p; /* the same program run here, for the expected gradients */
  open_prog(&p, mode, 0);
  fb_remote_options o;
  fb_remote_options_init(&o);
  o.mode = mode;
  o.backend = "cpu";
  fb_remote *r = NULL;
  ck_assert_msg(fb_remote_open(C, &o, p.l, &r) == 0, "%s", fb_client_errmsg(C));
  int id[16];
  for (int i = 0; i < p.nk; i++) {
    id[i] = fb_remote_add_kernel(r, p.ks[i]);
    rok(r, id[i]);
  }
  int kz = id[0], ksq = id[1], ksum = id[2], ktw = id[3];
  int loss = field(&p, "loss"), fx = field(&p, "x"), fxg = field(&p, "x.grad");
  double x[N], g[N], want[N];
  for (int i = 0; i < N; i++) x[i] = xs(i);
  ck_assert_int_eq(fb_remote_field_write(r, fx, x, sizeof x), 0);
  write_f(&p, "x", x, N);
  fb_value s = {FB_T_F64, {.f = 1.25}};
  /* the tape, twice: the second must not add to the first */
  for (int rep = 0; rep < 2; rep++) {
    rok(r, fb_remote_launch(r, kz, NULL, 0));
    rok(r, fb_remote_tape_begin(r, loss));
    rok(r, fb_remote_launch(r, ksq, &s, 1));
    rok(r, fb_remote_launch(r, ksum, NULL, 0));
    rok(r, fb_remote_tape_end(r));
  }
  fb_sync_result res;
  ck_assert_msg(fb_remote_sync(r, &res) == 0, "%s", fb_remote_errmsg(r));
  ck_assert_int_eq(fb_remote_field_read(r, fxg, g, sizeof g), 0);
  taped(&p, 1.25);
  read_f(&p, "x.grad", want, N);
  ck_assert_int_eq(memcmp(g, want, sizeof g), 0);
  for (int i = 0; i < N; i++)
    ck_assert(fabs(g[i] - 2 * 1.25 * 1.25 * sin(x[i]) * cos(x[i])) < 1e-12);
  /* k.grad, registered and launched by hand */
  int ka = fb_remote_kernel_adjoint(r, ksq);
  rok(r, ka);
  ck_assert_int_eq(fb_remote_kernel_adjoint(r, ksq), ka); /* once per kernel */
  double one[N], zero[N] = {0};
  for (int i = 0; i < N; i++) one[i] = 1.0;
  ck_assert_int_eq(fb_remote_field_write(r, field(&p, "y.grad"), one, sizeof one), 0);
  ck_assert_int_eq(fb_remote_field_write(r, fxg, zero, sizeof zero), 0);
  rok(r, fb_remote_launch(r, ka, &s, 1));
  ck_assert_int_eq(fb_remote_field_read(r, fxg, g, sizeof g), 0);
  for (int i = 0; i < N; i++) ck_assert(fabs(g[i] - 1.25 * cos(x[i])) < 1e-14);
  /* refusals: by the server, in the user's terms */
  ck_assert_int_eq(fb_remote_kernel_adjoint(r, ktw), FB_EVERIFY);
  ck_assert_msg(strstr(fb_remote_errmsg(r), "kernel 'twice'") && !strchr(fb_remote_errmsg(r), '%'),
                "%s", fb_remote_errmsg(r));
  rok(r, fb_remote_tape_begin(r, field(&p, "nograd")));
  int64_t seq_tw = 0;
  rok(r, fb_remote_tape_begin(r, loss));
  rok(r, fb_remote_launch(r, ksq, &s, 1));
  rok(r, seq_tw = fb_remote_launch(r, ktw, NULL, 0));
  rok(r, fb_remote_tape_end(r));
  rok(r, fb_remote_tape_end(r)); /* none recording */
  ck_assert_int_eq(fb_remote_sync(r, &res), FB_EINVAL);
  ck_assert_int_eq(res.nerrors, 3);
  ck_assert_msg(strstr(res.errors[0].msg, "'nograd' has no gradient"), "%s", res.errors[0].msg);
  ck_assert_uint_eq(res.errors[0].seq, 0); /* a mark's own error: no launch to name */
  ck_assert_uint_eq(res.errors[1].seq, (uint64_t)seq_tw); /* blamed on the launch */
  ck_assert_int_eq(res.errors[1].kernel, ktw);
  ck_assert_int_eq(res.errors[1].code, FB_EVERIFY);
  ck_assert_msg(strstr(res.errors[1].msg, "kernel 'twice'"), "%s", res.errors[1].msg);
  ck_assert_msg(strstr(res.errors[2].msg, "no tape is recording"), "%s", res.errors[2].msg);
  ck_assert_uint_eq(res.errors[2].seq, 0);
  /* the session goes on: a launch after the failed tape has its own seq */
  int64_t seq_bad = fb_remote_launch(r, kz, NULL, 0);
  rok(r, seq_bad);
  ck_assert_int_eq(fb_remote_sync(r, &res), 0);
  ck_assert_uint_eq(res.seq, (uint64_t)seq_bad);
  /* a session closed while a tape records */
  rok(r, fb_remote_tape_begin(r, loss));
  rok(r, fb_remote_launch(r, ksq, &s, 1));
  ck_assert_int_eq(fb_remote_close(r), 0);
  close_prog(&p);
  stop();
}

START_TEST(remote_tape_process_async) { remote_tape("process", "async"); }
END_TEST

START_TEST(remote_tape_thread_sync) { remote_tape("thread", "sync"); }
END_TEST

/* A tape holds its launches' arguments until it ends: at most 2^21 values
 * (engine/tape.c). 32768 launches of 64 arguments fill it exactly; the
 * next is refused with FB_EQUOTA naming the limit, and the tape still
 * ends. */
START_TEST(tape_argument_values_capped) {
  char src[8192];
  int o = snprintf(src, sizeof src,
                   "layout {\n  place loss: f64\n  place loss.grad: f64\n  place nograd: f64\n}\n"
                   "kernel many(");
  for (int i = 0; i < 64; i++) o += snprintf(src + o, sizeof src - (size_t)o, "%sf64", i ? ", " : "");
  snprintf(src + o, sizeof src - (size_t)o, ") {\n  %%0 = arg.f64 63\n  store nograd[], %%0\n}\n");
  fb_layout *l = NULL;
  fb_kernel **ks = NULL;
  int nk = 0;
  fb_diags d;
  fb_diags_init(&d);
  ck_assert_int_eq(fb_ir_parse(src, &l, &ks, &nk, &d), 0);
  fb_diags_free(&d);
  char err[512] = "";
  fb_engine *e = NULL;
  fb_engine_config ec = {"cpu", 1, 2};
  ck_assert_msg(fb_engine_create(&ec, &e, err, sizeof err) == 0, "%s", err);
  fb_session_config sc;
  memset(&sc, 0, sizeof sc);
  sc.mode = "sync";
  fb_session *s = NULL;
  ck_assert_msg(fb_session_create(e, &sc, l, &s, err, sizeof err) == 0, "%s", err);
  int k = fb_session_add_kernel(s, ks[0]);
  ck_assert_msg(k >= 0, "%s", fb_session_errmsg(s));
  fb_value args[64];
  for (int i = 0; i < 64; i++) args[i] = (fb_value){FB_T_F64, {.f = i}};
  ck_assert_int_eq(fb_session_tape_begin(s, fb_layout_find(l, "loss")), 0);
  for (int n = 0; n < 32768; n++) {
    int rc = fb_launch(s, k, args, 64, NULL);
    ck_assert_msg(rc == 0, "launch %d: %s", n, fb_session_errmsg(s));
  }
  int rc = fb_launch(s, k, args, 64, NULL);
  ck_assert_int_eq(rc, FB_EQUOTA);
  ck_assert_msg(strstr(fb_session_errmsg(s), "2097152 argument values") &&
                    strstr(fb_session_errmsg(s), "end the tape sooner"),
                "%s", fb_session_errmsg(s));
  ck_assert_int_eq(fb_session_tape_end(s), 0);
  double v = 0;
  ck_assert_int_eq(fb_field_read(s, fb_layout_find(l, "nograd"), &v, sizeof v), 0);
  ck_assert(v == 63.0);
  fb_session_destroy(s);
  fb_engine_destroy(e);
  fb_kernel_free(ks[0]);
  free(ks);
  fb_layout_free(l);
}
END_TEST

static Suite *tape_suite(void) {
  Suite *s = suite_create("tape");
  TCase *t = tcase_create("tape");
  tcase_set_timeout(t, 300);
  tcase_add_test(t, tape_gradient_sync);
  tcase_add_test(t, tape_gradient_async);
  tcase_add_test(t, kernel_adjoint_registered_once);
  tcase_add_test(t, refusals_and_the_session_goes_on);
  tcase_add_test(t, async_removes_dead_forward_and_fuses_clears);
  tcase_add_test(t, same_gradients_under_every_pass_subset);
  tcase_add_test(t, tape_argument_values_capped);
  suite_add_tcase(s, t);
  TCase *rt = tcase_create("remote");
  tcase_set_timeout(rt, 300);
  tcase_add_test(rt, remote_tape_process_async);
  tcase_add_test(rt, remote_tape_thread_sync);
  suite_add_tcase(s, rt);
  return s;
}

int main(void) { return fbt_run(tape_suite()); }
