// The reduced route: torchmem through torch.cuda.memory.CUDAPluggableAllocator.
//
// CUDAPluggableAllocator looks up two C symbols in a shared library and calls
// them for every CUDA allocation; torchmem._C_cuda exports them (plus the
// optional hooks: reset -> empty_cache, memory fraction -> limit,
// record_stream -> cross-stream reuse, base allocation -> segment lookup),
// over the same engines as the full allocator. It is "reduced" because
// PyTorch's pluggable class implements nothing else: torch.cuda.memory_stats,
// snapshots, history, cuDNN benchmark, CUDA graphs' private pools and IPC
// raise or silently misbehave under it. Use torchmem.cuda_allocator()
// instead; this route exists for code that builds a CUDAPluggableAllocator
// itself:
//   torch.cuda.memory.CUDAPluggableAllocator(torchmem._C_cuda.__file__,
//       "torchmem_cuda_malloc", "torchmem_cuda_free")
#ifndef TORCHMEM_TORCH_CUDA_PLUGGABLE_ENTRY_POINTS_H_
#define TORCHMEM_TORCH_CUDA_PLUGGABLE_ENTRY_POINTS_H_

#include <cuda_runtime_api.h>

#include <cstddef>

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

#endif  // TORCHMEM_TORCH_CUDA_PLUGGABLE_ENTRY_POINTS_H_
