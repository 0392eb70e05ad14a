// fork() safety: the engine's locks are held across fork().
//
// A process that forks while another thread holds an engine's lock would
// give the child a lock that no thread of the child will ever release: the
// child's first allocation (a DataLoader worker's first batch) would hang.
// pthread_atfork handlers take every engine-wide lock before fork(), in the
// global lock order (the registered outer locks, engine registry, engines,
// scope and tag registries, the registered leaf locks), so
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

// Where a lock of a layer above the engines (the CUDA glue's engine table,
// settings, IPC and history tables) is taken before fork(), relative to the
// engines' locks: kBeforeEngines for a lock held while an engine's lock is
// taken (it is an outer lock), kAfterEngines for a lock under which no other
// torchmem lock is taken (a leaf). Locks of one order are taken in the order
// they were registered, and released in reverse, in both processes; with
// `reset_in_child`, the child calls it instead of `unlock`: a reader-writer
// lock (std::shared_mutex) remembers its writer's thread id, which the child's
// thread does not have, so the child makes a fresh lock rather than unlock.
enum class ForkLockOrder { kBeforeEngines, kAfterEngines };
void RegisterForkLock(ForkLockOrder order, void (*lock)(), void (*unlock)(),
                      void (*reset_in_child)() = nullptr);

namespace internal {
void LockEnginesForFork();
void UnlockEnginesAfterFork();
}  // namespace internal

}  // namespace torchmem

#endif  // TORCHMEM_CORE_FORK_SAFETY_H_
