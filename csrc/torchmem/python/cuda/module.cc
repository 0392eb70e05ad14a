// The torchmem._C_cuda extension module: everything of torchmem that needs
// the CUDA runtime and torch's CUDA libraries.
//
// Built against torch's bundled pybind11 (not pip's, which torchmem._C
// uses): it hands PyTorch objects of PyTorch's own pybind11 types, which
// only a module sharing torch's pybind11 internals can create. It shares
// the engines and all process-wide state with torchmem._C through
// libtorchmem.so. Imported lazily by the torchmem package, and only with a
// CUDA build of torch.
#include <cstddef>
#include <cstdint>

#include <c10/cuda/CUDACachingAllocator.h>

#include <torch/csrc/utils/pybind.h>

#include "torchmem/core/shared_library.h"
#include "torchmem/torch/cuda/alloc_config.h"
#include "torchmem/torch/cuda/cuda_allocator.h"
#include "torchmem/torch/cuda/cuda_engines.h"
#include "torchmem/torch/cuda/cuda_fork_locks.h"
#include "torchmem/torch/cuda/pluggable_entry_points.h"
#include "torchmem/torch/cuda/trace_tracker_recorder.h"
#include "torchmem/torch/cuda/traceback_contexts.h"
#include "torchmem/torch/torch_version.h"

namespace py = pybind11;

PYBIND11_MODULE(_C_cuda, m) {
  m.doc() =
      "torchmem's CUDA allocator for PyTorch (use torchmem.install() or "
      "torchmem.cuda_allocator())";
  if (torchmem::SharedLibraryFingerprint() != torchmem::CompiledInterfaceFingerprint()) {
    throw std::runtime_error(
        "torchmem._C_cuda was built against a different libtorchmem.so than the one in "
        "torchmem/lib: the build is stale; rebuild torchmem (python setup.py build_ext "
        "--inplace, or reinstall the package)");
  }
  torchmem::torch_glue::RegisterCudaEngineProvider();
  torchmem::torch_glue::RegisterTracebackUnwinder();
  torchmem::torch_glue::RegisterCudaForkLocks();

  m.def(
      "allocator", []() { return torchmem::torch_glue::TorchmemCudaAllocator(); },
      "torchmem's complete CUDA allocator as a torch._C._cuda_CUDAAllocator (wrap it in "
      "torch.cuda.memory._CUDAAllocator for change_current_allocator)");
  m.def("installed", &torchmem::torch_glue::TorchmemCudaAllocatorInstalled,
        "Whether PyTorch's current CUDA allocator is torchmem's complete one");
  m.def(
      "cache_info",
      [](c10::DeviceIndex device, std::size_t initial_guess) {
        std::size_t largest = initial_guess;
        {
          py::gil_scoped_release release;
          c10::cuda::CUDACachingAllocator::cacheInfo(device, &largest);
        }
        return largest;
      },
      py::arg("device"), py::arg("initial_guess") = 0,
      "c10::cuda::CUDACachingAllocator::cacheInfo through PyTorch's current CUDA allocator: "
      "what cuDNN's benchmark mode asks to size its workspace (for tests and diagnostics)");
  m.def(
      "base_allocation",
      [](std::uintptr_t ptr) {
        std::size_t size = 0;
        void* base =
            c10::cuda::CUDACachingAllocator::getBaseAllocation(reinterpret_cast<void*>(ptr), &size);
        return py::make_tuple(reinterpret_cast<std::uintptr_t>(base), size);
      },
      py::arg("ptr"),
      "c10::cuda::CUDACachingAllocator::getBaseAllocation through PyTorch's current CUDA "
      "allocator: (base address, bytes) of the device allocation holding ptr (for tests and "
      "diagnostics)");
  m.def("unimplemented_settings", &torchmem::torch_glue::UnimplementedSettings,
        "The PYTORCH_CUDA_ALLOC_CONF settings in effect that torchmem does not implement, "
        "one explanation each");

  m.def(
      "pluggable_entry_points",
      []() {
        auto address = [](auto* fn) { return reinterpret_cast<std::uintptr_t>(fn); };
        py::dict d;
        d["malloc"] = py::make_tuple("torchmem_cuda_malloc", address(&torchmem_cuda_malloc));
        d["free"] = py::make_tuple("torchmem_cuda_free", address(&torchmem_cuda_free));
        d["init"] = py::make_tuple("torchmem_cuda_init", address(&torchmem_cuda_init));
        d["reset"] = py::make_tuple("torchmem_cuda_reset", address(&torchmem_cuda_reset));
        d["memory_fraction"] = py::make_tuple("torchmem_cuda_set_memory_fraction",
                                              address(&torchmem_cuda_set_memory_fraction));
        d["record_stream"] =
            py::make_tuple("torchmem_cuda_record_stream", address(&torchmem_cuda_record_stream));
        d["base_allocation"] = py::make_tuple("torchmem_cuda_base_allocation",
                                              address(&torchmem_cuda_base_allocation));
        return d;
      },
      "name -> (exported symbol, function address) of each CUDAPluggableAllocator entry point "
      "of the reduced route (this module's file exports the symbols)");

  m.def("fork_lock_names", &torchmem::torch_glue::CudaForkLockNames,
        "The CUDA glue's locks held across fork() (for tests)");
  m.def(
      "hold_fork_lock",
      [](const std::string& name, int milliseconds) {
        absl::Status held;
        {
          py::gil_scoped_release release;
          held = torchmem::torch_glue::HoldCudaForkLock(name, milliseconds);
        }
        if (!held.ok()) throw std::invalid_argument(std::string(held.message()));
      },
      py::arg("name"), py::arg("milliseconds"),
      "Holds one of those locks on this thread for a while, without the GIL (for tests)");
  m.def("fork_lock_held", &torchmem::torch_glue::CudaForkLockHeld,
        "Whether hold_fork_lock holds its lock now (for tests)");
  m.def(
      "take_fork_lock",
      [](const std::string& name) {
        absl::Status taken;
        {
          py::gil_scoped_release release;
          taken = torchmem::torch_glue::TakeCudaForkLock(name);
        }
        if (!taken.ok()) throw std::invalid_argument(std::string(taken.message()));
      },
      py::arg("name"), "Takes and releases one of those locks (for tests)");

  m.def("attach_recording_trace_tracker", &torchmem::torch_glue::AttachRecordingTraceTracker,
        "Attaches a trace tracker through PyTorch's attachAllocatorTraceTracker that records "
        "what the current CUDA allocator tells it (once per process; for tests)");
  m.def(
      "recorded_trace_entries",
      []() {
        py::list entries;
        for (const auto& entry : torchmem::torch_glue::RecordedTraceEntries()) {
          py::dict d;
          d["action"] = entry.action;
          d["device"] = entry.device;
          d["addr"] = entry.address;
          d["size"] = entry.size;
          entries.append(d);
        }
        return entries;
      },
      "What that tracker recorded: dicts of action, device, addr, size (for tests)");
#if TORCHMEM_TORCH_VERSION_AT_LEAST(2, 10)  // getExpandableSegmentSizes arrived in torch 2.10
  m.def(
      "expandable_segment_sizes",
      [](c10::DeviceIndex device) {
        py::list sizes;
        for (const auto& size :
             c10::cuda::CUDACachingAllocator::getExpandableSegmentSizes(device)) {
          sizes.append(py::make_tuple(reinterpret_cast<std::uintptr_t>(size.stream),
                                      size.is_small_pool, size.total_size));
        }
        return sizes;
      },
      py::arg("device"),
      "c10::cuda::CUDACachingAllocator::getExpandableSegmentSizes through PyTorch's current "
      "CUDA allocator: (stream, is_small_pool, total_size) per expandable segment (for tests)");
#endif
}
