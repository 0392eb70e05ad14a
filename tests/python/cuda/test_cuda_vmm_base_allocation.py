"""getBaseAllocation of expandable-segment memory: the mapped memory around a pointer.

Code that exports or rebases device memory (CUDA IPC wrappers, NCCL registration) asks the
allocator for the allocation holding a pointer and treats all of it as memory. In an
expandable segment only the mapped pages are memory; the rest of the reserved range is
address space that faults when touched. So torchmem answers with the run of mapped pages
around the pointer, as PyTorch's snapshot reports one expandable segment per contiguous
mapped range.
"""

import ctypes

import pytest
import torch

import torchmem.runtime.cuda as torchmem_cuda
from allocator_settings import expandable  # noqa: F401 (a fixture)

MiB = 1 << 20
TORCH = torch.torch_version.TorchVersion(torch.__version__.split("+")[0])
pytestmark = pytest.mark.skipif(
    TORCH < (2, 11), reason="allocator settings changed at run time reach torchmem from torch 2.11")

def pluggable_base_allocation(ptr):
    """The same question through the reduced route's exported entry point."""
    address = torchmem_cuda.load().pluggable_entry_points()["base_allocation"][1]
    function = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p,
                                ctypes.POINTER(ctypes.c_size_t))(address)
    size = ctypes.c_size_t(0)
    base = function(ptr, ctypes.byref(size))
    return base, size.value


def test_base_allocation_is_the_mapped_run_around_the_pointer(expandable):
    module = torchmem_cuda.load()
    page = 20 * MiB  # the large pool's pages
    size = 3 * page // 2
    a = torch.empty(size, dtype=torch.uint8, device="cuda")
    b = torch.empty(size, dtype=torch.uint8, device="cuda")
    c = torch.empty(size, dtype=torch.uint8, device="cuda")
    start = a.data_ptr()  # the range's first block: its pages are [start, start + 5 pages)
    assert b.data_ptr() == start + size and c.data_ptr() == start + 2 * size
    for tensor in (a, b, c):
        assert pluggable_base_allocation(tensor.data_ptr()) == (start, 5 * page)
        assert module.base_allocation(tensor.data_ptr()) == (start, 5 * page)

    # Unmapping the page only b touched (the third) splits the mapped memory in two.
    del b
    torch.cuda.empty_cache()
    assert module.base_allocation(a.data_ptr()) == (start, 2 * page)
    assert module.base_allocation(c.data_ptr()) == (start + 3 * page, 2 * page)
    assert module.base_allocation(c.data_ptr() + MiB) == (start + 3 * page, 2 * page)
    assert pluggable_base_allocation(c.data_ptr()) == (start + 3 * page, 2 * page)
    del a, c


def test_base_allocation_of_a_segment_is_the_segment():
    x = torch.empty(MiB, dtype=torch.uint8, device="cuda")
    base, size = torchmem_cuda.load().base_allocation(x.data_ptr())
    segment = [s for s in torch.cuda.memory_snapshot()
               if s["address"] <= x.data_ptr() < s["address"] + s["total_size"]]
    assert [(s["address"], s["total_size"]) for s in segment] == [(base, size)]
    del x
