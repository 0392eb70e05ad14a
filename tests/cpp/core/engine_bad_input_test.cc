// Bad input gets a clear error and leaves the pool intact (the fixture's
// TearDown checks the invariants after every test).
#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "tests/cpp/support/engine_fixture.h"

namespace torchmem {
namespace {

using testing::EngineTest;

TEST_F(EngineTest, FreeingAnUnknownPointerIsNotFound) {
  void* live = Allocate(4096);
  int on_the_stack = 0;
  const absl::Status status = engine_->Free(&on_the_stack);
  EXPECT_TRUE(absl::IsNotFound(status));
  EXPECT_TRUE(absl::StrContains(status.message(), "was not allocated by torchmem")) << status;
  EXPECT_EQ(Stats().allocation.all().current, 1);
  Free(live);
}

TEST_F(EngineTest, FreeingAPointerInsideABlockSaysWhere) {
  void* live = Allocate(4096);
  const absl::Status status = engine_->Free(static_cast<char*>(live) + 100);
  EXPECT_TRUE(absl::IsNotFound(status));
  EXPECT_TRUE(absl::StrContains(status.message(), "points 100 bytes into")) << status;
  Free(live);
}

TEST_F(EngineTest, DoubleFreeIsRejectedAndCountsStayExact) {
  void* ptr = Allocate(4096);
  Free(ptr);
  const absl::Status status = engine_->Free(ptr);
  EXPECT_TRUE(absl::IsFailedPrecondition(status));
  EXPECT_TRUE(absl::StrContains(status.message(), "double free")) << status;
  EXPECT_EQ(Stats().allocation.all().current, 0);
  EXPECT_EQ(Stats().allocated_bytes.all().freed, 4096);
}

TEST_F(EngineTest, DoubleFreeAfterReuseFreesNothingTwice) {
  void* ptr = Allocate(4096);
  Free(ptr);
  void* again = Allocate(4096);  // same block, handed out again
  ASSERT_EQ(ptr, again);
  Free(again);
  EXPECT_TRUE(absl::IsFailedPrecondition(engine_->Free(ptr)));
}

TEST_F(EngineTest, FreeWithTheWrongSizeIsRejected) {
  void* ptr = Allocate(1000);
  const absl::Status status = engine_->FreeSized(ptr, 999);
  EXPECT_TRUE(absl::IsInvalidArgument(status));
  EXPECT_TRUE(absl::StrContains(status.message(), "allocated with size 1000")) << status;
  EXPECT_EQ(Stats().allocation.all().current, 1);
  EXPECT_TRUE(engine_->FreeSized(ptr, 1000).ok());
}

TEST_F(EngineTest, FreeingAnotherEnginesPointerIsRejected) {
  Engine other(
      std::make_unique<ControlledBackend>(ControlledBackendOptions{.device_name = "test:1"}));
  absl::StatusOr<void*> foreign = other.Allocate(4096);
  ASSERT_TRUE(foreign.ok());
  const absl::Status status = engine_->Free(*foreign);
  EXPECT_TRUE(absl::IsNotFound(status));
  EXPECT_TRUE(absl::StrContains(status.message(), "test:0")) << status;
  EXPECT_TRUE(other.Free(*foreign).ok());
  EXPECT_POOL_INTACT(other);
}

TEST_F(EngineTest, ZeroSizeRequestIsInvalid) {
  const absl::StatusOr<void*> ptr = engine_->Allocate(0);
  EXPECT_TRUE(absl::IsInvalidArgument(ptr.status()));
  EXPECT_TRUE(absl::StrContains(ptr.status().message(), "0 bytes"));
  EXPECT_EQ(Stats().num_device_alloc, 0);
}

TEST_F(EngineTest, AbsurdRequestIsInvalidWithoutTouchingTheBackend) {
  const absl::StatusOr<void*> ptr = engine_->Allocate(~std::size_t{0});
  EXPECT_TRUE(absl::IsInvalidArgument(ptr.status()));
  EXPECT_EQ(faults_->calls(BackendCall::kAllocateSegment), 0);
}

TEST_F(EngineTest, RecordStreamOnAFreedBlockIsRejected) {
  void* ptr = Allocate(4096);
  Free(ptr);
  EXPECT_TRUE(absl::IsFailedPrecondition(engine_->RecordStream(ptr, 5)));
  int unknown = 0;
  EXPECT_TRUE(absl::IsNotFound(engine_->RecordStream(&unknown, 5)));
}

TEST_F(EngineTest, MemoryFractionOutsideZeroToOneIsInvalid) {
  EXPECT_TRUE(absl::IsInvalidArgument(engine_->SetMemoryFraction(0.0)));
  EXPECT_TRUE(absl::IsInvalidArgument(engine_->SetMemoryFraction(1.5)));
  EXPECT_TRUE(absl::IsInvalidArgument(engine_->SetMemoryFraction(-0.1)));
  EXPECT_EQ(engine_->memory_limit(), 0u);
}

TEST_F(EngineTest, ForbiddenSegmentAllocationFailsWithTheBackendsReason) {
  backend_->ForbidSegmentAllocation("CUDA graph capture is underway on stream 9");
  const absl::StatusOr<void*> ptr = engine_->Allocate(4096, 9);
  EXPECT_TRUE(absl::IsFailedPrecondition(ptr.status()));
  EXPECT_TRUE(absl::StrContains(ptr.status().message(), "graph capture"));
  backend_->ForbidSegmentAllocation("");
  // Cached blocks can still be used while segments are forbidden.
  void* warm = Allocate(4096, 9);
  Free(warm);
  backend_->ForbidSegmentAllocation("capture");
  void* reused = Allocate(4096, 9);
  EXPECT_EQ(reused, warm);
  Free(reused);
}

}  // namespace
}  // namespace torchmem
