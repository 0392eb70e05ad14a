// Private pools (CUDA graphs, torch.cuda.MemPool): routing, isolation from
// the default pool, lifecycle, per-pool statistics and checkpoints.
#include <cstdint>
#include <string>

#include "gtest/gtest.h"
#include "tests/cpp/support/engine_fixture.h"

namespace torchmem {
namespace {

using testing::EngineTest;

constexpr PoolId kGraph{1, 0};
constexpr PoolId kOther{0, 7};
constexpr StreamId kCapturing = 5;
constexpr StreamId kEager = 0;

PoolFilter OnStream(StreamId stream) {
  return [stream](StreamId s) { return s == stream; };
}

class PoolTest : public EngineTest {
 protected:
  std::int64_t PoolReserved(PoolId pool) {
    const MemoryStats stats = Stats();
    auto it = stats.reserved_bytes_by_private_pools.find({pool.first, pool.second});
    return it == stats.reserved_bytes_by_private_pools.end() ? -1 : it->second.all().current;
  }
  PoolId OwnerOf(void* ptr) { return engine_->SegmentContaining(ptr)->owner; }
};

TEST_F(PoolTest, RoutedAllocationsComeFromThePoolsOwnSegments) {
  void* eager = Allocate(4096, kEager);
  ASSERT_TRUE(engine_->BeginAllocateToPool(kGraph, OnStream(kCapturing)).ok());
  void* captured = Allocate(4096, kCapturing);
  void* not_captured = Allocate(4096, kEager);
  ASSERT_TRUE(engine_->EndAllocateToPool(kGraph).ok());
  EXPECT_TRUE(OwnerOf(eager).IsDefault());
  EXPECT_TRUE(OwnerOf(not_captured).IsDefault());
  EXPECT_EQ(OwnerOf(captured), kGraph);
  EXPECT_EQ(Stats().segment.all().current, 2);  // one default, one private
  EXPECT_EQ(PoolReserved(kGraph), static_cast<std::int64_t>(2 * kMiB));
  Free(eager);
  Free(captured);
  Free(not_captured);
  ASSERT_TRUE(engine_->ReleasePool(kGraph).ok());
}

TEST_F(PoolTest, APoolsBlocksNeverServeAllocationsOutsideIt) {
  // The graph hazard at engine level: blocks freed inside a live pool (the
  // capture's intermediates) are cached, but only for that pool.
  ASSERT_TRUE(engine_->BeginAllocateToPool(kGraph, OnStream(kCapturing)).ok());
  void* intermediate = Allocate(1 << 20, kCapturing);
  Free(intermediate);
  ASSERT_TRUE(engine_->EndAllocateToPool(kGraph).ok());
  for (int i = 0; i < 8; ++i) {
    void* eager = Allocate(1 << 20, kCapturing);  // same stream, no route
    EXPECT_TRUE(OwnerOf(eager).IsDefault());
    EXPECT_NE(eager, intermediate);
    Free(eager);
  }
  // Back in the pool, the cached block is reused.
  ASSERT_TRUE(engine_->BeginAllocateToPool(kGraph, OnStream(kCapturing)).ok());
  void* again = Allocate(1 << 20, kCapturing);
  EXPECT_EQ(again, intermediate);
  Free(again);
  ASSERT_TRUE(engine_->EndAllocateToPool(kGraph).ok());
  ASSERT_TRUE(engine_->ReleasePool(kGraph).ok());
  ASSERT_TRUE(engine_->ReleasePool(kGraph).ok());
}

TEST_F(PoolTest, TheNewestMatchingRouteWins) {
  ASSERT_TRUE(engine_->BeginAllocateToPool(kGraph, [](StreamId) { return true; }).ok());
  ASSERT_TRUE(engine_->BeginAllocateToPool(kOther, OnStream(kCapturing)).ok());
  void* newest = Allocate(4096, kCapturing);
  void* older = Allocate(4096, kEager);
  EXPECT_EQ(OwnerOf(newest), kOther);
  EXPECT_EQ(OwnerOf(older), kGraph);
  EXPECT_TRUE(absl::IsFailedPrecondition(
      engine_->BeginAllocateToPool(kOther, OnStream(kCapturing))));  // already routed
  ASSERT_TRUE(engine_->EndAllocateToPool(kOther).ok());
  ASSERT_TRUE(engine_->EndAllocateToPool(kGraph).ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(engine_->EndAllocateToPool(kGraph)));
  Free(newest);
  Free(older);
  ASSERT_TRUE(engine_->ReleasePool(kGraph).ok());
  ASSERT_TRUE(engine_->ReleasePool(kOther).ok());
}

TEST_F(PoolTest, UseCountsFollowPyTorchsLifecycle) {
  ASSERT_TRUE(engine_->CreateOrIncrefPool(kGraph).ok());  // MemPool()
  EXPECT_EQ(*engine_->PoolUseCount(kGraph), 1);
  ASSERT_TRUE(engine_->BeginAllocateToPool(kGraph, OnStream(kCapturing)).ok());  // use_mem_pool
  EXPECT_EQ(*engine_->PoolUseCount(kGraph), 2);
  void* tensor = Allocate(4096, kCapturing);
  ASSERT_TRUE(engine_->EndAllocateToPool(kGraph).ok());
  ASSERT_TRUE(engine_->ReleasePool(kGraph).ok());
  EXPECT_EQ(*engine_->PoolUseCount(kGraph), 1);
  // The MemPool dies while the tensor lives: the pool stays, freeable.
  ASSERT_TRUE(engine_->ReleasePool(kGraph).ok());
  EXPECT_EQ(*engine_->PoolUseCount(kGraph), 0);
  ASSERT_TRUE(engine_->EmptyCache(kGraph).ok());
  EXPECT_EQ(Stats().segment.all().current, 1);  // the tensor's segment is in use
  EXPECT_TRUE(absl::IsFailedPrecondition(engine_->CreateOrIncrefPool(kGraph)));
  Free(tensor);
  ASSERT_TRUE(engine_->EmptyCache(kGraph).ok());
  EXPECT_EQ(Stats().segment.all().current, 0);
  EXPECT_TRUE(absl::IsNotFound(engine_->PoolUseCount(kGraph).status()));
  EXPECT_EQ(PoolReserved(kGraph), 0);  // kept until reset, at 0
  EXPECT_TRUE(absl::IsNotFound(engine_->ReleasePool(kGraph)));
}

TEST_F(PoolTest, LivePoolsKeepTheirSegmentsThroughEmptyCacheAndOutOfMemory) {
  ASSERT_TRUE(engine_->BeginAllocateToPool(kGraph, OnStream(kCapturing)).ok());
  Free(Allocate(1 << 20, kCapturing));
  ASSERT_TRUE(engine_->EndAllocateToPool(kGraph).ok());
  Free(Allocate(1 << 20, kEager));
  ASSERT_TRUE(engine_->EmptyCache().ok());
  EXPECT_EQ(Stats().segment.all().current, 1);
  EXPECT_EQ(PoolReserved(kGraph), static_cast<std::int64_t>(2 * kMiB));
  // Released, the pool's free segments go at the next EmptyCache.
  ASSERT_TRUE(engine_->ReleasePool(kGraph).ok());
  ASSERT_TRUE(engine_->EmptyCache().ok());
  EXPECT_EQ(Stats().segment.all().current, 0);
}

TEST_F(PoolTest, NoSplitPoolsHandOutWholeBlocks) {
  ASSERT_TRUE(engine_->CreateOrIncrefPool(kGraph).ok());
  ASSERT_TRUE(engine_->SetPoolNoSplit(kGraph).ok());
  ASSERT_TRUE(engine_->BeginAllocateToPool(kGraph, OnStream(kCapturing)).ok());
  void* small = Allocate(4096, kCapturing);
  EXPECT_EQ(engine_->GetBlock(small)->size, 2 * kMiB);
  ASSERT_TRUE(engine_->EndAllocateToPool(kGraph).ok());
  Free(small);
  ASSERT_TRUE(engine_->ReleasePool(kGraph).ok());
  ASSERT_TRUE(engine_->ReleasePool(kGraph).ok());
}

TEST_F(PoolTest, CheckPoolLiveAllocationsComparesExactly) {
  ASSERT_TRUE(engine_->BeginAllocateToPool(kGraph, OnStream(kCapturing)).ok());
  void* a = Allocate(4096, kCapturing);
  void* b = Allocate(8192, kCapturing);
  ASSERT_TRUE(engine_->EndAllocateToPool(kGraph).ok());
  const auto address = [](void* p) { return reinterpret_cast<std::uintptr_t>(p); };
  EXPECT_TRUE(*engine_->CheckPoolLiveAllocations(kGraph, {address(a), address(b)}));
  EXPECT_FALSE(*engine_->CheckPoolLiveAllocations(kGraph, {address(a)}));
  EXPECT_FALSE(*engine_->CheckPoolLiveAllocations(kGraph, {address(a), address(b), 1}));
  Free(b);
  EXPECT_TRUE(*engine_->CheckPoolLiveAllocations(kGraph, {address(a)}));
  EXPECT_TRUE(absl::IsNotFound(engine_->CheckPoolLiveAllocations(kOther, {}).status()));
  Free(a);
  ASSERT_TRUE(engine_->ReleasePool(kGraph).ok());
}

TEST_F(PoolTest, UseOnOomPoolsLendFreeBlocksBeforeTheAllocationFails) {
  EngineOptions options;
  options.memory_limit_bytes = 4 * kMiB;
  engine_ = std::make_unique<Engine>(
      std::make_unique<ControlledBackend>(ControlledBackendOptions{}), options);
  ASSERT_TRUE(engine_->CreateOrIncrefPool(kGraph).ok());
  ASSERT_TRUE(engine_->SetPoolUseOnOom(kGraph, true).ok());
  ASSERT_TRUE(engine_->BeginAllocateToPool(kGraph, OnStream(kEager)).ok());
  Free(Allocate(1 << 20, kEager));  // the pool caches a 2 MiB segment
  ASSERT_TRUE(engine_->EndAllocateToPool(kGraph).ok());
  ASSERT_TRUE(engine_->ReleasePool(kGraph).ok());
  void* fill_a = Allocate(1 << 20, kEager);  // the default pool's 2 MiB segment
  void* fill_b = Allocate(1 << 20, kEager);
  void* lent = Allocate(4096, kEager);  // a new segment is over the limit: lent by the pool
  EXPECT_EQ(OwnerOf(lent), kGraph);
  EXPECT_EQ(Stats().num_alloc_retries, 0);
  Free(fill_a);
  Free(fill_b);
  Free(lent);
  ASSERT_TRUE(engine_->ReleasePool(kGraph).ok());
}

// --- checkpoints ------------------------------------------------------------

TEST_F(PoolTest, ARestoredCheckpointRecreatesItsLiveBlocksAndFreesTheRest) {
  ASSERT_TRUE(engine_->BeginAllocateToPool(kGraph, OnStream(kCapturing)).ok());
  void* a = Allocate(100 << 10, kCapturing);
  void* b = Allocate(200 << 10, kCapturing);
  void* c = Allocate(300 << 10, kCapturing);
  Free(b);
  absl::StatusOr<PoolCheckpoint> checkpoint = engine_->GetPoolCheckpoint(kGraph);
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
  ASSERT_EQ(checkpoint->segments.size(), 1u);
  // Another path: a and c die, new blocks take their places.
  Free(a);
  Free(c);
  void* d = Allocate(500 << 10, kCapturing);
  ASSERT_TRUE(engine_->EndAllocateToPool(kGraph).ok());
  const std::vector<SegmentInfo> before = engine_->GetSegments(kGraph);

  absl::StatusOr<CheckpointRestore> restored = engine_->RestorePoolCheckpoint(*checkpoint);
  ASSERT_TRUE(restored.ok()) << restored.status();
  EXPECT_EQ(restored->freed, std::vector<std::uintptr_t>{Address(d)});
  EXPECT_EQ(restored->allocated, (std::vector<std::uintptr_t>{Address(a), Address(c)}));
  // The pool's layout is exactly the checkpoint's.
  const std::vector<SegmentInfo> after = engine_->GetSegments(kGraph);
  ASSERT_EQ(after.size(), 1u);
  ASSERT_EQ(after[0].blocks.size(), checkpoint->segments[0].blocks.size());
  for (std::size_t i = 0; i < after[0].blocks.size(); ++i) {
    const PoolCheckpoint::Block& want = checkpoint->segments[0].blocks[i];
    EXPECT_EQ(after[0].blocks[i].address, want.address);
    EXPECT_EQ(after[0].blocks[i].size, want.size);
    EXPECT_EQ(after[0].blocks[i].state == BlockState::kAllocated, want.allocated);
  }
  EXPECT_EQ(Stats().allocation.all().current, 2);
  EXPECT_POOL_INTACT(*engine_);
  Free(a);
  Free(c);
  ASSERT_TRUE(engine_->ReleasePool(kGraph).ok());
  (void)before;
}

TEST_F(PoolTest, ACheckpointNamingAVanishedSegmentChangesNothing) {
  ASSERT_TRUE(engine_->BeginAllocateToPool(kGraph, OnStream(kCapturing)).ok());
  void* a = Allocate(4096, kCapturing);
  ASSERT_TRUE(engine_->EndAllocateToPool(kGraph).ok());
  PoolCheckpoint checkpoint = *engine_->GetPoolCheckpoint(kGraph);
  checkpoint.segments[0].address += 4 * kMiB;  // not the pool's any more
  checkpoint.segments[0].blocks[0].address += 4 * kMiB;
  const absl::StatusOr<CheckpointRestore> restored = engine_->RestorePoolCheckpoint(checkpoint);
  EXPECT_TRUE(absl::IsFailedPrecondition(restored.status())) << restored.status();
  EXPECT_EQ(engine_->GetBlock(a)->state, BlockState::kAllocated);  // untouched
  Free(a);
  ASSERT_TRUE(engine_->ReleasePool(kGraph).ok());
}

TEST_F(PoolTest, CheckpointsRefuseBlocksWaitingOnOtherStreams) {
  ASSERT_TRUE(engine_->BeginAllocateToPool(kGraph, OnStream(kCapturing)).ok());
  void* a = Allocate(4096, kCapturing);
  ASSERT_TRUE(engine_->EndAllocateToPool(kGraph).ok());
  ASSERT_TRUE(engine_->RecordStream(a, 9).ok());
  Free(a);  // pending on stream 9
  EXPECT_TRUE(absl::IsFailedPrecondition(engine_->GetPoolCheckpoint(kGraph).status()));
  backend_->CompleteStream(9);
  EXPECT_TRUE(engine_->GetPoolCheckpoint(kGraph).ok());
  ASSERT_TRUE(engine_->ReleasePool(kGraph).ok());
}

}  // namespace
}  // namespace torchmem
