// Plain-data reports the engine hands out: copies taken under its lock, safe
// to keep and read after the engine moved on.
#ifndef TORCHMEM_CORE_REPORTS_H_
#define TORCHMEM_CORE_REPORTS_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "torchmem/core/block.h"
#include "torchmem/core/types.h"

namespace torchmem {

// One block with the metadata stamped when it was allocated.
struct BlockInfo {
  std::uintptr_t address = 0;
  std::size_t size = 0;            // rounded
  std::size_t requested_size = 0;  // as asked by the caller
  // Free blocks: the requested size of the newest allocation made from this
  // memory (0 if none), which PyTorch's snapshots report for free blocks.
  std::size_t last_requested_size = 0;
  StreamId stream = 0;
  PoolKind pool = PoolKind::kSmall;
  BlockState state = BlockState::kFree;
  TagId tag = kNoTag;
  ScopeId scope = kNoScope;
  ContextId context = kNoContext;
  std::uint64_t sequence = 0;  // allocation order within the engine
};

struct SegmentInfo {
  std::uintptr_t address = 0;
  std::size_t size = 0;
  PoolKind pool = PoolKind::kSmall;
  StreamId stream = 0;
  PoolId owner;                    // the private pool holding it; default pool: {0, 0}
  std::uint64_t registration = 0;  // creation order among the engine's segments
  ContextId context = kNoContext;  // of the allocation that created it, while unsplit
  std::vector<BlockInfo> blocks;   // in address order, covering the segment
  // A virtual-memory range (expandable segment): `size` is address space,
  // of which `mapped_bytes` hold physical pages. Else mapped_bytes == size.
  bool vmm = false;
  std::size_t mapped_bytes = 0;
};

// The layout of a private pool at one moment: what PyTorch's cudagraph trees
// checkpoint to go back to when execution moves to another graph path.
struct PoolCheckpoint {
  struct Block {
    std::uintptr_t address = 0;
    std::size_t size = 0;
    bool allocated = false;
  };
  struct Segment {
    std::uintptr_t address = 0;
    std::size_t size = 0;
    StreamId stream = 0;
    std::vector<Block> blocks;  // in address order, covering the segment
  };
  PoolId pool;
  std::vector<Segment> segments;
};

// What restoring a checkpoint changed: blocks it freed (allocated before,
// not in the checkpoint) and blocks it allocated (the checkpoint's live
// blocks, re-created at their addresses; an address may be in both).
struct CheckpointRestore {
  std::vector<std::uintptr_t> freed;
  std::vector<std::uintptr_t> allocated;
};

// Events and deferrals around cross-stream reuse.
struct EventHealth {
  std::int64_t outstanding_events = 0;   // recorded, not yet seen complete
  std::int64_t streams_with_events = 0;  // entries of the per-stream event table
  std::int64_t deferred_frees = 0;       // freed during a capture, no event yet
  std::int64_t event_query_errors = 0;   // queries that failed (not "not ready")
  std::int64_t event_sync_errors = 0;    // synchronizations that failed too
};

// Per-tag accounting. Bytes are rounded block sizes, as allocated_bytes.
struct TagUsage {
  TagId tag = kNoTag;
  std::int64_t current_bytes = 0;
  std::int64_t peak_bytes = 0;
  std::int64_t current_requested_bytes = 0;
  std::int64_t live_blocks = 0;
  std::int64_t total_allocations = 0;  // since the last reset
  std::int64_t total_allocated_bytes = 0;
};

// What a leak scope left behind in one engine when it closed.
struct ScopeSurvivors {
  std::string device;
  std::vector<BlockInfo> allocated;  // still held by the program: leaks
  std::vector<BlockInfo> pending;    // freed, waiting on other streams' events
};

// Free-space statistics. Adjacent free blocks count as one free extent,
// whether or not the engine merged them yet.
struct FreeSpaceStats {
  std::int64_t reserved_bytes = 0;
  std::int64_t allocated_bytes = 0;
  std::int64_t requested_bytes = 0;     // of allocated and pending blocks
  std::int64_t free_bytes = 0;          // cached, reusable
  std::int64_t pending_free_bytes = 0;  // waiting on events
  std::int64_t largest_free_extent = 0;
  std::int64_t free_extents = 0;
  std::int64_t inactive_split_bytes = 0;  // free bytes in segments holding live blocks
  std::int64_t internal_waste_bytes = 0;  // allocated - requested (rounding)
  // 1 - largest free extent / free bytes (0 when nothing is free): how much
  // of the cache cannot serve one request of its total size.
  double external_fragmentation = 0.0;
  // Free extents by size: histogram[k] counts extents in [2^k, 2^(k+1)) bytes.
  std::vector<std::int64_t> histogram_counts;
  std::vector<std::int64_t> histogram_bytes;
};

struct FragmentationReport {
  FreeSpaceStats all;
  FreeSpaceStats small_pool;
  FreeSpaceStats large_pool;
  std::vector<std::pair<StreamId, FreeSpaceStats>> by_stream;
};

}  // namespace torchmem

#endif  // TORCHMEM_CORE_REPORTS_H_
