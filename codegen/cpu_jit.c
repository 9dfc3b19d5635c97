/* The CPU back end: task IR -> LLVM module -> O3 -> x86-64 object, linked
 * into an ORC LLJIT, plus the code cache.
 *
 * Threads: every compile builds, optimises and emits its object with its own
 * LLVMContext and TargetMachine, so compiles run in parallel; only the JIT's
 * shared bits (symbol naming, adding the object, symbol lookup) are
 * serialised by a mutex. Compiled code is kept in the code cache (cache.c):
 * each object is added to the JIT under a resource tracker of its own, so
 * that evicting its cache entry (past fb_cpu_jit_set_cache_limit) removes
 * its code from the JIT and frees it. */
#include <llvm-c/Core.h>
#include <llvm-c/Error.h>
#include <llvm-c/LLJIT.h>
#include <llvm-c/Orc.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "cg_internal.h"

struct fb_cpu_jit {
  LLVMOrcLLJITRef jit;
  LLVMOrcJITDylibRef jd;
  char *triple, *cpu, *features, *layout;
  pthread_mutex_t jit_mu; /* naming, object add, lookup */
  uint64_t next_id;
  fb_code_cache *cache; /* body and bounds in val.a and val.b */
  fb_code_store store;  /* the cache outside the process (store.get NULL: none) */
  char *target_text;    /* what the store keys by besides the IR */
};

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* The runtime's x86-64 bitcode (rt_link.c): its hash is part of what the
 * code store keys by, computed once per JIT. */
extern const unsigned char fb_rt_bc_x86_64[];
extern const unsigned long fb_rt_bc_x86_64_size;

static uint64_t fnv64(uint64_t h, const char *p, size_t n) {
  for (size_t i = 0; i < n; i++) {
    h ^= (uint8_t)p[i];
    h *= 0x100000001b3ull;
  }
  return h;
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
      {"sinf", (void *)sinf},     {"cosf", (void *)cosf},   {"tanf", (void *)tanf},
      {"asinf", (void *)asinf},   {"acosf", (void *)acosf}, {"atanf", (void *)atanf},
      {"expf", (void *)expf},     {"logf", (void *)logf},   {"powf", (void *)powf},
      {"atan2f", (void *)atan2f}, {"fmodf", (void *)fmodf}, {"roundf", (void *)roundf},
      {"floorf", (void *)floorf}, {"ceilf", (void *)ceilf}, {"sqrtf", (void *)sqrtf},
      {"sin", (void *)sin},       {"cos", (void *)cos},     {"tan", (void *)tan},
      {"asin", (void *)asin},     {"acos", (void *)acos},   {"atan", (void *)atan},
      {"exp", (void *)exp},       {"log", (void *)log},     {"pow", (void *)pow},
      {"atan2", (void *)atan2},   {"fmod", (void *)fmod},   {"round", (void *)round},
      {"floor", (void *)floor},   {"ceil", (void *)ceil},   {"sqrt", (void *)sqrt},
  };
  enum {
    N = sizeof syms / sizeof syms[0]
  };
  LLVMOrcCSymbolMapPair pairs[N];
  for (int i = 0; i < N; i++) {
    pairs[i].Name = LLVMOrcLLJITMangleAndIntern(j->jit, syms[i].name);
    pairs[i].Sym.Address = (LLVMOrcExecutorAddress)(uintptr_t)syms[i].addr;
    pairs[i].Sym.Flags.GenericFlags =
        LLVMJITSymbolGenericFlagsExported | LLVMJITSymbolGenericFlagsCallable;
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

/* The zero block that loads of inactive sparse cells read (emit_mem.c,
 * zero_block): FB_CG_ZERO_BYTES of zero pages in .bss, made read-only at
 * the first JIT (a stray write faults). Untouched pages cost address space,
 * not memory; being part of the image it needs no mapping that a worker's
 * address-space limit could refuse later. */
static uint8_t zero_pages[FB_CG_ZERO_BYTES] __attribute__((aligned(4096)));
static pthread_once_t zero_once = PTHREAD_ONCE_INIT;

static void protect_zero(void) { (void)mprotect(zero_pages, sizeof zero_pages, PROT_READ); }

static int define_zero(fb_cpu_jit *j, char *err, size_t errlen) {
  pthread_once(&zero_once, protect_zero);
  LLVMOrcCSymbolMapPair pair;
  pair.Name = LLVMOrcLLJITMangleAndIntern(j->jit, FB_CG_ZERO_SYM);
  pair.Sym.Address = (LLVMOrcExecutorAddress)(uintptr_t)zero_pages;
  pair.Sym.Flags.GenericFlags = LLVMJITSymbolGenericFlagsExported;
  pair.Sym.Flags.TargetFlags = 0;
  LLVMOrcMaterializationUnitRef mu = LLVMOrcAbsoluteSymbols(&pair, 1);
  LLVMErrorRef e = LLVMOrcJITDylibDefine(j->jd, mu);
  if (e) {
    LLVMOrcDisposeMaterializationUnit(mu);
    return llvm_fail(e, err, errlen, FB_ECOMPILE, "cannot define the zero block");
  }
  return 0;
}

static int jit_create(fb_cpu_jit *j, char *err, size_t errlen) {
  LLVMTargetMachineRef tm = fb_cg_cpu_tm(j->triple, j->cpu, j->features, err, errlen);
  if (!tm) return FB_ECOMPILE;
  j->layout = fb_cg_tm_layout(tm);
  LLVMOrcJITTargetMachineBuilderRef jtmb =
      LLVMOrcJITTargetMachineBuilderCreateFromTargetMachine(tm);
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
  e = LLVMOrcCreateDynamicLibrarySearchGeneratorForProcess(
      &gen, LLVMOrcLLJITGetGlobalPrefix(j->jit), NULL, NULL);
  if (e) return llvm_fail(e, err, errlen, FB_ECOMPILE, "cannot search the process for symbols");
  LLVMOrcJITDylibAddGenerator(j->jd, gen);
  int rc = define_math(j, err, errlen);
  return rc ? rc : define_zero(j, err, errlen);
}

fb_cpu_jit *fb_cpu_jit_new(char *err, size_t errlen) {
  fb_cpu_jit *j = calloc(1, sizeof *j);
  if (!j) {
    fb_cg_fail(err, errlen, FB_ENOMEM, "out of memory");
    return NULL;
  }
  pthread_mutex_init(&j->jit_mu, NULL);
  j->cache = fb_code_cache_new();
  if (!j->cache || fb_cg_host_info(&j->triple, &j->cpu, &j->features)) {
    fb_cg_fail(err, errlen, FB_ENOMEM, "out of memory");
    fb_cpu_jit_free(j);
    return NULL;
  }
  if (jit_create(j, err, errlen)) {
    fb_cpu_jit_free(j);
    return NULL;
  }
  (void)fb_cg_perf_map_on(); /* opens the map now: a worker cannot later */
  return j;
}

/* A cached value's resource tracker (val.c): release it, or remove its
 * code from the JIT first (an evicted entry, a lost race). */
static void release_rt(void *user, fb_code_val *v) {
  (void)user;
  if (v->c) LLVMOrcReleaseResourceTracker(v->c);
  v->c = NULL;
}

static void drop_code(void *user, fb_code_val *v) {
  fb_cpu_jit *j = user;
  if (!v->c) return;
  pthread_mutex_lock(&j->jit_mu);
  LLVMErrorRef e = LLVMOrcResourceTrackerRemove(v->c);
  pthread_mutex_unlock(&j->jit_mu);
  if (e) LLVMConsumeError(e); /* the code stays in the JIT: a leak, not a fault */
  release_rt(NULL, v);
}

void fb_cpu_jit_set_cache_limit(fb_cpu_jit *j, uint64_t max_bytes) {
  fb_code_cache_set_limit(j->cache, max_bytes, drop_code, j);
}

void fb_cpu_jit_cache_info(fb_cpu_jit *j, fb_code_cache_info *out) {
  fb_code_cache_stats(j ? j->cache : NULL, out);
}

int fb_cpu_jit_set_store(fb_cpu_jit *j, const fb_code_store *s) {
  if (!j) return 0;
  free(j->target_text);
  j->target_text = NULL;
  memset(&j->store, 0, sizeof j->store);
  if (!s || !s->get) return 0;
  /* everything besides the IR that the object depends on, as far as this
   * process knows it (the store adds its own version and the runtime's) */
  const char *fmt = "back end cpu\nLLVM %u.%u.%u\ntriple %s\ncpu %s\nfeatures %s\n"
                    "code O3, cas16 %d, symbols by key\nruntime bitcode %016llx %lu\n";
  int has_cas16 = fb_cg_has_cas16(j->triple, j->features);
  unsigned maj = 0, min = 0, patch = 0;
  LLVMGetVersion(&maj, &min, &patch);
  unsigned long long rt = (unsigned long long)fnv64(
      0xcbf29ce484222325ull, (const char *)fb_rt_bc_x86_64, (size_t)fb_rt_bc_x86_64_size);
  int n = snprintf(NULL, 0, fmt, maj, min, patch, j->triple, j->cpu, j->features, has_cas16, rt,
                   fb_rt_bc_x86_64_size);
  j->target_text = malloc((size_t)n + 1);
  if (!j->target_text) return FB_ENOMEM;
  snprintf(j->target_text, (size_t)n + 1, fmt, maj, min, patch, j->triple, j->cpu, j->features,
           has_cas16, rt, fb_rt_bc_x86_64_size);
  j->store = *s;
  return 0;
}

void fb_cpu_jit_free(fb_cpu_jit *j) {
  if (!j) return;
  fb_code_cache_free(j->cache, release_rt, NULL); /* the JIT frees the code below */
  if (j->jit) {
    LLVMErrorRef e = LLVMOrcDisposeLLJIT(j->jit);
    if (e) LLVMConsumeError(e);
  }
  free(j->triple);
  free(j->cpu);
  free(j->features);
  free(j->layout);
  free(j->target_text);
  pthread_mutex_destroy(&j->jit_mu);
  free(j);
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
static int link_object(fb_cpu_jit *j, LLVMMemoryBufferRef obj, const fb_cg_options *o, int parallel,
                       fb_cpu_code *out, LLVMOrcResourceTrackerRef *rt, char *err, size_t errlen) {
  void *body = NULL, *bounds = NULL;
  pthread_mutex_lock(&j->jit_mu);
  *rt = LLVMOrcJITDylibCreateResourceTracker(j->jd);
  LLVMErrorRef e = LLVMOrcLLJITAddObjectFileWithRT(j->jit, *rt, obj);
  int rc = e ? llvm_fail(e, err, errlen, FB_ECOMPILE, "cannot add code to the JIT") : 0;
  if (!rc) rc = lookup(j, o->body_name, &body, err, errlen);
  if (!rc && parallel) rc = lookup(j, o->bounds_name, &bounds, err, errlen);
  pthread_mutex_unlock(&j->jit_mu);
  if (rc) {
    fb_code_val v = {.c = *rt};
    drop_code(j, &v);
    *rt = NULL;
    return rc;
  }
  /* object pointers to function pointers: POSIX guarantees this works */
  memcpy(&out->body, &body, sizeof body);
  if (parallel) memcpy(&out->bounds, &bounds, sizeof bounds);
  return 0;
}

/* The task as the store sees it: the layout's and the compacted kernel's
 * canonical text (under a fixed name: names are not code) and the loop's
 * position in the body. NULL when out of memory (the store is then
 * skipped). */
static char *task_text(const fb_cg_task *t, int loop_pos, size_t *len) {
  fb_kernel *c = fb_kernel_compact(t->ir);
  char *lt = fb_layout_print(t->ir->layout), *kt = NULL, *out = NULL;
  if (c) {
    char *name = c->name;
    c->name = (char *)"task";
    kt = fb_kernel_print(c);
    c->name = name;
    fb_kernel_free(c);
  }
  if (lt && kt) {
    size_t n = strlen(lt) + strlen(kt) + 32;
    out = malloc(n);
    if (out) *len = (size_t)snprintf(out, n, "%s\n%s\nloop %d\n", lt, kt, loop_pos);
  }
  free(lt);
  free(kt);
  return out;
}

char *fb_cg_task_text(const fb_cg_task *t, size_t *len) {
  return task_text(t, fb_code_cache_key(t).loop_pos, len);
}

int fb_cpu_jit_compile(fb_cpu_jit *j, const fb_cg_task *t, fb_cpu_code *out, char *err,
                       size_t errlen) {
  if (!j || !t || !t->ir || !t->ir->layout || !out)
    return fb_cg_fail(err, errlen, FB_EINVAL, "fb_cpu_jit_compile: missing JIT, task or output");
  memset(out, 0, sizeof *out);
  double t0 = now_s();
  fb_code_key key = fb_code_cache_key(t);
  fb_code_val hit;
  if (fb_code_cache_get(j->cache, &key, t->ir, t->pins, &hit)) {
    memcpy(&out->body, &hit.a, sizeof out->body);
    memcpy(&out->bounds, &hit.b, sizeof out->bounds);
    out->cache_hit = 1;
    /* what the code was built with; the launcher must know it */
    if (fb_cg_priv_plan(t, &out->priv, NULL)) {
      memset(out, 0, sizeof *out);
      return fb_cg_fail(err, errlen, FB_ENOMEM, "out of memory");
    }
    return 0;
  }

  char body_name[64], bounds_name[64];
  /* the store's view of the task; its code's names follow from it, so an
   * object stored by one process links in another */
  size_t irlen = 0;
  char *irtext = j->store.get ? task_text(t, key.loop_pos, &irlen) : NULL;
  int stored = 0; /* the code came from the store */
  LLVMMemoryBufferRef obj = NULL;
  LLVMOrcResourceTrackerRef rt = NULL;
  fb_cg_options o = {FB_CG_CPU, body_name, bounds_name, 0, fb_cg_has_cas16(j->triple, j->features)};
  unsigned long long id = 0;
  int rc = 0;
  uint64_t code_bytes = 0;
  if (irtext) {
    uint64_t h = fnv64(fnv64(0xcbf29ce484222325ull, j->target_text, strlen(j->target_text)),
                       irtext, irlen);
    snprintf(body_name, sizeof body_name, "fbd_%016llx_%016llx", (unsigned long long)h,
             (unsigned long long)t->partition);
    snprintf(bounds_name, sizeof bounds_name, "fbd_%016llx_%016llx_n", (unsigned long long)h,
             (unsigned long long)t->partition);
    uint8_t *bytes = NULL;
    size_t len = 0;
    if (j->store.get(j->store.user, t->partition, j->target_text, irtext, irlen, &bytes, &len)) {
      obj = LLVMCreateMemoryBufferWithMemoryRangeCopy((const char *)bytes, len, "fb-code-store");
      free(bytes);
      code_bytes = len;
      char lerr[256];
      /* a second copy of these names in the JIT (two threads loading one
       * entry) fails to link: then compile below under names of its own */
      if (obj && !link_object(j, obj, &o, t->loop >= 0, out, &rt, lerr, sizeof lerr)) stored = 1;
      obj = NULL;
    }
  }
  if (!stored) {
    int by_key = irtext != NULL;
    for (int attempt = 0; attempt < 2 && !stored; attempt++) {
      if (!by_key) {
        pthread_mutex_lock(&j->jit_mu);
        id = (unsigned long long)j->next_id++;
        pthread_mutex_unlock(&j->jit_mu);
        snprintf(body_name, sizeof body_name, "fb_body_%llu", id);
        snprintf(bounds_name, sizeof bounds_name, "fb_bounds_%llu", id);
      }
      rc = compile_object(j, t, &o, &obj, &out->stmts_emitted, err, errlen);
      /* the object's size stands for the code it links to (the JIT takes obj) */
      code_bytes = obj ? (uint64_t)LLVMGetBufferSize(obj) : 0;
      uint8_t *copy = NULL;
      if (!rc && by_key && (copy = malloc(code_bytes ? code_bytes : 1)))
        memcpy(copy, LLVMGetBufferStart(obj), code_bytes);
      fb_perf_syms *perf = rc ? NULL : fb_cg_perf_syms(obj); /* NULL unless FB_PERF_MAP=1 */
      int compiled = !rc;
      if (!rc) rc = link_object(j, obj, &o, t->loop >= 0, out, &rt, err, errlen);
      obj = NULL;
      if (!rc && perf) { /* kernel.tN#ID: ID tells a recompiled (e.g. demoted) variant apart */
        char label[256];
        snprintf(label, sizeof label, "%.200s#%llu", t->ir->name ? t->ir->name : "task", id);
        fb_cg_perf_announce(perf, body_name, bounds_name, (uint64_t)(uintptr_t)out->body, label);
      }
      fb_cg_perf_syms_free(perf);
      if (!rc && copy)
        j->store.put(j->store.user, t->partition, j->target_text, irtext, irlen, copy,
                     (size_t)code_bytes);
      free(copy);
      if (!rc || !by_key || !compiled) break;
      by_key = 0; /* the names by key are taken (a race on one task): names of its own */
      rc = 0;
    }
    if (rc) {
      free(irtext);
      memset(out, 0, sizeof *out);
      return rc;
    }
  }
  free(irtext);
  if (stored) out->cache_hit = 1; /* found, not compiled */
  fb_code_val v = {0}, kept;
  memcpy(&v.a, &out->body, sizeof out->body);
  memcpy(&v.b, &out->bounds, sizeof out->bounds);
  v.c = rt;
  if (fb_code_cache_put(j->cache, &key, t->ir, &v, code_bytes, t->pins, &kept)) {
    drop_code(j, &v); /* another thread cached the same task first: use its code */
    memcpy(&out->body, &kept.a, sizeof out->body);
    memcpy(&out->bounds, &kept.b, sizeof out->bounds);
  }
  if (fb_cg_priv_plan(t, &out->priv, NULL)) { /* what fb_cg_build did */
    memset(out, 0, sizeof *out); /* the code stays cached for a later call */
    return fb_cg_fail(err, errlen, FB_ENOMEM, "out of memory");
  }
  out->compile_s = stored ? 0 : now_s() - t0;
  return 0;
}
