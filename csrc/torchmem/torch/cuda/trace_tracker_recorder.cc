#include "torchmem/torch/cuda/trace_tracker_recorder.h"

#include <mutex>

#include <c10/cuda/CUDACachingAllocator.h>

namespace torchmem::torch_glue {
namespace {

namespace cca = c10::cuda::CUDACachingAllocator;

struct Recorded {
  std::mutex mutex;
  std::vector<TrackedTraceEntry> entries;
};

Recorded& Recording() {
  static auto* recorded = new Recorded;  // leaked: trackers live as long as the allocator
  return *recorded;
}

const char* ActionName(cca::TraceEntry::Action action) {
  switch (action) {
    case cca::TraceEntry::ALLOC:
      return "alloc";
    case cca::TraceEntry::FREE_REQUESTED:
      return "free_requested";
    case cca::TraceEntry::FREE_COMPLETED:
      return "free_completed";
    case cca::TraceEntry::SEGMENT_ALLOC:
      return "segment_alloc";
    case cca::TraceEntry::SEGMENT_FREE:
      return "segment_free";
    case cca::TraceEntry::SEGMENT_MAP:
      return "segment_map";
    case cca::TraceEntry::SEGMENT_UNMAP:
      return "segment_unmap";
    case cca::TraceEntry::OOM:
      return "oom";
    case cca::TraceEntry::SNAPSHOT:
      return "snapshot";
    default:
      return "other";
  }
}

}  // namespace

void AttachRecordingTraceTracker() {
  static std::once_flag once;
  std::call_once(once, [] {
    cca::attachAllocatorTraceTracker([](const cca::TraceEntry& entry) {
      Recorded& recorded = Recording();
      std::lock_guard<std::mutex> lock(recorded.mutex);
      recorded.entries.push_back(TrackedTraceEntry{ActionName(entry.action_), entry.device_,
                                                   static_cast<std::uintptr_t>(entry.addr_),
                                                   entry.size_});
    });
  });
}

std::vector<TrackedTraceEntry> RecordedTraceEntries() {
  Recorded& recorded = Recording();
  std::lock_guard<std::mutex> lock(recorded.mutex);
  return recorded.entries;
}

}  // namespace torchmem::torch_glue
