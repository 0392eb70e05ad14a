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
// Invariants checked by Validate(): all sizes are positive multiples of
// min_block_size; small_size < small_segment_size; large_rounding divides
// large_segment_size.
#ifndef TORCHMEM_CORE_SIZE_POLICY_H_
#define TORCHMEM_CORE_SIZE_POLICY_H_

#include <cstddef>

#include "absl/status/status.h"
#include "torchmem/core/types.h"

namespace torchmem {

inline constexpr std::size_t kKiB = 1024;
inline constexpr std::size_t kMiB = 1024 * kKiB;
inline constexpr std::size_t kGiB = 1024 * kMiB;

struct SizePolicy {
  std::size_t min_block_size = 512;              // rounding unit and smallest block
  std::size_t small_size = 1 * kMiB;             // largest request served by the small pool
  std::size_t small_segment_size = 2 * kMiB;     // segment size of the small pool
  std::size_t min_large_alloc = 10 * kMiB;       // requests below this share large segments
  std::size_t large_segment_size = 20 * kMiB;    // shared segment size of the large pool
  std::size_t large_rounding = 2 * kMiB;         // rounding of dedicated large segments

  // The policy of PyTorch's native caching allocator (the default).
  static SizePolicy PyTorchDefault() { return SizePolicy{}; }

  absl::Status Validate() const;

  // Rounded block size for a request of `size` bytes (size > 0).
  std::size_t RoundSize(std::size_t size) const {
    if (size < min_block_size) return min_block_size;
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
    return pool == PoolKind::kSmall ? remaining >= min_block_size : remaining > small_size;
  }
};

}  // namespace torchmem

#endif  // TORCHMEM_CORE_SIZE_POLICY_H_
