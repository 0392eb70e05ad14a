"""A check's exit decides blocks held by garbage already in the collector's oldest generation
without collecting the whole heap (``collector.garbage_above``), with the verdicts that
collection gives; a block something outside the objects above it holds falls back to it.
"""

from __future__ import annotations

import ctypes
import functools
import gc
import weakref

import pytest
import torch

import torchmem
from torchmem.leaks import collector
from leak_helpers import torchmem_cpu  # noqa: F401


class MetricLike:
    """Refers to itself as a torchmetrics Metric does (functools.wraps of a bound method)."""

    def __init__(self):
        self.total = torch.zeros(1024)
        update = self.update

        @functools.wraps(update)
        def wrapped(*args):
            return update(*args)

        self.update = wrapped

    def update(self, value):
        self.total = self.total + value


class Holder:
    def __init__(self):
        self.me = self
        self.state = torch.zeros(512)


def promote_to_the_oldest_generation() -> None:
    # Each young collection moves what survives generation 1 into the oldest generation.
    gc.collect(1)
    gc.collect(1)


def run(body, *, subset: bool):
    """``body`` in a check; returns the collections of the whole heap its exit made and the
    report. ``subset=False``: the exit as before, always collecting the whole heap."""
    generations: list[int] = []

    def note(phase, info):
        if phase == "start":
            generations.append(info["generation"])

    passes = collector.SUBSET_PASSES
    collector.SUBSET_PASSES = passes if subset else 0  # no pass: nothing above the tensors
    try:
        with torchmem.leak_check(raise_on_leak=False, cycles="repeating", cycle_repeats=3) as report:
            body()
            gc.callbacks.append(note)  # the exit's collections only
        gc.callbacks.remove(note)
    finally:
        collector.SUBSET_PASSES = passes
    return generations.count(2), report


def verdicts(report) -> list:
    return [(f.kind, f.size, f.counted, f.note, f.cycle, f.cycle_types, tuple(o.path for o in f.owners))
            for f in report.findings]


def one_old_metric():
    metric = MetricLike()
    metric.update(torch.ones(1024))
    promote_to_the_oldest_generation()
    del metric


def old_metrics_dropped_one_by_one():
    for _ in range(3):
        metric = MetricLike()
        metric.update(torch.ones(1024))
        promote_to_the_oldest_generation()
        del metric


def old_metrics_dropped_together():
    wrapper = [MetricLike() for _ in range(3)]
    wrapper.append(wrapper)
    promote_to_the_oldest_generation()
    del wrapper


@pytest.mark.parametrize("body", [one_old_metric, old_metrics_dropped_one_by_one, old_metrics_dropped_together])
def test_a_cycle_in_the_oldest_generation_is_decided_without_the_whole_heap(torchmem_cpu, body):
    collections, report = run(body, subset=True)
    assert collections == 0
    assert report.subset_collection is not None
    assert {finding.kind for finding in report.findings} == {"cycle"}
    whole_collections, whole = run(body, subset=False)
    assert whole_collections == 1 and whole.subset_collection is None
    assert verdicts(report) == verdicts(whole)


def test_one_old_cycle_is_not_counted_and_three_dropped_separately_are(torchmem_cpu):
    _, one = run(one_old_metric, subset=True)
    _, three = run(old_metrics_dropped_one_by_one, subset=True)
    _, together = run(old_metrics_dropped_together, subset=True)
    assert not any(finding.counted for finding in one.findings)
    assert any(finding.counted for finding in three.findings)
    assert not any(finding.counted for finding in together.findings)


def test_a_holder_kept_from_outside_the_objects_above_falls_back_to_the_whole_heap(torchmem_cpu):
    # The holder is on a cycle, as garbage would be, but one reference to it comes from a
    # place no object's tp_traverse shows (C code's own reference): it is alive.
    kept = ctypes.py_object()

    def body():
        holder = Holder()
        kept.value = holder
        ctypes.pythonapi.Py_IncRef(kept)
        kept.value = None
        promote_to_the_oldest_generation()
        del holder

    collections, report = run(body, subset=True)
    leaked = [obj for obj in gc.get_objects() if type(obj) is Holder]
    try:
        assert collections == 1  # the subset could not decide it: the whole heap's collection did
        assert report.subset_collection is None
        assert [finding.kind for finding in report.findings] == ["reachable"]
    finally:
        for holder in leaked:
            holder.me = None
            ctypes.pythonapi.Py_DecRef(ctypes.py_object(holder))
        del leaked


class Finalized(Holder):
    def __del__(self):  # a collection runs it: it may release blocks or resurrect objects
        pass


def test_garbage_with_a_finalizer_is_left_to_the_whole_heap_collection(torchmem_cpu):
    def body():
        holder = Finalized()
        promote_to_the_oldest_generation()
        del holder

    collections, report = run(body, subset=True)
    assert collections == 1
    assert report.subset_collection is None
    assert [finding.kind for finding in report.findings] == ["cycle"]


def test_garbage_with_a_weak_reference_callback_is_left_to_the_whole_heap_collection(torchmem_cpu):
    called = []

    def body():
        holder = Holder()
        holder.ref = weakref.ref(holder, called.append)  # the cycle keeps its own weak reference
        promote_to_the_oldest_generation()
        del holder

    collections, report = run(body, subset=True)
    assert collections == 1
    assert report.subset_collection is None
    assert [finding.kind for finding in report.findings] == ["cycle"]
