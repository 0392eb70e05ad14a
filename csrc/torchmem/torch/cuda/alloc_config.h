// PYTORCH_CUDA_ALLOC_CONF / PYTORCH_ALLOC_CONF for torchmem's CUDA engines.
//
// c10 parses the allocator settings (at startup from the environment, later
// from torch.cuda.memory._set_allocator_settings); torchmem reads PyTorch's
// parsed values rather than parsing them again, so it honours exactly what
// PyTorch's own allocator would:
//   max_split_size_mb, max_non_split_rounding_mb, roundup_power2_divisions,
//   large_segment_size_mb       -> the engines' SizePolicy
//   garbage_collection_threshold -> the engines' collection threshold
//   per_process_memory_fraction  -> each device's initial memory fraction
//   expandable_segments          -> the engines' placement: True selects the
//                                   virtual-memory placement (segments that
//                                   grow in place, pages mapped where live
//                                   blocks need them); False (PyTorch's
//                                   default, and torchmem's) PyTorch's
//                                   placement
// Keys that configure PyTorch's pinned host allocator (pinned_*) keep
// working through PyTorch and need nothing here. Every other key set to a
// value that would change behaviour, and that torchmem does not implement
// (release_lock_on_cudamalloc,
// graph_capture_record_stream_reuse, throw_on_cudamalloc_oom,
// backend:cudaMallocAsync, keys newer than torchmem), gets one warning that
// names it and says what happens instead. PYTORCH_NO_CUDA_MEMORY_CACHING is
// honoured as PyTorch does (allocations bypass the cache) with a warning,
// since they then bypass torchmem too.
#ifndef TORCHMEM_TORCH_CUDA_ALLOC_CONFIG_H_
#define TORCHMEM_TORCH_CUDA_ALLOC_CONFIG_H_

#include <functional>
#include <string>
#include <vector>

#include "torchmem/core/size_policy.h"

namespace torchmem::torch_glue {

struct CudaAllocSettings {
  SizePolicy policy;
  double garbage_collection_threshold = 0.0;
  double per_process_memory_fraction = 1.0;
  // expandable_segments:True: the virtual-memory placement.
  bool expandable_segments = false;
  // PYTORCH_NO_CUDA_MEMORY_CACHING is set: allocate with cudaMalloc directly.
  bool caching_disabled = false;
};

// PyTorch's parsed settings now. Warns (once per key and value) about the
// keys torchmem does not implement; returns what torchmem applies.
CudaAllocSettings ReadCudaAllocSettings();

// The keys of the current settings string that torchmem does not implement
// and that are set to a value other than their default, with why (one line
// each). Exposed for tests.
std::vector<std::string> UnimplementedSettings();

// Calls `listener` after PyTorch parses new settings
// (torch.cuda.memory._set_allocator_settings), by chaining c10's device
// config parser hook. Idempotent; the listener lives for the process.
// False where torch has no such hook (before 2.11): there torchmem reads the
// settings once, when it is installed.
bool ListenForSettingsChanges(std::function<void()> listener);

}  // namespace torchmem::torch_glue

#endif  // TORCHMEM_TORCH_CUDA_ALLOC_CONFIG_H_
