// Engine: the device allocation behind a pointer, as code outside the
// allocator sees it (PyTorch's getBaseAllocation).
#include "absl/strings/str_format.h"
#include "torchmem/core/engine.h"

namespace torchmem {

absl::StatusOr<std::pair<std::uintptr_t, std::size_t>> Engine::BaseAllocation(
    const void* ptr) const {
  MutexLock lock(&mutex_);
  const auto address = reinterpret_cast<std::uintptr_t>(ptr);
  auto it = segments_.upper_bound(address);
  if (it != segments_.begin()) {
    const Segment& segment = *std::prev(it)->second;
    if (address < segment.address + segment.size) {
      if (!segment.vmm) return std::make_pair(segment.address, segment.size);
      return SpaceOf(segment).MappedRun(segment, address);
    }
  }
  return absl::NotFoundError(
      absl::StrFormat("torchmem: %#x is in no segment of %s", address, device_name_));
}

absl::StatusOr<Engine::SharedPages> Engine::PagesOfBlock(const void* ptr) const {
  MutexLock lock(&mutex_);
  const auto address = reinterpret_cast<std::uintptr_t>(ptr);
  auto it = blocks_.find(address);
  if (it == blocks_.end() || it->second->state != BlockState::kAllocated) {
    return absl::NotFoundError(
        absl::StrFormat("torchmem: no allocated block at %#x on %s", address, device_name_));
  }
  const Block& block = *it->second;
  if (!block.segment->vmm) {
    return absl::FailedPreconditionError(
        absl::StrFormat("torchmem: the block at %#x on %s is in a segment, not an address range",
                        address, device_name_));
  }
  // The pages of the block's pool kind (20 MiB in the large pool: not a
  // power of two, so no masks).
  const VmmSpace& space = SpaceOf(*block.segment);
  SharedPages shared;
  shared.page_size = space.page_size();
  shared.first_page = space.AddressOf(space.PageOf(address));
  const std::uintptr_t end = space.AddressOf(space.PageOf(block.address + block.size - 1) + 1);
  absl::StatusOr<std::vector<PhysicalPage>> handles =
      space.HandlesOf(shared.first_page, end - shared.first_page);
  if (!handles.ok()) return handles.status();
  shared.handles = *std::move(handles);
  return shared;
}

}  // namespace torchmem
