// Device memory and events shared between processes (CUDA IPC) on the
// simulated machine.
//
// Simulated device memory is an anonymous private mapping, which no other
// process can reach. The first cudaIpcGetMemHandle on an allocation moves
// it into a POSIX shared memory object: the object is created, filled with
// the allocation's bytes, and mapped over the allocation at the same address
// (MAP_FIXED), so pointers and data in this process are unchanged. The
// handle names the object; cudaIpcOpenMemHandle in another process maps it
// (as device memory of that process's current device, charged nowhere),
// cudaIpcCloseMemHandle unmaps it, and cudaFree in the owner unlinks the
// name (mappings already open stay valid, as on a GPU until they close).
//
// Handle layout (64 bytes): "simcuda-ipc" magic, owner pid, mapped size,
// object name. Opening a handle of the calling process fails with
// cudaErrorDeviceUninitialized ("invalid device context"), as CUDA refuses to
// open an allocation of its own context.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "runtime/machine.h"

namespace simcuda {
namespace rt {
namespace {

constexpr char kMemMagic[] = "simcuda-ipc";
constexpr char kEventMagic[] = "simcuda-ev";

struct MemHandle {
  char magic[12];
  int32_t pid;
  uint64_t mapped;
  char name[CUDA_IPC_HANDLE_SIZE - 12 - 4 - 8];
};
static_assert(sizeof(MemHandle) == CUDA_IPC_HANDLE_SIZE, "IPC handle layout");

struct EventHandle {
  char magic[12];
  int32_t pid;
  uint64_t event;
  char unused[CUDA_IPC_HANDLE_SIZE - 12 - 4 - 8];
};
static_assert(sizeof(EventHandle) == CUDA_IPC_HANDLE_SIZE, "IPC event handle layout");

std::atomic<unsigned> g_next_object{0};

}  // namespace

cudaError_t Machine::ShareMemory(void* ptr, cudaIpcMemHandle_t* handle) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = allocations_.find(reinterpret_cast<uintptr_t>(ptr));
  if (it == allocations_.end() || it->second.kind != MemoryKind::kDevice) {
    return cudaErrorInvalidValue;
  }
  Allocation& a = it->second;
  if (a.shared_name.empty()) {
    char name[sizeof(MemHandle::name)];
    // A process that exits without freeing what it shared (killed, or simply
    // ending) leaves its object behind, and a later process may get the same
    // pid: a name already taken moves on to the next number instead of
    // failing (which PyTorch's queue feeder thread only prints, leaving the
    // consumer waiting forever).
    int fd = -1;
    do {
      std::snprintf(name, sizeof(name), "/simcuda-%d-%u", static_cast<int>(getpid()),
                    g_next_object.fetch_add(1));
      fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600);
    } while (fd < 0 && errno == EEXIST);
    if (fd < 0) return cudaErrorMemoryAllocation;
    bool ok = ftruncate(fd, static_cast<off_t>(a.mapped)) == 0;
    // Copy the bytes in, then put the object where the allocation was.
    for (size_t done = 0; ok && done < a.mapped;) {
      const ssize_t wrote = pwrite(fd, reinterpret_cast<const char*>(a.base) + done,
                                   a.mapped - done, static_cast<off_t>(done));
      ok = wrote > 0;
      if (ok) done += static_cast<size_t>(wrote);
    }
    ok = ok && mmap(ptr, a.mapped, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0) == ptr;
    close(fd);
    if (!ok) {
      shm_unlink(name);
      return cudaErrorMemoryAllocation;
    }
    a.shared_name = name;
  }
  MemHandle h{};
  std::memcpy(h.magic, kMemMagic, sizeof(kMemMagic));
  h.pid = static_cast<int32_t>(getpid());
  h.mapped = a.mapped;
  std::snprintf(h.name, sizeof(h.name), "%s", a.shared_name.c_str());
  std::memcpy(handle, &h, sizeof(h));
  return cudaSuccess;
}

cudaError_t Machine::OpenSharedMemory(const cudaIpcMemHandle_t& handle, int device, void** ptr) {
  MemHandle h;
  std::memcpy(&h, &handle, sizeof(h));
  h.name[sizeof(h.name) - 1] = '\0';
  if (std::memcmp(h.magic, kMemMagic, sizeof(kMemMagic)) != 0) return cudaErrorInvalidValue;
  if (h.pid == static_cast<int32_t>(getpid())) return cudaErrorDeviceUninitialized;
  if (!ValidDevice(device)) return cudaErrorInvalidDevice;
  const int fd = shm_open(h.name, O_RDWR, 0);
  if (fd < 0) return cudaErrorInvalidValue;  // freed by its owner already
  void* p = mmap(nullptr, h.mapped, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) return cudaErrorMemoryAllocation;
  std::lock_guard<std::mutex> lock(mu_);
  Allocation a;
  a.base = reinterpret_cast<uintptr_t>(p);
  a.size = h.mapped;
  a.mapped = h.mapped;
  a.device = device;
  a.kind = MemoryKind::kIpcOpened;
  allocations_[a.base] = a;
  *ptr = p;
  return cudaSuccess;
}

cudaError_t Machine::CloseSharedMemory(void* ptr) {
  size_t mapped = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = allocations_.find(reinterpret_cast<uintptr_t>(ptr));
    if (it == allocations_.end() || it->second.kind != MemoryKind::kIpcOpened) {
      return cudaErrorInvalidValue;
    }
    mapped = it->second.mapped;
    allocations_.erase(it);
  }
  munmap(ptr, mapped);
  return cudaSuccess;
}

cudaError_t Machine::ShareEvent(cudaEvent_t event, cudaIpcEventHandle_t* handle) {
  std::lock_guard<std::mutex> lock(mu_);
  CUevent_st* e = EventLocked(event);
  if (e == nullptr) return cudaErrorInvalidResourceHandle;
  // CUDA: only events created with cudaEventInterprocess | DisableTiming.
  if ((e->flags & cudaEventInterprocess) == 0 || (e->flags & cudaEventDisableTiming) == 0) {
    return cudaErrorInvalidResourceHandle;
  }
  EventHandle h{};
  std::memcpy(h.magic, kEventMagic, sizeof(kEventMagic));
  h.pid = static_cast<int32_t>(getpid());
  h.event = reinterpret_cast<uintptr_t>(event);
  std::memcpy(handle, &h, sizeof(h));
  return cudaSuccess;
}

cudaError_t Machine::OpenSharedEvent(const cudaIpcEventHandle_t& handle, int device,
                                     cudaEvent_t* out) {
  EventHandle h;
  std::memcpy(&h, &handle, sizeof(h));
  if (std::memcmp(h.magic, kEventMagic, sizeof(kEventMagic)) != 0) return cudaErrorInvalidValue;
  if (h.pid == static_cast<int32_t>(getpid())) return cudaErrorDeviceUninitialized;
  // Never recorded here, so complete: work of another process is not modelled.
  return CreateEvent(device, cudaEventDisableTiming | cudaEventInterprocess, out);
}

}  // namespace rt
}  // namespace simcuda
