// Backend: where an engine gets its segments and its events.
//
// The interface is shaped after the CUDA runtime the CUDA backend wraps
// (cudaMalloc/cudaFree, cudaEventRecord/cudaEventQuery/cudaEventSynchronize,
// cudaMemGetInfo, stream capture), and the host backend implements the same
// calls over host memory.
//
// Contract:
//   - The engine calls a backend only while holding its own lock, so one
//     backend instance never sees concurrent calls from its engine. A backend
//     must never call back into the engine.
//   - AllocateSegment returns absl::ResourceExhaustedError when the device is
//     out of memory (the engine then frees cached memory and retries); any
//     other error is a device fault and is reported as is.
//   - RecordEvent returns an event that completes once all work queued on
//     `stream` at the time of the call has finished. Events are owned by the
//     backend (it may pool them); the engine hands each back with ReleaseEvent.
//   - Virtual memory is optional (the driver's cuMemAddressReserve / cuMemCreate
//     / cuMemMap / cuMemSetAccess / cuMemUnmap / cuMemRelease): a backend that
//     has it returns its page size (cuMemGetAllocationGranularity) from
//     VirtualMemoryPageSize, and the engine may then place blocks in address
//     ranges it reserves once and map physical pages (each a multiple of that
//     size: 2 MiB in the small pool, 20 MiB in the large one, as PyTorch's
//     expandable segments) where live blocks need them (see vmm_space.h). Physical pages count
//     against the device's capacity like segments; address ranges cost none.
#ifndef TORCHMEM_CORE_BACKEND_H_
#define TORCHMEM_CORE_BACKEND_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "torchmem/core/types.h"

namespace torchmem {

class Backend {
 public:
  virtual ~Backend() = default;

  // Names the device in messages, e.g. "cpu" or "cuda:0".
  virtual std::string DeviceName() const = 0;

  // Obtains a region of exactly `size` bytes, aligned to at least 512 bytes,
  // for use on `stream`.
  virtual absl::StatusOr<std::uintptr_t> AllocateSegment(std::size_t size, StreamId stream) = 0;

  // Returns a region obtained from AllocateSegment. On error the region is
  // still owned by the engine.
  virtual absl::Status ReleaseSegment(std::uintptr_t address, std::size_t size) = 0;

  // Total bytes of the device, for limits given as a fraction.
  virtual absl::StatusOr<std::size_t> Capacity() = 0;

  // Bytes the device has free now (for out-of-memory reports).
  virtual absl::StatusOr<std::size_t> FreeBytes() {
    return absl::UnimplementedError("this backend does not report free device memory");
  }

  // Says why no new segment may be obtained for `stream` right now (e.g. a
  // CUDA graph is being captured on it), or OK.
  virtual absl::Status CheckSegmentAllocationAllowed(StreamId stream) {
    (void)stream;
    return absl::OkStatus();
  }

  // --- Virtual memory (optional) ---------------------------------------------
  // The page size (a power of two) if this backend can reserve address ranges
  // and map physical pages into them; Unimplemented if it cannot.
  virtual absl::StatusOr<std::size_t> VirtualMemoryPageSize() {
    return absl::UnimplementedError(NoVirtualMemory());
  }
  // Reserves `size` bytes (a multiple of the page size) of address space, with
  // nothing mapped in it.
  virtual absl::StatusOr<std::uintptr_t> ReserveAddressRange(std::size_t size) {
    (void)size;
    return absl::UnimplementedError(NoVirtualMemory());
  }
  // Gives back a range from ReserveAddressRange; nothing may be mapped in it.
  virtual absl::Status ReleaseAddressRange(std::uintptr_t address, std::size_t size) {
    (void)address, (void)size;
    return absl::UnimplementedError(NoVirtualMemory());
  }
  // Creates one page of `size` bytes of physical memory (a multiple of the
  // page size; ResourceExhausted if the device is full).
  virtual absl::StatusOr<PhysicalPage> CreatePhysicalPage(std::size_t size) {
    (void)size;
    return absl::UnimplementedError(NoVirtualMemory());
  }
  // Frees a page from CreatePhysicalPage that is mapped nowhere.
  virtual absl::Status ReleasePhysicalPage(PhysicalPage page) {
    (void)page;
    return absl::UnimplementedError(NoVirtualMemory());
  }
  // Maps `page`, of `size` bytes (as created), at `address` (page-aligned,
  // inside a reserved range, nothing mapped there yet). Not accessible until
  // SetAccess covers it.
  virtual absl::Status MapPage(std::uintptr_t address, PhysicalPage page, std::size_t size) {
    (void)address, (void)page, (void)size;
    return absl::UnimplementedError(NoVirtualMemory());
  }
  // Makes the mapped pages of [address, address + size) readable and
  // writable by the device.
  virtual absl::Status SetAccess(std::uintptr_t address, std::size_t size) {
    (void)address, (void)size;
    return absl::UnimplementedError(NoVirtualMemory());
  }
  // Unmaps the pages of [address, address + size) (all mapped), once the
  // work queued on `stream` (which last used them) has finished: unlike a
  // segment's release, unmapping does not wait for the device by itself.
  // The pages stay allocated (ReleasePhysicalPage frees them).
  virtual absl::Status UnmapPages(std::uintptr_t address, std::size_t size, StreamId stream) {
    (void)address, (void)size, (void)stream;
    return absl::UnimplementedError(NoVirtualMemory());
  }

  virtual absl::StatusOr<EventId> RecordEvent(StreamId stream) = 0;
  // True once the event completed.
  virtual absl::StatusOr<bool> QueryEvent(EventId event) = 0;
  // Blocks until the event completed.
  virtual absl::Status SynchronizeEvent(EventId event) = 0;
  virtual void ReleaseEvent(EventId event) = 0;

 private:
  std::string NoVirtualMemory() const {
    return "the " + DeviceName() + " backend has no virtual memory API (expandable segments)";
  }
};

}  // namespace torchmem

#endif  // TORCHMEM_CORE_BACKEND_H_
