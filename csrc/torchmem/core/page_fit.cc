#include "torchmem/core/page_fit.h"

#include <limits>
#include <tuple>

namespace torchmem {

PageFitChoice ChoosePageFit(const FreeLists& lists, std::size_t size, const VmmSpace& space) {
  const auto extent = [](const Block* block) {
    return block->next == nullptr ? std::numeric_limits<std::size_t>::max() : block->size;
  };
  // The common case of a training loop: a free block of about this size
  // whose pages are already touched by its neighbours.
  Block* best_fit = lists.PeekBestFit(size);
  if (best_fit == nullptr) return {};
  if (best_fit->next != nullptr && space.UntouchedPages(best_fit->address, size) == 0) {
    return {best_fit, best_fit->address};
  }
  PageFitChoice choice;
  std::tuple<std::int64_t, std::size_t, std::uintptr_t> best{
      std::numeric_limits<std::int64_t>::max(), 0, 0};
  lists.ForEachFreeAtLeast(size, [&](Block* block) {
    const std::uintptr_t candidates[] = {block->address, block->address + block->size - size};
    const int count = block->next != nullptr && block->size > size ? 2 : 1;
    for (int i = 0; i < count; ++i) {
      const std::int64_t untouched = space.UntouchedPages(candidates[i], size);
      if (untouched > std::get<0>(best)) continue;
      const auto score = std::make_tuple(untouched, extent(block), candidates[i]);
      if (score < best) {
        best = score;
        choice = {block, candidates[i]};
      }
    }
  });
  return choice;
}

}  // namespace torchmem
