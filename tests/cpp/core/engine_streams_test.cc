// Cross-stream reuse: a block used on other streams (record_stream) is
// reused only after the backend reports their events complete.
#include "gtest/gtest.h"
#include "tests/cpp/support/engine_fixture.h"

namespace torchmem {
namespace {

using testing::EngineTest;

constexpr StreamId kCompute = 0;
constexpr StreamId kCopy = 11;
constexpr StreamId kOther = 12;

TEST_F(EngineTest, BlockUsedOnAnotherStreamWaitsForItsEvent) {
  void* ptr = Allocate(4096, kCompute);
  ASSERT_TRUE(engine_->RecordStream(ptr, kCopy).ok());
  Free(ptr);

  MemoryStats stats = Stats();
  EXPECT_EQ(stats.allocated_bytes.all().current, 0);  // freed by the caller...
  EXPECT_EQ(stats.active_bytes.all().current, 4096);  // ...but still in use on kCopy
  void* other = Allocate(4096, kCompute);
  EXPECT_NE(other, ptr);

  backend_->CompleteStream(kCopy);
  void* reused = Allocate(4096, kCompute);  // events are polled on allocation
  EXPECT_EQ(reused, ptr);
  EXPECT_EQ(Stats().active_bytes.all().current, 8192);
  Free(other);
  Free(reused);
}

TEST_F(EngineTest, EveryUsingStreamMustComplete) {
  void* ptr = Allocate(4096, kCompute);
  ASSERT_TRUE(engine_->RecordStream(ptr, kCopy).ok());
  ASSERT_TRUE(engine_->RecordStream(ptr, kOther).ok());
  ASSERT_TRUE(engine_->RecordStream(ptr, kOther).ok());  // recorded once
  Free(ptr);
  EXPECT_EQ(backend_->live_events(), 2);

  backend_->CompleteStream(kCopy);
  engine_->ProcessEvents();
  EXPECT_EQ(Stats().active.all().current, 1);
  backend_->CompleteStream(kOther);
  engine_->ProcessEvents();
  EXPECT_EQ(Stats().active.all().current, 0);
  EXPECT_EQ(backend_->live_events(), 0);
}

TEST_F(EngineTest, RecordingTheAllocationStreamIsANoOp) {
  void* ptr = Allocate(4096, kCompute);
  ASSERT_TRUE(engine_->RecordStream(ptr, kCompute).ok());
  Free(ptr);
  EXPECT_EQ(Stats().active.all().current, 0);
  EXPECT_EQ(faults_->calls(BackendCall::kRecordEvent), 0);
}

TEST_F(EngineTest, WorkQueuedAfterTheFreeDoesNotDelayReuse) {
  void* ptr = Allocate(4096, kCompute);
  ASSERT_TRUE(engine_->RecordStream(ptr, kCopy).ok());
  Free(ptr);
  backend_->CompleteStream(kCopy);
  // A later event on kCopy, not yet complete, must not matter.
  ASSERT_TRUE(backend_->RecordEvent(kCopy).ok());
  engine_->ProcessEvents();
  EXPECT_EQ(Stats().active.all().current, 0);
}

TEST_F(EngineTest, EmptyCacheWaitsForPendingBlocksThenReleasesTheirSegments) {
  // As PyTorch's emptyCache: events are synchronized first, so memory freed
  // but still in use on another stream comes back too.
  void* ptr = Allocate(4096, kCompute);
  ASSERT_TRUE(engine_->RecordStream(ptr, kCopy).ok());
  Free(ptr);
  ASSERT_TRUE(engine_->EmptyCache().ok());
  EXPECT_EQ(Stats().segment.all().current, 0);
  EXPECT_EQ(Stats().active.all().current, 0);
  EXPECT_EQ(Stats().num_sync_all_streams, 1);
  EXPECT_EQ(faults_->calls(BackendCall::kSynchronizeEvent), 1);
}

TEST_F(EngineTest, OutOfMemoryRetrySynchronizesPendingBlocks) {
  backend_->SetCapacity(20 * kMiB);
  void* ptr = Allocate(kMiB, kCompute);  // 2 MiB small segment
  ASSERT_TRUE(engine_->RecordStream(ptr, kCopy).ok());
  Free(ptr);
  // A 20 MiB segment does not fit beside it; the retry waits for kCopy,
  // returns the small segment and succeeds.
  void* big = Allocate(5 * kMiB, kCompute);
  ASSERT_NE(big, nullptr);
  const MemoryStats stats = Stats();
  EXPECT_EQ(stats.num_alloc_retries, 1);
  EXPECT_EQ(stats.num_sync_all_streams, 1);
  EXPECT_EQ(stats.num_ooms, 0);
  Free(big);
}

TEST_F(EngineTest, FailedEventRecordKeepsTheBlockPendingUntilARetrySucceeds) {
  void* ptr = Allocate(4096, kCompute);
  ASSERT_TRUE(engine_->RecordStream(ptr, kCopy).ok());
  faults_->FailOnce(BackendCall::kRecordEvent);
  Free(ptr);
  EXPECT_EQ(Stats().active.all().current, 1);
  EXPECT_POOL_INTACT(*engine_);
  engine_->ProcessEvents();  // records the event now
  EXPECT_EQ(backend_->live_events(), 1);
  backend_->CompleteStream(kCopy);
  engine_->ProcessEvents();
  EXPECT_EQ(Stats().active.all().current, 0);
}

TEST_F(EngineTest, FailedEventQueryWaitsForTheEventCountsAndWarnsOnce) {
  CaptureWarnings();
  void* first = Allocate(4096, kCompute);
  void* second = Allocate(4096, kCompute);
  ASSERT_TRUE(engine_->RecordStream(first, kCopy).ok());
  ASSERT_TRUE(engine_->RecordStream(second, kCopy).ok());
  Free(first);
  Free(second);
  faults_->FailAlways(BackendCall::kQueryEvent);
  // The work on kCopy is not done, yet a persistent query error must not
  // pin the blocks: the engine waits for each event instead.
  engine_->ProcessEvents();
  EXPECT_EQ(Stats().active.all().current, 0);
  EXPECT_EQ(faults_->calls(BackendCall::kSynchronizeEvent), 2);
  const EventHealth health = engine_->GetEventHealth();
  EXPECT_EQ(health.event_query_errors, 2);
  EXPECT_EQ(health.event_sync_errors, 0);
  EXPECT_EQ(health.outstanding_events, 0);
  ASSERT_EQ(Warnings().size(), 1u);
  EXPECT_NE(Warnings()[0].find("querying an event"), std::string::npos) << Warnings()[0];
}

TEST_F(EngineTest, EventBrokenBothWaysKeepsTheBlockAndFailsTheNextAllocation) {
  void* ptr = Allocate(4096, kCompute);
  ASSERT_TRUE(engine_->RecordStream(ptr, kCopy).ok());
  Free(ptr);
  faults_->FailAlways(BackendCall::kQueryEvent);
  faults_->FailAlways(BackendCall::kSynchronizeEvent);
  engine_->ProcessEvents();
  EXPECT_EQ(Stats().active.all().current, 1);  // kCopy may still use it
  EXPECT_EQ(engine_->GetEventHealth().event_sync_errors, 1);
  absl::StatusOr<void*> next = engine_->Allocate(4096, kCompute);
  ASSERT_FALSE(next.ok());
  EXPECT_FALSE(absl::IsResourceExhausted(next.status())) << next.status();
  EXPECT_EQ(Stats().active.all().current, 1);
  faults_->Clear(BackendCall::kQueryEvent);
  faults_->Clear(BackendCall::kSynchronizeEvent);
  backend_->CompleteStream(kCopy);
  engine_->ProcessEvents();
  EXPECT_EQ(Stats().active.all().current, 0);
  EXPECT_POOL_INTACT(*engine_);
}

TEST_F(EngineTest, EventTableKeepsOnlyStreamsWithEventsInFlight) {
  // Thousands of short-lived side streams must not leave one entry each.
  for (StreamId side = 100; side < 2100; ++side) {
    void* ptr = Allocate(4096, kCompute);
    ASSERT_TRUE(engine_->RecordStream(ptr, side).ok());
    Free(ptr);
    EXPECT_EQ(engine_->GetEventHealth().streams_with_events, 1);
    backend_->CompleteStream(side);
    engine_->ProcessEvents();
    EXPECT_EQ(engine_->GetEventHealth().streams_with_events, 0);
  }
  EXPECT_POOL_INTACT(*engine_);
}

}  // namespace
}  // namespace torchmem
