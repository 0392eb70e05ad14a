// FreeLists: the cached free blocks of one (stream, pool), engine-internal.
//
// A segregated-fit index with one class per possible block size. Every block
// size is a multiple of the policy's rounding unit (512 B), so class
// `size / unit` holds exactly the free blocks of that size, in a LIFO list.
// A two-level bitmap over the classes finds the smallest non-empty class of
// at least a given size in a few word operations. So both the common case of
// a training loop (a block of exactly the requested size was freed earlier)
// and best fit (the smallest free block that fits, PyTorch's policy) cost
// O(1), with no tree to rebalance. Blocks too large for the classes (above
// kClassCount units, 32 MiB with 512 B units: only dedicated segments) live
// in an ordered set instead.
//
// Among blocks of the same size, the block of the oldest segment is handed
// out first, then the lowest address: PyTorch 2.14's order. Its free-block set
// compares (stream, size, segment registration counter, address)
// (`BlockComparatorSizeCounterAddress` in libc10_cuda.so); the counter is
// taken from a global counter at each cudaMalloc and inherited by the blocks
// split from that segment. Blocks keep a copy of it (Block::registration,
// refreshed on Insert) so that keeping a list in order reads no segment. Earlier
// versions broke ties by address alone; the two agree only while newer
// segments sit at higher addresses, which a real or simulated cudaMalloc does
// not promise (the simulated device hands out addresses top down). Each class
// list is kept in that order (insertion walks from the head; lists are short in
// practice, 5-9 blocks on average over the replayed traces). Handing out the
// most recently freed block instead costs the same but reserves up to 0.6%
// more than PyTorch on some traces.
//
// The free tail of a virtual-memory range (the rest of the range after its
// last block: tens of GiB of address space) would go to the oversized set,
// and is split off and merged back on every allocation at the range's end,
// the hot path of expandable segments: it is held in a slot of its own
// instead (a pointer store rather than a tree update), and counted in the
// oversized order wherever that set is searched.
//
// Invariants: each free block is in exactly one place (its class list, the
// oversized set or the range-tail slot; at most one tail per lists: one
// range per (stream, pool), another tail goes to the set); a class's bit is set iff its list is
// non-empty; a summary bit is set iff its bitmap word is non-zero. Not thread-safe: the engine's
// lock guards it.
#ifndef TORCHMEM_CORE_FREE_LISTS_H_
#define TORCHMEM_CORE_FREE_LISTS_H_

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/base/attributes.h"
#include "absl/container/btree_set.h"
#include "torchmem/core/block.h"

namespace torchmem {

class FreeLists {
 public:
  // Classes cover sizes up to kClassCount units; 64 classes per bitmap word.
  static constexpr std::size_t kClassCount = std::size_t{1} << 16;

  explicit FreeLists(std::size_t unit);
  FreeLists(const FreeLists&) = delete;
  FreeLists& operator=(const FreeLists&) = delete;

  void Insert(Block* block);
  void Remove(Block* block);

  // The smallest free block of at least `size` bytes (`size` a multiple of
  // the unit), removed from the index; nullptr if none.
  Block* TakeBestFit(std::size_t size);
  // The same, without removing it.
  Block* PeekBestFit(std::size_t size) const;

  std::size_t size() const { return count_; }

  // For the invariant checker: the first block out of place in a class list
  // (its size is not the class's, its list links disagree, or it would be
  // handed out after the block that follows it), or nullptr if none is.
  const Block* FindMisplaced() const;

  // Visits every free block (for checks and reports).
  template <typename Fn>
  void ForEachFree(Fn fn) const {
    for (std::size_t chunk = 0; chunk < chunks_.size(); ++chunk) {
      if (chunks_[chunk] == nullptr) continue;
      for (Block* head : *chunks_[chunk]) {
        for (Block* block = head; block != nullptr; block = block->list_next) fn(block);
      }
    }
    for (Block* block : oversized_) fn(block);
    if (range_tail_ != nullptr) fn(range_tail_);
  }

  // Visits the free blocks of at least `size` bytes (`size` a multiple of
  // the unit), smallest class first, each class in placement order, through
  // the bitmaps: the classes below `size` cost nothing.
  template <typename Fn>
  void ForEachFreeAtLeast(std::size_t size, Fn fn) const {
    for (std::size_t cls = FirstNonEmptyFrom(std::min(ClassOf(size), kClassCount - 1));
         cls < kClassCount;
         cls = cls + 1 < kClassCount ? FirstNonEmptyFrom(cls + 1) : kClassCount) {
      for (Block* block = HeadOrNull(cls); block != nullptr; block = block->list_next) {
        if (block->size >= size) fn(block);
      }
    }
    for (auto it = oversized_.lower_bound(SizeProbe{size}); it != oversized_.end(); ++it) fn(*it);
    if (range_tail_ != nullptr && range_tail_->size >= size) fn(range_tail_);
  }

 private:
  static constexpr std::size_t kClassesPerChunk = 64;
  static constexpr std::size_t kWords = kClassCount / 64;    // level-1 bitmap words
  static constexpr std::size_t kSummaryWords = kWords / 64;  // level-0 summary words
  using Chunk = std::array<Block*, kClassesPerChunk>;

  // Among blocks of equal size: true if `a` is handed out before `b`.
  static bool PlacedBefore(const Block* a, const Block* b) {
    return a->registration != b->registration ? a->registration < b->registration
                                              : a->address < b->address;
  }
  // Orders by size, then PlacedBefore; transparent so best fit can probe
  // with a bare size, which orders before every block of that size.
  struct SizeProbe {
    std::size_t size;
  };
  struct BySizeThenPlacement {
    using is_transparent = void;
    bool operator()(const Block* a, const Block* b) const {
      return a->size != b->size ? a->size < b->size : PlacedBefore(a, b);
    }
    bool operator()(const Block* a, SizeProbe b) const { return a->size < b.size; }
    bool operator()(SizeProbe a, const Block* b) const { return a.size <= b->size; }
  };

  std::size_t ClassOf(std::size_t size) const { return size >> unit_shift_; }
  Block*& Head(std::size_t cls) {
    std::unique_ptr<Chunk>& chunk = chunks_[cls / kClassesPerChunk];
    if (chunk == nullptr) [[unlikely]]
      NewChunk(chunk);
    return (*chunk)[cls % kClassesPerChunk];
  }
  // Out of line, so that Head stays small enough to inline on the hot path.
  ABSL_ATTRIBUTE_NOINLINE static void NewChunk(std::unique_ptr<Chunk>& chunk);
  Block* HeadOrNull(std::size_t cls) const {
    const std::unique_ptr<Chunk>& chunk = chunks_[cls / kClassesPerChunk];
    return chunk == nullptr ? nullptr : (*chunk)[cls % kClassesPerChunk];
  }
  // Smallest non-empty class >= cls, or kClassCount if none.
  std::size_t FirstNonEmptyFrom(std::size_t cls) const;
  void SetBit(std::size_t cls);
  void ClearBit(std::size_t cls);

  const int unit_shift_;
  std::size_t count_ = 0;
  // List heads, allocated 64 classes at a time on first use.
  std::array<std::unique_ptr<Chunk>, kClassCount / kClassesPerChunk> chunks_;
  std::array<std::uint64_t, kWords> bits_{};
  std::array<std::uint64_t, kSummaryWords> summary_{};
  absl::btree_set<Block*, BySizeThenPlacement> oversized_;
  // A virtual-memory range's free tail (oversized, indexed kOversized).
  Block* range_tail_ = nullptr;
};

}  // namespace torchmem

#endif  // TORCHMEM_CORE_FREE_LISTS_H_
