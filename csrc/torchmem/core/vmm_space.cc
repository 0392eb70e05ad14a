#include "torchmem/core/vmm_space.h"

#include <algorithm>
#include <bit>
#include <iterator>
#include <utility>
#include <vector>

#include "absl/base/optimization.h"
#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace torchmem {

VmmSpace::VmmSpace(Backend& backend, std::size_t page_size, MappedListener listener)
    : backend_(backend),
      page_size_(page_size),
      page_shift_(std::has_single_bit(page_size) ? std::countr_zero(page_size) : -1),
      listener_(std::move(listener)) {}

VmmSpace::PageTable::Chunk& VmmSpace::PageTable::ChunkFor(std::uint64_t id) {
  Chunk* chunk = ChunkOf(id);
  if (chunk == nullptr) {
    chunk = chunks_.emplace(id, std::make_unique<Chunk>()).first->second.get();
    cached_id_ = id;
    cached_ = chunk;
  }
  return *chunk;
}

VmmSpace::Page& VmmSpace::PageTable::operator[](std::uint64_t index) {
  Chunk& chunk = ChunkFor(index >> kChunkShift);
  Page& page = chunk.pages[index & kChunkMask];
  if (!page.present) {
    page = Page{};
    page.present = true;
    ++chunk.held;
    ++size_;
  }
  return page;
}

VmmSpace::Page* VmmSpace::PageTable::Run(std::uint64_t index, std::uint64_t last,
                                         std::uint64_t* count) {
  Chunk& chunk = ChunkFor(index >> kChunkShift);
  const std::uint64_t chunk_last = index | kChunkMask;
  *count = std::min(last, chunk_last) - index + 1;
  return &chunk.pages[index & kChunkMask];
}

void VmmSpace::PageTable::Erase(std::uint64_t index) {
  const std::uint64_t id = index >> kChunkShift;
  Chunk* chunk = ChunkOf(id);
  if (chunk == nullptr || !chunk->pages[index & kChunkMask].present) return;
  chunk->pages[index & kChunkMask].present = false;
  --size_;
  if (--chunk->held == 0) {
    if (cached_id_ == id) {
      cached_id_ = ~std::uint64_t{0};
      cached_ = nullptr;
    }
    chunks_.erase(id);
  }
}

void VmmSpace::PageTable::Clear() {
  chunks_.clear();
  size_ = 0;
  cached_id_ = ~std::uint64_t{0};
  cached_ = nullptr;
}

void VmmSpace::AddRange(Segment* range) { ranges_.emplace(range->address, range); }

void VmmSpace::RemoveRange(Segment* range) { ranges_.erase(range->address); }

Segment* VmmSpace::RangeOf(std::uint64_t index) const {
  const std::uintptr_t address = AddressOf(index);
  auto it = ranges_.upper_bound(address);
  if (it == ranges_.begin()) return nullptr;
  Segment* range = std::prev(it)->second;
  return address < range->address + range->size ? range : nullptr;
}

std::int64_t VmmSpace::UntouchedPages(std::uintptr_t start, std::size_t size) const {
  const std::uint64_t first = PageOf(start);
  const std::uint64_t last = PageOf(start + size - 1);
  auto touched = [this](std::uint64_t index) {
    const Page* page = pages_.Find(index);
    return page != nullptr && page->references > 0;
  };
  auto untouched = static_cast<std::int64_t>(last - first + 1);
  if (touched(first)) --untouched;
  if (last != first && touched(last)) --untouched;
  return untouched;
}

absl::Status VmmSpace::Acquire(Segment& range, std::uintptr_t start, std::size_t size,
                               const VmmAcquireLimits& limits) {
  const std::uint64_t first = PageOf(start);
  const std::uint64_t last = PageOf(start + size - 1);
  // References first, so that no page of this block is stolen for another.
  absl::InlinedVector<std::uint64_t, 8> unbacked;
  absl::InlinedVector<std::uint64_t, 2> inaccessible;  // mapped by a failed acquisition
  for (std::uint64_t run_first = first, count = 0; run_first <= last; run_first += count) {
    Page* run = pages_.Run(run_first, last, &count);
    for (std::uint64_t i = 0; i < count; ++i) {
      const std::uint64_t index = run_first + i;
      Page* page = &run[i];
      if (ABSL_PREDICT_FALSE(!page->present)) page = &pages_[index];
      if (page->references++ > 0) continue;
      ++touched_pages_;
      if (ABSL_PREDICT_TRUE(page->mapped)) {
        // A stealable_ entry, if any, goes stale (dropped by the next steal
        // that meets it): no set operation on the hot path.
        if (ABSL_PREDICT_FALSE(!page->accessible)) inaccessible.push_back(index);
      } else {
        unbacked.push_back(index);
      }
    }
  }
  for (std::uint64_t index : inaccessible) {
    if (absl::Status access = GiveAccess(index, 1); !access.ok()) {
      Unreference(range, first, last);
      return access;
    }
  }
  if (ABSL_PREDICT_FALSE(limits.creatable_pages >= 0) && !unbacked.empty()) {
    // At a memory limit, a block that cannot get all its pages fails before
    // any is mapped, so a failing allocation never raises reserved memory
    // (nor its peak) to the limit. The cached pages (mapped, untouched: the
    // touched ones are all touched pages but this block's unbacked ones)
    // bound what steals can give; those of private pools cannot be stolen,
    // and then MapRun finds out and the pages mapped so far are undone.
    const auto needed = static_cast<std::int64_t>(unbacked.size());
    const std::int64_t cached = mapped_pages_ - (touched_pages_ - needed);
    const std::int64_t stealable = limits.may_unmap ? cached : 0;
    if (needed > limits.creatable_pages + stealable) {
      Unreference(range, first, last);
      return LimitError(absl::OkStatus());
    }
  }
  std::int64_t created = 0;
  absl::InlinedVector<std::uint64_t, 8> mapped_here;
  for (std::size_t begin = 0; begin < unbacked.size();) {
    std::size_t end = begin + 1;
    while (end < unbacked.size() && unbacked[end] == unbacked[end - 1] + 1) ++end;
    absl::Status mapped = MapRun(range, unbacked[begin], static_cast<std::int64_t>(end - begin),
                                 limits, &created, mapped_here);
    if (!mapped.ok()) {
      // No other live block touches a page this call mapped (it had no
      // physical memory), so once unreferenced they are all untouched.
      Unreference(range, first, last);
      if (limits.may_unmap) UnmapAndFree(mapped_here);
      return mapped;
    }
    begin = end;
  }
  return absl::OkStatus();
}

void VmmSpace::UnmapAndFree(absl::Span<const std::uint64_t> mapped) {
  for (std::uint64_t index : mapped) {
    absl::StatusOr<PhysicalPage> handle = UnmapPage(index);
    if (handle.ok()) FreeHandle(*handle);  // else it stays mapped, cached
  }
}

absl::Status VmmSpace::MapRun(Segment& range, std::uint64_t first, std::int64_t count,
                              const VmmAcquireLimits& limits, std::int64_t* created,
                              absl::InlinedVector<std::uint64_t, 8>& mapped) {
  // A failure leaves the pages mapped so far mapped but not accessible
  // (Acquire undoes them; if it may not, they become cached like any, and
  // get their access when a block needs them).
  for (std::int64_t i = 0; i < count; ++i) {
    const std::uint64_t index = first + static_cast<std::uint64_t>(i);
    absl::StatusOr<PhysicalPage> handle = ObtainHandle(limits, created);
    if (!handle.ok()) return handle.status();
    ++counters_.maps;
    if (absl::Status mapped = backend_.MapPage(AddressOf(index), *handle, page_size_);
        !mapped.ok()) {
      FreeHandle(*handle);
      return mapped;
    }
    Page& page = pages_[index];
    page.mapped = true;
    page.handle = *handle;
    ++mapped_pages_;
    ++range.mapped_pages;
    listener_(range, AddressOf(index), 1);
    mapped.push_back(index);
  }
  return GiveAccess(first, count);
}

absl::Status VmmSpace::RegrantAccess() {
  std::vector<std::uint64_t> mapped;
  mapped.reserve(static_cast<std::size_t>(pages_.size()));
  pages_.ForEach([&mapped](std::uint64_t index, const Page& page) {
    if (page.mapped) mapped.push_back(index);
  });
  std::sort(mapped.begin(), mapped.end());
  for (std::size_t begin = 0; begin < mapped.size();) {
    const Segment* range = RangeOf(mapped[begin]);
    std::size_t end = begin + 1;
    while (end < mapped.size() && mapped[end] == mapped[end - 1] + 1 &&
           RangeOf(mapped[end]) == range) {
      ++end;
    }
    if (absl::Status access = GiveAccess(mapped[begin], static_cast<std::int64_t>(end - begin));
        !access.ok()) {
      return access;
    }
    begin = end;
  }
  return absl::OkStatus();
}

absl::Status VmmSpace::GiveAccess(std::uint64_t first, std::int64_t count) {
  ++counters_.set_access;
  absl::Status access =
      backend_.SetAccess(AddressOf(first), static_cast<std::size_t>(count) * page_size_);
  if (!access.ok()) return access;
  for (std::int64_t i = 0; i < count; ++i) {
    pages_[first + static_cast<std::uint64_t>(i)].accessible = true;
  }
  return absl::OkStatus();
}

absl::StatusOr<PhysicalPage> VmmSpace::ObtainHandle(const VmmAcquireLimits& limits,
                                                    std::int64_t* created) {
  // A new page while the limit and the device allow one: stealing a cached
  // page unmaps it, which waits for its stream (cudaStreamSynchronize) and
  // costs driver calls on every step that touches pages in another order.
  // So cached pages move only under memory pressure: at the memory limit,
  // or when the device has no memory left for a new page.
  absl::Status create_error;
  if (limits.creatable_pages < 0 || *created < limits.creatable_pages) {
    ++counters_.creates;
    absl::StatusOr<PhysicalPage> handle = backend_.CreatePhysicalPage(page_size_);
    if (handle.ok()) {
      ++*created;
      return handle;
    }
    if (!absl::IsResourceExhausted(handle.status())) return handle.status();
    create_error = handle.status();  // the device is full: a cached page may do
  }
  absl::Status steal_error;
  if (std::optional<std::uint64_t> victim = limits.may_unmap ? HighestStealable() : std::nullopt) {
    absl::StatusOr<PhysicalPage> stolen = UnmapPage(*victim);
    if (stolen.ok()) {
      ++counters_.steals;
      return stolen;
    }
    steal_error = stolen.status();  // the victim stays cached
  }
  if (!create_error.ok()) {
    if (steal_error.ok()) return create_error;
    return absl::Status(create_error.code(), absl::StrCat(create_error.message(),
                                                          " (and unmapping a cached page "
                                                          "failed: ",
                                                          steal_error.message(), ")"));
  }
  return LimitError(steal_error);
}

absl::Status VmmSpace::LimitError(const absl::Status& steal_error) const {
  return absl::ResourceExhaustedError(absl::StrFormat(
      "a new %d-byte page would take reserved memory over the memory limit%s", page_size_,
      steal_error.ok()
          ? ""
          : absl::StrCat(" (and unmapping a cached page failed: ", steal_error.message(), ")")));
}

std::optional<std::uint64_t> VmmSpace::HighestStealable() {
  while (!stealable_.empty()) {
    const std::uint64_t index = *stealable_.rbegin();
    Page& page = *pages_.Find(index);
    if (page.references == 0) return index;
    stealable_.erase(index);  // stale: touched since it was listed
    page.listed = false;
  }
  return std::nullopt;
}

absl::StatusOr<PhysicalPage> VmmSpace::UnmapPage(std::uint64_t index) {
  const PhysicalPage handle = pages_.Find(index)->handle;
  Segment* range = RangeOf(index);
  ++counters_.unmaps;
  if (absl::Status unmapped = backend_.UnmapPages(AddressOf(index), page_size_, range->stream);
      !unmapped.ok()) {
    return unmapped;
  }
  pages_.Erase(index);
  stealable_.erase(index);
  --mapped_pages_;
  --range->mapped_pages;
  listener_(*range, AddressOf(index), -1);
  return handle;
}

void VmmSpace::FreeHandle(PhysicalPage handle) {
  ++counters_.releases;
  if (!backend_.ReleasePhysicalPage(handle).ok()) ++counters_.lost_pages;
}

void VmmSpace::Release(Segment& range, std::uintptr_t start, std::size_t size) {
  Unreference(range, PageOf(start), PageOf(start + size - 1));
}

void VmmSpace::Unreference(Segment& range, std::uint64_t first, std::uint64_t last) {
  const bool stealable = Stealable(range);
  for (std::uint64_t run_first = first, count = 0; run_first <= last; run_first += count) {
    // Every page of a live block is present, so the run's chunk exists.
    Page* run = pages_.Run(run_first, last, &count);
    for (std::uint64_t i = 0; i < count; ++i) {
      Page& page = run[i];
      if (--page.references > 0) continue;
      --touched_pages_;
      if (ABSL_PREDICT_FALSE(!page.mapped)) {
        // A failed acquisition's unbacked page. Erasing frees the chunk only
        // with its last present page, and the run's later pages (this
        // block's) are present: `run` is not used after its chunk goes.
        pages_.Erase(run_first + i);
      } else if (stealable && !page.listed) {
        stealable_.insert(run_first + i);
        page.listed = true;
      }
    }
  }
}

absl::Status VmmSpace::ReleaseCached(Segment& range) {
  const std::uint64_t first = PageOf(range.address);
  const std::uint64_t last = PageOf(range.address + range.size - 1);
  std::vector<std::uint64_t> cached;
  pages_.ForEach([&](std::uint64_t index, const Page& page) {
    if (index >= first && index <= last && page.references == 0) cached.push_back(index);
  });
  std::sort(cached.begin(), cached.end());
  // One unmap per run of adjacent pages, then each page's handle is freed.
  for (std::size_t begin = 0; begin < cached.size();) {
    std::size_t end = begin + 1;
    while (end < cached.size() && cached[end] == cached[end - 1] + 1) ++end;
    ++counters_.unmaps;
    absl::Status unmapped =
        backend_.UnmapPages(AddressOf(cached[begin]), (end - begin) * page_size_, range.stream);
    if (!unmapped.ok()) return unmapped;
    for (std::size_t i = begin; i < end; ++i) {
      FreeHandle(pages_.Find(cached[i])->handle);
      pages_.Erase(cached[i]);
      stealable_.erase(cached[i]);
      --mapped_pages_;
      --range.mapped_pages;
    }
    listener_(range, AddressOf(cached[begin]), -static_cast<std::int64_t>(end - begin));
    begin = end;
  }
  return absl::OkStatus();
}

std::int64_t VmmSpace::ReleaseStealable(std::int64_t pages) {
  std::int64_t released = 0;
  while (released < pages) {
    std::optional<std::uint64_t> victim = HighestStealable();
    if (!victim) break;
    absl::StatusOr<PhysicalPage> handle = UnmapPage(*victim);
    if (!handle.ok()) break;  // the page stays cached
    FreeHandle(*handle);
    ++released;
  }
  return released;
}

void VmmSpace::ReleaseEverything() {
  pages_.ForEach([&](std::uint64_t index, const Page& page) {
    if (!page.mapped) return;
    Segment* range = RangeOf(index);
    if (backend_.UnmapPages(AddressOf(index), page_size_, range->stream).ok()) {
      (void)backend_.ReleasePhysicalPage(page.handle);
    }
    --range->mapped_pages;
  });
  pages_.Clear();
  stealable_.clear();
  mapped_pages_ = touched_pages_ = 0;
}

std::string VmmSpace::Check(
    const absl::flat_hash_map<std::uint64_t, std::int32_t>& references) const {
  for (const auto& [index, count] : references) {
    const Page* page = pages_.Find(index);
    if (page == nullptr || !page->mapped || !page->accessible) {
      return absl::StrFormat("page %#x is touched by %d live blocks but not mapped and accessible",
                             AddressOf(index), count);
    }
  }
  absl::flat_hash_map<const Segment*, std::int64_t> per_range;
  std::int64_t touched = 0;
  std::int64_t stealable = 0;
  std::vector<std::pair<std::uint64_t, Page>> held;
  held.reserve(static_cast<std::size_t>(pages_.size()));
  pages_.ForEach([&](std::uint64_t index, const Page& page) { held.emplace_back(index, page); });
  for (const auto& [index, page] : held) {
    const std::uintptr_t address = AddressOf(index);
    auto expected = references.find(index);
    const std::int32_t count = expected == references.end() ? 0 : expected->second;
    if (page.references != count) {
      return absl::StrFormat("page %#x counts %d live blocks, %d overlap it", address,
                             page.references, count);
    }
    if (!page.mapped) return absl::StrFormat("page %#x has an entry but is not mapped", address);
    const Segment* range = RangeOf(index);
    if (range == nullptr) {
      return absl::StrFormat("mapped page %#x lies in no reserved range", address);
    }
    ++per_range[range];
    if (page.references > 0) ++touched;
    const bool should_steal = page.references == 0 && Stealable(*range);
    const bool listed = stealable_.contains(index);
    if (listed != page.listed) {
      return absl::StrFormat("page %#x is %sin the stealable set but flagged otherwise", address,
                             listed ? "" : "not ");
    }
    if (should_steal && !listed) {
      return absl::StrFormat("page %#x is cached in the default pool but not stealable", address);
    }
    if (listed && !Stealable(*range)) {
      return absl::StrFormat("page %#x of a private pool is in the stealable set", address);
    }
    stealable += listed;
  }
  if (stealable != static_cast<std::int64_t>(stealable_.size())) {
    return "the stealable set holds pages that are not mapped";
  }
  if (touched != touched_pages_) {
    return absl::StrFormat("%d pages counted touched, %d are", touched_pages_, touched);
  }
  if (pages_.size() != mapped_pages_) {
    return absl::StrFormat("%d pages counted mapped, %d are", mapped_pages_, pages_.size());
  }
  std::uintptr_t previous_end = 0;
  for (const auto& [base, range] : ranges_) {
    if (base != range->address || !range->vmm) return "a range is registered under a wrong base";
    if (base < previous_end) return absl::StrFormat("ranges overlap at %#x", base);
    previous_end = base + range->size;
    auto counted = per_range.find(range);
    const std::int64_t mapped = counted == per_range.end() ? 0 : counted->second;
    if (mapped != range->mapped_pages) {
      return absl::StrFormat("range %#x counts %d mapped pages, holds %d", base,
                             range->mapped_pages, mapped);
    }
  }
  return "";
}

}  // namespace torchmem
