"""What every subcommand of ``torchmem`` shares: the program name, usage errors, output paths."""

from __future__ import annotations

import os

PROG = "torchmem"

# Exit codes of our own failures, as Python uses them: 2 for command-line errors (and
# "can't open file"), 1 for a module that cannot be found.
EXIT_USAGE = 2


class UsageError(Exception):
    """A bad command line or option value: printed as one line, exit code 2."""


def check_writable(option: str, path: str, *, force: bool = False) -> str:
    """The absolute path for output ``option``; fails before the program runs, not after an
    hour of training, if ``path`` cannot be written, or exists and ``force`` is not set."""
    absolute = os.path.abspath(path)
    directory = os.path.dirname(absolute)
    if os.path.isdir(absolute):
        raise UsageError(f"{option} {path}: is a directory; give a file name")
    if not os.path.isdir(directory):
        raise UsageError(f"{option} {path}: the directory {directory} does not exist")
    if not os.access(directory, os.W_OK) or (os.path.exists(absolute) and not os.access(absolute, os.W_OK)):
        raise UsageError(f"{option} {path}: not writable")
    if os.path.exists(absolute) and not force:
        # memray's rule: an earlier run's report is never lost by accident.
        raise UsageError(f"{option} {path}: the file exists; pass -f/--force to overwrite it")
    return absolute
