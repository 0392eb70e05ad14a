#include "torchmem/torch/cpu_allocator.h"

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <mutex>
#include <string>
#include <typeinfo>

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

// The RTTI name of c10::DefaultCPUAllocator (Itanium ABI), the only type the
// stand-in takes the place of.
constexpr const char kDefaultCpuAllocatorTypeName[] = "N3c1019DefaultCPUAllocatorE";

static_assert(sizeof(c10::Allocator) == sizeof(void*),
              "c10::Allocator gained data members: the default allocator stand-in assumes an "
              "object that is only a vtable pointer");

// True while CPU memory comes from the engine (between install and uninstall).
std::atomic<bool> serving{false};

// A copy of the original default allocator object (its vtable pointer), through
// which the stand-in calls c10's own code. DefaultCPUAllocator reads no members.
alignas(c10::Allocator) unsigned char original_object[sizeof(void*)];
c10::Allocator* original = nullptr;
c10::DeleterFnPtr original_raw_deleter = nullptr;  // the default allocator's
c10::DeleterFnPtr previous_raw_deleter = nullptr;  // the registered allocator's, before install

void ReportFreeError(const absl::Status& status) {
  // A deleter cannot throw (it runs in destructors); the pool is intact, so
  // report and go on.
  std::fprintf(stderr, "%s\n", std::string(status.message()).c_str());
}

void FreeCpuBlock(void* ptr) {
  if (ptr == nullptr) return;
  absl::Status freed = CpuEngine().Free(ptr);
  if (!freed.ok()) ReportFreeError(freed);
}

// Frees `ptr` if the engine owns it, else hands it to `other` (the allocator that made
// it). A pointer inside an engine segment that is not a block start is an error, never
// handed on.
void FreeOwnedOrForward(void* ptr, c10::DeleterFnPtr other) {
  if (ptr == nullptr) return;
  absl::Status freed = CpuEngine().Free(ptr);
  if (freed.ok()) return;
  if (absl::IsNotFound(freed) && !CpuEngine().SegmentContaining(ptr).ok() && other != nullptr) {
    other(ptr);
    return;
  }
  ReportFreeError(freed);
}

void FreeOwnedOrDefault(void* ptr) { FreeOwnedOrForward(ptr, original_raw_deleter); }
void FreeOwnedOrPrevious(void* ptr) { FreeOwnedOrForward(ptr, previous_raw_deleter); }

c10::DataPtr AllocateFromEngine(std::size_t n) {
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

// Registered with c10::SetCPUAllocator when the stand-in cannot serve door 1.
class TorchmemCpuAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(std::size_t n) override { return AllocateFromEngine(n); }
  c10::DeleterFnPtr raw_deleter() const override { return &FreeOwnedOrPrevious; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
};

// Takes the place of c10's default CPU allocator object (see the header).
class DefaultAllocatorStandIn final : public c10::Allocator {
 public:
  c10::DataPtr allocate(std::size_t n) override {
    if (serving.load(std::memory_order_acquire)) return AllocateFromEngine(n);
    return original->allocate(n);
  }
  c10::DeleterFnPtr raw_deleter() const override { return &FreeOwnedOrDefault; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
};
static_assert(sizeof(DefaultAllocatorStandIn) == sizeof(void*));

struct CpuInstallState {
  std::mutex mutex;
  bool installed = false;
  bool registered = false;  // torchmem's allocator was set with SetCPUAllocator
  c10::Allocator* previous = nullptr;
  bool takeover_tried = false;
  DefaultAllocatorRoute route;
};

CpuInstallState& InstallState() {
  static CpuInstallState* state = new CpuInstallState;
  return *state;
}

TorchmemCpuAllocator& RegisteredAllocator() {
  static TorchmemCpuAllocator* allocator = new TorchmemCpuAllocator;
  return *allocator;
}

// True if [address, address + size) lies in one writable mapping of this process.
bool IsWritable(const void* address, std::size_t size) {
  std::ifstream maps("/proc/self/maps");
  const auto begin = reinterpret_cast<std::uintptr_t>(address);
  std::string line;
  while (std::getline(maps, line)) {
    std::uintptr_t low = 0, high = 0;
    char perms[5] = {};
    if (std::sscanf(line.c_str(), "%lx-%lx %4s", &low, &high, perms) != 3) continue;
    if (begin >= low && begin + size <= high) return perms[1] == 'w';
  }
  return false;
}

// Puts the stand-in in place of c10's default CPU allocator, once per process.
// Returns why not when it cannot. Caller holds the install mutex.
DefaultAllocatorRoute TakeOverDefaultAllocator() {
  c10::Allocator* target = c10::GetDefaultCPUAllocator();
  if (target == nullptr) return {false, "c10::GetDefaultCPUAllocator() returned no allocator"};
  const char* type_name = typeid(*target).name();
  if (std::strcmp(type_name, kDefaultCpuAllocatorTypeName) != 0) {
    return {false,
            absl::StrFormat("c10's default CPU allocator is a %s, not the c10::DefaultCPUAllocator "
                            "torchmem knows how to stand in for",
                            type_name)};
  }
  if (!IsWritable(target, sizeof(void*))) {
    return {false, "c10's default CPU allocator lies in read-only memory"};
  }
  std::memcpy(original_object, static_cast<const void*>(target), sizeof(void*));
  original = reinterpret_cast<c10::Allocator*>(original_object);
  original_raw_deleter = original->raw_deleter();
  static DefaultAllocatorStandIn* prototype = new DefaultAllocatorStandIn;
  void* stand_in_vtable = nullptr;
  std::memcpy(&stand_in_vtable, static_cast<const void*>(prototype), sizeof(void*));
  std::atomic_ref<void*>(*reinterpret_cast<void**>(target))
      .store(stand_in_vtable, std::memory_order_release);
  return {true, ""};
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
  CpuEngine();  // before any deleter may need it
  if (!state.takeover_tried) {
    state.route = TakeOverDefaultAllocator();
    state.takeover_tried = true;
  }
  c10::Allocator* previous = c10::GetCPUAllocator();
  const bool default_serves_both =
      state.route.taken_over && previous == c10::GetDefaultCPUAllocator();
  if (!default_serves_both) {
    previous_raw_deleter = previous->raw_deleter();
    c10::SetCPUAllocator(&RegisteredAllocator(), kCpuAllocatorPriority);
    if (c10::GetCPUAllocator() != &RegisteredAllocator()) {
      return absl::FailedPreconditionError(
          "torchmem: c10 kept its current CPU allocator: another library registered one with a "
          "higher priority, so CPU tensors cannot be routed through torchmem");
    }
    state.previous = previous;
    state.registered = true;
  }
  serving.store(true, std::memory_order_release);
  state.installed = true;
  return absl::OkStatus();
}

absl::Status UninstallCpuAllocator() {
  CpuInstallState& state = InstallState();
  std::lock_guard<std::mutex> lock(state.mutex);
  if (!state.installed) return absl::OkStatus();
  if (state.registered) {
    if (c10::GetCPUAllocator() != &RegisteredAllocator()) {
      return absl::FailedPreconditionError(
          "torchmem: the CPU allocator was replaced by someone else after torchmem installed; "
          "not restoring over it");
    }
    c10::SetCPUAllocator(state.previous, kCpuAllocatorPriority);
    state.registered = false;
  }
  serving.store(false, std::memory_order_release);
  state.installed = false;
  return absl::OkStatus();
}

bool IsCpuAllocatorInstalled() {
  CpuInstallState& state = InstallState();
  std::lock_guard<std::mutex> lock(state.mutex);
  return state.installed;
}

DefaultAllocatorRoute GetDefaultAllocatorRoute() {
  CpuInstallState& state = InstallState();
  std::lock_guard<std::mutex> lock(state.mutex);
  if (!state.takeover_tried) return {false, "torchmem has not been installed for CPU tensors"};
  return state.route;
}

void* DefaultAllocatorRawAllocate(std::size_t bytes) {
  return c10::GetDefaultCPUAllocator()->raw_allocate(bytes);
}

void DefaultAllocatorRawDeallocate(void* ptr) {
  c10::GetDefaultCPUAllocator()->raw_deallocate(ptr);
}

}  // namespace torchmem::torch_glue
