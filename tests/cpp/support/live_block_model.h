// Test support: checks an engine against a test's own model of its live
// blocks, for the harnesses that drive an engine through long operation
// sequences (fault injection on each backend, the fuzzer).
#ifndef TORCHMEM_TESTS_CPP_SUPPORT_LIVE_BLOCK_MODEL_H_
#define TORCHMEM_TESTS_CPP_SUPPORT_LIVE_BLOCK_MODEL_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "torchmem/core/engine.h"

namespace torchmem::testing {

// The pool is intact (Engine::CheckInvariants) and the engine's current
// statistics agree with `live` (address -> a value with the block's `size` as
// handed out and its `requested` size): allocated bytes, the allocation
// count, and active and requested bytes covering at least the allocated
// ones (blocks freed but still in use on other streams count in both until
// they become free, as in PyTorch).
// Returns the first disagreement.
template <typename LiveMap>
absl::Status CheckEngineMatchesLiveBlocks(const Engine& engine, const LiveMap& live) {
  if (absl::Status invariants = engine.CheckInvariants(); !invariants.ok()) return invariants;
  std::int64_t allocated = 0;
  std::int64_t requested = 0;
  for (const auto& [address, block] : live) {
    allocated += static_cast<std::int64_t>(block.size);
    requested += static_cast<std::int64_t>(block.requested);
  }
  const MemoryStats stats = engine.GetStats();
  const auto disagree = [](const char* what, std::int64_t engine_value, std::int64_t model) {
    return absl::InternalError(
        absl::StrCat(what, ": the engine says ", engine_value, ", the model ", model));
  };
  if (stats.allocated_bytes.all().current != allocated) {
    return disagree("allocated_bytes", stats.allocated_bytes.all().current, allocated);
  }
  if (stats.requested_bytes.all().current < requested) {
    return disagree("requested_bytes (at least the live blocks')",
                    stats.requested_bytes.all().current, requested);
  }
  const auto count = static_cast<std::int64_t>(live.size());
  if (stats.allocation.all().current != count) {
    return disagree("allocation count", stats.allocation.all().current, count);
  }
  if (stats.active_bytes.all().current < allocated) {
    return disagree("active_bytes (at least allocated)", stats.active_bytes.all().current,
                    allocated);
  }
  return absl::OkStatus();
}

}  // namespace torchmem::testing

#endif  // TORCHMEM_TESTS_CPP_SUPPORT_LIVE_BLOCK_MODEL_H_
