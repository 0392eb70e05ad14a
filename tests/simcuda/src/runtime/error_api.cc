// CUDA's error model: the per-thread last error (cudaGetLastError resets it,
// cudaPeekAtLastError does not), error names and strings, and the body of the
// generated "unsupported" stubs.
#include <cstdio>
#include <string>

#include "common/code_names.h"
#include "runtime/api_entry.h"
#include "simcuda_tables.inc"

namespace simcuda {
namespace rt {
namespace {

thread_local cudaError_t t_last_error = cudaSuccess;

// The texts of the real runtime for the errors a simulated device produces;
// other codes fall back to their enumerator name.
const CodeName kErrorStrings[] = {
    {cudaSuccess, "no error"},
    {cudaErrorInvalidValue, "invalid argument"},
    {cudaErrorMemoryAllocation, "out of memory"},
    {cudaErrorInitializationError, "initialization error"},
    {cudaErrorInvalidConfiguration, "invalid configuration argument"},
    {cudaErrorInsufficientDriver, "CUDA driver version is insufficient for CUDA runtime version"},
    {cudaErrorNoDevice, "no CUDA-capable device is detected"},
    {cudaErrorInvalidDevice, "invalid device ordinal"},
    {cudaErrorInvalidResourceHandle, "invalid resource handle"},
    {cudaErrorSymbolNotFound, "named symbol not found"},
    {cudaErrorNotReady, "device not ready"},
    {cudaErrorIllegalAddress, "an illegal memory access was encountered"},
    {cudaErrorPeerAccessAlreadyEnabled, "peer access is already enabled"},
    {cudaErrorHostMemoryAlreadyRegistered,
     "part or all of the requested memory range is already mapped"},
    {cudaErrorHostMemoryNotRegistered, "pointer does not correspond to a registered memory region"},
    {cudaErrorNotSupported, "operation not supported"},
    {cudaErrorStreamCaptureUnsupported, "operation not permitted when stream is capturing"},
    {cudaErrorStreamCaptureInvalidated, "operation failed due to a previous error during capture"},
    {cudaErrorIllegalState, "the operation is not permitted in the current state"},
    {cudaErrorUnknown, "unknown error"},
};

}  // namespace

cudaError_t Fail(cudaError_t error) {
  if (error != cudaSuccess && error != cudaErrorNotReady) t_last_error = error;
  return error;
}

cudaError_t Unsupported(CallSite* site) {
  ReportUnsupported(site);
  return Fail(cudaErrorNotSupported);
}

int RuntimeErrorByName(const std::string& name) { return CodeOf(kRuntimeErrorNames, name.c_str()); }

}  // namespace rt
}  // namespace simcuda

using simcuda::rt::t_last_error;

extern "C" {

cudaError_t cudaGetLastError(void) {
  SIMCUDA_COUNT();
  cudaError_t error = t_last_error;
  t_last_error = cudaSuccess;
  return error;
}

cudaError_t cudaPeekAtLastError(void) {
  SIMCUDA_COUNT();
  return t_last_error;
}

const char* cudaGetErrorName(cudaError_t error) {
  SIMCUDA_COUNT();
  const char* name = simcuda::NameOf(kRuntimeErrorNames, error);
  return name != nullptr ? name : "cudaErrorUnknown";
}

const char* cudaGetErrorString(cudaError_t error) {
  SIMCUDA_COUNT();
  if (const char* text = simcuda::NameOf(simcuda::rt::kErrorStrings, error)) return text;
  const char* name = simcuda::NameOf(kRuntimeErrorNames, error);
  return name != nullptr ? name : "unrecognized error code";
}

}  // extern "C"
