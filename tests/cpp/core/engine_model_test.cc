// Long random operation sequences (seeded) checked against a simple
// reference model: what callers hold, what is pending, what each tag and
// scope owns. The engine's statistics must equal the model's after every
// operation, the backend's view of reserved memory must equal the engine's,
// live blocks must never overlap, and the pool invariants must hold.
#include <map>
#include <random>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/cpp/support/engine_fixture.h"

namespace torchmem {
namespace {

struct ModelBlock {
  std::size_t requested;
  std::size_t rounded;
  PoolKind pool;
  StreamId stream;
  TagId tag;
  ScopeId scope;
  bool used_elsewhere;
};

class Model {
 public:
  explicit Model(const SizePolicy& policy) : policy_(policy) {}

  // `block_size` is the size the engine handed out: the rounded size, or
  // up to one small-pool limit more when the remainder was not worth
  // splitting off (checked here, as the model cannot know the placement).
  void Allocated(std::uintptr_t address, std::size_t requested, std::size_t block_size,
                 StreamId stream, TagId tag, ScopeId scope) {
    const std::size_t rounded = policy_.RoundSize(requested);
    const PoolKind pool = policy_.PoolFor(rounded);
    EXPECT_GE(block_size, rounded);
    EXPECT_LE(block_size, pool == PoolKind::kSmall ? rounded : rounded + policy_.small_size);
    live_[address] = ModelBlock{requested, block_size, pool, stream, tag, scope, false};
  }
  // Returns true if the block becomes pending.
  bool Freed(std::uintptr_t address) {
    ModelBlock block = live_.at(address);
    live_.erase(address);
    if (block.used_elsewhere) {
      pending_bytes_[block.pool] += block.rounded;
      pending_requested_[block.pool] += block.requested;
      ++pending_count_[block.pool];
    }
    return block.used_elsewhere;
  }
  void AllPendingCompleted() {
    pending_bytes_.clear();
    pending_requested_.clear();
    pending_count_.clear();
  }

  std::map<std::uintptr_t, ModelBlock> live_;
  std::map<PoolKind, std::int64_t> pending_bytes_;
  // Freed blocks still used elsewhere keep their requested bytes counted, as
  // in PyTorch (requested_bytes follows active, not allocated).
  std::map<PoolKind, std::int64_t> pending_requested_;
  std::map<PoolKind, std::int64_t> pending_count_;

 private:
  const SizePolicy policy_;
};

std::size_t RandomSize(std::mt19937_64& rng) {
  // Mostly small tensors, some medium, a few large: the shape of the traces.
  const int kind = std::uniform_int_distribution<int>(0, 99)(rng);
  if (kind < 70) return std::uniform_int_distribution<std::size_t>(1, 1 << 20)(rng);
  if (kind < 95) return std::uniform_int_distribution<std::size_t>((1 << 20) + 1, 10 << 20)(rng);
  return std::uniform_int_distribution<std::size_t>(10 << 20, 64 << 20)(rng);
}

void ExpectStatsMatchModel(const Engine& engine, const ControlledBackend& backend,
                           const Model& model, const std::string& where) {
  const MemoryStats stats = engine.GetStats();
  std::int64_t allocated[2] = {0, 0}, requested[2] = {0, 0}, count[2] = {0, 0};
  for (const auto& [address, block] : model.live_) {
    const int pool = static_cast<int>(block.pool);
    allocated[pool] += static_cast<std::int64_t>(block.rounded);
    requested[pool] += static_cast<std::int64_t>(block.requested);
    ++count[pool];
  }
  for (PoolKind pool : {PoolKind::kSmall, PoolKind::kLarge}) {
    const int p = static_cast<int>(pool);
    const auto pending_bytes = model.pending_bytes_.count(pool) ? model.pending_bytes_.at(pool) : 0;
    const auto pending_count = model.pending_count_.count(pool) ? model.pending_count_.at(pool) : 0;
    const auto pending_requested =
        model.pending_requested_.count(pool) ? model.pending_requested_.at(pool) : 0;
    ASSERT_EQ(stats.allocated_bytes.pool(pool).current, allocated[p]) << where;
    ASSERT_EQ(stats.requested_bytes.pool(pool).current, requested[p] + pending_requested) << where;
    ASSERT_EQ(stats.allocation.pool(pool).current, count[p]) << where;
    ASSERT_EQ(stats.active_bytes.pool(pool).current, allocated[p] + pending_bytes) << where;
    ASSERT_EQ(stats.active.pool(pool).current, count[p] + pending_count) << where;
  }
  ASSERT_EQ(stats.allocated_bytes.all().current, allocated[0] + allocated[1]) << where;
  ASSERT_EQ(static_cast<std::size_t>(stats.reserved_bytes.all().current),
            backend.live_segment_bytes())
      << where;
  ASSERT_EQ(stats.segment.all().current, backend.live_segments()) << where;
  ASSERT_GE(stats.reserved_bytes.all().current, stats.active_bytes.all().current) << where;
}

void ExpectNoOverlap(const Model& model, const std::string& where) {
  std::uintptr_t end = 0;
  for (const auto& [address, block] : model.live_) {
    ASSERT_GE(address, end) << "live blocks overlap at " << address << " " << where;
    end = address + block.rounded;
  }
}

class EngineModelTest : public ::testing::TestWithParam<int> {};

TEST_P(EngineModelTest, StatisticsEqualTheModelAfterEveryOperation) {
  const std::uint64_t seed = 1234 + GetParam();
  std::mt19937_64 rng(seed);
  auto backend_owner = std::make_unique<ControlledBackend>(
      ControlledBackendOptions{.capacity_bytes = std::size_t{512} << 20});
  ControlledBackend& backend = *backend_owner;
  Engine engine(std::move(backend_owner));
  Model model(engine.policy());
  std::vector<TagId> tags;
  for (const char* name : {"model-a", "model-b", "model-c"})
    tags.push_back(*TagRegistry::Intern(name));
  std::vector<TagId> tag_stack;
  std::vector<ScopeId> scope_stack;
  absl::flat_hash_map<TagId, std::int64_t> expected_tag_bytes;
  const StreamId streams[] = {0, 1, 2};

  constexpr int kOperations = 4000;
  for (int op = 0; op < kOperations; ++op) {
    const std::string where = absl::StrCat("seed ", seed, " op ", op);
    const int choice = std::uniform_int_distribution<int>(0, 99)(rng);
    if (choice < 45 || model.live_.empty()) {
      const std::size_t size = RandomSize(rng);
      const StreamId stream = streams[std::uniform_int_distribution<int>(0, 2)(rng)];
      const std::int64_t syncs = engine.GetStats().num_sync_all_streams;
      absl::StatusOr<void*> ptr = engine.Allocate(size, stream);
      // Out of memory, the engine waited for every pending block's events.
      if (engine.GetStats().num_sync_all_streams != syncs) model.AllPendingCompleted();
      if (ptr.ok()) {
        const auto address = reinterpret_cast<std::uintptr_t>(*ptr);
        const TagId tag = tag_stack.empty() ? kNoTag : tag_stack.back();
        const std::size_t block_size = engine.GetBlock(*ptr)->size;
        model.Allocated(address, size, block_size, stream, tag,
                        scope_stack.empty() ? kNoScope : scope_stack.back());
        expected_tag_bytes[tag] += static_cast<std::int64_t>(block_size);
      } else {
        ASSERT_TRUE(absl::IsResourceExhausted(ptr.status())) << ptr.status() << " " << where;
      }
    } else if (choice < 85) {
      auto it = model.live_.begin();
      std::advance(it, std::uniform_int_distribution<std::size_t>(0, model.live_.size() - 1)(rng));
      const std::uintptr_t address = it->first;
      expected_tag_bytes[it->second.tag] -= static_cast<std::int64_t>(it->second.rounded);
      ASSERT_TRUE(engine.FreeSized(reinterpret_cast<void*>(address), it->second.requested).ok())
          << where;
      model.Freed(address);
    } else if (choice < 89) {
      auto it = model.live_.begin();
      std::advance(it, std::uniform_int_distribution<std::size_t>(0, model.live_.size() - 1)(rng));
      const StreamId other = streams[std::uniform_int_distribution<int>(0, 2)(rng)];
      ASSERT_TRUE(engine.RecordStream(reinterpret_cast<void*>(it->first), other).ok()) << where;
      if (other != it->second.stream) it->second.used_elsewhere = true;
    } else if (choice < 92) {
      backend.CompleteAll();
      engine.ProcessEvents();
      model.AllPendingCompleted();
    } else if (choice < 94) {
      // EmptyCache waits for every pending block's events first.
      ASSERT_TRUE(engine.EmptyCache().ok()) << where;
      model.AllPendingCompleted();
    } else if (choice < 97) {
      if (tag_stack.size() < 3 && std::uniform_int_distribution<int>(0, 1)(rng) == 0) {
        tag_stack.push_back(tags[std::uniform_int_distribution<int>(0, 2)(rng)]);
        ASSERT_TRUE(PushTag(tag_stack.back()).ok());
      } else if (!tag_stack.empty()) {
        ASSERT_TRUE(PopTag(tag_stack.back()).ok());
        tag_stack.pop_back();
      }
    } else {
      if (scope_stack.size() < 3 && std::uniform_int_distribution<int>(0, 1)(rng) == 0) {
        scope_stack.push_back(OpenScope());
      } else if (!scope_stack.empty()) {
        const ScopeId closing = scope_stack.back();
        scope_stack.pop_back();
        absl::StatusOr<std::vector<ScopeSurvivors>> closed = CloseLeakScope(closing);
        ASSERT_TRUE(closed.ok()) << where;
        // Survivors: live blocks allocated under `closing` or a scope nested
        // in it (every scope opened after it, as nesting is per thread).
        std::size_t expected = 0;
        for (const auto& [address, block] : model.live_) expected += block.scope >= closing;
        std::size_t reported = 0;
        for (const ScopeSurvivors& s : *closed) {
          if (s.device == engine.DeviceName()) reported = s.allocated.size();
        }
        ASSERT_EQ(reported, expected) << where;
      }
    }
    ExpectStatsMatchModel(engine, backend, model, where);
    if (op % 16 == 0) {
      ExpectNoOverlap(model, where);
      absl::Status invariants = engine.CheckInvariants();
      ASSERT_TRUE(invariants.ok()) << invariants.message() << " " << where;
    }
  }
  for (const TagUsage& usage : engine.GetTagUsage()) {
    EXPECT_EQ(usage.current_bytes, expected_tag_bytes[usage.tag]) << "tag " << usage.tag;
  }
  while (!tag_stack.empty()) {
    ASSERT_TRUE(PopTag(tag_stack.back()).ok());
    tag_stack.pop_back();
  }
  while (!scope_stack.empty()) {
    ASSERT_TRUE(CloseLeakScope(scope_stack.back()).ok());
    scope_stack.pop_back();
  }
  for (const auto& [address, block] : model.live_) {
    ASSERT_TRUE(engine.Free(reinterpret_cast<void*>(address)).ok());
  }
  backend.CompleteAll();
  ASSERT_TRUE(engine.EmptyCache().ok());
  EXPECT_EQ(engine.GetStats().reserved_bytes.all().current, 0);
  EXPECT_EQ(backend.live_segments(), 0);
  EXPECT_EQ(backend.live_events(), 0);
  EXPECT_TRUE(engine.CheckInvariants().ok());
}

INSTANTIATE_TEST_SUITE_P(Seeds, EngineModelTest, ::testing::Range(0, 12));

}  // namespace
}  // namespace torchmem
