// TorchmemCudaAllocatorImpl: statistics, snapshots and history in PyTorch's
// types, so torch.cuda.memory_stats / memory_summary / _snapshot /
// _record_memory_history / _dump_snapshot report torchmem's engines.
//
// History: recordHistory turns on the engines' trace rings and torchmem's
// own Python stack capture (cheap: code object + offset per frame, interned)
// instead of calling PyTorch's recorder at every allocation; contexts are
// turned into PyTorch's CapturedTraceback only when a snapshot is taken
// (traceback_contexts.h); TorchScript frames, and C++ frames when PyTorch's
// recorder gathers them (stacks="all"), are added as PyTorch's recorders
// add them (history_contexts.h). `when` is honoured as PyTorch does: STATE
// keeps stacks for live blocks, ALLOC also for trace entries, ALL records
// frees with the freeing code's stack.
#include <algorithm>
#include <string>
#include <vector>

#include <c10/core/AllocatorConfig.h>
#include <c10/cuda/CUDAAllocatorConfig.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/util/ApproximateClock.h>

#include "torchmem/core/context_capture.h"
#include "torchmem/core/trace_labels.h"
#include "torchmem/torch/cuda/cuda_allocator_impl.h"
#include "torchmem/torch/cuda/history_contexts.h"
#include "torchmem/torch/cuda/traceback_contexts.h"

namespace torchmem::torch_glue {
namespace {

using c10::CachingAllocator::AcceleratorAllocatorConfig;
using c10::CachingDeviceAllocator::DeviceStats;
using c10::cuda::CUDACachingAllocator::CUDAAllocatorConfig;
using TorchStat = c10::CachingAllocator::Stat;
using TorchStatArray = c10::CachingAllocator::StatArray;
using TorchStatType = c10::CachingAllocator::StatType;

TorchStat ToTorch(const Stat& stat) {
  TorchStat out;
  out.current = stat.current;
  out.peak = stat.peak;
  out.allocated = stat.allocated;
  out.freed = stat.freed;
  return out;
}

TorchStatArray ToTorch(const StatArray& array) {
  TorchStatArray out;
  out[static_cast<std::size_t>(TorchStatType::AGGREGATE)] = ToTorch(array.all());
  out[static_cast<std::size_t>(TorchStatType::SMALL_POOL)] = ToTorch(array.pool(PoolKind::kSmall));
  out[static_cast<std::size_t>(TorchStatType::LARGE_POOL)] = ToTorch(array.pool(PoolKind::kLarge));
  return out;
}

cca::TraceEntry::Action ToTorch(TraceAction action) {
  switch (action) {
    case TraceAction::kAlloc:
      return cca::TraceEntry::ALLOC;
    case TraceAction::kFreeRequested:
      return cca::TraceEntry::FREE_REQUESTED;
    case TraceAction::kFreeCompleted:
      return cca::TraceEntry::FREE_COMPLETED;
    case TraceAction::kSegmentAlloc:
      return cca::TraceEntry::SEGMENT_ALLOC;
    case TraceAction::kSegmentFree:
      return cca::TraceEntry::SEGMENT_FREE;
    case TraceAction::kSegmentMap:
      return cca::TraceEntry::SEGMENT_MAP;
    case TraceAction::kSegmentUnmap:
      return cca::TraceEntry::SEGMENT_UNMAP;
    case TraceAction::kOom:
      return cca::TraceEntry::OOM;
    case TraceAction::kSnapshot:
      return cca::TraceEntry::SNAPSHOT;
    case TraceAction::kAnnotate:
#if TORCHMEM_TORCH_VERSION_AT_LEAST(2, 14)
      return cca::TraceEntry::ANNOTATE;
#else
      break;  // annotateMemory (and ANNOTATE) arrived in torch 2.14: none made
#endif
  }
  return cca::TraceEntry::SNAPSHOT;
}

// An engine trace entry as PyTorch's, timestamped in microseconds (what
// snapshots carry), with its stack if `context` is given.
cca::TraceEntry ToTorch(const TraceEntry& entry, int device,
                        std::shared_ptr<c10::GatheredContext> context) {
  // PyTorch's text for "no compile context".
  std::string compile_context = entry.compile_context != kNoTraceLabel
                                    ? TraceLabelText(entry.compile_context)
                                    : std::string("N/A");
  cca::TraceEntry out(ToTorch(entry.action), static_cast<c10::DeviceIndex>(device), entry.address,
                      entry.size, reinterpret_cast<TorchTraceStream>(entry.stream),
                      ToMempoolId(entry.pool), /*time=*/0, std::move(context),
                      std::move(compile_context)
#if TORCHMEM_TORCH_VERSION_AT_LEAST(2, 10)  // user metadata arrived in 2.10
                          ,
                      TraceLabelText(entry.user_metadata)
#endif
  );
  out.time_.t_ = static_cast<time_t>(entry.time_us);
  return out;
}

// Whether a trace entry of `action` carries a stack when history records
// with `when` (PyTorch: ALLOC and up stack every entry; ALL captures frees'
// stacks at the free, which the engine then records).
bool TraceWantsContext(cca::RecordContext when) { return when >= cca::RecordContext::ALLOC; }

cca::SegmentInfo ToTorch(const SegmentInfo& segment, int device, c10::MempoolId_t asked,
                         ContextCache& contexts, bool with_contexts) {
  cca::SegmentInfo out;
  out.device = static_cast<c10::DeviceIndex>(device);
#if TORCHMEM_TORCH_VERSION_AT_LEAST(2, 11)  // registration counters arrived in 2.11
  out.registration_counter = static_cast<int32_t>(segment.registration);
#endif
  out.address = segment.address;
  out.stream = reinterpret_cast<decltype(out.stream)>(segment.stream);
  out.is_large = segment.pool == PoolKind::kLarge;
  out.is_expandable = segment.vmm;
  // As PyTorch: a snapshot of one pool names it; a full snapshot names each.
  const bool whole = asked.first == 0 && asked.second == 0;
  if (whole || ToPoolId(asked) == segment.owner)
    out.owner_private_pool_id = ToMempoolId(segment.owner);
  if (with_contexts) out.context_when_allocated = contexts.Get(segment.context);
  std::size_t blocks = segment.blocks.size();
  // As PyTorch shows an expandable segment: up to the end of its last used
  // block; the free tail of the reserved range (address space only) is not
  // memory.
  if (segment.vmm && blocks > 0 && segment.blocks.back().state == BlockState::kFree) --blocks;
  for (std::size_t i = 0; i < blocks; ++i) {
    const BlockInfo& block = segment.blocks[i];
    cca::BlockInfo info;
    info.size = block.size;
    info.requested_size =
        block.state == BlockState::kFree ? block.last_requested_size : block.requested_size;
    info.allocated = block.state == BlockState::kAllocated;
    info.active = block.state != BlockState::kFree;
    if (with_contexts && info.active) info.context_when_allocated = contexts.Get(block.context);
    out.total_size += block.size;
    if (info.allocated) out.allocated_size += block.size;
    if (info.active) {
      out.active_size += block.size;
      out.requested_size += block.requested_size;
    }
    out.blocks.push_back(std::move(info));
  }
  return out;
}

// Feeds PyTorch's trace trackers. Called under an engine's lock, as PyTorch
// calls its trackers under its device lock: trackers must not call back into
// the allocator.
TraceListener TraceListenerFor(int device, std::vector<cca::AllocatorTraceTracker> trackers) {
  return [trackers = std::move(trackers), device](const TraceEntry& entry) {
    const cca::TraceEntry converted = ToTorch(entry, device, nullptr);
    for (const auto& tracker : trackers) tracker(converted);
  };
}

}  // namespace

// --- statistics -------------------------------------------------------------

DeviceStats TorchmemCudaAllocatorImpl::getDeviceStats(c10::DeviceIndex device) {
  const MemoryStats stats = EngineOf(device).GetStats();
  DeviceStats out;
  out.allocation = ToTorch(stats.allocation);
  out.segment = ToTorch(stats.segment);
  out.active = ToTorch(stats.active);
  out.inactive_split = ToTorch(stats.inactive_split);
  out.allocated_bytes = ToTorch(stats.allocated_bytes);
  out.reserved_bytes = ToTorch(stats.reserved_bytes);
  out.active_bytes = ToTorch(stats.active_bytes);
  out.inactive_split_bytes = ToTorch(stats.inactive_split_bytes);
  out.requested_bytes = ToTorch(stats.requested_bytes);
#if TORCHMEM_TORCH_VERSION_AT_LEAST(2, 13)  // per-pool reserved bytes arrived in 2.13
  for (const auto& [pool, array] : stats.reserved_bytes_by_private_pools) {
    out.reserved_bytes_by_private_pools[{pool.first, pool.second}] = ToTorch(array);
  }
#endif
  out.num_alloc_retries = stats.num_alloc_retries;
  out.num_ooms = stats.num_ooms;
  out.oversize_allocations = ToTorch(stats.oversize_allocations);
  out.oversize_segments = ToTorch(stats.oversize_segments);
  out.num_sync_all_streams = stats.num_sync_all_streams;
  out.num_device_alloc = stats.num_device_alloc;
  out.num_device_free = stats.num_device_free;
#if TORCHMEM_TORCH_VERSION_AT_LEAST(2, 12)  // arrived with the OOM-rejection observers
  out.num_oom_rejections = stats.num_oom_rejections;
#endif
  out.max_split_size = stats.max_split_size;
  return out;
}

void TorchmemCudaAllocatorImpl::resetAccumulatedStats(c10::DeviceIndex device) {
  EngineOf(device).ResetAccumulatedStats();
}

void TorchmemCudaAllocatorImpl::resetPeakStats(c10::DeviceIndex device) {
  Engine& engine = EngineOf(device);
  engine.ResetPeakStats();
  engine.ResetTagPeaks();
}

// --- snapshots --------------------------------------------------------------

cca::SnapshotInfo TorchmemCudaAllocatorImpl::TakeSnapshot(c10::MempoolId_t pool,
                                                          bool include_traces) {
  cca::RecordContext when;
  std::vector<TorchAnnotationEntry> annotations;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    when = history_when_;
    annotations = annotations_;
  }
  cca::SnapshotInfo result;
  // One trace list per device, as PyTorch's (devices without an engine yet
  // have an empty one).
  int devices = static_cast<int>(c10::cuda::device_count());
  std::vector<std::pair<int, Engine*>> engines = CudaEngines();
  for (const auto& [device, engine] : engines) devices = std::max(devices, device + 1);
  result.device_traces.resize(devices);
  ContextCache contexts;
  for (const auto& [device, engine] : engines) {
    if (include_traces) {
      for (const TraceEntry& entry : engine->GetTrace()) {
        std::shared_ptr<c10::GatheredContext> context;
        if (TraceWantsContext(when)) context = contexts.Get(entry.context);
        result.device_traces[device].push_back(ToTorch(entry, device, std::move(context)));
      }
    }
    for (const SegmentInfo& segment : engine->GetSegments(ToPoolId(pool))) {
      result.segments.push_back(ToTorch(segment, device, pool, contexts, /*with_contexts=*/true));
    }
    engine->RecordSnapshotEvent();
  }
  std::sort(
      result.segments.begin(), result.segments.end(),
      [](const cca::SegmentInfo& a, const cca::SegmentInfo& b) { return a.address < b.address; });
  result.external_annotations = std::move(annotations);

  cca::AllocatorConfigInfo& config = result.config_metadata;
  config.garbage_collection_threshold = AcceleratorAllocatorConfig::garbage_collection_threshold();
  config.max_split_size = AcceleratorAllocatorConfig::max_split_size();
  config.pinned_num_register_threads = CUDAAllocatorConfig::pinned_num_register_threads();
  config.expandable_segments = AcceleratorAllocatorConfig::use_expandable_segments();
  config.release_lock_on_malloc = CUDAAllocatorConfig::release_lock_on_cudamalloc();
  config.pinned_use_host_register = CUDAAllocatorConfig::pinned_use_cuda_host_register();
  config.graph_capture_record_stream_reuse =
      CUDAAllocatorConfig::graph_capture_record_stream_reuse();
  config.last_allocator_settings = AcceleratorAllocatorConfig::last_allocator_settings();
  config.roundup_power2_divisions = AcceleratorAllocatorConfig::roundup_power2_divisions();
#if TORCHMEM_TORCH_VERSION_AT_LEAST(2, 13)  // the pinned-memory cache's knobs arrived in 2.13
  config.max_round_threshold = AcceleratorAllocatorConfig::pinned_max_round_threshold();
  config.max_cached_size = AcceleratorAllocatorConfig::pinned_max_cached_size();
#endif
  return result;
}

std::shared_ptr<c10::GatheredContext> TorchmemCudaAllocatorImpl::ContextForPointer(
    const void* ptr) {
  for (const auto& [device, engine] : CudaEngines()) {
    absl::StatusOr<BlockInfo> block = engine->GetBlock(ptr);
    if (block.ok()) return ContextFor(block->context);
  }
  return nullptr;
}

// --- history ----------------------------------------------------------------

void TorchmemCudaAllocatorImpl::RecordHistory(bool enabled, cca::CreateContextFn recorder,
                                              size_t max_entries, cca::RecordContext when,
                                              bool clear,
                                              const std::vector<std::string>& skip_actions) {
  TORCH_CHECK(!enabled || max_entries > 0, "max_entries must be positive");
  // torchmem captures stacks itself (see the file comment); the recorder
  // only says whether PyTorch's would have gathered C++ frames.
  const bool want_stacks = enabled && when != cca::RecordContext::NEVER;
  SetHistoryCppFrames(want_stacks && RecorderGathersCpp(recorder));
  std::uint32_t skip_mask = 0;
  for (const std::string& name : skip_actions) {
    TraceAction action;
    if (ParseTraceAction(name.c_str(), &action)) skip_mask |= 1u << static_cast<int>(action);
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    history_enabled_ = enabled;
    history_when_ = enabled ? when : cca::RecordContext::NEVER;
    history_max_entries_ = enabled ? max_entries : 0;
    history_skip_mask_ = skip_mask;
    if (want_stacks != capture_requested_) {
      want_stacks ? RequestContextCapture() : ReleaseContextCapture();
      capture_requested_ = want_stacks;
    }
    if (!enabled || clear) annotations_.clear();
  }
  for (const auto& [device, engine] : CudaEngines()) {
    if (!enabled || clear) engine->SetTraceCapacity(0);  // drops what was recorded
    ApplyHistoryTo(device, *engine, /*history_changed=*/true);
  }
}

void TorchmemCudaAllocatorImpl::ApplyHistoryTo(int device, Engine& engine, bool history_changed) {
  bool enabled;
  std::size_t max_entries;
  std::uint32_t skip_mask;
  cca::RecordContext when;
  std::vector<cca::AllocatorTraceTracker> trackers;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    enabled = history_enabled_;
    max_entries = history_max_entries_;
    skip_mask = history_skip_mask_;
    when = history_when_;
    trackers = trace_trackers_;
  }
  // A new engine keeps a history torchmem.record_trace() asked for, unless
  // PyTorch's history is on.
  if (history_changed || enabled) {
    engine.SetTraceCapacity(enabled ? max_entries : 0, /*clear=*/false);
    engine.SetTraceSkipActions(skip_mask);
    engine.SetTraceFreeContext(enabled && when == cca::RecordContext::ALL);
    // PyTorch's TorchScript and C++ frames while its history wants stacks.
    const bool want_stacks = enabled && when != cca::RecordContext::NEVER;
    engine.SetContextCaptureOverride(want_stacks ? &CaptureWithTorchFrames : nullptr);
  }
  if (!trackers.empty()) engine.SetTraceListener(TraceListenerFor(device, std::move(trackers)));
}

bool TorchmemCudaAllocatorImpl::isHistoryEnabled() {
  std::lock_guard<std::mutex> lock(mutex_);
  return history_enabled_;
}

void TorchmemCudaAllocatorImpl::recordAnnotation(
    const std::vector<std::pair<std::string, std::string>>& md) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!history_enabled_) return;
  c10::DeviceIndex device = 0;
  (void)c10::cuda::GetDevice(&device);
  TorchAnnotationEntry entry(device, /*time=*/0);
  entry.time_.t_ = static_cast<time_t>(TraceNowMicros());
  for (const auto& [name, value] : md) entry.recordUserMetadata(name, value);
  annotations_.push_back(std::move(entry));
  if (annotations_.size() > std::max<std::size_t>(history_max_entries_, 1)) {
    annotations_.erase(annotations_.begin());
  }
}

// Labels of trace entries (core/trace_labels.h): user metadata and compile
// contexts are stamped on entries as they are recorded, as PyTorch does.
void TorchmemCudaAllocatorImpl::SetTraceMetadata(const std::string& metadata) {
  SetTraceUserMetadata(InternTraceLabel(metadata));
}

std::string TorchmemCudaAllocatorImpl::TraceMetadata() {
  return TraceLabelText(TraceUserMetadata());
}

void TorchmemCudaAllocatorImpl::Annotate(const void* ptr, const std::string& metadata) {
  const TraceLabel label = InternTraceLabel(metadata);
  for (const auto& [device, engine] : CudaEngines()) {
    absl::Status status = engine->RecordAnnotation(ptr, label);
    if (status.ok()) return;
  }
  TORCH_CHECK(false, "torchmem: cannot annotate ", ptr,
              ": it is not the start of a live CUDA allocation (annotate the tensor's "
              "untyped_storage().data_ptr())");
}

void TorchmemCudaAllocatorImpl::pushCompileContext(std::string& md) {
  PushTraceCompileContext(InternTraceLabel(md));
}

void TorchmemCudaAllocatorImpl::popCompileContext() { PopTraceCompileContext(); }

// --- trace trackers -----------------------------------------------------------

void TorchmemCudaAllocatorImpl::attachAllocatorTraceTracker(cca::AllocatorTraceTracker tracker) {
  std::vector<cca::AllocatorTraceTracker> trackers;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    trace_trackers_.push_back(std::move(tracker));
    trackers = trace_trackers_;
  }
  for (const auto& [device, engine] : CudaEngines()) {
    engine->SetTraceListener(TraceListenerFor(device, trackers));
  }
}

}  // namespace torchmem::torch_glue
