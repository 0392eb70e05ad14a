// Machine construction from the SIMCUDA_* environment, and the device table
// (count, capacity, usage figures).
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "runtime/api_entry.h"
#include "runtime/machine.h"

namespace simcuda {
namespace rt {
namespace {

constexpr int kMaxDevices = 64;

}  // namespace

Machine& Machine::Get() {
  static Machine* machine = new Machine;
  return *machine;
}

Machine::Machine() {
  int count = 1;
  if (const char* env = std::getenv("SIMCUDA_DEVICE_COUNT")) {
    char* end = nullptr;
    long value = std::strtol(env, &end, 10);
    if (end != env && *end == '\0' && value >= 0 && value <= kMaxDevices) {
      count = static_cast<int>(value);
    } else {
      std::fprintf(stderr, "simcuda: ignoring SIMCUDA_DEVICE_COUNT=%s\n", env);
    }
  }
  // SIMCUDA_MEMORY_BYTES: one size for every device ("80G"), or a
  // comma-separated list, one per device (the last repeats).
  std::vector<uint64_t> capacities;
  if (const char* env = std::getenv("SIMCUDA_MEMORY_BYTES")) {
    std::string list(env);
    size_t start = 0;
    while (start <= list.size()) {
      size_t comma = list.find(',', start);
      if (comma == std::string::npos) comma = list.size();
      uint64_t bytes = 0;
      std::string item = list.substr(start, comma - start);
      if (ParseBytes(item.c_str(), &bytes)) {
        capacities.push_back(bytes);
      } else {
        std::fprintf(stderr, "simcuda: ignoring SIMCUDA_MEMORY_BYTES item '%s'\n", item.c_str());
      }
      start = comma + 1;
    }
  }
  if (!capacities.empty()) default_capacity_ = capacities.back();
  if (const char* env = std::getenv("SIMCUDA_EVENT_MODE")) {
    if (std::strcmp(env, "manual") == 0) {
      mode_ = EventMode::kManual;
    } else if (std::strcmp(env, "immediate") != 0) {
      std::fprintf(stderr, "simcuda: ignoring SIMCUDA_EVENT_MODE=%s\n", env);
    }
  }
  if (const char* env = std::getenv("SIMCUDA_EXCLUSIVE_PROCESS_DIR")) exclusive_dir_ = env;
  initial_mode_ = mode_;
  initial_capacities_ = capacities;
  SetDeviceCount(count);
}

int Machine::DeviceCount() {
  std::lock_guard<std::mutex> lock(mu_);
  return visible_devices_;
}

cudaError_t Machine::SetDeviceCount(int count) {
  if (count < 0 || count > kMaxDevices) return cudaErrorInvalidValue;
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t d = count; d < devices_.size(); ++d) {
    if (devices_[d]->live_allocations != 0) return cudaErrorInvalidValue;
  }
  // Devices beyond the new count keep their state (streams stay valid); the
  // table only grows.
  while (devices_.size() < static_cast<size_t>(count)) {
    auto device = std::make_unique<DeviceState>();
    device->capacity = devices_.size() < initial_capacities_.size()
                           ? initial_capacities_[devices_.size()]
                           : default_capacity_;
    device->legacy_stream = std::make_unique<CUstream_st>();
    device->legacy_stream->id = next_stream_id_++;
    device->legacy_stream->device = static_cast<int>(devices_.size());
    device->legacy_stream->builtin = true;
    streams_[device->legacy_stream->id] = device->legacy_stream.get();
    devices_.push_back(std::move(device));
  }
  visible_devices_ = count;
  return cudaSuccess;
}

bool Machine::ValidDevice(int device) {
  std::lock_guard<std::mutex> lock(mu_);
  return device >= 0 && device < visible_devices_;
}

DeviceState* Machine::DeviceLocked(int device) {
  if (device < 0 || device >= visible_devices_) return nullptr;
  return devices_[device].get();
}

uint64_t Machine::Capacity(int device) {
  std::lock_guard<std::mutex> lock(mu_);
  DeviceState* d = DeviceLocked(device);
  return d ? d->capacity : 0;
}

cudaError_t Machine::SetCapacity(int device, uint64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  if (device == -1) {
    default_capacity_ = bytes;
    for (auto& d : devices_) d->capacity = bytes;
    return cudaSuccess;
  }
  DeviceState* d = DeviceLocked(device);
  if (d == nullptr) return cudaErrorInvalidDevice;
  d->capacity = bytes;
  return cudaSuccess;
}

uint64_t Machine::UsedBytes(int device) {
  std::lock_guard<std::mutex> lock(mu_);
  DeviceState* d = DeviceLocked(device);
  return d ? d->used : 0;
}

uint64_t Machine::PeakBytes(int device) {
  std::lock_guard<std::mutex> lock(mu_);
  DeviceState* d = DeviceLocked(device);
  return d ? d->peak : 0;
}

uint64_t Machine::LiveAllocations(int device) {
  std::lock_guard<std::mutex> lock(mu_);
  DeviceState* d = DeviceLocked(device);
  return d ? d->live_allocations : 0;
}

void Machine::ResetPeak(int device) {
  std::lock_guard<std::mutex> lock(mu_);
  if (DeviceState* d = DeviceLocked(device)) d->peak = d->used;
}

}  // namespace rt
}  // namespace simcuda
