// Module registration (the __cuda* entry points nvcc-generated code calls
// when a library loads) and kernel launches. Kernels do not run: a launch
// checks its configuration and stream and occupies the stream like any work.
#include <cstdlib>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "runtime/api_entry.h"
#include "runtime/machine.h"
#include "runtime/registration.h"

using simcuda::rt::CurrentDevice;
using simcuda::rt::Machine;
using simcuda::rt::Result;

namespace simcuda {
namespace rt {
namespace {

struct Variable {
  size_t size = 0;
  char* storage = nullptr;  // allocated on first use
};

struct Registry {
  std::mutex mu;
  std::unordered_map<const void*, CUkern_st*> kernels;  // by host stub
  std::unordered_map<const void*, CUkern_st*> handles;  // by handle
  std::unordered_map<const void*, Variable> variables;  // by host shadow
};

Registry& GetRegistry() {
  static Registry* registry = new Registry;
  return *registry;
}

CUkern_st* KernelLocked(Registry& r, const void* host_function) {
  CUkern_st*& k = r.kernels[host_function];
  if (k == nullptr) {
    k = new CUkern_st;
    k->host_function = host_function;
    r.handles[k] = k;
  }
  return k;
}

struct LaunchConfiguration {
  dim3 grid;
  dim3 block;
  size_t shared_memory;
  cudaStream_t stream;
};

thread_local std::vector<LaunchConfiguration> t_launch_stack;

// A launch of the kernel for `func` (a host stub or a cudaKernel_t).
cudaError_t Launch(const void* func, dim3 grid, dim3 block, cudaStream_t stream) {
  if (func == nullptr) return cudaErrorInvalidDeviceFunction;
  CUkern_st* kernel = KernelFor(func);
  if (grid.x == 0 || grid.y == 0 || grid.z == 0 || block.x == 0 || block.y == 0 || block.z == 0 ||
      static_cast<uint64_t>(block.x) * block.y * block.z > 1024) {
    return cudaErrorInvalidConfiguration;
  }
  cudaError_t err = Machine::Get().Submit(stream, CurrentDevice());
  if (err == cudaSuccess) kernel->launches.fetch_add(1, std::memory_order_relaxed);
  return err;
}

}  // namespace

CUkern_st* KernelFor(const void* host_function) {
  Registry& r = GetRegistry();
  std::lock_guard<std::mutex> lock(r.mu);
  // A cudaKernel_t passed where a function is expected is accepted as itself.
  auto it = r.handles.find(host_function);
  if (it != r.handles.end()) return it->second;
  return KernelLocked(r, host_function);
}

bool IsKernel(const void* handle) {
  Registry& r = GetRegistry();
  std::lock_guard<std::mutex> lock(r.mu);
  return r.handles.count(handle) != 0;
}

bool SymbolStorage(const void* symbol, char** address, size_t* size) {
  Registry& r = GetRegistry();
  std::lock_guard<std::mutex> lock(r.mu);
  auto it = r.variables.find(symbol);
  if (it == r.variables.end()) return false;
  Variable& v = it->second;
  if (v.storage == nullptr) {
    void* p = nullptr;
    if (Machine::Get().AllocateHost(v.size == 0 ? 1 : v.size, &p) != cudaSuccess) return false;
    v.storage = static_cast<char*>(p);
  }
  *address = v.storage;
  *size = v.size;
  return true;
}

}  // namespace rt
}  // namespace simcuda

extern "C" {

void** __cudaRegisterFatBinary(void* fat_cubin) {
  SIMCUDA_COUNT();
  return new void*(fat_cubin);  // any non-null handle, until __cudaUnregisterFatBinary
}

void __cudaRegisterFatBinaryEnd(void** handle) { SIMCUDA_COUNT(); }

void __cudaUnregisterFatBinary(void** handle) {
  SIMCUDA_COUNT();
  delete handle;
}

char __cudaInitModule(void** handle) {
  SIMCUDA_COUNT();
  return 1;
}

void __cudaRegisterFunction(void** handle, const char* host_function, char* device_function,
                            const char* device_name, int thread_limit, uint3* tid, uint3* bid,
                            dim3* block_dim, dim3* grid_dim, int* warp_size) {
  SIMCUDA_COUNT();
  auto& r = simcuda::rt::GetRegistry();
  std::lock_guard<std::mutex> lock(r.mu);
  simcuda::rt::KernelLocked(r, host_function)->name = device_name;
}

void __cudaRegisterVar(void** handle, char* host_var, char* device_address, const char* device_name,
                       int ext, size_t size, int constant, int global) {
  SIMCUDA_COUNT();
  auto& r = simcuda::rt::GetRegistry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.variables[host_var].size = size;
}

void __cudaRegisterManagedVar(void** handle, void** host_var_ptr_address, char* device_address,
                              const char* device_name, int ext, size_t size, int constant,
                              int global) {
  SIMCUDA_COUNT();
  // The runtime stores the managed variable's address in the host shadow.
  if (host_var_ptr_address != nullptr) *host_var_ptr_address = std::calloc(1, size ? size : 1);
}

// Not declared in the toolkit headers; registration no-ops.
void __cudaRegisterHostVar(void) { SIMCUDA_COUNT(); }
void __cudaRegisterUnifiedTable(void) { SIMCUDA_COUNT(); }

// Not declared in the toolkit headers and never called by nvcc-generated code.
cudaError_t __cudaGetProcAddress(void) {
  SIMCUDA_ENTER();
  return simcuda::rt::Unsupported(simcuda_site);
}

unsigned __cudaPushCallConfiguration(dim3 grid, dim3 block, size_t shared_memory,
                                     struct CUstream_st* stream) {
  SIMCUDA_COUNT();
  simcuda::rt::t_launch_stack.push_back({grid, block, shared_memory, stream});
  return 0;
}

cudaError_t __cudaPopCallConfiguration(dim3* grid, dim3* block, size_t* shared_memory,
                                       void* stream) {
  SIMCUDA_ENTER();
  auto& stack = simcuda::rt::t_launch_stack;
  if (stack.empty()) return Result(cudaErrorMissingConfiguration);
  const simcuda::rt::LaunchConfiguration c = stack.back();
  stack.pop_back();
  *grid = c.grid;
  *block = c.block;
  *shared_memory = c.shared_memory;
  *static_cast<cudaStream_t*>(stream) = c.stream;
  return cudaSuccess;
}

cudaError_t __cudaGetKernel(cudaKernel_t* kernel, const void* host_function) {
  SIMCUDA_ENTER();
  if (kernel == nullptr) return Result(cudaErrorInvalidValue);
  *kernel = simcuda::rt::KernelFor(host_function);
  return cudaSuccess;
}

cudaError_t __cudaLaunchKernel(cudaKernel_t kernel, dim3 grid, dim3 block, void** args,
                               size_t shared_memory, cudaStream_t stream) {
  SIMCUDA_ENTER();
  if (!simcuda::rt::IsKernel(kernel)) return Result(cudaErrorInvalidResourceHandle);
  return Result(simcuda::rt::Launch(kernel, grid, block, stream));
}

cudaError_t __cudaLaunchKernel_ptsz(cudaKernel_t kernel, dim3 grid, dim3 block, void** args,
                                    size_t shared_memory, cudaStream_t stream) {
  SIMCUDA_ENTER();
  if (!simcuda::rt::IsKernel(kernel)) return Result(cudaErrorInvalidResourceHandle);
  return Result(simcuda::rt::Launch(kernel, grid, block, stream ? stream : cudaStreamPerThread));
}

cudaError_t cudaLaunchKernel(const void* func, dim3 grid, dim3 block, void** args,
                             size_t shared_memory, cudaStream_t stream) {
  SIMCUDA_ENTER();
  return Result(simcuda::rt::Launch(func, grid, block, stream));
}

cudaError_t cudaLaunchCooperativeKernel(const void* func, dim3 grid, dim3 block, void** args,
                                        size_t shared_memory, cudaStream_t stream) {
  SIMCUDA_ENTER();
  return Result(simcuda::rt::Launch(func, grid, block, stream));
}

cudaError_t cudaLaunchKernelExC(const cudaLaunchConfig_t* config, const void* func, void** args) {
  SIMCUDA_ENTER();
  if (config == nullptr) return Result(cudaErrorInvalidValue);
  return Result(simcuda::rt::Launch(func, config->gridDim, config->blockDim, config->stream));
}

}  // extern "C"
