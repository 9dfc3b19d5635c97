/* The asynchronous engine through the public engine API: every scenario (a
 * .fbk program and a script of launches, host reads and writes, flushes and
 * syncs) gives the same fields and return values in sync mode and in async
 * mode with all passes, none, each pass alone and different flush points;
 * each flush trigger works (observed through the counters); the paper's
 * minimal example and chain_copy fire their counters; errors of background
 * launches are reported at the next sync point naming the kernel and its
 * launch; fb_flush does not wait for the work; compile_threads 1 and 4
 * agree; the SFG trace and the trace-event timeline come out well formed. */
#include <ctype.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/engine_test.h"
#include "fusebox/engine.h"
#include "fusebox/ir.h"
#include "fusebox/lang.h"
#include "optimizer/optimizer.h"
#include "support.h"

static fb_engine *eng;

static fb_engine *new_engine(int compile_threads) {
  fb_engine_config cfg = {
      .backend = fbt_backend(), .compile_threads = compile_threads, .cpu_threads = 2};
  fb_engine *e = NULL;
  char err[256];
  ck_assert_msg(fb_engine_create(&cfg, &e, err, sizeof err) == 0, "engine: %s", err);
  return e;
}

static void setup(void) { eng = new_engine(2); }

static void teardown(void) {
  fb_engine_destroy(eng);
  eng = NULL;
}

/* ---------------------------------------------------------------- programs */

static fb_program *parse(const char *src) {
  fb_program *p = NULL;
  fb_diags d;
  fb_diags_init(&d);
  int rc = fb_program_parse("test.fbk", src, &p, &d);
  char *msg = rc ? fb_diags_render("test.fbk", src, &d) : NULL;
  ck_assert_msg(rc == 0, "parse: %s", msg ? msg : "?");
  fb_diags_free(&d);
  return p;
}

static fb_session *open_session(fb_engine *e, fb_program *p, const fb_session_config *cfg) {
  fb_session *s = NULL;
  char err[512] = "";
  int rc = fb_session_create(e, cfg, fb_program_layout(p), &s, err, sizeof err);
  ck_assert_msg(rc == 0, "session: %s", err);
  return s;
}

/* Register kernel `name` bound to `binds` (comma separated, may be NULL). */
static int kernel_id(fb_session *s, fb_program *p, const char *name, const char *binds) {
  const char *b[4];
  char buf[128];
  int nb = 0;
  if (binds && binds[0]) {
    snprintf(buf, sizeof buf, "%s", binds);
    for (char *t = strtok(buf, ","); t && nb < 4; t = strtok(NULL, ",")) b[nb++] = t;
  }
  fb_kernel *k = NULL;
  fb_diags d;
  fb_diags_init(&d);
  int rc = fb_program_instantiate(p, name, b, nb, &k, &d);
  ck_assert_msg(rc == 0, "instantiate %s: %s", name, d.n ? d.v[0].msg : fb_strerror(rc));
  fb_diags_free(&d);
  int id = fb_session_add_kernel(s, k);
  ck_assert_msg(id >= 0, "add %s: %s", name, fb_session_errmsg(s));
  return id;
}

static int field_place(fb_program *p, const char *name) {
  int f = fb_program_find_field(p, name);
  ck_assert_msg(f >= 0, "no field %s", name);
  return fb_program_field(p, f)->places[0];
}

static size_t place_bytes(const fb_layout *l, int place) {
  return (size_t)fb_field_numel(l, place) * fb_type_size(l->nodes[place].type);
}

/* ---------------------------------------------------------------- results
 * Everything a run observes, in order, each piece labelled so a mismatch
 * says where the modes part. */

typedef struct piece {
  char label[96];
  size_t off, len;
} piece;

typedef struct results {
  unsigned char *data;
  size_t n, cap;
  piece *pc;
  int npc, cappc;
  fb_counters c;
  uint64_t aligned; /* fb_session_test_aligned_flushes at the end */
  uint64_t capped;  /* fb_session_test_capped_widths at the end */
  uint64_t lean;    /* fb_session_test_lean_batches at the end */
  uint64_t walks;   /* fb_session_test_grain_walks at the end */
} results;

static void add_piece(results *r, const char *label, const void *data, size_t len) {
  while (r->n + len > r->cap) {
    r->cap = r->cap ? r->cap * 2 : 4096;
    r->data = realloc(r->data, r->cap);
    ck_assert_ptr_nonnull(r->data);
  }
  if (r->npc == r->cappc) {
    r->cappc = r->cappc ? r->cappc * 2 : 64;
    r->pc = realloc(r->pc, sizeof *r->pc * (size_t)r->cappc);
    ck_assert_ptr_nonnull(r->pc);
  }
  piece *p = &r->pc[r->npc++];
  snprintf(p->label, sizeof p->label, "%s", label);
  p->off = r->n;
  p->len = len;
  memcpy(r->data + r->n, data, len);
  r->n += len;
}

static void results_free(results *r) {
  free(r->data);
  free(r->pc);
  memset(r, 0, sizeof *r);
}

static void same_results(const results *a, const results *b, const char *what) {
  ck_assert_msg(a->npc == b->npc, "%s: %d observations vs %d", what, a->npc, b->npc);
  for (int i = 0; i < a->npc; i++) {
    const piece *x = &a->pc[i], *y = &b->pc[i];
    ck_assert_msg(x->len == y->len && strcmp(x->label, y->label) == 0,
                  "%s: observation %d is %s "
                  "vs %s",
                  what, i, x->label, y->label);
    if (memcmp(a->data + x->off, b->data + y->off, x->len) == 0) continue;
    size_t at = 0;
    while (at < x->len && a->data[x->off + at] == b->data[y->off + at]) at++;
    ck_abort_msg("%s: %s differs from sync mode (first at byte %zu of %zu)", what, x->label, at,
                 x->len);
  }
}

/* Deterministic field contents: small integers, or quarters for floats
 * (exact in every operation the scenarios do). */
static void fill(void *buf, fb_type t, int64_t n, unsigned seed) {
  for (int64_t e = 0; e < n; e++) {
    uint64_t h = (uint64_t)(e + 1) * 0x9e3779b97f4a7c15ull + seed * 0xbf58476d1ce4e5b9ull;
    h ^= h >> 29;
    int64_t v = (int64_t)(h % 64) - 32;
    switch (t) {
    case FB_T_I32: ((int32_t *)buf)[e] = (int32_t)v; break;
    case FB_T_I64: ((int64_t *)buf)[e] = v; break;
    case FB_T_U32: ((uint32_t *)buf)[e] = (uint32_t)(v + 32); break;
    case FB_T_U64: ((uint64_t *)buf)[e] = (uint64_t)(v + 32); break;
    case FB_T_F32: ((float *)buf)[e] = (float)v * 0.25f; break;
    case FB_T_F64: ((double *)buf)[e] = (double)v * 0.25; break;
    default: ((uint8_t *)buf)[e] = (uint8_t)(v & 1); break;
    }
  }
}

static void read_all(fb_session *s, fb_program *p, results *r, const char *when) {
  const fb_layout *l = fb_program_layout(p);
  for (int f = 0; f < fb_program_nfields(p); f++) {
    const fb_lang_field *lf = fb_program_field(p, f);
    for (int c = 0; c < lf->ncomp; c++) {
      size_t bytes = place_bytes(l, lf->places[c]);
      void *buf = malloc(bytes ? bytes : 1);
      int rc = fb_field_read(s, lf->places[c], buf, bytes);
      ck_assert_msg(rc == 0, "read %s: %s", lf->name, fb_session_errmsg(s));
      char label[96];
      snprintf(label, sizeof label, "%s %s[%d]", when, lf->name, c);
      add_piece(r, label, buf, bytes);
      free(buf);
    }
  }
}

/* ---------------------------------------------------------------- scripts
 * One action per line:
 *   launch K[(F,G)] [v ...]   launch kernel K (bound to fields F, G) with
 *                             scalar arguments; a return value is recorded
 *   write F SEED              overwrite field F with fill(SEED)
 *   cell F i ... = v          write one element
 *   read F                    record field F
 *   flush | sync              fb_flush / fb_sync */

typedef struct kcache {
  char key[96];
  int id;
} kcache;

typedef struct runner {
  fb_session *s;
  fb_program *p;
  results *r;
  kcache kc[32];
  int nkc, line;
} runner;

static int cached_kernel(runner *u, const char *name, const char *binds) {
  char key[96];
  snprintf(key, sizeof key, "%s(%s)", name, binds ? binds : "");
  for (int i = 0; i < u->nkc; i++)
    if (strcmp(u->kc[i].key, key) == 0) return u->kc[i].id;
  int id = kernel_id(u->s, u->p, name, binds);
  ck_assert_int_lt(u->nkc, 32);
  snprintf(u->kc[u->nkc].key, sizeof u->kc[u->nkc].key, "%s", key);
  u->kc[u->nkc++].id = id;
  return id;
}

static void act_launch(runner *u, char *spec, char **save) {
  char *binds = strchr(spec, '(');
  if (binds) {
    *binds++ = 0;
    char *close = strchr(binds, ')');
    ck_assert_ptr_nonnull(close);
    *close = 0;
  }
  int kid = cached_kernel(u, spec, binds);
  const fb_lang_kernel *lk = fb_program_kernel(u->p, fb_program_find_kernel(u->p, spec));
  fb_value args[8];
  int n = 0;
  for (int i = 0; i < lk->nparams; i++) {
    if (lk->params[i].is_field) continue;
    char *tok = strtok_r(NULL, " ", save);
    ck_assert_msg(tok != NULL, "line %d: %s needs more arguments", u->line, spec);
    fb_type t = lk->params[i].type;
    args[n++] = fb_type_is_float(t) ? fb_value_cast(fb_value_f64(strtod(tok, NULL)), t)
                                    : fb_value_cast(fb_value_i64(strtoll(tok, NULL, 0)), t);
  }
  fb_value ret;
  int rc = fb_launch(u->s, kid, args, n, &ret);
  ck_assert_msg(rc == 0, "line %d: launch %s: %s", u->line, spec, fb_session_errmsg(u->s));
  if (lk->ret == FB_T_VOID) return;
  char label[96];
  snprintf(label, sizeof label, "line %d: %s returned", u->line, spec);
  add_piece(u->r, label, &ret.v.u, sizeof ret.v.u);
}

static void act_write(runner *u, const char *field, unsigned seed) {
  int place = field_place(u->p, field);
  const fb_layout *l = fb_program_layout(u->p);
  size_t bytes = place_bytes(l, place);
  void *buf = malloc(bytes);
  fill(buf, l->nodes[place].type, fb_field_numel(l, place), seed);
  int rc = fb_field_write(u->s, place, buf, bytes);
  ck_assert_msg(rc == 0, "line %d: write %s: %s", u->line, field, fb_session_errmsg(u->s));
  free(buf);
}

static void act_cell(runner *u, const char *field, char **save) {
  int place = field_place(u->p, field);
  int64_t idx[4];
  int n = 0;
  char *tok;
  while ((tok = strtok_r(NULL, " ", save)) && strcmp(tok, "=") != 0)
    idx[n++] = strtoll(tok, NULL, 0);
  tok = strtok_r(NULL, " ", save);
  ck_assert_ptr_nonnull(tok);
  int rc = fb_cell_write(u->s, place, idx, n, fb_value_f64(strtod(tok, NULL)));
  if (rc == FB_ETYPE) rc = fb_cell_write(u->s, place, idx, n, fb_value_i64(strtoll(tok, NULL, 0)));
  ck_assert_msg(rc == 0, "line %d: cell %s: %s", u->line, field, fb_session_errmsg(u->s));
}

static void act_read(runner *u, const char *field) {
  int place = field_place(u->p, field);
  size_t bytes = place_bytes(fb_program_layout(u->p), place);
  void *buf = malloc(bytes);
  int rc = fb_field_read(u->s, place, buf, bytes);
  ck_assert_msg(rc == 0, "line %d: read %s: %s", u->line, field, fb_session_errmsg(u->s));
  char label[96];
  snprintf(label, sizeof label, "line %d: %s", u->line, field);
  add_piece(u->r, label, buf, bytes);
  free(buf);
}

static void run_line(runner *u, char *line) {
  char *save = NULL, *op = strtok_r(line, " ", &save);
  if (!op || op[0] == '#') return;
  if (strcmp(op, "launch") == 0) {
    act_launch(u, strtok_r(NULL, " ", &save), &save);
  } else if (strcmp(op, "write") == 0) {
    char *f = strtok_r(NULL, " ", &save), *seed = strtok_r(NULL, " ", &save);
    act_write(u, f, (unsigned)atoi(seed ? seed : "1"));
  } else if (strcmp(op, "cell") == 0) {
    act_cell(u, strtok_r(NULL, " ", &save), &save);
  } else if (strcmp(op, "read") == 0) {
    act_read(u, strtok_r(NULL, " ", &save));
  } else if (strcmp(op, "flush") == 0) {
    ck_assert_msg(fb_flush(u->s) == 0, "line %d: flush: %s", u->line, fb_session_errmsg(u->s));
  } else if (strcmp(op, "sync") == 0) {
    ck_assert_msg(fb_sync(u->s) == 0, "line %d: sync: %s", u->line, fb_session_errmsg(u->s));
  } else {
    ck_abort_msg("line %d: unknown action %s", u->line, op);
  }
}

/* Run the script on a new session of engine e; results in *r. */
static uint64_t last_standins; /* fb_session_test_standins of run_script's session */
static int last_bg_peak;        /* fb_session_test_bg_peak of run_script's session */

static void run_script(fb_engine *e, const char *src, const char *script,
                       const fb_session_config *cfg, results *r) {
  fb_program *p = parse(src);
  runner u = {open_session(e, p, cfg), p, r, {{"", 0}}, 0, 0};
  char *text = strdup(script);
  char *save = NULL;
  for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
    u.line++;
    run_line(&u, line);
  }
  free(text);
  ck_assert_msg(fb_sync(u.s) == 0, "final sync: %s", fb_session_errmsg(u.s));
  read_all(u.s, p, r, "end:");
  fb_session_counters(u.s, &r->c);
  ck_assert_uint_eq(fb_session_launches(u.s), r->c.launches); /* the lock-free count agrees */
  r->aligned = fb_session_test_aligned_flushes(u.s);
  r->capped = fb_session_test_capped_widths(u.s);
  r->lean = fb_session_test_lean_batches(u.s);
  r->walks = fb_session_test_grain_walks(u.s);
  last_standins = fb_session_test_standins(u.s);
  last_bg_peak = fb_session_test_bg_peak(u.s);
  fb_session_destroy(u.s);
  fb_program_free(p);
}

static fb_session_config async_cfg(unsigned passes, int flush_every) {
  fb_session_config c = {.mode = "async", .seed = 7, .passes = passes, .flush_every = flush_every};
  return c;
}

/* Sync mode against async with every pass, none, each alone, and flushes
 * after every launch's tasks or never. */
static void check_modes(const char *src, const char *script) {
  fb_session_config sync = {.mode = "sync", .seed = 7};
  results want = {0};
  run_script(eng, src, script, &sync, &want);
  struct {
    const char *name;
    unsigned passes;
    int flush_every;
  } modes[] = {
      {"async, all passes", 0, 0},
      {"async, no pass", FB_PASSES_EXACT, 0},
      {"async, listgen only", FB_PASSES_EXACT | FB_PASSES_LISTGEN, 0},
      {"async, demote only", FB_PASSES_EXACT | FB_PASSES_DEMOTE, 0},
      {"async, dse only", FB_PASSES_EXACT | FB_PASSES_DSE, 0},
      {"async, fusion only", FB_PASSES_EXACT | FB_PASSES_FUSION, 0},
      {"async, flush_every 1", 0, 1},
      {"async, flush_every 5", 0, 5},
      {"async, never auto-flush", 0, -1},
  };
  for (size_t m = 0; m < sizeof modes / sizeof modes[0]; m++) {
    fb_session_config cfg = async_cfg(modes[m].passes, modes[m].flush_every);
    results got = {0};
    run_script(eng, src, script, &cfg, &got);
    same_results(&want, &got, modes[m].name);
    if (getenv("FB_TEST_VERBOSE"))
      fprintf(stderr,
              "%-26s tasks %3llu (sync %3llu) fused %llu listgen %llu dse %llu demoted %llu "
              "flushes %llu compiled %llu hits %llu\n",
              modes[m].name, (unsigned long long)got.c.tasks_launched,
              (unsigned long long)want.c.tasks_launched, (unsigned long long)got.c.tasks_fused,
              (unsigned long long)got.c.listgens_removed,
              (unsigned long long)got.c.dead_stores_removed,
              (unsigned long long)got.c.activations_demoted, (unsigned long long)got.c.flushes,
              (unsigned long long)got.c.tasks_compiled, (unsigned long long)got.c.cache_hits);
    ck_assert_uint_eq(got.c.launches, want.c.launches);
    ck_assert_uint_le(got.c.tasks_launched, want.c.tasks_launched);
    results_free(&got);
  }
  results_free(&want);
}

/* ---------------------------------------------------------------- scenarios */

START_TEST(elementwise) {
  const char *src = "layout {\n"
                    "  dense(i: 4096) { place x: f32, y: f32 }\n"
                    "  dense(i: 4096) { place z: i32 }\n"
                    "}\n"
                    "kernel axpy(a: f32, m: i32) {\n"
                    "  for i in 0 .. 4096 {\n"
                    "    let xi = x[i]\n"
                    "    y[i] = a * xi + y[i]\n"
                    "    x[i] = xi * 0.5 + f32(i % 7)\n"
                    "    let r = (i * i) % m\n"
                    "    z[i] = i < 1000 ? r - i : r\n"
                    "  }\n"
                    "}\n"
                    "kernel shift() {\n"
                    "  for i in 1 .. 4096 { z[i] = z[i - 1] + 1 }\n"
                    "}\n";
  const char *script = "write x 1\nwrite y 2\n"
                       "launch axpy 1.75 -97\nlaunch axpy 1.75 -97\nlaunch axpy 0.5 13\n"
                       "read z\nlaunch shift\nlaunch axpy 2.0 5\n";
  check_modes(src, script);
}
END_TEST

START_TEST(struct_for_dense) {
  const char *src = "layout {\n"
                    "  dense(ij: 64, 48) { place a: i32 }\n"
                    "  dense(ij: 4, 3) { dense(ij: 16, 8) { place h: i64 } }\n"
                    "}\n"
                    "kernel fill() {\n"
                    "  for i, j in a { a[i, j] = i * 1000 + j }\n"
                    "  for i, j in h { h[i, j] = i64(i) - i64(j) * 1048576 }\n"
                    "}\n"
                    "kernel bump(k: i32) { for i, j in a { a[i, j] += k } }\n"
                    "kernel mix() { for i, j in h { h[i, j] = h[i, j] * 3 + i64(a[i, j]) } }\n";
  const char *script = "launch fill\nlaunch bump 3\nlaunch bump 5\nread a\nlaunch bump -2\n"
                       "launch mix\nlaunch bump 1\nlaunch mix\n";
  check_modes(src, script);
}
END_TEST

START_TEST(reduction_returns) {
  const char *src = "layout {\n  dense(i: 10000) { place v: i32 }\n  place total: i64\n}\n"
                    "kernel sum() -> i64 {\n"
                    "  total[] = 0\n"
                    "  for i in 0 .. 10000 { total[] += i64(v[i]) }\n"
                    "  return total[]\n"
                    "}\n"
                    "kernel scale(k: i32) { for i in 0 .. 10000 { v[i] = v[i] * k + 1 } }\n";
  const char *script = "write v 3\nlaunch sum\nlaunch scale 2\nlaunch sum\nlaunch scale -1\n"
                       "launch scale 3\nlaunch sum\nlaunch scale 2\n";
  check_modes(src, script);
}
END_TEST

START_TEST(args_and_returns) {
  const char *src =
      "layout { place fi32: i32, fi64: i64, fu32: u32, fu64: u64, ff32: f32, ff64: f64 }\n"
      "kernel args(a: i32, b: i64, c: u32, d: u64, e: f32, f: f64) -> f64 {\n"
      "  fi32[] = a\n  fi64[] = b\n  fu32[] = c\n  fu64[] = d\n  ff32[] = e\n  ff64[] = f\n"
      "  return f * 2.0\n"
      "}\n"
      "kernel bump(a: i32, e: f32) { fi32[] += a\n ff32[] = ff32[] * e }\n"
      "kernel geti() -> i64 { return fi64[] + i64(fi32[]) }\n"
      "kernel getu() -> u32 { return fu32[] + 1 }\n"
      "kernel getf() -> f32 { return ff32[] }\n";
  const char *script = "launch args -5 -123456789012 4000000000 77 1.5 -0.125\n"
                       "launch bump 3 2.0\nlaunch bump 4 0.5\nlaunch geti\nlaunch getu\n"
                       "launch bump 1 3.0\nlaunch getf\nlaunch args 1 2 3 4 5 6\nlaunch geti\n";
  check_modes(src, script);
}
END_TEST

/* Top-level values and variables cross tasks through the session scratch
 * (gtmp): several launches of such kernels share its slots in one window. */
START_TEST(scratch_across_launches) {
  const char *src =
      "layout {\n  dense(i: 5000) { place a: i32, b: i32 }\n  place c0: i32, out: i32\n}\n"
      "kernel step(p: i32) {\n"
      "  let c = c0[]\n"
      "  let kk = p * 3\n"
      "  var v = c + kk\n"
      "  out[] = c + 1\n"
      "  c0[] = c + 2\n"
      "  for i in 0 .. 5000 { a[i] = i + c + kk }\n"
      "  for i in 0 .. 5000 { b[i] = a[i] * c + v }\n"
      "  v = v * 2\n"
      "  out[] = out[] + v\n"
      "}\n"
      "kernel remat(p: i32) -> i32 {\n"
      "  let c = c0[]\n"
      "  var v = c + p\n"
      "  for i in 0 .. 5000 { b[i] = b[i] + v }\n"
      "  v = v * 2\n"
      "  return v\n"
      "}\n";
  const char *script = "cell c0 = 5\nlaunch step 1\nlaunch step 2\nlaunch step 3\n"
                       "launch remat 4\nlaunch step 5\nlaunch step 6\nread out\nlaunch remat 1\n";
  check_modes(src, script);
}
END_TEST

START_TEST(random_numbers) {
  const char *src = "layout {\n  dense(i: 3000) { place r: f32 }\n  dense(i: 3000) { place n: i32 "
                    "}\n  place q: f32\n}\n"
                    "kernel noise() {\n"
                    "  q[] = random()\n"
                    "  for i in 0 .. 3000 { r[i] = random() + random() }\n"
                    "}\n"
                    "kernel count() { for i in 0 .. 3000 { if random() < 0.5 { n[i] += 1 } } }\n";
  const char *script = "launch noise\nlaunch count\nlaunch count\nlaunch noise\nread r\n"
                       "launch count\nlaunch count\nlaunch count\n";
  check_modes(src, script);
}
END_TEST

static const char *sparse_src =
    "layout {\n"
    "  pointer(i: 16) as blocks { place x: i32 }\n"
    "  pointer(ij: 4, 4) as pb { dense(ij: 8, 8) { place a: f32, b: f32 } }\n"
    "  dense(i: 8) { dynamic(j: 256, chunk: 32) { place d: i32 } }\n"
    "  bitmasked(i: 64) as bm { place m: i32 }\n"
    "  place cnt: i32\n"
    "}\n"
    "kernel init() { for i in 0 .. 16 { if i % 3 == 0 { x[i] = i } } }\n"
    "kernel inc(k: i32) { for i in x { x[i] += k } }\n"
    "kernel init2() {\n"
    "  for i in 0 .. 32 {\n"
    "    for j in 0 .. 32 {\n"
    "      if (i // 8 + j // 8) % 3 == 0 { a[i, j] = f32(i + j) }\n"
    "    }\n"
    "  }\n"
    "}\n"
    "kernel saxpy(X: field, Y: field, alpha: f32) {\n"
    "  for i, j in X { Y[i, j] = alpha * X[i, j] + Y[i, j] }\n"
    "}\n"
    "kernel drop() { for I, J in pb { if (I + J) % 2 == 0 { deactivate(pb, I, J) } } }\n"
    "kernel push(k: i32) {\n"
    "  for i in 0 .. 8 { for t in 0 .. i + k { append(d, i, i * 100 + t) } }\n"
    "}\n"
    "kernel count() -> i32 {\n"
    "  cnt[] = 0\n"
    "  for i, n in d { cnt[] += d[i, n] }\n"
    "  for i in x { cnt[] += 1 }\n"
    "  return cnt[]\n"
    "}\n"
    "kernel mark(k: i32) { for i in 0 .. 64 { if i % k == 1 { m[i] = i } } }\n"
    "kernel mbump() { for i in m { m[i] = m[i] * 2 + 1 } }\n";

static const char *sparse_script =
    "launch init\nlaunch inc 1\nlaunch inc 2\nlaunch init2\n"
    "launch saxpy(a,b) 2.0\nlaunch saxpy(b,a) 1.5\nlaunch saxpy(a,b) 1.5\n"
    "launch drop\nlaunch saxpy(a,b) 2.0\nread b\n"
    "launch push 1\nlaunch push 2\nlaunch count\n"
    "write x 4\nlaunch inc 5\ncell a 3 3 = 7.5\nlaunch saxpy(a,b) 0.5\n"
    "launch mark 5\nlaunch mbump\nlaunch mark 3\nlaunch mbump\nlaunch count\n";

START_TEST(sparse_layouts) { check_modes(sparse_src, sparse_script); }
END_TEST

/* Parallel loops whose iterations run inner loops (Taichi's ndrange(n, n)
 * written as a range over rows with a serial loop over columns, as
 * bench/real/sparse_pointer does): the CPU pool splits them by the inner
 * loops' iterations, not the rows' count (engine/session.c,
 * fbe_task_grain), so that 64 rows of 256 cells use every thread. The
 * grain fires here; the results are the same in every mode (check_modes,
 * against sync), through pointer blocks activated from several threads,
 * is_active of every level, a while loop and float sums. */
static const char *nested_src =
    "layout {\n"
    "  pointer(ij: 4, 4) as b1 { pointer(ij: 4, 4) as b2 { dense(ij: 4, 4) { place x: i32 } } }\n"
    "  dense(ij: 64, 64) { place img: f32 }\n"
    "  dense(i: 64) { place row: f32 }\n"
    "  place total: f32, cells: i32\n"
    "}\n"
    "kernel mark(t: i32) {\n"
    "  for i in 0 .. 64 { for j in 0 .. 64 { if (i * 7 + j * 3 + t) % 5 == 0 { x[i, j] = 1 } } }\n"
    "}\n"
    "kernel paint() {\n"
    "  for i in 0 .. 64 { for j in 0 .. 64 {\n"
    "    img[i, j] = f32(x[i, j] + is_active(b1, i // 16, j // 16) + is_active(b2, i // 4, j // 4)) * 0.25\n"
    "  } }\n"
    "}\n"
    "kernel sums() {\n"
    "  for i in 0 .. 64 {\n"
    "    var k = 0\n"
    "    var acc = 0.0\n"
    "    while k < 64 { acc += img[i, k]\n k += 1 }\n"
    "    row[i] = acc\n"
    "    total[] += acc\n"
    "  }\n"
    "  for I, J in b2 { cells[] += 1 }\n"
    "}\n"
    "kernel clear() { for I, J in b1 { deactivate(b1, I, J) } }\n";
static const char *nested_script = "launch mark 0\nlaunch paint\nlaunch sums\nread img\n"
                                   "launch clear\nlaunch mark 3\nlaunch paint\nlaunch sums\n"
                                   "read x\nread row\nread total\nread cells\n";

START_TEST(nested_loops_split) {
  check_modes(nested_src, nested_script);
  fb_program *p = parse(nested_src);
  /* mark's range (64 rows of a 64-cell inner loop) and sums' (a while
   * loop: 64 iterations assumed) get a grain of 1024 / 64 = 16 rows; a
   * struct-for with a plain body keeps the pool's default (0) */
  const char *names[] = {"mark", "sums"};
  int64_t want_first[] = {16, 16};
  for (int n = 0; n < 2; n++) {
    fb_kernel *k = NULL;
    fb_diags d;
    fb_diags_init(&d);
    ck_assert_int_eq(fb_program_instantiate(p, names[n], NULL, 0, &k, &d), 0);
    fb_diags_free(&d);
    fb_task_list tl;
    char err[256] = "";
    ck_assert_msg(fb_lower(k, &tl, err, sizeof err) == 0, "lower: %s", err);
    int seen = 0;
    for (int t = 0; t < tl.n; t++) {
      if (tl.v[t].loop < 0) continue;
      int64_t g = fb_session_test_task_grain(tl.v[t].ir, tl.v[t].loop);
      if (!seen++) ck_assert_msg(g == want_first[n], "%s: grain %lld", names[n], (long long)g);
      else if (tl.v[t].kind == FB_TASK_STRUCT_FOR) ck_assert_int_eq(g, 0);
    }
    ck_assert_int_gt(seen, 0);
    fb_task_list_free(&tl);
  }
  fb_program_free(p); /* owns the kernels it instantiated */
}
END_TEST

/* The MLS-MPM substep pattern: a gather writes v, c and x at
 * assume_unique(ord[i]) after a loop over grid cells, a scatter reads them
 * back inside its own loop. Fused, simplification forwards the stored
 * values to the scatter's loads (through the loops, which write none of
 * them) as select(index in bounds, value, 0); integer fields, so every mode
 * must give the same bits whatever order the scatter's atomics run in. */
START_TEST(gather_scatter_unique) {
  const char *src = "layout {\n"
                    "  dense(i: 64) { place g: i32, h: i32 }\n"
                    "  dense(i: 512) { place ord: i32 }\n"
                    "  dense(i: 512) { place x: i32, v: i32, c: i32 }\n"
                    "}\n"
                    "kernel perm(k: i32) { for i in 0 .. 512 { ord[i] = (i * 37 + k) % 512 } }\n"
                    "kernel gather() {\n"
                    "  for i in 0 .. 512 {\n"
                    "    let p = assume_unique(ord[i], covers: x)\n"
                    "    var s = 0\n"
                    "    var t = 0\n"
                    "    for a in 0 .. 3 { let w = g[(x[p] + a) % 64]\n s += w\n t += w * a }\n"
                    "    v[p] = s\n"
                    "    c[p] = t - v[p]\n"
                    "    x[p] = (x[p] + s % 7 + 64) % 64\n"
                    "  }\n"
                    "}\n"
                    "kernel scatter() {\n"
                    "  for i in 0 .. 512 {\n"
                    "    let p = assume_unique(ord[i], covers: x)\n"
                    "    for a in 0 .. 3 { h[(x[p] + a) % 64] += v[p] % 5 + c[p] * a + x[p] }\n"
                    "  }\n"
                    "}\n"
                    "kernel grid() { for i in 0 .. 64 { g[i] = h[i] % 97\n h[i] = 0 } }\n";
  const char *script = "write g 1\nwrite x 2\nlaunch perm 11\n"
                       "launch gather\nlaunch scatter\nlaunch grid\n"
                       "launch gather\nlaunch scatter\nlaunch grid\nread v\n"
                       "launch perm 5\nlaunch gather\nlaunch scatter\nlaunch grid\n"
                       "launch gather\nlaunch scatter\nlaunch grid\n";
  check_modes(src, script);
}
END_TEST

/* ---------------------------------------------------------------- triggers */

static const char *inc_src = "layout {\n  dense(i: 256) { place x: i32 }\n  place out: i32\n}\n"
                             "kernel inc() { for i in 0 .. 256 { x[i] += 1 } }\n"
                             "kernel get() -> i32 { return x[5] }\n";

typedef struct tsess {
  fb_program *p;
  fb_session *s;
  int inc, get, x;
} tsess;

static tsess trigger_session(int flush_every) {
  tsess t;
  t.p = parse(inc_src);
  fb_session_config cfg = async_cfg(0, flush_every);
  t.s = open_session(eng, t.p, &cfg);
  t.inc = kernel_id(t.s, t.p, "inc", NULL);
  t.get = kernel_id(t.s, t.p, "get", NULL);
  t.x = field_place(t.p, "x");
  return t;
}

static void tsess_free(tsess *t) {
  fb_session_destroy(t->s);
  fb_program_free(t->p);
}

static void incs(tsess *t, int n) {
  for (int i = 0; i < n; i++) ck_assert_int_eq(fb_launch(t->s, t->inc, NULL, 0, NULL), 0);
}

static fb_counters counters(fb_session *s) {
  fb_counters c;
  fb_session_counters(s, &c);
  return c;
}

static int32_t x5(tsess *t) {
  int64_t i = 5;
  fb_value v;
  ck_assert_int_eq(fb_cell_read(t->s, t->x, &i, 1, &v), 0);
  return (int32_t)v.v.i;
}

START_TEST(pending_until_trigger) {
  tsess t = trigger_session(-1);
  incs(&t, 3);
  fb_counters c = counters(t.s);
  ck_assert_uint_eq(c.launches, 3);
  ck_assert_uint_eq(c.tasks_pending, 3);
  ck_assert_uint_eq(c.flushes, 0);
  ck_assert_uint_eq(c.tasks_launched, 0);
  usleep(20000); /* nothing runs in the background without a trigger */
  ck_assert_uint_eq(counters(t.s).tasks_launched, 0);
  /* explicit flush: handed out; sync then waits for it */
  ck_assert_int_eq(fb_flush(t.s), 0);
  c = counters(t.s);
  ck_assert_uint_eq(c.flushes, 1);
  ck_assert_uint_eq(c.tasks_pending, 0);
  ck_assert_int_eq(fb_sync(t.s), 0);
  c = counters(t.s);
  ck_assert_uint_eq(c.flushes, 1); /* nothing was pending */
  ck_assert_uint_eq(c.tasks_launched, 1); /* three increments fused into one task */
  ck_assert_uint_eq(c.tasks_fused, 2);
  ck_assert_int_eq(x5(&t), 3);
  tsess_free(&t);
}
END_TEST

/* flush_every -1 still flushes at FB_MAX_PENDING_TASKS: a stream that is
 * never synced does not grow the SFG (and the server's memory) forever. */
START_TEST(pending_tasks_capped) {
  tsess t = trigger_session(-1);
  incs(&t, FB_MAX_PENDING_TASKS - 1);
  ck_assert_uint_eq(counters(t.s).flushes, 0);
  ck_assert_uint_eq(counters(t.s).tasks_pending, FB_MAX_PENDING_TASKS - 1);
  incs(&t, 1);
  ck_assert_uint_eq(counters(t.s).flushes, 1);
  ck_assert_uint_eq(counters(t.s).tasks_pending, 0);
  incs(&t, 10);
  ck_assert_int_eq(x5(&t), FB_MAX_PENDING_TASKS + 10);
  tsess_free(&t);
}
END_TEST

START_TEST(trigger_host_read_and_sync) {
  tsess t = trigger_session(-1);
  incs(&t, 2);
  int32_t buf[256];
  ck_assert_int_eq(fb_field_read(t.s, t.x, buf, sizeof buf), 0);
  ck_assert_uint_eq(counters(t.s).flushes, 1);
  for (int i = 0; i < 256; i++) ck_assert_int_eq(buf[i], 2);
  incs(&t, 1);
  ck_assert_int_eq(x5(&t), 3); /* cell read */
  ck_assert_uint_eq(counters(t.s).flushes, 2);
  incs(&t, 1);
  ck_assert_uint_eq(counters(t.s).tasks_pending, 1);
  ck_assert_int_eq(fb_sync(t.s), 0);
  fb_counters c = counters(t.s);
  ck_assert_uint_eq(c.flushes, 3);
  ck_assert_uint_eq(c.tasks_pending, 0);
  ck_assert_uint_eq(c.tasks_launched, 3);
  tsess_free(&t);
}
END_TEST

START_TEST(trigger_host_write) {
  tsess t = trigger_session(-1);
  incs(&t, 2);
  int32_t buf[256];
  for (int i = 0; i < 256; i++) buf[i] = 100 + i;
  /* the increments run before the write: they must not land on top of it */
  ck_assert_int_eq(fb_field_write(t.s, t.x, buf, sizeof buf), 0);
  fb_counters c = counters(t.s);
  ck_assert_uint_eq(c.flushes, 1);
  ck_assert_uint_eq(c.tasks_launched, 1);
  incs(&t, 1);
  int64_t i7 = 7;
  ck_assert_int_eq(fb_cell_write(t.s, t.x, &i7, 1, fb_value_i32(-4)), 0);
  ck_assert_uint_eq(counters(t.s).flushes, 2);
  incs(&t, 2);
  ck_assert_int_eq(fb_field_read(t.s, t.x, buf, sizeof buf), 0);
  for (int i = 0; i < 256; i++) ck_assert_int_eq(buf[i], i == 7 ? -2 : 103 + i);
  tsess_free(&t);
}
END_TEST

START_TEST(trigger_return_value) {
  tsess t = trigger_session(-1);
  incs(&t, 4);
  fb_value r;
  ck_assert_int_eq(fb_launch(t.s, t.get, NULL, 0, &r), 0);
  ck_assert_int_eq(r.type, FB_T_I32);
  ck_assert_int_eq(r.v.i, 4);
  fb_counters c = counters(t.s);
  ck_assert_uint_eq(c.flushes, 1);
  ck_assert_uint_eq(c.tasks_pending, 0);
  ck_assert_uint_eq(c.launches, 5);
  incs(&t, 1);
  ck_assert_int_eq(fb_launch(t.s, t.get, NULL, 0, NULL), 0); /* flushes without a ret pointer too */
  ck_assert_uint_eq(counters(t.s).flushes, 2);
  ck_assert_int_eq(fb_launch(t.s, t.get, NULL, 0, &r), 0);
  ck_assert_int_eq(r.v.i, 5);
  tsess_free(&t);
}
END_TEST

START_TEST(trigger_flush_every) {
  tsess t = trigger_session(4);
  incs(&t, 3);
  ck_assert_uint_eq(counters(t.s).flushes, 0);
  ck_assert_uint_eq(counters(t.s).tasks_pending, 3);
  incs(&t, 1);
  ck_assert_uint_eq(counters(t.s).flushes, 1);
  ck_assert_uint_eq(counters(t.s).tasks_pending, 0);
  incs(&t, 9);
  ck_assert_uint_eq(counters(t.s).flushes, 3);
  ck_assert_uint_eq(counters(t.s).tasks_pending, 1);
  ck_assert_int_eq(x5(&t), 13);
  tsess_free(&t);
  /* the default: every 50 pending tasks */
  t = trigger_session(0);
  incs(&t, 49);
  ck_assert_uint_eq(counters(t.s).flushes, 0);
  incs(&t, 1);
  ck_assert_uint_eq(counters(t.s).flushes, 1);
  fb_flush_stats fs;
  ck_assert_int_eq(fb_session_last_flush(t.s, &fs), 0);
  ck_assert_uint_eq(fs.flush, 1);
  ck_assert_uint_eq(fs.tasks_in, 50);
  ck_assert_uint_lt(fs.tasks_out, 50);
  ck_assert(fs.optimizer_s > 0);
  ck_assert_int_eq(x5(&t), 50);
  tsess_free(&t);
}
END_TEST

/* ---------------------------------------------------------------- the paper's patterns */

typedef struct pair_run {
  fb_counters before, after;
  int32_t *field;
} pair_run;

/* Launch `setup` and sync, then the step kernels, then sync; the counters
 * around the step and field f afterwards. */
static pair_run run_step(const char *src, const char *mode, const char *setup,
                         const char *const *step, int nstep, const char *field) {
  fb_program *p = parse(src);
  fb_session_config cfg = {.mode = mode, .seed = 1};
  fb_session *s = open_session(eng, p, &cfg);
  pair_run r;
  ck_assert_int_eq(fb_launch(s, kernel_id(s, p, setup, NULL), NULL, 0, NULL), 0);
  ck_assert_int_eq(fb_sync(s), 0);
  int ids[8];
  for (int i = 0; i < nstep; i++) ids[i] = kernel_id(s, p, step[i], NULL);
  fb_session_counters(s, &r.before);
  for (int i = 0; i < nstep; i++) ck_assert_int_eq(fb_launch(s, ids[i], NULL, 0, NULL), 0);
  ck_assert_int_eq(fb_sync(s), 0);
  fb_session_counters(s, &r.after);
  int place = field_place(p, field);
  size_t bytes = place_bytes(fb_program_layout(p), place);
  r.field = malloc(bytes);
  ck_assert_int_eq(fb_field_read(s, place, r.field, bytes), 0);
  fb_session_destroy(s);
  fb_program_free(p);
  return r;
}

#define DELTA(r, f) ((r).after.f - (r).before.f)

START_TEST(minimal_example) {
  const char *src = "layout { pointer(i: 16) as blocks { place x: i32 } }\n"
                    "kernel init() { for i in 0 .. 16 { if i % 3 == 0 { x[i] = i } } }\n"
                    "kernel inc() { for i in x { x[i] += 1 } }\n"
                    "kernel inc2() { for i in x { x[i] += 2 } }\n";
  const char *step[2] = {"inc", "inc2"};
  pair_run sy = run_step(src, "sync", "init", step, 2, "x");
  pair_run as = run_step(src, "async", "init", step, 2, "x");
  ck_assert_uint_eq(DELTA(sy, tasks_launched), 6);
  /* the paper's 3 less the first clear_list: no task had filled its list
     (optimizer/pass_listgen.c), so the listgen runs on an empty list */
  ck_assert_uint_eq(DELTA(as, tasks_launched), 2);
  ck_assert_uint_ge(DELTA(as, listgens_removed), 1);
  ck_assert_uint_ge(DELTA(as, tasks_fused), 1);
  ck_assert_uint_ge(DELTA(as, activations_demoted), 1);
  ck_assert_uint_eq(sy.after.tasks_fused, 0);
  ck_assert_uint_eq(sy.after.listgens_removed, 0);
  for (int i = 0; i < 16; i++) {
    ck_assert_int_eq(sy.field[i], i % 3 == 0 ? i + 3 : 0);
    ck_assert_int_eq(as.field[i], sy.field[i]);
  }
  free(sy.field);
  free(as.field);
}
END_TEST

START_TEST(chain_copy) {
  const char *src = "layout { dense(i: 65536) { place x: i32, y: i32, z: i32 } }\n"
                    "kernel init() { for i in 0 .. 65536 { x[i] = i * 7 } }\n"
                    "kernel copy1() { for i in 0 .. 65536 { y[i] = x[i] + 1 } }\n"
                    "kernel copy2() { for i in 0 .. 65536 { z[i] = y[i] + 4 } }\n";
  const char *step[2] = {"copy1", "copy2"};
  pair_run sy = run_step(src, "sync", "init", step, 2, "z");
  pair_run as = run_step(src, "async", "init", step, 2, "z");
  ck_assert_uint_eq(DELTA(sy, tasks_launched), 2);
  ck_assert_uint_eq(DELTA(as, tasks_launched), 1);
  ck_assert_uint_eq(DELTA(as, tasks_fused), 1);
  ck_assert_uint_eq(DELTA(as, flushes), 1);
  ck_assert_uint_gt(DELTA(as, optimizer_s) * 1e9, 0);
  for (int i = 0; i < 65536; i++) ck_assert_int_eq(as.field[i], i * 7 + 5);
  ck_assert_int_eq(memcmp(sy.field, as.field, sizeof(int32_t) * 65536), 0);
  free(sy.field);
  free(as.field);
}
END_TEST

/* ---------------------------------------------------------------- errors */

static const char *err_src = "layout {\n  dense(i: 100) { place a: i32 }\n  place out: i32\n}\n"
                             "kernel ok(v: i32) { out[] = v }\n"
                             "kernel overrun() { for i in 0 .. 105 { a[i] = i + 1 } }\n"
                             "kernel poke() { a[200] = 1 }\n"
                             "kernel get() -> i32 { return out[] }\n";

/* Coalescing a run of equal launches (engine/async.c): an equal launch right
 * after one of a kernel whose second run changes nothing (fb_opt_rerun_free)
 * is not inserted. `fill` and `copy` (reads a, writes b) qualify; `bump`
 * reads what it writes, `poke` indexes by an argument (may fail), `tick`
 * uses an atomic: never coalesced. */
static const char *coal_src = "layout {\n  dense(i: 64) { place a: i32 }\n"
                              "  dense(i: 64) { place b: i32 }\n  place t: f32\n  place n: i32\n}\n"
                              "kernel fill(v: i32) { for i in 0 .. 64 { a[i] = v } }\n"
                              "kernel copy() { for i in 0 .. 64 { b[i] = a[i] * 2 } }\n"
                              "kernel bump() { for i in 0 .. 64 { b[i] = b[i] + 1 } }\n"
                              "kernel poke(j: i32) { a[j] = 7 }\n"
                              "kernel scalar() { t[] = 1.5 }\n"
                              "kernel tick() { for i in 0 .. 64 { n[] += 1 } }\n";

/* The same results as sync mode, in every async mode (runs of each kind,
 * broken by other launches, host accesses, flushes and syncs). */
START_TEST(coalesce_same_results) {
  const char *script = "launch fill 3\nlaunch fill 3\nlaunch fill 3\nlaunch fill 4\nlaunch fill 4\n"
                       "launch copy\nlaunch copy\nlaunch bump\nlaunch bump\nlaunch bump\n"
                       "launch scalar\nlaunch scalar\nlaunch tick\nlaunch tick\nlaunch tick\n"
                       "read b\nlaunch copy\ncell a 5 = 11\nlaunch copy\nlaunch copy\n"
                       "launch fill 9\nflush\nlaunch fill 9\nlaunch copy\nsync\nlaunch copy\n"
                       "launch poke 2\nlaunch poke 2\nlaunch copy\nlaunch copy\nread a\n";
  check_modes(coal_src, script);
}
END_TEST

START_TEST(coalesce_counts) {
  fb_program *p = parse(coal_src);
  fb_session_config cfg = async_cfg(0, -1);
  fb_session *s = open_session(eng, p, &cfg);
  int fill = kernel_id(s, p, "fill", NULL), copy = kernel_id(s, p, "copy", NULL);
  int bump = kernel_id(s, p, "bump", NULL), poke = kernel_id(s, p, "poke", NULL);
  int tick = kernel_id(s, p, "tick", NULL), scalar = kernel_id(s, p, "scalar", NULL);
  int a = field_place(p, "a"), b = field_place(p, "b");
  fb_value v = fb_value_i32(3);
  for (int i = 0; i < 10; i++) ck_assert_int_eq(fb_launch(s, fill, &v, 1, NULL), 0);
  ck_assert_uint_eq(fb_session_test_coalesced(s), 9);
  ck_assert_uint_eq(counters(s).launches, 10);
  ck_assert_uint_eq(counters(s).tasks_pending, 1); /* the run's first alone */
  v = fb_value_i32(4); /* other argument values: a new run */
  ck_assert_int_eq(fb_launch(s, fill, &v, 1, NULL), 0);
  ck_assert_int_eq(fb_launch(s, fill, &v, 1, NULL), 0);
  ck_assert_uint_eq(fb_session_test_coalesced(s), 10);
  for (int i = 0; i < 5; i++) ck_assert_int_eq(fb_launch(s, copy, NULL, 0, NULL), 0);
  ck_assert_uint_eq(fb_session_test_coalesced(s), 14);
  for (int i = 0; i < 3; i++) ck_assert_int_eq(fb_launch(s, scalar, NULL, 0, NULL), 0);
  ck_assert_uint_eq(fb_session_test_coalesced(s), 16);
  /* reads what it writes, an atomic, an index that may be out of bounds */
  for (int i = 0; i < 3; i++) ck_assert_int_eq(fb_launch(s, bump, NULL, 0, NULL), 0);
  for (int i = 0; i < 3; i++) ck_assert_int_eq(fb_launch(s, tick, NULL, 0, NULL), 0);
  v = fb_value_i32(1);
  for (int i = 0; i < 3; i++) ck_assert_int_eq(fb_launch(s, poke, &v, 1, NULL), 0);
  ck_assert_uint_eq(fb_session_test_coalesced(s), 16);
  ck_assert_int_eq(fb_sync(s), 0);
  int32_t buf[64];
  ck_assert_int_eq(fb_field_read(s, b, buf, sizeof buf), 0);
  for (int i = 0; i < 64; i++) ck_assert_int_eq(buf[i], 8 + 3);
  fb_value r;
  int64_t zero = 0;
  ck_assert_int_eq(fb_cell_read(s, field_place(p, "n"), &zero, 0, &r), 0);
  ck_assert_int_eq(r.v.i, 3 * 64);
  /* a host write between two equal launches: the second is not coalesced
   * (and reads the written value) */
  ck_assert_int_eq(fb_launch(s, copy, NULL, 0, NULL), 0);
  int64_t five = 5;
  ck_assert_int_eq(fb_cell_write(s, a, &five, 1, fb_value_i32(20)), 0);
  ck_assert_int_eq(fb_launch(s, copy, NULL, 0, NULL), 0);
  ck_assert_uint_eq(fb_session_test_coalesced(s), 16);
  /* nor across a flush */
  ck_assert_int_eq(fb_flush(s), 0);
  ck_assert_int_eq(fb_launch(s, copy, NULL, 0, NULL), 0);
  ck_assert_uint_eq(fb_session_test_coalesced(s), 16);
  ck_assert_int_eq(fb_launch(s, copy, NULL, 0, NULL), 0);
  ck_assert_uint_eq(fb_session_test_coalesced(s), 17);
  ck_assert_int_eq(fb_field_read(s, b, buf, sizeof buf), 0);
  for (int i = 0; i < 64; i++) ck_assert_int_eq(buf[i], i == 5 ? 40 : (i == 1 ? 14 : 8));
  fb_session_destroy(s);
  fb_program_free(p);
}
END_TEST

/* A launch that may fail is never coalesced (each of an equal run of
 * failing launches is inserted as itself), and the first is the one named. */
START_TEST(coalesce_never_hides_an_error) {
  fb_program *p = parse(coal_src);
  fb_session_config cfg = async_cfg(0, -1);
  fb_session *s = open_session(eng, p, &cfg);
  int fill = kernel_id(s, p, "fill", NULL), poke = kernel_id(s, p, "poke", NULL);
  fb_value v = fb_value_i32(1), j = fb_value_i32(64);
  ck_assert_int_eq(fb_launch(s, fill, &v, 1, NULL), 0);
  ck_assert_int_eq(fb_launch(s, poke, &j, 1, NULL), 0); /* launch 1 */
  ck_assert_int_eq(fb_launch(s, poke, &j, 1, NULL), 0);
  ck_assert_int_eq(fb_launch(s, poke, &j, 1, NULL), 0);
  ck_assert_int_eq(fb_sync(s), FB_EBOUNDS);
  const char *msg = fb_session_errmsg(s);
  ck_assert_msg(strstr(msg, "'poke' (launch 1)"), "%s", msg);
  uint64_t launch = 99;
  ck_assert_int_eq(fb_session_error_launch(s, &launch, NULL), 0);
  ck_assert_uint_eq(launch, 1);
  ck_assert_uint_eq(fb_session_test_coalesced(s), 0);
  fb_session_destroy(s);
  fb_program_free(p);
}
END_TEST

START_TEST(background_errors) {
  fb_program *p = parse(err_src);
  fb_session_config cfg = async_cfg(0, -1);
  fb_session *s = open_session(eng, p, &cfg);
  int ok = kernel_id(s, p, "ok", NULL), over = kernel_id(s, p, "overrun", NULL);
  int get = kernel_id(s, p, "get", NULL), a = field_place(p, "a");
  fb_value v = fb_value_i32(9);
  ck_assert_int_eq(fb_launch(s, ok, &v, 1, NULL), 0);
  ck_assert_int_eq(fb_launch(s, over, NULL, 0, NULL), 0); /* launch 1: queued, no error yet */
  ck_assert_int_eq(fb_launch(s, ok, &v, 1, NULL), 0);
  ck_assert_int_eq(fb_sync(s), FB_EBOUNDS);
  const char *msg = fb_session_errmsg(s);
  ck_assert_msg(strstr(msg, "'overrun'") && strstr(msg, "launch 1"), "message: %s", msg);
  uint64_t launch = 99;
  int kernel = -1;
  ck_assert_int_eq(fb_session_error_launch(s, &launch, &kernel), 0);
  ck_assert_uint_eq(launch, 1);
  ck_assert_int_eq(kernel, over);
  ck_assert_int_eq(fb_sync(s), 0); /* reported once */
  ck_assert_int_eq(fb_launch(s, 99, NULL, 0, NULL), FB_ENOENT); /* an error of its own */
  ck_assert_int_eq(fb_session_error_launch(s, NULL, NULL), FB_ENOENT);
  int32_t buf[100];
  ck_assert_int_eq(fb_field_read(s, a, buf, sizeof buf), 0);
  for (int e = 0; e < 100; e++) ck_assert_int_eq(buf[e], e + 1); /* in-bounds work was done */
  /* reported by a host access (which still does its work) */
  memset(buf, 0, sizeof buf);
  ck_assert_int_eq(fb_launch(s, over, NULL, 0, NULL), 0);
  ck_assert_int_eq(fb_field_read(s, a, buf, sizeof buf), FB_EBOUNDS);
  ck_assert_ptr_nonnull(strstr(fb_session_errmsg(s), "launch 3"));
  ck_assert_int_eq(buf[99], 100);
  /* by a launch with a return value, which still returns it */
  v = fb_value_i32(31);
  ck_assert_int_eq(fb_launch(s, ok, &v, 1, NULL), 0);
  ck_assert_int_eq(fb_launch(s, over, NULL, 0, NULL), 0);
  fb_value r;
  ck_assert_int_eq(fb_launch(s, get, NULL, 0, &r), FB_EBOUNDS);
  ck_assert_int_eq(r.v.i, 31);
  /* by fb_flush once the worker has met it, or else by the next sync */
  ck_assert_int_eq(fb_launch(s, over, NULL, 0, NULL), 0);
  int rf = fb_flush(s);
  ck_assert(rf == 0 || rf == FB_EBOUNDS);
  ck_assert_int_eq(fb_sync(s), rf == 0 ? FB_EBOUNDS : 0);
  ck_assert_ptr_nonnull(strstr(fb_session_errmsg(s), "'overrun' (launch 7)"));
  /* two errors before one sync: the first, and a count of the rest */
  int poke = kernel_id(s, p, "poke", NULL);
  ck_assert_int_eq(fb_launch(s, over, NULL, 0, NULL), 0);
  ck_assert_int_eq(fb_launch(s, poke, NULL, 0, NULL), 0);
  ck_assert_int_eq(fb_sync(s), FB_EBOUNDS);
  ck_assert_msg(strstr(fb_session_errmsg(s), "'overrun' (launch 8)") &&
                    strstr(fb_session_errmsg(s), "(and 1 more error of background launches)"),
                "%s", fb_session_errmsg(s));
  /* the session works on */
  v = fb_value_i32(4242);
  ck_assert_int_eq(fb_launch(s, ok, &v, 1, NULL), 0);
  ck_assert_int_eq(fb_launch(s, get, NULL, 0, &r), 0);
  ck_assert_int_eq(r.v.i, 4242);
  fb_session_destroy(s);
  fb_program_free(p);
}
END_TEST

/* An error in a fused task names the part it comes from, as sync
 * mode does: `bad` overruns b; fused with `good` (whose accesses are all
 * provably in bounds), before or after it, the message is sync's with the
 * launch number added. Where two parts may overrun (`maybe` indexes b by
 * a's values, all 0: in bounds, but not provably), the part whose access
 * failed is named, the earliest when both did, again as sync mode does. */
static const char *blame_src = "layout { dense(i: 100) { place a: i32, b: i32, c: i32 } }\n"
                               "kernel good() { for i in a { a[i] = 1 } }\n"
                               "kernel bad() { for i in a { b[i + 1] = 2 } }\n"
                               "kernel bad2() { for i in a { c[i + 2] = 3 } }\n"
                               "kernel maybe() { for i in a { b[a[i]] = 4 } }\n";

/* Launch first then second in a fresh session; the error message, with the
 * async " (launch N)" taken out; *fused = tasks fused. */
static char *blame_run(const char *mode, const char *first, const char *second, uint64_t *launch,
                       int *kernel, int ids[2], uint64_t *fused) {
  fb_program *p = parse(blame_src);
  fb_session_config cfg = {.mode = mode, .seed = 7, .flush_every = -1};
  fb_session *s = open_session(eng, p, &cfg);
  int k1 = kernel_id(s, p, first, NULL), k2 = kernel_id(s, p, second, NULL);
  ids[0] = k1;
  ids[1] = k2;
  int rc = fb_launch(s, k1, NULL, 0, NULL);
  if (!rc) rc = fb_launch(s, k2, NULL, 0, NULL);
  if (!rc) rc = fb_sync(s);
  ck_assert_msg(rc == FB_EBOUNDS, "%s %s,%s: %s (%s)", mode, first, second, fb_strerror(rc),
                fb_session_errmsg(s));
  char *msg = strdup(fb_session_errmsg(s));
  if (!strcmp(mode, "async")) {
    ck_assert_int_eq(fb_session_error_launch(s, launch, kernel), 0);
    char *at = strstr(msg, " (launch ");
    ck_assert_msg(at != NULL, "%s", msg);
    char *end = strchr(at + 1, ')');
    if (end && end - at < 20) memmove(at, end + 1, strlen(end + 1) + 1);
  }
  fb_counters c;
  fb_session_counters(s, &c);
  *fused = c.tasks_fused;
  fb_session_destroy(s);
  fb_program_free(p);
  return msg;
}

START_TEST(fused_error_names_the_part) {
  /* first, second, the kernel sync mode names (and so must async) */
  const char *order[][3] = {{"good", "bad", "bad"},    {"bad", "good", "bad"},
                            {"maybe", "bad2", "bad2"}, {"bad2", "maybe", "bad2"},
                            {"bad", "bad2", "bad"},    {"bad2", "bad", "bad2"}};
  for (int o = 0; o < (int)(sizeof order / sizeof order[0]); o++) {
    uint64_t launch = 99, fused = 0, none;
    int kernel = -1, ids[2], ids_sync[2];
    char *sync = blame_run("sync", order[o][0], order[o][1], NULL, NULL, ids_sync, &none);
    char *async = blame_run("async", order[o][0], order[o][1], &launch, &kernel, ids, &fused);
    ck_assert_uint_eq(fused, 1); /* the two ran as one task */
    char who[64];
    snprintf(who, sizeof who, "kernel '%s'", order[o][2]);
    ck_assert_msg(strstr(sync, who) && !strcmp(sync, async) && !strstr(async, "fused with it"),
                  "%s,%s: sync: %s\nasync: %s", order[o][0], order[o][1], sync, async);
    int second = !strcmp(order[o][1], order[o][2]);
    ck_assert_uint_eq(launch, second ? 1 : 0);
    ck_assert_int_eq(kernel, ids[second]);
    free(sync);
    free(async);
  }
}
END_TEST

/* Two kernels with the same body lower to equal task IR, which the
 * session's IR bank keeps once, under the name of the first one interned
 * (twin1.t0). An out-of-bounds error of a launch of twin2 must name
 * twin2's own task and launch, as sync mode does: alone in its batch
 * (fusion off, or fused with twin1's in-bounds launch), after twin1's
 * launch in the same batch and in the batch after it. */
static const char *twin_src = "layout { dense(i: 100) { place a: i32, b: i32 } }\n"
                              "kernel twin1(o: i32) { for i in a { b[i + o] = 2 } }\n"
                              "kernel twin2(o: i32) { for i in a { b[i + o] = 2 } }\n";

static char *twin_run(const char *mode, unsigned passes, int split, uint64_t *launch,
                      int *kernel, int *k2) {
  fb_program *p = parse(twin_src);
  fb_session_config cfg = {.mode = mode, .seed = 7, .flush_every = -1, .passes = passes};
  fb_session *s = open_session(eng, p, &cfg);
  int k1 = kernel_id(s, p, "twin1", NULL);
  *k2 = kernel_id(s, p, "twin2", NULL);
  fb_value in = fb_value_i32(0), out = fb_value_i32(1);
  int rc = fb_launch(s, k1, &in, 1, NULL);
  if (!rc && split) rc = fb_sync(s);
  if (!rc) rc = fb_launch(s, *k2, &out, 1, NULL);
  if (!rc) rc = fb_sync(s);
  ck_assert_msg(rc == FB_EBOUNDS, "%s: %s (%s)", mode, fb_strerror(rc), fb_session_errmsg(s));
  char *msg = strdup(fb_session_errmsg(s));
  if (launch) ck_assert_int_eq(fb_session_error_launch(s, launch, kernel), 0);
  fb_session_destroy(s);
  fb_program_free(p);
  return msg;
}

START_TEST(twin_kernels_error_names_their_own_task) {
  int k2 = -1;
  char *sync = twin_run("sync", 0, 0, NULL, NULL, &k2);
  ck_assert_msg(strstr(sync, "kernel 'twin2' indexed a field out of bounds in its 1st top-level "
                            "loop") && !strstr(sync, ".t0"),
                "%s", sync);
  const unsigned passes[] = {FB_PASSES_EXACT, FB_PASSES_ALL};
  for (int pi = 0; pi < 2; pi++)
    for (int split = 0; split < 2; split++) {
      uint64_t launch = 99;
      int kernel = -1;
      char *async = twin_run("async", passes[pi], split, &launch, &kernel, &k2);
      ck_assert_msg(strstr(async, "kernel 'twin2' (launch 1) indexed a field out of bounds in "
                                  "its 1st top-level loop") &&
                        !strstr(async, "twin1"),
                    "passes %#x, %s: async: %s\nsync: %s", passes[pi],
                    split ? "two batches" : "one batch", async, sync);
      ck_assert_uint_eq(launch, 1);
      ck_assert_int_eq(kernel, k2);
      free(async);
    }
  free(sync);
}
END_TEST

/* Out of memory in a fused task names the launch sync mode names, with
 * sync's message: `hog` activates 100 blocks of 4 KiB of a pointer field
 * where the memory limit leaves room for a few; `good` takes none, `bad`
 * overruns b. Fused before or after `good`, the hog is named; fused with
 * `bad`, the earlier of the two, each with its own message. Two hogs fused
 * (`hog2`, another pointer field) share the pool interleaved, so the
 * earlier may have run out on the later's blocks: that one case names the
 * earlier and says the later may be it. */
static const char *quota_src = "layout {\n  dense(i: 100) { place a: i32, b: i32 }\n"
                               "  pointer(i: 128) as blk { dense(i: 1024) { place f: f32 } }\n"
                               "  pointer(i: 128) as blk2 { dense(i: 1024) { place g: f32 } }\n}\n"
                               "kernel good() { for i in a { a[i] = 1 } }\n"
                               "kernel bad() { for i in a { b[i + 1] = 2 } }\n"
                               "kernel hog() { for i in a { f[i * 1024] = 1.0 } }\n"
                               "kernel hog2() { for i in a { g[i * 1024] = 2.0 } }\n";

static char *quota_run(const char *mode, const char *first, const char *second, int want,
                       uint64_t *launch, int *kernel, int ids[2], uint64_t *fused) {
  fb_program *p = parse(quota_src);
  const fb_layout *l = fb_program_layout(p);
  fb_session_config cfg = {
      .mode = mode, .seed = 7, .flush_every = -1, .memory_limit = l->root_bytes + 64 * 1024};
  fb_session *s = open_session(eng, p, &cfg);
  ids[0] = kernel_id(s, p, first, NULL);
  ids[1] = kernel_id(s, p, second, NULL);
  int rc = fb_launch(s, ids[0], NULL, 0, NULL);
  if (!rc) rc = fb_launch(s, ids[1], NULL, 0, NULL);
  if (!rc) rc = fb_sync(s);
  ck_assert_msg(rc == want, "%s %s,%s: %s (%s)", mode, first, second, fb_strerror(rc),
                fb_session_errmsg(s));
  char *msg = strdup(fb_session_errmsg(s));
  if (!strcmp(mode, "async")) {
    ck_assert_int_eq(fb_session_error_launch(s, launch, kernel), 0);
    char *at = strstr(msg, " (launch ");
    ck_assert_msg(at != NULL, "%s", msg);
    char *end = strchr(at + 1, ')');
    if (end && end - at < 20) memmove(at, end + 1, strlen(end + 1) + 1);
  }
  fb_counters c;
  fb_session_counters(s, &c);
  *fused = c.tasks_fused;
  /* the session works on: a write that takes no block */
  ck_assert_int_eq(fb_launch(s, kernel_id(s, p, "good", NULL), NULL, 0, NULL), 0);
  ck_assert_int_eq(fb_sync(s), 0);
  fb_session_destroy(s);
  fb_program_free(p);
  return msg;
}

START_TEST(fused_quota_names_the_part) {
  /* first, second, the kernel sync mode names, its error */
  struct {
    const char *first, *second, *named;
    int rc;
  } order[] = {{"good", "hog", "hog", FB_EQUOTA},
               {"hog", "good", "hog", FB_EQUOTA},
               {"bad", "hog", "bad", FB_EBOUNDS},
               {"hog", "bad", "hog", FB_EQUOTA}};
  for (int o = 0; o < (int)(sizeof order / sizeof order[0]); o++) {
    uint64_t launch = 99, fused = 0, none;
    int kernel = -1, ids[2], ids_sync[2];
    char *sync = quota_run("sync", order[o].first, order[o].second, order[o].rc, NULL, NULL,
                           ids_sync, &none);
    char *async = quota_run("async", order[o].first, order[o].second, order[o].rc, &launch, &kernel,
                            ids, &fused);
    ck_assert_uint_eq(fused, 1); /* the two ran as one task */
    char who[64];
    snprintf(who, sizeof who, "kernel '%s'", order[o].named);
    ck_assert_msg(strstr(sync, who) && !strcmp(sync, async) && !strstr(async, "fused with it"),
                  "%s,%s: sync: %s\nasync: %s", order[o].first, order[o].second, sync, async);
    if (order[o].rc == FB_EQUOTA)
      ck_assert_msg(strstr(sync, "out of device memory allocating a block of SNode 'blk'"), "%s",
                    sync);
    int second = !strcmp(order[o].second, order[o].named);
    ck_assert_uint_eq(launch, second ? 1 : 0);
    ck_assert_int_eq(kernel, ids[second]);
    free(sync);
    free(async);
  }
  /* two parts taking blocks, interleaved: the earlier part that ran out,
   * and the later one it may be */
  uint64_t launch = 99, fused = 0;
  int kernel = -1, ids[2];
  char *async = quota_run("async", "hog", "hog2", FB_EQUOTA, &launch, &kernel, ids, &fused);
  ck_assert_uint_eq(fused, 1);
  ck_assert_msg(strstr(async, "kernel 'hog' (launch 0, or the later launch fused with it, kernel "
                              "'hog2' (launch 1), which also takes blocks from the pool"),
                "%s", async);
  free(async);
}
END_TEST

/* No lost work (docs/optimizer.md): a fused task that cannot be compiled runs as
 * its unfused parts. The gate refuses every fused task (its name joins the
 * parts' with '+'), and, with refuse_bad, the parts of kernel `bad` too. */
static int refuse_fused(void *user, const fb_kernel *task, char *err, size_t errlen) {
  int refuse_bad = user != NULL;
  if (strchr(task->name, '+') || (refuse_bad && !strncmp(task->name, "bad.", 4))) {
    snprintf(err, errlen, "refused by the test's gate");
    return 1;
  }
  return 0;
}

/* The scenarios of random_numbers and sparse_layouts (rand() launch
 * numbers, arguments of the parts, sparse fields), every fused task
 * refused: the same results as sync, and the fallback counted. */
START_TEST(fused_compile_fallback) {
  const char *src =
      "layout {\n  dense(i: 3000) { place r: f32 }\n  dense(i: 3000) { place n: i32 }\n  place q: "
      "f32\n}\n"
      "kernel noise() {\n"
      "  q[] = random()\n"
      "  for i in 0 .. 3000 { r[i] = random() + random() }\n"
      "}\n"
      "kernel count(k: i32) { for i in 0 .. 3000 { if random() < 0.5 { n[i] += k } } }\n";
  const char *script = "launch noise\nlaunch count 1\nlaunch count 2\nlaunch noise\nread r\n"
                       "launch count 3\nlaunch count 4\nlaunch count 5\n";
  const char *srcs[2] = {src, sparse_src}, *scripts[2] = {script, sparse_script};
  for (int t = 0; t < 2; t++) {
    fb_session_config sync = {.mode = "sync", .seed = 7};
    results want = {0}, plain = {0}, got = {0};
    run_script(eng, srcs[t], scripts[t], &sync, &want);
    fb_session_config cfg = async_cfg(0, -1);
    run_script(eng, srcs[t], scripts[t], &cfg, &plain);
    ck_assert_uint_gt(plain.c.tasks_fused, 0); /* there is fusion to refuse */
    ck_assert_uint_eq(plain.c.fuse_fallbacks, 0);
    fb_engine *e = new_engine(2);
    fb_engine_set_compile_gate(e, refuse_fused, NULL);
    run_script(e, srcs[t], scripts[t], &cfg, &got);
    fb_engine_destroy(e);
    same_results(&want, &got, "async, every fused task refused");
    ck_assert_uint_gt(got.c.tasks_fused, 0);
    ck_assert_uint_ge(got.c.fuse_fallbacks, 1);
    ck_assert_uint_le(got.c.fuse_fallbacks, got.c.tasks_fused);
    /* each fallback ran its parts: every fusion given back is a task more */
    ck_assert_uint_gt(got.c.tasks_launched, plain.c.tasks_launched);
    results_free(&want);
    results_free(&plain);
    results_free(&got);
  }
}
END_TEST

/* After a fallback, an error a part still hits is reported on that part's
 * launch, as sync mode reports it; the launches around it still run. */
static const char *fallback_src = "layout { dense(i: 100) { place a: i32, b: i32, c: i32 } }\n"
                                  "kernel good() { for i in a { a[i] += 1 } }\n"
                                  "kernel bad() { for i in a { b[i + 1] = 2 } }\n"
                                  "kernel after() { for i in a { c[i] += 3 } }\n";

/* good, bad, after in a fresh session of e (async: one flush); the message
 * (without the async " (launch N)"), and a, c read back. */
static char *fallback_run(fb_engine *e, const char *mode, int want_rc, uint64_t *launch,
                          int *kernel, int *bad_id, fb_counters *c, int32_t a[100],
                          int32_t cc[100]) {
  fb_program *p = parse(fallback_src);
  fb_session_config cfg = {.mode = mode, .seed = 7, .flush_every = -1};
  fb_session *s = open_session(e, p, &cfg);
  int kg = kernel_id(s, p, "good", NULL), kb = kernel_id(s, p, "bad", NULL),
      ka = kernel_id(s, p, "after", NULL);
  *bad_id = kb;
  int rc = fb_launch(s, kg, NULL, 0, NULL), first = rc;
  char *msg = NULL;
  rc = fb_launch(s, kb, NULL, 0, NULL);
  if (rc && !msg) msg = strdup(fb_session_errmsg(s)), first = rc;
  rc = fb_launch(s, ka, NULL, 0, NULL);
  ck_assert_int_eq(rc, 0);
  rc = fb_sync(s);
  if (rc && !msg) msg = strdup(fb_session_errmsg(s)), first = rc;
  ck_assert_msg(first == want_rc && msg, "%s: %s (%s)", mode, fb_strerror(first),
                msg ? msg : "no error");
  if (!strcmp(mode, "async")) {
    ck_assert_int_eq(fb_session_error_launch(s, launch, kernel), 0);
    char *at = strstr(msg, " (launch ");
    ck_assert_msg(at != NULL, "%s", msg);
    char *end = strchr(at + 1, ')');
    if (end && end - at < 20) memmove(at, end + 1, strlen(end + 1) + 1);
  }
  ck_assert_int_eq(fb_field_read(s, field_place(p, "a"), a, 400), 0);
  ck_assert_int_eq(fb_field_read(s, field_place(p, "c"), cc, 400), 0);
  fb_session_counters(s, c);
  fb_session_destroy(s);
  fb_program_free(p);
  return msg;
}

START_TEST(fallback_error_names_the_launch) {
  uint64_t launch = 99;
  int kernel = -1, bad_sync, bad_async;
  fb_counters cs, ca;
  int32_t a_sync[100], c_sync[100], a[100], c[100];
  char *sync = fallback_run(eng, "sync", FB_EBOUNDS, NULL, NULL, &bad_sync, &cs, a_sync, c_sync);
  fb_engine *e = new_engine(2);
  fb_engine_set_compile_gate(e, refuse_fused, NULL);
  char *async = fallback_run(e, "async", FB_EBOUNDS, &launch, &kernel, &bad_async, &ca, a, c);
  fb_engine_destroy(e);
  ck_assert_uint_ge(ca.tasks_fused, 1);
  ck_assert_uint_eq(ca.fuse_fallbacks, 1);
  ck_assert_msg(strstr(sync, "kernel 'bad'") && !strcmp(sync, async), "sync: %s\nasync: %s", sync,
                async);
  ck_assert_uint_eq(launch, 1);
  ck_assert_int_eq(kernel, bad_async);
  ck_assert_mem_eq(a, a_sync, sizeof a); /* good ran */
  ck_assert_mem_eq(c, c_sync, sizeof c); /* and so did the launch after bad */
  ck_assert_int_eq(a[5], 1);
  ck_assert_int_eq(c[5], 3);
  free(sync);
  free(async);
  /* a part that cannot be compiled either: its own launch is named */
  e = new_engine(2);
  fb_engine_set_compile_gate(e, refuse_fused, (void *)1);
  async = fallback_run(e, "async", FB_ECOMPILE, &launch, &kernel, &bad_async, &ca, a, c);
  fb_engine_destroy(e);
  ck_assert_uint_eq(ca.fuse_fallbacks, 1);
  ck_assert_msg(strstr(async, "kernel 'bad': compiling its 1st top-level loop failed: refused by "
                              "the test's gate"),
                "%s", async);
  ck_assert_uint_eq(launch, 1);
  ck_assert_int_eq(kernel, bad_async);
  ck_assert_int_eq(a[5], 1);
  ck_assert_int_eq(c[5], 3);
  free(async);
}
END_TEST

START_TEST(background_quota) {
  const char *src = "layout { pointer(i: 64) as blk { dense(i: 1024) { place f: f32 } } }\n"
                    "kernel paint(n: i32) { for i in 0 .. n { f[i * 1024] = 1.0 } }\n";
  fb_program *p = parse(src);
  const fb_layout *l = fb_program_layout(p);
  /* room for a few blocks of 4 KiB besides the fields' own storage */
  fb_session_config cfg = {
      .mode = "async", .memory_limit = l->root_bytes + 64 * 1024, .flush_every = -1};
  fb_session *s = open_session(eng, p, &cfg);
  int paint = kernel_id(s, p, "paint", NULL);
  fb_value n = fb_value_i32(64);
  ck_assert_int_eq(fb_launch(s, paint, &n, 1, NULL), 0);
  int rc = fb_sync(s);
  ck_assert_msg(rc == FB_EQUOTA, "sync: %s (%s)", fb_strerror(rc), fb_session_errmsg(s));
  ck_assert_ptr_nonnull(strstr(fb_session_errmsg(s), "'paint'"));
  ck_assert_ptr_nonnull(strstr(fb_session_errmsg(s), "launch 0"));
  n = fb_value_i32(1);
  ck_assert_int_eq(fb_launch(s, paint, &n, 1, NULL), 0);
  ck_assert_int_eq(fb_sync(s), 0);
  fb_session_destroy(s);
  fb_program_free(p);
}
END_TEST

START_TEST(bad_config) {
  fb_program *p = parse(inc_src);
  fb_session *s = NULL;
  char err[256] = "";
  fb_session_config cfg = {.mode = "async", .passes = 1u << 7};
  ck_assert_int_eq(fb_session_create(eng, &cfg, fb_program_layout(p), &s, err, sizeof err),
                   FB_EINVAL);
  ck_assert_ptr_null(s);
  ck_assert_ptr_nonnull(strstr(err, "pass"));
  cfg = (fb_session_config){.mode = "async", .max_fuse_per_task = -2};
  ck_assert_int_eq(fb_session_create(eng, &cfg, fb_program_layout(p), &s, err, sizeof err),
                   FB_EINVAL);
  /* the SFG trace needs async mode */
  cfg = (fb_session_config){.mode = "sync"};
  s = open_session(eng, p, &cfg);
  ck_assert_int_eq(fb_session_trace_graph(s, 0, NULL, NULL), FB_EUNSUPPORTED);
  ck_assert_int_eq(fb_flush(s), 0);
  fb_flush_stats fs;
  ck_assert_int_eq(fb_session_last_flush(s, &fs), FB_ENOENT);
  fb_session_destroy(s);
  fb_program_free(p);
}
END_TEST

/* ---------------------------------------------------------------- threads */

/* A serial loop the compiler cannot shorten (an LCG). */
static const char *spin_src = "layout {\n  dense(i: 64) { place d: i32 }\n  place out: i32\n}\n"
                              "kernel scratchy(p: i32) {\n"
                              "  let c = out[]\n"
                              "  var v = c + p\n"
                              "  for i in 0 .. 64 { d[i] = i + v }\n"
                              "  v = v * 2\n"
                              "  out[] = v\n"
                              "}\n"
                              "kernel spin(n: i32) {\n"
                              "  var acc: i32 = 1\n"
                              "  var k: i32 = 0\n"
                              "  while k < n {\n"
                              "    acc = acc * 1103515245 + 12345\n"
                              "    k += 1\n"
                              "  }\n"
                              "  out[] = acc\n"
                              "}\n";

START_TEST(flush_does_not_block) {
  fb_program *p = parse(spin_src);
  fb_session_config cfg = async_cfg(0, -1);
  fb_session *s = open_session(eng, p, &cfg);
  int spin = kernel_id(s, p, "spin", NULL);
  fb_value n = fb_value_i32(300000000);
  ck_assert_int_eq(fb_launch(s, spin, &n, 1, NULL), 0);
  ck_assert_int_eq(fb_flush(s), 0);
  /* fb_flush returned while the task was still being compiled or run */
  fb_counters c = counters(s);
  ck_assert_uint_eq(c.flushes, 1);
  ck_assert_uint_eq(c.tasks_pending, 0);
  ck_assert_uint_eq(c.tasks_launched, 0);
  ck_assert_int_eq(fb_sync(s), 0);
  c = counters(s);
  ck_assert_uint_eq(c.tasks_launched, 1);
  ck_assert(c.backend_s > 0);
  /* the same with a trigger flush: the next launch is queued behind it */
  n = fb_value_i32(200000000);
  ck_assert_int_eq(fb_launch(s, spin, &n, 1, NULL), 0);
  ck_assert_int_eq(fb_flush(s), 0);
  n = fb_value_i32(5);
  ck_assert_int_eq(fb_launch(s, spin, &n, 1, NULL), 0);
  ck_assert_uint_eq(counters(s).tasks_launched, 1);
  fb_value v;
  ck_assert_int_eq(fb_cell_read(s, field_place(p, "out"), NULL, 0, &v), 0);
  int32_t acc = 1;
  for (int k = 0; k < 5; k++) acc = (int32_t)((uint32_t)acc * 1103515245u + 12345u);
  ck_assert_int_eq(v.v.i, acc);
  ck_assert_uint_eq(counters(s).tasks_launched, 3);
  fb_session_destroy(s);
  fb_program_free(p);
}
END_TEST

START_TEST(compile_threads_agree) {
  fb_engine *one = new_engine(1), *four = new_engine(4);
  fb_session_config cfg = async_cfg(0, 3);
  results r1 = {0}, r4 = {0};
  run_script(one, sparse_src, sparse_script, &cfg, &r1);
  run_script(four, sparse_src, sparse_script, &cfg, &r4);
  same_results(&r1, &r4, "compile_threads 4 vs 1");
  ck_assert_uint_eq(r1.c.tasks_launched, r4.c.tasks_launched);
  ck_assert_uint_eq(r1.c.tasks_compiled + r1.c.cache_hits, r4.c.tasks_compiled + r4.c.cache_hits);
  ck_assert_uint_gt(r4.c.tasks_compiled, 0);
  results_free(&r1);
  results_free(&r4);
  fb_engine_destroy(one);
  fb_engine_destroy(four);
}
END_TEST

typedef struct worker {
  int add, ok;
  char msg[256];
} worker;

static void *session_thread(void *arg) {
  worker *w = arg;
  fb_program *p = NULL;
  fb_diags d;
  fb_diags_init(&d);
  if (fb_program_parse("t.fbk",
                       "layout { dense(i: 10000) { place a: i32 } }\n"
                       "kernel bump(k: i32) { for i in 0 .. 10000 { a[i] += k } }\n",
                       &p, &d))
    return NULL;
  fb_diags_free(&d);
  fb_session_config cfg = {.mode = "async", .flush_every = 7};
  fb_session *s = NULL;
  fb_kernel *k = NULL;
  int ok = fb_session_create(eng, &cfg, fb_program_layout(p), &s, w->msg, sizeof w->msg) == 0;
  ok = ok && fb_program_instantiate(p, "bump", NULL, 0, &k, NULL) == 0;
  int kid = ok ? fb_session_add_kernel(s, k) : -1;
  fb_value a = fb_value_i32(w->add);
  ok = ok && kid >= 0;
  for (int r = 0; ok && r < 200; r++) ok = fb_launch(s, kid, &a, 1, NULL) == 0;
  int32_t *g = malloc(sizeof(int32_t) * 10000);
  int place = fb_program_field(p, 0)->places[0];
  ok = ok && fb_field_read(s, place, g, sizeof(int32_t) * 10000) == 0;
  for (int e = 0; ok && e < 10000; e++) ok = g[e] == 200 * w->add;
  if (s) snprintf(w->msg, sizeof w->msg, "%s", fb_session_errmsg(s));
  w->ok = ok;
  free(g);
  fb_session_destroy(s);
  fb_program_free(p);
  return NULL;
}

START_TEST(two_sessions_two_threads) {
  worker w[2] = {{3, 0, ""}, {-5, 0, ""}};
  pthread_t th[2];
  for (int t = 0; t < 2; t++)
    ck_assert_int_eq(pthread_create(&th[t], NULL, session_thread, &w[t]), 0);
  for (int t = 0; t < 2; t++) pthread_join(th[t], NULL);
  ck_assert_msg(w[0].ok, "session 0: %s", w[0].msg);
  ck_assert_msg(w[1].ok, "session 1: %s", w[1].msg);
}
END_TEST

START_TEST(destroy_with_work_pending) {
  tsess t = trigger_session(2);
  incs(&t, 7); /* three batches handed out, one task pending */
  tsess_free(&t);
  /* a registration that grows the scratch while a batch runs */
  fb_program *p = parse(spin_src);
  fb_session_config cfg = async_cfg(0, -1);
  fb_session *s = open_session(eng, p, &cfg);
  fb_value n = fb_value_i32(20000000);
  ck_assert_int_eq(fb_launch(s, kernel_id(s, p, "spin", NULL), &n, 1, NULL), 0);
  ck_assert_int_eq(fb_flush(s), 0);
  int sc = kernel_id(s, p, "scratchy", NULL);
  fb_value three = fb_value_i32(3);
  ck_assert_int_eq(fb_launch(s, sc, &three, 1, NULL), 0);
  int32_t d[64], acc = 1;
  for (int k = 0; k < 20000000; k++) acc = (int32_t)((uint32_t)acc * 1103515245u + 12345u);
  ck_assert_int_eq(fb_field_read(s, field_place(p, "d"), d, sizeof d), 0);
  for (int i = 0; i < 64; i++) ck_assert_int_eq(d[i], (int32_t)((uint32_t)acc + 3u + (uint32_t)i));
  /* and a session destroyed with a batch still running */
  ck_assert_int_eq(fb_launch(s, kernel_id(s, p, "spin", NULL), &n, 1, NULL), 0);
  ck_assert_int_eq(fb_flush(s), 0);
  fb_session_destroy(s);
  fb_program_free(p);
}
END_TEST

/* ---------------------------------------------------------------- observability */

typedef struct graph_log {
  int calls, window_before, window_after, passes_seen, bad_dot;
  uint64_t flush_seen;
} graph_log;

static void on_graph(void *user, uint64_t flush, int iteration, const char *pass, const char *when,
                     const char *dot) {
  graph_log *g = user;
  g->calls++;
  g->flush_seen = flush;
  if (strcmp(pass, "window") == 0) {
    if (strcmp(when, "before") == 0) g->window_before++;
    else g->window_after++;
  } else if (strcmp(when, "after") == 0) {
    g->passes_seen++;
  }
  if (!dot || strncmp(dot, "digraph", 7) != 0) g->bad_dot++;
}

START_TEST(graph_trace) {
  tsess t = trigger_session(-1);
  graph_log g = {0};
  ck_assert_int_eq(fb_session_trace_graph(t.s, 2, on_graph, &g), 0);
  incs(&t, 2);
  ck_assert_int_eq(fb_flush(t.s), 0); /* flush 1: not traced */
  ck_assert_int_eq(g.calls, 0);
  incs(&t, 3);
  ck_assert_int_eq(fb_sync(t.s), 0); /* flush 2 */
  ck_assert_int_gt(g.calls, 2);
  ck_assert_uint_eq(g.flush_seen, 2);
  ck_assert_int_eq(g.window_before, 1);
  ck_assert_int_eq(g.window_after, 1);
  ck_assert_int_ge(g.passes_seen, 4);
  ck_assert_int_eq(g.bad_dot, 0);
  int calls = g.calls;
  incs(&t, 2);
  ck_assert_int_eq(fb_sync(t.s), 0);
  ck_assert_int_eq(g.calls, calls);
  ck_assert_int_eq(x5(&t), 7);
  tsess_free(&t);
}
END_TEST

/* A JSON checker that also collects, per element of traceEvents, its
 * "ph", "cat" and "tid". */
typedef struct jp {
  const char *s;
  int depth, ok;
  int in_events, nevents, ncompile, nlauncher, ndevice, nbad;
  char ph[32], cat[32];
  long tid;
  int has_ts, has_dur, has_name;
} jp;

static void ws(jp *j) {
  while (isspace((unsigned char)*j->s)) j->s++;
}

static int jvalue(jp *j, char *strout, size_t n, long *num);

static int jstring(jp *j, char *out, size_t n) {
  if (*j->s != '"') return 0;
  j->s++;
  size_t k = 0;
  while (*j->s && *j->s != '"') {
    if ((unsigned char)*j->s < 0x20) return 0;
    if (*j->s == '\\') {
      j->s++;
      if (!*j->s) return 0;
      if (*j->s == 'u') {
        for (int i = 1; i <= 4; i++)
          if (!isxdigit((unsigned char)j->s[i])) return 0;
        j->s += 4;
      } else if (!strchr("\"\\/bfnrt", *j->s)) {
        return 0;
      }
    }
    if (out && k + 1 < n) out[k++] = *j->s;
    j->s++;
  }
  if (out && n) out[k] = 0;
  if (*j->s != '"') return 0;
  j->s++;
  return 1;
}

static int jnumber(jp *j, long *num) {
  char *end;
  double d = strtod(j->s, &end);
  if (end == j->s) return 0;
  if (num) *num = (long)d;
  j->s = end;
  return 1;
}

static void event_start(jp *j) {
  j->ph[0] = j->cat[0] = 0;
  j->tid = -1;
  j->has_ts = j->has_dur = j->has_name = 0;
}

static void event_end(jp *j) {
  j->nevents++;
  if (strcmp(j->ph, "X") != 0) return;
  if (!j->has_ts || !j->has_dur || !j->has_name || j->tid < 0) j->nbad++;
  if (strcmp(j->cat, "compile") == 0 && (j->tid >= 100 || j->tid == 2)) j->ncompile++;
  if (j->tid == 2) j->nlauncher++;
  if (j->tid == 3) j->ndevice++;
}

static int jobject(jp *j) {
  int event = j->in_events && j->depth == 3;
  if (event) event_start(j);
  j->s++;
  ws(j);
  if (*j->s == '}') {
    j->s++;
    return 1;
  }
  for (;;) {
    char key[32];
    ws(j);
    if (!jstring(j, key, sizeof key)) return 0;
    ws(j);
    if (*j->s++ != ':') return 0;
    ws(j);
    char sv[32] = "";
    long num = -1;
    if (j->depth == 1 && strcmp(key, "traceEvents") == 0) j->in_events = 1;
    if (!jvalue(j, sv, sizeof sv, &num)) return 0;
    if (j->depth == 1 && strcmp(key, "traceEvents") == 0) j->in_events = 0;
    if (event && strcmp(key, "ph") == 0) snprintf(j->ph, sizeof j->ph, "%s", sv);
    if (event && strcmp(key, "cat") == 0) snprintf(j->cat, sizeof j->cat, "%s", sv);
    if (event && strcmp(key, "tid") == 0) j->tid = num;
    if (event && strcmp(key, "ts") == 0) j->has_ts = 1;
    if (event && strcmp(key, "dur") == 0) j->has_dur = num >= 0;
    if (event && strcmp(key, "name") == 0) j->has_name = 1;
    ws(j);
    if (*j->s == ',') {
      j->s++;
      continue;
    }
    if (*j->s++ != '}') return 0;
    if (event) event_end(j);
    return 1;
  }
}

static int jarray(jp *j) {
  j->s++;
  ws(j);
  if (*j->s == ']') {
    j->s++;
    return 1;
  }
  for (;;) {
    ws(j);
    if (!jvalue(j, NULL, 0, NULL)) return 0;
    ws(j);
    if (*j->s == ',') {
      j->s++;
      continue;
    }
    return *j->s++ == ']';
  }
}

static int jvalue(jp *j, char *strout, size_t n, long *num) {
  ws(j);
  int ok;
  j->depth++;
  if (*j->s == '{') ok = jobject(j);
  else if (*j->s == '[') ok = jarray(j);
  else if (*j->s == '"') ok = jstring(j, strout, n);
  else if (!strncmp(j->s, "true", 4) || !strncmp(j->s, "null", 4)) ok = (j->s += 4, 1);
  else if (!strncmp(j->s, "false", 5)) ok = (j->s += 5, 1);
  else ok = jnumber(j, num);
  j->depth--;
  return ok;
}

START_TEST(timeline) {
  char path[] = "/tmp/fb_async_traceXXXXXX";
  int fd = mkstemp(path);
  ck_assert_int_ge(fd, 0);
  close(fd);
  fb_program *p = parse(sparse_src);
  fb_session_config cfg = async_cfg(0, 4);
  fb_session *s = open_session(eng, p, &cfg);
  ck_assert_int_eq(fb_session_trace_begin(s, path), 0);
  int init = kernel_id(s, p, "init", NULL), inc = kernel_id(s, p, "inc", NULL);
  ck_assert_int_eq(fb_launch(s, init, NULL, 0, NULL), 0);
  for (int k = 1; k <= 5; k++) {
    fb_value v = fb_value_i32(k);
    ck_assert_int_eq(fb_launch(s, inc, &v, 1, NULL), 0);
  }
  ck_assert_int_eq(fb_sync(s), 0);
  ck_assert_int_eq(fb_session_trace_end(s), 0);
  ck_assert_int_eq(fb_session_trace_end(s), FB_EINVAL); /* nothing recording */
  size_t len = 0;
  char *text = fbt_read_file(path, &len);
  ck_assert_ptr_nonnull(text);
  jp j = {text, 0, 1, 0, 0, 0, 0, 0, 0, "", "", -1, 0, 0, 0};
  int ok = jvalue(&j, NULL, 0, NULL);
  ws(&j);
  ck_assert_msg(ok && *j.s == 0, "not valid JSON near: %.60s", j.s);
  ck_assert_ptr_nonnull(strstr(text, "\"traceEvents\""));
  ck_assert_int_gt(j.nevents, 5);
  ck_assert_int_eq(j.nbad, 0);
  ck_assert_int_gt(j.ncompile, 0);
  ck_assert_int_gt(j.nlauncher, 0);
  ck_assert_int_gt(j.ndevice, 0);
  ck_assert_ptr_nonnull(strstr(text, "\"thread_name\""));
  free(text);
  /* an unwritable path is refused with a message */
  ck_assert_int_eq(fb_session_trace_begin(s, "/nonexistent/dir/trace.json"), FB_EIO);
  ck_assert_ptr_nonnull(strstr(fb_session_errmsg(s), "/nonexistent/dir"));
  fb_session_destroy(s);
  fb_program_free(p);
  unlink(path);
}
END_TEST

/* ---------------------------------------------------------------- lists across flushes */

/* MacCormack's pattern: each frame iterates its source field twice and
 * writes the other (activating: the cells are active already after the
 * first frames), a sync after each frame, the fields swapped. */
static const char *frames_src =
    "layout {\n"
    "  pointer(i: 16) as p0 { dense(i: 8) { place q0: f32 } }\n"
    "  pointer(i: 16) as p1 { dense(i: 8) { place q1: f32 } }\n"
    "}\n"
    "kernel init() { for i in 0 .. 128 { if (i // 8) % 3 == 0 { q0[i] = f32(i) } } }\n"
    "kernel adv(A: field, B: field) {\n"
    "  for i in A { B[i] = A[i] * 0.5 + 1.0 }\n"
    "  for i in A { B[i] = B[i] + A[(i + 1) % 128] * 0.25 }\n"
    "}\n"
    "kernel drop0() { for i in p0 { if i >= 96 { deactivate(p0, i) } } }\n"
    "kernel drop1() { for i in p1 { if i % 2 == 0 { deactivate(p1, i) } } }\n";

/* init, then frames pairs of the two launches (the host's swap), each
 * synced; `between` once, after the middle pair. */
static char *swap_script(int frames, const char *even, const char *odd, const char *between) {
  size_t cap = 64 + (size_t)frames * (32 + strlen(even) + strlen(odd) + strlen(between));
  char *s = malloc(cap), *w = s;
  w += sprintf(w, "launch init\nsync\n");
  for (int f = 0; f < frames; f++)
    w += sprintf(w, "launch %s\nsync\nlaunch %s\nsync\n%s", even, odd,
                 f == frames / 2 ? between : "");
  return s;
}

static char *frames_script(int frames, const char *between) {
  return swap_script(frames, "adv(q0,q1)", "adv(q1,q0)", between);
}

/* Lists stay current across the syncs: from the third frame on no list is
 * generated (2 tasks a frame where sync mode launches 6), and the results
 * are sync mode's in every mode. */
START_TEST(lists_across_flushes) {
  char *script = frames_script(8, "");
  check_modes(frames_src, script);
  fb_session_config sync = {.mode = "sync", .seed = 7}, cfg = async_cfg(0, 0);
  results want = {0}, got = {0};
  run_script(eng, frames_src, script, &sync, &want);
  run_script(eng, frames_src, script, &cfg, &got);
  ck_assert_uint_eq(want.c.tasks_launched, 1 + 16 * 6);
  /* without lists kept across flushes it is 1 + 16 * 4 */
  ck_assert_msg(got.c.tasks_launched <= 1 + 4 * 4 + 12 * 2, "async launched %llu tasks",
                (unsigned long long)got.c.tasks_launched);
  ck_assert_uint_ge(got.c.listgens_removed, 16 + 12); /* one a frame within it, one across */
  results_free(&want);
  results_free(&got);
  free(script);
}
END_TEST

/* Refuses every task with a demoted activation (store_na, atomic_*_na). */
static int refuse_demoted(void *user, const fb_kernel *task, char *err, size_t errlen) {
  for (int i = 0; i < task->nstmts; i++) {
    const char *name = fb_op_table[task->stmts[i].op].name;
    size_t n = strlen(name);
    if (n > 3 && !strcmp(name + n - 3, "_na")) {
      snprintf(err, errlen, "refused by the test's gate");
      return 1;
    }
  }
  return 0;
}

/* A task demotion changed on a later frame runs the code of the task as
 * inserted (known from the first frames) while its own code compiles in
 * the background: the batch does not wait for that compile, and the
 * results are sync mode's. When the demoted task cannot compile at all (a
 * gate refuses every demoted task), the stand-in keeps running: no error
 * reaches the caller (the launches ran as asked), every sync succeeds and
 * the fields are still sync mode's. */
START_TEST(standin_while_demoted_compiles) {
  char *script = frames_script(6, "");
  fb_session_config sync = {.mode = "sync", .seed = 7};
  /* without fusion: the two loops of adv fuse, and a fused task has no
   * stand-in (it falls back to its parts instead) */
  fb_session_config cfgs[2] = {async_cfg(FB_PASSES_EXACT | FB_PASSES_DEMOTE | FB_PASSES_LISTGEN, 0),
                               async_cfg(FB_PASSES_EXACT | FB_PASSES_DEMOTE, 0)};
  results want = {0};
  /* frames_src's loops are small: stand in for them as for MacCormack's */
  fb_engine *se = new_engine(2);
  fb_engine_test_set_standin_min_stmts(se, 0);
  run_script(se, frames_src, script, &sync, &want);
  ck_assert_uint_eq(last_standins, 0); /* sync mode has none */
  for (int c = 0; c < 2; c++) {
    results got = {0}, refused = {0};
    run_script(se, frames_src, script, &cfgs[c], &got);
    same_results(&want, &got, c ? "async, demote only" : "async, demote and listgen");
    ck_assert_uint_ge(got.c.activations_demoted, 1);
    ck_assert_msg(last_standins >= 1, "no stand-in ran (config %d)", c);
    ck_assert_int_ge(last_bg_peak, 1);
    ck_assert_int_le(last_bg_peak, 8); /* FB_MAX_BG_COMPILES, engine/internal.h */
    /* the bound on background compiles at once: past it an entry compiles
     * in its batch (no stand-in), with the same results */
    for (int max = 0; max <= 1; max++) {
      results capped = {0};
      fb_engine *ce = new_engine(2);
      fb_engine_test_set_standin_min_stmts(ce, 0);
      fb_engine_test_set_bg_max(ce, max);
      run_script(ce, frames_src, script, &cfgs[c], &capped);
      fb_engine_destroy(ce);
      same_results(&want, &capped, max ? "async, one background compile" : "async, none");
      ck_assert_int_le(last_bg_peak, max);
      if (!max) ck_assert_uint_eq(last_standins, 0);
      else ck_assert_uint_ge(last_standins, 1);
      results_free(&capped);
    }
    fb_engine *e = new_engine(2);
    fb_engine_test_set_standin_min_stmts(e, 0);
    fb_engine_set_compile_gate(e, refuse_demoted, NULL);
    run_script(e, frames_src, script, &cfgs[c], &refused); /* asserts every sync succeeds */
    fb_engine_destroy(e);
    same_results(&want, &refused, "async, every demoted task refused");
    ck_assert_uint_ge(refused.c.activations_demoted, 1);
    ck_assert_uint_ge(last_standins, 1);
    results_free(&got);
    results_free(&refused);
  }
  /* at the default size none of frames_src's tasks is large enough: each
   * compiles at once, no stand-in runs, and the results are the same */
  results dflt = {0};
  run_script(eng, frames_src, script, &cfgs[0], &dflt);
  same_results(&want, &dflt, "async, small tasks compiled at once");
  ck_assert_uint_ge(dflt.c.activations_demoted, 1);
  ck_assert_uint_eq(last_standins, 0);
  results_free(&dflt);
  fb_engine_destroy(se);
  results_free(&want);
  free(script);
}
END_TEST

/* Two entries of one batch with the same task IR, the flush knowing the
 * code of one and not of the other (worker.c plan_compiles): w1's store,
 * demoted once the first flush proved its cells active, runs w1's code as
 * inserted (a stand-in) while its own compiles in the background; w2 is
 * w1 with a write to g that kg overwrites unread, and dead-store
 * elimination strips it, so that demotion makes of w2 the same IR, but a
 * reshaped task has no stand-in. The planning took the second entry for a
 * repeat of the first and ran it with the first's "known" code, which it
 * did not have: a call through a NULL pointer. Each round twice in a
 * flush (rd reads q between, so w1's store is not dead); the results must
 * be sync mode's. */
static const char *same_ir_src =
    "layout {\n"
    "  pointer(i: 16) as p0 { dense(i: 8) { place q: f32 } }\n"
    "  dense(i: 128) { place g: f32, h: f32 }\n"
    "}\n"
    "kernel w1() { for i in 0 .. 128 { q[i] = f32(i) * 0.5 + 1.0 } }\n"
    "kernel w2() { for i in 0 .. 128 { q[i] = f32(i) * 0.5 + 1.0\n g[i] = 2.0 } }\n"
    "kernel rd() { for i in 0 .. 128 { h[i] = h[i] + q[i] } }\n"
    "kernel kg() { for i in 0 .. 128 { g[i] = 3.0 } }\n";

START_TEST(same_ir_known_and_unknown) {
  const char *round = "launch w1\nlaunch rd\nlaunch w2\nlaunch kg\n"
                      "launch w1\nlaunch rd\nlaunch w2\nlaunch kg\nsync\n";
  char script[512];
  snprintf(script, sizeof script, "launch w1\nsync\n%s%s%s", round, round, round);
  fb_session_config sync = {.mode = "sync", .seed = 7};
  /* fusion would merge the entries; listgen removal does not matter */
  fb_session_config cfg = async_cfg(FB_PASSES_EXACT | FB_PASSES_DEMOTE | FB_PASSES_DSE, 0);
  results want = {0}, got = {0};
  fb_engine *e = new_engine(2);
  fb_engine_test_set_standin_min_stmts(e, 0); /* these tasks are small */
  run_script(e, same_ir_src, script, &sync, &want);
  run_script(e, same_ir_src, script, &cfg, &got);
  same_results(&want, &got, "async, demote and dse");
  ck_assert_uint_ge(got.c.activations_demoted, 1);
  ck_assert_uint_ge(got.c.dead_stores_removed, 1);
  ck_assert_uint_ge(last_standins, 1);
  fb_engine_destroy(e);
  results_free(&want);
  results_free(&got);
}
END_TEST

/* Host writes and deactivation between frames: a cell written in a new
 * block of q0, a field write of q1 (every cell: its whole index space
 * activated), a kernel deactivating blocks of q0; the lists must follow.
 * Every mode gives sync mode's fields. */
START_TEST(lists_across_host_writes) {
  static const char *const betweens[] = {
      "cell q0 105 = 3.0\n",
      "write q1 3\n",
      "launch drop0\nsync\n",
      "launch drop1\nlaunch adv(q0,q1)\ncell q1 9 = 1.0\nsync\n",
  };
  for (size_t i = 0; i < sizeof betweens / sizeof *betweens; i++) {
    char *script = frames_script(6, betweens[i]);
    check_modes(frames_src, script);
    free(script);
  }
}
END_TEST

/* MacCormack's three loops (bench/large/maccormack.fbk): forward into B,
 * backward into the scratch field T from B's neighbours, correction into
 * B; the host swaps q0 and q1, and both instantiations write qt. */
static const char *mac_src =
    "layout {\n"
    "  pointer(i: 16) as p0 { dense(i: 8) { place q0: f32 } }\n"
    "  pointer(i: 16) as p1 { dense(i: 8) { place q1: f32 } }\n"
    "  pointer(i: 16) as pt { dense(i: 8) { place qt: f32 } }\n"
    "}\n"
    "kernel init() { for i in 0 .. 128 { if (i // 8) % 3 == 0 { q0[i] = f32(i) } } }\n"
    "kernel adv(A: field, B: field, T: field) {\n"
    "  for i in A { B[i] = A[i] * 0.5 + A[(i + 1) % 128] * 0.25 }\n"
    "  for i in A { T[i] = B[i] - B[(i + 127) % 128] * 0.5 }\n"
    "  for i in A { B[i] = B[i] + 0.5 * (A[i] - T[i]) }\n"
    "}\n"
    "kernel dropt() { for i in pt { if i % 16 < 8 { deactivate(pt, i) } } }\n";

static char *mac_script(int frames, const char *between) {
  return swap_script(frames, "adv(q0,q1,qt)", "adv(q1,q0,qt)", between);
}

/* Counts the tasks compiled with a store_na into the place *user. */
static int count_na_stores(void *user, const fb_kernel *task, char *err, size_t errlen) {
  int *c = user;
  (void)err;
  (void)errlen;
  int place = c[0];
  for (int i = 0; i < task->nstmts; i++)
    if (task->stmts[i].op == FB_OP_STORE_NA && task->stmts[i].snode == place) {
      __atomic_fetch_add(&c[1], 1, __ATOMIC_RELAXED);
      break;
    }
  return 0;
}

/* The scratch field's loop (T[i] = ...) is demoted too: its twin is the
 * same instantiation's launch two frames back, which the flushes keep as an
 * earlier activating writer of qt's mask (FB_SFG_MASK_HISTORY); until
 * 2026-12-02 only the loops writing B were (their twin is B's latest
 * writer). Each instantiation's T loop compiles a variant with a store_na
 * into qt. The fields are sync mode's in every mode, also when the frame
 * in the middle deactivates half of qt's blocks (the proofs across it
 * stop: the frames after it activate again). */
START_TEST(scratch_field_demoted_across_frames) {
  static const char *const betweens[] = {"", "launch dropt\nsync\n"};
  for (size_t b = 0; b < sizeof betweens / sizeof *betweens; b++) {
    char *script = mac_script(6, betweens[b]);
    check_modes(mac_src, script);
    free(script);
  }
  fb_program *p = parse(mac_src);
  int gate[2] = {field_place(p, "qt"), 0};
  fb_program_free(p);
  fb_engine *ge = new_engine(2);
  fb_engine_set_compile_gate(ge, count_na_stores, gate);
  char *script = mac_script(6, "");
  fb_session_config sync = {.mode = "sync", .seed = 7},
                    cfg = async_cfg(FB_PASSES_EXACT | FB_PASSES_DEMOTE | FB_PASSES_LISTGEN, 0);
  results want = {0}, got = {0};
  run_script(ge, mac_src, script, &sync, &want);
  ck_assert_int_eq(__atomic_load_n(&gate[1], __ATOMIC_RELAXED), 0);
  run_script(ge, mac_src, script, &cfg, &got);
  same_results(&want, &got, "async, demote and listgen");
  if (getenv("FB_TEST_VERBOSE"))
    fprintf(stderr, "scratch field: %d store_na tasks into qt, %llu activations demoted\n",
            gate[1], (unsigned long long)got.c.activations_demoted);
  ck_assert_msg(__atomic_load_n(&gate[1], __ATOMIC_RELAXED) == 2,
                "%d tasks compiled with a store_na into qt", gate[1]);
  /* 12 launches of 3 stores, each demoted from the third launch on (its
     twin two frames back is kept): 3 x 10. With the latest writers alone
     kept it was 18: the correction's from the third launch, the forward
     loop's from the fifth (once the correction no longer activates), T's
     never, and no store_na into qt was compiled. */
  ck_assert_msg(got.c.activations_demoted == 30, "%llu activations demoted",
                (unsigned long long)got.c.activations_demoted);
  results_free(&want);
  results_free(&got);
  free(script);
  fb_engine_destroy(ge);
}
END_TEST

/* The paper's multi-kernel MacCormack (bench/large/maccormack_channels):
 * one scalar kernel launched per dye channel, each launch with its own dt.
 * The channels sit in one dense block, so their struct-fors fuse; the
 * backtrace reads v at an index computed from dt. */
static const char *chan_src =
    "layout {\n"
    "  dense(i: 128) { place v: f32 }\n"
    "  pointer(i: 16) as p0 { dense(i: 8) { place qa: f32, qb: f32, qc: f32 } }\n"
    "  pointer(i: 16) as p1 { dense(i: 8) { place ra: f32, rb: f32, rc: f32 } }\n"
    "}\n"
    "kernel init() {\n"
    "  for i in 0 .. 128 {\n"
    "    v[i] = f32(i % 7) * 1.5\n"
    "    if (i // 8) % 3 == 0 {\n"
    "      qa[i] = f32(i)\n"
    "      qb[i] = f32(2 * i) + 0.5\n"
    "      qc[i] = 1.0\n"
    "    }\n"
    "  }\n"
    "}\n"
    "kernel adv(A: field, B: field, dt: f32) {\n"
    "  for i in A {\n"
    "    let x = f32(i) - dt * v[i]\n"
    "    let y = x - dt * v[clamp(i32(x), 0, 127)]\n"
    "    B[i] = A[clamp(i32(y), 0, 127)] + dt\n"
    "  }\n"
    "}\n";

/* Per compiled task of three parts (two '+' in its name): how many loads of
 * v (place c[0]) it has, counted in c[1 + loads] (loads up to 8). */
static int count_v_loads(void *user, const fb_kernel *task, char *err, size_t errlen) {
  int *c = user;
  (void)err;
  (void)errlen;
  const char *a = strchr(task->name, '+');
  if (!a || !strchr(a + 1, '+') || strchr(strchr(a + 1, '+') + 1, '+')) return 0;
  int loads = 0;
  for (int i = 0; i < task->nstmts; i++)
    if (task->stmts[i].op == FB_OP_LOAD && task->stmts[i].snode == c[0]) loads++;
  if (fb_kernel_count_stmts(task) > 0 && loads <= 8)
    __atomic_fetch_add(&c[1 + loads], 1, __ATOMIC_RELAXED);
  return 0;
}

/* Shared arguments (pass_simplify.c): when the three launches pass the
 * same dt, the fused task reads one parameter and CSE loads v at the
 * backtraced index once (2 loads of v: v[i] and v[x]); when one launch
 * passes another dt, that part keeps its own (3 loads). The fields are
 * sync mode's in every mode, in both cases. */
START_TEST(shared_dt_merges_fused_backtraces) {
  static const char *const dts[][3] = {{"0.5", "0.5", "0.5"}, {"0.5", "0.5", "0.25"}};
  static const int want_loads[] = {2, 3};
  for (int d = 0; d < 2; d++) {
    char even[160], odd[160];
    snprintf(even, sizeof even, "adv(qa,ra) %s\nlaunch adv(qb,rb) %s\nlaunch adv(qc,rc) %s",
             dts[d][0], dts[d][1], dts[d][2]);
    snprintf(odd, sizeof odd, "adv(ra,qa) %s\nlaunch adv(rb,qb) %s\nlaunch adv(rc,qc) %s",
             dts[d][0], dts[d][1], dts[d][2]);
    char *script = swap_script(4, even, odd, "");
    check_modes(chan_src, script);
    fb_program *p = parse(chan_src);
    int gate[10] = {field_place(p, "v")};
    fb_program_free(p);
    fb_engine *ge = new_engine(2);
    fb_engine_set_compile_gate(ge, count_v_loads, gate);
    fb_session_config sync = {.mode = "sync", .seed = 7}, cfg = async_cfg(0, 0);
    results want = {0}, got = {0};
    run_script(ge, chan_src, script, &sync, &want);
    run_script(ge, chan_src, script, &cfg, &got);
    same_results(&want, &got, "async, all passes");
    int n3 = 0, at = 0;
    for (int l = 0; l <= 8; l++) {
      int c = __atomic_load_n(&gate[1 + l], __ATOMIC_RELAXED);
      if (getenv("FB_TEST_VERBOSE") && c)
        fprintf(stderr, "dts %s %s %s: %d three-part tasks with %d loads of v\n", dts[d][0],
                dts[d][1], dts[d][2], c, l);
      n3 += c;
      if (l == want_loads[d]) at = c;
    }
    ck_assert_msg(n3 > 0, "no task of three parts compiled (dts %s %s %s)", dts[d][0], dts[d][1],
                  dts[d][2]);
    ck_assert_msg(at == n3, "%d of %d three-part tasks have %d loads of v (dts %s %s %s)", at, n3,
                  want_loads[d], dts[d][0], dts[d][1], dts[d][2]);
    results_free(&want);
    results_free(&got);
    free(script);
    fb_engine_destroy(ge);
  }
}
END_TEST

/* Fusion keeps to the session's compile budget: with max_kernel_statements
 * at one inc kernel's size, every inc fits but no two fuse, and the result
 * is the same; with the default budget they fuse. */
START_TEST(fusion_within_the_compile_budget) {
  fb_program *p = parse(inc_src);
  fb_kernel *k = NULL;
  fb_diags d;
  fb_diags_init(&d);
  ck_assert_int_eq(fb_program_instantiate(p, "inc", NULL, 0, &k, &d), 0);
  fb_diags_free(&d);
  for (int tight = 0; tight < 2; tight++) {
    fb_session_config cfg = async_cfg(FB_PASSES_EXACT | FB_PASSES_FUSION, 0);
    if (tight) cfg.max_kernel_statements = k->nstmts;
    fb_session *s = open_session(eng, p, &cfg);
    int inc = kernel_id(s, p, "inc", NULL);
    for (int i = 0; i < 10; i++) ck_assert_int_eq(fb_launch(s, inc, NULL, 0, NULL), 0);
    ck_assert_int_eq(fb_sync(s), 0);
    fb_counters c = counters(s);
    int64_t i5 = 5;
    fb_value v;
    ck_assert_int_eq(fb_cell_read(s, field_place(p, "x"), &i5, 1, &v), 0);
    ck_assert_int_eq(v.v.i, 10);
    if (tight) ck_assert_uint_eq(c.tasks_fused, 0);
    else ck_assert_uint_ge(c.tasks_fused, 1);
    fb_session_destroy(s);
  }
  fb_program_free(p);
}
END_TEST

/* A repeating stream: the optimizer's plan memo answers its flushes, and
 * the engine flushes less often (flush_every left at its default). */
START_TEST(repeating_stream_plans) {
  tsess t = trigger_session(0);
  for (int step = 0; step < 10; step++) {
    incs(&t, 400);
    ck_assert_int_eq(fb_sync(t.s), 0);
  }
  fb_counters c = counters(t.s);
  ck_assert_int_eq(x5(&t), 4000);
  ck_assert_uint_ge(c.plans_reused, 5);
  ck_assert_uint_lt(c.flushes, 4000 / 50); /* 80 at a fixed flush_every */
  tsess_free(&t);
  /* a flush_every the session chose stays: every 50 tasks */
  t = trigger_session(50);
  for (int step = 0; step < 4; step++) {
    incs(&t, 400);
    ck_assert_int_eq(fb_sync(t.s), 0);
  }
  c = counters(t.s);
  ck_assert_int_eq(x5(&t), 1600);
  ck_assert_uint_eq(c.flushes, 32);
  ck_assert_uint_ge(c.plans_reused, 20);
  tsess_free(&t);
}
END_TEST

/* A stream with a period of three launches, q p1 p2, where p1 and p2 fuse
 * (element-wise) and q reads y and z at neighbours (no fusion across it:
 * p2 of one period and p1 of the next are joined through q). With
 * a sync after `init` the automatic flush at 50 pending tasks would cut
 * after a p1 (50 launches after the sync), splitting that pair; aligned to
 * the period every window is whole periods and every pair fuses. */
static const char *period_src =
    "layout { dense(i: 256) { place x: f32, y: f32, z: f32 } }\n"
    "kernel init() { for i in x { x[i] = f32(i) * 0.5 } }\n"
    "kernel q() { for i in x { x[i] = y[(i + 1) % 256] * 0.5 + z[(i + 7) % 256] * 0.001 } }\n"
    "kernel p1() { for i in x { y[i] = x[i] + 1.0 } }\n"
    "kernel p2() { for i in x { z[i] += y[i] * 2.0 } }\n";

static char *period_script(int steps, int periods) {
  char *s = malloc(32 + (size_t)steps * ((size_t)periods * 32 + 8)), *w = s;
  w += sprintf(w, "launch init\nsync\n");
  for (int k = 0; k < steps; k++) {
    for (int i = 0; i < periods; i++) w += sprintf(w, "launch q\nlaunch p1\nlaunch p2\n");
    w += sprintf(w, "sync\n");
  }
  return s;
}

START_TEST(period_aligned_flushes) {
  char *script = period_script(4, 100);
  check_modes(period_src, script); /* sync mode's fields in every mode */
  fb_session_config sync = {.mode = "sync", .seed = 7}, dflt = async_cfg(0, 0),
                    fixed = async_cfg(0, 50);
  results want = {0}, got = {0}, cut = {0};
  run_script(eng, period_src, script, &sync, &want);
  run_script(eng, period_src, script, &dflt, &got);
  run_script(eng, period_src, script, &fixed, &cut);
  same_results(&want, &got, "async, aligned windows");
  same_results(&want, &cut, "async, flush_every 50");
  ck_assert_uint_eq(want.c.tasks_launched, 1 + 4 * 300);
  /* the default flush waited for the period's end, and every p1/p2 pair
     fused: one task a period fewer */
  ck_assert_uint_ge(got.aligned, 1);
  ck_assert_uint_eq(got.c.tasks_fused, 4 * 100);
  ck_assert_uint_eq(got.c.tasks_launched, 1 + 4 * 200);
  /* a flush_every the session chose cuts where it says, splitting pairs */
  ck_assert_uint_eq(cut.aligned, 0);
  ck_assert_uint_lt(cut.c.tasks_fused, 4 * 100);
  results_free(&want);
  results_free(&got);
  results_free(&cut);
  free(script);
}
END_TEST

/* A stream whose doubled window the plan memo cannot keep: three serial
 * updates of one scalar (a b c, repeated, no sync). Fusion pairs them
 * greedily across the window, so the task that last writes s (what the
 * next window meets) depends on the window's width: the first window at a
 * doubled width leaves a graph other than the one it found, and neither
 * hits nor stores a plan (MGPCG's two-iteration window, small). Before
 * the cap, the width fell back to flush_every and doubled into the same
 * failure every few flushes, each one optimized afresh; now a failed
 * width is not tried again for a while (engine/async.c, adapt_flush). */
static const char *serial_src = "layout {\n  dense(i: 4) { place x: f32 }\n  place s: f32\n}\n"
                                "kernel a() { s[] = s[] * 0.5 + 1.0 }\n"
                                "kernel b() { s[] = s[] + 0.25 }\n"
                                "kernel c() { s[] = s[] * 0.75 }\n";

START_TEST(failed_width_capped) {
  enum { PERIODS = 1500 };
  char *script = malloc(16 + PERIODS * 30), *w = script;
  for (int i = 0; i < PERIODS; i++) w += sprintf(w, "launch a\nlaunch b\nlaunch c\n");
  fb_session_config sync = {.mode = "sync", .seed = 7}, dflt = async_cfg(0, 0);
  results want = {0}, got = {0};
  run_script(eng, serial_src, script, &sync, &want);
  run_script(eng, serial_src, script, &dflt, &got);
  same_results(&want, &got, "async, capped width");
  /* the doubled width failed its probe and was capped */
  ck_assert_uint_ge(got.capped, 1);
  ck_assert_uint_ge(got.c.flushes, 3 * PERIODS / 102); /* the width stayed below 100 */
  /* and the windows the optimizer ran its passes on (no plan reused):
   * the first few and a probe or two; not every other flush (38 of 72
   * before) */
  uint64_t fresh = got.c.flushes - got.c.plans_reused;
  ck_assert_msg(fresh <= 10, "%llu of %llu flushes optimized afresh", (unsigned long long)fresh,
                (unsigned long long)got.c.flushes);
  results_free(&want);
  results_free(&got);
  free(script);
}
END_TEST

/* A batch whose code the caller knew at the flush (a repeating stream,
 * once compiled) is planned without a compile job, a table of its handles
 * or a per-entry job index (engine/worker.c, plan_compiles): the caller
 * counted its distinct handles as it looked their code up (async.c,
 * known_code), at any size. One with code to compile is planned the usual
 * way. Results are sync mode's either way, and the cache hits count each
 * distinct handle of a batch once, as the table did. */
START_TEST(lean_batches) {
  char *small = period_script(6, 5), *big = period_script(6, 20);
  fb_session_config sync = {.mode = "sync", .seed = 7}, dflt = async_cfg(0, 0),
                    wide = async_cfg(FB_PASSES_EXACT, 1000); /* no pass, a batch per step */
  results want = {0}, got = {0}, want_big = {0}, plain = {0};
  run_script(eng, period_src, small, &sync, &want);
  run_script(eng, period_src, small, &dflt, &got);
  run_script(eng, period_src, big, &sync, &want_big);
  run_script(eng, period_src, big, &wide, &plain);
  same_results(&want, &got, "async, lean batches");
  same_results(&want_big, &plain, "async, no pass");
  ck_assert_uint_eq(want.lean, 0); /* sync mode has no batches */
  /* fused, a step is one batch of 10 tasks; from the second step on its
     code is known */
  ck_assert_uint_eq(got.c.tasks_launched, 1 + 6 * 10);
  ck_assert_uint_ge(got.lean, 4);
  /* unoptimized, a step is one batch of 60 entries of 3 handles: past the
     scan's reach, yet lean from the second step on (its code known) */
  ck_assert_uint_eq(plain.c.tasks_launched, 1 + 6 * 60);
  ck_assert_uint_eq(plain.lean, 5);
  /* code found or compiled once per handle and batch: init's batch and the
     first step's make 1 + 3 jobs (each compiled or a cache hit), the 5
     later steps' batches hit 3 handles each (not 60 entries each) */
  ck_assert_uint_eq(plain.c.tasks_compiled + plain.c.cache_hits, 1 + 3 + 5 * 3);
  results_free(&want);
  results_free(&got);
  results_free(&want_big);
  results_free(&plain);
  free(small);
  free(big);
}
END_TEST

/* The chunk grain of a task (how finely the CPU pool may split its loop,
 * engine/session.c fbe_task_grain) is worked out from its IR once, when
 * the caller learns its code, and kept with the code: a batch whose code
 * the caller knew hands the grains to the worker, which walks no task IR
 * for them (it walked every entry's IR before, each batch). Sync mode's
 * results either way. */
START_TEST(grain_kept_with_code) {
  char *script = period_script(6, 20);
  fb_session_config sync = {.mode = "sync", .seed = 7},
                    wide = async_cfg(FB_PASSES_EXACT, 1000); /* no pass, a batch per step */
  results want = {0}, got = {0};
  run_script(eng, period_src, script, &sync, &want);
  run_script(eng, period_src, script, &wide, &got);
  same_results(&want, &got, "async, grains kept with the code");
  ck_assert_uint_eq(want.walks, 0); /* sync mode: no batches */
  ck_assert_uint_eq(got.c.tasks_launched, 1 + 6 * 60);
  /* the init batch and the first step's (their code compiled in the
     batch) walk their entries; the five steps after it none */
  ck_assert_uint_ge(got.walks, 1);
  ck_assert_msg(got.walks <= 1 + 60, "%llu grains worked out for %llu tasks run",
                (unsigned long long)got.walks, (unsigned long long)got.c.tasks_launched);
  results_free(&want);
  results_free(&got);
  free(script);
}
END_TEST

/* ---------------------------------------------------------------- back-pressure */

typedef struct gate {
  fb_session *s;
  atomic_int checked; /* the test has looked at the counters */
} gate;

/* Wait (bounded) until cond(g) holds. */
static void gate_wait(gate *g, int which) {
  for (int i = 0; i < 20000; i++) {
    if (which == 0 && fb_session_test_queue_waits(g->s) >= 1) return;
    if (which == 1 && atomic_load(&g->checked)) return;
    usleep(1000);
  }
}

/* Holds launch 0's task until the caller waits on the full queue, then
 * launch 1's until the test has checked what ran. */
static int hold_worker(void *user, const char *kernel, const char *task, uint64_t launch) {
  (void)task;
  if (kernel && launch <= 1) gate_wait(user, (int)launch);
  return 0;
}

/* A caller faster than the worker waits, once FB_MAX_QUEUED_FLUSHES
 * batches are queued, for one batch to finish, not for the queue to
 * empty: the worker always has the next batch. */
START_TEST(full_queue_waits_for_one_batch) {
  tsess t = trigger_session(1); /* every launch is a flush */
  gate g = {t.s, 0};
  fb_session_set_task_hook(t.s, hold_worker, &g);
  incs(&t, FB_MAX_QUEUED_FLUSHES + 1); /* the last one waited for batch 0 */
  ck_assert_uint_eq(fb_session_test_queue_waits(t.s), 1);
  fb_counters c = counters(t.s);
  ck_assert_uint_eq(c.flushes, FB_MAX_QUEUED_FLUSHES + 1);
  ck_assert_uint_eq(c.tasks_launched, 1); /* batch 1 and the rest still queued */
  atomic_store(&g.checked, 1);
  incs(&t, 20);
  ck_assert_int_eq(fb_sync(t.s), 0);
  fb_session_set_task_hook(t.s, NULL, NULL);
  ck_assert_int_eq(x5(&t), FB_MAX_QUEUED_FLUSHES + 21);
  ck_assert_uint_eq(counters(t.s).tasks_launched, FB_MAX_QUEUED_FLUSHES + 21);
  ck_assert_uint_ge(fb_session_test_queue_waits(t.s), 1);
  tsess_free(&t);
}
END_TEST

/* ---------------------------------------------------------------- cancel */

static int cancel_all(void *user, const char *kernel, const char *task, uint64_t launch) {
  (void)task;
  (void)launch;
  if (kernel) (*(int *)user)++;
  return kernel != NULL; /* cancel every task */
}

/* A flush cancelled before its first task, with the compile jobs of its
 * tasks still queued on (or running in) the engine's one compile thread:
 * the batch is freed only once the pool has let go of them (ASan checks). */
START_TEST(cancel_with_compiles_pending) {
  fb_engine *e = new_engine(1);
  char src[4096] = "layout { dense(i: 64) { place x: f32 } }\n";
  for (int k = 0; k < 12; k++) {
    size_t n = strlen(src);
    snprintf(src + n, sizeof src - n,
             "kernel k%d() { for i in x { x[i] = x[i] * %d.5 + f32(i + %d) } }\n", k, k + 2, k);
  }
  fb_program *p = parse(src);
  fb_session_config cfg = {.mode = "async", .passes = FB_PASSES_EXACT, .flush_every = -1};
  for (int round = 0; round < 3; round++) {
    fb_session *s = open_session(e, p, &cfg);
    int calls = 0;
    fb_session_set_task_hook(s, cancel_all, &calls);
    for (int k = 0; k < 12; k++) {
      char name[8];
      snprintf(name, sizeof name, "k%d", k);
      ck_assert_int_eq(fb_launch(s, kernel_id(s, p, name, NULL), NULL, 0, NULL), 0);
    }
    ck_assert_int_eq(fb_sync(s), FB_ECANCELLED);
    ck_assert_int_eq(calls, 1);
    fb_session_set_task_hook(s, NULL, NULL);
    /* the session goes on, and code compiled meanwhile is not mistaken */
    ck_assert_int_eq(fb_launch(s, kernel_id(s, p, "k3", NULL), NULL, 0, NULL), 0);
    ck_assert_int_eq(fb_sync(s), 0);
    float x[64];
    ck_assert_int_eq(fb_field_read(s, fb_program_field(p, 0)->places[0], x, sizeof x), 0);
    for (int i = 0; i < 64; i++) ck_assert_float_eq(x[i], (float)(i + 3));
    fb_session_destroy(s);
  }
  fb_program_free(p);
  fb_engine_destroy(e);
}
END_TEST

/* ---------------------------------------------------------------- a flush that stops early
 * The optimizer keeps, across flushes, the lists and activations of tasks
 * it handed out, taking them as run. A flush whose task is cancelled (the
 * task hook; the same for an error that stops a launch) did not make them:
 * a later flush that took its list as current would read a stale list. */

typedef struct stop_hook {
  atomic_int armed; /* cancel the first task of a launch of "inc" */
  atomic_int hold; /* before cancelling, wait until released */
  atomic_int waiting; /* the hook is holding */
  atomic_int release;
} stop_hook;

static int stop_inc(void *user, const char *kernel, const char *task, uint64_t launch) {
  (void)task;
  (void)launch;
  stop_hook *h = user;
  if (!kernel || strcmp(kernel, "inc") || !atomic_load(&h->armed)) return 0;
  atomic_store(&h->armed, 0);
  if (atomic_load(&h->hold)) {
    atomic_store(&h->waiting, 1);
    for (int i = 0; i < 60000 && !atomic_load(&h->release); i++) usleep(1000); /* bounded */
  }
  return 1;
}

static const char *stop_src = "layout { pointer(i: 16) as blocks { place x: i32 } }\n"
                              "kernel act(j: i32) { x[j] = 100 }\n"
                              "kernel inc() { for i in x { x[i] += 1 } }\n"
                              "kernel inc2() { for i in x { x[i] += 2 } }\n";

/* act(0) inc | sync | act(5) | flush | inc (cancelled) | flush | [wait or
 * hold] | inc2 | flush | sync: sync mode leaves x[0] = 103, x[5] = 102.
 * hold: the cancelled flush is still running when inc2's is optimized. */
static void stop_run(const char *mode, int hold, int32_t x[16], int *sync_rc, char *msg,
                     size_t msglen) {
  fb_program *p = parse(stop_src);
  fb_session_config cfg = {.mode = mode, .flush_every = -1}; /* every pass */
  fb_session *s = open_session(eng, p, &cfg);
  stop_hook h;
  atomic_init(&h.armed, 0);
  atomic_init(&h.hold, hold);
  atomic_init(&h.waiting, 0);
  atomic_init(&h.release, 0);
  fb_session_set_task_hook(s, stop_inc, &h);
  int act = kernel_id(s, p, "act", NULL), inc = kernel_id(s, p, "inc", NULL),
      inc2 = kernel_id(s, p, "inc2", NULL);
  fb_value v0 = {.type = FB_T_I32, .v.i = 0}, v5 = {.type = FB_T_I32, .v.i = 5};
  int async = !strcmp(mode, "async");
  ck_assert_int_eq(fb_launch(s, act, &v0, 1, NULL), 0);
  ck_assert_int_eq(fb_launch(s, inc, NULL, 0, NULL), 0);
  ck_assert_int_eq(fb_sync(s), 0);
  ck_assert_int_eq(fb_launch(s, act, &v5, 1, NULL), 0);
  ck_assert_int_eq(fb_flush(s), 0);
  atomic_store(&h.armed, 1);
  *sync_rc = 0;
  msg[0] = 0;
  /* a background error comes back at the first flush or sync after it */
#define STOP_CALL(call)                                                                            \
  do {                                                                                             \
    int rc_ = (call);                                                                              \
    if (rc_ && !*sync_rc) {                                                                        \
      *sync_rc = rc_;                                                                              \
      snprintf(msg, msglen, "%s", fb_session_errmsg(s));                                           \
    }                                                                                              \
  } while (0)
  ck_assert_int_eq(fb_launch(s, inc, NULL, 0, NULL), async ? 0 : FB_ECANCELLED);
  STOP_CALL(fb_flush(s));
  if (async && hold) { /* the cancelled flush holds in the hook */
    for (int i = 0; i < 60000 && !atomic_load(&h.waiting); i++) usleep(1000);
    ck_assert_msg(atomic_load(&h.waiting), "the flush never reached the hook");
  } else if (async) { /* the cancelled flush has ended and the caller knows it */
    for (int i = 0; i < 60000 && fb_session_pending_bytes(s); i++) {
      STOP_CALL(fb_flush(s)); /* nothing pending: collects ended flushes */
      usleep(1000);
    }
    ck_assert_uint_eq(fb_session_pending_bytes(s), 0);
  }
  ck_assert_int_eq(fb_launch(s, inc2, NULL, 0, NULL), 0);
  STOP_CALL(fb_flush(s));
  atomic_store(&h.release, 1);
  STOP_CALL(fb_sync(s));
#undef STOP_CALL
  ck_assert_int_eq(fb_field_read(s, field_place(p, "x"), x, sizeof(int32_t) * 16), 0);
  fb_session_destroy(s);
  fb_program_free(p);
}

START_TEST(lists_after_a_cancelled_flush) {
  int32_t want[16], got[16];
  int rc;
  char msg[512];
  stop_run("sync", 0, want, &rc, msg, sizeof msg);
  ck_assert_int_eq(rc, 0);
  ck_assert_int_eq(want[0], 103);
  ck_assert_int_eq(want[5], 102);
  /* the caller learns of the cancelled flush before the next one is
     optimized: the optimizer forgets it, the results are sync mode's */
  stop_run("async", 0, got, &rc, msg, sizeof msg);
  ck_assert_int_eq(rc, FB_ECANCELLED);
  ck_assert_msg(strstr(msg, "cancelled"), "%s", msg);
  for (int i = 0; i < 16; i++) ck_assert_int_eq(got[i], want[i]);
  /* the next flush was optimized while the cancelled one still ran, taking
     its list as made: it is not run with a stale list (x[0] = 103 with
     x[5] = 100), but skipped and reported */
  stop_run("async", 1, got, &rc, msg, sizeof msg);
  ck_assert_int_eq(rc, FB_ECANCELLED);
  ck_assert_int_eq(got[0], 101);
  ck_assert_int_eq(got[5], 100);
  ck_assert_msg(strstr(msg, "cancelled") && strstr(msg, "1 more error"), "%s", msg);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("async");
  TCase *tc = tcase_create("async");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, elementwise);
  tcase_add_test(tc, struct_for_dense);
  tcase_add_test(tc, reduction_returns);
  tcase_add_test(tc, args_and_returns);
  tcase_add_test(tc, scratch_across_launches);
  tcase_add_test(tc, random_numbers);
  tcase_add_test(tc, sparse_layouts);
  tcase_add_test(tc, nested_loops_split);
  tcase_add_test(tc, gather_scatter_unique);
  tcase_add_test(tc, pending_until_trigger);
  tcase_add_test(tc, pending_tasks_capped);
  tcase_add_test(tc, trigger_host_read_and_sync);
  tcase_add_test(tc, trigger_host_write);
  tcase_add_test(tc, trigger_return_value);
  tcase_add_test(tc, trigger_flush_every);
  tcase_add_test(tc, minimal_example);
  tcase_add_test(tc, chain_copy);
  tcase_add_test(tc, background_errors);
  tcase_add_test(tc, coalesce_same_results);
  tcase_add_test(tc, coalesce_counts);
  tcase_add_test(tc, coalesce_never_hides_an_error);
  tcase_add_test(tc, fused_error_names_the_part);
  tcase_add_test(tc, twin_kernels_error_names_their_own_task);
  tcase_add_test(tc, fused_quota_names_the_part);
  tcase_add_test(tc, fused_compile_fallback);
  tcase_add_test(tc, fallback_error_names_the_launch);
  tcase_add_test(tc, background_quota);
  tcase_add_test(tc, bad_config);
  tcase_add_test(tc, flush_does_not_block);
  tcase_add_test(tc, compile_threads_agree);
  tcase_add_test(tc, two_sessions_two_threads);
  tcase_add_test(tc, destroy_with_work_pending);
  tcase_add_test(tc, cancel_with_compiles_pending);
  tcase_add_test(tc, graph_trace);
  tcase_add_test(tc, timeline);
  tcase_add_test(tc, lists_across_flushes);
  tcase_add_test(tc, standin_while_demoted_compiles);
  tcase_add_test(tc, same_ir_known_and_unknown);
  tcase_add_test(tc, fusion_within_the_compile_budget);
  tcase_add_test(tc, lists_across_host_writes);
  tcase_add_test(tc, scratch_field_demoted_across_frames);
  tcase_add_test(tc, shared_dt_merges_fused_backtraces);
  tcase_add_test(tc, repeating_stream_plans);
  tcase_add_test(tc, period_aligned_flushes);
  tcase_add_test(tc, failed_width_capped);
  tcase_add_test(tc, lean_batches);
  tcase_add_test(tc, grain_kept_with_code);
  tcase_add_test(tc, lists_after_a_cancelled_flush);
  tcase_add_test(tc, full_queue_waits_for_one_batch);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) { return fbt_run(suite()); }
