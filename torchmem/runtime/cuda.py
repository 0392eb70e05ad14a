"""torchmem as PyTorch's CUDA allocator.

The CUDA half of torchmem lives in its own extension module, ``torchmem._C_cuda``,
built only for a CUDA build of torch and imported here on first use, so that
``import torchmem`` works with a CPU-only torch. Both modules share one engine per
device through ``torchmem/lib/libtorchmem.so``.

Two ways in:

* the complete allocator: ``cuda_allocator()`` is a PyTorch ``CUDAAllocator`` subclass
  that answers everything PyTorch asks its allocator (statistics, snapshots, history,
  CUDA graph pools, cuDNN's cacheInfo, IPC, ...). ``torchmem.install()`` and
  ``torch.cuda.memory.change_current_allocator(torchmem.cuda_allocator())`` install it;
* the reduced route, ``CUDAPluggableAllocator`` over the C entry points that
  ``torchmem._C_cuda`` exports (``pluggable_allocator()``): malloc/free and a few hooks
  only, so PyTorch's memory APIs, snapshots, CUDA graph pools and IPC raise or misbehave
  under it. It exists for code that builds its own ``CUDAPluggableAllocator``.
"""

from __future__ import annotations

import importlib
import os
import re
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


def cuda_allocator() -> torch.cuda.memory._CUDAAllocator:
    """torchmem's complete CUDA allocator, in the form ``change_current_allocator`` takes.

    Every call returns the same allocator (PyTorch allows one swap per process, before
    CUDA is initialized). Creating it also turns on the garbage-collecting retry on
    out-of-memory, as ``torchmem.install()`` does.
    """
    module = load()
    _refuse_other_backend()
    from torchmem import _C

    _C.set_gc_retry(True)
    return torch.cuda.memory._CUDAAllocator(module.allocator())


def _refuse_other_backend() -> None:
    """``backend:cudaMallocAsync`` and torchmem both want to be the CUDA allocator.

    PyTorch checks at CUDA initialization that the backend its settings name is the one
    installed, and would stop with an internal assertion; say why and what to do instead.
    """
    # PyTorch reads PYTORCH_CUDA_ALLOC_CONF, else PYTORCH_ALLOC_CONF.
    name = "PYTORCH_CUDA_ALLOC_CONF"
    if name not in os.environ:
        name = "PYTORCH_ALLOC_CONF"
    for option in re.split(r"[\s,]+", os.environ.get(name, "")):
        key, _, value = option.partition(":")
        if key == "backend" and value and value != "native":
            raise RuntimeError(
                f"torchmem: {name} has backend:{value}, which asks for PyTorch's {value} CUDA "
                "allocator; torchmem replaces PyTorch's CUDA allocator, so both cannot be used. "
                f"Remove backend:{value} from {name} to use torchmem, or do not install torchmem "
                "for CUDA (torchmem.install('cpu') still works)."
            )


def installed() -> bool:
    """Whether PyTorch's current CUDA allocator is torchmem's (either route)."""
    if _allocator is not None:
        return True
    return torch.version.cuda is not None and _module is not None and _module.installed()


def install_allocator() -> None:
    """Makes torchmem's complete allocator PyTorch's CUDA allocator (once, before CUDA init)."""
    _check_not_initialized()
    _swap_in(cuda_allocator())


def _swap_in(allocator) -> None:
    """Hands ``allocator`` to PyTorch; says what to do if PyTorch already has another."""
    try:
        torch.cuda.memory.change_current_allocator(allocator)
    except RuntimeError as error:
        raise RuntimeError(
            f"torchmem.install('cuda'): PyTorch refused to swap its CUDA allocator ({error}). "
            "Another allocator was installed or used first in this process. "
            f"Fix: {_INSTALL_FIRST}."
        ) from error


def _check_not_initialized() -> None:
    if torch.cuda.is_initialized():
        raise RuntimeError(
            "torchmem.install('cuda'): CUDA is already initialized in this process, and PyTorch "
            f"can swap its CUDA allocator only before that. Fix: {_INSTALL_FIRST}."
        )


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
    """The reduced route: torchmem through ``CUDAPluggableAllocator`` (once, before CUDA init)."""
    _check_not_initialized()
    allocator = pluggable_allocator()
    _swap_in(allocator)
    # Keep the Python object alive: PyTorch holds the C++ allocator, but the
    # ctypes handle of our library should live as long as the process.
    global _allocator
    _allocator = allocator


_allocator = None
