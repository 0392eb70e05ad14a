// Engine: read-only reports (stats, tags, fragmentation, segments) and the
// out-of-memory message. Each takes the engine's lock and copies.
#include <algorithm>
#include <bit>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "torchmem/core/engine.h"
#include "torchmem/core/format.h"

namespace torchmem {
namespace {

// Accumulates free extents (runs of adjacent free blocks) and allocated
// blocks into FreeSpaceStats.
class FreeSpaceCounter {
 public:
  explicit FreeSpaceCounter(FreeSpaceStats* stats) : stats_(stats) {}

  void AddSegment(std::size_t size) { stats_->reserved_bytes += static_cast<std::int64_t>(size); }
  void AddAllocated(const Block& block) {
    stats_->allocated_bytes += static_cast<std::int64_t>(block.size);
    stats_->requested_bytes += static_cast<std::int64_t>(block.requested_size);
    stats_->internal_waste_bytes +=
        static_cast<std::int64_t>(block.size) - static_cast<std::int64_t>(block.requested_size);
  }
  // Pending blocks keep their requested bytes until they are free, as
  // requested_bytes does in PyTorch's statistics.
  void AddPending(const Block& block) {
    stats_->pending_free_bytes += static_cast<std::int64_t>(block.size);
    stats_->requested_bytes += static_cast<std::int64_t>(block.requested_size);
  }
  void AddExtent(std::int64_t bytes, bool segment_has_live_blocks) {
    stats_->free_bytes += bytes;
    ++stats_->free_extents;
    stats_->largest_free_extent = std::max(stats_->largest_free_extent, bytes);
    if (segment_has_live_blocks) stats_->inactive_split_bytes += bytes;
    const int bucket = static_cast<int>(std::bit_width(static_cast<std::uint64_t>(bytes))) - 1;
    if (stats_->histogram_counts.size() <= static_cast<std::size_t>(bucket)) {
      stats_->histogram_counts.resize(bucket + 1, 0);
      stats_->histogram_bytes.resize(bucket + 1, 0);
    }
    ++stats_->histogram_counts[bucket];
    stats_->histogram_bytes[bucket] += bytes;
  }
  void Finish() {
    stats_->external_fragmentation = stats_->free_bytes == 0
                                         ? 0.0
                                         : 1.0 - static_cast<double>(stats_->largest_free_extent) /
                                                     static_cast<double>(stats_->free_bytes);
  }

 private:
  FreeSpaceStats* stats_;
};

// Calls fn(extent_bytes) for every run of adjacent free blocks of a segment
// (of a virtual-memory range: but its free tail, address space rather than
// memory); returns whether the segment holds allocated or pending blocks.
template <typename Fn>
bool ForEachFreeExtent(const Segment& segment, Fn fn) {
  bool has_live = false;
  std::int64_t run = 0;
  for (const Block* block = segment.first; block != nullptr; block = block->next) {
    if (segment.vmm && block->next == nullptr && block->state == BlockState::kFree) break;
    if (block->state == BlockState::kFree) {
      run += static_cast<std::int64_t>(block->size);
      continue;
    }
    has_live = true;
    if (run > 0) fn(run);
    run = 0;
  }
  if (run > 0) fn(run);
  return has_live;
}

}  // namespace

MemoryStats Engine::GetStats() const {
  MutexLock lock(&mutex_);
  MemoryStats stats = stats_;
  FillVmmStats(stats);
  return stats;
}

void Engine::ResetPeakStats() {
  MutexLock lock(&mutex_);
  stats_.ResetPeaks();
}

void Engine::ResetAccumulatedStats() {
  MutexLock lock(&mutex_);
  stats_.ResetAccumulated();
}

std::vector<TagUsage> Engine::GetTagUsage() const {
  MutexLock lock(&mutex_);
  std::vector<TagUsage> usage;
  for (TagId tag = 0; tag < tags_.size(); ++tag) {
    const TagCounters& counters = tags_[tag];
    if (!counters.seen) continue;
    TagUsage entry;
    entry.tag = tag;
    entry.current_bytes = counters.current_bytes;
    entry.peak_bytes = counters.peak_bytes;
    entry.current_requested_bytes = counters.current_requested_bytes;
    entry.live_blocks = counters.live_blocks;
    entry.total_allocations = counters.total_allocations;
    entry.total_allocated_bytes = counters.total_allocated_bytes;
    usage.push_back(entry);
  }
  return usage;
}

void Engine::ResetTagPeaks() {
  MutexLock lock(&mutex_);
  for (TagCounters& counters : tags_) {
    counters.peak_bytes = counters.current_bytes;
    counters.total_allocations = 0;
    counters.total_allocated_bytes = 0;
  }
}

FragmentationReport Engine::GetFragmentation() const {
  MutexLock lock(&mutex_);
  FragmentationReport report;
  absl::btree_map<StreamId, FreeSpaceStats> by_stream;
  for (const auto& [address, segment] : segments_) {
    FreeSpaceStats& pool_stats =
        segment->pool == PoolKind::kSmall ? report.small_pool : report.large_pool;
    FreeSpaceCounter counters[] = {FreeSpaceCounter(&report.all), FreeSpaceCounter(&pool_stats),
                                   FreeSpaceCounter(&by_stream[segment->stream])};
    std::vector<std::int64_t> extents;
    const bool has_live =
        ForEachFreeExtent(*segment, [&extents](std::int64_t bytes) { extents.push_back(bytes); });
    for (FreeSpaceCounter& counter : counters) {
      counter.AddSegment(static_cast<std::size_t>(HeldBytes(*segment)));
      for (std::int64_t bytes : extents) counter.AddExtent(bytes, has_live);
      for (const Block* block = segment->first; block != nullptr; block = block->next) {
        if (block->state == BlockState::kAllocated) counter.AddAllocated(*block);
        if (block->state == BlockState::kPendingFree) counter.AddPending(*block);
      }
    }
  }
  FreeSpaceCounter(&report.all).Finish();
  FreeSpaceCounter(&report.small_pool).Finish();
  FreeSpaceCounter(&report.large_pool).Finish();
  for (auto& [stream, stats] : by_stream) {
    FreeSpaceCounter(&stats).Finish();
    report.by_stream.emplace_back(stream, std::move(stats));
  }
  return report;
}

SegmentInfo Engine::DescribeSegmentHeader(const Segment& segment) const {
  SegmentInfo info;
  info.address = segment.address;
  info.size = segment.size;
  info.pool = segment.pool;
  info.stream = segment.stream;
  if (segment.owner != nullptr) info.owner = segment.owner->id;
  info.registration = segment.registration;
  info.context = segment.context;
  info.vmm = segment.vmm;
  info.mapped_bytes = static_cast<std::size_t>(HeldBytes(segment));
  return info;
}

SegmentInfo Engine::DescribeSegment(const Segment& segment) const {
  SegmentInfo info = DescribeSegmentHeader(segment);
  for (const Block* block = segment.first; block != nullptr; block = block->next) {
    info.blocks.push_back(DescribeBlock(*block));
  }
  return info;
}

std::vector<SegmentInfo> Engine::GetSegments() const { return GetSegments(kDefaultPool); }

std::vector<SegmentInfo> Engine::GetSegments(PoolId pool) const {
  MutexLock lock(&mutex_);
  std::vector<SegmentInfo> segments;
  segments.reserve(segments_.size());
  for (const auto& [address, segment] : segments_) {
    if (!pool.IsDefault() && (segment->owner == nullptr || !(segment->owner->id == pool))) {
      continue;
    }
    segments.push_back(DescribeSegment(*segment));
  }
  return segments;
}

std::size_t Engine::LargestCachedBlock() const {
  MutexLock lock(&mutex_);
  std::size_t largest = 0;
  for (const auto& [address, segment] : segments_) {
    for (const Block* block = segment->first; block != nullptr; block = block->next) {
      if (segment->vmm && block->next == nullptr) break;  // a range's unmapped tail
      if (block->state == BlockState::kFree) largest = std::max(largest, block->size);
    }
  }
  return largest;
}

std::int64_t Engine::PrivatePoolFreeBytes() const {
  MutexLock lock(&mutex_);
  std::int64_t bytes = 0;
  for (const auto& [address, segment] : segments_) {
    if (segment->owner == nullptr) continue;
    for (const Block* block = segment->first; block != nullptr; block = block->next) {
      if (block->state == BlockState::kFree) bytes += static_cast<std::int64_t>(block->size);
    }
  }
  return bytes;
}

absl::StatusOr<BlockInfo> Engine::GetBlock(const void* ptr) const {
  MutexLock lock(&mutex_);
  const auto address = reinterpret_cast<std::uintptr_t>(ptr);
  auto it = blocks_.find(address);
  if (it == blocks_.end() || it->second->state != BlockState::kAllocated) {
    return absl::NotFoundError(
        absl::StrFormat("torchmem: no allocated block starts at %#x on %s", address, device_name_));
  }
  return DescribeBlock(*it->second);
}

absl::StatusOr<SegmentInfo> Engine::SegmentContaining(const void* ptr) const {
  MutexLock lock(&mutex_);
  const auto address = reinterpret_cast<std::uintptr_t>(ptr);
  auto it = segments_.upper_bound(address);
  if (it != segments_.begin()) {
    const Segment& segment = *std::prev(it)->second;
    if (address < segment.address + segment.size) return DescribeSegmentHeader(segment);
  }
  return absl::NotFoundError(
      absl::StrFormat("torchmem: %#x is in no segment of %s", address, device_name_));
}

std::vector<BlockInfo> Engine::GetAllocatedBlocks() const {
  MutexLock lock(&mutex_);
  std::vector<BlockInfo> blocks;
  for (const auto& [address, block] : blocks_) {
    if (block->state == BlockState::kAllocated) blocks.push_back(DescribeBlock(*block));
  }
  std::sort(blocks.begin(), blocks.end(),
            [](const BlockInfo& a, const BlockInfo& b) { return a.sequence < b.sequence; });
  return blocks;
}

std::int64_t Engine::LargestFreeExtentLocked() const {
  std::int64_t largest = 0;
  for (const auto& [address, segment] : segments_) {
    ForEachFreeExtent(*segment,
                      [&largest](std::int64_t bytes) { largest = std::max(largest, bytes); });
  }
  return largest;
}

std::string Engine::OutOfMemoryMessage(std::size_t size, std::size_t rounded,
                                       const absl::Status& cause) const {
  std::string limit;
  if (memory_limit_ != 0) {
    limit = absl::StrCat(FormatBytes(static_cast<std::int64_t>(memory_limit_)),
                         " (torchmem memory limit)");
  } else if (absl::StatusOr<std::size_t> capacity = backend_->Capacity(); capacity.ok()) {
    limit = absl::StrCat("none set; device capacity ",
                         FormatBytes(static_cast<std::int64_t>(*capacity)));
  } else {
    limit = "none set";
  }
  const std::int64_t reserved = stats_.reserved_bytes.all().current;
  const std::int64_t allocated = stats_.allocated_bytes.all().current;

  std::vector<std::pair<std::int64_t, TagId>> live_tags;
  for (TagId tag = 0; tag < tags_.size(); ++tag) {
    if (tags_[tag].current_bytes > 0) live_tags.emplace_back(tags_[tag].current_bytes, tag);
  }
  std::sort(live_tags.rbegin(), live_tags.rend());
  if (live_tags.size() > 5) live_tags.resize(5);
  std::vector<std::string> top_tags;
  top_tags.reserve(live_tags.size());
  for (auto [bytes, tag] : live_tags) {
    top_tags.push_back(absl::StrFormat("%s %s (%d blocks)", TagRegistry::Name(tag),
                                       FormatBytes(bytes), tags_[tag].live_blocks));
  }
  return absl::StrFormat(
      "torchmem: out of memory on %s: cannot allocate %s (%d bytes requested, %s rounded).\n"
      "  limit: %s\n"
      "  reserved by torchmem: %s in %d segments; allocated: %s; cached free: %s (largest "
      "free block: %s)\n"
      "  top tags by live bytes: %s\n"
      "  cause: %s\n"
      "What to try: drop references to tensors you no longer need (memory held by reference "
      "cycles returns only after gc.collect()); find the holders with torchmem.leak_check() "
      "or torchmem.tag_stats(); raise the limit (torchmem.set_memory_limit) or use smaller "
      "batches.",
      device_name_, FormatBytes(static_cast<std::int64_t>(size)), size,
      FormatBytes(static_cast<std::int64_t>(rounded)), limit, FormatBytes(reserved),
      stats_.segment.all().current, FormatBytes(allocated),
      FormatBytes(reserved - stats_.active_bytes.all().current),
      FormatBytes(LargestFreeExtentLocked()),
      top_tags.empty() ? "(none)" : absl::StrJoin(top_tags, ", "), cause.message());
}

}  // namespace torchmem
