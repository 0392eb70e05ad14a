// ControlledBackend: a backend that tests, fuzzers and replays steer.
//
//   - Events complete only when told: CompleteStream / CompleteAll, or
//     SynchronizeEvent (which, like cudaEventSynchronize, waits: it completes
//     the stream up to that event). SetAutoComplete(true) makes them
//     complete at once.
//   - Any call can be made to fail, once or repeatedly (FailNext), to test
//     that the engine reports the error and stays intact.
//   - Segment allocation can be forbidden with a reason (as during CUDA
//     graph capture).
//   - By default segments are address ranges only (no memory behind them,
//     never dereferenced by the engine), so a replay can "allocate" 60 GiB on
//     a laptop; with `real_memory` they are real host memory.
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
};

class ControlledBackend final : public Backend {
 public:
  enum class Call { kAllocateSegment, kReleaseSegment, kCapacity, kRecordEvent, kQueryEvent,
                    kSynchronizeEvent, kNumCalls };

  explicit ControlledBackend(ControlledBackendOptions options = {});
  ~ControlledBackend() override;

  // --- controls -------------------------------------------------------------
  // The next `count` calls of `call` fail with `code` (after `skip` successes).
  void FailNext(Call call, int count = 1, absl::StatusCode code = absl::StatusCode::kInternal,
                int skip = 0);
  void ClearFailures();
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
  std::int64_t calls(Call call) const;
  std::int64_t failures_injected() const;

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
  struct Failure {
    int skip = 0;
    int count = 0;
    absl::StatusCode code = absl::StatusCode::kOk;
  };
  struct StreamProgress {
    std::uint64_t recorded = 0;
    std::uint64_t completed = 0;
  };
  struct Event {
    StreamId stream;
    std::uint64_t position;
  };

  // Counts the call; returns the injected error, if any.
  absl::Status Enter(Call call) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);

  ControlledBackendOptions options_;
  mutable Mutex mutex_;
  Failure failures_[static_cast<int>(Call::kNumCalls)] ABSL_GUARDED_BY(mutex_);
  std::int64_t calls_[static_cast<int>(Call::kNumCalls)] ABSL_GUARDED_BY(mutex_) = {};
  std::int64_t failures_injected_ ABSL_GUARDED_BY(mutex_) = 0;
  std::string forbid_reason_ ABSL_GUARDED_BY(mutex_);
  absl::flat_hash_map<std::uintptr_t, std::size_t> segments_ ABSL_GUARDED_BY(mutex_);
  std::size_t live_bytes_ ABSL_GUARDED_BY(mutex_) = 0;
  std::uintptr_t next_address_ ABSL_GUARDED_BY(mutex_) = std::uintptr_t{1} << 44;
  absl::flat_hash_map<StreamId, StreamProgress> streams_ ABSL_GUARDED_BY(mutex_);
  absl::flat_hash_map<EventId, Event> events_ ABSL_GUARDED_BY(mutex_);
  EventId next_event_ ABSL_GUARDED_BY(mutex_) = 1;
};

}  // namespace torchmem

#endif  // TORCHMEM_BACKENDS_CONTROLLED_BACKEND_H_
