// The VMM allocator model: pages are backed while live blocks touch them,
// placements share pages where the policy says so, lazy unmapping turns
// reuse into cache hits and steals handles before creating new ones, eager
// unmapping unmaps at once, and every policy keeps the model's invariants on
// real traces.
#include "vmm_model/vmm_placement.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "trace_csv.h"

namespace torchmem_bench {
namespace vmm {
namespace {

constexpr std::uint64_t kMiB = std::uint64_t{1} << 20;

PolicyOptions Policy(Fit fit, Pools pools = Pools::kShared, Unmap unmap = Unmap::kLazy) {
  PolicyOptions policy;
  policy.fit = fit;
  policy.pools = pools;
  policy.unmap = unmap;
  return policy;
}

TEST(VmmPlacementModelTest, BlocksSharingAPageNeedOneHandle) {
  VmmPlacementModel model(Policy(Fit::kBestFit));
  const std::uint64_t a = model.Allocate(kMiB);
  const std::uint64_t b = model.Allocate(kMiB);
  EXPECT_EQ(b, a + kMiB);
  EXPECT_EQ(model.counts().handles, 1);
  EXPECT_EQ(model.counts().creates, 1);
  EXPECT_EQ(model.counts().maps, 1);
  EXPECT_EQ(model.counts().touched_pages, 1);
  // A third straddles into the next page.
  model.Allocate(kMiB + 512);
  EXPECT_EQ(model.counts().handles, 2);
  EXPECT_EQ(model.CheckInvariants(), "");
}

TEST(VmmPlacementModelTest, SizesRoundUpToTheRoundingUnit) {
  PolicyOptions policy = Policy(Fit::kFirstFit);
  policy.large_round_bytes = 2 * kMiB;
  VmmPlacementModel model(policy);
  const std::uint64_t a = model.Allocate(1);
  const std::uint64_t b = model.Allocate(513);
  EXPECT_EQ(b - a, 512u);
  EXPECT_EQ(model.counts().allocated_bytes, 512 + 1024);
  model.Allocate(kMiB + 1);  // above small_limit: a whole page
  EXPECT_EQ(model.counts().allocated_bytes, 512 + 1024 + 2 * kMiB);
}

TEST(VmmPlacementModelTest, LazyUnmappingMakesReuseACacheHit) {
  VmmPlacementModel model(Policy(Fit::kBestFit));
  const std::uint64_t a = model.Allocate(6 * kMiB);
  model.Free(a);
  EXPECT_EQ(model.counts().unmaps, 0);  // still mapped: cached
  EXPECT_EQ(model.counts().touched_pages, 0);
  EXPECT_EQ(model.counts().handles, 3);
  EXPECT_EQ(model.Allocate(6 * kMiB), a);
  EXPECT_EQ(model.counts().maps, 3);
  EXPECT_EQ(model.counts().cache_hits, 1);
  EXPECT_EQ(model.CheckInvariants(), "");
}

TEST(VmmPlacementModelTest, LazyUnmappingStealsCachedHandlesBeforeCreating) {
  VmmPlacementModel model(Policy(Fit::kBestFit));
  const std::uint64_t a = model.Allocate(4 * kMiB);  // pages 0, 1
  const std::uint64_t b = model.Allocate(2 * kMiB);  // page 2: keeps a's space from merging
  model.Free(a);
  (void)b;
  // 6 MiB fits no free range: it goes to the frontier and needs 3 pages; two
  // come from a's cached pages, one is new.
  model.Allocate(6 * kMiB);
  EXPECT_EQ(model.counts().steals, 2);
  EXPECT_EQ(model.counts().unmaps, 1);  // one call for the two adjacent stolen pages
  EXPECT_EQ(model.counts().creates, 4);
  EXPECT_EQ(model.counts().peak_handles, 4);  // = touched pages at the peak
  EXPECT_EQ(model.CheckInvariants(), "");
}

TEST(VmmPlacementModelTest, EagerUnmappingUnmapsAtOnceAndReusesIdleHandles) {
  VmmPlacementModel model(Policy(Fit::kBestFit, Pools::kShared, Unmap::kEager));
  const std::uint64_t a = model.Allocate(4 * kMiB);
  model.Free(a);
  EXPECT_EQ(model.counts().unmaps, 1);  // one call for the run of two pages
  EXPECT_EQ(model.counts().handles, 2);
  model.Allocate(4 * kMiB);
  EXPECT_EQ(model.counts().creates, 2);  // the idle handles were mapped again
  EXPECT_EQ(model.counts().maps, 4);
  EXPECT_EQ(model.counts().cache_hits, 0);
  EXPECT_EQ(model.CheckInvariants(), "");
}

TEST(VmmPlacementModelTest, PageFitSharesTouchedPagesWhereBestFitTakesAnUntouchedOne) {
  // Pages are 2 MiB: p0 [0, 2), p1 [2, 4), ... (addresses in MiB from the base).
  VmmPlacementModel best(Policy(Fit::kBestFit));
  VmmPlacementModel page(Policy(Fit::kPageFit));
  for (VmmPlacementModel* model : {&best, &page}) {
    model->Allocate(3 * kMiB);                                         // [0, 3): p0 p1
    const std::uint64_t gap = model->Allocate(2 * kMiB + 512 * 1024);  // [3, 5.5)
    model->Allocate(4 * kMiB + 512 * 1024);                            // [5.5, 10): p2-p4
    const std::uint64_t island = model->Allocate(2 * kMiB);            // [10, 12): p5
    model->Allocate(2 * kMiB);                                         // [12, 14): p6
    model->Free(gap);     // [3, 5.5) free; p1 and p2 stay touched by its neighbours
    model->Free(island);  // [10, 12) free, exactly 2 MiB; p5 untouched
    ASSERT_EQ(model->counts().touched_pages, 6);
    const std::uint64_t placed = model->Allocate(2 * kMiB);
    if (model == &best) {
      EXPECT_EQ(placed, island);  // the smallest range: p5 touched again
    } else {
      EXPECT_EQ(placed, gap);  // [3, 5) lies on p1 and p2, already touched
    }
    EXPECT_EQ(model->CheckInvariants(), "");
  }
  EXPECT_EQ(best.counts().touched_pages, 7);
  EXPECT_EQ(page.counts().touched_pages, 6);
}

TEST(VmmPlacementModelTest, SmallAndLargePoolsKeepSeparateRegions) {
  VmmPlacementModel model(Policy(Fit::kBestFit, Pools::kSmallLarge));
  const std::uint64_t small = model.Allocate(512);
  const std::uint64_t large = model.Allocate(4 * kMiB);
  EXPECT_NE(small / (std::uint64_t{1} << 44), large / (std::uint64_t{1} << 44));
  EXPECT_EQ(model.counts().handles, 3);  // the small block's page is not shared
}

TEST(VmmPlacementModelTest, EmptyCacheReleasesWhatNoBlockTouches) {
  VmmPlacementModel model(Policy(Fit::kBestFit));
  const std::uint64_t a = model.Allocate(4 * kMiB);
  model.Allocate(kMiB);
  model.Free(a);
  model.EmptyCache();
  EXPECT_EQ(model.counts().handles, 1);
  EXPECT_EQ(model.counts().releases, 2);
  EXPECT_EQ(model.counts().unmaps, 1);
  EXPECT_EQ(model.CheckInvariants(), "");
}

// Every policy on the sample traces, invariants after every operation.
TEST(VmmPlacementModelTest, EveryPolicyKeepsItsInvariantsOnRealTraces) {
  auto files = ListTraceFiles(TORCHMEM_SAMPLE_TRACES);
  ASSERT_TRUE(files.ok()) << files.status();
  ASSERT_FALSE(files->empty());
  for (Fit fit : {Fit::kBestFit, Fit::kFirstFit, Fit::kPageFit}) {
    for (Pools pools : {Pools::kShared, Pools::kSmallLarge}) {
      for (Unmap unmap : {Unmap::kLazy, Unmap::kEager}) {
        PolicyOptions policy = Policy(fit, pools, unmap);
        policy.prefer_mapped = fit == Fit::kPageFit;
        policy.large_round_bytes = unmap == Unmap::kEager ? policy.page_bytes : 512;
        for (const std::string& file : *files) {
          auto trace = ReadTrace(file);
          ASSERT_TRUE(trace.ok()) << trace.status();
          VmmPlacementModel model(policy);
          absl::flat_hash_map<std::uint64_t, std::uint64_t> live;
          for (const TraceEvent& event : trace->events) {
            if (event.op == TraceOp::kAlloc && event.size > 0) {
              if (auto it = live.find(event.addr); it != live.end()) model.Free(it->second);
              live[event.addr] = model.Allocate(event.size);
            } else if (event.op == TraceOp::kFree) {
              auto it = live.find(event.addr);
              if (it == live.end()) continue;
              model.Free(it->second);
              live.erase(it);
            } else {
              continue;
            }
            ASSERT_EQ(model.CheckInvariants(), "") << policy.Name() << " " << file;
          }
          for (const auto& [addr, address] : live) model.Free(address);
          model.EmptyCache();
          ASSERT_EQ(model.CheckInvariants(), "") << policy.Name() << " " << file;
          EXPECT_EQ(model.counts().handles, 0) << policy.Name() << " " << file;
        }
      }
    }
  }
}

}  // namespace
}  // namespace vmm
}  // namespace torchmem_bench
