// TorchmemCudaAllocatorImpl: allocation and free, lifecycle, settings,
// private pools and checkpoints (see cuda_allocator.h for what and why).
#include "torchmem/torch/cuda/cuda_allocator.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <string>
#include <utility>

#include <c10/core/Allocator.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "torchmem/backends/cuda_streams.h"
#include "torchmem/core/warnings.h"
#include "torchmem/torch/cuda/cuda_allocator_impl.h"
#include "torchmem/torch/cuda/cuda_fork_locks.h"
#include "torchmem/torch/cuda/free_memory_callbacks.h"
#include "torchmem/torch/cuda/pool_allocator_source.h"

namespace torchmem::torch_glue {
namespace {

// PyTorch rejects requests of 1 EiB and more before asking its allocator
// (and so does torchmem's engine).
constexpr std::size_t kOneExbibyte = std::size_t{1} << 60;

// PyTorch registers its own CUDA allocator with c10 at priority 1
// (libc10_cuda's static initializer; read from its disassembly); c10 lets
// an equal or higher priority replace it.
constexpr std::uint8_t kCudaAllocatorPriority = 1;

// Sizes as PyTorch's allocator writes them in its messages ("2.00 GiB").
std::string FormatSizeLikePyTorch(std::uint64_t size) {
  if (size <= 1024) return absl::StrFormat("%d bytes", size);
  if (size <= 1048576) return absl::StrFormat("%.2f KiB", static_cast<double>(size) / 1024.0);
  if (size <= 1073741824ULL) {
    return absl::StrFormat("%.2f MiB", static_cast<double>(size) / 1048576.0);
  }
  return absl::StrFormat("%.2f GiB", static_cast<double>(size) / 1073741824.0);
}

// Engine warnings reach Python's warnings module through PyTorch.
void WarnThroughTorch(absl::string_view message) { TORCH_WARN("torchmem: ", std::string(message)); }

void ConfigureNewEngineTrampoline(int device, Engine& engine) {
  AllocatorImpl().ConfigureNewEngine(device, engine);
}

// What PyTorch's allocator tells torch.profiler(profile_memory=True) at each
// allocation and free: the block's size (negative when freed) and the
// device's totals after it.
void ReportToProfiler(int device, Engine& engine, void* ptr, std::int64_t change) {
  const MemoryStats stats = engine.GetStats();
  c10::reportMemoryUsageToProfiler(
      ptr, change, static_cast<std::size_t>(stats.allocated_bytes.all().current),
      static_cast<std::size_t>(stats.reserved_bytes.all().current),
      c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(device)));
}

}  // namespace

// --- deleters -----------------------------------------------------------------

void RawDeleteCached(void* ptr) {
  if (ptr == nullptr) return;
  // The engine of the device whose segment holds ptr (address registry):
  // no other engine is asked, nor locked.
  const int device = CudaDeviceOwning(ptr);
  Engine* engine = device < 0 ? nullptr : ExistingCudaEngine(device);
  if (engine != nullptr) {
    std::int64_t size = 0;
    const bool profiling = ABSL_PREDICT_FALSE(c10::memoryProfilingEnabled());
    if (profiling) {
      absl::StatusOr<BlockInfo> block = engine->GetBlock(ptr);
      if (block.ok()) size = static_cast<std::int64_t>(block->size);
    }
    absl::StatusOr<bool> freed = engine->FreeIfOwned(ptr);
    // A deleter runs in destructors and must not throw; the pool is intact.
    if (!freed.ok()) Warn(freed.status().message());
    if (freed.ok() && *freed) {
      if (profiling) ReportToProfiler(device, *engine, ptr, -size);
      return;
    }
  }
  Warn(absl::StrFormat(
      "invalid device pointer %p: no torchmem CUDA engine allocated it; nothing was freed", ptr));
}

void RawDeleteUncached(void* ptr) {
  if (ptr == nullptr) return;
  C10_CUDA_CHECK_WARN(cudaFree(ptr));
}

// --- construction, lifecycle ----------------------------------------------------

TorchmemCudaAllocatorImpl::TorchmemCudaAllocatorImpl() {
  SetCudaEngineInitializer(&ConfigureNewEngineTrampoline);
  RegisterCudaForkLocks();
}

namespace {

// Never destroyed: PyTorch's tensors keep our deleter and may die during
// static destruction.
const std::shared_ptr<TorchmemCudaAllocatorImpl>& SharedAllocator() {
  static auto* allocator =
      new std::shared_ptr<TorchmemCudaAllocatorImpl>(std::make_shared<TorchmemCudaAllocatorImpl>());
  return *allocator;
}

}  // namespace

TorchmemCudaAllocatorImpl& AllocatorImpl() { return *SharedAllocator(); }

void LockAllocatorForFork() { AllocatorImpl().LockForFork(); }

void UnlockAllocatorAfterFork() { AllocatorImpl().UnlockAfterFork(); }

std::shared_ptr<cca::CUDAAllocator> TorchmemCudaAllocator() { return SharedAllocator(); }

bool TorchmemCudaAllocatorInstalled() { return cca::get() == &AllocatorImpl(); }

void TorchmemCudaAllocatorImpl::init(int device_count) {
  // PyTorch's lazy CUDA initialization. changeCurrentAllocator only swapped
  // cca::get(); register with c10 as well so that c10::GetAllocator(kCUDA)
  // (and getDeviceAllocator, torch.accelerator) reach us too.
  if (cca::get() == this && c10::GetAllocator(c10::DeviceType::CUDA) != this) {
    c10::SetAllocator(c10::DeviceType::CUDA, this, kCudaAllocatorPriority);
  }
  SetWarningHandler(&WarnThroughTorch);
  ApplySettings();
  (void)ListenForSettingsChanges([] { AllocatorImpl().ApplySettings(); });
  // Engines made before (through torchmem's Python API) get the settings
  // now; the others are created configured.
  for (const auto& [device, engine] : CudaEngines()) ConfigureNewEngine(device, *engine);
  for (int device = 0; device < device_count && device < kMaxCudaDevices; ++device) {
    (void)CudaEngine(device);
  }
  initialized_.store(true, std::memory_order_release);
}

bool TorchmemCudaAllocatorImpl::initialized() {
  return initialized_.load(std::memory_order_acquire);
}

void TorchmemCudaAllocatorImpl::ApplySettings() {
  CudaAllocSettings settings = ReadCudaAllocSettings();
  caching_disabled_.store(settings.caching_disabled, std::memory_order_relaxed);
  std::vector<std::pair<int, Engine*>> engines = CudaEngines();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    settings_ = settings;
  }
  for (const auto& [device, engine] : engines) {
    absl::Status adopted = engine->SetSizePolicy(settings.policy);
    if (!adopted.ok()) Warn(adopted.message());
    engine->SetGarbageCollectionThreshold(settings.garbage_collection_threshold);
    ApplyPlacement(*engine, settings.expandable_segments);
  }
}

void TorchmemCudaAllocatorImpl::ApplyPlacement(Engine& engine, bool expandable_segments) {
  // Blocks already allocated stay where they are; new ones follow the
  // placement. A device without the driver's virtual memory keeps PyTorch's
  // placement, with one warning that says why.
  const Placement wanted = expandable_segments ? Placement::kVirtualMemory : Placement::kPyTorch;
  if (engine.placement() == wanted) return;
  if (absl::Status set = engine.SetPlacement(wanted); !set.ok()) Warn(set.message());
}

void TorchmemCudaAllocatorImpl::ConfigureNewEngine(int device, Engine& engine) {
  CudaAllocSettings settings;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    settings = settings_;
  }
  absl::Status adopted = engine.SetSizePolicy(settings.policy);
  if (!adopted.ok()) Warn(adopted.message());
  engine.SetGarbageCollectionThreshold(settings.garbage_collection_threshold);
  ApplyPlacement(engine, settings.expandable_segments);
  engine.SetCacheMissHook(&RunFreeCudaMemoryCallbacks);
  if (settings.per_process_memory_fraction < 1.0) {
    // Not setMemoryFraction(): the engine is not published yet.
    const double fraction = settings.per_process_memory_fraction;
    if (fraction <= 0.0) {
      engine.SetMemoryLimit(1);
    } else if (absl::Status set = engine.SetMemoryFraction(fraction); !set.ok()) {
      Warn(set.message());
    }
    std::lock_guard<std::mutex> lock(mutex_);
    fractions_[device] = FractionSetting{fraction, engine.memory_limit()};
  }
  ApplyHistoryTo(device, engine, /*history_changed=*/false);
}

Engine& TorchmemCudaAllocatorImpl::EngineOf(c10::DeviceIndex device) {
  if (Engine* engine = ExistingCudaEngine(device)) return *engine;
  return CudaEngine(device);
}

std::string TorchmemCudaAllocatorImpl::name() { return "native"; }

void TorchmemCudaAllocatorImpl::enable(bool value) {
  enabled_.store(value, std::memory_order_relaxed);
}

bool TorchmemCudaAllocatorImpl::isEnabled() const {
  return enabled_.load(std::memory_order_relaxed);
}

// --- allocation -------------------------------------------------------------

c10::DataPtr TorchmemCudaAllocatorImpl::allocate(size_t size) {
  TORCH_CHECK_WITH(OutOfMemoryError, size < kOneExbibyte,
                   "CUDA out of memory. Tried to allocate more than 1EB memory.");
  c10::DeviceIndex device = 0;
  C10_CUDA_CHECK(c10::cuda::GetDevice(&device));
  const c10::Device where(c10::DeviceType::CUDA, device);
  if (ABSL_PREDICT_FALSE(caching_disabled_.load(std::memory_order_relaxed) ||
                         !enabled_.load(std::memory_order_relaxed))) {
    void* ptr = nullptr;
    if (size != 0) C10_CUDA_CHECK(cudaMalloc(&ptr, size));
    return {ptr, ptr, &RawDeleteUncached, where};
  }
  if (size == 0) return {nullptr, nullptr, &RawDeleteCached, where};
  void* ptr = Malloc(device, size, c10::cuda::getCurrentCUDAStream(device).stream());
  return {ptr, ptr, &RawDeleteCached, where};
}

c10::DeleterFnPtr TorchmemCudaAllocatorImpl::raw_deleter() const {
  const bool uncached = caching_disabled_.load(std::memory_order_relaxed) ||
                        !enabled_.load(std::memory_order_relaxed);
  return uncached ? &RawDeleteUncached : &RawDeleteCached;
}

void* TorchmemCudaAllocatorImpl::raw_alloc(size_t nbytes) {
  if (nbytes == 0) return nullptr;
  c10::DeviceIndex device = 0;
  C10_CUDA_CHECK(c10::cuda::GetDevice(&device));
  return raw_alloc_with_stream(nbytes, c10::cuda::getCurrentCUDAStream(device).stream());
}

void* TorchmemCudaAllocatorImpl::raw_alloc_with_stream(size_t nbytes, cudaStream_t stream) {
  if (nbytes == 0) return nullptr;
  if (ABSL_PREDICT_FALSE(caching_disabled_.load(std::memory_order_relaxed) ||
                         !enabled_.load(std::memory_order_relaxed))) {
    // As PyTorch's: with caching off, raw allocations go straight to the device.
    void* ptr = nullptr;
    C10_CUDA_CHECK(cudaMalloc(&ptr, nbytes));
    return ptr;
  }
  c10::DeviceIndex device = 0;
  C10_CUDA_CHECK(c10::cuda::GetDevice(&device));
  return Malloc(device, nbytes, stream);
}

void TorchmemCudaAllocatorImpl::raw_delete(void* ptr) {
  if (ptr == nullptr) return;
  if (Engine* engine = CudaEngineOwning(ptr)) {
    absl::StatusOr<bool> freed = engine->FreeIfOwned(ptr);
    TORCH_CHECK(freed.ok(), std::string(freed.status().message()));
    if (*freed) return;
  }
  if (caching_disabled_.load(std::memory_order_relaxed) ||
      !enabled_.load(std::memory_order_relaxed)) {
    // A raw allocation made while caching is off (no engine owns it).
    C10_CUDA_CHECK(cudaFree(ptr));
    return;
  }
  TORCH_CHECK(false, "invalid device pointer: ", ptr,
              " (torchmem's CUDA engines did not allocate it)");
}

void* TorchmemCudaAllocatorImpl::Malloc(c10::DeviceIndex device, size_t size, cudaStream_t stream) {
  Engine& engine = EngineOf(device);
  absl::StatusOr<void*> ptr = engine.Allocate(size, reinterpret_cast<StreamId>(stream));
  if (ABSL_PREDICT_TRUE(ptr.ok())) {
    if (ABSL_PREDICT_FALSE(c10::memoryProfilingEnabled()) && *ptr != nullptr) {
      absl::StatusOr<BlockInfo> block = engine.GetBlock(*ptr);
      if (block.ok())
        ReportToProfiler(device, engine, *ptr, static_cast<std::int64_t>(block->size));
    }
    return *ptr;
  }
  ThrowAllocationFailure(device, engine, size, ptr.status());
}

void TorchmemCudaAllocatorImpl::ThrowAllocationFailure(c10::DeviceIndex device, Engine& engine,
                                                       size_t size, const absl::Status& status) {
  const std::string message(status.message());
  if (!absl::IsResourceExhausted(status)) TORCH_CHECK(false, message);
  // PyTorch's opening sentence (what tools grep for), then torchmem's
  // diagnosis: the limit, the cache, the top tags, what to try.
  const SizePolicy policy = engine.policy();
  const std::size_t alloc_size = policy.SegmentSizeFor(policy.RoundSize(size));
  std::size_t device_free = 0;
  std::size_t device_total = 0;
  {
    c10::cuda::CUDAGuard guard(device);
    if (cudaMemGetInfo(&device_free, &device_total) != cudaSuccess) (void)cudaGetLastError();
  }
  const std::size_t limit = engine.memory_limit();
  std::vector<cca::OutOfMemoryObserver> observers;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    observers = oom_observers_;
  }
  // Observers may take the GIL: no engine lock is held here.
  for (const auto& observer : observers) {
    observer(device, alloc_size, limit != 0 ? limit : device_total, device_free);
  }
  const MemoryStats stats = engine.GetStats();
  const std::int64_t private_free = engine.PrivatePoolFreeBytes();
  TORCH_CHECK_WITH(OutOfMemoryError, false, "CUDA out of memory. Tried to allocate ",
                   FormatSizeLikePyTorch(alloc_size), ". GPU ", static_cast<int>(device),
                   " has a total capacity of ", FormatSizeLikePyTorch(device_total), " of which ",
                   FormatSizeLikePyTorch(device_free), " is free. ",
                   limit != 0 ? FormatSizeLikePyTorch(limit) + " allowed; " : std::string(),
                   "Of the allocated memory ",
                   FormatSizeLikePyTorch(stats.allocated_bytes.all().current),
                   " is allocated by PyTorch, ",
                   private_free > 0 ? "with " + FormatSizeLikePyTorch(private_free) +
                                          " cached in private pools (e.g., CUDA Graphs), "
                                    : std::string(),
                   "and ",
                   FormatSizeLikePyTorch(stats.reserved_bytes.all().current -
                                         stats.allocated_bytes.all().current),
                   " is reserved by PyTorch but unallocated (allocator: torchmem).\n", message);
}

void TorchmemCudaAllocatorImpl::copy_data(void* dest, const void* src, std::size_t count) const {
  C10_CUDA_CHECK(cudaMemcpy(dest, src, count, cudaMemcpyDeviceToDevice));
}

// --- settings ---------------------------------------------------------------

double TorchmemCudaAllocatorImpl::getMemoryFraction(c10::DeviceIndex device) {
  TORCH_CHECK(device >= 0 && device < kMaxCudaDevices, "invalid device ", device);
  const std::size_t limit = EngineOf(device).memory_limit();
  if (limit == 0) return 1.0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (fractions_[device].limit == limit) return fractions_[device].fraction;
  }
  // The limit came from torchmem.set_memory_limit: say what fraction it is.
  std::size_t free_bytes = 0;
  std::size_t total = 0;
  c10::cuda::CUDAGuard guard(device);
  C10_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total));
  return total == 0 ? 1.0 : static_cast<double>(limit) / static_cast<double>(total);
}

void TorchmemCudaAllocatorImpl::setMemoryFraction(double fraction, c10::DeviceIndex device) {
  TORCH_CHECK(device >= 0 && device < kMaxCudaDevices, "invalid device ", device);
  TORCH_CHECK(0 <= fraction && fraction <= 1, "invalid fraction:", fraction,
              ". Please set within [0, 1].");
  Engine& engine = EngineOf(device);
  if (fraction >= 1.0) {
    engine.SetMemoryLimit(0);  // PyTorch: a fraction of 1 means no limit
  } else if (fraction <= 0.0) {
    engine.SetMemoryLimit(1);  // nothing can be allocated
  } else {
    absl::Status set = engine.SetMemoryFraction(fraction);
    TORCH_CHECK(set.ok(), std::string(set.message()));
  }
  std::lock_guard<std::mutex> lock(mutex_);
  fractions_[device] = FractionSetting{fraction, engine.memory_limit()};
}

// --- memory queries -----------------------------------------------------------

void TorchmemCudaAllocatorImpl::cacheInfo(c10::DeviceIndex device, size_t* largest_block) {
  if (*largest_block == 0) {
    // PyTorch's first guess: the device's free memory (what a new segment
    // could get); then the largest cached block if that is larger.
    size_t total = 0;
    c10::cuda::CUDAGuard guard(device);
    C10_CUDA_CHECK(cudaMemGetInfo(largest_block, &total));
  }
  *largest_block = std::max(*largest_block, EngineOf(device).LargestCachedBlock());
}

void* TorchmemCudaAllocatorImpl::getBaseAllocation(void* ptr, size_t* size) {
  if (Engine* engine = CudaEngineOwning(ptr)) {
    auto base = engine->BaseAllocation(ptr);
    if (base.ok()) {
      if (size != nullptr) *size = base->second;
      return reinterpret_cast<void*>(base->first);
    }
  }
  TORCH_CHECK(false, "invalid device pointer: ", ptr,
              " (torchmem's CUDA engines did not allocate it)");
}

#if TORCHMEM_TORCH_VERSION_AT_LEAST(2, 10)
std::vector<cca::StreamSegmentSize> TorchmemCudaAllocatorImpl::ExpandableSegmentSizes(
    c10::DeviceIndex device) {
  // As PyTorch's: one entry per expandable segment (torchmem's virtual-memory
  // ranges, of every pool), with its stream, pool and mapped bytes.
  std::vector<cca::StreamSegmentSize> sizes;
  Engine* engine = ExistingCudaEngine(device);
  if (engine == nullptr) return sizes;
  for (const SegmentInfo& segment : engine->GetSegments()) {
    if (!segment.vmm) continue;
    sizes.emplace_back(reinterpret_cast<cudaStream_t>(segment.stream),
                       segment.pool == PoolKind::kSmall, segment.mapped_bytes);
  }
  return sizes;
}
#endif

void TorchmemCudaAllocatorImpl::recordStream(const c10::DataPtr& ptr,
                                             c10::cuda::CUDAStream stream) {
  // Empty tensors have no block; memory torchmem did not allocate (a tensor
  // shared from another process) is not ours to track, as in PyTorch.
  if (ptr.get() == nullptr || ptr.get_deleter() != &RawDeleteCached) return;
  const int device = CudaDeviceOwning(ptr.get());
  Engine* engine = device < 0 ? nullptr : ExistingCudaEngine(device);
  if (engine != nullptr) {
    // A stream of another device keeps its device: every device's default
    // stream is the same handle, and the event waiting for it must be
    // recorded on that device (cuda_streams.h).
    const StreamId stream_id = stream.device_index() == device
                                   ? reinterpret_cast<StreamId>(stream.stream())
                                   : ForeignStreamId(stream.device_index(), stream.stream());
    absl::Status recorded = engine->RecordStream(ptr.get(), stream_id);
    TORCH_CHECK(recorded.ok(), std::string(recorded.message()));
    return;
  }
  TORCH_INTERNAL_ASSERT(false, "torchmem: no engine holds the block of a DataPtr it allocated");
}

void TorchmemCudaAllocatorImpl::EmptyCacheOf(c10::MempoolId_t pool) {
  for (const auto& [device, engine] : CudaEngines()) {
    absl::Status emptied = engine->EmptyCache(ToPoolId(pool));
    TORCH_CHECK(emptied.ok(), std::string(emptied.message()));
  }
}

cudaError_t TorchmemCudaAllocatorImpl::memcpyAsync(void* dst, int dst_device, const void* src,
                                                   int src_device, size_t count,
                                                   cudaStream_t stream, bool p2p_enabled) {
  // With peer access (enablePeerAccess granted it on the virtual-memory
  // pages too) or on one device, a plain copy. Otherwise only
  // cudaMemcpyPeerAsync reaches memory that did not come from cudaMalloc
  // (expandable segments' pages are accessible to their own device only),
  // as PyTorch's allocator does.
  if (p2p_enabled || src_device == dst_device) {
    return cudaMemcpyAsync(dst, src, count, cudaMemcpyDeviceToDevice, stream);
  }
  return cudaMemcpyPeerAsync(dst, dst_device, src, src_device, count, stream);
}

void TorchmemCudaAllocatorImpl::enablePeerAccess(c10::DeviceIndex dev,
                                                 c10::DeviceIndex dev_to_access) {
  c10::cuda::CUDAGuard guard(dev);
  const cudaError_t error = cudaDeviceEnablePeerAccess(dev_to_access, 0);
  if (error == cudaErrorPeerAccessAlreadyEnabled) {
    (void)cudaGetLastError();  // already on: fine
  } else {
    C10_CUDA_CHECK(error);
  }
  // `dev` now reads and writes dev_to_access's memory: its virtual-memory
  // pages too, those mapped already and every later one (PyTorch's
  // expandable segments do the same).
  CudaBackendOf(dev_to_access).AddPeer(dev);
  absl::Status granted = CudaEngine(dev_to_access).RefreshVirtualMemoryAccess();
  TORCH_CHECK(granted.ok(), "torchmem: could not give cuda:", static_cast<int>(dev),
              " access to cuda:", static_cast<int>(dev_to_access),
              "'s expandable segments: ", std::string(granted.message()));
}

// --- out of memory ------------------------------------------------------------

void TorchmemCudaAllocatorImpl::attachOutOfMemoryObserver(cca::OutOfMemoryObserver observer) {
  std::lock_guard<std::mutex> lock(mutex_);
  oom_observers_.push_back(std::move(observer));
}

void TorchmemCudaAllocatorImpl::AttachOomRejectionObserver(OomRejectionObserver observer) {
  // torchmem never rejects an allocation before asking the device
  // (throw_on_cudamalloc_oom is not implemented): kept, never called.
  std::lock_guard<std::mutex> lock(mutex_);
  oom_rejection_observers_.push_back(std::move(observer));
}

// --- private pools, CUDA graphs ---------------------------------------------------

namespace {

void CheckPoolStatus(const absl::Status& status) {
  TORCH_CHECK(status.ok(), std::string(status.message()));
}

}  // namespace

void TorchmemCudaAllocatorImpl::beginAllocateToPool(c10::DeviceIndex device,
                                                    c10::MempoolId_t mempool_id,
                                                    std::function<bool(cudaStream_t)> filter) {
  CheckPoolStatus(EngineOf(device).BeginAllocateToPool(
      ToPoolId(mempool_id), [filter = std::move(filter)](StreamId stream) {
        return filter(reinterpret_cast<cudaStream_t>(stream));
      }));
}

void TorchmemCudaAllocatorImpl::endAllocateToPool(c10::DeviceIndex device,
                                                  c10::MempoolId_t mempool_id) {
  CheckPoolStatus(EngineOf(device).EndAllocateToPool(ToPoolId(mempool_id)));
}

void TorchmemCudaAllocatorImpl::releasePool(c10::DeviceIndex device, c10::MempoolId_t mempool_id) {
  CheckPoolStatus(EngineOf(device).ReleasePool(ToPoolId(mempool_id)));
}

int TorchmemCudaAllocatorImpl::getPoolUseCount(c10::DeviceIndex device,
                                               c10::MempoolId_t mempool_id) {
  absl::StatusOr<int> count = EngineOf(device).PoolUseCount(ToPoolId(mempool_id));
  CheckPoolStatus(count.status());
  return *count;
}

void TorchmemCudaAllocatorImpl::CreateOrIncrefPoolOf(
    c10::DeviceIndex device, c10::MempoolId_t pool, std::shared_ptr<cca::CUDAAllocator> allocator) {
  // The pool's segments come from its own allocator (NCCL's ncclMemAlloc,
  // a CUDAPluggableAllocator); torchmem places and accounts the blocks.
  // torchmem itself as the pool's allocator would re-enter the engine from
  // under its lock: such a pool is an ordinary one.
  std::shared_ptr<SegmentSource> source;
  if (allocator != nullptr && allocator.get() != this) {
    source = MakePoolAllocatorSource(std::move(allocator), device);
  }
  CheckPoolStatus(EngineOf(device).CreateOrIncrefPool(ToPoolId(pool), std::move(source)));
}

void TorchmemCudaAllocatorImpl::SetUseOnOom(c10::DeviceIndex device, c10::MempoolId_t pool,
                                            bool use_on_oom) {
  CheckPoolStatus(EngineOf(device).SetPoolUseOnOom(ToPoolId(pool), use_on_oom));
}

void TorchmemCudaAllocatorImpl::SetNoSplit(c10::DeviceIndex device, c10::MempoolId_t mempool_id) {
  CheckPoolStatus(EngineOf(device).SetPoolNoSplit(ToPoolId(mempool_id)));
}

bool TorchmemCudaAllocatorImpl::checkPoolLiveAllocations(
    c10::DeviceIndex device, c10::MempoolId_t mempool_id,
    const std::unordered_set<void*>& expected_live_allocations) {
  absl::flat_hash_set<std::uintptr_t> expected;
  for (void* ptr : expected_live_allocations)
    expected.insert(reinterpret_cast<std::uintptr_t>(ptr));
  absl::StatusOr<bool> matches =
      EngineOf(device).CheckPoolLiveAllocations(ToPoolId(mempool_id), expected);
  CheckPoolStatus(matches.status());
  return *matches;
}

void TorchmemCudaAllocatorImpl::MarkCapture(c10::DeviceIndex device, bool begins) {
  Engine& engine = EngineOf(device);
  begins ? engine.MarkCaptureBegin() : engine.MarkCaptureEnd();
}

std::shared_ptr<cca::AllocatorState> TorchmemCudaAllocatorImpl::getCheckpointState(
    c10::DeviceIndex device, c10::MempoolId_t id) {
  absl::StatusOr<PoolCheckpoint> checkpoint = EngineOf(device).GetPoolCheckpoint(ToPoolId(id));
  CheckPoolStatus(checkpoint.status());
  auto state = std::make_shared<TorchmemPoolState>();
  state->device = device;
  state->checkpoint = *std::move(checkpoint);
  return state;
}

cca::CheckpointDelta TorchmemCudaAllocatorImpl::setCheckpointPoolState(
    c10::DeviceIndex device, std::shared_ptr<cca::AllocatorState> state) {
  auto pool_state = std::dynamic_pointer_cast<TorchmemPoolState>(state);
  TORCH_CHECK(pool_state != nullptr,
              "torchmem: setCheckpointPoolState expects a state from torchmem's "
              "getCheckpointState (a checkpoint taken under another allocator cannot be "
              "restored)");
  absl::StatusOr<CheckpointRestore> restored =
      EngineOf(device).RestorePoolCheckpoint(pool_state->checkpoint);
  CheckPoolStatus(restored.status());
  cca::CheckpointDelta delta;
  for (std::uintptr_t address : restored->freed) {
    delta.ptrs_freed.push_back(reinterpret_cast<void*>(address));
  }
  for (std::uintptr_t address : restored->allocated) {
    void* ptr = reinterpret_cast<void*>(address);
    delta.dataptrs_allocd.emplace_back(ptr, ptr, &RawDeleteCached,
                                       c10::Device(c10::DeviceType::CUDA, device));
  }
  return delta;
}

}  // namespace torchmem::torch_glue
