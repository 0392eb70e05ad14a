// Devices: properties, attributes, several devices with a current device per
// thread, versions, driver entry points, registration and launch entry
// points, and the generated stubs of calls that are not simulated.
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstring>
#include <thread>

#include "simcuda_control.h"
#include "tests/test_util.h"

// The registration and launch entry points nvcc-generated code calls
// (crt/host_runtime.h, crt/device_functions.h; declared only for nvcc).
extern "C" {
void** __cudaRegisterFatBinary(void* fat_cubin);
void __cudaRegisterFatBinaryEnd(void** handle);
void __cudaUnregisterFatBinary(void** handle);
void __cudaRegisterFunction(void** handle, const char* host_function, char* device_function,
                            const char* device_name, int thread_limit, uint3* tid, uint3* bid,
                            dim3* block_dim, dim3* grid_dim, int* warp_size);
void __cudaRegisterVar(void** handle, char* host_var, char* device_address, const char* device_name,
                       int ext, size_t size, int constant, int global);
char __cudaInitModule(void** handle);
unsigned __cudaPushCallConfiguration(dim3 grid, dim3 block, size_t shared_memory,
                                     struct CUstream_st* stream);
cudaError_t __cudaPopCallConfiguration(dim3* grid, dim3* block, size_t* shared_memory,
                                       void* stream);
cudaError_t __cudaGetKernel(cudaKernel_t* kernel, const void* host_function);
cudaError_t __cudaLaunchKernel(cudaKernel_t kernel, dim3 grid, dim3 block, void** args,
                               size_t shared_memory, cudaStream_t stream);
}

namespace simcuda_test {
namespace {

using DeviceTest = SimcudaTest;

TEST_F(DeviceTest, PropertiesDescribeTheSimulatedDevice) {
  int count = 0;
  ASSERT_EQ(cudaGetDeviceCount(&count), cudaSuccess);
  EXPECT_EQ(count, 1);
  cudaDeviceProp prop;
  ASSERT_EQ(cudaGetDeviceProperties(&prop, 0), cudaSuccess);
  EXPECT_STREQ(prop.name, "torchmem simulated device");
  EXPECT_EQ(prop.major, 9);
  EXPECT_EQ(prop.minor, 0);
  EXPECT_EQ(prop.totalGlobalMem, simcuda_get_memory_capacity(0));
  EXPECT_EQ(prop.warpSize, 32);
  EXPECT_GT(prop.multiProcessorCount, 0);
  int major = 0, sms = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0), cudaSuccess);
  ASSERT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), cudaSuccess);
  EXPECT_EQ(major, 9);
  EXPECT_EQ(sms, prop.multiProcessorCount);
  EXPECT_EQ(cudaGetDeviceProperties(&prop, 1), cudaErrorInvalidDevice);
  (void)cudaGetLastError();
}

TEST_F(DeviceTest, SeveralDevicesWithACurrentDevicePerThread) {
  ASSERT_EQ(simcuda_set_device_count(3), 0);
  ASSERT_EQ(simcuda_set_memory_capacity(2, 1ull << 30), 0);
  int count = 0, device = -1;
  ASSERT_EQ(cudaGetDeviceCount(&count), cudaSuccess);
  EXPECT_EQ(count, 3);
  ASSERT_EQ(cudaSetDevice(2), cudaSuccess);
  ASSERT_EQ(cudaGetDevice(&device), cudaSuccess);
  EXPECT_EQ(device, 2);
  int other_thread_device = -1;
  std::thread([&] { cudaGetDevice(&other_thread_device); }).join();
  EXPECT_EQ(other_thread_device, 0);

  void* p = nullptr;
  ASSERT_EQ(cudaMalloc(&p, 4096), cudaSuccess);
  EXPECT_EQ(simcuda_live_bytes(2), 4096u);
  EXPECT_EQ(simcuda_live_bytes(0), 0u);
  size_t free = 0, total = 0;
  ASSERT_EQ(cudaMemGetInfo(&free, &total), cudaSuccess);
  EXPECT_EQ(total, 1ull << 30);
  cudaPointerAttributes attr;
  ASSERT_EQ(cudaPointerGetAttributes(&attr, p), cudaSuccess);
  EXPECT_EQ(attr.device, 2);
  // Streams belong to the device current at creation; events must match.
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  int stream_device = -1;
  ASSERT_EQ(cudaStreamGetDevice(stream, &stream_device), cudaSuccess);
  EXPECT_EQ(stream_device, 2);
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  cudaEvent_t event = nullptr;
  ASSERT_EQ(cudaEventCreate(&event), cudaSuccess);
  EXPECT_EQ(cudaEventRecord(event, stream), cudaErrorInvalidResourceHandle);
  EXPECT_EQ(cudaSetDevice(3), cudaErrorInvalidDevice);
  // A device with live allocations cannot be removed.
  EXPECT_NE(simcuda_set_device_count(1), 0);
  EXPECT_EQ(cudaFree(p), cudaSuccess);
  EXPECT_EQ(simcuda_live_bytes(2), 0u);
  EXPECT_EQ(cudaEventDestroy(event), cudaSuccess);
  EXPECT_EQ(cudaStreamDestroy(stream), cudaSuccess);
  (void)cudaGetLastError();
}

TEST_F(DeviceTest, NoDevice) {
  ASSERT_EQ(simcuda_set_device_count(0), 0);
  int count = -1;
  EXPECT_EQ(cudaGetDeviceCount(&count), cudaErrorNoDevice);
  EXPECT_EQ(count, 0);
  void* p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, 16), cudaErrorInvalidDevice);
  (void)cudaGetLastError();
}

TEST_F(DeviceTest, Versions) {
  int runtime = 0, driver = 0;
  ASSERT_EQ(cudaRuntimeGetVersion(&runtime), cudaSuccess);
  ASSERT_EQ(cudaDriverGetVersion(&driver), cudaSuccess);
  EXPECT_EQ(runtime, CUDART_VERSION);  // the toolkit built against
  EXPECT_GE(driver, runtime);
}

TEST_F(DeviceTest, DriverEntryPointsComeFromTheFakeDriver) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult status = cudaDriverEntryPointSymbolNotFound;
  ASSERT_EQ(cudaGetDriverEntryPointByVersion("cuDevicePrimaryCtxGetState", &fn, CUDART_VERSION,
                                             cudaEnableDefault, &status),
            cudaSuccess);
  ASSERT_EQ(status, cudaDriverEntryPointSuccess);
  ASSERT_NE(fn, nullptr);
  unsigned int flags = 0;
  int active = 0;
  EXPECT_EQ(reinterpret_cast<CUresult (*)(CUdevice, unsigned int*, int*)>(fn)(0, &flags, &active),
            CUDA_SUCCESS);
  EXPECT_EQ(active, 1);

  // Versioned names follow cuda.h: cuMemGetInfo is cuMemGetInfo_v2.
  ASSERT_EQ(cudaGetDriverEntryPoint("cuMemGetInfo", &fn, cudaEnableDefault, &status), cudaSuccess);
  ASSERT_EQ(status, cudaDriverEntryPointSuccess);
  size_t free = 0, total = 0;
  EXPECT_EQ(reinterpret_cast<CUresult (*)(size_t*, size_t*)>(fn)(&free, &total), CUDA_SUCCESS);
  EXPECT_EQ(total, simcuda_get_memory_capacity(0));

  // Driver calls that are not simulated exist as stubs.
  ASSERT_EQ(cudaGetDriverEntryPoint("cuMemAllocManaged", &fn, cudaEnableDefault, &status),
            cudaSuccess);
  ASSERT_NE(fn, nullptr);
  EXPECT_EQ(reinterpret_cast<CUresult (*)(CUdeviceptr*, size_t, unsigned int)>(fn)(nullptr, 0, 0),
            CUDA_ERROR_NOT_SUPPORTED);

  ASSERT_EQ(cudaGetDriverEntryPoint("cuNoSuchCall", &fn, cudaEnableDefault, &status), cudaSuccess);
  EXPECT_EQ(status, cudaDriverEntryPointSymbolNotFound);
  EXPECT_EQ(fn, nullptr);
}

__attribute__((used)) int g_device_variable_shadow = 0;

TEST_F(DeviceTest, RegistrationAndLaunchEntryPoints) {
  static const char kFatbin[16] = {};
  void** module = __cudaRegisterFatBinary(const_cast<char*>(kFatbin));
  ASSERT_NE(module, nullptr);
  static const char host_stub = 0;
  __cudaRegisterFunction(module, &host_stub, const_cast<char*>("_Z6kernelv"), "_Z6kernelv", -1,
                         nullptr, nullptr, nullptr, nullptr, nullptr);
  __cudaRegisterVar(module, reinterpret_cast<char*>(&g_device_variable_shadow),
                    const_cast<char*>("g"), "g", 0, sizeof(int), 0, 0);
  __cudaRegisterFatBinaryEnd(module);
  EXPECT_EQ(__cudaInitModule(module), 1);

  cudaKernel_t kernel = nullptr;
  ASSERT_EQ(__cudaGetKernel(&kernel, &host_stub), cudaSuccess);
  ASSERT_NE(kernel, nullptr);
  const char* name = nullptr;
  ASSERT_EQ(cudaFuncGetName(&name, &host_stub), cudaSuccess);
  EXPECT_STREQ(name, "_Z6kernelv");

  EXPECT_EQ(__cudaPushCallConfiguration(dim3(4), dim3(128), 0, cudaStreamPerThread), 0u);
  dim3 grid, block;
  size_t shared = 1;
  cudaStream_t stream = nullptr;
  ASSERT_EQ(__cudaPopCallConfiguration(&grid, &block, &shared, &stream), cudaSuccess);
  EXPECT_EQ(grid.x, 4u);
  EXPECT_EQ(block.x, 128u);
  EXPECT_EQ(shared, 0u);
  EXPECT_EQ(stream, cudaStreamPerThread);
  EXPECT_EQ(__cudaLaunchKernel(kernel, grid, block, nullptr, 0, stream), cudaSuccess);
  EXPECT_EQ(__cudaLaunchKernel(kernel, dim3(1), dim3(2048), nullptr, 0, stream),
            cudaErrorInvalidConfiguration);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);

  // __device__ variables are backed by memory the copy calls reach.
  const int value = 42;
  int read = 0;
  ASSERT_EQ(cudaMemcpyToSymbol(&g_device_variable_shadow, &value, sizeof(value), 0,
                               cudaMemcpyHostToDevice),
            cudaSuccess);
  ASSERT_EQ(cudaMemcpyFromSymbol(&read, &g_device_variable_shadow, sizeof(read), 0,
                                 cudaMemcpyDeviceToHost),
            cudaSuccess);
  EXPECT_EQ(read, 42);
  void* address = nullptr;
  ASSERT_EQ(cudaGetSymbolAddress(&address, &g_device_variable_shadow), cudaSuccess);
  EXPECT_EQ(*static_cast<int*>(address), 42);
  __cudaUnregisterFatBinary(module);
}

TEST_F(DeviceTest, CallsNotSimulatedFailWithNotSupported) {
  cudaArray_t array = nullptr;
  cudaChannelFormatDesc desc = {};
  EXPECT_EQ(cudaMallocArray(&array, &desc, 16, 16, 0), cudaErrorNotSupported);
  EXPECT_EQ(cudaGetLastError(), cudaErrorNotSupported);
  EXPECT_EQ(simcuda_call_count("cudaMallocArray"), 1u);
}

}  // namespace
}  // namespace simcuda_test
