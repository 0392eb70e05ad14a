// Leak scopes: at close, the blocks allocated inside (by any thread
// attributed to the scope) that are still allocated are reported; blocks
// waiting on other streams are "pending", not leaked.
#include <thread>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "tests/cpp/support/engine_fixture.h"

namespace torchmem {
namespace {

using testing::EngineTest;

// Survivors of `scope` in the fixture's engine.
ScopeSurvivors Close(ScopeId scope, const std::string& device = "test:0") {
  absl::StatusOr<std::vector<ScopeSurvivors>> closed = CloseLeakScope(scope);
  EXPECT_TRUE(closed.ok()) << closed.status();
  if (closed.ok()) {
    for (ScopeSurvivors& survivors : *closed) {
      if (survivors.device == device) return survivors;
    }
  }
  return {};
}

TEST_F(EngineTest, ScopeReportsBlocksStillAllocatedAtClose) {
  void* before = Allocate(4096);
  const ScopeId scope = OpenScope();
  void* freed = Allocate(1000);
  void* leaked = Allocate(3000);
  Free(freed);
  const ScopeSurvivors survivors = Close(scope);
  ASSERT_EQ(survivors.allocated.size(), 1u);
  EXPECT_EQ(survivors.allocated[0].address, Address(leaked));
  EXPECT_EQ(survivors.allocated[0].requested_size, 3000u);
  EXPECT_EQ(survivors.allocated[0].scope, scope);
  EXPECT_TRUE(survivors.pending.empty());
  Free(before);
  Free(leaked);
}

TEST_F(EngineTest, CachedMemoryIsNeverALeak) {
  const ScopeId scope = OpenScope();
  void* ptr = Allocate(5 * kMiB);
  Free(ptr);  // the 20 MiB segment stays reserved (cached)
  const ScopeSurvivors survivors = Close(scope);
  EXPECT_TRUE(survivors.allocated.empty());
  EXPECT_EQ(Stats().reserved_bytes.all().current, static_cast<std::int64_t>(20 * kMiB));
}

TEST_F(EngineTest, BlocksWaitingOnOtherStreamsArePendingNotLeaked) {
  const ScopeId scope = OpenScope();
  void* ptr = Allocate(4096);
  ASSERT_TRUE(engine_->RecordStream(ptr, 5).ok());
  Free(ptr);
  const ScopeSurvivors survivors = Close(scope);
  EXPECT_TRUE(survivors.allocated.empty());
  ASSERT_EQ(survivors.pending.size(), 1u);
  EXPECT_EQ(survivors.pending[0].state, BlockState::kPendingFree);
  backend_->CompleteAll();
  engine_->ProcessEvents();
}

TEST_F(EngineTest, NestedScopeLeftoversAreSeenByTheOuterScope) {
  const ScopeId outer = OpenScope();
  const ScopeId inner = OpenScope();
  void* leaked = Allocate(4096);
  const ScopeSurvivors inner_survivors = Close(inner);
  ASSERT_EQ(inner_survivors.allocated.size(), 1u);
  EXPECT_POOL_INTACT(*engine_);
  void* outer_only = Allocate(512);
  const ScopeSurvivors outer_survivors = Close(outer);
  ASSERT_EQ(outer_survivors.allocated.size(), 2u);
  EXPECT_EQ(outer_survivors.allocated[0].address, Address(leaked));
  EXPECT_EQ(outer_survivors.allocated[0].scope, inner);  // stamped scope is kept
  EXPECT_EQ(outer_survivors.allocated[1].address, Address(outer_only));
  Free(leaked);
  Free(outer_only);
}

TEST_F(EngineTest, BlockFreedAfterInnerCloseLeavesTheOuterScopeClean) {
  const ScopeId outer = OpenScope();
  const ScopeId inner = OpenScope();
  void* ptr = Allocate(4096);
  Close(inner);
  Free(ptr);
  EXPECT_TRUE(Close(outer).allocated.empty());
}

TEST_F(EngineTest, AllocationsOutsideTheScopeAreNotReported) {
  const ScopeId scope = OpenScope();
  void* from_other_thread = nullptr;
  std::thread other([&] { from_other_thread = Allocate(4096); });
  other.join();
  EXPECT_TRUE(Close(scope).allocated.empty());
  Free(from_other_thread);
}

ScopeId g_propagated_scope = kNoScope;
bool PropagatedScope(Attribution* out) {
  out->scope = g_propagated_scope;
  return g_propagated_scope != kNoScope;
}

TEST_F(EngineTest, ThreadsAttributedToTheScopeAreReported) {
  const ScopeId scope = OpenScope();
  g_propagated_scope = scope;
  SetAttributionProvider(&PropagatedScope);
  void* from_worker = nullptr;
  std::thread worker([&] { from_worker = Allocate(4096); });
  worker.join();
  SetAttributionProvider(nullptr);
  g_propagated_scope = kNoScope;
  const ScopeSurvivors survivors = Close(scope);
  ASSERT_EQ(survivors.allocated.size(), 1u);
  EXPECT_EQ(survivors.allocated[0].address, Address(from_worker));
  Free(from_worker);
}

TEST_F(EngineTest, StaleScopeFromAFinishedRegionIsNotTracked) {
  const ScopeId scope = OpenScope();
  Close(scope);
  g_propagated_scope = scope;  // a worker still carrying the closed scope
  SetAttributionProvider(&PropagatedScope);
  const TagId tag = *TagRegistry::Intern("keep-lookups-on");
  ASSERT_TRUE(PushTag(tag).ok());
  void* ptr = nullptr;
  std::thread worker([&] { ptr = Allocate(4096); });
  worker.join();
  ASSERT_TRUE(PopTag(tag).ok());
  SetAttributionProvider(nullptr);
  g_propagated_scope = kNoScope;
  EXPECT_POOL_INTACT(*engine_);
  Free(ptr);
}

TEST(ScopeErrorsTest, ClosingAScopeThatIsNotOpenFails) {
  const ScopeId scope = OpenScope();
  ASSERT_TRUE(CloseLeakScope(scope).ok());
  const absl::Status again = CloseLeakScope(scope).status();
  EXPECT_TRUE(absl::IsFailedPrecondition(again));
  EXPECT_TRUE(absl::StrContains(again.message(), "not open")) << again;
  EXPECT_TRUE(absl::IsFailedPrecondition(CloseLeakScope(987654321).status()));
}

TEST(ScopeErrorsTest, ClosingOutOfOrderFailsAndChangesNothing) {
  const ScopeId outer = OpenScope();
  const ScopeId inner = OpenScope();
  const absl::Status status = CloseLeakScope(outer).status();
  EXPECT_TRUE(absl::IsFailedPrecondition(status));
  EXPECT_TRUE(absl::StrContains(status.message(), "close the innermost scope first")) << status;
  EXPECT_TRUE(IsScopeOpen(outer));
  EXPECT_TRUE(CloseLeakScope(inner).ok());
  EXPECT_TRUE(CloseLeakScope(outer).ok());
}

TEST(ScopeErrorsTest, ClosingFromAnotherThreadFails) {
  const ScopeId scope = OpenScope();
  absl::Status status;
  std::thread other([&] { status = CloseLeakScope(scope).status(); });
  other.join();
  EXPECT_TRUE(absl::IsFailedPrecondition(status));
  EXPECT_TRUE(absl::StrContains(status.message(), "another thread")) << status;
  EXPECT_TRUE(CloseLeakScope(scope).ok());
}

}  // namespace
}  // namespace torchmem
