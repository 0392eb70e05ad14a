// Fault injection and call counters: the n-th call fails, the next k calls
// fail, rules queue, injected failures behave like real ones (last error),
// driver calls are reachable through the same API.
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <limits>
#include <string>

#include "simcuda_control.h"
#include "tests/test_util.h"

namespace simcuda_test {
namespace {

using FaultTest = SimcudaTest;

TEST_F(FaultTest, NthMallocFails) {
  ASSERT_EQ(simcuda_fail_nth("cudaMalloc", 3, cudaErrorMemoryAllocation), 0);
  void* p[4] = {};
  EXPECT_EQ(cudaMalloc(&p[0], 1024), cudaSuccess);
  EXPECT_EQ(cudaMalloc(&p[1], 1024), cudaSuccess);
  EXPECT_EQ(cudaMalloc(&p[2], 1024), cudaErrorMemoryAllocation);
  EXPECT_EQ(cudaGetLastError(), cudaErrorMemoryAllocation);
  EXPECT_EQ(cudaMalloc(&p[3], 1024), cudaSuccess);
  EXPECT_EQ(simcuda_live_allocations(0), 3u);
  EXPECT_EQ(simcuda_call_count("cudaMalloc"), 4u);
  for (void* q : p) EXPECT_EQ(cudaFree(q), cudaSuccess);
}

TEST_F(FaultTest, NextCallsFailWithTheGivenError) {
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  cudaEvent_t event = nullptr;
  ASSERT_EQ(simcuda_fail_next("cudaEventCreateWithFlags", 1, cudaErrorLaunchOutOfResources), 0);
  EXPECT_EQ(cudaEventCreateWithFlags(&event, cudaEventDisableTiming),
            cudaErrorLaunchOutOfResources);
  ASSERT_EQ(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), cudaSuccess);

  ASSERT_EQ(simcuda_fail_next("cudaEventRecord", 1, cudaErrorLaunchFailure), 0);
  EXPECT_EQ(cudaEventRecord(event, stream), cudaErrorLaunchFailure);
  ASSERT_EQ(cudaEventRecord(event, stream), cudaSuccess);

  ASSERT_EQ(simcuda_fail_next("cudaEventQuery", 2, cudaErrorIllegalAddress), 0);
  EXPECT_EQ(cudaEventQuery(event), cudaErrorIllegalAddress);
  EXPECT_EQ(cudaEventQuery(event), cudaErrorIllegalAddress);
  EXPECT_EQ(cudaEventQuery(event), cudaSuccess);
  EXPECT_EQ(cudaGetLastError(), cudaErrorIllegalAddress);

  cudaStream_t other = nullptr;
  ASSERT_EQ(simcuda_fail_next("cudaStreamCreate", 1, cudaErrorUnknown), 0);
  EXPECT_EQ(cudaStreamCreate(&other), cudaErrorUnknown);

  void* p = nullptr;
  ASSERT_EQ(cudaMalloc(&p, 64), cudaSuccess);
  ASSERT_EQ(simcuda_fail_next("cudaFree", 1, cudaErrorInvalidValue), 0);
  EXPECT_EQ(cudaFree(p), cudaErrorInvalidValue);
  EXPECT_EQ(simcuda_live_allocations(0), 1u);  // the failed free freed nothing
  EXPECT_EQ(cudaFree(p), cudaSuccess);

  EXPECT_EQ(cudaEventDestroy(event), cudaSuccess);
  EXPECT_EQ(cudaStreamDestroy(stream), cudaSuccess);
  (void)cudaGetLastError();
}

TEST_F(FaultTest, RulesQueueInOrderAndCanBeCleared) {
  void* p = nullptr;
  ASSERT_EQ(simcuda_inject_fault("cudaMalloc", 1, 1, cudaErrorMemoryAllocation), 0);
  ASSERT_EQ(simcuda_inject_fault("cudaMalloc", 0, 1, cudaErrorNotPermitted), 0);
  EXPECT_EQ(cudaMalloc(&p, 8), cudaSuccess);
  EXPECT_EQ(cudaFree(p), cudaSuccess);
  EXPECT_EQ(cudaMalloc(&p, 8), cudaErrorMemoryAllocation);
  EXPECT_EQ(cudaMalloc(&p, 8), cudaErrorNotPermitted);
  EXPECT_EQ(cudaMalloc(&p, 8), cudaSuccess);
  EXPECT_EQ(cudaFree(p), cudaSuccess);

  ASSERT_EQ(simcuda_fail_next("cudaMalloc", 5, cudaErrorMemoryAllocation), 0);
  simcuda_clear_faults();
  EXPECT_EQ(cudaMalloc(&p, 8), cudaSuccess);
  EXPECT_EQ(cudaFree(p), cudaSuccess);
  EXPECT_EQ(simcuda_fail_nth("cudaMalloc", 0, 2), cudaErrorInvalidValue);
  (void)cudaGetLastError();
}

TEST_F(FaultTest, ErrorNamesResolveForRuntimeAndDriver) {
  EXPECT_EQ(simcuda_error_code("cudaErrorMemoryAllocation"), cudaErrorMemoryAllocation);
  EXPECT_EQ(simcuda_error_code("cudaErrorStreamCaptureUnsupported"),
            cudaErrorStreamCaptureUnsupported);
  EXPECT_EQ(simcuda_error_code("CUDA_ERROR_OUT_OF_MEMORY"), CUDA_ERROR_OUT_OF_MEMORY);
  EXPECT_EQ(simcuda_error_code("cudaErrorNoSuchThing"), -1);
}

TEST_F(FaultTest, CountersCountEveryCallAndReset) {
  int device = -1;
  for (int i = 0; i < 5; ++i) ASSERT_EQ(cudaGetDevice(&device), cudaSuccess);
  EXPECT_EQ(simcuda_call_count("cudaGetDevice"), 5u);
  EXPECT_EQ(simcuda_call_count("cudaNeverCalled"), 0u);
  simcuda_reset_call_counts();
  EXPECT_EQ(simcuda_call_count("cudaGetDevice"), 0u);
  ASSERT_EQ(cudaGetDevice(&device), cudaSuccess);
  EXPECT_EQ(simcuda_call_count("cudaGetDevice"), 1u);
}

TEST_F(FaultTest, TheTraceReportsEveryCallOfTheProcessDespiteResets) {
  // Test fixtures reset the counters between tests; the SIMCUDA_TRACE report
  // must still say what the whole process called.
  int device = -1;
  for (int i = 0; i < 3; ++i) ASSERT_EQ(cudaGetDevice(&device), cudaSuccess);
  simcuda_reset_call_counts();
  ASSERT_EQ(cudaGetDevice(&device), cudaSuccess);
  char path[] = "/tmp/simcuda-trace-XXXXXX";
  const int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  close(fd);

  ASSERT_EQ(simcuda_write_trace(path), cudaSuccess);

  std::ifstream trace(path);
  std::string library, call;
  unsigned long long count = 0;
  unsigned long long reported = 0;
  while (trace >> library >> call >> count) {
    if (library == "runtime" && call == "cudaGetDevice") reported = count;
    trace.ignore(std::numeric_limits<std::streamsize>::max(), '\n');
  }
  std::remove(path);
  EXPECT_GE(reported, 4u);  // 3 before the reset + 1 after (+ any the fixture made)
}

TEST_F(FaultTest, DriverCallsAreCountedAndFaultable) {
  void* driver = dlopen(SIMCUDA_FAKE_DRIVER, RTLD_NOW | RTLD_NOLOAD);
  if (driver == nullptr) driver = dlopen(SIMCUDA_FAKE_DRIVER, RTLD_NOW);
  ASSERT_NE(driver, nullptr) << dlerror();
  auto get_state = reinterpret_cast<CUresult (*)(CUdevice, unsigned int*, int*)>(
      dlsym(driver, "cuDevicePrimaryCtxGetState"));
  ASSERT_NE(get_state, nullptr);
  unsigned int flags = 1;
  int active = 0;
  ASSERT_EQ(get_state(0, &flags, &active), CUDA_SUCCESS);
  EXPECT_EQ(active, 1);
  EXPECT_EQ(simcuda_call_count("cuDevicePrimaryCtxGetState"), 1u);
  ASSERT_EQ(simcuda_fail_next("cuDevicePrimaryCtxGetState", 1, CUDA_ERROR_NOT_INITIALIZED), 0);
  EXPECT_EQ(get_state(0, &flags, &active), CUDA_ERROR_NOT_INITIALIZED);
  EXPECT_EQ(get_state(0, &flags, &active), CUDA_SUCCESS);
  EXPECT_EQ(simcuda_call_count("cuDevicePrimaryCtxGetState"), 3u);
  dlclose(driver);
}

}  // namespace
}  // namespace simcuda_test
