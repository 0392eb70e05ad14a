// Per-call bookkeeping shared by the fake runtime and the fake driver: call
// counters, fault injection, the "unsupported" notice and the SIMCUDA_TRACE
// report. Each library links its own copy, so runtime and driver keep
// separate registries (the runtime's control API forwards cu* names to the
// driver's copy).
//
// Invariants: a CallSite lives until process exit (never freed, so calls made
// from other libraries' static destructors stay safe); counting a call is one
// relaxed atomic add; the fault path takes the registry lock only while a
// fault is armed for that call.
#ifndef TORCHMEM_TESTS_SIMCUDA_SRC_COMMON_CALL_REGISTRY_H_
#define TORCHMEM_TESTS_SIMCUDA_SRC_COMMON_CALL_REGISTRY_H_

#include <atomic>
#include <cstdint>
#include <string>
#include <utility>

#include "common/cost_model.h"

namespace simcuda {

// One entry point of the simulated API.
struct CallSite {
  explicit CallSite(std::string n) : name(std::move(n)) {
    const CallCost cost = CostOf(name);
    cost_ns.store(cost.ns);
    synchronizing = cost.synchronizing;
  }
  const std::string name;
  // The cost model (cost_model.h): time one call would take on a GPU, the
  // modelled time of all calls over the process's life (and at the last
  // reset), and whether the call waits for the GPU.
  std::atomic<uint64_t> cost_ns{0};
  std::atomic<uint64_t> modelled_ns{0};
  std::atomic<uint64_t> modelled_ns_at_reset{0};
  bool synchronizing = false;
  // Calls over the process's life: the SIMCUDA_TRACE report. Never reset, so
  // a test that resets the counters does not erase what the process did.
  std::atomic<uint64_t> count{0};
  // `count` at the last ResetCallCounts(): CallCount() reports calls since.
  std::atomic<uint64_t> count_at_reset{0};
  std::atomic<bool> fault_armed{false};
  std::atomic<bool> unsupported{false};  // set when the stub first runs

  // Counts one call. Returns the error code to fail it with (injected fault),
  // or 0 to let the call proceed.
  int Hit();
};

// Returns the site for `name`, creating it on first use. Thread-safe.
CallSite* RegisterCall(const char* name);

// Count of calls made to `name` since the last ResetCallCounts() (0 if
// never called). The reset does not change what WriteTrace reports.
uint64_t CallCount(const char* name);
void ResetCallCounts();

// Modelled time (ns) of the calls to `name` since the last reset; of every
// call of this library when `name` is empty.
uint64_t ModelledNs(const std::string& name);
// Calls since the last reset that synchronize with the GPU (cost_model.h).
uint64_t SynchronizingCalls();
// Replaces the modelled cost of one call of `name` from now on.
void SetCallCost(const char* name, uint64_t ns);

// Arms a fault: after `skip` further calls of `name` succeed, the next
// `count` calls fail with `error`. Rules for one call queue in arming order.
void ArmFault(const char* name, uint64_t skip, uint64_t count, int error);
void ClearFaults();

// Parses a SIMCUDA_FAULTS-style spec ("cudaMalloc:nth=3:error=2;..."),
// arming the rules whose call name `accept` returns true for. Returns false
// (and prints why) on a malformed spec. `error_by_name` maps an error
// identifier such as cudaErrorMemoryAllocation to its code (-1 if unknown).
bool ArmFaultsFromSpec(const char* spec, bool (*accept)(const std::string&),
                       int (*error_by_name)(const std::string&), int default_error);

// Driver calls are named cu* but not cuda*; everything else is the runtime's.
bool IsDriverCallName(const std::string& name);

// Prints "simcuda: unsupported <name>" to stderr once per site.
void ReportUnsupported(CallSite* site);

// Appends "<label> <name> <count>[ unsupported]" lines for every site that
// was called in the process's life to `path` ("%p" in the path becomes the
// process id); <label> is the SIMCUDA_LIBRARY_LABEL the library was compiled
// with ("runtime" or "driver"). Returns false on I/O error. If SIMCUDA_TRACE is set, this runs
// by itself when the library is unloaded at process exit.
bool WriteTrace(const char* path);

// Parses sizes such as "80G", "512MiB", "1048576". Returns false if invalid.
bool ParseBytes(const char* text, uint64_t* bytes);

}  // namespace simcuda

#endif  // TORCHMEM_TESTS_SIMCUDA_SRC_COMMON_CALL_REGISTRY_H_
