// What makes the simulated device as strict as a real node: primary contexts
// created only by the calls that create them on a GPU (counted, and exclusive
// between processes in EXCLUSIVE_PROCESS mode), and the cost model that
// charges each call the time a GPU would take.
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/file.h>
#include <unistd.h>

#include <string>

#include "simcuda_control.h"
#include "tests/test_util.h"

namespace simcuda_test {
namespace {

// A driver call, resolved as torch resolves them (the test links only the
// runtime).
template <typename Fn>
Fn Driver(const char* name) {
  void* p = nullptr;
  cudaDriverEntryPointQueryResult status = cudaDriverEntryPointSymbolNotFound;
  if (cudaGetDriverEntryPoint(name, &p, cudaEnableDefault, &status) != cudaSuccess) return nullptr;
  return reinterpret_cast<Fn>(p);
}

CUresult PrimaryCtxGetState(int device, unsigned int* flags, int* active) {
  return Driver<decltype(&cuDevicePrimaryCtxGetState)>("cuDevicePrimaryCtxGetState")(device, flags,
                                                                                     active);
}

CUresult PrimaryCtxRetain(CUcontext* context, int device) {
  return Driver<decltype(&cuDevicePrimaryCtxRetain)>("cuDevicePrimaryCtxRetain")(context, device);
}

// Device indices no other test uses, so each starts without a context
// (contexts live as long as the process, as on a GPU).
class ContextTest : public SimcudaTest {
 protected:
  void SetUp() override {
    SimcudaTest::SetUp();
    ASSERT_EQ(simcuda_set_device_count(64), cudaSuccess);
  }
  static int FreshDevice() {
    static int next = 63;
    return next--;
  }
};

TEST_F(ContextTest, QueriesCreateNoContextButSetDeviceAndWorkDo) {
  const int device = FreshDevice();
  int count = 0;
  ASSERT_EQ(cudaGetDeviceCount(&count), cudaSuccess);
  cudaDeviceProp prop;
  ASSERT_EQ(cudaGetDeviceProperties(&prop, device), cudaSuccess);
  int value = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&value, cudaDevAttrMultiProcessorCount, device), cudaSuccess);
  int can_access = 0;
  ASSERT_EQ(cudaDeviceCanAccessPeer(&can_access, 0, device), cudaSuccess);
  EXPECT_EQ(simcuda_context_active(device), 0);

  unsigned int flags = 0;
  int active = -1;
  ASSERT_EQ(PrimaryCtxGetState(device, &flags, &active), CUDA_SUCCESS);
  EXPECT_EQ(active, 0);  // what torch's MaybeSetDevice asks

  const int before = simcuda_context_count();
  ASSERT_EQ(cudaSetDevice(device), cudaSuccess);
  EXPECT_EQ(simcuda_context_active(device), 1);
  EXPECT_EQ(simcuda_context_count(), before + 1);
  ASSERT_EQ(PrimaryCtxGetState(device, &flags, &active), CUDA_SUCCESS);
  EXPECT_EQ(active, 1);
}

TEST_F(ContextTest, MemGetInfoOfTheCurrentDeviceCreatesItsContext) {
  // cudaMemGetInfo is how an allocator learns a device's size; it needs the
  // device current, hence a context there.
  const int device = FreshDevice();
  ASSERT_EQ(PrimaryCtxRetain(nullptr, device), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(simcuda_context_active(device), 0);
  ASSERT_EQ(cudaSetDevice(device), cudaSuccess);
  size_t free_bytes = 0, total = 0;
  ASSERT_EQ(cudaMemGetInfo(&free_bytes, &total), cudaSuccess);
  EXPECT_EQ(simcuda_context_active(device), 1);
}

TEST_F(ContextTest, RetainingThePrimaryContextCreatesIt) {
  const int device = FreshDevice();
  CUcontext context = nullptr;
  ASSERT_EQ(PrimaryCtxRetain(&context, device), CUDA_SUCCESS);
  EXPECT_EQ(simcuda_context_active(device), 1);
}

TEST_F(ContextTest, ExclusiveProcessModeRefusesASecondProcessContext) {
  char dir_template[] = "/tmp/simcuda-exclusive-XXXXXX";
  ASSERT_NE(mkdtemp(dir_template), nullptr);
  const std::string dir = dir_template;
  simcuda_set_exclusive_process_dir(dir.c_str());
  int mode = -1;
  const int taken = FreshDevice();
  ASSERT_EQ(cudaDeviceGetAttribute(&mode, cudaDevAttrComputeMode, taken), cudaSuccess);
  EXPECT_EQ(mode, cudaComputeModeExclusiveProcess);
  // Another process holds a context on `taken`: its lock file is locked
  // through a file description of its own.
  const std::string lock_path = dir + "/device" + std::to_string(taken) + ".lock";
  const int other = open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  ASSERT_GE(other, 0);
  ASSERT_EQ(flock(other, LOCK_EX | LOCK_NB), 0);

  EXPECT_EQ(cudaSetDevice(taken), cudaErrorDevicesUnavailable);
  EXPECT_EQ(cudaGetLastError(), cudaErrorDevicesUnavailable);
  EXPECT_EQ(simcuda_context_active(taken), 0);
  // A free device is fine, and its context now keeps others out.
  const int free_device = FreshDevice();
  ASSERT_EQ(cudaSetDevice(free_device), cudaSuccess);
  const std::string free_path = dir + "/device" + std::to_string(free_device) + ".lock";
  const int probe = open(free_path.c_str(), O_RDWR | O_CLOEXEC);
  ASSERT_GE(probe, 0);
  EXPECT_NE(flock(probe, LOCK_EX | LOCK_NB), 0);

  close(probe);
  close(other);
  simcuda_set_exclusive_process_dir(nullptr);
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  ASSERT_EQ(cudaDeviceGetAttribute(&mode, cudaDevAttrComputeMode, 0), cudaSuccess);
  EXPECT_EQ(mode, cudaComputeModeDefault);
}

using CostModelTest = SimcudaTest;

TEST_F(CostModelTest, EachCallAddsItsModelledTimeAndSynchronizingCallsAreCounted) {
  simcuda_reset_call_counts();
  EXPECT_EQ(simcuda_modelled_ns(nullptr), 0u);
  void* ptr = nullptr;
  ASSERT_EQ(cudaMalloc(&ptr, 1 << 20), cudaSuccess);
  ASSERT_EQ(cudaFree(ptr), cudaSuccess);
  // The defaults of the two measured calls (README, "Cost model").
  EXPECT_EQ(simcuda_modelled_ns("cudaMalloc"), 66400u);
  EXPECT_EQ(simcuda_modelled_ns("cudaFree"), 41700u);
  EXPECT_EQ(simcuda_modelled_ns(nullptr), 66400u + 41700u);
  EXPECT_EQ(simcuda_synchronizing_calls(), 1u);  // cudaFree waits for the device

  ASSERT_EQ(cudaStreamSynchronize(nullptr), cudaSuccess);
  EXPECT_EQ(simcuda_synchronizing_calls(), 2u);

  // Driver calls are charged by the driver and summed into the total.
  ASSERT_EQ(simcuda_set_call_cost("cuMemAddressReserve", 7000), cudaSuccess);
  CUdeviceptr address = 0;
  auto reserve = Driver<decltype(&cuMemAddressReserve)>("cuMemAddressReserve");
  auto address_free = Driver<decltype(&cuMemAddressFree)>("cuMemAddressFree");
  ASSERT_EQ(reserve(&address, 2 << 20, 0, 0, 0), CUDA_SUCCESS);
  EXPECT_EQ(simcuda_modelled_ns("cuMemAddressReserve"), 7000u);
  EXPECT_GE(simcuda_modelled_ns(nullptr), 66400u + 41700u + 7000u);
  ASSERT_EQ(address_free(address, 2 << 20), CUDA_SUCCESS);
  ASSERT_EQ(simcuda_set_call_cost("cuMemAddressReserve", 10000), cudaSuccess);

  simcuda_reset_call_counts();
  EXPECT_EQ(simcuda_modelled_ns(nullptr), 0u);
  EXPECT_EQ(simcuda_synchronizing_calls(), 0u);
}

TEST_F(CostModelTest, ACostCanBeChangedPerCall) {
  ASSERT_EQ(simcuda_set_call_cost("cudaMalloc", 1000), cudaSuccess);
  simcuda_reset_call_counts();
  void* ptr = nullptr;
  ASSERT_EQ(cudaMalloc(&ptr, 256), cudaSuccess);
  EXPECT_EQ(simcuda_modelled_ns("cudaMalloc"), 1000u);
  ASSERT_EQ(cudaFree(ptr), cudaSuccess);
  ASSERT_EQ(simcuda_set_call_cost("cudaMalloc", 66400), cudaSuccess);
}

}  // namespace
}  // namespace simcuda_test
