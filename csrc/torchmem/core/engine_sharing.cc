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
      return vmm_->MappedRun(segment, address);
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
    return absl::FailedPreconditionError(absl::StrFormat(
        "torchmem: the block at %#x on %s is in a segment, not an address range", address,
        device_name_));
  }
  SharedPages shared;
  shared.page_size = vmm_->page_size();
  shared.first_page = address & ~(shared.page_size - 1);
  const std::uintptr_t end = (block.address + block.size + shared.page_size - 1) &
                             ~(shared.page_size - 1);
  absl::StatusOr<std::vector<PhysicalPage>> handles =
      vmm_->HandlesOf(shared.first_page, end - shared.first_page);
  if (!handles.ok()) return handles.status();
  shared.handles = *std::move(handles);
  return shared;
}

}  // namespace torchmem
