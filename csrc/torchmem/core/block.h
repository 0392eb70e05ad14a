// Block and Segment: the engine's records of device memory (engine-internal).
//
// A Segment is one region obtained from the backend. It is covered, without
// gaps or overlaps, by a doubly linked list of Blocks in address order
// (Block::prev/next). Each block is in exactly one state:
//   kAllocated   - handed out to a caller;
//   kPendingFree - freed by its caller, but still used by work queued on other
//                  streams (record_stream); reusable once their events complete
//                  (or, while a CUDA graph capture is underway, waiting with no
//                  event yet: events cannot be queried during capture);
//   kFree        - cached, reusable; indexed in its segment's FreeLists.
// A free block never touches another free block: they are merged when the
// second one is freed (as in PyTorch), so the index always holds the largest
// free extents and best fit decides like PyTorch's allocator.
//
// The metadata fields describe the current (or last) allocation of the block
// and are stamped when it is handed out, so that accounting on free is O(1)
// and credits the tag and scope the block was allocated under, whichever
// thread frees it and whenever.
#ifndef TORCHMEM_CORE_BLOCK_H_
#define TORCHMEM_CORE_BLOCK_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "torchmem/core/types.h"

namespace torchmem {

class FreeLists;
struct PrivatePool;
struct ScopeBlocks;
struct StreamLists;

enum class BlockState : std::uint8_t { kFree, kAllocated, kPendingFree };

inline const char* BlockStateName(BlockState state) {
  switch (state) {
    case BlockState::kFree:
      return "free";
    case BlockState::kAllocated:
      return "allocated";
    case BlockState::kPendingFree:
      return "pending_free";
  }
  return "?";
}

// Where a free block is indexed in its FreeLists.
enum class FreeIndex : std::uint8_t { kNone, kClassList, kOversized };

struct Block;

struct Segment {
  std::uintptr_t address = 0;
  std::size_t size = 0;
  PoolKind pool = PoolKind::kSmall;
  StreamId stream = 0;
  Block* first = nullptr;               // block at `address`
  FreeLists* lists = nullptr;           // free lists of (private pool, stream, pool kind)
  StreamLists* stream_lists = nullptr;  // the lists' owner (counts its segments)
  // The private pool whose blocks this segment holds; nullptr: the default
  // pool. A private pool's blocks are only ever handed to allocations routed
  // to that pool.
  PrivatePool* owner = nullptr;
  // Creation order among the engine's segments (1, 2, ...): best fit prefers
  // blocks of older segments among blocks of equal size (see FreeLists).
  std::uint64_t registration = 0;
  // Of the allocation that created it, until a block is split off it (then
  // kNoContext: see Engine::SplitBlock).
  ContextId context = kNoContext;
  bool counted_oversize = false;  // in stats' oversize_segments
  // A virtual-memory range (see vmm_space.h) rather than a segment of
  // PyTorch's kind: `size` bytes of address space reserved once, covered by
  // blocks as any segment, of which only `mapped_pages` pages hold physical
  // memory (the pages that live blocks touch, and cached ones).
  bool vmm = false;
  std::int64_t mapped_pages = 0;
  // The address space reserved for a range: [address, address + size)
  // aligned to its pages inside it (a 20 MiB page needs more alignment than
  // the backend gives); what goes back to the backend.
  std::uintptr_t reservation = 0;
  std::size_t reservation_size = 0;
};

// The streams other than its segment's that used a block (record_stream),
// kept apart from the Block: most blocks never get one, so the Block stays
// small and a free only tests a pointer.
struct StreamUses {
  std::vector<StreamId> streams;
  // The subset of `streams` recorded while a CUDA graph capture was
  // underway: work captured on them replays later, so no event waits for it.
  std::vector<StreamId> captured;
  // Events of `streams` not yet completed after the block was freed.
  int pending_events = 0;
};

struct Block {
  std::uintptr_t address = 0;
  std::size_t size = 0;
  Segment* segment = nullptr;
  Block* prev = nullptr;  // physical neighbours in the segment
  Block* next = nullptr;
  BlockState state = BlockState::kFree;
  FreeIndex index = FreeIndex::kNone;
  bool counted_oversize = false;  // in stats' oversize_allocations

  // Metadata of the allocation (valid unless the block was never handed out).
  TagId tag = kNoTag;
  std::size_t requested_size = 0;
  ScopeId scope = kNoScope;
  ContextId context = kNoContext;
  std::uint64_t sequence = 0;

  // Created by the first record_stream on another stream, dropped when the
  // block becomes free again; nullptr for almost every block.
  std::unique_ptr<StreamUses> uses;
  // Garbage collection age: the lookup count of its free lists when it was
  // cached (only kept while a collection threshold is set).
  std::uint64_t cached_at = 0;
  // The segment's creation order (Segment::registration), copied so that
  // keeping a free list in placement order reads no segment.
  std::uint64_t registration = 0;

  // Links in the one list that holds the block, by state: while free and
  // in a size class (FreeIndex::kClassList), its class's free list; while
  // allocated or pending under a leak scope, its scope's list (scope_list).
  // A block is never in both, so the two lists share the links.
  Block* list_prev = nullptr;
  Block* list_next = nullptr;
  // Leak-scope membership while allocated or pending (nullptr otherwise).
  ScopeBlocks* scope_list = nullptr;

  PoolKind pool() const { return segment->pool; }
  PrivatePool* owner() const { return segment->owner; }
  StreamId stream() const { return segment->stream; }
  // True unless the block spans its whole segment.
  bool IsSplit() const { return prev != nullptr || next != nullptr; }
  bool HasStreamUses() const { return uses != nullptr && !uses->streams.empty(); }
  int pending_events() const { return uses == nullptr ? 0 : uses->pending_events; }
};

// Two cache lines: the allocation and free paths touch one block's fields
// all together, and a third line per block was a third cache miss.
static_assert(sizeof(Block) <= 128, "Block must fit in two cache lines");

}  // namespace torchmem

#endif  // TORCHMEM_CORE_BLOCK_H_
