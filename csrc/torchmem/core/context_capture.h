// Context capture: an optional hook that names where an allocation was made.
//
// The engine stamps the returned ContextId on the block and never looks
// inside it; the layer that installs the hook (the Python layer, which
// captures Python stacks) interprets it. Capture is reference counted: it runs
// only while at least one client (a leak check that wants stacks, an explicit
// history recording) asked for it, so it costs one relaxed atomic load
// otherwise. The hook is called before the engine takes its lock, so it may
// block or take other locks, but it must not allocate through the engine.
#ifndef TORCHMEM_CORE_CONTEXT_CAPTURE_H_
#define TORCHMEM_CORE_CONTEXT_CAPTURE_H_

#include <atomic>
#include <vector>

#include "torchmem/core/types.h"

namespace torchmem {

using ContextCaptureFn = ContextId (*)();

// Installs the hook (nullptr removes it).
void SetContextCaptureHook(ContextCaptureFn hook);
// Reference-counted switch; balanced calls.
void RequestContextCapture();
void ReleaseContextCapture();
bool ContextCaptureRequested();

// One frame of a captured context, opaque to the engine: the capture
// layer's code object and instruction offset (for Python stacks, a
// PyCodeObject* and the byte offset PyCode_Addr2Line takes).
struct ContextFrame {
  void* code = nullptr;
  int offset = 0;
};

// Copies the frames of context `id`, innermost first, into `out`, with one
// strong reference to each code object that the caller must release; false
// if `id` is unknown (or was pruned). Installed by the layer that captures
// (torchmem._C); used by torchmem._C_cuda to hand PyTorch's snapshots
// torchmem's stacks. Requires what the capture layer requires (the GIL).
using ContextFramesResolver = bool (*)(ContextId id, std::vector<ContextFrame>* out);
void SetContextFramesResolver(ContextFramesResolver resolver);
// False if no resolver is installed or it does not know `id`.
bool ResolveContextFrames(ContextId id, std::vector<ContextFrame>* out);

// Contexts another layer derives from a captured one: torchmem._C_cuda's
// contexts that add PyTorch's C++ and TorchScript frames to a Python stack
// (_record_memory_history(stacks="all")). Their ids have kDerivedContextBit
// set; BaseContext maps one to the captured context it extends (and any
// other id to itself), so the capture layer symbolizes and keeps alive the
// Python stack under it. Ids without the bit never go through the resolver.
inline constexpr ContextId kDerivedContextBit = ContextId{1} << 63;
using ContextBaseResolver = ContextId (*)(ContextId derived);
void SetContextBaseResolver(ContextBaseResolver resolver);
ContextId BaseContext(ContextId id);

namespace internal {
extern std::atomic<int> g_capture_requests;
extern std::atomic<ContextCaptureFn> g_capture_hook;
}  // namespace internal

// The context of an allocation made now, or kNoContext. `override_hook`,
// when set, replaces the installed hook (an engine whose owner wants richer
// contexts, Engine::SetContextCaptureOverride); it runs only while capture
// is requested, like the hook.
inline ContextId CaptureContext(const std::atomic<ContextCaptureFn>* override_hook = nullptr) {
  if (internal::g_capture_requests.load(std::memory_order_relaxed) == 0) return kNoContext;
  if (override_hook != nullptr) {
    if (ContextCaptureFn own = override_hook->load(std::memory_order_acquire); own != nullptr)
        [[unlikely]] {
      return own();
    }
  }
  ContextCaptureFn hook = internal::g_capture_hook.load(std::memory_order_acquire);
  return hook == nullptr ? kNoContext : hook();
}

// The installed hook's context now, ignoring overrides (for an override
// that extends it).
inline ContextId CaptureBaseContext() {
  ContextCaptureFn hook = internal::g_capture_hook.load(std::memory_order_acquire);
  return hook == nullptr ? kNoContext : hook();
}

}  // namespace torchmem

#endif  // TORCHMEM_CORE_CONTEXT_CAPTURE_H_
