// Default costs of the simulated calls and the SIMCUDA_COSTS override (see
// cost_model.h). Sources: tests/simcuda/README.md, "Cost model".
#include "common/cost_model.h"

#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>

namespace simcuda {
namespace {

constexpr uint64_t kUs = 1000;

// name -> default cost. Measured: cudaMalloc, cudaFree, cudaEventRecord,
// cudaGetDevice, cudaGetLastError (nvprof means over 100k calls,
// StephenSwat/cub-allocator). Everything else is an assumption of the same
// order, documented as such; SIMCUDA_COSTS replaces any of them.
const std::map<std::string, CallCost>& Defaults() {
  static const auto* defaults = new std::map<std::string, CallCost>{
      // Runtime allocation calls (measured).
      {"cudaMalloc", {66400, false}},
      {"cudaFree", {41700, true}},  // cudaFree synchronizes the device
      {"cudaEventRecord", {573, false}},
      {"cudaEventRecordWithFlags", {573, false}},
      {"cudaGetDevice", {300, false}},
      {"cudaGetLastError", {124, false}},
      // Runtime calls (assumed).
      {"cudaSetDevice", {300, false}},
      {"cudaMemGetInfo", {10 * kUs, false}},
      {"cudaMallocHost", {66400, false}},
      {"cudaHostAlloc", {66400, false}},
      {"cudaFreeHost", {41700, true}},
      {"cudaEventCreate", {1 * kUs, false}},
      {"cudaEventCreateWithFlags", {1 * kUs, false}},
      {"cudaEventDestroy", {1 * kUs, false}},
      {"cudaEventQuery", {300, false}},
      {"cudaStreamWaitEvent", {1 * kUs, false}},
      {"cudaEventSynchronize", {10 * kUs, true}},
      {"cudaStreamSynchronize", {10 * kUs, true}},
      {"cudaDeviceSynchronize", {10 * kUs, true}},
      {"cudaDeviceEnablePeerAccess", {100 * kUs, false}},
      {"cudaIpcGetMemHandle", {10 * kUs, false}},
      {"cudaIpcOpenMemHandle", {100 * kUs, false}},
      {"cudaIpcCloseMemHandle", {50 * kUs, false}},
      // Driver virtual memory calls (assumed; PyTorch's note: the cost of
      // mapping grows with the number of physical handles, and changing
      // mappings involves synchronous work on the GPU).
      {"cuMemAddressReserve", {10 * kUs, false}},
      {"cuMemAddressFree", {10 * kUs, false}},
      {"cuMemCreate", {20 * kUs, false}},
      {"cuMemRelease", {10 * kUs, false}},
      {"cuMemMap", {5 * kUs, false}},
      {"cuMemSetAccess", {20 * kUs, false}},
      {"cuMemUnmap", {20 * kUs, true}},
      {"cuMemExportToShareableHandle", {10 * kUs, false}},
      {"cuMemImportFromShareableHandle", {10 * kUs, false}},
  };
  return *defaults;
}

// SIMCUDA_COSTS, parsed once: name -> cost (keeping the default's
// synchronizing mark).
const std::map<std::string, uint64_t>& Overrides() {
  static const auto* overrides = [] {
    auto* parsed = new std::map<std::string, uint64_t>;
    const char* env = std::getenv("SIMCUDA_COSTS");
    if (env == nullptr) return parsed;
    std::string all(env);
    size_t start = 0;
    while (start <= all.size()) {
      size_t end = all.find_first_of(";,", start);
      if (end == std::string::npos) end = all.size();
      const std::string item = all.substr(start, end - start);
      start = end + 1;
      if (item.empty()) continue;
      const size_t eq = item.find('=');
      uint64_t ns = 0;
      if (eq == std::string::npos || !ParseDurationNs(item.substr(eq + 1), &ns)) {
        std::fprintf(stderr, "simcuda: ignoring SIMCUDA_COSTS item '%s'\n", item.c_str());
        continue;
      }
      (*parsed)[item.substr(0, eq)] = ns;
    }
    return parsed;
  }();
  return *overrides;
}

}  // namespace

CallCost CostOf(const std::string& name) {
  CallCost cost;
  auto it = Defaults().find(name);
  if (it != Defaults().end()) cost = it->second;
  auto over = Overrides().find(name);
  if (over != Overrides().end()) cost.ns = over->second;
  return cost;
}

bool ParseDurationNs(const std::string& text, uint64_t* ns) {
  char* end = nullptr;
  const double value = std::strtod(text.c_str(), &end);
  if (end == text.c_str() || value < 0) return false;
  const std::string unit(end);
  double scale = 0;
  if (unit.empty() || unit == "ns")
    scale = 1;
  else if (unit == "us")
    scale = 1e3;
  else if (unit == "ms")
    scale = 1e6;
  else if (unit == "s")
    scale = 1e9;
  else
    return false;
  *ns = static_cast<uint64_t>(value * scale + 0.5);
  return true;
}

}  // namespace simcuda
