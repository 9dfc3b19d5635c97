/* libFuzzer target: fb_session_restore on hostile bytes (engine/checkpoint.c,
 * docs/checkpoint.md), and the seal's verifier on the same bytes as a file.
 * Every input is a checkpoint stream; a restore that succeeds has its
 * session destroyed again (the engine, one for the run, stays). A memory
 * limit bounds what one input may make the restore allocate.
 *
 * Seeds: `fuzz_checkpoint --make-seeds DIR FILE.fbk...` parses each .fbk
 * program, registers the kernels that take no field parameters in a sync
 * session and an async one, launches those without parameters once, and
 * writes each session's checkpoint into DIR (scripts/fuzz.sh does this, so
 * no binary seeds are checked in). */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "fusebox/engine.h"
#include "fusebox/lang.h"

#define FUZZ_MEMORY_LIMIT ((uint64_t)64 << 20) /* device bytes a restored session may hold */

typedef struct src {
  const uint8_t *p;
  size_t n, at;
} src;

static long read_src(void *user, void *buf, size_t n) {
  src *s = user;
  size_t k = s->n - s->at < n ? s->n - s->at : n;
  memcpy(buf, s->p + s->at, k);
  s->at += k;
  return (long)k;
}

static fb_engine *engine(void) {
  static fb_engine *e;
  if (!e) {
    fb_engine_config cfg = {"cpu", 1, 1};
    char err[256];
    if (fb_engine_create(&cfg, &e, err, sizeof err)) {
      fprintf(stderr, "fuzz_checkpoint: %s\n", err);
      abort();
    }
  }
  return e;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  src s = {data, size, 0};
  fb_session_config lim = {.memory_limit = FUZZ_MEMORY_LIMIT, .max_kernel_statements = 2000};
  fb_session *out = NULL;
  char err[1024];
  if (fb_session_restore(engine(), &lim, read_src, &s, &out, err, sizeof err) == 0)
    fb_session_destroy(out);
  else if (out)
    abort(); /* a failed restore leaves nothing behind */
  /* the same bytes as a sealed file */
  int fd = memfd_create("fuzz_checkpoint", 0);
  if (fd >= 0) {
    if (write(fd, data, size) == (ssize_t)size) {
      static const uint8_t key[32] = "fuzz-checkpoint-key-0123456789ab";
      uint64_t plen;
      fb_seal_verify_fd(fd, key, sizeof key, "", &plen, err, sizeof err);
    }
    close(fd);
  }
  return 0;
}

static int write_sink(void *user, const void *buf, size_t n) {
  return fwrite(buf, 1, n, user) == n ? 0 : 1;
}

/* One checkpoint per program and mode into dir. */
static int make_seeds(const char *dir, int argc, char **argv) {
  int made = 0;
  for (int i = 0; i < argc; i++) {
    FILE *f = fopen(argv[i], "rb");
    if (!f) continue;
    static char text[1 << 20];
    size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = 0;
    fb_program *p = NULL;
    fb_diags d;
    fb_diags_init(&d);
    int rc = fb_program_parse(argv[i], text, &p, &d);
    fb_diags_free(&d);
    if (rc) continue;
    for (int m = 0; m < 2; m++) {
      fb_session_config sc = {.mode = m ? "async" : "sync", .seed = 1,
                              .memory_limit = FUZZ_MEMORY_LIMIT};
      fb_session *s = NULL;
      char err[512];
      if (fb_session_create(engine(), &sc, fb_program_layout(p), &s, err, sizeof err)) continue;
      for (int k = 0; k < fb_program_nkernels(p); k++) {
        const fb_lang_kernel *lk = fb_program_kernel(p, k);
        fb_kernel *ir = NULL;
        fb_diags_init(&d);
        rc = fb_program_instantiate(p, lk->name, NULL, 0, &ir, &d);
        fb_diags_free(&d);
        if (rc) continue;
        int id = fb_session_add_kernel(s, ir);
        if (id >= 0 && lk->nparams == 0) fb_launch(s, id, NULL, 0, NULL);
      }
      fb_sync(s);
      char path[4096];
      snprintf(path, sizeof path, "%s/seed-%d-%s", dir, i, m ? "async" : "sync");
      FILE *o = fopen(path, "wb");
      if (o && fb_session_checkpoint(s, write_sink, o, err, sizeof err) == 0) made++;
      if (o) fclose(o);
      fb_session_destroy(s);
    }
    fb_program_free(p);
  }
  fprintf(stderr, "fuzz_checkpoint: %d seeds in %s\n", made, dir);
  return made ? 0 : 1;
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  if (*argc >= 3 && strcmp((*argv)[1], "--make-seeds") == 0)
    exit(make_seeds((*argv)[2], *argc - 3, *argv + 3));
  return 0;
}
