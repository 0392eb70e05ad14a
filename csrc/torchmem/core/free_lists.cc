#include "torchmem/core/free_lists.h"

#include <cassert>

namespace torchmem {

void FreeLists::Park(Block* block) {
  assert(block->index == FreeIndex::kNone);
  auto [it, inserted] = parked_heads_.try_emplace(block->size, nullptr);
  if (inserted) parked_sizes_.insert(block->size);
  Block*& head = it->second;
  block->cache_prev = nullptr;
  block->cache_next = head;
  if (head != nullptr) head->cache_prev = block;
  head = block;
  block->index = FreeIndex::kParked;
  ++parked_count_;
}

void FreeLists::Unpark(Block* block) {
  assert(block->index == FreeIndex::kParked);
  Unlink(block, parked_heads_.find(block->size)->second);
}

void FreeLists::Unlink(Block* block, Block*& head) {
  if (block->cache_prev != nullptr) {
    block->cache_prev->cache_next = block->cache_next;
  } else {
    head = block->cache_next;
  }
  if (block->cache_next != nullptr) block->cache_next->cache_prev = block->cache_prev;
  block->cache_prev = block->cache_next = nullptr;
  block->index = FreeIndex::kNone;
  --parked_count_;
}

Block* FreeLists::BestFitParked(std::size_t size) {
  if (parked_count_ == 0) return nullptr;
  auto it = parked_sizes_.lower_bound(size);
  while (it != parked_sizes_.end()) {
    auto head = parked_heads_.find(*it);
    if (head->second != nullptr) return head->second;
    parked_heads_.erase(head);
    it = parked_sizes_.erase(it);
  }
  return nullptr;
}

Block* FreeLists::TakeAnyParked() {
  while (parked_count_ > 0) {
    auto it = parked_sizes_.begin();
    auto head = parked_heads_.find(*it);
    if (head->second != nullptr) {
      Block* block = head->second;
      Unlink(block, head->second);
      return block;
    }
    parked_heads_.erase(head);
    parked_sizes_.erase(it);
  }
  return nullptr;
}

void FreeLists::TreeInsert(Block* block) {
  assert(block->index == FreeIndex::kNone);
  tree_.insert(block);
  block->index = FreeIndex::kTree;
}

void FreeLists::TreeErase(Block* block) {
  assert(block->index == FreeIndex::kTree);
  tree_.erase(block);
  block->index = FreeIndex::kNone;
}

Block* FreeLists::BestFitTree(std::size_t size) const {
  auto it = tree_.lower_bound(SizeProbe{size});
  return it == tree_.end() ? nullptr : *it;
}

}  // namespace torchmem
