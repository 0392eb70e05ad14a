"""CUDA tensors through torchmem: reuse, streams, empty_cache, limits, OOM."""

import gc

import pytest
import torch

import torchmem
from torchmem import _C


def engine():
    return _C.cuda_engine(0)


def test_zeros_clone_and_del_are_accounted():
    stats = torchmem.memory_stats("cuda:0")
    a = torch.zeros(256, 1024, device="cuda")  # 1 MiB
    b = a.clone()
    assert torchmem.memory_allocated("cuda:0") == stats["allocated_bytes.all.current"] + (2 << 20)
    del a, b
    after = torchmem.memory_stats("cuda:0")
    assert after["allocated_bytes.all.current"] == stats["allocated_bytes.all.current"]
    assert after["allocation.all.allocated"] == stats["allocation.all.allocated"] + 2


def test_copies_to_and_from_the_device_keep_their_data():
    host = torch.arange(1000, dtype=torch.float32)
    device = host.to("cuda")
    assert torch.equal(device.cpu(), host)


def test_freed_memory_is_reused_without_asking_the_device(sim):
    x = torch.empty(1 << 20, device="cuda")
    address = x.data_ptr()
    del x
    calls = sim.call_count("cudaMalloc")
    y = torch.empty(1 << 20, device="cuda")
    assert y.data_ptr() == address
    assert sim.call_count("cudaMalloc") == calls


def test_record_stream_delays_reuse_until_the_other_stream_is_done(sim):
    sim.set_event_mode("manual")
    side = torch.cuda.Stream()
    x = torch.empty(1 << 18, device="cuda")
    address = x.data_ptr()
    x.record_stream(side)
    del x
    assert engine().block  # block is pending: not reused yet
    y = torch.empty(1 << 18, device="cuda")
    assert y.data_ptr() != address
    sim.complete_stream(side)
    z = torch.empty(1 << 18, device="cuda")
    assert z.data_ptr() == address
    del y, z


def test_empty_cache_returns_segments_to_the_device(sim):
    x = torch.empty(8 << 20, device="cuda")
    del x
    assert torchmem.memory_reserved("cuda:0") > 0
    live = sim.live_bytes(0)
    torch.cuda.empty_cache()  # PyTorch's own call reaches torchmem's reset hook
    assert torchmem.memory_reserved("cuda:0") == 0
    assert sim.live_bytes(0) < live


def test_memory_limit_raises_torch_out_of_memory_with_torchmem_message():
    torchmem.set_memory_limit(32 << 20, device="cuda:0")
    with torchmem.tag("activations"):
        held = torch.empty(16 << 20, dtype=torch.uint8, device="cuda")
        with pytest.raises(torch.OutOfMemoryError) as error:
            torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
    message = str(error.value)
    assert "out of memory on cuda:0" in message
    assert "32.00 MiB (torchmem memory limit)" in message
    assert "activations 16.00 MiB" in message
    assert "What to try" in message
    del held


def test_per_process_memory_fraction_becomes_a_torchmem_limit(sim):
    sim.set_memory_capacity(1 << 30)
    torch.cuda.set_per_process_memory_fraction(0.25, device=0)
    assert engine().memory_limit == 256 << 20
    with pytest.raises(torch.OutOfMemoryError):
        torch.empty(300 << 20, dtype=torch.uint8, device="cuda")


def test_device_capacity_out_of_memory_after_retry(sim):
    sim.set_memory_capacity(64 << 20, device=0)
    with pytest.raises(torch.OutOfMemoryError) as error:
        torch.empty(128 << 20, dtype=torch.uint8, device="cuda")
    assert "cudaErrorMemoryAllocation" in str(error.value)
    assert torchmem.memory_stats("cuda:0")["num_ooms"] >= 1


def test_failed_cuda_malloc_is_retried_after_emptying_the_cache(sim):
    warm = torch.empty(3 << 20, dtype=torch.uint8, device="cuda")
    del warm
    retries = torchmem.memory_stats("cuda:0")["num_alloc_retries"]
    sim.fail_next("cudaMalloc", 1, "cudaErrorMemoryAllocation")
    x = torch.empty(40 << 20, dtype=torch.uint8, device="cuda")
    assert torchmem.memory_stats("cuda:0")["num_alloc_retries"] == retries + 1
    del x


class Cycle:
    def __init__(self, tensor):
        self.tensor = tensor
        self.me = self


def test_out_of_memory_collects_garbage_cycles_and_retries():
    torchmem.set_memory_limit(64 << 20, device="cuda:0")
    gc.disable()
    try:
        Cycle(torch.empty(40 << 20, dtype=torch.uint8, device="cuda"))  # garbage, held by a cycle
        x = torch.empty(40 << 20, dtype=torch.uint8, device="cuda")  # needs the cycle collected
        del x
    finally:
        gc.enable()


def test_tags_follow_autograd_into_the_backward_threads():
    w = torch.randn(1 << 16, device="cuda", requires_grad=True)
    x = torch.randn(1 << 16, device="cuda")
    with torchmem.tag("train"):
        loss = (w * x).sum()
        loss.backward()
    # The gradient was allocated by autograd's CUDA worker thread.
    block = engine().block(w.grad.data_ptr())
    assert block["tag"] == "train"
    assert torchmem.tag_stats("cuda:0")["train"]["live_blocks"] >= 1
    del w, x, loss


def test_fragmentation_and_tag_stats_cover_cuda():
    a = torch.empty(1 << 18, device="cuda")
    b = torch.empty(1 << 18, device="cuda")
    del a
    report = torchmem.fragmentation("cuda:0")
    assert report["free_bytes"] > 0
    assert report["largest_free_block"] <= report["free_bytes"]
    assert report["small_pool"]["reserved_bytes"] > 0
    del b
