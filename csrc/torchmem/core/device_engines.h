// Device engines: how the parts of torchmem that own no accelerator code
// find the engines of an accelerator whose code lives elsewhere.
//
// torchmem ships as one shared library (the engine, the host backend, the
// CPU glue) used by two extension modules: torchmem._C, which must import
// with a CPU-only torch, and torchmem._C_cuda, which holds everything that
// needs the CUDA runtime and torch's CUDA libraries. _C_cuda registers a
// provider for "cuda" when it is imported; _C's bindings (stats, reports,
// leak checks) reach the CUDA engines only through it, so _C contains no
// CUDA symbol.
//
// Invariants: a provider, once registered, stays registered for the life of
// the process (its engines are never destroyed); registering the same
// device type twice keeps the first provider.
#ifndef TORCHMEM_CORE_DEVICE_ENGINES_H_
#define TORCHMEM_CORE_DEVICE_ENGINES_H_

#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "torchmem/core/engine.h"

namespace torchmem {

class DeviceEngineProvider {
 public:
  virtual ~DeviceEngineProvider() = default;
  // The engine of device `index`, created on first use; an error names the
  // valid range (or why the device cannot be served).
  virtual absl::StatusOr<Engine*> EngineFor(int index) = 0;
  // (index, engine) of every engine created so far, by index.
  virtual std::vector<std::pair<int, Engine*>> Engines() = 0;
};

// Takes no ownership: `provider` must live for the rest of the process.
// Returns false (and changes nothing) if `device_type` already has one.
bool RegisterDeviceEngineProvider(std::string_view device_type, DeviceEngineProvider* provider);
// nullptr if nothing registered `device_type` (e.g. torchmem._C_cuda was
// never imported).
DeviceEngineProvider* FindDeviceEngineProvider(std::string_view device_type);

}  // namespace torchmem

#endif  // TORCHMEM_CORE_DEVICE_ENGINES_H_
