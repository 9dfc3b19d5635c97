/* Programs for the differential tester: the random source, a layout, one to
 * three random kernels (k0..k2) and the probe kernel, and a list of steps —
 * launches with random arguments, host reads and writes of whole fields and
 * single cells, flushes and syncs — ending with a launch of the probe (which
 * returns a hash of every sparse cell's activity and every list's length).
 * Programs are small (compilation dominates the test's time) but many. */
#include <stdlib.h>
#include <string.h>

#include "dt.h"

/* ---------------------------------------------------------------- random */

uint64_t dt_next(dt_rng *r) { /* splitmix64 */
  uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

uint32_t dt_below(dt_rng *r, uint32_t n) { return n ? (uint32_t)(dt_next(r) % n) : 0; }
int dt_chance(dt_rng *r, int percent) { return (int)dt_below(r, 100) < percent; }
int64_t dt_range(dt_rng *r, int64_t lo, int64_t hi) {
  return lo + (int64_t)(dt_next(r) % (uint64_t)(hi - lo + 1));
}

/* ---------------------------------------------------------------- programs */

const char *dt_step_name(int kind) {
  static const char *const names[DT_STEP__COUNT] = {
      "launch", "field_read", "field_write", "cell_read", "cell_write", "flush", "sync"};
  return kind >= 0 && kind < DT_STEP__COUNT ? names[kind] : "?";
}

void dt_prog_free(dt_prog *p) {
  for (int i = 0; i < p->nk; i++) fb_kernel_free(p->ks[i]);
  free(p->ks);
  free(p->steps);
  fb_layout_free(p->l);
  memset(p, 0, sizeof *p);
}

int dt_prog_copy(const dt_prog *p, dt_prog *out) {
  memset(out, 0, sizeof *out);
  out->seed = p->seed;
  out->l = fb_layout_clone(p->l);
  out->ks = calloc((size_t)p->nk + 1, sizeof *out->ks);
  out->steps = malloc(sizeof *out->steps * ((size_t)p->nsteps + 1));
  if (!out->l || !out->ks || !out->steps) {
    dt_prog_free(out);
    return FB_ENOMEM;
  }
  for (int i = 0; i < p->nk; i++) {
    if (!(out->ks[i] = fb_kernel_clone_to(p->ks[i], out->l))) {
      dt_prog_free(out);
      return FB_ENOMEM;
    }
    out->nk = i + 1;
  }
  if (p->nsteps) memcpy(out->steps, p->steps, sizeof *p->steps * (size_t)p->nsteps);
  out->nsteps = p->nsteps;
  return 0;
}

/* ---------------------------------------------------------------- values */

static fb_value rand_scalar(dt_rng *r, fb_type t) {
  uint32_t x = dt_below(r, 20);
  if (fb_type_is_float(t)) {
    double f = x < 16 ? (double)dt_range(r, -60, 60) / 4.0 : x < 18 ? 1e9 : -3.5;
    return t == FB_T_F32 ? fb_value_f32((float)f) : fb_value_f64(f);
  }
  int64_t v = x < 14   ? dt_range(r, -5, 40)
              : x < 16 ? (int64_t)dt_next(r)
              : x < 17 ? INT32_MIN
              : x < 18 ? INT32_MAX
              : x < 19 ? -1
                       : (int64_t)1 << 33;
  return fb_value_cast(fb_value_i64(v), t);
}

void dt_field_data(const fb_layout *l, int field, uint64_t seed, void *dst) {
  const fb_snode *f = &l->nodes[field];
  size_t sz = fb_type_size(f->type);
  int64_t n = fb_field_numel(l, field);
  dt_rng r = {seed};
  for (int64_t i = 0; i < n; i++)
    fb_value_store(rand_scalar(&r, f->type), (char *)dst + (size_t)i * sz);
}

/* ---------------------------------------------------------------- steps */

static int pick_place(dt_rng *r, const fb_layout *l) {
  int cand[DT_MAXN], n = 0;
  for (int i = 1; i < l->nnodes; i++)
    if (l->nodes[i].kind == FB_SN_PLACE) cand[n++] = i;
  return cand[dt_below(r, (uint32_t)n)];
}

static void launch_step(dt_rng *r, const dt_prog *p, int kernel, dt_step *s) {
  const fb_kernel *k = p->ks[kernel];
  s->kind = DT_LAUNCH;
  s->kernel = kernel;
  s->nargs = k->nparams;
  for (int i = 0; i < k->nparams; i++) s->args[i] = rand_scalar(r, k->params[i]);
}

static void host_step(dt_rng *r, const fb_layout *l, int kind, dt_step *s) {
  s->kind = kind;
  s->field = pick_place(r, l);
  const fb_snode *f = &l->nodes[s->field];
  for (int d = 0; d < f->ndim; d++)
    s->idx[d] = (int64_t)dt_below(r, (uint32_t)f->shape[f->dim_axis[d]]);
  s->val = rand_scalar(r, f->type);
  s->data = dt_next(r);
}

static void gen_steps(dt_rng *r, dt_prog *p, int has_probe, int scale) {
  int nuser = p->nk - has_probe;
  int init = 1 + (int)dt_below(r, 3); /* start from data, not zeros */
  for (int i = 0; i < init; i++) {
    dt_step *s = &p->steps[p->nsteps++];
    memset(s, 0, sizeof *s);
    host_step(r, p->l, DT_FIELD_WRITE, s);
  }
  int n = 4 + (int)dt_below(r, 10 * (uint32_t)scale);
  for (int i = 0; i < n; i++) {
    dt_step *s = &p->steps[p->nsteps++];
    memset(s, 0, sizeof *s);
    uint32_t x = dt_below(r, 100);
    if (x < 60) {
      launch_step(r, p, (int)dt_below(r, (uint32_t)nuser), s);
      if (dt_chance(r, 25) && i + 1 < n) { /* again at once, other arguments: fusion renames */
        dt_step *t = &p->steps[p->nsteps++];
        memset(t, 0, sizeof *t);
        launch_step(r, p, s->kernel, t);
        i++;
      }
    } else if (x < 68) host_step(r, p->l, DT_FIELD_READ, s);
    else if (x < 74) host_step(r, p->l, DT_FIELD_WRITE, s);
    else if (x < 80) host_step(r, p->l, DT_CELL_READ, s);
    else if (x < 86) host_step(r, p->l, DT_CELL_WRITE, s);
    else if (x < 93) s->kind = DT_FLUSH;
    else if (x < 96) s->kind = DT_SYNC;
    else launch_step(r, p, has_probe ? p->nk - 1 : 0, s);
  }
  if (has_probe) {
    dt_step *s = &p->steps[p->nsteps++];
    memset(s, 0, sizeof *s);
    launch_step(r, p, p->nk - 1, s);
  }
}

static int check_kernel(const fb_kernel *k, char *err, size_t errlen) {
  fb_diags d;
  fb_diags_init(&d);
  int rc = fb_verify(k, &d);
  if (rc) {
    char *msg = fb_diags_join(&d);
    char *text = fb_kernel_print(k);
    snprintf(err, errlen, "generated kernel %s fails the verifier:\n%s\n%s", k->name,
             msg ? msg : "?", text ? text : "?");
    free(msg);
    free(text);
  }
  fb_diags_free(&d);
  return rc;
}

int dt_gen_prog(uint64_t seed, dt_prog *out, char *err, size_t errlen) {
  return dt_gen_prog_scaled(seed, 1, out, err, errlen);
}

int dt_gen_prog_scaled(uint64_t seed, int scale, dt_prog *out, char *err, size_t errlen) {
  dt_rng r = {seed};
  if (scale < 1) scale = 1;
  if (scale > 16) scale = 16;
  memset(out, 0, sizeof *out);
  out->seed = seed;
  out->l = dt_gen_layout(&r);
  int nk = 1 + (int)dt_below(&r, 2 + (uint32_t)scale);
  out->ks = calloc((size_t)nk + 2, sizeof *out->ks);
  out->steps = calloc(16 + 10 * (size_t)scale, sizeof *out->steps);
  if (!out->l || !out->ks || !out->steps) {
    dt_prog_free(out);
    return FB_ENOMEM;
  }
  for (int i = 0; i < nk; i++) {
    char name[16];
    snprintf(name, sizeof name, "k%d", i);
    fb_kernel *k = dt_gen_kernel(&r, out->l, name, scale);
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
  fb_kernel *probe = dt_gen_probe(out->l);
  if (probe) {
    out->ks[out->nk++] = probe;
    int rc = check_kernel(probe, err, errlen);
    if (rc) {
      dt_prog_free(out);
      return rc;
    }
  }
  gen_steps(&r, out, probe != NULL, scale);
  return 0;
}

/* ---------------------------------------------------------------- big programs */

static dt_step *new_step(dt_prog *p) {
  dt_step *s = &p->steps[p->nsteps++];
  memset(s, 0, sizeof *s);
  return s;
}

int dt_gen_prog_big(uint64_t seed, dt_prog *out, char *err, size_t errlen) {
  dt_rng r = {seed ^ 0xb16b0d1e5ull}; /* not the ordinary program of the seed */
  memset(out, 0, sizeof *out);
  out->seed = seed;
  out->l = dt_gen_layout(&r);
  int nk = 1 + (int)dt_below(&r, 2), groups = 2 + (int)dt_below(&r, 3);
  out->ks = calloc((size_t)nk + 2, sizeof *out->ks);
  out->steps = calloc(4 + (size_t)groups * 48, sizeof *out->steps);
  if (!out->l || !out->ks || !out->steps) {
    dt_prog_free(out);
    return FB_ENOMEM;
  }
  for (int i = 0; i < nk; i++) {
    char name[16];
    snprintf(name, sizeof name, "big%d", i);
    /* 8..DT_MAXP parameters: a few launches of one pass the GPU's 503 */
    int np = 8 + (int)dt_below(&r, DT_MAXP - 8 + 1);
    fb_kernel *k = dt_gen_kernel_big(&r, out->l, name, np, 24 + (int)dt_below(&r, 24),
                                     1 + (int)dt_below(&r, 2));
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
  fb_kernel *probe = dt_gen_probe(out->l);
  if (probe) {
    out->ks[out->nk++] = probe;
    int rc = check_kernel(probe, err, errlen);
    if (rc) {
      dt_prog_free(out);
      return rc;
    }
  }
  host_step(&r, out->l, DT_FIELD_WRITE, new_step(out));
  for (int g = 0; g < groups; g++) {
    /* one kernel many times in a row, other arguments each time: chains
     * that only the cost model and the caps stop */
    int kernel = (int)dt_below(&r, (uint32_t)nk), n = 6 + (int)dt_below(&r, 41);
    for (int i = 0; i < n; i++) launch_step(&r, out, kernel, new_step(out));
    uint32_t x = dt_below(&r, 4);
    if (x == 0) host_step(&r, out->l, DT_FIELD_READ, new_step(out));
    else if (x == 1) host_step(&r, out->l, DT_CELL_WRITE, new_step(out));
    else if (x == 2) new_step(out)->kind = DT_FLUSH;
  }
  if (probe) launch_step(&r, out, out->nk - 1, new_step(out));
  return 0;
}

/* ---------------------------------------------------------------- failing programs */

/* A place whose SNodes above are all dense: a store past its first axis
 * is out of bounds and nothing else. -1 when there is none. */
static int dense_place(dt_rng *r, const fb_layout *l) {
  int cand[DT_MAXN], n = 0;
  for (int i = 1; i < l->nnodes; i++) {
    if (l->nodes[i].kind != FB_SN_PLACE || l->nodes[i].ndim < 1) continue;
    int ok = 1;
    for (int a = l->nodes[i].parent; a > 0; a = l->nodes[a].parent)
      if (l->nodes[a].kind != FB_SN_DENSE) ok = 0;
    if (ok) cand[n++] = i;
  }
  return n ? cand[dt_below(r, (uint32_t)n)] : -1;
}

/* kernel oob(): for i in 0 .. 3 { f[extent + i, 0, ...] = 1 } */
static fb_kernel *oob_kernel(const fb_layout *l, int f) {
  const fb_snode *s = &l->nodes[f];
  fb_kernel *k = fb_kernel_new(l, "oob", 0, NULL, FB_T_VOID);
  if (!k) return NULL;
  fb_builder b;
  fb_builder_init(&b, k);
  int loop = fb_b_range_for(&b, fb_b_const_i32(&b, 0), fb_b_const_i32(&b, 3), 1);
  fb_b_enter(&b, k->stmts[loop].body);
  int ix[FB_MAX_AXES];
  ix[0] = fb_b_binary(&b, FB_OP_ADD, fb_b_loop_index(&b, loop, 0),
                      fb_b_const_i32(&b, (int32_t)s->shape[s->dim_axis[0]]));
  for (int d = 1; d < s->ndim; d++) ix[d] = fb_b_const_i32(&b, 0);
  fb_b_store(&b, f, ix, s->ndim, fb_b_const(&b, fb_value_cast(fb_value_i32(1), s->type)));
  if (b.err) {
    fb_kernel_free(k);
    return NULL;
  }
  return k;
}

int dt_gen_prog_failing(uint64_t seed, dt_prog *out, char *err, size_t errlen) {
  int rc = dt_gen_prog(seed, out, err, errlen);
  if (rc) return rc;
  dt_rng r = {seed ^ 0xbadba5e5ull};
  int f = dense_place(&r, out->l);
  if (f < 0) return 0; /* no dense field: an ordinary program */
  fb_kernel *k = oob_kernel(out->l, f);
  fb_kernel **ks = realloc(out->ks, sizeof *ks * ((size_t)out->nk + 2));
  dt_step *steps = realloc(out->steps, sizeof *steps * ((size_t)out->nsteps + 4));
  if (ks) out->ks = ks;
  if (steps) out->steps = steps;
  if (!k || !ks || !steps) {
    fb_kernel_free(k);
    dt_prog_free(out);
    return FB_ENOMEM;
  }
  if ((rc = check_kernel(k, err, errlen))) {
    fb_kernel_free(k);
    dt_prog_free(out);
    return rc;
  }
  out->ks[out->nk++] = k; /* after the probe: no step names a kernel by position but launches */
  int oob = out->nk - 1;
  int n = 1 + (int)dt_below(&r, 3);
  for (int i = 0; i < n; i++) {
    int pos = (int)dt_below(&r, (uint32_t)out->nsteps); /* never after the last step */
    memmove(&out->steps[pos + 1], &out->steps[pos],
            sizeof *out->steps * (size_t)(out->nsteps - pos));
    out->nsteps++;
    memset(&out->steps[pos], 0, sizeof out->steps[pos]);
    out->steps[pos].kind = DT_LAUNCH;
    out->steps[pos].kernel = oob;
  }
  return 0;
}
