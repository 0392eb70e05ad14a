// The engine's lock (mutex.h): mutual exclusion under contention, and a
// waiter that went to sleep in the kernel is woken by the unlock.
#include "torchmem/core/mutex.h"

#include <atomic>
#include <chrono>
#include <cstdint>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace torchmem {
namespace {

TEST(MutexTest, NoIncrementIsLostUnderContention) {
  Mutex mutex;
  std::int64_t counter = 0;  // plain: only the lock orders the threads
  constexpr int kThreads = 4;
  constexpr int kIncrements = 200000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < kIncrements; ++i) {
        MutexLock lock(&mutex);
        ++counter;
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(counter, std::int64_t{kThreads} * kIncrements);
}

TEST(MutexTest, ASleepingWaiterIsWokenByTheUnlock) {
  Mutex mutex;
  std::atomic<bool> waiter_started{false};
  std::atomic<bool> released{false};
  bool saw_release = false;
  mutex.Lock();
  std::thread waiter([&] {
    waiter_started = true;
    MutexLock lock(&mutex);
    saw_release = released.load();
  });
  while (!waiter_started) std::this_thread::yield();
  // Held far longer than the spin: the waiter sleeps on the futex, and only
  // the unlock's wake-up lets it through.
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  released = true;
  mutex.Unlock();
  waiter.join();
  EXPECT_TRUE(saw_release);
  // The lock is free again, whichever way the waiter took it.
  mutex.Lock();
  mutex.Unlock();
}

}  // namespace
}  // namespace torchmem
