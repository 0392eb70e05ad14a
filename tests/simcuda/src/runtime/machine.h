// The simulated machine behind the fake CUDA runtime: devices with a memory
// capacity, allocations backed by host memory, streams, events, the
// completion model and stream capture. The extern "C" API files validate
// arguments and translate handles; everything stateful happens here, under
// one mutex.
//
// Completion model. Every stream counts the work submitted to it and the work
// completed. In immediate mode (the default) work completes as it is
// submitted. In manual mode it completes only when the test says so
// (simcuda_complete_*) or when a synchronising call forces it
// (cudaStreamSynchronize, cudaEventSynchronize, cudaDeviceSynchronize,
// cudaFree, synchronous copies); completing a stream first completes the
// work it waits for (cudaStreamWaitEvent). Data movement (copies, memsets)
// happens at submission; only completion is deferred.
//
// Invariants: every live device allocation is charged to exactly one device
// and `used` is the sum of its charges and of the driver's physical
// allocations (ChargeDevice); a handle is dereferenced only after it
// was found in the live set; host callbacks run without the lock held.
#ifndef TORCHMEM_TESTS_SIMCUDA_SRC_RUNTIME_MACHINE_H_
#define TORCHMEM_TESTS_SIMCUDA_SRC_RUNTIME_MACHINE_H_

#include <cuda_runtime_api.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "common/vmm_link.h"

namespace simcuda {
namespace rt {

// Device memory is charged in units of this many bytes; every pointer the
// simulator hands out is aligned to at least this (mmap gives page alignment).
constexpr size_t kAllocationGranularity = 256;
constexpr uint64_t kDefaultCapacity = 80ull << 30;  // an 80 GiB device

enum class EventMode { kImmediate = 0, kManual = 1 };

enum class MemoryKind {
  kDevice,
  kManaged,
  kHostPinned,
  kHostRegistered,
  kIpcOpened,  // another process's device memory, mapped by cudaIpcOpenMemHandle
};

struct Allocation {
  uintptr_t base = 0;
  size_t size = 0;     // bytes requested
  size_t mapped = 0;   // bytes mapped (owned allocations only)
  size_t charged = 0;  // bytes charged to the device's capacity
  int device = -1;     // -1 for host memory
  MemoryKind kind = MemoryKind::kDevice;
  // Device memory shared with cudaIpcGetMemHandle: the POSIX shared memory
  // object now backing it (unlinked when it is freed).
  std::string shared_name;
};

// A unit of stream work that does more than occupy the stream.
struct PendingWork {
  uint64_t seq = 0;
  uint64_t wait_stream_id = 0;    // cudaStreamWaitEvent: this stream ...
  uint64_t wait_seq = 0;          // ... must first complete up to here
  std::function<void()> host_fn;  // cudaLaunchHostFunc / cudaStreamAddCallback
};

using HostCallbacks = std::vector<std::function<void()>>;

}  // namespace rt
}  // namespace simcuda

// The runtime's opaque handle types are defined here: a cudaStream_t points to
// a CUstream_st, and so on. Handles are validated against live sets before use.
struct CUstream_st {
  uint64_t id = 0;
  int device = 0;
  int priority = 0;
  unsigned int flags = 0;
  bool builtin = false;  // legacy or per-thread default stream
  uint64_t submitted = 0;
  uint64_t completed = 0;
  std::deque<simcuda::rt::PendingWork> pending;
  // Stream capture.
  cudaStreamCaptureStatus capture_status = cudaStreamCaptureStatusNone;
  cudaStreamCaptureMode capture_mode = cudaStreamCaptureModeGlobal;
  uint64_t capture_id = 0;
  std::thread::id capture_thread;
  struct CUgraph_st* capture_graph = nullptr;
};

struct CUevent_st {
  int device = 0;
  unsigned int flags = 0;
  bool recorded = false;
  uint64_t stream_id = 0;
  uint64_t seq = 0;
  std::chrono::steady_clock::time_point recorded_at;
};

// A graph records how much work was captured into it, and the data effects
// of the captured copies and memsets (in capture order), which a launch of
// the graph performs again: so a replay writes where the captured work
// wrote, as on a GPU (kernels still do nothing).
struct CUgraph_st {
  uint64_t captured_work = 0;
  std::vector<std::function<void()>> effects;
};

struct CUgraphExec_st {
  uint64_t work = 0;
  std::vector<std::function<void()>> effects;
};

namespace simcuda {
namespace rt {

struct DeviceState {
  uint64_t capacity = kDefaultCapacity;
  uint64_t used = 0;
  uint64_t peak = 0;
  uint64_t live_allocations = 0;
  std::unique_ptr<CUstream_st> legacy_stream;
  // The primary context (see Machine::EnsureContext); in EXCLUSIVE_PROCESS
  // mode, the descriptor holding the device's lock file while it exists.
  bool context = false;
  int exclusive_lock_fd = -1;
};

class Machine {
 public:
  // The process-wide machine, configured from SIMCUDA_* on first use. Never
  // destroyed (calls may come from other libraries' static destructors).
  static Machine& Get();

  Machine(const Machine&) = delete;
  Machine& operator=(const Machine&) = delete;

  // --- Devices ---------------------------------------------------------
  int DeviceCount();
  cudaError_t SetDeviceCount(int count);
  bool ValidDevice(int device);
  uint64_t Capacity(int device);
  cudaError_t SetCapacity(int device, uint64_t bytes);  // device -1: all
  uint64_t UsedBytes(int device);
  uint64_t PeakBytes(int device);
  uint64_t LiveAllocations(int device);
  void ResetPeak(int device);

  // --- Contexts (machine_context.cc) -------------------------------------
  // Creates `device`'s primary context if it has none, as the first runtime
  // call that needs it does on a GPU (cudaSetDevice, allocation, streams,
  // events, work, cudaMemGetInfo, ...; not device counts, properties or
  // attributes). In EXCLUSIVE_PROCESS mode (SIMCUDA_EXCLUSIVE_PROCESS_DIR)
  // a device whose context another process holds gives
  // cudaErrorDevicesUnavailable, as CUDA does.
  cudaError_t EnsureContext(int device);
  bool ContextActive(int device);
  int ContextCount();
  bool ExclusiveProcessMode();
  // Switches EXCLUSIVE_PROCESS mode on (lock files in `dir`) or off (empty).
  // Contexts that exist stay as they are.
  void SetExclusiveProcessDir(const std::string& dir);

  // --- Memory (machine_memory.cc) ---------------------------------------
  cudaError_t AllocateDevice(int device, size_t size, MemoryKind kind, void** ptr);
  cudaError_t FreeDevice(void* ptr);
  cudaError_t AllocateHost(size_t size, void** ptr);
  cudaError_t FreeHost(void* ptr);
  cudaError_t RegisterHost(void* ptr, size_t size);
  cudaError_t UnregisterHost(void* ptr);
  // Charges `bytes` of memory the runtime did not allocate itself (the
  // driver's physical allocations, cuMemCreate) to `device`'s capacity, or
  // gives them back. Each charge counts as one live allocation.
  cudaError_t ChargeDevice(int device, uint64_t bytes);
  void UnchargeDevice(int device, uint64_t bytes);
  // Finds the allocation containing [ptr, ptr + 1): the runtime's own, else
  // pages the driver mapped (cuMemMap), reported as device memory.
  bool Lookup(const void* ptr, Allocation* out);
  // Finds the runtime's own allocation containing [ptr, ptr + 1).
  bool LookupOwn(const void* ptr, Allocation* out);
  // Installs the driver's answer for pointers the runtime did not allocate.
  void SetMappingLookup(simcuda_mapping_lookup_fn lookup);

  // --- Memory shared between processes (machine_ipc.cc) -------------------
  // cudaIpcGetMemHandle: `ptr` must be the base of a device allocation.
  // The first share moves its pages into a POSIX shared memory object
  // mapped at the same address, so the data stays and another process can
  // map it too.
  cudaError_t ShareMemory(void* ptr, cudaIpcMemHandle_t* handle);
  // cudaIpcOpenMemHandle / cudaIpcCloseMemHandle, in the other process.
  cudaError_t OpenSharedMemory(const cudaIpcMemHandle_t& handle, int device, void** ptr);
  cudaError_t CloseSharedMemory(void* ptr);
  // cudaIpcGetEventHandle / cudaIpcOpenEventHandle. Events cannot be waited
  // for across simulated processes: an opened event is always complete.
  cudaError_t ShareEvent(cudaEvent_t event, cudaIpcEventHandle_t* handle);
  cudaError_t OpenSharedEvent(const cudaIpcEventHandle_t& handle, int device, cudaEvent_t* out);
  // cudaSuccess if [ptr, ptr + bytes) lies inside one allocation that a
  // device can address (device, managed or pinned/registered host memory).
  // Pages the driver mapped must also grant device `accessor` access
  // (cuMemSetAccess; -1: any device), as a GPU faults otherwise.
  cudaError_t CheckDeviceRange(const void* ptr, size_t bytes, int accessor = -1);

  // --- Streams and events (machine_work.cc) ------------------------------
  EventMode mode();
  void SetMode(EventMode mode);
  // Resolves nullptr / cudaStreamLegacy / cudaStreamPerThread (relative to
  // `device`, the caller's current device) and checks other handles.
  cudaError_t ResolveStream(cudaStream_t handle, int device, CUstream_st** out);
  cudaError_t CreateStream(int device, unsigned int flags, int priority, cudaStream_t* out);
  cudaError_t DestroyStream(cudaStream_t handle, int device);
  // One unit of work (a launch, a copy, ...) on a stream, with an optional
  // host function to run when it completes. On a capturing stream the work
  // is captured instead of executed, and *captured (if given) is set: the
  // caller must then skip the work's data effects, and `replay` (if given,
  // the same effects) is recorded for the graph's launches.
  cudaError_t Submit(cudaStream_t handle, int device, std::function<void()> host_fn = nullptr,
                     bool* captured = nullptr, std::function<void()> replay = nullptr);
  cudaError_t QueryStream(cudaStream_t handle, int device);
  cudaError_t SynchronizeStream(cudaStream_t handle, int device);
  // Completes all work of `device` (-1: every device).
  void SynchronizeDevice(int device);
  // Completes the legacy stream and every blocking stream of `device`: what
  // a synchronous copy or memset waits for.
  void SynchronizeBlockingStreams(int device);
  cudaError_t CompleteStream(cudaStream_t handle, int device);
  uint64_t PendingWorkCount(cudaStream_t handle, int device);

  cudaError_t CreateEvent(int device, unsigned int flags, cudaEvent_t* out);
  cudaError_t DestroyEvent(cudaEvent_t event);
  cudaError_t RecordEvent(cudaEvent_t event, cudaStream_t stream, int device);
  cudaError_t QueryEvent(cudaEvent_t event);
  cudaError_t SynchronizeEvent(cudaEvent_t event);
  cudaError_t CompleteEvent(cudaEvent_t event);
  cudaError_t ElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end);
  cudaError_t WaitEvent(cudaStream_t stream, int device, cudaEvent_t event);

  // --- Stream capture (machine_capture.cc) ------------------------------
  cudaError_t BeginCapture(cudaStream_t stream, int device, cudaStreamCaptureMode mode);
  cudaError_t EndCapture(cudaStream_t stream, int device, cudaGraph_t* graph);
  cudaError_t CaptureStatus(cudaStream_t stream, int device, cudaStreamCaptureStatus* status,
                            unsigned long long* id, cudaGraph_t* graph);
  // Whether a potentially unsafe call (cudaMalloc, ...) by the calling thread,
  // whose capture mode is `thread_mode`, is prohibited by ongoing captures.
  // If so, those captures are invalidated, as CUDA does.
  cudaError_t CheckUnsafeCall(cudaStreamCaptureMode thread_mode);
  cudaGraph_t NewGraph();
  cudaError_t DestroyGraph(cudaGraph_t graph);
  cudaError_t Instantiate(cudaGraph_t graph, cudaGraphExec_t* exec);
  cudaError_t DestroyGraphExec(cudaGraphExec_t exec);
  cudaError_t LaunchGraph(cudaGraphExec_t exec, cudaStream_t stream, int device);

  // Test control: completes all work, ends every capture, and restores the
  // event mode and capacities configured by the environment. Live
  // allocations stay live.
  void Reset();

 private:
  Machine();

  // Pages the driver mapped (cuMemMap) covering [ptr, ptr + bytes), readable
  // by some device, as one device allocation.
  bool LookupMapped(const void* ptr, size_t bytes, int accessor, Allocation* out);
  DeviceState* DeviceLocked(int device);
  cudaError_t EnsureContextLocked(int device);
  CUstream_st* StreamByIdLocked(uint64_t id);
  cudaError_t ResolveLocked(cudaStream_t handle, int device, CUstream_st** out);
  CUstream_st* PerThreadStreamLocked(int device);
  // If `s` is capturing, counts one unit of captured work and returns true.
  bool CaptureLocked(CUstream_st* s);
  void SubmitLocked(CUstream_st* s, PendingWork work, HostCallbacks* run);
  void CompleteLocked(CUstream_st* s, uint64_t upto, HostCallbacks* run);
  void CompleteDeviceLocked(int device, HostCallbacks* run);
  bool EventDoneLocked(const CUevent_st* e);
  CUevent_st* EventLocked(cudaEvent_t e);
  cudaError_t EventAndStreamLocked(cudaEvent_t event, cudaStream_t stream, int device,
                                   CUevent_st** e, CUstream_st** s);
  static void Run(HostCallbacks* run);

  std::mutex mu_;
  EventMode mode_ = EventMode::kImmediate;
  EventMode initial_mode_ = EventMode::kImmediate;
  std::vector<uint64_t> initial_capacities_;           // from SIMCUDA_MEMORY_BYTES
  std::vector<std::unique_ptr<DeviceState>> devices_;  // only grows
  int visible_devices_ = 0;                            // the device count
  uint64_t default_capacity_ = kDefaultCapacity;
  std::string exclusive_dir_;  // SIMCUDA_EXCLUSIVE_PROCESS_DIR; empty: DEFAULT mode
  std::map<uintptr_t, Allocation> allocations_;
  std::unordered_map<uint64_t, CUstream_st*> streams_;  // live, by id
  std::unordered_set<const void*> user_streams_;        // live handles
  std::unordered_set<const void*> events_;              // live handles
  std::unordered_set<const void*> graphs_;
  std::unordered_set<const void*> graph_execs_;
  std::atomic<simcuda_mapping_lookup_fn> mapping_lookup_{nullptr};
  int active_captures_ = 0;
  uint64_t next_stream_id_ = 1;
  uint64_t next_capture_id_ = 1;
};

}  // namespace rt
}  // namespace simcuda

#endif  // TORCHMEM_TESTS_SIMCUDA_SRC_RUNTIME_MACHINE_H_
