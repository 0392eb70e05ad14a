// The torch-version-dependent edge of torchmem's CUDA allocator, in one place.
//
// c10::cuda::CUDACachingAllocator::CUDAAllocator changes between the torch
// releases torchmem supports (2.9 to 2.15, torch_version.h). Read from each
// release's c10/cuda/CUDACachingAllocator.h:
//   2.10  getExpandableSegmentSizes, setNoSplit, set/getUserMetadata appear;
//   2.11  snapshot(pool, include_traces), recordHistory(..., skip_actions),
//         createOrIncrefPool takes a shared_ptr<CUDAAllocator> (was a raw
//         pointer), setUseOnOOM(..., use_on_oom);
//   2.12  getContextForPointer, attachOomRejectionObserver (and the
//         OomRejectionObserver type) appear;
//   2.13  markCaptureBegin/End appear (before, a capture was known only by
//         begin/endAllocateToPool, which the engine counts as a capture
//         too); the IPC handle's version byte becomes 3;
//   2.14  supportsUserMetadata, annotateMemory appear;
//   2.15  no change to the interface.
// CudaAllocatorAdapter overrides exactly those, in the spelling of the torch
// it is compiled against, and forwards to torch-version-neutral hooks that
// TorchmemCudaAllocator implements; a method a release lacks is simply never
// called there. To support another torch release, change this file only.
//
// Every other CUDAAllocator method keeps one signature across the supported
// releases and is overridden directly in cuda_allocator_impl.h (the compiler
// checks each override).
#ifndef TORCHMEM_TORCH_CUDA_ALLOCATOR_INTERFACE_H_
#define TORCHMEM_TORCH_CUDA_ALLOCATOR_INTERFACE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <c10/cuda/CUDACachingAllocator.h>

#include "torchmem/torch/torch_version.h"

#include <cstdint>
#include <functional>

namespace torchmem::torch_glue {

namespace cca = c10::cuda::CUDACachingAllocator;

// The first byte of PyTorch's shareable CUDA IPC handle: 2 until torch 2.12,
// 3 from 2.13 (the payload of cudaMalloc handles, type 'c', did not change).
// A consumer refuses handles of a newer version than its own.
inline constexpr char kShareableHandleVersion = TORCHMEM_TORCH_VERSION_AT_LEAST(2, 13) ? 3 : 2;

// The types of PyTorch's snapshots and traces moved to
// c10::CachingDeviceAllocator in 2.11 (CUDACachingAllocator keeps aliases of
// most, not of AnnotationEntry); the stream they record became a void*.
#if TORCHMEM_TORCH_VERSION_AT_LEAST(2, 11)
using TorchAnnotationEntry = c10::CachingDeviceAllocator::AnnotationEntry;
#else
using TorchAnnotationEntry = cca::AnnotationEntry;
#endif
using TorchTraceStream = decltype(cca::TraceEntry::stream_);

// Called when an allocation is refused before asking the device (2.12+):
// (device, requested size, allocated bytes, device total). Older releases
// never attach one; the alias keeps the implementation version-neutral.
#if TORCHMEM_TORCH_VERSION_AT_LEAST(2, 12)
using OomRejectionObserver = cca::OomRejectionObserver;
#else
using OomRejectionObserver = std::function<void(int64_t device, size_t alloc_size,
                                                size_t total_allocated, size_t device_total)>;
#endif

class CudaAllocatorAdapter : public cca::CUDAAllocator {
 public:
  // --- version-neutral hooks ------------------------------------------------
  virtual void EmptyCacheOf(c10::MempoolId_t pool) = 0;
  virtual cca::SnapshotInfo TakeSnapshot(c10::MempoolId_t pool, bool include_traces) = 0;
  virtual void RecordHistory(bool enabled, cca::CreateContextFn recorder, size_t max_entries,
                             cca::RecordContext when, bool clear,
                             const std::vector<std::string>& skip_actions) = 0;
  // `allocator`: the MemPool's own allocator, or nullptr.
  virtual void CreateOrIncrefPoolOf(c10::DeviceIndex device, c10::MempoolId_t pool,
                                    std::shared_ptr<cca::CUDAAllocator> allocator) = 0;
  virtual void SetUseOnOom(c10::DeviceIndex device, c10::MempoolId_t pool, bool use_on_oom) = 0;
  virtual void MarkCapture(c10::DeviceIndex device, bool begins) = 0;
  virtual void AttachOomRejectionObserver(OomRejectionObserver observer) = 0;
  virtual void SetTraceMetadata(const std::string& metadata) = 0;
  virtual std::string TraceMetadata() = 0;
  virtual void Annotate(const void* ptr, const std::string& metadata) = 0;
  virtual std::shared_ptr<c10::GatheredContext> ContextForPointer(const void* ptr) = 0;
#if TORCHMEM_TORCH_VERSION_AT_LEAST(2, 10)  // StreamSegmentSize arrived in 2.10
  virtual std::vector<cca::StreamSegmentSize> ExpandableSegmentSizes(c10::DeviceIndex device) = 0;
#endif
  virtual void SetNoSplit(c10::DeviceIndex device, c10::MempoolId_t pool) = 0;

  // --- every release's spellings --------------------------------------------
  void emptyCache(c10::MempoolId_t mempool_id) final { EmptyCacheOf(mempool_id); }

#if TORCHMEM_TORCH_VERSION_AT_LEAST(2, 11)
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
    CreateOrIncrefPoolOf(device, mempool_id, std::move(allocator));
  }
  void setUseOnOOM(c10::DeviceIndex device, c10::MempoolId_t mempool_id, bool use_on_oom) final {
    SetUseOnOom(device, mempool_id, use_on_oom);
  }
#else  // 2.9, 2.10
  cca::SnapshotInfo snapshot(c10::MempoolId_t mempool_id) final {
    return TakeSnapshot(mempool_id, /*include_traces=*/true);
  }
  void recordHistory(bool enabled, cca::CreateContextFn context_recorder,
                     size_t alloc_trace_max_entries, cca::RecordContext when,
                     bool clearHistory) final {
    RecordHistory(enabled, context_recorder, alloc_trace_max_entries, when, clearHistory,
                  /*skip_actions=*/{});
  }
  void createOrIncrefPool(c10::DeviceIndex device, c10::MempoolId_t mempool_id,
                          cca::CUDAAllocator* allocator) final {
    // Not owned: the MemPool keeps its allocator alive as long as the pool.
    std::shared_ptr<cca::CUDAAllocator> borrowed(allocator, [](cca::CUDAAllocator*) {});
    CreateOrIncrefPoolOf(device, mempool_id, allocator != nullptr ? borrowed : nullptr);
  }
  // Before 2.11 the call meant "use this pool on OOM", with no way to undo it.
  void setUseOnOOM(c10::DeviceIndex device, c10::MempoolId_t mempool_id) final {
    SetUseOnOom(device, mempool_id, /*use_on_oom=*/true);
  }
#endif

#if TORCHMEM_TORCH_VERSION_AT_LEAST(2, 10)
  std::vector<cca::StreamSegmentSize> getExpandableSegmentSizes(c10::DeviceIndex device) final {
    return ExpandableSegmentSizes(device);
  }
  void setNoSplit(c10::DeviceIndex device, c10::MempoolId_t mempool_id) final {
    SetNoSplit(device, mempool_id);
  }
  void setUserMetadata(const std::string& metadata) final { SetTraceMetadata(metadata); }
  std::string getUserMetadata() final { return TraceMetadata(); }
#endif

#if TORCHMEM_TORCH_VERSION_AT_LEAST(2, 12)
  std::shared_ptr<c10::GatheredContext> getContextForPointer(const void* ptr) final {
    return ContextForPointer(ptr);
  }
  void attachOomRejectionObserver(cca::OomRejectionObserver observer) final {
    AttachOomRejectionObserver(std::move(observer));
  }
#endif

#if TORCHMEM_TORCH_VERSION_AT_LEAST(2, 13)
  void markCaptureBegin(c10::DeviceIndex device) final { MarkCapture(device, true); }
  void markCaptureEnd(c10::DeviceIndex device) final { MarkCapture(device, false); }
#endif

#if TORCHMEM_TORCH_VERSION_AT_LEAST(2, 14)
  bool supportsUserMetadata() final { return true; }
  void annotateMemory(const void* ptr, const std::string& metadata) final {
    Annotate(ptr, metadata);
  }
#endif
};

}  // namespace torchmem::torch_glue

#endif  // TORCHMEM_TORCH_CUDA_ALLOCATOR_INTERFACE_H_
