#include "torchmem/backends/controlled_backend.h"

#include <sys/mman.h>

#include "absl/strings/str_format.h"
#include "torchmem/core/format.h"

namespace torchmem {
namespace {

// Gap between fake segments, so an off-by-one address never lands in the
// next segment.
constexpr std::uintptr_t kAddressGap = std::uintptr_t{2} << 20;

const char* CallName(ControlledBackend::Call call) {
  switch (call) {
    case ControlledBackend::Call::kAllocateSegment:
      return "AllocateSegment";
    case ControlledBackend::Call::kReleaseSegment:
      return "ReleaseSegment";
    case ControlledBackend::Call::kCapacity:
      return "Capacity";
    case ControlledBackend::Call::kRecordEvent:
      return "RecordEvent";
    case ControlledBackend::Call::kQueryEvent:
      return "QueryEvent";
    case ControlledBackend::Call::kSynchronizeEvent:
      return "SynchronizeEvent";
    case ControlledBackend::Call::kNumCalls:
      break;
  }
  return "?";
}

}  // namespace

ControlledBackend::ControlledBackend(ControlledBackendOptions options) : options_(options) {}

ControlledBackend::~ControlledBackend() {
  MutexLock lock(&mutex_);
  if (!options_.real_memory) return;
  for (const auto& [address, size] : segments_) munmap(reinterpret_cast<void*>(address), size);
}

void ControlledBackend::FailNext(Call call, int count, absl::StatusCode code, int skip) {
  MutexLock lock(&mutex_);
  failures_[static_cast<int>(call)] = Failure{skip, count, code};
}

void ControlledBackend::ClearFailures() {
  MutexLock lock(&mutex_);
  for (Failure& failure : failures_) failure = Failure{};
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

std::int64_t ControlledBackend::calls(Call call) const {
  MutexLock lock(&mutex_);
  return calls_[static_cast<int>(call)];
}

std::int64_t ControlledBackend::failures_injected() const {
  MutexLock lock(&mutex_);
  return failures_injected_;
}

absl::Status ControlledBackend::Enter(Call call) {
  ++calls_[static_cast<int>(call)];
  Failure& failure = failures_[static_cast<int>(call)];
  if (failure.count == 0) return absl::OkStatus();
  if (failure.skip > 0) {
    --failure.skip;
    return absl::OkStatus();
  }
  --failure.count;
  ++failures_injected_;
  return absl::Status(failure.code,
                      absl::StrFormat("injected failure of %s on %s", CallName(call),
                                      options_.device_name));
}

absl::StatusOr<std::uintptr_t> ControlledBackend::AllocateSegment(std::size_t size,
                                                                  StreamId stream) {
  (void)stream;
  MutexLock lock(&mutex_);
  if (absl::Status injected = Enter(Call::kAllocateSegment); !injected.ok()) return injected;
  if (live_bytes_ + size > options_.capacity_bytes) {
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
    address = next_address_;
    next_address_ += (size + kAddressGap - 1) / kAddressGap * kAddressGap + kAddressGap;
  }
  segments_.emplace(address, size);
  live_bytes_ += size;
  return address;
}

absl::Status ControlledBackend::ReleaseSegment(std::uintptr_t address, std::size_t size) {
  MutexLock lock(&mutex_);
  if (absl::Status injected = Enter(Call::kReleaseSegment); !injected.ok()) return injected;
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
  if (absl::Status injected = Enter(Call::kCapacity); !injected.ok()) return injected;
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
  if (absl::Status injected = Enter(Call::kRecordEvent); !injected.ok()) return injected;
  StreamProgress& progress = streams_[stream];
  const EventId id = next_event_++;
  events_.emplace(id, Event{stream, ++progress.recorded});
  return id;
}

absl::StatusOr<bool> ControlledBackend::QueryEvent(EventId event) {
  MutexLock lock(&mutex_);
  if (absl::Status injected = Enter(Call::kQueryEvent); !injected.ok()) return injected;
  auto it = events_.find(event);
  if (it == events_.end()) return absl::InvalidArgumentError("QueryEvent: unknown event");
  if (options_.auto_complete_events) return true;
  return streams_[it->second.stream].completed >= it->second.position;
}

absl::Status ControlledBackend::SynchronizeEvent(EventId event) {
  MutexLock lock(&mutex_);
  if (absl::Status injected = Enter(Call::kSynchronizeEvent); !injected.ok()) return injected;
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
