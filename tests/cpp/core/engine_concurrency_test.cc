// Many threads allocate, free, tag, scope and read reports at once. Run
// under ThreadSanitizer by .ci/run; the pool must be intact afterwards and
// every per-thread count exact.
#include <atomic>
#include <random>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/cpp/support/engine_fixture.h"

namespace torchmem {
namespace {

constexpr int kThreads = 4;
constexpr int kOperationsPerThread = 3000;

TEST(EngineConcurrencyTest, ConcurrentAllocFreeKeepsThePoolIntact) {
  auto backend_owner =
      std::make_unique<ControlledBackend>(ControlledBackendOptions{.auto_complete_events = true});
  Engine engine(std::move(backend_owner));
  std::atomic<bool> done{false};
  std::vector<TagId> tags;
  for (int t = 0; t < kThreads; ++t) {
    tags.push_back(*TagRegistry::Intern(absl::StrCat("concurrency-", t)));
  }
  std::vector<std::int64_t> leaked_by_thread(kThreads, 0);

  std::vector<std::thread> workers;
  for (int t = 0; t < kThreads; ++t) {
    workers.emplace_back([&, t] {
      std::mt19937_64 rng(t);
      ASSERT_TRUE(PushTag(tags[t]).ok());
      std::vector<void*> live;
      const ScopeId scope = OpenScope();
      for (int op = 0; op < kOperationsPerThread; ++op) {
        if (live.empty() || std::uniform_int_distribution<int>(0, 2)(rng) != 0) {
          const std::size_t size = std::uniform_int_distribution<std::size_t>(1, 3 << 20)(rng);
          absl::StatusOr<void*> ptr = engine.Allocate(size, /*stream=*/t % 2);
          ASSERT_TRUE(ptr.ok()) << ptr.status();
          live.push_back(*ptr);
          if (op % 7 == 0) {
            ASSERT_TRUE(engine.RecordStream(*ptr, 5).ok());
          }
        } else {
          const std::size_t i = std::uniform_int_distribution<std::size_t>(0, live.size() - 1)(rng);
          ASSERT_TRUE(engine.Free(live[i]).ok());
          live[i] = live.back();
          live.pop_back();
        }
        if (live.size() > 64) {
          ASSERT_TRUE(engine.Free(live.front()).ok());
          live.erase(live.begin());
        }
      }
      // Leave some blocks behind, close the scope, and check they are ours.
      absl::StatusOr<std::vector<ScopeSurvivors>> closed = CloseLeakScope(scope);
      ASSERT_TRUE(closed.ok());
      for (const ScopeSurvivors& survivors : *closed) {
        if (survivors.device != engine.DeviceName()) continue;
        EXPECT_EQ(survivors.allocated.size(), live.size());
        for (const BlockInfo& block : survivors.allocated) EXPECT_EQ(block.tag, tags[t]);
        leaked_by_thread[t] = static_cast<std::int64_t>(survivors.allocated.size());
      }
      ASSERT_TRUE(PopTag(tags[t]).ok());
      for (void* ptr : live) ASSERT_TRUE(engine.Free(ptr).ok());
    });
  }
  // Readers race with the workers.
  std::thread reader([&] {
    while (!done.load()) {
      (void)engine.GetStats();
      (void)engine.GetTagUsage();
      (void)engine.GetFragmentation();
      engine.ProcessEvents();
    }
  });
  std::thread trimmer([&] {
    for (int i = 0; i < 50 && !done.load(); ++i) {
      ASSERT_TRUE(engine.EmptyCache().ok());
      std::this_thread::yield();
    }
  });
  for (std::thread& worker : workers) worker.join();
  done = true;
  reader.join();
  trimmer.join();

  engine.ProcessEvents();
  const MemoryStats stats = engine.GetStats();
  EXPECT_EQ(stats.allocation.all().current, 0);
  EXPECT_EQ(stats.active.all().current, 0);
  for (const TagUsage& usage : engine.GetTagUsage()) EXPECT_EQ(usage.current_bytes, 0);
  EXPECT_EQ(stats.allocation.all().allocated - stats.allocation.all().freed, 0);
  absl::Status invariants = engine.CheckInvariants();
  EXPECT_TRUE(invariants.ok()) << invariants.message();
}

TEST(EngineConcurrencyTest, TagsAndScopesOpenAndCloseOnManyThreads) {
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([t] {
      const TagId tag = *TagRegistry::Intern(absl::StrCat("churn-", t % 2));
      for (int i = 0; i < 2000; ++i) {
        ASSERT_TRUE(PushTag(tag).ok());
        const ScopeId scope = OpenScope();
        ASSERT_TRUE(CloseLeakScope(scope).ok());
        ASSERT_TRUE(PopTag(tag).ok());
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(internal::g_open_frames.load(), 0);
}

}  // namespace
}  // namespace torchmem
