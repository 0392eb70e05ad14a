#include "torchmem/torch/cuda/alloc_config.h"

#include <cstdlib>
#include <mutex>
#include <set>
#include <string_view>
#include <utility>

#include <c10/core/AllocatorConfig.h>
#include <c10/cuda/CUDAAllocatorConfig.h>
#include <c10/util/Exception.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "torchmem/torch/torch_version.h"

namespace torchmem::torch_glue {
namespace {

using c10::CachingAllocator::AcceleratorAllocatorConfig;
using c10::cuda::CUDACachingAllocator::CUDAAllocatorConfig;

// (key, value) pairs of a settings string; list values keep their brackets.
std::vector<std::pair<std::string, std::string>> ParseKeys(const std::string& settings) {
  std::vector<std::pair<std::string, std::string>> keys;
  c10::CachingAllocator::ConfigTokenizer tokens(settings);
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    const std::string& key = tokens[i];
    if (key == "," || key == ":" || key == "[" || key == "]") continue;
    std::string value;
    if (i + 2 < tokens.size() && tokens[i + 1] == ":") {
      i += 2;
      if (tokens[i] == "[") {
        while (i < tokens.size() && tokens[i] != "]") value += tokens[i++];
        value += "]";
      } else {
        value = tokens[i];
      }
    }
    keys.emplace_back(key, value);
  }
  return keys;
}

bool IsTrue(const std::string& value) { return value == "True" || value == "true" || value == "1"; }

// Keys torchmem applies itself, or that configure PyTorch's pinned host
// allocator (which torchmem leaves in place).
bool HandledKey(std::string_view key) {
  static const std::set<std::string_view> kHonoured = {
      "max_split_size_mb",           "max_non_split_rounding_mb",
      "roundup_power2_divisions",    "garbage_collection_threshold",
      "per_process_memory_fraction", "large_segment_size_mb",
      "expandable_segments"};
  return kHonoured.contains(key) || key.starts_with("pinned_");
}

std::mutex g_warned_mutex;
std::set<std::string>* g_warned = new std::set<std::string>;  // leaked: warnings at exit

void WarnOnce(const std::string& what, const std::string& message) {
  {
    std::lock_guard<std::mutex> lock(g_warned_mutex);
    if (!g_warned->insert(what).second) return;
  }
  TORCH_WARN(message);
}

}  // namespace

std::vector<std::string> UnimplementedSettings() {
  std::vector<std::string> found;
  for (const auto& [key, value] :
       ParseKeys(AcceleratorAllocatorConfig::last_allocator_settings())) {
    if (HandledKey(key)) continue;
    if (key == "backend") {
      if (value != "native") {
        found.push_back(absl::StrCat(
            "backend:", value,
            " asks for another CUDA allocator, but torchmem is installed as "
            "PyTorch's CUDA allocator and serves every CUDA allocation; remove the key, or do not "
            "install torchmem for CUDA"));
      }
    } else if (key == "release_lock_on_cudamalloc" || key == "release_lock_on_hipmalloc") {
      if (IsTrue(value)) {
        found.push_back(
            absl::StrCat(key,
                         ":True is not implemented by torchmem: its engine keeps its lock while "
                         "cudaMalloc runs (allocations on other threads wait meanwhile)"));
      }
    } else if (key == "graph_capture_record_stream_reuse") {
      if (IsTrue(value)) {
        found.push_back(
            "graph_capture_record_stream_reuse:True is not implemented by torchmem: blocks "
            "freed during a CUDA graph capture while used on other streams are reused only after "
            "the capture ends (PyTorch's default behaviour)");
      }
    } else if (key == "throw_on_cudamalloc_oom") {
      if (IsTrue(value)) {
        found.push_back(
            "throw_on_cudamalloc_oom:True is not implemented by torchmem: allocations go to "
            "cudaMalloc and fail with torch.OutOfMemoryError when it fails (after torchmem frees "
            "its cache), not before");
      }
    } else {
      found.push_back(
          absl::StrCat(key,
                       " is a setting torchmem does not know; it has no effect on torchmem's CUDA "
                       "allocations"));
    }
  }
  return found;
}

CudaAllocSettings ReadCudaAllocSettings() {
  CudaAllocSettings settings;
  SizePolicy& policy = settings.policy;
  policy.max_split_size = AcceleratorAllocatorConfig::max_split_size();
  policy.max_non_split_rounding = AcceleratorAllocatorConfig::max_non_split_rounding_size();
  const std::vector<std::size_t>& divisions =
      AcceleratorAllocatorConfig::roundup_power2_divisions();
  for (std::size_t i = 0; i < policy.roundup_power2_divisions.size() && i < divisions.size(); ++i) {
    policy.roundup_power2_divisions[i] = divisions[i];
  }
#if TORCHMEM_TORCH_VERSION_AT_LEAST(2, 11)  // large_segment_size_mb arrived in 2.11
  const std::size_t large_segment = AcceleratorAllocatorConfig::large_segment_size();
#else
  const std::size_t large_segment = policy.large_segment_size;
#endif
  if (large_segment != policy.large_segment_size) {
    SizePolicy with_segment = policy;
    with_segment.large_segment_size = large_segment;
    if (with_segment.Validate().ok()) {
      policy.large_segment_size = large_segment;
    } else {
      WarnOnce(absl::StrCat("large_segment_size:", large_segment),
               absl::StrCat("torchmem: large_segment_size_mb of ", large_segment >> 20,
                            " MiB is not usable by torchmem (it must be at least 10 MiB and a "
                            "multiple of 2 MiB); torchmem keeps 20 MiB segments"));
    }
  }
  policy.Refresh();
  if (absl::Status valid = policy.Validate(); !valid.ok()) {
    WarnOnce(std::string(valid.message()),
             absl::StrCat("torchmem: PYTORCH_CUDA_ALLOC_CONF gives a size policy torchmem cannot "
                          "use (",
                          valid.message(), "); torchmem keeps PyTorch's defaults"));
    policy = SizePolicy::PyTorchDefault();
  }
  settings.garbage_collection_threshold =
      AcceleratorAllocatorConfig::garbage_collection_threshold();
#if TORCHMEM_TORCH_VERSION_AT_LEAST(2, 10)  // per_process_memory_fraction arrived in 2.10
  settings.per_process_memory_fraction = CUDAAllocatorConfig::per_process_memory_fraction();
#endif
  // Not CUDAAllocatorConfig::expandable_segments(): it answers by a macro of
  // PyTorch's own build (PYTORCH_C10_DRIVER_API_SUPPORTED) that is undefined
  // in an extension, and would say false with a warning.
  settings.expandable_segments = AcceleratorAllocatorConfig::use_expandable_segments();
  const char* uncached = std::getenv("PYTORCH_NO_CUDA_MEMORY_CACHING");
  settings.caching_disabled =
      uncached != nullptr && *uncached != '\0' && std::string_view(uncached) != "0";
  if (settings.caching_disabled) {
    WarnOnce("PYTORCH_NO_CUDA_MEMORY_CACHING",
             "torchmem: PYTORCH_NO_CUDA_MEMORY_CACHING is set, so CUDA allocations go straight to "
             "cudaMalloc/cudaFree as with PyTorch's allocator: they bypass torchmem's cache too, "
             "and torchmem's statistics, tags and leak checks do not see them. Unset it to use "
             "torchmem");
  }
  for (const std::string& message : UnimplementedSettings()) {
    WarnOnce(message, absl::StrCat("torchmem: PYTORCH_CUDA_ALLOC_CONF ", message));
  }
  return settings;
}

bool ListenForSettingsChanges(std::function<void()> listener) {
#if TORCHMEM_TORCH_VERSION_AT_LEAST(2, 11)  // c10's config parser hook arrived in 2.11
  static std::once_flag once;
  std::call_once(once, [&listener] {
    auto& hook = AcceleratorAllocatorConfig::getConfigParserHook();
    std::function<void(const std::string&)> previous = hook;
    hook = [previous, listener = std::move(listener)](const std::string& env) {
      if (previous) previous(env);
      listener();
    };
  });
  return true;
#else
  return false;
#endif
}

}  // namespace torchmem::torch_glue
