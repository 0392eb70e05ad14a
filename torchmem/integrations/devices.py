"""Which devices ``run`` and the demo serve: the CPU always, CUDA when a device is there."""

from __future__ import annotations

DEVICE_CHOICES = ("auto", "cpu", "cuda")


class NoCudaError(ValueError):
    """``--device cuda`` where torchmem cannot serve a CUDA device."""

    def __init__(self):
        super().__init__("--device cuda: no CUDA device is available to torchmem here (try --device cpu)")


def cuda_available() -> bool:
    """A CUDA device is there and torchmem can serve it, checked without initializing CUDA."""
    import torch

    from torchmem.runtime import cuda as _cuda

    if not _cuda.supported():
        return False
    # Counts devices without initializing PyTorch's CUDA state (so the allocator can still be swapped).
    return torch.cuda.is_available()


def device_types(choice: str) -> list[str]:
    """The device types ``choice`` (auto, cpu, cuda) means here; NoCudaError for cuda without one."""
    if choice not in DEVICE_CHOICES:
        raise ValueError(f"device must be one of {', '.join(DEVICE_CHOICES)}, got {choice!r}")
    cuda = cuda_available()
    if choice == "cuda" and not cuda:
        raise NoCudaError()
    types = []
    if choice in ("auto", "cpu"):
        types.append("cpu")
    if choice == "cuda" or (choice == "auto" and cuda):
        types.append("cuda")
    return types


def install(choice: str) -> list[str]:
    """Installs torchmem for ``choice`` (auto, cpu, cuda); returns the device types served."""
    import torchmem

    served = device_types(choice)
    for device_type in served:
        torchmem.install(device_type)
    return served
