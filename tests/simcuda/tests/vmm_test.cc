// The driver's virtual memory on the simulated device: granularity, address
// reservations, physical allocations charged to the device's capacity,
// mappings at fixed addresses that share data, access flags that the host
// and the runtime's copies respect, and every argument and state the driver
// refuses, each call failable through fault injection and counted.
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "simcuda_control.h"
#include "tests/test_util.h"

namespace simcuda_test {
namespace {

constexpr size_t kMiB = size_t{1} << 20;
constexpr size_t kPage = 2 * kMiB;  // the simulated granularity

// The driver's VMM calls, resolved the way PyTorch resolves them
// (cudaGetDriverEntryPoint), so the test runs what torch runs.
struct Driver {
  decltype(&cuMemGetAllocationGranularity) granularity;
  decltype(&cuMemAddressReserve) reserve;
  decltype(&cuMemAddressFree) address_free;
  decltype(&cuMemCreate) create;
  decltype(&cuMemRelease) release;
  decltype(&cuMemMap) map;
  decltype(&cuMemUnmap) unmap;
  decltype(&cuMemSetAccess) set_access;
  decltype(&cuMemGetAccess) get_access;
  decltype(&cuMemExportToShareableHandle) export_handle;
  decltype(&cuMemImportFromShareableHandle) import_handle;
  decltype(&cuMemGetAllocationPropertiesFromHandle) properties;
  decltype(&cuMemRetainAllocationHandle) retain;
  decltype(&cuMemGetAddressRange) address_range;
  decltype(&cuDeviceGetAttribute) attribute;
};

template <typename Fn>
void Resolve(const char* name, Fn* fn) {
  void* p = nullptr;
  cudaDriverEntryPointQueryResult status = cudaDriverEntryPointSymbolNotFound;
  ASSERT_EQ(cudaGetDriverEntryPoint(name, &p, cudaEnableDefault, &status), cudaSuccess);
  ASSERT_EQ(status, cudaDriverEntryPointSuccess) << name;
  *fn = reinterpret_cast<Fn>(p);
}

CUmemAllocationProp DeviceProp(int device = 0) {
  CUmemAllocationProp prop = {};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  return prop;
}

CUmemAccessDesc Access(int device, CUmemAccess_flags flags) {
  CUmemAccessDesc desc = {};
  desc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  desc.location.id = device;
  desc.flags = flags;
  return desc;
}

simcuda_vmm_stats_t Stats() {
  simcuda_vmm_stats_t stats;
  simcuda_vmm_stats(&stats);
  return stats;
}

class VmmTest : public SimcudaTest {
 protected:
  void SetUp() override {
    SimcudaTest::SetUp();
    Resolve("cuMemGetAllocationGranularity", &d_.granularity);
    Resolve("cuMemAddressReserve", &d_.reserve);
    Resolve("cuMemAddressFree", &d_.address_free);
    Resolve("cuMemCreate", &d_.create);
    Resolve("cuMemRelease", &d_.release);
    Resolve("cuMemMap", &d_.map);
    Resolve("cuMemUnmap", &d_.unmap);
    Resolve("cuMemSetAccess", &d_.set_access);
    Resolve("cuMemGetAccess", &d_.get_access);
    Resolve("cuMemExportToShareableHandle", &d_.export_handle);
    Resolve("cuMemImportFromShareableHandle", &d_.import_handle);
    Resolve("cuMemGetAllocationPropertiesFromHandle", &d_.properties);
    Resolve("cuMemRetainAllocationHandle", &d_.retain);
    Resolve("cuMemGetAddressRange", &d_.address_range);
    Resolve("cuDeviceGetAttribute", &d_.attribute);
    before_ = Stats();
  }

  // Every test leaves the driver's virtual memory as it found it.
  void TearDown() override {
    const simcuda_vmm_stats_t after = Stats();
    EXPECT_EQ(after.reservations, before_.reservations);
    EXPECT_EQ(after.allocations, before_.allocations);
    EXPECT_EQ(after.mappings, before_.mappings);
    EXPECT_EQ(simcuda_live_bytes(0), 0u);
    SimcudaTest::TearDown();
  }

  CUdeviceptr Reserve(size_t size) {
    CUdeviceptr ptr = 0;
    EXPECT_EQ(d_.reserve(&ptr, size, 0, 0, 0), CUDA_SUCCESS);
    return ptr;
  }

  CUmemGenericAllocationHandle Create(size_t size, int device = 0) {
    CUmemGenericAllocationHandle handle = 0;
    const CUmemAllocationProp prop = DeviceProp(device);
    EXPECT_EQ(d_.create(&handle, size, &prop, 0), CUDA_SUCCESS);
    return handle;
  }

  void GrantReadWrite(CUdeviceptr ptr, size_t size) {
    const CUmemAccessDesc desc = Access(0, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
    ASSERT_EQ(d_.set_access(ptr, size, &desc, 1), CUDA_SUCCESS);
  }

  Driver d_{};
  simcuda_vmm_stats_t before_{};
};

TEST_F(VmmTest, GranularityIsTwoMebibytes) {
  const CUmemAllocationProp prop = DeviceProp();
  size_t granularity = 0;
  ASSERT_EQ(d_.granularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM), CUDA_SUCCESS);
  EXPECT_EQ(granularity, kPage);
  ASSERT_EQ(d_.granularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED),
            CUDA_SUCCESS);
  EXPECT_EQ(granularity, kPage);

  EXPECT_EQ(d_.granularity(nullptr, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
            CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(d_.granularity(&granularity, nullptr, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
            CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(d_.granularity(&granularity, &prop, static_cast<CUmemAllocationGranularity_flags>(7)),
            CUDA_ERROR_INVALID_VALUE);
  CUmemAllocationProp bad = prop;
  bad.type = CU_MEM_ALLOCATION_TYPE_INVALID;
  EXPECT_EQ(d_.granularity(&granularity, &bad, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
            CUDA_ERROR_INVALID_VALUE);
  bad = prop;
  bad.location.id = 1;  // one device
  EXPECT_EQ(d_.granularity(&granularity, &bad, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
            CUDA_ERROR_INVALID_DEVICE);
}

TEST_F(VmmTest, DeviceAttributesAdvertiseVmmWithPosixHandlesOnly) {
  int value = -1;
  ASSERT_EQ(d_.attribute(&value, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, 0),
            CUDA_SUCCESS);
  EXPECT_EQ(value, 1);
  ASSERT_EQ(
      d_.attribute(&value, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, 0),
      CUDA_SUCCESS);
  EXPECT_EQ(value, 1);
  ASSERT_EQ(d_.attribute(&value, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED, 0),
            CUDA_SUCCESS);
  EXPECT_EQ(value, 0);
  ASSERT_EQ(d_.attribute(&value, CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED, 0),
            CUDA_SUCCESS);
  EXPECT_EQ(value, 0);
}

TEST_F(VmmTest, ReservationsAreAlignedAddressSpaceThatCostsNothing) {
  // Far more than the device and the host have: only address space.
  const size_t huge = size_t{1} << 40;
  CUdeviceptr ptr = 0;
  ASSERT_EQ(d_.reserve(&ptr, huge, 0, 0, 0), CUDA_SUCCESS);
  EXPECT_EQ(ptr % kPage, 0u);
  EXPECT_EQ(Stats().reservations, before_.reservations + 1);
  EXPECT_EQ(Stats().reserved_bytes, before_.reserved_bytes + huge);
  EXPECT_EQ(simcuda_live_bytes(0), 0u);

  CUdeviceptr aligned = 0;
  ASSERT_EQ(d_.reserve(&aligned, 8 * kMiB, size_t{1} << 30, 0, 0), CUDA_SUCCESS);
  EXPECT_EQ(aligned % (size_t{1} << 30), 0u);
  ASSERT_EQ(d_.address_free(aligned, 8 * kMiB), CUDA_SUCCESS);
  // A free hint is taken.
  CUdeviceptr hinted = 0;
  ASSERT_EQ(d_.reserve(&hinted, 8 * kMiB, 0, aligned, 0), CUDA_SUCCESS);
  EXPECT_EQ(hinted, aligned);

  EXPECT_EQ(d_.address_free(ptr, huge - kPage), CUDA_ERROR_INVALID_VALUE);  // size must match
  EXPECT_EQ(d_.address_free(ptr + kPage, huge - kPage), CUDA_ERROR_INVALID_VALUE);
  ASSERT_EQ(d_.address_free(ptr, huge), CUDA_SUCCESS);
  EXPECT_EQ(d_.address_free(ptr, huge), CUDA_ERROR_INVALID_VALUE);  // already freed
  ASSERT_EQ(d_.address_free(hinted, 8 * kMiB), CUDA_SUCCESS);
}

TEST_F(VmmTest, ReserveRefusesBadArguments) {
  CUdeviceptr ptr = 0;
  EXPECT_EQ(d_.reserve(nullptr, kPage, 0, 0, 0), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(d_.reserve(&ptr, 0, 0, 0, 0), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(d_.reserve(&ptr, kPage + 1, 0, 0, 0), CUDA_ERROR_INVALID_VALUE);      // host pages
  EXPECT_EQ(d_.reserve(&ptr, kPage, 3 * kPage, 0, 0), CUDA_ERROR_INVALID_VALUE);  // not 2^n
  EXPECT_EQ(d_.reserve(&ptr, kPage, 0, 12345, 0), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(d_.reserve(&ptr, kPage, 0, 0, 1), CUDA_ERROR_INVALID_VALUE);  // flags
  EXPECT_EQ(Stats().reservations, before_.reservations);
}

TEST_F(VmmTest, PhysicalMemoryCountsAgainstTheDeviceCapacity) {
  ASSERT_EQ(simcuda_set_memory_capacity(0, 64 * kMiB), 0);
  simcuda_reset_peak_bytes(0);
  size_t free = 0, total = 0;
  const CUmemGenericAllocationHandle a = Create(20 * kMiB);
  const CUmemGenericAllocationHandle b = Create(40 * kMiB);
  ASSERT_EQ(cudaMemGetInfo(&free, &total), cudaSuccess);
  EXPECT_EQ(total, 64 * kMiB);
  EXPECT_EQ(free, 4 * kMiB);
  EXPECT_EQ(simcuda_live_bytes(0), 60 * kMiB);
  EXPECT_EQ(simcuda_live_allocations(0), 2u);
  EXPECT_EQ(Stats().allocations, before_.allocations + 2);
  EXPECT_EQ(Stats().allocated_bytes, before_.allocated_bytes + 60 * kMiB);

  // Full: the driver's out-of-memory, and no half-made allocation.
  CUmemGenericAllocationHandle c = 0;
  const CUmemAllocationProp prop = DeviceProp();
  EXPECT_EQ(d_.create(&c, 6 * kMiB, &prop, 0), CUDA_ERROR_OUT_OF_MEMORY);
  EXPECT_EQ(Stats().allocations, before_.allocations + 2);
  // cudaMalloc sees the same capacity.
  void* p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, 6 * kMiB), cudaErrorMemoryAllocation);
  (void)cudaGetLastError();

  ASSERT_EQ(d_.release(b), CUDA_SUCCESS);
  EXPECT_EQ(simcuda_live_bytes(0), 20 * kMiB);
  ASSERT_EQ(d_.create(&c, 6 * kMiB, &prop, 0), CUDA_SUCCESS);
  EXPECT_EQ(simcuda_peak_bytes(0), 60 * kMiB);
  ASSERT_EQ(d_.release(a), CUDA_SUCCESS);
  ASSERT_EQ(d_.release(c), CUDA_SUCCESS);
  EXPECT_EQ(simcuda_live_bytes(0), 0u);
  EXPECT_EQ(simcuda_live_allocations(0), 0u);
}

TEST_F(VmmTest, CreateRefusesBadArguments) {
  CUmemGenericAllocationHandle handle = 0;
  const CUmemAllocationProp prop = DeviceProp();
  EXPECT_EQ(d_.create(nullptr, kPage, &prop, 0), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(d_.create(&handle, 0, &prop, 0), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(d_.create(&handle, kPage + 4096, &prop, 0), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(d_.create(&handle, kPage, nullptr, 0), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(d_.create(&handle, kPage, &prop, 1), CUDA_ERROR_INVALID_VALUE);
  CUmemAllocationProp bad = prop;
  bad.location.id = 3;
  EXPECT_EQ(d_.create(&handle, kPage, &bad, 0), CUDA_ERROR_INVALID_DEVICE);
  bad = prop;
  bad.location.type = CU_MEM_LOCATION_TYPE_INVALID;
  EXPECT_EQ(d_.create(&handle, kPage, &bad, 0), CUDA_ERROR_INVALID_VALUE);
  // Fabric handles: what a GPU without an NVLink fabric answers (PyTorch
  // probes this and falls back to file descriptors).
  bad = prop;
  bad.requestedHandleTypes = CU_MEM_HANDLE_TYPE_FABRIC;
  EXPECT_EQ(d_.create(&handle, kPage, &bad, 0), CUDA_ERROR_NOT_SUPPORTED);
  EXPECT_EQ(Stats().allocations, before_.allocations);
  EXPECT_EQ(simcuda_live_bytes(0), 0u);

  // Handles are checked on release: unknown, and released twice.
  EXPECT_EQ(d_.release(0xdead), CUDA_ERROR_INVALID_VALUE);
  handle = Create(kPage);
  ASSERT_EQ(d_.release(handle), CUDA_SUCCESS);
  EXPECT_EQ(d_.release(handle), CUDA_ERROR_INVALID_VALUE);
}

TEST_F(VmmTest, PropertiesComeBackFromTheHandle) {
  const CUmemGenericAllocationHandle handle = Create(4 * kMiB);
  CUmemAllocationProp prop = {};
  ASSERT_EQ(d_.properties(&prop, handle), CUDA_SUCCESS);
  EXPECT_EQ(prop.type, CU_MEM_ALLOCATION_TYPE_PINNED);
  EXPECT_EQ(prop.location.type, CU_MEM_LOCATION_TYPE_DEVICE);
  EXPECT_EQ(prop.location.id, 0);
  EXPECT_EQ(prop.requestedHandleTypes, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  EXPECT_EQ(d_.properties(nullptr, handle), CUDA_ERROR_INVALID_VALUE);
  ASSERT_EQ(d_.release(handle), CUDA_SUCCESS);
  EXPECT_EQ(d_.properties(&prop, handle), CUDA_ERROR_INVALID_VALUE);
}

TEST_F(VmmTest, MappingsOfOneHandleShareTheirData) {
  const CUdeviceptr range = Reserve(16 * kMiB);
  const CUmemGenericAllocationHandle handle = Create(4 * kMiB);
  // The same physical memory at two addresses of the reservation.
  ASSERT_EQ(d_.map(range, 4 * kMiB, 0, handle, 0), CUDA_SUCCESS);
  ASSERT_EQ(d_.map(range + 8 * kMiB, 4 * kMiB, 0, handle, 0), CUDA_SUCCESS);
  GrantReadWrite(range, 4 * kMiB);
  GrantReadWrite(range + 8 * kMiB, 4 * kMiB);
  EXPECT_EQ(Stats().mappings, before_.mappings + 2);
  EXPECT_EQ(Stats().mapped_bytes, before_.mapped_bytes + 8 * kMiB);
  EXPECT_EQ(simcuda_live_bytes(0), 4 * kMiB);  // mapped twice, charged once

  auto* first = reinterpret_cast<unsigned char*>(range);
  auto* second = reinterpret_cast<unsigned char*>(range + 8 * kMiB);
  std::memset(first, 0x5a, 4 * kMiB);
  first[12345] = 7;
  EXPECT_EQ(second[0], 0x5a);
  EXPECT_EQ(second[12345], 7);
  EXPECT_EQ(second[4 * kMiB - 1], 0x5a);

  // A mapping may start inside the allocation (offset).
  ASSERT_EQ(d_.map(range + 14 * kMiB, kPage, kPage, handle, 0), CUDA_SUCCESS);
  GrantReadWrite(range + 14 * kMiB, kPage);
  EXPECT_EQ(reinterpret_cast<unsigned char*>(range + 14 * kMiB)[0], 0x5a);
  first[kPage + 1] = 9;
  EXPECT_EQ(reinterpret_cast<unsigned char*>(range + 14 * kMiB)[1], 9);

  ASSERT_EQ(d_.unmap(range, 4 * kMiB), CUDA_SUCCESS);
  ASSERT_EQ(d_.unmap(range + 8 * kMiB, 4 * kMiB), CUDA_SUCCESS);
  ASSERT_EQ(d_.unmap(range + 14 * kMiB, kPage), CUDA_SUCCESS);
  ASSERT_EQ(d_.release(handle), CUDA_SUCCESS);
  ASSERT_EQ(d_.address_free(range, 16 * kMiB), CUDA_SUCCESS);
}

TEST_F(VmmTest, RuntimeCopiesReachMappedMemoryAcrossMappings) {
  const CUdeviceptr range = Reserve(8 * kMiB);
  const CUmemGenericAllocationHandle a = Create(kPage);
  const CUmemGenericAllocationHandle b = Create(kPage);
  ASSERT_EQ(d_.map(range, kPage, 0, a, 0), CUDA_SUCCESS);
  ASSERT_EQ(d_.map(range + kPage, kPage, 0, b, 0), CUDA_SUCCESS);

  // No access yet: the runtime refuses to copy there.
  std::vector<unsigned char> host(kPage, 0x11);
  void* straddle = reinterpret_cast<void*>(range + kPage - 100);
  EXPECT_EQ(cudaMemcpy(straddle, host.data(), 200, cudaMemcpyHostToDevice), cudaErrorInvalidValue);
  (void)cudaGetLastError();

  // One call over both mappings, as PyTorch does after mapping its pages.
  GrantReadWrite(range, 2 * kPage);
  EXPECT_EQ(Stats().accessible_bytes, before_.accessible_bytes + 2 * kPage);
  ASSERT_EQ(cudaMemcpy(straddle, host.data(), 200, cudaMemcpyHostToDevice), cudaSuccess);
  std::vector<unsigned char> back(200, 0);
  ASSERT_EQ(cudaMemcpy(back.data(), straddle, 200, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(back, std::vector<unsigned char>(200, 0x11));
  // Past the last mapping: refused.
  void* tail = reinterpret_cast<void*>(range + 2 * kPage - 100);
  EXPECT_EQ(cudaMemcpy(tail, host.data(), 200, cudaMemcpyHostToDevice), cudaErrorInvalidValue);
  (void)cudaGetLastError();

  cudaPointerAttributes attributes;
  ASSERT_EQ(cudaPointerGetAttributes(&attributes, straddle), cudaSuccess);
  EXPECT_EQ(attributes.type, cudaMemoryTypeDevice);
  EXPECT_EQ(attributes.device, 0);

  ASSERT_EQ(d_.unmap(range, 2 * kPage), CUDA_SUCCESS);  // both mappings in one call
  ASSERT_EQ(cudaPointerGetAttributes(&attributes, straddle), cudaSuccess);
  EXPECT_EQ(attributes.type, cudaMemoryTypeUnregistered);
  ASSERT_EQ(d_.release(a), CUDA_SUCCESS);
  ASSERT_EQ(d_.release(b), CUDA_SUCCESS);
  ASSERT_EQ(d_.address_free(range, 8 * kMiB), CUDA_SUCCESS);
}

TEST_F(VmmTest, MapRefusesBadArgumentsAndDoubleMapping) {
  const CUdeviceptr range = Reserve(8 * kMiB);
  const CUmemGenericAllocationHandle handle = Create(4 * kMiB);
  EXPECT_EQ(d_.map(range + 4096, kPage, 0, handle, 0), CUDA_ERROR_INVALID_VALUE);  // ptr
  EXPECT_EQ(d_.map(range, kPage + 4096, 0, handle, 0), CUDA_ERROR_INVALID_VALUE);  // size
  EXPECT_EQ(d_.map(range, kPage, 4096, handle, 0), CUDA_ERROR_INVALID_VALUE);      // offset
  EXPECT_EQ(d_.map(range, kPage, 0, handle, 1), CUDA_ERROR_INVALID_VALUE);         // flags
  EXPECT_EQ(d_.map(range, 0, 0, handle, 0), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(d_.map(range, 4 * kMiB, kPage, handle, 0), CUDA_ERROR_INVALID_VALUE);  // past it
  EXPECT_EQ(d_.map(range, kPage, 0, 0xdead, 0), CUDA_ERROR_INVALID_VALUE);         // handle
  // Outside any reservation, and running off the end of one.
  EXPECT_EQ(d_.map(range + 8 * kMiB, kPage, 0, handle, 0), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(d_.map(range + 6 * kMiB, 4 * kMiB, 0, handle, 0), CUDA_ERROR_INVALID_VALUE);

  ASSERT_EQ(d_.map(range + kPage, 4 * kMiB, 0, handle, 0), CUDA_SUCCESS);
  // Over a mapping: at its start, inside it, or overlapping its start.
  EXPECT_EQ(d_.map(range + kPage, kPage, 0, handle, 0), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(d_.map(range + 2 * kPage, kPage, 0, handle, 0), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(d_.map(range, 4 * kMiB, 0, handle, 0), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(Stats().mappings, before_.mappings + 1);

  // A released handle can no longer be mapped (its existing mapping lives on).
  ASSERT_EQ(d_.release(handle), CUDA_SUCCESS);
  EXPECT_EQ(d_.map(range, kPage, 0, handle, 0), CUDA_ERROR_INVALID_VALUE);
  ASSERT_EQ(d_.unmap(range + kPage, 4 * kMiB), CUDA_SUCCESS);
  ASSERT_EQ(d_.address_free(range, 8 * kMiB), CUDA_SUCCESS);
}

TEST_F(VmmTest, UnmapTakesOnlyWholeMappings) {
  const CUdeviceptr range = Reserve(16 * kMiB);
  const CUmemGenericAllocationHandle big = Create(4 * kMiB);
  const CUmemGenericAllocationHandle small = Create(kPage);
  ASSERT_EQ(d_.map(range, 4 * kMiB, 0, big, 0), CUDA_SUCCESS);
  ASSERT_EQ(d_.map(range + 4 * kMiB, kPage, 0, small, 0), CUDA_SUCCESS);

  EXPECT_EQ(d_.unmap(range, kPage), CUDA_ERROR_INVALID_VALUE);             // half of one
  EXPECT_EQ(d_.unmap(range + kPage, kPage), CUDA_ERROR_INVALID_VALUE);     // from inside
  EXPECT_EQ(d_.unmap(range, 5 * kPage), CUDA_ERROR_INVALID_VALUE);         // past the last
  EXPECT_EQ(d_.unmap(range + 8 * kMiB, kPage), CUDA_ERROR_INVALID_VALUE);  // never mapped
  EXPECT_EQ(d_.unmap(range + 4096, kPage), CUDA_ERROR_INVALID_VALUE);      // unaligned
  EXPECT_EQ(Stats().mappings, before_.mappings + 2);

  ASSERT_EQ(d_.unmap(range + 4 * kMiB, kPage), CUDA_SUCCESS);
  EXPECT_EQ(d_.unmap(range + 4 * kMiB, kPage), CUDA_ERROR_INVALID_VALUE);  // twice
  // The range is a reservation again: it maps anew, with no access.
  ASSERT_EQ(d_.map(range + 4 * kMiB, kPage, 0, small, 0), CUDA_SUCCESS);
  unsigned long long flags = 99;
  const CUmemLocation device0 = {CU_MEM_LOCATION_TYPE_DEVICE, 0};
  ASSERT_EQ(d_.get_access(&flags, &device0, range + 4 * kMiB), CUDA_SUCCESS);
  EXPECT_EQ(flags, 0u);
  ASSERT_EQ(d_.unmap(range, 3 * kPage), CUDA_SUCCESS);
  ASSERT_EQ(d_.release(big), CUDA_SUCCESS);
  ASSERT_EQ(d_.release(small), CUDA_SUCCESS);
  ASSERT_EQ(d_.address_free(range, 16 * kMiB), CUDA_SUCCESS);
}

TEST_F(VmmTest, ReleasedWhileMappedTheMemoryLivesUntilTheLastUnmap) {
  const CUdeviceptr range = Reserve(8 * kMiB);
  const CUmemGenericAllocationHandle handle = Create(kPage);
  ASSERT_EQ(d_.map(range, kPage, 0, handle, 0), CUDA_SUCCESS);
  ASSERT_EQ(d_.map(range + kPage, kPage, 0, handle, 0), CUDA_SUCCESS);
  GrantReadWrite(range, 2 * kPage);
  reinterpret_cast<int*>(range)[0] = 42;
  ASSERT_EQ(d_.release(handle), CUDA_SUCCESS);  // legal: the driver frees on last unmap
  EXPECT_EQ(simcuda_live_bytes(0), kPage);
  EXPECT_EQ(reinterpret_cast<int*>(range + kPage)[0], 42);
  ASSERT_EQ(d_.unmap(range, kPage), CUDA_SUCCESS);
  EXPECT_EQ(simcuda_live_bytes(0), kPage);
  ASSERT_EQ(d_.unmap(range + kPage, kPage), CUDA_SUCCESS);
  EXPECT_EQ(simcuda_live_bytes(0), 0u);
  EXPECT_EQ(Stats().allocations, before_.allocations);
  ASSERT_EQ(d_.address_free(range, 8 * kMiB), CUDA_SUCCESS);
}

TEST_F(VmmTest, AReservationWithMappingsCannotBeFreed) {
  const CUdeviceptr range = Reserve(8 * kMiB);
  const CUmemGenericAllocationHandle handle = Create(kPage);
  ASSERT_EQ(d_.map(range + 4 * kMiB, kPage, 0, handle, 0), CUDA_SUCCESS);
  EXPECT_EQ(d_.address_free(range, 8 * kMiB), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(Stats().reservations, before_.reservations + 1);
  ASSERT_EQ(d_.unmap(range + 4 * kMiB, kPage), CUDA_SUCCESS);
  ASSERT_EQ(d_.release(handle), CUDA_SUCCESS);
  ASSERT_EQ(d_.address_free(range, 8 * kMiB), CUDA_SUCCESS);
}

TEST_F(VmmTest, AccessFlagsAreCheckedAndReported) {
  const CUdeviceptr range = Reserve(8 * kMiB);
  const CUmemGenericAllocationHandle handle = Create(4 * kMiB);
  ASSERT_EQ(d_.map(range, 4 * kMiB, 0, handle, 0), CUDA_SUCCESS);

  CUmemAccessDesc desc = Access(0, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
  EXPECT_EQ(d_.set_access(range, kPage, &desc, 1), CUDA_ERROR_INVALID_VALUE);     // part of one
  EXPECT_EQ(d_.set_access(range, 8 * kMiB, &desc, 1), CUDA_ERROR_INVALID_VALUE);  // unmapped tail
  EXPECT_EQ(d_.set_access(range, 4 * kMiB, nullptr, 1), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(d_.set_access(range, 4 * kMiB, &desc, 0), CUDA_ERROR_INVALID_VALUE);
  CUmemAccessDesc bad = Access(5, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
  EXPECT_EQ(d_.set_access(range, 4 * kMiB, &bad, 1), CUDA_ERROR_INVALID_DEVICE);
  bad = Access(0, static_cast<CUmemAccess_flags>(2));
  EXPECT_EQ(d_.set_access(range, 4 * kMiB, &bad, 1), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(Stats().accessible_bytes, before_.accessible_bytes);

  // Read-only: readable by the host and by the runtime's copies.
  desc = Access(0, CU_MEM_ACCESS_FLAGS_PROT_READ);
  ASSERT_EQ(d_.set_access(range, 4 * kMiB, &desc, 1), CUDA_SUCCESS);
  unsigned long long flags = 0;
  const CUmemLocation device0 = {CU_MEM_LOCATION_TYPE_DEVICE, 0};
  ASSERT_EQ(d_.get_access(&flags, &device0, range + kPage), CUDA_SUCCESS);
  EXPECT_EQ(flags, static_cast<unsigned long long>(CU_MEM_ACCESS_FLAGS_PROT_READ));
  EXPECT_EQ(reinterpret_cast<volatile unsigned char*>(range)[5], 0);
  unsigned char byte = 1;
  ASSERT_EQ(cudaMemcpy(&byte, reinterpret_cast<void*>(range + 5), 1, cudaMemcpyDeviceToHost),
            cudaSuccess);
  EXPECT_EQ(byte, 0);
  EXPECT_EQ(d_.get_access(&flags, &device0, range + 4 * kMiB), CUDA_ERROR_INVALID_VALUE);
  const CUmemLocation device7 = {CU_MEM_LOCATION_TYPE_DEVICE, 7};
  EXPECT_EQ(d_.get_access(&flags, &device7, range), CUDA_ERROR_INVALID_DEVICE);

  ASSERT_EQ(d_.unmap(range, 4 * kMiB), CUDA_SUCCESS);
  ASSERT_EQ(d_.release(handle), CUDA_SUCCESS);
  ASSERT_EQ(d_.address_free(range, 8 * kMiB), CUDA_SUCCESS);
}

using VmmDeathTest = VmmTest;

TEST_F(VmmDeathTest, TouchingMemoryWithoutAccessFaults) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const CUdeviceptr range = Reserve(8 * kMiB);
  const CUmemGenericAllocationHandle handle = Create(kPage);
  // A bare reservation, a fresh mapping, and a read-only one written to.
  EXPECT_DEATH(reinterpret_cast<volatile char*>(range + 4 * kMiB)[0] = 1, "");
  ASSERT_EQ(d_.map(range, kPage, 0, handle, 0), CUDA_SUCCESS);
  EXPECT_DEATH(reinterpret_cast<volatile char*>(range)[0] = 1, "");
  const CUmemAccessDesc read_only = Access(0, CU_MEM_ACCESS_FLAGS_PROT_READ);
  ASSERT_EQ(d_.set_access(range, kPage, &read_only, 1), CUDA_SUCCESS);
  EXPECT_DEATH(reinterpret_cast<volatile char*>(range)[0] = 1, "");
  GrantReadWrite(range, kPage);
  reinterpret_cast<volatile char*>(range)[0] = 1;
  ASSERT_EQ(d_.unmap(range, kPage), CUDA_SUCCESS);
  ASSERT_EQ(d_.release(handle), CUDA_SUCCESS);
  ASSERT_EQ(d_.address_free(range, 8 * kMiB), CUDA_SUCCESS);
}

TEST_F(VmmTest, RetainGivesTheMappedHandleWithOneMoreReference) {
  const CUdeviceptr range = Reserve(8 * kMiB);
  const CUmemGenericAllocationHandle handle = Create(4 * kMiB);
  ASSERT_EQ(d_.map(range, 4 * kMiB, 0, handle, 0), CUDA_SUCCESS);
  CUmemGenericAllocationHandle retained = 0;
  ASSERT_EQ(d_.retain(&retained, reinterpret_cast<void*>(range + 3 * kMiB)), CUDA_SUCCESS);
  EXPECT_EQ(retained, handle);
  EXPECT_EQ(d_.retain(&retained, reinterpret_cast<void*>(range + 4 * kMiB)),
            CUDA_ERROR_INVALID_VALUE);
  ASSERT_EQ(d_.unmap(range, 4 * kMiB), CUDA_SUCCESS);
  ASSERT_EQ(d_.release(handle), CUDA_SUCCESS);
  EXPECT_EQ(simcuda_live_bytes(0), 4 * kMiB);  // the retained reference holds it
  ASSERT_EQ(d_.release(retained), CUDA_SUCCESS);
  EXPECT_EQ(simcuda_live_bytes(0), 0u);
  ASSERT_EQ(d_.address_free(range, 8 * kMiB), CUDA_SUCCESS);
}

TEST_F(VmmTest, ExportedFileDescriptorsImportAsTheSameMemory) {
  const CUdeviceptr range = Reserve(8 * kMiB);
  const CUmemGenericAllocationHandle handle = Create(kPage);
  int fd = -1;
  ASSERT_EQ(d_.export_handle(&fd, handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
            CUDA_SUCCESS);
  ASSERT_GE(fd, 0);
  CUmemGenericAllocationHandle imported = 0;
  ASSERT_EQ(d_.import_handle(&imported, reinterpret_cast<void*>(static_cast<intptr_t>(fd)),
                             CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
            CUDA_SUCCESS);
  close(fd);
  EXPECT_NE(imported, handle);
  EXPECT_EQ(simcuda_live_bytes(0), kPage);  // an import is not new memory
  ASSERT_EQ(d_.map(range, kPage, 0, handle, 0), CUDA_SUCCESS);
  ASSERT_EQ(d_.map(range + kPage, kPage, 0, imported, 0), CUDA_SUCCESS);
  GrantReadWrite(range, 2 * kPage);
  reinterpret_cast<int*>(range)[10] = 1234;
  EXPECT_EQ(reinterpret_cast<int*>(range + kPage)[10], 1234);

  EXPECT_EQ(d_.export_handle(&fd, handle, CU_MEM_HANDLE_TYPE_FABRIC, 0), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(d_.export_handle(&fd, handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 1),
            CUDA_ERROR_INVALID_VALUE);
  // Only handle types asked for at creation can be exported.
  CUmemAllocationProp private_prop = DeviceProp();
  private_prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_NONE;
  CUmemGenericAllocationHandle unexportable = 0;
  ASSERT_EQ(d_.create(&unexportable, kPage, &private_prop, 0), CUDA_SUCCESS);
  EXPECT_EQ(d_.export_handle(&fd, unexportable, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
            CUDA_ERROR_INVALID_VALUE);
  // A descriptor that is not device memory.
  CUmemGenericAllocationHandle bogus = 0;
  EXPECT_EQ(d_.import_handle(&bogus, reinterpret_cast<void*>(intptr_t{0}),
                             CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
            CUDA_ERROR_INVALID_VALUE);

  ASSERT_EQ(d_.unmap(range, 2 * kPage), CUDA_SUCCESS);
  ASSERT_EQ(d_.release(imported), CUDA_SUCCESS);
  ASSERT_EQ(d_.release(handle), CUDA_SUCCESS);
  ASSERT_EQ(d_.release(unexportable), CUDA_SUCCESS);
  ASSERT_EQ(d_.address_free(range, 8 * kMiB), CUDA_SUCCESS);
}

TEST_F(VmmTest, AddressRangeOfMappingsAndOfRuntimeAllocations) {
  const CUdeviceptr range = Reserve(8 * kMiB);
  const CUmemGenericAllocationHandle handle = Create(4 * kMiB);
  ASSERT_EQ(d_.map(range + kPage, 4 * kMiB, 0, handle, 0), CUDA_SUCCESS);
  CUdeviceptr base = 0;
  size_t size = 0;
  ASSERT_EQ(d_.address_range(&base, &size, range + 3 * kMiB), CUDA_SUCCESS);
  EXPECT_EQ(base, range + kPage);
  EXPECT_EQ(size, 4 * kMiB);
  EXPECT_EQ(d_.address_range(&base, &size, range), CUDA_ERROR_NOT_FOUND);

  void* p = nullptr;
  ASSERT_EQ(cudaMalloc(&p, 1000), cudaSuccess);
  ASSERT_EQ(d_.address_range(&base, nullptr, reinterpret_cast<CUdeviceptr>(p) + 10), CUDA_SUCCESS);
  EXPECT_EQ(base, reinterpret_cast<CUdeviceptr>(p));
  ASSERT_EQ(cudaFree(p), cudaSuccess);

  ASSERT_EQ(d_.unmap(range + kPage, 4 * kMiB), CUDA_SUCCESS);
  ASSERT_EQ(d_.release(handle), CUDA_SUCCESS);
  ASSERT_EQ(d_.address_free(range, 8 * kMiB), CUDA_SUCCESS);
}

TEST_F(VmmTest, PhysicalMemoryIsChargedToItsOwnDevice) {
  ASSERT_EQ(simcuda_set_device_count(2), 0);
  const CUdeviceptr range = Reserve(8 * kMiB);
  const CUmemGenericAllocationHandle handle = Create(4 * kMiB, 1);
  EXPECT_EQ(simcuda_live_bytes(1), 4 * kMiB);
  EXPECT_EQ(simcuda_live_bytes(0), 0u);
  ASSERT_EQ(d_.map(range, 4 * kMiB, 0, handle, 0), CUDA_SUCCESS);
  // Device 0 (a peer) gets access to device 1's memory.
  const CUmemAccessDesc both[] = {Access(0, CU_MEM_ACCESS_FLAGS_PROT_READWRITE),
                                  Access(1, CU_MEM_ACCESS_FLAGS_PROT_READWRITE)};
  ASSERT_EQ(d_.set_access(range, 4 * kMiB, both, 2), CUDA_SUCCESS);
  cudaPointerAttributes attributes;
  ASSERT_EQ(cudaPointerGetAttributes(&attributes, reinterpret_cast<void*>(range)), cudaSuccess);
  EXPECT_EQ(attributes.device, 1);
  ASSERT_EQ(d_.unmap(range, 4 * kMiB), CUDA_SUCCESS);
  ASSERT_EQ(d_.release(handle), CUDA_SUCCESS);
  EXPECT_EQ(simcuda_live_bytes(1), 0u);
  ASSERT_EQ(d_.address_free(range, 8 * kMiB), CUDA_SUCCESS);
}

TEST_F(VmmTest, EveryCallIsCountedAndCanBeFailed) {
  const CUmemAllocationProp prop = DeviceProp();
  CUmemGenericAllocationHandle handle = 0;
  CUdeviceptr range = 0;

  ASSERT_EQ(simcuda_fail_next("cuMemAddressReserve", 1, CUDA_ERROR_OUT_OF_MEMORY), 0);
  EXPECT_EQ(d_.reserve(&range, 8 * kMiB, 0, 0, 0), CUDA_ERROR_OUT_OF_MEMORY);
  EXPECT_EQ(Stats().reservations, before_.reservations);
  range = Reserve(8 * kMiB);

  ASSERT_EQ(simcuda_fail_next("cuMemCreate", 1, CUDA_ERROR_OUT_OF_MEMORY), 0);
  EXPECT_EQ(d_.create(&handle, kPage, &prop, 0), CUDA_ERROR_OUT_OF_MEMORY);
  EXPECT_EQ(simcuda_live_bytes(0), 0u);
  handle = Create(kPage);

  ASSERT_EQ(simcuda_fail_next("cuMemMap", 1, CUDA_ERROR_OUT_OF_MEMORY), 0);
  EXPECT_EQ(d_.map(range, kPage, 0, handle, 0), CUDA_ERROR_OUT_OF_MEMORY);
  EXPECT_EQ(Stats().mappings, before_.mappings);
  ASSERT_EQ(d_.map(range, kPage, 0, handle, 0), CUDA_SUCCESS);

  const CUmemAccessDesc desc = Access(0, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
  ASSERT_EQ(simcuda_fail_next("cuMemSetAccess", 1, CUDA_ERROR_INVALID_DEVICE), 0);
  EXPECT_EQ(d_.set_access(range, kPage, &desc, 1), CUDA_ERROR_INVALID_DEVICE);
  EXPECT_EQ(Stats().accessible_bytes, before_.accessible_bytes);
  ASSERT_EQ(d_.set_access(range, kPage, &desc, 1), CUDA_SUCCESS);

  ASSERT_EQ(simcuda_fail_next("cuMemUnmap", 1, CUDA_ERROR_NOT_PERMITTED), 0);
  EXPECT_EQ(d_.unmap(range, kPage), CUDA_ERROR_NOT_PERMITTED);
  EXPECT_EQ(Stats().mappings, before_.mappings + 1);
  ASSERT_EQ(d_.unmap(range, kPage), CUDA_SUCCESS);

  ASSERT_EQ(simcuda_fail_next("cuMemRelease", 1, CUDA_ERROR_NOT_PERMITTED), 0);
  EXPECT_EQ(d_.release(handle), CUDA_ERROR_NOT_PERMITTED);
  EXPECT_EQ(simcuda_live_bytes(0), kPage);
  ASSERT_EQ(d_.release(handle), CUDA_SUCCESS);

  ASSERT_EQ(simcuda_fail_next("cuMemAddressFree", 1, CUDA_ERROR_NOT_PERMITTED), 0);
  EXPECT_EQ(d_.address_free(range, 8 * kMiB), CUDA_ERROR_NOT_PERMITTED);
  ASSERT_EQ(d_.address_free(range, 8 * kMiB), CUDA_SUCCESS);

  size_t granularity = 0;
  ASSERT_EQ(simcuda_fail_next("cuMemGetAllocationGranularity", 1, CUDA_ERROR_NOT_SUPPORTED), 0);
  EXPECT_EQ(d_.granularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
            CUDA_ERROR_NOT_SUPPORTED);

  EXPECT_EQ(simcuda_call_count("cuMemAddressReserve"), 2u);
  EXPECT_EQ(simcuda_call_count("cuMemCreate"), 2u);
  EXPECT_EQ(simcuda_call_count("cuMemMap"), 2u);
  EXPECT_EQ(simcuda_call_count("cuMemSetAccess"), 2u);
  EXPECT_EQ(simcuda_call_count("cuMemUnmap"), 2u);
  EXPECT_EQ(simcuda_call_count("cuMemRelease"), 2u);
  EXPECT_EQ(simcuda_call_count("cuMemAddressFree"), 2u);
  EXPECT_EQ(simcuda_call_count("cuMemGetAllocationGranularity"), 1u);
}

// The fake NVML that PyTorch's expandable segments need (not preloaded here:
// opened by path).
TEST(FakeNvmlTest, AnswersWhatTorchAsks) {
  void* nvml = dlopen(SIMCUDA_FAKE_NVML, RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(nvml, nullptr) << dlerror();
  auto init = reinterpret_cast<int (*)()>(dlsym(nvml, "nvmlInit_v2"));
  auto count = reinterpret_cast<int (*)(unsigned int*)>(dlsym(nvml, "nvmlDeviceGetCount_v2"));
  auto by_bus = reinterpret_cast<int (*)(const char*, void**)>(
      dlsym(nvml, "nvmlDeviceGetHandleByPciBusId_v2"));
  auto processes = reinterpret_cast<int (*)(void*, unsigned int*, void*)>(
      dlsym(nvml, "nvmlDeviceGetComputeRunningProcesses"));
  auto driver_version =
      reinterpret_cast<int (*)(int*)>(dlsym(nvml, "nvmlSystemGetCudaDriverVersion_v2"));
  for (const char* required : {"nvmlDeviceGetNvLinkRemoteDeviceType",
                               "nvmlDeviceGetNvLinkRemotePciInfo_v2", "nvmlInit", "nvmlShutdown"}) {
    EXPECT_NE(dlsym(nvml, required), nullptr) << required;
  }
  // Absent on purpose: torch then reports no fabric.
  EXPECT_EQ(dlsym(nvml, "nvmlDeviceGetGpuFabricInfoV"), nullptr);
  ASSERT_TRUE(init && count && by_bus && processes && driver_version);
  EXPECT_EQ(init(), 0);
  unsigned int n = 0;
  ASSERT_EQ(count(&n), 0);
  EXPECT_EQ(n, static_cast<unsigned int>(simcuda_get_device_count()));
  cudaDeviceProp prop;
  ASSERT_EQ(cudaGetDeviceProperties(&prop, 0), cudaSuccess);
  char bus_id[32];
  std::snprintf(bus_id, sizeof(bus_id), "%08X:%02X:%02X.0", prop.pciDomainID, prop.pciBusID,
                prop.pciDeviceID);
  void* device = nullptr;
  ASSERT_EQ(by_bus(bus_id, &device), 0);
  EXPECT_NE(device, nullptr);
  EXPECT_EQ(by_bus("00000000:7F:00.0", &device), 6);  // NVML_ERROR_NOT_FOUND
  unsigned int running = 5;
  ASSERT_EQ(processes(device, &running, nullptr), 0);
  EXPECT_EQ(running, 0u);
  int version = 0;
  ASSERT_EQ(driver_version(&version), 0);
  EXPECT_EQ(version, 13000);
  // Not closed: its call counters live until the process exits, by design.
}

TEST_F(VmmTest, CopiesNeedTheExecutingDevicesAccessToMappedPages) {
  // A page of device 0 that only device 0 may access, as a GPU maps it:
  // device 1 (a peer) faults on it until cuMemSetAccess names device 1 too.
  ASSERT_EQ(simcuda_set_device_count(2), cudaSuccess);
  const CUdeviceptr base = Reserve(kPage);
  const CUmemGenericAllocationHandle handle = Create(kPage, 0);
  ASSERT_EQ(d_.map(base, kPage, 0, handle, 0), CUDA_SUCCESS);
  GrantReadWrite(base, kPage);
  void* page = reinterpret_cast<void*>(base);
  void* other = nullptr;
  ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&other, 4096), cudaSuccess);
  cudaStream_t stream1 = nullptr;
  ASSERT_EQ(cudaStreamCreate(&stream1), cudaSuccess);

  // Executed by device 1 (its stream): refused both ways.
  EXPECT_EQ(cudaMemcpyAsync(other, page, 4096, cudaMemcpyDeviceToDevice, stream1),
            cudaErrorInvalidValue);
  EXPECT_EQ(cudaMemcpyAsync(page, other, 4096, cudaMemcpyDeviceToDevice, stream1),
            cudaErrorInvalidValue);
  EXPECT_EQ(cudaMemcpy(other, page, 4096, cudaMemcpyDeviceToDevice), cudaErrorInvalidValue);
  (void)cudaGetLastError();
  // A peer copy touches each side from its own device: allowed.
  EXPECT_EQ(cudaMemcpyPeerAsync(other, 1, page, 0, 4096, stream1), cudaSuccess);
  // Executed by device 0 (its default stream): allowed.
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  EXPECT_EQ(cudaMemcpyAsync(other, page, 4096, cudaMemcpyDeviceToDevice, nullptr), cudaSuccess);

  // Access for the peer: device 1's copies work.
  const CUmemAccessDesc both[2] = {Access(0, CU_MEM_ACCESS_FLAGS_PROT_READWRITE),
                                   Access(1, CU_MEM_ACCESS_FLAGS_PROT_READWRITE)};
  ASSERT_EQ(d_.set_access(base, kPage, both, 2), CUDA_SUCCESS);
  EXPECT_EQ(cudaMemcpyAsync(page, other, 4096, cudaMemcpyDeviceToDevice, stream1), cudaSuccess);

  ASSERT_EQ(cudaStreamDestroy(stream1), cudaSuccess);
  ASSERT_EQ(cudaFree(other), cudaSuccess);
  ASSERT_EQ(d_.unmap(base, kPage), CUDA_SUCCESS);
  ASSERT_EQ(d_.release(handle), CUDA_SUCCESS);
  ASSERT_EQ(d_.address_free(base, kPage), CUDA_SUCCESS);
}

}  // namespace
}  // namespace simcuda_test
