#include "torchmem/torch/cuda/cuda_fork_locks.h"

#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "torchmem/core/fork_safety.h"

namespace torchmem::torch_glue {
namespace {

struct NamedLock {
  const char* name;
  void (*lock)();
  void (*unlock)();
  void (*reset_in_child)();
};

// In the order the fork handlers take them (outer first).
constexpr NamedLock kLocks[] = {
    {"engine_table", &LockEngineTableForFork, &UnlockEngineTableAfterFork, nullptr},
    {"allocator", &LockAllocatorForFork, &UnlockAllocatorAfterFork, nullptr},
    {"ipc_handles", &LockIpcHandlesForFork, &UnlockIpcHandlesAfterFork, nullptr},
    {"history_contexts", &LockHistoryContextsForFork, &UnlockHistoryContextsAfterFork,
     &ResetHistoryContextsLockInChild},
};

std::atomic<bool> g_held_for_test{false};

const NamedLock* Find(const std::string& name) {
  for (const NamedLock& lock : kLocks) {
    if (name == lock.name) return &lock;
  }
  return nullptr;
}

absl::Status UnknownLock(const std::string& name) {
  return absl::InvalidArgumentError(absl::StrCat("no CUDA fork lock named '", name, "' (known: ",
                                                 absl::StrJoin(CudaForkLockNames(), ", "), ")"));
}

}  // namespace

void RegisterCudaForkLocks() {
  static std::once_flag once;
  std::call_once(once, [] {
    for (const NamedLock& lock : kLocks) {
      const ForkLockOrder order = lock.lock == &LockEngineTableForFork
                                      ? ForkLockOrder::kBeforeEngines
                                      : ForkLockOrder::kAfterEngines;
      RegisterForkLock(order, lock.lock, lock.unlock, lock.reset_in_child);
    }
  });
}

std::vector<std::string> CudaForkLockNames() {
  std::vector<std::string> names;
  for (const NamedLock& lock : kLocks) names.emplace_back(lock.name);
  return names;
}

absl::Status HoldCudaForkLock(const std::string& name, int milliseconds) {
  const NamedLock* lock = Find(name);
  if (lock == nullptr) return UnknownLock(name);
  lock->lock();
  g_held_for_test.store(true);
  std::this_thread::sleep_for(std::chrono::milliseconds(milliseconds));
  g_held_for_test.store(false);
  lock->unlock();
  return absl::OkStatus();
}

bool CudaForkLockHeld() { return g_held_for_test.load(); }

absl::Status TakeCudaForkLock(const std::string& name) {
  const NamedLock* lock = Find(name);
  if (lock == nullptr) return UnknownLock(name);
  lock->lock();
  lock->unlock();
  return absl::OkStatus();
}

}  // namespace torchmem::torch_glue
