#include "torchmem/torch/cuda/pluggable_entry_points.h"

#include <cstdio>
#include <functional>
#include <string>
#include <type_traits>

#include <c10/util/Exception.h>
#include <torch/csrc/cuda/CUDAPluggableAllocator.h>

#include "torchmem/core/engine.h"
#include "torchmem/torch/cuda/cuda_engines.h"

namespace torchmem::torch_glue {
namespace {

// --- compile-time check of the entry points against torch's own types ------

template <typename Fn>
struct PluggableFunctionTypes;
template <typename Result, typename Alloc, typename Free>
struct PluggableFunctionTypes<Result (*)(Alloc, Free)> {
  using AllocFn = Alloc;
  using FreeFn = Free;
};
using CreateCustomAllocator =
    PluggableFunctionTypes<decltype(&torch::cuda::CUDAPluggableAllocator::createCustomAllocator)>;
static_assert(std::is_same_v<CreateCustomAllocator::AllocFn,
                             std::function<std::remove_pointer_t<decltype(&torchmem_cuda_malloc)>>>,
              "torchmem_cuda_malloc does not match CUDAPluggableAllocator's alloc_fn type");
static_assert(std::is_same_v<CreateCustomAllocator::FreeFn,
                             std::function<std::remove_pointer_t<decltype(&torchmem_cuda_free)>>>,
              "torchmem_cuda_free does not match CUDAPluggableAllocator's free_fn type");

void Warn(const absl::Status& status) {
  std::fprintf(stderr, "%s\n", std::string(status.message()).c_str());
}

}  // namespace
}  // namespace torchmem::torch_glue

using torchmem::Engine;
using torchmem::StreamId;
using torchmem::torch_glue::CudaEngine;

void* torchmem_cuda_malloc(std::size_t size, int device, cudaStream_t stream) {
  // PyTorch's native allocator hands out a null pointer for empty tensors.
  if (size == 0) return nullptr;
  absl::StatusOr<void*> ptr = CudaEngine(device).Allocate(size, reinterpret_cast<StreamId>(stream));
  if (!ptr.ok()) {
    const std::string message(ptr.status().message());
    TORCH_CHECK_WITH(OutOfMemoryError, !absl::IsResourceExhausted(ptr.status()), message);
    TORCH_CHECK(false, message);
  }
  return *ptr;
}

void torchmem_cuda_free(void* ptr, std::size_t size, int device, cudaStream_t stream) {
  (void)stream;  // PyTorch passes the allocation stream, which the block knows
  if (ptr == nullptr) return;
  // Called from tensor deleters, which must not throw: report and go on.
  absl::Status freed = CudaEngine(device).FreeSized(ptr, size);
  if (!freed.ok()) torchmem::torch_glue::Warn(freed);
}

void torchmem_cuda_init(int device_count) { (void)device_count; }

void torchmem_cuda_reset() {
  for (const auto& [device, engine] : torchmem::torch_glue::CudaEngines()) {
    absl::Status emptied = engine->EmptyCache();
    if (!emptied.ok()) torchmem::torch_glue::Warn(emptied);
  }
}

void torchmem_cuda_set_memory_fraction(double fraction, int device) {
  absl::Status status = CudaEngine(device).SetMemoryFraction(fraction);
  TORCH_CHECK(status.ok(), std::string(status.message()));
}

void torchmem_cuda_record_stream(void* ptr, cudaStream_t stream) {
  Engine* engine = torchmem::torch_glue::CudaEngineOwning(ptr);
  TORCH_CHECK(engine != nullptr, "torchmem: record_stream on a pointer torchmem did not allocate");
  absl::Status status = engine->RecordStream(ptr, reinterpret_cast<StreamId>(stream));
  TORCH_CHECK(status.ok(), std::string(status.message()));
}

void* torchmem_cuda_base_allocation(void* ptr, std::size_t* size) {
  Engine* engine = torchmem::torch_glue::CudaEngineOwning(ptr);
  TORCH_CHECK(engine != nullptr,
              "torchmem: getBaseAllocation on a pointer torchmem did not allocate");
  auto base = engine->BaseAllocation(ptr);
  TORCH_CHECK(base.ok(), std::string(base.status().message()));
  if (size != nullptr) *size = base->second;
  return reinterpret_cast<void*>(base->first);
}
