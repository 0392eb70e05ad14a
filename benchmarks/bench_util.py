"""Helpers the benchmark scripts share: byte sizes in and out, and call depth.

Imported as ``bench_util`` by scripts run as ``python benchmarks/<script>.py`` (their
folder is on ``sys.path``).
"""

from __future__ import annotations

import sys


def format_bytes(n: int) -> str:
    """4096 -> '4 KiB' (exact units only, else bytes)."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    return f"{n} B"


def parse_size(text: str) -> int:
    """'4K', '1MiB', '16m', '512' -> bytes."""
    text = text.strip().upper().replace("IB", "").replace("B", "")
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    if text and text[-1] in scale:
        return int(float(text[:-1]) * scale[text[-1]])
    return int(text)


def at_depth(depth: int, fn, *args):
    """Calls fn(*args) with `depth` extra Python frames below the caller (allocations in
    real training code happen tens of frames deep, which stack capture pays for)."""
    if depth <= 0:
        return fn(*args)
    return at_depth(depth - 1, fn, *args)


def frames_here() -> int:
    """Python frames on this thread's stack, counting the caller's."""
    frame, count = sys._getframe(1), 0
    while frame is not None:
        frame, count = frame.f_back, count + 1
    return count
