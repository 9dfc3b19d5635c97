/* Forward-mode automatic differentiation (ir/tangent.c, docs/autodiff.md
 * "Forward mode"): tangent kernels made by fb_kernel_tangent and by the
 * .fbk front end ("k.dual"), run on the reference interpreter and the CPU
 * JIT. Checked: every differentiable op and each control form (if/else
 * with locals, serial loops with carried locals and run-time trip counts,
 * nested loops, while with break, a field updated in place) against
 * central finite differences in f64; the tangent kernel's primal results
 * bit for bit those of the kernel; the adjoint identity <Jv, w> = <v, J^T w>
 * between this pass and the reverse pass on random vectors, over fixed and
 * random kernels; the JIT (sync and async) against the interpreter; and
 * each refusal with its message and position. */
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fusebox/engine.h"
#include "fusebox/ir.h"
#include "fusebox/lang.h"
#include "tests/support/support.h"

const char *fb_interp_errmsg(const fb_interp *in);

static uint64_t rng_state;
static double urand(void) { /* [0, 1) */
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  return (double)(rng_state >> 11) / 9007199254740992.0;
}
static double uniform(double lo, double hi) { return lo + (hi - lo) * urand(); }

/* ---------------------------------------------------------------- a problem */

#define MAXP 64

typedef struct prob {
  fb_program *prog;       /* when made from .fbk */
  fb_layout *own;         /* when made from IR text */
  const fb_layout *l;
  fb_kernel *k, *t, *adj; /* adj: NULL when the reverse pass is not asked */
  fb_grad_map dual, grad;
  fb_interp *in;
  fb_value args[2];
  int nargs;
  int prim[MAXP], np;     /* every primal f64 place (not a .grad or .dual) */
  int in_f[MAXP], nin;    /* places with a dual that k reads */
  int out_f[MAXP], nout;  /* ... that k writes */
} prob;

static double *fld(prob *p, int f) { return fb_interp_field(p->in, f); }
static int64_t numel(prob *p, int f) { return fb_field_numel(p->l, f); }
static size_t bytes(prob *p, int f) { return sizeof(double) * (size_t)numel(p, f); }
static int fid(prob *p, const char *name) {
  int f = fb_layout_find(p->l, name);
  ck_assert_msg(f >= 0, "no field %s", name);
  return f;
}
static int has(const int *v, int n, int f) {
  for (int i = 0; i < n; i++)
    if (v[i] == f) return 1;
  return 0;
}

static int ends_with(const char *s, const char *suf) {
  size_t n = strlen(s), m = strlen(suf);
  return n >= m && !strcmp(s + n - m, suf);
}

/* The checks every tangent made here passes: it verifies, is a client
 * kernel (no internal op), reads back from its text, is named "<k>.dual". */
static void check_tangent(prob *p) {
  fb_diags d;
  fb_diags_init(&d);
  ck_assert_int_eq(fb_verify(p->t, &d), 0);
  char err[512] = "";
  ck_assert_msg(fb_kernel_check_public(p->t, 0, err, sizeof err) == 0, "%s", err);
  char *txt = fb_kernel_print(p->t);
  fb_kernel **back = NULL;
  int nb = 0;
  ck_assert_msg(fb_ir_parse_kernels(txt, p->l, &back, &nb, &d) == 0, "reparse:\n%s", txt);
  ck_assert_int_eq(nb, 1);
  ck_assert_msg(fb_kernel_equal(back[0], p->t), "tangent does not round-trip:\n%s", txt);
  char want[300];
  snprintf(want, sizeof want, "%s.dual", p->k->name);
  ck_assert_str_eq(p->t->name, want);
  fb_kernel_free(back[0]);
  free(back);
  free(txt);
  fb_diags_free(&d);
}

static void classify(prob *p) {
  for (int f = 0; f < p->l->nnodes; f++) {
    const fb_snode *n = &p->l->nodes[f];
    if (n->kind != FB_SN_PLACE || n->type != FB_T_F64 || ends_with(n->name, ".grad") ||
        ends_with(n->name, ".dual"))
      continue;
    ck_assert_int_lt(p->np, MAXP);
    p->prim[p->np++] = f;
  }
  for (int i = 0; i < p->k->nstmts; i++) {
    const fb_stmt *s = &p->k->stmts[i];
    if (fb_kernel_block_of(p->k, i, NULL) < 0 || s->snode < 0 || p->dual.grad[s->snode] < 0)
      continue;
    if (s->op == FB_OP_LOAD && !has(p->in_f, p->nin, s->snode)) p->in_f[p->nin++] = s->snode;
    if ((s->op == FB_OP_STORE || s->op == FB_OP_ATOMIC_ADD || s->op == FB_OP_ATOMIC_SUB) &&
        !has(p->out_f, p->nout, s->snode))
      p->out_f[p->nout++] = s->snode;
  }
  p->in = fb_interp_new(p->l, 1);
  ck_assert_ptr_nonnull(p->in);
}

/* From IR text: the layout and its first kernel; the tangent made by
 * fb_kernel_tangent (and the adjoint when with_adj). */
static void setup_ir(prob *p, const char *text, int with_adj) {
  memset(p, 0, sizeof *p);
  fb_diags d;
  fb_diags_init(&d);
  fb_kernel **ks = NULL;
  int nk = 0;
  int rc = fb_ir_parse(text, &p->own, &ks, &nk, &d);
  if (rc) ck_abort_msg("parse: %s", fb_diags_join(&d));
  fb_diags_free(&d);
  p->l = p->own;
  p->k = ks[0];
  for (int i = 1; i < nk; i++) fb_kernel_free(ks[i]);
  free(ks);
  ck_assert_int_eq(fb_dual_map_from_layout(p->l, &p->dual), 0);
  ck_assert_int_eq(fb_grad_map_from_layout(p->l, &p->grad), 0);
  char err[512] = "";
  int bad = 0;
  rc = fb_kernel_tangent(p->k, &p->dual, 0, &p->t, &bad, err, sizeof err);
  ck_assert_msg(rc == 0, "tangent: %s (%s)", fb_strerror(rc), err);
  ck_assert_int_eq(bad, -1);
  if (with_adj) {
    rc = fb_kernel_adjoint(p->k, &p->grad, &p->adj, err, sizeof err);
    ck_assert_msg(rc == 0, "adjoint: %s (%s)", fb_strerror(rc), err);
  }
  check_tangent(p);
  classify(p);
}

static fb_kernel *inst(fb_program *pr, const char *name) {
  fb_kernel *k = NULL;
  fb_diags d;
  fb_diags_init(&d);
  int rc = fb_program_instantiate(pr, name, NULL, 0, &k, &d);
  char *r = fb_diags_render("fwd.fbk", fb_program_source(pr), &d);
  ck_assert_msg(rc == 0, "instantiate %s: %s\n%s", name, fb_strerror(rc), r ? r : "");
  free(r);
  fb_diags_free(&d);
  return k;
}

/* From .fbk: kernel kname and its "kname.dual" (and "kname.grad"). The
 * program owns the kernels. */
static void setup_fbk(prob *p, const char *src, const char *kname, int with_adj) {
  memset(p, 0, sizeof *p);
  fb_diags d;
  fb_diags_init(&d);
  int rc = fb_program_parse("fwd.fbk", src, &p->prog, &d);
  if (rc) {
    char *r = fb_diags_render("fwd.fbk", src, &d);
    ck_abort_msg("parse: %s", r ? r : "");
  }
  fb_diags_free(&d);
  p->l = fb_program_layout(p->prog);
  char nm[128];
  p->k = inst(p->prog, kname);
  snprintf(nm, sizeof nm, "%s.dual", kname);
  p->t = inst(p->prog, nm);
  ck_assert_ptr_eq(inst(p->prog, nm), p->t); /* cached */
  if (with_adj) {
    snprintf(nm, sizeof nm, "%s.grad", kname);
    p->adj = inst(p->prog, nm);
  }
  ck_assert_int_eq(fb_dual_map_from_layout(p->l, &p->dual), 0);
  ck_assert_int_eq(fb_grad_map_from_layout(p->l, &p->grad), 0);
  check_tangent(p);
  classify(p);
}

static void teardown(prob *p) {
  fb_interp_free(p->in);
  if (!p->prog) {
    fb_kernel_free(p->k);
    fb_kernel_free(p->t);
    fb_kernel_free(p->adj);
  }
  fb_grad_map_free(&p->dual);
  fb_grad_map_free(&p->grad);
  if (p->prog) fb_program_free(p->prog);
  fb_layout_free(p->own);
}

static void run(prob *p, const fb_kernel *k) {
  fb_interp_set_launch(p->in, 0); /* random(): the same numbers in every run */
  int rc = fb_interp_run(p->in, k, p->args, p->nargs, NULL);
  ck_assert_msg(rc == 0, "run %s: %s: %s", k->name, fb_strerror(rc), fb_interp_errmsg(p->in));
}

/* ---------------------------------------------------------------- states */

/* Every f64 place (primal, .grad and .dual), saved and restored. */
typedef struct state {
  double *v[MAXP * 3];
  int f[MAXP * 3], n;
} state;

static void save(prob *p, state *s) {
  memset(s, 0, sizeof *s);
  for (int f = 0; f < p->l->nnodes; f++) {
    const fb_snode *n = &p->l->nodes[f];
    if (n->kind != FB_SN_PLACE || n->type != FB_T_F64) continue;
    ck_assert_int_lt(s->n, MAXP * 3);
    s->f[s->n] = f;
    s->v[s->n] = malloc(bytes(p, f));
    memcpy(s->v[s->n], fld(p, f), bytes(p, f));
    s->n++;
  }
}
static void restore(prob *p, const state *s) {
  for (int i = 0; i < s->n; i++) memcpy(fld(p, s->f[i]), s->v[i], bytes(p, s->f[i]));
}
static void drop(state *s) {
  for (int i = 0; i < s->n; i++) free(s->v[i]);
  s->n = 0;
}

/* Random primal values in [lo, hi], every .grad and .dual 0. */
static void randomize(prob *p, double lo, double hi) {
  for (int f = 0; f < p->l->nnodes; f++) {
    const fb_snode *n = &p->l->nodes[f];
    if (n->kind != FB_SN_PLACE || n->type != FB_T_F64) continue;
    double *x = fld(p, f);
    int prim = has(p->prim, p->np, f);
    for (int64_t e = 0; e < numel(p, f); e++) x[e] = prim ? uniform(lo, hi) : 0.0;
  }
}

/* A random direction per input place. */
typedef struct dir {
  double *v[MAXP];
} dir;
static void random_dir(prob *p, dir *d) {
  for (int i = 0; i < p->nin; i++) {
    d->v[i] = malloc(bytes(p, p->in_f[i]));
    for (int64_t e = 0; e < numel(p, p->in_f[i]); e++) d->v[i][e] = uniform(-1, 1);
  }
}
static void free_dir(prob *p, dir *d) {
  for (int i = 0; i < p->nin; i++) free(d->v[i]);
}

/* From state s: the inputs' duals set to v, the other duals 0, then the
 * tangent kernel: J v is in the outputs' duals. */
static void jvp(prob *p, const state *s, const dir *v) {
  restore(p, s);
  for (int f = 0; f < p->l->nnodes; f++)
    if (p->dual.grad[f] >= 0) memset(fld(p, p->dual.grad[f]), 0, bytes(p, f));
  for (int i = 0; i < p->nin; i++)
    memcpy(fld(p, p->dual.grad[p->in_f[i]]), v->v[i], bytes(p, p->in_f[i]));
  run(p, p->t);
}

/* The kernel from s with the inputs moved by eps * v: the outputs, copied. */
static double **outputs_at(prob *p, const state *s, const dir *v, double eps) {
  restore(p, s);
  for (int i = 0; i < p->nin; i++) {
    double *x = fld(p, p->in_f[i]);
    for (int64_t e = 0; e < numel(p, p->in_f[i]); e++) x[e] += eps * v->v[i][e];
  }
  run(p, p->k);
  double **o = calloc(MAXP, sizeof *o);
  for (int j = 0; j < p->nout; j++) {
    o[j] = malloc(bytes(p, p->out_f[j]));
    memcpy(o[j], fld(p, p->out_f[j]), bytes(p, p->out_f[j]));
  }
  return o;
}
static void free_outs(double **o) {
  for (int j = 0; j < MAXP; j++) free(o[j]);
  free(o);
}

/* J v against a central difference along v, element by element; and the
 * tangent kernel's primal results bit for bit the kernel's. Returns the
 * largest relative error. */
static double check_fd(prob *p, double h, double tol, const char *what) {
  ck_assert_int_gt(p->nin, 0);
  ck_assert_int_gt(p->nout, 0);
  state s0;
  save(p, &s0);
  dir v;
  random_dir(p, &v);
  double **base = outputs_at(p, &s0, &v, 0.0);
  jvp(p, &s0, &v);
  /* the primal: what k computes, exactly */
  for (int j = 0; j < p->nout; j++)
    ck_assert_msg(!memcmp(fld(p, p->out_f[j]), base[j], bytes(p, p->out_f[j])),
                  "%s: the tangent kernel's '%s' differs from the kernel's", what,
                  p->l->nodes[p->out_f[j]].name);
  double *jv[MAXP];
  for (int j = 0; j < p->nout; j++) {
    jv[j] = malloc(bytes(p, p->out_f[j]));
    memcpy(jv[j], fld(p, p->dual.grad[p->out_f[j]]), bytes(p, p->out_f[j]));
  }
  double **plus = outputs_at(p, &s0, &v, h), **minus = outputs_at(p, &s0, &v, -h), worst = 0;
  for (int j = 0; j < p->nout; j++)
    for (int64_t e = 0; e < numel(p, p->out_f[j]); e++) {
      double fd = (plus[j][e] - minus[j][e]) / (2 * h);
      double rel = fabs(jv[j][e] - fd) / (1.0 + fabs(fd));
      if (rel > worst) worst = rel;
      ck_assert_msg(rel <= tol, "%s: (J v) of %s[%lld]: tangent %.17g, finite difference %.17g",
                    what, p->l->nodes[p->out_f[j]].name, (long long)e, jv[j][e], fd);
    }
  for (int j = 0; j < p->nout; j++) free(jv[j]);
  free_outs(base);
  free_outs(plus);
  free_outs(minus);
  free_dir(p, &v);
  restore(p, &s0);
  drop(&s0);
  return worst;
}

/* <J v, w> against <v, J^T w>: J v from the tangent kernel, J^T w from
 * the reverse pass's adjoint (run after k, outputs' gradients seeded with
 * w, inputs' cleared). Returns the relative difference. */
static double identity_gap(prob *p) {
  ck_assert_ptr_nonnull(p->adj);
  state s0;
  save(p, &s0);
  dir v;
  random_dir(p, &v);
  jvp(p, &s0, &v);
  double *w[MAXP], jvw = 0, scale = 0;
  for (int j = 0; j < p->nout; j++) {
    int f = p->out_f[j];
    ck_assert_msg(!has(p->in_f, p->nin, f), "identity: '%s' is read and written",
                  p->l->nodes[f].name);
    w[j] = malloc(bytes(p, f));
    const double *d = fld(p, p->dual.grad[f]);
    for (int64_t e = 0; e < numel(p, f); e++) {
      w[j][e] = uniform(-1, 1);
      jvw += w[j][e] * d[e];
      scale += fabs(w[j][e] * d[e]);
    }
  }
  restore(p, &s0);
  run(p, p->k);
  for (int f = 0; f < p->l->nnodes; f++)
    if (p->grad.grad[f] >= 0) memset(fld(p, p->grad.grad[f]), 0, bytes(p, f));
  for (int j = 0; j < p->nout; j++)
    memcpy(fld(p, p->grad.grad[p->out_f[j]]), w[j], bytes(p, p->out_f[j]));
  run(p, p->adj);
  double vjtw = 0;
  for (int i = 0; i < p->nin; i++) {
    const double *g = fld(p, p->grad.grad[p->in_f[i]]);
    for (int64_t e = 0; e < numel(p, p->in_f[i]); e++) vjtw += v.v[i][e] * g[e];
  }
  for (int j = 0; j < p->nout; j++) free(w[j]);
  free_dir(p, &v);
  restore(p, &s0);
  drop(&s0);
  ck_assert_msg(scale > 1e-6, "identity: J v is (almost) zero: nothing checked");
  return fabs(jvw - vjtw) / (1e-300 + scale);
}

/* The tangent kernel on the CPU JIT (sync and async) from the same state
 * and direction as the interpreter: every place alike (1e-11). */
static void jit_matches(prob *p, const char *mode) {
  state s0;
  save(p, &s0);
  dir v;
  random_dir(p, &v);
  jvp(p, &s0, &v); /* the interpreter's result; the state it started from: */
  state want;
  save(p, &want);
  restore(p, &s0);
  for (int f = 0; f < p->l->nnodes; f++)
    if (p->dual.grad[f] >= 0) memset(fld(p, p->dual.grad[f]), 0, bytes(p, f));
  for (int i = 0; i < p->nin; i++)
    memcpy(fld(p, p->dual.grad[p->in_f[i]]), v.v[i], bytes(p, p->in_f[i]));
  fb_engine_config ec = {.backend = "cpu", .compile_threads = 1, .cpu_threads = 2};
  fb_engine *e = NULL;
  char err[256] = "";
  ck_assert_msg(fb_engine_create(&ec, &e, err, sizeof err) == 0, "engine: %s", err);
  fb_session_config sc = {.mode = mode};
  fb_session *s = NULL;
  ck_assert_msg(fb_session_create(e, &sc, p->l, &s, err, sizeof err) == 0, "session: %s", err);
  int tid = fb_session_add_kernel(s, p->t);
  ck_assert_msg(tid >= 0, "add: %s", fb_session_errmsg(s));
  for (int i = 0; i < want.n; i++)
    ck_assert_int_eq(fb_field_write(s, want.f[i], fld(p, want.f[i]), bytes(p, want.f[i])), 0);
  ck_assert_msg(fb_launch(s, tid, p->args, p->nargs, NULL) == 0, "%s", fb_session_errmsg(s));
  ck_assert_int_eq(fb_sync(s), 0);
  int changed = 0;
  for (int i = 0; i < want.n; i++) {
    int f = want.f[i];
    int64_t n = numel(p, f);
    double *got = malloc(bytes(p, f));
    ck_assert_int_eq(fb_field_read(s, f, got, bytes(p, f)), 0);
    for (int64_t x = 0; x < n; x++) {
      double w = want.v[i][x];
      ck_assert_msg(fabs(got[x] - w) <= 1e-11 * (1 + fabs(w)),
                    "%s %s: %s[%lld]: JIT %.17g, interpreter %.17g", p->k->name, mode,
                    p->l->nodes[f].name, (long long)x, got[x], w);
      changed += ends_with(p->l->nodes[f].name, ".dual") && w != 0;
    }
    free(got);
  }
  ck_assert_int_gt(changed, 0);
  fb_session_destroy(s);
  fb_engine_destroy(e);
  free_dir(p, &v);
  restore(p, &s0);
  drop(&s0);
  drop(&want);
}

/* ---------------------------------------------------------------- every op */

enum { AV_NONE, AV_APART, AV_FRAC_Q, AV_FRAC_X, AV_SIGN };

typedef struct opcase {
  const char *op;
  int binary;
  double xlo, xhi, zlo, zhi;
  int avoid;
} opcase;

static const opcase op_cases[] = {
    {"add", 1, -2, 2, -2, 2, AV_NONE},      {"sub", 1, -2, 2, -2, 2, AV_NONE},
    {"mul", 1, -2, 2, -2, 2, AV_NONE},      {"div", 1, -2, 2, 0.5, 2, AV_NONE},
    {"rem", 1, -5, 5, 0.7, 1.5, AV_FRAC_Q}, {"floormod", 1, -5, 5, 0.7, 1.5, AV_FRAC_Q},
    {"floordiv", 1, -5, 5, 0.7, 1.5, AV_FRAC_Q},
    {"min", 1, -2, 2, -2, 2, AV_APART},     {"max", 1, -2, 2, -2, 2, AV_APART},
    {"pow", 1, 0.5, 2, -1.5, 1.5, AV_NONE}, {"atan2", 1, -2, 2, -2, 2, AV_APART},
    {"neg", 0, -2, 2, 0, 0, AV_NONE},       {"abs", 0, 0.2, 2, 0, 0, AV_SIGN},
    {"sqrt", 0, 0.3, 3, 0, 0, AV_NONE},     {"rsqrt", 0, 0.3, 3, 0, 0, AV_NONE},
    {"sin", 0, -3, 3, 0, 0, AV_NONE},       {"cos", 0, -3, 3, 0, 0, AV_NONE},
    {"tan", 0, -1.2, 1.2, 0, 0, AV_NONE},   {"asin", 0, -0.8, 0.8, 0, 0, AV_NONE},
    {"acos", 0, -0.8, 0.8, 0, 0, AV_NONE},  {"atan", 0, -3, 3, 0, 0, AV_NONE},
    {"exp", 0, -2, 2, 0, 0, AV_NONE},       {"log", 0, 0.2, 3, 0, 0, AV_NONE},
    {"floor", 0, -3, 3, 0, 0, AV_FRAC_X},   {"ceil", 0, -3, 3, 0, 0, AV_FRAC_X},
    {"round", 0, -3, 3, 0, 0, AV_FRAC_X},
};

static int ok_point(const opcase *c, double x, double z) {
  double f;
  switch (c->avoid) {
  case AV_APART: return fabs(x - z) > 0.05;
  case AV_FRAC_Q: f = x / z - floor(x / z); return f > 0.05 && f < 0.95;
  case AV_FRAC_X: f = x - floor(x); return f > 0.05 && f < 0.95 && fabs(f - 0.5) > 0.05;
  default: return 1;
  }
}

static const char *op_layout = "layout {\n"
                               "  dense(i: 8) {\n"
                               "    place x: f64\n"
                               "    place z: f64\n"
                               "    place y: f64\n"
                               "    place x.dual: f64\n"
                               "    place z.dual: f64\n"
                               "    place y.dual: f64\n"
                               "    place x.grad: f64\n"
                               "    place z.grad: f64\n"
                               "    place y.grad: f64\n"
                               "  }\n"
                               "}\n";

/* y[i] = op(x[i] [, z[i]]) * z[i]: both operands of a binary op and a
 * second use of z carry tangents. Against finite differences, and the
 * adjoint identity with the reverse pass (the rules are shared, the
 * passes around them are not). */
static void op_case(int i, int jit) {
  const opcase *c = &op_cases[i];
  char text[2048];
  snprintf(text, sizeof text,
           "%s"
           "kernel k() {\n"
           "  %%0 = const.i32 0\n"
           "  %%1 = const.i32 8\n"
           "  par_for %%2 in %%0 .. %%1 {\n"
           "    %%3 = loop_index.i32 %%2, 0\n"
           "    %%4 = load.f64 x[%%3]\n"
           "    %%5 = load.f64 z[%%3]\n"
           "    %%6 = %s.f64 %%4%s\n"
           "    %%7 = mul.f64 %%6, %%5\n"
           "    store y[%%3], %%7\n"
           "  }\n"
           "}\n",
           op_layout, c->op, c->binary ? ", %5" : "");
  prob p;
  setup_ir(&p, text, 1);
  ck_assert_int_eq(p.nin, 2);
  ck_assert_int_eq(p.nout, 1);
  rng_state = 0x9e3779b97f4a7c15ull + (uint64_t)i;
  randomize(&p, -1, 1);
  double *x = fld(&p, fid(&p, "x")), *z = fld(&p, fid(&p, "z"));
  for (int e = 0; e < 8; e++) {
    do {
      x[e] = uniform(c->xlo, c->xhi);
      z[e] = c->binary ? uniform(c->zlo, c->zhi) : uniform(-2, 2);
      if (c->avoid == AV_SIGN && urand() < 0.5) x[e] = -x[e];
    } while (!ok_point(c, x[e], z[e]));
  }
  char what[64];
  snprintf(what, sizeof what, "op %s", c->op);
  if (jit) {
    jit_matches(&p, "sync");
  } else {
    check_fd(&p, 1e-6, 2e-6, what);
    double gap = identity_gap(&p);
    ck_assert_msg(gap < 1e-12, "%s: <Jv, w> - <v, J^T w> = %g (relative)", what, gap);
  }
  teardown(&p);
}

START_TEST(every_op_fd_and_identity) { op_case(_i, 0); }
END_TEST

START_TEST(every_op_jit) { op_case(_i, 1); }
END_TEST

/* The piecewise-constant ops give a tangent of exactly 0 (the mul by z
 * still carries z's). */
START_TEST(piecewise_constant_ops_give_zero) {
  static const char *ops[] = {"floor", "ceil", "round"};
  for (int o = 0; o < 3; o++) {
    char text[2048];
    snprintf(text, sizeof text,
             "%s"
             "kernel k() {\n"
             "  %%0 = const.i32 0\n"
             "  %%1 = const.i32 8\n"
             "  par_for %%2 in %%0 .. %%1 {\n"
             "    %%3 = loop_index.i32 %%2, 0\n"
             "    %%4 = load.f64 x[%%3]\n"
             "    %%5 = %s.f64 %%4\n"
             "    store y[%%3], %%5\n"
             "  }\n"
             "}\n",
             op_layout, ops[o]);
    prob p;
    setup_ir(&p, text, 0);
    rng_state = 5 + (uint64_t)o;
    randomize(&p, -3, 3);
    state s0;
    save(&p, &s0);
    dir v;
    random_dir(&p, &v);
    double *yd = fld(&p, fid(&p, "y.dual"));
    for (int e = 0; e < 8; e++) yd[e] = 7.0; /* overwritten by the store's dual */
    jvp(&p, &s0, &v);
    for (int e = 0; e < 8; e++)
      ck_assert_msg(yd[e] == 0.0, "%s: y.dual[%d] = %g", ops[o], e, yd[e]);
    free_dir(&p, &v);
    drop(&s0);
    teardown(&p);
  }
}
END_TEST

/* Casts f64 -> f32 -> f64 and float -> int -> float, a loop index and a
 * select, in one kernel. */
static const char *casts_text = "layout {\n"
                                "  dense(i: 8) {\n"
                                "    place x: f64\n"
                                "    place x.dual: f64\n"
                                "    place x.grad: f64\n"
                                "    place z: f64\n"
                                "    place z.dual: f64\n"
                                "    place z.grad: f64\n"
                                "    place y: f64\n"
                                "    place y.dual: f64\n"
                                "    place y.grad: f64\n"
                                "  }\n"
                                "}\n"
                                "kernel k() {\n"
                                "  %0 = const.i32 0\n"
                                "  %1 = const.i32 8\n"
                                "  par_for %2 in %0 .. %1 {\n"
                                "    %3 = loop_index.i32 %2, 0\n"
                                "    %4 = load.f64 x[%3]\n"
                                "    %5 = load.f64 z[%3]\n"
                                "    %6 = cast.f32 %4\n"
                                "    %7 = const.f32 1.5\n"
                                "    %8 = mul.f32 %6, %7\n"
                                "    %9 = sin.f32 %8\n"
                                "    %10 = cast.f64 %9\n"
                                "    %11 = gt.bool %4, %5\n"
                                "    %12 = mul.f64 %4, %4\n"
                                "    %13 = exp.f64 %5\n"
                                "    %14 = select.f64 %11, %12, %13\n"
                                "    %15 = cast.f64 %3\n"
                                "    %16 = mul.f64 %15, %10\n"
                                "    %17 = add.f64 %16, %14\n"
                                "    %18 = cast.i32 %17\n"
                                "    %19 = cast.f64 %18\n"
                                "    %20 = const.f64 1e-3\n"
                                "    %21 = mul.f64 %19, %20\n"
                                "    %22 = add.f64 %17, %21\n"
                                "    store y[%3], %22\n"
                                "  }\n"
                                "}\n";

START_TEST(casts_select_and_f32) {
  prob p;
  setup_ir(&p, casts_text, 1);
  rng_state = 77;
  randomize(&p, -1, 1);
  double *x = fld(&p, fid(&p, "x")), *z = fld(&p, fid(&p, "z"));
  for (int e = 0; e < 8; e++) {
    do {
      x[e] = uniform(-1.5, 1.5);
      z[e] = uniform(-1.5, 1.5);
    } while (fabs(x[e] - z[e]) < 0.1);
  }
  /* f32 rounding: a wider step and tolerance, as in test_autodiff */
  check_fd(&p, 1e-4, 2e-3, "casts");
  ck_assert_double_lt(identity_gap(&p), 1e-6); /* the f32 stretch rounds both ways alike */
  jit_matches(&p, "sync");
  teardown(&p);
}
END_TEST

/* ---------------------------------------------------------------- control forms (.fbk) */

static const char *cf_src =
    "layout {\n"
    "  dense(i: 6) { place x: f64 grad dual, z: f64 grad dual, y: f64 grad dual,\n"
    "                v: f64[2] grad dual, c: f64 }\n"
    "  place e: f64 grad dual\n"
    "}\n"
    /* if / else assigning a local in both branches */
    "kernel ifelse() {\n"
    "  for i in 0 .. 6 {\n"
    "    var a: f64\n"
    "    if x[i] > 0.0 { a = sin(x[i]) } else { a = x[i] * x[i] * z[i] }\n"
    "    y[i] = a * x[i]\n"
    "  }\n"
    "}\n"
    /* a serial loop with a run-time trip count and a carried local */
    "kernel loop(n: i32) {\n"
    "  for i in 0 .. 6 {\n"
    "    var s = x[i]\n"
    "    for j in 0 .. n { s = sin(s * z[j]) + s }\n"
    "    y[i] = s\n"
    "  }\n"
    "}\n"
    /* nested serial loops with an if inside, a coefficient without a dual */
    "kernel nested() {\n"
    "  for i in 0 .. 6 {\n"
    "    var b: f64 = 0.5\n"
    "    for j in 0 .. 6 { b = b * z[j] * 0.5 + cos(z[j]) }\n"
    "    var a = x[i]\n"
    "    for p in 0 .. 3 {\n"
    "      for q in 0 .. 2 {\n"
    "        if a > 0.0 { a = a * z[p + q] + c[i] } else { a = (a + z[p + q]) * x[i] }\n"
    "      }\n"
    "    }\n"
    "    y[i] = a * b\n"
    "  }\n"
    "}\n"
    /* scatter with += and -=, a reduction started by a store, a vector field */
    "kernel scatter() {\n"
    "  e[] = 0.0\n"
    "  for i in 0 .. 6 {\n"
    "    y[(i + 1) % 6] += x[i] * z[i] * v[i].x\n"
    "    y[i] -= 0.5 * exp(x[i]) * v[i].y\n"
    "    e[] += x[i] * x[i] + atan2(v[i].y, z[i])\n"
    "  }\n"
    "}\n"
    /* forward mode only (the reverse pass refuses these): a while loop
     * with a break, a continue, a field updated in place, random() */
    "kernel wloop() {\n"
    "  for i in 0 .. 6 {\n"
    "    if i == 2 { continue }\n"
    "    var a = x[i]\n"
    "    var k = 0\n"
    "    while k < 10 {\n"
    "      a = a * 0.9 + z[i] * sin(a)\n"
    "      k += 1\n"
    "      if k >= 3 + i % 3 { break }\n"
    "    }\n"
    "    y[i] = a\n"
    "  }\n"
    "}\n"
    "kernel inplace() {\n"
    "  for i in 0 .. 6 {\n"
    "    x[i] = x[i] * x[i] + z[i]\n"
    "    v[i].x += x[i] * v[i].y\n"
    "  }\n"
    "}\n"
    "kernel noisy() {\n"
    "  for i in 0 .. 6 { y[i] = x[i] * (1.0 + random()) + z[i] * c[i] }\n"
    "}\n";

typedef struct cfcase {
  const char *kernel;
  int identity; /* the reverse pass takes it too */
  int arg;      /* the i32 parameter, -1 for none */
} cfcase;

static const cfcase cf_cases[] = {
    {"ifelse", 1, -1}, {"loop", 1, 0},   {"loop", 1, 1},      {"loop", 1, 4},
    {"loop", 1, 6},    {"nested", 1, -1}, {"scatter", 1, -1}, {"wloop", 0, -1},
    {"inplace", 0, -1}, {"noisy", 0, -1},
};

static void cf_setup(prob *p, const cfcase *c) {
  setup_fbk(p, cf_src, c->kernel, c->identity);
  if (c->arg >= 0) {
    p->args[0] = fb_value_i32(c->arg);
    p->nargs = 1;
  }
}

START_TEST(control_forms_fd_and_identity) {
  const cfcase *c = &cf_cases[_i];
  prob p;
  cf_setup(&p, c);
  rng_state = 1000 + (uint64_t)_i;
  randomize(&p, -1, 1);
  char what[64];
  snprintf(what, sizeof what, "%s(%d)", c->kernel, c->arg);
  check_fd(&p, 1e-6, 1e-5, what);
  if (c->identity) {
    double gap = identity_gap(&p);
    ck_assert_msg(gap < 1e-12, "%s: <Jv, w> - <v, J^T w> = %g (relative)", what, gap);
  }
  teardown(&p);
}
END_TEST

START_TEST(control_forms_jit) {
  static const char *const modes[] = {"sync", "async"};
  const cfcase *c = &cf_cases[_i];
  for (int m = 0; m < 2; m++) {
    prob p;
    cf_setup(&p, c);
    rng_state = 2000 + (uint64_t)_i;
    randomize(&p, -1, 1);
    if (strcmp(c->kernel, "noisy")) jit_matches(&p, modes[m]); /* JIT draws its own stream */
    teardown(&p);
  }
}
END_TEST

/* Both branches of ifelse are taken at the points drawn (else FD through
 * the if would test only one), and the tangent kernel's random() numbers
 * are the kernel's (y bit for bit, in check_fd). */
START_TEST(both_branches_taken) {
  prob p;
  setup_fbk(&p, cf_src, "ifelse", 0);
  rng_state = 1000;
  randomize(&p, -1, 1);
  int pos = 0, neg = 0;
  const double *x = fld(&p, fid(&p, "x"));
  for (int e = 0; e < 6; e++) pos += x[e] > 0, neg += x[e] <= 0;
  ck_assert_int_gt(pos, 0);
  ck_assert_int_gt(neg, 0);
  teardown(&p);
}
END_TEST

/* ---------------------------------------------------------------- random kernels */

/* A random smooth kernel in IR text: y[i] = E(x[i], z[i], x[i+1 mod 8])
 * where E is a chain of random ops over earlier values, optionally inside
 * an if/else on a loaded value or a serial loop carrying a local; also
 * e[] += (a second chain). Ids are the statement numbers, in order. */
typedef struct gen {
  char *buf;
  size_t len, cap;
  int next;
} gen;

static int emit(gen *g, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int emit(gen *g, const char *fmt, ...) {
  char line[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  size_t n = strlen(line);
  if (g->len + n + 1 > g->cap) {
    g->cap = (g->len + n + 1) * 2;
    g->buf = realloc(g->buf, g->cap);
  }
  memcpy(g->buf + g->len, line, n + 1);
  g->len += n;
  return g->next++;
}

/* One random op over the values vals[0 .. nv); returns the new value's id. */
static int rand_op(gen *g, const int *vals, int nv) {
  static const char *bin_ops[] = {"add", "sub", "mul", "min", "max", "atan2"};
  static const char *un_ops[] = {"sin", "cos", "atan", "neg", "exp"};
  int a = vals[(int)(urand() * nv)], b = vals[(int)(urand() * nv)];
  if (urand() < 0.55) {
    const char *op = bin_ops[(int)(urand() * 6)];
    int id = g->next;
    emit(g, "    %%%d = %s.f64 %%%d, %%%d\n", id, op, a, b);
    return id;
  }
  const char *op = un_ops[(int)(urand() * 5)];
  int id = g->next;
  if (!strcmp(op, "exp")) { /* keep it bounded: exp(sin a) */
    emit(g, "    %%%d = sin.f64 %%%d\n", id, a);
    emit(g, "    %%%d = exp.f64 %%%d\n", id + 1, id);
    return id + 1;
  }
  emit(g, "    %%%d = %s.f64 %%%d\n", id, op, a);
  return id;
}

/* rand_op over vals, its result appended to vals. */
static void push_op(gen *g, int *vals, int *nv) {
  int id = rand_op(g, vals, *nv);
  vals[(*nv)++] = id;
}

static char *random_kernel(uint64_t seed, int form) {
  rng_state = seed;
  gen g = {0};
  emit(&g, "%s", "layout {\n  dense(i: 8) {\n");
  g.next = 0;
  static const char *names[] = {"x", "z", "y"};
  for (int f = 0; f < 3; f++)
    emit(&g, "    place %s: f64\n    place %s.dual: f64\n    place %s.grad: f64\n", names[f],
         names[f], names[f]);
  emit(&g, "%s", "  }\n  place e: f64\n  place e.dual: f64\n  place e.grad: f64\n}\n");
  emit(&g, "%s", "kernel k() {\n");
  g.next = 0;
  emit(&g, "  %%0 = const.i32 0\n");
  emit(&g, "  %%1 = const.i32 8\n");
  emit(&g, "  %%2 = const.i32 1\n");
  emit(&g, "  %%3 = const.i32 3\n");
  int loop = g.next;
  emit(&g, "  par_for %%%d in %%0 .. %%1 {\n", loop);
  int ix = emit(&g, "    %%%d = loop_index.i32 %%%d, 0\n", g.next, loop);
  int ip = emit(&g, "    %%%d = add.i32 %%%d, %%2\n", g.next, ix);
  int im = emit(&g, "    %%%d = floormod.i32 %%%d, %%1\n", g.next, ip);
  int vals[64], nv = 0;
  vals[nv++] = emit(&g, "    %%%d = load.f64 x[%%%d]\n", g.next, ix);
  vals[nv++] = emit(&g, "    %%%d = load.f64 z[%%%d]\n", g.next, ix);
  vals[nv++] = emit(&g, "    %%%d = load.f64 x[%%%d]\n", g.next, im);
  vals[nv++] = emit(&g, "    %%%d = const.f64 0.75\n", g.next);
  int var = emit(&g, "    %%%d = alloca.f64\n", g.next);
  emit(&g, "    lstore %%%d, %%%d\n", var, vals[0]);
  if (form == 1) { /* if / else on a loaded value */
    int cond = emit(&g, "    %%%d = gt.bool %%%d, %%%d\n", g.next, vals[1], vals[3]);
    emit(&g, "    %%%d: if %%%d {\n", g.next, cond);
    int v2[64], n2 = nv;
    memcpy(v2, vals, sizeof(int) * (size_t)nv);
    for (int s = 0; s < 3; s++) push_op(&g, v2, &n2);
    emit(&g, "    lstore %%%d, %%%d\n", var, v2[n2 - 1]);
    emit(&g, "%s", "    } else {\n");
    n2 = nv;
    for (int s = 0; s < 3; s++) push_op(&g, v2, &n2);
    emit(&g, "    lstore %%%d, %%%d\n", var, v2[n2 - 1]);
    emit(&g, "%s", "    }\n");
  } else if (form == 2) { /* a serial loop carrying the local */
    int rl = g.next;
    emit(&g, "    range_for %%%d in %%0 .. %%3 {\n", rl);
    int v2[64], n2 = nv;
    memcpy(v2, vals, sizeof(int) * (size_t)nv);
    v2[n2++] = emit(&g, "    %%%d = lload.f64 %%%d\n", g.next, var);
    for (int s = 0; s < 3; s++) push_op(&g, v2, &n2);
    int half = emit(&g, "    %%%d = const.f64 0.5\n", g.next);
    int sc = emit(&g, "    %%%d = mul.f64 %%%d, %%%d\n", g.next, v2[n2 - 1], half);
    emit(&g, "    lstore %%%d, %%%d\n", var, sc);
    emit(&g, "%s", "    }\n");
  }
  vals[nv++] = emit(&g, "    %%%d = lload.f64 %%%d\n", g.next, var);
  for (int s = 0; s < 5; s++) push_op(&g, vals, &nv);
  emit(&g, "    store y[%%%d], %%%d\n", ix, vals[nv - 1]);
  for (int s = 0; s < 3; s++) push_op(&g, vals, &nv);
  emit(&g, "    %%%d = atomic_add.f64 e[], %%%d\n", g.next, vals[nv - 1]);
  emit(&g, "%s", "  }\n}\n");
  return g.buf;
}

START_TEST(random_kernels_identity_fd_jit) {
  for (int r = 0; r < 12; r++) {
    char *text = random_kernel(0xabcdef12345ull + (uint64_t)r * 7919, r % 3);
    prob p;
    setup_ir(&p, text, 1);
    rng_state = 31 + (uint64_t)r;
    randomize(&p, -1, 1);
    double gap = identity_gap(&p);
    ck_assert_msg(gap < 1e-12, "random kernel %d: <Jv, w> - <v, J^T w> = %g\n%s", r, gap, text);
    char what[32];
    snprintf(what, sizeof what, "random kernel %d", r);
    check_fd(&p, 1e-6, 1e-5, what);
    if (r < 3) jit_matches(&p, r % 2 ? "async" : "sync");
    teardown(&p);
    free(text);
  }
}
END_TEST

/* ---------------------------------------------------------------- refusals */

/* A .fbk kernel whose "k.dual" is refused: the code, the message (two
 * phrases), the rendered position "fwd.fbk:L:C", and no IR value. */
static void fbk_refusal(const char *src, const char *name, int want_rc, const char *want,
                        const char *want2, const char *pos) {
  fb_program *pr = NULL;
  fb_diags d;
  fb_diags_init(&d);
  int rc = fb_program_parse("fwd.fbk", src, &pr, &d);
  if (rc) {
    char *r = fb_diags_render("fwd.fbk", src, &d);
    ck_abort_msg("parse: %s", r ? r : "");
  }
  fb_kernel *k = NULL;
  rc = fb_program_instantiate(pr, name, NULL, 0, &k, &d);
  char *r = fb_diags_render("fwd.fbk", src, &d);
  ck_assert_msg(rc == want_rc, "%s: rc %s, want %s: %s", name, fb_strerror(rc),
                fb_strerror(want_rc), r ? r : "");
  ck_assert_ptr_null(k);
  ck_assert_msg(r && strstr(r, want), "%s: want '%s' in:\n%s", name, want, r ? r : "");
  ck_assert_msg(!want2 || strstr(r, want2), "%s: want '%s' in:\n%s", name, want2, r);
  ck_assert_msg(!pos || strstr(r, pos), "%s: want position '%s' in:\n%s", name, pos, r);
  for (const char *q = r; (q = strchr(q, '%')) != NULL; q++)
    ck_assert_msg(!(q[1] >= '0' && q[1] <= '9'), "an IR value in: %s", r);
  free(r);
  fb_diags_free(&d);
  fb_program_free(pr);
}

static const char *ref_src = "layout {\n"
                             "  dense(i: 4) { place x: f64 dual, y: f64 dual, c: f64, "
                             "w: f64[2] }\n"
                             "}\n"
                             "kernel lost() {\n"
                             "  for i in 0 .. 4 {\n"
                             "    c[i] = x[i] * 2.0\n"
                             "  }\n"
                             "}\n"
                             "kernel lostvec() {\n"
                             "  for i in 0 .. 4 { w[i] = [x[i], 1.0] }\n"
                             "}\n"
                             "kernel mx() {\n"
                             "  for i in 0 .. 4 {\n"
                             "    y[0] max= x[i]\n"
                             "  }\n"
                             "}\n"
                             "kernel old() {\n"
                             "  for i in 0 .. 4 {\n"
                             "    c[i] = atomic_add(y[0], 1.0)\n"
                             "  }\n"
                             "}\n"
                             "kernel ok() {\n"
                             "  for i in 0 .. 4 { y[i] = x[i] * c[i] }\n"
                             "}\n";

START_TEST(fbk_refusals_have_positions) {
  fbk_refusal(ref_src, "lost.dual", FB_EVERIFY,
              "cannot differentiate kernel 'lost' in forward mode: it writes a value that "
              "depends on a field with a dual into 'c', which has none",
              "give 'c' a dual (place c: f64 dual)", "fwd.fbk:6:5");
  fbk_refusal(ref_src, "lostvec.dual", FB_EVERIFY, "into 'w', which has none",
              "place w: f64[2] dual", "fwd.fbk:10:");
  fbk_refusal(ref_src, "mx.dual", FB_EVERIFY, "atomic_max on the float field 'y'",
              "compute the maximum with max() and store it", "fwd.fbk:14:5");
  fbk_refusal(ref_src, "old.dual", FB_EVERIFY, "uses the value atomic_add returns (on field 'y'",
              "use atomic_add as a statement only", "fwd.fbk:19:");
  fbk_refusal(ref_src, "ok.dual.dual", FB_ENOENT,
              "the tangent of a tangent (a second derivative) is not supported", NULL, NULL);
  fbk_refusal(ref_src, "ok.dual.grad", FB_ENOENT, "the adjoint of a tangent", NULL, NULL);
  /* and the kernel that is fine: its tangent exists */
  fb_program *pr = NULL;
  fb_diags d;
  fb_diags_init(&d);
  ck_assert_int_eq(fb_program_parse("fwd.fbk", ref_src, &pr, &d), 0);
  fb_kernel *k = NULL;
  ck_assert_int_eq(fb_program_instantiate(pr, "ok.dual", NULL, 0, &k, &d), 0);
  ck_assert_str_eq(k->name, "ok.dual");
  fb_diags_free(&d);
  fb_program_free(pr);
}
END_TEST

static void fbk_parse_error(const char *src, const char *want) {
  fb_program *pr = NULL;
  fb_diags d;
  fb_diags_init(&d);
  int rc = fb_program_parse("fwd.fbk", src, &pr, &d);
  ck_assert_int_ne(rc, 0);
  char *r = fb_diags_render("fwd.fbk", src, &d);
  ck_assert_msg(r && strstr(r, want), "want '%s' in:\n%s", want, r ? r : "");
  free(r);
  fb_diags_free(&d);
}

START_TEST(fbk_dual_syntax) {
  /* `grad dual` in either order; x.dual read and written like a field */
  static const char *src = "layout {\n"
                           "  dense(i: 4) { place x: f64 dual grad, y: f32 grad dual, "
                           "v: f64[2] dual }\n"
                           "}\n"
                           "kernel seed() { for i in 0 .. 4 { x.dual[i] = 1.0 + x.grad[i] } }\n"
                           "kernel k() { for i in 0 .. 4 { v[i] = [x[i] * x[i], y[i]] } }\n";
  fb_program *pr = NULL;
  fb_diags d;
  fb_diags_init(&d);
  int rc = fb_program_parse("fwd.fbk", src, &pr, &d);
  char *r = fb_diags_render("fwd.fbk", src, &d);
  ck_assert_msg(rc == 0, "%s", r ? r : "");
  free(r);
  ck_assert_int_ge(fb_program_find_field(pr, "x.dual"), 0);
  ck_assert_int_ge(fb_program_find_field(pr, "x.grad"), 0);
  ck_assert_int_ge(fb_program_find_field(pr, "y.dual"), 0);
  ck_assert_int_ge(fb_program_find_field(pr, "v.dual"), 0);
  ck_assert_int_lt(fb_program_find_field(pr, "v.grad"), 0);
  const fb_layout *l = fb_program_layout(pr);
  ck_assert_int_ge(fb_layout_find(l, "x.grad"), 0); /* beside x, not beside x.dual */
  ck_assert_int_lt(fb_layout_find(l, "x.dual.grad"), 0);
  ck_assert_int_ge(fb_layout_find(l, "y.grad"), 0);
  ck_assert_int_lt(fb_layout_find(l, "y.grad.dual"), 0);
  ck_assert_int_ge(fb_layout_find(l, "v.0.dual"), 0);
  ck_assert_int_ge(fb_layout_find(l, "v.1.dual"), 0);
  fb_kernel *k = NULL;
  ck_assert_int_eq(fb_program_instantiate(pr, "seed", NULL, 0, &k, &d), 0);
  ck_assert_int_eq(fb_program_instantiate(pr, "k.dual", NULL, 0, &k, &d), 0);
  /* the tangent stores both components' duals */
  int stores = 0;
  for (int i = 0; i < k->nstmts; i++)
    if (k->stmts[i].op == FB_OP_STORE &&
        strstr(l->nodes[k->stmts[i].snode].name, ".dual"))
      stores++;
  ck_assert_int_eq(stores, 2);
  fb_diags_free(&d);
  fb_program_free(pr);
  fbk_parse_error("layout { dense(i: 4) { place n: i32 dual } }\n",
                  "'n' is i32: only f32 and f64 fields have duals (remove 'dual' or make it a "
                  "float field)");
  fbk_parse_error("layout { dense(i: 4) { place x: f64, y: f64 } }\n"
                  "kernel k() { for i in 0 .. 4 { y[i] = x.dual[i] } }\n",
                  "'x' has no dual: declare it with 'place x: f32 dual'");
}
END_TEST

/* IR-level refusals: a bad map, an internal op; and the budget. */
START_TEST(refusals_map_and_budget) {
  static const char *text = "layout {\n"
                            "  dense(i: 8) {\n"
                            "    place x: f64\n"
                            "    place x.dual: f64\n"
                            "    place y: f64\n"
                            "    place y.dual: f64\n"
                            "    place h: f32\n"
                            "  }\n"
                            "}\n"
                            "kernel k() {\n"
                            "  %0 = const.i32 0\n"
                            "  %1 = const.i32 8\n"
                            "  par_for %2 in %0 .. %1 {\n"
                            "    %3 = loop_index.i32 %2, 0\n"
                            "    %4 = load.f64 x[%3]\n"
                            "    %5 = sin.f64 %4\n"
                            "    %6 = mul.f64 %5, %4\n"
                            "    store y[%3], %6\n"
                            "  }\n"
                            "}\n";
  prob p;
  setup_ir(&p, text, 0);
  char err[512] = "";
  fb_kernel *t = NULL;
  int bad = 0, n = p.t->nstmts;
  /* the budget: the tangent's own size passes, one less is refused */
  ck_assert_int_eq(fb_kernel_tangent(p.k, &p.dual, n, &t, &bad, err, sizeof err), 0);
  fb_kernel_free(t);
  ck_assert_int_eq(fb_kernel_tangent(p.k, &p.dual, n - 1, &t, &bad, err, sizeof err), FB_EQUOTA);
  ck_assert_ptr_null(t);
  ck_assert_msg(strstr(err, "its tangent has") && strstr(err, "split the kernel"), "%s", err);
  ck_assert_int_eq(fb_kernel_tangent(p.k, &p.dual, 2, &t, &bad, err, sizeof err), FB_EQUOTA);
  /* a map giving x a dual of another type */
  int x = fid(&p, "x"), h = fid(&p, "h");
  int keep = p.dual.grad[x];
  p.dual.grad[x] = h;
  ck_assert_int_eq(fb_kernel_tangent(p.k, &p.dual, 0, &t, &bad, err, sizeof err), FB_EINVAL);
  ck_assert_msg(strstr(err, "has another element type than the field"), "%s", err);
  p.dual.grad[x] = keep;
  /* the tangent of the kernel on the layout helpers' convention */
  fb_layout *l = fb_layout_new();
  int64_t sz = 4;
  int d0 = fb_layout_add(l, 0, FB_SN_DENSE, "i", &sz, 0, NULL);
  int a = fb_layout_place(l, d0, "a", FB_T_F32), c = fb_layout_place(l, d0, "c", FB_T_I32);
  ck_assert_int_ge(fb_layout_add_dual(l, a, err, sizeof err), 0);
  ck_assert_int_lt(fb_layout_add_dual(l, a, err, sizeof err), 0);
  ck_assert_msg(strstr(err, "already has a dual"), "%s", err);
  ck_assert_int_lt(fb_layout_add_dual(l, c, err, sizeof err), 0);
  ck_assert_msg(strstr(err, "only f32 and f64 fields have duals"), "%s", err);
  ck_assert_int_eq(fb_layout_finalize(l, err, sizeof err), 0);
  ck_assert_int_lt(fb_layout_add_dual(l, a, err, sizeof err), 0);
  fb_grad_map m;
  ck_assert_int_eq(fb_dual_map_from_layout(l, &m), 0);
  ck_assert_int_eq(m.grad[a], fb_layout_find(l, "a.dual"));
  ck_assert_int_eq(m.grad[c], -1);
  fb_grad_map_free(&m);
  fb_layout_free(l);
  teardown(&p);
}
END_TEST

static Suite *tangent_suite(void) {
  Suite *s = suite_create("tangent");
  TCase *ops = tcase_create("ops");
  tcase_add_loop_test(ops, every_op_fd_and_identity, 0,
                      (int)(sizeof op_cases / sizeof op_cases[0]));
  tcase_add_loop_test(ops, every_op_jit, 0, (int)(sizeof op_cases / sizeof op_cases[0]));
  tcase_add_test(ops, piecewise_constant_ops_give_zero);
  tcase_add_test(ops, casts_select_and_f32);
  suite_add_tcase(s, ops);
  TCase *cf = tcase_create("control_flow");
  tcase_add_loop_test(cf, control_forms_fd_and_identity, 0,
                      (int)(sizeof cf_cases / sizeof cf_cases[0]));
  tcase_add_loop_test(cf, control_forms_jit, 0, (int)(sizeof cf_cases / sizeof cf_cases[0]));
  tcase_add_test(cf, both_branches_taken);
  tcase_add_test(cf, random_kernels_identity_fd_jit);
  suite_add_tcase(s, cf);
  TCase *errs = tcase_create("errors");
  tcase_add_test(errs, fbk_refusals_have_positions);
  tcase_add_test(errs, fbk_dual_syntax);
  tcase_add_test(errs, refusals_map_and_budget);
  suite_add_tcase(s, errs);
  return s;
}

int main(void) { return fbt_run(tangent_suite()); }
