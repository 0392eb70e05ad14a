// Engine: the virtual-memory placement (PyTorch's expandable_segments).
//
// Per (private pool or default, stream, small/large) one address range is
// reserved once, large enough for the whole device; it is a Segment with
// `vmm` set whose blocks tile it like any segment's, its free tail included.
// Blocks are placed by page fit (page_fit.h) and always split to their
// rounded size (sharing a page with a neighbour is where the memory comes
// from); the pages a live block touches are mapped by the VmmSpace of the
// range's pool kind, which creates new pages, stealing cached ones only
// under memory pressure. So reserved_bytes (the mapped pages) follows what is
// live rather than what was once split. As PyTorch's expandable segments,
// the small pool's pages are the device's page (2 MiB) and the large pool's
// 20 MiB (policy_.vmm_large_page_size): a tenth of the cuMemCreate and
// cuMemMap calls of 2 MiB pages for large blocks.
#include <algorithm>
#include <bit>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "torchmem/core/engine.h"
#include "torchmem/core/format.h"
#include "torchmem/core/page_fit.h"

namespace torchmem {

absl::Status Engine::SetPlacement(Placement placement) {
  MutexLock lock(&mutex_);
  if (placement == Placement::kVirtualMemory) {
    if (absl::Status created = CreateVmmSpaces(); !created.ok()) return created;
  }
  placement_ = placement;
  return absl::OkStatus();
}

absl::Status Engine::RefreshVirtualMemoryAccess() {
  MutexLock lock(&mutex_);
  if (!HasVmmSpaces()) return absl::OkStatus();
  for (const std::unique_ptr<VmmSpace>& space : vmm_) {
    if (absl::Status granted = space->RegrantAccess(); !granted.ok()) return granted;
  }
  return absl::OkStatus();
}

Placement Engine::placement() const {
  MutexLock lock(&mutex_);
  return placement_;
}

absl::Status Engine::CreateVmmSpaces() {
  if (HasVmmSpaces()) return absl::OkStatus();
  absl::StatusOr<std::size_t> page = backend_->VirtualMemoryPageSize();
  if (!page.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "torchmem: expandable segments need the device's virtual memory API, but ",
        page.status().message(), "; leave expandable_segments off for ", device_name_));
  }
  if (!std::has_single_bit(*page) || *page % policy_.min_block_size != 0) {
    return absl::InternalError(absl::StrFormat(
        "torchmem: %s reports a virtual memory page of %d bytes, not a power of two multiple of "
        "%d",
        device_name_, *page, policy_.min_block_size));
  }
  const std::size_t large_page =
      std::max(*page, (policy_.vmm_large_page_size + *page - 1) / *page * *page);
  if (absl::Status sized = SizeRanges(large_page); !sized.ok()) return sized;
  auto listener = [this](Segment& range, std::uintptr_t address, std::int64_t pages)
                      ABSL_NO_THREAD_SAFETY_ANALYSIS { OnPagesMapped(range, address, pages); };
  vmm_[static_cast<int>(PoolKind::kSmall)] = std::make_unique<VmmSpace>(*backend_, *page, listener);
  vmm_[static_cast<int>(PoolKind::kLarge)] =
      std::make_unique<VmmSpace>(*backend_, large_page, listener);
  return absl::OkStatus();
}

std::int64_t Engine::MappedBytes() const {
  std::int64_t bytes = 0;
  if (!HasVmmSpaces()) return bytes;
  for (const std::unique_ptr<VmmSpace>& space : vmm_) {
    bytes += space->mapped_pages() * static_cast<std::int64_t>(space->page_size());
  }
  return bytes;
}

absl::Status Engine::SizeRanges(std::size_t page) {
  absl::StatusOr<std::size_t> capacity = backend_->Capacity();
  if (!capacity.ok()) return capacity.status();
  // Each range can hold the whole device and an eighth more, as PyTorch
  // sizes an expandable segment: address space costs no memory, and a range
  // never fills up before the device does. `page` is the largest page size.
  const std::size_t wanted = *capacity + *capacity / 8;
  range_bytes_ = std::max(page, (wanted + page - 1) / page * page);
  return absl::OkStatus();
}

void Engine::OnPagesMapped(Segment& range, std::uintptr_t address, std::int64_t pages) {
  const std::int64_t bytes = pages * static_cast<std::int64_t>(SpaceOf(range).page_size());
  auto apply = [&](StatArray& array) {
    if (bytes > 0) array.Increase(range.pool, bytes);
    if (bytes < 0) array.Decrease(range.pool, -bytes);
  };
  apply(stats_.reserved_bytes);
  if (range.owner != nullptr) {
    apply(stats_.reserved_bytes_by_private_pools[{range.owner->id.first, range.owner->id.second}]);
  }
  peak_mapped_bytes_ = std::max(peak_mapped_bytes_, MappedBytes());
  // As PyTorch traces its expandable segments' maps and unmaps: memory_viz
  // draws reserved memory from them, and NCCL's trace tracker
  // (ProcessGroupNCCL) registers mapped memory with its communicators.
  if (ABSL_PREDICT_FALSE(Tracing())) {
    Trace(bytes > 0 ? TraceAction::kSegmentMap : TraceAction::kSegmentUnmap, address,
          static_cast<std::size_t>(bytes > 0 ? bytes : -bytes), range.stream,
          bytes > 0 ? range.context : segment_free_context_, range.owner);
  }
}

std::int64_t Engine::HeldBytes(const Segment& segment) const {
  if (!segment.vmm) return static_cast<std::int64_t>(segment.size);
  return segment.mapped_pages * static_cast<std::int64_t>(SpaceOf(segment).page_size());
}

void Engine::FillVmmStats(MemoryStats& stats) const {
  if (!HasVmmSpaces()) return;
  MemoryStats::Vmm& out = stats.vmm;
  out.page_size = static_cast<std::int64_t>(vmm_[static_cast<int>(PoolKind::kSmall)]->page_size());
  out.large_page_size =
      static_cast<std::int64_t>(vmm_[static_cast<int>(PoolKind::kLarge)]->page_size());
  out.reserved_address_bytes = reserved_address_bytes_;
  out.mapped_bytes = MappedBytes();
  out.peak_mapped_bytes = peak_mapped_bytes_;
  for (const std::unique_ptr<VmmSpace>& space : vmm_) {
    const auto page = static_cast<std::int64_t>(space->page_size());
    const VmmCounters& calls = space->counters();
    out.touched_bytes += space->touched_pages() * page;
    out.reserves += calls.reserves;
    out.address_releases += calls.address_releases;
    out.creates += calls.creates;
    out.releases += calls.releases;
    out.maps += calls.maps;
    out.set_access += calls.set_access;
    out.unmaps += calls.unmaps;
    out.steals += calls.steals;
    out.lost_pages += calls.lost_pages;
    out.lost_bytes += calls.lost_pages * page;
  }
  out.cached_bytes = out.mapped_bytes - out.touched_bytes;
  // Once expandable segments are off and their ranges released (nothing
  // lost), the vmm.* keys go: torchmem's statistics are PyTorch's again.
  out.in_use =
      placement_ == Placement::kVirtualMemory || reserved_address_bytes_ > 0 || out.lost_pages > 0;
}

absl::StatusOr<Segment*> Engine::ReserveRange(StreamLists& lists, PoolKind pool, PrivatePool* owner,
                                              ContextId context) {
  if (absl::Status created = CreateVmmSpaces(); !created.ok()) return created;
  VmmSpace& space = *vmm_[static_cast<int>(pool)];
  if (absl::Status allowed = backend_->CheckSegmentAllocationAllowed(lists.stream); !allowed.ok()) {
    return allowed;
  }
  // Sized by the device's capacity now (a device whose capacity changed,
  // as a simulated one can, gets ranges that fit it from then on); if the
  // device cannot say, the last size serves.
  (void)SizeRanges(vmm_[static_cast<int>(PoolKind::kLarge)]->page_size());
  // Pages are numbered from address 0 (VmmSpace::PageOf), so a range must
  // start at a multiple of its page size; the backend aligns to its own page
  // only, and a 20 MiB page is not a power of two. A range of larger pages
  // is reserved that much larger, and its aligned part used.
  const std::size_t granule = vmm_[static_cast<int>(PoolKind::kSmall)]->page_size();
  const std::size_t page = space.page_size();
  const std::size_t reservation_size = range_bytes_ + (page - granule);
  ++space.mutable_counters().reserves;
  absl::StatusOr<std::uintptr_t> address = backend_->ReserveAddressRange(reservation_size);
  if (!address.ok()) {
    return absl::Status(address.status().code(),
                        absl::StrFormat("torchmem: could not reserve %s of address space on %s: %s",
                                        FormatBytes(static_cast<std::int64_t>(reservation_size)),
                                        device_name_, address.status().message()));
  }
  if (*address % granule != 0) {
    (void)backend_->ReleaseAddressRange(*address, reservation_size);
    return absl::InternalError(absl::StrFormat(
        "backend %s reserved an address range at %#x, not aligned to its %d-byte pages",
        device_name_, *address, granule));
  }
  const std::uintptr_t base = (*address + page - 1) / page * page;
  auto segment = std::make_unique<Segment>();
  segment->address = base;
  segment->size = range_bytes_;
  segment->reservation = *address;
  segment->reservation_size = reservation_size;
  segment->pool = pool;
  segment->stream = lists.stream;
  segment->lists = &lists.vmm_pools[static_cast<int>(pool)];
  segment->stream_lists = &lists;
  segment->owner = owner;
  segment->registration = next_segment_registration_++;
  segment->context = context;
  segment->vmm = true;
  ++lists.segments;
  lists.vmm_ranges[static_cast<int>(pool)] = segment.get();
  Block* block = NewBlock();
  block->address = base;
  block->size = range_bytes_;
  block->segment = segment.get();
  segment->first = block;
  blocks_.emplace(block->address, block);
  segment->lists->Insert(block);
  stats_.segment.Increase(pool, 1);
  if (owner != nullptr) ++owner->segments;
  reserved_address_bytes_ += static_cast<std::int64_t>(range_bytes_);
  space.AddRange(segment.get());
  Segment* range = segment.get();
  segments_.emplace(range->address, std::move(segment));
  return range;
}

Block* Engine::CarveBlock(Block* block, std::uintptr_t address, std::size_t size) {
  FreeLists& lists = *block->segment->lists;
  lists.Remove(block);
  if (address > block->address) {
    // Placed against the end of the free block: the front stays free.
    SplitBlock(block, address - block->address);
    Block* placed = block->next;
    lists.Remove(placed);
    block->cached_at = gc_clock_;
    lists.Insert(block);
    block = placed;
  }
  if (block->size > size) SplitBlock(block, size);
  return block;
}

absl::Status Engine::AcquirePages(Block* block) {
  // Each page of a block takes an entry in the page table before any is
  // mapped: a block larger than the device (a range is an eighth larger)
  // fails here, before the table grows by millions of entries. Only huge
  // blocks pay for asking the device.
  constexpr std::int64_t kPagesWorthACapacityCheck = std::int64_t{1} << 15;
  VmmSpace& space = SpaceOf(*block->segment);
  const auto page = static_cast<std::int64_t>(space.page_size());
  const std::uint64_t spanned =
      space.PageOf(block->address + block->size - 1) - space.PageOf(block->address) + 1;
  if (ABSL_PREDICT_FALSE(spanned >= static_cast<std::uint64_t>(kPagesWorthACapacityCheck))) {
    const std::int64_t untouched = space.UntouchedPages(block->address, block->size);
    absl::StatusOr<std::size_t> capacity = backend_->Capacity();
    if (capacity.ok() && untouched > static_cast<std::int64_t>(*capacity) / page) {
      return absl::ResourceExhaustedError(absl::StrFormat(
          "%s of new pages are more than the device's %s", FormatBytes(untouched * page),
          FormatBytes(static_cast<std::int64_t>(*capacity))));
    }
  }
  VmmAcquireLimits limits;
  // Unmapping a cached page waits for its stream, which a capture forbids.
  limits.may_unmap = !CaptureUnderwayLocked();
  if (memory_limit_ != 0) {
    // Unsigned: a limit may be as large as SIZE_MAX (no practical limit).
    const auto reserved = static_cast<std::size_t>(stats_.reserved_bytes.all().current);
    const std::size_t room = memory_limit_ > reserved ? memory_limit_ - reserved : 0;
    limits.creatable_pages = static_cast<std::int64_t>(
        std::min<std::size_t>(room / space.page_size(), std::numeric_limits<std::int64_t>::max()));
  }
  return space.Acquire(*block->segment, block->address, block->size, limits);
}

void Engine::CollectCachedPages() {
  // garbage_collection_threshold under virtual memory: cached pages are the
  // only memory a range holds that no live block needs. A new page is taken
  // from them before one is created, so they pile up only up to the peak;
  // past threshold x limit, give back the excess (highest addresses first,
  // the pages least likely to be wanted back soon) rather than PyTorch's
  // oldest blocks, which have no counterpart among pages.
  // In doubles: threshold x limit may exceed any integer type (a limit of
  // SIZE_MAX), and then nothing is over it.
  const double threshold = gc_threshold_ * static_cast<double>(memory_limit_);
  // The large pool's pages first: fewer calls for the same bytes.
  for (PoolKind kind : {PoolKind::kLarge, PoolKind::kSmall}) {
    const std::int64_t reserved = stats_.reserved_bytes.all().current;
    if (static_cast<double>(reserved) <= threshold) return;
    const auto excess = static_cast<std::int64_t>(static_cast<double>(reserved) - threshold);
    VmmSpace& space = *vmm_[static_cast<int>(kind)];
    const auto page = static_cast<std::int64_t>(space.page_size());
    (void)space.ReleaseStealable((excess + page - 1) / page);
  }
}

void Engine::ReleasePages(Block* block) {
  SpaceOf(*block->segment).Release(*block->segment, block->address, block->size);
}

absl::StatusOr<Block*> Engine::AllocateInRange(std::size_t rounded, PoolKind pool, StreamId stream,
                                               PrivatePool* owner, ContextId context) {
  const bool capturing = CaptureUnderwayLocked();
  absl::Status failure;
  for (int attempt = 0; attempt < 2; ++attempt) {
    // Looked up again after the ladder below, which may release the range
    // and its lists.
    StreamLists& lists = owner == nullptr ? ListsFor(stream) : PoolListsFor(owner, stream);
    Segment* range = lists.vmm_ranges[static_cast<int>(pool)];
    if (range == nullptr) {
      absl::StatusOr<Segment*> reserved = ReserveRange(lists, pool, owner, context);
      if (!reserved.ok()) return reserved.status();
      range = *reserved;
    }
    const PageFitChoice choice = ChoosePageFit(*range->lists, rounded, SpaceOf(*range));
    if (choice.block == nullptr) {
      // The ladder may release the range (if all of it is free) and reserve
      // one sized by the device's capacity now.
      failure = absl::ResourceExhaustedError(absl::StrFormat(
          "no free extent of %s is left in the %s of address space reserved for this pool",
          FormatBytes(static_cast<std::int64_t>(rounded)),
          FormatBytes(static_cast<std::int64_t>(range->size))));
    } else {
      Block* block = CarveBlock(choice.block, choice.address, rounded);
      failure = AcquirePages(block);
      if (failure.ok()) {
        if (ABSL_PREDICT_FALSE(gc_threshold_ > 0.0 && memory_limit_ != 0) && !capturing) {
          CollectCachedPages();
        }
        return block;
      }
      // Nothing was taken: the space goes back as it was.
      InsertMerged(block);
      ApplyInactiveSplitChange(pool);
    }
    if (!absl::IsResourceExhausted(failure)) break;
    // As PyTorch does before anything is released: a MemPool that opted in
    // (use_on_oom) lends a free block of its own to the default pool, also
    // during a capture.
    if (owner == nullptr && attempt == 0) {
      if (Block* lent = LendFromUseOnOomPools(rounded, pool, stream)) return lent;
    }
    if (capturing || attempt == 1) break;
    // The ladder: pending blocks become free and every cached page that may
    // go is given back (of released private pools too), then once more.
    ++stats_.num_alloc_retries;
    // A broken event is raised, not reported as a full device.
    if (absl::Status synced = SynchronizeAllEvents(); !synced.ok()) return synced;
    absl::Status released = ReleaseFreeSegments(/*default_pool=*/true);
    if (!released.ok()) {
      return absl::Status(failure.code(),
                          absl::StrCat(failure.message(), "; the cache could not make room first: ",
                                       released.message()));
    }
  }
  return failure;
}

Block* Engine::LendFromUseOnOomPools(std::size_t rounded, PoolKind kind, StreamId stream) {
  // A pool's PyTorch segments (MemPool(no_split=True), or blocks made before
  // the placement changed): split as PyTorch's placement would.
  if (Block* lent = TakeFromUseOnOomPools(rounded, kind, stream)) {
    if (lent->size != rounded && !lent->owner()->no_split &&
        policy_.ShouldSplit(lent->pool(), lent->size, rounded)) {
      SplitBlock(lent, rounded);
    }
    return lent;
  }
  // A pool's range: only a place whose pages are mapped already. What the
  // pool lends is memory it holds; new pages are what the device lacks, and
  // a private pool's cached pages are never stolen.
  VmmAcquireLimits held_pages_only;
  held_pages_only.may_unmap = false;
  held_pages_only.creatable_pages = 0;
  for (const auto& [id, pool] : private_pools_) {
    if (!pool->use_on_oom || pool->freeable) continue;
    auto lists = pool->streams.find(stream);
    if (lists == pool->streams.end()) continue;
    Segment* range = lists->second->vmm_ranges[static_cast<int>(kind)];
    if (range == nullptr) continue;
    const PageFitChoice choice = ChoosePageFit(*range->lists, rounded, SpaceOf(*range));
    if (choice.block == nullptr) continue;
    Block* block = CarveBlock(choice.block, choice.address, rounded);
    if (SpaceOf(*range).Acquire(*range, block->address, block->size, held_pages_only).ok()) {
      return block;
    }
    InsertMerged(block);
    ApplyInactiveSplitChange(kind);
  }
  return nullptr;
}

}  // namespace torchmem
