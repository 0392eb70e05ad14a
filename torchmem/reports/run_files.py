"""The files ``torchmem run`` writes at exit: the capture (by default
``torchmem-<script>.<pid>.tmem``, as memray names its files) and the HTML report.

The capture holds the state at the end of the script, taken before its globals are
released (what held memory while it ran), with the leak findings made after (what
survived them), so ``torchmem report`` shows both, as the text report at exit does.

On a rank of a launched job (``for_job``), ``--html`` names one page for the whole job:
no rank writes a page of its own; each hands its capture (:meth:`RunFiles.job_capture`) to
the job report, and rank 0 writes the page from every rank's
(``torchmem.distributed.launcher``).
"""

from __future__ import annotations

import os

__all__ = ["RunFiles", "default_name"]


def default_name(script: str | None, module: str | None, pid: int | None = None) -> str:
    """``torchmem-<script>.<pid>.tmem`` in the working directory (``-m pkg.mod``: ``pkg.mod``)."""
    from torchmem.reports import capture

    if script is not None:
        name = os.path.basename(script)
        name = name[:-3] if name.endswith(".py") else name
    else:
        name = module or "python"
    return os.path.abspath(capture.default_capture_path(name, pid))


class RunFiles:
    """Collects at the end of the script, writes after the leak check."""

    def __init__(self, capture_path: str | None, html_path: str | None, label: str, *, announce_capture: bool = True,
                 for_job: bool = False):
        self.capture_path = capture_path
        # A rank of a job whose page rank 0 writes: this rank's capture goes to rank 0.
        self.for_job = for_job
        self._capture = None  # the Capture written at exit (with its leak findings)
        # False for the default capture under -q: a clean quiet run prints nothing, and a
        # file nobody asked for by name is nothing to act on.
        self.announce_capture = announce_capture
        self.html_path = html_path
        self.label = label
        self._data: dict | None = None

    @property
    def wanted(self) -> bool:
        return self.capture_path is not None or self.html_path is not None or self.for_job

    def collect(self) -> None:
        """The state at the end of the script (call before its globals are released)."""
        if self.wanted:
            from torchmem._support import progress
            from torchmem.reports import collect

            with progress.step("collecting the capture"):
                self._data = collect.collect(label=self.label)

    def write(self, leak_report) -> tuple[list[str], list[str]]:
        """Writes the files; returns (lines to print, problems)."""
        if not self.wanted or self._data is None:
            return [], []
        from torchmem.reports import capture, collect, html

        self._data["leaks"] = collect.leaks_section(leak_report)
        report = self._capture = capture.Capture(self._data)
        lines, problems = [], []
        from torchmem._support import progress

        if self.capture_path is not None:
            try:
                with progress.step(f"writing {self.capture_path}"):
                    report.write(self.capture_path)
                if self.announce_capture:
                    lines.append(f"capture written to {self.capture_path}")
                    lines.append(f"  render it: torchmem report {_shown(self.capture_path)} --html memory.html")
            except OSError as error:
                problems.append(f"could not write the capture: {error}")
        if self.html_path is not None and not self.for_job:
            try:
                with progress.step(f"writing {self.html_path}"):
                    html.write_html(self.html_path, report)
                lines.append(f"HTML report written to {self.html_path}")
            except OSError as error:
                problems.append(f"could not write the HTML report: {error}")
        return lines, problems


    def job_capture(self) -> bytes | None:
        """This rank's capture as ``.tmem`` bytes, for rank 0's page of the job (after
        :meth:`write`); None when there is none to send."""
        if not self.for_job or self._capture is None:
            return None
        from torchmem.reports import capture

        return capture.encode(self._capture.data)


def _shown(path: str) -> str:
    """``path`` as short as it reads from the working directory."""
    relative = os.path.relpath(path)
    return relative if not relative.startswith("..") else path
