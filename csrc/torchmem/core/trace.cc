#include "torchmem/core/trace.h"

#include <chrono>

namespace torchmem {

const char* TraceActionName(TraceAction action) {
  switch (action) {
    case TraceAction::kAlloc:
      return "alloc";
    case TraceAction::kFreeRequested:
      return "free_requested";
    case TraceAction::kFreeCompleted:
      return "free_completed";
    case TraceAction::kSegmentAlloc:
      return "segment_alloc";
    case TraceAction::kSegmentFree:
      return "segment_free";
    case TraceAction::kOom:
      return "oom";
  }
  return "?";
}

TraceRing::TraceRing(std::size_t capacity) : entries_(capacity == 0 ? 1 : capacity) {}

void TraceRing::Record(TraceAction action, std::uintptr_t address, std::size_t size,
                       StreamId stream, ContextId context) {
  TraceEntry& entry = entries_[recorded_ % entries_.size()];
  entry.action = action;
  entry.address = address;
  entry.size = size;
  entry.stream = stream;
  entry.context = context;
  entry.time_us = std::chrono::duration_cast<std::chrono::microseconds>(
                      std::chrono::system_clock::now().time_since_epoch())
                      .count();
  ++recorded_;
}

std::vector<TraceEntry> TraceRing::Entries() const {
  std::vector<TraceEntry> out;
  const std::size_t size = entries_.size();
  const std::size_t count = recorded_ < size ? recorded_ : size;
  out.reserve(count);
  for (std::uint64_t i = recorded_ - count; i < recorded_; ++i) out.push_back(entries_[i % size]);
  return out;
}

}  // namespace torchmem
