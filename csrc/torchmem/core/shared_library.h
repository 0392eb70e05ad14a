// The interface fingerprint of libtorchmem.so, the shared library holding
// the engine that torchmem._C and torchmem._C_cuda share (see
// cmake/shared_library.cmake).
//
// Each module compares the fingerprint it was compiled with against the one
// the loaded library reports when it is imported, so a stale library left
// in the package after a partial rebuild fails with a clear error instead
// of corrupting memory. The fingerprint covers an explicit version (bump
// kSharedLibraryAbiVersion when a signature changes incompatibly) and the
// sizes of the types that cross the boundary by value or by layout.
#ifndef TORCHMEM_CORE_SHARED_LIBRARY_H_
#define TORCHMEM_CORE_SHARED_LIBRARY_H_

#include <cstdint>

#include "torchmem/core/engine.h"
#include "torchmem/core/reports.h"
#include "torchmem/core/stats.h"

namespace torchmem {

inline constexpr std::uint64_t kSharedLibraryAbiVersion = 1;

inline constexpr std::uint64_t CompiledInterfaceFingerprint() {
  std::uint64_t h = kSharedLibraryAbiVersion;
  for (std::uint64_t size : {sizeof(Engine), sizeof(EngineOptions), sizeof(MemoryStats),
                             sizeof(BlockInfo), sizeof(SegmentInfo), sizeof(TraceEntry)}) {
    h = h * 1000003u ^ size;
  }
  return h;
}

// CompiledInterfaceFingerprint() as compiled into the loaded libtorchmem.so.
std::uint64_t SharedLibraryFingerprint();

}  // namespace torchmem

#endif  // TORCHMEM_CORE_SHARED_LIBRARY_H_
