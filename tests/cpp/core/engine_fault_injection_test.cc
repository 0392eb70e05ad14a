// Fault injection: an engine whose backend fails keeps its pool intact.
//
// Every Backend call (AllocateSegment, ReleaseSegment, Capacity,
// CheckSegmentAllocationAllowed, RecordEvent, QueryEvent, SynchronizeEvent)
// is made to fail once, repeatedly and intermittently, through a
// FaultInjectingBackend over real host memory (HostBackend) and over the
// ControlledBackend (whose events complete only when told). After every
// engine operation:
//   - an error names the failed call and the device, and carries the
//     injected status code; the only other error allowed is running out of
//     memory because a fault kept memory from being reclaimed;
//   - statistics equal a shadow model of the live blocks, reserved memory
//     equals what the backend itself holds, and CheckInvariants() passes;
// and once the fault stops, the same requests succeed and every byte goes
// back to the backend. The decorator itself is tested on all its calls, the
// virtual-memory ones (ReserveAddressRange ... UnmapPages) included; engines
// failing those calls are tested in engine_vmm_test.cc.
#include <algorithm>
#include <array>
#include <cstdio>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "doubles/controlled_backend.h"
#include "doubles/fault_injecting_backend.h"
#include "gtest/gtest.h"
#include "tests/cpp/support/live_block_model.h"
#include "torchmem/backends/host_backend.h"
#include "torchmem/core/engine.h"

namespace torchmem {
namespace {

constexpr StreamId kMain = 0;
constexpr StreamId kSide = 7;
constexpr std::size_t kCapacity = 64 * kMiB;

// Faults injected by all the tests of this file, reported at the end.
std::int64_t g_faults_injected = 0;
std::int64_t g_fault_tests = 0;

class FaultCountReporter : public ::testing::Environment {
 public:
  void TearDown() override {
    std::printf("[ fault injection ] %lld faults injected across %lld engines\n",
                static_cast<long long>(g_faults_injected), static_cast<long long>(g_fault_tests));
  }
};
const ::testing::Environment* const kReporter =
    ::testing::AddGlobalTestEnvironment(new FaultCountReporter);

// --- the decorator itself ---------------------------------------------------

class FaultInjectingBackendTest : public ::testing::Test {
 protected:
  FaultInjectingBackendTest() {
    auto inner = std::make_unique<ControlledBackend>();
    inner_ = inner.get();
    backend_ = std::make_unique<FaultInjectingBackend>(std::move(inner), /*seed=*/42);
  }
  bool Fails(BackendCall call) {
    switch (call) {
      case BackendCall::kAllocateSegment: {
        absl::StatusOr<std::uintptr_t> segment = backend_->AllocateSegment(2 * kMiB, 0);
        if (segment.ok()) {
          EXPECT_TRUE(inner_->ReleaseSegment(*segment, 2 * kMiB).ok());
        }
        return !segment.ok();
      }
      case BackendCall::kReleaseSegment: {
        // The segment comes from the wrapped backend, so that only the
        // release goes through the decorator.
        const std::uintptr_t segment = *inner_->AllocateSegment(2 * kMiB, 0);
        const absl::Status released = backend_->ReleaseSegment(segment, 2 * kMiB);
        if (!released.ok()) {
          EXPECT_TRUE(inner_->ReleaseSegment(segment, 2 * kMiB).ok());
        }
        return !released.ok();
      }
      case BackendCall::kCapacity:
        return !backend_->Capacity().ok();
      case BackendCall::kCheckSegmentAllocationAllowed:
        return !backend_->CheckSegmentAllocationAllowed(0).ok();
      case BackendCall::kRecordEvent: {
        absl::StatusOr<EventId> event = backend_->RecordEvent(3);
        if (event.ok()) backend_->ReleaseEvent(*event);
        return !event.ok();
      }
      case BackendCall::kQueryEvent:
      case BackendCall::kSynchronizeEvent: {
        const EventId event = *inner_->RecordEvent(3);
        const bool failed = call == BackendCall::kQueryEvent
                                ? !backend_->QueryEvent(event).ok()
                                : !backend_->SynchronizeEvent(event).ok();
        inner_->ReleaseEvent(event);
        return failed;
      }
      // Virtual memory: each call goes through the decorator alone; what it
      // needs (a range, a page, a mapping) comes from the wrapped backend,
      // and everything goes back to it whether the call failed or not.
      case BackendCall::kVirtualMemoryPageSize:
        return !backend_->VirtualMemoryPageSize().ok();
      case BackendCall::kReserveAddressRange: {
        absl::StatusOr<std::uintptr_t> range = backend_->ReserveAddressRange(kRange);
        if (range.ok()) {
          EXPECT_TRUE(inner_->ReleaseAddressRange(*range, kRange).ok());
        }
        return !range.ok();
      }
      case BackendCall::kReleaseAddressRange: {
        const std::uintptr_t range = *inner_->ReserveAddressRange(kRange);
        const absl::Status released = backend_->ReleaseAddressRange(range, kRange);
        if (!released.ok()) {
          EXPECT_TRUE(inner_->ReleaseAddressRange(range, kRange).ok());
        }
        return !released.ok();
      }
      case BackendCall::kCreatePhysicalPage: {
        absl::StatusOr<PhysicalPage> page = backend_->CreatePhysicalPage(kRange);
        if (page.ok()) {
          EXPECT_TRUE(inner_->ReleasePhysicalPage(*page).ok());
        }
        return !page.ok();
      }
      case BackendCall::kReleasePhysicalPage: {
        const PhysicalPage page = *inner_->CreatePhysicalPage(kRange);
        const absl::Status released = backend_->ReleasePhysicalPage(page);
        if (!released.ok()) {
          EXPECT_TRUE(inner_->ReleasePhysicalPage(page).ok());
        }
        return !released.ok();
      }
      case BackendCall::kMapPage:
      case BackendCall::kSetAccess:
      case BackendCall::kUnmapPages: {
        const std::uintptr_t range = *inner_->ReserveAddressRange(kRange);
        const PhysicalPage page = *inner_->CreatePhysicalPage(kRange);
        absl::Status status;
        if (call == BackendCall::kMapPage) {
          status = backend_->MapPage(range, page, kRange);
        } else {
          EXPECT_TRUE(inner_->MapPage(range, page, kRange).ok());
          status = call == BackendCall::kSetAccess
                       ? backend_->SetAccess(range, kRange)
                       : backend_->UnmapPages(range, kRange, /*stream=*/3);
        }
        // Mapped unless the map failed or the unmap succeeded.
        const bool mapped = call == BackendCall::kMapPage      ? status.ok()
                            : call == BackendCall::kUnmapPages ? !status.ok()
                                                               : true;
        if (mapped) {
          EXPECT_TRUE(inner_->UnmapPages(range, kRange, /*stream=*/3).ok());
        }
        EXPECT_TRUE(inner_->ReleasePhysicalPage(page).ok());
        EXPECT_TRUE(inner_->ReleaseAddressRange(range, kRange).ok());
        return !status.ok();
      }
    }
    return false;
  }

  // One page: the smallest range the ControlledBackend reserves.
  static constexpr std::size_t kRange = 2 * kMiB;

  ControlledBackend* inner_;
  std::unique_ptr<FaultInjectingBackend> backend_;
};

TEST_F(FaultInjectingBackendTest, ForwardsEveryCallWhenNothingIsArmed) {
  for (BackendCall call : kAllBackendCalls) {
    EXPECT_FALSE(Fails(call)) << BackendCallName(call);
    EXPECT_EQ(backend_->calls(call), 1) << BackendCallName(call);
    EXPECT_EQ(backend_->failures(call), 0) << BackendCallName(call);
  }
  EXPECT_EQ(backend_->DeviceName(), "test:0");
  EXPECT_EQ(backend_->release_event_calls(), 1);
  EXPECT_EQ(inner_->live_segments(), 0);
  EXPECT_EQ(inner_->live_events(), 0);
  EXPECT_EQ(inner_->live_pages(), 0);
  EXPECT_EQ(inner_->mapped_pages(), 0);
}

TEST_F(FaultInjectingBackendTest, AnyCallFailsOnceWithAnyCode) {
  for (BackendCall call : kAllBackendCalls) {
    for (absl::StatusCode code : {absl::StatusCode::kInternal, absl::StatusCode::kResourceExhausted,
                                  absl::StatusCode::kUnavailable, absl::StatusCode::kAborted}) {
      backend_->FailOnce(call, code);
      EXPECT_TRUE(backend_->armed(call));
      EXPECT_TRUE(Fails(call)) << BackendCallName(call);
      EXPECT_FALSE(backend_->armed(call));
      EXPECT_FALSE(Fails(call)) << BackendCallName(call);
    }
    EXPECT_EQ(backend_->failures(call), 4) << BackendCallName(call);
    EXPECT_EQ(backend_->calls(call), 8) << BackendCallName(call);
  }
  EXPECT_EQ(backend_->total_failures(), 4 * kNumBackendCalls);
}

TEST_F(FaultInjectingBackendTest, InjectedErrorCarriesTheCodeAndNamesTheCallAndTheDevice) {
  backend_->FailOnce(BackendCall::kAllocateSegment, absl::StatusCode::kUnavailable);
  const absl::StatusOr<std::uintptr_t> segment = backend_->AllocateSegment(4 * kMiB, 9);
  EXPECT_TRUE(absl::IsUnavailable(segment.status()));
  const std::string message(segment.status().message());
  EXPECT_TRUE(absl::StrContains(message, "injected failure of AllocateSegment on test:0"))
      << message;
  EXPECT_TRUE(absl::StrContains(message, "size 4194304, stream 0x9")) << message;
  EXPECT_EQ(inner_->live_segments(), 0);  // the wrapped backend never saw it
}

TEST_F(FaultInjectingBackendTest, FailsNTimesAfterKSuccessesThenStops) {
  backend_->FailAfter(BackendCall::kRecordEvent, /*successes=*/2, /*count=*/3);
  std::vector<bool> failed;
  for (int i = 0; i < 7; ++i) failed.push_back(Fails(BackendCall::kRecordEvent));
  EXPECT_EQ(failed, (std::vector<bool>{false, false, true, true, true, false, false}));
  EXPECT_EQ(backend_->failures(BackendCall::kRecordEvent), 3);
  EXPECT_EQ(backend_->calls(BackendCall::kRecordEvent), 7);
}

TEST_F(FaultInjectingBackendTest, FailAlwaysLastsUntilCleared) {
  backend_->FailAlways(BackendCall::kCapacity);
  for (int i = 0; i < 100; ++i) EXPECT_TRUE(Fails(BackendCall::kCapacity));
  backend_->Clear(BackendCall::kCapacity);
  EXPECT_FALSE(Fails(BackendCall::kCapacity));
  backend_->FailAlways(BackendCall::kQueryEvent);
  backend_->FailAlways(BackendCall::kSynchronizeEvent);
  backend_->ClearAll();
  EXPECT_FALSE(Fails(BackendCall::kQueryEvent));
  EXPECT_FALSE(Fails(BackendCall::kSynchronizeEvent));
}

TEST_F(FaultInjectingBackendTest, ArmingAgainReplacesTheFault) {
  backend_->FailAlways(BackendCall::kCheckSegmentAllocationAllowed);
  backend_->FailOnce(BackendCall::kCheckSegmentAllocationAllowed);
  EXPECT_TRUE(Fails(BackendCall::kCheckSegmentAllocationAllowed));
  EXPECT_FALSE(Fails(BackendCall::kCheckSegmentAllocationAllowed));
}

TEST_F(FaultInjectingBackendTest, IntermittentFaultsFollowTheSeed) {
  auto pattern = [](std::uint64_t seed) {
    FaultInjectingBackend backend(std::make_unique<ControlledBackend>(), seed);
    backend.FailWithProbability(BackendCall::kCapacity, 0.3);
    std::vector<bool> failed;
    for (int i = 0; i < 400; ++i) failed.push_back(!backend.Capacity().ok());
    return failed;
  };
  const std::vector<bool> first = pattern(7);
  EXPECT_EQ(pattern(7), first);  // reproducible
  EXPECT_NE(pattern(8), first);
  const auto failures = std::count(first.begin(), first.end(), true);
  EXPECT_GT(failures, 80);  // 0.3 of 400 is 120; far from both ends
  EXPECT_LT(failures, 160);
}

TEST_F(FaultInjectingBackendTest, IntermittentFaultStopsAfterItsCount) {
  backend_->FailWithProbability(BackendCall::kCapacity, 0.5, absl::StatusCode::kInternal,
                                /*count=*/5);
  for (int i = 0; i < 200; ++i) (void)Fails(BackendCall::kCapacity);
  EXPECT_EQ(backend_->failures(BackendCall::kCapacity), 5);
  EXPECT_FALSE(backend_->armed(BackendCall::kCapacity));
}

TEST_F(FaultInjectingBackendTest, InvalidFaultsAreRejected) {
  EXPECT_TRUE(absl::IsInvalidArgument(
      backend_->Arm(BackendCall::kCapacity, FaultSpec{.code = absl::StatusCode::kOk})));
  EXPECT_TRUE(
      absl::IsInvalidArgument(backend_->Arm(BackendCall::kCapacity, FaultSpec{.skip = -1})));
  EXPECT_TRUE(
      absl::IsInvalidArgument(backend_->Arm(BackendCall::kCapacity, FaultSpec{.count = -2})));
  EXPECT_TRUE(
      absl::IsInvalidArgument(backend_->Arm(BackendCall::kCapacity, FaultSpec{.probability = 0})));
  EXPECT_TRUE(absl::IsInvalidArgument(
      backend_->Arm(BackendCall::kCapacity, FaultSpec{.probability = 1.5})));
  EXPECT_FALSE(backend_->armed(BackendCall::kCapacity));
  EXPECT_TRUE(backend_->Arm(BackendCall::kCapacity, FaultSpec{.count = 0}).ok());
  EXPECT_FALSE(backend_->armed(BackendCall::kCapacity));  // zero failures: nothing armed
}

TEST_F(FaultInjectingBackendTest, ControlsAndCallsMayRaceFromManyThreads) {
  constexpr int kThreads = 4;
  constexpr int kCallsPerThread = 2000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([this, t] {
      for (int i = 0; i < kCallsPerThread; ++i) {
        if (t == 0 && i % 100 == 0) backend_->FailWithProbability(BackendCall::kCapacity, 0.5);
        if (t == 1 && i % 150 == 0) backend_->Clear(BackendCall::kCapacity);
        (void)backend_->Capacity();
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(backend_->calls(BackendCall::kCapacity), kThreads * kCallsPerThread);
  EXPECT_EQ(backend_->failures(BackendCall::kCapacity), backend_->total_failures());
}

// --- an engine over a failing backend ---------------------------------------

enum class BackendKind { kHost, kControlled };

std::string KindName(BackendKind kind) {
  return kind == BackendKind::kHost ? "Host" : "Controlled";
}

// An engine over FaultInjectingBackend(HostBackend or ControlledBackend) and
// a shadow model of what its callers hold. Every operation goes through a
// method here that checks its outcome and the pool after it.
class FaultHarness {
 public:
  explicit FaultHarness(BackendKind kind, std::size_t capacity = kCapacity, std::uint64_t seed = 1)
      : kind_(kind) {
    std::unique_ptr<Backend> inner;
    if (kind == BackendKind::kHost) {
      auto host = std::make_unique<HostBackend>(HostBackendOptions{.capacity_bytes = capacity});
      host_ = host.get();
      inner = std::move(host);
    } else {
      auto controlled =
          std::make_unique<ControlledBackend>(ControlledBackendOptions{.capacity_bytes = capacity});
      controlled_ = controlled.get();
      inner = std::move(controlled);
    }
    auto faults = std::make_unique<FaultInjectingBackend>(std::move(inner), seed);
    faults_ = faults.get();
    engine_ = std::make_unique<Engine>(std::move(faults));
    device_ = engine_->DeviceName();
    ++g_fault_tests;
  }
  ~FaultHarness() {
    g_faults_injected += faults_->total_failures();
    faults_->ClearAll();  // so that the engine can return every segment
  }

  FaultInjectingBackend& faults() { return *faults_; }
  Engine& engine() { return *engine_; }
  const std::string& device() const { return device_; }
  BackendKind kind() const { return kind_; }
  std::size_t live_blocks() const { return live_.size(); }
  // When set, every operation must succeed (no fault is armed).
  void set_strict(bool strict) { strict_ = strict; }

  void Arm(BackendCall call, FaultSpec spec) { ASSERT_TRUE(faults_->Arm(call, spec).ok()); }

  absl::StatusOr<void*> Allocate(std::size_t size, StreamId stream = kMain) {
    const Before before = Snapshot();
    absl::StatusOr<void*> ptr = engine_->Allocate(size, stream);
    const std::string what = absl::StrCat("Allocate(", size, ", stream ", stream, ")");
    CheckOutcome(what, ptr.status(), before);
    if (ptr.ok()) {
      const absl::StatusOr<BlockInfo> block = engine_->GetBlock(*ptr);
      EXPECT_TRUE(block.ok()) << what;
      if (!block.ok()) return ptr;
      const auto address = reinterpret_cast<std::uintptr_t>(*ptr);
      auto next = live_.lower_bound(address);
      EXPECT_TRUE(next == live_.end() || next->first >= address + block->size) << what;
      if (next != live_.begin()) {
        auto prev = std::prev(next);
        EXPECT_LE(prev->first + prev->second.size, address) << what << ": overlaps a live block";
      }
      live_[address] = LiveBlock{size, block->size};
      if (kind_ == BackendKind::kHost) {
        // Real memory: the whole requested range is writable.
        static_cast<char*>(*ptr)[0] = 1;
        static_cast<char*>(*ptr)[size - 1] = 2;
      }
    }
    CheckPool(what);
    return ptr;
  }

  void Free(void* ptr) {
    const Before before = Snapshot();
    const absl::Status status = engine_->Free(ptr);
    EXPECT_TRUE(status.ok()) << "a free never fails for a live block: " << status;
    live_.erase(reinterpret_cast<std::uintptr_t>(ptr));
    CheckOutcome("Free", status, before);
    CheckPool("Free");
  }

  void RecordStream(void* ptr, StreamId stream) {
    EXPECT_TRUE(engine_->RecordStream(ptr, stream).ok());
    CheckPool("RecordStream");
  }

  void ProcessEvents() {
    engine_->ProcessEvents();
    CheckPool("ProcessEvents");
  }

  absl::Status EmptyCache() {
    const Before before = Snapshot();
    const absl::Status status = engine_->EmptyCache();
    CheckOutcome("EmptyCache", status, before);
    CheckPool("EmptyCache");
    return status;
  }

  absl::Status SetMemoryFraction(double fraction) {
    const Before before = Snapshot();
    const std::size_t limit = engine_->memory_limit();
    const absl::Status status = engine_->SetMemoryFraction(fraction);
    CheckOutcome("SetMemoryFraction", status, before);
    if (!status.ok()) {
      EXPECT_EQ(engine_->memory_limit(), limit) << "a failed call changed the limit";
    }
    CheckPool("SetMemoryFraction");
    return status;
  }

  // Lets all queued work finish (the host backend's is always finished).
  void CompleteAll() {
    if (controlled_ != nullptr) controlled_->CompleteAll();
  }

  std::size_t BackendBytes() const {
    return host_ != nullptr ? host_->live_bytes() : controlled_->live_segment_bytes();
  }

  // Clears every fault, lets pending blocks finish, frees what is live and
  // checks that every segment (and event) goes back to the backend.
  void RecoverAndReleaseEverything() {
    faults_->ClearAll();
    strict_ = true;
    ProcessEvents();  // records the events that could not be recorded
    CompleteAll();
    ProcessEvents();
    std::vector<std::uintptr_t> live;
    for (const auto& [address, block] : live_) live.push_back(address);
    for (std::uintptr_t address : live) Free(reinterpret_cast<void*>(address));
    CompleteAll();
    ProcessEvents();
    EXPECT_TRUE(EmptyCache().ok());
    const MemoryStats stats = engine_->GetStats();
    EXPECT_EQ(stats.reserved_bytes.all().current, 0);
    EXPECT_EQ(stats.active_bytes.all().current, 0);
    EXPECT_EQ(BackendBytes(), 0u);
    if (controlled_ != nullptr) {
      EXPECT_EQ(controlled_->live_events(), 0);
    }
    const absl::Status merged = engine_->CheckInvariants();
    EXPECT_TRUE(merged.ok()) << merged;
  }

 private:
  struct LiveBlock {
    std::size_t requested;
    std::size_t size;
  };
  struct Before {
    std::array<std::int64_t, kNumBackendCalls> failures;
  };

  Before Snapshot() const {
    Before before;
    for (BackendCall call : kSegmentBackendCalls) {
      before.failures[static_cast<int>(call)] = faults_->failures(call);
    }
    return before;
  }

  // An error must name an injected failure of this operation (call and
  // device) and carry its code, or be an out-of-memory error that a fault
  // caused (memory it kept pending or cached).
  void CheckOutcome(const std::string& what, const absl::Status& status, const Before& before) {
    if (status.ok()) return;
    EXPECT_FALSE(strict_) << what << " failed with no fault armed: " << status;
    const std::string message(status.message());
    bool injected_now = false;
    for (BackendCall call : kSegmentBackendCalls) {
      const int index = static_cast<int>(call);
      if (faults_->failures(call) == before.failures[index]) continue;
      injected_now = true;
      const std::string named =
          absl::StrCat("injected failure of ", BackendCallName(call), " on ", device_);
      if (absl::StrContains(message, named)) {
        // The injected code, unless the fault is quoted as the reason why
        // the out-of-memory retry could not make room.
        const bool out_of_memory = absl::IsResourceExhausted(status) &&
                                   absl::StrContains(message, "out of memory on " + device_);
        if (!out_of_memory) {
          EXPECT_EQ(status.code(), faults_->last_failure(call).code()) << what << ": " << status;
        }
        return;
      }
    }
    EXPECT_TRUE(absl::IsResourceExhausted(status)) << what << ": unexpected error " << status;
    EXPECT_TRUE(absl::StrContains(message, absl::StrCat("out of memory on ", device_)))
        << what << ": " << status;
    const MemoryStats stats = engine_->GetStats();
    const bool pending = stats.active_bytes.all().current > stats.allocated_bytes.all().current;
    EXPECT_TRUE(injected_now || pending)
        << what << ": out of memory although no fault kept memory from being reclaimed: " << status;
  }

  void CheckPool(const std::string& what) {
    const absl::Status matches = testing::CheckEngineMatchesLiveBlocks(*engine_, live_);
    ASSERT_TRUE(matches.ok()) << what << ": " << matches;
    EXPECT_EQ(static_cast<std::size_t>(engine_->GetStats().reserved_bytes.all().current),
              BackendBytes())
        << what << ": the engine and the backend disagree on reserved memory";
  }

  const BackendKind kind_;
  HostBackend* host_ = nullptr;              // owned by faults_, when kind_ is kHost
  ControlledBackend* controlled_ = nullptr;  // owned by faults_, when kind_ is kControlled
  FaultInjectingBackend* faults_;            // owned by engine_
  std::unique_ptr<Engine> engine_;
  std::string device_;
  std::map<std::uintptr_t, LiveBlock> live_;
  bool strict_ = false;
};

// One round of a training-like workload that reaches every backend call:
// a memory fraction (Capacity), new segments (CheckSegmentAllocationAllowed,
// AllocateSegment), blocks used on a side stream (RecordEvent, QueryEvent),
// an allocation that only fits once the out-of-memory retry waited for a
// pending block (SynchronizeEvent) and returned its segment
// (ReleaseSegment), and empty_cache (ReleaseSegment).
void RunWorkload(FaultHarness& h) {
  (void)h.SetMemoryFraction(1.0);
  absl::StatusOr<void*> small = h.Allocate(1000);
  absl::StatusOr<void*> medium = h.Allocate(5 * kMiB);  // a 20 MiB segment
  if (small.ok()) {
    h.RecordStream(*small, kSide);
    h.Free(*small);
  }
  h.ProcessEvents();
  h.CompleteAll();
  h.ProcessEvents();
  absl::StatusOr<void*> reused = h.Allocate(1000);
  if (medium.ok()) {
    h.RecordStream(*medium, kSide);
    h.Free(*medium);  // pending until kSide's work completes
  }
  // 2 + 20 + 44 MiB exceed the 64 MiB device: the retry must wait for the
  // pending medium block and return its segment first.
  absl::StatusOr<void*> large = h.Allocate(44 * kMiB);
  if (reused.ok()) h.Free(*reused);
  if (large.ok()) h.Free(*large);
  h.CompleteAll();
  h.ProcessEvents();
  (void)h.EmptyCache();
}

enum class Pattern { kOnce, kRepeatedly, kIntermittent };

std::string PatternName(Pattern pattern) {
  switch (pattern) {
    case Pattern::kOnce:
      return "Once";
    case Pattern::kRepeatedly:
      return "Repeatedly";
    case Pattern::kIntermittent:
      return "Intermittently";
  }
  return "?";
}

using MatrixParam = std::tuple<BackendKind, BackendCall, Pattern, absl::StatusCode>;

class FaultMatrixTest : public ::testing::TestWithParam<MatrixParam> {};

std::string MatrixTestName(const ::testing::TestParamInfo<MatrixParam>& info) {
  const auto [kind, call, pattern, code] = info.param;
  return absl::StrCat(KindName(kind), "_", BackendCallName(call), "_", PatternName(pattern), "_",
                      code == absl::StatusCode::kInternal ? "Internal" : "OutOfMemory");
}

TEST_P(FaultMatrixTest, EngineReportsTheFaultKeepsItsPoolAndRecovers) {
  const auto [kind, call, pattern, code] = GetParam();
  FaultHarness h(kind, kCapacity, /*seed=*/static_cast<std::uint64_t>(call) * 31 + 5);

  FaultSpec spec{.code = code};
  int rounds = 1;
  switch (pattern) {
    case Pattern::kOnce:
      spec.count = 1;
      break;
    case Pattern::kRepeatedly:
      spec.count = FaultSpec::kUnlimited;
      rounds = 2;
      break;
    case Pattern::kIntermittent:
      spec.count = FaultSpec::kUnlimited;
      spec.probability = 0.5;
      rounds = 4;
      break;
  }
  h.Arm(call, spec);
  if (kind == BackendKind::kHost && call == BackendCall::kSynchronizeEvent) {
    // Host events are complete when queried, so the engine only waits on
    // one (SynchronizeEvent) when its query failed.
    h.Arm(BackendCall::kQueryEvent, FaultSpec{.count = FaultSpec::kUnlimited});
  }
  for (int round = 0; round < rounds; ++round) RunWorkload(h);
  EXPECT_GT(h.faults().failures(call), 0) << "the workload never reached the fault";

  // The fault stops: the same workload succeeds in full, every byte returns.
  h.RecoverAndReleaseEverything();
  RunWorkload(h);
  h.RecoverAndReleaseEverything();
}

INSTANTIATE_TEST_SUITE_P(
    AllCalls, FaultMatrixTest,
    ::testing::Combine(
        ::testing::Values(BackendKind::kHost, BackendKind::kControlled),
        ::testing::ValuesIn(kSegmentBackendCalls),
        ::testing::Values(Pattern::kOnce, Pattern::kRepeatedly, Pattern::kIntermittent),
        ::testing::Values(absl::StatusCode::kInternal, absl::StatusCode::kResourceExhausted)),
    MatrixTestName);

TEST(FaultFreeWorkloadTest, NeedsNoErrorToRunOnEitherBackend) {
  for (BackendKind kind : {BackendKind::kHost, BackendKind::kControlled}) {
    FaultHarness h(kind);
    h.set_strict(true);
    RunWorkload(h);
    RunWorkload(h);
    EXPECT_EQ(h.engine().GetStats().num_alloc_retries, 2) << KindName(kind);
    h.RecoverAndReleaseEverything();
  }
}

// --- named scenarios, on both backends --------------------------------------

class EngineFaultTest : public ::testing::TestWithParam<BackendKind> {
 protected:
  BackendKind kind() const { return GetParam(); }
};

INSTANTIATE_TEST_SUITE_P(Backends, EngineFaultTest,
                         ::testing::Values(BackendKind::kHost, BackendKind::kControlled),
                         [](const ::testing::TestParamInfo<BackendKind>& info) {
                           return KindName(info.param);
                         });

bool Names(const absl::Status& status, const std::string& text) {
  return absl::StrContains(status.message(), text);
}

TEST_P(EngineFaultTest, FailedSegmentAllocationIsReportedAndCachedBlocksAreStillServed) {
  FaultHarness h(kind());
  absl::StatusOr<void*> warm = h.Allocate(4096);  // one cached small segment
  ASSERT_TRUE(warm.ok());
  h.Free(*warm);
  h.faults().FailAlways(BackendCall::kAllocateSegment);
  const absl::StatusOr<void*> fresh = h.Allocate(5 * kMiB);
  EXPECT_TRUE(absl::IsInternal(fresh.status()));
  EXPECT_TRUE(Names(fresh.status(), "injected failure of AllocateSegment on " + h.device()))
      << fresh.status();
  EXPECT_EQ(h.engine().GetStats().num_ooms, 0);  // a device fault is not out of memory
  // The cached segment still serves requests while the device fails.
  for (std::size_t size : {std::size_t{4096}, std::size_t{1000}, kMiB}) {
    absl::StatusOr<void*> cached = h.Allocate(size);
    ASSERT_TRUE(cached.ok()) << cached.status();
    h.Free(*cached);
  }
  EXPECT_EQ(h.engine().GetStats().num_device_alloc, 1);
  h.faults().Clear(BackendCall::kAllocateSegment);
  absl::StatusOr<void*> later = h.Allocate(5 * kMiB);
  EXPECT_TRUE(later.ok()) << later.status();
  h.RecoverAndReleaseEverything();
}

TEST_P(EngineFaultTest, SegmentAllocationFailingDuringTheOutOfMemoryRetry) {
  FaultHarness h(kind(), /*capacity=*/40 * kMiB);
  absl::StatusOr<void*> cached = h.Allocate(5 * kMiB);  // a 20 MiB segment, then cached
  ASSERT_TRUE(cached.ok());
  h.Free(*cached);
  // 30 MiB needs its own segment: the device is full (20 + 30 > 40), the
  // retry returns the cached segment, and the second attempt hits the fault.
  h.faults().FailAfter(BackendCall::kAllocateSegment, /*successes=*/1);
  const absl::StatusOr<void*> large = h.Allocate(30 * kMiB);
  EXPECT_TRUE(absl::IsInternal(large.status())) << large.status();
  EXPECT_TRUE(Names(large.status(), "injected failure of AllocateSegment on " + h.device()))
      << large.status();
  MemoryStats stats = h.engine().GetStats();
  EXPECT_EQ(stats.num_alloc_retries, 1);
  EXPECT_EQ(stats.num_ooms, 0);
  EXPECT_EQ(stats.reserved_bytes.all().current, 0);  // the cache went back before the retry
  EXPECT_EQ(h.faults().calls(BackendCall::kAllocateSegment), 3);

  // The same failure as out of memory: the retry's error says what happened.
  h.faults().FailAfter(BackendCall::kAllocateSegment, /*successes=*/0, /*count=*/2,
                       absl::StatusCode::kResourceExhausted);
  const absl::StatusOr<void*> again = h.Allocate(30 * kMiB);
  EXPECT_TRUE(absl::IsResourceExhausted(again.status()));
  EXPECT_TRUE(Names(again.status(), "out of memory on " + h.device())) << again.status();
  EXPECT_TRUE(Names(again.status(), "injected failure of AllocateSegment on " + h.device()))
      << again.status();
  stats = h.engine().GetStats();
  EXPECT_EQ(stats.num_alloc_retries, 2);
  EXPECT_EQ(stats.num_ooms, 1);

  absl::StatusOr<void*> later = h.Allocate(30 * kMiB);  // the fault stopped
  EXPECT_TRUE(later.ok()) << later.status();
  h.RecoverAndReleaseEverything();
}

TEST_P(EngineFaultTest, ReleaseFailingOnceInsideEmptyCacheKeepsOneSegmentAndFreesTheOthers) {
  FaultHarness h(kind());
  std::vector<void*> blocks;
  for (std::size_t size : {std::size_t{4096}, 5 * kMiB, 24 * kMiB}) {  // 2 + 20 + 24 MiB
    absl::StatusOr<void*> ptr = h.Allocate(size);
    ASSERT_TRUE(ptr.ok());
    blocks.push_back(*ptr);
  }
  for (void* ptr : blocks) h.Free(ptr);
  h.faults().FailOnce(BackendCall::kReleaseSegment);
  const absl::Status emptied = h.EmptyCache();
  EXPECT_TRUE(absl::IsInternal(emptied));
  EXPECT_TRUE(Names(emptied, "injected failure of ReleaseSegment on " + h.device())) << emptied;
  EXPECT_TRUE(Names(emptied, "stays cached")) << emptied;
  // Every segment was tried; the one that failed stays, whole and reusable.
  EXPECT_EQ(h.faults().calls(BackendCall::kReleaseSegment), 3);
  const MemoryStats stats = h.engine().GetStats();
  EXPECT_EQ(stats.segment.all().current, 1);
  EXPECT_EQ(stats.num_device_free, 2);
  EXPECT_TRUE(h.EmptyCache().ok());
  EXPECT_EQ(h.engine().GetStats().segment.all().current, 0);
  h.RecoverAndReleaseEverything();
}

TEST_P(EngineFaultTest, ReleaseFailingRepeatedlyKeepsTheCacheServing) {
  FaultHarness h(kind());
  absl::StatusOr<void*> small = h.Allocate(4096);
  absl::StatusOr<void*> medium = h.Allocate(5 * kMiB);
  ASSERT_TRUE(small.ok() && medium.ok());
  h.Free(*small);
  h.Free(*medium);
  h.faults().FailAlways(BackendCall::kReleaseSegment, absl::StatusCode::kUnavailable);
  for (int attempt = 0; attempt < 3; ++attempt) {
    const absl::Status emptied = h.EmptyCache();
    EXPECT_TRUE(absl::IsUnavailable(emptied)) << emptied;
    EXPECT_TRUE(Names(emptied, "injected failure of ReleaseSegment on " + h.device())) << emptied;
    EXPECT_EQ(h.engine().GetStats().segment.all().current, 2);
  }
  const std::int64_t device_allocs = h.engine().GetStats().num_device_alloc;
  absl::StatusOr<void*> from_cache = h.Allocate(3 * kMiB);
  ASSERT_TRUE(from_cache.ok()) << from_cache.status();
  EXPECT_EQ(h.engine().GetStats().num_device_alloc, device_allocs);
  h.Free(*from_cache);
  h.faults().Clear(BackendCall::kReleaseSegment);
  EXPECT_TRUE(h.EmptyCache().ok());
  h.RecoverAndReleaseEverything();
}

TEST_P(EngineFaultTest, ReleaseFailingIntermittentlyEmptiesTheCacheEventually) {
  FaultHarness h(kind(), kCapacity, /*seed=*/3);
  std::vector<void*> blocks;
  for (int i = 0; i < 6; ++i) {  // six 2 MiB small segments
    absl::StatusOr<void*> ptr = h.Allocate(kMiB);
    ASSERT_TRUE(ptr.ok());
    blocks.push_back(*ptr);
    absl::StatusOr<void*> filler = h.Allocate(kMiB);
    ASSERT_TRUE(filler.ok());
    blocks.push_back(*filler);
  }
  for (void* ptr : blocks) h.Free(ptr);
  h.faults().FailWithProbability(BackendCall::kReleaseSegment, 0.5);
  int attempts = 0;
  while (h.engine().GetStats().segment.all().current > 0 && attempts < 64) {
    ++attempts;
    const absl::Status emptied = h.EmptyCache();
    if (!emptied.ok()) {
      EXPECT_TRUE(Names(emptied, "injected failure of ReleaseSegment on " + h.device()));
    }
  }
  EXPECT_EQ(h.engine().GetStats().segment.all().current, 0);
  EXPECT_GT(h.faults().failures(BackendCall::kReleaseSegment), 0);
  EXPECT_EQ(h.engine().GetStats().num_device_free, 6);
  h.RecoverAndReleaseEverything();
}

TEST_P(EngineFaultTest, ReleaseFailingInsideTheRetryEndsInAnErrorThatSaysSo) {
  FaultHarness h(kind(), /*capacity=*/40 * kMiB);
  absl::StatusOr<void*> cached = h.Allocate(5 * kMiB);  // a 20 MiB segment, then cached
  ASSERT_TRUE(cached.ok());
  h.Free(*cached);
  h.faults().FailOnce(BackendCall::kReleaseSegment);
  const absl::StatusOr<void*> large = h.Allocate(30 * kMiB);
  EXPECT_TRUE(absl::IsResourceExhausted(large.status()));
  EXPECT_TRUE(Names(large.status(), "out of memory on " + h.device())) << large.status();
  // Without this the message would blame a full device while 20 MiB sit in
  // the cache: it must say that returning them failed, and why.
  EXPECT_TRUE(Names(large.status(), "injected failure of ReleaseSegment on " + h.device()))
      << large.status();
  MemoryStats stats = h.engine().GetStats();
  EXPECT_EQ(stats.num_alloc_retries, 1);
  EXPECT_EQ(stats.num_ooms, 1);
  EXPECT_EQ(stats.reserved_bytes.all().current, static_cast<std::int64_t>(20 * kMiB));
  // The segment that stayed still serves what fits in it...
  absl::StatusOr<void*> fits = h.Allocate(8 * kMiB);
  ASSERT_TRUE(fits.ok()) << fits.status();
  EXPECT_EQ(h.engine().GetStats().num_device_alloc, 1);
  h.Free(*fits);
  // ...and once releases work again, the retry makes room.
  absl::StatusOr<void*> later = h.Allocate(30 * kMiB);
  EXPECT_TRUE(later.ok()) << later.status();
  h.RecoverAndReleaseEverything();
}

TEST_P(EngineFaultTest, FailedEventRecordKeepsTheBlockPendingNotLeakedUntilItSucceeds) {
  FaultHarness h(kind());
  const ScopeId scope = OpenScope();
  absl::StatusOr<void*> ptr = h.Allocate(4096);
  ASSERT_TRUE(ptr.ok());
  h.RecordStream(*ptr, kSide);
  h.faults().FailAlways(BackendCall::kRecordEvent);
  h.Free(*ptr);
  for (int i = 0; i < 3; ++i) {
    h.CompleteAll();
    h.ProcessEvents();  // each retry of the record fails
    EXPECT_EQ(h.engine().GetStats().active_bytes.all().current, 4096);
  }
  // The block's segment cannot go back, other requests are still served.
  EXPECT_TRUE(h.EmptyCache().ok());
  EXPECT_EQ(h.engine().GetStats().segment.all().current, 1);
  absl::StatusOr<void*> other = h.Allocate(4096);
  ASSERT_TRUE(other.ok());
  EXPECT_NE(*other, *ptr);
  h.Free(*other);
  // A leak check sees it as pending, not leaked.
  absl::StatusOr<std::vector<ScopeSurvivors>> closed = CloseLeakScope(scope);
  ASSERT_TRUE(closed.ok());
  for (const ScopeSurvivors& survivors : *closed) {
    if (survivors.device != h.device()) continue;
    EXPECT_TRUE(survivors.allocated.empty());
    ASSERT_EQ(survivors.pending.size(), 1u);
    EXPECT_EQ(survivors.pending[0].address, reinterpret_cast<std::uintptr_t>(*ptr));
  }
  h.faults().Clear(BackendCall::kRecordEvent);
  h.ProcessEvents();  // recorded now
  h.CompleteAll();
  h.ProcessEvents();
  EXPECT_EQ(h.engine().GetStats().active_bytes.all().current, 0);
  EXPECT_GE(h.faults().failures(BackendCall::kRecordEvent), 4);
  h.RecoverAndReleaseEverything();
}

TEST_P(EngineFaultTest, FailedEventQueriesWaitForTheEventSoNothingStaysPinned) {
  FaultHarness h(kind(), /*capacity=*/40 * kMiB);
  absl::StatusOr<void*> medium = h.Allocate(5 * kMiB);
  ASSERT_TRUE(medium.ok());
  h.RecordStream(*medium, kSide);
  h.faults().FailAlways(BackendCall::kQueryEvent);
  h.Free(*medium);
  // The side stream's work is still queued: a failing query is no answer,
  // so the engine waits for the event instead of leaving the block pending.
  h.ProcessEvents();
  EXPECT_EQ(h.engine().GetStats().active_bytes.all().current, 0);
  EXPECT_EQ(h.engine().GetEventHealth().event_query_errors, 1);
  EXPECT_EQ(h.engine().GetEventHealth().streams_with_events, 0);
  EXPECT_TRUE(h.EmptyCache().ok());
  EXPECT_EQ(h.engine().GetStats().segment.all().current, 0);
  EXPECT_GT(h.faults().failures(BackendCall::kQueryEvent), 0);
  h.RecoverAndReleaseEverything();
}

TEST_P(EngineFaultTest, EventBrokenBothWaysFailsTheAllocationAndKeepsTheBlock) {
  FaultHarness h(kind(), /*capacity=*/40 * kMiB);
  absl::StatusOr<void*> medium = h.Allocate(5 * kMiB);
  ASSERT_TRUE(medium.ok());
  h.RecordStream(*medium, kSide);
  h.faults().FailAlways(BackendCall::kQueryEvent);
  h.Free(*medium);
  h.faults().FailOnce(BackendCall::kSynchronizeEvent);
  // The device answers neither the query nor the wait for this event: the
  // side stream may still use the block, so it is not reused and the
  // allocation reports the error (not an out-of-memory).
  absl::StatusOr<void*> large = h.Allocate(30 * kMiB);
  ASSERT_FALSE(large.ok());
  EXPECT_FALSE(absl::IsResourceExhausted(large.status())) << large.status();
  EXPECT_EQ(h.engine().GetEventHealth().event_sync_errors, 1);
  EXPECT_EQ(h.engine().GetEventHealth().outstanding_events, 1);
  // Once waiting works again, so does the allocation.
  large = h.Allocate(30 * kMiB);
  ASSERT_TRUE(large.ok()) << large.status();
  const EventHealth health = h.engine().GetEventHealth();
  EXPECT_EQ(health.event_sync_errors, 1);
  EXPECT_EQ(health.outstanding_events, 0);
  h.Free(*large);
  h.RecoverAndReleaseEverything();
}

TEST_P(EngineFaultTest, CapacityFailingForSetMemoryFractionKeepsTheLimit) {
  FaultHarness h(kind());
  h.engine().SetMemoryLimit(20 * kMiB);
  h.faults().FailOnce(BackendCall::kCapacity, absl::StatusCode::kUnavailable);
  const absl::Status once = h.SetMemoryFraction(0.5);
  EXPECT_TRUE(absl::IsUnavailable(once));
  EXPECT_TRUE(Names(once, "injected failure of Capacity on " + h.device())) << once;
  EXPECT_EQ(h.engine().memory_limit(), 20 * kMiB);
  h.faults().FailAlways(BackendCall::kCapacity);
  for (double fraction : {0.25, 0.5, 1.0}) {
    EXPECT_TRUE(absl::IsInternal(h.SetMemoryFraction(fraction)));
    EXPECT_EQ(h.engine().memory_limit(), 20 * kMiB);
  }
  // Allocation does not need the capacity, even at the limit's edge.
  absl::StatusOr<void*> ptr = h.Allocate(5 * kMiB);
  ASSERT_TRUE(ptr.ok()) << ptr.status();
  h.Free(*ptr);
  h.faults().Clear(BackendCall::kCapacity);
  EXPECT_TRUE(h.SetMemoryFraction(0.5).ok());
  EXPECT_EQ(h.engine().memory_limit(), kCapacity / 2);
  h.RecoverAndReleaseEverything();
}

TEST_P(EngineFaultTest, CapacityFailingWhileReportingOutOfMemoryStillReports) {
  FaultHarness h(kind(), /*capacity=*/8 * kMiB);
  h.faults().FailAlways(BackendCall::kCapacity);
  const absl::StatusOr<void*> big = h.Allocate(16 * kMiB);
  EXPECT_TRUE(absl::IsResourceExhausted(big.status()));
  EXPECT_TRUE(Names(big.status(), "out of memory on " + h.device())) << big.status();
  EXPECT_TRUE(Names(big.status(), "limit: none set")) << big.status();
  EXPECT_EQ(h.engine().GetStats().num_ooms, 1);
  h.RecoverAndReleaseEverything();
}

TEST_P(EngineFaultTest, RefusedSegmentAllocationIsReportedAndCachedBlocksAreStillServed) {
  FaultHarness h(kind());
  absl::StatusOr<void*> warm = h.Allocate(4096, kSide);
  ASSERT_TRUE(warm.ok());
  h.Free(*warm);
  h.faults().FailAlways(BackendCall::kCheckSegmentAllocationAllowed,
                        absl::StatusCode::kFailedPrecondition);
  const absl::StatusOr<void*> fresh = h.Allocate(4096, kMain);  // kMain has no cached segment
  EXPECT_TRUE(absl::IsFailedPrecondition(fresh.status()));
  EXPECT_TRUE(
      Names(fresh.status(), "injected failure of CheckSegmentAllocationAllowed on " + h.device()))
      << fresh.status();
  EXPECT_EQ(h.faults().calls(BackendCall::kAllocateSegment), 1);  // never asked for memory
  absl::StatusOr<void*> cached = h.Allocate(4096, kSide);
  ASSERT_TRUE(cached.ok()) << cached.status();
  h.Free(*cached);
  h.faults().Clear(BackendCall::kCheckSegmentAllocationAllowed);
  absl::StatusOr<void*> later = h.Allocate(4096, kMain);
  EXPECT_TRUE(later.ok()) << later.status();
  h.RecoverAndReleaseEverything();
}

// Every call failing at random at once, over a long seeded run: the pool
// survives and everything comes back when the faults stop.
TEST_P(EngineFaultTest, EveryCallFailingAtRandomOverALongRun) {
  FaultHarness h(kind(), kCapacity, /*seed=*/2024);
  for (BackendCall call : kSegmentBackendCalls) {
    h.Arm(call, FaultSpec{.code = call == BackendCall::kAllocateSegment
                                      ? absl::StatusCode::kResourceExhausted
                                      : absl::StatusCode::kInternal,
                          .count = FaultSpec::kUnlimited,
                          .probability = 0.25});
  }
  for (int round = 0; round < 60; ++round) RunWorkload(h);
  for (BackendCall call : kSegmentBackendCalls) {
    EXPECT_GT(h.faults().failures(call), 0) << BackendCallName(call);
  }
  h.RecoverAndReleaseEverything();
}

// --- regressions found by the engine fuzzer (tests/fuzz) --------------------

// A fraction so small that fraction * capacity truncates to 0 bytes set the
// limit to 0, which means "no limit": the opposite of what was asked.
TEST(MemoryFractionRegressionTest, TinyFractionStillSetsALimit) {
  FaultHarness h(BackendKind::kControlled, /*capacity=*/kGiB);
  ASSERT_TRUE(h.SetMemoryFraction(4.9e-324).ok());  // the fuzzer's input
  EXPECT_NE(h.engine().memory_limit(), 0u);
  const absl::StatusOr<void*> ptr = h.engine().Allocate(512);
  EXPECT_TRUE(absl::IsResourceExhausted(ptr.status())) << ptr.status();
  if (ptr.ok()) {
    EXPECT_TRUE(h.engine().Free(*ptr).ok());
  }
  h.RecoverAndReleaseEverything();
}

// fraction * capacity is a double; converting one at or above 2^64 to
// size_t is undefined behaviour (UBSan: float-cast-overflow).
TEST(MemoryFractionRegressionTest, FractionOfAHugeCapacityDoesNotOverflow) {
  auto backend = std::make_unique<ControlledBackend>(
      ControlledBackendOptions{.capacity_bytes = std::numeric_limits<std::size_t>::max()});
  Engine engine(std::move(backend));
  ASSERT_TRUE(engine.SetMemoryFraction(1.0).ok());
  EXPECT_EQ(engine.memory_limit(), std::numeric_limits<std::size_t>::max());
  ASSERT_TRUE(engine.SetMemoryFraction(0.5).ok());
  EXPECT_EQ(engine.memory_limit(), std::size_t{1} << 63);
}

}  // namespace
}  // namespace torchmem
