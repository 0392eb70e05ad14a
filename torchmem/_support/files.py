"""Source files as a report shows them: short paths, source lines, where a file lives."""

from __future__ import annotations

import linecache
import os
import sysconfig


def normalize(path: str) -> str:
    """``path`` resolved (symlinks, case) so that prefixes compare reliably."""
    return os.path.normcase(os.path.realpath(path))


# Directories of the standard library and of installed packages (site-packages).
STDLIB_DIRS = tuple(
    normalize(path) + os.sep for path in {sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["platstdlib"]}
)
SITE_DIRS = tuple(
    normalize(path) + os.sep for path in {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
)


def short_path(filename: str) -> str:
    """A file name as a user reads it: relative to the working directory when inside it,
    relative to site-packages for installed libraries, else unchanged."""
    if not filename or filename.startswith("<"):
        return filename
    real = normalize(filename)
    cwd = normalize(os.getcwd()) + os.sep
    if real.startswith(cwd):
        return real[len(cwd):]
    for site in SITE_DIRS:
        if real.startswith(site):
            return real[len(site):]
    return filename


def source_line(filename: str, line: int) -> str:
    """The stripped source text of ``filename:line``, or '' when it cannot be read."""
    if not filename or line <= 0:
        return ""
    return linecache.getline(filename, line).strip()
