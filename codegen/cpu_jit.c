/* The CPU back end: task IR -> LLVM module -> O3 -> x86-64 object, linked
 * into an ORC LLJIT, plus the code cache.
 *
 * Threads: every compile builds, optimises and emits its object with its own
 * LLVMContext and TargetMachine, so compiles run in parallel; only the JIT's
 * shared bits (symbol naming, adding the object, symbol lookup) and the cache
 * table are serialised, each by its own mutex.
 *
 * Cache: key = mix(fb_kernel_hash(ir), position of the loop in block 0);
 * fb_kernel_hash already folds in fb_layout_hash of the kernel's layout (and
 * fb_kernel_equal compares layouts), so the layout is part of the key without
 * hashing it twice on the hit path. A key match is confirmed with
 * fb_kernel_equal on a clone the cache owns (cloned onto the cache's own copy
 * of the layout, so callers may free theirs). Compiled code lives as long as
 * the JIT. */
#include <llvm-c/Error.h>
#include <llvm-c/LLJIT.h>
#include <llvm-c/Orc.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cg_internal.h"

typedef struct cache_entry {
  uint64_t key;
  int loop_pos;
  fb_layout *layout; /* owned copy */
  fb_kernel *ir;     /* owned clone, on layout */
  fb_task_body_fn body;
  fb_task_bounds_fn bounds;
  struct cache_entry *next;
} cache_entry;

struct fb_cpu_jit {
  LLVMOrcLLJITRef jit;
  LLVMOrcJITDylibRef jd;
  char *triple, *cpu, *features, *layout;
  pthread_mutex_t jit_mu; /* naming, object add, lookup */
  uint64_t next_id;
  pthread_mutex_t cache_mu;
  cache_entry **buckets;
  size_t nbuckets, nentries;
};

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Turn an LLVMErrorRef into a message (consumes it). */
static int llvm_fail(LLVMErrorRef e, char *err, size_t errlen, int code, const char *what) {
  char *msg = LLVMGetErrorMessage(e);
  fb_cg_fail(err, errlen, code, "%s: %s", what, msg ? msg : "?");
  LLVMDisposeErrorMessage(msg);
  return code;
}

/* ---------------------------------------------------------------- JIT setup */

typedef struct math_sym {
  const char *name;
  void *addr;
} math_sym;

/* Make libm available to JIT'd code even when the process did not load it
 * by name: the math functions the generator calls, by address. */
static int define_math(fb_cpu_jit *j, char *err, size_t errlen) {
  const math_sym syms[] = {
      {"sinf", (void *)sinf},   {"cosf", (void *)cosf},   {"tanf", (void *)tanf},
      {"asinf", (void *)asinf}, {"acosf", (void *)acosf}, {"atanf", (void *)atanf},
      {"expf", (void *)expf},   {"logf", (void *)logf},   {"powf", (void *)powf},
      {"atan2f", (void *)atan2f}, {"fmodf", (void *)fmodf}, {"roundf", (void *)roundf},
      {"floorf", (void *)floorf}, {"ceilf", (void *)ceilf}, {"sqrtf", (void *)sqrtf},
      {"sin", (void *)sin},     {"cos", (void *)cos},     {"tan", (void *)tan},
      {"asin", (void *)asin},   {"acos", (void *)acos},   {"atan", (void *)atan},
      {"exp", (void *)exp},     {"log", (void *)log},     {"pow", (void *)pow},
      {"atan2", (void *)atan2}, {"fmod", (void *)fmod},   {"round", (void *)round},
      {"floor", (void *)floor}, {"ceil", (void *)ceil},   {"sqrt", (void *)sqrt},
  };
  enum { N = sizeof syms / sizeof syms[0] };
  LLVMOrcCSymbolMapPair pairs[N];
  for (int i = 0; i < N; i++) {
    pairs[i].Name = LLVMOrcLLJITMangleAndIntern(j->jit, syms[i].name);
    pairs[i].Sym.Address = (LLVMOrcExecutorAddress)(uintptr_t)syms[i].addr;
    pairs[i].Sym.Flags.GenericFlags = LLVMJITSymbolGenericFlagsExported |
                                      LLVMJITSymbolGenericFlagsCallable;
    pairs[i].Sym.Flags.TargetFlags = 0;
  }
  LLVMOrcMaterializationUnitRef mu = LLVMOrcAbsoluteSymbols(pairs, N);
  LLVMErrorRef e = LLVMOrcJITDylibDefine(j->jd, mu);
  if (e) {
    LLVMOrcDisposeMaterializationUnit(mu);
    return llvm_fail(e, err, errlen, FB_ECOMPILE, "cannot define math symbols");
  }
  return 0;
}

static int jit_create(fb_cpu_jit *j, char *err, size_t errlen) {
  LLVMTargetMachineRef tm = fb_cg_cpu_tm(j->triple, j->cpu, j->features, err, errlen);
  if (!tm) return FB_ECOMPILE;
  j->layout = fb_cg_tm_layout(tm);
  LLVMOrcJITTargetMachineBuilderRef jtmb = LLVMOrcJITTargetMachineBuilderCreateFromTargetMachine(tm);
  LLVMOrcLLJITBuilderRef b = LLVMOrcCreateLLJITBuilder();
  LLVMOrcLLJITBuilderSetJITTargetMachineBuilder(b, jtmb);
  LLVMErrorRef e = LLVMOrcCreateLLJIT(&j->jit, b);
  if (e) {
    j->jit = NULL;
    return llvm_fail(e, err, errlen, FB_ECOMPILE, "cannot create the LLVM JIT");
  }
  if (!j->layout) return fb_cg_fail(err, errlen, FB_ENOMEM, "out of memory");
  j->jd = LLVMOrcLLJITGetMainJITDylib(j->jit);
  LLVMOrcDefinitionGeneratorRef gen = NULL;
  e = LLVMOrcCreateDynamicLibrarySearchGeneratorForProcess(&gen, LLVMOrcLLJITGetGlobalPrefix(j->jit),
                                                           NULL, NULL);
  if (e) return llvm_fail(e, err, errlen, FB_ECOMPILE, "cannot search the process for symbols");
  LLVMOrcJITDylibAddGenerator(j->jd, gen);
  return define_math(j, err, errlen);
}

fb_cpu_jit *fb_cpu_jit_new(char *err, size_t errlen) {
  fb_cpu_jit *j = calloc(1, sizeof *j);
  if (!j) {
    fb_cg_fail(err, errlen, FB_ENOMEM, "out of memory");
    return NULL;
  }
  pthread_mutex_init(&j->jit_mu, NULL);
  pthread_mutex_init(&j->cache_mu, NULL);
  j->nbuckets = 256;
  j->buckets = calloc(j->nbuckets, sizeof *j->buckets);
  if (!j->buckets || fb_cg_host_info(&j->triple, &j->cpu, &j->features)) {
    fb_cg_fail(err, errlen, FB_ENOMEM, "out of memory");
    fb_cpu_jit_free(j);
    return NULL;
  }
  if (jit_create(j, err, errlen)) {
    fb_cpu_jit_free(j);
    return NULL;
  }
  return j;
}

void fb_cpu_jit_free(fb_cpu_jit *j) {
  if (!j) return;
  for (size_t b = 0; j->buckets && b < j->nbuckets; b++) {
    for (cache_entry *c = j->buckets[b], *n; c; c = n) {
      n = c->next;
      fb_kernel_free(c->ir);
      fb_layout_free(c->layout);
      free(c);
    }
  }
  free(j->buckets);
  if (j->jit) {
    LLVMErrorRef e = LLVMOrcDisposeLLJIT(j->jit);
    if (e) LLVMConsumeError(e);
  }
  free(j->triple);
  free(j->cpu);
  free(j->features);
  free(j->layout);
  pthread_mutex_destroy(&j->jit_mu);
  pthread_mutex_destroy(&j->cache_mu);
  free(j);
}

/* ---------------------------------------------------------------- cache */

static uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

/* Position of the loop statement in block 0 (-1 for a serial task). */
static int loop_position(const fb_cg_task *t) {
  if (t->loop < 0 || !t->ir || t->ir->nblocks < 1) return -1;
  const fb_block *b0 = &t->ir->blocks[0];
  for (int i = 0; i < b0->n; i++)
    if (b0->ids[i] == t->loop) return i;
  return -2; /* not top-level: the compile will refuse it */
}

static cache_entry *cache_find(fb_cpu_jit *j, uint64_t key, int pos, const fb_kernel *k) {
  for (cache_entry *c = j->buckets[key % j->nbuckets]; c; c = c->next)
    if (c->key == key && c->loop_pos == pos && fb_kernel_equal(c->ir, k))
      return c;
  return NULL;
}

static void cache_grow(fb_cpu_jit *j) {
  size_t nb = j->nbuckets * 2;
  cache_entry **v = calloc(nb, sizeof *v);
  if (!v) return; /* keep the longer chains */
  for (size_t b = 0; b < j->nbuckets; b++) {
    for (cache_entry *c = j->buckets[b], *n; c; c = n) {
      n = c->next;
      c->next = v[c->key % nb];
      v[c->key % nb] = c;
    }
  }
  free(j->buckets);
  j->buckets = v;
  j->nbuckets = nb;
}

/* Remember compiled code (best effort: on allocation failure the code is
 * simply not cached). */
static void cache_insert(fb_cpu_jit *j, uint64_t key, int pos, const fb_kernel *k,
                         fb_task_body_fn body, fb_task_bounds_fn bounds) {
  cache_entry *c = calloc(1, sizeof *c);
  fb_layout *l = c ? fb_layout_clone(k->layout) : NULL;
  fb_kernel *ir = l ? fb_kernel_clone_to(k, l) : NULL;
  if (!ir) {
    fb_layout_free(l);
    free(c);
    return;
  }
  *c = (cache_entry){key, pos, l, ir, body, bounds, NULL};
  pthread_mutex_lock(&j->cache_mu);
  if (cache_find(j, key, pos, k)) { /* another thread got there first */
    pthread_mutex_unlock(&j->cache_mu);
    fb_kernel_free(ir);
    fb_layout_free(l);
    free(c);
    return;
  }
  if (j->nentries >= j->nbuckets) cache_grow(j);
  c->next = j->buckets[key % j->nbuckets];
  j->buckets[key % j->nbuckets] = c;
  j->nentries++;
  pthread_mutex_unlock(&j->cache_mu);
}

/* ---------------------------------------------------------------- compile */

/* Build, verify, optimise and emit the object of task t. */
static int compile_object(fb_cpu_jit *j, const fb_cg_task *t, const fb_cg_options *o,
                          LLVMMemoryBufferRef *obj, int *stmts, char *err, size_t errlen) {
  LLVMTargetMachineRef tm = fb_cg_cpu_tm(j->triple, j->cpu, j->features, err, errlen);
  if (!tm) return FB_ECOMPILE;
  LLVMContextRef c = LLVMContextCreate();
  LLVMModuleRef m = NULL;
  int rc = fb_cg_build(c, t, o, j->triple, j->layout, &m, stmts, err, errlen);
  if (!rc) rc = fb_cg_verify(m, err, errlen);
  if (!rc) rc = fb_cg_link_rt(c, m, FB_CG_CPU, err, errlen);
  if (!rc) rc = fb_cg_optimize(m, tm, err, errlen);
  if (!rc) {
    char *msg = NULL;
    if (LLVMTargetMachineEmitToMemoryBuffer(tm, m, LLVMObjectFile, &msg, obj))
      rc = fb_cg_fail(err, errlen, FB_ECOMPILE, "LLVM code generation failed: %s", msg ? msg : "?");
    LLVMDisposeMessage(msg);
  }
  if (m) LLVMDisposeModule(m);
  LLVMContextDispose(c);
  LLVMDisposeTargetMachine(tm);
  return rc;
}

static int lookup(fb_cpu_jit *j, const char *name, void **fn, char *err, size_t errlen) {
  LLVMOrcExecutorAddress addr = 0;
  LLVMErrorRef e = LLVMOrcLLJITLookup(j->jit, &addr, name);
  if (e) return llvm_fail(e, err, errlen, FB_ECOMPILE, "JIT symbol lookup failed");
  *fn = (void *)(uintptr_t)addr;
  return 0;
}

/* Add the object to the JIT and find the task's functions. */
static int link_object(fb_cpu_jit *j, LLVMMemoryBufferRef obj, const fb_cg_options *o,
                       int parallel, fb_cpu_code *out, char *err, size_t errlen) {
  void *body = NULL, *bounds = NULL;
  pthread_mutex_lock(&j->jit_mu);
  LLVMErrorRef e = LLVMOrcLLJITAddObjectFile(j->jit, j->jd, obj);
  int rc = e ? llvm_fail(e, err, errlen, FB_ECOMPILE, "cannot add code to the JIT") : 0;
  if (!rc) rc = lookup(j, o->body_name, &body, err, errlen);
  if (!rc && parallel) rc = lookup(j, o->bounds_name, &bounds, err, errlen);
  pthread_mutex_unlock(&j->jit_mu);
  if (rc) return rc;
  /* object pointers to function pointers: POSIX guarantees this works */
  memcpy(&out->body, &body, sizeof body);
  if (parallel) memcpy(&out->bounds, &bounds, sizeof bounds);
  return 0;
}

int fb_cpu_jit_compile(fb_cpu_jit *j, const fb_cg_task *t, fb_cpu_code *out, char *err,
                       size_t errlen) {
  if (!j || !t || !t->ir || !t->ir->layout || !out)
    return fb_cg_fail(err, errlen, FB_EINVAL, "fb_cpu_jit_compile: missing JIT, task or output");
  memset(out, 0, sizeof *out);
  double t0 = now_s();
  const fb_kernel *k = t->ir;
  int pos = loop_position(t);
  uint64_t key = mix64(fb_kernel_hash(k) ^ mix64((uint64_t)(int64_t)pos));
  pthread_mutex_lock(&j->cache_mu);
  cache_entry *hit = cache_find(j, key, pos, k);
  if (hit) {
    out->body = hit->body;
    out->bounds = hit->bounds;
    out->cache_hit = 1;
  }
  pthread_mutex_unlock(&j->cache_mu);
  if (hit) return 0;

  char body_name[48], bounds_name[48];
  pthread_mutex_lock(&j->jit_mu);
  unsigned long long id = (unsigned long long)j->next_id++;
  pthread_mutex_unlock(&j->jit_mu);
  snprintf(body_name, sizeof body_name, "fb_body_%llu", id);
  snprintf(bounds_name, sizeof bounds_name, "fb_bounds_%llu", id);
  fb_cg_options o = {FB_CG_CPU, body_name, bounds_name, 0};
  LLVMMemoryBufferRef obj = NULL;
  int rc = compile_object(j, t, &o, &obj, &out->stmts_emitted, err, errlen);
  if (!rc) rc = link_object(j, obj, &o, t->loop >= 0, out, err, errlen);
  if (rc) {
    memset(out, 0, sizeof *out);
    return rc;
  }
  cache_insert(j, key, pos, k, out->body, out->bounds);
  out->compile_s = now_s() - t0;
  return 0;
}
