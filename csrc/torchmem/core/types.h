// Small value types shared by every part of the engine.
//
// They are plain integers on purpose: the engine stamps them on every block
// and copies them into reports, so they must be cheap to store and compare.
// None of them owns anything.
#ifndef TORCHMEM_CORE_TYPES_H_
#define TORCHMEM_CORE_TYPES_H_

#include <cstddef>
#include <cstdint>
#include <utility>

namespace torchmem {

// A backend's stream handle, e.g. the value of a `cudaStream_t`.
// 0 is the default stream; the host backend has only stream 0.
using StreamId = std::uintptr_t;

// An event handed out by a backend (e.g. a pooled `cudaEvent_t`).
using EventId = std::uintptr_t;

// A backend's handle of one physical page of virtual memory (CUDA's
// CUmemGenericAllocationHandle).
using PhysicalPage = std::uint64_t;

// Interned tag name (see TagRegistry). kNoTag is "untagged".
using TagId = std::uint32_t;
inline constexpr TagId kNoTag = 0;

// A leak-check scope. Ids are process-wide and never reused. kNoScope means
// the allocation was made outside every scope.
using ScopeId = std::uint64_t;
inline constexpr ScopeId kNoScope = 0;

// Opaque id of a captured allocation context (e.g. an interned Python stack),
// produced by the capture hook. kNoContext means nothing was captured.
using ContextId = std::uint64_t;
inline constexpr ContextId kNoContext = 0;

// A private memory pool (a CUDA graph's, a torch.cuda.MemPool's): PyTorch's
// MempoolId_t pair, kept torch-free. {0, 0} is the default (shared) pool.
struct PoolId {
  std::uint64_t first = 0;
  std::uint64_t second = 0;

  bool IsDefault() const { return first == 0 && second == 0; }
  friend bool operator==(const PoolId& a, const PoolId& b) {
    return a.first == b.first && a.second == b.second;
  }
  template <typename H>
  friend H AbslHashValue(H h, const PoolId& id) {
    return H::combine(std::move(h), id.first, id.second);
  }
};
inline constexpr PoolId kDefaultPool{};

// PyTorch's two block pools: requests up to 1 MiB come from small segments.
enum class PoolKind : std::uint8_t { kSmall = 0, kLarge = 1 };
inline constexpr int kNumPools = 2;

inline const char* PoolName(PoolKind pool) {
  return pool == PoolKind::kSmall ? "small_pool" : "large_pool";
}

}  // namespace torchmem

#endif  // TORCHMEM_CORE_TYPES_H_
