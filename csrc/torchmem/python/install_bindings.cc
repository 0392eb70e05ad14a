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
//
// Only on threads Python knows (a thread state of their own): a thread it
// does not (TorchScript's inter-op pool, NCCL's and c10d's workers, a C++
// library's threads) would take the GIL here from inside the allocator,
// where the thread that holds the GIL may be waiting for it (a deadlock);
// and collecting there runs arbitrary finalizers on a thread that never
// asked for Python. PyTorch's own allocator calls no Python at all.
bool CollectGarbageForRetry() {
  if (InterpreterGone()) return false;
  if (PyGILState_GetThisThreadState() == nullptr) return false;
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
  m.def(
      "cpu_default_allocator_route",
      []() {
        const torch_glue::DefaultAllocatorRoute route = torch_glue::GetDefaultAllocatorRoute();
        return py::make_tuple(route.taken_over, route.reason);
      },
      "(taken_over, reason): whether torch.UntypedStorage(n), storage.clone() and deepcopy of CPU "
      "tensors come from torchmem while installed, and why not when they do not.");
  m.def(
      "default_cpu_allocator_raw_allocate",
      [](std::size_t bytes) {
        return reinterpret_cast<std::uintptr_t>(torch_glue::DefaultAllocatorRawAllocate(bytes));
      },
      py::arg("bytes"),
      "c10::GetDefaultCPUAllocator()->raw_allocate(bytes), as an address (for tests).");
  m.def(
      "default_cpu_allocator_raw_deallocate",
      [](std::uintptr_t address) {
        torch_glue::DefaultAllocatorRawDeallocate(reinterpret_cast<void*>(address));
      },
      py::arg("address"), "c10::GetDefaultCPUAllocator()->raw_deallocate(address) (for tests).");
  m.def("cpu_engine", []() { return WrapBorrowedEngine(torch_glue::CpuEngine()); });
  m.def(
      "set_gc_retry",
      [](bool enabled) { SetOutOfMemoryRetryHook(enabled ? &CollectGarbageForRetry : nullptr); },
      py::arg("enabled"),
      "When on, an allocation about to fail runs gc.collect() and retries once.");
}

}  // namespace torchmem::python
