// Memory calls: device, managed and stream-ordered allocation against the
// simulated capacity, pinned and registered host memory, cudaMemGetInfo and
// cudaPointerGetAttributes.
#include "runtime/api_entry.h"
#include "runtime/machine.h"

using simcuda::rt::CurrentDevice;
using simcuda::rt::Machine;
using simcuda::rt::MemoryKind;
using simcuda::rt::Result;

namespace {

cudaError_t AllocateOnCurrentDevice(void** ptr, size_t size, MemoryKind kind) {
  if (ptr == nullptr) return cudaErrorInvalidValue;
  // cudaMalloc may synchronise, so it is an unsafe call during a capture.
  cudaError_t err = Machine::Get().CheckUnsafeCall(simcuda::rt::ThreadCaptureMode());
  if (err != cudaSuccess) return err;
  return Machine::Get().AllocateDevice(CurrentDevice(), size, kind, ptr);
}

}  // namespace

extern "C" {

cudaError_t cudaMalloc(void** dev_ptr, size_t size) {
  SIMCUDA_ENTER();
  return Result(AllocateOnCurrentDevice(dev_ptr, size, MemoryKind::kDevice));
}

cudaError_t cudaMallocManaged(void** dev_ptr, size_t size, unsigned int flags) {
  SIMCUDA_ENTER();
  return Result(AllocateOnCurrentDevice(dev_ptr, size, MemoryKind::kManaged));
}

cudaError_t cudaMallocPitch(void** dev_ptr, size_t* pitch, size_t width, size_t height) {
  SIMCUDA_ENTER();
  if (pitch == nullptr) return Result(cudaErrorInvalidValue);
  *pitch = (width + 511) / 512 * 512;
  return Result(AllocateOnCurrentDevice(dev_ptr, *pitch * height, MemoryKind::kDevice));
}

cudaError_t cudaFree(void* dev_ptr) {
  SIMCUDA_ENTER();
  cudaError_t err = Machine::Get().CheckUnsafeCall(simcuda::rt::ThreadCaptureMode());
  if (err != cudaSuccess) return Result(err);
  // cudaFree(nullptr) is the usual way to create the current device's context.
  err = Machine::Get().EnsureContext(CurrentDevice());
  if (err != cudaSuccess) return Result(err);
  return Result(Machine::Get().FreeDevice(dev_ptr));
}

cudaError_t cudaMallocAsync(void** dev_ptr, size_t size, cudaStream_t stream) {
  SIMCUDA_ENTER();
  if (dev_ptr == nullptr) return Result(cudaErrorInvalidValue);
  Machine& m = Machine::Get();
  CUstream_st* s = nullptr;
  cudaError_t err = m.ResolveStream(stream, CurrentDevice(), &s);
  if (err != cudaSuccess) return Result(err);
  err = m.AllocateDevice(s->device, size, MemoryKind::kDevice, dev_ptr);
  if (err == cudaSuccess) err = m.Submit(stream, CurrentDevice());
  return Result(err);
}

cudaError_t cudaFreeAsync(void* dev_ptr, cudaStream_t stream) {
  SIMCUDA_ENTER();
  Machine& m = Machine::Get();
  cudaError_t err = m.Submit(stream, CurrentDevice());
  // Stream-ordered in CUDA; released at once here.
  if (err == cudaSuccess) err = m.FreeDevice(dev_ptr);
  return Result(err);
}

cudaError_t cudaMallocHost(void** ptr, size_t size) {
  SIMCUDA_ENTER();
  if (ptr == nullptr) return Result(cudaErrorInvalidValue);
  return Result(Machine::Get().AllocateHost(size, ptr));
}

cudaError_t cudaHostAlloc(void** ptr, size_t size, unsigned int flags) {
  SIMCUDA_ENTER();
  if (ptr == nullptr) return Result(cudaErrorInvalidValue);
  return Result(Machine::Get().AllocateHost(size, ptr));
}

cudaError_t cudaFreeHost(void* ptr) {
  SIMCUDA_ENTER();
  return Result(Machine::Get().FreeHost(ptr));
}

cudaError_t cudaHostRegister(void* ptr, size_t size, unsigned int flags) {
  SIMCUDA_ENTER();
  return Result(Machine::Get().RegisterHost(ptr, size));
}

cudaError_t cudaHostUnregister(void* ptr) {
  SIMCUDA_ENTER();
  return Result(Machine::Get().UnregisterHost(ptr));
}

cudaError_t cudaHostGetDevicePointer(void** device_ptr, void* host_ptr, unsigned int flags) {
  SIMCUDA_ENTER();
  simcuda::rt::Allocation a;
  if (device_ptr == nullptr || !Machine::Get().Lookup(host_ptr, &a) ||
      (a.kind != MemoryKind::kHostPinned && a.kind != MemoryKind::kHostRegistered)) {
    return Result(cudaErrorInvalidValue);
  }
  *device_ptr = host_ptr;  // unified addressing: the same address
  return cudaSuccess;
}

cudaError_t cudaHostGetFlags(unsigned int* flags, void* host_ptr) {
  SIMCUDA_ENTER();
  simcuda::rt::Allocation a;
  if (flags == nullptr || !Machine::Get().Lookup(host_ptr, &a) ||
      a.kind != MemoryKind::kHostPinned) {
    return Result(cudaErrorInvalidValue);
  }
  *flags = cudaHostAllocDefault;
  return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t* free, size_t* total) {
  SIMCUDA_ENTER();
  Machine& m = Machine::Get();
  const int device = CurrentDevice();
  if (!m.ValidDevice(device)) return Result(cudaErrorInvalidDevice);
  if (const cudaError_t err = m.EnsureContext(device); err != cudaSuccess) return Result(err);
  const uint64_t capacity = m.Capacity(device);
  const uint64_t used = m.UsedBytes(device);
  if (free != nullptr) *free = used < capacity ? capacity - used : 0;
  if (total != nullptr) *total = capacity;
  return cudaSuccess;
}

cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* attributes, const void* ptr) {
  SIMCUDA_ENTER();
  if (attributes == nullptr) return Result(cudaErrorInvalidValue);
  simcuda::rt::Allocation a;
  *attributes = cudaPointerAttributes();
  attributes->device = -2;
  if (!Machine::Get().Lookup(ptr, &a)) {
    attributes->type = cudaMemoryTypeUnregistered;
    return cudaSuccess;
  }
  void* p = const_cast<void*>(ptr);
  switch (a.kind) {
    case MemoryKind::kDevice:
    case MemoryKind::kIpcOpened:
      attributes->type = cudaMemoryTypeDevice;
      attributes->device = a.device;
      attributes->devicePointer = p;
      break;
    case MemoryKind::kManaged:
      attributes->type = cudaMemoryTypeManaged;
      attributes->device = a.device;
      attributes->devicePointer = p;
      attributes->hostPointer = p;
      break;
    case MemoryKind::kHostPinned:
    case MemoryKind::kHostRegistered:
      attributes->type = cudaMemoryTypeHost;
      attributes->device = CurrentDevice();
      attributes->devicePointer = p;
      attributes->hostPointer = p;
      break;
  }
  return cudaSuccess;
}

cudaChannelFormatDesc cudaCreateChannelDesc(int x, int y, int z, int w, cudaChannelFormatKind f) {
  SIMCUDA_COUNT();
  cudaChannelFormatDesc desc;
  desc.x = x;
  desc.y = y;
  desc.z = z;
  desc.w = w;
  desc.f = f;
  return desc;
}

}  // extern "C"
