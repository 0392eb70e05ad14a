#include "torchmem/core/free_lists.h"

#include <bit>
#include <cassert>

namespace torchmem {

FreeLists::FreeLists(std::size_t unit) : unit_shift_(std::countr_zero(unit)) {
  assert(std::has_single_bit(unit));
}

void FreeLists::NewChunk(std::unique_ptr<Chunk>& chunk) {
  chunk = std::make_unique<Chunk>(Chunk{});
}

void FreeLists::SetBit(std::size_t cls) {
  const std::size_t word = cls / 64;
  bits_[word] |= std::uint64_t{1} << (cls % 64);
  summary_[word / 64] |= std::uint64_t{1} << (word % 64);
}

void FreeLists::ClearBit(std::size_t cls) {
  const std::size_t word = cls / 64;
  bits_[word] &= ~(std::uint64_t{1} << (cls % 64));
  if (bits_[word] == 0) summary_[word / 64] &= ~(std::uint64_t{1} << (word % 64));
}

std::size_t FreeLists::FirstNonEmptyFrom(std::size_t cls) const {
  std::size_t word = cls / 64;
  const std::uint64_t here = bits_[word] & (~std::uint64_t{0} << (cls % 64));
  if (here != 0) return word * 64 + std::countr_zero(here);
  // Look for the next non-empty bitmap word through the summary.
  ++word;
  for (std::size_t summary = word / 64; summary < kSummaryWords; ++summary) {
    std::uint64_t mask = summary_[summary];
    if (summary == word / 64) mask &= ~std::uint64_t{0} << (word % 64);
    if (mask != 0) {
      const std::size_t found = summary * 64 + std::countr_zero(mask);
      return found * 64 + std::countr_zero(bits_[found]);
    }
  }
  return kClassCount;
}

void FreeLists::Insert(Block* block) {
  assert(block->index == FreeIndex::kNone);
  ++count_;
  // PlacedBefore compares blocks' copies: one read of the segment here
  // rather than one per block walked past.
  block->registration = block->segment->registration;
  const std::size_t cls = ClassOf(block->size);
  if (cls >= kClassCount) {
    block->index = FreeIndex::kOversized;
    if (block->next == nullptr && block->segment->vmm && range_tail_ == nullptr) {
      range_tail_ = block;
    } else {
      oversized_.insert(block);
    }
    return;
  }
  // Keep the list in placement order, so that the head is handed out first.
  Block*& head = Head(cls);
  if (head == nullptr) SetBit(cls);
  Block* prev = nullptr;
  Block* next = head;
  while (next != nullptr && PlacedBefore(next, block)) {
    prev = next;
    next = next->list_next;
  }
  block->list_prev = prev;
  block->list_next = next;
  if (prev != nullptr) {
    prev->list_next = block;
  } else {
    head = block;
  }
  if (next != nullptr) next->list_prev = block;
  block->index = FreeIndex::kClassList;
}

void FreeLists::Remove(Block* block) {
  --count_;
  if (block->index == FreeIndex::kOversized) {
    if (block == range_tail_) {
      range_tail_ = nullptr;
    } else {
      oversized_.erase(block);
    }
    block->index = FreeIndex::kNone;
    return;
  }
  assert(block->index == FreeIndex::kClassList);
  const std::size_t cls = ClassOf(block->size);
  if (block->list_prev != nullptr) {
    block->list_prev->list_next = block->list_next;
  } else {
    Block*& head = Head(cls);
    head = block->list_next;
    if (head == nullptr) ClearBit(cls);
  }
  if (block->list_next != nullptr) block->list_next->list_prev = block->list_prev;
  block->list_prev = block->list_next = nullptr;
  block->index = FreeIndex::kNone;
}

const Block* FreeLists::FindMisplaced() const {
  // Walks only the non-empty classes, through both bitmap levels: the
  // checker runs after every fuzzed operation.
  for (std::size_t summary = 0; summary < kSummaryWords; ++summary) {
    for (std::uint64_t words = summary_[summary]; words != 0; words &= words - 1) {
      const std::size_t word = summary * 64 + std::countr_zero(words);
      for (std::uint64_t bits = bits_[word]; bits != 0; bits &= bits - 1) {
        const std::size_t cls = word * 64 + std::countr_zero(bits);
        const Block* prev = nullptr;
        for (const Block* block = HeadOrNull(cls); block != nullptr; block = block->list_next) {
          if (ClassOf(block->size) != cls || block->list_prev != prev ||
              (prev != nullptr && !PlacedBefore(prev, block))) {
            return block;
          }
          prev = block;
        }
      }
    }
  }
  return nullptr;
}

Block* FreeLists::PeekBestFit(std::size_t size) const {
  const std::size_t cls = ClassOf(size);
  if (cls < kClassCount) {
    const std::size_t found = FirstNonEmptyFrom(cls);
    if (found < kClassCount) return HeadOrNull(found);
  }
  // Every oversized block is larger than every class block.
  auto it = oversized_.lower_bound(SizeProbe{size});
  Block* set_fit = it == oversized_.end() ? nullptr : *it;
  if (range_tail_ == nullptr || range_tail_->size < size) return set_fit;
  if (set_fit == nullptr || BySizeThenPlacement()(range_tail_, set_fit)) return range_tail_;
  return set_fit;
}

Block* FreeLists::TakeBestFit(std::size_t size) {
  Block* block = PeekBestFit(size);
  if (block != nullptr) Remove(block);
  return block;
}

}  // namespace torchmem
