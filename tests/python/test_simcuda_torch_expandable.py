"""PyTorch's own ``expandable_segments:True`` on the simulated CUDA device.

With ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`` PyTorch's native
caching allocator reserves address space once per segment and maps physical
pages into it as it grows (the driver's cuMemAddressReserve / cuMemCreate /
cuMemMap / cuMemSetAccess, unmapped again by empty_cache and the out-of-memory
path). The simulated driver implements those calls over host memory, so this
runs here as it does on a GPU: it is the same-run baseline that torchmem's
virtual-memory allocator is compared with (issue 12). PyTorch 2.14 also asks
NVML whether the GPU has a fabric, hence ``nvml=True`` (the fake NVML).

Each test runs a script in a subprocess on the device and checks what the
allocator reports against what the device saw (mapped pages, live bytes,
driver calls). Kernels do not run; only copied values are checked.
"""

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT / "tests" / "simcuda"))
import simcuda  # noqa: E402

PRELUDE = f"""
import sys
sys.path.insert(0, {str(REPO_ROOT / "tests" / "simcuda")!r})
import torch
import simcuda
sim = simcuda.Control()
MiB = 1 << 20

def reserved():
    return torch.cuda.memory_reserved()

def check_device_agrees():
    # Every reserved byte of PyTorch's is a mapped page of the device's, charged once.
    vmm = sim.vmm_stats()
    assert vmm["mapped_bytes"] == reserved(), (vmm, reserved())
    assert vmm["accessible_bytes"] == reserved(), vmm
    assert vmm["allocated_bytes"] == reserved(), vmm
    assert sim.live_bytes(0) == reserved(), (sim.live_bytes(0), reserved())
    free, total = torch.cuda.mem_get_info()
    assert total - free == reserved(), (free, total, reserved())
"""


@pytest.fixture
def run_expandable(simcuda_dir, tmp_path):
    """Runs `code` (after PRELUDE) with expandable segments on the simulated
    device; returns the driver calls it made ({name: count})."""
    def run(code, **settings):
        trace = tmp_path / "trace.txt"
        trace.unlink(missing_ok=True)
        env = simcuda.environment(trace=trace, nvml=True, **settings)
        env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
        proc = subprocess.run([sys.executable, "-c", PRELUDE + textwrap.dedent(code)],
                              env=env, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
        counts, unsupported = simcuda.read_trace(trace)
        assert not unsupported, f"torch reached unsimulated CUDA calls: {sorted(unsupported)}"
        assert "simcuda: unsupported" not in proc.stderr, proc.stderr
        return {call: n for (library, call), n in counts.items() if library == "driver"}
    return run


def test_segments_grow_in_place_and_empty_cache_unmaps_free_pages(run_expandable):
    calls = run_expandable("""
        small = torch.empty(MiB, dtype=torch.uint8, device="cuda")   # small pool: 2 MiB pages
        a = torch.empty(30 * MiB, dtype=torch.uint8, device="cuda")  # large pool: 20 MiB pages
        b = torch.empty(30 * MiB, dtype=torch.uint8, device="cuda")
        # One large segment that grew: b sits right after a, no new segment.
        assert b.data_ptr() == a.data_ptr() + 30 * MiB, (hex(a.data_ptr()), hex(b.data_ptr()))
        assert reserved() == 2 * MiB + 60 * MiB, reserved()
        segments = sorted((s["segment_type"], s["total_size"]) for s in torch.cuda.memory_snapshot())
        assert segments == [("large", 60 * MiB), ("small", 2 * MiB)], segments
        check_device_agrees()

        # Values cross page boundaries (copies through the mapped pages).
        src = torch.arange(60 * MiB, dtype=torch.int64).remainder_(251).to(torch.uint8)
        a.copy_(src[:30 * MiB]); b.copy_(src[30 * MiB:])
        assert torch.equal(torch.cat([a.cpu(), b.cpu()]), src)

        del b                                  # cached: still mapped
        assert reserved() == 62 * MiB
        torch.cuda.empty_cache()               # the page wholly free after a is unmapped
        assert reserved() == 2 * MiB + 40 * MiB, reserved()
        check_device_agrees()
        assert torch.equal(a.cpu(), src[:30 * MiB])

        del a, small
        torch.cuda.empty_cache()
        assert reserved() == 0 and sim.live_bytes(0) == 0
        assert sim.vmm_stats()["mappings"] == 0
    """)
    # Every page was mapped once, unmapped and released: four pages, the peak. (torch 2.11
    # also makes one cuMemCreate at start-up that the device refuses: a handle-type probe.)
    assert calls["cuMemMap"] == calls["cuMemUnmap"] == calls["cuMemRelease"] == 4, calls
    assert calls["cuMemCreate"] in (4, 5), calls
    assert calls["cuMemAddressReserve"] == 2  # one reservation per segment


def test_out_of_memory_unmaps_cached_pages_and_retries(run_expandable):
    calls = run_expandable("""
        # 8 pages in use, every other one freed: 80 MiB cached in holes.
        blocks = [torch.empty(20 * MiB, dtype=torch.uint8, device="cuda") for _ in range(8)]
        del blocks[::2]
        assert reserved() == 160 * MiB
        # 60 MiB fits no hole and the device has only 40 MiB left: PyTorch
        # unmaps the free pages (returning them to the device) and maps new
        # ones where the segment needs them.
        big = torch.empty(60 * MiB, dtype=torch.uint8, device="cuda")
        assert reserved() <= 200 * MiB, reserved()
        check_device_agrees()

        # Past the device's capacity: PyTorch's out-of-memory error, and the
        # allocator still works afterwards.
        try:
            torch.empty(150 * MiB, dtype=torch.uint8, device="cuda")
        except torch.OutOfMemoryError as error:
            assert "out of memory" in str(error), str(error)
        else:
            raise AssertionError("no OutOfMemoryError")
        check_device_agrees()
        del big
        again = torch.empty(100 * MiB, dtype=torch.uint8, device="cuda")
        check_device_agrees()
    """, memory_bytes="200M")
    assert calls["cuMemUnmap"] >= 4, calls
    assert calls["cuMemCreate"] >= 8 + 3, calls


def test_injected_driver_failures_reach_pytorch_as_they_would_on_a_gpu(run_expandable):
    run_expandable("""
        # cuMemCreate out of memory: PyTorch frees its cache (a cached page of the small
        # pool) and retries. (With nothing cached, torch 2.11 gives up at once, 2.14 retries.)
        torch.empty(MiB, dtype=torch.uint8, device="cuda")  # freed at once: cached
        assert reserved() == 2 * MiB
        creates_before = sim.call_count("cuMemCreate")
        sim.fail_next("cuMemCreate", 1, "CUDA_ERROR_OUT_OF_MEMORY")
        x = torch.empty(4 * MiB, dtype=torch.uint8, device="cuda")
        assert torch.cuda.memory_stats()["num_alloc_retries"] == 1
        assert reserved() == 20 * MiB, reserved()   # the small page went back to the device
        # The failed one, then one 20 MiB page.
        assert sim.call_count("cuMemCreate") == creates_before + 2
        check_device_agrees()
        # Any other driver error is PyTorch's "CUDA driver error".
        sim.fail_next("cuMemSetAccess", 1, "CUDA_ERROR_UNKNOWN")
        try:
            torch.empty(40 * MiB, dtype=torch.uint8, device="cuda")
        except RuntimeError as error:
            assert "CUDA driver error: unknown error" in str(error), str(error)
        else:
            raise AssertionError("the injected cuMemSetAccess failure was not seen")
    """)
