/* .fbk programs run end to end: parsed, instantiated, and executed by the
 * reference interpreter and (for the scalar programs) by the engine on the
 * CPU, with results checked against values computed here in C: integer and
 * float floored division and modulo with negative operands, a heat
 * diffusion stencil, Game of Life on a torus, control flow and inlined
 * funcs, vectors and matrices with their builtins, svd and polar, and
 * P2G-style scatters whose atomics codegen groups per cell; and every
 * compile-time fold against the same operation at run time. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fusebox/engine.h"
#include "fusebox/lang.h"
#include "tests/support/support.h"

/* ---------------------------------------------------------------- helpers */

static fb_program *prog(const char *src) {
  fb_program *p = NULL;
  fb_diags d;
  fb_diags_init(&d);
  int rc = fb_program_parse("test.fbk", src, &p, &d);
  char *r = fb_diags_render("test.fbk", src, &d);
  ck_assert_msg(rc == 0, "parse failed:\n%s", r ? r : "");
  free(r);
  fb_diags_free(&d);
  return p;
}

static fb_kernel *inst(fb_program *p, const char *name, const char *f0, const char *f1) {
  const char *b[2] = {f0, f1};
  int n = f1 ? 2 : f0 ? 1 : 0;
  fb_kernel *k = NULL;
  fb_diags d;
  fb_diags_init(&d);
  int rc = fb_program_instantiate(p, name, b, n, &k, &d);
  char *r = fb_diags_render("test.fbk", fb_program_source(p), &d);
  ck_assert_msg(rc == 0, "instantiate %s: %s\n%s", name, fb_strerror(rc), r ? r : "");
  free(r);
  fb_diags_free(&d);
  return k;
}

static const fb_lang_field *field(fb_program *p, const char *name) {
  const fb_lang_field *f = fb_program_field(p, fb_program_find_field(p, name));
  ck_assert_msg(f != NULL, "no field %s", name);
  return f;
}

static void irun(fb_interp *in, const fb_kernel *k, const fb_value *args, int nargs,
                 fb_value *ret) {
  int rc = fb_interp_run(in, k, args, nargs, ret);
  ck_assert_msg(rc == 0, "interp %s: %s", k->name, fb_strerror(rc));
}

/* Component c of a field in the interpreter (flat, row-major). */
static void *icomp(fb_interp *in, fb_program *p, const char *name, int c) {
  void *a = fb_interp_field(in, field(p, name)->places[c]);
  ck_assert_ptr_nonnull(a);
  return a;
}

static fb_engine *engine(void) {
  fb_engine_config cfg = {fbt_backend(), 1, 2};
  fb_engine *e = NULL;
  char err[256];
  int rc = fb_engine_create(&cfg, &e, err, sizeof err);
  ck_assert_msg(rc == 0, "engine: %s", err);
  return e;
}

static fb_session *session(fb_engine *e, fb_program *p) {
  fb_session_config sc = {.mode = "sync", .seed = 1};
  fb_session *s = NULL;
  ck_assert_int_eq(fb_session_create(e, &sc, fb_program_layout(p), &s, NULL, 0), 0);
  return s;
}

static int add(fb_session *s, const fb_kernel *k) {
  int id = fb_session_add_kernel(s, k);
  ck_assert_msg(id >= 0, "add %s: %s (%s)", k->name, fb_strerror(id), fb_session_errmsg(s));
  return id;
}

static void launch(fb_session *s, int k, const fb_value *args, int nargs, fb_value *ret) {
  int rc = fb_launch(s, k, args, nargs, ret);
  ck_assert_msg(rc == 0, "launch: %s (%s)", fb_strerror(rc), fb_session_errmsg(s));
}

static void eread(fb_session *s, const fb_lang_field *f, int c, void *dst, size_t bytes) {
  int rc = fb_field_read(s, f->places[c], dst, bytes);
  ck_assert_msg(rc == 0, "read %s: %s (%s)", f->name, fb_strerror(rc), fb_session_errmsg(s));
}

/* Copy every field of the interpreter into the session. */
static void copy_inputs(fb_interp *in, fb_session *s, fb_program *p) {
  const fb_layout *l = fb_program_layout(p);
  for (int f = 0; f < fb_program_nfields(p); f++) {
    const fb_lang_field *fl = fb_program_field(p, f);
    for (int c = 0; c < fl->ncomp; c++) {
      size_t bytes = (size_t)fb_field_numel(l, fl->places[c]) * fb_type_size(fl->type);
      ck_assert_int_eq(fb_field_write(s, fl->places[c], fb_interp_field(in, fl->places[c]), bytes),
                       0);
    }
  }
}

/* Every field of the session equals the interpreter's (within rtol). */
static void same_fields(fb_interp *in, fb_session *s, fb_program *p, double rtol) {
  const fb_layout *l = fb_program_layout(p);
  for (int f = 0; f < fb_program_nfields(p); f++) {
    const fb_lang_field *fl = fb_program_field(p, f);
    size_t es = fb_type_size(fl->type);
    for (int c = 0; c < fl->ncomp; c++) {
      int64_t n = fb_field_numel(l, fl->places[c]);
      char *got = malloc((size_t)n * es);
      const char *want = fb_interp_field(in, fl->places[c]);
      eread(s, fl, c, got, (size_t)n * es);
      for (int64_t j = 0; j < n; j++) {
        double x = fb_value_as_f64(fb_value_load(fl->type, want + j * (int64_t)es));
        double y = fb_value_as_f64(fb_value_load(fl->type, got + j * (int64_t)es));
        ck_assert_msg(x == y || fabs(x - y) <= rtol * fabs(x),
                      "%s.%d[%lld]: interpreter %.9g, engine %.9g", fl->name, c, (long long)j, x,
                      y);
      }
      free(got);
    }
  }
}

static uint64_t lcg(uint64_t *s) {
  *s = *s * 6364136223846793005ull + 1442695040888963407ull;
  return *s >> 33;
}
static double urand(uint64_t *s) { return (double)lcg(s) / 2147483648.0 * 2.0 - 1.0; }

/* ---------------------------------------------------------------- integer division */

static const char *const divmod_src =
    "layout { dense(ij: 17, 9) { place q: i32, r: i32, t: f32, fq: f32, fr: f32, lq: i64, lr: i64 "
    "} }\n"
    "kernel divmod() {\n"
    "  for i, j in q {\n"
    "    let a = i - 8\n"
    "    let b = j - 4\n"
    "    if b != 0 {\n"
    "      q[i, j] = a // b\n"
    "      r[i, j] = a % b\n"
    "      t[i, j] = a / b\n"
    "      let x = f32(a) * 0.75\n"
    "      fq[i, j] = x // f32(b)\n"
    "      fr[i, j] = x % f32(b)\n"
    "      lq[i, j] = i64(a) * 1000000007 // i64(b)\n"
    "      lr[i, j] = i64(a) * 1000000007 % i64(b)\n"
    "    }\n"
    "  }\n"
    "}\n"
    "kernel folded() -> i32 { return (-7 // 2) * 100 + (-7 % 2) * 10 + (7 % -2) }\n";

static int64_t py_div(int64_t a, int64_t b) {
  int64_t q = a / b;
  return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}

static void check_divmod(const int32_t *q, const int32_t *r, const float *t, const float *fq,
                         const float *fr, const int64_t *lq, const int64_t *lr) {
  for (int i = 0; i < 17; i++)
    for (int j = 0; j < 9; j++) {
      int a = i - 8, b = j - 4, at = i * 9 + j;
      if (b == 0) continue;
      ck_assert_int_eq(q[at], py_div(a, b));
      ck_assert_int_eq(r[at], a - b * py_div(a, b));
      ck_assert_msg(r[at] == 0 || (r[at] < 0) == (b < 0), "%d %% %d = %d", a, b, r[at]);
      ck_assert_float_eq(t[at], (float)a / (float)b);
      float x = (float)a * 0.75f, y = (float)b;
      ck_assert_float_eq(fq[at], floorf(x / y));
      float m = fmodf(x, y);
      if (m != 0 && ((m < 0) != (y < 0))) m += y;
      ck_assert_float_eq(fr[at], m);
      int64_t big = (int64_t)a * 1000000007;
      ck_assert_int_eq(lq[at], py_div(big, b));
      ck_assert_int_eq(lr[at], big - b * py_div(big, b));
    }
}

START_TEST(int_divmod) {
  fb_program *p = prog(divmod_src);
  fb_kernel *k = inst(p, "divmod", NULL, NULL), *f = inst(p, "folded", NULL, NULL);
  fb_interp *in = fb_interp_new(fb_program_layout(p), 1);
  irun(in, k, NULL, 0, NULL);
  fb_value ret;
  irun(in, f, NULL, 0, &ret);
  ck_assert_int_eq(ret.v.i, -400 + 10 - 1);
  check_divmod(icomp(in, p, "q", 0), icomp(in, p, "r", 0), icomp(in, p, "t", 0),
               icomp(in, p, "fq", 0), icomp(in, p, "fr", 0), icomp(in, p, "lq", 0),
               icomp(in, p, "lr", 0));
  fb_interp_free(in);

  fb_engine *e = engine();
  fb_session *s = session(e, p);
  launch(s, add(s, k), NULL, 0, NULL);
  launch(s, add(s, f), NULL, 0, &ret);
  ck_assert_int_eq(ret.v.i, -391);
  int32_t q[153], r[153];
  float t[153], fq[153], fr[153];
  int64_t lq[153], lr[153];
  eread(s, field(p, "q"), 0, q, sizeof q);
  eread(s, field(p, "r"), 0, r, sizeof r);
  eread(s, field(p, "t"), 0, t, sizeof t);
  eread(s, field(p, "fq"), 0, fq, sizeof fq);
  eread(s, field(p, "fr"), 0, fr, sizeof fr);
  eread(s, field(p, "lq"), 0, lq, sizeof lq);
  eread(s, field(p, "lr"), 0, lr, sizeof lr);
  check_divmod(q, r, t, fq, fr, lq, lr);
  fb_session_destroy(s);
  fb_engine_destroy(e);
  fb_program_free(p);
}
END_TEST

/* ---------------------------------------------------------------- heat */

#define HN 24
static const char *const heat_src =
    "layout { dense(ij: 24, 24) { place T: f32, U: f32 } }\n"
    "func at(F: field, i: i32, j: i32) -> f32 {\n"
    "  return F[clamp(i, 0, 23), clamp(j, 0, 23)]\n"
    "}\n"
    "kernel init() {\n"
    "  for i, j in T { T[i, j] = (i - 12) ** 2 + (j - 12) ** 2 < 16 ? 100.0 : 0.0 }\n"
    "}\n"
    "kernel step(A: field, B: field, k: f32) {\n"
    "  for i, j in A {\n"
    "    let lap = at(A, i - 1, j) + at(A, i + 1, j) + at(A, i, j - 1) + at(A, i, j + 1) - 4.0 * "
    "A[i, j]\n"
    "    B[i, j] = A[i, j] + k * lap\n"
    "  }\n"
    "}\n";

static int clampi(int x) { return x < 0 ? 0 : x > HN - 1 ? HN - 1 : x; }

static void heat_ref(float *T, int steps, float k) {
  float U[HN * HN];
  for (int i = 0; i < HN; i++)
    for (int j = 0; j < HN; j++)
      T[i * HN + j] = (i - 12) * (i - 12) + (j - 12) * (j - 12) < 16 ? 100.0f : 0.0f;
  for (int s = 0; s < steps; s++) {
    float *A = s % 2 ? U : T, *B = s % 2 ? T : U;
    for (int i = 0; i < HN; i++)
      for (int j = 0; j < HN; j++) {
        float lap = A[clampi(i - 1) * HN + j] + A[clampi(i + 1) * HN + j];
        lap = lap + A[i * HN + clampi(j - 1)];
        lap = lap + A[i * HN + clampi(j + 1)];
        lap = lap - 4.0f * A[i * HN + j];
        B[i * HN + j] = A[i * HN + j] + k * lap;
      }
  }
  if (steps % 2) memcpy(T, U, sizeof U);
}

START_TEST(heat) {
  fb_program *p = prog(heat_src);
  fb_kernel *init = inst(p, "init", NULL, NULL);
  fb_kernel *tu = inst(p, "step", "T", "U"), *ut = inst(p, "step", "U", "T");
  const int steps = 20;
  float ref[HN * HN], got[HN * HN];
  heat_ref(ref, steps, 0.2f);
  double total = 0;
  for (int i = 0; i < HN * HN; i++) total += ref[i];
  ck_assert(total > 1000); /* something diffused */
  ck_assert(ref[0] < 1e-3f && ref[12 * HN + 12] < 100.0f && ref[12 * HN + 18] > 0);

  fb_value k = fb_value_f32(0.2f);
  fb_interp *in = fb_interp_new(fb_program_layout(p), 1);
  irun(in, init, NULL, 0, NULL);
  for (int s = 0; s < steps; s++) irun(in, s % 2 ? ut : tu, &k, 1, NULL);
  const float *T = icomp(in, p, "T", 0);
  for (int i = 0; i < HN * HN; i++) ck_assert_float_eq_tol(T[i], ref[i], 1e-4);
  fb_interp_free(in);

  fb_engine *e = engine();
  fb_session *s = session(e, p);
  int ki = add(s, init), k1 = add(s, tu), k2 = add(s, ut);
  launch(s, ki, NULL, 0, NULL);
  for (int st = 0; st < steps; st++) launch(s, st % 2 ? k2 : k1, &k, 1, NULL);
  eread(s, field(p, "T"), 0, got, sizeof got);
  for (int i = 0; i < HN * HN; i++) ck_assert_float_eq_tol(got[i], ref[i], 1e-4);
  fb_session_destroy(s);
  fb_engine_destroy(e);
  fb_program_free(p);
}
END_TEST

/* ---------------------------------------------------------------- life */

#define LN 16
static const char *const life_src =
    "layout { dense(ij: 16, 16) { place a: i32, b: i32 } }\n"
    "kernel step(S: field, D: field) {\n"
    "  for i, j in S {\n"
    "    var n = 0\n"
    "    for di in -1 .. 2 {\n"
    "      for dj in -1 .. 2 {\n"
    "        if di == 0 && dj == 0 { continue }\n"
    "        n += S[(i + di) % 16, (j + dj) % 16]\n"
    "      }\n"
    "    }\n"
    "    let alive = S[i, j] == 1\n"
    "    D[i, j] = (alive && (n == 2 || n == 3)) || (!alive && n == 3) ? 1 : 0\n"
    "  }\n"
    "}\n";

static void life_ref(int *g, int gens) {
  int h[LN * LN];
  for (int s = 0; s < gens; s++) {
    for (int i = 0; i < LN; i++)
      for (int j = 0; j < LN; j++) {
        int n = 0;
        for (int di = -1; di <= 1; di++)
          for (int dj = -1; dj <= 1; dj++)
            if (di || dj) n += g[((i + di + LN) % LN) * LN + (j + dj + LN) % LN];
        int alive = g[i * LN + j];
        h[i * LN + j] = (alive && (n == 2 || n == 3)) || (!alive && n == 3);
      }
    memcpy(g, h, sizeof h);
  }
}

static void life_seed(int32_t *g) {
  memset(g, 0, sizeof(int32_t) * LN * LN);
  /* a glider crossing the corner and a blinker on the edge */
  int cells[][2] = {{0, 1}, {1, 2}, {2, 0}, {2, 1}, {2, 2}, {8, 15}, {8, 0}, {8, 1}};
  for (size_t c = 0; c < sizeof cells / sizeof cells[0]; c++) g[cells[c][0] * LN + cells[c][1]] = 1;
}

START_TEST(life) {
  fb_program *p = prog(life_src);
  fb_kernel *ab = inst(p, "step", "a", "b"), *ba = inst(p, "step", "b", "a");
  const int gens = 40; /* the glider wraps around the torus */
  int ref[LN * LN];
  int32_t seed[LN * LN], got[LN * LN];
  life_seed(seed);
  for (int i = 0; i < LN * LN; i++) ref[i] = seed[i];
  life_ref(ref, gens);
  int live = 0;
  for (int i = 0; i < LN * LN; i++) live += ref[i];
  ck_assert_int_eq(live, 8);

  fb_interp *in = fb_interp_new(fb_program_layout(p), 1);
  memcpy(icomp(in, p, "a", 0), seed, sizeof seed);
  for (int s = 0; s < gens; s++) irun(in, s % 2 ? ba : ab, NULL, 0, NULL);
  const int32_t *A = icomp(in, p, "a", 0);
  for (int i = 0; i < LN * LN; i++) ck_assert_int_eq(A[i], ref[i]);
  fb_interp_free(in);

  fb_engine *e = engine();
  fb_session *s = session(e, p);
  int k1 = add(s, ab), k2 = add(s, ba);
  ck_assert_int_eq(fb_field_write(s, field(p, "a")->places[0], seed, sizeof seed), 0);
  for (int st = 0; st < gens; st++) launch(s, st % 2 ? k2 : k1, NULL, 0, NULL);
  eread(s, field(p, "a"), 0, got, sizeof got);
  for (int i = 0; i < LN * LN; i++) ck_assert_int_eq(got[i], ref[i]);
  fb_session_destroy(s);
  fb_engine_destroy(e);
  fb_program_free(p);
}
END_TEST

/* ---------------------------------------------------------------- control flow */

static const char *const flow_src =
    "layout { dense(i: 16) { place x: i32, y: i32, z: f32 }\n place hits: i32 }\n"
    "func collatz(n: i32) -> i32 {\n"
    "  var k = n\n  var steps = 0\n"
    "  while k != 1 {\n"
    "    if steps >= 100 { return -1 }\n"
    "    k = k % 2 == 0 ? k // 2 : 3 * k + 1\n"
    "    steps += 1\n"
    "  }\n"
    "  return steps\n"
    "}\n"
    "func first_div(n: i32) -> i32 {\n"
    "  for d in 2 .. n { if n % d == 0 { return d } }\n"
    "  return n\n"
    "}\n"
    "kernel flow(bias: i32) -> i32 {\n"
    "  hits[] = 0\n"
    "  for i in 0 .. 16 {\n"
    "    if i == 0 { continue }\n"
    "    x[i] = collatz(i)\n"
    "    y[i] = first_div(i + 1) + bias\n"
    "    var acc = 0.0\n"
    "    var j = 0\n"
    "    while true {\n"
    "      j += 1\n"
    "      if j > i { break }\n"
    "      if j % 3 == 0 { continue }\n"
    "      acc += 1.0 / f32(j)\n"
    "    }\n"
    "    z[i] = acc\n"
    "    if i % 4 == 1 { hits[] += 1 }\n"
    "  }\n"
    "  let p = 2 ** 10 + bias ** 2\n"
    "  return hits[] * 10000 + p\n"
    "}\n";

static int collatz(int n) {
  int k = n, s = 0;
  while (k != 1) {
    if (s >= 100) return -1;
    k = k % 2 == 0 ? k / 2 : 3 * k + 1;
    s++;
  }
  return s;
}

START_TEST(control_flow) {
  fb_program *p = prog(flow_src);
  fb_kernel *k = inst(p, "flow", NULL, NULL);
  fb_value arg = fb_value_i32(5), ret;
  fb_interp *in = fb_interp_new(fb_program_layout(p), 1);
  irun(in, k, &arg, 1, &ret);
  ck_assert_int_eq(ret.type, FB_T_I32);
  ck_assert_int_eq(ret.v.i, 4 * 10000 + 1024 + 25);
  const int32_t *x = icomp(in, p, "x", 0), *y = icomp(in, p, "y", 0);
  const float *z = icomp(in, p, "z", 0);
  ck_assert_int_eq(x[0], 0);
  for (int i = 1; i < 16; i++) {
    ck_assert_int_eq(x[i], collatz(i));
    int n = i + 1, d = 2;
    while (d < n && n % d) d++;
    ck_assert_int_eq(y[i], d + 5);
    float acc = 0;
    for (int j = 1; j <= i; j++)
      if (j % 3) acc += 1.0f / (float)j;
    ck_assert_float_eq_tol(z[i], acc, 1e-6);
  }
  fb_interp_free(in);

  fb_engine *e = engine();
  fb_session *s = session(e, p);
  launch(s, add(s, k), &arg, 1, &ret);
  ck_assert_int_eq(ret.v.i, 41049);
  int32_t ex[16];
  eread(s, field(p, "x"), 0, ex, sizeof ex);
  for (int i = 1; i < 16; i++) ck_assert_int_eq(ex[i], collatz(i));
  fb_session_destroy(s);
  fb_engine_destroy(e);
  fb_program_free(p);
}
END_TEST

/* ---------------------------------------------------------------- random */

START_TEST(random_values) {
  fb_program *p = prog("layout { dense(i: 64) { place r: f32, s: f32 } }\n"
                       "kernel roll() { for i in r { r[i] = random()\n s[i] = random() } }\n");
  fb_kernel *k = inst(p, "roll", NULL, NULL);
  fb_interp *a = fb_interp_new(fb_program_layout(p), 7),
            *b = fb_interp_new(fb_program_layout(p), 7);
  irun(a, k, NULL, 0, NULL);
  irun(b, k, NULL, 0, NULL);
  const float *ra = icomp(a, p, "r", 0), *sa = icomp(a, p, "s", 0), *rb = icomp(b, p, "r", 0);
  int distinct = 0;
  for (int i = 0; i < 64; i++) {
    ck_assert(ra[i] >= 0.0f && ra[i] < 1.0f);
    ck_assert(sa[i] >= 0.0f && sa[i] < 1.0f);
    ck_assert_float_eq(ra[i], rb[i]); /* same seed, same values */
    distinct += ra[i] != sa[i] && (i == 0 || ra[i] != ra[i - 1]);
  }
  ck_assert_int_ge(distinct, 60);
  /* the engine draws the same numbers (same seed, launch, site, iteration) */
  fb_engine *e = engine();
  fb_session_config sc = {.mode = "sync", .seed = 7};
  fb_session *s = NULL;
  ck_assert_int_eq(fb_session_create(e, &sc, fb_program_layout(p), &s, NULL, 0), 0);
  launch(s, add(s, k), NULL, 0, NULL);
  same_fields(a, s, p, 0);
  fb_session_destroy(s);
  fb_engine_destroy(e);
  fb_interp_free(a);
  fb_interp_free(b);
  fb_program_free(p);
}
END_TEST

/* random() must not depend on how the iterations are split between
 * threads: one worker and five workers give the same numbers. */
START_TEST(random_thread_counts) {
  enum {
    N = 1 << 16
  };
  fb_program *p = prog("layout { dense(i: 65536) { place r: f32 } }\n"
                       "kernel roll() { for i in r {\n"
                       "  var acc = 0.0\n"
                       "  for k in 0 .. i % 3 { acc += random() }\n"
                       "  r[i] = acc + random()\n"
                       "} }\n");
  fb_kernel *k = inst(p, "roll", NULL, NULL);
  float *out[2];
  int threads[2] = {1, 5};
  for (int t = 0; t < 2; t++) {
    fb_engine_config cfg = {fbt_backend(), 1, threads[t]};
    fb_engine *e = NULL;
    char err[256];
    ck_assert_int_eq(fb_engine_create(&cfg, &e, err, sizeof err), 0);
    fb_session_config sc = {.mode = "sync", .seed = 11};
    fb_session *s = NULL;
    ck_assert_int_eq(fb_session_create(e, &sc, fb_program_layout(p), &s, NULL, 0), 0);
    int id = add(s, k);
    launch(s, id, NULL, 0, NULL);
    launch(s, id, NULL, 0, NULL); /* the second launch draws new numbers */
    out[t] = malloc(sizeof(float) * N);
    ck_assert_int_eq(fb_field_read(s, field(p, "r")->places[0], out[t], sizeof(float) * N), 0);
    fb_session_destroy(s);
    fb_engine_destroy(e);
  }
  int nonzero = 0;
  for (int i = 0; i < N; i++) {
    ck_assert_msg(out[0][i] == out[1][i], "r[%d]: %g with 1 thread, %g with 5", i, out[0][i],
                  out[1][i]);
    nonzero += out[0][i] != 0.0f;
  }
  ck_assert_int_gt(nonzero, N - 16);
  free(out[0]);
  free(out[1]);
  fb_program_free(p);
}
END_TEST

/* ---------------------------------------------------------------- vectors */

static const char *const vec_src =
    "layout { dense(i: 8) {\n"
    "  place a: f32[3], b: f32[3], M: f32[3][3], Q: f64[4][4]\n"
    "  place d: f32, c: f32[3], n: f32, o: f32[3][3], Mi: f32[3][3], det: f32, tr: f32\n"
    "  place mv: f32[3], Qi: f64[4][4], qdet: f64, w: f32[3], e: f32, ivs: i32\n"
    "} }\n"
    "kernel vec() {\n"
    "  for i in 0 .. 8 {\n"
    "    let x = a[i]\n"
    "    let y = b[i]\n"
    "    d[i] = dot(x, y)\n"
    "    c[i] = cross(x, y)\n"
    "    n[i] = x.norm() + norm_sqr(y)\n"
    "    o[i] = outer(x, y) + transpose(M[i]) * 0.5\n"
    "    Mi[i] = inverse(M[i])\n"
    "    det[i] = determinant(M[i])\n"
    "    tr[i] = trace(M[i] @ M[i])\n"
    "    mv[i] = M[i] @ x - y @ M[i] + normalized(y) * 2\n"
    "    Qi[i] = inverse(Q[i])\n"
    "    qdet[i] = Q[i].determinant()\n"
    "    var v = f32[3](0.0)\n"
    "    for k in 0 .. 3 {\n"
    "      v[k] = x[k] * f32(k + 1) + M[i][k][(k + i) % 3]\n"
    "    }\n"
    "    w[i] = v\n"
    "    e[i] = max(x[0], x[1], x[2]) - min(y.x, y.y) + abs(-x.z) + select(x[0] > y[0], 1.0, 2.0)\n"
    "    let iv = i32(x * 100.0)\n"
    "    ivs[i] = iv.x + iv[1] * 1000\n"
    "  }\n"
    "}\n";

typedef struct vecdata {
  float a[8][3], b[8][3], M[8][9];
  double Q[8][16];
} vecdata;

static void put(fb_interp *in, fb_program *p, const char *f, int comp, int i, double v) {
  const fb_lang_field *fl = field(p, f);
  void *arr = icomp(in, p, f, comp);
  if (fl->type == FB_T_F64) ((double *)arr)[i] = v;
  else ((float *)arr)[i] = (float)v;
}

static double get(fb_interp *in, fb_program *p, const char *f, int comp, int i) {
  const fb_lang_field *fl = field(p, f);
  void *arr = icomp(in, p, f, comp);
  return fl->type == FB_T_F64 ? ((double *)arr)[i] : ((float *)arr)[i];
}

static double det3(const double *m) {
  return m[0] * (m[4] * m[8] - m[5] * m[7]) - m[1] * (m[3] * m[8] - m[5] * m[6]) +
         m[2] * (m[3] * m[7] - m[4] * m[6]);
}

static double det4(const double *m) {
  double s = 0;
  for (int j = 0; j < 4; j++) {
    double sub[9];
    int n = 0;
    for (int r = 1; r < 4; r++)
      for (int c = 0; c < 4; c++)
        if (c != j) sub[n++] = m[r * 4 + c];
    s += (j % 2 ? -1 : 1) * m[j] * det3(sub);
  }
  return s;
}

START_TEST(vectors) {
  fb_program *p = prog(vec_src);
  fb_kernel *k = inst(p, "vec", NULL, NULL);
  fb_interp *in = fb_interp_new(fb_program_layout(p), 1);
  vecdata D;
  uint64_t seed = 42;
  for (int i = 0; i < 8; i++) {
    for (int c = 0; c < 3; c++) {
      put(in, p, "a", c, i, D.a[i][c] = (float)urand(&seed));
      put(in, p, "b", c, i, D.b[i][c] = (float)urand(&seed));
    }
    for (int c = 0; c < 9; c++)
      put(in, p, "M", c, i, D.M[i][c] = (float)(urand(&seed) + (c % 4 == 0 ? 2 : 0)));
    for (int c = 0; c < 16; c++)
      put(in, p, "Q", c, i, D.Q[i][c] = urand(&seed) + (c % 5 == 0 ? 3 : 0));
  }
  fb_engine *e = engine();
  fb_session *s = session(e, p);
  copy_inputs(in, s, p);
  launch(s, add(s, k), NULL, 0, NULL);
  irun(in, k, NULL, 0, NULL);
  same_fields(in, s, p, 1e-6);
  fb_session_destroy(s);
  fb_engine_destroy(e);
  for (int i = 0; i < 8; i++) {
    const float *x = D.a[i], *y = D.b[i];
    double m[9];
    for (int c = 0; c < 9; c++) m[c] = D.M[i][c];
    ck_assert_double_eq_tol(get(in, p, "d", 0, i), x[0] * y[0] + x[1] * y[1] + x[2] * y[2], 1e-5);
    ck_assert_double_eq_tol(get(in, p, "c", 0, i), x[1] * y[2] - x[2] * y[1], 1e-5);
    ck_assert_double_eq_tol(get(in, p, "c", 1, i), x[2] * y[0] - x[0] * y[2], 1e-5);
    ck_assert_double_eq_tol(get(in, p, "c", 2, i), x[0] * y[1] - x[1] * y[0], 1e-5);
    double nx = sqrt(x[0] * x[0] + x[1] * x[1] + x[2] * x[2]),
           ny2 = y[0] * y[0] + y[1] * y[1] + y[2] * y[2];
    ck_assert_double_eq_tol(get(in, p, "n", 0, i), nx + ny2, 1e-5);
    for (int r = 0; r < 3; r++)
      for (int c = 0; c < 3; c++) {
        ck_assert_double_eq_tol(get(in, p, "o", r * 3 + c, i), x[r] * y[c] + m[c * 3 + r] * 0.5,
                                1e-5);
        double mm = 0;
        for (int t = 0; t < 3; t++) mm += m[r * 3 + t] * get(in, p, "Mi", t * 3 + c, i);
        ck_assert_double_eq_tol(mm, r == c, 1e-4); /* M @ inverse(M) = I */
      }
    ck_assert_double_eq_tol(get(in, p, "det", 0, i), det3(m), 1e-4);
    double tr = 0;
    for (int r = 0; r < 3; r++)
      for (int t = 0; t < 3; t++) tr += m[r * 3 + t] * m[t * 3 + r];
    ck_assert_double_eq_tol(get(in, p, "tr", 0, i), tr, 1e-4);
    for (int r = 0; r < 3; r++) {
      double mx = 0, ym = 0;
      for (int t = 0; t < 3; t++) {
        mx += m[r * 3 + t] * x[t];
        ym += y[t] * m[t * 3 + r];
      }
      ck_assert_double_eq_tol(get(in, p, "mv", r, i), mx - ym + 2 * y[r] / sqrt(ny2), 1e-4);
      ck_assert_double_eq_tol(get(in, p, "w", r, i), x[r] * (r + 1) + m[r * 3 + (r + i) % 3], 1e-5);
    }
    ck_assert_double_eq_tol(get(in, p, "qdet", 0, i), det4(D.Q[i]), 1e-9);
    for (int r = 0; r < 4; r++)
      for (int c = 0; c < 4; c++) {
        double mm = 0;
        for (int t = 0; t < 4; t++) mm += D.Q[i][r * 4 + t] * get(in, p, "Qi", t * 4 + c, i);
        ck_assert_double_eq_tol(mm, r == c, 1e-10);
      }
    double e =
        fmax(fmax(x[0], x[1]), x[2]) - fmin(y[0], y[1]) + fabs(x[2]) + (x[0] > y[0] ? 1.0 : 2.0);
    ck_assert_double_eq_tol(get(in, p, "e", 0, i), e, 1e-5);
    ck_assert_int_eq(((int32_t *)icomp(in, p, "ivs", 0))[i],
                     (int32_t)(x[0] * 100.0f) + (int32_t)(x[1] * 100.0f) * 1000);
  }
  fb_interp_free(in);
  fb_program_free(p);
}
END_TEST

/* ---------------------------------------------------------------- svd and polar */

#define NM 20
static const char *const svd_src =
    "layout { dense(i: 20) {\n"
    "  place A3: f32[3][3], U3: f32[3][3], S3: f32[3][3], V3: f32[3][3], R3: f32[3][3], P3: "
    "f32[3][3]\n"
    "  place A2: f32[2][2], U2: f32[2][2], S2: f32[2][2], V2: f32[2][2], R2: f32[2][2], P2: "
    "f32[2][2]\n"
    "  place D3: f64[3][3], DU: f64[3][3], DS: f64[3][3], DV: f64[3][3]\n"
    "  place D2: f64[2][2], EU: f64[2][2], ES: f64[2][2], EV: f64[2][2], ER: f64[2][2], EP: "
    "f64[2][2]\n"
    "} }\n"
    "kernel decompose() {\n"
    "  for i in A3 {\n"
    "    let (u, s, v) = svd(A3[i])\n"
    "    U3[i] = u\n    S3[i] = s\n    V3[i] = v\n"
    "    let (r, q) = polar(A3[i])\n"
    "    R3[i] = r\n    P3[i] = q\n"
    "    let (u2, s2, v2) = svd(A2[i])\n"
    "    U2[i] = u2\n    S2[i] = s2\n    V2[i] = v2\n"
    "    let (r2, q2) = polar(A2[i])\n"
    "    R2[i] = r2\n    P2[i] = q2\n"
    "    let (du, ds, dv) = svd(D3[i])\n"
    "    DU[i] = du\n    DS[i] = ds\n    DV[i] = dv\n"
    "    let (eu, es, ev) = svd(D2[i])\n"
    "    EU[i] = eu\n    ES[i] = es\n    EV[i] = ev\n"
    "    let (er, ep) = polar(D2[i])\n"
    "    ER[i] = er\n    EP[i] = ep\n"
    "  }\n"
    "}\n";

static void mat_get(fb_interp *in, fb_program *p, const char *f, int i, int n, double *m) {
  for (int c = 0; c < n * n; c++) m[c] = get(in, p, f, c, i);
}

static void mul_t(const double *a, const double *b, int n, double *out, int tb) {
  for (int r = 0; r < n; r++)
    for (int c = 0; c < n; c++) {
      double s = 0;
      for (int k = 0; k < n; k++) s += a[r * n + k] * (tb ? b[c * n + k] : b[k * n + c]);
      out[r * n + c] = s;
    }
}

static double fro(const double *a, int n) {
  double s = 0;
  for (int c = 0; c < n * n; c++) s += a[c] * a[c];
  return sqrt(s);
}

static double det(const double *m, int n) { return n == 2 ? m[0] * m[3] - m[1] * m[2] : det3(m); }

static void check_rotation(const double *R, int n, double tol, const char *what, int i) {
  double RtR[9];
  double Rt[9];
  for (int r = 0; r < n; r++)
    for (int c = 0; c < n; c++) Rt[r * n + c] = R[c * n + r];
  mul_t(Rt, Rt, n, RtR, 1); /* R^T R */
  for (int r = 0; r < n; r++)
    for (int c = 0; c < n; c++)
      ck_assert_msg(fabs(RtR[r * n + c] - (r == c)) < tol, "%s[%d] not orthonormal: %g", what, i,
                    RtR[r * n + c]);
  ck_assert_msg(fabs(det(R, n) - 1) < tol, "%s[%d] det %g", what, i, det(R, n));
}

static void check_svd(fb_interp *in, fb_program *p, const char *A, const char *U, const char *S,
                      const char *V, int n, int i, double tol) {
  double a[9], u[9], s[9], v[9], us[9], usv[9];
  mat_get(in, p, A, i, n, a);
  mat_get(in, p, U, i, n, u);
  mat_get(in, p, S, i, n, s);
  mat_get(in, p, V, i, n, v);
  for (int c = 0; c < n * n; c++)
    ck_assert_msg(isfinite(u[c]) && isfinite(s[c]) && isfinite(v[c]), "%s[%d]: not finite", A, i);
  for (int r = 0; r < n; r++)
    for (int c = 0; c < n; c++)
      if (r != c) ck_assert_msg(s[r * n + c] == 0, "S not diagonal");
  for (int r = 0; r + 1 < n; r++) {
    ck_assert(s[r * n + r] >= 0);
    ck_assert_msg(s[r * n + r] + tol >= fabs(s[(r + 1) * n + r + 1]), "%s[%d]: sigma not sorted", A,
                  i);
  }
  mul_t(u, s, n, us, 0);
  mul_t(us, v, n, usv, 1); /* U S V^T */
  double diff[9];
  for (int c = 0; c < n * n; c++) diff[c] = usv[c] - a[c];
  double scale = fro(a, n) > 1e-30 ? fro(a, n) : 1;
  ck_assert_msg(fro(diff, n) / scale < tol, "%s[%d]: |M - U S V^T| / |M| = %g", A, i,
                fro(diff, n) / scale);
  check_rotation(u, n, tol, U, i);
  check_rotation(v, n, tol, V, i);
}

static void check_polar(fb_interp *in, fb_program *p, const char *A, const char *R, const char *P,
                        int n, int i, double tol) {
  double a[9], r[9], q[9], rq[9];
  mat_get(in, p, A, i, n, a);
  mat_get(in, p, R, i, n, r);
  mat_get(in, p, P, i, n, q);
  mul_t(r, q, n, rq, 0);
  double diff[9];
  for (int c = 0; c < n * n; c++) diff[c] = rq[c] - a[c];
  double scale = fro(a, n) > 1e-30 ? fro(a, n) : 1;
  ck_assert_msg(fro(diff, n) / scale < tol, "%s[%d]: |M - R S| / |M| = %g", A, i,
                fro(diff, n) / scale);
  for (int x = 0; x < n; x++)
    for (int y = 0; y < n; y++)
      ck_assert(fabs(q[x * n + y] - q[y * n + x]) < tol * (1 + fro(q, n)));
  if (det(a, n) > 0) check_rotation(r, n, tol, R, i);
}

/* Where M is diagonal the answer is representable and must be exact
 * (docs/language.md): sigma is |diag| in decreasing order with the last
 * negated when det M < 0, U and V are signed permutations, U S V^T == M
 * bit for bit; polar of a positive diagonal is R = I, S = M. */
static void check_exact_diag(fb_interp *in, fb_program *p, const char *A, const char *U,
                             const char *S, const char *V, const char *R, const char *P, int n,
                             int i) {
  double a[9], u[9], s[9], v[9], us[9], usv[9];
  mat_get(in, p, A, i, n, a);
  for (int r = 0; r < n; r++)
    for (int c = 0; c < n; c++)
      if (r != c && a[r * n + c] != 0) return;
  mat_get(in, p, U, i, n, u);
  mat_get(in, p, S, i, n, s);
  mat_get(in, p, V, i, n, v);
  double want[3], sign = 1;
  for (int k = 0; k < n; k++) {
    want[k] = fabs(a[k * n + k]);
    if (a[k * n + k] < 0) sign = -sign;
  }
  for (int k = 0; k < n; k++) /* sort decreasing */
    for (int j = k + 1; j < n; j++)
      if (want[j] > want[k]) {
        double t = want[k];
        want[k] = want[j];
        want[j] = t;
      }
  want[n - 1] *= sign;
  for (int k = 0; k < n; k++)
    ck_assert_msg(s[k * n + k] == want[k], "%s[%d] diagonal: sigma_%d = %.17g, want %.17g", A, i,
                  k, s[k * n + k], want[k]);
  for (int c = 0; c < n * n; c++)
    ck_assert_msg((u[c] == 0 || fabs(u[c]) == 1) && (v[c] == 0 || fabs(v[c]) == 1),
                  "%s[%d] diagonal: U, V not signed permutations", A, i);
  mul_t(u, s, n, us, 0);
  mul_t(us, v, n, usv, 1);
  for (int c = 0; c < n * n; c++)
    ck_assert_msg(usv[c] == a[c], "%s[%d] diagonal: U S V^T inexact", A, i);
  int pos = 1;
  for (int k = 0; k < n; k++) pos &= a[k * n + k] > 0;
  if (!R || !pos) return;
  double r[9], q[9];
  mat_get(in, p, R, i, n, r);
  mat_get(in, p, P, i, n, q);
  for (int c = 0; c < n * n; c++) {
    ck_assert_msg(r[c] == (c % (n + 1) == 0), "%s[%d] positive diagonal: R != I", A, i);
    ck_assert_msg(q[c] == a[c], "%s[%d] positive diagonal: S != M", A, i);
  }
}

/* Test matrices: random, and the hard cases (identity, repeated and zero
 * singular values, reflections, tiny and large scales). */
static void make_matrix(int kind, int n, uint64_t *seed, double *m) {
  for (int c = 0; c < n * n; c++) m[c] = urand(seed);
  switch (kind) {
  case 0:
    for (int c = 0; c < n * n; c++) m[c] = c % (n + 1) == 0;
    break;        /* identity */
  case 1:
    for (int c = 0; c < n * n; c++) m[c] = c % (n + 1) == 0 ? (c ? 3 : 1) : 0;
    break;
  case 2:
    for (int c = 0; c < n * n; c++) m[c] = 0;
    break;                       /* zero */
  case 3:
    for (int r = 0; r < n; r++)
      for (int c = 0; c < n; c++) m[r * n + c] = (r + 1.0) * (c - 0.5);
    break; /* rank 1 */
  case 4:
    for (int c = 0; c < n; c++) m[c] = -m[c];
    m[0] = -fabs(m[0]) - 1;
    break; /* reflection-ish */
  case 5:
    for (int c = 0; c < n * n; c++) m[c] *= 1e-3;
    break;
  case 6:
    for (int c = 0; c < n * n; c++) m[c] *= 1e3;
    break;
  case 7:
    for (int c = 0; c < n; c++) m[(n - 1) * n + c] = m[c] * 2;
    break;       /* rank n-1 */
  default: break;
  }
}

/* 2x2 matrices where the closed form's Q = |(a+d, c-b)| / 2 or
 * W = |(a-d, c+b)| / 2 vanishes (reflections, rotations, -I), or tau < 0
 * (the other half-angle formula), or the scales are extreme. */
static const double hard2[][4] = {
    {1, 0, 0, -1},      {0, 1, 1, 0},  {-1, 0, 0, -1}, {0.6, -0.8, 0.8, 0.6},
    {-2, 0, 0, 5},      {0, -3, 2, 0}, {1, 2, 2, 4},   {1e-12, 2e-12, -3e-12, 1e-12},
    {3e4, -1, 2, -4e4},
    /* near identity, diagonal: the exact answer is representable in f32 */
    {1 + 0x1p-23, 0, 0, 1 - 0x1p-24}, {1.1, 0, 0, 0.9},
};

START_TEST(svd_polar) {
  fb_program *p = prog(svd_src);
  fb_kernel *k = inst(p, "decompose", NULL, NULL);
  fb_interp *in = fb_interp_new(fb_program_layout(p), 1);
  uint64_t seed = 7;
  for (int i = 0; i < NM; i++) {
    double m3[9], m2[4], d3[9];
    make_matrix(i, 3, &seed, m3);
    make_matrix(i, 2, &seed, m2);
    make_matrix(i, 3, &seed, d3);
    for (int c = 0; c < 9; c++) {
      put(in, p, "A3", c, i, m3[c]);
      put(in, p, "D3", c, i, d3[c]);
    }
    /* rows 7.. (rank n-1 and random in make_matrix) get the hard 2x2 cases */
    int h = i - 7, nh = (int)(sizeof hard2 / sizeof hard2[0]);
    for (int c = 0; c < 4; c++) {
      if (h >= 0 && h < nh) m2[c] = hard2[h][c];
      put(in, p, "A2", c, i, m2[c]);
      put(in, p, "D2", c, i, i % 2 ? m2[c] : d3[c] - 0.5);
    }
  }
  fb_engine *e = engine();
  fb_session *s = session(e, p);
  copy_inputs(in, s, p);
  launch(s, add(s, k), NULL, 0, NULL);
  irun(in, k, NULL, 0, NULL);
  same_fields(in, s, p, 0); /* the same IEEE operations: bit for bit */
  fb_session_destroy(s);
  fb_engine_destroy(e);
  int negdet = 0, ndiag = 0;
  for (int i = 0; i < NM; i++) {
    check_exact_diag(in, p, "A3", "U3", "S3", "V3", "R3", "P3", 3, i);
    check_exact_diag(in, p, "A2", "U2", "S2", "V2", "R2", "P2", 2, i);
    check_exact_diag(in, p, "D3", "DU", "DS", "DV", NULL, NULL, 3, i);
    check_exact_diag(in, p, "D2", "EU", "ES", "EV", "ER", "EP", 2, i);
    double a2[4];
    mat_get(in, p, "A2", i, 2, a2);
    ndiag += a2[1] == 0 && a2[2] == 0;
    check_svd(in, p, "A3", "U3", "S3", "V3", 3, i, 1e-5);
    check_svd(in, p, "A2", "U2", "S2", "V2", 2, i, 1e-5);
    check_svd(in, p, "D3", "DU", "DS", "DV", 3, i, 1e-12);
    check_svd(in, p, "D2", "EU", "ES", "EV", 2, i, 1e-12);
    check_polar(in, p, "D2", "ER", "EP", 2, i, 1e-12);
    check_polar(in, p, "A3", "R3", "P3", 3, i, 1e-5);
    check_polar(in, p, "A2", "R2", "P2", 2, i, 1e-5);
    double a[9];
    mat_get(in, p, "A3", i, 3, a);
    negdet += det3(a) < 0;
  }
  ck_assert_int_gt(negdet, 0); /* reflections were among the inputs */
  ck_assert_int_ge(ndiag, 6);  /* and diagonal matrices */
  fb_interp_free(in);
  fb_program_free(p);
}
END_TEST

/* ---------------------------------------------------------------- grouped atomics */

/* P2G-style scatters into grids whose cells hold a mass and a 3-vector
 * (place m: f32, v: f32[3]: 16 bytes, two aligned 8-byte words), one grid
 * under a pointer and one dense, both 16-byte cells, and one dense of
 * 24-byte cells: codegen groups the four f32 atomic adds of a cell (one
 * index check, one walk, and one 16-byte compare-and-swap for a 16-aligned
 * cell on x86, two 64-bit ones for the 24-byte cell; emit_mem.c, "Grouped
 * atomics"). Every contribution is a multiple of
 * 1/8 and every sum stays far below 2^20, so the sums are exact in any
 * order and the engine (two threads) must match the interpreter exactly. */
#define GN 4000
static const char *const group_src =
    "layout {\n"
    "  pointer(ij: 2, 2) { dense(ij: 8, 8) { place sm: f32, sv: f32[3] } }\n"
    "  dense(ij: 16, 16) { place dm: f32, dv: f32[3] }\n"
    "  dense(ij: 16, 16) { place om: f32, ov: f32[3], opad: f32[2] }\n"
    "  dense(i: 4000) { place px: f32[2] }\n"
    "}\n"
    "kernel init() {\n"
    "  for p in px { px[p] = [f32(p % 13) + 0.5, f32(p // 13 % 13) + 0.25] }\n"
    "}\n"
    "kernel p2g() {\n"
    "  for p in px {\n"
    "    let b = [i32(px[p][0]), i32(px[p][1])]\n"
    "    let w = f32(p % 5) * 0.25\n"
    "    for a in 0 .. 3 {\n"
    "      for c in 0 .. 3 {\n"
    "        sv[b[0] + a, b[1] + c] += w * [1.0, 2.0, 3.0]\n"
    "        sm[b[0] + a, b[1] + c] += w\n"
    "        dv[b[0] + a, b[1] + c] += w * [1.0, -2.0, 0.5]\n"
    "        dm[b[0] + a, b[1] + c] += w\n"
    "        ov[b[0] + a, b[1] + c] += w * [0.5, 4.0, -1.0]\n"
    "        om[b[0] + a, b[1] + c] += w\n"
    "      }\n"
    "    }\n"
    "  }\n"
    "}\n";

START_TEST(grouped_atomics) {
  fb_program *p = prog(group_src);
  fb_kernel *ki = inst(p, "init", NULL, NULL), *kp = inst(p, "p2g", NULL, NULL);
  fb_interp *in = fb_interp_new(fb_program_layout(p), 1);
  irun(in, ki, NULL, 0, NULL);
  irun(in, kp, NULL, 0, NULL);
  irun(in, kp, NULL, 0, NULL);
  fb_engine *e = engine();
  fb_session *s = session(e, p);
  int a = add(s, ki), b = add(s, kp);
  launch(s, a, NULL, 0, NULL);
  launch(s, b, NULL, 0, NULL);
  launch(s, b, NULL, 0, NULL);
  same_fields(in, s, p, 0);
  /* the sums are there: a particle's weight reached its 3x3 cells */
  const float *dm = icomp(in, p, "dm", 0);
  double total = 0;
  for (int i = 0; i < 256; i++) total += dm[i];
  double want = 0;
  for (int q = 0; q < GN; q++) want += 2 * 9 * (q % 5) * 0.25;
  ck_assert_msg(total == want, "dm sums to %g, want %g", total, want);
  fb_session_destroy(s);
  fb_engine_destroy(e);
  fb_interp_free(in);
  fb_program_free(p);
}
END_TEST

/* Parallel cell loops (codegen/emit.c): a sparse struct_for whose body
 * stores only at its own indices is marked parallel, and LLVM may
 * vectorize its neighbour reads as gathers. A MacCormack-like backtrace
 * (a data-dependent sample of a sparse field, some blocks inactive, reads
 * that cross blocks) and an own-cell read-modify-write, run through the
 * engine (two threads) and the interpreter: every field the same, bit for
 * bit (no reassociation: each cell's value is one expression). */
static const char *const par_src =
    "layout {\n"
    "  pointer(ij: 4, 4) { dense(ij: 16, 16) { place q: f32, u: f32 } }\n"
    "  dense(ij: 64, 64) { place out: f32, acc: f32 }\n"
    "}\n"
    "kernel init() {\n"
    "  for i in 0 .. 64 { for j in 0 .. 64 {\n"
    "    if (i // 16 + j // 16) % 3 != 1 {\n"
    "      q[i, j] = f32(i * 64 + j) * 0.25\n"
    "      u[i, j] = f32((i * 7 + j * 3) % 11) - 5.0\n"
    "    }\n"
    "  } }\n"
    "}\n"
    "func at(i: i32, j: i32) -> f32 { return q[clamp(i, 0, 63), clamp(j, 0, 63)] }\n"
    "kernel trace() {\n"
    "  for i, j in q {\n"
    "    let si = f32(i) - 0.75 * u[i, j]\n"
    "    let sj = f32(j) + 0.5 * u[i, j]\n"
    "    let fi = floor(si)\n"
    "    let fj = floor(sj)\n"
    "    let bi = i32(fi)\n"
    "    let bj = i32(fj)\n"
    "    let a0 = at(bi, bj) + (at(bi + 1, bj) - at(bi, bj)) * (si - fi)\n"
    "    let a1 = at(bi, bj + 1) + (at(bi + 1, bj + 1) - at(bi, bj + 1)) * (si - fi)\n"
    "    out[i, j] = a0 + (a1 - a0) * (sj - fj)\n"
    "    acc[i, j] = acc[i, j] * 0.5 + out[i, j]\n"
    "  }\n"
    "}\n";

START_TEST(parallel_cell_loop) {
  fb_program *p = prog(par_src);
  fb_kernel *ki = inst(p, "init", NULL, NULL), *kt = inst(p, "trace", NULL, NULL);
  fb_interp *in = fb_interp_new(fb_program_layout(p), 1);
  irun(in, ki, NULL, 0, NULL);
  irun(in, kt, NULL, 0, NULL);
  irun(in, kt, NULL, 0, NULL);
  fb_engine *e = engine();
  fb_session *s = session(e, p);
  int a = add(s, ki), b = add(s, kt);
  launch(s, a, NULL, 0, NULL);
  launch(s, b, NULL, 0, NULL);
  launch(s, b, NULL, 0, NULL);
  same_fields(in, s, p, 0);
  /* the reads reached other blocks and inactive ones: out is not q shifted */
  const float *out = icomp(in, p, "out", 0);
  int zero = 0, nonzero = 0;
  for (int c = 0; c < 64 * 64; c++) {
    if (out[c] == 0.0f) zero++;
    else nonzero++;
  }
  ck_assert_msg(zero > 0 && nonzero > 1000, "out: %d zero, %d not", zero, nonzero);
  fb_session_destroy(s);
  fb_engine_destroy(e);
  fb_interp_free(in);
  fb_program_free(p);
}
END_TEST

/* Skipped blocks of a guarded scan (codegen/emit.c): a serial loop whose
 * body is `if c(j) { ... }` with c read from dense fields evaluates c for
 * 8 iterations at once and skips the 8 when none holds. Run through the
 * engine and the interpreter, every field bit for bit: a dynamic trip
 * count that is not a multiple of 8 (a tail), a body that writes the
 * condition of a later iteration of the same scan (the check must not see
 * stale memory), a break, a scan that starts at an odd offset, and scans
 * whose reads leave the field at both ends (the errors come from the
 * iterations that run, the loads there give 0). */
static const char *const scan_src =
    "layout {\n"
    "  dense(ij: 64, 64) { place m: f32 }\n"
    "  dense(i: 64) { place x: f32, out: f32, cnt: i32 }\n"
    "  place n: i32\n"
    "}\n"
    "kernel init() {\n"
    "  n[] = 61\n"
    "  for i in 0 .. 64 {\n"
    "    x[i] = f32(i) * 0.5 + 1.0\n"
    "    for j in 0 .. 64 { if (i * 7 + j * 13) % 23 == 0 { m[i, j] = f32(i + j) * 0.25 + 1.0 } }\n"
    "  }\n"
    "}\n"
    "kernel scan() {\n"
    "  let nn = n[]\n"
    "  for i in 0 .. nn {\n"
    "    var acc = 0.0\n"
    "    var c = 0\n"
    "    for j in 0 .. nn {\n"
    "      if m[i, j] * x[j] > 3.0 { acc += m[i, j] * x[j]\n c += 1 }\n"
    "    }\n"
    "    out[i] = acc\n"
    "    cnt[i] = c\n"
    "  }\n"
    "}\n"
    "kernel chain() {\n"
    "  for i in 0 .. 64 { for j in 3 .. 61 { if m[i, j] != 0.0 { m[i, j + 3] = m[i, j] + 1.0 } } }\n"
    "}\n"
    "kernel first() {\n"
    "  for i in 0 .. 64 {\n"
    "    cnt[i] = -1\n"
    "    for j in 0 .. 64 { if m[i, j] > 9.0 { cnt[i] = j\n break } }\n"
    "  }\n"
    "}\n"
    "kernel past_end() {\n"
    "  for i in 0 .. 64 { var a = 0.0\n for j in 5 .. 75 { if m[i, j] != 0.0 { a += 1.0 } }\n"
    "    out[i] = a }\n"
    "}\n"
    "kernel before_start() {\n"
    "  for i in 0 .. 64 { var a = 0.0\n for j in 0 .. 64 { if m[i, j - 2] != 0.0 { a += 2.0 } }\n"
    "    out[i] = a }\n"
    "}\n";

START_TEST(skipped_scan_blocks) {
  fb_program *p = prog(scan_src);
  const char *names[] = {"init", "scan", "chain", "first", "scan", "past_end", "before_start"};
  const int bad[] = {0, 0, 0, 0, 0, 1, 1};
  fb_interp *in = fb_interp_new(fb_program_layout(p), 1);
  fb_engine *e = engine();
  fb_session *s = session(e, p);
  for (int q = 0; q < 7; q++) {
    fb_kernel *k = inst(p, names[q], NULL, NULL);
    fb_value r;
    int want = fb_interp_run(in, k, NULL, 0, &r);
    ck_assert_int_eq(want, bad[q] ? FB_EBOUNDS : 0);
    int id = add(s, k);
    int rc = fb_launch(s, id, NULL, 0, NULL);
    if (!rc) rc = fb_sync(s);
    ck_assert_msg(rc == want, "%s: engine %s, interpreter %s (%s)", names[q], fb_strerror(rc),
                  fb_strerror(want), fb_session_errmsg(s));
    if (!rc) same_fields(in, s, p, 0);
    if (rc) { /* a fresh session goes on from the interpreter's fields */
      fb_session_destroy(s);
      s = session(e, p);
      copy_inputs(in, s, p);
    }
  }
  /* the scans did something: first's breaks found values in some rows */
  const int *cnt = icomp(in, p, "cnt", 0);
  int found = 0;
  for (int c = 0; c < 64; c++) found += cnt[c] >= 0;
  ck_assert_msg(found > 4, "first: %d rows with a value above 9", found);
  fb_session_destroy(s);
  fb_engine_destroy(e);
  fb_interp_free(in);
  fb_program_free(p);
}
END_TEST

/* ---------------------------------------------------------------- privatized scatter */

/* A P2G-style scatter into a grid that the loop only adds to (codegen/priv.c):
 * each thread adds into its own copy, which the launcher sums into the grid
 * afterwards (runtime/launch.c). Launched three times, so the copies are
 * reused and must come back as -0.0 each time; the grid is all f32 (m and a
 * 2-vector) and under the size bound, the loop long enough for copies. Every
 * contribution is a multiple of 1/8 with sums far below 2^20: exact in any
 * order, so the engine (two threads) must match the interpreter bit for bit,
 * and a cell no particle reaches keeps its -0.0. */
#define PN 6000
static const char *const priv_src =
    "layout {\n"
    "  dense(ij: 32, 32) { place gm: f32, gv: f32[2] }\n"
    "  dense(i: 6000) { place qx: f32[2] }\n"
    "}\n"
    "kernel init() {\n"
    "  for p in qx { qx[p] = [f32(p % 29) + 0.5, f32(p // 29 % 29) + 0.25] }\n"
    "  gm[31, 31] = -0.0\n"
    "  gv[31, 30] = [-0.0, 1.5]\n"
    "}\n"
    "kernel p2g() {\n"
    "  for p in qx {\n"
    "    let b = [i32(qx[p][0]), i32(qx[p][1])]\n"
    "    let w = f32(p % 5) * 0.25\n"
    "    for a in 0 .. 3 {\n"
    "      for c in 0 .. 3 {\n"
    "        gv[b[0] + a, b[1] + c] += w * [1.0, -0.5]\n"
    "        gm[b[0] + a, b[1] + c] += w\n"
    "      }\n"
    "    }\n"
    "  }\n"
    "}\n";

START_TEST(private_scatter) {
  fb_program *p = prog(priv_src);
  fb_kernel *ki = inst(p, "init", NULL, NULL), *kp = inst(p, "p2g", NULL, NULL);
  fb_interp *in = fb_interp_new(fb_program_layout(p), 1);
  irun(in, ki, NULL, 0, NULL);
  for (int r = 0; r < 3; r++) irun(in, kp, NULL, 0, NULL);
  fb_engine *e = engine();
  fb_session *s = session(e, p);
  int a = add(s, ki), b = add(s, kp);
  launch(s, a, NULL, 0, NULL);
  for (int r = 0; r < 3; r++) launch(s, b, NULL, 0, NULL);
  same_fields(in, s, p, 0);
  /* bit for bit: the untouched -0.0 cells, and every word */
  const fb_lang_field *fm = field(p, "gm"), *fv = field(p, "gv");
  uint32_t got[32 * 32], want[32 * 32];
  for (int c = 0; c < 1 + fv->ncomp; c++) {
    const fb_lang_field *f = c == 0 ? fm : fv;
    int comp = c == 0 ? 0 : c - 1;
    eread(s, f, comp, got, sizeof got);
    memcpy(want, icomp(in, p, f->name, comp), sizeof want);
    for (int i = 0; i < 32 * 32; i++)
      ck_assert_msg(got[i] == want[i], "%s.%d[%d]: bits %08x, interpreter %08x", f->name, comp, i,
                    got[i], want[i]);
  }
  eread(s, fm, 0, got, sizeof got);
  ck_assert_uint_eq(got[31 * 32 + 31], 0x80000000u); /* gm[31, 31] = -0.0 */
  eread(s, fv, 0, got, sizeof got);
  ck_assert_uint_eq(got[31 * 32 + 30], 0x80000000u); /* gv[31, 30].0 = -0.0 */
  /* the sums are there: each particle's weight reached its 3x3 cells */
  const float *gm = icomp(in, p, "gm", 0);
  double total = 0, want_total = 0;
  for (int i = 0; i < 32 * 32; i++) total += gm[i];
  for (int q = 0; q < PN; q++) want_total += 3 * 9 * (q % 5) * 0.25;
  ck_assert_msg(total == want_total, "gm sums to %g, want %g", total, want_total);
  fb_session_destroy(s);
  fb_engine_destroy(e);
  fb_interp_free(in);
  fb_program_free(p);
}
END_TEST

/* The integer case (codegen/priv.c): i32 and u32 grids that a loop only
 * adds to, with an f32 grid in the same task (two trees, two word
 * classes, one set of copies). An integer word of a copy holds 0x80000000
 * plus the thread's sum and goes back to 0x80000000 after the launch, the
 * f32 words to -0.0, so the copies serve every launch of either kind.
 * Integer sums are exact in any order (modulo 2^32), so the engine must
 * match the interpreter bit for bit whatever the contributions: negative
 * ones, ones that cancel, and products that wrap past 2^31 and 2^32. */
static const char *const priv_int_src =
    "layout {\n"
    "  dense(ij: 32, 32) { place cnt: i32, hsh: u32 }\n"
    "  dense(ij: 32, 32) { place gm: f32 }\n"
    "  dense(i: 6000) { place qx: f32[2] }\n"
    "}\n"
    "kernel init() {\n"
    "  for p in qx { qx[p] = [f32(p % 29) + 0.5, f32(p // 29 % 29) + 0.25] }\n"
    "  cnt[31, 31] = -7\n"
    "  hsh[30, 31] = u32(4000000000)\n"
    "}\n"
    "kernel count() {\n"
    "  for p in qx {\n"
    "    let b = [i32(qx[p][0]), i32(qx[p][1])]\n"
    "    for a in 0 .. 3 {\n"
    "      for c in 0 .. 3 {\n"
    "        cnt[b[0] + a, b[1] + c] += (p % 7 - 3) * 1000003 * (a + 1)\n"
    "        hsh[b[0] + a, b[1] + c] += u32(p) * u32(2654435) + u32(c)\n"
    "        gm[b[0] + a, b[1] + c] += f32(p % 5) * 0.25\n"
    "      }\n"
    "    }\n"
    "  }\n"
    "}\n";

START_TEST(private_scatter_i32) {
  fb_program *p = prog(priv_int_src);
  fb_kernel *ki = inst(p, "init", NULL, NULL), *kc = inst(p, "count", NULL, NULL);
  fb_interp *in = fb_interp_new(fb_program_layout(p), 1);
  irun(in, ki, NULL, 0, NULL);
  for (int r = 0; r < 3; r++) irun(in, kc, NULL, 0, NULL);
  /* the privatized f32 kernel of private_scatter in the same engine: its
   * copies are the same device buffer, so each kind must leave it as the
   * other expects */
  fb_program *pf = prog(priv_src);
  fb_kernel *kfi = inst(pf, "init", NULL, NULL), *kfp = inst(pf, "p2g", NULL, NULL);
  fb_interp *inf = fb_interp_new(fb_program_layout(pf), 1);
  irun(inf, kfi, NULL, 0, NULL);
  for (int r = 0; r < 3; r++) irun(inf, kfp, NULL, 0, NULL);
  fb_engine *e = engine();
  const char *modes[] = {"sync", "async"};
  for (int m = 0; m < 2; m++) {
    fb_session_config sc = {.mode = modes[m], .seed = 1};
    fb_session *s = NULL, *sf = NULL;
    ck_assert_int_eq(fb_session_create(e, &sc, fb_program_layout(p), &s, NULL, 0), 0);
    ck_assert_int_eq(fb_session_create(e, &sc, fb_program_layout(pf), &sf, NULL, 0), 0);
    int a = add(s, ki), c = add(s, kc), fa = add(sf, kfi), fp = add(sf, kfp);
    launch(s, a, NULL, 0, NULL);
    launch(sf, fa, NULL, 0, NULL);
    for (int r = 0; r < 3; r++) { /* alternated: integer, f32, integer ... */
      launch(s, c, NULL, 0, NULL);
      ck_assert_int_eq(fb_sync(s), 0);
      launch(sf, fp, NULL, 0, NULL);
      ck_assert_int_eq(fb_sync(sf), 0);
    }
    const char *names[] = {"cnt", "hsh", "gm"};
    uint32_t got[32 * 32], want[32 * 32];
    for (int f = 0; f < 3; f++) {
      eread(s, field(p, names[f]), 0, got, sizeof got);
      memcpy(want, icomp(in, p, names[f], 0), sizeof want);
      for (int i = 0; i < 32 * 32; i++)
        ck_assert_msg(got[i] == want[i], "%s %s[%d]: %08x, interpreter %08x", modes[m], names[f], i,
                      got[i], want[i]);
    }
    const fb_lang_field *fm = field(pf, "gm"), *fv = field(pf, "gv");
    for (int f = 0; f < 1 + fv->ncomp; f++) {
      const fb_lang_field *fl = f == 0 ? fm : fv;
      int comp = f == 0 ? 0 : f - 1;
      eread(sf, fl, comp, got, sizeof got);
      memcpy(want, icomp(inf, pf, fl->name, comp), sizeof want);
      for (int i = 0; i < 32 * 32; i++)
        ck_assert_msg(got[i] == want[i], "%s f32 %s.%d[%d]: %08x, interpreter %08x", modes[m],
                      fl->name, comp, i, got[i], want[i]);
    }
    /* untouched cells kept their values; the sums wrapped */
    eread(s, field(p, "cnt"), 0, got, sizeof got);
    ck_assert_int_eq((int32_t)got[31 * 32 + 31], -7);
    eread(s, field(p, "hsh"), 0, got, sizeof got);
    ck_assert_uint_eq(got[30 * 32 + 31], 4000000000u);
    fb_session_destroy(s);
    fb_session_destroy(sf);
  }
  /* the interpreter's integer sums did wrap (else the case shows less) */
  const int32_t *cnt = icomp(in, p, "cnt", 0);
  int64_t wide = 0;
  for (int i = 0; i < 32 * 32; i++) wide += cnt[i];
  ck_assert_msg(wide != 0, "cnt is all zero");
  fb_engine_destroy(e);
  fb_interp_free(in);
  fb_interp_free(inf);
  fb_program_free(p);
  fb_program_free(pf);
}
END_TEST

/* ---------------------------------------------------------------- folding agrees with run time */

/* What the front end computes while compiling (a cast of a literal, an
 * operator between literals) must be what the same operation gives at run
 * time on the literal's i64 or f64 value read from a field: one kernel
 * holds every expression folded, another computes it from fields, and
 * both run in the interpreter and the engine. */

typedef struct dlit {
  const char *text;
  double v;
} dlit;
typedef struct ilit {
  const char *text;
  int64_t v;
} ilit;

static const dlit fold_f[] = {
    {"1e300", 1e300},
    {"-1e300", -1e300},
    {"(0.0 / 0.0)", NAN},
    {"(1.0 / 0.0)", INFINITY},
    {"(-1.0 / 0.0)", -INFINITY},
    {"2147483647.5", 2147483647.5},
    {"2147483648.0", 2147483648.0},
    {"-2147483648.5", -2147483648.5},
    {"-2147483649.0", -2147483649.0},
    {"4294967295.5", 4294967295.5},
    {"4294967296.0", 4294967296.0},
    {"-0.75", -0.75},
    {"-1.0", -1.0},
    {"0.5", 0.5},
    {"9223372036854775807.0", 9223372036854775807.0},
    {"-9223372036854775808.0", -9223372036854775808.0},
    {"18446744073709551615.0", 18446744073709551615.0},
    {"16777217.0", 16777217.0},
    {"3.5e38", 3.5e38},
    {"1e-50", 1e-50},
    {"-1e-50", -1e-50},
};
#define NFF ((int)(sizeof fold_f / sizeof fold_f[0]))

static const ilit fold_i[] = {
    {"0", 0},
    {"1", 1},
    {"-1", -1},
    {"7", 7},
    {"-7", -7},
    {"64", 64},
    {"65", 65},
    {"2147483648", 2147483648LL},
    {"-2147483649", -2147483649LL},
    {"4294967296", 4294967296LL},
    {"9223372036854775807", INT64_MAX},
    {"(-9223372036854775807 - 1)", INT64_MIN},
    {"9007199254740993", 9007199254740993LL},
};
#define NFI ((int)(sizeof fold_i / sizeof fold_i[0]))

static const char *const fold_types[] = {"i32", "i64", "u32", "u64", "f32", "f64"};
static const char *const fold_iops[] = {"//", "%", "<<", ">>", "*", "+", "-", "&", "|", "^"};
static const char *const fold_iop_names[] = {"fdiv", "mod", "shl", "shr", "mul",
                                             "add",  "sub", "and", "or",  "xor"};
static const char *const fold_fops[] = {"//", "%", "/", "*", "+", "-"};
static const char *const fold_fop_names[] = {"fdiv", "mod", "div", "mul", "add", "sub"};
#define FOLD_N 192 /* cells per field: at least NFI * NFI and NFF * NFF */
#define NFX 9      /* the float operands of the binary operators: fold_f's first NFX */

typedef struct sbuf {
  char *p;
  size_t n, cap;
} sbuf;

static void sb(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb(sbuf *b, const char *fmt, ...) {
  for (;;) {
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(b->p ? b->p + b->n : NULL, b->p ? b->cap - b->n : 0, fmt, ap);
    va_end(ap);
    ck_assert_int_ge(k, 0);
    if (b->p && b->n + (size_t)k < b->cap) {
      b->n += (size_t)k;
      return;
    }
    b->cap = (b->cap + (size_t)k + 1) * 2;
    b->p = realloc(b->p, b->cap);
    ck_assert_ptr_nonnull(b->p);
  }
}

/* One compared pair: field `folded`[i] against `run`[i], both of type t,
 * for expression `what` (the first `n` cells). */
typedef struct fold_cmp {
  char folded[24], run[24];
  int n;
} fold_cmp;

static char *fold_source(fold_cmp *cmp, int *ncmp) {
  sbuf b = {NULL, 0, 0};
  int nc = 0;
  sb(&b, "layout { dense(i: %d) {\n  place fsrc: f64, isrc: i64, pa: i64, pb: i64, xa: f64, xb: f64\n",
     FOLD_N);
  for (int t = 0; t < 6; t++)
    sb(&b, "  place cf_%s: %s, uf_%s: %s, ci_%s: %s, ui_%s: %s\n", fold_types[t], fold_types[t],
       fold_types[t], fold_types[t], fold_types[t], fold_types[t], fold_types[t], fold_types[t]);
  sb(&b, "  place cf_bool: i32, uf_bool: i32, ci_bool: i32, ui_bool: i32, kc_div: f32, ku_div: f32\n");
  for (int o = 0; o < 10; o++) sb(&b, "  place kc_%s: i64, ku_%s: i64\n", fold_iop_names[o], fold_iop_names[o]);
  for (int o = 0; o < 6; o++) sb(&b, "  place xc_%s: f64, xu_%s: f64\n", fold_fop_names[o], fold_fop_names[o]);
  sb(&b, "  place xc_min: f64, xu_min: f64, xc_max: f64, xu_max: f64, xc_lt: i32, xu_lt: i32\n");
  sb(&b, "  place xc_ne: i32, xu_ne: i32\n} }\n");
  /* folded: every cell a constant expression */
  sb(&b, "kernel folded() {\n");
  for (int t = 0; t < 6; t++) {
    for (int v = 0; v < NFF; v++) sb(&b, "  cf_%s[%d] = %s(%s)\n", fold_types[t], v, fold_types[t], fold_f[v].text);
    for (int v = 0; v < NFI; v++) sb(&b, "  ci_%s[%d] = %s(%s)\n", fold_types[t], v, fold_types[t], fold_i[v].text);
  }
  for (int v = 0; v < NFF; v++) sb(&b, "  cf_bool[%d] = i32(bool(%s))\n", v, fold_f[v].text);
  for (int v = 0; v < NFI; v++) sb(&b, "  ci_bool[%d] = i32(bool(%s))\n", v, fold_i[v].text);
  for (int x = 0; x < NFI; x++)
    for (int y = 0; y < NFI; y++) {
      int c = x * NFI + y;
      for (int o = 0; o < 10; o++)
        sb(&b, "  kc_%s[%d] = %s %s %s\n", fold_iop_names[o], c, fold_i[x].text, fold_iops[o], fold_i[y].text);
      sb(&b, "  kc_div[%d] = %s / %s\n", c, fold_i[x].text, fold_i[y].text);
    }
  for (int x = 0; x < NFX; x++)
    for (int y = 0; y < NFX; y++) {
      int c = x * NFX + y;
      const char *a = fold_f[x].text, *d = fold_f[y].text;
      for (int o = 0; o < 6; o++) sb(&b, "  xc_%s[%d] = %s %s %s\n", fold_fop_names[o], c, a, fold_fops[o], d);
      sb(&b, "  xc_min[%d] = min(%s, %s)\n  xc_max[%d] = max(%s, %s)\n", c, a, d, c, a, d);
      sb(&b, "  xc_lt[%d] = i32(%s < %s)\n  xc_ne[%d] = i32(%s != %s)\n", c, a, d, c, a, d);
    }
  sb(&b, "}\n");
  /* at run time: the same operations on the values read from fields */
  sb(&b, "kernel at_run_time() {\n  for i in fsrc {\n");
  for (int t = 0; t < 6; t++)
    sb(&b, "    uf_%s[i] = %s(fsrc[i])\n    ui_%s[i] = %s(isrc[i])\n", fold_types[t], fold_types[t],
       fold_types[t], fold_types[t]);
  sb(&b, "    uf_bool[i] = i32(bool(fsrc[i]))\n    ui_bool[i] = i32(bool(isrc[i]))\n");
  for (int o = 0; o < 10; o++) sb(&b, "    ku_%s[i] = pa[i] %s pb[i]\n", fold_iop_names[o], fold_iops[o]);
  sb(&b, "    ku_div[i] = pa[i] / pb[i]\n");
  for (int o = 0; o < 6; o++) sb(&b, "    xu_%s[i] = xa[i] %s xb[i]\n", fold_fop_names[o], fold_fops[o]);
  sb(&b, "    xu_min[i] = min(xa[i], xb[i])\n    xu_max[i] = max(xa[i], xb[i])\n");
  sb(&b, "    xu_lt[i] = i32(xa[i] < xb[i])\n    xu_ne[i] = i32(xa[i] != xb[i])\n  }\n}\n");
  for (int t = 0; t < 6; t++) {
    snprintf(cmp[nc].folded, 24, "cf_%s", fold_types[t]);
    snprintf(cmp[nc].run, 24, "uf_%s", fold_types[t]);
    cmp[nc++].n = NFF;
    snprintf(cmp[nc].folded, 24, "ci_%s", fold_types[t]);
    snprintf(cmp[nc].run, 24, "ui_%s", fold_types[t]);
    cmp[nc++].n = NFI;
  }
  cmp[nc++] = (fold_cmp){"cf_bool", "uf_bool", NFF};
  cmp[nc++] = (fold_cmp){"ci_bool", "ui_bool", NFI};
  cmp[nc++] = (fold_cmp){"kc_div", "ku_div", NFI * NFI};
  for (int o = 0; o < 10; o++) {
    snprintf(cmp[nc].folded, 24, "kc_%s", fold_iop_names[o]);
    snprintf(cmp[nc].run, 24, "ku_%s", fold_iop_names[o]);
    cmp[nc++].n = NFI * NFI;
  }
  for (int o = 0; o < 6; o++) {
    snprintf(cmp[nc].folded, 24, "xc_%s", fold_fop_names[o]);
    snprintf(cmp[nc].run, 24, "xu_%s", fold_fop_names[o]);
    cmp[nc++].n = NFX * NFX;
  }
  cmp[nc++] = (fold_cmp){"xc_min", "xu_min", NFX * NFX};
  cmp[nc++] = (fold_cmp){"xc_max", "xu_max", NFX * NFX};
  cmp[nc++] = (fold_cmp){"xc_lt", "xu_lt", NFX * NFX};
  cmp[nc++] = (fold_cmp){"xc_ne", "xu_ne", NFX * NFX};
  *ncmp = nc;
  return b.p;
}

/* The expression cell c of field `folded` holds, for messages. */
static void fold_what(const char *folded, int c, char *buf, size_t n) {
  const char *op = strchr(folded, '_') + 1;
  if (folded[0] == 'c' && folded[1] == 'f') snprintf(buf, n, "%s(%s)", op, fold_f[c].text);
  else if (folded[0] == 'c') snprintf(buf, n, "%s(%s)", op, fold_i[c].text);
  else if (folded[0] == 'k') snprintf(buf, n, "%s %s %s", fold_i[c / NFI].text, op, fold_i[c % NFI].text);
  else snprintf(buf, n, "%s %s %s", fold_f[c / NFX].text, op, fold_f[c % NFX].text);
}

static void fold_check(fb_program *p, const fold_cmp *cmp, int ncmp, const char *by,
                       const void *(*get)(void *, fb_program *, const char *), void *user) {
  for (int k = 0; k < ncmp; k++) {
    fb_type t = field(p, cmp[k].folded)->type;
    size_t es = fb_type_size(t);
    const char *a = get(user, p, cmp[k].folded), *r = get(user, p, cmp[k].run);
    for (int c = 0; c < cmp[k].n; c++) {
      fb_value x = fb_value_load(t, a + (size_t)c * es), y = fb_value_load(t, r + (size_t)c * es);
      int nan = fb_type_is_float(t) && isnan(x.v.f) && isnan(y.v.f);
      if (nan || !memcmp(a + (size_t)c * es, r + (size_t)c * es, es)) continue;
      char what[160];
      fold_what(cmp[k].folded, c, what, sizeof what);
      if (fb_type_is_float(t))
        ck_abort_msg("%s: %s folds to %.17g, at run time it is %.17g (%s)", by, what, x.v.f, y.v.f,
                     cmp[k].folded);
      ck_abort_msg("%s: %s folds to %lld (0x%llx), at run time it is %lld (0x%llx) (%s)", by, what,
                   (long long)x.v.i, (unsigned long long)x.v.u, (long long)y.v.i,
                   (unsigned long long)y.v.u, cmp[k].folded);
    }
  }
}

static const void *fold_interp_get(void *user, fb_program *p, const char *name) {
  return icomp(user, p, name, 0);
}

typedef struct fold_eng {
  fb_session *s;
  char *bufs[96];
  int n;
} fold_eng;

static const void *fold_engine_get(void *user, fb_program *p, const char *name) {
  fold_eng *e = user;
  ck_assert_int_lt(e->n, 96);
  const fb_lang_field *f = field(p, name);
  size_t bytes = (size_t)FOLD_N * fb_type_size(f->type);
  char *buf = e->bufs[e->n++] = malloc(bytes);
  eread(e->s, f, 0, buf, bytes);
  return buf;
}

START_TEST(folds_match_run_time) {
  fold_cmp cmp[64];
  int ncmp = 0;
  char *src = fold_source(cmp, &ncmp);
  fb_program *p = prog(src);
  free(src);
  fb_kernel *kf = inst(p, "folded", NULL, NULL), *kr = inst(p, "at_run_time", NULL, NULL);
  fb_interp *in = fb_interp_new(fb_program_layout(p), 1);
  double *fsrc = icomp(in, p, "fsrc", 0), *xa = icomp(in, p, "xa", 0), *xb = icomp(in, p, "xb", 0);
  int64_t *isrc = icomp(in, p, "isrc", 0), *pa = icomp(in, p, "pa", 0), *pb = icomp(in, p, "pb", 0);
  for (int v = 0; v < NFF; v++) fsrc[v] = fold_f[v].v;
  for (int v = 0; v < NFI; v++) isrc[v] = fold_i[v].v;
  for (int x = 0; x < NFI; x++)
    for (int y = 0; y < NFI; y++) {
      pa[x * NFI + y] = fold_i[x].v;
      pb[x * NFI + y] = fold_i[y].v;
    }
  for (int x = 0; x < NFX; x++)
    for (int y = 0; y < NFX; y++) {
      xa[x * NFX + y] = fold_f[x].v;
      xb[x * NFX + y] = fold_f[y].v;
    }
  fb_engine *e = engine();
  fb_session *s = session(e, p);
  copy_inputs(in, s, p);
  irun(in, kf, NULL, 0, NULL);
  irun(in, kr, NULL, 0, NULL);
  launch(s, add(s, kf), NULL, 0, NULL);
  launch(s, add(s, kr), NULL, 0, NULL);
  fold_check(p, cmp, ncmp, "interpreter", fold_interp_get, in);
  fold_eng fe = {s, {NULL}, 0};
  fold_check(p, cmp, ncmp, "engine", fold_engine_get, &fe);
  /* the edge cases the issue named, spelled out */
  const int32_t *ci32 = icomp(in, p, "cf_i32", 0);
  ck_assert_int_eq(ci32[0], INT32_MAX); /* i32(1e300) */
  ck_assert_int_eq(ci32[1], INT32_MIN); /* i32(-1e300) */
  ck_assert_int_eq(ci32[2], 0);         /* i32(NaN) */
  for (int i = 0; i < fe.n; i++) free(fe.bufs[i]);
  fb_session_destroy(s);
  fb_engine_destroy(e);
  fb_interp_free(in);
  fb_program_free(p);
}
END_TEST

/* ---------------------------------------------------------------- constants */

/* Module-level constants are computed when the program is compiled; they
 * must agree with the same operators at run time (ir/arith.c): floored
 * `//` and `%` with every sign, shifts, powers and 64-bit wrap-around. A
 * constant also sizes a layout. */
START_TEST(const_arith) {
  static const int64_t as[] = {-7, 7, -8, 9, -1, 0, 1000000007, INT64_MAX};
  static const int64_t bs[] = {2, -2, 3, -3, 1, -1, 7};
  static const char *const ops[] = {"//", "%", "+", "*", "-", "<<", ">>"};
  enum { NA = sizeof as / sizeof as[0], NB = sizeof bs / sizeof bs[0], NO = 7, N = NA * NB * NO };
  size_t cap = 200000, m = 0;
  char *src = malloc(cap);
  ck_assert_ptr_nonnull(src);
  m += (size_t)snprintf(src + m, cap - m,
                        "const n = %d\nconst half = n // 2\nconst four = (-130) %% 7 + 1\n", N);
  for (int k = 0; k < N; k++) {
    int a = k / (NB * NO), b = k / NO % NB, o = k % NO;
    m += (size_t)snprintf(src + m, cap - m, "const c%d = (%lld) %s (%lld)\n", k, (long long)as[a],
                          ops[o], (long long)bs[b]);
  }
  m += (size_t)snprintf(src + m, cap - m,
                        "layout {\n  dense(i: half * 2) { place cv: i64, rv: i64 }\n"
                        "  dense(i: four) { place s: i32 }\n}\n"
                        "kernel consts() {\n");
  for (int k = 0; k < N; k++) m += (size_t)snprintf(src + m, cap - m, "  cv[%d] = c%d\n", k, k);
  m += (size_t)snprintf(src + m, cap - m, "}\n");
  for (int o = 0; o < NO; o++)
    m += (size_t)snprintf(src + m, cap - m,
                          "kernel run%d(k: i32, a: i64, b: i64) { rv[k] = a %s b }\n", o, ops[o]);
  ck_assert_uint_lt(m, cap);
  fb_program *p = prog(src);
  ck_assert_int_eq(field(p, "cv")->shape[0], N);
  ck_assert_int_eq(field(p, "s")->shape[0], 4); /* Python: -130 % 7 == 3 */
  fb_interp *in = fb_interp_new(fb_program_layout(p), 1);
  irun(in, inst(p, "consts", NULL, NULL), NULL, 0, NULL);
  fb_kernel *run[NO];
  for (int o = 0; o < NO; o++) {
    char name[16];
    snprintf(name, sizeof name, "run%d", o);
    run[o] = inst(p, name, NULL, NULL);
  }
  for (int k = 0; k < N; k++) {
    int a = k / (NB * NO), b = k / NO % NB, o = k % NO;
    fb_value args[3] = {fb_value_i32(k), fb_value_i64(as[a]), fb_value_i64(bs[b])};
    irun(in, run[o], args, 3, NULL);
  }
  const int64_t *cv = icomp(in, p, "cv", 0), *rv = icomp(in, p, "rv", 0);
  for (int k = 0; k < N; k++) {
    int a = k / (NB * NO), b = k / NO % NB, o = k % NO;
    ck_assert_msg(cv[k] == rv[k], "const (%lld) %s (%lld) = %lld, at run time %lld",
                  (long long)as[a], ops[o], (long long)bs[b], (long long)cv[k], (long long)rv[k]);
  }
  /* and Python's answers where they are known */
  ck_assert_int_eq(cv[0 * NB * NO + 0 * NO + 0], -4); /* -7 // 2 */
  ck_assert_int_eq(cv[0 * NB * NO + 0 * NO + 1], 1);  /* -7 % 2 */
  ck_assert_int_eq(cv[1 * NB * NO + 1 * NO + 1], -1); /* 7 % -2 */
  fb_interp_free(in);
  fb_program_free(p);
  free(src);
}
END_TEST

/* ---------------------------------------------------------------- vector indices */

/* x[base + offset] with integer vectors (an MLS-MPM style scatter) does what
 * the same program with every component written out does. */
START_TEST(vector_index) {
  static const char *const fmt =
      "layout { dense(ij: 8, 8) { place gv: f32[2], gm: f32 }\n"
      "         dense(i: 64) { place px: f32[2] } }\n"
      "kernel init() { for p in 0 .. 64 { px[p] = [f32(p %% 8) * 0.8 + 0.3, f32(p // 8) * 0.7 + 0.2] } }\n"
      "kernel p2g() {\n"
      "  for p in 0 .. 64 {\n"
      "    let base = i32[2](i32(px[p][0]), i32(px[p][1]))\n"
      "    for a in 0 .. 2 { for b in 0 .. 2 {\n"
      "      let off = i32[2](a, b)\n"
      "      let w = f32(a + 1) * f32(2 * b + 1)\n"
      "      %s\n"
      "    } }\n"
      "  }\n"
      "}\n";
  static const char *const vec = "gm[(base + off) % 8] += w\n"
                                 "      gv[(base + off) % 8] += w * px[p]";
  static const char *const comp = "gm[(base[0] + a) % 8, (base[1] + b) % 8] += w\n"
                                  "      gv[(base[0] + a) % 8, (base[1] + b) % 8] += w * px[p]";
  char sv[2048], sc[2048];
  snprintf(sv, sizeof sv, fmt, vec);
  snprintf(sc, sizeof sc, fmt, comp);
  fb_program *pv = prog(sv), *pc = prog(sc);
  fb_interp *iv = fb_interp_new(fb_program_layout(pv), 1);
  fb_interp *ic = fb_interp_new(fb_program_layout(pc), 1);
  irun(iv, inst(pv, "init", NULL, NULL), NULL, 0, NULL);
  irun(iv, inst(pv, "p2g", NULL, NULL), NULL, 0, NULL);
  irun(ic, inst(pc, "init", NULL, NULL), NULL, 0, NULL);
  irun(ic, inst(pc, "p2g", NULL, NULL), NULL, 0, NULL);
  const char *names[] = {"gm", "gv", "gv"};
  double total = 0;
  for (int f = 0; f < 3; f++) {
    const float *a = icomp(iv, pv, names[f], f == 2), *b = icomp(ic, pc, names[f], f == 2);
    for (int i = 0; i < 64; i++) {
      ck_assert_msg(fabsf(a[i] - b[i]) <= 1e-5f * fabsf(b[i]), "%s.%d[%d]: %g vs %g", names[f],
                    f == 2, i, a[i], b[i]);
      total += b[i];
    }
  }
  ck_assert(total > 100.0); /* the scatter did happen */
  fb_interp_free(iv);
  fb_interp_free(ic);
  fb_program_free(pv);
  fb_program_free(pc);
}
END_TEST

/* ---------------------------------------------------------------- bool as integer */

/* A bool next to a number is 0 or 1 (Taichi's `t += ti.is_active(...)`,
 * `sum += x > 0`), also assigned to a number; bool with bool stays logic for
 * & | ^ == and counts for arithmetic. */
START_TEST(bool_as_int) {
  fb_program *p = prog("layout {\n"
                       "  dense(i: 8) { place x: f32, n: i32 }\n"
                       "  pointer(i: 8) { place s: i32 }\n"
                       "  place t: i32, sum: f32\n"
                       "}\n"
                       "kernel init() { for i in 0 .. 8 {\n"
                       "  x[i] = f32(i) - 3.5\n"
                       "  if i % 2 == 0 { s[i] = 1 }\n"
                       "} }\n"
                       "kernel k() {\n"
                       "  for i in 0 .. 8 {\n"
                       "    t[] += is_active(s, i)\n"
                       "    sum[] += (x[i] > 0)\n"
                       "    n[i] = i32(i < 3) + (i > 5) * 10 + (i == 2)\n"
                       "    var c: i32 = (i > 1)\n"
                       "    c += (i > 1) + (i > 2)\n"
                       "    n[i] += c * 1000\n"
                       "    if ((i > 1) & (i > 2)) == 1 { n[i] += 100 }\n"
                       "  }\n"
                       "}\n");
  fb_interp *in = fb_interp_new(fb_program_layout(p), 1);
  irun(in, inst(p, "init", NULL, NULL), NULL, 0, NULL);
  irun(in, inst(p, "k", NULL, NULL), NULL, 0, NULL);
  ck_assert_int_eq(*(const int32_t *)icomp(in, p, "t", 0), 4);
  ck_assert_float_eq(*(const float *)icomp(in, p, "sum", 0), 4.0f);
  const int32_t *n = icomp(in, p, "n", 0);
  for (int i = 0; i < 8; i++) {
    int c = (i > 1) + (i > 1) + (i > 2);
    int want = (i < 3) + (i > 5) * 10 + (i == 2) + c * 1000 + ((i > 1) && (i > 2)) * 100;
    ck_assert_int_eq(n[i], want);
  }
  fb_interp_free(in);
  fb_program_free(p);
}
END_TEST


/* ---------------------------------------------------------------- issue 35 language features */

/* Launch the kernels (no arguments) in order on the reference interpreter
 * and on the engine; every field must come out the same. Returns the
 * interpreter, for the caller's checks (and to free). */
static fb_interp *run_both(fb_program *p, const char *const *names, int n) {
  fb_interp *in = fb_interp_new(fb_program_layout(p), 1);
  fb_kernel *ks[8];
  ck_assert(n <= 8);
  for (int i = 0; i < n; i++) {
    ks[i] = inst(p, names[i], NULL, NULL);
    irun(in, ks[i], NULL, 0, NULL);
  }
  fb_engine *e = engine();
  fb_session *s = session(e, p);
  for (int i = 0; i < n; i++) launch(s, add(s, ks[i]), NULL, 0, NULL);
  same_fields(in, s, p, 0);
  fb_session_destroy(s);
  fb_engine_destroy(e);
  return in;
}

/* ndrange with sizes and (lo, hi) pairs, one name for an index vector,
 * grouped(...), an empty range, a range whose extents are known at run
 * time only, a serial ndrange nested in a loop, and a struct-for over a
 * 0-D field (its body runs once). */
START_TEST(ndrange_loops) {
  fb_program *p = prog("layout {\n"
                       "  field a: i32 (ij: 8, 8)\n"
                       "  field b: i32 (ij: 8, 8)\n"
                       "  field g: i32 (ij: 8, 8)\n"
                       "  field c: i32 (i: 64)\n"
                       "  place cnt: i32, once: i32\n"
                       "}\n"
                       "kernel k() {\n"
                       "  for i, j in ndrange(3, (2, 6)) { a[i, j] += 1 + i * 10 + j }\n"
                       "  for I in ndrange((1, 4), (5, 7)) { b[I] = I[0] * 100 + I[1] }\n"
                       "  for i, j in ndrange((5, 3), 4) { cnt[] += 1 }\n"
                       "  for t in 0 .. 2 {\n"
                       "    for i, j in ndrange((1, 3), 2) { c[t * 10 + i * 2 + j] += 1 + t }\n"
                       "  }\n"
                       "  for _ in once { once[] += 5 }\n"
                       "}\n"
                       "kernel k2() {\n"
                       "  let m = once[] - 2\n"
                       "  for i, j in ndrange((1, m), m) { c[40 + i * 8 + j] = i * 8 + j }\n"
                       "  for I in grouped(b) { g[I] = b[I] + I[0] }\n"
                       "  for I in b { if I[1] == 0 { g[I] = -1 } }\n"
                       "}\n");
  const char *const ks[] = {"k", "k2"};
  fb_interp *in = run_both(p, ks, 2);
  const int32_t *a = icomp(in, p, "a", 0), *b = icomp(in, p, "b", 0), *c = icomp(in, p, "c", 0);
  const int32_t *g = icomp(in, p, "g", 0);
  for (int i = 0; i < 8; i++)
    for (int j = 0; j < 8; j++) {
      ck_assert_int_eq(a[i * 8 + j], i < 3 && j >= 2 && j < 6 ? 1 + i * 10 + j : 0);
      int bv = i >= 1 && i < 4 && j >= 5 && j < 7 ? i * 100 + j : 0;
      ck_assert_int_eq(b[i * 8 + j], bv);
      ck_assert_int_eq(g[i * 8 + j], j == 0 ? -1 : bv + i);
    }
  ck_assert_int_eq(*(const int32_t *)icomp(in, p, "cnt", 0), 0);
  ck_assert_int_eq(*(const int32_t *)icomp(in, p, "once", 0), 5);
  for (int x = 0; x < 64; x++) {
    int want = 0;
    for (int t = 0; t < 2; t++)
      for (int i = 1; i < 3; i++)
        for (int j = 0; j < 2; j++)
          if (t * 10 + i * 2 + j == x) want += 1 + t;
    if (x >= 40) {
      int r = x - 40;
      want = r / 8 >= 1 && r / 8 < 3 && r % 8 < 3 ? r : 0;
    }
    ck_assert_msg(c[x] == want, "c[%d] = %d, expected %d", x, c[x], want);
  }
  fb_interp_free(in);
  fb_program_free(p);
}
END_TEST

/* atomic_OP(x, v) returns the value before the operation: on field elements
 * (scalar and vector, at the top level and in a parallel loop) and on a
 * local variable. */
START_TEST(atomic_old_values) {
  fb_program *p = prog("layout {\n"
                       "  field r: i32 (i: 16)\n"
                       "  field fr: f32 (i: 8)\n"
                       "  place x: i32, y: f32, v: f32[2], w: f32[2]\n"
                       "}\n"
                       "kernel k() {\n"
                       "  x[] = 12\n"
                       "  y[] = 1.5\n"
                       "  r[0] = atomic_add(x[], 5)\n"
                       "  r[1] = atomic_sub(x[], 2)\n"
                       "  r[2] = atomic_min(x[], 4)\n"
                       "  r[3] = atomic_max(x[], 9)\n"
                       "  r[4] = atomic_and(x[], 12)\n"
                       "  r[5] = atomic_or(x[], 3)\n"
                       "  r[6] = atomic_xor(x[], 5)\n"
                       "  r[7] = x[]\n"
                       "  fr[0] = atomic_add(y[], 2)\n"
                       "  fr[1] = atomic_max(y[], 0.5)\n"
                       "  fr[2] = y[]\n"
                       "  v[] = [1.0, 2.0]\n"
                       "  w[] = atomic_add(v[], [10.0, 20.0])\n"
                       "  fr[3] = atomic_add(v[][1], 100.0)\n"
                       "  var c = 5\n"
                       "  r[8] = atomic_add(c, 2)\n"
                       "  r[9] = c\n"
                       "  for i in 0 .. 4 {\n"
                       "    var t = i\n"
                       "    r[10 + i] = atomic_max(t, 2) * 10 + t\n"
                       "  }\n"
                       "}\n");
  const char *const ks[] = {"k"};
  fb_interp *in = run_both(p, ks, 1);
  const int32_t *r = icomp(in, p, "r", 0);
  const int32_t want[] = {12, 17, 15, 4, 9, 8, 11, 14, 5, 7, 2, 12, 22, 33};
  for (int i = 0; i < 14; i++) ck_assert_msg(r[i] == want[i], "r[%d] = %d, expected %d", i, r[i], want[i]);
  const float *fr = icomp(in, p, "fr", 0);
  ck_assert_float_eq(fr[0], 1.5f);
  ck_assert_float_eq(fr[1], 3.5f);
  ck_assert_float_eq(fr[2], 3.5f);
  ck_assert_float_eq(fr[3], 22.0f);
  ck_assert_float_eq(*(const float *)icomp(in, p, "w", 0), 1.0f);
  ck_assert_float_eq(*(const float *)icomp(in, p, "w", 1), 2.0f);
  ck_assert_float_eq(*(const float *)icomp(in, p, "v", 0), 11.0f);
  ck_assert_float_eq(*(const float *)icomp(in, p, "v", 1), 122.0f);
  fb_interp_free(in);
  fb_program_free(p);
}
END_TEST

/* Slot allocation with the old value of an atomic in a parallel loop (the
 * order differs between runs; every slot is taken exactly once). */
START_TEST(atomic_slots) {
  fb_program *p = prog("layout { field slot: i32 (i: 64)\n place next: i32 }\n"
                       "kernel k() {\n"
                       "  for i in 0 .. 64 {\n"
                       "    if i % 3 != 0 { slot[atomic_add(next[], 1)] = i }\n"
                       "  }\n"
                       "}\n");
  fb_kernel *k = inst(p, "k", NULL, NULL);
  int n = 0, seen[64] = {0};
  for (int i = 0; i < 64; i++) n += i % 3 != 0;
  fb_engine *e = engine();
  fb_session *s = session(e, p);
  launch(s, add(s, k), NULL, 0, NULL);
  int32_t slot[64], next;
  eread(s, field(p, "slot"), 0, slot, sizeof slot);
  eread(s, field(p, "next"), 0, &next, sizeof next);
  ck_assert_int_eq(next, n);
  for (int i = 0; i < n; i++) {
    ck_assert(slot[i] >= 0 && slot[i] < 64 && slot[i] % 3 != 0);
    ck_assert_int_eq(seen[slot[i]]++, 0);
  }
  fb_session_destroy(s);
  fb_engine_destroy(e);
  fb_program_free(p);
}
END_TEST

/* A top-level var read as a parallel loop's bound, and read again inside
 * the loop: the bound is the value the var held where it was read (the
 * read is spilled for the loop's task even though the var itself is
 * shared between tasks). Taichi's mass_spring_game adds a particle this
 * way; the bound used to come back as 0, so the loop did nothing. */
START_TEST(var_bound_of_parallel_loop) {
  fb_program *p = prog("layout { field out: f32 (i: 16)\n place count: i32 }\n"
                       "kernel add() {\n"
                       "  var k = count[]\n"
                       "  count[] += 1\n"
                       "  for i in 0 .. k { out[i] += f32(k) }\n"
                       "  k = k + 10\n"
                       "  for i in 0 .. k - 9 { out[i] += 100.0 }\n"
                       "}\n");
  fb_kernel *k = inst(p, "add", NULL, NULL);
  fb_engine *e = engine();
  fb_session *s = session(e, p);
  int id = add(s, k);
  for (int r = 0; r < 3; r++) launch(s, id, NULL, 0, NULL);
  float out[16];
  int32_t count;
  eread(s, field(p, "out"), 0, out, sizeof out);
  eread(s, field(p, "count"), 0, &count, sizeof count);
  ck_assert_int_eq(count, 3);
  /* launches with k = 0, 1, 2: the first loops add k to out[0 .. k), the
   * second 100 to out[0 .. k + 1) */
  float want[16] = {0};
  for (int kk = 0; kk < 3; kk++) {
    for (int i = 0; i < kk; i++) want[i] += (float)kk;
    for (int i = 0; i < kk + 1; i++) want[i] += 100.0f;
  }
  for (int i = 0; i < 16; i++) ck_assert_msg(out[i] == want[i], "out[%d] = %g, want %g", i, out[i], want[i]);
  fb_session_destroy(s);
  fb_engine_destroy(e);
  fb_program_free(p);
}
END_TEST

/* rescale_index maps an index of a field into a coarser SNode's space
 * (a vector or scalars), as Taichi's ti.rescale_index. */
START_TEST(rescale_index_values) {
  fb_program *p = prog("layout {\n"
                       "  pointer(ij: 4, 2) as blk { dense(ij: 8, 16) { place x: i32 } }\n"
                       "  dense(ij: 4, 2) { place n: i32 }\n"
                       "}\n"
                       "kernel k() {\n"
                       "  for i, j in ndrange(32, 32) {\n"
                       "    let b = rescale_index(x, blk, i, j)\n"
                       "    x[i, j] = b[0] * 10 + b[1]\n"
                       "    n[rescale_index(x, n, [i, j])] += 1\n"
                       "  }\n"
                       "}\n");
  const char *const ks[] = {"k"};
  fb_interp *in = run_both(p, ks, 1);
  const int32_t *x = icomp(in, p, "x", 0), *n = icomp(in, p, "n", 0);
  for (int i = 0; i < 32; i++)
    for (int j = 0; j < 32; j++) ck_assert_int_eq(x[i * 32 + j], (i / 8) * 10 + j / 16);
  for (int i = 0; i < 8; i++) ck_assert_int_eq(n[i], 128);
  fb_interp_free(in);
  fb_program_free(p);
}
END_TEST

/* Tuples: let / var unpacking of (e1, e2), a func returning several
 * values, and a, b = b, a (the right side is evaluated first), also on
 * field elements. */
START_TEST(tuples) {
  fb_program *p = prog("layout { field r: f32 (i: 16)\n field q: i32 (i: 4) }\n"
                       "func divmod(a: i32, b: i32) { return a // b, a % b }\n"
                       "func pair(x) { return (x * 2, x + 1) }\n"
                       "kernel k() {\n"
                       "  let (a, b) = (1.5, 2)\n"
                       "  var (s, t) = 3, 4.5\n"
                       "  s, t = i32(t), f32(s)\n"
                       "  let (d, m) = divmod(-7, 2)\n"
                       "  let (u, v) = pair(2.5)\n"
                       "  r[0] = a\n"
                       "  r[1] = b\n"
                       "  r[2] = s\n"
                       "  r[3] = t\n"
                       "  r[4] = d\n"
                       "  r[5] = m\n"
                       "  r[6] = u\n"
                       "  r[7] = v\n"
                       "  q[0] = 10\n"
                       "  q[1] = 20\n"
                       "  q[0], q[1] = q[1], q[0]\n"
                       "  s += 1\n"
                       "  r[8] = s\n"
                       "}\n");
  const char *const ks[] = {"k"};
  fb_interp *in = run_both(p, ks, 1);
  const float *r = icomp(in, p, "r", 0);
  const float want[] = {1.5f, 2, 4, 3, -4, 1, 5, 3.5f, 5};
  for (int i = 0; i < 9; i++) ck_assert_msg(r[i] == want[i], "r[%d] = %g, expected %g", i, r[i], want[i]);
  const int32_t *q = icomp(in, p, "q", 0);
  ck_assert_int_eq(q[0], 20);
  ck_assert_int_eq(q[1], 10);
  fb_interp_free(in);
  fb_program_free(p);
}
END_TEST

/* Default values of func parameters (constants) and arguments given by name. */
START_TEST(default_args) {
  fb_program *p = prog("const K = 3\n"
                       "layout { field r: f32 (i: 8) }\n"
                       "func f(a: f32, b = 2.0, c: i32 = K * 2 - 5) -> f32 { return a * b + f32(c) }\n"
                       "func g(x, neg: bool = false) { return neg ? -x : x }\n"
                       "kernel k() {\n"
                       "  r[0] = f(1.0)\n"
                       "  r[1] = f(1.0, 3.0)\n"
                       "  r[2] = f(1.0, c = 5)\n"
                       "  r[3] = f(c = 0, a = 2.0, b = 4.0)\n"
                       "  r[4] = f(2.0, 0.5, 7)\n"
                       "  r[5] = g(3.0)\n"
                       "  r[6] = g(3.0, neg = true)\n"
                       "}\n");
  const char *const ks[] = {"k"};
  fb_interp *in = run_both(p, ks, 1);
  const float *r = icomp(in, p, "r", 0);
  const float want[] = {3, 4, 7, 8, 8, 3, -3};
  for (int i = 0; i < 7; i++) ck_assert_msg(r[i] == want[i], "r[%d] = %g, expected %g", i, r[i], want[i]);
  fb_interp_free(in);
  fb_program_free(p);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("lang_exec");
  TCase *tc = tcase_create("exec");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, int_divmod);
  tcase_add_test(tc, const_arith);
  tcase_add_test(tc, vector_index);
  tcase_add_test(tc, bool_as_int);
  tcase_add_test(tc, ndrange_loops);
  tcase_add_test(tc, atomic_old_values);
  tcase_add_test(tc, atomic_slots);
  tcase_add_test(tc, rescale_index_values);
  tcase_add_test(tc, tuples);
  tcase_add_test(tc, default_args);
  tcase_add_test(tc, heat);
  tcase_add_test(tc, life);
  tcase_add_test(tc, control_flow);
  tcase_add_test(tc, random_values);
  tcase_add_test(tc, random_thread_counts);
  tcase_add_test(tc, vectors);
  tcase_add_test(tc, svd_polar);
  tcase_add_test(tc, grouped_atomics);
  tcase_add_test(tc, parallel_cell_loop);
  tcase_add_test(tc, skipped_scan_blocks);
  tcase_add_test(tc, private_scatter);
  tcase_add_test(tc, private_scatter_i32);
  tcase_add_test(tc, folds_match_run_time);
  tcase_add_test(tc, var_bound_of_parallel_loop);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) { return fbt_run(suite()); }
