"""PyTorch's own CUDA memory APIs, answered by torchmem (the complete allocator).

Every ``torch.cuda`` / ``torch.accelerator`` memory call must reach torchmem's engines
and agree exactly with ``torchmem.memory_stats()``: tools built on PyTorch's API
(Lightning's monitors, profilers, dashboards) then see what torchmem sees.
"""

import pytest
import torch

import torchmem
from torchmem import _C, _C_cuda

# Keys PyTorch adds per private pool (CUDA graphs, MemPool), kept after the pool is gone.
PRIVATE = "reserved_bytes_by_private_pools."


def test_every_stats_key_of_pytorch_is_torchmems_on_each_device():
    held = [torch.empty(n, device=f"cuda:{d}") for d in (0, 1) for n in (100, 300_000, 3 << 20)]
    del held[1]
    for device in (0, 1):
        ours = torchmem.memory_stats(f"cuda:{device}")
        theirs = torch.cuda.memory_stats(device)
        assert theirs == ours
        assert torch.cuda.memory_allocated(device) == ours["allocated_bytes.all.current"]
        assert torch.cuda.max_memory_allocated(device) == ours["allocated_bytes.all.peak"]
        assert torch.cuda.memory_reserved(device) == ours["reserved_bytes.all.current"]
        assert torch.cuda.max_memory_reserved(device) == ours["reserved_bytes.all.peak"]
        # torch.accelerator's generic stats leave out the CUDA-only num_oom_rejections and
        # the per-private-pool keys (as with PyTorch's allocator).
        generic = torch.accelerator.memory_stats(device)
        assert generic == {key: value for key, value in ours.items()
                           if key != "num_oom_rejections" and not key.startswith(PRIVATE)}
        assert torch.accelerator.memory_allocated(device) == ours["allocated_bytes.all.current"]
    nested = torch.cuda.memory_stats_as_nested_dict(0)
    assert nested["allocated_bytes"]["all"]["current"] == torchmem.memory_allocated("cuda:0")
    del held


TORCH = torch.torch_version.TorchVersion(torch.__version__.split("+")[0])


def test_the_stats_keys_are_pytorchs_own_set():
    stats = torch.cuda.memory_stats(0)
    # PyTorch's native allocator reports the same 123 keys (122 before 2.12, which added
    # num_oom_rejections), plus 12 per private pool from 2.13.
    assert len([key for key in stats if not key.startswith(PRIVATE)]) == (123 if TORCH >= (2, 12) else 122)
    for key in ("num_alloc_retries", "num_ooms", "num_sync_all_streams", "num_device_alloc",
                "num_device_free", "max_split_size", "oversize_allocations.current",
                "oversize_segments.peak", "requested_bytes.large_pool.freed",
                "inactive_split_bytes.small_pool.current"):
        assert key in stats
    assert ("num_oom_rejections" in stats) == (TORCH >= (2, 12))


def test_reset_peak_and_accumulated_stats_reach_the_engine():
    big = torch.empty(8 << 20, device="cuda")
    del big
    stats = torchmem.memory_stats("cuda:0")
    assert stats["allocated_bytes.all.peak"] > stats["allocated_bytes.all.current"]
    torch.cuda.reset_peak_memory_stats(0)
    stats = torchmem.memory_stats("cuda:0")
    assert stats["allocated_bytes.all.peak"] == stats["allocated_bytes.all.current"]
    assert stats["reserved_bytes.all.peak"] == stats["reserved_bytes.all.current"]

    torch.cuda.reset_accumulated_memory_stats(0)
    stats = torchmem.memory_stats("cuda:0")
    assert stats["allocation.all.allocated"] == stats["allocation.all.freed"] == 0
    assert stats["num_alloc_retries"] == stats["num_ooms"] == 0
    torch.accelerator.reset_peak_memory_stats(0)


def test_memory_summary_is_pytorchs_table_of_torchmems_numbers():
    held = torch.empty(5 << 20, dtype=torch.uint8, device="cuda")
    text = torch.cuda.memory_summary(0)
    assert "PyTorch CUDA memory summary, device ID 0" in text
    assert "Allocated memory" in text and "GPU reserved memory" in text
    assert f"Allocations           | {torchmem.memory_stats('cuda:0')['allocation.all.current']:>7}" in text
    del held


def test_untyped_storages_come_from_c10s_registered_cuda_allocator():
    # torch.UntypedStorage asks c10::GetAllocator(kCUDA), not the CUDA caching allocator.
    storage = torch.UntypedStorage(1000, device="cuda")
    assert _C.cuda_engine(0).block(storage.data_ptr())["requested_size"] == 1000
    del storage


def test_caching_allocator_alloc_on_a_side_stream_and_raw_delete():
    side = torch.cuda.Stream()
    ptr = torch.cuda.caching_allocator_alloc(1 << 20, device=0, stream=side)
    assert _C.cuda_engine(0).block(ptr)["stream"] == side.cuda_stream
    torch.cuda.caching_allocator_delete(ptr)


def test_per_process_memory_fraction_is_pytorchs_limit_and_out_of_memory_is_pytorchs_error(sim):
    sim.set_memory_capacity(1 << 30)
    torch.cuda.set_per_process_memory_fraction(0.25, device=0)
    assert torch.cuda.get_per_process_memory_fraction(0) == 0.25
    assert _C.cuda_engine(0).memory_limit == 256 << 20
    before = torch.cuda.memory_stats(0)["num_ooms"]
    with pytest.raises(torch.OutOfMemoryError) as error:
        torch.empty(300 << 20, dtype=torch.uint8, device="cuda")
    message = str(error.value)
    assert message.startswith("CUDA out of memory. Tried to allocate 300.00 MiB. GPU 0")
    assert "256.00 MiB allowed" in message and "(allocator: torchmem)" in message
    assert torch.cuda.memory_stats(0)["num_ooms"] == before + 1
    torch.cuda.set_per_process_memory_fraction(1.0, device=0)
    assert torch.cuda.get_per_process_memory_fraction(0) == 1.0


def test_out_of_memory_observers_hear_of_each_failure(sim):
    heard = []
    torch._C._cuda_attach_out_of_memory_observer(
        lambda device, size, total, free: heard.append((device, size, total, free)))
    torchmem.set_memory_limit(64 << 20, device="cuda:0")
    with pytest.raises(torch.OutOfMemoryError):
        torch.empty(100 << 20, dtype=torch.uint8, device="cuda")
    assert heard[-1][:3] == (0, 100 << 20, 64 << 20)


def test_cache_info_is_the_largest_cached_block_as_cudnn_benchmark_asks():
    # cuDNN does not run on the simulated device; its benchmark mode sizes its
    # workspace with c10::cuda::CUDACachingAllocator::cacheInfo, called here.
    torch.cuda.empty_cache()
    held = torch.empty(30 << 20, dtype=torch.uint8, device="cuda")  # a 30 MiB segment
    small = torch.empty(3 << 20, dtype=torch.uint8, device="cuda")  # a 20 MiB segment
    assert _C_cuda.cache_info(0, initial_guess=1) == 17 << 20  # the rest of the 20 MiB one
    del held
    assert _C_cuda.cache_info(0, initial_guess=1) == 30 << 20
    free, _ = torch.cuda.mem_get_info(0)
    assert _C_cuda.cache_info(0) == max(free, 30 << 20)  # 0: PyTorch's first guess, free memory
    del small


def test_empty_cache_waits_for_streams_still_using_freed_blocks(sim):
    sim.set_event_mode("manual")
    side = torch.cuda.Stream()
    x = torch.empty(8 << 20, dtype=torch.uint8, device="cuda")
    x.record_stream(side)
    del x  # pending: the side stream may still use it
    assert _C.cuda_engine(0).event_health()["outstanding_events"] == 1
    torch.cuda.empty_cache()  # as PyTorch's: synchronizes the events, then releases
    assert torch.cuda.memory_reserved(0) == 0
    assert _C.cuda_engine(0).event_health()["streams_with_events"] == 0


def test_cross_device_copies_enable_peer_access_through_the_allocator(sim):
    calls = sim.call_count("cudaDeviceEnablePeerAccess")
    source = torch.arange(1000, dtype=torch.float32).to("cuda:0")
    copied = source.to("cuda:1")
    assert torch.equal(copied.cpu(), torch.arange(1000, dtype=torch.float32))
    assert sim.call_count("cudaDeviceEnablePeerAccess") > calls
    del source, copied


def test_caching_off_allocates_straight_from_the_device(sim):
    # torch.cuda.memory.caching_allocator_enable(False), as caching_allocator_disabled()
    # (torch 2.10+) does; isEnabled() is asked through PyTorch where it exposes it (2.10+).
    enabled = getattr(torch._C, "_cuda_cudaCachingAllocator_is_enabled", None)
    torch.cuda.memory.caching_allocator_enable(False)
    try:
        assert enabled is None or not enabled()
        calls = sim.call_count("cudaMalloc"), sim.call_count("cudaFree")
        x = torch.empty(1000, device="cuda")
        assert sim.call_count("cudaMalloc") == calls[0] + 1
        assert torchmem.memory_stats("cuda:0")["allocation.all.current"] == 0
        del x
        assert sim.call_count("cudaFree") == calls[1] + 1
        # The raw entry points too (caching_allocator_alloc, cuDNN's workspaces).
        requested = torchmem.memory_stats("cuda:0")["requested_bytes.all.allocated"]
        raw = torch._C._cuda_cudaCachingAllocator_raw_alloc(1 << 20, torch.cuda.current_stream().cuda_stream)
        assert sim.call_count("cudaMalloc") == calls[0] + 2
        assert torchmem.memory_stats("cuda:0")["requested_bytes.all.allocated"] == requested
        torch._C._cuda_cudaCachingAllocator_raw_delete(raw)
        assert sim.call_count("cudaFree") == calls[1] + 2
    finally:
        torch.cuda.memory.caching_allocator_enable(True)
    assert enabled is None or enabled()
