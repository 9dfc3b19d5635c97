/* LLVM plumbing for codegen/: one-time target registration (X86 for the
 * JIT, NVPTX for PTX), target machines for the host and for an SM, the O3
 * pipeline, the module verifier and the error-message helper. */
#include <llvm-c/Analysis.h>
#include <llvm-c/Error.h>
#include <llvm-c/Target.h>
#include <llvm-c/Transforms/PassBuilder.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cg_internal.h"

static pthread_once_t llvm_once = PTHREAD_ONCE_INIT;

static void llvm_init_targets(void) {
  LLVMInitializeX86TargetInfo();
  LLVMInitializeX86Target();
  LLVMInitializeX86TargetMC();
  LLVMInitializeX86AsmPrinter();
  LLVMInitializeX86AsmParser();
  LLVMInitializeNVPTXTargetInfo();
  LLVMInitializeNVPTXTarget();
  LLVMInitializeNVPTXTargetMC();
  LLVMInitializeNVPTXAsmPrinter();
}

void fb_cg_llvm_init(void) { pthread_once(&llvm_once, llvm_init_targets); }

int fb_cg_fail(char *err, size_t errlen, int code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fb_verrf(err, errlen, fmt, ap);
  va_end(ap);
  return code;
}

LLVMTargetMachineRef fb_cg_cpu_tm(const char *triple, const char *cpu, const char *features,
                                  char *err, size_t errlen) {
  fb_cg_llvm_init();
  LLVMTargetRef target = NULL;
  char *msg = NULL;
  if (LLVMGetTargetFromTriple(triple, &target, &msg)) {
    fb_cg_fail(err, errlen, FB_ECOMPILE, "no LLVM target for host %s: %s", triple, msg ? msg : "?");
    LLVMDisposeMessage(msg);
    return NULL;
  }
  /* small code model + PIC: the JIT links objects with GOT/PLT stubs */
  LLVMTargetMachineRef tm = LLVMCreateTargetMachine(
      target, triple, cpu, features, LLVMCodeGenLevelAggressive, LLVMRelocPIC, LLVMCodeModelSmall);
  if (!tm) fb_cg_fail(err, errlen, FB_ECOMPILE, "cannot create a target machine for %s", triple);
  return tm;
}

int fb_cg_has_cas16(const char *triple, const char *features) {
  if (!triple || !features || strncmp(triple, "x86_64", 6)) return 0;
  for (const char *f = features; (f = strstr(f, "+cx16")); f += 5)
    if ((f == features || f[-1] == ',') && (f[5] == ',' || f[5] == 0)) return 1;
  return 0;
}

int fb_cg_host_info(char **triple, char **cpu, char **features) {
  fb_cg_llvm_init();
  char *t = LLVMGetDefaultTargetTriple(), *c = LLVMGetHostCPUName(), *f = LLVMGetHostCPUFeatures();
  *triple = t ? strdup(t) : NULL;
  *cpu = c ? strdup(c) : NULL;
  *features = f ? strdup(f) : NULL;
  LLVMDisposeMessage(t);
  LLVMDisposeMessage(c);
  LLVMDisposeMessage(f);
  if (*triple && *cpu && *features) return 0;
  free(*triple);
  free(*cpu);
  free(*features);
  *triple = *cpu = *features = NULL;
  return FB_ENOMEM;
}

LLVMTargetMachineRef fb_cg_host_tm(char *err, size_t errlen) {
  char *triple, *cpu, *features;
  if (fb_cg_host_info(&triple, &cpu, &features)) {
    fb_cg_fail(err, errlen, FB_ENOMEM, "out of memory");
    return NULL;
  }
  LLVMTargetMachineRef tm = fb_cg_cpu_tm(triple, cpu, features, err, errlen);
  free(triple);
  free(cpu);
  free(features);
  return tm;
}

/* The PTX ISA version for an SM: the lowest LLVM 19 accepts for it. */
static const char *ptx_features(int smnum, int arch_specific) {
  if (arch_specific) return "+ptx80";
  if (smnum >= 89) return "+ptx78";
  if (smnum >= 87) return "+ptx74";
  if (smnum >= 86) return "+ptx71";
  if (smnum >= 80) return "+ptx70";
  return "+ptx64";
}

/* "sm_80" / "sm_90a": digits and an optional 'a'. */
static int parse_sm(const char *sm, int *num, int *arch_specific) {
  if (!sm || strncmp(sm, "sm_", 3) != 0) return -1;
  const char *p = sm + 3;
  int n = 0, digits = 0;
  while (*p >= '0' && *p <= '9' && digits < 4) n = n * 10 + (*p++ - '0'), digits++;
  *arch_specific = *p == 'a';
  if (*arch_specific) p++;
  if (digits < 2 || *p) return -1;
  *num = n;
  return 0;
}

int fb_cg_nvptx_tm(const char *sm, LLVMTargetMachineRef *tm, char *err, size_t errlen) {
  fb_cg_llvm_init();
  *tm = NULL;
  int num = 0, arch = 0;
  if (parse_sm(sm, &num, &arch) || num < 30 || num > 90 || (arch && num != 90))
    return fb_cg_fail(err, errlen, FB_EINVAL,
                      "unknown GPU architecture '%s' (expected sm_30 .. sm_90 or sm_90a)",
                      sm ? sm : "(null)");
  LLVMTargetRef target = NULL;
  char *msg = NULL;
  if (LLVMGetTargetFromTriple("nvptx64-nvidia-cuda", &target, &msg)) {
    int rc = fb_cg_fail(err, errlen, FB_EUNSUPPORTED, "this LLVM has no NVPTX target: %s",
                        msg ? msg : "?");
    LLVMDisposeMessage(msg);
    return rc;
  }
  *tm = LLVMCreateTargetMachine(target, "nvptx64-nvidia-cuda", sm, ptx_features(num, arch),
                                LLVMCodeGenLevelAggressive, LLVMRelocDefault, LLVMCodeModelDefault);
  if (!*tm)
    return fb_cg_fail(err, errlen, FB_ECOMPILE, "cannot create an NVPTX target machine for %s", sm);
  return 0;
}

char *fb_cg_tm_layout(LLVMTargetMachineRef tm) {
  LLVMTargetDataRef td = LLVMCreateTargetDataLayout(tm);
  char *s = LLVMCopyStringRepOfTargetData(td);
  LLVMDisposeTargetData(td);
  char *r = s ? strdup(s) : NULL;
  LLVMDisposeMessage(s);
  return r;
}

int fb_cg_optimize(LLVMModuleRef m, LLVMTargetMachineRef tm, char *err, size_t errlen) {
  LLVMPassBuilderOptionsRef po = LLVMCreatePassBuilderOptions();
  LLVMPassBuilderOptionsSetLoopVectorization(po, 1);
  LLVMPassBuilderOptionsSetSLPVectorization(po, 1);
  LLVMPassBuilderOptionsSetLoopInterleaving(po, 1);
  LLVMPassBuilderOptionsSetLoopUnrolling(po, 1);
  LLVMErrorRef e = LLVMRunPasses(m, "default<O3>", tm, po);
  LLVMDisposePassBuilderOptions(po);
  if (!e) return 0;
  char *msg = LLVMGetErrorMessage(e);
  int rc = fb_cg_fail(err, errlen, FB_ECOMPILE, "LLVM optimisation failed: %s", msg);
  LLVMDisposeErrorMessage(msg);
  return rc;
}

int fb_cg_verify(LLVMModuleRef m, char *err, size_t errlen) {
  char *msg = NULL;
  if (!LLVMVerifyModule(m, LLVMReturnStatusAction, &msg)) {
    LLVMDisposeMessage(msg);
    return 0;
  }
  int rc =
      fb_cg_fail(err, errlen, FB_EINTERNAL, "generated LLVM IR is malformed: %s", msg ? msg : "?");
  LLVMDisposeMessage(msg);
  return rc;
}
