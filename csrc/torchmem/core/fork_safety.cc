#include "torchmem/core/fork_safety.h"

#include <pthread.h>

#include <mutex>
#include <vector>

#include "torchmem/core/attribution.h"

namespace torchmem {
namespace {

struct ForkLock {
  void (*lock)();
  void (*unlock)();
  void (*reset_in_child)();  // or nullptr: the child unlocks too
};

struct ForkLocks {
  // Held from before fork() to after it: no lock is registered meanwhile.
  std::mutex registration;
  std::vector<ForkLock> before_engines;
  std::vector<ForkLock> after_engines;
};

// Leaked: a fork may happen during static destruction.
ForkLocks& Locks() {
  static ForkLocks* locks = new ForkLocks;
  return *locks;
}

void BeforeFork() {
  ForkLocks& locks = Locks();
  locks.registration.lock();
  for (const ForkLock& lock : locks.before_engines) lock.lock();
  internal::LockEnginesForFork();
  internal::LockAttributionForFork();
  for (const ForkLock& lock : locks.after_engines) lock.lock();
}

void ReleaseAfterFork(bool child) {
  ForkLocks& locks = Locks();
  auto release = [child](const ForkLock& lock) {
    (child && lock.reset_in_child != nullptr) ? lock.reset_in_child() : lock.unlock();
  };
  for (auto it = locks.after_engines.rbegin(); it != locks.after_engines.rend(); ++it) {
    release(*it);
  }
  internal::UnlockAttributionAfterFork();
  internal::UnlockEnginesAfterFork();
  for (auto it = locks.before_engines.rbegin(); it != locks.before_engines.rend(); ++it) {
    release(*it);
  }
  locks.registration.unlock();
}

void AfterForkInParent() { ReleaseAfterFork(/*child=*/false); }

void AfterForkInChild() { ReleaseAfterFork(/*child=*/true); }

}  // namespace

void InstallForkHandlers() {
  static std::once_flag once;
  std::call_once(once, [] { pthread_atfork(&BeforeFork, &AfterForkInParent, &AfterForkInChild); });
}

void RegisterForkLock(ForkLockOrder order, void (*lock)(), void (*unlock)(),
                      void (*reset_in_child)()) {
  InstallForkHandlers();
  ForkLocks& locks = Locks();
  std::lock_guard<std::mutex> guard(locks.registration);
  (order == ForkLockOrder::kBeforeEngines ? locks.before_engines : locks.after_engines)
      .push_back(ForkLock{lock, unlock, reset_in_child});
}

}  // namespace torchmem
