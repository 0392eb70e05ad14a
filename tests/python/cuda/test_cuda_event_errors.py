"""A freed block whose stream's event can neither be queried nor waited for is not reused.

PyTorch's allocator raises the CUDA error of a failed cudaEventQuery/cudaEventSynchronize
(C10_CUDA_CHECK in process_events and synchronize_and_free_events): nobody knows whether the
stream still reads or writes the block, so handing it out again could corrupt new data.
"""

import pytest
import torch

import torchmem


def free_block_used_on_a_side_stream(sim):
    sim.set_event_mode("manual")  # the side stream's work stays incomplete
    side = torch.cuda.Stream()
    x = torch.empty(1 << 18, device="cuda")
    address = x.data_ptr()
    x.record_stream(side)
    del x
    return side, address


def active_bytes():
    return torchmem.memory_stats("cuda:0")["active_bytes.all.current"]


def test_an_event_broken_both_ways_raises_and_the_block_stays_in_use(sim):
    side, address = free_block_used_on_a_side_stream(sim)
    pending = active_bytes()
    sim.fail_next("cudaEventQuery", 1, "cudaErrorLaunchFailure")
    sim.fail_next("cudaEventSynchronize", 1, "cudaErrorLaunchFailure")
    with pytest.raises(RuntimeError, match="cudaErrorLaunchFailure"):
        torch.empty(1 << 18, device="cuda")
    assert active_bytes() == pending  # still pending, not reused
    sim.complete_stream(side)
    y = torch.empty(1 << 18, device="cuda")
    assert y.data_ptr() == address  # reused once the stream is done
    del y


def test_a_failed_wait_in_empty_cache_raises_and_keeps_the_block(sim):
    side, address = free_block_used_on_a_side_stream(sim)
    pending = active_bytes()
    sim.fail_next("cudaEventSynchronize", 1, "cudaErrorLaunchFailure")
    with pytest.raises(RuntimeError, match="cudaErrorLaunchFailure"):
        torch.cuda.empty_cache()
    assert active_bytes() == pending
    y = torch.empty(1 << 18, device="cuda")
    assert y.data_ptr() != address  # the side stream may still use it
    del y
    sim.complete_stream(side)
