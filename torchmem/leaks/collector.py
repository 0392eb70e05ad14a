"""Garbage collection for leak checks, paid in proportion to what the checked code made.

A leak check that left blocks behind must run the cyclic collector to tell memory held
by reference cycles from memory something still holds. A full collection walks every
object the process tracks (300,000 in a pytest session of a library like torchmetrics:
tens of milliseconds), which would make a check cost far more than the code it checks.

So a check **freezes** the collector's generations when it opens (``gc.freeze()``: an
O(1) list splice that moves every tracked object into the permanent generation, which
collections skip) and **thaws** them when the last open check closes
(``gc.unfreeze()``, also O(1)). A collection at exit then visits only objects created
while the check was open, and that is where the garbage of the checked code is. While
frozen, ``gc.get_objects()`` and ``gc.get_referrers()`` also see only those objects: the
owner search uses that to look at new objects first, and thaws (``thaw()``) before it
needs the whole heap.

Correctness never depends on the freeze, only cost does:

* the collector still collects new garbage on its own schedule while checks are open;
  garbage made of objects older than the check waits until the thaw;
* a frozen object that became garbage during the check and holds new objects makes them
  look reachable; the classifier confirms with a full collection (``thaw()`` first)
  whenever a survivor has no named holder;
* a program that uses ``gc.freeze()`` itself (``gc.get_freeze_count() > 0`` when a check
  opens) is left alone: its checks run full collections.

Checks on several threads, and nested checks, share one freeze: the first open freezes,
the last close thaws. A thaw in the middle (an owner search that needs the whole heap)
ends the freeze for every check open at the time (an *epoch*): their exits collect the
whole heap, as without a freeze.
"""

from __future__ import annotations

import gc
import os
import threading
from dataclasses import dataclass

__all__ = ["Freeze", "open_freeze", "close_freeze", "thaw", "is_frozen", "collect_saving_garbage",
           "pause_automatic_collections", "resume_automatic_collections"]


@dataclass(eq=False)
class Freeze:
    """What one open check holds: the epoch it opened in (0: no freeze was made for it)."""

    epoch: int

    @property
    def active(self) -> bool:
        """True while the freeze this check opened under still stands."""
        return self.epoch != 0 and self.epoch == _state.epoch and _state.frozen


class _State:
    def __init__(self):
        self.lock = threading.Lock()
        self.open = 0  # checks holding a Freeze
        self.epoch = 0  # increases at every freeze
        self.frozen = False  # this module froze the generations and has not thawed them


_state = _State()


def open_freeze() -> Freeze:
    """Called when a check opens: freezes the generations if no check holds them yet."""
    with _state.lock:
        _state.open += 1
        if _state.frozen:
            return Freeze(_state.epoch)
        if _state.open == 1 and gc.get_freeze_count() == 0:
            gc.freeze()
            _state.epoch += 1
            _state.frozen = True
            return Freeze(_state.epoch)
        return Freeze(0)  # checks already open under a thawed epoch, or the program freezes


def close_freeze(freeze: Freeze) -> None:
    """Called when a check closes (after its analysis): the last one thaws."""
    with _state.lock:
        _state.open -= 1
        if _state.open == 0 and _state.frozen:
            gc.unfreeze()
            _state.frozen = False


def thaw() -> None:
    """Thaws now (the whole heap becomes visible again); the checks open under this
    epoch collect the whole heap from here on."""
    with _state.lock:
        if _state.frozen:
            gc.unfreeze()
            _state.frozen = False


def epoch_was_frozen(freeze: Freeze) -> bool:
    """True if ``freeze`` was made under a freeze (its exit's first collection skipped the
    objects older than the check)."""
    return freeze is not None and freeze.epoch != 0


def is_frozen() -> bool:
    """True while this module's freeze stands (collections see only new objects)."""
    return _state.frozen


def forget_after_fork() -> None:
    """In a forked child: no check of the parent is open here (their threads are gone)."""
    _state.lock = threading.Lock()
    if _state.frozen:
        gc.unfreeze()
    _state.open = 0
    _state.frozen = False
    _pause.lock = threading.Lock()
    if _pause.depth and _pause.was_enabled:
        gc.enable()
    _pause.depth = 0


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=forget_after_fork)


class _Pause:
    def __init__(self):
        self.lock = threading.Lock()
        self.depth = 0  # exits in progress, on any thread
        self.was_enabled = False  # the collector's state when the first of them began


_pause = _Pause()


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


def collect_saving_garbage() -> list:
    """One full collection that keeps what it found unreachable, for inspection.

    The collection runs with ``gc.DEBUG_SAVEALL``, so the unreachable objects land in
    ``gc.garbage`` instead of being freed; they are taken out of it and returned (the
    program's own uncollectable objects already there stay). The caller inspects them,
    drops the list and calls ``gc.collect()`` to free them for real.
    """
    flags = gc.get_debug()
    kept_before = len(gc.garbage)
    gc.set_debug(flags | gc.DEBUG_SAVEALL)
    try:
        gc.collect()
    finally:
        gc.set_debug(flags)
    garbage = gc.garbage[kept_before:]
    del gc.garbage[kept_before:]
    return garbage
