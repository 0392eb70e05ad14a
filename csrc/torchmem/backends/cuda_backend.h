// CudaBackend: segments and events of one CUDA device, through the CUDA
// runtime.
//
//   - Segments: cudaMalloc/cudaFree on the backend's device (a device guard
//     switches to it and back). cudaErrorMemoryAllocation becomes
//     ResourceExhausted; the sticky error is cleared so PyTorch's next call
//     does not see it.
//   - Events: cudaEventDisableTiming events from a pool (creating events is
//     expensive and serialises), recorded on the stream that used a block.
//   - Capacity: cudaMemGetInfo's total, for limits given as a fraction.
//   - A segment needed while its stream is being captured into a CUDA graph
//     is obtained with the thread's capture mode relaxed for the cudaMalloc,
//     as PyTorch's allocator does (cudaMallocMaybeCapturing): a captured
//     cudaMalloc gives the graph new addresses and is not replayed. The
//     engine keeps such segments in the graph's private pool and never
//     releases them during a capture.
// The engine calls a backend under its own lock, so no locking here except
// for the event pool, which is only touched under that lock as well.
#ifndef TORCHMEM_BACKENDS_CUDA_BACKEND_H_
#define TORCHMEM_BACKENDS_CUDA_BACKEND_H_

#include <cuda_runtime_api.h>

#include <string>
#include <vector>

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

  int device() const { return device_; }

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

  const int device_;
  std::vector<cudaEvent_t> spare_events_;
};

}  // namespace torchmem

#endif  // TORCHMEM_BACKENDS_CUDA_BACKEND_H_
