/* Random SNode layouts for the differential tester: one to three groups
 * under the root, each a chain of one to three containers (dense, pointer,
 * bitmasked, in any order) splitting axis i or axes i and j, with fields at
 * the leaf (and sometimes in between), sometimes a dynamic list below the
 * chain (on a fresh axis); sometimes a dynamic list or a 0-D field at the
 * root. Most groups share the program's extents, so fields of different
 * groups line up (element-wise loops over several of them). Fields are
 * small (at most 16 cells along an axis), except in one program in ten,
 * whose fields have thousands of cells so that parallel loops are split
 * into several chunks and run on several threads (the CPU device hands out
 * at least 1024 iterations at a time). */
#include <stdio.h>

#include "dt.h"

typedef struct lgen {
  dt_rng *r;
  fb_layout *l;
  int nplaces, nnamed;
  int64_t ei, ej; /* the program's usual extents along i (1-D / 2-D) and j */
  int64_t ei2;
} lgen;

static fb_type pick_type(dt_rng *r) {
  uint32_t x = dt_below(r, 100);
  if (x < 35) return FB_T_I32;
  if (x < 55) return FB_T_I64;
  if (x < 75) return FB_T_U32;
  if (x < 90) return FB_T_F32;
  return FB_T_F64;
}

static int add_place(lgen *g, int parent) {
  char name[16];
  snprintf(name, sizeof name, "f%d", g->nplaces++);
  return fb_layout_place(g->l, parent, name, pick_type(g->r));
}

static int add_node(lgen *g, int parent, fb_snode_kind kind, const char *axes, const int64_t *sizes,
                    int64_t chunk) {
  char name[16];
  snprintf(name, sizeof name, "n%d", g->nnamed++);
  return fb_layout_add(g->l, parent, kind, axes, sizes, chunk, name);
}

static fb_snode_kind pick_kind(dt_rng *r) {
  uint32_t x = dt_below(r, 100);
  if (x < 40) return FB_SN_DENSE;
  if (x < 70) return FB_SN_POINTER;
  return FB_SN_BITMASKED;
}

/* Split e into n factors whose product is e, top level first. */
static void factor(dt_rng *r, int64_t e, int n, int64_t *out) {
  for (int i = 0; i < n - 1; i++) {
    int64_t divs[64];
    int nd = 0;
    for (int64_t d = 1; d <= e && nd < 64; d++)
      if (e % d == 0) divs[nd++] = d;
    out[i] = divs[dt_below(r, (uint32_t)nd)];
    e /= out[i];
  }
  out[n - 1] = e;
}

static int64_t pick_of(dt_rng *r, const int64_t *v, int n) { return v[dt_below(r, (uint32_t)n)]; }

static const int64_t ext1[] = {4, 5, 6, 8, 12, 16};
static const int64_t ext2i[] = {2, 3, 4, 6, 8};
static const int64_t ext2j[] = {2, 3, 4};

/* A dynamic list (1-2 fields) under parent, on axis `axis`. */
static int add_dynamic(lgen *g, int parent, const char *axis) {
  int64_t size = dt_range(g->r, 2, 10);
  int64_t chunk = dt_range(g->r, 1, size);
  int d = add_node(g, parent, FB_SN_DYNAMIC, axis, &size, chunk);
  if (d < 0) return d;
  int n = 1 + (int)dt_below(g->r, 2);
  for (int i = 0; i < n; i++)
    if (add_place(g, d) < 0) return -1;
  return 0;
}

static int gen_group(lgen *g) {
  dt_rng *r = g->r;
  int twod = dt_chance(r, 30);
  int depth = 1 + (int)dt_below(r, 3);
  int64_t ei = twod ? g->ei2 : g->ei, ej = g->ej;
  if (dt_chance(r, 20)) ei = twod ? pick_of(r, ext2i, 5) : pick_of(r, ext1, 6);
  if (dt_chance(r, 20)) ej = pick_of(r, ext2j, 3);
  int64_t fi[3], fj[3];
  factor(r, ei, depth, fi);
  factor(r, ej, depth, fj);
  int parent = 0;
  for (int d = 0; d < depth; d++) {
    int64_t sizes[2] = {fi[d], fj[d]};
    int id = add_node(g, parent, pick_kind(r), twod ? "ij" : "i", sizes, 0);
    if (id < 0) return id;
    if (d < depth - 1 && dt_chance(r, 20) && add_place(g, id) < 0) return -1;
    parent = id;
  }
  if (dt_chance(r, 30)) {
    if (add_dynamic(g, parent, twod ? "k" : "j") < 0) return -1;
    if (dt_chance(r, 50) && add_place(g, parent) < 0) return -1;
    return 0;
  }
  int n = 1 + (int)dt_below(r, 3);
  for (int i = 0; i < n; i++)
    if (add_place(g, parent) < 0) return -1;
  return 0;
}

static fb_layout *try_layout(dt_rng *r) {
  lgen g = {0};
  g.r = r;
  g.l = fb_layout_new();
  if (!g.l) return NULL;
  g.ei = pick_of(r, ext1, 6);
  g.ei2 = pick_of(r, ext2i, 5);
  g.ej = pick_of(r, ext2j, 3);
  if (dt_chance(r, 10)) { /* large: loops of several chunks, run by several threads */
    static const int64_t big1[] = {2048, 3072, 4096}, big2i[] = {64, 96}, big2j[] = {32, 48};
    g.ei = pick_of(r, big1, 3);
    g.ei2 = pick_of(r, big2i, 2);
    g.ej = pick_of(r, big2j, 2);
  }
  int groups = 1 + (int)dt_below(r, 3), rc = 0;
  for (int i = 0; i < groups && rc == 0; i++) rc = gen_group(&g);
  if (rc == 0 && dt_chance(r, 10)) rc = add_dynamic(&g, 0, "i");
  if (rc == 0 && dt_chance(r, 40)) rc = add_place(&g, 0) < 0 ? -1 : 0;
  if (rc == 0 && g.l->nnodes <= DT_MAXN && fb_layout_finalize(g.l, NULL, 0) == 0) return g.l;
  fb_layout_free(g.l);
  return NULL;
}

fb_layout *dt_gen_layout(dt_rng *r) {
  for (int tries = 0; tries < 100; tries++) {
    fb_layout *l = try_layout(r);
    if (l) return l;
  }
  return NULL;
}
