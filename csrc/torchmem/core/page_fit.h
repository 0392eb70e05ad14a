// Page fit: where a block goes in a virtual-memory range (engine-internal).
//
// In a range whose pages are mapped on demand (vmm_space.h), what a
// placement costs is the pages it touches that no live block touches yet:
// each one is a new physical page. Page fit chooses, among every free block
// of the range that is large enough, placed at its start or flush against
// its end (the range's tail block only at its start), the placement that
// touches the fewest untouched pages; among equals the smallest free block
// (best fit, the tail counting as infinitely large), then the lowest address.
// The study in benchmarks/vmm_model/VMM_PLACEMENT.md chose it: on the 22
// traces it is the only rule that met issue 12's worst-trace goal.
//
// Cost: the best-fit block is tried first and taken if it touches no new
// page (then nothing can beat it); otherwise every free block of at least
// the size is scored, two page lookups each.
#ifndef TORCHMEM_CORE_PAGE_FIT_H_
#define TORCHMEM_CORE_PAGE_FIT_H_

#include <cstddef>
#include <cstdint>

#include "torchmem/core/free_lists.h"
#include "torchmem/core/vmm_space.h"

namespace torchmem {

struct PageFitChoice {
  Block* block = nullptr;      // the free block to carve; nullptr: none fits
  std::uintptr_t address = 0;  // where in it the new block starts
};

// `lists` holds the free blocks of one range; `size` is a rounded size.
PageFitChoice ChoosePageFit(const FreeLists& lists, std::size_t size, const VmmSpace& space);

}  // namespace torchmem

#endif  // TORCHMEM_CORE_PAGE_FIT_H_
