"""Routing PyTorch's allocations through torchmem.

``install("cpu")`` swaps c10's CPU allocator (reversible); ``install("cuda")``
makes torchmem's complete ``CUDAAllocator`` (``torchmem.cuda_allocator()``)
PyTorch's CUDA allocator through ``change_current_allocator`` (once per
process, before CUDA is initialized, as PyTorch requires). Installing also turns on the garbage-collecting retry: an
allocation about to fail runs ``gc.collect()`` once and retries.
"""

from __future__ import annotations

from typing import Union

import torch

from torchmem._support.locks import ForkSafeLock
from torchmem import _C

# How a user names a device (``torchmem.runtime.devices`` re-exports it; defined here so that
# ``devices``, which asks this module what is installed, and this module do not import each other).
DeviceLike = Union[str, torch.device, int, None]

_lock = ForkSafeLock()
_cuda_installed = False


def _device_type(device: DeviceLike) -> str:
    if device is None:
        return "cuda"
    if isinstance(device, torch.device):
        return device.type
    if isinstance(device, str):
        kind = device.split(":", 1)[0]
        if kind in ("cpu", "cuda"):
            return kind
        raise ValueError(f"torchmem.install: unknown device {device!r}; use 'cuda' (default) or 'cpu'")
    raise TypeError(f"torchmem.install: expected 'cuda' or 'cpu', got {type(device).__name__}")


def install(device: DeviceLike = "cuda") -> None:
    """Routes ``device``'s allocations through torchmem. Installing twice is a no-op.

    ``"cuda"`` must come before anything initializes CUDA (a CUDA tensor, most
    ``torch.cuda`` calls, some libraries at import time): PyTorch can swap its CUDA
    allocator only before first use. ``python -m torchmem run script.py`` does it for you.
    """
    kind = _device_type(device)
    with _lock:
        if kind == "cpu":
            _C.install_cpu()
        else:
            _install_cuda()
        _C.set_gc_retry(True)
    _import_api_modules()
    from torchmem.reports import oom_report

    # TORCHMEM_OOM_REPORT, and PyTorch's out-of-memory observer on a CUDA allocator
    # installed after torchmem.oom_report() was called.
    oom_report.after_install()


def _import_api_modules() -> None:
    """Imports the API's modules now rather than on first use.

    ``import torchmem`` loads them lazily, but a process that forks (a DataLoader
    worker) while another thread is in the middle of such an import gives the child a
    module lock no thread of the child will release. Once torchmem serves allocations,
    its modules are imported up front.
    """
    import torchmem

    for name in ("tag", "leak_check", "GrowthMonitor", "memory_stats", "summary", "snapshot"):
        getattr(torchmem, name)


def uninstall(device: DeviceLike = "cpu") -> None:
    """Restores PyTorch's own allocator for new CPU tensors.

    Tensors allocated by torchmem stay valid and are freed by it. CUDA cannot be
    uninstalled: PyTorch allows one allocator swap per process.
    """
    kind = _device_type(device)
    with _lock:
        if kind == "cpu":
            _C.uninstall_cpu()
        else:
            raise RuntimeError(
                "torchmem: the CUDA allocator cannot be uninstalled; PyTorch allows swapping it "
                "only once per process, before CUDA is initialized"
            )
        if not installed_devices():
            _C.set_gc_retry(False)


def is_installed(device: DeviceLike = "cuda") -> bool:
    kind = _device_type(device)
    return _C.cpu_installed() if kind == "cpu" else _cuda_in_use()


def installed_devices() -> list[str]:
    """Device types currently routed through torchmem."""
    devices = []
    if _C.cpu_installed():
        devices.append("cpu")
    if _cuda_in_use():
        devices.append("cuda")
    return devices


def _cuda_in_use() -> bool:
    """torchmem serves CUDA: installed here, or by change_current_allocator(cuda_allocator())."""
    if _cuda_installed:
        return True
    from torchmem.runtime import cuda as _cuda

    return _cuda.installed()


def _install_cuda() -> None:
    global _cuda_installed
    if _cuda_in_use():
        _cuda_installed = True
        return
    if torch.version.cuda is None:
        raise RuntimeError(
            f"torchmem.install('cuda') needs a CUDA build of PyTorch; this one ({torch.__version__}) is CPU-only"
        )
    from torchmem.runtime import cuda as _cuda

    if not _cuda.supported():
        raise RuntimeError("torchmem was built without CUDA support; install('cpu') works without it")

    _cuda.install_allocator()
    _cuda_installed = True
