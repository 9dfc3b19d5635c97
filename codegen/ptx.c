/* The NVPTX back end: the same task module for nvptx64-nvidia-cuda (entry
 * points fb_body, a grid-stride loop over [lo, hi), and fb_bounds), math
 * through libdevice when the CUDA toolkit has it (linked, then internalized
 * so that O3 drops what the task does not call), printed as PTX text. Also
 * fb_llvm_ir_text, the module of either target as text (unoptimized, or for
 * the CPU also after linking the runtime and O3, as the JIT compiles it). */
#include <llvm-c/BitReader.h>
#include <llvm-c/Core.h>
#include <llvm-c/Linker.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cg_internal.h"

/* libdevice, read once per process into memory (fb_ptx_libdevice_load):
 * a process-isolated worker reads it while its engine is made, before its
 * root becomes an empty directory and seccomp refuses opening files; every
 * module then parses it from these bytes. Where: $FB_LIBDEVICE (that file
 * only), else $CUDA_HOME's, else /usr/local/cuda's. */
/* The runtime's nvptx64 bitcode (rt_link.c), hashed into the target text. */
extern const unsigned char fb_rt_bc_nvptx64[];
extern const unsigned long fb_rt_bc_nvptx64_size;

static pthread_mutex_t lib_mu = PTHREAD_MUTEX_INITIALIZER;
static int lib_state;  /* 0: not looked for yet, 1: in memory, -1: none */
static char *lib_bytes;
static size_t lib_len;
static char lib_where[1040]; /* the path read, or the paths looked at */

static int read_file(const char *path, char **out, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f) return -1;
  char *buf = NULL;
  size_t n = 0, cap = 0;
  int bad = 0;
  for (;;) {
    if (n == cap) {
      char *nb = realloc(buf, cap = cap ? cap * 2 : 1u << 20);
      if (!nb) {
        bad = 1;
        break;
      }
      buf = nb;
    }
    size_t got = fread(buf + n, 1, cap - n, f);
    n += got;
    if (got == 0) {
      bad = ferror(f);
      break;
    }
  }
  fclose(f);
  if (bad || n == 0) {
    free(buf);
    return -1;
  }
  *out = buf;
  *len = n;
  return 0;
}

void fb_ptx_libdevice_load(void) {
  pthread_mutex_lock(&lib_mu);
  if (!lib_state) {
    char paths[2][512];
    int np = 0;
    const char *own = getenv("FB_LIBDEVICE"), *home = getenv("CUDA_HOME");
    if (own && *own) {
      snprintf(paths[np++], sizeof paths[0], "%s", own);
    } else {
      if (home && *home)
        snprintf(paths[np++], sizeof paths[0], "%s/nvvm/libdevice/libdevice.10.bc", home);
      snprintf(paths[np++], sizeof paths[0], "/usr/local/cuda/nvvm/libdevice/libdevice.10.bc");
    }
    lib_state = -1;
    for (int i = 0; i < np && lib_state < 0; i++)
      if (read_file(paths[i], &lib_bytes, &lib_len) == 0) {
        lib_state = 1;
        snprintf(lib_where, sizeof lib_where, "%s", paths[i]);
      }
    if (lib_state < 0)
      snprintf(lib_where, sizeof lib_where, "%s%s%s", paths[0], np > 1 ? " or " : "",
               np > 1 ? paths[1] : "");
  }
  pthread_mutex_unlock(&lib_mu);
}

char *fb_ptx_target_text(const char *sm) {
  fb_ptx_libdevice_load();
  uint64_t lh = 0xcbf29ce484222325ull, rh = 0xcbf29ce484222325ull;
  for (size_t i = 0; lib_state == 1 && i < lib_len; i++) lh = (lh ^ (uint8_t)lib_bytes[i]) * 0x100000001b3ull;
  for (unsigned long i = 0; i < fb_rt_bc_nvptx64_size; i++)
    rh = (rh ^ fb_rt_bc_nvptx64[i]) * 0x100000001b3ull;
  unsigned maj = 0, min = 0, patch = 0;
  LLVMGetVersion(&maj, &min, &patch);
  const char *fmt = "back end cuda\nLLVM %u.%u.%u (its PTX ISA)\nsm %s\nlibdevice %s %016llx %zu\n"
                    "runtime bitcode %016llx %lu\n";
  int n = snprintf(NULL, 0, fmt, maj, min, patch, sm, lib_state == 1 ? "yes" : "no",
                   (unsigned long long)lh, lib_state == 1 ? lib_len : 0, (unsigned long long)rh,
                   fb_rt_bc_nvptx64_size);
  char *out = malloc((size_t)n + 1);
  if (out)
    snprintf(out, (size_t)n + 1, fmt, maj, min, patch, sm, lib_state == 1 ? "yes" : "no",
             (unsigned long long)lh, lib_state == 1 ? lib_len : 0, (unsigned long long)rh,
             fb_rt_bc_nvptx64_size);
  return out;
}

int fb_ptx_has_libdevice(void) {
  fb_ptx_libdevice_load();
  return lib_state == 1; /* set once, under lib_mu, before this reads it */
}

const char *fb_ptx_libdevice_where(void) {
  fb_ptx_libdevice_load();
  return lib_where;
}

/* Does m call any __nv_* function? */
static int uses_libdevice(LLVMModuleRef m) {
  for (LLVMValueRef f = LLVMGetFirstFunction(m); f; f = LLVMGetNextFunction(f)) {
    size_t len;
    const char *name = LLVMGetValueName2(f, &len);
    if (LLVMIsDeclaration(f) && len > 5 && strncmp(name, "__nv_", 5) == 0) return 1;
  }
  return 0;
}

static int is_entry(const char *name) {
  return strcmp(name, FB_GPU_ENTRY) == 0 || strcmp(name, "fb_bounds") == 0;
}

/* Everything but the entry points becomes internal: unused libdevice
 * functions are then dead and O3 removes them. */
static void internalize(LLVMModuleRef m) {
  for (LLVMValueRef f = LLVMGetFirstFunction(m); f; f = LLVMGetNextFunction(f)) {
    size_t len;
    const char *name = LLVMGetValueName2(f, &len);
    if (!LLVMIsDeclaration(f) && !is_entry(name)) LLVMSetLinkage(f, LLVMInternalLinkage);
  }
  for (LLVMValueRef g = LLVMGetFirstGlobal(m); g; g = LLVMGetNextGlobal(g))
    if (!LLVMIsDeclaration(g)) LLVMSetLinkage(g, LLVMInternalLinkage);
}

static int link_libdevice(LLVMContextRef c, LLVMModuleRef m, char *err, size_t errlen) {
  const char *path = lib_where;
  /* a copy: LLVM's bitcode reader may keep pointers into the buffer */
  LLVMMemoryBufferRef buf =
      LLVMCreateMemoryBufferWithMemoryRangeCopy(lib_bytes, lib_len, "libdevice.10.bc");
  if (!buf) return fb_cg_fail(err, errlen, FB_ENOMEM, "out of memory");
  LLVMModuleRef lib = NULL;
  int bad = LLVMParseBitcodeInContext2(c, buf, &lib);
  LLVMDisposeMemoryBuffer(buf);
  if (bad) return fb_cg_fail(err, errlen, FB_ECOMPILE, "%s is not valid LLVM bitcode", path);
  LLVMSetTarget(lib, LLVMGetTarget(m));
  LLVMSetDataLayout(lib, LLVMGetDataLayoutStr(m));
  if (LLVMLinkModules2(m, lib)) /* lib is destroyed either way */
    return fb_cg_fail(err, errlen, FB_ECOMPILE, "linking %s failed", path);
  internalize(m);
  /* libdevice asks __nvvm_reflect("__CUDA_FTZ"): no flush to zero */
  LLVMAddModuleFlag(m, LLVMModuleFlagBehaviorOverride, "nvvm-reflect-ftz", 16,
                    LLVMValueAsMetadata(LLVMConstInt(LLVMInt32TypeInContext(c), 0, 0)));
  return 0;
}

static int emit_text(LLVMTargetMachineRef tm, LLVMModuleRef m, char **out, char *err,
                     size_t errlen) {
  LLVMMemoryBufferRef buf = NULL;
  char *msg = NULL;
  if (LLVMTargetMachineEmitToMemoryBuffer(tm, m, LLVMAssemblyFile, &msg, &buf)) {
    int rc = fb_cg_fail(err, errlen, FB_ECOMPILE, "PTX generation failed: %s", msg ? msg : "?");
    LLVMDisposeMessage(msg);
    return rc;
  }
  size_t n = LLVMGetBufferSize(buf);
  char *s = malloc(n + 1);
  if (s) {
    memcpy(s, LLVMGetBufferStart(buf), n);
    s[n] = 0;
  }
  LLVMDisposeMemoryBuffer(buf);
  if (!s) return fb_cg_fail(err, errlen, FB_ENOMEM, "out of memory");
  *out = s;
  return 0;
}

int fb_ptx_emit(const fb_cg_task *t, const char *sm, char **ptx, char *err, size_t errlen) {
  return fb_ptx_compile(t, sm, ptx, NULL, err, errlen);
}

int fb_ptx_compile(const fb_cg_task *t, const char *sm, char **ptx, int *stmts, char *err,
                   size_t errlen) {
  if (!t || !ptx) return fb_cg_fail(err, errlen, FB_EINVAL, "fb_ptx_emit: missing task or output");
  *ptx = NULL;
  LLVMTargetMachineRef tm;
  int rc = fb_cg_nvptx_tm(sm, &tm, err, errlen);
  if (rc) return rc;
  int have_lib = fb_ptx_has_libdevice();
  char *layout = fb_cg_tm_layout(tm);
  LLVMContextRef c = LLVMContextCreate();
  LLVMModuleRef m = NULL;
  fb_cg_options o = {FB_CG_NVPTX, "fb_task", "fb_bounds", have_lib, 0};
  rc = layout ? 0 : fb_cg_fail(err, errlen, FB_ENOMEM, "out of memory");
  if (!rc) rc = fb_cg_build(c, t, &o, "nvptx64-nvidia-cuda", layout, &m, stmts, err, errlen);
  if (!rc) rc = fb_cg_verify(m, err, errlen);
  if (!rc) rc = fb_cg_link_rt(c, m, FB_CG_NVPTX, err, errlen);
  if (!rc && have_lib && uses_libdevice(m)) rc = link_libdevice(c, m, err, errlen);
  if (!rc) rc = fb_cg_optimize(m, tm, err, errlen);
  if (!rc) rc = emit_text(tm, m, ptx, err, errlen);
  if (m) LLVMDisposeModule(m);
  LLVMContextDispose(c);
  LLVMDisposeTargetMachine(tm);
  free(layout);
  return rc;
}

int fb_llvm_ir_text(const fb_cg_task *t, const char *target, char **text, char *err,
                    size_t errlen) {
  if (!t || !text || !target)
    return fb_cg_fail(err, errlen, FB_EINVAL, "fb_llvm_ir_text: missing task, target or output");
  *text = NULL;
  int gpu = strcmp(target, "nvptx64") == 0, opt = strcmp(target, "x86_64-O3") == 0;
  if (!gpu && !opt && strcmp(target, "x86_64") != 0)
    return fb_cg_fail(err, errlen, FB_EINVAL, "unknown target '%s' (x86_64, x86_64-O3 or nvptx64)",
                      target);
  LLVMTargetMachineRef tm = NULL;
  if (gpu) {
    int rc = fb_cg_nvptx_tm("sm_80", &tm, err, errlen);
    if (rc) return rc;
  } else if (!(tm = fb_cg_host_tm(err, errlen))) {
    return FB_ECOMPILE;
  }
  char *triple = LLVMGetTargetMachineTriple(tm);
  char *layout = fb_cg_tm_layout(tm);
  char *features = gpu ? NULL : LLVMGetTargetMachineFeatureString(tm);
  fb_cg_options o = {gpu ? FB_CG_NVPTX : FB_CG_CPU, gpu ? "fb_task" : "fb_body", "fb_bounds",
                     gpu && fb_ptx_has_libdevice(),
                     !gpu && fb_cg_has_cas16(triple, features)};
  LLVMDisposeMessage(features);
  LLVMContextRef c = LLVMContextCreate();
  LLVMModuleRef m = NULL;
  int rc = layout ? 0 : fb_cg_fail(err, errlen, FB_ENOMEM, "out of memory");
  if (!rc) rc = fb_cg_build(c, t, &o, triple, layout, &m, NULL, err, errlen);
  if (!rc && opt) rc = fb_cg_verify(m, err, errlen);
  if (!rc && opt) rc = fb_cg_link_rt(c, m, FB_CG_CPU, err, errlen);
  if (!rc && opt) rc = fb_cg_optimize(m, tm, err, errlen);
  if (!rc) {
    char *s = LLVMPrintModuleToString(m);
    *text = s ? strdup(s) : NULL;
    LLVMDisposeMessage(s);
    if (!*text) rc = fb_cg_fail(err, errlen, FB_ENOMEM, "out of memory");
  }
  if (m) LLVMDisposeModule(m);
  LLVMContextDispose(c);
  LLVMDisposeMessage(triple);
  LLVMDisposeTargetMachine(tm);
  free(layout);
  return rc;
}
