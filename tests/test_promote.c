/* The task-local rewrites lowering makes in both engine modes
 * (optimizer/pass_promote.c): atomics on elements the iteration owns made
 * load/op/store, and field elements kept in locals across serial loops.
 * Each case counts what fired (fb_task.atomics_local, fb_task.promoted)
 * and checks that results do not change: the kernel as written, its tasks
 * as lowered with the rewrites and without them run in the reference
 * interpreter give the same bits in every field; then the engine's sync
 * and async modes on the CPU give those bits too. The hazards: a loop that
 * also reads the field at another index, a sparse field stored on some
 * paths only, break and while loops, an index not provably in bounds, a
 * loop that runs no iteration, integer wrap-around. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fusebox/engine.h"
#include "fusebox/lang.h"
#include "optimizer/optimizer.h"
#include "tests/support/support.h"

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

static fb_kernel *inst(fb_program *p, const char *name) {
  fb_kernel *k = NULL;
  fb_diags d;
  fb_diags_init(&d);
  int rc = fb_program_instantiate(p, name, NULL, 0, &k, &d);
  fb_diags_free(&d);
  ck_assert_msg(rc == 0, "instantiate %s: %s", name, fb_strerror(rc));
  return k;
}

typedef struct counts {
  int atomics, promoted;
} counts;

/* Run kernels names[] (each with no parameters) in order: as written, as
 * lowered with the rewrites, as lowered without; every place must hold the
 * same bits. Returns the rewrites' counts over all the kernels. */
static counts run_three(const char *src, const char *const *names, int n) {
  fb_program *p = prog(src);
  const fb_layout *l = fb_program_layout(p);
  fb_interp *in[3];
  counts c = {0, 0};
  for (int v = 0; v < 3; v++) in[v] = fb_interp_new(l, 7);
  for (int i = 0; i < n; i++) {
    fb_kernel *k = inst(p, names[i]);
    ck_assert_int_eq(fb_interp_run(in[0], k, NULL, 0, NULL), 0);
    for (int v = 1; v < 3; v++) {
      fb_task_list tl;
      char err[256] = "";
      ck_assert_msg(fb_lower_ex(k, v == 1 ? 0 : FB_LOWER_NO_LOCAL, &tl, err, sizeof err) == 0,
                    "lower %s: %s", names[i], err);
      for (int t = 0; t < tl.n; t++) {
        fb_diags d;
        fb_diags_init(&d);
        int vr = fb_verify(tl.v[t].ir, &d);
        if (vr) fb_kernel_fprint(stderr, tl.v[t].ir);
        fb_diags_free(&d);
        ck_assert_msg(vr == 0, "%s does not verify", tl.v[t].ir->name);
        fb_interp_set_launch(in[v], (uint64_t)i + 1);
        ck_assert_int_eq(fb_interp_run(in[v], tl.v[t].ir, NULL, 0, NULL), 0);
        if (v == 1) {
          c.atomics += tl.v[t].atomics_local;
          c.promoted += tl.v[t].promoted;
        } else {
          ck_assert_int_eq(tl.v[t].atomics_local + tl.v[t].promoted, 0);
        }
      }
      fb_task_list_free(&tl);
    }

  }
  for (int f = 0; f < l->nnodes; f++) {
    if (l->nodes[f].kind != FB_SN_PLACE) continue;
    size_t bytes = (size_t)fb_field_numel(l, f) * fb_type_size(l->nodes[f].type);
    for (int v = 1; v < 3; v++)
      ck_assert_msg(!memcmp(fb_interp_field(in[0], f), fb_interp_field(in[v], f), bytes),
                    "place %s differs (%s)", l->nodes[f].name,
                    v == 1 ? "with the rewrites" : "without");
  }
  for (int v = 0; v < 3; v++) fb_interp_free(in[v]);
  fb_program_free(p);
  return c;
}

/* nbody's compute_force in small: force[i] += f in a serial loop over j
 * that also reads pos[j] (another place: promotion still fires) and
 * pos[i] (pos, read at two indices, is not promoted). */
static const char *NBODY =
    "layout { dense(i: 16) { place pos: f32, force: f32, k: i32 } }\n"
    "kernel init() { for i in 0 .. 16 { pos[i] = f32(i) * 0.37 - 2.0\n k[i] = i * 7 } }\n"
    "kernel forces() {\n"
    "  for i in 0 .. 16 { force[i] = 0.0 }\n"
    "  for i in 0 .. 16 {\n"
    "    for j in 0 .. 16 {\n"
    "      if i != j { force[i] += 1.0 / (pos[i] - pos[j]) }\n"
    "    }\n"
    "  }\n"
    "}\n";

START_TEST(nbody_row_sum_promoted) {
  const char *ks[] = {"init", "forces", "forces"};
  counts c = run_three(NBODY, ks, 3);
  /* per forces launch: one owned atomic made load/add/store, then force[i]
     promoted; pos, read at i and at j, stays in memory */
  ck_assert_int_eq(c.atomics, 2);
  ck_assert_int_eq(c.promoted, 2);
}
END_TEST

/* The element-wise atomic at the loop's own index (an adjoint's
 * a_grad[i] += ...): demoted in every task, no loop needed. */
START_TEST(owned_atomic_demoted) {
  const char *src = "layout { dense(i: 64) { place a: f32, g: f32, h: i32 } }\n"
                    "kernel init() { for i in 0 .. 64 { a[i] = f32(i) * 0.25 } }\n"
                    "kernel adj() {\n"
                    "  for i in 0 .. 64 { g[i] += a[i] * 2.0\n g[i] += a[i]\n h[i] += i }\n"
                    "  for i in 0 .. 64 { g[(i * 7) % 64] += 1.0 }\n" /* not owned */
                    "}\n";
  const char *ks[] = {"init", "adj", "adj"};
  counts c = run_three(src, ks, 3);
  ck_assert_int_eq(c.atomics, 6); /* 3 per launch; the permuted one stays */
  ck_assert_int_eq(c.promoted, 0);
}
END_TEST

/* A serial task (a loop inside `if`): every field is owned; the loop reads
 * x at another index as well, so x stays in memory; y is promoted. */
START_TEST(other_index_not_promoted) {
  const char *src = "layout { dense(i: 16) { place x: f32, y: f32 } }\n"
                    "kernel init() { for i in 0 .. 16 { x[i] = f32(i) + 0.5 } }\n"
                    "kernel run() {\n"
                    "  if true {\n"
                    "    for j in 0 .. 16 { x[3] += x[j] * 0.5\n y[2] += x[3] }\n"
                    "  }\n"
                    "}\n";
  const char *ks[] = {"init", "run", "run"};
  counts c = run_three(src, ks, 3);
  ck_assert_int_eq(c.atomics, 0); /* serial code has no atomics to begin with */
  ck_assert_int_eq(c.promoted, 2); /* y only, per launch */
}
END_TEST

/* A sparse field stored on some paths only: never promoted (the store
 * after the loop would activate cells the loop did not); activity is
 * compared through a dense field. */
START_TEST(sparse_some_paths_not_promoted) {
  const char *src = "layout {\n"
                    "  pointer(i: 4) { dense(i: 4) { place s: f32 } }\n"
                    "  dense(i: 16) { place act: i32 }\n"
                    "}\n"
                    "kernel run() {\n"
                    "  for i in 0 .. 16 {\n"
                    "    for j in 0 .. 3 { if (i + j) % 7 == 0 { s[i] = s[i] + 1.0 } }\n"
                    "  }\n"
                    "}\n"
                    "kernel probe() { for i in 0 .. 16 { act[i] = i32(is_active(s, i)) } }\n";
  const char *ks[] = {"run", "probe"};
  counts c = run_three(src, ks, 2);
  ck_assert_int_eq(c.promoted, 0);
}
END_TEST

/* break out of the loop, a while loop, nested loops (inner then outer),
 * integer wrap-around, a loop that runs no iteration. */
START_TEST(break_while_nested_int) {
  const char *src =
      "layout { dense(i: 16) { place y: f32, n: i32, z: f32, w: i32 } }\n"
      "kernel run() {\n"
      "  for i in 0 .. 16 {\n"
      "    for j in 0 .. 16 { if j > i { break }\n y[i] = y[i] * 2.0 + 1.0 }\n"
      "    for j in 0 .. i { n[i] += j * 1000003\n n[i] = n[i] * 65537 }\n"
      "    for a in 0 .. 4 { for b in 0 .. 4 { z[i] += f32(a * b + i) * 0.1 } }\n"
      "    var k = 0\n"
      "    while true { if k >= i { break }\n w[i] = w[i] * 3 + k\n k += 1 }\n"
      "    for j in 0 .. 0 { y[i] = 5.0 }\n"
      "  }\n"
      "}\n";
  const char *ks[] = {"run", "run"};
  counts c = run_three(src, ks, 2);
  /* per launch: y, n, z (inner, then outer), w, y (empty loop) */
  ck_assert_int_eq(c.promoted, 12);
  ck_assert_int_eq(c.atomics, 4);
}
END_TEST

/* An index not provably in bounds (read from a field) is not promoted:
 * the load before the loop would fail where the loop never reached it. */
START_TEST(not_in_bounds_not_promoted) {
  const char *src = "layout { dense(i: 16) { place q: f32, k: i32 } }\n"
                    "kernel init() { for i in 0 .. 16 { k[i] = i } }\n"
                    "kernel run() {\n"
                    "  if true {\n"
                    "    let m = k[3]\n"
                    "    for j in 0 .. 3 { q[m] = q[m] + 1.0 }\n"
                    "    for j in 0 .. 3 { q[2] = q[2] + 1.0 }\n"
                    "  }\n"
                    "}\n";
  const char *ks[] = {"init", "run"};
  counts c = run_three(src, ks, 2);
  ck_assert_int_eq(c.promoted, 1); /* q[2] only */
}
END_TEST

int main(void) {
  Suite *s = suite_create("promote");
  TCase *tc = tcase_create("promote");
  tcase_add_test(tc, nbody_row_sum_promoted);
  tcase_add_test(tc, owned_atomic_demoted);
  tcase_add_test(tc, other_index_not_promoted);
  tcase_add_test(tc, sparse_some_paths_not_promoted);
  tcase_add_test(tc, break_while_nested_int);
  tcase_add_test(tc, not_in_bounds_not_promoted);
  suite_add_tcase(s, tc);
  return fbt_run(s);
}
