// VmmSpace: what a range's mapped memory looks like from outside the engine
// (the extent of mapped memory around an address, the physical handles
// behind a span of it), for getBaseAllocation and CUDA IPC.
#include "absl/strings/str_format.h"
#include "torchmem/core/vmm_space.h"

namespace torchmem {

absl::StatusOr<std::pair<std::uintptr_t, std::size_t>> VmmSpace::MappedRun(
    const Segment& range, std::uintptr_t address) const {
  auto mapped = [this](std::uint64_t index) {
    const Page* page = pages_.Find(index);
    return page != nullptr && page->mapped;
  };
  const std::uint64_t at = PageOf(address);
  if (address < range.address || address >= range.address + range.size || !mapped(at)) {
    return absl::NotFoundError(
        absl::StrFormat("torchmem: %#x is on no mapped page of its address range", address));
  }
  const std::uint64_t range_first = PageOf(range.address);
  const std::uint64_t range_last = PageOf(range.address + range.size - 1);
  std::uint64_t first = at;
  while (first > range_first && mapped(first - 1)) --first;
  std::uint64_t last = at;
  while (last < range_last && mapped(last + 1)) ++last;
  return std::make_pair(AddressOf(first), static_cast<std::size_t>(last - first + 1) * page_size_);
}

absl::StatusOr<std::vector<PhysicalPage>> VmmSpace::HandlesOf(std::uintptr_t start,
                                                              std::size_t size) const {
  std::vector<PhysicalPage> handles;
  for (std::uint64_t index = PageOf(start); index <= PageOf(start + size - 1); ++index) {
    const Page* page = pages_.Find(index);
    if (page == nullptr || !page->mapped) {
      return absl::NotFoundError(
          absl::StrFormat("torchmem: the page at %#x is not mapped", AddressOf(index)));
    }
    handles.push_back(page->handle);
  }
  return handles;
}

}  // namespace torchmem
