#include "torchmem/backends/controlled_backend.h"

#include <sys/mman.h>

#include "absl/strings/str_format.h"
#include "torchmem/core/format.h"

namespace torchmem {
namespace {

// Gap between fake segments, so an off-by-one address never lands in the
// next segment.
constexpr std::uintptr_t kAddressGap = std::uintptr_t{2} << 20;
// Fake segments are handed out in [kAddressBase, kAddressLimit); a request
// that does not fit fails like a full device (fuzzers ask for absurd sizes).
constexpr std::uintptr_t kAddressBase = std::uintptr_t{1} << 44;
constexpr std::uintptr_t kAddressLimit = std::uintptr_t{1} << 62;

}  // namespace

ControlledBackend::ControlledBackend(ControlledBackendOptions options) : options_(options) {}

ControlledBackend::~ControlledBackend() {
  MutexLock lock(&mutex_);
  if (!options_.real_memory) return;
  for (const auto& [address, size] : segments_) munmap(reinterpret_cast<void*>(address), size);
}

void ControlledBackend::CompleteStream(StreamId stream) {
  MutexLock lock(&mutex_);
  StreamProgress& progress = streams_[stream];
  progress.completed = progress.recorded;
}

void ControlledBackend::CompleteAll() {
  MutexLock lock(&mutex_);
  for (auto& [stream, progress] : streams_) progress.completed = progress.recorded;
}

void ControlledBackend::SetAutoComplete(bool auto_complete) {
  MutexLock lock(&mutex_);
  options_.auto_complete_events = auto_complete;
}

void ControlledBackend::SetCapacity(std::size_t bytes) {
  MutexLock lock(&mutex_);
  options_.capacity_bytes = bytes;
}

void ControlledBackend::ForbidSegmentAllocation(std::string reason) {
  MutexLock lock(&mutex_);
  forbid_reason_ = std::move(reason);
}

std::size_t ControlledBackend::live_segment_bytes() const {
  MutexLock lock(&mutex_);
  return live_bytes_;
}

std::int64_t ControlledBackend::live_segments() const {
  MutexLock lock(&mutex_);
  return static_cast<std::int64_t>(segments_.size());
}

std::int64_t ControlledBackend::live_events() const {
  MutexLock lock(&mutex_);
  return static_cast<std::int64_t>(events_.size());
}

absl::StatusOr<std::uintptr_t> ControlledBackend::AllocateSegment(std::size_t size,
                                                                  StreamId stream) {
  (void)stream;
  MutexLock lock(&mutex_);
  // Written so that no sum can overflow, whatever the capacity and size.
  if (live_bytes_ > options_.capacity_bytes || size > options_.capacity_bytes - live_bytes_) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "%s is full: %s of %s in use", options_.device_name,
        FormatBytes(static_cast<std::int64_t>(live_bytes_)),
        FormatBytes(static_cast<std::int64_t>(options_.capacity_bytes))));
  }
  std::uintptr_t address = 0;
  if (options_.real_memory) {
    void* memory = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (memory == MAP_FAILED) return absl::ResourceExhaustedError("mmap failed");
    address = reinterpret_cast<std::uintptr_t>(memory);
  } else {
    const std::uintptr_t limit_left = kAddressLimit - kAddressBase - used_address_space_;
    if (limit_left < 2 * kAddressGap || size > limit_left - 2 * kAddressGap) {
      return absl::ResourceExhaustedError(absl::StrFormat(
          "%s: no fake address range of %d bytes is left", options_.device_name, size));
    }
    const std::uintptr_t stride =
        (size + kAddressGap - 1) / kAddressGap * kAddressGap + kAddressGap;
    address = options_.top_down_addresses ? kAddressLimit - used_address_space_ - stride
                                          : kAddressBase + used_address_space_;
    used_address_space_ += stride;
  }
  segments_.emplace(address, size);
  live_bytes_ += size;
  return address;
}

absl::Status ControlledBackend::ReleaseSegment(std::uintptr_t address, std::size_t size) {
  MutexLock lock(&mutex_);
  auto it = segments_.find(address);
  if (it == segments_.end() || it->second != size) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "ReleaseSegment(%#x, %d): no such segment on %s", address, size, options_.device_name));
  }
  if (options_.real_memory) munmap(reinterpret_cast<void*>(address), size);
  segments_.erase(it);
  live_bytes_ -= size;
  return absl::OkStatus();
}

absl::StatusOr<std::size_t> ControlledBackend::Capacity() {
  MutexLock lock(&mutex_);
  return options_.capacity_bytes;
}

absl::Status ControlledBackend::CheckSegmentAllocationAllowed(StreamId stream) {
  (void)stream;
  MutexLock lock(&mutex_);
  if (forbid_reason_.empty()) return absl::OkStatus();
  return absl::FailedPreconditionError(forbid_reason_);
}

absl::StatusOr<EventId> ControlledBackend::RecordEvent(StreamId stream) {
  MutexLock lock(&mutex_);
  StreamProgress& progress = streams_[stream];
  const EventId id = next_event_++;
  events_.emplace(id, Event{stream, ++progress.recorded});
  return id;
}

absl::StatusOr<bool> ControlledBackend::QueryEvent(EventId event) {
  MutexLock lock(&mutex_);
  auto it = events_.find(event);
  if (it == events_.end()) return absl::InvalidArgumentError("QueryEvent: unknown event");
  if (options_.auto_complete_events) return true;
  return streams_[it->second.stream].completed >= it->second.position;
}

absl::Status ControlledBackend::SynchronizeEvent(EventId event) {
  MutexLock lock(&mutex_);
  auto it = events_.find(event);
  if (it == events_.end()) return absl::InvalidArgumentError("SynchronizeEvent: unknown event");
  StreamProgress& progress = streams_[it->second.stream];
  progress.completed = std::max(progress.completed, it->second.position);
  return absl::OkStatus();
}

void ControlledBackend::ReleaseEvent(EventId event) {
  MutexLock lock(&mutex_);
  events_.erase(event);
}

}  // namespace torchmem
