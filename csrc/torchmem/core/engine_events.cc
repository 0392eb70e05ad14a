// Engine: cross-stream reuse (record_stream, events) and the rules around
// CUDA graph capture.
//
// A block used on other streams is pending after its free until an event
// recorded on each of those streams completes. Events are kept FIFO per
// stream, and a stream's queue is dropped as soon as it empties, so the
// table never outgrows the streams with work in flight. While a capture is
// underway nothing is recorded or queried (CUDA forbids it on a capturing
// stream): such frees wait in deferred_until_no_capture_ and get their
// events once no capture is underway, without the streams recorded during
// the capture (their captured work runs only at replay).
//
// A query that fails (rather than answering "not ready") is not treated as
// "not yet": the engine waits for the event (cudaEventSynchronize), counts
// the failure and warns once. If waiting fails too, the block stays pending
// and the error is returned (the allocation, empty_cache or checkpoint that
// processed the events raises it), as PyTorch's allocator raises the CUDA
// error of a failed cudaEventQuery/cudaEventSynchronize: nobody knows
// whether the stream still reads the block, so handing it out again could
// let new data be overwritten by the old work. A later call asks again.
#include <algorithm>
#include <utility>

#include "absl/strings/str_format.h"
#include "torchmem/core/engine.h"
#include "torchmem/core/warnings.h"

namespace torchmem {

absl::Status Engine::RecordStream(void* ptr, StreamId stream) {
  MutexLock lock(&mutex_);
  const auto address = reinterpret_cast<std::uintptr_t>(ptr);
  auto it = blocks_.find(address);
  if (it == blocks_.end()) return UnknownPointerError(address);
  Block* block = it->second;
  if (block->state != BlockState::kAllocated) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "torchmem: record_stream on %#x (%s), which is not allocated; record streams "
        "before freeing",
        address, device_name_));
  }
  if (stream == block->stream()) return absl::OkStatus();
  if (block->uses == nullptr) block->uses = std::make_unique<StreamUses>();
  std::vector<StreamId>& streams = block->uses->streams;
  if (std::find(streams.begin(), streams.end(), stream) == streams.end()) {
    streams.push_back(stream);
    if (CaptureUnderwayLocked()) block->uses->captured.push_back(stream);
  }
  return absl::OkStatus();
}

void Engine::RecordPendingEvents(Block* block) {
  if (block->uses == nullptr) return;
  for (StreamId stream : block->uses->streams) {
    ++block->uses->pending_events;
    ++outstanding_events_;
    absl::StatusOr<EventId> event = backend_->RecordEvent(stream);
    if (event.ok()) {
      pending_events_[stream].push_back(PendingEvent{*event, block});
    } else {
      // The block must not be reused before that stream is done with it:
      // keep it pending and try recording again later.
      unrecorded_events_.emplace_back(stream, block);
    }
  }
}

void Engine::RecordDeferredEvents() {
  std::vector<Block*> deferred;
  deferred.swap(deferred_until_no_capture_);
  for (Block* block : deferred) {
    // Work captured on a stream runs at replay, under the graph's own
    // ordering: only streams recorded outside the capture need an event.
    if (block->uses != nullptr) {
      std::vector<StreamId>& streams = block->uses->streams;
      for (StreamId captured : block->uses->captured) {
        streams.erase(std::remove(streams.begin(), streams.end(), captured), streams.end());
      }
      block->uses->captured.clear();
    }
    RecordPendingEvents(block);
    if (block->pending_events() == 0) MakeReusable(block);
  }
}

void Engine::RetryUnrecordedEvents() {
  std::vector<std::pair<StreamId, Block*>> retry;
  retry.swap(unrecorded_events_);
  for (auto [stream, block] : retry) {
    absl::StatusOr<EventId> event = backend_->RecordEvent(stream);
    if (event.ok()) {
      pending_events_[stream].push_back(PendingEvent{*event, block});
    } else {
      unrecorded_events_.emplace_back(stream, block);
    }
  }
}

void Engine::ProcessEvents() {
  MutexLock lock(&mutex_);
  // A broken event keeps its block pending; the next allocation reports it.
  (void)ProcessEventsLocked();
}

void Engine::CompleteEvent(EventId event, Block* block) {
  backend_->ReleaseEvent(event);
  --outstanding_events_;
  if (--block->uses->pending_events == 0) MakeReusable(block);
}

absl::Status Engine::WaitAfterQueryError(StreamId stream, EventId event,
                                         const absl::Status& error) {
  if (event_query_errors_++ == 0) {
    Warn(absl::StrFormat(
        "querying an event that guards a freed block on stream %#x of %s failed (%s); torchmem "
        "waits for such events instead (counted in event_stats()['event_query_errors']; "
        "warned once per device)",
        stream, device_name_, error.message()));
  }
  absl::Status synced = backend_->SynchronizeEvent(event);
  if (synced.ok()) return synced;
  return EventWaitFailure(stream, synced);
}

absl::Status Engine::EventWaitFailure(StreamId stream, const absl::Status& error) {
  ++event_sync_errors_;
  return absl::Status(error.code(),
                      absl::StrFormat("torchmem: waiting for an event that guards a freed block "
                                      "on stream %#x of %s failed (%s); the block stays in use, "
                                      "since that stream may still read or write it",
                                      stream, device_name_, error.message()));
}

absl::Status Engine::ProcessEventsLocked() {
  // CUDA forbids querying or recording events while a capture is underway.
  if (CaptureUnderwayLocked()) return absl::OkStatus();
  if (!deferred_until_no_capture_.empty()) RecordDeferredEvents();
  if (!unrecorded_events_.empty()) RetryUnrecordedEvents();
  absl::Status failure;
  for (auto it = pending_events_.begin(); it != pending_events_.end() && failure.ok();) {
    const StreamId stream = it->first;
    std::deque<PendingEvent>& queue = it->second;
    while (!queue.empty()) {
      const PendingEvent pending = queue.front();
      absl::StatusOr<bool> done = backend_->QueryEvent(pending.event);
      if (done.ok() && !*done) break;
      if (!done.ok()) {
        failure = WaitAfterQueryError(stream, pending.event, done.status());
        if (!failure.ok()) break;  // the event stays queued, its block pending
      }
      queue.pop_front();
      CompleteEvent(pending.event, pending.block);
    }
    // An empty queue is dropped: the table holds only streams with events
    // in flight, however many streams the program has used.
    if (queue.empty()) {
      pending_events_.erase(it++);
    } else {
      ++it;
    }
  }
  return failure;
}

absl::Status Engine::SynchronizeAllEvents(const PrivatePool* only) {
  if (CaptureUnderwayLocked()) return absl::OkStatus();
  if (!deferred_until_no_capture_.empty()) RecordDeferredEvents();
  if (!unrecorded_events_.empty()) RetryUnrecordedEvents();
  if (outstanding_events_ == 0) return absl::OkStatus();
  ++stats_.num_sync_all_streams;
  absl::Status failure;
  for (auto it = pending_events_.begin(); it != pending_events_.end();) {
    const StreamId stream = it->first;
    std::deque<PendingEvent> kept;
    for (const PendingEvent& pending : it->second) {
      if (!failure.ok() || (only != nullptr && pending.block->owner() != only)) {
        kept.push_back(pending);
        continue;
      }
      if (absl::Status synced = backend_->SynchronizeEvent(pending.event); !synced.ok()) {
        // This event and every later one stay queued, their blocks pending.
        failure = EventWaitFailure(stream, synced);
        kept.push_back(pending);
        continue;
      }
      CompleteEvent(pending.event, pending.block);
    }
    if (kept.empty()) {
      pending_events_.erase(it++);
    } else {
      it->second = std::move(kept);
      ++it;
    }
  }
  // Events that could not even be recorded stay pending: nothing to wait
  // for yet (ProcessEvents retries recording them).
  return failure;
}

void Engine::MarkCaptureBegin() {
  MutexLock lock(&mutex_);
  ++marked_captures_;
}

void Engine::MarkCaptureEnd() {
  MutexLock lock(&mutex_);
  if (marked_captures_ > 0) --marked_captures_;
}

bool Engine::CaptureUnderway() const {
  MutexLock lock(&mutex_);
  return CaptureUnderwayLocked();
}

EventHealth Engine::GetEventHealth() const {
  MutexLock lock(&mutex_);
  EventHealth health;
  health.outstanding_events = static_cast<std::int64_t>(outstanding_events_);
  health.streams_with_events = static_cast<std::int64_t>(pending_events_.size());
  health.deferred_frees = static_cast<std::int64_t>(deferred_until_no_capture_.size());
  health.event_query_errors = event_query_errors_;
  health.event_sync_errors = event_sync_errors_;
  return health;
}

}  // namespace torchmem
