#include "torchmem/core/context_capture.h"

namespace torchmem {
namespace internal {
std::atomic<int> g_capture_requests{0};
std::atomic<ContextCaptureFn> g_capture_hook{nullptr};
}  // namespace internal

namespace {
std::atomic<ContextFramesResolver> g_frames_resolver{nullptr};
std::atomic<ContextBaseResolver> g_base_resolver{nullptr};
}  // namespace

void SetContextBaseResolver(ContextBaseResolver resolver) {
  g_base_resolver.store(resolver, std::memory_order_release);
}

ContextId BaseContext(ContextId id) {
  if ((id & kDerivedContextBit) == 0) return id;
  ContextBaseResolver resolver = g_base_resolver.load(std::memory_order_acquire);
  return resolver == nullptr ? kNoContext : resolver(id);
}

void SetContextFramesResolver(ContextFramesResolver resolver) {
  g_frames_resolver.store(resolver, std::memory_order_release);
}

bool ResolveContextFrames(ContextId id, std::vector<ContextFrame>* out) {
  ContextFramesResolver resolver = g_frames_resolver.load(std::memory_order_acquire);
  return resolver != nullptr && id != kNoContext && resolver(id, out);
}

void SetContextCaptureHook(ContextCaptureFn hook) {
  internal::g_capture_hook.store(hook, std::memory_order_release);
}

void RequestContextCapture() {
  internal::g_capture_requests.fetch_add(1, std::memory_order_relaxed);
}

void ReleaseContextCapture() {
  internal::g_capture_requests.fetch_sub(1, std::memory_order_relaxed);
}

bool ContextCaptureRequested() {
  return internal::g_capture_requests.load(std::memory_order_relaxed) > 0;
}

}  // namespace torchmem
