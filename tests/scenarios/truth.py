"""Checks each scenario's expected verdict without torchmem, so the corpus is not circular.

    python tests/scenarios/truth.py            # a line per scenario; exit 1 on a mismatch

Measured with PyTorch's own profiler (``torch.profiler.profile(profile_memory=True)``, which
records every CPU allocation and free PyTorch makes, autograd graphs' saved tensors included),
in a process where torchmem is never imported. For each scenario the program runs twice, for
``STEPS`` and ``2 * STEPS`` iterations, each time from a freshly loaded module (its globals
new) and with the automatic collector paused:

* ``kept``: bytes allocated during the loop and still allocated after ``gc.collect()``, with
  what the program built before its loop (``setup()``) still alive, as it is while a real
  program runs;
* ``garbage``: bytes that only ``gc.collect()`` freed (held by reference cycles).

The memory is really kept when ``kept`` grows with the number of steps (a list, a cache, a
graph that gains something every step). Cycle garbage is a leak when it grows with the steps
inside one check (``check = "loop"``: the Composer bug, one new cycle per batch, freed only when
the collector gets to it); one cycle per call of a reused check (``check = "step"``) is freed by
the next collection and is not. Anything else is clean: a cache that fills once, an optimizer
creating its state, a constant made at import, the last step's output replaced by the next.
"""

from __future__ import annotations

import gc
import importlib
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path

SCENARIO_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(SCENARIO_DIR))
import _corpus  # noqa: E402


@dataclass
class Measure:
    steps: int
    kept: int
    garbage: int


@dataclass
class Truth:
    name: str
    expected: str
    measured: str
    first: Measure
    second: Measure

    @property
    def agrees(self) -> bool:
        return self.expected == self.measured

    def line(self) -> str:
        mark = "ok  " if self.agrees else "DIFF"
        return (f"{mark} {self.name:<44} expected {self.expected:<5} measured {self.measured:<5} "
                f"kept {self.first.kept}/{self.second.kept} B, cycle garbage {self.first.garbage}/"
                f"{self.second.garbage} B after {self.first.steps}/{self.second.steps} steps")


def _net_bytes(profiler) -> int:
    """Bytes allocated minus bytes freed while ``profiler`` ran."""
    return sum(event.self_cpu_memory_usage for event in profiler.events())


def measure(name: str, steps: int) -> Measure:
    from torch.profiler import ProfilerActivity, profile  # noqa: PLC0415

    module = importlib.reload(sys.modules[name]) if name in sys.modules else importlib.import_module(name)
    gc.collect()
    with _corpus.collector("paused"):
        state = _corpus.prepare(module)
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as during_loop:
            _corpus.loop(module, state, steps)
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as during_collect:
            gc.collect()
        garbage = -_net_bytes(during_collect)
        kept = _net_bytes(during_loop) - garbage
        del state
    importlib.reload(module)  # drop the globals the run filled (outside any profile)
    gc.collect()
    return Measure(steps, kept, garbage)


def truth_of(header) -> Truth:
    first = measure(header.name, header_steps(header))
    second = measure(header.name, 2 * header_steps(header))
    # Kept memory grows with the steps: at least a byte for each added step on average. A few
    # bytes more in the longer run (a library's counters, the allocator's rounding) are not a
    # per-step leak; the smallest leak in the corpus keeps a scalar (4 B) every other step.
    grows = second.kept - first.kept >= second.steps - first.steps
    cycles_grow = header.check == "loop" and second.garbage > first.garbage
    measured = "leak" if grows or cycles_grow else "clean"
    return Truth(header.name, header.verdict, measured, first, second)


def header_steps(header) -> int:
    return importlib.import_module(header.name).STEPS


def main() -> int:
    warnings.filterwarnings("ignore")
    assert "torchmem" not in sys.modules, "the truth is measured without torchmem"
    results = [truth_of(header) for header in _corpus.all_headers()]
    for result in results:
        print(result.line())
    assert "torchmem" not in sys.modules, "a scenario imported torchmem"
    return 0 if all(result.agrees for result in results) else 1


if __name__ == "__main__":
    sys.exit(main())
