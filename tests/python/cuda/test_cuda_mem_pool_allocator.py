"""torch.cuda.MemPool(allocator=...): a private pool whose memory comes from another allocator.

NCCL's ``mem_allocator`` pools (ncclMemAlloc) and CuMemAllocator-style pools hand PyTorch a
``CUDAPluggableAllocator`` for one pool. PyTorch's allocator then obtains that pool's segments
from the pool's allocator (``raw_alloc`` / ``raw_delete``) and caches blocks in them as in any
pool. torchmem does the same: the pool's allocator is asked for each segment and told of each
release, and torchmem's statistics and snapshots count them. Here the pool's allocator is a
small C library over the simulated device's own cudaMalloc, counting its calls.
"""

import ctypes
import subprocess

import pytest
import torch
from allocator_settings import set_allocator_settings

MiB = 1 << 20
TORCH = torch.torch_version.TorchVersion(torch.__version__.split("+")[0])

POOL_ALLOCATOR = r"""
#include <stddef.h>
typedef int cudaError_t;
cudaError_t cudaMalloc(void** ptr, size_t size);
cudaError_t cudaFree(void* ptr);
int allocations = 0, frees = 0;
void* last_ptr = NULL;
size_t last_size = 0, live_bytes = 0;
void* pool_alloc(size_t size, int device, void* stream) {
  void* ptr = NULL;
  if (cudaMalloc(&ptr, size) != 0) return NULL;
  ++allocations;
  last_ptr = ptr;
  last_size = size;
  live_bytes += size;
  return ptr;
}
void pool_free(void* ptr, size_t size, int device, void* stream) {
  cudaFree(ptr);
  ++frees;
  live_bytes -= size;
}
"""


@pytest.fixture
def pool_allocator(tmp_path):
    """(CUDAPluggableAllocator, the library's counters)."""
    source = tmp_path / "pool_alloc.c"
    library = tmp_path / "libpool_alloc.so"
    source.write_text(POOL_ALLOCATOR)
    # cudaMalloc/cudaFree stay undefined: they bind to the preloaded simulated runtime.
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(library), str(source)], check=True)
    allocator = torch.cuda.memory.CUDAPluggableAllocator(str(library), "pool_alloc", "pool_free")
    return allocator, ctypes.CDLL(str(library))


def counter(library, name, kind=ctypes.c_int):
    return kind.in_dll(library, name).value


def test_pool_segments_come_from_the_pools_allocator_and_are_accounted(pool_allocator):
    allocator, library = pool_allocator
    pool = torch.cuda.MemPool(allocator=allocator.allocator())
    reserved = torch.cuda.memory_reserved()
    with torch.cuda.use_mem_pool(pool):
        x = torch.full((MiB,), 7, dtype=torch.uint8).to("cuda")
    assert counter(library, "allocations") == 1
    segment = counter(library, "last_ptr", ctypes.c_void_p)
    size = counter(library, "last_size", ctypes.c_size_t)
    assert segment <= x.data_ptr() < segment + size
    assert bool((x.cpu() == 7).all())
    # torchmem accounts the pool's segment as PyTorch does: reserved, in the pool's snapshot.
    assert torch.cuda.memory_reserved() == reserved + size
    assert [(s["address"], s["total_size"]) for s in pool.snapshot()] == [(segment, size)]

    # A second block fits in the cached segment: the pool's allocator is not asked again.
    del x
    with torch.cuda.use_mem_pool(pool):
        y = torch.empty(MiB // 2, dtype=torch.uint8, device="cuda")
    assert counter(library, "allocations") == 1
    assert segment <= y.data_ptr() < segment + size

    # Outside the pool, memory comes from torchmem's own segments.
    z = torch.empty(MiB, dtype=torch.uint8, device="cuda")
    assert not segment <= z.data_ptr() < segment + size
    assert counter(library, "allocations") == 1

    # Once the pool is gone and its memory free, empty_cache gives the segment back to the
    # pool's allocator (raw_delete), not to cudaFree.
    del y, pool
    torch.cuda.empty_cache()
    assert counter(library, "frees") == 1
    assert counter(library, "live_bytes", ctypes.c_size_t) == 0
    assert torch.cuda.memory_reserved() <= reserved + 2 * MiB  # z's segment at most
    del z


@pytest.mark.skipif(TORCH < (2, 11),
                    reason="allocator settings changed at run time reach torchmem from torch 2.11")
def test_pool_with_own_allocator_keeps_it_under_expandable_segments(pool_allocator, sim):
    """As PyTorch's expandable segments skip pools with an allocator: no driver mapping for it."""
    allocator, library = pool_allocator
    torch.cuda.empty_cache()
    set_allocator_settings("expandable_segments:True")
    try:
        pool = torch.cuda.MemPool(allocator=allocator.allocator())
        maps = sim.call_count("cuMemMap")
        with torch.cuda.use_mem_pool(pool):
            x = torch.full((3 * MiB,), 5, dtype=torch.uint8).to("cuda")
        assert counter(library, "allocations") == 1
        assert sim.call_count("cuMemMap") == maps
        segment = counter(library, "last_ptr", ctypes.c_void_p)
        assert segment <= x.data_ptr() < segment + counter(library, "last_size", ctypes.c_size_t)
        assert bool((x.cpu() == 5).all())
        del x, pool
        torch.cuda.empty_cache()
        assert counter(library, "frees") == 1
    finally:
        set_allocator_settings("expandable_segments:False")
        torch.cuda.empty_cache()
