// Memory statistics with PyTorch's vocabulary and meaning.
//
// Mirrors c10::CachingDeviceAllocator::DeviceStats so that
// torchmem.memory_stats() has the keys of torch.cuda.memory_stats():
//   <name>.<all|small_pool|large_pool>.<current|peak|allocated|freed>
// for allocation, segment, active, inactive_split, allocated_bytes,
// reserved_bytes, active_bytes, inactive_split_bytes, requested_bytes, plus
// oversize_* and the scalar counters.
//
// Meanings (torch/cuda/memory.py):
//   allocation / allocated_bytes: blocks handed out and not yet freed (rounded sizes)
//   requested_bytes: the sizes callers asked for, before rounding
//   active / active_bytes: allocated, or freed but waiting on other streams' events
//   inactive_split / inactive_split_bytes: free blocks inside segments that
//     are split into several blocks (cannot be released as is)
//   segment / reserved_bytes: segments obtained from the backend
// current is the live value, peak its maximum since the last reset,
// allocated/freed the sums of increases/decreases since the last reset.
#ifndef TORCHMEM_CORE_STATS_H_
#define TORCHMEM_CORE_STATS_H_

#include <algorithm>
#include <array>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/btree_map.h"
#include "torchmem/core/types.h"

namespace torchmem {

struct Stat {
  std::int64_t current = 0;
  std::int64_t peak = 0;
  std::int64_t allocated = 0;
  std::int64_t freed = 0;

  void Increase(std::int64_t amount) {
    current += amount;
    allocated = WrappingAdd(allocated, amount);
    peak = std::max(peak, current);
  }
  void Decrease(std::int64_t amount) {
    current -= amount;
    freed = WrappingAdd(freed, amount);
  }
  // The running totals only grow; after exabytes of churn they wrap around
  // (as unsigned counters do) instead of overflowing, which would be
  // undefined behaviour. `current` stays bounded by the device's memory.
  static std::int64_t WrappingAdd(std::int64_t total, std::int64_t amount) {
    return static_cast<std::int64_t>(static_cast<std::uint64_t>(total) +
                                     static_cast<std::uint64_t>(amount));
  }
  void ResetPeak() { peak = current; }
  void ResetAccumulated() { allocated = freed = 0; }
};

// One Stat per pool, and the aggregate over pools (PyTorch's StatType
// AGGREGATE). The aggregate's current, allocated and freed are sums, so only
// its peak is kept up to date: every update on the allocation hot path
// touches one pool's counters and one max, not two full Stats.
struct StatArray {
  std::array<Stat, kNumPools> pools;
  std::int64_t all_peak = 0;

  Stat& pool(PoolKind p) { return pools[static_cast<int>(p)]; }
  const Stat& pool(PoolKind p) const { return pools[static_cast<int>(p)]; }
  Stat all() const {
    Stat sum;
    for (const Stat& s : pools) {
      sum.current += s.current;
      sum.allocated = Stat::WrappingAdd(sum.allocated, s.allocated);
      sum.freed = Stat::WrappingAdd(sum.freed, s.freed);
    }
    sum.peak = all_peak;
    return sum;
  }

  void Increase(PoolKind p, std::int64_t amount) {
    pool(p).Increase(amount);
    all_peak = std::max(all_peak, pools[0].current + pools[1].current);
  }
  void Decrease(PoolKind p, std::int64_t amount) { pool(p).Decrease(amount); }
  void ResetPeak() {
    for (Stat& s : pools) s.ResetPeak();
    all_peak = pools[0].current + pools[1].current;
  }
  void ResetAccumulated() {
    for (Stat& s : pools) s.ResetAccumulated();
  }
};

struct MemoryStats {
  StatArray allocation;
  StatArray segment;
  StatArray active;
  StatArray inactive_split;
  StatArray allocated_bytes;
  StatArray reserved_bytes;
  StatArray active_bytes;
  StatArray inactive_split_bytes;
  StatArray requested_bytes;
  // Blocks and segments of at least max_split_size (PyTorch's
  // max_split_size_mb); none unless it is configured.
  Stat oversize_allocations;
  Stat oversize_segments;
  // reserved_bytes of each private pool (CUDA graphs, MemPools), by pool;
  // a released pool keeps its entry (current 0) until the next reset.
  absl::btree_map<std::pair<std::uint64_t, std::uint64_t>, StatArray>
      reserved_bytes_by_private_pools;

  std::int64_t num_alloc_retries = 0;
  std::int64_t num_ooms = 0;
  std::int64_t num_sync_all_streams = 0;
  std::int64_t num_device_alloc = 0;
  std::int64_t num_device_free = 0;
  // Allocations refused before asking the device (PyTorch's
  // throw_on_cudamalloc_oom, which torchmem does not implement): always 0.
  std::int64_t num_oom_rejections = 0;
  // PyTorch reports SIZE_MAX ("no limit") as -1.
  std::int64_t max_split_size = -1;

  // Virtual-memory placement (expandable segments; all 0 unless the engine
  // placed blocks that way). reserved_bytes then counts the physical pages
  // mapped (what it means in PyTorch with expandable segments); address
  // space reserved for the ranges costs no memory and is counted here.
  struct Vmm {
    std::int64_t page_size = 0;               // the small pool's pages
    std::int64_t large_page_size = 0;         // the large pool's pages
    std::int64_t reserved_address_bytes = 0;  // ranges reserved now
    std::int64_t mapped_bytes = 0;            // = reserved_bytes of the ranges
    std::int64_t touched_bytes = 0;           // pages live blocks overlap
    std::int64_t cached_bytes = 0;            // mapped, touched by no live block
    std::int64_t peak_mapped_bytes = 0;
    std::int64_t reserves = 0;  // backend calls since creation
    std::int64_t address_releases = 0;
    std::int64_t creates = 0;
    std::int64_t releases = 0;
    std::int64_t maps = 0;
    std::int64_t set_access = 0;
    std::int64_t unmaps = 0;
    std::int64_t steals = 0;
    std::int64_t lost_pages = 0;
    std::int64_t lost_bytes = 0;  // their bytes (pages of either size)
    // Virtual memory is in use (the placement, a reserved range, a lost page):
    // only then do the vmm.* keys appear, so that they stay PyTorch's otherwise.
    bool in_use = false;
  } vmm;

  void ResetPeaks();
  void ResetAccumulated();

  // Flat ("allocated_bytes.all.current" -> value) view, the format of
  // torch.cuda.memory_stats().
  std::vector<std::pair<std::string, std::int64_t>> Flatten() const;
};

}  // namespace torchmem

#endif  // TORCHMEM_CORE_STATS_H_
