/* The NVPTX back end: the same task module for nvptx64-nvidia-cuda (entry
 * points fb_body, a grid-stride loop over [lo, hi), and fb_bounds), math
 * through libdevice when the CUDA toolkit has it (linked, then internalized
 * so that O3 drops what the task does not call), printed as PTX text. Also
 * fb_llvm_ir_text, the module of either target as text (unoptimized, or for
 * the CPU also after linking the runtime and O3, as the JIT compiles it). */
#include <llvm-c/BitReader.h>
#include <llvm-c/Linker.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cg_internal.h"

/* libdevice: $CUDA_HOME first, then the usual install path. */
static int libdevice_path(char *buf, size_t n) {
  const char *home = getenv("CUDA_HOME");
  if (home && *home) {
    snprintf(buf, n, "%s/nvvm/libdevice/libdevice.10.bc", home);
    if (access(buf, R_OK) == 0) return 1;
  }
  snprintf(buf, n, "/usr/local/cuda/nvvm/libdevice/libdevice.10.bc");
  return access(buf, R_OK) == 0;
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

static int link_libdevice(LLVMContextRef c, LLVMModuleRef m, const char *path, char *err,
                          size_t errlen) {
  LLVMMemoryBufferRef buf = NULL;
  char *msg = NULL;
  if (LLVMCreateMemoryBufferWithContentsOfFile(path, &buf, &msg)) {
    int rc = fb_cg_fail(err, errlen, FB_EIO, "cannot read %s: %s", path, msg ? msg : "?");
    LLVMDisposeMessage(msg);
    return rc;
  }
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
  char path[4096];
  int have_lib = libdevice_path(path, sizeof path);
  char *layout = fb_cg_tm_layout(tm);
  LLVMContextRef c = LLVMContextCreate();
  LLVMModuleRef m = NULL;
  fb_cg_options o = {FB_CG_NVPTX, "fb_task", "fb_bounds", have_lib, 0};
  rc = layout ? 0 : fb_cg_fail(err, errlen, FB_ENOMEM, "out of memory");
  if (!rc) rc = fb_cg_build(c, t, &o, "nvptx64-nvidia-cuda", layout, &m, stmts, err, errlen);
  if (!rc) rc = fb_cg_verify(m, err, errlen);
  if (!rc) rc = fb_cg_link_rt(c, m, FB_CG_NVPTX, err, errlen);
  if (!rc && have_lib && uses_libdevice(m)) rc = link_libdevice(c, m, path, err, errlen);
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
  char path[4096];
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
                     gpu && libdevice_path(path, sizeof path),
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
