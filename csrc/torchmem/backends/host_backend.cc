#include "torchmem/backends/host_backend.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_format.h"
#include "torchmem/core/format.h"

namespace torchmem {
namespace {

// Small segments are page aligned; c10 only needs 64 bytes.
constexpr std::size_t kSmallSegmentAlignment = 4096;

std::size_t PhysicalMemory() {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page_size = sysconf(_SC_PAGESIZE);
  return pages > 0 && page_size > 0 ? static_cast<std::size_t>(pages) * page_size : 0;
}

}  // namespace

HostBackend::HostBackend(HostBackendOptions options) : options_(options) {}

absl::StatusOr<std::uintptr_t> HostBackend::AllocateSegment(std::size_t size, StreamId stream) {
  (void)stream;
  const std::size_t capacity = options_.capacity_bytes;
  if (capacity != 0 && live_bytes_.load(std::memory_order_relaxed) + size > capacity) {
    return absl::ResourceExhaustedError(
        absl::StrFormat("host backend capacity of %s reached (%s in use, %s more requested)",
                        FormatBytes(static_cast<std::int64_t>(capacity)),
                        FormatBytes(static_cast<std::int64_t>(live_bytes_.load())),
                        FormatBytes(static_cast<std::int64_t>(size))));
  }
  void* memory = nullptr;
  if (size >= options_.mmap_threshold) {
    memory = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (memory == MAP_FAILED) {
      return absl::ResourceExhaustedError(
          absl::StrFormat("mmap of %s failed: %s", FormatBytes(static_cast<std::int64_t>(size)),
                          std::strerror(errno)));
    }
  } else {
    const std::size_t padded =
        (size + kSmallSegmentAlignment - 1) / kSmallSegmentAlignment * kSmallSegmentAlignment;
    memory = std::aligned_alloc(kSmallSegmentAlignment, padded);
    if (memory == nullptr) {
      return absl::ResourceExhaustedError(absl::StrFormat(
          "aligned_alloc of %s failed", FormatBytes(static_cast<std::int64_t>(size))));
    }
  }
  live_bytes_.fetch_add(size, std::memory_order_relaxed);
  return reinterpret_cast<std::uintptr_t>(memory);
}

absl::Status HostBackend::ReleaseSegment(std::uintptr_t address, std::size_t size) {
  void* memory = reinterpret_cast<void*>(address);
  if (size >= options_.mmap_threshold) {
    if (munmap(memory, size) != 0) {
      return absl::InternalError(
          absl::StrFormat("munmap(%#x, %d) failed: %s", address, size, std::strerror(errno)));
    }
  } else {
    std::free(memory);
  }
  live_bytes_.fetch_sub(size, std::memory_order_relaxed);
  return absl::OkStatus();
}

absl::StatusOr<std::size_t> HostBackend::Capacity() {
  if (options_.capacity_bytes != 0) return options_.capacity_bytes;
  const std::size_t physical = PhysicalMemory();
  if (physical == 0) return absl::UnavailableError("cannot read the machine's memory size");
  return physical;
}

absl::StatusOr<EventId> HostBackend::RecordEvent(StreamId stream) {
  (void)stream;
  return next_event_.fetch_add(1, std::memory_order_relaxed);
}

absl::StatusOr<bool> HostBackend::QueryEvent(EventId event) {
  (void)event;
  return true;
}

absl::Status HostBackend::SynchronizeEvent(EventId event) {
  (void)event;
  return absl::OkStatus();
}

void HostBackend::ReleaseEvent(EventId event) { (void)event; }

}  // namespace torchmem
