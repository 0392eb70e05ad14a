// Memory on the simulated device: allocation, alignment, capacity and
// cudaMemGetInfo, lazy reservation, out-of-memory codes with CUDA's
// last-error semantics, copies, memsets, pinned and registered host memory.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <thread>
#include <vector>

#include "simcuda_control.h"
#include "tests/test_util.h"

namespace simcuda_test {
namespace {

constexpr size_t kMiB = 1 << 20;
constexpr unsigned long long kGiB = 1ull << 30;

using MemoryTest = SimcudaTest;

TEST_F(MemoryTest, AllocationsAreAlignedWritableAndCounted) {
  std::vector<void*> pointers;
  for (size_t size : std::initializer_list<size_t>{1, 255, 256, 257, 4096, 3 * kMiB + 5}) {
    void* p = nullptr;
    ASSERT_EQ(cudaMalloc(&p, size), cudaSuccess);
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 256, 0u) << size;
    std::memset(p, 0xab, size);  // device memory is host memory
    pointers.push_back(p);
  }
  EXPECT_EQ(simcuda_live_allocations(0), 6u);
  EXPECT_EQ(simcuda_live_bytes(0), 256u + 256 + 256 + 512 + 4096 + (3 * kMiB + 256));
  for (void* p : pointers) EXPECT_EQ(cudaFree(p), cudaSuccess);
  EXPECT_EQ(simcuda_live_bytes(0), 0u);
  EXPECT_EQ(simcuda_live_allocations(0), 0u);
  EXPECT_EQ(simcuda_call_count("cudaMalloc"), 6u);
  EXPECT_EQ(simcuda_call_count("cudaFree"), 6u);
}

TEST_F(MemoryTest, ZeroSizeAndNullAreAccepted) {
  void* p = reinterpret_cast<void*>(0x1);
  EXPECT_EQ(cudaMalloc(&p, 0), cudaSuccess);
  EXPECT_EQ(p, nullptr);
  EXPECT_EQ(cudaFree(nullptr), cudaSuccess);
}

TEST_F(MemoryTest, FreeOfUnknownPointerFails) {
  int host = 0;
  EXPECT_EQ(cudaFree(&host), cudaErrorInvalidValue);
  void* p = nullptr;
  ASSERT_EQ(cudaMalloc(&p, 1024), cudaSuccess);
  EXPECT_EQ(cudaFree(p), cudaSuccess);
  EXPECT_EQ(cudaFree(p), cudaErrorInvalidValue);  // double free
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidValue);
}

TEST_F(MemoryTest, CapacityBoundsAllocationAndMemGetInfo) {
  ASSERT_EQ(simcuda_set_memory_capacity(0, kGiB), 0);
  size_t free = 0, total = 0;
  ASSERT_EQ(cudaMemGetInfo(&free, &total), cudaSuccess);
  EXPECT_EQ(total, kGiB);
  EXPECT_EQ(free, kGiB);
  cudaDeviceProp prop;
  ASSERT_EQ(cudaGetDeviceProperties(&prop, 0), cudaSuccess);
  EXPECT_EQ(prop.totalGlobalMem, kGiB);

  void* a = nullptr;
  ASSERT_EQ(cudaMalloc(&a, 600 * kMiB), cudaSuccess);
  ASSERT_EQ(cudaMemGetInfo(&free, &total), cudaSuccess);
  EXPECT_EQ(free, kGiB - 600 * kMiB);

  void* b = reinterpret_cast<void*>(0x1);
  EXPECT_EQ(cudaMalloc(&b, 600 * kMiB), cudaErrorMemoryAllocation);
  EXPECT_EQ(b, nullptr);
  EXPECT_EQ(simcuda_live_allocations(0), 1u);

  // The rest still fits exactly.
  void* c = nullptr;
  EXPECT_EQ(cudaMalloc(&c, kGiB - 600 * kMiB), cudaSuccess);
  EXPECT_EQ(simcuda_peak_bytes(0), kGiB);
  EXPECT_EQ(cudaFree(c), cudaSuccess);
  EXPECT_EQ(cudaFree(a), cudaSuccess);
}

TEST_F(MemoryTest, OutOfMemoryFollowsLastErrorSemantics) {
  ASSERT_EQ(simcuda_set_memory_capacity(0, 64 * kMiB), 0);
  void* p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, 65 * kMiB), cudaErrorMemoryAllocation);
  // A later successful call does not clear the recorded error...
  void* q = nullptr;
  ASSERT_EQ(cudaMalloc(&q, kMiB), cudaSuccess);
  EXPECT_EQ(cudaPeekAtLastError(), cudaErrorMemoryAllocation);
  EXPECT_EQ(cudaPeekAtLastError(), cudaErrorMemoryAllocation);
  // ...cudaGetLastError returns and resets it.
  EXPECT_EQ(cudaGetLastError(), cudaErrorMemoryAllocation);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  EXPECT_STREQ(cudaGetErrorName(cudaErrorMemoryAllocation), "cudaErrorMemoryAllocation");
  EXPECT_STREQ(cudaGetErrorString(cudaErrorMemoryAllocation), "out of memory");
  EXPECT_EQ(cudaFree(q), cudaSuccess);
}

TEST_F(MemoryTest, LastErrorIsPerThread) {
  ASSERT_EQ(simcuda_set_memory_capacity(0, kMiB), 0);
  void* p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, 2 * kMiB), cudaErrorMemoryAllocation);
  cudaError_t other_thread = cudaErrorUnknown;
  std::thread([&] { other_thread = cudaPeekAtLastError(); }).join();
  EXPECT_EQ(other_thread, cudaSuccess);
  EXPECT_EQ(cudaGetLastError(), cudaErrorMemoryAllocation);
}

TEST_F(MemoryTest, LargeDeviceIsReservedLazily) {
  ASSERT_EQ(simcuda_set_memory_capacity(0, 80 * kGiB), 0);
  const size_t before = ResidentBytes();
  void* p = nullptr;
  ASSERT_EQ(cudaMalloc(&p, 64 * kGiB), cudaSuccess);
  // Touch a few pages far apart: only those become resident.
  char* bytes = static_cast<char*>(p);
  for (size_t offset = 0; offset < 64 * kGiB; offset += 8 * kGiB) bytes[offset] = 1;
  EXPECT_LT(ResidentBytes(), before + 64 * kMiB);
  size_t free = 0, total = 0;
  ASSERT_EQ(cudaMemGetInfo(&free, &total), cudaSuccess);
  EXPECT_EQ(free, 16 * kGiB);
  EXPECT_EQ(cudaFree(p), cudaSuccess);
}

TEST_F(MemoryTest, CopiesAndMemsetsMoveRealData) {
  constexpr size_t kCount = 1000;
  std::vector<int> host(kCount), back(kCount, 0);
  for (size_t i = 0; i < kCount; ++i) host[i] = static_cast<int>(i * 7);
  int* a = nullptr;
  int* b = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&a), kCount * sizeof(int)), cudaSuccess);
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&b), kCount * sizeof(int)), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(a, host.data(), kCount * sizeof(int), cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(b, a, kCount * sizeof(int), cudaMemcpyDeviceToDevice, nullptr),
            cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(nullptr), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(back.data(), b, kCount * sizeof(int), cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(back, host);

  ASSERT_EQ(cudaMemsetAsync(b, 0, kCount * sizeof(int), cudaStreamPerThread), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(back.data(), b, kCount * sizeof(int), cudaMemcpyDefault), cudaSuccess);
  EXPECT_EQ(back, std::vector<int>(kCount, 0));

  // A "device" pointer that is not device memory, or a range past the end.
  EXPECT_EQ(cudaMemcpy(back.data(), host.data(), 4, cudaMemcpyHostToDevice), cudaErrorInvalidValue);
  EXPECT_EQ(cudaMemcpy(back.data(), a, (kCount + 64) * sizeof(int), cudaMemcpyDeviceToHost),
            cudaErrorInvalidValue);
  EXPECT_EQ(cudaMemset(host.data(), 0, 4), cudaErrorInvalidValue);
  (void)cudaGetLastError();
  EXPECT_EQ(cudaFree(a), cudaSuccess);
  EXPECT_EQ(cudaFree(b), cudaSuccess);
}

TEST_F(MemoryTest, TwoDimensionalCopies) {
  // 4 rows of 8 bytes out of a 16-byte-pitch host buffer into a 512-pitch one.
  unsigned char host[4 * 16], back[4 * 8] = {};
  for (int i = 0; i < 64; ++i) host[i] = static_cast<unsigned char>(i);
  void* device = nullptr;
  size_t pitch = 0;
  ASSERT_EQ(cudaMallocPitch(&device, &pitch, 8, 4), cudaSuccess);
  EXPECT_EQ(pitch, 512u);
  ASSERT_EQ(cudaMemcpy2D(device, pitch, host, 16, 8, 4, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy2DAsync(back, 8, device, pitch, 8, 4, cudaMemcpyDeviceToHost, nullptr),
            cudaSuccess);
  for (int row = 0; row < 4; ++row) {
    for (int col = 0; col < 8; ++col) EXPECT_EQ(back[row * 8 + col], row * 16 + col);
  }
  EXPECT_EQ(cudaMemcpy2D(device, pitch, host, 16, 8, 5, cudaMemcpyHostToDevice),
            cudaErrorInvalidValue);  // a fifth row would leave the allocation
  EXPECT_EQ(cudaMemcpy2D(device, 4, host, 16, 8, 4, cudaMemcpyHostToDevice),
            cudaErrorInvalidPitchValue);
  (void)cudaGetLastError();
  EXPECT_EQ(cudaFree(device), cudaSuccess);
}

TEST_F(MemoryTest, PointerAttributesKnowEveryKindOfMemory) {
  void* device = nullptr;
  void* pinned = nullptr;
  ASSERT_EQ(cudaMalloc(&device, 4096), cudaSuccess);
  ASSERT_EQ(cudaHostAlloc(&pinned, 4096, cudaHostAllocDefault), cudaSuccess);
  std::vector<char> pageable(8192);

  cudaPointerAttributes attr;
  ASSERT_EQ(cudaPointerGetAttributes(&attr, static_cast<char*>(device) + 100), cudaSuccess);
  EXPECT_EQ(attr.type, cudaMemoryTypeDevice);
  EXPECT_EQ(attr.device, 0);
  ASSERT_EQ(cudaPointerGetAttributes(&attr, pinned), cudaSuccess);
  EXPECT_EQ(attr.type, cudaMemoryTypeHost);
  ASSERT_EQ(cudaPointerGetAttributes(&attr, pageable.data()), cudaSuccess);
  EXPECT_EQ(attr.type, cudaMemoryTypeUnregistered);

  ASSERT_EQ(cudaHostRegister(pageable.data(), pageable.size(), cudaHostRegisterDefault),
            cudaSuccess);
  EXPECT_EQ(cudaHostRegister(pageable.data(), 16, cudaHostRegisterDefault),
            cudaErrorHostMemoryAlreadyRegistered);
  ASSERT_EQ(cudaPointerGetAttributes(&attr, pageable.data() + 10), cudaSuccess);
  EXPECT_EQ(attr.type, cudaMemoryTypeHost);
  // Registered host memory is device-addressable.
  EXPECT_EQ(cudaMemcpy(pageable.data(), device, 4096, cudaMemcpyDeviceToDevice), cudaSuccess);
  EXPECT_EQ(cudaHostUnregister(pageable.data()), cudaSuccess);
  EXPECT_EQ(cudaHostUnregister(pageable.data()), cudaErrorHostMemoryNotRegistered);

  EXPECT_EQ(simcuda_live_bytes(0), 4096u);  // pinned memory is not device memory
  EXPECT_EQ(cudaFreeHost(pinned), cudaSuccess);
  EXPECT_EQ(cudaFree(device), cudaSuccess);
  (void)cudaGetLastError();
}

TEST_F(MemoryTest, StreamOrderedAllocation) {
  cudaStream_t s = nullptr;
  ASSERT_EQ(cudaStreamCreate(&s), cudaSuccess);
  void* p = nullptr;
  ASSERT_EQ(cudaMallocAsync(&p, kMiB, s), cudaSuccess);
  EXPECT_EQ(simcuda_live_bytes(0), kMiB);
  ASSERT_EQ(cudaFreeAsync(p, s), cudaSuccess);
  EXPECT_EQ(simcuda_live_bytes(0), 0u);
  EXPECT_EQ(cudaStreamDestroy(s), cudaSuccess);
}

}  // namespace
}  // namespace simcuda_test
