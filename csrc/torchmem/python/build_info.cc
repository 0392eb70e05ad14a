// What this torchmem._C was built against: the torch release, its CUDA
// major version and the Python version. The Python package compares it with
// the torch running in the process at import (a C++ extension must run with
// the torch whose headers and libraries it was built with).
//
// The same facts are also embedded as one marker string that the package
// can find in the file without loading it: when the dynamic loader refuses
// the module (a symbol the running torch lacks, a libcudart of another CUDA
// major), the error can still say what it was built for.
#include <string>

#include "torchmem/python/bindings.h"
#include "torchmem/torch/torch_version.h"

#define TORCHMEM_STRINGIFY_(x) #x
#define TORCHMEM_STRINGIFY(x) TORCHMEM_STRINGIFY_(x)

// The CUDA toolkit's "major.minor", defined by cmake/python_module.cmake for
// builds with the CUDA backend.
#ifndef TORCHMEM_BUILT_CUDA_VERSION
#define TORCHMEM_BUILT_CUDA_VERSION "none"
#endif

// Read as bytes by torchmem's import check; keep the format in step with it:
// "torchmem-build-info: torch=X.Y.Z cuda=M.m python=3.N;"
extern "C" __attribute__((used, visibility("default"))) const char torchmem_build_info[] =
    "torchmem-build-info: torch=" TORCH_VERSION " cuda=" TORCHMEM_BUILT_CUDA_VERSION
    " python=" TORCHMEM_STRINGIFY(PY_MAJOR_VERSION) "." TORCHMEM_STRINGIFY(PY_MINOR_VERSION) ";";

namespace torchmem::python {

void RegisterBuildInfo(py::module_& m) {
  py::dict info;
  info["torch"] = std::string(TORCH_VERSION);
  info["cuda"] = std::string(TORCHMEM_BUILT_CUDA_VERSION);
  info["python"] =
      std::string(TORCHMEM_STRINGIFY(PY_MAJOR_VERSION) "." TORCHMEM_STRINGIFY(PY_MINOR_VERSION));
  info["marker"] = std::string(torchmem_build_info);
  m.attr("build_info") = info;
}

}  // namespace torchmem::python
