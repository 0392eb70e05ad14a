"""Shared pieces of the leak-check, owner, growth and scenario tests."""

from __future__ import annotations

import contextlib
import gc
import inspect

import pytest
import torch

import torchmem
from torchmem import _C


@pytest.fixture(autouse=True)
def torchmem_cpu():
    """Every test here runs with CPU tensors allocated by torchmem (installing is idempotent;
    reinstalling guards against another test having uninstalled it)."""
    torchmem.install("cpu")
    yield


@contextlib.contextmanager
def collector_paused():
    """Keeps Python's cyclic garbage collector from running on its own, so garbage stays
    until a leak check collects it (as it does for long stretches of a real process, once
    objects reach the oldest generation)."""
    was_enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def block_of(tensor: torch.Tensor) -> dict:
    """The torchmem block under ``tensor``."""
    return _C.cpu_engine().block(tensor.untyped_storage().data_ptr())


def block_triple(tensor: torch.Tensor) -> tuple[str, int, int]:
    """``(device, address, size)`` of the block under ``tensor``, as _owners takes blocks."""
    block = block_of(tensor)
    return ("cpu", block["address"], block["size"])


def line_of(function, marker: str) -> int:
    """The line number of the line of ``function``'s source that contains ``marker``."""
    lines, first = inspect.getsourcelines(function)
    matches = [first + offset for offset, text in enumerate(lines) if marker in text]
    assert len(matches) == 1, f"{marker!r} must appear exactly once in {function.__name__}"
    return matches[0]


def site_of(finding):
    """``(file name, line)`` of a finding's allocation site."""
    site = finding.allocation_site
    assert site is not None, "the finding has no allocation stack"
    return site.filename, site.line


def owner_paths(finding) -> list[str]:
    return [owner.path for owner in finding.owners]
