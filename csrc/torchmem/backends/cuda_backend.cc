#include "torchmem/backends/cuda_backend.h"

#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "torchmem/backends/cuda_address_registry.h"
#include "torchmem/backends/cuda_streams.h"
#include "torchmem/core/format.h"

namespace torchmem {
namespace {

// Makes `device` current for the scope of the guard, restoring the
// previous one after, as PyTorch's CUDAGuard does.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) : device_(device) {
    if (cudaGetDevice(&previous_) != cudaSuccess) {
      (void)cudaGetLastError();
      previous_ = -1;
    }
    if (previous_ != device) status_ = cudaSetDevice(device);
  }
  // Switching back must not leave the caller on our device, nor a sticky
  // error that PyTorch's next check would report as its own: retry once,
  // then clear the error.
  ~DeviceGuard() {
    if (previous_ < 0 || previous_ == device_ || status_ != cudaSuccess) return;
    if (cudaSetDevice(previous_) != cudaSuccess) {
      (void)cudaGetLastError();
      if (cudaSetDevice(previous_) != cudaSuccess) (void)cudaGetLastError();
    }
  }
  cudaError_t status() const { return status_; }

 private:
  const int device_;
  int previous_ = -1;
  cudaError_t status_ = cudaSuccess;
};

cudaStream_t AsStream(StreamId stream) { return reinterpret_cast<cudaStream_t>(stream); }
cudaEvent_t AsEvent(EventId event) { return reinterpret_cast<cudaEvent_t>(event); }

}  // namespace

CudaBackend::CudaBackend(int device) : device_(device) {}

CudaBackend::~CudaBackend() {
  DeviceGuard guard(device_);
  for (cudaEvent_t event : spare_events_) (void)cudaEventDestroy(event);
}

std::string CudaBackend::DeviceName() const { return absl::StrCat("cuda:", device_); }

absl::Status CudaBackend::CudaError(cudaError_t error, const std::string& call) const {
  // Clear the sticky "last error" so that PyTorch's own error checks after
  // our call do not report our (handled) failure as theirs.
  (void)cudaGetLastError();
  const std::string message = absl::StrFormat("%s on %s failed: %s (%s)", call, DeviceName(),
                                              cudaGetErrorName(error), cudaGetErrorString(error));
  if (error == cudaErrorMemoryAllocation) return absl::ResourceExhaustedError(message);
  return absl::InternalError(message);
}

// Relaxes the calling thread's capture mode for its lifetime, so that
// cudaMalloc during a capture neither fails nor invalidates the capture.
class RelaxedCaptureMode {
 public:
  RelaxedCaptureMode() : status_(cudaThreadExchangeStreamCaptureMode(&mode_)) {}
  ~RelaxedCaptureMode() {
    if (status_ == cudaSuccess) (void)cudaThreadExchangeStreamCaptureMode(&mode_);
  }
  cudaError_t status() const { return status_; }

 private:
  cudaStreamCaptureMode mode_ = cudaStreamCaptureModeRelaxed;
  cudaError_t status_;
};

absl::StatusOr<std::uintptr_t> CudaBackend::AllocateSegment(std::size_t size, StreamId stream) {
  DeviceGuard guard(device_);
  if (guard.status() != cudaSuccess) return CudaError(guard.status(), "cudaSetDevice");
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (const cudaError_t error = cudaStreamIsCapturing(AsStream(stream), &capture);
      error != cudaSuccess) {
    return CudaError(error, "cudaStreamIsCapturing");
  }
  void* ptr = nullptr;
  cudaError_t error = cudaSuccess;
  if (capture == cudaStreamCaptureStatusNone) {
    error = cudaMalloc(&ptr, size);
  } else {
    RelaxedCaptureMode relaxed;
    if (relaxed.status() != cudaSuccess) {
      return CudaError(relaxed.status(), "cudaThreadExchangeStreamCaptureMode");
    }
    error = cudaMalloc(&ptr, size);
  }
  if (error != cudaSuccess) {
    return CudaError(
        error, absl::StrCat("cudaMalloc(", FormatBytes(static_cast<std::int64_t>(size)), ")"));
  }
  RegisterCudaAddressRange(reinterpret_cast<std::uintptr_t>(ptr), size, device_);
  return reinterpret_cast<std::uintptr_t>(ptr);
}

absl::Status CudaBackend::ReleaseSegment(std::uintptr_t address, std::size_t size) {
  DeviceGuard guard(device_);
  if (guard.status() != cudaSuccess) return CudaError(guard.status(), "cudaSetDevice");
  const cudaError_t error = cudaFree(reinterpret_cast<void*>(address));
  if (error == cudaSuccess) UnregisterCudaAddressRange(address);
  if (error != cudaSuccess) {
    return CudaError(error, absl::StrFormat("cudaFree(%#x, %s)", address,
                                            FormatBytes(static_cast<std::int64_t>(size))));
  }
  return absl::OkStatus();
}

absl::StatusOr<CudaBackend::MemInfo> CudaBackend::GetMemInfo() {
  DeviceGuard guard(device_);
  if (guard.status() != cudaSuccess) return CudaError(guard.status(), "cudaSetDevice");
  std::size_t free_bytes = 0;
  std::size_t total_bytes = 0;
  const cudaError_t error = cudaMemGetInfo(&free_bytes, &total_bytes);
  if (error != cudaSuccess) return CudaError(error, "cudaMemGetInfo");
  return MemInfo{free_bytes, total_bytes};
}

absl::StatusOr<std::size_t> CudaBackend::Capacity() {
  // Properties, not cudaMemGetInfo: no device switch, no context.
  cudaDeviceProp prop;
  const cudaError_t error = cudaGetDeviceProperties(&prop, device_);
  if (error != cudaSuccess) return CudaError(error, "cudaGetDeviceProperties");
  return prop.totalGlobalMem;
}

absl::StatusOr<std::size_t> CudaBackend::FreeBytes() {
  absl::StatusOr<MemInfo> info = GetMemInfo();
  if (!info.ok()) return info.status();
  return info->free_bytes;
}

absl::StatusOr<EventId> CudaBackend::RecordEvent(StreamId stream) {
  if (const ForeignStream* foreign = AsForeignStream(stream)) {
    // A stream of another device: the event must live on that device.
    DeviceGuard guard(foreign->device);
    if (guard.status() != cudaSuccess) return CudaError(guard.status(), "cudaSetDevice");
    cudaEvent_t event = nullptr;
    if (const cudaError_t error = cudaEventCreateWithFlags(&event, cudaEventDisableTiming);
        error != cudaSuccess) {
      return CudaError(error, "cudaEventCreateWithFlags");
    }
    if (const cudaError_t error = cudaEventRecord(event, foreign->stream); error != cudaSuccess) {
      (void)cudaEventDestroy(event);
      return CudaError(error,
                       absl::StrFormat("cudaEventRecord(stream %p of cuda:%d)",
                                       static_cast<void*>(foreign->stream), foreign->device));
    }
    foreign_events_.insert(event);
    return reinterpret_cast<EventId>(event);
  }
  DeviceGuard guard(device_);
  if (guard.status() != cudaSuccess) return CudaError(guard.status(), "cudaSetDevice");
  cudaEvent_t event = nullptr;
  if (!spare_events_.empty()) {
    event = spare_events_.back();
    spare_events_.pop_back();
  } else {
    const cudaError_t error = cudaEventCreateWithFlags(&event, cudaEventDisableTiming);
    if (error != cudaSuccess) return CudaError(error, "cudaEventCreateWithFlags");
  }
  const cudaError_t error = cudaEventRecord(event, AsStream(stream));
  if (error != cudaSuccess) {
    spare_events_.push_back(event);
    return CudaError(error, absl::StrFormat("cudaEventRecord(stream %#x)", stream));
  }
  return reinterpret_cast<EventId>(event);
}

absl::StatusOr<bool> CudaBackend::QueryEvent(EventId event) {
  const cudaError_t error = cudaEventQuery(AsEvent(event));
  if (error == cudaSuccess) return true;
  if (error == cudaErrorNotReady) {
    (void)cudaGetLastError();
    return false;
  }
  return CudaError(error, "cudaEventQuery");
}

absl::Status CudaBackend::SynchronizeEvent(EventId event) {
  const cudaError_t error = cudaEventSynchronize(AsEvent(event));
  if (error != cudaSuccess) return CudaError(error, "cudaEventSynchronize");
  return absl::OkStatus();
}

void CudaBackend::ReleaseEvent(EventId event) {
  if (foreign_events_.erase(AsEvent(event)) != 0) {
    (void)cudaEventDestroy(AsEvent(event));
    (void)cudaGetLastError();
    return;
  }
  spare_events_.push_back(AsEvent(event));
}

void CudaBackend::AddPeer(int peer) {
  if (peer < 0 || peer >= 64 || peer == device_) return;
  peers_.fetch_or(std::uint64_t{1} << peer, std::memory_order_acq_rel);
}

// --- virtual memory (the driver's cuMem* calls) ------------------------------

namespace {

CUmemAllocationProp PagePropertiesOf(int device, bool rdma_capable) {
  CUmemAllocationProp prop = {};
  // As PyTorch's expandable segments: RDMA-capable pages where the device
  // supports GPUDirect RDMA with virtual memory, so that NICs (NCCL over
  // InfiniBand, GPUDirect RDMA) can register them.
  prop.allocFlags.gpuDirectRDMACapable = rdma_capable ? 1 : 0;
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  // Exportable as a POSIX file descriptor, as PyTorch creates its
  // expandable segments' handles: CUDA IPC of a tensor in these pages
  // exports them (ShareablePage).
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  return prop;
}

CUdeviceptr AsDevicePtr(std::uintptr_t address) { return static_cast<CUdeviceptr>(address); }

}  // namespace

absl::Status CudaBackend::DriverError(CUresult result, const std::string& call) const {
  const std::string message =
      absl::StrFormat("%s on %s failed: %s", call, DeviceName(),
                      driver_ != nullptr ? driver_->Describe(result) : absl::StrCat(result));
  if (result == CUDA_ERROR_OUT_OF_MEMORY) return absl::ResourceExhaustedError(message);
  return absl::InternalError(message);
}

absl::StatusOr<const CudaDriver*> CudaBackend::VmmDriver() {
  if (page_size_ != 0) return driver_;
  absl::StatusOr<const CudaDriver*> driver = GetCudaDriver();
  if (!driver.ok()) return driver.status();
  driver_ = *driver;
  // Device queries only: no device switch, so no context is created.
  CUdevice handle = 0;
  if (CUresult r = driver_->cuDeviceGet(&handle, device_); r != CUDA_SUCCESS) {
    return DriverError(r, "cuDeviceGet");
  }
  int supported = 0;
  if (CUresult r = driver_->cuDeviceGetAttribute(
          &supported, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, handle);
      r != CUDA_SUCCESS) {
    return DriverError(r, "cuDeviceGetAttribute(VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED)");
  }
  if (supported == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(DeviceName(), " does not support the driver's virtual memory management"));
  }
  int rdma = 0;
  if (CUresult r = driver_->cuDeviceGetAttribute(
          &rdma, CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED, handle);
      r != CUDA_SUCCESS) {
    return DriverError(r, "cuDeviceGetAttribute(GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED)");
  }
  rdma_capable_pages_ = rdma != 0;
  const CUmemAllocationProp prop = PagePropertiesOf(device_, rdma_capable_pages_);
  std::size_t granularity = 0;
  if (CUresult r = driver_->cuMemGetAllocationGranularity(&granularity, &prop,
                                                          CU_MEM_ALLOC_GRANULARITY_MINIMUM);
      r != CUDA_SUCCESS) {
    return DriverError(r, "cuMemGetAllocationGranularity");
  }
  if (granularity == 0) {
    return absl::InternalError(
        absl::StrCat("cuMemGetAllocationGranularity on ", DeviceName(), " returned 0"));
  }
  page_size_ = granularity;
  return driver_;
}

absl::StatusOr<std::size_t> CudaBackend::VirtualMemoryPageSize() {
  absl::StatusOr<const CudaDriver*> driver = VmmDriver();
  if (!driver.ok()) return driver.status();
  return page_size_;
}

absl::StatusOr<std::uintptr_t> CudaBackend::ReserveAddressRange(std::size_t size) {
  absl::StatusOr<const CudaDriver*> driver = VmmDriver();
  if (!driver.ok()) return driver.status();
  DeviceGuard guard(device_);
  if (guard.status() != cudaSuccess) return CudaError(guard.status(), "cudaSetDevice");
  CUdeviceptr address = 0;
  if (CUresult r = (*driver)->cuMemAddressReserve(&address, size, page_size_, 0, 0);
      r != CUDA_SUCCESS) {
    return DriverError(
        r, absl::StrCat("cuMemAddressReserve(", FormatBytes(static_cast<std::int64_t>(size)), ")"));
  }
  RegisterCudaAddressRange(static_cast<std::uintptr_t>(address), size, device_);
  return static_cast<std::uintptr_t>(address);
}

absl::Status CudaBackend::ReleaseAddressRange(std::uintptr_t address, std::size_t size) {
  absl::StatusOr<const CudaDriver*> driver = VmmDriver();
  if (!driver.ok()) return driver.status();
  DeviceGuard guard(device_);
  if (guard.status() != cudaSuccess) return CudaError(guard.status(), "cudaSetDevice");
  if (CUresult r = (*driver)->cuMemAddressFree(AsDevicePtr(address), size); r != CUDA_SUCCESS) {
    return DriverError(r, absl::StrFormat("cuMemAddressFree(%#x, %s)", address,
                                          FormatBytes(static_cast<std::int64_t>(size))));
  }
  UnregisterCudaAddressRange(address);
  return absl::OkStatus();
}

absl::StatusOr<PhysicalPage> CudaBackend::CreatePhysicalPage(std::size_t size) {
  absl::StatusOr<const CudaDriver*> driver = VmmDriver();
  if (!driver.ok()) return driver.status();
  DeviceGuard guard(device_);
  if (guard.status() != cudaSuccess) return CudaError(guard.status(), "cudaSetDevice");
  const CUmemAllocationProp prop = PagePropertiesOf(device_, rdma_capable_pages_);
  CUmemGenericAllocationHandle handle = 0;
  if (CUresult r = (*driver)->cuMemCreate(&handle, size, &prop, 0); r != CUDA_SUCCESS) {
    return DriverError(
        r, absl::StrCat("cuMemCreate(", FormatBytes(static_cast<std::int64_t>(size)), ")"));
  }
  return static_cast<PhysicalPage>(handle);
}

absl::Status CudaBackend::ReleasePhysicalPage(PhysicalPage page) {
  absl::StatusOr<const CudaDriver*> driver = VmmDriver();
  if (!driver.ok()) return driver.status();
  DeviceGuard guard(device_);
  if (guard.status() != cudaSuccess) return CudaError(guard.status(), "cudaSetDevice");
  if (CUresult r = (*driver)->cuMemRelease(static_cast<CUmemGenericAllocationHandle>(page));
      r != CUDA_SUCCESS) {
    return DriverError(r, absl::StrFormat("cuMemRelease(handle %#x)", page));
  }
  std::lock_guard<std::mutex> lock(shared_mutex_);
  if (auto it = shared_pages_.find(page); it != shared_pages_.end()) {
    ::close(it->second);
    shared_pages_.erase(it);
  }
  return absl::OkStatus();
}

absl::StatusOr<int> CudaBackend::ShareablePage(PhysicalPage page) {
  absl::StatusOr<const CudaDriver*> driver = VmmDriver();
  if (!driver.ok()) return driver.status();
  std::lock_guard<std::mutex> lock(shared_mutex_);
  if (auto it = shared_pages_.find(page); it != shared_pages_.end()) return it->second;
  int fd = -1;
  if (CUresult r = (*driver)->cuMemExportToShareableHandle(
          &fd, static_cast<CUmemGenericAllocationHandle>(page),
          CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
      r != CUDA_SUCCESS) {
    return DriverError(r, absl::StrFormat("cuMemExportToShareableHandle(handle %#x)", page));
  }
  shared_pages_.emplace(page, fd);
  return fd;
}

absl::Status CudaBackend::MapPage(std::uintptr_t address, PhysicalPage page, std::size_t size) {
  absl::StatusOr<const CudaDriver*> driver = VmmDriver();
  if (!driver.ok()) return driver.status();
  DeviceGuard guard(device_);
  if (guard.status() != cudaSuccess) return CudaError(guard.status(), "cudaSetDevice");
  if (CUresult r = (*driver)->cuMemMap(AsDevicePtr(address), size, 0,
                                       static_cast<CUmemGenericAllocationHandle>(page), 0);
      r != CUDA_SUCCESS) {
    return DriverError(r, absl::StrFormat("cuMemMap(%#x, handle %#x)", address, page));
  }
  return absl::OkStatus();
}

absl::Status CudaBackend::SetAccess(std::uintptr_t address, std::size_t size) {
  absl::StatusOr<const CudaDriver*> driver = VmmDriver();
  if (!driver.ok()) return driver.status();
  DeviceGuard guard(device_);
  if (guard.status() != cudaSuccess) return CudaError(guard.status(), "cudaSetDevice");
  // This device and every peer (PyTorch's expandable segments do the same
  // for the devices enablePeerAccess named).
  CUmemAccessDesc access[64] = {};
  std::size_t count = 0;
  const std::uint64_t peers =
      peers_.load(std::memory_order_acquire) | (std::uint64_t{1} << device_);
  for (int device = 0; device < 64; ++device) {
    if ((peers & (std::uint64_t{1} << device)) == 0) continue;
    access[count].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    access[count].location.id = device;
    access[count].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    ++count;
  }
  if (CUresult r = (*driver)->cuMemSetAccess(AsDevicePtr(address), size, access, count);
      r != CUDA_SUCCESS) {
    return DriverError(r, absl::StrFormat("cuMemSetAccess(%#x, %s)", address,
                                          FormatBytes(static_cast<std::int64_t>(size))));
  }
  return absl::OkStatus();
}

absl::Status CudaBackend::UnmapPages(std::uintptr_t address, std::size_t size, StreamId stream) {
  absl::StatusOr<const CudaDriver*> driver = VmmDriver();
  if (!driver.ok()) return driver.status();
  DeviceGuard guard(device_);
  if (guard.status() != cudaSuccess) return CudaError(guard.status(), "cudaSetDevice");
  // Kernels queued on the stream that last used these pages may still read
  // or write them; the driver would unmap under their feet.
  if (const cudaError_t error = cudaStreamSynchronize(AsStream(stream)); error != cudaSuccess) {
    return CudaError(error, absl::StrFormat("cudaStreamSynchronize(stream %#x)", stream));
  }
  if (CUresult r = (*driver)->cuMemUnmap(AsDevicePtr(address), size); r != CUDA_SUCCESS) {
    return DriverError(r, absl::StrFormat("cuMemUnmap(%#x, %s)", address,
                                          FormatBytes(static_cast<std::int64_t>(size))));
  }
  return absl::OkStatus();
}

}  // namespace torchmem
