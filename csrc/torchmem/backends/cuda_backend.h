// CudaBackend: segments and events of one CUDA device, through the CUDA
// runtime.
//
//   - Segments: cudaMalloc/cudaFree on the backend's device (a device guard
//     switches to it and back). cudaErrorMemoryAllocation becomes
//     ResourceExhausted; the sticky error is cleared so PyTorch's next call
//     does not see it.
//   - Events: cudaEventDisableTiming events from a pool (creating events is
//     expensive and serialises), recorded on the stream that used a block.
//   - Capacity: the device's totalGlobalMem (cudaGetDeviceProperties, which
//     needs no context: sizing a device, for a memory fraction or a
//     virtual-memory range, must not create a context on it, as a ~0.5 GiB
//     context on every GPU of a node would cost each process). FreeBytes:
//     cudaMemGetInfo (on the device, creating its context).
//   - Streams of another device (cuda_streams.h) get an event created and
//     recorded on their own device; such events are destroyed when released,
//     not pooled.
//   - Every segment and address range is registered with its device
//     (cuda_address_registry.h) while the backend holds it.
//   - A segment needed while its stream is being captured into a CUDA graph
//     is obtained with the thread's capture mode relaxed for the cudaMalloc,
//     as PyTorch's allocator does (cudaMallocMaybeCapturing): a captured
//     cudaMalloc gives the graph new addresses and is not replayed. The
//     engine keeps such segments in the graph's private pool and never
//     releases them during a capture.
//   - Virtual memory (the engine's kVirtualMemory placement, PyTorch's
//     expandable_segments): the driver's cuMem* calls (cuda_driver.h) on
//     the backend's device. Pages are multiples of the device's minimum
//     allocation granularity (2 MiB on current GPUs) of the size the engine
//     asks (20 MiB in the large pool), pinned device memory with no
//     shareable handle (so VMM memory cannot be shared through CUDA IPC),
//     read-write for this device and for the peers added with AddPeer
//     (PyTorch's enablePeerAccess: a peer then reads and writes every page
//     mapped before and after). Unmapping first waits for the stream
//     that last used the pages (cudaStreamSynchronize), as PyTorch's
//     expandable segments do: the driver does not. CUDA_ERROR_OUT_OF_MEMORY
//     from cuMemCreate becomes ResourceExhausted.
// The engine calls a backend under its own lock, so no locking here except
// for the event pool, which is only touched under that lock as well.
#ifndef TORCHMEM_BACKENDS_CUDA_BACKEND_H_
#define TORCHMEM_BACKENDS_CUDA_BACKEND_H_

#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"

#include "torchmem/backends/cuda_driver.h"
#include "torchmem/core/backend.h"

namespace torchmem {

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(int device);
  ~CudaBackend() override;

  std::string DeviceName() const override;
  absl::StatusOr<std::uintptr_t> AllocateSegment(std::size_t size, StreamId stream) override;
  absl::Status ReleaseSegment(std::uintptr_t address, std::size_t size) override;
  absl::StatusOr<std::size_t> Capacity() override;
  absl::StatusOr<std::size_t> FreeBytes() override;
  absl::StatusOr<EventId> RecordEvent(StreamId stream) override;
  absl::StatusOr<bool> QueryEvent(EventId event) override;
  absl::Status SynchronizeEvent(EventId event) override;
  void ReleaseEvent(EventId event) override;

  absl::StatusOr<std::size_t> VirtualMemoryPageSize() override;
  absl::StatusOr<std::uintptr_t> ReserveAddressRange(std::size_t size) override;
  absl::Status ReleaseAddressRange(std::uintptr_t address, std::size_t size) override;
  absl::StatusOr<PhysicalPage> CreatePhysicalPage(std::size_t size) override;
  absl::Status ReleasePhysicalPage(PhysicalPage page) override;
  absl::Status MapPage(std::uintptr_t address, PhysicalPage page, std::size_t size) override;
  absl::Status SetAccess(std::uintptr_t address, std::size_t size) override;
  absl::Status UnmapPages(std::uintptr_t address, std::size_t size, StreamId stream) override;

  int device() const { return device_; }

  // A POSIX file descriptor of `page` (cuMemExportToShareableHandle), for
  // another process to import (CUDA IPC of expandable segments, as PyTorch
  // shares them). Exported once per page and kept open until the page is
  // released, as PyTorch keeps its segments' descriptors: a consumer takes
  // its own copy with pidfd_getfd while the producer still has it.
  // Thread-safe against the engine's calls.
  absl::StatusOr<int> ShareablePage(PhysicalPage page);

  // Lets `peer` read and write the virtual-memory pages this backend maps
  // from now on (the engine re-grants the pages already mapped:
  // Engine::RefreshVirtualMemoryAccess). Thread-safe.
  void AddPeer(int peer);

 private:
  struct MemInfo {
    std::size_t free_bytes;
    std::size_t total_bytes;
  };
  // cudaMemGetInfo on this backend's device.
  absl::StatusOr<MemInfo> GetMemInfo();

  // Formats a CUDA error as "cudaMalloc(20.00 MiB) on cuda:0 failed:
  // cudaErrorX (description)" and clears the sticky error.
  absl::Status CudaError(cudaError_t error, const std::string& call) const;
  // The same for a driver call ("cuMemMap(...) on cuda:0 failed: ...").
  absl::Status DriverError(CUresult result, const std::string& call) const;
  // The driver table, and the device's page size once checked (the device
  // supports virtual memory); FailedPrecondition saying why not otherwise.
  absl::StatusOr<const CudaDriver*> VmmDriver();

  const int device_;
  std::vector<cudaEvent_t> spare_events_;
  // Events made for streams of other devices (destroyed, not pooled).
  absl::flat_hash_set<cudaEvent_t> foreign_events_;
  // Bit d: device d may access this backend's mapped pages (bit device_
  // is implied). Devices are below 64 (torch_glue::kMaxCudaDevices).
  std::atomic<std::uint64_t> peers_{0};
  // Descriptors ShareablePage exported, by page (closed on release).
  std::mutex shared_mutex_;
  absl::flat_hash_map<PhysicalPage, int> shared_pages_;
  // Set by the first successful VirtualMemoryPageSize (0 until then).
  const CudaDriver* driver_ = nullptr;
  std::size_t page_size_ = 0;
  // Whether pages are created RDMA-capable (the device supports GPUDirect
  // RDMA with virtual memory); set with page_size_.
  bool rdma_capable_pages_ = false;
};

}  // namespace torchmem

#endif  // TORCHMEM_BACKENDS_CUDA_BACKEND_H_
