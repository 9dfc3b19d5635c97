/* Code generation on the CPU against the reference interpreter: every case of
 * tests/cg_kernels.h is compiled with fb_cpu_jit_compile, run directly on a
 * calloc'd root buffer (parallel tasks chunked into pieces), and every field
 * element, the error flag, the return value and the scratch buffer are
 * compared with fb_interp_run. Also: the code cache, concurrent compiles,
 * refusals (deactivate on dense, malformed tasks) and the LLVM IR text.
 * Code speed (test_fast_paths): dense loops written in the language are
 * vectorised after O3 (vector loads and stores, no i64->i32->i64 round
 * trip of the index, no division for a shape split into nested dense
 * SNodes), scatter atomics are atomicrmw with monotonic ordering (the two
 * f32 components of a vector cell one 64-bit compare-and-swap), and the
 * same kernels, run chunked, agree exactly with the interpreter (nested
 * dense groups with and without an ancestor splitting their axis, rows of
 * 2-D struct-fors cut by chunk boundaries, the atomic scatter). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cg_kernels.h"
#include "codegen/codegen.h"
#include "fusebox/lang.h"
#include "optimizer/optimizer.h"
#include "support/support.h"

#define SEED 0x5eed1234abcdull
#define GTMP_BYTES 4096

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---------------------------------------------------------------- comparing */

static uint64_t ulp_dist64(double a, double b) {
  int64_t x, y;
  memcpy(&x, &a, 8);
  memcpy(&y, &b, 8);
  if (x < 0) x = (int64_t)(0x8000000000000000ull - (uint64_t)x);
  if (y < 0) y = (int64_t)(0x8000000000000000ull - (uint64_t)y);
  uint64_t d = (uint64_t)x - (uint64_t)y;
  return (int64_t)d < 0 ? 0 - d : d;
}

static uint64_t ulp_dist32(float a, float b) {
  int32_t x, y;
  memcpy(&x, &a, 4);
  memcpy(&y, &b, 4);
  int64_t ox = x < 0 ? (int64_t)INT32_MIN - x : x, oy = y < 0 ? (int64_t)INT32_MIN - y : y;
  return (uint64_t)(ox > oy ? ox - oy : oy - ox);
}

/* Equal under the case's rules: integers and bools exactly, floats within
 * ulps (0: the same bits), any NaN equal to any NaN. */
static int same_value(fb_value a, fb_value b, int ulps) {
  if (a.type != b.type) return 0;
  if (a.type == FB_T_F32) {
    float x = (float)a.v.f, y = (float)b.v.f;
    if (isnan(x) || isnan(y)) return isnan(x) && isnan(y);
    return ulp_dist32(x, y) <= (uint64_t)ulps;
  }
  if (a.type == FB_T_F64) {
    if (isnan(a.v.f) || isnan(b.v.f)) return isnan(a.v.f) && isnan(b.v.f);
    return ulp_dist64(a.v.f, b.v.f) <= (uint64_t)ulps;
  }
  return a.v.u == b.v.u;
}

static void show(char *buf, size_t n, fb_value v) {
  if (fb_type_is_float(v.type)) snprintf(buf, n, "%.9g", v.v.f);
  else if (fb_type_is_signed(v.type)) snprintf(buf, n, "%lld", (long long)v.v.i);
  else snprintf(buf, n, "%llu", (unsigned long long)v.v.u);
}

/* Compare every element of every field; report the first few mismatches. */
static int compare_fields(const fb_layout *l, fb_interp *in, const uint8_t *root, int ulps,
                          const char *what) {
  int bad = 0;
  for (int p = 0; p < l->nnodes; p++) {
    const fb_snode *f = &l->nodes[p];
    if (f->kind != FB_SN_PLACE) continue;
    const uint8_t *ref = fb_interp_field(in, p);
    int64_t n = fb_field_numel(l, p);
    size_t sz = fb_type_size(f->type);
    for (int64_t e = 0; e < n; e++) {
      int64_t idx[FB_MAX_AXES] = {0, 0, 0, 0};
      for (int64_t rest = e, d = f->ndim - 1; d >= 0; d--) {
        idx[d] = rest % f->shape[f->dim_axis[d]];
        rest /= f->shape[f->dim_axis[d]];
      }
      fb_value want = fb_value_load(f->type, ref + (size_t)e * sz);
      fb_value got = fb_value_load(f->type, root + fb_layout_dense_offset(l, p, idx));
      if (same_value(want, got, ulps)) continue;
      if (bad++ < 8) {
        char w[64], g[64];
        show(w, sizeof w, want);
        show(g, sizeof g, got);
        fprintf(stderr, "%s: %s[%lld,%lld] = %s, interpreter %s\n", what, f->name,
                (long long)idx[0], (long long)idx[1], g, w);
      }
    }
  }
  return bad;
}

/* ---------------------------------------------------------------- running */

typedef struct jit_state {
  uint8_t *root;
  uint8_t gtmp[GTMP_BYTES];
  uint64_t rets[4];
  int32_t error[2]; /* the error and the blame word (fb_rt.h) */
} jit_state;

/* Run one compiled task the way the CPU runtime does: bounds, then the
 * iteration space in three chunks (serial tasks: one call). */
static void run_code(const fb_cpu_code *code, const cg_step *st, jit_state *js, uint64_t launch) {
  uint64_t args[8] = {0};
  for (int a = 0; a < st->nargs; a++)
    args[a] = fb_slot_pack(fb_value_cast(st->args[a], st->k->params[a]));
  fb_rt_ctx ctx = {js->root, args, js->rets, js->gtmp, js->error, SEED, launch, NULL, NULL};
  js->error[0] = js->error[1] = 0;
  if (st->loop < 0) {
    ck_assert_ptr_null(code->bounds);
    code->body(&ctx, 0, 0);
    return;
  }
  ck_assert_ptr_nonnull(code->bounds);
  int64_t n = -1;
  code->bounds(&ctx, &n);
  ck_assert_int_ge(n, 0);
  for (int c = 0; c < 3; c++) code->body(&ctx, n * c / 3, n * (c + 1) / 3);
}

static void compile_ok(fb_cpu_jit *j, const cg_step *st, fb_cpu_code *code) {
  char err[512] = "";
  fb_cg_task t = {st->k, st->loop, 0, NULL};
  int rc = fb_cpu_jit_compile(j, &t, code, err, sizeof err);
  ck_assert_msg(rc == 0, "compile %s: %s (%s)", st->k->name, fb_strerror(rc), err);
  ck_assert_ptr_nonnull(code->body);
}

/* Run case cs on the JIT and on the interpreter and compare everything. */
static void check_case(fb_cpu_jit *j, const cg_layout *c, const cg_case *cs) {
  const fb_layout *l = c->l;
  fb_interp *in = fb_interp_new(l, SEED);
  ck_assert_ptr_nonnull(in);
  jit_state *js = calloc(1, sizeof *js);
  js->root = calloc(1, l->root_bytes);
  ck_assert(js->root != NULL);
  for (int s = 0; s < cs->nsteps; s++) {
    const cg_step *st = &cs->steps[s];
    fb_cpu_code code;
    compile_ok(j, st, &code);
    if (!code.cache_hit) ck_assert_int_eq(code.stmts_emitted, fb_kernel_count_stmts(st->k));
    run_code(&code, st, js, (uint64_t)s);
    fb_value ret;
    int rc = fb_interp_run(in, st->k, st->args, st->nargs, &ret);
    ck_assert_msg(rc == 0 || rc == FB_EBOUNDS, "interpreter on %s: %s", st->k->name,
                  fb_strerror(rc));
    ck_assert_msg(js->error[0] == rc, "%s/%s: JIT error %d, interpreter %d", cs->name, st->k->name,
                  js->error[0], rc);
    if (s == cs->nsteps - 1) ck_assert_int_eq(rc, cs->expect);
    if (st->k->ret != FB_T_VOID) {
      fb_value got = fb_slot_unpack(st->k->ret, js->rets[0]);
      char w[64], g[64];
      show(w, sizeof w, ret);
      show(g, sizeof g, got);
      ck_assert_msg(same_value(ret, got, cs->ulps), "%s: returned %s, interpreter %s", st->k->name,
                    g, w);
    }
  }
  char what[96];
  snprintf(what, sizeof what, "case %s", cs->name);
  int bad = compare_fields(l, in, js->root, cs->ulps, what);
  ck_assert_msg(bad == 0, "case %s: %d field elements differ from the interpreter", cs->name, bad);
  size_t sb = 0;
  const uint8_t *scratch = fb_interp_scratch(in, &sb);
  if (sb > GTMP_BYTES) sb = GTMP_BYTES;
  ck_assert_msg(sb == 0 || memcmp(scratch, js->gtmp, sb) == 0, "case %s: gtmp differs", cs->name);
  free(js->root);
  free(js);
  fb_interp_free(in);
}

static fb_cpu_jit *new_jit(void) {
  char err[512] = "";
  fb_cpu_jit *j = fb_cpu_jit_new(err, sizeof err);
  ck_assert_msg(j != NULL, "fb_cpu_jit_new: %s", err);
  return j;
}

/* ---------------------------------------------------------------- tests */

START_TEST(test_case) {
  cg_layout c;
  ck_assert_int_eq(cg_layout_build(&c), 0);
  cg_case cs;
  ck_assert_int_eq(cg_case_build(&c, _i, &cs), 0);
  fb_cpu_jit *j = new_jit();
  check_case(j, &c, &cs);
  fb_cpu_jit_free(j);
  cg_case_free(&cs);
  fb_layout_free(c.l);
}
END_TEST

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

START_TEST(test_cache) {
  cg_layout c;
  ck_assert_int_eq(cg_layout_build(&c), 0);
  cg_case cs;
  ck_assert_int_eq(cg_case_build(&c, 0, &cs), 0); /* map_f32: init + map */
  fb_cpu_jit *j = new_jit();
  const cg_step *st = &cs.steps[1];
  fb_cpu_code a, b, d;
  compile_ok(j, st, &a);
  ck_assert_int_eq(a.cache_hit, 0);
  ck_assert(a.compile_s > 0);
  ck_assert_int_eq(a.stmts_emitted, fb_kernel_count_stmts(st->k));
  compile_ok(j, st, &b);
  ck_assert_int_eq(b.cache_hit, 1);
  ck_assert(b.body == a.body && b.bounds == a.bounds);
  ck_assert(b.compile_s == 0);
  /* an equal kernel (another object) hits too */
  cg_step copy = *st;
  copy.k = fb_kernel_clone(st->k);
  compile_ok(j, &copy, &d);
  ck_assert_int_eq(d.cache_hit, 1);
  ck_assert(d.body == a.body);
  /* a different constant misses */
  for (int s = 0; s < copy.k->nstmts; s++)
    if (copy.k->stmts[s].op == FB_OP_CONST && copy.k->stmts[s].type == FB_T_F32) {
      copy.k->stmts[s].imm.f = 4.5;
      break;
    }
  compile_ok(j, &copy, &d);
  ck_assert_int_eq(d.cache_hit, 0);
  ck_assert(d.body != a.body);
  fb_kernel_free(copy.k);
  /* hit latency: median of many */
  double t[101];
  for (int r = 0; r < 101; r++) {
    double t0 = now_s();
    compile_ok(j, st, &b);
    t[r] = now_s() - t0;
    ck_assert_int_eq(b.cache_hit, 1);
  }
  qsort(t, 101, sizeof t[0], cmp_double);
  fprintf(stderr, "codegen: compile of a small kernel %.1f ms, cache hit %.1f us (median)\n",
          a.compile_s * 1e3, t[50] * 1e6);
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  const double limit = 500e-6; /* instrumented builds run several times slower */
#else
  const double limit = 50e-6;
#endif
  ck_assert_msg(t[50] < limit, "cache hit takes %.1f us", t[50] * 1e6);
  fb_cpu_jit_free(j);
  cg_case_free(&cs);
  fb_layout_free(c.l);
}
END_TEST

typedef struct compile_job {
  fb_cpu_jit *j;
  cg_case *cases;
  int ncases;
  fb_cpu_code code[CG_NCASES][CG_MAXSTEPS];
  int failures;
} compile_job;

static void *compile_all(void *arg) {
  compile_job *job = arg;
  for (int n = 0; n < job->ncases; n++) {
    const cg_case *cs = &job->cases[n];
    for (int s = 0; s < cs->nsteps; s++) {
      char err[256];
      fb_cg_task t = {cs->steps[s].k, cs->steps[s].loop, 0, NULL};
      if (fb_cpu_jit_compile(job->j, &t, &job->code[n][s], err, sizeof err) ||
          !job->code[n][s].body)
        job->failures++;
    }
  }
  return NULL;
}

/* Two threads compile the whole kernel set at once on one JIT; the code
 * they get must run correctly. */
START_TEST(test_concurrent) {
  cg_layout c;
  ck_assert_int_eq(cg_layout_build(&c), 0);
  cg_case cases[CG_NCASES];
  for (int n = 0; n < CG_NCASES; n++) ck_assert_int_eq(cg_case_build(&c, n, &cases[n]), 0);
  fb_cpu_jit *j = new_jit();
  compile_job *jobs = calloc(2, sizeof *jobs);
  pthread_t th[2];
  for (int w = 0; w < 2; w++) {
    jobs[w].j = j;
    jobs[w].cases = cases;
    jobs[w].ncases = CG_NCASES;
    ck_assert_int_eq(pthread_create(&th[w], NULL, compile_all, &jobs[w]), 0);
  }
  for (int w = 0; w < 2; w++) pthread_join(th[w], NULL);
  ck_assert_int_eq(jobs[0].failures, 0);
  ck_assert_int_eq(jobs[1].failures, 0);
  int hits = 0;
  for (int n = 0; n < CG_NCASES; n++)
    for (int s = 0; s < cases[n].nsteps; s++)
      hits += jobs[0].code[n][s].cache_hit + jobs[1].code[n][s].cache_hit;
  ck_assert_int_gt(hits, 0); /* shared kernels (init) were found in the cache */
  for (int n = 0; n < CG_NCASES; n++) check_case(j, &c, &cases[n]);
  free(jobs);
  fb_cpu_jit_free(j);
  for (int n = 0; n < CG_NCASES; n++) cg_case_free(&cases[n]);
  fb_layout_free(c.l);
}
END_TEST

/* Deactivating a dense SNode, malformed tasks and unverifiable IR are
 * refused with a message; nothing crashes. */
START_TEST(test_refusals) {
  fb_layout *l = fb_layout_new();
  int64_t sz[1] = {32};
  int bm = fb_layout_add(l, 0, FB_SN_BITMASKED, "i", sz, 0, "bm");
  int x = fb_layout_place(l, bm, "x", FB_T_I32);
  int dn = fb_layout_add(l, 0, FB_SN_DENSE, "i", sz, 0, NULL);
  int y = fb_layout_place(l, dn, "y", FB_T_I32);
  char err[512] = "";
  ck_assert_int_eq(fb_layout_finalize(l, err, sizeof err), 0);
  fb_cpu_jit *j = new_jit();
  fb_cpu_code code;

  fb_kernel *k = fb_kernel_new(l, "sparse", 0, NULL, FB_T_VOID);
  fb_builder bb, *b = &bb;
  fb_builder_init(b, k);
  int sv, i;
  int lp = cg_for(b, K_I32(0), K_I32(32), 1, &i, &sv);
  cg_st(b, x, i, i);
  fb_b_leave(b, sv);
  fb_cg_task t = {k, lp, 0, NULL};
  /* sparse containers compile (tests/test_sparse.c runs them) */
  ck_assert_int_eq(fb_cpu_jit_compile(j, &t, &code, err, sizeof err), 0);
  ck_assert_ptr_nonnull(code.body);
  fb_kernel_free(k);

  k = fb_kernel_new(l, "dense", 0, NULL, FB_T_VOID);
  fb_builder_init(b, k);
  int c7 = K_I32(7);
  lp = cg_for(b, K_I32(0), K_I32(32), 1, &i, &sv);
  cg_st(b, y, i, c7);
  fb_b_leave(b, sv);
  t.ir = k;
  t.loop = c7; /* not a loop */
  ck_assert_int_eq(fb_cpu_jit_compile(j, &t, &code, err, sizeof err), FB_EINVAL);
  ck_assert_msg(strstr(err, "not a top-level") || strstr(err, "not par_for"), "message: %s", err);
  t.loop = lp;
  ck_assert_int_eq(fb_cpu_jit_compile(j, &t, &code, err, sizeof err), 0);
  /* deactivate on a dense SNode: refused (by the verifier, or by code
   * generation when it gets that far) with a message */
  fb_builder_init(b, k);
  b->block = k->stmts[lp].body;
  fb_b_global(b, FB_OP_DEACTIVATE, y, &i, 1, -1);
  int rc = fb_cpu_jit_compile(j, &t, &code, err, sizeof err);
  ck_assert_msg(rc == FB_EVERIFY || rc == FB_EUNSUPPORTED, "rc %d: %s", rc, err);
  ck_assert_msg(strstr(err, "deactivate") != NULL, "message: %s", err);
  /* a type error: the verifier's message comes back */
  k->stmts[c7].type = FB_T_F32;
  ck_assert_int_eq(fb_cpu_jit_compile(j, &t, &code, err, sizeof err), FB_EVERIFY);
  ck_assert(strlen(err) > 0);
  fb_kernel_free(k);
  ck_assert_int_eq(fb_cpu_jit_compile(j, NULL, &code, err, sizeof err), FB_EINVAL);
  fb_cpu_jit_free(j);
  fb_layout_free(l);
}
END_TEST

START_TEST(test_ir_text) {
  cg_layout c;
  ck_assert_int_eq(cg_layout_build(&c), 0);
  cg_case cs;
  ck_assert_int_eq(cg_case_build(&c, 4, &cs), 0); /* math */
  fb_cg_task t = {cs.steps[1].k, cs.steps[1].loop, 0, NULL};
  char *text = NULL, err[512] = "";
  ck_assert_int_eq(fb_llvm_ir_text(&t, "x86_64", &text, err, sizeof err), 0);
  ck_assert_ptr_nonnull(strstr(text, "define void @fb_body(ptr"));
  ck_assert_ptr_nonnull(strstr(text, "define void @fb_bounds(ptr"));
  ck_assert_ptr_nonnull(strstr(text, "@sinf("));
  free(text);
  ck_assert_int_eq(fb_llvm_ir_text(&t, "nvptx64", &text, err, sizeof err), 0);
  ck_assert_ptr_nonnull(strstr(text, "nvptx64-nvidia-cuda"));
  ck_assert_ptr_nonnull(strstr(text, "nvvm.annotations"));
  ck_assert_ptr_nonnull(strstr(text, "llvm.nvvm.read.ptx.sreg.ctaid.x"));
  free(text);
  ck_assert_int_eq(fb_llvm_ir_text(&t, "riscv", &text, err, sizeof err), FB_EINVAL);
  ck_assert_ptr_null(text);
  cg_case_free(&cs);
  fb_layout_free(c.l);
}
END_TEST

/* ---------------------------------------------------------------- fast paths */

static const char *FAST_SRC =
    "layout {\n"
    "  dense(i: 4096) { place x: f32 }\n"
    "  dense(i: 4096) { place y: f32 }\n"
    "  dense(i: 4) { dense(i: 1024) { place s: f32 } }\n"
    "  dense(i: 4) { dense(i: 1024) { place t: f32 } }\n"
    "  dense(ij: 48, 40) { place g: f32 }\n"
    "  dense(ij: 48, 40) { place h: f32 }\n"
    "  dense(i: 2) { dense(i: 3) { dense(j: 2) { dense(i: 4) { dense(i: 5) { place m: i32 } } } } "
    "}\n"
    "  dense(i: 2) { dense(i: 3) { dense(j: 2) { dense(i: 4) { dense(i: 5) { place mm: i32 } } } } "
    "}\n"
    "  dense(i: 3) { dense(i: 8) { dense(j: 3) { dense(j: 8) { place q: f32 } } } }\n"
    "  dense(i: 3) { dense(i: 8) { dense(j: 3) { dense(j: 8) { place r: f32 } } } }\n"
    /* trees that mix f32 with i32 or i64 places keep acc and gv shared
     * (not privatized: codegen/priv.c), so scatter and scatter2 show the
     * atomics */
    "  dense(i: 8) { place acc: f32, accn: i32 }\n"
    "  dense(i: 8) { place gv: f32[2], gvn: i64 }\n"
    "}\n"
    "kernel init() {\n"
    "  for i in 0 .. 4096 { x[i] = f32(i) * 0.5; y[i] = 1.0 }\n"
    "  for i in s { s[i] = f32(i * 3 % 1000) }\n"
    "  for i, j in g { g[i, j] = f32(i * 100 + j) }\n"
    "  for i, j in m { m[i, j] = i * 7 + j }\n"
    "  for i, j in q { q[i, j] = f32(i * 1000 + j) }\n"
    "}\n"
    "kernel saxpy() { for i in 0 .. 4096 { y[i] = 2.0 * x[i] + y[i] } }\n"
    "kernel stencil() { for i in 1 .. 4095 { y[i] = x[i - 1] + x[i + 1] - 2.0 * x[i] } }\n"
    "kernel split_copy() { for i in s { t[i] = s[i] } }\n"
    "kernel copy2d() { for i, j in g { h[i, j] = g[i, j] } }\n"
    "kernel grid_copy() { for i, j in q { r[i, j] = q[i, j] + q[(i + 5) % 24, j] } }\n"
    "kernel groups() { for i, j in m { mm[i, j] = m[(i + 61) % 120, 1 - j] + m[i, j] } }\n"
    "kernel scatter() { for i in 0 .. 4096 { acc[i % 8] += x[i] } }\n"
    "kernel scatter2() { for i in 0 .. 4096 { gv[i % 8] += [x[i], 0.5 * x[i] + 1.0] } }\n"
    /* a bilinear-style gather at a clamped float point: f32 ranges prove
     * a in [0, 38] and b in [0, 38] (g is 48 x 40), so no bounds checks;
     * the lower clamp hits 0.0 exactly (floor(0) = 0); NaN and inf
     * inputs clamp too (fmax, fmin) */
    "kernel bilerp() { for i, j in g {\n"
    "  let p = min(38.9, max(g[i, j] * 0.02 - 3.0, 0.0))\n"
    /* 0 / (i - 5) is NaN on row 5, which max() clamps to 0.25 */
    "  let q = min(38.5, max(f32(j) * 1.5 - 20.0 + 0.0 / (f32(i) - 5.0), 0.25))\n"
    "  let a = i32(floor(p))\n"
    "  let b = i32(floor(q))\n"
    "  h[i, j] = g[a, b] + g[a + 1, b + 1] * 0.5 + g[i32(floor(p * 0.5)), 39 - b]\n"
    "} }\n"
    /* the same with a clamp that lets a + 1 reach 48: that check stays */
    "kernel bilerp_wide() { for i, j in g {\n"
    "  let p = min(47.5, max(g[i, j] * 0.02 - 3.0, 0.0))\n"
    "  let a = i32(floor(p))\n"
    "  h[i, j] = g[a, j] + g[a + 1, j]\n"
    "} }\n";

/* The O3 IR of fb_body of the only parallel task of kernel k. */
static char *fast_ir(fb_program *p, const char *kernel) {
  fb_kernel *k = NULL;
  fb_diags d;
  fb_diags_init(&d);
  ck_assert_int_eq(fb_program_instantiate(p, kernel, NULL, 0, &k, &d), 0);
  fb_diags_free(&d);
  fb_task_list tl;
  char err[512] = "";
  ck_assert_msg(fb_lower(k, &tl, err, sizeof err) == 0, "lower %s: %s", kernel, err);
  ck_assert_int_eq(tl.n, 1);
  ck_assert_int_ge(tl.v[0].loop, 0);
  fb_cg_task t = {tl.v[0].ir, tl.v[0].loop, 0, NULL};
  char *text = NULL;
  ck_assert_msg(fb_llvm_ir_text(&t, "x86_64-O3", &text, err, sizeof err) == 0, "IR of %s: %s",
                kernel, err);
  fb_task_list_free(&tl);
  /* keep fb_body only: fb_bounds follows it */
  char *body = strstr(text, "define void @fb_body(");
  ck_assert_ptr_nonnull(body);
  char *end = strstr(body, "\n}\n");
  ck_assert_ptr_nonnull(end);
  end[3] = 0;
  char *r = strdup(body);
  free(text);
  return r;
}

static fb_program *fast_program(void) {
  fb_diags d;
  fb_diags_init(&d);
  fb_program *p = NULL;
  int rc = fb_program_parse("fast.fbk", FAST_SRC, &p, &d);
  if (rc) {
    char *msg = fb_diags_render("fast.fbk", FAST_SRC, &d);
    ck_abort_msg("fast.fbk: %s", msg ? msg : "?");
  }
  fb_diags_free(&d);
  return p;
}

/* Occurrences of `what` in s. */
/* Does this machine's CPU have cmpxchg16b (the cx16 flag)? */
static int host_cx16(void) {
  FILE *f = fopen("/proc/cpuinfo", "r");
  if (!f) return 0;
  char line[4096];
  int yes = 0;
  while (!yes && fgets(line, sizeof line, f))
    if (!strncmp(line, "flags", 5) && strstr(line, " cx16")) yes = 1;
  fclose(f);
  return yes;
}

static int count(const char *s, const char *what) {
  int n = 0;
  for (const char *q = strstr(s, what); q; q = strstr(q + 1, what)) n++;
  return n;
}

/* atomicrmw instructions in IR text other than the blame word's (an i32
 * max on the out-of-bounds path, which LLVM turns into an exchange for
 * part 0, FB_RT_BLAME(0) being the largest word). */
static int data_atomics(const char *ir) {
  return count(ir, "atomicrmw") - count(ir, "atomicrmw max ptr") - count(ir, "atomicrmw xchg ptr");
}

START_TEST(test_fast_ir) {
  fb_program *p = fast_program();
  const char *vec[] = {"saxpy", "stencil", "split_copy", "copy2d", "grid_copy"};
  for (size_t i = 0; i < sizeof vec / sizeof vec[0]; i++) {
    char *ir = fast_ir(p, vec[i]);
    ck_assert_msg(strstr(ir, "load <") && strstr(ir, "store <"),
                  "%s: no vector loads and stores after O3:\n%.3000s", vec[i], ir);
    /* the index is never narrowed to i32 and widened again on its way to
     * an address (which LLVM cannot see through: scalar or gathered) */
    ck_assert_msg(!strstr(ir, "trunc i64") && !strstr(ir, "gather"),
                  "%s: index narrowed or gathered:\n%.3000s", vec[i], ir);
    /* each field its own alias class (they share the root buffer) */
    ck_assert_msg(strstr(ir, "!tbaa"), "%s: field accesses without TBAA tags:\n%.3000s", vec[i], ir);
    if (i == 2) /* nested dense groups: one multiplication, no division (2-D
                 * struct-fors divide once per row, outside the inner loop) */
      ck_assert_msg(!strstr(ir, "udiv") && !strstr(ir, "urem"), "%s: division in the address:\n%.3000s",
                    vec[i], ir);
    free(ir);
  }
  char *ir = fast_ir(p, "scatter");
  ck_assert_msg(strstr(ir, "atomicrmw fadd ptr") && strstr(ir, " monotonic"),
                "scatter: not a monotonic atomicrmw fadd:\n%.3000s", ir);
  ck_assert_msg(!strstr(ir, "seq_cst"), "scatter: seq_cst atomics:\n%.3000s", ir);
  free(ir);
  /* both components of a vector cell in one 64-bit compare-and-swap */
  ir = fast_ir(p, "scatter2");
  ck_assert_msg(strstr(ir, "cmpxchg ptr") && strstr(ir, "i64") && strstr(ir, "fadd <2 x float>") &&
                    !data_atomics(ir) && !strstr(ir, "seq_cst"),
                "scatter2: not one monotonic 64-bit compare-and-swap per cell:\n%.3000s", ir);
  free(ir);
  /* indices from clamped floats: no bounds check, so no error latch (a
   * compare-and-swap on the context's error word), where the clamp
   * proves them in range; one where it does not */
  ir = fast_ir(p, "bilerp");
  ck_assert_msg(!strstr(ir, "cmpxchg") && !strstr(ir, "fb.error"),
                "bilerp: bounds checks on proven float indices:\n%.3000s", ir);
  /* and the float -> int casts need no saturation (never NaN, in range) */
  ck_assert_msg(strstr(ir, "fptosi") && !strstr(ir, "fptosi.sat"),
                "bilerp: saturating casts of proven floats:\n%.3000s", ir);
  free(ir);
  ir = fast_ir(p, "bilerp_wide");
  ck_assert_msg(strstr(ir, "cmpxchg"), "bilerp_wide: the check a + 1 < 48 is gone:\n%.3000s", ir);
  free(ir);
  fb_program_free(p);
}
END_TEST

/* Grouped atomics (emit_mem.c): the four f32 adds into a cell holding a
 * mass and a 3-vector (16 bytes) become two 64-bit compare-and-swaps of
 * <2 x float> sums and no f32 atomicrmw, under a pointer (one walk per cell:
 * a single activation path in the loop body, not one per component) and
 * in a dense grid; a store between the mass's add and the vector's keeps
 * them apart (the mass's add stays an f32 atomicrmw). */
static const char *GROUP_SRC =
    "layout {\n"
    "  pointer(ij: 2, 2) { dense(ij: 8, 8) { place sm: f32, sv: f32[3] } }\n"
    "  dense(ij: 16, 16) { place dm: f32, dv: f32[3] }\n"
    "  dense(ij: 16, 16) { place om: f32, ov: f32[3], opad: f32[2] }\n"
    "  dense(i: 64) { place px: f32[2] }\n"
    "  dense(i: 64) { place out: f32 }\n"
    "}\n"
    "kernel odd() {\n" /* 24-byte cells: 8-aligned only, so pairs */
    "  for p in px {\n"
    "    out[p] = om[0, 0]\n"
    "    let b = [i32(px[p][0]), i32(px[p][1])]\n"
    "    ov[b[0], b[1]] += px[p][0] * [1.0, 2.0, 3.0]\n"
    "    om[b[0], b[1]] += px[p][1]\n"
    "  }\n"
    "}\n"
    "kernel sparse() {\n"
    "  for p in px {\n"
    "    let b = [i32(px[p][0]), i32(px[p][1])]\n"
    "    for a in 0 .. 3 {\n"
    "      sv[b[0] + a, b[1]] += px[p][0] * [1.0, 2.0, 3.0]\n"
    "      sm[b[0] + a, b[1]] += px[p][1]\n"
    "    }\n"
    "  }\n"
    "}\n"
    "kernel dense() {\n"
    "  for p in px {\n"
    "    out[p] = dm[0, 0]\n" /* a read: the grid stays shared (no privatized scatter) */
    "    let b = [i32(px[p][0]), i32(px[p][1])]\n"
    "    dv[b[0], b[1]] += px[p][0] * [1.0, 2.0, 3.0]\n"
    "    dm[b[0], b[1]] += px[p][1]\n"
    "  }\n"
    "}\n"
    "kernel apart() {\n"
    "  for p in px {\n"
    "    out[p] = dm[0, 0]\n" /* shared, as in dense() */
    "    let b = [i32(px[p][0]), i32(px[p][1])]\n"
    "    dm[b[0], b[1]] += px[p][1]\n"
    "    out[p] = 1.0\n"
    "    dv[b[0], b[1]] += px[p][0] * [1.0, 2.0, 3.0]\n"
    "  }\n"
    "}\n";

/* Privatized scatter (codegen/priv.c): a parallel task whose only accesses
 * to an all-dense tree, all f32 or all i32/u32, are atomic adds with
 * unused results adds into the thread's copy (ctx->priv) with plain loads
 * and stores; a tree that is also read, an i64 tree, a tree mixing f32 and
 * i32, a tree over the size bound, a serial task and NVPTX keep their
 * atomics. The launcher's sums are checked against the interpreter in
 * tests/test_lang_exec.c (private_scatter, private_scatter_i32). */
static const char *PRIV_SRC = "layout {\n"
                              "  dense(ij: 16, 16) { place gm: f32, gv: f32[2] }\n"
                              "  dense(ij: 16, 16) { place hm: f32 }\n"
                              "  dense(ij: 16, 16) { place cnt: i32, ucnt: u32 }\n"
                              "  dense(ij: 16, 16) { place cnt64: i64 }\n"
                              "  dense(ij: 16, 16) { place mf: f32, mn: i32 }\n"
                              "  dense(ij: 2100, 2100) { place big: f32 }\n"
                              "  dense(i: 64) { place px: f32[2], out: f32 }\n"
                              "}\n"
                              "kernel scatter() {\n"
                              "  for p in px {\n"
                              "    let b = [i32(px[p][0]), i32(px[p][1])]\n"
                              "    for a in 0 .. 3 {\n"
                              "      gv[b[0] + a, b[1]] += px[p]\n"
                              "      gm[b[0] + a, b[1]] += px[p][1]\n"
                              "    }\n"
                              "  }\n"
                              "}\n"
                              "kernel shared() {\n"
                              "  for p in px {\n"
                              "    let b = [i32(px[p][0]), i32(px[p][1])]\n"
                              "    hm[b[0], b[1]] += 1.0\n"
                              "    out[p] = hm[b[1], b[0]]\n"
                              "    cnt64[b[0], b[1]] += 1\n"
                              "    mf[b[0], b[1]] += 1.0\n"
                              "    mn[b[0], b[1]] += 1\n"
                              "    big[b[0], b[1]] += 1.0\n"
                              "  }\n"
                              "}\n"
                              "kernel count() {\n"
                              "  for p in px {\n"
                              "    let b = [i32(px[p][0]), i32(px[p][1])]\n"
                              "    cnt[b[0], b[1]] += 1\n"
                              "    ucnt[b[1], b[0]] += u32(p)\n"
                              "  }\n"
                              "}\n"
                              "kernel serial() { gm[1, 2] += 1.0 }\n";

static char *task_ir(fb_program *p, const char *kernel, const char *target);

/* The plan of kernel's one task. */
static void priv_plan_of(fb_program *p, const char *kernel, fb_cg_priv *plan) {
  fb_kernel *k = NULL;
  fb_diags d;
  fb_diags_init(&d);
  ck_assert_int_eq(fb_program_instantiate(p, kernel, NULL, 0, &k, &d), 0);
  fb_diags_free(&d);
  fb_task_list tl;
  char err[512] = "";
  ck_assert_msg(fb_lower(k, &tl, err, sizeof err) == 0, "lower %s: %s", kernel, err);
  ck_assert_int_eq(tl.n, 1);
  fb_cg_task t = {tl.v[0].ir, tl.v[0].loop, 0, NULL};
  ck_assert_int_eq(fb_cg_priv_plan(&t, plan, NULL), 0);
  fb_task_list_free(&tl);
}

START_TEST(test_priv_ir) {
  fb_diags d;
  fb_diags_init(&d);
  fb_program *p = NULL;
  ck_assert_int_eq(fb_program_parse("priv.fbk", PRIV_SRC, &p, &d), 0);
  fb_diags_free(&d);
  const fb_layout *l = fb_program_layout(p);
  fb_cg_priv plan;
  priv_plan_of(p, "scatter", &plan);
  ck_assert_int_eq(plan.n, 1);
  ck_assert_int_eq(plan.sites, 3); /* gv.0, gv.1, gm */
  ck_assert_int_ge(plan.bytes[0], 16 * 16 * 12);
  ck_assert_int_eq(plan.lo, plan.off[0]);
  ck_assert_int_eq(plan.hi, plan.off[0] + plan.bytes[0]);
  ck_assert_int_le(plan.hi, (int64_t)l->root_bytes);
  char *ir = fast_ir(p, "scatter");
  /* (the only atomics left are the error latch's compare-and-swap and the
   * blame word's max, both i32 and on the out-of-bounds path) */
  ck_assert_msg(!data_atomics(ir) && !strstr(ir, "load atomic") &&
                    count(ir, "store float") + count(ir, "store <2 x float>") >= 3,
                "scatter: atomics left in a privatized scatter:\n%.3000s", ir);
  free(ir);
  ck_assert_int_eq(plan.i32[0], 0);
  /* i32 and u32 adds: integer adds into the copy, no atomics */
  priv_plan_of(p, "count", &plan);
  ck_assert_int_eq(plan.n, 1);
  ck_assert_int_eq(plan.sites, 2);
  ck_assert_int_eq(plan.i32[0], 1);
  ck_assert_int_ge(plan.bytes[0], 16 * 16 * 8);
  ir = fast_ir(p, "count");
  ck_assert_msg(!data_atomics(ir) && !strstr(ir, "load atomic") && count(ir, "store i32") >= 2 &&
                    count(ir, "store float") == 0,
                "count: atomics left in a privatized i32 scatter:\n%.3000s", ir);
  free(ir);
  /* hm is read, cnt64 is i64, mf/mn mix f32 and i32, big is over
   * FB_CG_PRIV_MAX_BYTES: atomics */
  priv_plan_of(p, "shared", &plan);
  ck_assert_int_eq(plan.n, 0);
  ir = fast_ir(p, "shared");
  ck_assert_msg(data_atomics(ir) >= 5, "shared: atomics missing:\n%.3000s", ir);
  free(ir);
  /* a serial task runs on one thread: nothing to privatize */
  fb_kernel *k = NULL;
  fb_diags_init(&d);
  ck_assert_int_eq(fb_program_instantiate(p, "serial", NULL, 0, &k, &d), 0);
  fb_diags_free(&d);
  fb_task_list tl;
  char err[512] = "";
  ck_assert_int_eq(fb_lower(k, &tl, err, sizeof err), 0);
  fb_cg_task t = {tl.v[0].ir, tl.v[0].loop, 0, NULL};
  ck_assert_int_eq(fb_cg_priv_plan(&t, &plan, NULL), 0);
  ck_assert_int_eq(plan.n, 0);
  fb_task_list_free(&tl);
  /* NVPTX keeps its (native) float atomics */
  ir = task_ir(p, "scatter", "nvptx64");
  ck_assert_msg(strstr(ir, "atomicrmw fadd"), "scatter on NVPTX: no atomics:\n%.3000s", ir);
  free(ir);
  fb_program_free(p);
}
END_TEST

START_TEST(test_group_ir) {
  fb_diags d;
  fb_diags_init(&d);
  fb_program *p = NULL;
  ck_assert_int_eq(fb_program_parse("group.fbk", GROUP_SRC, &p, &d), 0);
  fb_diags_free(&d);
  /* a 16-aligned cell of four f32 is one 16-byte compare-and-swap where
   * the host has one (x86 cx16), else two paired ones; a cell only
   * 8-aligned (odd) always two */
  int quad = host_cx16();
  const char *ks[] = {"sparse", "dense", "odd"};
  for (int i = 0; i < 3; i++) {
    char *ir = fast_ir(p, ks[i]);
    ck_assert_msg(!strstr(ir, "atomicrmw fadd"), "%s: an f32 add left alone:\n%.3000s", ks[i], ir);
    if (quad && i < 2)
      ck_assert_msg(count(ir, "fadd <4 x float>") >= 1 && count(ir, "cmpxchg ptr") >= 1 &&
                        strstr(ir, "i128") && !strstr(ir, "fadd <2 x float>"),
                    "%s: the cell's four adds are not one 16-byte compare-and-swap:\n%.3000s", ks[i],
                    ir);
    else
      ck_assert_msg(count(ir, "fadd <2 x float>") >= 2 && !strstr(ir, "i128"),
                    "%s: the cell's four adds are not two paired compare-and-swaps:\n%.3000s", ks[i],
                    ir);
    if (i == 0) /* one pointer walk per cell, not one per component */
      ck_assert_msg(
          count(ir, "call ptr @fb_rt_ptr_activate") + count(ir, "fb_rt_ptr_activate.exit:") <= 1,
          "sparse: more than one activation per cell:\n%.3000s", ir);
    free(ir);
  }
  /* a store between them: no group across it (m and v.0 stay apart) */
  char *ir = fast_ir(p, "apart");
  ck_assert_msg(strstr(ir, "atomicrmw fadd"), "apart: grouped across a store:\n%.3000s", ir);
  free(ir);
  fb_program_free(p);
}
END_TEST

/* Loads through a sparse path (emit_mem.c): the three components of a
 * vector cell in one walk, an inactive level read from the zero block by a
 * select (no exit branch); writes (here atomics) never use the zero block.
 * tests/test_sparse.c (neighbour_reads) checks the results on every
 * sparse container kind, with neighbours in other and inactive blocks. */
static const char *ZERO_SRC = "layout {\n"
                              "  pointer(i: 8) { dense(i: 4) { place a: f32[3] } }\n"
                              "  dense(i: 32) { place c: f32[3] }\n"
                              "}\n"
                              "kernel nb() { for i in 0 .. 32 { c[i] = a[(i + 1) % 32] } }\n"
                              "kernel acc() { for i in 0 .. 32 { a[(i + 1) % 32] += [1.0, 2.0, "
                              "3.0] } }\n";

/* The IR of one of kernel's tasks: the first of exactly ntasks, or
 * (ntasks < 0) the last, whose loop must be a struct_for. */
static char *task_ir_n(fb_program *p, const char *kernel, const char *target, int ntasks) {
  fb_kernel *k = NULL;
  fb_diags d;
  fb_diags_init(&d);
  ck_assert_int_eq(fb_program_instantiate(p, kernel, NULL, 0, &k, &d), 0);
  fb_diags_free(&d);
  fb_task_list tl;
  char err[512] = "";
  ck_assert_msg(fb_lower(k, &tl, err, sizeof err) == 0, "lower %s: %s", kernel, err);
  int which = 0;
  if (ntasks >= 0) {
    ck_assert_int_eq(tl.n, ntasks);
  } else {
    which = tl.n - 1;
    ck_assert_int_ge(which, 0);
    ck_assert_int_eq(tl.v[which].ir->stmts[tl.v[which].loop].op, FB_OP_STRUCT_FOR);
  }
  fb_cg_task t = {tl.v[which].ir, tl.v[which].loop, 0, NULL};
  char *text = NULL;
  ck_assert_msg(fb_llvm_ir_text(&t, target, &text, err, sizeof err) == 0, "IR of %s: %s", kernel,
                err);
  fb_task_list_free(&tl);
  return text;
}

static char *task_ir(fb_program *p, const char *kernel, const char *target) {
  return task_ir_n(p, kernel, target, 1);
}

/* Lines of s up to the end of its first function that contain a and b. */
static int lines_with(const char *s, const char *a, const char *b) {
  int n = 0;
  while (*s) {
    const char *nl = strchr(s, '\n');
    size_t len = nl ? (size_t)(nl - s) : strlen(s);
    char line[512];
    snprintf(line, sizeof line, "%.*s", (int)len, s);
    if (!strcmp(line, "}")) break;
    n += strstr(line, a) && strstr(line, b);
    s += len + (nl != NULL);
  }
  return n;
}

/* Parallel cell loops (emit.c): a sparse struct_for's cell loop is marked
 * llvm.loop.parallel_accesses, its field and slot accesses in the access
 * group, only where no iteration can see another's writes. */
static const char *PAR_SRC =
    "layout {\n"
    "  pointer(i: 8) { dense(i: 16) { place a: f32 } }\n"
    "  pointer(ij: 2, 2) { dense(ij: 8, 8) { place sm: f32 } }\n"
    "  dense(i: 128) { place out: f32, o2: f32 }\n"
    "}\n"
    "kernel gather() { for i in a { out[i] = a[(i + 5) % 128] + a[(i + 120) % 128] } }\n"
    "kernel own_rw() { for i in a { out[i] = out[i] * 2.0 + a[(i + 1) % 128] } }\n"
    "kernel nb_read() { for i in a { out[i] = out[(i + 1) % 128] + a[i] } }\n"
    "kernel atomic() { for i in a { o2[0] += a[(i + 1) % 128] } }\n"
    "kernel sparse_store() { for i in a { a[i] = out[(i + 1) % 128] } }\n"
    "kernel fewer_dims() { for i, j in sm { out[i] = sm[i, j] } }\n"
    "kernel with_rand() { for i in a { out[i] = a[(i + 1) % 128] + random() } }\n";

/* The IR of kernel's struct_for task (the last of its tasks). */
static char *loop_task_ir(fb_program *p, const char *kernel, const char *target) {
  return task_ir_n(p, kernel, target, -1);
}

START_TEST(test_parallel_cell_loop_ir) {
  fb_diags d;
  fb_diags_init(&d);
  fb_program *p = NULL;
  ck_assert_int_eq(fb_program_parse("par.fbk", PAR_SRC, &p, &d), 0);
  fb_diags_free(&d);
  const char *yes[] = {"gather", "own_rw"};
  for (int i = 0; i < 2; i++) {
    char *ir = loop_task_ir(p, yes[i], "x86_64");
    const char *body = strstr(ir, "define void @fb_body(");
    ck_assert_ptr_nonnull(body);
    ck_assert_msg(strstr(ir, "llvm.loop.parallel_accesses") &&
                      lines_with(body, "%slot", "llvm.access.group") >= 1 &&
                      lines_with(body, "load float", "llvm.access.group") >= 2 &&
                      lines_with(body, "store float", "llvm.access.group") >= 1,
                  "%s: the cell loop is not marked parallel:\n%.3000s", yes[i], ir);
    free(ir);
    /* LLVM keeps the claim through O3 (vectorized or not: its cost model's
     * choice on this CPU) and the module verifies */
    ir = loop_task_ir(p, yes[i], "x86_64-O3");
    ck_assert_msg(strstr(ir, "llvm.loop.parallel_accesses") || strstr(ir, "isvectorized"),
                  "%s: O3 lost the loop's metadata:\n%.3000s", yes[i], ir);
    free(ir);
  }
  /* a stored place read elsewhere, an atomic, an activating store under a
   * pointer, a store that two iterations share, rand(): left alone */
  const char *no[] = {"nb_read", "atomic", "sparse_store", "fewer_dims", "with_rand"};
  for (int i = 0; i < 5; i++) {
    char *ir = loop_task_ir(p, no[i], "x86_64");
    ck_assert_msg(!strstr(ir, "parallel_accesses") && !strstr(ir, "llvm.access.group"),
                  "%s: marked parallel, but an iteration may see another's writes:\n%.3000s", no[i],
                  ir);
    free(ir);
  }
  char *ir = loop_task_ir(p, "gather", "nvptx64");
  ck_assert_msg(!strstr(ir, "parallel_accesses"), "gather: marked on NVPTX:\n%.3000s", ir);
  free(ir);
  fb_program_free(p);
}
END_TEST

/* Skipped blocks of a guarded scan (emit.c): `for j { if c(j) {...} }`
 * with c read from dense fields checks 8 iterations at a time; at O3 the
 * check is one vector load of the 8 rest lengths and one compare. Left
 * alone: a store before the if, an else, an index read from memory, a
 * sparse field, NVPTX. tests/test_lang_exec.c (skipped_scan_blocks) checks
 * the results against the interpreter. */
static const char *SCAN_SRC =
    "layout {\n"
    "  dense(ij: 256, 256) { place rl: f32 }\n"
    "  dense(i: 256) { place x: f32, f: f32, k: i32 }\n"
    "  pointer(i: 16) { dense(i: 16) { place sp: f32 } }\n"
    "  place n: i32\n"
    "}\n"
    "kernel scan() { for i in 0 .. 256 { let nn = n[]\n var a = 0.0\n"
    "  for j in 0 .. nn { if rl[i, j] != 0.0 { a += x[i] - x[j] } }\n f[i] = a } }\n"
    "kernel stored() { for i in 0 .. 256 { for j in 0 .. 256 { k[j] = i\n"
    "  if rl[i, j] != 0.0 { f[i] += 1.0 } } } }\n"
    "kernel other() { for i in 0 .. 256 { for j in 0 .. 256 {\n"
    "  if rl[i, j] != 0.0 { f[i] += 1.0 } else { f[i] -= 1.0 } } } }\n"
    "kernel indirect() { for i in 0 .. 256 { for j in 0 .. 256 {\n"
    "  if rl[i, k[j]] != 0.0 { f[i] += 1.0 } } } }\n"
    "kernel sparse() { for i in 0 .. 256 { for j in 0 .. 256 {\n"
    "  if sp[j] != 0.0 { f[i] += 1.0 } } } }\n";

START_TEST(test_scan_skip_ir) {
  fb_diags d;
  fb_diags_init(&d);
  fb_program *p = NULL;
  ck_assert_int_eq(fb_program_parse("scan.fbk", SCAN_SRC, &p, &d), 0);
  fb_diags_free(&d);
  char *ir = task_ir_n(p, "scan", "x86_64", 1);
  ck_assert_msg(strstr(ir, "scan.check") && strstr(ir, "scan.skip") && strstr(ir, "scan.inbounds"),
                "scan: no skipped blocks:\n%.4000s", ir);
  free(ir);
  ir = task_ir_n(p, "scan", "x86_64-O3", 1);
  char *at = strstr(ir, "\nscan.inbounds");
  ck_assert_msg(at != NULL, "scan: O3 lost the check:\n%.4000s", ir);
  char *vl = strstr(at, "load <");
  char *end = strstr(at + 1, "\n\n");
  ck_assert_msg(vl && (!end || vl < end) && strstr(vl, "x float>"),
                "scan: the 8 loads of the check are not one vector load:\n%.3000s", at);
  free(ir);
  const char *no[] = {"stored", "other", "indirect", "sparse"};
  for (int i = 0; i < 4; i++) {
    ir = task_ir_n(p, no[i], "x86_64", 1);
    ck_assert_msg(!strstr(ir, "scan.check"), "%s: skipped blocks where they may not be:\n%.3000s",
                  no[i], ir);
    free(ir);
  }
  ir = task_ir_n(p, "scan", "nvptx64", 1);
  ck_assert_msg(!strstr(ir, "scan.check"), "scan: skipped blocks on NVPTX");
  free(ir);
  fb_program_free(p);
}
END_TEST

START_TEST(test_zero_walk_ir) {
  fb_diags d;
  fb_diags_init(&d);
  fb_program *p = NULL;
  ck_assert_int_eq(fb_program_parse("zero.fbk", ZERO_SRC, &p, &d), 0);
  fb_diags_free(&d);
  char *ir = task_ir(p, "nb", "x86_64");
  /* one walk (one pointer slot loaded) for the three components; its
   * inactive level selects the zero block */
  char *b0 = strstr(ir, "define void @fb_body(");
  ck_assert_ptr_nonnull(b0);
  ck_assert_msg(lines_with(b0, "%slot", "= load i64") == 1,
                "nb: not one walk for the components of a[i + 1]:\n%.3000s", b0);
  ck_assert_msg(strstr(ir, "@fb_cg_zero") && strstr(ir, "select i1"),
                "nb: inactive cells not read from the zero block:\n%.3000s", ir);
  free(ir);
  ir = task_ir(p, "nb", "x86_64-O3");
  char *body = strstr(ir, "define void @fb_body(");
  ck_assert_ptr_nonnull(body);
  /* straight-line: the walk's exits are gone (LLVM unrolls and vectorises
   * the loads of the components) */
  ck_assert_msg(strstr(body, "ptr @fb_cg_zero") && !strstr(body, "sparse.done") &&
                    !strstr(body, "ptr.on") && count(body, "load float") >= 1,
                "nb: loads not from a select of the cell and the zero block");
  free(ir);
  ir = task_ir(p, "acc", "x86_64");
  ck_assert_msg(!strstr(ir, "fb_cg_zero"), "acc: an atomic's walk uses the zero block:\n%.3000s", ir);
  free(ir);
  ir = task_ir(p, "nb", "nvptx64");
  ck_assert_msg(!strstr(ir, "fb_cg_zero"), "nb: the zero block on NVPTX:\n%.3000s", ir);
  free(ir);
  fb_program_free(p);
}
END_TEST

/* is_active on the CPU (emit_mem.c, active_flag): the walk goes through
 * the zero block like a load's and ends in a test of the container's own
 * slot, bit or length, with no branch per level; on NVPTX the walk keeps
 * its exits. tests/test_sparse.c (pointer_pointer_dense, pointer_bitmasked,
 * bitmasked_root, the dynamic cases) checks the results against the
 * interpreter, with blocks deactivated and reactivated. */
static const char *ACTIVE_SRC =
    "layout {\n"
    "  pointer(ij: 4, 4) as b1 { pointer(ij: 4, 4) as b2 { bitmasked(ij: 2, 2) as b3 {\n"
    "    dense(ij: 2, 2) { place x: i32 } } } }\n"
    "  dense(ij: 64, 64) { place t: i32 }\n"
    "}\n"
    "kernel paint() { for i in 0 .. 64 { for j in 0 .. 64 {\n"
    "  t[i, j] = is_active(b1, i // 16, j // 16) + is_active(b2, i // 4, j // 4)\n"
    "            + is_active(b3, i // 2, j // 2) + is_active(x, i, j) } } }\n";

START_TEST(test_is_active_walk_ir) {
  fb_diags d;
  fb_diags_init(&d);
  fb_program *p = NULL;
  ck_assert_int_eq(fb_program_parse("active.fbk", ACTIVE_SRC, &p, &d), 0);
  fb_diags_free(&d);
  char *ir = task_ir(p, "paint", "x86_64");
  char *body = strstr(ir, "define void @fb_body(");
  ck_assert_ptr_nonnull(body);
  /* every level above the tested one selects the zero block; no level
   * leaves for an exit block */
  ck_assert_msg(strstr(body, "@fb_cg_zero") && strstr(body, "select i1"),
                "paint: is_active's walk does not go through the zero block:\n%.3000s", body);
  ck_assert_msg(!strstr(body, "ptr.on") && !strstr(body, "bm.on"),
                "paint: is_active's walk still branches per level:\n%.4000s", body);
  free(ir);
  ir = task_ir(p, "paint", "x86_64-O3");
  body = strstr(ir, "define void @fb_body(");
  ck_assert_ptr_nonnull(body);
  ck_assert_msg(!strstr(body, "sparse.done"), "paint: a branch left after O3:\n%.4000s", body);
  free(ir);
  ir = task_ir(p, "paint", "nvptx64");
  ck_assert_msg(!strstr(ir, "fb_cg_zero") && strstr(ir, "ptr.on"),
                "paint: NVPTX's is_active does not keep its exits:\n%.3000s", ir);
  free(ir);
  fb_program_free(p);
}
END_TEST

/* Stores of the components of a vector cell through a sparse path
 * (emit_mem.c, fb_emit_try_stores): one bounds check and one walk for the
 * three, both for store (one activation) and for store_na (one skip).
 * tests/test_sparse.c (neighbour_reads' fill, demoted_vector_writes)
 * checks the results against the interpreter. */
static const char *STORE_SRC = "layout {\n"
                               "  pointer(i: 8) { dense(i: 4) { place a: f32[3] } }\n"
                               "  pointer(i: 8) { dense(i: 4) { place b: f32 } }\n"
                               "}\n"
                               "kernel st(n: i32) {\n"
                               "  for i in 0 .. 32 { a[(i + n) % 32] = [1.0, 2.0, f32(i)] }\n"
                               "}\n";

/* The pre-O3 IR of kernel's one task, its stores turned into store_na when
 * na (as activation demotion does). */
static char *task_ir_na(fb_program *p, const char *kernel, int na) {
  fb_kernel *k = NULL;
  fb_diags d;
  fb_diags_init(&d);
  ck_assert_int_eq(fb_program_instantiate(p, kernel, NULL, 0, &k, &d), 0);
  fb_diags_free(&d);
  fb_task_list tl;
  char err[512] = "";
  ck_assert_msg(fb_lower(k, &tl, err, sizeof err) == 0, "lower %s: %s", kernel, err);
  ck_assert_int_eq(tl.n, 1);
  int stores = 0;
  for (int j = 0; j < tl.v[0].ir->nstmts; j++)
    if (tl.v[0].ir->stmts[j].op == FB_OP_STORE) {
      stores++;
      if (na) tl.v[0].ir->stmts[j].op = FB_OP_STORE_NA;
    }
  ck_assert_int_eq(stores, 3);
  fb_cg_task t = {tl.v[0].ir, tl.v[0].loop, 0, NULL};
  char *text = NULL;
  ck_assert_msg(fb_llvm_ir_text(&t, "x86_64", &text, err, sizeof err) == 0, "IR of %s: %s", kernel,
                err);
  fb_task_list_free(&tl);
  return text;
}

START_TEST(test_store_walk_ir) {
  fb_diags d;
  fb_diags_init(&d);
  fb_program *p = NULL;
  ck_assert_int_eq(fb_program_parse("store.fbk", STORE_SRC, &p, &d), 0);
  fb_diags_free(&d);
  for (int na = 0; na <= 1; na++) {
    char *ir = task_ir_na(p, "st", na);
    char *b0 = strstr(ir, "define void @fb_body(");
    ck_assert_ptr_nonnull(b0);
    ck_assert_msg(lines_with(b0, "store float", "") == 3, "st (na %d): not three stores:\n%.3000s", na,
                  b0);
    if (!na)
      ck_assert_msg(lines_with(b0, "call ptr @fb_rt_ptr_activate", "") == 1,
                    "st: not one activation for the three components of a[I]:\n%.3000s", b0);
    else
      ck_assert_msg(lines_with(b0, "%slot", "= load i64") == 1 && !strstr(b0, "fb_rt_ptr_activate"),
                    "st (store_na): not one walk, without activation, for a[I]:\n%.3000s", b0);
    ck_assert_msg(lines_with(b0, "icmp ult i64", "") == 1,
                  "st (na %d): not one bounds check for the three stores:\n%.3000s", na, b0);
    free(ir);
  }
  fb_program_free(p);
}
END_TEST

/* Loads of sparse structure (pointer slots, bitmask words) carry a TBAA
 * type of their own (emit_mem.c, tag_slots), apart from every field's: a
 * slot whose address is invariant leaves a loop that only stores fields
 * (hoist). Our own writes to structure carry the same type, so a load
 * that such a write may change stays in the loop: a bitmasked store's
 * activation (an atomic or of the mask word, kept) and deactivation's
 * exchange of a pointer slot (dea). */
static const char *SLOT_SRC = "layout {\n"
                              "  pointer(i: 4) as pa { dense(i: 8) { place a: f32 } }\n"
                              "  bitmasked(i: 4) { dense(i: 8) { place m: f32 } }\n"
                              "  dense(i: 64) { place b: f32 }\n"
                              "}\n"
                              "kernel hoist() { for i in 0 .. 64 { b[i] = a[3] + f32(i) } }\n"
                              "kernel kept() {\n"
                              "  for i in 0 .. 64 {\n"
                              "    b[i] = m[3] + f32(i)\n"
                              "    m[(i * 7) % 32] = 1.0\n"
                              "  }\n"
                              "}\n"
                              "kernel dea() {\n"
                              "  for i in 0 .. 64 {\n"
                              "    b[i] = a[3] + f32(i)\n"
                              "    deactivate(pa, (i * 3) % 4)\n"
                              "  }\n"
                              "}\n";

/* The first line of s, up to the end of its function, containing a and b. */
static const char *line_with(const char *s, const char *a, const char *b) {
  while (*s) {
    const char *nl = strchr(s, '\n');
    size_t len = nl ? (size_t)(nl - s) : strlen(s);
    char line[512];
    snprintf(line, sizeof line, "%.*s", (int)len, s);
    if (!strcmp(line, "}")) return NULL;
    if (strstr(line, a) && strstr(line, b)) return s;
    s += len + (nl != NULL);
  }
  return NULL;
}

/* The N of "!tbaa !N" on the line at s, or -1. */
static int tbaa_of(const char *s) {
  const char *nl = strchr(s, '\n');
  const char *t = strstr(s, "!tbaa !");
  return t && (!nl || t < nl) ? atoi(t + 7) : -1;
}

START_TEST(test_slot_tbaa_ir) {
  fb_diags d;
  fb_diags_init(&d);
  fb_program *p = NULL;
  ck_assert_int_eq(fb_program_parse("slot.fbk", SLOT_SRC, &p, &d), 0);
  fb_diags_free(&d);
  /* before optimization: the slot, the mask word and the writes to them
   * share one type, which is not the fields' */
  char *ir = task_ir(p, "hoist", "x86_64");
  char *b0 = strstr(ir, "define void @fb_body(");
  ck_assert_ptr_nonnull(b0);
  const char *ld = line_with(b0, "%slot", "= load i64"), *fl = line_with(b0, "= load float", "");
  ck_assert_msg(ld && fl && tbaa_of(ld) >= 0 && tbaa_of(fl) >= 0 && tbaa_of(ld) != tbaa_of(fl),
                "hoist: the slot load has no type of its own:\n%.3000s", b0);
  ck_assert_msg(strstr(ir, "!\"fb.slots\""), "hoist: no fb.slots type:\n%.3000s", ir);
  free(ir);
  ir = task_ir(p, "kept", "x86_64");
  b0 = strstr(ir, "define void @fb_body(");
  ck_assert_ptr_nonnull(b0);
  ld = line_with(b0, "%mask", "= load i32");
  const char *wr = line_with(b0, "atomicrmw or", "");
  ck_assert_msg(ld && wr && tbaa_of(ld) >= 0 && tbaa_of(ld) == tbaa_of(wr),
                "kept: the mask load and the activation's atomic or differ in type:\n%.3000s", b0);
  free(ir);
  ir = task_ir_n(p, "dea", "x86_64", 2); /* the loop, then gc */
  b0 = strstr(ir, "define void @fb_body(");
  ck_assert_ptr_nonnull(b0);
  ld = line_with(b0, "%slot", "= load i64");
  wr = line_with(b0, "atomicrmw xchg", "");
  ck_assert_msg(ld && wr && tbaa_of(ld) >= 0 && tbaa_of(ld) == tbaa_of(wr),
                "dea: the slot load and deactivation's exchange differ in type:\n%.3000s", b0);
  free(ir);
  /* after O3: where the loop's counter is (its phi), and what is loaded
   * after it */
  const char *kern[3] = {"hoist", "kept", "dea"};
  const char *what[3][2] = {
      {"%slot", "= load i64"}, {"%mask", "= load i32"}, {"%slot", "= load i64"}};
  for (int n = 0; n < 3; n++) {
    ir = task_ir_n(p, kern[n], "x86_64-O3", n == 2 ? 2 : 1);
    b0 = strstr(ir, "define void @fb_body(");
    ck_assert_ptr_nonnull(b0);
    const char *head = line_with(b0, "%it", "= phi");
    ck_assert_msg(head != NULL, "%s: no loop:\n%.3000s", kern[n], b0);
    const char *in_loop = line_with(head, what[n][0], what[n][1]);
    if (n == 0)
      ck_assert_msg(!in_loop && line_with(b0, what[n][0], what[n][1]),
                    "hoist: the invariant slot load is not hoisted out of the loop:\n%.3000s", b0);
    else
      ck_assert_msg(in_loop != NULL, "%s: a load hoisted past a write to its slot:\n%.3000s", kern[n],
                    b0);
    free(ir);
  }
  fb_program_free(p);
}
END_TEST

START_TEST(test_fast_results) {
  fb_program *p = fast_program();
  const fb_layout *l = fb_program_layout(p);
  fb_interp *in = fb_interp_new(l, SEED);
  ck_assert_ptr_nonnull(in);
  jit_state *js = calloc(1, sizeof *js);
  ck_assert_ptr_nonnull(js);
  js->root = calloc(1, l->root_bytes);
  ck_assert_ptr_nonnull(js->root);
  fb_cpu_jit *j = new_jit();
  const char *ks[] = {"init",      "saxpy",    "stencil", "split_copy", "copy2d",
                      "grid_copy", "groups",   "scatter", "saxpy",      "scatter",
                      "scatter2",  "scatter2", "bilerp",  "saxpy",      "bilerp"};
  for (size_t n = 0; n < sizeof ks / sizeof ks[0]; n++) {
    fb_kernel *k = NULL;
    fb_diags d;
    fb_diags_init(&d);
    ck_assert_int_eq(fb_program_instantiate(p, ks[n], NULL, 0, &k, &d), 0);
    fb_diags_free(&d);
    fb_task_list tl;
    char err[512] = "";
    ck_assert_msg(fb_lower(k, &tl, err, sizeof err) == 0, "lower %s: %s", ks[n], err);
    for (int t = 0; t < tl.n; t++) {
      cg_step st = {tl.v[t].ir, tl.v[t].loop, {{0}}, 0};
      fb_cpu_code code;
      compile_ok(j, &st, &code);
      run_code(&code, &st, js, (uint64_t)n);
      ck_assert_msg(js->error[0] == 0, "%s: error %d", ks[n], js->error[0]);
    }
    fb_task_list_free(&tl);
    fb_value ret;
    ck_assert_int_eq(fb_interp_run(in, k, NULL, 0, &ret), 0);
    char what[64];
    snprintf(what, sizeof what, "after %s", ks[n]);
    /* exact: the same IEEE f32 operations on both sides (no fast-math) */
    ck_assert_msg(compare_fields(l, in, js->root, 0, what) == 0, "%s: fields differ", what);
  }
  fb_cpu_jit_free(j);
  free(js->root);
  free(js);
  fb_interp_free(in);
  fb_program_free(p);
}
END_TEST

int main(void) {
  Suite *s = suite_create("codegen");
  TCase *tc = tcase_create("cpu");
  tcase_set_timeout(tc, 120);
  tcase_add_loop_test(tc, test_case, 0, CG_NCASES);
  tcase_add_test(tc, test_cache);
  tcase_add_test(tc, test_concurrent);
  tcase_add_test(tc, test_refusals);
  tcase_add_test(tc, test_ir_text);
  tcase_add_test(tc, test_fast_ir);
  tcase_add_test(tc, test_fast_results);
  tcase_add_test(tc, test_group_ir);
  tcase_add_test(tc, test_priv_ir);
  tcase_add_test(tc, test_zero_walk_ir);
  tcase_add_test(tc, test_is_active_walk_ir);
  tcase_add_test(tc, test_parallel_cell_loop_ir);
  tcase_add_test(tc, test_scan_skip_ir);
  tcase_add_test(tc, test_store_walk_ir);
  tcase_add_test(tc, test_slot_tbaa_ir);
  suite_add_tcase(s, tc);
  return fbt_run(s);
}
