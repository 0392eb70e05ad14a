// The fake runtime's link to the fake driver (libcuda.so.1), which it loads
// only when asked for a driver entry point or for the driver's counters.
#ifndef TORCHMEM_TESTS_SIMCUDA_SRC_RUNTIME_DRIVER_LINK_H_
#define TORCHMEM_TESTS_SIMCUDA_SRC_RUNTIME_DRIVER_LINK_H_

namespace simcuda {
namespace rt {

// dlopen handle of the fake driver, or nullptr if it cannot be found. The
// driver is recognised by its simcuda_driver_* exports, so a real NVIDIA
// driver is never used.
void* DriverLibrary();

}  // namespace rt
}  // namespace simcuda

#endif  // TORCHMEM_TESTS_SIMCUDA_SRC_RUNTIME_DRIVER_LINK_H_
