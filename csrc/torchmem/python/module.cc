// The torchmem._C extension module.
#include <pybind11/pybind11.h>

#include "torchmem/python/bindings.h"

PYBIND11_MODULE(_C, m) {
  m.doc() = "torchmem's engine, torch glue and stack capture (use the torchmem package)";
  torchmem::python::RegisterBuildInfo(m);
  torchmem::python::RegisterEngine(m);
  torchmem::python::RegisterAttribution(m);
  torchmem::python::RegisterInstall(m);
  torchmem::python::RegisterCapture(m);
#ifdef TORCHMEM_WITH_CUDA
  torchmem::python::RegisterCuda(m);
#endif
}
