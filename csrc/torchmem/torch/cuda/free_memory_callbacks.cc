#include "torchmem/torch/cuda/free_memory_callbacks.h"

#include <memory>
#include <string>

#include <c10/cuda/CUDACachingAllocator.h>

namespace torchmem::torch_glue {

bool RunFreeCudaMemoryCallbacks() {
  // As PyTorch's trigger_free_memory_callbacks: every callback runs, each a
  // fresh object from the registry.
  bool freed = false;
  for (const std::string& name : c10::FreeCudaMemoryCallbacksRegistry()->Keys()) {
    std::unique_ptr<c10::FreeMemoryCallback> callback =
        c10::FreeCudaMemoryCallbacksRegistry()->Create(name);
    if (callback != nullptr) freed |= callback->Execute();
  }
  return freed;
}

}  // namespace torchmem::torch_glue
