// What nvcc-generated code registers with the runtime when a library loads:
// kernels (__cudaRegisterFunction, looked up by __cudaGetKernel and launched
// as no-ops) and __device__ variables (__cudaRegisterVar, backed by host
// memory so cudaMemcpyToSymbol and cudaGetSymbolAddress work).
#ifndef TORCHMEM_TESTS_SIMCUDA_SRC_RUNTIME_REGISTRATION_H_
#define TORCHMEM_TESTS_SIMCUDA_SRC_RUNTIME_REGISTRATION_H_

#include <cuda_runtime_api.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>

// cudaKernel_t points to one of these.
struct CUkern_st {
  const void* host_function = nullptr;
  const char* name = nullptr;  // device-side (mangled) name, if registered
  std::atomic<uint64_t> launches{0};
};

namespace simcuda {
namespace rt {

// The kernel for a host stub address; created on first use, so launches of
// kernels whose registration was skipped still work.
CUkern_st* KernelFor(const void* host_function);
bool IsKernel(const void* handle);

// Backing storage of a registered __device__ / __constant__ variable.
// Returns false if `symbol` was never registered.
bool SymbolStorage(const void* symbol, char** address, size_t* size);

}  // namespace rt
}  // namespace simcuda

#endif  // TORCHMEM_TESTS_SIMCUDA_SRC_RUNTIME_REGISTRATION_H_
