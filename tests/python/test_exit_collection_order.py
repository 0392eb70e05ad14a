"""A check's exit skips its collection of the whole heap for blocks a live root holds, and
gives the same verdicts as when it collected first (``torchmem.leaks.classify``).

The whole heap's collection costs about 60 ms in a process the size of a pytest session;
a block the owner search finds held by a module global, a live frame's local or a test's
argument cannot be garbage's, so the exit collects only for the others.
"""

from __future__ import annotations

import gc
import sys
import types

import torch

import torchmem
from leak_helpers import torchmem_cpu  # noqa: F401

KEPT: list = []


class Cycle:
    def __init__(self):
        self.me = self
        self.state = torch.zeros(256)


def whole_heap_collections(body) -> tuple[int, object]:
    """Runs ``body`` in a check; returns the collections of the oldest generation its exit
    made and its report."""
    generations: list[int] = []

    def note(phase, info):
        if phase == "start":
            generations.append(info["generation"])

    check = torchmem.leak_check(raise_on_leak=False)
    with check as report:
        body()
        gc.callbacks.append(note)  # the exit's collections only
    gc.callbacks.remove(note)
    return generations.count(2), report


def test_a_block_a_module_global_holds_is_named_without_collecting_the_whole_heap(torchmem_cpu):
    KEPT.clear()
    try:
        collections, report = whole_heap_collections(lambda: KEPT.append(torch.zeros(256)))
    finally:
        KEPT.clear()
    assert collections == 0
    assert [finding.kind for finding in report.findings] == ["reachable"]
    assert report.findings[0].owners[0].path == f"{__name__}.KEPT[0]"
    assert report.findings[0].owners[0].kind == "global"


def test_a_cycle_in_the_oldest_generation_is_found_without_the_whole_heap_collection(torchmem_cpu):
    # The garbage above the block's tensor decides it (test_exit_subset_collection.py).
    def body():
        cycle = Cycle()
        gc.collect()  # moves it to the oldest generation
        del cycle

    collections, report = whole_heap_collections(body)
    assert collections == 0
    assert report.subset_collection is not None
    assert [finding.kind for finding in report.findings] == ["cycle"]
    assert "Cycle" in report.findings[0].owners[0].path


def test_a_young_tensor_that_old_garbage_holds_is_still_found_in_a_cycle(torchmem_cpu):
    # A module object no longer in sys.modules, kept only by a cycle already in the oldest
    # generation, given a tensor just before the exit: the tensor is young, its holders are
    # old garbage. The search finds no live root for it; the garbage above the tensor says
    # cycle, without the whole heap's collection.
    def body():
        module = types.ModuleType("torchmem_test_gone_module")
        holder = [module]
        holder.append(holder)
        gc.collect()  # the module and the list: in the oldest generation
        module.state = torch.zeros(256)
        del module, holder

    gc.disable()  # no automatic collection before the exit
    try:
        collections, report = whole_heap_collections(body)
    finally:
        gc.enable()
    assert "torchmem_test_gone_module" not in sys.modules
    assert collections == 0
    assert report.subset_collection is not None
    assert [finding.kind for finding in report.findings] == ["cycle"]
