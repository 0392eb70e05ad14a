// FaultInjectingBackend: a decorator that makes any backend's calls fail on
// demand, so tests and fuzzers can check that an engine survives every
// failure a device can produce.
//
// It wraps any Backend (HostBackend, ControlledBackend, CudaBackend, ...)
// and forwards every call to it, except the calls it is told to fail: those
// return the injected error without reaching the wrapped backend, exactly as
// if the device had refused them. Each failable call (BackendCall) has at
// most one armed fault, described by a FaultSpec:
//   - skip         calls that succeed first ("after K successes");
//   - count        calls that then fail (1: once; N; kUnlimited: until
//                  cleared);
//   - probability  chance in (0, 1] that each call after the skip fails,
//                  drawn from a seeded RNG (intermittent faults, reproducible
//                  from the seed); only failures count towards `count`;
//   - code         any status code but OK, e.g. ResourceExhausted to mimic an
//                  out-of-memory device, Internal for a device fault.
// Injected errors read "injected failure of <Call> on <device>: <code>
// (fault #n ...)" so a test can check that a report names the call and the
// device. ReleaseEvent cannot fail (it returns nothing) but is counted.
//
// Invariants:
//   - calls(c) counts every call of c, failed or not; failures(c) counts
//     the injected ones; calls(c) - failures(c) calls reached the wrapped
//     backend;
//   - a fault stops after `count` failures, then the call is forwarded again;
//   - the same seed and the same sequence of calls give the same failures.
// Thread-safe: controls and observations may be used while an engine calls
// the backend. The wrapped backend is called without the decorator's lock.
#ifndef TORCHMEM_TESTS_DOUBLES_FAULT_INJECTING_BACKEND_H_
#define TORCHMEM_TESTS_DOUBLES_FAULT_INJECTING_BACKEND_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <random>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "torchmem/core/backend.h"
#include "torchmem/core/mutex.h"

namespace torchmem {

// The Backend calls that can fail.
enum class BackendCall : int {
  kAllocateSegment,
  kReleaseSegment,
  kCapacity,
  kCheckSegmentAllocationAllowed,
  kRecordEvent,
  kQueryEvent,
  kSynchronizeEvent,
  // Virtual memory (expandable segments).
  kVirtualMemoryPageSize,
  kReserveAddressRange,
  kReleaseAddressRange,
  kCreatePhysicalPage,
  kReleasePhysicalPage,
  kMapPage,
  kSetAccess,
  kUnmapPages,
};
inline constexpr int kNumBackendCalls = 15;
// The calls an engine makes with PyTorch's placement (segments, events).
inline constexpr std::array<BackendCall, 7> kSegmentBackendCalls = {
    BackendCall::kAllocateSegment,  BackendCall::kReleaseSegment,
    BackendCall::kCapacity,         BackendCall::kCheckSegmentAllocationAllowed,
    BackendCall::kRecordEvent,      BackendCall::kQueryEvent,
    BackendCall::kSynchronizeEvent,
};
// The virtual-memory calls (the virtual-memory placement makes these too).
inline constexpr std::array<BackendCall, 8> kVirtualMemoryBackendCalls = {
    BackendCall::kVirtualMemoryPageSize,
    BackendCall::kReserveAddressRange,
    BackendCall::kReleaseAddressRange,
    BackendCall::kCreatePhysicalPage,
    BackendCall::kReleasePhysicalPage,
    BackendCall::kMapPage,
    BackendCall::kSetAccess,
    BackendCall::kUnmapPages,
};
inline constexpr std::array<BackendCall, kNumBackendCalls> kAllBackendCalls = {
    BackendCall::kAllocateSegment,
    BackendCall::kReleaseSegment,
    BackendCall::kCapacity,
    BackendCall::kCheckSegmentAllocationAllowed,
    BackendCall::kRecordEvent,
    BackendCall::kQueryEvent,
    BackendCall::kSynchronizeEvent,
    BackendCall::kVirtualMemoryPageSize,
    BackendCall::kReserveAddressRange,
    BackendCall::kReleaseAddressRange,
    BackendCall::kCreatePhysicalPage,
    BackendCall::kReleasePhysicalPage,
    BackendCall::kMapPage,
    BackendCall::kSetAccess,
    BackendCall::kUnmapPages,
};

// "AllocateSegment", "ReleaseSegment", ...: the method's name.
const char* BackendCallName(BackendCall call);

struct FaultSpec {
  static constexpr std::int64_t kUnlimited = -1;

  absl::StatusCode code = absl::StatusCode::kInternal;
  std::int64_t skip = 0;
  std::int64_t count = 1;
  double probability = 1.0;
};

class FaultInjectingBackend final : public Backend {
 public:
  explicit FaultInjectingBackend(std::unique_ptr<Backend> inner, std::uint64_t seed = 0);
  ~FaultInjectingBackend() override;

  // --- controls -------------------------------------------------------------
  // Arms `spec` for `call`, replacing any fault armed for it. Errors
  // (nothing changes): InvalidArgument for code OK, skip < 0, count < -1 or
  // a probability outside (0, 1].
  absl::Status Arm(BackendCall call, FaultSpec spec);
  // Shorthands for Arm (they abort on the errors above: a test bug).
  void FailOnce(BackendCall call, absl::StatusCode code = absl::StatusCode::kInternal);
  void FailNext(BackendCall call, std::int64_t count,
                absl::StatusCode code = absl::StatusCode::kInternal);
  void FailAfter(BackendCall call, std::int64_t successes, std::int64_t count = 1,
                 absl::StatusCode code = absl::StatusCode::kInternal);
  void FailAlways(BackendCall call, absl::StatusCode code = absl::StatusCode::kInternal);
  void FailWithProbability(BackendCall call, double probability,
                           absl::StatusCode code = absl::StatusCode::kInternal,
                           std::int64_t count = FaultSpec::kUnlimited);
  void Clear(BackendCall call);
  void ClearAll();
  // Restarts the RNG used for probabilistic faults.
  void Reseed(std::uint64_t seed);

  // --- observations ---------------------------------------------------------
  bool armed(BackendCall call) const;
  std::int64_t calls(BackendCall call) const;
  std::int64_t failures(BackendCall call) const;
  std::int64_t total_failures() const;
  // The last error injected into `call` (OK if none yet).
  absl::Status last_failure(BackendCall call) const;
  std::int64_t release_event_calls() const;
  Backend& inner() const { return *inner_; }

  // --- Backend --------------------------------------------------------------
  std::string DeviceName() const override { return device_name_; }
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
  struct Rule {
    bool armed = false;
    FaultSpec spec;
  };

  // Describes a call's arguments for the message of an injected error.
  using Describer = absl::FunctionRef<std::string()>;

  // Counts a call of `call` and decides whether it fails; returns the
  // injected error or OK.
  absl::Status Enter(BackendCall call, Describer describe);

  const std::unique_ptr<Backend> inner_;
  const std::string device_name_;
  mutable Mutex mutex_;
  std::array<Rule, kNumBackendCalls> rules_ ABSL_GUARDED_BY(mutex_);
  std::array<std::int64_t, kNumBackendCalls> calls_ ABSL_GUARDED_BY(mutex_) = {};
  std::array<std::int64_t, kNumBackendCalls> failures_ ABSL_GUARDED_BY(mutex_) = {};
  std::array<absl::Status, kNumBackendCalls> last_failures_ ABSL_GUARDED_BY(mutex_);
  std::int64_t total_failures_ ABSL_GUARDED_BY(mutex_) = 0;
  std::int64_t release_event_calls_ ABSL_GUARDED_BY(mutex_) = 0;
  std::mt19937_64 rng_ ABSL_GUARDED_BY(mutex_);
};

}  // namespace torchmem

#endif  // TORCHMEM_TESTS_DOUBLES_FAULT_INJECTING_BACKEND_H_
