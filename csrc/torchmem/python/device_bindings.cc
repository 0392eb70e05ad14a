// Engines of accelerator devices (CUDA), reached through the providers that
// their own modules register (see torchmem/core/device_engines.h): this
// module contains no CUDA code and imports with a CPU-only torch.
#include <string>

#include "torchmem/core/device_engines.h"
#include "torchmem/python/bindings.h"

namespace torchmem::python {

void RegisterDevices(py::module_& m) {
  m.def(
      "cuda_engine",
      [](int device) {
        DeviceEngineProvider* provider = FindDeviceEngineProvider("cuda");
        if (provider == nullptr) {
          throw std::runtime_error(
              "torchmem: CUDA support is not loaded in this process: torchmem.install() (or "
              "importing torchmem._C_cuda, which needs a CUDA build of torch) provides it");
        }
        absl::StatusOr<Engine*> engine = provider->EngineFor(device);
        ThrowIfError(engine.status());
        return WrapBorrowedEngine(**engine);
      },
      py::arg("device"), "The engine behind CUDA device `device` (created on first use).");
  m.def(
      "cuda_engines",
      []() {
        py::list engines;
        DeviceEngineProvider* provider = FindDeviceEngineProvider("cuda");
        if (provider == nullptr) return engines;
        for (const auto& [device, engine] : provider->Engines()) {
          engines.append(py::make_tuple(device, WrapBorrowedEngine(*engine)));
        }
        return engines;
      },
      "(device, engine) for every CUDA engine created so far; [] before CUDA support loads.");
  m.def("cuda_support_loaded", []() { return FindDeviceEngineProvider("cuda") != nullptr; });
}

}  // namespace torchmem::python
