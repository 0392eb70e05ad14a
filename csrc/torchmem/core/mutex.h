// Mutex: the engine's lock, a futex word with Clang thread-safety annotations.
//
// Why not std::mutex: every allocation and every free takes the engine's
// lock once, and pthread_mutex_lock/unlock are two calls through the PLT
// with their own type checks (about 110 instructions per alloc+free pair,
// callgrind). Here the uncontended case is one inline compare-and-swap to
// lock and one exchange to unlock; only a contended lock leaves the inline
// path (mutex.cc: a short spin, then the kernel's futex wait).
// Why not absl::Mutex: Debian's Abseil is built without ThreadSanitizer
// annotations, so TSan cannot see the ordering it provides and reports false
// races. The atomics here are compiled with the engine, so TSan sees their
// acquire/release ordering directly.
//
// The word is 0 (unlocked), 1 (locked, nobody waits) or 2 (locked, a thread
// may sleep on it): Drepper's "Futexes Are Tricky", mutex #2. Not recursive.
#ifndef TORCHMEM_CORE_MUTEX_H_
#define TORCHMEM_CORE_MUTEX_H_

#include <atomic>

#include "absl/base/optimization.h"
#include "absl/base/thread_annotations.h"

namespace torchmem {

class ABSL_LOCKABLE Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() {
    int unlocked = kUnlocked;
    if (ABSL_PREDICT_TRUE(word_.compare_exchange_strong(
            unlocked, kLocked, std::memory_order_acquire, std::memory_order_relaxed))) {
      return;
    }
    LockContended();
  }
  void Unlock() ABSL_UNLOCK_FUNCTION() {
    if (ABSL_PREDICT_FALSE(word_.exchange(kUnlocked, std::memory_order_release) ==
                           kLockedWithWaiters)) {
      WakeOne();
    }
  }

 private:
  static constexpr int kUnlocked = 0;
  static constexpr int kLocked = 1;
  static constexpr int kLockedWithWaiters = 2;

  void LockContended();
  void WakeOne();

  std::atomic<int> word_{kUnlocked};
};

class ABSL_SCOPED_LOCKABLE MutexLock {
 public:
  explicit MutexLock(Mutex* mutex) ABSL_EXCLUSIVE_LOCK_FUNCTION(mutex) : mutex_(mutex) {
    mutex_->Lock();
  }
  ~MutexLock() ABSL_UNLOCK_FUNCTION() { mutex_->Unlock(); }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  Mutex* const mutex_;
};

}  // namespace torchmem

#endif  // TORCHMEM_CORE_MUTEX_H_
