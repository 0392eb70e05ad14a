// fork() safety of the CUDA glue's own locks (core/fork_safety.h holds the
// engines'): the engine table, the allocator's settings and history state,
// the table of opened IPC handles and the table of history contexts.
//
// A process that forks while another thread holds one of them would give the
// child a lock no thread of the child ever releases: the child's first use
// (an engine created, a setting read, a history context interned, an IPC
// handle opened) would hang. Each is held across fork() in the lock order of
// the code: the engine table before the engines (an engine is created and
// configured under it), the others after them (nothing is locked under them).
#ifndef TORCHMEM_TORCH_CUDA_CUDA_FORK_LOCKS_H_
#define TORCHMEM_TORCH_CUDA_CUDA_FORK_LOCKS_H_

#include <string>
#include <vector>

#include "absl/status/status.h"

namespace torchmem::torch_glue {

// Registers the handlers of the locks below once per process.
void RegisterCudaForkLocks();

// Each lock, for the fork handlers (defined next to the lock).
void LockEngineTableForFork();
void UnlockEngineTableAfterFork();
void LockIpcHandlesForFork();
void UnlockIpcHandlesAfterFork();
void LockHistoryContextsForFork();
void UnlockHistoryContextsAfterFork();
void ResetHistoryContextsLockInChild();  // a reader-writer lock: see fork_safety.h
void LockAllocatorForFork();
void UnlockAllocatorAfterFork();

// For tests: the names of the locks above ("engine_table", "allocator",
// "ipc_handles", "history_contexts"); holding one for `milliseconds` on the
// calling thread (`held` is set while it is held); taking and releasing one.
std::vector<std::string> CudaForkLockNames();
absl::Status HoldCudaForkLock(const std::string& name, int milliseconds);
bool CudaForkLockHeld();
absl::Status TakeCudaForkLock(const std::string& name);

}  // namespace torchmem::torch_glue

#endif  // TORCHMEM_TORCH_CUDA_CUDA_FORK_LOCKS_H_
