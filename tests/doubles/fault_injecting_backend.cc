#include "doubles/fault_injecting_backend.h"

#include <cstdio>
#include <cstdlib>
#include <utility>

#include "absl/strings/str_format.h"

namespace torchmem {
namespace {

int Index(BackendCall call) { return static_cast<int>(call); }

// A test that arms an invalid fault has a bug: say so and stop.
void CheckArmed(const absl::Status& status) {
  if (status.ok()) return;
  std::fprintf(stderr, "torchmem: FaultInjectingBackend: %s\n", status.ToString().c_str());
  std::abort();
}

}  // namespace

const char* BackendCallName(BackendCall call) {
  switch (call) {
    case BackendCall::kAllocateSegment:
      return "AllocateSegment";
    case BackendCall::kReleaseSegment:
      return "ReleaseSegment";
    case BackendCall::kCapacity:
      return "Capacity";
    case BackendCall::kCheckSegmentAllocationAllowed:
      return "CheckSegmentAllocationAllowed";
    case BackendCall::kRecordEvent:
      return "RecordEvent";
    case BackendCall::kQueryEvent:
      return "QueryEvent";
    case BackendCall::kSynchronizeEvent:
      return "SynchronizeEvent";
    case BackendCall::kVirtualMemoryPageSize:
      return "VirtualMemoryPageSize";
    case BackendCall::kReserveAddressRange:
      return "ReserveAddressRange";
    case BackendCall::kReleaseAddressRange:
      return "ReleaseAddressRange";
    case BackendCall::kCreatePhysicalPage:
      return "CreatePhysicalPage";
    case BackendCall::kReleasePhysicalPage:
      return "ReleasePhysicalPage";
    case BackendCall::kMapPage:
      return "MapPage";
    case BackendCall::kSetAccess:
      return "SetAccess";
    case BackendCall::kUnmapPages:
      return "UnmapPages";
  }
  return "?";
}

FaultInjectingBackend::FaultInjectingBackend(std::unique_ptr<Backend> inner, std::uint64_t seed)
    : inner_(std::move(inner)), device_name_(inner_->DeviceName()), rng_(seed) {}

FaultInjectingBackend::~FaultInjectingBackend() = default;

absl::Status FaultInjectingBackend::Arm(BackendCall call, FaultSpec spec) {
  if (spec.code == absl::StatusCode::kOk) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "cannot inject a failure of %s with status code OK", BackendCallName(call)));
  }
  if (spec.skip < 0 || spec.count < FaultSpec::kUnlimited) {
    return absl::InvalidArgumentError(
        absl::StrFormat("fault of %s: skip (%d) must be >= 0 and count (%d) >= 0 or kUnlimited",
                        BackendCallName(call), spec.skip, spec.count));
  }
  if (!(spec.probability > 0.0 && spec.probability <= 1.0)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("fault of %s: probability must be in (0, 1], got %g", BackendCallName(call),
                        spec.probability));
  }
  MutexLock lock(&mutex_);
  rules_[Index(call)] = Rule{spec.count != 0, spec};
  return absl::OkStatus();
}

void FaultInjectingBackend::FailOnce(BackendCall call, absl::StatusCode code) {
  CheckArmed(Arm(call, FaultSpec{.code = code, .count = 1}));
}

void FaultInjectingBackend::FailNext(BackendCall call, std::int64_t count, absl::StatusCode code) {
  CheckArmed(Arm(call, FaultSpec{.code = code, .count = count}));
}

void FaultInjectingBackend::FailAfter(BackendCall call, std::int64_t successes, std::int64_t count,
                                      absl::StatusCode code) {
  CheckArmed(Arm(call, FaultSpec{.code = code, .skip = successes, .count = count}));
}

void FaultInjectingBackend::FailAlways(BackendCall call, absl::StatusCode code) {
  CheckArmed(Arm(call, FaultSpec{.code = code, .count = FaultSpec::kUnlimited}));
}

void FaultInjectingBackend::FailWithProbability(BackendCall call, double probability,
                                                absl::StatusCode code, std::int64_t count) {
  CheckArmed(Arm(call, FaultSpec{.code = code, .count = count, .probability = probability}));
}

void FaultInjectingBackend::Clear(BackendCall call) {
  MutexLock lock(&mutex_);
  rules_[Index(call)] = Rule{};
}

void FaultInjectingBackend::ClearAll() {
  MutexLock lock(&mutex_);
  for (Rule& rule : rules_) rule = Rule{};
}

void FaultInjectingBackend::Reseed(std::uint64_t seed) {
  MutexLock lock(&mutex_);
  rng_.seed(seed);
}

bool FaultInjectingBackend::armed(BackendCall call) const {
  MutexLock lock(&mutex_);
  return rules_[Index(call)].armed;
}

std::int64_t FaultInjectingBackend::calls(BackendCall call) const {
  MutexLock lock(&mutex_);
  return calls_[Index(call)];
}

std::int64_t FaultInjectingBackend::failures(BackendCall call) const {
  MutexLock lock(&mutex_);
  return failures_[Index(call)];
}

std::int64_t FaultInjectingBackend::total_failures() const {
  MutexLock lock(&mutex_);
  return total_failures_;
}

absl::Status FaultInjectingBackend::last_failure(BackendCall call) const {
  MutexLock lock(&mutex_);
  return last_failures_[Index(call)];
}

std::int64_t FaultInjectingBackend::release_event_calls() const {
  MutexLock lock(&mutex_);
  return release_event_calls_;
}

absl::Status FaultInjectingBackend::Enter(BackendCall call, Describer describe) {
  MutexLock lock(&mutex_);
  ++calls_[Index(call)];
  Rule& rule = rules_[Index(call)];
  if (!rule.armed) return absl::OkStatus();
  if (rule.spec.skip > 0) {
    --rule.spec.skip;
    return absl::OkStatus();
  }
  if (rule.spec.probability < 1.0) {
    // 53 random bits as a double in [0, 1): the same on every platform.
    const double draw = static_cast<double>(rng_() >> 11) * 0x1.0p-53;
    if (draw >= rule.spec.probability) return absl::OkStatus();
  }
  if (rule.spec.count != FaultSpec::kUnlimited && --rule.spec.count == 0) rule.armed = false;
  ++failures_[Index(call)];
  ++total_failures_;
  absl::Status injected(
      rule.spec.code,
      absl::StrFormat("injected failure of %s on %s (%s; injected fault #%d)",
                      BackendCallName(call), device_name_, describe(), total_failures_));
  last_failures_[Index(call)] = injected;
  return injected;
}

absl::StatusOr<std::uintptr_t> FaultInjectingBackend::AllocateSegment(std::size_t size,
                                                                      StreamId stream) {
  if (absl::Status injected =
          Enter(BackendCall::kAllocateSegment,
                [&] { return absl::StrFormat("size %d, stream %#x", size, stream); });
      !injected.ok()) {
    return injected;
  }
  return inner_->AllocateSegment(size, stream);
}

absl::Status FaultInjectingBackend::ReleaseSegment(std::uintptr_t address, std::size_t size) {
  if (absl::Status injected =
          Enter(BackendCall::kReleaseSegment,
                [&] { return absl::StrFormat("segment %#x, size %d", address, size); });
      !injected.ok()) {
    return injected;
  }
  return inner_->ReleaseSegment(address, size);
}

absl::StatusOr<std::size_t> FaultInjectingBackend::Capacity() {
  if (absl::Status injected =
          Enter(BackendCall::kCapacity, [] { return std::string("device capacity"); });
      !injected.ok()) {
    return injected;
  }
  return inner_->Capacity();
}

absl::Status FaultInjectingBackend::CheckSegmentAllocationAllowed(StreamId stream) {
  if (absl::Status injected = Enter(BackendCall::kCheckSegmentAllocationAllowed,
                                    [&] { return absl::StrFormat("stream %#x", stream); });
      !injected.ok()) {
    return injected;
  }
  return inner_->CheckSegmentAllocationAllowed(stream);
}

absl::StatusOr<EventId> FaultInjectingBackend::RecordEvent(StreamId stream) {
  if (absl::Status injected =
          Enter(BackendCall::kRecordEvent, [&] { return absl::StrFormat("stream %#x", stream); });
      !injected.ok()) {
    return injected;
  }
  return inner_->RecordEvent(stream);
}

absl::StatusOr<bool> FaultInjectingBackend::QueryEvent(EventId event) {
  if (absl::Status injected =
          Enter(BackendCall::kQueryEvent, [&] { return absl::StrFormat("event %#x", event); });
      !injected.ok()) {
    return injected;
  }
  return inner_->QueryEvent(event);
}

absl::Status FaultInjectingBackend::SynchronizeEvent(EventId event) {
  if (absl::Status injected = Enter(BackendCall::kSynchronizeEvent,
                                    [&] { return absl::StrFormat("event %#x", event); });
      !injected.ok()) {
    return injected;
  }
  return inner_->SynchronizeEvent(event);
}

void FaultInjectingBackend::ReleaseEvent(EventId event) {
  {
    MutexLock lock(&mutex_);
    ++release_event_calls_;
  }
  inner_->ReleaseEvent(event);
}

// --- virtual memory ---------------------------------------------------------

absl::StatusOr<std::size_t> FaultInjectingBackend::VirtualMemoryPageSize() {
  if (absl::Status injected =
          Enter(BackendCall::kVirtualMemoryPageSize, [] { return std::string("page size"); });
      !injected.ok()) {
    return injected;
  }
  return inner_->VirtualMemoryPageSize();
}

absl::StatusOr<std::uintptr_t> FaultInjectingBackend::ReserveAddressRange(std::size_t size) {
  if (absl::Status injected = Enter(BackendCall::kReserveAddressRange,
                                    [&] { return absl::StrFormat("size %d", size); });
      !injected.ok()) {
    return injected;
  }
  return inner_->ReserveAddressRange(size);
}

absl::Status FaultInjectingBackend::ReleaseAddressRange(std::uintptr_t address, std::size_t size) {
  if (absl::Status injected =
          Enter(BackendCall::kReleaseAddressRange,
                [&] { return absl::StrFormat("range %#x, size %d", address, size); });
      !injected.ok()) {
    return injected;
  }
  return inner_->ReleaseAddressRange(address, size);
}

absl::StatusOr<PhysicalPage> FaultInjectingBackend::CreatePhysicalPage(std::size_t size) {
  if (absl::Status injected = Enter(BackendCall::kCreatePhysicalPage,
                                    [&] { return absl::StrFormat("one page of %d bytes", size); });
      !injected.ok()) {
    return injected;
  }
  return inner_->CreatePhysicalPage(size);
}

absl::Status FaultInjectingBackend::ReleasePhysicalPage(PhysicalPage page) {
  if (absl::Status injected = Enter(BackendCall::kReleasePhysicalPage,
                                    [&] { return absl::StrFormat("page %d", page); });
      !injected.ok()) {
    return injected;
  }
  return inner_->ReleasePhysicalPage(page);
}

absl::Status FaultInjectingBackend::MapPage(std::uintptr_t address, PhysicalPage page,
                                            std::size_t size) {
  if (absl::Status injected = Enter(
          BackendCall::kMapPage, [&] { return absl::StrFormat("page %d at %#x", page, address); });
      !injected.ok()) {
    return injected;
  }
  return inner_->MapPage(address, page, size);
}

absl::Status FaultInjectingBackend::SetAccess(std::uintptr_t address, std::size_t size) {
  if (absl::Status injected = Enter(BackendCall::kSetAccess,
                                    [&] { return absl::StrFormat("%#x, size %d", address, size); });
      !injected.ok()) {
    return injected;
  }
  return inner_->SetAccess(address, size);
}

absl::Status FaultInjectingBackend::UnmapPages(std::uintptr_t address, std::size_t size,
                                               StreamId stream) {
  if (absl::Status injected =
          Enter(BackendCall::kUnmapPages,
                [&] { return absl::StrFormat("%#x, size %d, stream %#x", address, size, stream); });
      !injected.ok()) {
    return injected;
  }
  return inner_->UnmapPages(address, size, stream);
}

}  // namespace torchmem
