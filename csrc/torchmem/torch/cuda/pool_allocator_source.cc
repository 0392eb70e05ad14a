#include "torchmem/torch/cuda/pool_allocator_source.h"

#include <cuda_runtime_api.h>

#include <exception>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "torchmem/backends/cuda_address_registry.h"

namespace torchmem::torch_glue {
namespace {

using c10::cuda::CUDACachingAllocator::CUDAAllocator;

class PoolAllocatorSource final : public SegmentSource {
 public:
  PoolAllocatorSource(std::shared_ptr<CUDAAllocator> allocator, int device)
      : allocator_(std::move(allocator)), device_(device) {}

  absl::StatusOr<std::uintptr_t> AllocateSegment(std::size_t size, StreamId stream) override {
    void* ptr = nullptr;
    // The engine calls under its lock: an exception must not cross it.
    try {
      ptr = allocator_->raw_alloc_with_stream(size, reinterpret_cast<cudaStream_t>(stream));
    } catch (const std::exception& error) {
      return absl::InternalError(absl::StrCat("the MemPool's allocator (", allocator_->name(),
                                              ") failed: ", error.what()));
    }
    // PyTorch reads a null pointer as the pool's allocator being out of memory.
    if (ptr == nullptr) {
      return absl::ResourceExhaustedError(
          absl::StrFormat("the MemPool's allocator (%s) returned no memory for %d bytes",
                          allocator_->name(), size));
    }
    const auto address = reinterpret_cast<std::uintptr_t>(ptr);
    RegisterCudaAddressRange(address, size, device_);
    return address;
  }

  absl::Status ReleaseSegment(std::uintptr_t address, std::size_t size) override {
    UnregisterCudaAddressRange(address);
    try {
      allocator_->raw_delete(reinterpret_cast<void*>(address));
    } catch (const std::exception& error) {
      RegisterCudaAddressRange(address, size, device_);  // the engine keeps it
      return absl::InternalError(absl::StrCat("the MemPool's allocator (", allocator_->name(),
                                              ") could not free a segment: ", error.what()));
    }
    return absl::OkStatus();
  }

 private:
  const std::shared_ptr<CUDAAllocator> allocator_;
  const int device_;
};

}  // namespace

std::shared_ptr<SegmentSource> MakePoolAllocatorSource(std::shared_ptr<CUDAAllocator> allocator,
                                                       int device) {
  return std::make_shared<PoolAllocatorSource>(std::move(allocator), device);
}

}  // namespace torchmem::torch_glue
