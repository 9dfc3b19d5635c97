/* Tests of the IR text format (ir/print.c, ir/parse.c):
 *  - golden files tests/ir/NAME.ir are canonical: print(parse(file)) == file,
 *    and together they use every op, SNode kind and type;
 *  - error files tests/ir/errors/NAME.ir give exactly NAME.expected;
 *  - kernels made with the builder survive print -> parse with their ids,
 *    ops, types, operands, immediates (to the bit) and block structure;
 *  - truncated files, mutated files and noise never crash the parser, and
 *    whatever it accepts prints back to a fixed point. */
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fusebox/ir.h"
#include "optimizer/sfg.h"
#include "support/support.h"

/* ---------------------------------------------------------------- helpers */

typedef struct names {
  char **v;
  int n;
} names;

static int cmp_str(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Sorted "DIR/NAME.ir" paths of the .ir files in a folder under tests/. */
static names list_ir(const char *dir) {
  names r = {NULL, 0};
  char path[4096];
  snprintf(path, sizeof path, "%s", fbt_path(dir));
  DIR *d = opendir(path);
  ck_assert_msg(d != NULL, "cannot open %s", path);
  struct dirent *e;
  while ((e = readdir(d))) {
    size_t n = strlen(e->d_name);
    if (n < 4 || strcmp(e->d_name + n - 3, ".ir") != 0) continue;
    r.v = realloc(r.v, sizeof(char *) * (size_t)(r.n + 1));
    r.v[r.n] = malloc(strlen(dir) + n + 2);
    sprintf(r.v[r.n++], "%s/%s", dir, e->d_name);
  }
  closedir(d);
  qsort(r.v, (size_t)r.n, sizeof(char *), cmp_str);
  return r;
}

static void names_free(names *r) {
  for (int i = 0; i < r->n; i++) free(r->v[i]);
  free(r->v);
}

static char *read_test_file(const char *rel) {
  char *s = fbt_read_file(fbt_path(rel), NULL);
  ck_assert_msg(s != NULL, "cannot read %s", rel);
  return s;
}

/* The module form: the layout, then each kernel after a blank line. */
static char *print_module(const fb_layout *l, fb_kernel **ks, int n) {
  char *lay = fb_layout_print(l);
  size_t len = strlen(lay) + 1;
  char **parts = calloc((size_t)n + 1, sizeof(char *));
  for (int i = 0; i < n; i++) {
    parts[i] = fb_kernel_print(ks[i]);
    ck_assert_ptr_nonnull(parts[i]);
    len += strlen(parts[i]) + 1;
  }
  char *out = malloc(len);
  strcpy(out, lay);
  for (int i = 0; i < n; i++) {
    strcat(out, "\n");
    strcat(out, parts[i]);
    free(parts[i]);
  }
  free(parts);
  free(lay);
  return out;
}

static void free_kernels(fb_kernel **ks, int n) {
  for (int i = 0; i < n; i++) fb_kernel_free(ks[i]);
  free(ks);
}

typedef struct module {
  fb_layout *l;
  fb_kernel **ks;
  int n;
  int rc;
  char *diags;
  fb_diags d;
} module;

static module parse_text(const char *text) {
  module m;
  memset(&m, 0, sizeof m);
  fb_diags_init(&m.d);
  m.rc = fb_ir_parse(text, &m.l, &m.ks, &m.n, &m.d);
  m.diags = fb_diags_join(&m.d);
  return m;
}

static void module_free(module *m) {
  free_kernels(m->ks, m->n);
  fb_layout_free(m->l);
  fb_diags_free(&m->d);
  free(m->diags);
}

/* First line where two texts differ, for failure messages. */
static int first_diff_line(const char *a, const char *b) {
  int line = 1;
  for (; *a && *a == *b; a++, b++)
    if (*a == '\n') line++;
  return line;
}

/* Anything the parser accepts prints to a fixed point: print(parse(x)) is
 * accepted again and prints the same. Returns the printed form. */
static char *check_fixed_point(const char *text, const char *what) {
  module m = parse_text(text);
  ck_assert_msg(m.rc == 0, "%s: %s", what, m.diags);
  char *p1 = print_module(m.l, m.ks, m.n);
  module m2 = parse_text(p1);
  ck_assert_msg(m2.rc == 0, "%s: its print does not parse: %s\n%s", what, m2.diags, p1);
  char *p2 = print_module(m2.l, m2.ks, m2.n);
  ck_assert_msg(strcmp(p1, p2) == 0, "%s: print is not a fixed point (line %d)", what,
                first_diff_line(p1, p2));
  free(p2);
  module_free(&m);
  module_free(&m2);
  return p1;
}

/* ---------------------------------------------------------------- fused parts */

static const char *const fused_text =
    "layout {\n"
    "  dense(i: 64) {\n    place x: i32\n    place y: f32\n  }\n"
    "  pointer(i: 8) as blocks {\n    dense(i: 8) {\n      place s: f32\n    }\n  }\n"
    "}\n\n"
    "kernel a(i32) {\n  %0 = const.i32 0\n  %1 = arg.i32 0\n"
    "  par_for %2 in %0 .. %1 {\n    %3 = loop_index.i32 %2, 0\n    store x[%3], %3\n  }\n}\n\n"
    "kernel b(i32) {\n  %0 = const.i32 0\n  %1 = arg.i32 0\n"
    "  par_for %2 in %0 .. %1 {\n    %3 = loop_index.i32 %2, 0\n    %4 = const.f32 1.5\n"
    "    store s[%3], %4\n  }\n}\n\n"
    "kernel c(i32) {\n  %0 = const.i32 0\n  %1 = arg.i32 0\n"
    "  par_for %2 in %0 .. %1 {\n    %3 = loop_index.i32 %2, 0\n    %4 = load.f32 s[%3]\n"
    "    %5 = const.f32 2\n    %6 = atomic_add.f32 s[%3], %5\n    store y[%3], %4\n  }\n}\n";

static fb_task_meta *meta_or_die(const fb_kernel *k) {
  fb_task_meta *m = NULL;
  char err[160];
  ck_assert_msg(fb_meta_compute(k, &m, err, sizeof err) == 0, "%s", err);
  return m;
}

/* A kernel fused from three launches keeps each statement's part (fb_stmt.part)
 * through print -> parse: fb_kernel_equal holds (it compares parts), the
 * text says "part N" only where N is not 0, and the reparsed kernel prints
 * the same. Unfused texts stay as they were (no "part" anywhere). */
START_TEST(test_fused_parts_round_trip) {
  module m = parse_text(fused_text);
  ck_assert_msg(m.rc == 0, "%s", m.diags);
  ck_assert_int_eq(m.n, 3);
  fb_task_meta *ma = meta_or_die(m.ks[0]), *mb = meta_or_die(m.ks[1]), *mc = meta_or_die(m.ks[2]);
  fb_kernel *ab = fb_ir_fuse(m.ks[0], ma, 1, m.ks[1], mb, 0);
  ck_assert_ptr_nonnull(ab);
  fb_task_meta *mab = meta_or_die(ab);
  fb_kernel *abc = fb_ir_fuse(ab, mab, 2, m.ks[2], mc, 0);
  ck_assert_ptr_nonnull(abc);
  int seen[3] = {0, 0, 0};
  for (int i = 0; i < abc->nstmts; i++)
    if (abc->stmts[i].part >= 0 && abc->stmts[i].part < 3) seen[abc->stmts[i].part]++;
  ck_assert_msg(seen[0] && seen[1] && seen[2], "parts %d %d %d", seen[0], seen[1], seen[2]);

  char *text = fb_kernel_print(abc);
  ck_assert_ptr_nonnull(text);
  ck_assert_msg(strstr(text, "part 1 store s[") && strstr(text, "part 2 %") &&
                    !strstr(text, "part 0"),
                "%s", text);
  fb_kernel **ks = NULL;
  int n = 0;
  fb_diags d;
  fb_diags_init(&d);
  int rc = fb_ir_parse_kernels(text, m.l, &ks, &n, &d);
  char *dj = fb_diags_join(&d);
  ck_assert_msg(rc == 0 && n == 1, "%s\n%s", dj, text);
  free(dj);
  ck_assert_msg(fb_kernel_equal(abc, ks[0]), "parse(print(fused)) != fused:\n%s", text);
  for (int i = 0; i < abc->nstmts && i < ks[0]->nstmts; i++)
    ck_assert_int_eq(ks[0]->stmts[i].part, abc->stmts[i].part);
  char *again = fb_kernel_print(ks[0]);
  ck_assert_str_eq(again, text);
  free(again);
  free_kernels(ks, n);
  fb_diags_free(&d);

  /* the parts printed unfused are all 0: no prefix */
  char *plain = print_module(m.l, m.ks, m.n);
  ck_assert_ptr_null(strstr(plain, "part"));
  free(plain);
  free(text);
  fb_kernel_free(abc);
  fb_kernel_free(ab);
  fb_meta_free(ma);
  fb_meta_free(mb);
  fb_meta_free(mc);
  fb_meta_free(mab);
  module_free(&m);
}
END_TEST

/* "part N" takes 0 to FB_IR_MAX_PART, and says so; the verifier refuses a
 * part out of that range made by other means. */
START_TEST(test_part_prefix_errors) {
  static const char *const bad[] = {"part -1 store x[%0], %0\n",
                                    "part 1073741823 store x[%0], %0\n", "part store x[%0], %0\n"};
  for (int i = 0; i < 3; i++) {
    char text[512];
    snprintf(text, sizeof text,
             "layout {\n  dense(i: 4) {\n    place x: i32\n  }\n}\n\n"
             "kernel k() {\n  %%0 = const.i32 1\n  %s}\n",
             bad[i]);
    module m = parse_text(text);
    ck_assert_msg(m.rc == FB_EPARSE, "%s: rc %d", bad[i], m.rc);
    ck_assert_msg(strstr(m.diags, "a fused part"), "%s: %s", bad[i], m.diags);
    module_free(&m);
  }
  module m = parse_text("layout {\n  dense(i: 4) {\n    place x: i32\n  }\n}\n\n"
                        "kernel k() {\n  %0 = const.i32 1\n  part 3 store x[%0], %0\n}\n");
  ck_assert_msg(m.rc == 0, "%s", m.diags);
  ck_assert_int_eq(m.ks[0]->stmts[1].part, 3);
  fb_diags d;
  fb_diags_init(&d);
  ck_assert_int_eq(fb_verify(m.ks[0], &d), 0);
  m.ks[0]->stmts[1].part = -2;
  ck_assert_int_ne(fb_verify(m.ks[0], &d), 0);
  char *dj = fb_diags_join(&d);
  ck_assert_msg(strstr(dj, "fused part -2 is out of range"), "%s", dj);
  free(dj);
  fb_diags_free(&d);
  module_free(&m);
}
END_TEST

/* ---------------------------------------------------------------- goldens */

START_TEST(test_goldens_round_trip) {
  names g = list_ir("ir");
  ck_assert_int_ge(g.n, 6);
  for (int i = 0; i < g.n; i++) {
    char *text = read_test_file(g.v[i]);
    module m = parse_text(text);
    ck_assert_msg(m.rc == 0, "%s does not parse:\n%s", g.v[i], m.diags);
    ck_assert_int_eq(m.d.n, 0);
    ck_assert_int_eq(m.l->finalized, 1);
    char *out = print_module(m.l, m.ks, m.n);
    ck_assert_msg(strcmp(out, text) == 0, "%s is not canonical: first difference on line %d",
                  g.v[i], first_diff_line(out, text));
    free(check_fixed_point(text, g.v[i]));
    free(out);
    free(text);
    module_free(&m);
  }
  names_free(&g);
}
END_TEST

static void mark_block(const fb_kernel *k, int blk, int *ops, int *types, int depth) {
  ck_assert_int_lt(depth, 64);
  for (int i = 0; i < k->blocks[blk].n; i++) {
    const fb_stmt *s = &k->stmts[k->blocks[blk].ids[i]];
    ops[s->op] = 1;
    types[s->type] = 1;
    if (s->body >= 0) mark_block(k, s->body, ops, types, depth + 1);
    if (s->orelse >= 0) mark_block(k, s->orelse, ops, types, depth + 1);
  }
}

/* The goldens together use every op of the table, every SNode kind, every
 * type as a result, and every non-void type as a field. A new op fails
 * this test until a golden file shows it. */
START_TEST(test_goldens_cover_everything) {
  int ops[FB_OP__COUNT] = {0}, types[FB_T__COUNT] = {0}, fields[FB_T__COUNT] = {0};
  int kinds[FB_SN_PLACE + 1] = {0}, nested_else = 0, quoted = 0;
  names g = list_ir("ir");
  for (int i = 0; i < g.n; i++) {
    char *text = read_test_file(g.v[i]);
    module m = parse_text(text);
    ck_assert_msg(m.rc == 0, "%s: %s", g.v[i], m.diags);
    for (int s = 0; s < m.l->nnodes; s++) {
      kinds[m.l->nodes[s].kind] = 1;
      if (m.l->nodes[s].kind == FB_SN_PLACE) fields[m.l->nodes[s].type] = 1;
    }
    for (int k = 0; k < m.n; k++) mark_block(m.ks[k], 0, ops, types, 0);
    nested_else |= strstr(text, "    } else {") != NULL;
    quoted |= strstr(text, "\"") != NULL;
    free(text);
    module_free(&m);
  }
  names_free(&g);
  for (int op = 0; op < FB_OP__COUNT; op++)
    ck_assert_msg(ops[op], "no golden file uses op '%s'", fb_op_table[op].name);
  for (int k = FB_SN_DENSE; k <= FB_SN_PLACE; k++)
    ck_assert_msg(kinds[k], "no golden file has a %s SNode", fb_snode_kind_name((fb_snode_kind)k));
  for (int t = 0; t < FB_T__COUNT; t++) {
    ck_assert_msg(types[t], "no golden statement has type %s", fb_type_name((fb_type)t));
    if (t != FB_T_VOID)
      ck_assert_msg(fields[t], "no golden field has type %s", fb_type_name((fb_type)t));
  }
  ck_assert(nested_else);
  ck_assert(quoted);
}
END_TEST

/* ---------------------------------------------------------------- errors */

START_TEST(test_error_files) {
  names g = list_ir("ir/errors");
  ck_assert_int_ge(g.n, 10);
  for (int i = 0; i < g.n; i++) {
    char *text = read_test_file(g.v[i]);
    char exp_path[4096];
    snprintf(exp_path, sizeof exp_path, "%.*s.expected", (int)strlen(g.v[i]) - 3, g.v[i]);
    char *expected = read_test_file(exp_path);
    module m = parse_text(text);
    ck_assert_msg(m.rc == FB_EPARSE, "%s: rc %d, expected FB_EPARSE", g.v[i], m.rc);
    ck_assert_ptr_null(m.l);
    ck_assert_ptr_null(m.ks);
    ck_assert_int_eq(m.n, 0);
    ck_assert_msg(strcmp(m.diags, expected) == 0,
                  "%s: diagnostics differ\n--- got\n%s--- expected\n%s", g.v[i], m.diags, expected);
    for (int d = 0; d < m.d.n; d++) { /* line and col are filled and match the text */
      char pre[32];
      snprintf(pre, sizeof pre, "%d:%d: ", m.d.v[d].line, m.d.v[d].col);
      ck_assert_int_gt(m.d.v[d].line, 0);
      ck_assert_int_gt(m.d.v[d].col, 0);
      ck_assert_msg(strncmp(m.d.v[d].msg, pre, strlen(pre)) == 0, "%s: '%s'", g.v[i], m.d.v[d].msg);
      if (d) ck_assert(m.d.v[d].line >= m.d.v[d - 1].line);
    }
    free(text);
    free(expected);
    module_free(&m);
  }
  names_free(&g);
}
END_TEST

START_TEST(test_several_errors_reported) {
  const char *text = "layout {\n  place x: f32\n}\n\nkernel k() {\n"
                     "  %0 = const.i32 1\n  %1 = bogus.i32 %0\n  %2 = add.f99 %0, %0\n"
                     "  %3 = load.f32 y[]\n  %4 = add.i32 %0, %8\n  %0 = const.i32 2\n";
  module m = parse_text(text);
  ck_assert_int_eq(m.rc, FB_EPARSE);
  ck_assert_str_eq(m.diags,
                   "7:8: unknown op 'bogus'\n"
                   "8:12: unknown type 'f99'\n"
                   "9:17: unknown field 'y'\n"
                   "10:20: undefined %8\n"
                   "11:3: duplicate id %0 (first defined at 6:3)\n"
                   "12:1: unexpected end of file: missing '}' to close kernel 'k' opened at 5:1\n");
  module_free(&m);
}
END_TEST

/* New diagnostics are added after what the caller's list held. */
START_TEST(test_diags_appended) {
  fb_diags d;
  fb_layout *l = NULL;
  fb_kernel **ks = NULL;
  int n = -1;
  fb_diags_init(&d);
  fb_diags_add(&d, 3, 0, 0, "earlier");
  ck_assert_int_eq(fb_ir_parse("layout {\n}\nkernel k( {\n}\n", &l, &ks, &n, &d), FB_EPARSE);
  ck_assert_int_eq(d.n, 2);
  ck_assert_str_eq(d.v[0].msg, "earlier");
  ck_assert_str_eq(d.v[1].msg, "3:11: expected a type, found '{'");
  ck_assert_int_eq(d.v[1].line, 3);
  ck_assert_int_eq(d.v[1].col, 11);
  ck_assert_int_eq(d.v[1].stmt, -1);
  ck_assert_ptr_null(l);
  ck_assert_ptr_null(ks);
  ck_assert_int_eq(n, 0);
  fb_diags_free(&d);
}
END_TEST

/* ---------------------------------------------------------------- builder round trip */

/* Non-preorder ids on purpose: containers first, fields after. */
static fb_layout *build_layout(void) {
  fb_layout *l = fb_layout_new();
  int64_t s88[2] = {8, 8}, s4[1] = {4}, s64[1] = {64}, s16[1] = {16};
  int grid = fb_layout_add(l, 0, FB_SN_DENSE, "ij", s88, 0, "grid");
  int ptr = fb_layout_add(l, 0, FB_SN_POINTER, "i", s4, 0, NULL);
  int bm = fb_layout_add(l, ptr, FB_SN_BITMASKED, "i", s16, 0, NULL);
  int lists = fb_layout_add(l, 0, FB_SN_DENSE, "i", s4, 0, NULL);
  int dyn = fb_layout_add(l, lists, FB_SN_DYNAMIC, "j", s64, 8, "bag");
  ck_assert(grid > 0 && ptr > 0 && bm > 0 && lists > 0 && dyn > 0);
  ck_assert_int_gt(fb_layout_place(l, grid, "u", FB_T_F32), 0);
  ck_assert_int_gt(fb_layout_place(l, grid, "flags", FB_T_U32), 0);
  ck_assert_int_gt(fb_layout_place(l, bm, "p", FB_T_F64), 0);
  ck_assert_int_gt(fb_layout_place(l, dyn, "d", FB_T_I32), 0);
  ck_assert_int_gt(fb_layout_place(l, 0, "sum", FB_T_I64), 0);
  ck_assert_int_eq(fb_layout_finalize(l, NULL, 0), 0);
  return l;
}

static int node(const fb_layout *l, const char *name) {
  int id = fb_layout_find(l, name);
  ck_assert_int_ge(id, 0);
  return id;
}

/* One kernel through every builder call. Some statements are emitted out
 * of text order (a body filled after the statement that follows it), so
 * the printer needs %N: labels to keep the ids. */
static fb_kernel *build_kernel(const fb_layout *l) {
  fb_type params[3] = {FB_T_I32, FB_T_F32, FB_T_U64};
  fb_kernel *k = fb_kernel_new(l, "builder.t0", 3, params, FB_T_F64);
  fb_builder b;
  fb_builder_init(&b, k);
  int a0 = fb_b_arg(&b, 0), a1 = fb_b_arg(&b, 1), a2 = fb_b_arg(&b, 2);
  int c0 = fb_b_const_i32(&b, 0), c8 = fb_b_const_i32(&b, -8);
  fb_b_const_i64(&b, INT64_MIN);
  fb_b_const_u32(&b, 4000000000u);
  fb_b_const_u64(&b, UINT64_MAX);
  int cf = fb_b_const_f32(&b, 0.1f);
  int cd = fb_b_const_f64(&b, -1e-300);
  int cb = fb_b_const_bool(&b, 1);
  fb_b_const(&b, fb_value_f64(NAN));
  fb_b_const(&b, fb_value_f32(-INFINITY));
  int sum = fb_b_binary(&b, FB_OP_ADD, a0, c8);
  int cmp = fb_b_binary(&b, FB_OP_LT, sum, c0);
  int neg = fb_b_unary(&b, FB_OP_NEG, a1);
  int sq = fb_b_unary(&b, FB_OP_SQRT, neg);
  int sel = fb_b_select(&b, cmp, sq, cf);
  int dbl = fb_b_cast(&b, FB_T_F64, sel);
  int var = fb_b_alloca(&b, FB_T_F64);
  fb_b_lstore(&b, var, cd);
  int idx[2] = {c0, a0};
  int u = node(l, "u"), p = node(l, "p"), d = node(l, "d"), flags = node(l, "flags");
  int ld = fb_b_load(&b, u, idx, 2);
  fb_b_store(&b, u, idx, 2, ld);
  fb_b_global(&b, FB_OP_ATOMIC_MAX, u, idx, 2, neg);
  fb_b_global(&b, FB_OP_ATOMIC_XOR, flags, idx, 2, fb_b_cast(&b, FB_T_U32, a2));
  fb_b_global(&b, FB_OP_ACTIVATE, l->nodes[p].parent, idx, 1, -1);
  fb_b_global(&b, FB_OP_IS_ACTIVE, node(l, "bag"), idx, 2, -1);
  int app = fb_b_global(&b, FB_OP_APPEND, d, idx, 1, c8);
  fb_b_global(&b, FB_OP_LENGTH, d, idx, 1, -1);
  fb_b_hint_unique(&b, app, d);
  fb_b_gtmp_store(&b, dbl, 24);
  int gl = fb_b_gtmp_load(&b, FB_T_F64, 24);
  int iff = fb_b_if(&b, cb, 1);
  int after = fb_b_lload(&b, var); /* emitted before the if's bodies */
  int saved = fb_b_enter(&b, k->stmts[iff].body);
  int wh = fb_b_while(&b);
  int s2 = fb_b_enter(&b, k->stmts[wh].body);
  fb_b_break(&b);
  fb_b_continue(&b);
  fb_b_leave(&b, s2);
  fb_b_leave(&b, saved);
  saved = fb_b_enter(&b, k->stmts[iff].orelse);
  fb_b_ret(&b, gl, 1);
  fb_b_leave(&b, saved);
  int pf = fb_b_range_for(&b, c0, a0, 1);
  saved = fb_b_enter(&b, k->stmts[pf].body);
  int i = fb_b_loop_index(&b, pf, 0);
  int rf = fb_b_range_for(&b, c0, c8, 0);
  s2 = fb_b_enter(&b, k->stmts[rf].body);
  fb_b_store(&b, p, &i, 1, fb_b_cast(&b, FB_T_F64, fb_b_rand(&b, 5)));
  fb_b_leave(&b, s2);
  fb_b_leave(&b, saved);
  int sf = fb_b_struct_for(&b, node(l, "grid"));
  saved = fb_b_enter(&b, k->stmts[sf].body);
  int j = fb_b_loop_index(&b, sf, 1);
  int jj[2] = {j, j};
  fb_b_store(&b, u, jj, 2, cf);
  fb_b_leave(&b, saved);
  fb_b_ret(&b, after, 0);
  ck_assert_int_eq(b.err, 0);
  return k;
}

/* The same program: ids, ops, types, operands, immediates (to the bit) and
 * SNodes (by name, or by position when unnamed), block by block. */
static int same_node(const fb_layout *la, int a, const fb_layout *lb, int b) {
  if (a < 0 || b < 0) return a == b;
  if (a == 0 || b == 0) return a == b;
  const fb_snode *x = &la->nodes[a], *y = &lb->nodes[b];
  if (x->kind != y->kind || (x->name == NULL) != (y->name == NULL)) return 0;
  if (x->name && strcmp(x->name, y->name) != 0) return 0;
  return same_node(la, x->parent, lb, y->parent);
}

static void check_same_block(const fb_kernel *a, int ba, const fb_kernel *b, int bb) {
  ck_assert_int_eq(ba < 0, bb < 0);
  if (ba < 0) return;
  ck_assert_int_eq(a->blocks[ba].n, b->blocks[bb].n);
  for (int i = 0; i < a->blocks[ba].n; i++) {
    int id = a->blocks[ba].ids[i];
    ck_assert_int_eq(id, b->blocks[bb].ids[i]);
    const fb_stmt *x = &a->stmts[id], *y = &b->stmts[id];
    ck_assert_msg(x->op == y->op && x->type == y->type && x->nargs == y->nargs,
                  "%%%d: %s.%s/%d became %s.%s/%d", id, fb_op_table[x->op].name,
                  fb_type_name(x->type), x->nargs, fb_op_table[y->op].name, fb_type_name(y->type),
                  y->nargs);
    for (int j = 0; j < x->nargs; j++) ck_assert_int_eq(x->args[j], y->args[j]);
    ck_assert_msg(memcmp(&x->imm, &y->imm, sizeof x->imm) == 0, "%%%d: imm bits differ", id);
    ck_assert_msg(same_node(a->layout, x->snode, b->layout, y->snode), "%%%d: snode differs", id);
    check_same_block(a, x->body, b, y->body);
    check_same_block(a, x->orelse, b, y->orelse);
  }
}

static void check_same_kernel(const fb_kernel *a, const fb_kernel *b) {
  ck_assert_str_eq(a->name, b->name);
  ck_assert_int_eq(a->nparams, b->nparams);
  for (int i = 0; i < a->nparams; i++) ck_assert_int_eq(a->params[i], b->params[i]);
  ck_assert_int_eq(a->ret, b->ret);
  check_same_block(a, 0, b, 0);
}

START_TEST(test_builder_round_trip) {
  fb_layout *l = build_layout();
  fb_kernel *k = build_kernel(l);
  char *text = fb_kernel_print(k);
  ck_assert_ptr_nonnull(text);
  /* the while after the out-of-order lload needs a label */
  ck_assert_ptr_nonnull(strstr(text, ": while {\n"));
  ck_assert_ptr_nonnull(strstr(text, "is_active.bool bag["));
  ck_assert_ptr_nonnull(strstr(text, "activate @1.0[")); /* unnamed bitmasked */

  /* against the same layout */
  fb_kernel **ks = NULL;
  int n = 0;
  fb_diags d;
  fb_diags_init(&d);
  int rc = fb_ir_parse_kernels(text, l, &ks, &n, &d);
  char *dj = fb_diags_join(&d);
  ck_assert_msg(rc == 0, "%s\n%s", dj, text);
  free(dj);
  ck_assert_int_eq(n, 1);
  ck_assert_ptr_eq(ks[0]->layout, l);
  check_same_kernel(k, ks[0]);
  char *again = fb_kernel_print(ks[0]);
  ck_assert_str_eq(again, text);
  free(again);
  free_kernels(ks, n);

  /* as a module: a new layout (ids renumbered in text order) */
  char *mod = print_module(l, &k, 1);
  module m = parse_text(mod);
  ck_assert_msg(m.rc == 0, "%s", m.diags);
  ck_assert_int_eq(m.l->nnodes, l->nnodes);
  ck_assert(fb_layout_find(m.l, "u") != fb_layout_find(l, "u")); /* really renumbered */
  check_same_kernel(k, m.ks[0]);
  char *mod2 = print_module(m.l, m.ks, m.n);
  ck_assert_str_eq(mod2, mod);
  free(mod2);
  module_free(&m);
  free(mod);
  fb_diags_free(&d);
  free(text);
  fb_kernel_free(k);
  fb_layout_free(l);
}
END_TEST

/* A preorder layout comes back the same, to its hash and memory layout. */
START_TEST(test_layout_round_trip) {
  fb_layout *l = fb_layout_new();
  int64_t s[4] = {2, 3, 4, 5}, s1[1] = {100};
  int a = fb_layout_add(l, 0, FB_SN_DENSE, "ijkl", s, 0, "four");
  ck_assert_int_gt(fb_layout_place(l, a, "w", FB_T_BOOL), 0);
  int p = fb_layout_add(l, 0, FB_SN_POINTER, "k", s1, 0, NULL);
  int dy = fb_layout_add(l, p, FB_SN_DYNAMIC, "i", s1, 7, NULL);
  ck_assert_int_gt(fb_layout_place(l, dy, "with space", FB_T_U64), 0);
  ck_assert_int_eq(fb_layout_finalize(l, NULL, 0), 0);
  char *text = fb_layout_print(l);
  ck_assert_str_eq(text, "layout {\n"
                         "  dense(ijkl: 2, 3, 4, 5) as four {\n"
                         "    place w: bool\n"
                         "  }\n"
                         "  pointer(k: 100) {\n"
                         "    dynamic(i: 100, chunk: 7) {\n"
                         "      place \"with space\": u64\n"
                         "    }\n"
                         "  }\n"
                         "}\n");
  module m = parse_text(text);
  ck_assert_msg(m.rc == 0, "%s", m.diags);
  ck_assert_int_eq(m.n, 0);
  ck_assert_ptr_null(m.ks);
  ck_assert_uint_eq(fb_layout_hash(m.l), fb_layout_hash(l));
  ck_assert_uint_eq(m.l->root_bytes, l->root_bytes);
  module_free(&m);
  free(text);
  fb_layout_free(l);
  char *empty = fb_layout_print(NULL);
  ck_assert_str_eq(empty, "layout {\n}\n");
  free(empty);
}
END_TEST

/* Float constants come back to the same bits: specials, boundaries and a
 * spread of pseudo-random bit patterns of both widths. */
static uint64_t lcg(uint64_t *s) {
  *s = *s * 6364136223846793005ull + 1442695040888963407ull;
  return *s >> 11 ^ *s << 29;
}

START_TEST(test_float_bits) {
  fb_layout *l = fb_layout_new();
  ck_assert_int_eq(fb_layout_finalize(l, NULL, 0), 0);
  fb_kernel *k = fb_kernel_new(l, "floats", 0, NULL, FB_T_VOID);
  fb_builder b;
  fb_builder_init(&b, k);
  const double specials[] = {0.0,
                             -0.0,
                             1.0,
                             -1.0,
                             0.1,
                             1e-310,
                             5e-324,
                             1.7976931348623157e308,
                             INFINITY,
                             -INFINITY,
                             NAN,
                             100.0,
                             1e16,
                             1e17,
                             123456.789,
                             0.0001,
                             0.00001,
                             2.2250738585072014e-308,
                             9007199254740993.0};
  for (size_t i = 0; i < sizeof specials / sizeof *specials; i++) {
    fb_b_const_f64(&b, specials[i]);
    fb_b_const_f32(&b, (float)specials[i]);
  }
  const float f32s[] = {1.17549435e-38f, 1e-45f, 3.40282347e38f, 16777217.0f, 0.3f};
  for (size_t i = 0; i < sizeof f32s / sizeof *f32s; i++) fb_b_const_f32(&b, f32s[i]);
  uint64_t seed = 42;
  for (int i = 0; i < 2000; i++) {
    uint64_t w = lcg(&seed);
    double dv;
    memcpy(&dv, &w, 8);
    fb_b_const_f64(&b, dv);
    uint32_t w32 = (uint32_t)(w >> 17);
    float fv;
    memcpy(&fv, &w32, 4);
    fb_b_const_f32(&b, fv);
  }
  ck_assert_int_eq(b.err, 0);
  char *text = fb_kernel_print(k);
  fb_kernel **ks;
  int n;
  fb_diags d;
  fb_diags_init(&d);
  ck_assert_int_eq(fb_ir_parse_kernels(text, l, &ks, &n, &d), 0);
  ck_assert_int_eq(ks[0]->nstmts, k->nstmts);
  for (int i = 0; i < k->nstmts; i++) {
    const fb_stmt *x = &k->stmts[i], *y = &ks[0]->stmts[i];
    ck_assert_int_eq(x->type, y->type);
    if (x->type == FB_T_F32) {
      float fx = (float)x->imm.f, fy = (float)y->imm.f;
      ck_assert_msg(memcmp(&fx, &fy, 4) == 0, "%%%d: f32 %a came back as %a", i, fx, fy);
    }
    ck_assert_msg(memcmp(&x->imm, &y->imm, 8) == 0, "%%%d: %a came back as %a", i, x->imm.f,
                  y->imm.f);
  }
  /* spot checks of the spelling */
  ck_assert_ptr_nonnull(strstr(text, "= const.f64 0.1\n"));
  ck_assert_ptr_nonnull(strstr(text, "= const.f32 0.1\n"));
  ck_assert_ptr_nonnull(strstr(text, "= const.f64 -0.0\n"));
  ck_assert_ptr_nonnull(strstr(text, "= const.f64 100.0\n"));
  ck_assert_ptr_nonnull(strstr(text, "= const.f64 1e-05\n"));
  ck_assert_ptr_nonnull(strstr(text, "= const.f64 -inf\n"));
  ck_assert_ptr_nonnull(strstr(text, "= const.f32 nan\n"));
  ck_assert_ptr_nonnull(strstr(text, "= const.f32 16777216.0\n"));
  free_kernels(ks, n);
  fb_diags_free(&d);
  free(text);
  fb_kernel_free(k);
  fb_layout_free(l);
}
END_TEST

/* ---------------------------------------------------------------- text details */

/* Comments, blank lines, tabs, CRLF and spacing do not matter; the result
 * prints as the canonical golden. */
START_TEST(test_comments_and_spacing) {
  const char *messy = "# a module with comments\r\n"
                      "\r\n"
                      "layout{# the layout\r\n"
                      "\tdense( ij :64,64 ){\r\n"
                      "    place x:f32   # first field\r\n"
                      "    place\ty : f32\r\n"
                      "  }\r\n"
                      "  place loss: f32\r\n"
                      "}\r\n"
                      "kernel saxpy( f32 ){\r\n"
                      "  %0=arg.f32 0\r\n"
                      "  %1 = const.i32 0x0\r\n"
                      "  %2 = const.i32 +64   # hex and signs are read too\r\n"
                      "  par_for %3 in %1..%2 {\r\n"
                      "    range_for %4 in %1 .. %2{\r\n"
                      "      %5 = loop_index.i32 %3,0\r\n"
                      "      %6 = loop_index.i32 %4 , 0\r\n"
                      "      %7 = load.f32 x[ %5,%6 ]\r\n"
                      "      %8 = mul.f32 %0, %7\r\n"
                      "      %9 = load.f32 y[%5, %6]\r\n"
                      "      %10 = add.f32 %8, %9\r\n"
                      "      store \"y\"[%5, %6], %10  # a quoted name is the same name\r\n"
                      "}}}\r\n";
  /* "}}}" is one line with three braces: not the line-per-brace form */
  module m = parse_text(messy);
  ck_assert_int_eq(m.rc, FB_EPARSE);
  module_free(&m);
  char *fixed = malloc(strlen(messy) + 1024);
  strcpy(fixed, messy);
  char *end = strstr(fixed, "}}}\r\n");
  strcpy(end, "    }\r\n  }\r\n}\r\n\nkernel total() -> f32 {\n  %0 = const.f32 0\n"
              "  store loss[], %0\n  struct_for %2 over x {\n    %3 = loop_index.i32 %2, 0\n"
              "    %4 = loop_index.i32 %2, 1\n    %5 = load.f32 x[%3, %4]\n"
              "    %6 = atomic_add.f32 loss[], %5\n  }\n  %7 = load.f32 loss[]\n  ret %7, 0\n}");
  char *golden = read_test_file("ir/saxpy.ir");
  char *out = check_fixed_point(fixed, "messy saxpy");
  ck_assert_str_eq(out, golden);
  free(out);
  free(golden);
  free(fixed);
}
END_TEST

/* Ids are kept as written; a statement without one takes the previous id
 * + 1, or the first id above all ids in use when that one is written
 * elsewhere; holes are placeholders in no block. */
START_TEST(test_implicit_ids) {
  const char *text = "layout {\n  place x: i32\n}\n\nkernel k() {\n"
                     "  %0 = const.i32 1\n"
                     "  store x[], %0\n"   /* 1 is written below: gets 5 */
                     "  %1 = add.i32 %0, %0\n"
                     "  %4 = add.i32 %1, %1\n"
                     "  store x[], %4\n"   /* 5 taken: gets 6 */
                     "  %2: store x[], %1\n"
                     "  store x[], %1\n"   /* 3 */
                     "}\n";
  module m = parse_text(text);
  ck_assert_msg(m.rc == 0, "%s", m.diags);
  const fb_kernel *k = m.ks[0];
  ck_assert_int_eq(k->nstmts, 7);
  const int order[] = {0, 5, 1, 4, 6, 2, 3};
  ck_assert_int_eq(k->blocks[0].n, 7);
  for (int i = 0; i < 7; i++) ck_assert_int_eq(k->blocks[0].ids[i], order[i]);
  ck_assert_int_eq(k->stmts[5].op, FB_OP_STORE);
  char *out = fb_kernel_print(k);
  ck_assert_str_eq(out, "kernel k() {\n"
                        "  %0 = const.i32 1\n"
                        "  %5: store x[], %0\n"
                        "  %1 = add.i32 %0, %0\n"
                        "  %4 = add.i32 %1, %1\n"
                        "  %6: store x[], %4\n"
                        "  %2: store x[], %1\n"
                        "  store x[], %1\n"
                        "}\n");
  free(out);
  module_free(&m);

  m = parse_text("layout {\n}\n\nkernel gaps() {\n  %7 = const.f64 2.0\n  %3 = neg.f64 %7\n}\n");
  ck_assert_msg(m.rc == 0, "%s", m.diags);
  k = m.ks[0];
  ck_assert_int_eq(k->nstmts, 8);
  ck_assert_int_eq(fb_kernel_count_stmts(k), 2);
  for (int id = 0; id < 8; id++) {
    if (id == 3 || id == 7) continue;
    ck_assert_int_eq(k->stmts[id].op, FB_OP_CONST); /* placeholder */
    ck_assert_int_eq(k->stmts[id].type, FB_T_VOID);
    ck_assert_int_eq(k->stmts[id].nargs, 0);
    ck_assert_int_eq(fb_kernel_block_of(k, id, NULL), -1);
  }
  ck_assert_int_eq(k->stmts[3].args[0], 7);
  module_free(&m);
}
END_TEST

START_TEST(test_quoted_names) {
  fb_layout *l = fb_layout_new();
  ck_assert_int_gt(fb_layout_place(l, 0, "f\"i\\e\nld\x01\xc3\xa9", FB_T_F32), 0);
  ck_assert_int_eq(fb_layout_finalize(l, NULL, 0), 0);
  fb_kernel *k = fb_kernel_new(l, "my kernel #1", 0, NULL, FB_T_VOID);
  fb_builder b;
  fb_builder_init(&b, k);
  fb_b_store(&b, 1, NULL, 0, fb_b_const_f32(&b, 2.0f));
  char *mod = print_module(l, &k, 1);
  ck_assert_str_eq(mod, "layout {\n  place \"f\\\"i\\\\e\\x0ald\\x01\\xc3\\xa9\": f32\n}\n\n"
                        "kernel \"my kernel #1\"() {\n  %0 = const.f32 2.0\n"
                        "  store \"f\\\"i\\\\e\\x0ald\\x01\\xc3\\xa9\"[], %0\n}\n");
  module m = parse_text(mod);
  ck_assert_msg(m.rc == 0, "%s", m.diags);
  ck_assert_str_eq(m.ks[0]->name, "my kernel #1");
  ck_assert_str_eq(m.l->nodes[1].name, l->nodes[1].name);
  ck_assert_int_eq(m.ks[0]->stmts[1].snode, 1);
  module_free(&m);
  free(mod);
  fb_kernel_free(k);
  fb_layout_free(l);
}
END_TEST

START_TEST(test_parse_kernels_mode) {
  fb_layout *l = build_layout();
  fb_kernel **ks = (fb_kernel **)1;
  int n = -1;
  fb_diags d;
  fb_diags_init(&d);
  ck_assert_int_eq(fb_ir_parse_kernels("", l, &ks, &n, &d), 0);
  ck_assert_int_eq(n, 0);
  ck_assert_int_eq(fb_ir_parse_kernels("# only a comment\n\n", l, &ks, &n, &d), 0);
  ck_assert_int_eq(d.n, 0);
  ck_assert_int_eq(
      fb_ir_parse_kernels("layout {\n  place z: f32\n}\nkernel a() {\n}\n", l, &ks, &n, &d),
      FB_EPARSE);
  ck_assert_int_eq(d.n, 1);
  ck_assert_str_eq(
      d.v[0].msg,
      "1:1: a layout block is not allowed here: kernels are parsed against a given layout");
  ck_assert_ptr_null(ks);
  fb_diags_free(&d);
  const char *two = "kernel a() {\n  %0 = const.i32 1\n  %1 = load.f32 u[%0, %0]\n}\n\n"
                    "kernel b(i32) -> i32 {\n  %0 = arg.i32 0\n  ret %0, 0\n}\n";
  ck_assert_int_eq(fb_ir_parse_kernels(two, l, &ks, &n, &d), 0);
  ck_assert_int_eq(n, 2);
  ck_assert_int_eq(ks[0]->stmts[1].snode, fb_layout_find(l, "u"));
  ck_assert_str_eq(ks[1]->name, "b");
  ck_assert_int_eq(ks[1]->ret, FB_T_I32);
  free_kernels(ks, n);
  /* bad arguments */
  ck_assert_int_eq(fb_ir_parse_kernels(NULL, l, &ks, &n, &d), FB_EINVAL);
  ck_assert_int_eq(fb_ir_parse_kernels("", NULL, &ks, &n, &d), FB_EINVAL);
  fb_layout *ol;
  ck_assert_int_eq(fb_ir_parse(NULL, &ol, &ks, &n, &d), FB_EINVAL);
  ck_assert_int_eq(fb_ir_parse("layout {\n}\n", NULL, &ks, &n, &d), FB_EINVAL);
  /* diags may be NULL: errors are still counted */
  ck_assert_int_eq(fb_ir_parse("layout {\n", &ol, &ks, &n, NULL), FB_EPARSE);
  ck_assert_int_eq(fb_ir_parse("layout {\n}\n", &ol, &ks, &n, NULL), 0);
  fb_layout_free(ol);
  free(ks);
  fb_layout_free(l);
}
END_TEST

START_TEST(test_fprint) {
  fb_layout *l = build_layout();
  fb_kernel *k = build_kernel(l);
  FILE *f = tmpfile();
  ck_assert_ptr_nonnull(f);
  fb_kernel_fprint(f, k);
  long n = ftell(f);
  rewind(f);
  char *buf = calloc((size_t)n + 1, 1);
  ck_assert_int_eq(fread(buf, 1, (size_t)n, f), n);
  fclose(f);
  char *s = fb_kernel_print(k);
  ck_assert_str_eq(buf, s);
  free(s);
  free(buf);
  fb_kernel_free(k);
  fb_layout_free(l);
}
END_TEST

/* IR the verifier would refuse still prints, in a form that tells what is
 * wrong, and never crashes the printer or the parser. */
START_TEST(test_print_malformed_ir) {
  fb_layout *l = build_layout();
  fb_kernel *k = fb_kernel_new(l, "bad", 0, NULL, FB_T_VOID);
  fb_builder b;
  fb_builder_init(&b, k);
  int c = fb_b_const_i32(&b, 1);
  int idx[1] = {c};
  fb_b_load(&b, 999, idx, 1);           /* no such SNode */
  fb_b_load(&b, -1, idx, 1);
  int iff = fb_b_if(&b, c, 1);
  fb_stmt raw = k->stmts[c];
  raw.op = 999;                         /* no such op */
  fb_b_emit(&b, &raw);
  raw = k->stmts[c];
  raw.type = 77;                        /* no such type */
  fb_b_emit(&b, &raw);
  k->stmts[iff].orelse = 0;             /* a block cycle */
  k->stmts[iff].body = 99;              /* no such block */
  fb_b_enter(&b, 0);
  fb_block *b0 = &k->blocks[0];
  b0->ids[b0->n++] = 12345;             /* a bad id in a block (cap is 8) */
  char *s = fb_kernel_print(k);
  ck_assert_ptr_nonnull(s);
  ck_assert_ptr_nonnull(strstr(s, "\n  load ?[%0]\n"));
  ck_assert_ptr_nonnull(strstr(s, "# %4 has unknown op 999"));
  ck_assert_ptr_nonnull(strstr(s, "# block 99 not printed"));
  ck_assert_ptr_nonnull(strstr(s, "# block 0 not printed"));
  ck_assert_ptr_nonnull(strstr(s, "# bad statement id 12345"));
  fb_kernel **ks = NULL;
  int n = 0;
  fb_diags d;
  fb_diags_init(&d);
  ck_assert_int_eq(fb_ir_parse_kernels(s, l, &ks, &n, &d), FB_EPARSE);
  fb_diags_free(&d);
  free(s);
  fb_kernel_free(k);
  k = fb_kernel_new(NULL, NULL, 0, NULL, FB_T_VOID); /* no layout */
  fb_builder_init(&b, k);
  fb_b_struct_for(&b, 3);
  s = fb_kernel_print(k);
  ck_assert_str_eq(s, "kernel kernel() {\n  struct_for %0 over ? {\n  }\n}\n");
  free(s);
  fb_kernel_free(k);
  ck_assert_ptr_null(fb_kernel_print(NULL));
  fb_layout_free(l);
}
END_TEST

/* ---------------------------------------------------------------- garbage */

static int parse_rc(const char *text) {
  fb_layout *l;
  fb_kernel **ks;
  int n;
  fb_diags d;
  fb_diags_init(&d);
  int rc = fb_ir_parse(text, &l, &ks, &n, &d);
  if (rc == 0) {
    free_kernels(ks, n);
    fb_layout_free(l);
  } else {
    ck_assert_int_gt(d.n, 0);
    ck_assert_int_le(d.n, 51);
  }
  fb_diags_free(&d);
  return rc;
}

/* Every prefix of every golden: valid exactly when it ends (up to white
 * space) with a top-level '}', else FB_EPARSE with diagnostics. */
START_TEST(test_truncated_goldens) {
  names g = list_ir("ir");
  for (int i = 0; i < g.n; i++) {
    char *text = read_test_file(g.v[i]);
    size_t len = strlen(text);
    for (size_t cut = 0; cut <= len; cut++) {
      char saved = text[cut];
      text[cut] = 0;
      size_t e = cut;
      while (e > 0 && (text[e - 1] == '\n' || text[e - 1] == ' ')) e--;
      int whole = e >= 2 && text[e - 1] == '}' && text[e - 2] == '\n';
      int rc = parse_rc(text);
      ck_assert_msg(rc == (whole ? 0 : FB_EPARSE), "%s cut at %zu: rc %d", g.v[i], cut, rc);
      text[cut] = saved;
    }
    free(text);
  }
  names_free(&g);
}
END_TEST

/* Byte flips, deletions and insertions in the goldens: FB_EPARSE or a
 * module that prints to a fixed point. */
START_TEST(test_mutated_goldens) {
  static const char alphabet[] = "{}()[],:=@%.#\"\\\n -0123456789abcxijkl\x80\xff\t";
  names g = list_ir("ir");
  uint64_t seed = 7;
  int accepted = 0;
  for (int i = 0; i < g.n; i++) {
    char *text = read_test_file(g.v[i]);
    size_t len = strlen(text);
    char *buf = malloc(len + 8);
    for (int trial = 0; trial < 150; trial++) {
      memcpy(buf, text, len + 1);
      size_t n = len;
      for (int m = 0; m < 1 + trial % 3; m++) {
        size_t at = (size_t)(lcg(&seed) % n);
        char c = alphabet[lcg(&seed) % (sizeof alphabet - 1)];
        switch (lcg(&seed) % 3) {
        case 0: buf[at] = c; break;
        case 1:
          memmove(buf + at, buf + at + 1, n - at);
          n--;
          break;
        default:
          memmove(buf + at + 1, buf + at, n - at + 1);
          buf[at] = c;
          n++;
          break;
        }
      }
      int rc = parse_rc(buf);
      ck_assert(rc == 0 || rc == FB_EPARSE);
      if (rc == 0) {
        accepted++;
        free(check_fixed_point(buf, "mutant"));
      }
    }
    free(buf);
    free(text);
  }
  ck_assert_int_gt(accepted, 0); /* some mutants are valid (a comment, a renamed field) */
  names_free(&g);
}
END_TEST

START_TEST(test_noise) {
  uint64_t seed = 99;
  char buf[4097];
  for (int trial = 0; trial < 300; trial++) {
    size_t n = 1 + (size_t)(lcg(&seed) % 4096);
    for (size_t i = 0; i < n; i++) {
      buf[i] = (char)(lcg(&seed) & 0xff);
      if (!buf[i]) buf[i] = '\n';
    }
    buf[n] = 0;
    ck_assert_int_eq(parse_rc(buf), FB_EPARSE);
  }
  /* deep nesting, long lines, many braces */
  size_t big = 200000;
  char *s = malloc(big * 12 + 64);
  strcpy(s, "layout {\n}\nkernel k() {\n  %0 = const.bool true\n");
  size_t o = strlen(s);
  for (size_t i = 0; i < 1000; i++) o += (size_t)sprintf(s + o, "if %%0 {\n");
  s[o] = 0;
  ck_assert_int_eq(parse_rc(s), FB_EPARSE);
  memset(s, '}', big);
  s[big] = 0;
  ck_assert_int_eq(parse_rc(s), FB_EPARSE);
  memset(s, '{', big);
  ck_assert_int_eq(parse_rc(s), FB_EPARSE);
  strcpy(s, "layout {\n}\nkernel k() {\n  %0 = add.i32 ");
  o = strlen(s);
  for (size_t i = 0; i < big; i++) o += (size_t)sprintf(s + o, "%%%zu, ", i % 1000);
  strcpy(s + o, "%0\n}\n");
  ck_assert_int_eq(parse_rc(s), FB_EPARSE);
  strcpy(s, "layout {\n}\nkernel ");
  memset(s + strlen(s), 'a', big);
  s[big + 20] = 0;
  ck_assert_int_eq(parse_rc(s), FB_EPARSE);
  free(s);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("ir_text");
  TCase *t = tcase_create("core");
  tcase_set_timeout(t, 120);
  tcase_add_test(t, test_goldens_round_trip);
  tcase_add_test(t, test_goldens_cover_everything);
  tcase_add_test(t, test_error_files);
  tcase_add_test(t, test_several_errors_reported);
  tcase_add_test(t, test_diags_appended);
  tcase_add_test(t, test_builder_round_trip);
  tcase_add_test(t, test_layout_round_trip);
  tcase_add_test(t, test_float_bits);
  tcase_add_test(t, test_comments_and_spacing);
  tcase_add_test(t, test_implicit_ids);
  tcase_add_test(t, test_quoted_names);
  tcase_add_test(t, test_parse_kernels_mode);
  tcase_add_test(t, test_fprint);
  tcase_add_test(t, test_print_malformed_ir);
  tcase_add_test(t, test_truncated_goldens);
  tcase_add_test(t, test_mutated_goldens);
  tcase_add_test(t, test_noise);
  tcase_add_test(t, test_fused_parts_round_trip);
  tcase_add_test(t, test_part_prefix_errors);
  suite_add_tcase(s, t);
  return s;
}

int main(void) { return fbt_run(suite()); }
