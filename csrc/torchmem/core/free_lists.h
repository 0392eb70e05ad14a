// FreeLists: the cached free blocks of one (stream, pool), engine-internal.
//
// Two indexes, each free block in exactly one of them:
//   - the best-fit tree, ordered by (size, address) like PyTorch's BlockPool;
//     its blocks are always merged with their free neighbours;
//   - the exact-size cache: a LIFO list per rounded size of blocks that were
//     freed and not merged yet ("parked"). Freeing parks a block in O(1), and
//     an allocation of the same rounded size takes it back in O(1): the common
//     case of a training loop, which allocates the same sizes every step.
// Parked blocks are merged into the tree (coalesced with free neighbours)
// when the engine needs contiguous space: before it would go to the backend,
// and on empty_cache. Best fit looks at both indexes, so the block chosen is
// the smallest free block that fits, as in PyTorch.
//
// Not thread-safe: the engine's lock guards it.
#ifndef TORCHMEM_CORE_FREE_LISTS_H_
#define TORCHMEM_CORE_FREE_LISTS_H_

#include <cstddef>

#include "absl/container/btree_set.h"
#include "absl/container/flat_hash_map.h"
#include "torchmem/core/block.h"

namespace torchmem {

class FreeLists {
 public:
  FreeLists() = default;
  FreeLists(const FreeLists&) = delete;
  FreeLists& operator=(const FreeLists&) = delete;

  // --- exact-size cache --------------------------------------------------
  void Park(Block* block);
  void Unpark(Block* block);
  // Most recently parked block of exactly `size` bytes, removed; or nullptr.
  Block* TakeParkedExact(std::size_t size) {
    auto it = parked_heads_.find(size);
    if (it == parked_heads_.end() || it->second == nullptr) return nullptr;
    Block* block = it->second;
    Unlink(block, it->second);
    return block;
  }
  // Smallest parked block of at least `size` bytes, not removed; or nullptr.
  Block* BestFitParked(std::size_t size);
  std::size_t parked_count() const { return parked_count_; }
  // Removes and returns any parked block; nullptr if none is left.
  Block* TakeAnyParked();

  // --- best-fit tree -----------------------------------------------------
  void TreeInsert(Block* block);
  void TreeErase(Block* block);
  // Smallest tree block of at least `size` bytes, not removed; or nullptr.
  Block* BestFitTree(std::size_t size) const;
  std::size_t tree_count() const { return tree_.size(); }

  // Visits every free block of both indexes (for checks and reports).
  template <typename Fn>
  void ForEachFree(Fn fn) const {
    for (Block* block : tree_) fn(block);
    for (const auto& [size, head] : parked_heads_) {
      for (Block* block = head; block != nullptr; block = block->cache_next) fn(block);
    }
  }

 private:
  // Orders by (size, address); transparent so best fit can probe with a
  // bare size.
  struct SizeProbe {
    std::size_t size;
  };
  struct BySizeThenAddress {
    using is_transparent = void;
    bool operator()(const Block* a, const Block* b) const {
      return a->size != b->size ? a->size < b->size : a->address < b->address;
    }
    bool operator()(const Block* a, SizeProbe b) const { return a->size < b.size; }
    // A probe orders before every block of its size: it stands for the
    // lowest possible address.
    bool operator()(SizeProbe a, const Block* b) const { return a.size <= b->size; }
  };

  void Unlink(Block* block, Block*& head);

  absl::btree_set<Block*, BySizeThenAddress> tree_;
  // Head of the LIFO list of parked blocks per size. Emptied lists keep
  // their entry, so alternating alloc/free of one size never rehashes;
  // BestFitParked prunes the empty ones it steps over.
  absl::flat_hash_map<std::size_t, Block*> parked_heads_;
  // The keys of parked_heads_, ordered, for best fit.
  absl::btree_set<std::size_t> parked_sizes_;
  std::size_t parked_count_ = 0;
};

}  // namespace torchmem

#endif  // TORCHMEM_CORE_FREE_LISTS_H_
