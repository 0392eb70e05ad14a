// What the simulated device reports about itself: a cudaDeviceProp (of the
// CUDA version built against: the struct differs between 12 and 13)
// describing a compute capability 9.0 part named "torchmem simulated device"
// whose global memory is the simulated capacity, and the matching
// cudaDeviceGetAttribute values.
#ifndef TORCHMEM_TESTS_SIMCUDA_SRC_RUNTIME_DEVICE_PROPERTIES_H_
#define TORCHMEM_TESTS_SIMCUDA_SRC_RUNTIME_DEVICE_PROPERTIES_H_

#include <cuda_runtime_api.h>

#include <cstdint>

namespace simcuda {
namespace rt {

constexpr char kDeviceName[] = "torchmem simulated device";
// The runtime reports the toolkit's version, as NVIDIA's does; the driver is
// a CUDA 13 driver, which runs CUDA 12 and 13 programs alike.
constexpr int kRuntimeVersion = CUDART_VERSION;
constexpr int kDriverVersion = CUDART_VERSION > 13000 ? CUDART_VERSION : 13000;

void FillDeviceProperties(int device, uint64_t capacity, cudaDeviceProp* prop);

// Returns false for attributes outside CUDA's enumeration; attributes the
// simulation has no figure for read as 0.
bool DeviceAttribute(const cudaDeviceProp& prop, int attr, int* value);

}  // namespace rt
}  // namespace simcuda

#endif  // TORCHMEM_TESTS_SIMCUDA_SRC_RUNTIME_DEVICE_PROPERTIES_H_
