// Device and pinned host memory of the simulated machine. Every owned
// allocation is its own anonymous mapping with MAP_NORESERVE: an 80 GiB
// device costs no host RAM until pages are touched, and a free returns the
// pages to the system.
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <iterator>

#include "runtime/machine.h"

namespace simcuda {
namespace rt {
namespace {

size_t RoundUp(size_t value, size_t to) { return (value + to - 1) / to * to; }

size_t PageSize() {
  static const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return page;
}

void* MapAnonymous(size_t bytes) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  return p == MAP_FAILED ? nullptr : p;
}

}  // namespace

cudaError_t Machine::AllocateDevice(int device, size_t size, MemoryKind kind, void** ptr) {
  *ptr = nullptr;
  if (size == 0) return cudaSuccess;  // CUDA: success, null pointer
  const size_t charge = RoundUp(size, kAllocationGranularity);
  if (charge < size) return cudaErrorMemoryAllocation;  // overflow
  {
    std::lock_guard<std::mutex> lock(mu_);
    DeviceState* d = DeviceLocked(device);
    if (d == nullptr) return cudaErrorInvalidDevice;
    if (const cudaError_t err = EnsureContextLocked(device); err != cudaSuccess) return err;
    if (charge > d->capacity - std::min(d->capacity, d->used)) return cudaErrorMemoryAllocation;
    d->used += charge;  // reserve before mapping, outside the lock
  }
  const size_t mapped = RoundUp(size, PageSize());
  void* p = MapAnonymous(mapped);
  std::lock_guard<std::mutex> lock(mu_);
  DeviceState* d = devices_[device].get();
  if (p == nullptr) {
    d->used -= charge;
    return cudaErrorMemoryAllocation;
  }
  d->peak = std::max(d->peak, d->used);
  ++d->live_allocations;
  Allocation a;
  a.base = reinterpret_cast<uintptr_t>(p);
  a.size = size;
  a.mapped = mapped;
  a.charged = charge;
  a.device = device;
  a.kind = kind;
  allocations_[a.base] = a;
  *ptr = p;
  return cudaSuccess;
}

cudaError_t Machine::FreeDevice(void* ptr) {
  if (ptr == nullptr) return cudaSuccess;
  Allocation a;
  HostCallbacks run;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = allocations_.find(reinterpret_cast<uintptr_t>(ptr));
    if (it == allocations_.end() ||
        (it->second.kind != MemoryKind::kDevice && it->second.kind != MemoryKind::kManaged)) {
      return cudaErrorInvalidValue;
    }
    a = it->second;
    allocations_.erase(it);
    DeviceState* d = devices_[a.device].get();
    d->used -= a.charged;
    --d->live_allocations;
    // cudaFree synchronises the device before releasing memory.
    CompleteDeviceLocked(a.device, &run);
  }
  munmap(ptr, a.mapped);
  // Shared with other processes: they keep their mappings; the name goes.
  if (!a.shared_name.empty()) shm_unlink(a.shared_name.c_str());
  Run(&run);
  return cudaSuccess;
}

cudaError_t Machine::AllocateHost(size_t size, void** ptr) {
  *ptr = nullptr;
  if (size == 0) return cudaSuccess;
  const size_t mapped = RoundUp(size, PageSize());
  void* p = MapAnonymous(mapped);
  if (p == nullptr) return cudaErrorMemoryAllocation;
  std::lock_guard<std::mutex> lock(mu_);
  Allocation a;
  a.base = reinterpret_cast<uintptr_t>(p);
  a.size = size;
  a.mapped = mapped;
  a.kind = MemoryKind::kHostPinned;
  allocations_[a.base] = a;
  *ptr = p;
  return cudaSuccess;
}

cudaError_t Machine::FreeHost(void* ptr) {
  if (ptr == nullptr) return cudaSuccess;
  size_t mapped = 0;
  HostCallbacks run;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = allocations_.find(reinterpret_cast<uintptr_t>(ptr));
    if (it == allocations_.end() || it->second.kind != MemoryKind::kHostPinned) {
      return cudaErrorInvalidValue;
    }
    mapped = it->second.mapped;
    allocations_.erase(it);
    CompleteDeviceLocked(-1, &run);  // cudaFreeHost synchronises too
  }
  munmap(ptr, mapped);
  Run(&run);
  return cudaSuccess;
}

cudaError_t Machine::RegisterHost(void* ptr, size_t size) {
  if (ptr == nullptr || size == 0) return cudaErrorInvalidValue;
  std::lock_guard<std::mutex> lock(mu_);
  const uintptr_t begin = reinterpret_cast<uintptr_t>(ptr);
  auto next = allocations_.lower_bound(begin);
  if (next != allocations_.end() && next->first < begin + size) {
    return cudaErrorHostMemoryAlreadyRegistered;
  }
  if (next != allocations_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second.size > begin) return cudaErrorHostMemoryAlreadyRegistered;
  }
  Allocation a;
  a.base = begin;
  a.size = size;
  a.kind = MemoryKind::kHostRegistered;
  allocations_[begin] = a;
  return cudaSuccess;
}

cudaError_t Machine::UnregisterHost(void* ptr) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = allocations_.find(reinterpret_cast<uintptr_t>(ptr));
  if (it == allocations_.end() || it->second.kind != MemoryKind::kHostRegistered) {
    return cudaErrorHostMemoryNotRegistered;
  }
  allocations_.erase(it);
  return cudaSuccess;
}

cudaError_t Machine::ChargeDevice(int device, uint64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  DeviceState* d = DeviceLocked(device);
  if (d == nullptr) return cudaErrorInvalidDevice;
  if (bytes > d->capacity - std::min(d->capacity, d->used)) return cudaErrorMemoryAllocation;
  d->used += bytes;
  d->peak = std::max(d->peak, d->used);
  ++d->live_allocations;
  return cudaSuccess;
}

void Machine::UnchargeDevice(int device, uint64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  DeviceState* d = DeviceLocked(device);
  if (d == nullptr) return;
  d->used -= std::min(d->used, bytes);
  if (d->live_allocations > 0) --d->live_allocations;
}

bool Machine::LookupOwn(const void* ptr, Allocation* out) {
  const uintptr_t p = reinterpret_cast<uintptr_t>(ptr);
  std::lock_guard<std::mutex> lock(mu_);
  auto it = allocations_.upper_bound(p);
  if (it == allocations_.begin()) return false;
  --it;
  if (p >= it->first + std::max<size_t>(it->second.size, 1)) return false;
  *out = it->second;
  return true;
}

bool Machine::Lookup(const void* ptr, Allocation* out) {
  return LookupOwn(ptr, out) || LookupMapped(ptr, 1, -1, out);
}

bool Machine::LookupMapped(const void* ptr, size_t bytes, int accessor, Allocation* out) {
  // Pages the driver mapped, asked without our lock (the driver calls into
  // the runtime while holding its own).
  simcuda_mapping_lookup_fn lookup = mapping_lookup_.load(std::memory_order_acquire);
  int device = -1;
  uintptr_t base = 0;
  size_t size = 0;
  if (lookup == nullptr ||
      !lookup(reinterpret_cast<uintptr_t>(ptr), bytes, accessor, &device, &base, &size)) {
    return false;
  }
  *out = Allocation();
  out->base = base;
  out->size = size;
  out->device = device;
  out->kind = MemoryKind::kDevice;
  return true;
}

void Machine::SetMappingLookup(simcuda_mapping_lookup_fn lookup) {
  mapping_lookup_.store(lookup, std::memory_order_release);
}

cudaError_t Machine::CheckDeviceRange(const void* ptr, size_t bytes, int accessor) {
  Allocation a;
  if (!LookupOwn(ptr, &a)) {
    // Mapped pages may span several mappings: the driver checks the range
    // and the accessor's access to every page of it.
    return LookupMapped(ptr, bytes, accessor, &a) ? cudaSuccess : cudaErrorInvalidValue;
  }
  const uintptr_t p = reinterpret_cast<uintptr_t>(ptr);
  if (p + bytes > a.base + a.size) return cudaErrorInvalidValue;
  return cudaSuccess;
}

}  // namespace rt
}  // namespace simcuda
