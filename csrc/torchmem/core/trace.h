// TraceRing: an optional, bounded history of what an engine did, in the
// vocabulary of PyTorch's memory snapshots (device_traces), so that
// torch.cuda._memory_viz can draw torchmem's timeline.
//
// Off by default (the engine holds no ring); when on, recording an event is
// a few stores into a preallocated ring under the engine's lock. When full,
// the oldest entries are overwritten, as in PyTorch.
#ifndef TORCHMEM_CORE_TRACE_H_
#define TORCHMEM_CORE_TRACE_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "torchmem/core/types.h"

namespace torchmem {

enum class TraceAction : std::uint8_t {
  kAlloc,          // a block was handed out; size = requested size
  kFreeRequested,  // the caller freed it (it may still wait on other streams)
  kFreeCompleted,  // it became reusable
  kSegmentAlloc,   // a segment was obtained from the backend
  kSegmentFree,    // a segment was returned to the backend
  kOom,            // an allocation failed; address = bytes free in the cache then
};

const char* TraceActionName(TraceAction action);

struct TraceEntry {
  TraceAction action = TraceAction::kAlloc;
  std::uintptr_t address = 0;
  std::size_t size = 0;
  StreamId stream = 0;
  ContextId context = kNoContext;
  std::int64_t time_us = 0;  // wall clock, microseconds since the epoch
};

class TraceRing {
 public:
  explicit TraceRing(std::size_t capacity);

  void Record(TraceAction action, std::uintptr_t address, std::size_t size, StreamId stream,
              ContextId context);
  // Oldest first.
  std::vector<TraceEntry> Entries() const;
  std::size_t capacity() const { return entries_.size(); }
  std::uint64_t recorded() const { return recorded_; }

 private:
  std::vector<TraceEntry> entries_;
  std::uint64_t recorded_ = 0;  // total ever recorded; next slot = recorded_ % capacity
};

}  // namespace torchmem

#endif  // TORCHMEM_CORE_TRACE_H_
