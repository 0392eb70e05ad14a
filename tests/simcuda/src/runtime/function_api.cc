// Queries and settings of kernels (functions): attributes, names, occupancy.
// The simulated device reports plausible fixed figures and accepts settings.
#include <cstring>

#include "runtime/api_entry.h"
#include "runtime/registration.h"

using simcuda::rt::Result;

namespace {

// Resident blocks per multiprocessor: 2048 threads, at most 32 blocks.
cudaError_t BlocksPerMultiprocessor(int* blocks, const void* func, int block_size) {
  if (blocks == nullptr || func == nullptr || block_size <= 0) return cudaErrorInvalidValue;
  const int by_threads = 2048 / block_size;
  *blocks = by_threads < 1 ? 1 : (by_threads > 32 ? 32 : by_threads);
  return cudaSuccess;
}

}  // namespace

extern "C" {

cudaError_t cudaFuncGetAttributes(cudaFuncAttributes* attr, const void* func) {
  SIMCUDA_ENTER();
  if (attr == nullptr || func == nullptr) return Result(cudaErrorInvalidValue);
  std::memset(attr, 0, sizeof(*attr));
  attr->maxThreadsPerBlock = 1024;
  attr->numRegs = 32;
  attr->ptxVersion = 90;
  attr->binaryVersion = 90;
  attr->maxDynamicSharedSizeBytes = 48 << 10;
  attr->preferredShmemCarveout = -1;
  return cudaSuccess;
}

cudaError_t cudaFuncSetAttribute(const void* func, cudaFuncAttribute attr, int value) {
  SIMCUDA_ENTER();
  return Result(func == nullptr ? cudaErrorInvalidDeviceFunction : cudaSuccess);
}

cudaError_t cudaFuncSetCacheConfig(const void* func, cudaFuncCache config) {
  SIMCUDA_ENTER();
  return Result(func == nullptr ? cudaErrorInvalidDeviceFunction : cudaSuccess);
}

cudaError_t cudaFuncGetName(const char** name, const void* func) {
  SIMCUDA_ENTER();
  if (name == nullptr || func == nullptr) return Result(cudaErrorInvalidValue);
  CUkern_st* kernel = simcuda::rt::KernelFor(func);
  *name = kernel->name != nullptr ? kernel->name : "simcuda_unregistered_kernel";
  return cudaSuccess;
}

cudaError_t cudaGetKernel(cudaKernel_t* kernel, const void* entry) {
  SIMCUDA_ENTER();
  if (kernel == nullptr || entry == nullptr) return Result(cudaErrorInvalidValue);
  *kernel = simcuda::rt::KernelFor(entry);
  return cudaSuccess;
}

cudaError_t cudaKernelSetAttributeForDevice(cudaKernel_t kernel, cudaFuncAttribute attr, int value,
                                            int device) {
  SIMCUDA_ENTER();
  return Result(kernel == nullptr ? cudaErrorInvalidValue : cudaSuccess);
}

cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int* blocks, const void* func,
                                                          int block_size,
                                                          size_t dynamic_shared_memory) {
  SIMCUDA_ENTER();
  return Result(BlocksPerMultiprocessor(blocks, func, block_size));
}

cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(int* blocks, const void* func,
                                                                   int block_size,
                                                                   size_t dynamic_shared_memory,
                                                                   unsigned int flags) {
  SIMCUDA_ENTER();
  return Result(BlocksPerMultiprocessor(blocks, func, block_size));
}

}  // extern "C"
