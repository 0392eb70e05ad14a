// The fake driver's virtual memory management (cuMemAddressReserve,
// cuMemCreate, cuMemMap, cuMemSetAccess, cuMemUnmap, cuMemRelease, ...) over
// host memory:
//   - a reservation is an anonymous PROT_NONE, MAP_NORESERVE mapping of the
//     process's address space: it costs no memory, and touching it faults;
//   - a physical allocation is a memfd of its size, charged to its device's
//     capacity in the fake runtime (so cudaMemGetInfo and simcuda_live_bytes
//     see it); its pages exist only once touched;
//   - a mapping is that memfd mapped MAP_SHARED | MAP_FIXED over part of a
//     reservation, so data written through one mapping of an allocation is
//     seen through every other. It starts with no access (PROT_NONE, as the
//     driver's mappings do); cuMemSetAccess grants PROT_READ or
//     PROT_READ | PROT_WRITE. Host memory cannot tell devices apart, so the
//     host protection is the widest access any device has. Touching a mapping
//     without access raises SIGSEGV, as a kernel would fault on a GPU; the
//     runtime's copies refuse such ranges (cudaErrorInvalidValue);
//   - unmapping puts the PROT_NONE reservation back.
//
// Arguments are checked as cuda.h documents them: sizes, addresses and
// offsets in multiples of the 2 MiB granularity; a mapping inside one
// reservation and over no other mapping; unmap and set-access only of whole
// mappings; a handle may be released while mapped (the memory goes when its
// last mapping does). Where the driver leaves behaviour undefined, simcuda
// refuses with CUDA_ERROR_INVALID_VALUE: using an unknown or released handle,
// freeing a reservation that still has mappings.
//
// Invariants (under mu_): mappings never overlap and each lies inside one
// reservation; every mapping refers to a live physical allocation; an
// allocation lives while it has references (cuMemCreate / import /
// cuMemRetainAllocationHandle, less cuMemRelease) or mappings, and a created
// (not imported) allocation is charged to its device exactly that long.
#ifndef TORCHMEM_TESTS_SIMCUDA_SRC_DRIVER_VIRTUAL_MEMORY_H_
#define TORCHMEM_TESTS_SIMCUDA_SRC_DRIVER_VIRTUAL_MEMORY_H_

#include <cuda.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <unordered_map>

namespace simcuda {
namespace drv {

// cuMemGetAllocationGranularity, minimum and recommended alike (a GPU page).
constexpr size_t kVmmGranularity = size_t{2} << 20;

// What simcuda_vmm_stats reports (see simcuda_control.h).
struct VmmCounts {
  uint64_t reservations = 0;
  uint64_t reserved_bytes = 0;
  uint64_t allocations = 0;  // live physical allocations
  uint64_t allocated_bytes = 0;
  uint64_t mappings = 0;
  uint64_t mapped_bytes = 0;
  uint64_t accessible_bytes = 0;          // mapped bytes some device may read
  uint64_t rdma_capable_allocations = 0;  // live ones created gpuDirectRDMACapable
};

// Whether the devices support GPUDirect RDMA with virtual memory
// (SIMCUDA_GPU_DIRECT_RDMA=1, read once).
bool GpuDirectRdmaSupported();

class VirtualMemory {
 public:
  // The process-wide instance; never destroyed (calls may come from other
  // libraries' static destructors).
  static VirtualMemory& Get();

  VirtualMemory(const VirtualMemory&) = delete;
  VirtualMemory& operator=(const VirtualMemory&) = delete;

  CUresult Reserve(size_t size, size_t alignment, uintptr_t hint, uintptr_t* out);
  CUresult FreeReservation(uintptr_t base, size_t size);

  CUresult Create(size_t size, const CUmemAllocationProp& prop, CUmemGenericAllocationHandle* out);
  CUresult Release(CUmemGenericAllocationHandle handle);
  CUresult Properties(CUmemGenericAllocationHandle handle, CUmemAllocationProp* out);
  // The handle mapped at `ptr`, with one more reference.
  CUresult Retain(uintptr_t ptr, CUmemGenericAllocationHandle* out);
  // POSIX file descriptors only: a new descriptor of the allocation's memfd.
  CUresult Export(CUmemGenericAllocationHandle handle, int* fd);
  CUresult Import(int fd, CUmemGenericAllocationHandle* out);

  CUresult Map(uintptr_t ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle);
  CUresult Unmap(uintptr_t ptr, size_t size);
  CUresult SetAccess(uintptr_t ptr, size_t size, const CUmemAccessDesc* desc, size_t count);
  CUresult GetAccess(int device, uintptr_t ptr, unsigned long long* flags);
  // The mapping containing `ptr` (cuMemGetAddressRange).
  bool MappingRange(uintptr_t ptr, uintptr_t* base, size_t* size);

  // Whether [ptr, ptr + bytes) lies in adjacent mappings that device
  // `accessor` (-1: some device) may read; if so, the device of the
  // allocation at `ptr` and the run of such mappings from the one containing
  // `ptr` up to (at least) ptr + bytes.
  bool FindAccessible(uintptr_t ptr, size_t bytes, int accessor, int* device, uintptr_t* base,
                      size_t* size);

  VmmCounts Counts();

 private:
  struct Allocation {
    size_t size = 0;
    int device = 0;
    int fd = -1;
    CUmemAllocationProp prop{};
    uint64_t references = 1;
    uint64_t mappings = 0;
    bool charged = false;  // created here (not imported): counted in the capacity
  };
  struct Mapping {
    size_t size = 0;
    size_t offset = 0;
    CUmemGenericAllocationHandle handle = 0;
    std::map<int, unsigned int> access;  // device -> CUmemAccess_flags
  };

  VirtualMemory() = default;

  // The live allocation of a handle the caller may use (references > 0).
  Allocation* UsableLocked(CUmemGenericAllocationHandle handle);
  // Frees the allocation if nothing refers to it any more.
  void MaybeDestroyLocked(CUmemGenericAllocationHandle handle);
  // The reservation holding all of [ptr, ptr + size), or end().
  std::map<uintptr_t, size_t>::iterator ReservationLocked(uintptr_t ptr, size_t size);
  // The mappings that exactly tile [ptr, ptr + size), first to last; false
  // if the range starts or ends inside a mapping or has an unmapped gap.
  bool WholeMappingsLocked(uintptr_t ptr, size_t size,
                           std::map<uintptr_t, Mapping>::iterator* first,
                           std::map<uintptr_t, Mapping>::iterator* last);
  static int HostProtection(const Mapping& m);

  std::mutex mu_;
  std::map<uintptr_t, size_t> reservations_;  // base -> size
  std::map<uintptr_t, Mapping> mappings_;     // base -> mapping
  std::unordered_map<CUmemGenericAllocationHandle, Allocation> allocations_;
  CUmemGenericAllocationHandle next_handle_ = 0x5100000001ull;  // never reused
};

}  // namespace drv
}  // namespace simcuda

#endif  // TORCHMEM_TESTS_SIMCUDA_SRC_DRIVER_VIRTUAL_MEMORY_H_
