// Device management calls: count, current device (per thread), properties,
// attributes, versions, peer access, limits and device-wide synchronisation.
#include <cuda_profiler_api.h>

#include <cstdio>
#include <map>
#include <mutex>
#include <set>
#include <utility>

#include "runtime/api_entry.h"
#include "runtime/device_properties.h"
#include "runtime/machine.h"

namespace simcuda {
namespace rt {
namespace {

thread_local int t_current_device = 0;
thread_local unsigned int t_device_flags = 0;

struct DeviceSettings {
  std::mutex mu;
  std::set<std::pair<int, int>> peer_access;     // (current, peer)
  std::map<std::pair<int, int>, size_t> limits;  // (device, cudaLimit)
};

DeviceSettings& Settings() {
  static DeviceSettings* settings = new DeviceSettings;
  return *settings;
}

}  // namespace

int CurrentDevice() { return t_current_device; }
void SetCurrentDevice(int device) { t_current_device = device; }

}  // namespace rt
}  // namespace simcuda

using simcuda::rt::CurrentDevice;
using simcuda::rt::Machine;
using simcuda::rt::Result;

extern "C" {

cudaError_t cudaGetDeviceCount(int* count) {
  SIMCUDA_ENTER();
  if (count == nullptr) return Result(cudaErrorInvalidValue);
  *count = Machine::Get().DeviceCount();
  return Result(*count == 0 ? cudaErrorNoDevice : cudaSuccess);
}

cudaError_t cudaGetDevice(int* device) {
  SIMCUDA_ENTER();
  if (device == nullptr) return Result(cudaErrorInvalidValue);
  *device = CurrentDevice();
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
  SIMCUDA_ENTER();
  if (!Machine::Get().ValidDevice(device)) {
    return Result(Machine::Get().DeviceCount() == 0 ? cudaErrorNoDevice : cudaErrorInvalidDevice);
  }
  // Since CUDA 12, cudaSetDevice initializes the device's primary context.
  if (const cudaError_t err = Machine::Get().EnsureContext(device); err != cudaSuccess) {
    return Result(err);
  }
  simcuda::rt::SetCurrentDevice(device);
  return cudaSuccess;
}

cudaError_t cudaInitDevice(int device, unsigned int device_flags, unsigned int flags) {
  SIMCUDA_ENTER();
  if (!Machine::Get().ValidDevice(device)) return Result(cudaErrorInvalidDevice);
  return Result(Machine::Get().EnsureContext(device));
}

cudaError_t cudaSetDeviceFlags(unsigned int flags) {
  SIMCUDA_ENTER();
  simcuda::rt::t_device_flags = flags;
  return cudaSuccess;
}

cudaError_t cudaGetDeviceFlags(unsigned int* flags) {
  SIMCUDA_ENTER();
  if (flags == nullptr) return Result(cudaErrorInvalidValue);
  *flags = simcuda::rt::t_device_flags;
  return cudaSuccess;
}

cudaError_t cudaChooseDevice(int* device, const cudaDeviceProp* prop) {
  SIMCUDA_ENTER();
  if (device == nullptr || prop == nullptr) return Result(cudaErrorInvalidValue);
  *device = 0;
  return Result(Machine::Get().DeviceCount() == 0 ? cudaErrorNoDevice : cudaSuccess);
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  SIMCUDA_ENTER();
  if (prop == nullptr) return Result(cudaErrorInvalidValue);
  Machine& m = Machine::Get();
  if (!m.ValidDevice(device)) return Result(cudaErrorInvalidDevice);
  simcuda::rt::FillDeviceProperties(device, m.Capacity(device), prop);
  return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
  SIMCUDA_ENTER();
  if (value == nullptr) return Result(cudaErrorInvalidValue);
  Machine& m = Machine::Get();
  if (!m.ValidDevice(device)) return Result(cudaErrorInvalidDevice);
  cudaDeviceProp prop;
  simcuda::rt::FillDeviceProperties(device, m.Capacity(device), &prop);
  return Result(simcuda::rt::DeviceAttribute(prop, attr, value) ? cudaSuccess
                                                                : cudaErrorInvalidValue);
}

cudaError_t cudaDeviceGetStreamPriorityRange(int* least, int* greatest) {
  SIMCUDA_ENTER();
  if (least != nullptr) *least = 0;
  if (greatest != nullptr) *greatest = -5;
  return cudaSuccess;
}

cudaError_t cudaDeviceGetPCIBusId(char* pci_bus_id, int len, int device) {
  SIMCUDA_ENTER();
  if (pci_bus_id == nullptr || len <= 0) return Result(cudaErrorInvalidValue);
  if (!Machine::Get().ValidDevice(device)) return Result(cudaErrorInvalidDevice);
  std::snprintf(pci_bus_id, static_cast<size_t>(len), "00000000:%02X:00.0", 0x10 + device);
  return cudaSuccess;
}

cudaError_t cudaDeviceGetByPCIBusId(int* device, const char* pci_bus_id) {
  SIMCUDA_ENTER();
  unsigned domain = 0, bus = 0;
  if (device == nullptr || pci_bus_id == nullptr ||
      std::sscanf(pci_bus_id, "%x:%x", &domain, &bus) != 2) {
    return Result(cudaErrorInvalidValue);
  }
  const int candidate = static_cast<int>(bus) - 0x10;
  if (!Machine::Get().ValidDevice(candidate)) return Result(cudaErrorInvalidDevice);
  *device = candidate;
  return cudaSuccess;
}

cudaError_t cudaDeviceCanAccessPeer(int* can_access, int device, int peer) {
  SIMCUDA_ENTER();
  if (can_access == nullptr) return Result(cudaErrorInvalidValue);
  Machine& m = Machine::Get();
  if (!m.ValidDevice(device) || !m.ValidDevice(peer)) return Result(cudaErrorInvalidDevice);
  *can_access = device != peer ? 1 : 0;
  return cudaSuccess;
}

cudaError_t cudaDeviceEnablePeerAccess(int peer, unsigned int flags) {
  SIMCUDA_ENTER();
  if (flags != 0) return Result(cudaErrorInvalidValue);
  const int device = CurrentDevice();
  if (!Machine::Get().ValidDevice(peer) || peer == device) return Result(cudaErrorInvalidDevice);
  if (const cudaError_t err = Machine::Get().EnsureContext(device); err != cudaSuccess) {
    return Result(err);
  }
  auto& s = simcuda::rt::Settings();
  std::lock_guard<std::mutex> lock(s.mu);
  if (!s.peer_access.insert({device, peer}).second) {
    return Result(cudaErrorPeerAccessAlreadyEnabled);
  }
  return cudaSuccess;
}

cudaError_t cudaDeviceDisablePeerAccess(int peer) {
  SIMCUDA_ENTER();
  auto& s = simcuda::rt::Settings();
  std::lock_guard<std::mutex> lock(s.mu);
  if (s.peer_access.erase({CurrentDevice(), peer}) == 0) {
    return Result(cudaErrorPeerAccessNotEnabled);
  }
  return cudaSuccess;
}

cudaError_t cudaDeviceGetLimit(size_t* value, cudaLimit limit) {
  SIMCUDA_ENTER();
  if (value == nullptr) return Result(cudaErrorInvalidValue);
  auto& s = simcuda::rt::Settings();
  std::lock_guard<std::mutex> lock(s.mu);
  auto it = s.limits.find({CurrentDevice(), static_cast<int>(limit)});
  if (it != s.limits.end()) {
    *value = it->second;
    return cudaSuccess;
  }
  switch (limit) {
    case cudaLimitStackSize:
      *value = 1024;
      break;
    case cudaLimitPrintfFifoSize:
      *value = 1 << 20;
      break;
    case cudaLimitMallocHeapSize:
      *value = 8 << 20;
      break;
    case cudaLimitDevRuntimeSyncDepth:
      *value = 2;
      break;
    case cudaLimitDevRuntimePendingLaunchCount:
      *value = 2048;
      break;
    case cudaLimitMaxL2FetchGranularity:
      *value = 64;
      break;
    default:
      *value = 0;
      break;
  }
  return cudaSuccess;
}

cudaError_t cudaDeviceSetLimit(cudaLimit limit, size_t value) {
  SIMCUDA_ENTER();
  auto& s = simcuda::rt::Settings();
  std::lock_guard<std::mutex> lock(s.mu);
  s.limits[{CurrentDevice(), static_cast<int>(limit)}] = value;
  return cudaSuccess;
}

cudaError_t cudaDeviceGetCacheConfig(cudaFuncCache* config) {
  SIMCUDA_ENTER();
  if (config == nullptr) return Result(cudaErrorInvalidValue);
  *config = cudaFuncCachePreferNone;
  return cudaSuccess;
}

cudaError_t cudaDeviceSetCacheConfig(cudaFuncCache config) {
  SIMCUDA_ENTER();
  return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void) {
  SIMCUDA_ENTER();
  if (const cudaError_t err = Machine::Get().EnsureContext(CurrentDevice()); err != cudaSuccess) {
    return Result(err);
  }
  Machine::Get().SynchronizeDevice(CurrentDevice());
  return cudaSuccess;
}

cudaError_t cudaRuntimeGetVersion(int* version) {
  SIMCUDA_ENTER();
  if (version == nullptr) return Result(cudaErrorInvalidValue);
  *version = simcuda::rt::kRuntimeVersion;
  return cudaSuccess;
}

cudaError_t cudaDriverGetVersion(int* version) {
  SIMCUDA_ENTER();
  if (version == nullptr) return Result(cudaErrorInvalidValue);
  *version = simcuda::rt::kDriverVersion;
  return cudaSuccess;
}

cudaError_t cudaProfilerStart(void) {
  SIMCUDA_ENTER();
  return cudaSuccess;
}

cudaError_t cudaProfilerStop(void) {
  SIMCUDA_ENTER();
  return cudaSuccess;
}

}  // extern "C"
