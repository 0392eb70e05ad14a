// VmmSpace: the physical pages behind an engine's virtual-memory ranges
// (engine-internal; the engine's lock guards it).
//
// With a backend that has the driver's virtual memory API, the engine
// reserves one address range per (pool, stream, small/large) once and places
// blocks in it (page_fit.h); a VmmSpace decides which pages of its ranges
// hold physical memory and makes the backend calls. Its pages all have one
// size, a multiple of the backend's page: the engine has a space per pool
// kind (2 MiB pages in the small pool, 20 MiB in the large one, PyTorch's
// expandable segments' handle sizes), and a page is one physical handle,
// created, mapped and unmapped whole:
//   - a page is "touched" while a live block (allocated or pending) overlaps
//     it; a touched page is always mapped;
//   - when a block is handed out, its untouched pages that are not mapped get
//     a physical page: a new one while the memory limit and the device allow
//     it; under memory pressure (at the limit, or the device full) the
//     handle of a "cached" page (mapped, touched by no live block) is stolen
//     instead, the highest-addressed one (first and page fit fill low
//     addresses, so high cached pages are the least likely to be wanted back
//     soon). Stealing unmaps, which waits for the page's stream: without
//     pressure warm steps make no driver call and no synchronization, as
//     PyTorch's expandable segments;
//   - when a block goes free its pages stay mapped (lazy unmapping): placing
//     a block there again costs no call. EmptyCache unmaps and frees them.
// Pages of private pools (CUDA graphs replay into their addresses) are never
// stolen: they go only when their pool is released and its cache emptied.
// So the hot path, a block whose pages are all mapped, makes no backend call;
// benchmarks/vmm_model/VMM_PLACEMENT.md is the study behind these choices.
//
// Invariants (Check verifies them against the engine's recount):
//   - a page's reference count is the number of live blocks overlapping it;
//   - every page with references is mapped and accessible (between
//     operations); a page's entry exists iff it is mapped;
//   - every mapped page lies in exactly one registered range, whose
//     mapped_pages counts it;
//   - the stealable set holds every mapped, untouched page of ranges of no
//     private pool, and only mapped pages, each flagged `listed`. It may
//     also hold pages that a live block touched since they were listed
//     (stale entries, skipped and dropped when a steal meets them): a block
//     going live on cached pages and coming back, the hot path, then costs
//     no set operation.
#ifndef TORCHMEM_CORE_VMM_SPACE_H_
#define TORCHMEM_CORE_VMM_SPACE_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/btree_map.h"
#include "absl/container/btree_set.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/inlined_vector.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "torchmem/core/backend.h"
#include "torchmem/core/block.h"

namespace torchmem {

// Backend calls made and how pages moved, since the engine was created.
struct VmmCounters {
  std::int64_t reserves = 0;          // ReserveAddressRange
  std::int64_t address_releases = 0;  // ReleaseAddressRange
  std::int64_t creates = 0;           // CreatePhysicalPage
  std::int64_t releases = 0;          // ReleasePhysicalPage
  std::int64_t maps = 0;              // MapPage (one page each)
  std::int64_t set_access = 0;        // SetAccess (a run of new mappings each)
  std::int64_t unmaps = 0;            // UnmapPages (a run of pages each)
  std::int64_t steals = 0;            // handles moved from a cached page
  std::int64_t lost_pages = 0;        // pages a failing backend would not take back
};

// What an acquisition may do to find physical pages.
struct VmmAcquireLimits {
  // Whether pages may be unmapped: cached pages of other places stolen for
  // this one, and the pages a failed acquisition mapped (not while a CUDA
  // graph is captured: unmapping waits for a stream).
  bool may_unmap = true;
  // How many pages may still be created (a memory limit); -1: no limit.
  std::int64_t creatable_pages = -1;
};

class VmmSpace {
 public:
  // Called after pages of `range` starting at `address` were mapped (+n) or
  // unmapped (-n): the engine keeps reserved_bytes equal to the mapped bytes
  // and traces the change (segment_map, segment_unmap).
  using MappedListener =
      std::function<void(Segment& range, std::uintptr_t address, std::int64_t pages)>;

  VmmSpace(Backend& backend, std::size_t page_size, MappedListener listener);
  VmmSpace(const VmmSpace&) = delete;
  VmmSpace& operator=(const VmmSpace&) = delete;

  std::size_t page_size() const { return page_size_; }

  // Ranges whose pages this space manages (reserved by the engine).
  void AddRange(Segment* range);
  // `range` holds no mapped page any more.
  void RemoveRange(Segment* range);

  // Pages of [start, start + size) that no live block touches: the cost of a
  // placement there in new physical memory. Only the end pages can be shared
  // with live neighbours of a free range, so this is two lookups.
  std::int64_t UntouchedPages(std::uintptr_t start, std::size_t size) const;

  // A block [start, start + size) of `range` goes live: its pages gain a
  // reference and those without physical memory are mapped. On error
  // (ResourceExhausted when no page can be had, e.g. at a memory limit, or
  // the backend's error) nothing is referenced, and the pages this call
  // mapped are unmapped and their handles freed, as PyTorch undoes a failed
  // expandable-segment map: a failed allocation holds no new memory (a
  // handle stolen from a cached page is freed too: its old place is unmapped
  // already). Only if undoing fails, or unmapping is not allowed (a capture),
  // do they stay mapped, cached.
  absl::Status Acquire(Segment& range, std::uintptr_t start, std::size_t size,
                       const VmmAcquireLimits& limits);
  // The block [start, start + size) of `range` is no longer live: pages it
  // alone touched become cached (still mapped).
  void Release(Segment& range, std::uintptr_t start, std::size_t size);
  // Unmaps and frees every cached page of `range` (EmptyCache, the
  // out-of-memory ladder). Stops at the first backend error; the pages not
  // freed stay cached.
  absl::Status ReleaseCached(Segment& range);

  // Unmaps and frees up to `pages` cached pages of ranges of no private
  // pool, highest address first (garbage collection under a memory limit).
  // Returns how many went; stops at the first backend error.
  std::int64_t ReleaseStealable(std::int64_t pages);

  // SetAccess again over every mapped page, a run of adjacent pages of one
  // range per call: the backend's access list grew (a peer device was
  // added) and the pages mapped before must follow. Stops at the first
  // backend error.
  absl::Status RegrantAccess();

  // The run of mapped pages of `range` around `address` (which must be on a
  // mapped page): {first byte, bytes}. What a consumer of the memory can
  // treat as one allocation (getBaseAllocation, IPC); the range's unmapped
  // address space around it is not memory. NotFound if `address` is on no
  // mapped page.
  absl::StatusOr<std::pair<std::uintptr_t, std::size_t>> MappedRun(const Segment& range,
                                                                   std::uintptr_t address) const;
  // The physical handle of each page of [start, start + size) (page-aligned,
  // every page mapped), in address order; NotFound if one is not mapped.
  absl::StatusOr<std::vector<PhysicalPage>> HandlesOf(std::uintptr_t start, std::size_t size) const;

  // Unmaps and frees every page, live or not (the engine is being
  // destroyed); errors are ignored.
  void ReleaseEverything();

  std::int64_t mapped_pages() const { return mapped_pages_; }
  std::int64_t touched_pages() const { return touched_pages_; }
  const VmmCounters& counters() const { return counters_; }
  VmmCounters& mutable_counters() { return counters_; }

  // Checks the invariants against `references` (page index -> live blocks
  // overlapping it, recounted by the engine); an empty string if they hold.
  std::string Check(const absl::flat_hash_map<std::uint64_t, std::int32_t>& references) const;

  // Pages are numbered from address 0, so a range's first page starts at its
  // base only if the base is a multiple of the page size (the engine aligns
  // ranges so). A shift where the page size is a power of two (the small
  // pool's 2 MiB), a division otherwise (the large pool's 20 MiB).
  std::uint64_t PageOf(std::uintptr_t address) const {
    return page_shift_ >= 0 ? address >> page_shift_ : address / page_size_;
  }
  std::uintptr_t AddressOf(std::uint64_t index) const { return index * page_size_; }

 private:
  struct Page {
    std::int32_t references = 0;
    bool mapped = false;  // false only while Acquire looks for its handle
    // SetAccess succeeded (a failed acquisition may leave a page mapped
    // without access: it gets it when a block next needs it).
    bool accessible = false;
    // In stealable_ (possibly stale: touched again since it was listed).
    bool listed = false;
    bool present = false;  // the table holds this page (see PageTable)
    PhysicalPage handle = 0;
  };

  // Pages by index, in chunks of 512 pages (1 GiB of 2 MiB pages) allocated
  // while they hold a page: a block's pages are consecutive, so a 16 MiB
  // block costs one chunk lookup rather than eight hash lookups, and the
  // last chunk used is remembered. The subset of a hash map's interface the
  // space needs.
  class PageTable {
   public:
    Page* Find(std::uint64_t index) const {
      Chunk* chunk = ChunkOf(index >> kChunkShift);
      if (chunk == nullptr) return nullptr;
      Page& page = chunk->pages[index & kChunkMask];
      return page.present ? &page : nullptr;
    }
    // The page, inserted (default) if absent.
    Page& operator[](std::uint64_t index);
    // The pages [index, last] that share index's chunk, as an array (the
    // chunk created if absent; its absent pages are not inserted: entries
    // with `present` false); *count gets how many. A block's pages are
    // walked a chunk at a time, with no lookup per page (the hot path).
    Page* Run(std::uint64_t index, std::uint64_t last, std::uint64_t* count);
    void Erase(std::uint64_t index);
    void Clear();
    std::int64_t size() const { return size_; }
    // fn(index, page) for every page held, in no particular order.
    template <typename Fn>
    void ForEach(Fn fn) const {
      for (const auto& [id, chunk] : chunks_) {
        for (std::uint64_t i = 0; i < kChunkPages; ++i) {
          if (chunk->pages[i].present) fn((id << kChunkShift) + i, chunk->pages[i]);
        }
      }
    }

   private:
    static constexpr int kChunkShift = 9;
    static constexpr std::uint64_t kChunkPages = std::uint64_t{1} << kChunkShift;
    static constexpr std::uint64_t kChunkMask = kChunkPages - 1;
    struct Chunk {
      std::array<Page, kChunkPages> pages;
      std::int64_t held = 0;
    };
    Chunk* ChunkOf(std::uint64_t id) const {
      if (id == cached_id_) return cached_;
      auto it = chunks_.find(id);
      if (it == chunks_.end()) return nullptr;
      cached_id_ = id;
      cached_ = it->second.get();
      return cached_;
    }
    // The chunk `id`, created (empty) if absent, and remembered as the last used.
    Chunk& ChunkFor(std::uint64_t id);

    absl::flat_hash_map<std::uint64_t, std::unique_ptr<Chunk>> chunks_;
    std::int64_t size_ = 0;
    // The chunk last looked up (never a freed one).
    mutable std::uint64_t cached_id_ = ~std::uint64_t{0};
    mutable Chunk* cached_ = nullptr;
  };

  // ResourceExhausted: a new page would pass the memory limit (and why no
  // cached page could be stolen instead, if a steal failed).
  absl::Status LimitError(const absl::Status& steal_error) const;
  // The highest-addressed cached page that may be stolen, dropping stale
  // entries on the way; nullopt if none.
  std::optional<std::uint64_t> HighestStealable();

  // A physical page to map: a cached page's handle (stolen) or a new one;
  // `created` counts the pages this acquisition created.
  absl::StatusOr<PhysicalPage> ObtainHandle(const VmmAcquireLimits& limits, std::int64_t* created);
  // Maps the pages [first, first + count) (all in `range`, none mapped) and
  // gives them access.
  // Each page mapped is appended to `mapped`, also when a later one fails.
  absl::Status MapRun(Segment& range, std::uint64_t first, std::int64_t count,
                      const VmmAcquireLimits& limits, std::int64_t* created,
                      absl::InlinedVector<std::uint64_t, 8>& mapped);
  // Unmaps the untouched pages `mapped` and frees their handles (a failed
  // acquisition's undo); a page whose unmap fails stays mapped, cached.
  void UnmapAndFree(absl::Span<const std::uint64_t> mapped);
  // SetAccess over mapped pages [first, first + count).
  absl::Status GiveAccess(std::uint64_t first, std::int64_t count);
  // Unmaps a mapped, untouched page and returns its handle (the page leaves
  // the map).
  absl::StatusOr<PhysicalPage> UnmapPage(std::uint64_t index);
  void Unreference(Segment& range, std::uint64_t first, std::uint64_t last);
  Segment* RangeOf(std::uint64_t index) const;
  bool Stealable(const Segment& range) const { return range.owner == nullptr; }
  // Gives a handle back to the backend, counting it as lost if it refuses.
  void FreeHandle(PhysicalPage handle);

  Backend& backend_;
  const std::size_t page_size_;
  const int page_shift_;  // log2(page_size_), or -1 if it is not a power of two
  const MappedListener listener_;
  absl::btree_map<std::uintptr_t, Segment*> ranges_;  // by base address
  // Mapped pages by index (address / page size).
  PageTable pages_;
  absl::btree_set<std::uint64_t> stealable_;
  std::int64_t mapped_pages_ = 0;
  std::int64_t touched_pages_ = 0;
  VmmCounters counters_;
};

}  // namespace torchmem

#endif  // TORCHMEM_CORE_VMM_SPACE_H_
