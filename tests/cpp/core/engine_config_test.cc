// The PYTORCH_CUDA_ALLOC_CONF knobs the engine implements, with PyTorch's
// meanings: max_split_size (oversize blocks), max_non_split_rounding,
// roundup_power2_divisions and garbage_collection_threshold.
#include "gtest/gtest.h"
#include "tests/cpp/support/engine_fixture.h"

namespace torchmem {
namespace {

using testing::EngineTest;

SizePolicy WithMaxSplit(std::size_t max_split) {
  SizePolicy policy = SizePolicy::PyTorchDefault();
  policy.max_split_size = max_split;
  return policy;
}

TEST(SizePolicyConfigTest, PowerOfTwoDivisionsRoundLikePyTorch) {
  SizePolicy policy = SizePolicy::PyTorchDefault();
  policy.roundup_power2_divisions.fill(4);
  policy.Refresh();
  // 1.2 MiB lies in [1 MiB, 2 MiB): steps of 256 KiB.
  EXPECT_EQ(policy.RoundSize(1258291), 1310720u);
  EXPECT_EQ(policy.RoundSize(1 << 20), 1u << 20);  // powers of two stay
  EXPECT_EQ(policy.RoundSize(1310720), 1310720u);  // on a step: stays
  // Small sizes (not above 512 B x divisions) keep the 512 B rounding.
  EXPECT_EQ(policy.RoundSize(1200), 1536u);
  // A per-interval setting: only [64 MiB, 128 MiB) divided in 2.
  SizePolicy per_interval = SizePolicy::PyTorchDefault();
  per_interval.roundup_power2_divisions[6] = 2;
  per_interval.Refresh();
  EXPECT_EQ(per_interval.RoundSize(70 << 20), std::size_t{96} << 20);
  EXPECT_EQ(per_interval.RoundSize(35 << 20), std::size_t{35} << 20);
}

TEST(SizePolicyConfigTest, ValidationNamesTheBadKnob) {
  SizePolicy odd = SizePolicy::PyTorchDefault();
  odd.roundup_power2_divisions[0] = 3;
  EXPECT_NE(odd.Validate().message().find("powers of two"), std::string::npos);
  SizePolicy tiny = WithMaxSplit(19 * kMiB);  // PyTorch requires at least 20 MiB
  EXPECT_NE(tiny.Validate().message().find("max_split_size"), std::string::npos);
  EXPECT_TRUE(WithMaxSplit(20 * kMiB).Validate().ok());  // PyTorch's smallest
}

class MaxSplitTest : public EngineTest {
 protected:
  MaxSplitTest() : EngineTest({}, EngineOptions{.policy = WithMaxSplit(40 * kMiB)}) {}
};

TEST_F(MaxSplitTest, OversizeBlocksServeOnlyOversizeRequestsOfCloseSize) {
  void* big = Allocate(70 * kMiB);
  EXPECT_EQ(Stats().oversize_allocations.current, 1);
  EXPECT_EQ(Stats().oversize_segments.current, 1);
  EXPECT_EQ(Stats().max_split_size, static_cast<std::int64_t>(40 * kMiB));
  Free(big);
  EXPECT_EQ(Stats().oversize_allocations.current, 0);
  // A smaller request never takes the cached oversize block ...
  void* small = Allocate(20 * kMiB);
  EXPECT_NE(small, big);
  Free(small);
  // ... an oversize one within max_non_split_rounding (20 MiB) does, unsplit.
  void* close = Allocate(55 * kMiB);
  EXPECT_EQ(close, big);
  EXPECT_EQ(engine_->GetBlock(close)->size, 70 * kMiB);
  Free(close);
  // Further apart, it does not.
  void* far = Allocate(45 * kMiB);
  EXPECT_NE(far, big);
  Free(far);
}

TEST_F(MaxSplitTest, OutOfMemoryReleasesOversizeBlocksFirst) {
  engine_->SetMemoryLimit(120 * kMiB);
  Free(Allocate(50 * kMiB));
  Free(Allocate(60 * kMiB));
  // 110 MiB cached in two oversize blocks, which a 39 MiB request may not
  // use. Its 40 MiB segment needs room: the smallest oversize block that
  // covers it goes, not everything.
  void* medium = Allocate(39 * kMiB);
  EXPECT_EQ(Stats().num_device_free, 1);
  EXPECT_EQ(Stats().num_alloc_retries, 0);  // the full release was not needed
  EXPECT_EQ(Stats().reserved_bytes.all().current, static_cast<std::int64_t>(100 * kMiB));
  Free(medium);
}

TEST_F(EngineTest, GarbageCollectionReleasesTheOldestCachedBlocksPastTheThreshold) {
  engine_->SetMemoryLimit(100 * kMiB);
  engine_->SetGarbageCollectionThreshold(0.6);
  void* a = Allocate(12 * kMiB);
  void* b = Allocate(14 * kMiB);
  void* c = Allocate(16 * kMiB);
  void* d = Allocate(18 * kMiB);
  Free(a);
  Free(b);
  // Lookups in the large pool (any stream, as PyTorch counts them) age the
  // cached blocks; these are served on another stream.
  void* m1 = Allocate(2 * kMiB, /*stream=*/1);
  void* m2 = Allocate(2 * kMiB, /*stream=*/1);
  Free(c);
  Free(d);
  // Reserved: 60 MiB cached + 20 MiB = 80 MiB, over 60% of 100 MiB. A new
  // segment triggers collection of the blocks at least as old as average.
  void* e = Allocate(30 * kMiB);
  EXPECT_EQ(Stats().num_device_free, 2);
  const std::vector<SegmentInfo> segments = engine_->GetSegments();
  std::vector<std::size_t> sizes;
  for (const SegmentInfo& segment : segments) sizes.push_back(segment.size);
  std::sort(sizes.begin(), sizes.end());
  EXPECT_EQ(sizes, (std::vector<std::size_t>{16 * kMiB, 18 * kMiB, 20 * kMiB, 30 * kMiB}));
  Free(m1);
  Free(m2);
  Free(e);
}

TEST_F(EngineTest, APolicyAdoptedLaterShapesOnlyNewAllocations) {
  void* before = Allocate(1258291);
  SizePolicy policy = SizePolicy::PyTorchDefault();
  policy.roundup_power2_divisions.fill(4);
  ASSERT_TRUE(engine_->SetSizePolicy(policy).ok());
  void* after = Allocate(1258291);
  EXPECT_EQ(engine_->GetBlock(before)->size, 1258496u);
  EXPECT_EQ(engine_->GetBlock(after)->size, 1310720u);
  SizePolicy bad = policy;
  bad.min_block_size = 1024;
  EXPECT_TRUE(absl::IsInvalidArgument(engine_->SetSizePolicy(bad)));
  Free(before);
  Free(after);
}

}  // namespace
}  // namespace torchmem
