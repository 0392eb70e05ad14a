"""Handing PyTorch's CUDA allocations to torchmem through ``CUDAPluggableAllocator``.

torchmem's extension module exports the two entry points PyTorch calls for every
CUDA allocation and free, plus the optional hooks (empty_cache, memory fraction,
record_stream, base allocation); ``change_current_allocator`` installs them. Nothing
in PyTorch is patched.
"""

from __future__ import annotations

import torch

from torchmem import _C

_INSTALL_FIRST = (
    "call torchmem.install() at the very top of your program, before anything creates a CUDA "
    "tensor or calls torch.cuda (some libraries do at import time), or run the program under "
    "`python -m torchmem run your_script.py`, which installs before your code starts"
)


def install_pluggable_allocator() -> None:
    """Makes torchmem PyTorch's CUDA allocator for this process (once, before CUDA init)."""
    if torch.cuda.is_initialized():
        raise RuntimeError(
            "torchmem.install('cuda'): CUDA is already initialized in this process, and PyTorch "
            f"can swap its CUDA allocator only before that. Fix: {_INSTALL_FIRST}."
        )
    entry_points = _C.cuda_entry_points()
    allocator = torch.cuda.memory.CUDAPluggableAllocator(
        _C.__file__, entry_points["malloc"][0], entry_points["free"][0]
    )
    hooks = allocator._allocator
    hooks.set_init_fn(entry_points["init"][1])
    hooks.set_reset_fn(entry_points["reset"][1])
    hooks.set_memory_fraction_fn(entry_points["memory_fraction"][1])
    hooks.set_record_stream_fn(entry_points["record_stream"][1])
    hooks.set_base_alloc_fn(entry_points["base_allocation"][1])
    try:
        torch.cuda.memory.change_current_allocator(allocator)
    except RuntimeError as error:
        raise RuntimeError(
            f"torchmem.install('cuda'): PyTorch refused to swap its CUDA allocator ({error}). "
            "Another allocator was installed or used first in this process. "
            f"Fix: {_INSTALL_FIRST}."
        ) from error
    # Keep the Python object alive: PyTorch holds the C++ allocator, but the
    # ctypes handle of our library should live as long as the process.
    global _allocator
    _allocator = allocator


_allocator = None
