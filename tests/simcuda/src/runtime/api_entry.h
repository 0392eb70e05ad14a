// Entry and exit helpers every simulated runtime call goes through: the call
// counter and fault check on entry, CUDA's per-thread "last error" on exit.
//
// Usage inside an extern "C" API function returning cudaError_t:
//   SIMCUDA_ENTER();                 // counts, may return an injected fault
//   ...
//   return simcuda::rt::Result(err); // records a failure as the last error
#ifndef TORCHMEM_TESTS_SIMCUDA_SRC_RUNTIME_API_ENTRY_H_
#define TORCHMEM_TESTS_SIMCUDA_SRC_RUNTIME_API_ENTRY_H_

#include <cuda_runtime_api.h>

#include "common/call_registry.h"

namespace simcuda {
namespace rt {

// Records `error` as the calling thread's last error (cudaErrorNotReady is a
// status, not an error, and is not recorded) and returns it.
cudaError_t Fail(cudaError_t error);

inline cudaError_t Result(cudaError_t error) { return error == cudaSuccess ? error : Fail(error); }

// Body of every generated stub: notice on stderr once, cudaErrorNotSupported.
cudaError_t Unsupported(CallSite* site);

// Error code for a name such as "cudaErrorMemoryAllocation", -1 if unknown.
int RuntimeErrorByName(const std::string& name);

// The calling thread's current device (cudaSetDevice / cudaGetDevice).
int CurrentDevice();
void SetCurrentDevice(int device);

// The calling thread's capture interaction mode
// (cudaThreadExchangeStreamCaptureMode).
cudaStreamCaptureMode ThreadCaptureMode();

}  // namespace rt
}  // namespace simcuda

#define SIMCUDA_ENTER_NAMED(name)                                                 \
  static ::simcuda::CallSite* const simcuda_site = ::simcuda::RegisterCall(name); \
  if (const int simcuda_fault = simcuda_site->Hit())                              \
  return ::simcuda::rt::Fail(static_cast<cudaError_t>(simcuda_fault))

#define SIMCUDA_ENTER() SIMCUDA_ENTER_NAMED(__func__)

// For the few entry points that do not return cudaError_t: counted only.
#define SIMCUDA_COUNT()                                                               \
  static ::simcuda::CallSite* const simcuda_site = ::simcuda::RegisterCall(__func__); \
  simcuda_site->count.fetch_add(1, std::memory_order_relaxed)

#endif  // TORCHMEM_TESTS_SIMCUDA_SRC_RUNTIME_API_ENTRY_H_
