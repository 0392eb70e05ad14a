// The driver calls the fake libcuda.so.1 simulates: initialisation, versions,
// devices (as configured in the fake runtime), primary contexts that are
// always active, error strings and cuGetProcAddress. Everything else in
// cuda.h is a generated stub.
#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "common/code_names.h"
#include "driver/driver_entry.h"
#include "driver/virtual_memory.h"
#include "simcuda_tables.inc"

// A CUcontext points to one of these: one primary context per device.
struct CUctx_st {
  int device;
};

namespace simcuda {
namespace drv {
namespace {

constexpr int kMaxDevices = 64;
constexpr int kDriverVersion = 13000;
CUctx_st g_primary_contexts[kMaxDevices];
thread_local CUctx_st* t_current_context = nullptr;

CUctx_st* PrimaryContext(int device) {
  g_primary_contexts[device].device = device;
  return &g_primary_contexts[device];
}

}  // namespace

int DeviceCount() {
  if (auto count = Runtime<int (*)()>("simcuda_get_device_count")) return count();
  const char* env = std::getenv("SIMCUDA_DEVICE_COUNT");
  return env != nullptr ? std::atoi(env) : 1;
}

bool ValidDevice(CUdevice device) { return device >= 0 && device < DeviceCount(); }

void* RuntimeFunction(const char* name) {
  static const bool have_runtime = dlsym(RTLD_DEFAULT, "simcuda_is_simulated") != nullptr;
  return have_runtime ? dlsym(RTLD_DEFAULT, name) : nullptr;
}

CUresult Unsupported(CallSite* site) {
  ReportUnsupported(site);
  return CUDA_ERROR_NOT_SUPPORTED;
}

}  // namespace drv
}  // namespace simcuda

using simcuda::drv::Runtime;
using simcuda::drv::ValidDevice;

extern "C" {

CUresult cuInit(unsigned int flags) {
  SIMCUDA_DRIVER_ENTER();
  if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
  return simcuda::drv::DeviceCount() == 0 ? CUDA_ERROR_NO_DEVICE : CUDA_SUCCESS;
}

CUresult cuDriverGetVersion(int* version) {
  SIMCUDA_DRIVER_ENTER();
  if (version == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *version = simcuda::drv::kDriverVersion;
  return CUDA_SUCCESS;
}

CUresult cuDeviceGetCount(int* count) {
  SIMCUDA_DRIVER_ENTER();
  if (count == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *count = simcuda::drv::DeviceCount();
  return CUDA_SUCCESS;
}

CUresult cuDeviceGet(CUdevice* device, int ordinal) {
  SIMCUDA_DRIVER_ENTER();
  if (device == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!ValidDevice(ordinal)) return CUDA_ERROR_INVALID_DEVICE;
  *device = ordinal;
  return CUDA_SUCCESS;
}

CUresult cuDeviceGetName(char* name, int len, CUdevice device) {
  SIMCUDA_DRIVER_ENTER();
  if (name == nullptr || len <= 0) return CUDA_ERROR_INVALID_VALUE;
  if (!ValidDevice(device)) return CUDA_ERROR_INVALID_DEVICE;
  std::snprintf(name, static_cast<size_t>(len), "%s", "torchmem simulated device");
  return CUDA_SUCCESS;
}

CUresult cuDeviceTotalMem_v2(size_t* bytes, CUdevice device) {
  SIMCUDA_DRIVER_ENTER();
  if (bytes == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!ValidDevice(device)) return CUDA_ERROR_INVALID_DEVICE;
  auto capacity = Runtime<unsigned long long (*)(int)>("simcuda_get_memory_capacity");
  *bytes = capacity ? capacity(device) : 0;
  return CUDA_SUCCESS;
}

CUresult cuDeviceGetAttribute(int* value, CUdevice_attribute attribute, CUdevice device) {
  SIMCUDA_DRIVER_ENTER();
  if (value == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!ValidDevice(device)) return CUDA_ERROR_INVALID_DEVICE;
  // The driver's virtual memory (vmm_api.cc): supported, exportable as POSIX
  // file descriptors only (no fabric, no Windows handles, no RDMA).
  switch (attribute) {
    case CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED:
    case CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED:
      *value = 1;
      return CUDA_SUCCESS;
    case CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_WIN32_HANDLE_SUPPORTED:
    case CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_WIN32_KMT_HANDLE_SUPPORTED:
    case CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED:
      *value = simcuda::drv::GpuDirectRdmaSupported() ? 1 : 0;  // SIMCUDA_GPU_DIRECT_RDMA
      return CUDA_SUCCESS;
    case CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED:
    case CU_DEVICE_ATTRIBUTE_GENERIC_COMPRESSION_SUPPORTED:
#if CUDA_VERSION >= 13000  // host VMM attributes are new in CUDA 13's cuda.h
    case CU_DEVICE_ATTRIBUTE_HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED:
    case CU_DEVICE_ATTRIBUTE_HOST_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED:
#endif
      *value = 0;
      return CUDA_SUCCESS;
    default:
      break;
  }
  // CUdevice_attribute and cudaDeviceAttr share their numbering.
  auto get = Runtime<int (*)(int*, int, int)>("cudaDeviceGetAttribute");
  if (get == nullptr) return CUDA_ERROR_NOT_SUPPORTED;
  return get(value, attribute, device) == 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult cuDeviceComputeCapability(int* major, int* minor, CUdevice device) {
  SIMCUDA_DRIVER_ENTER();
  if (major == nullptr || minor == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!ValidDevice(device)) return CUDA_ERROR_INVALID_DEVICE;
  *major = 9;
  *minor = 0;
  return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxGetState(CUdevice device, unsigned int* flags, int* active) {
  SIMCUDA_DRIVER_ENTER();
  if (flags == nullptr || active == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!ValidDevice(device)) return CUDA_ERROR_INVALID_DEVICE;
  *flags = 0;
  // As the driver: active once something created the context (the runtime
  // keeps the state, see simcuda_context_active). torch's MaybeSetDevice
  // relies on this to avoid creating contexts on devices it only passes by.
  auto context_active = Runtime<int (*)(int)>("simcuda_context_active");
  *active = context_active != nullptr ? context_active(device) : 1;
  return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRetain(CUcontext* context, CUdevice device) {
  SIMCUDA_DRIVER_ENTER();
  if (context == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!ValidDevice(device)) return CUDA_ERROR_INVALID_DEVICE;
  // Retaining creates the primary context (the runtime counts it).
  if (auto init = Runtime<int (*)(int, unsigned int, unsigned int)>("cudaInitDevice")) {
    if (init(device, 0, 0) != 0) return CUDA_ERROR_DEVICE_UNAVAILABLE;  // exclusive mode
  }
  *context = simcuda::drv::PrimaryContext(device);
  return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRelease_v2(CUdevice device) {
  SIMCUDA_DRIVER_ENTER();
  return ValidDevice(device) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE;
}

CUresult cuDevicePrimaryCtxSetFlags_v2(CUdevice device, unsigned int flags) {
  SIMCUDA_DRIVER_ENTER();
  return ValidDevice(device) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE;
}

CUresult cuDevicePrimaryCtxReset_v2(CUdevice device) {
  SIMCUDA_DRIVER_ENTER();
  return ValidDevice(device) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE;
}

CUresult cuCtxGetCurrent(CUcontext* context) {
  SIMCUDA_DRIVER_ENTER();
  if (context == nullptr) return CUDA_ERROR_INVALID_VALUE;
  CUctx_st* current = simcuda::drv::t_current_context;
  if (current == nullptr) {
    // The runtime makes the current device's primary context current.
    int device = 0;
    auto get_device = Runtime<int (*)(int*)>("cudaGetDevice");
    if (get_device != nullptr && get_device(&device) == 0 && ValidDevice(device)) {
      current = simcuda::drv::PrimaryContext(device);
    }
  }
  *context = current;
  return CUDA_SUCCESS;
}

CUresult cuCtxSetCurrent(CUcontext context) {
  SIMCUDA_DRIVER_ENTER();
  if (context != nullptr) {
    if (!ValidDevice(context->device)) return CUDA_ERROR_INVALID_CONTEXT;
    if (auto set_device = Runtime<int (*)(int)>("cudaSetDevice")) set_device(context->device);
  }
  simcuda::drv::t_current_context = context;
  return CUDA_SUCCESS;
}

CUresult cuCtxGetDevice(CUdevice* device) {
  SIMCUDA_DRIVER_ENTER();
  if (device == nullptr) return CUDA_ERROR_INVALID_VALUE;
  int current = 0;
  auto get_device = Runtime<int (*)(int*)>("cudaGetDevice");
  if (get_device != nullptr) get_device(&current);
  *device = simcuda::drv::t_current_context ? simcuda::drv::t_current_context->device : current;
  return CUDA_SUCCESS;
}

CUresult cuCtxSynchronize(void) {
  SIMCUDA_DRIVER_ENTER();
  if (auto sync = Runtime<int (*)()>("cudaDeviceSynchronize")) sync();
  return CUDA_SUCCESS;
}

CUresult cuMemGetInfo_v2(size_t* free, size_t* total) {
  SIMCUDA_DRIVER_ENTER();
  auto info = Runtime<int (*)(size_t*, size_t*)>("cudaMemGetInfo");
  if (info == nullptr) return CUDA_ERROR_NOT_SUPPORTED;
  return info(free, total) == 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult cuGetErrorName(CUresult error, const char** text) {
  SIMCUDA_DRIVER_ENTER();
  if (text == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *text = simcuda::NameOf(kDriverErrorNames, error);
  return *text != nullptr ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult cuGetErrorString(CUresult error, const char** text) {
  SIMCUDA_DRIVER_ENTER();
  if (text == nullptr) return CUDA_ERROR_INVALID_VALUE;
  static const simcuda::CodeName kStrings[] = {
      {CUDA_SUCCESS, "no error"},
      {CUDA_ERROR_INVALID_VALUE, "invalid argument"},
      {CUDA_ERROR_OUT_OF_MEMORY, "out of memory"},
      {CUDA_ERROR_NOT_INITIALIZED, "initialization error"},
      {CUDA_ERROR_NO_DEVICE, "no CUDA-capable device is detected"},
      {CUDA_ERROR_INVALID_DEVICE, "invalid device ordinal"},
      {CUDA_ERROR_INVALID_CONTEXT, "invalid device context"},
      {CUDA_ERROR_NOT_FOUND, "named symbol not found"},
      {CUDA_ERROR_NOT_SUPPORTED, "operation not supported"},
      {CUDA_ERROR_UNKNOWN, "unknown error"},
  };
  *text = simcuda::NameOf(kStrings, error);
  if (*text == nullptr) *text = simcuda::NameOf(kDriverErrorNames, error);
  return *text != nullptr ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

#if CUDA_VERSION >= 12090  // the driver's log callbacks are new in CUDA 12.9
// Driver log callbacks (torch registers one to enrich error messages): the
// simulated driver never logs, so registration only hands out a handle.
CUresult cuLogsRegisterCallback(CUlogsCallback callback, void* user_data,
                                CUlogsCallbackHandle* handle) {
  SIMCUDA_DRIVER_ENTER();
  if (callback == nullptr || handle == nullptr) return CUDA_ERROR_INVALID_VALUE;
  static char token;
  *handle = reinterpret_cast<CUlogsCallbackHandle>(&token);
  return CUDA_SUCCESS;
}

CUresult cuLogsUnregisterCallback(CUlogsCallbackHandle handle) {
  SIMCUDA_DRIVER_ENTER();
  return handle == nullptr ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
}
#endif

CUresult cuGetProcAddress_v2(const char* symbol, void** function, int cuda_version,
                             cuuint64_t flags, CUdriverProcAddressQueryResult* status) {
  SIMCUDA_DRIVER_ENTER();
  if (symbol == nullptr || function == nullptr) return CUDA_ERROR_INVALID_VALUE;
  // cuda.h's "#define cuX cuX_vN" names the current version of each call.
  const char* name = symbol;
  for (const simcuda::Alias& alias : kDriverAliases) {
    if (std::strcmp(alias.base, symbol) == 0) {
      name = alias.target;
      break;
    }
  }
  Dl_info self;
  void* handle = nullptr;
  if (dladdr(reinterpret_cast<void*>(&cuGetProcAddress_v2), &self) != 0) {
    handle = dlopen(self.dli_fname, RTLD_NOW | RTLD_NOLOAD);
  }
  *function = handle ? dlsym(handle, name) : nullptr;
  if (handle != nullptr) dlclose(handle);
  if (status != nullptr) {
    *status = *function ? CU_GET_PROC_ADDRESS_SUCCESS : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  }
  return *function ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}

}  // extern "C"
