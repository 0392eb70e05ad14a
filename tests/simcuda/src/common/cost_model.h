// The simulated device's cost model: the time a real driver would take for
// each runtime and driver call that allocators make, and whether the call
// waits for the GPU (synchronizes). The simulated calls themselves cost host
// time only; each call adds its modelled time to a counter instead, so a test
// or a benchmark can say what a sequence of calls would cost on a GPU
// (simcuda_modelled_ns, simcuda_synchronizing_calls).
//
// Defaults come from published measurements where one exists and are marked
// as assumptions otherwise (tests/simcuda/README.md, "Cost model", lists
// each with its source). SIMCUDA_COSTS overrides them:
// "cuMemMap=5us;cudaMalloc=66.4us;cudaMemGetInfo=0" (units ns, us, ms, s;
// bare numbers are nanoseconds).
#ifndef TORCHMEM_TESTS_SIMCUDA_SRC_COMMON_COST_MODEL_H_
#define TORCHMEM_TESTS_SIMCUDA_SRC_COMMON_COST_MODEL_H_

#include <cstdint>
#include <string>

namespace simcuda {

struct CallCost {
  uint64_t ns = 0;             // modelled time of one call; 0: not charged
  bool synchronizing = false;  // the call waits for work on the GPU
};

// The cost of `name`: SIMCUDA_COSTS if it names the call, else the default.
CallCost CostOf(const std::string& name);

// Parses a duration such as "66.4us", "2ms", "500" (ns). False if invalid.
bool ParseDurationNs(const std::string& text, uint64_t* ns);

}  // namespace simcuda

#endif  // TORCHMEM_TESTS_SIMCUDA_SRC_COMMON_COST_MODEL_H_
