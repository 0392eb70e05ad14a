// Copies and memsets. Device memory is host memory, so every copy is a real
// memcpy, done when the call is made (asynchronous ones also occupy their
// stream, so their completion follows the completion model). An
// asynchronous copy or memset captured into a graph does nothing then and
// is done again at every launch of the graph. Pointers that
// the copy kind says are on the device must lie inside one simulated
// allocation (device, managed, or pinned/registered host memory), or the call
// fails with cudaErrorInvalidValue.
#include <cstring>

#include "runtime/api_entry.h"
#include "runtime/machine.h"
#include "runtime/registration.h"

using simcuda::rt::CurrentDevice;
using simcuda::rt::Machine;
using simcuda::rt::Result;

namespace {

// The device that executes work on `stream` (its own device; the current
// device for the default streams and for handles the machine rejects, which
// the submission then reports).
int ExecutingDevice(cudaStream_t stream) {
  CUstream_st* s = nullptr;
  if (Machine::Get().ResolveStream(stream, CurrentDevice(), &s) == cudaSuccess) return s->device;
  return CurrentDevice();
}

// Checks a copy that touches `dst_span` bytes at dst and `src_span` at src:
// the sides the kind calls "device" must lie inside one simulated allocation,
// and pages the driver mapped must grant access to the device that touches
// them (`dst_accessor`, `src_accessor`): the device executing the copy, or
// each side's own device for peer copies.
cudaError_t CheckSpans(void* dst, size_t dst_span, const void* src, size_t src_span,
                       cudaMemcpyKind kind, int dst_accessor, int src_accessor) {
  if (dst_span == 0 && src_span == 0) return cudaSuccess;
  if (dst == nullptr || src == nullptr) return cudaErrorInvalidValue;
  if (kind < cudaMemcpyHostToHost || kind > cudaMemcpyDefault)
    return cudaErrorInvalidMemcpyDirection;
  Machine& m = Machine::Get();
  const bool dst_device = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
  const bool src_device = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
  if (dst_device && m.CheckDeviceRange(dst, dst_span, dst_accessor) != cudaSuccess) {
    return cudaErrorInvalidValue;
  }
  if (src_device && m.CheckDeviceRange(src, src_span, src_accessor) != cudaSuccess) {
    return cudaErrorInvalidValue;
  }
  return cudaSuccess;
}

cudaError_t CheckCopy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                      int dst_accessor, int src_accessor) {
  return CheckSpans(dst, bytes, src, bytes, kind, dst_accessor, src_accessor);
}

// A 2D copy: `height` rows of `width` bytes, rows `dpitch` / `spitch` apart.
cudaError_t Check2D(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width,
                    size_t height, cudaMemcpyKind kind) {
  if (width > dpitch || width > spitch) return cudaErrorInvalidPitchValue;
  if (height == 0 || width == 0) return cudaSuccess;
  return CheckSpans(dst, (height - 1) * dpitch + width, src, (height - 1) * spitch + width, kind,
                    CurrentDevice(), CurrentDevice());
}

void Copy2D(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t height) {
  for (size_t row = 0; row < height; ++row) {
    std::memmove(static_cast<char*>(dst) + row * dpitch,
                 static_cast<const char*>(src) + row * spitch, width);
  }
}

cudaError_t SyncCopy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                     int dst_accessor, int src_accessor) {
  cudaError_t err = CheckCopy(dst, src, bytes, kind, dst_accessor, src_accessor);
  if (err != cudaSuccess) return err;
  err = Machine::Get().CheckUnsafeCall(simcuda::rt::ThreadCaptureMode());
  if (err != cudaSuccess) return err;
  Machine::Get().SynchronizeBlockingStreams(CurrentDevice());
  if (bytes != 0) std::memmove(dst, src, bytes);
  return cudaSuccess;
}

cudaError_t AsyncCopy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                      cudaStream_t stream, int dst_accessor, int src_accessor) {
  cudaError_t err = CheckCopy(dst, src, bytes, kind, dst_accessor, src_accessor);
  if (err != cudaSuccess) return err;
  bool captured = false;
  auto effect = [dst, src, bytes] {
    if (bytes != 0) std::memmove(dst, src, bytes);
  };
  err = Machine::Get().Submit(stream, CurrentDevice(), nullptr, &captured, effect);
  if (err == cudaSuccess && !captured) effect();
  return err;
}

cudaError_t CheckSet(void* dst, size_t bytes) {
  if (bytes == 0) return cudaSuccess;
  return Machine::Get().CheckDeviceRange(dst, bytes, CurrentDevice());
}

cudaError_t SymbolRange(const void* symbol, size_t count, size_t offset, char** address) {
  size_t size = 0;
  if (!simcuda::rt::SymbolStorage(symbol, address, &size)) return cudaErrorInvalidSymbol;
  if (offset > size || count > size - offset) return cudaErrorInvalidValue;
  *address += offset;
  return cudaSuccess;
}

}  // namespace

extern "C" {

cudaError_t cudaMemcpy(void* dst, const void* src, size_t count, cudaMemcpyKind kind) {
  SIMCUDA_ENTER();
  return Result(SyncCopy(dst, src, count, kind, CurrentDevice(), CurrentDevice()));
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t count, cudaMemcpyKind kind,
                            cudaStream_t stream) {
  SIMCUDA_ENTER();
  const int executing = ExecutingDevice(stream);
  return Result(AsyncCopy(dst, src, count, kind, stream, executing, executing));
}

cudaError_t cudaMemcpyPeer(void* dst, int dst_device, const void* src, int src_device,
                           size_t count) {
  SIMCUDA_ENTER();
  return Result(SyncCopy(dst, src, count, cudaMemcpyDeviceToDevice, dst_device, src_device));
}

cudaError_t cudaMemcpyPeerAsync(void* dst, int dst_device, const void* src, int src_device,
                                size_t count, cudaStream_t stream) {
  SIMCUDA_ENTER();
  return Result(
      AsyncCopy(dst, src, count, cudaMemcpyDeviceToDevice, stream, dst_device, src_device));
}

cudaError_t cudaMemcpy2D(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width,
                         size_t height, cudaMemcpyKind kind) {
  SIMCUDA_ENTER();
  cudaError_t err = Check2D(dst, dpitch, src, spitch, width, height, kind);
  if (err != cudaSuccess || height == 0 || width == 0) return Result(err);
  Machine::Get().SynchronizeBlockingStreams(CurrentDevice());
  Copy2D(dst, dpitch, src, spitch, width, height);
  return cudaSuccess;
}

cudaError_t cudaMemcpy2DAsync(void* dst, size_t dpitch, const void* src, size_t spitch,
                              size_t width, size_t height, cudaMemcpyKind kind,
                              cudaStream_t stream) {
  SIMCUDA_ENTER();
  cudaError_t err = Check2D(dst, dpitch, src, spitch, width, height, kind);
  if (err != cudaSuccess || height == 0 || width == 0) return Result(err);
  bool captured = false;
  auto effect = [=] { Copy2D(dst, dpitch, src, spitch, width, height); };
  err = Machine::Get().Submit(stream, CurrentDevice(), nullptr, &captured, effect);
  if (err == cudaSuccess && !captured) effect();
  return Result(err);
}

cudaError_t cudaMemset(void* dev_ptr, int value, size_t count) {
  SIMCUDA_ENTER();
  cudaError_t err = CheckSet(dev_ptr, count);
  if (err != cudaSuccess) return Result(err);
  Machine::Get().SynchronizeBlockingStreams(CurrentDevice());
  if (count != 0) std::memset(dev_ptr, value, count);
  return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void* dev_ptr, int value, size_t count, cudaStream_t stream) {
  SIMCUDA_ENTER();
  cudaError_t err = CheckSet(dev_ptr, count);
  if (err != cudaSuccess) return Result(err);
  bool captured = false;
  auto effect = [dev_ptr, value, count] {
    if (count != 0) std::memset(dev_ptr, value, count);
  };
  err = Machine::Get().Submit(stream, CurrentDevice(), nullptr, &captured, effect);
  if (err == cudaSuccess && !captured) effect();
  return Result(err);
}

cudaError_t cudaMemset2D(void* dev_ptr, size_t pitch, int value, size_t width, size_t height) {
  SIMCUDA_ENTER();
  if (width > pitch) return Result(cudaErrorInvalidPitchValue);
  if (height == 0 || width == 0) return cudaSuccess;
  cudaError_t err = CheckSet(dev_ptr, (height - 1) * pitch + width);
  if (err != cudaSuccess) return Result(err);
  for (size_t row = 0; row < height; ++row) {
    std::memset(static_cast<char*>(dev_ptr) + row * pitch, value, width);
  }
  return cudaSuccess;
}

cudaError_t cudaMemcpyToSymbol(const void* symbol, const void* src, size_t count, size_t offset,
                               cudaMemcpyKind kind) {
  SIMCUDA_ENTER();
  char* address = nullptr;
  cudaError_t err = SymbolRange(symbol, count, offset, &address);
  if (err == cudaSuccess && count != 0) std::memcpy(address, src, count);
  return Result(err);
}

cudaError_t cudaMemcpyToSymbolAsync(const void* symbol, const void* src, size_t count,
                                    size_t offset, cudaMemcpyKind kind, cudaStream_t stream) {
  SIMCUDA_ENTER();
  char* address = nullptr;
  cudaError_t err = SymbolRange(symbol, count, offset, &address);
  if (err == cudaSuccess) err = Machine::Get().Submit(stream, CurrentDevice());
  if (err == cudaSuccess && count != 0) std::memcpy(address, src, count);
  return Result(err);
}

cudaError_t cudaMemcpyFromSymbol(void* dst, const void* symbol, size_t count, size_t offset,
                                 cudaMemcpyKind kind) {
  SIMCUDA_ENTER();
  char* address = nullptr;
  cudaError_t err = SymbolRange(symbol, count, offset, &address);
  if (err == cudaSuccess && count != 0) std::memcpy(dst, address, count);
  return Result(err);
}

cudaError_t cudaMemcpyFromSymbolAsync(void* dst, const void* symbol, size_t count, size_t offset,
                                      cudaMemcpyKind kind, cudaStream_t stream) {
  SIMCUDA_ENTER();
  char* address = nullptr;
  cudaError_t err = SymbolRange(symbol, count, offset, &address);
  if (err == cudaSuccess) err = Machine::Get().Submit(stream, CurrentDevice());
  if (err == cudaSuccess && count != 0) std::memcpy(dst, address, count);
  return Result(err);
}

cudaError_t cudaGetSymbolAddress(void** dev_ptr, const void* symbol) {
  SIMCUDA_ENTER();
  char* address = nullptr;
  size_t size = 0;
  if (dev_ptr == nullptr) return Result(cudaErrorInvalidValue);
  if (!simcuda::rt::SymbolStorage(symbol, &address, &size)) return Result(cudaErrorInvalidSymbol);
  *dev_ptr = address;
  return cudaSuccess;
}

cudaError_t cudaGetSymbolSize(size_t* size, const void* symbol) {
  SIMCUDA_ENTER();
  char* address = nullptr;
  if (size == nullptr) return Result(cudaErrorInvalidValue);
  if (!simcuda::rt::SymbolStorage(symbol, &address, size)) return Result(cudaErrorInvalidSymbol);
  return cudaSuccess;
}

}  // extern "C"
