// CudaDriver: the CUDA driver calls the CUDA backend needs for virtual memory
// (cuMemAddressReserve, cuMemCreate, cuMemMap, cuMemSetAccess, cuMemUnmap,
// cuMemRelease, cuMemAddressFree, cuMemGetAllocationGranularity), looked up
// at run time through the runtime's cudaGetDriverEntryPointByVersion, as
// PyTorch does for its expandable segments.
//
// Why at run time: torchmem links only the shared CUDA runtime, so that the
// simulated device (tests/simcuda) can stand in for it, and linking
// libcuda.so.1 would tie the extension to a driver at load time (a machine
// without one could not even import it). The entry points are resolved once
// per process, by ABI version 12.0 (the VMM calls have had one ABI since
// CUDA 10.2), and the table is immutable afterwards, so reading it needs no
// lock.
#ifndef TORCHMEM_BACKENDS_CUDA_DRIVER_H_
#define TORCHMEM_BACKENDS_CUDA_DRIVER_H_

#include <cuda.h>

#include <string>

#include "absl/status/statusor.h"

namespace torchmem {

struct CudaDriver {
  CUresult (*cuGetErrorName)(CUresult, const char**) = nullptr;
  CUresult (*cuGetErrorString)(CUresult, const char**) = nullptr;
  CUresult (*cuDeviceGet)(CUdevice*, int) = nullptr;
  CUresult (*cuDeviceGetAttribute)(int*, CUdevice_attribute, CUdevice) = nullptr;
  CUresult (*cuMemGetAllocationGranularity)(size_t*, const CUmemAllocationProp*,
                                            CUmemAllocationGranularity_flags) = nullptr;
  CUresult (*cuMemAddressReserve)(CUdeviceptr*, size_t, size_t, CUdeviceptr,
                                  unsigned long long) = nullptr;
  CUresult (*cuMemAddressFree)(CUdeviceptr, size_t) = nullptr;
  CUresult (*cuMemCreate)(CUmemGenericAllocationHandle*, size_t, const CUmemAllocationProp*,
                          unsigned long long) = nullptr;
  CUresult (*cuMemRelease)(CUmemGenericAllocationHandle) = nullptr;
  CUresult (*cuMemMap)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle,
                       unsigned long long) = nullptr;
  CUresult (*cuMemUnmap)(CUdeviceptr, size_t) = nullptr;
  CUresult (*cuMemSetAccess)(CUdeviceptr, size_t, const CUmemAccessDesc*, size_t) = nullptr;
  // CUDA IPC of virtual memory (POSIX file descriptors, as PyTorch shares
  // expandable segments).
  CUresult (*cuMemExportToShareableHandle)(void*, CUmemGenericAllocationHandle,
                                           CUmemAllocationHandleType, unsigned long long) = nullptr;
  CUresult (*cuMemImportFromShareableHandle)(CUmemGenericAllocationHandle*, void*,
                                             CUmemAllocationHandleType) = nullptr;

  // "cuMemMap failed: CUDA_ERROR_X (description)" style text for `result`.
  std::string Describe(CUresult result) const;
};

// The process's driver table, or FailedPrecondition saying which entry point
// the driver (or the runtime in front of it) does not provide.
absl::StatusOr<const CudaDriver*> GetCudaDriver();

}  // namespace torchmem

#endif  // TORCHMEM_BACKENDS_CUDA_DRIVER_H_
