// The simcuda_* control API (simcuda_control.h): device configuration,
// completion of stream work, faults and counters. Driver call names are
// forwarded to the fake driver's simcuda_driver_* functions.
#include <dlfcn.h>

#include <cstdlib>
#include <string>

#include "common/call_registry.h"
#include "runtime/api_entry.h"
#include "runtime/driver_link.h"
#include "runtime/machine.h"
#include "simcuda_control.h"

using simcuda::rt::CurrentDevice;
using simcuda::rt::EventMode;
using simcuda::rt::Machine;

namespace {

// A simcuda_driver_* function of the fake driver, or nullptr.
template <typename Fn>
Fn DriverControl(const char* name) {
  void* driver = simcuda::rt::DriverLibrary();
  return driver ? reinterpret_cast<Fn>(dlsym(driver, name)) : nullptr;
}

bool IsRuntimeCall(const std::string& name) { return !simcuda::IsDriverCallName(name); }

// SIMCUDA_FAULTS is armed when the library loads (a getenv when unset), so
// that it applies from the first call of any kind.
__attribute__((constructor)) void ArmFaultsFromEnvironment() {
  if (const char* spec = std::getenv("SIMCUDA_FAULTS")) {
    simcuda::ArmFaultsFromSpec(spec, IsRuntimeCall, simcuda::rt::RuntimeErrorByName,
                               static_cast<int>(cudaErrorUnknown));
  }
}

}  // namespace

extern "C" {

int simcuda_is_simulated(void) { return 1; }

int simcuda_set_device_count(int count) { return Machine::Get().SetDeviceCount(count); }

int simcuda_get_device_count(void) { return Machine::Get().DeviceCount(); }

int simcuda_set_memory_capacity(int device, unsigned long long bytes) {
  return Machine::Get().SetCapacity(device, bytes);
}

unsigned long long simcuda_get_memory_capacity(int device) {
  return Machine::Get().Capacity(device);
}

unsigned long long simcuda_live_bytes(int device) { return Machine::Get().UsedBytes(device); }

unsigned long long simcuda_peak_bytes(int device) { return Machine::Get().PeakBytes(device); }

unsigned long long simcuda_live_allocations(int device) {
  return Machine::Get().LiveAllocations(device);
}

void simcuda_reset_peak_bytes(int device) { Machine::Get().ResetPeak(device); }

int simcuda_set_event_mode(int mode) {
  if (mode != SIMCUDA_EVENT_MODE_IMMEDIATE && mode != SIMCUDA_EVENT_MODE_MANUAL) {
    return cudaErrorInvalidValue;
  }
  Machine::Get().SetMode(static_cast<EventMode>(mode));
  return cudaSuccess;
}

int simcuda_get_event_mode(void) { return static_cast<int>(Machine::Get().mode()); }

int simcuda_complete_stream(void* stream) {
  return Machine::Get().CompleteStream(static_cast<cudaStream_t>(stream), CurrentDevice());
}

int simcuda_complete_event(void* event) {
  return Machine::Get().CompleteEvent(static_cast<cudaEvent_t>(event));
}

int simcuda_complete_all(void) {
  Machine::Get().SynchronizeDevice(-1);
  return cudaSuccess;
}

unsigned long long simcuda_pending_work(void* stream) {
  return Machine::Get().PendingWorkCount(static_cast<cudaStream_t>(stream), CurrentDevice());
}

int simcuda_inject_fault(const char* call, unsigned long long skip, unsigned long long count,
                         int error) {
  if (call == nullptr || count == 0) return cudaErrorInvalidValue;
  if (simcuda::IsDriverCallName(call)) {
    auto arm = DriverControl<void (*)(const char*, unsigned long long, unsigned long long, int)>(
        "simcuda_driver_inject_fault");
    if (arm == nullptr) return cudaErrorNotSupported;
    arm(call, skip, count, error);
    return cudaSuccess;
  }
  simcuda::ArmFault(call, skip, count, error);
  return cudaSuccess;
}

int simcuda_fail_nth(const char* call, unsigned long long n, int error) {
  if (n == 0) return cudaErrorInvalidValue;
  return simcuda_inject_fault(call, n - 1, 1, error);
}

int simcuda_fail_next(const char* call, unsigned long long k, int error) {
  return simcuda_inject_fault(call, 0, k, error);
}

void simcuda_clear_faults(void) {
  simcuda::ClearFaults();
  if (auto clear = DriverControl<void (*)()>("simcuda_driver_clear_faults")) clear();
}

int simcuda_error_code(const char* name) {
  if (name == nullptr) return -1;
  const int code = simcuda::rt::RuntimeErrorByName(name);
  if (code >= 0) return code;
  auto driver_code = DriverControl<int (*)(const char*)>("simcuda_driver_error_code");
  return driver_code ? driver_code(name) : -1;
}

unsigned long long simcuda_call_count(const char* call) {
  if (call == nullptr) return 0;
  if (simcuda::IsDriverCallName(call)) {
    auto count = DriverControl<unsigned long long (*)(const char*)>("simcuda_driver_call_count");
    return count ? count(call) : 0;
  }
  return simcuda::CallCount(call);
}

void simcuda_reset_call_counts(void) {
  simcuda::ResetCallCounts();
  if (auto reset = DriverControl<void (*)()>("simcuda_driver_reset_call_counts")) reset();
}

unsigned long long simcuda_modelled_ns(const char* call) {
  auto driver_ns = DriverControl<unsigned long long (*)(const char*)>("simcuda_driver_modelled_ns");
  if (call == nullptr) return simcuda::ModelledNs("") + (driver_ns ? driver_ns(nullptr) : 0);
  if (simcuda::IsDriverCallName(call)) return driver_ns ? driver_ns(call) : 0;
  return simcuda::ModelledNs(call);
}

unsigned long long simcuda_synchronizing_calls(void) {
  auto driver = DriverControl<unsigned long long (*)()>("simcuda_driver_synchronizing_calls");
  return simcuda::SynchronizingCalls() + (driver ? driver() : 0);
}

int simcuda_set_call_cost(const char* call, unsigned long long ns) {
  if (call == nullptr) return cudaErrorInvalidValue;
  if (simcuda::IsDriverCallName(call)) {
    auto set =
        DriverControl<void (*)(const char*, unsigned long long)>("simcuda_driver_set_call_cost");
    if (set == nullptr) return cudaErrorNotSupported;
    set(call, ns);
    return cudaSuccess;
  }
  simcuda::SetCallCost(call, ns);
  return cudaSuccess;
}

int simcuda_context_active(int device) { return Machine::Get().ContextActive(device) ? 1 : 0; }

int simcuda_context_count(void) { return Machine::Get().ContextCount(); }

void simcuda_set_exclusive_process_dir(const char* dir) {
  Machine::Get().SetExclusiveProcessDir(dir == nullptr ? std::string() : std::string(dir));
}

int simcuda_write_trace(const char* path) {
  if (path == nullptr || !simcuda::WriteTrace(path)) return cudaErrorInvalidValue;
  if (auto write = DriverControl<int (*)(const char*)>("simcuda_driver_write_trace")) {
    if (write(path) != 0) return cudaErrorInvalidValue;
  }
  return cudaSuccess;
}

void simcuda_reset(void) {
  Machine::Get().Reset();
  simcuda_clear_faults();
  (void)cudaGetLastError();
  simcuda_reset_call_counts();
}

}  // extern "C"
