"""What every corpus scenario shares: its header, the device it runs on, and how it is driven.

A scenario (``tests/scenarios/<name>.py``) is a small program in the shape of a public bug
report. Its docstring ends with a TOML table ``[scenario]`` (see ``Header``); the line that
allocates the memory in question carries the comment ``# ALLOC``. It defines ``STEPS``,
``setup()`` (optional: what the program builds before its loop, returned as ``state``) and
``step(state, i)`` (one iteration), and ends with ``if __name__ == "__main__": main(globals())``
so that ``python tests/scenarios/<name>.py`` (or ``python -m torchmem run`` on it) runs it as
the script of the report.

Every mode drives a scenario the same way (``drive``): setup, then ``STEPS`` calls of ``step``.
Scenarios whose header says ``collector = "paused"`` run with Python's automatic collections
off, as in a long run where the garbage reaches the oldest generation and is collected very
late (the Composer bug): without that, a collection that happens to run mid-loop would decide
the result instead of the program.
"""

from __future__ import annotations

import contextlib
import gc
import os
import tomllib
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

DEVICE_ENV = "TORCHMEM_CORPUS_DEVICE"
SCENARIO_DIR = Path(__file__).resolve().parent
MODES = ("leak_check", "pytest", "run", "growth")
VERDICTS = ("leak", "clean")
CHECK_PLACES = ("loop", "step")
ALLOC_MARKER = "# ALLOC"


class TinyNet(nn.Module):
    """Stands in for a model: elementwise only, since matmul needs cuBLAS, which the simulated
    CUDA device cannot serve (docs/simulated-device.md)."""

    def __init__(self, width: int = 256):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(width, device=device()))
        self.bias = nn.Parameter(torch.zeros(width, device=device()))

    def forward(self, batch):
        return torch.tanh(batch * self.weight + self.bias)


def batch(rows: int = 16, width: int = 256):
    """A random input batch on the scenario's device."""
    return torch.randn(rows, width, device=device())


def device() -> str:
    """The device the scenario's tensors go to: ``cpu`` unless the runner says ``cuda``."""
    return os.environ.get(DEVICE_ENV, "cpu")


@dataclass(frozen=True)
class Header:
    """A scenario's machine-readable header.

    ``verdict``: ``leak`` or ``clean`` (what is true, checked by ``truth.py`` without
    torchmem). ``kind``: what keeps the memory (``global``, ``cycle``, ``closure``,
    ``attribute``, ``cache``, ``class``, ``growth``...; for clean ones what looks like a leak
    and is not). ``owner``: the text the holder path a report names must contain (empty for
    clean scenarios). ``modes``: which of ``leak_check``, ``pytest``, ``run``, ``growth``
    apply. ``check``: where the leak check goes, around the whole loop (``loop``) or a reused
    check on each step (``step``, as ``@torchmem.leak_check()`` on ``train_step``).
    ``allow_state``: the leak check is given ``allow_held_by={"state": state}``: what the
    program built before its loop may keep what the loop computed (a trainer's live metrics).
    ``warmup``: steps whose growth is expected (``GrowthMonitor(warmup=)``, and a ``step``
    check's ``warmup=``). ``report``: the bug report the program is shaped after.
    """

    name: str
    path: Path
    verdict: str
    kind: str
    owner: str
    modes: tuple
    report: str
    check: str = "loop"
    warmup: int = 2
    collector: str = "running"
    allow_state: bool = False
    alloc_line: int = 0
    summary: str = ""


def read_header(path: Path) -> Header:
    """Parses the ``[scenario]`` table at the end of a scenario's docstring; every problem is an
    error naming the file, so a malformed scenario never scores silently."""
    import ast  # noqa: PLC0415 - only the runner reads headers

    source = path.read_text()
    docstring = ast.get_docstring(ast.parse(source)) or ""
    if "[scenario]" not in docstring:
        raise ValueError(f"{path}: the docstring has no [scenario] table")
    summary, _, table = docstring.partition("[scenario]")
    fields = tomllib.loads("[scenario]" + table)["scenario"]
    alloc_lines = [number for number, text in enumerate(source.splitlines(), 1) if text.rstrip().endswith(ALLOC_MARKER)]
    if len(alloc_lines) != 1:
        raise ValueError(f"{path}: exactly one line must end with {ALLOC_MARKER!r}, found {len(alloc_lines)}")
    header = Header(
        name=path.stem, path=path, alloc_line=alloc_lines[0], summary=" ".join(summary.split()),
        modes=tuple(fields.pop("modes")), **fields,
    )
    problems = []
    if header.verdict not in VERDICTS:
        problems.append(f"verdict {header.verdict!r} is not one of {VERDICTS}")
    if not header.modes or set(header.modes) - set(MODES):
        problems.append(f"modes {header.modes!r} must be a non-empty subset of {MODES}")
    if header.check not in CHECK_PLACES:
        problems.append(f"check {header.check!r} is not one of {CHECK_PLACES}")
    if header.collector not in ("running", "paused"):
        problems.append(f"collector {header.collector!r} is not 'running' or 'paused'")
    if (header.verdict == "leak") != bool(header.owner):
        problems.append("a leak names its owner; a clean scenario has owner = ''")
    if not header.report.startswith("https://github.com/"):
        problems.append(f"report {header.report!r} is not a GitHub URL")
    if problems:
        raise ValueError(f"{path}: " + "; ".join(problems))
    return header


def all_headers() -> list[Header]:
    """Every scenario in this folder, by name."""
    return [read_header(path) for path in sorted(SCENARIO_DIR.glob("[a-z]*.py")) if path.stem not in ("runner", "truth")]


@contextlib.contextmanager
def collector(state: str):
    """``paused``: no automatic collections inside (garbage waits for an explicit collect)."""
    if state != "paused":
        yield
        return
    was_enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def prepare(module):
    """What the program builds before its loop (``setup()``), or None."""
    return module.setup() if hasattr(module, "setup") else None


def loop(module, state, steps: int | None = None, wrap_step=None, after_step=None) -> None:
    """The program's loop: ``steps`` (default ``STEPS``) iterations of ``step``. ``wrap_step``
    decorates ``step`` (a reused leak check); ``after_step`` runs after each iteration
    (``GrowthMonitor.step``)."""
    step = module.step if wrap_step is None else wrap_step(module.step)
    for index in range(module.STEPS if steps is None else steps):
        step(state, index)
        if after_step is not None:
            after_step()


def drive(module, steps: int | None = None) -> None:
    """The whole program: setup, then the loop. Returns nothing, so nothing the program built
    stays alive here."""
    loop(module, prepare(module), steps)


def main(module_globals: dict) -> None:
    """The scenario run as a script (``python scenario.py``, ``python -m torchmem run scenario.py``).
    With ``collector = "paused"`` the collector stays off to the end, as in a long run whose
    garbage sits in the oldest generation when the program exits."""
    import sys  # noqa: PLC0415

    module = sys.modules[module_globals["__name__"]]
    header = read_header(Path(module_globals["__file__"]).resolve())
    if header.collector == "paused":
        gc.collect()
        gc.disable()
    drive(module)
