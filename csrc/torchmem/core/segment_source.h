// SegmentSource: where a private pool with an allocator of its own gets its
// segments (PyTorch's MemPool(allocator=...): NCCL's ncclMemAlloc pools,
// CuMemAllocator-style pools), in place of the engine's backend. The engine
// still places, splits, caches and accounts the blocks in those segments as
// in any pool; only obtaining and returning a segment goes to the source.
//
// Contract: as Backend::AllocateSegment / ReleaseSegment (called under the
// engine's lock, never calling back into the engine); ResourceExhausted
// when the source has no memory for the request.
#ifndef TORCHMEM_CORE_SEGMENT_SOURCE_H_
#define TORCHMEM_CORE_SEGMENT_SOURCE_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "torchmem/core/types.h"

namespace torchmem {

class SegmentSource {
 public:
  virtual ~SegmentSource() = default;
  virtual absl::StatusOr<std::uintptr_t> AllocateSegment(std::size_t size, StreamId stream) = 0;
  virtual absl::Status ReleaseSegment(std::uintptr_t address, std::size_t size) = 0;
};

}  // namespace torchmem

#endif  // TORCHMEM_CORE_SEGMENT_SOURCE_H_
