"""Which torchmem engines exist, and how a user names them.

A device is named like PyTorch names it: ``"cpu"``, ``"cuda"`` (the current
CUDA device), ``"cuda:1"``, or a ``torch.device``. Each installed device has one
engine in ``torchmem._C`` that lives for the whole process.
"""

from __future__ import annotations

import torch

from torchmem import _C
from torchmem.runtime import install as _install
from torchmem.runtime.install import DeviceLike

__all__ = ["DeviceLike", "normalize", "engine", "active_engines", "default_devices"]

# Devices whose engines have been used in this process (CPU is always there).
_cuda_devices_seen: set[int] = set()


def normalize(device: DeviceLike) -> torch.device:
    """Returns a ``torch.device`` with an explicit index for CUDA devices."""
    if device is None:
        raise ValueError("a device is required here ('cpu' or 'cuda[:N]')")
    if isinstance(device, int):
        device = torch.device("cuda", device)
    elif isinstance(device, str):
        try:
            device = torch.device(device)
        except RuntimeError as error:
            raise ValueError(f"torchmem: {device!r} is not a device name (try 'cpu' or 'cuda:0')") from error
    elif not isinstance(device, torch.device):
        raise TypeError(f"torchmem: expected a device name or torch.device, got {type(device).__name__}")
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device() if torch.cuda.is_initialized() else 0)
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"torchmem: device type {device.type!r} is not supported (only cpu and cuda)")
    return device


def engine(device: DeviceLike):
    """The ``_C.Engine`` behind ``device``."""
    device = normalize(device)
    if device.type == "cpu":
        return _C.cpu_engine()
    from torchmem.runtime import cuda as _cuda

    if not _cuda.supported():
        raise RuntimeError("torchmem was built without CUDA support (or torch is CPU-only)")
    _cuda_devices_seen.add(device.index)
    return _C.cuda_engine(device.index)


def active_engines() -> list[tuple[str, object]]:
    """``(device name, engine)`` for every device torchmem serves or served."""
    engines = [("cpu", _C.cpu_engine())]
    if hasattr(_C, "cuda_engines"):
        engines.extend((f"cuda:{index}", eng) for index, eng in _C.cuda_engines())
    return engines


def default_devices() -> list[str]:
    """Devices a report covers when the caller names none: every installed one."""
    installed = _install.installed_devices()
    return installed or ["cpu"]
