// torchmem as PyTorch's complete CUDA allocator: a
// c10::cuda::CUDACachingAllocator::CUDAAllocator over torchmem's engines.
//
// Installed with torch.cuda.memory.change_current_allocator(
// torchmem.cuda_allocator()) (what torchmem.install() does), it serves every
// CUDA allocation PyTorch makes and every question PyTorch asks its
// allocator, so PyTorch's own APIs report torchmem's truth:
//   - statistics (torch.cuda.memory_stats and friends, memory_summary),
//     resets, cacheInfo (cuDNN benchmark), memory fraction, base
//     allocations, record_stream, empty_cache, memcpyAsync, peer access;
//   - snapshots and history (torch.cuda.memory._snapshot,
//     _record_memory_history, _dump_snapshot) with torchmem's Python stacks
//     handed to PyTorch as its own stack contexts (traceback_contexts.h);
//   - CUDA graphs and MemPools: private pools keyed by MempoolId, routed by
//     PyTorch's filters, capture rules, use counts, checkpoints (cudagraph
//     trees), live-allocation checks;
//   - out-of-memory: torch.OutOfMemoryError whose message starts like
//     PyTorch's ("CUDA out of memory. Tried to allocate ...") and goes on
//     with torchmem's diagnosis; out-of-memory observers; trace trackers;
//   - IPC of CUDA tensors between processes (ipc.h);
//   - PYTORCH_CUDA_ALLOC_CONF, read from PyTorch's parser (alloc_config.h).
//
// name() is "native": PyTorch's tests and other libraries compare
// torch.cuda.get_allocator_backend() against "native" to mean "the caching
// allocator, with statistics, snapshots, graph pools and 512-byte rounding",
// all of which torchmem provides with PyTorch's semantics (anything else,
// e.g. "cudaMallocAsync", makes PyTorch's own tests and libraries skip those
// features). torchmem.is_installed("cuda") tells the two apart.
//
// change_current_allocator only swaps the pointer behind
// c10::cuda::CUDACachingAllocator::get(); init() (PyTorch's lazy CUDA
// initialisation) also registers the allocator as c10's allocator for
// kCUDA, so c10::GetAllocator(kCUDA), c10::getDeviceAllocator(kCUDA) and
// torch.accelerator's memory APIs reach torchmem too.
//
// One instance per process, never destroyed (tensors keep its deleter).
#ifndef TORCHMEM_TORCH_CUDA_CUDA_ALLOCATOR_H_
#define TORCHMEM_TORCH_CUDA_CUDA_ALLOCATOR_H_

#include <memory>

#include "torchmem/torch/cuda/allocator_interface.h"

namespace torchmem::torch_glue {

// The process's allocator (created on first use).
std::shared_ptr<cca::CUDAAllocator> TorchmemCudaAllocator();

// Whether PyTorch's current CUDA allocator is torchmem's.
bool TorchmemCudaAllocatorInstalled();

}  // namespace torchmem::torch_glue

#endif  // TORCHMEM_TORCH_CUDA_CUDA_ALLOCATOR_H_
