// The link between the fake driver's virtual memory (cuMemCreate, cuMemMap,
// ...; src/driver/virtual_memory.h) and the fake runtime, which owns the
// devices' capacity and answers "is this device memory?" for copies and
// cudaPointerGetAttributes. Both libraries use these C functions; each side
// finds the other's with dlsym, so either library still loads alone.
//
// Runtime exports (the driver looks them up with dlsym(RTLD_DEFAULT, ...)):
//   simcuda_vmm_charge(device, bytes)    count a physical allocation against
//                                        the device's capacity: 0, or
//                                        cudaErrorMemoryAllocation (full) /
//                                        cudaErrorInvalidDevice
//   simcuda_vmm_uncharge(device, bytes)  give the bytes back
//   simcuda_vmm_set_mapping_lookup(fn)   the driver's answer for pointers the
//                                        runtime did not allocate itself
//   simcuda_vmm_allocation_range(...)    base and size of the runtime
//                                        allocation containing a pointer
//                                        (cuMemGetAddressRange of cudaMalloc
//                                        memory)
//
// Lock order: the driver may call the runtime while holding its own lock; the
// runtime calls the lookup only without holding its lock.
#ifndef TORCHMEM_TESTS_SIMCUDA_SRC_COMMON_VMM_LINK_H_
#define TORCHMEM_TESTS_SIMCUDA_SRC_COMMON_VMM_LINK_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Whether [ptr, ptr + bytes) lies in one run of adjacent mapped pages that
 * device `accessor` may at least read (cuMemSetAccess; accessor -1: any
 * device). If so, returns 1 and sets *device to the device owning the
 * physical memory at ptr and *base / *size to the whole accessible run
 * around ptr. Returns 0 otherwise. */
typedef int (*simcuda_mapping_lookup_fn)(uintptr_t ptr, size_t bytes, int accessor, int* device,
                                         uintptr_t* base, size_t* size);

int simcuda_vmm_charge(int device, unsigned long long bytes);
void simcuda_vmm_uncharge(int device, unsigned long long bytes);
void simcuda_vmm_set_mapping_lookup(simcuda_mapping_lookup_fn lookup);
/* 1 and the range if ptr lies in a runtime allocation (device, managed or
 * host), else 0. */
int simcuda_vmm_allocation_range(uintptr_t ptr, uintptr_t* base, size_t* size);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif  // TORCHMEM_TESTS_SIMCUDA_SRC_COMMON_VMM_LINK_H_
