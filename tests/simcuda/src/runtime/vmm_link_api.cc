// The runtime's half of the link to the fake driver's virtual memory
// (common/vmm_link.h): capacity charges for physical allocations, the
// driver's mapping lookup, the range of the runtime's own allocations, and
// simcuda_vmm_stats (simcuda_control.h).
#include "common/vmm_link.h"

#include <dlfcn.h>

#include "runtime/driver_link.h"
#include "runtime/machine.h"
#include "simcuda_control.h"

using simcuda::rt::Machine;

extern "C" {

int simcuda_vmm_charge(int device, unsigned long long bytes) {
  return Machine::Get().ChargeDevice(device, bytes);
}

void simcuda_vmm_uncharge(int device, unsigned long long bytes) {
  Machine::Get().UnchargeDevice(device, bytes);
}

void simcuda_vmm_set_mapping_lookup(simcuda_mapping_lookup_fn lookup) {
  Machine::Get().SetMappingLookup(lookup);
}

int simcuda_vmm_allocation_range(uintptr_t ptr, uintptr_t* base, size_t* size) {
  simcuda::rt::Allocation a;
  if (!Machine::Get().LookupOwn(reinterpret_cast<const void*>(ptr), &a)) return 0;
  *base = a.base;
  *size = a.size;
  return 1;
}

// Forwarded to the driver, which owns the virtual memory.
void simcuda_vmm_stats(simcuda_vmm_stats_t* stats) {
  *stats = simcuda_vmm_stats_t();
  void* driver = simcuda::rt::DriverLibrary();
  auto counts = driver ? reinterpret_cast<void (*)(simcuda_vmm_stats_t*)>(
                             dlsym(driver, "simcuda_driver_vmm_stats"))
                       : nullptr;
  if (counts != nullptr) counts(stats);
}

}  // extern "C"
