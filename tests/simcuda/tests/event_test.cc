// Streams and events under both completion modes: immediate completion,
// manual completion driven by the control API, synchronising calls that force
// completion, cross-stream waits, host functions, default-stream handles.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include "simcuda_control.h"
#include "tests/test_util.h"

namespace simcuda_test {
namespace {

class EventTest : public SimcudaTest {
 protected:
  void SetUp() override {
    SimcudaTest::SetUp();
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), cudaSuccess);
    ASSERT_EQ(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming), cudaSuccess);
  }
  void TearDown() override {
    EXPECT_EQ(cudaEventDestroy(event_), cudaSuccess);
    EXPECT_EQ(cudaStreamDestroy(stream_), cudaSuccess);
    SimcudaTest::TearDown();
  }
  cudaStream_t stream_ = nullptr;
  cudaEvent_t event_ = nullptr;
};

void Launch(cudaStream_t stream) {
  static int fake_kernel_stub = 0;  // any host address stands for a kernel
  ASSERT_EQ(cudaLaunchKernel(&fake_kernel_stub, dim3(1), dim3(32), nullptr, 0, stream),
            cudaSuccess);
}

TEST_F(EventTest, ImmediateModeCompletesWorkAtOnce) {
  EXPECT_EQ(simcuda_get_event_mode(), SIMCUDA_EVENT_MODE_IMMEDIATE);
  Launch(stream_);
  ASSERT_EQ(cudaEventRecord(event_, stream_), cudaSuccess);
  EXPECT_EQ(cudaEventQuery(event_), cudaSuccess);
  EXPECT_EQ(cudaStreamQuery(stream_), cudaSuccess);
  EXPECT_EQ(simcuda_pending_work(stream_), 0u);
}

TEST_F(EventTest, UnrecordedEventIsComplete) {
  ASSERT_EQ(simcuda_set_event_mode(SIMCUDA_EVENT_MODE_MANUAL), 0);
  EXPECT_EQ(cudaEventQuery(event_), cudaSuccess);
  EXPECT_EQ(cudaEventSynchronize(event_), cudaSuccess);
}

TEST_F(EventTest, ManualModeCompletesOnlyWhenTold) {
  ASSERT_EQ(simcuda_set_event_mode(SIMCUDA_EVENT_MODE_MANUAL), 0);
  Launch(stream_);
  ASSERT_EQ(cudaEventRecord(event_, stream_), cudaSuccess);
  EXPECT_EQ(simcuda_pending_work(stream_), 2u);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(cudaEventQuery(event_), cudaErrorNotReady);
  EXPECT_EQ(cudaStreamQuery(stream_), cudaErrorNotReady);
  // "Not ready" is a status, not an error: it is not recorded.
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  // Work submitted after the record does not hold the event back.
  ASSERT_EQ(simcuda_complete_stream(stream_), 0);
  EXPECT_EQ(cudaEventQuery(event_), cudaSuccess);
  EXPECT_EQ(cudaStreamQuery(stream_), cudaSuccess);
}

TEST_F(EventTest, CompletingAnEventLeavesLaterWorkPending) {
  ASSERT_EQ(simcuda_set_event_mode(SIMCUDA_EVENT_MODE_MANUAL), 0);
  ASSERT_EQ(cudaEventRecord(event_, stream_), cudaSuccess);
  Launch(stream_);
  ASSERT_EQ(simcuda_complete_event(event_), 0);
  EXPECT_EQ(cudaEventQuery(event_), cudaSuccess);
  EXPECT_EQ(simcuda_pending_work(stream_), 1u);
  EXPECT_EQ(cudaStreamQuery(stream_), cudaErrorNotReady);
}

TEST_F(EventTest, SynchronisingCallsForceCompletion) {
  ASSERT_EQ(simcuda_set_event_mode(SIMCUDA_EVENT_MODE_MANUAL), 0);
  ASSERT_EQ(cudaEventRecord(event_, stream_), cudaSuccess);
  EXPECT_EQ(cudaEventSynchronize(event_), cudaSuccess);
  EXPECT_EQ(cudaEventQuery(event_), cudaSuccess);

  ASSERT_EQ(cudaEventRecord(event_, stream_), cudaSuccess);
  EXPECT_EQ(cudaEventQuery(event_), cudaErrorNotReady);
  EXPECT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
  EXPECT_EQ(cudaEventQuery(event_), cudaSuccess);

  ASSERT_EQ(cudaEventRecord(event_, stream_), cudaSuccess);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(cudaEventQuery(event_), cudaSuccess);

  // cudaFree synchronises the device, as in CUDA.
  void* p = nullptr;
  ASSERT_EQ(cudaMalloc(&p, 512), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(event_, stream_), cudaSuccess);
  ASSERT_EQ(cudaFree(p), cudaSuccess);
  EXPECT_EQ(cudaEventQuery(event_), cudaSuccess);

  ASSERT_EQ(cudaEventRecord(event_, stream_), cudaSuccess);
  ASSERT_EQ(simcuda_complete_all(), 0);
  EXPECT_EQ(cudaEventQuery(event_), cudaSuccess);
}

TEST_F(EventTest, SwitchingToImmediateCompletesPendingWork) {
  ASSERT_EQ(simcuda_set_event_mode(SIMCUDA_EVENT_MODE_MANUAL), 0);
  ASSERT_EQ(cudaEventRecord(event_, stream_), cudaSuccess);
  ASSERT_EQ(simcuda_set_event_mode(SIMCUDA_EVENT_MODE_IMMEDIATE), 0);
  EXPECT_EQ(cudaEventQuery(event_), cudaSuccess);
}

TEST_F(EventTest, StreamWaitEventCarriesDependencies) {
  ASSERT_EQ(simcuda_set_event_mode(SIMCUDA_EVENT_MODE_MANUAL), 0);
  cudaStream_t other = nullptr;
  cudaEvent_t done = nullptr;
  ASSERT_EQ(cudaStreamCreate(&other), cudaSuccess);
  ASSERT_EQ(cudaEventCreate(&done), cudaSuccess);
  Launch(stream_);
  ASSERT_EQ(cudaEventRecord(event_, stream_), cudaSuccess);
  ASSERT_EQ(cudaStreamWaitEvent(other, event_, 0), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(done, other), cudaSuccess);
  EXPECT_EQ(cudaEventQuery(done), cudaErrorNotReady);
  // Completing `other` first completes what it waits for on `stream_`.
  ASSERT_EQ(simcuda_complete_stream(other), 0);
  EXPECT_EQ(cudaEventQuery(done), cudaSuccess);
  EXPECT_EQ(cudaEventQuery(event_), cudaSuccess);
  // Waiting for a completed event adds nothing.
  ASSERT_EQ(cudaStreamWaitEvent(other, event_, 0), cudaSuccess);
  EXPECT_EQ(simcuda_pending_work(other), 0u);
  EXPECT_EQ(cudaEventDestroy(done), cudaSuccess);
  EXPECT_EQ(cudaStreamDestroy(other), cudaSuccess);
}

TEST_F(EventTest, HostFunctionsRunWhenTheirWorkCompletes) {
  ASSERT_EQ(simcuda_set_event_mode(SIMCUDA_EVENT_MODE_MANUAL), 0);
  int runs = 0;
  ASSERT_EQ(cudaLaunchHostFunc(
                stream_, [](void* n) { ++*static_cast<int*>(n); }, &runs),
            cudaSuccess);
  EXPECT_EQ(runs, 0);
  ASSERT_EQ(simcuda_complete_stream(stream_), 0);
  EXPECT_EQ(runs, 1);
  ASSERT_EQ(simcuda_set_event_mode(SIMCUDA_EVENT_MODE_IMMEDIATE), 0);
  ASSERT_EQ(cudaLaunchHostFunc(
                stream_, [](void* n) { ++*static_cast<int*>(n); }, &runs),
            cudaSuccess);
  EXPECT_EQ(runs, 2);
}

TEST_F(EventTest, DefaultStreamHandles) {
  ASSERT_EQ(simcuda_set_event_mode(SIMCUDA_EVENT_MODE_MANUAL), 0);
  for (cudaStream_t handle :
       {static_cast<cudaStream_t>(nullptr), cudaStreamLegacy, cudaStreamPerThread}) {
    ASSERT_EQ(cudaEventRecord(event_, handle), cudaSuccess);
    EXPECT_EQ(cudaEventQuery(event_), cudaErrorNotReady);
    ASSERT_EQ(simcuda_complete_stream(handle), 0);
    EXPECT_EQ(cudaEventQuery(event_), cudaSuccess);
  }
  // nullptr and cudaStreamLegacy are the same stream.
  Launch(nullptr);
  EXPECT_EQ(simcuda_pending_work(cudaStreamLegacy), 1u);
  EXPECT_EQ(simcuda_pending_work(cudaStreamPerThread), 0u);
  // A synchronous copy waits for the legacy stream.
  int value = 1, copy = 0;
  void* p = nullptr;
  ASSERT_EQ(cudaMalloc(&p, sizeof(value)), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(p, &value, sizeof(value), cudaMemcpyHostToDevice), cudaSuccess);
  EXPECT_EQ(simcuda_pending_work(nullptr), 0u);
  ASSERT_EQ(cudaMemcpy(&copy, p, sizeof(copy), cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(copy, 1);
  EXPECT_EQ(cudaFree(p), cudaSuccess);
}

TEST_F(EventTest, StreamPropertiesAndInvalidHandles) {
  int least = 1, greatest = 1;
  ASSERT_EQ(cudaDeviceGetStreamPriorityRange(&least, &greatest), cudaSuccess);
  EXPECT_EQ(least, 0);
  EXPECT_LT(greatest, least);
  cudaStream_t high = nullptr;
  ASSERT_EQ(cudaStreamCreateWithPriority(&high, cudaStreamNonBlocking, greatest), cudaSuccess);
  int priority = 0;
  unsigned int flags = 0;
  ASSERT_EQ(cudaStreamGetPriority(high, &priority), cudaSuccess);
  EXPECT_EQ(priority, greatest);
  ASSERT_EQ(cudaStreamGetFlags(high, &flags), cudaSuccess);
  EXPECT_EQ(flags, static_cast<unsigned int>(cudaStreamNonBlocking));
  EXPECT_EQ(cudaStreamDestroy(high), cudaSuccess);
  EXPECT_EQ(cudaStreamQuery(high), cudaErrorInvalidResourceHandle);
  EXPECT_EQ(cudaStreamDestroy(high), cudaErrorInvalidResourceHandle);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidResourceHandle);
}

TEST_F(EventTest, ElapsedTimeNeedsTimingEvents) {
  cudaEvent_t start = nullptr, stop = nullptr;
  ASSERT_EQ(cudaEventCreate(&start), cudaSuccess);
  ASSERT_EQ(cudaEventCreate(&stop), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(start, stream_), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(stop, stream_), cudaSuccess);
  float ms = -1;
  EXPECT_EQ(cudaEventElapsedTime(&ms, start, stop), cudaSuccess);
  EXPECT_GE(ms, 0.0f);
  ASSERT_EQ(cudaEventRecord(event_, stream_), cudaSuccess);
  EXPECT_EQ(cudaEventElapsedTime(&ms, start, event_), cudaErrorInvalidResourceHandle);
  (void)cudaGetLastError();
  EXPECT_EQ(cudaEventDestroy(start), cudaSuccess);
  EXPECT_EQ(cudaEventDestroy(stop), cudaSuccess);
}

}  // namespace
}  // namespace simcuda_test
