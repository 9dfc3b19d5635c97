/* The subset of the CUDA Driver API that Fusebox calls, declared here and
 * resolved at run time with dlopen("libcuda.so.1"): no link-time or header
 * dependency on CUDA, so one fuseboxd binary serves machines with and
 * without a GPU. The types and constants are the driver ABI's (cuda.h),
 * the symbol names those the driver exports for the 64-bit, non-per-thread
 * default-stream API (the _v2 entry points where cuda.h maps to them).
 *
 * FB_CUDA_LIBRARY, when set, names the library to load instead (a test
 * double, or a driver outside the loader's path). */
#ifndef FB_CUDA_DRV_H
#define FB_CUDA_DRV_H

#include <stddef.h>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef struct CUctx_st *CUcontext;
typedef struct CUmod_st *CUmodule;
typedef struct CUfunc_st *CUfunction;
typedef struct CUstream_st *CUstream;
typedef struct CUevent_st *CUevent;
typedef int CUjit_option;

enum {
  CUDA_SUCCESS = 0,
  CUDA_ERROR_INVALID_VALUE = 1,
  CUDA_ERROR_OUT_OF_MEMORY = 2,
  CUDA_ERROR_NOT_INITIALIZED = 3,
  CUDA_ERROR_NO_DEVICE = 100,
  CUDA_ERROR_ECC_UNCORRECTABLE = 214,
  CUDA_ERROR_INVALID_PTX = 218,
  CUDA_ERROR_UNSUPPORTED_PTX_VERSION = 222,
  CUDA_ERROR_NOT_READY = 600,
  CUDA_ERROR_ILLEGAL_ADDRESS = 700,
  CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES = 701,
  CUDA_ERROR_LAUNCH_TIMEOUT = 702,
  CUDA_ERROR_HARDWARE_STACK_ERROR = 714,
  CUDA_ERROR_ILLEGAL_INSTRUCTION = 715,
  CUDA_ERROR_MISALIGNED_ADDRESS = 716,
  CUDA_ERROR_INVALID_ADDRESS_SPACE = 717,
  CUDA_ERROR_INVALID_PC = 718,
  CUDA_ERROR_LAUNCH_FAILED = 719
};

enum {
  CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK = 1,
  CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16,
  CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR = 39,
  CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75,
  CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76,
  CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY = 83,
  CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS = 89
};

enum {
  CU_JIT_INFO_LOG_BUFFER = 3,
  CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES = 4,
  CU_JIT_ERROR_LOG_BUFFER = 5,
  CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES = 6
};

#define CU_MEM_ATTACH_GLOBAL 0x1
#define CU_STREAM_NON_BLOCKING 0x1
#define CU_EVENT_DEFAULT 0x0
#define CU_MEMHOSTALLOC_PORTABLE 0x1

/* X(return, name, symbol, parameters): every entry point, once. */
#define FB_CUDA_FUNCS(X)                                                                           \
  X(CUresult, Init, "cuInit", (unsigned flags))                                                    \
  X(CUresult, DriverGetVersion, "cuDriverGetVersion", (int *v))                                    \
  X(CUresult, DeviceGetCount, "cuDeviceGetCount", (int *n))                                        \
  X(CUresult, DeviceGet, "cuDeviceGet", (CUdevice * d, int ordinal))                               \
  X(CUresult, DeviceGetName, "cuDeviceGetName", (char *name, int len, CUdevice d))                 \
  X(CUresult, DeviceGetAttribute, "cuDeviceGetAttribute", (int *v, int attr, CUdevice d))          \
  X(CUresult, DeviceTotalMem, "cuDeviceTotalMem_v2", (size_t *bytes, CUdevice d))                  \
  X(CUresult, PrimaryCtxRetain, "cuDevicePrimaryCtxRetain", (CUcontext * c, CUdevice d))           \
  X(CUresult, PrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2", (CUdevice d))                     \
  X(CUresult, PrimaryCtxReset, "cuDevicePrimaryCtxReset_v2", (CUdevice d))                         \
  X(CUresult, CtxSetCurrent, "cuCtxSetCurrent", (CUcontext c))                                     \
  X(CUresult, StreamCreate, "cuStreamCreate", (CUstream * s, unsigned flags))                      \
  X(CUresult, StreamDestroy, "cuStreamDestroy_v2", (CUstream s))                                   \
  X(CUresult, StreamSynchronize, "cuStreamSynchronize", (CUstream s))                              \
  X(CUresult, EventCreate, "cuEventCreate", (CUevent * e, unsigned flags))                         \
  X(CUresult, EventDestroy, "cuEventDestroy_v2", (CUevent e))                                      \
  X(CUresult, EventRecord, "cuEventRecord", (CUevent e, CUstream s))                               \
  X(CUresult, EventElapsedTime, "cuEventElapsedTime", (float *ms, CUevent a, CUevent b))           \
  X(CUresult, MemAlloc, "cuMemAlloc_v2", (CUdeviceptr * p, size_t bytes))                          \
  X(CUresult, MemAllocManaged, "cuMemAllocManaged",                                                \
    (CUdeviceptr * p, size_t bytes, unsigned flags))                                               \
  X(CUresult, MemFree, "cuMemFree_v2", (CUdeviceptr p))                                            \
  X(CUresult, MemHostAlloc, "cuMemHostAlloc", (void **p, size_t bytes, unsigned flags))            \
  X(CUresult, MemFreeHost, "cuMemFreeHost", (void *p))                                             \
  X(CUresult, MemGetInfo, "cuMemGetInfo_v2", (size_t *free_b, size_t *total_b))                    \
  X(CUresult, MemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2",                                             \
    (CUdeviceptr dst, const void *src, size_t bytes, CUstream s))                                  \
  X(CUresult, MemcpyDtoHAsync, "cuMemcpyDtoHAsync_v2",                                             \
    (void *dst, CUdeviceptr src, size_t bytes, CUstream s))                                        \
  X(CUresult, MemsetD8Async, "cuMemsetD8Async",                                                    \
    (CUdeviceptr p, unsigned char v, size_t n, CUstream s))                                        \
  X(CUresult, ModuleLoadDataEx, "cuModuleLoadDataEx",                                              \
    (CUmodule * m, const void *image, unsigned nopt, CUjit_option *opts, void **vals))             \
  X(CUresult, ModuleUnload, "cuModuleUnload", (CUmodule m))                                        \
  X(CUresult, ModuleGetFunction, "cuModuleGetFunction",                                            \
    (CUfunction * f, CUmodule m, const char *name))                                                \
  X(CUresult, LaunchKernel, "cuLaunchKernel",                                                      \
    (CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,   \
     unsigned shmem, CUstream s, void **params, void **extra))                                     \
  X(CUresult, GetErrorName, "cuGetErrorName", (CUresult r, const char **s))                        \
  X(CUresult, GetErrorString, "cuGetErrorString", (CUresult r, const char **s))

typedef struct fb_cuda_api {
  void *lib; /* dlopen handle */
#define FB_CUDA_MEMBER(ret, name, sym, params) ret(*name) params;
  FB_CUDA_FUNCS(FB_CUDA_MEMBER)
#undef FB_CUDA_MEMBER
} fb_cuda_api;

/* Load the driver (FB_CUDA_LIBRARY or libcuda.so.1) and resolve every entry
 * point. 0, or FB_EDEVICE with a message naming the library and what was
 * missing (no driver installed, an entry point the driver lacks). */
int fb_cuda_api_load(fb_cuda_api *api, char *err, size_t errlen);
void fb_cuda_api_unload(fb_cuda_api *api);
/* "CUDA_ERROR_ILLEGAL_ADDRESS: an illegal memory access was encountered"
 * into buf (the driver's own names when it knows r). Returns buf. */
const char *fb_cuda_errstr(const fb_cuda_api *api, CUresult r, char *buf, size_t len);
/* Errors that leave the context unusable (every later call fails). */
int fb_cuda_sticky(CUresult r);

#endif
