// The contended half of Mutex (mutex.h): spin briefly, then sleep on the
// word in the kernel until an unlocker wakes one waiter.
#include "torchmem/core/mutex.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace torchmem {
namespace {

// An engine's critical sections are short (tens of nanoseconds): a holder
// on another core usually releases the lock within a few hundred cycles,
// cheaper to wait for than a sleep and a wake-up in the kernel.
constexpr int kSpins = 100;

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

long Futex(std::atomic<int>* word, int op, int value) {
  return syscall(SYS_futex, reinterpret_cast<int*>(word), op | FUTEX_PRIVATE_FLAG, value, nullptr,
                 nullptr, 0);
}

}  // namespace

void Mutex::LockContended() {
  for (int i = 0; i < kSpins; ++i) {
    int unlocked = kUnlocked;
    if (word_.load(std::memory_order_relaxed) == kUnlocked &&
        word_.compare_exchange_weak(unlocked, kLocked, std::memory_order_acquire,
                                    std::memory_order_relaxed)) {
      return;
    }
    CpuRelax();
  }
  // Mark the word "waiters may sleep" while taking it: whoever holds it then
  // wakes one on unlock. Taking it this way leaves the mark on, which costs
  // at most one futile wake-up.
  while (word_.exchange(kLockedWithWaiters, std::memory_order_acquire) != kUnlocked) {
    Futex(&word_, FUTEX_WAIT, kLockedWithWaiters);
  }
}

void Mutex::WakeOne() { Futex(&word_, FUTEX_WAKE, 1); }

}  // namespace torchmem
