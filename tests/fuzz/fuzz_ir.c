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
  size_t n1 = (size_t)data[0] | (size_t)data[1] << 8 | (size_t)data[2] << 16 |
              (size_t)data[3] << 24;
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
      if (!nb) { free(buf); fclose(f); return NULL; }
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
