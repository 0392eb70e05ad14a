// HostBackend: segments in host memory, for the CPU allocator.
//
// Segments of at least `mmap_threshold` bytes are anonymous mmap regions
// (returned to the OS whole by munmap); smaller ones come from aligned_alloc.
// An optional capacity makes AllocateSegment fail with ResourceExhausted
// once the live segments would exceed it, which tests use to exercise the
// out-of-memory ladder. Host work is synchronous, so events complete at once.
#ifndef TORCHMEM_BACKENDS_HOST_BACKEND_H_
#define TORCHMEM_BACKENDS_HOST_BACKEND_H_

#include <atomic>
#include <cstddef>
#include <string>

#include "torchmem/core/backend.h"

namespace torchmem {

struct HostBackendOptions {
  // 0: the machine's physical memory.
  std::size_t capacity_bytes = 0;
  std::size_t mmap_threshold = std::size_t{1} << 20;
};

class HostBackend final : public Backend {
 public:
  explicit HostBackend(HostBackendOptions options = {});

  std::string DeviceName() const override { return "cpu"; }
  absl::StatusOr<std::uintptr_t> AllocateSegment(std::size_t size, StreamId stream) override;
  absl::Status ReleaseSegment(std::uintptr_t address, std::size_t size) override;
  absl::StatusOr<std::size_t> Capacity() override;
  absl::StatusOr<EventId> RecordEvent(StreamId stream) override;
  absl::StatusOr<bool> QueryEvent(EventId event) override;
  absl::Status SynchronizeEvent(EventId event) override;
  void ReleaseEvent(EventId event) override;

  std::size_t live_bytes() const { return live_bytes_.load(std::memory_order_relaxed); }

 private:
  const HostBackendOptions options_;
  std::atomic<std::size_t> live_bytes_{0};
  std::atomic<EventId> next_event_{1};
};

}  // namespace torchmem

#endif  // TORCHMEM_BACKENDS_HOST_BACKEND_H_
