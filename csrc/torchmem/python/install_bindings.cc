// Installing torchmem into PyTorch, the engines behind it, and the
// garbage-collecting retry on out-of-memory.
#include "torchmem/core/engine.h"
#include "torchmem/python/bindings.h"
#include "torchmem/python/python_compat.h"
#include "torchmem/torch/cpu_allocator.h"

namespace torchmem::python {
namespace {

// The out-of-memory retry hook: runs Python's garbage collector, which may
// free tensors held only by reference cycles. Called by the engine without
// its lock; takes the GIL. gc.collect() rather than PyGC_Collect(): the
// latter does nothing while gc is disabled, which is exactly when training
// loops that disable it for speed accumulate cycles.
bool CollectGarbageForRetry() {
  if (InterpreterGone()) return false;
  py::gil_scoped_acquire gil;
  try {
    const auto collected = py::module_::import("gc").attr("collect")().cast<Py_ssize_t>();
    return collected > 0;
  } catch (const py::error_already_set&) {
    return false;  // e.g. a finalizer raised; the allocation fails as it would have
  }
}

}  // namespace

void RegisterInstall(py::module_& m) {
  m.def("install_cpu", []() { ThrowIfError(torch_glue::InstallCpuAllocator()); });
  m.def("uninstall_cpu", []() { ThrowIfError(torch_glue::UninstallCpuAllocator()); });
  m.def("cpu_installed", &torch_glue::IsCpuAllocatorInstalled);
  m.def("cpu_engine", []() { return WrapBorrowedEngine(torch_glue::CpuEngine()); });
  m.def(
      "set_gc_retry",
      [](bool enabled) { SetOutOfMemoryRetryHook(enabled ? &CollectGarbageForRetry : nullptr); },
      py::arg("enabled"),
      "When on, an allocation about to fail runs gc.collect() and retries once.");
}

}  // namespace torchmem::python
