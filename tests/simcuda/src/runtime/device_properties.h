// What the simulated device reports about itself: a CUDA-13 cudaDeviceProp
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
constexpr int kRuntimeVersion = 13000;
constexpr int kDriverVersion = 13000;

void FillDeviceProperties(int device, uint64_t capacity, cudaDeviceProp* prop);

// Returns false for attributes outside CUDA's enumeration; attributes the
// simulation has no figure for read as 0.
bool DeviceAttribute(const cudaDeviceProp& prop, int attr, int* value);

}  // namespace rt
}  // namespace simcuda

#endif  // TORCHMEM_TESTS_SIMCUDA_SRC_RUNTIME_DEVICE_PROPERTIES_H_
