"""PyTorch's own CUDA stack on the simulated CUDA device (tests/simcuda).

Each test runs a small script in a subprocess started with the fake
libcudart.so.13 / libcuda.so.1 preloaded, and checks what PyTorch's native
caching allocator (and, once, a CUDAPluggableAllocator) does on it. Kernels do
not run on the simulated device, so no assertion depends on values a kernel
computes; values moved by copies (memcpy) are real and are checked.

Every run writes a SIMCUDA_TRACE and must not reach a CUDA call that the
simulation does not implement.
"""

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT / "tests" / "simcuda"))
import simcuda  # noqa: E402

GiB = 1 << 30
MiB = 1 << 20

PRELUDE = f"""
import sys
sys.path.insert(0, {str(REPO_ROOT / "tests" / "simcuda")!r})
import torch
import simcuda
sim = simcuda.Control()
MiB = {MiB}
GiB = {GiB}
"""


@pytest.fixture
def run_torch(simcuda_dir, tmp_path):
    """Runs `code` (after PRELUDE) on the simulated device; returns stdout."""
    def run(code, extra_env=None, **settings):
        trace = tmp_path / "trace.txt"
        trace.unlink(missing_ok=True)
        env = simcuda.environment(trace=trace, **settings)
        env.update(extra_env or {})
        proc = subprocess.run([sys.executable, "-c", PRELUDE + textwrap.dedent(code)],
                              env=env, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
        counts, unsupported = simcuda.read_trace(trace)
        assert not unsupported, f"torch reached unsimulated CUDA calls: {sorted(unsupported)}"
        assert "simcuda: unsupported" not in proc.stderr, proc.stderr
        assert counts, "no SIMCUDA_TRACE written: was the fake runtime loaded?"
        return proc.stdout
    return run


def test_device_discovery_and_properties(run_torch):
    out = run_torch("""
        assert torch.cuda.is_available()
        assert torch.cuda.device_count() == 2
        for i in range(2):
            p = torch.cuda.get_device_properties(i)
            assert p.name == "torchmem simulated device", p.name
            assert (p.major, p.minor) == (9, 0)
            assert p.total_memory == 8 * GiB, p.total_memory
            assert p.multi_processor_count > 0
        assert torch.cuda.get_device_capability() == (9, 0)
        assert torch.cuda.get_device_name(1) == "torchmem simulated device"
        print("ok")
    """, device_count=2, memory_bytes="8G")
    assert out.strip() == "ok"


def test_tensors_and_copies_round_trip(run_torch):
    run_torch("""
        a = torch.empty(1000, device="cuda")
        z = torch.zeros(10, 10, device="cuda")
        o = torch.ones(3, device="cuda", dtype=torch.float16)
        assert a.is_cuda and a.data_ptr() % 256 == 0
        assert z.shape == (10, 10) and o.dtype == torch.float16

        src = torch.arange(4096, dtype=torch.float32)
        g = src.to("cuda")                         # host -> device copy
        assert torch.equal(g.cpu(), src)           # device -> host copy
        t = torch.tensor([[1.5, -2.0], [3.25, 4.0]], device="cuda")
        assert t.cpu().tolist() == [[1.5, -2.0], [3.25, 4.0]]
        c = g.clone()                              # device -> device copy
        assert c.data_ptr() != g.data_ptr()
        assert torch.equal(c.cpu(), src)
        d = torch.empty_like(g)
        d.copy_(g)
        assert torch.equal(d.cpu(), src)

        live = torch.cuda.memory_allocated()
        del a, z, o, g, c, d
        assert torch.cuda.memory_allocated() < live
        torch.cuda.synchronize()
    """)


def test_several_devices(run_torch):
    run_torch("""
        x = torch.arange(100, dtype=torch.int64).to("cuda:1")  # arange on CPU: kernels do not run
        assert x.device.index == 1
        assert sim.live_bytes(1) > 0 and sim.live_bytes(0) == 0, (sim.live_bytes(0), sim.live_bytes(1))
        y = x.to("cuda:0")                         # device -> device across devices
        assert torch.equal(y.cpu(), torch.arange(100))
        with torch.cuda.device(1):
            assert torch.cuda.current_device() == 1
            torch.cuda.synchronize()
        assert torch.cuda.current_device() == 0
        assert torch.cuda.memory_allocated(1) == 800 + 224  # rounded to 512 B blocks
    """, device_count=2)


def test_second_stream_record_stream_and_events(run_torch):
    run_torch("""
        s = torch.cuda.Stream()
        x = torch.empty(MiB, device="cuda")
        with torch.cuda.stream(s):
            y = torch.empty(MiB, device="cuda")
            x.record_stream(s)
        e = torch.cuda.Event()
        e.record(s)
        assert e.query()
        e.synchronize()
        assert s.query()
        s.synchronize()
        del x, y
        torch.cuda.synchronize()
        records = sim.call_count("cudaEventRecord") + sim.call_count("cudaEventRecordWithFlags")
        assert records >= 2, records
    """)


def test_record_stream_defers_reuse_until_the_stream_completes(run_torch):
    # Manual completion: work on a stream completes only when the test says so.
    run_torch("""
        big = 64 * MiB
        s2 = torch.cuda.Stream()
        x = torch.empty(big, dtype=torch.uint8, device="cuda")
        x.record_stream(s2)
        del x            # the block waits for an event on s2, which is pending
        mallocs = sim.call_count("cudaMalloc")
        a = torch.empty(big, dtype=torch.uint8, device="cuda")
        assert sim.call_count("cudaMalloc") == mallocs + 1, "a pending block was reused"
        assert sim.pending_work(s2) > 0
        del a
        sim.complete_stream(s2)
        b1 = torch.empty(big, dtype=torch.uint8, device="cuda")
        b2 = torch.empty(big, dtype=torch.uint8, device="cuda")
        assert sim.call_count("cudaMalloc") == mallocs + 1, "a completed block was not reused"
        assert torch.cuda.memory_reserved() == 2 * big
    """, event_mode="manual")


def test_caching_allocator_alloc_delete_stats_and_empty_cache(run_torch):
    run_torch("""
        p = torch.cuda.caching_allocator_alloc(3 * MiB)
        q = torch.cuda.caching_allocator_alloc(100, stream=torch.cuda.Stream())
        assert torch.cuda.memory_allocated() == 3 * MiB + 512
        reserved = torch.cuda.memory_reserved()
        assert reserved == sim.live_bytes(0), (reserved, sim.live_bytes(0))
        stats = torch.cuda.memory_stats()
        assert stats["allocated_bytes.all.current"] == 3 * MiB + 512
        assert stats["reserved_bytes.all.current"] == reserved
        assert stats["num_alloc_retries"] == 0
        torch.cuda.caching_allocator_delete(p)
        torch.cuda.caching_allocator_delete(q)
        assert torch.cuda.memory_allocated() == 0
        assert torch.cuda.memory_reserved() == reserved     # cached, not returned
        free, total = torch.cuda.mem_get_info()
        assert total == sim.memory_capacity(0)
        assert free == total - reserved
        frees = sim.call_count("cudaFree")
        torch.cuda.empty_cache()
        assert torch.cuda.memory_reserved() == 0
        assert sim.live_bytes(0) == 0 and sim.live_allocations(0) == 0
        assert sim.call_count("cudaFree") > frees
        assert torch.cuda.mem_get_info() == (total, total)
    """)


def test_memory_fraction_produces_out_of_memory(run_torch):
    run_torch("""
        torch.cuda.set_per_process_memory_fraction(0.5)
        mallocs = sim.call_count("cudaMalloc")
        try:
            torch.empty(600 * MiB, dtype=torch.uint8, device="cuda")
        except torch.OutOfMemoryError as error:
            assert "CUDA out of memory" in str(error), str(error)
        else:
            raise AssertionError("no OutOfMemoryError")
        assert sim.call_count("cudaMalloc") == mallocs   # refused before cudaMalloc
        ok = torch.empty(400 * MiB, dtype=torch.uint8, device="cuda")
        assert torch.cuda.memory_stats()["num_ooms"] == 1
    """, memory_bytes="1G")


def test_simulated_capacity_produces_out_of_memory(run_torch):
    run_torch("""
        a = torch.empty(700 * MiB, dtype=torch.uint8, device="cuda")
        try:
            torch.empty(700 * MiB, dtype=torch.uint8, device="cuda")
        except torch.OutOfMemoryError as error:
            assert "out of memory" in str(error).lower(), str(error)
        else:
            raise AssertionError("no OutOfMemoryError")
        assert sim.call_count("cudaMalloc") >= 2             # the device said no
        assert torch.cuda.memory_stats()["num_ooms"] == 1
        del a
        b = torch.empty(700 * MiB, dtype=torch.uint8, device="cuda")
        assert sim.live_bytes(0) <= GiB
    """, memory_bytes="1G")


def test_injected_malloc_fault_produces_out_of_memory(run_torch):
    run_torch("""
        torch.empty(1, device="cuda")                         # CUDA initialised
        sim.fail_next("cudaMalloc", 100, "cudaErrorMemoryAllocation")
        mallocs = sim.call_count("cudaMalloc")
        try:
            torch.empty(64 * MiB, dtype=torch.uint8, device="cuda")
        except torch.OutOfMemoryError:
            pass
        else:
            raise AssertionError("no OutOfMemoryError")
        attempts = sim.call_count("cudaMalloc") - mallocs
        assert attempts >= 2, attempts                        # torch retried after freeing
        sim.clear_faults()
        torch.empty(64 * MiB, dtype=torch.uint8, device="cuda")
        print("attempts", attempts)
    """)


def test_no_caching_mode(run_torch):
    out = run_torch("""
        mallocs = sim.call_count("cudaMalloc")
        x = torch.arange(1000, dtype=torch.float32).cuda()
        assert sim.call_count("cudaMalloc") == mallocs + 1
        assert sim.live_bytes(0) == 4096                      # 4000 B, 256-byte units
        assert torch.equal(x.cpu(), torch.arange(1000, dtype=torch.float32))
        frees = sim.call_count("cudaFree")
        del x
        assert sim.call_count("cudaFree") == frees + 1
        assert sim.live_bytes(0) == 0
        a = torch.empty(700 * MiB, dtype=torch.uint8, device="cuda")
        # Without caching, torch 2.14 checks cudaMalloc with C10_CUDA_CHECK: the
        # simulated out-of-memory surfaces as torch.AcceleratorError carrying
        # cudaErrorMemoryAllocation, not as torch.OutOfMemoryError.
        try:
            torch.empty(700 * MiB, dtype=torch.uint8, device="cuda")
        except torch.OutOfMemoryError:
            kind = "OutOfMemoryError"
        except torch.AcceleratorError as error:
            assert "out of memory" in str(error), str(error)
            kind = "AcceleratorError"
        else:
            raise AssertionError("the simulated capacity was not enforced")
        assert sim.live_bytes(0) == 700 * MiB
        print(kind)
    """, memory_bytes="1G", extra_env={"PYTORCH_NO_CUDA_MEMORY_CACHING": "1"})
    assert out.strip() == "AcceleratorError", out


PLUGGABLE_ALLOCATOR = r"""
#include <stddef.h>
typedef int cudaError_t;
cudaError_t cudaMalloc(void** ptr, size_t size);
cudaError_t cudaFree(void* ptr);
int allocations = 0, frees = 0;
void* sim_alloc(size_t size, int device, void* stream) {
  void* ptr = NULL;
  if (cudaMalloc(&ptr, size) != 0) return NULL;
  ++allocations;
  return ptr;
}
void sim_free(void* ptr, size_t size, int device, void* stream) {
  cudaFree(ptr);
  ++frees;
}
"""


def test_pluggable_allocator_runs_on_the_simulated_device(run_torch, tmp_path):
    source = tmp_path / "sim_alloc.c"
    library = tmp_path / "libsim_alloc.so"
    source.write_text(PLUGGABLE_ALLOCATOR)
    # cudaMalloc/cudaFree stay undefined: they bind to the preloaded runtime.
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(library), str(source)], check=True)
    out = run_torch(f"""
        import ctypes
        allocator = torch.cuda.memory.CUDAPluggableAllocator({str(library)!r}, "sim_alloc",
                                                              "sim_free")
        torch.cuda.memory.change_current_allocator(allocator)
        counters = ctypes.CDLL({str(library)!r})
        x = torch.arange(1000, dtype=torch.float32, device="cpu").to("cuda")
        assert ctypes.c_int.in_dll(counters, "allocations").value == 1
        assert sim.live_bytes(0) == 4096 and sim.live_allocations(0) == 1
        assert torch.equal(x.cpu(), torch.arange(1000, dtype=torch.float32))
        del x
        assert ctypes.c_int.in_dll(counters, "frees").value == 1
        assert sim.live_bytes(0) == 0
        print(torch.cuda.get_allocator_backend())
    """)
    assert out.strip() == "pluggable", out
