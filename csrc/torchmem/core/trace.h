// TraceRing: an optional, bounded history of what an engine did, in the
// vocabulary of PyTorch's memory snapshots (device_traces), so that
// torch.cuda._memory_viz can draw torchmem's timeline.
//
// Off by default (the engine holds no ring); when on, recording an event is
// a few stores into the ring under the engine's lock. The ring grows as
// entries arrive up to its capacity (PyTorch's default capacity is
// "unbounded", sys.maxsize), then overwrites the oldest, as PyTorch's does.
#ifndef TORCHMEM_CORE_TRACE_H_
#define TORCHMEM_CORE_TRACE_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "torchmem/core/trace_labels.h"
#include "torchmem/core/types.h"

namespace torchmem {

enum class TraceAction : std::uint8_t {
  kAlloc,          // a block was handed out; size = requested size
  kFreeRequested,  // the caller freed it (it may still wait on other streams)
  kFreeCompleted,  // it became reusable
  kSegmentAlloc,   // a segment was obtained from the backend
  kSegmentFree,    // a segment was returned to the backend
  kOom,            // an allocation failed; address = bytes free on the device then
  kSnapshot,       // a snapshot was taken; size = active bytes then
  kAnnotate,       // a label was attached to a live block (user_metadata = the text)
  kSegmentMap,     // pages of a virtual-memory range were mapped (address, bytes)
  kSegmentUnmap,   // pages of a virtual-memory range were unmapped (address, bytes)
};
inline constexpr int kNumTraceActions = 10;

const char* TraceActionName(TraceAction action);
// The action of a PyTorch action name ("alloc", "segment_free", ...); false
// for names torchmem does not record.
bool ParseTraceAction(const char* name, TraceAction* out);

struct TraceEntry {
  TraceAction action = TraceAction::kAlloc;
  std::uintptr_t address = 0;
  std::size_t size = 0;
  StreamId stream = 0;
  ContextId context = kNoContext;
  PoolId pool;                                 // the private pool involved; default pool: {0, 0}
  std::int64_t time_us = 0;                    // wall clock, microseconds since the epoch
  TraceLabel user_metadata = kNoTraceLabel;    // see trace_labels.h
  TraceLabel compile_context = kNoTraceLabel;  // of the thread that caused it
};

class TraceRing {
 public:
  explicit TraceRing(std::size_t capacity);

  void Record(const TraceEntry& entry);
  // Oldest first.
  std::vector<TraceEntry> Entries() const;
  std::size_t capacity() const { return capacity_; }
  std::uint64_t recorded() const { return recorded_; }

 private:
  std::size_t capacity_;
  std::vector<TraceEntry> entries_;  // grows to capacity_, then wraps
  std::uint64_t recorded_ = 0;       // total ever recorded; next slot = recorded_ % capacity
};

// Wall-clock microseconds, as TraceEntry::time_us.
std::int64_t TraceNowMicros();

}  // namespace torchmem

#endif  // TORCHMEM_CORE_TRACE_H_
