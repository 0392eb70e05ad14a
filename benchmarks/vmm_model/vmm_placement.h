// A model of a caching allocator over the driver's virtual memory API
// (cuMemAddressReserve / cuMemCreate / cuMemMap / cuMemUnmap), for choosing
// the placement policy of torchmem's VMM backend (issue 12) by replaying
// traces. It places blocks in address ranges and tracks which 2 MiB pages
// are backed by physical memory; it has no device and makes no driver call:
// it counts the calls a real backend would make.
//
// Vocabulary:
//   region    one pool's reservation of address space, unbounded: blocks are
//             placed in its free ranges or at its frontier, past which all is
//             free (address space costs no memory);
//   page      a granularity-sized, -aligned piece of a region; a page is
//             "touched" while any live block overlaps it;
//   handle    a physical allocation of one page (cuMemCreate). A touched page
//             is always mapped to a handle. Handles are never released here
//             (no empty_cache in the model), so the physical memory reserved
//             is handles × page bytes, and its peak is the peak number of
//             touched pages: placement alone decides it.
//   cached    a mapped page no live block touches. With lazy unmapping, pages
//             stay mapped when their last block is freed, and a block placed
//             on them later costs no driver call (a cache hit); when a page
//             needs a handle and none is idle, a cached page's handle is
//             stolen (unmap there, map here) before a new one is created.
//             With eager unmapping, pages are unmapped as soon as nothing
//             touches them and their handles wait, idle, for the next map.
//
// Invariants: free ranges of a region are disjoint, maximal (never adjacent)
// and below its frontier; live blocks and free ranges tile [base, frontier);
// a page's reference count is the number of live blocks overlapping it;
// touched + cached + idle == handles.
#ifndef TORCHMEM_BENCHMARKS_VMM_MODEL_VMM_PLACEMENT_H_
#define TORCHMEM_BENCHMARKS_VMM_MODEL_VMM_PLACEMENT_H_

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"

namespace torchmem_bench {
namespace vmm {

// Which free range (or the frontier) a block goes to.
enum class Fit {
  kBestFit,   // the smallest free range that fits, lowest address among equals
              // (PyTorch's choice); the frontier only when none fits
  kFirstFit,  // the lowest-addressed free range that fits, else the frontier
  kPageFit,   // the placement (either end of any free range, or the frontier)
              // that touches the fewest untouched pages; then best fit
};

enum class Pools {
  kShared,      // one region for every size
  kSmallLarge,  // blocks ≤ small_limit in their own region, as PyTorch does
};

enum class Unmap {
  kLazy,   // free pages stay mapped (cached) until their handle is needed
  kEager,  // free pages are unmapped at once
};

// Which cached page gives up its handle first (lazy unmapping).
enum class Victim {
  kHighestAddress,      // the page farthest from where first fit places
  kLeastRecentlyFreed,  // the page that has been cached longest
};

struct PolicyOptions {
  Fit fit = Fit::kPageFit;
  Pools pools = Pools::kShared;
  Unmap unmap = Unmap::kLazy;
  Victim victim = Victim::kLeastRecentlyFreed;
  std::uint64_t page_bytes = std::uint64_t{2} << 20;   // cuMemGetAllocationGranularity
  std::uint64_t round_bytes = 512;                     // sizes round up to this...
  std::uint64_t large_round_bytes = 512;               // ...and those > small_limit to this
  std::uint64_t small_limit = std::uint64_t{1} << 20;  // Pools::kSmallLarge only
  // Fit::kPageFit only: among placements that touch equally few new pages,
  // prefer those whose pages are still mapped (cached), which need no call.
  bool prefer_mapped = false;
  // Unmap::kLazy only: cached pages may hold up to this fraction of the peak
  // number of touched pages so far in extra handles before a page's handle is
  // stolen rather than a new one created (0: steal whenever a page is cached;
  // physical memory then never exceeds the peak of touched pages). Trades
  // physical memory for fewer map/unmap calls in the steady state.
  double cache_fraction = 0.0;

  // "page_fit/shared/lazy/lru/512" and the like (the last part: the rounding
  // of sizes above small_limit).
  std::string Name() const;
};

// Driver calls a real backend would make, and how the pages were used.
struct ModelCounts {
  std::int64_t allocs = 0;
  std::int64_t frees = 0;
  std::int64_t cache_hits = 0;  // allocations that needed no driver call
  std::int64_t creates = 0;     // cuMemCreate (one page each)
  std::int64_t maps = 0;        // cuMemMap (one handle each)
  std::int64_t unmaps = 0;      // cuMemUnmap calls (a run of adjacent pages each)
  std::int64_t set_access = 0;  // cuMemSetAccess calls (a run of new mappings each)
  std::int64_t steals = 0;      // handles moved from a cached page
  std::int64_t releases = 0;    // cuMemRelease (EmptyCache)
  std::int64_t handles = 0;     // current physical pages
  std::int64_t peak_handles = 0;
  std::int64_t touched_pages = 0;  // pages live blocks overlap
  std::int64_t peak_touched_pages = 0;
  std::int64_t allocated_bytes = 0;  // rounded sizes of live blocks
  std::int64_t peak_allocated_bytes = 0;
  std::int64_t peak_extent_bytes = 0;  // most address space below the frontiers at once
};

class VmmPlacementModel {
 public:
  explicit VmmPlacementModel(const PolicyOptions& options);

  // Places a block of `size` bytes (> 0) and backs its pages; returns its
  // address.
  std::uint64_t Allocate(std::uint64_t size);
  // Frees the live block at `address` (returned by Allocate).
  void Free(std::uint64_t address);
  // Gives back every physical page no live block touches (cuMemUnmap of the
  // cached ones, cuMemRelease of all), as torch.cuda.empty_cache would.
  void EmptyCache();

  const ModelCounts& counts() const { return counts_; }
  std::uint64_t page_bytes() const { return options_.page_bytes; }

  // Checks the invariants above; returns an empty string if they hold, else
  // what is wrong. Costs O(blocks + pages): for tests.
  std::string CheckInvariants() const;

 private:
  struct Region {
    std::uint64_t base = 0;
    std::uint64_t frontier = 0;                                      // [frontier, ∞) is free
    std::map<std::uint64_t, std::uint64_t> free_by_address;          // start -> end
    std::set<std::pair<std::uint64_t, std::uint64_t>> free_by_size;  // (size, start)
  };
  struct Block {
    std::uint64_t size = 0;
    int region = 0;
  };
  struct Page {
    std::int32_t references = 0;  // live blocks overlapping it
    bool mapped = false;
    std::int64_t cached_since = 0;  // when it became cached (lazy unmapping)
  };

  int RegionFor(std::uint64_t size) const;
  // Chooses where a block of `size` goes and takes the space from the region.
  std::uint64_t Place(Region& region, std::uint64_t size);
  // Pages in [start, start + size) that no live block touches.
  std::int64_t UntouchedPages(std::uint64_t start, std::uint64_t size) const;
  // Pages in [start, start + size) without a handle mapped.
  std::int64_t UnmappedPages(std::uint64_t start, std::uint64_t size) const;
  void TakeFreeRange(Region& region, std::uint64_t start, std::uint64_t end,
                     std::uint64_t used_start, std::uint64_t used_end);
  void AddFreeRange(Region& region, std::uint64_t start, std::uint64_t end);
  void RemoveFreeRange(Region& region, std::map<std::uint64_t, std::uint64_t>::iterator it);
  void TouchPages(std::uint64_t start, std::uint64_t size);
  void ReleasePages(std::uint64_t start, std::uint64_t size);
  // A handle for page `index`: an idle one, a cached page's (whose page is
  // added to `victims`), or a new one.
  void BackPage(std::uint64_t index, std::vector<std::uint64_t>* victims);
  void Cache(std::uint64_t index);
  void Uncache(std::uint64_t index);
  std::uint64_t PageOf(std::uint64_t address) const { return address / options_.page_bytes; }

  PolicyOptions options_;
  std::vector<Region> regions_;
  absl::flat_hash_map<std::uint64_t, Block> blocks_;  // address -> live block
  absl::flat_hash_map<std::uint64_t, Page> pages_;    // page index -> state
  // Cached pages by eviction order: (key, page index); key is the address
  // (kHighestAddress: evict the largest) or the time it became cached.
  std::set<std::pair<std::int64_t, std::uint64_t>> cached_;
  std::int64_t idle_handles_ = 0;
  std::int64_t clock_ = 0;
  ModelCounts counts_;
};

}  // namespace vmm
}  // namespace torchmem_bench

#endif  // TORCHMEM_BENCHMARKS_VMM_MODEL_VMM_PLACEMENT_H_
