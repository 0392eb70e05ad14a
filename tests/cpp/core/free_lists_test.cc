// FreeLists on its own: best fit, PyTorch's order among equal sizes, the
// bitmaps after removals, and the oversized set.
#include "torchmem/core/free_lists.h"

#include <cstdint>
#include <deque>
#include <vector>

#include "gtest/gtest.h"
#include "torchmem/core/block.h"

namespace torchmem {
namespace {

constexpr std::size_t kUnit = 512;

// Segments and free blocks made by hand, as the engine would lay them out.
class FreeListsTest : public ::testing::Test {
 protected:
  Segment* NewSegment(std::uint64_t registration, std::uintptr_t address) {
    Segment& segment = segments_.emplace_back();
    segment.registration = registration;
    segment.address = address;
    segment.size = std::size_t{1} << 40;
    return &segment;
  }
  Block* NewFreeBlock(Segment* segment, std::uintptr_t address, std::size_t size) {
    Block& block = blocks_.emplace_back();
    block.segment = segment;
    block.address = address;
    block.size = size;
    return &block;
  }

  FreeLists lists_{kUnit};
  std::deque<Segment> segments_;
  std::deque<Block> blocks_;
};

TEST_F(FreeListsTest, BestFitIsTheSmallestBlockThatFits) {
  Segment* segment = NewSegment(1, 0x100000);
  Block* small = NewFreeBlock(segment, 0x100000, 1024);
  Block* medium = NewFreeBlock(segment, 0x200000, 8192);
  Block* large = NewFreeBlock(segment, 0x300000, 1 << 20);
  for (Block* block : {large, small, medium}) lists_.Insert(block);

  EXPECT_EQ(lists_.PeekBestFit(512), small);
  EXPECT_EQ(lists_.PeekBestFit(1536), medium);
  EXPECT_EQ(lists_.size(), 3u);  // Peek removes nothing
  EXPECT_EQ(lists_.TakeBestFit(8192), medium);
  EXPECT_EQ(medium->index, FreeIndex::kNone);
  // The class of 8 KiB is empty now: its bit is clear, so the next fit is
  // the 1 MiB block, not a stale head.
  EXPECT_EQ(lists_.TakeBestFit(4096), large);
  EXPECT_EQ(lists_.TakeBestFit(4096), nullptr);
  EXPECT_EQ(lists_.FindMisplaced(), nullptr);
}

TEST_F(FreeListsTest, EqualSizesGoOldestSegmentFirstThenLowestAddress) {
  // PyTorch 2.14 breaks ties by the segment's creation order, then address:
  // the newer segment sits at a lower address here, as on the simulated
  // device, and must still come second.
  Segment* older = NewSegment(1, 0x900000);
  Segment* newer = NewSegment(2, 0x100000);
  Block* newer_low = NewFreeBlock(newer, 0x100000, 4096);
  Block* older_high = NewFreeBlock(older, 0x980000, 4096);
  Block* older_low = NewFreeBlock(older, 0x900000, 4096);
  for (Block* block : {newer_low, older_high, older_low}) lists_.Insert(block);
  EXPECT_EQ(lists_.FindMisplaced(), nullptr);

  EXPECT_EQ(lists_.TakeBestFit(4096), older_low);
  EXPECT_EQ(lists_.TakeBestFit(4096), older_high);
  EXPECT_EQ(lists_.TakeBestFit(4096), newer_low);
}

TEST_F(FreeListsTest, OrderFollowsTheSegmentEvenIfTheBlockCopyIsStale) {
  // Blocks keep a copy of their segment's registration for the ordering;
  // Insert refreshes it, so a block recycled from another segment cannot
  // carry an old creation order into the list.
  Segment* older = NewSegment(1, 0x900000);
  Segment* newer = NewSegment(7, 0x100000);
  Block* from_newer = NewFreeBlock(newer, 0x100000, 4096);
  from_newer->registration = 0;  // stale: would sort first if trusted
  Block* from_older = NewFreeBlock(older, 0x900000, 4096);
  lists_.Insert(from_newer);
  lists_.Insert(from_older);
  EXPECT_EQ(lists_.TakeBestFit(4096), from_older);
}

TEST_F(FreeListsTest, RemovingFromTheMiddleKeepsTheListLinked) {
  Segment* segment = NewSegment(1, 0x100000);
  std::vector<Block*> blocks;
  for (int i = 0; i < 4; ++i) {
    blocks.push_back(NewFreeBlock(segment, 0x100000 + i * 0x10000, 2048));
    lists_.Insert(blocks.back());
  }
  lists_.Remove(blocks[1]);
  lists_.Remove(blocks[2]);
  EXPECT_EQ(blocks[1]->list_prev, nullptr);
  EXPECT_EQ(blocks[1]->list_next, nullptr);
  EXPECT_EQ(lists_.FindMisplaced(), nullptr);
  EXPECT_EQ(lists_.TakeBestFit(2048), blocks[0]);
  EXPECT_EQ(lists_.TakeBestFit(2048), blocks[3]);
  EXPECT_EQ(lists_.size(), 0u);
}

TEST_F(FreeListsTest, BlocksAboveTheClassesComeFromTheOversizedSet) {
  const std::size_t above_classes = FreeLists::kClassCount * kUnit;  // 32 MiB
  Segment* segment = NewSegment(1, 0x10000000);
  Block* class_block = NewFreeBlock(segment, 0x10000000, 4096);
  Block* big = NewFreeBlock(segment, 0x20000000, above_classes * 2);
  Block* bigger = NewFreeBlock(segment, 0x40000000, above_classes * 4);
  for (Block* block : {bigger, class_block, big}) lists_.Insert(block);
  EXPECT_EQ(big->index, FreeIndex::kOversized);

  // Any class block is smaller than any oversized one.
  EXPECT_EQ(lists_.PeekBestFit(4096), class_block);
  EXPECT_EQ(lists_.PeekBestFit(above_classes), big);
  EXPECT_EQ(lists_.TakeBestFit(above_classes * 3), bigger);
  int visited = 0;
  lists_.ForEachFree([&visited](const Block*) { ++visited; });
  EXPECT_EQ(visited, 2);
}

TEST_F(FreeListsTest, FindMisplacedReportsABlockOutOfOrder) {
  Segment* segment = NewSegment(1, 0x100000);
  Block* low = NewFreeBlock(segment, 0x100000, 4096);
  Block* high = NewFreeBlock(segment, 0x200000, 4096);
  lists_.Insert(low);
  lists_.Insert(high);
  ASSERT_EQ(lists_.FindMisplaced(), nullptr);
  high->address = 0x80000;  // now it should come first, but the list says second
  EXPECT_EQ(lists_.FindMisplaced(), high);
  high->address = 0x200000;
}

}  // namespace
}  // namespace torchmem
