// Event calls. An event recorded on a stream completes when the stream's work
// up to the record completes (at once in immediate mode; see machine.h).
#include "runtime/api_entry.h"
#include "runtime/machine.h"

using simcuda::rt::CurrentDevice;
using simcuda::rt::Machine;
using simcuda::rt::Result;

namespace {

constexpr unsigned int kEventFlags =
    cudaEventBlockingSync | cudaEventDisableTiming | cudaEventInterprocess;

cudaError_t Create(cudaEvent_t* event, unsigned int flags) {
  if (event == nullptr || (flags & ~kEventFlags) != 0) return cudaErrorInvalidValue;
  return Machine::Get().CreateEvent(CurrentDevice(), flags, event);
}

}  // namespace

extern "C" {

cudaError_t cudaEventCreate(cudaEvent_t* event) {
  SIMCUDA_ENTER();
  return Result(Create(event, cudaEventDefault));
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int flags) {
  SIMCUDA_ENTER();
  return Result(Create(event, flags));
}

cudaError_t cudaEventDestroy(cudaEvent_t event) {
  SIMCUDA_ENTER();
  return Result(Machine::Get().DestroyEvent(event));
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  SIMCUDA_ENTER();
  return Result(Machine::Get().RecordEvent(event, stream, CurrentDevice()));
}

cudaError_t cudaEventRecordWithFlags(cudaEvent_t event, cudaStream_t stream, unsigned int flags) {
  SIMCUDA_ENTER();
  return Result(Machine::Get().RecordEvent(event, stream, CurrentDevice()));
}

cudaError_t cudaEventQuery(cudaEvent_t event) {
  SIMCUDA_ENTER();
  return Result(Machine::Get().QueryEvent(event));
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  SIMCUDA_ENTER();
  return Result(Machine::Get().SynchronizeEvent(event));
}

cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  SIMCUDA_ENTER();
  if (ms == nullptr) return Result(cudaErrorInvalidValue);
  return Result(Machine::Get().ElapsedTime(ms, start, end));
}

}  // extern "C"
