// Which CUDA device's engine owns an address: every segment (cudaMalloc) and
// every virtual-memory range (cuMemAddressReserve) a CudaBackend obtains is
// registered here with its device until it is given back. A free, a
// recordStream or getBaseAllocation then goes to that one device's engine
// instead of asking each engine in turn under its lock.
//
// Thread-safe: lookups share a reader lock; registration (a segment or range
// obtained or released, rare) takes it exclusively.
#ifndef TORCHMEM_BACKENDS_CUDA_ADDRESS_REGISTRY_H_
#define TORCHMEM_BACKENDS_CUDA_ADDRESS_REGISTRY_H_

#include <cstddef>
#include <cstdint>

namespace torchmem {

void RegisterCudaAddressRange(std::uintptr_t base, std::size_t size, int device);
void UnregisterCudaAddressRange(std::uintptr_t base);
// The device whose backend obtained the range holding `address`, or -1.
int CudaDeviceOwning(std::uintptr_t address);

}  // namespace torchmem

#endif  // TORCHMEM_BACKENDS_CUDA_ADDRESS_REGISTRY_H_
