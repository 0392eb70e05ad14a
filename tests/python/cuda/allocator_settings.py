"""Expandable segments switched on and off at run time inside the CUDA test session.

PyTorch re-parses its allocator settings on ``_accelerator_setAllocatorSettings`` (torch
2.10+; ``torch.cuda.memory._set_allocator_settings`` before), and torchmem follows from torch
2.11. A test module uses ``expandable`` as a fixture by importing it.
"""

import gc

import pytest
import torch

# PyTorch's call that re-parses the allocator settings (its older name before torch 2.10).
set_allocator_settings = getattr(torch._C, "_accelerator_setAllocatorSettings",
                                 torch.cuda.memory._set_allocator_settings)


def empty_cache() -> None:
    """Unmaps every cached page, after collecting tensors that only a reference cycle holds.

    A test that keeps a ``pytest.raises`` result keeps a cycle (exception, traceback, the test's
    frame) that holds the frame's tensors until the garbage collector runs, whenever Python's
    thresholds trip (under torch 2.15 / Python 3.13 not before the next test): without the
    collection the next test would start with them mapped, or cached over its memory limit.
    """
    gc.collect()
    torch.cuda.empty_cache()


@pytest.fixture
def expandable():
    """Expandable segments on for the test, from an empty cache; off, with an empty cache, after it."""
    empty_cache()
    set_allocator_settings("expandable_segments:True")
    try:
        yield
    finally:
        torch.cuda.synchronize()
        set_allocator_settings("expandable_segments:False")
        empty_cache()
