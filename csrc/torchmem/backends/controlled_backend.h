// ControlledBackend: a backend that tests, fuzzers and replays steer.
//
//   - Events complete only when told: CompleteStream / CompleteAll, or
//     SynchronizeEvent (which, like cudaEventSynchronize, waits: it completes
//     the stream up to that event). SetAutoComplete(true) makes them
//     complete at once.
//   - Segment allocation can be forbidden with a reason (as during CUDA
//     graph capture).
//   - By default segments are address ranges only (no memory behind them,
//     never dereferenced by the engine), so a replay can "allocate" 60 GiB on
//     a laptop; with `real_memory` they are real host memory.
//   - Failures other than a full device are not its business: wrap it in a
//     FaultInjectingBackend to make any call fail.
// Invariants: live segments never overlap; their total never exceeds the
// capacity set when they were obtained; fake addresses are never reused.
// Thread-safe: the controls may be called while an engine uses the backend.
#ifndef TORCHMEM_BACKENDS_CONTROLLED_BACKEND_H_
#define TORCHMEM_BACKENDS_CONTROLLED_BACKEND_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "torchmem/core/mutex.h"
#include "torchmem/core/backend.h"

namespace torchmem {

struct ControlledBackendOptions {
  std::string device_name = "test:0";
  std::size_t capacity_bytes = std::size_t{64} << 30;
  bool real_memory = false;
  bool auto_complete_events = false;
  // Fake segments at decreasing addresses, as mmap (and so the simulated CUDA
  // device) hands them out; by default at increasing addresses.
  bool top_down_addresses = false;
};

class ControlledBackend final : public Backend {
 public:
  explicit ControlledBackend(ControlledBackendOptions options = {});
  ~ControlledBackend() override;

  // --- controls -------------------------------------------------------------
  void CompleteStream(StreamId stream);
  void CompleteAll();
  void SetAutoComplete(bool auto_complete);
  void SetCapacity(std::size_t bytes);
  // Non-empty: AllocateSegment is refused with FailedPrecondition(reason).
  void ForbidSegmentAllocation(std::string reason);

  // --- observations ---------------------------------------------------------
  std::size_t live_segment_bytes() const;
  std::int64_t live_segments() const;
  std::int64_t live_events() const;

  // --- Backend --------------------------------------------------------------
  std::string DeviceName() const override { return options_.device_name; }
  absl::StatusOr<std::uintptr_t> AllocateSegment(std::size_t size, StreamId stream) override;
  absl::Status ReleaseSegment(std::uintptr_t address, std::size_t size) override;
  absl::StatusOr<std::size_t> Capacity() override;
  absl::Status CheckSegmentAllocationAllowed(StreamId stream) override;
  absl::StatusOr<EventId> RecordEvent(StreamId stream) override;
  absl::StatusOr<bool> QueryEvent(EventId event) override;
  absl::Status SynchronizeEvent(EventId event) override;
  void ReleaseEvent(EventId event) override;

 private:
  struct StreamProgress {
    std::uint64_t recorded = 0;
    std::uint64_t completed = 0;
  };
  struct Event {
    StreamId stream;
    std::uint64_t position;
  };

  ControlledBackendOptions options_;
  mutable Mutex mutex_;
  std::string forbid_reason_ ABSL_GUARDED_BY(mutex_);
  absl::flat_hash_map<std::uintptr_t, std::size_t> segments_ ABSL_GUARDED_BY(mutex_);
  std::size_t live_bytes_ ABSL_GUARDED_BY(mutex_) = 0;
  std::uintptr_t used_address_space_ ABSL_GUARDED_BY(mutex_) = 0;  // fake segments and gaps
  absl::flat_hash_map<StreamId, StreamProgress> streams_ ABSL_GUARDED_BY(mutex_);
  absl::flat_hash_map<EventId, Event> events_ ABSL_GUARDED_BY(mutex_);
  EventId next_event_ ABSL_GUARDED_BY(mutex_) = 1;
};

}  // namespace torchmem

#endif  // TORCHMEM_BACKENDS_CONTROLLED_BACKEND_H_
