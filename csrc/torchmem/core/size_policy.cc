#include "torchmem/core/size_policy.h"

#include <bit>

#include "absl/strings/str_format.h"

namespace torchmem {

absl::Status SizePolicy::Validate() const {
  if (min_block_size == 0 || (min_block_size & (min_block_size - 1)) != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "size policy: min_block_size must be a power of two, got %d", min_block_size));
  }
  for (std::size_t value :
       {small_size, small_segment_size, min_large_alloc, large_segment_size, large_rounding}) {
    if (value == 0 || value % min_block_size != 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "size policy: every size must be a positive multiple of min_block_size (%d), got %d",
          min_block_size, value));
    }
  }
  if (small_size >= small_segment_size) {
    return absl::InvalidArgumentError(
        absl::StrFormat("size policy: small_size (%d) must be below small_segment_size (%d)",
                        small_size, small_segment_size));
  }
  if (min_large_alloc > large_segment_size || min_large_alloc <= small_size) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "size policy: need small_size (%d) < min_large_alloc (%d) <= large_segment_size (%d)",
        small_size, min_large_alloc, large_segment_size));
  }
  if (large_segment_size % large_rounding != 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("size policy: large_rounding (%d) must divide large_segment_size (%d)",
                        large_rounding, large_segment_size));
  }
  for (std::size_t divisions : roundup_power2_divisions) {
    if (divisions > 1 && !std::has_single_bit(divisions)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "size policy: roundup_power2_divisions must be powers of two, got %d", divisions));
    }
  }
  // PyTorch's floor for max_split_size_mb (its kLargeBuffer; torch 2.9's
  // parser wants more, 2.10 and later accept it exactly), whatever the
  // shared segment size: at 20 MiB a fresh shared segment is oversize, yet
  // split for the medium request that made it (the request decides), and
  // once whole again serves only oversize requests, as in PyTorch.
  if (max_split_size < kMinMaxSplitSize) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "size policy: max_split_size must be at least %d (20 MiB, PyTorch's minimum), got %d",
        kMinMaxSplitSize, max_split_size));
  }
  return absl::OkStatus();
}

}  // namespace torchmem
