// The segments of a torch.cuda.MemPool(allocator=...) come from that
// allocator's raw_alloc / raw_delete, as in PyTorch's allocator (its
// allocPrimitive for a pool with an allocator), while torchmem's engine
// places, caches and accounts the blocks in them.
#ifndef TORCHMEM_TORCH_CUDA_POOL_ALLOCATOR_SOURCE_H_
#define TORCHMEM_TORCH_CUDA_POOL_ALLOCATOR_SOURCE_H_

#include <memory>

#include <c10/cuda/CUDACachingAllocator.h>

#include "torchmem/core/segment_source.h"

namespace torchmem::torch_glue {

// `allocator` is the pool's own (never torchmem's: that would take the
// engine's lock again from under it); `device` the pool's. Its segments are
// registered as `device`'s (cuda_address_registry.h) while the engine holds
// them, so that frees find the engine.
std::shared_ptr<SegmentSource> MakePoolAllocatorSource(
    std::shared_ptr<c10::cuda::CUDACachingAllocator::CUDAAllocator> allocator, int device);

}  // namespace torchmem::torch_glue

#endif  // TORCHMEM_TORCH_CUDA_POOL_ALLOCATOR_SOURCE_H_
