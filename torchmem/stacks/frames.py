"""Frames of captured stacks, and whose code each frame is.

A captured stack (see :mod:`torchmem.stacks.capture`) is symbolized into ``Frame``
tuples, innermost first. Reports show the user's code, so every frame is classified by
its file's **origin**, in one place:

``user``      the application's own code (and ``<string>``, ``<stdin>``, exec'd code);
``library``   an installed package the application uses (torchmetrics, a trainer);
``stdlib``    Python's standard library (``copy.deepcopy`` is never "allocated at");
``torch``     PyTorch and its companions, torchmem included: machinery, folded;
``runner``    code that only runs the application's: pytest, pluggy, runpy,
              threading's bootstrap, multiprocessing's process start, the import machinery and
              frozen modules.
"""

from __future__ import annotations

import functools
import importlib.util
import os
from typing import NamedTuple, Sequence

from torchmem import _C
from torchmem._support.files import SITE_DIRS, STDLIB_DIRS, normalize

USER = "user"
LIBRARY = "library"
STDLIB = "stdlib"
TORCH = "torch"
RUNNER = "runner"


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


# --- whose code is a frame --------------------------------------------------------------

_TORCH_PACKAGES = ("torch", "torchmem", "functorch", "torchgen", "triton")
_RUNNER_PACKAGES = ("_pytest", "pluggy", "multiprocessing")
_RUNNER_MODULES = ("runpy", "threading")


@functools.lru_cache(maxsize=None)
def _known_locations() -> tuple[tuple[tuple[str, str], ...], dict[str, str]]:
    """(directory prefix, origin) pairs and {file: origin} for torch and runner code.

    Found with ``find_spec``, which locates top-level packages without importing them, so
    a checkout used in place (``torchmem`` itself in development) counts as well as an
    installed wheel.
    """
    prefixes: list[tuple[str, str]] = []
    files: dict[str, str] = {}
    for origin_name, names in ((TORCH, _TORCH_PACKAGES), (RUNNER, _RUNNER_PACKAGES)):
        for name in names:
            try:
                spec = importlib.util.find_spec(name)
            except (ImportError, ValueError):
                spec = None
            for location in (spec.submodule_search_locations or []) if spec else []:
                prefixes.append((normalize(location) + os.sep, origin_name))
    prefixes.append((normalize(os.path.dirname(importlib.util.__file__)) + os.sep, RUNNER))
    # The demo (python -m torchmem demo) plays the user: its training loop is what it shows.
    files[normalize(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "integrations",
                                 "demo.py"))] = USER
    for name in _RUNNER_MODULES:
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.origin and os.path.isabs(spec.origin):
            files[normalize(spec.origin)] = RUNNER
    return tuple(prefixes), files


@functools.lru_cache(maxsize=4096)
def origin(filename: str) -> str:
    """Whose code ``filename`` is: ``USER``, ``LIBRARY``, ``STDLIB``, ``TORCH`` or ``RUNNER``."""
    if filename.startswith("<frozen "):  # importlib's bootstrap, runpy, ... (frozen modules)
        return RUNNER
    if filename.startswith("<") or not filename:  # <string>, <stdin>, exec'd code: the user's
        return USER
    prefixes, files = _known_locations()
    real = normalize(filename)
    if real in files:
        return files[real]
    for prefix, kind in prefixes:
        if real.startswith(prefix):
            return kind
    if any(real.startswith(site) for site in SITE_DIRS):
        return LIBRARY
    if any(real.startswith(stdlib) for stdlib in STDLIB_DIRS):
        return STDLIB
    return USER


def is_internal(frame: Frame) -> bool:
    """True for frames that are not the application's code: torch's machinery and runners.

    Markers are not internal.
    """
    return not is_marker(frame) and origin(frame.filename) in (TORCH, RUNNER)


def is_application(frame: Frame) -> bool:
    """True for the application's code: the user's own or an installed library's."""
    return not is_marker(frame) and origin(frame.filename) in (USER, LIBRARY)


def is_library(frame: Frame) -> bool:
    """True for an installed library's code (site-packages, PyTorch's excepted)."""
    return not is_marker(frame) and origin(frame.filename) == LIBRARY


def is_users_own(frame: Frame) -> bool:
    """True for the user's own code (not an installed library's)."""
    return not is_marker(frame) and origin(frame.filename) == USER


# --- arranging a stack for a report -----------------------------------------------------


def _marker(run: Sequence[Frame], suffix: str = "") -> Frame:
    kind = "torch" if all(origin(frame.filename) == TORCH for frame in run) else "internal"
    return Frame(MARKER_FILENAME, 0, f"{len(run)} {kind} frame{'s' if len(run) != 1 else ''}{suffix}")


def folds_runner_frames(frame: Frame) -> bool:
    """True for a marker that folds runner frames (pytest, runpy, threading): below it, the
    application's code has ended."""
    return is_marker(frame) and " internal frame" in frame.name


def user_first(stack: Sequence[Frame]) -> list[Frame]:
    """A stack (innermost first) arranged for a report: the user's frames first.

    The result starts at the innermost frame that is not internal (the line that allocated,
    as far as the user is concerned) and goes outward; each run of internal frames is folded
    into one marker (``Frame('...', 0, '7 torch frames')``). The internal frames below it
    (what torch did inside that call) become one marker at the end, ``'... 4 torch frames
    inside'``. A stack of internal frames only is returned unchanged.
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


def allocation_site(stack: Sequence[Frame]) -> Frame | None:
    """The frame a user reads as "allocated at": the innermost application frame (neither
    PyTorch's, a runner's nor the standard library's: ``copy.deepcopy`` is never the answer),
    else the innermost real frame; None for an empty stack. ``stack`` innermost first."""
    real = [frame for frame in stack if not is_marker(frame)]
    for frame in real:
        if is_application(frame):
            return frame
    return real[0] if real else None
