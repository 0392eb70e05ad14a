// fork() while other threads hammer the engine: the child must never
// inherit a held lock, and must be able to allocate, free and report.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "torchmem/backends/host_backend.h"
#include "torchmem/core/engine.h"

namespace torchmem {
namespace {

// Waits for the child; a child still running after a minute is deadlocked
// (it does 100 allocations), so it is killed and reported rather than
// hanging the whole test run.
::testing::AssertionResult ChildExitedCleanly(pid_t child) {
  int status = 0;
  for (int waited_ms = 0; waited_ms < 60000; waited_ms += 10) {
    const pid_t done = waitpid(child, &status, WNOHANG);
    if (done == child) {
      if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return ::testing::AssertionSuccess();
      return ::testing::AssertionFailure() << "child failed, status " << status;
    }
    usleep(10000);
  }
  kill(child, SIGKILL);
  waitpid(child, &status, 0);
  return ::testing::AssertionFailure() << "child deadlocked (a lock was inherited held)";
}

// Runs in the child: allocate, free, tag, scope, check, exit with a code.
int ChildWork(Engine& engine) {
  absl::StatusOr<TagId> tag = TagRegistry::Intern("child");
  if (!tag.ok() || !PushTag(*tag).ok()) return 2;
  const ScopeId scope = OpenScope();
  for (int i = 0; i < 100; ++i) {
    absl::StatusOr<void*> ptr = engine.Allocate(4096 + i);
    if (!ptr.ok() || !engine.Free(*ptr).ok()) return 3;
  }
  if (!CloseLeakScope(scope).ok() || !PopTag(*tag).ok()) return 4;
  if (!engine.CheckInvariants().ok()) return 5;
  return 0;
}

TEST(EngineForkTest, ForkWhileOtherThreadsAllocateNeverDeadlocksTheChild) {
  Engine engine(std::make_unique<HostBackend>());
  std::atomic<bool> stop{false};
  std::vector<std::thread> hammers;
  for (int t = 0; t < 2; ++t) {
    hammers.emplace_back([&engine, &stop, t] {
      const TagId tag = *TagRegistry::Intern(t == 0 ? "hammer-a" : "hammer-b");
      std::vector<void*> live;
      while (!stop.load(std::memory_order_relaxed)) {
        (void)PushTag(tag);
        absl::StatusOr<void*> ptr = engine.Allocate(1000 + live.size() * 512);
        if (ptr.ok()) live.push_back(*ptr);
        if (live.size() > 32) {
          for (void* p : live) (void)engine.Free(p);
          live.clear();
        }
        const ScopeId scope = OpenScope();
        (void)CloseLeakScope(scope);
        (void)PopTag(tag);
      }
      for (void* p : live) (void)engine.Free(p);
    });
  }
  constexpr int kForks = 50;
  for (int i = 0; i < kForks; ++i) {
    const pid_t child = fork();
    ASSERT_GE(child, 0);
    if (child == 0) _exit(ChildWork(engine));
    ASSERT_TRUE(ChildExitedCleanly(child)) << "fork " << i;
  }
  stop = true;
  for (std::thread& thread : hammers) thread.join();
  EXPECT_TRUE(engine.CheckInvariants().ok());
}

}  // namespace
}  // namespace torchmem
