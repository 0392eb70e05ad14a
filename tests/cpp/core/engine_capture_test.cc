// The engine's rules while a CUDA graph capture is underway: no event is
// recorded or queried, frees of blocks used on other streams wait for the
// capture to end, nothing is released.
#include "gtest/gtest.h"
#include "tests/cpp/support/engine_fixture.h"

namespace torchmem {
namespace {

using testing::EngineTest;

constexpr PoolId kGraph{3, 0};
constexpr StreamId kCapturing = 5;
constexpr StreamId kSide = 6;

TEST_F(EngineTest, NoEventIsRecordedOrQueriedDuringACapture) {
  void* before = Allocate(4096, kCapturing);
  ASSERT_TRUE(engine_->RecordStream(before, kSide).ok());
  engine_->MarkCaptureBegin();
  ASSERT_TRUE(
      engine_->BeginAllocateToPool(kGraph, [](StreamId s) { return s == kCapturing; }).ok());
  const int recorded = faults_->calls(BackendCall::kRecordEvent);
  const int queried = faults_->calls(BackendCall::kQueryEvent);
  Free(before);  // used on kSide: deferred, no event yet
  EXPECT_EQ(engine_->GetEventHealth().deferred_frees, 1);
  void* during = Allocate(4096, kCapturing);
  Free(during);
  engine_->ProcessEvents();
  ASSERT_TRUE(engine_->EmptyCache().ok());
  EXPECT_EQ(faults_->calls(BackendCall::kRecordEvent), recorded);
  EXPECT_EQ(faults_->calls(BackendCall::kQueryEvent), queried);
  EXPECT_EQ(faults_->calls(BackendCall::kSynchronizeEvent), 0);
  EXPECT_EQ(Stats().active.all().current, 1);  // `before` still pending
  EXPECT_POOL_INTACT(*engine_);

  ASSERT_TRUE(engine_->EndAllocateToPool(kGraph).ok());
  engine_->MarkCaptureEnd();
  // Once no capture is underway the deferred free gets its event.
  engine_->ProcessEvents();
  EXPECT_EQ(engine_->GetEventHealth().deferred_frees, 0);
  EXPECT_EQ(faults_->calls(BackendCall::kRecordEvent), recorded + 1);
  backend_->CompleteStream(kSide);
  engine_->ProcessEvents();
  EXPECT_EQ(Stats().active.all().current, 0);
  ASSERT_TRUE(engine_->ReleasePool(kGraph).ok());
}

TEST_F(EngineTest, StreamsRecordedDuringACaptureNeedNoEventAfterIt) {
  // Work captured on a stream only runs at replay: PyTorch drops such
  // streams from the block's uses when the deferred free gets its events.
  engine_->MarkCaptureBegin();
  void* block = Allocate(4096, kCapturing);
  ASSERT_TRUE(engine_->RecordStream(block, kSide).ok());
  Free(block);
  engine_->MarkCaptureEnd();
  const int recorded = faults_->calls(BackendCall::kRecordEvent);
  engine_->ProcessEvents();
  EXPECT_EQ(faults_->calls(BackendCall::kRecordEvent), recorded);
  EXPECT_EQ(Stats().active.all().current, 0);
}

TEST_F(EngineTest, TheOutOfMemoryLadderReleasesNothingDuringACapture) {
  // Releasing cached segments needs events synchronized and cudaFree, both
  // forbidden during a capture: the allocation fails instead (and succeeds
  // after the capture, when the ladder may release the cached segment).
  engine_->SetMemoryLimit(21 * kMiB);
  Free(Allocate(1 << 20));  // a cached 2 MiB segment
  engine_->MarkCaptureBegin();
  const MemoryStats before = Stats();
  const absl::StatusOr<void*> during = engine_->Allocate(5 * kMiB);  // needs 20 MiB more
  EXPECT_TRUE(absl::IsResourceExhausted(during.status())) << during.status();
  EXPECT_EQ(Stats().num_device_free, before.num_device_free);
  EXPECT_EQ(Stats().segment.all().current, 1);
  engine_->MarkCaptureEnd();
  void* after = Allocate(5 * kMiB);
  EXPECT_EQ(Stats().num_device_free, before.num_device_free + 1);
  Free(after);
}

}  // namespace
}  // namespace torchmem
