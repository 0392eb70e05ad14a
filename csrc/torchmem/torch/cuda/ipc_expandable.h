// CUDA IPC of expandable-segment memory in PyTorch's format (handle type
// 'e'), both ways: torchmem's virtual-memory pages shared with another
// process, and pages another process shared opened here.
//
// PyTorch's ExpandableSegment::share / fromShared: the producer exports
// each physical handle under the shared block as a POSIX file descriptor
// and sends its process id, the handle size, the number of handles and the
// descriptors' numbers; the consumer copies each descriptor into its own
// process (pidfd_open + pidfd_getfd), imports it, reserves an address range
// and maps the handles there in order. The handle bytes after the version
// and type bytes:
//   pid (int32), 4 padding bytes (zero from version 3, left as they were in
//   the producer's memory before), handle size (uint64), handle count (uint64),
//   from version 3 (torch 2.13) the handle type (int32, 1 = POSIX file
//   descriptor) and 4 zero bytes; then one int32 descriptor per handle.
// (Read from the handles torch 2.14.1's allocator produces, and PyTorch's
// source for the fields before version 3.)
#ifndef TORCHMEM_TORCH_CUDA_IPC_EXPANDABLE_H_
#define TORCHMEM_TORCH_CUDA_IPC_EXPANDABLE_H_

#include <cstddef>
#include <memory>
#include <string>

#include <c10/core/Device.h>

#include "torchmem/core/engine.h"

namespace torchmem::torch_glue {

// The body of a shareable handle for the allocated block at `ptr` in an
// address range of `engine` (device `device`); *offset gets the block's
// offset from the first shared page.
std::string ShareExpandableBlock(int device, Engine& engine, void* ptr, std::ptrdiff_t* offset);

// Maps the pages a handle body names (from `version`'s format) on `device`;
// the result points at the first page, and unmaps and frees them when the
// last owner lets go.
std::shared_ptr<void> OpenExpandableHandle(const std::string& body, char version,
                                           c10::DeviceIndex device);

// What makes two handle bodies name the same pages: the body with its
// padding bytes zeroed. PyTorch before version 3 writes its header struct
// as it lies in memory, padding included, so two shares of one page differ
// in bytes that mean nothing (seen with torch 2.9.1): keyed by the raw
// bytes, a consumer would map the page once per tensor.
std::string ExpandableHandleIdentity(std::string body, char version);

}  // namespace torchmem::torch_glue

#endif  // TORCHMEM_TORCH_CUDA_IPC_EXPANDABLE_H_
