"""Python stacks of allocations: capture switch, symbolization, folding.

While capture is on, every allocation torchmem makes records the allocating
thread's Python stack as (code object, instruction offset) pairs, interned in a
table so a loop allocating at one site stores one stack; the block keeps the
stack's id (its ``"context"``). File names, lines and function names are looked up
only when a report asks (:func:`frames`). On CPython 3.11 the capture reads the
thread's frames without taking the GIL, which torch ops release; the GIL is taken
only the first time a code object is seen, to keep it alive.

Capture is off unless someone asks for it:

* :func:`record_history` is the public, process-wide switch (like
  ``torch.cuda.memory._record_memory_history``);
* :func:`capturing` is the reference-counted scope leak checks use.

Stacks stay interned until :func:`prune` drops those no live block references.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import os
from typing import Callable, Iterable, Iterator, NamedTuple, Sequence

from torchmem._locks import ForkSafeLock
from torchmem import _C

__all__ = [
    "Frame",
    "frames",
    "is_internal",
    "is_marker",
    "user_first",
    "capturing",
    "record_history",
    "is_recording_history",
    "prune",
    "stats",
]


class Frame(NamedTuple):
    """One Python frame: ``name`` is the function's name (``co_name``)."""

    filename: str
    line: int
    name: str

    def __str__(self) -> str:
        if is_marker(self):
            return f"... {self.name}"
        return f"{self.filename}:{self.line} in {self.name}"


# Folded frames (and the tail of a stack deeper than capture keeps) appear as
# Frame(MARKER_FILENAME, 0, "<what was folded>").
MARKER_FILENAME = "..."


def frames(context_id: int) -> list[Frame]:
    """The stack recorded for a block's ``context`` id, innermost frame first.

    ``[]`` for 0 (nothing was captured) and for ids whose stack was pruned.
    """
    return [Frame(*frame) for frame in _C.symbolize(context_id)]


def is_marker(frame: Frame) -> bool:
    """True for the placeholder frames :func:`user_first` and truncation insert."""
    return frame.filename == MARKER_FILENAME and frame.line == 0


# --- which frames are the user's ---------------------------------------------------

# Packages whose frames are PyTorch's machinery rather than the user's code.
_TORCH_PACKAGES = ("torch", "torchmem", "functorch", "torchgen", "triton")
# Code that only wraps the user's code: test runners and launchers.
_RUNNER_PACKAGES = ("_pytest", "pluggy")
_RUNNER_MODULES = ("runpy", "threading")


def _normalize(path: str) -> str:
    return os.path.normcase(os.path.realpath(path))


@functools.lru_cache(maxsize=None)
def _internal_roots() -> tuple[tuple[tuple[str, str], ...], dict[str, str]]:
    """(directory prefix, kind) pairs and {file: kind} for internal code.

    Found with ``find_spec``, which locates top-level packages without importing
    them, so a checkout used in place (``torchmem`` itself in development) counts
    as well as an installed wheel.
    """
    prefixes: list[tuple[str, str]] = []
    files: dict[str, str] = {}
    for kind, names in (("torch", _TORCH_PACKAGES), ("internal", _RUNNER_PACKAGES)):
        for name in names:
            try:
                spec = importlib.util.find_spec(name)
            except (ImportError, ValueError):
                spec = None
            for location in (spec.submodule_search_locations or []) if spec else []:
                prefixes.append((_normalize(location) + os.sep, kind))
    prefixes.append((_normalize(os.path.dirname(importlib.util.__file__)) + os.sep, "internal"))
    for name in _RUNNER_MODULES:
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.origin and os.path.isabs(spec.origin):
            files[_normalize(spec.origin)] = "internal"
    return tuple(prefixes), files


@functools.lru_cache(maxsize=4096)
def _kind(filename: str) -> str | None:
    """'torch' or 'internal' for frames that are not the user's, else None."""
    if filename.startswith("<frozen "):  # importlib's bootstrap, runpy, ... (frozen modules)
        return "internal"
    if filename.startswith("<") or not filename:  # <string>, <stdin>, exec'd code: the user's
        return None
    prefixes, files = _internal_roots()
    real = _normalize(filename)
    if real in files:
        return files[real]
    for prefix, kind in prefixes:
        if real.startswith(prefix):
            return kind
    return None


def is_internal(frame: Frame) -> bool:
    """True for frames that are not the user's code.

    That is PyTorch and its companions (``torch``, ``torchmem``, ``functorch``,
    ``torchgen``, ``triton``), Python's import machinery and frozen modules
    (``<frozen ...>``), and the code that merely runs the user's: ``runpy``,
    ``threading``'s thread bootstrap, pytest and pluggy. Markers are not internal.
    """
    if is_marker(frame):
        return False
    return _kind(frame.filename) is not None


def _marker(run: Sequence[Frame], suffix: str = "") -> Frame:
    kind = "torch" if all(_kind(frame.filename) == "torch" for frame in run) else "internal"
    return Frame(MARKER_FILENAME, 0, f"{len(run)} {kind} frame{'s' if len(run) != 1 else ''}{suffix}")


def user_first(stack: Sequence[Frame]) -> list[Frame]:
    """A stack (innermost first) arranged for a report: the user's frames first.

    The result starts at the innermost user frame (the line that allocated, as
    far as the user is concerned) and goes outward; each run of internal frames
    is folded into one marker (``Frame('...', 0, '7 torch frames')``). The
    internal frames below the innermost user frame (what torch did inside that
    call) become one marker at the end, ``'... 4 torch frames inside'``. A stack
    with no user frame is returned unchanged.
    """
    first_user = next(
        (i for i, frame in enumerate(stack) if not is_internal(frame) and not is_marker(frame)), None
    )
    if first_user is None:
        return list(stack)
    out: list[Frame] = []
    run: list[Frame] = []
    for frame in stack[first_user:]:
        if is_internal(frame):
            run.append(frame)
            continue
        if run:
            out.append(_marker(run))
            run = []
        out.append(frame)
    if run:
        out.append(_marker(run))
    inside = list(stack[:first_user])
    if inside:
        out.append(_marker(inside, " inside"))
    return out


# --- switching capture on --------------------------------------------------------


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
