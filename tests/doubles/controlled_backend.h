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
//   - Virtual memory like the driver's (page size `vmm_page_size`, 0: none):
//     reserved ranges, pages (any multiple of the page size, as cuMemCreate
//     takes) that count against the capacity as segments do, mappings
//     checked as the driver checks them (aligned, inside a range, not mapped
//     twice, a page mapped at most once and whole, unmapped whole, access
//     before use, nothing left mapped in a released range). With `real_memory` ranges are
//     PROT_NONE reservations and mapped pages become readable and writable
//     at SetAccess, so the engine touching an unmapped page crashes a test.
// Invariants: live segments never overlap; their total never exceeds the
// capacity set when they were obtained; fake addresses are never reused.
// Thread-safe: the controls may be called while an engine uses the backend.
#ifndef TORCHMEM_TESTS_DOUBLES_CONTROLLED_BACKEND_H_
#define TORCHMEM_TESTS_DOUBLES_CONTROLLED_BACKEND_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "torchmem/core/backend.h"
#include "torchmem/core/mutex.h"

namespace torchmem {

struct ControlledBackendOptions {
  std::string device_name = "test:0";
  std::size_t capacity_bytes = std::size_t{64} << 30;
  bool real_memory = false;
  bool auto_complete_events = false;
  // Fake segments at decreasing addresses, as mmap (and so the simulated CUDA
  // device) hands them out; by default at increasing addresses.
  bool top_down_addresses = false;
  std::size_t vmm_page_size = std::size_t{2} << 20;
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
  std::int64_t live_pages() const;      // physical pages created, not released
  std::size_t live_page_bytes() const;  // their bytes
  std::int64_t mapped_pages() const;    // granules (vmm_page_size) mapped
  std::int64_t reserved_ranges() const;

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
  absl::StatusOr<std::size_t> VirtualMemoryPageSize() override;
  absl::StatusOr<std::uintptr_t> ReserveAddressRange(std::size_t size) override;
  absl::Status ReleaseAddressRange(std::uintptr_t address, std::size_t size) override;
  absl::StatusOr<PhysicalPage> CreatePhysicalPage(std::size_t size) override;
  absl::Status ReleasePhysicalPage(PhysicalPage page) override;
  absl::Status MapPage(std::uintptr_t address, PhysicalPage page, std::size_t size) override;
  absl::Status SetAccess(std::uintptr_t address, std::size_t size) override;
  absl::Status UnmapPages(std::uintptr_t address, std::size_t size, StreamId stream) override;

 private:
  struct Mapping {
    PhysicalPage page = 0;
    bool accessible = false;
  };
  struct Created {
    std::size_t size = 0;
    std::uintptr_t mapped_at = 0;  // 0: mapped nowhere
  };

  // A fake address range of `size` bytes, or ResourceExhausted.
  absl::StatusOr<std::uintptr_t> FakeAddresses(std::size_t size)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  absl::Status CheckFits(std::size_t size) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  // OK if [address, address + size) is page-aligned and inside one range.
  absl::Status CheckInRange(const char* call, std::uintptr_t address, std::size_t size) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);

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
  absl::flat_hash_map<std::uintptr_t, std::size_t> ranges_ ABSL_GUARDED_BY(mutex_);
  // Pages created (each a multiple of the page size), with where each is mapped.
  absl::flat_hash_map<PhysicalPage, Created> pages_ ABSL_GUARDED_BY(mutex_);
  // By address, one entry per granule (vmm_page_size) of a mapped page.
  absl::flat_hash_map<std::uintptr_t, Mapping> mappings_ ABSL_GUARDED_BY(mutex_);
  PhysicalPage next_page_ ABSL_GUARDED_BY(mutex_) = 1;
};

}  // namespace torchmem

#endif  // TORCHMEM_TESTS_DOUBLES_CONTROLLED_BACKEND_H_
