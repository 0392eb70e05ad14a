#include "torchmem/torch/cpu_allocator.h"

#include <cstdio>
#include <mutex>
#include <string>

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>

#include "absl/strings/str_format.h"
#include "torchmem/backends/host_backend.h"

namespace torchmem::torch_glue {
namespace {

// c10's default CPU allocator is registered at priority 0; using the same
// priority lets us replace it and restore it later.
constexpr std::uint8_t kCpuAllocatorPriority = 0;

void FreeCpuBlock(void* ptr) {
  if (ptr == nullptr) return;
  absl::Status freed = CpuEngine().Free(ptr);
  // A deleter cannot throw (it runs in destructors); the pool is intact,
  // so report and go on.
  if (!freed.ok()) std::fprintf(stderr, "%s\n", std::string(freed.message()).c_str());
}

class TorchmemCpuAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(std::size_t n) override {
    // PyTorch's own CPU allocator returns a null pointer for 0 bytes.
    if (n == 0) return {nullptr, nullptr, &FreeCpuBlock, c10::Device(c10::DeviceType::CPU)};
    absl::StatusOr<void*> ptr = CpuEngine().Allocate(n);
    if (!ptr.ok()) {
      const std::string message(ptr.status().message());
      TORCH_CHECK_WITH(OutOfMemoryError, !absl::IsResourceExhausted(ptr.status()), message);
      TORCH_CHECK(false, message);
    }
    // ctx == data keeps the pointer "simple", which copy-on-write needs.
    return {*ptr, *ptr, &FreeCpuBlock, c10::Device(c10::DeviceType::CPU)};
  }

  c10::DeleterFnPtr raw_deleter() const override { return &FreeCpuBlock; }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
};

struct CpuInstallState {
  std::mutex mutex;
  c10::Allocator* previous = nullptr;
  bool installed = false;
};

CpuInstallState& InstallState() {
  static CpuInstallState* state = new CpuInstallState;
  return *state;
}

TorchmemCpuAllocator& Allocator() {
  static TorchmemCpuAllocator* allocator = new TorchmemCpuAllocator;
  return *allocator;
}

}  // namespace

Engine& CpuEngine() {
  static Engine* engine = new Engine(std::make_unique<HostBackend>());
  return *engine;
}

absl::Status InstallCpuAllocator() {
  CpuInstallState& state = InstallState();
  std::lock_guard<std::mutex> lock(state.mutex);
  if (state.installed) return absl::OkStatus();
  c10::Allocator* previous = c10::GetCPUAllocator();
  c10::SetCPUAllocator(&Allocator(), kCpuAllocatorPriority);
  if (c10::GetCPUAllocator() != &Allocator()) {
    return absl::FailedPreconditionError(
        "torchmem: c10 kept its current CPU allocator: another library registered one with a "
        "higher priority, so CPU tensors cannot be routed through torchmem");
  }
  state.previous = previous;
  state.installed = true;
  return absl::OkStatus();
}

absl::Status UninstallCpuAllocator() {
  CpuInstallState& state = InstallState();
  std::lock_guard<std::mutex> lock(state.mutex);
  if (!state.installed) return absl::OkStatus();
  if (c10::GetCPUAllocator() != &Allocator()) {
    return absl::FailedPreconditionError(
        "torchmem: the CPU allocator was replaced by someone else after torchmem installed; "
        "not restoring over it");
  }
  c10::SetCPUAllocator(state.previous, kCpuAllocatorPriority);
  state.installed = false;
  return absl::OkStatus();
}

bool IsCpuAllocatorInstalled() {
  CpuInstallState& state = InstallState();
  std::lock_guard<std::mutex> lock(state.mutex);
  return state.installed;
}

}  // namespace torchmem::torch_glue
