// cudaGetDriverEntryPoint[ByVersion]: hands out the fake driver's functions
// (libcuda.so.1 from the same directory as this library, or the one already
// loaded if it is the fake), resolved by the driver's own cuGetProcAddress so
// versioned names (cuMemGetInfo -> cuMemGetInfo_v2) follow cuda.h.
#include <dlfcn.h>

#include <string>

#include "runtime/api_entry.h"
#include "runtime/driver_link.h"

using simcuda::rt::Result;

namespace simcuda {
namespace rt {
namespace {

bool IsFakeDriver(void* handle) {
  return handle != nullptr && dlsym(handle, "simcuda_driver_call_count") != nullptr;
}

void* OpenDriver() {
  void* handle = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  if (IsFakeDriver(handle)) return handle;
  Dl_info info;
  if (dladdr(reinterpret_cast<void*>(&OpenDriver), &info) == 0 || info.dli_fname == nullptr) {
    return nullptr;
  }
  std::string path(info.dli_fname);
  path = path.substr(0, path.rfind('/') + 1) + "libcuda.so.1";
  handle = dlopen(path.c_str(), RTLD_NOW | RTLD_GLOBAL);
  return IsFakeDriver(handle) ? handle : nullptr;
}

using GetProcAddress = int (*)(const char*, void**, int, unsigned long long, int*);

cudaError_t EntryPoint(const char* symbol, void** function, int version, unsigned long long flags,
                       cudaDriverEntryPointQueryResult* status) {
  if (symbol == nullptr || function == nullptr) return cudaErrorInvalidValue;
  *function = nullptr;
  if (status != nullptr) *status = cudaDriverEntryPointSymbolNotFound;
  void* driver = DriverLibrary();
  auto get =
      driver ? reinterpret_cast<GetProcAddress>(dlsym(driver, "cuGetProcAddress_v2")) : nullptr;
  if (get == nullptr) return cudaSuccess;
  int driver_status = 0;
  if (get(symbol, function, version, flags, &driver_status) == 0 && *function != nullptr) {
    if (status != nullptr) *status = cudaDriverEntryPointSuccess;
  }
  return cudaSuccess;
}

}  // namespace

void* DriverLibrary() {
  static void* handle = OpenDriver();
  return handle;
}

}  // namespace rt
}  // namespace simcuda

extern "C" {

cudaError_t cudaGetDriverEntryPoint(const char* symbol, void** function, unsigned long long flags,
                                    cudaDriverEntryPointQueryResult* status) {
  SIMCUDA_ENTER();
  return Result(simcuda::rt::EntryPoint(symbol, function, CUDART_VERSION, flags, status));
}

cudaError_t cudaGetDriverEntryPointByVersion(const char* symbol, void** function,
                                             unsigned int version, unsigned long long flags,
                                             cudaDriverEntryPointQueryResult* status) {
  SIMCUDA_ENTER();
  return Result(
      simcuda::rt::EntryPoint(symbol, function, static_cast<int>(version), flags, status));
}

}  // extern "C"
