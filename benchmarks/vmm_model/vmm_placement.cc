// The VMM allocator model (see vmm_placement.h).
#include "vmm_model/vmm_placement.h"

#include <algorithm>
#include <cassert>
#include <iterator>
#include <limits>
#include <tuple>

#include "absl/strings/str_cat.h"

namespace torchmem_bench {
namespace vmm {
namespace {

// Regions sit far apart so none can run into the next (2^44 bytes each).
constexpr std::uint64_t kRegionSpacing = std::uint64_t{1} << 44;

std::uint64_t RoundUp(std::uint64_t value, std::uint64_t to) { return (value + to - 1) / to * to; }

}  // namespace

std::string PolicyOptions::Name() const {
  const char* fit_name = fit == Fit::kBestFit    ? "best_fit"
                         : fit == Fit::kFirstFit ? "first_fit"
                                                 : "page_fit";
  const char* pool_name = pools == Pools::kShared ? "shared" : "small_large";
  const char* unmap_name = unmap == Unmap::kLazy ? "lazy" : "eager";
  std::string name = absl::StrCat(fit_name, "/", pool_name, "/", unmap_name);
  if (unmap == Unmap::kLazy) {
    absl::StrAppend(&name, victim == Victim::kHighestAddress ? "/highest" : "/lru");
  }
  if (fit == Fit::kPageFit && prefer_mapped) absl::StrAppend(&name, "/prefer_mapped");
  if (unmap == Unmap::kLazy && cache_fraction > 0) {
    absl::StrAppend(&name, "/cache_1_", static_cast<int>(1.0 / cache_fraction + 0.5));
  }
  absl::StrAppend(&name, "/",
                  large_round_bytes == round_bytes
                      ? absl::StrCat(round_bytes)
                      : absl::StrCat(round_bytes, "+large_", large_round_bytes >> 20, "MiB"));
  return name;
}

VmmPlacementModel::VmmPlacementModel(const PolicyOptions& options) : options_(options) {
  const int regions = options_.pools == Pools::kShared ? 1 : 2;
  regions_.resize(regions);
  for (int i = 0; i < regions; ++i) {
    regions_[i].base = kRegionSpacing * static_cast<std::uint64_t>(i + 1);
    regions_[i].frontier = regions_[i].base;
  }
}

int VmmPlacementModel::RegionFor(std::uint64_t size) const {
  if (options_.pools == Pools::kShared) return 0;
  return size <= options_.small_limit ? 0 : 1;
}

std::uint64_t VmmPlacementModel::Allocate(std::uint64_t requested) {
  assert(requested > 0);
  const std::uint64_t size =
      RoundUp(requested,
              requested > options_.small_limit ? options_.large_round_bytes : options_.round_bytes);
  const int r = RegionFor(size);
  Region& region = regions_[r];
  const std::uint64_t address = Place(region, size);
  blocks_[address] = Block{size, r};
  ++counts_.allocs;
  counts_.allocated_bytes += static_cast<std::int64_t>(size);
  counts_.peak_allocated_bytes = std::max(counts_.peak_allocated_bytes, counts_.allocated_bytes);
  const std::int64_t driver_calls_before = counts_.maps + counts_.unmaps + counts_.creates;
  TouchPages(address, size);
  if (counts_.maps + counts_.unmaps + counts_.creates == driver_calls_before) ++counts_.cache_hits;
  return address;
}

void VmmPlacementModel::Free(std::uint64_t address) {
  auto it = blocks_.find(address);
  assert(it != blocks_.end());
  const Block block = it->second;
  blocks_.erase(it);
  ++counts_.frees;
  ++clock_;
  counts_.allocated_bytes -= static_cast<std::int64_t>(block.size);
  ReleasePages(address, block.size);
  AddFreeRange(regions_[block.region], address, address + block.size);
}

std::int64_t VmmPlacementModel::UnmappedPages(std::uint64_t start, std::uint64_t size) const {
  std::int64_t unmapped = 0;
  for (std::uint64_t page = PageOf(start); page <= PageOf(start + size - 1); ++page) {
    auto it = pages_.find(page);
    if (it == pages_.end() || !it->second.mapped) ++unmapped;
  }
  return unmapped;
}

void VmmPlacementModel::EmptyCache() {
  std::uint64_t previous = std::numeric_limits<std::uint64_t>::max();
  std::vector<std::uint64_t> cached;
  for (const auto& [key, index] : cached_) cached.push_back(index);
  std::sort(cached.begin(), cached.end());
  for (const std::uint64_t index : cached) {
    pages_[index].mapped = false;
    if (index != previous + 1) ++counts_.unmaps;  // one call per run of adjacent pages
    previous = index;
  }
  const std::int64_t released = static_cast<std::int64_t>(cached.size()) + idle_handles_;
  cached_.clear();
  idle_handles_ = 0;
  counts_.handles -= released;
  counts_.releases += released;
}

std::int64_t VmmPlacementModel::UntouchedPages(std::uint64_t start, std::uint64_t size) const {
  const std::uint64_t first = PageOf(start);
  const std::uint64_t last = PageOf(start + size - 1);
  std::int64_t untouched = static_cast<std::int64_t>(last - first + 1);
  // Only the end pages can be shared with live neighbours: every page wholly
  // inside a free range is untouched.
  auto touched = [this](std::uint64_t page) {
    auto it = pages_.find(page);
    return it != pages_.end() && it->second.references > 0;
  };
  if (touched(first)) --untouched;
  if (last != first && touched(last)) --untouched;
  return untouched;
}

std::uint64_t VmmPlacementModel::Place(Region& region, std::uint64_t size) {
  // The chosen free range (end() = the frontier) and where in it.
  auto chosen = region.free_by_address.end();
  std::uint64_t at = region.frontier;
  switch (options_.fit) {
    case Fit::kBestFit: {
      auto it = region.free_by_size.lower_bound({size, 0});
      if (it != region.free_by_size.end()) {
        chosen = region.free_by_address.find(it->second);
        at = it->second;
      }
      break;
    }
    case Fit::kFirstFit:
      for (auto it = region.free_by_address.begin(); it != region.free_by_address.end(); ++it) {
        if (it->second - it->first >= size) {
          chosen = it;
          at = it->first;
          break;
        }
      }
      break;
    case Fit::kPageFit: {
      // (untouched pages, [pages to map,] range size, address): smallest
      // wins; the frontier counts as an infinitely large range. Pages to map
      // (untouched and without a handle: a driver call each) are counted only
      // with prefer_mapped, and only when a candidate ties on untouched pages.
      auto score = [&](std::uint64_t candidate, std::uint64_t range_size) {
        const std::int64_t untouched = UntouchedPages(candidate, size);
        const std::int64_t to_map = options_.prefer_mapped ? UnmappedPages(candidate, size) : 0;
        return std::make_tuple(untouched, to_map, range_size, candidate);
      };
      auto best = score(region.frontier, std::numeric_limits<std::uint64_t>::max());
      for (auto it = region.free_by_size.lower_bound({size, 0}); it != region.free_by_size.end();
           ++it) {
        const std::uint64_t start = it->second;
        const std::uint64_t end = start + it->first;
        for (const std::uint64_t candidate : {start, end - size}) {
          if (UntouchedPages(candidate, size) > std::get<0>(best)) continue;  // cheap test first
          auto candidate_score = score(candidate, it->first);
          if (candidate_score < best) {
            best = candidate_score;
            chosen = region.free_by_address.find(start);
            at = candidate;
          }
        }
      }
      break;
    }
  }
  if (chosen == region.free_by_address.end()) {
    region.frontier += size;  // at == the old frontier
  } else {
    TakeFreeRange(region, chosen->first, chosen->second, at, at + size);
  }
  std::int64_t extent = 0;
  for (const Region& each : regions_)
    extent += static_cast<std::int64_t>(each.frontier - each.base);
  counts_.peak_extent_bytes = std::max(counts_.peak_extent_bytes, extent);
  return at;
}

void VmmPlacementModel::RemoveFreeRange(Region& region,
                                        std::map<std::uint64_t, std::uint64_t>::iterator it) {
  region.free_by_size.erase({it->second - it->first, it->first});
  region.free_by_address.erase(it);
}

void VmmPlacementModel::TakeFreeRange(Region& region, std::uint64_t start, std::uint64_t end,
                                      std::uint64_t used_start, std::uint64_t used_end) {
  RemoveFreeRange(region, region.free_by_address.find(start));
  for (const auto& [piece_start, piece_end] :
       {std::make_pair(start, used_start), std::make_pair(used_end, end)}) {
    if (piece_end > piece_start) {
      region.free_by_address.emplace(piece_start, piece_end);
      region.free_by_size.emplace(piece_end - piece_start, piece_start);
    }
  }
}

void VmmPlacementModel::AddFreeRange(Region& region, std::uint64_t start, std::uint64_t end) {
  // Merge with the free neighbours, so free ranges stay maximal.
  auto next = region.free_by_address.lower_bound(start);
  if (next != region.free_by_address.end() && next->first == end) {
    end = next->second;
    auto gone = next++;
    RemoveFreeRange(region, gone);
  }
  if (next != region.free_by_address.begin()) {
    auto previous = std::prev(next);
    if (previous->second == start) {
      start = previous->first;
      RemoveFreeRange(region, previous);
    }
  }
  if (end == region.frontier) {
    region.frontier = start;  // the free tail grows down
    return;
  }
  region.free_by_address.emplace(start, end);
  region.free_by_size.emplace(end - start, start);
}

void VmmPlacementModel::TouchPages(std::uint64_t start, std::uint64_t size) {
  // First every page gains the block (cached pages in range become touched
  // again), then the pages without a handle get one, so that backing one
  // page never steals the handle of another page of the same block.
  std::vector<std::uint64_t> unbacked;
  for (std::uint64_t page = PageOf(start); page <= PageOf(start + size - 1); ++page) {
    Page& state = pages_[page];
    if (state.references++ > 0) continue;
    counts_.peak_touched_pages = std::max(counts_.peak_touched_pages, ++counts_.touched_pages);
    if (state.mapped) {
      Uncache(page);
    } else {
      unbacked.push_back(page);
    }
  }
  std::vector<std::uint64_t> victims;
  for (std::size_t i = 0; i < unbacked.size(); ++i) {
    BackPage(unbacked[i], &victims);
    // One cuMemSetAccess per run of adjacent new mappings.
    if (i == 0 || unbacked[i] != unbacked[i - 1] + 1) ++counts_.set_access;
  }
  // The stolen pages are unmapped first, one cuMemUnmap per run of adjacent
  // pages (a call may cover several whole mappings).
  std::sort(victims.begin(), victims.end());
  for (std::size_t i = 0; i < victims.size(); ++i) {
    if (i == 0 || victims[i] != victims[i - 1] + 1) ++counts_.unmaps;
  }
}

void VmmPlacementModel::BackPage(std::uint64_t index, std::vector<std::uint64_t>* victims) {
  if (idle_handles_ > 0) {
    --idle_handles_;
  } else if (options_.unmap == Unmap::kLazy && !cached_.empty() &&
             counts_.handles >= counts_.peak_touched_pages +
                                    static_cast<std::int64_t>(options_.cache_fraction *
                                                              counts_.peak_touched_pages)) {
    // Steal: the victim's handle moves here (unmapped there, mapped below).
    auto victim =
        options_.victim == Victim::kHighestAddress ? std::prev(cached_.end()) : cached_.begin();
    pages_[victim->second].mapped = false;
    victims->push_back(victim->second);
    cached_.erase(victim);
    ++counts_.steals;
  } else {
    ++counts_.creates;
    ++counts_.handles;
    counts_.peak_handles = std::max(counts_.peak_handles, counts_.handles);
  }
  pages_[index].mapped = true;
  ++counts_.maps;
}

void VmmPlacementModel::ReleasePages(std::uint64_t start, std::uint64_t size) {
  std::uint64_t previous_unmapped = std::numeric_limits<std::uint64_t>::max();
  for (std::uint64_t page = PageOf(start); page <= PageOf(start + size - 1); ++page) {
    Page& state = pages_[page];
    if (--state.references > 0) continue;
    --counts_.touched_pages;
    if (options_.unmap == Unmap::kLazy) {
      Cache(page);
      continue;
    }
    state.mapped = false;
    ++idle_handles_;
    // One cuMemUnmap per run of adjacent pages freed together.
    if (previous_unmapped == std::numeric_limits<std::uint64_t>::max() ||
        page != previous_unmapped + 1) {
      ++counts_.unmaps;
    }
    previous_unmapped = page;
  }
}

void VmmPlacementModel::Cache(std::uint64_t index) {
  Page& state = pages_[index];
  state.cached_since = clock_;
  const std::int64_t key = options_.victim == Victim::kHighestAddress
                               ? static_cast<std::int64_t>(index)
                               : state.cached_since;
  cached_.emplace(key, index);
}

void VmmPlacementModel::Uncache(std::uint64_t index) {
  const Page& state = pages_[index];
  const std::int64_t key = options_.victim == Victim::kHighestAddress
                               ? static_cast<std::int64_t>(index)
                               : state.cached_since;
  cached_.erase({key, index});
}

std::string VmmPlacementModel::CheckInvariants() const {
  absl::flat_hash_map<std::uint64_t, std::int32_t> references;
  std::int64_t allocated = 0;
  for (std::size_t r = 0; r < regions_.size(); ++r) {
    const Region& region = regions_[r];
    if (region.free_by_address.size() != region.free_by_size.size()) {
      return absl::StrCat("region ", r, ": the two free indexes disagree");
    }
    // Blocks and free ranges tile [base, frontier).
    std::map<std::uint64_t, std::uint64_t> pieces(region.free_by_address);
    for (const auto& [address, block] : blocks_) {
      if (block.region != static_cast<int>(r)) continue;
      pieces.emplace(address, address + block.size);
      allocated += static_cast<std::int64_t>(block.size);
      for (std::uint64_t page = PageOf(address); page <= PageOf(address + block.size - 1); ++page) {
        ++references[page];
      }
    }
    std::uint64_t cursor = region.base;
    bool previous_free = false;
    for (const auto& [start, end] : pieces) {
      if (start != cursor) return absl::StrCat("region ", r, ": gap or overlap at ", start);
      const bool free = region.free_by_address.count(start) > 0;
      if (free && previous_free) return absl::StrCat("region ", r, ": adjacent free ranges");
      if (free && !region.free_by_size.count({end - start, start})) {
        return absl::StrCat("region ", r, ": free range missing from the size index");
      }
      previous_free = free;
      cursor = end;
    }
    if (cursor != region.frontier) return absl::StrCat("region ", r, ": frontier mismatch");
    if (previous_free) return absl::StrCat("region ", r, ": free range below the frontier");
  }
  if (allocated != counts_.allocated_bytes) return "allocated bytes differ from a recount";
  std::int64_t touched = 0, cached = 0;
  for (const auto& [index, page] : pages_) {
    auto it = references.find(index);
    const std::int32_t expected = it == references.end() ? 0 : it->second;
    if (page.references != expected) return absl::StrCat("page ", index, ": wrong references");
    if (page.references > 0) {
      ++touched;
      if (!page.mapped) return absl::StrCat("page ", index, ": touched but not mapped");
    } else if (page.mapped) {
      ++cached;
    }
  }
  if (touched != counts_.touched_pages) return "touched pages differ from a recount";
  if (cached != static_cast<std::int64_t>(cached_.size())) return "cached pages differ";
  if (touched + cached + idle_handles_ != counts_.handles) {
    return "touched + cached + idle != handles";
  }
  return "";
}

}  // namespace vmm
}  // namespace torchmem_bench
