// The torch-version-dependent edge of torchmem's CUDA allocator, in one place.
//
// c10::cuda::CUDACachingAllocator::CUDAAllocator changes between torch minor
// versions: methods gain parameters (emptyCache(MempoolId_t),
// snapshot(..., include_traces), recordHistory(..., clearHistory,
// skip_actions), setUseOnOOM(..., use_on_oom)), appear
// (attachOomRejectionObserver, markCaptureBegin/End, the user-metadata and
// annotation calls) or change argument
// types (createOrIncrefPool's allocator); the IPC handle's version byte
// changes too (kShareableHandleVersion). CudaAllocatorAdapter overrides
// exactly those, in the spelling of the torch it is compiled against, and
// forwards to torch-version-neutral hooks that TorchmemCudaAllocator
// implements. To support another torch version, change this file only:
// add the version's spellings under TORCHMEM_TORCH_VERSION guards.
//
// Every other CUDAAllocator method keeps one signature across the supported
// versions and is overridden directly in cuda_allocator.h (the compiler
// checks each override).
#ifndef TORCHMEM_TORCH_CUDA_ALLOCATOR_INTERFACE_H_
#define TORCHMEM_TORCH_CUDA_ALLOCATOR_INTERFACE_H_

#include <memory>
#include <string>
#include <vector>

#include <c10/cuda/CUDACachingAllocator.h>

#include "torchmem/torch/torch_version.h"

#if !TORCHMEM_TORCH_VERSION_AT_LEAST(2, 14) || TORCHMEM_TORCH_VERSION_AT_LEAST(2, 15)
#error "torchmem's CUDA allocator spells torch 2.14's CUDAAllocator interface; add this " \
       "torch version's signatures to csrc/torchmem/torch/cuda/allocator_interface.h"
#endif

namespace torchmem::torch_glue {

namespace cca = c10::cuda::CUDACachingAllocator;

// The first byte of PyTorch's shareable CUDA IPC handle: 2 until torch 2.12,
// 3 from 2.13 (the payload of cudaMalloc handles, type 'c', did not change).
// A consumer refuses handles of a newer version than its own.
inline constexpr char kShareableHandleVersion = TORCHMEM_TORCH_VERSION_AT_LEAST(2, 13) ? 3 : 2;

class CudaAllocatorAdapter : public cca::CUDAAllocator {
 public:
  // --- version-neutral hooks ------------------------------------------------
  virtual void EmptyCacheOf(c10::MempoolId_t pool) = 0;
  virtual cca::SnapshotInfo TakeSnapshot(c10::MempoolId_t pool, bool include_traces) = 0;
  virtual void RecordHistory(bool enabled, cca::CreateContextFn recorder, size_t max_entries,
                             cca::RecordContext when, bool clear,
                             const std::vector<std::string>& skip_actions) = 0;
  virtual void CreateOrIncrefPoolOf(c10::DeviceIndex device, c10::MempoolId_t pool,
                                    bool has_own_allocator) = 0;
  virtual void SetUseOnOom(c10::DeviceIndex device, c10::MempoolId_t pool, bool use_on_oom) = 0;
  virtual void MarkCapture(c10::DeviceIndex device, bool begins) = 0;
  virtual void AttachOomRejectionObserver(cca::OomRejectionObserver observer) = 0;
  virtual void SetTraceMetadata(const std::string& metadata) = 0;
  virtual std::string TraceMetadata() = 0;
  virtual void Annotate(const void* ptr, const std::string& metadata) = 0;

  // --- torch 2.14's spellings -----------------------------------------------
  void emptyCache(c10::MempoolId_t mempool_id) final { EmptyCacheOf(mempool_id); }
  cca::SnapshotInfo snapshot(c10::MempoolId_t mempool_id, bool include_traces) final {
    return TakeSnapshot(mempool_id, include_traces);
  }
  void recordHistory(bool enabled, cca::CreateContextFn context_recorder,
                     size_t alloc_trace_max_entries, cca::RecordContext when, bool clearHistory,
                     const std::vector<std::string>& skip_actions) final {
    RecordHistory(enabled, context_recorder, alloc_trace_max_entries, when, clearHistory,
                  skip_actions);
  }
  void createOrIncrefPool(c10::DeviceIndex device, c10::MempoolId_t mempool_id,
                          std::shared_ptr<cca::CUDAAllocator> allocator) final {
    CreateOrIncrefPoolOf(device, mempool_id, allocator != nullptr);
  }
  void setUseOnOOM(c10::DeviceIndex device, c10::MempoolId_t mempool_id,
                   bool use_on_oom) final {
    SetUseOnOom(device, mempool_id, use_on_oom);
  }
  void markCaptureBegin(c10::DeviceIndex device) final { MarkCapture(device, true); }
  void markCaptureEnd(c10::DeviceIndex device) final { MarkCapture(device, false); }
  void attachOomRejectionObserver(cca::OomRejectionObserver observer) final {
    AttachOomRejectionObserver(std::move(observer));
  }
  bool supportsUserMetadata() final { return true; }
  void setUserMetadata(const std::string& metadata) final { SetTraceMetadata(metadata); }
  std::string getUserMetadata() final { return TraceMetadata(); }
  void annotateMemory(const void* ptr, const std::string& metadata) final {
    Annotate(ptr, metadata);
  }
};

}  // namespace torchmem::torch_glue

#endif  // TORCHMEM_TORCH_CUDA_ALLOCATOR_INTERFACE_H_
