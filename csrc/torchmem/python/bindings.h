// torchmem._C: the registration functions of each binding file, and the
// helpers they share. Bindings are thin: they convert engine reports to
// plain Python data (dicts, lists, ints), release the GIL around engine
// calls, and turn absl::Status errors into Python exceptions.
#ifndef TORCHMEM_PYTHON_BINDINGS_H_
#define TORCHMEM_PYTHON_BINDINGS_H_

#include <pybind11/pybind11.h>

#include <memory>

#include "absl/status/status.h"
#include "torchmem/core/engine.h"
#include "torchmem/core/reports.h"

namespace torchmem::python {

namespace py = pybind11;

// An engine as seen from Python: owned (a standalone engine made from
// Python) or borrowed (an engine of the torch glue, alive for the process).
struct EngineHandle {
  std::shared_ptr<Engine> owned;
  Engine* engine;
  Engine* operator->() const { return engine; }
};
py::object WrapBorrowedEngine(Engine& engine);

void RegisterEngine(py::module_& m);
void RegisterAttribution(py::module_& m);
void RegisterInstall(py::module_& m);
void RegisterCapture(py::module_& m);
void RegisterDevices(py::module_& m);
void RegisterBuildInfo(py::module_& m);
void RegisterCollector(py::module_& m);

// Raises the Python exception for an error status: ValueError for bad
// arguments and unknown pointers, torch.OutOfMemoryError when out of
// memory, RuntimeError otherwise. Does nothing for OK.
void ThrowIfError(const absl::Status& status);

py::dict BlockToDict(const BlockInfo& block);
py::dict SurvivorsToDict(const ScopeSurvivors& survivors);

}  // namespace torchmem::python

#endif  // TORCHMEM_PYTHON_BINDINGS_H_
