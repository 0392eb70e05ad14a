#include "torchmem/core/size_policy.h"

#include "gtest/gtest.h"

namespace torchmem {
namespace {

TEST(SizePolicyTest, RoundsRequestsUpTo512Bytes) {
  const SizePolicy policy = SizePolicy::PyTorchDefault();
  EXPECT_EQ(policy.RoundSize(1), 512u);
  EXPECT_EQ(policy.RoundSize(512), 512u);
  EXPECT_EQ(policy.RoundSize(513), 1024u);
  EXPECT_EQ(policy.RoundSize(1000000), 1000448u);
}

TEST(SizePolicyTest, SmallPoolServesUpToOneMebibyte) {
  const SizePolicy policy = SizePolicy::PyTorchDefault();
  EXPECT_EQ(policy.PoolFor(kMiB), PoolKind::kSmall);
  EXPECT_EQ(policy.PoolFor(kMiB + 512), PoolKind::kLarge);
}

TEST(SizePolicyTest, SegmentSizesMatchPyTorch) {
  const SizePolicy policy = SizePolicy::PyTorchDefault();
  EXPECT_EQ(policy.SegmentSizeFor(512), 2 * kMiB);
  EXPECT_EQ(policy.SegmentSizeFor(kMiB), 2 * kMiB);
  EXPECT_EQ(policy.SegmentSizeFor(kMiB + 512), 20 * kMiB);
  EXPECT_EQ(policy.SegmentSizeFor(10 * kMiB - 512), 20 * kMiB);
  EXPECT_EQ(policy.SegmentSizeFor(10 * kMiB), 10 * kMiB);
  EXPECT_EQ(policy.SegmentSizeFor(10 * kMiB + 512), 12 * kMiB);
}

TEST(SizePolicyTest, SplitsLeaveUsefulRemainders) {
  const SizePolicy policy = SizePolicy::PyTorchDefault();
  EXPECT_TRUE(policy.ShouldSplit(PoolKind::kSmall, 2 * kMiB, 2 * kMiB - 512));
  EXPECT_FALSE(policy.ShouldSplit(PoolKind::kSmall, 1024, 1024));
  // Large pool remainders must exceed the small-size limit.
  EXPECT_FALSE(policy.ShouldSplit(PoolKind::kLarge, 20 * kMiB, 19 * kMiB));
  EXPECT_TRUE(policy.ShouldSplit(PoolKind::kLarge, 20 * kMiB, 19 * kMiB - 512));
}

TEST(SizePolicyTest, ValidateRejectsInconsistentPolicies) {
  EXPECT_TRUE(SizePolicy::PyTorchDefault().Validate().ok());
  SizePolicy not_power_of_two;
  not_power_of_two.min_block_size = 500;
  EXPECT_FALSE(not_power_of_two.Validate().ok());
  SizePolicy small_too_big;
  small_too_big.small_size = 4 * kMiB;
  EXPECT_FALSE(small_too_big.Validate().ok());
  SizePolicy unaligned;
  unaligned.large_rounding = 3 * kMiB;
  EXPECT_FALSE(unaligned.Validate().ok());
}

TEST(SizePolicyTest, IsConfigurable) {
  SizePolicy policy;
  policy.small_segment_size = 4 * kMiB;
  ASSERT_TRUE(policy.Validate().ok());
  EXPECT_EQ(policy.SegmentSizeFor(4096), 4 * kMiB);
}

}  // namespace
}  // namespace torchmem
