/* libFuzzer target: the .fbk front end on hostile source, as fuseboxd runs
 * it for DescribeSource, CreateSession and RegisterKernels with a Source
 * (server/session/source.c). The input is the source text (NUL-terminated here;
 * inputs over 1 MiB are skipped, as the server refuses them). Each input is
 * parsed (fb_program_parse: lexing, parsing, type checks, the layout
 * finalized under the limits of ir/layout.c, diagnostics rendered); every
 * kernel is then instantiated, those with field parameters bound to the
 * program's first fields in turn, and each result goes through
 * fb_kernel_check_public and fb_verify as the engine would check it.
 *
 * Seeds: the .fbk files of examples/ as they are (scripts/fuzz.sh with
 * FB_FUZZ_TARGET=fuzz_lang copies them). */
#include <stdlib.h>
#include <string.h>

#include "fusebox/ir.h"
#include "fusebox/lang.h"

#define FUZZ_MAX_SOURCE ((size_t)1 << 20)
#define FUZZ_MAX_STMTS 100000
#define FUZZ_MAX_BINDINGS 8

static void check(const fb_kernel *k) {
  char err[256];
  if (fb_kernel_check_public(k, FUZZ_MAX_STMTS, err, sizeof err)) return;
  fb_diags d;
  fb_diags_init(&d);
  fb_verify(k, &d);
  fb_diags_free(&d);
}

static void instantiate(fb_program *p, const fb_lang_kernel *k) {
  int nf = fb_program_nfields(p);
  const char *names[FUZZ_MAX_BINDINGS];
  if (k->nfield_params > FUZZ_MAX_BINDINGS || (k->nfield_params && !nf)) return;
  for (int shift = 0; shift < (k->nfield_params ? nf : 1) && shift < 4; shift++) {
    for (int i = 0; i < k->nfield_params; i++)
      names[i] = fb_program_field(p, (i + shift) % nf)->name;
    fb_kernel *out = NULL;
    fb_diags d;
    fb_diags_init(&d);
    if (fb_program_instantiate(p, k->name, names, k->nfield_params, &out, &d) == 0) check(out);
    else free(fb_diags_render(fb_program_filename(p), fb_program_source(p), &d));
    fb_diags_free(&d);
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size > FUZZ_MAX_SOURCE) return 0;
  char *src = malloc(size + 1);
  if (!src) return 0;
  memcpy(src, data, size);
  src[size] = 0;
  fb_program *p = NULL;
  fb_diags d;
  fb_diags_init(&d);
  if (fb_program_parse("fuzz.fbk", src, &p, &d) == 0) {
    for (int i = 0; i < fb_program_nkernels(p); i++) instantiate(p, fb_program_kernel(p, i));
    fb_program_free(p);
  } else {
    free(fb_diags_render("fuzz.fbk", src, &d));
  }
  fb_diags_free(&d);
  free(src);
  return 0;
}
