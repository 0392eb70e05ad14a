#include "torchmem/core/context_capture.h"

namespace torchmem {
namespace internal {
std::atomic<int> g_capture_requests{0};
std::atomic<ContextCaptureFn> g_capture_hook{nullptr};
}  // namespace internal

void SetContextCaptureHook(ContextCaptureFn hook) {
  internal::g_capture_hook.store(hook, std::memory_order_release);
}

void RequestContextCapture() { internal::g_capture_requests.fetch_add(1, std::memory_order_relaxed); }

void ReleaseContextCapture() { internal::g_capture_requests.fetch_sub(1, std::memory_order_relaxed); }

bool ContextCaptureRequested() {
  return internal::g_capture_requests.load(std::memory_order_relaxed) > 0;
}

}  // namespace torchmem
