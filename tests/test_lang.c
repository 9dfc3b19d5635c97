/* The .fbk front end: golden tests and the lang.h API.
 *
 * Golden tests: every tests/lang/NAME.fbk has beside it either NAME.ir (the
 * layout and the IR of every kernel, printed with fb_layout_print and
 * fb_kernel_print; each must pass fb_verify) or NAME.err (the rendered
 * diagnostics, all of them). Kernels with field parameters are
 * instantiated for each `#! instantiate KERNEL FIELD...` line of the file.
 * Set FB_UPDATE_GOLDEN=1 to rewrite the expected files (then review them).
 *
 * API tests: field and kernel tables, instantiation and its cache, binding
 * errors, diagnostic rendering, and robustness on truncated input. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fusebox/lang.h"
#include "tests/support/support.h"

/* ---------------------------------------------------------------- helpers */

typedef struct sbuf {
  char *p;
  size_t n;
} sbuf;

static void sb_add(sbuf *b, const char *s) {
  size_t m = strlen(s);
  b->p = realloc(b->p, b->n + m + 1);
  ck_assert_ptr_nonnull(b->p);
  memcpy(b->p + b->n, s, m + 1);
  b->n += m;
}

static char *read_lang(const char *name) {
  char rel[512];
  snprintf(rel, sizeof rel, "lang/%s", name);
  return fbt_read_file(fbt_path(rel), NULL);
}

static fb_program *parse_ok(const char *name, const char *src) {
  fb_program *p = NULL;
  fb_diags d;
  fb_diags_init(&d);
  int rc = fb_program_parse(name, src, &p, &d);
  char *r = fb_diags_render(name, src, &d);
  ck_assert_msg(rc == 0, "%s does not parse (%s):\n%s", name, fb_strerror(rc), r ? r : "");
  free(r);
  fb_diags_free(&d);
  return p;
}

static void verify_ok(const fb_kernel *k) {
  fb_diags v;
  fb_diags_init(&v);
  int rc = fb_verify(k, &v);
  char *j = fb_diags_join(&v);
  ck_assert_msg(rc == 0, "kernel %s fails verification:\n%s", k->name, j);
  free(j);
  fb_diags_free(&v);
}

static void add_kernel_text(sbuf *out, const fb_kernel *k) {
  verify_ok(k);
  char *t = fb_kernel_print(k);
  ck_assert_ptr_nonnull(t);
  sb_add(out, t);
  free(t);
}

/* `#! instantiate KERNEL FIELD...` lines for kernel kname, in order. */
static void instantiate_listed(fb_program *p, const char *src, const char *kname, sbuf *out,
                               sbuf *errs, const char *file) {
  for (const char *l = src; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL) {
    char line[512], kn[64], f[4][64];
    snprintf(line, sizeof line, "%.*s", (int)strcspn(l, "\n"), l);
    int n = sscanf(line, "#! instantiate %63s %63s %63s %63s %63s", kn, f[0], f[1], f[2], f[3]);
    if (n < 1 || strcmp(kn, kname)) continue;
    const char *b[4] = {f[0], f[1], f[2], f[3]};
    fb_kernel *k = NULL;
    fb_diags d;
    fb_diags_init(&d);
    if (fb_program_instantiate(p, kname, b, n - 1, &k, &d) == 0) {
      add_kernel_text(out, k);
    } else {
      char *r = fb_diags_render(file, src, &d);
      sb_add(errs, r ? r : "?");
      free(r);
    }
    fb_diags_free(&d);
  }
}

/* What a golden file produces: IR text, or rendered errors (*is_err). */
static char *golden_output(const char *file, const char *src, int *is_err) {
  fb_program *p = NULL;
  fb_diags d;
  fb_diags_init(&d);
  sbuf out = {0}, errs = {0};
  sb_add(&out, "");
  sb_add(&errs, "");
  int rc = fb_program_parse(file, src, &p, &d);
  if (rc) {
    ck_assert_int_eq(rc, FB_EPARSE);
    ck_assert_int_gt(d.n, 0);
    char *r = fb_diags_render(file, src, &d);
    fb_diags_free(&d);
    free(out.p);
    free(errs.p);
    *is_err = 1;
    return r;
  }
  char *lay = fb_layout_print(fb_program_layout(p));
  sb_add(&out, lay);
  free(lay);
  for (int i = 0; i < fb_program_nkernels(p); i++) {
    const fb_lang_kernel *lk = fb_program_kernel(p, i);
    if (lk->nfield_params) {
      instantiate_listed(p, src, lk->name, &out, &errs, file);
      continue;
    }
    fb_kernel *k = NULL;
    ck_assert_int_eq(fb_program_instantiate(p, lk->name, NULL, 0, &k, NULL), 0);
    add_kernel_text(&out, k);
  }
  fb_program_free(p);
  *is_err = errs.n > 0;
  if (*is_err) {
    free(out.p);
    return errs.p;
  }
  free(errs.p);
  return out.p;
}

static char **golden_names(int *n) {
  DIR *dir = opendir(fbt_path("lang"));
  char **v = NULL;
  *n = 0;
  if (!dir) return NULL;
  struct dirent *e;
  while ((e = readdir(dir))) {
    size_t m = strlen(e->d_name);
    if (m < 5 || strcmp(e->d_name + m - 4, ".fbk")) continue;
    v = realloc(v, sizeof(char *) * (size_t)(*n + 1));
    v[(*n)++] = strdup(e->d_name);
  }
  closedir(dir);
  for (int i = 1; i < *n; i++) /* sorted, so that the loop index is stable */
    for (int j = i; j > 0 && strcmp(v[j - 1], v[j]) > 0; j--) {
      char *t = v[j];
      v[j] = v[j - 1];
      v[j - 1] = t;
    }
  return v;
}

static char **goldens;
static int ngoldens;

START_TEST(golden) {
  ck_assert_int_lt(_i, ngoldens);
  const char *name = goldens[_i];
  char *src = read_lang(name);
  ck_assert_ptr_nonnull(src);
  char base[256], irf[300], errf[300];
  snprintf(base, sizeof base, "%.*s", (int)(strlen(name) - 4), name);
  snprintf(irf, sizeof irf, "%s.ir", base);
  snprintf(errf, sizeof errf, "%s.err", base);
  int is_err = 0;
  char *got = golden_output(name, src, &is_err);
  ck_assert_ptr_nonnull(got);
  const char *want_file = is_err ? errf : irf;
  if (getenv("FB_UPDATE_GOLDEN")) {
    char rel[320];
    snprintf(rel, sizeof rel, "lang/%s", want_file);
    FILE *f = fopen(fbt_path(rel), "wb");
    ck_assert_ptr_nonnull(f);
    fputs(got, f);
    fclose(f);
  }
  char *want = read_lang(want_file);
  char *other = read_lang(is_err ? irf : errf);
  ck_assert_msg(want != NULL, "%s: %s produced %s but there is no %s:\n%s", name, name,
                is_err ? "errors" : "IR", want_file, got);
  ck_assert_msg(other == NULL, "%s: both %s and the other expectation exist", name, want_file);
  ck_assert_msg(strcmp(want, got) == 0, "%s differs from %s; got:\n%s", name, want_file, got);
  free(want);
  free(got);
  free(src);
}
END_TEST

/* The error goldens the spec requires exist (and so are checked above). */
START_TEST(required_error_goldens) {
  static const char *const need[] = {"err_unknown_field", "err_index_count",   "err_type_mismatch",
                                     "err_break_outside", "err_struct_for_0d", "err_append_dense",
                                     "err_recursion",     "err_field_dim",     "err_undefined",
                                     "err_let_assign",    "err_unknown_func",  "err_arg_count"};
  for (size_t i = 0; i < sizeof need / sizeof need[0]; i++) {
    char f[128];
    snprintf(f, sizeof f, "%s.err", need[i]);
    char *s = read_lang(f);
    ck_assert_msg(s != NULL && strstr(s, ": error: ") != NULL, "missing golden %s", f);
    free(s);
  }
}
END_TEST

/* ---------------------------------------------------------------- API */

static const char *const api_src =
    "layout {\n"
    "  dense(ij: 4, 8) { place a: f32, v: f32[3], M: f64[2][3] }\n"
    "  pointer(i: 4) as blk { dense(i: 4) { place s: i32 } }\n"
    "  place loss: f32\n"
    "}\n"
    "func dbl(x: f32) -> f32 { return x * 2.0 }\n"
    "kernel copy(X: field, Y: field, k: f32) { for i, j in X { Y[i, j] = X[i, j] * k } }\n"
    "kernel sum() -> f32 { for i, j in a { loss[] += dbl(a[i, j]) }\n return loss[] }\n"
    "kernel mix(n: i32, F: field, x: f64) { for i in F { F[i] = n } }\n";

START_TEST(api_tables) {
  fb_program *p = parse_ok("api.fbk", api_src);
  ck_assert_str_eq(fb_program_filename(p), "api.fbk");
  ck_assert_str_eq(fb_program_source(p), api_src);
  ck_assert_int_eq(fb_program_nfields(p), 5);
  const fb_lang_field *v = fb_program_field(p, fb_program_find_field(p, "v"));
  ck_assert_ptr_nonnull(v);
  ck_assert_int_eq(v->ncomp, 3);
  ck_assert_int_eq(v->rows, 3);
  ck_assert_int_eq(v->cols, 0);
  ck_assert_int_eq(v->ndim, 2);
  ck_assert_int_eq(v->shape[0], 4);
  ck_assert_int_eq(v->shape[1], 8);
  ck_assert_int_eq(v->type, FB_T_F32);
  const fb_layout *l = fb_program_layout(p);
  ck_assert(l->finalized);
  for (int c = 0; c < 3; c++) {
    ck_assert_int_eq(l->nodes[v->places[c]].kind, FB_SN_PLACE);
    ck_assert_int_eq(l->nodes[v->places[c]].parent, v->snode);
    int comp = -1;
    ck_assert_int_eq(fb_program_field_of_place(p, v->places[c], &comp),
                     fb_program_find_field(p, "v"));
    ck_assert_int_eq(comp, c);
  }
  const fb_lang_field *M = fb_program_field(p, fb_program_find_field(p, "M"));
  ck_assert_int_eq(M->ncomp, 6);
  ck_assert_int_eq(M->rows, 2);
  ck_assert_int_eq(M->cols, 3);
  ck_assert_int_eq(l->nodes[M->places[5]].type, FB_T_F64);
  const fb_lang_field *s = fb_program_field(p, fb_program_find_field(p, "s"));
  ck_assert_int_eq(s->ndim, 1);
  ck_assert_int_eq(s->shape[0], 16);
  const fb_lang_field *loss = fb_program_field(p, fb_program_find_field(p, "loss"));
  ck_assert_int_eq(loss->ndim, 0);
  ck_assert_int_eq(loss->snode, 0);
  ck_assert_int_eq(fb_program_find_field(p, "nope"), -1);
  ck_assert_ptr_null(fb_program_field(p, 99));

  ck_assert_int_eq(fb_program_nkernels(p), 3);
  ck_assert_int_eq(fb_program_nfuncs(p), 1);
  ck_assert_str_eq(fb_program_func_name(p, 0), "dbl");
  const fb_lang_kernel *mix = fb_program_kernel(p, fb_program_find_kernel(p, "mix"));
  ck_assert_int_eq(mix->nparams, 3);
  ck_assert_int_eq(mix->nfield_params, 1);
  ck_assert(mix->params[1].is_field);
  ck_assert_str_eq(mix->params[2].name, "x");
  ck_assert_int_eq(mix->params[2].type, FB_T_F64);
  ck_assert_int_eq(mix->ret, FB_T_VOID);
  ck_assert_int_eq(fb_program_kernel(p, fb_program_find_kernel(p, "sum"))->ret, FB_T_F32);
  fb_program_free(p);
}
END_TEST

START_TEST(api_instantiate) {
  fb_program *p = parse_ok("api.fbk", api_src);
  fb_diags d;
  fb_diags_init(&d);
  fb_kernel *k1 = NULL, *k2 = NULL, *k3 = NULL;
  const char *ab[] = {"a", "a"};
  ck_assert_int_eq(fb_program_instantiate(p, "copy", ab, 2, &k1, &d), 0);
  ck_assert_str_eq(k1->name, "copy[a,a]");
  ck_assert_int_eq(k1->nparams, 1);
  ck_assert_int_eq(k1->params[0], FB_T_F32);
  ck_assert_ptr_eq(k1->layout, fb_program_layout(p));
  verify_ok(k1);
  ck_assert_int_eq(fb_program_instantiate(p, "copy", ab, 2, &k2, &d), 0);
  ck_assert_ptr_eq(k1, k2); /* cached */
  const char *ms[] = {"s"};
  ck_assert_int_eq(fb_program_instantiate(p, "mix", ms, 1, &k3, &d), 0);
  ck_assert_str_eq(k3->name, "mix[s]");
  ck_assert_int_eq(k3->nparams, 2);
  ck_assert_int_eq(k3->params[0], FB_T_I32);
  ck_assert_int_eq(k3->params[1], FB_T_F64);
  verify_ok(k3);
  ck_assert_int_eq(d.n, 0);
  fb_kernel *ks = NULL;
  ck_assert_int_eq(fb_program_instantiate(p, "sum", NULL, 0, &ks, &d), 0);
  ck_assert_str_eq(ks->name, "sum");
  ck_assert_int_eq(ks->ret, FB_T_F32);

  /* errors: unknown kernel, binding count, unknown field, type errors */
  fb_kernel *bad = (fb_kernel *)1;
  ck_assert_int_eq(fb_program_instantiate(p, "nope", NULL, 0, &bad, &d), FB_ENOENT);
  ck_assert_ptr_null(bad);
  ck_assert_int_eq(fb_program_instantiate(p, "copy", ab, 1, &bad, &d), FB_ETYPE);
  const char *bogus[] = {"a", "zz"};
  ck_assert_int_eq(fb_program_instantiate(p, "copy", bogus, 2, &bad, &d), FB_ENOENT);
  ck_assert_int_eq(d.n, 3);
  ck_assert_ptr_nonnull(strstr(d.v[2].msg, "zz"));
  fb_diags_free(&d);
  /* mix over a 2-D field: its one loop variable is the index vector
   * (Taichi's ti.grouped), so F[i] indexes both axes */
  const char *ma[] = {"a"};
  fb_kernel *k4 = NULL;
  ck_assert_int_eq(fb_program_instantiate(p, "mix", ma, 1, &k4, &d), 0);
  verify_ok(k4);
  ck_assert_int_eq(d.n, 0);
  /* copy into a vector field: assigning f32 to f32[3] broadcasts, but
   * reading a vector into a scalar field is a type mismatch */
  const char *va[] = {"v", "a"};
  ck_assert_int_eq(fb_program_instantiate(p, "copy", va, 2, &bad, &d), FB_ETYPE);
  ck_assert_ptr_nonnull(strstr(d.v[0].msg, "type mismatch"));
  fb_diags_free(&d);
  fb_program_free(p);
}
END_TEST

/* Fields interleaved in one dense block get a warning (never an error);
 * a block of their own ('field' shorthand), a one-cell block or a single
 * field do not. */
START_TEST(interleave_warning) {
  fb_program *p = parse_ok("w.fbk", "layout {\n"
                                    "  field a: f32 (ij: 8, 8)\n"
                                    "  field b: f32[2] (ij: 8, 8)\n"
                                    "  pointer(i: 4) { dense(i: 8) { place c: f32, d: i32, e: i32 } }\n"
                                    "  dense(i: 1) { place f: f32, g: f32 }\n"
                                    "  place h: f32, k: f32\n"
                                    "}\n");
  const fb_diags *w = fb_program_warnings(p);
  ck_assert_int_eq(w->n, 1);
  ck_assert_int_eq(w->v[0].line, 4);
  ck_assert_int_eq(w->v[0].col, 19);
  char *r = fb_program_warnings_render(p);
  ck_assert_msg(strstr(r, "w.fbk:4:19: warning: 3 fields ('c', 'd', ...) are interleaved") &&
                    strstr(r, "'field c: f32 (i: 8)'"),
                "%s", r);
  free(r);
  ck_assert_int_eq(fb_program_field(p, fb_program_find_field(p, "a"))->snode ==
                       fb_program_field(p, fb_program_find_field(p, "b"))->snode,
                   0);
  fb_program_free(p);
}
END_TEST

START_TEST(render) {
  const char *src = "layout {\n\tplace x: f32\n}\nkernel k() {\n\tx[] = y\n}\n";
  fb_program *p = NULL;
  fb_diags d;
  fb_diags_init(&d);
  ck_assert_int_eq(fb_program_parse("r.fbk", src, &p, &d), FB_EPARSE);
  ck_assert_ptr_null(p);
  ck_assert_int_eq(d.n, 1);
  ck_assert_int_eq(d.v[0].line, 5);
  ck_assert_int_eq(d.v[0].col, 8);
  char *r = fb_diag_render("r.fbk", src, &d.v[0]);
  ck_assert_str_eq(r, "r.fbk:5:8: error: undefined variable 'y'\n\tx[] = y\n\t      ^\n");
  free(r);
  fb_diag nopos = {-1, 0, 0, "no kernel named 'q'"};
  r = fb_diag_render("r.fbk", src, &nopos);
  ck_assert_str_eq(r, "r.fbk: error: no kernel named 'q'\n");
  free(r);
  fb_diag past = {-1, 99, 3, "past the end"};
  r = fb_diag_render(NULL, src, &past);
  ck_assert_str_eq(r, "<input>:99:3: error: past the end\n");
  free(r);
  fb_diags_free(&d);
}
END_TEST

/* Every prefix of a valid program either parses or fails with positioned
 * diagnostics; nothing crashes. */
START_TEST(truncated_input) {
  char *src = read_lang("spec_example.fbk");
  ck_assert_ptr_nonnull(src);
  size_t n = strlen(src);
  for (size_t cut = 0; cut <= n; cut += 7) {
    char *s = strndup(src, cut);
    fb_program *p = NULL;
    fb_diags d;
    fb_diags_init(&d);
    int rc = fb_program_parse("cut.fbk", s, &p, &d);
    ck_assert(rc == 0 || rc == FB_EPARSE);
    if (rc == 0) ck_assert_ptr_nonnull(p);
    for (int i = 0; i < d.n; i++) {
      ck_assert_int_ge(d.v[i].line, 1);
      ck_assert_int_ge(d.v[i].col, 1);
    }
    if (rc) ck_assert_int_gt(d.n, 0);
    fb_program_free(p);
    fb_diags_free(&d);
    free(s);
  }
  free(src);
}
END_TEST

START_TEST(lexer_corners) {
  const char *src = "layout { dense(i: 0x10) { place a: i32 } }\n"
                    "kernel k() {\n"
                    "  for i in 0..16 {\n"
                    "    var m = 1_000\n"
                    "    m min= a[i]\n"
                    "    m max= -3\n"
                    "    m //= 2\n"
                    "    m %= 5\n"
                    "    m <<= 1\n"
                    "    let f = 1e-4 + .5 + 2.\n"
                    "    a[i] = m +\n"
                    "      i32(f *\n"
                    "          100.0)\n"
                    "    a[i] = a[i]   # a next line that starts with an operator continues\n"
                    "\n"
                    "         # (blank and comment lines in between are fine)\n"
                    "         - 7\n"
                    "  }\n"
                    "}\n";
  fb_program *p = parse_ok("lex.fbk", src);
  ck_assert_int_eq(fb_program_field(p, 0)->shape[0], 16);
  fb_kernel *k = NULL;
  ck_assert_int_eq(fb_program_instantiate(p, "k", NULL, 0, &k, NULL), 0);
  char *t = fb_kernel_print(k);
  ck_assert_ptr_nonnull(strstr(t, "const.i32 1000"));
  ck_assert_ptr_nonnull(strstr(t, "min.i32"));
  ck_assert_ptr_nonnull(strstr(t, "max.i32"));
  ck_assert_ptr_nonnull(strstr(t, "const.i32 7"));
  ck_assert_ptr_nonnull(strstr(t, "floordiv.i32"));
  ck_assert_ptr_nonnull(strstr(t, "floormod.i32"));
  ck_assert_ptr_nonnull(strstr(t, "shl.i32"));
  ck_assert_ptr_nonnull(strstr(t, "sub.i32"));
  free(t);
  fb_program_free(p);
}
END_TEST

/* The IR of kernel kname of src (which must parse and instantiate). */
static char *kernel_text(const char *src, const char *kname) {
  fb_program *p = parse_ok("t.fbk", src);
  fb_kernel *k = NULL;
  ck_assert_int_eq(fb_program_instantiate(p, kname, NULL, 0, &k, NULL), 0);
  verify_ok(k);
  char *t = fb_kernel_print(k);
  ck_assert_ptr_nonnull(t);
  fb_program_free(p);
  return t;
}

/* `and`, `or`, `not` are `&&`, `||`, `!`; `not` binds like Python's (more
 * loosely than comparisons), and a line ending in `and` goes on. */
START_TEST(word_operators) {
  const char *words = "kernel k(a: i32, b: i32) -> i32 {\n"
                      "  var r = 0\n"
                      "  if a > 0 and b > 0 or not a == b { r = 1 }\n"
                      "  if not a < b and not false { r += 2 }\n"
                      "  if not not (a > 1) or a > 2 and\n"
                      "     b > 3 { r += 4 }\n"
                      "  return r\n"
                      "}\n";
  const char *symbols = "kernel k(a: i32, b: i32) -> i32 {\n"
                        "  var r = 0\n"
                        "  if a > 0 && b > 0 || !(a == b) { r = 1 }\n"
                        "  if !(a < b) && !false { r += 2 }\n"
                        "  if !!(a > 1) || a > 2 && b > 3 { r += 4 }\n"
                        "  return r\n"
                        "}\n";
  char *w = kernel_text(words, "k"), *s = kernel_text(symbols, "k");
  ck_assert_msg(strcmp(w, s) == 0, "words:\n%s\nsymbols:\n%s", w, s);
  free(w);
  free(s);
}
END_TEST

/* Pathological input gets an error, not a stack overflow or a huge kernel. */
START_TEST(limits) {
  size_t n = 100000;
  char *src = malloc(n * 2 + 200);
  ck_assert_ptr_nonnull(src);
  strcpy(src, "layout { place x: i32 }\nkernel k() { x[] = ");
  size_t m = strlen(src);
  for (size_t i = 0; i < n; i++) src[m++] = '(';
  src[m++] = '1';
  for (size_t i = 0; i < n; i++) src[m++] = ')';
  strcpy(src + m, " }\n");
  fb_program *p = NULL;
  fb_diags d;
  fb_diags_init(&d);
  ck_assert_int_eq(fb_program_parse("deep.fbk", src, &p, &d), FB_EPARSE);
  ck_assert_ptr_nonnull(strstr(d.v[0].msg, "nested"));
  fb_diags_free(&d);
  free(src);

  /* each func calls the next twice: 2^40 copies if nothing stopped it */
  char big[8192];
  m = (size_t)snprintf(big, sizeof big,
                       "layout { place x: f32 }\nfunc f40(v: f32) -> f32 { return v + 1.0 }\n");
  for (int i = 39; i >= 0; i--)
    m += (size_t)snprintf(big + m, sizeof big - m,
                          "func f%d(v: f32) -> f32 { return f%d(v) * f%d(v) }\n", i, i + 1, i + 1);
  snprintf(big + m, sizeof big - m, "kernel k() { x[] = f0(x[]) }\n");
  ck_assert_int_eq(fb_program_parse("wide.fbk", big, &p, &d), FB_EPARSE);
  int found = 0;
  for (int i = 0; i < d.n; i++) found += strstr(d.v[i].msg, "too large") != NULL;
  ck_assert_int_gt(found, 0);
  ck_assert_int_le(d.n, 2 * 41); /* one or two per func, not one per copy */
  fb_diags_free(&d);
}
END_TEST

/* Every example under examples/ parses, and all its kernels instantiate
 * (field kernels with the bindings its .json session uses) and verify. */
START_TEST(examples) {
  static const char *const ex[][4] = {
      {"saxpy", "saxpy", "x", "y"}, {"heat", "step", "T", "U"},       {"life", "step", "a", "b"},
      {"divmod", NULL, NULL, NULL}, {"montecarlo", NULL, NULL, NULL}, {"deform", NULL, NULL, NULL},
      {"sparse", NULL, NULL, NULL}, {"wave", NULL, NULL, NULL}};
  for (size_t i = 0; i < sizeof ex / sizeof ex[0]; i++) {
    char rel[128];
    snprintf(rel, sizeof rel, "../examples/%s.fbk", ex[i][0]);
    char *src = fbt_read_file(fbt_path(rel), NULL);
    ck_assert_msg(src != NULL, "missing %s", rel);
    snprintf(rel, sizeof rel, "../examples/%s.json", ex[i][0]);
    char *json = fbt_read_file(fbt_path(rel), NULL);
    ck_assert_msg(json != NULL, "missing %s", rel);
    fb_program *p = parse_ok(ex[i][0], src);
    for (int k = 0; k < fb_program_nkernels(p); k++) {
      const fb_lang_kernel *lk = fb_program_kernel(p, k);
      char quoted[80];
      snprintf(quoted, sizeof quoted, "\"launch\": \"%s\"", lk->name);
      ck_assert_msg(strstr(json, quoted) != NULL, "%s.json never launches %s", ex[i][0], lk->name);
      if (lk->nfield_params && (!ex[i][1] || strcmp(ex[i][1], lk->name))) continue;
      fb_kernel *kk = NULL;
      ck_assert_int_eq(fb_program_instantiate(p, lk->name, &ex[i][2], lk->nfield_params, &kk, NULL),
                       0);
      verify_ok(kk);
    }
    fb_program_free(p);
    free(src);
    free(json);
  }
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("lang");
  TCase *tc = tcase_create("golden");
  goldens = golden_names(&ngoldens);
  tcase_add_loop_test(tc, golden, 0, ngoldens > 0 ? ngoldens : 1);
  tcase_add_test(tc, required_error_goldens);
  suite_add_tcase(s, tc);
  TCase *api = tcase_create("api");
  tcase_add_test(api, api_tables);
  tcase_add_test(api, api_instantiate);
  tcase_add_test(api, render);
  tcase_add_test(api, interleave_warning);
  tcase_add_test(api, truncated_input);
  tcase_add_test(api, lexer_corners);
  tcase_add_test(api, word_operators);
  tcase_add_test(api, limits);
  tcase_add_test(api, examples);
  suite_add_tcase(s, api);
  return s;
}

int main(void) { return fbt_run(suite()); }
