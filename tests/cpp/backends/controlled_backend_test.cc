#include "torchmem/backends/controlled_backend.h"

#include "gtest/gtest.h"

namespace torchmem {
namespace {

TEST(ControlledBackendTest, EventsCompleteOnlyWhenTold) {
  ControlledBackend backend;
  const EventId first = *backend.RecordEvent(3);
  const EventId second = *backend.RecordEvent(3);
  EXPECT_FALSE(*backend.QueryEvent(first));
  backend.CompleteStream(3);
  EXPECT_TRUE(*backend.QueryEvent(first));
  EXPECT_TRUE(*backend.QueryEvent(second));
  const EventId third = *backend.RecordEvent(3);
  EXPECT_FALSE(*backend.QueryEvent(third));
  EXPECT_TRUE(backend.SynchronizeEvent(third).ok());
  EXPECT_TRUE(*backend.QueryEvent(third));
  for (EventId e : {first, second, third}) backend.ReleaseEvent(e);
  EXPECT_EQ(backend.live_events(), 0);
}

TEST(ControlledBackendTest, InjectedFailuresSkipThenFailThenStop) {
  ControlledBackend backend;
  backend.FailNext(ControlledBackend::Call::kAllocateSegment, /*count=*/2,
                   absl::StatusCode::kResourceExhausted, /*skip=*/1);
  EXPECT_TRUE(backend.AllocateSegment(1 << 20, 0).ok());
  EXPECT_TRUE(absl::IsResourceExhausted(backend.AllocateSegment(1 << 20, 0).status()));
  EXPECT_TRUE(absl::IsResourceExhausted(backend.AllocateSegment(1 << 20, 0).status()));
  EXPECT_TRUE(backend.AllocateSegment(1 << 20, 0).ok());
  EXPECT_EQ(backend.failures_injected(), 2);
  EXPECT_EQ(backend.calls(ControlledBackend::Call::kAllocateSegment), 4);
}

TEST(ControlledBackendTest, FakeSegmentsNeverOverlapAndCapacityHolds) {
  ControlledBackend backend(ControlledBackendOptions{.capacity_bytes = 6 << 20});
  const std::uintptr_t a = *backend.AllocateSegment(2 << 20, 0);
  const std::uintptr_t b = *backend.AllocateSegment(4 << 20, 0);
  EXPECT_GE(b, a + (2 << 20));
  EXPECT_TRUE(absl::IsResourceExhausted(backend.AllocateSegment(512, 0).status()));
  EXPECT_FALSE(backend.ReleaseSegment(a, 4 << 20).ok());  // wrong size
  EXPECT_TRUE(backend.ReleaseSegment(a, 2 << 20).ok());
  EXPECT_EQ(backend.live_segment_bytes(), std::size_t{4} << 20);
}

}  // namespace
}  // namespace torchmem
