"""Python stacks of allocations: switching capture on and off, and the stack table.

While capture is on, every allocation torchmem makes records the allocating
thread's Python stack as (code object, instruction offset) pairs, interned in a
table so a loop allocating at one site stores one stack; the block keeps the
stack's id (its ``"context"``). File names, lines and function names are looked up
only when a report asks (:func:`torchmem.stacks.frames.frames`). On CPython 3.11 the
capture reads the thread's frames without taking the GIL, which torch ops release; the
GIL is taken only the first time a code object is seen, to keep it alive.

Capture is off unless someone asks for it:

* :func:`record_history` is the public, process-wide switch (like
  ``torch.cuda.memory._record_memory_history``);
* :func:`capturing` is the reference-counted scope leak checks use.

Stacks stay interned until :func:`prune` drops those no live block references.
"""

from __future__ import annotations

import contextlib
from typing import Callable, Iterable, Iterator

from torchmem import _C
from torchmem._support.locks import ForkSafeLock

__all__ = [
    "capturing",
    "record_history",
    "is_recording_history",
    "prune",
    "stats",
]



@contextlib.contextmanager
def capturing() -> Iterator[None]:
    """Captures stacks while the block runs (on every thread).

    Reference counted: nested and concurrent scopes, and :func:`record_history`,
    combine; capture stops when the last one ends.
    """
    _C.request_stack_capture()
    try:
        yield
    finally:
        _C.release_stack_capture()


_history_lock = ForkSafeLock()
_history_on = False


def record_history(enabled: bool | str | None = True) -> None:
    """Turns recording of allocation stacks on or off for the whole process.

    The explicit history switch, like ``torch.cuda.memory._record_memory_history``
    (whose ``"all"``/``"state"`` and ``None`` spellings are accepted). While on,
    every allocation through torchmem (CPU and CUDA) records the allocating
    thread's Python stack, so ``torchmem.snapshot()`` and leak reports can say
    where each live block was allocated. Recording is cheap (a fraction of a
    microsecond per allocation for a stack seen before; see
    ``benchmarks/stack_capture_overhead.py``) and symbolization happens only when
    a report asks. Turning it off keeps the stacks of blocks already recorded.
    Idempotent: calling it twice with the same value changes nothing; leak checks
    that capture for their own scope are unaffected.
    """
    global _history_on
    if enabled is None or enabled is False:
        on = False
    elif enabled is True or enabled in ("all", "state"):
        on = True
    else:
        raise ValueError(
            f"torchmem.record_history: expected True/False (or 'all'/'state'/None as in "
            f"torch.cuda.memory._record_memory_history), got {enabled!r}"
        )
    with _history_lock:
        if on and not _history_on:
            _C.request_stack_capture()
        elif not on and _history_on:
            _C.release_stack_capture()
        _history_on = on


def is_recording_history() -> bool:
    """Whether :func:`record_history` is on (capture may still run for a leak check)."""
    return _history_on


# --- housekeeping ------------------------------------------------------------------


def prune(live_context_ids: Callable[[], Iterable[int]]) -> int:
    """Drops interned stacks no live block references; returns how many.

    ``live_context_ids`` is called to list the ``context`` of every allocated
    block (of every engine). Allocations other threads make meanwhile keep their
    stacks: those captured after the prune began are kept, and so is each
    thread's latest one (its block may not be listed yet).
    """
    epoch = _C.begin_stack_prune()
    live = [context for context in live_context_ids() if context]
    return _C.prune_stacks(live, epoch=epoch)


def stats() -> dict:
    """Size of the stack table: ``interned_stacks``, ``distinct_frames``,
    ``code_objects_held``, ``bytes_used``, and counters (``gil_acquisitions``:
    times capture took the GIL to keep a new code object alive)."""
    return _C.capture_stats()
