// The optional event trace (PyTorch's device_traces vocabulary).
#include "gtest/gtest.h"
#include "tests/cpp/support/engine_fixture.h"
#include "torchmem/core/context_capture.h"

namespace torchmem {
namespace {

using testing::EngineTest;

std::vector<TraceAction> Actions(const std::vector<TraceEntry>& entries) {
  std::vector<TraceAction> actions;
  for (const TraceEntry& entry : entries) actions.push_back(entry.action);
  return actions;
}

TEST_F(EngineTest, TraceIsOffByDefault) {
  Free(Allocate(4096));
  EXPECT_TRUE(engine_->GetTrace().empty());
}

TEST_F(EngineTest, TraceRecordsTheLifeOfABlockAndItsSegment) {
  engine_->SetTraceCapacity(100);
  void* ptr = Allocate(1000, /*stream=*/3);
  Free(ptr);
  ASSERT_TRUE(engine_->EmptyCache().ok());
  const std::vector<TraceEntry> trace = engine_->GetTrace();
  EXPECT_EQ(Actions(trace),
            (std::vector<TraceAction>{TraceAction::kSegmentAlloc, TraceAction::kAlloc,
                                      TraceAction::kFreeRequested, TraceAction::kFreeCompleted,
                                      TraceAction::kSegmentFree}));
  EXPECT_EQ(trace[0].size, 2 * kMiB);
  EXPECT_EQ(trace[1].address, Address(ptr));
  EXPECT_EQ(trace[1].size, 1000u);  // requested size, as in PyTorch
  EXPECT_EQ(trace[1].stream, 3u);
  EXPECT_EQ(trace[2].size, 1000u);  // frees carry the requested size too, as in PyTorch
  EXPECT_LE(trace[0].time_us, trace[4].time_us);
}

TEST_F(EngineTest, TraceSeparatesFreeRequestedFromCompletedAcrossStreams) {
  engine_->SetTraceCapacity(100);
  void* ptr = Allocate(4096);
  ASSERT_TRUE(engine_->RecordStream(ptr, 9).ok());
  Free(ptr);
  EXPECT_EQ(Actions(engine_->GetTrace()).back(), TraceAction::kFreeRequested);
  backend_->CompleteStream(9);
  engine_->ProcessEvents();
  EXPECT_EQ(Actions(engine_->GetTrace()).back(), TraceAction::kFreeCompleted);
}

TEST_F(EngineTest, TraceEntriesCarryTheUserMetadataAndTheThreadsCompileContext) {
  engine_->SetTraceCapacity(100);
  SetTraceUserMetadata(InternTraceLabel("epoch 3"));
  PushTraceCompileContext(InternTraceLabel("Torch-Compiled Region: 0/0"));
  void* ptr = Allocate(4096);
  PopTraceCompileContext();
  SetTraceUserMetadata(kNoTraceLabel);
  Free(ptr);
  const std::vector<TraceEntry> trace = engine_->GetTrace();
  ASSERT_EQ(trace[1].action, TraceAction::kAlloc);
  EXPECT_EQ(TraceLabelText(trace[1].user_metadata), "epoch 3");
  EXPECT_EQ(TraceLabelText(trace[1].compile_context), "Torch-Compiled Region: 0/0");
  EXPECT_EQ(trace.back().user_metadata, kNoTraceLabel);
  EXPECT_EQ(trace.back().compile_context, kNoTraceLabel);
  EXPECT_EQ(InternTraceLabel("epoch 3"), trace[1].user_metadata);  // one id per text
}

TEST_F(EngineTest, AnnotationsAreTraceEntriesOfLiveBlocksOnly) {
  engine_->SetTraceCapacity(100);
  void* ptr = Allocate(1000);
  ASSERT_TRUE(engine_->RecordAnnotation(ptr, InternTraceLabel("weights")).ok());
  const TraceEntry annotation = engine_->GetTrace().back();
  EXPECT_EQ(annotation.action, TraceAction::kAnnotate);
  EXPECT_EQ(annotation.address, Address(ptr));
  EXPECT_EQ(annotation.size, 1000u);
  EXPECT_EQ(TraceLabelText(annotation.user_metadata), "weights");
  Free(ptr);
  EXPECT_TRUE(absl::IsNotFound(engine_->RecordAnnotation(ptr, InternTraceLabel("late"))));
}

// Each capture names a new caller, so the allocation's context (1) and the
// emptying code's (2) differ.
ContextId next_caller_context = 0;

ContextId ContextOfTheCaller() { return ++next_caller_context; }

TEST_F(EngineTest, WithFreeContextsSegmentFreesCarryTheStackOfWhoEmptiedTheCache) {
  // PyTorch's context="all": emptyCache's stack on its segment_free entries.
  next_caller_context = 0;
  SetContextCaptureHook(&ContextOfTheCaller);
  RequestContextCapture();
  engine_->SetTraceCapacity(100);
  Free(Allocate(4096));  // context 1 on the block and its segment
  engine_->SetTraceFreeContext(true);
  ASSERT_TRUE(engine_->EmptyCache().ok());  // context 2
  ReleaseContextCapture();
  SetContextCaptureHook(nullptr);
  const TraceEntry last = engine_->GetTrace().back();
  EXPECT_EQ(last.action, TraceAction::kSegmentFree);
  EXPECT_EQ(last.context, 2u);
}

TEST_F(EngineTest, TraceKeepsTheNewestEntriesWhenFull) {
  engine_->SetTraceCapacity(3);
  for (int i = 0; i < 5; ++i) Free(Allocate(4096));
  const std::vector<TraceEntry> trace = engine_->GetTrace();
  ASSERT_EQ(trace.size(), 3u);
  EXPECT_EQ(Actions(trace),
            (std::vector<TraceAction>{TraceAction::kAlloc, TraceAction::kFreeRequested,
                                      TraceAction::kFreeCompleted}));
  engine_->SetTraceCapacity(0);
  EXPECT_TRUE(engine_->GetTrace().empty());
}

TEST_F(EngineTest, TraceRecordsOutOfMemory) {
  engine_->SetTraceCapacity(10);
  engine_->SetMemoryLimit(kMiB);
  EXPECT_FALSE(engine_->Allocate(4096).ok());
  const std::vector<TraceEntry> trace = engine_->GetTrace();
  ASSERT_EQ(trace.size(), 1u);
  EXPECT_EQ(trace[0].action, TraceAction::kOom);
  EXPECT_EQ(trace[0].size, 4096u);
}

}  // namespace
}  // namespace torchmem
