// Stream capture and graph calls: "not capturing" unless a test begins a
// capture; a capture records how much work it saw; graphs instantiate and
// launch as one unit of stream work.
#include "runtime/api_entry.h"
#include "runtime/machine.h"

using simcuda::rt::CurrentDevice;
using simcuda::rt::Machine;
using simcuda::rt::Result;

namespace simcuda {
namespace rt {
namespace {
thread_local cudaStreamCaptureMode t_capture_mode = cudaStreamCaptureModeGlobal;
}  // namespace

cudaStreamCaptureMode ThreadCaptureMode() { return t_capture_mode; }

}  // namespace rt
}  // namespace simcuda

extern "C" {

cudaError_t cudaThreadExchangeStreamCaptureMode(cudaStreamCaptureMode* mode) {
  SIMCUDA_ENTER();
  if (mode == nullptr || *mode < cudaStreamCaptureModeGlobal ||
      *mode > cudaStreamCaptureModeRelaxed) {
    return Result(cudaErrorInvalidValue);
  }
  std::swap(*mode, simcuda::rt::t_capture_mode);
  return cudaSuccess;
}

cudaError_t cudaStreamBeginCapture(cudaStream_t stream, cudaStreamCaptureMode mode) {
  SIMCUDA_ENTER();
  if (mode < cudaStreamCaptureModeGlobal || mode > cudaStreamCaptureModeRelaxed) {
    return Result(cudaErrorInvalidValue);
  }
  return Result(Machine::Get().BeginCapture(stream, CurrentDevice(), mode));
}

cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* graph) {
  SIMCUDA_ENTER();
  if (graph == nullptr) return Result(cudaErrorInvalidValue);
  return Result(Machine::Get().EndCapture(stream, CurrentDevice(), graph));
}

cudaError_t cudaStreamIsCapturing(cudaStream_t stream, cudaStreamCaptureStatus* status) {
  SIMCUDA_ENTER();
  if (status == nullptr) return Result(cudaErrorInvalidValue);
  return Result(Machine::Get().CaptureStatus(stream, CurrentDevice(), status, nullptr, nullptr));
}

// Capture info and dependency updates: the dependency list of a simulated
// capture is always empty (graphs are dummies).
namespace {
cudaError_t CaptureInfo(cudaStream_t stream, cudaStreamCaptureStatus* status,
                        unsigned long long* id, cudaGraph_t* graph,
                        const cudaGraphNode_t** dependencies, const cudaGraphEdgeData** edge_data,
                        size_t* num_dependencies) {
  if (status == nullptr) return Result(cudaErrorInvalidValue);
  if (dependencies != nullptr) *dependencies = nullptr;
  if (edge_data != nullptr) *edge_data = nullptr;
  if (num_dependencies != nullptr) *num_dependencies = 0;
  return Result(Machine::Get().CaptureStatus(stream, CurrentDevice(), status, id, graph));
}

cudaError_t UpdateCaptureDependencies(cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  cudaError_t err =
      Machine::Get().CaptureStatus(stream, CurrentDevice(), &status, nullptr, nullptr);
  if (err == cudaSuccess && status != cudaStreamCaptureStatusActive) err = cudaErrorIllegalState;
  return Result(err);
}
}  // namespace

#if CUDART_VERSION >= 13000
// CUDA 13: one call each, with edge data.
cudaError_t cudaStreamGetCaptureInfo(cudaStream_t stream, cudaStreamCaptureStatus* status,
                                     unsigned long long* id, cudaGraph_t* graph,
                                     const cudaGraphNode_t** dependencies,
                                     const cudaGraphEdgeData** edge_data,
                                     size_t* num_dependencies) {
  SIMCUDA_ENTER();
  return CaptureInfo(stream, status, id, graph, dependencies, edge_data, num_dependencies);
}

cudaError_t cudaStreamUpdateCaptureDependencies(cudaStream_t stream, cudaGraphNode_t* dependencies,
                                                const cudaGraphEdgeData* dependency_data,
                                                size_t num_dependencies, unsigned int flags) {
  SIMCUDA_ENTER();
  return UpdateCaptureDependencies(stream);
}
#else
// CUDA 12: the header maps cudaStreamGetCaptureInfo to _v2 (no edge data);
// _v3 and UpdateCaptureDependencies_v2 add edge data.
cudaError_t cudaStreamGetCaptureInfo_v2(cudaStream_t stream, cudaStreamCaptureStatus* status,
                                        unsigned long long* id, cudaGraph_t* graph,
                                        const cudaGraphNode_t** dependencies,
                                        size_t* num_dependencies) {
  SIMCUDA_ENTER();
  return CaptureInfo(stream, status, id, graph, dependencies, nullptr, num_dependencies);
}

cudaError_t cudaStreamGetCaptureInfo_v3(cudaStream_t stream, cudaStreamCaptureStatus* status,
                                        unsigned long long* id, cudaGraph_t* graph,
                                        const cudaGraphNode_t** dependencies,
                                        const cudaGraphEdgeData** edge_data,
                                        size_t* num_dependencies) {
  SIMCUDA_ENTER();
  return CaptureInfo(stream, status, id, graph, dependencies, edge_data, num_dependencies);
}

cudaError_t cudaStreamUpdateCaptureDependencies(cudaStream_t stream, cudaGraphNode_t* dependencies,
                                                size_t num_dependencies, unsigned int flags) {
  SIMCUDA_ENTER();
  return UpdateCaptureDependencies(stream);
}

cudaError_t cudaStreamUpdateCaptureDependencies_v2(cudaStream_t stream,
                                                   cudaGraphNode_t* dependencies,
                                                   const cudaGraphEdgeData* dependency_data,
                                                   size_t num_dependencies, unsigned int flags) {
  SIMCUDA_ENTER();
  return UpdateCaptureDependencies(stream);
}
#endif

cudaError_t cudaGraphCreate(cudaGraph_t* graph, unsigned int flags) {
  SIMCUDA_ENTER();
  if (graph == nullptr || flags != 0) return Result(cudaErrorInvalidValue);
  *graph = Machine::Get().NewGraph();
  return cudaSuccess;
}

cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
  SIMCUDA_ENTER();
  return Result(Machine::Get().DestroyGraph(graph));
}

cudaError_t cudaGraphGetNodes(cudaGraph_t graph, cudaGraphNode_t* nodes, size_t* num_nodes) {
  SIMCUDA_ENTER();
  if (num_nodes == nullptr) return Result(cudaErrorInvalidValue);
  *num_nodes = 0;  // captured work is counted, not kept as nodes
  return cudaSuccess;
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph,
                                 unsigned long long flags) {
  SIMCUDA_ENTER();
  if (exec == nullptr) return Result(cudaErrorInvalidValue);
  return Result(Machine::Get().Instantiate(graph, exec));
}

cudaError_t cudaGraphInstantiateWithFlags(cudaGraphExec_t* exec, cudaGraph_t graph,
                                          unsigned long long flags) {
  SIMCUDA_ENTER();
  if (exec == nullptr) return Result(cudaErrorInvalidValue);
  return Result(Machine::Get().Instantiate(graph, exec));
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
  SIMCUDA_ENTER();
  return Result(Machine::Get().DestroyGraphExec(exec));
}

cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream) {
  SIMCUDA_ENTER();
  return Result(Machine::Get().LaunchGraph(exec, stream, CurrentDevice()));
}

}  // extern "C"
