"""Progress of long work (reading a large capture, replaying its trace, rendering a report),
shown on stderr by ``rich`` while it runs, and gone when it ends.

    with progress.step("reading train.tmem"):
        capture = load_capture("train.tmem")

Shown only on a terminal: in a pipe, a log or a test's captured output the steps print
nothing, so what a command writes there is exactly its result.
"""

from __future__ import annotations

import contextlib
import sys
import time
from typing import Iterator

__all__ = ["step"]


def _console():
    from rich.console import Console

    return Console(file=sys.stderr, highlight=False, emoji=False, markup=False)


@contextlib.contextmanager
def step(description: str) -> Iterator[None]:
    """A spinner with ``description`` and the seconds spent, while the block runs."""
    console = _console()
    if not console.is_terminal:
        yield
        return
    start = time.perf_counter()
    with console.status(f"torchmem: {description} ...") as status:
        try:
            yield
        finally:
            status.update(f"torchmem: {description} ({time.perf_counter() - start:.1f} s)")
