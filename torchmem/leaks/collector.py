"""Garbage collection for leak checks, paid in proportion to what the checked code made.

A leak check that left blocks behind must tell memory held by reference cycles from memory
something still holds. A full collection walks every object the process tracks (about
280,000 in a pytest session of a library like torchmetrics: 60 to 130 ms), which would make a
check cost far more than the code it checks.

A check never changes what the checked code observes, so it does not touch the collector
while the code runs: no ``gc.freeze()`` (which hides every older object from
``gc.get_objects()`` and ``gc.get_referrers()`` and keeps older cycles from being collected,
for the whole script under ``python -m torchmem run``). Its exit instead collects in two
steps:

* the **young** generations first: the garbage the checked code dropped shortly before the
  exit is there, a metric built and dropped by a test among it. ``young_garbage()`` finds
  it without collecting, as the collector would (13 ms for 7,000 young objects, about what
  its young generations hold at most while it runs on its own); the classifier inspects
  it, drops it and frees it with ``gc.collect(1)``. (A saving collection,
  ``gc.DEBUG_SAVEALL``, would move what it saved into the oldest generation, and only a
  collection of the whole heap frees it there.)
* the **garbage above the blocks' tensors** when a block is still allocated after that: its
  holder may be a cycle the collector already moved to its oldest generation (a long test
  or loop: the test's own automatic collections promote it), or something that really
  holds it, which the owner search then names. ``garbage_above`` runs the collector's own
  algorithm (``gc_collect_main``: outside references are the reference count less the
  references from the set; what they reach is alive; the rest is garbage) on a subset of the
  heap: the tensors using the blocks and the objects that refer to them, transitively, found
  by passes over ``gc.get_objects()`` in C (``csrc/torchmem/python/subset_collection.c``).
  That answer is right for any subset (an outside reference only makes an object look
  alive), so the passes stop as soon as every tensor is garbage: usually one. On a heap of
  287,700 objects (``benchmarks/leak_check_exit_cost.py``, alternated with the code before
  it, load average 7-11 on 2 cores) a check that left a cycle in the oldest generation cost
  56-60 ms against 139-143 ms with a collection of the whole heap (0.40-0.42×):
  ``gc.get_objects()`` and one pass are most of it. The garbage it finds is what that collection's saving
  garbage holds above the tensors, in the same order, so the cycle descriptions are the same;
  it is left to the collector's next full pass, as that collection's was.
* the **whole heap** (one saving collection, ``collect_saving_garbage``) only when the
  subset cannot decide every block: a tensor something alive holds (or that the passes'
  bound did not reach above), a block no tensor object uses (held through C++), or garbage
  on which a collection would run code (a ``__del__``, a weak reference's callback), which
  may release blocks or resurrect objects. Before it, the owner search looks for roots that
  are certainly alive, for at most one pass over the heap: a block it finds held by one (a
  module global, a test's argument) cannot be garbage's, and only the others go on
  (``classify``). When the surviving blocks' tensors are still young
  (``young_tensor_blocks``), as a global's list or a test's argument keeps them, that search
  runs before the subset too.

While an exit runs, automatic collections are paused (``pause_automatic_collections``): the
exit's own allocations must not trigger one that frees survivors unseen.
"""

from __future__ import annotations

import gc
import os
import threading

__all__ = ["YOUNG", "WHOLE_HEAP", "is_frozen", "thaw", "young_garbage", "young_tensor_blocks", "collect_saving_garbage",
           "garbage_above", "pause_automatic_collections", "resume_automatic_collections"]

YOUNG = 1  # gc.collect(1): generations 0 and 1
WHOLE_HEAP = 2  # gc.collect(2): every generation


def is_frozen() -> bool:
    """Always False: checks no longer freeze the collector. (The owner search asks, to walk
    the objects made during a check first when they are all it can see.)"""
    return False


def thaw() -> None:
    """Nothing to do: checks no longer freeze the collector (see ``is_frozen``)."""


def forget_after_fork() -> None:
    """In a forked child: no exit of the parent is running here (their threads are gone)."""
    _pause.lock = threading.Lock()
    if _pause.depth and _pause.was_enabled:
        gc.enable()
    _pause.depth = 0


class _Pause:
    def __init__(self):
        self.lock = threading.Lock()
        self.depth = 0  # exits in progress, on any thread
        self.was_enabled = False  # the collector's state when the first of them began


_pause = _Pause()

if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=forget_after_fork)


def pause_automatic_collections() -> None:
    """No automatic collection until ``resume_automatic_collections()``: for a check's exit.

    The exit's own code allocates (the survivors' records, the classifier's lists) before
    its saving collection runs. If those allocations crossed the collector's threshold, an
    automatic collection would free cycle-held survivors unseen: they would look released
    by another thread and vanish from the report, or not, depending on where the
    collector's allocation count happened to stand. So the exit pauses the collector first
    (this function allocates no tracked object before ``gc.disable()``). Nested and
    concurrent exits share one pause: the first records whether the collector was enabled,
    the last restores that.
    """
    # acquire()/release(), not `with`: binding the lock's __enter__/__exit__ allocates.
    _pause.lock.acquire()
    try:
        if _pause.depth == 0:
            _pause.was_enabled = gc.isenabled()
            gc.disable()
        _pause.depth += 1
    finally:
        _pause.lock.release()


def resume_automatic_collections() -> None:
    """Ends a ``pause_automatic_collections()``."""
    with _pause.lock:
        _pause.depth -= 1
        if _pause.depth == 0 and _pause.was_enabled:
            gc.enable()


YOUNG_LIMIT = 50_000  # young objects examined (about 1 ms per 20,000); beyond, a full pass


def young_garbage() -> list | None:
    """The objects of the young generations that a ``gc.collect(1)`` would find unreachable,
    found without collecting (so they stay young, and ``gc.collect(1)`` frees them once the
    caller drops the list). None when the young generations hold more than ``YOUNG_LIMIT``
    objects (the collector disabled for long): a collection of the whole heap is cheaper.

    What the collector does (``torchmem._C.unreachable_among``, in C): an object's
    references from outside the young generations are its reference count minus the
    references young objects hold to it; an object with any is reachable, and so is
    everything young it refers to; the rest is garbage. A miscount can only make garbage
    look reachable, and the caller confirms with the real collection.
    """
    from torchmem import _C  # only on an exit with survivors: the extension is loaded then

    young = gc.get_objects(0)
    young += gc.get_objects(1)
    return None if len(young) > YOUNG_LIMIT else _C.unreachable_among(young)


def young_tensor_blocks(index) -> set:
    """The keys of ``index`` (a ``tensors.BlockIndex``) used by tensors in the young
    generations (about 7,000 objects: well under a millisecond). Asked before the young
    collection, which moves what survives it to the oldest generation."""
    from torchmem.leaks.tensors import locate_tensors  # tensors imports torch: not at import

    young = gc.get_objects(0)
    young += gc.get_objects(1)
    if len(young) > YOUNG_LIMIT:
        return set()
    try:
        return set(locate_tensors(index, young, follow_graphs=False))
    finally:
        del young


def collect_saving_garbage(generation: int = WHOLE_HEAP) -> list:
    """One collection (of ``generation`` and the younger ones) that keeps what it found
    unreachable, for inspection.

    The collection runs with ``gc.DEBUG_SAVEALL``, so the unreachable objects land in
    ``gc.garbage`` instead of being freed; they are taken out of it and returned (the
    program's own uncollectable objects already there stay). The caller inspects them and
    drops the list; the collector's next pass over their generation frees them (they were
    finalized by this one: weak references to them are cleared).
    """
    flags = gc.get_debug()
    kept_before = len(gc.garbage)
    gc.set_debug(flags | gc.DEBUG_SAVEALL)
    try:
        gc.collect(generation)
    finally:
        gc.set_debug(flags)
    garbage = gc.garbage[kept_before:]
    del gc.garbage[kept_before:]
    return garbage


# Bounds of the subset collection (``garbage_above``): passes over the heap (about a sixth of
# a whole collection's cost each) and objects above the tensors. Beyond, the whole heap's.
# Garbage above a block is what one test or step dropped (a metric cycle: tens of objects, a
# wrapper of copies: hundreds); a set that grows past the bound has reached live objects
# (a module, what imports it), where further passes would only add cost to the collection
# that must follow.
SUBSET_PASSES = 3
SUBSET_MEMBERS = 10_000


class SubsetGarbage:
    """What ``garbage_above`` found: ``garbage`` (in the order a whole collection lists it),
    ``decided`` (the block keys all of whose tensors are in it), and counts for the report
    of how it went."""

    def __init__(self, garbage: list, decided: set, complete: bool, passes: int, members: int):
        self.garbage = garbage
        self.decided = decided
        self.complete = complete
        self.passes = passes
        self.members = members


def garbage_above(index) -> SubsetGarbage | None:
    """The garbage above the tensors using the blocks of ``index`` (a
    ``tensors.BlockIndex``), found without collecting: the collector's algorithm run on those
    tensors and the objects of the heap that refer to them, transitively
    (``torchmem._C.subset_garbage``, a few passes over the heap instead of a collection of
    all of it).

    A block is ``decided`` when it has tensors and every one of them is garbage: only garbage
    holds them, as a collection of the whole heap would find (the subset's answer can only
    err towards "reachable"). None when the answer could differ from that collection's in
    what it runs: garbage with a finalizer (``__del__``) or a weak reference with a callback,
    which a collection calls and which may release blocks or resurrect objects. The garbage
    is left to the collector, as ``collect_saving_garbage``'s is.
    """
    import weakref

    import torch  # only on an exit with survivors: torch is imported then

    from torchmem import _C
    from torchmem.leaks.tensors import tensor_block

    # The collector's order for a whole collection: the oldest generation, then the younger
    # ones appended (gc_collect_main merges them into it); its garbage keeps that order.
    objects = gc.get_objects(2)
    objects += gc.get_objects(0)
    objects += gc.get_objects(1)
    try:
        seeds = _C.instances_of(objects, torch._C.TensorBase)
        seed_keys = [tensor_block(index, tensor) for tensor in seeds]
        seeds = [tensor for tensor, key in zip(seeds, seed_keys) if key is not None]
        seed_keys = [key for key in seed_keys if key is not None]
        if not seeds:
            return None
        seed_ids = [id(tensor) for tensor in seeds]
        # Only `objects` and `seeds` may hold the tensors now (the call discounts those).
        garbage, complete, passes, members, finalizers = _C.subset_garbage(objects, seeds, SUBSET_PASSES,
                                                                           SUBSET_MEMBERS)
        del seeds
    finally:
        # The youngest generation's list held `objects` itself: a cycle through every object
        # of the heap, which would stay until the next full collection (and be its garbage).
        objects.clear()
    if finalizers:
        return None
    for obj in garbage:
        if weakref.getweakrefcount(obj) and any(ref.__callback__ is not None for ref in weakref.getweakrefs(obj)):
            return None
    obj = None
    garbage_ids = {id(obj) for obj in garbage}
    undecided = {key for key, seed in zip(seed_keys, seed_ids) if seed not in garbage_ids}
    return SubsetGarbage(garbage, set(seed_keys) - undecided, complete, passes, members)
