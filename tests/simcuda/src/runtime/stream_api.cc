// Stream calls: creation with flags and priorities, queries, synchronisation,
// cross-stream waits and host functions. nullptr and cudaStreamLegacy name
// the current device's legacy default stream, cudaStreamPerThread the calling
// thread's default stream.
#include "runtime/api_entry.h"
#include "runtime/machine.h"

using simcuda::rt::CurrentDevice;
using simcuda::rt::Machine;
using simcuda::rt::Result;

namespace {

int ClampPriority(int priority) {
  // cudaDeviceGetStreamPriorityRange reports [0, -5] (least, greatest).
  return priority > 0 ? 0 : (priority < -5 ? -5 : priority);
}

cudaError_t Create(cudaStream_t* stream, unsigned int flags, int priority) {
  if (stream == nullptr) return cudaErrorInvalidValue;
  if ((flags & ~cudaStreamNonBlocking) != 0) return cudaErrorInvalidValue;
  return Machine::Get().CreateStream(CurrentDevice(), flags, ClampPriority(priority), stream);
}

// Reads one property of a stream into *out.
template <typename T, typename Field>
cudaError_t StreamProperty(cudaStream_t stream, T* out, Field field) {
  if (out == nullptr) return cudaErrorInvalidValue;
  CUstream_st* s = nullptr;
  cudaError_t err = Machine::Get().ResolveStream(stream, CurrentDevice(), &s);
  if (err == cudaSuccess) *out = field(*s);
  return err;
}

}  // namespace

extern "C" {

cudaError_t cudaStreamCreate(cudaStream_t* stream) {
  SIMCUDA_ENTER();
  return Result(Create(stream, cudaStreamDefault, 0));
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int flags) {
  SIMCUDA_ENTER();
  return Result(Create(stream, flags, 0));
}

cudaError_t cudaStreamCreateWithPriority(cudaStream_t* stream, unsigned int flags, int priority) {
  SIMCUDA_ENTER();
  return Result(Create(stream, flags, priority));
}

cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  SIMCUDA_ENTER();
  return Result(Machine::Get().DestroyStream(stream, CurrentDevice()));
}

cudaError_t cudaStreamQuery(cudaStream_t stream) {
  SIMCUDA_ENTER();
  return Result(Machine::Get().QueryStream(stream, CurrentDevice()));
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  SIMCUDA_ENTER();
  return Result(Machine::Get().SynchronizeStream(stream, CurrentDevice()));
}

cudaError_t cudaStreamGetPriority(cudaStream_t stream, int* priority) {
  SIMCUDA_ENTER();
  return Result(StreamProperty(stream, priority, [](const CUstream_st& s) { return s.priority; }));
}

cudaError_t cudaStreamGetFlags(cudaStream_t stream, unsigned int* flags) {
  SIMCUDA_ENTER();
  return Result(StreamProperty(stream, flags, [](const CUstream_st& s) { return s.flags; }));
}

cudaError_t cudaStreamGetId(cudaStream_t stream, unsigned long long* id) {
  SIMCUDA_ENTER();
  return Result(StreamProperty(stream, id, [](const CUstream_st& s) { return s.id; }));
}

cudaError_t cudaStreamGetDevice(cudaStream_t stream, int* device) {
  SIMCUDA_ENTER();
  return Result(StreamProperty(stream, device, [](const CUstream_st& s) { return s.device; }));
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags) {
  SIMCUDA_ENTER();
  return Result(Machine::Get().WaitEvent(stream, CurrentDevice(), event));
}

cudaError_t cudaLaunchHostFunc(cudaStream_t stream, cudaHostFn_t fn, void* user_data) {
  SIMCUDA_ENTER();
  if (fn == nullptr) return Result(cudaErrorInvalidValue);
  return Result(Machine::Get().Submit(stream, CurrentDevice(), [fn, user_data] { fn(user_data); }));
}

cudaError_t cudaStreamAddCallback(cudaStream_t stream, cudaStreamCallback_t callback,
                                  void* user_data, unsigned int flags) {
  SIMCUDA_ENTER();
  if (callback == nullptr || flags != 0) return Result(cudaErrorInvalidValue);
  return Result(Machine::Get().Submit(stream, CurrentDevice(), [callback, stream, user_data] {
    callback(stream, cudaSuccess, user_data);
  }));
}

}  // extern "C"
