// The virtual-memory placement (PyTorch's expandable_segments): ranges
// reserved once, page fit, pages mapped on demand, lazy unmapping with
// highest-address stealing, and the engine staying consistent when any
// virtual-memory call fails. The backend holds real host memory, so a block
// the engine hands out on an unmapped page would crash the test.
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "tests/cpp/support/engine_fixture.h"

namespace torchmem::testing {
namespace {

constexpr std::size_t kPage = 2 * kMiB;
// The large pool's pages by default (PyTorch's kLargeBuffer).
constexpr std::size_t kLargePage = 20 * kMiB;
constexpr std::size_t kCapacity = 256 * kMiB;

ControlledBackendOptions RealMemory() {
  ControlledBackendOptions options;
  options.real_memory = true;
  options.capacity_bytes = kCapacity;
  return options;
}

// Most tests count pages: with `large_page` kPage both pools map 2 MiB
// pages, and a block's pages are easy to tell.
EngineOptions VirtualMemory(std::size_t large_page) {
  EngineOptions options;
  options.placement = Placement::kVirtualMemory;
  options.policy.vmm_large_page_size = large_page;
  return options;
}

class EngineVmmTest : public EngineTest {
 protected:
  explicit EngineVmmTest(std::size_t large_page = kPage)
      : EngineTest(RealMemory(), VirtualMemory(large_page)) {}

  // Allocates and writes every byte (a fault if a page is not mapped).
  void* Touch(std::size_t size, StreamId stream = 0) {
    void* ptr = Allocate(size, stream);
    if (ptr != nullptr) std::memset(ptr, 0x5a, size);
    EXPECT_POOL_INTACT(*engine_);
    return ptr;
  }
  void Release(void* ptr) {
    Free(ptr);
    EXPECT_POOL_INTACT(*engine_);
  }
  std::int64_t Calls(BackendCall call) const { return faults_->calls(call); }
  std::int64_t DriverCalls() const {
    std::int64_t total = 0;
    for (BackendCall call : kVirtualMemoryBackendCalls) total += Calls(call);
    return total;
  }
};

TEST_F(EngineVmmTest, ReservedBytesAreTheMappedPagesNotTheAddressSpace) {
  void* block = Touch(3 * kMiB);
  const MemoryStats stats = Stats();
  EXPECT_EQ(stats.reserved_bytes.all().current, static_cast<std::int64_t>(2 * kPage));
  EXPECT_EQ(stats.vmm.mapped_bytes, static_cast<std::int64_t>(2 * kPage));
  EXPECT_EQ(stats.vmm.page_size, static_cast<std::int64_t>(kPage));
  // One range of the whole capacity and an eighth, address space only.
  EXPECT_EQ(stats.vmm.reserved_address_bytes, static_cast<std::int64_t>(kCapacity + kCapacity / 8));
  EXPECT_EQ(stats.segment.all().current, 1);
  EXPECT_EQ(backend_->live_segment_bytes(), 2 * kPage);
  EXPECT_EQ(stats.allocated_bytes.all().current, static_cast<std::int64_t>(3 * kMiB));
  // The free tail of the range is address space: no inactive split.
  EXPECT_EQ(stats.inactive_split_bytes.all().current, 0);
  Release(block);
}

TEST_F(EngineVmmTest, NeighboursShareThePagesTheyTouch) {
  // PyTorch would give these four 2.5 MiB blocks one 20 MiB segment; here
  // they take 10 MiB of pages, five of them.
  std::vector<void*> blocks;
  for (int i = 0; i < 4; ++i) blocks.push_back(Touch(2 * kMiB + 512 * kKiB));
  EXPECT_EQ(Stats().reserved_bytes.all().current, static_cast<std::int64_t>(5 * kPage));
  for (int i = 1; i < 4; ++i) EXPECT_EQ(Address(blocks[i]), Address(blocks[i - 1]) + 5 * kMiB / 2);
  for (void* block : blocks) Release(block);
}

TEST_F(EngineVmmTest, SmallAndLargeBlocksAndStreamsHaveRangesOfTheirOwn) {
  void* small = Touch(4096);
  void* large = Touch(4 * kMiB);
  void* other_stream = Touch(4096, /*stream=*/7);
  EXPECT_EQ(Stats().segment.all().current, 3);
  EXPECT_EQ(Stats().segment.pool(PoolKind::kSmall).current, 2);
  EXPECT_EQ(backend_->reserved_ranges(), 3);
  Release(small);
  Release(large);
  Release(other_stream);
}

TEST_F(EngineVmmTest, ACacheHitMakesNoBackendCall) {
  for (int i = 0; i < 3; ++i) {
    void* a = Touch(6 * kMiB);
    Release(Touch(1000));
    Release(a);
  }
  const std::int64_t before = DriverCalls();
  for (int i = 0; i < 100; ++i) {
    void* a = Allocate(6 * kMiB);
    void* b = Allocate(1000);
    Free(b);
    Free(a);
  }
  EXPECT_EQ(DriverCalls(), before);
  EXPECT_POOL_INTACT(*engine_);
}

TEST_F(EngineVmmTest, CachedPagesMoveOnlyUnderMemoryPressure) {
  void* low = Touch(2 * kPage);
  void* high = Touch(2 * kPage);
  Release(high);
  // Lazy unmapping: the pages stay mapped, cached.
  EXPECT_EQ(Stats().vmm.cached_bytes, static_cast<std::int64_t>(2 * kPage));
  EXPECT_EQ(Stats().reserved_bytes.all().current, static_cast<std::int64_t>(4 * kPage));
  // Another stream's range needs a page: with memory to spare it gets a
  // new one. Stealing a cached page would unmap it, which waits for its
  // stream (issue 20: warm steps must make no driver call nor wait).
  const std::int64_t created = Calls(BackendCall::kCreatePhysicalPage);
  void* elsewhere = Touch(kPage, /*stream=*/9);
  EXPECT_EQ(Calls(BackendCall::kCreatePhysicalPage), created + 1);
  EXPECT_EQ(Stats().vmm.steals, 0);
  EXPECT_EQ(Calls(BackendCall::kUnmapPages), 0);
  EXPECT_EQ(Stats().reserved_bytes.all().current, static_cast<std::int64_t>(5 * kPage));
  // At the memory limit the highest cached page moves there instead.
  engine_->SetMemoryLimit(5 * kPage);
  void* pressed = Touch(kPage, /*stream=*/10);
  EXPECT_EQ(Calls(BackendCall::kCreatePhysicalPage), created + 1);
  EXPECT_EQ(Stats().vmm.steals, 1);
  EXPECT_EQ(Stats().reserved_bytes.all().current, static_cast<std::int64_t>(5 * kPage));
  EXPECT_EQ(backend_->live_pages(), 5);
  Release(pressed);
  Release(elsewhere);
  Release(low);
}

TEST_F(EngineVmmTest, EmptyCacheReturnsCachedPagesAndFreeRanges) {
  void* kept = Touch(kPage);
  void* gone = Touch(3 * kPage);
  Release(gone);
  ASSERT_TRUE(engine_->EmptyCache().ok());
  EXPECT_POOL_INTACT(*engine_);
  // Cached pages are unmapped even though the range still holds a block.
  EXPECT_EQ(Stats().reserved_bytes.all().current, static_cast<std::int64_t>(kPage));
  EXPECT_EQ(backend_->live_pages(), 1);
  Release(kept);
  ASSERT_TRUE(engine_->EmptyCache().ok());
  EXPECT_EQ(Stats().reserved_bytes.all().current, 0);
  EXPECT_EQ(Stats().vmm.reserved_address_bytes, 0);
  EXPECT_EQ(backend_->reserved_ranges(), 0);
  EXPECT_EQ(backend_->live_pages(), 0);
}

TEST_F(EngineVmmTest, AMemoryLimitCountsMappedPagesAndFailsCleanly) {
  engine_->SetMemoryLimit(4 * kPage);
  void* four_pages = Touch(4 * kPage);
  absl::StatusOr<void*> over = engine_->Allocate(kMiB);
  ASSERT_FALSE(over.ok());
  EXPECT_TRUE(absl::IsResourceExhausted(over.status())) << over.status();
  EXPECT_TRUE(absl::StrContains(over.status().message(), "memory limit")) << over.status();
  EXPECT_POOL_INTACT(*engine_);
  EXPECT_EQ(Stats().allocated_bytes.all().current, static_cast<std::int64_t>(4 * kPage));
  Release(four_pages);
  // Its pages are cached now: a new block takes them, under the limit.
  void* again = Touch(3 * kPage);
  EXPECT_LE(Stats().reserved_bytes.all().current, static_cast<std::int64_t>(4 * kPage));
  Release(again);
}

TEST_F(EngineVmmTest, AnAllocationOverTheLimitMapsNothing) {
  engine_->SetMemoryLimit(4 * kPage);
  void* one_page = Touch(kPage);
  const std::int64_t creates = Calls(BackendCall::kCreatePhysicalPage);
  const std::int64_t maps = Calls(BackendCall::kMapPage);
  absl::StatusOr<void*> over = engine_->Allocate(6 * kPage);
  ASSERT_FALSE(over.ok());
  EXPECT_TRUE(absl::StrContains(over.status().message(), "memory limit")) << over.status();
  EXPECT_POOL_INTACT(*engine_);
  // Not one page was created for it, and reserved memory never rose.
  EXPECT_EQ(Calls(BackendCall::kCreatePhysicalPage), creates);
  EXPECT_EQ(Calls(BackendCall::kMapPage), maps);
  EXPECT_EQ(Stats().reserved_bytes.all().current, static_cast<std::int64_t>(kPage));
  EXPECT_EQ(Stats().reserved_bytes.all().peak, static_cast<std::int64_t>(kPage));
  EXPECT_EQ(backend_->mapped_pages(), 1);
  Release(one_page);
}

TEST_F(EngineVmmTest, PagesMappedBeforeTheLimitIsFoundAreUndone) {
  // Cached pages of a private pool count as cached but cannot be stolen, so
  // only mapping finds out that the limit is reached, pages later.
  const PoolId graph{1, 1};
  constexpr StreamId kCapturing = 5;
  ASSERT_TRUE(engine_->BeginAllocateToPool(graph, [](StreamId s) { return s == kCapturing; }).ok());
  Release(Touch(3 * kPage, kCapturing));
  ASSERT_TRUE(engine_->EndAllocateToPool(graph).ok());
  engine_->SetMemoryLimit(6 * kPage);
  const std::int64_t releases = Calls(BackendCall::kReleasePhysicalPage);
  absl::StatusOr<void*> over = engine_->Allocate(5 * kPage);
  ASSERT_FALSE(over.ok());
  EXPECT_TRUE(absl::StrContains(over.status().message(), "memory limit")) << over.status();
  EXPECT_POOL_INTACT(*engine_);
  // The three pages it mapped up to the limit went back to the device (the
  // ladder ran in between and freed none: the graph's pages stay).
  EXPECT_EQ(Calls(BackendCall::kReleasePhysicalPage) - releases, 6);  // two attempts
  EXPECT_EQ(Stats().reserved_bytes.all().current, static_cast<std::int64_t>(3 * kPage));
  EXPECT_EQ(backend_->mapped_pages(), 3);
  EXPECT_EQ(backend_->live_pages(), 3);
  ASSERT_TRUE(engine_->ReleasePool(graph).ok());
  ASSERT_TRUE(engine_->EmptyCache().ok());
  EXPECT_EQ(backend_->live_pages(), 0);
}

TEST_F(EngineVmmTest, AFailingDriverCallUndoesThePagesMappedBeforeIt) {
  for (BackendCall call : {BackendCall::kMapPage, BackendCall::kSetAccess}) {
    faults_->FailAfter(call, call == BackendCall::kMapPage ? 2 : 0);
    absl::StatusOr<void*> failed = engine_->Allocate(4 * kPage);
    ASSERT_FALSE(failed.ok()) << BackendCallName(call);
    EXPECT_TRUE(absl::StrContains(failed.status().message(), BackendCallName(call)))
        << failed.status();
    EXPECT_POOL_INTACT(*engine_);
    EXPECT_EQ(Stats().reserved_bytes.all().current, 0) << BackendCallName(call);
    EXPECT_EQ(backend_->mapped_pages(), 0) << BackendCallName(call);
    EXPECT_EQ(backend_->live_pages(), 0) << BackendCallName(call);
  }
  // If the undo cannot unmap, the pages stay mapped, cached, and get their
  // access when a block needs them.
  faults_->FailOnce(BackendCall::kSetAccess);
  faults_->FailAlways(BackendCall::kUnmapPages);
  ASSERT_FALSE(engine_->Allocate(4 * kPage).ok());
  EXPECT_POOL_INTACT(*engine_);
  EXPECT_EQ(Stats().reserved_bytes.all().current, static_cast<std::int64_t>(4 * kPage));
  faults_->ClearAll();
  Release(Touch(4 * kPage));
  ASSERT_TRUE(engine_->EmptyCache().ok());
  EXPECT_EQ(backend_->live_pages(), 0);
}

TEST_F(EngineVmmTest, GarbageCollectionGivesBackCachedPagesPastTheThreshold) {
  engine_->SetMemoryLimit(10 * kPage);
  engine_->SetGarbageCollectionThreshold(0.5);  // collect past 5 pages
  void* low = Touch(2 * kPage);
  void* high = Touch(4 * kPage);
  Release(high);  // 4 cached pages: 6 mapped, over the threshold
  EXPECT_EQ(Stats().reserved_bytes.all().current, static_cast<std::int64_t>(6 * kPage));
  // A block on another stream gets a new page (the limit allows it); then
  // the collection unmaps cached pages down to the threshold.
  void* elsewhere = Touch(kPage, /*stream=*/9);
  EXPECT_EQ(Stats().vmm.steals, 0);
  EXPECT_EQ(Stats().reserved_bytes.all().current, static_cast<std::int64_t>(5 * kPage));
  EXPECT_EQ(Stats().vmm.cached_bytes, static_cast<std::int64_t>(2 * kPage));
  EXPECT_EQ(backend_->live_pages(), 5);
  Release(elsewhere);
  Release(low);
}

TEST_F(EngineVmmTest, ALimitOfSizeMaxIsNoLimit) {
  engine_->SetMemoryLimit(std::numeric_limits<std::size_t>::max());
  engine_->SetGarbageCollectionThreshold(0.5);
  Release(Touch(3 * kPage));
  EXPECT_EQ(Stats().num_ooms, 0);
}

TEST_F(EngineVmmTest, RangesReservedAfterTheDeviceGrewFitIt) {
  // The first range was sized for 256 MiB; a range reserved later for
  // another stream is sized by the capacity then.
  Release(Touch(kPage));
  backend_->SetCapacity(std::size_t{4} << 30);
  void* large = Allocate(std::size_t{1} << 30, /*stream=*/9);
  ASSERT_NE(large, nullptr);
  EXPECT_POOL_INTACT(*engine_);
  Release(large);
}

TEST_F(EngineVmmTest, AFullDeviceRunsTheLadderThenReportsOutOfMemory) {
  backend_->SetCapacity(6 * kPage);
  void* big = Touch(5 * kPage);
  absl::StatusOr<void*> over = engine_->Allocate(2 * kPage);
  ASSERT_FALSE(over.ok());
  EXPECT_TRUE(absl::IsResourceExhausted(over.status())) << over.status();
  EXPECT_EQ(Stats().num_ooms, 1);
  EXPECT_EQ(Stats().num_alloc_retries, 1);
  EXPECT_POOL_INTACT(*engine_);
  Release(big);
  Release(Touch(6 * kPage));
}

TEST_F(EngineVmmTest, PrivatePoolPagesAreNeverStolen) {
  const PoolId graph{1, 1};
  constexpr StreamId kCapturing = 5;
  ASSERT_TRUE(engine_->BeginAllocateToPool(graph, [](StreamId s) { return s == kCapturing; }).ok());
  void* in_graph = Touch(2 * kPage, kCapturing);
  ASSERT_TRUE(engine_->EndAllocateToPool(graph).ok());
  Release(in_graph);
  const std::int64_t steals = Stats().vmm.steals;
  void* outside = Touch(2 * kPage);
  EXPECT_EQ(Stats().vmm.steals, steals);  // the graph replays into its pages
  EXPECT_EQ(Stats().reserved_bytes.all().current, static_cast<std::int64_t>(4 * kPage));
  Release(outside);
  ASSERT_TRUE(engine_->ReleasePool(graph).ok());
  ASSERT_TRUE(engine_->EmptyCache().ok());
  EXPECT_POOL_INTACT(*engine_);
  EXPECT_EQ(backend_->live_pages(), 0);
}

TEST_F(EngineVmmTest, AUseOnOomPoolLendsAPlaceWhosePagesItHoldsBeforeTheLadder) {
  const PoolId pool{3, 1};
  ASSERT_TRUE(engine_->CreateOrIncrefPool(pool).ok());
  ASSERT_TRUE(engine_->SetPoolUseOnOom(pool, true).ok());
  ASSERT_TRUE(engine_->BeginAllocateToPool(pool, [](StreamId s) { return s == 0; }).ok());
  void* in_pool = Touch(3 * kPage);
  ASSERT_TRUE(engine_->EndAllocateToPool(pool).ok());
  ASSERT_TRUE(engine_->ReleasePool(pool).ok());  // the route's reference; the MemPool's stays
  Release(in_pool);                              // 3 pages cached in the pool's range
  engine_->SetMemoryLimit(5 * kPage);
  void* filler = Touch(2 * kPage);  // the default range's 2 pages: at the limit
  const std::int64_t creates = Calls(BackendCall::kCreatePhysicalPage);
  // 3 new pages would pass the limit: the pool lends its mapped ones, before
  // the ladder (no retry) and without a driver call.
  void* lent = Touch(2 * kPage + kMiB);
  ASSERT_NE(lent, nullptr);
  EXPECT_EQ(engine_->SegmentContaining(lent)->owner, pool);
  EXPECT_EQ(Address(lent), Address(in_pool));
  EXPECT_EQ(Stats().num_alloc_retries, 0);
  EXPECT_EQ(Calls(BackendCall::kCreatePhysicalPage), creates);
  EXPECT_EQ(Stats().reserved_bytes.all().current, static_cast<std::int64_t>(5 * kPage));
  // A place that needs pages the pool does not hold is not lent: the ladder
  // runs and the allocation fails.
  absl::StatusOr<void*> over = engine_->Allocate(4 * kPage);
  EXPECT_TRUE(absl::IsResourceExhausted(over.status())) << over.status();
  EXPECT_POOL_INTACT(*engine_);
  Release(lent);  // back to the pool's range
  Release(filler);
  engine_->SetMemoryLimit(std::numeric_limits<std::size_t>::max());
  ASSERT_TRUE(engine_->ReleasePool(pool).ok());
  ASSERT_TRUE(engine_->EmptyCache().ok());
  EXPECT_POOL_INTACT(*engine_);
  EXPECT_EQ(backend_->live_pages(), 0);
}

TEST_F(EngineVmmTest, APrivatePoolIsRestoredToItsCheckpoint) {
  const PoolId graph{2, 1};
  constexpr StreamId kCapturing = 5;
  ASSERT_TRUE(engine_->BeginAllocateToPool(graph, [](StreamId s) { return s == kCapturing; }).ok());
  void* a = Touch(kMiB + 4096, kCapturing);
  void* b = Touch(3 * kMiB, kCapturing);
  absl::StatusOr<PoolCheckpoint> checkpoint = engine_->GetPoolCheckpoint(graph);
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
  Release(a);
  void* c = Touch(5 * kMiB, kCapturing);
  const std::int64_t maps = Calls(BackendCall::kMapPage);
  absl::StatusOr<CheckpointRestore> restored = engine_->RestorePoolCheckpoint(*checkpoint);
  ASSERT_TRUE(restored.ok()) << restored.status();
  EXPECT_POOL_INTACT(*engine_);
  EXPECT_EQ(Calls(BackendCall::kMapPage), maps);  // the live blocks' pages stayed mapped
  EXPECT_EQ(restored->allocated, (std::vector<std::uintptr_t>{Address(a), Address(b)}));
  EXPECT_EQ(restored->freed, (std::vector<std::uintptr_t>{Address(b), Address(c)}));
  Release(a);
  Release(b);
  ASSERT_TRUE(engine_->EndAllocateToPool(graph).ok());
  ASSERT_TRUE(engine_->ReleasePool(graph).ok());
  ASSERT_TRUE(engine_->EmptyCache().ok());
  EXPECT_EQ(backend_->live_pages(), 0);
}

TEST_F(EngineVmmTest, NothingIsStolenWhileAGraphIsCaptured) {
  Release(Touch(kPage));
  engine_->MarkCaptureBegin();
  void* during = Touch(kPage, /*stream=*/3);
  EXPECT_EQ(Stats().vmm.steals, 0);
  engine_->MarkCaptureEnd();
  Release(during);
}

TEST_F(EngineVmmTest, ThePlacementMayChangeWhileBlocksLive) {
  void* ranged = Touch(kMiB);
  ASSERT_TRUE(engine_->SetPlacement(Placement::kPyTorch).ok());
  void* segmented = Touch(kMiB);
  EXPECT_EQ(Stats().reserved_bytes.all().current, static_cast<std::int64_t>(kPage + 2 * kMiB));
  Release(ranged);
  Release(segmented);
  ASSERT_TRUE(engine_->EmptyCache().ok());
  EXPECT_EQ(Stats().reserved_bytes.all().current, 0);
}

TEST(EngineVmmPlacementTest, ABackendWithoutVirtualMemorySaysSo) {
  ControlledBackendOptions options;
  options.vmm_page_size = 0;
  Engine engine(std::make_unique<ControlledBackend>(options));
  const absl::Status status = engine.SetPlacement(Placement::kVirtualMemory);
  EXPECT_TRUE(absl::IsFailedPrecondition(status)) << status;
  EXPECT_TRUE(absl::StrContains(status.message(), "expandable_segments")) << status;
  EXPECT_EQ(engine.placement(), Placement::kPyTorch);
}

// A seeded random workload (sizes from 512 B to 40 MiB, several streams,
// frees in random order, EmptyCache now and then) with the invariants
// checked after every operation: pages mapped exactly where live blocks
// are, stats equal to a recount, mapped vs address-space bytes included.
class EngineVmmPageSizeTest : public EngineVmmTest,
                              public ::testing::WithParamInterface<std::size_t> {
 protected:
  EngineVmmPageSizeTest() : EngineVmmTest(GetParam()) {}
};

TEST_P(EngineVmmPageSizeTest, InvariantsHoldAfterEveryOperationOfARandomWorkload) {
  // Under a limit, so that cached pages are stolen too (only memory
  // pressure moves them).
  engine_->SetMemoryLimit(48 * kPage);
  std::mt19937_64 rng(12);
  std::vector<void*> live;
  for (int step = 0; step < 1500; ++step) {
    const std::uint64_t dice = rng() % 100;
    if (dice < 55 || live.empty()) {
      const std::size_t size = dice % 3 == 0 ? 512 + rng() % kMiB : 512 + rng() % (40 * kMiB);
      absl::StatusOr<void*> ptr = engine_->Allocate(size, rng() % 3);
      if (ptr.ok()) {
        std::memset(*ptr, 1, std::min<std::size_t>(size, 4096));
        live.push_back(*ptr);
      } else {
        EXPECT_TRUE(absl::IsResourceExhausted(ptr.status())) << ptr.status();
      }
    } else if (dice < 98) {
      const std::size_t victim = rng() % live.size();
      ASSERT_TRUE(engine_->Free(live[victim]).ok());
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(victim));
    } else {
      ASSERT_TRUE(engine_->EmptyCache().ok());
    }
    const absl::Status intact = engine_->CheckInvariants();
    ASSERT_TRUE(intact.ok()) << "step " << step << ": " << intact.message();
  }
  EXPECT_GT(Stats().vmm.steals, 0);
  for (void* ptr : live) Release(ptr);
}

INSTANTIATE_TEST_SUITE_P(LargePoolPages, EngineVmmPageSizeTest,
                         ::testing::Values(kPage, kLargePage),
                         [](const ::testing::TestParamInfo<std::size_t>& info) {
                           return std::to_string(info.param >> 20) + "MiB";
                         });

// Each virtual-memory call failing, once and then repeatedly, during a
// workload: a failed allocation says so (an injected failure or out of
// memory), leaves nothing allocated, and the pool stays intact; once the
// faults stop every page and range can be given back.
class EngineVmmFaultTest
    : public EngineVmmTest,
      public ::testing::WithParamInterface<std::tuple<BackendCall, std::size_t>> {
 protected:
  EngineVmmFaultTest() : EngineVmmTest(std::get<1>(GetParam())) {}
};

TEST_P(EngineVmmFaultTest, AFailingCallLeavesTheEngineConsistent) {
  const BackendCall call = std::get<0>(GetParam());
  std::mt19937_64 rng(static_cast<std::uint64_t>(call));
  std::vector<void*> live;
  std::int64_t failed_allocations = 0;
  for (int round = 0; round < 6; ++round) {
    if (round == 1) faults_->FailNext(call, 3);
    if (round == 3) faults_->FailWithProbability(call, 0.3);
    if (round == 5) faults_->Clear(call);
    for (int step = 0; step < 80; ++step) {
      if (rng() % 3 != 0 || live.empty()) {
        const std::int64_t allocated_before = Stats().allocated_bytes.all().current;
        absl::StatusOr<void*> ptr = engine_->Allocate(512 + rng() % (9 * kMiB), rng() % 2);
        if (ptr.ok()) {
          std::memset(*ptr, 2, 512);
          live.push_back(*ptr);
        } else {
          ++failed_allocations;
          EXPECT_TRUE(absl::StrContains(ptr.status().message(), BackendCallName(call)) ||
                      absl::IsResourceExhausted(ptr.status()))
              << ptr.status();
          EXPECT_EQ(Stats().allocated_bytes.all().current, allocated_before);
        }
      } else {
        const std::size_t victim = rng() % live.size();
        ASSERT_TRUE(engine_->Free(live[victim]).ok());
        live.erase(live.begin() + static_cast<std::ptrdiff_t>(victim));
      }
      if (step % 20 == 19) (void)engine_->EmptyCache();
      const absl::Status intact = engine_->CheckInvariants();
      ASSERT_TRUE(intact.ok()) << BackendCallName(call) << " round " << round << ": "
                               << intact.message();
    }
  }
  EXPECT_GT(faults_->failures(call), 0) << "the workload never reached the fault";
  for (void* ptr : live) Release(ptr);
  ASSERT_TRUE(engine_->EmptyCache().ok());
  EXPECT_POOL_INTACT(*engine_);
  EXPECT_EQ(Stats().reserved_bytes.all().current, 0);
  EXPECT_EQ(backend_->mapped_pages(), 0);
  EXPECT_EQ(backend_->reserved_ranges(), 0);
  // Every page is back unless a failing release lost it (counted).
  EXPECT_EQ(backend_->live_pages(), Stats().vmm.lost_pages);
}

// VirtualMemoryPageSize is asked once, when the placement is chosen (see
// ABackendWithoutVirtualMemorySaysSo for its failure).
INSTANTIATE_TEST_SUITE_P(
    VirtualMemoryCalls, EngineVmmFaultTest,
    ::testing::Combine(::testing::Values(BackendCall::kReserveAddressRange,
                                         BackendCall::kReleaseAddressRange,
                                         BackendCall::kCreatePhysicalPage,
                                         BackendCall::kReleasePhysicalPage, BackendCall::kMapPage,
                                         BackendCall::kSetAccess, BackendCall::kUnmapPages),
                       ::testing::Values(kPage, kLargePage)),
    [](const ::testing::TestParamInfo<std::tuple<BackendCall, std::size_t>>& info) {
      return std::string(BackendCallName(std::get<0>(info.param))) + "_" +
             std::to_string(std::get<1>(info.param) >> 20) + "MiB";
    });

// The default page sizes: 2 MiB in the small pool, 20 MiB in the large one.
class EngineVmmLargePageTest : public EngineVmmTest {
 protected:
  EngineVmmLargePageTest() : EngineVmmTest(kLargePage) {}
};

TEST_F(EngineVmmLargePageTest, TheLargePoolMapsTwentyMiBPagesTheSmallPoolTwo) {
  void* small = Touch(512);
  EXPECT_EQ(Stats().reserved_bytes.all().current, static_cast<std::int64_t>(kPage));
  // Five 4 MiB blocks share the large range's first page: one create, one
  // map, where 2 MiB pages would take ten of each.
  std::vector<void*> blocks;
  for (int i = 0; i < 5; ++i) blocks.push_back(Touch(4 * kMiB));
  EXPECT_EQ(Address(blocks[0]) % kLargePage, 0u) << "the range starts on a page";
  EXPECT_EQ(Calls(BackendCall::kCreatePhysicalPage), 2);
  EXPECT_EQ(Calls(BackendCall::kMapPage), 2);
  EXPECT_EQ(Stats().reserved_bytes.all().current, static_cast<std::int64_t>(kPage + kLargePage));
  // 50 MiB after them touches pages 1 to 3 (page fit: no placement touches
  // fewer new pages).
  void* big = Touch(50 * kMiB);
  EXPECT_EQ(Calls(BackendCall::kCreatePhysicalPage), 5);
  EXPECT_EQ(Calls(BackendCall::kMapPage), 5);
  EXPECT_EQ(backend_->live_page_bytes(), kPage + 4 * kLargePage);
  const MemoryStats stats = Stats();
  EXPECT_EQ(stats.reserved_bytes.all().current, static_cast<std::int64_t>(kPage + 4 * kLargePage));
  EXPECT_EQ(stats.vmm.page_size, static_cast<std::int64_t>(kPage));
  EXPECT_EQ(stats.vmm.large_page_size, static_cast<std::int64_t>(kLargePage));
  EXPECT_EQ(stats.vmm.mapped_bytes, static_cast<std::int64_t>(kPage + 4 * kLargePage));
  // Freed and reused: no call.
  const std::int64_t calls = DriverCalls();
  Release(big);
  big = Touch(50 * kMiB);
  EXPECT_EQ(DriverCalls(), calls);
  Release(big);
  for (void* block : blocks) Release(block);
  Release(small);
  ASSERT_TRUE(engine_->EmptyCache().ok());
  EXPECT_EQ(Stats().reserved_bytes.all().current, 0);
  EXPECT_EQ(backend_->live_pages(), 0);
  EXPECT_EQ(backend_->mapped_pages(), 0);
  EXPECT_EQ(backend_->reserved_ranges(), 0) << "each reservation went back whole";
}

TEST_F(EngineVmmLargePageTest, SharedPagesAndBaseAllocationsAreWholeLargePages) {
  void* a = Touch(3 * kMiB);
  void* c = Touch(30 * kMiB);  // 3 to 33 MiB: pages 0 and 1
  const std::uintptr_t start = Address(a);
  ASSERT_EQ(start % kLargePage, 0u);
  absl::StatusOr<Engine::SharedPages> pages = engine_->PagesOfBlock(c);
  ASSERT_TRUE(pages.ok()) << pages.status();
  EXPECT_EQ(pages->page_size, kLargePage);
  EXPECT_EQ(pages->first_page, start);
  EXPECT_EQ(pages->handles.size(), 2u);
  EXPECT_EQ(*engine_->BaseAllocation(c), std::make_pair(start, 2 * kLargePage));
  Release(a);
  Release(c);
}

TEST_F(EngineVmmLargePageTest, AMemoryLimitCountsWholeLargePages) {
  engine_->SetMemoryLimit(kLargePage + 3 * kPage);
  void* first = Touch(4 * kMiB);
  void* small = Touch(512);
  // A second large page would pass the limit: refused before any is mapped.
  absl::StatusOr<void*> over = engine_->Allocate(30 * kMiB);
  EXPECT_TRUE(absl::IsResourceExhausted(over.status())) << over.status();
  EXPECT_EQ(Stats().reserved_bytes.all().current, static_cast<std::int64_t>(kLargePage + kPage));
  EXPECT_EQ(Calls(BackendCall::kCreatePhysicalPage), 2);
  Release(first);
  Release(small);
}

TEST(EngineVmmPageSizeFaultTest, AFailingPageSizeQueryRefusesThePlacementClearly) {
  auto faults = std::make_unique<FaultInjectingBackend>(std::make_unique<ControlledBackend>());
  faults->FailOnce(BackendCall::kVirtualMemoryPageSize);
  Engine engine(std::move(faults));
  const absl::Status status = engine.SetPlacement(Placement::kVirtualMemory);
  EXPECT_TRUE(absl::IsFailedPrecondition(status)) << status;
  EXPECT_TRUE(absl::StrContains(status.message(), "VirtualMemoryPageSize")) << status;
  EXPECT_TRUE(engine.SetPlacement(Placement::kVirtualMemory).ok());
}

}  // namespace
}  // namespace torchmem::testing
