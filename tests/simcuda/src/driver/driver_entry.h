// Entry helpers of the fake CUDA driver (libcuda.so.1): the call counter and
// fault check on entry, the body of generated "unsupported" stubs, and access
// to the fake runtime, which owns the device configuration.
#ifndef TORCHMEM_TESTS_SIMCUDA_SRC_DRIVER_DRIVER_ENTRY_H_
#define TORCHMEM_TESTS_SIMCUDA_SRC_DRIVER_DRIVER_ENTRY_H_

#include <cuda.h>

#include "common/call_registry.h"

namespace simcuda {
namespace drv {

// Notice on stderr once, CUDA_ERROR_NOT_SUPPORTED.
CUresult Unsupported(CallSite* site);

// A function of the fake runtime found in the global scope (nullptr if the
// process has no fake runtime there, e.g. the driver was loaded alone).
void* RuntimeFunction(const char* name);

template <typename Fn>
Fn Runtime(const char* name) {
  return reinterpret_cast<Fn>(RuntimeFunction(name));
}

// Devices as the fake runtime configures them (SIMCUDA_DEVICE_COUNT alone).
int DeviceCount();
bool ValidDevice(CUdevice device);

}  // namespace drv
}  // namespace simcuda

#define SIMCUDA_DRIVER_ENTER_NAMED(name)                                          \
  static ::simcuda::CallSite* const simcuda_site = ::simcuda::RegisterCall(name); \
  if (const int simcuda_fault = simcuda_site->Hit()) return static_cast<CUresult>(simcuda_fault)

#define SIMCUDA_DRIVER_ENTER() SIMCUDA_DRIVER_ENTER_NAMED(__func__)

#endif  // TORCHMEM_TESTS_SIMCUDA_SRC_DRIVER_DRIVER_ENTRY_H_
