// fork() safety: the engine's locks are held across fork().
//
// A process that forks while another thread holds an engine's lock would
// give the child a lock that no thread of the child will ever release: the
// child's first allocation (a DataLoader worker's first batch) would hang.
// pthread_atfork handlers take every engine-wide lock before fork(), in the
// global lock order (engine registry, engines, scope and tag registries), so
// the child starts with consistent, unlocked structures and a copy of every
// engine's state; both sides release them after.
//
// What the child inherits: its own copy of each engine (blocks allocated in
// the parent stay allocated in the child's copy; memory is shared
// copy-on-write by the OS), the forking thread's open tags and scopes. CUDA
// cannot be used in a forked child (PyTorch refuses), so only the CPU engine
// matters there.
#ifndef TORCHMEM_CORE_FORK_SAFETY_H_
#define TORCHMEM_CORE_FORK_SAFETY_H_

namespace torchmem {

// Registers the handlers once per process; later calls do nothing.
void InstallForkHandlers();

namespace internal {
void LockEnginesForFork();
void UnlockEnginesAfterFork();
}  // namespace internal

}  // namespace torchmem

#endif  // TORCHMEM_CORE_FORK_SAFETY_H_
