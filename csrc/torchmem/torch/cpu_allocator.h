// torchmem as PyTorch's CPU allocator.
//
// c10 keeps one CPU allocator pointer (c10::SetCPUAllocator); installing
// points it at an allocator backed by the process-wide CPU engine over host
// memory, uninstalling restores the allocator that was current before.
// Tensors keep the deleter they were created with, so tensors made before,
// during and after an install are all freed correctly in any order. The
// allocator and its engine are never destroyed: tensors may outlive any
// install, and even static destruction.
//
// c10::SetCPUAllocator is a plain store: install before other threads
// allocate.
#ifndef TORCHMEM_TORCH_CPU_ALLOCATOR_H_
#define TORCHMEM_TORCH_CPU_ALLOCATOR_H_

#include "absl/status/status.h"
#include "torchmem/core/engine.h"

namespace torchmem::torch_glue {

// The engine behind CPU tensors (created on first use, never destroyed).
Engine& CpuEngine();

// Idempotent. Fails if c10 refuses the allocator (another allocator was
// registered with a higher priority).
absl::Status InstallCpuAllocator();
// Idempotent; a no-op when not installed.
absl::Status UninstallCpuAllocator();
bool IsCpuAllocatorInstalled();

}  // namespace torchmem::torch_glue

#endif  // TORCHMEM_TORCH_CPU_ALLOCATOR_H_
