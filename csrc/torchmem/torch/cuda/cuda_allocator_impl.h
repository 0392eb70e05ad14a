// The class behind TorchmemCudaAllocator() (cuda_allocator.h), shared by
// the files that implement it:
//   cuda_allocator.cc          allocation and free, lifecycle, settings,
//                              pools and checkpoints, small queries
//   cuda_allocator_reports.cc  statistics, snapshots, history, trace
//                              trackers
//   ipc.cc                     sharing memory between processes
// Internal to torchmem._C_cuda.
#ifndef TORCHMEM_TORCH_CUDA_CUDA_ALLOCATOR_IMPL_H_
#define TORCHMEM_TORCH_CUDA_CUDA_ALLOCATOR_IMPL_H_

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <c10/util/ApproximateClock.h>

#include "torchmem/core/engine.h"
#include "torchmem/torch/cuda/alloc_config.h"
#include "torchmem/torch/cuda/allocator_interface.h"
#include "torchmem/torch/cuda/cuda_engines.h"

namespace torchmem::torch_glue {

// The deleter of every DataPtr torchmem hands out (cached allocations).
void RawDeleteCached(void* ptr);
// The deleter of allocations made while caching is off (enable(false),
// PYTORCH_NO_CUDA_MEMORY_CACHING): straight cudaFree, as PyTorch's.
void RawDeleteUncached(void* ptr);

inline PoolId ToPoolId(c10::MempoolId_t id) { return PoolId{id.first, id.second}; }
inline c10::MempoolId_t ToMempoolId(PoolId id) { return {id.first, id.second}; }

// A pool's checkpoint, as PyTorch's cudagraph trees hold it.
struct TorchmemPoolState final : cca::AllocatorState {
  c10::DeviceIndex device = 0;
  PoolCheckpoint checkpoint;
};

class TorchmemCudaAllocatorImpl final : public CudaAllocatorAdapter {
 public:
  TorchmemCudaAllocatorImpl();

  // --- allocation ----------------------------------------------------------
  c10::DataPtr allocate(size_t size) override;
  c10::DeleterFnPtr raw_deleter() const override;
  void* raw_alloc(size_t nbytes) override;
  void* raw_alloc_with_stream(size_t nbytes, cudaStream_t stream) override;
  void raw_delete(void* ptr) override;
  void copy_data(void* dest, const void* src, std::size_t count) const override;

  // --- lifecycle and settings ----------------------------------------------
  void init(int device_count) override;
  bool initialized() override;
  double getMemoryFraction(c10::DeviceIndex device) override;
  void setMemoryFraction(double fraction, c10::DeviceIndex device) override;
  void enable(bool value) override;
  bool isEnabled() const override;
  std::string name() override;

  // --- memory queries --------------------------------------------------------
  void cacheInfo(c10::DeviceIndex device, size_t* largest_block) override;
  void* getBaseAllocation(void* ptr, size_t* size) override;
#if TORCHMEM_TORCH_VERSION_AT_LEAST(2, 10)
  std::vector<cca::StreamSegmentSize> ExpandableSegmentSizes(c10::DeviceIndex device) override;
#endif
  void recordStream(const c10::DataPtr& ptr, c10::cuda::CUDAStream stream) override;
  void EmptyCacheOf(c10::MempoolId_t pool) override;
  cudaError_t memcpyAsync(void* dst, int dst_device, const void* src, int src_device, size_t count,
                          cudaStream_t stream, bool p2p_enabled) override;
  void enablePeerAccess(c10::DeviceIndex dev, c10::DeviceIndex dev_to_access) override;

  // --- statistics, snapshots, history (cuda_allocator_reports.cc) -----------
  c10::CachingDeviceAllocator::DeviceStats getDeviceStats(c10::DeviceIndex device) override;
  void resetAccumulatedStats(c10::DeviceIndex device) override;
  void resetPeakStats(c10::DeviceIndex device) override;
  cca::SnapshotInfo TakeSnapshot(c10::MempoolId_t pool, bool include_traces) override;
  void RecordHistory(bool enabled, cca::CreateContextFn recorder, size_t max_entries,
                     cca::RecordContext when, bool clear,
                     const std::vector<std::string>& skip_actions) override;
  bool isHistoryEnabled() override;
  std::shared_ptr<c10::GatheredContext> ContextForPointer(const void* ptr) override;
  void recordAnnotation(const std::vector<std::pair<std::string, std::string>>& md) override;
  void attachAllocatorTraceTracker(cca::AllocatorTraceTracker tracker) override;
  void SetTraceMetadata(const std::string& metadata) override;
  std::string TraceMetadata() override;
  void Annotate(const void* ptr, const std::string& metadata) override;
  void pushCompileContext(std::string& md) override;
  void popCompileContext() override;

  // --- out of memory --------------------------------------------------------
  void attachOutOfMemoryObserver(cca::OutOfMemoryObserver observer) override;
  void AttachOomRejectionObserver(OomRejectionObserver observer) override;

  // --- private pools, CUDA graphs --------------------------------------------
  void beginAllocateToPool(c10::DeviceIndex device, c10::MempoolId_t mempool_id,
                           std::function<bool(cudaStream_t)> filter) override;
  void endAllocateToPool(c10::DeviceIndex device, c10::MempoolId_t mempool_id) override;
  void releasePool(c10::DeviceIndex device, c10::MempoolId_t mempool_id) override;
  int getPoolUseCount(c10::DeviceIndex device, c10::MempoolId_t mempool_id) override;
  void CreateOrIncrefPoolOf(c10::DeviceIndex device, c10::MempoolId_t pool,
                            std::shared_ptr<cca::CUDAAllocator> allocator) override;
  void SetUseOnOom(c10::DeviceIndex device, c10::MempoolId_t pool, bool use_on_oom) override;
  void SetNoSplit(c10::DeviceIndex device, c10::MempoolId_t mempool_id) override;
  bool checkPoolLiveAllocations(
      c10::DeviceIndex device, c10::MempoolId_t mempool_id,
      const std::unordered_set<void*>& expected_live_allocations) override;
  void MarkCapture(c10::DeviceIndex device, bool begins) override;
  std::shared_ptr<cca::AllocatorState> getCheckpointState(c10::DeviceIndex device,
                                                          c10::MempoolId_t id) override;
  cca::CheckpointDelta setCheckpointPoolState(c10::DeviceIndex device,
                                              std::shared_ptr<cca::AllocatorState> state) override;

  // --- IPC (ipc.cc) ----------------------------------------------------------
  cca::ShareableHandle shareIpcHandle(void* ptr) override;
  std::shared_ptr<void> getIpcDevPtr(std::string handle) override;

  // Applies the current settings and history to a newly created engine.
  void ConfigureNewEngine(int device, Engine& engine);
  // Re-reads PyTorch's allocator settings and applies them to every engine.
  void ApplySettings();
  // expandable_segments -> the engine's placement (warns if the device has
  // no virtual memory API).
  static void ApplyPlacement(Engine& engine, bool expandable_segments);
  // The fork handlers hold mutex_ across fork() (cuda_fork_locks.h).
  void LockForFork() { mutex_.lock(); }
  void UnlockAfterFork() { mutex_.unlock(); }

 private:
  void* Malloc(c10::DeviceIndex device, size_t size, cudaStream_t stream);
  [[noreturn]] void ThrowAllocationFailure(c10::DeviceIndex device, Engine& engine, size_t size,
                                           const absl::Status& status);
  Engine& EngineOf(c10::DeviceIndex device);
  // Applies PyTorch's history settings (and trace trackers) to `engine`;
  // without `history_changed`, only if PyTorch's history is on.
  void ApplyHistoryTo(int device, Engine& engine, bool history_changed);

  std::atomic<bool> initialized_{false};
  std::atomic<bool> enabled_{true};
  std::atomic<bool> caching_disabled_{false};  // PYTORCH_NO_CUDA_MEMORY_CACHING

  mutable std::mutex mutex_;  // everything below
  CudaAllocSettings settings_;
  // Per device: the fraction last set (for getMemoryFraction) and the limit
  // it produced (a different limit means torchmem.set_memory_limit moved it).
  struct FractionSetting {
    double fraction = 1.0;
    std::size_t limit = 0;
  };
  FractionSetting fractions_[kMaxCudaDevices];
  std::vector<cca::OutOfMemoryObserver> oom_observers_;
  std::vector<OomRejectionObserver> oom_rejection_observers_;
  std::vector<cca::AllocatorTraceTracker> trace_trackers_;
  // History (recordHistory): what PyTorch asked for.
  bool history_enabled_ = false;
  cca::RecordContext history_when_ = cca::RecordContext::NEVER;
  std::size_t history_max_entries_ = 0;
  std::uint32_t history_skip_mask_ = 0;
  bool capture_requested_ = false;  // our RequestContextCapture() is in effect
  std::vector<TorchAnnotationEntry> annotations_;
};

TorchmemCudaAllocatorImpl& AllocatorImpl();

}  // namespace torchmem::torch_glue

#endif  // TORCHMEM_TORCH_CUDA_CUDA_ALLOCATOR_IMPL_H_
