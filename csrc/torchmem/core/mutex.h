// Mutex: std::mutex with Clang thread-safety annotations.
//
// Why not Mutex: Debian's Abseil is built without ThreadSanitizer
// annotations, so TSan cannot see the ordering Mutex provides and
// reports false races; std::mutex goes through pthread, which TSan
// intercepts. The annotations keep GUARDED_BY checkable under clang.
#ifndef TORCHMEM_CORE_MUTEX_H_
#define TORCHMEM_CORE_MUTEX_H_

#include <mutex>

#include "absl/base/thread_annotations.h"

namespace torchmem {

class ABSL_LOCKABLE Mutex {
 public:
  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() { mutex_.lock(); }
  void Unlock() ABSL_UNLOCK_FUNCTION() { mutex_.unlock(); }

 private:
  std::mutex mutex_;
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
