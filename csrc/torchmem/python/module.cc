// The torchmem._C extension module.
#include <pybind11/pybind11.h>

#include "torchmem/core/shared_library.h"
#include "torchmem/python/bindings.h"

PYBIND11_MODULE(_C, m) {
  m.doc() = "torchmem's engine, torch glue and stack capture (use the torchmem package)";
  torchmem::python::RegisterBuildInfo(m);
  if (torchmem::SharedLibraryFingerprint() != torchmem::CompiledInterfaceFingerprint()) {
    throw std::runtime_error(
        "torchmem._C was built against a different libtorchmem.so than the one in "
        "torchmem/lib: the build is stale; rebuild torchmem (python setup.py build_ext "
        "--inplace, or reinstall the package)");
  }
  torchmem::python::RegisterEngine(m);
  torchmem::python::RegisterAttribution(m);
  torchmem::python::RegisterInstall(m);
  torchmem::python::RegisterCapture(m);
  torchmem::python::RegisterDevices(m);
  torchmem::python::RegisterCollector(m);
}
