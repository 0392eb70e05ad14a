"""torchmem as PyTorch's CUDA allocator.

The CUDA half of torchmem lives in its own extension module, ``torchmem._C_cuda``,
built only for a CUDA build of torch and imported here on first use, so that
``import torchmem`` works with a CPU-only torch. Both modules share one engine per
device through ``torchmem/lib/libtorchmem.so``.

Two ways in:

* the reduced route, ``CUDAPluggableAllocator`` over the C entry points that
  ``torchmem._C_cuda`` exports (malloc/free and a few hooks; PyTorch's memory APIs,
  snapshots, CUDA graph pools and IPC do not work through it);
* (see ``install_allocator``) the complete allocator.
"""

from __future__ import annotations

import importlib
from types import ModuleType

import torch

_INSTALL_FIRST = (
    "call torchmem.install() at the very top of your program, before anything creates a CUDA "
    "tensor or calls torch.cuda (some libraries do at import time), or run the program under "
    "`python -m torchmem run your_script.py`, which installs before your code starts"
)

_module: ModuleType | None = None


def supported() -> bool:
    """Whether this torch and this build of torchmem can serve CUDA (no device needed)."""
    if torch.version.cuda is None:
        return False
    try:
        load()
    except ImportError:
        return False
    return True


def load() -> ModuleType:
    """Imports ``torchmem._C_cuda`` (which registers the CUDA engines with ``torchmem._C``)."""
    global _module
    if _module is None:
        if torch.version.cuda is None:
            raise ImportError(
                f"torchmem's CUDA support needs a CUDA build of PyTorch; this one ({torch.__version__}) "
                "is CPU-only (torchmem.install('cpu') works without it)"
            )
        _module = importlib.import_module("torchmem._C_cuda")
    return _module


def pluggable_allocator() -> torch.cuda.memory.CUDAPluggableAllocator:
    """The reduced route: a ``CUDAPluggableAllocator`` over torchmem's exported entry points."""
    module = load()
    entry_points = module.pluggable_entry_points()
    allocator = torch.cuda.memory.CUDAPluggableAllocator(
        module.__file__, entry_points["malloc"][0], entry_points["free"][0]
    )
    hooks = allocator._allocator
    hooks.set_init_fn(entry_points["init"][1])
    hooks.set_reset_fn(entry_points["reset"][1])
    hooks.set_memory_fraction_fn(entry_points["memory_fraction"][1])
    hooks.set_record_stream_fn(entry_points["record_stream"][1])
    hooks.set_base_alloc_fn(entry_points["base_allocation"][1])
    return allocator


def install_pluggable_allocator() -> None:
    """Makes torchmem PyTorch's CUDA allocator for this process (once, before CUDA init)."""
    if torch.cuda.is_initialized():
        raise RuntimeError(
            "torchmem.install('cuda'): CUDA is already initialized in this process, and PyTorch "
            f"can swap its CUDA allocator only before that. Fix: {_INSTALL_FIRST}."
        )
    allocator = pluggable_allocator()
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
