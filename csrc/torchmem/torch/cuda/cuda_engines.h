// The engines behind CUDA devices: one per device, each over a CudaBackend,
// created on first use and never destroyed (tensors can be freed during
// static destruction, and PyTorch keeps deleters pointing at us).
//
// Lives in torchmem._C_cuda; RegisterCudaEngineProvider() makes the engines
// reachable from torchmem._C through the device-engine registry of
// libtorchmem.so (torchmem/core/device_engines.h).
#ifndef TORCHMEM_TORCH_CUDA_CUDA_ENGINES_H_
#define TORCHMEM_TORCH_CUDA_CUDA_ENGINES_H_

#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "torchmem/backends/cuda_backend.h"
#include "torchmem/core/engine.h"

namespace torchmem::torch_glue {

// Devices torchmem can serve.
inline constexpr int kMaxCudaDevices = 64;

// The engine of `device`, created on first use (InvalidArgument outside
// [0, kMaxCudaDevices)).
absl::StatusOr<Engine*> FindCudaEngine(int device);
// As FindCudaEngine, raising a c10::Error on a bad index.
Engine& CudaEngine(int device);
// The engine of `device` if it exists already, else nullptr. Never creates.
Engine* ExistingCudaEngine(int device);
// (device, engine) of every engine created so far, by device.
std::vector<std::pair<int, Engine*>> CudaEngines();
// The engine that allocated `ptr` (a block or segment address), or nullptr:
// the device whose backend registered the segment or range holding it
// (cuda_address_registry.h), so no other engine is asked or locked.
Engine* CudaEngineOwning(const void* ptr);
// The device of that engine, or -1.
int CudaDeviceOwning(const void* ptr);
// The backend under `device`'s engine (the engine is created on first use,
// which touches no device). Raises a c10::Error on a bad index.
CudaBackend& CudaBackendOf(int device);

// Registers the engines as the "cuda" device-engine provider. Idempotent.
void RegisterCudaEngineProvider();

// Called once for each engine right after it is created, before any other
// thread can see it (the allocator applies the current settings with it).
using CudaEngineInitializer = void (*)(int device, Engine& engine);
void SetCudaEngineInitializer(CudaEngineInitializer initializer);

}  // namespace torchmem::torch_glue

#endif  // TORCHMEM_TORCH_CUDA_CUDA_ENGINES_H_
