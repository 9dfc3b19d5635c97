/* Sparse SNodes end to end (docs/sparse.md): .fbk programs over pointer,
 * bitmasked and dynamic SNodes run through the engine (JIT, CPU runtime,
 * list tasks, allocators) and through the reference interpreter, every
 * field compared after every launch; and, independently of the
 * interpreter, what the test computes itself: which cells are active, that
 * a struct-for visits each active cell exactly once, that deactivated cells
 * read 0 after gc and reactivation while their blocks are reused, append
 * from many threads, y[i // 2] += x[i], struct-fors over named SNodes, the
 * task shapes of the lowering, host access, and running out of memory. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fusebox/engine.h"
#include "fusebox/lang.h"
#include "optimizer/optimizer.h"
#include "tests/support/support.h"

/* ---------------------------------------------------------------- the harness
 * A program runs in a session and in an interpreter side by side. */

#define MAXK 32

typedef struct duo {
  fb_engine *e;
  fb_program *p;
  fb_session *s;
  fb_interp *in;
  const char *names[MAXK];
  fb_kernel *irs[MAXK];
  int ids[MAXK], nk;
} duo;

static void duo_open(duo *d, const char *src, int threads, uint64_t limit) {
  memset(d, 0, sizeof *d);
  fb_engine_config cfg = {fbt_backend(), 1, threads};
  char err[512];
  ck_assert_msg(fb_engine_create(&cfg, &d->e, err, sizeof err) == 0, "engine: %s", err);
  fb_diags dg;
  fb_diags_init(&dg);
  int rc = fb_program_parse("sparse_test.fbk", src, &d->p, &dg);
  char *r = fb_diags_render("sparse_test.fbk", src, &dg);
  ck_assert_msg(rc == 0, "parse failed:\n%s", r ? r : "");
  free(r);
  fb_diags_free(&dg);
  /* demoted_writes launches the engine's own store_na directly */
  fb_session_config sc = {
      .mode = "sync", .seed = 7, .memory_limit = limit, .allow_internal_ops = 1};
  rc = fb_session_create(d->e, &sc, fb_program_layout(d->p), &d->s, err, sizeof err);
  ck_assert_msg(rc == 0, "session: %s", err);
  d->in = fb_interp_new(fb_program_layout(d->p), 7);
  ck_assert_ptr_nonnull(d->in);
}

static void duo_close(duo *d) {
  fb_interp_free(d->in);
  fb_session_destroy(d->s);
  fb_program_free(d->p);
  fb_engine_destroy(d->e);
}

/* The kernel's slot in the duo (instantiated and registered once). */
static int slot_of(duo *d, const char *name) {
  for (int i = 0; i < d->nk; i++)
    if (!strcmp(d->names[i], name)) return i;
  ck_assert_int_lt(d->nk, MAXK);
  fb_diags dg;
  fb_diags_init(&dg);
  fb_kernel *k = NULL;
  int rc = fb_program_instantiate(d->p, name, NULL, 0, &k, &dg);
  char *r = fb_diags_render("sparse_test.fbk", fb_program_source(d->p), &dg);
  ck_assert_msg(rc == 0, "instantiate %s: %s\n%s", name, fb_strerror(rc), r ? r : "");
  free(r);
  fb_diags_free(&dg);
  int id = fb_session_add_kernel(d->s, k);
  ck_assert_msg(id >= 0, "add %s: %s (%s)", name, fb_strerror(id), fb_session_errmsg(d->s));
  d->names[d->nk] = name;
  d->irs[d->nk] = k;
  d->ids[d->nk] = id;
  return d->nk++;
}

/* Launch on the engine only; returns its code. */
static int eng(duo *d, const char *name, const fb_value *args, int nargs, fb_value *ret) {
  int k = slot_of(d, name);
  return fb_launch(d->s, d->ids[k], args, nargs, ret);
}

/* Run on the interpreter only; want is its expected code. */
static void ref(duo *d, const char *name, const fb_value *args, int nargs, int want,
                fb_value *ret) {
  int k = slot_of(d, name);
  int rc = fb_interp_run(d->in, d->irs[k], args, nargs, ret);
  ck_assert_msg(rc == want, "interpreter %s: %s, expected %s (%s)", name, fb_strerror(rc),
                fb_strerror(want), fb_interp_errmsg(d->in));
}

/* Both; the same code (0 or FB_EBOUNDS) and return value. */
static fb_value both(duo *d, const char *name, const fb_value *args, int nargs, int want) {
  fb_value a, b;
  memset(&a, 0, sizeof a);
  memset(&b, 0, sizeof b);
  int rc = eng(d, name, args, nargs, &a);
  ck_assert_msg(rc == want, "engine %s: %s, expected %s (%s)", name, fb_strerror(rc),
                fb_strerror(want), fb_session_errmsg(d->s));
  ref(d, name, args, nargs, want, &b);
  ck_assert_msg(a.type == b.type && a.v.u == b.v.u, "%s returned %lld, interpreter %lld", name,
                (long long)a.v.i, (long long)b.v.i);
  return a;
}

static const fb_lang_field *field(duo *d, const char *name) {
  int f = fb_program_find_field(d->p, name);
  ck_assert_msg(f >= 0, "no field %s", name);
  return fb_program_field(d->p, f);
}

static int64_t numel(duo *d, const char *name) {
  return fb_field_numel(fb_program_layout(d->p), field(d, name)->places[0]);
}

/* The engine's copy of an i32 field (malloc'd). */
static int32_t *eread(duo *d, const char *name) {
  const fb_lang_field *f = field(d, name);
  ck_assert_int_eq(f->type, FB_T_I32);
  size_t bytes = (size_t)numel(d, name) * 4;
  int32_t *v = malloc(bytes);
  int rc = fb_field_read(d->s, f->places[0], v, bytes);
  ck_assert_msg(rc == 0, "read %s: %s (%s)", name, fb_strerror(rc), fb_session_errmsg(d->s));
  return v;
}

static const int32_t *iread(duo *d, const char *name) {
  return fb_interp_field(d->in, field(d, name)->places[0]);
}

/* Every field (every component) of the session equals the interpreter's. */
static void same(duo *d, const char *when) {
  const fb_layout *l = fb_program_layout(d->p);
  for (int i = 0; i < fb_program_nfields(d->p); i++) {
    const fb_lang_field *f = fb_program_field(d->p, i);
    size_t es = fb_type_size(f->type);
    for (int c = 0; c < f->ncomp; c++) {
      int64_t n = fb_field_numel(l, f->places[c]);
      uint8_t *got = malloc((size_t)n * es);
      ck_assert_int_eq(fb_field_read(d->s, f->places[c], got, (size_t)n * es), 0);
      const uint8_t *want = fb_interp_field(d->in, f->places[c]);
      for (int64_t j = 0; j < n; j++) {
        fb_value x = fb_value_load(f->type, want + j * (int64_t)es);
        fb_value y = fb_value_load(f->type, got + j * (int64_t)es);
        ck_assert_msg(x.v.u == y.v.u, "after %s: %s[%lld] = %g, interpreter %g", when, f->name,
                      (long long)j, fb_value_as_f64(y), fb_value_as_f64(x));
      }
      free(got);
    }
  }
}

static int32_t scalar(duo *d, const char *name) {
  int32_t *v = eread(d, name), x = v[0];
  free(v);
  return x;
}

static fb_value i32v(int32_t x) { return fb_value_i32(x); }

static void counters(duo *d, fb_counters *c) { fb_session_counters(d->s, c); }

/* ---------------------------------------------------------------- pointer -> dense */

static const char *const pd_src =
    "layout {\n"
    "  pointer(i: 16) as blocks { dense(i: 8) { place x: i32, y: i32 } }\n"
    "  pointer(ij: 8, 8) as tiles { dense(ij: 4, 4) { place g: i32 } }\n"
    "  dense(i: 128) { place act: i32, bact: i32, vis: i32 }\n"
    "  dense(ij: 32, 32) { place gact: i32, gvis: i32 }\n"
    "  place cells: i32, nblocks: i32\n"
    "}\n"
    "kernel paint(step: i32, off: i32) {\n"
    "  for i in 0 .. 128 { if (i + off) % step == 0 { x[i] = i + 1 } }\n"
    "  for i in 0 .. 32 { for j in 0 .. 32 { if (i * 3 + j + off) % step == 0 { g[i, j] = i - j } "
    "} }\n"
    "}\n"
    "kernel activity() {\n"
    "  for i in 0 .. 128 {\n"
    "    act[i] = 0\n"
    "    bact[i] = 0\n"
    "    if is_active(x, i) { act[i] = 1 }\n"
    "    if is_active(blocks, i // 8) { bact[i] = 1 }\n"
    "  }\n"
    "  for i in 0 .. 32 { for j in 0 .. 32 {\n"
    "    gact[i, j] = 0\n"
    "    if is_active(g, i, j) { gact[i, j] += 1 }\n"
    "    if is_active(tiles, i // 4, j // 4) { gact[i, j] += 2 }\n"
    "  } }\n"
    "}\n"
    "kernel visit() {\n"
    "  for i in x { vis[i] += 1\n y[i] = x[i] * 3 + i }\n"
    "  for i, j in g { gvis[i, j] += 1\n g[i, j] += i * 32 + j }\n"
    "}\n"
    "kernel census() -> i32 {\n"
    "  cells[] = 0\n"
    "  nblocks[] = 0\n"
    "  for i in x { cells[] += 1 }\n"
    "  for b in blocks { nblocks[] += 1 }\n"
    "  return cells[] * 1000 + nblocks[]\n"
    "}\n";

/* Blocks of 8 hit by paint(step, off) on x. */
static int pd_block_on(int b, int step, int off) {
  for (int i = 8 * b; i < 8 * b + 8; i++)
    if ((i + off) % step == 0) return 1;
  return 0;
}

START_TEST(pointer_dense) {
  duo d;
  duo_open(&d, pd_src, 2, 0);
  const int step = 20, off = 3;
  fb_value a[2] = {i32v(step), i32v(off)};
  both(&d, "paint", a, 2, 0);
  same(&d, "paint");
  both(&d, "activity", NULL, 0, 0);
  same(&d, "activity");
  /* independently: a write activates its whole dense block */
  int32_t *act = eread(&d, "act"), *bact = eread(&d, "bact"), *x = eread(&d, "x");
  int nb = 0;
  for (int i = 0; i < 128; i++) {
    int on = pd_block_on(i / 8, step, off);
    nb += on && i % 8 == 0;
    ck_assert_int_eq(act[i], on);
    ck_assert_int_eq(bact[i], on);
    ck_assert_int_eq(x[i], (i + off) % step == 0 ? i + 1 : 0);
  }
  ck_assert_int_gt(nb, 2);
  ck_assert_int_lt(nb, 16);
  both(&d, "visit", NULL, 0, 0);
  same(&d, "visit");
  int32_t *vis = eread(&d, "vis");
  for (int i = 0; i < 128; i++) ck_assert_int_eq(vis[i], act[i]); /* each active cell once */
  int32_t *gvis = eread(&d, "gvis"), *gact = eread(&d, "gact");
  for (int c = 0; c < 1024; c++) ck_assert_int_eq(gvis[c], gact[c] == 3);
  fb_value r = both(&d, "census", NULL, 0, 0);
  ck_assert_int_eq(r.v.i, nb * 8 * 1000 + nb);
  /* a second paint activates more; visit sees the new cells too */
  a[1] = i32v(off + 7);
  both(&d, "paint", a, 2, 0);
  both(&d, "visit", NULL, 0, 0);
  both(&d, "activity", NULL, 0, 0);
  same(&d, "second visit");
  free(act);
  free(bact);
  free(x);
  free(vis);
  free(gvis);
  free(gact);
  duo_close(&d);
}
END_TEST

/* ---------------------------------------------------------------- pointer -> bitmasked */

static const char *const pb_src =
    "layout {\n"
    "  pointer(ij: 8, 8) as blocks { bitmasked(ij: 4, 4) as bits { place rho: i32 } }\n"
    "  dense(ij: 32, 32) { place act: i32, vis: i32 }\n"
    "  dense(ij: 8, 8) { place bvis: i32 }\n"
    "  place ncells: i32, nblocks: i32, total: i32\n"
    "}\n"
    "kernel paint() {\n"
    "  for i in 0 .. 32 { for d in 0 .. 3 { let j = i + d\n if j < 32 { rho[i, j] = 1 + d } } }\n"
    "}\n"
    "kernel activity() {\n"
    "  for i in 0 .. 32 { for j in 0 .. 32 {\n"
    "    act[i, j] = 0\n"
    "    if is_active(rho, i, j) { act[i, j] += 1 }\n"
    "    if is_active(bits, i, j) { act[i, j] += 2 }\n"
    "    if is_active(blocks, i // 4, j // 4) { act[i, j] += 4 }\n"
    "  } }\n"
    "}\n"
    "kernel visit() { for i, j in rho { vis[i, j] += 1 } }\n"
    "kernel visit_blocks() { for I, J in blocks { bvis[I, J] += I * 8 + J + 1 } }\n"
    "kernel census() -> i32 {\n"
    "  ncells[] = 0\n"
    "  nblocks[] = 0\n"
    "  total[] = 0\n"
    "  for i, j in rho { ncells[] += 1\n total[] += rho[i, j] }\n"
    "  for I, J in blocks { nblocks[] += 1 }\n"
    "  return ncells[]\n"
    "}\n"
    "kernel prune() { for I, J in blocks { if I != J { deactivate(blocks, I, J) } } }\n"
    "kernel thin() { for i, j in rho { if (i + j) % 2 == 0 { deactivate(rho, i, j) } } }\n"
    "kernel refill() { for i in 0 .. 32 { rho[i, 31 - i] += 10 } }\n";

static int band(int i, int j) { return j >= i && j < i + 3 && j < 32; }

START_TEST(pointer_bitmasked) {
  duo d;
  duo_open(&d, pb_src, 2, 0);
  both(&d, "paint", NULL, 0, 0);
  both(&d, "activity", NULL, 0, 0);
  same(&d, "paint");
  int32_t *act = eread(&d, "act");
  int ncells = 0, blk[8][8] = {{0}};
  for (int i = 0; i < 32; i++)
    for (int j = 0; j < 32; j++)
      if (band(i, j)) ncells++, blk[i / 4][j / 4] = 1;
  int nblocks = 0;
  for (int i = 0; i < 32; i++)
    for (int j = 0; j < 32; j++) {
      int b = blk[i / 4][j / 4];
      nblocks += b && i % 4 == 0 && j % 4 == 0;
      ck_assert_int_eq(act[i * 32 + j], band(i, j) ? 7 : b ? 4 : 0);
    }
  both(&d, "visit", NULL, 0, 0);
  same(&d, "visit");
  int32_t *vis = eread(&d, "vis");
  for (int c = 0; c < 1024; c++) ck_assert_int_eq(vis[c], band(c / 32, c % 32));
  both(&d, "visit_blocks", NULL, 0, 0); /* a struct-for over a named SNode */
  same(&d, "visit_blocks");
  int32_t *bvis = eread(&d, "bvis");
  for (int c = 0; c < 64; c++) ck_assert_int_eq(bvis[c], blk[c / 8][c % 8] ? c + 1 : 0);
  fb_value r = both(&d, "census", NULL, 0, 0);
  ck_assert_int_eq(r.v.i, ncells);
  ck_assert_int_eq(scalar(&d, "nblocks"), nblocks);
  ck_assert_int_eq(scalar(&d, "total"), 32 * 1 + 31 * 2 + 30 * 3);
  /* deactivation at both levels, then writes into the holes */
  both(&d, "thin", NULL, 0, 0);
  both(&d, "activity", NULL, 0, 0);
  same(&d, "thin");
  both(&d, "prune", NULL, 0, 0);
  both(&d, "census", NULL, 0, 0);
  both(&d, "activity", NULL, 0, 0);
  same(&d, "prune");
  ck_assert_int_eq(scalar(&d, "nblocks"), 8);
  both(&d, "refill", NULL, 0, 0);
  both(&d, "census", NULL, 0, 0);
  both(&d, "activity", NULL, 0, 0);
  same(&d, "refill");
  free(act);
  free(vis);
  free(bvis);
  duo_close(&d);
}
END_TEST

/* ---------------------------------------------------------------- pointer -> pointer -> dense */

static const char *const ppd_src =
    "layout {\n"
    "  pointer(i: 8) as outer { pointer(i: 4) as inner { dense(i: 4) { place x: i32 } } }\n"
    "  dense(i: 128) { place act: i32, vis: i32 }\n"
    "}\n"
    "kernel paint(step: i32) { for i in 0 .. 128 { if i % step == 1 { x[i] = i * 2 + 1 } } }\n"
    "kernel activity() {\n"
    "  for i in 0 .. 128 {\n"
    "    act[i] = 0\n"
    "    if is_active(x, i) { act[i] += 1 }\n"
    "    if is_active(inner, i // 4) { act[i] += 2 }\n"
    "    if is_active(outer, i // 16) { act[i] += 4 }\n"
    "  }\n"
    "}\n"
    "kernel visit() { for i in x { vis[i] += 1\n x[i] += 1000 } }\n"
    "kernel drop_outer(k: i32) { for o in outer { if o % k == 0 { deactivate(outer, o) } } }\n"
    "kernel drop_inner() { for b in inner { if b % 3 == 0 { deactivate(inner, b) } } }\n"
    "kernel write_one(i: i32, v: i32) { x[i] = v }\n";

START_TEST(pointer_pointer_dense) {
  duo d;
  duo_open(&d, ppd_src, 2, 0);
  fb_value a[2] = {i32v(13), i32v(0)};
  both(&d, "paint", a, 1, 0);
  both(&d, "activity", NULL, 0, 0);
  both(&d, "visit", NULL, 0, 0);
  same(&d, "visit");
  int32_t *act = eread(&d, "act"), *vis = eread(&d, "vis");
  for (int i = 0; i < 128; i++) {
    int on = 0, ob = 0;
    for (int k = i / 4 * 4; k < i / 4 * 4 + 4; k++) on |= k % 13 == 1;
    for (int k = i / 16 * 16; k < i / 16 * 16 + 16; k++) ob |= k % 13 == 1;
    ck_assert_int_eq(act[i], (on ? 3 : 0) + (ob ? 4 : 0));
    ck_assert_int_eq(vis[i], on);
  }
  both(&d, "drop_inner", NULL, 0, 0);
  both(&d, "activity", NULL, 0, 0);
  same(&d, "drop_inner");
  a[0] = i32v(2);
  both(&d, "drop_outer", a, 1, 0);
  both(&d, "activity", NULL, 0, 0);
  same(&d, "drop_outer");
  /* reactivation: one write re-creates both levels, the rest reads 0 */
  a[0] = i32v(33);
  a[1] = i32v(5);
  both(&d, "write_one", a, 2, 0);
  both(&d, "visit", NULL, 0, 0);
  both(&d, "activity", NULL, 0, 0);
  same(&d, "reactivate");
  int32_t *x = eread(&d, "x");
  ck_assert_int_eq(x[33], 1005);
  for (int i = 32; i < 36; i++)
    if (i != 33) ck_assert_int_eq(x[i], 1000); /* zero before visit added 1000 */
  free(act);
  free(vis);
  free(x);
  duo_close(&d);
}
END_TEST

/* ---------------------------------------------------------------- bitmasked at the root */

static const char *const bm_src =
    "layout {\n"
    "  bitmasked(ij: 32, 32) as bm { place v: i32, w: f32 }\n"
    "  dense(ij: 32, 32) { place act: i32, vis: i32 }\n"
    "  place n: i32\n"
    "}\n"
    "kernel checker() { for i in 0 .. 32 { for j in 0 .. 32 { if (i + j) % 2 == 0 { activate(bm, "
    "i, j) } } } }\n"
    "kernel setv() { for i, j in v { vis[i, j] += 1\n v[i, j] += i * 32 + j + 1\n w[i, j] = 0.5 } "
    "}\n"
    "kernel kill(k: i32) { for i, j in bm { if (i * 32 + j) % k == 0 { deactivate(bm, i, j) } } }\n"
    "kernel revive() { for i in 0 .. 32 { v[i, (i * 7) % 32] += 100 } }\n"
    "kernel activity() -> i32 {\n"
    "  n[] = 0\n"
    "  for i in 0 .. 32 { for j in 0 .. 32 { act[i, j] = 0\n if is_active(w, i, j) { act[i, j] = "
    "1\n n[] += 1 } } }\n"
    "  return n[]\n"
    "}\n";

START_TEST(bitmasked_root) {
  duo d;
  duo_open(&d, bm_src, 2, 0);
  both(&d, "checker", NULL, 0, 0);
  fb_value r = both(&d, "activity", NULL, 0, 0);
  ck_assert_int_eq(r.v.i, 512);
  both(&d, "setv", NULL, 0, 0);
  same(&d, "setv");
  int32_t *v = eread(&d, "v");
  for (int c = 0; c < 1024; c++) ck_assert_int_eq(v[c], (c / 32 + c % 32) % 2 == 0 ? c + 1 : 0);
  fb_value k = i32v(3);
  both(&d, "kill", &k, 1, 0);
  r = both(&d, "activity", NULL, 0, 0);
  int left = 0;
  for (int c = 0; c < 1024; c++) left += (c / 32 + c % 32) % 2 == 0 && c % 3 != 0;
  ck_assert_int_eq(r.v.i, left);
  same(&d, "kill");
  /* atomics on inactive cells activate them; deactivated cells come back 0 */
  both(&d, "revive", NULL, 0, 0);
  both(&d, "setv", NULL, 0, 0);
  both(&d, "activity", NULL, 0, 0);
  same(&d, "revive");
  free(v);
  v = eread(&d, "v");
  /* v[3, 21]: set (118), killed (117 % 3 == 0), revived (100), set again */
  ck_assert_int_eq(v[3 * 32 + 21], 100 + 118);
  free(v);
  duo_close(&d);
}
END_TEST

/* ---------------------------------------------------------------- dynamic under dense */

static const char *const dyn_src =
    "layout {\n"
    "  dense(i: 16) { dynamic(j: 256, chunk: 16) as lists { place d: i32 } }\n"
    "  dense(i: 16) { place len: i32, cnt: i32, sum: i32 }\n"
    "  dense(i: 8192) { place got: i32 }\n"
    "}\n"
    "kernel push(n: i32) { for t in 0 .. n { got[t] = append(d, t % 16, t) } }\n"
    "kernel stats() {\n"
    "  for k in 0 .. 16 { len[k] = length(d, k)\n cnt[k] = 0\n sum[k] = 0 }\n"
    "  for k, n in d { cnt[k] += 1\n sum[k] += d[k, n] }\n"
    "}\n"
    "kernel poke(k: i32, n: i32, v: i32) { d[k, n] = v }\n"
    "kernel clear(k: i32) { deactivate(lists, k, 0) }\n"
    "kernel clear_odd() { for k, n in d { if k % 2 == 1 && n == 3 { deactivate(d, k, n) } } }\n";

static void dyn_stats_same(duo *d, const char *when) {
  both(d, "stats", NULL, 0, 0);
  const char *f[3] = {"len", "cnt", "sum"};
  for (int i = 0; i < 3; i++) {
    int32_t *e = eread(d, f[i]);
    const int32_t *r = iread(d, f[i]);
    for (int k = 0; k < 16; k++)
      ck_assert_msg(e[k] == r[k], "after %s: %s[%d] = %d, interpreter %d", when, f[i], k, e[k],
                    r[k]);
    free(e);
  }
}

START_TEST(dynamic_append) {
  duo d;
  duo_open(&d, dyn_src, 4, 0); /* more threads than cores: appends interleave */
  fb_value n = i32v(4096);     /* 256 per list: exactly full */
  ck_assert_int_eq(eng(&d, "push", &n, 1, NULL), 0);
  ref(&d, "push", &n, 1, 0, NULL);
  int32_t *got = eread(&d, "got"), *dv = eread(&d, "d");
  for (int k = 0; k < 16; k++) { /* slots of list k: a permutation of 0..255 */
    unsigned char seen[256] = {0};
    for (int t = k; t < 4096; t += 16) {
      ck_assert_int_ge(got[t], 0);
      ck_assert_int_lt(got[t], 256);
      ck_assert_int_eq(seen[got[t]], 0);
      seen[got[t]] = 1;
      ck_assert_int_eq(dv[k * 256 + got[t]], t); /* the value sits in its slot */
    }
  }
  dyn_stats_same(&d, "push");
  int32_t *len = eread(&d, "len"), *sum = eread(&d, "sum");
  for (int k = 0; k < 16; k++) {
    ck_assert_int_eq(len[k], 256);
    ck_assert_int_eq(sum[k], 256 * k + 16 * 255 * 256 / 2);
  }
  /* full lists: every append gives -1 and the launch reports FB_EBOUNDS */
  n = i32v(64);
  ck_assert_int_eq(eng(&d, "push", &n, 1, NULL), FB_EBOUNDS);
  ref(&d, "push", &n, 1, FB_EBOUNDS, NULL);
  free(got);
  got = eread(&d, "got");
  for (int t = 0; t < 64; t++) ck_assert_int_eq(got[t], -1);
  dyn_stats_same(&d, "overflow");
  /* emptied lists take appends again from slot 0, reading zeros above */
  fb_value a[3] = {i32v(5), i32v(0), i32v(0)};
  both(&d, "clear", a, 1, 0);
  both(&d, "clear_odd", NULL, 0, 0);
  dyn_stats_same(&d, "clear");
  free(len);
  len = eread(&d, "len");
  for (int k = 0; k < 16; k++) ck_assert_int_eq(len[k], k == 5 || k % 2 ? 0 : 256);
  a[0] = i32v(5), a[1] = i32v(40), a[2] = i32v(7); /* a store at 40: length 41 */
  both(&d, "poke", a, 3, 0);
  dyn_stats_same(&d, "poke");
  free(len);
  len = eread(&d, "len");
  ck_assert_int_eq(len[5], 41);
  free(dv);
  dv = eread(&d, "d");
  for (int j = 0; j < 256; j++) ck_assert_int_eq(dv[5 * 256 + j], j == 40 ? 7 : 0);
  n = i32v(16 * 20);
  ck_assert_int_eq(eng(&d, "push", &n, 1, NULL), FB_EBOUNDS); /* even lists are full */
  ref(&d, "push", &n, 1, FB_EBOUNDS, NULL);
  dyn_stats_same(&d, "push again");
  free(len);
  len = eread(&d, "len");
  ck_assert_int_eq(len[5], 61);
  ck_assert_int_eq(len[7], 20);
  free(got);
  free(dv);
  free(len);
  free(sum);
  duo_close(&d);
}
END_TEST

/* ---------------------------------------------------------------- deactivate, gc, reuse */

static const char *const gc_src =
    "layout {\n"
    "  pointer(i: 32) as blocks { dense(i: 64) { place x: i32 } }\n"
    "  place n: i32\n"
    "}\n"
    "kernel fill() { for i in 0 .. 2048 { x[i] = i + 1 } }\n"
    "kernel drop(k: i32) { for b in blocks { if b % k == 0 { deactivate(blocks, b) } } }\n"
    "kernel touch() { for b in 0 .. 32 { x[b * 64 + 5] += 1 } }\n"
    "kernel count() -> i32 { n[] = 0\n for i in x { n[] += 1 }\n return n[] }\n";

START_TEST(deactivate_gc_reactivate) {
  duo d;
  duo_open(&d, gc_src, 2, 0);
  both(&d, "fill", NULL, 0, 0);
  ck_assert_int_eq(both(&d, "count", NULL, 0, 0).v.i, 2048); /* sizes the list too */
  fb_counters c0, c1, c2;
  counters(&d, &c0);
  /* the kernel that deactivates ends with its gc task */
  const fb_kernel *const *tasks;
  int nt;
  ck_assert_int_eq(fb_session_kernel_tasks(d.s, d.ids[slot_of(&d, "drop")], &tasks, &nt), 0);
  ck_assert_int_eq(nt, 4);
  char *txt = fb_kernel_print(tasks[3]);
  ck_assert_msg(strstr(txt, "gc blocks") != NULL, "%s", txt);
  free(txt);
  fb_value k = i32v(1);
  both(&d, "drop", &k, 1, 0); /* every block */
  same(&d, "drop");
  ck_assert_int_eq(both(&d, "count", NULL, 0, 0).v.i, 0);
  both(&d, "touch", NULL, 0, 0); /* reactivates all: blocks come back zeroed */
  same(&d, "touch");
  int32_t *x = eread(&d, "x");
  for (int i = 0; i < 2048; i++) ck_assert_int_eq(x[i], i % 64 == 5);
  free(x);
  counters(&d, &c1);
  ck_assert_msg(c1.device_bytes == c0.device_bytes,
                "blocks were not reused: %llu bytes, "
                "%llu before",
                (unsigned long long)c1.device_bytes, (unsigned long long)c0.device_bytes);
  for (int round = 0; round < 5; round++) { /* no growth round after round */
    k = i32v(round + 2);
    both(&d, "drop", &k, 1, 0);
    both(&d, "touch", NULL, 0, 0);
  }
  same(&d, "rounds");
  ck_assert_int_eq(both(&d, "count", NULL, 0, 0).v.i, 2048);
  counters(&d, &c2);
  ck_assert_uint_eq(c2.device_bytes, c1.device_bytes);
  duo_close(&d);
}
END_TEST

/* ---------------------------------------------------------------- downsample */

static const char *const down_src =
    "layout {\n"
    "  pointer(i: 32) as xb { dense(i: 16) { place x: i32 } }\n"
    "  pointer(i: 16) as yb { dense(i: 16) { place y: i32 } }\n"
    "}\n"
    "kernel seed(step: i32) { for i in 0 .. 512 { if i % step == 0 { x[i] = i + 1 } } }\n"
    "kernel down() { for i in x { y[i // 2] += x[i] } }\n";

START_TEST(downsample) {
  duo d;
  duo_open(&d, down_src, 2, 0);
  fb_value s = i32v(37);
  both(&d, "seed", &s, 1, 0);
  both(&d, "down", NULL, 0, 0);
  same(&d, "down");
  int32_t *y = eread(&d, "y");
  for (int j = 0; j < 256; j++) {
    int want = 0;
    for (int i = 2 * j; i < 2 * j + 2; i++) want += i % 37 == 0 ? i + 1 : 0;
    ck_assert_int_eq(y[j], want);
  }
  both(&d, "down", NULL, 0, 0);
  same(&d, "down twice");
  free(y);
  duo_close(&d);
}
END_TEST

/* ---------------------------------------------------------------- task shapes */

/* The tasks of a kernel: their number and kinds in fusebox ir's words. */
static void shape(duo *d, const char *kernel, const char *const *want, int n) {
  const fb_kernel *const *tasks;
  int nt;
  ck_assert_int_eq(fb_session_kernel_tasks(d->s, d->ids[slot_of(d, kernel)], &tasks, &nt), 0);
  ck_assert_msg(nt == n, "%s: %d tasks, expected %d", kernel, nt, n);
  for (int t = 0; t < n; t++) {
    char *txt = fb_kernel_print(tasks[t]);
    ck_assert_msg(strstr(txt, want[t]) != NULL, "%s task %d:\n%s\nexpected %s", kernel, t, txt,
                  want[t]);
    free(txt);
  }
}

START_TEST(task_counts) {
  duo d;
  duo_open(&d, pb_src, 2, 0);
  /* pointer -> bitmasked: clear list + list generation per level, then the loop */
  const char *const two[] = {"clear_list blocks", "listgen blocks", "clear_list bits",
                             "listgen bits", "struct_for"};
  shape(&d, "visit", two, 5);
  const char *const one[] = {"clear_list blocks", "listgen blocks", "struct_for"};
  shape(&d, "visit_blocks", one, 3);
  fb_counters c0, c1;
  both(&d, "paint", NULL, 0, 0);
  counters(&d, &c0);
  both(&d, "visit", NULL, 0, 0);
  counters(&d, &c1);
  ck_assert_uint_eq(c1.tasks_launched - c0.tasks_launched, 5);
  ck_assert_uint_eq(c1.launches - c0.launches, 1);
  duo_close(&d);
  duo_open(&d, ppd_src, 2, 0);
  const char *const pp[] = {"clear_list outer", "listgen outer", "clear_list inner",
                            "listgen inner", "struct_for"};
  shape(&d, "visit", pp, 5);
  const char *const dropi[] = {"clear_list outer", "listgen outer", "clear_list inner",
                               "listgen inner",    "struct_for",    "gc inner"};
  shape(&d, "drop_inner", dropi, 6);
  const char *const dropo[] = {"clear_list outer", "listgen outer", "struct_for", "gc outer",
                               "gc inner"};
  shape(&d, "drop_outer", dropo, 5); /* blocks inside freed blocks are returned too */
  duo_close(&d);
  duo_open(&d, bm_src, 2, 0);
  const char *const bmt[] = {"clear_list bm", "listgen bm", "struct_for"};
  shape(&d, "setv", bmt, 3);
  shape(&d, "kill", bmt, 3); /* bitmasked cells hold no blocks: no gc */
  duo_close(&d);
}
END_TEST

/* ---------------------------------------------------------------- host access */

START_TEST(host_access) {
  duo d;
  duo_open(&d, pb_src, 2, 0);
  const fb_layout *l = fb_program_layout(d.p);
  int rho = field(&d, "rho")->places[0];
  fb_value v;
  int64_t ix[2] = {9, 13};
  ck_assert_int_eq(fb_cell_read(d.s, rho, ix, 2, &v), 0); /* inactive: 0 */
  ck_assert_int_eq(v.type, FB_T_I32);
  ck_assert_int_eq(v.v.i, 0);
  ck_assert_int_eq(fb_cell_write(d.s, rho, ix, 2, fb_value_i32(42)), 0); /* activates */
  ck_assert_int_eq(fb_cell_read(d.s, rho, ix, 2, &v), 0);
  ck_assert_int_eq(v.v.i, 42);
  int64_t bad[2] = {32, 0};
  ck_assert_int_eq(fb_cell_write(d.s, rho, bad, 2, fb_value_i32(1)), FB_EBOUNDS);
  ck_assert_int_eq(fb_cell_write(d.s, rho, ix, 2, fb_value_f32(1.0f)), FB_ETYPE);
  ck_assert_int_eq(eng(&d, "census", NULL, 0, &v), 0);
  ck_assert_int_eq(v.v.i, 1);
  ck_assert_int_eq(scalar(&d, "nblocks"), 1);
  ck_assert_int_eq(eng(&d, "activity", NULL, 0, NULL), 0);
  int32_t *act = eread(&d, "act");
  for (int i = 0; i < 32; i++)
    for (int j = 0; j < 32; j++)
      ck_assert_int_eq(act[i * 32 + j], i == 9 && j == 13 ? 7 : i / 4 == 2 && j / 4 == 3 ? 4 : 0);
  /* fb_field_active agrees with is_active(rho, i, j) and activates nothing;
   * a dense field is all active; a wrong size or a container is refused */
  uint8_t mask[1024];
  memset(mask, 9, sizeof mask);
  ck_assert_int_eq(fb_field_active(d.s, rho, mask, sizeof mask), 0);
  for (int c = 0; c < 1024; c++) ck_assert_int_eq(mask[c], act[c] & 1);
  ck_assert_int_eq(eng(&d, "census", NULL, 0, &v), 0);
  ck_assert_int_eq(v.v.i, 1);
  int dense = field(&d, "act")->places[0];
  memset(mask, 0, sizeof mask);
  ck_assert_int_eq(fb_field_active(d.s, dense, mask, sizeof mask), 0);
  for (int c = 0; c < 1024; c++) ck_assert_int_eq(mask[c], 1);
  ck_assert_int_eq(fb_field_active(d.s, rho, mask, 1023), FB_EINVAL);
  ck_assert_ptr_nonnull(strstr(fb_session_errmsg(d.s), "holds 1024 elements"));
  ck_assert_int_eq(fb_field_active(d.s, rho, NULL, 1024), FB_EINVAL);
  ck_assert_int_eq(fb_field_active(d.s, 0, mask, 1), FB_EINVAL); /* the root */
  ck_assert_int_eq(fb_field_active(d.s, 9999, mask, 1), FB_ENOENT);
  free(act);
  /* a whole-field write activates every cell; a read returns it */
  int32_t *all = malloc(1024 * 4), *back = malloc(1024 * 4);
  for (int c = 0; c < 1024; c++) all[c] = c * 3 - 7;
  ck_assert_int_eq(fb_field_write(d.s, rho, all, 1024 * 4), 0);
  ck_assert_int_eq(fb_field_read(d.s, rho, back, 1024 * 4), 0);
  ck_assert_mem_eq(all, back, 1024 * 4);
  ck_assert_int_eq(eng(&d, "census", NULL, 0, &v), 0);
  ck_assert_int_eq(v.v.i, 1024);
  ck_assert_int_eq(scalar(&d, "nblocks"), 64);
  (void)l;
  free(all);
  free(back);
  duo_close(&d);
}
END_TEST

/* ---------------------------------------------------------------- whole-field transfers in runs */

/* Whole-field reads and writes copy a row's last dimension in runs (one
 * walk of the sparse runtime per run of the innermost dense container,
 * engine/hostio.c); each element must agree with a cell access, which
 * walks per cell. Three places share a cell (a run's elements are a cell
 * apart; one place is 8 bytes among 4-byte ones), the runs are 5 long in rows of 20, the bitmasked tree copies
 * element by element, and a field with some blocks active reads 0 in the
 * others. */
static const char *const runs_src =
    "layout {\n"
    "  pointer(ijk: 2, 3, 2) { pointer(ijk: 2, 2, 2) {\n"
    "    dense(ijk: 3, 2, 5) { place a: f32, w: i32, c: f64 } } }\n"
    "  pointer(ij: 3, 2) { bitmasked(ij: 4, 4) { place m: f32, n: i32 } }\n"
    "}\n"
    "kernel touch() { for i in 0 .. 12 { for j in 0 .. 12 { for k in 0 .. 20 {\n"
    "  if (i + 2 * j + k) % 29 == 0 { w[i, j, k] = i * 400 + j * 20 + k + 1 } } } } }\n"
    "kernel thin_m() { for i, j in m { if (i + j) % 3 == 0 { deactivate(m, i, j) } } }\n";

/* Every element of place f (shape n0 x n1 [x n2]) read whole equals its cell. */
static void cells_agree(duo *d, int f, const int64_t *shape, int nd, const void *whole) {
  fb_type t = fb_program_layout(d->p)->nodes[f].type;
  size_t es = fb_type_size(t);
  int64_t n = shape[0] * shape[1] * (nd > 2 ? shape[2] : 1);
  for (int64_t e = 0; e < n; e++) {
    int64_t idx[3] = {nd > 2 ? e / (shape[1] * shape[2]) : e / shape[1],
                      nd > 2 ? e / shape[2] % shape[1] : e % shape[1], e % (nd > 2 ? shape[2] : 1)};
    fb_value c;
    ck_assert_int_eq(fb_cell_read(d->s, f, idx, nd, &c), 0);
    fb_value w = fb_value_load(t, (const unsigned char *)whole + (size_t)e * es);
    ck_assert_msg(c.v.u == w.v.u, "element %lld: whole-field read %llx, cell %llx", (long long)e,
                  (unsigned long long)w.v.u, (unsigned long long)c.v.u);
  }
}

START_TEST(host_transfer_runs) {
  duo d;
  duo_open(&d, runs_src, 2, 0);
  int a = field(&d, "a")->places[0], w = field(&d, "w")->places[0];
  int c = field(&d, "c")->places[0], m = field(&d, "m")->places[0];
  int nf = field(&d, "n")->places[0];
  const int64_t sh3[3] = {12, 12, 20}, sh2[2] = {12, 8};
  enum { N = 12 * 12 * 20 };
  /* some blocks active: the rest read 0, the written cells their values */
  ck_assert_int_eq(eng(&d, "touch", NULL, 0, NULL), 0);
  int32_t *wv = malloc(N * 4);
  memset(wv, 0x55, N * 4);
  ck_assert_int_eq(fb_field_read(d.s, w, wv, N * 4), 0);
  int written = 0, zeros = 0;
  for (int e = 0; e < N; e++) {
    int i = e / 240, j = e / 20 % 12, k = e % 20;
    if ((i + 2 * j + k) % 29 == 0) {
      ck_assert_int_eq(wv[e], i * 400 + j * 20 + k + 1);
      written++;
    } else {
      ck_assert_int_eq(wv[e], 0);
      zeros++;
    }
  }
  ck_assert_int_gt(written, 0);
  ck_assert_int_gt(zeros, 0);
  cells_agree(&d, w, sh3, 3, wv);
  /* activity in the same runs: a cell is active iff its 3x2x5 block is,
   * the block of a written cell is, and some blocks are not */
  uint8_t *act = malloc(N);
  memset(act, 9, N);
  ck_assert_int_eq(fb_field_active(d.s, w, act, N), 0);
  int inactive = 0;
  for (int e = 0; e < N; e++) {
    int i = e / 240, j = e / 20 % 12, k = e % 20, blk = 0;
    for (int e2 = 0; e2 < N; e2++)
      if (e2 / 240 / 3 == i / 3 && e2 / 20 % 12 / 2 == j / 2 && e2 % 20 / 5 == k / 5 && wv[e2])
        blk = 1;
    ck_assert_int_eq(act[e], blk);
    inactive += !blk;
  }
  ck_assert_int_gt(inactive, 0);
  free(act);
  /* a whole-field write activates every block and reads back */
  float *av = malloc(N * 4), *back = malloc(N * 4);
  for (int e = 0; e < N; e++) av[e] = (float)e * 0.25f - 100.0f;
  ck_assert_int_eq(fb_field_write(d.s, a, av, N * 4), 0);
  memset(back, 0x55, N * 4);
  ck_assert_int_eq(fb_field_read(d.s, a, back, N * 4), 0);
  ck_assert_mem_eq(av, back, N * 4);
  cells_agree(&d, a, sh3, 3, back);
  /* w kept its cells, the newly active blocks read 0 */
  ck_assert_int_eq(fb_field_read(d.s, w, (int32_t *)back, N * 4), 0);
  ck_assert_mem_eq(wv, back, N * 4);
  /* an f64 place (8 bytes among 4-byte ones) */
  double *cv = malloc(N * 8), *cr = malloc(N * 8);
  for (int e = 0; e < N; e++) cv[e] = 1.0 / (e + 1);
  ck_assert_int_eq(fb_field_write(d.s, c, cv, N * 8), 0);
  ck_assert_int_eq(fb_field_read(d.s, c, cr, N * 8), 0);
  ck_assert_mem_eq(cv, cr, N * 8);
  cells_agree(&d, c, sh3, 3, cr);
  free(cv);
  free(cr);
  /* bitmasked leaf, in runs of its 4 cells a row: one walk to the
   * container, then the cells' bits; inactive cells (in an allocated block
   * or not) read 0 and are inactive, a sibling place shares the bits */
  float mv[96], mb[96];
  int64_t one[2] = {5, 6};
  ck_assert_int_eq(fb_cell_write(d.s, m, one, 2, fb_value_f32(2.5f)), 0);
  ck_assert_int_eq(fb_field_read(d.s, m, mb, sizeof mb), 0);
  for (int e = 0; e < 96; e++) ck_assert(mb[e] == (e == 5 * 8 + 6 ? 2.5f : 0.0f));
  cells_agree(&d, m, sh2, 2, mb);
  uint8_t mact[96];
  memset(mact, 9, sizeof mact);
  ck_assert_int_eq(fb_field_active(d.s, m, mact, sizeof mact), 0);
  for (int e = 0; e < 96; e++) ck_assert_int_eq(mact[e], e == 5 * 8 + 6);
  int32_t nv[96], nb[96];
  memset(nb, 0x55, sizeof nb);
  ck_assert_int_eq(fb_field_read(d.s, nf, nb, sizeof nb), 0);
  for (int e = 0; e < 96; e++) ck_assert_int_eq(nb[e], 0);
  for (int e = 0; e < 96; e++) nv[e] = -3 * e - 1; /* 8-byte cells: a strided run */
  ck_assert_int_eq(fb_field_write(d.s, nf, nv, sizeof nv), 0);
  ck_assert_int_eq(fb_field_read(d.s, nf, nb, sizeof nb), 0);
  ck_assert_mem_eq(nv, nb, sizeof nv);
  cells_agree(&d, nf, sh2, 2, nb);
  ck_assert_int_eq(fb_field_active(d.s, m, mact, sizeof mact), 0);
  for (int e = 0; e < 96; e++) ck_assert_int_eq(mact[e], 1);
  ck_assert_int_eq(fb_field_read(d.s, m, mb, sizeof mb), 0); /* m's cells kept */
  for (int e = 0; e < 96; e++) ck_assert(mb[e] == (e == 5 * 8 + 6 ? 2.5f : 0.0f));
  for (int e = 0; e < 96; e++) mv[e] = (float)(e + 1);
  ck_assert_int_eq(fb_field_write(d.s, m, mv, sizeof mv), 0);
  ck_assert_int_eq(fb_field_read(d.s, m, mb, sizeof mb), 0);
  ck_assert_mem_eq(mv, mb, sizeof mv);
  cells_agree(&d, m, sh2, 2, mb);
  /* cells deactivated in allocated blocks read 0 and inactive, and the
   * rest of their rows keep their values */
  ck_assert_int_eq(eng(&d, "thin_m", NULL, 0, NULL), 0);
  ck_assert_int_eq(fb_field_read(d.s, m, mb, sizeof mb), 0);
  ck_assert_int_eq(fb_field_active(d.s, m, mact, sizeof mact), 0);
  for (int e = 0; e < 96; e++) {
    int gone = (e / 8 + e % 8) % 3 == 0;
    ck_assert(mb[e] == (gone ? 0.0f : mv[e]));
    ck_assert_int_eq(mact[e], !gone);
  }
  cells_agree(&d, m, sh2, 2, mb);
  free(wv);
  free(av);
  free(back);
  duo_close(&d);
}
END_TEST

/* ---------------------------------------------------------------- out of memory */

static const char *const oom_src =
    "layout {\n"
    "  pointer(i: 64) as blocks { dense(i: 256) { place x: f32 } }\n"
    "  place n: i32\n"
    "}\n"
    "kernel fill(nb: i32) { for b in 0 .. nb { x[b * 256 + 1] = 1.0 } }\n"
    "kernel drop() { for b in blocks { deactivate(blocks, b) } }\n"
    "kernel count() -> i32 { n[] = 0\n for b in blocks { n[] += 1 }\n return n[] }\n";

START_TEST(out_of_memory) {
  fb_program *p = NULL;
  ck_assert_int_eq(fb_program_parse("oom.fbk", oom_src, &p, NULL), 0);
  const fb_layout *l = fb_program_layout(p);
  /* the root, room for the list of blocks (64 elements of 24 bytes), a few
   * scratch bytes and 10 blocks of 1 KiB (each with an 8-byte header) */
  uint64_t limit = l->root_bytes + 64 * 24 + 64 + 10 * (1024 + 8) + 100;
  fb_program_free(p);
  duo d;
  duo_open(&d, oom_src, 2, limit);
  fb_value got, nb = i32v(16);
  ck_assert_int_eq(eng(&d, "count", NULL, 0, &got), 0); /* sizes the list of blocks */
  ck_assert_int_eq(got.v.i, 0);
  int rc = eng(&d, "fill", &nb, 1, NULL);
  ck_assert_int_eq(rc, FB_EQUOTA);
  const char *msg = fb_session_errmsg(d.s);
  ck_assert_msg(strstr(msg, "kernel 'fill'") && strstr(msg, "SNode 'blocks'") &&
                    strstr(msg, "pointer") && strstr(msg, "1024 bytes") && strstr(msg, "limit"),
                "message: %s", msg);
  fb_counters c;
  counters(&d, &c);
  ck_assert_uint_le(c.device_bytes, limit);
  /* the session stays usable: what fitted is there, the rest was skipped */
  ck_assert_int_eq(eng(&d, "count", NULL, 0, &got), 0);
  ck_assert_int_eq(got.v.i, 10);
  float *x = malloc(64 * 256 * 4);
  ck_assert_int_eq(fb_field_read(d.s, field(&d, "x")->places[0], x, 64 * 256 * 4), 0);
  int ones = 0;
  for (int i = 0; i < 64 * 256; i++) ones += x[i] == 1.0f;
  ck_assert_int_eq(ones, 10);
  /* a host write that needs a block is refused the same way */
  int64_t ix = 20 * 256;
  ck_assert_int_eq(fb_cell_write(d.s, field(&d, "x")->places[0], &ix, 1, fb_value_f32(2.0f)),
                   FB_EQUOTA);
  ck_assert_ptr_nonnull(strstr(fb_session_errmsg(d.s), "'blocks'"));
  /* free everything and retry within the limit */
  ck_assert_int_eq(eng(&d, "drop", NULL, 0, NULL), 0);
  ck_assert_int_eq(eng(&d, "count", NULL, 0, &got), 0);
  ck_assert_int_eq(got.v.i, 0);
  nb = i32v(8);
  ck_assert_int_eq(eng(&d, "fill", &nb, 1, NULL), 0);
  ref(&d, "fill", &nb, 1, 0, NULL);
  ck_assert_int_eq(eng(&d, "count", NULL, 0, &got), 0);
  ck_assert_int_eq(got.v.i, 8);
  ref(&d, "count", NULL, 0, 0, NULL);
  same(&d, "retry");
  free(x);
  duo_close(&d);
}
END_TEST

/* ---------------------------------------------------------------- rand, demoted writes */

static const char *const rnd_src =
    "layout {\n"
    "  pointer(ij: 8, 8) as blocks { bitmasked(ij: 4, 4) as bits { place rho: f32, w: f32 } }\n"
    "  pointer(i: 8) as pb { dense(i: 8) { place q: f32 } }\n"
    "}\n"
    "kernel paint() { for i in 0 .. 32 { rho[i, (i * 5) % 32] = f32(i)\n q[i * 2] = 1.0 } }\n"
    "kernel noise() {\n"
    "  for i, j in rho { w[i, j] = random() + rho[i, j] * random() }\n"
    "  for i in q { q[i] += random() }\n"
    "}\n";

/* rand() in a struct-for over lists numbers iterations by the cell's
 * row-major index, as the interpreter does: bit-identical results. */
START_TEST(rand_in_sparse_loops) {
  duo d;
  duo_open(&d, rnd_src, 2, 0);
  both(&d, "paint", NULL, 0, 0);
  both(&d, "noise", NULL, 0, 0);
  both(&d, "noise", NULL, 0, 0);
  same(&d, "noise");
  duo_close(&d);
}
END_TEST

/* store_na / atomic_add_na (the optimizer's activation demotion): written
 * when the cell is active, skipped (never activating) when it is not. */
START_TEST(demoted_writes) {
  duo d;
  duo_open(&d, ppd_src, 2, 0);
  fb_value a = i32v(13);
  both(&d, "paint", &a, 1, 0);
  const fb_layout *l = fb_program_layout(d.p);
  int x = field(&d, "x")->places[0];
  fb_kernel *k = fb_kernel_new(l, "demoted", 0, NULL, FB_T_VOID);
  fb_builder bb, *b = &bb;
  fb_builder_init(b, k);
  int lo = fb_b_const_i32(b, 0), hi = fb_b_const_i32(b, 128);
  int lp = fb_b_range_for(b, lo, hi, 1);
  int sv = fb_b_enter(b, k->stmts[lp].body);
  int i = fb_b_loop_index(b, lp, 0);
  int st = fb_b_global(b, FB_OP_STORE, x, &i, 1, fb_b_binary(b, FB_OP_MUL, i, i));
  k->stmts[st].op = FB_OP_STORE_NA;
  int at = fb_b_global(b, FB_OP_ATOMIC_ADD, x, &i, 1, fb_b_const_i32(b, 7));
  k->stmts[at].op = FB_OP_ATOMIC_ADD_NA;
  fb_b_leave(b, sv);
  int id = fb_session_add_kernel(d.s, k);
  ck_assert_msg(id >= 0, "%s", fb_session_errmsg(d.s));
  ck_assert_int_eq(fb_launch(d.s, id, NULL, 0, NULL), 0);
  ck_assert_int_eq(fb_interp_run(d.in, k, NULL, 0, NULL), 0);
  both(&d, "activity", NULL, 0, 0);
  same(&d, "demoted writes");
  int32_t *xv = eread(&d, "x"), *act = eread(&d, "act");
  for (int j = 0; j < 128; j++) ck_assert_int_eq(xv[j], act[j] & 1 ? j * j + 7 : 0);
  free(xv);
  free(act);
  fb_kernel_free(k);
  duo_close(&d);
}
END_TEST

/* ---------------------------------------------------------------- neighbour reads
 * Loads through sparse paths at neighbouring cells, as a trilinear sample
 * does: the components of a vector field read in one walk, and (CPU) an
 * inactive level read through the zero block instead of a branch
 * (codegen/emit_mem.c). Neighbours in the same block, in another block, in
 * inactive blocks (0), under pointer, pointer -> pointer, bitmasked and
 * dynamic containers. */

static const char *const nb_src =
    "layout {\n"
    "  pointer(i: 8) { dense(i: 4) { place pv: f32[3], pw: i32 } }\n"
    "  pointer(i: 2) { pointer(i: 4) { dense(i: 4) { place qv: f32[3] } } }\n"
    "  bitmasked(i: 32) { place bv: f32[2] }\n"
    "  dense(i: 4) { dynamic(j: 8, chunk: 2) { place dv: i32 } }\n"
    "  dense(i: 32) { place out: f32[3], cnt: i32, dout: i32 }\n"
    "}\n"
    "kernel fill(m: i32) {\n"
    "  for i in 0 .. 32 {\n"
    "    if (i // 4) % m == 1 { pv[i] = [f32(i), f32(i) + 0.25, -f32(i)]\n pw[i] = i + 1 }\n"
    "    if (i // 4) % 3 != 2 && (m == 3 || i < 16) { qv[i] = [f32(i) * 2.0, 1.0, f32(i % 5)] }\n"
    "    if i % 3 == 0 { bv[i] = [f32(i) + 0.5, 3.0] }\n"
    "  }\n"
    "  if m == 2 { for i in 0 .. 4 { for j in 0 .. i + 2 { append(dv, i, i * 10 + j + 1) } } }\n"
    "}\n"
    "func at(i: i32) -> i32 { return clamp(i, 0, 31) }\n"
    "kernel look(d: i32) {\n"
    "  for i in 0 .. 32 {\n"
    "    let a = pv[at(i + d)] + pv[at(i - d)] + qv[at(i + d)] * 2.0\n"
    "    let b = bv[at(i + d)]\n"
    "    out[i] = a + [b[0], b[1], qv[at(i * 7 + d)][2]]\n"
    "    cnt[i] = pw[at(i + d)] + pw[at(i - 1)]\n"
    "    dout[i] = dv[i % 4, (i + d) % 8]\n"
    "  }\n"
    "}\n"
    "kernel look_loop() {\n"
    "  for i in pv { out[i] += pv[at(i + 1)] - pv[at(i + 4)] + qv[at(i - 4)] }\n"
    "}\n";

START_TEST(neighbour_reads) {
  duo d;
  duo_open(&d, nb_src, 2, 0);
  for (int m = 2; m <= 3; m++) {
    fb_value a = i32v(m);
    both(&d, "fill", &a, 1, 0);
    same(&d, "fill");
    for (int dd = 0; dd <= 5; dd++) {
      a = i32v(dd);
      both(&d, "look", &a, 1, 0);
      same(&d, "look");
      /* independently: a pointer block not written reads 0 */
      int32_t *cnt = eread(&d, "cnt");
      for (int i = 0; i < 32; i++) {
        int u = i + dd > 31 ? 31 : i + dd, w = i - 1 < 0 ? 0 : i - 1;
        int want = ((u / 4) % m == 1 ? u + 1 : 0) + ((w / 4) % m == 1 ? w + 1 : 0);
        if (m == 3) /* m = 2's blocks stay active (and written) */
          want = ((u / 4) % 2 == 1 || (u / 4) % 3 == 1 ? u + 1 : 0) +
                 ((w / 4) % 2 == 1 || (w / 4) % 3 == 1 ? w + 1 : 0);
        ck_assert_msg(cnt[i] == want, "m %d d %d: cnt[%d] = %d, want %d", m, dd, i, cnt[i], want);
      }
      free(cnt);
    }
    both(&d, "look_loop", NULL, 0, 0);
    same(&d, "look_loop");
  }
  duo_close(&d);
}
END_TEST

/* store_na into the three components of a vector cell under a pointer,
 * one after the other (codegen emits them as one walk, emit_mem.c
 * fb_emit_try_stores): active cells take the values, inactive ones stay
 * inactive and read 0; the same as the interpreter. */
START_TEST(demoted_vector_writes) {
  duo d;
  duo_open(&d, nb_src, 2, 0);
  fb_value a = i32v(2);
  both(&d, "fill", &a, 1, 0); /* pv's blocks 1, 3, 5, 7 active */
  const fb_layout *l = fb_program_layout(d.p);
  const fb_lang_field *pv = field(&d, "pv");
  ck_assert_int_eq(pv->ncomp, 3);
  fb_kernel *k = fb_kernel_new(l, "demoted3", 0, NULL, FB_T_VOID);
  fb_builder bb, *b = &bb;
  fb_builder_init(b, k);
  int lp = fb_b_range_for(b, fb_b_const_i32(b, 0), fb_b_const_i32(b, 32), 1);
  int sv = fb_b_enter(b, k->stmts[lp].body);
  int i = fb_b_loop_index(b, lp, 0);
  int x = fb_b_cast(b, FB_T_F32, i);
  int val[3] = {fb_b_binary(b, FB_OP_MUL, x, fb_b_const_f32(b, 3.0f)),
                fb_b_binary(b, FB_OP_ADD, x, fb_b_const_f32(b, 0.5f)), fb_b_const_f32(b, -2.0f)};
  for (int c = 0; c < 3; c++) {
    int st = fb_b_global(b, FB_OP_STORE, pv->places[c], &i, 1, val[c]);
    k->stmts[st].op = FB_OP_STORE_NA;
  }
  fb_b_leave(b, sv);
  int id = fb_session_add_kernel(d.s, k);
  ck_assert_msg(id >= 0, "%s", fb_session_errmsg(d.s));
  ck_assert_int_eq(fb_launch(d.s, id, NULL, 0, NULL), 0);
  ck_assert_int_eq(fb_interp_run(d.in, k, NULL, 0, NULL), 0);
  same(&d, "demoted vector writes");
  float got[32];
  ck_assert_int_eq(fb_field_read(d.s, pv->places[1], got, sizeof got), 0);
  for (int j = 0; j < 32; j++)
    ck_assert_msg(got[j] == ((j / 4) % 2 == 1 ? (float)j + 0.5f : 0.0f), "pv.1[%d] = %g", j,
                  (double)got[j]);
  fb_kernel_free(k);
  duo_close(&d);
}
END_TEST

int main(void) {
  Suite *s = suite_create("sparse");
  TCase *tc = tcase_create("engine");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, pointer_dense);
  tcase_add_test(tc, pointer_bitmasked);
  tcase_add_test(tc, pointer_pointer_dense);
  tcase_add_test(tc, bitmasked_root);
  tcase_add_test(tc, dynamic_append);
  tcase_add_test(tc, deactivate_gc_reactivate);
  tcase_add_test(tc, downsample);
  tcase_add_test(tc, task_counts);
  tcase_add_test(tc, host_access);
  tcase_add_test(tc, host_transfer_runs);
  tcase_add_test(tc, out_of_memory);
  tcase_add_test(tc, rand_in_sparse_loops);
  tcase_add_test(tc, demoted_writes);
  tcase_add_test(tc, neighbour_reads);
  tcase_add_test(tc, demoted_vector_writes);
  suite_add_tcase(s, tc);
  return fbt_run(s);
}
