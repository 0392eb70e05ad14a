// Memory limits and the out-of-memory ladder: limit check -> free cached
// segments and retry -> retry hook (Python's gc in production) -> error.
#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "tests/cpp/support/engine_fixture.h"

namespace torchmem {
namespace {

using testing::EngineTest;

TEST_F(EngineTest, LimitStopsGrowthBeforeTheBackendIsAsked) {
  engine_->SetMemoryLimit(4 * kMiB);
  void* a = Allocate(kMiB);  // 2 MiB small segment
  void* b = Allocate(kMiB);  // same segment
  void* c = Allocate(kMiB);  // second small segment: 4 MiB reserved
  const std::int64_t backend_calls = faults_->calls(BackendCall::kAllocateSegment);
  const absl::StatusOr<void*> over = engine_->Allocate(kMiB * 3);  // needs 20 MiB
  EXPECT_TRUE(absl::IsResourceExhausted(over.status()));
  EXPECT_EQ(faults_->calls(BackendCall::kAllocateSegment), backend_calls);
  const std::string message(over.status().message());
  EXPECT_TRUE(absl::StrContains(message, "out of memory on test:0")) << message;
  EXPECT_TRUE(absl::StrContains(message, "cannot allocate 3.00 MiB")) << message;
  EXPECT_TRUE(absl::StrContains(message, "4.00 MiB (torchmem memory limit)")) << message;
  EXPECT_TRUE(absl::StrContains(message, "reserved by torchmem: 4.00 MiB")) << message;
  EXPECT_TRUE(absl::StrContains(message, "allocated: 3.00 MiB")) << message;
  EXPECT_TRUE(absl::StrContains(message, "largest free block: 1.00 MiB")) << message;
  EXPECT_TRUE(absl::StrContains(message, "What to try")) << message;
  EXPECT_EQ(Stats().num_ooms, 1);
  for (void* p : {a, b, c}) Free(p);
}

TEST_F(EngineTest, LimitAsAFractionOfCapacity) {
  backend_->SetCapacity(100 * kMiB);
  ASSERT_TRUE(engine_->SetMemoryFraction(0.5).ok());
  EXPECT_EQ(engine_->memory_limit(), 50 * kMiB);
  void* fits = Allocate(40 * kMiB);
  EXPECT_TRUE(absl::IsResourceExhausted(engine_->Allocate(12 * kMiB).status()));
  Free(fits);
}

TEST_F(EngineTest, CachedSegmentsAreReleasedToMakeRoom) {
  engine_->SetMemoryLimit(24 * kMiB);
  void* medium = Allocate(5 * kMiB);  // 20 MiB segment
  Free(medium);                       // cached
  void* large = Allocate(24 * kMiB);  // cannot fit in it: needs its own 24 MiB segment
  ASSERT_NE(large, nullptr);
  const MemoryStats stats = Stats();
  EXPECT_EQ(stats.num_alloc_retries, 1);
  EXPECT_EQ(stats.num_device_free, 1);
  EXPECT_EQ(stats.reserved_bytes.all().current, static_cast<std::int64_t>(24 * kMiB));
  Free(large);
}

TEST_F(EngineTest, BackendOutOfMemoryIsRetriedAfterFreeingTheCache) {
  backend_->SetCapacity(22 * kMiB);
  void* small = Allocate(4096);
  Free(small);
  void* medium = Allocate(5 * kMiB);
  Free(medium);
  // The 22 MiB device holds the cached 2 MiB + 20 MiB segments; a 21 MiB
  // request (a 22 MiB segment) needs both returned first.
  void* large = Allocate(21 * kMiB);
  ASSERT_NE(large, nullptr);
  EXPECT_EQ(Stats().num_alloc_retries, 1);
  EXPECT_EQ(backend_->live_segment_bytes(), 22 * kMiB);
  Free(large);
}

TEST_F(EngineTest, BackendFaultIsReportedAsIsAndChangesNothing) {
  faults_->FailOnce(BackendCall::kAllocateSegment, absl::StatusCode::kInternal);
  const absl::StatusOr<void*> ptr = engine_->Allocate(4096);
  EXPECT_TRUE(absl::IsInternal(ptr.status()));
  EXPECT_TRUE(absl::StrContains(ptr.status().message(), "injected failure"));
  EXPECT_EQ(Stats().num_ooms, 0);
  EXPECT_EQ(Stats().segment.all().current, 0);
  void* works = Allocate(4096);
  Free(works);
}

TEST_F(EngineTest, FailedSegmentReleaseKeepsTheSegmentCached) {
  void* ptr = Allocate(4096);
  Free(ptr);
  faults_->FailOnce(BackendCall::kReleaseSegment);
  const absl::Status status = engine_->EmptyCache();
  EXPECT_TRUE(absl::IsInternal(status));
  EXPECT_TRUE(absl::StrContains(status.message(), "stays cached")) << status;
  EXPECT_EQ(Stats().segment.all().current, 1);
  EXPECT_POOL_INTACT(*engine_);
  EXPECT_TRUE(engine_->EmptyCache().ok());
  EXPECT_EQ(Stats().segment.all().current, 0);
}

TEST_F(EngineTest, OutOfMemoryMessageNamesTheTopTags) {
  absl::StatusOr<TagId> metrics = TagRegistry::Intern("metrics");
  ASSERT_TRUE(metrics.ok());
  ASSERT_TRUE(PushTag(*metrics).ok());
  void* held = Allocate(3 * kMiB);
  ASSERT_TRUE(PopTag(*metrics).ok());
  engine_->SetMemoryLimit(20 * kMiB);
  const absl::StatusOr<void*> over = engine_->Allocate(30 * kMiB);
  ASSERT_TRUE(absl::IsResourceExhausted(over.status()));
  EXPECT_TRUE(absl::StrContains(over.status().message(), "metrics 3.00 MiB (1 blocks)"))
      << over.status();
  Free(held);
}

// The retry hook runs without the engine's lock and may free memory.
Engine* g_hook_engine = nullptr;
void* g_hook_garbage = nullptr;
int g_hook_calls = 0;

bool FreeGarbage() {
  ++g_hook_calls;
  if (g_hook_garbage == nullptr) return false;
  EXPECT_TRUE(g_hook_engine->Free(g_hook_garbage).ok());  // would deadlock under the lock
  g_hook_garbage = nullptr;
  return true;
}

TEST_F(EngineTest, RetryHookFreesGarbageAndTheAllocationSucceeds) {
  engine_->SetMemoryLimit(20 * kMiB);
  g_hook_engine = engine_.get();
  g_hook_garbage = Allocate(8 * kMiB);
  g_hook_calls = 0;
  SetOutOfMemoryRetryHook(&FreeGarbage);
  absl::StatusOr<void*> ptr = engine_->Allocate(15 * kMiB);
  SetOutOfMemoryRetryHook(nullptr);
  ASSERT_TRUE(ptr.ok()) << ptr.status();
  EXPECT_EQ(g_hook_calls, 1);
  EXPECT_EQ(Stats().num_ooms, 0);
  Free(*ptr);
}

TEST_F(EngineTest, RetryHookThatFreesNothingEndsInOutOfMemory) {
  engine_->SetMemoryLimit(2 * kMiB);
  g_hook_engine = engine_.get();
  g_hook_garbage = nullptr;
  g_hook_calls = 0;
  SetOutOfMemoryRetryHook(&FreeGarbage);
  const absl::StatusOr<void*> ptr = engine_->Allocate(4 * kMiB);
  SetOutOfMemoryRetryHook(nullptr);
  EXPECT_TRUE(absl::IsResourceExhausted(ptr.status()));
  EXPECT_EQ(g_hook_calls, 1);
  EXPECT_EQ(Stats().num_ooms, 1);
}

}  // namespace
}  // namespace torchmem
