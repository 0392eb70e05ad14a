#include "torchmem/core/fork_safety.h"

#include <pthread.h>

#include <mutex>

#include "torchmem/core/attribution.h"

namespace torchmem {
namespace {

void BeforeFork() {
  internal::LockEnginesForFork();
  internal::LockAttributionForFork();
}

void AfterFork() {
  internal::UnlockAttributionAfterFork();
  internal::UnlockEnginesAfterFork();
}

}  // namespace

void InstallForkHandlers() {
  static std::once_flag once;
  std::call_once(once, [] { pthread_atfork(&BeforeFork, &AfterFork, &AfterFork); });
}

}  // namespace torchmem
