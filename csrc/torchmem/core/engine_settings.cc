// Engine: the settings a running engine accepts (memory limit and fraction,
// size policy, garbage collection threshold).
#include <algorithm>

#include "absl/strings/str_format.h"
#include "torchmem/core/engine.h"

namespace torchmem {

void Engine::SetMemoryLimit(std::size_t bytes) {
  MutexLock lock(&mutex_);
  memory_limit_ = bytes;
}

absl::Status Engine::SetMemoryFraction(double fraction) {
  if (!(fraction > 0.0 && fraction <= 1.0)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("torchmem: memory fraction must be in (0, 1], got %g", fraction));
  }
  MutexLock lock(&mutex_);
  absl::StatusOr<std::size_t> capacity = backend_->Capacity();
  if (!capacity.ok()) return capacity.status();
  // A fraction always sets a limit: at least one byte (0 would mean "no
  // limit"), at most the capacity (the product may round up to 2^64, which
  // does not convert to size_t).
  const double bytes = fraction * static_cast<double>(*capacity);
  const std::size_t limit =
      bytes >= static_cast<double>(*capacity) ? *capacity : static_cast<std::size_t>(bytes);
  memory_limit_ = std::max<std::size_t>(limit, 1);
  return absl::OkStatus();
}

std::size_t Engine::memory_limit() const {
  MutexLock lock(&mutex_);
  return memory_limit_;
}

absl::Status Engine::SetSizePolicy(SizePolicy policy) {
  if (absl::Status valid = policy.Validate(); !valid.ok()) return valid;
  MutexLock lock(&mutex_);
  if (policy.min_block_size != policy_.min_block_size) {
    return absl::InvalidArgumentError(
        "torchmem: the rounding unit (min_block_size) of a live engine cannot change");
  }
  policy.Refresh();
  policy_ = policy;
  stats_.max_split_size =
      policy_.HasMaxSplit() ? static_cast<std::int64_t>(policy_.max_split_size) : -1;
  return absl::OkStatus();
}

void Engine::SetGarbageCollectionThreshold(double fraction) {
  MutexLock lock(&mutex_);
  gc_threshold_ = fraction;
}

SizePolicy Engine::policy() const {
  MutexLock lock(&mutex_);
  return policy_;
}

}  // namespace torchmem
