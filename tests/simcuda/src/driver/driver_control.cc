// The fake driver's half of the control API: its own call counters, faults
// and trace, reached through the runtime's simcuda_* functions (which forward
// driver call names here) or directly with dlsym.
#include <cstdlib>
#include <string>

#include "common/call_registry.h"
#include "common/code_names.h"
#include "driver/driver_entry.h"
#include "driver/virtual_memory.h"
#include "simcuda_control.h"
#include "simcuda_tables.inc"

namespace {

int DriverErrorByName(const std::string& name) {
  return simcuda::CodeOf(kDriverErrorNames, name.c_str());
}

// SIMCUDA_FAULTS rules for driver calls are armed when the library loads.
__attribute__((constructor)) void ArmFaultsFromEnvironment() {
  if (const char* spec = std::getenv("SIMCUDA_FAULTS")) {
    simcuda::ArmFaultsFromSpec(spec, simcuda::IsDriverCallName, DriverErrorByName,
                               static_cast<int>(CUDA_ERROR_UNKNOWN));
  }
}

}  // namespace

extern "C" {

void simcuda_driver_inject_fault(const char* call, unsigned long long skip,
                                 unsigned long long count, int error) {
  simcuda::ArmFault(call, skip, count, error);
}

void simcuda_driver_clear_faults(void) { simcuda::ClearFaults(); }

int simcuda_driver_error_code(const char* name) { return DriverErrorByName(name); }

unsigned long long simcuda_driver_call_count(const char* call) { return simcuda::CallCount(call); }

void simcuda_driver_reset_call_counts(void) { simcuda::ResetCallCounts(); }

unsigned long long simcuda_driver_modelled_ns(const char* call) {
  return simcuda::ModelledNs(call == nullptr ? std::string() : std::string(call));
}

unsigned long long simcuda_driver_synchronizing_calls(void) {
  return simcuda::SynchronizingCalls();
}

void simcuda_driver_set_call_cost(const char* call, unsigned long long ns) {
  simcuda::SetCallCost(call, ns);
}

int simcuda_driver_write_trace(const char* path) { return simcuda::WriteTrace(path) ? 0 : 1; }

void simcuda_driver_vmm_stats(simcuda_vmm_stats_t* stats) {
  const simcuda::drv::VmmCounts c = simcuda::drv::VirtualMemory::Get().Counts();
  stats->reservations = c.reservations;
  stats->reserved_bytes = c.reserved_bytes;
  stats->allocations = c.allocations;
  stats->allocated_bytes = c.allocated_bytes;
  stats->mappings = c.mappings;
  stats->mapped_bytes = c.mapped_bytes;
  stats->accessible_bytes = c.accessible_bytes;
  stats->rdma_capable_allocations = c.rdma_capable_allocations;
}

}  // extern "C"
