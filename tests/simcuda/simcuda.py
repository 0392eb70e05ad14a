"""Python helper for tests that run on the simulated CUDA device (tests/simcuda).

Two halves:

* In the test process (no preload): ``library_dir()`` finds the built fake
  libraries and ``environment(...)`` returns the environment for a subprocess
  that should run on the simulated device (``LD_PRELOAD`` plus any
  ``SIMCUDA_*`` settings). The preload must be in place before the process
  starts: PyTorch's libraries find ``libcudart.so.13`` (``.12`` for torch's
  CUDA 12 builds) through DT_RPATH, which
  only ``LD_PRELOAD`` overrides.
* In that subprocess: ``Control()`` wraps the ``simcuda_*`` control API
  (simcuda_control.h) with ctypes: capacity, device count, event mode,
  completion of stream work, faults, counters.

Usage::

    env = simcuda.environment(memory_bytes="1G", event_mode="manual")
    subprocess.run([sys.executable, "-c", code], env=env, check=True)

    # inside the subprocess
    sim = simcuda.Control()
    sim.fail_next("cudaMalloc", 1, "cudaErrorMemoryAllocation")
"""

import ctypes
import os
from pathlib import Path

# The fake runtime's file name is its SONAME, which follows the CUDA major
# version it was built for (tests/simcuda/CMakeLists.txt): libcudart.so.13,
# or libcudart.so.12 for torch's CUDA 12 builds. A build directory holds one.
RUNTIME_NAMES = ("libcudart.so.13", "libcudart.so.12")
RUNTIME_NAME = RUNTIME_NAMES[0]  # the default build's; see runtime_name()
DRIVER_NAME = "libcuda.so.1"
NVML_NAME = "libnvidia-ml.so.1"
REPO_ROOT = Path(__file__).resolve().parents[2]
BUILD_COMMAND = ("cmake -S tests/simcuda -B build/simcuda && "
                 "cmake --build build/simcuda -j2")


class SimcudaNotBuilt(RuntimeError):
    """The fake CUDA libraries were not found."""


def _runtime_in(directory):
    """The fake runtime's file name in `directory`, or None."""
    for name in RUNTIME_NAMES:
        if (directory / name).is_file():
            return name
    return None


def _complete(directory):
    return _runtime_in(directory) is not None and (directory / DRIVER_NAME).is_file()


def runtime_name(directory=None):
    """File name (= SONAME) of the fake runtime in `directory` (default: library_dir())."""
    return _runtime_in(Path(directory) if directory is not None else library_dir())


def library_dir():
    """Directory holding the built fake runtime (libcudart.so.13 or .12) and libcuda.so.1.

    ``$TORCHMEM_SIMCUDA_DIR`` if set, else the newest ``build/*/simcuda`` under
    the repository root (what ``add_subdirectory(tests/simcuda)`` or a
    standalone build of tests/simcuda produce).
    """
    configured = os.environ.get("TORCHMEM_SIMCUDA_DIR")
    if configured:
        directory = Path(configured).resolve()
        if not _complete(directory):
            raise SimcudaNotBuilt(
                f"TORCHMEM_SIMCUDA_DIR={configured} does not contain {RUNTIME_NAME} and "
                f"{DRIVER_NAME}; build them with: {BUILD_COMMAND}")
        return directory
    candidates = [d for d in REPO_ROOT.glob("build/*/simcuda") if _complete(d)]
    if not candidates:
        raise SimcudaNotBuilt(
            f"the simulated CUDA device is not built (no build/*/simcuda/{RUNTIME_NAME} under "
            f"{REPO_ROOT}); build it from the repository root with: {BUILD_COMMAND}")
    return max(candidates, key=lambda d: (d / _runtime_in(d)).stat().st_mtime).resolve()


def preload(nvml=False):
    """The LD_PRELOAD value: absolute paths of the fake runtime and driver,
    and of the fake NVML if ``nvml``."""
    directory = library_dir()
    libraries = [directory / _runtime_in(directory), directory / DRIVER_NAME]
    if nvml:
        if not (directory / NVML_NAME).is_file():
            raise SimcudaNotBuilt(f"{directory} has no {NVML_NAME}; rebuild it with: "
                                  f"{BUILD_COMMAND}")
        libraries.append(directory / NVML_NAME)
    return ":".join(str(library) for library in libraries)


def environment(base=None, *, device_count=None, memory_bytes=None, event_mode=None,
                faults=None, trace=None, nvml=False, costs=None, exclusive_process_dir=None):
    """Environment for a subprocess running on the simulated device.

    ``base`` defaults to ``os.environ``. ``memory_bytes`` takes an int or a
    size string ("80G", "512MiB", or a comma list per device); ``event_mode``
    is "immediate" or "manual"; ``faults`` a SIMCUDA_FAULTS spec; ``trace`` a
    file that gets the list of CUDA calls made (see README.md). ``nvml`` also
    preloads the fake NVML, which PyTorch's ``expandable_segments:True`` needs
    (a real machine always has NVML; torch 2.14 calls it unchecked there).
    ``costs`` overrides the cost model ("cuMemMap=5us;..."); with
    ``exclusive_process_dir`` every device is in EXCLUSIVE_PROCESS mode, its
    context holding a lock file in that directory (shared by the processes
    that should exclude each other).
    """
    env = dict(os.environ if base is None else base)
    existing = env.get("LD_PRELOAD", "")
    env["LD_PRELOAD"] = preload(nvml) + (":" + existing if existing else "")
    for key, value in (("SIMCUDA_DEVICE_COUNT", device_count),
                       ("SIMCUDA_MEMORY_BYTES", memory_bytes),
                       ("SIMCUDA_EVENT_MODE", event_mode),
                       ("SIMCUDA_FAULTS", faults),
                       ("SIMCUDA_TRACE", trace),
                       ("SIMCUDA_COSTS", costs),
                       ("SIMCUDA_EXCLUSIVE_PROCESS_DIR", exclusive_process_dir)):
        if value is not None:
            env[key] = str(value)
    return env


def read_trace(path):
    """Counts from a SIMCUDA_TRACE file: {(library, call): count}, summed over
    processes, plus the set of calls that hit an "unsupported" stub."""
    counts, unsupported = {}, set()
    for line in Path(path).read_text().splitlines():
        fields = line.split()
        if len(fields) < 3:
            continue
        key = (fields[0], fields[1])
        counts[key] = counts.get(key, 0) + int(fields[2])
        if len(fields) > 3 and fields[3] == "unsupported":
            unsupported.add(key)
    return counts, unsupported


_MODES = {"immediate": 0, "manual": 1}
_ULL = ctypes.c_ulonglong


class _VmmStats(ctypes.Structure):
    """simcuda_vmm_stats_t (simcuda_control.h)."""
    _fields_ = [(name, _ULL) for name in (
        "reservations", "reserved_bytes", "allocations", "allocated_bytes", "mappings",
        "mapped_bytes", "accessible_bytes", "rdma_capable_allocations")]


def _handle(obj):
    """A cudaStream_t / cudaEvent_t from an int, None, or a torch Stream/Event."""
    if obj is None:
        return None
    for attribute in ("cuda_stream", "cuda_event"):
        if hasattr(obj, attribute):
            return ctypes.c_void_p(getattr(obj, attribute))
    return ctypes.c_void_p(int(obj))


class Control:
    """ctypes wrappers of the simcuda_* control API, for a process started with
    ``environment()`` (raises SimcudaNotBuilt-style RuntimeError otherwise)."""

    def __init__(self):
        lib = None
        for name in RUNTIME_NAMES:
            try:
                candidate = ctypes.CDLL(name, mode=os.RTLD_NOLOAD | os.RTLD_NOW)
                candidate.simcuda_is_simulated
                lib = candidate
                break
            except (OSError, AttributeError) as error:
                last_error = error
        if lib is None:
            raise RuntimeError(
                "this process does not run on the simulated CUDA device: start it with "
                "simcuda.environment() (LD_PRELOAD of the fake libcudart.so.13 or .12)"
            ) from last_error
        self._lib = lib
        signatures = {
            "simcuda_set_device_count": (ctypes.c_int, [ctypes.c_int]),
            "simcuda_get_device_count": (ctypes.c_int, []),
            "simcuda_set_memory_capacity": (ctypes.c_int, [ctypes.c_int, _ULL]),
            "simcuda_get_memory_capacity": (_ULL, [ctypes.c_int]),
            "simcuda_live_bytes": (_ULL, [ctypes.c_int]),
            "simcuda_peak_bytes": (_ULL, [ctypes.c_int]),
            "simcuda_live_allocations": (_ULL, [ctypes.c_int]),
            "simcuda_reset_peak_bytes": (None, [ctypes.c_int]),
            "simcuda_set_event_mode": (ctypes.c_int, [ctypes.c_int]),
            "simcuda_get_event_mode": (ctypes.c_int, []),
            "simcuda_complete_stream": (ctypes.c_int, [ctypes.c_void_p]),
            "simcuda_complete_event": (ctypes.c_int, [ctypes.c_void_p]),
            "simcuda_complete_all": (ctypes.c_int, []),
            "simcuda_pending_work": (_ULL, [ctypes.c_void_p]),
            "simcuda_inject_fault": (ctypes.c_int, [ctypes.c_char_p, _ULL, _ULL, ctypes.c_int]),
            "simcuda_clear_faults": (None, []),
            "simcuda_call_count": (_ULL, [ctypes.c_char_p]),
            "simcuda_reset_call_counts": (None, []),
            "simcuda_write_trace": (ctypes.c_int, [ctypes.c_char_p]),
            "simcuda_reset": (None, []),
            "simcuda_error_code": (ctypes.c_int, [ctypes.c_char_p]),
            "simcuda_vmm_stats": (None, [ctypes.POINTER(_VmmStats)]),
            "simcuda_modelled_ns": (_ULL, [ctypes.c_char_p]),
            "simcuda_synchronizing_calls": (_ULL, []),
            "simcuda_set_call_cost": (ctypes.c_int, [ctypes.c_char_p, _ULL]),
            "simcuda_context_active": (ctypes.c_int, [ctypes.c_int]),
            "simcuda_context_count": (ctypes.c_int, []),
        }
        for name, (restype, argtypes) in signatures.items():
            function = getattr(lib, name)
            function.restype = restype
            function.argtypes = argtypes

    @staticmethod
    def _check(status, what):
        if status != 0:
            raise RuntimeError(f"simcuda: {what} failed with error {status}")

    # Devices and memory -------------------------------------------------
    def set_device_count(self, count):
        self._check(self._lib.simcuda_set_device_count(count), "set_device_count")

    def device_count(self):
        return self._lib.simcuda_get_device_count()

    def set_memory_capacity(self, nbytes, device=-1):
        self._check(self._lib.simcuda_set_memory_capacity(device, nbytes), "set_memory_capacity")

    def memory_capacity(self, device=0):
        return self._lib.simcuda_get_memory_capacity(device)

    def live_bytes(self, device=0):
        return self._lib.simcuda_live_bytes(device)

    def peak_bytes(self, device=0):
        return self._lib.simcuda_peak_bytes(device)

    def live_allocations(self, device=0):
        return self._lib.simcuda_live_allocations(device)

    def reset_peak_bytes(self, device=0):
        self._lib.simcuda_reset_peak_bytes(device)

    def vmm_stats(self):
        """The driver's virtual memory (cuMemAddressReserve, cuMemCreate,
        cuMemMap): reservations, live physical allocations, mappings, as a dict
        of counts and bytes (simcuda_vmm_stats_t)."""
        stats = _VmmStats()
        self._lib.simcuda_vmm_stats(ctypes.byref(stats))
        return {name: getattr(stats, name) for name, _ in _VmmStats._fields_}

    # Completion model ------------------------------------------------------
    def set_event_mode(self, mode):
        self._check(self._lib.simcuda_set_event_mode(_MODES[mode]), "set_event_mode")

    def event_mode(self):
        return {v: k for k, v in _MODES.items()}[self._lib.simcuda_get_event_mode()]

    def complete_stream(self, stream=None):
        """Completes the work submitted so far to a stream (torch.cuda.Stream,
        a raw handle, or None for the legacy default stream)."""
        self._check(self._lib.simcuda_complete_stream(_handle(stream)), "complete_stream")

    def complete_event(self, event):
        self._check(self._lib.simcuda_complete_event(_handle(event)), "complete_event")

    def complete_all(self):
        self._check(self._lib.simcuda_complete_all(), "complete_all")

    def pending_work(self, stream=None):
        return self._lib.simcuda_pending_work(_handle(stream))

    # Faults ------------------------------------------------------------------
    def error_code(self, error):
        """An error code from an int, a cudaError_t name ("cudaErrorMemoryAllocation")
        or a CUresult name ("CUDA_ERROR_OUT_OF_MEMORY")."""
        if isinstance(error, int):
            return error
        code = self._lib.simcuda_error_code(error.encode())
        if code < 0:
            raise ValueError(f"unknown CUDA error name {error!r}")
        return code

    def inject_fault(self, call, skip, count, error):
        """After `skip` further calls of `call` succeed, the next `count` fail."""
        self._check(self._lib.simcuda_inject_fault(call.encode(), skip, count,
                                                    self.error_code(error)), "inject_fault")

    def fail_nth(self, call, n, error):
        self.inject_fault(call, n - 1, 1, error)

    def fail_next(self, call, k, error):
        self.inject_fault(call, 0, k, error)

    def clear_faults(self):
        self._lib.simcuda_clear_faults()

    # Counters ----------------------------------------------------------------
    def call_count(self, call):
        return self._lib.simcuda_call_count(call.encode())

    def reset_call_counts(self):
        self._lib.simcuda_reset_call_counts()

    # Cost model and contexts ------------------------------------------------
    def modelled_ns(self, call=None):
        """Modelled GPU time (ns) of `call`'s calls since the last counter
        reset, or of every runtime and driver call when `call` is None."""
        return self._lib.simcuda_modelled_ns(call.encode() if call else None)

    def synchronizing_calls(self):
        """Calls since the last counter reset that wait for the GPU."""
        return self._lib.simcuda_synchronizing_calls()

    def set_call_cost(self, call, ns):
        self._check(self._lib.simcuda_set_call_cost(call.encode(), ns), "set_call_cost")

    def context_active(self, device):
        """Whether `device` has a primary context (a GPU spends ~0.5 GiB on one)."""
        return bool(self._lib.simcuda_context_active(device))

    def context_count(self):
        return self._lib.simcuda_context_count()

    def write_trace(self, path):
        self._check(self._lib.simcuda_write_trace(str(path).encode()), "write_trace")

    def reset(self):
        self._lib.simcuda_reset()
