// CUDA engines and the addresses of the CUDAPluggableAllocator entry points
// (built only with the CUDA backend).
#ifdef TORCHMEM_WITH_CUDA

#include <cstdint>

#include "torchmem/python/bindings.h"
#include "torchmem/torch/cuda_allocator.h"

namespace torchmem::python {

void RegisterCuda(py::module_& m) {
  m.def("cuda_engine",
        [](int device) { return WrapBorrowedEngine(torch_glue::CudaEngine(device)); },
        py::arg("device"));
  m.def("cuda_engines", []() {
    py::list engines;
    for (const auto& [device, engine] : torch_glue::CudaEngines()) {
      engines.append(py::make_tuple(device, WrapBorrowedEngine(*engine)));
    }
    return engines;
  });
  m.def(
      "cuda_entry_points",
      []() {
        auto address = [](auto* fn) { return reinterpret_cast<std::uintptr_t>(fn); };
        py::dict d;
        d["malloc"] = py::make_tuple("torchmem_cuda_malloc", address(&torchmem_cuda_malloc));
        d["free"] = py::make_tuple("torchmem_cuda_free", address(&torchmem_cuda_free));
        d["init"] = py::make_tuple("torchmem_cuda_init", address(&torchmem_cuda_init));
        d["reset"] = py::make_tuple("torchmem_cuda_reset", address(&torchmem_cuda_reset));
        d["memory_fraction"] = py::make_tuple("torchmem_cuda_set_memory_fraction",
                                              address(&torchmem_cuda_set_memory_fraction));
        d["record_stream"] = py::make_tuple("torchmem_cuda_record_stream",
                                            address(&torchmem_cuda_record_stream));
        d["base_allocation"] = py::make_tuple("torchmem_cuda_base_allocation",
                                              address(&torchmem_cuda_base_allocation));
        return d;
      },
      "name -> (exported symbol, function address) of each CUDAPluggableAllocator entry point");
}

}  // namespace torchmem::python

#endif  // TORCHMEM_WITH_CUDA
