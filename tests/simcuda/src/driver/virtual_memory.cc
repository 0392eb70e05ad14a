// The fake driver's virtual memory (see virtual_memory.h): reservations as
// PROT_NONE address space, physical allocations as memfds charged to the
// runtime's capacity, mappings as MAP_SHARED | MAP_FIXED views of them.
#include "driver/virtual_memory.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "common/vmm_link.h"
#include "driver/driver_entry.h"

namespace simcuda {
namespace drv {
namespace {

// memfd names carry the device, so an imported descriptor says where its
// memory lives: "simcuda-vmm:<device>".
constexpr char kMemfdPrefix[] = "simcuda-vmm:";

// Capacity is the runtime's; a driver loaded without it has no limit.
CUresult Charge(int device, size_t bytes) {
  auto charge = Runtime<int (*)(int, unsigned long long)>("simcuda_vmm_charge");
  if (charge == nullptr) return CUDA_SUCCESS;
  switch (charge(device, bytes)) {
    case 0:
      return CUDA_SUCCESS;
    case 101:  // cudaErrorInvalidDevice
      return CUDA_ERROR_INVALID_DEVICE;
    default:
      return CUDA_ERROR_OUT_OF_MEMORY;
  }
}

void Uncharge(int device, size_t bytes) {
  if (auto uncharge = Runtime<void (*)(int, unsigned long long)>("simcuda_vmm_uncharge")) {
    uncharge(device, bytes);
  }
}

// The runtime asks this for pointers it did not allocate (copies,
// cudaPointerGetAttributes). Installed when the first mapping is made.
int LookupForRuntime(uintptr_t ptr, size_t bytes, int accessor, int* device, uintptr_t* base,
                     size_t* size) {
  return VirtualMemory::Get().FindAccessible(ptr, bytes, accessor, device, base, size) ? 1 : 0;
}

void InstallRuntimeLookup() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (auto set = Runtime<void (*)(simcuda_mapping_lookup_fn)>("simcuda_vmm_set_mapping_lookup")) {
      set(&LookupForRuntime);
    }
  });
}

// A memfd of `size` bytes (sparse: no memory until touched). One descriptor
// per physical allocation, as the allocation may be exported as one; when the
// process runs out of descriptors the soft limit is raised towards the hard
// one, since allocators hold thousands of 2 MiB allocations.
int NewMemfd(int device, size_t size) {
  const std::string name = kMemfdPrefix + std::to_string(device);
  int fd = memfd_create(name.c_str(), MFD_CLOEXEC);
  if (fd < 0 && errno == EMFILE) {
    rlimit limit{};
    if (getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur < limit.rlim_max) {
      limit.rlim_cur = std::min(limit.rlim_max, std::max<rlim_t>(2 * limit.rlim_cur, 4096));
      if (setrlimit(RLIMIT_NOFILE, &limit) == 0) fd = memfd_create(name.c_str(), MFD_CLOEXEC);
    }
    if (fd < 0) {
      std::fprintf(stderr,
                   "simcuda: cuMemCreate: out of file descriptors (one per physical "
                   "allocation); raise `ulimit -n`\n");
    }
  }
  if (fd < 0) return -1;
  if (ftruncate(fd, static_cast<off_t>(size)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// Every mapping is a kernel memory area (VMA): a process has at most
// vm.max_map_count of them (65530 by default), i.e. about 60 GiB of separate
// 2 MiB mappings. Said once, when mmap runs out.
void NoteMappingLimit() {
  if (errno != ENOMEM) return;
  static std::once_flag once;
  std::call_once(once, [] {
    std::fprintf(stderr,
                 "simcuda: cuMemMap/cuMemUnmap: the process ran out of memory mappings "
                 "(each mapping is one; see /proc/sys/vm/max_map_count)\n");
  });
}

// Back to a reservation: fresh PROT_NONE address space over [base, base + size).
bool Placeholder(uintptr_t base, size_t size) {
  void* p = mmap(reinterpret_cast<void*>(base), size, PROT_NONE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
  return p != MAP_FAILED;
}

}  // namespace

VirtualMemory& VirtualMemory::Get() {
  static VirtualMemory* instance = new VirtualMemory;
  return *instance;
}

CUresult VirtualMemory::Reserve(size_t size, size_t alignment, uintptr_t hint, uintptr_t* out) {
  const size_t align = std::max(alignment, kVmmGranularity);
  const int flags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE;
  void* p = MAP_FAILED;
  if (hint != 0 && hint % align == 0) {
    // The address is a hint: taken if that range is free, else ignored.
    p = mmap(reinterpret_cast<void*>(hint), size, PROT_NONE, flags | MAP_FIXED_NOREPLACE, -1, 0);
    if (p != MAP_FAILED && reinterpret_cast<uintptr_t>(p) != hint) {
      munmap(p, size);  // a kernel without MAP_FIXED_NOREPLACE placed it elsewhere
      p = MAP_FAILED;
    }
  }
  if (p == MAP_FAILED) {
    if (size > SIZE_MAX - align) return CUDA_ERROR_OUT_OF_MEMORY;
    void* raw = mmap(nullptr, size + align, PROT_NONE, flags, -1, 0);
    if (raw == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
    const uintptr_t start = reinterpret_cast<uintptr_t>(raw);
    const uintptr_t aligned = (start + align - 1) / align * align;
    if (aligned > start) munmap(raw, aligned - start);
    const uintptr_t end = start + size + align;
    if (end > aligned + size) munmap(reinterpret_cast<void*>(aligned + size), end - aligned - size);
    p = reinterpret_cast<void*>(aligned);
  }
  std::lock_guard<std::mutex> lock(mu_);
  *out = reinterpret_cast<uintptr_t>(p);
  reservations_[*out] = size;
  return CUDA_SUCCESS;
}

CUresult VirtualMemory::FreeReservation(uintptr_t base, size_t size) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = reservations_.find(base);
  if (it == reservations_.end() || it->second != size) return CUDA_ERROR_INVALID_VALUE;
  auto mapped = mappings_.lower_bound(base);
  if (mapped != mappings_.end() && mapped->first < base + size) return CUDA_ERROR_INVALID_VALUE;
  munmap(reinterpret_cast<void*>(base), size);
  reservations_.erase(it);
  return CUDA_SUCCESS;
}

CUresult VirtualMemory::Create(size_t size, const CUmemAllocationProp& prop,
                               CUmemGenericAllocationHandle* out) {
  const int device = prop.location.id;
  // A device without GPUDirect RDMA for virtual memory refuses to create
  // RDMA-capable memory (the caller must ask the device attribute first).
  if (prop.allocFlags.gpuDirectRDMACapable != 0 && !GpuDirectRdmaSupported()) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (CUresult charged = Charge(device, size); charged != CUDA_SUCCESS) return charged;
  const int fd = NewMemfd(device, size);
  if (fd < 0) {
    Uncharge(device, size);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  Allocation a;
  a.size = size;
  a.device = device;
  a.fd = fd;
  a.prop = prop;
  a.prop.allocFlags.compressionType = 0;  // no compressible memory here
  a.charged = true;
  std::lock_guard<std::mutex> lock(mu_);
  *out = next_handle_++;
  allocations_.emplace(*out, a);
  return CUDA_SUCCESS;
}

VirtualMemory::Allocation* VirtualMemory::UsableLocked(CUmemGenericAllocationHandle handle) {
  auto it = allocations_.find(handle);
  if (it == allocations_.end() || it->second.references == 0) return nullptr;
  return &it->second;
}

void VirtualMemory::MaybeDestroyLocked(CUmemGenericAllocationHandle handle) {
  auto it = allocations_.find(handle);
  if (it == allocations_.end() || it->second.references > 0 || it->second.mappings > 0) return;
  close(it->second.fd);
  if (it->second.charged) Uncharge(it->second.device, it->second.size);
  allocations_.erase(it);
}

CUresult VirtualMemory::Release(CUmemGenericAllocationHandle handle) {
  std::lock_guard<std::mutex> lock(mu_);
  Allocation* a = UsableLocked(handle);
  if (a == nullptr) return CUDA_ERROR_INVALID_VALUE;
  --a->references;
  MaybeDestroyLocked(handle);
  return CUDA_SUCCESS;
}

CUresult VirtualMemory::Properties(CUmemGenericAllocationHandle handle, CUmemAllocationProp* out) {
  std::lock_guard<std::mutex> lock(mu_);
  Allocation* a = UsableLocked(handle);
  if (a == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *out = a->prop;
  return CUDA_SUCCESS;
}

CUresult VirtualMemory::Retain(uintptr_t ptr, CUmemGenericAllocationHandle* out) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = mappings_.upper_bound(ptr);
  if (it == mappings_.begin()) return CUDA_ERROR_INVALID_VALUE;
  --it;
  if (ptr >= it->first + it->second.size) return CUDA_ERROR_INVALID_VALUE;
  ++allocations_.at(it->second.handle).references;
  *out = it->second.handle;
  return CUDA_SUCCESS;
}

CUresult VirtualMemory::Export(CUmemGenericAllocationHandle handle, int* fd) {
  std::lock_guard<std::mutex> lock(mu_);
  Allocation* a = UsableLocked(handle);
  if (a == nullptr) return CUDA_ERROR_INVALID_VALUE;
  // Only the handle types asked for at creation can be exported.
  if ((a->prop.requestedHandleTypes & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) == 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  *fd = fcntl(a->fd, F_DUPFD_CLOEXEC, 0);
  return *fd < 0 ? CUDA_ERROR_OUT_OF_MEMORY : CUDA_SUCCESS;
}

CUresult VirtualMemory::Import(int fd, CUmemGenericAllocationHandle* out) {
  // Only a simcuda memfd ("/memfd:simcuda-vmm:<device> (deleted)") is memory
  // of a simulated device.
  char target[128] = {};
  const std::string link = "/proc/self/fd/" + std::to_string(fd);
  const ssize_t n = readlink(link.c_str(), target, sizeof(target) - 1);
  const std::string expected = std::string("/memfd:") + kMemfdPrefix;
  if (n <= 0 || std::strncmp(target, expected.c_str(), expected.size()) != 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  const int device = std::atoi(target + expected.size());
  if (!ValidDevice(device)) return CUDA_ERROR_NOT_SUPPORTED;  // a device this process lacks
  struct stat st {};
  if (fstat(fd, &st) != 0 || st.st_size <= 0 ||
      static_cast<size_t>(st.st_size) % kVmmGranularity != 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  const int own = fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (own < 0) return CUDA_ERROR_OUT_OF_MEMORY;
  Allocation a;
  a.size = static_cast<size_t>(st.st_size);
  a.device = device;
  a.fd = own;
  a.prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  a.prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  a.prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  a.prop.location.id = device;
  a.charged = false;  // the exporting process paid for it
  std::lock_guard<std::mutex> lock(mu_);
  *out = next_handle_++;
  allocations_.emplace(*out, a);
  return CUDA_SUCCESS;
}

std::map<uintptr_t, size_t>::iterator VirtualMemory::ReservationLocked(uintptr_t ptr, size_t size) {
  auto it = reservations_.upper_bound(ptr);
  if (it == reservations_.begin()) return reservations_.end();
  --it;
  const uintptr_t end = it->first + it->second;
  if (ptr >= end || size > end - ptr) return reservations_.end();
  return it;
}

CUresult VirtualMemory::Map(uintptr_t ptr, size_t size, size_t offset,
                            CUmemGenericAllocationHandle handle) {
  std::lock_guard<std::mutex> lock(mu_);
  Allocation* a = UsableLocked(handle);
  if (a == nullptr || offset > a->size || size > a->size - offset) return CUDA_ERROR_INVALID_VALUE;
  if (ReservationLocked(ptr, size) == reservations_.end()) return CUDA_ERROR_INVALID_VALUE;
  // No part of the range may be mapped already.
  auto next = mappings_.lower_bound(ptr);
  if (next != mappings_.end() && next->first < ptr + size) return CUDA_ERROR_INVALID_VALUE;
  if (next != mappings_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second.size > ptr) return CUDA_ERROR_INVALID_VALUE;
  }
  void* p = mmap(reinterpret_cast<void*>(ptr), size, PROT_NONE, MAP_SHARED | MAP_FIXED, a->fd,
                 static_cast<off_t>(offset));
  if (p == MAP_FAILED) {
    NoteMappingLimit();
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  Mapping m;
  m.size = size;
  m.offset = offset;
  m.handle = handle;
  mappings_.emplace(ptr, m);
  ++a->mappings;
  InstallRuntimeLookup();
  return CUDA_SUCCESS;
}

bool VirtualMemory::WholeMappingsLocked(uintptr_t ptr, size_t size,
                                        std::map<uintptr_t, Mapping>::iterator* first,
                                        std::map<uintptr_t, Mapping>::iterator* last) {
  auto it = mappings_.find(ptr);
  if (it == mappings_.end()) return false;
  *first = it;
  uintptr_t end = ptr;
  const uintptr_t want = ptr + size;
  while (true) {
    if (it == mappings_.end() || it->first != end) return false;  // a gap
    end += it->second.size;
    if (end == want) {
      *last = it;
      return true;
    }
    if (end > want) return false;  // ends inside a mapping
    ++it;
  }
}

int VirtualMemory::HostProtection(const Mapping& m) {
  unsigned int widest = CU_MEM_ACCESS_FLAGS_PROT_NONE;
  for (const auto& [device, flags] : m.access) widest |= flags;
  if (widest == CU_MEM_ACCESS_FLAGS_PROT_READWRITE) return PROT_READ | PROT_WRITE;
  if (widest == CU_MEM_ACCESS_FLAGS_PROT_READ) return PROT_READ;
  return PROT_NONE;
}

CUresult VirtualMemory::Unmap(uintptr_t ptr, size_t size) {
  std::lock_guard<std::mutex> lock(mu_);
  std::map<uintptr_t, Mapping>::iterator first, last;
  if (!WholeMappingsLocked(ptr, size, &first, &last)) return CUDA_ERROR_INVALID_VALUE;
  if (!Placeholder(ptr, size)) {
    NoteMappingLimit();
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  const auto end = std::next(last);
  for (auto it = first; it != end;) {
    const CUmemGenericAllocationHandle handle = it->second.handle;
    it = mappings_.erase(it);
    --allocations_.at(handle).mappings;
    MaybeDestroyLocked(handle);
  }
  return CUDA_SUCCESS;
}

CUresult VirtualMemory::SetAccess(uintptr_t ptr, size_t size, const CUmemAccessDesc* desc,
                                  size_t count) {
  std::lock_guard<std::mutex> lock(mu_);
  std::map<uintptr_t, Mapping>::iterator first, last;
  if (!WholeMappingsLocked(ptr, size, &first, &last)) return CUDA_ERROR_INVALID_VALUE;
  const auto end = std::next(last);
  for (auto it = first; it != end; ++it) {
    for (size_t i = 0; i < count; ++i) {
      it->second.access[desc[i].location.id] = desc[i].flags;
    }
    if (mprotect(reinterpret_cast<void*>(it->first), it->second.size, HostProtection(it->second)) !=
        0) {
      return CUDA_ERROR_OUT_OF_MEMORY;
    }
  }
  return CUDA_SUCCESS;
}

CUresult VirtualMemory::GetAccess(int device, uintptr_t ptr, unsigned long long* flags) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = mappings_.upper_bound(ptr);
  if (it == mappings_.begin()) return CUDA_ERROR_INVALID_VALUE;
  --it;
  if (ptr >= it->first + it->second.size) return CUDA_ERROR_INVALID_VALUE;
  auto access = it->second.access.find(device);
  *flags = access == it->second.access.end() ? 0u : access->second;  // 0: PROT_NONE
  return CUDA_SUCCESS;
}

bool VirtualMemory::MappingRange(uintptr_t ptr, uintptr_t* base, size_t* size) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = mappings_.upper_bound(ptr);
  if (it == mappings_.begin()) return false;
  --it;
  if (ptr >= it->first + it->second.size) return false;
  *base = it->first;
  *size = it->second.size;
  return true;
}

bool VirtualMemory::FindAccessible(uintptr_t ptr, size_t bytes, int accessor, int* device,
                                   uintptr_t* base, size_t* size) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = mappings_.upper_bound(ptr);
  if (it == mappings_.begin()) return false;
  --it;
  if (ptr >= it->first + it->second.size) return false;
  *device = allocations_.at(it->second.handle).device;
  *base = it->first;
  uintptr_t end = it->first;
  const uintptr_t want = ptr + std::max<size_t>(bytes, 1);
  // Walk adjacent mappings the accessor may read until the range is covered.
  auto readable = [accessor](const Mapping& m) {
    if (accessor < 0) return HostProtection(m) != PROT_NONE;
    auto access = m.access.find(accessor);
    return access != m.access.end() && access->second != CU_MEM_ACCESS_FLAGS_PROT_NONE;
  };
  while (it != mappings_.end() && it->first == end && readable(it->second)) {
    end += it->second.size;
    if (end >= want) break;
    ++it;
  }
  if (end < want) return false;
  *size = end - *base;
  return true;
}

bool GpuDirectRdmaSupported() {
  static const bool supported = [] {
    const char* env = std::getenv("SIMCUDA_GPU_DIRECT_RDMA");
    return env != nullptr && std::string(env) == "1";
  }();
  return supported;
}

VmmCounts VirtualMemory::Counts() {
  std::lock_guard<std::mutex> lock(mu_);
  VmmCounts c;
  c.reservations = reservations_.size();
  for (const auto& [base, size] : reservations_) c.reserved_bytes += size;
  c.allocations = allocations_.size();
  for (const auto& [handle, a] : allocations_) {
    c.allocated_bytes += a.size;
    if (a.prop.allocFlags.gpuDirectRDMACapable != 0) ++c.rdma_capable_allocations;
  }
  c.mappings = mappings_.size();
  for (const auto& [base, m] : mappings_) {
    c.mapped_bytes += m.size;
    if (HostProtection(m) != PROT_NONE) c.accessible_bytes += m.size;
  }
  return c;
}

}  // namespace drv
}  // namespace simcuda
