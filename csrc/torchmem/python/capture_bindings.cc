// Python stack capture: the request switch, symbolization, statistics and
// pruning of interned stacks (see stack_capture.h). Thin conversions only.
//
// These calls keep the GIL: symbolization and pruning need it (they read and
// release Python code objects), and the rest are a few atomic operations.
#include <optional>
#include <vector>

#include <pybind11/stl.h>

#include "torchmem/core/context_capture.h"
#include "torchmem/python/bindings.h"
#include "torchmem/python/stack_capture.h"

namespace torchmem::python {

void RegisterCapture(py::module_& m) {
  InstallStackCapture();

  m.def("request_stack_capture", &RequestStackCapture,
        "Starts capturing the Python stack of every allocation (reference counted).");
  m.def(
      "release_stack_capture", []() { ThrowIfError(ReleaseStackCapture()); },
      "Balances one request_stack_capture().");
  m.def("stack_capture_requested", &ContextCaptureRequested);
  m.def(
      "symbolize",
      [](ContextId id) {
        py::list out;
        for (const Frame& frame : Symbolize(id)) {
          out.append(py::make_tuple(frame.filename, frame.line, frame.name));
        }
        return out;
      },
      py::arg("context_id"),
      "The stack of a block's context id as (filename, line, name) tuples, innermost first; "
      "[] for 0 and for pruned ids.");
  m.def("capture_stats", []() {
    const StackCaptureStats stats = GetStackCaptureStats();
    py::dict d;
    d["interned_stacks"] = stats.interned_stacks;
    d["distinct_frames"] = stats.distinct_frames;
    d["code_objects_held"] = stats.code_objects_held;
    d["bytes_used"] = stats.bytes_used;
    d["stacks_interned_total"] = stats.stacks_interned_total;
    d["stacks_pruned_total"] = stats.stacks_pruned_total;
    d["gil_acquisitions"] = stats.gil_acquisitions;
    d["interned_without_gil"] = stats.interned_without_gil;
    d["gil_free_walk"] = stats.gil_free_walk;
    return d;
  });
  m.def("begin_stack_prune", &BeginPruneEpoch,
        "Starts a prune epoch: call it, then list the context ids of live blocks, then "
        "prune_stacks(ids, epoch=<the returned epoch>).");
  m.def(
      "prune_stacks",
      [](const py::iterable& live_context_ids, std::optional<std::uint64_t> epoch) {
        std::vector<ContextId> live;
        for (const py::handle id : live_context_ids) live.push_back(id.cast<ContextId>());
        return Prune(live, epoch);
      },
      py::arg("live_context_ids"), py::arg("epoch") = std::nullopt,
      "Drops interned stacks no live block references (and the code objects only they used); "
      "returns how many were dropped.");
}

}  // namespace torchmem::python
