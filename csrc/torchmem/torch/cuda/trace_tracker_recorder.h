// For tests: a trace tracker attached through PyTorch's own API
// (c10::cuda::CUDACachingAllocator::attachAllocatorTraceTracker, what
// ProcessGroupNCCL uses to register segments with its communicators), which
// records what PyTorch's current CUDA allocator tells its trackers.
#ifndef TORCHMEM_TORCH_CUDA_TRACE_TRACKER_RECORDER_H_
#define TORCHMEM_TORCH_CUDA_TRACE_TRACKER_RECORDER_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace torchmem::torch_glue {

struct TrackedTraceEntry {
  std::string action;  // PyTorch's name: "segment_map", "alloc", ...
  int device = 0;
  std::uintptr_t address = 0;
  std::size_t size = 0;
};

// Attaches the recording tracker once per process (trackers cannot be detached).
void AttachRecordingTraceTracker();
// What it recorded so far.
std::vector<TrackedTraceEntry> RecordedTraceEntries();

}  // namespace torchmem::torch_glue

#endif  // TORCHMEM_TORCH_CUDA_TRACE_TRACKER_RECORDER_H_
