// Streams, events and the completion model of the simulated machine (see
// machine.h for the model).
#include <algorithm>

#include "runtime/machine.h"

namespace simcuda {
namespace rt {
namespace {

// The per-thread default streams (cudaStreamPerThread) of the calling thread,
// by device. They live in the machine's stream table; a thread's streams
// outlive the thread, which is harmless for a test device.
thread_local std::unordered_map<int, CUstream_st*> t_per_thread_streams;

}  // namespace

void Machine::Run(HostCallbacks* run) {
  for (auto& fn : *run) fn();
  run->clear();
}

EventMode Machine::mode() {
  std::lock_guard<std::mutex> lock(mu_);
  return mode_;
}

void Machine::SetMode(EventMode mode) {
  HostCallbacks run;
  {
    std::lock_guard<std::mutex> lock(mu_);
    mode_ = mode;
    if (mode == EventMode::kImmediate) CompleteDeviceLocked(-1, &run);
  }
  Run(&run);
}

CUstream_st* Machine::StreamByIdLocked(uint64_t id) {
  auto it = streams_.find(id);
  return it == streams_.end() ? nullptr : it->second;
}

CUstream_st* Machine::PerThreadStreamLocked(int device) {
  CUstream_st*& s = t_per_thread_streams[device];
  if (s == nullptr) {
    s = new CUstream_st;
    s->id = next_stream_id_++;
    s->device = device;
    s->builtin = true;
    streams_[s->id] = s;
  }
  return s;
}

cudaError_t Machine::ResolveLocked(cudaStream_t handle, int device, CUstream_st** out) {
  if (handle == nullptr || handle == cudaStreamLegacy || handle == cudaStreamPerThread) {
    DeviceState* d = DeviceLocked(device);
    if (d == nullptr) return cudaErrorInvalidDevice;
    // Work on the current device's default stream needs its context.
    if (const cudaError_t err = EnsureContextLocked(device); err != cudaSuccess) return err;
    *out = handle == cudaStreamPerThread ? PerThreadStreamLocked(device) : d->legacy_stream.get();
    return cudaSuccess;
  }
  if (user_streams_.count(handle) == 0) return cudaErrorInvalidResourceHandle;
  *out = handle;
  return cudaSuccess;
}

cudaError_t Machine::ResolveStream(cudaStream_t handle, int device, CUstream_st** out) {
  std::lock_guard<std::mutex> lock(mu_);
  return ResolveLocked(handle, device, out);
}

cudaError_t Machine::CreateStream(int device, unsigned int flags, int priority, cudaStream_t* out) {
  std::lock_guard<std::mutex> lock(mu_);
  if (DeviceLocked(device) == nullptr) return cudaErrorInvalidDevice;
  if (const cudaError_t err = EnsureContextLocked(device); err != cudaSuccess) return err;
  auto* s = new CUstream_st;
  s->id = next_stream_id_++;
  s->device = device;
  s->flags = flags;
  s->priority = priority;
  streams_[s->id] = s;
  user_streams_.insert(s);
  *out = s;
  return cudaSuccess;
}

cudaError_t Machine::DestroyStream(cudaStream_t handle, int device) {
  HostCallbacks run;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (handle == nullptr || handle == cudaStreamLegacy || handle == cudaStreamPerThread ||
        user_streams_.count(handle) == 0) {
      return cudaErrorInvalidResourceHandle;
    }
    // A destroyed stream's work completes (CUDA would let it finish later).
    CompleteLocked(handle, handle->submitted, &run);
    if (handle->capture_status != cudaStreamCaptureStatusNone) --active_captures_;
    graphs_.erase(handle->capture_graph);
    delete handle->capture_graph;
    streams_.erase(handle->id);
    user_streams_.erase(handle);
    delete handle;
  }
  Run(&run);
  return cudaSuccess;
}

bool Machine::CaptureLocked(CUstream_st* s) {
  if (s->capture_status != cudaStreamCaptureStatusActive) return false;
  ++s->capture_graph->captured_work;
  return true;
}

void Machine::SubmitLocked(CUstream_st* s, PendingWork work, HostCallbacks* run) {
  work.seq = ++s->submitted;
  if (mode_ == EventMode::kImmediate) {
    if (work.host_fn) run->push_back(std::move(work.host_fn));
    s->completed = s->submitted;
    return;
  }
  if (work.host_fn || work.wait_stream_id != 0) s->pending.push_back(std::move(work));
}

void Machine::CompleteLocked(CUstream_st* s, uint64_t upto, HostCallbacks* run) {
  upto = std::min(upto, s->submitted);
  while (!s->pending.empty() && s->pending.front().seq <= upto) {
    PendingWork work = std::move(s->pending.front());
    s->pending.pop_front();
    s->completed = std::max(s->completed, work.seq - 1);
    if (work.wait_stream_id != 0) {
      if (CUstream_st* source = StreamByIdLocked(work.wait_stream_id)) {
        CompleteLocked(source, work.wait_seq, run);
      }
    }
    if (work.host_fn) run->push_back(std::move(work.host_fn));
  }
  s->completed = std::max(s->completed, upto);
}

void Machine::CompleteDeviceLocked(int device, HostCallbacks* run) {
  for (auto& entry : streams_) {
    CUstream_st* s = entry.second;
    if (device == -1 || s->device == device) CompleteLocked(s, s->submitted, run);
  }
}

cudaError_t Machine::Submit(cudaStream_t handle, int device, std::function<void()> host_fn,
                            bool* captured, std::function<void()> replay) {
  if (captured != nullptr) *captured = false;
  HostCallbacks run;
  {
    std::lock_guard<std::mutex> lock(mu_);
    CUstream_st* s = nullptr;
    cudaError_t err = ResolveLocked(handle, device, &s);
    if (err != cudaSuccess) return err;
    if (CaptureLocked(s)) {  // captured, not executed
      if (captured != nullptr) *captured = true;
      if (replay) s->capture_graph->effects.push_back(std::move(replay));
      return cudaSuccess;
    }
    if (s->capture_status == cudaStreamCaptureStatusInvalidated) {
      return cudaErrorStreamCaptureInvalidated;
    }
    PendingWork work;
    work.host_fn = std::move(host_fn);
    SubmitLocked(s, std::move(work), &run);
  }
  Run(&run);
  return cudaSuccess;
}

cudaError_t Machine::QueryStream(cudaStream_t handle, int device) {
  std::lock_guard<std::mutex> lock(mu_);
  CUstream_st* s = nullptr;
  cudaError_t err = ResolveLocked(handle, device, &s);
  if (err != cudaSuccess) return err;
  if (s->capture_status == cudaStreamCaptureStatusActive) {
    s->capture_status = cudaStreamCaptureStatusInvalidated;
    return cudaErrorStreamCaptureUnsupported;
  }
  return s->completed >= s->submitted ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t Machine::SynchronizeStream(cudaStream_t handle, int device) {
  HostCallbacks run;
  {
    std::lock_guard<std::mutex> lock(mu_);
    CUstream_st* s = nullptr;
    cudaError_t err = ResolveLocked(handle, device, &s);
    if (err != cudaSuccess) return err;
    if (s->capture_status == cudaStreamCaptureStatusActive) {
      s->capture_status = cudaStreamCaptureStatusInvalidated;
      return cudaErrorStreamCaptureUnsupported;
    }
    CompleteLocked(s, s->submitted, &run);
  }
  Run(&run);
  return cudaSuccess;
}

void Machine::SynchronizeDevice(int device) {
  HostCallbacks run;
  {
    std::lock_guard<std::mutex> lock(mu_);
    CompleteDeviceLocked(device, &run);
  }
  Run(&run);
}

void Machine::SynchronizeBlockingStreams(int device) {
  HostCallbacks run;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& entry : streams_) {
      CUstream_st* s = entry.second;
      if (s->device == device && (s->flags & cudaStreamNonBlocking) == 0) {
        CompleteLocked(s, s->submitted, &run);
      }
    }
  }
  Run(&run);
}

cudaError_t Machine::CompleteStream(cudaStream_t handle, int device) {
  HostCallbacks run;
  {
    std::lock_guard<std::mutex> lock(mu_);
    CUstream_st* s = nullptr;
    cudaError_t err = ResolveLocked(handle, device, &s);
    if (err != cudaSuccess) return err;
    CompleteLocked(s, s->submitted, &run);
  }
  Run(&run);
  return cudaSuccess;
}

uint64_t Machine::PendingWorkCount(cudaStream_t handle, int device) {
  std::lock_guard<std::mutex> lock(mu_);
  CUstream_st* s = nullptr;
  if (ResolveLocked(handle, device, &s) != cudaSuccess) return 0;
  return s->submitted - s->completed;
}

cudaError_t Machine::CreateEvent(int device, unsigned int flags, cudaEvent_t* out) {
  std::lock_guard<std::mutex> lock(mu_);
  if (DeviceLocked(device) == nullptr) return cudaErrorInvalidDevice;
  if (const cudaError_t err = EnsureContextLocked(device); err != cudaSuccess) return err;
  auto* e = new CUevent_st;
  e->device = device;
  e->flags = flags;
  events_.insert(e);
  *out = e;
  return cudaSuccess;
}

CUevent_st* Machine::EventLocked(cudaEvent_t e) {
  return e != nullptr && events_.count(e) != 0 ? e : nullptr;
}

cudaError_t Machine::EventAndStreamLocked(cudaEvent_t event, cudaStream_t stream, int device,
                                          CUevent_st** e, CUstream_st** s) {
  *e = EventLocked(event);
  if (*e == nullptr) return cudaErrorInvalidResourceHandle;
  return ResolveLocked(stream, device, s);
}

cudaError_t Machine::DestroyEvent(cudaEvent_t event) {
  std::lock_guard<std::mutex> lock(mu_);
  CUevent_st* e = EventLocked(event);
  if (e == nullptr) return cudaErrorInvalidResourceHandle;
  events_.erase(e);
  delete e;
  return cudaSuccess;
}

bool Machine::EventDoneLocked(const CUevent_st* e) {
  if (!e->recorded) return true;
  CUstream_st* s = StreamByIdLocked(e->stream_id);
  return s == nullptr || s->completed >= e->seq;
}

cudaError_t Machine::RecordEvent(cudaEvent_t event, cudaStream_t stream, int device) {
  HostCallbacks run;
  {
    std::lock_guard<std::mutex> lock(mu_);
    CUevent_st* e = nullptr;
    CUstream_st* s = nullptr;
    cudaError_t err = EventAndStreamLocked(event, stream, device, &e, &s);
    if (err != cudaSuccess) return err;
    if (s->device != e->device) return cudaErrorInvalidResourceHandle;
    if (CaptureLocked(s)) return cudaSuccess;  // an event-record node
    SubmitLocked(s, PendingWork(), &run);
    e->recorded = true;
    e->stream_id = s->id;
    e->seq = s->submitted;
    e->recorded_at = std::chrono::steady_clock::now();
  }
  Run(&run);
  return cudaSuccess;
}

cudaError_t Machine::QueryEvent(cudaEvent_t event) {
  std::lock_guard<std::mutex> lock(mu_);
  CUevent_st* e = EventLocked(event);
  if (e == nullptr) return cudaErrorInvalidResourceHandle;
  return EventDoneLocked(e) ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t Machine::SynchronizeEvent(cudaEvent_t event) { return CompleteEvent(event); }

cudaError_t Machine::CompleteEvent(cudaEvent_t event) {
  HostCallbacks run;
  {
    std::lock_guard<std::mutex> lock(mu_);
    CUevent_st* e = EventLocked(event);
    if (e == nullptr) return cudaErrorInvalidResourceHandle;
    if (!EventDoneLocked(e)) CompleteLocked(StreamByIdLocked(e->stream_id), e->seq, &run);
  }
  Run(&run);
  return cudaSuccess;
}

cudaError_t Machine::ElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  std::lock_guard<std::mutex> lock(mu_);
  CUevent_st* a = EventLocked(start);
  CUevent_st* b = EventLocked(end);
  if (a == nullptr || b == nullptr) return cudaErrorInvalidResourceHandle;
  if (((a->flags | b->flags) & cudaEventDisableTiming) != 0 || !a->recorded || !b->recorded) {
    return cudaErrorInvalidResourceHandle;
  }
  if (!EventDoneLocked(a) || !EventDoneLocked(b)) return cudaErrorNotReady;
  *ms = std::chrono::duration<float, std::milli>(b->recorded_at - a->recorded_at).count();
  return cudaSuccess;
}

cudaError_t Machine::WaitEvent(cudaStream_t stream, int device, cudaEvent_t event) {
  HostCallbacks run;
  {
    std::lock_guard<std::mutex> lock(mu_);
    CUevent_st* e = nullptr;
    CUstream_st* s = nullptr;
    cudaError_t err = EventAndStreamLocked(event, stream, device, &e, &s);
    if (err != cudaSuccess) return err;
    if (CaptureLocked(s)) return cudaSuccess;  // an event-wait node
    if (EventDoneLocked(e)) return cudaSuccess;
    PendingWork work;
    work.wait_stream_id = e->stream_id;
    work.wait_seq = e->seq;
    SubmitLocked(s, std::move(work), &run);
  }
  Run(&run);
  return cudaSuccess;
}

void Machine::Reset() {
  HostCallbacks run;
  {
    std::lock_guard<std::mutex> lock(mu_);
    CompleteDeviceLocked(-1, &run);
    for (auto& entry : streams_) {
      CUstream_st* s = entry.second;
      graphs_.erase(s->capture_graph);
      delete s->capture_graph;
      s->capture_status = cudaStreamCaptureStatusNone;
      s->capture_graph = nullptr;
    }
    active_captures_ = 0;
    mode_ = initial_mode_;
    default_capacity_ = initial_capacities_.empty() ? kDefaultCapacity : initial_capacities_.back();
    for (size_t d = 0; d < devices_.size(); ++d) {
      devices_[d]->capacity =
          d < initial_capacities_.size() ? initial_capacities_[d] : default_capacity_;
    }
  }
  Run(&run);
}

}  // namespace rt
}  // namespace simcuda
