/* libFuzzer target: what fuseboxd does with a client's layout and kernels,
 * from the wire to the reference interpreter.
 *
 * Input framing: a 4-byte little-endian length n, then n bytes of a
 * fusebox.v1.CreateSessionRequest (its layout), then the rest of the input
 * as a fusebox.v1.RegisterKernelsRequest (its kernels). Each input goes
 * through the server's own checks in the server's order:
 *   fbp_layout_from_pb (fb_layout_finalize) -> per kernel fbp_kernel_from_pb
 *   -> fb_kernel_check_public (statement budget) -> fb_verify
 * and every kernel that passes runs once in the interpreter (all of them on
 * one interpreter, so that sparse state carries from one to the next), with
 * zero arguments of its parameter types and a step budget.
 *
 * Resources are bounded here, not by the code under test: layouts whose
 * interpreter storage (fields, sparse activity) would pass FUZZ_MAX_BYTES are
 * skipped before an interpreter is made (the interpreter allocates every
 * field in full), and each run stops after FUZZ_MAX_STEPS steps.
 *
 * Mutation: a custom mutator (LLVMFuzzerCustomMutator) changes decoded
 * inputs structurally half of the time; see below.
 *
 * Seeds: `fuzz_ir --make-seeds DIR FILE.fbk...` parses each .fbk program with
 * the front end, instantiates its kernels that take no field parameters,
 * and writes one input per program into DIR (scripts/fuzz.sh does this, so
 * no binary seeds are checked in). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fusebox/ir.h"
#include "fusebox/lang.h"
#include "proto/convert.h"

#define FUZZ_MAX_BYTES ((uint64_t)64 << 20) /* interpreter storage per input */
#define FUZZ_MAX_STEPS 200000               /* per kernel run */
#define FUZZ_MAX_STMTS 2000                 /* fb_kernel_check_public's budget */
#define FUZZ_MAX_KERNELS 16                 /* kernels run per input */

/* ---------------------------------------------------------------- resource cap */

/* Add a * b to *total; 1 when that passes FUZZ_MAX_BYTES. */
static int charge(uint64_t *total, uint64_t a, uint64_t b) {
  uint64_t p;
  return __builtin_mul_overflow(a, b, &p) || __builtin_add_overflow(*total, p, total) ||
         *total > FUZZ_MAX_BYTES;
}

static uint64_t cells_of(const fb_snode *s) {
  uint64_t n = 1;
  for (int a = 0; a < FB_MAX_AXES; a++)
    if (__builtin_mul_overflow(n, (uint64_t)s->shape[a], &n)) return UINT64_MAX;
  return n;
}

/* What fb_interp_new would allocate for l (ir/interp.c alloc_node), within
 * FUZZ_MAX_BYTES: 1 when it fits. */
static int interp_fits(const fb_layout *l) {
  uint64_t total = 0;
  if (l->root_bytes > FUZZ_MAX_BYTES) return 0;
  for (int i = 0; i < l->nnodes; i++) {
    const fb_snode *s = &l->nodes[i];
    int bad = 0;
    if (s->kind == FB_SN_PLACE) bad = charge(&total, cells_of(s), fb_type_size(s->type));
    else if (s->kind == FB_SN_BITMASKED || s->kind == FB_SN_POINTER)
      bad = charge(&total, cells_of(s) / 8 + 8, 1);
    else if (s->kind == FB_SN_DYNAMIC && s->parent >= 0)
      bad = charge(&total, cells_of(&l->nodes[s->parent]), 8);
    if (bad) return 0;
  }
  return 1;
}

/* ---------------------------------------------------------------- one input */

static void run_kernels(const fb_layout *l, const Fusebox__V1__RegisterKernelsRequest *rk) {
  char err[512];
  fb_interp *in = NULL;
  size_t nk = rk->n_kernels < FUZZ_MAX_KERNELS ? rk->n_kernels : FUZZ_MAX_KERNELS;
  for (size_t i = 0; i < nk; i++) {
    fb_kernel *k = NULL;
    if (fbp_kernel_from_pb(rk->kernels[i], l, &k, err, sizeof err)) continue;
    fb_diags d;
    fb_diags_init(&d);
    if (!fb_kernel_check_public(k, FUZZ_MAX_STMTS, err, sizeof err) && !fb_verify(k, &d)) {
      if (!in) {
        in = fb_interp_new(l, 1);
        if (in) fb_interp_set_step_limit(in, FUZZ_MAX_STEPS);
      }
      if (in) {
        fb_value args[1024];
        int np = k->nparams < 1024 ? k->nparams : 1024;
        for (int a = 0; a < np; a++) {
          args[a].type = k->params[a];
          args[a].v.u = 0;
        }
        fb_value ret;
        int rc = fb_interp_run(in, k, args, np, &ret);
        /* a verified kernel with arguments of its types runs (perhaps out of
         * bounds) or stops at the step budget; anything else is a bug */
        if (rc != 0 && rc != FB_EBOUNDS && rc != FB_EQUOTA) {
          fprintf(stderr, "fuzz_ir: verified kernel %s failed to run: %s: %s\n", k->name,
                  fb_strerror(rc), fb_interp_errmsg(in));
          abort();
        }
      }
    }
    fb_diags_free(&d);
    fb_kernel_free(k);
  }
  fb_interp_free(in);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 4) return 0;
  size_t n1 =
      (size_t)data[0] | (size_t)data[1] << 8 | (size_t)data[2] << 16 | (size_t)data[3] << 24;
  if (n1 > size - 4) return 0;
  const uint8_t *p1 = data + 4, *p2 = p1 + n1;
  size_t n2 = size - 4 - n1;
  Fusebox__V1__CreateSessionRequest *cs = fusebox__v1__create_session_request__unpack(NULL, n1, p1);
  if (!cs) return 0;
  char err[512];
  fb_layout *l = NULL;
  if (!fbp_layout_from_pb(cs->layout, &l, err, sizeof err)) {
    Fusebox__V1__RegisterKernelsRequest *rk =
        fusebox__v1__register_kernels_request__unpack(NULL, n2, p2);
    if (rk) {
      if (interp_fits(l)) run_kernels(l, rk);
      fusebox__v1__register_kernels_request__free_unpacked(rk, NULL);
    }
    fb_layout_free(l);
  }
  fusebox__v1__create_session_request__free_unpacked(cs, NULL);
  return 0;
}

/* ---------------------------------------------------------------- structure-aware mutation
 * Byte-level mutation of protobuf rarely makes a kernel that still decodes
 * and verifies, so half the time the input is decoded, one to four of its
 * statements, blocks, parameters or SNodes are changed the way a hostile
 * client could (any op, operand, SNode, immediate, type or block), and it is
 * encoded again. The other half, and for inputs that do not decode,
 * libFuzzer's own byte mutations run. */

size_t LLVMFuzzerMutate(uint8_t *data, size_t size, size_t max_size);

static uint64_t rng_next(uint64_t *s) {
  uint64_t x = *s;
  x ^= x << 13;
  x ^= x >> 7;
  x ^= x << 17;
  return *s = x;
}

static uint64_t rng_below(uint64_t *s, uint64_t n) { return n ? rng_next(s) % n : 0; }

/* A small or extreme integer: what breaks arithmetic. */
static int64_t interesting(uint64_t *r) {
  static const int64_t v[] = {0,
                              1,
                              -1,
                              2,
                              3,
                              4,
                              7,
                              8,
                              31,
                              32,
                              33,
                              63,
                              64,
                              255,
                              256,
                              1024,
                              65535,
                              65536,
                              1 << 20,
                              INT32_MAX,
                              INT32_MIN,
                              (int64_t)INT32_MAX + 1,
                              INT64_MAX,
                              INT64_MIN,
                              (int64_t)1 << 31,
                              (int64_t)1 << 32,
                              (int64_t)1 << 56,
                              (int64_t)1 << 62};
  if (rng_below(r, 4) == 0) return (int64_t)rng_next(r);
  return v[rng_below(r, sizeof v / sizeof v[0])];
}

/* A statement, block or SNode id near the valid range (or just outside). */
static int32_t some_id(uint64_t *r, size_t n) {
  if (rng_below(r, 8) == 0) return (int32_t)interesting(r);
  return (int32_t)rng_below(r, n + 2) - 1;
}

static void *grow(fbp_arena *a, const void *old, size_t n, size_t elem) {
  void *p = fbp_alloc(a, (n + 1) * elem);
  if (p && n) memcpy(p, old, n * elem);
  return p;
}

static void mutate_stmt(fbp_arena *a, uint64_t *r, Fusebox__V1__Stmt *st,
                        const Fusebox__V1__Kernel *k, size_t nnodes) {
  switch (rng_below(r, 8)) {
  case 0: st->op = (char *)fb_op_table[rng_below(r, FB_OP__COUNT)].name; break;
  case 1: st->type = (Fusebox__V1__ScalarType)rng_below(r, 9); break;
  case 2: st->snode = some_id(r, nnodes); break;
  case 3:
    if (st->n_args && rng_below(r, 3)) st->args[rng_below(r, st->n_args)] = some_id(r, k->n_stmts);
    else if (st->n_args && rng_below(r, 2)) st->n_args--;
    else if (st->n_args < 8) {
      int32_t *na = grow(a, st->args, st->n_args, sizeof *na);
      if (na) {
        na[st->n_args] = some_id(r, k->n_stmts);
        st->args = na;
        st->n_args++;
      }
    }
    break;
  case 4: st->imm = (uint64_t)interesting(r); break;
  case 5: st->body = some_id(r, k->n_blocks); break;
  case 6: st->orelse = some_id(r, k->n_blocks); break;
  default: { /* a float immediate */
    static const double f[] = {0.0,        -0.0,      1.0,          -1.0,   0.5,
                               1e30,       -1e30,     3e9,          -3e9,   1.0 / 0.0,
                               -1.0 / 0.0, 0.0 / 0.0, 2147483648.0, 9.3e18, 1e-40};
    double d = f[rng_below(r, sizeof f / sizeof f[0])];
    memcpy(&st->imm, &d, sizeof d);
  }
  }
}

static void mutate_kernel(fbp_arena *a, uint64_t *r, Fusebox__V1__Kernel *k, size_t nnodes) {
  unsigned what = (unsigned)rng_below(r, 10);
  if (what < 5 && k->n_stmts) {
    mutate_stmt(a, r, k->stmts[rng_below(r, k->n_stmts)], k, nnodes);
  } else if (what < 7 && k->n_blocks) { /* a block: change, drop, add or swap an id */
    Fusebox__V1__Block *b = k->blocks[rng_below(r, k->n_blocks)];
    unsigned how = (unsigned)rng_below(r, 4);
    if (how == 0 && b->n_ids) b->ids[rng_below(r, b->n_ids)] = some_id(r, k->n_stmts);
    else if (how == 1 && b->n_ids) {
      size_t at = rng_below(r, b->n_ids);
      memmove(&b->ids[at], &b->ids[at + 1], (b->n_ids - at - 1) * sizeof *b->ids);
      b->n_ids--;
    } else if (how == 2 && b->n_ids > 1) {
      size_t x = rng_below(r, b->n_ids), y = rng_below(r, b->n_ids);
      int32_t t = b->ids[x];
      b->ids[x] = b->ids[y];
      b->ids[y] = t;
    } else {
      int32_t *ni = grow(a, b->ids, b->n_ids, sizeof *ni);
      if (ni) {
        size_t at = rng_below(r, b->n_ids + 1);
        memmove(&ni[at + 1], &ni[at], (b->n_ids - at) * sizeof *ni);
        ni[at] = some_id(r, k->n_stmts);
        b->ids = ni;
        b->n_ids++;
      }
    }
  } else if (what < 8 && k->n_stmts) { /* a copy of a statement, appended to a block */
    Fusebox__V1__Stmt **ns = grow(a, k->stmts, k->n_stmts, sizeof *ns);
    Fusebox__V1__Stmt *st = fbp_alloc(a, sizeof *st);
    if (ns && st && k->n_blocks) {
      *st = *k->stmts[rng_below(r, k->n_stmts)];
      if (rng_below(r, 2)) mutate_stmt(a, r, st, k, nnodes);
      ns[k->n_stmts] = st;
      Fusebox__V1__Block *b = k->blocks[rng_below(r, k->n_blocks)];
      int32_t *ni = grow(a, b->ids, b->n_ids, sizeof *ni);
      if (ni) {
        ni[b->n_ids] = (int32_t)k->n_stmts;
        b->ids = ni;
        b->n_ids++;
      }
      k->stmts = ns;
      k->n_stmts++;
    }
  } else if (what < 9) { /* a new empty block */
    Fusebox__V1__Block **nb = grow(a, k->blocks, k->n_blocks, sizeof *nb);
    Fusebox__V1__Block *b = fbp_alloc(a, sizeof *b);
    if (nb && b) {
      fusebox__v1__block__init(b);
      nb[k->n_blocks] = b;
      k->blocks = nb;
      k->n_blocks++;
    }
  } else { /* parameters and return type */
    if (k->n_params && rng_below(r, 2))
      k->params[rng_below(r, k->n_params)] = (Fusebox__V1__ScalarType)rng_below(r, 9);
    else if (rng_below(r, 2)) k->ret = (Fusebox__V1__ScalarType)rng_below(r, 9);
    else {
      Fusebox__V1__ScalarType *np = grow(a, k->params, k->n_params, sizeof *np);
      if (np) {
        np[k->n_params] = (Fusebox__V1__ScalarType)(1 + rng_below(r, 7));
        k->params = np;
        k->n_params++;
      }
    }
  }
}

static void mutate_node(fbp_arena *a, uint64_t *r, Fusebox__V1__Layout *l) {
  if (!l->n_nodes) return;
  Fusebox__V1__SNode *n = l->nodes[rng_below(r, l->n_nodes)];
  switch (rng_below(r, 7)) {
  case 0: n->kind = (Fusebox__V1__SNodeKind)rng_below(r, 7); break;
  case 1: n->parent = some_id(r, l->n_nodes); break;
  case 2: n->axes = (uint32_t)rng_below(r, 20); break;
  case 3:
    if (n->n_size) n->size[rng_below(r, n->n_size)] = interesting(r);
    break;
  case 4: n->chunk = interesting(r); break;
  case 5: n->type = (Fusebox__V1__ScalarType)rng_below(r, 9); break;
  default: { /* a copy of a node, appended */
    Fusebox__V1__SNode **nn = grow(a, l->nodes, l->n_nodes, sizeof *nn);
    Fusebox__V1__SNode *c = fbp_alloc(a, sizeof *c);
    if (nn && c) {
      *c = *l->nodes[rng_below(r, l->n_nodes)];
      if (rng_below(r, 2)) c->parent = (int32_t)rng_below(r, l->n_nodes);
      nn[l->n_nodes] = c;
      l->nodes = nn;
      l->n_nodes++;
    }
  }
  }
}

size_t LLVMFuzzerCustomMutator(uint8_t *data, size_t size, size_t max_size, unsigned int seed) {
  uint64_t r = (uint64_t)seed * 0x9e3779b97f4a7c15ull | 1;
  if (rng_below(&r, 2) == 0 || size < 4) return LLVMFuzzerMutate(data, size, max_size);
  size_t n1 =
      (size_t)data[0] | (size_t)data[1] << 8 | (size_t)data[2] << 16 | (size_t)data[3] << 24;
  if (n1 > size - 4) return LLVMFuzzerMutate(data, size, max_size);
  fbp_arena a;
  fbp_arena_init(&a);
  Fusebox__V1__CreateSessionRequest *cs =
      fusebox__v1__create_session_request__unpack(&a.pb, n1, data + 4);
  Fusebox__V1__RegisterKernelsRequest *rk =
      fusebox__v1__register_kernels_request__unpack(&a.pb, size - 4 - n1, data + 4 + n1);
  if (!cs || !cs->layout || !rk) {
    fbp_arena_free(&a);
    return LLVMFuzzerMutate(data, size, max_size);
  }
  int times = 1 + (int)rng_below(&r, 4);
  for (int t = 0; t < times; t++) {
    if (rk->n_kernels && rng_below(&r, 5)) {
      mutate_kernel(&a, &r, rk->kernels[rng_below(&r, rk->n_kernels)], cs->layout->n_nodes);
    } else if (rk->n_kernels > 1 && rng_below(&r, 4) == 0) { /* drop a kernel */
      size_t at = rng_below(&r, rk->n_kernels);
      memmove(&rk->kernels[at], &rk->kernels[at + 1],
              (rk->n_kernels - at - 1) * sizeof *rk->kernels);
      rk->n_kernels--;
    } else {
      mutate_node(&a, &r, cs->layout);
    }
  }
  size_t m1 = fusebox__v1__create_session_request__get_packed_size(cs);
  size_t m2 = fusebox__v1__register_kernels_request__get_packed_size(rk);
  if (4 + m1 + m2 > max_size) {
    fbp_arena_free(&a);
    return LLVMFuzzerMutate(data, size, max_size);
  }
  for (int b = 0; b < 4; b++) data[b] = (uint8_t)(m1 >> (8 * b));
  fusebox__v1__create_session_request__pack(cs, data + 4);
  fusebox__v1__register_kernels_request__pack(rk, data + 4 + m1);
  fbp_arena_free(&a);
  return 4 + m1 + m2;
}

/* ---------------------------------------------------------------- seeds */

static char *read_file(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  char *buf = NULL;
  size_t n = 0, cap = 0;
  for (;;) {
    if (n + 4096 + 1 > cap) {
      cap = (n + 4096 + 1) * 2;
      char *nb = realloc(buf, cap);
      if (!nb) {
        free(buf);
        fclose(f);
        return NULL;
      }
      buf = nb;
    }
    size_t got = fread(buf + n, 1, 4096, f);
    n += got;
    if (got < 4096) break;
  }
  fclose(f);
  buf[n] = 0;
  return buf;
}

/* One seed from a .fbk program: its layout and its kernels without field
 * parameters. 0 on success. */
static int make_seed(const char *dir, const char *path) {
  char *src = read_file(path);
  if (!src) {
    fprintf(stderr, "fuzz_ir: cannot read %s: %s\n", path, strerror(errno));
    return 1;
  }
  fb_diags d;
  fb_diags_init(&d);
  fb_program *prog = NULL;
  int rc = fb_program_parse(path, src, &prog, &d);
  if (rc) {
    char *msg = fb_diags_render(path, src, &d);
    fprintf(stderr, "fuzz_ir: %s does not parse:\n%s", path, msg ? msg : "");
    free(msg);
    fb_diags_free(&d);
    free(src);
    return 1;
  }
  fbp_arena a;
  fbp_arena_init(&a);
  Fusebox__V1__CreateSessionRequest cs = FUSEBOX__V1__CREATE_SESSION_REQUEST__INIT;
  Fusebox__V1__RegisterKernelsRequest rk = FUSEBOX__V1__REGISTER_KERNELS_REQUEST__INIT;
  cs.layout = fbp_layout_to_pb(&a, fb_program_layout(prog));
  int nk = fb_program_nkernels(prog);
  rk.kernels = fbp_alloc(&a, sizeof *rk.kernels * (size_t)(nk + 1));
  for (int i = 0; i < nk && rk.kernels; i++) {
    const fb_lang_kernel *lk = fb_program_kernel(prog, i);
    fb_kernel *k = NULL;
    if (lk->nfield_params || fb_program_instantiate(prog, lk->name, NULL, 0, &k, &d)) continue;
    Fusebox__V1__Kernel *m = fbp_kernel_to_pb(&a, k);
    if (m) rk.kernels[rk.n_kernels++] = m;
  }
  rc = 1;
  if (cs.layout && rk.kernels) {
    size_t n1 = fusebox__v1__create_session_request__get_packed_size(&cs);
    size_t n2 = fusebox__v1__register_kernels_request__get_packed_size(&rk);
    uint8_t *buf = malloc(4 + n1 + n2);
    if (buf) {
      for (int b = 0; b < 4; b++) buf[b] = (uint8_t)(n1 >> (8 * b));
      fusebox__v1__create_session_request__pack(&cs, buf + 4);
      fusebox__v1__register_kernels_request__pack(&rk, buf + 4 + n1);
      const char *base = strrchr(path, '/');
      base = base ? base + 1 : path;
      char out[4096];
      snprintf(out, sizeof out, "%s/%s.seed", dir, base);
      FILE *f = fopen(out, "wb");
      if (f && fwrite(buf, 1, 4 + n1 + n2, f) == 4 + n1 + n2 && fclose(f) == 0) {
        fprintf(stderr, "fuzz_ir: %s: %zu kernels, %zu bytes\n", out, rk.n_kernels, 4 + n1 + n2);
        rc = 0;
      } else {
        fprintf(stderr, "fuzz_ir: cannot write %s: %s\n", out, strerror(errno));
        if (f) fclose(f);
      }
      free(buf);
    }
  } else {
    fprintf(stderr, "fuzz_ir: %s: out of memory encoding it\n", path);
  }
  fbp_arena_free(&a);
  fb_program_free(prog);
  fb_diags_free(&d);
  free(src);
  return rc;
}

/* `fuzz_ir --make-seeds DIR FILE.fbk...` writes the seeds and exits; any
 * other command line is libFuzzer's. */
int LLVMFuzzerInitialize(int *argc, char ***argv) {
  if (*argc >= 2 && strcmp((*argv)[1], "--make-seeds") == 0) {
    if (*argc < 4) {
      fprintf(stderr, "usage: %s --make-seeds DIR FILE.fbk...\n", (*argv)[0]);
      exit(2);
    }
    int bad = 0;
    for (int i = 3; i < *argc; i++) bad |= make_seed((*argv)[2], (*argv)[i]);
    exit(bad ? 1 : 0);
  }
  return 0;
}
