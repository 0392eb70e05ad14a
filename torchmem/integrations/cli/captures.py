"""Reading the capture files that ``torchmem report``, ``stats`` and ``diff`` are given."""

from __future__ import annotations

import os

from torchmem.integrations.cli.common import UsageError

# A file that is there but is not a capture we read (damaged, another format, a newer
# major version): exit status 1, as for a script's error; a missing file is a usage error (2).
EXIT_UNREADABLE = 1


class Unreadable(Exception):
    """The file exists but is not a capture this torchmem reads; the message says why."""


def load(paths: list[str]):
    """One ``Capture`` from ``paths`` (several: the ranks of a job, combined)."""
    from torchmem._support import progress
    from torchmem.reports import capture

    for path in paths:
        if not os.path.exists(path):
            raise UsageError(f"{path}: no such file (torchmem run writes torchmem-<script>.<pid>.tmem)")
        if os.path.isdir(path):
            raise UsageError(f"{path}: is a directory; give a .tmem file")
    loaded = []
    for path in paths:
        with progress.step(f"reading {path}"):
            try:
                loaded.append(capture.load_capture(path))
            except capture.CaptureFormatError as error:
                # The loader's messages start with its API name: the command names itself instead.
                raise Unreadable(str(error).replace("torchmem.load_capture: ", "", 1)) from None
    return loaded[0] if len(loaded) == 1 else capture.combine_captures(loaded)
