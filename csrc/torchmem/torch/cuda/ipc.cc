// TorchmemCudaAllocatorImpl: CUDA memory shared between processes
// (torch.multiprocessing sending a CUDA tensor), as PyTorch's allocator does.
//
// The producer shares the whole segment holding the tensor
// (cudaIpcGetMemHandle works on cudaMalloc'd regions) plus the tensor's
// offset in it; the handle is PyTorch's own format
//   [version byte][type 'c'][64-byte cudaIpcMemHandle_t]
// so a consumer with PyTorch's allocator can open a torchmem handle and vice
// versa. A tensor in torchmem's virtual-memory placement goes as the pages
// under its block, in PyTorch's expandable-segment format [version]['e']...
// (ipc_expandable.h), and torchmem opens such handles from either allocator.
// The consumer opens each handle once per process
// (cudaIpcOpenMemHandle allows one mapping per context) and shares the
// mapping among the tensors that use it; the last one closes it.
// PyTorch keeps the producer's block allocated until every consumer is done
// with it (its reference-counting file), so the engine sees an ordinary
// allocated block.
#include <cuda_runtime_api.h>

#include <cstring>
#include <memory>
#include <mutex>
#include <string>

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/util/Exception.h>

#include "absl/container/flat_hash_map.h"
#include "torchmem/torch/cuda/cuda_allocator_impl.h"
#include "torchmem/torch/cuda/cuda_fork_locks.h"
#include "torchmem/torch/cuda/ipc_expandable.h"

namespace torchmem::torch_glue {
namespace {

// PyTorch's shareable handle: [kShareableHandleVersion (allocator_interface.h)]
// ['c' for cudaMalloc'd memory, 'e' for expandable segments (ipc_expandable.h)].
constexpr char kShareableCudaMalloc = 'c';
constexpr char kShareableExpandable = 'e';

struct OpenedHandle {
  c10::DeviceIndex device = 0;
  void* ptr = nullptr;
  std::weak_ptr<void> users;
};

std::mutex g_ipc_mutex;
// Leaked: mappings may be released during static destruction.
auto* g_opened = new absl::flat_hash_map<std::string, OpenedHandle>;

}  // namespace

void LockIpcHandlesForFork() { g_ipc_mutex.lock(); }

void UnlockIpcHandlesAfterFork() { g_ipc_mutex.unlock(); }

cca::ShareableHandle TorchmemCudaAllocatorImpl::shareIpcHandle(void* ptr) {
  for (const auto& [device, engine] : CudaEngines()) {
    absl::StatusOr<BlockInfo> block = engine->GetBlock(ptr);
    if (!block.ok()) continue;
    absl::StatusOr<SegmentInfo> segment = engine->SegmentContaining(ptr);
    TORCH_INTERNAL_ASSERT(segment.ok());
    if (segment->vmm) {
      // cudaIpcGetMemHandle refuses virtual memory: the pages under the
      // block go as file descriptors, in PyTorch's expandable format.
      std::ptrdiff_t offset = 0;
      std::string body = ShareExpandableBlock(device, *engine, ptr, &offset);
      std::string shared{kShareableHandleVersion, kShareableExpandable};
      shared += body;
      return cca::ShareableHandle{offset, std::move(shared)};
    }
    void* base = reinterpret_cast<void*>(segment->address);
    cudaIpcMemHandle_t handle;
    {
      c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
      C10_CUDA_CHECK(cudaIpcGetMemHandle(&handle, base));
    }
    std::string shared(2 + CUDA_IPC_HANDLE_SIZE, '\0');
    shared[0] = kShareableHandleVersion;
    shared[1] = kShareableCudaMalloc;
    std::memcpy(shared.data() + 2, &handle, CUDA_IPC_HANDLE_SIZE);
    return cca::ShareableHandle{static_cast<ptrdiff_t>(block->address - segment->address),
                                std::move(shared)};
  }
  TORCH_CHECK(false, "invalid device pointer: ", ptr,
              " (torchmem shares only blocks its CUDA engines allocated)");
}

namespace {

// The mapping of a cudaMalloc'd region another process shared ('c').
std::shared_ptr<void> OpenCudaMallocHandle(const std::string& handle, c10::DeviceIndex device) {
  TORCH_CHECK(handle.size() == 2 + CUDA_IPC_HANDLE_SIZE, "torchmem: malformed CUDA IPC handle (",
              handle.size(), " bytes)");
  cudaIpcMemHandle_t ipc;
  std::memcpy(&ipc, handle.data() + 2, CUDA_IPC_HANDLE_SIZE);
  void* ptr = nullptr;
  C10_CUDA_CHECK(cudaIpcOpenMemHandle(&ptr, ipc, cudaIpcMemLazyEnablePeerAccess));
  return std::shared_ptr<void>(ptr, [device](void* opened) {
    c10::cuda::CUDAGuard guard(device);
    C10_CUDA_CHECK_WARN(cudaIpcCloseMemHandle(opened));
  });
}

}  // namespace

std::shared_ptr<void> TorchmemCudaAllocatorImpl::getIpcDevPtr(std::string handle) {
  TORCH_CHECK(handle.size() >= 2, "torchmem: malformed CUDA IPC handle (", handle.size(),
              " bytes)");
  TORCH_CHECK(handle[0] <= kShareableHandleVersion,
              "received sharable handle from a future version of torch (handle version ",
              static_cast<int>(handle[0]), ", this torch understands up to ",
              static_cast<int>(kShareableHandleVersion), "); use the same torch in both processes");
  TORCH_CHECK(handle[1] == kShareableCudaMalloc || handle[1] == kShareableExpandable,
              "torchmem: unknown CUDA IPC handle type '", handle[1], "'");
  const bool expandable = handle[1] == kShareableExpandable;
  std::string key =
      expandable ? handle.substr(0, 2) + ExpandableHandleIdentity(handle.substr(2), handle[0])
                 : handle;
  std::lock_guard<std::mutex> lock(g_ipc_mutex);
  if (auto it = g_opened->find(key); it != g_opened->end()) {
    if (std::shared_ptr<void> users = it->second.users.lock()) return users;
  }
  c10::DeviceIndex device = 0;
  C10_CUDA_CHECK(c10::cuda::GetDevice(&device));
  std::shared_ptr<void> mapping = expandable
                                      ? OpenExpandableHandle(handle.substr(2), handle[0], device)
                                      : OpenCudaMallocHandle(handle, device);
  void* ptr = mapping.get();
  std::shared_ptr<void> users(ptr, [key, mapping](void*) mutable {
    {
      std::lock_guard<std::mutex> erase_lock(g_ipc_mutex);
      // Unless the handle was opened again meanwhile (the entry is a newer
      // mapping's, still in use).
      auto it = g_opened->find(key);
      if (it != g_opened->end() && it->second.users.expired()) g_opened->erase(it);
    }
    mapping.reset();  // outside the lock: unmapping may wait for the device
  });
  (*g_opened)[key] = OpenedHandle{device, ptr, users};
  return users;
}

}  // namespace torchmem::torch_glue
