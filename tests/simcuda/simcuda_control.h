/* Control API of the simulated CUDA device (tests/simcuda): what a test uses
 * to configure the device, drive the completion of stream work, inject faults
 * and read counters. Exported by the fake libcudart.so.13; C linkage, so C,
 * C++ and Python (ctypes, see simcuda.py) can call it.
 *
 * Calls are thread-safe. Return values of type int are 0 on success, or a
 * cudaError_t code. "Call names" are API function names ("cudaMalloc",
 * "cuDevicePrimaryCtxGetState"); names starting with "cu" but not "cuda" are
 * driver calls and are forwarded to the fake libcuda.so.1.
 *
 * Environment variables read when the simulated device is first used:
 *   SIMCUDA_DEVICE_COUNT   number of devices (default 1; 0 = no device)
 *   SIMCUDA_MEMORY_BYTES   capacity per device: "80G", "512MiB", "1048576", or
 *                          a comma list, one per device (default 80 GiB)
 *   SIMCUDA_EVENT_MODE     "immediate" (default) or "manual"
 *   SIMCUDA_FAULTS         faults armed at start, "name:key=value:...;..." with
 *                          keys nth=N, next=K, skip=S, count=C, error=CODE|NAME
 *                          (e.g. "cudaMalloc:nth=3:error=cudaErrorMemoryAllocation")
 *   SIMCUDA_TRACE          file to append "<runtime|driver> <call> <count>"
 *                          lines to at process exit ("%p" = process id)
 *   SIMCUDA_COSTS          modelled cost per call, "cuMemMap=5us;cudaMalloc=66.4us"
 *                          (ns, us, ms, s; a bare number is ns)
 *   SIMCUDA_GPU_DIRECT_RDMA "1": every device supports GPUDirect RDMA with the
 *                          driver's virtual memory (the device attribute says
 *                          so, and cuMemCreate accepts gpuDirectRDMACapable);
 *                          else (default) neither, and cuMemCreate asked for
 *                          RDMA-capable memory fails as on such a device
 *   SIMCUDA_EXCLUSIVE_PROCESS_DIR  every device in EXCLUSIVE_PROCESS compute
 *                          mode: a context on device N holds a lock on
 *                          <dir>/device<N>.lock; a second process's context
 *                          fails with cudaErrorDevicesUnavailable
 */
#ifndef TORCHMEM_TESTS_SIMCUDA_SIMCUDA_CONTROL_H_
#define TORCHMEM_TESTS_SIMCUDA_SIMCUDA_CONTROL_H_

#ifdef __cplusplus
extern "C" {
#endif

#define SIMCUDA_EVENT_MODE_IMMEDIATE 0
#define SIMCUDA_EVENT_MODE_MANUAL 1

/* 1: this process runs on the simulated device. */
int simcuda_is_simulated(void);

/* Devices. Shrinking fails while a removed device has live allocations. */
int simcuda_set_device_count(int count);
int simcuda_get_device_count(void);

/* Memory: capacity (device -1 = every device, and devices added later),
 * bytes in use (charged in 256-byte units), peak, live allocation count. The
 * driver's physical allocations (cuMemCreate) count in all three, one
 * allocation each. */
int simcuda_set_memory_capacity(int device, unsigned long long bytes);
unsigned long long simcuda_get_memory_capacity(int device);
unsigned long long simcuda_live_bytes(int device);
unsigned long long simcuda_peak_bytes(int device);
unsigned long long simcuda_live_allocations(int device);
void simcuda_reset_peak_bytes(int device);

/* Completion model. Switching to immediate completes all pending work. */
int simcuda_set_event_mode(int mode);
int simcuda_get_event_mode(void);
/* Completes the work submitted so far to `stream` (a cudaStream_t; NULL is
 * the current device's legacy stream), with the work it waits for. */
int simcuda_complete_stream(void* stream);
/* Completes the work an event waits for (a cudaEvent_t). */
int simcuda_complete_event(void* event);
/* Completes all work on every device. */
int simcuda_complete_all(void);
/* Units of work submitted to `stream` and not yet completed. */
unsigned long long simcuda_pending_work(void* stream);

/* Fault injection. After `skip` further calls of `call` succeed, the next
 * `count` calls fail with `error` (a cudaError_t, or a CUresult for driver
 * calls). Rules for one call apply in the order they were armed. */
int simcuda_inject_fault(const char* call, unsigned long long skip, unsigned long long count,
                         int error);
/* The n-th call from now (n >= 1) fails. */
int simcuda_fail_nth(const char* call, unsigned long long n, int error);
/* The next k calls fail. */
int simcuda_fail_next(const char* call, unsigned long long k, int error);
void simcuda_clear_faults(void);
/* The code of an error name: "cudaErrorMemoryAllocation" (a cudaError_t) or
 * "CUDA_ERROR_OUT_OF_MEMORY" (a CUresult); -1 if unknown. */
int simcuda_error_code(const char* name);

/* Per-call counters (every call counts, including failed ones). */
unsigned long long simcuda_call_count(const char* call);
void simcuda_reset_call_counts(void);
/* Appends the trace (see SIMCUDA_TRACE) of both libraries to `path` now. */
int simcuda_write_trace(const char* path);

/* Cost model (README "Cost model"): modelled time in nanoseconds of the
 * calls of `call` since the last reset of the counters, or of every runtime
 * and driver call when `call` is NULL; how many calls since the reset wait
 * for the GPU (cudaStreamSynchronize, cudaFree, cuMemUnmap, ...); replacing
 * one call's cost. */
unsigned long long simcuda_modelled_ns(const char* call);
unsigned long long simcuda_synchronizing_calls(void);
int simcuda_set_call_cost(const char* call, unsigned long long ns);

/* Contexts: whether `device` has its primary context (created by
 * cudaSetDevice, cudaInitDevice, cudaFree, allocation, stream and event
 * creation, work submitted on it, cudaMemGetInfo, peer access, or the
 * driver's cuDevicePrimaryCtxRetain), and how many devices have one. Each
 * costs about 0.5 GiB of device memory on a GPU; simcuda charges none. */
int simcuda_context_active(int device);
int simcuda_context_count(void);
/* EXCLUSIVE_PROCESS mode from now on, with lock files in `dir` (as
 * SIMCUDA_EXCLUSIVE_PROCESS_DIR); NULL or "" goes back to DEFAULT mode. */
void simcuda_set_exclusive_process_dir(const char* dir);

/* The driver's virtual memory (cuMemAddressReserve, cuMemCreate, cuMemMap,
 * cuMemSetAccess): address reservations, live physical allocations (their
 * bytes are also in simcuda_live_bytes of their device, one live allocation
 * each), mappings, and mapped bytes some device may access. All zero if the
 * fake driver cannot be found. */
typedef struct simcuda_vmm_stats_st {
  unsigned long long reservations;
  unsigned long long reserved_bytes;
  unsigned long long allocations;
  unsigned long long allocated_bytes;
  unsigned long long mappings;
  unsigned long long mapped_bytes;
  unsigned long long accessible_bytes;
  unsigned long long rdma_capable_allocations; /* live, created gpuDirectRDMACapable */
} simcuda_vmm_stats_t;
void simcuda_vmm_stats(simcuda_vmm_stats_t* stats);

/* Back to the configured state: completes all work, ends captures, clears
 * faults and counters, restores the event mode and capacities from the
 * environment, clears the calling thread's last error. Live allocations stay
 * live; the device count is unchanged. */
void simcuda_reset(void);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* TORCHMEM_TESTS_SIMCUDA_SIMCUDA_CONTROL_H_ */
