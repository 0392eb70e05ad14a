#include "torchmem/core/stats.h"

#include "absl/strings/str_cat.h"

namespace torchmem {
namespace {

// The stat arrays in the order PyTorch's emitter lists them.
template <typename Stats, typename Fn>
void ForEachArray(Stats& stats, Fn fn) {
  fn("allocation", stats.allocation);
  fn("segment", stats.segment);
  fn("active", stats.active);
  fn("inactive_split", stats.inactive_split);
  fn("allocated_bytes", stats.allocated_bytes);
  fn("reserved_bytes", stats.reserved_bytes);
  fn("active_bytes", stats.active_bytes);
  fn("inactive_split_bytes", stats.inactive_split_bytes);
  fn("requested_bytes", stats.requested_bytes);
}

void AppendStat(const std::string& prefix, const Stat& stat,
                std::vector<std::pair<std::string, std::int64_t>>& out) {
  out.emplace_back(absl::StrCat(prefix, ".current"), stat.current);
  out.emplace_back(absl::StrCat(prefix, ".peak"), stat.peak);
  out.emplace_back(absl::StrCat(prefix, ".allocated"), stat.allocated);
  out.emplace_back(absl::StrCat(prefix, ".freed"), stat.freed);
}

}  // namespace

void MemoryStats::ResetPeaks() {
  ForEachArray(*this, [](const char*, StatArray& array) { array.ResetPeak(); });
  for (auto& [pool, array] : reserved_bytes_by_private_pools) array.ResetPeak();
  oversize_allocations.ResetPeak();
  oversize_segments.ResetPeak();
}

void MemoryStats::ResetAccumulated() {
  ForEachArray(*this, [](const char*, StatArray& array) { array.ResetAccumulated(); });
  for (auto& [pool, array] : reserved_bytes_by_private_pools) array.ResetAccumulated();
  oversize_allocations.ResetAccumulated();
  oversize_segments.ResetAccumulated();
  num_alloc_retries = 0;
  num_ooms = 0;
  num_sync_all_streams = 0;
  num_device_alloc = 0;
  num_device_free = 0;
}

std::vector<std::pair<std::string, std::int64_t>> MemoryStats::Flatten() const {
  std::vector<std::pair<std::string, std::int64_t>> out;
  ForEachArray(*this, [&out](const char* name, const StatArray& array) {
    AppendStat(absl::StrCat(name, ".all"), array.all(), out);
    AppendStat(absl::StrCat(name, ".small_pool"), array.pool(PoolKind::kSmall), out);
    AppendStat(absl::StrCat(name, ".large_pool"), array.pool(PoolKind::kLarge), out);
  });
  // PyTorch names a private pool "<first>_<second>" in these keys.
  for (const auto& [pool, array] : reserved_bytes_by_private_pools) {
    const std::string prefix =
        absl::StrCat("reserved_bytes_by_private_pools.", pool.first, "_", pool.second);
    AppendStat(absl::StrCat(prefix, ".all"), array.all(), out);
    AppendStat(absl::StrCat(prefix, ".small_pool"), array.pool(PoolKind::kSmall), out);
    AppendStat(absl::StrCat(prefix, ".large_pool"), array.pool(PoolKind::kLarge), out);
  }
  AppendStat("oversize_allocations", oversize_allocations, out);
  AppendStat("oversize_segments", oversize_segments, out);
  out.emplace_back("num_alloc_retries", num_alloc_retries);
  out.emplace_back("num_ooms", num_ooms);
  out.emplace_back("num_sync_all_streams", num_sync_all_streams);
  out.emplace_back("num_device_alloc", num_device_alloc);
  out.emplace_back("num_device_free", num_device_free);
  out.emplace_back("num_oom_rejections", num_oom_rejections);
  out.emplace_back("max_split_size", max_split_size);
  if (vmm.in_use) {
    for (const auto& [name, value] :
         {std::pair{"page_size", vmm.page_size}, std::pair{"large_page_size", vmm.large_page_size},
          std::pair{"reserved_address_bytes", vmm.reserved_address_bytes},
          std::pair{"mapped_bytes", vmm.mapped_bytes},
          std::pair{"touched_bytes", vmm.touched_bytes},
          std::pair{"cached_bytes", vmm.cached_bytes},
          std::pair{"peak_mapped_bytes", vmm.peak_mapped_bytes},
          std::pair{"num_reserve", vmm.reserves},
          std::pair{"num_address_release", vmm.address_releases},
          std::pair{"num_create", vmm.creates}, std::pair{"num_release", vmm.releases},
          std::pair{"num_map", vmm.maps}, std::pair{"num_set_access", vmm.set_access},
          std::pair{"num_unmap", vmm.unmaps}, std::pair{"num_steal", vmm.steals},
          std::pair{"num_lost_pages", vmm.lost_pages}, std::pair{"lost_bytes", vmm.lost_bytes}}) {
      out.emplace_back(absl::StrCat("vmm.", name), value);
    }
  }
  return out;
}

}  // namespace torchmem
