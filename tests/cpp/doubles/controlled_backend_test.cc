#include "doubles/controlled_backend.h"

#include <memory>

#include "absl/strings/match.h"
#include "doubles/fault_injecting_backend.h"
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

// ControlledBackend has no fault injection of its own: tests wrap it.
TEST(ControlledBackendTest, WrappedInjectedFailuresSkipThenFailThenStop) {
  auto owned = std::make_unique<ControlledBackend>();
  ControlledBackend& controlled = *owned;
  FaultInjectingBackend backend(std::move(owned));
  backend.FailAfter(BackendCall::kAllocateSegment, /*successes=*/1, /*count=*/2,
                    absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(backend.AllocateSegment(1 << 20, 0).ok());
  EXPECT_TRUE(absl::IsResourceExhausted(backend.AllocateSegment(1 << 20, 0).status()));
  EXPECT_TRUE(absl::IsResourceExhausted(backend.AllocateSegment(1 << 20, 0).status()));
  EXPECT_TRUE(backend.AllocateSegment(1 << 20, 0).ok());
  EXPECT_EQ(backend.total_failures(), 2);
  EXPECT_EQ(backend.calls(BackendCall::kAllocateSegment), 4);
  // Failed calls never reached the controlled backend.
  EXPECT_EQ(controlled.live_segments(), 2);
  EXPECT_EQ(controlled.live_segment_bytes(), std::size_t{2} << 20);
}

TEST(ControlledBackendTest, FullDeviceIsResourceExhaustedAndNamesTheDevice) {
  ControlledBackend backend(ControlledBackendOptions{.capacity_bytes = 4 << 20});
  ASSERT_TRUE(backend.AllocateSegment(4 << 20, 0).ok());
  const absl::StatusOr<std::uintptr_t> full = backend.AllocateSegment(512, 0);
  EXPECT_TRUE(absl::IsResourceExhausted(full.status()));
  EXPECT_TRUE(absl::StrContains(full.status().message(), "test:0 is full")) << full.status();
}

TEST(ControlledBackendTest, AbsurdSizesFailWithoutOverflow) {
  ControlledBackend unlimited(ControlledBackendOptions{.capacity_bytes = ~std::size_t{0}});
  EXPECT_TRUE(absl::IsResourceExhausted(unlimited.AllocateSegment(~std::size_t{0}, 0).status()));
  EXPECT_TRUE(
      absl::IsResourceExhausted(unlimited.AllocateSegment(std::size_t{1} << 62, 0).status()));
  const std::uintptr_t a = *unlimited.AllocateSegment(std::size_t{1} << 60, 0);
  const std::uintptr_t b = *unlimited.AllocateSegment(std::size_t{1} << 60, 0);
  EXPECT_GE(b, a + (std::size_t{1} << 60));
  // The capacity was lowered below what is live: nothing more fits.
  unlimited.SetCapacity(1 << 20);
  EXPECT_TRUE(absl::IsResourceExhausted(unlimited.AllocateSegment(512, 0).status()));
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
