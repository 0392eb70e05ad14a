// Stream capture and graphs of the simulated machine: enough of CUDA's rules
// for allocators to be tested against (status queries, the prohibition of
// unsafe calls such as cudaMalloc during a global-mode capture, invalidation),
// with graphs that count the work captured into them and replay the data
// effects of captured copies and memsets when launched.
#include "runtime/machine.h"

namespace simcuda {
namespace rt {

cudaError_t Machine::BeginCapture(cudaStream_t stream, int device, cudaStreamCaptureMode mode) {
  std::lock_guard<std::mutex> lock(mu_);
  CUstream_st* s = nullptr;
  cudaError_t err = ResolveLocked(stream, device, &s);
  if (err != cudaSuccess) return err;
  if (stream == nullptr || stream == cudaStreamLegacy) return cudaErrorStreamCaptureUnsupported;
  if (s->capture_status != cudaStreamCaptureStatusNone) return cudaErrorIllegalState;
  s->capture_status = cudaStreamCaptureStatusActive;
  s->capture_mode = mode;
  s->capture_id = next_capture_id_++;
  s->capture_thread = std::this_thread::get_id();
  s->capture_graph = new CUgraph_st;
  graphs_.insert(s->capture_graph);
  ++active_captures_;
  return cudaSuccess;
}

cudaError_t Machine::EndCapture(cudaStream_t stream, int device, cudaGraph_t* graph) {
  std::lock_guard<std::mutex> lock(mu_);
  CUstream_st* s = nullptr;
  cudaError_t err = ResolveLocked(stream, device, &s);
  if (err != cudaSuccess) return err;
  if (s->capture_status == cudaStreamCaptureStatusNone) return cudaErrorIllegalState;
  if (s->capture_mode != cudaStreamCaptureModeRelaxed &&
      s->capture_thread != std::this_thread::get_id()) {
    return cudaErrorStreamCaptureWrongThread;
  }
  const bool invalidated = s->capture_status == cudaStreamCaptureStatusInvalidated;
  CUgraph_st* captured = s->capture_graph;
  s->capture_status = cudaStreamCaptureStatusNone;
  s->capture_graph = nullptr;
  --active_captures_;
  if (invalidated) {
    graphs_.erase(captured);
    delete captured;
    *graph = nullptr;
    return cudaErrorStreamCaptureInvalidated;
  }
  *graph = captured;
  return cudaSuccess;
}

cudaError_t Machine::CaptureStatus(cudaStream_t stream, int device, cudaStreamCaptureStatus* status,
                                   unsigned long long* id, cudaGraph_t* graph) {
  std::lock_guard<std::mutex> lock(mu_);
  CUstream_st* s = nullptr;
  cudaError_t err = ResolveLocked(stream, device, &s);
  if (err != cudaSuccess) return err;
  if (status != nullptr) *status = s->capture_status;
  if (id != nullptr) *id = s->capture_status == cudaStreamCaptureStatusNone ? 0 : s->capture_id;
  if (graph != nullptr) *graph = s->capture_graph;
  return cudaSuccess;
}

cudaError_t Machine::CheckUnsafeCall(cudaStreamCaptureMode thread_mode) {
  if (thread_mode == cudaStreamCaptureModeRelaxed) return cudaSuccess;
  std::lock_guard<std::mutex> lock(mu_);
  if (active_captures_ == 0) return cudaSuccess;
  const std::thread::id self = std::this_thread::get_id();
  bool prohibited = false;
  for (auto& entry : streams_) {
    CUstream_st* s = entry.second;
    if (s->capture_status != cudaStreamCaptureStatusActive) continue;
    const bool mine = s->capture_thread == self;
    if ((mine && s->capture_mode != cudaStreamCaptureModeRelaxed) ||
        (!mine && thread_mode == cudaStreamCaptureModeGlobal &&
         s->capture_mode == cudaStreamCaptureModeGlobal)) {
      s->capture_status = cudaStreamCaptureStatusInvalidated;
      prohibited = true;
    }
  }
  return prohibited ? cudaErrorStreamCaptureUnsupported : cudaSuccess;
}

cudaGraph_t Machine::NewGraph() {
  std::lock_guard<std::mutex> lock(mu_);
  auto* g = new CUgraph_st;
  graphs_.insert(g);
  return g;
}

cudaError_t Machine::DestroyGraph(cudaGraph_t graph) {
  std::lock_guard<std::mutex> lock(mu_);
  if (graphs_.erase(graph) == 0) return cudaErrorInvalidValue;
  delete graph;
  return cudaSuccess;
}

cudaError_t Machine::Instantiate(cudaGraph_t graph, cudaGraphExec_t* exec) {
  std::lock_guard<std::mutex> lock(mu_);
  if (graphs_.count(graph) == 0) return cudaErrorInvalidValue;
  auto* e = new CUgraphExec_st;
  e->work = graph->captured_work;
  e->effects = graph->effects;
  graph_execs_.insert(e);
  *exec = e;
  return cudaSuccess;
}

cudaError_t Machine::DestroyGraphExec(cudaGraphExec_t exec) {
  std::lock_guard<std::mutex> lock(mu_);
  if (graph_execs_.erase(exec) == 0) return cudaErrorInvalidValue;
  delete exec;
  return cudaSuccess;
}

cudaError_t Machine::LaunchGraph(cudaGraphExec_t exec, cudaStream_t stream, int device) {
  std::vector<std::function<void()>> effects;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (graph_execs_.count(exec) == 0) return cudaErrorInvalidValue;
    effects = exec->effects;
  }
  cudaError_t err = Submit(stream, device);
  // The captured copies and memsets write again, at submission like every
  // data effect of the simulator.
  if (err == cudaSuccess) {
    for (const auto& effect : effects) effect();
  }
  return err;
}

}  // namespace rt
}  // namespace simcuda
