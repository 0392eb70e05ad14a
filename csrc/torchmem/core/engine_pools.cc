// Engine: private pools (CUDA graphs, torch.cuda.MemPool), the routes that
// send allocations to them, and checkpoints of their layout (PyTorch's
// cudagraph trees).
//
// Lifecycle, as in PyTorch: a pool is created with one user
// (CreateOrIncrefPool, or the first BeginAllocateToPool); each graph
// capture, MemPool and use_mem_pool block adds a user and releases it later
// (ReleasePool). At zero users the pool is "freeable": its blocks still
// serve nothing else, and its fully free segments go back to the backend at
// the next EmptyCache (or out-of-memory release); the pool disappears when
// it holds no segment.
#include <algorithm>
#include <utility>

#include "absl/strings/str_format.h"
#include "torchmem/core/engine.h"

namespace torchmem {
namespace {

std::string PoolName(PoolId id) { return absl::StrFormat("(%d, %d)", id.first, id.second); }

}  // namespace

absl::StatusOr<PrivatePool*> Engine::FindPool(PoolId id) const {
  auto it = private_pools_.find(id);
  if (it == private_pools_.end()) {
    return absl::NotFoundError(absl::StrFormat(
        "torchmem: %s has no private pool %s (it was never created, or was released and "
        "emptied)",
        device_name_, PoolName(id)));
  }
  return it->second.get();
}

PrivatePool* Engine::CreateOrIncrefPoolLocked(PoolId id, absl::Status* status) {
  if (id.IsDefault()) {
    *status = absl::InvalidArgumentError(
        "torchmem: the pool id (0, 0) names the default pool, not a private pool");
    return nullptr;
  }
  auto [it, inserted] = private_pools_.try_emplace(id, nullptr);
  if (inserted) {
    it->second = std::make_unique<PrivatePool>();
    it->second->id = id;
    return it->second.get();
  }
  PrivatePool* pool = it->second.get();
  if (pool->freeable) {
    *status = absl::FailedPreconditionError(absl::StrFormat(
        "torchmem: private pool %s on %s was released by all its users; a released pool "
        "cannot be used again (create a new MemPool or graph pool)",
        PoolName(id), device_name_));
    return nullptr;
  }
  ++pool->use_count;
  return pool;
}

absl::Status Engine::CreateOrIncrefPool(PoolId pool, std::shared_ptr<SegmentSource> source) {
  MutexLock lock(&mutex_);
  const bool existed = private_pools_.contains(pool);
  absl::Status status;
  PrivatePool* created = CreateOrIncrefPoolLocked(pool, &status);
  if (created == nullptr || source == nullptr) return status;
  if (!existed) {
    created->source = std::move(source);
  } else if (created->source != source) {
    --created->use_count;
    return absl::FailedPreconditionError(absl::StrFormat(
        "torchmem: private pool %s on %s exists already with another allocator; a pool keeps "
        "the allocator it was created with",
        PoolName(pool), device_name_));
  }
  return absl::OkStatus();
}

absl::Status Engine::BeginAllocateToPool(PoolId pool, PoolFilter filter) {
  MutexLock lock(&mutex_);
  for (const Route& route : routes_) {
    if (route.pool == pool) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "torchmem: allocations on %s are already routed to private pool %s; end that "
          "route first",
          device_name_, PoolName(pool)));
    }
  }
  absl::Status status;
  if (CreateOrIncrefPoolLocked(pool, &status) == nullptr) return status;
  routes_.push_back(Route{pool, std::move(filter)});
  return absl::OkStatus();
}

absl::Status Engine::EndAllocateToPool(PoolId pool) {
  MutexLock lock(&mutex_);
  for (auto it = routes_.begin(); it != routes_.end(); ++it) {
    if (it->pool == pool) {
      routes_.erase(it);
      if (auto owner = private_pools_.find(pool); owner != private_pools_.end()) {
        DeletePoolIfEmpty(owner->second.get());
      }
      return absl::OkStatus();
    }
  }
  return absl::FailedPreconditionError(
      absl::StrFormat("torchmem: no allocations on %s are routed to private pool %s", device_name_,
                      PoolName(pool)));
}

absl::Status Engine::ReleasePool(PoolId pool) {
  MutexLock lock(&mutex_);
  absl::StatusOr<PrivatePool*> found = FindPool(pool);
  if (!found.ok()) return found.status();
  PrivatePool* owner = *found;
  if (owner->use_count == 0) {
    return absl::FailedPreconditionError(
        absl::StrFormat("torchmem: private pool %s on %s was released more times than it was used",
                        PoolName(pool), device_name_));
  }
  if (--owner->use_count == 0) {
    owner->freeable = true;
    owner->use_on_oom = false;
    if (owner->segments == 0) DeletePoolIfEmpty(owner);
  }
  return absl::OkStatus();
}

absl::StatusOr<int> Engine::PoolUseCount(PoolId pool) const {
  MutexLock lock(&mutex_);
  absl::StatusOr<PrivatePool*> found = FindPool(pool);
  if (!found.ok()) return found.status();
  return (*found)->use_count;
}

absl::Status Engine::SetPoolNoSplit(PoolId pool) {
  MutexLock lock(&mutex_);
  absl::StatusOr<PrivatePool*> found = FindPool(pool);
  if (!found.ok()) return found.status();
  (*found)->no_split = true;
  return absl::OkStatus();
}

absl::Status Engine::SetPoolUseOnOom(PoolId pool, bool use_on_oom) {
  MutexLock lock(&mutex_);
  absl::StatusOr<PrivatePool*> found = FindPool(pool);
  if (!found.ok()) return use_on_oom ? found.status() : absl::OkStatus();
  (*found)->use_on_oom = use_on_oom;
  return absl::OkStatus();
}

Block* Engine::TakeFromUseOnOomPools(std::size_t rounded, PoolKind kind, StreamId stream) {
  for (const auto& [id, pool] : private_pools_) {
    if (!pool->use_on_oom || pool->freeable) continue;
    auto lists = pool->streams.find(stream);
    if (lists == pool->streams.end()) continue;
    if (Block* block = TakeCachedBlock(lists->second->pools[static_cast<int>(kind)], rounded)) {
      return block;
    }
  }
  return nullptr;
}

absl::StatusOr<bool> Engine::CheckPoolLiveAllocations(
    PoolId pool, const absl::flat_hash_set<std::uintptr_t>& expected) const {
  MutexLock lock(&mutex_);
  absl::StatusOr<PrivatePool*> found = FindPool(pool);
  if (!found.ok()) return found.status();
  std::size_t allocated = 0;
  for (const auto& [address, segment] : segments_) {
    if (segment->owner != *found) continue;
    for (const Block* block = segment->first; block != nullptr; block = block->next) {
      if (block->state != BlockState::kAllocated) continue;
      if (!expected.contains(block->address)) return false;
      ++allocated;
    }
  }
  return allocated == expected.size();
}

// --- checkpoints ------------------------------------------------------------

absl::StatusOr<PoolCheckpoint> Engine::GetPoolCheckpoint(PoolId pool) {
  MutexLock lock(&mutex_);
  if (absl::Status events = ProcessEventsLocked(); !events.ok()) return events;
  absl::StatusOr<PrivatePool*> found = FindPool(pool);
  if (!found.ok()) return found.status();
  if ((*found)->freeable) {
    return absl::FailedPreconditionError(
        absl::StrFormat("torchmem: private pool %s on %s was released; a released pool cannot be "
                        "checkpointed",
                        PoolName(pool), device_name_));
  }
  PoolCheckpoint checkpoint;
  checkpoint.pool = pool;
  for (const auto& [address, segment] : segments_) {
    if (segment->owner != *found) continue;
    PoolCheckpoint::Segment& saved = checkpoint.segments.emplace_back();
    saved.address = segment->address;
    saved.size = segment->size;
    saved.stream = segment->stream;
    for (const Block* block = segment->first; block != nullptr; block = block->next) {
      if (block->state == BlockState::kPendingFree) {
        return absl::FailedPreconditionError(absl::StrFormat(
            "torchmem: block %#x of private pool %s on %s still waits for other streams' work; "
            "synchronize before checkpointing the pool",
            block->address, PoolName(pool), device_name_));
      }
      saved.blocks.push_back(PoolCheckpoint::Block{block->address, block->size,
                                                   block->state == BlockState::kAllocated});
    }
  }
  return checkpoint;
}

absl::StatusOr<CheckpointRestore> Engine::RestorePoolCheckpoint(const PoolCheckpoint& checkpoint) {
  const Attribution attribution = CurrentAttribution();
  MutexLock lock(&mutex_);
  absl::StatusOr<PrivatePool*> found = FindPool(checkpoint.pool);
  if (!found.ok()) return found.status();
  PrivatePool* pool = *found;
  if (pool->freeable) {
    return absl::FailedPreconditionError(
        absl::StrFormat("torchmem: private pool %s on %s was released; it cannot be restored",
                        PoolName(checkpoint.pool), device_name_));
  }
  // Check everything before changing anything: every checkpointed segment
  // must still be one of the pool's, with the same extent, and nothing in
  // the pool may wait on events.
  for (const PoolCheckpoint::Segment& saved : checkpoint.segments) {
    auto it = segments_.find(saved.address);
    if (it == segments_.end() || it->second->owner != pool || it->second->size != saved.size) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "torchmem: the checkpoint of private pool %s names a %d-byte segment at %#x that the "
          "pool no longer holds on %s",
          PoolName(checkpoint.pool), saved.size, saved.address, device_name_));
    }
    std::uintptr_t expected = saved.address;
    for (const PoolCheckpoint::Block& block : saved.blocks) {
      if (block.address != expected || block.size == 0) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "torchmem: the checkpoint of private pool %s does not cover its segment at %#x "
            "block by block",
            PoolName(checkpoint.pool), saved.address));
      }
      expected += block.size;
    }
    if (expected != saved.address + saved.size) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "torchmem: the checkpoint of private pool %s covers %d of the %d bytes of its "
          "segment at %#x",
          PoolName(checkpoint.pool), expected - saved.address, saved.size, saved.address));
    }
  }
  std::vector<Segment*> pool_segments;
  for (const auto& [address, segment] : segments_) {
    if (segment->owner != pool) continue;
    pool_segments.push_back(segment.get());
    for (const Block* block = segment->first; block != nullptr; block = block->next) {
      if (block->state == BlockState::kPendingFree || block->HasStreamUses()) {
        return absl::FailedPreconditionError(absl::StrFormat(
            "torchmem: block %#x of private pool %s on %s is used on other streams; "
            "synchronize before restoring the pool",
            block->address, PoolName(checkpoint.pool), device_name_));
      }
    }
  }

  CheckpointRestore result;
  // 1. Free every allocated block of the pool (the tensors of the abandoned
  //    path): each segment becomes one free block.
  for (Segment* segment : pool_segments) {
    std::vector<std::uintptr_t> live;
    for (const Block* block = segment->first; block != nullptr; block = block->next) {
      if (block->state == BlockState::kAllocated) live.push_back(block->address);
    }
    for (std::uintptr_t address : live) {
      absl::Status freed = FreeLocked(reinterpret_cast<void*>(address), nullptr, kNoContext);
      if (!freed.ok()) return freed;
      result.freed.push_back(address);
    }
  }
  // 2. Carve every checkpointed block out as allocated, then free those the
  //    checkpoint had free (their neighbours are allocated then, so every
  //    free block ends up exactly where the checkpoint had it).
  //    In a virtual-memory range the free ones are only carved, never
  //    marked allocated: their pages need no physical memory. The live
  //    ones' pages are still mapped (a private pool's pages stay until the
  //    pool is released), so acquiring them makes no backend call.
  for (const PoolCheckpoint::Segment& saved : checkpoint.segments) {
    Segment* segment = segments_.find(saved.address)->second.get();
    Block* current = segment->first;
    std::vector<Block*> carved_free;
    for (const PoolCheckpoint::Block& block : saved.blocks) {
      segment->lists->Remove(current);
      if (current->size > block.size) SplitBlock(current, block.size);
      if (segment->vmm && !block.allocated) {
        carved_free.push_back(current);
      } else {
        if (segment->vmm) {
          if (absl::Status pages = AcquirePages(current); !pages.ok()) {
            return absl::InternalError(absl::StrFormat(
                "torchmem: restoring private pool %s on %s: the pages of block %#x are gone "
                "(%s); the pool is left partly restored",
                PoolName(checkpoint.pool), device_name_, block.address, pages.message()));
          }
        }
        MarkAllocated(current, block.size, attribution, kNoContext);
      }
      current = current->next;
    }
    for (Block* block : carved_free) InsertMerged(block);
    ApplyInactiveSplitChange(segment->pool);
    for (const PoolCheckpoint::Block& block : saved.blocks) {
      if (block.allocated) {
        result.allocated.push_back(block.address);
        continue;
      }
      if (segment->vmm) continue;
      absl::Status freed = FreeLocked(reinterpret_cast<void*>(block.address), nullptr, kNoContext);
      if (!freed.ok()) return freed;
    }
  }
  return result;
}

}  // namespace torchmem
