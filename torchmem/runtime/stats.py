"""Statistics in PyTorch's vocabulary, per device, plus per-tag figures."""

from __future__ import annotations

import torch

from torchmem.runtime import devices as _devices
from torchmem.runtime.devices import DeviceLike

# Keys of torch.cuda.memory_stats() that arrived after the oldest torch torchmem supports
# (prefix -> the release that added it). The engine counts them always; memory_stats()
# leaves out those the running torch does not have, so its dict stays equal to
# torch.cuda.memory_stats()'s, key for key, whatever the release.
_KEYS_SINCE: dict[str, tuple[int, int]] = {
    "num_oom_rejections": (2, 12),
    "reserved_bytes_by_private_pools.": (2, 13),
}
_TORCH = torch.torch_version.__version__
_KEYS_MISSING = tuple(prefix for prefix, since in _KEYS_SINCE.items() if _TORCH < since)


def memory_stats(device: DeviceLike = None) -> dict[str, int]:
    """torchmem's counterpart of ``torch.cuda.memory_stats()``: the same flat keys and meanings.

    ``device`` defaults to CUDA if torchmem serves it, else CPU.
    """
    stats = _devices.engine(_pick(device)).memory_stats()
    if _KEYS_MISSING:
        stats = {key: value for key, value in stats.items() if not key.startswith(_KEYS_MISSING)}
    return stats


def memory_allocated(device: DeviceLike = None) -> int:
    return memory_stats(device)["allocated_bytes.all.current"]


def max_memory_allocated(device: DeviceLike = None) -> int:
    return memory_stats(device)["allocated_bytes.all.peak"]


def memory_reserved(device: DeviceLike = None) -> int:
    return memory_stats(device)["reserved_bytes.all.current"]


def max_memory_reserved(device: DeviceLike = None) -> int:
    return memory_stats(device)["reserved_bytes.all.peak"]


def reset_peak_memory_stats(device: DeviceLike = None) -> None:
    eng = _devices.engine(_pick(device))
    eng.reset_peak_stats()
    eng.reset_tag_peaks()


def reset_accumulated_memory_stats(device: DeviceLike = None) -> None:
    _devices.engine(_pick(device)).reset_accumulated_stats()


def tag_stats(device: DeviceLike = None) -> dict[str, dict[str, int]]:
    """Per tag: current/peak bytes, requested bytes, live blocks, allocations since reset.

    Memory allocated outside every tag appears under ``"untagged"``.
    """
    return {row.pop("tag"): row for row in _devices.engine(_pick(device)).tag_stats()}


def fragmentation(device: DeviceLike = None) -> dict:
    """Free space in torchmem's cache: free bytes, largest free block, external
    fragmentation (1 - largest free / free), internal waste (rounding), a histogram
    of free-block sizes; the same per pool (``small_pool``/``large_pool``) and per stream.
    """
    return _devices.engine(_pick(device)).fragmentation()


def empty_cache(device: DeviceLike = None) -> None:
    """Returns every fully free cached segment to the device (or the OS, for CPU)."""
    _devices.engine(_pick(device)).empty_cache()


def set_memory_limit(limit: int | float, device: DeviceLike = None) -> None:
    """Caps reserved memory: bytes (int), or a fraction in (0, 1] of the device's capacity (float).

    Allocations beyond it raise ``torch.OutOfMemoryError`` with torchmem's explanation.
    0 removes the limit.
    """
    eng = _devices.engine(_pick(device))
    if isinstance(limit, bool) or not isinstance(limit, (int, float)):
        raise TypeError(f"torchmem.set_memory_limit: expected bytes (int) or a fraction (float), got {limit!r}")
    if isinstance(limit, float):
        eng.set_memory_fraction(limit)
    else:
        if limit < 0:
            raise ValueError(f"torchmem.set_memory_limit: the limit must be >= 0 bytes, got {limit}")
        eng.set_memory_limit(limit)


def _pick(device: DeviceLike) -> DeviceLike:
    if device is not None:
        return device
    from torchmem.runtime import install as _install

    return "cuda" if _install.is_installed("cuda") else "cpu"
