/* Random task sequences through the optimizer, checked against the
 * reference interpreter: every program runs as inserted and as optimized
 * (all passes, and each pass alone), and all fields and active cells must
 * match exactly (integer data). Programs mix dense and sparse fields
 * (pointer, bitmasked), range_for and struct_for tasks (with the
 * clear_list / listgen tasks lowering puts before sparse struct_fors),
 * serial tasks, element-wise, shifted and assume_unique (a permutation)
 * accesses, atomics, conditional
 * stores, activation, deactivation (with its gc task), rand() and random
 * flush points. A failure names the seed and prints the program;
 * FB_RANDOM_SEED=S (and FB_RANDOM_COUNT=N) runs other seeds. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codegen/codegen.h"
#include "fusebox/ir.h"
#include "optimizer/sfg.h"
#include "support.h"

enum {
  N = 16,
  MAXT = 48,
  NPROG = 300
};

typedef struct rng {
  uint64_t s;
} rng;

static uint32_t rnd(rng *r, uint32_t n) {
  r->s = r->s * 6364136223846793005ull + 1442695040888963407ull;
  return (uint32_t)((r->s >> 33) % n);
}

typedef struct world {
  fb_layout *l;
  int a, b, c, p, q, m, s;  /* places */
  int blk, bm;              /* sparse containers */
} world;

static world make_world(void) {
  world w;
  w.l = fb_layout_new();
  int64_t n = N, four = 4;
  int d = fb_layout_add(w.l, 0, FB_SN_DENSE, "i", &n, 0, NULL);
  w.a = fb_layout_place(w.l, d, "a", FB_T_I32);
  w.b = fb_layout_place(w.l, d, "b", FB_T_I32);
  w.c = fb_layout_place(w.l, d, "c", FB_T_I32);
  w.blk = fb_layout_add(w.l, 0, FB_SN_POINTER, "i", &four, 0, "blk");
  int bd = fb_layout_add(w.l, w.blk, FB_SN_DENSE, "i", &four, 0, NULL);
  w.p = fb_layout_place(w.l, bd, "p", FB_T_I32);
  w.q = fb_layout_place(w.l, bd, "q", FB_T_I32);
  w.bm = fb_layout_add(w.l, 0, FB_SN_BITMASKED, "i", &n, 0, "bm");
  w.m = fb_layout_place(w.l, w.bm, "m", FB_T_I32);
  w.s = fb_layout_place(w.l, 0, "s", FB_T_I32);
  ck_assert_int_eq(fb_layout_finalize(w.l, NULL, 0), 0);
  return w;
}

/* ---------------------------------------------------------------- generation */

typedef struct gen {
  rng r;
  const world *w;
  fb_builder b;
  int loop;      /* loop statement, -1 in serial tasks */
  int vals[16];  /* i32 values available in the current block */
  int nvals;
  int deact;     /* the task deactivated a pointer cell: needs gc */
} gen;

static int pick_field(gen *g) {
  const int f[] = {g->w->a, g->w->b, g->w->c, g->w->p, g->w->q, g->w->m};
  return f[rnd(&g->r, 6)];
}

static int c32(gen *g, int v) { return fb_b_const_i32(&g->b, v); }

/* An index into a 16-element field. */
static int index_expr(gen *g) {
  fb_builder *b = &g->b;
  int i = g->loop >= 0 ? fb_b_loop_index(b, g->loop, 0) : c32(g, (int)rnd(&g->r, N));
  switch (g->loop >= 0 ? rnd(&g->r, 9) : 7) {
  case 8: { /* (3i + 1) mod 16: a permutation, so truly unique per iteration */
    int v = fb_b_binary(b, FB_OP_ADD, fb_b_binary(b, FB_OP_MUL, i, c32(g, 3)), c32(g, 1));
    return fb_b_hint_unique(b, fb_b_binary(b, FB_OP_FLOORMOD, v, c32(g, N)), g->w->a);
  }
  case 0: return fb_b_binary(b, FB_OP_ADD, i, c32(g, 1));
  case 1: return fb_b_binary(b, FB_OP_SUB, i, c32(g, 1));
  case 2: return fb_b_binary(b, FB_OP_FLOORDIV, i, c32(g, 2));
  case 3: return c32(g, (int)rnd(&g->r, N));
  case 4: { /* a loaded index, kept in range */
    int v = g->nvals ? g->vals[rnd(&g->r, (uint32_t)g->nvals)] : i;
    return fb_b_binary(b, FB_OP_FLOORMOD, v, c32(g, N));
  }
  default: return i;
  }
}

static int value_expr(gen *g) {
  fb_builder *b = &g->b;
  switch (rnd(&g->r, 6)) {
  case 0: return c32(g, (int)rnd(&g->r, 9) - 4);
  case 1: return g->loop >= 0 ? fb_b_loop_index(b, g->loop, 0) : c32(g, 3);
  case 2:
    if (b->k->nparams) return fb_b_arg(b, 0);
    return c32(g, 5);
  case 3: {
    int r = fb_b_rand(b, (int)rnd(&g->r, 4));
    return fb_b_cast(b, FB_T_I32, fb_b_binary(b, FB_OP_MUL, r, fb_b_const_f32(b, 100.0f)));
  }
  default:
    if (g->nvals) {
      int v = g->vals[rnd(&g->r, (uint32_t)g->nvals)];
      return fb_b_binary(b, rnd(&g->r, 2) ? FB_OP_ADD : FB_OP_MUL, v,
                         c32(g, (int)rnd(&g->r, 3) + 1));
    }
    return c32(g, 7);
  }
}

static void statement(gen *g, int depth) {
  fb_builder *b = &g->b;
  int f = pick_field(g);
  switch (rnd(&g->r, depth ? 9 : 11)) {
  case 0:
  case 1:
  case 2: {
    int idx = index_expr(g);
    fb_b_store(b, f, &idx, 1, value_expr(g));
    break;
  }
  case 3:
  case 4: {
    int idx = index_expr(g);
    int v = fb_b_global(b, FB_OP_ATOMIC_ADD, f, &idx, 1, value_expr(g));
    if (g->nvals < 16) g->vals[g->nvals++] = v;
    break;
  }
  case 5:
  case 6: {
    int idx = index_expr(g);
    int v = fb_b_load(b, f, &idx, 1);
    if (g->nvals < 16) g->vals[g->nvals++] = v;
    break;
  }
  case 7: { /* s[] += v */ fb_b_global(b, FB_OP_ATOMIC_ADD, g->w->s, NULL, 0, value_expr(g)); break;
  }
  case 8: { /* activate a cell */
    int idx = index_expr(g);
    fb_b_global(b, FB_OP_ACTIVATE, rnd(&g->r, 2) ? g->w->m : g->w->p, &idx, 1, -1);
    break;
  }
  case 9: { /* if (i % 2 == k) { ... } */
    int v = g->loop >= 0 ? fb_b_loop_index(b, g->loop, 0) : c32(g, 1);
    int cond = fb_b_binary(b, FB_OP_EQ, fb_b_binary(b, FB_OP_FLOORMOD, v, c32(g, 2)),
                           c32(g, (int)rnd(&g->r, 2)));
    int st = fb_b_if(b, cond, 0);
    int saved = fb_b_enter(b, b->k->stmts[st].body);
    int keep = g->nvals;
    statement(g, depth + 1);
    statement(g, depth + 1);
    g->nvals = keep;
    fb_b_leave(b, saved);
    break;
  }
  default: { /* deactivate a pointer or bitmasked cell */
    int is_blk = (int)rnd(&g->r, 2);
    int idx = fb_b_binary(b, FB_OP_FLOORMOD, index_expr(g), c32(g, is_blk ? 4 : N));
    fb_b_global(b, FB_OP_DEACTIVATE, is_blk ? g->w->blk : g->w->bm, &idx, 1, -1);
    g->deact |= is_blk;
    break;
  }
  }
}

typedef struct prog {
  fb_kernel *k[MAXT * 3];
  int kernel[MAXT * 3];      /* task -> kernel index */
  uint64_t args[MAXT * 3];
  uint64_t launch[MAXT * 3];
  int flush_after[MAXT * 3]; /* flush after this task */
  int nk, nt;
} prog;

static fb_kernel *list_task(const world *w, fb_op op, int snode, int nparams) {
  fb_type p = FB_T_I32;
  fb_kernel *k = fb_kernel_new(w->l,
                               op == FB_OP_GC        ? "gc"
                               : op == FB_OP_LISTGEN ? "listgen"
                                                     : "clear",
                               nparams, &p, FB_T_VOID);
  fb_builder b;
  fb_builder_init(&b, k);
  fb_stmt s;
  memset(&s, 0, sizeof s);
  s.op = (uint16_t)op;
  s.snode = snode;
  s.body = s.orelse = -1;
  for (int a = 0; a < FB_MAX_ARGS; a++) s.args[a] = -1;
  fb_b_emit(&b, &s);
  return k;
}

static void add_task(prog *p, fb_kernel *k, uint64_t arg, uint64_t launch) {
  p->k[p->nk] = k;
  p->kernel[p->nt] = p->nk++;
  p->args[p->nt] = arg;
  p->launch[p->nt] = launch;
  p->flush_after[p->nt++] = 0;
}

/* One random kernel launch: its tasks, as lowering would make them. */
static void kernel_launch(gen *g, prog *p, uint64_t launch) {
  const world *w = g->w;
  fb_type pt = FB_T_I32;
  int np = (int)rnd(&g->r, 2);
  uint64_t arg = fb_slot_pack(fb_value_i32((int32_t)rnd(&g->r, 7) - 3));
  char name[32];
  snprintf(name, sizeof name, "k%d", p->nk);
  fb_kernel *k = fb_kernel_new(w->l, name, np, &pt, FB_T_VOID);
  fb_builder_init(&g->b, k);
  g->nvals = 0;
  g->deact = 0;
  int kind = (int)rnd(&g->r, 5), sparse = -1;
  if (kind <= 1) {
    g->loop = fb_b_range_for(&g->b, c32(g, (int)rnd(&g->r, 2) * 2),
                             c32(g, N - (int)rnd(&g->r, 2) * 4), 1);
  } else if (kind <= 3) {
    const int over[] = {w->a, w->p, w->m, w->q};
    int s = over[rnd(&g->r, 4)];
    g->loop = fb_b_struct_for(&g->b, s);
    sparse = s == w->p || s == w->q ? w->blk : s == w->m ? w->bm : -1;
  } else {
    g->loop = -1;
  }
  int saved = g->loop >= 0 ? fb_b_enter(&g->b, k->stmts[g->loop].body) : 0;
  int n = 1 + (int)rnd(&g->r, 4);
  for (int i = 0; i < n; i++) statement(g, 0);
  if (g->loop >= 0) fb_b_leave(&g->b, saved);
  ck_assert_int_eq(g->b.err, 0);
  if (sparse >= 0) {
    add_task(p, list_task(w, FB_OP_CLEAR_LIST, sparse, np), arg, launch);
    add_task(p, list_task(w, FB_OP_LISTGEN, sparse, np), arg, launch);
  }
  add_task(p, k, arg, launch);
  if (g->deact) add_task(p, list_task(w, FB_OP_GC, w->blk, np), arg, launch);
}

/* Launch again the tasks [from, to) of an earlier launch (same IR: what
 * activation demotion and the IR bank look for), maybe with another arg. */
static void relaunch(gen *g, prog *p, int from, int to, uint64_t launch) {
  uint64_t arg =
      rnd(&g->r, 2) ? p->args[from] : fb_slot_pack(fb_value_i32((int32_t)rnd(&g->r, 7) - 3));
  for (int t = from; t < to && p->nt < MAXT * 3; t++) {
    p->kernel[p->nt] = p->kernel[t];
    p->args[p->nt] = arg;
    p->launch[p->nt] = launch;
    p->flush_after[p->nt++] = 0;
  }
}

static void make_prog(uint64_t seed, const world *w, prog *p) {
  memset(p, 0, sizeof *p);
  gen g;
  memset(&g, 0, sizeof g);
  g.r.s = seed * 0x9e3779b97f4a7c15ull + 1;
  g.w = w;
  int launches = 4 + (int)rnd(&g.r, 14), first[64], last[64];
  for (int i = 0; i < launches && i < 64 && p->nt < MAXT * 3 - 8; i++) {
    first[i] = p->nt;
    if (i > 0 && rnd(&g.r, 3) == 0) {
      int j = (int)rnd(&g.r, (uint32_t)i);
      relaunch(&g, p, first[j], last[j], (uint64_t)i);
    } else {
      kernel_launch(&g, p, (uint64_t)i);
    }
    last[i] = p->nt;
    if (rnd(&g.r, 6) == 0) p->flush_after[p->nt - 1] = 1;
  }
}

static void prog_free(prog *p) {
  for (int i = 0; i < p->nk; i++) fb_kernel_free(p->k[i]);
}

static void print_prog(const prog *p, uint64_t seed) {
  fprintf(stderr, "---- seed %llu: the program\n", (unsigned long long)seed);
  for (int t = 0; t < p->nt; t++) {
    fprintf(stderr, "# task %d, launch %llu, arg %lld%s\n", t, (unsigned long long)p->launch[t],
            (long long)(int32_t)p->args[t], p->flush_after[t] ? ", then flush" : "");
    fb_kernel_fprint(stderr, p->k[p->kernel[t]]);
  }
}

/* ---------------------------------------------------------------- running */

static void run_one(fb_interp *in, const fb_kernel *k, const uint64_t *args, int nargs,
                    uint64_t launch) {
  fb_value v[MAXT * 3];
  ck_assert_int_le(nargs, MAXT * 3);
  for (int a = 0; a < nargs; a++) v[a] = fb_slot_unpack(k->params[a], args[a]);
  fb_interp_set_launch(in, launch);
  int rc = fb_interp_run(in, k, v, nargs, NULL);
  ck_assert_msg(rc == 0 || rc == FB_EBOUNDS, "%s: %s", k->name, fb_interp_errmsg(in));
}

/* Run p through the optimizer (passes) into interp y; 0 on success. */
static int run_optimized(const world *w, const prog *p, unsigned passes, fb_interp *y, char *why,
                         size_t n, fb_opt_counters *total) {
  fb_opt_options o;
  fb_opt_options_default(&o);
  o.passes = passes;
  o.check = 1;
  fb_opt *opt = fb_opt_new(w->l, &o);
  fb_irh h[MAXT * 3];
  int rc = 0;
  for (int i = 0; i < p->nk && !rc; i++) rc = fb_opt_intern(opt, p->k[i], &h[i]);
  for (int t = 0; t < p->nt && !rc; t++) {
    const fb_kernel *k = p->k[p->kernel[t]];
    fb_opt_task task = {h[p->kernel[t]], &p->args[t], k->nparams, p->launch[t]};
    rc = fb_opt_insert(opt, &task);
    if (!rc && (p->flush_after[t] || t == p->nt - 1)) {
      fb_opt_batch *b = NULL;
      rc = fb_opt_flush(opt, &b);
      for (int i = 0; !rc && b && i < b->n; i++) {
        if (getenv("FB_RANDOM_VERBOSE")) { /* what runs, for a failing seed */
          fprintf(stderr, "# optimized (passes 0x%x), launch %llu, %d tasks\n", passes,
                  (unsigned long long)b->v[i].launch, b->v[i].ntasks);
          fb_kernel_fprint(stderr, b->v[i].k);
        }
        run_one(y, b->v[i].k, b->v[i].args, b->v[i].nargs, b->v[i].launch);
      }
      fb_opt_batch_free(opt, b);
    }
  }
  if (rc) snprintf(why, n, "optimizer: %s", fb_opt_errmsg(opt));
  if (total) {
    const fb_opt_counters *c = &fb_opt_get_stats(opt)->total;
    total->tasks_in += c->tasks_in;
    total->tasks_out += c->tasks_out;
    total->tasks_fused += c->tasks_fused;
    total->dead_stores += c->dead_stores;
    total->tasks_deleted += c->tasks_deleted;
    total->listgen_removed += c->listgen_removed;
    total->demoted += c->demoted;
    total->simplified += c->simplified;
  }
  fb_opt_free(opt);
  return rc;
}

static int active(fb_interp *in, const fb_kernel *probe, int i) {
  fb_value arg = fb_value_i32(i), ret;
  fb_interp_set_launch(in, 0);
  ck_assert_int_eq(fb_interp_run(in, probe, &arg, 1, &ret), 0);
  return ret.v.u != 0;
}

static fb_kernel *probe(const world *w, int c) {
  fb_type p = FB_T_I32;
  fb_kernel *k = fb_kernel_new(w->l, "probe", 1, &p, FB_T_BOOL);
  fb_builder b;
  fb_builder_init(&b, k);
  int i = fb_b_arg(&b, 0);
  fb_b_ret(&b, fb_b_global(&b, FB_OP_IS_ACTIVE, c, &i, 1, -1), 0);
  return k;
}

static int same_state(const world *w, fb_interp *x, fb_interp *y, char *why, size_t n) {
  for (int f = 0; f < w->l->nnodes; f++) {
    if (w->l->nodes[f].kind != FB_SN_PLACE) continue;
    size_t bytes = (size_t)fb_field_numel(w->l, f) * fb_type_size(w->l->nodes[f].type);
    if (memcmp(fb_interp_field(x, f), fb_interp_field(y, f), bytes)) {
      snprintf(why, n, "field %s differs", w->l->nodes[f].name);
      return 0;
    }
  }
  const int cont[] = {w->blk, w->bm}, cells[] = {4, N};
  for (int c = 0; c < 2; c++) {
    fb_kernel *pk = probe(w, cont[c]);
    for (int i = 0; i < cells[c]; i++)
      if (active(x, pk, i) != active(y, pk, i)) {
        snprintf(why, n, "activity of %s cell %d differs", w->l->nodes[cont[c]].name, i);
        fb_kernel_free(pk);
        return 0;
      }
    fb_kernel_free(pk);
  }
  return 1;
}

static void check_seed(const world *w, uint64_t seed, fb_opt_counters *stats) {
  prog p;
  make_prog(seed, w, &p);
  fb_interp *x = fb_interp_new(w->l, 3);
  for (int t = 0; t < p.nt; t++)
    run_one(x, p.k[p.kernel[t]], &p.args[t], p.k[p.kernel[t]]->nparams, p.launch[t]);
  const unsigned modes[] = {FB_PASS_ALL,
                            FB_PASS_DEMOTE,
                            FB_PASS_LISTGEN,
                            FB_PASS_DSE,
                            FB_PASS_FUSE,
                            FB_PASS_FUSE | FB_PASS_SIMPLIFY,
                            0};
  for (size_t m = 0; m < sizeof modes / sizeof *modes; m++) {
    fb_interp *y = fb_interp_new(w->l, 3);
    char why[256] = "";
    int ok = run_optimized(w, &p, modes[m], y, why, sizeof why, m == 0 ? stats : NULL) == 0 &&
             same_state(w, x, y, why, sizeof why);
    if (!ok) print_prog(&p, seed);
    ck_assert_msg(ok, "seed %llu, passes 0x%x: %s", (unsigned long long)seed, modes[m], why);
    fb_interp_free(y);
  }
  fb_interp_free(x);
  prog_free(&p);
}

START_TEST(random_programs) {
  world w = make_world();
  fb_opt_counters c;
  memset(&c, 0, sizeof c);
  /* FB_RANDOM_SEED=S [FB_RANDOM_COUNT=N]: seeds S .. S+N-1 (N = 1) instead */
  const char *env = getenv("FB_RANDOM_SEED"), *cnt = getenv("FB_RANDOM_COUNT");
  uint64_t first = env ? strtoull(env, NULL, 0) : 1;
  int count = env ? (cnt ? atoi(cnt) : 1) : NPROG;
  for (int i = 0; i < count; i++) check_seed(&w, first + (uint64_t)i, &c);
  fprintf(stderr,
          "%d programs: tasks %llu -> %llu; fused %llu, dead stores %llu, deleted %llu, "
          "listgen removed %llu, demoted %llu, simplified %llu\n",
          count, (unsigned long long)c.tasks_in, (unsigned long long)c.tasks_out,
          (unsigned long long)c.tasks_fused, (unsigned long long)c.dead_stores,
          (unsigned long long)c.tasks_deleted, (unsigned long long)c.listgen_removed,
          (unsigned long long)c.demoted, (unsigned long long)c.simplified);
  if (!env) { /* the generator must exercise every pass */
    ck_assert_uint_gt(c.tasks_fused, 0);
    ck_assert_uint_gt(c.dead_stores, 0);
    ck_assert_uint_gt(c.tasks_deleted, 0);
    ck_assert_uint_gt(c.listgen_removed, 0);
    ck_assert_uint_gt(c.demoted, 0);
    ck_assert_uint_gt(c.simplified, 0);
  }
  fb_layout_free(w.l);
}
END_TEST

Suite *random_suite(void) {
  Suite *s = suite_create("pass_random");
  TCase *tc = tcase_create("differential");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, random_programs);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) { return fbt_run(random_suite()); }
