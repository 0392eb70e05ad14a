"""A leak check never changes what the checked code observes of the garbage collector:
``gc.get_objects()``, ``gc.get_referrers(obj)`` and ``del x; gc.collect()`` freeing a cycle
made before the check behave inside a check exactly as outside.

A check used to ``gc.freeze()`` the heap while open (to keep its exit's collection cheap):
inside, ``gc.get_objects()`` listed a handful of objects, ``gc.get_referrers()`` found no
referrer older than the check, and a cycle made before the check was never collected. Under
``pytest --torchmem`` that is every test; under ``python -m torchmem run``, the whole script.
"""

from __future__ import annotations

import gc
import weakref

import torch

import torchmem
from leak_helpers import torchmem_cpu  # noqa: F401


class Node:
    def __init__(self):
        self.me = self  # a reference cycle: only the collector frees it


HOLDER = {"made before the check": None}


def observe(target) -> dict:
    """The three operations, as the checked code would run them."""
    seen = {
        "objects": len(gc.get_objects()),
        "target listed": any(obj is target for obj in gc.get_objects()),
        "referrers": sorted(type(referrer).__name__ for referrer in gc.get_referrers(target)),
        "freeze count": gc.get_freeze_count(),
    }
    cycle = Node()
    gone = weakref.ref(cycle)
    del cycle
    gc.collect()
    seen["cycle freed by gc.collect()"] = gone() is None
    return seen


def make_old_cycle():
    node = Node()
    return node, weakref.ref(node)


def test_the_collector_behaves_inside_a_check_as_outside():
    target = [torch.zeros(4)]
    HOLDER["made before the check"] = target
    outside = observe(target)
    old, old_ref = make_old_cycle()  # made before the check

    with torchmem.leak_check(raise_on_leak=False) as report:
        inside = observe(target)
        del old
        gc.collect()
        old_freed_inside = old_ref() is None

    assert inside["target listed"] and outside["target listed"]
    assert inside["referrers"] == outside["referrers"] and "dict" in inside["referrers"]  # HOLDER
    assert inside["freeze count"] == outside["freeze count"] == 0
    assert inside["cycle freed by gc.collect()"] and outside["cycle freed by gc.collect()"]
    assert old_freed_inside  # `del x; gc.collect(); assert ref() is None`
    # The whole heap stays visible (the counts differ by what collections freed meanwhile).
    assert inside["objects"] > 0.9 * outside["objects"], (inside["objects"], outside["objects"])
    assert report.finished and not report.leaked
    HOLDER["made before the check"] = None


def test_the_young_garbage_a_check_finds_without_collecting_is_what_the_collector_finds():
    from torchmem.leaks import collector

    gc.collect()
    gc.disable()
    try:
        kept = [Node() for _ in range(3)]  # reachable: not garbage
        for _ in range(5):
            Node()  # a cycle dropped: garbage
        found = collector.young_garbage()
        found_ids = {id(obj) for obj in found}
        del found
        flags, saved_before = gc.get_debug(), len(gc.garbage)
        gc.set_debug(flags | gc.DEBUG_SAVEALL)
        try:
            gc.collect(1)
        finally:
            gc.set_debug(flags)
        saved_ids = {id(obj) for obj in gc.garbage[saved_before:]}
        del gc.garbage[saved_before:]
    finally:
        gc.enable()

    assert found_ids == saved_ids
    assert len(found_ids) >= 5 and not found_ids & {id(node) for node in kept}
