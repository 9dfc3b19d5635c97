/* sfg_bench: time of the inter-kernel optimizer (SFG insertion, the pass
 * pipeline to its fixed point, the batch, partial GC) per task launch, for
 * streams flushed every 50 tasks (the engine's default flush_every):
 *
 *   increments   50 x x[i] += 1 (dense): fusion chains, simplification
 *   autodiff     5-task steps (clear, init, forward, backward, update):
 *                dead-store elimination and fusion
 *   sparse_cg    a 2-D MGPCG-like stream on a pointer grid: clear_list /
 *                listgen / struct_for triples, reductions into 0-D fields,
 *                serial scalar tasks: demotion, listgen removal, fusion
 *
 * Usage: sfg_bench [flushes [tasks per flush]] (default 2000, 50). Prints,
 * per workload, with the plan memo on and off, the
 * optimizer time per task in the first flush (everything built: fused IR,
 * metadata) and averaged over the later ones (the IR bank's memo hit), and
 * the tasks handed out per flush, and for the later flushes the insert time
 * per task and the flush time per flush (where the plan memo answers, a
 * repeating window: the sparse_cg stream repeats every 20 tasks, so only
 * flushes of a multiple of 20 tasks repeat), in thread CPU time. Checks are
 * off (as in
 * a release engine). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fusebox/ir.h"
#include "optimizer/sfg.h"

/* Thread CPU time: the optimizer runs on one thread, and on a shared
 * machine wall-clock time would also count other processes. */
static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static const char *const increments_ir =
    "layout {\n  dense(i: 4096) {\n    place x: i32\n  }\n}\n"
    "kernel inc(i32) {\n  %0 = const.i32 0\n  %1 = const.i32 4096\n"
    "  par_for %2 in %0 .. %1 {\n    %3 = loop_index.i32 %2, 0\n    %4 = arg.i32 0\n"
    "    %5 = atomic_add.i32 x[%3], %4\n  }\n}\n";

static const char *const autodiff_ir =
    "layout {\n  dense(i: 4096) {\n    place a: f32\n    place a_grad: f32\n    place b: f32\n  }\n"
    "  place loss: f32\n  place loss_grad: f32\n}\n"
    "kernel clear() {\n  %0 = const.i32 0\n  %1 = const.i32 4096\n  par_for %2 in %0 .. %1 {\n"
    "    %3 = loop_index.i32 %2, 0\n    %4 = const.f32 0.0\n    store a_grad[%3], %4\n  }\n}\n"
    "kernel init() {\n  %0 = const.f32 0.0\n  store loss[], %0\n  %2 = const.f32 1.0\n"
    "  store loss_grad[], %2\n}\n"
    "kernel forward() {\n  %0 = const.i32 0\n  %1 = const.i32 4096\n  par_for %2 in %0 .. %1 {\n"
    "    %3 = loop_index.i32 %2, 0\n    %4 = load.f32 a[%3]\n    %5 = atomic_add.f32 loss[], %4\n  "
    "}\n}\n"
    "kernel backward() {\n  %0 = const.i32 0\n  %1 = const.i32 4096\n  par_for %2 in %0 .. %1 {\n"
    "    %3 = loop_index.i32 %2, 0\n    %4 = load.f32 loss_grad[]\n"
    "    %5 = atomic_add.f32 a_grad[%3], %4\n  }\n}\n"
    "kernel update() {\n  %0 = const.i32 0\n  %1 = const.i32 4096\n  par_for %2 in %0 .. %1 {\n"
    "    %3 = loop_index.i32 %2, 0\n    %4 = load.f32 a_grad[%3]\n"
    "    %5 = atomic_add.f32 b[%3], %4\n  }\n}\n";

/* A CG iteration on a pointer grid: every struct_for is preceded by its
 * clear_list and listgen, as lowering makes them. */
static const char *const sparse_cg_ir =
    "layout {\n  pointer(ij: 16, 16) as blocks {\n    dense(ij: 8, 8) {\n"
    "      place x: f32\n      place p: f32\n      place ap: f32\n      place r: f32\n      place "
    "z: f32\n"
    "    }\n  }\n  place pap: f32\n  place rtr: f32\n  place alpha: f32\n  place beta: f32\n}\n"
    "kernel cl() {\n  clear_list blocks[]\n}\n"
    "kernel lg() {\n  listgen blocks[]\n}\n"
    "kernel compute_ap() {\n  struct_for %0 over p {\n    %1 = loop_index.i32 %0, 0\n"
    "    %2 = loop_index.i32 %0, 1\n    %3 = load.f32 p[%1, %2]\n    %4 = const.f32 4.0\n"
    "    %5 = mul.f32 %3, %4\n    %6 = const.i32 1\n    %7 = sub.i32 %1, %6\n    %8 = load.f32 "
    "p[%7, %2]\n"
    "    %9 = add.i32 %1, %6\n    %10 = load.f32 p[%9, %2]\n    %11 = sub.f32 %5, %8\n"
    "    %12 = sub.f32 %11, %10\n    store ap[%1, %2], %12\n  }\n}\n"
    "kernel reduce_pap() {\n  struct_for %0 over p {\n    %1 = loop_index.i32 %0, 0\n"
    "    %2 = loop_index.i32 %0, 1\n    %3 = load.f32 p[%1, %2]\n    %4 = load.f32 ap[%1, %2]\n"
    "    %5 = mul.f32 %3, %4\n    %6 = atomic_add.f32 pap[], %5\n  }\n}\n"
    "kernel set_alpha() {\n  %0 = load.f32 rtr[]\n  %1 = load.f32 pap[]\n  %2 = div.f32 %0, %1\n"
    "  store alpha[], %2\n  %4 = const.f32 0.0\n  store pap[], %4\n}\n"
    "kernel update_xr() {\n  %0 = load.f32 alpha[]\n  struct_for %1 over x {\n"
    "    %2 = loop_index.i32 %1, 0\n    %3 = loop_index.i32 %1, 1\n    %4 = load.f32 p[%2, %3]\n"
    "    %5 = mul.f32 %0, %4\n    %6 = atomic_add.f32 x[%2, %3], %5\n    %7 = load.f32 ap[%2, %3]\n"
    "    %8 = mul.f32 %0, %7\n    %9 = atomic_sub.f32 r[%2, %3], %8\n  }\n}\n"
    "kernel smooth() {\n  struct_for %0 over z {\n    %1 = loop_index.i32 %0, 0\n"
    "    %2 = loop_index.i32 %0, 1\n    %3 = load.f32 r[%1, %2]\n    %4 = const.f32 0.25\n"
    "    %5 = mul.f32 %3, %4\n    store z[%1, %2], %5\n  }\n}\n"
    "kernel reduce_rtr() {\n  struct_for %0 over r {\n    %1 = loop_index.i32 %0, 0\n"
    "    %2 = loop_index.i32 %0, 1\n    %3 = load.f32 r[%1, %2]\n    %4 = load.f32 z[%1, %2]\n"
    "    %5 = mul.f32 %3, %4\n    %6 = atomic_add.f32 rtr[], %5\n  }\n}\n"
    "kernel set_beta() {\n  %0 = load.f32 rtr[]\n  %1 = const.f32 0.5\n  %2 = mul.f32 %0, %1\n"
    "  store beta[], %2\n}\n"
    "kernel update_p() {\n  %0 = load.f32 beta[]\n  struct_for %1 over p {\n"
    "    %2 = loop_index.i32 %1, 0\n    %3 = loop_index.i32 %1, 1\n    %4 = load.f32 z[%2, %3]\n"
    "    %5 = load.f32 p[%2, %3]\n    %6 = mul.f32 %0, %5\n    %7 = add.f32 %4, %6\n"
    "    store p[%2, %3], %7\n  }\n}\n";

typedef struct workload {
  const char *name;
  const char *ir;
  const char *const *stream; /* kernel names, repeated */
  int nstream;
} workload;

static const char *const inc_stream[] = {"inc"};
static const char *const ad_stream[] = {"clear", "init", "forward", "backward", "update"};
static const char *const cg_stream[] = {
    "cl", "lg", "compute_ap", "cl", "lg", "reduce_pap", "set_alpha", "cl", "lg", "update_xr",
    "cl", "lg", "smooth",     "cl", "lg", "reduce_rtr", "set_beta",  "cl", "lg", "update_p"};

static int find(fb_kernel **ks, int n, const char *name) {
  for (int i = 0; i < n; i++)
    if (!strcmp(ks[i]->name, name)) return i;
  return -1;
}

static int run(const workload *w, int flushes, int per, int memo) {
  fb_layout *l = NULL;
  fb_kernel **ks = NULL;
  int nk = 0;
  fb_diags d;
  fb_diags_init(&d);
  if (fb_ir_parse(w->ir, &l, &ks, &nk, &d)) {
    char *m = fb_diags_join(&d);
    fprintf(stderr, "%s: %s\n", w->name, m);
    free(m);
    return 1;
  }
  fb_opt_options opts;
  fb_opt_options_default(&opts);
  opts.check = 0;
  opts.plan_memo = memo;
  fb_opt *o = fb_opt_new(l, &opts);
  fb_irh h[32];
  for (int i = 0; i < nk; i++)
    if (fb_opt_intern(o, ks[i], &h[i])) {
      fprintf(stderr, "%s: %s\n", w->name, fb_opt_errmsg(o));
      return 1;
    }
  uint64_t launch = 0, args[1] = {1};
  int next = 0;
  double first = 0, rest = 0, ins = 0, fl = 0;
  uint64_t out_first = 0, out_rest = 0;
  for (int f = 0; f < flushes; f++) {
    double t0 = now_s();
    for (int t = 0; t < per; t++) {
      int k = find(ks, nk, w->stream[next]);
      next = (next + 1) % w->nstream;
      fb_opt_task task = {h[k], args, ks[k]->nparams, launch++};
      if (fb_opt_insert(o, &task)) {
        fprintf(stderr, "%s: %s\n", w->name, fb_opt_errmsg(o));
        return 1;
      }
    }
    double t1 = now_s();
    fb_opt_batch *b = NULL;
    if (fb_opt_flush(o, &b)) {
      fprintf(stderr, "%s: %s\n", w->name, fb_opt_errmsg(o));
      return 1;
    }
    double dt = now_s() - t0;
    if (f == 0) {
      first = dt;
      out_first = (uint64_t)b->n;
    } else {
      rest += dt;
      ins += t1 - t0;
      fl += now_s() - t1;
      out_rest += (uint64_t)b->n;
    }
    fb_opt_batch_free(o, b);
  }
  const fb_opt_stats *st = fb_opt_get_stats(o);
  int later = flushes > 1 ? flushes - 1 : 1;
  printf(
      "%-12s memo %-3s first flush %7.2f us/task (%3llu tasks out)   later flushes %6.2f us/task "
      "(%5.1f tasks out; insert %.3f us/task, flush %.2f us/flush; plans reused %llu)   "
      "fused %llu, listgen removed %llu, demoted %llu, dead stores %llu, deleted %llu\n",
      w->name, memo ? "on" : "off", first * 1e6 / per, (unsigned long long)out_first,
      flushes > 1 ? rest * 1e6 / ((double)per * (flushes - 1)) : 0.0,
      flushes > 1 ? (double)out_rest / (flushes - 1) : 0.0, ins * 1e6 / ((double)per * later),
      fl * 1e6 / later, (unsigned long long)st->total.plans_reused,
      (unsigned long long)st->total.tasks_fused, (unsigned long long)st->total.listgen_removed,
      (unsigned long long)st->total.demoted, (unsigned long long)st->total.dead_stores,
      (unsigned long long)st->total.tasks_deleted);
  for (int i = 0; i < nk; i++) fb_opt_release(o, h[i]);
  fb_opt_free(o);
  for (int i = 0; i < nk; i++) fb_kernel_free(ks[i]);
  free(ks);
  fb_layout_free(l);
  fb_diags_free(&d);
  return 0;
}

int main(int argc, char **argv) {
  int flushes = argc > 1 ? atoi(argv[1]) : 2000, per = argc > 2 ? atoi(argv[2]) : 50;
  if (flushes < 1) flushes = 1;
  if (per < 1) per = 1;
  const workload ws[] = {
      {"increments", increments_ir, inc_stream, 1},
      {"autodiff", autodiff_ir, ad_stream, 5},
      {"sparse_cg", sparse_cg_ir, cg_stream, (int)(sizeof cg_stream / sizeof *cg_stream)},
  };
  printf("sfg_bench: optimizer + SFG time per task, %d-task flushes, %d flushes\n", per, flushes);
  int rc = 0;
  for (size_t i = 0; i < sizeof ws / sizeof *ws; i++)
    for (int memo = 1; memo >= 0; memo--) rc |= run(&ws[i], flushes, per, memo);
  return rc;
}
