// Allocation, splitting, merging and reuse.
#include <vector>

#include "gtest/gtest.h"
#include "tests/cpp/support/engine_fixture.h"

namespace torchmem {
namespace {

using testing::EngineTest;

TEST_F(EngineTest, SmallRequestCarvesA2MiBSegment) {
  void* ptr = Allocate(1000);
  const MemoryStats stats = Stats();
  EXPECT_EQ(stats.reserved_bytes.all().current, 2 * kMiB);
  EXPECT_EQ(stats.reserved_bytes.pool(PoolKind::kSmall).current, 2 * kMiB);
  EXPECT_EQ(stats.allocated_bytes.all().current, 1024);
  EXPECT_EQ(stats.requested_bytes.all().current, 1000);
  EXPECT_EQ(stats.inactive_split_bytes.all().current, 2 * kMiB - 1024);
  EXPECT_EQ(stats.num_device_alloc, 1);
  Free(ptr);
}

TEST_F(EngineTest, SplitBlocksAreContiguousInTheSegment) {
  void* a = Allocate(512);
  void* b = Allocate(512);
  void* c = Allocate(4096);
  EXPECT_EQ(Address(b), Address(a) + 512);
  EXPECT_EQ(Address(c), Address(b) + 512);
  EXPECT_EQ(Stats().segment.all().current, 1);
  Free(a);
  Free(b);
  Free(c);
}

TEST_F(EngineTest, FreedBlockIsReusedForTheSameSize) {
  void* a = Allocate(3000);
  Free(a);
  void* b = Allocate(3000);
  EXPECT_EQ(a, b);
  EXPECT_EQ(Stats().num_device_alloc, 1);
  Free(b);
}

TEST_F(EngineTest, BestFitPicksTheSmallestFreeBlockThatFits) {
  // Three free holes of 4 KiB, 1 KiB and 2 KiB, separated by live blocks.
  void* hole_4k = Allocate(4096);
  void* keep1 = Allocate(512);
  void* hole_1k = Allocate(1024);
  void* keep2 = Allocate(512);
  void* hole_2k = Allocate(2048);
  void* keep3 = Allocate(512);
  Free(hole_4k);
  Free(hole_1k);
  Free(hole_2k);
  // 1.5 KiB fits the 2 KiB hole best (not the 4 KiB one, nor the segment tail).
  void* ptr = Allocate(1536);
  EXPECT_EQ(ptr, hole_2k);
  for (void* p : {ptr, keep1, keep2, keep3}) Free(p);
}

// Segments at decreasing addresses, as mmap and the simulated CUDA device
// hand them out.
class TopDownEngineTest : public EngineTest {
 protected:
  TopDownEngineTest() : EngineTest(ControlledBackendOptions{.top_down_addresses = true}) {}
};

// PyTorch 2.14 breaks ties between free blocks of equal size by the age of
// their segment, then by address: with segments at decreasing addresses,
// lowest address first would place differently and reserve more than it.
TEST_F(TopDownEngineTest, AmongEqualFreeBlocksTheOlderSegmentsIsHandedOutFirst) {
  void* older = Allocate(16 * kMiB);
  void* newer = Allocate(16 * kMiB);
  ASSERT_GT(Address(older), Address(newer));
  Free(older);
  Free(newer);

  void* ptr = Allocate(4 * kMiB);

  EXPECT_EQ(ptr, older);
  Free(ptr);
}

TEST_F(TopDownEngineTest, OversizedFreeBlocksAlsoPreferTheOlderSegment) {
  // Above 32 MiB, free blocks live in an ordered set rather than class lists.
  void* older = Allocate(40 * kMiB);
  void* newer = Allocate(40 * kMiB);
  Free(newer);
  Free(older);

  void* ptr = Allocate(34 * kMiB);

  EXPECT_EQ(ptr, older);
  Free(ptr);
}

TEST_F(TopDownEngineTest, WithinOneSegmentTheLowerAddressIsHandedOutFirst) {
  void* low_hole = Allocate(4096);
  void* keep1 = Allocate(512);
  void* high_hole = Allocate(4096);
  void* keep2 = Allocate(512);
  Free(high_hole);
  Free(low_hole);

  void* ptr = Allocate(4096);

  EXPECT_EQ(ptr, low_hole);
  for (void* p : {ptr, keep1, keep2}) Free(p);
}

TEST_F(EngineTest, BestFitSplitsTheSmallestHoleRatherThanTheSegmentTail) {
  void* hole_8k = Allocate(8192);
  void* keep = Allocate(512);
  Free(hole_8k);
  // 6 KiB: the 8 KiB hole is a better fit than the segment's tail.
  void* ptr = Allocate(6144);
  EXPECT_EQ(ptr, hole_8k);
  Free(ptr);
  Free(keep);
}

TEST_F(EngineTest, AdjacentFreeBlocksMergeBackIntoOneSegmentBlock) {
  std::vector<void*> blocks;
  for (int i = 0; i < 8; ++i) blocks.push_back(Allocate(64 * kKiB));
  for (void* ptr : blocks) Free(ptr);
  const std::vector<SegmentInfo> segments = engine_->GetSegments();
  ASSERT_EQ(segments.size(), 1u);
  EXPECT_EQ(segments[0].blocks.size(), 1u);
  EXPECT_EQ(Stats().inactive_split_bytes.all().current, 0);
}

TEST_F(EngineTest, InactiveSplitCountsNetChangesPerOperationAsPyTorchDoes) {
  // PyTorch applies one net change per allocation or free (alloc_found_block,
  // free_block), so its allocated/freed/peak counters count splits made and
  // merged away, not every intermediate step.
  void* a = Allocate(512 * kKiB);  // splits the 2 MiB segment: +1 (the tail)
  void* b = Allocate(512 * kKiB);  // shrinks the split tail: bytes only
  Free(a);                         // a new inactive split block: +1
  Free(b);                         // merges a, b and the tail: -2, unsplit
  const Stat blocks = Stats().inactive_split.all();
  const Stat bytes = Stats().inactive_split_bytes.all();
  EXPECT_EQ(blocks.allocated, 2);
  EXPECT_EQ(blocks.freed, 2);
  EXPECT_EQ(blocks.peak, 2);
  EXPECT_EQ(blocks.current, 0);
  EXPECT_EQ(bytes.allocated, static_cast<std::int64_t>(1536 * kKiB + 512 * kKiB));
  EXPECT_EQ(bytes.freed, static_cast<std::int64_t>(512 * kKiB + 1536 * kKiB));
  EXPECT_EQ(bytes.peak, static_cast<std::int64_t>(1536 * kKiB));
}

TEST_F(EngineTest, FreedNeighboursMergeSoALargerRequestFitsWithoutGrowing) {
  // Fill a 2 MiB segment with 512 KiB blocks, free them all (they merge),
  // then ask for 1 MiB: it fits in the merged space.
  std::vector<void*> blocks;
  for (int i = 0; i < 4; ++i) blocks.push_back(Allocate(512 * kKiB));
  EXPECT_EQ(Stats().segment.all().current, 1);
  for (void* ptr : blocks) Free(ptr);
  void* big = Allocate(kMiB);
  EXPECT_EQ(Stats().segment.all().current, 1);
  EXPECT_EQ(Stats().num_device_alloc, 1);
  Free(big);
}

TEST_F(EngineTest, MediumRequestsShareA20MiBSegment) {
  void* a = Allocate(3 * kMiB);
  void* b = Allocate(5 * kMiB);
  const MemoryStats stats = Stats();
  EXPECT_EQ(stats.segment.pool(PoolKind::kLarge).current, 1);
  EXPECT_EQ(stats.reserved_bytes.pool(PoolKind::kLarge).current, 20 * kMiB);
  EXPECT_EQ(Address(b), Address(a) + 3 * kMiB);
  Free(a);
  Free(b);
}

TEST_F(EngineTest, LargeRequestGetsItsOwnSegmentRoundedTo2MiB) {
  void* ptr = Allocate(25 * kMiB + 1);
  const MemoryStats stats = Stats();
  EXPECT_EQ(stats.reserved_bytes.all().current, 26 * kMiB);
  // The 1 MiB - 512 B remainder is not split off: the whole segment is the block.
  EXPECT_EQ(stats.allocated_bytes.all().current, static_cast<std::int64_t>(26 * kMiB));
  EXPECT_EQ(stats.requested_bytes.all().current, static_cast<std::int64_t>(25 * kMiB + 1));
  Free(ptr);
}

TEST_F(EngineTest, LargePoolDoesNotSplitOffSlivers) {
  // 19 MiB from a 20 MiB segment would leave exactly 1 MiB: not split, so
  // the whole segment is handed out (and counted as allocated, as in PyTorch).
  void* ptr = Allocate(9 * kMiB);
  Free(ptr);
  void* whole = Allocate(19 * kMiB);
  EXPECT_EQ(Stats().allocated_bytes.all().current, static_cast<std::int64_t>(20 * kMiB));
  EXPECT_EQ(Stats().requested_bytes.all().current, static_cast<std::int64_t>(19 * kMiB));
  Free(whole);
}

TEST_F(EngineTest, SmallAndLargePoolsNeverShareSegments) {
  void* large = Allocate(2 * kMiB);
  Free(large);
  void* small = Allocate(4096);
  EXPECT_EQ(Stats().segment.pool(PoolKind::kSmall).current, 1);
  EXPECT_EQ(Stats().segment.pool(PoolKind::kLarge).current, 1);
  Free(small);
}

TEST_F(EngineTest, EmptyCacheReturnsFullyFreeSegmentsOnly) {
  void* live = Allocate(4096);
  void* cached = Allocate(3 * kMiB);
  Free(cached);
  ASSERT_TRUE(engine_->EmptyCache().ok());
  const MemoryStats stats = Stats();
  EXPECT_EQ(stats.segment.all().current, 1);  // the small segment holding `live`
  EXPECT_EQ(stats.num_device_free, 1);
  EXPECT_EQ(backend_->live_segment_bytes(), 2 * kMiB);
  Free(live);
  ASSERT_TRUE(engine_->EmptyCache().ok());
  EXPECT_EQ(Stats().reserved_bytes.all().current, 0);
  EXPECT_EQ(backend_->live_segments(), 0);
}

TEST_F(EngineTest, StreamsHaveSeparateCaches) {
  void* on_default = Allocate(4096, /*stream=*/0);
  Free(on_default);
  void* on_other = Allocate(4096, /*stream=*/7);
  EXPECT_NE(on_default, on_other);
  EXPECT_EQ(Stats().segment.all().current, 2);
  Free(on_other);
}

TEST_F(EngineTest, PeaksAndAccumulatedCountersReset) {
  void* a = Allocate(kMiB);
  Free(a);
  MemoryStats stats = Stats();
  EXPECT_EQ(stats.allocated_bytes.all().peak, static_cast<std::int64_t>(kMiB));
  EXPECT_EQ(stats.allocated_bytes.all().allocated, static_cast<std::int64_t>(kMiB));
  EXPECT_EQ(stats.allocated_bytes.all().freed, static_cast<std::int64_t>(kMiB));
  engine_->ResetPeakStats();
  engine_->ResetAccumulatedStats();
  stats = Stats();
  EXPECT_EQ(stats.allocated_bytes.all().peak, 0);
  EXPECT_EQ(stats.allocated_bytes.all().allocated, 0);
  EXPECT_EQ(stats.num_device_alloc, 0);
  EXPECT_EQ(stats.reserved_bytes.all().peak, static_cast<std::int64_t>(2 * kMiB));
}

TEST_F(EngineTest, FlattenedStatsUsePyTorchKeys) {
  void* ptr = Allocate(100);
  const auto flat = Stats().Flatten();
  auto value = [&flat](const std::string& key) -> std::int64_t {
    for (const auto& [name, v] : flat) {
      if (name == key) return v;
    }
    ADD_FAILURE() << "missing key " << key;
    return -1;
  };
  EXPECT_EQ(value("allocated_bytes.all.current"), 512);
  EXPECT_EQ(value("requested_bytes.small_pool.current"), 100);
  EXPECT_EQ(value("allocation.all.current"), 1);
  EXPECT_EQ(value("segment.large_pool.current"), 0);
  EXPECT_EQ(value("num_device_alloc"), 1);
  EXPECT_EQ(value("max_split_size"), -1);
  EXPECT_EQ(value("num_oom_rejections"), 0);
  EXPECT_EQ(flat.size(), 9u * 3 * 4 + 2 * 4 + 7);
  Free(ptr);
}

TEST_F(EngineTest, BlockMetadataIsStampedAtAllocation) {
  void* a = Allocate(700, /*stream=*/3);
  void* b = Allocate(100, /*stream=*/3);
  absl::StatusOr<BlockInfo> info = engine_->GetBlock(a);
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->requested_size, 700u);
  EXPECT_EQ(info->size, 1024u);
  EXPECT_EQ(info->stream, 3u);
  EXPECT_EQ(info->pool, PoolKind::kSmall);
  EXPECT_EQ(info->tag, kNoTag);
  EXPECT_EQ(info->scope, kNoScope);
  EXPECT_LT(info->sequence, engine_->GetBlock(b)->sequence);
  Free(a);
  Free(b);
}

TEST_F(EngineTest, FragmentationTreatsAdjacentFreeBlocksAsOneExtent) {
  void* a = Allocate(512 * kKiB);
  void* b = Allocate(512 * kKiB);
  void* keep = Allocate(512 * kKiB);
  Free(a);
  Free(b);  // a and b merge into one 1 MiB free block
  const FragmentationReport report = engine_->GetFragmentation();
  EXPECT_EQ(report.all.reserved_bytes, static_cast<std::int64_t>(2 * kMiB));
  EXPECT_EQ(report.all.free_bytes, static_cast<std::int64_t>(1536 * kKiB));
  EXPECT_EQ(report.all.free_extents, 2);  // [a+b] and the tail
  EXPECT_EQ(report.all.largest_free_extent, static_cast<std::int64_t>(kMiB));
  EXPECT_NEAR(report.all.external_fragmentation, 1.0 - 1024.0 / 1536.0, 1e-9);
  EXPECT_EQ(report.all.inactive_split_bytes, static_cast<std::int64_t>(1536 * kKiB));
  EXPECT_EQ(report.small_pool.free_bytes, report.all.free_bytes);
  EXPECT_EQ(report.large_pool.free_bytes, 0);
  ASSERT_EQ(report.by_stream.size(), 1u);
  // 1 MiB extent in bucket 20, 512 KiB extent in bucket 19.
  ASSERT_GE(report.all.histogram_counts.size(), 21u);
  EXPECT_EQ(report.all.histogram_counts[20], 1);
  EXPECT_EQ(report.all.histogram_counts[19], 1);
  Free(keep);
}

TEST_F(EngineTest, FragmentationCountsRoundingWaste) {
  void* ptr = Allocate(1000);
  EXPECT_EQ(engine_->GetFragmentation().all.internal_waste_bytes, 24);
  Free(ptr);
}

}  // namespace
}  // namespace torchmem
