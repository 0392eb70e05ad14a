// CUDA IPC calls: device memory and events shared between processes (see
// machine_ipc.cc for how the simulator does it).
#include "runtime/api_entry.h"
#include "runtime/machine.h"

using simcuda::rt::CurrentDevice;
using simcuda::rt::Machine;
using simcuda::rt::Result;

extern "C" {

cudaError_t cudaIpcGetMemHandle(cudaIpcMemHandle_t* handle, void* dev_ptr) {
  SIMCUDA_ENTER();
  if (handle == nullptr || dev_ptr == nullptr) return Result(cudaErrorInvalidValue);
  return Result(Machine::Get().ShareMemory(dev_ptr, handle));
}

cudaError_t cudaIpcOpenMemHandle(void** dev_ptr, cudaIpcMemHandle_t handle, unsigned int flags) {
  SIMCUDA_ENTER();
  if (dev_ptr == nullptr || (flags & ~cudaIpcMemLazyEnablePeerAccess) != 0) {
    return Result(cudaErrorInvalidValue);
  }
  return Result(Machine::Get().OpenSharedMemory(handle, CurrentDevice(), dev_ptr));
}

cudaError_t cudaIpcCloseMemHandle(void* dev_ptr) {
  SIMCUDA_ENTER();
  return Result(Machine::Get().CloseSharedMemory(dev_ptr));
}

cudaError_t cudaIpcGetEventHandle(cudaIpcEventHandle_t* handle, cudaEvent_t event) {
  SIMCUDA_ENTER();
  if (handle == nullptr) return Result(cudaErrorInvalidValue);
  return Result(Machine::Get().ShareEvent(event, handle));
}

cudaError_t cudaIpcOpenEventHandle(cudaEvent_t* event, cudaIpcEventHandle_t handle) {
  SIMCUDA_ENTER();
  if (event == nullptr) return Result(cudaErrorInvalidValue);
  return Result(Machine::Get().OpenSharedEvent(handle, CurrentDevice(), event));
}

}  // extern "C"
