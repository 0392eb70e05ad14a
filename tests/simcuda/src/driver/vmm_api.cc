// The driver's virtual memory calls (cuMemAddressReserve, cuMemCreate,
// cuMemMap, cuMemSetAccess, ...): argument checks as cuda.h documents them,
// then VirtualMemory (virtual_memory.h) for everything stateful. Every call
// is counted and can be failed with simcuda's fault injection.
#include <unistd.h>

#include <cstdint>

#include "driver/driver_entry.h"
#include "driver/virtual_memory.h"

using simcuda::drv::kVmmGranularity;
using simcuda::drv::ValidDevice;
using simcuda::drv::VirtualMemory;

namespace {

bool Aligned(uint64_t value) { return value % kVmmGranularity == 0; }

size_t HostPage() {
  static const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return page;
}

// The properties cuMemCreate and cuMemGetAllocationGranularity accept:
// pinned device memory, exportable as a POSIX file descriptor at most.
CUresult CheckProperties(const CUmemAllocationProp* prop) {
  if (prop == nullptr) return CUDA_ERROR_INVALID_VALUE;
#if CUDA_VERSION >= 13000  // managed VMM allocations are new in CUDA 13
  if (prop->type == CU_MEM_ALLOCATION_TYPE_MANAGED) return CUDA_ERROR_NOT_SUPPORTED;
#endif
  if (prop->type != CU_MEM_ALLOCATION_TYPE_PINNED) return CUDA_ERROR_INVALID_VALUE;
  switch (prop->location.type) {
    case CU_MEM_LOCATION_TYPE_DEVICE:
      if (!ValidDevice(prop->location.id)) return CUDA_ERROR_INVALID_DEVICE;
      break;
    case CU_MEM_LOCATION_TYPE_HOST:
    case CU_MEM_LOCATION_TYPE_HOST_NUMA:
      return CUDA_ERROR_NOT_SUPPORTED;  // host VMM memory is not simulated
    default:
      return CUDA_ERROR_INVALID_VALUE;
  }
  if (prop->win32HandleMetaData != nullptr) return CUDA_ERROR_INVALID_VALUE;
  const unsigned int types = static_cast<unsigned int>(prop->requestedHandleTypes);
  if ((types & ~static_cast<unsigned int>(CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)) != 0) {
    // Fabric (no NVLink fabric here) and Windows handles: what a device
    // without them answers, which is how PyTorch probes for fabric handles.
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  return CUDA_SUCCESS;
}

CUresult CheckLocation(const CUmemLocation& location) {
  if (location.type != CU_MEM_LOCATION_TYPE_DEVICE) return CUDA_ERROR_INVALID_VALUE;
  return ValidDevice(location.id) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE;
}

}  // namespace

extern "C" {

CUresult cuMemGetAllocationGranularity(size_t* granularity, const CUmemAllocationProp* prop,
                                       CUmemAllocationGranularity_flags option) {
  SIMCUDA_DRIVER_ENTER();
  if (granularity == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (option != CU_MEM_ALLOC_GRANULARITY_MINIMUM &&
      option != CU_MEM_ALLOC_GRANULARITY_RECOMMENDED) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (CUresult checked = CheckProperties(prop); checked != CUDA_SUCCESS) return checked;
  *granularity = kVmmGranularity;
  return CUDA_SUCCESS;
}

CUresult cuMemAddressReserve(CUdeviceptr* ptr, size_t size, size_t alignment, CUdeviceptr addr,
                             unsigned long long flags) {
  SIMCUDA_DRIVER_ENTER();
  if (ptr == nullptr || flags != 0 || size == 0 || size % HostPage() != 0 ||
      addr % HostPage() != 0 || (alignment & (alignment - 1)) != 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  uintptr_t base = 0;
  const CUresult reserved = VirtualMemory::Get().Reserve(size, alignment, addr, &base);
  if (reserved == CUDA_SUCCESS) *ptr = base;
  return reserved;
}

CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size) {
  SIMCUDA_DRIVER_ENTER();
  if (ptr == 0 || size == 0) return CUDA_ERROR_INVALID_VALUE;
  return VirtualMemory::Get().FreeReservation(ptr, size);
}

CUresult cuMemCreate(CUmemGenericAllocationHandle* handle, size_t size,
                     const CUmemAllocationProp* prop, unsigned long long flags) {
  SIMCUDA_DRIVER_ENTER();
  if (handle == nullptr || flags != 0 || size == 0 || !Aligned(size)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (CUresult checked = CheckProperties(prop); checked != CUDA_SUCCESS) return checked;
  return VirtualMemory::Get().Create(size, *prop, handle);
}

CUresult cuMemRelease(CUmemGenericAllocationHandle handle) {
  SIMCUDA_DRIVER_ENTER();
  return VirtualMemory::Get().Release(handle);
}

CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                  unsigned long long flags) {
  SIMCUDA_DRIVER_ENTER();
  if (ptr == 0 || size == 0 || flags != 0 || !Aligned(ptr) || !Aligned(size) || !Aligned(offset)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  return VirtualMemory::Get().Map(ptr, size, offset, handle);
}

CUresult cuMemUnmap(CUdeviceptr ptr, size_t size) {
  SIMCUDA_DRIVER_ENTER();
  if (ptr == 0 || size == 0 || !Aligned(ptr) || !Aligned(size)) return CUDA_ERROR_INVALID_VALUE;
  return VirtualMemory::Get().Unmap(ptr, size);
}

CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc* desc, size_t count) {
  SIMCUDA_DRIVER_ENTER();
  if (ptr == 0 || size == 0 || desc == nullptr || count == 0 || !Aligned(ptr) || !Aligned(size)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  for (size_t i = 0; i < count; ++i) {
    if (CUresult checked = CheckLocation(desc[i].location); checked != CUDA_SUCCESS) return checked;
    switch (desc[i].flags) {
      case CU_MEM_ACCESS_FLAGS_PROT_NONE:
      case CU_MEM_ACCESS_FLAGS_PROT_READ:
      case CU_MEM_ACCESS_FLAGS_PROT_READWRITE:
        break;
      default:
        return CUDA_ERROR_INVALID_VALUE;
    }
  }
  return VirtualMemory::Get().SetAccess(ptr, size, desc, count);
}

CUresult cuMemGetAccess(unsigned long long* flags, const CUmemLocation* location, CUdeviceptr ptr) {
  SIMCUDA_DRIVER_ENTER();
  if (flags == nullptr || location == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult checked = CheckLocation(*location); checked != CUDA_SUCCESS) return checked;
  return VirtualMemory::Get().GetAccess(location->id, ptr, flags);
}

CUresult cuMemExportToShareableHandle(void* shareable_handle, CUmemGenericAllocationHandle handle,
                                      CUmemAllocationHandleType handle_type,
                                      unsigned long long flags) {
  SIMCUDA_DRIVER_ENTER();
  if (shareable_handle == nullptr || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  if (handle_type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) return CUDA_ERROR_INVALID_VALUE;
  return VirtualMemory::Get().Export(handle, static_cast<int*>(shareable_handle));
}

CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle* handle, void* os_handle,
                                        CUmemAllocationHandleType handle_type) {
  SIMCUDA_DRIVER_ENTER();
  if (handle == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (handle_type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) return CUDA_ERROR_NOT_SUPPORTED;
  // A POSIX file descriptor travels as the pointer's value.
  const intptr_t fd = reinterpret_cast<intptr_t>(os_handle);
  if (fd < 0 || fd > INT32_MAX) return CUDA_ERROR_INVALID_VALUE;
  return VirtualMemory::Get().Import(static_cast<int>(fd), handle);
}

CUresult cuMemGetAllocationPropertiesFromHandle(CUmemAllocationProp* prop,
                                                CUmemGenericAllocationHandle handle) {
  SIMCUDA_DRIVER_ENTER();
  if (prop == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return VirtualMemory::Get().Properties(handle, prop);
}

CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle* handle, void* addr) {
  SIMCUDA_DRIVER_ENTER();
  if (handle == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return VirtualMemory::Get().Retain(reinterpret_cast<uintptr_t>(addr), handle);
}

// Mapped memory: the mapping holding `dptr`; memory of the fake runtime
// (cudaMalloc, ...): its allocation. Either output may be null.
CUresult cuMemGetAddressRange_v2(CUdeviceptr* base, size_t* size, CUdeviceptr dptr) {
  SIMCUDA_DRIVER_ENTER();
  uintptr_t found_base = 0;
  size_t found_size = 0;
  bool found = VirtualMemory::Get().MappingRange(dptr, &found_base, &found_size);
  if (!found) {
    using Range = int (*)(uintptr_t, uintptr_t*, size_t*);
    auto range = simcuda::drv::Runtime<Range>("simcuda_vmm_allocation_range");
    found = range != nullptr && range(dptr, &found_base, &found_size) != 0;
  }
  if (!found) return CUDA_ERROR_NOT_FOUND;
  if (base != nullptr) *base = found_base;
  if (size != nullptr) *size = found_size;
  return CUDA_SUCCESS;
}

}  // extern "C"
