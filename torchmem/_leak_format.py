"""Small text helpers shared by leak and growth reports: sizes, paths, source lines."""

from __future__ import annotations

import linecache
import os
import re
import sysconfig

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB")

# Directories of the standard library: its frames (copy.py, threading.py, ...) are never the
# line a user wants to see as "allocated at".
_STDLIB_DIRS = tuple(
    os.path.normcase(os.path.realpath(path)) + os.sep
    for path in {sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["platstdlib"]}
)
_SITE_DIRS = tuple(
    os.path.normcase(os.path.realpath(path)) + os.sep
    for path in {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
)


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


def short_path(filename: str) -> str:
    """A file name as a user reads it: relative to the working directory when inside it,
    relative to site-packages for installed libraries, else unchanged."""
    if not filename or filename.startswith("<"):
        return filename
    real = os.path.normcase(os.path.realpath(filename))
    cwd = os.path.normcase(os.path.realpath(os.getcwd())) + os.sep
    if real.startswith(cwd):
        return real[len(cwd):]
    for site in _SITE_DIRS:
        if real.startswith(site):
            return real[len(site):]
    return filename


def is_stdlib(filename: str) -> bool:
    """True for files of Python's standard library (not its site-packages)."""
    if not filename or filename.startswith("<"):
        return False
    real = os.path.normcase(os.path.realpath(filename))
    if any(real.startswith(site) for site in _SITE_DIRS):
        return False
    return any(real.startswith(stdlib) for stdlib in _STDLIB_DIRS)


def is_installed_package(filename: str) -> bool:
    """True for files of installed packages (site-packages), i.e. not the user's own code."""
    if not filename or filename.startswith("<"):
        return False
    real = os.path.normcase(os.path.realpath(filename))
    return any(real.startswith(site) for site in _SITE_DIRS)


def source_line(filename: str, line: int) -> str:
    """The stripped source text of ``filename:line``, or '' when it cannot be read."""
    if not filename or line <= 0:
        return ""
    return linecache.getline(filename, line).strip()
