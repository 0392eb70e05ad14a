// torchmem as PyTorch's CUDA allocator, through CUDAPluggableAllocator.
//
// PyTorch's torch.cuda.memory.CUDAPluggableAllocator looks up two C symbols
// in a shared library and calls them for every CUDA allocation; this module
// exports them from torchmem._C itself, so the engine PyTorch calls is the
// engine Python queries. The optional hooks map PyTorch's calls onto the
// engine: reset -> empty_cache, memory fraction -> limit, record_stream ->
// cross-stream reuse, base allocation -> segment lookup.
//
// One engine per device, created on first use and never destroyed (blocks
// can be freed during static destruction).
#ifndef TORCHMEM_TORCH_CUDA_ALLOCATOR_H_
#define TORCHMEM_TORCH_CUDA_ALLOCATOR_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <utility>
#include <vector>

#include "torchmem/core/engine.h"

#define TORCHMEM_EXPORT extern "C" __attribute__((visibility("default")))

// The entry points, with the exact types CUDAPluggableAllocator calls
// (checked at compile time against the installed torch headers).
TORCHMEM_EXPORT void* torchmem_cuda_malloc(std::size_t size, int device, cudaStream_t stream);
TORCHMEM_EXPORT void torchmem_cuda_free(void* ptr, std::size_t size, int device,
                                        cudaStream_t stream);
TORCHMEM_EXPORT void torchmem_cuda_init(int device_count);
TORCHMEM_EXPORT void torchmem_cuda_reset();
TORCHMEM_EXPORT void torchmem_cuda_set_memory_fraction(double fraction, int device);
TORCHMEM_EXPORT void torchmem_cuda_record_stream(void* ptr, cudaStream_t stream);
TORCHMEM_EXPORT void* torchmem_cuda_base_allocation(void* ptr, std::size_t* size);

namespace torchmem::torch_glue {

// Devices torchmem can serve (cudaGetDeviceCount at first use, capped).
inline constexpr int kMaxCudaDevices = 64;

// The engine of `device`; created on first use.
Engine& CudaEngine(int device);
// (device, engine) for every CUDA engine created so far.
std::vector<std::pair<int, Engine*>> CudaEngines();

}  // namespace torchmem::torch_glue

#endif  // TORCHMEM_TORCH_CUDA_ALLOCATOR_H_
