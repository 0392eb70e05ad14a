// Primary contexts of the simulated devices: created by the first call that
// needs one, counted, and exclusive between processes in EXCLUSIVE_PROCESS
// mode (a lock file per device, held for the process's life, as a context
// lives until the process exits).
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <string>

#include "runtime/machine.h"

namespace simcuda {
namespace rt {

cudaError_t Machine::EnsureContext(int device) {
  std::lock_guard<std::mutex> lock(mu_);
  return EnsureContextLocked(device);
}

cudaError_t Machine::EnsureContextLocked(int device) {
  DeviceState* d = DeviceLocked(device);
  if (d == nullptr) return cudaErrorInvalidDevice;
  if (d->context) return cudaSuccess;
  if (!exclusive_dir_.empty()) {
    const std::string path = exclusive_dir_ + "/device" + std::to_string(device) + ".lock";
    const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0) return cudaErrorDevicesUnavailable;
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
      close(fd);
      return cudaErrorDevicesUnavailable;  // another process's context
    }
    d->exclusive_lock_fd = fd;
  }
  d->context = true;
  return cudaSuccess;
}

bool Machine::ContextActive(int device) {
  std::lock_guard<std::mutex> lock(mu_);
  DeviceState* d = DeviceLocked(device);
  return d != nullptr && d->context;
}

int Machine::ContextCount() {
  std::lock_guard<std::mutex> lock(mu_);
  int count = 0;
  for (int device = 0; device < visible_devices_; ++device) count += devices_[device]->context;
  return count;
}

bool Machine::ExclusiveProcessMode() {
  std::lock_guard<std::mutex> lock(mu_);
  return !exclusive_dir_.empty();
}

void Machine::SetExclusiveProcessDir(const std::string& dir) {
  std::lock_guard<std::mutex> lock(mu_);
  exclusive_dir_ = dir;
}

}  // namespace rt
}  // namespace simcuda
