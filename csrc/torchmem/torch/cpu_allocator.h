// torchmem as PyTorch's CPU allocator.
//
// PyTorch asks for CPU memory through two doors:
//   1. c10::GetCPUAllocator(): the registered CPU allocator (c10::SetCPUAllocator),
//      used by torch.empty, every op's outputs, ...;
//   2. c10::GetDefaultCPUAllocator(): c10's built-in allocator object itself, used by
//      torch.UntypedStorage(n) (THPStorage_pynew), hence storage.clone() and
//      copy.deepcopy of CPU tensors, torch.load and frombuffer. SetCPUAllocator does not
//      reach it.
// Installing routes both to the process-wide CPU engine over host memory:
//   * the default allocator object is taken over by a stand-in (below); when c10's
//     registered allocator is that same object (the normal case) this serves door 1 too;
//   * otherwise (another library registered its own CPU allocator, or the stand-in could
//     not be put in place) torchmem registers itself with SetCPUAllocator, as before, and
//     door 2 stays PyTorch's (DefaultAllocatorRoute() says why).
// Uninstalling stops serving from the engine; the stand-in stays in place and forwards
// to c10's own code from then on.
//
// The stand-in. c10's DefaultCPUAllocator (c10/core/CPUAllocator.cpp, a static object
// that GetDefaultCPUAllocator() returns) has no data members: the object is its vtable
// pointer and nothing else, in every release from 2.0 to 2.15. The stand-in is a
// c10::Allocator subclass with no data members either; taking over writes its vtable
// pointer into that object (one aligned pointer-sized atomic store, once per process),
// after keeping a copy of the original object (its vtable pointer) through which it
// calls c10's own allocate/raw_deleter when not serving. What this assumes, checked at
// run time before anything is written (otherwise the fallback above):
//   * the object's dynamic type is c10::DefaultCPUAllocator (RTTI name), not the mobile
//     allocator or one a build replaced;
//   * sizeof(c10::Allocator) == sizeof(void*) (checked at compile time against the
//     installed headers; the vtable slots come from the same headers);
//   * the object lies in writable memory (/proc/self/maps);
//   * callers reach it through virtual calls (no LTO across libc10's boundary; c10's own
//     translation unit does not call it directly).
//
// Ownership and deleters. A DataPtr carries its deleter, so every tensor is freed by
// whoever allocated it, in any order across installs. raw_allocate/raw_deallocate pair
// through raw_deleter() instead: the stand-in's (and torchmem's registered allocator's)
// raw deleter frees a pointer the engine owns and hands any other pointer to the
// original allocator's deleter, so a raw allocation made before an install may be
// released during it and one made during an install after it. Because the stand-in
// never leaves, that holds after uninstall too.
//
// Threads and fork: whether to serve is one atomic flag read per allocation; the
// takeover is a single atomic pointer store, so a thread allocating concurrently sees the
// old or the new vtable, both valid. The engine is fork-safe (fork_safety.h); the flag
// and the stand-in are plain memory, inherited by a forked child.
//
// Nothing here is ever destroyed: tensors may outlive any install, and even static
// destruction.
#ifndef TORCHMEM_TORCH_CPU_ALLOCATOR_H_
#define TORCHMEM_TORCH_CPU_ALLOCATOR_H_

#include <string>

#include "absl/status/status.h"
#include "torchmem/core/engine.h"

namespace torchmem::torch_glue {

// The engine behind CPU tensors (created on first use, never destroyed).
Engine& CpuEngine();

// Idempotent. Fails if c10 refuses the allocator (another allocator was
// registered with a higher priority).
absl::Status InstallCpuAllocator();
// Idempotent; a no-op when not installed.
absl::Status UninstallCpuAllocator();
bool IsCpuAllocatorInstalled();

// Whether c10's default CPU allocator (door 2 above) is served by torchmem while
// installed, and if not, why not (empty when it is).
struct DefaultAllocatorRoute {
  bool taken_over = false;
  std::string reason;
};
DefaultAllocatorRoute GetDefaultAllocatorRoute();

// c10::GetDefaultCPUAllocator()->raw_allocate / raw_deallocate, for tests of the pairing
// of raw allocations across installs.
void* DefaultAllocatorRawAllocate(std::size_t bytes);
void DefaultAllocatorRawDeallocate(void* ptr);

}  // namespace torchmem::torch_glue

#endif  // TORCHMEM_TORCH_CPU_ALLOCATOR_H_
