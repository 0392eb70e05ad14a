#include "torchmem/backends/cuda_driver.h"

#include <cuda_runtime_api.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace torchmem {
namespace {

// The driver ABI the function types above follow.
constexpr unsigned int kDriverAbiVersion = 12000;

template <typename Fn>
absl::Status Resolve(Fn& function, const char* name) {
  void* address = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  const cudaError_t error = cudaGetDriverEntryPointByVersion(name, &address, kDriverAbiVersion,
                                                             cudaEnableDefault, &found);
  if (error != cudaSuccess) {
    (void)cudaGetLastError();  // not PyTorch's error to see
    return absl::FailedPreconditionError(
        absl::StrFormat("cudaGetDriverEntryPointByVersion(%s) failed: %s (%s)", name,
                        cudaGetErrorName(error), cudaGetErrorString(error)));
  }
  if (found != cudaDriverEntryPointSuccess || address == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("the CUDA driver has no ", name, " (a driver for CUDA 12 or newer has it)"));
  }
  function = reinterpret_cast<Fn>(address);
  return absl::OkStatus();
}

absl::StatusOr<CudaDriver> Load() {
  CudaDriver driver;
  for (absl::Status status : {
           Resolve(driver.cuGetErrorName, "cuGetErrorName"),
           Resolve(driver.cuGetErrorString, "cuGetErrorString"),
           Resolve(driver.cuDeviceGet, "cuDeviceGet"),
           Resolve(driver.cuDeviceGetAttribute, "cuDeviceGetAttribute"),
           Resolve(driver.cuMemGetAllocationGranularity, "cuMemGetAllocationGranularity"),
           Resolve(driver.cuMemAddressReserve, "cuMemAddressReserve"),
           Resolve(driver.cuMemAddressFree, "cuMemAddressFree"),
           Resolve(driver.cuMemCreate, "cuMemCreate"),
           Resolve(driver.cuMemRelease, "cuMemRelease"),
           Resolve(driver.cuMemMap, "cuMemMap"),
           Resolve(driver.cuMemUnmap, "cuMemUnmap"),
           Resolve(driver.cuMemSetAccess, "cuMemSetAccess"),
           Resolve(driver.cuMemExportToShareableHandle, "cuMemExportToShareableHandle"),
           Resolve(driver.cuMemImportFromShareableHandle, "cuMemImportFromShareableHandle"),
       }) {
    if (!status.ok()) return status;
  }
  return driver;
}

}  // namespace

std::string CudaDriver::Describe(CUresult result) const {
  const char* name = nullptr;
  const char* text = nullptr;
  if (cuGetErrorName == nullptr || cuGetErrorName(result, &name) != CUDA_SUCCESS) name = nullptr;
  if (cuGetErrorString == nullptr || cuGetErrorString(result, &text) != CUDA_SUCCESS) {
    text = nullptr;
  }
  return absl::StrFormat("%s (%s)", name != nullptr ? name : absl::StrCat("CUresult ", result),
                         text != nullptr ? text : "no description");
}

absl::StatusOr<const CudaDriver*> GetCudaDriver() {
  // Resolved once: the driver does not change while the process runs.
  static const absl::StatusOr<CudaDriver>* driver = new absl::StatusOr<CudaDriver>(Load());
  if (!driver->ok()) return driver->status();
  return &**driver;
}

}  // namespace torchmem
