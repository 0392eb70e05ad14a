// Fault injection into the CUDA runtime under an engine over CudaBackend, on
// the simulated CUDA device (tests/simcuda, preloaded by CTest; see
// tests/cpp/CMakeLists.txt).
//
// Each runtime call the backend makes (cudaMalloc, cudaFree,
// cudaEventCreateWithFlags, cudaEventRecord, cudaEventQuery,
// cudaEventSynchronize, cudaGetDeviceProperties, cudaStreamIsCapturing, cudaSetDevice)
// fails once and repeatedly through the simulated device's own fault
// injection. After every engine operation:
//   - an error names the failed CUDA call and the device; the only other
//     error allowed is running out of memory because a fault kept memory
//     from being reclaimed;
//   - no CUDA error is left behind for PyTorch's next check
//     (cudaGetLastError() == cudaSuccess) and the current device is unchanged;
//   - statistics equal a model of the live blocks, reserved memory equals the
//     device's own count, and CheckInvariants() passes;
// and once the fault stops, the same requests succeed and every byte returns.
#include <cuda.h>
#include <cuda_runtime_api.h>

#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/cpp/support/live_block_model.h"
#include "tests/cpp/support/simcuda_api.h"
#include "torchmem/backends/cuda_backend.h"
#include "torchmem/core/engine.h"

namespace torchmem {
namespace {

using testing::SimCuda;

constexpr int kManualEvents = testing::kSimCudaManualEvents;
constexpr unsigned long long kForever = 1ull << 40;
constexpr std::size_t kDeviceCapacity = 64 * kMiB;

// Faults armed by all the tests of this file, reported at the end.
std::int64_t g_faults_armed = 0;

class FaultCountReporter : public ::testing::Environment {
 public:
  void TearDown() override {
    std::printf("[ fault injection ] %lld CUDA faults armed\n",
                static_cast<long long>(g_faults_armed));
  }
};
const ::testing::Environment* const kReporter =
    ::testing::AddGlobalTestEnvironment(new FaultCountReporter);

// An engine over CudaBackend(device) on the simulated device, with the
// current device kept at 0 (so that a backend on device 1 switches devices
// for every call, as when PyTorch allocates for another GPU), a side stream
// on the backend's device, and a model of the live blocks. Every operation
// goes through a method here that checks its outcome and the pool.
class CudaFaultTest : public ::testing::Test {
 public:
  void SetUp() override {
    ASSERT_NE(sim().reset, nullptr);
    sim().reset();
    int count = 0;
    ASSERT_EQ(cudaGetDeviceCount(&count), cudaSuccess);
    ASSERT_GE(count, 2) << "ctest runs this with SIMCUDA_DEVICE_COUNT=2";
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  }

  void TearDown() override {
    sim().clear_faults();
    if (engine_ != nullptr) {
      EXPECT_EQ(sim().live_bytes(device_), baseline_bytes_ + Reserved());
      engine_.reset();
      EXPECT_EQ(sim().live_bytes(device_), baseline_bytes_) << "the engine leaked device memory";
    }
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
    if (side_ != nullptr) {
      EXPECT_EQ(cudaStreamDestroy(side_), cudaSuccess);
    }
    sim().reset();
  }

  const SimCuda& sim() { return SimCuda::Get(); }

  // Builds the engine over `device` with a 64 MiB device and manual events,
  // placing blocks in virtual-memory ranges if `placement` says so.
  void StartEngine(int device, Placement placement = Placement::kPyTorch) {
    device_ = device;
    device_name_ = absl::StrCat("cuda:", device);
    ASSERT_EQ(sim().set_memory_capacity(device, kDeviceCapacity), 0);
    ASSERT_EQ(sim().set_event_mode(kManualEvents), 0);
    ASSERT_EQ(cudaSetDevice(device), cudaSuccess);
    ASSERT_EQ(cudaStreamCreate(&side_), cudaSuccess);
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
    baseline_bytes_ = sim().live_bytes(device);
    engine_ = std::make_unique<Engine>(std::make_unique<CudaBackend>(device));
    ASSERT_TRUE(engine_->SetPlacement(placement).ok());
  }

  StreamId side() const { return reinterpret_cast<StreamId>(side_); }

  // Arms a fault of `call`: after `skip` successes, `count` calls fail.
  void Inject(const char* call, unsigned long long count, cudaError_t error,
              unsigned long long skip = 0) {
    ASSERT_EQ(sim().inject_fault(call, skip, count, error), 0) << call;
    ++g_faults_armed;
  }

  absl::StatusOr<void*> Allocate(std::size_t size, StreamId stream = 0) {
    absl::StatusOr<void*> ptr = engine_->Allocate(size, stream);
    const std::string what = absl::StrCat("Allocate(", size, ")");
    CheckOutcome(what, ptr.status());
    if (ptr.ok()) {
      const absl::StatusOr<BlockInfo> block = engine_->GetBlock(*ptr);
      EXPECT_TRUE(block.ok());
      if (block.ok()) live_[reinterpret_cast<std::uintptr_t>(*ptr)] = {size, block->size};
    }
    CheckPool(what);
    return ptr;
  }

  void Free(void* ptr) {
    const absl::Status status = engine_->Free(ptr);
    EXPECT_TRUE(status.ok()) << "a free never fails for a live block: " << status;
    live_.erase(reinterpret_cast<std::uintptr_t>(ptr));
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
    const absl::Status status = engine_->EmptyCache();
    CheckOutcome("EmptyCache", status);
    CheckPool("EmptyCache");
    return status;
  }

  absl::Status SetMemoryFraction(double fraction) {
    const std::size_t limit = engine_->memory_limit();
    const absl::Status status = engine_->SetMemoryFraction(fraction);
    CheckOutcome("SetMemoryFraction", status);
    if (!status.ok()) {
      EXPECT_EQ(engine_->memory_limit(), limit) << "a failed call changed the limit";
    }
    CheckPool("SetMemoryFraction");
    return status;
  }

  void CompleteAll() { ASSERT_EQ(sim().complete_all(), 0); }

  std::int64_t Reserved() const { return engine_->GetStats().reserved_bytes.all().current; }
  std::int64_t Pending() const {
    const MemoryStats stats = engine_->GetStats();
    return stats.active_bytes.all().current - stats.allocated_bytes.all().current;
  }

  // One case of the fault matrices: an engine on device 1 (so that
  // cudaSetDevice is called around every call) runs the workload with `call`
  // failing once or every time, reports the fault, recovers, and then runs
  // the workload again with no fault armed, every operation succeeding.
  void RunWorkloadThroughTheFaultThenRecover(const char* call, cudaError_t error, bool repeatedly,
                                             Placement placement) {
    StartEngine(/*device=*/1, placement);
    const unsigned long long before = sim().call_count(call);
    Inject(call, repeatedly ? kForever : 1, error);
    ExpectFaultOf(call);
    RunWorkload();
    if (repeatedly) RunWorkload();
    EXPECT_GT(sim().call_count(call), before) << "the workload never reached the fault";

    RecoverAndReleaseEverything();
    RunWorkload();
    RecoverAndReleaseEverything();
  }

  // The fault named in errors: set by the test before it runs operations.
  void ExpectFaultOf(std::string call) { armed_call_ = std::move(call); }

  // Clears the faults, lets all work finish, frees everything and checks
  // that every segment went back to the device.
  void RecoverAndReleaseEverything() {
    sim().clear_faults();
    armed_call_.clear();
    ProcessEvents();  // records the events that could not be recorded
    CompleteAll();
    ProcessEvents();
    std::vector<std::uintptr_t> live;
    for (const auto& [address, block] : live_) live.push_back(address);
    for (std::uintptr_t address : live) Free(reinterpret_cast<void*>(address));
    CompleteAll();
    ProcessEvents();
    EXPECT_TRUE(EmptyCache().ok());
    EXPECT_EQ(Reserved(), 0);
    EXPECT_EQ(Pending(), 0);
    EXPECT_EQ(sim().live_bytes(device_), baseline_bytes_);
  }

  // A round of a training-like workload that makes every runtime call the
  // backend uses: cudaGetDeviceProperties (a memory fraction), cudaStreamIsCapturing
  // and cudaMalloc (new segments), cudaEventCreateWithFlags, cudaEventRecord
  // and cudaEventQuery (blocks used on a side stream), cudaEventSynchronize
  // and cudaFree (an allocation that only fits after the out-of-memory retry
  // waited for a pending block and freed its segment), cudaFree
  // (empty_cache), and cudaSetDevice around all of them when the backend's
  // device is not the current one.
  void RunWorkload() {
    (void)SetMemoryFraction(1.0);
    absl::StatusOr<void*> small = Allocate(1000);
    absl::StatusOr<void*> medium = Allocate(5 * kMiB);  // a 20 MiB segment
    if (small.ok()) {
      RecordStream(*small, side());
      Free(*small);
    }
    ProcessEvents();
    CompleteAll();
    ProcessEvents();
    absl::StatusOr<void*> reused = Allocate(1000);
    if (medium.ok()) {
      RecordStream(*medium, side());
      Free(*medium);  // pending until the side stream's work completes
    }
    // 2 + 20 + 44 MiB exceed the 64 MiB device: the retry must wait for the
    // pending medium block and free its segment first.
    absl::StatusOr<void*> large = Allocate(44 * kMiB);
    if (reused.ok()) Free(*reused);
    if (large.ok()) Free(*large);
    CompleteAll();
    ProcessEvents();
    (void)EmptyCache();
  }

 protected:
  int device_ = 0;
  std::string device_name_;
  std::unique_ptr<Engine> engine_;

 private:
  struct LiveBlock {
    std::size_t requested;
    std::size_t size;
  };

  // An error names the armed call and the device, or is an out-of-memory
  // error while a fault held memory (pending blocks, or cached segments
  // that could not be freed).
  void CheckOutcome(const std::string& what, const absl::Status& status) {
    if (status.ok()) return;
    const std::string message(status.message());
    EXPECT_FALSE(armed_call_.empty()) << what << " failed with no fault armed: " << status;
    const bool names_fault = !armed_call_.empty() && absl::StrContains(message, armed_call_) &&
                             absl::StrContains(message, device_name_);
    if (names_fault) return;
    EXPECT_TRUE(absl::IsResourceExhausted(status)) << what << ": unexpected error " << status;
    EXPECT_TRUE(absl::StrContains(message, "out of memory on " + device_name_))
        << what << ": " << status;
  }

  void CheckPool(const std::string& what) {
    EXPECT_EQ(cudaGetLastError(), cudaSuccess) << what << " left a CUDA error behind";
    int current = -1;
    EXPECT_EQ(cudaGetDevice(&current), cudaSuccess);
    EXPECT_EQ(current, 0) << what << " changed the current device";
    const absl::Status matches = testing::CheckEngineMatchesLiveBlocks(*engine_, live_);
    ASSERT_TRUE(matches.ok()) << what << ": " << matches;
    EXPECT_EQ(sim().live_bytes(device_), baseline_bytes_ + Reserved())
        << what << ": the engine and the device disagree on reserved memory";
  }

  cudaStream_t side_ = nullptr;
  unsigned long long baseline_bytes_ = 0;
  std::map<std::uintptr_t, LiveBlock> live_;
  std::string armed_call_;
};

// --- every call, once and repeatedly ----------------------------------------

struct CudaFault {
  const char* call;
  cudaError_t error;
};

using CudaMatrixParam = std::tuple<CudaFault, bool>;  // (fault, repeatedly)

class CudaFaultMatrix : public CudaFaultTest,
                        public ::testing::WithParamInterface<CudaMatrixParam> {};

TEST_P(CudaFaultMatrix, EngineReportsTheFaultKeepsItsPoolAndRecovers) {
  const auto [fault, repeatedly] = GetParam();
  RunWorkloadThroughTheFaultThenRecover(fault.call, fault.error, repeatedly, Placement::kPyTorch);
}

const CudaFault kCudaFaults[] = {
    {"cudaMalloc", cudaErrorLaunchFailure},
    {"cudaMalloc", cudaErrorMemoryAllocation},
    {"cudaFree", cudaErrorLaunchFailure},
    {"cudaEventCreateWithFlags", cudaErrorLaunchFailure},
    {"cudaEventRecord", cudaErrorLaunchFailure},
    {"cudaEventQuery", cudaErrorLaunchFailure},
    {"cudaEventSynchronize", cudaErrorLaunchFailure},
    {"cudaGetDeviceProperties", cudaErrorLaunchFailure},
    {"cudaStreamIsCapturing", cudaErrorStreamCaptureUnsupported},
    {"cudaSetDevice", cudaErrorInvalidDevice},
};

std::string CudaMatrixName(const ::testing::TestParamInfo<CudaMatrixParam>& info) {
  const auto [fault, repeatedly] = info.param;
  return absl::StrCat(fault.call, "_", cudaGetErrorName(fault.error), "_",
                      repeatedly ? "Repeatedly" : "Once");
}

INSTANTIATE_TEST_SUITE_P(AllCalls, CudaFaultMatrix,
                         ::testing::Combine(::testing::ValuesIn(kCudaFaults), ::testing::Bool()),
                         CudaMatrixName);

// The same with the virtual-memory placement (expandable segments): every
// driver call of the CUDA backend's VMM path, and the stream synchronisation
// that precedes an unmap. A page's handle is stolen (unmap) when the 44 MiB
// block needs pages and cached ones exist, and EmptyCache unmaps and frees.
class CudaVmmFaultMatrix : public CudaFaultTest,
                           public ::testing::WithParamInterface<CudaMatrixParam> {};

TEST_P(CudaVmmFaultMatrix, EngineReportsTheFaultKeepsItsPagesAndRecovers) {
  const auto [fault, repeatedly] = GetParam();
  RunWorkloadThroughTheFaultThenRecover(fault.call, fault.error, repeatedly,
                                        Placement::kVirtualMemory);
  EXPECT_EQ(engine_->GetStats().vmm.lost_pages, 0);
}

const CudaFault kCudaVmmFaults[] = {
    {"cuMemAddressReserve", static_cast<cudaError_t>(CUDA_ERROR_OUT_OF_MEMORY)},
    {"cuMemCreate", static_cast<cudaError_t>(CUDA_ERROR_OUT_OF_MEMORY)},
    {"cuMemCreate", static_cast<cudaError_t>(CUDA_ERROR_UNKNOWN)},
    {"cuMemMap", static_cast<cudaError_t>(CUDA_ERROR_INVALID_VALUE)},
    {"cuMemSetAccess", static_cast<cudaError_t>(CUDA_ERROR_UNKNOWN)},
    {"cuMemUnmap", static_cast<cudaError_t>(CUDA_ERROR_UNKNOWN)},
    {"cudaStreamSynchronize", cudaErrorLaunchFailure},
};

std::string CudaVmmMatrixName(const ::testing::TestParamInfo<CudaMatrixParam>& info) {
  const auto [fault, repeatedly] = info.param;
  return absl::StrCat(fault.call, "_", static_cast<int>(fault.error), "_",
                      repeatedly ? "Repeatedly" : "Once");
}

INSTANTIATE_TEST_SUITE_P(VmmCalls, CudaVmmFaultMatrix,
                         ::testing::Combine(::testing::ValuesIn(kCudaVmmFaults), ::testing::Bool()),
                         CudaVmmMatrixName);

TEST_F(CudaFaultTest, WorkloadNeedsNoErrorWithoutFaults) {
  StartEngine(/*device=*/1);
  RunWorkload();
  RunWorkload();
  EXPECT_EQ(engine_->GetStats().num_alloc_retries, 2);
  RecoverAndReleaseEverything();
}

// --- named scenarios ----------------------------------------------------------

bool Names(const absl::Status& status, const std::string& text) {
  return absl::StrContains(status.message(), text);
}

TEST_F(CudaFaultTest, CudaMallocFailingOnceIsReportedAndTheNextAllocationSucceeds) {
  StartEngine(0);
  Inject("cudaMalloc", 1, cudaErrorLaunchFailure);
  ExpectFaultOf("cudaMalloc");
  const absl::StatusOr<void*> failed = Allocate(4096);
  EXPECT_TRUE(absl::IsInternal(failed.status()));
  EXPECT_TRUE(Names(failed.status(),
                    "cudaMalloc(2.00 MiB) on cuda:0 failed: "
                    "cudaErrorLaunchFailure"))
      << failed.status();
  EXPECT_EQ(engine_->GetStats().num_ooms, 0);
  absl::StatusOr<void*> later = Allocate(4096);
  EXPECT_TRUE(later.ok()) << later.status();
  RecoverAndReleaseEverything();
}

TEST_F(CudaFaultTest, CudaMallocFailingRepeatedlyStillServesCachedBlocks) {
  StartEngine(0);
  absl::StatusOr<void*> warm = Allocate(5 * kMiB);  // a cached 20 MiB segment
  ASSERT_TRUE(warm.ok());
  Free(*warm);
  Inject("cudaMalloc", kForever, cudaErrorLaunchFailure);
  ExpectFaultOf("cudaMalloc");
  for (int i = 0; i < 3; ++i) {
    EXPECT_TRUE(absl::IsInternal(Allocate(1000).status()));  // a new small segment: refused
    absl::StatusOr<void*> cached = Allocate(8 * kMiB);       // fits the cached segment
    ASSERT_TRUE(cached.ok()) << cached.status();
    Free(*cached);
  }
  RecoverAndReleaseEverything();
}

TEST_F(CudaFaultTest, CudaMallocOutOfMemoryInTheRetryIsAnOutOfMemoryError) {
  StartEngine(0);
  absl::StatusOr<void*> warm = Allocate(5 * kMiB);
  ASSERT_TRUE(warm.ok());
  Free(*warm);
  Inject("cudaMalloc", 2, cudaErrorMemoryAllocation);
  ExpectFaultOf("cudaMalloc");
  const absl::StatusOr<void*> failed = Allocate(30 * kMiB);
  EXPECT_TRUE(absl::IsResourceExhausted(failed.status()));
  EXPECT_TRUE(Names(failed.status(), "out of memory on cuda:0")) << failed.status();
  EXPECT_TRUE(Names(failed.status(), "cudaErrorMemoryAllocation")) << failed.status();
  const MemoryStats stats = engine_->GetStats();
  EXPECT_EQ(stats.num_alloc_retries, 1);
  EXPECT_EQ(stats.num_ooms, 1);
  EXPECT_EQ(Reserved(), 0);  // the retry freed the cached segment
  absl::StatusOr<void*> later = Allocate(30 * kMiB);
  EXPECT_TRUE(later.ok()) << later.status();
  RecoverAndReleaseEverything();
}

TEST_F(CudaFaultTest, CudaFreeFailingInEmptyCacheKeepsTheSegment) {
  StartEngine(0);
  std::vector<void*> blocks;
  for (std::size_t size : {std::size_t{4096}, 5 * kMiB, 24 * kMiB}) {
    absl::StatusOr<void*> ptr = Allocate(size);
    ASSERT_TRUE(ptr.ok());
    blocks.push_back(*ptr);
  }
  for (void* ptr : blocks) Free(ptr);
  Inject("cudaFree", 1, cudaErrorLaunchFailure);
  ExpectFaultOf("cudaFree");
  const absl::Status once = EmptyCache();
  EXPECT_TRUE(Names(once, "stays cached")) << once;
  EXPECT_TRUE(Names(once, "cudaFree(")) << once;
  EXPECT_EQ(engine_->GetStats().segment.all().current, 1);
  Inject("cudaFree", kForever, cudaErrorLaunchFailure);
  for (int i = 0; i < 3; ++i) EXPECT_FALSE(EmptyCache().ok());
  EXPECT_EQ(engine_->GetStats().segment.all().current, 1);
  RecoverAndReleaseEverything();
}

TEST_F(CudaFaultTest, CudaFreeFailingInTheRetryEndsInAnErrorThatSaysSo) {
  StartEngine(0);
  ASSERT_EQ(sim().set_memory_capacity(0, 40 * kMiB), 0);
  absl::StatusOr<void*> warm = Allocate(5 * kMiB);  // a cached 20 MiB segment
  ASSERT_TRUE(warm.ok());
  Free(*warm);
  Inject("cudaFree", 1, cudaErrorLaunchFailure);
  ExpectFaultOf("cudaFree");
  const absl::StatusOr<void*> failed = Allocate(30 * kMiB);
  EXPECT_TRUE(absl::IsResourceExhausted(failed.status()));
  EXPECT_TRUE(Names(failed.status(), "out of memory on cuda:0")) << failed.status();
  EXPECT_TRUE(Names(failed.status(), "cudaFree(")) << failed.status();
  EXPECT_EQ(Reserved(), static_cast<std::int64_t>(20 * kMiB));
  absl::StatusOr<void*> later = Allocate(30 * kMiB);  // cudaFree works again
  EXPECT_TRUE(later.ok()) << later.status();
  RecoverAndReleaseEverything();
}

TEST_F(CudaFaultTest, EventCreationFailingKeepsTheBlockPendingUntilItSucceeds) {
  StartEngine(0);
  absl::StatusOr<void*> ptr = Allocate(4096);
  ASSERT_TRUE(ptr.ok());
  RecordStream(*ptr, side());
  Inject("cudaEventCreateWithFlags", kForever, cudaErrorLaunchFailure);
  ExpectFaultOf("cudaEventCreateWithFlags");
  Free(*ptr);  // the backend's event pool is empty: it must create one
  for (int i = 0; i < 3; ++i) {
    CompleteAll();
    ProcessEvents();
    EXPECT_EQ(Pending(), 4096);
  }
  EXPECT_GE(sim().call_count("cudaEventCreateWithFlags"), 4u);
  absl::StatusOr<void*> other = Allocate(4096);  // other blocks are still served
  ASSERT_TRUE(other.ok());
  EXPECT_NE(*other, *ptr);
  Free(*other);
  sim().clear_faults();
  ProcessEvents();  // created and recorded now
  CompleteAll();
  ProcessEvents();
  EXPECT_EQ(Pending(), 0);
  RecoverAndReleaseEverything();
}

TEST_F(CudaFaultTest, EventRecordFailingRepeatedlyKeepsTheBlockPendingUntilItSucceeds) {
  StartEngine(0);
  absl::StatusOr<void*> ptr = Allocate(4096);
  ASSERT_TRUE(ptr.ok());
  RecordStream(*ptr, side());
  Inject("cudaEventRecord", kForever, cudaErrorLaunchFailure);
  ExpectFaultOf("cudaEventRecord");
  Free(*ptr);
  for (int i = 0; i < 3; ++i) {
    CompleteAll();
    ProcessEvents();
    EXPECT_EQ(Pending(), 4096);
  }
  EXPECT_TRUE(EmptyCache().ok());
  EXPECT_EQ(engine_->GetStats().segment.all().current, 1);  // its segment stays
  sim().clear_faults();
  ProcessEvents();
  CompleteAll();
  ProcessEvents();
  EXPECT_EQ(Pending(), 0);
  RecoverAndReleaseEverything();
}

TEST_F(CudaFaultTest, EventQueryFailingWaitsForTheEventInsteadOfPinningTheBlock) {
  StartEngine(0);
  ASSERT_EQ(sim().set_memory_capacity(0, 40 * kMiB), 0);
  absl::StatusOr<void*> medium = Allocate(5 * kMiB);
  ASSERT_TRUE(medium.ok());
  RecordStream(*medium, side());
  Free(*medium);  // pending: the side stream's work is not complete
  Inject("cudaEventQuery", 1, cudaErrorLaunchFailure);
  ExpectFaultOf("cudaEventQuery");
  ProcessEvents();  // the query fails: the engine waits for the event
  EXPECT_EQ(Pending(), 0);
  EXPECT_EQ(sim().call_count("cudaEventSynchronize"), 1);

  absl::StatusOr<void*> again = Allocate(5 * kMiB);
  ASSERT_TRUE(again.ok());
  RecordStream(*again, side());
  Free(*again);
  Inject("cudaEventQuery", kForever, cudaErrorLaunchFailure);
  ProcessEvents();  // a persistent error pins nothing either
  EXPECT_EQ(Pending(), 0);
  EXPECT_EQ(engine_->GetEventHealth().event_query_errors, 2);
  EXPECT_EQ(engine_->GetEventHealth().streams_with_events, 0);
  RecoverAndReleaseEverything();
}

TEST_F(CudaFaultTest, EventSynchronizeFailingInTheRetryFailsTheAllocationAndKeepsTheBlock) {
  StartEngine(0);
  ASSERT_EQ(sim().set_memory_capacity(0, 40 * kMiB), 0);
  absl::StatusOr<void*> medium = Allocate(5 * kMiB);
  ASSERT_TRUE(medium.ok());
  RecordStream(*medium, side());
  Free(*medium);  // pending: the side stream's work is not complete
  EXPECT_EQ(Pending(), static_cast<std::int64_t>(5 * kMiB));
  Inject("cudaEventSynchronize", 1, cudaErrorLaunchFailure);
  ExpectFaultOf("cudaEventSynchronize");
  // Out of memory the engine waits for the event; that fails: the side
  // stream may still use the block, so the allocation reports the CUDA error
  // (as PyTorch raises it) rather than an out-of-memory or a reuse.
  absl::StatusOr<void*> large = Allocate(30 * kMiB);
  ASSERT_FALSE(large.ok());
  EXPECT_FALSE(absl::IsResourceExhausted(large.status())) << large.status();
  EXPECT_NE(large.status().message().find("cudaErrorLaunchFailure"), std::string::npos)
      << large.status();
  EXPECT_EQ(Pending(), static_cast<std::int64_t>(5 * kMiB));
  EXPECT_EQ(engine_->GetEventHealth().event_sync_errors, 1);
  // The next attempt waits again, and succeeds.
  large = Allocate(30 * kMiB);
  ASSERT_TRUE(large.ok()) << large.status();
  EXPECT_EQ(Pending(), 0);
  Free(*large);
  RecoverAndReleaseEverything();
}

TEST_F(CudaFaultTest, DevicePropertiesFailingLeaveTheLimitAsItWas) {
  // The device size comes from its properties, which need no context.
  StartEngine(0);
  engine_->SetMemoryLimit(20 * kMiB);
  Inject("cudaGetDeviceProperties", 1, cudaErrorLaunchFailure);
  ExpectFaultOf("cudaGetDeviceProperties");
  const absl::Status once = SetMemoryFraction(0.5);
  EXPECT_TRUE(absl::IsInternal(once));
  EXPECT_TRUE(Names(once, "cudaGetDeviceProperties on cuda:0 failed")) << once;
  Inject("cudaGetDeviceProperties", kForever, cudaErrorLaunchFailure);
  for (int i = 0; i < 3; ++i) EXPECT_FALSE(SetMemoryFraction(0.25).ok());
  EXPECT_EQ(engine_->memory_limit(), 20 * kMiB);
  absl::StatusOr<void*> ptr = Allocate(5 * kMiB);
  ASSERT_TRUE(ptr.ok()) << ptr.status();
  Free(*ptr);
  sim().clear_faults();
  EXPECT_TRUE(SetMemoryFraction(0.5).ok());
  EXPECT_EQ(engine_->memory_limit(), kDeviceCapacity / 2);
  RecoverAndReleaseEverything();
}

TEST_F(CudaFaultTest, CaptureQueryFailingFailsNewSegmentsButServesCachedBlocks) {
  StartEngine(0);
  absl::StatusOr<void*> warm = Allocate(4096);
  ASSERT_TRUE(warm.ok());
  Free(*warm);
  Inject("cudaStreamIsCapturing", 1, cudaErrorStreamCaptureUnsupported);
  ExpectFaultOf("cudaStreamIsCapturing");
  const absl::StatusOr<void*> once = Allocate(5 * kMiB);
  EXPECT_TRUE(absl::IsInternal(once.status()));
  EXPECT_TRUE(Names(once.status(), "cudaStreamIsCapturing on cuda:0 failed")) << once.status();
  Inject("cudaStreamIsCapturing", kForever, cudaErrorStreamCaptureUnsupported);
  for (int i = 0; i < 3; ++i) {
    EXPECT_FALSE(Allocate(5 * kMiB).ok());
    absl::StatusOr<void*> cached = Allocate(4096);
    ASSERT_TRUE(cached.ok()) << cached.status();
    Free(*cached);
  }
  sim().clear_faults();
  absl::StatusOr<void*> later = Allocate(5 * kMiB);
  EXPECT_TRUE(later.ok()) << later.status();
  RecoverAndReleaseEverything();
}

TEST_F(CudaFaultTest, SetDeviceFailingIsReportedAndTheCurrentDeviceIsKept) {
  StartEngine(/*device=*/1);
  Inject("cudaSetDevice", 1, cudaErrorInvalidDevice);
  ExpectFaultOf("cudaSetDevice");
  const absl::StatusOr<void*> once = Allocate(4096);
  EXPECT_TRUE(absl::IsInternal(once.status()));
  EXPECT_TRUE(Names(once.status(), "cudaSetDevice on cuda:1 failed")) << once.status();
  absl::StatusOr<void*> ptr = Allocate(4096);
  ASSERT_TRUE(ptr.ok()) << ptr.status();
  Free(*ptr);
  Inject("cudaSetDevice", kForever, cudaErrorInvalidDevice);
  for (int i = 0; i < 3; ++i) {
    EXPECT_FALSE(Allocate(5 * kMiB).ok());
    // Sizing the device reads its properties: no device switch (and no
    // context), so a memory fraction still applies.
    EXPECT_TRUE(SetMemoryFraction(0.5).ok());
    EXPECT_FALSE(EmptyCache().ok());                // cudaFree needs the device too
    absl::StatusOr<void*> cached = Allocate(4096);  // the cache needs no device call
    ASSERT_TRUE(cached.ok()) << cached.status();
    Free(*cached);
  }
  EXPECT_EQ(engine_->GetStats().segment.all().current, 1);
  RecoverAndReleaseEverything();
}

TEST_F(CudaFaultTest, SwitchingBackToTheCallersDeviceFailingOnceIsRetried) {
  StartEngine(/*device=*/1);
  // The switch to cuda:1 succeeds; the switch back to cuda:0 fails once. The
  // allocation succeeds and the caller is back on cuda:0 with no error left
  // (CheckOutcome verifies both after every step).
  Inject("cudaSetDevice", 1, cudaErrorInvalidDevice, /*skip=*/1);
  absl::StatusOr<void*> ptr = Allocate(4096);
  ASSERT_TRUE(ptr.ok()) << ptr.status();
  int current = -1;
  ASSERT_EQ(cudaGetDevice(&current), cudaSuccess);
  EXPECT_EQ(current, 0);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  Free(*ptr);
  RecoverAndReleaseEverything();
}

}  // namespace
}  // namespace torchmem
