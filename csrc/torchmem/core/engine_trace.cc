// Engine: the allocation history (PyTorch's memory history): the trace ring,
// its listener, and the entries only a caller can add (snapshot markers,
// annotations).
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "torchmem/core/engine.h"

namespace torchmem {

void Engine::Trace(TraceAction action, std::uintptr_t address, std::size_t size, StreamId stream,
                   ContextId context, const PrivatePool* pool, TraceLabel user_metadata) {
  TraceEntry entry;
  entry.action = action;
  entry.address = address;
  entry.size = size;
  entry.stream = stream;
  entry.context = context;
  if (pool != nullptr) entry.pool = pool->id;
  entry.time_us = TraceNowMicros();
  entry.user_metadata = user_metadata != kNoTraceLabel ? user_metadata : TraceUserMetadata();
  entry.compile_context = TraceCompileContext();
  if (trace_listener_ != nullptr) trace_listener_(entry);
  if (trace_ != nullptr && (trace_skip_mask_ >> static_cast<int>(action) & 1) == 0) {
    trace_->Record(entry);
  }
}

void Engine::SetTraceCapacity(std::size_t max_entries, bool clear) {
  MutexLock lock(&mutex_);
  if (max_entries == 0) {
    trace_ = nullptr;
    return;
  }
  std::vector<TraceEntry> kept;
  if (!clear && trace_ != nullptr) kept = trace_->Entries();
  trace_ = std::make_unique<TraceRing>(max_entries);
  for (const TraceEntry& entry : kept) trace_->Record(entry);
}

void Engine::SetTraceSkipActions(std::uint32_t mask) {
  MutexLock lock(&mutex_);
  trace_skip_mask_ = mask;
}

void Engine::SetTraceFreeContext(bool capture_at_free) {
  trace_free_context_.store(capture_at_free, std::memory_order_relaxed);
}

void Engine::SetContextCaptureOverride(ContextCaptureFn hook) {
  context_capture_override_.store(hook, std::memory_order_release);
}

void Engine::SetTraceListener(TraceListener listener) {
  MutexLock lock(&mutex_);
  trace_listener_ = std::move(listener);
}

std::vector<TraceEntry> Engine::GetTrace() const {
  MutexLock lock(&mutex_);
  return trace_ == nullptr ? std::vector<TraceEntry>{} : trace_->Entries();
}

void Engine::RecordSnapshotEvent() {
  MutexLock lock(&mutex_);
  if (Tracing()) {
    Trace(TraceAction::kSnapshot, 0, static_cast<std::size_t>(stats_.active_bytes.all().current), 0,
          kNoContext, nullptr);
  }
}

absl::Status Engine::RecordAnnotation(const void* ptr, TraceLabel label) {
  MutexLock lock(&mutex_);
  const auto address = reinterpret_cast<std::uintptr_t>(ptr);
  auto it = blocks_.find(address);
  if (it == blocks_.end() || it->second->state != BlockState::kAllocated) {
    return absl::NotFoundError(
        absl::StrFormat("torchmem: cannot annotate %#x: no allocated block starts there on %s",
                        address, device_name_));
  }
  if (Tracing()) {
    const Block* block = it->second;
    Trace(TraceAction::kAnnotate, address, block->requested_size, block->stream(), kNoContext,
          block->owner(), label);
  }
  return absl::OkStatus();
}

}  // namespace torchmem
