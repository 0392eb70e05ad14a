// Contexts with PyTorch's C++ and TorchScript frames, for the allocation
// history PyTorch asks for (_record_memory_history).
//
// torchmem stamps each allocation with its own Python stack (cheap, interned;
// traceback_contexts.h turns it into PyTorch's context when a snapshot asks).
// PyTorch's recorders gather more: TorchScript frames always, and C++ frames
// with stacks="all" (torch/csrc/cuda/memory_snapshot.cpp: gather is
// CapturedTraceback::gather(python, script, cpp=false), gather_with_cpp the
// same with cpp=true). While PyTorch's history wants stacks, the CUDA engines
// capture through CaptureWithTorchFrames() instead (Engine::
// SetContextCaptureOverride), which adds those frames:
//   - C++ frames asked: unwinds the C++ stack (PyTorch's cost per
//     allocation) and interns (Python stack, C++ return addresses);
//   - otherwise: asks TorchScript for its call stack (empty, and cheap,
//     outside TorchScript, where the plain Python stack is returned as is)
//     and interns (Python stack, TorchScript frames).
// A new combination gathers PyTorch's CapturedTraceback once, with torchmem's
// Python frames handed over, and gets a derived id (kDerivedContextBit) whose
// base is the Python stack: torchmem's own reports and stack pruning see that
// stack (BaseContext), PyTorch's snapshots see every frame (ContextFor).
//
// Derived contexts are kept for the life of the process: one per distinct
// (Python stack, C++ or TorchScript path), like the Python stacks before
// pruning.
#ifndef TORCHMEM_TORCH_CUDA_HISTORY_CONTEXTS_H_
#define TORCHMEM_TORCH_CUDA_HISTORY_CONTEXTS_H_

#include <memory>

#include <c10/core/Allocator.h>
#include <c10/cuda/CUDACachingAllocator.h>

#include "torchmem/core/types.h"

namespace torchmem::torch_glue {

// Whether `recorder` (what PyTorch's recordHistory passes) gathers C++
// frames: calls it once. Requires nothing (PyTorch's recorder takes the GIL
// itself).
bool RecorderGathersCpp(c10::cuda::CUDACachingAllocator::CreateContextFn recorder);

// Whether CaptureWithTorchFrames adds C++ frames (else TorchScript frames only).
void SetHistoryCppFrames(bool cpp);

// The capture hook of CUDA engines while PyTorch's history wants stacks.
// Installs the base resolver (BaseContext) on first use.
ContextId CaptureWithTorchFrames();

// The context gathered for a derived id; nullptr if unknown.
std::shared_ptr<c10::GatheredContext> DerivedContext(ContextId id);

}  // namespace torchmem::torch_glue

#endif  // TORCHMEM_TORCH_CUDA_HISTORY_CONTEXTS_H_
