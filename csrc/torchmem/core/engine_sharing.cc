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

}  // namespace torchmem
