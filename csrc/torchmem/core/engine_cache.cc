// Engine: giving cached memory back to the backend — EmptyCache, the
// out-of-memory ladder's releases, and garbage collection under a threshold
// (PyTorch's release_cached_blocks, release_available_cached_blocks and
// garbage_collect_cached_blocks).
//
// Only fully free segments are released, and never those of a private pool
// that still has users: a CUDA graph replays into its pool's addresses.
#include <algorithm>
#include <vector>

#include "absl/strings/str_format.h"
#include "torchmem/core/context_capture.h"
#include "torchmem/core/engine.h"
#include "torchmem/core/format.h"

namespace torchmem {

absl::Status Engine::EmptyCache(PoolId pool) {
  // As PyTorch with context="all": the segment_free entries carry the stack
  // of the code that emptied the cache (captured before the lock).
  const ContextId context = trace_free_context_.load(std::memory_order_relaxed)
                                ? CaptureContext(&context_capture_override_)
                                : kNoContext;
  MutexLock lock(&mutex_);
  segment_free_context_ = context;
  absl::Status status = EmptyCacheLocked(pool);
  segment_free_context_ = kNoContext;
  return status;
}

absl::Status Engine::EmptyCacheLocked(PoolId pool) {
  if (pool.IsDefault()) {
    if (CaptureUnderwayLocked()) {
      // Waiting for events is forbidden now; only released pools go.
      return ReleaseFreeSegments(/*default_pool=*/false);
    }
    // Pending blocks first become free, as PyTorch's emptyCache waits for
    // them (synchronize_and_free_events).
    absl::Status synced = SynchronizeAllEvents();
    absl::Status released = ReleaseFreeSegments(/*default_pool=*/true);
    return synced.ok() ? released : synced;
  }
  auto it = private_pools_.find(pool);
  if (it == private_pools_.end() || !it->second->freeable) return absl::OkStatus();
  PrivatePool* owner = it->second.get();
  absl::Status synced = SynchronizeAllEvents(owner);
  absl::Status released = ReleaseFreeSegments(/*default_pool=*/false, owner);
  return synced.ok() ? released : synced;
}

absl::Status Engine::ReleaseFreeSegments(bool default_pool, const PrivatePool* only) {
  absl::Status first_error;
  std::vector<Segment*> releasable;
  // Unmapping waits for streams, which a capture forbids: ranges keep their
  // pages until it ends.
  const bool capturing = CaptureUnderwayLocked();
  for (const auto& [address, segment] : segments_) {
    const PrivatePool* owner = segment->owner;
    const bool wanted = owner == nullptr ? default_pool && only == nullptr
                                         : owner->freeable && (only == nullptr || owner == only);
    if (!wanted) continue;
    if (segment->vmm) {
      if (capturing) continue;
      // A range's cached pages go back even while live blocks remain.
      absl::Status unmapped = SpaceOf(*segment).ReleaseCached(*segment);
      if (!unmapped.ok()) {
        if (first_error.ok()) {
          first_error = absl::Status(
              unmapped.code(), absl::StrFormat("torchmem: could not unmap the cached pages of the "
                                               "range at %#x on %s (they stay cached): %s",
                                               segment->address, device_name_, unmapped.message()));
        }
        continue;
      }
    }
    const Block* block = segment->first;
    if (block->state != BlockState::kFree || block->IsSplit()) continue;
    releasable.push_back(segment.get());
  }
  for (Segment* segment : releasable) {
    absl::Status released = ReleaseSegment(segment);
    if (!released.ok() && first_error.ok()) first_error = released;
  }
  // Released pools disappear once they hold nothing.
  std::vector<PrivatePool*> empty;
  for (const auto& [id, pool] : private_pools_) {
    if (pool->freeable && pool->segments == 0) empty.push_back(pool.get());
  }
  for (PrivatePool* pool : empty) DeletePoolIfEmpty(pool);
  return first_error;
}

absl::Status Engine::ReleaseSegment(Segment* segment) {
  absl::Status released;
  if (segment->vmm) {
    // A range goes once its pages did (its blocks are all free).
    released = SpaceOf(*segment).ReleaseCached(*segment);
    if (released.ok()) {
      ++SpaceOf(*segment).mutable_counters().address_releases;
      released = backend_->ReleaseAddressRange(segment->reservation, segment->reservation_size);
    }
  } else {
    released = BackendRelease(segment->address, segment->size, segment->owner);
  }
  if (!released.ok()) {
    return absl::Status(
        released.code(),
        absl::StrFormat("torchmem: could not release the %s %s at %#x on %s (it stays "
                        "cached): %s",
                        FormatBytes(static_cast<std::int64_t>(segment->size)),
                        segment->vmm ? "address range" : "segment", segment->address, device_name_,
                        released.message()));
  }
  Block* block = segment->first;
  segment->lists->Remove(block);
  blocks_.erase(block->address);
  DeleteBlock(block);
  const PoolKind kind = segment->pool;
  // A range's mapped pages left reserved_bytes as they were unmapped.
  const auto bytes = segment->vmm ? 0 : static_cast<std::int64_t>(segment->size);
  stats_.segment.Decrease(kind, 1);
  stats_.reserved_bytes.Decrease(kind, bytes);
  if (segment->counted_oversize) stats_.oversize_segments.Decrease(1);
  if (segment->vmm) {
    SpaceOf(*segment).RemoveRange(segment);
    reserved_address_bytes_ -= static_cast<std::int64_t>(segment->size);
    segment->stream_lists->vmm_ranges[static_cast<int>(kind)] = nullptr;
  } else {
    ++stats_.num_device_free;
  }
  if (PrivatePool* owner = segment->owner) {
    --owner->segments;
    stats_.reserved_bytes_by_private_pools[{owner->id.first, owner->id.second}].Decrease(kind,
                                                                                         bytes);
  }
  if (ABSL_PREDICT_FALSE(Tracing()) && !segment->vmm) {
    Trace(TraceAction::kSegmentFree, segment->address, segment->size, segment->stream,
          segment_free_context_ != kNoContext ? segment_free_context_ : segment->context,
          segment->owner);
  }
  ReleaseStreamListsIfUnused(segment);
  segments_.erase(segment->address);
  return absl::OkStatus();
}

void Engine::DeletePoolIfEmpty(PrivatePool* pool) {
  if (!pool->freeable || pool->segments != 0) return;
  // An open route still sends allocations to it (released by all users
  // mid-capture): it goes when the route ends.
  for (const Route& route : routes_) {
    if (route.pool == pool->id) return;
  }
  const PoolId id = pool->id;
  private_pools_.erase(id);
}

bool Engine::ReleaseOversizeBlocks(FreeLists& lists, std::size_t needed) {
  // One block large enough, if there is one: the smallest.
  const std::size_t key = std::max(needed, policy_.max_split_size);
  Block* fit = lists.PeekBestFit(key);
  std::vector<Block*> chosen;
  if (fit != nullptr && !fit->IsSplit()) {
    chosen.push_back(fit);
  } else {
    // Otherwise several oversize blocks, largest first.
    std::vector<Block*> oversize;
    const SizePolicy policy = policy_;  // a copy: the lambda is not seen to hold the lock
    lists.ForEachFree([&](Block* block) {
      if (policy.IsOversize(block->size) && !block->IsSplit()) oversize.push_back(block);
    });
    std::sort(oversize.begin(), oversize.end(),
              [](const Block* a, const Block* b) { return a->size > b->size; });
    std::size_t total = 0;
    for (Block* block : oversize) {
      if (total >= key) break;
      chosen.push_back(block);
      total += block->size;
    }
    if (total < key) return false;
  }
  bool released_any = false;
  for (Block* block : chosen) released_any |= ReleaseSegment(block->segment).ok();
  return released_any;
}

void Engine::CollectGarbage() {
  // PyTorch's garbage_collect_cached_blocks: past the threshold, release
  // unsplit cached blocks of the default large pool whose age (lookups since
  // they were cached) is at least the average, repeating until enough came
  // back or nothing more can go.
  const auto threshold =
      static_cast<std::size_t>(gc_threshold_ * static_cast<double>(memory_limit_));
  const auto reserved = static_cast<std::size_t>(stats_.reserved_bytes.all().current);
  if (reserved <= threshold) return;
  const std::size_t target = reserved - threshold;
  std::vector<Block*> candidates;
  for (const auto& [stream, lists] : streams_) {
    lists->pools[static_cast<int>(PoolKind::kLarge)].ForEachFree([&](Block* block) {
      if (!block->IsSplit()) candidates.push_back(block);
    });
  }
  std::size_t reclaimed = 0;
  while (reclaimed < target && !candidates.empty()) {
    double total_age = 0;
    for (const Block* block : candidates)
      total_age += static_cast<double>(gc_clock_ - block->cached_at);
    const double average = total_age / static_cast<double>(candidates.size());
    std::vector<Block*> younger;
    bool freed = false;
    for (Block* block : candidates) {
      if (static_cast<double>(gc_clock_ - block->cached_at) >= average) {
        const std::size_t size = block->size;
        if (ReleaseSegment(block->segment).ok()) {
          reclaimed += size;
          freed = true;
          continue;
        }
      }
      younger.push_back(block);
    }
    if (!freed) break;
    candidates.swap(younger);
  }
}

}  // namespace torchmem
