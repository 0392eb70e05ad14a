"""Which devices a report (summary, snapshot) covers, and how the caller names them.

Shared by :mod:`torchmem.reports.summary` and :mod:`torchmem.reports.snapshot` so that both accept
the same spellings and fail the same way on bad input.
"""

from __future__ import annotations

from typing import Iterable, NamedTuple, Union

import torch

from torchmem.runtime import devices as _devices
from torchmem.runtime import install as _install
from torchmem import _C
from torchmem.runtime.devices import DeviceLike

DevicesArg = Union[DeviceLike, Iterable[DeviceLike]]


class ReportDevice(NamedTuple):
    """One device in a report: its name (``"cpu"``, ``"cuda:0"``), ``torch.device`` and engine."""

    name: str
    device: torch.device
    engine: object


def ensure_cuda_engines() -> None:
    """Creates the engine of every CUDA device now, so settings made before a device's first
    allocation (``record_trace``) reach it. Creating an engine does not touch CUDA, and
    ``torch.cuda.device_count()`` does not initialize it either."""
    if _install.is_installed("cuda") and hasattr(_C, "cuda_engine"):
        for index in range(torch.cuda.device_count()):
            _devices.engine(torch.device("cuda", index))


def cuda_engines() -> list[tuple[int, object]]:
    """``(index, engine)`` for every CUDA engine that exists, by index (none without CUDA support)."""
    if not hasattr(_C, "cuda_engines"):
        return []
    return sorted(_C.cuda_engines(), key=lambda pair: pair[0])


def _ever_used(engine) -> bool:
    stats = engine.memory_stats()
    return bool(stats["allocation.all.allocated"] or stats["num_device_alloc"])


def select(devices: DevicesArg, *, what: str, skip_unused_cuda: bool = False) -> list[ReportDevice]:
    """The devices ``devices`` names, in a stable order (CPU first, then CUDA by index).

    ``None`` means every device torchmem serves: the CPU if installed (or if nothing is
    installed, so a report is never empty for no reason), and every CUDA device that has an
    engine once CUDA is installed (with ``skip_unused_cuda``, only those that allocated
    something: a report need not list eight idle GPUs). Otherwise a device name (``"cpu"``,
    ``"cuda"``, ``"cuda:1"``), a ``torch.device``, a CUDA index, or a list of those.
    ``what`` names the caller in error messages (``"torchmem.summary"``).
    """
    if devices is None:
        chosen: list[ReportDevice] = []
        installed = _devices.default_devices()
        if "cpu" in installed:
            chosen.append(ReportDevice("cpu", torch.device("cpu"), _C.cpu_engine()))
        if "cuda" in installed:
            chosen.extend(
                ReportDevice(f"cuda:{index}", torch.device("cuda", index), engine)
                for index, engine in cuda_engines()
                if not skip_unused_cuda or _ever_used(engine)
            )
        return chosen

    if isinstance(devices, (str, int, torch.device)):
        requested = [devices]
    elif isinstance(devices, (list, tuple, set, frozenset)):
        requested = list(devices)
        if not requested:
            raise ValueError(f"{what}: devices is empty; name at least one device, or pass None for all")
    else:
        raise TypeError(
            f"{what}: devices must be None, a device ('cpu', 'cuda:0', a torch.device, an index) "
            f"or a list of devices, got {type(devices).__name__}"
        )

    chosen = []
    seen: set[str] = set()
    for entry in requested:
        # bool is an int: True would silently mean cuda:1.
        if isinstance(entry, bool) or not isinstance(entry, (str, int, torch.device)):
            raise TypeError(
                f"{what}: {entry!r} is not a device; use 'cpu', 'cuda', 'cuda:N', a torch.device or an index"
            )
        try:
            device = _devices.normalize(entry)
        except ValueError as error:
            raise ValueError(f"{what}: {error}") from None
        if device.type == "cuda" and not _install.is_installed("cuda"):
            # The engine would exist but serve nothing: a report of zeros would mislead.
            raise ValueError(
                f"{what}: torchmem does not serve {device} in this process; call "
                "torchmem.install('cuda') before CUDA is first used (or run under "
                "`python -m torchmem run`)"
            )
        name = "cpu" if device.type == "cpu" else f"cuda:{device.index}"
        if name in seen:
            continue
        seen.add(name)
        chosen.append(ReportDevice(name, device, _devices.engine(device)))
    # CPU first, then CUDA by index, whatever order the caller used.
    chosen.sort(key=lambda d: (d.device.type != "cpu", d.device.index or 0))
    return chosen
