#include "torchmem/core/trace.h"

#include <chrono>
#include <cstring>

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
    case TraceAction::kSnapshot:
      return "snapshot";
    case TraceAction::kAnnotate:
      return "annotate";
    case TraceAction::kSegmentMap:
      return "segment_map";
    case TraceAction::kSegmentUnmap:
      return "segment_unmap";
  }
  return "?";
}

bool ParseTraceAction(const char* name, TraceAction* out) {
  for (int i = 0; i < kNumTraceActions; ++i) {
    const auto action = static_cast<TraceAction>(i);
    if (std::strcmp(name, TraceActionName(action)) == 0) {
      *out = action;
      return true;
    }
  }
  return false;
}

std::int64_t TraceNowMicros() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

TraceRing::TraceRing(std::size_t capacity) : capacity_(capacity == 0 ? 1 : capacity) {}

void TraceRing::Record(const TraceEntry& entry) {
  if (entries_.size() < capacity_) {
    entries_.push_back(entry);
  } else {
    entries_[recorded_ % capacity_] = entry;
  }
  ++recorded_;
}

std::vector<TraceEntry> TraceRing::Entries() const {
  if (recorded_ <= capacity_) return entries_;
  std::vector<TraceEntry> out;
  out.reserve(entries_.size());
  const std::size_t next = recorded_ % capacity_;  // the oldest entry
  out.insert(out.end(), entries_.begin() + static_cast<std::ptrdiff_t>(next), entries_.end());
  out.insert(out.end(), entries_.begin(), entries_.begin() + static_cast<std::ptrdiff_t>(next));
  return out;
}

}  // namespace torchmem
