// Stream capture: "not capturing" by default, cudaMalloc refused (and the
// capture invalidated) during a global-mode capture, allowed in relaxed
// thread mode, work captured rather than executed, dummy graphs that
// instantiate and launch.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstring>
#include <thread>

#include "simcuda_control.h"
#include "tests/test_util.h"

namespace simcuda_test {
namespace {

// cudaStreamGetCaptureInfo without the dependency outputs: CUDA 13 added the
// edge-data one to the call (CUDA 12 has it only in _v3).
cudaError_t CaptureInfo(cudaStream_t stream, cudaStreamCaptureStatus* status,
                        unsigned long long* id) {
#if CUDART_VERSION >= 13000
  return cudaStreamGetCaptureInfo(stream, status, id, nullptr, nullptr, nullptr, nullptr);
#else
  return cudaStreamGetCaptureInfo(stream, status, id, nullptr, nullptr, nullptr);
#endif
}

class CaptureTest : public SimcudaTest {
 protected:
  void SetUp() override {
    SimcudaTest::SetUp();
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), cudaSuccess);
  }
  void TearDown() override {
    EXPECT_EQ(cudaStreamDestroy(stream_), cudaSuccess);
    SimcudaTest::TearDown();
  }
  cudaStream_t stream_ = nullptr;
};

TEST_F(CaptureTest, NothingIsCapturingByDefault) {
  for (cudaStream_t s :
       {static_cast<cudaStream_t>(nullptr), cudaStreamLegacy, cudaStreamPerThread, stream_}) {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusActive;
    ASSERT_EQ(cudaStreamIsCapturing(s, &status), cudaSuccess);
    EXPECT_EQ(status, cudaStreamCaptureStatusNone);
    unsigned long long id = 1;
    ASSERT_EQ(CaptureInfo(s, &status, &id), cudaSuccess);
    EXPECT_EQ(status, cudaStreamCaptureStatusNone);
  }
}

TEST_F(CaptureTest, MallocDuringGlobalCaptureFailsAndInvalidates) {
  ASSERT_EQ(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeGlobal), cudaSuccess);
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  unsigned long long id = 0;
  ASSERT_EQ(CaptureInfo(stream_, &status, &id), cudaSuccess);
  EXPECT_EQ(status, cudaStreamCaptureStatusActive);
  EXPECT_NE(id, 0u);
  void* p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, 1024), cudaErrorStreamCaptureUnsupported);
  EXPECT_EQ(cudaGetLastError(), cudaErrorStreamCaptureUnsupported);
  ASSERT_EQ(cudaStreamIsCapturing(stream_, &status), cudaSuccess);
  EXPECT_EQ(status, cudaStreamCaptureStatusInvalidated);
  cudaGraph_t graph = reinterpret_cast<cudaGraph_t>(0x1);
  EXPECT_EQ(cudaStreamEndCapture(stream_, &graph), cudaErrorStreamCaptureInvalidated);
  EXPECT_EQ(graph, nullptr);
  // After the capture, allocation works again.
  ASSERT_EQ(cudaMalloc(&p, 1024), cudaSuccess);
  EXPECT_EQ(cudaFree(p), cudaSuccess);
  (void)cudaGetLastError();
}

TEST_F(CaptureTest, RelaxedThreadModeAllowsMallocAndWorkIsCaptured) {
  ASSERT_EQ(simcuda_set_event_mode(SIMCUDA_EVENT_MODE_MANUAL), 0);
  ASSERT_EQ(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeGlobal), cudaSuccess);
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  ASSERT_EQ(cudaThreadExchangeStreamCaptureMode(&mode), cudaSuccess);
  EXPECT_EQ(mode, cudaStreamCaptureModeGlobal);
  void* p = nullptr;
  ASSERT_EQ(cudaMalloc(&p, 64), cudaSuccess);
  ASSERT_EQ(cudaThreadExchangeStreamCaptureMode(&mode), cudaSuccess);
  EXPECT_EQ(mode, cudaStreamCaptureModeRelaxed);

  // Captured work is recorded in the graph, not executed.
  std::memset(p, 7, 64);
  ASSERT_EQ(cudaMemsetAsync(p, 0, 64, stream_), cudaSuccess);
  EXPECT_EQ(static_cast<unsigned char*>(p)[0], 7);
  EXPECT_EQ(simcuda_pending_work(stream_), 0u);

  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamEndCapture(stream_, &graph), cudaSuccess);
  ASSERT_NE(graph, nullptr);
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiateWithFlags(&exec, graph, 0), cudaSuccess);
  ASSERT_EQ(cudaGraphLaunch(exec, stream_), cudaSuccess);
  EXPECT_EQ(simcuda_pending_work(stream_), 1u);
  ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
  EXPECT_EQ(cudaGraphExecDestroy(exec), cudaSuccess);
  EXPECT_EQ(cudaGraphDestroy(graph), cudaSuccess);
  EXPECT_EQ(cudaFree(p), cudaSuccess);
}

TEST_F(CaptureTest, LaunchingAGraphRedoesItsCapturedCopiesAndMemsets) {
  void* a = nullptr;
  void* b = nullptr;
  ASSERT_EQ(cudaMalloc(&a, 64), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&b, 64), cudaSuccess);
  std::memset(a, 1, 64);
  std::memset(b, 2, 64);
  ASSERT_EQ(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeGlobal), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(b, a, 32, cudaMemcpyDeviceToDevice, stream_), cudaSuccess);
  ASSERT_EQ(cudaMemsetAsync(static_cast<char*>(b) + 32, 9, 32, stream_), cudaSuccess);
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamEndCapture(stream_, &graph), cudaSuccess);
  EXPECT_EQ(static_cast<unsigned char*>(b)[0], 2);  // nothing happened yet
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiateWithFlags(&exec, graph, 0), cudaSuccess);
  for (int replay = 0; replay < 2; ++replay) {
    std::memset(a, 10 + replay, 64);  // the graph reads the source as it is at launch
    ASSERT_EQ(cudaGraphLaunch(exec, stream_), cudaSuccess);
    EXPECT_EQ(static_cast<unsigned char*>(b)[0], 10 + replay);
    EXPECT_EQ(static_cast<unsigned char*>(b)[31], 10 + replay);
    EXPECT_EQ(static_cast<unsigned char*>(b)[32], 9);
  }
  EXPECT_EQ(cudaGraphExecDestroy(exec), cudaSuccess);
  EXPECT_EQ(cudaGraphDestroy(graph), cudaSuccess);
  EXPECT_EQ(cudaFree(a), cudaSuccess);
  EXPECT_EQ(cudaFree(b), cudaSuccess);
}

TEST_F(CaptureTest, OtherThreadsAreOnlyBlockedByGlobalCaptures) {
  ASSERT_EQ(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  cudaError_t other_thread = cudaErrorUnknown;
  void* p = nullptr;
  std::thread([&] { other_thread = cudaMalloc(&p, 64); }).join();
  EXPECT_EQ(other_thread, cudaSuccess);
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamEndCapture(stream_, &graph), cudaSuccess);
  EXPECT_EQ(cudaGraphDestroy(graph), cudaSuccess);
  EXPECT_EQ(cudaFree(p), cudaSuccess);

  ASSERT_EQ(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeGlobal), cudaSuccess);
  std::thread([&] { other_thread = cudaMalloc(&p, 64); }).join();
  EXPECT_EQ(other_thread, cudaErrorStreamCaptureUnsupported);
  EXPECT_EQ(cudaStreamEndCapture(stream_, &graph), cudaErrorStreamCaptureInvalidated);
  (void)cudaGetLastError();
}

TEST_F(CaptureTest, LegacyStreamCannotBeCaptured) {
  EXPECT_EQ(cudaStreamBeginCapture(nullptr, cudaStreamCaptureModeGlobal),
            cudaErrorStreamCaptureUnsupported);
  cudaGraph_t graph = nullptr;
  EXPECT_EQ(cudaStreamEndCapture(stream_, &graph), cudaErrorIllegalState);
  (void)cudaGetLastError();
}

}  // namespace
}  // namespace simcuda_test
