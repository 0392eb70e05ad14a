// VmmSpace's page (physical handle) size: a space maps pages of the size it
// was made with, a multiple of the backend's granule that need not be a power
// of two (the large pool's 20 MiB, as PyTorch's expandable segments), one
// create and one map per page, and gives each back whole.
#include "torchmem/core/vmm_space.h"

#include <cstdint>

#include "absl/container/flat_hash_map.h"
#include "gtest/gtest.h"
#include "tests/doubles/controlled_backend.h"
#include "tests/doubles/fault_injecting_backend.h"

namespace torchmem::testing {
namespace {

constexpr std::size_t kMiB = std::size_t{1} << 20;
constexpr std::size_t kGranule = 2 * kMiB;
constexpr std::size_t kLargePage = 20 * kMiB;

class VmmSpaceTest : public ::testing::Test {
 protected:
  VmmSpaceTest()
      : space_(faults_, kLargePage,
               [this](Segment&, std::uintptr_t, std::int64_t pages) { mapped_ += pages; }) {}

  void SetUp() override {
    // Ranges start on a multiple of the page size (the engine aligns them so).
    absl::StatusOr<std::uintptr_t> reserved = faults_.ReserveAddressRange(kRangeBytes + kLargePage);
    ASSERT_TRUE(reserved.ok()) << reserved.status();
    reservation_ = *reserved;
    range_.address = (*reserved + kLargePage - 1) / kLargePage * kLargePage;
    range_.size = kRangeBytes;
    range_.vmm = true;
    space_.AddRange(&range_);
  }
  void TearDown() override {
    space_.RemoveRange(&range_);
    EXPECT_TRUE(faults_.ReleaseAddressRange(reservation_, kRangeBytes + kLargePage).ok());
  }

  // Live blocks per page, as the engine recounts them for Check.
  absl::flat_hash_map<std::uint64_t, std::int32_t> References(std::uintptr_t start,
                                                              std::size_t size) const {
    absl::flat_hash_map<std::uint64_t, std::int32_t> references;
    for (std::uint64_t page = space_.PageOf(start); page <= space_.PageOf(start + size - 1);
         ++page) {
      ++references[page];
    }
    return references;
  }

  static constexpr std::size_t kRangeBytes = 40 * kLargePage;
  ControlledBackend* backend_ = new ControlledBackend();  // owned by faults_
  FaultInjectingBackend faults_{std::unique_ptr<ControlledBackend>(backend_)};
  VmmSpace space_;
  Segment range_;
  std::uintptr_t reservation_ = 0;
  std::int64_t mapped_ = 0;
};

TEST_F(VmmSpaceTest, PagesAreNumberedByTheirSizeEvenWhenItIsNotAPowerOfTwo) {
  EXPECT_EQ(space_.page_size(), kLargePage);
  EXPECT_EQ(space_.PageOf(range_.address), range_.address / kLargePage);
  EXPECT_EQ(space_.PageOf(range_.address + kLargePage - 1), range_.address / kLargePage);
  EXPECT_EQ(space_.PageOf(range_.address + kLargePage), range_.address / kLargePage + 1);
  EXPECT_EQ(space_.AddressOf(space_.PageOf(range_.address + 3 * kLargePage + 5)),
            range_.address + 3 * kLargePage);
}

TEST_F(VmmSpaceTest, ABlockGetsOneCreateAndOneMapPerPageOfThePageSize) {
  const ControlledBackend& inner = *backend_;
  // 50 MiB from the range's start: pages 0, 1 and 2.
  ASSERT_TRUE(space_.Acquire(range_, range_.address, 50 * kMiB, {}).ok());
  EXPECT_EQ(faults_.calls(BackendCall::kCreatePhysicalPage), 3);
  EXPECT_EQ(faults_.calls(BackendCall::kMapPage), 3);
  EXPECT_EQ(faults_.calls(BackendCall::kSetAccess), 1) << "one run, one SetAccess";
  EXPECT_EQ(inner.live_page_bytes(), 3 * kLargePage);
  EXPECT_EQ(inner.mapped_pages(), static_cast<std::int64_t>(3 * kLargePage / kGranule));
  EXPECT_EQ(mapped_, 3);
  EXPECT_EQ(space_.Check(References(range_.address, 50 * kMiB)), "");

  // Blocks inside pages already mapped cost nothing.
  ASSERT_TRUE(space_.Acquire(range_, range_.address + 52 * kMiB, 4 * kMiB, {}).ok());
  EXPECT_EQ(faults_.calls(BackendCall::kCreatePhysicalPage), 3);
  space_.Release(range_, range_.address + 52 * kMiB, 4 * kMiB);

  // Released pages stay mapped (cached) until the cache is emptied, then go
  // back whole: one unmap for the run, one release per page.
  space_.Release(range_, range_.address, 50 * kMiB);
  EXPECT_EQ(space_.mapped_pages(), 3);
  ASSERT_TRUE(space_.ReleaseCached(range_).ok());
  EXPECT_EQ(faults_.calls(BackendCall::kUnmapPages), 1);
  EXPECT_EQ(faults_.calls(BackendCall::kReleasePhysicalPage), 3);
  EXPECT_EQ(inner.live_page_bytes(), 0u);
  EXPECT_EQ(inner.mapped_pages(), 0);
  EXPECT_EQ(mapped_, 0);
  EXPECT_EQ(space_.Check({}), "");
}

TEST_F(VmmSpaceTest, UnderALimitAStolenPageIsAWholePage) {
  ASSERT_TRUE(space_.Acquire(range_, range_.address + 5 * kLargePage, kMiB, {}).ok());
  space_.Release(range_, range_.address + 5 * kLargePage, kMiB);
  // No page may be created: the cached one moves, unmapped whole.
  VmmAcquireLimits limits;
  limits.creatable_pages = 0;
  ASSERT_TRUE(space_.Acquire(range_, range_.address, 3 * kMiB, limits).ok());
  EXPECT_EQ(space_.counters().steals, 1);
  EXPECT_EQ(faults_.calls(BackendCall::kCreatePhysicalPage), 1);
  EXPECT_EQ(space_.Check(References(range_.address, 3 * kMiB)), "");
  space_.Release(range_, range_.address, 3 * kMiB);
  ASSERT_TRUE(space_.ReleaseCached(range_).ok());
}

}  // namespace
}  // namespace torchmem::testing
