/* Reductions in parallel tasks (codegen/reduce.c): an atomic on a cell that
 * every iteration of a parallel loop updates, with its old value unused,
 * is accumulated privately by each body call and applied with one atomic
 * at its end. Kernels made with the builder run through the engine (CPU,
 * four threads, many chunks) and through the reference interpreter: every
 * integer op (add, sub, min, max, and, or, xor) on i32, i64 and u32, on a
 * 0-d field and on a cell of a 1-d field indexed by an argument or by a
 * value computed in the loop, inside if and serial loops, several
 * reductions in one loop; atomics that must stay as they are (old value
 * used, mixed ops on one field, loads or stores of the field, is_active or
 * a store_na beside a sparse target); a pointer-field target, whose cell is
 * activated exactly when a contribution happens (atomic_add_na: never);
 * invariant indices out of bounds (the error is latched only when a
 * contribution happened, nothing is written); f32 sums within a tolerance
 * and f32 min/max exactly, NaN included; struct-fors over dense and sparse
 * fields.
 * That the transformation fires (or not) is read from the LLVM IR of the
 * tasks (a reduce.flush block per reduction), and the PTX of the
 * transformed kernels goes through ptxas when it is installed. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "codegen/codegen.h"
#include "fusebox/engine.h"
#include "optimizer/optimizer.h"
#include "tests/support/support.h"

#define N 40000  /* iterations of the loops (the src fields' size) */
#define H 8      /* cells of the 1-d targets */
#define SEED 11

/* ---------------------------------------------------------------- layout */

typedef struct lay {
  fb_layout *l;
  int s[3], h[3];      /* 0-d and 1-d targets: i32, i64, u32 */
  int sf, hf;          /* f32 targets */
  int src, bits, fsrc, fnan, out, cnt;
  int sp, sq, spc;     /* pointer(i: 4) { dense(i: 4) { sp, sq } } and the pointer */
} lay;

static const fb_type TYPES[3] = {FB_T_I32, FB_T_I64, FB_T_U32};
static const fb_op OPS[7] = {FB_OP_ATOMIC_ADD, FB_OP_ATOMIC_SUB, FB_OP_ATOMIC_MIN, FB_OP_ATOMIC_MAX,
                             FB_OP_ATOMIC_AND, FB_OP_ATOMIC_OR,  FB_OP_ATOMIC_XOR};

static void lay_build(lay *y) {
  fb_layout *l = fb_layout_new();
  ck_assert_ptr_nonnull(l);
  y->l = l;
  const char *sn[3] = {"s_i32", "s_i64", "s_u32"}, *hn[3] = {"h_i32", "h_i64", "h_u32"};
  for (int t = 0; t < 3; t++) y->s[t] = fb_layout_place(l, 0, sn[t], TYPES[t]);
  y->sf = fb_layout_place(l, 0, "s_f32", FB_T_F32);
  y->cnt = fb_layout_place(l, 0, "cnt", FB_T_I32);
  int64_t h = H, n = N, four = 4;
  int dh = fb_layout_add(l, 0, FB_SN_DENSE, "i", &h, 0, NULL);
  for (int t = 0; t < 3; t++) y->h[t] = fb_layout_place(l, dh, hn[t], TYPES[t]);
  y->hf = fb_layout_place(l, dh, "h_f32", FB_T_F32);
  int dn = fb_layout_add(l, 0, FB_SN_DENSE, "i", &n, 0, NULL);
  y->src = fb_layout_place(l, dn, "src", FB_T_I64);
  y->bits = fb_layout_place(l, dn, "bits", FB_T_I64);
  y->fsrc = fb_layout_place(l, dn, "fsrc", FB_T_F32);
  y->fnan = fb_layout_place(l, dn, "fnan", FB_T_F32);
  y->out = fb_layout_place(l, dn, "out", FB_T_I32);
  y->spc = fb_layout_add(l, 0, FB_SN_POINTER, "i", &four, 0, "blocks");
  int inner = fb_layout_add(l, y->spc, FB_SN_DENSE, "i", &four, 0, NULL);
  y->sp = fb_layout_place(l, inner, "sp", FB_T_I32);
  y->sq = fb_layout_place(l, inner, "sq", FB_T_I32);
  char err[256];
  ck_assert_msg(fb_layout_finalize(l, err, sizeof err) == 0, "layout: %s", err);
}

/* ---------------------------------------------------------------- engine + interpreter */

typedef struct duo {
  lay y;
  fb_engine *e;
  fb_session *s;
  fb_interp *in;
} duo;

static void duo_open(duo *d) {
  memset(d, 0, sizeof *d);
  lay_build(&d->y);
  fb_engine_config cfg = {.backend = fbt_backend(), .compile_threads = 1, .cpu_threads = 4};
  char err[512];
  ck_assert_msg(fb_engine_create(&cfg, &d->e, err, sizeof err) == 0, "engine: %s", err);
  /* the demoted (_na) atomics are the engine's own ops */
  fb_session_config sc = {.mode = "sync", .seed = SEED, .allow_internal_ops = 1};
  ck_assert_msg(fb_session_create(d->e, &sc, d->y.l, &d->s, err, sizeof err) == 0, "session: %s",
                err);
  d->in = fb_interp_new(d->y.l, SEED);
  ck_assert_ptr_nonnull(d->in);
}

static void duo_close(duo *d) {
  fb_interp_free(d->in);
  fb_session_destroy(d->s);
  fb_engine_destroy(d->e);
  fb_layout_free(d->y.l);
}

static size_t field_bytes(duo *d, int place) {
  return (size_t)fb_field_numel(d->y.l, place) * fb_type_size(d->y.l->nodes[place].type);
}

/* The same contents into the engine's and the interpreter's field. */
static void put(duo *d, int place, const void *src) {
  size_t n = field_bytes(d, place);
  ck_assert_int_eq(fb_field_write(d->s, place, src, n), 0);
  memcpy(fb_interp_field(d->in, place), src, n);
}

/* The engine's copy of a field (malloc'd). */
static void *eread(duo *d, int place) {
  size_t n = field_bytes(d, place);
  void *v = malloc(n);
  ck_assert_ptr_nonnull(v);
  ck_assert_int_eq(fb_field_read(d->s, place, v, n), 0);
  return v;
}

/* The engine's field equals the interpreter's: the same bits, or both NaN. */
static void same_field(duo *d, int place, const char *what) {
  void *v = eread(d, place);
  const uint8_t *a = v, *b = fb_interp_field(d->in, place);
  fb_type t = d->y.l->nodes[place].type;
  size_t n = field_bytes(d, place), sz = fb_type_size(t);
  for (size_t i = 0; i < n; i += sz) {
    if (memcmp(a + i, b + i, sz) == 0) continue;
    int nans =
        t == FB_T_F32 && isnan(fb_value_load(t, a + i).v.f) && isnan(fb_value_load(t, b + i).v.f);
    ck_assert_msg(nans, "%s: %s[%zu] differs from the interpreter", what, d->y.l->nodes[place].name,
                  i / sz);
  }
  free(v);
}

/* Launch k on both with args (k, n, thr); both must give `want`. */
static void both(duo *d, const fb_kernel *k, int kid, int32_t a0, int32_t n, int32_t thr,
                 int want) {
  fb_value args[3] = {fb_value_i32(a0), fb_value_i32(n), fb_value_i32(thr)};
  int rc = fb_launch(d->s, kid, args, 3, NULL);
  ck_assert_msg(rc == want, "engine %s: %s, expected %s (%s)", k->name, fb_strerror(rc),
                fb_strerror(want), fb_session_errmsg(d->s));
  rc = fb_interp_run(d->in, k, args, 3, NULL);
  ck_assert_msg(rc == want, "interpreter %s: %s, expected %s (%s)", k->name, fb_strerror(rc),
                fb_strerror(want), fb_interp_errmsg(d->in));
}

static int add_kernel(duo *d, const fb_kernel *k) {
  int id = fb_session_add_kernel(d->s, k);
  ck_assert_msg(id >= 0, "add %s: %s (%s)", k->name, fb_strerror(id), fb_session_errmsg(d->s));
  return id;
}

/* Input data: src random 64-bit values (negative ones too), bits all ones
 * but for one bit cleared every 997 elements, fsrc in [-1, 1), fnan NaN. */
static void fill_inputs(duo *d) {
  int64_t *src = malloc(sizeof *src * N), *bits = malloc(sizeof *bits * N);
  float *f = malloc(sizeof *f * N), *fn = malloc(sizeof *fn * N);
  ck_assert(src && bits && f && fn);
  uint64_t x = 0x9e3779b97f4a7c15ull;
  for (int i = 0; i < N; i++) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    src[i] = (int64_t)x;
    bits[i] = i % 997 == 3 ? (int64_t)~(1ull << (x % 64)) : -1;
    f[i] = (float)((double)(x >> 11) / 9007199254740992.0 * 2.0 - 1.0);
    fn[i] = NAN;
  }
  put(d, d->y.src, src);
  put(d, d->y.bits, bits);
  put(d, d->y.fsrc, f);
  put(d, d->y.fnan, fn);
  free(src);
  free(bits);
  free(f);
  free(fn);
}

/* Targets to a known, nonzero state: cell c of every target holds a value
 * that depends on c (and on `salt`). */
static void reset_targets(duo *d, uint64_t salt) {
  uint8_t buf[8 * H];
  for (int t = 0; t < 3; t++) {
    size_t sz = fb_type_size(TYPES[t]);
    for (int c = 0; c < H; c++) {
      uint64_t v = (0x0123456789abcdefull * (uint64_t)(c + 1)) ^ salt;
      memcpy(buf + sz * (size_t)c, &v, sz); /* little-endian: the low bytes */
    }
    put(d, d->y.s[t], buf);
    put(d, d->y.h[t], buf);
  }
  float f[H];
  for (int c = 0; c < H; c++) f[c] = 0.25f * (float)c - 0.5f;
  put(d, d->y.sf, f);
  put(d, d->y.hf, f);
}

/* Extreme values of type TYPES[t] (0, all ones, the signed maximum and
 * minimum): every cell of its targets and the last input element (i = N - 1)
 * hold v, so that a reduction with one contribution exposes a wrong
 * starting value of the accumulator. */
static void extreme(duo *d, int t, int which) {
  int bits = fb_type_bits(TYPES[t]);
  uint64_t ones = bits == 64 ? ~0ull : (1ull << bits) - 1;
  uint64_t v[4] = {0, ones, ones >> 1, (ones >> 1) + 1};
  size_t sz = fb_type_size(TYPES[t]);
  uint8_t buf[8 * H];
  for (int c = 0; c < H; c++) memcpy(buf + sz * (size_t)c, &v[which], sz); /* little-endian */
  put(d, d->y.s[t], buf);
  put(d, d->y.h[t], buf);
  int64_t *src = fb_interp_field(d->in, d->y.src), *bw = fb_interp_field(d->in, d->y.bits);
  src[N - 1] = bw[N - 1] = (int64_t)v[which]; /* casts to 32 bits keep the low bits */
  put(d, d->y.src, src);
  put(d, d->y.bits, bw);
}

/* ---------------------------------------------------------------- does it fire? */

/* reduce.flush blocks in the LLVM IR (unoptimized) of k's parallel tasks,
 * the same for both targets. */
static int flushes(const fb_kernel *k) {
  fb_task_list tl;
  char err[512] = "";
  ck_assert_msg(fb_lower(k, &tl, err, sizeof err) == 0, "lower %s: %s", k->name, err);
  int total = 0;
  for (int i = 0; i < tl.n; i++) {
    if (tl.v[i].loop < 0) continue;
    fb_cg_task t = {tl.v[i].ir, tl.v[i].loop, 0, NULL};
    int count[2] = {0, 0};
    const char *targets[2] = {"x86_64", "nvptx64"};
    for (int g = 0; g < 2; g++) {
      char *text = NULL;
      int rc = fb_llvm_ir_text(&t, targets[g], &text, err, sizeof err);
      ck_assert_msg(rc == 0, "IR of %s: %s", k->name, err);
      for (const char *p = text; (p = strstr(p, "\nreduce.flush")) != NULL; p++) count[g]++;
      free(text);
    }
    ck_assert_int_eq(count[0], count[1]);
    total += count[0];
  }
  fb_task_list_free(&tl);
  return total;
}

/* ---------------------------------------------------------------- PTX */

/* ptxas from $FB_PTXAS (empty: none), $CUDA_HOME, /usr/local/cuda or PATH. */
static const char *ptxas_path(char *buf, size_t n) {
  const char *forced = getenv("FB_PTXAS");
  if (forced) return *forced && access(forced, X_OK) == 0 ? forced : NULL;
  const char *home = getenv("CUDA_HOME");
  snprintf(buf, n, "%s/bin/ptxas", home && *home ? home : "/usr/local/cuda");
  if (access(buf, X_OK) == 0) return buf;
  FILE *p = popen("command -v ptxas 2>/dev/null", "r");
  if (!p) return NULL;
  int got = fgets(buf, (int)n, p) != NULL;
  pclose(p);
  buf[strcspn(buf, "\n")] = 0;
  return got && *buf ? buf : NULL;
}

/* PTX of every parallel task of k for sm_80, assembled by ptxas. */
static void ptx_ok(const fb_kernel *k) {
  char buf[1024];
  const char *ptxas = ptxas_path(buf, sizeof buf);
  fb_task_list tl;
  char err[512] = "";
  ck_assert_int_eq(fb_lower(k, &tl, err, sizeof err), 0);
  for (int i = 0; i < tl.n; i++) {
    if (tl.v[i].loop < 0) continue;
    fb_cg_task t = {tl.v[i].ir, tl.v[i].loop, 0, NULL};
    char *ptx = NULL;
    int rc = fb_ptx_emit(&t, "sm_80", &ptx, err, sizeof err);
    ck_assert_msg(rc == 0, "PTX of %s: %s", k->name, err);
    ck_assert_ptr_nonnull(strstr(ptx, "atom."));
    if (ptxas) {
      char path[] = "/tmp/fb_reduce_XXXXXX";
      int fd = mkstemp(path);
      ck_assert_int_ge(fd, 0);
      FILE *f = fdopen(fd, "w");
      ck_assert_ptr_nonnull(f);
      fputs(ptx, f);
      fclose(f);
      char cmd[2200];
      snprintf(cmd, sizeof cmd, "'%s' -arch=sm_80 '%s' -o /dev/null", ptxas, path);
      int st = system(cmd);
      unlink(path);
      ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "ptxas refused %s", k->name);
    }
    free(ptx);
  }
  fb_task_list_free(&tl);
}

/* ---------------------------------------------------------------- kernels */

typedef struct kb {
  fb_kernel *k;
  fb_builder b;
  int arg_k, arg_n, arg_thr, loop, i, saved;
} kb;

/* kernel NAME(k: i32, n: i32, thr: i32) { for i in 0 .. n { <body> } }:
 * the builder is left inside the loop. */
static void kb_begin(kb *q, const lay *y, const char *name) {
  fb_type params[3] = {FB_T_I32, FB_T_I32, FB_T_I32};
  q->k = fb_kernel_new(y->l, name, 3, params, FB_T_VOID);
  ck_assert_ptr_nonnull(q->k);
  fb_builder_init(&q->b, q->k);
  q->arg_k = fb_b_arg(&q->b, 0);
  q->arg_n = fb_b_arg(&q->b, 1);
  q->arg_thr = fb_b_arg(&q->b, 2);
  q->loop = fb_b_range_for(&q->b, fb_b_const_i32(&q->b, 0), q->arg_n, 1);
  q->saved = fb_b_enter(&q->b, q->k->stmts[q->loop].body);
  q->i = fb_b_loop_index(&q->b, q->loop, 0);
}

static fb_kernel *kb_end(kb *q) {
  fb_b_leave(&q->b, q->saved);
  ck_assert_int_eq(q->b.err, 0);
  fb_diags dg;
  fb_diags_init(&dg);
  int rc = fb_verify(q->k, &dg);
  char *msg = fb_diags_join(&dg);
  ck_assert_msg(rc == 0, "%s does not verify: %s", q->k->name, msg ? msg : "");
  free(msg);
  fb_diags_free(&dg);
  return q->k;
}

/* Enter a new `if cond` block; returns the block to leave to. */
static int kb_if(kb *q, int cond) {
  int s = fb_b_if(&q->b, cond, 0);
  return fb_b_enter(&q->b, q->k->stmts[s].body);
}

/* The i-th element of the data an op reduces, as type t: bits for and,
 * not bits for or, src otherwise. */
static int operand(kb *q, const lay *y, fb_op op, fb_type t) {
  fb_builder *b = &q->b;
  int from = op == FB_OP_ATOMIC_AND || op == FB_OP_ATOMIC_OR ? y->bits : y->src;
  int x = fb_b_load(b, from, &q->i, 1);
  if (op == FB_OP_ATOMIC_OR) x = fb_b_unary(b, FB_OP_NOT, x);
  return t == FB_T_I64 ? x : fb_b_cast(b, t, x);
}

/* i > thr and i % 3 != 1: a data-independent but irregular condition. */
static int kb_cond(kb *q) {
  fb_builder *b = &q->b;
  int gt = fb_b_binary(b, FB_OP_GT, q->i, q->arg_thr);
  int r = fb_b_binary(b, FB_OP_REM, q->i, fb_b_const_i32(b, 3));
  return fb_b_binary(b, FB_OP_AND, gt, fb_b_binary(b, FB_OP_NE, r, fb_b_const_i32(b, 1)));
}

/* ---------------------------------------------------------------- tests */

/* Every integer op on every integer type into a 0-d field, unconditionally
 * (plain), and into h[k] under a condition together with a second
 * reduction of another op into the 0-d field (two accumulators). */
START_TEST(int_ops) {
  duo d;
  duo_open(&d);
  fill_inputs(&d);
  lay *y = &d.y;
  for (int t = 0; t < 3; t++) {
    for (int o = 0; o < 7; o++) {
      fb_op op = OPS[o], op2 = OPS[(o + 3) % 7];
      char name[64];
      kb q;
      snprintf(name, sizeof name, "plain_%s_%d", fb_op_table[op].name, t);
      kb_begin(&q, y, name);
      fb_b_global(&q.b, op, y->s[t], NULL, 0, operand(&q, y, op, TYPES[t]));
      fb_kernel *k1 = kb_end(&q);
      snprintf(name, sizeof name, "cond_%s_%d", fb_op_table[op].name, t);
      kb_begin(&q, y, name);
      int x = operand(&q, y, op, TYPES[t]), x2 = operand(&q, y, op2, TYPES[t]);
      int sv = kb_if(&q, kb_cond(&q));
      fb_b_global(&q.b, op, y->h[t], &q.arg_k, 1, x);
      fb_b_global(&q.b, op2, y->s[t], NULL, 0, x2);
      fb_b_leave(&q.b, sv);
      fb_kernel *k2 = kb_end(&q);
      ck_assert_int_eq(flushes(k1), 1);
      ck_assert_int_eq(flushes(k2), 2);
      int id1 = add_kernel(&d, k1), id2 = add_kernel(&d, k2);
      reset_targets(&d, (uint64_t)(t * 7 + o));
      both(&d, k1, id1, 0, N, 0, 0);
      both(&d, k2, id2, 5, N, 100, 0);
      both(&d, k2, id2, 2, N - 17, N / 2, 0);
      both(&d, k1, id1, 0, 3, 0, 0); /* fewer iterations than threads */
      same_field(&d, y->s[t], name);
      same_field(&d, y->h[t], name);
      for (int v = 0; v < 4; v++) { /* one contribution: i = N - 1 */
        extreme(&d, t, v);
        both(&d, k2, id2, 1, N, N - 2, 0);
        same_field(&d, y->s[t], name);
        same_field(&d, y->h[t], name);
      }
      fill_inputs(&d);
      ptx_ok(k2);
      if (t == 0) ptx_ok(k1);
      fb_kernel_free(k1);
      fb_kernel_free(k2);
    }
  }
  duo_close(&d);
}
END_TEST

/* Indices computed inside the loop from invariant values (a constant
 * defined in the body, k + 1 there), contributions in a serial loop and
 * a while inside the parallel loop. */
START_TEST(index_in_loop) {
  duo d;
  duo_open(&d);
  fill_inputs(&d);
  lay *y = &d.y;
  kb q;
  kb_begin(&q, y, "inner");
  fb_builder *b = &q.b;
  int c2 = fb_b_const_i32(b, 2);
  int k1 = fb_b_binary(b, FB_OP_ADD, q.arg_k, fb_b_const_i32(b, 1));
  int x = operand(&q, y, FB_OP_ATOMIC_ADD, FB_T_I64);
  fb_b_global(b, FB_OP_ATOMIC_ADD, y->h[1], &c2, 1, x);
  int rf = fb_b_range_for(b, fb_b_const_i32(b, 0), fb_b_const_i32(b, 3), 0);
  int sv = fb_b_enter(b, q.k->stmts[rf].body);
  int j = fb_b_loop_index(b, rf, 0);
  int sv2 = kb_if(&q, fb_b_binary(b, FB_OP_NE, j, fb_b_const_i32(b, 1)));
  int xj = fb_b_binary(b, FB_OP_ADD, x, fb_b_cast(b, FB_T_I64, j));
  fb_b_global(b, FB_OP_ATOMIC_XOR, y->h[0], &k1, 1, fb_b_cast(b, FB_T_I32, xj));
  fb_b_leave(b, sv2);
  fb_b_leave(b, sv);
  int w = fb_b_while(b);
  sv = fb_b_enter(b, q.k->stmts[w].body);
  fb_b_global(b, FB_OP_ATOMIC_MIN, y->s[2], NULL, 0, fb_b_cast(b, FB_T_U32, x));
  fb_b_break(b);
  fb_b_leave(b, sv);
  fb_kernel *k = kb_end(&q);
  ck_assert_int_eq(flushes(k), 3);
  int id = add_kernel(&d, k);
  reset_targets(&d, 99);
  both(&d, k, id, 4, N, 0, 0);
  both(&d, k, id, 6, N / 3, 0, 0);
  same_field(&d, y->h[0], "inner");
  same_field(&d, y->h[1], "inner");
  same_field(&d, y->s[2], "inner");
  ptx_ok(k);
  fb_kernel_free(k);
  duo_close(&d);
}
END_TEST

/* Old values used: a ticket counter (each iteration gets a distinct slot)
 * and a used add next to an unused one on the same field; mixed ops (add
 * and sub) on one field; a load or a store of the field in the loop. None
 * is transformed, and the results are still right. */
START_TEST(not_transformed) {
  duo d;
  duo_open(&d);
  fill_inputs(&d);
  lay *y = &d.y;
  kb q;
  kb_begin(&q, y, "ticket");
  fb_builder *b = &q.b;
  int tk = fb_b_global(b, FB_OP_ATOMIC_ADD, y->cnt, NULL, 0, fb_b_const_i32(b, 1));
  fb_b_store(b, y->out, &tk, 1, q.i);
  int x = operand(&q, y, FB_OP_ATOMIC_ADD, FB_T_I64);
  fb_b_global(b, FB_OP_ATOMIC_ADD, y->s[1], NULL, 0, x);
  int old = fb_b_global(b, FB_OP_ATOMIC_ADD, y->s[1], NULL, 0, fb_b_const_i64(b, 3));
  /* used by an if that does nothing else */
  int sv = kb_if(&q, fb_b_binary(b, FB_OP_EQ, old, fb_b_const_i64(b, 1)));
  fb_b_leave(b, sv);
  fb_kernel *kt = kb_end(&q);

  kb_begin(&q, y, "mixed");
  b = &q.b;
  x = operand(&q, y, FB_OP_ATOMIC_ADD, FB_T_I32);
  fb_b_global(b, FB_OP_ATOMIC_ADD, y->s[0], NULL, 0, x);
  fb_b_global(b, FB_OP_ATOMIC_SUB, y->s[0], NULL, 0, fb_b_binary(b, FB_OP_MUL, x, x));
  fb_b_global(b, FB_OP_ATOMIC_SUB, y->h[0], &q.arg_k, 1, x);
  fb_b_global(b, FB_OP_ATOMIC_ADD, y->h[0], &q.arg_k, 1, fb_b_const_i32(b, 5));
  fb_kernel *km = kb_end(&q);

  kb_begin(&q, y, "load_store");
  b = &q.b;
  x = operand(&q, y, FB_OP_ATOMIC_ADD, FB_T_U32);
  fb_b_global(b, FB_OP_ATOMIC_ADD, y->s[2], NULL, 0, x);
  fb_b_store(b, y->out, &q.i, 1, fb_b_cast(b, FB_T_I32, fb_b_load(b, y->s[2], NULL, 0)));
  fb_b_global(b, FB_OP_ATOMIC_OR, y->h[2], &q.arg_k, 1, x);
  sv = kb_if(&q, fb_b_binary(b, FB_OP_EQ, q.i, fb_b_const_i32(b, -5)));
  fb_b_store(b, y->h[2], &q.arg_k, 1, x);
  fb_b_leave(b, sv);
  fb_kernel *kl = kb_end(&q);

  ck_assert_int_eq(flushes(kt), 0);
  ck_assert_int_eq(flushes(km), 0);
  ck_assert_int_eq(flushes(kl), 0);
  int it = add_kernel(&d, kt), im = add_kernel(&d, km);
  reset_targets(&d, 5);
  int32_t zero = 0;
  put(&d, y->cnt, &zero);
  both(&d, kt, it, 0, N, 0, 0);
  both(&d, km, im, 3, N, 0, 0);
  same_field(&d, y->cnt, "ticket");
  same_field(&d, y->s[1], "ticket");
  same_field(&d, y->s[0], "mixed");
  same_field(&d, y->h[0], "mixed");
  /* the tickets were distinct: out is a permutation of 0 .. N-1 */
  int32_t *out = eread(&d, y->out);
  unsigned char *seen = calloc(N, 1);
  ck_assert_ptr_nonnull(seen);
  for (int i = 0; i < N; i++) {
    ck_assert(out[i] >= 0 && out[i] < N && !seen[out[i]]);
    seen[out[i]] = 1;
  }
  free(seen);
  free(out);
  fb_kernel_free(kt);
  fb_kernel_free(km);
  fb_kernel_free(kl);
  duo_close(&d);
}
END_TEST

/* kernel active(k: i32, n: i32, thr: i32) -> bool { return is_active(blocks, k / 4) } */
static fb_kernel *active_kernel(const lay *y) {
  fb_type params[3] = {FB_T_I32, FB_T_I32, FB_T_I32};
  fb_kernel *k = fb_kernel_new(y->l, "active", 3, params, FB_T_BOOL);
  fb_builder b;
  fb_builder_init(&b, k);
  int c = fb_b_binary(&b, FB_OP_DIV, fb_b_arg(&b, 0), fb_b_const_i32(&b, 4));
  fb_b_ret(&b, fb_b_global(&b, FB_OP_IS_ACTIVE, y->spc, &c, 1, -1), 0);
  ck_assert_int_eq(b.err, 0);
  return k;
}

/* Is block cell / 4 of the pointer active, in both? (the same answer) */
static int active(duo *d, const fb_kernel *ka, int ida, int cell) {
  fb_value args[3] = {fb_value_i32(cell), fb_value_i32(0), fb_value_i32(0)}, r1, r2;
  ck_assert_int_eq(fb_launch(d->s, ida, args, 3, &r1), 0);
  ck_assert_int_eq(fb_interp_run(d->in, ka, args, 3, &r2), 0);
  ck_assert_int_eq(r1.v.i != 0, r2.v.i != 0);
  return r1.v.i != 0;
}

/* sp[k] += 1 when i > thr: the pointer block is activated exactly when a
 * contribution happens; atomic_add_na skips an inactive cell (and never
 * activates it); with is_active in the loop nothing is transformed; a
 * sparse struct-for reduces sp into a 0-d field. */
START_TEST(sparse_target) {
  duo d;
  duo_open(&d);
  fill_inputs(&d);
  lay *y = &d.y;
  kb q;
  kb_begin(&q, y, "sparse_add");
  int sv = kb_if(&q, fb_b_binary(&q.b, FB_OP_GT, q.i, q.arg_thr));
  fb_b_global(&q.b, FB_OP_ATOMIC_ADD, y->sp, &q.arg_k, 1, fb_b_const_i32(&q.b, 1));
  fb_b_leave(&q.b, sv);
  fb_kernel *ka = kb_end(&q);

  kb_begin(&q, y, "sparse_add_na");
  int at = fb_b_global(&q.b, FB_OP_ATOMIC_ADD, y->sp, &q.arg_k, 1, fb_b_const_i32(&q.b, 2));
  q.k->stmts[at].op = FB_OP_ATOMIC_ADD_NA;
  fb_kernel *kn = kb_end(&q);

  kb_begin(&q, y, "sparse_observed");
  int four = fb_b_const_i32(&q.b, 4);
  int blk = fb_b_binary(&q.b, FB_OP_REM, q.i, four);
  int on = fb_b_global(&q.b, FB_OP_IS_ACTIVE, y->spc, &blk, 1, -1);
  fb_b_global(&q.b, FB_OP_ATOMIC_MAX, y->sp, &q.arg_k, 1, fb_b_cast(&q.b, FB_T_I32, on));
  fb_kernel *ko = kb_end(&q);

  kb_begin(&q, y, "sparse_sibling"); /* sp[k] += 1; sq[k] = 9 (store_na) */
  fb_b_global(&q.b, FB_OP_ATOMIC_ADD, y->sp, &q.arg_k, 1, fb_b_const_i32(&q.b, 1));
  int st = fb_b_store(&q.b, y->sq, &q.arg_k, 1, fb_b_const_i32(&q.b, 9));
  q.k->stmts[st].op = FB_OP_STORE_NA;
  fb_kernel *kq = kb_end(&q);

  fb_type params[3] = {FB_T_I32, FB_T_I32, FB_T_I32};
  fb_kernel *ks = fb_kernel_new(y->l, "sparse_sum", 3, params, FB_T_VOID);
  fb_builder b;
  fb_builder_init(&b, ks);
  int sf = fb_b_struct_for(&b, y->sp);
  int svs = fb_b_enter(&b, ks->stmts[sf].body);
  int si = fb_b_loop_index(&b, sf, 0);
  fb_b_global(&b, FB_OP_ATOMIC_ADD, y->cnt, NULL, 0, fb_b_load(&b, y->sp, &si, 1));
  fb_b_leave(&b, svs);
  ck_assert_int_eq(b.err, 0);

  ck_assert_int_eq(flushes(ka), 1);
  ck_assert_int_eq(flushes(kn), 1);
  ck_assert_int_eq(flushes(ko), 0);
  ck_assert_int_eq(flushes(kq), 0);
  ck_assert_int_eq(flushes(ks), 1);
  fb_kernel *kact = active_kernel(y);
  int ia = add_kernel(&d, ka), in_ = add_kernel(&d, kn), io = add_kernel(&d, ko);
  int is = add_kernel(&d, ks), iact = add_kernel(&d, kact);
  int32_t zero = 0;
  put(&d, y->cnt, &zero);
  /* no contribution (thr >= n): block 1 stays inactive */
  both(&d, ka, ia, 5, N, N, 0);
  ck_assert(!active(&d, kact, iact, 5));
  /* atomic_add_na on the inactive cell: skipped, still inactive */
  both(&d, kn, in_, 5, N, 0, 0);
  ck_assert(!active(&d, kact, iact, 5));
  /* one contribution (only i = n - 1 > thr) activates it */
  both(&d, ka, ia, 5, N, N - 2, 0);
  ck_assert(active(&d, kact, iact, 5));
  same_field(&d, y->sp, "one contribution");
  both(&d, ka, ia, 6, N, 100, 0);
  both(&d, kn, in_, 7, N, 0, 0); /* active now: applied */
  ck_assert(!active(&d, kact, iact, 13));
  both(&d, ko, io, 12, N, 0, 0);
  ck_assert(active(&d, kact, iact, 12));
  int iq = add_kernel(&d, kq);
  both(&d, kq, iq, 9, 1, 0, 0); /* the store_na sees the cell the atomic activated */
  both(&d, kq, iq, 10, N, 0, 0);
  same_field(&d, y->sq, "store_na beside");
  both(&d, ks, is, 0, 0, 0, 0);
  same_field(&d, y->sp, "sparse");
  same_field(&d, y->cnt, "sparse struct-for");
  ptx_ok(ka);
  ptx_ok(kn);
  ptx_ok(ks);
  fb_kernel_free(ka);
  fb_kernel_free(kn);
  fb_kernel_free(ko);
  fb_kernel_free(kq);
  fb_kernel_free(ks);
  fb_kernel_free(kact);
  duo_close(&d);
}
END_TEST

/* An invariant index out of bounds: FB_EBOUNDS only when a contribution
 * happened, and nothing is written (dense and sparse targets). */
START_TEST(out_of_bounds) {
  duo d;
  duo_open(&d);
  fill_inputs(&d);
  lay *y = &d.y;
  kb q;
  kb_begin(&q, y, "oob");
  int sv = kb_if(&q, fb_b_binary(&q.b, FB_OP_GT, q.i, q.arg_thr));
  fb_b_global(&q.b, FB_OP_ATOMIC_ADD, y->h[0], &q.arg_k, 1, fb_b_const_i32(&q.b, 1));
  fb_b_global(&q.b, FB_OP_ATOMIC_ADD, y->sp, &q.arg_k, 1, fb_b_const_i32(&q.b, 1));
  fb_b_leave(&q.b, sv);
  fb_kernel *k = kb_end(&q);
  ck_assert_int_eq(flushes(k), 2);
  fb_kernel *kact = active_kernel(y);
  int id = add_kernel(&d, k), iact = add_kernel(&d, kact);
  reset_targets(&d, 3);
  int32_t bad[3] = {H * 2, -1, 1 << 30};
  for (int c = 0; c < 3; c++) {
    both(&d, k, id, bad[c], N, N, 0);     /* no contribution: no error */
    both(&d, k, id, bad[c], N, N - 2, FB_EBOUNDS);
    both(&d, k, id, bad[c], N, 0, FB_EBOUNDS);
  }
  same_field(&d, y->h[0], "oob");
  same_field(&d, y->sp, "oob");
  for (int c = 0; c < 16; c += 4) ck_assert(!active(&d, kact, iact, c));
  both(&d, k, id, 3, N, 0, 0); /* and in bounds it works */
  same_field(&d, y->h[0], "in bounds");
  same_field(&d, y->sp, "in bounds");
  ck_assert(active(&d, kact, iact, 3));
  fb_kernel_free(k);
  fb_kernel_free(kact);
  duo_close(&d);
}
END_TEST

/* f32: sums and differences within a tolerance of the interpreter's;
 * min and max exact; NaN contributions leave a number alone and a NaN a
 * NaN, as fmin/fmax do. A dense struct-for reduces too. */
START_TEST(floats) {
  duo d;
  duo_open(&d);
  fill_inputs(&d);
  lay *y = &d.y;
  fb_op fops[4] = {FB_OP_ATOMIC_ADD, FB_OP_ATOMIC_SUB, FB_OP_ATOMIC_MIN, FB_OP_ATOMIC_MAX};
  double mag = 0; /* sum of |fsrc| over the loop: the scale of rounding errors */
  float *fs = fb_interp_field(d.in, y->fsrc);
  for (int i = 0; i < N; i++) mag += fabs((double)fs[i]);
  for (int o = 0; o < 4; o++) {
    char name[48];
    snprintf(name, sizeof name, "f32_%s", fb_op_table[fops[o]].name);
    kb q;
    kb_begin(&q, y, name);
    int x = fb_b_load(&q.b, y->fsrc, &q.i, 1), nan = fb_b_load(&q.b, y->fnan, &q.i, 1);
    fb_b_global(&q.b, fops[o], y->sf, NULL, 0, x);
    fb_b_global(&q.b, fops[o], y->hf, &q.arg_k, 1, nan);
    fb_kernel *k = kb_end(&q);
    ck_assert_int_eq(flushes(k), 2);
    int id = add_kernel(&d, k);
    reset_targets(&d, 0);
    float h[H];
    memcpy(h, fb_interp_field(d.in, y->hf), sizeof h);
    h[4] = NAN;
    put(&d, y->hf, h);
    both(&d, k, id, 1, N, 0, 0); /* 0.25 - 0.5 stays */
    both(&d, k, id, 4, N, 0, 0); /* NaN stays */
    float got, want = *(float *)fb_interp_field(d.in, y->sf);
    ck_assert_int_eq(fb_field_read(d.s, y->sf, &got, sizeof got), 0);
    double tol = o < 2 ? 2 * 1e-6 * mag : 0;
    ck_assert_msg(fabs((double)got - (double)want) <= tol, "%s: %.9g, interpreter %.9g", name,
                  (double)got, (double)want);
    same_field(&d, y->hf, name);
    float *hv = eread(&d, y->hf);
    ck_assert(isnan(hv[4]));
    ck_assert(o < 2 ? isnan(hv[1]) : hv[1] == -0.25f);
    free(hv);
    if (o == 0) ptx_ok(k);
    fb_kernel_free(k);
  }
  /* for i in src { s_i64 += src[i] } */
  fb_type params[3] = {FB_T_I32, FB_T_I32, FB_T_I32};
  fb_kernel *k = fb_kernel_new(y->l, "dense_sum", 3, params, FB_T_VOID);
  fb_builder b;
  fb_builder_init(&b, k);
  int sf = fb_b_struct_for(&b, y->src);
  int sv = fb_b_enter(&b, k->stmts[sf].body);
  int i = fb_b_loop_index(&b, sf, 0);
  fb_b_global(&b, FB_OP_ATOMIC_ADD, y->s[1], NULL, 0, fb_b_load(&b, y->src, &i, 1));
  fb_b_leave(&b, sv);
  ck_assert_int_eq(b.err, 0);
  ck_assert_int_eq(flushes(k), 1);
  int id = add_kernel(&d, k);
  both(&d, k, id, 0, 0, 0, 0);
  same_field(&d, y->s[1], "dense struct-for");
  fb_kernel_free(k);
  duo_close(&d);
}
END_TEST

int main(void) {
  Suite *s = suite_create("reduce");
  TCase *tc = tcase_create("reduce");
  tcase_set_timeout(tc, 300);
  tcase_add_test(tc, int_ops);
  tcase_add_test(tc, index_in_loop);
  tcase_add_test(tc, not_transformed);
  tcase_add_test(tc, sparse_target);
  tcase_add_test(tc, out_of_bounds);
  tcase_add_test(tc, floats);
  suite_add_tcase(s, tc);
  return fbt_run(s);
}
