// What code outside the engine sees of its memory: a private pool whose
// segments come from the pool's own allocator (SegmentSource, PyTorch's
// MemPool(allocator=...)), and BaseAllocation (PyTorch's getBaseAllocation)
// in segments and in virtual-memory ranges.
#include <cstdlib>
#include <memory>
#include <set>

#include "gtest/gtest.h"
#include "tests/cpp/support/engine_fixture.h"

namespace torchmem::testing {
namespace {

constexpr PoolId kPool{0, 9};
constexpr std::size_t kPage = 2 * kMiB;

// Host memory, counted.
class CountingSource final : public SegmentSource {
 public:
  absl::StatusOr<std::uintptr_t> AllocateSegment(std::size_t size, StreamId) override {
    void* ptr = std::aligned_alloc(4096, size);
    live.insert(reinterpret_cast<std::uintptr_t>(ptr));
    ++allocations;
    return reinterpret_cast<std::uintptr_t>(ptr);
  }
  absl::Status ReleaseSegment(std::uintptr_t address, std::size_t) override {
    EXPECT_EQ(live.erase(address), 1u);
    std::free(reinterpret_cast<void*>(address));
    ++releases;
    return absl::OkStatus();
  }
  std::set<std::uintptr_t> live;
  int allocations = 0;
  int releases = 0;
};

PoolFilter Always() {
  return [](StreamId) { return true; };
}

ControlledBackendOptions RealMemory() {
  ControlledBackendOptions options;
  options.real_memory = true;
  options.capacity_bytes = 256 * kMiB;
  return options;
}

// 2 MiB pages in both pools, so that the tests count pages of a block easily.
EngineOptions VirtualMemory() {
  EngineOptions options;
  options.placement = Placement::kVirtualMemory;
  options.policy.vmm_large_page_size = kPage;
  return options;
}

class SegmentSourceTest : public EngineTest {
 protected:
  SegmentSourceTest() : EngineTest(RealMemory(), VirtualMemory()) {}
};

TEST_F(SegmentSourceTest, APoolsSegmentsComeFromItsSourceNotVirtualMemory) {
  auto source = std::make_shared<CountingSource>();
  ASSERT_TRUE(engine_->CreateOrIncrefPool(kPool, source).ok());
  ASSERT_TRUE(engine_->BeginAllocateToPool(kPool, Always()).ok());
  void* in_pool = Allocate(3 * kMiB);
  void* second = Allocate(kMiB);
  ASSERT_TRUE(engine_->EndAllocateToPool(kPool).ok());
  ASSERT_EQ(source->allocations, 2);
  absl::StatusOr<SegmentInfo> segment = engine_->SegmentContaining(in_pool);
  ASSERT_TRUE(segment.ok());
  EXPECT_FALSE(segment->vmm);  // never a virtual-memory range
  EXPECT_EQ(segment->owner, kPool);
  EXPECT_TRUE(source->live.count(segment->address));
  EXPECT_EQ(Stats().reserved_bytes.all().current,
            static_cast<std::int64_t>(segment->size + engine_->SegmentContaining(second)->size));
  EXPECT_POOL_INTACT(*engine_);

  Free(in_pool);
  Free(second);
  // The route's user, then the pool's creator (a MemPool going away): now it may be emptied.
  ASSERT_TRUE(engine_->ReleasePool(kPool).ok());
  ASSERT_TRUE(engine_->ReleasePool(kPool).ok());
  ASSERT_TRUE(engine_->EmptyCache(kPool).ok());
  EXPECT_EQ(source->releases, 2);
  EXPECT_TRUE(source->live.empty());
  EXPECT_EQ(Stats().reserved_bytes.all().current, 0);
}

TEST_F(SegmentSourceTest, APoolKeepsTheSourceItWasCreatedWith) {
  auto source = std::make_shared<CountingSource>();
  ASSERT_TRUE(engine_->CreateOrIncrefPool(kPool, source).ok());
  EXPECT_EQ(engine_->CreateOrIncrefPool(kPool, std::make_shared<CountingSource>()).code(),
            absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(engine_->CreateOrIncrefPool(kPool, source).ok());  // the same one: a user more
  EXPECT_EQ(*engine_->PoolUseCount(kPool), 2);
  ASSERT_TRUE(engine_->ReleasePool(kPool).ok());
  ASSERT_TRUE(engine_->ReleasePool(kPool).ok());
}

TEST_F(SegmentSourceTest, BaseAllocationInARangeIsTheMappedRunAroundThePointer) {
  void* a = Allocate(3 * kMiB);
  void* b = Allocate(3 * kMiB);
  void* c = Allocate(3 * kMiB);
  const auto start = reinterpret_cast<std::uintptr_t>(a);
  ASSERT_EQ(reinterpret_cast<std::uintptr_t>(c), start + 6 * kMiB);
  for (void* ptr : {a, b, c}) {
    auto base = engine_->BaseAllocation(ptr);
    ASSERT_TRUE(base.ok());
    EXPECT_EQ(*base, std::make_pair(start, 5 * kPage));  // not the reserved range
  }
  Free(b);
  ASSERT_TRUE(engine_->EmptyCache().ok());  // unmaps the page only b touched
  EXPECT_EQ(*engine_->BaseAllocation(a), std::make_pair(start, 2 * kPage));
  EXPECT_EQ(*engine_->BaseAllocation(c), std::make_pair(start + 3 * kPage, 2 * kPage));
  auto pages = engine_->PagesOfBlock(c);
  ASSERT_TRUE(pages.ok());
  EXPECT_EQ(pages->first_page, start + 3 * kPage);
  EXPECT_EQ(pages->handles.size(), 2u);  // c spans 6-9 MiB: pages 3 and 4
  Free(a);
  Free(c);
}

}  // namespace
}  // namespace torchmem::testing
