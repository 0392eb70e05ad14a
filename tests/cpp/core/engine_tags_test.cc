// Per-tag accounting: the innermost tag of the allocating thread is charged,
// and a free credits the tag stamped on the block, whichever thread frees it.
#include <thread>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "tests/cpp/support/engine_fixture.h"

namespace torchmem {
namespace {

using testing::EngineTest;

TagId Tag(const char* name) {
  absl::StatusOr<TagId> tag = TagRegistry::Intern(name);
  EXPECT_TRUE(tag.ok());
  return *tag;
}

TagUsage UsageOf(const Engine& engine, TagId tag) {
  for (const TagUsage& usage : engine.GetTagUsage()) {
    if (usage.tag == tag) return usage;
  }
  return TagUsage{.tag = tag};
}

TEST(TagRegistryTest, InterningIsStableAndNamesRoundTrip) {
  const TagId a = Tag("registry-a");
  EXPECT_EQ(Tag("registry-a"), a);
  EXPECT_NE(Tag("registry-b"), a);
  EXPECT_EQ(TagRegistry::Name(a), "registry-a");
  EXPECT_EQ(TagRegistry::Name(kNoTag), "untagged");
  EXPECT_TRUE(absl::IsInvalidArgument(TagRegistry::Intern("").status()));
  EXPECT_TRUE(absl::IsInvalidArgument(TagRegistry::Intern(std::string(1000, 'x')).status()));
}

TEST(TagStackTest, PopMustMatchTheInnermostTag) {
  const TagId outer = Tag("stack-outer");
  const TagId inner = Tag("stack-inner");
  ASSERT_TRUE(PushTag(outer).ok());
  ASSERT_TRUE(PushTag(inner).ok());
  const absl::Status wrong = PopTag(outer);
  EXPECT_TRUE(absl::IsFailedPrecondition(wrong));
  EXPECT_TRUE(absl::StrContains(wrong.message(), "innermost tag on this thread is 'stack-inner'"));
  EXPECT_EQ(CurrentThreadTag(), inner);  // nothing changed
  EXPECT_TRUE(PopTag(inner).ok());
  EXPECT_TRUE(PopTag(outer).ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(PopTag(outer)));
  EXPECT_TRUE(absl::IsInvalidArgument(PushTag(kNoTag)));
  EXPECT_TRUE(absl::IsInvalidArgument(PushTag(1u << 30)));
}

TEST_F(EngineTest, InnermostTagIsCharged) {
  const TagId outer = Tag("outer");
  const TagId inner = Tag("inner");
  ASSERT_TRUE(PushTag(outer).ok());
  void* a = Allocate(1000);
  ASSERT_TRUE(PushTag(inner).ok());
  void* b = Allocate(3000);
  ASSERT_TRUE(PopTag(inner).ok());
  ASSERT_TRUE(PopTag(outer).ok());
  void* c = Allocate(512);

  EXPECT_EQ(UsageOf(*engine_, outer).current_bytes, 1024);
  EXPECT_EQ(UsageOf(*engine_, inner).current_bytes, 3072);
  EXPECT_EQ(UsageOf(*engine_, inner).current_requested_bytes, 3000);
  EXPECT_EQ(UsageOf(*engine_, kNoTag).current_bytes, 512);
  EXPECT_EQ(engine_->GetBlock(b)->tag, inner);
  for (void* p : {a, b, c}) Free(p);
  EXPECT_EQ(UsageOf(*engine_, inner).current_bytes, 0);
  EXPECT_EQ(UsageOf(*engine_, inner).peak_bytes, 3072);
  EXPECT_EQ(UsageOf(*engine_, inner).total_allocations, 1);
}

TEST_F(EngineTest, FreeAfterTheTagEndedCreditsTheStampedTag) {
  const TagId step = Tag("step");
  ASSERT_TRUE(PushTag(step).ok());
  void* ptr = Allocate(4096);
  ASSERT_TRUE(PopTag(step).ok());
  const TagId other = Tag("other");
  ASSERT_TRUE(PushTag(other).ok());
  Free(ptr);  // freed under another tag
  ASSERT_TRUE(PopTag(other).ok());
  EXPECT_EQ(UsageOf(*engine_, step).current_bytes, 0);
  EXPECT_EQ(UsageOf(*engine_, step).live_blocks, 0);
  EXPECT_EQ(UsageOf(*engine_, other).current_bytes, 0);
}

TEST_F(EngineTest, FreeOnAnotherThreadCreditsTheStampedTag) {
  const TagId loader = Tag("loader");
  ASSERT_TRUE(PushTag(loader).ok());
  void* ptr = Allocate(8192);
  ASSERT_TRUE(PopTag(loader).ok());
  std::thread freer([&] { Free(ptr); });
  freer.join();
  EXPECT_EQ(UsageOf(*engine_, loader).current_bytes, 0);
  EXPECT_EQ(UsageOf(*engine_, loader).total_allocated_bytes, 8192);
}

TEST_F(EngineTest, TagsAreThreadLocal) {
  const TagId mine = Tag("main-thread");
  ASSERT_TRUE(PushTag(mine).ok());
  void* other_thread_block = nullptr;
  std::thread worker([&] { other_thread_block = Allocate(4096); });
  worker.join();
  ASSERT_TRUE(PopTag(mine).ok());
  EXPECT_EQ(engine_->GetBlock(other_thread_block)->tag, kNoTag);
  Free(other_thread_block);
}

// A provider stands in for state propagated by PyTorch to its worker threads.
TagId g_propagated_tag = kNoTag;
bool PropagatedState(Attribution* out) {
  out->tag = g_propagated_tag;
  return g_propagated_tag != kNoTag;
}

TEST_F(EngineTest, ThreadsWithoutTagsUsePropagatedState) {
  const TagId backward = Tag("backward-propagated");
  const TagId own = Tag("own-tag");
  g_propagated_tag = backward;
  SetAttributionProvider(&PropagatedState);
  ASSERT_TRUE(PushTag(own).ok());  // something open somewhere enables lookups
  void* propagated = nullptr;
  void* explicit_tag = nullptr;
  std::thread worker([&] {
    propagated = Allocate(4096);
    EXPECT_TRUE(PushTag(own).ok());
    explicit_tag = Allocate(4096);  // the thread's own tag wins
    EXPECT_TRUE(PopTag(own).ok());
  });
  worker.join();
  ASSERT_TRUE(PopTag(own).ok());
  SetAttributionProvider(nullptr);
  g_propagated_tag = kNoTag;
  EXPECT_EQ(engine_->GetBlock(propagated)->tag, backward);
  EXPECT_EQ(engine_->GetBlock(explicit_tag)->tag, own);
  Free(propagated);
  Free(explicit_tag);
}

TEST_F(EngineTest, TagPeaksReset) {
  const TagId tag = Tag("peaky");
  ASSERT_TRUE(PushTag(tag).ok());
  void* a = Allocate(kMiB);
  Free(a);
  void* b = Allocate(4096);
  ASSERT_TRUE(PopTag(tag).ok());
  engine_->ResetTagPeaks();
  EXPECT_EQ(UsageOf(*engine_, tag).peak_bytes, 4096);
  EXPECT_EQ(UsageOf(*engine_, tag).total_allocations, 0);
  Free(b);
}

}  // namespace
}  // namespace torchmem
