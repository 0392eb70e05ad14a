"""Memory that PyTorch itself keeps between calls, which a leak check must not blame on
the code it checks.

A check reports every block allocated inside it and still alive at its end. Some torch
releases keep, from C++, a block that the user's call merely caused: it stays alive until
the next such call replaces it, whatever the user does. Each such cache is listed here
with the torch releases that have it and how its block is recognised (the Python function
that was running when it was allocated, and its requested size); a block that matches is
reported as ``allowed`` with a note that says what torch keeps and why, never hidden.

Recognising a block needs its allocation stack (``capture_stacks=True``, the default):
without one it is reported like any other block held from C++.

Invariant: an entry names the releases it applies to, checked against torch's own source
for each; a torch outside them gets no allowance.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Sequence

import torch

from torchmem.stacks.frames import Frame


@dataclass(frozen=True)
class TorchCache:
    """A block torch keeps: allocated while ``function`` of ``module_file`` (a path under
    the torch package) ran, of ``requested_size`` bytes, on torch ``first`` <= version <
    ``fixed``."""

    module_file: str
    function: str
    requested_size: int
    first: tuple[int, int]
    fixed: tuple[int, int]
    note: str

    def applies_to(self, version: tuple[int, int]) -> bool:
        return self.first <= version < self.fixed

    def matches(self, innermost: Frame, requested_size: int) -> bool:
        suffix = os.sep + os.path.join("torch", *self.module_file.split("/"))
        return (innermost.name == self.function and innermost.filename.endswith(suffix)
                and requested_size == self.requested_size)


# ProcessGroup::barrier (torch/csrc/distributed/c10d/ProcessGroup.hpp) allocates the
# 1-byte tensor it synchronizes on into a function-local `static at::Tensor`, which keeps
# the last barrier's tensor until the next barrier (pytorch/pytorch#178896 made it a
# local). Every dist.barrier() on any backend goes through it.
_BARRIER = TorchCache(
    module_file="distributed/distributed_c10d.py",
    function="barrier",
    requested_size=1,
    first=(2, 9),
    fixed=(2, 12),
    note=(
        "kept by torch {version} itself: ProcessGroup::barrier holds the last barrier's 1-byte tensor in a C++ "
        "static until the next barrier (torch 2.12 frees it)"
    ),
)

KNOWN_CACHES: tuple[TorchCache, ...] = (_BARRIER,)


def _release(version: str) -> tuple[int, int]:
    major, minor = version.split("+")[0].split(".")[:2]
    return int(major), int(minor)


_RUNNING = _release(torch.__version__)


def reason(frames: Sequence[Frame], requested_size: int, *, version: tuple[int, int] = _RUNNING) -> str | None:
    """The note for a block torch ``version`` keeps itself, given its allocation stack
    (innermost frame first, unfolded) and requested size; None for any other block."""
    if not frames:
        return None
    for cache in KNOWN_CACHES:
        if cache.applies_to(version) and cache.matches(frames[0], requested_size):
            return cache.note.format(version=torch.__version__.split("+")[0])
    return None
