// PyTorch's FreeCudaMemoryCallbacksRegistry (c10/cuda/CUDACachingAllocator.h):
// callbacks PyTorch's allocator runs when no cached block serves a request,
// before it calls cudaMalloc (trigger_free_memory_callbacks), then looks
// again if one says it freed memory. torch registers "cuda_ipc_collect"
// (torch/csrc/CudaIPCTypes.cpp): it frees the blocks sent to other processes
// that every consumer has released, which otherwise stay allocated until
// torch.cuda.ipc_collect() or the next send. Present in every torch torchmem
// supports (2.9-2.15).
#ifndef TORCHMEM_TORCH_CUDA_FREE_MEMORY_CALLBACKS_H_
#define TORCHMEM_TORCH_CUDA_FREE_MEMORY_CALLBACKS_H_

namespace torchmem::torch_glue {

// Runs every registered callback; whether any freed memory. The CUDA
// engines' cache-miss hook (Engine::SetCacheMissHook): called without an
// engine lock, since the callbacks free tensors through the allocator.
bool RunFreeCudaMemoryCallbacks();

}  // namespace torchmem::torch_glue

#endif  // TORCHMEM_TORCH_CUDA_FREE_MEMORY_CALLBACKS_H_
