// Engine::CheckInvariants: recounts the whole pool and compares it with the
// engine's structures and statistics. Slow (linear in blocks); meant for
// tests, fuzzing and debug builds.
#include <array>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_format.h"
#include "torchmem/core/engine.h"

namespace torchmem {
namespace {

absl::Status Violation(const std::string& what) {
  return absl::InternalError(absl::StrCat("torchmem invariant violated: ", what));
}

struct Recount {
  MemoryStats stats;
  absl::flat_hash_map<const PrivatePool*, std::int64_t> pool_segments;
  absl::flat_hash_map<const PrivatePool*, std::int64_t> pool_reserved;
  absl::flat_hash_map<const StreamLists*, std::int64_t> lists_segments;
  std::int64_t oversize_allocations = 0;
  std::int64_t oversize_segments = 0;
  std::size_t deferred = 0;
  absl::flat_hash_map<TagId, std::array<std::int64_t, 3>> tags;  // bytes, requested, blocks
  absl::flat_hash_map<const ScopeBlocks*, std::int64_t> scope_blocks;
  std::size_t blocks = 0;
  std::size_t free_blocks = 0;
  std::size_t pending_events = 0;
  // Virtual-memory ranges: live blocks per page, address space reserved.
  // Per pool kind (each has its own VmmSpace, its own page numbers).
  absl::flat_hash_map<std::uint64_t, std::int32_t> page_references[kNumPools];
  std::int64_t reserved_address_bytes = 0;
};

absl::Status CompareStat(const char* name, const char* type, const Stat& expected,
                         const Stat& actual) {
  if (expected.current != actual.current) {
    return Violation(absl::StrFormat("%s.%s.current is %d, recount gives %d", name, type,
                                     actual.current, expected.current));
  }
  if (actual.peak < actual.current) {
    return Violation(absl::StrFormat("%s.%s.peak %d is below current %d", name, type, actual.peak,
                                     actual.current));
  }
  return absl::OkStatus();
}

absl::Status CompareArray(const char* name, const StatArray& expected, const StatArray& actual) {
  for (absl::Status status : {CompareStat(name, "all", expected.all(), actual.all()),
                              CompareStat(name, "small_pool", expected.pool(PoolKind::kSmall),
                                          actual.pool(PoolKind::kSmall)),
                              CompareStat(name, "large_pool", expected.pool(PoolKind::kLarge),
                                          actual.pool(PoolKind::kLarge))}) {
    if (!status.ok()) return status;
  }
  return absl::OkStatus();
}

const char* IndexName(FreeIndex index) {
  switch (index) {
    case FreeIndex::kNone:
      return "unindexed";
    case FreeIndex::kClassList:
      return "class list";
    case FreeIndex::kOversized:
      return "oversized";
  }
  return "?";
}

}  // namespace

absl::Status Engine::CheckInvariants() const {
  MutexLock lock(&mutex_);
  for (const InactiveSplitChange& change : inactive_split_change_) {
    if (change.blocks != 0 || change.bytes != 0) {
      return Violation("an inactive-split change was left unapplied after an operation");
    }
  }
  Recount recount;
  absl::flat_hash_set<const PrivatePool*> live_pools;
  for (const auto& [id, pool] : private_pools_) {
    if (!(pool->id == id)) return Violation("a private pool is keyed under another id");
    if (pool->use_count < 0 || (pool->use_count == 0) != pool->freeable) {
      return Violation(absl::StrFormat("private pool (%d, %d) has %d users but freeable=%d",
                                       id.first, id.second, pool->use_count, pool->freeable));
    }
    live_pools.insert(pool.get());
  }
  for (const Route& route : routes_) {
    if (!private_pools_.contains(route.pool)) return Violation("a route names no private pool");
  }
  absl::flat_hash_set<const Block*> deferred(deferred_until_no_capture_.begin(),
                                             deferred_until_no_capture_.end());
  if (deferred.size() != deferred_until_no_capture_.size()) {
    return Violation("a block is deferred twice");
  }
  for (const auto& [address, segment_ptr] : segments_) {
    const Segment& segment = *segment_ptr;
    const PoolKind pool = segment.pool;
    recount.stats.segment.Increase(pool, 1);
    recount.stats.reserved_bytes.Increase(pool, HeldBytes(segment));
    if (segment.owner != nullptr) {
      if (!live_pools.contains(segment.owner)) {
        return Violation(
            absl::StrFormat("segment %#x belongs to a private pool the engine "
                            "does not know",
                            address));
      }
      ++recount.pool_segments[segment.owner];
      recount.pool_reserved[segment.owner] += HeldBytes(segment);
    }
    // The segment's free lists belong to its own pool (and stream).
    const auto& stream_map = segment.owner == nullptr ? streams_ : segment.owner->streams;
    auto lists = stream_map.find(segment.stream);
    const FreeLists* own_lists = segment.vmm
                                     ? &segment.stream_lists->vmm_pools[static_cast<int>(pool)]
                                     : &segment.stream_lists->pools[static_cast<int>(pool)];
    if (lists == stream_map.end() || lists->second.get() != segment.stream_lists ||
        segment.lists != own_lists) {
      return Violation(absl::StrFormat(
          "segment %#x is indexed in free lists of another pool or stream", address));
    }
    ++recount.lists_segments[segment.stream_lists];
    if (segment.vmm) {
      if (!HasVmmSpaces() || segment.stream_lists->vmm_ranges[static_cast<int>(pool)] != &segment) {
        return Violation(
            absl::StrFormat("range %#x is not the range of its stream's lists", address));
      }
      recount.reserved_address_bytes += static_cast<std::int64_t>(segment.size);
    } else if (segment.mapped_pages != 0) {
      return Violation(absl::StrFormat("segment %#x counts mapped pages", address));
    }
    if (segment.counted_oversize) ++recount.oversize_segments;
    if (address != segment.address) return Violation("segment keyed under a wrong address");
    if (segment.first == nullptr || segment.first->prev != nullptr) {
      return Violation(absl::StrFormat("segment %#x has a bad first block", address));
    }
    std::uintptr_t expected = segment.address;
    for (const Block* block = segment.first; block != nullptr; block = block->next) {
      ++recount.blocks;
      if (block->segment != &segment) {
        return Violation(absl::StrFormat("block %#x points at the wrong segment", block->address));
      }
      if (block->address != expected || block->size == 0) {
        return Violation(absl::StrFormat(
            "segment %#x: block at %#x (size %d) does not start where the previous ended (%#x)",
            address, block->address, block->size, expected));
      }
      if (block->next != nullptr && block->next->prev != block) {
        return Violation(absl::StrFormat("block %#x: broken neighbour links", block->address));
      }
      auto found = blocks_.find(block->address);
      if (found == blocks_.end() || found->second != block) {
        return Violation(absl::StrFormat("block %#x missing from the address map", block->address));
      }
      expected += block->size;
      const auto bytes = static_cast<std::int64_t>(block->size);
      if (segment.vmm && block->state != BlockState::kFree) {
        const VmmSpace& space = SpaceOf(segment);
        for (std::uint64_t page = space.PageOf(block->address);
             page <= space.PageOf(block->address + block->size - 1); ++page) {
          ++recount.page_references[static_cast<int>(segment.pool)][page];
        }
      }
      switch (block->state) {
        case BlockState::kAllocated: {
          if (block->index != FreeIndex::kNone || block->pending_events() != 0) {
            return Violation(
                absl::StrFormat("allocated block %#x is indexed or pending", block->address));
          }
          recount.stats.allocation.Increase(pool, 1);
          recount.stats.allocated_bytes.Increase(pool, bytes);
          recount.stats.requested_bytes.Increase(pool,
                                                 static_cast<std::int64_t>(block->requested_size));
          recount.stats.active.Increase(pool, 1);
          recount.stats.active_bytes.Increase(pool, bytes);
          if (block->counted_oversize) ++recount.oversize_allocations;
          auto& tag = recount.tags[block->tag];
          tag[0] += bytes;
          tag[1] += static_cast<std::int64_t>(block->requested_size);
          tag[2] += 1;
          break;
        }
        case BlockState::kPendingFree:
          if (block->index != FreeIndex::kNone) {
            return Violation(absl::StrFormat("pending block %#x is indexed", block->address));
          }
          if (deferred.contains(block)) {
            ++recount.deferred;
            if (block->pending_events() != 0) {
              return Violation(
                  absl::StrFormat("deferred block %#x already has events", block->address));
            }
          } else if (block->pending_events() <= 0) {
            return Violation(
                absl::StrFormat("pending block %#x has no events and is not "
                                "deferred",
                                block->address));
          }
          recount.stats.active.Increase(pool, 1);
          recount.stats.active_bytes.Increase(pool, bytes);
          recount.stats.requested_bytes.Increase(pool,
                                                 static_cast<std::int64_t>(block->requested_size));
          recount.pending_events += static_cast<std::size_t>(block->pending_events());
          break;
        case BlockState::kFree: {
          ++recount.free_blocks;
          if (block->index == FreeIndex::kNone) {
            return Violation(absl::StrFormat("free block %#x is in no index", block->address));
          }
          if (block->scope_list != nullptr) {
            return Violation(absl::StrFormat("free block %#x is still in a scope", block->address));
          }
          if (CountsAsInactiveSplit(block)) {
            recount.stats.inactive_split.Increase(pool, 1);
            recount.stats.inactive_split_bytes.Increase(pool, bytes);
          }
          for (const Block* neighbour : {block->prev, block->next}) {
            if (neighbour == nullptr || neighbour->state != BlockState::kFree) continue;
            return Violation(absl::StrFormat(
                "free blocks %#x (%s) and %#x (%s) are neighbours but not merged", block->address,
                IndexName(block->index), neighbour->address, IndexName(neighbour->index)));
          }
          break;
        }
      }
      if (block->scope_list != nullptr) ++recount.scope_blocks[block->scope_list];
    }
    if (expected != segment.address + segment.size) {
      return Violation(absl::StrFormat("segment %#x: blocks cover %d of its %d bytes", address,
                                       expected - segment.address, segment.size));
    }
  }
  if (recount.blocks != blocks_.size()) {
    return Violation(absl::StrFormat("address map holds %d blocks, segments hold %d",
                                     blocks_.size(), recount.blocks));
  }

  if (recount.deferred != deferred.size()) {
    return Violation(absl::StrFormat("%d blocks deferred, %d of them pending", deferred.size(),
                                     recount.deferred));
  }

  // Every indexed block is free, belongs to these lists (so to the lists'
  // private pool), and is counted once; every stream's lists hold segments.
  std::size_t indexed = 0;
  absl::flat_hash_set<const Block*> seen;
  auto check_lists =
      [&](const PrivatePool* owner,
          const absl::flat_hash_map<StreamId, std::unique_ptr<StreamLists>>& map) -> absl::Status {
    for (const auto& [stream, lists] : map) {
      auto counted = recount.lists_segments.find(lists.get());
      const std::int64_t segments = counted == recount.lists_segments.end() ? 0 : counted->second;
      if (segments == 0 || segments != lists->segments) {
        return Violation(
            absl::StrFormat("the free lists of stream %#x count %d segments, %d use them", stream,
                            lists->segments, segments));
      }
      for (int pool = 0; pool < 2 * kNumPools; ++pool) {
        const FreeLists& free_lists =
            pool < kNumPools ? lists->pools[pool] : lists->vmm_pools[pool - kNumPools];
        if (pool >= kNumPools && lists->vmm_ranges[pool - kNumPools] == nullptr &&
            free_lists.size() != 0) {
          return Violation(absl::StrFormat(
              "the range lists of stream %#x hold blocks but the stream has no range", stream));
        }
        absl::Status status;
        free_lists.ForEachFree([&](const Block* block) {
          ++indexed;
          if (!status.ok()) return;
          if (!seen.insert(block).second) {
            status = Violation(absl::StrFormat("block %#x is indexed twice", block->address));
          } else if (block->owner() != owner) {
            status = Violation(absl::StrFormat(
                "block %#x of one pool is indexed in another pool's free lists", block->address));
          } else if (block->state != BlockState::kFree || block->segment->lists != &free_lists) {
            status = Violation(absl::StrFormat(
                "block %#x is indexed in the free lists of another stream/pool or is not free",
                block->address));
          }
        });
        if (!status.ok()) return status;
        if (const Block* misplaced = free_lists.FindMisplaced()) {
          return Violation(absl::StrFormat(
              "free block %#x (%d bytes) is out of best-fit order in its size class list",
              misplaced->address, misplaced->size));
        }
      }
    }
    return absl::OkStatus();
  };
  if (absl::Status status = check_lists(nullptr, streams_); !status.ok()) return status;
  for (const auto& [id, pool] : private_pools_) {
    if (absl::Status status = check_lists(pool.get(), pool->streams); !status.ok()) return status;
    auto segments = recount.pool_segments.find(pool.get());
    const std::int64_t counted = segments == recount.pool_segments.end() ? 0 : segments->second;
    if (counted != pool->segments) {
      return Violation(absl::StrFormat("private pool (%d, %d) counts %d segments, holds %d",
                                       id.first, id.second, pool->segments, counted));
    }
    auto reserved = recount.pool_reserved.find(pool.get());
    const std::int64_t bytes = reserved == recount.pool_reserved.end() ? 0 : reserved->second;
    auto stat = stats_.reserved_bytes_by_private_pools.find({id.first, id.second});
    const std::int64_t stated =
        stat == stats_.reserved_bytes_by_private_pools.end() ? 0 : stat->second.all().current;
    if (stated != bytes) {
      return Violation(
          absl::StrFormat("reserved_bytes_by_private_pools of (%d, %d) is %d, its segments hold %d",
                          id.first, id.second, stated, bytes));
    }
  }
  for (const auto& [id, stat] : stats_.reserved_bytes_by_private_pools) {
    if (!private_pools_.contains(PoolId{id.first, id.second}) && stat.all().current != 0) {
      return Violation(absl::StrFormat("deleted private pool (%d, %d) still reserves %d bytes",
                                       id.first, id.second, stat.all().current));
    }
  }
  if (stats_.oversize_allocations.current != recount.oversize_allocations ||
      stats_.oversize_segments.current != recount.oversize_segments) {
    return Violation(absl::StrFormat("oversize allocations/segments are %d/%d, recount gives %d/%d",
                                     stats_.oversize_allocations.current,
                                     stats_.oversize_segments.current, recount.oversize_allocations,
                                     recount.oversize_segments));
  }
  if (indexed != recount.free_blocks) {
    return Violation(
        absl::StrFormat("%d free blocks but %d indexed", recount.free_blocks, indexed));
  }

  const MemoryStats& s = stats_;
  const MemoryStats& r = recount.stats;
  for (auto [name, expected, actual] :
       {std::tuple{"allocation", &r.allocation, &s.allocation},
        std::tuple{"segment", &r.segment, &s.segment}, std::tuple{"active", &r.active, &s.active},
        std::tuple{"inactive_split", &r.inactive_split, &s.inactive_split},
        std::tuple{"allocated_bytes", &r.allocated_bytes, &s.allocated_bytes},
        std::tuple{"reserved_bytes", &r.reserved_bytes, &s.reserved_bytes},
        std::tuple{"active_bytes", &r.active_bytes, &s.active_bytes},
        std::tuple{"inactive_split_bytes", &r.inactive_split_bytes, &s.inactive_split_bytes},
        std::tuple{"requested_bytes", &r.requested_bytes, &s.requested_bytes}}) {
    if (absl::Status status = CompareArray(name, *expected, *actual); !status.ok()) return status;
  }

  for (TagId tag = 0; tag < tags_.size(); ++tag) {
    const TagCounters& counters = tags_[tag];
    auto it = recount.tags.find(tag);
    const std::array<std::int64_t, 3> expected =
        it == recount.tags.end() ? std::array<std::int64_t, 3>{0, 0, 0} : it->second;
    if (counters.current_bytes != expected[0] || counters.current_requested_bytes != expected[1] ||
        counters.live_blocks != expected[2]) {
      return Violation(absl::StrFormat(
          "tag %d counts %d bytes / %d requested / %d blocks, recount gives %d / %d / %d", tag,
          counters.current_bytes, counters.current_requested_bytes, counters.live_blocks,
          expected[0], expected[1], expected[2]));
    }
    if (counters.peak_bytes < counters.current_bytes) {
      return Violation(absl::StrFormat("tag %d peak below current", tag));
    }
  }
  for (const auto& [tag, counts] : recount.tags) {
    if (tag >= tags_.size()) return Violation(absl::StrFormat("tag %d has no counters", tag));
  }

  for (const auto& [scope, list] : scopes_) {
    auto it = recount.scope_blocks.find(list.get());
    const std::int64_t linked = it == recount.scope_blocks.end() ? 0 : it->second;
    if (linked != list->blocks) {
      return Violation(absl::StrFormat("scope %d counts %d blocks, %d are linked to it", scope,
                                       list->blocks, linked));
    }
    std::int64_t walked = 0;
    for (const Block* block = list->head; block != nullptr; block = block->list_next) {
      if (block->scope_list != list.get() || block->state == BlockState::kFree) {
        return Violation(
            absl::StrFormat("scope %d links a free or foreign block %#x", scope, block->address));
      }
      ++walked;
    }
    if (walked != list->blocks) {
      return Violation(
          absl::StrFormat("scope %d list has %d blocks, counts %d", scope, walked, list->blocks));
    }
  }
  for (const auto& [list, count] : recount.scope_blocks) {
    auto it = scopes_.find(list->scope);
    if (it == scopes_.end() || it->second.get() != list) {
      return Violation("a block is linked to a scope the engine does not know");
    }
  }

  if (recount.reserved_address_bytes != reserved_address_bytes_) {
    return Violation(absl::StrFormat("%d bytes of address space counted reserved, ranges hold %d",
                                     reserved_address_bytes_, recount.reserved_address_bytes));
  }
  if (HasVmmSpaces()) {
    for (int kind = 0; kind < kNumPools; ++kind) {
      if (std::string wrong = vmm_[kind]->Check(recount.page_references[kind]); !wrong.empty()) {
        return Violation(wrong);
      }
    }
  }

  std::size_t queued = unrecorded_events_.size();
  for (const auto& [stream, queue] : pending_events_) {
    if (queue.empty()) {
      return Violation(
          absl::StrFormat("the event table keeps an empty queue for stream %#x", stream));
    }
    queued += queue.size();
  }
  if (queued != outstanding_events_ || queued != recount.pending_events) {
    return Violation(absl::StrFormat("%d events queued, %d outstanding, pending blocks wait on %d",
                                     queued, outstanding_events_, recount.pending_events));
  }
  return absl::OkStatus();
}

}  // namespace torchmem
