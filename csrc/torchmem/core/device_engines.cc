#include "torchmem/core/device_engines.h"

#include <string>

#include "absl/container/flat_hash_map.h"
#include "torchmem/core/mutex.h"

namespace torchmem {
namespace {

struct Providers {
  Mutex mutex;
  absl::flat_hash_map<std::string, DeviceEngineProvider*> by_type ABSL_GUARDED_BY(mutex);
};

// Leaked: providers are looked up during static destruction (tensor
// deleters, leak reports at exit).
Providers& Registry() {
  static Providers* providers = new Providers;
  return *providers;
}

}  // namespace

bool RegisterDeviceEngineProvider(std::string_view device_type, DeviceEngineProvider* provider) {
  Providers& providers = Registry();
  MutexLock lock(&providers.mutex);
  return providers.by_type.try_emplace(std::string(device_type), provider).second;
}

DeviceEngineProvider* FindDeviceEngineProvider(std::string_view device_type) {
  Providers& providers = Registry();
  MutexLock lock(&providers.mutex);
  auto it = providers.by_type.find(std::string(device_type));
  return it == providers.by_type.end() ? nullptr : it->second;
}

}  // namespace torchmem
