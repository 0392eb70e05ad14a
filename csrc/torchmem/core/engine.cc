// Engine: construction, and the fast path in one place: Allocate, Free and
// the bookkeeping helpers they share (best fit, split and merge, accounting).
// The other parts live in their own files (docs/engine-layout.md): events and
// captures (engine_events.cc), private pools and checkpoints
// (engine_pools.cc), releasing cached memory (engine_cache.cc), reports
// (engine_reports.cc), leak-check scopes (engine_scopes.cc), settings
// (engine_settings.cc), the allocation history (engine_trace.cc), the
// virtual-memory placement (engine_vmm.cc), invariants (engine_invariants.cc).
#include "torchmem/core/engine.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <utility>

#include "absl/base/optimization.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "torchmem/core/context_capture.h"
#include "torchmem/core/fork_safety.h"
#include "torchmem/core/format.h"

namespace torchmem {
namespace {

std::atomic<OutOfMemoryRetryHook> g_oom_retry_hook{nullptr};

struct EngineRegistry {
  Mutex mutex;
  std::vector<Engine*> engines ABSL_GUARDED_BY(mutex);
};

// Leaked on purpose: engines may outlive static destruction (the torch glue
// keeps its engines for the life of the process).
EngineRegistry& Registry() {
  static EngineRegistry* registry = new EngineRegistry;
  return *registry;
}

constexpr std::size_t kBlocksPerChunk = 256;

// Whether a CUDA graph is being captured in any engine of the process. The
// out-of-memory retry hook runs Python's garbage collector, whose finalizers
// may make calls a capture forbids from any thread in its default (global)
// mode: cudaFree, event queries, synchronization.
bool AnyCaptureUnderway() {
  EngineRegistry& registry = Registry();
  MutexLock lock(&registry.mutex);
  for (const Engine* engine : registry.engines) {
    if (engine->CaptureUnderway()) return true;
  }
  return false;
}

}  // namespace

void SetOutOfMemoryRetryHook(OutOfMemoryRetryHook hook) {
  g_oom_retry_hook.store(hook, std::memory_order_release);
}

Engine::Engine(std::unique_ptr<Backend> backend, EngineOptions options)
    : backend_(std::move(backend)), device_name_(backend_->DeviceName()) {
  if (absl::Status valid = options.policy.Validate(); !valid.ok()) {
    std::fprintf(stderr, "torchmem: invalid size policy: %s\n", valid.ToString().c_str());
    std::abort();
  }
  {
    MutexLock lock(&mutex_);
    policy_ = options.policy;
    policy_.Refresh();
    stats_.max_split_size =
        policy_.HasMaxSplit() ? static_cast<std::int64_t>(policy_.max_split_size) : -1;
    memory_limit_ = options.memory_limit_bytes;
    gc_threshold_ = options.garbage_collection_threshold;
  }
  if (absl::Status placed = SetPlacement(options.placement); !placed.ok()) {
    std::fprintf(stderr, "torchmem: %s\n", placed.ToString().c_str());
    std::abort();
  }
  InstallForkHandlers();
  EngineRegistry& registry = Registry();
  MutexLock lock(&registry.mutex);
  registry.engines.push_back(this);
}

Engine::~Engine() {
  {
    EngineRegistry& registry = Registry();
    MutexLock lock(&registry.mutex);
    registry.engines.erase(std::remove(registry.engines.begin(), registry.engines.end(), this),
                           registry.engines.end());
  }
  MutexLock lock(&mutex_);
  for (auto& [stream, queue] : pending_events_) {
    for (const PendingEvent& pending : queue) backend_->ReleaseEvent(pending.event);
  }
  if (HasVmmSpaces()) {
    for (const std::unique_ptr<VmmSpace>& space : vmm_) space->ReleaseEverything();
  }
  for (auto& [address, segment] : segments_) {
    if (segment->vmm) {
      (void)backend_->ReleaseAddressRange(segment->reservation, segment->reservation_size);
    } else {
      (void)BackendRelease(address, segment->size, segment->owner);
    }
  }
}

// --- allocation -------------------------------------------------------------

absl::StatusOr<void*> Engine::Allocate(std::size_t size, StreamId stream) {
  if (ABSL_PREDICT_FALSE(size == 0 || size > kMaxRequestBytes)) {
    if (size == 0) {
      return absl::InvalidArgumentError(
          "torchmem: cannot allocate 0 bytes (PyTorch returns a null pointer for empty "
          "tensors without asking the allocator)");
    }
    return absl::InvalidArgumentError(absl::StrFormat(
        "torchmem: cannot allocate %d bytes: requests above %s are rejected; check the "
        "tensor's shape and dtype",
        size, FormatBytes(static_cast<std::int64_t>(kMaxRequestBytes))));
  }
  const Attribution attribution = CurrentAttribution();
  const ContextId context = CaptureContext(&context_capture_override_);
  absl::Status failure;
  const CacheMissHook miss_hook = cache_miss_hook_.load(std::memory_order_acquire);
  bool cache_missed = false;
  {
    MutexLock lock(&mutex_);
    absl::StatusOr<Block*> block = AllocateLocked(size, stream, attribution, context,
                                                  miss_hook != nullptr ? &cache_missed : nullptr);
    if (ABSL_PREDICT_TRUE(block.ok())) {
      if (ABSL_PREDICT_TRUE(!cache_missed)) return reinterpret_cast<void*>((*block)->address);
    } else {
      failure = block.status();
    }
  }
  // The miss hook runs without the lock (its callbacks free memory through
  // us), once per allocation: on a miss, or when the virtual-memory
  // placement found no room. Then the allocation looks again.
  const bool run_miss_hook =
      miss_hook != nullptr && (cache_missed || absl::IsResourceExhausted(failure));
  if (run_miss_hook) {
    (void)miss_hook();  // looked again either way: a miss then obtains memory
    MutexLock lock(&mutex_);
    absl::StatusOr<Block*> block = AllocateLocked(size, stream, attribution, context);
    if (block.ok()) return reinterpret_cast<void*>((*block)->address);
    failure = block.status();
  }
  if (!absl::IsResourceExhausted(failure)) return failure;
  // The last rung of the ladder runs without the lock: the hook may run
  // Python's garbage collector, whose finalizers free memory through us.
  OutOfMemoryRetryHook hook = g_oom_retry_hook.load(std::memory_order_acquire);
  if (hook != nullptr && !AnyCaptureUnderway() && hook()) {
    MutexLock lock(&mutex_);
    absl::StatusOr<Block*> block = AllocateLocked(size, stream, attribution, context);
    if (block.ok()) return reinterpret_cast<void*>((*block)->address);
    failure = block.status();
    if (!absl::IsResourceExhausted(failure)) return failure;
  }
  MutexLock lock(&mutex_);
  ++stats_.num_ooms;
  if (Tracing()) {
    std::size_t device_free = 0;
    if (absl::StatusOr<std::size_t> free_bytes = backend_->FreeBytes(); free_bytes.ok()) {
      device_free = *free_bytes;
    }
    Trace(TraceAction::kOom, device_free, size, stream, context,
          routes_.empty() ? nullptr : RouteFor(stream));
  }
  const std::size_t rounded = policy_.RoundSize(size);
  return absl::ResourceExhaustedError(OutOfMemoryMessage(size, rounded, failure));
}

absl::StatusOr<Block*> Engine::AllocateLocked(std::size_t size, StreamId stream,
                                              const Attribution& attribution, ContextId context,
                                              bool* cache_missed) {
  if (ABSL_PREDICT_FALSE(outstanding_events_ > 0 || !deferred_until_no_capture_.empty())) {
    if (absl::Status events = ProcessEventsLocked(); !events.ok()) return events;
  }
  const std::size_t rounded = policy_.RoundSize(size);
  const PoolKind kind = policy_.PoolFor(rounded);
  PrivatePool* owner = ABSL_PREDICT_TRUE(routes_.empty()) ? nullptr : RouteFor(stream);
  StreamLists& stream_lists = owner == nullptr ? ListsFor(stream) : PoolListsFor(owner, stream);
  FreeLists& lists = stream_lists.pools[static_cast<int>(kind)];
  // Garbage collection ages blocks by lookups in the default large pool,
  // as PyTorch does (only while a collection threshold is set).
  if (ABSL_PREDICT_FALSE(gc_threshold_ > 0.0) && owner == nullptr && kind == PoolKind::kLarge) {
    ++gc_clock_;
  }
  if (ABSL_PREDICT_FALSE(placement_ == Placement::kVirtualMemory) &&
      (owner == nullptr || (!owner->no_split && owner->source == nullptr))) {
    // A MemPool that never splits keeps PyTorch's segments: a range is one
    // block until split. A pool with its own allocator gets its memory
    // from that allocator only.
    absl::StatusOr<Block*> placed = AllocateInRange(rounded, kind, stream, owner, context);
    if (!placed.ok()) {
      DropStreamListsIfEmpty(owner, stream);
      return placed.status();
    }
    // A block lent by a use_on_oom pool lives in that pool's range or segment.
    if (ABSL_PREDICT_FALSE((*placed)->owner() != owner)) DropStreamListsIfEmpty(owner, stream);
    MarkAllocated(*placed, size, attribution, context);
    return *placed;
  }
  // Best fit over this stream's free blocks of the pool: O(1), and in the
  // common case of a training loop, a block of exactly this size.
  Block* block = TakeCachedBlock(lists, rounded);
  if (block == nullptr && cache_missed != nullptr) {
    *cache_missed = true;
    DropStreamListsIfEmpty(owner, stream);
    return nullptr;
  }
  if (block == nullptr) {
    absl::StatusOr<Block*> fresh = NewSegment(rounded, kind, stream, owner, context);
    if (!fresh.ok()) {
      DropStreamListsIfEmpty(owner, stream);
      return fresh.status();
    }
    block = *fresh;
    // A block lent by a use_on_oom pool lives in that pool's lists: the lists
    // made for this stream above may still hold no segment.
    if (ABSL_PREDICT_FALSE(block->owner() != owner)) DropStreamListsIfEmpty(owner, stream);
  }
  const bool no_split = block->owner() != nullptr && block->owner()->no_split;
  if (block->size != rounded && !no_split &&
      policy_.ShouldSplit(block->pool(), block->size, rounded)) {
    SplitBlock(block, rounded);
  }
  MarkAllocated(block, size, attribution, context);
  return block;
}

PrivatePool* Engine::RouteFor(StreamId stream) {
  // Newest route first, as PyTorch searches its captures underway.
  for (auto it = routes_.rbegin(); it != routes_.rend(); ++it) {
    if (it->filter(stream)) {
      auto pool = private_pools_.find(it->pool);
      if (pool != private_pools_.end()) return pool->second.get();
    }
  }
  return nullptr;
}

Block* Engine::TakeCachedBlock(FreeLists& lists, std::size_t rounded) {
  if (ABSL_PREDICT_TRUE(!policy_.HasMaxSplit())) return lists.TakeBestFit(rounded);
  Block* block = lists.PeekBestFit(rounded);
  if (block == nullptr || !policy_.MayServe(block->size, rounded)) return nullptr;
  lists.Remove(block);
  return block;
}

absl::StatusOr<Block*> Engine::NewSegment(std::size_t rounded_size, PoolKind pool, StreamId stream,
                                          PrivatePool* owner, ContextId context) {
  const std::size_t segment_size = policy_.SegmentSizeFor(rounded_size);
  if (absl::Status allowed = backend_->CheckSegmentAllocationAllowed(stream); !allowed.ok()) {
    return allowed;
  }
  // Releasing segments (cudaFree) is not allowed during a capture: the
  // collection and the release rungs below wait for it to end.
  const bool capturing = CaptureUnderwayLocked();
  if (ABSL_PREDICT_FALSE(gc_threshold_ > 0.0 && memory_limit_ != 0) && !capturing) {
    CollectGarbage();
  }
  absl::StatusOr<std::uintptr_t> address = BackendAllocate(segment_size, stream, owner);
  if (!address.ok() && absl::IsResourceExhausted(address.status())) {
    // A MemPool that opted in (use_on_oom) lends its free blocks to the
    // default pool before anything is released.
    if (owner == nullptr) {
      if (Block* lent = TakeFromUseOnOomPools(rounded_size, pool, stream)) return lent;
    }
    StreamLists& stream_lists = owner == nullptr ? ListsFor(stream) : PoolListsFor(owner, stream);
    FreeLists& lists = stream_lists.pools[static_cast<int>(pool)];
    // Second rung: release oversize blocks enough for this request
    // (PyTorch's release_available_cached_blocks).
    if (policy_.HasMaxSplit() && !capturing && ReleaseOversizeBlocks(lists, segment_size)) {
      address = BackendAllocate(segment_size, stream, owner);
    }
    // Third rung: give every releasable cached segment back, then ask
    // again. Not during a capture: that needs event synchronization.
    if (!address.ok() && absl::IsResourceExhausted(address.status()) && !capturing) {
      ++stats_.num_alloc_retries;
      // A broken event is raised, not reported as a full device.
      if (absl::Status synced = SynchronizeAllEvents(); !synced.ok()) return synced;
      absl::Status reclaimed = ReleaseFreeSegments(/*default_pool=*/true);
      address = BackendAllocate(segment_size, stream, owner);
      if (!address.ok() && !reclaimed.ok()) {
        // Say why the cache could not make room, or the error would blame a
        // full device while the cache still holds the memory.
        address = absl::Status(
            address.status().code(),
            absl::StrCat(address.status().message(),
                         "; the cache could not make room first: ", reclaimed.message()));
      }
    }
  }
  if (!address.ok()) return address.status();

  StreamLists& stream_lists = owner == nullptr ? ListsFor(stream) : PoolListsFor(owner, stream);
  auto segment = std::make_unique<Segment>();
  segment->address = *address;
  segment->size = segment_size;
  segment->pool = pool;
  segment->stream = stream;
  segment->lists = &stream_lists.pools[static_cast<int>(pool)];
  segment->stream_lists = &stream_lists;
  segment->owner = owner;
  segment->registration = next_segment_registration_++;
  segment->context = context;
  ++stream_lists.segments;
  Block* block = NewBlock();
  block->address = *address;
  block->size = segment_size;
  block->segment = segment.get();
  segment->first = block;
  blocks_.emplace(block->address, block);
  const auto bytes = static_cast<std::int64_t>(segment_size);
  stats_.segment.Increase(pool, 1);
  stats_.reserved_bytes.Increase(pool, bytes);
  if (owner != nullptr) {
    ++owner->segments;
    stats_.reserved_bytes_by_private_pools[{owner->id.first, owner->id.second}].Increase(pool,
                                                                                         bytes);
  }
  if (ABSL_PREDICT_FALSE(policy_.IsOversize(segment_size))) {
    segment->counted_oversize = true;
    stats_.oversize_segments.Increase(1);
  }
  ++stats_.num_device_alloc;
  if (ABSL_PREDICT_FALSE(Tracing())) {
    Trace(TraceAction::kSegmentAlloc, *address, segment_size, stream, context, owner);
  }
  segments_.emplace(segment->address, std::move(segment));
  return block;
}

absl::StatusOr<std::uintptr_t> Engine::BackendAllocate(std::size_t segment_size, StreamId stream,
                                                       PrivatePool* owner) {
  const std::int64_t reserved = stats_.reserved_bytes.all().current;
  if (memory_limit_ != 0 && static_cast<std::size_t>(reserved) + segment_size > memory_limit_) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "a new %s segment would take reserved memory to %s, over the memory limit of %s",
        FormatBytes(static_cast<std::int64_t>(segment_size)),
        FormatBytes(reserved + static_cast<std::int64_t>(segment_size)),
        FormatBytes(static_cast<std::int64_t>(memory_limit_))));
  }
  absl::StatusOr<std::uintptr_t> address =
      owner != nullptr && owner->source != nullptr
          ? owner->source->AllocateSegment(segment_size, stream)
          : backend_->AllocateSegment(segment_size, stream);
  if (address.ok() && *address % policy_.min_block_size != 0) {
    (void)BackendRelease(*address, segment_size, owner);
    return absl::InternalError(
        absl::StrFormat("backend %s returned a segment at %#x, not aligned to %d bytes",
                        device_name_, *address, policy_.min_block_size));
  }
  return address;
}

absl::Status Engine::BackendRelease(std::uintptr_t address, std::size_t size,
                                    const PrivatePool* owner) {
  if (owner != nullptr && owner->source != nullptr) {
    return owner->source->ReleaseSegment(address, size);
  }
  return backend_->ReleaseSegment(address, size);
}

void Engine::SplitBlock(Block* block, std::size_t size) {
  // A split segment holds the memory of more than the allocation that made
  // it: from now on it names no allocating context (PyTorch's rule: its
  // snapshot names a segment's cudaMalloc site only while it is unsplit).
  block->segment->context = kNoContext;
  RemoveInactiveSplit(block);
  Block* rest = NewBlock();
  rest->address = block->address + size;
  rest->size = block->size - size;
  rest->segment = block->segment;
  rest->prev = block;
  rest->next = block->next;
  if (block->next != nullptr) block->next->prev = rest;
  block->next = rest;
  block->size = size;
  blocks_.emplace(rest->address, rest);
  AddInactiveSplit(block);
  AddInactiveSplit(rest);
  InsertMerged(rest);
}

void Engine::InsertMerged(Block* block) {
  FreeLists& lists = *block->segment->lists;
  // Only indexed neighbours merge: an unindexed free block is one the
  // engine is handing out right now (the head of a block being split).
  auto detach_if_free = [&lists](Block* neighbour) {
    if (neighbour == nullptr || neighbour->state != BlockState::kFree ||
        neighbour->index == FreeIndex::kNone) {
      return false;
    }
    lists.Remove(neighbour);
    return true;
  };
  if (detach_if_free(block->prev)) {
    Block* prev = block->prev;
    AbsorbNeighbour(prev, block);
    block = prev;
  }
  if (detach_if_free(block->next)) AbsorbNeighbour(block, block->next);
  block->cached_at = gc_clock_;
  lists.Insert(block);
}

void Engine::AbsorbNeighbour(Block* block, Block* neighbour) {
  RemoveInactiveSplit(block);
  RemoveInactiveSplit(neighbour);
  block->size += neighbour->size;
  // The merged block remembers the newest allocation made from its memory:
  // PyTorch's snapshots show a free block's last requested size.
  if (neighbour->sequence > block->sequence) {
    block->requested_size = neighbour->requested_size;
    block->sequence = neighbour->sequence;
  }
  block->next = neighbour->next;
  if (neighbour->next != nullptr) neighbour->next->prev = block;
  blocks_.erase(neighbour->address);
  DeleteBlock(neighbour);
  AddInactiveSplit(block);
}

void Engine::MarkAllocated(Block* block, std::size_t requested, const Attribution& attribution,
                           ContextId context) {
  RemoveInactiveSplit(block);
  ApplyInactiveSplitChange(block->pool());  // with the split that made `block`, if any
  block->state = BlockState::kAllocated;
  block->requested_size = requested;
  block->tag = attribution.tag;
  block->scope = attribution.scope;
  block->context = context;
  block->sequence = next_sequence_++;
  const PoolKind pool = block->pool();
  const auto bytes = static_cast<std::int64_t>(block->size);
  const auto requested_bytes = static_cast<std::int64_t>(requested);
  stats_.allocation.Increase(pool, 1);
  stats_.allocated_bytes.Increase(pool, bytes);
  stats_.requested_bytes.Increase(pool, requested_bytes);
  stats_.active.Increase(pool, 1);
  stats_.active_bytes.Increase(pool, bytes);
  if (ABSL_PREDICT_FALSE(policy_.IsOversize(block->size))) {
    block->counted_oversize = true;
    stats_.oversize_allocations.Increase(1);
  }

  TagCounters& tag = CountersFor(attribution.tag);
  tag.current_bytes += bytes;
  tag.peak_bytes = std::max(tag.peak_bytes, tag.current_bytes);
  tag.current_requested_bytes += requested_bytes;
  ++tag.live_blocks;
  ++tag.total_allocations;
  tag.total_allocated_bytes += bytes;

  if (attribution.scope != kNoScope) {
    if (ScopeBlocks* list = ScopeListFor(attribution.scope)) LinkToScope(block, list);
  }
  if (ABSL_PREDICT_FALSE(Tracing())) {
    Trace(TraceAction::kAlloc, block->address, requested, block->stream(), context, block->owner());
  }
}

// --- free -------------------------------------------------------------------

// The context of a free, for traces that want the freeing code's stack
// (captured before the lock: the hook must not run under it).
static ContextId FreeContext(const std::atomic<bool>& wanted,
                             const std::atomic<ContextCaptureFn>& override_hook) {
  return ABSL_PREDICT_FALSE(wanted.load(std::memory_order_relaxed)) ? CaptureContext(&override_hook)
                                                                    : kNoContext;
}

absl::Status Engine::Free(void* ptr) {
  const ContextId context = FreeContext(trace_free_context_, context_capture_override_);
  MutexLock lock(&mutex_);
  return FreeLocked(ptr, nullptr, context);
}

absl::Status Engine::FreeSized(void* ptr, std::size_t requested_size) {
  const ContextId context = FreeContext(trace_free_context_, context_capture_override_);
  MutexLock lock(&mutex_);
  return FreeLocked(ptr, &requested_size, context);
}

absl::StatusOr<bool> Engine::FreeIfOwned(void* ptr) {
  const ContextId context = FreeContext(trace_free_context_, context_capture_override_);
  MutexLock lock(&mutex_);
  if (!blocks_.contains(reinterpret_cast<std::uintptr_t>(ptr))) return false;
  absl::Status freed = FreeLocked(ptr, nullptr, context);
  if (!freed.ok()) return freed;
  return true;
}

absl::Status Engine::FreeLocked(void* ptr, const std::size_t* requested_size,
                                ContextId free_context) {
  const auto address = reinterpret_cast<std::uintptr_t>(ptr);
  auto it = blocks_.find(address);
  if (ABSL_PREDICT_FALSE(it == blocks_.end())) return UnknownPointerError(address);
  Block* block = it->second;
  if (ABSL_PREDICT_FALSE(block->state != BlockState::kAllocated)) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "torchmem: double free of %#x on %s: the block (%s, allocated as #%d) was already "
        "freed; each pointer must be freed exactly once",
        address, device_name_, FormatBytes(static_cast<std::int64_t>(block->size)),
        block->sequence));
  }
  if (requested_size != nullptr && *requested_size != block->requested_size) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "torchmem: free of %#x on %s with size %d, but it was allocated with size %d; the "
        "block was not freed",
        address, device_name_, *requested_size, block->requested_size));
  }
  const PoolKind pool = block->pool();
  const auto bytes = static_cast<std::int64_t>(block->size);
  stats_.allocation.Decrease(pool, 1);
  stats_.allocated_bytes.Decrease(pool, bytes);
  if (ABSL_PREDICT_FALSE(block->counted_oversize)) {
    block->counted_oversize = false;
    stats_.oversize_allocations.Decrease(1);
  }

  if (ABSL_PREDICT_FALSE(Tracing())) {
    const ContextId context = free_context != kNoContext ? free_context : block->context;
    Trace(TraceAction::kFreeRequested, block->address, block->requested_size, block->stream(),
          context, block->owner());
  }
  TagCounters& tag = tags_[block->tag];
  tag.current_bytes -= bytes;
  tag.current_requested_bytes -= static_cast<std::int64_t>(block->requested_size);
  --tag.live_blocks;

  if (ABSL_PREDICT_FALSE(block->HasStreamUses())) {
    block->state = BlockState::kPendingFree;
    if (CaptureUnderwayLocked()) {
      // No event may be recorded or queried now; wait for the capture to end.
      deferred_until_no_capture_.push_back(block);
      return absl::OkStatus();
    }
    RecordPendingEvents(block);
    if (block->pending_events() == 0) MakeReusable(block);
    return absl::OkStatus();
  }
  MakeReusable(block);
  return absl::OkStatus();
}

void Engine::MakeReusable(Block* block) {
  if (ABSL_PREDICT_FALSE(Tracing())) {
    Trace(TraceAction::kFreeCompleted, block->address, block->requested_size, block->stream(),
          block->context, block->owner());
  }
  UnlinkFromScope(block);
  const PoolKind pool = block->pool();
  stats_.active.Decrease(pool, 1);
  stats_.active_bytes.Decrease(pool, static_cast<std::int64_t>(block->size));
  stats_.requested_bytes.Decrease(pool, static_cast<std::int64_t>(block->requested_size));
  block->state = BlockState::kFree;
  block->uses.reset();
  if (ABSL_PREDICT_FALSE(block->segment->vmm)) ReleasePages(block);
  AddInactiveSplit(block);
  InsertMerged(block);
  ApplyInactiveSplitChange(pool);
}

absl::Status Engine::UnknownPointerError(std::uintptr_t address) const {
  auto it = segments_.upper_bound(address);
  if (it != segments_.begin()) {
    const Segment& segment = *std::prev(it)->second;
    if (address < segment.address + segment.size) {
      const Block* block = segment.first;
      while (block->address + block->size <= address) block = block->next;
      return absl::NotFoundError(absl::StrFormat(
          "torchmem: %#x on %s points %d bytes into a %s block at %#x (%s); free the pointer "
          "that the allocation returned",
          address, device_name_, address - block->address,
          FormatBytes(static_cast<std::int64_t>(block->size)), block->address,
          BlockStateName(block->state)));
    }
  }
  return absl::NotFoundError(absl::StrFormat(
      "torchmem: %#x was not allocated by torchmem on %s (it may belong to another device or "
      "allocator); nothing was freed",
      address, device_name_));
}

// --- bookkeeping helpers ----------------------------------------------------

StreamLists& Engine::FindOrCreateLists(StreamId stream) {
  auto [it, inserted] = streams_.try_emplace(stream, nullptr);
  if (inserted) it->second = std::make_unique<StreamLists>(stream, policy_.min_block_size);
  last_stream_ = it->second.get();
  return *last_stream_;
}

StreamLists& Engine::PoolListsFor(PrivatePool* pool, StreamId stream) {
  auto [it, inserted] = pool->streams.try_emplace(stream, nullptr);
  if (inserted) it->second = std::make_unique<StreamLists>(stream, policy_.min_block_size);
  return *it->second;
}

void Engine::DropStreamListsIfEmpty(PrivatePool* owner, StreamId stream) {
  auto& map = owner == nullptr ? streams_ : owner->streams;
  auto it = map.find(stream);
  if (it == map.end() || it->second->segments > 0) return;
  if (last_stream_ == it->second.get()) last_stream_ = nullptr;
  map.erase(it);
}

void Engine::ReleaseStreamListsIfUnused(Segment* segment) {
  StreamLists* lists = segment->stream_lists;
  if (--lists->segments > 0) return;
  if (segment->owner != nullptr) {
    segment->owner->streams.erase(lists->stream);
    return;
  }
  if (last_stream_ == lists) last_stream_ = nullptr;
  streams_.erase(lists->stream);
}

Block* Engine::NewBlock() {
  if (ABSL_PREDICT_FALSE(spare_blocks_.empty())) {
    block_chunks_.push_back(std::make_unique<Block[]>(kBlocksPerChunk));
    Block* chunk = block_chunks_.back().get();
    for (std::size_t i = kBlocksPerChunk; i > 0; --i) spare_blocks_.push_back(&chunk[i - 1]);
  }
  Block* block = spare_blocks_.back();
  spare_blocks_.pop_back();
  return block;
}

void Engine::DeleteBlock(Block* block) {
  *block = Block{};
  spare_blocks_.push_back(block);
}

Engine::TagCounters& Engine::CountersFor(TagId tag) {
  if (ABSL_PREDICT_FALSE(tag >= tags_.size())) tags_.resize(tag + 1);
  TagCounters& counters = tags_[tag];
  counters.seen = true;
  return counters;
}

void Engine::AddInactiveSplit(const Block* block) {
  if (!CountsAsInactiveSplit(block)) return;
  InactiveSplitChange& change = inactive_split_change_[static_cast<int>(block->pool())];
  change.blocks += 1;
  change.bytes += static_cast<std::int64_t>(block->size);
}

void Engine::RemoveInactiveSplit(const Block* block) {
  if (!CountsAsInactiveSplit(block)) return;
  InactiveSplitChange& change = inactive_split_change_[static_cast<int>(block->pool())];
  change.blocks -= 1;
  change.bytes -= static_cast<std::int64_t>(block->size);
}

void Engine::ApplyInactiveSplitChange(PoolKind pool) {
  InactiveSplitChange& change = inactive_split_change_[static_cast<int>(pool)];
  // Most operations change nothing here (an exact-size block reused whole).
  if (change.blocks == 0 && change.bytes == 0) return;
  if (change.blocks > 0) stats_.inactive_split.Increase(pool, change.blocks);
  if (change.blocks < 0) stats_.inactive_split.Decrease(pool, -change.blocks);
  if (change.bytes > 0) stats_.inactive_split_bytes.Increase(pool, change.bytes);
  if (change.bytes < 0) stats_.inactive_split_bytes.Decrease(pool, -change.bytes);
  change = {};
}

BlockInfo Engine::DescribeBlock(const Block& block) {
  BlockInfo info;
  info.address = block.address;
  info.size = block.size;
  info.stream = block.stream();
  info.pool = block.pool();
  info.state = block.state;
  if (block.state != BlockState::kFree) {
    info.requested_size = block.requested_size;
    info.tag = block.tag;
    info.scope = block.scope;
    info.context = block.context;
    info.sequence = block.sequence;
  } else {
    info.last_requested_size = block.requested_size;
  }
  return info;
}

namespace internal {

void LockEnginesForFork() ABSL_NO_THREAD_SAFETY_ANALYSIS {
  EngineRegistry& registry = Registry();
  registry.mutex.Lock();
  for (Engine* engine : registry.engines) engine->LockForFork();
}

void UnlockEnginesAfterFork() ABSL_NO_THREAD_SAFETY_ANALYSIS {
  EngineRegistry& registry = Registry();
  for (auto it = registry.engines.rbegin(); it != registry.engines.rend(); ++it) {
    (*it)->UnlockAfterFork();
  }
  registry.mutex.Unlock();
}

}  // namespace internal

absl::StatusOr<std::vector<ScopeSurvivors>> CloseLeakScope(ScopeId scope) {
  absl::StatusOr<ScopeId> parent = CloseScope(scope);
  if (!parent.ok()) return parent.status();
  std::vector<ScopeSurvivors> result;
  EngineRegistry& registry = Registry();
  MutexLock lock(&registry.mutex);
  for (Engine* engine : registry.engines) result.push_back(engine->CollectScope(scope, *parent));
  return result;
}

}  // namespace torchmem
