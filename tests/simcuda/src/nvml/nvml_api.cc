// A minimal fake NVML (libnvidia-ml.so.1) for the simulated device: what
// PyTorch asks of NVML once it finds the library. A real machine always has
// NVML next to the driver, and PyTorch 2.14's expandable segments assume it:
// ExpandableSegment::map asks c10::cuda::get_fabric_access, which calls
// nvmlInit_v2 through a function pointer that is null without NVML (a
// segfault). torch's DriverAPI requires these six symbols once the library
// loads: nvmlInit_v2, nvmlDeviceGetHandleByPciBusId_v2,
// nvmlDeviceGetNvLinkRemoteDeviceType, nvmlDeviceGetNvLinkRemotePciInfo_v2,
// nvmlDeviceGetComputeRunningProcesses, nvmlSystemGetCudaDriverVersion_v2;
// torch.cuda.device_count() calls nvmlInit and nvmlDeviceGetCount_v2 through
// ctypes. nvmlDeviceGetGpuFabricInfoV is deliberately absent: torch then
// reports no fabric, as on a GPU without an NVLink fabric.
//
// nvml.h is not part of the CUDA toolkit here, so the few types are declared
// by hand: nvmlReturn_t is an int (its values below), nvmlDevice_t an opaque
// pointer. Devices follow the fake runtime (their count, their PCI bus ids);
// no process is ever reported as using a device.
#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>

#include "common/call_registry.h"

namespace {

// nvmlReturn_t values (NVML's documented numbering).
constexpr int kSuccess = 0;
constexpr int kInvalidArgument = 2;
constexpr int kNotSupported = 3;
constexpr int kNotFound = 6;

constexpr int kMaxDevices = 64;
constexpr int kCudaDriverVersion = 13000;

// What an nvmlDevice_t points to.
struct FakeNvmlDevice {
  int index;
};
FakeNvmlDevice g_devices[kMaxDevices];

int DeviceCount() {
  auto count = reinterpret_cast<int (*)()>(dlsym(RTLD_DEFAULT, "simcuda_get_device_count"));
  if (count != nullptr) return count();
  const char* env = std::getenv("SIMCUDA_DEVICE_COUNT");
  return env != nullptr ? std::atoi(env) : 1;
}

FakeNvmlDevice* Device(int index) {
  g_devices[index].index = index;
  return &g_devices[index];
}

}  // namespace

#define SIMCUDA_NVML_ENTER()                                                          \
  static ::simcuda::CallSite* const simcuda_site = ::simcuda::RegisterCall(__func__); \
  simcuda_site->count.fetch_add(1, std::memory_order_relaxed)

extern "C" {

int nvmlInit_v2(void) {
  SIMCUDA_NVML_ENTER();
  return kSuccess;
}

int nvmlInit(void) {
  SIMCUDA_NVML_ENTER();
  return kSuccess;
}

int nvmlInitWithFlags(unsigned int flags) {
  SIMCUDA_NVML_ENTER();
  return kSuccess;
}

int nvmlShutdown(void) {
  SIMCUDA_NVML_ENTER();
  return kSuccess;
}

const char* nvmlErrorString(int result) {
  SIMCUDA_NVML_ENTER();
  switch (result) {
    case kSuccess:
      return "Success";
    case kInvalidArgument:
      return "Invalid Argument";
    case kNotSupported:
      return "Not Supported";
    case kNotFound:
      return "Not Found";
    default:
      return "Unknown Error";
  }
}

int nvmlSystemGetCudaDriverVersion_v2(int* version) {
  SIMCUDA_NVML_ENTER();
  if (version == nullptr) return kInvalidArgument;
  *version = kCudaDriverVersion;
  return kSuccess;
}

int nvmlDeviceGetCount_v2(unsigned int* count) {
  SIMCUDA_NVML_ENTER();
  if (count == nullptr) return kInvalidArgument;
  *count = static_cast<unsigned int>(DeviceCount());
  return kSuccess;
}

int nvmlDeviceGetHandleByIndex_v2(unsigned int index, FakeNvmlDevice** device) {
  SIMCUDA_NVML_ENTER();
  if (device == nullptr || index >= static_cast<unsigned int>(DeviceCount()) ||
      index >= kMaxDevices) {
    return kInvalidArgument;
  }
  *device = Device(static_cast<int>(index));
  return kSuccess;
}

// "domain:bus:device.function" in hex, as torch formats cudaDeviceProp's ids;
// the simulated devices sit on domain 0, bus 0x10 + index, device 0.
int nvmlDeviceGetHandleByPciBusId_v2(const char* pci_bus_id, FakeNvmlDevice** device) {
  SIMCUDA_NVML_ENTER();
  unsigned int domain = 0, bus = 0, slot = 0;
  if (pci_bus_id == nullptr || device == nullptr ||
      std::sscanf(pci_bus_id, "%x:%x:%x", &domain, &bus, &slot) != 3) {
    return kInvalidArgument;
  }
  const int index = static_cast<int>(bus) - 0x10;
  if (domain != 0 || slot != 0 || index < 0 || index >= DeviceCount() || index >= kMaxDevices) {
    return kNotFound;
  }
  *device = Device(index);
  return kSuccess;
}

int nvmlDeviceGetNvLinkRemoteDeviceType(FakeNvmlDevice* device, unsigned int link, int* type) {
  SIMCUDA_NVML_ENTER();
  return kNotSupported;  // no NVLink
}

int nvmlDeviceGetNvLinkRemotePciInfo_v2(FakeNvmlDevice* device, unsigned int link, void* pci) {
  SIMCUDA_NVML_ENTER();
  return kNotSupported;
}

// No process is reported: the simulated device's users are not tracked.
int nvmlDeviceGetComputeRunningProcesses(FakeNvmlDevice* device, unsigned int* count, void* infos) {
  SIMCUDA_NVML_ENTER();
  if (device == nullptr || count == nullptr) return kInvalidArgument;
  *count = 0;
  return kSuccess;
}

}  // extern "C"
