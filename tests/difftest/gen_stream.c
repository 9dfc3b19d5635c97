/* Stream programs for the differential tester (dt_gen_prog_stream): what a
 * solver or a simulation hands the engine, where the optimizations of long
 * repeating windows engage and the ordinary programs (a few launches, no
 * automatic flush) never reach them:
 *
 *   - a period of 2..6 launches (kernel and arguments) repeated many times
 *     in frames of 10..80 launches: more than the default flush_every
 *     pending, so automatic flushes come due inside a period and wait for
 *     its boundary (engine/async.c cut_now), and later windows repeat the
 *     earlier ones (the optimizer's plan memo); now and then one launch of
 *     a repetition has other arguments (the period breaks while a flush
 *     waits for it);
 *   - a warm-up period and a sync before the frames (most programs): the
 *     first frame's activations are demoted against its tasks, whose code
 *     is known, so stand-ins run while the demoted code compiles;
 *   - frames end in a sync (most often), an fb_flush or nothing; after a
 *     sync, in most programs, every field is read (so every configuration
 *     is compared field by field after every sync), and between frames the
 *     host writes cells (activating new blocks of a pointer SNode), whole
 *     fields, reads cells, or a kernel deactivates blocks: lists the
 *     optimizer keeps across syncs (fb_opt_observe_mask) must follow;
 *   - a dense group z, y, w of even extent E with kernels over range(0, E):
 *     `sten` (red-black: at cells of one parity, z[i] from z[i - 1],
 *     z[i + 1] and w[i]), `rd` (y[i] += z[i]: an element-wise reader that
 *     may fuse after or before sten, fb_meta_acc.wew), `wz` (z[i] += w[i]:
 *     an element-wise writer that must not fuse with sten) and `nb`
 *     (y[i] = z[i + 1]: a neighbour reader that must not);
 *   - a pointer group q (pointer over dense, or pointer over pointer) with
 *     `act` (a struct_for writing its own cells: demoted, so its task
 *     stands in for the demoted code while that compiles when the test
 *     lowers FB_STANDIN_MIN_STMTS), `grow` (activates cells in a range
 *     loop) and `drop` (deactivates blocks in a struct_for over the
 *     pointer); plus one or two random kernels (dt_gen_kernel) over the
 *     whole layout, and the probe.
 *
 * Failing stream programs (failing != 0) add `bad(a)`: y[i] += w[i + a],
 * in bounds for a = 0 and out of bounds at one cell for a = 1. It sits in
 * the period with a = 0, and one launch of a later repetition has a = 1:
 * the error comes from a later launch of a window in which bad's launches
 * fuse with each other and with rd, and every configuration must blame the
 * launch sync mode blames. */
#include <stdlib.h>
#include <string.h>

#include "dt.h"

/* ---------------------------------------------------------------- layout */

typedef struct sgen {
  dt_rng *r;
  dt_prog *p;
  int cap;      /* steps allocated */
  int z, y, w;  /* the dense group's places */
  int64_t e;    /* its extent (even) */
  int q, ptr;   /* the pointer group's place and its top pointer SNode */
  int qleaf;    /* q's parent (the SNode act's struct_for runs over) */
  int64_t eq;   /* the pointer group's extent */
  int oom;      /* a step could not be added */
} sgen;

static fb_layout *stream_layout(sgen *s) {
  dt_rng *r = s->r;
  lgen g = {0};
  g.r = r;
  g.l = fb_layout_new();
  if (!g.l) return NULL;
  static const int64_t es[] = {8, 12, 16}, eqs[] = {16, 32, 64};
  s->e = dt_chance(r, 10) ? 2048 : pick_of(r, es, 3);
  s->eq = pick_of(r, eqs, 3);
  g.ei = s->e;
  g.ei2 = pick_of(r, ext2i, 5);
  g.ej = pick_of(r, ext2j, 3);
  int d = add_node(&g, 0, FB_SN_DENSE, "i", &s->e, 0);
  s->z = add_place(&g, d);
  s->y = add_place(&g, d);
  s->w = add_place(&g, d);
  int64_t top = s->eq / 8, below = 8;
  s->ptr = add_node(&g, 0, FB_SN_POINTER, "i", &top, 0);
  fb_snode_kind inner = dt_chance(r, 30) ? FB_SN_POINTER : FB_SN_DENSE;
  s->qleaf = add_node(&g, s->ptr, inner, "i", &below, 0);
  s->q = add_place(&g, s->qleaf);
  if (dt_chance(r, 40)) add_place(&g, s->qleaf);
  int rc = s->z < 0 || s->y < 0 || s->w < 0 || s->q < 0 ? -1 : 0;
  if (rc == 0 && dt_chance(r, 50)) rc = gen_group(&g);
  if (rc == 0 && dt_chance(r, 20)) rc = add_place(&g, 0) < 0 ? -1 : 0;
  if (rc == 0 && g.l->nnodes <= DT_MAXN && fb_layout_finalize(g.l, NULL, 0) == 0) return g.l;
  fb_layout_free(g.l);
  return NULL;
}

/* ---------------------------------------------------------------- kernels */

static int c_of(fb_builder *b, fb_type t, int64_t v) {
  return fb_b_const(b, fb_value_cast(fb_value_i64(v), t));
}

/* (i + d) floormod e */
static int wrap(fb_builder *b, int i, int d, int64_t e) {
  return fb_b_binary(b, FB_OP_FLOORMOD, fb_b_binary(b, FB_OP_ADD, i, fb_b_const_i32(b, d)),
                     fb_b_const_i32(b, (int32_t)e));
}

static fb_kernel *finish_kernel(fb_kernel *k, fb_builder *b) {
  if (b->err) {
    fb_kernel_free(k);
    return NULL;
  }
  return k;
}

/* for i in range(0, e) (parallel): opens the body, returns the index. */
static int open_range(fb_builder *b, fb_kernel *k, int64_t e) {
  int loop = fb_b_range_for(b, fb_b_const_i32(b, 0), fb_b_const_i32(b, (int32_t)e), 1);
  fb_b_enter(b, k->stmts[loop].body);
  return fb_b_loop_index(b, loop, 0);
}

enum {
  SK_STEN = 0,
  SK_RD,
  SK_WZ,
  SK_NB,
  SK_ACT,
  SK_GROW,
  SK_DROP,
  SK_BAD,
  SK__COUNT
};
static const char *const sk_names[SK__COUNT] = {"sten", "rd",   "wz",   "nb",
                                                "act",  "grow", "drop", "bad"};

static fb_kernel *stream_kernel(const sgen *s, const fb_layout *l, int which) {
  static const fb_type i32[1] = {FB_T_I32};
  int np = which == SK_STEN || which == SK_ACT || which == SK_GROW || which == SK_DROP ||
           which == SK_BAD;
  fb_kernel *k = fb_kernel_new(l, sk_names[which], np, i32, FB_T_VOID);
  if (!k) return NULL;
  fb_builder bb, *b = &bb;
  fb_builder_init(b, k);
  fb_type tz = l->nodes[s->z].type, ty = l->nodes[s->y].type, tw = l->nodes[s->w].type,
          tq = l->nodes[s->q].type;
  int i, ix[1], v;
  switch (which) {
  case SK_STEN: { /* red-black: iterations of one parity write, the others' cells are read */
    i = open_range(b, k, s->e);
    int par = fb_b_binary(b, FB_OP_FLOORMOD, fb_b_binary(b, FB_OP_ADD, i, fb_b_arg(b, 0)),
                          fb_b_const_i32(b, 2));
    int iff = fb_b_if(b, fb_b_binary(b, FB_OP_EQ, par, fb_b_const_i32(b, 0)), 0);
    fb_b_enter(b, k->stmts[iff].body);
    ix[0] = wrap(b, i, 1, s->e);
    int right = fb_b_load(b, s->z, ix, 1);
    ix[0] = wrap(b, i, (int)s->e - 1, s->e);
    int left = fb_b_load(b, s->z, ix, 1);
    ix[0] = i;
    int wv = fb_b_cast(b, tz, fb_b_load(b, s->w, ix, 1));
    v = fb_b_binary(b, FB_OP_DIV, fb_b_binary(b, FB_OP_ADD, left, right), c_of(b, tz, 2));
    fb_b_store(b, s->z, ix, 1, fb_b_binary(b, FB_OP_ADD, v, wv));
    break;
  }
  case SK_RD:
    i = open_range(b, k, s->e);
    ix[0] = i;
    v = fb_b_cast(b, ty, fb_b_load(b, s->z, ix, 1));
    fb_b_store(b, s->y, ix, 1, fb_b_binary(b, FB_OP_ADD, fb_b_load(b, s->y, ix, 1), v));
    break;
  case SK_WZ:
    i = open_range(b, k, s->e);
    ix[0] = i;
    v = fb_b_cast(b, tz, fb_b_load(b, s->w, ix, 1));
    fb_b_store(b, s->z, ix, 1, fb_b_binary(b, FB_OP_ADD, fb_b_load(b, s->z, ix, 1), v));
    break;
  case SK_NB:
    i = open_range(b, k, s->e);
    ix[0] = wrap(b, i, 1, s->e);
    v = fb_b_cast(b, ty, fb_b_load(b, s->z, ix, 1));
    ix[0] = i;
    fb_b_store(b, s->y, ix, 1, v);
    break;
  case SK_ACT: { /* q[i] += a at the loop's own cells: demoted (self) */
    int loop = fb_b_struct_for(b, s->qleaf);
    fb_b_enter(b, k->stmts[loop].body);
    ix[0] = fb_b_loop_index(b, loop, 0);
    v = fb_b_cast(b, tq, fb_b_arg(b, 0));
    fb_b_store(b, s->q, ix, 1, fb_b_binary(b, FB_OP_ADD, fb_b_load(b, s->q, ix, 1), v));
    break;
  }
  case SK_GROW: { /* activate every fifth cell, shifted by a */
    i = open_range(b, k, s->eq);
    int m = fb_b_binary(b, FB_OP_FLOORMOD, fb_b_binary(b, FB_OP_ADD, i, fb_b_arg(b, 0)),
                        fb_b_const_i32(b, 5));
    int iff = fb_b_if(b, fb_b_binary(b, FB_OP_EQ, m, fb_b_const_i32(b, 0)), 0);
    fb_b_enter(b, k->stmts[iff].body);
    ix[0] = i;
    fb_b_store(b, s->q, ix, 1, fb_b_cast(b, tq, i));
    break;
  }
  case SK_DROP: { /* deactivate the blocks at and past t */
    int loop = fb_b_struct_for(b, s->ptr);
    fb_b_enter(b, k->stmts[loop].body);
    i = fb_b_loop_index(b, loop, 0);
    int iff = fb_b_if(b, fb_b_binary(b, FB_OP_GE, i, fb_b_arg(b, 0)), 0);
    fb_b_enter(b, k->stmts[iff].body);
    ix[0] = i;
    fb_b_global(b, FB_OP_DEACTIVATE, s->ptr, ix, 1, -1);
    break;
  }
  case SK_BAD: /* y[i] += w[i + a]: out of bounds at one cell for a = 1 */
    i = open_range(b, k, s->e);
    ix[0] = fb_b_binary(b, FB_OP_ADD, i, fb_b_arg(b, 0));
    v = fb_b_cast(b, ty, fb_b_load(b, s->w, ix, 1));
    ix[0] = i;
    fb_b_store(b, s->y, ix, 1, fb_b_binary(b, FB_OP_ADD, fb_b_load(b, s->y, ix, 1), v));
    break;
  }
  (void)tw;
  return finish_kernel(k, b);
}

/* ---------------------------------------------------------------- steps */

static dt_step *sstep(sgen *g) {
  dt_prog *p = g->p;
  if (p->nsteps == g->cap) {
    int cap = g->cap * 2;
    dt_step *v = realloc(p->steps, sizeof *v * (size_t)cap);
    if (!v) {
      g->oom = 1;
      return NULL;
    }
    p->steps = v;
    g->cap = cap;
  }
  dt_step *s = &p->steps[p->nsteps++];
  memset(s, 0, sizeof *s);
  return s;
}

typedef struct plaunch {
  int kernel;
  int nargs;
  fb_value args[DT_GEN_MAXP];
} plaunch;

static void put_launch(sgen *g, const plaunch *pl) {
  dt_step *s = sstep(g);
  if (!s) return;
  s->kind = DT_LAUNCH;
  s->kernel = pl->kernel;
  s->nargs = pl->nargs;
  memcpy(s->args, pl->args, sizeof pl->args);
}

static void put_host(sgen *g, int kind, int field) {
  dt_step *s = sstep(g);
  if (!s) return;
  host_step(g->r, g->p->l, kind, s);
  if (field > 0) { /* that field, at a fresh index */
    const fb_snode *f = &g->p->l->nodes[field];
    s->field = field;
    for (int d = 0; d < f->ndim; d++)
      s->idx[d] = (int64_t)dt_below(g->r, (uint32_t)f->shape[f->dim_axis[d]]);
    s->val = rand_scalar(g->r, f->type);
  }
}

static void put_kind(sgen *g, int kind) {
  dt_step *s = sstep(g);
  if (s) s->kind = kind;
}

/* Every field read: the configurations compared after a sync. */
static void put_snapshot(sgen *g) {
  const fb_layout *l = g->p->l;
  for (int f = 1; f < l->nnodes; f++)
    if (l->nodes[f].kind == FB_SN_PLACE) {
      dt_step *s = sstep(g);
      if (!s) return;
      s->kind = DT_FIELD_READ;
      s->field = f;
    }
}

/* A launch of kernel k with random arguments (stream kernels: their one
 * argument from a small set). */
static void draw_launch(sgen *g, int k, int sk, plaunch *pl) {
  const fb_kernel *kk = g->p->ks[k];
  memset(pl, 0, sizeof *pl);
  pl->kernel = k;
  pl->nargs = kk->nparams;
  if (sk < 0) {
    for (int i = 0; i < kk->nparams; i++) pl->args[i] = rand_scalar(g->r, kk->params[i]);
    return;
  }
  int64_t a = 0;
  switch (sk) {
  case SK_STEN: a = dt_below(g->r, 2); break;
  case SK_ACT: a = dt_range(g->r, -3, 3); break;
  case SK_GROW: a = dt_below(g->r, 5); break;
  case SK_DROP: a = 8 * dt_range(g->r, 1, g->eq / 8); break;
  default: a = 0; break;
  }
  if (kk->nparams) pl->args[0] = fb_value_i32((int32_t)a);
}

int dt_gen_prog_stream(uint64_t seed, int failing, dt_prog *out, char *err, size_t errlen) {
  dt_rng r = {seed ^ 0x57ea3ull ^ (failing ? 0xfa11ull : 0)};
  sgen g = {0};
  g.r = &r;
  g.p = out;
  memset(out, 0, sizeof *out);
  out->seed = seed;
  for (int tries = 0; tries < 100 && !out->l; tries++) out->l = stream_layout(&g);
  int nrand = 1 + (int)dt_below(&r, 2);
  g.cap = 256;
  out->ks = calloc((size_t)nrand + SK__COUNT + 2, sizeof *out->ks);
  out->steps = calloc((size_t)g.cap, sizeof *out->steps);
  if (!out->l || !out->ks || !out->steps) {
    dt_prog_free(out);
    return FB_ENOMEM;
  }
  /* kernels: the random ones, the stream's (SK_BAD only when failing), the probe */
  int skid[SK__COUNT];
  for (int i = 0; i < nrand + SK__COUNT + 1; i++) {
    fb_kernel *k;
    int sk = i - nrand;
    if (sk < 0) {
      char name[16];
      snprintf(name, sizeof name, "k%d", i);
      k = dt_gen_kernel(&r, out->l, name, 1);
    } else if (sk < SK__COUNT) {
      skid[sk] = -1;
      if (sk == SK_BAD && !failing) continue;
      k = stream_kernel(&g, out->l, sk);
      skid[sk] = out->nk;
    } else {
      k = dt_gen_probe(out->l); /* the layout has a pointer: never NULL but out of memory */
    }
    if (!k) {
      dt_prog_free(out);
      return FB_ENOMEM;
    }
    out->ks[out->nk++] = k;
    int rc = check_kernel(k, err, errlen);
    if (rc) {
      dt_prog_free(out);
      return rc;
    }
  }
  int probe = out->nk - 1;
  /* the period: stream kernels mostly, a random kernel sometimes */
  plaunch period[8];
  int plen = 2 + (int)dt_below(&r, 5);
  static const int pick[] = {SK_STEN, SK_STEN, SK_RD, SK_RD, SK_WZ, SK_NB, SK_ACT, SK_ACT, SK_GROW};
  for (int i = 0; i < plen; i++) {
    int x = (int)dt_below(&r, 12), k = (int)dt_below(&r, (uint32_t)nrand);
    /* a random kernel with a return value would make every period a sync */
    if (x < 9 || out->ks[k]->ret != FB_T_VOID)
      draw_launch(&g, skid[pick[x % 9]], pick[x % 9], &period[i]);
    else draw_launch(&g, k, -1, &period[i]);
  }
  if (failing) { /* bad(0) in the period, next to an element-wise neighbour */
    int at = (int)dt_below(&r, (uint32_t)plen + 1);
    memmove(&period[at + 1], &period[at], sizeof *period * (size_t)(plen - at));
    draw_launch(&g, skid[SK_BAD], SK_BAD, &period[at]);
    plen++;
  }
  int snap = dt_chance(&r, 75);
  /* the start: data in the dense group, some cells of q */
  put_host(&g, DT_FIELD_WRITE, g.z);
  put_host(&g, DT_FIELD_WRITE, g.w);
  if (dt_chance(&r, 60)) put_host(&g, DT_FIELD_WRITE, g.y);
  for (int i = (int)dt_below(&r, 4); i > 0; i--) put_host(&g, DT_CELL_WRITE, g.q);
  if (dt_chance(&r, 50)) put_kind(&g, DT_SYNC);
  if (dt_chance(&r, 70)) { /* a warm-up period and a sync: later windows demote against it,
                              and its tasks' code stands in for theirs (stand-ins) */
    for (int i = 0; i < plen; i++)
      if (!failing || period[i].kernel != skid[SK_BAD]) put_launch(&g, &period[i]);
    put_kind(&g, DT_SYNC);
  }
  int frames = 2 + (int)dt_below(&r, 5);
  int reps_max = (g.e > 100 ? 20 : 80) / plen + 1;
  int bad_frame = failing ? (int)dt_below(&r, (uint32_t)frames) : -1;
  for (int f = 0; f < frames; f++) {
    int reps = 2 + (int)dt_below(&r, (uint32_t)reps_max);
    int bad_rep = f == bad_frame ? 1 + (int)dt_below(&r, (uint32_t)reps) : -1;
    for (int rep = 0; rep < reps; rep++) {
      for (int i = 0; i < plen; i++) {
        plaunch pl = period[i];
        if (failing && rep == bad_rep && pl.kernel == skid[SK_BAD]) {
          pl.args[0] = fb_value_i32(1); /* the error, in a later repetition */
        } else if (dt_chance(&r, 1)) { /* the period breaks for one launch */
          draw_launch(&g, pl.kernel, pl.kernel >= nrand ? pl.kernel - nrand : -1, &pl);
        }
        put_launch(&g, &pl);
      }
      if (dt_chance(&r, 1)) put_host(&g, DT_CELL_READ, dt_chance(&r, 50) ? g.q : g.z);
      if (dt_chance(&r, 1)) put_host(&g, DT_CELL_WRITE, g.q);
    }
    uint32_t end = dt_below(&r, 100);
    if (end < 70) {
      put_kind(&g, DT_SYNC);
      if (snap) put_snapshot(&g);
    } else if (end < 85) {
      put_kind(&g, DT_FLUSH);
    }
    /* between frames: the host and kernels change q's cells */
    uint32_t x = dt_below(&r, 100);
    plaunch pl;
    if (x < 20) {
      put_host(&g, DT_CELL_WRITE, g.q);
    } else if (x < 30) {
      put_host(&g, DT_FIELD_WRITE, g.q);
    } else if (x < 45) {
      draw_launch(&g, skid[SK_DROP], SK_DROP, &pl);
      put_launch(&g, &pl);
      if (dt_chance(&r, 50)) put_kind(&g, DT_SYNC);
    } else if (x < 55) {
      draw_launch(&g, skid[SK_GROW], SK_GROW, &pl);
      put_launch(&g, &pl);
    } else if (x < 65) {
      put_host(&g, DT_CELL_READ, g.q);
    } else if (x < 72) {
      draw_launch(&g, probe, -1, &pl);
      put_launch(&g, &pl);
    } else if (x < 80) {
      put_host(&g, DT_FIELD_WRITE, pick_place(&r, out->l));
    } else if (x < 88) { /* a random kernel (maybe one with a return value) */
      draw_launch(&g, (int)dt_below(&r, (uint32_t)nrand), -1, &pl);
      put_launch(&g, &pl);
    }
  }
  plaunch pl;
  draw_launch(&g, probe, -1, &pl);
  put_launch(&g, &pl);
  if (g.oom) {
    dt_prog_free(out);
    return FB_ENOMEM;
  }
  return 0;
}
