// SizePolicy: every size decision the engine makes, in one place.
//
// The defaults equal PyTorch's CUDA caching allocator
// (c10/cuda/CUDACachingAllocator.cpp: kMinBlockSize, kSmallSize, kSmallBuffer,
// kMinLargeAlloc, kLargeBuffer, kRoundLarge) so that fragmentation figures
// compare fairly with PyTorch's native allocator:
//   - requests round up to a multiple of 512 B (at least 512 B);
//   - rounded sizes up to 1 MiB are "small" and come from 2 MiB segments;
//   - larger sizes below 10 MiB come from 20 MiB segments;
//   - 10 MiB and more get their own segment, rounded up to 2 MiB.
// A free block is split when the remainder is worth keeping: at least one
// minimum block in the small pool, more than the small-size limit in the large
// pool (so large segments never fill up with small slivers).
//
// The knobs of PYTORCH_CUDA_ALLOC_CONF that shape sizes live here too, with
// PyTorch's meanings (the torch glue copies PyTorch's parsed values in):
//   - max_split_size: blocks of at least this size are "oversize": never
//     split, and a cached oversize block serves a request only if the request
//     is oversize too and the block is less than max_non_split_rounding
//     larger (max_split_size_mb, max_non_split_rounding_mb);
//   - roundup_power2_divisions: per power-of-two size interval (1 MiB, 2 MiB,
//     ... 32 GiB and above), round requests up to one of that many equal
//     divisions of the interval instead of to 512 B (0 or 1: off);
//   - large_segment_size: the shared segment size for 1-10 MiB requests.
//
// Invariants checked by Validate(): all sizes are positive multiples of
// min_block_size; small_size < small_segment_size; large_rounding divides
// large_segment_size; divisions are 0 or powers of two; max_split_size is at
// least 20 MiB (PyTorch's minimum).
#ifndef TORCHMEM_CORE_SIZE_POLICY_H_
#define TORCHMEM_CORE_SIZE_POLICY_H_

#include <array>
#include <bit>
#include <cstddef>
#include <limits>

#include "absl/status/status.h"
#include "torchmem/core/types.h"

namespace torchmem {

inline constexpr std::size_t kKiB = 1024;
inline constexpr std::size_t kMiB = 1024 * kKiB;
inline constexpr std::size_t kGiB = 1024 * kMiB;

struct SizePolicy {
  // Power-of-two intervals of roundup_power2_divisions: [1 MiB, 2 MiB) is 0
  // (and everything below), ..., [32 GiB, ...) is 15; PyTorch's layout.
  static constexpr int kRoundupIntervals = 16;
  static constexpr int kRoundupFirstIntervalLog2 = 20;
  static constexpr std::size_t kNoMaxSplit = std::numeric_limits<std::size_t>::max();
  // The smallest max_split_size PyTorch accepts (max_split_size_mb >= 20).
  static constexpr std::size_t kMinMaxSplitSize = 20 * kMiB;

  std::size_t min_block_size = 512;                // rounding unit and smallest block
  std::size_t small_size = 1 * kMiB;               // largest request served by the small pool
  std::size_t small_segment_size = 2 * kMiB;       // segment size of the small pool
  std::size_t min_large_alloc = 10 * kMiB;         // requests below this share large segments
  std::size_t large_segment_size = 20 * kMiB;      // shared segment size of the large pool
  std::size_t large_rounding = 2 * kMiB;           // rounding of dedicated large segments
  std::size_t max_split_size = kNoMaxSplit;        // oversize threshold; kNoMaxSplit: none
  std::size_t max_non_split_rounding = 20 * kMiB;  // how much bigger an oversize block may be
  // Physical page (handle) size of the large pool's virtual-memory ranges,
  // rounded up to the device's page: PyTorch's expandable segments map
  // kLargeBuffer handles in the large pool (the small pool maps the device's
  // page). Larger pages cost fewer cuMemCreate/cuMemMap calls and coarser
  // mappings. Read when the engine first uses virtual memory.
  std::size_t vmm_large_page_size = 20 * kMiB;
  std::array<std::size_t, kRoundupIntervals> roundup_power2_divisions{};

  // The policy of PyTorch's native caching allocator (the default).
  static SizePolicy PyTorchDefault() { return SizePolicy{}; }

  absl::Status Validate() const;

  bool HasPower2Rounding() const {
    for (std::size_t d : roundup_power2_divisions) {
      if (d > 1) return true;
    }
    return false;
  }
  bool HasMaxSplit() const { return max_split_size != kNoMaxSplit; }

  // Rounded block size for a request of `size` bytes (size > 0).
  std::size_t RoundSize(std::size_t size) const {
    if (size < min_block_size) return min_block_size;
    if (has_power2_rounding_) [[unlikely]] {
      const std::size_t divisions = DivisionsFor(size);
      if (divisions > 1 && size > min_block_size * divisions) {
        return RoundUpToPower2Division(size, divisions);
      }
    }
    return (size + min_block_size - 1) / min_block_size * min_block_size;
  }

  // Pool serving a rounded size.
  PoolKind PoolFor(std::size_t rounded_size) const {
    return rounded_size <= small_size ? PoolKind::kSmall : PoolKind::kLarge;
  }

  // Size of a new segment obtained from the backend for a rounded size.
  std::size_t SegmentSizeFor(std::size_t rounded_size) const {
    if (rounded_size <= small_size) return small_segment_size;
    if (rounded_size < min_large_alloc) return large_segment_size;
    return (rounded_size + large_rounding - 1) / large_rounding * large_rounding;
  }

  // Whether a free block of `block_size` serving `rounded_size` in `pool`
  // is split, leaving the remainder free.
  bool ShouldSplit(PoolKind pool, std::size_t block_size, std::size_t rounded_size) const {
    const std::size_t remaining = block_size - rounded_size;
    return pool == PoolKind::kSmall ? remaining >= min_block_size
                                    : rounded_size < max_split_size && remaining > small_size;
  }

  bool IsOversize(std::size_t size) const { return size >= max_split_size; }

  // Whether the best-fitting cached block of `block_size` may serve a
  // request of `rounded_size` (PyTorch's two oversize rules).
  bool MayServe(std::size_t block_size, std::size_t rounded_size) const {
    if (rounded_size < max_split_size) return block_size < max_split_size;
    return block_size < rounded_size + max_non_split_rounding;
  }

  // Divisions configured for the interval of `size`.
  std::size_t DivisionsFor(std::size_t size) const {
    const int log_size = static_cast<int>(std::bit_width(size)) - 1;
    int index = log_size > kRoundupFirstIntervalLog2 ? log_size - kRoundupFirstIntervalLog2 : 0;
    if (index >= kRoundupIntervals) index = kRoundupIntervals - 1;
    return roundup_power2_divisions[index];
  }

  // Recomputes the cached fast-path flag after roundup_power2_divisions
  // changed; the engine calls it on every policy it adopts.
  void Refresh() { has_power2_rounding_ = HasPower2Rounding(); }

 private:
  // `size` rounded up to the next of `divisions` equal steps between the
  // powers of two around it (a power of two stays as is).
  static std::size_t RoundUpToPower2Division(std::size_t size, std::size_t divisions) {
    if (std::has_single_bit(size)) return size;
    const std::size_t floor = std::bit_floor(size);
    const std::size_t step = floor >> (std::bit_width(divisions) - 1);
    if (step == 0) return floor << 1;
    const std::size_t rounded_down = size & ~(step - 1);
    return rounded_down == size ? size : rounded_down + step;
  }

  bool has_power2_rounding_ = false;
};

}  // namespace torchmem

#endif  // TORCHMEM_CORE_SIZE_POLICY_H_
