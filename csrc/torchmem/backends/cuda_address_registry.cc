#include "torchmem/backends/cuda_address_registry.h"

#include <mutex>
#include <shared_mutex>

#include "absl/container/btree_map.h"

namespace torchmem {
namespace {

struct Range {
  std::size_t size;
  int device;
};

struct Registry {
  std::shared_mutex mutex;
  absl::btree_map<std::uintptr_t, Range> ranges;  // by base address; never overlapping
};

// Never destroyed: tensors may be freed during static destruction.
Registry& GetRegistry() {
  static Registry* registry = new Registry;
  return *registry;
}

}  // namespace

void RegisterCudaAddressRange(std::uintptr_t base, std::size_t size, int device) {
  Registry& r = GetRegistry();
  std::unique_lock lock(r.mutex);
  r.ranges[base] = Range{size, device};
}

void UnregisterCudaAddressRange(std::uintptr_t base) {
  Registry& r = GetRegistry();
  std::unique_lock lock(r.mutex);
  r.ranges.erase(base);
}

int CudaDeviceOwning(std::uintptr_t address) {
  Registry& r = GetRegistry();
  std::shared_lock lock(r.mutex);
  auto it = r.ranges.upper_bound(address);
  if (it == r.ranges.begin()) return -1;
  --it;
  return address - it->first < it->second.size ? it->second.device : -1;
}

}  // namespace torchmem
