/* Loading the CUDA driver at run time (cuda_drv.h): dlopen, then one dlsym
 * per entry point of FB_CUDA_FUNCS. A missing library is the normal case on
 * a machine without a GPU, so its message says what to do about it. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fusebox/common.h"
#include "runtime/cuda_drv.h"

int fb_cuda_api_load(fb_cuda_api *api, char *err, size_t errlen) {
  memset(api, 0, sizeof *api);
  const char *path = getenv("FB_CUDA_LIBRARY");
  if (!path || !*path) path = "libcuda.so.1";
  dlerror();
  api->lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!api->lib) {
    const char *why = dlerror();
    fb_errf(err, errlen,
            "CUDA backend: cannot load the CUDA driver %s (%s); is the NVIDIA driver "
            "installed? Use --backend cpu or auto to run without a GPU",
            path, why ? why : "not found");
    return FB_EDEVICE;
  }
#define FB_CUDA_RESOLVE(ret, name, sym, params)                                                    \
  *(void **)&api->name = dlsym(api->lib, sym);                                                     \
  if (!api->name) {                                                                                \
    fb_errf(err, errlen, "CUDA backend: the driver %s has no entry point %s (driver too old?)",    \
            path, sym);                                                                            \
    fb_cuda_api_unload(api);                                                                       \
    return FB_EDEVICE;                                                                             \
  }
  FB_CUDA_FUNCS(FB_CUDA_RESOLVE)
#undef FB_CUDA_RESOLVE
  return 0;
}

void fb_cuda_api_unload(fb_cuda_api *api) {
  if (api->lib) dlclose(api->lib);
  memset(api, 0, sizeof *api);
}

const char *fb_cuda_errstr(const fb_cuda_api *api, CUresult r, char *buf, size_t len) {
  const char *name = NULL, *text = NULL;
  if (api && api->GetErrorName && api->GetErrorName(r, &name) != CUDA_SUCCESS) name = NULL;
  if (api && api->GetErrorString && api->GetErrorString(r, &text) != CUDA_SUCCESS) text = NULL;
  if (name && text) fb_errf(buf, len, "%s: %s", name, text);
  else if (name) fb_errf(buf, len, "%s", name);
  else fb_errf(buf, len, "CUDA error %d", r);
  return buf;
}

int fb_cuda_sticky(CUresult r) {
  switch (r) {
  case CUDA_ERROR_ECC_UNCORRECTABLE:
  case CUDA_ERROR_ILLEGAL_ADDRESS:
  case CUDA_ERROR_LAUNCH_TIMEOUT:
  case CUDA_ERROR_HARDWARE_STACK_ERROR:
  case CUDA_ERROR_ILLEGAL_INSTRUCTION:
  case CUDA_ERROR_MISALIGNED_ADDRESS:
  case CUDA_ERROR_INVALID_ADDRESS_SPACE:
  case CUDA_ERROR_INVALID_PC:
  case CUDA_ERROR_LAUNCH_FAILED: return 1;
  default: return 0;
  }
}
