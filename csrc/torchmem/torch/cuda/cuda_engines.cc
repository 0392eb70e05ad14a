#include "torchmem/torch/cuda/cuda_engines.h"

#include <array>
#include <atomic>
#include <memory>
#include <mutex>

#include <c10/util/Exception.h>

#include "absl/strings/str_format.h"
#include "torchmem/backends/cuda_address_registry.h"
#include "torchmem/backends/cuda_backend.h"
#include "torchmem/core/device_engines.h"
#include "torchmem/torch/cuda/cuda_fork_locks.h"

namespace torchmem::torch_glue {
namespace {

std::array<std::atomic<Engine*>, kMaxCudaDevices> g_engines{};
// Each engine's backend (set with the engine, before it is published).
std::array<CudaBackend*, kMaxCudaDevices> g_backends{};
std::mutex g_engines_mutex;
std::atomic<CudaEngineInitializer> g_initializer{nullptr};

class CudaEngineProvider final : public DeviceEngineProvider {
 public:
  absl::StatusOr<Engine*> EngineFor(int index) override { return FindCudaEngine(index); }
  std::vector<std::pair<int, Engine*>> Engines() override { return CudaEngines(); }
};

}  // namespace

absl::StatusOr<Engine*> FindCudaEngine(int device) {
  if (device < 0 || device >= kMaxCudaDevices) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "torchmem: CUDA device index %d is out of range (torchmem serves devices 0..%d)", device,
        kMaxCudaDevices - 1));
  }
  Engine* engine = g_engines[device].load(std::memory_order_acquire);
  if (engine != nullptr) return engine;
  std::lock_guard<std::mutex> lock(g_engines_mutex);
  engine = g_engines[device].load(std::memory_order_relaxed);
  if (engine == nullptr) {
    auto backend = std::make_unique<CudaBackend>(device);
    g_backends[device] = backend.get();
    engine = new Engine(std::move(backend));
    if (CudaEngineInitializer initialize = g_initializer.load(std::memory_order_acquire)) {
      initialize(device, *engine);
    }
    g_engines[device].store(engine, std::memory_order_release);
  }
  return engine;
}

Engine& CudaEngine(int device) {
  absl::StatusOr<Engine*> engine = FindCudaEngine(device);
  TORCH_CHECK(engine.ok(), std::string(engine.status().message()));
  return **engine;
}

Engine* ExistingCudaEngine(int device) {
  if (device < 0 || device >= kMaxCudaDevices) return nullptr;
  return g_engines[device].load(std::memory_order_acquire);
}

std::vector<std::pair<int, Engine*>> CudaEngines() {
  std::vector<std::pair<int, Engine*>> engines;
  for (int device = 0; device < kMaxCudaDevices; ++device) {
    if (Engine* engine = g_engines[device].load(std::memory_order_acquire)) {
      engines.emplace_back(device, engine);
    }
  }
  return engines;
}

int CudaDeviceOwning(const void* ptr) {
  return torchmem::CudaDeviceOwning(reinterpret_cast<std::uintptr_t>(ptr));
}

Engine* CudaEngineOwning(const void* ptr) {
  const int device = CudaDeviceOwning(ptr);
  return device < 0 ? nullptr : ExistingCudaEngine(device);
}

CudaBackend& CudaBackendOf(int device) {
  (void)CudaEngine(device);
  return *g_backends[device];
}

void LockEngineTableForFork() { g_engines_mutex.lock(); }

void UnlockEngineTableAfterFork() { g_engines_mutex.unlock(); }

void SetCudaEngineInitializer(CudaEngineInitializer initializer) {
  g_initializer.store(initializer, std::memory_order_release);
}

void RegisterCudaEngineProvider() {
  static CudaEngineProvider* provider = new CudaEngineProvider;
  (void)RegisterDeviceEngineProvider("cuda", provider);
}

}  // namespace torchmem::torch_glue
