"""Sizes as people write them: ``format_bytes(4096) == '4.0 KiB'`` and back."""

from __future__ import annotations

import re

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB")


def format_bytes(size: int) -> str:
    """``4096 -> '4.0 KiB'``: binary units, one decimal; plain bytes below 1 KiB."""
    value = float(size)
    for unit in _UNITS:
        if abs(value) < 1024 or unit == _UNITS[-1]:
            return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


_SIZE_PATTERN = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?i?b?)?\s*$", re.IGNORECASE)
_SIZE_FACTORS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "kib": 1024, "m": 1000**2, "mb": 1000**2,
                 "mib": 1024**2, "g": 1000**3, "gb": 1000**3, "gib": 1024**3, "t": 1000**4,
                 "tb": 1000**4, "tib": 1024**4}


def parse_bytes(value: int | str, *, what: str) -> int:
    """Bytes from an int or a human size string (``"512"``, ``"4 KiB"``, ``"1.5MB"``).

    ``what`` names the setting in the error message.
    """
    if isinstance(value, bool):
        raise TypeError(f"{what}: expected a number of bytes, got {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"{what}: must be >= 0 bytes, got {value}")
        return value
    if isinstance(value, str):
        match = _SIZE_PATTERN.match(value)
        unit = (match.group(2) or "").lower() if match else None
        if match is None or unit not in _SIZE_FACTORS:
            raise ValueError(
                f"{what}: {value!r} is not a size; write bytes (4096) or a size with a unit "
                "('4 KiB', '1.5 MB', '2GiB')"
            )
        return int(float(match.group(1)) * _SIZE_FACTORS[unit])
    raise TypeError(f"{what}: expected bytes (int) or a size string like '4 KiB', got {type(value).__name__}")
