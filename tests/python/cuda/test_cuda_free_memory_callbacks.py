"""A cache miss runs PyTorch's FreeCudaMemoryCallbacksRegistry before asking the device.

PyTorch's allocator does so (trigger_free_memory_callbacks) and torch registers
"cuda_ipc_collect": a block sent to another process stays allocated after the sender drops
it, until every consumer has released it and something collects it. Without the callbacks,
a sender that keeps allocating grows its cache by every tensor it ever sent.
"""

import mmap
import os
import struct

import torch

import torchmem

MiB = 1 << 20


def release_as_the_consumer(counter_file: bytes, counter_offset: int):
    """What a consumer process does when its last tensor on the block dies: it decrements the
    block's count in the shared counter file (torch/csrc/StorageSharing.cpp). The file is a
    RefcountedMapAllocator mapping: its data (int64 counters) follows a 64-byte header
    (TH_ALLOC_ALIGNMENT in aten/src/ATen/MapAllocator.cpp)."""
    path = os.path.join("/dev/shm", counter_file.decode().lstrip("/"))
    with open(path, "r+b") as file, mmap.mmap(file.fileno(), 0) as counters:
        at = 64 + 8 * counter_offset
        (count,) = struct.unpack_from("q", counters, at)
        assert count == 1  # the one consumer a send accounts for
        struct.pack_into("q", counters, at, count - 1)


def test_a_cache_miss_frees_blocks_that_consumers_are_done_with(sim):
    # A segment of its own (no free remainder could serve the next request).
    x = torch.empty(64 * MiB, dtype=torch.uint8, device="cuda")
    address = x.data_ptr()
    shared = x.untyped_storage()._share_cuda_()  # what torch.multiprocessing sends
    counter_file, counter_offset = shared[4], shared[5]
    allocated = torchmem.memory_allocated("cuda:0")
    del x, shared
    assert torchmem.memory_allocated("cuda:0") == allocated  # torch keeps it for the consumer
    release_as_the_consumer(counter_file, counter_offset)
    mallocs = sim.call_count("cudaMalloc")
    y = torch.empty(64 * MiB, dtype=torch.uint8, device="cuda")
    assert y.data_ptr() == address  # torch's cuda_ipc_collect freed it at the miss
    assert sim.call_count("cudaMalloc") == mallocs
    del y
