/* Links the sparse device runtime (codegen/rt/fb_rt.c, embedded as bitcode
 * for x86_64 and nvptx64 at build time) into a task module that calls it.
 * The runtime's functions become internal, so the O3 pipeline inlines them
 * into the task and folds the constant descriptors they are given; modules
 * that call no fb_rt_* function are left alone (dense tasks pay nothing). */
#include <llvm-c/BitReader.h>
#include <llvm-c/Linker.h>
#include <string.h>

#include "cg_internal.h"

extern const unsigned char fb_rt_bc_x86_64[];
extern const unsigned long fb_rt_bc_x86_64_size;
extern const unsigned char fb_rt_bc_nvptx64[];
extern const unsigned long fb_rt_bc_nvptx64_size;

static int is_rt_name(const char *name, size_t len) {
  return len > 6 && strncmp(name, "fb_rt_", 6) == 0;
}

static int uses_rt(LLVMModuleRef m) {
  for (LLVMValueRef f = LLVMGetFirstFunction(m); f; f = LLVMGetNextFunction(f)) {
    size_t len;
    const char *name = LLVMGetValueName2(f, &len);
    if (LLVMIsDeclaration(f) && is_rt_name(name, len)) return 1;
  }
  return 0;
}

/* Attributes clang gave the runtime for its own target and options: the
 * task's target machine decides these, and "no-builtins" would spread to
 * the task's functions on inlining. */
static void strip_attributes(LLVMModuleRef lib) {
  static const char *const names[] = {"target-cpu",    "target-features",
                                      "tune-cpu",      "no-builtins",
                                      "frame-pointer", "stack-protector-buffer-size"};
  for (LLVMValueRef f = LLVMGetFirstFunction(lib); f; f = LLVMGetNextFunction(f))
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
      LLVMRemoveStringAttributeAtIndex(f, LLVMAttributeFunctionIndex, names[i],
                                       (unsigned)strlen(names[i]));
}

int fb_cg_link_rt(LLVMContextRef c, LLVMModuleRef m, fb_cg_target target, char *err,
                  size_t errlen) {
  if (!uses_rt(m)) return 0;
  const unsigned char *bc = target == FB_CG_NVPTX ? fb_rt_bc_nvptx64 : fb_rt_bc_x86_64;
  size_t n = target == FB_CG_NVPTX ? fb_rt_bc_nvptx64_size : fb_rt_bc_x86_64_size;
  LLVMMemoryBufferRef buf = LLVMCreateMemoryBufferWithMemoryRange((const char *)bc, n, "fb_rt", 0);
  LLVMModuleRef lib = NULL;
  int bad = LLVMParseBitcodeInContext2(c, buf, &lib);
  LLVMDisposeMemoryBuffer(buf);
  if (bad)
    return fb_cg_fail(err, errlen, FB_EINTERNAL, "the embedded sparse runtime bitcode is invalid");
  strip_attributes(lib);
  LLVMSetTarget(lib, LLVMGetTarget(m));
  LLVMSetDataLayout(lib, LLVMGetDataLayoutStr(m));
  if (LLVMLinkModules2(m, lib)) /* lib is destroyed either way */
    return fb_cg_fail(err, errlen, FB_ECOMPILE, "linking the sparse runtime into the task failed");
  for (LLVMValueRef f = LLVMGetFirstFunction(m); f; f = LLVMGetNextFunction(f)) {
    size_t len;
    const char *name = LLVMGetValueName2(f, &len);
    if (!LLVMIsDeclaration(f) && is_rt_name(name, len)) LLVMSetLinkage(f, LLVMInternalLinkage);
  }
  return 0;
}
