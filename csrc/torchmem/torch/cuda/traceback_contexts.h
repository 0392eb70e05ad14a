// torchmem's Python stacks as PyTorch's stack contexts.
//
// PyTorch's snapshot emitters (torch.cuda.memory._snapshot, _dump_snapshot)
// symbolize the context of every block and trace entry, and accept only
// torch::CapturedTraceback (anything else raises). A CapturedTraceback's
// frames can only be filled by a registered Python unwinder, so torchmem
// registers one whose canGather() is true only while torchmem itself is
// building a context: then gather() hands over the frames torchmem captured
// at allocation time (code object + instruction offset, the same format
// PyTorch captures), and appendSymbolized() turns them into
// (filename, line, name). For every other caller (the profiler, PyTorch's
// own recorder) it declines, and PyTorch's unwinder answers as before.
//
// Contexts are built lazily, when a snapshot asks, from the ContextId
// stamped on each block; a ContextCache shares one context per id within a
// snapshot.
//
// Requires the GIL for everything below except RegisterTracebackUnwinder.
#ifndef TORCHMEM_TORCH_CUDA_TRACEBACK_CONTEXTS_H_
#define TORCHMEM_TORCH_CUDA_TRACEBACK_CONTEXTS_H_

#include <memory>

#include <c10/core/Allocator.h>

#include "absl/container/flat_hash_map.h"
#include "torchmem/core/types.h"

namespace torchmem::torch_glue {

// Adds torchmem's unwinder to PyTorch's chain (once per process).
void RegisterTracebackUnwinder();

// The PyTorch context of a captured stack; nullptr for kNoContext or an id
// whose stack is gone. A derived id (history_contexts.h) gives the context
// gathered at its allocation, with its C++ and TorchScript frames.
std::shared_ptr<c10::GatheredContext> ContextFor(ContextId id);

// Gathers PyTorch's context now, as PyTorch's recorders do (TorchScript
// frames, and C++ frames if `cpp`), with the Python frames of the captured
// stack `python_stack` (this thread's, captured just before) instead of
// PyTorch's own Python walk. Never null.
std::shared_ptr<c10::GatheredContext> GatherWithPythonStack(ContextId python_stack, bool cpp);

// One context per id, for the duration of one snapshot.
class ContextCache {
 public:
  std::shared_ptr<c10::GatheredContext> Get(ContextId id);

 private:
  absl::flat_hash_map<ContextId, std::shared_ptr<c10::GatheredContext>> contexts_;
};

}  // namespace torchmem::torch_glue

#endif  // TORCHMEM_TORCH_CUDA_TRACEBACK_CONTEXTS_H_
